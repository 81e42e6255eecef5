//! The leader's sweep of Splice-labelled objects whose policies are gone.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, MutatingWebhookConfiguration,
};
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use splice_crds::{InjectionPolicy, MANAGED_BY_LABEL, MANAGER};
use tokio::sync::watch;

use super::{policy_api, wait_true};
use crate::leader::Leadership;
use crate::policy::apply::ClusterObject;
use crate::policy::reconcile;

/// Deletes Splice-labelled webhook configurations whose owning policy is gone. Garbage
/// collection normally does this first; the sweep covers clusters where it is off or behind.
pub(super) async fn sweep_orphans(
    client: Client,
    known: Store<InjectionPolicy>,
    listed: watch::Receiver<bool>,
    leading: Leadership,
    mut policies_changed: watch::Receiver<u64>,
) {
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let policies = policy_api(&client);
    wait_true(listed).await;
    loop {
        if let Err(e) = sweep_once(&configurations, &policies, &known, &leading).await {
            tracing::warn!(error = %e, "orphan sweep failed");
        }
        // The in-tree objects of a deleted policy go the same way.
        let maps = Api::<MutatingAdmissionPolicy>::all(client.clone());
        let bindings = Api::<MutatingAdmissionPolicyBinding>::all(client.clone());
        for result in [
            sweep_once(&bindings, &policies, &known, &leading).await,
            sweep_once(&maps, &policies, &known, &leading).await,
        ] {
            if let Err(e) = result {
                tracing::warn!(error = %e, "orphan sweep of in-tree objects failed");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(reconcile::RESYNC) => {}
            changed = policies_changed.changed() => if changed.is_err() { return },
        }
    }
}

async fn sweep_once<K: ClusterObject>(
    configurations: &Api<K>,
    policies: &Api<InjectionPolicy>,
    known: &Store<InjectionPolicy>,
    leading: &Leadership,
) -> Result<(), kube::Error> {
    let managed = configurations
        .list_metadata(&ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGER}")))
        .await?;
    'configurations: for configuration in managed {
        // A shared entry has one owner per policy it serves: it is an orphan once all are gone.
        let owners: Vec<_> = configuration
            .owner_references()
            .iter()
            .filter(|o| {
                o.kind == InjectionPolicy::kind(&())
                    && o.api_version == InjectionPolicy::api_version(&())
            })
            .collect();
        if owners.is_empty() {
            continue;
        }
        for owner in &owners {
            let cached = known.get(&ObjectRef::new(&owner.name));
            if cached.as_ref().and_then(|p| p.metadata.uid.as_ref()) == Some(&owner.uid) {
                continue 'configurations;
            }
            // Not in the cache: maybe deleted, maybe created a moment ago, maybe another
            // instance's (outside --policy-selector). Only the API can tell.
            let alive = policies.get_opt(&owner.name).await?;
            if alive.as_ref().and_then(|p| p.metadata.uid.as_ref()) == Some(&owner.uid) {
                continue 'configurations;
            }
        }
        let owner = owners[0];
        if !leading.now() {
            return Ok(());
        }
        let name = configuration.name_any();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: configuration.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match configurations.delete(&name, &params).await {
            Ok(_) => {
                tracing::info!(configuration = %name, policy = %owner.name, "removed the configuration of a deleted policy")
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
