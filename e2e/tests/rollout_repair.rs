//! `rollout.repairMissed` on the real node: pods created while the webhook is down under
//! `failurePolicy: Ignore` are admitted without the injection; once Splice is back, their
//! Deployments are restarted under the budget, each once, never below availability, until every
//! pod carries the injection and the rollout is Complete.
//!
//! Splice runs as a local process (`splice run`, as in the operator tests) and is killed with
//! SIGKILL, so the API server cannot reach the webhook; the Deployments' pods really run on the
//! real node (`e2e.splice.dev/node=real`, the testapp image). Timings are printed as `REPORT ...`
//! lines, not asserted beyond generous waits.

#[path = "../src/operator.rs"]
mod operator;

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use operator::*;
use serde_json::json;
use splice_crds::InjectionPolicy;
use splice_e2e::{real_node, unique_suffix, wait_dry_run};

/// Short leases, so the restarted process leads again within seconds.
const LEASE: (u64, u64, u64) = (6, 4, 1);
/// The policy's `rollout.maxConcurrent`.
const BUDGET: usize = 2;
const NAMESPACES: usize = 3;
const PER_NAMESPACE: usize = 2;

fn report(line: String) {
    splice_e2e::report("rollout_repair", line);
}

#[tokio::test]
async fn pods_admitted_uninjected_while_the_webhook_was_down_are_repaired_once_each_under_the_budget()
-> Result<()> {
    let client = splice_e2e::client().await?;
    real_node(&client).await?;
    let identity = format!("repair-{}", unique_suffix());
    let mut setup = Setup::start_configured("repair", |o| {
        o.identity = Some(identity);
        o.lease = Some(LEASE);
    })
    .await?;
    let name = setup.policy("mesh");
    let rollout = json!({"maxConcurrent": BUDGET, "repairMissed": true, "timeout": "3m"});
    let mut spec = rollout_policy(&setup.instance, "Webhook", "v1", &["sleep"], rollout);
    spec["failurePolicy"] = json!("Ignore");
    setup.apply(&name, spec).await?;
    wait_policy(&client, &name, "True", Duration::from_secs(60)).await?;
    let policies: Api<InjectionPolicy> = Api::all(client.clone());
    let v1 = template_hash(&policies, &name)
        .await?
        .context("no template hash")?;
    let mut namespaces = Vec::new();
    for _ in 0..NAMESPACES {
        let ns = setup.app_namespace().await?;
        wait_injecting(&client, &ns.name, &[("app", "probe")], ROLLOUT_SIDECAR).await?;
        namespaces.push(ns);
    }

    // Coverage counts a pod as missed when it was created once Ready was True: Ready waits for
    // the API server's evidence, so there is no grace to wait out.
    // Splice down: the API server cannot reach the webhook and, failing open, admits pods
    // without the sidecar.
    setup.splice.kill();
    let probe: Api<Pod> = namespaces[0].api();
    wait_dry_run(
        &probe,
        &pod("probe", &[("app", "probe")]),
        Duration::from_secs(30),
        "a pod admitted without the sidecar",
        |created| {
            !container_names(created)
                .iter()
                .any(|c| c == ROLLOUT_SIDECAR)
        },
    )
    .await?;
    let started = Instant::now();
    deploy(
        &client,
        &namespaces,
        PER_NAMESPACE,
        &setup.instance,
        &name,
        None,
    )
    .await?;
    let total = NAMESPACES * PER_NAMESPACE;
    report(format!(
        "REPORT rollout_repair: {total} Deployments available uninjected (webhook down) in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    let before = revisions(&namespaces).await?;

    // Splice back, on the same port (the webhook configuration's URL) and admin port.
    let mine = format!("{name}@{v1}");
    let (seen, watch) = watch_deployments(&client, &setup.instance, mine.clone());
    let mut options = setup.splice.options.clone();
    options.port = Some(setup.splice.port);
    options.admin_port = Some(setup.splice.admin_port);
    options.log_name.push_str("-restarted");
    let restarted = Instant::now();
    setup.splice = Splice::start(options).await?;
    let done = wait_complete(
        &client,
        &namespaces,
        PER_NAMESPACE,
        &name,
        &v1,
        restarted,
        (seen, watch),
    )
    .await?;
    report(format!(
        "REPORT rollout_repair: {total} missed Deployments in {NAMESPACES} namespaces, budget {BUDGET} (1 per namespace): complete {:.1}s after Splice restarted; at most {} restarting at once; fewest available replicas of any Deployment {:?}; status {:?}",
        done.took.as_secs_f64(),
        done.max_restarting,
        done.min_available,
        done.status,
    ));
    ensure!(
        done.restarted == total,
        "the watch saw {} of {total} Deployments restarted for {mine}",
        done.restarted
    );
    ensure_restarted_once(&client, &name, BUDGET, &done, &before).await
}
