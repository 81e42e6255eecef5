//! One admission of one pod: what the request holds, what the engine decides and the patch it
//! plans ([`inject`]), and the mutated object offline ([`inject_and_apply`]).

use std::borrow::Cow;
use std::collections::BTreeMap;

use bytes::Bytes;
use minijinja::Value as JValue;
use splice_crds::{ALWAYS_EXCLUDED_NAMESPACES, OPT_OUT_LABEL, Operation, STATUS_ANNOTATION};
use template::first_duplicate;
use view::{PodView, Str};

use crate::pod::parse_value;
use crate::provenance::OverrideRecord;
use crate::*;

/// The namespace a pod is admitted into, as templates and namespace selectors see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceContext {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// Namespaces that are never injected, whatever a policy selects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exclusions {
    /// kube-system, kube-node-lease and Splice's own namespace.
    pub namespaces: Vec<String>,
}

impl Exclusions {
    /// The mandatory exclusions plus Splice's own namespace.
    pub fn default_for(splice_namespace: &str) -> Self {
        let mut namespaces: Vec<String> = ALWAYS_EXCLUDED_NAMESPACES
            .iter()
            .map(|n| n.to_string())
            .collect();
        if !splice_namespace.is_empty() && !namespaces.iter().any(|n| n == splice_namespace) {
            namespaces.push(splice_namespace.to_owned());
        }
        Self { namespaces }
    }

    /// True when pods in `namespace` must never be injected.
    pub fn excludes(&self, namespace: &str) -> bool {
        ALWAYS_EXCLUDED_NAMESPACES.contains(&namespace)
            || self.namespaces.iter().any(|n| n == namespace)
    }
}

/// One admission of one pod (or one pod template, offline).
#[derive(Clone, Copy, Debug)]
pub struct PodRequest<'a> {
    pub operation: Operation,
    /// The pod (or PodTemplateSpec: `metadata` + `spec`), read once.
    pub object: &'a Pod<'a>,
    pub namespace: &'a NamespaceContext,
    pub exclusions: &'a Exclusions,
    /// The SPIFFE trust domain of the run (`--trust-domain`), for `{{ identity.spiffeID }}`.
    pub trust_domain: &'a str,
    /// Whether the policy's selectors are decided here or were decided by the API server.
    pub selection: Selection,
}

/// Who decides whether a policy's namespace and object selectors select the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selection {
    /// The engine evaluates both selectors: offline (`splice inject`, `simulate`, `explain`),
    /// where no API server has matched anything.
    Evaluate,
    /// The API server matched the webhook configuration's selectors before calling the webhook,
    /// so only the mandatory exclusions and the opt-out label are checked here. The webhook's
    /// namespace cache can lag the API server (a namespace created or labelled a moment ago), and
    /// the API server's decision is the one the cluster acted on.
    ByApiServer,
    /// The API server matched the namespace selector, which every policy of a shared webhook
    /// entry has in common; the engine decides each policy's object selector from the pod's own
    /// labels, the ones the API server would have matched. Only for CREATE: on UPDATE the API
    /// server also matches the old object, which the engine does not see.
    NamespaceByApiServer,
}

/// What the engine decided for one pod.
#[derive(Clone, Debug)]
pub enum Decision {
    /// A patch to apply (possibly empty when the pod already carries the current injection).
    Inject(Injection),
    /// Nothing to do, and why (with a stable label for metrics).
    Skip(SkipReason),
    /// The pod sets an override its policy does not accept: the admission is denied, whatever
    /// the failure policy (a decision, not a failure).
    Refuse(Refused),
}

/// A pod refused by a policy's `spec.overrides`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub policy: String,
    pub refusal: overrides::Refusal,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "splice policy {}: {}", self.policy, self.refusal)
    }
}

#[derive(Clone, Debug)]
pub struct Injection {
    /// RFC 6902 operations, already serialized as a JSON array; `b"[]"` when nothing changes.
    /// Shared, not copied, between the pods of one shape (see [`inject`]).
    pub patch: Bytes,
    /// True when `patch` holds at least one operation.
    pub changed: bool,
    /// Human-readable warnings for the AdmissionResponse (injected items, skipped author items).
    pub warnings: Vec<String>,
}

#[derive(
    Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::EnumCount, strum::EnumIter,
)]
#[strum(serialize_all = "snake_case")]
pub enum SkipReason {
    ExcludedNamespace,
    OptedOut,
    NamespaceNotSelected,
    ObjectNotSelected,
    OperationNotConfigured,
    NotAPod,
}

impl SkipReason {
    /// Stable label for `splice_injection_skipped_total{reason}`.
    pub fn label(self) -> &'static str {
        self.into()
    }
}

/// Decides and computes the injection of `policy` into `request.object`.
pub fn inject(policy: &CompiledPolicy, request: &PodRequest<'_>) -> Result<Decision, EngineError> {
    Ok(run(policy, request, false)?.0)
}

/// Like [`inject`], and also returns the object with the patch applied (the input unchanged when
/// the decision is a skip or the patch is empty). `splice inject` and `splice simulate` use it.
pub fn inject_and_apply(
    policy: &CompiledPolicy,
    request: &PodRequest<'_>,
) -> Result<(Decision, serde_json::Value), EngineError> {
    let (decision, object) = run(policy, request, true)?;
    match object {
        Some(object) => Ok((decision, object)),
        None => Ok((decision, parse_value(request.object.text)?)),
    }
}

/// Why the engine leaves a pod alone, before any rendering.
fn precheck(
    policy: &CompiledPolicy,
    request: &PodRequest<'_>,
    view: &PodView<'_>,
) -> Option<SkipReason> {
    if view.kind.as_deref().is_some_and(|k| k != "Pod") {
        return Some(SkipReason::NotAPod);
    }
    if !policy.spec.operations.contains(&request.operation) {
        return Some(SkipReason::OperationNotConfigured);
    }
    let meta = view.metadata.as_ref();
    let pod_ns = meta.and_then(|m| m.namespace.as_deref()).unwrap_or("");
    if request.exclusions.excludes(&request.namespace.name)
        || (!pod_ns.is_empty() && request.exclusions.excludes(pod_ns))
    {
        return Some(SkipReason::ExcludedNamespace);
    }
    let labels = meta.and_then(|m| m.labels.as_ref());
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(|v: &Str<'_>| &**v);
    if label(OPT_OUT_LABEL) == Some("false") {
        return Some(SkipReason::OptedOut);
    }
    match request.selection {
        Selection::ByApiServer => return None,
        Selection::NamespaceByApiServer => {}
        Selection::Evaluate => {
            if !policy.selects_namespace(request.namespace) {
                return Some(SkipReason::NamespaceNotSelected);
            }
        }
    }
    if !policy.object_selector.matches(label) {
        return Some(SkipReason::ObjectNotSelected);
    }
    None
}

fn run(
    policy: &CompiledPolicy,
    request: &PodRequest<'_>,
    want_object: bool,
) -> Result<(Decision, Option<serde_json::Value>), EngineError> {
    let view = request.object.view()?;
    if let Some(reason) = precheck(policy, request, view) {
        return Ok((Decision::Skip(reason), None));
    }
    let status = plan::Status::read(view, &policy.name);
    let overrides = if policy.overrides.is_empty() {
        None
    } else {
        let annotations = view.metadata.as_ref().and_then(|m| m.annotations.as_ref());
        let pod = |key: &str| {
            annotations
                .and_then(|a| a.get(key))
                .map(|raw| serde_json::from_str::<String>(raw.get()).unwrap_or_default())
        };
        match policy
            .overrides
            .resolve(pod, &request.namespace.name, &request.namespace.annotations)
        {
            Ok(resolved) => Some(resolved),
            Err(refusal) => {
                let refused = Refused {
                    policy: policy.name.clone(),
                    refusal,
                };
                return Ok((Decision::Refuse(refused), None));
            }
        }
    };

    let deps = policy.templates.deps;
    let meta_only = request.operation == Operation::Update;
    // A policy with overrides records each pod's values: nothing is shared between pods.
    let cached = if deps.pod || overrides.is_some() {
        None
    } else {
        let scope = if deps.namespace_beyond_name {
            cache::Scope::NamespaceContext
        } else if deps.namespace {
            cache::Scope::NamespaceName
        } else {
            cache::Scope::Policy
        };
        Some(
            policy
                .render_cache
                .get_or_render(scope, meta_only, request.namespace, || {
                    render(policy, request, &status, None, meta_only)?
                        .to_owned_rendering()
                        .map_err(|e| EngineError::InvalidObject(e.to_string()))
                })?,
        )
    };
    let fresh;
    let rendered = match &cached {
        Some(rendering) => &**rendering,
        None => {
            fresh = render(policy, request, &status, overrides.as_ref(), meta_only)?;
            &fresh
        }
    };
    let facts = plan::facts(request.operation, view, &status, rendered);
    // Pods of one template (a Deployment's replicas) have equal facts and get one patch: with a
    // cached rendering, the patch planned for the first answers the next ones. A pod carrying
    // the status annotation is planned from more than its facts, and the full path builds the
    // mutated object from the operations: both always plan.
    let kept = match &cached {
        Some(rendering) if !want_object && !status.annotated => Some(rendering),
        _ => None,
    };
    let token = kept
        .filter(|_| !policy.names_token_volumes)
        .and_then(|_| plan::token_volume(facts.spec.as_ref()));
    let key = match token {
        Some(name) => Cow::Owned(facts.with_volume_masked(name, crate::compile::TOKEN_MASK)),
        None => Cow::Borrowed(&facts),
    };
    if let Some(rendering) = kept
        && let Some(injection) = policy.plan_cache.get(rendering, &key, token)
    {
        return Ok((Decision::Inject(injection), None));
    }
    let records: BTreeMap<String, OverrideRecord> = overrides
        .iter()
        .flat_map(|r| &r.values)
        .map(|c| {
            let record = OverrideRecord {
                from: c.origin.as_str().to_owned(),
                sha256: c.digest(),
            };
            (c.name.clone(), record)
        })
        .collect();
    let plan = plan::plan(plan::PlanInput {
        policy: &policy.name,
        hash: &policy.hash,
        data: &policy.data,
        overrides: &records,
        facts: &facts,
        earlier: status.annotated.then_some(plan::Earlier {
            status: &status,
            object: request.object.text,
        }),
        rendered,
    })?;
    let patch = patch::serialize(&plan.ops)
        .map_err(|e| EngineError::Bug(format!("the planned patch does not serialize: {e}")))?;
    let object = if want_object {
        let mut doc = parse_value(request.object.text)?;
        patch::apply(&mut doc, &patch).map_err(|e| {
            EngineError::Bug(format!("the engine produced an inapplicable patch: {e}"))
        })?;
        Some(doc)
    } else {
        None
    };
    let injection = Injection {
        changed: !plan.ops.is_empty(),
        patch: Bytes::from(patch),
        warnings: plan.warnings,
    };
    if let Some(rendering) = kept {
        policy
            .plan_cache
            .insert(rendering, key.into_owned(), token, &injection);
    }
    Ok((Decision::Inject(injection), object))
}

/// Renders every template of `policy` for this request, and checks names that only exist after
/// rendering.
fn render<'p>(
    policy: &'p CompiledPolicy,
    request: &PodRequest<'_>,
    status: &plan::Status,
    overrides: Option<&overrides::Resolved>,
    meta_only: bool,
) -> Result<template::Rendered<'p>, EngineError> {
    let deps = policy.templates.deps;
    let ctx = if deps.any() {
        let ns = request.namespace;
        let (pod, identity) = if deps.pod {
            let mut value = parse_value(request.object.text)?;
            // Templates see the pod as it was before this policy's injection, so a template that
            // reads the pod renders the same on its own output.
            if let Some(mine) = &status.mine {
                strip_for_render(&mut value, &policy.name, mine);
            }
            let identity = match &policy.spec.identity {
                Some(_) => identity::context(request.trust_domain, &ns.name, &value),
                None => JValue::UNDEFINED,
            };
            (JValue::from_serialize(&value), identity)
        } else {
            (JValue::UNDEFINED, JValue::UNDEFINED)
        };
        let namespace = if deps.namespace {
            minijinja::context! {
                name => ns.name.as_str(),
                labels => JValue::from_serialize(&ns.labels),
                annotations => JValue::from_serialize(&ns.annotations),
            }
        } else {
            JValue::UNDEFINED
        };
        let overrides = match overrides {
            Some(r) if deps.overrides => r.context(&policy.overrides),
            _ => JValue::UNDEFINED,
        };
        minijinja::context! {
            pod => pod,
            namespace => namespace,
            identity => identity,
            overrides => overrides,
            policy => policy.policy_ctx.clone(),
            values => policy.values_ctx.clone(),
        }
    } else {
        policy.static_ctx.clone()
    };
    let rendered = policy
        .templates
        .render(&ctx, meta_only)
        .map_err(|e| EngineError::Render {
            policy: policy.name.clone(),
            field: e.field,
            message: e.message,
        })?;
    if deps.any() {
        check_rendered_names(&policy.name, &rendered)?;
    }
    Ok(rendered)
}

/// Names that only exist after rendering must still be unique.
fn check_rendered_names(policy: &str, r: &template::Rendered<'_>) -> Result<(), EngineError> {
    let lists: [(Vec<&template::RItem<'_>>, &str); 4] = [
        (
            r.init_containers.iter().chain(&r.containers).collect(),
            "name",
        ),
        (r.volumes.iter().collect(), "name"),
        (r.env.iter().collect(), "name"),
        (r.volume_mounts.iter().collect(), "mountPath"),
    ];
    for (items, key) in lists {
        if let Some(dup) = first_duplicate(items.iter().map(|i| i.key.as_ref())) {
            let field = items
                .iter()
                .filter(|i| i.key == dup)
                .nth(1)
                .map(|i| format!("{}.{key}", i.field))
                .unwrap_or_default();
            return Err(EngineError::InvalidRender {
                policy: policy.to_owned(),
                field,
                message: format!("duplicate rendered name {dup:?}"),
            });
        }
    }
    Ok(())
}

/// Removes from `pod` what `mine` says this policy injected (for rendering only).
fn strip_for_render(pod: &mut serde_json::Value, policy: &str, mine: &ProvenanceEntry) {
    use serde_json::Value;
    pub(crate) fn retain_named(list: Option<&mut Value>, names: &[String], key: &str) {
        if let Some(Value::Array(items)) = list {
            items.retain(|i| {
                !i.get(key)
                    .and_then(Value::as_str)
                    .is_some_and(|n| names.iter().any(|x| x == n))
            });
        }
    }
    if let Some(spec) = pod.get_mut("spec") {
        retain_named(
            spec.get_mut("initContainers"),
            &mine.init_containers,
            "name",
        );
        retain_named(spec.get_mut("containers"), &mine.containers, "name");
        retain_named(spec.get_mut("volumes"), &mine.volumes, "name");
        if let Some(Value::Array(containers)) = spec.get_mut("containers") {
            for c in containers {
                let Some(name) = c.get("name").and_then(Value::as_str).map(str::to_owned) else {
                    continue;
                };
                if let Some(env) = mine.env.get(&name) {
                    retain_named(c.get_mut("env"), env, "name");
                }
                if let Some(mounts) = mine.volume_mounts.get(&name) {
                    retain_named(c.get_mut("volumeMounts"), mounts, "mountPath");
                }
            }
        }
    }
    if let Some(meta) = pod.get_mut("metadata") {
        if let Some(Value::Object(labels)) = meta.get_mut("labels") {
            for k in &mine.labels {
                labels.shift_remove(k);
            }
        }
        if let Some(Value::Object(annotations)) = meta.get_mut("annotations") {
            for k in &mine.annotations {
                annotations.shift_remove(k);
            }
            let status = annotations
                .get(STATUS_ANNOTATION)
                .and_then(Value::as_str)
                .and_then(|s| serde_json::from_str::<serde_json::Map<String, Value>>(s).ok());
            if let Some(mut entries) = status {
                entries.shift_remove(policy);
                if entries.is_empty() {
                    annotations.shift_remove(STATUS_ANNOTATION);
                } else if let Ok(text) = serde_json::to_string(&entries) {
                    annotations.insert(STATUS_ANNOTATION.to_owned(), Value::String(text));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use splice_crds::InjectionPolicy;

    use super::*;

    const POD: &str = include_str!("../../testdata/pod-8k.json");

    fn sidecar() -> CompiledPolicy {
        let p: InjectionPolicy =
            serde_yaml::from_str(include_str!("../../testdata/policy-sidecar.yaml")).unwrap();
        CompiledPolicy::compile("mesh-proxy", 3, &p.spec).unwrap()
    }

    fn patch(policy: &CompiledPolicy, pod: &serde_json::Value) -> Injection {
        let text = pod.to_string();
        let ns = NamespaceContext {
            name: "shop".into(),
            ..Default::default()
        };
        let ex = Exclusions::default_for("splice-system");
        let req = PodRequest {
            operation: Operation::Create,
            object: &Pod::parse(&text).unwrap(),
            namespace: &ns,
            exclusions: &ex,
            trust_domain: identity::DEFAULT_TRUST_DOMAIN,
            selection: Selection::Evaluate,
        };
        match inject(policy, &req).unwrap() {
            Decision::Inject(i) => i,
            other => panic!("expected an injection, got {other:?}"),
        }
    }

    /// `pod` with one more env var in its first container.
    fn with_env(pod: &serde_json::Value, name: &str) -> serde_json::Value {
        let mut pod = pod.clone();
        pod["spec"]["containers"][0]["env"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"name": name, "value": "author"}));
        pod
    }

    #[test]
    fn replicas_of_one_template_share_one_kept_patch_and_a_taken_env_name_makes_another() {
        let policy = sidecar();
        let first: serde_json::Value = serde_json::from_str(POD).unwrap();
        let a = patch(&policy, &first);
        assert_eq!(policy.plan_cache.len(), 1);

        // Another replica: its own name, image, env values and a per-pod label (as a
        // StatefulSet's), the same names everywhere.
        let mut replica = first.clone();
        replica["metadata"]["name"] = "web-8k-2".into();
        replica["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] = "web-8k-2".into();
        replica["spec"]["containers"][0]["image"] = "registry.example/web:2".into();
        for c in replica["spec"]["containers"].as_array_mut().unwrap() {
            for e in c["env"].as_array_mut().unwrap() {
                e["value"] = "another replica's value".into();
            }
        }
        let b = patch(&policy, &replica);
        assert_eq!(policy.plan_cache.len(), 1);
        assert_eq!((&a.patch, &a.warnings), (&b.patch, &b.warnings));

        // The author sets one of the policy's env vars: the injected one is skipped there.
        let c = patch(&policy, &with_env(&first, "MESH_ENABLED"));
        assert_eq!(policy.plan_cache.len(), 2);
        assert_ne!(a.patch, c.patch);
        assert!(
            c.warnings
                .iter()
                .any(|w| w.contains("kept the pod's own env MESH_ENABLED")),
            "{:?}",
            c.warnings
        );
    }

    #[test]
    fn a_label_the_policy_sets_is_part_of_what_a_kept_patch_is_kept_for() {
        let policy = sidecar();
        let first: serde_json::Value = serde_json::from_str(POD).unwrap();
        let label = policy.templates.labels[0].key.clone();
        let a = patch(&policy, &first);
        let mut own = first.clone();
        own["metadata"]["labels"][&label] = "the-authors".into();
        let b = patch(&policy, &own);
        assert_eq!(policy.plan_cache.len(), 2);
        assert_ne!(a.patch, b.patch);
    }

    /// `pod` (the 8 KB fixture, which has the ServiceAccount plugin's token volume
    /// `kube-api-access-x7k2p` mounted into its containers) with that volume named
    /// `kube-api-access-<suffix>`, as the API server names it anew for every pod.
    fn with_token(pod: &serde_json::Value, suffix: &str) -> serde_json::Value {
        let text = pod.to_string();
        assert!(
            text.contains("kube-api-access-x7k2p"),
            "the fixture changed"
        );
        serde_json::from_str(&text.replace("x7k2p", suffix)).unwrap()
    }

    #[test]
    fn pods_differing_only_in_their_token_volume_share_a_kept_patch_with_their_own_name() {
        let policy = sidecar();
        let base: serde_json::Value = serde_json::from_str(POD).unwrap();
        let a = patch(&policy, &with_token(&base, "abcde"));
        assert!(String::from_utf8_lossy(&a.patch).contains("kube-api-access-abcde"));
        let second = with_token(&base, "vwxyz");
        let b = patch(&policy, &second);
        assert_eq!(
            policy.plan_cache.len(),
            1,
            "the second pod was planned again"
        );
        let fresh = patch(&sidecar(), &second);
        assert_eq!((&b.patch, &b.warnings), (&fresh.patch, &fresh.warnings));
        assert!(!String::from_utf8_lossy(&b.patch).contains("abcde"));
    }

    #[test]
    fn a_policy_naming_a_token_volume_keeps_a_plan_per_token_name() {
        let mut p: InjectionPolicy =
            serde_yaml::from_str(include_str!("../../testdata/policy-sidecar.yaml")).unwrap();
        p.spec
            .template
            .annotations
            .insert("mesh.example/token".into(), "kube-api-access-x".into());
        let named = CompiledPolicy::compile("mesh-proxy", 3, &p.spec).unwrap();
        assert!(named.names_token_volumes);
        let base: serde_json::Value = serde_json::from_str(POD).unwrap();
        patch(&named, &with_token(&base, "abcde"));
        patch(&named, &with_token(&base, "vwxyz"));
        assert_eq!(named.plan_cache.len(), 2);
    }

    #[test]
    fn a_pod_carrying_a_status_annotation_is_planned_every_time() {
        let policy = sidecar();
        let mut pod: serde_json::Value = serde_json::from_str(POD).unwrap();
        pod["metadata"]["annotations"][STATUS_ANNOTATION] = "{}".into();
        let first = patch(&policy, &pod);
        let again = patch(&policy, &pod);
        assert_eq!(policy.plan_cache.len(), 0);
        assert_eq!(first.patch, again.patch);
    }
}
