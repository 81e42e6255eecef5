//! One reconcile of one policy: decide, write only what differs, report.
//!
//! Every write (webhook configuration, status, Event) is preceded by a comparison with what is
//! already there, so a policy in its steady state costs reads only; and by a check that this
//! replica still leads, so a replica that lost the lease stops writing even before its task is
//! cancelled.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use splice_crds::{InjectionPolicy, InjectionPolicyStatus};
use splice_engine::{CompiledPolicy, NamespaceContext, PolicyError, ValuesFromError};

use super::apply::{Applied, CallFailed, Removal, Step, apply_if_changed, remove_if_ours};
use super::conditions::{
    Observation, Path, PlannedEvent, Severity, WebhookOutcome, desired_status, planned_events,
};
use super::desired::{Desired, World, desired};
use super::enforcement::{self, Known, Sighting, Verdict};
use super::error::{Error, truncate};
use super::in_force::InForce;
use super::render::{RenderContext, RenderError, render_group};
use super::{intree, intree_apply};
use crate::Context;
use crate::retry::backoff;
use crate::status::{self, Owner, WriteError};
use crate::verdict::{self, Answer};
use splice_engine::entry::{Group, Plan, webhook_configuration_name};

/// How often a policy in its steady state is looked at again, as a safety net under the watches.
pub const RESYNC: Duration = Duration::from_secs(300);

/// The reconciler the controller runs.
#[tracing::instrument(skip_all, fields(policy = %policy.name_any(), generation = policy.metadata.generation))]
pub async fn reconcile(policy: Arc<InjectionPolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_policy(&policy, &ctx).await;
    let label = match &result {
        Ok(_) => "success",
        Err(e) => e.label(),
    };
    ctx.metrics.observe_reconcile(label, started.elapsed());
    if result.is_ok() {
        ctx.reset_backoff(&policy.name_any());
    }
    result
}

/// What the controller does when `reconcile` failed: log it and retry with exponential backoff
/// per policy (1 s, 2 s, 4 s … up to 5 min), reset by the next success.
pub fn error_policy(policy: Arc<InjectionPolicy>, error: &Error, ctx: Arc<Context>) -> Action {
    let failures = ctx.count_failure(&policy.name_any());
    let delay = backoff(failures);
    match error {
        Error::NotLeader | Error::NoCertificate => {
            tracing::debug!(policy = %policy.name_any(), error = %error, retry_in = ?delay, "waiting")
        }
        _ => {
            tracing::warn!(policy = %policy.name_any(), error = %error, retry_in = ?delay, "reconcile failed")
        }
    }
    Action::requeue(delay)
}

/// One reconcile: decide ([`desired`], pure), act (write the path in force, retire the old one),
/// report (status and Events, written only when they differ).
async fn reconcile_policy(policy: &InjectionPolicy, ctx: &Context) -> Result<Action, Error> {
    if policy.metadata.deletion_timestamp.is_some() {
        // Garbage collection removes the owned configuration; the janitor covers clusters without it.
        ctx.forget_awaiting(&policy.name_any());
        return Ok(Action::await_change());
    }
    // Neither is worth a status: a follower must not write, and without the CA no configuration
    // can be written yet (the CA's arrival triggers every policy again).
    ctx.ensure_leading()?;
    if ctx.ca_bundle.borrow().is_none() {
        let problem = ctx.certificate_problem.borrow().clone();
        if let Some(status) = problem.and_then(|p| {
            super::conditions::unavailable_status(ctx.status.known(policy).as_ref(), policy, &p)
        }) {
            write_status(ctx, policy, &status).await?;
        }
        return Err(Error::NoCertificate);
    }
    let known = ctx.status.known(policy);
    let guard = ctx.guard.borrow().clone();
    let all = ctx.policies.state();
    let desired = desired(
        policy,
        &World {
            policies: &all,
            entry_specs: &ctx.entry_specs,
            guard: &guard,
            instance: &ctx.instance,
            status: known.as_ref(),
        },
    );
    drop(all);
    ctx.neighbours
        .observed(policy, desired.partners.clone(), &desired.plan);
    let acted = act(ctx, policy, &desired).await?;
    let enforced = look(ctx, policy, &desired, &acted.outcome, known.as_ref()).await;
    report(ctx, policy, &desired, acted, enforced).await
}

/// Whether the API server enforces the generation just put in force: the evidence the status
/// holds for it, else a dry-run pod in a namespace the policy selects (the next one where other
/// admission refuses it), judged by [`enforcement::judge`]; not applicable when Ready is False
/// anyway (an outcome that serves nothing new, paused, a `valuesFrom` problem).
async fn look(
    ctx: &Context,
    policy: &InjectionPolicy,
    d: &Desired<'_>,
    outcome: &WebhookOutcome,
    known: Option<&InjectionPolicyStatus>,
) -> Known {
    let name = policy.name_any();
    let generation = policy.metadata.generation.unwrap_or_default();
    let compiled = match (&d.in_force, outcome, policy.spec.paused) {
        (InForce::Current(c), WebhookOutcome::Applied { .. }, false)
            if values_problem(ctx, c).is_none() && !pod_certificates_unserved(ctx, c) =>
        {
            c
        }
        _ => {
            ctx.forget_awaiting(&name);
            return Known::NotApplicable;
        }
    };
    if let Some(e) = known
        .and_then(|s| s.enforcement.as_ref())
        .filter(|e| e.observed_generation == generation)
    {
        ctx.forget_awaiting(&name);
        return Known::Recorded(e.clone());
    }
    let now = Timestamp::now();
    let awaiting = ctx.look_at(policy, generation, now);
    let mut accepted = vec![compiled.template_hash()];
    if let Some((_, stable)) = super::in_force::open_canary(policy, compiled.template_hash()) {
        accepted.push(stable.template_hash.as_str());
    }
    let sighting = match awaiting.seen.clone() {
        Some(seen) => seen,
        None => sight(ctx, policy, d, compiled).await,
    };
    if awaiting.seen.is_none() && enforcement::shows_enforced(&sighting, &accepted) {
        ctx.saw_enforced(&name, sighting.clone());
    }
    let verdict = enforcement::judge(
        generation,
        &accepted,
        &awaiting,
        &sighting,
        Timestamp::now(),
    );
    if matches!(verdict, Verdict::Enforced(_)) {
        ctx.forget_awaiting(&name);
    }
    tracing::debug!(policy = %name, generation, ?sighting, ?verdict, "enforcement");
    Known::Judged(verdict)
}

/// At most this many namespaces are tried for one look, when other admission refuses the pod.
const LOOK_NAMESPACES: usize = 3;

/// One look at the API server: dry-run pods, in the namespaces the admission probe would pick,
/// until one answers about this policy's own admission path.
async fn sight(
    ctx: &Context,
    policy: &InjectionPolicy,
    d: &Desired<'_>,
    compiled: &CompiledPolicy,
) -> Sighting {
    let name = policy.name_any();
    let exclusions = splice_engine::Exclusions::default_for(&ctx.namespace);
    let planned: Vec<NamespaceContext> = {
        let namespaces = ctx
            .namespaces
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !namespaces.synced {
            return Sighting::NamespacesUnknown;
        }
        verdict::plan_namespaces(compiled, namespaces.contexts.values(), &exclusions, &[])
            .into_iter()
            .filter_map(|n| namespaces.contexts.get(&n).cloned())
            .collect()
    };
    if planned.is_empty() {
        return Sighting::Unprobeable(
            "no existing namespace is selected by this policy, so no pod can be probed".to_owned(),
        );
    }
    let labels = match verdict::probe_labels(compiled) {
        Ok(l) => l,
        Err(why) => return Sighting::Unprobeable(format!("no probe pod can be made: {why}")),
    };
    // A refusal by this policy's own path names its webhook, or its admission policy in-tree.
    let own = [
        d.group.as_ref().map(|g| format!("\"{}\"", g.webhook)),
        Some(format!("'{}'", super::intree::admission_policy_name(&name))),
        Some(format!(
            "\"{}\"",
            super::intree::admission_policy_name(&name)
        )),
    ];
    let timeout = Duration::from_secs(u64::try_from(compiled.spec().timeout_seconds).unwrap_or(10))
        + LOOK_SLACK;
    let mut unanswered = Vec::new();
    for context in planned.into_iter().take(LOOK_NAMESPACES) {
        let namespace = context.name.clone();
        let pod_name = format!("splice-enforced-{:x}", Timestamp::now().as_nanosecond());
        let mut pod = match verdict::probe_pod(&pod_name, &name, &labels, false) {
            Ok(p) => p,
            Err(why) => return Sighting::Unprobeable(format!("no probe pod can be made: {why}")),
        };
        pod.metadata.namespace = Some(namespace.clone());
        // A pod this policy would not inject (a template reading a pod field the probe pod
        // lacks) shows nothing either way: the engine the webhook runs says so first.
        if let Err(why) = would_inject(compiled, &pod, &context, &exclusions) {
            unanswered.push(format!("in namespace {namespace}, {why}"));
            continue;
        }
        let sent = Timestamp::now();
        let probe =
            crate::probe::dry_run_create(&ctx.client, &namespace, &pod, &name, timeout).await;
        match probe.answer {
            Answer::Admitted { hash } => {
                return Sighting::Pod {
                    namespace,
                    hash,
                    sent,
                };
            }
            Answer::Refused { message, .. }
                if own.iter().flatten().any(|o| message.contains(o.as_str())) =>
            {
                return Sighting::Refused { namespace, message };
            }
            Answer::Refused { message, .. } => {
                unanswered.push(format!("in namespace {namespace}, refused: {message}"))
            }
            Answer::Failed(e) => unanswered.push(format!("in namespace {namespace}: {e}")),
        }
    }
    Sighting::Unprobeable(format!(
        "no dry-run pod was answered about this policy ({})",
        truncate(unanswered.join("; "), 600)
    ))
}

/// The API server's own time on top of the webhook's timeout.
const LOOK_SLACK: Duration = Duration::from_secs(5);

/// Whether the engine (the webhook's, and the in-tree form's equal) injects `policy` into the
/// probe pod `pod` in `namespace`; why not, when it does not.
fn would_inject(
    policy: &CompiledPolicy,
    pod: &k8s_openapi::api::core::v1::Pod,
    namespace: &NamespaceContext,
    exclusions: &splice_engine::Exclusions,
) -> Result<(), String> {
    let text = serde_json::to_string(pod).map_err(|e| format!("the probe pod: {e}"))?;
    let parsed = splice_engine::Pod::parse(&text).map_err(|e| format!("the probe pod: {e}"))?;
    let request = splice_engine::PodRequest {
        operation: splice_crds::Operation::Create,
        object: &parsed,
        namespace,
        exclusions,
        // Only whether something is injected matters here, never a rendered SPIFFE ID.
        trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN,
        selection: splice_engine::Selection::Evaluate,
    };
    match splice_engine::inject(policy, &request) {
        Ok(splice_engine::Decision::Inject(i)) if i.changed => Ok(()),
        Ok(splice_engine::Decision::Inject(_)) => {
            Err("the policy injects nothing into the probe pod".to_owned())
        }
        Ok(splice_engine::Decision::Skip(reason)) => Err(format!(
            "the policy leaves the probe pod alone ({})",
            <&'static str>::from(reason)
        )),
        Ok(splice_engine::Decision::Refuse(refused)) => {
            Err(format!("the policy refuses the probe pod: {refused}"))
        }
        Err(e) => Err(format!(
            "the policy cannot be rendered for the probe pod: {e}"
        )),
    }
}

/// What acting on a decision did.
struct Acted {
    outcome: WebhookOutcome,
    /// The drift Event, when Splice restored what someone else had changed or deleted.
    restored: Option<PlannedEvent>,
    /// Set while a newly written path settles: the old one goes at the next pass.
    settling: Option<Duration>,
    /// The failure the outcome reports, returned once the status says so.
    failure: Option<Error>,
}

/// Puts the decided path in force: the new path first, the old one retired only once the new
/// one is in force; a paused or invalid policy loses both. An `Err` ends the reconcile before
/// any status is written.
async fn act(ctx: &Context, policy: &InjectionPolicy, d: &Desired<'_>) -> Result<Acted, Error> {
    let name = policy.name_any();
    let configuration = d.configuration.clone();
    let mut failure = None;
    let mut restored = None;
    let mut settling = None;
    let outcome = if policy.spec.paused {
        match remove_both(ctx, policy, &d.plan).await {
            Ok(()) => WebhookOutcome::Paused { configuration },
            Err(e) => failed(configuration, e, &mut failure),
        }
    } else if let InForce::Nothing(error) = &d.in_force {
        match remove_both(ctx, policy, &d.plan).await {
            Ok(()) => WebhookOutcome::Invalid {
                configuration,
                reason: invalid_reason(error),
                error: error.to_string(),
            },
            Err(e) => failed(configuration, e, &mut failure),
        }
    } else {
        let applied = match (&d.mode.program, &d.group) {
            (Some(program), _) => {
                let drift = policy.status.as_ref().is_some_and(|s| {
                    s.observed_generation == policy.metadata.generation
                        && s.mode == Some(splice_crds::Mode::InTree)
                });
                match intree_apply::ensure(ctx, &d.served, program, drift).await {
                    Ok((event, created)) => {
                        settling = intree_apply::still_settling(created, Timestamp::now());
                        match settling {
                            Some(_) => Ok(event),
                            None => retire(ctx, policy, &d.plan, None).await.map(|()| event),
                        }
                    }
                    Err(e) => Err(e),
                }
            }
            (None, Some(group)) => match ensure_applied_after_leaver(ctx, d, group).await {
                // Webhook configurations reach the API server through one watch, in order: the
                // entry just applied is in force before a retired one is gone.
                Ok(change) => {
                    match retire(ctx, policy, &d.plan, Some(&group.configuration)).await {
                        Err(e) => Err(e),
                        // Once the status says Webhook, the in-tree objects are known to be gone: the
                        // steady state reads nothing more than the configuration.
                        Ok(())
                            if policy.status.as_ref().and_then(|s| s.mode)
                                != Some(splice_crds::Mode::Webhook)
                                && intree_apply::exists(ctx, policy).await? =>
                        {
                            let created =
                                intree_apply::webhook_created(ctx, &group.configuration).await?;
                            settling = intree_apply::still_settling(created, Timestamp::now());
                            if settling.is_none() {
                                intree_apply::remove(ctx, policy).await?;
                            }
                            Ok(change.filter(|_| was_applied_at_this_generation(policy, group)))
                        }
                        Ok(()) => {
                            Ok(change.filter(|_| was_applied_at_this_generation(policy, group)))
                        }
                    }
                }
                Err(e) => Err(e),
            },
            // Serving, so planned: a policy the plan left out is a bug; say so rather than guess.
            (None, None) => Err(Error::Render(RenderError::MissingUid(name.clone()))),
        };
        match applied {
            Ok(change) => {
                restored = change;
                match &d.in_force {
                    InForce::LastGood { compiled, error } => WebhookOutcome::Held {
                        configuration,
                        reason: invalid_reason(error),
                        error: error.to_string(),
                        serving_generation: compiled.generation(),
                    },
                    InForce::Current(_) | InForce::Nothing(_) => {
                        WebhookOutcome::Applied { configuration }
                    }
                }
            }
            Err(e) => failed(configuration, e, &mut failure),
        }
    };
    Ok(Acted {
        outcome,
        restored,
        settling,
        failure,
    })
}

/// Reports what the decision and the action came to: the status, written only when it differs
/// from the last known one, and the Events of its transitions and of any repaired drift.
async fn report(
    ctx: &Context,
    policy: &InjectionPolicy,
    d: &Desired<'_>,
    acted: Acted,
    enforced: Known,
) -> Result<Action, Error> {
    let Acted {
        outcome,
        restored,
        settling,
        failure,
    } = acted;
    let name = policy.name_any();
    let generation = policy.metadata.generation;
    let in_force = &d.in_force;
    let shared_with: Vec<String> = d
        .group
        .as_ref()
        .filter(|g| g.is_shared())
        .map(|g| g.names().into_iter().map(str::to_owned).collect())
        .unwrap_or_default();
    let template_hash = in_force.compiled().map(|c| c.template_hash().to_owned());
    let serving = in_force.record();
    let warnings: Vec<String> = in_force
        .compiled()
        .map(|c| status_warnings(c.warnings()))
        .unwrap_or_default();
    let observation = Observation {
        generation,
        template_hash: template_hash.as_deref(),
        serving: serving.as_ref().map(|(g, spec)| (*g, spec)),
        webhook: &outcome,
        failure_policy: &d.failure_policy,
        conflicts: &d.conflicts,
        pod_security: in_force.compiled().map(|c| c.pod_security().level),
        warnings: &warnings,
        shared_with: &shared_with,
        policy: &name,
        values_problem: in_force.compiled().and_then(|c| values_problem(ctx, c)),
        pod_certificates_unserved: in_force
            .compiled()
            .is_some_and(|c| pod_certificates_unserved(ctx, c)),
        path: match d.mode.effective {
            splice_crds::Mode::InTree => Path::InTree,
            splice_crds::Mode::Webhook | splice_crds::Mode::Auto => Path::Webhook,
        },
    };
    // Every policy exports it (0 without valuesFrom), so the series exists before a problem.
    ctx.metrics
        .set_values_problem(&name, observation.values_problem.is_some());
    ctx.metrics
        .set_pod_certificates_unavailable(&name, observation.pod_certificates_unserved);
    // status.coverage belongs to the coverage loop's own field manager, status.probe and the
    // Verified condition to the probe's, status.rollout and RolledOut to the rollout's: left out here, they are neither compared nor applied (so
    // this apply never removes or reverts them).
    let current = ctx.status.known(policy).map(|mut s| {
        Owner::Reconcile.keep_own(&mut s);
        s
    });
    let now = Timestamp::now();
    let mut status = desired_status(current.as_ref(), &observation, now);
    let served_somehow = matches!(
        outcome,
        WebhookOutcome::Applied { .. } | WebhookOutcome::Held { .. }
    );
    // While the new path settles, the old one is in force too: status.mode flips once it goes.
    if settling.is_none() {
        intree::apply_status(&mut status, &d.mode, served_somehow, generation, now);
    } else {
        let previous = status.mode;
        intree::apply_status(&mut status, &d.mode, served_somehow, generation, now);
        status.mode = previous.or(status.mode);
    }
    // Ready for this generation only once the API server is seen enforcing it.
    enforcement::gate(&mut status, current.as_ref(), generation, &enforced, now);
    ctx.metrics.set_not_enforced(&name, enforced.not_enforced());
    status.certificate_not_after = ctx.serving.borrow().not_after_rfc3339();
    let mut events = Vec::new();
    if write_status(ctx, policy, &status).await? {
        events = planned_events(current.as_ref(), &status);
    }
    if let Some(drift) = restored {
        events.push(drift);
    }
    for event in events {
        publish(ctx, policy, event).await;
    }

    let again = [settling, enforced.retry()].into_iter().flatten().min();
    match failure {
        Some(e) => Err(e),
        None => Ok(Action::requeue(again.unwrap_or(RESYNC))),
    }
}

/// Removes both paths: the policy from every webhook entry, and its in-tree admission policy and
/// binding.
async fn remove_both(ctx: &Context, policy: &InjectionPolicy, plan: &Plan) -> Result<(), Error> {
    retire(ctx, policy, plan, None).await?;
    intree_apply::remove(ctx, policy).await.map(|_| ())
}

/// Why the policy in force cannot be rendered with its `valuesFrom` data, as every replica sees
/// it (the same cache and function); `None` before the data is listed.
fn values_problem(ctx: &Context, compiled: &CompiledPolicy) -> Option<(&'static str, String)> {
    let spec = compiled.spec();
    if spec.values_from.is_empty() || !ctx.values.synced() {
        return None;
    }
    match ctx.values.resolve(spec) {
        Err(e @ ValuesFromError::SourceMissing { .. }) => Some(("SourceMissing", e.to_string())),
        Err(e @ ValuesFromError::NamespaceNotAllowed { .. }) => {
            Some(("NamespaceNotAllowed", e.to_string()))
        }
        Ok(resolved) => {
            CompiledPolicy::compile_with(compiled.name(), compiled.generation(), spec, &resolved)
                .err()
                .map(|e| ("InvalidValues", e.to_string()))
        }
    }
}

/// Whether the policy in force gives pods an identity the API server cannot serve (known only
/// once discovery answered).
fn pod_certificates_unserved(ctx: &Context, compiled: &CompiledPolicy) -> bool {
    compiled.spec().identity.is_some() && *ctx.pod_certificates.borrow() == Some(false)
}

/// The Ready reason for a policy that does not compile.
fn invalid_reason(error: &PolicyError) -> &'static str {
    match error {
        PolicyError::Template { .. } => "InvalidTemplate",
        PolicyError::Selector { .. } => "InvalidSelector",
        PolicyError::DuplicateName { .. } => "DuplicateName",
        PolicyError::InvalidField { .. } => "InvalidField",
        PolicyError::Privileged { .. } => "PrivilegedContent",
    }
}

/// The status lists at most this many warnings (the CRD's bound); the validating webhook and the
/// offline CLI show them all.
const MAX_STATUS_WARNINGS: usize = 32;

fn status_warnings(warnings: &[splice_engine::PolicyWarning]) -> Vec<String> {
    warnings
        .iter()
        .take(MAX_STATUS_WARNINGS)
        .map(ToString::to_string)
        .collect()
}

fn failed(configuration: String, error: Error, slot: &mut Option<Error>) -> WebhookOutcome {
    let outcome = WebhookOutcome::Failed {
        configuration,
        error: error.to_string(),
    };
    *slot = Some(error);
    outcome
}

/// True when the status already reports this generation's configuration as applied, so a
/// configuration that no longer matches was changed by someone else, not by a policy edit.
fn was_applied_at_this_generation(policy: &InjectionPolicy, group: &Group) -> bool {
    policy.status.as_ref().is_some_and(|s| {
        s.observed_generation == policy.metadata.generation
            && s.webhook_configuration.as_deref() == Some(group.configuration.as_str())
            && s.conditions.iter().any(|c| {
                c.type_ == splice_crds::condition::WEBHOOK_CONFIGURED && c.status == "True"
            })
    })
}

/// Writes the desired configuration unless the observed one already says all of it. Returns the
/// drift Event to publish when the configuration had been deleted, or edited by another field
/// manager, after Splice had applied it.
async fn ensure_applied(ctx: &Context, group: &Group) -> Result<Option<PlannedEvent>, Error> {
    let ca_bundle = ctx.ca_bundle.borrow().clone().ok_or(Error::NoCertificate)?;
    let cx = RenderContext {
        target: &ctx.target,
        splice_namespace: &ctx.namespace,
        ca_bundle: ca_bundle.as_bytes(),
    };
    let desired = render_group(group, &cx)?;
    let name = desired.metadata.name.clone().unwrap_or_default();
    let api: Api<MutatingWebhookConfiguration> = Api::all(ctx.client.clone());
    let applied = apply_if_changed(&api, &ctx.leading, &desired)
        .await
        .map_err(|CallFailed { step, source }| match step {
            Step::Reading => Error::Read {
                name: name.clone(),
                source,
            },
            Step::Writing | Step::Removing => Error::Apply {
                name: name.clone(),
                source,
            },
        })?;
    match applied {
        Applied::UpToDate(_) => Ok(None),
        Applied::NotLeader => Err(Error::NotLeader),
        Applied::Written { drift, .. } => Ok(drift.map(|drift| PlannedEvent {
            severity: Severity::Warning,
            reason: "WebhookConfigurationRestored".to_owned(),
            action: "ApplyWebhookConfiguration",
            note: drift.note("MutatingWebhookConfiguration", &name),
        })),
    }
}

/// Writes `group`, after the new paths of members moving out of it ([`Desired::leaving`]), so
/// none is without an entry whichever reconcile runs first.
async fn ensure_applied_after_leaver(
    ctx: &Context,
    d: &Desired<'_>,
    group: &Group,
) -> Result<Option<PlannedEvent>, Error> {
    for next in d.leaving.iter().filter_map(|m| d.plan.group_of(m)) {
        ensure_applied(ctx, next).await?;
    }
    ensure_applied(ctx, group).await
}

/// Takes `policy` out of every entry that served it other than `keep`: an entry still planned for
/// other policies is rewritten without it; one no longer planned is deleted, after the entries
/// that now serve its other policies are in force (so none of them has a moment unserved).
async fn retire(
    ctx: &Context,
    policy: &InjectionPolicy,
    plan: &Plan,
    keep: Option<&str>,
) -> Result<(), Error> {
    let name = policy.name_any();
    let mut candidates = BTreeSet::from([webhook_configuration_name(&name)]);
    if let Some(previous) = ctx
        .status
        .known(policy)
        .and_then(|s| s.webhook_configuration)
    {
        candidates.insert(previous);
    }
    for candidate in candidates {
        if Some(candidate.as_str()) == keep {
            continue;
        }
        if let Some(group) = plan.group_named(&candidate) {
            if !group.members.iter().any(|m| m.name == name) {
                ensure_applied(ctx, group).await?;
            }
            continue;
        }
        let api: Api<MutatingWebhookConfiguration> = Api::all(ctx.client.clone());
        let observed = api
            .get_opt(&candidate)
            .await
            .map_err(|source| Error::Read {
                name: candidate.clone(),
                source,
            })?;
        let Some(observed) = observed else { continue };
        for owner in observed.owner_references() {
            if let Some(group) = plan.group_of(&owner.name)
                && group.configuration != candidate
                && owner.name != name
            {
                ensure_applied(ctx, group).await?;
            }
        }
        ensure_absent(ctx, policy, &candidate).await?;
    }
    Ok(())
}

/// Deletes the policy's configuration if it exists and is Splice's (owned by this policy, or
/// labelled as managed by Splice); a configuration of the same name that someone else made is
/// left alone.
async fn ensure_absent(ctx: &Context, policy: &InjectionPolicy, name: &str) -> Result<(), Error> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(ctx.client.clone());
    let removal = remove_if_ours(&api, &ctx.leading, policy.metadata.uid.as_deref(), name)
        .await
        .map_err(|CallFailed { step, source }| match step {
            Step::Reading => Error::Read {
                name: name.to_owned(),
                source,
            },
            Step::Writing | Step::Removing => Error::Remove {
                name: name.to_owned(),
                source,
            },
        })?;
    match removal {
        Removal::NotLeader => Err(Error::NotLeader),
        Removal::Absent | Removal::NotOurs | Removal::Removed => Ok(()),
    }
}

/// Writes the reconcile's slice of the status unless it is known already; true when written.
async fn write_status(
    ctx: &Context,
    policy: &InjectionPolicy,
    status: &InjectionPolicyStatus,
) -> Result<bool, Error> {
    match ctx.status.apply(policy, status).await {
        Ok(status::Outcome::Written) => Ok(true),
        Ok(status::Outcome::UpToDate) => Ok(false),
        Ok(status::Outcome::NotLeader) => Err(Error::NotLeader),
        Err(WriteError::Patch { policy, source, .. }) => Err(Error::Status {
            name: policy,
            source,
        }),
    }
}

async fn publish(ctx: &Context, policy: &InjectionPolicy, event: PlannedEvent) {
    if ctx.ensure_leading().is_err() {
        return;
    }
    let type_ = match event.severity {
        Severity::Normal => EventType::Normal,
        Severity::Warning => EventType::Warning,
    };
    let reason = event.reason.clone();
    let ev = Event {
        type_,
        reason: event.reason,
        note: Some(truncate(event.note, 1000)),
        action: event.action.to_owned(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &policy.object_ref(&())).await {
        tracing::warn!(policy = %policy.name_any(), reason = %reason, error = %e, "could not publish an Event");
    }
}
