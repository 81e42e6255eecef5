//! The controller's metrics: reconciles, certificate expiry, leadership, the availability guard,
//! coverage and the admission probe. Registered into the same `prometheus-client` registry as the
//! admission metrics (`splice_server::metrics`), which the admin server exports.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use splice_server::metrics::Registry;

/// Upper bounds (seconds) of `splice_reconcile_duration_seconds`; a reconcile makes API calls.
pub const RECONCILE_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

/// Upper bounds (seconds) of `splice_probe_duration_seconds`: a dry-run create through the API
/// server, webhooks included, up to the 30 s maximum webhook timeout.
pub const PROBE_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Upper bounds (seconds) of `splice_identity_issuance_duration_seconds`: from a request's
/// creation (whole seconds) to the signer's answer, a tick of one second and a few API calls.
pub const IDENTITY_BUCKETS: [f64; 10] = [0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0];

/// The `state` label values of `splice_coverage_pods`, in the order `set_coverage` takes them.
pub const COVERAGE_STATES: [&str; 4] = ["matched", "current", "outdated", "missed"];

/// The `state` label values of `splice_rollout_workloads`, in the order `set_rollout` takes them;
/// `halted` is 1 while the policy's rollout is halted (the alert reads it), else 0.
pub const ROLLOUT_STATES: [&str; 6] = [
    "outdated",
    "restarting",
    "done",
    "failed",
    "manual",
    "halted",
];

/// Sets one gauge per (policy, state) and drops the series of policies no longer in `counts`;
/// `exported` remembers which policies are.
fn replace_per_policy<const N: usize>(
    family: &Family<PolicyState, Gauge>,
    exported: &Mutex<HashSet<String>>,
    states: &[&'static str; N],
    counts: HashMap<String, [i64; N]>,
) {
    let mut exported = exported.lock().unwrap_or_else(|e| e.into_inner());
    for gone in exported.iter().filter(|p| !counts.contains_key(*p)) {
        for &state in states {
            family.remove(&PolicyState {
                policy: gone.clone(),
                state,
            });
        }
    }
    for (policy, values) in &counts {
        for (&state, n) in states.iter().zip(values) {
            family
                .get_or_create(&PolicyState {
                    policy: policy.clone(),
                    state,
                })
                .set(*n);
        }
    }
    *exported = counts.into_keys().collect();
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertLabel {
    cert: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgeLabel {
    over_30s: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyState {
    policy: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyResult {
    policy: String,
    result: String,
}

/// The controller's metrics. Cheap to share (`Arc<Metrics>`); every method takes `&self`.
#[derive(Debug)]
pub struct Metrics {
    reconcile: Family<ResultLabel, Counter>,
    reconcile_duration: Histogram,
    certificate_expiry: Family<CertLabel, Gauge>,
    /// 1 while this replica holds the leader Lease. Every replica exports it, so `max` over the
    /// replicas says whether anyone leads (the "no leader" alert).
    leader: Gauge,
    availability_guard: Family<ReasonLabel, Gauge>,
    /// The guard state last set to 1 (all others are 0).
    guard_state: Mutex<Option<String>>,
    coverage: Family<PolicyState, Gauge>,
    /// Policies whose coverage is exported now, so that a policy gone from a pass is dropped.
    covered: Mutex<HashSet<String>>,
    probe_duration: Family<PolicyLabel, Histogram, fn() -> Histogram>,
    probe: Family<PolicyResult, Counter>,
    rollout: Family<PolicyState, Gauge>,
    /// Policies whose rollout is exported now.
    rolling: Mutex<HashSet<String>>,
    values_problem: Family<PolicyLabel, Gauge>,
    pod_certificates_unavailable: Family<PolicyLabel, Gauge>,
    not_enforced: Family<PolicyLabel, Gauge>,
    identity_requests: Family<OutcomeLabel, Counter>,
    identity_latency: Histogram,
    identity_pending: Family<AgeLabel, Gauge>,
    identity_available: Gauge,
}

impl Default for Metrics {
    /// Metrics in no registry: they count but nobody exports them (tests).
    fn default() -> Self {
        Self::register(&mut Registry::default())
    }
}

impl Metrics {
    /// Metrics in no registry; see [`Metrics::register`] for exported ones.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the controller's metric families in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Metrics {
            reconcile: Family::default(),
            reconcile_duration: Histogram::new(RECONCILE_BUCKETS.iter().copied()),
            certificate_expiry: Family::default(),
            leader: Gauge::default(),
            availability_guard: Family::default(),
            guard_state: Mutex::new(None),
            coverage: Family::default(),
            covered: Mutex::new(HashSet::new()),
            probe_duration: Family::new_with_constructor(|| {
                Histogram::new(PROBE_BUCKETS.iter().copied())
            }),
            probe: Family::default(),
            rollout: Family::default(),
            rolling: Mutex::new(HashSet::new()),
            values_problem: Family::default(),
            pod_certificates_unavailable: Family::default(),
            not_enforced: Family::default(),
            identity_requests: Family::default(),
            identity_latency: Histogram::new(IDENTITY_BUCKETS.iter().copied()),
            identity_pending: Family::default(),
            identity_available: Gauge::default(),
        };
        // The library appends the final full stop of each HELP text.
        registry.register(
            "splice_reconcile",
            "Reconciles of InjectionPolicy objects, by result",
            metrics.reconcile.clone(),
        );
        registry.register(
            "splice_reconcile_duration_seconds",
            "Duration of one reconcile",
            metrics.reconcile_duration.clone(),
        );
        registry.register(
            "splice_certificate_expiry_timestamp_seconds",
            "When each certificate Splice serves or signs with expires (Unix seconds)",
            metrics.certificate_expiry.clone(),
        );
        registry.register(
            "splice_leader",
            "1 while this replica holds the leader Lease, else 0",
            metrics.leader.clone(),
        );
        registry.register(
            "splice_availability_guard",
            "1 for the availability guard's current state: available (Fail may be in force) or the reason it is not",
            metrics.availability_guard.clone(),
        );
        registry.register(
            "splice_coverage_pods",
            "Pods a policy selects, by state: matched, injected with the current or an outdated template, and missed (matched but not injected)",
            metrics.coverage.clone(),
        );
        registry.register(
            "splice_probe_duration_seconds",
            "Round trip of the admission probe's dry-run create through the API server, webhooks included, by policy",
            metrics.probe_duration.clone(),
        );
        registry.register(
            "splice_probe",
            "Admission probes, by policy and result (the Verified condition's reason)",
            metrics.probe.clone(),
        );
        registry.register(
            "splice_rollout_workloads",
            "Workloads of a policy's rollout (spec.rollout), by state: outdated (waiting), restarting, done, failed; manual counts pods no restart replaces; halted is 1 while the rollout is halted",
            metrics.rollout.clone(),
        );
        registry.register(
            "splice_values_source_problem",
            "1 while a policy's spec.valuesFrom cannot be rendered (a source missing, outside the allowed namespaces, or data a template cannot render); the last good rendering keeps serving",
            metrics.values_problem.clone(),
        );
        registry.register(
            "splice_policy_pod_certificates_unavailable",
            "1 while a policy has spec.identity and the API server does not serve PodCertificateRequests (Ready PodCertificatesUnavailable), else 0",
            metrics.pod_certificates_unavailable.clone(),
        );
        registry.register(
            "splice_policy_not_enforced",
            "1 while the API server is not seen enforcing a served policy's generation (Ready AwaitingEnforcement or NotEnforced), else 0",
            metrics.not_enforced.clone(),
        );
        registry.register(
            "splice_identity_requests",
            "PodCertificateRequests for the splice.dev/identity signer answered by this replica, by outcome: issued, denied, failed",
            metrics.identity_requests.clone(),
        );
        registry.register(
            "splice_identity_issuance_duration_seconds",
            "From a PodCertificateRequest's creation to the signer's answer",
            metrics.identity_latency.clone(),
        );
        registry.register(
            "splice_identity_pending_requests",
            "PodCertificateRequests for the splice.dev/identity signer not answered yet, by whether they are older than 30 s",
            metrics.identity_pending.clone(),
        );
        registry.register(
            "splice_identity_signer_available",
            "1 while the leader runs the splice.dev/identity signer; 0 when the API server does not serve podcertificaterequests",
            metrics.identity_available.clone(),
        );
        // Every outcome exported from the start, so a rate and its alert see 0, not nothing.
        for outcome in ["issued", "denied", "failed"] {
            let _ = metrics
                .identity_requests
                .get_or_create(&OutcomeLabel { outcome });
        }
        metrics
    }

    /// Counts one answered identity request (`issued`, `denied`, `failed`) and how long after its
    /// creation it was answered.
    pub fn observe_identity(&self, outcome: &'static str, latency: Option<Duration>) {
        self.identity_requests
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
        if let Some(latency) = latency {
            self.identity_latency.observe(latency.as_secs_f64());
        }
    }

    /// Records the identity requests not answered yet: `young` at most 30 s old, `old` older.
    pub fn set_identity_pending(&self, young: i64, old: i64) {
        for (over_30s, n) in [("false", young), ("true", old)] {
            self.identity_pending
                .get_or_create(&AgeLabel { over_30s })
                .set(n);
        }
    }

    /// Records whether the identity signer runs (the API server serves podcertificaterequests).
    pub fn set_identity_available(&self, available: bool) {
        self.identity_available.set(i64::from(available));
    }

    /// Records whether `policy`'s `valuesFrom` can be rendered now (Ready's SourceMissing and
    /// kin).
    pub fn set_values_problem(&self, policy: &str, problem: bool) {
        self.values_problem
            .get_or_create(&PolicyLabel {
                policy: policy.to_owned(),
            })
            .set(i64::from(problem));
    }

    /// Records whether `policy` gives pods an identity the API server cannot serve.
    pub fn set_pod_certificates_unavailable(&self, policy: &str, unavailable: bool) {
        self.pod_certificates_unavailable
            .get_or_create(&PolicyLabel {
                policy: policy.to_owned(),
            })
            .set(i64::from(unavailable));
    }

    /// Records whether the API server is not (yet) seen enforcing `policy`'s generation.
    pub fn set_not_enforced(&self, policy: &str, not_enforced: bool) {
        self.not_enforced
            .get_or_create(&PolicyLabel {
                policy: policy.to_owned(),
            })
            .set(i64::from(not_enforced));
    }

    /// Records whether this replica leads now.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Replaces every policy's coverage gauges (counts in [`COVERAGE_STATES`] order); policies
    /// not in `counts` stop being exported. Called by the controller once per coverage pass.
    pub fn set_coverage(&self, counts: HashMap<String, [i64; 4]>) {
        replace_per_policy(&self.coverage, &self.covered, &COVERAGE_STATES, counts);
    }

    /// Replaces every policy's rollout gauges (counts in [`ROLLOUT_STATES`] order); policies
    /// not in `counts` stop being exported. Called once per rollout pass.
    pub fn set_rollout(&self, counts: HashMap<String, [i64; 6]>) {
        replace_per_policy(&self.rollout, &self.rolling, &ROLLOUT_STATES, counts);
    }

    /// Counts one admission probe of `policy` with `result` (a bounded set: the Verified
    /// condition's reasons) and, when the injected probe got an answer, its round trip.
    pub fn observe_probe(&self, policy: &str, result: &str, round_trip: Option<Duration>) {
        let label = PolicyLabel {
            policy: policy.to_owned(),
        };
        // The histogram shows from the first probe, answered or not.
        let duration = self.probe_duration.get_or_create(&label);
        self.probe
            .get_or_create(&PolicyResult {
                policy: label.policy.clone(),
                result: result.to_owned(),
            })
            .inc();
        if let Some(elapsed) = round_trip {
            duration.observe(elapsed.as_secs_f64());
        }
    }

    /// Counts one reconcile with `result` (e.g. `success`, `error`) and its duration.
    pub fn observe_reconcile(&self, result: &str, elapsed: Duration) {
        self.reconcile
            .get_or_create(&ResultLabel {
                result: result.to_owned(),
            })
            .inc();
        self.reconcile_duration.observe(elapsed.as_secs_f64());
    }

    /// Records when the certificate `cert` (e.g. `ca`, `serving`) expires, as Unix seconds.
    pub fn set_certificate_expiry(&self, cert: &str, not_after_unix_seconds: i64) {
        self.certificate_expiry
            .get_or_create(&CertLabel {
                cert: cert.to_owned(),
            })
            .set(not_after_unix_seconds);
    }

    /// Records the availability guard's current state (`available` or why `Fail` is not in
    /// force): that label is 1, every label seen before is 0.
    pub fn set_availability_guard(&self, reason: &str) {
        let mut state = self.guard_state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(previous) = state.take() {
            self.availability_guard
                .get_or_create(&ReasonLabel { reason: previous })
                .set(0);
        }
        self.availability_guard
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .set(1);
        *state = Some(reason.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use splice_server::metrics::render;

    fn sample(text: &str, series: &str) -> Option<String> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
    }

    fn registered() -> (Metrics, Registry) {
        let mut registry = Registry::default();
        (Metrics::register(&mut registry), registry)
    }

    #[test]
    fn the_availability_guard_gauge_marks_only_the_current_state() {
        let (metrics, registry) = registered();
        metrics.set_availability_guard("insufficient_replicas");
        metrics.set_availability_guard("available");
        let text = render(&registry);
        let value = |reason: &str| {
            sample(
                &text,
                &format!(r#"splice_availability_guard{{reason="{reason}"}}"#),
            )
        };
        assert_eq!(value("available").as_deref(), Some("1"));
        assert_eq!(value("insufficient_replicas").as_deref(), Some("0"));
    }

    #[test]
    fn the_leader_gauge_is_zero_until_the_replica_leads_and_again_after_it_stops() {
        let (metrics, registry) = registered();
        let value = || sample(&render(&registry), "splice_leader");
        assert_eq!(value().as_deref(), Some("0"));
        metrics.set_leader(true);
        assert_eq!(value().as_deref(), Some("1"));
        metrics.set_leader(false);
        assert_eq!(value().as_deref(), Some("0"));
    }

    #[test]
    fn reconcile_and_certificate_metrics_are_exported() {
        let (metrics, registry) = registered();
        metrics.observe_reconcile("success", Duration::from_millis(3));
        metrics.observe_reconcile("success", Duration::from_millis(3));
        metrics.observe_reconcile("error", Duration::from_millis(30));
        metrics.set_certificate_expiry("serving", 1_900_000_000);
        metrics.set_certificate_expiry("serving", 1_900_000_100);
        let text = render(&registry);
        assert_eq!(
            sample(&text, r#"splice_reconcile_total{result="success"}"#).as_deref(),
            Some("2")
        );
        assert_eq!(
            sample(&text, r#"splice_reconcile_total{result="error"}"#).as_deref(),
            Some("1")
        );
        assert_eq!(
            sample(&text, "splice_reconcile_duration_seconds_count").as_deref(),
            Some("3")
        );
        assert_eq!(
            sample(
                &text,
                r#"splice_certificate_expiry_timestamp_seconds{cert="serving"}"#
            )
            .as_deref(),
            Some("1900000100")
        );
    }

    #[test]
    fn each_probe_is_counted_by_policy_and_result_and_its_round_trip_observed() {
        let (metrics, registry) = registered();
        metrics.observe_probe("mesh", "Verified", Some(Duration::from_millis(20)));
        metrics.observe_probe("mesh", "Verified", Some(Duration::from_millis(40)));
        metrics.observe_probe("mesh", "ProbeFailed", None);
        let text = render(&registry);
        let value = |series: &str| sample(&text, series);
        assert_eq!(
            value(r#"splice_probe_total{policy="mesh",result="Verified"}"#).as_deref(),
            Some("2")
        );
        assert_eq!(
            value(r#"splice_probe_total{policy="mesh",result="ProbeFailed"}"#).as_deref(),
            Some("1")
        );
        assert_eq!(
            value(r#"splice_probe_duration_seconds_bucket{policy="mesh",le="0.025"}"#).as_deref(),
            Some("1")
        );
        assert_eq!(
            value(r#"splice_probe_duration_seconds_count{policy="mesh"}"#).as_deref(),
            Some("2")
        );
    }

    #[test]
    fn a_policy_missing_from_a_coverage_pass_stops_being_exported() {
        let (metrics, registry) = registered();
        metrics.set_coverage(HashMap::from([
            ("a".to_owned(), [3, 2, 1, 0]),
            ("b".to_owned(), [1, 1, 0, 0]),
        ]));
        metrics.set_coverage(HashMap::from([("a".to_owned(), [4, 4, 0, 0])]));
        let text = render(&registry);
        assert_eq!(
            sample(&text, r#"splice_coverage_pods{policy="a",state="matched"}"#).as_deref(),
            Some("4")
        );
        assert!(!text.contains(r#"policy="b""#), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let (metrics, registry) = registered();
        metrics.set_certificate_expiry("a\"b\\c\nd", 1);
        assert!(
            render(&registry)
                .contains(r#"splice_certificate_expiry_timestamp_seconds{cert="a\"b\\c\nd"} 1"#)
        );
    }
}
