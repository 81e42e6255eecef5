//! Proof that the local control plane is real: the controller-manager, the scheduler and kwok
//! make workloads Running, the disruption controller counts them, and the API server's
//! MutatingAdmissionWebhook plugin calls a webhook over HTTPS.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};
use serde_json::json;
use splice_e2e::{
    AgnhostWebhook, TestNamespace, WebhookConfigurationGuard, wait_dry_run, wait_until,
};

fn pod(name: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        // kwok never pulls images; the name only has to be valid.
        "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]}
    }))?)
}

#[tokio::test]
async fn a_two_replica_deployment_runs_on_kwok_nodes_and_its_pdb_counts_both_pods() -> Result<()> {
    let ns = TestNamespace::create("e2e-smoke-deploy", &[]).await?;
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "registry.invalid/web:1"}]}
            }
        }
    }))?;
    ns.api::<Deployment>()
        .create(&PostParams::default(), &deployment)
        .await?;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}
    }))?;
    ns.api::<PodDisruptionBudget>()
        .create(&PostParams::default(), &pdb)
        .await?;

    let deployments = ns.api::<Deployment>();
    wait_until(Duration::from_secs(60), "availableReplicas = 2", || async {
        let d = deployments.get("web").await?;
        Ok(d.status.and_then(|s| s.available_replicas) == Some(2))
    })
    .await?;

    let pods = ns
        .api::<Pod>()
        .list(&ListParams::default().labels("app=web"))
        .await?;
    assert_eq!(pods.items.len(), 2, "exactly two pods back the Deployment");
    for p in &pods.items {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        assert_eq!(
            phase,
            Some("Running"),
            "pod {:?} is Running",
            p.metadata.name
        );
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default();
        assert!(
            node.starts_with("kwok-node-"),
            "pod scheduled on a kwok node, got {node:?}"
        );
    }

    let pdbs = ns.api::<PodDisruptionBudget>();
    wait_until(
        Duration::from_secs(60),
        "PDB currentHealthy = 2",
        || async {
            let p = pdbs.get("web").await?;
            Ok(p.status.and_then(|s| s.current_healthy) == Some(2))
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn agnhost_sidecar_webhook_mutates_pods_in_the_labelled_namespace_only() -> Result<()> {
    let key = format!("smoke-sidecar-{}", splice_e2e::unique_suffix());
    let selected = TestNamespace::create("e2e-smoke-hook", &[(&key, "enabled")]).await?;
    let other = TestNamespace::create("e2e-smoke-nohook", &[]).await?;

    let agnhost =
        AgnhostWebhook::start(&key, &["--sidecar-image=registry.invalid/sidecar:1"]).await?;

    let name = format!("e2e-{key}");
    let config = MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: "sidecar.smoke.splice.dev".into(),
            client_config: WebhookClientConfig {
                url: Some(format!(
                    "https://127.0.0.1:{}/mutating-pods-sidecar",
                    agnhost.port
                )),
                ca_bundle: Some(k8s_openapi::ByteString(agnhost.ca_pem.clone().into_bytes())),
                ..Default::default()
            },
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec!["".into()]),
                api_versions: Some(vec!["v1".into()]),
                operations: Some(vec!["CREATE".into()]),
                resources: Some(vec!["pods".into()]),
                scope: Some("Namespaced".into()),
            }]),
            namespace_selector: Some(LabelSelector {
                match_labels: Some([(key.clone(), "enabled".to_string())].into()),
                ..Default::default()
            }),
            side_effects: "None".into(),
            admission_review_versions: vec!["v1".into()],
            failure_policy: Some("Fail".into()),
            timeout_seconds: Some(10),
            ..Default::default()
        }]),
    };
    let configs: Api<MutatingWebhookConfiguration> = Api::all(selected.client.clone());
    configs.create(&PostParams::default(), &config).await?;
    let _cleanup = WebhookConfigurationGuard(name.clone());

    // The API server loads webhook configurations asynchronously; with failurePolicy Fail a
    // dry-run create shows the sidecar as soon as the webhook is live.
    let pods = selected.api::<Pod>();
    wait_dry_run(
        &pods,
        &pod("probe")?,
        Duration::from_secs(30),
        "the webhook to be called",
        |created| {
            container_names(created)
                .iter()
                .any(|n| n == "webhook-added-sidecar")
        },
    )
    .await?;

    let injected = pods
        .create(&PostParams::default(), &pod("selected")?)
        .await?;
    assert_eq!(container_names(&injected), ["app", "webhook-added-sidecar"]);
    let untouched = other
        .api::<Pod>()
        .create(&PostParams::default(), &pod("unselected")?)
        .await?;
    assert_eq!(container_names(&untouched), ["app"]);
    Ok(())
}

fn container_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default()
}
