//! Why a policy does or does not select a pod, down to the selector requirement or exclusion that
//! decided, and whether the pod's recorded injection is current. `splice explain` and the
//! controller's coverage count both read it, so they can never disagree with each other; the
//! checks run in the same order as the engine's own precheck, so they cannot disagree with the
//! webhook either.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde::Serialize;
use splice_crds::{NAMESPACE_NAME_LABEL, OPT_OUT_LABEL};

use super::selector::Selector;
use super::{CompiledPolicy, Exclusions, NamespaceContext, Provenance, SkipReason};

/// What decided whether a policy selects a pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "decidedBy")]
pub enum Verdict {
    /// Both selectors select the pod and nothing excludes it.
    Selected,
    /// The namespace is one of the mandatory exclusions (kube-system, kube-node-lease, Splice's).
    ExcludedNamespace { namespace: String },
    /// The pod carries `splice.dev/inject: "false"`.
    OptedOut,
    /// The first requirement of `spec.namespaceSelector` the namespace fails.
    NamespaceSelector { requirement: String },
    /// The first requirement of `spec.objectSelector` the pod fails.
    ObjectSelector { requirement: String },
}

impl Verdict {
    pub fn selected(&self) -> bool {
        matches!(self, Verdict::Selected)
    }

    /// The engine's skip reason for the same decision (`None` when selected).
    pub fn skip_reason(&self) -> Option<SkipReason> {
        match self {
            Verdict::Selected => None,
            Verdict::ExcludedNamespace { .. } => Some(SkipReason::ExcludedNamespace),
            Verdict::OptedOut => Some(SkipReason::OptedOut),
            Verdict::NamespaceSelector { .. } => Some(SkipReason::NamespaceNotSelected),
            Verdict::ObjectSelector { .. } => Some(SkipReason::ObjectNotSelected),
        }
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            Verdict::Selected => {
                "selected by spec.namespaceSelector and spec.objectSelector".into()
            }
            Verdict::ExcludedNamespace { namespace } => {
                format!("excluded: namespace {namespace} is never injected")
            }
            Verdict::OptedOut => format!("excluded: the pod has {OPT_OUT_LABEL}=\"false\""),
            Verdict::NamespaceSelector { requirement } => {
                format!("not selected: {requirement}")
            }
            Verdict::ObjectSelector { requirement } => format!("not selected: {requirement}"),
        }
    }
}

/// Whether a pod carries this policy's injection, and from which template.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    tag = "state"
)]
pub enum InjectionState {
    NotInjected,
    /// Injected with the template the policy has now.
    Current,
    /// Injected with an earlier template (the hash it recorded differs from the policy's), or
    /// with data of `valuesFrom` that has changed since (`changed_sources` names the objects).
    Outdated {
        recorded_hash: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        changed_sources: Vec<String>,
    },
}

/// Decides, in the engine's order, whether `policy` selects a pod with `pod_labels` in
/// `namespace`. Operations are not considered: the question is which pods the policy is for.
pub fn decide(
    policy: &CompiledPolicy,
    namespace: &NamespaceContext,
    exclusions: &Exclusions,
    pod_labels: &BTreeMap<String, String>,
) -> Verdict {
    if exclusions.excludes(&namespace.name) {
        return Verdict::ExcludedNamespace {
            namespace: namespace.name.clone(),
        };
    }
    if pod_labels.get(OPT_OUT_LABEL).map(String::as_str) == Some("false") {
        return Verdict::OptedOut;
    }
    if !policy.selects_namespace(namespace) {
        let ns_label = |k: &str| match namespace.labels.get(k) {
            Some(v) => Some(v.as_str()),
            None if k == NAMESPACE_NAME_LABEL && !namespace.name.is_empty() => {
                Some(namespace.name.as_str())
            }
            None => None,
        };
        return Verdict::NamespaceSelector {
            requirement: first_failing(
                "spec.namespaceSelector",
                policy.spec.namespace_selector.as_ref(),
                ns_label,
                &format!("namespace {}", namespace.name),
            ),
        };
    }
    let pod_label = |k: &str| pod_labels.get(k).map(String::as_str);
    if !policy.object_selector.matches(pod_label) {
        return Verdict::ObjectSelector {
            requirement: first_failing(
                "spec.objectSelector",
                policy.spec.object_selector.as_ref(),
                pod_label,
                "the pod",
            ),
        };
    }
    Verdict::Selected
}

/// True when nothing excludes `namespace` and `spec.namespaceSelector` selects it: the part of
/// [`decide`] that is the same for every pod in a namespace. Allocates nothing.
pub fn selects_namespace(
    policy: &CompiledPolicy,
    namespace: &NamespaceContext,
    exclusions: &Exclusions,
) -> bool {
    !exclusions.excludes(&namespace.name) && policy.selects_namespace(namespace)
}

/// The pod part of [`decide`]: not opted out and selected by `spec.objectSelector`. Allocates
/// nothing, for counting many pods.
pub fn selects_pod(policy: &CompiledPolicy, pod_labels: &BTreeMap<String, String>) -> bool {
    pod_labels.get(OPT_OUT_LABEL).map(String::as_str) != Some("false")
        && policy
            .object_selector
            .matches(|k| pod_labels.get(k).map(String::as_str))
}

/// Compares what the pod recorded for `policy` with the policy's current template hash, when
/// the policy was compiled with its `valuesFrom` data with the digest of each source, and with
/// the values its overrides take from `namespace` now (a changed one counts as a changed source,
/// `override NAME`).
pub fn injection_state(
    policy: &CompiledPolicy,
    provenance: &Provenance,
    namespace: &NamespaceContext,
) -> InjectionState {
    let Some(entry) = provenance.get(policy.name()) else {
        return InjectionState::NotInjected;
    };
    let mut changed_sources = changed_sources(policy.data_digests(), &entry.data);
    let recorded = (!entry.overrides.is_empty()).then_some(&entry.overrides);
    if let Some(name) =
        policy
            .overrides()
            .drifted(recorded, &namespace.name, &namespace.annotations)
    {
        changed_sources.push(format!("override {name}"));
    }
    if entry.hash == policy.template_hash() && changed_sources.is_empty() {
        return InjectionState::Current;
    }
    InjectionState::Outdated {
        recorded_hash: entry.hash.clone(),
        changed_sources,
    }
}

/// The sources whose digest in `current` differs from the one `recorded` (a source only one of
/// them has counts as changed). Empty when `current` is (compiled without data: nothing known).
pub fn changed_sources(
    current: &BTreeMap<String, String>,
    recorded: &BTreeMap<String, String>,
) -> Vec<String> {
    if current.is_empty() {
        return Vec::new();
    }
    let mut names: Vec<String> = current
        .iter()
        .filter(|(k, v)| recorded.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .collect();
    names.extend(
        recorded
            .keys()
            .filter(|k| !current.contains_key(*k))
            .cloned(),
    );
    names
}

/// Names the first requirement of `selector` that `get` fails, as a field path plus what it asks
/// and what the object has. Each requirement is compiled on its own with the engine's selector,
/// so the verdict uses exactly the webhook's semantics.
fn first_failing<'l>(
    root: &str,
    selector: Option<&LabelSelector>,
    get: impl Fn(&str) -> Option<&'l str>,
    subject: &str,
) -> String {
    let has = |key: &str| match get(key) {
        Some(v) => format!("{subject} has {key}={v:?}"),
        None => format!("{subject} has no label {key}"),
    };
    let Some(selector) = selector else {
        return format!("{root} (no requirement fails)");
    };
    for (key, value) in selector.match_labels.iter().flatten() {
        let single = LabelSelector {
            match_labels: Some([(key.clone(), value.clone())].into()),
            match_expressions: None,
        };
        if fails(&single, &get) {
            return format!(
                "{root}.matchLabels[{key:?}] wants {key}={value:?}; {}",
                has(key)
            );
        }
    }
    for (i, expr) in selector.match_expressions.iter().flatten().enumerate() {
        let single = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![expr.clone()]),
        };
        if fails(&single, &get) {
            return format!(
                "{root}.matchExpressions[{i}] ({}) fails; {}",
                requirement_text(expr),
                has(&expr.key)
            );
        }
    }
    format!("{root} (no single requirement fails)")
}

fn fails<'l>(single: &LabelSelector, get: &impl Fn(&str) -> Option<&'l str>) -> bool {
    // The policy compiled, so each of its requirements compiles on its own.
    Selector::compile(Some(single)).is_ok_and(|s| !s.matches(get))
}

fn requirement_text(r: &LabelSelectorRequirement) -> String {
    let values = r.values.clone().unwrap_or_default();
    if values.is_empty() {
        format!("{} {}", r.key, r.operator)
    } else {
        format!("{} {} [{}]", r.key, r.operator, values.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use splice_crds::InjectionPolicySpec;

    use super::*;
    use crate::ProvenanceEntry;

    fn policy(yaml: &str) -> CompiledPolicy {
        let spec: InjectionPolicySpec = serde_yaml::from_str(yaml).unwrap();
        CompiledPolicy::compile("p", 1, &spec).unwrap()
    }

    fn ns(name: &str, labels: &[(&str, &str)]) -> NamespaceContext {
        NamespaceContext {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            annotations: BTreeMap::new(),
        }
    }

    fn labels(l: &[(&str, &str)]) -> BTreeMap<String, String> {
        l.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_pod_both_selectors_select_is_selected() {
        let p = policy("objectSelector: {matchLabels: {app: web}}\n");
        let v = decide(
            &p,
            &ns("shop", &[]),
            &Exclusions::default_for("splice-system"),
            &labels(&[("app", "web")]),
        );
        assert_eq!(v, Verdict::Selected);
    }

    #[test]
    fn the_failing_object_selector_requirement_is_named_with_the_pods_value() {
        let p = policy(
            "objectSelector:\n  matchLabels: {app: web}\n  matchExpressions:\n  - {key: tier, operator: In, values: [a, b]}\n",
        );
        let ex = Exclusions::default_for("splice-system");
        let v = decide(&p, &ns("shop", &[]), &ex, &labels(&[("app", "api")]));
        assert_eq!(
            v,
            Verdict::ObjectSelector {
                requirement: "spec.objectSelector.matchLabels[\"app\"] wants app=\"web\"; the pod has app=\"api\"".into()
            }
        );
        let v = decide(
            &p,
            &ns("shop", &[]),
            &ex,
            &labels(&[("app", "web"), ("tier", "c")]),
        );
        let Verdict::ObjectSelector { requirement } = v else {
            panic!("expected an object selector verdict, got {v:?}");
        };
        assert!(
            requirement.starts_with("spec.objectSelector.matchExpressions[0] (tier In [a, b])"),
            "{requirement}"
        );
    }

    #[test]
    fn the_namespace_selector_sees_the_implied_name_label() {
        let p = policy(
            "namespaceSelector:\n  matchExpressions:\n  - {key: kubernetes.io/metadata.name, operator: In, values: [shop]}\n",
        );
        let ex = Exclusions::default_for("splice-system");
        assert!(decide(&p, &ns("shop", &[]), &ex, &labels(&[])).selected());
        let v = decide(&p, &ns("blog", &[]), &ex, &labels(&[]));
        let Verdict::NamespaceSelector { requirement } = v else {
            panic!("expected a namespace selector verdict, got {v:?}");
        };
        assert!(
            requirement.contains("namespace blog has kubernetes.io/metadata.name=\"blog\""),
            "{requirement}"
        );
    }

    #[test]
    fn exclusions_decide_before_selectors_in_the_engines_order() {
        let p = policy("objectSelector: {matchLabels: {app: web}}\n");
        let ex = Exclusions::default_for("splice-system");
        assert_eq!(
            decide(&p, &ns("splice-system", &[]), &ex, &labels(&[])),
            Verdict::ExcludedNamespace {
                namespace: "splice-system".into()
            }
        );
        assert_eq!(
            decide(
                &p,
                &ns("shop", &[]),
                &ex,
                &labels(&[("app", "web"), (OPT_OUT_LABEL, "false")])
            ),
            Verdict::OptedOut
        );
    }

    #[test]
    fn the_cheap_checks_agree_with_decide() {
        let p = policy(
            "namespaceSelector: {matchLabels: {env: prod}}\nobjectSelector: {matchExpressions: [{key: app, operator: Exists}]}\n",
        );
        let ex = Exclusions::default_for("splice-system");
        let namespaces = [
            ns("shop", &[("env", "prod")]),
            ns("dev", &[("env", "dev")]),
            ns("kube-system", &[("env", "prod")]),
        ];
        let pods = [
            labels(&[("app", "x")]),
            labels(&[]),
            labels(&[("app", "x"), (OPT_OUT_LABEL, "false")]),
        ];
        for n in &namespaces {
            for l in &pods {
                assert_eq!(
                    selects_namespace(&p, n, &ex) && selects_pod(&p, l),
                    decide(&p, n, &ex, l).selected(),
                    "{} {l:?}",
                    n.name
                );
            }
        }
    }

    #[test]
    fn a_recorded_hash_other_than_the_policys_is_outdated() {
        let p = policy("template: {labels: {a: b}}\n");
        let mut prov = Provenance::new();
        assert_eq!(
            injection_state(&p, &prov, &NamespaceContext::default()),
            InjectionState::NotInjected
        );
        prov.insert(
            "p".into(),
            ProvenanceEntry {
                hash: p.template_hash().into(),
                ..Default::default()
            },
        );
        assert_eq!(
            injection_state(&p, &prov, &NamespaceContext::default()),
            InjectionState::Current
        );
        prov.insert(
            "p".into(),
            ProvenanceEntry {
                hash: "old".into(),
                ..Default::default()
            },
        );
        assert_eq!(
            injection_state(&p, &prov, &NamespaceContext::default()),
            InjectionState::Outdated {
                changed_sources: Vec::new(),
                recorded_hash: "old".into()
            }
        );
    }
}
