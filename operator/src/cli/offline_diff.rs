//! Comparing pods the way Kubernetes reads them, for `simulate --all-orders`.
//!
//! Two pods that differ only in the order of their containers, volumes or env vars are the same pod
//! to the kubelet, so lists of named items are compared as maps keyed by name (the CRD's
//! `x-kubernetes-list-map-keys`), and differences are reported on logical paths such as
//! `spec.containers[app].env[LOG_LEVEL].value` rather than on array indexes that shift from one
//! order to the next. Init containers are the exception: they run one after the other, so their
//! order is part of the result.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;
use splice_crds::STATUS_ANNOTATION;

/// Lists whose items are identified by a key field, by the name of the field holding the list.
fn list_key(field: &str) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        _ => None,
    }
}

/// Lists whose order changes what the pod does.
fn order_matters(field: &str) -> bool {
    field == "initContainers"
}

/// A JSON value in the form it is compared in.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Norm {
    Leaf(Value),
    List(Vec<Norm>),
    Map(BTreeMap<String, Norm>),
    /// A list of named items; `order` is kept only where order matters.
    Keyed {
        order: Option<Vec<String>>,
        items: BTreeMap<String, Norm>,
    },
    /// A string holding JSON (Splice's status annotation), compared by content.
    Embedded(Box<Norm>),
}

pub(crate) fn normalize(value: &Value) -> Norm {
    normalize_at(value, "", false)
}

fn normalize_at(value: &Value, field: &str, in_annotations: bool) -> Norm {
    match value {
        Value::Object(map) => Norm::Map(
            map.iter()
                .map(|(k, v)| {
                    let n = if in_annotations && k == STATUS_ANNOTATION {
                        embedded(v)
                    } else {
                        normalize_at(v, k, k == "annotations")
                    };
                    (k.clone(), n)
                })
                .collect(),
        ),
        Value::Array(items) => {
            if let Some(key) = list_key(field)
                && let Some(keyed) = keyed(items, key, field)
            {
                return keyed;
            }
            Norm::List(items.iter().map(|v| normalize_at(v, "", false)).collect())
        }
        other => Norm::Leaf(other.clone()),
    }
}

fn embedded(value: &Value) -> Norm {
    match value.as_str().map(serde_json::from_str::<Value>) {
        Some(Ok(inner @ (Value::Object(_) | Value::Array(_)))) => {
            Norm::Embedded(Box::new(normalize_at(&inner, "", false)))
        }
        _ => Norm::Leaf(value.clone()),
    }
}

fn keyed(items: &[Value], key: &str, field: &str) -> Option<Norm> {
    let mut map = BTreeMap::new();
    let mut order = Vec::with_capacity(items.len());
    for item in items {
        let name = item.get(key)?.as_str()?;
        if map
            .insert(name.to_owned(), normalize_at(item, "", false))
            .is_some()
        {
            return None;
        }
        order.push(name.to_owned());
    }
    Some(Norm::Keyed {
        order: order_matters(field).then_some(order),
        items: map,
    })
}

impl Norm {
    /// Back to JSON, for display and for a canonical text to group equal results by.
    pub fn to_value(&self) -> Value {
        match self {
            Norm::Leaf(v) => v.clone(),
            Norm::List(items) => Value::Array(items.iter().map(Norm::to_value).collect()),
            Norm::Map(map) => {
                Value::Object(map.iter().map(|(k, v)| (k.clone(), v.to_value())).collect())
            }
            Norm::Keyed { order, items } => {
                let names: Vec<&String> = match order {
                    Some(order) => order.iter().collect(),
                    None => items.keys().collect(),
                };
                Value::Array(
                    names
                        .into_iter()
                        .filter_map(|n| items.get(n))
                        .map(Norm::to_value)
                        .collect(),
                )
            }
            Norm::Embedded(inner) => inner.to_value(),
        }
    }

    /// A text equal for equal values and different otherwise.
    pub fn canonical(&self) -> String {
        match self {
            // Maps are BTreeMaps and keyed lists are in key (or significant) order, so plain
            // serialization is canonical. Embedded JSON is tagged so it cannot collide with a
            // structure of the same shape.
            Norm::Embedded(inner) => format!("E{}", inner.canonical()),
            Norm::Map(map) => {
                let parts: Vec<String> = map
                    .iter()
                    .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), v.canonical()))
                    .collect();
                format!("{{{}}}", parts.join(","))
            }
            Norm::List(items) => {
                let parts: Vec<String> = items.iter().map(Norm::canonical).collect();
                format!("[{}]", parts.join(","))
            }
            Norm::Keyed { order, items } => {
                let parts: Vec<String> = items
                    .iter()
                    .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), v.canonical()))
                    .collect();
                let order = order.as_ref().map(|o| o.join("\u{0}")).unwrap_or_default();
                format!("K{}{{{}}}", Value::String(order), parts.join(","))
            }
            Norm::Leaf(v) => v.to_string(),
        }
    }

    /// The value at `path`, looking through embedded JSON.
    pub fn get(&self, path: &[Seg]) -> Option<&Norm> {
        let Some((first, rest)) = path.split_first() else {
            return Some(self);
        };
        let next = match (self, first) {
            (Norm::Embedded(inner), _) => return inner.get(path),
            (Norm::Map(map), Seg::Field(k)) => map.get(k),
            (Norm::Keyed { items, .. }, Seg::Key(k)) => items.get(k),
            (Norm::List(items), Seg::Index(i)) => items.get(*i),
            _ => None,
        }?;
        next.get(rest)
    }
}

/// One step of a logical path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Seg {
    Field(String),
    /// An item of a keyed list, by its key.
    Key(String),
    Index(usize),
    /// The order of a list whose order matters.
    Order,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct LogicalPath(pub Vec<Seg>);

impl LogicalPath {
    fn child(&self, seg: Seg) -> LogicalPath {
        let mut segs = self.0.clone();
        segs.push(seg);
        LogicalPath(segs)
    }

    /// True when one path contains the other: a change at either touches the other.
    /// An order finding overlaps whatever touches the list's items.
    pub fn overlaps(&self, other: &LogicalPath) -> bool {
        let (a, b) = (self.value_path(), other.value_path());
        let n = a.len().min(b.len());
        a[..n] == b[..n]
    }

    /// The path without a trailing [`Seg::Order`], for looking the value up.
    pub fn value_path(&self) -> &[Seg] {
        match self.0.split_last() {
            Some((Seg::Order, rest)) => rest,
            _ => &self.0,
        }
    }

    pub fn is_order(&self) -> bool {
        matches!(self.0.last(), Some(Seg::Order))
    }
}

impl fmt::Display for LogicalPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(the whole object)");
        }
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Field(name) if is_plain(name) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(name)?;
                }
                Seg::Field(name) => write!(f, "[{}]", Value::String(name.clone()))?,
                Seg::Key(key) => write!(f, "[{key}]")?,
                Seg::Index(index) => write!(f, "[{index}]")?,
                Seg::Order => f.write_str(" (order)")?,
            }
        }
        Ok(())
    }
}

fn is_plain(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// How a missing side is treated.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Depth {
    /// Stop at the shallowest differing path (`env[LOG_LEVEL]` added): for reports.
    Shallow,
    /// Go down to every leaf of what was added or removed: for finding who touched what, so that
    /// adding `env` with one variable does not look like touching every variable in it.
    Leaves,
}

/// The logical paths where `a` and `b` differ.
pub(crate) fn diff(a: &Norm, b: &Norm, depth: Depth) -> Vec<LogicalPath> {
    let mut out = Vec::new();
    diff_at(Some(a), Some(b), &LogicalPath::default(), depth, &mut out);
    out
}

fn diff_at(
    a: Option<&Norm>,
    b: Option<&Norm>,
    path: &LogicalPath,
    depth: Depth,
    out: &mut Vec<LogicalPath>,
) {
    if a == b {
        return;
    }
    match (a, b) {
        (Some(Norm::Embedded(x)), Some(Norm::Embedded(y))) => {
            diff_at(Some(x), Some(y), path, depth, out)
        }
        (Some(Norm::Map(x)), Some(Norm::Map(y))) => {
            for key in union(x.keys(), y.keys()) {
                diff_at(
                    x.get(key),
                    y.get(key),
                    &path.child(Seg::Field(key.clone())),
                    depth,
                    out,
                );
            }
        }
        (
            Some(Norm::Keyed {
                order: ox,
                items: x,
            }),
            Some(Norm::Keyed {
                order: oy,
                items: y,
            }),
        ) => {
            for key in union(x.keys(), y.keys()) {
                diff_at(
                    x.get(key),
                    y.get(key),
                    &path.child(Seg::Key(key.clone())),
                    depth,
                    out,
                );
            }
            // Order is only a finding of its own when the same items are there in both.
            if ox != oy && x.keys().eq(y.keys()) {
                out.push(path.child(Seg::Order));
            }
        }
        (Some(Norm::List(x)), Some(Norm::List(y))) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                diff_at(Some(p), Some(q), &path.child(Seg::Index(i)), depth, out);
            }
        }
        (Some(present), None) | (None, Some(present)) if depth == Depth::Leaves => {
            leaves(present, path, out);
        }
        _ => out.push(path.clone()),
    }
}

fn leaves(n: &Norm, path: &LogicalPath, out: &mut Vec<LogicalPath>) {
    match n {
        Norm::Map(map) if !map.is_empty() => {
            for (k, v) in map {
                leaves(v, &path.child(Seg::Field(k.clone())), out);
            }
        }
        Norm::Keyed { items, .. } if !items.is_empty() => {
            for (k, v) in items {
                leaves(v, &path.child(Seg::Key(k.clone())), out);
            }
        }
        Norm::Embedded(inner) => leaves(inner, path, out),
        _ => out.push(path.clone()),
    }
}

fn union<'a>(
    a: impl Iterator<Item = &'a String>,
    b: impl Iterator<Item = &'a String>,
) -> std::collections::BTreeSet<&'a String> {
    a.chain(b).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn paths(a: &Value, b: &Value, depth: Depth) -> Vec<String> {
        diff(&normalize(a), &normalize(b), depth)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn containers_in_another_order_are_the_same_pod() {
        let a = json!({"spec": {"containers": [{"name": "app"}, {"name": "a"}, {"name": "b"}]}});
        let b = json!({"spec": {"containers": [{"name": "app"}, {"name": "b"}, {"name": "a"}]}});
        assert_eq!(normalize(&a), normalize(&b));
        assert_eq!(normalize(&a).canonical(), normalize(&b).canonical());
    }

    #[test]
    fn init_containers_in_another_order_are_a_different_pod() {
        let a = json!({"spec": {"initContainers": [{"name": "a"}, {"name": "b"}]}});
        let b = json!({"spec": {"initContainers": [{"name": "b"}, {"name": "a"}]}});
        assert_ne!(normalize(&a).canonical(), normalize(&b).canonical());
        assert_eq!(
            paths(&a, &b, Depth::Shallow),
            vec!["spec.initContainers (order)"]
        );
    }

    #[test]
    fn a_differing_env_value_is_reported_on_its_logical_path() {
        let a = json!({"spec": {"containers": [{"name": "app", "env": [{"name": "LOG_LEVEL", "value": "debug"}]}]}});
        let b = json!({"spec": {"containers": [{"name": "app", "env": [{"name": "LOG_LEVEL", "value": "info"}]}]}});
        assert_eq!(
            paths(&a, &b, Depth::Shallow),
            vec!["spec.containers[app].env[LOG_LEVEL].value"]
        );
    }

    #[test]
    fn an_added_item_is_one_path_in_reports_and_its_leaves_for_attribution() {
        let a = json!({"spec": {"containers": [{"name": "app"}]}});
        let b = json!({"spec": {"containers": [{"name": "app", "env": [{"name": "X", "value": "1"}]}]}});
        assert_eq!(
            paths(&a, &b, Depth::Shallow),
            vec!["spec.containers[app].env"]
        );
        assert_eq!(
            paths(&a, &b, Depth::Leaves),
            vec![
                "spec.containers[app].env[X].name",
                "spec.containers[app].env[X].value"
            ]
        );
    }

    #[test]
    fn annotation_keys_with_dots_and_slashes_are_quoted() {
        let a = json!({"metadata": {"annotations": {"example.com/x": "1"}}});
        let b = json!({"metadata": {"annotations": {"example.com/x": "2"}}});
        assert_eq!(
            paths(&a, &b, Depth::Shallow),
            vec![r#"metadata.annotations["example.com/x"]"#]
        );
    }

    #[test]
    fn the_status_annotation_is_compared_by_its_json_content() {
        let a = json!({"metadata": {"annotations": {STATUS_ANNOTATION: r#"{"a":{"h":"1"},"b":{"h":"2"}}"#}}});
        let b = json!({"metadata": {"annotations": {STATUS_ANNOTATION: r#"{"b":{"h":"2"},"a":{"h":"1"}}"#}}});
        assert_eq!(normalize(&a).canonical(), normalize(&b).canonical());
        let c = json!({"metadata": {"annotations": {STATUS_ANNOTATION: r#"{"a":{"h":"3"},"b":{"h":"2"}}"#}}});
        assert_eq!(
            paths(&a, &c, Depth::Shallow),
            vec![r#"metadata.annotations["splice.dev/status"].a.h"#]
        );
    }

    #[test]
    fn lists_without_unique_keys_are_compared_by_position() {
        let a = json!({"spec": {"containers": [{"name": "x"}, {"name": "x", "image": "1"}]}});
        let b = json!({"spec": {"containers": [{"name": "x"}, {"name": "x", "image": "2"}]}});
        assert_eq!(
            paths(&a, &b, Depth::Shallow),
            vec!["spec.containers[1].image"]
        );
    }

    #[test]
    fn overlapping_paths_contain_one_another() {
        let p = |segs: &[&str]| LogicalPath(segs.iter().map(|s| Seg::Field((*s).into())).collect());
        assert!(p(&["spec", "env"]).overlaps(&p(&["spec", "env", "X"])));
        assert!(p(&["spec", "env", "X"]).overlaps(&p(&["spec", "env"])));
        assert!(!p(&["spec", "env", "X"]).overlaps(&p(&["spec", "env", "Y"])));
        let mut order = p(&["spec", "initContainers"]);
        order.0.push(Seg::Order);
        assert!(order.overlaps(&p(&["spec", "initContainers", "a", "name"])));
    }

    #[test]
    fn values_are_found_by_logical_path() {
        let n = normalize(&json!({"spec": {"containers": [{"name": "app", "image": "i"}]}}));
        let path = [
            Seg::Field("spec".into()),
            Seg::Field("containers".into()),
            Seg::Key("app".into()),
            Seg::Field("image".into()),
        ];
        assert_eq!(n.get(&path), Some(&Norm::Leaf(json!("i"))));
        assert_eq!(n.get(&path[..1]).map(|_| ()), Some(()));
        assert_eq!(n.get(&[Seg::Field("nope".into())]), None);
    }
}
