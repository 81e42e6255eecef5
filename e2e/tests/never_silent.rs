//! Injection never stops silently: an invalid update keeps the last good generation serving on
//! every replica; the API server's selector match stands even when Splice's namespace cache has
//! not caught up, and a pod the API server's own cache kept from the webhook is reported missed.

#[path = "../src/operator.rs"]
mod operator;

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use futures::future::try_join_all;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use operator::*;
use serde_json::{Value, json};
use splice_crds::InjectionPolicy;
use splice_e2e::{TestNamespace, audit_events, audit_log, dry_run, wait_until};

/// A sidecar whose image tag comes from `values.tag`, in namespaces labelled `<instance>=on`.
fn tagged(instance: &str, image: &str, tag: &str) -> Value {
    json!({
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "values": {"tag": tag},
        "template": {"containers": [{"name": "proxy", "image": image}]}
    })
}

async fn dry_run_image(ns: &TestNamespace) -> Result<Option<String>> {
    let created = ns
        .api::<Pod>()
        .create(&dry_run(), &pod("probe", &[]))
        .await?;
    Ok(image_of(&created, "proxy"))
}

#[tokio::test]
async fn an_invalid_update_keeps_the_configuration_and_every_replica_serving_the_last_good_generation()
-> Result<()> {
    // The validating webhook would refuse the invalid update at apply (e2e/tests/validate.rs);
    // without it, as when Splice is down, the update reaches the cluster.
    let mut s = Setup::start_with("lastgood", &["--validating-webhook=false"]).await?;
    let ns = s.app_namespace().await?;
    let name = s.policy("mesh");
    let policies: Api<InjectionPolicy> = Api::all(s.client.clone());
    s.apply(
        &name,
        tagged(&s.instance, "registry.invalid/proxy:{{ values.tag }}", "1"),
    )
    .await?;
    wait_policy(&s.client, &name, "True", Duration::from_secs(30)).await?;
    wait_injecting(&s.client, &ns.name, &[], "proxy").await?;
    let good = policies.get(&name).await?;
    let before = configuration(&s.client, &name)
        .await?
        .context("configuration")?;

    // A typo in a live policy: the template reads a value that does not exist.
    s.apply(
        &name,
        tagged(&s.instance, "registry.invalid/proxy:{{ values.tga }}", "2"),
    )
    .await?;
    let bad_generation = good.metadata.generation.unwrap_or_default() + 1;
    wait_until(
        Duration::from_secs(30),
        "Ready=False for the new generation",
        || async {
            let p = policies.get(&name).await?;
            let at_generation =
                p.status.as_ref().and_then(|s| s.observed_generation) == Some(bad_generation);
            Ok(at_generation && condition(&p, "Ready").is_some_and(|c| c.status == "False"))
        },
    )
    .await?;
    let held = policies.get(&name).await?;
    let status = held.status.clone().unwrap_or_default();
    let ready = condition(&held, "Ready").context("Ready")?;
    assert_eq!(ready.reason, "InvalidTemplate", "{}", ready.message);
    assert!(
        ready.message.contains("spec.template.containers[0].image"),
        "{}",
        ready.message
    );
    assert!(ready.message.contains("values.tga"), "{}", ready.message);
    assert_eq!(status.serving_generation, good.metadata.generation);
    assert_eq!(
        status.template_hash,
        good.status.as_ref().and_then(|s| s.template_hash.clone()),
        "the hash in force is the last good generation's"
    );
    let after = configuration(&s.client, &name)
        .await?
        .context("the configuration is still there")?;
    assert_eq!(
        after.resource_version(),
        before.resource_version(),
        "the webhook configuration is left exactly as it was"
    );
    assert_eq!(
        dry_run_image(&ns).await?.as_deref(),
        Some("registry.invalid/proxy:1")
    );
    wait_until(Duration::from_secs(20), "a Warning Event", || async {
        Ok(warning_events(&s.client, &name, "InvalidTemplate").await? > 0)
    })
    .await?;

    // A replica that starts while the spec is invalid serves the last good generation too.
    s.splice.kill();
    let mut options = s.splice.options.clone();
    options.port = Some(s.splice.port);
    options.log_name.push_str("-restarted");
    s.splice = Splice::start(options).await?;
    assert_eq!(
        dry_run_image(&ns).await?.as_deref(),
        Some("registry.invalid/proxy:1"),
        "a fresh replica injects the generation in force"
    );

    // Fixed: the new generation takes over.
    s.apply(
        &name,
        tagged(&s.instance, "registry.invalid/proxy:{{ values.tag }}", "3"),
    )
    .await?;
    let fixed = wait_policy(&s.client, &name, "True", Duration::from_secs(30)).await?;
    assert_eq!(
        fixed.status.as_ref().and_then(|s| s.serving_generation),
        fixed.metadata.generation
    );
    wait_until(Duration::from_secs(20), "the fixed template", || async {
        Ok(dry_run_image(&ns).await?.as_deref() == Some("registry.invalid/proxy:3"))
    })
    .await?;
    Ok(())
}

/// Whether the API server's audit log records a call of `webhook` while it created pod `name` in
/// `namespace`: the mutating-webhook annotations of that create, which name every webhook called.
fn api_server_called(events: &[Value], namespace: &str, name: &str, webhook: &str) -> bool {
    events
        .iter()
        .filter(|e| {
            e["verb"] == "create"
                && e["objectRef"]["resource"] == "pods"
                && e["objectRef"]["namespace"] == namespace
                && e["objectRef"]["name"] == name
        })
        .filter_map(|e| e["annotations"].as_object())
        .flat_map(|a| a.iter())
        .filter(|(k, _)| k.starts_with("mutation.webhook.admission.k8s.io/"))
        .filter_map(|(_, v)| serde_json::from_str::<Value>(v.as_str()?).ok())
        .any(|call| call["webhook"] == webhook)
}

/// The API server matches `namespaceSelector` against its own namespace cache, which can lag a
/// label by milliseconds; then it calls no webhook for the pod, and no webhook could have injected
/// it. What Splice owes: every pod it is called for is injected (its own cache never overrules the
/// API server's match), and a pod it was not called for is not silent.
#[tokio::test]
async fn ten_namespaces_labelled_a_moment_before_their_first_pod_get_injected_or_reported_missed()
-> Result<()> {
    let log = audit_log()?;
    let s = Setup::start("fresh-ns").await?;
    let name = s.policy("mesh");
    s.apply(
        &name,
        sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:1"),
    )
    .await?;
    let ready = wait_policy(&s.client, &name, "True", Duration::from_secs(30)).await?;
    // The webhook is called (its configuration is in force) before the race starts.
    let warm = s.app_namespace().await?;
    wait_injecting(&s.client, &warm.name, &[], "proxy").await?;
    // Coverage counts an uninjected pod as missed only once the configuration has been in force
    // for its grace period; the race starts after it.
    let configured = condition(&ready, "WebhookConfigured")
        .context("no WebhookConfigured condition")?
        .last_transition_time
        .0;
    let in_force = configured + Duration::from_secs(11);
    while Timestamp::now() < in_force {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Namespaces that already accept pods (their default ServiceAccount exists), so that
    // nothing but the API server's match stands between labelling one and creating a pod in it.
    let fresh = try_join_all((0..10).map(|_| TestNamespace::create("e2e-fresh", &[]))).await?;
    let namespaces: Api<Namespace> = Api::all(s.client.clone());
    let label = json!({"metadata": {"labels": {s.instance.as_str(): "on"}}});
    let one = |ns: &TestNamespace| {
        let namespaces = namespaces.clone();
        let label = label.clone();
        let pods = ns.api::<Pod>();
        let name = ns.name.clone();
        async move {
            // Labelled, then given a pod at once, with no wait in between.
            namespaces
                .patch(&name, &PatchParams::default(), &Patch::Merge(&label))
                .await?;
            let created = pods
                .create(&PostParams::default(), &pod("app", &[]))
                .await?;
            anyhow::Ok((name, created))
        }
    };
    let results = try_join_all(fresh.iter().map(one)).await?;
    let missed: Vec<String> = results
        .iter()
        .filter(|(_, p)| !container_names(p).iter().any(|c| c == "proxy"))
        .map(|(ns, _)| format!("{ns}/app"))
        .collect();
    splice_e2e::report(
        "never_silent",
        format!(
            "fresh namespaces: {} of 10 pods not sent to the webhook",
            missed.len()
        ),
    );
    if missed.is_empty() {
        return Ok(());
    }

    // Each uninjected pod was one the API server did not send: had Splice been called, it would
    // have injected it.
    let webhook = format!("{name}.splice.dev");
    let recorded = |events: &[Value]| {
        results.iter().all(|(ns, _)| {
            events.iter().any(|e| {
                e["verb"] == "create"
                    && e["objectRef"]["resource"] == "pods"
                    && e["objectRef"]["namespace"] == ns.as_str()
            })
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let events = loop {
        let events = audit_events(&log)?;
        if recorded(&events) {
            break events;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the audit log at {} does not record the pod creates",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for ns in results.iter().map(|(ns, _)| ns) {
        let called = api_server_called(&events, ns, "app", &webhook);
        let injected = !missed.contains(&format!("{ns}/app"));
        ensure!(
            called == injected,
            "pod {ns}/app: the API server called {webhook}: {called}, injected: {injected}"
        );
    }

    // And it is not silent: coverage counts it, and a Warning Event names it.
    let policies: Api<InjectionPolicy> = Api::all(s.client.clone());
    wait_until(
        Duration::from_secs(30),
        "coverage to count the missed pods",
        || {
            let policies = policies.clone();
            let name = name.clone();
            let n = missed.len() as i64;
            async move {
                let policy = policies.get(&name).await?;
                let counted = policy
                    .status
                    .and_then(|s| s.coverage)
                    .map_or(0, |c| c.missed);
                Ok(counted >= n)
            }
        },
    )
    .await?;
    wait_until(
        Duration::from_secs(30),
        "a PodsMissed Event naming them",
        || async {
            let notes = event_notes(&s.client, &name, "PodsMissed").await?;
            Ok(missed
                .iter()
                .all(|m| notes.iter().any(|n| n.contains(m.as_str()))))
        },
    )
    .await?;
    Ok(())
}
