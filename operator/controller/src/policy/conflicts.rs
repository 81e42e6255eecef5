//! Pure: which policies can inject clashing content into the same pod.
//!
//! Two policies conflict when some pod can be selected by both (their namespace selectors and
//! their object selectors can both be satisfied at once) and both inject an item of the same name
//! with different content: the result then depends on webhook order, which the API server does
//! not guarantee. The overlap analysis errs on the side of "may overlap": selectors are only
//! called disjoint when no set of labels can satisfy both.

use splice_engine::Selector;
use splice_engine::selector::Op;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Serialize;
use splice_crds::{InjectionPolicy, InjectionPolicySpec, Operation};

/// The kind of injected item two policies disagree about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ItemKind {
    Container,
    InitContainer,
    Volume,
    EnvVar,
}

impl fmt::Display for ItemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ItemKind::Container => "container",
            ItemKind::InitContainer => "init container",
            ItemKind::Volume => "volume",
            ItemKind::EnvVar => "env var",
        })
    }
}

/// One clash of this policy with another.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Conflict {
    /// The other policy.
    pub other: String,
    /// What this policy injects under the clashing name.
    pub kind: ItemKind,
    pub item: String,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "policy {:?} also injects {} {:?} with different content",
            self.other, self.kind, self.item
        )
    }
}

/// The conflicts of `policy` with each of `others` (the policy itself, if present among them, is
/// skipped), sorted by other policy and item.
pub fn conflicts_of<'a>(
    policy: &InjectionPolicy,
    others: impl IntoIterator<Item = &'a InjectionPolicy>,
) -> Vec<Conflict> {
    let name = policy.metadata.name.as_deref().unwrap_or_default();
    if !injects_content(&policy.spec) {
        return Vec::new();
    }
    let mine = items(&policy.spec);
    let mut found = Vec::new();
    for other in others {
        let other_name = other.metadata.name.as_deref().unwrap_or_default();
        if other_name == name || !injects_content(&other.spec) {
            continue;
        }
        if !selectors_may_overlap(
            policy.spec.namespace_selector.as_ref(),
            other.spec.namespace_selector.as_ref(),
        ) || !selectors_may_overlap(
            policy.spec.object_selector.as_ref(),
            other.spec.object_selector.as_ref(),
        ) {
            continue;
        }
        let theirs = items(&other.spec);
        for ((group, item), mine_item) in &mine {
            let Some(their_item) = theirs.get(&(*group, item.clone())) else {
                continue;
            };
            if !same_content(mine_item, their_item, &policy.spec, &other.spec) {
                found.push(Conflict {
                    other: other_name.to_owned(),
                    kind: mine_item.kind,
                    item: item.clone(),
                });
            }
        }
    }
    found.sort();
    found
}

/// Whether a policy can inject containers, volumes or env vars at all. Paused policies inject
/// nothing, and those items are only injected at CREATE (a pod's containers are immutable).
fn injects_content(spec: &InjectionPolicySpec) -> bool {
    !spec.paused && spec.operations.contains(&Operation::Create)
}

/// Names share a namespace per group: containers and init containers of a pod must all have
/// distinct names, so a container and an init container of the same name clash too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum NameGroup {
    Containers,
    Volumes,
    Env,
}

struct Item {
    kind: ItemKind,
    content: serde_json::Value,
}

fn items(spec: &InjectionPolicySpec) -> BTreeMap<(NameGroup, String), Item> {
    let t = &spec.template;
    let mut out = BTreeMap::new();
    let mut add = |group, kind, name: &str, value: serde_json::Value| {
        out.insert(
            (group, name.to_owned()),
            Item {
                kind,
                content: value,
            },
        );
    };
    for c in &t.init_containers {
        add(
            NameGroup::Containers,
            ItemKind::InitContainer,
            &c.name,
            to_value(c),
        );
    }
    for c in &t.containers {
        add(
            NameGroup::Containers,
            ItemKind::Container,
            &c.name,
            to_value(c),
        );
    }
    for v in &t.volumes {
        add(NameGroup::Volumes, ItemKind::Volume, &v.name, to_value(v));
    }
    for e in &t.env {
        add(NameGroup::Env, ItemKind::EnvVar, &e.name, to_value(e));
    }
    out
}

fn to_value(item: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(item).unwrap_or(serde_json::Value::Null)
}

/// Identical text is only identical content when templating cannot tell the two policies apart:
/// an expression may read `values` (which differ between the policies) or `policy` (whose name
/// always differs).
fn same_content(
    a: &Item,
    b: &Item,
    spec_a: &InjectionPolicySpec,
    spec_b: &InjectionPolicySpec,
) -> bool {
    if a.kind != b.kind || a.content != b.content {
        return false;
    }
    let text = a.content.to_string();
    if !text.contains("{{") {
        return true;
    }
    !text.contains("policy") && spec_a.values == spec_b.values
}

/// What one label key must satisfy, combining every requirement on it from both selectors.
#[derive(Default)]
struct KeyConstraint {
    must_exist: bool,
    must_not_exist: bool,
    /// Intersection of every `In` set (None: no `In` requirement).
    allowed: Option<BTreeSet<String>>,
    forbidden: BTreeSet<String>,
}

impl KeyConstraint {
    fn require_in(&mut self, values: &[String]) {
        self.must_exist = true;
        let values: BTreeSet<String> = values.iter().cloned().collect();
        self.allowed = Some(match self.allowed.take() {
            Some(prev) => prev.intersection(&values).cloned().collect(),
            None => values,
        });
    }

    fn satisfiable(&self) -> bool {
        if self.must_exist && self.must_not_exist {
            return false;
        }
        match &self.allowed {
            Some(allowed) => allowed.iter().any(|v| !self.forbidden.contains(v)),
            // NotIn and Exists alone are always satisfiable: label values are unbounded.
            None => true,
        }
    }
}

/// False only when no set of labels can satisfy both selectors (absent = selects everything).
/// A malformed requirement (unknown operator, `In` without values) is treated as "may match".
pub fn selectors_may_overlap(a: Option<&LabelSelector>, b: Option<&LabelSelector>) -> bool {
    let selectors = [Selector::read(a), Selector::read(b)];
    let mut keys: BTreeMap<&str, KeyConstraint> = BTreeMap::new();
    for r in selectors.iter().flat_map(Selector::requirements) {
        let c = keys.entry(r.key.as_str()).or_default();
        match &r.op {
            Op::In(values) if !values.is_empty() => c.require_in(values),
            Op::NotIn(values) => c.forbidden.extend(values.iter().cloned()),
            Op::Exists => c.must_exist = true,
            Op::DoesNotExist => c.must_not_exist = true,
            Op::In(_) | Op::Unknown(_) => {}
        }
    }
    keys.values().all(KeyConstraint::satisfiable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, EnvVar, Volume};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
        Some(LabelSelector {
            match_labels: Some(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            ),
            match_expressions: None,
        })
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> Option<LabelSelector> {
        Some(LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).into()).collect()),
            }]),
        })
    }

    #[test]
    fn absent_selectors_select_everything_and_overlap() {
        assert!(selectors_may_overlap(None, None));
        assert!(selectors_may_overlap(None, labels(&[("a", "1")]).as_ref()));
    }

    #[test]
    fn the_same_key_with_different_required_values_is_disjoint() {
        assert!(!selectors_may_overlap(
            labels(&[("env", "a")]).as_ref(),
            labels(&[("env", "b")]).as_ref()
        ));
        assert!(!selectors_may_overlap(
            labels(&[("env", "a")]).as_ref(),
            expr("env", "In", &["b", "c"]).as_ref()
        ));
    }

    #[test]
    fn different_keys_can_both_be_present_so_they_overlap() {
        assert!(selectors_may_overlap(
            labels(&[("a", "1")]).as_ref(),
            labels(&[("b", "1")]).as_ref()
        ));
    }

    #[test]
    fn in_and_a_not_in_that_covers_it_are_disjoint() {
        assert!(!selectors_may_overlap(
            expr("env", "In", &["a", "b"]).as_ref(),
            expr("env", "NotIn", &["a", "b"]).as_ref()
        ));
        assert!(selectors_may_overlap(
            expr("env", "In", &["a", "b"]).as_ref(),
            expr("env", "NotIn", &["a"]).as_ref()
        ));
    }

    #[test]
    fn exists_and_does_not_exist_are_disjoint() {
        assert!(!selectors_may_overlap(
            expr("x", "Exists", &[]).as_ref(),
            expr("x", "DoesNotExist", &[]).as_ref()
        ));
        assert!(!selectors_may_overlap(
            labels(&[("x", "1")]).as_ref(),
            expr("x", "DoesNotExist", &[]).as_ref()
        ));
        // Absent satisfies NotIn, so NotIn and DoesNotExist overlap.
        assert!(selectors_may_overlap(
            expr("x", "NotIn", &["1"]).as_ref(),
            expr("x", "DoesNotExist", &[]).as_ref()
        ));
    }

    #[test]
    fn a_malformed_requirement_is_assumed_to_match() {
        assert!(selectors_may_overlap(
            expr("x", "Bogus", &["1"]).as_ref(),
            labels(&[("x", "2")]).as_ref()
        ));
    }

    fn policy(
        name: &str,
        ns: Option<LabelSelector>,
        f: impl FnOnce(&mut InjectionPolicySpec),
    ) -> InjectionPolicy {
        let mut spec = InjectionPolicySpec {
            operations: vec![Operation::Create],
            timeout_seconds: 3,
            namespace_selector: ns,
            ..InjectionPolicySpec::default()
        };
        f(&mut spec);
        InjectionPolicy::new(name, spec)
    }

    fn container(name: &str, image: &str) -> Container {
        Container {
            name: name.into(),
            image: Some(image.into()),
            ..Container::default()
        }
    }

    #[test]
    fn two_policies_injecting_a_same_named_container_differently_each_name_the_other() {
        let a = policy("a", None, |s| {
            s.template.containers = vec![container("proxy", "p:1")]
        });
        let b = policy("b", None, |s| {
            s.template.containers = vec![container("proxy", "p:2")]
        });
        let all = [a.clone(), b.clone()];
        assert_eq!(
            conflicts_of(&a, &all),
            vec![Conflict {
                other: "b".into(),
                kind: ItemKind::Container,
                item: "proxy".into()
            }]
        );
        let of_b = conflicts_of(&b, &all);
        assert_eq!(of_b[0].other, "a");
        assert_eq!(
            of_b[0].to_string(),
            "policy \"a\" also injects container \"proxy\" with different content"
        );
    }

    #[test]
    fn identical_content_is_not_a_conflict() {
        let a = policy("a", None, |s| {
            s.template.containers = vec![container("proxy", "p:1")]
        });
        let b = policy("b", None, |s| {
            s.template.containers = vec![container("proxy", "p:1")]
        });
        assert!(conflicts_of(&a, [&b]).is_empty());
    }

    #[test]
    fn identical_templated_text_with_different_values_is_a_conflict() {
        let t = vec![container("proxy", "{{ values.image }}")];
        let a = policy("a", None, |s| {
            s.template.containers = t.clone();
            s.values.insert("image".into(), "p:1".into());
        });
        let b = policy("b", None, |s| {
            s.template.containers = t.clone();
            s.values.insert("image".into(), "p:2".into());
        });
        assert_eq!(conflicts_of(&a, [&b]).len(), 1);
    }

    #[test]
    fn an_init_container_and_a_container_of_the_same_name_clash() {
        let a = policy("a", None, |s| {
            s.template.init_containers = vec![container("x", "i:1")]
        });
        let b = policy("b", None, |s| {
            s.template.containers = vec![container("x", "i:1")]
        });
        let c = conflicts_of(&a, [&b]);
        assert_eq!(c[0].kind, ItemKind::InitContainer);
    }

    #[test]
    fn volumes_and_env_vars_conflict_by_name() {
        let a = policy("a", None, |s| {
            s.template.volumes = vec![Volume {
                name: "data".into(),
                ..Volume::default()
            }];
            s.template.env = vec![EnvVar {
                name: "MODE".into(),
                value: Some("x".into()),
                ..EnvVar::default()
            }];
        });
        let b = policy("b", None, |s| {
            s.template.volumes = vec![Volume {
                name: "data".into(),
                empty_dir: Some(Default::default()),
                ..Volume::default()
            }];
            s.template.env = vec![EnvVar {
                name: "MODE".into(),
                value: Some("y".into()),
                ..EnvVar::default()
            }];
        });
        let kinds: Vec<ItemKind> = conflicts_of(&a, [&b]).into_iter().map(|c| c.kind).collect();
        assert_eq!(kinds, vec![ItemKind::Volume, ItemKind::EnvVar]);
    }

    #[test]
    fn disjoint_namespace_selectors_never_conflict() {
        let a = policy("a", labels(&[("team", "a")]), |s| {
            s.template.containers = vec![container("p", "1")]
        });
        let b = policy("b", labels(&[("team", "b")]), |s| {
            s.template.containers = vec![container("p", "2")]
        });
        assert!(conflicts_of(&a, [&b]).is_empty());
    }

    #[test]
    fn disjoint_object_selectors_never_conflict() {
        let a = policy("a", None, |s| {
            s.object_selector = expr("tier", "In", &["web"]);
            s.template.containers = vec![container("p", "1")];
        });
        let b = policy("b", None, |s| {
            s.object_selector = expr("tier", "NotIn", &["web"]);
            s.template.containers = vec![container("p", "2")];
        });
        assert!(conflicts_of(&a, [&b]).is_empty());
    }

    #[test]
    fn a_paused_or_update_only_policy_injects_nothing_to_conflict_with() {
        let a = policy("a", None, |s| {
            s.template.containers = vec![container("p", "1")]
        });
        let paused = policy("b", None, |s| {
            s.paused = true;
            s.template.containers = vec![container("p", "2")];
        });
        let update = policy("c", None, |s| {
            s.operations = vec![Operation::Update];
            s.template.containers = vec![container("p", "3")];
        });
        assert!(conflicts_of(&a, [&paused, &update]).is_empty());
    }
}
