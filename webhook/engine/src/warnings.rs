//! Warnings a valid policy deserves: what it will do that its author probably did not mean.
//!
//! - A template that reads a pod field the API server has not filled in at admission time fails
//!   to render for those pods (strict undefined): the webhook answers an error and the API server
//!   applies the webhook's failure policy (`Ignore`: the pod is admitted without this policy's
//!   injection; `Fail`: the pod is refused). A read the template guards (it renders on a pod
//!   lacking the field, tried at compile time) is not warned about.
//! - A confused deputy: content that Pod Security `baseline` forbids (what `allowPrivileged`
//!   gates) whose image, command, arguments, environment or security settings come from `pod.*`,
//!   which whoever creates a pod writes: the policy would run their choice with its privileges.
//!
//! Pure; computed once when a policy compiles, shown by the validating webhook (AdmissionReview
//! `warnings`, which kubectl prints), by `splice inject`/`simulate`, and in the policy's status.

use minijinja::Value as JValue;
use splice_crds::{FailurePolicy, InjectionPolicySpec};

use super::podsecurity::PodSecurity;
use super::template::{Hole, TemplateItem, Templates};

/// One warning, naming the policy field it is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyWarning {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for PolicyWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.field, self.message)
    }
}

/// Pod fields commonly absent when a pod is admitted, and who lacks them.
/// Kept short: the API server may cut a warning after 256 characters.
const ABSENT_AT_ADMISSION: [(&str, &str); 5] = [
    (
        "pod.metadata.name",
        "absent at admission for pods created with generateName (Deployments, DaemonSets, Jobs)",
    ),
    (
        "pod.metadata.uid",
        "which no pod has at admission (the API server assigns it after)",
    ),
    (
        "pod.metadata.creationTimestamp",
        "which no pod has at admission (the API server sets it after)",
    ),
    (
        "pod.spec.nodeName",
        "absent at admission unless the pod names its node (the scheduler sets it later)",
    ),
    ("pod.status", "which no pod has at admission"),
];

/// Fields of an injected container whose value decides what it runs.
const RUNS: [&str; 7] = [
    "image",
    "command",
    "args",
    "env",
    "envFrom",
    "workingDir",
    "securityContext",
];

/// `statics` is the render context of `policy` and `values`.
pub(crate) fn collect(
    spec: &InjectionPolicySpec,
    t: &Templates,
    statics: &JValue,
    security: &PodSecurity,
) -> Vec<PolicyWarning> {
    let mut out = Vec::new();
    let outcome = match spec.failure_policy {
        FailurePolicy::Ignore => {
            "the injection fails and, under failurePolicy Ignore, such pods are admitted uninjected"
        }
        FailurePolicy::Fail => {
            "the injection fails and, under failurePolicy Fail, such pods are refused"
        }
    };
    let items = t
        .init_containers
        .iter()
        .chain(&t.containers)
        .chain(&t.volumes)
        .chain(&t.env_vars)
        .chain(&t.volume_mounts);
    let holes = items.flat_map(|i| i.holes()).chain(
        t.labels
            .iter()
            .chain(&t.annotations)
            .filter_map(|s| s.hole()),
    );
    for hole in holes {
        absent_fields(t, hole, statics, outcome, &mut out);
    }
    for item in t.init_containers.iter().chain(&t.containers) {
        confused_deputy(item, security, &RUNS, "runs", &mut out);
    }
    for item in &t.volumes {
        confused_deputy(
            item,
            security,
            &["hostPath"],
            "mounts from the node",
            &mut out,
        );
    }
    out
}

/// Warns when `hole` reads one of [`ABSENT_AT_ADMISSION`] and does not render without it (a read
/// guarded by `| default(...)` or `is defined` is fine).
fn absent_fields(
    t: &Templates,
    hole: &Hole,
    statics: &JValue,
    outcome: &str,
    out: &mut Vec<PolicyWarning>,
) {
    for (path, who) in ABSENT_AT_ADMISSION {
        let reads = hole.vars.iter().any(|v| {
            v == path
                || v.strip_prefix(path)
                    .is_some_and(|rest| rest.starts_with('.'))
        });
        if reads && !t.renders_without(hole, path, statics) {
            out.push(PolicyWarning {
                field: hole.field.clone(),
                message: format!("reads {path}, {who}: {outcome}"),
            });
        }
    }
}

/// Warns for each string of `item` under one of `fields` that reads `pod`, when the item holds
/// content `baseline` forbids.
fn confused_deputy(
    item: &TemplateItem,
    security: &PodSecurity,
    fields: &[&str],
    what: &str,
    out: &mut Vec<PolicyWarning>,
) {
    let prefix = format!("{}.", item.field);
    let Some(reason) = security
        .privileged()
        .find(|f| f.field.starts_with(&prefix) || f.field == item.field)
    else {
        return;
    };
    for hole in item.holes() {
        if hole.reads_pod() && fields.iter().any(|f| hole.under(&[*f])) {
            let read: Vec<&str> = hole
                .vars
                .iter()
                .filter(|v| v.split('.').next() == Some("pod"))
                .map(String::as_str)
                .collect();
            out.push(PolicyWarning {
                field: hole.field.clone(),
                message: format!(
                    "takes its value from {} while {} {}: pod authors choose what this \
                     privileged content {what}",
                    read.join(", "),
                    reason.field,
                    reason.message
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use crate::podsecurity;

    fn warnings(spec: serde_json::Value) -> Vec<PolicyWarning> {
        let spec: InjectionPolicySpec = serde_json::from_value(spec).unwrap();
        let t = Templates::compile("p", 1, &spec).unwrap();
        let security = podsecurity::assess(&t, &|_| None);
        let (policy, values) = crate::template::static_context("p", 1, &spec);
        let statics = minijinja::context! { policy => policy, values => values };
        collect(&spec, &t, &statics, &security)
    }

    #[test]
    fn a_template_reading_the_pod_name_is_warned_about_with_its_field_and_the_outcome() {
        let w = warnings(serde_json::json!({
            "template": {"containers": [{"name": "s", "image": "x",
                "env": [{"name": "POD", "value": "{{ pod.metadata.name }}"}]}]},
        }));
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].field, "spec.template.containers[0].env[0].value");
        let text = w[0].to_string();
        assert!(text.contains("reads pod.metadata.name"), "{text}");
        assert!(text.contains("generateName"), "{text}");
        assert!(text.contains("admitted uninjected"), "{text}");

        let w = warnings(serde_json::json!({
            "failurePolicy": "Fail",
            "template": {"annotations": {"node": "{{ pod.spec.nodeName }}"}},
        }));
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].field, "spec.template.annotations.node");
        assert!(w[0].message.contains("refused"), "{w:?}");
    }

    #[test]
    fn as_the_warning_says_a_pod_created_with_generate_name_fails_to_render() {
        use crate::{
            CompiledPolicy, EngineError, Exclusions, NamespaceContext, PodRequest, inject,
        };
        let spec: InjectionPolicySpec = serde_json::from_value(serde_json::json!({
            "template": {"containers": [{"name": "s", "image": "x",
                "env": [{"name": "POD", "value": "{{ pod.metadata.name }}"}]}]},
        }))
        .unwrap();
        let policy = CompiledPolicy::compile("p", 1, &spec).unwrap();
        let ns = NamespaceContext {
            name: "shop".into(),
            ..Default::default()
        };
        let ex = Exclusions::default_for("splice-system");
        let pod = r#"{"metadata":{"generateName":"web-7d9f-","namespace":"shop"},
            "spec":{"containers":[{"name":"app","image":"a"}]}}"#;
        let request = PodRequest {
            operation: splice_crds::Operation::Create,
            object: &crate::Pod::parse(pod).unwrap(),
            namespace: &ns,
            exclusions: &ex,
            trust_domain: crate::identity::DEFAULT_TRUST_DOMAIN,
            selection: crate::Selection::Evaluate,
        };
        match inject(&policy, &request) {
            Err(EngineError::Render { field, message, .. }) => {
                assert_eq!(field, "spec.template.containers[0].env[0].value");
                assert!(message.contains("pod.metadata.name"), "{message}");
            }
            other => panic!("expected a render error, got {other:?}"),
        }

        // Guarded, the read renders (so it is not warned about).
        let mut guarded = spec.clone();
        guarded.template.containers[0].env.as_mut().unwrap()[0].value =
            Some("{{ pod.metadata.name | default(pod.metadata.generateName) }}".into());
        let policy = CompiledPolicy::compile("p", 1, &guarded).unwrap();
        assert!(policy.warnings().is_empty(), "{:?}", policy.warnings());
        let (_, pod) = crate::inject_and_apply(&policy, &request).unwrap();
        assert_eq!(
            pod["spec"]["containers"][1]["env"][0]["value"],
            serde_json::json!("web-7d9f-")
        );
    }

    #[test]
    fn status_uid_and_creation_time_are_warned_about_and_labels_and_namespace_are_not() {
        for path in [
            "pod.status.podIP",
            "pod.metadata.uid",
            "pod.metadata.creationTimestamp",
        ] {
            let w = warnings(serde_json::json!({
                "template": {"labels": {"x": format!("{{{{ {path} }}}}")}},
            }));
            assert_eq!(w.len(), 1, "{path}: {w:?}");
        }
        let w = warnings(serde_json::json!({
            "template": {"labels": {
                "x": "{{ pod.metadata.labels.app }}",
                "y": "{{ namespace.name }}",
                "z": "{{ pod.metadata.namespace }}",
                "w": "{{ pod.metadata.nameSuffix | default('a') }}",
                "v": "{{ pod.metadata.name | default(pod.metadata.generateName) }}",
                "u": "{% if pod.spec.nodeName is defined %}{{ pod.spec.nodeName }}{% endif %}",
            }},
        }));
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn privileged_content_that_runs_what_the_pod_says_is_a_confused_deputy() {
        let w = warnings(serde_json::json!({
            "allowPrivileged": true,
            "template": {"initContainers": [{
                "name": "net", "image": "{{ pod.metadata.annotations.netimage }}",
                "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}},
            }]},
        }));
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].field, "spec.template.initContainers[0].image");
        assert!(w[0].message.contains("NET_ADMIN"), "{w:?}");
        assert!(
            w[0].message.contains("pod.metadata.annotations.netimage"),
            "{w:?}"
        );

        let w = warnings(serde_json::json!({
            "allowPrivileged": true,
            "template": {"volumes": [{"name": "h",
                "hostPath": {"path": "/var/{{ pod.metadata.labels.dir }}"}}]},
        }));
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].field, "spec.template.volumes[0].hostPath.path");
    }

    #[test]
    fn unprivileged_content_from_the_pod_and_privileged_content_from_values_are_fine() {
        let w = warnings(serde_json::json!({
            "template": {"containers": [{
                "name": "s", "image": "{{ pod.metadata.annotations.image }}",
            }]},
        }));
        assert!(w.is_empty(), "{w:?}");
        let w = warnings(serde_json::json!({
            "allowPrivileged": true,
            "values": {"image": "proxy:1"},
            "template": {"initContainers": [{
                "name": "net", "image": "{{ values.image }}",
                "args": ["{{ namespace.name }}"],
                "securityContext": {"privileged": true},
            }]},
        }));
        assert!(w.is_empty(), "{w:?}");
    }
}
