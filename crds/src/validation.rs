//! Checks an InjectionPolicy the way the API server does when it is applied, from the CRD this
//! crate generates ([`crd`](crate::crd)), so that an offline run (`splice inject`, `simulate`)
//! refuses exactly what `kubectl apply` would, with no rule written twice.
//!
//! Two parts, both read from the CRD's `openAPIV3Schema`:
//! - the structural schema (types, `required`, `enum`, size and range bounds, `nullable`,
//!   `x-kubernetes-list-type` uniqueness, unknown fields as strict field validation refuses them),
//!   walked here because `kube-cel` evaluates CEL rules only;
//! - the `x-kubernetes-validations` CEL rules, compiled and evaluated by `kube-cel`.
//!
//! As the API server does, nulls in non-nullable fields are dropped and schema defaults applied
//! first, and `status` is ignored (it is a subresource, never written with the object).
//! `metadata` is not the CRD's to check (the API server validates it for every kind).

use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;

use serde_json::{Map, Value};

/// One field of a policy that the API server would refuse, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Dotted path inside the object, with list indexes (`spec.template.containers[1].name`).
    pub field: String,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for Violation {}

/// Every violation the CRD finds in `object` (a whole InjectionPolicy: `apiVersion`, `kind`,
/// `metadata`, `spec`), in schema order; empty when the API server would accept it. CEL rules run
/// only on an object whose structure is sound, as their messages would mislead otherwise.
pub fn validate_policy(object: &Value) -> Vec<Violation> {
    let schema = match policy_schema() {
        Ok(schema) => schema,
        Err(message) => return vec![violation("", message.clone())],
    };
    let object = admitted(schema, object);
    let mut out = Vec::new();
    check(schema, &object, "", &mut out);
    if out.is_empty()
        && let Err(errors) = kube_cel::Validator::new().validate(schema, &object, None)
    {
        // A rule kube-cel cannot evaluate comes back as an error too: offline fails closed.
        out.extend(
            errors
                .into_iter()
                .map(|e| violation(e.field_path, e.message)),
        );
    }
    out
}

/// `object` as the API server validates and stores it: nulls dropped where the schema does not
/// allow them, schema defaults applied, `status` gone. The CLI reads policies through it so that
/// what the API server accepts (`timeoutSeconds: null`) reads the same offline.
pub fn as_admitted(object: &Value) -> Value {
    match policy_schema() {
        Ok(schema) => admitted(schema, object),
        Err(_) => object.clone(),
    }
}

fn admitted(schema: &Value, object: &Value) -> Value {
    let mut object = prune_nulls(schema, object);
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    kube_cel::apply_defaults(schema, &object)
}

/// The `openAPIV3Schema` of the served version of the generated CRD, as JSON.
pub fn policy_schema() -> Result<&'static Value, &'static String> {
    static SCHEMA: OnceLock<Result<Value, String>> = OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let crd = crate::crd();
            let schema = crd
                .spec
                .versions
                .into_iter()
                .find(|v| v.served)
                .and_then(|v| v.schema)
                .and_then(|s| s.open_api_v3_schema)
                .ok_or_else(|| "the generated CRD has no served schema".to_owned())?;
            serde_json::to_value(schema).map_err(|e| format!("the CRD schema does not render: {e}"))
        })
        .as_ref()
}

/// The schema keywords [`validate_policy`] enforces or deliberately passes over; a test keeps the
/// generated CRD within them, so a new keyword cannot go unchecked offline.
pub const KNOWN_KEYWORDS: &[&str] = &[
    // enforced by the walk below
    "type",
    "nullable",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "enum",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
    "format",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    // evaluated by kube-cel
    "x-kubernetes-validations",
    // applied before the walk
    "default",
    // documentation only
    "description",
    "title",
];

/// The string formats the walk understands (`int32`/`int64` bound nothing the API server checks).
pub const KNOWN_FORMATS: &[&str] = &["int32", "int64", "date-time"];

fn violation(field: impl Into<String>, message: impl Into<String>) -> Violation {
    Violation {
        field: field.into(),
        message: message.into(),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool) == Some(true)
}

/// The schema a member of an object follows: its property's, else `additionalProperties`'.
fn member_schema<'a>(schema: &'a Value, key: &str) -> Option<&'a Value> {
    schema
        .get("properties")
        .and_then(|p| p.get(key))
        .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()))
}

/// Drops object members that are null where the schema does not allow null, as the API server
/// prunes them before defaulting (so `timeoutSeconds: null` means the default).
fn prune_nulls(schema: &Value, value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter_map(|(k, v)| match member_schema(schema, k) {
                    Some(s) if v.is_null() && !flag(s, "nullable") => None,
                    Some(s) => Some((k.clone(), prune_nulls(s, v))),
                    None => Some((k.clone(), v.clone())),
                })
                .collect(),
        ),
        Value::Array(items) => match schema.get("items") {
            Some(s) => Value::Array(items.iter().map(|v| prune_nulls(s, v)).collect()),
            None => value.clone(),
        },
        other => other.clone(),
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn has_type(value: &Value, ty: &str) -> bool {
    match ty {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "number" => value.is_number(),
        // The API server takes a number without a fraction as an integer (`3.0`).
        "integer" => {
            value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => true,
    }
}

fn items(n: u64) -> String {
    if n == 1 {
        "1 item".to_owned()
    } else {
        format!("{n} items")
    }
}

/// A bound as the schema writes it (`30.0`), printed as a person would (`30`).
fn number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

fn check(schema: &Value, value: &Value, path: &str, out: &mut Vec<Violation>) {
    if value.is_null() {
        if !flag(schema, "nullable") {
            out.push(violation(path, "must not be null"));
        }
        return;
    }
    if flag(schema, "x-kubernetes-int-or-string") {
        if !(value.is_string() || has_type(value, "integer")) {
            out.push(violation(
                path,
                format!("must be an integer or a string, got {}", type_name(value)),
            ));
        }
        return;
    }
    if let Some(ty) = schema.get("type").and_then(Value::as_str)
        && !has_type(value, ty)
    {
        out.push(violation(
            path,
            format!("must be of type {ty}, got {}", type_name(value)),
        ));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let names: Vec<String> = allowed.iter().map(Value::to_string).collect();
        out.push(violation(
            path,
            format!(
                "unsupported value {value}: must be one of {}",
                names.join(", ")
            ),
        ));
    }
    match value {
        Value::String(s) => check_string(schema, s, path, out),
        Value::Number(n) => check_number(schema, n.as_f64().unwrap_or(0.0), path, out),
        Value::Array(list) => check_array(schema, list, path, out),
        Value::Object(map) => check_object(schema, map, path, out),
        Value::Null | Value::Bool(_) => {}
    }
}

fn check_string(schema: &Value, s: &str, path: &str, out: &mut Vec<Violation>) {
    // The API server counts characters, not bytes.
    let len = s.chars().count() as u64;
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
        && len > max
    {
        out.push(violation(
            path,
            format!("at most {max} characters, got {len}"),
        ));
    }
    if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
        && len < min
    {
        out.push(violation(
            path,
            format!("at least {min} characters, got {len}"),
        ));
    }
    if schema.get("format").and_then(Value::as_str) == Some("date-time") && !is_date_time(s) {
        out.push(violation(
            path,
            format!("{s:?} is not an RFC 3339 date-time"),
        ));
    }
}

fn is_date_time(s: &str) -> bool {
    chrono::DateTime::parse_from_rfc3339(s).is_ok()
        // The API server also takes a date-time without an offset.
        || chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f").is_ok()
}

fn check_number(schema: &Value, n: f64, path: &str, out: &mut Vec<Violation>) {
    let min = schema.get("minimum").and_then(Value::as_f64);
    let max = schema.get("maximum").and_then(Value::as_f64);
    let shown = number(n);
    match (min, max) {
        (Some(min), Some(max)) if n < min || n > max => out.push(violation(
            path,
            format!(
                "must be between {} and {}, got {shown}",
                number(min),
                number(max)
            ),
        )),
        (Some(min), None) if n < min => out.push(violation(
            path,
            format!("must be at least {}, got {shown}", number(min)),
        )),
        (None, Some(max)) if n > max => out.push(violation(
            path,
            format!("must be at most {}, got {shown}", number(max)),
        )),
        _ => {}
    }
}

fn check_array(schema: &Value, list: &[Value], path: &str, out: &mut Vec<Violation>) {
    let len = list.len() as u64;
    if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
        && len > max
    {
        out.push(violation(
            path,
            format!("at most {}, got {len}", items(max)),
        ));
    }
    if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
        && len < min
    {
        out.push(violation(
            path,
            format!("at least {}, got {len}", items(min)),
        ));
    }
    if let Some(item_schema) = schema.get("items") {
        for (i, item) in list.iter().enumerate() {
            check(item_schema, item, &format!("{path}[{i}]"), out);
        }
    }
    match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("map") => {
            let keys: Vec<&str> = schema
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|k| k.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            unique(list, path, out, |item| {
                let values: Vec<String> = keys
                    .iter()
                    .map(|k| item.get(k).map(Value::to_string).unwrap_or_default())
                    .collect();
                format!("{} {}", keys.join("/"), values.join("/"))
            });
        }
        Some("set") => unique(list, path, out, Value::to_string),
        _ => {}
    }
}

/// Refuses each item of `list` whose key (as `key` renders it) an earlier item has; the item is
/// the field, as the API server names it.
fn unique(list: &[Value], path: &str, out: &mut Vec<Violation>, key: impl Fn(&Value) -> String) {
    let mut seen: HashMap<String, usize> = HashMap::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let shown = key(item);
        if let Some(first) = seen.get(&shown) {
            out.push(violation(
                format!("{path}[{i}]"),
                format!("duplicate {shown} (also at {path}[{first}])"),
            ));
        } else {
            seen.insert(shown, i);
        }
    }
}

fn check_object(schema: &Value, map: &Map<String, Value>, path: &str, out: &mut Vec<Violation>) {
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    for (key, member) in map {
        // The API server adds these to every custom resource's schema (kube's derive leaves them
        // out) and checks them itself.
        if path.is_empty() && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        let field = join(path, key);
        match properties.and_then(|p| p.get(key)).or(additional) {
            Some(member_schema) => check(member_schema, member, &field, out),
            // Strict field validation (`kubectl apply`'s default) refuses what pruning would drop.
            None if properties.is_some()
                && !flag(schema, "x-kubernetes-preserve-unknown-fields") =>
            {
                out.push(violation(field, "unknown field"));
            }
            None => {}
        }
    }
    for required in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !map.contains_key(required) {
            out.push(violation(join(path, required), "required"));
        }
    }
    let len = map.len() as u64;
    if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
        && len > max
    {
        out.push(violation(path, format!("at most {max} entries, got {len}")));
    }
    if let Some(min) = schema.get("minProperties").and_then(Value::as_u64)
        && len < min
    {
        out.push(violation(
            path,
            format!("at least {min} entries, got {len}"),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(spec: Value) -> Value {
        json!({
            "apiVersion": "splice.dev/v1alpha1",
            "kind": "InjectionPolicy",
            "metadata": {"name": "p"},
            "spec": spec,
        })
    }

    fn first(spec: Value) -> Violation {
        validate_policy(&policy(spec))
            .into_iter()
            .next()
            .expect("refused")
    }

    #[test]
    fn a_range_is_reported_with_both_ends_and_the_value() {
        let v = first(json!({"timeoutSeconds": 45}));
        assert_eq!(
            v.to_string(),
            "spec.timeoutSeconds: must be between 1 and 30, got 45"
        );
    }

    #[test]
    fn a_list_longer_than_its_bound_names_the_bound_and_its_length() {
        let env: Vec<Value> = (0..=crate::MAX_INJECTED_ENV)
            .map(|i| json!({"name": format!("E{i}")}))
            .collect();
        let v = first(json!({"template": {"env": env}}));
        assert_eq!(
            v.to_string(),
            "spec.template.env: at most 128 items, got 129"
        );
    }

    #[test]
    fn a_duplicate_key_in_a_list_map_names_the_item_and_the_first_one() {
        let v = first(json!({"template": {"volumes": [{"name": "d"}, {"name": "d"}]}}));
        assert_eq!(
            v.to_string(),
            "spec.template.volumes[1]: duplicate name \"d\" (also at spec.template.volumes[0])"
        );
    }

    #[test]
    fn a_cel_rule_refuses_with_its_message_at_the_node_that_carries_it() {
        let v = first(json!({"operations": ["CREATE", "CREATE"]}));
        assert_eq!(v.to_string(), "spec.operations: operations must not repeat");
        let v = first(json!({"template": {
            "initContainers": [{"name": "x"}],
            "containers": [{"name": "x"}],
        }}));
        assert_eq!(
            v.to_string(),
            "spec.template: an injected init container and an injected container must not share a name"
        );
    }

    #[test]
    fn cel_rules_see_the_defaults_the_api_server_applies() {
        // operations defaults to [CREATE]: the rule runs on it and passes.
        assert!(validate_policy(&policy(json!({}))).is_empty());
    }

    #[test]
    fn a_wrong_type_is_reported_without_running_cel_rules_on_it() {
        let all = validate_policy(&policy(json!({"operations": "CREATE"})));
        assert_eq!(
            all,
            vec![violation(
                "spec.operations",
                "must be of type array, got string"
            )]
        );
    }

    #[test]
    fn more_than_64_values_are_refused() {
        let values: Map<String, Value> = (0..=crate::MAX_VALUES)
            .map(|i| (format!("k{i}"), json!("v")))
            .collect();
        assert_eq!(
            first(json!({"values": values})).to_string(),
            "spec.values: at most 64 entries, got 65"
        );
    }

    #[test]
    fn int_or_string_takes_either_and_nothing_else() {
        let probe = |port: Value| {
            validate_policy(&policy(json!({"template": {"containers": [
                {"name": "c", "readinessProbe": {"httpGet": {"port": port}}}
            ]}})))
        };
        assert!(probe(json!(8080)).is_empty());
        assert!(probe(json!("http")).is_empty());
        assert_eq!(
            probe(json!(true))[0].field,
            "spec.template.containers[0].readinessProbe.httpGet.port"
        );
    }
}
