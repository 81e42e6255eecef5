//! deploy/webhook-guard.yaml against the real API server. RBAC lets Splice's ServiceAccount write
//! every webhook configuration; the shipped ValidatingAdmissionPolicy must confine that identity
//! (impersonated here, with its groups) to the configurations Splice manages: a foreign one cannot
//! be changed, taken over by relabelling, or deleted, and the refusal names the policy; Splice's
//! own (named `splice-...`, labelled managed-by=splice) can be created, patched and deleted.
//! The admin, who runs every other e2e test's `splice run`, is not concerned.

#[path = "../src/operator.rs"]
mod operator;

use std::time::Duration;

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::Status;
use kube::{Client, Resource};
use operator::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use splice_e2e::{dry_run, unique_suffix};

/// Mutating and validating webhook configurations alike.
trait WebhookConfiguration:
    Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
    + Clone
    + DeserializeOwned
    + Serialize
    + std::fmt::Debug
{
}

impl<K> WebhookConfiguration for K where
    K: Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug
{
}

/// Splice's server-side apply body for the configuration `name` of kind `K`, labelled as its own.
fn labelled_as_splices<K: WebhookConfiguration>(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": K::kind(&()),
        "metadata": {"name": name, "labels": {MANAGED_BY: "splice"}},
    })
}

const GUARD: &str = "splice-own-webhook-configurations-only";
const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// `kubectl apply -f file`. The tests here run in parallel and install the same objects: a
/// client-side apply that read "absent" just before another test created the object fails with
/// AlreadyExists, and applied again it updates the object instead.
fn apply_racing(file: &str) -> Result<()> {
    match kubectl(&["apply", "-f", file]) {
        Err(e) if e.to_string().contains("AlreadyExists") => {
            kubectl(&["apply", "-f", file]).map(|_| ())
        }
        other => other.map(|_| ()),
    }
}

/// Installs what the guard needs (Splice's RBAC and the guard itself) and returns a client acting
/// as Splice's ServiceAccount, once the API server enforces the guard: it loads a new
/// ValidatingAdmissionPolicy asynchronously, so until then a dry-run create of a configuration
/// Splice does not manage (nothing stored either way) is admitted.
async fn guarded_splice() -> Result<Client> {
    for file in [
        "deploy/namespace.yaml",
        "deploy/rbac.yaml",
        "deploy/webhook-guard.yaml",
    ] {
        apply_racing(file)?;
    }
    let splice = as_splice_service_account().await?;
    let api: Api<MutatingWebhookConfiguration> = Api::all(splice.clone());
    let probe = configuration(&format!("e2e-guard-loaded-{}", unique_suffix()), None)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match api.create(&dry_run(), &probe).await {
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(GUARD) => {
                return Ok(splice);
            }
            Err(e) => bail!("a dry-run create by Splice's ServiceAccount failed otherwise: {e}"),
            Ok(_) => {}
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the API server never enforced {GUARD}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A webhook configuration of kind `K` with no webhooks (so it changes no admission), labelled
/// managed-by=`managed_by` when given.
fn configuration<K: DeserializeOwned>(name: &str, managed_by: Option<&str>) -> Result<K> {
    let labels = match managed_by {
        Some(m) => json!({ MANAGED_BY: m, "e2e.splice.dev/test": "webhook-guard" }),
        None => json!({ "e2e.splice.dev/test": "webhook-guard" }),
    };
    Ok(serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}}),
    )?)
}

/// Deletes, as the admin, the configurations a test created, pass or fail.
struct Cleanup(Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let names = std::mem::take(&mut self.0);
        splice_e2e::in_fresh_runtime(move |client| async move {
            let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
            let validating: Api<ValidatingWebhookConfiguration> = Api::all(client);
            for name in &names {
                let _ = mutating.delete(name, &DeleteParams::default()).await;
                let _ = validating.delete(name, &DeleteParams::default()).await;
            }
        });
    }
}

/// The API server's refusal of `result`, or an error if it was admitted or failed otherwise.
fn refusal<T>(result: Result<T, kube::Error>, what: &str) -> Result<Status> {
    match result {
        Err(kube::Error::Api(s)) => Ok(*s),
        Err(e) => bail!("{what}: failed without a refusal: {e}"),
        Ok(_) => bail!("{what}: admitted, but the guard should refuse it"),
    }
}

/// Asserts that `result` is the guard's refusal, and that its message says `says`.
fn assert_guard_refused<T>(result: Result<T, kube::Error>, what: &str, says: &str) -> Result<()> {
    let s = refusal(result, what)?;
    ensure!(
        s.code == 403,
        "{what}: refused with {}, not 403: {s:?}",
        s.code
    );
    ensure!(
        s.message.contains(GUARD) && s.message.contains(says),
        "{what}: the refusal does not name {GUARD} and say {says:?}: {}",
        s.message
    );
    Ok(())
}

fn annotate() -> Patch<serde_json::Value> {
    Patch::Merge(json!({"metadata": {"annotations": {"e2e.splice.dev/touched": "yes"}}}))
}

/// Tries, as Splice, to annotate, take over (relabel as Splice's) and delete the configuration
/// `name` of kind `K`, which the admin created without being Splice's; each must be refused.
async fn splice_cannot_touch<K: WebhookConfiguration>(
    admin: &Client,
    splice: &Client,
    name: &str,
) -> Result<()> {
    let kind = K::kind(&());
    let as_admin: Api<K> = Api::all(admin.clone());
    let as_splice: Api<K> = Api::all(splice.clone());
    assert_guard_refused(
        as_splice
            .patch(name, &PatchParams::default(), &annotate())
            .await,
        &format!("annotating {kind} {name}"),
        &format!("may not update {name}"),
    )?;
    let takeover = labelled_as_splices::<K>(name);
    assert_guard_refused(
        as_splice
            .patch(
                name,
                &PatchParams::apply("splice").force(),
                &Patch::Apply(&takeover),
            )
            .await,
        &format!("relabelling {kind} {name} as Splice's"),
        &format!("may not update {name}"),
    )?;
    assert_guard_refused(
        as_splice.delete(name, &DeleteParams::default()).await,
        &format!("deleting {kind} {name}"),
        &format!("may not delete {name}"),
    )?;
    // Still there, untouched.
    let meta = as_admin.get(name).await?.meta().clone();
    ensure!(
        meta.annotations.unwrap_or_default().is_empty(),
        "{kind} {name} was annotated"
    );
    ensure!(
        meta.labels
            .unwrap_or_default()
            .get(MANAGED_BY)
            .map(String::as_str)
            != Some("splice"),
        "{kind} {name} was relabelled"
    );
    Ok(())
}

#[tokio::test]
async fn splices_identity_cannot_change_take_over_or_delete_a_webhook_configuration_it_does_not_manage()
-> Result<()> {
    let admin = splice_e2e::client().await?;
    let splice = guarded_splice().await?;
    let suffix = unique_suffix();
    let vendor = format!("e2e-vendor-{suffix}");
    // Splice's name prefix alone does not make a configuration Splice's.
    let impostor = format!("splice-{suffix}-impostor");
    // Nor does the label alone.
    let labelled = format!("e2e-labelled-{suffix}");
    let _cleanup = Cleanup(vec![vendor.clone(), impostor.clone(), labelled.clone()]);
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    let pp = PostParams::default();
    mutating
        .create(&pp, &configuration(&vendor, Some("vendor"))?)
        .await?;
    mutating
        .create(&pp, &configuration(&impostor, None)?)
        .await?;
    validating
        .create(&pp, &configuration(&vendor, None)?)
        .await?;

    splice_cannot_touch::<MutatingWebhookConfiguration>(&admin, &splice, &vendor).await?;
    splice_cannot_touch::<MutatingWebhookConfiguration>(&admin, &splice, &impostor).await?;
    splice_cannot_touch::<ValidatingWebhookConfiguration>(&admin, &splice, &vendor).await?;

    // Splice cannot create one outside its names either, even labelled as its own.
    let as_splice: Api<MutatingWebhookConfiguration> = Api::all(splice.clone());
    assert_guard_refused(
        as_splice
            .create(&pp, &configuration(&labelled, Some("splice"))?)
            .await,
        &format!("creating {labelled}"),
        &format!("may only write {labelled}"),
    )?;

    // The admin is not concerned: it edits and deletes the vendor's configuration.
    mutating
        .patch(&vendor, &PatchParams::default(), &annotate())
        .await?;
    mutating.delete(&vendor, &DeleteParams::default()).await?;
    Ok(())
}

/// Creates (server-side apply, as Splice's reconcile does), patches and deletes, as Splice, a
/// configuration of kind `K` named `name` and labelled as Splice's.
async fn splice_manages<K: WebhookConfiguration>(
    admin: &Client,
    splice: &Client,
    name: &str,
) -> Result<()> {
    let kind = K::kind(&());
    let as_admin: Api<K> = Api::all(admin.clone());
    let as_splice: Api<K> = Api::all(splice.clone());
    let own = labelled_as_splices::<K>(name);
    as_splice
        .patch(name, &PatchParams::apply("splice"), &Patch::Apply(&own))
        .await
        .map_err(|e| anyhow::anyhow!("Splice creating its {kind} {name}: {e}"))?;
    as_splice
        .patch(name, &PatchParams::default(), &annotate())
        .await
        .map_err(|e| anyhow::anyhow!("Splice patching its {kind} {name}: {e}"))?;
    let annotations = as_admin.get(name).await?.meta().annotations.clone();
    ensure!(
        annotations
            .unwrap_or_default()
            .contains_key("e2e.splice.dev/touched"),
        "{kind} {name} lacks Splice's patch"
    );
    as_splice
        .delete(name, &DeleteParams::default())
        .await
        .map_err(|e| anyhow::anyhow!("Splice deleting its {kind} {name}: {e}"))?;
    ensure!(
        as_admin.get_opt(name).await?.is_none(),
        "{kind} {name} is still there"
    );
    Ok(())
}

#[tokio::test]
async fn splices_identity_creates_patches_and_deletes_the_webhook_configurations_it_manages()
-> Result<()> {
    let admin = splice_e2e::client().await?;
    let splice = guarded_splice().await?;
    let suffix = unique_suffix();
    // The names render.rs and validating.rs give them.
    let mutating = format!("splice-{suffix}-mesh");
    let validating = format!("splice-validate-{suffix}");
    let _cleanup = Cleanup(vec![mutating.clone(), validating.clone()]);
    splice_manages::<MutatingWebhookConfiguration>(&admin, &splice, &mutating).await?;
    splice_manages::<ValidatingWebhookConfiguration>(&admin, &splice, &validating).await?;
    Ok(())
}

/// A configuration Splice rendered for a policy, whose managed-by label someone removed by hand:
/// the guard still counts it as Splice's through its owner reference to the InjectionPolicy, so
/// Splice's drift repair (server-side apply putting the label back) and its deletion both pass.
#[tokio::test]
async fn splices_identity_repairs_or_deletes_a_configuration_its_policy_owns_after_its_label_was_removed()
-> Result<()> {
    let admin = splice_e2e::client().await?;
    let splice = guarded_splice().await?;
    install_crd(&admin).await?;
    let suffix = unique_suffix();
    let instance = format!("guard-owner-{suffix}");
    let _policies = PolicyCleanup {
        instance: instance.clone(),
    };
    let policies: Api<splice_crds::InjectionPolicy> = Api::all(admin.clone());
    let policy = policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "splice.dev/v1alpha1", "kind": "InjectionPolicy",
                "metadata": {"name": format!("e2e-{instance}"), "labels": {INSTANCE_LABEL: &instance}},
                "spec": {"template": {"containers": [
                    {"name": "proxy", "image": "registry.invalid/proxy:1"}]}},
            }))?,
        )
        .await?;
    let owner = json!([{
        "apiVersion": "splice.dev/v1alpha1", "kind": "InjectionPolicy",
        "name": policy.metadata.name, "uid": policy.metadata.uid,
    }]);
    let repaired = format!("splice-{suffix}-repaired");
    let deleted = format!("splice-{suffix}-deleted");
    let _cleanup = Cleanup(vec![repaired.clone(), deleted.clone()]);
    let as_admin: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    for name in [&repaired, &deleted] {
        let unlabelled: MutatingWebhookConfiguration =
            serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": owner}}))?;
        as_admin.create(&PostParams::default(), &unlabelled).await?;
    }
    let as_splice: Api<MutatingWebhookConfiguration> = Api::all(splice);
    as_splice
        .patch(
            &repaired,
            &PatchParams::apply("splice"),
            &Patch::Apply(&labelled_as_splices::<MutatingWebhookConfiguration>(
                &repaired,
            )),
        )
        .await
        .map_err(|e| anyhow::anyhow!("Splice putting its label back on {repaired}: {e}"))?;
    let labels = as_admin
        .get(&repaired)
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    ensure!(
        labels.get(MANAGED_BY).map(String::as_str) == Some("splice"),
        "{repaired} did not get its label back: {labels:?}"
    );
    as_splice
        .delete(&deleted, &DeleteParams::default())
        .await
        .map_err(|e| anyhow::anyhow!("Splice deleting {deleted}, which its policy owns: {e}"))?;
    Ok(())
}
