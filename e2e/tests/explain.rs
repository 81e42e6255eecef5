//! `splice explain POD -n NS` against the real API server: a pod injected by one policy and not
//! selected by another (the report names the selector requirement), a pod in Splice's own
//! namespace (the report names the exclusion), the same pod outdated after a template change, and
//! a clear error for a pod that does not exist.

#[path = "../src/operator.rs"]
mod operator;

use std::process::Output;
use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use operator::*;
use serde_json::{Value, json};
use splice_e2e::{TestNamespace, unique_suffix};

async fn explain(args: &[&str]) -> Result<Output> {
    tokio::process::Command::new(splice_bin()?)
        .arg("explain")
        .args(args)
        .env("KUBECONFIG", splice_e2e::kubeconfig_path())
        .output()
        .await
        .context("running splice explain")
}

async fn explain_json(pod: &str, namespace: &str, splice_ns: &str) -> Result<Value> {
    let out = explain(&[
        pod,
        "-n",
        namespace,
        "--splice-namespace",
        splice_ns,
        "-o",
        "json",
    ])
    .await?;
    assert!(
        out.status.success(),
        "splice explain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn policy<'a>(report: &'a Value, name: &str) -> &'a Value {
    let found = report["policies"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name));
    assert!(found.is_some(), "no policy {name} in {report:#}");
    found.unwrap_or(&Value::Null)
}

fn mesh(instance: &str, image: &str) -> Value {
    json!({
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "objectSelector": {"matchLabels": {"app": "web"}},
        "template": {
            "containers": [{"name": "mesh-proxy", "image": image}],
            "volumes": [{"name": "mesh-certs", "emptyDir": {}}],
            "env": [{"name": "MESH_ENABLED", "value": "1"}]
        }
    })
}

#[tokio::test]
async fn explain_names_the_selector_the_exclusion_and_an_outdated_injection() -> Result<()> {
    let client = splice_e2e::client().await?;
    install_crd(&client).await?;
    let instance = format!("explain-{}", unique_suffix());
    // Splice's own namespace carries the label the policies select, so only the exclusion can
    // keep its pods out.
    let splice_ns = TestNamespace::create("e2e-splice", &[(&instance, "on")]).await?;
    let app = TestNamespace::create("e2e-app", &[(&instance, "on")]).await?;
    let _cleanup = PolicyCleanup {
        instance: instance.clone(),
    };
    let _splice = Splice::start(SpliceOptions::new(&splice_ns.name, &instance)).await?;
    let mesh_name = format!("{instance}-mesh");
    let logs_name = format!("{instance}-logs");
    apply_policy(
        &client,
        &instance,
        &mesh_name,
        mesh(&instance, "registry.invalid/m:1"),
    )
    .await?;
    apply_policy(
        &client,
        &instance,
        &logs_name,
        json!({
            "namespaceSelector": {"matchLabels": {instance.clone(): "on"}},
            "objectSelector": {"matchLabels": {"logging": "on"}},
            "template": {"containers": [{"name": "log-shipper", "image": "registry.invalid/l:1"}]}
        }),
    )
    .await?;
    wait_policy(&client, &mesh_name, "True", Duration::from_secs(60)).await?;
    wait_policy(&client, &logs_name, "True", Duration::from_secs(60)).await?;
    wait_injecting(&client, &app.name, &[("app", "web")], "mesh-proxy").await?;

    let pods: Api<Pod> = app.api();
    pods.create(&PostParams::default(), &pod("web", &[("app", "web")]))
        .await?;
    let report = explain_json("web", &app.name, &splice_ns.name).await?;
    let m = policy(&report, &mesh_name);
    assert_eq!(m["matches"], true, "{m:#}");
    assert_eq!(m["injection"]["state"], "current", "{m:#}");
    assert_eq!(m["injected"]["containers"], json!(["mesh-proxy"]), "{m:#}");
    assert_eq!(m["injected"]["volumes"], json!(["mesh-certs"]), "{m:#}");
    assert_eq!(
        m["injected"]["env"]["app"],
        json!(["MESH_ENABLED"]),
        "{m:#}"
    );
    let l = policy(&report, &logs_name);
    assert_eq!(l["matches"], false, "{l:#}");
    assert_eq!(l["verdict"]["decidedBy"], "objectSelector", "{l:#}");
    let requirement = l["verdict"]["requirement"].as_str().unwrap_or_default();
    assert!(
        requirement.starts_with("spec.objectSelector.matchLabels[\"logging\"]"),
        "{requirement}"
    );
    assert_eq!(report["outdated"], false);

    // The human table says the same.
    let out = explain(&[
        "web",
        "-n",
        &app.name,
        "--splice-namespace",
        &splice_ns.name,
    ])
    .await?;
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("env in app: MESH_ENABLED"), "{table}");
    assert!(table.contains("matchLabels[\"logging\"]"), "{table}");

    // A pod in Splice's own namespace: the exclusion decides, not the (matching) selectors.
    let own: Api<Pod> = splice_ns.api();
    own.create(&PostParams::default(), &pod("web", &[("app", "web")]))
        .await?;
    let report = explain_json("web", &splice_ns.name, &splice_ns.name).await?;
    let m = policy(&report, &mesh_name);
    assert_eq!(m["matches"], false, "{m:#}");
    assert_eq!(m["verdict"]["decidedBy"], "excludedNamespace", "{m:#}");
    assert_eq!(m["injection"]["state"], "notInjected", "{m:#}");

    // A template change makes the existing pod's injection outdated.
    apply_policy(
        &client,
        &instance,
        &mesh_name,
        mesh(&instance, "registry.invalid/m:2"),
    )
    .await?;
    wait_policy(&client, &mesh_name, "True", Duration::from_secs(30)).await?;
    let report = explain_json("web", &app.name, &splice_ns.name).await?;
    let m = policy(&report, &mesh_name);
    assert_eq!(m["injection"]["state"], "outdated", "{m:#}");
    assert_eq!(report["outdated"], true, "{report:#}");

    // A pod that does not exist: exit 2 and a message naming it.
    let out = explain(&["nope", "-n", &app.name]).await?;
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("pod \"nope\" not found"), "{stderr}");
    Ok(())
}

/// Offline: the same report from files, no cluster involved. A pod injected by `splice inject`
/// shows what each policy added; a policy file that does not exist is exit 2 naming it.
#[tokio::test]
async fn explain_offline_reads_the_injection_record_that_splice_inject_wrote() -> Result<()> {
    let root = splice_e2e::repo_root();
    let mesh = root.join("examples/mesh-proxy.yaml");
    let pod = root.join("examples/pod.yaml");
    let injected = tokio::process::Command::new(splice_bin()?)
        .args(["inject", "--namespace-label", "mesh=enabled", "-f"])
        .arg(&pod)
        .arg("-p")
        .arg(&mesh)
        .output()
        .await?;
    assert!(
        injected.status.success(),
        "{}",
        String::from_utf8_lossy(&injected.stderr)
    );
    let dir = std::env::temp_dir().join(format!("splice-explain-{}", unique_suffix()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("pod.yaml");
    std::fs::write(&file, &injected.stdout)?;

    let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let out = explain(&[
        "-f",
        &path(&file),
        "-p",
        &path(&mesh),
        "--namespace-label",
        "mesh=enabled",
        "-o",
        "json",
    ])
    .await?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout)?;
    let m = policy(&report, "mesh-proxy");
    assert_eq!(m["matches"], true, "{m:#}");
    assert_eq!(m["injection"]["state"], "current", "{m:#}");
    assert_eq!(m["injected"]["initContainers"][0], "mesh-init", "{m:#}");

    // Without the namespace label, the namespace selector decides, and says which label.
    let out = explain(&["-f", &path(&file), "-p", &path(&mesh), "-o", "json"]).await?;
    let report: Value = serde_json::from_slice(&out.stdout)?;
    let m = policy(&report, "mesh-proxy");
    assert_eq!(m["verdict"]["decidedBy"], "namespaceSelector", "{m:#}");
    assert!(
        m["reason"]
            .as_str()
            .is_some_and(|r| r.contains("matchLabels[\"mesh\"]")),
        "{m:#}"
    );

    let missing = dir.join("missing.yaml");
    let out = explain(&["-f", &path(&file), "-p", &path(&missing)]).await?;
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("missing.yaml"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
