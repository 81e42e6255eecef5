//! The admission probe (leader only): each Ready, unpaused policy is verified end to end through
//! the real API server with server-side dry-run creates (`dryRun=All`: nothing is stored, no
//! webhook with side effects is called) of a probe pod in the namespaces it selects, and the
//! opted-out baseline of the same pod. Runs when a policy or a namespace changes (after a short
//! debounce) and every probe interval (jittered), all requests spaced by one token bucket. The
//! result goes to the Verified condition and `status.probe`, under the field manager
//! [`PROBE_MANAGER`] and only when it changes. Which policy to probe, where and when is decided
//! by [`Probing`] (pure, run by [`crate::driver`]), what an answer means by [`super::verdict`];
//! [`Shared`] sends the dry runs.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use splice_crds::{InjectionPolicy, InjectionPolicyStatus, Mode, condition};
use splice_engine::{CompiledPolicy, Exclusions, NamespaceContext};

use crate::driver::{self, Inputs, Loop, Now, Pass, Snapshot, Write};
use crate::metrics::Metrics;
use crate::policy::conditions::{PlannedEvent, Severity};
use crate::policy::enforcement;
use crate::status::Owner;
use crate::verdict::{
    self, Answer, Judgement, NamespaceProbe, Probe, Subject, TokenBucket, Window, reason,
};
use splice_engine::entry::{webhook_name, webhook_name_of};

pub use crate::status::PROBE_MANAGER;
/// All of the probe's requests together, per second: however many policies there are, the probe
/// costs the API server at most this.
pub const MAX_REQUESTS_PER_SECOND: f64 = 5.0;
const BURST: f64 = 5.0;
/// Policies probed at once (each waits for its requests' turn in the token bucket).
const CONCURRENCY: usize = 4;
/// Policies taken per pass, so that changes are noticed between batches.
const BATCH: usize = 8;
/// A change is probed this long after it is seen, so a burst of changes costs one probe.
const DEBOUNCE: Duration = Duration::from_secs(1);
/// A pod found uninjected is probed again after this before it is reported: the API server loads
/// a new or changed webhook configuration asynchronously.
const CONFIRM_AFTER: Duration = Duration::from_secs(2);
const TICK: Duration = Duration::from_millis(500);
/// The API server's own time budget on top of the webhook's timeout.
const REQUEST_SLACK: Duration = Duration::from_secs(10);

/// A probed policy: its compiled form and what the probe found, or why nothing was probed.
type Probed = (
    Arc<InjectionPolicy>,
    Arc<CompiledPolicy>,
    Result<Vec<NamespaceProbe>, Judgement>,
);

/// How the probe runs.
#[derive(Clone, Debug)]
pub struct Config {
    pub interval: Duration,
    pub splice_namespace: String,
}

/// Whether a policy is probed, its probe results removed, or left as they are for now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Eligibility {
    Probe,
    /// Paused, or not Ready at its current generation for another reason than the API server's
    /// evidence: a Verified left from before would mislead.
    Clear,
    /// The reconciler has not looked at this generation yet.
    Wait,
}

fn eligibility(policy: &InjectionPolicy) -> Eligibility {
    if policy.spec.paused {
        return Eligibility::Clear;
    }
    let Some(status) = &policy.status else {
        return Eligibility::Wait;
    };
    if status.observed_generation != policy.metadata.generation {
        return Eligibility::Wait;
    }
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY)
        .map(|c| c.status.as_str());
    let waits_for_evidence = status.conditions.iter().any(|c| {
        c.type_ == condition::READY
            && (c.reason == enforcement::REASON_AWAITING
                || c.reason == enforcement::REASON_NOT_ENFORCED)
    });
    match ready {
        Some("True") => Eligibility::Probe,
        // Written but not seen enforced: the probe says what the API server does with it.
        Some(_) if waits_for_evidence => Eligibility::Probe,
        Some(_) => Eligibility::Clear,
        None => Eligibility::Wait,
    }
}

/// What the loop keeps per policy.
struct Tracked {
    uid: Option<String>,
    generation: Option<i64>,
    eligibility: Eligibility,
    due: Instant,
    window: Window,
    /// Namespaces named in the last problem, probed again until it is gone.
    affected: Vec<String>,
    /// The last probe found it uninjected and waits for confirmation.
    unconfirmed: bool,
}

impl Tracked {
    fn new(p: &InjectionPolicy, eligibility: Eligibility, now: Instant) -> Self {
        Tracked {
            uid: p.uid(),
            generation: p.metadata.generation,
            eligibility,
            due: now + DEBOUNCE,
            window: Window::default(),
            affected: p
                .status
                .as_ref()
                .and_then(|s| s.probe.as_ref())
                .map(|s| s.affected_namespaces.clone())
                .unwrap_or_default(),
            unconfirmed: false,
        }
    }

    /// A new object starts its window afresh; a new generation or eligibility is probed after
    /// the debounce.
    fn follow(&mut self, p: &InjectionPolicy, eligibility: Eligibility, now: Instant) {
        if self.uid != p.uid() {
            self.uid = p.uid();
            self.window = Window::default();
            self.affected.clear();
        }
        if self.generation != p.metadata.generation || self.eligibility != eligibility {
            self.generation = p.metadata.generation;
            self.eligibility = eligibility;
            self.due = self.due.min(now + DEBOUNCE);
        }
    }
}

/// What the concurrent probes share: the probe's I/O, apart from its decisions.
pub struct Shared {
    client: Client,
    bucket: Mutex<TokenBucket>,
    /// Baselines by (namespace, labels), reused by other policies' probes for one interval.
    baselines: Mutex<HashMap<(String, String), (Instant, Probe)>>,
    interval: Duration,
    random: RandomState,
    counter: AtomicU64,
}

impl Shared {
    fn random(&self) -> u64 {
        self.random
            .hash_one(self.counter.fetch_add(1, Ordering::Relaxed))
    }

    /// One dry-run create, after its turn in the token bucket.
    async fn dry_run(&self, namespace: &str, pod: &Pod, policy: &str, timeout: Duration) -> Probe {
        let wait = self
            .bucket
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .reserve(Instant::now());
        tokio::time::sleep(wait).await;
        dry_run_create(&self.client, namespace, pod, policy, timeout).await
    }

    fn pod_name(&self) -> String {
        format!("splice-probe-{:016x}", self.random())
    }

    /// Probes one policy in each namespace the plan names.
    async fn probe(
        &self,
        policy: &CompiledPolicy,
        namespaces: &[String],
        labels: &BTreeMap<String, String>,
    ) -> Vec<NamespaceProbe> {
        let name = policy.name();
        let timeout =
            Duration::from_secs(u64::try_from(policy.spec().timeout_seconds).unwrap_or(30))
                + REQUEST_SLACK;
        let label_key = format!("{labels:?}");
        let mut out = Vec::with_capacity(namespaces.len());
        for ns in namespaces {
            let injected = match verdict::probe_pod(&self.pod_name(), name, labels, false) {
                Ok(pod) => self.dry_run(ns, &pod, name, timeout).await,
                Err(e) => Probe {
                    answer: Answer::Failed(e),
                    round_trip: Duration::ZERO,
                },
            };
            let key = (ns.clone(), label_key.clone());
            // A refusal is always compared with a fresh baseline; latency can use a recent one.
            let cached = match &injected.answer {
                Answer::Refused { .. } => None,
                _ => self
                    .baselines
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&key)
                    .filter(|(at, _)| at.elapsed() < self.interval)
                    .map(|(_, p)| p.clone()),
            };
            let baseline = match cached {
                Some(b) => Some(b),
                None => match verdict::probe_pod(&self.pod_name(), name, labels, true) {
                    Ok(pod) => {
                        let b = self.dry_run(ns, &pod, name, timeout).await;
                        self.baselines
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .insert(key, (Instant::now(), b.clone()));
                        Some(b)
                    }
                    Err(_) => None,
                },
            };
            out.push(NamespaceProbe {
                namespace: ns.clone(),
                injected,
                baseline,
            });
        }
        out
    }
}

/// One server-side dry-run create of `pod` (`dryRun=All`: nothing is stored, no webhook with
/// side effects is called), read for `policy`'s injection; also the reconcile's evidence that
/// the API server enforces a generation.
pub(crate) async fn dry_run_create(
    client: &Client,
    namespace: &str,
    pod: &Pod,
    policy: &str,
    timeout: Duration,
) -> Probe {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = PostParams {
        dry_run: true,
        field_manager: Some(PROBE_MANAGER.to_owned()),
    };
    let started = Instant::now();
    let result = tokio::time::timeout(timeout, api.create(&params, pod)).await;
    let round_trip = started.elapsed();
    let answer = match result {
        Err(_) => Answer::Failed(format!("no answer within {timeout:?}")),
        Ok(Ok(created)) => match serde_json::to_string(&created)
            .map_err(|e| e.to_string())
            .and_then(|text| verdict::injected_hash(&text, policy))
        {
            Ok(hash) => Answer::Admitted { hash },
            Err(e) => Answer::Failed(format!("reading the pod the API server returned: {e}")),
        },
        Ok(Err(kube::Error::Api(s))) => Answer::Refused {
            code: s.code,
            message: verdict::without_pod_name(&s.message, pod.name_any().as_str()),
        },
        Ok(Err(e)) => Answer::Failed(e.to_string()),
    };
    Probe { answer, round_trip }
}

/// The leader's probe loop ([`Probing`] under the shared driver); ends with the term.
pub async fn run(config: Config, inputs: Inputs) {
    tracing::info!(interval = ?config.interval, "admission probe: running");
    let shared = Shared {
        client: inputs.client.clone(),
        bucket: Mutex::new(TokenBucket::new(
            MAX_REQUESTS_PER_SECOND,
            BURST,
            Instant::now(),
        )),
        baselines: Mutex::default(),
        interval: config.interval,
        random: RandomState::new(),
        counter: AtomicU64::new(0),
    };
    driver::run(Probing::new(&config), shared, inputs).await;
}

/// The probe loop's state: plain data, decided over by [`Loop::pass`] (which policies to probe,
/// where, and when) and [`Loop::judge`] (what the answers come to).
pub struct Probing {
    exclusions: Exclusions,
    interval: Duration,
    /// The jitter's source.
    random: RandomState,
    draws: u64,
    tracked: HashMap<String, Tracked>,
    /// The namespace watch's generation the schedule last saw.
    namespaces_seen: Option<u64>,
    /// (policy, result, slowest round trip) of each probe since the last publish.
    observed: Vec<(String, &'static str, Option<Duration>)>,
}

/// One policy to probe: where and with which labels, or why nothing can be probed.
pub struct Job {
    policy: Arc<InjectionPolicy>,
    compiled: Arc<CompiledPolicy>,
    plan: Result<(Vec<String>, BTreeMap<String, String>), Judgement>,
}

impl Probing {
    pub fn new(config: &Config) -> Self {
        Probing {
            exclusions: Exclusions::default_for(&config.splice_namespace),
            interval: config.interval,
            random: RandomState::new(),
            draws: 0,
            tracked: HashMap::new(),
            namespaces_seen: None,
            observed: Vec::new(),
        }
    }

    fn jitter(&mut self) -> Duration {
        self.draws = self.draws.wrapping_add(1);
        verdict::jittered(self.interval, self.random.hash_one(self.draws))
    }

    /// Follows the policies (a change is probed after [`DEBOUNCE`]; a namespace change brings
    /// every probe forward to it) and removes the results of policies no longer probed.
    fn track(&mut self, view: &Snapshot, now: Instant) -> Vec<Write> {
        if self.namespaces_seen != Some(view.namespaces_generation) {
            self.namespaces_seen = Some(view.namespaces_generation);
            for t in self.tracked.values_mut() {
                t.due = t.due.min(now + DEBOUNCE);
            }
        }
        let mut present = HashSet::with_capacity(view.policies.len());
        let mut clears = Vec::new();
        for p in &view.policies {
            let name = p.name_any();
            let e = eligibility(p);
            self.tracked
                .entry(name.clone())
                .or_insert_with(|| Tracked::new(p, e, now))
                .follow(p, e, now);
            let status = view.status(Owner::Probe, p);
            if e == Eligibility::Clear && has_probe_results(status.as_deref()) {
                // Applying an empty slice under this manager removes everything it owns there.
                clears.push(Write {
                    policy: Arc::clone(p),
                    slice: InjectionPolicyStatus::default(),
                    then: None,
                    log: Some("admission probe: results removed".to_owned()),
                });
            }
            present.insert(name);
        }
        self.tracked.retain(|name, _| present.contains(name));
        clears
    }

    /// The policies due, the longest waiting first, at most [`BATCH`].
    fn due(&self, view: &Snapshot, now: Instant) -> Vec<Job> {
        let mut due: Vec<(Instant, &Arc<InjectionPolicy>)> = view
            .policies
            .iter()
            .filter_map(|p| {
                let t = self.tracked.get(&p.name_any())?;
                (t.eligibility == Eligibility::Probe && t.due <= now).then_some((t.due, p))
            })
            .collect();
        due.sort_by_key(|(at, _)| *at);
        due.truncate(BATCH);
        due.into_iter()
            .filter_map(|(_, p)| self.job(view, p))
            .collect()
    }

    /// What to probe of `policy`; `None` when it does not compile (the reconcile reports it).
    fn job(&self, view: &Snapshot, policy: &Arc<InjectionPolicy>) -> Option<Job> {
        let name = policy.name_any();
        let generation = policy.metadata.generation;
        let compiled = match view
            .served
            .get(&name)
            .filter(|c| Some(c.generation()) == generation)
        {
            Some(c) => Arc::clone(c),
            None => Arc::new(
                CompiledPolicy::compile(&name, generation.unwrap_or_default(), &policy.spec)
                    .ok()?,
            ),
        };
        let earlier = self
            .tracked
            .get(&name)
            .map(|t| t.affected.as_slice())
            .unwrap_or_default();
        let plan = plan(&compiled, &view.namespaces, &self.exclusions, earlier);
        Some(Job {
            policy: Arc::clone(policy),
            compiled,
            plan,
        })
    }

    /// What one policy's probe comes to: its next turn, and the write of a changed result. An
    /// uninjected pod is probed again after [`CONFIRM_AFTER`] before it is reported.
    fn conclude(&mut self, view: &Snapshot, probed: Probed, now: Now) -> Option<Write> {
        let (policy, compiled, outcome) = probed;
        let name = policy.name_any();
        let jitter = self.jitter();
        let t = self.tracked.get_mut(&name)?;
        let j = match outcome {
            Err(j) => j,
            Ok(probes) => {
                record_latency(&mut t.window, &probes);
                let j = verdict::judge(
                    &probes,
                    &subject(view, &policy, &compiled, &probes),
                    &t.window,
                );
                let slowest = probes.iter().map(|p| p.injected.round_trip).max();
                self.observed.push((name, j.reason, slowest));
                j
            }
        };
        if j.reason == reason::NOT_INJECTED && !t.unconfirmed {
            t.unconfirmed = true;
            t.due = now.at + CONFIRM_AFTER;
            return None;
        }
        t.unconfirmed = false;
        t.affected = j.affected.clone();
        t.due = now.at + jitter;
        report(view, &policy, &j, &t.window, now.wall)
    }
}

impl Loop for Probing {
    const NAME: &'static str = "probe";
    const OWNER: Owner = Owner::Probe;
    const PODS: bool = false;
    type Look = Job;
    type Act = Infallible;
    type Seen = Probed;
    type Io = Shared;
    type Extra = ();

    fn period(&self) -> Duration {
        TICK
    }

    fn pass(&mut self, view: &Snapshot, now: Now) -> Pass<Job> {
        let writes = self.track(view, now.at);
        let looks = self.due(view, now.at);
        Pass {
            writes,
            acts: Vec::new(),
            looks,
        }
    }

    async fn look(io: &Shared, _view: &Snapshot, jobs: Vec<Job>) -> Vec<Probed> {
        let probed = futures::stream::iter(jobs)
            .map(|job| async move {
                let outcome = match job.plan {
                    Ok((namespaces, labels)) => {
                        Ok(io.probe(&job.compiled, &namespaces, &labels).await)
                    }
                    Err(j) => Err(j),
                };
                (job.policy, job.compiled, outcome)
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        // Baselines older than an interval are never reused.
        io.baselines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, (at, _)| at.elapsed() < io.interval);
        probed
    }

    fn judge(&mut self, view: &Snapshot, seen: Vec<Probed>, now: Now) -> Vec<Write> {
        seen.into_iter()
            .filter_map(|probed| self.conclude(view, probed, now))
            .collect()
    }

    async fn act(_io: &Shared, act: Infallible) -> Probed {
        match act {}
    }

    /// A result not written is tried again after the debounce.
    fn failed(&mut self, policy: &str, now: Now) {
        if let Some(t) = self.tracked.get_mut(policy) {
            t.due = now.at + DEBOUNCE;
        }
    }

    fn publish(&mut self, metrics: &Metrics) {
        for (policy, result, slowest) in self.observed.drain(..) {
            metrics.observe_probe(&policy, result, slowest);
        }
    }
}

/// Where to probe `policy` and with which labels, or why nothing can be probed.
fn plan(
    policy: &CompiledPolicy,
    namespaces: &HashMap<String, NamespaceContext>,
    exclusions: &Exclusions,
    earlier: &[String],
) -> Result<(Vec<String>, BTreeMap<String, String>), Judgement> {
    let labels = verdict::probe_labels(policy)
        .map_err(|why| Judgement::unknown(reason::NO_PROBE_POD, format!("Cannot probe: {why}.")))?;
    let namespaces = verdict::plan_namespaces(policy, namespaces.values(), exclusions, earlier);
    if namespaces.is_empty() {
        return Err(Judgement::unknown(
            reason::NO_NAMESPACE,
            "No existing namespace is selected by this policy (kube-system, kube-node-lease and \
             Splice's own namespace never are), so there is nothing to probe."
                .to_owned(),
        ));
    }
    Ok((namespaces, labels))
}

/// Adds each admitted probe's round trip, and its share over the baseline, to the window.
fn record_latency(window: &mut Window, probes: &[NamespaceProbe]) {
    for p in probes {
        if let (Answer::Admitted { .. }, Some(b)) = (&p.injected.answer, &p.baseline) {
            window.push(
                p.injected.round_trip,
                p.injected.round_trip.saturating_sub(b.round_trip),
            );
        }
    }
}

/// What the verdict needs to know of `policy` to read its probes' answers.
fn subject(
    view: &Snapshot,
    policy: &InjectionPolicy,
    compiled: &CompiledPolicy,
    probes: &[NamespaceProbe],
) -> Subject {
    let name = policy.name_any();
    let refused = probes
        .iter()
        .any(|p| matches!(p.injected.answer, Answer::Refused { .. }));
    Subject {
        // A shared entry's webhook is named after the entry, not the policy.
        webhook_name: policy
            .status
            .as_ref()
            .and_then(|s| s.webhook_configuration.as_deref())
            .and_then(webhook_name_of)
            .unwrap_or_else(|| webhook_name(&name)),
        containers: verdict::injected_containers(compiled),
        // Only a refusal is told apart by whose content it names.
        others: if refused {
            others(&view.served, &name)
        } else {
            Vec::new()
        },
        timeout_seconds: compiled.spec().timeout_seconds,
        in_tree: policy.status.as_ref().and_then(|s| s.mode) == Some(Mode::InTree),
    }
}

/// (policy, injected container) of every other served policy, to tell whose content a refusal
/// names.
fn others(served: &BTreeMap<String, Arc<CompiledPolicy>>, name: &str) -> Vec<(String, String)> {
    served
        .iter()
        // A canary's entry (`<policy>@canary`) is the same policy's.
        .filter(|(n, _)| n.as_str() != name && !n.contains('@'))
        .flat_map(|(n, c)| {
            verdict::injected_containers(c)
                .into_iter()
                .map(move |container| (n.clone(), container))
        })
        .collect()
}

/// Whether the status still carries the probe's results.
fn has_probe_results(status: Option<&InjectionPolicyStatus>) -> bool {
    status.is_some_and(|s| {
        s.probe.is_some() || s.conditions.iter().any(|c| c.type_ == condition::VERIFIED)
    })
}

/// The write of `j` unless the known status already says it: the Verified condition and
/// `status.probe`, with a Warning Event when the condition turns to a result that warns.
fn report(
    view: &Snapshot,
    policy: &Arc<InjectionPolicy>,
    j: &Judgement,
    window: &Window,
    now: Timestamp,
) -> Option<Write> {
    let current = view.status(Owner::Probe, policy);
    let current = current.as_deref();
    let generation = policy.metadata.generation;
    if verdict::already_reported(current, generation, j) {
        return None;
    }
    let before = current
        .into_iter()
        .flat_map(|s| &s.conditions)
        .find(|c| c.type_ == condition::VERIFIED);
    let turned = before.is_none_or(|b| b.status != j.status.as_str() || b.reason != j.reason);
    let (verified, probe) = verdict::probe_status(current, generation, j, window, now);
    let then = (j.warns() && turned).then(|| PlannedEvent {
        severity: Severity::Warning,
        reason: j.reason.to_owned(),
        action: "ProbeAdmission",
        note: crate::policy::error::truncate(j.message(), 1000),
    });
    Some(Write {
        policy: Arc::clone(policy),
        slice: InjectionPolicyStatus {
            conditions: vec![verified],
            probe: Some(probe),
            ..InjectionPolicyStatus::default()
        },
        then,
        log: Some(format!(
            "admission probe: result changed to {} (namespaces {:?})",
            j.reason, j.namespaces
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use splice_crds::ProbeStatus;

    fn policy(paused: bool, ready: Option<(&str, &str)>, observed: i64) -> InjectionPolicy {
        let mut p: InjectionPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "splice.dev/v1alpha1", "kind": "InjectionPolicy",
            "metadata": {"name": "p", "generation": 2},
            "spec": {"template": {}, "paused": paused}
        }))
        .unwrap();
        p.status = Some(InjectionPolicyStatus {
            observed_generation: Some(observed),
            conditions: ready
                .map(|(status, reason)| Condition {
                    type_: condition::READY.into(),
                    status: status.into(),
                    reason: reason.into(),
                    message: String::new(),
                    observed_generation: Some(observed),
                    last_transition_time: Time(Timestamp::UNIX_EPOCH),
                })
                .into_iter()
                .collect(),
            ..Default::default()
        });
        p
    }

    #[test]
    fn ready_policies_and_those_waiting_for_the_api_servers_evidence_are_probed() {
        let e = |paused, ready, observed| eligibility(&policy(paused, ready, observed));
        assert_eq!(
            e(false, Some(("True", "Configured")), 2),
            Eligibility::Probe
        );
        assert_eq!(
            e(false, Some(("False", enforcement::REASON_NOT_ENFORCED)), 2),
            Eligibility::Probe
        );
        assert_eq!(
            e(false, Some(("False", enforcement::REASON_AWAITING)), 2),
            Eligibility::Probe
        );
        assert_eq!(
            e(false, Some(("False", "InvalidTemplate")), 2),
            Eligibility::Clear
        );
        assert_eq!(e(true, Some(("True", "Configured")), 2), Eligibility::Clear);
        assert_eq!(e(false, Some(("True", "Configured")), 1), Eligibility::Wait);
        assert_eq!(e(false, None, 2), Eligibility::Wait);
    }

    /// A Ready policy named `name`, as the cache holds it.
    fn ready(name: &str) -> Arc<InjectionPolicy> {
        let mut p = policy(false, Some(("True", "Configured")), 2);
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(format!("uid-{name}"));
        Arc::new(p)
    }

    fn view(policies: Vec<Arc<InjectionPolicy>>) -> Snapshot {
        let shop = NamespaceContext {
            name: "shop".into(),
            ..NamespaceContext::default()
        };
        Snapshot {
            policies,
            namespaces: Arc::new([("shop".to_owned(), shop)].into()),
            namespaces_generation: 1,
            ..Snapshot::default()
        }
    }

    fn probing() -> Probing {
        Probing::new(&Config {
            interval: Duration::from_secs(60),
            splice_namespace: "splice-system".into(),
        })
    }

    fn at(t: Instant) -> Now {
        Now {
            at: t,
            wall: Timestamp::from_second(2000).unwrap(),
        }
    }

    fn names(jobs: &[Job]) -> Vec<String> {
        jobs.iter().map(|j| j.policy.name_any()).collect()
    }

    /// The probe of `job` in each namespace it planned, answered `injected` (a hash: the
    /// template's, `None`: admitted without the injection).
    fn answered(job: Job, injected: bool) -> Probed {
        let hash = injected.then(|| job.compiled.template_hash().to_owned());
        let admitted = |hash| Probe {
            answer: Answer::Admitted { hash },
            round_trip: Duration::from_millis(20),
        };
        let (namespaces, _) = job.plan.clone().expect("planned");
        let probes = namespaces
            .into_iter()
            .map(|namespace| NamespaceProbe {
                namespace,
                injected: admitted(hash.clone()),
                baseline: Some(admitted(None)),
            })
            .collect();
        (job.policy, job.compiled, Ok(probes))
    }

    /// Probes the one policy of `v` at `t` (it must be due) and judges `injected`.
    fn probe_at(p: &mut Probing, v: &Snapshot, t: Instant, injected: bool) -> Vec<Write> {
        let mut pass = p.pass(v, at(t));
        assert_eq!(pass.looks.len(), 1, "one policy due");
        let job = pass.looks.remove(0);
        p.judge(v, vec![answered(job, injected)], at(t))
    }

    #[test]
    fn a_new_policy_is_probed_after_the_debounce_in_the_namespaces_it_selects() {
        let (mut p, v, t0) = (probing(), view(vec![ready("a")]), Instant::now());
        assert!(p.pass(&v, at(t0)).looks.is_empty(), "not at once");
        let pass = p.pass(&v, at(t0 + DEBOUNCE));
        assert_eq!(names(&pass.looks), ["a"]);
        let (namespaces, _) = pass.looks[0].plan.as_ref().unwrap();
        assert_eq!(namespaces, &["shop"]);
    }

    #[test]
    fn at_most_a_batch_is_probed_per_pass_the_longest_waiting_first() {
        let (mut p, t0) = (probing(), Instant::now());
        p.pass(&view(vec![ready("z-first")]), at(t0));
        let mut all: Vec<_> = (0..BATCH).map(|i| ready(&format!("p{i}"))).collect();
        all.push(ready("z-first"));
        let v = view(all);
        p.pass(&v, at(t0 + Duration::from_millis(100)));
        let due = p.pass(&v, at(t0 + 2 * DEBOUNCE)).looks;
        assert_eq!(due.len(), BATCH);
        assert_eq!(names(&due)[0], "z-first");
    }

    #[test]
    fn a_verified_policy_is_written_once_and_probed_again_after_about_an_interval() {
        let (mut p, v, t0) = (probing(), view(vec![ready("a")]), Instant::now());
        p.pass(&v, at(t0));
        let t1 = t0 + DEBOUNCE;
        let writes = probe_at(&mut p, &v, t1, true);
        let [w] = writes.as_slice() else {
            panic!("one write: {writes:?}")
        };
        assert_eq!(w.slice.probe.as_ref().unwrap().result, reason::VERIFIED);
        assert_eq!(w.slice.conditions[0].type_, condition::VERIFIED);
        assert!(w.then.is_none(), "a Verified result does not warn");
        let due = p.tracked["a"].due;
        assert!(due >= t1 + Duration::from_secs(54) && due <= t1 + Duration::from_secs(66));

        // The same result again, with the write pending in the cache: nothing to write.
        let mut v = v;
        v.pending.insert("a".into(), w.slice.clone());
        p.tracked.get_mut("a").unwrap().due = t1;
        assert!(probe_at(&mut p, &v, t1, true).is_empty());
    }

    #[test]
    fn an_uninjected_pod_is_probed_again_before_it_is_reported_with_a_warning() {
        let (mut p, v, t0) = (probing(), view(vec![ready("a")]), Instant::now());
        p.pass(&v, at(t0));
        let t1 = t0 + DEBOUNCE;
        assert!(
            probe_at(&mut p, &v, t1, false).is_empty(),
            "not reported yet"
        );
        assert_eq!(p.tracked["a"].due, t1 + CONFIRM_AFTER);
        assert!(p.pass(&v, at(t1 + Duration::from_secs(1))).looks.is_empty());
        let writes = probe_at(&mut p, &v, t1 + CONFIRM_AFTER, false);
        let [w] = writes.as_slice() else {
            panic!("one write: {writes:?}")
        };
        assert_eq!(w.slice.probe.as_ref().unwrap().result, reason::NOT_INJECTED);
        let event = w.then.as_ref().expect("a Warning");
        assert_eq!(
            (event.reason.as_str(), event.action, event.severity),
            (reason::NOT_INJECTED, "ProbeAdmission", Severity::Warning)
        );
        assert_eq!(p.observed.len(), 2, "both probes are counted");
    }

    #[test]
    fn a_namespace_change_brings_every_probe_forward_to_the_debounce() {
        let (mut p, mut v, t0) = (probing(), view(vec![ready("a")]), Instant::now());
        p.pass(&v, at(t0));
        let t1 = t0 + DEBOUNCE;
        probe_at(&mut p, &v, t1, true);
        assert!(p.pass(&v, at(t1 + DEBOUNCE)).looks.is_empty());
        v.namespaces_generation += 1;
        let t2 = t1 + Duration::from_secs(5);
        assert!(p.pass(&v, at(t2)).looks.is_empty(), "after the debounce");
        assert_eq!(names(&p.pass(&v, at(t2 + DEBOUNCE)).looks), ["a"]);
    }

    #[test]
    fn a_paused_policy_has_its_results_removed_and_the_removal_is_not_sent_twice() {
        let mut paused = policy(true, Some(("True", "Configured")), 2);
        if let Some(s) = paused.status.as_mut() {
            s.probe = Some(ProbeStatus::default());
        }
        let (mut p, mut v, t0) = (probing(), view(vec![Arc::new(paused)]), Instant::now());
        let pass = p.pass(&v, at(t0 + DEBOUNCE));
        assert!(pass.looks.is_empty(), "a paused policy is not probed");
        let [w] = pass.writes.as_slice() else {
            panic!("one removal")
        };
        assert_eq!(w.slice, InjectionPolicyStatus::default());
        v.pending
            .insert("p".into(), InjectionPolicyStatus::default());
        assert!(p.pass(&v, at(t0 + DEBOUNCE)).writes.is_empty());
    }

    #[test]
    fn a_policy_the_reconcile_has_not_looked_at_is_neither_probed_nor_cleared() {
        let mut waiting = policy(false, Some(("True", "Configured")), 1);
        if let Some(s) = waiting.status.as_mut() {
            s.probe = Some(ProbeStatus::default());
        }
        let (mut p, v, t0) = (probing(), view(vec![Arc::new(waiting)]), Instant::now());
        let pass = p.pass(&v, at(t0 + 2 * DEBOUNCE));
        assert!(pass.looks.is_empty() && pass.writes.is_empty());
    }

    #[test]
    fn a_policy_without_a_selected_namespace_is_judged_without_a_probe() {
        let (mut p, t0) = (probing(), Instant::now());
        let v = Snapshot {
            policies: vec![ready("a")],
            ..Snapshot::default()
        };
        p.pass(&v, at(t0));
        let mut pass = p.pass(&v, at(t0 + DEBOUNCE));
        let job = pass.looks.remove(0);
        let Err(j) = job.plan.clone() else {
            panic!("nothing to probe")
        };
        assert_eq!(j.reason, reason::NO_NAMESPACE);
        let writes = p.judge(&v, vec![(job.policy, job.compiled, Err(j))], at(t0));
        assert_eq!(
            writes[0].slice.probe.as_ref().unwrap().result,
            reason::NO_NAMESPACE
        );
        assert!(
            p.observed.is_empty(),
            "nothing was probed, nothing is counted"
        );
    }

    #[test]
    fn a_result_not_written_is_tried_again_after_the_debounce() {
        let (mut p, v, t0) = (probing(), view(vec![ready("a")]), Instant::now());
        p.pass(&v, at(t0));
        let t1 = t0 + DEBOUNCE;
        assert_eq!(probe_at(&mut p, &v, t1, true).len(), 1);
        p.failed("a", at(t1));
        assert_eq!(names(&p.pass(&v, at(t1 + DEBOUNCE)).looks), ["a"]);
    }
}
