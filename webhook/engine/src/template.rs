//! Policy templates: every string in the injected content may hold `{{ … }}` expressions over
//! `pod`, `namespace`, `policy` and `values`, and `identity` when the policy has `spec.identity`.
//!
//! Each templated string is compiled once, under its field path, in a sandboxed minijinja
//! environment (bounded fuel, bounded output, strict undefined: a missing name is an error, never
//! an empty string). Strings that only read `policy` and `values` are rendered at compile time, so
//! the request path only renders what depends on the pod or its namespace.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::io;
use std::sync::Arc;

use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value as JValue};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use splice_crds::InjectionPolicySpec;

use super::overrides::Overrides;
use super::values_from::{ResolvedValues, hex, placeholders};
use super::wire::Fragment;

/// Instructions one rendering may execute.
pub const FUEL: u64 = 50_000;
/// Largest template source accepted in one string.
pub const MAX_SOURCE_LEN: usize = 16 * 1024;
/// Largest rendered value of one string.
pub const MAX_RENDERED_LEN: usize = 64 * 1024;

/// Names a template may read at its top level. `range` and `dict` are minijinja's own global
/// functions; `namespace()` and `debug()` are removed so `namespace` is always the pod's namespace.
const ALLOWED_NAMES: [&str; 7] = [
    "pod",
    "namespace",
    "policy",
    "values",
    "overrides",
    "range",
    "dict",
];
/// Fields an override may reach only when it is marked `privileged`: what Pod Security judges.
const PRIVILEGED_FIELDS: [&str; 3] = ["securityContext", "hostPath", "hostPort"];
/// The name a template may read only when the policy has `spec.identity`.
const IDENTITY_NAME: &str = "identity";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Deps {
    pub pod: bool,
    pub namespace: bool,
    /// Some template reads more of the namespace than its name (labels, annotations, or the
    /// whole object): a cached rendering is then only valid for an identical namespace context.
    pub namespace_beyond_name: bool,
    /// Some template reads `overrides`: its value depends on the pod's and the namespace's
    /// annotations, so no rendering is shared between requests.
    pub overrides: bool,
}

impl Deps {
    pub(crate) fn any(self) -> bool {
        self.pod || self.namespace || self.overrides
    }
    fn or(self, other: Deps) -> Deps {
        Deps {
            pod: self.pod || other.pod,
            namespace: self.namespace || other.namespace,
            namespace_beyond_name: self.namespace_beyond_name || other.namespace_beyond_name,
            overrides: self.overrides || other.overrides,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// A string that must be rendered per request.
#[derive(Debug)]
pub(crate) struct Hole {
    /// Where the string sits inside its item.
    pub path: Vec<Seg>,
    /// The field path, also the template's name in the environment.
    pub field: String,
    /// Dotted variable paths the template reads, to name the undefined one in an error.
    pub vars: Vec<String>,
}

impl Hole {
    /// True when the template reads `pod` (as opposed to only `namespace`).
    pub fn reads_pod(&self) -> bool {
        self.vars.iter().any(|v| v.split('.').next() == Some("pod"))
    }

    /// True when the string sits at `prefix` or below it inside its item.
    pub fn under(&self, prefix: &[&str]) -> bool {
        self.path.len() >= prefix.len()
            && self
                .path
                .iter()
                .zip(prefix)
                .all(|(seg, key)| matches!(seg, Seg::Key(k) if k == key))
    }
}

/// One injected list item (container, init container, volume, env var or volume mount).
#[derive(Debug)]
pub(crate) struct TemplateItem {
    pub field: String,
    /// The item with every static string already rendered.
    base: Value,
    /// `base` serialized, when nothing is left to render.
    base_json: Option<Fragment>,
    holes: Vec<Hole>,
    /// `name`, or `mountPath` for volume mounts.
    key_field: &'static str,
    /// The identity of the item when it does not depend on the request.
    static_key: Option<String>,
}

impl TemplateItem {
    pub fn static_key(&self) -> Option<&str> {
        self.static_key.as_deref()
    }
    /// The item with every static string rendered; a string that depends on the request still
    /// holds its template source.
    pub fn base(&self) -> &Value {
        &self.base
    }
    /// The strings rendered per request.
    pub fn holes(&self) -> &[Hole] {
        &self.holes
    }
}

/// One injected label or annotation.
#[derive(Debug)]
pub(crate) struct TemplateString {
    pub key: String,
    base: String,
    hole: Option<Hole>,
}

impl TemplateString {
    /// The value, when it does not depend on the request.
    pub fn static_value(&self) -> Option<&str> {
        self.hole.is_none().then_some(self.base.as_str())
    }
    /// The template, when the value depends on the request.
    pub fn hole(&self) -> Option<&Hole> {
        self.hole.as_ref()
    }
}

/// An item as rendered for one request.
#[derive(Debug)]
pub(crate) struct RItem<'t> {
    pub key: Cow<'t, str>,
    pub value: Cow<'t, Value>,
    /// Pre-serialized JSON of `value`, when it does not change between requests.
    pub json: Option<Cow<'t, Fragment>>,
    pub field: Cow<'t, str>,
}

#[derive(Debug, Default)]
pub(crate) struct Rendered<'t> {
    pub init_containers: Vec<RItem<'t>>,
    pub containers: Vec<RItem<'t>>,
    pub volumes: Vec<RItem<'t>>,
    pub env: Vec<RItem<'t>>,
    pub volume_mounts: Vec<RItem<'t>>,
    pub labels: Vec<(Cow<'t, str>, Cow<'t, str>)>,
    pub annotations: Vec<(Cow<'t, str>, Cow<'t, str>)>,
}

/// A rendering that does not depend on the pod, owned so that it can outlive the request that
/// produced it: items keep their JSON serialized once, and later requests borrow it as it is, with
/// nothing converted per request.
pub(crate) type OwnedRendered = Rendered<'static>;

impl Rendered<'_> {
    pub fn to_owned_rendering(&self) -> Result<OwnedRendered, serde_json::Error> {
        let items = |list: &[RItem<'_>]| {
            list.iter()
                .map(|i| {
                    Ok(RItem {
                        key: Cow::Owned(i.key.to_string()),
                        value: Cow::Owned(i.value.as_ref().clone()),
                        json: Some(Cow::Owned(match &i.json {
                            Some(json) => json.as_ref().clone(),
                            None => Fragment::new(serde_json::to_string(i.value.as_ref())?),
                        })),
                        field: Cow::Owned(i.field.to_string()),
                    })
                })
                .collect::<Result<Vec<_>, serde_json::Error>>()
        };
        let strings = |list: &[(Cow<'_, str>, Cow<'_, str>)]| {
            list.iter()
                .map(|(k, v)| (Cow::Owned(k.to_string()), Cow::Owned(v.to_string())))
                .collect()
        };
        Ok(Rendered {
            init_containers: items(&self.init_containers)?,
            containers: items(&self.containers)?,
            volumes: items(&self.volumes)?,
            env: items(&self.env)?,
            volume_mounts: items(&self.volume_mounts)?,
            labels: strings(&self.labels),
            annotations: strings(&self.annotations),
        })
    }
}

pub(crate) struct Templates {
    env: Environment<'static>,
    pub init_containers: Vec<TemplateItem>,
    pub containers: Vec<TemplateItem>,
    pub volumes: Vec<TemplateItem>,
    pub env_vars: Vec<TemplateItem>,
    pub volume_mounts: Vec<TemplateItem>,
    pub labels: Vec<TemplateString>,
    pub annotations: Vec<TemplateString>,
    /// What the request-time templates read.
    pub deps: Deps,
}

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Templates")
            .field("init_containers", &self.init_containers.len())
            .field("containers", &self.containers.len())
            .field("volumes", &self.volumes.len())
            .field("env_vars", &self.env_vars.len())
            .field("volume_mounts", &self.volume_mounts.len())
            .field("labels", &self.labels.len())
            .field("annotations", &self.annotations.len())
            .field("deps", &self.deps)
            .finish()
    }
}

/// A template failure: the field and a message (the caller adds the policy name).
#[derive(Debug)]
pub(crate) struct TemplateError {
    pub field: String,
    pub message: String,
}

fn new_env() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_fuel(Some(FUEL));
    env.set_recursion_limit(32);
    // A script in `args` keeps its final newline.
    env.set_keep_trailing_newline(true);
    // Field paths may end in ".json" or ".html" (annotation keys); never escape.
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.remove_global("namespace");
    env.remove_global("debug");
    env.add_filter("sha256", sha256_filter);
    env
}

pub(crate) fn is_templated(s: &str) -> bool {
    s.contains("{{") || s.contains("{%") || s.contains("{#")
}

/// Appends `key` to a field path: `.key` for identifiers, `["key"]` otherwise.
pub(crate) fn push_key(path: &mut String, key: &str) {
    let ident = !key.is_empty()
        && key.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && !key.as_bytes()[0].is_ascii_digit();
    if ident {
        path.push('.');
        path.push_str(key);
    } else {
        path.push_str(&format!("[{key:?}]"));
    }
}

struct LimitedWriter {
    buf: Vec<u8>,
    overflowed: bool,
}

impl io::Write for LimitedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > MAX_RENDERED_LEN {
            self.overflowed = true;
            return Err(io::Error::other("rendered value too large"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The context shared by every template of a policy: `policy` and `values`. `pod` and `namespace`
/// are added per request.
#[cfg(test)]
pub(crate) fn static_context(
    name: &str,
    generation: i64,
    spec: &InjectionPolicySpec,
) -> (JValue, JValue) {
    static_context_with(name, generation, spec, None)
}

/// [`static_context`] with the data of `spec.valuesFrom`: `None` when it is not at hand (at
/// apply), so each key an entry names reads as a stand-in and a key a `configMapRef` may bring
/// reads as one too, leaving the real check to the replicas that hold the data.
pub(crate) fn static_context_with(
    name: &str,
    generation: i64,
    spec: &InjectionPolicySpec,
    data: Option<&ResolvedValues>,
) -> (JValue, JValue) {
    context_with_secrets(name, generation, spec, data, None)
}

/// [`static_context_with`], each Secret-fed value replaced by `probe` when given.
fn context_with_secrets(
    name: &str,
    generation: i64,
    spec: &InjectionPolicySpec,
    data: Option<&ResolvedValues>,
    probe: Option<&str>,
) -> (JValue, JValue) {
    let policy = minijinja::context! { name => name, generation => generation };
    if spec.values_from.is_empty() {
        return (policy, JValue::from_serialize(&spec.values));
    }
    let resolved = resolved_or_stand_ins(spec, data);
    let mut map: BTreeMap<String, JValue> = spec
        .values
        .iter()
        .map(|(k, v)| (k.clone(), JValue::from(v.as_str())))
        .collect();
    for (k, v) in &resolved.values {
        let value = match probe {
            Some(p) if resolved.secret_keys.contains(k) => JValue::from(p),
            _ => JValue::from(v.as_str()),
        };
        map.insert(k.clone(), value);
    }
    let lax = data.is_none() && spec.values_from.iter().any(|e| e.config_map_ref.is_some());
    let values = if lax {
        JValue::from_object(StandInValues(map))
    } else {
        JValue::from_object(map)
    };
    (policy, values)
}

/// Two stand-ins for every Secret-fed value (different text, different lengths): a template
/// that reads one renders the same with both, `sha256` giving a constant meanwhile, only when
/// nothing but `sha256` sees the value.
const SECRET_PROBES: [&str; 2] = ["\u{1}splice-secret-probe-a", "\u{2}splice probe b, longer"];

/// `values` of a policy compiled without its data whose `configMapRef` may bring any key: a key
/// not named anywhere reads as a stand-in instead of failing as undefined.
#[derive(Debug)]
struct StandInValues(BTreeMap<String, JValue>);

impl minijinja::value::Object for StandInValues {
    fn repr(self: &Arc<Self>) -> minijinja::value::ObjectRepr {
        minijinja::value::ObjectRepr::Map
    }
    fn get_value(self: &Arc<Self>, key: &JValue) -> Option<JValue> {
        let key = key.as_str()?;
        Some(
            self.0
                .get(key)
                .cloned()
                .unwrap_or_else(|| JValue::from("valuesFrom")),
        )
    }
    fn enumerate(self: &Arc<Self>) -> minijinja::value::Enumerator {
        minijinja::value::Enumerator::Values(
            self.0.keys().map(|k| JValue::from(k.as_str())).collect(),
        )
    }
}

/// The `sha256` filter: 64 hex digits of SHA-256 of the value's text. The one way a template may
/// read a Secret-fed value, so the pod carries a fingerprint of the secret, never the secret.
fn sha256_filter(value: JValue) -> String {
    hex(&Sha256::digest(value.to_string().as_bytes()))
}

/// The data, or stand-ins for it when it is not at hand ([`placeholders`]).
fn resolved_or_stand_ins<'d>(
    spec: &InjectionPolicySpec,
    data: Option<&'d ResolvedValues>,
) -> Cow<'d, ResolvedValues> {
    match data {
        Some(d) => Cow::Borrowed(d),
        None => Cow::Owned(placeholders(spec)),
    }
}

/// For each Secret-fed key, the entry that feeds it (`spec.valuesFrom[1]`), to name it when a
/// template would show it.
fn secret_fields(
    spec: &InjectionPolicySpec,
    data: Option<&ResolvedValues>,
) -> BTreeMap<String, String> {
    let resolved = resolved_or_stand_ins(spec, data);
    let mut out = BTreeMap::new();
    for (i, e) in spec.values_from.iter().enumerate() {
        if let (Some(name), Some(_)) = (&e.name, &e.secret_key_ref)
            && resolved.secret_keys.contains(name)
        {
            out.insert(name.clone(), format!("spec.valuesFrom[{i}]"));
        }
    }
    out
}

impl Templates {
    #[cfg(test)]
    pub fn compile(
        name: &str,
        generation: i64,
        spec: &InjectionPolicySpec,
    ) -> Result<Templates, TemplateError> {
        let overrides = Overrides::compile(spec).map_err(|e| TemplateError {
            field: e.field,
            message: e.message,
        })?;
        Self::compile_with(name, generation, spec, None, &overrides)
    }

    /// [`Self::compile`] with the data of `spec.valuesFrom` (see [`static_context_with`]).
    pub fn compile_with(
        name: &str,
        generation: i64,
        spec: &InjectionPolicySpec,
        data: Option<&ResolvedValues>,
        overrides: &Overrides,
    ) -> Result<Templates, TemplateError> {
        let (policy, values) = static_context_with(name, generation, spec, data);
        let static_ctx = minijinja::context! { policy => policy, values => values };
        let mut c = Compiler {
            env: new_env(),
            static_ctx,
            deps: Deps::default(),
            secrets: secret_fields(spec, data),
            probes: None,
            identity: spec.identity.is_some(),
            overrides: overrides.clone(),
        };
        if !c.secrets.is_empty() {
            let probe = |p| {
                let (policy, values) = context_with_secrets(name, generation, spec, data, Some(p));
                minijinja::context! { policy => policy, values => values }
            };
            let mut env = new_env();
            // Checking only: what `sha256` makes of a Secret-fed value never shows it.
            env.add_filter("sha256", |_: JValue| "sha256".to_owned());
            c.probes = Some((env, probe(SECRET_PROBES[0]), probe(SECRET_PROBES[1])));
        }
        let t = crate::identity::template(spec);
        let init_containers =
            c.items(&t.init_containers, "spec.template.initContainers", "name")?;
        let containers = c.items(&t.containers, "spec.template.containers", "name")?;
        let volumes = c.items(&t.volumes, "spec.template.volumes", "name")?;
        let env_vars = c.items(&t.env, "spec.template.env", "name")?;
        let volume_mounts = c.items(&t.volume_mounts, "spec.template.volumeMounts", "mountPath")?;
        let labels = c.strings(&t.labels, "spec.template.labels")?;
        let annotations = c.strings(&t.annotations, "spec.template.annotations")?;
        Ok(Templates {
            env: c.env,
            init_containers,
            containers,
            volumes,
            env_vars,
            volume_mounts,
            labels,
            annotations,
            deps: c.deps,
        })
    }

    /// Renders everything for one request (only labels and annotations when `meta_only`: an
    /// UPDATE never touches the rest, so its templates must not fail the request). `ctx` holds
    /// `pod`/`namespace` as far as [`Self::deps`] asks for them, plus `policy` and `values`.
    pub fn render<'t>(
        &'t self,
        ctx: &JValue,
        meta_only: bool,
    ) -> Result<Rendered<'t>, TemplateError> {
        let items = |list: &'t [TemplateItem]| -> Result<Vec<RItem<'t>>, TemplateError> {
            if meta_only {
                return Ok(Vec::new());
            }
            list.iter()
                .map(|item| self.render_item(item, ctx))
                .collect()
        };
        let strings = |list: &'t [TemplateString]| {
            list.iter()
                .map(|s| {
                    let value = match &s.hole {
                        None => Cow::Borrowed(s.base.as_str()),
                        Some(hole) => Cow::Owned(render_one(&self.env, hole, ctx)?),
                    };
                    Ok((Cow::Borrowed(s.key.as_str()), value))
                })
                .collect::<Result<Vec<_>, TemplateError>>()
        };
        Ok(Rendered {
            init_containers: items(&self.init_containers)?,
            containers: items(&self.containers)?,
            volumes: items(&self.volumes)?,
            env: items(&self.env_vars)?,
            volume_mounts: items(&self.volume_mounts)?,
            labels: strings(&self.labels)?,
            annotations: strings(&self.annotations)?,
        })
    }

    /// Renders one per-request string with `ctx` (Pod Security judges a privileged override's
    /// every allowed value this way).
    pub(crate) fn render_hole(&self, hole: &Hole, ctx: &JValue) -> Result<String, TemplateError> {
        render_one(&self.env, hole, ctx)
    }

    fn render_item<'t>(
        &'t self,
        item: &'t TemplateItem,
        ctx: &JValue,
    ) -> Result<RItem<'t>, TemplateError> {
        let value = if item.holes.is_empty() {
            Cow::Borrowed(&item.base)
        } else {
            let mut v = item.base.clone();
            for hole in &item.holes {
                let rendered = render_one(&self.env, hole, ctx)?;
                if let Some(slot) = walk_mut(&mut v, &hole.path) {
                    *slot = Value::String(rendered);
                }
            }
            Cow::Owned(v)
        };
        let key = match &item.static_key {
            Some(k) => Cow::Borrowed(k.as_str()),
            None => {
                let k = value
                    .get(item.key_field)
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if k.is_empty() {
                    return Err(TemplateError {
                        field: format!("{}.{}", item.field, item.key_field),
                        message: format!("{} rendered empty", item.key_field),
                    });
                }
                Cow::Owned(k.to_owned())
            }
        };
        Ok(RItem {
            key,
            value,
            json: item.base_json.as_ref().map(Cow::Borrowed),
            field: Cow::Borrowed(&item.field),
        })
    }
}

/// A stand-in for the pod (or namespace) that has every field but one: any attribute or index
/// is another stand-in that renders as `x`, except the dotted path `absent`, which is undefined.
#[derive(Debug)]
struct Lacking {
    path: String,
    absent: String,
}

impl minijinja::value::Object for Lacking {
    fn get_value(self: &std::sync::Arc<Self>, key: &JValue) -> Option<JValue> {
        let key = match key.as_str() {
            Some(k) => k.to_owned(),
            None => key.to_string(),
        };
        let path = format!("{}.{key}", self.path);
        (path != self.absent).then(|| {
            JValue::from_object(Lacking {
                path,
                absent: self.absent.clone(),
            })
        })
    }

    fn render(self: &std::sync::Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("x")
    }
}

impl Templates {
    /// The template source of a string rendered per request.
    pub fn source(&self, hole: &Hole) -> Option<String> {
        self.env
            .get_template(&hole.field)
            .ok()
            .map(|t| t.source().to_owned())
    }

    /// Whether `hole` still renders for a pod (and namespace) that has every field except the
    /// dotted path `absent` (e.g. `pod.metadata.name`): false when the template needs it, true
    /// when it guards the read (`| default(...)`, `is defined`). `statics` holds `policy` and
    /// `values`. A template that fails on the stand-in for another reason counts as needing it.
    pub fn renders_without(&self, hole: &Hole, absent: &str, statics: &JValue) -> bool {
        let lacking = |root: &str| {
            JValue::from_object(Lacking {
                path: root.to_owned(),
                absent: absent.to_owned(),
            })
        };
        let ctx = minijinja::context! {
            pod => lacking("pod"),
            namespace => lacking("namespace"),
            identity => lacking(IDENTITY_NAME),
            ..statics.clone()
        };
        render_one(&self.env, hole, &ctx).is_ok()
    }
}

pub(crate) fn walk_mut<'v>(mut v: &'v mut Value, path: &[Seg]) -> Option<&'v mut Value> {
    for seg in path {
        v = match seg {
            Seg::Key(k) => v.get_mut(k.as_str())?,
            Seg::Index(i) => v.get_mut(*i)?,
        };
    }
    Some(v)
}

/// Renders one template, with a message that names what went wrong.
fn render_one(
    env: &Environment<'static>,
    hole: &Hole,
    ctx: &JValue,
) -> Result<String, TemplateError> {
    let err = |message: String| TemplateError {
        field: hole.field.clone(),
        message,
    };
    let tmpl = env
        .get_template(&hole.field)
        .map_err(|e| err(describe(&e)))?;
    let mut out = LimitedWriter {
        buf: Vec::new(),
        overflowed: false,
    };
    match tmpl.render_captured_to(ctx, &mut out) {
        Ok(_) => String::from_utf8(out.buf).map_err(|_| err("rendered invalid UTF-8".into())),
        Err(_) if out.overflowed => Err(err(format!(
            "rendered value exceeds {MAX_RENDERED_LEN} bytes"
        ))),
        Err(e) if e.kind() == minijinja::ErrorKind::UndefinedError => {
            Err(err(undefined_message(env, hole, ctx, &e)))
        }
        Err(e) if e.kind() == minijinja::ErrorKind::OutOfFuel => Err(err(format!(
            "template stopped after {FUEL} instructions (out of fuel)"
        ))),
        Err(e) => Err(err(describe(&e))),
    }
}

/// Names the first variable path the template reads that is undefined in `ctx`.
fn undefined_message(
    env: &Environment<'static>,
    hole: &Hole,
    ctx: &JValue,
    e: &minijinja::Error,
) -> String {
    for var in &hole.vars {
        let defined = env
            .compile_expression(var)
            .and_then(|expr| expr.eval(ctx))
            .is_ok_and(|v| !v.is_undefined());
        if !defined {
            return format!("undefined value '{var}'");
        }
    }
    describe(e)
}

fn describe(e: &minijinja::Error) -> String {
    let mut s = e.kind().to_string();
    if let Some(detail) = e.detail() {
        s.push_str(": ");
        s.push_str(detail);
    }
    if let Some(line) = e.line() {
        s.push_str(&format!(" (line {line})"));
    }
    s
}

struct Compiler {
    env: Environment<'static>,
    static_ctx: JValue,
    deps: Deps,
    /// Secret-fed keys → the entry feeding each.
    secrets: BTreeMap<String, String>,
    /// With Secret-fed values: an environment whose `sha256` is a constant, and two contexts
    /// with different stand-ins for those values.
    probes: Option<(Environment<'static>, JValue, JValue)>,
    /// The policy has `spec.identity`, so templates may read `identity`.
    identity: bool,
    /// `spec.overrides`, which templates read as `overrides.<name>`.
    overrides: Overrides,
}

impl Compiler {
    fn items<T: Serialize>(
        &mut self,
        list: &[T],
        field: &str,
        key_field: &'static str,
    ) -> Result<Vec<TemplateItem>, TemplateError> {
        let mut out: Vec<TemplateItem> = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            let field = format!("{field}[{i}]");
            let mut base = serde_json::to_value(item).map_err(|e| TemplateError {
                field: field.clone(),
                message: format!("cannot be represented as JSON: {e}"),
            })?;
            let mut holes = Vec::new();
            let mut path = Vec::new();
            self.walk(&mut base, &mut path, &field, &mut holes)?;
            let key_templated = holes
                .iter()
                .any(|h| matches!(h.path.as_slice(), [Seg::Key(k)] if k == key_field));
            let static_key = if key_templated {
                None
            } else {
                let key = base
                    .get(key_field)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                if key.is_empty() {
                    return Err(TemplateError {
                        field: format!("{field}.{key_field}"),
                        message: format!("{key_field} must not be empty"),
                    });
                }
                Some(key)
            };
            let base_json = if holes.is_empty() {
                Some(Fragment::new(serde_json::to_string(&base).map_err(
                    |e| TemplateError {
                        field: field.clone(),
                        message: format!("cannot be serialized: {e}"),
                    },
                )?))
            } else {
                None
            };
            out.push(TemplateItem {
                field,
                base,
                base_json,
                holes,
                key_field,
                static_key,
            });
        }
        Ok(out)
    }

    fn strings(
        &mut self,
        map: &std::collections::BTreeMap<String, String>,
        field: &str,
    ) -> Result<Vec<TemplateString>, TemplateError> {
        let mut out = Vec::with_capacity(map.len());
        for (key, source) in map {
            let mut f = field.to_owned();
            push_key(&mut f, key);
            let mut value = Value::String(source.clone());
            let mut holes = Vec::new();
            self.walk(&mut value, &mut Vec::new(), &f, &mut holes)?;
            let base = match value {
                Value::String(s) => s,
                _ => String::new(),
            };
            out.push(TemplateString {
                key: key.clone(),
                base,
                hole: holes.pop(),
            });
        }
        Ok(out)
    }

    /// Finds the templated strings under `v`; renders the static ones in place and returns the
    /// others as holes.
    fn walk(
        &mut self,
        v: &mut Value,
        path: &mut Vec<Seg>,
        field: &str,
        holes: &mut Vec<Hole>,
    ) -> Result<(), TemplateError> {
        match v {
            Value::String(s) if is_templated(s) => {
                if let Some(hole) = self.compile_string(s, path, field)? {
                    holes.push(hole);
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter_mut().enumerate() {
                    path.push(Seg::Index(i));
                    self.walk(item, path, &format!("{field}[{i}]"), holes)?;
                    path.pop();
                }
            }
            Value::Object(map) => {
                for (k, item) in map.iter_mut() {
                    let mut f = field.to_owned();
                    push_key(&mut f, k);
                    path.push(Seg::Key(k.clone()));
                    self.walk(item, path, &f, holes)?;
                    path.pop();
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Compiles one templated string. Returns `None` after rendering it in place when it only
    /// reads `policy` and `values`.
    fn compile_string(
        &mut self,
        s: &mut String,
        path: &[Seg],
        field: &str,
    ) -> Result<Option<Hole>, TemplateError> {
        let err = |message: String| TemplateError {
            field: field.to_owned(),
            message,
        };
        if s.len() > MAX_SOURCE_LEN {
            return Err(err(format!(
                "template is {} bytes, more than the {MAX_SOURCE_LEN} allowed",
                s.len()
            )));
        }
        self.env
            .add_template_owned(field.to_owned(), s.clone())
            .map_err(|e| err(describe(&e)))?;
        let tmpl = self
            .env
            .get_template(field)
            .map_err(|e| err(describe(&e)))?;
        let mut deps = Deps::default();
        let mut top: Vec<String> = tmpl.undeclared_variables(false).into_iter().collect();
        top.sort();
        for name in &top {
            let identity = self.identity && name == IDENTITY_NAME;
            if !ALLOWED_NAMES.contains(&name.as_str()) && !identity {
                let without = if name == IDENTITY_NAME {
                    "; identity needs spec.identity"
                } else {
                    ""
                };
                return Err(err(format!(
                    "unknown variable '{name}' (templates may read pod, namespace, policy, \
                     values and overrides{without})"
                )));
            }
            // The SPIFFE ID is the pod's namespace and service account.
            deps.pod |= name == "pod" || identity;
            deps.namespace |= name == "namespace" || identity;
        }
        let mut vars: Vec<String> = tmpl.undeclared_variables(true).into_iter().collect();
        vars.sort();
        deps.overrides = self.check_overrides(&vars, field).map_err(err)?;
        // Anything but `namespace.name` (and attributes of that string) counts as reading the
        // whole namespace, including a bare `namespace` handed to a filter or a variable.
        deps.namespace_beyond_name = vars.iter().any(|v| {
            v.split('.').next() == Some("namespace")
                && v != "namespace.name"
                && !v.starts_with("namespace.name.")
        });
        let hole = Hole {
            path: path.to_vec(),
            field: field.to_owned(),
            vars,
        };
        if let Some(entry) = self.secret_read(&hole.vars).map(str::to_owned) {
            let secret_refusal = |what: &str| {
                err(format!(
                    "{what} the Secret-fed value of {entry}; a Secret's value may only be read \
                     as `{{{{ values.KEY | sha256 }}}}` in a template that reads neither pod nor \
                     namespace, so it never appears in the pod spec"
                ))
            };
            if deps.any() {
                return Err(secret_refusal("reads pod or namespace together with"));
            }
            if let Some((env, a, b)) = &mut self.probes {
                env.add_template_owned(field.to_owned(), s.clone())
                    .map_err(|e| err(describe(&e)))?;
                let shown = render_one(env, &hole, a)? != render_one(env, &hole, b)?;
                env.remove_template(field);
                if shown {
                    return Err(secret_refusal("would show"));
                }
            }
            let rendered = render_one(&self.env, &hole, &self.static_ctx)?;
            self.env.remove_template(field);
            *s = rendered;
            return Ok(None);
        }
        if deps.any() {
            self.deps = self.deps.or(deps);
            return Ok(Some(hole));
        }
        let rendered = render_one(&self.env, &hole, &self.static_ctx)?;
        self.env.remove_template(field);
        *s = rendered;
        Ok(None)
    }
}

impl Compiler {
    /// Whether a template with these variable paths reads `overrides`, refusing a read of an
    /// undeclared override, a read of them all (a loop could reach any), and a read of one not
    /// marked privileged from a field Pod Security judges.
    fn check_overrides(&self, vars: &[String], field: &str) -> Result<bool, String> {
        let mut reads = false;
        for v in vars {
            let mut parts = v.split('.');
            if parts.next() != Some("overrides") {
                continue;
            }
            reads = true;
            let Some(name) = parts.next() else {
                return Err("read overrides by name (overrides.<name>), not as a whole".into());
            };
            let declared: Vec<&str> = self.overrides.names().collect();
            let Some(privileged) = self.overrides.lookup(name) else {
                return Err(format!(
                    "overrides.{name} is not declared in spec.overrides (declared: {})",
                    if declared.is_empty() {
                        "none".to_owned()
                    } else {
                        declared.join(", ")
                    }
                ));
            };
            if !privileged
                && let Some(f) = PRIVILEGED_FIELDS
                    .iter()
                    .find(|f| field.split(['.', '[']).any(|seg| seg == **f))
            {
                return Err(format!(
                    "overrides.{name} may not reach {f}: mark the override privileged: true, \
                     with a rule that bounds it to an enumerated set"
                ));
            }
        }
        Ok(reads)
    }

    /// The entry feeding a Secret-fed value the template may read: one it names, or the first
    /// when it reads `values` as a whole (a loop or a lookup could reach any key).
    fn secret_read(&self, vars: &[String]) -> Option<&str> {
        if self.secrets.is_empty() {
            return None;
        }
        vars.iter().find_map(|v| {
            let mut parts = v.split('.');
            if parts.next() != Some("values") {
                return None;
            }
            match parts.next() {
                None => self.secrets.values().next(),
                Some(key) => self.secrets.get(key),
            }
            .map(String::as_str)
        })
    }
}

/// Checks the names in `set` are unique, returning the first repeated one.
pub(crate) fn first_duplicate<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let mut seen = HashSet::new();
    names.into_iter().find(|n| !seen.insert(*n))
}

/// Stable hash of what decides the injected content: sha256 over canonical JSON (object keys
/// sorted, no whitespace) of the policy name, template (with `spec.identity`'s volumes and mounts)
/// and values; 16 hex digits.
pub(crate) fn template_hash(
    name: &str,
    spec: &InjectionPolicySpec,
) -> Result<String, serde_json::Error> {
    let doc = serde_json::json!({
        "name": name,
        "template": serde_json::to_value(crate::identity::template(spec))?,
        "values": serde_json::to_value(&spec.values)?,
    });
    // Only when there are overrides, so that the hash of every policy without them (and of the
    // pods it injected) stays what it was.
    let mut doc = doc;
    if !spec.overrides.is_empty() {
        doc["overrides"] = serde_json::to_value(&spec.overrides)?;
    }
    let mut canonical = Vec::new();
    write_canonical(&doc, &mut canonical)?;
    let digest = Sha256::digest(&canonical);
    let mut hex = String::with_capacity(16);
    for b in &digest[..8] {
        hex.push_str(&format!("{b:02x}"));
    }
    Ok(hex)
}

fn write_canonical(v: &Value, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, k)?;
                out.push(b':');
                if let Some(item) = map.get(k) {
                    write_canonical(item, out)?;
                }
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out)?;
            }
            out.push(b']');
        }
        scalar => serde_json::to_writer(&mut *out, scalar)?,
    }
    Ok(())
}
