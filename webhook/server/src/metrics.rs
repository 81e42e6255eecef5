//! The admission metrics and the registry they are exported from.
//!
//! Values live in `prometheus-client` metrics registered in one [`Registry`]; the admin server
//! writes it out in the Prometheus text format 0.0.4 ([`render`]). The controller registers its own
//! metrics (`splice_controller::metrics`) into the same registry, so one scrape sees both.
//!
//! A request resolves its policy's [`AdmissionMetrics`] once (a lock-free map of handles); each
//! handle is then an atomic counter, or the histogram's uncontended lock.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
pub use prometheus_client::registry::Registry;

use splice_engine::SkipReason;
use strum::EnumCount;

/// The `Content-Type` of [`render`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Every metric in `registry`, in the Prometheus text exposition format 0.0.4.
pub fn render(registry: &Registry) -> String {
    let mut out = String::with_capacity(4096);
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, registry);
    out
}

/// Upper bounds (seconds) of `splice_admission_duration_seconds`: from 100 µs, because a warm
/// injection takes tens of microseconds, to the API server's 30 s maximum webhook timeout.
pub const ADMISSION_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 30.0,
];

/// How one admission request ended: the `outcome` label of `splice_admission_requests_total`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::EnumCount, strum::EnumIter,
)]
#[strum(serialize_all = "snake_case")]
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
    /// A policy the validating webhook refused, or a pod whose override annotation its policy
    /// does not accept.
    Denied,
}

impl Outcome {
    /// Stable label value.
    pub fn label(self) -> &'static str {
        self.into()
    }
}

/// The slot of `reason` among a policy's skip counters.
fn skip_index(reason: SkipReason) -> usize {
    reason as usize
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    policy: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    policy: String,
    reason: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The registered families; [`AdmissionMetrics`] holds handles into them.
#[derive(Debug)]
struct Families {
    requests: Family<OutcomeLabels, Counter>,
    duration: HistogramFamily<PolicyLabel>,
    injections: Family<PolicyLabel, Counter>,
    skipped: Family<ReasonLabels, Counter>,
    overdue: Family<PolicyLabel, Counter>,
}

/// The admission metrics of one policy. A counter joins the exposition at its first increment, so
/// a scrape shows only the outcomes and reasons that happened; the histogram shows from the start.
#[derive(Debug)]
pub struct AdmissionMetrics {
    policy: String,
    families: Arc<Families>,
    requests: [OnceLock<Counter>; Outcome::COUNT],
    duration: Histogram,
    injections: OnceLock<Counter>,
    skipped: [OnceLock<Counter>; SkipReason::COUNT],
    /// Exported from the start, like the histogram: an alert on its increase must see the 0
    /// before the first call that runs out.
    overdue: Counter,
}

impl AdmissionMetrics {
    fn new(policy: &str, families: Arc<Families>) -> Self {
        let label = PolicyLabel {
            policy: policy.to_owned(),
        };
        AdmissionMetrics {
            duration: families.duration.get_or_create_owned(&label),
            overdue: families.overdue.get_or_create_owned(&label),
            policy: label.policy,
            families,
            requests: Default::default(),
            injections: OnceLock::new(),
            skipped: Default::default(),
        }
    }

    /// The policy these metrics are labelled with.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    fn request_counter(&self, outcome: Outcome) -> Option<&Counter> {
        let slot = self.requests.get(outcome as usize)?;
        Some(slot.get_or_init(|| {
            self.families.requests.get_or_create_owned(&OutcomeLabels {
                policy: self.policy.clone(),
                outcome: outcome.label(),
            })
        }))
    }

    fn skip_counter(&self, reason: SkipReason) -> Option<&Counter> {
        let slot = self.skipped.get(skip_index(reason))?;
        Some(slot.get_or_init(|| {
            self.families.skipped.get_or_create_owned(&ReasonLabels {
                policy: self.policy.clone(),
                reason: reason.label(),
            })
        }))
    }

    /// Counts one request and its duration.
    pub fn observe(&self, outcome: Outcome, elapsed: Duration) {
        if let Some(counter) = self.request_counter(outcome) {
            counter.inc();
        }
        self.duration.observe(elapsed.as_secs_f64());
    }

    /// Counts a pod that will run with an injection (dry runs are not counted).
    pub fn injected(&self) {
        self.injections
            .get_or_init(|| {
                self.families.injections.get_or_create_owned(&PolicyLabel {
                    policy: self.policy.clone(),
                })
            })
            .inc();
    }

    /// Counts a pod the policy did not apply to.
    pub fn skipped(&self, reason: SkipReason) {
        if let Some(counter) = self.skip_counter(reason) {
            counter.inc();
        }
    }

    /// Counts a call the API server had given up on (its timeout ran out) before the answer.
    pub fn overdue(&self) {
        self.overdue.inc();
    }

    /// Calls counted by [`AdmissionMetrics::overdue`] so far.
    pub fn overdues(&self) -> u64 {
        self.overdue.get()
    }

    /// Requests counted with `outcome` so far.
    pub fn requests(&self, outcome: Outcome) -> u64 {
        self.requests
            .get(outcome as usize)
            .and_then(OnceLock::get)
            .map_or(0, Counter::get)
    }

    /// Pods injected so far.
    pub fn injections(&self) -> u64 {
        self.injections.get().map_or(0, Counter::get)
    }

    /// Pods skipped for `reason` so far.
    pub fn skips(&self, reason: SkipReason) -> u64 {
        self.skipped
            .get(skip_index(reason))
            .and_then(OnceLock::get)
            .map_or(0, Counter::get)
    }
}

/// The admission metrics of every policy. Cheap to share (`Arc<Metrics>`); every method takes
/// `&self`.
#[derive(Debug)]
pub struct Metrics {
    families: Arc<Families>,
    /// Handles per policy, read without a lock; a new policy copies the map, which only happens
    /// the first time a policy is seen.
    admission: ArcSwap<HashMap<String, Arc<AdmissionMetrics>>>,
}

impl Default for Metrics {
    /// Metrics in no registry: they count but nobody exports them (tests, benchmarks).
    fn default() -> Self {
        Self::register(&mut Registry::default())
    }
}

impl Metrics {
    /// Metrics in no registry; see [`Metrics::register`] for exported ones.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the admission metric families in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let families = Families {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| {
                Histogram::new(ADMISSION_BUCKETS.iter().copied())
            }),
            injections: Family::default(),
            skipped: Family::default(),
            overdue: Family::default(),
        };
        // The library appends the final full stop of each HELP text.
        registry.register(
            "splice_admission_requests",
            "Admission requests answered, by policy and outcome",
            families.requests.clone(),
        );
        registry.register(
            "splice_admission_duration_seconds",
            "Time from request headers to response, by policy",
            families.duration.clone(),
        );
        registry.register(
            "splice_injections",
            "Pods admitted with a non-empty injection patch (dry runs excluded), by policy",
            families.injections.clone(),
        );
        registry.register(
            "splice_injection_skipped",
            "Pods a policy did not apply to, by policy and reason",
            families.skipped.clone(),
        );
        registry.register(
            "splice_admission_over_timeout",
            "Admission calls still unanswered when the API server's timeout for them ran out (it \
             then applied the failure policy), by policy",
            families.overdue.clone(),
        );
        Metrics {
            families: Arc::new(families),
            admission: ArcSwap::from_pointee(HashMap::new()),
        }
    }

    /// The admission metrics for `policy`, created on first use. Callers must pass bounded label
    /// values only (names of loaded policies or fixed placeholders), never raw request input.
    pub fn admission(&self, policy: &str) -> Arc<AdmissionMetrics> {
        if let Some(found) = self.admission.load().get(policy) {
            return Arc::clone(found);
        }
        let fresh = Arc::new(AdmissionMetrics::new(policy, Arc::clone(&self.families)));
        let mut chosen = Arc::clone(&fresh);
        self.admission.rcu(|current| {
            let mut next = HashMap::clone(current);
            chosen = Arc::clone(
                next.entry(policy.to_owned())
                    .or_insert_with(|| Arc::clone(&fresh)),
            );
            next
        });
        chosen
    }

    /// The admission metrics for `policy` if any request was counted for it.
    pub fn admission_if_seen(&self, policy: &str) -> Option<Arc<AdmissionMetrics>> {
        self.admission.load().get(policy).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample whose name and labels are `series`.
    pub(crate) fn sample(text: &str, series: &str) -> Option<String> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
    }

    fn registered() -> (Metrics, Registry) {
        let mut registry = Registry::default();
        (Metrics::register(&mut registry), registry)
    }

    #[test]
    fn a_counted_request_shows_up_with_its_policy_and_outcome() {
        let (metrics, registry) = registered();
        let m = metrics.admission("mesh");
        m.observe(Outcome::Injected, Duration::from_micros(50));
        m.observe(Outcome::Injected, Duration::from_micros(70));
        m.observe(Outcome::BadRequest, Duration::from_micros(5));
        let text = render(&registry);
        assert_eq!(
            sample(
                &text,
                r#"splice_admission_requests_total{policy="mesh",outcome="injected"}"#
            )
            .as_deref(),
            Some("2")
        );
        assert_eq!(
            sample(
                &text,
                r#"splice_admission_requests_total{policy="mesh",outcome="bad_request"}"#
            )
            .as_deref(),
            Some("1")
        );
        assert!(!text.contains(r#"outcome="skipped""#));
    }

    #[test]
    fn the_histogram_is_cumulative_and_its_count_matches_the_inf_bucket() {
        let (metrics, registry) = registered();
        let m = metrics.admission("p");
        m.observe(Outcome::Injected, Duration::from_micros(80)); // ≤ 100 µs
        m.observe(Outcome::Injected, Duration::from_micros(300)); // ≤ 500 µs
        m.observe(Outcome::Injected, Duration::from_secs(40)); // +Inf
        let text = render(&registry);
        let bucket = |le: &str| {
            sample(
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
            sample(
                &text,
                r#"splice_admission_duration_seconds_count{policy="p"}"#
            )
            .as_deref(),
            Some("3")
        );
        let sum: f64 = sample(
            &text,
            r#"splice_admission_duration_seconds_sum{policy="p"}"#,
        )
        .and_then(|v| v.parse().ok())
        .unwrap_or_default();
        assert!((sum - 40.00038).abs() < 1e-9, "sum was {sum}");
    }

    #[test]
    fn an_observation_exactly_on_a_bound_falls_in_that_bucket() {
        let (metrics, registry) = registered();
        metrics
            .admission("p")
            .observe(Outcome::Injected, Duration::from_millis(1));
        let text = render(&registry);
        let bucket = |le: &str| {
            sample(
                &text,
                &format!(r#"splice_admission_duration_seconds_bucket{{policy="p",le="{le}"}}"#),
            )
        };
        assert_eq!(bucket("0.0005").as_deref(), Some("0"));
        assert_eq!(bucket("0.001").as_deref(), Some("1"));
    }

    #[test]
    fn skips_and_injections_are_counted_by_policy() {
        let (metrics, registry) = registered();
        let m = metrics.admission("mesh");
        m.skipped(SkipReason::OptedOut);
        m.skipped(SkipReason::OptedOut);
        m.injected();
        let text = render(&registry);
        assert_eq!(
            sample(
                &text,
                r#"splice_injection_skipped_total{policy="mesh",reason="opted_out"}"#
            )
            .as_deref(),
            Some("2")
        );
        assert_eq!(
            sample(&text, r#"splice_injections_total{policy="mesh"}"#).as_deref(),
            Some("1")
        );
        assert_eq!((m.skips(SkipReason::OptedOut), m.injections()), (2, 1));
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
