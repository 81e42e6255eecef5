//! `kubectl splice`: the real kubectl (the control plane's) finds the `splice` binary on PATH
//! under the name `kubectl-splice` (the link `make install` makes) and runs `explain`, `inject`
//! and `rotate` through it, with kubectl's `--kubeconfig`, `--context` and `-n` flags, which
//! kubectl passes through to a plugin as typed. KUBECONFIG and HOME are cleared, so only the flags
//! can lead the plugin to the cluster.

#[path = "../src/operator.rs"]
mod operator;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, PostParams};
use operator::*;
use serde_json::json;
use splice_e2e::{controlplane_bin_dir, unique_suffix, wait_until};

/// A folder holding only `kubectl-splice`, a link to the `splice` binary under test, and a
/// kubeconfig whose current context points nowhere, with contexts `admin` and `admin-in-NS`
/// (namespace NS) for the real cluster.
struct PluginHome {
    dir: PathBuf,
    kubeconfig: PathBuf,
}

impl Drop for PluginHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PluginHome {
    fn create(namespace: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("splice-e2e-plugin-{}", unique_suffix()));
        std::fs::create_dir_all(dir.join("bin"))?;
        std::os::unix::fs::symlink(splice_bin()?, dir.join("bin/kubectl-splice"))?;
        let admin = admin_kubeconfig()?;
        let context = |name: &str, cluster: &str, ns: Option<&str>| {
            let mut c = json!({"name": name, "context": {"cluster": cluster, "user": "admin"}});
            if let Some(ns) = ns {
                c["context"]["namespace"] = json!(ns);
            }
            c
        };
        let config = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [
                {"name": "local", "cluster": admin["clusters"][0]["cluster"].clone()},
                // Nothing listens on port 1: a command that ignored --context would fail here.
                {"name": "nowhere", "cluster": {"server": "https://127.0.0.1:1"}},
            ],
            "users": [{"name": "admin", "user": admin["users"][0]["user"].clone()}],
            "contexts": [
                context("nowhere", "nowhere", None),
                context("admin", "local", None),
                context(&format!("admin-in-{namespace}"), "local", Some(namespace)),
            ],
            "current-context": "nowhere",
        });
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, serde_json::to_vec_pretty(&config)?)?;
        Ok(PluginHome { dir, kubeconfig })
    }

    /// Runs the control plane's kubectl with only this folder's plugin on PATH (before the
    /// system's), no KUBECONFIG and this folder as HOME.
    fn kubectl(&self, args: &[&str]) -> Result<Output> {
        let bin = controlplane_bin_dir()?.join("kubectl");
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![self.dir.join("bin")];
        paths.extend(std::env::split_paths(&path));
        Command::new(&bin)
            .args(args)
            .env("PATH", std::env::join_paths(paths)?)
            .env("HOME", &self.dir)
            .env_remove("KUBECONFIG")
            .env_remove("SPLICE_NAMESPACE")
            .output()
            .with_context(|| format!("running {}", bin.display()))
    }

    fn kubeconfig(&self) -> &str {
        self.kubeconfig.to_str().unwrap_or_default()
    }
}

/// stdout of a run that must succeed.
fn succeeded(out: Output, what: &str) -> Result<String> {
    ensure!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

fn write(dir: &Path, name: &str, text: &str) -> Result<String> {
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path.to_string_lossy().into_owned())
}

#[tokio::test]
async fn kubectl_runs_splice_as_a_plugin_with_its_kubeconfig_context_and_namespace_flags()
-> Result<()> {
    let setup = Setup::start("plugin").await?;
    let app = setup.app_namespace().await?;
    let name = setup.policy("mesh");
    setup
        .apply(
            &name,
            sidecar_spec(&setup.instance, "mesh-proxy", "registry.invalid/proxy:1"),
        )
        .await?;
    wait_policy(&setup.client, &name, "True", Duration::from_secs(60)).await?;
    wait_injecting(&setup.client, &app.name, &[], "mesh-proxy").await?;
    let pods: Api<Pod> = app.api();
    pods.create(&PostParams::default(), &pod("web", &[]))
        .await?;
    let home = PluginHome::create(&app.name)?;

    let listed = succeeded(home.kubectl(&["plugin", "list"])?, "kubectl plugin list")?;
    ensure!(
        listed.contains(&home.dir.join("bin/kubectl-splice").display().to_string()),
        "kubectl plugin list does not show the plugin: {listed}"
    );
    let help = succeeded(
        home.kubectl(&["splice", "--help"])?,
        "kubectl splice --help",
    )?;
    ensure!(help.contains("Usage: kubectl splice"), "{help}");

    // explain, with the namespace given, then taken from the context.
    let expected = format!("web in namespace {}: injection up to date", app.name);
    let admin_in_app = format!("admin-in-{}", app.name);
    for args in [
        vec!["splice", "explain", "web", "-n", &app.name],
        vec!["splice", "explain", "web", "--namespace", &app.name],
        vec!["splice", "explain", "web", "--context", &admin_in_app],
    ] {
        let mut args = args;
        if !args.contains(&"--context") {
            args.extend(["--context", "admin"]);
        }
        args.extend(["--kubeconfig", home.kubeconfig()]);
        let out = succeeded(home.kubectl(&args)?, &args.join(" "))?;
        ensure!(out.contains(&expected), "{}: {out}", args.join(" "));
        ensure!(
            out.lines()
                .any(|l| l.starts_with(&name) && l.contains(" yes ")),
            "{}: {name} not reported as matching: {out}",
            args.join(" ")
        );
    }
    // Without --context the kubeconfig's current context (nowhere) is used: proof that the flag
    // above was what reached the cluster.
    let out = home.kubectl(&[
        "splice",
        "explain",
        "web",
        "-n",
        &app.name,
        "--kubeconfig",
        home.kubeconfig(),
    ])?;
    ensure!(
        out.status.code() == Some(2),
        "explain through the current context nowhere: {out:?}"
    );
    ensure!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("reading pod {}/web", app.name)),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // inject: offline, no cluster involved.
    let policy = write(
        &home.dir,
        "policy.yaml",
        "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {name: mesh}\n\
         spec:\n  template:\n    containers: [{name: mesh-proxy, image: registry.invalid/proxy:1}]\n",
    )?;
    let manifest = write(
        &home.dir,
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\n\
         spec:\n  containers: [{name: app, image: registry.invalid/app:1}]\n",
    )?;
    let out = succeeded(
        home.kubectl(&[
            "splice", "inject", "-p", &policy, "-f", &manifest, "-n", "shop",
        ])?,
        "kubectl splice inject",
    )?;
    ensure!(out.contains("name: mesh-proxy"), "{out}");

    // rotate: the request reaches the CA Secret of the namespace given with -n.
    let splice_ns = setup.splice_ns.name.clone();
    let secrets: Api<Secret> = Api::namespaced(setup.client.clone(), &splice_ns);
    let before = secrets.get("splice-ca").await?;
    let out = succeeded(
        home.kubectl(&[
            "splice",
            "rotate",
            "-n",
            &splice_ns,
            "--context",
            "admin",
            "--kubeconfig",
            home.kubeconfig(),
        ])?,
        "kubectl splice rotate",
    )?;
    ensure!(out.contains("rotation requested"), "{out}");
    let phase = |s: &Secret| {
        s.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("splice.dev/ca-rotation-phase"))
            .cloned()
    };
    ensure!(
        phase(&before).is_none_or(|p| p == "Stable"),
        "a rotation was under way before the request: {:?}",
        phase(&before)
    );
    // The leader takes the request and starts a rotation (which then lasts at least the
    // propagation delay and the grace, longer than this wait).
    wait_until(
        Duration::from_secs(30),
        "the leader to start the requested rotation",
        || async {
            let now = secrets.get("splice-ca").await?;
            Ok(phase(&now).is_some_and(|p| p == "Trusting" || p == "Serving"))
        },
    )
    .await?;
    Ok(())
}
