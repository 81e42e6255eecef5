//! `splice inject`: the GitOps path. Applies policies offline, with the webhook's own engine, to
//! Pods and to the pod templates of workloads, and passes every other document through.
//!
//! Output is rendered into a buffer and printed only once every document went through, so bad
//! input never leaves half a manifest on stdout.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::Value;
use splice_crds::Operation;

use super::offline::{
    self, Admission, InputError, LoadedPolicy, NamespaceArgs, Outcome, Source, describe,
};

#[derive(clap::Args)]
pub struct Args {
    /// InjectionPolicy files (several documents each, or directories of them); applied in policy
    /// name order, as the API server calls webhooks.
    #[arg(short = 'p', long = "policy", value_name = "POLICY.yaml", required = true, num_args = 1..)]
    policies: Vec<PathBuf>,
    /// Manifests to inject (multi-document YAML or JSON; `-` reads stdin).
    #[arg(short = 'f', long = "filename", value_name = "MANIFESTS.yaml", required = true, num_args = 1..)]
    files: Vec<PathBuf>,
    #[command(flatten)]
    namespace: NamespaceArgs,
    /// Print nothing; exit 1 (listing what would change on stderr) when any document would change.
    #[arg(long)]
    check: bool,
    /// Output format. JSON prints one object for one document, else a `v1` `List` of them all.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Yaml)]
    output: Format,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Yaml,
    Json,
}

pub fn main(args: Args) -> ExitCode {
    match run(&args) {
        Ok(report) => {
            let mut stderr = std::io::stderr().lock();
            for note in &report.notes {
                let _ = writeln!(stderr, "{note}");
            }
            for warning in &report.warnings {
                let _ = writeln!(stderr, "warning: {warning}");
            }
            if args.check {
                for change in &report.changes {
                    let _ = writeln!(stderr, "would change: {change}");
                }
                return if report.changes.is_empty() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                };
            }
            super::print_or_fail(&report.output, ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Everything `inject` would print, computed before anything is printed.
struct Report {
    output: String,
    /// One line per document that changes: where it is, what it is, which policies changed it.
    changes: Vec<String>,
    warnings: Vec<String>,
    /// What each policy's content demands from Pod Security admission.
    notes: Vec<String>,
}

/// A document on its way out: untouched documents keep the YAML they were parsed as, so the
/// YAML output re-emits exactly that content.
enum Out {
    Untouched(serde_yaml::Value),
    Injected(Value),
}

fn run(args: &Args) -> Result<Report, InputError> {
    args.namespace
        .validate()
        .map_err(|e| InputError::file("--namespace-label", e))?;
    offline::stdin_at_most_once(args.policies.iter().chain(&args.files))?;
    let mut policies = offline::load_policies_at(&args.policies, args.namespace.revision)?;
    offline::resolve_values_from(
        &mut policies,
        &args.namespace.values_from,
        &args.namespace.splice_namespace,
    )?;
    let policy_warnings = offline::policy_warnings(&policies);
    let paused = offline::without_paused(&mut policies);
    let mut warnings: Vec<String> = paused
        .iter()
        .map(|name| format!("policy {name} is paused (spec.paused): not applied"))
        .collect();
    warnings.extend(policy_warnings);
    let mut ctx = Context {
        policies: &policies,
        args,
        changes: Vec::new(),
        warnings,
    };

    let mut out = Vec::new();
    for path in &args.files {
        let source = Source::read(path)?;
        for doc in offline::documents(&source)? {
            let at = Location {
                file: &source.name,
                document: doc.index,
                item: None,
            };
            out.push(ctx.document(at, doc.value)?);
        }
    }

    let output = match args.output {
        Format::Yaml => render_yaml(&out)?,
        Format::Json => render_json(out)?,
    };
    Ok(Report {
        output,
        changes: ctx.changes,
        warnings: ctx.warnings,
        notes: offline::pod_security_lines(&policies)
            .into_iter()
            .chain(offline::mode_lines(&policies))
            .collect(),
    })
}

#[derive(Clone, Copy)]
struct Location<'a> {
    file: &'a str,
    document: usize,
    /// Index inside a `List` document's `items`.
    item: Option<usize>,
}

impl Location<'_> {
    fn error(&self, message: impl Into<String>) -> InputError {
        let e = InputError::document(self.file, self.document, message);
        match self.item {
            Some(i) => e.with_subject(format!("items[{i}]")),
            None => e,
        }
    }

    fn describe(&self, object: &str) -> String {
        match self.item {
            Some(i) => format!(
                "{}: document {} items[{i}] ({object})",
                self.file, self.document
            ),
            None => format!("{}: document {} ({object})", self.file, self.document),
        }
    }
}

struct Context<'a> {
    policies: &'a [LoadedPolicy],
    args: &'a Args,
    changes: Vec<String>,
    warnings: Vec<String>,
}

impl Context<'_> {
    fn document(&mut self, at: Location<'_>, value: serde_yaml::Value) -> Result<Out, InputError> {
        let Some(map) = value.as_mapping() else {
            return Err(at.error("expected a Kubernetes object (a YAML mapping)"));
        };
        let text = |key: &str| map.get(key).and_then(serde_yaml::Value::as_str);
        let (Some(api_version), Some(kind)) = (text("apiVersion"), text("kind")) else {
            let field = if text("apiVersion").is_none() {
                "apiVersion"
            } else {
                "kind"
            };
            return Err(at.error("missing or not a string").with_field(field));
        };

        // `kubectl get -o yaml` wraps several objects in a List; inject inside it.
        if api_version == "v1" && kind == "List" && at.item.is_none() {
            return self.list(at, value);
        }
        let Some(pointer) = offline::pod_pointer(api_version, kind) else {
            return Ok(Out::Untouched(value));
        };

        let mut object = offline::to_json(&value).map_err(|e| at.error(e))?;
        let subject = describe(&object);
        let own_namespace = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let field = pointer.trim_start_matches('/').replace('/', ".");
        let Some(pod) = object.pointer_mut(pointer) else {
            return Err(at
                .error("missing: a workload without a pod template cannot be injected")
                .with_subject(subject)
                .with_field(field));
        };
        if !pod.is_object() {
            return Err(at
                .error("expected an object (a pod template)")
                .with_subject(subject)
                .with_field(field));
        }

        let namespace = self.args.namespace.context(own_namespace.as_deref());
        let exclusions = self.args.namespace.exclusions();
        let admission = Admission {
            operation: Operation::Create,
            namespace: &namespace,
            exclusions: &exclusions,
            trust_domain: &self.args.namespace.trust_domain,
        };
        let entries = offline::entries(self.policies, &self.args.namespace.splice_namespace);
        let (result, steps) = offline::run_chain(self.policies, &entries, pod.clone(), admission)
            .map_err(|e| at.error(e.to_string()).with_subject(subject.clone()))?;

        let mut changed_by: Vec<&str> = Vec::new();
        for step in &steps {
            let name = self.policies[step.policy].name.as_str();
            // The engine's warnings name their policy already, as does a left-out one's.
            let warnings = match &step.outcome {
                Outcome::Patched { warnings, .. } => warnings.as_slice(),
                Outcome::LeftOut { warning } => std::slice::from_ref(warning),
                Outcome::Skipped(_) => &[],
            };
            for w in warnings {
                self.warnings
                    .push(format!("{}: {w}", at.describe(&subject)));
            }
            if step.changed && !changed_by.contains(&name) {
                changed_by.push(name);
            }
        }
        if result == *pod {
            return Ok(Out::Untouched(value));
        }
        *pod = result;
        self.changes.push(format!(
            "{}: injected by {}",
            at.describe(&subject),
            changed_by.join(", ")
        ));
        Ok(Out::Injected(object))
    }

    fn list(&mut self, at: Location<'_>, value: serde_yaml::Value) -> Result<Out, InputError> {
        let mut items_out = Vec::new();
        let items = value
            .get("items")
            .and_then(serde_yaml::Value::as_sequence)
            .cloned()
            .unwrap_or_default();
        let mut any_injected = false;
        for (i, item) in items.into_iter().enumerate() {
            let item_at = Location {
                item: Some(i),
                ..at
            };
            let out = self.document(item_at, item)?;
            any_injected |= matches!(out, Out::Injected(_));
            items_out.push(out);
        }
        if !any_injected {
            return Ok(Out::Untouched(value));
        }
        let mut list = offline::to_json(&value).map_err(|e| at.error(e))?;
        let items = items_out
            .into_iter()
            .enumerate()
            .map(|(i, out)| {
                to_json_out(out).map_err(|e| at.error(e).with_subject(format!("items[{i}]")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(slot) = list.get_mut("items") {
            *slot = Value::Array(items);
        }
        Ok(Out::Injected(list))
    }
}

fn to_json_out(out: Out) -> Result<Value, String> {
    match out {
        Out::Untouched(v) => offline::to_json(&v),
        Out::Injected(v) => Ok(v),
    }
}

fn render_yaml(docs: &[Out]) -> Result<String, InputError> {
    let mut buf = String::new();
    for (i, doc) in docs.iter().enumerate() {
        if i > 0 {
            buf.push_str("---\n");
        }
        let text = match doc {
            Out::Untouched(v) => serde_yaml::to_string(v),
            Out::Injected(v) => serde_yaml::to_string(v),
        }
        .map_err(|e| InputError::file("<output>", format!("cannot render YAML: {e}")))?;
        buf.push_str(&text);
    }
    Ok(buf)
}

/// One document prints as itself; any other number as a `v1` `List`, which `kubectl apply -f`
/// accepts as it is.
fn render_json(docs: Vec<Out>) -> Result<String, InputError> {
    let mut values = docs
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            to_json_out(d)
                .map_err(|e| InputError::file("<output>", format!("document {}: {e}", i + 1)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let value = if values.len() == 1 {
        values.remove(0)
    } else {
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": values})
    };
    let mut text = serde_json::to_string_pretty(&value)
        .map_err(|e| InputError::file("<output>", format!("cannot render JSON: {e}")))?;
    text.push('\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> serde_yaml::Value {
        serde_yaml::from_str(text).expect("yaml")
    }

    #[test]
    fn untouched_documents_are_re_emitted_as_parsed_and_separated() {
        let docs = vec![
            Out::Untouched(yaml("kind: ConfigMap\ndata: {port: '8080', on: yes}\n")),
            Out::Untouched(yaml("kind: Service\n")),
        ];
        let text = render_yaml(&docs).expect("renders");
        assert_eq!(
            text,
            "kind: ConfigMap\ndata:\n  port: '8080'\n  on: yes\n---\nkind: Service\n"
        );
        // The strings stay strings when read back.
        let back: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).expect("doc"))
            .collect();
        assert_eq!(back[0]["data"]["port"], yaml("'8080'"));
    }

    #[test]
    fn json_output_is_one_object_for_one_document_and_a_list_otherwise() {
        let one = render_json(vec![Out::Untouched(yaml("kind: Service"))]).expect("renders");
        let v: Value = serde_json::from_str(&one).expect("json");
        assert_eq!(v["kind"], "Service");

        let two = render_json(vec![
            Out::Untouched(yaml("kind: Service")),
            Out::Injected(serde_json::json!({"kind": "Pod"})),
        ])
        .expect("renders");
        let v: Value = serde_json::from_str(&two).expect("json");
        assert_eq!(v["kind"], "List");
        assert_eq!(v["items"][0]["kind"], "Service");
        assert_eq!(v["items"][1]["kind"], "Pod");

        let none: Value =
            serde_json::from_str(&render_json(Vec::new()).expect("renders")).expect("json");
        assert_eq!(none["items"], serde_json::json!([]));
    }
}
