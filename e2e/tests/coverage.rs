//! Coverage against the real API server: a pod admitted while Splice was down (failurePolicy
//! Ignore) shows up as missed in `status.coverage`, with a PodsMissed Event and the
//! `splice_coverage_pods` gauge; a template change turns the injected pod outdated.

#[path = "../src/operator.rs"]
mod operator;

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams, PostParams};
use operator::*;
use serde_json::json;
use splice_crds::{Coverage, InjectionPolicy};
use splice_e2e::{TestNamespace, unique_suffix, wait_until};

fn spec(instance: &str, image: &str) -> serde_json::Value {
    json!({
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "objectSelector": {"matchLabels": {"app": "web"}},
        "template": {"containers": [{"name": "mesh-proxy", "image": image}]}
    })
}

async fn wait_coverage(
    api: &Api<InjectionPolicy>,
    name: &str,
    want: Coverage,
    timeout: Duration,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let p = api.get(name).await?;
        let got = p.status.and_then(|s| s.coverage);
        if got == Some(want) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("status.coverage of {name} is {got:?}, expected {want:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn gauge(metrics: &str, policy: &str, state: &str) -> Option<f64> {
    let prefix = format!("splice_coverage_pods{{policy=\"{policy}\",state=\"{state}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn a_pod_admitted_while_splice_was_down_is_counted_missed_with_an_event_and_a_metric()
-> Result<()> {
    let client = splice_e2e::client().await?;
    install_crd(&client).await?;
    let instance = format!("coverage-{}", unique_suffix());
    let splice_ns = TestNamespace::create("e2e-splice", &[]).await?;
    let app = TestNamespace::create("e2e-app", &[(&instance, "on")]).await?;
    let _cleanup = PolicyCleanup {
        instance: instance.clone(),
    };
    let mut splice = Splice::start(SpliceOptions::new(&splice_ns.name, &instance)).await?;
    let name = format!("{instance}-mesh");
    let policies: Api<InjectionPolicy> = Api::all(client.clone());
    apply_policy(
        &client,
        &instance,
        &name,
        spec(&instance, "registry.invalid/p:1"),
    )
    .await?;
    let ready = wait_policy(&client, &name, "True", Duration::from_secs(60)).await?;
    wait_injecting(&client, &app.name, &[("app", "web")], "mesh-proxy").await?;

    let pods: Api<Pod> = app.api();
    let injected = pods
        .create(&PostParams::default(), &pod("injected", &[("app", "web")]))
        .await?;
    assert!(container_names(&injected).contains(&"mesh-proxy".to_owned()));
    // A pod the policy does not select counts nowhere.
    pods.create(&PostParams::default(), &pod("other", &[("app", "api")]))
        .await?;
    wait_coverage(
        &policies,
        &name,
        Coverage {
            matched: 1,
            current: 1,
            outdated: 0,
            missed: 0,
        },
        Duration::from_secs(30),
    )
    .await?;

    // Pods created within the grace period after the configuration went in force are not
    // counted as missed (the API server may not call it yet); wait it out.
    let in_force = condition(&ready, "WebhookConfigured")
        .context("WebhookConfigured condition")?
        .last_transition_time
        .0;
    loop {
        let now = k8s_openapi::jiff::Timestamp::now();
        if now.duration_since(in_force).as_secs() > 11 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Splice down: the API server cannot reach the webhook and, failing open, admits the pod
    // without the sidecar.
    splice.kill();
    let missed = pods
        .create(&PostParams::default(), &pod("missed", &[("app", "web")]))
        .await?;
    assert!(
        !container_names(&missed).contains(&"mesh-proxy".to_owned()),
        "the webhook was down, yet the pod was injected"
    );
    let mut options = splice.options.clone();
    options.port = Some(splice.port);
    options.log_name.push_str("-restarted");
    let splice = Splice::start(options).await?;
    wait_coverage(
        &policies,
        &name,
        Coverage {
            matched: 2,
            current: 1,
            outdated: 0,
            missed: 1,
        },
        Duration::from_secs(60),
    )
    .await?;

    let events: Api<Event> = Api::all(client.clone());
    wait_until(Duration::from_secs(30), "a PodsMissed Event", || {
        let events = events.clone();
        let name = name.clone();
        let pod_ref = format!("{}/missed", app.name);
        async move {
            let list = events
                .list(
                    &ListParams::default()
                        .fields(&format!("involvedObject.name={name},reason=PodsMissed")),
                )
                .await?;
            Ok(list
                .items
                .iter()
                .any(|e| e.message.as_deref().is_some_and(|m| m.contains(&pod_ref))))
        }
    })
    .await?;
    let metrics = splice.metrics().await?;
    assert_eq!(gauge(&metrics, &name, "missed"), Some(1.0), "{metrics}");
    assert_eq!(gauge(&metrics, &name, "current"), Some(1.0), "{metrics}");

    // A template change: the injected pod now carries an outdated injection.
    apply_policy(
        &client,
        &instance,
        &name,
        spec(&instance, "registry.invalid/p:2"),
    )
    .await?;
    wait_coverage(
        &policies,
        &name,
        Coverage {
            matched: 2,
            current: 0,
            outdated: 1,
            missed: 1,
        },
        Duration::from_secs(30),
    )
    .await?;
    let metrics = splice.metrics().await?;
    assert_eq!(gauge(&metrics, &name, "outdated"), Some(1.0), "{metrics}");
    Ok(())
}
