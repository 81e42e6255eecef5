//! `spec.rollout` on the real node: a template change restarts the Deployments whose pods carry
//! the old revision, never more at once than the budget and never below availability, and every
//! pod ends current, even when the leader is killed mid-rollout (no Deployment restarted twice);
//! a change whose sidecar exits 1 halts the rollout after the first restart; and with a pinned
//! canary, 20 Deployments in 4 namespaces: the canary's namespace goes first and alone, new pods
//! outside it keep the promoted revision, a failing change halts in the canary and a fix
//! completes.
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
use serde_json::{Value, json};
use splice_crds::{InjectionPolicy, Mode, RolloutPhase};
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

/// The template hash a dry-run pod created in `ns` gets from policy `name`.
async fn dry_run_hash(client: &kube::Client, ns: &str, name: &str) -> Result<Option<String>> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let created = pods
        .create(&splice_e2e::dry_run(), &pod("probe", &[("app", "probe")]))
        .await?;
    Ok(created
        .annotations()
        .get("splice.dev/status")
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
        .and_then(|s| s.get(name)?.get("hash")?.as_str().map(str::to_owned)))
}

/// Deployments restarted for `policy@revision` in `namespaces`.
async fn restarted_in(namespaces: &[TestNamespace], mine: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for ns in namespaces {
        for d in ns
            .api::<Deployment>()
            .list(&ListParams::default())
            .await?
            .items
        {
            if restarted_for(&d) == Some(mine) {
                out.push(format!("{}/{}", ns.name, d.name_any()));
            }
        }
    }
    Ok(out)
}

/// Waits until the rollout reports an open canary for `canary` while pinning `stable`, and
/// checks what new pods get meanwhile: the canary's namespace the new revision, the others the
/// promoted one.
async fn canary_open(
    client: &kube::Client,
    policies: &Api<InjectionPolicy>,
    name: &str,
    (canary, stable): (&str, &str),
    (canary_ns, other_ns): (&TestNamespace, &TestNamespace),
) -> Result<()> {
    wait_until(Duration::from_secs(60), "the canary to open", || async {
        let s = policies.get(name).await?.status.and_then(|s| s.rollout);
        Ok(s.is_some_and(|s| {
            s.canary_revision.as_deref() == Some(canary)
                && s.stable.as_ref().map(|st| st.template_hash.as_str()) == Some(stable)
        }))
    })
    .await?;
    wait_until(
        Duration::from_secs(30),
        "new pods split by the canary",
        || async {
            Ok(dry_run_hash(client, &canary_ns.name, name)
                .await?
                .as_deref()
                == Some(canary)
                && dry_run_hash(client, &other_ns.name, name).await?.as_deref() == Some(stable))
        },
    )
    .await
}

#[tokio::test]
async fn a_pinned_canary_goes_first_promotes_itself_when_healthy_and_halts_alone_when_not()
-> Result<()> {
    const BUDGET: usize = 3;
    let _serial = SERIAL.lock().await;
    let client = splice_e2e::client().await?;
    real_node(&client).await?;
    let setup = Setup::start("canary").await?;
    let name = setup.policy("mesh");
    let tier = format!("{}-tier", setup.instance);
    let timeout = 20;
    let rollout = json!({
        "maxConcurrent": BUDGET, "maxConcurrentPerNamespace": 2, "timeout": format!("{timeout}s"),
        "canary": {"namespaceSelector": {"matchLabels": {tier.as_str(): "canary"}}},
    });
    let spec = |rev: &str, args: &[&str]| {
        rollout_policy(&setup.instance, "Auto", rev, args, rollout.clone())
    };
    setup.apply(&name, spec("v1", &["sleep"])).await?;
    wait_policy(&client, &name, "True", Duration::from_secs(60)).await?;
    let policies: Api<InjectionPolicy> = Api::all(client.clone());
    let v1 = template_hash(&policies, &name)
        .await?
        .context("no template hash")?;
    // 20 Deployments: the canary's namespace first, then three outside it.
    let all = [
        TestNamespace::create("e2e-canary", &[(&setup.instance, "on"), (&tier, "canary")]).await?,
        setup.app_namespace().await?,
        setup.app_namespace().await?,
        setup.app_namespace().await?,
    ];
    let (canary_ns, prod) = (&all[0], &all[1..]);
    for ns in &all {
        wait_injecting(&client, &ns.name, &[("app", "probe")], ROLLOUT_SIDECAR).await?;
    }
    let per_namespace = 5;
    deploy(
        &client,
        &all,
        per_namespace,
        &setup.instance,
        &name,
        Some(&v1),
    )
    .await?;
    // v1 is promoted as it is: there was nothing before it to pin.
    wait_until(Duration::from_secs(30), "v1 promoted", || async {
        let s = policies.get(&name).await?.status.and_then(|s| s.rollout);
        Ok(s.and_then(|s| s.stable)
            .is_some_and(|st| st.template_hash == v1))
    })
    .await?;

    // v2, healthy: the canary namespace first, then the rest.
    let before = revisions(&all).await?;
    setup.apply(&name, spec("v2", &["sleep"])).await?;
    let changed = Instant::now();
    let v2 = new_hash(&policies, &name, &v1).await?;
    canary_open(&client, &policies, &name, (&v2, &v1), (canary_ns, &prod[0])).await?;
    // The status reports the mode once the reconcile that split the entry has written it.
    wait_until(
        Duration::from_secs(30),
        "the status to say an open canary is served by webhook",
        || async {
            Ok(policies.get(&name).await?.status.and_then(|s| s.mode) == Some(Mode::Webhook))
        },
    )
    .await?;
    let hooks = configuration(&client, &name)
        .await?
        .and_then(|c| c.webhooks)
        .map_or(0, |w| w.len());
    ensure!(
        hooks == 2,
        "while the canary is open the policy has a canary entry and one for the rest, got {hooks} webhooks"
    );
    let mine = format!("{name}@{v2}");
    let watch = watch_deployments(&client, &setup.instance, mine.clone());
    // While the canary is open, nothing outside it restarts.
    let mut canary_phase_seen = false;
    let promoted = loop {
        let s = policies.get(&name).await?.status.and_then(|s| s.rollout);
        let phase = s.as_ref().map(|s| s.phase);
        if phase == Some(RolloutPhase::Canary) {
            canary_phase_seen = true;
            let early = restarted_in(prod, &mine).await?;
            ensure!(
                early.is_empty(),
                "restarted outside the open canary: {early:?}"
            );
        } else if s
            .as_ref()
            .and_then(|s| s.stable.as_ref())
            .map(|st| st.template_hash.as_str())
            == Some(v2.as_str())
        {
            break changed.elapsed();
        }
        ensure!(
            changed.elapsed() < Duration::from_secs(180),
            "v2 was not promoted within 180 s: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    ensure!(canary_phase_seen, "the rollout never reported phase Canary");
    let canary_done = restarted_in(&all[..1], &mine).await?;
    ensure!(
        canary_done.len() == per_namespace,
        "promoted with canary restarts {canary_done:?}"
    );
    let done = wait_complete(&client, &all, per_namespace, &name, &v2, changed, watch).await?;
    ensure_restarted_once(&client, &name, BUDGET, &done, &before).await?;
    // An in-tree policy is served by webhook while the canary is open, and in-tree again after.
    wait_until(
        Duration::from_secs(30),
        "the policy back in-tree",
        || async {
            Ok(policies.get(&name).await?.status.and_then(|s| s.mode) == Some(Mode::InTree))
        },
    )
    .await?;
    report(format!(
        "REPORT rollout canary: {} Deployments in 4 namespaces (1 canary), budget {BUDGET} (2 per namespace): promoted {:.1}s and complete {:.1}s after the change; at most {} restarting at once",
        done.revisions.len(),
        promoted.as_secs_f64(),
        done.took.as_secs_f64(),
        done.max_restarting,
    ));

    // v3: the sidecar exits 1. The canary halts alone; new pods elsewhere keep v2.
    setup.apply(&name, spec("v3", &["exit", "1"])).await?;
    let changed = Instant::now();
    let v3 = new_hash(&policies, &name, &v2).await?;
    canary_open(&client, &policies, &name, (&v3, &v2), (canary_ns, &prod[1])).await?;
    let halted = wait_rollout(
        &policies,
        &name,
        &v3,
        RolloutPhase::Halted,
        Duration::from_secs(timeout + 150),
        |_| true,
    )
    .await?;
    let took = changed.elapsed();
    ensure_rolled_out(&policies, &name, "False", "Halted").await?;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let mine = format!("{name}@{v3}");
    let outside = restarted_in(prod, &mine).await?;
    ensure!(outside.is_empty(), "a halted canary restarted {outside:?}");
    for ns in prod {
        ensure!(
            dry_run_hash(&client, &ns.name, &name).await?.as_deref() == Some(v2.as_str()),
            "a new pod outside the halted canary did not get v2"
        );
    }
    ensure!(
        halted
            .halted_by
            .as_deref()
            .is_some_and(|h| h.contains(&canary_ns.name)),
        "haltedBy {:?} is not a canary workload",
        halted.halted_by
    );
    report(format!(
        "REPORT rollout canary: v3 (sidecar exits 1) halted {:.1}s after the change (timeout {timeout}s), no Deployment outside the canary restarted",
        took.as_secs_f64()
    ));

    // v4 fixes it: the canary goes again, is promoted, and the rollout completes, each
    // Deployment restarted once more (the halted canary one included).
    let before = revisions(&all).await?;
    setup.apply(&name, spec("v4", &["sleep"])).await?;
    let changed = Instant::now();
    let v4 = new_hash(&policies, &name, &v3).await?;
    let watch = watch_deployments(&client, &setup.instance, format!("{name}@{v4}"));
    let done = wait_complete(&client, &all, per_namespace, &name, &v4, changed, watch).await?;
    ensure_restarted_once(&client, &name, BUDGET, &done, &before).await?;
    ensure!(
        done.status
            .stable
            .as_ref()
            .map(|s| s.template_hash.as_str())
            == Some(v4.as_str()),
        "v4 complete but not promoted: {:?}",
        done.status.stable
    );
    report(format!(
        "REPORT rollout canary: v4 fixed the halted canary: complete {:.1}s after the change",
        done.took.as_secs_f64()
    ));
    Ok(())
}
