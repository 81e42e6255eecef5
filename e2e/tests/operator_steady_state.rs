//! Steady state makes no writes: 20 policies, 2 idle minutes, and the API server counts no write
//! request to anything Splice writes.
//!
//! A test binary of its own on purpose: cargo runs test binaries one after another, so no other
//! test writes webhook configurations, policies, Secrets or Events while this one measures.

#[path = "../src/operator.rs"]
mod operator;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result};
use kube::Client;
use operator::*;
use serde_json::json;
use splice_e2e::{TestNamespace, unique_suffix};

/// Resources Splice writes, as `apiserver_request_total` names them. Leases are counted apart:
/// renewing the Lease every retry period is how leader election works.
const SPLICE_WRITES: [&str; 5] = [
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "injectionpolicies",
    "secrets",
    "events",
];
const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// Write requests by resource, summed over every label but `resource` and `verb`.
async fn write_counts(client: &Client) -> Result<BTreeMap<String, f64>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(request)
        .await
        .context("reading the API server's /metrics")?;
    let mut counts = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let label = |key: &str| {
            let needle = format!("{key}=\"");
            labels
                .split_once(&needle)
                .and_then(|(_, rest)| rest.split_once('"'))
                .map(|(v, _)| v.to_owned())
        };
        let (Some(resource), Some(verb)) = (label("resource"), label("verb")) else {
            continue;
        };
        if !WRITE_VERBS.contains(&verb.as_str()) {
            continue;
        }
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let subresource = label("subresource").filter(|s| !s.is_empty());
        let key = match subresource {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource,
        };
        *counts.entry(key).or_insert(0.0) += value;
    }
    Ok(counts)
}

fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

#[tokio::test]
async fn twenty_idle_policies_cause_no_api_writes_for_two_minutes() -> Result<()> {
    let idle = std::env::var("SPLICE_STEADY_STATE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(120), Duration::from_secs);
    let client = splice_e2e::client().await?;
    install_crd(&client).await?;
    let instance = format!("steady-{}", unique_suffix());
    let splice_ns = TestNamespace::create("e2e-splice", &[]).await?;
    let _app = TestNamespace::create("e2e-app", &[(&instance, "on")]).await?;
    let _cleanup = PolicyCleanup {
        instance: instance.clone(),
    };
    let splice = Splice::start(SpliceOptions::new(&splice_ns.name, &instance)).await?;

    let names: Vec<String> = (0..20).map(|i| format!("{instance}-p{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let spec = json!({
            "namespaceSelector": {"matchLabels": {instance.clone(): "on"}},
            "template": {"containers": [{"name": format!("sidecar-{i}"), "image": "registry.invalid/s:1"}]}
        });
        apply_policy(&client, &instance, name, spec).await?;
    }
    for name in &names {
        wait_policy(&client, name, "True", Duration::from_secs(60)).await?;
    }
    // Let the start-up writes (statuses, Events, garbage collection) land before counting.
    tokio::time::sleep(Duration::from_secs(10)).await;

    let before = write_counts(&client).await?;
    let reconciles_before = reconciles(&splice).await?;
    tokio::time::sleep(idle).await;
    let after = write_counts(&client).await?;
    let reconciles_after = reconciles(&splice).await?;

    let writes = delta(&before, &after);
    let splice_writes: BTreeMap<&String, &f64> = writes
        .iter()
        .filter(|(k, _)| {
            SPLICE_WRITES
                .iter()
                .any(|r| k.split('/').next() == Some(*r))
        })
        .collect();
    println!(
        "steady state over {idle:?} with 20 policies: writes to Splice's resources {splice_writes:?}; \
         all API writes {writes:?}; reconciles {reconciles_before} -> {reconciles_after}"
    );
    assert!(
        splice_writes.is_empty(),
        "writes in steady state: {splice_writes:?}"
    );
    Ok(())
}

/// Total `splice_reconcile_total` over all results.
async fn reconciles(splice: &Splice) -> Result<f64> {
    Ok(splice
        .metrics()
        .await?
        .lines()
        .filter(|l| l.starts_with("splice_reconcile_total{"))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum())
}
