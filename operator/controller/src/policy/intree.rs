//! Pure: the MutatingAdmissionPolicy and binding of an in-tree policy, its failure policy, and
//! what its status says about the mode. Which mode a policy runs in is the engine's decision
//! ([`splice_engine::intree::decide`]), which the offline commands make too.
//!
//! In-tree, the API server computes the injection itself from the CEL the engine derives from the
//! templates ([`splice_engine::intree`]): nothing on the request path depends on Splice, so the
//! requested failure policy is put in force as it is, with no availability guard.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    JSONPatch, MatchResources, MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
    MutatingAdmissionPolicyBindingSpec, MutatingAdmissionPolicySpec, Mutation,
    NamedRuleWithOperations, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use splice_crds::{
    ConditionStatus, FailurePolicy, InjectionPolicy, InjectionPolicyStatus, MANAGED_BY_LABEL,
    MANAGER, Mode, condition, set_condition,
};
use splice_engine::{InTreeProgram, ModeDecision};

use super::conditions::FailurePolicyDecision;
use super::render::{MAX_POLICY_NAME_LEN, RenderError, namespace_selector, object_selector};

/// Name of the MutatingAdmissionPolicy, and of its binding, that serve `policy` in-tree.
pub fn admission_policy_name(policy: &str) -> String {
    format!("splice-{policy}")
}

/// In-tree, the requested failure policy is in force as it is: no network, no replicas and no
/// certificate sit between the API server and the injection, so `Fail` cannot wedge the cluster.
pub fn failure_policy(requested: FailurePolicy) -> FailurePolicyDecision {
    match requested {
        FailurePolicy::Ignore => FailurePolicyDecision {
            effective: FailurePolicy::Ignore,
            reason: super::conditions::REASON_IGNORE_REQUESTED,
            message: "spec.failurePolicy is Ignore: a pod whose injection the API server cannot \
                      compute (a template reads a label the namespace or pod lacks) is admitted \
                      without it."
                .to_owned(),
        },
        FailurePolicy::Fail => FailurePolicyDecision {
            effective: FailurePolicy::Fail,
            reason: super::conditions::REASON_FAIL_IN_FORCE,
            message: "spec.failurePolicy is Fail and the policy runs in-tree (a \
                      MutatingAdmissionPolicy): the API server computes the injection itself, so \
                      no availability guard is needed; a pod whose injection cannot be computed \
                      is refused."
                .to_owned(),
        },
    }
}

fn owner(policy: &InjectionPolicy) -> Result<(String, OwnerReference), RenderError> {
    let name = policy.meta().name.clone().unwrap_or_default();
    if name.len() > MAX_POLICY_NAME_LEN {
        return Err(RenderError::NameTooLong {
            len: name.len(),
            name,
            max: MAX_POLICY_NAME_LEN,
        });
    }
    let uid = policy
        .meta()
        .uid
        .clone()
        .ok_or_else(|| RenderError::MissingUid(name.clone()))?;
    let owner = OwnerReference {
        api_version: InjectionPolicy::api_version(&()).into_owned(),
        kind: InjectionPolicy::kind(&()).into_owned(),
        name: name.clone(),
        uid,
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    Ok((name, owner))
}

fn metadata(name: String, owner: OwnerReference) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        labels: Some(BTreeMap::from([(
            MANAGED_BY_LABEL.to_owned(),
            MANAGER.to_owned(),
        )])),
        owner_references: Some(vec![owner]),
        ..ObjectMeta::default()
    }
}

/// The MutatingAdmissionPolicy that serves `policy` in-tree: the same pods as its webhook would
/// be called for (operations, selectors, the mandatory exclusions by namespace name, the opt-out
/// label), the requested failure policy, and the engine's CEL with the reinvocation policy it
/// runs under ([`InTreeProgram::REINVOCATION`]).
pub fn render_policy(
    policy: &InjectionPolicy,
    program: &InTreeProgram,
    splice_namespace: &str,
) -> Result<MutatingAdmissionPolicy, RenderError> {
    let (name, owner) = owner(policy)?;
    let spec = &policy.spec;
    Ok(MutatingAdmissionPolicy {
        metadata: metadata(admission_policy_name(&name), owner),
        spec: Some(MutatingAdmissionPolicySpec {
            failure_policy: Some(spec.failure_policy.as_str().to_owned()),
            reinvocation_policy: Some(InTreeProgram::REINVOCATION.as_str().to_owned()),
            match_constraints: Some(MatchResources {
                match_policy: Some("Equivalent".to_owned()),
                namespace_selector: Some(namespace_selector(
                    spec.namespace_selector.as_ref(),
                    splice_namespace,
                )),
                object_selector: Some(object_selector(spec.object_selector.as_ref())),
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec![String::new()]),
                    api_versions: Some(vec!["v1".to_owned()]),
                    operations: Some(
                        spec.operations
                            .iter()
                            .map(|o| o.as_str().to_owned())
                            .collect(),
                    ),
                    resources: Some(vec!["pods".to_owned()]),
                    scope: Some("Namespaced".to_owned()),
                    resource_names: None,
                }]),
                exclude_resource_rules: None,
            }),
            match_conditions: None,
            mutations: Some(vec![Mutation {
                patch_type: "JSONPatch".to_owned(),
                json_patch: Some(JSONPatch {
                    expression: Some(program.patch.clone()),
                }),
                apply_configuration: None,
            }]),
            param_kind: None,
            variables: Some(
                program
                    .variables
                    .iter()
                    .map(|v| Variable {
                        name: v.name.clone(),
                        expression: v.expression.clone(),
                    })
                    .collect(),
            ),
        }),
    })
}

/// The binding that puts the policy in force (its match constraints say everything; the binding
/// narrows nothing).
pub fn render_binding(
    policy: &InjectionPolicy,
) -> Result<MutatingAdmissionPolicyBinding, RenderError> {
    let (name, owner) = owner(policy)?;
    let map = admission_policy_name(&name);
    Ok(MutatingAdmissionPolicyBinding {
        metadata: metadata(map.clone(), owner),
        spec: Some(MutatingAdmissionPolicyBindingSpec {
            policy_name: Some(map),
            match_resources: None,
            param_ref: None,
        }),
    })
}

/// Writes the mode into the status the reconciler decided: `status.mode` and the `InTree`
/// condition (the other conditions are worded for the path in force by `desired_status`).
pub fn apply_status(
    status: &mut InjectionPolicyStatus,
    decision: &ModeDecision,
    served: bool,
    generation: Option<i64>,
    now: Timestamp,
) {
    status.mode = served.then_some(decision.effective);
    let (s, reason, message) = match (&decision.effective, &decision.webhook_only) {
        (Mode::InTree, _) if !served => {
            status.webhook_configuration = None;
            (
                ConditionStatus::False,
                "NotInForce",
                "The policy has an in-tree form, but it is not in force: see Ready.".to_owned(),
            )
        }
        (Mode::InTree, _) => {
            status.webhook_configuration = None;
            (
                ConditionStatus::True,
                "InTree",
                "Every template expression has a CEL equivalent with the same result: the API \
                 server injects pods itself (a MutatingAdmissionPolicy), before any webhook."
                    .to_owned(),
            )
        }
        (_, Some(why)) if decision.requested == Mode::InTree => (
            ConditionStatus::False,
            "NotExpressibleInTree",
            format!(
                "spec.mode is InTree, but {why}; the webhook serves the policy until that \
                 expression is changed (the validating webhook refuses such a spec at apply)."
            ),
        ),
        (_, Some(why)) => (
            ConditionStatus::False,
            "NeedsWebhook",
            format!("Served by the webhook because {why}."),
        ),
        (_, None) => (
            ConditionStatus::False,
            "WebhookRequested",
            "spec.mode is Webhook.".to_owned(),
        ),
    };
    set_condition(
        &mut status.conditions,
        condition::IN_TREE,
        s,
        reason,
        &message,
        generation,
        now,
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use splice_crds::{InjectionPolicySpec, OPT_OUT_LABEL, Operation, ReinvocationPolicy};
    use splice_engine::CompiledPolicy;

    fn policy(spec_yaml: &str) -> (InjectionPolicy, CompiledPolicy) {
        let spec: InjectionPolicySpec = serde_yaml::from_str(spec_yaml).unwrap();
        let mut p = InjectionPolicy::new("mesh", spec.clone());
        p.metadata.uid = Some("uid-1".into());
        let c = CompiledPolicy::compile("mesh", 1, &spec).unwrap();
        (p, c)
    }

    const SIDECAR: &str = r#"
operations: [CREATE]
failurePolicy: Fail
namespaceSelector: {matchLabels: {mesh: enabled}}
values: {image: "proxy:1"}
template:
  initContainers: [{name: init, image: "{{ values.image }}", restartPolicy: Always}]
  env: [{name: NS, value: "ns={{ namespace.name }}"}]
  annotations: {team: "{{ namespace.labels.team }}"}
"#;

    #[test]
    fn the_admission_policy_matches_what_the_webhook_would_be_called_for() {
        let (p, c) = policy(SIDECAR);
        let program = c.in_tree().unwrap();
        let map = render_policy(&p, &program, "splice-system").unwrap();
        assert_eq!(map.metadata.name.as_deref(), Some("splice-mesh"));
        assert_eq!(
            map.metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
            MANAGER
        );
        assert_eq!(
            map.metadata.owner_references.as_ref().unwrap()[0].uid,
            "uid-1"
        );
        let spec = map.spec.unwrap();
        assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
        // The spec asks IfNeeded (the default); the program is a no-op on a second run.
        assert_eq!(p.spec.reinvocation_policy, ReinvocationPolicy::IfNeeded);
        assert_eq!(spec.reinvocation_policy.as_deref(), Some("Never"));
        let m = spec.match_constraints.unwrap();
        let ns = m.namespace_selector.unwrap();
        assert_eq!(ns.match_labels.unwrap()["mesh"], "enabled");
        let excluded = &ns.match_expressions.unwrap()[0];
        assert_eq!(excluded.operator, "NotIn");
        assert!(
            excluded
                .values
                .as_ref()
                .unwrap()
                .contains(&"kube-system".to_owned())
        );
        assert!(
            excluded
                .values
                .as_ref()
                .unwrap()
                .contains(&"splice-system".to_owned())
        );
        let obj = m.object_selector.unwrap().match_expressions.unwrap();
        assert_eq!(obj[0].key, OPT_OUT_LABEL);
        assert_eq!(
            m.resource_rules.unwrap()[0].operations.as_deref(),
            Some(&[Operation::Create.as_str().to_owned()][..])
        );
        let b = render_binding(&p).unwrap();
        assert_eq!(b.spec.unwrap().policy_name.as_deref(), Some("splice-mesh"));
    }

    #[test]
    fn fail_is_in_force_in_tree_without_a_guard() {
        let d = failure_policy(FailurePolicy::Fail);
        assert_eq!(d.effective, FailurePolicy::Fail);
        assert!(d.message.contains("no availability guard"));
    }
}
