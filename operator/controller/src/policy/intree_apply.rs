//! The API calls of in-tree mode: write a policy's MutatingAdmissionPolicy and binding by
//! server-side apply when they differ (repairing drift), remove them, and tell when a newly
//! written path has been in place long enough for the old one to go.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, MutatingWebhookConfiguration,
};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use splice_crds::InjectionPolicy;
use splice_engine::InTreeProgram;

use super::apply::{
    Applied, CallFailed, ClusterObject, Removal, Step, apply_if_changed, remove_if_ours,
};
use super::conditions::{PlannedEvent, Severity};
use super::enforcement::SETTLE;
use super::error::{Error, truncate};
use super::intree::{admission_policy_name, render_binding, render_policy};
use crate::Context;

/// Applies the admission policy, then its binding (so the binding never names a policy that
/// does not exist yet). Returns the drift Event to publish, if one of them had been deleted or
/// edited by someone else, and when the binding was created.
pub async fn ensure(
    ctx: &Context,
    policy: &InjectionPolicy,
    program: &InTreeProgram,
    drift_matters: bool,
) -> Result<(Option<PlannedEvent>, Option<Timestamp>), Error> {
    let map = render_policy(policy, program, &ctx.namespace)?;
    let binding = render_binding(policy)?;
    let (e1, _) = apply_one(ctx, &map, "MutatingAdmissionPolicy").await?;
    let (e2, created) = apply_one(ctx, &binding, "MutatingAdmissionPolicyBinding").await?;
    let event = e1.or(e2).filter(|_| drift_matters);
    Ok((event, created))
}

async fn apply_one<K: ClusterObject>(
    ctx: &Context,
    desired: &K,
    kind: &'static str,
) -> Result<(Option<PlannedEvent>, Option<Timestamp>), Error> {
    let name = desired.meta().name.clone().unwrap_or_default();
    let api: Api<K> = Api::all(ctx.client.clone());
    let created = |o: &K| o.meta().creation_timestamp.as_ref().map(|t| t.0);
    match apply_if_changed(&api, &ctx.leading, desired)
        .await
        .map_err(|f| in_tree_error(f, kind, &name))?
    {
        Applied::UpToDate(o) => Ok((None, created(&o))),
        Applied::NotLeader => Err(Error::NotLeader),
        Applied::Written { object, drift } => Ok((
            drift.map(|drift| PlannedEvent {
                severity: Severity::Warning,
                reason: "AdmissionPolicyRestored".to_owned(),
                action: "ApplyAdmissionPolicy",
                note: drift.note(kind, &name),
            }),
            created(&object),
        )),
    }
}

/// A failed call about an in-tree object: the API's answer cut short, as a refused admission
/// policy comes back with its whole CEL quoted.
fn in_tree_error(failed: CallFailed, kind: &'static str, name: &str) -> Error {
    Error::InTree {
        action: failed.step.verb(),
        kind,
        name: name.to_owned(),
        message: truncate(failed.source.to_string(), 1500),
    }
}

/// Removes the policy's binding, then its admission policy, when they are Splice's. Returns true
/// when one existed.
pub async fn remove(ctx: &Context, policy: &InjectionPolicy) -> Result<bool, Error> {
    let name = admission_policy_name(&policy.name_any());
    let a = remove_one::<MutatingAdmissionPolicyBinding>(
        ctx,
        policy,
        &name,
        "MutatingAdmissionPolicyBinding",
    )
    .await?;
    let b = remove_one::<MutatingAdmissionPolicy>(ctx, policy, &name, "MutatingAdmissionPolicy")
        .await?;
    Ok(a || b)
}

async fn remove_one<K: ClusterObject>(
    ctx: &Context,
    policy: &InjectionPolicy,
    name: &str,
    kind: &'static str,
) -> Result<bool, Error> {
    let api: Api<K> = Api::all(ctx.client.clone());
    match remove_if_ours(&api, &ctx.leading, policy.metadata.uid.as_deref(), name)
        .await
        .map_err(|f| in_tree_error(f, kind, name))?
    {
        Removal::NotLeader => Err(Error::NotLeader),
        Removal::Removed => Ok(true),
        Removal::Absent | Removal::NotOurs => Ok(false),
    }
}

/// True when the in-tree objects of `policy` exist (an earlier mode).
pub async fn exists(ctx: &Context, policy: &InjectionPolicy) -> Result<bool, Error> {
    let name = admission_policy_name(&policy.name_any());
    let api: Api<MutatingAdmissionPolicyBinding> = Api::all(ctx.client.clone());
    let found = api.get_opt(&name).await.map_err(|source| {
        let failed = CallFailed {
            step: Step::Reading,
            source,
        };
        in_tree_error(failed, "MutatingAdmissionPolicyBinding", &name)
    })?;
    Ok(found.is_some())
}

/// When the webhook configuration `name` was created, if it exists.
pub async fn webhook_created(ctx: &Context, name: &str) -> Result<Option<Timestamp>, Error> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(ctx.client.clone());
    let found = api.get_opt(name).await.map_err(|source| Error::Read {
        name: name.to_owned(),
        source,
    })?;
    Ok(found.and_then(|c| c.metadata.creation_timestamp.map(|t| t.0)))
}

/// How long to wait before the old path may be removed, given when the new one was created;
/// `None` when it may go now.
pub fn still_settling(created: Option<Timestamp>, now: Timestamp) -> Option<Duration> {
    let created = created?;
    let age = now.duration_since(created);
    let settle = k8s_openapi::jiff::SignedDuration::try_from(SETTLE).ok()?;
    (age < settle).then(|| Duration::try_from(settle - age).unwrap_or(SETTLE))
}
