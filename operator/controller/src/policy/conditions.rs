//! Pure: what a policy's status should say, given what the reconciler found and did, and which
//! Events tell a person that its effective state changed.

use k8s_openapi::jiff::Timestamp;
use splice_crds::{
    ConditionStatus, FailurePolicy, InjectionPolicy, InjectionPolicyStatus, PodSecurityLevel,
    condition, set_condition,
};

use super::conflicts::Conflict;
use crate::guard::GuardStatus;

/// The failure policy actually written into the webhook, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailurePolicyDecision {
    pub effective: FailurePolicy,
    /// Reason and message of the FailClosed condition.
    pub reason: &'static str,
    pub message: String,
}

impl FailurePolicyDecision {
    pub fn fail_closed(&self) -> bool {
        self.effective == FailurePolicy::Fail
    }
}

/// Reasons of the FailClosed condition when the requested policy is in force; any other reason is
/// the availability guard's and means `Fail` was downgraded.
pub const REASON_IGNORE_REQUESTED: &str = "IgnoreRequested";
pub const REASON_FAIL_IN_FORCE: &str = "FailInForce";

/// The failure policy in force for a policy that requests `requested`, given what the
/// availability guard found.
///
/// `Fail` makes every matching pod creation depend on Splice being reachable; it is only put in
/// force while the guard has verified Splice's own availability (see [`crate::guard`]).
pub fn effective_failure_policy(
    requested: FailurePolicy,
    guard: &GuardStatus,
) -> FailurePolicyDecision {
    match (requested, &guard.blocked) {
        (FailurePolicy::Ignore, _) => FailurePolicyDecision {
            effective: FailurePolicy::Ignore,
            reason: REASON_IGNORE_REQUESTED,
            message: "spec.failurePolicy is Ignore: when the webhook cannot be reached, pods are \
                      admitted without injection."
                .to_owned(),
        },
        (FailurePolicy::Fail, None) => FailurePolicyDecision {
            effective: FailurePolicy::Fail,
            reason: REASON_FAIL_IN_FORCE,
            message: "spec.failurePolicy is Fail and Splice is available (at least 2 available \
                      replicas and a PodDisruptionBudget that keeps one): matching pods are not \
                      admitted while the webhook cannot be reached."
                .to_owned(),
        },
        (FailurePolicy::Fail, Some((reason, why))) => FailurePolicyDecision {
            effective: FailurePolicy::Ignore,
            reason: reason.as_str(),
            message: format!(
                "spec.failurePolicy is Fail, but the webhook is written with Ignore: {why}. Until \
                 that is fixed, when the webhook cannot be reached, pods are admitted without \
                 injection."
            ),
        },
    }
}

/// What happened to the policy's webhook configuration in this reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WebhookOutcome {
    /// The configuration matches the policy (it was written, or already up to date).
    Applied { configuration: String },
    /// Removed (or kept absent) because the policy is paused.
    Paused { configuration: String },
    /// Removed (or kept absent) because the policy does not compile and no earlier generation
    /// did.
    Invalid {
        configuration: String,
        reason: &'static str,
        error: String,
    },
    /// The current generation does not compile; the configuration still serves the last one that
    /// did (`serving_generation`), unchanged.
    Held {
        configuration: String,
        reason: &'static str,
        error: String,
        serving_generation: i64,
    },
    /// Could not be written; the reconciler retries with backoff.
    Failed {
        configuration: String,
        error: String,
    },
}

/// Everything the status is decided from.
#[derive(Clone, Debug)]
pub struct Observation<'a> {
    pub generation: Option<i64>,
    /// The template hash of the generation in force.
    pub template_hash: Option<&'a str>,
    /// The generation in force and its spec (see [`super::in_force`]).
    pub serving: Option<(i64, &'a serde_json::Value)>,
    pub webhook: &'a WebhookOutcome,
    pub failure_policy: &'a FailurePolicyDecision,
    pub conflicts: &'a [Conflict],
    /// The Pod Security level the injected content satisfies, when the templates compile.
    pub pod_security: Option<PodSecurityLevel>,
    /// The compiler's warnings about the policy (fields absent at admission, confused deputy).
    pub warnings: &'a [String],
    /// The policies a shared webhook entry serves, in the order it applies them (this one among
    /// them); empty when the entry serves this policy alone.
    pub shared_with: &'a [String],
    /// This policy's name.
    pub policy: &'a str,
    /// Why the data of `spec.valuesFrom` cannot be rendered (the Ready reason and message); the
    /// last good rendering keeps serving meanwhile.
    pub values_problem: Option<(&'static str, String)>,
    /// The policy has `spec.identity` and the API server does not serve PodCertificateRequests.
    pub pod_certificates_unserved: bool,
    /// The path the outcome is about: a webhook configuration, or in-tree objects.
    pub path: Path,
}

/// Which admission objects the conditions speak of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Webhook,
    /// A MutatingAdmissionPolicy and its binding, named like the configuration would be.
    InTree,
}

impl Path {
    /// The object that carries the policy, as a message names it.
    fn object(self, name: &str) -> String {
        match self {
            Path::Webhook => format!("MutatingWebhookConfiguration {name}"),
            Path::InTree => format!("MutatingAdmissionPolicy {name} (or its binding)"),
        }
    }
}

/// Ready's reason for an identity policy on an API server without PodCertificateRequests.
pub const REASON_POD_CERTIFICATES_UNAVAILABLE: &str = "PodCertificatesUnavailable";

/// Keeps condition messages readable in `kubectl describe`; the full list is in the Events.
const MAX_LISTED_CONFLICTS: usize = 5;

/// The status the policy should have. Conditions keep their `lastTransitionTime` unless their
/// status flips, so recomputing an unchanged status yields a value equal to `current`.
pub fn desired_status(
    current: Option<&InjectionPolicyStatus>,
    obs: &Observation<'_>,
    now: Timestamp,
) -> InjectionPolicyStatus {
    let mut status = current.cloned().unwrap_or_default();
    let generation = obs.generation;
    let mut set = |type_: &str, s: ConditionStatus, reason: &str, message: &str| {
        set_condition(
            &mut status.conditions,
            type_,
            s,
            reason,
            message,
            generation,
            now,
        );
    };

    let object = |name: &str| obs.path.object(name);
    let (ready, configured) = match obs.webhook {
        WebhookOutcome::Applied { configuration } if obs.path == Path::InTree => (
            (
                ConditionStatus::True,
                "Configured",
                format!(
                    "Pods selected by this policy are injected in-tree by MutatingAdmissionPolicy \
                     {configuration} and its binding (failurePolicy {}): no webhook call.",
                    obs.failure_policy.effective.as_str()
                ),
            ),
            (
                ConditionStatus::True,
                "InTree",
                format!(
                    "No webhook: MutatingAdmissionPolicy {configuration} and its binding match \
                     this policy."
                ),
            ),
        ),
        WebhookOutcome::Applied { configuration } => {
            let mut ready_message = if obs.conflicts.is_empty() {
                format!(
                    "Pods selected by this policy are injected through MutatingWebhookConfiguration \
                     {configuration} (failurePolicy {}).",
                    obs.failure_policy.effective.as_str()
                )
            } else {
                format!(
                    "Pods selected by this policy are injected through MutatingWebhookConfiguration \
                     {configuration} (failurePolicy {}), but it conflicts with other policies: see \
                     the Conflicted condition.",
                    obs.failure_policy.effective.as_str()
                )
            };
            if !obs.shared_with.is_empty() {
                ready_message.push_str(&format!(
                    " The entry is shared: one call applies {} in that order.",
                    obs.shared_with.join(", ")
                ));
            }
            (
                (ConditionStatus::True, "Configured", ready_message),
                (
                    ConditionStatus::True,
                    "Applied",
                    format!("MutatingWebhookConfiguration {configuration} matches this policy."),
                ),
            )
        }
        WebhookOutcome::Paused { configuration } => {
            let message = format!(
                "spec.paused is true, so {} no longer serves this policy and no pod is injected; \
                 set spec.paused to false to resume injection.",
                object(configuration)
            );
            (
                (ConditionStatus::False, "Paused", message.clone()),
                (ConditionStatus::False, "Paused", message),
            )
        }
        WebhookOutcome::Invalid {
            configuration,
            reason,
            error,
        } => (
            (
                ConditionStatus::False,
                *reason,
                format!(
                    "The policy does not compile: {error}. No pod is injected until the spec is \
                     fixed."
                ),
            ),
            (
                ConditionStatus::False,
                *reason,
                format!(
                    "{} no longer serves this policy because no generation of it compiles.",
                    object(configuration)
                ),
            ),
        ),
        WebhookOutcome::Held {
            configuration,
            reason,
            error,
            serving_generation,
        } => (
            (
                ConditionStatus::False,
                *reason,
                format!(
                    "Generation {} does not compile: {error}. Generation {serving_generation} \
                     (status.servingGeneration) stays in force: {} and every replica keep \
                     serving it until the spec is fixed.",
                    generation.unwrap_or_default(),
                    object(configuration)
                ),
            ),
            match obs.path {
                Path::InTree => (
                    ConditionStatus::True,
                    "InTree",
                    format!(
                        "No webhook: MutatingAdmissionPolicy {configuration} and its binding \
                         match this policy."
                    ),
                ),
                Path::Webhook => (
                    ConditionStatus::True,
                    "ServingLastGood",
                    format!(
                        "MutatingWebhookConfiguration {configuration} is unchanged: it serves \
                         generation {serving_generation}, the last that compiled."
                    ),
                ),
            },
        ),
        WebhookOutcome::Failed {
            configuration,
            error,
        } => (
            (
                ConditionStatus::False,
                "WebhookConfigurationFailed",
                format!(
                    "{} could not be written: {error}. Splice retries with backoff; check its \
                     logs and RBAC.",
                    object(configuration)
                ),
            ),
            (
                ConditionStatus::False,
                "ApplyFailed",
                format!("Writing {} failed: {error}.", object(configuration)),
            ),
        ),
    };
    let ready = match (&obs.values_problem, obs.webhook) {
        (Some((reason, problem)), WebhookOutcome::Applied { .. }) => (
            ConditionStatus::False,
            *reason,
            format!(
                "{problem}. Every replica keeps serving the last rendering that had its data (a \
                 replica that never had it does not inject this policy); restoring the object or \
                 key clears this."
            ),
        ),
        _ => ready,
    };
    let ready = match obs.webhook {
        WebhookOutcome::Applied { .. } if obs.pod_certificates_unserved => (
            ConditionStatus::False,
            REASON_POD_CERTIFICATES_UNAVAILABLE,
            format!(
                "spec.identity: {}. Pods are injected, but get no certificate until the API \
                 server serves them.",
                splice_engine::identity::UNSERVED
            ),
        ),
        _ => ready,
    };
    set(condition::READY, ready.0, ready.1, &ready.2);
    set(
        condition::WEBHOOK_CONFIGURED,
        configured.0,
        configured.1,
        &configured.2,
    );
    set(
        condition::FAIL_CLOSED,
        obs.failure_policy.fail_closed().into(),
        obs.failure_policy.reason,
        &obs.failure_policy.message,
    );
    if obs.conflicts.is_empty() {
        set(
            condition::CONFLICTED,
            ConditionStatus::False,
            "NoConflicts",
            "No other policy that can select the same pods injects a container, init container, \
             volume or env var of the same name with different content.",
        );
    } else {
        set(
            condition::CONFLICTED,
            ConditionStatus::True,
            "ConflictingInjection",
            &conflict_message(obs.conflicts, obs.policy, obs.shared_with),
        );
    }

    status.observed_generation = generation;
    status.effective_failure_policy = Some(obs.failure_policy.effective);
    status.template_hash = obs.template_hash.map(str::to_owned);
    status.serving_generation = obs.serving.map(|(g, _)| g);
    status.serving_spec = obs.serving.map(|(_, spec)| spec.clone());
    status.pod_security = obs.pod_security;
    status.warnings = obs.warnings.to_vec();
    status.webhook_configuration = match obs.webhook {
        WebhookOutcome::Applied { configuration } | WebhookOutcome::Held { configuration, .. } => {
            Some(configuration.clone())
        }
        // The configuration may still exist from an earlier generation; the name stays until it
        // is known to be gone.
        WebhookOutcome::Failed { .. } => status.webhook_configuration,
        WebhookOutcome::Paused { .. } | WebhookOutcome::Invalid { .. } => None,
    };
    status
}

/// The conflicts, and for each with a policy of the same shared entry, which one wins: the entry
/// applies its policies in name order and a later one never overwrites an item already there.
fn conflict_message(conflicts: &[Conflict], policy: &str, shared_with: &[String]) -> String {
    let mut parts: Vec<String> = conflicts
        .iter()
        .take(MAX_LISTED_CONFLICTS)
        .map(|c| {
            if !shared_with.contains(&c.other) {
                return c.to_string();
            }
            let first = if policy < c.other.as_str() {
                "this policy's"
            } else {
                "its"
            };
            format!(
                "{c} (one shared webhook entry applies both, in name order: {first} {} wins)",
                c.kind
            )
        })
        .collect();
    if conflicts.len() > MAX_LISTED_CONFLICTS {
        parts.push(format!(
            "and {} more",
            conflicts.len() - MAX_LISTED_CONFLICTS
        ));
    }
    format!(
        "{}. Both policies can select the same pods, so what a pod gets depends on webhook order. \
         Rename the item, make the content identical, or make the selectors disjoint.",
        parts.join("; ")
    )
}

/// Severity of a planned Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Normal,
    Warning,
}

/// An Event to publish on the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedEvent {
    pub severity: Severity,
    pub reason: String,
    pub action: &'static str,
    pub note: String,
}

/// Events for every change of effective state between `old` and `new`: a condition whose status
/// or reason changed, or a new template hash. Message-only changes (e.g. a new generation with
/// the same outcome) are not events, so a steady policy emits none.
pub fn planned_events(
    old: Option<&InjectionPolicyStatus>,
    new: &InjectionPolicyStatus,
) -> Vec<PlannedEvent> {
    let mut events = Vec::new();
    for cond in &new.conditions {
        let before = old.and_then(|o| o.conditions.iter().find(|c| c.type_ == cond.type_));
        let severity = severity(&cond.type_, &cond.status, &cond.reason);
        let changed = match before {
            Some(b) => b.status != cond.status || b.reason != cond.reason,
            // A fresh policy: only what needs attention. "Ready" is what a new policy is expected
            // to become and `kubectl get` shows it; an Event for it would be one more API write
            // per policy (a third of the writes of 1,000 policies applied at once) saying nothing.
            None => severity == Severity::Warning,
        };
        if changed {
            events.push(PlannedEvent {
                severity,
                reason: cond.reason.clone(),
                action: action(&cond.type_),
                note: cond.message.clone(),
            });
        }
    }
    let old_hash = old.and_then(|o| o.template_hash.as_deref());
    if let (Some(before), Some(after)) = (old_hash, new.template_hash.as_deref())
        && before != after
    {
        events.push(PlannedEvent {
            severity: Severity::Normal,
            reason: "TemplateUpdated".to_owned(),
            action: "Reconcile",
            note: format!(
                "New pods get template {after} (was {before}); pods that already exist are not changed."
            ),
        });
    }
    events
}

fn severity(type_: &str, status: &str, reason: &str) -> Severity {
    let bad = match type_ {
        condition::READY | condition::WEBHOOK_CONFIGURED => status != "True" && reason != "Paused",
        // Fail was requested but is not in force: the guard's reason.
        condition::FAIL_CLOSED => {
            reason != REASON_IGNORE_REQUESTED && reason != REASON_FAIL_IN_FORCE
        }
        condition::CONFLICTED => status == "True",
        _ => false,
    };
    if bad {
        Severity::Warning
    } else {
        Severity::Normal
    }
}

fn action(type_: &str) -> &'static str {
    match type_ {
        condition::WEBHOOK_CONFIGURED => "ApplyWebhookConfiguration",
        condition::FAIL_CLOSED => "SetFailurePolicy",
        condition::CONFLICTED => "DetectConflicts",
        _ => "Reconcile",
    }
}

/// The status of `policy` while Splice cannot serve any certificate because of `problem`: Ready
/// False, saying why. `None` when `current` already says so (no write).
pub fn unavailable_status(
    current: Option<&InjectionPolicyStatus>,
    policy: &InjectionPolicy,
    problem: &str,
) -> Option<InjectionPolicyStatus> {
    let mut status = current.cloned().unwrap_or_default();
    let generation_changed = status.observed_generation != policy.metadata.generation;
    status.observed_generation = policy.metadata.generation;
    let changed = set_condition(
        &mut status.conditions,
        condition::READY,
        ConditionStatus::False,
        "CertificateUnavailable",
        problem,
        policy.metadata.generation,
        Timestamp::now(),
    );
    (changed || generation_changed).then_some(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::Reason;
    use crate::policy::conflicts::ItemKind;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn applied() -> WebhookOutcome {
        WebhookOutcome::Applied {
            configuration: "splice-p".into(),
        }
    }

    fn obs<'a>(
        webhook: &'a WebhookOutcome,
        fp: &'a FailurePolicyDecision,
        conflicts: &'a [Conflict],
    ) -> Observation<'a> {
        Observation {
            generation: Some(2),
            template_hash: Some("h1"),
            serving: None,
            webhook,
            failure_policy: fp,
            conflicts,
            pod_security: Some(PodSecurityLevel::Baseline),
            warnings: &[],
            shared_with: &[],
            policy: "p",
            values_problem: None,
            pod_certificates_unserved: false,
            path: Path::Webhook,
        }
    }

    fn cond<'a>(
        s: &'a InjectionPolicyStatus,
        t: &str,
    ) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn requesting_fail_is_downgraded_to_ignore_with_the_guards_reason_until_the_guard_allows_it() {
        let blocked = GuardStatus {
            blocked: Some((
                Reason::InsufficientReplicas,
                "Deployment splice has 1 available replica(s)".into(),
            )),
        };
        let d = effective_failure_policy(FailurePolicy::Fail, &blocked);
        assert_eq!(d.effective, FailurePolicy::Ignore);
        assert!(!d.fail_closed());
        assert_eq!(d.reason, "InsufficientReplicas");
        assert!(d.message.contains("1 available replica"), "{}", d.message);

        let d = effective_failure_policy(FailurePolicy::Fail, &GuardStatus { blocked: None });
        assert_eq!(d.effective, FailurePolicy::Fail);
        assert!(d.fail_closed());
        assert_eq!(
            effective_failure_policy(FailurePolicy::Ignore, &GuardStatus { blocked: None })
                .effective,
            FailurePolicy::Ignore
        );
    }

    #[test]
    fn an_in_tree_path_is_worded_for_its_admission_policy_never_a_webhook_configuration() {
        let fp = effective_failure_policy(FailurePolicy::Fail, &GuardStatus::not_observed());
        let outcomes = [
            applied(),
            WebhookOutcome::Paused {
                configuration: "splice-p".into(),
            },
            WebhookOutcome::Failed {
                configuration: "splice-p".into(),
                error: "forbidden".into(),
            },
        ];
        for w in &outcomes {
            let mut o = obs(w, &fp, &[]);
            o.path = Path::InTree;
            let s = desired_status(None, &o, ts(1));
            for t in [condition::READY, condition::WEBHOOK_CONFIGURED] {
                let c = cond(&s, t);
                assert!(
                    !c.message.contains("MutatingWebhookConfiguration"),
                    "{t}: {}",
                    c.message
                );
                assert!(
                    c.message.contains("MutatingAdmissionPolicy splice-p"),
                    "{t}: {}",
                    c.message
                );
            }
        }
        let mut o = obs(&outcomes[0], &fp, &[]);
        o.path = Path::InTree;
        let s = desired_status(None, &o, ts(1));
        assert_eq!(cond(&s, condition::WEBHOOK_CONFIGURED).reason, "InTree");
        assert!(
            cond(&s, condition::READY)
                .message
                .contains("injected in-tree by MutatingAdmissionPolicy splice-p and its binding")
        );
    }

    #[test]
    fn an_applied_policy_is_ready_with_every_condition_at_its_generation() {
        let fp = effective_failure_policy(FailurePolicy::Ignore, &GuardStatus::not_observed());
        let w = applied();
        let s = desired_status(None, &obs(&w, &fp, &[]), ts(1));
        assert_eq!(s.observed_generation, Some(2));
        assert_eq!(s.webhook_configuration.as_deref(), Some("splice-p"));
        assert_eq!(s.template_hash.as_deref(), Some("h1"));
        assert_eq!(s.effective_failure_policy, Some(FailurePolicy::Ignore));
        for (t, status) in [
            (condition::READY, "True"),
            (condition::WEBHOOK_CONFIGURED, "True"),
            (condition::FAIL_CLOSED, "False"),
            (condition::CONFLICTED, "False"),
        ] {
            let c = cond(&s, t);
            assert_eq!(c.status, status, "{t}");
            assert_eq!(c.observed_generation, Some(2));
        }
    }

    #[test]
    fn recomputing_an_unchanged_status_is_equal_so_nothing_is_written() {
        let fp = effective_failure_policy(FailurePolicy::Ignore, &GuardStatus::not_observed());
        let w = applied();
        let first = desired_status(None, &obs(&w, &fp, &[]), ts(1));
        let again = desired_status(Some(&first), &obs(&w, &fp, &[]), ts(500));
        assert_eq!(first, again);
        assert!(planned_events(Some(&first), &again).is_empty());
    }

    #[test]
    fn a_paused_policy_is_not_ready_and_names_no_configuration() {
        let fp = effective_failure_policy(FailurePolicy::Ignore, &GuardStatus::not_observed());
        let w = WebhookOutcome::Paused {
            configuration: "splice-p".into(),
        };
        let s = desired_status(None, &obs(&w, &fp, &[]), ts(1));
        let ready = cond(&s, condition::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "Paused")
        );
        assert!(ready.message.contains("spec.paused to false"));
        assert_eq!(s.webhook_configuration, None);
    }

    #[test]
    fn an_invalid_template_says_why_and_drops_the_hash() {
        let fp = effective_failure_policy(FailurePolicy::Ignore, &GuardStatus::not_observed());
        let w = WebhookOutcome::Invalid {
            configuration: "splice-p".into(),
            reason: "InvalidTemplate",
            error: "spec.template.containers[0].image: undefined variable `values.nope`".into(),
        };
        let mut o = obs(&w, &fp, &[]);
        o.template_hash = None;
        let s = desired_status(None, &o, ts(1));
        let ready = cond(&s, condition::READY);
        assert_eq!(ready.reason, "InvalidTemplate");
        assert!(ready.message.contains("values.nope"));
        assert_eq!(s.template_hash, None);
    }

    #[test]
    fn an_invalid_update_says_why_names_the_generation_in_force_and_keeps_the_configuration() {
        let fp = effective_failure_policy(FailurePolicy::Ignore, &GuardStatus::not_observed());
        let spec = serde_json::json!({"template": {"containers": [{"name": "proxy"}]}});
        let ok = applied();
        let mut o = obs(&ok, &fp, &[]);
        o.serving = Some((2, &spec));
        let before = desired_status(None, &o, ts(1));

        let held = WebhookOutcome::Held {
            configuration: "splice-p".into(),
            reason: "InvalidTemplate",
            error: "spec.template.containers[0].image: undefined value (in values.nope)".into(),
            serving_generation: 2,
        };
        let mut o = obs(&held, &fp, &[]);
        o.generation = Some(3);
        o.serving = Some((2, &spec));
        let after = desired_status(Some(&before), &o, ts(2));
        let ready = cond(&after, condition::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidTemplate")
        );
        assert!(
            ready.message.contains("Generation 3 does not compile"),
            "{}",
            ready.message
        );
        assert!(ready.message.contains("spec.template.containers[0].image"));
        assert!(ready.message.contains("Generation 2"));
        assert_eq!(ready.observed_generation, Some(3));
        let configured = cond(&after, condition::WEBHOOK_CONFIGURED);
        assert_eq!(configured.status, "True");
        assert_eq!(after.webhook_configuration.as_deref(), Some("splice-p"));
        assert_eq!(after.serving_generation, Some(2));
        assert_eq!(after.serving_spec.as_ref(), Some(&spec));
        assert_eq!(after.template_hash.as_deref(), Some("h1"));
        let events = planned_events(Some(&before), &after);
        assert!(
            events
                .iter()
                .any(|e| e.severity == Severity::Warning && e.reason == "InvalidTemplate"),
            "{events:?}"
        );
    }

    #[test]
    fn a_failed_write_keeps_the_configuration_name_it_had() {
        let fp = effective_failure_policy(FailurePolicy::Ignore, &GuardStatus::not_observed());
        let ok = applied();
        let before = desired_status(None, &obs(&ok, &fp, &[]), ts(1));
        let failed = WebhookOutcome::Failed {
            configuration: "splice-p".into(),
            error: "boom".into(),
        };
        let after = desired_status(Some(&before), &obs(&failed, &fp, &[]), ts(2));
        assert_eq!(after.webhook_configuration.as_deref(), Some("splice-p"));
        assert_eq!(
            cond(&after, condition::READY).reason,
            "WebhookConfigurationFailed"
        );
        assert_eq!(cond(&after, condition::READY).last_transition_time.0, ts(2));
    }

    #[test]
    fn conflicts_mark_the_policy_conflicted_naming_the_other_and_the_item() {
        let fp = effective_failure_policy(FailurePolicy::Ignore, &GuardStatus::not_observed());
        let w = applied();
        let c = [Conflict {
            other: "b".into(),
            kind: ItemKind::Container,
            item: "proxy".into(),
        }];
        let s = desired_status(None, &obs(&w, &fp, &c), ts(1));
        let conflicted = cond(&s, condition::CONFLICTED);
        assert_eq!(conflicted.status, "True");
        assert!(conflicted.message.contains("\"b\""));
        assert!(conflicted.message.contains("\"proxy\""));
    }

    #[test]
    fn a_long_conflict_list_is_shortened() {
        let fp = effective_failure_policy(FailurePolicy::Ignore, &GuardStatus::not_observed());
        let w = applied();
        let c: Vec<Conflict> = (0..8)
            .map(|i| Conflict {
                other: format!("p{i}"),
                kind: ItemKind::Volume,
                item: "v".into(),
            })
            .collect();
        let s = desired_status(None, &obs(&w, &fp, &c), ts(1));
        assert!(
            cond(&s, condition::CONFLICTED)
                .message
                .contains("and 3 more")
        );
    }

    #[test]
    fn a_new_policy_announces_only_warnings_not_that_it_is_ready() {
        let fp = effective_failure_policy(FailurePolicy::Fail, &GuardStatus::not_observed());
        let w = applied();
        let s = desired_status(None, &obs(&w, &fp, &[]), ts(1));
        let events = planned_events(None, &s);
        let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(reasons, vec!["AvailabilityNotObserved"]);
        assert_eq!(events[0].severity, Severity::Warning);

        let fine = effective_failure_policy(FailurePolicy::Ignore, &GuardStatus::not_observed());
        let s = desired_status(None, &obs(&w, &fine, &[]), ts(1));
        assert!(planned_events(None, &s).is_empty());

        let failed = WebhookOutcome::Failed {
            configuration: "splice-p".into(),
            error: "boom".into(),
        };
        let s = desired_status(None, &obs(&failed, &fine, &[]), ts(1));
        assert!(
            planned_events(None, &s)
                .iter()
                .any(|e| e.severity == Severity::Warning && e.reason != "Configured")
        );
    }

    #[test]
    fn pausing_and_new_templates_are_events_but_generation_bumps_alone_are_not() {
        let fp = effective_failure_policy(FailurePolicy::Ignore, &GuardStatus::not_observed());
        let w = applied();
        let first = desired_status(None, &obs(&w, &fp, &[]), ts(1));

        let mut o = obs(&w, &fp, &[]);
        o.generation = Some(3);
        let bumped = desired_status(Some(&first), &o, ts(2));
        assert_ne!(first, bumped);
        assert!(planned_events(Some(&first), &bumped).is_empty());

        o.template_hash = Some("h2");
        let retemplated = desired_status(Some(&bumped), &o, ts(3));
        let events = planned_events(Some(&bumped), &retemplated);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, "TemplateUpdated");

        let paused = WebhookOutcome::Paused {
            configuration: "splice-p".into(),
        };
        let mut o = obs(&paused, &fp, &[]);
        o.template_hash = Some("h2");
        let p = desired_status(Some(&retemplated), &o, ts(4));
        let events = planned_events(Some(&retemplated), &p);
        assert!(
            events
                .iter()
                .all(|e| e.reason == "Paused" && e.severity == Severity::Normal)
        );
        assert_eq!(events.len(), 2);
    }

    #[test]
    fn a_policy_is_told_once_why_no_certificate_can_be_served() {
        let mut policy = InjectionPolicy::new("p", Default::default());
        policy.metadata.generation = Some(3);
        let status = unavailable_status(None, &policy, "Secret splice-ca is not ours").unwrap();
        assert_eq!(status.observed_generation, Some(3));
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "CertificateUnavailable")
        );
        assert_eq!(ready.message, "Secret splice-ca is not ours");
        assert_eq!(
            unavailable_status(Some(&status), &policy, "Secret splice-ca is not ours"),
            None,
            "the same problem again is not a write"
        );
    }

    #[test]
    fn a_conflict_within_one_shared_entry_says_which_policy_wins() {
        let conflict = |other: &str| Conflict {
            other: other.into(),
            kind: ItemKind::Container,
            item: "proxy".into(),
        };
        let shared = ["a".to_owned(), "m".to_owned(), "z".to_owned()];
        let earlier = conflict_message(&[conflict("a")], "m", &shared);
        assert!(
            earlier.contains("in name order: its container wins"),
            "{earlier}"
        );
        let later = conflict_message(&[conflict("z")], "m", &shared);
        assert!(
            later.contains("in name order: this policy's container wins"),
            "{later}"
        );
        let elsewhere = conflict_message(&[conflict("q")], "m", &shared);
        assert!(!elsewhere.contains("wins"), "{elsewhere}");
    }

    fn ignore_requested() -> FailurePolicyDecision {
        FailurePolicyDecision {
            effective: FailurePolicy::Ignore,
            reason: "IgnoreRequested",
            message: String::new(),
        }
    }

    #[test]
    fn a_missing_values_source_makes_ready_false_naming_it_while_the_configuration_stays() {
        let webhook = applied();
        let fp = ignore_requested();
        let mut o = obs(&webhook, &fp, &[]);
        o.values_problem = Some((
            "SourceMissing",
            "spec.valuesFrom[0]: ConfigMap mesh-system/mesh-config key image not found".into(),
        ));
        let status = desired_status(None, &o, ts(1));
        let of = |t: &str| status.conditions.iter().find(|c| c.type_ == t).unwrap();
        let ready = of("Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "SourceMissing")
        );
        assert!(
            ready
                .message
                .contains("ConfigMap mesh-system/mesh-config key image")
        );
        assert_eq!(of("WebhookConfigured").status, "True");
        assert_eq!(status.webhook_configuration.as_deref(), Some("splice-p"));
    }

    #[test]
    fn an_identity_policy_without_pod_certificates_is_not_ready_saying_why_while_it_stays_configured()
     {
        let webhook = applied();
        let fp = ignore_requested();
        let mut o = obs(&webhook, &fp, &[]);
        o.pod_certificates_unserved = true;
        let status = desired_status(None, &o, ts(1));
        let of = |t: &str| status.conditions.iter().find(|c| c.type_ == t).unwrap();
        let ready = of("Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "PodCertificatesUnavailable")
        );
        assert!(
            ready.message.contains("podcertificaterequests"),
            "{}",
            ready.message
        );
        assert_eq!(of("WebhookConfigured").status, "True");
        o.pod_certificates_unserved = false;
        let status = desired_status(Some(&status), &o, ts(2));
        assert_ne!(
            status
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .unwrap()
                .reason,
            "PodCertificatesUnavailable"
        );
    }
}
