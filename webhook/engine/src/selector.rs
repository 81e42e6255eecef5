//! Kubernetes LabelSelector semantics, evaluated by the engine itself: offline there is no API
//! server to do it, and online it keeps a misconfigured webhook from injecting the wrong pods.
//! Written here: neither k8s-openapi nor kube evaluates a LabelSelector, and the rules (operators,
//! value-list constraints) are a page.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

/// A validated selector. No requirements selects everything, like `{}` and an absent selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Selector {
    requirements: Vec<Requirement>,
}

/// Where a selector is wrong (relative to the selector) and why.
#[derive(Debug)]
pub(crate) struct SelectorError {
    pub field: String,
    pub message: String,
}

impl Selector {
    pub fn compile(selector: Option<&LabelSelector>) -> Result<Self, SelectorError> {
        let Some(selector) = selector else {
            return Ok(Self::default());
        };
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            check_key(key).map_err(|message| SelectorError {
                field: format!("matchLabels[{key:?}]"),
                message,
            })?;
            requirements.push(Requirement {
                key: key.clone(),
                op: Op::In(vec![value.clone()]),
            });
        }
        for (i, expr) in selector.match_expressions.iter().flatten().enumerate() {
            let field = |f: &str| format!("matchExpressions[{i}]{f}");
            check_key(&expr.key).map_err(|message| SelectorError {
                field: field(".key"),
                message,
            })?;
            let values = expr.values.clone().unwrap_or_default();
            let op = match expr.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(SelectorError {
                        field: field(".values"),
                        message: format!("operator {} needs at least one value", expr.operator),
                    });
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(SelectorError {
                        field: field(".values"),
                        message: format!("operator {} takes no values", expr.operator),
                    });
                }
                "In" => Op::In(values),
                "NotIn" => Op::NotIn(values),
                "Exists" => Op::Exists,
                "DoesNotExist" => Op::DoesNotExist,
                other => {
                    return Err(SelectorError {
                        field: field(".operator"),
                        message: format!(
                            "unknown operator {other:?} (expected In, NotIn, Exists or DoesNotExist)"
                        ),
                    });
                }
            };
            requirements.push(Requirement {
                key: expr.key.clone(),
                op,
            });
        }
        Ok(Self { requirements })
    }

    /// True when every requirement holds for the labels `get` looks up.
    pub fn matches<'l>(&self, get: impl Fn(&str) -> Option<&'l str>) -> bool {
        self.requirements.iter().all(|r| {
            let value = get(&r.key);
            match &r.op {
                Op::In(values) => value.is_some_and(|v| values.iter().any(|x| x == v)),
                // NotIn also selects objects without the label, as in Kubernetes.
                Op::NotIn(values) => value.is_none_or(|v| values.iter().all(|x| x != v)),
                Op::Exists => value.is_some(),
                Op::DoesNotExist => value.is_none(),
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
