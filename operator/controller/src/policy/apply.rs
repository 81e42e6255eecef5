//! Writing the cluster-scoped objects Splice owns (webhook configurations, the in-tree admission
//! policy and binding, the policies' validating configuration), one routine per direction:
//! [`apply_if_changed`] reads, compares, checks leadership, server-side applies and reports what
//! someone else had done to the object; [`remove_if_ours`] deletes it only when it is Splice's.
//! Callers name failures in their own terms.

use k8s_openapi::ClusterResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use splice_crds::{MANAGED_BY_LABEL, MANAGER};

use super::render::is_up_to_date;
use crate::leader::Leadership;

/// A cluster-scoped object Splice reads, writes and removes whole.
pub(crate) trait ClusterObject:
    Resource<Scope = ClusterResourceScope, DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + Serialize
    + DeserializeOwned
{
}

impl<K> ClusterObject for K where
    K: Resource<Scope = ClusterResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + Serialize
        + DeserializeOwned
{
}

/// The API call that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Reading,
    Writing,
    Removing,
}

impl Step {
    pub(crate) fn verb(self) -> &'static str {
        match self {
            Step::Reading => "reading",
            Step::Writing => "writing",
            Step::Removing => "removing",
        }
    }
}

/// A failed API call of [`apply_if_changed`] or [`remove_if_ours`].
#[derive(Debug)]
pub(crate) struct CallFailed {
    pub step: Step,
    pub source: kube::Error,
}

fn failed(step: Step) -> impl FnOnce(kube::Error) -> CallFailed {
    move |source| CallFailed { step, source }
}

/// What had happened to an object before Splice wrote it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Drift {
    /// It did not exist: deleted, or never written (the caller knows which matters).
    Absent,
    /// Another field manager had changed it.
    Edited,
}

impl Drift {
    /// The note of the Warning that reports the repair.
    pub(crate) fn note(self, kind: &str, name: &str) -> String {
        match self {
            Drift::Absent => format!("{kind} {name} had been deleted; recreated."),
            Drift::Edited => {
                format!("{kind} {name} had been changed by another field manager; restored.")
            }
        }
    }
}

/// The outcome of [`apply_if_changed`].
#[derive(Debug)]
pub(crate) enum Applied<K> {
    /// The observed object already says everything the desired one says: nothing written.
    UpToDate(K),
    /// Written; `drift` is what had happened to it, `None` when it only lagged behind Splice.
    Written { object: K, drift: Option<Drift> },
    /// It differs, but this replica does not lead (any more): nothing written.
    NotLeader,
}

/// Writes `desired` by server-side apply under Splice's field manager unless the observed object
/// already says all of it, and only while this replica leads.
pub(crate) async fn apply_if_changed<K: ClusterObject>(
    api: &Api<K>,
    leading: &Leadership,
    desired: &K,
) -> Result<Applied<K>, CallFailed> {
    let name = desired.meta().name.clone().unwrap_or_default();
    let drift = match api.get_opt(&name).await.map_err(failed(Step::Reading))? {
        Some(o) if is_up_to_date(desired, &o) => return Ok(Applied::UpToDate(o)),
        Some(o) => edited_by_someone_else(o.meta()).then_some(Drift::Edited),
        None => Some(Drift::Absent),
    };
    if !leading.now() {
        return Ok(Applied::NotLeader);
    }
    let object = api
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(desired),
        )
        .await
        .map_err(failed(Step::Writing))?;
    let kind = K::kind(&()).into_owned();
    tracing::info!(%kind, name = %name, existed = drift != Some(Drift::Absent), "applied");
    Ok(Applied::Written { object, drift })
}

fn edited_by_someone_else(meta: &ObjectMeta) -> bool {
    meta.managed_fields.iter().flatten().any(|m| {
        m.manager
            .as_deref()
            .is_some_and(|manager| manager != MANAGER)
    })
}

/// The outcome of [`remove_if_ours`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Removal {
    /// There was no such object.
    Absent,
    /// One of that name exists but is not Splice's: left alone.
    NotOurs,
    /// Splice's object is gone (deleted now, or by someone else meanwhile).
    Removed,
    /// Splice's object exists, but this replica does not lead: nothing deleted.
    NotLeader,
}

/// Deletes the object `name` if it is Splice's (labelled as managed by Splice, or owned by
/// `owner_uid`), conditional on the uid read, and only while this replica leads.
pub(crate) async fn remove_if_ours<K: ClusterObject>(
    api: &Api<K>,
    leading: &Leadership,
    owner_uid: Option<&str>,
    name: &str,
) -> Result<Removal, CallFailed> {
    let kind = K::kind(&()).into_owned();
    let Some(existing) = api.get_opt(name).await.map_err(failed(Step::Reading))? else {
        return Ok(Removal::Absent);
    };
    let ours = existing.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGER)
        || existing
            .owner_references()
            .iter()
            .any(|o| Some(o.uid.as_str()) == owner_uid);
    if !ours {
        tracing::warn!(%kind, name, "not removing an object Splice does not manage");
        return Ok(Removal::NotOurs);
    }
    if !leading.now() {
        return Ok(Removal::NotLeader);
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: existing.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {
            tracing::info!(%kind, name, "removed");
            Ok(Removal::Removed)
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Removal::Removed),
        Err(source) => Err(CallFailed {
            step: Step::Removing,
            source,
        }),
    }
}
