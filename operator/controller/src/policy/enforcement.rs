//! Pure: whether the API server has been seen enforcing the generation in force, and what Ready
//! says until it has.
//!
//! A written configuration is not yet an enforced one. The API server loads admission
//! configuration from its own informers after the write: a MutatingWebhookConfiguration within
//! milliseconds, a MutatingAdmissionPolicy and its binding only at the next tick of the generic
//! policy source's 1 s refresh (k8s.io/apiserver `policy/generic/policy_source.go`). So Ready
//! turns True for a generation only on evidence: a server-side dry-run pod that came back with
//! that generation's injection, or, where no pod can be probed, the measured [`SETTLE`] time.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use splice_crds::{
    ConditionStatus, EnforcementStatus, InjectionPolicyStatus, condition, set_condition,
};

/// How long the API server is given to load a new configuration where nothing can be probed, and
/// how long an old admission path stands beside a new one before it is removed. Measured on the
/// local control plane (docs/performance.md): a binding is enforced at most 1.1 s after its write
/// (the policy source's 1 s refresh plus the informer), a webhook configuration within 50 ms.
pub const SETTLE: Duration = Duration::from_secs(3);
/// Without evidence this long after the generation was first seen written, and with a probe
/// showing the injection absent, Ready turns False `NotEnforced`.
pub const NOT_ENFORCED_AFTER: Duration = Duration::from_secs(30);
const FIRST_RETRY: Duration = Duration::from_millis(200);
const MAX_RETRY: Duration = Duration::from_secs(2);
/// Looks taken at [`FIRST_RETRY`] before the retry backs off.
const STEADY_LOOKS: u32 = 10;
/// How often a generation that is not enforced is looked at again.
const NOT_ENFORCED_RETRY: Duration = Duration::from_secs(10);

/// `status.enforcement.evidence` values.
pub const EVIDENCE_PROBE: &str = "Probe";
pub const EVIDENCE_SETTLE_TIME: &str = "SettleTime";

/// How Ready words a generation written but not yet seen enforced.
const WRITTEN_NOT_SEEN: &str =
    "is written, and Ready reports it once the API server is seen enforcing it";

/// Ready reasons of this module.
pub const REASON_AWAITING: &str = "AwaitingEnforcement";
pub const REASON_NOT_ENFORCED: &str = "NotEnforced";

/// What this leader remembers of a generation it has written but not yet seen enforced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Awaiting {
    pub uid: Option<String>,
    pub generation: i64,
    /// When this leader first found the generation's configuration written.
    pub since: Timestamp,
    /// Looks taken so far (for the retry backoff).
    pub looks: u32,
    /// The sighting that showed the generation enforced, kept until Ready may report it.
    pub seen: Option<Sighting>,
}

impl Awaiting {
    pub fn new(uid: Option<String>, generation: i64, now: Timestamp) -> Self {
        Awaiting {
            uid,
            generation,
            since: now,
            looks: 0,
            seen: None,
        }
    }

    fn age(&self, now: Timestamp) -> Duration {
        Duration::try_from(now.duration_since(self.since)).unwrap_or(Duration::ZERO)
    }
}

/// What one look at the API server found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sighting {
    /// A dry-run pod in `namespace`, sent at `sent`, came back carrying this policy's injection
    /// of template `hash` (`None`: not injected).
    Pod {
        namespace: String,
        hash: Option<String>,
        sent: Timestamp,
    },
    /// The API server refused the dry-run pod because of this policy's own admission path (it
    /// could not call the webhook, or the webhook or the admission policy refused).
    Refused { namespace: String, message: String },
    /// No pod can be probed, and why.
    Unprobeable(String),
    /// The leader's namespace list is not loaded yet.
    NamespacesUnknown,
}

/// What Ready may say about the generation in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Enforced(EnforcementStatus),
    /// No evidence yet: look again after `retry`.
    Waiting {
        detail: String,
        retry: Duration,
    },
    /// Evidence against, for longer than [`NOT_ENFORCED_AFTER`].
    NotEnforced {
        detail: String,
        retry: Duration,
    },
}

impl Verdict {
    /// When the reconcile should look again.
    pub fn retry(&self) -> Option<Duration> {
        match self {
            Verdict::Enforced(_) => None,
            Verdict::Waiting { retry, .. } | Verdict::NotEnforced { retry, .. } => Some(*retry),
        }
    }
}

/// Whether `sighting` shows a pod injected with one of the `accepted` template hashes.
pub fn shows_enforced(sighting: &Sighting, accepted: &[&str]) -> bool {
    matches!(sighting, Sighting::Pod { hash: Some(h), .. } if accepted.contains(&h.as_str()))
}

/// Judges one look at the API server for `generation`, whose injection carries one of the
/// template hashes `accepted` (two while a canary is open: a pod outside it gets the promoted
/// revision).
pub fn judge(
    generation: i64,
    accepted: &[&str],
    awaiting: &Awaiting,
    sighting: &Sighting,
    now: Timestamp,
) -> Verdict {
    let retry = backoff(awaiting.looks);
    let against = |detail: String| {
        if awaiting.age(now) >= NOT_ENFORCED_AFTER {
            Verdict::NotEnforced {
                detail,
                retry: NOT_ENFORCED_RETRY,
            }
        } else {
            Verdict::Waiting { detail, retry }
        }
    };
    match sighting {
        Sighting::Pod {
            namespace,
            hash: Some(found),
            sent,
        } if shows_enforced(sighting, accepted) => {
            let status = EnforcementStatus {
                observed_generation: generation,
                evidence: EVIDENCE_PROBE.to_owned(),
                namespace: Some(namespace.clone()),
                revision: Some(found.clone()),
                detail: None,
                since: String::new(),
            };
            at_whole_second(status, *sent, now)
        }
        Sighting::Pod {
            namespace, hash, ..
        } => against(match hash {
            None => format!(
                "a server-side dry-run pod in namespace {namespace} came back without the \
                 injection"
            ),
            Some(_) => format!(
                "a server-side dry-run pod in namespace {namespace} came back with an earlier \
                 revision's injection"
            ),
        }),
        Sighting::Refused { namespace, message } => against(format!(
            "a server-side dry-run pod in namespace {namespace} was refused: {message}"
        )),
        Sighting::NamespacesUnknown => Verdict::Waiting {
            detail: "the namespace list is still loading".to_owned(),
            retry: FIRST_RETRY,
        },
        Sighting::Unprobeable(why) => {
            let settled = awaiting
                .since
                .checked_add(SignedDuration::try_from(SETTLE).unwrap_or(SignedDuration::ZERO))
                .unwrap_or(awaiting.since);
            let status = EnforcementStatus {
                observed_generation: generation,
                evidence: EVIDENCE_SETTLE_TIME.to_owned(),
                namespace: None,
                revision: None,
                detail: Some(why.clone()),
                since: String::new(),
            };
            if now < settled {
                Verdict::Waiting {
                    detail: format!(
                        "{why}, so Ready waits {}s, the time the API server is measured to take \
                         to load a new configuration",
                        SETTLE.as_secs()
                    ),
                    retry: until(now, settled),
                }
            } else {
                at_whole_second(status, settled, now)
            }
        }
    }
}

/// Enforced from `from` on, reported from the next whole second after it: `creationTimestamp`
/// and `lastTransitionTime` are whole seconds, so a pod created in a second that Ready reports
/// was created after `from`, and coverage may count it missed without guessing.
fn at_whole_second(mut status: EnforcementStatus, from: Timestamp, now: Timestamp) -> Verdict {
    let boundary = next_whole_second(from);
    if now < boundary {
        return Verdict::Waiting {
            detail: "the API server is enforcing it; Ready reports it from the next whole second"
                .to_owned(),
            retry: until(now, boundary),
        };
    }
    status.since = boundary.to_string();
    Verdict::Enforced(status)
}

fn next_whole_second(t: Timestamp) -> Timestamp {
    if t.subsec_nanosecond() == 0 {
        t
    } else {
        Timestamp::from_second(t.as_second().saturating_add(1)).unwrap_or(t)
    }
}

fn until(now: Timestamp, then: Timestamp) -> Duration {
    Duration::try_from(then.duration_since(now))
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_millis(10))
}

/// Every 200 ms for the first 2 s (an admission policy loads within about 1 s), then doubling.
fn backoff(looks: u32) -> Duration {
    let doublings = looks.saturating_sub(STEADY_LOOKS - 1).min(8);
    FIRST_RETRY.saturating_mul(1u32 << doublings).min(MAX_RETRY)
}

/// The sentence Ready's message ends with for an enforced generation: read back from
/// `status.enforcement` alone, so an unchanged status words it the same.
pub fn evidence_sentence(e: &EnforcementStatus) -> String {
    match (e.evidence.as_str(), &e.namespace, &e.detail) {
        (EVIDENCE_PROBE, Some(ns), _) => format!(
            "The API server enforces generation {}: a server-side dry-run pod in namespace {ns} \
             came back with its injection.",
            e.observed_generation
        ),
        (_, _, detail) => format!(
            "Generation {} is taken as enforced after the {}s the API server is measured to take \
             to load a new configuration: {}.",
            e.observed_generation,
            SETTLE.as_secs(),
            detail.as_deref().unwrap_or("nothing could be probed")
        ),
    }
}

/// What the reconcile knows of enforcement for `generation` this time: decided once, by its look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Known {
    /// Ready is not True anyway (paused, invalid, failed, a `valuesFrom` problem): enforcement is
    /// not reported.
    NotApplicable,
    /// The status already holds evidence for this generation.
    Recorded(EnforcementStatus),
    /// This look's verdict.
    Judged(Verdict),
}

impl Known {
    /// When the reconcile should look again.
    pub fn retry(&self) -> Option<Duration> {
        match self {
            Known::Judged(v) => v.retry(),
            Known::NotApplicable | Known::Recorded(_) => None,
        }
    }

    /// True while a look found no evidence (what `splice_policy_not_enforced` reports).
    pub fn not_enforced(&self) -> bool {
        matches!(self, Known::Judged(v) if !matches!(v, Verdict::Enforced(_)))
    }
}

/// Applies enforcement to `status`, whose Ready was computed as if the generation were enforced:
/// Ready stays True for it only with evidence. Without evidence, a Ready that was True for an
/// earlier generation stays True for that one (its `observedGeneration`, so `kubectl wait` waits
/// on), else Ready is False `AwaitingEnforcement`, or `NotEnforced` once the evidence is against.
pub fn gate(
    status: &mut InjectionPolicyStatus,
    previous: Option<&InjectionPolicyStatus>,
    generation: Option<i64>,
    known: &Known,
    now: Timestamp,
) {
    let ready_true = status
        .conditions
        .iter()
        .any(|c| c.type_ == condition::READY && c.status == "True");
    let recorded = match known {
        Known::NotApplicable => {
            status.enforcement = None;
            return;
        }
        _ if !ready_true => {
            status.enforcement = None;
            return;
        }
        Known::Recorded(e) => Some(e.clone()),
        Known::Judged(Verdict::Enforced(e)) => Some(e.clone()),
        Known::Judged(_) => None,
    };
    let Some(ready) = status
        .conditions
        .iter_mut()
        .find(|c| c.type_ == condition::READY)
    else {
        return;
    };
    if let Some(e) = recorded {
        ready.message = format!("{} {}", ready.message, evidence_sentence(&e));
        status.enforcement = Some(e);
        return;
    }
    let (reason, detail) = match known {
        Known::Judged(Verdict::NotEnforced { detail, .. }) => (REASON_NOT_ENFORCED, detail),
        Known::Judged(Verdict::Waiting { detail, .. }) => (REASON_AWAITING, detail),
        _ => return,
    };
    let earlier = previous.and_then(|p| {
        let c = p
            .conditions
            .iter()
            .find(|c| c.type_ == condition::READY && c.status == "True")?;
        Some((c.clone(), p.enforcement.clone()))
    });
    // A wait already reported is not reworded at every look: one write when it starts.
    let before = previous.and_then(|p| p.conditions.iter().find(|c| c.type_ == condition::READY));
    let waiting_for = format!(
        "generation {} {WRITTEN_NOT_SEEN}",
        generation.unwrap_or_default()
    );
    match (reason, earlier) {
        // Still enforced as it was: keep saying so for that generation.
        (REASON_AWAITING, Some((kept, enforcement)))
            if before.is_some_and(|b| b.message.contains(&waiting_for)) =>
        {
            *ready = kept;
            status.enforcement = enforcement;
        }
        (REASON_AWAITING, Some((mut kept, enforcement))) => {
            let g = kept.observed_generation.unwrap_or_default();
            kept.message = format!("Generation {g} stays in force; {waiting_for}: {detail}.");
            *ready = kept;
            status.enforcement = enforcement;
        }
        _ if before.is_some_and(|b| {
            b.status == "False" && b.reason == reason && b.observed_generation == generation
        }) =>
        {
            if let Some(b) = before {
                *ready = b.clone();
            }
            status.enforcement = None;
        }
        _ => {
            let message = format!(
                "{} Not yet enforced by the API server: {detail}.",
                ready.message
            );
            set_condition(
                &mut status.conditions,
                condition::READY,
                ConditionStatus::False,
                reason,
                &message,
                generation,
                now,
            );
            status.enforcement = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn t(s: &str) -> Timestamp {
        s.parse().expect("a timestamp")
    }

    fn awaiting(since: &str) -> Awaiting {
        Awaiting::new(Some("u".into()), 2, t(since))
    }

    fn pod(hash: Option<&str>, sent: &str) -> Sighting {
        Sighting::Pod {
            namespace: "apps".into(),
            hash: hash.map(str::to_owned),
            sent: t(sent),
        }
    }

    fn ready(status: &str, generation: i64, message: &str) -> Condition {
        Condition {
            type_: condition::READY.into(),
            status: status.into(),
            reason: "Configured".into(),
            message: message.into(),
            observed_generation: Some(generation),
            last_transition_time: Time(t("2026-01-01T00:00:00Z")),
        }
    }

    #[test]
    fn a_dry_run_pod_with_this_revision_is_evidence_from_the_next_whole_second() {
        let a = awaiting("2026-01-01T00:00:10Z");
        let sighting = pod(Some("h2"), "2026-01-01T00:00:10.400Z");
        let early = judge(2, &["h2"], &a, &sighting, t("2026-01-01T00:00:10.500Z"));
        assert!(
            matches!(&early, Verdict::Waiting { retry, .. } if *retry == Duration::from_millis(500)),
            "{early:?}"
        );
        let Verdict::Enforced(e) = judge(2, &["h2"], &a, &sighting, t("2026-01-01T00:00:11Z"))
        else {
            panic!("enforced at the whole second")
        };
        assert_eq!(e.evidence, EVIDENCE_PROBE);
        assert_eq!(e.namespace.as_deref(), Some("apps"));
        assert_eq!(e.since, "2026-01-01T00:00:11Z");
        assert_eq!(e.observed_generation, 2);
    }

    #[test]
    fn a_pod_with_an_earlier_revision_or_none_is_not_evidence_and_turns_against_after_30_s() {
        let a = awaiting("2026-01-01T00:00:00Z");
        for sighting in [
            pod(Some("h1"), "2026-01-01T00:00:01Z"),
            pod(None, "2026-01-01T00:00:01Z"),
        ] {
            let v = judge(2, &["h2"], &a, &sighting, t("2026-01-01T00:00:01Z"));
            assert!(matches!(v, Verdict::Waiting { .. }), "{v:?}");
            let v = judge(2, &["h2"], &a, &sighting, t("2026-01-01T00:00:31Z"));
            assert!(matches!(v, Verdict::NotEnforced { .. }), "{v:?}");
        }
    }

    #[test]
    fn nothing_to_probe_is_enforced_only_after_the_settle_time() {
        let a = awaiting("2026-01-01T00:00:10.250Z");
        let why = Sighting::Unprobeable("no existing namespace is selected".into());
        let v = judge(2, &["h2"], &a, &why, t("2026-01-01T00:00:12Z"));
        assert!(
            matches!(&v, Verdict::Waiting { retry, detail } if *retry == Duration::from_millis(1250) && detail.contains("3s")),
            "{v:?}"
        );
        let v = judge(2, &["h2"], &a, &why, t("2026-01-01T00:00:13.300Z"));
        assert!(matches!(v, Verdict::Waiting { .. }), "{v:?}");
        let Verdict::Enforced(e) = judge(2, &["h2"], &a, &why, t("2026-01-01T00:00:14Z")) else {
            panic!("enforced after the settle time")
        };
        assert_eq!(e.evidence, EVIDENCE_SETTLE_TIME);
        assert_eq!(e.since, "2026-01-01T00:00:14Z");
        assert!(evidence_sentence(&e).contains("no existing namespace is selected"));
    }

    #[test]
    fn the_namespace_list_loading_is_waited_for_never_taken_as_nothing_to_probe() {
        let a = awaiting("2026-01-01T00:00:00Z");
        let v = judge(
            2,
            &["h2"],
            &a,
            &Sighting::NamespacesUnknown,
            t("2026-01-01T00:01:00Z"),
        );
        assert!(matches!(v, Verdict::Waiting { .. }), "{v:?}");
    }

    #[test]
    fn retries_come_every_200_ms_for_2_s_then_back_off_to_2_s() {
        let mut a = awaiting("2026-01-01T00:00:00Z");
        let s = pod(None, "2026-01-01T00:00:00Z");
        let mut seen = Vec::new();
        for looks in 8..16 {
            a.looks = looks;
            seen.push(judge(2, &["h2"], &a, &s, t("2026-01-01T00:00:01Z")).retry());
        }
        let ms: Vec<u128> = seen.into_iter().flatten().map(|d| d.as_millis()).collect();
        assert_eq!(ms, [200, 200, 400, 800, 1600, 2000, 2000, 2000]);
    }

    fn computed(message: &str) -> InjectionPolicyStatus {
        InjectionPolicyStatus {
            observed_generation: Some(2),
            conditions: vec![ready("True", 2, message)],
            ..Default::default()
        }
    }

    fn ready_of(s: &InjectionPolicyStatus) -> &Condition {
        s.conditions
            .iter()
            .find(|c| c.type_ == condition::READY)
            .expect("Ready")
    }

    #[test]
    fn a_new_policy_without_evidence_is_not_ready_and_says_what_it_waits_for() {
        let mut s = computed("Pods are injected.");
        let v = Verdict::Waiting {
            detail: "a dry-run pod came back without the injection".into(),
            retry: FIRST_RETRY,
        };
        gate(
            &mut s,
            None,
            Some(2),
            &Known::Judged(v),
            t("2026-01-01T00:00:05Z"),
        );
        let r = ready_of(&s);
        assert_eq!(
            (r.status.as_str(), r.reason.as_str()),
            ("False", REASON_AWAITING)
        );
        assert!(r.message.contains("without the injection"), "{}", r.message);
        assert_eq!(r.observed_generation, Some(2));
        assert_eq!(s.enforcement, None);
    }

    #[test]
    fn a_change_keeps_ready_true_for_the_generation_still_enforced_until_the_new_one_is() {
        let before = InjectionPolicyStatus {
            observed_generation: Some(1),
            conditions: vec![ready("True", 1, "Pods are injected.")],
            enforcement: Some(EnforcementStatus {
                observed_generation: 1,
                evidence: EVIDENCE_PROBE.into(),
                namespace: Some("apps".into()),
                since: "2026-01-01T00:00:00Z".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut s = computed("Pods are injected.");
        let v = Verdict::Waiting {
            detail: "not yet".into(),
            retry: FIRST_RETRY,
        };
        gate(
            &mut s,
            Some(&before),
            Some(2),
            &Known::Judged(v),
            t("2026-01-01T00:00:05Z"),
        );
        let r = ready_of(&s);
        assert_eq!(r.status, "True");
        assert_eq!(r.observed_generation, Some(1), "kubectl wait keeps waiting");
        assert_eq!(r.last_transition_time.0, t("2026-01-01T00:00:00Z"));
        assert!(
            r.message.contains("Generation 1 stays in force"),
            "{}",
            r.message
        );
        assert_eq!(s.enforcement, before.enforcement);

        // Evidence for generation 2: Ready reports it, without a transition.
        let e = EnforcementStatus {
            observed_generation: 2,
            evidence: EVIDENCE_PROBE.into(),
            namespace: Some("apps".into()),
            since: "2026-01-01T00:00:06Z".into(),
            ..Default::default()
        };
        let mut s = computed("Pods are injected.");
        gate(
            &mut s,
            Some(&before),
            Some(2),
            &Known::Judged(Verdict::Enforced(e.clone())),
            t("2026-01-01T00:00:06Z"),
        );
        let r = ready_of(&s);
        assert_eq!(
            (r.status.as_str(), r.observed_generation),
            ("True", Some(2))
        );
        assert!(r.message.ends_with(&evidence_sentence(&e)), "{}", r.message);
        assert_eq!(s.enforcement, Some(e.clone()));

        // Recorded evidence words the message the same way, so a steady state writes nothing.
        let mut again = computed("Pods are injected.");
        gate(
            &mut again,
            Some(&s),
            Some(2),
            &Known::Recorded(e.clone()),
            t("2026-01-01T00:09:00Z"),
        );
        assert_eq!(again, s);
    }

    #[test]
    fn evidence_against_turns_even_an_earlier_true_ready_false() {
        let before = InjectionPolicyStatus {
            conditions: vec![ready("True", 1, "x")],
            ..Default::default()
        };
        let mut s = computed("Pods are injected.");
        let v = Verdict::NotEnforced {
            detail: "refused".into(),
            retry: NOT_ENFORCED_RETRY,
        };
        gate(
            &mut s,
            Some(&before),
            Some(2),
            &Known::Judged(v),
            t("2026-01-01T00:00:40Z"),
        );
        let r = ready_of(&s);
        assert_eq!(
            (r.status.as_str(), r.reason.as_str()),
            ("False", REASON_NOT_ENFORCED)
        );
        assert_eq!(r.observed_generation, Some(2));
    }

    #[test]
    fn a_ready_that_is_false_anyway_drops_the_evidence_and_is_left_alone() {
        let mut s = InjectionPolicyStatus {
            conditions: vec![ready("False", 2, "paused")],
            enforcement: Some(EnforcementStatus::default()),
            ..Default::default()
        };
        let before = s.conditions.clone();
        gate(
            &mut s,
            None,
            Some(2),
            &Known::NotApplicable,
            t("2026-01-01T00:00:00Z"),
        );
        assert_eq!(s.conditions, before);
        assert_eq!(s.enforcement, None);
    }
}
