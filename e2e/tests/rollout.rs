//! `spec.rollout` on the real node: a template change restarts the Deployments whose pods carry
//! the old revision, never more at once than the budget and never below availability, and every
//! pod ends current, even when the leader is killed mid-rollout (no Deployment restarted twice);
//! a change whose sidecar exits 1 halts the rollout after the first restart.
//!
//! Splice runs as local processes (`splice run`, as in the operator tests); the Deployments' pods
//! really run on the real node (`e2e.splice.dev/node=real`, the testapp image). Timings are
//! printed as `REPORT ...` lines, not asserted beyond generous waits.

#[path = "../src/operator.rs"]
mod operator;

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use operator::*;
use serde_json::json;
use splice_crds::{InjectionPolicy, RolloutPhase};
use splice_e2e::{TestNamespace, real_node, unique_suffix, wait_until};

/// Short leases, so the kill of a leader hands over within seconds.
const LEASE: (u64, u64, u64) = (6, 4, 1);

/// One test at a time: each fills the real node with pods.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn report(line: String) {
    splice_e2e::report("rollout", line);
}

/// Waits until the policy's status names a template hash other than `before`; returns it.
async fn new_hash(api: &Api<InjectionPolicy>, name: &str, before: &str) -> Result<String> {
    wait_until(Duration::from_secs(60), "a new template hash", || async {
        Ok(template_hash(api, name).await?.is_some_and(|h| h != before))
    })
    .await?;
    template_hash(api, name).await?.context("no template hash")
}

#[tokio::test]
async fn a_template_change_restarts_every_outdated_deployment_once_under_the_budget_across_a_leader_kill()
-> Result<()> {
    let _serial = SERIAL.lock().await;
    let client = splice_e2e::client().await?;
    real_node(&client).await?;
    install_crd(&client).await?;
    let instance = format!("rollout-{}", unique_suffix());
    let splice_ns = TestNamespace::create("e2e-splice", &[]).await?;
    let _cleanup = PolicyCleanup {
        instance: instance.clone(),
    };
    let replica = |who: &str| {
        let mut o = SpliceOptions::new(&splice_ns.name, &instance);
        o.identity = Some(format!("{instance}-{who}"));
        o.lease = Some(LEASE);
        o.log_name = format!("splice-{instance}-{who}");
        o
    };
    let mut replicas = [
        Splice::start(replica("a")).await?,
        Splice::start(replica("b")).await?,
    ];
    let leases = splice_ns.api::<Lease>();
    wait_until(Duration::from_secs(30), "a replica to lead", || async {
        Ok(lease_holder(&leases).await?.is_some())
    })
    .await?;

    // In-tree: the API server injects, so killing the leader does not stop injection.
    let name = format!("{instance}-mesh");
    let rollout = json!({"maxConcurrent": 3, "maxConcurrentPerNamespace": 1, "timeout": "3m"});
    apply_policy(
        &client,
        &instance,
        &name,
        rollout_policy(&instance, "InTree", "v1", &["sleep"], rollout.clone()),
    )
    .await?;
    wait_policy(&client, &name, "True", Duration::from_secs(60)).await?;
    let policies: Api<InjectionPolicy> = Api::all(client.clone());
    let v1 = template_hash(&policies, &name)
        .await?
        .context("no template hash")?;
    let mut namespaces = Vec::new();
    for _ in 0..3 {
        let ns = TestNamespace::create("e2e-rollout", &[(&instance, "on")]).await?;
        wait_injecting(&client, &ns.name, &[("app", "probe")], ROLLOUT_SIDECAR).await?;
        namespaces.push(ns);
    }
    let per_namespace = 3;
    let started = Instant::now();
    deploy(
        &client,
        &namespaces,
        per_namespace,
        &instance,
        &name,
        Some(&v1),
    )
    .await?;
    report(format!(
        "REPORT rollout healthy: {} Deployments available with v1 in {:.1}s",
        per_namespace * namespaces.len(),
        started.elapsed().as_secs_f64()
    ));
    let before = revisions(&namespaces).await?;

    // v2: a healthy change.
    apply_policy(
        &client,
        &instance,
        &name,
        rollout_policy(&instance, "InTree", "v2", &["sleep"], rollout),
    )
    .await?;
    let changed = Instant::now();
    let v2 = new_hash(&policies, &name, &v1).await?;
    let mine = format!("{name}@{v2}");
    let (seen, watch) = watch_deployments(&client, &instance, mine.clone());

    // Kill the leader once the rollout is under way.
    wait_until(Duration::from_secs(120), "two restarts for v2", || async {
        Ok(seen.lock().unwrap_or_else(|e| e.into_inner()).restarted >= 2)
    })
    .await?;
    let leader = lease_holder(&leases).await?.context("no leader")?;
    let index = replicas
        .iter()
        .position(|r| r.options.identity.as_deref() == Some(leader.as_str()))
        .context("the leader is not one of the test's replicas")?;
    replicas[index].kill();
    let killed = Instant::now();
    let restarted_at_kill = seen.lock().unwrap_or_else(|e| e.into_inner()).restarted;
    wait_until(
        Duration::from_secs(LEASE.0 + 4 * LEASE.2 + 30),
        "the other replica to take over",
        || async { Ok(lease_holder(&leases).await?.is_some_and(|h| h != leader)) },
    )
    .await?;
    let took_over = killed.elapsed();

    let total = per_namespace * namespaces.len();
    let done = wait_complete(
        &client,
        &namespaces,
        per_namespace,
        &name,
        &v2,
        changed,
        (seen, watch),
    )
    .await?;
    report(format!(
        "REPORT rollout healthy: {total} Deployments in 3 namespaces, budget 3 (1 per namespace): complete {:.1}s after the change; at most {} restarting at once; fewest available replicas of any Deployment {:?}; leader killed after {restarted_at_kill} restarts, taken over in {:.1}s",
        done.took.as_secs_f64(),
        done.max_restarting,
        done.min_available,
        took_over.as_secs_f64(),
    ));
    ensure_restarted_once(&client, &name, 3, &done, &before).await
}

#[tokio::test]
async fn a_template_whose_sidecar_fails_halts_the_rollout_after_the_first_restart() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let client = splice_e2e::client().await?;
    real_node(&client).await?;
    let setup = Setup::start("halt").await?;
    let name = setup.policy("mesh");
    let timeout = 20;
    let rollout = json!({"maxConcurrent": 1, "timeout": format!("{timeout}s")});
    setup
        .apply(
            &name,
            rollout_policy(
                &setup.instance,
                "Webhook",
                "v1",
                &["sleep"],
                rollout.clone(),
            ),
        )
        .await?;
    wait_policy(&client, &name, "True", Duration::from_secs(60)).await?;
    let policies: Api<InjectionPolicy> = Api::all(client.clone());
    let v1 = template_hash(&policies, &name)
        .await?
        .context("no template hash")?;
    let ns = setup.app_namespace().await?;
    wait_injecting(&client, &ns.name, &[("app", "probe")], ROLLOUT_SIDECAR).await?;
    let namespaces = [ns];
    deploy(&client, &namespaces, 3, &setup.instance, &name, Some(&v1)).await?;

    // v2: the sidecar exits 1, so a restarted Deployment never becomes available.
    setup
        .apply(
            &name,
            rollout_policy(&setup.instance, "Webhook", "v2", &["exit", "1"], rollout),
        )
        .await?;
    let changed = Instant::now();
    let v2 = new_hash(&policies, &name, &v1).await?;
    let halted = wait_rollout(
        &policies,
        &name,
        &v2,
        RolloutPhase::Halted,
        Duration::from_secs(timeout + 150),
        |_| true,
    )
    .await?;
    let took = changed.elapsed();
    report(format!(
        "REPORT rollout halt: halted {:.1}s after the change (timeout {timeout}s, goal ≤ {}s); haltedBy {:?}",
        took.as_secs_f64(),
        timeout + 30,
        halted.halted_by
    ));
    ensure_rolled_out(&policies, &name, "False", "Halted").await?;
    wait_until(
        Duration::from_secs(30),
        "a RolloutHalted Warning Event",
        || async { Ok(warning_events(&client, &name, "RolloutHalted").await? >= 1) },
    )
    .await?;
    // Nothing more is restarted: two more planning periods and more.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let mine = format!("{name}@{v2}");
    let restarted: Vec<String> = namespaces[0]
        .api::<Deployment>()
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|d| restarted_for(d) == Some(mine.as_str()))
        .map(|d| d.name_any())
        .collect();
    ensure!(
        restarted.len() == 1,
        "expected one Deployment restarted for the failing revision, got {restarted:?}"
    );
    ensure!(
        halted
            .halted_by
            .as_deref()
            .is_some_and(|h| h.ends_with(&format!("/{}", restarted[0]))),
        "haltedBy {:?} is not the restarted Deployment {}",
        halted.halted_by,
        restarted[0]
    );
    Ok(())
}
