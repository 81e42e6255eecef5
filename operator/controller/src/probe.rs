//! The admission probe (leader only): each Ready, unpaused policy is verified end to end through
//! the real API server with server-side dry-run creates (`dryRun=All`: nothing is stored, no
//! webhook with side effects is called) of a probe pod in the namespaces it selects, and the
//! opted-out baseline of the same pod. Runs when a policy or a namespace changes (after a short
//! debounce) and every probe interval (jittered), all requests spaced by one token bucket. The
//! result goes to the Verified condition and `status.probe`, under the field manager
//! [`PROBE_MANAGER`] and only when it changes. What to probe and what a probe means is decided in
//! [`super::verdict`]; this module sends the requests and writes.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::leader::Leadership;
use crate::metrics::Metrics;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use splice_crds::{InjectionPolicy, InjectionPolicyStatus, Mode, ProbeStatus, condition};
use splice_engine::{CompiledPolicy, Exclusions, NamespaceContext};

use crate::policy::enforcement;
use crate::verdict::{
    self, Answer, Judgement, NamespaceProbe, Probe, Subject, TokenBucket, Window, reason,
};
use crate::view::{Namespaces, Policies};
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
/// (uid, Verified condition, status.probe) as this replica last wrote them.
type Written = (Option<String>, Condition, ProbeStatus);

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
    /// The policy's resourceVersion when this replica removed the probe's results, so they are
    /// not removed again while the cache still shows them.
    cleared_at: Option<String>,
}

/// What the concurrent probes share.
struct Shared {
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
        labels: &std::collections::BTreeMap<String, String>,
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

/// The leader's probe loop; cancelled with the rest of the leader's work.
pub async fn run(
    client: Client,
    config: Config,
    policies: Policies,
    namespaces: Arc<Mutex<Namespaces>>,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    leading: Leadership,
) {
    let Policies {
        cache,
        mut listed,
        webhook_policies: served,
    } = policies;
    if listed.wait_for(|l| *l).await.is_err() {
        return;
    }
    tracing::info!(interval = ?config.interval, "admission probe: running");
    let exclusions = Exclusions::default_for(&config.splice_namespace);
    let api: Api<InjectionPolicy> = Api::all(client.clone());
    let shared = Arc::new(Shared {
        client,
        bucket: Mutex::new(TokenBucket::new(
            MAX_REQUESTS_PER_SECOND,
            BURST,
            Instant::now(),
        )),
        baselines: Mutex::default(),
        interval: config.interval,
        random: RandomState::new(),
        counter: AtomicU64::new(0),
    });
    let mut tracked: HashMap<String, Tracked> = HashMap::new();
    // What this replica last wrote per policy (uid, condition, probe), until the cache shows it.
    let mut written: HashMap<String, Written> = HashMap::new();
    let mut contexts: Arc<Vec<NamespaceContext>> = Arc::new(Vec::new());
    let mut ns_seen: Option<u64> = None;
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        {
            let n = namespaces.lock().unwrap_or_else(PoisonError::into_inner);
            if !n.synced {
                continue;
            }
            if ns_seen != Some(n.generation) {
                ns_seen = Some(n.generation);
                contexts = Arc::new(n.contexts.values().cloned().collect());
                for t in tracked.values_mut() {
                    t.due = t.due.min(Instant::now() + DEBOUNCE);
                }
            }
        }
        let now = Instant::now();
        let all = cache.state();
        let mut present = HashSet::with_capacity(all.len());
        let mut to_clear = Vec::new();
        for p in &all {
            let name = p.name_any();
            let e = eligibility(p);
            let t = tracked.entry(name.clone()).or_insert_with(|| Tracked {
                uid: p.uid(),
                generation: p.metadata.generation,
                eligibility: e,
                due: now + DEBOUNCE,
                window: Window::default(),
                affected: p
                    .status
                    .as_ref()
                    .and_then(|s| s.probe.as_ref())
                    .map(|s| s.affected_namespaces.clone())
                    .unwrap_or_default(),
                unconfirmed: false,
                cleared_at: None,
            });
            if t.uid != p.uid() {
                t.uid = p.uid();
                t.window = Window::default();
                t.affected.clear();
            }
            if t.generation != p.metadata.generation || t.eligibility != e {
                t.generation = p.metadata.generation;
                t.eligibility = e;
                t.due = t.due.min(now + DEBOUNCE);
            }
            if e == Eligibility::Clear
                && t.cleared_at != p.resource_version()
                && has_probe_results(p.status.as_ref(), written.get(&name))
            {
                to_clear.push(Arc::clone(p));
            }
            present.insert(name);
        }
        tracked.retain(|name, _| present.contains(name));
        written.retain(|name, _| present.contains(name));

        for p in to_clear {
            if !leading.now() {
                return;
            }
            let name = p.name_any();
            // Applying an empty status under this manager removes everything it owns there.
            let patch = serde_json::json!({
                "apiVersion": InjectionPolicy::api_version(&()),
                "kind": InjectionPolicy::kind(&()),
                "status": {},
            });
            match api
                .patch_status(
                    &name,
                    &PatchParams::apply(PROBE_MANAGER).force(),
                    &Patch::Apply(&patch),
                )
                .await
            {
                Ok(_) => {
                    written.remove(&name);
                    if let Some(t) = tracked.get_mut(&name) {
                        t.cleared_at = p.resource_version();
                    }
                    tracing::debug!(policy = %name, "admission probe: results removed");
                }
                Err(e) => {
                    tracing::warn!(policy = %name, error = %e, "could not remove the probe's status")
                }
            }
        }

        let mut due: Vec<(Instant, Arc<InjectionPolicy>)> = all
            .iter()
            .filter_map(|p| {
                let t = tracked.get(&p.name_any())?;
                (t.eligibility == Eligibility::Probe && t.due <= now)
                    .then(|| (t.due, Arc::clone(p)))
            })
            .collect();
        if due.is_empty() {
            continue;
        }
        due.sort_by_key(|(at, _)| *at);
        due.truncate(BATCH);

        let jobs: Vec<_> = due
            .into_iter()
            .map(|(_, policy)| {
                let name = policy.name_any();
                let compiled = served
                    .get(&name)
                    .filter(|c| Some(c.generation()) == policy.metadata.generation)
                    .map(Ok)
                    .unwrap_or_else(|| {
                        CompiledPolicy::compile(
                            &name,
                            policy.metadata.generation.unwrap_or_default(),
                            &policy.spec,
                        )
                        .map(Arc::new)
                    });
                let earlier = tracked
                    .get(&name)
                    .map(|t| t.affected.clone())
                    .unwrap_or_default();
                (policy, compiled, earlier)
            })
            .collect();
        let results: Vec<Probed> = futures::stream::iter(jobs)
            .filter_map(|(policy, compiled, earlier)| {
                // The reconciler reports a policy that does not compile; nothing to probe.
                let compiled = compiled.ok();
                async move { compiled.map(|c| (policy, c, earlier)) }
            })
            .map(|(policy, compiled, earlier)| {
                let shared = Arc::clone(&shared);
                let contexts = Arc::clone(&contexts);
                let exclusions = exclusions.clone();
                async move {
                    let outcome =
                        probe_one(&shared, &compiled, &contexts, &exclusions, &earlier).await;
                    (policy, compiled, outcome)
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;

        let now = Instant::now();
        for (policy, compiled, outcome) in results {
            let name = policy.name_any();
            let Some(t) = tracked.get_mut(&name) else {
                continue;
            };
            let subject = || Subject {
                // A shared entry's webhook is named after the entry, not the policy.
                webhook_name: policy
                    .status
                    .as_ref()
                    .and_then(|s| s.webhook_configuration.as_deref())
                    .and_then(webhook_name_of)
                    .unwrap_or_else(|| webhook_name(&name)),
                containers: verdict::injected_containers(&compiled),
                others: others(&served, &name),
                timeout_seconds: compiled.spec().timeout_seconds,
                in_tree: policy.status.as_ref().and_then(|s| s.mode) == Some(Mode::InTree),
            };
            let j = match outcome {
                Err(j) => j,
                Ok(probes) => {
                    for p in &probes {
                        if let (Answer::Admitted { .. }, Some(b)) =
                            (&p.injected.answer, &p.baseline)
                        {
                            t.window.push(
                                p.injected.round_trip,
                                p.injected.round_trip.saturating_sub(b.round_trip),
                            );
                        }
                    }
                    let refused = probes
                        .iter()
                        .any(|p| matches!(p.injected.answer, Answer::Refused { .. }));
                    let mut s = subject();
                    if !refused {
                        s.others.clear();
                    }
                    let j = verdict::judge(&probes, &s, &t.window);
                    let slowest = probes.iter().map(|p| p.injected.round_trip).max();
                    metrics.observe_probe(&name, j.reason, slowest);
                    j
                }
            };
            if j.reason == reason::NOT_INJECTED && !t.unconfirmed {
                t.unconfirmed = true;
                t.due = now + CONFIRM_AFTER;
                continue;
            }
            t.unconfirmed = false;
            t.affected = j.affected.clone();
            t.due = now + verdict::jittered(shared.interval, shared.random());
            if !leading.now() {
                return;
            }
            match write(&api, &policy, &j, &t.window, written.get(&name)).await {
                Ok(Some((condition, probe, before))) => {
                    written.insert(name.clone(), (policy.uid(), condition, probe));
                    let turned = before
                        .as_ref()
                        .is_none_or(|b| b.status != j.status.as_str() || b.reason != j.reason);
                    if j.warns() && turned {
                        warn(&recorder, &policy, &j).await;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(policy = %name, error = %e, "could not write the probe's result");
                    t.due = now + DEBOUNCE;
                }
            }
        }
        // Baselines older than an interval are never reused.
        shared
            .baselines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, (at, _)| at.elapsed() < shared.interval);
    }
}

/// Plans and runs one policy's probe, or says why there is nothing to probe.
async fn probe_one(
    shared: &Shared,
    compiled: &CompiledPolicy,
    contexts: &[NamespaceContext],
    exclusions: &Exclusions,
    earlier: &[String],
) -> Result<Vec<NamespaceProbe>, Judgement> {
    let labels = verdict::probe_labels(compiled)
        .map_err(|why| Judgement::unknown(reason::NO_PROBE_POD, format!("Cannot probe: {why}.")))?;
    let namespaces = verdict::plan_namespaces(compiled, contexts, exclusions, earlier);
    if namespaces.is_empty() {
        return Err(Judgement::unknown(
            reason::NO_NAMESPACE,
            "No existing namespace is selected by this policy (kube-system, kube-node-lease and \
             Splice's own namespace never are), so there is nothing to probe."
                .to_owned(),
        ));
    }
    Ok(shared.probe(compiled, &namespaces, &labels).await)
}

/// (policy, injected container) of every other served policy, to tell whose content a refusal
/// names. Only built when a probe was refused.
fn others(served: &splice_server::store::PolicyStore, name: &str) -> Vec<(String, String)> {
    served
        .names()
        .into_iter()
        // A canary's entry (`<policy>@canary`) is the same policy's.
        .filter(|n| n != name && !n.contains('@'))
        .filter_map(|n| served.get(&n).map(|c| (n, c)))
        .flat_map(|(n, c)| {
            verdict::injected_containers(&c)
                .into_iter()
                .map(move |container| (n.clone(), container))
        })
        .collect()
}

/// Whether the status (or what this replica last wrote) still carries the probe's results.
fn has_probe_results(status: Option<&InjectionPolicyStatus>, written: Option<&Written>) -> bool {
    written.is_some()
        || status.is_some_and(|s| {
            s.probe.is_some() || s.conditions.iter().any(|c| c.type_ == condition::VERIFIED)
        })
}

/// The status to compare with: the cached one, with what this replica wrote last when the cache
/// has not caught up with it yet.
fn known_status(policy: &InjectionPolicy, written: Option<&Written>) -> InjectionPolicyStatus {
    let mut status = policy.status.clone().unwrap_or_default();
    if let Some((uid, c, p)) = written
        && uid == &policy.uid()
        && status.probe.as_ref() != Some(p)
    {
        status.conditions.retain(|x| x.type_ != condition::VERIFIED);
        status.conditions.push(c.clone());
        status.probe = Some(p.clone());
    }
    status
}

/// Applies the Verified condition and `status.probe` unless the status already says `j`. Returns
/// what was written and the Verified condition before.
async fn write(
    api: &Api<InjectionPolicy>,
    policy: &InjectionPolicy,
    j: &Judgement,
    window: &Window,
    written: Option<&Written>,
) -> Result<Option<(Condition, ProbeStatus, Option<Condition>)>, kube::Error> {
    let current = known_status(policy, written);
    let generation = policy.metadata.generation;
    if verdict::already_reported(Some(&current), generation, j) {
        return Ok(None);
    }
    let before = current
        .conditions
        .iter()
        .find(|c| c.type_ == condition::VERIFIED)
        .cloned();
    let (verified, probe) =
        verdict::probe_status(Some(&current), generation, j, window, Timestamp::now());
    let patch = serde_json::json!({
        "apiVersion": InjectionPolicy::api_version(&()),
        "kind": InjectionPolicy::kind(&()),
        "status": {"conditions": [&verified], "probe": &probe},
    });
    api.patch_status(
        &policy.name_any(),
        &PatchParams::apply(PROBE_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    tracing::info!(policy = %policy.name_any(), result = j.reason, namespaces = ?j.namespaces, "admission probe: result changed");
    Ok(Some((verified, probe, before)))
}

async fn warn(recorder: &Recorder, policy: &InjectionPolicy, j: &Judgement) {
    let note = crate::policy::error::truncate(j.message(), 1000);
    let ev = Event {
        type_: EventType::Warning,
        reason: j.reason.to_owned(),
        note: Some(note),
        action: "ProbeAdmission".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, &policy.object_ref(&())).await {
        tracing::warn!(policy = %policy.name_any(), error = %e, "could not publish the probe's Event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

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
}
