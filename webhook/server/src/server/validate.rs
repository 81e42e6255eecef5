//! `POST /validate`: the validating webhook for InjectionPolicy CREATE and UPDATE (dry runs
//! included). The object is judged by the compiler the injecting webhook and the reconcile use
//! ([`CompiledPolicy::compile`]), so what is refused here is exactly what would never be served;
//! what compiles is admitted with the compiler's warnings, which kubectl prints.

use serde::Deserialize;
use splice_crds::InjectionPolicySpec;

use splice_engine::{CompiledPolicy, PolicyWarning};

/// The parts of an InjectionPolicy the judgement reads. Anything else (status, the rest of the
/// metadata) is ignored.
#[derive(Deserialize)]
struct PolicyObject {
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    spec: InjectionPolicySpec,
}

#[derive(Default, Deserialize)]
struct Metadata {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
}

/// The verdict on one InjectionPolicy object.
#[derive(Debug)]
pub enum Verdict {
    /// It compiles; these are its warnings.
    Admit(Vec<PolicyWarning>),
    /// It does not: the message names the field and the reason.
    Refuse(String),
}

/// Where `spec.valuesFrom` may read: the allowed namespaces and the default one.
#[derive(Clone, Debug)]
pub struct ValuesScope {
    pub allowed: Vec<String>,
    pub default_namespace: String,
}

/// Judges the JSON text of an InjectionPolicy as the API server hands it to a validating
/// webhook (after its own schema validation and defaulting). `pod_certificates`: whether the API
/// server serves PodCertificateRequests (`None`: not known, so not judged).
pub fn judge(
    object: &str,
    values_scope: Option<&ValuesScope>,
    pod_certificates: Option<bool>,
) -> Verdict {
    let mut de = serde_json::Deserializer::from_str(object);
    let parsed: Result<PolicyObject, _> = serde_path_to_error::deserialize(&mut de);
    let policy = match parsed {
        Ok(p) => p,
        Err(e) => {
            let path = e.path().to_string();
            return Verdict::Refuse(format!("{path}: {}", e.into_inner()));
        }
    };
    let name = policy.metadata.name.unwrap_or_default();
    // The API server sets generation 1 on create and bumps it on a spec change before any
    // validating webhook sees the object; a template reading `policy.generation` renders the same.
    let generation = policy.metadata.generation.unwrap_or(1);
    if let Some(scope) = values_scope
        && let Err(e) = splice_engine::values_from::check_namespaces(
            &policy.spec,
            &scope.default_namespace,
            &scope.allowed,
        )
    {
        return Verdict::Refuse(format!("policy {name}: {e}"));
    }
    if policy.spec.identity.is_some() && pod_certificates == Some(false) {
        return Verdict::Refuse(format!(
            "policy {name}: spec.identity: {}",
            splice_engine::identity::UNSERVED
        ));
    }
    match CompiledPolicy::compile(&name, generation, &policy.spec) {
        // `mode: InTree` is a promise that nothing on the request path depends on Splice: a
        // policy that cannot keep it is refused, naming the expression.
        Ok(compiled) if policy.spec.mode == splice_crds::Mode::InTree => match compiled.in_tree() {
            Ok(_) => Verdict::Admit(compiled.warnings().to_vec()),
            Err(why) => Verdict::Refuse(format!(
                "policy {name}: spec.mode is InTree, but {why}; use mode Auto or Webhook, or \
                 change that expression"
            )),
        },
        Ok(compiled) => Verdict::Admit(compiled.warnings().to_vec()),
        Err(e) => Verdict::Refuse(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    fn judge_json(v: serde_json::Value) -> Verdict {
        judge(&v.to_string(), None, None)
    }

    #[test]
    fn a_values_source_outside_the_allowed_namespaces_is_refused_naming_it() {
        let mut p = policy(serde_json::json!({}));
        p["spec"]["valuesFrom"] = serde_json::json!([
            {"name": "image", "configMapKeyRef": {"name": "mesh", "key": "image", "namespace": "other"}},
        ]);
        let scope = ValuesScope {
            allowed: vec!["splice-system".into()],
            default_namespace: "splice-system".into(),
        };
        let Verdict::Refuse(m) = judge(&p.to_string(), Some(&scope), None) else {
            panic!("admitted")
        };
        assert!(
            m.contains("spec.valuesFrom[0]: ConfigMap other/mesh"),
            "{m}"
        );
        p["spec"]["valuesFrom"][0]["configMapKeyRef"]["namespace"] = "splice-system".into();
        assert!(matches!(
            judge(&p.to_string(), Some(&scope), None),
            Verdict::Admit(_)
        ));
    }

    #[test]
    fn an_identity_policy_is_refused_where_the_api_server_lacks_pod_certificates_and_only_there() {
        let mut p = policy(serde_json::json!({"containers": [{"name": "proxy", "image": "p"}]}));
        p["spec"]["identity"] = serde_json::json!({"mountPath": "/var/run/id"});
        let Verdict::Refuse(m) = judge(&p.to_string(), None, Some(false)) else {
            panic!("admitted")
        };
        assert!(
            m.contains("spec.identity: the API server does not serve"),
            "{m}"
        );
        assert!(m.contains("podcertificaterequests"), "{m}");
        for served in [Some(true), None] {
            assert!(matches!(
                judge(&p.to_string(), None, served),
                Verdict::Admit(_)
            ));
        }
        p["spec"].as_object_mut().unwrap().remove("identity");
        assert!(matches!(
            judge(&p.to_string(), None, Some(false)),
            Verdict::Admit(_)
        ));
    }

    fn policy(template: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "splice.dev/v1alpha1",
            "kind": "InjectionPolicy",
            "metadata": {"name": "mesh", "generation": 2, "uid": "u"},
            "spec": {"values": {"image": "proxy:1"}, "template": template},
            "status": {"conditions": []},
        })
    }

    #[test]
    fn in_tree_is_refused_for_a_filter_naming_the_field_and_the_expression() {
        let mut p = policy(serde_json::json!({
            "containers": [{"name": "proxy", "image": "{{ namespace.name | upper }}"}],
        }));
        p["spec"]["mode"] = "InTree".into();
        match judge_json(p.clone()) {
            Verdict::Refuse(m) => {
                assert!(m.contains("spec.template.containers[0].image"), "{m}");
                assert!(m.contains("{{ namespace.name | upper }}"), "{m}");
            }
            Verdict::Admit(_) => panic!("admitted"),
        }
        p["spec"]["mode"] = "Auto".into();
        assert!(matches!(judge_json(p), Verdict::Admit(_)));
    }

    #[test]
    fn an_undefined_value_is_refused_with_its_field_path() {
        let v = judge_json(policy(serde_json::json!({
            "containers": [{"name": "proxy", "image": "{{ values.imgae }}"}],
        })));
        let Verdict::Refuse(message) = v else {
            panic!("{v:?}")
        };
        assert!(
            message.starts_with("policy mesh: spec.template.containers[0].image: "),
            "{message}"
        );
        assert!(message.contains("values.imgae"), "{message}");
    }

    #[test]
    fn a_field_of_the_wrong_type_is_refused_with_its_path() {
        let mut p = policy(serde_json::json!({}));
        p["spec"]["timeoutSeconds"] = "soon".into();
        let Verdict::Refuse(message) = judge_json(p) else {
            panic!()
        };
        assert!(message.starts_with("spec.timeoutSeconds: "), "{message}");
    }

    #[test]
    fn a_policy_that_compiles_is_admitted_with_its_warnings() {
        let v = judge_json(policy(serde_json::json!({
            "containers": [{"name": "proxy", "image": "{{ values.image }}",
                "env": [{"name": "POD", "value": "{{ pod.metadata.name }}"}]}],
        })));
        let Verdict::Admit(warnings) = v else {
            panic!("{v:?}")
        };
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(
            warnings[0].field,
            "spec.template.containers[0].env[0].value"
        );
    }
}
