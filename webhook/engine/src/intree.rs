//! In-tree mode: a policy whose injection can be computed by the API server itself becomes the
//! CEL of a MutatingAdmissionPolicy (`patchType: JSONPatch`) that yields the same patch as the
//! planner does for a pod this policy has not injected yet.
//!
//! Only what is provably identical goes in-tree: strings rendered at compile time (they only read
//! `policy` and `values`), and strings whose `{{ … }}` expressions are plain references to the
//! namespace's name, labels or annotations or to the pod's own metadata, concatenated with
//! literal text. Anything else (a filter, a test, a condition, a loop, arithmetic, any other
//! field) keeps the webhook, and [`WebhookOnly`] names the field and the expression.
//!
//! The CEL mirrors [`crate::plan`] for a first injection: the injected init containers go before
//! the pod's own, containers and volumes after, env and volume mounts into every application
//! container; an item whose name the pod already holds is the author's and is kept; lists absent
//! from the pod are added whole; `splice.dev/status` gets this policy's entry written byte for
//! byte as the webhook writes it. A pod that already carries this policy's entry is left alone,
//! which makes the policy idempotent under reinvocation.

use std::fmt::Write as _;

use serde_json::Value;
use splice_crds::{Mode, Operation, ReinvocationPolicy, STATUS_ANNOTATION};

use super::CompiledPolicy;
use super::provenance::{Provenance, ProvenanceEntry};
use super::template::{Hole, Seg, TemplateItem, TemplateString};

/// Why a policy stays on the webhook: the first field whose expression CEL cannot reproduce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookOnly {
    /// The policy field (`spec.template.containers[0].env[1].value`, `spec.operations`).
    pub field: String,
    /// The template expression that keeps it on the webhook, when a template does.
    pub expression: Option<String>,
    pub reason: String,
}

impl std::fmt::Display for WebhookOnly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.expression {
            Some(e) => write!(f, "{}: {:?} {}", self.field, e, self.reason),
            None => write!(f, "{}: {}", self.field, self.reason),
        }
    }
}

impl std::error::Error for WebhookOnly {}

/// The mode a policy runs in, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModeDecision {
    pub requested: Mode,
    /// `Webhook` or `InTree`, never `Auto`.
    pub effective: Mode,
    /// The CEL the API server runs, when the policy runs in-tree.
    pub program: Option<InTreeProgram>,
    /// Why the webhook serves it, when the spec asked for `Auto` or `InTree`.
    pub webhook_only: Option<WebhookOnly>,
}

/// Decides the mode of the revision in force (`compiled`; `None` when nothing compiles, and
/// then nothing is served either way). The controller (its reconcile and the entries it plans)
/// and every offline command decide with this one function, so `splice explain` says what the
/// cluster does.
///
/// While a canary is open (`canary_open`, see [`crate::entry::open_canary`]) the policy serves
/// two revisions split between webhook entries, which one MutatingAdmissionPolicy cannot do: it
/// runs on the webhook until the promotion.
pub fn decide(
    requested: Mode,
    compiled: Option<&CompiledPolicy>,
    canary_open: bool,
) -> ModeDecision {
    let webhook = |webhook_only| ModeDecision {
        requested,
        effective: Mode::Webhook,
        program: None,
        webhook_only,
    };
    let compiled = match (requested, compiled) {
        (Mode::Webhook, _) | (_, None) => return webhook(None),
        (Mode::Auto | Mode::InTree, Some(c)) => c,
    };
    if canary_open {
        return webhook(Some(WebhookOnly {
            field: "spec.rollout.canary".into(),
            expression: None,
            reason: "an open canary serves two revisions, split between webhook entries; \
                     in-tree again once it is promoted"
                .into(),
        }));
    }
    match compiled.in_tree() {
        Ok(program) => ModeDecision {
            requested,
            effective: Mode::InTree,
            program: Some(program),
            webhook_only: None,
        },
        Err(why) => webhook(Some(why)),
    }
}

/// A named CEL expression of the MutatingAdmissionPolicy (`spec.variables`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CelVariable {
    pub name: String,
    pub expression: String,
}

/// The CEL program of a policy that runs in-tree: its variables and its JSONPatch expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InTreeProgram {
    pub variables: Vec<CelVariable>,
    pub patch: String,
}

impl InTreeProgram {
    /// The reinvocation policy the program runs under, whatever the spec asks: its patch for a
    /// pod that carries this policy's record is empty, so a second run could only cost. The API
    /// server reruns an `IfNeeded` policy whenever a later plugin changes the pod, which its own
    /// ServiceAccount plugin does on every create by mounting the token into the injected
    /// container (docs/performance.md).
    pub const REINVOCATION: ReinvocationPolicy = ReinvocationPolicy::Never;
}

impl ModeDecision {
    /// The reinvocation policy the API server runs the policy under: `asked` on the webhook,
    /// [`InTreeProgram::REINVOCATION`] in-tree.
    pub fn reinvocation(&self, asked: ReinvocationPolicy) -> ReinvocationPolicy {
        if self.program.is_some() {
            InTreeProgram::REINVOCATION
        } else {
            asked
        }
    }
}

impl CompiledPolicy {
    /// The policy as a MutatingAdmissionPolicy's CEL, or the first reason it needs the webhook.
    pub fn in_tree(&self) -> Result<InTreeProgram, WebhookOnly> {
        // A MutatingAdmissionPolicy's paramKind would read the data, but the API server's
        // parameter cache is known to serve stale or missing params (kubernetes/kubernetes
        // #141015, #141369) and records no version in the pod: the webhook keeps the data.
        if !self.spec.values_from.is_empty() {
            return Err(WebhookOnly {
                field: "spec.valuesFrom".into(),
                expression: None,
                reason: "values read from ConfigMaps and Secrets are served from every \
                         replica's watch, which only the webhook does"
                    .into(),
            });
        }
        if self.spec.identity.is_some() {
            return Err(WebhookOnly {
                field: "spec.identity".into(),
                expression: None,
                reason: "pod identity is injected by the webhook only: `identity.spiffeID` \
                         needs the run's trust domain, and the in-tree CEL is not proven equal \
                         to the webhook's patch for the identity volumes"
                    .into(),
            });
        }
        // The in-tree form could read the annotations through `object` and `namespaceObject`,
        // but a refusal needs a ValidatingAdmissionPolicy beside it, and a namespace value that
        // fails must fall back to the default without refusing: until both are built and proven
        // equal to the webhook, the webhook keeps overrides.
        if !self.spec.overrides.is_empty() {
            return Err(WebhookOnly {
                field: "spec.overrides".into(),
                expression: None,
                reason: "overrides are checked and refused by the webhook only: the in-tree form \
                         has no refusal of a pod whose annotation fails its rule"
                    .into(),
            });
        }
        if self.spec.operations.contains(&Operation::Update) {
            return Err(WebhookOnly {
                field: "spec.operations".into(),
                expression: None,
                reason: "UPDATE re-renders labels and annotations of an injected pod, which only \
                         the webhook does"
                    .into(),
            });
        }
        let t = &self.templates;
        let lists = [
            &t.init_containers,
            &t.containers,
            &t.volumes,
            &t.env_vars,
            &t.volume_mounts,
        ];
        let mut items: Vec<Vec<(String, String)>> = Vec::with_capacity(5);
        for list in lists {
            let mut out = Vec::with_capacity(list.len());
            for item in list {
                out.push(self.item(item)?);
            }
            items.push(out);
        }
        let mut it = items.into_iter();
        let mut next = || it.next().unwrap_or_default();
        let lists = Lists {
            init: next(),
            containers: next(),
            volumes: next(),
            env: next(),
            mounts: next(),
            labels: self.strings(&t.labels, "spec.template.labels", true)?,
            annotations: self.strings(&t.annotations, "spec.template.annotations", false)?,
        };
        Ok(program(&self.name, &self.hash, &lists))
    }

    /// One injected item: its key, and its value as a CEL literal.
    fn item(&self, item: &TemplateItem) -> Result<(String, String), WebhookOnly> {
        let Some(key) = item.static_key() else {
            let hole = item.holes().iter().find(|h| h.path.len() == 1);
            return Err(WebhookOnly {
                field: hole.map_or_else(|| item.field.clone(), |h| h.field.clone()),
                expression: hole.and_then(|h| self.templates.source(h)),
                reason: "a templated name is only known per request, and the record of what was \
                         injected is written by name"
                    .into(),
            });
        };
        let mut refs = Vec::with_capacity(item.holes().len());
        for hole in item.holes() {
            refs.push((hole.path.clone(), self.hole(hole)?));
        }
        Ok((key.to_owned(), literal(item.base(), &mut Vec::new(), &refs)))
    }

    /// Labels or annotations: (key, value as a CEL string expression), in key order.
    fn strings(
        &self,
        list: &[TemplateString],
        _field: &str,
        labels: bool,
    ) -> Result<Vec<(String, String)>, WebhookOnly> {
        let mut out = Vec::with_capacity(list.len());
        for s in list {
            let value = match (s.static_value(), s.hole()) {
                (Some(v), _) => cel_string(v),
                (None, Some(hole)) if labels => {
                    return Err(WebhookOnly {
                        field: hole.field.clone(),
                        expression: self.templates.source(hole),
                        reason: "a label value rendered per request must be checked as a label \
                                 value before it is written, which only the webhook does"
                            .into(),
                    });
                }
                (None, Some(hole)) => self.hole(hole)?,
                (None, None) => cel_string(""),
            };
            out.push((s.key.clone(), value));
        }
        Ok(out)
    }

    /// A string rendered per request, as a CEL concatenation; only plain references qualify.
    fn hole(&self, hole: &Hole) -> Result<String, WebhookOnly> {
        let source = self.templates.source(hole).unwrap_or_default();
        let statics = Statics {
            policy: &self.name,
            generation: self.generation,
            values: &self.spec.values,
        };
        to_cel(&source, &statics).map_err(|reason| WebhookOnly {
            field: hole.field.clone(),
            expression: Some(source.clone()),
            reason,
        })
    }
}

/// What a template reads that is fixed when the policy compiles: `policy` and `values`.
struct Statics<'a> {
    policy: &'a str,
    generation: i64,
    values: &'a std::collections::BTreeMap<String, String>,
}

/// The template `source` as a CEL string expression, or why it cannot be one.
fn to_cel(source: &str, statics: &Statics<'_>) -> Result<String, String> {
    let mut parts: Vec<String> = Vec::new();
    let mut rest = source;
    while !rest.is_empty() {
        let Some(open) = rest.find("{{") else {
            literal_text(rest, &mut parts)?;
            break;
        };
        literal_text(&rest[..open], &mut parts)?;
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| "an unterminated expression".to_owned())?;
        let expr = &after[..close];
        if expr.starts_with(['-', '+']) || expr.ends_with(['-', '+']) {
            return Err("whitespace control is not reproduced in CEL".into());
        }
        parts.push(reference(expr.trim(), statics)?);
        rest = &after[close + 2..];
    }
    Ok(if parts.is_empty() {
        cel_string("")
    } else {
        parts.join(" + ")
    })
}

fn literal_text(text: &str, parts: &mut Vec<String>) -> Result<(), String> {
    if text.contains("{%") || text.contains("{#") {
        return Err("a statement or comment (conditions, loops) is not reproduced in CEL".into());
    }
    if !text.is_empty() {
        parts.push(cel_string(text));
    }
    Ok(())
}

/// A plain reference (`namespace.name`, `namespace.labels.app`, `pod.metadata.labels["a/b"]`) as
/// the CEL that reads the same value from the admission request.
fn reference(expr: &str, statics: &Statics<'_>) -> Result<String, String> {
    let path = parse_path(expr).ok_or_else(|| {
        "uses more than a plain reference (a filter, a test, an operator or a call)".to_owned()
    })?;
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    match p.as_slice() {
        // `string()` types the value for the literal lists and maps around it (the API server's
        // CEL sees the metadata maps' values as dyn); on a string it is the identity, and a
        // missing key still fails the expression as an undefined value fails the template.
        ["namespace", "name"] => Ok("request.namespace".into()),
        // Constants: rendered here as the webhook renders them.
        ["policy", "name"] => Ok(cel_string(statics.policy)),
        ["policy", "generation"] => Ok(cel_string(&statics.generation.to_string())),
        ["values", key] => statics
            .values
            .get(*key)
            .map(|v| cel_string(v))
            .ok_or_else(|| format!("reads values.{key}, which is not defined")),
        ["namespace", map @ ("labels" | "annotations"), key] => Ok(format!(
            "string(namespaceObject.metadata.{map}[{}])",
            cel_string(key)
        )),
        [
            "pod",
            "metadata",
            field @ ("name" | "generateName" | "namespace"),
        ] => Ok(format!("string(object.metadata.{field})")),
        ["pod", "metadata", map @ ("labels" | "annotations"), key] => Ok(format!(
            "string(object.metadata.{map}[{}])",
            cel_string(key)
        )),
        _ => Err(format!(
            "reads {}, which the in-tree form does not read (it reads the namespace's name, \
             labels and annotations, the pod's own metadata, policy and values)",
            path.join(".")
        )),
    }
}

/// `a.b["c"].d` as its segments; `None` for anything but identifiers, dots and string subscripts.
fn parse_path(expr: &str) -> Option<Vec<String>> {
    let ident = |s: &str| -> Option<usize> {
        let n = s
            .bytes()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == b'_')
            .count();
        (n > 0 && !s.as_bytes()[0].is_ascii_digit()).then_some(n)
    };
    let mut out = Vec::new();
    let n = ident(expr)?;
    out.push(expr[..n].to_owned());
    let mut rest = &expr[n..];
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let n = ident(r)?;
            out.push(r[..n].to_owned());
            rest = &r[n..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let quote = r.chars().next().filter(|c| *c == '"' || *c == '\'')?;
            let body = &r[1..];
            let end = body.find(quote)?;
            let key = &body[..end];
            if key.contains('\\') {
                return None;
            }
            out.push(key.to_owned());
            rest = body[end + 1..].strip_prefix(']')?;
        } else {
            return None;
        }
    }
    Some(out)
}

/// A JSON value as a CEL literal: every map value and list element wrapped in `dyn()` so the
/// API server's homogeneous-literal check accepts mixed types; `refs` replace strings rendered
/// per request, by their path inside the item.
fn literal(v: &Value, path: &mut Vec<Seg>, refs: &[(Vec<Seg>, String)]) -> String {
    if let Some((_, cel)) = refs.iter().find(|(p, _)| p == path) {
        return cel.clone();
    }
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => i.to_string(),
            (None, Some(f)) => format!("{f:?}"),
            (None, None) => n.to_string(),
        },
        Value::String(s) => cel_string(s),
        Value::Array(items) => {
            let mut out = String::from("[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                path.push(Seg::Index(i));
                let _ = write!(out, "dyn({})", literal(item, path, refs));
                path.pop();
            }
            out.push(']');
            out
        }
        Value::Object(map) => {
            let mut out = String::from("{");
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                path.push(Seg::Key(k.clone()));
                let _ = write!(out, "{}: dyn({})", cel_string(k), literal(item, path, refs));
                path.pop();
            }
            out.push('}');
            out
        }
    }
}

/// A CEL string literal holding exactly `s`.
pub(crate) fn cel_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `s` as the JSON text serde_json writes for it (the provenance record's names).
fn json_text(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

/// A JSON Pointer segment (RFC 6901).
fn pointer_segment(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// The injected lists: (key, CEL literal) per item, in template order; labels and annotations
/// as (key, CEL string expression).
struct Lists {
    init: Vec<(String, String)>,
    containers: Vec<(String, String)>,
    volumes: Vec<(String, String)>,
    env: Vec<(String, String)>,
    mounts: Vec<(String, String)>,
    labels: Vec<(String, String)>,
    annotations: Vec<(String, String)>,
}

/// The `splice.dev/status` entry as CEL, part by part in the webhook's key order, and the
/// condition under which every recorded list holds all its items.
struct RecordParts {
    parts: Vec<String>,
    full: Vec<String>,
}

impl RecordParts {
    /// The record's list `key`: the names `names` (a CEL list of JSON texts) of the items in
    /// `new` (a CEL list of the `n` items, less those the pod already had).
    fn list(&mut self, key: &str, new: &str, names: &str, n: usize) {
        self.parts.push(format!(
            "(size({new}) == 0 ? \"\" : \",\\\"{key}\\\":[\" + {names}.join(\",\") + \"]\")"
        ));
        self.full.push(format!("size({new}) == {n}"));
    }
}

fn list_of(items: impl IntoIterator<Item = String>) -> String {
    let v: Vec<String> = items.into_iter().collect();
    format!("[{}]", v.join(", "))
}

/// A list's items as one CEL list of `[key, key as JSON text (for the record), value]`.
fn triples(items: &[(String, String)]) -> String {
    list_of(items.iter().map(|(k, v)| {
        format!(
            "[dyn({}), dyn({}), dyn({v})]",
            cel_string(k),
            cel_string(&json_text(k))
        )
    }))
}

fn var(name: &str, expression: String) -> CelVariable {
    CelVariable {
        name: name.to_owned(),
        expression,
    }
}

/// The variables and the patch expression. Variable names are short because they are repeated.
///
/// The API server evaluates each variable a request reads as a program of its own, at a cost of
/// its own: constants are folded into the variable that reads them, and a variable read once is
/// written where it is read (docs/performance.md, "The derived MutatingAdmissionPolicy").
fn program(policy: &str, hash: &str, l: &Lists) -> InTreeProgram {
    let (labels, annotations) = (&l.labels[..], &l.annotations[..]);
    let status_key = cel_string(STATUS_ANNOTATION);
    let mut vars = vec![var(
        "status",
        format!("object.metadata.?annotations[?{status_key}].orValue(\"\")"),
    )];
    if !l.init.is_empty() || !l.containers.is_empty() {
        // Names of the pod's own containers and init containers: one name space.
        vars.push(var(
            "own",
            "object.spec.?initContainers.orValue([]).map(c, c.name) + \
             object.spec.?containers.orValue([]).map(c, c.name)"
                .into(),
        ));
    }
    let mut ops: Vec<String> = Vec::new();
    let mut entry = RecordParts {
        parts: vec![cel_string(&format!("{{\"hash\":{}", json_text(hash)))],
        full: vec!["variables.status == \"\"".to_owned()],
    };

    // Labels and annotations the pod lacks (a key it holds is the author's and is kept). Their
    // values are read per request, and only for the keys the pod lacks.
    let meta = |what: &str, items: &[(String, String)], vars: &mut Vec<CelVariable>| {
        let idx = format!("{what}Idx");
        vars.push(var(
            &format!("{what}Keys"),
            list_of(items.iter().map(|(k, _)| cel_string(k))),
        ));
        vars.push(var(
            &idx,
            format!(
                "lists.range({}).filter(k, !(variables.{what}Keys[k] in object.metadata.?{what}.orValue({{}})))",
                items.len()
            ),
        ));
        idx
    };
    if !labels.is_empty() {
        let idx = meta("labels", labels, &mut vars);
        vars.push(var(
            "labelsPaths",
            list_of(
                labels
                    .iter()
                    .map(|(k, _)| cel_string(&format!("/metadata/labels/{}", pointer_segment(k)))),
            ),
        ));
        vars.push(var(
            "labelsValues",
            list_of(labels.iter().map(|(_, v)| v.clone())),
        ));
        let whole = format!(
            "{{{}}}",
            labels
                .iter()
                .map(|(k, v)| format!("{}: {v}", cel_string(k)))
                .collect::<Vec<_>>()
                .join(", ")
        );
        ops.push(format!(
            "(has(object.metadata.labels) ? variables.{idx}.map(k, JSONPatch{{op: \"add\", path: variables.labelsPaths[k], value: variables.labelsValues[k]}}) : [JSONPatch{{op: \"add\", path: \"/metadata/labels\", value: {whole}}}])"
        ));
    }
    let ann_idx = (!annotations.is_empty()).then(|| {
        let idx = meta("annotations", annotations, &mut vars);
        vars.push(var(
            "annotationsPaths",
            list_of(annotations.iter().map(|(k, _)| {
                cel_string(&format!("/metadata/annotations/{}", pointer_segment(k)))
            })),
        ));
        vars.push(var(
            "annotationsValues",
            list_of(annotations.iter().map(|(_, v)| v.clone())),
        ));
        idx
    });

    // Spec: init containers first, before the pod's own, in template order.
    if !l.init.is_empty() {
        vars.push(var(
            "initNew",
            format!("{}.filter(c, !(c[0] in variables.own))", triples(&l.init)),
        ));
        ops.push(
            "(has(object.spec.initContainers) \
             ? variables.initNew.transformList(p, c, JSONPatch{op: \"add\", path: \"/spec/initContainers/\" + string(p), value: c[2]}) \
             : (size(variables.initNew) == 0 ? [] : [JSONPatch{op: \"add\", path: \"/spec/initContainers\", value: variables.initNew.map(c, c[2])}]))"
                .into(),
        );
        entry.list(
            "initContainers",
            "variables.initNew",
            "variables.initNew.map(c, c[1])",
            l.init.len(),
        );
    }
    // Env and volume mounts go into every application container: the pod's own, less those
    // another Splice policy recorded as injected.
    let per_container = [
        ("env", "name", &l.env),
        ("volumeMounts", "mountPath", &l.mounts),
    ];
    if per_container.iter().any(|(_, _, items)| !items.is_empty()) {
        vars.push(var(
            "others",
            format!(
                "variables.status.findAll({}).map(m, m.substring(m.indexOf(\"[\") + 1, size(m) - 1).split(\",\").map(n, n.substring(1, size(n) - 1))).flatten()",
                cel_string("\"(containers|initContainers)\":\\[[^\\]]+\\]")
            ),
        ));
        vars.push(var(
            "apps",
            "lists.range(size(object.spec.?containers.orValue([]))).filter(i, !(object.spec.containers[i].name in variables.others))"
                .into(),
        ));
    }
    let mut container_ops = Vec::new();
    let mut container_entries = Vec::new();
    for (list, key, items) in per_container {
        if items.is_empty() {
            continue;
        }
        // Read once per application container, so a variable: built once.
        vars.push(var(list, triples(items)));
        // Per application container (by position in `apps`), the items its author did not
        // already write under the same key.
        vars.push(var(
            &format!("{list}Keep"),
            format!(
                "variables.apps.map(i, variables.{list}.filter(c, !object.spec.containers[i].?{list}.orValue([]).exists(e, e.{key} == c[0])))"
            ),
        ));
        container_ops.push(format!(
            "lists.range(size(variables.apps)).map(a, has(object.spec.containers[variables.apps[a]].{list}) \
             ? variables.{list}Keep[a].map(c, JSONPatch{{op: \"add\", path: \"/spec/containers/\" + string(variables.apps[a]) + \"/{list}/-\", value: c[2]}}) \
             : (size(variables.{list}Keep[a]) == 0 ? [] : [JSONPatch{{op: \"add\", path: \"/spec/containers/\" + string(variables.apps[a]) + \"/{list}\", value: variables.{list}Keep[a].map(c, c[2])}}])).flatten()"
        ));
        container_entries.push(format!(
            "[lists.range(size(variables.apps)).filter(a, size(variables.{list}Keep[a]) > 0).sortBy(a, object.spec.containers[variables.apps[a]].name)].map(s, size(s) == 0 ? \"\" : \",\\\"{list}\\\":{{\" + s.map(a, \"\\\"\" + object.spec.containers[variables.apps[a]].name + \"\\\":[\" + variables.{list}Keep[a].map(c, c[1]).join(\",\") + \"]\").join(\",\") + \"}}\")[0]"
        ));
    }
    ops.extend(container_ops);
    // Containers and volumes are appended after the pod's own.
    for (list, items, taken) in [
        ("containers", &l.containers, "variables.own"),
        (
            "volumes",
            &l.volumes,
            "object.spec.?volumes.orValue([]).map(v, v.name)",
        ),
    ] {
        if items.is_empty() {
            continue;
        }
        vars.push(var(
            &format!("{list}New"),
            format!("{}.filter(c, !(c[0] in {taken}))", triples(items)),
        ));
        ops.push(format!(
            "(has(object.spec.{list}) \
             ? variables.{list}New.map(c, JSONPatch{{op: \"add\", path: \"/spec/{list}/-\", value: c[2]}}) \
             : (size(variables.{list}New) == 0 ? [] : [JSONPatch{{op: \"add\", path: \"/spec/{list}\", value: variables.{list}New.map(c, c[2])}}]))"
        ));
        // The record, in the webhook's key order: hash, initContainers, containers, volumes,
        // env, volumeMounts, labels, annotations.
        let new = format!("variables.{list}New");
        entry.list(list, &new, &format!("{new}.map(c, c[1])"), items.len());
    }
    entry.parts.extend(container_entries);
    for (what, items) in [("labels", labels), ("annotations", annotations)] {
        if items.is_empty() {
            continue;
        }
        vars.push(var(
            &format!("{what}Json"),
            list_of(items.iter().map(|(k, _)| cel_string(&json_text(k)))),
        ));
        entry.list(
            what,
            &format!("variables.{what}Idx"),
            &format!("variables.{what}Idx.map(k, variables.{what}Json[k])"),
            items.len(),
        );
    }
    entry.parts.push(cel_string("}"));
    // The status annotation: this policy's entry alone, or appended to the other policies'
    // entries when the annotation holds a record in Splice's own compact form (what the
    // webhook's ordered map re-serializes to the same text); anything else is replaced, as the
    // webhook replaces an unreadable record.
    let built = format!(
        "(variables.status.matches({re}) ? variables.status.substring(0, size(variables.status) - 1) + {sep} : {own}) + {entry} + \"}}\"",
        re = cel_string(RECORD_RE),
        sep = cel_string(&format!(",{}:", json_text(policy))),
        own = cel_string(&format!("{{{}:", json_text(policy))),
        entry = entry.parts.join(" + "),
    );
    let record = match first_record(policy, hash, l) {
        Some(text) => format!(
            "{} ? {} : {built}",
            entry.full.join(" && "),
            cel_string(&text)
        ),
        None => built,
    };
    vars.push(var("record", record));
    let whole_annotations = {
        let mut fields: Vec<String> = annotations
            .iter()
            .map(|(k, v)| format!("{}: {v}", cel_string(k)))
            .collect();
        fields.push(format!("{status_key}: variables.record"));
        format!("{{{}}}", fields.join(", "))
    };
    let add_missing = ann_idx.map(|idx| {
        format!(
            "variables.{idx}.map(k, JSONPatch{{op: \"add\", path: variables.annotationsPaths[k], value: variables.annotationsValues[k]}}) + "
        )
    });
    let status_path = cel_string(&format!(
        "/metadata/annotations/{}",
        pointer_segment(STATUS_ANNOTATION)
    ));
    ops.insert(
        usize::from(!labels.is_empty()),
        format!(
            "(has(object.metadata.annotations) ? {add}[JSONPatch{{op: ({status_key} in object.metadata.annotations) ? \"replace\" : \"add\", path: {status_path}, value: variables.record}}] : [JSONPatch{{op: \"add\", path: \"/metadata/annotations\", value: {whole_annotations}}}])",
            add = add_missing.unwrap_or_default(),
        ),
    );
    // The webhook's record of this policy is there (a reinvocation, or a pod copied from an
    // injected one): this policy has nothing to add.
    let patch = format!(
        "variables.status.contains({mine}) ? [] : {ops}",
        mine = cel_string(&format!("{}:{{\"hash\":", json_text(policy))),
        ops = ops.join(" + ")
    );
    InTreeProgram {
        variables: vars,
        patch,
    }
}

/// The commonest record, written by the webhook's own serializer: a pod with no record yet that
/// lacks every injected name and key (the entry's `full` condition) gets exactly this policy's
/// whole entry, so the API server builds no string for it. `None` with env or volume mounts,
/// whose entry names the pod's own containers.
fn first_record(policy: &str, hash: &str, l: &Lists) -> Option<String> {
    if !l.env.is_empty() || !l.mounts.is_empty() {
        return None;
    }
    let names = |items: &[(String, String)]| items.iter().map(|(k, _)| k.clone()).collect();
    let entry = ProvenanceEntry {
        hash: hash.to_owned(),
        init_containers: names(&l.init),
        containers: names(&l.containers),
        volumes: names(&l.volumes),
        labels: names(&l.labels),
        annotations: names(&l.annotations),
        ..ProvenanceEntry::default()
    };
    serde_json::to_string(&Provenance::from([(policy.to_owned(), entry)])).ok()
}

/// A `splice.dev/status` record with at least one entry, each as Splice writes it: a name, then
/// an object of strings, lists of strings and maps of lists of strings, compact.
const RECORD_RE: &str =
    r#"^\{"[^"\\]+":\{[^{}]*(\{[^{}]*\}[^{}]*)*\}(,"[^"\\]+":\{[^{}]*(\{[^{}]*\}[^{}]*)*\})*\}$"#;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use splice_crds::InjectionPolicySpec;

    fn compiled(yaml: &str) -> CompiledPolicy {
        let spec: InjectionPolicySpec = serde_yaml::from_str(yaml).unwrap();
        CompiledPolicy::compile("mesh", 1, &spec).unwrap()
    }

    /// The expression of the program's variable `name`.
    fn variable<'a>(program: &'a InTreeProgram, name: &str) -> &'a str {
        &program
            .variables
            .iter()
            .find(|v| v.name == name)
            .unwrap()
            .expression
    }

    fn to_cel(source: &str) -> Result<String, String> {
        let values = std::collections::BTreeMap::from([("img".to_owned(), "p:1".to_owned())]);
        super::to_cel(
            source,
            &Statics {
                policy: "mesh",
                generation: 3,
                values: &values,
            },
        )
    }

    #[test]
    fn plain_references_become_the_cel_that_reads_the_same_value() {
        assert_eq!(to_cel("{{ namespace.name }}").unwrap(), "request.namespace");
        assert_eq!(
            to_cel(
                "{{ policy.name }}/{{ values.img }}@{{ policy.generation }} in {{ namespace.name }}"
            )
            .unwrap(),
            "\"mesh\" + \"/\" + \"p:1\" + \"@\" + \"3\" + \" in \" + request.namespace"
        );
        assert_eq!(
            to_cel("a-{{namespace.labels[\"team/x\"]}}-b").unwrap(),
            "\"a-\" + string(namespaceObject.metadata.labels[\"team/x\"]) + \"-b\""
        );
        assert_eq!(
            to_cel("{{ pod.metadata.annotations.owner }}").unwrap(),
            "string(object.metadata.annotations[\"owner\"])"
        );
    }

    #[test]
    fn anything_but_a_plain_reference_is_refused_with_a_reason() {
        for source in [
            "{{ namespace.name | upper }}",
            "{{ namespace.name ~ 'x' }}",
            "{% if pod.metadata.name %}x{% endif %}",
            "{{- namespace.name }}",
            "{{ pod.spec.containers[0].name }}",
            "{{ namespace.labels }}",
        ] {
            assert!(to_cel(source).is_err(), "{source}");
        }
    }

    #[test]
    fn cel_strings_escape_quotes_backslashes_and_control_characters() {
        assert_eq!(cel_string("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
        assert_eq!(cel_string("é"), "\"é\"");
    }

    #[test]
    fn a_literal_wraps_every_member_in_dyn_and_substitutes_the_references() {
        let v = serde_json::json!({"name": "x", "ports": [{"containerPort": 80}], "env": [{"value": "t"}]});
        let refs = vec![(
            vec![
                Seg::Key("env".into()),
                Seg::Index(0),
                Seg::Key("value".into()),
            ],
            "request.namespace".to_owned(),
        )];
        assert_eq!(
            literal(&v, &mut Vec::new(), &refs),
            "{\"name\": dyn(\"x\"), \"ports\": dyn([dyn({\"containerPort\": dyn(80)})]), \"env\": dyn([dyn({\"value\": dyn(request.namespace)})])}"
        );
    }

    #[test]
    fn a_policy_of_plain_references_runs_in_tree_under_auto_and_on_the_webhook_when_asked() {
        let c = compiled(
            "template: {env: [{name: NS, value: \"ns={{ namespace.name }}\"}], \
             annotations: {team: \"{{ namespace.labels.team }}\"}}",
        );
        let auto = decide(Mode::Auto, Some(&c), false);
        assert_eq!(auto.effective, Mode::InTree);
        assert!(auto.program.as_ref().unwrap().patch.contains("JSONPatch"));
        assert_eq!(auto.webhook_only, None);
        let asked = decide(Mode::Webhook, Some(&c), false);
        assert_eq!(
            (asked.effective, asked.program, asked.webhook_only),
            (Mode::Webhook, None, None)
        );
    }

    #[test]
    fn a_filter_keeps_the_webhook_and_the_reason_names_the_field_and_the_expression() {
        let c = compiled(
            "template: {containers: [{name: p, image: i, env: [{name: X, value: \"{{ namespace.name | upper }}\"}]}]}",
        );
        let d = decide(Mode::Auto, Some(&c), false);
        assert_eq!(d.effective, Mode::Webhook);
        let why = d.webhook_only.unwrap().to_string();
        assert!(
            why.contains("spec.template.containers[0].env[0].value"),
            "{why}"
        );
        assert!(why.contains("{{ namespace.name | upper }}"), "{why}");
    }

    #[test]
    fn an_open_canary_keeps_an_auto_or_in_tree_policy_on_the_webhook_and_says_so() {
        let c = compiled("template: {labels: {a: b}}");
        for requested in [Mode::Auto, Mode::InTree] {
            let d = decide(requested, Some(&c), true);
            assert_eq!((d.requested, d.effective), (requested, Mode::Webhook));
            assert_eq!(d.program, None);
            let why = d.webhook_only.unwrap();
            assert_eq!(why.field, "spec.rollout.canary");
            assert!(
                why.reason.contains("in-tree again once it is promoted"),
                "{why}"
            );
        }
        // Asked for the webhook, the canary is no reason: it was asked for.
        assert_eq!(decide(Mode::Webhook, Some(&c), true).webhook_only, None);
    }

    #[test]
    fn nothing_in_force_is_no_mode_but_the_webhook_with_no_reason() {
        let d = decide(Mode::InTree, None, false);
        assert_eq!(
            (d.effective, d.program, d.webhook_only),
            (Mode::Webhook, None, None)
        );
    }

    #[test]
    fn update_templated_names_and_templated_label_values_keep_the_webhook() {
        let update = compiled("operations: [CREATE, UPDATE]\ntemplate: {labels: {a: b}}");
        assert_eq!(update.in_tree().unwrap_err().field, "spec.operations");
        let name =
            compiled("template: {containers: [{name: \"{{ pod.metadata.name }}-x\", image: i}]}");
        assert_eq!(
            name.in_tree().unwrap_err().field,
            "spec.template.containers[0].name"
        );
        let label = compiled("template: {labels: {ns: \"{{ namespace.name }}\"}}");
        let why = label.in_tree().unwrap_err();
        assert_eq!(why.field, "spec.template.labels.ns");
        assert_eq!(why.expression.as_deref(), Some("{{ namespace.name }}"));
    }

    #[test]
    fn the_record_is_built_in_the_webhooks_key_order_and_named_for_the_policy() {
        let p = compiled(
            "template: {initContainers: [{name: i, image: x}], containers: [{name: c, image: x}], \
             volumes: [{name: v, emptyDir: {}}], env: [{name: E, value: x}], \
             labels: {l: x}, annotations: {a: x}}",
        );
        let program = p.in_tree().unwrap();
        let entry = variable(&program, "record");
        let order = [
            "hash",
            "initContainers",
            "containers",
            "volumes",
            "env",
            "labels",
            "annotations",
        ];
        let at: Vec<usize> = order
            .iter()
            .map(|k| entry.find(&format!("\\\"{k}\\\"")).unwrap())
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{entry}");
        let mine = program.patch.split(" ? [] : ").next().unwrap();
        assert!(mine.contains("\\\"mesh\\\":{\\\"hash\\\":"), "{mine}");
    }

    #[test]
    fn a_fresh_pods_record_is_the_webhooks_own_text_and_env_keeps_it_built() {
        let p = compiled(
            "template: {containers: [{name: c, image: x}], volumes: [{name: v, emptyDir: {}}], \
             labels: {l: x}}",
        );
        let program = p.in_tree().unwrap();
        let record = variable(&program, "record");
        let text = format!(
            "{{\"mesh\":{{\"hash\":\"{}\",\"containers\":[\"c\"],\"volumes\":[\"v\"],\"labels\":[\"l\"]}}}}",
            p.template_hash()
        );
        let fresh = format!(
            "variables.status == \"\" && size(variables.containersNew) == 1 && \
             size(variables.volumesNew) == 1 && size(variables.labelsIdx) == 1 ? {} : ",
            cel_string(&text)
        );
        assert!(record.starts_with(&fresh), "{record}");
        // Env names the pod's own containers in the record: always built.
        let env =
            compiled("template: {containers: [{name: c, image: x}], env: [{name: E, value: x}]}");
        let program = env.in_tree().unwrap();
        let record = variable(&program, "record");
        assert!(record.starts_with("(variables.status.matches("), "{record}");
    }
}
