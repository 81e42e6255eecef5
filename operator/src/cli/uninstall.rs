//! `splice uninstall`: what `helm uninstall` runs first (a pre-delete hook), and what a person can
//! run before deleting Splice by other means. Policies stay (Helm keeps CRDs and their objects);
//! the admission configuration Splice wrote for them goes, so no `Fail` entry is left pointing at
//! a Service that no longer answers:
//!   1. Splice's Deployment is scaled to 0 and its pods are waited for, so no leader writes the
//!      configuration back;
//!   2. every MutatingWebhookConfiguration, ValidatingWebhookConfiguration, MutatingAdmissionPolicy
//!      and binding labelled as Splice's is deleted.
//!
//! Reinstalling brings them back from the policies.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::json;
use splice_crds::{MANAGED_BY_LABEL, MANAGER};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    splice: super::SpliceNamespace,
    /// Splice's Deployment, scaled to 0 first.
    #[arg(long, env = "SPLICE_DEPLOYMENT_NAME", default_value = "splice")]
    deployment_name: String,
    /// How long to wait for Splice's pods to stop.
    #[arg(long, default_value = "120s", value_parser = super::parse_duration)]
    timeout: Duration,
}

pub fn main(args: Args, cluster: &super::ClusterArgs) -> ExitCode {
    super::run_to_exit(uninstall(&args, cluster))
}

async fn uninstall(args: &Args, cluster: &super::ClusterArgs) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    let ns = &args.splice.namespace;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let name = &args.deployment_name;
    let Some(deployment) = deployments
        .get_opt(name)
        .await
        .with_context(|| format!("reading Deployment {ns}/{name}"))?
    else {
        println!("Deployment {ns}/{name} is already gone");
        return remove_configuration(&client).await;
    };
    deployments
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .with_context(|| format!("scaling Deployment {ns}/{name} to 0"))?;
    println!("scaled Deployment {ns}/{name} to 0");
    let selector = deployment
        .spec
        .and_then(|s| s.selector.match_labels)
        .unwrap_or_default()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    if selector.is_empty() {
        bail!("Deployment {ns}/{name} selects its pods by expressions only; stop them by hand");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = tokio::time::Instant::now() + args.timeout;
    loop {
        let left = pods
            .list_metadata(&ListParams::default().labels(&selector))
            .await
            .with_context(|| format!("listing Splice's pods ({selector})"))?
            .items
            .len();
        if left == 0 {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "{left} of Splice's pods ({selector}) still run after {:?}; nothing was deleted",
                args.timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("Splice's pods have stopped");
    remove_configuration(&client).await
}

async fn remove_configuration(client: &Client) -> anyhow::Result<()> {
    let mut removed = delete_ours::<MutatingWebhookConfiguration>(client).await?;
    removed += delete_ours::<ValidatingWebhookConfiguration>(client).await?;
    removed += delete_ours::<MutatingAdmissionPolicyBinding>(client).await?;
    removed += delete_ours::<MutatingAdmissionPolicy>(client).await?;
    println!("deleted {removed} admission objects labelled {MANAGED_BY_LABEL}={MANAGER}");
    Ok(())
}

/// Deletes every cluster-scoped `K` labelled as Splice's; how many.
async fn delete_ours<K>(client: &Client) -> anyhow::Result<usize>
where
    K: Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let kind = K::kind(&());
    let names: Vec<String> = api
        .list_metadata(&ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGER}")))
        .await
        .with_context(|| format!("listing {kind}s"))?
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    for name in &names {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => println!("deleted {kind} {name}"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("deleting {kind} {name}")),
        }
    }
    Ok(names.len())
}
