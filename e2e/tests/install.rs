//! `deploy/` against the real control plane: every manifest passes a server-side dry run, the
//! real install runs `splice run` under its own ServiceAccount (so the RBAC is exactly enough),
//! and uninstalling (`kubectl delete -k deploy/`, or deleting only the CRD) leaves no webhook
//! configuration behind even when the operator is gone first.
//!
//! Installs into the real `splice-system` namespace and deletes the cluster-wide CRD, so both
//! scenarios run in one test, one after the other. Other test binaries run after this one and
//! reinstall the CRD themselves.

#[path = "../src/operator.rs"]
mod operator;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use kube::Client;
use kube::api::Api;
use operator::*;
use serde_json::json;
use splice_crds::InjectionPolicy;
use splice_e2e::{TestNamespace, unique_suffix, wait_until};

const NAMESPACE: &str = "splice-system";
const CRD: &str = "injectionpolicies.splice.dev";

/// A kubeconfig for the `splice` ServiceAccount (a short-lived token from the TokenRequest API),
/// so `splice run` has exactly the permissions deploy/rbac.yaml grants.
fn service_account_kubeconfig(dir: &Path) -> Result<PathBuf> {
    let token = kubectl(&[
        "create",
        "token",
        "splice",
        "-n",
        NAMESPACE,
        "--duration",
        "1h",
    ])?;
    let admin = admin_kubeconfig()?;
    let cluster = admin["clusters"][0]["cluster"].clone();
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": "splice", "user": {"token": token.trim()}}],
        "contexts": [{"name": "splice", "context": {"cluster": "local", "user": "splice", "namespace": NAMESPACE}}],
        "current-context": "splice",
    });
    let path = dir.join(format!("splice-sa-{}.kubeconfig", unique_suffix()));
    std::fs::write(&path, serde_json::to_vec_pretty(&config)?)?;
    Ok(path)
}

/// Splice-managed webhook configurations owned by `policy`.
async fn configurations_of(client: &Client, policy: &str) -> Result<usize> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let list = api
        .list(&kube::api::ListParams::default().labels("app.kubernetes.io/managed-by=splice"))
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|c| {
            c.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "InjectionPolicy" && o.name == policy)
        })
        .count())
}

/// Installs deploy/, runs `splice run` as the ServiceAccount, makes one policy Ready, then stops
/// the process (as when the operator is deleted first). Returns the policy's name.
async fn install_and_make_a_policy(client: &Client, dir: &Path, tag: &str) -> Result<String> {
    kubectl(&["apply", "-k", "deploy/"])?;
    install_crd(client).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    wait_until(
        Duration::from_secs(60),
        "the installed Deployment to have 2 available replicas",
        || async {
            let d = deployments.get("splice").await?;
            Ok(d.status.and_then(|s| s.available_replicas) == Some(2))
        },
    )
    .await?;

    let instance = format!("install-{tag}-{}", unique_suffix());
    let mut options = SpliceOptions::new(NAMESPACE, &instance);
    options.kubeconfig = Some(service_account_kubeconfig(dir)?);
    let splice = Splice::start(options).await?;
    let app = TestNamespace::create("e2e-install", &[(&instance, "on")]).await?;
    let name = format!("{instance}-mesh");
    apply_policy(
        client,
        &instance,
        &name,
        json!({
            "namespaceSelector": {"matchLabels": {&instance: "on"}},
            "template": {"containers": [{"name": "proxy", "image": "registry.invalid/proxy:1"}]}
        }),
    )
    .await?;
    // Ready under the ServiceAccount: it could read policies, namespaces, its Secrets and Lease,
    // write the configuration and the status.
    wait_policy(client, &name, "True", Duration::from_secs(60))
        .await
        .with_context(|| format!("see {}", splice.log.display()))?;
    wait_injecting(client, &app.name, &[], "proxy").await?;
    // The admission probe's dry runs pass the RBAC and deploy/probe-guard.yaml.
    let policies: Api<InjectionPolicy> = Api::all(client.clone());
    wait_until(
        Duration::from_secs(60),
        &format!("policy {name} to be Verified by the admission probe"),
        || async {
            let p = policies.get(&name).await?;
            Ok(condition(&p, "Verified").is_some_and(|c| c.status == "True"))
        },
    )
    .await
    .with_context(|| format!("see {}", splice.log.display()))?;
    ensure!(configurations_of(client, &name).await? == 1);
    // What a real uninstall can count on, since it comes long after the install: the garbage
    // collector follows the policy's kind (see garbage_collector_observes).
    let uid = Api::<InjectionPolicy>::all(client.clone())
        .get(&name)
        .await?
        .metadata
        .uid
        .context("the policy has no uid")?;
    wait_until(
        Duration::from_secs(60),
        &format!("the garbage collector to follow policy {name}"),
        || splice_e2e::garbage_collector_observes(&uid),
    )
    .await?;
    let log = std::fs::read_to_string(&splice.log).unwrap_or_default();
    ensure!(
        !log.contains("forbidden"),
        "splice run was refused something under the ServiceAccount; see {}",
        splice.log.display()
    );
    // The operator goes first: nothing is left to sweep orphans.
    drop(splice);
    Ok(name)
}

async fn wait_no_configuration(client: &Client, policy: &str, after: &str) -> Result<()> {
    wait_until(
        Duration::from_secs(60),
        &format!("no webhook configuration of {policy} after {after}"),
        || async { Ok(configurations_of(client, policy).await? == 0) },
    )
    .await
}

#[tokio::test]
async fn deploy_passes_a_server_dry_run_and_uninstalling_either_way_leaves_no_webhook_configuration()
-> Result<()> {
    let client = splice_e2e::client().await?;
    let dir = std::env::temp_dir().join(format!("splice-e2e-install-{}", unique_suffix()));
    std::fs::create_dir_all(&dir)?;

    // A server-side dry run of everything. Namespaced objects need their namespace to exist
    // for it, so that one is created for real first.
    kubectl(&["apply", "-f", "deploy/namespace.yaml"])?;
    let out = kubectl(&["apply", "-k", "deploy/", "--dry-run=server"])?;
    for object in [
        "namespace/splice-system",
        "customresourcedefinition.apiextensions.k8s.io/injectionpolicies.splice.dev",
        "serviceaccount/splice",
        "clusterrole.rbac.authorization.k8s.io/splice",
        "clusterrolebinding.rbac.authorization.k8s.io/splice",
        "role.rbac.authorization.k8s.io/splice",
        "rolebinding.rbac.authorization.k8s.io/splice",
        "role.rbac.authorization.k8s.io/splice-events",
        "rolebinding.rbac.authorization.k8s.io/splice-events",
        "service/splice",
        "deployment.apps/splice",
        "poddisruptionbudget.policy/splice",
        "validatingadmissionpolicy.admissionregistration.k8s.io/splice-probe-dry-run-only",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/splice-probe-dry-run-only",
        "validatingadmissionpolicy.admissionregistration.k8s.io/splice-own-webhook-configurations-only",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/splice-own-webhook-configurations-only",
    ] {
        ensure!(
            out.lines()
                .any(|l| l.starts_with(object) && l.ends_with("(server dry run)")),
            "{object} missing from the dry run:\n{out}"
        );
    }

    // `kubectl delete -k deploy/` with the operator already gone.
    let policy = install_and_make_a_policy(&client, &dir, "k").await?;
    kubectl(&["delete", "-k", "deploy/", "--wait=true", "--timeout=120s"])?;
    wait_no_configuration(&client, &policy, "kubectl delete -k deploy/").await?;

    // Deleting only the CRD, again with the operator gone.
    let policy = install_and_make_a_policy(&client, &dir, "crd").await?;
    kubectl(&["delete", "crd", CRD, "--wait=true", "--timeout=120s"])?;
    wait_no_configuration(&client, &policy, "deleting the CRD").await?;

    kubectl(&[
        "delete",
        "-k",
        "deploy/",
        "--ignore-not-found",
        "--wait=true",
        "--timeout=120s",
    ])?;
    let _ = std::fs::remove_dir_all(&dir);
    // Later test binaries expect the CRD.
    install_crd(&client).await?;
    Ok(())
}
