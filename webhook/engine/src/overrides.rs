//! `spec.overrides`: values a workload sets through an annotation on its pod or its namespace,
//! within the type and rule its policy declares.
//!
//! One resolution for the webhook, `splice inject` and the simulator: [`Overrides::compile`]
//! checks the declarations (at apply, and in every compile), [`Overrides::resolve`] reads one
//! pod's and its namespace's annotations and returns each value with where it came from, or the
//! refusal of the pod. Rules are CEL with the Kubernetes extension functions (`kube-cel`), so a
//! rule reads as it would in a CRD or a ValidatingAdmissionPolicy.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::provenance::OverrideRecord;
use kube_cel::cel::common::ast::{EntryExpr, Expr, LiteralValue};
use kube_cel::cel::{self, Program};
use kube_cel::{KubeCelExt, compile_schema, estimate_rule_cost};
use minijinja::Value as JValue;
use sha2::{Digest, Sha256};
use splice_crds::{
    InjectionPolicySpec, MAX_OVERRIDE_VALUE_BYTES, Override, OverrideSource, OverrideType,
};

/// Where an override's value came from, in precedence order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Origin {
    Pod,
    Namespace,
    Default,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Pod => "pod",
            Origin::Namespace => "namespace",
            Origin::Default => "default",
        }
    }
}

/// One override's value for one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen {
    pub name: String,
    pub annotation: String,
    pub value: String,
    pub origin: Origin,
}

impl Chosen {
    /// The digest `splice.dev/status` records for the value: 16 hex digits of its SHA-256.
    pub fn digest(&self) -> String {
        digest(&self.value)
    }
}

/// 16 hex digits of the SHA-256 of `value`, as `splice.dev/status` records an override's value.
pub fn digest(value: &str) -> String {
    crate::values_from::hex(&Sha256::digest(value.as_bytes())[..8])
}

/// What a pod gets: every declared override's value, and the namespace annotations that were
/// set but refused (their default was used instead; the policy reports them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    pub values: Vec<Chosen>,
    pub namespace_refusals: Vec<Refusal>,
}

impl Resolved {
    /// On a resolution from the namespace alone ([`Overrides::from_namespace`]): the first
    /// override whose value a pod recorded (`splice.dev/status`) is no longer this one. A value
    /// the pod set itself stays the pod's.
    pub fn drifted(&self, recorded: Option<&BTreeMap<String, OverrideRecord>>) -> Option<&str> {
        self.values.iter().find_map(|now| {
            let outdated = match recorded.and_then(|r| r.get(&now.name)) {
                Some(r) if r.from == Origin::Pod.as_str() => false,
                Some(r) => r.from != now.origin.as_str() || r.sha256 != now.digest(),
                None => true,
            };
            outdated.then_some(now.name.as_str())
        })
    }

    /// The template context: `overrides.<name>` as the typed value.
    pub(crate) fn context(&self, declared: &Overrides) -> JValue {
        let map: BTreeMap<&str, JValue> = self
            .values
            .iter()
            .zip(&declared.items)
            .map(|(c, d)| (c.name.as_str(), typed(d.ty, &c.value)))
            .collect();
        JValue::from_serialize(&map)
    }
}

/// The value as templates see it (it has already been checked against its type).
fn typed(ty: OverrideType, text: &str) -> JValue {
    match ty {
        OverrideType::Integer => text
            .parse::<i64>()
            .map_or_else(|_| JValue::from(text), JValue::from),
        OverrideType::Boolean => JValue::from(text == "true"),
        OverrideType::String | OverrideType::Quantity => JValue::from(text),
    }
}

/// A value an annotation set that its override does not accept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub annotation: String,
    /// Where the annotation is: `pod`, or `namespace NAME`.
    pub on: String,
    /// The value, shortened to 128 bytes for the message.
    pub value: String,
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "annotation {}={:?} on the {}: {}",
            self.annotation, self.value, self.on, self.reason
        )
    }
}

/// The longest part of a refused value a message quotes.
const QUOTED: usize = 128;

fn quoted(value: &str) -> String {
    if value.len() <= QUOTED {
        return value.to_owned();
    }
    let mut end = QUOTED;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &value[..end], value.len())
}

/// What a rule may cost, estimated over the longest value (`kube-cel`'s estimate, against the
/// API server's per-expression budget).
const RULE_SCHEMA_MAX_LENGTH: usize = MAX_OVERRIDE_VALUE_BYTES;

/// A policy's overrides, compiled.
#[derive(Clone, Default)]
pub struct Overrides {
    items: Vec<Declared>,
}

#[derive(Clone)]
struct Declared {
    name: String,
    annotation: String,
    ty: OverrideType,
    default: String,
    rule: Option<(String, Arc<Program>)>,
    message: Option<String>,
    pod: bool,
    namespace: bool,
    privileged: bool,
    /// A privileged override's rule bounds it to these values.
    allowed: Vec<String>,
}

impl fmt::Debug for Overrides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.items.iter().map(|d| &d.name))
            .finish()
    }
}

/// Why a declaration is refused: the field (`spec.overrides[0].rule`) and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeclarationError {
    pub field: String,
    pub message: String,
}

impl Overrides {
    /// Checks and compiles `spec.overrides`: unique names and annotations, label-style keys,
    /// rules that compile, read only `self`, stay within the cost budget and return a boolean,
    /// defaults of the declared type that pass the rule, and privileged overrides bounded to an
    /// enumerated set.
    pub fn compile(spec: &InjectionPolicySpec) -> Result<Self, DeclarationError> {
        let mut items: Vec<Declared> = Vec::with_capacity(spec.overrides.len());
        for (i, o) in spec.overrides.iter().enumerate() {
            let d = declare(i, o)?;
            let field = |f: &str| format!("spec.overrides[{i}].{f}");
            if items.iter().any(|e| e.name == d.name) {
                return Err(DeclarationError {
                    field: field("name"),
                    message: format!("override {:?} is declared twice", d.name),
                });
            }
            if items.iter().any(|e| e.annotation == d.annotation) {
                return Err(DeclarationError {
                    field: field("annotation"),
                    message: format!("annotation {:?} is read by two overrides", d.annotation),
                });
            }
            items.push(d);
        }
        Ok(Overrides { items })
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The declared names, in declaration order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.items.iter().map(|d| d.name.as_str())
    }

    /// Whether `name` is declared, and marked privileged.
    pub(crate) fn lookup(&self, name: &str) -> Option<bool> {
        self.items
            .iter()
            .find(|d| d.name == name)
            .map(|d| d.privileged)
    }

    /// `text` as templates see override `name`'s value (typed by its declaration).
    pub(crate) fn typed(&self, name: &str, text: &str) -> JValue {
        match self.items.iter().find(|d| d.name == name) {
            Some(d) => typed(d.ty, text),
            None => JValue::from(text),
        }
    }

    /// The values a privileged override's rule allows (empty for others).
    pub fn allowed(&self, name: &str) -> &[String] {
        self.items
            .iter()
            .find(|d| d.name == name)
            .map_or(&[], |d| &d.allowed)
    }

    /// The first override whose value, recorded on a pod in `splice.dev/status`, is no longer
    /// what the pod's namespace gives: a value the pod set itself stays the pod's, but one taken
    /// from the namespace or the default is outdated when the namespace's annotation (or the
    /// default) changed since. `None`: the pod is current as far as overrides go.
    pub fn drifted<'s>(
        &'s self,
        recorded: Option<&BTreeMap<String, OverrideRecord>>,
        namespace_name: &str,
        namespace: &BTreeMap<String, String>,
    ) -> Option<&'s str> {
        let now = self.from_namespace(namespace_name, namespace)?;
        let name = now.drifted(recorded)?;
        self.names().find(|n| *n == name)
    }

    /// What a pod that sets none of the annotations gets in this namespace: the values its pods
    /// take from it or the defaults. Callers judging many pods resolve it once per namespace.
    /// `None` without overrides.
    pub fn from_namespace(
        &self,
        namespace_name: &str,
        namespace: &BTreeMap<String, String>,
    ) -> Option<Resolved> {
        if self.items.is_empty() {
            return None;
        }
        self.resolve(|_| None::<&str>, namespace_name, namespace)
            .ok()
    }

    /// What the values a pod in this namespace takes from it (or the defaults) come to: 8 hex
    /// digits, `None` without overrides. A rollout restart records it, so a workload restarted
    /// for one namespace value is restarted again for the next.
    pub fn namespace_mark(
        &self,
        namespace_name: &str,
        namespace: &BTreeMap<String, String>,
    ) -> Option<String> {
        let now = self.from_namespace(namespace_name, namespace)?;
        let joined: String = now
            .values
            .iter()
            .map(|c| format!("{}={}:{};", c.name, c.origin.as_str(), c.digest()))
            .collect();
        Some(digest(&joined)[..8].to_owned())
    }

    /// Each override's value for a pod with `pod` annotations in a namespace with `namespace`
    /// annotations (named `namespace_name`): the pod's annotation, else the namespace's, else
    /// the default. A pod annotation that fails is a refusal of the pod; a namespace annotation
    /// that fails is set aside (the default is used) and returned for the policy to report.
    pub fn resolve<S: AsRef<str>>(
        &self,
        pod: impl Fn(&str) -> Option<S>,
        namespace_name: &str,
        namespace: &BTreeMap<String, String>,
    ) -> Result<Resolved, Refusal> {
        let mut out = Resolved {
            values: Vec::with_capacity(self.items.len()),
            namespace_refusals: Vec::new(),
        };
        for d in &self.items {
            let from_pod = d.pod.then(|| pod(&d.annotation)).flatten();
            let chosen = if let Some(v) = &from_pod {
                let v = v.as_ref();
                d.check(v).map_err(|reason| Refusal {
                    annotation: d.annotation.clone(),
                    on: "pod".to_owned(),
                    value: quoted(v),
                    reason,
                })?;
                (v.to_owned(), Origin::Pod)
            } else {
                match d.namespace.then(|| namespace.get(&d.annotation)).flatten() {
                    Some(v) => match d.check(v) {
                        Ok(()) => (v.clone(), Origin::Namespace),
                        Err(reason) => {
                            out.namespace_refusals.push(Refusal {
                                annotation: d.annotation.clone(),
                                on: format!("namespace {namespace_name}"),
                                value: quoted(v),
                                reason,
                            });
                            (d.default.clone(), Origin::Default)
                        }
                    },
                    None => (d.default.clone(), Origin::Default),
                }
            };
            out.values.push(Chosen {
                name: d.name.clone(),
                annotation: d.annotation.clone(),
                value: chosen.0,
                origin: chosen.1,
            });
        }
        Ok(out)
    }
}

fn declare(i: usize, o: &Override) -> Result<Declared, DeclarationError> {
    let err = |f: &str, message: String| DeclarationError {
        field: format!("spec.overrides[{i}].{f}"),
        message,
    };
    if o.name.is_empty()
        || !o
            .name
            .starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        || !o
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(err(
            "name",
            format!(
                "{:?} is not a template name (letters, digits and '_', not first a digit)",
                o.name
            ),
        ));
    }
    crate::validate::qualified_name(&o.annotation).map_err(|e| {
        err(
            "annotation",
            format!("{:?} is not a valid annotation key: {e}", o.annotation),
        )
    })?;
    if o.from.is_empty() {
        return Err(err("from", "must name Pod, Namespace or both".into()));
    }
    let rule = match &o.rule {
        None => None,
        Some(source) => Some((
            source.clone(),
            Arc::new(compile_rule(o.type_, source).map_err(|m| err("rule", m))?),
        )),
    };
    let allowed = if o.privileged {
        let bounded = rule.as_ref().and_then(|(_, p)| enumerated(p));
        match bounded {
            Some(values) => values,
            None => {
                return Err(err(
                    "privileged",
                    "a privileged override needs a rule that bounds it to an enumerated set \
                     (self in ['a', 'b'], alone or first in a conjunction)"
                        .into(),
                ));
            }
        }
    } else {
        Vec::new()
    };
    let d = Declared {
        name: o.name.clone(),
        annotation: o.annotation.clone(),
        ty: o.type_,
        default: o.default.clone(),
        rule,
        message: o.message.clone(),
        pod: o.from.contains(&OverrideSource::Pod),
        namespace: o.from.contains(&OverrideSource::Namespace),
        privileged: o.privileged,
        allowed,
    };
    d.check(&d.default)
        .map_err(|m| err("default", format!("{:?}: {m}", quoted(&d.default))))?;
    for v in &d.allowed {
        d.check(v).map_err(|m| {
            err(
                "rule",
                format!("the enumerated value {v:?} is refused: {m}"),
            )
        })?;
    }
    Ok(d)
}

/// Compiles a rule: CEL that reads only `self` and stays within the cost budget over the
/// longest value.
fn compile_rule(ty: OverrideType, source: &str) -> Result<Program, String> {
    let program = Program::compile(source).map_err(|e| format!("does not compile: {e}"))?;
    let mut free = Vec::new();
    free_idents(&program.expression().expr, &mut Vec::new(), &mut free);
    if let Some(var) = free.into_iter().find(|v| v != "self") {
        return Err(format!("reads {var:?}; a rule may only read self"));
    }
    let schema = match ty {
        OverrideType::Integer => serde_json::json!({"type": "integer"}),
        OverrideType::Boolean => serde_json::json!({"type": "boolean"}),
        OverrideType::String | OverrideType::Quantity => {
            serde_json::json!({"type": "string", "maxLength": RULE_SCHEMA_MAX_LENGTH})
        }
    };
    let compiled = compile_schema(&schema);
    if let Some(w) = estimate_rule_cost(source, &compiled)
        .into_iter()
        .find(|w| w.kind == kube_cel::WarningKind::CostExceeded)
    {
        return Err(format!("exceeds the cost limit: {}", w.message));
    }
    Ok(program)
}

/// The identifiers `expr` reads that no comprehension around them binds (`references()` would
/// count a macro's loop variable too).
fn free_idents(expr: &Expr, bound: &mut Vec<String>, out: &mut Vec<String>) {
    match expr {
        Expr::Ident(name) => {
            if !bound.contains(name) && !out.contains(name) {
                out.push(name.clone());
            }
        }
        Expr::Call(call) => {
            if let Some(target) = &call.target {
                free_idents(&target.expr, bound, out);
            }
            for arg in &call.args {
                free_idents(&arg.expr, bound, out);
            }
        }
        Expr::Comprehension(c) => {
            free_idents(&c.iter_range.expr, bound, out);
            free_idents(&c.accu_init.expr, bound, out);
            let depth = bound.len();
            bound.push(c.iter_var.clone());
            bound.extend(c.iter_var2.clone());
            bound.push(c.accu_var.clone());
            for e in [&c.loop_cond, &c.loop_step, &c.result] {
                free_idents(&e.expr, bound, out);
            }
            bound.truncate(depth);
        }
        Expr::List(list) => {
            for e in &list.elements {
                free_idents(&e.expr, bound, out);
            }
        }
        Expr::Map(map) => {
            for entry in &map.entries {
                if let EntryExpr::MapEntry(e) = &entry.expr {
                    free_idents(&e.key.expr, bound, out);
                    free_idents(&e.value.expr, bound, out);
                }
            }
        }
        Expr::Struct(st) => {
            for entry in &st.entries {
                if let EntryExpr::StructField(f) = &entry.expr {
                    free_idents(&f.value.expr, bound, out);
                }
            }
        }
        Expr::Select(select) => free_idents(&select.operand.expr, bound, out),
        Expr::Literal(_) | Expr::Unspecified => {}
    }
}

/// The values `self in [...]` allows, when that is the rule or the first term of a conjunction
/// (`&&`) of it.
fn enumerated(program: &Program) -> Option<Vec<String>> {
    let mut expr = &program.expression().expr;
    loop {
        let Expr::Call(call) = expr else { return None };
        match (call.func_name.as_str(), call.args.as_slice()) {
            ("_&&_", [first, _]) => expr = &first.expr,
            ("@in", [subject, list]) => {
                let (Expr::Ident(id), Expr::List(list)) = (&subject.expr, &list.expr) else {
                    return None;
                };
                if id != "self" || list.elements.is_empty() {
                    return None;
                }
                return list
                    .elements
                    .iter()
                    .map(|e| match &e.expr {
                        Expr::Literal(LiteralValue::String(s)) => Some(s.inner().to_owned()),
                        Expr::Literal(LiteralValue::Int(n)) => Some(n.inner().to_string()),
                        Expr::Literal(LiteralValue::Boolean(b)) => Some(b.inner().to_string()),
                        _ => None,
                    })
                    .collect();
            }
            _ => return None,
        }
    }
}

thread_local! {
    /// The CEL functions (Kubernetes extensions included), registered once per thread: a context
    /// is not shared between threads, and building one registers a few hundred functions.
    static CEL: cel::Context<'static> = cel::Context::default().with_all();
}

impl Declared {
    /// Whether `value` has the declared type and passes the rule; the reason when it does not.
    fn check(&self, value: &str) -> Result<(), String> {
        if value.len() > MAX_OVERRIDE_VALUE_BYTES {
            return Err(format!(
                "the value is {} bytes, more than the {MAX_OVERRIDE_VALUE_BYTES} allowed",
                value.len()
            ));
        }
        let subject = match self.ty {
            OverrideType::String => cel::Value::String(Arc::new(value.to_owned())),
            OverrideType::Integer => cel::Value::Int(
                value
                    .parse::<i64>()
                    .map_err(|_| "not an integer".to_owned())?,
            ),
            OverrideType::Boolean => match value {
                "true" => cel::Value::Bool(true),
                "false" => cel::Value::Bool(false),
                _ => return Err("not a boolean (true or false)".into()),
            },
            OverrideType::Quantity => {
                let v = cel::Value::String(Arc::new(value.to_owned()));
                if !is_quantity(&v) {
                    return Err("not a Kubernetes quantity (such as 100m, 1Gi)".into());
                }
                v
            }
        };
        let Some((source, program)) = &self.rule else {
            return Ok(());
        };
        let result = CEL.with(|root| {
            let mut ctx = root.new_inner_scope();
            ctx.add_variable_from_value("self", subject);
            program.execute(&ctx)
        });
        let because = || match &self.message {
            Some(m) => format!("{m} (rule: {source})"),
            None => format!("the rule {source} is false"),
        };
        match result {
            Ok(cel::Value::Bool(true)) => Ok(()),
            Ok(cel::Value::Bool(false)) => Err(because()),
            Ok(other) => Err(format!(
                "the rule {source} returned {:?}, not a boolean",
                other.type_of()
            )),
            Err(e) => Err(format!("the rule {source} failed: {e}")),
        }
    }
}

fn is_quantity(v: &cel::Value) -> bool {
    thread_local! {
        static IS_QUANTITY: Option<Program> = Program::compile("isQuantity(self)").ok();
    }
    IS_QUANTITY.with(|p| {
        let Some(p) = p else { return false };
        CEL.with(|root| {
            let mut ctx = root.new_inner_scope();
            ctx.add_variable_from_value("self", v.clone());
            matches!(p.execute(&ctx), Ok(cel::Value::Bool(true)))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> InjectionPolicySpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn cpu() -> InjectionPolicySpec {
        let policy: splice_crds::InjectionPolicy =
            serde_yaml::from_str(include_str!("../../testdata/policy-overrides.yaml")).unwrap();
        policy.spec
    }

    fn none(_: &str) -> Option<&'static str> {
        None
    }

    fn ns(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn the_pod_wins_over_the_namespace_which_wins_over_the_default() {
        let o = Overrides::compile(&cpu()).unwrap();
        let pod = |k: &str| (k == "mesh.example/proxy-cpu").then_some("200m");
        let r = o
            .resolve(pod, "team", &ns(&[("mesh.example/proxy-cpu", "300m")]))
            .unwrap();
        assert_eq!(
            (r.values[0].value.as_str(), r.values[0].origin),
            ("200m", Origin::Pod)
        );
        let r = o
            .resolve(none, "team", &ns(&[("mesh.example/proxy-cpu", "300m")]))
            .unwrap();
        assert_eq!(
            (r.values[0].value.as_str(), r.values[0].origin),
            ("300m", Origin::Namespace)
        );
        let r = o.resolve(none, "team", &ns(&[])).unwrap();
        assert_eq!(
            (r.values[0].value.as_str(), r.values[0].origin),
            ("100m", Origin::Default)
        );
    }

    #[test]
    fn a_pod_value_outside_the_rule_is_refused_with_the_annotation_value_and_message() {
        let o = Overrides::compile(&cpu()).unwrap();
        let e = o
            .resolve(
                |k| (k == "mesh.example/proxy-cpu").then_some("2"),
                "team",
                &ns(&[]),
            )
            .unwrap_err();
        assert_eq!(e.annotation, "mesh.example/proxy-cpu");
        assert_eq!(e.value, "2");
        let text = e.to_string();
        assert!(text.contains("at most 1 CPU"), "{text}");
        assert!(text.contains("mesh.example/proxy-cpu=\"2\""), "{text}");
        let e = o
            .resolve(
                |k| (k == "mesh.example/proxy-cpu").then_some("lots"),
                "team",
                &ns(&[]),
            )
            .unwrap_err();
        assert!(e.reason.contains("not a Kubernetes quantity"), "{e}");
    }

    #[test]
    fn a_namespace_value_outside_the_rule_falls_back_to_the_default_and_is_reported() {
        let o = Overrides::compile(&cpu()).unwrap();
        let r = o
            .resolve(none, "team", &ns(&[("mesh.example/log-level", "trace")]))
            .unwrap();
        assert_eq!(
            (r.values[1].value.as_str(), r.values[1].origin),
            ("info", Origin::Default)
        );
        assert_eq!(r.namespace_refusals.len(), 1);
        assert_eq!(r.namespace_refusals[0].on, "namespace team");
    }

    #[test]
    fn a_source_the_override_does_not_read_is_ignored() {
        let o = Overrides::compile(&cpu()).unwrap();
        // logLevel reads only the namespace: the pod's annotation is not consulted at all.
        let r = o
            .resolve(
                |k| (k == "mesh.example/log-level").then_some("trace"),
                "team",
                &ns(&[]),
            )
            .unwrap();
        assert_eq!(
            (r.values[1].value.as_str(), r.values[1].origin),
            ("info", Origin::Default)
        );
    }

    #[test]
    fn values_too_long_are_refused_without_quoting_them_whole() {
        let o = Overrides::compile(&cpu()).unwrap();
        let long = "1".repeat(64 * 1024);
        let e = o
            .resolve(
                |k| (k == "mesh.example/proxy-cpu").then_some(long.as_str()),
                "team",
                &ns(&[]),
            )
            .unwrap_err();
        assert!(e.reason.contains("65536 bytes"), "{e}");
        assert!(e.value.len() < 200, "{}", e.value.len());
    }

    fn declaration_error(yaml: &str) -> DeclarationError {
        Overrides::compile(&spec(yaml)).unwrap_err()
    }

    #[test]
    fn bad_declarations_are_refused_naming_the_field() {
        let e = declaration_error(
            "overrides: [{name: a, annotation: 'Bad Key', type: string, default: x}]",
        );
        assert_eq!(e.field, "spec.overrides[0].annotation");
        let e =
            declaration_error("overrides: [{name: a, annotation: k, type: integer, default: x}]");
        assert_eq!(e.field, "spec.overrides[0].default");
        assert!(e.message.contains("not an integer"), "{}", e.message);
        let e = declaration_error(
            "overrides: [{name: a, annotation: k, type: integer, default: '5', rule: 'self <'}]",
        );
        assert_eq!(e.field, "spec.overrides[0].rule");
        let e = declaration_error(
            "overrides: [{name: a, annotation: k, type: integer, default: '5', rule: 'self < 3'}]",
        );
        assert_eq!(e.field, "spec.overrides[0].default");
        let e = declaration_error(
            "overrides: [{name: a, annotation: k, type: string, default: x, rule: 'object.x == 1'}]",
        );
        assert!(e.message.contains("only read self"), "{}", e.message);
        let e = declaration_error(
            "overrides: [{name: a, annotation: k, type: string, default: x, rule: 'size(self)'}]",
        );
        assert!(e.message.contains("not a boolean"), "{}", e.message);
        let e = declaration_error(
            "overrides: [{name: a, annotation: k, type: string, default: x}, \
             {name: b, annotation: k, type: string, default: x}]",
        );
        assert_eq!(e.field, "spec.overrides[1].annotation");
        let e = declaration_error(
            "overrides: [{name: a, annotation: k, type: string, default: x}, \
             {name: a, annotation: j, type: string, default: x}]",
        );
        assert_eq!(e.field, "spec.overrides[1].name");
    }

    #[test]
    fn a_rule_over_the_cost_limit_is_refused() {
        let e = declaration_error(
            "overrides: [{name: a, annotation: k, type: string, default: x, \
             rule: \"self.split('').all(a, self.split('').all(b, self.split('').all(c, a != '~')))\"}]",
        );
        assert_eq!(e.field, "spec.overrides[0].rule");
        assert!(e.message.contains("cost"), "{}", e.message);
    }

    #[test]
    fn a_privileged_override_needs_an_enumerated_rule() {
        let e = declaration_error(
            "overrides: [{name: a, annotation: k, type: integer, default: '0', privileged: true, \
             rule: 'self < 1000'}]",
        );
        assert_eq!(e.field, "spec.overrides[0].privileged");
        let o = Overrides::compile(&spec(
            "overrides: [{name: uid, annotation: k, type: integer, default: '1000', privileged: true, \
             rule: \"self in [1000, 2000] && self > 0\"}]",
        ))
        .unwrap();
        assert_eq!(o.allowed("uid"), ["1000", "2000"]);
    }

    #[test]
    fn a_namespace_change_outdates_the_values_taken_from_it_but_not_the_pods_own() {
        let o = Overrides::compile(&cpu()).unwrap();
        let team = ns(&[("mesh.example/proxy-cpu", "300m")]);
        let at_admission = o.resolve(none, "team", &team).unwrap();
        let record = |r: &Resolved| -> BTreeMap<String, OverrideRecord> {
            r.values
                .iter()
                .map(|c| {
                    let rec = OverrideRecord {
                        from: c.origin.as_str().into(),
                        sha256: c.digest(),
                    };
                    (c.name.clone(), rec)
                })
                .collect()
        };
        let recorded = record(&at_admission);
        assert_eq!(o.drifted(Some(&recorded), "team", &team), None);
        let changed = ns(&[("mesh.example/proxy-cpu", "400m")]);
        assert_eq!(
            o.drifted(Some(&recorded), "team", &changed),
            Some("proxyCPU")
        );
        // Removing the annotation brings the default back: outdated too.
        assert_eq!(
            o.drifted(Some(&recorded), "team", &ns(&[])),
            Some("proxyCPU")
        );
        // A pod that set its own value keeps it whatever the namespace says.
        let own = o
            .resolve(
                |k| (k == "mesh.example/proxy-cpu").then_some("200m"),
                "team",
                &team,
            )
            .unwrap();
        assert_eq!(o.drifted(Some(&record(&own)), "team", &changed), None);
        // A pod injected before the policy declared overrides has no record of them.
        assert_eq!(o.drifted(None, "team", &team), Some("proxyCPU"));
        // The rollout's mark moves with the namespace's values, and only with them.
        let mark = o.namespace_mark("team", &team);
        assert_eq!(mark, o.namespace_mark("team", &team.clone()));
        assert_ne!(mark, o.namespace_mark("team", &changed));
        assert_eq!(Overrides::default().namespace_mark("team", &team), None);
    }

    #[test]
    fn templates_see_typed_values() {
        let o = Overrides::compile(&spec(
            "overrides: [{name: n, annotation: a/n, type: integer, default: '3'}, \
             {name: b, annotation: a/b, type: boolean, default: 'true'}]",
        ))
        .unwrap();
        let r = o.resolve(none, "x", &ns(&[])).unwrap();
        let ctx = r.context(&o);
        assert_eq!(ctx.get_attr("n").unwrap(), JValue::from(3));
        assert_eq!(ctx.get_attr("b").unwrap(), JValue::from(true));
    }
}
