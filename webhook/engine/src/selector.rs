//! Kubernetes LabelSelector semantics, the one evaluation Splice has: the engine decides
//! selectors itself offline (no API server there) and for shared entries, and the controller
//! reads budgets' and policies' selectors with the same type.
//! Written here: neither k8s-openapi nor kube evaluates a LabelSelector, and the rules (operators,
//! value-list constraints) are a page.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

/// What one requirement asks of a label's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    In(Vec<String>),
    /// Also selects objects without the label, as in Kubernetes.
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    /// An operator Kubernetes does not know (only in a selector [`Selector::read`] took as it
    /// came): selects nothing.
    Unknown(String),
}

/// One requirement on one label; `matchLabels` entries are `In` with one value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub op: Op,
}

impl Requirement {
    fn of(expr: &LabelSelectorRequirement) -> Requirement {
        let values = expr.values.clone().unwrap_or_default();
        let op = match expr.operator.as_str() {
            "In" => Op::In(values),
            "NotIn" => Op::NotIn(values),
            "Exists" => Op::Exists,
            "DoesNotExist" => Op::DoesNotExist,
            other => Op::Unknown(other.to_owned()),
        };
        Requirement {
            key: expr.key.clone(),
            op,
        }
    }
}

/// A label selector, the one type every reader of selectors in Splice evaluates (the engine, the
/// availability guard, conflict detection, the probe's verdict). No requirements selects
/// everything, like `{}` and an absent selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

/// Where a selector is wrong (relative to the selector) and why.
#[derive(Debug)]
pub struct SelectorError {
    pub field: String,
    pub message: String,
}

impl Selector {
    /// The selector as it came, unchecked: for selectors the API server already stored (budgets,
    /// policies). An unknown operator selects nothing; `In` with no values selects nothing and
    /// `NotIn` with none everything, as their definitions say.
    pub fn read(selector: Option<&LabelSelector>) -> Self {
        let Some(selector) = selector else {
            return Self::default();
        };
        let labels = selector
            .match_labels
            .iter()
            .flatten()
            .map(|(key, value)| Requirement {
                key: key.clone(),
                op: Op::In(vec![value.clone()]),
            });
        let expressions = selector
            .match_expressions
            .iter()
            .flatten()
            .map(Requirement::of);
        Self {
            requirements: labels.chain(expressions).collect(),
        }
    }

    /// The selector, refused where Kubernetes would refuse it: a key that is no qualified name,
    /// an unknown operator, values where none are allowed or none where some are required.
    pub fn compile(selector: Option<&LabelSelector>) -> Result<Self, SelectorError> {
        let Some(selector) = selector else {
            return Ok(Self::default());
        };
        for key in selector.match_labels.iter().flatten().map(|(k, _)| k) {
            check_key(key).map_err(|message| SelectorError {
                field: format!("matchLabels[{key:?}]"),
                message,
            })?;
        }
        for (i, expr) in selector.match_expressions.iter().flatten().enumerate() {
            let field = |f: &str| format!("matchExpressions[{i}]{f}");
            check_key(&expr.key).map_err(|message| SelectorError {
                field: field(".key"),
                message,
            })?;
            let has_values = expr.values.as_ref().is_some_and(|v| !v.is_empty());
            let (field, message) = match Requirement::of(expr).op {
                Op::In(_) | Op::NotIn(_) if !has_values => (
                    field(".values"),
                    format!("operator {} needs at least one value", expr.operator),
                ),
                Op::Exists | Op::DoesNotExist if has_values => (
                    field(".values"),
                    format!("operator {} takes no values", expr.operator),
                ),
                Op::Unknown(other) => (
                    field(".operator"),
                    format!(
                        "unknown operator {other:?} (expected In, NotIn, Exists or DoesNotExist)"
                    ),
                ),
                _ => continue,
            };
            return Err(SelectorError { field, message });
        }
        Ok(Self::read(Some(selector)))
    }

    /// Every requirement, `matchLabels` first.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether some set of labels matches. Keys are independent and values unbounded, so it is
    /// decided key by key: the `In` sets must leave a value outside every `NotIn`, and a label
    /// cannot both exist and not.
    pub fn satisfiable(&self) -> bool {
        let mut keys: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
        for r in &self.requirements {
            keys.entry(r.key.as_str()).or_default().push(&r.op);
        }
        keys.values().all(|ops| {
            let mut allowed: Option<Vec<&String>> = None;
            let (mut exists, mut absent) = (false, false);
            for op in ops {
                match op {
                    Op::In(values) => {
                        exists = true;
                        allowed = Some(match allowed {
                            None => values.iter().collect(),
                            Some(a) => a.into_iter().filter(|v| values.contains(v)).collect(),
                        });
                    }
                    Op::Exists => exists = true,
                    Op::DoesNotExist => absent = true,
                    Op::NotIn(_) => {}
                    Op::Unknown(_) => return false,
                }
            }
            let excluded = |v: &&String| {
                ops.iter()
                    .any(|op| matches!(op, Op::NotIn(values) if values.contains(v)))
            };
            match allowed {
                Some(values) => !absent && values.iter().any(|v| !excluded(v)),
                None => !(exists && absent),
            }
        })
    }

    /// True when every requirement holds for the labels `get` looks up.
    pub fn matches<'l>(&self, get: impl Fn(&str) -> Option<&'l str>) -> bool {
        self.requirements.iter().all(|r| {
            let value = get(&r.key);
            match &r.op {
                Op::In(values) => value.is_some_and(|v| values.iter().any(|x| x == v)),
                Op::NotIn(values) => value.is_none_or(|v| values.iter().all(|x| x != v)),
                Op::Exists => value.is_some(),
                Op::DoesNotExist => value.is_none(),
                Op::Unknown(_) => false,
            }
        })
    }
}

fn check_key(key: &str) -> Result<(), String> {
    super::validate::qualified_name(key).map_err(|e| format!("invalid label key {key:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn req(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: if values.is_empty() {
                None
            } else {
                Some(values.iter().map(|v| v.to_string()).collect())
            },
        }
    }

    fn matches(sel: &LabelSelector, labels: &[(&str, &str)]) -> bool {
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        Selector::compile(Some(sel))
            .unwrap()
            .matches(|k| labels.get(k).copied())
    }

    #[test]
    fn an_absent_or_empty_selector_selects_everything() {
        assert!(Selector::compile(None).unwrap().matches(|_| None));
        assert!(matches(&LabelSelector::default(), &[]));
    }

    #[test]
    fn match_labels_and_expressions_are_all_required() {
        let sel = LabelSelector {
            match_labels: Some([("app".to_string(), "web".to_string())].into()),
            match_expressions: Some(vec![
                req("tier", "In", &["a", "b"]),
                req("legacy", "DoesNotExist", &[]),
                req("track", "NotIn", &["canary"]),
                req("team", "Exists", &[]),
            ]),
        };
        assert!(matches(
            &sel,
            &[("app", "web"), ("tier", "a"), ("team", "x")]
        ));
        assert!(matches(
            &sel,
            &[
                ("app", "web"),
                ("tier", "b"),
                ("team", ""),
                ("track", "stable")
            ]
        ));
        assert!(!matches(
            &sel,
            &[("app", "web"), ("tier", "c"), ("team", "x")]
        ));
        assert!(!matches(
            &sel,
            &[("app", "api"), ("tier", "a"), ("team", "x")]
        ));
        assert!(!matches(
            &sel,
            &[
                ("app", "web"),
                ("tier", "a"),
                ("team", "x"),
                ("legacy", "1")
            ]
        ));
        assert!(!matches(
            &sel,
            &[
                ("app", "web"),
                ("tier", "a"),
                ("team", "x"),
                ("track", "canary")
            ]
        ));
        assert!(!matches(&sel, &[("app", "web"), ("tier", "a")]));
    }

    #[test]
    fn a_selector_read_as_stored_selects_nothing_by_an_unknown_operator() {
        let sel = LabelSelector {
            match_expressions: Some(vec![req("a", "Matches", &["x"])]),
            ..Default::default()
        };
        assert!(!Selector::read(Some(&sel)).matches(|_| Some("x")));
        let empty_in = LabelSelector {
            match_expressions: Some(vec![req("a", "In", &[])]),
            ..Default::default()
        };
        assert!(!Selector::read(Some(&empty_in)).matches(|_| Some("x")));
        assert!(Selector::read(None).matches(|_| None));
    }

    #[test]
    fn malformed_expressions_are_rejected_with_their_field() {
        let bad = |r| LabelSelector {
            match_expressions: Some(vec![r]),
            ..Default::default()
        };
        let err = Selector::compile(Some(&bad(req("a", "In", &[])))).unwrap_err();
        assert_eq!(err.field, "matchExpressions[0].values");
        let err = Selector::compile(Some(&bad(req("a", "Exists", &["x"])))).unwrap_err();
        assert_eq!(err.field, "matchExpressions[0].values");
        let err = Selector::compile(Some(&bad(req("a", "Matches", &["x"])))).unwrap_err();
        assert_eq!(err.field, "matchExpressions[0].operator");
        let err = Selector::compile(Some(&bad(req("", "Exists", &[])))).unwrap_err();
        assert_eq!(err.field, "matchExpressions[0].key");
    }
}
