//! Running the `splice` binary on files written to a temporary directory.

// Each test crate uses its own part of this module, and a helper that cannot do its job fails the
// test that called it.
#![allow(dead_code, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde::Deserialize;
use serde_json::Value;

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The output, parsed as multi-document YAML.
    pub fn documents(&self) -> Vec<Value> {
        documents(&self.stdout)
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

pub fn documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).expect("YAML document"))
        .filter(|v| !v.is_null())
        .collect()
}

/// A temporary directory to write inputs into.
pub struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    pub fn new() -> Self {
        Workspace {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write input");
        path
    }

    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

pub fn splice<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    splice_with_stdin(args, "")
}

pub fn splice_with_stdin<I, S>(args: I, stdin: &str) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut child = Command::new(env!("CARGO_BIN_EXE_splice"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn splice");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("splice runs");
    Run {
        code: out.status.code().expect("exit code"),
        stdout: String::from_utf8(out.stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8(out.stderr).expect("utf-8 stderr"),
    }
}

/// A policy document injecting a native sidecar `proxy`, a volume and an env var.
pub fn sidecar_policy(name: &str, extra_spec: &str) -> String {
    format!(
        r#"apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata:
  name: {name}
spec:
{extra_spec}
  template:
    initContainers:
      - name: {name}-proxy
        image: registry.example/proxy:1.0
        restartPolicy: Always
    volumes:
      - name: {name}-data
        emptyDir: {{}}
    env:
      - name: INJECTED_BY_{env}
        value: "{{{{ policy.name }}}} in {{{{ namespace.name }}}}"
"#,
        env = name.to_uppercase().replace('-', "_"),
    )
}

/// A policy that only sets one env var on every application container.
pub fn env_policy(name: &str, var: &str, value: &str) -> String {
    format!(
        r#"apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata:
  name: {name}
spec:
  template:
    env:
      - name: {var}
        value: "{value}"
"#
    )
}

pub fn pod(name: &str, namespace: &str, labels: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {namespace}
  labels: {labels}
spec:
  containers:
    - name: app
      image: registry.example/app:1.0
"#
    )
}

/// Names of the containers in a pod spec's list `field`.
pub fn names(spec: &Value, field: &str) -> Vec<String> {
    spec[field]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|c| c["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `splice <subcommand> -p <policy files>... -f <input file> <extra>...`, writing the policies
/// and the input into `ws` first. `inject` and `simulate` take the same shape of arguments.
pub fn run_with_policies(
    ws: &Workspace,
    subcommand: &str,
    policies: &[&str],
    input_name: &str,
    input: &str,
    extra: &[&str],
) -> Run {
    let input = ws.file(input_name, input);
    let mut args: Vec<String> = vec![subcommand.into()];
    for (i, p) in policies.iter().enumerate() {
        args.push("-p".into());
        args.push(
            ws.file(&format!("policy-{i}.yaml"), p)
                .display()
                .to_string(),
        );
    }
    args.push("-f".into());
    args.push(input.display().to_string());
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    splice(args)
}
