//! In-place rollout on the real node: a native sidecar's new image reaches 3 Deployments × 2 pods
//! without restarting an application (same UIDs, the apps' restart counts unchanged, the
//! sidecars on the v2 image ID, phase Complete, coverage all current); an env change restarts the
//! Deployments under `Auto`, restarts nothing under `InPlace` and names the pods; an in-place
//! stage that halts is undone by `splice rollout undo`; a sidecar's CPU change is resized in
//! place or falls back to a restart, and the test says which.
//!
//! Splice runs as local processes (`splice run`); the pods really run on the real node with the
//! test images `splice-testapp:e2e` and `:e2e-v2` (the same program, another image ID).

#[path = "../src/operator.rs"]
mod operator;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use operator::*;
use serde_json::{Value, json};
use splice_crds::{InjectionPolicy, RolloutPhase};
use splice_e2e::{TestNamespace, real_node, wait_until};

/// One test at a time: each fills the real node with pods.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const SIDECAR: &str = "mesh-sidecar";
const TESTAPP_V2: &str = "splice-testapp:e2e-v2";

fn report(line: String) {
    splice_e2e::report("rollout_in_place", line);
}

/// A policy injecting a native sidecar (an init container with `restartPolicy: Always`) running
/// `image`, with `REV` in its env and `cpu` requested, and the given rollout.
fn sidecar_policy(instance: &str, image: &str, rev: &str, cpu: &str, rollout: Value) -> Value {
    json!({
        "mode": "Webhook",
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "template": {"initContainers": [{
            "name": SIDECAR,
            "image": image,
            "imagePullPolicy": "Never",
            "restartPolicy": "Always",
            "args": ["sleep"],
            "env": [{"name": "REV", "value": rev}],
            "resources": {"requests": {"cpu": cpu, "memory": "16Mi"}},
        }]},
        "rollout": rollout,
    })
}

/// What the test compares before and after, per pod (by name).
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    uid: String,
    app_restarts: i32,
    sidecar_image_id: String,
    sidecar_image: String,
}

async fn seen(ns: &TestNamespace) -> Result<BTreeMap<String, Seen>> {
    let pods = ns.api::<Pod>().list(&ListParams::default()).await?;
    let mut out = BTreeMap::new();
    for p in pods.items {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let status = p.status.clone().unwrap_or_default();
        let app = status
            .container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == "app");
        let sidecar = status
            .init_container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == SIDECAR);
        out.insert(
            p.name_any(),
            Seen {
                uid: p.uid().unwrap_or_default(),
                app_restarts: app.map_or(-1, |c| c.restart_count),
                sidecar_image_id: sidecar.map(|c| c.image_id.clone()).unwrap_or_default(),
                sidecar_image: p
                    .spec
                    .iter()
                    .flat_map(|s| s.init_containers.iter().flatten())
                    .find(|c| c.name == SIDECAR)
                    .and_then(|c| c.image.clone())
                    .unwrap_or_default(),
            },
        );
    }
    Ok(out)
}

/// `count` Deployments of `replicas` pods each in `ns`, available and injected at `hash`.
async fn deploy_replicated(
    ns: &TestNamespace,
    count: usize,
    replicas: i32,
    instance: &str,
    policy: &str,
    hash: &str,
) -> Result<()> {
    let api: Api<Deployment> = ns.api();
    for i in 0..count {
        let name = format!("app-{i}");
        let mut d = deployment(&name, instance);
        d["spec"]["replicas"] = replicas.into();
        api.patch(&name, &PatchParams::apply("e2e").force(), &Patch::Apply(&d))
            .await?;
    }
    wait_until(
        Duration::from_secs(180),
        "every Deployment available with its pods injected",
        || async {
            let ds = api.list(&ListParams::default()).await?;
            if ds.items.len() != count || !ds.items.iter().all(settled) {
                return Ok(false);
            }
            let pods = ns.api::<Pod>().list(&ListParams::default()).await?;
            let live: Vec<&Pod> = pods
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            Ok(live.len() == count * replicas as usize
                && live
                    .iter()
                    .all(|p| recorded_hash(p, policy) == Some(hash.to_owned())))
        },
    )
    .await
}

fn recorded_hash(p: &Pod, policy: &str) -> Option<String> {
    let status: Value = serde_json::from_str(p.annotations().get("splice.dev/status")?).ok()?;
    status.get(policy)?.get("hash")?.as_str().map(str::to_owned)
}

async fn hash_after(
    api: &Api<InjectionPolicy>,
    name: &str,
    before: Option<&str>,
) -> Result<String> {
    wait_until(Duration::from_secs(60), "a new template hash", || async {
        Ok(template_hash(api, name)
            .await?
            .is_some_and(|h| Some(h.as_str()) != before))
    })
    .await?;
    template_hash(api, name).await?.context("no template hash")
}

/// Sets up Splice, a namespace and `count` × `replicas` pods injected with the v1 sidecar.
async fn start(
    prefix: &str,
    count: usize,
    replicas: i32,
    rollout: Value,
) -> Result<(Setup, TestNamespace, String, String)> {
    let setup = Setup::start(prefix).await?;
    let name = setup.policy("mesh");
    setup
        .apply(
            &name,
            sidecar_policy(&setup.instance, TESTAPP, "v1", "10m", rollout),
        )
        .await?;
    wait_policy(&setup.client, &name, "True", Duration::from_secs(60)).await?;
    let policies: Api<InjectionPolicy> = Api::all(setup.client.clone());
    let v1 = hash_after(&policies, &name, None).await?;
    let ns = setup.app_namespace().await?;
    wait_injecting(&setup.client, &ns.name, &[("app", "probe")], SIDECAR).await?;
    deploy_replicated(&ns, count, replicas, &setup.instance, &name, &v1).await?;
    Ok((setup, ns, name, v1))
}

#[tokio::test]
async fn a_native_sidecars_new_image_reaches_every_pod_in_place_and_no_application_restarts()
-> Result<()> {
    let _serial = SERIAL.lock().await;
    let client = splice_e2e::client().await?;
    real_node(&client).await?;
    let rollout = json!({"maxConcurrent": 2, "maxConcurrentPerNamespace": 2, "timeout": "2m"});
    let (setup, ns, name, v1) = start("inplace", 3, 2, rollout.clone()).await?;
    let before = seen(&ns).await?;
    ensure!(before.len() == 6, "6 pods expected, got {before:?}");

    setup
        .apply(
            &name,
            sidecar_policy(&setup.instance, TESTAPP_V2, "v1", "10m", rollout),
        )
        .await?;
    let changed = Instant::now();
    let policies: Api<InjectionPolicy> = Api::all(client.clone());
    let v2 = hash_after(&policies, &name, Some(&v1)).await?;
    let done = wait_rollout(
        &policies,
        &name,
        &v2,
        RolloutPhase::Complete,
        Duration::from_secs(240),
        |s| s.updated_in_place == 6,
    )
    .await?;
    let took = changed.elapsed();
    ensure!(done.done == 0, "no Deployment restarted: {done:?}");
    let after = seen(&ns).await?;
    ensure!(after.len() == 6, "6 pods after, got {after:?}");
    let old_ids: Vec<&str> = before
        .values()
        .map(|s| s.sidecar_image_id.as_str())
        .collect();
    for (pod, b) in &before {
        let a = after
            .get(pod)
            .with_context(|| format!("pod {pod} is gone: it was replaced, not updated"))?;
        ensure!(a.uid == b.uid, "pod {pod} changed UID");
        ensure!(
            a.app_restarts == b.app_restarts,
            "pod {pod}: the application restarted ({} -> {})",
            b.app_restarts,
            a.app_restarts
        );
        ensure!(
            a.sidecar_image.ends_with(TESTAPP_V2),
            "pod {pod}: image {}",
            a.sidecar_image
        );
        ensure!(
            !a.sidecar_image_id.is_empty() && !old_ids.contains(&a.sidecar_image_id.as_str()),
            "pod {pod}: the sidecar runs image ID {} (v1's: {old_ids:?})",
            a.sidecar_image_id
        );
    }
    let restarted: Vec<String> = ns
        .api::<Deployment>()
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|d| restarted_for(d).is_some())
        .map(|d| d.name_any())
        .collect();
    ensure!(restarted.is_empty(), "Deployments restarted: {restarted:?}");
    ensure_rolled_out(&policies, &name, "True", "Complete").await?;
    wait_until(Duration::from_secs(30), "coverage all current", || async {
        let c = policies.get(&name).await?.status.and_then(|s| s.coverage);
        Ok(c.is_some_and(|c| c.current == 6 && c.outdated == 0 && c.missed == 0))
    })
    .await?;
    report(format!(
        "REPORT rollout_in_place image: 6 pods (3 Deployments × 2) on the v2 sidecar in place, complete {:.1}s after the change (budget 2); UIDs kept, 0 application restarts, 0 Deployments restarted",
        took.as_secs_f64()
    ));
    drop(setup);
    Ok(())
}

#[tokio::test]
async fn an_env_change_restarts_under_auto_and_under_in_place_restarts_nothing_and_names_the_pods()
-> Result<()> {
    let _serial = SERIAL.lock().await;
    let client = splice_e2e::client().await?;
    real_node(&client).await?;
    let auto = json!({"maxConcurrent": 2, "maxConcurrentPerNamespace": 2, "timeout": "2m"});
    let (setup, ns, name, v1) = start("inplace-env", 2, 1, auto.clone()).await?;
    let policies: Api<InjectionPolicy> = Api::all(client.clone());

    // Auto: an env change cannot be made in place, so the Deployments restart.
    setup
        .apply(
            &name,
            sidecar_policy(&setup.instance, TESTAPP, "v2", "10m", auto.clone()),
        )
        .await?;
    let v2 = hash_after(&policies, &name, Some(&v1)).await?;
    let done = wait_rollout(
        &policies,
        &name,
        &v2,
        RolloutPhase::Complete,
        Duration::from_secs(240),
        |s| s.done == 2,
    )
    .await?;
    ensure!(done.updated_in_place == 0, "{done:?}");
    let restarted = ns
        .api::<Deployment>()
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|d| restarted_for(d).is_some_and(|r| r.ends_with(&v2)))
        .count();
    ensure!(
        restarted == 2,
        "both Deployments restarted under Auto, got {restarted}"
    );

    // InPlace: the same kind of change restarts nothing and names the pods.
    let before = seen(&ns).await?;
    let in_place = json!({"maxConcurrent": 2, "timeout": "2m", "strategy": "InPlace"});
    setup
        .apply(
            &name,
            sidecar_policy(&setup.instance, TESTAPP, "v3", "10m", in_place),
        )
        .await?;
    let v3 = hash_after(&policies, &name, Some(&v2)).await?;
    let s = wait_rollout(
        &policies,
        &name,
        &v3,
        RolloutPhase::Idle,
        Duration::from_secs(60),
        |s| s.not_in_place == 2,
    )
    .await?;
    ensure!(s.restarting == 0 && s.updating == 0, "{s:?}");
    ensure_rolled_out(&policies, &name, "False", "NeedsRestart").await?;
    wait_until(
        Duration::from_secs(30),
        "a NeedsRestart Warning naming the pods",
        || async {
            let notes = event_notes(&client, &name, "NeedsRestart").await?;
            Ok(notes
                .iter()
                .any(|n| before.keys().all(|pod| n.contains(pod.as_str()))))
        },
    )
    .await?;
    // Two more planning periods: still nothing restarted.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let after = seen(&ns).await?;
    ensure!(
        after.keys().eq(before.keys())
            && after
                .iter()
                .all(|(k, a)| before.get(k).is_some_and(|b| b.uid == a.uid)),
        "under InPlace no pod is replaced: {before:?} -> {after:?}"
    );
    report(
        "REPORT rollout_in_place env: Auto restarted 2 of 2 Deployments; InPlace restarted 0 and named 2 pods (notInPlace 2, RolledOut False NeedsRestart)".into(),
    );
    drop(setup);
    Ok(())
}

#[tokio::test]
async fn a_halted_in_place_stage_is_put_back_by_rollout_undo() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let client = splice_e2e::client().await?;
    real_node(&client).await?;
    let timeout = 20;
    let rollout = json!({"maxConcurrent": 1, "timeout": format!("{timeout}s")});
    let (setup, ns, name, v1) = start("inplace-undo", 2, 1, rollout.clone()).await?;
    let policies: Api<InjectionPolicy> = Api::all(client.clone());
    let before = seen(&ns).await?;

    // An image the node does not have, never pulled (imagePullPolicy Never): never Ready.
    setup
        .apply(
            &name,
            sidecar_policy(
                &setup.instance,
                "splice-testapp:e2e-absent",
                "v1",
                "10m",
                rollout,
            ),
        )
        .await?;
    let changed = Instant::now();
    let v2 = hash_after(&policies, &name, Some(&v1)).await?;
    let halted = wait_rollout(
        &policies,
        &name,
        &v2,
        RolloutPhase::Halted,
        Duration::from_secs(timeout + 90),
        |_| true,
    )
    .await?;
    let took = changed.elapsed();
    let by = halted.halted_by.clone().unwrap_or_default();
    ensure!(
        by.starts_with(&format!("Pod/{}/", ns.name)),
        "haltedBy {by:?}"
    );
    wait_until(
        Duration::from_secs(30),
        "a RolloutHalted Warning naming the pod and the container",
        || async {
            let notes = event_notes(&client, &name, "RolloutHalted").await?;
            Ok(notes.iter().any(|n| n.contains(&by) && n.contains(SIDECAR)))
        },
    )
    .await?;
    let mid = seen(&ns).await?;
    let changed_pods: Vec<&String> = mid
        .iter()
        .filter(|(_, s)| s.sidecar_image.ends_with("e2e-absent"))
        .map(|(k, _)| k)
        .collect();
    ensure!(
        changed_pods.len() == 1,
        "budget 1: one pod changed, got {changed_pods:?}"
    );

    let out = tokio::process::Command::new(splice_bin()?)
        .args(["rollout", "undo", &name])
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "rollout undo failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(stdout.contains('1'), "undo says how many: {stdout}");
    wait_until(
        Duration::from_secs(60),
        "the earlier image back and Ready",
        || async {
            let now = seen(&ns).await?;
            let pods = ns.api::<Pod>().list(&ListParams::default()).await?;
            let ready = pods.items.iter().all(|p| {
                p.status
                    .iter()
                    .flat_map(|s| s.init_container_statuses.iter().flatten())
                    .filter(|c| c.name == SIDECAR)
                    .all(|c| c.started == Some(true))
            });
            Ok(ready
                && now.iter().all(|(k, s)| {
                    s.sidecar_image.ends_with(TESTAPP)
                        && before.get(k).is_some_and(|b| b.uid == s.uid)
                }))
        },
    )
    .await?;
    report(format!(
        "REPORT rollout_in_place undo: halted {:.1}s after the change (timeout {timeout}s) on {by}; `rollout undo` put {} pod back on the earlier image, same UID: {}",
        took.as_secs_f64(),
        changed_pods.len(),
        stdout.trim()
    ));
    drop(setup);
    Ok(())
}

#[tokio::test]
async fn a_sidecars_cpu_change_is_resized_in_place_or_falls_back_to_a_restart_and_says_which()
-> Result<()> {
    let _serial = SERIAL.lock().await;
    let client = splice_e2e::client().await?;
    real_node(&client).await?;
    let rollout = json!({"maxConcurrent": 2, "timeout": "2m"});
    let (setup, ns, name, v1) = start("inplace-resize", 1, 1, rollout.clone()).await?;
    let policies: Api<InjectionPolicy> = Api::all(client.clone());
    let before = seen(&ns).await?;
    setup
        .apply(
            &name,
            sidecar_policy(&setup.instance, TESTAPP, "v1", "20m", rollout),
        )
        .await?;
    let v2 = hash_after(&policies, &name, Some(&v1)).await?;
    let done = wait_rollout(
        &policies,
        &name,
        &v2,
        RolloutPhase::Complete,
        Duration::from_secs(240),
        |s| s.updated_in_place + s.done == 1,
    )
    .await?;
    let after = seen(&ns).await?;
    let kept = before
        .iter()
        .all(|(k, b)| after.get(k).is_some_and(|a| a.uid == b.uid));
    let how = if done.updated_in_place == 1 {
        ensure!(kept, "resized in place, yet the pod was replaced");
        "resized in place (same UID)"
    } else {
        ensure!(!kept, "fell back to a restart, yet the pod was kept");
        "fell back to a restart of its Deployment"
    };
    report(format!(
        "REPORT rollout_in_place resize: the sidecar's CPU request 10m -> 20m was {how}"
    ));
    drop(setup);
    Ok(())
}
