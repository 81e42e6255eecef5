//! Injection never stops silently: an invalid update keeps the last good generation serving on
//! every replica, and the API server's selector match stands even when Splice's namespace cache
//! has not caught up.

#[path = "../src/operator.rs"]
mod operator;

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use futures::future::try_join_all;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use operator::*;
use serde_json::{Value, json};
use splice_crds::InjectionPolicy;
use splice_e2e::{TestNamespace, dry_run, wait_until};

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

#[tokio::test]
async fn ten_namespaces_each_created_labelled_and_given_a_pod_at_once_get_ten_injected_pods()
-> Result<()> {
    let s = Setup::start("fresh-ns").await?;
    let name = s.policy("mesh");
    s.apply(
        &name,
        sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:1"),
    )
    .await?;
    wait_policy(&s.client, &name, "True", Duration::from_secs(30)).await?;
    // The webhook is called (its configuration is in force) before the race starts.
    let warm = s.app_namespace().await?;
    wait_injecting(&s.client, &warm.name, &[], "proxy").await?;

    // Namespaces that already accept pods (their default ServiceAccount exists), so that
    // nothing but Splice stands between labelling one and creating a pod in it.
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
    let missed: Vec<&str> = results
        .iter()
        .filter(|(_, p)| !container_names(p).iter().any(|c| c == "proxy"))
        .map(|(ns, _)| ns.as_str())
        .collect();
    ensure!(missed.is_empty(), "pods not injected in {missed:?}");
    Ok(())
}
