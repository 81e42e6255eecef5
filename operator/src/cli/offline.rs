//! Shared by the offline subcommands (`inject`, `simulate`): reading policy and manifest files,
//! checking policies the way the API server would at apply time, and replaying the API server's
//! mutating chain over one pod or pod template with the webhook's own engine.
//!
//! Everything here reports bad input as one [`InputError`] naming the file, the document and the
//! field, so a caller can print a single line and exit 2 without having written anything.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;
use splice_crds::{
    InjectionPolicySpec, NAMESPACE_NAME_LABEL, Operation, ReinvocationPolicy, StableRevision,
};
use splice_engine::entry::{
    Member, MemberFailure, Plan, left_out_warning, member_failure, open_canary,
};
use splice_engine::{
    self, CompiledPolicy, DataSources, Decision, EngineError, Exclusions, ModeDecision,
    NamespaceContext, Pod, PodRequest, Selection, SkipReason, SourceKind, SourceRef,
    ValuesFromError, intree, values_from,
};

/// The API group and kind a policy document must declare.
const POLICY_API_VERSION: &str = "splice.dev/v1alpha1";
const POLICY_KIND: &str = "InjectionPolicy";

/// The namespace Splice is installed into by `deploy/`; pods there are never injected.
pub(crate) const DEFAULT_SPLICE_NAMESPACE: &str = "splice-system";

/// One problem with the user's input, located as precisely as we can.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InputError {
    pub file: String,
    /// 1-based index of the YAML document in `file`.
    pub document: Option<usize>,
    /// What the document is, when known (`Deployment default/web`, `policy "mesh"`).
    pub subject: Option<String>,
    /// Dotted field path inside the document (`spec.timeoutSeconds`).
    pub field: Option<String>,
    pub message: String,
}

impl InputError {
    pub fn file(file: &str, message: impl Into<String>) -> Self {
        InputError {
            file: file.to_owned(),
            document: None,
            subject: None,
            field: None,
            message: message.into(),
        }
    }

    pub fn document(file: &str, document: usize, message: impl Into<String>) -> Self {
        InputError {
            document: Some(document),
            ..InputError::file(file, message)
        }
    }

    pub fn with_subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(document) = self.document {
            write!(f, ": document {document}")?;
        }
        if let Some(subject) = &self.subject {
            write!(f, " ({subject})")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for InputError {}

/// A file given on the command line, read whole.
pub(crate) struct Source {
    /// How errors name it: the path as given, or `<stdin>` for `-`.
    pub name: String,
    pub text: String,
}

impl Source {
    pub fn read(path: &Path) -> Result<Source, InputError> {
        if path == Path::new("-") {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| InputError::file("<stdin>", format!("cannot read: {e}")))?;
            return Ok(Source {
                name: "<stdin>".to_owned(),
                text,
            });
        }
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| InputError::file(&name, format!("cannot read: {e}")))?;
        Ok(Source { name, text })
    }
}

/// One non-empty YAML document of a file.
pub(crate) struct Document {
    /// 1-based position in the file, counting empty documents too, so it matches what a reader
    /// counts by eye between `---` separators.
    pub index: usize,
    pub value: serde_yaml::Value,
}

/// Splits a multi-document YAML (or JSON) file. Empty documents are dropped, as kubectl does; the
/// first syntax error stops everything, naming the document it is in.
pub(crate) fn documents(source: &Source) -> Result<Vec<Document>, InputError> {
    let mut out = Vec::new();
    for (i, de) in serde_yaml::Deserializer::from_str(&source.text).enumerate() {
        let index = i + 1;
        let value = serde_yaml::Value::deserialize(de)
            .map_err(|e| InputError::document(&source.name, index, format!("invalid YAML: {e}")))?;
        if !value.is_null() {
            out.push(Document { index, value });
        }
    }
    Ok(out)
}

/// Converts a YAML document to JSON, the form the engine works on. Keys that are not strings are
/// stringified (as the Kubernetes YAML decoder does); anything JSON cannot hold is an error.
pub(crate) fn to_json(value: &serde_yaml::Value) -> Result<Value, String> {
    serde_json::to_value(value).map_err(|e| format!("cannot be represented as JSON: {e}"))
}

/// Drops paused policies: a paused policy has no webhook configuration, so the API server never
/// calls it. Returns their names, for a note to the user.
pub(crate) fn without_paused(policies: &mut Vec<LoadedPolicy>) -> Vec<String> {
    let paused = policies
        .iter()
        .filter(|p| p.compiled.spec().paused)
        .map(|p| p.name.clone())
        .collect();
    policies.retain(|p| !p.compiled.spec().paused);
    paused
}

/// A policy read from a file, checked and compiled.
pub(crate) struct LoadedPolicy {
    pub name: String,
    /// Where it was read, as errors name it: `policies.yaml: document 2 (policy "mesh")`.
    pub origin: String,
    pub reinvocation: ReinvocationPolicy,
    pub compiled: CompiledPolicy,
    /// The mode the cluster serves it in, decided as the controller does: on the revision in
    /// force, with its open canary (from the status of a policy read from the cluster).
    pub mode: ModeDecision,
    /// The file and document it was read from, for errors about its `valuesFrom`.
    pub file: String,
    pub document: usize,
}

/// Reads every policy in `paths` (files, `-`, or directories of `*.yaml`/`*.yml`/`*.json`), checks
/// them as the API server would on apply, and compiles them. Returns them in name order, the order
/// the API server calls their webhooks in.
pub(crate) fn load_policies(paths: &[PathBuf]) -> Result<Vec<LoadedPolicy>, InputError> {
    load_policies_at(paths, Revision::InForce)
}

/// Like [`load_policies`], each policy at `revision`.
pub(crate) fn load_policies_at(
    paths: &[PathBuf],
    revision: Revision,
) -> Result<Vec<LoadedPolicy>, InputError> {
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut policies = Vec::new();
    for path in expand_paths(paths)? {
        let source = Source::read(&path)?;
        let docs = documents(&source)?;
        if docs.is_empty() {
            return Err(InputError::file(
                &source.name,
                "holds no InjectionPolicy document",
            ));
        }
        for doc in docs {
            let policy = load_policy(&source.name, &doc, revision)?;
            let here = format!("{}: document {}", source.name, doc.index);
            if let Some(first) = seen.insert(policy.name.clone(), here) {
                return Err(
                    InputError::document(&source.name, doc.index, "duplicate policy name")
                        .with_field("metadata.name")
                        .with_subject(format!(
                            "policy \"{}\", first defined in {first}",
                            policy.name
                        )),
                );
            }
            policies.push(policy);
        }
    }
    policies.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(policies)
}

fn expand_paths(paths: &[PathBuf]) -> Result<Vec<PathBuf>, InputError> {
    let mut out = Vec::new();
    for path in paths {
        if !path.is_dir() {
            out.push(path.clone());
            continue;
        }
        let name = path.display().to_string();
        let entries = std::fs::read_dir(path)
            .map_err(|e| InputError::file(&name, format!("cannot list: {e}")))?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| InputError::file(&name, format!("cannot list: {e}")))?;
            let file = entry.path();
            let wanted = file
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
            if wanted && file.is_file() {
                files.push(file);
            }
        }
        if files.is_empty() {
            return Err(InputError::file(
                &name,
                "holds no *.yaml, *.yml or *.json file",
            ));
        }
        files.sort();
        out.extend(files);
    }
    Ok(out)
}

/// The parts of a policy document besides `spec`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PolicyMetadata {
    name: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
}

fn load_policy(file: &str, doc: &Document, revision: Revision) -> Result<LoadedPolicy, InputError> {
    let at = |message: String| InputError::document(file, doc.index, message);
    let map = doc
        .value
        .as_mapping()
        .ok_or_else(|| at("expected an InjectionPolicy object (a YAML mapping)".to_owned()))?;
    let text_field = |key: &str| map.get(key).and_then(|v| v.as_str());

    let kind = text_field("kind")
        .ok_or_else(|| at("missing or not a string".to_owned()).with_field("kind"))?;
    let api_version = text_field("apiVersion")
        .ok_or_else(|| at("missing or not a string".to_owned()).with_field("apiVersion"))?;
    if kind != POLICY_KIND {
        return Err(at(format!(
            "unknown kind {kind:?} in a policy file (expected {POLICY_KIND})"
        ))
        .with_field("kind"));
    }
    if api_version != POLICY_API_VERSION {
        return Err(at(format!(
            "unsupported apiVersion {api_version:?} (expected {POLICY_API_VERSION})"
        ))
        .with_field("apiVersion"));
    }
    for key in map.keys() {
        let known = key
            .as_str()
            .is_some_and(|k| matches!(k, "apiVersion" | "kind" | "metadata" | "spec" | "status"));
        if !known {
            return Err(at("unknown field".to_owned()).with_field(yaml_key(key)));
        }
    }

    let metadata: PolicyMetadata = deserialize_located(
        map.get("metadata")
            .cloned()
            .unwrap_or(serde_yaml::Value::Null),
        "metadata",
        false,
    )
    .map_err(|(field, message)| at(message).with_field(field))?;
    let name = metadata
        .name
        .ok_or_else(|| at("missing".to_owned()).with_field("metadata.name"))?;
    if let Err(problem) = check_object_name(&name) {
        return Err(at(problem).with_field("metadata.name"));
    }
    let at = |message: String| at(message).with_subject(format!("policy \"{name}\""));

    // Read as the API server stores it (nulls pruned, defaults in), so both accept the same.
    let object = to_json(&doc.value).map_err(at)?;
    let spec_value = splice_crds::as_admitted(&object)
        .get("spec")
        .cloned()
        .unwrap_or_else(|| Value::Object(serde_json::Map::new()));
    let spec: InjectionPolicySpec = deserialize_located(spec_value, "spec", true)
        .map_err(|(field, message)| at(message).with_field(field))?;

    // A policy read from a file has never been through the API server, so it has no generation;
    // 1 is what the API server gives a freshly created object.
    let generation = metadata.generation.unwrap_or(1);
    // Compile errors name the policy and the template field themselves. The compiler goes before
    // the CRD's rules: where both refuse (two injected containers sharing a name), it names the
    // item, where the CEL rule names only the template.
    let compiled = CompiledPolicy::compile(&name, generation, &spec)
        .map_err(|e| InputError::document(file, doc.index, e.to_string()))?;
    // What the API server refuses at apply time, from the CRD's own schema and CEL rules.
    if let Some(v) = splice_crds::validate_policy(&object).into_iter().next() {
        return Err(at(v.message).with_field(v.field));
    }
    // As Splice's validating webhook refuses it at apply.
    if spec.mode == splice_crds::Mode::InTree
        && let Err(why) = compiled.in_tree()
    {
        return Err(at(format!(
            "spec.mode is InTree, but {}: {}",
            why.expression.as_deref().unwrap_or("this field"),
            why.reason
        ))
        .with_field(why.field));
    }
    let has_canary = spec.rollout.as_ref().is_some_and(|r| r.canary.is_some());
    // Read only where something needs it, so a status nothing reads is never refused.
    let stable = if has_canary || revision == Revision::Promoted {
        recorded_stable(&object).map_err(|message| at(message).with_field(STABLE_FIELD))?
    } else {
        None
    };
    let canary_open = open_canary(&spec, stable.as_ref(), compiled.template_hash()).is_some();
    let mode = intree::decide(spec.mode, Some(&compiled), canary_open);
    let compiled = match revision {
        Revision::InForce => compiled,
        Revision::Promoted => promoted(&name, has_canary, stable, compiled)
            .map_err(|message| at(message).with_field(STABLE_FIELD))?,
    };
    Ok(LoadedPolicy {
        origin: format!("{file}: document {} (policy \"{name}\")", doc.index),
        name,
        reinvocation: mode.reinvocation(spec.reinvocation_policy),
        compiled,
        mode,
        file: file.to_owned(),
        document: doc.index,
    })
}

/// Where a policy read from the cluster records its promoted revision.
const STABLE_FIELD: &str = "status.rollout.stable";

/// The promoted revision a policy document records, if any.
fn recorded_stable(object: &Value) -> Result<Option<StableRevision>, String> {
    object
        .pointer("/status/rollout/stable")
        .map(|v| serde_json::from_value(v.clone()))
        .transpose()
        .map_err(|e| e.to_string())
}

/// The promoted revision of a policy read from a file: its `status.rollout.stable`, else the spec
/// itself when the policy has no canary (then both are the same).
fn promoted(
    name: &str,
    has_canary: bool,
    stable: Option<StableRevision>,
    in_force: CompiledPolicy,
) -> Result<CompiledPolicy, String> {
    let Some(stable) = stable else {
        if has_canary {
            return Err(
                "--revision promoted: no promoted revision recorded; read the policy from the \
                 cluster (kubectl get injectionpolicy NAME -o yaml) to include its status"
                    .to_owned(),
            );
        }
        return Ok(in_force);
    };
    let spec: InjectionPolicySpec =
        serde_json::from_value(stable.spec).map_err(|e| e.to_string())?;
    CompiledPolicy::compile(name, stable.generation, &spec).map_err(|e| e.to_string())
}

fn yaml_key(key: &serde_yaml::Value) -> String {
    match key {
        serde_yaml::Value::String(s) => s.clone(),
        other => serde_yaml::to_string(other)
            .map(|s| s.trim_end().to_owned())
            .unwrap_or_else(|_| "?".to_owned()),
    }
}

/// Deserializes `value` into `T`, and on failure returns the dotted path of the offending field
/// (prefixed with `root`). With `strict`, a field `T` does not know is an error too, as with
/// `kubectl apply`'s strict field validation: a typo must not silently drop part of a policy.
fn deserialize_located<'de, T: Deserialize<'de>, D: serde::Deserializer<'de>>(
    value: D,
    root: &str,
    strict: bool,
) -> Result<T, (String, String)> {
    let mut unknown: Vec<String> = Vec::new();
    let mut record = |path: serde_ignored::Path<'_>| unknown.push(ignored_path(&path));
    let wrapped = serde_ignored::Deserializer::new(value, &mut record);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(wrapped);
    match parsed {
        Ok(v) => {
            if strict && let Some(first) = unknown.first() {
                return Err((join_field(root, first), "unknown field".to_owned()));
            }
            Ok(v)
        }
        Err(e) => {
            let path = e.path().to_string();
            let field = if path == "." {
                root.to_owned()
            } else {
                join_field(root, &path)
            };
            Err((field, e.into_inner().to_string()))
        }
    }
}

fn join_field(root: &str, rest: &str) -> String {
    if rest.is_empty() {
        root.to_owned()
    } else if root.is_empty() || rest.starts_with('[') {
        format!("{root}{rest}")
    } else {
        format!("{root}.{rest}")
    }
}

/// Renders a path from `serde_ignored` the way `serde_path_to_error` renders its own.
fn ignored_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path as P;
    match path {
        P::Root => String::new(),
        P::Seq { parent, index } => format!("{}[{index}]", ignored_path(parent)),
        P::Map { parent, key } => join_field(&ignored_path(parent), key),
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
            ignored_path(parent)
        }
    }
}

/// `metadata.name` of a policy becomes part of a webhook name (`<name>.splice.dev`) and of a
/// configuration name (`splice-<name>`), so it must be a DNS-1123 subdomain.
fn check_object_name(name: &str) -> Result<(), String> {
    let valid_label = |label: &str| {
        !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(valid_label) {
        return Err(format!(
            "{name:?} is not a valid name: lowercase letters, digits, '-' and '.', \
             starting and ending with a letter or digit, at most 253 characters"
        ));
    }
    Ok(())
}

/// The compiler's warnings about each policy, as the validating webhook returns them at apply
/// time, each prefixed with where the policy was read.
pub(crate) fn policy_warnings(policies: &[LoadedPolicy]) -> Vec<String> {
    policies
        .iter()
        .flat_map(|p| {
            p.compiled
                .warnings()
                .iter()
                .map(move |w| format!("{}: {w}", p.origin))
        })
        .collect()
}

/// One line per policy: the strictest Pod Security level its injected content satisfies, and
/// the first reason it satisfies no stricter one.
pub(crate) fn pod_security_lines(policies: &[LoadedPolicy]) -> Vec<String> {
    policies
        .iter()
        .map(|p| {
            let security = p.compiled.pod_security();
            let reason = security
                .findings
                .iter()
                .find(|f| f.allows == security.level)
                .map(|f| format!(" ({} {})", f.field, f.message))
                .unwrap_or_default();
            format!(
                "policy {}: injected content satisfies Pod Security {}{reason}",
                p.name, security.level
            )
        })
        .collect()
}

/// One line per policy: the mode it runs in, and why not in-tree when it could have.
pub(crate) fn mode_lines(policies: &[LoadedPolicy]) -> Vec<String> {
    policies
        .iter()
        .map(|p| match (p.mode.effective, &p.mode.webhook_only) {
            (splice_crds::Mode::InTree, _) => format!(
                "policy {}: mode InTree (a MutatingAdmissionPolicy: the API server injects it \
                 itself, before any webhook)",
                p.name
            ),
            (_, Some(why)) => format!("policy {}: mode Webhook, because {why}", p.name),
            (_, None) => format!("policy {}: mode Webhook (requested)", p.name),
        })
        .collect()
}

/// Stdin can be read once: refuses `-` given more than once across `-p` and `-f`.
pub(crate) fn stdin_at_most_once<'a>(
    paths: impl IntoIterator<Item = &'a PathBuf>,
) -> Result<(), InputError> {
    let dashes = paths
        .into_iter()
        .filter(|p| p.as_path() == Path::new("-"))
        .count();
    if dashes > 1 {
        return Err(InputError::file(
            "<stdin>",
            "`-` (stdin) may be given only once across -p and -f",
        ));
    }
    Ok(())
}

/// Parses `K=V` for `--namespace-label` and `--namespace-annotation`.
pub(crate) fn parse_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))?;
    if k.is_empty() {
        return Err(format!(
            "expected KEY=VALUE with a non-empty KEY, got {s:?}"
        ));
    }
    Ok((k.to_owned(), v.to_owned()))
}

/// Reads the ConfigMaps and Secrets of `--values-from` files (multi-document YAML; other kinds
/// are an error naming the document).
pub(crate) fn read_values_from(paths: &[PathBuf]) -> Result<DataSources, InputError> {
    let mut data = DataSources::default();
    for path in paths {
        let source = Source::read(path)?;
        for doc in documents(&source)? {
            let at = |message: String| InputError::document(&source.name, doc.index, message);
            let kind = doc.value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
            let object = |meta: &ObjectMeta| {
                let name = meta
                    .name
                    .clone()
                    .ok_or_else(|| at("missing".into()).with_field("metadata.name"))?;
                let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
                Ok::<_, InputError>((namespace, name))
            };
            let (kind, (namespace, name), values) = match kind {
                "ConfigMap" => {
                    let cm: ConfigMap = serde_yaml::from_value(doc.value.clone())
                        .map_err(|e| at(format!("not a ConfigMap: {e}")))?;
                    (
                        SourceKind::ConfigMap,
                        object(&cm.metadata)?,
                        values_from::config_map_data(&cm),
                    )
                }
                "Secret" => {
                    let secret: Secret = serde_yaml::from_value(doc.value.clone())
                        .map_err(|e| at(format!("not a Secret: {e}")))?;
                    (
                        SourceKind::Secret,
                        object(&secret.metadata)?,
                        values_from::secret_data(&secret),
                    )
                }
                other => {
                    return Err(at(format!(
                        "kind {other:?} is not ConfigMap or Secret (--values-from reads only those)"
                    ))
                    .with_field("kind"));
                }
            };
            data.insert(
                SourceRef {
                    kind,
                    namespace,
                    name,
                },
                values,
            );
        }
    }
    Ok(data)
}

/// Compiles again, with their data, the policies that have `spec.valuesFrom`, resolved by the
/// webhook's own function against the `--values-from` files; a missing source is an error
/// naming the policy, the entry and the object and key.
pub(crate) fn resolve_values_from(
    policies: &mut [LoadedPolicy],
    paths: &[PathBuf],
    splice_namespace: &str,
) -> Result<(), InputError> {
    if policies
        .iter()
        .all(|p| p.compiled.spec().values_from.is_empty())
    {
        return Ok(());
    }
    let data = read_values_from(paths)?;
    for p in policies.iter_mut() {
        let spec = p.compiled.spec();
        if spec.values_from.is_empty() {
            continue;
        }
        let error = |field: String, message: String| {
            InputError::document(&p.file, p.document, message)
                .with_subject(format!("policy \"{}\"", p.name))
                .with_field(field)
        };
        let resolved = values_from::resolve(spec, splice_namespace, None, &data).map_err(|e| {
            let message = match &e {
                ValuesFromError::SourceMissing { object, key, .. } => format!(
                    "{object}{} not found in the --values-from files",
                    key.as_deref()
                        .map(|k| format!(" key {k}"))
                        .unwrap_or_default()
                ),
                other => other.to_string(),
            };
            error(e.field(), message)
        })?;
        p.compiled =
            CompiledPolicy::compile_with(&p.name, p.compiled.generation(), spec, &resolved)
                .map_err(|e| InputError::document(&p.file, p.document, e.to_string()))?;
    }
    Ok(())
}

/// The namespace flags shared by `inject` and `simulate`.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct NamespaceArgs {
    /// Namespace the pods are admitted into [default: each document's metadata.namespace, else
    /// `default`].
    #[arg(long, short = 'n', value_name = "NAME")]
    pub namespace: Option<String>,
    /// A label of that namespace, for namespace selectors and templates (repeatable). The label
    /// kubernetes.io/metadata.name=<namespace> is always set, as the API server does.
    #[arg(long = "namespace-label", value_name = "K=V", value_parser = parse_label)]
    pub namespace_labels: Vec<(String, String)>,
    /// An annotation of that namespace, for templates and `spec.overrides` (repeatable): a
    /// policy's override reads it when the pod does not set its own.
    #[arg(long = "namespace-annotation", value_name = "K=V", value_parser = parse_label)]
    pub namespace_annotations: Vec<(String, String)>,
    /// Splice's own namespace, never injected (like kube-system and kube-node-lease); also
    /// where a `valuesFrom` entry without a namespace reads.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_SPLICE_NAMESPACE)]
    pub splice_namespace: String,
    /// ConfigMaps and Secrets (multi-document YAML) the policies' `spec.valuesFrom` read
    /// (repeatable).
    #[arg(long = "values-from", value_name = "FILE")]
    pub values_from: Vec<PathBuf>,
    /// Which revision of a policy with `spec.rollout` to render: the spec as written
    /// (`in-force`, what a canary gets), or the promoted one that pods outside an open canary
    /// get (`promoted`, read from `status.rollout.stable`, so the file must come from the
    /// cluster, e.g. `kubectl get injectionpolicy -o yaml`).
    #[arg(long, value_enum, default_value_t = Revision::InForce)]
    pub revision: Revision,
    /// The SPIFFE trust domain `{{ identity.spiffeID }}` names, as `splice run --trust-domain`.
    #[arg(long, value_name = "DOMAIN", default_value = splice_engine::identity::DEFAULT_TRUST_DOMAIN,
        value_parser = super::run::parse_trust_domain)]
    pub trust_domain: String,
}

/// The revision of a policy the offline commands render.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Revision {
    #[default]
    InForce,
    Promoted,
}

impl NamespaceArgs {
    /// Rejects flag combinations the API server could never produce.
    pub fn validate(&self) -> Result<(), String> {
        if let Some((_, v)) = self
            .namespace_labels
            .iter()
            .find(|(k, _)| k == NAMESPACE_NAME_LABEL)
            && let Some(ns) = &self.namespace
            && v != ns
        {
            return Err(format!(
                "--namespace-label {NAMESPACE_NAME_LABEL}={v} contradicts --namespace {ns}: \
                 the API server always sets that label to the namespace's own name"
            ));
        }
        Ok(())
    }

    /// The context for an object whose own `metadata.namespace` is `own`.
    pub fn context(&self, own: Option<&str>) -> NamespaceContext {
        let name = self
            .namespace
            .as_deref()
            .or(own)
            .filter(|n| !n.is_empty())
            .unwrap_or("default")
            .to_owned();
        let mut labels: BTreeMap<String, String> = self.namespace_labels.iter().cloned().collect();
        labels.insert(NAMESPACE_NAME_LABEL.to_owned(), name.clone());
        NamespaceContext {
            name,
            labels,
            annotations: self.namespace_annotations.iter().cloned().collect(),
        }
    }

    pub fn exclusions(&self) -> Exclusions {
        Exclusions::default_for(&self.splice_namespace)
    }
}

/// Which pass of the API server's mutating chain a call belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    First,
    Reinvocation,
}

/// What one webhook call did.
#[derive(Clone, Debug)]
pub(crate) enum Outcome {
    /// The webhook would not have been called (selectors, exclusions, opt-out) or declined.
    Skipped(SkipReason),
    /// The webhook answered with this JSON Patch (an empty array when nothing changed).
    Patched { patch: Value, warnings: Vec<String> },
    /// The policy failed for this object and its shared entry's call left it out (see
    /// [`member_failure`]), answering this warning.
    LeftOut { warning: String },
}

#[derive(Clone, Debug)]
pub(crate) struct Step {
    /// Index into the policy slice the chain ran over.
    pub policy: usize,
    pub pass: Pass,
    pub outcome: Outcome,
    /// Whether the object differs after the patch, which is what the API server looks at to
    /// decide on reinvocation.
    pub changed: bool,
}

impl Step {
    /// Whether the API server would have called the webhook at all.
    pub fn called(&self) -> bool {
        matches!(
            self.outcome,
            Outcome::Patched { .. } | Outcome::LeftOut { .. }
        )
    }
}

/// A failure inside the chain: the engine refused the object, or produced a patch that does not
/// apply (which would be an engine bug, reported rather than panicked on).
#[derive(Clone, Debug)]
pub(crate) struct ChainError {
    pub policy: String,
    /// The whole message, naming the policy.
    pub message: String,
}

impl fmt::Display for ChainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The environment one chain runs in.
#[derive(Clone, Copy)]
pub(crate) struct Admission<'a> {
    pub operation: Operation,
    pub namespace: &'a NamespaceContext,
    pub exclusions: &'a Exclusions,
    pub trust_domain: &'a str,
}

/// One call of a webhook entry, as the API server makes it.
pub(crate) struct EntryCall {
    /// Each member's step, in the entry's order.
    pub steps: Vec<Step>,
    /// The object after each member's own patch, when that patch changed it (who changed what).
    pub after: Vec<Option<Value>>,
    /// The object after the call's one patch, when it changed.
    pub next: Option<Value>,
}

/// Calls the entry serving `members` (indexes into `policies`, in the entry's order) on `object`
/// as the API server would: through the engine's [`splice_engine::inject_in_order`], the chain the
/// webhook runs for the same entry, and applies the call's one patch.
pub(crate) fn call_entry(
    policies: &[LoadedPolicy],
    members: &[usize],
    pass: Pass,
    object: &Value,
    admission: Admission<'_>,
) -> Result<EntryCall, ChainError> {
    let fail = |index: usize, message: String| {
        let name = &policies[index].name;
        ChainError {
            policy: name.clone(),
            message: format!("policy {name}: {message}"),
        }
    };
    let first = members.first().copied().unwrap_or_default();
    let text = serde_json::to_string(object)
        .map_err(|e| fail(first, format!("cannot serialize the object: {e}")))?;
    let pod = Pod::parse(&text).map_err(|e| fail(first, e.to_string()))?;
    let request = PodRequest {
        operation: admission.operation,
        object: &pod,
        namespace: admission.namespace,
        exclusions: admission.exclusions,
        trust_domain: admission.trust_domain,
        selection: Selection::Evaluate,
    };
    let compiled: Vec<&CompiledPolicy> = members.iter().map(|&i| &policies[i].compiled).collect();
    let chained = splice_engine::inject_in_order(&compiled, &request);
    let mut steps = Vec::with_capacity(members.len());
    let mut after = Vec::with_capacity(members.len());
    // Each member's own patch applies to the object the ones before it left: replayed here only
    // to tell which member changed what; the call's result is the joined patch below.
    let mut current = object.clone();
    for (&index, decided) in members.iter().zip(chained.decisions) {
        let injection = match decided {
            Ok(Decision::Inject(injection)) => injection,
            Ok(Decision::Skip(reason)) => {
                steps.push(Step {
                    policy: index,
                    pass,
                    outcome: Outcome::Skipped(reason),
                    changed: false,
                });
                after.push(None);
                continue;
            }
            // The API server denies the whole admission, whatever the failure policy.
            Ok(Decision::Refuse(refused)) => {
                return Err(ChainError {
                    policy: policies[index].name.clone(),
                    message: format!("denied: {refused}"),
                });
            }
            Err(e) => {
                let policy = &policies[index];
                match member_failure(members.len(), policy.compiled.spec().failure_policy) {
                    MemberFailure::LeftOut => {
                        let warning = left_out_warning(&policy.name, &e);
                        steps.push(Step {
                            policy: index,
                            pass,
                            outcome: Outcome::LeftOut { warning },
                            changed: false,
                        });
                        after.push(None);
                        continue;
                    }
                    // Render errors already name the policy and the template field.
                    MemberFailure::FailsTheCall => {
                        return Err(match e {
                            EngineError::Render { .. } | EngineError::InvalidRender { .. } => {
                                ChainError {
                                    policy: policy.name.clone(),
                                    message: e.to_string(),
                                }
                            }
                            other => fail(index, other.to_string()),
                        });
                    }
                }
            }
        };
        let patch: Value = serde_json::from_slice(&injection.patch).map_err(|e| {
            fail(
                index,
                format!("the engine returned an unreadable patch: {e}"),
            )
        })?;
        let changed = apply(&mut current, &injection.patch)
            .map_err(|e| fail(index, format!("the engine's patch does not apply: {e}")))?;
        after.push(changed.then(|| current.clone()));
        steps.push(Step {
            policy: index,
            pass,
            outcome: Outcome::Patched {
                patch,
                warnings: injection.warnings,
            },
            changed,
        });
    }
    let mut next = object.clone();
    let changed = apply(&mut next, &chained.whole.patch)
        .map_err(|e| fail(first, format!("the engine's patch does not apply: {e}")))?;
    Ok(EntryCall {
        steps,
        after,
        next: changed.then_some(next),
    })
}

/// Applies an RFC 6902 patch; true when the object differs afterwards.
fn apply(object: &mut Value, patch: &[u8]) -> Result<bool, String> {
    let ops: json_patch::Patch =
        serde_json::from_slice(patch).map_err(|e| format!("not a JSON Patch: {e}"))?;
    if ops.0.is_empty() {
        return Ok(false);
    }
    let before = object.clone();
    json_patch::patch(object, &ops).map_err(|e| e.to_string())?;
    Ok(*object != before)
}

/// The API server's bookkeeping for its single reinvocation pass, by webhook entry: an entry's
/// change marks every `IfNeeded` entry called *before* it (never itself) to be called once more;
/// an entry whose selectors did not match was not called, so it is never marked.
#[derive(Clone, Debug, Default)]
pub(crate) struct Reinvocation {
    invoked: BTreeSet<usize>,
    marked: BTreeSet<usize>,
}

impl Reinvocation {
    /// Records a first-pass call of webhook `index`: whether the API server called it at all
    /// (its selectors matched), whether it changed the object, and its reinvocation policy.
    pub fn record(
        &mut self,
        index: usize,
        called: bool,
        changed: bool,
        policy: ReinvocationPolicy,
    ) {
        if changed {
            self.marked.append(&mut self.invoked);
        }
        if called && policy == ReinvocationPolicy::IfNeeded {
            self.invoked.insert(index);
        }
    }

    /// Whether webhook `index` is called in the reinvocation pass; at most once.
    pub fn take(&mut self, index: usize) -> bool {
        self.marked.remove(&index)
    }
}

/// One webhook entry as Splice would write it: a policy alone, or the policies that share one
/// entry and one call (see `splice_engine::entry`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The MutatingWebhookConfiguration's name.
    pub configuration: String,
    /// Indexes into the policies, in the order the entry applies them (name order).
    pub members: Vec<usize>,
}

/// What serves `policies`, in the order the API server runs it: the in-tree ones first (mutating
/// admission policies run before any webhook), by name, then the webhook entries by configuration
/// name. Offline there is no availability guard, so the failure policy is the one asked for.
pub(crate) fn entries(policies: &[LoadedPolicy], splice_namespace: &str) -> Vec<Entry> {
    let in_tree = |p: &LoadedPolicy| p.mode.effective == splice_crds::Mode::InTree;
    let mut first: Vec<Entry> = policies
        .iter()
        .enumerate()
        .filter(|(_, p)| in_tree(p))
        .map(|(i, p)| Entry {
            configuration: format!("MutatingAdmissionPolicy splice-{} (in-tree)", p.name),
            members: vec![i],
        })
        .collect();
    let members = policies.iter().filter(|p| !in_tree(p)).map(|p| Member {
        name: p.name.clone(),
        uid: p.name.clone(),
        spec: p.compiled.spec().clone(),
        failure_policy: p.compiled.spec().failure_policy,
        canary: None,
    });
    // A cluster's instance is its namespace and policy selector; offline there is no selector.
    let plan = Plan::new(members, &format!("{splice_namespace}/"));
    let index: BTreeMap<&str, usize> = policies
        .iter()
        .enumerate()
        .map(|(i, p)| (p.name.as_str(), i))
        .collect();
    let mut entries: Vec<Entry> = plan
        .groups()
        .iter()
        .map(|g| Entry {
            configuration: g.configuration.clone(),
            members: g
                .members
                .iter()
                .filter_map(|m| index.get(m.name.as_str()).copied())
                .collect(),
        })
        .collect();
    entries.sort_by(|a, b| a.configuration.cmp(&b.configuration));
    first.append(&mut entries);
    first
}

/// Runs the whole chain, calling `entries` in the order given: the first pass, then the
/// reinvocation pass (a webhook is called at most twice per request, so changes made in that
/// pass mark nothing). An entry applies its policies one after the other in one call, so a change
/// by one of them never reinvokes another of the same entry. Returns the final object and every
/// policy's call.
pub(crate) fn run_chain(
    policies: &[LoadedPolicy],
    entries: &[Entry],
    mut object: Value,
    admission: Admission<'_>,
) -> Result<(Value, Vec<Step>), ChainError> {
    let mut reinvocation = Reinvocation::default();
    let mut steps = Vec::with_capacity(policies.len());
    for (e, entry) in entries.iter().enumerate() {
        let call = call_entry(policies, &entry.members, Pass::First, &object, admission)?;
        let called = call.steps.iter().any(Step::called);
        let changed = call.next.is_some();
        object = call.next.unwrap_or(object);
        steps.extend(call.steps);
        let policy = entry.members.first().map(|&i| policies[i].reinvocation);
        reinvocation.record(e, called, changed, policy.unwrap_or_default());
    }
    for (e, entry) in entries.iter().enumerate() {
        if reinvocation.take(e) {
            let call = call_entry(
                policies,
                &entry.members,
                Pass::Reinvocation,
                &object,
                admission,
            )?;
            object = call.next.unwrap_or(object);
            steps.extend(call.steps);
        }
    }
    Ok((object, steps))
}

/// Where the pod (template) sits in a manifest of a kind the admission chain would see pods
/// from, as a JSON pointer; `None` for kinds that do not hold pods.
pub(crate) fn pod_pointer(api_version: &str, kind: &str) -> Option<&'static str> {
    let group = api_version
        .rsplit_once('/')
        .map(|(group, _)| group)
        .unwrap_or("");
    match (group, kind) {
        ("", "Pod") => Some(""),
        ("apps", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet") => {
            Some("/spec/template")
        }
        ("batch", "Job") => Some("/spec/template"),
        ("batch", "CronJob") => Some("/spec/jobTemplate/spec/template"),
        _ => None,
    }
}

/// `Kind namespace/name` (or `Kind name`), to name a document in messages.
pub(crate) fn describe(object: &Value) -> String {
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("object");
    let meta = object.get("metadata");
    let field = |k: &str| meta.and_then(|m| m.get(k)).and_then(Value::as_str);
    match (field("namespace"), field("name").or(field("generateName"))) {
        (Some(ns), Some(name)) => format!("{kind} {ns}/{name}"),
        (None, Some(name)) => format!("{kind} {name}"),
        _ => kind.to_owned(),
    }
}

/// Renders one skip reason for people.
pub(crate) fn skip_text(reason: SkipReason) -> &'static str {
    match reason {
        SkipReason::ExcludedNamespace => "the namespace is always excluded",
        SkipReason::OptedOut => "the pod opted out (splice.dev/inject: \"false\")",
        SkipReason::NamespaceNotSelected => "the namespaceSelector does not select the namespace",
        SkipReason::ObjectNotSelected => "the objectSelector does not select the pod",
        SkipReason::OperationNotConfigured => "the policy is not configured for this operation",
        SkipReason::NotAPod => "the object is not a pod",
    }
}

/// The pod being admitted and where it came from.
pub(crate) struct Subject {
    pub file: String,
    pub document: usize,
    /// `Pod default/web`, `Deployment shop/api (pod template)`.
    pub title: String,
    pub pod: Value,
    pub own_namespace: Option<String>,
}

impl Subject {
    pub fn error(&self, message: impl Into<String>) -> InputError {
        InputError::document(&self.file, self.document, message).with_subject(self.title.clone())
    }
}

/// Reads exactly one Pod, or one workload whose pod template is the subject, from `path`.
pub(crate) fn read_subject(path: &Path) -> Result<Subject, InputError> {
    let source = Source::read(path)?;
    let docs = documents(&source)?;
    let [doc] = docs.as_slice() else {
        return Err(InputError::file(
            &source.name,
            format!(
                "expected exactly one Pod (or workload) document, found {}",
                docs.len()
            ),
        ));
    };
    let at = |message: String| InputError::document(&source.name, doc.index, message);
    let object = to_json(&doc.value).map_err(at)?;
    let text = |key: &str| object.get(key).and_then(Value::as_str);
    let (Some(api_version), Some(kind)) = (text("apiVersion"), text("kind")) else {
        let field = if text("apiVersion").is_none() {
            "apiVersion"
        } else {
            "kind"
        };
        return Err(at("missing or not a string".to_owned()).with_field(field));
    };
    let Some(pointer) = pod_pointer(api_version, kind) else {
        return Err(at(format!(
            "{api_version} {kind} holds no pod: expected a Pod, Deployment, StatefulSet, \
             DaemonSet, ReplicaSet, Job or CronJob"
        ))
        .with_field("kind"));
    };
    let mut title = describe(&object);
    if !pointer.is_empty() {
        title.push_str(" (pod template)");
    }
    let pod = object
        .pointer(pointer)
        .filter(|p| p.is_object())
        .cloned()
        .ok_or_else(|| {
            at("missing or not an object".to_owned())
                .with_field(pointer.trim_start_matches('/').replace('/', "."))
        })?;
    Ok(Subject {
        file: source.name.clone(),
        document: doc.index,
        own_namespace: object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_owned),
        title,
        pod,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(text: &str) -> Source {
        Source {
            name: "test.yaml".to_owned(),
            text: text.to_owned(),
        }
    }

    fn policy_doc(text: &str) -> Result<LoadedPolicy, InputError> {
        let docs = documents(&source(text))?;
        load_policy("test.yaml", &docs[0], Revision::InForce)
    }

    #[test]
    fn documents_are_numbered_as_written_and_empty_ones_are_dropped() {
        let docs = documents(&source("a: 1\n---\n---\nb: 2\n---\n")).expect("parses");
        let got: Vec<(usize, String)> = docs
            .iter()
            .map(|d| (d.index, serde_yaml::to_string(&d.value).expect("yaml")))
            .collect();
        assert_eq!(
            got,
            vec![(1, "a: 1\n".to_owned()), (3, "b: 2\n".to_owned())]
        );
    }

    #[test]
    fn a_syntax_error_names_the_document_it_is_in() {
        let err = documents(&source("a: 1\n---\nb: [1, 2\n"))
            .err()
            .expect("fails");
        assert_eq!(err.document, Some(2));
        assert!(err.message.starts_with("invalid YAML"), "{err}");
    }

    #[test]
    fn an_empty_file_has_no_documents() {
        assert!(documents(&source("")).expect("parses").is_empty());
        assert!(
            documents(&source("# only a comment\n"))
                .expect("parses")
                .is_empty()
        );
    }

    #[test]
    fn a_wrongly_typed_policy_field_is_reported_with_its_path() {
        let doc = "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {name: p}\n\
                   spec:\n  timeoutSeconds: x\n";
        let err = documents(&source(doc))
            .and_then(|d| load_policy("test.yaml", &d[0], Revision::InForce))
            .err()
            .expect("fails");
        assert_eq!(err.field.as_deref(), Some("spec.timeoutSeconds"));
        assert!(err.message.contains("invalid type: string \"x\""), "{err}");
    }

    #[test]
    fn a_nested_field_error_carries_list_indexes() {
        let (field, _) = deserialize_located::<InjectionPolicySpec, serde_yaml::Value>(
            serde_yaml::from_str("template: {containers: [{name: a}, {name: b, image: [1]}]}")
                .expect("yaml"),
            "spec",
            true,
        )
        .expect_err("fails");
        assert_eq!(field, "spec.template.containers[1].image");
    }

    #[test]
    fn a_misspelt_policy_field_is_an_error_not_silently_dropped() {
        let (field, message) = deserialize_located::<InjectionPolicySpec, serde_yaml::Value>(
            serde_yaml::from_str("template: {containers: [{name: a, imagee: x}]}").expect("yaml"),
            "spec",
            true,
        )
        .expect_err("fails");
        assert_eq!(field, "spec.template.containers[0].imagee");
        assert_eq!(message, "unknown field");
    }

    #[test]
    fn an_unknown_kind_in_a_policy_file_is_an_error() {
        let err = policy_doc("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
            .err()
            .expect("fails");
        assert_eq!(err.field.as_deref(), Some("kind"));
        assert!(err.message.contains("ConfigMap"), "{err}");
    }

    #[test]
    fn a_policy_without_a_valid_name_is_an_error() {
        let err = policy_doc("apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nspec: {}\n")
            .err()
            .expect("fails");
        assert_eq!(err.field.as_deref(), Some("metadata.name"));
        let err = policy_doc(
            "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {name: Mesh_Proxy}\n",
        )
        .err()
        .expect("fails");
        assert_eq!(err.field.as_deref(), Some("metadata.name"));
    }

    /// The fixture table the CRD's own tests use (crds/tests/policy_validation.rs, and the API
    /// server in e2e/tests/policy_fixtures.rs): the CLI loads what the API server accepts and
    /// refuses the rest naming the file, the document and the field.
    #[test]
    fn the_cli_accepts_and_refuses_the_policy_fixtures_as_the_api_server_does() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/tests/fixtures/policies");
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("the fixtures exist")
            .map(|e| e.expect("entry").path())
            .collect();
        paths.sort();
        assert!(paths.len() >= 10, "{paths:?}");
        for path in paths {
            let text = std::fs::read_to_string(&path).expect("readable");
            let field = text.lines().find_map(|l| l.strip_prefix("# field: "));
            let loaded = load_policies(std::slice::from_ref(&path));
            match field {
                None => assert!(loaded.is_ok(), "{}: {:?}", path.display(), loaded.err()),
                Some(field) => {
                    let Err(e) = loaded else {
                        panic!("{} loads", path.display());
                    };
                    assert_eq!(e.document, Some(1), "{e}");
                    // Whoever refuses first (serde for a type, the compiler, the CRD) names the
                    // field, or one under it.
                    assert!(
                        e.to_string().contains(&format!(": {field}")),
                        "{}: expected {field}, got {e}",
                        path.display()
                    );
                }
            }
        }
    }

    #[test]
    fn where_the_compiler_and_a_cel_rule_both_refuse_the_compiler_names_the_item() {
        let e = policy_doc(
            "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {name: p}\n\
             spec: {template: {initContainers: [{name: x, image: a}], containers: [{name: x, image: b}]}}\n",
        )
        .err()
        .expect("refused");
        assert_eq!(
            e.field, None,
            "the compiler names the field in its message: {e}"
        );
        assert!(
            e.to_string().contains("spec.template.containers[0].name"),
            "{e}"
        );
    }

    #[test]
    fn a_policy_without_spec_is_refused_as_the_api_server_does() {
        let e = policy_doc(
            "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {name: p}\n",
        )
        .err()
        .expect("refused");
        assert_eq!(e.field.as_deref(), Some("spec"), "{e}");
        assert_eq!(e.message, "required");
    }

    #[test]
    fn namespace_labels_parse_as_key_value() {
        assert_eq!(
            parse_label("mesh=enabled"),
            Ok(("mesh".into(), "enabled".into()))
        );
        assert_eq!(parse_label("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_label("empty="), Ok(("empty".into(), String::new())));
        assert!(parse_label("novalue").is_err());
        assert!(parse_label("=v").is_err());
    }

    #[test]
    fn the_promoted_revision_is_read_from_the_status_and_refused_naming_it_when_absent() {
        let yaml = |status: &str| {
            format!(
                "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {{name: mesh}}\n\
                 spec:\n  values: {{tag: '2'}}\n  rollout: {{canary: {{objectSelector: {{matchLabels: {{track: canary}}}}}}}}\n\
                 \x20 template: {{labels: {{v: '{{{{ values.tag }}}}'}}}}\n{status}"
            )
        };
        let load = |text: String, revision| {
            let docs = documents(&Source {
                name: "test.yaml".into(),
                text,
            })
            .unwrap();
            load_policy("test.yaml", &docs[0], revision)
        };
        let kept = "status:\n  rollout:\n    revision: x\n    phase: Canary\n    outdated: 0\n    restarting: 0\n    done: 0\n    failed: 0\n    manual: 0\n    stable:\n      templateHash: old\n      generation: 1\n      spec: {values: {tag: '1'}, template: {labels: {v: '{{ values.tag }}'}}}\n";
        let current = load(yaml(kept), Revision::InForce).unwrap();
        let promoted = load(yaml(kept), Revision::Promoted).unwrap();
        assert_ne!(
            current.compiled.template_hash(),
            promoted.compiled.template_hash()
        );
        assert_eq!(
            promoted
                .compiled
                .spec()
                .values
                .get("tag")
                .map(String::as_str),
            Some("1")
        );
        let Err(e) = load(yaml(""), Revision::Promoted) else {
            panic!("a canary policy without status has no promoted revision");
        };
        let e = e.to_string();
        assert!(e.contains("status.rollout.stable"), "{e}");
    }

    #[test]
    fn the_namespace_name_label_is_always_set_like_the_api_server_does() {
        let args = NamespaceArgs {
            namespace: None,
            namespace_labels: vec![("mesh".into(), "enabled".into())],
            namespace_annotations: Vec::new(),
            splice_namespace: DEFAULT_SPLICE_NAMESPACE.into(),
            values_from: Vec::new(),
            revision: Revision::InForce,
            trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN.into(),
        };
        let ctx = args.context(Some("shop"));
        assert_eq!(ctx.name, "shop");
        assert_eq!(
            ctx.labels.get(NAMESPACE_NAME_LABEL).map(String::as_str),
            Some("shop")
        );
        assert_eq!(ctx.labels.get("mesh").map(String::as_str), Some("enabled"));
        assert_eq!(args.context(None).name, "default");
        let forced = NamespaceArgs {
            namespace: Some("prod".into()),
            ..args
        };
        assert_eq!(forced.context(Some("shop")).name, "prod");
    }

    #[test]
    fn a_contradictory_namespace_name_label_is_refused() {
        let args = NamespaceArgs {
            namespace: Some("prod".into()),
            namespace_labels: vec![(NAMESPACE_NAME_LABEL.into(), "dev".into())],
            namespace_annotations: Vec::new(),
            splice_namespace: DEFAULT_SPLICE_NAMESPACE.into(),
            values_from: Vec::new(),
            revision: Revision::InForce,
            trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN.into(),
        };
        assert!(args.validate().is_err());
    }

    #[test]
    fn pods_and_the_six_workload_kinds_hold_pods_and_nothing_else_does() {
        assert_eq!(pod_pointer("v1", "Pod"), Some(""));
        for kind in ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"] {
            assert_eq!(pod_pointer("apps/v1", kind), Some("/spec/template"));
        }
        assert_eq!(pod_pointer("batch/v1", "Job"), Some("/spec/template"));
        assert_eq!(
            pod_pointer("batch/v1", "CronJob"),
            Some("/spec/jobTemplate/spec/template")
        );
        assert_eq!(pod_pointer("v1", "ConfigMap"), None);
        // Same kind name, someone else's API group: not ours to touch.
        assert_eq!(pod_pointer("example.com/v1", "Deployment"), None);
        assert_eq!(pod_pointer("example.com/v1", "Pod"), None);
    }

    #[test]
    fn every_example_policy_parses_and_compiles() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let mut found = 0;
        for entry in std::fs::read_dir(&dir).expect("examples/ exists") {
            let path = entry.expect("entry").path();
            if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("readable");
            if !text.contains("kind: InjectionPolicy") {
                continue;
            }
            let loaded =
                load_policies(std::slice::from_ref(&path)).unwrap_or_else(|e| panic!("{e}"));
            found += loaded.len();
        }
        assert!(found >= 2, "expected the example policies, found {found}");
    }
}
