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

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use operator::*;
use serde_json::{Value, json};
use splice_crds::{InjectionPolicy, Mode, RolloutPhase, RolloutStatus};
use splice_e2e::{NODE_LABEL, TestNamespace, real_node, unique_suffix, wait_until};

const TESTAPP: &str = "splice-testapp:e2e";
const SIDECAR: &str = "rollout-sidecar";
const RESTARTED_FOR: &str = "splice.dev/restartedFor";
/// Short leases, so the kill of a leader hands over within seconds.
const LEASE: (u64, u64, u64) = (6, 4, 1);

/// One test at a time: each fills the real node with pods.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn report(line: String) {
    splice_e2e::report("rollout", line);
}

/// A policy injecting one sidecar (`args`, with `REV` in its env) into namespaces labelled
/// `<instance>=on`, with a rollout.
fn policy(instance: &str, mode: &str, rev: &str, args: &[&str], rollout: Value) -> Value {
    json!({
        "mode": mode,
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "template": {"containers": [{
            "name": SIDECAR,
            "image": TESTAPP,
            "imagePullPolicy": "Never",
            "args": args,
            "env": [{"name": "REV", "value": rev}],
        }]},
        "rollout": rollout,
    })
}

/// A one-replica Deployment of the test application on the real node.
fn deployment(name: &str, instance: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"e2e-rollout": instance}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {NODE_LABEL: "real"},
                    "tolerations": [{"key": NODE_LABEL, "operator": "Equal", "value": "real", "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{
                        "name": "app",
                        "image": TESTAPP,
                        "imagePullPolicy": "Never",
                        "args": ["sleep"],
                    }],
                },
            },
        },
    })
}

/// What `kubectl rollout status` waits for (and the rollout's planner too).
fn settled(d: &Deployment) -> bool {
    let (Some(spec), Some(status)) = (d.spec.as_ref(), d.status.as_ref()) else {
        return false;
    };
    let desired = spec.replicas.unwrap_or(1);
    let updated = status.updated_replicas.unwrap_or(0);
    status.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
        && updated >= desired
        && status.replicas.unwrap_or(0) <= updated
        && status.available_replicas.unwrap_or(0) >= desired
}

fn restarted_for(d: &Deployment) -> Option<&str> {
    d.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(RESTARTED_FOR)
        .map(String::as_str)
}

/// Creates `count` Deployments in each namespace and waits until every one is available with
/// its pod injected at `hash`.
async fn deploy(
    client: &Client,
    namespaces: &[TestNamespace],
    count: usize,
    instance: &str,
    policy: &str,
    hash: &str,
) -> Result<()> {
    for ns in namespaces {
        let api: Api<Deployment> = ns.api();
        for i in 0..count {
            let name = format!("app-{i}");
            api.patch(
                &name,
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&deployment(&name, instance)),
            )
            .await?;
        }
    }
    wait_until(
        Duration::from_secs(180),
        "every Deployment available with its pod injected",
        || async {
            for ns in namespaces {
                let ds = ns.api::<Deployment>().list(&ListParams::default()).await?;
                if ds.items.len() != count || !ds.items.iter().all(settled) {
                    return Ok(false);
                }
            }
            all_current(client, namespaces, count, policy, hash).await
        },
    )
    .await
}

/// True when the namespaces hold exactly `per_namespace` pods each, every one carrying the
/// policy's injection at `hash` (terminating pods count, so the old ones must be gone).
async fn all_current(
    client: &Client,
    namespaces: &[TestNamespace],
    per_namespace: usize,
    policy: &str,
    hash: &str,
) -> Result<bool> {
    for ns in namespaces {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
        let list = pods.list(&ListParams::default()).await?;
        if list.items.len() != per_namespace {
            return Ok(false);
        }
        for p in &list.items {
            let status = p
                .annotations()
                .get("splice.dev/status")
                .and_then(|s| serde_json::from_str::<Value>(s).ok());
            let got = status
                .as_ref()
                .and_then(|s| s.get(policy))
                .and_then(|e| e.get("hash"))
                .and_then(Value::as_str);
            if got != Some(hash) {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

async fn template_hash(api: &Api<InjectionPolicy>, name: &str) -> Result<Option<String>> {
    Ok(api.get(name).await?.status.and_then(|s| s.template_hash))
}

/// Waits until the policy's status names a template hash other than `before`; returns it.
async fn new_hash(api: &Api<InjectionPolicy>, name: &str, before: &str) -> Result<String> {
    wait_until(Duration::from_secs(60), "a new template hash", || async {
        Ok(template_hash(api, name).await?.is_some_and(|h| h != before))
    })
    .await?;
    template_hash(api, name).await?.context("no template hash")
}

/// Waits until the policy's `status.rollout` is at `revision` in `phase` and `done(status)`.
async fn wait_rollout(
    api: &Api<InjectionPolicy>,
    name: &str,
    revision: &str,
    phase: RolloutPhase,
    timeout: Duration,
    done: impl Fn(&RolloutStatus) -> bool,
) -> Result<RolloutStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        let s = api.get(name).await?.status.and_then(|s| s.rollout);
        if let Some(s) = &s
            && s.revision == revision
            && s.phase == phase
            && done(s)
        {
            return Ok(s.clone());
        }
        if Instant::now() > deadline {
            bail!("the rollout of {revision} did not reach {phase:?} within {timeout:?}: {s:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn ensure_rolled_out(
    api: &Api<InjectionPolicy>,
    name: &str,
    status: &str,
    reason: &str,
) -> Result<()> {
    let p = api.get(name).await?;
    let rolled = condition(&p, "RolledOut").context("no RolledOut condition")?;
    ensure!(
        rolled.status == status && rolled.reason == reason,
        "RolledOut is {} {}, expected {status} {reason}",
        rolled.status,
        rolled.reason
    );
    Ok(())
}

/// What a watch of the test's Deployments saw during a rollout of `mine`.
#[derive(Default)]
struct Observed {
    /// Most Deployments restarted for `mine` and not settled at any one time.
    max_restarting: usize,
    /// Fewest available replicas any Deployment had (they all want 1, maxUnavailable 0).
    min_available: Option<i32>,
    /// Deployments seen restarted for `mine`.
    restarted: usize,
}

/// Watches every Deployment labelled `e2e-rollout=<instance>` until dropped.
fn watch_deployments(
    client: &Client,
    instance: &str,
    mine: String,
) -> (Arc<Mutex<Observed>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Observed::default()));
    let api: Api<Deployment> = Api::all(client.clone());
    let config = watcher::Config::default().labels(&format!("e2e-rollout={instance}"));
    let out = Arc::clone(&seen);
    let task = tokio::spawn(async move {
        let mut state: HashMap<(String, String), Deployment> = HashMap::new();
        let mut events = std::pin::pin!(watcher(api, config));
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) => {
                    state.insert((d.namespace().unwrap_or_default(), d.name_any()), d);
                }
                Ok(watcher::Event::Delete(d)) => {
                    state.remove(&(d.namespace().unwrap_or_default(), d.name_any()));
                }
                _ => continue,
            }
            let restarting = state
                .values()
                .filter(|d| restarted_for(d) == Some(&mine) && !settled(d))
                .count();
            let restarted = state
                .values()
                .filter(|d| restarted_for(d) == Some(&mine))
                .count();
            let available = state
                .values()
                .map(|d| {
                    d.status
                        .as_ref()
                        .and_then(|s| s.available_replicas)
                        .unwrap_or(0)
                })
                .min();
            let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
            o.max_restarting = o.max_restarting.max(restarting);
            o.restarted = restarted;
            if let Some(a) = available {
                o.min_available = Some(o.min_available.map_or(a, |m| m.min(a)));
            }
        }
    });
    (seen, task)
}

/// Each Deployment's `deployment.kubernetes.io/revision`: 1 + the times its template changed.
async fn revisions(namespaces: &[TestNamespace]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for ns in namespaces {
        for d in ns
            .api::<Deployment>()
            .list(&ListParams::default())
            .await?
            .items
        {
            let rev = d
                .annotations()
                .get("deployment.kubernetes.io/revision")
                .cloned()
                .unwrap_or_default();
            out.insert(format!("{}/{}", ns.name, d.name_any()), rev);
        }
    }
    Ok(out)
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
        policy(&instance, "InTree", "v1", &["sleep"], rollout.clone()),
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
        wait_injecting(&client, &ns.name, &[("app", "probe")], SIDECAR).await?;
        namespaces.push(ns);
    }
    let per_namespace = 3;
    let started = Instant::now();
    deploy(&client, &namespaces, per_namespace, &instance, &name, &v1).await?;
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
        policy(&instance, "InTree", "v2", &["sleep"], rollout),
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
    wait_rollout(
        &policies,
        &name,
        &v2,
        RolloutPhase::Complete,
        Duration::from_secs(300),
        |s| s.done == total as i64,
    )
    .await?;
    let complete = changed.elapsed();
    wait_until(Duration::from_secs(90), "every pod current at v2", || {
        all_current(&client, &namespaces, per_namespace, &name, &v2)
    })
    .await?;
    watch.abort();
    let after = revisions(&namespaces).await?;
    let (max_restarting, min_available) = {
        let o = seen.lock().unwrap_or_else(|e| e.into_inner());
        (o.max_restarting, o.min_available)
    };
    report(format!(
        "REPORT rollout healthy: {total} Deployments in 3 namespaces, budget 3 (1 per namespace): complete {:.1}s after the change; at most {max_restarting} restarting at once; fewest available replicas of any Deployment {min_available:?}; leader killed after {restarted_at_kill} restarts, taken over in {:.1}s",
        complete.as_secs_f64(),
        took_over.as_secs_f64(),
    ));
    ensure!(
        max_restarting <= 3,
        "the watch saw {max_restarting} Deployments restarting at once (budget 3)"
    );
    ensure!(
        min_available.is_some_and(|a| a >= 1),
        "a Deployment fell below its availability: {min_available:?}"
    );
    for (deployment, rev) in &after {
        let was: u32 = before
            .get(deployment)
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let now: u32 = rev.parse().unwrap_or(0);
        ensure!(
            now == was + 1,
            "{deployment} went from revision {was} to {now}: restarted {} times",
            now.saturating_sub(was)
        );
    }
    ensure_rolled_out(&policies, &name, "True", "Complete").await?;
    Ok(())
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
            policy(
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
    wait_injecting(&client, &ns.name, &[("app", "probe")], SIDECAR).await?;
    let namespaces = [ns];
    deploy(&client, &namespaces, 3, &setup.instance, &name, &v1).await?;

    // v2: the sidecar exits 1, so a restarted Deployment never becomes available.
    setup
        .apply(
            &name,
            policy(&setup.instance, "Webhook", "v2", &["exit", "1"], rollout),
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
async fn dry_run_hash(client: &Client, ns: &str, name: &str) -> Result<Option<String>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
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
    client: &Client,
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
    let _serial = SERIAL.lock().await;
    let client = splice_e2e::client().await?;
    real_node(&client).await?;
    let setup = Setup::start("canary").await?;
    let name = setup.policy("mesh");
    let tier = format!("{}-tier", setup.instance);
    let timeout = 20;
    let rollout = json!({
        "maxConcurrent": 2, "maxConcurrentPerNamespace": 1, "timeout": format!("{timeout}s"),
        "canary": {"namespaceSelector": {"matchLabels": {tier.as_str(): "canary"}}},
    });
    let spec =
        |rev: &str, args: &[&str]| policy(&setup.instance, "Auto", rev, args, rollout.clone());
    setup.apply(&name, spec("v1", &["sleep"])).await?;
    wait_policy(&client, &name, "True", Duration::from_secs(60)).await?;
    let policies: Api<InjectionPolicy> = Api::all(client.clone());
    let v1 = template_hash(&policies, &name)
        .await?
        .context("no template hash")?;
    // The canary's namespace first, then two outside it.
    let all = [
        TestNamespace::create("e2e-canary", &[(&setup.instance, "on"), (&tier, "canary")]).await?,
        setup.app_namespace().await?,
        setup.app_namespace().await?,
    ];
    let (canary_ns, prod) = (&all[0], &all[1..]);
    for ns in &all {
        wait_injecting(&client, &ns.name, &[("app", "probe")], SIDECAR).await?;
    }
    let per_namespace = 2;
    deploy(&client, &all, per_namespace, &setup.instance, &name, &v1).await?;
    // v1 is promoted as it is: there was nothing before it to pin.
    wait_until(Duration::from_secs(30), "v1 promoted", || async {
        let s = policies.get(&name).await?.status.and_then(|s| s.rollout);
        Ok(s.and_then(|s| s.stable)
            .is_some_and(|st| st.template_hash == v1))
    })
    .await?;

    // v2, healthy: the canary namespace first, then the rest.
    setup.apply(&name, spec("v2", &["sleep"])).await?;
    let changed = Instant::now();
    let v2 = new_hash(&policies, &name, &v1).await?;
    canary_open(&client, &policies, &name, (&v2, &v1), (canary_ns, &prod[0])).await?;
    ensure!(
        policies.get(&name).await?.status.and_then(|s| s.mode) == Some(Mode::Webhook),
        "an open canary is served by webhook"
    );
    let hooks = configuration(&client, &name)
        .await?
        .and_then(|c| c.webhooks)
        .map_or(0, |w| w.len());
    ensure!(
        hooks == 2,
        "while the canary is open the policy has a canary entry and one for the rest, got {hooks} webhooks"
    );
    let mine = format!("{name}@{v2}");
    let (seen, watch) = watch_deployments(&client, &setup.instance, mine.clone());
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
    let total = per_namespace * all.len();
    wait_rollout(
        &policies,
        &name,
        &v2,
        RolloutPhase::Complete,
        Duration::from_secs(300),
        |s| s.done == total as i64,
    )
    .await?;
    let complete = changed.elapsed();
    wait_until(Duration::from_secs(90), "every pod current at v2", || {
        all_current(&client, &all, per_namespace, &name, &v2)
    })
    .await?;
    watch.abort();
    let (max_restarting, min_available) = {
        let o = seen.lock().unwrap_or_else(|e| e.into_inner());
        (o.max_restarting, o.min_available)
    };
    ensure!(
        max_restarting <= 2,
        "{max_restarting} restarting at once (budget 2)"
    );
    ensure!(
        min_available.is_some_and(|a| a >= 1),
        "a Deployment fell below its availability: {min_available:?}"
    );
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
        "REPORT rollout canary: {total} Deployments in 3 namespaces (1 canary), budget 2: promoted {:.1}s and complete {:.1}s after the change; at most {max_restarting} restarting at once",
        promoted.as_secs_f64(),
        complete.as_secs_f64(),
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

    // v4 fixes it: the canary goes again, is promoted, and the rollout completes.
    setup.apply(&name, spec("v4", &["sleep"])).await?;
    let changed = Instant::now();
    let v4 = new_hash(&policies, &name, &v3).await?;
    wait_rollout(
        &policies,
        &name,
        &v4,
        RolloutPhase::Complete,
        Duration::from_secs(300),
        |s| s.done == total as i64 && s.stable.as_ref().is_some_and(|st| st.template_hash == v4),
    )
    .await?;
    wait_until(Duration::from_secs(90), "every pod current at v4", || {
        all_current(&client, &all, per_namespace, &name, &v4)
    })
    .await?;
    report(format!(
        "REPORT rollout canary: v4 fixed the halted canary: complete {:.1}s after the change",
        changed.elapsed().as_secs_f64()
    ));
    Ok(())
}
