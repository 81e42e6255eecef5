//! Every Prometheus metric Splice exports, in one registry shared by the webhook and the operator.
//!
//! Hand-rolled rather than built on a client library so that the request path only ever touches
//! atomics: label sets are resolved through an [`ArcSwap`]-backed map (a lock-free read; a copy on
//! the rare first use of a label value) and the histogram buckets are plain atomic counters.
//! Exposition is the Prometheus text format 0.0.4.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;

use splice_engine::SkipReason;

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds (seconds) of `splice_admission_duration_seconds`: from 100 µs, because a warm
/// injection takes tens of microseconds, to the API server's 30 s maximum webhook timeout.
pub const ADMISSION_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 30.0,
];

/// Upper bounds (seconds) of `splice_reconcile_duration_seconds`; a reconcile makes API calls.
pub const RECONCILE_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

/// Upper bounds (seconds) of `splice_probe_duration_seconds`: a dry-run create through the API
/// server, webhooks included, up to the 30 s maximum webhook timeout.
pub const PROBE_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// How one admission request ended: the `outcome` label of `splice_admission_requests_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A non-empty patch was returned.
    Injected,
    /// The policy applied but the pod already carried the current injection.
    Unchanged,
    /// The policy did not apply (see `splice_injection_skipped_total`).
    Skipped,
    /// The engine failed; the API server applies the webhook's failure policy.
    Error,
    /// The request was malformed (4xx).
    BadRequest,
    /// The path named a policy this replica does not know.
    UnknownPolicy,
    /// Answered by the benchmark-only null handler.
    Null,
    /// A policy the validating webhook admitted.
    Allowed,
    /// A policy the validating webhook refused.
    Denied,
}

impl Outcome {
    const ALL: [Outcome; 9] = [
        Outcome::Injected,
        Outcome::Unchanged,
        Outcome::Skipped,
        Outcome::Error,
        Outcome::BadRequest,
        Outcome::UnknownPolicy,
        Outcome::Null,
        Outcome::Allowed,
        Outcome::Denied,
    ];

    /// Stable label value.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Injected => "injected",
            Outcome::Unchanged => "unchanged",
            Outcome::Skipped => "skipped",
            Outcome::Error => "error",
            Outcome::BadRequest => "bad_request",
            Outcome::UnknownPolicy => "unknown_policy",
            Outcome::Null => "null",
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

// Exhaustive on purpose: a new skip reason in the engine must be given a slot here.
const SKIP_REASONS: [SkipReason; 6] = [
    SkipReason::ExcludedNamespace,
    SkipReason::OptedOut,
    SkipReason::NamespaceNotSelected,
    SkipReason::ObjectNotSelected,
    SkipReason::OperationNotConfigured,
    SkipReason::NotAPod,
];

fn skip_index(reason: SkipReason) -> usize {
    match reason {
        SkipReason::ExcludedNamespace => 0,
        SkipReason::OptedOut => 1,
        SkipReason::NamespaceNotSelected => 2,
        SkipReason::ObjectNotSelected => 3,
        SkipReason::OperationNotConfigured => 4,
        SkipReason::NotAPod => 5,
    }
}

/// A cumulative histogram whose observations are two relaxed atomic adds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    bounds_nanos: Vec<u64>,
    /// Per-bucket (non-cumulative) counts; the last slot is `+Inf`.
    buckets: Vec<AtomicU64>,
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        let bounds_nanos = bounds.iter().map(|b| (b * 1e9).round() as u64).collect();
        let buckets = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Histogram {
            bounds,
            bounds_nanos,
            buckets,
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let slot = self.bounds_nanos.partition_point(|&bound| bound < nanos);
        if let Some(bucket) = self.buckets.get(slot) {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Total number of observations.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, labels: &[(&str, &str)]) {
        let mut cumulative = 0u64;
        for (i, bucket) in self.buckets.iter().enumerate() {
            cumulative += bucket.load(Ordering::Relaxed);
            let le = match self.bounds.get(i) {
                Some(bound) => format_float(*bound),
                None => "+Inf".to_owned(),
            };
            let mut with_le: Vec<(&str, &str)> = labels.to_vec();
            with_le.push(("le", &le));
            sample(out, &format!("{name}_bucket"), &with_le, cumulative);
        }
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        sample(out, &format!("{name}_sum"), labels, format_float(sum));
        // Derived from the buckets so that `_count` always equals the `+Inf` bucket.
        sample(out, &format!("{name}_count"), labels, cumulative);
    }
}

/// The admission metrics of one policy; resolved once per request, then only atomics.
#[derive(Debug)]
pub struct AdmissionMetrics {
    requests: [AtomicU64; Outcome::ALL.len()],
    duration: Histogram,
    injections: AtomicU64,
    skipped: [AtomicU64; SKIP_REASONS.len()],
}

impl AdmissionMetrics {
    fn new() -> Self {
        AdmissionMetrics {
            requests: Default::default(),
            duration: Histogram::new(&ADMISSION_BUCKETS),
            injections: AtomicU64::new(0),
            skipped: Default::default(),
        }
    }

    /// Counts one request and its duration.
    pub fn observe(&self, outcome: Outcome, elapsed: Duration) {
        if let Some(counter) = self.requests.get(outcome.index()) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        self.duration.observe(elapsed);
    }

    /// Counts a pod that will run with an injection (dry runs are not counted).
    pub fn injected(&self) {
        self.injections.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a pod the policy did not apply to.
    pub fn skipped(&self, reason: SkipReason) {
        if let Some(counter) = self.skipped.get(skip_index(reason)) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Requests counted with `outcome` so far.
    pub fn requests(&self, outcome: Outcome) -> u64 {
        self.requests
            .get(outcome.index())
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Pods injected so far.
    pub fn injections(&self) -> u64 {
        self.injections.load(Ordering::Relaxed)
    }

    /// Pods skipped for `reason` so far.
    pub fn skips(&self, reason: SkipReason) -> u64 {
        self.skipped
            .get(skip_index(reason))
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// The duration histogram.
    pub fn duration(&self) -> &Histogram {
        &self.duration
    }
}

/// The admission probe's metrics of one policy.
#[derive(Debug)]
struct ProbeMetrics {
    duration: Histogram,
    /// By result (the Verified condition's reason, or `error`).
    results: LabelMap<AtomicU64>,
}

/// A map from label value to metric whose reads are lock-free; a new label value copies the map,
/// which only happens the first time a policy, a reconcile result or a certificate is seen.
#[derive(Debug)]
struct LabelMap<V> {
    entries: ArcSwap<HashMap<String, Arc<V>>>,
}

impl<V> LabelMap<V> {
    fn new() -> Self {
        LabelMap {
            entries: ArcSwap::from_pointee(HashMap::new()),
        }
    }

    fn get_or_create(&self, key: &str, create: impl Fn() -> V) -> Arc<V> {
        if let Some(found) = self.entries.load().get(key) {
            return Arc::clone(found);
        }
        let fresh = Arc::new(create());
        let mut chosen = Arc::clone(&fresh);
        self.entries.rcu(|current| {
            let mut next = HashMap::clone(current);
            chosen = Arc::clone(
                next.entry(key.to_owned())
                    .or_insert_with(|| Arc::clone(&fresh)),
            );
            next
        });
        chosen
    }

    fn get(&self, key: &str) -> Option<Arc<V>> {
        self.entries.load().get(key).cloned()
    }

    fn sorted(&self) -> Vec<(String, Arc<V>)> {
        let mut all: Vec<(String, Arc<V>)> = self
            .entries
            .load()
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

/// The registry. Cheap to share (`Arc<Metrics>`); every method takes `&self`.
#[derive(Debug)]
pub struct Metrics {
    admission: LabelMap<AdmissionMetrics>,
    reconcile: LabelMap<AtomicU64>,
    reconcile_duration: Histogram,
    certificate_expiry: LabelMap<AtomicI64>,
    availability_guard: LabelMap<AtomicI64>,
    /// Per policy: matched, current, outdated, missed pods (see `set_coverage`).
    coverage: ArcSwap<HashMap<String, [i64; 4]>>,
    probe: LabelMap<ProbeMetrics>,
    /// 1 while this replica holds the leader Lease. Every replica exports it, so `max` over the
    /// replicas says whether anyone leads (the "no leader" alert).
    leader: AtomicI64,
}

/// The `state` label values of `splice_coverage_pods`, in the order `set_coverage` takes them.
pub const COVERAGE_STATES: [&str; 4] = ["matched", "current", "outdated", "missed"];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Metrics {
            admission: LabelMap::new(),
            reconcile: LabelMap::new(),
            reconcile_duration: Histogram::new(&RECONCILE_BUCKETS),
            certificate_expiry: LabelMap::new(),
            availability_guard: LabelMap::new(),
            coverage: ArcSwap::from_pointee(HashMap::new()),
            probe: LabelMap::new(),
            leader: AtomicI64::new(0),
        }
    }

    /// Records whether this replica leads now.
    pub fn set_leader(&self, leading: bool) {
        self.leader.store(i64::from(leading), Ordering::Relaxed);
    }

    /// Replaces every policy's coverage gauges (counts in [`COVERAGE_STATES`] order); policies
    /// not in `counts` stop being exported. Called by the controller once per coverage pass.
    pub fn set_coverage(&self, counts: HashMap<String, [i64; 4]>) {
        self.coverage.store(Arc::new(counts));
    }

    /// Counts one admission probe of `policy` with `result` (a bounded set: the Verified
    /// condition's reasons) and, when the injected probe got an answer, its round trip.
    pub fn observe_probe(&self, policy: &str, result: &str, round_trip: Option<Duration>) {
        let m = self.probe.get_or_create(policy, || ProbeMetrics {
            duration: Histogram::new(&PROBE_BUCKETS),
            results: LabelMap::new(),
        });
        m.results
            .get_or_create(result, || AtomicU64::new(0))
            .fetch_add(1, Ordering::Relaxed);
        if let Some(elapsed) = round_trip {
            m.duration.observe(elapsed);
        }
    }

    /// The admission metrics for `policy`, created on first use. Callers must pass bounded label
    /// values only (names of loaded policies or fixed placeholders), never raw request input.
    pub fn admission(&self, policy: &str) -> Arc<AdmissionMetrics> {
        self.admission.get_or_create(policy, AdmissionMetrics::new)
    }

    /// The admission metrics for `policy` if any request was counted for it.
    pub fn admission_if_seen(&self, policy: &str) -> Option<Arc<AdmissionMetrics>> {
        self.admission.get(policy)
    }

    /// Counts one reconcile with `result` (e.g. `success`, `error`) and its duration.
    pub fn observe_reconcile(&self, result: &str, elapsed: Duration) {
        self.reconcile
            .get_or_create(result, || AtomicU64::new(0))
            .fetch_add(1, Ordering::Relaxed);
        self.reconcile_duration.observe(elapsed);
    }

    /// Records when the certificate `cert` (e.g. `ca`, `serving`) expires, as Unix seconds.
    pub fn set_certificate_expiry(&self, cert: &str, not_after_unix_seconds: i64) {
        self.certificate_expiry
            .get_or_create(cert, || AtomicI64::new(0))
            .store(not_after_unix_seconds, Ordering::Relaxed);
    }

    /// Records the availability guard's current state (`available` or why `Fail` is not in
    /// force): that label is 1, every label seen before is 0.
    pub fn set_availability_guard(&self, reason: &str) {
        self.availability_guard
            .get_or_create(reason, || AtomicI64::new(0));
        for (label, value) in self.availability_guard.sorted() {
            value.store(i64::from(label == reason), Ordering::Relaxed);
        }
    }

    /// The expiry last recorded for `cert`, if any.
    pub fn certificate_expiry(&self, cert: &str) -> Option<i64> {
        self.certificate_expiry
            .get(cert)
            .map(|at| at.load(Ordering::Relaxed))
    }

    /// The whole registry in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let admission = self.admission.sorted();

        header(
            &mut out,
            "splice_admission_requests_total",
            "counter",
            "Admission requests answered, by policy and outcome.",
        );
        for (policy, m) in &admission {
            for outcome in Outcome::ALL {
                let n = m.requests(outcome);
                if n > 0 {
                    let labels = [("policy", policy.as_str()), ("outcome", outcome.label())];
                    sample(&mut out, "splice_admission_requests_total", &labels, n);
                }
            }
        }

        header(
            &mut out,
            "splice_admission_duration_seconds",
            "histogram",
            "Time from request headers to response, by policy.",
        );
        for (policy, m) in &admission {
            m.duration.render(
                &mut out,
                "splice_admission_duration_seconds",
                &[("policy", policy.as_str())],
            );
        }

        header(
            &mut out,
            "splice_injections_total",
            "counter",
            "Pods admitted with a non-empty injection patch (dry runs excluded), by policy.",
        );
        for (policy, m) in &admission {
            let n = m.injections();
            if n > 0 {
                sample(
                    &mut out,
                    "splice_injections_total",
                    &[("policy", policy.as_str())],
                    n,
                );
            }
        }

        header(
            &mut out,
            "splice_injection_skipped_total",
            "counter",
            "Pods a policy did not apply to, by policy and reason.",
        );
        for (policy, m) in &admission {
            for reason in SKIP_REASONS {
                let n = m.skips(reason);
                if n > 0 {
                    let labels = [("policy", policy.as_str()), ("reason", reason.label())];
                    sample(&mut out, "splice_injection_skipped_total", &labels, n);
                }
            }
        }

        header(
            &mut out,
            "splice_reconcile_total",
            "counter",
            "Reconciles of InjectionPolicy objects, by result.",
        );
        for (result, n) in self.reconcile.sorted() {
            sample(
                &mut out,
                "splice_reconcile_total",
                &[("result", result.as_str())],
                n.load(Ordering::Relaxed),
            );
        }

        header(
            &mut out,
            "splice_reconcile_duration_seconds",
            "histogram",
            "Duration of one reconcile.",
        );
        self.reconcile_duration
            .render(&mut out, "splice_reconcile_duration_seconds", &[]);

        header(
            &mut out,
            "splice_certificate_expiry_timestamp_seconds",
            "gauge",
            "When each certificate Splice serves or signs with expires (Unix seconds).",
        );
        for (cert, at) in self.certificate_expiry.sorted() {
            sample(
                &mut out,
                "splice_certificate_expiry_timestamp_seconds",
                &[("cert", cert.as_str())],
                at.load(Ordering::Relaxed),
            );
        }

        header(
            &mut out,
            "splice_leader",
            "gauge",
            "1 while this replica holds the leader Lease, else 0.",
        );
        sample(
            &mut out,
            "splice_leader",
            &[],
            self.leader.load(Ordering::Relaxed),
        );

        header(
            &mut out,
            "splice_availability_guard",
            "gauge",
            "1 for the availability guard's current state: available (Fail may be in force) or the reason it is not.",
        );
        for (reason, on) in self.availability_guard.sorted() {
            sample(
                &mut out,
                "splice_availability_guard",
                &[("reason", reason.as_str())],
                on.load(Ordering::Relaxed),
            );
        }

        header(
            &mut out,
            "splice_coverage_pods",
            "gauge",
            "Pods a policy selects, by state: matched, injected with the current or an outdated template, and missed (matched but not injected).",
        );
        let coverage = self.coverage.load();
        let mut policies: Vec<&String> = coverage.keys().collect();
        policies.sort();
        for policy in policies {
            let counts = coverage.get(policy).copied().unwrap_or_default();
            for (state, n) in COVERAGE_STATES.iter().zip(counts) {
                sample(
                    &mut out,
                    "splice_coverage_pods",
                    &[("policy", policy.as_str()), ("state", state)],
                    n,
                );
            }
        }

        let probes = self.probe.sorted();
        header(
            &mut out,
            "splice_probe_duration_seconds",
            "histogram",
            "Round trip of the admission probe's dry-run create through the API server, webhooks included, by policy.",
        );
        for (policy, m) in &probes {
            m.duration.render(
                &mut out,
                "splice_probe_duration_seconds",
                &[("policy", policy.as_str())],
            );
        }
        header(
            &mut out,
            "splice_probe_total",
            "counter",
            "Admission probes, by policy and result (the Verified condition's reason).",
        );
        for (policy, m) in &probes {
            for (result, n) in m.results.sorted() {
                let labels = [("policy", policy.as_str()), ("result", result.as_str())];
                sample(
                    &mut out,
                    "splice_probe_total",
                    &labels,
                    n.load(Ordering::Relaxed),
                );
            }
        }
        out
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (key, value)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(key);
            out.push_str("=\"");
            escape_label_value(out, value);
            out.push('"');
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

fn escape_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn format_float(v: f64) -> String {
    // `{}` on f64 never uses exponent notation and prints 1.0 as "1"; Prometheus accepts both.
    format!("{v}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line_value(text: &str, prefix: &str) -> Option<String> {
        text.lines()
            .find(|l| l.starts_with(prefix) && l[prefix.len()..].starts_with(' '))
            .map(|l| l[prefix.len() + 1..].to_owned())
    }

    #[test]
    fn a_counted_request_shows_up_with_its_policy_and_outcome() {
        let metrics = Metrics::new();
        let m = metrics.admission("mesh");
        m.observe(Outcome::Injected, Duration::from_micros(50));
        m.observe(Outcome::Injected, Duration::from_micros(70));
        m.observe(Outcome::BadRequest, Duration::from_micros(5));
        let text = metrics.render();
        assert_eq!(
            line_value(
                &text,
                r#"splice_admission_requests_total{policy="mesh",outcome="injected"}"#
            )
            .as_deref(),
            Some("2")
        );
        assert_eq!(
            line_value(
                &text,
                r#"splice_admission_requests_total{policy="mesh",outcome="bad_request"}"#
            )
            .as_deref(),
            Some("1")
        );
        assert!(!text.contains(r#"outcome="skipped""#));
    }

    #[test]
    fn the_availability_guard_gauge_marks_only_the_current_state() {
        let metrics = Metrics::new();
        metrics.set_availability_guard("insufficient_replicas");
        metrics.set_availability_guard("available");
        let text = metrics.render();
        let value = |reason: &str| {
            line_value(
                &text,
                &format!(r#"splice_availability_guard{{reason="{reason}"}}"#),
            )
        };
        assert_eq!(value("available").as_deref(), Some("1"));
        assert_eq!(value("insufficient_replicas").as_deref(), Some("0"));
    }

    #[test]
    fn the_leader_gauge_is_zero_until_the_replica_leads_and_again_after_it_stops() {
        let metrics = Metrics::new();
        let value = |m: &Metrics| line_value(&m.render(), "splice_leader");
        assert_eq!(value(&metrics).as_deref(), Some("0"));
        metrics.set_leader(true);
        assert_eq!(value(&metrics).as_deref(), Some("1"));
        metrics.set_leader(false);
        assert_eq!(value(&metrics).as_deref(), Some("0"));
    }

    #[test]
    fn the_histogram_is_cumulative_and_its_count_matches_the_inf_bucket() {
        let metrics = Metrics::new();
        let m = metrics.admission("p");
        m.observe(Outcome::Injected, Duration::from_micros(80)); // ≤ 100 µs
        m.observe(Outcome::Injected, Duration::from_micros(300)); // ≤ 500 µs
        m.observe(Outcome::Injected, Duration::from_secs(40)); // +Inf
        let text = metrics.render();
        let bucket = |le: &str| {
            line_value(
                &text,
                &format!(r#"splice_admission_duration_seconds_bucket{{policy="p",le="{le}"}}"#),
            )
        };
        assert_eq!(bucket("0.0001").as_deref(), Some("1"));
        assert_eq!(bucket("0.00025").as_deref(), Some("1"));
        assert_eq!(bucket("0.0005").as_deref(), Some("2"));
        assert_eq!(bucket("30").as_deref(), Some("2"));
        assert_eq!(bucket("+Inf").as_deref(), Some("3"));
        assert_eq!(
            line_value(
                &text,
                r#"splice_admission_duration_seconds_count{policy="p"}"#
            )
            .as_deref(),
            Some("3")
        );
        let sum: f64 = line_value(
            &text,
            r#"splice_admission_duration_seconds_sum{policy="p"}"#,
        )
        .and_then(|v| v.parse().ok())
        .unwrap_or_default();
        assert!((sum - 40.00038).abs() < 1e-9, "sum was {sum}");
    }

    #[test]
    fn an_observation_exactly_on_a_bound_falls_in_that_bucket() {
        let h = Histogram::new(&ADMISSION_BUCKETS);
        h.observe(Duration::from_millis(1));
        let mut out = String::new();
        h.render(&mut out, "x", &[]);
        assert_eq!(
            line_value(&out, r#"x_bucket{le="0.0005"}"#).as_deref(),
            Some("0")
        );
        assert_eq!(
            line_value(&out, r#"x_bucket{le="0.001"}"#).as_deref(),
            Some("1")
        );
    }

    #[test]
    fn reconcile_and_certificate_metrics_are_exported() {
        let metrics = Metrics::new();
        metrics.observe_reconcile("success", Duration::from_millis(3));
        metrics.observe_reconcile("success", Duration::from_millis(3));
        metrics.observe_reconcile("error", Duration::from_millis(30));
        metrics.set_certificate_expiry("serving", 1_900_000_000);
        metrics.set_certificate_expiry("serving", 1_900_000_100);
        let text = metrics.render();
        assert_eq!(
            line_value(&text, r#"splice_reconcile_total{result="success"}"#).as_deref(),
            Some("2")
        );
        assert_eq!(
            line_value(&text, r#"splice_reconcile_total{result="error"}"#).as_deref(),
            Some("1")
        );
        assert_eq!(
            line_value(&text, "splice_reconcile_duration_seconds_count").as_deref(),
            Some("3")
        );
        assert_eq!(
            line_value(
                &text,
                r#"splice_certificate_expiry_timestamp_seconds{cert="serving"}"#
            )
            .as_deref(),
            Some("1900000100")
        );
    }

    #[test]
    fn each_probe_is_counted_by_policy_and_result_and_its_round_trip_observed() {
        let metrics = Metrics::new();
        metrics.observe_probe("mesh", "Verified", Some(Duration::from_millis(20)));
        metrics.observe_probe("mesh", "Verified", Some(Duration::from_millis(40)));
        metrics.observe_probe("mesh", "ProbeFailed", None);
        let text = metrics.render();
        assert_eq!(
            line_value(
                &text,
                r#"splice_probe_total{policy="mesh",result="Verified"}"#
            )
            .as_deref(),
            Some("2")
        );
        assert_eq!(
            line_value(
                &text,
                r#"splice_probe_total{policy="mesh",result="ProbeFailed"}"#
            )
            .as_deref(),
            Some("1")
        );
        assert_eq!(
            line_value(
                &text,
                r#"splice_probe_duration_seconds_bucket{policy="mesh",le="0.025"}"#
            )
            .as_deref(),
            Some("1")
        );
        assert_eq!(
            line_value(
                &text,
                r#"splice_probe_duration_seconds_count{policy="mesh"}"#
            )
            .as_deref(),
            Some("2")
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let metrics = Metrics::new();
        metrics.set_certificate_expiry("a\"b\\c\nd", 1);
        assert!(
            metrics
                .render()
                .contains(r#"splice_certificate_expiry_timestamp_seconds{cert="a\"b\\c\nd"} 1"#)
        );
    }

    #[test]
    fn every_family_has_help_and_type_even_when_empty() {
        let text = Metrics::new().render();
        for name in [
            "splice_admission_requests_total",
            "splice_admission_duration_seconds",
            "splice_injections_total",
            "splice_injection_skipped_total",
            "splice_reconcile_total",
            "splice_reconcile_duration_seconds",
            "splice_certificate_expiry_timestamp_seconds",
            "splice_probe_duration_seconds",
            "splice_probe_total",
            "splice_leader",
        ] {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
            assert!(text.contains(&format!("# HELP {name} ")), "{name} missing");
        }
    }

    #[test]
    fn concurrent_first_use_of_a_label_yields_one_shared_metric() {
        let metrics = Arc::new(Metrics::new());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let metrics = Arc::clone(&metrics);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        metrics
                            .admission("p")
                            .observe(Outcome::Unchanged, Duration::from_micros(1));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(metrics.admission("p").requests(Outcome::Unchanged), 8000);
    }
}
