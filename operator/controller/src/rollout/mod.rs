//! The rollout: template changes reach running pods. For every policy with `spec.rollout`, the
//! leader restarts the Deployments, StatefulSets and DaemonSets whose pods carry an outdated
//! injection (or, with `repairMissed`, miss it), under the budget [`plan`] decides, by
//! server-side applying two pod-template annotations under its own field manager; it reports
//! `status.rollout`, the `RolledOut` condition, `splice_rollout_workloads` and Events.
//!
//! Crash-resumable by construction: the restart annotation names `<policy>@<revision>`, so a new
//! leader sees what the last one restarted (and when, for the timeout) and never restarts a
//! workload twice for one revision; a halted rollout is kept in `status.rollout`.

pub mod inplace;
pub mod plan;
pub mod pods;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetStatus, Deployment, DeploymentStatus, StatefulSet, StatefulSetStatus,
};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use splice_crds::{
    ConditionStatus, InjectionPolicy, RESTARTED_AT_ANNOTATION, RESTARTED_FOR_ANNOTATION,
    ROLLOUT_HALT_ANNOTATION, ROLLOUT_PROMOTE_ANNOTATION, ROLLOUT_RESUME_ANNOTATION, RolloutPhase,
    RolloutStatus, RolloutStrategy, STATUS_ANNOTATION, StableRevision, condition, set_condition,
};
use splice_engine::Exclusions;
use splice_engine::entry::CanaryScope;
use splice_engine::selector::Selector;

use self::plan::{
    InPlaceProof, Kind, Limits, PodNeed, PodNeeding, PodPath, PodRef, PolicyInput, Progress,
    Updating, Workload, WorkloadRef,
};
use self::pods::{Resized, Sorted};
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::policy::in_force;
use crate::view::{self, LeaderView, PodState, Policies};

pub use crate::status::ROLLOUT_MANAGER;
/// One planning pass at most this often.
pub const PERIOD: Duration = Duration::from_secs(5);
/// Progress (counts) is written to status at most this often per policy; a phase change is
/// written at once.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(10);
/// `splice run --rollout-max-concurrent`'s default: workloads restarting at once, all policies.
pub const DEFAULT_MAX_CONCURRENT: usize = 10;
/// `spec.rollout.timeout` when it cannot be read (the schema refuses such a value at apply).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// What can go wrong in one rollout step, each with a stable label for the logs.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Error {
    #[error("restarting {workload}: {source}")]
    Restart {
        workload: String,
        source: kube::Error,
    },
    #[error("dry-run of a pod of {workload}: {source}")]
    DryRun {
        workload: String,
        source: kube::Error,
    },
    #[error(
        "a dry-run pod of {workload} came back with {got} instead of revision {revision}: the webhook is not serving it yet"
    )]
    NotServedYet {
        workload: String,
        revision: String,
        got: String,
    },
    #[error("writing status.rollout of policy {policy}: {source}")]
    Status { policy: String, source: kube::Error },
}

impl Error {
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

/// The rollout's settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub splice_namespace: String,
    /// Cluster-wide cap on workloads restarting at once.
    pub max_concurrent: usize,
}

/// The workload caches, each a reflector of the term.
struct Caches {
    deployments: Store<Deployment>,
    statefulsets: Store<StatefulSet>,
    daemonsets: Store<DaemonSet>,
    budgets: Store<PodDisruptionBudget>,
}

/// What this replica restarted, until its cache shows it: (restartedFor, restartedAt).
type Written = HashMap<WorkloadRef, (String, Timestamp)>;

/// The leader's rollout loop; a task of the term, cancelled with it.
pub async fn run(
    client: Client,
    config: Config,
    policies: Policies,
    observed: LeaderView,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    leading: Leadership,
) {
    let (deployments, w1) = reflector::store::<Deployment>();
    let (statefulsets, w2) = reflector::store::<StatefulSet>();
    let (daemonsets, w3) = reflector::store::<DaemonSet>();
    let (budgets, w4) = reflector::store::<PodDisruptionBudget>();
    // The watches run inside this task, so ending the term ends them too.
    let watches = futures::future::join4(
        reflect(Api::<Deployment>::all(client.clone()), w1),
        reflect(Api::<StatefulSet>::all(client.clone()), w2),
        reflect(Api::<DaemonSet>::all(client.clone()), w3),
        reflect(Api::<PodDisruptionBudget>::all(client.clone()), w4),
    );
    let caches = Caches {
        deployments,
        statefulsets,
        daemonsets,
        budgets,
    };
    let work = Loop {
        client,
        config,
        metrics,
        recorder,
        leading,
        written: Written::new(),
        verified: HashSet::new(),
        reported: HashMap::new(),
        paths: HashMap::new(),
        proofs: HashMap::new(),
        written_pods: HashMap::new(),
        resizing: HashMap::new(),
    }
    .run(policies, observed, caches);
    tokio::select! {
        _ = watches => {}
        _ = work => {}
    }
}

async fn reflect<K>(api: Api<K>, writer: reflector::store::Writer<K>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|o| o.managed_fields_mut().clear())
        .reflect(writer)
        .for_each(|event| async move {
            if let Err(e) = event {
                tracing::warn!(error = %e, "rollout: watching workloads");
            }
        })
        .await;
}

struct Loop {
    client: Client,
    config: Config,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    leading: Leadership,
    written: Written,
    /// (policy, revision, namespace) where a dry-run pod came back injected with the revision.
    verified: HashSet<(String, String, String)>,
    /// Per policy: (uid, status.rollout written, when), until the cache shows it.
    reported: HashMap<String, (Option<String>, RolloutStatus, Instant)>,
    /// Per outdated pod: its change's path as last sorted, so a pod is read in full once per
    /// revision rather than every pass.
    paths: HashMap<PodRef, Sorted>,
    /// Per pod updated in place: (revision, proof) as last read; a proven pod is not read again.
    proofs: HashMap<PodRef, (String, InPlaceProof)>,
    /// Pods this replica updated in place, until the cache shows it: (policy, revision, when).
    written_pods: HashMap<PodRef, (String, String, Timestamp)>,
    /// Pods resized and waiting for the kubelet before their record is written.
    resizing: HashMap<PodRef, (String, String, Timestamp)>,
}

/// How many outdated pods one pass reads in full to sort, at most (the rest wait a pass).
const SORT_PER_PASS: usize = 500;
/// Pods read at once.
const READS_IN_FLIGHT: usize = 16;

/// One policy's inputs, owned, so the planner's input can borrow them.
struct Candidate {
    policy: Arc<InjectionPolicy>,
    compiled: Arc<splice_engine::CompiledPolicy>,
    /// What its current pods carry: template hash and `valuesFrom` data digests.
    revision: String,
    limits: Limits,
    /// A halt recorded in status, not lifted by a resume: (by, at).
    halt: Option<(String, Option<Timestamp>)>,
    held: bool,
    resumed_at: Option<Timestamp>,
    /// The open canary's selectors, namespace and object.
    canary: Option<CanaryScope>,
    promote_requested: bool,
    /// The promoted revision the status keeps.
    stable: Option<StableRevision>,
    strategy: RolloutStrategy,
}

impl Loop {
    async fn run(mut self, policies: Policies, observed: LeaderView, caches: Caches) {
        let Policies {
            cache: policies,
            mut listed,
            webhook_policies: served,
        } = policies;
        if listed.wait_for(|l| *l).await.is_err() {
            return;
        }
        for ready in [
            caches.deployments.wait_until_ready().await,
            caches.statefulsets.wait_until_ready().await,
            caches.daemonsets.wait_until_ready().await,
            caches.budgets.wait_until_ready().await,
        ] {
            if ready.is_err() {
                return;
            }
        }
        let exclusions = Exclusions::default_for(&self.config.splice_namespace);
        let mut ticker = tokio::time::interval(PERIOD);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let (pods_synced, pods) = {
                let p = observed.pods.lock().unwrap_or_else(PoisonError::into_inner);
                (p.synced, p.snapshot())
            };
            let (ns_synced, contexts) = {
                let n = observed
                    .namespaces
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                (n.synced, n.contexts.clone())
            };
            if !pods_synced || !ns_synced {
                continue;
            }
            let mut candidates: Vec<Candidate> = policies
                .state()
                .into_iter()
                .filter_map(|policy| {
                    let rollout = policy.spec.rollout.as_ref()?;
                    if policy.spec.paused {
                        return None;
                    }
                    // The generation this replica's webhook serves: what new pods get.
                    let compiled = in_force::in_force_of(&served, &policy.name_any())?;
                    let revision = view::revision(&compiled);
                    let canary = in_force::open_canary(&policy, compiled.template_hash())
                        .map(|(c, _)| CanaryScope::of(c));
                    let stable = in_force::stable(&policy).cloned();
                    let annotations = policy.annotations();
                    let resumed_at = annotations
                        .get(ROLLOUT_RESUME_ANNOTATION)
                        .and_then(|v| v.split_once('@'))
                        .filter(|(r, _)| *r == revision)
                        .and_then(|(_, at)| at.parse::<Timestamp>().ok());
                    let held = annotations.contains_key(ROLLOUT_HALT_ANNOTATION);
                    let promote_requested = annotations
                        .get(ROLLOUT_PROMOTE_ANNOTATION)
                        .is_some_and(|h| h == compiled.template_hash());
                    // A halt recorded in status holds until a resume requested after it.
                    let halt = policy
                        .status
                        .as_ref()
                        .and_then(|s| s.rollout.as_ref())
                        .filter(|r| r.phase == RolloutPhase::Halted && r.revision == revision)
                        .and_then(|r| {
                            let at = r.halted_at.as_deref().and_then(|t| t.parse().ok());
                            let lifted = match (at, resumed_at) {
                                (Some(at), Some(resumed)) => resumed > at,
                                (None, Some(_)) => true,
                                _ => false,
                            };
                            let by = r.halted_by.clone()?;
                            // A requested halt is the annotation's; it ends with it.
                            (!lifted && by != plan::HALT_REQUESTED).then_some((by, at))
                        });
                    let limits = Limits {
                        max_concurrent: usize::try_from(rollout.max_concurrent).unwrap_or(1),
                        max_per_namespace: usize::try_from(rollout.max_concurrent_per_namespace)
                            .unwrap_or(1),
                        timeout: rollout.timeout().unwrap_or(DEFAULT_TIMEOUT),
                        repair_missed: rollout.repair_missed,
                    };
                    let strategy = rollout.strategy;
                    Some(Candidate {
                        policy,
                        compiled,
                        revision,
                        limits,
                        halt,
                        held,
                        resumed_at,
                        canary,
                        promote_requested,
                        stable,
                        strategy,
                    })
                })
                .collect();
            candidates.sort_by_key(|c| c.policy.name_any());
            let gone: Vec<String> = self
                .reported
                .keys()
                .filter(|name| !candidates.iter().any(|c| &c.policy.name_any() == *name))
                .cloned()
                .collect();
            for name in gone {
                self.reported.remove(&name);
            }
            if candidates.is_empty() {
                self.metrics.set_rollout(HashMap::new());
                continue;
            }
            let names: Vec<String> = candidates.iter().map(|c| c.policy.name_any()).collect();
            self.sort_and_prove(&candidates, &names, &pods, &contexts, &exclusions)
                .await;
            let inputs: Vec<PolicyInput<'_>> = candidates
                .iter()
                .zip(&names)
                .map(|(c, name)| PolicyInput {
                    policy: name,
                    revision: &c.revision,
                    limits: c.limits,
                    halted_by: c.halt.as_ref().map(|(by, _)| by.as_str()),
                    halted_at: c.halt.as_ref().and_then(|(_, at)| *at),
                    held: c.held,
                    resumed_at: c.resumed_at,
                    pods: view::classify(
                        &c.compiled,
                        view::in_force_since(&c.policy),
                        &contexts,
                        &exclusions,
                        pods.iter().map(|p| &**p),
                    )
                    .filter_map(|(pod, state)| {
                        let need = match state {
                            PodState::Current => return None,
                            PodState::Outdated => PodNeed::Outdated,
                            PodState::Missed => PodNeed::Missed,
                        };
                        if self.in_flight(name, &c.revision, pod).is_some() {
                            return None;
                        }
                        Some(PodNeeding {
                            namespace: &pod.namespace,
                            name: &pod.name,
                            labels: &pod.labels,
                            owner: pod.owner,
                            need,
                            in_canary: in_canary(c, &contexts, pod),
                            path: self.path_of(c, pod),
                        })
                    })
                    .collect(),
                    canary: c.canary.is_some(),
                    promote_requested: c.promote_requested,
                    strategy: c.strategy,
                    updating: self.updating(c, name, &contexts, &exclusions, &pods),
                })
                .collect();
            let workloads = self.workloads(&caches);
            let mut plans = plan::plan(
                &inputs,
                &workloads,
                &exclusions.namespaces,
                self.config.max_concurrent,
                Timestamp::now(),
            );
            for (plan, c) in plans.iter_mut().zip(&candidates) {
                pin(plan, c);
            }
            let gauges = plans
                .iter()
                .map(|p| {
                    let s = &p.status;
                    (
                        p.policy.clone(),
                        [
                            s.outdated,
                            s.restarting,
                            s.done,
                            s.failed,
                            s.manual,
                            i64::from(s.phase == RolloutPhase::Halted),
                        ],
                    )
                })
                .collect();
            self.metrics.set_rollout(gauges);
            for (plan, c) in plans.into_iter().zip(&candidates) {
                if !self.leading.now() {
                    return;
                }
                self.act(&plan, &caches, &c.policy).await;
                let updated = self.update_planned(&plan, c, &contexts, &exclusions).await;
                if let Some(note) = plan::updated_note(&plan.policy, &plan.revision, &updated) {
                    publish(
                        &self.recorder,
                        &c.policy,
                        EventType::Normal,
                        "UpdatedInPlace",
                        note,
                    )
                    .await;
                }
                let reported = self.report(&plan, &c.policy, &caches).await;
                if plan.promote && reported {
                    let note = format!(
                        "Promoted revision {} of policy {}: {}; the rest of the cluster now rolls to it",
                        c.compiled.template_hash(),
                        plan.policy,
                        if c.promote_requested {
                            "promotion requested"
                        } else {
                            "every canary workload is fully available on it"
                        }
                    );
                    publish(
                        &self.recorder,
                        &c.policy,
                        EventType::Normal,
                        "Promoted",
                        note,
                    )
                    .await;
                }
            }
        }
    }

    /// The path the planner reads for an outdated pod: `Restart` under that strategy, else
    /// what the last sorting found for this revision and the version the pod carries.
    fn path_of(&self, c: &Candidate, pod: &view::PodRecord) -> PodPath {
        if c.strategy == RolloutStrategy::Restart {
            return PodPath::Restart;
        }
        let recorded = pod.recorded_hash(&c.policy.name_any()).unwrap_or_default();
        self.paths
            .get(&pod_ref(pod))
            .filter(|s| s.revision == c.revision && s.recorded == recorded)
            .map_or(PodPath::Unsorted, |s| s.path)
    }

    /// When the pod was updated (or resized) in place for `revision`, by the record on it or
    /// by this replica's own write the cache does not show yet.
    fn in_flight(
        &self,
        policy: &str,
        revision: &str,
        pod: &view::PodRecord,
    ) -> Option<Option<Timestamp>> {
        if let Some(at) = pod.updated_in_place(policy, revision) {
            return Some(at);
        }
        let key = pod_ref(pod);
        [&self.written_pods, &self.resizing]
            .into_iter()
            .filter_map(|m| m.get(&key))
            .find(|(p, r, _)| p == policy && r == revision)
            .map(|(_, _, at)| Some(*at))
    }

    /// The policy's pods updated in place for its revision, with their proofs as last read.
    fn updating<'v>(
        &self,
        c: &'v Candidate,
        name: &str,
        contexts: &'v HashMap<String, splice_engine::NamespaceContext>,
        exclusions: &'v Exclusions,
        pods: &'v [Arc<view::PodRecord>],
    ) -> Vec<Updating<'v>> {
        if c.strategy == RolloutStrategy::Restart {
            return Vec::new();
        }
        view::classify(
            &c.compiled,
            None,
            contexts,
            exclusions,
            pods.iter().map(|p| &**p),
        )
        .filter_map(|(pod, _)| {
            let at = self.in_flight(name, &c.revision, pod)?;
            let key = pod_ref(pod);
            let proof = self
                .proofs
                .get(&key)
                .filter(|(r, _)| *r == c.revision)
                .map_or_else(
                    || InPlaceProof::Waiting("not read yet".into()),
                    |(_, p)| p.clone(),
                );
            Some(Updating {
                pod: key,
                at,
                proof,
                in_canary: in_canary(c, contexts, pod),
                namespace: &pod.namespace,
            })
        })
        .collect()
    }

    /// Reads in full the outdated pods not sorted yet for their policy's revision and sorts
    /// them with the engine; reads the pods updated in place whose proof is not in yet, and
    /// finishes the resizes the kubelet has made (their record) or refused (a restart then).
    async fn sort_and_prove(
        &mut self,
        candidates: &[Candidate],
        names: &[String],
        pods: &[Arc<view::PodRecord>],
        contexts: &HashMap<String, splice_engine::NamespaceContext>,
        exclusions: &Exclusions,
    ) {
        use futures::stream::{self, StreamExt as _};
        // Forget own writes once the cache shows them, and pods gone.
        let live: HashSet<PodRef> = pods.iter().map(|p| pod_ref(p)).collect();
        self.paths.retain(|k, _| live.contains(k));
        self.proofs.retain(|k, _| live.contains(k));
        self.resizing.retain(|k, _| live.contains(k));
        self.written_pods.retain(|k, (policy, revision, _)| {
            pods.iter()
                .find(|p| &pod_ref(p) == k)
                .is_some_and(|p| p.updated_in_place(policy, revision).is_none())
        });
        let mut to_sort = Vec::new();
        let mut to_prove = Vec::new();
        for (i, (c, name)) in candidates.iter().zip(names).enumerate() {
            if c.strategy == RolloutStrategy::Restart {
                continue;
            }
            let since = view::in_force_since(&c.policy);
            for (pod, state) in view::classify(
                &c.compiled,
                since,
                contexts,
                exclusions,
                pods.iter().map(|p| &**p),
            ) {
                let key = pod_ref(pod);
                if self.in_flight(name, &c.revision, pod).is_some() {
                    let proven = self
                        .proofs
                        .get(&key)
                        .is_some_and(|(r, p)| *r == c.revision && *p == InPlaceProof::Done);
                    if !proven {
                        to_prove.push((i, key));
                    }
                } else if state == PodState::Outdated
                    && self.path_of(c, pod) == PodPath::Unsorted
                    && to_sort.len() < SORT_PER_PASS
                {
                    let recorded = pod.recorded_hash(name).unwrap_or_default().to_owned();
                    to_sort.push((i, recorded, key));
                }
            }
        }
        let client = self.client.clone();
        let sorted: Vec<_> = stream::iter(to_sort)
            .map(|(i, recorded, key)| {
                let client = client.clone();
                async move {
                    let pod = pods::read(&client, &key).await;
                    (i, recorded, key, pod)
                }
            })
            .buffer_unordered(READS_IN_FLIGHT)
            .collect()
            .await;
        for (i, recorded, key, pod) in sorted {
            let c = &candidates[i];
            let pod = match pod {
                Ok(Some(pod)) => pod,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, label = e.label(), "rollout: not sorted");
                    continue;
                }
            };
            let ns = namespace_context(contexts, &key.namespace);
            match pods::sort(&c.compiled, &pod, &ns, exclusions) {
                Ok(change) => {
                    tracing::debug!(pod = %key, path = %change.path, "rollout: sorted");
                    self.paths
                        .insert(key, Sorted::of(&c.revision, &recorded, &change.path));
                }
                Err(message) => {
                    let e = pods::PodError::Sort { pod: key, message };
                    tracing::warn!(error = %e, label = e.label(), "rollout: not sorted");
                }
            }
        }
        let proofs: Vec<_> = stream::iter(to_prove)
            .map(|(i, key)| {
                let client = client.clone();
                async move {
                    let pod = pods::read(&client, &key).await;
                    (i, key, pod)
                }
            })
            .buffer_unordered(READS_IN_FLIGHT)
            .collect()
            .await;
        for (i, key, pod) in proofs {
            let (c, name) = (&candidates[i], names[i].as_str());
            match pod {
                Ok(Some(pod)) => self.prove(c, name, key, &pod, contexts, exclusions).await,
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, label = e.label(), "rollout: no proof read"),
            }
        }
    }

    /// Reads the proof of an in-place update on `pod`; a resize the kubelet made gets its
    /// record now, one it refused sends the pod to a restart.
    async fn prove(
        &mut self,
        c: &Candidate,
        name: &str,
        key: PodRef,
        pod: &Pod,
        contexts: &HashMap<String, splice_engine::NamespaceContext>,
        exclusions: &Exclusions,
    ) {
        if self.resizing.contains_key(&key) {
            match pods::resized(pod) {
                Resized::Waiting(why) => {
                    self.proofs
                        .insert(key, (c.revision.clone(), InPlaceProof::Waiting(why)));
                }
                Resized::Infeasible(why) => {
                    tracing::info!(pod = %key, reason = %why, "rollout: resize infeasible; the pod's workload restarts instead");
                    self.resizing.remove(&key);
                    // Keyed by the version the pod still carries, so it is not sorted again
                    // (its spec now holds the new resources, which would read as no change).
                    let recorded = recorded_version(pod, name);
                    self.paths.insert(
                        key,
                        Sorted {
                            revision: c.revision.clone(),
                            recorded,
                            path: PodPath::Restart,
                            why: format!(
                                "restart: the kubelet reports the resize Infeasible ({why})"
                            ),
                        },
                    );
                }
                Resized::Done => {
                    // The record, now that the kubelet made the resize.
                    let ns = namespace_context(contexts, &key.namespace);
                    if let Ok(change) = pods::sort(&c.compiled, pod, &ns, exclusions)
                        && change.path.in_place()
                        && !matches!(change.path, splice_engine::change::Path::Resize(_))
                        && self.leading.now()
                    {
                        match pods::write(&self.client, &key, pod, &change, name, &c.revision).await
                        {
                            Ok(()) => {
                                self.resizing.remove(&key);
                                self.written_pods.insert(
                                    key,
                                    (name.to_owned(), c.revision.clone(), Timestamp::now()),
                                );
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, label = e.label(), "rollout: record after resize")
                            }
                        }
                    }
                }
            }
            return;
        }
        let markers = inplace::markers(pod.metadata.annotations.as_ref());
        let proof = match markers.get(name).filter(|m| m.revision == c.revision) {
            Some(m) => match inplace::proof(pod, m) {
                inplace::Proof::Done => InPlaceProof::Done,
                inplace::Proof::Waiting(w) => InPlaceProof::Waiting(w),
                inplace::Proof::Broken(b) => InPlaceProof::Broken(b),
            },
            None => InPlaceProof::Waiting("the update is not on the pod yet".into()),
        };
        self.proofs.insert(key, (c.revision.clone(), proof));
    }

    /// Updates the planned pods in place, each read again and sorted again first (a pod changed
    /// since is decided again, never overwritten), after a last leadership check. Returns the
    /// pods written.
    async fn update_planned(
        &mut self,
        plan: &plan::Plan,
        c: &Candidate,
        contexts: &HashMap<String, splice_engine::NamespaceContext>,
        exclusions: &Exclusions,
    ) -> Vec<PodRef> {
        let mut updated = Vec::new();
        for id in &plan.update {
            let pod = match pods::read(&self.client, id).await {
                Ok(Some(pod)) => pod,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, label = e.label(), "rollout: not updated");
                    continue;
                }
            };
            let ns = namespace_context(contexts, &id.namespace);
            let change = match pods::sort(&c.compiled, &pod, &ns, exclusions) {
                Ok(change) => change,
                Err(message) => {
                    let e = pods::PodError::Sort {
                        pod: id.clone(),
                        message,
                    };
                    tracing::warn!(error = %e, label = e.label(), "rollout: not updated");
                    continue;
                }
            };
            if !change.path.in_place() {
                let recorded = recorded_version(&pod, &plan.policy);
                self.paths
                    .insert(id.clone(), Sorted::of(&c.revision, &recorded, &change.path));
                continue;
            }
            if !self.leading.now() {
                break;
            }
            match pods::write(
                &self.client,
                id,
                &pod,
                &change,
                &plan.policy,
                &plan.revision,
            )
            .await
            {
                Ok(()) => {
                    tracing::info!(policy = %plan.policy, pod = %id, path = %change.path, "rollout: updated in place");
                    let entry = (plan.policy.clone(), plan.revision.clone(), Timestamp::now());
                    if matches!(change.path, splice_engine::change::Path::Resize(_)) {
                        self.resizing.insert(id.clone(), entry);
                    } else {
                        self.written_pods.insert(id.clone(), entry);
                    }
                    updated.push(id.clone());
                }
                Err(e) => {
                    if e.stale() {
                        self.paths.remove(id);
                    }
                    tracing::warn!(error = %e, label = e.label(), "rollout: not updated");
                }
            }
        }
        updated
    }

    /// Every workload as the planner sees it, with this replica's own restarts laid over a
    /// cache that may not show them yet.
    fn workloads(&mut self, caches: &Caches) -> Vec<Workload> {
        let budgets = caches.budgets.state();
        let mut out = Vec::new();
        collect(&caches.deployments, &budgets, &mut out);
        collect(&caches.statefulsets, &budgets, &mut out);
        collect(&caches.daemonsets, &budgets, &mut out);
        // Forget a restart once the cache shows it (or the workload is gone).
        self.written.retain(|id, (value, _)| {
            out.iter()
                .find(|w| &w.id == id)
                .is_some_and(|w| w.restarted_for.as_ref() != Some(value))
        });
        for w in &mut out {
            if let Some((value, at)) = self.written.get(&w.id) {
                w.restarted_for = Some(value.clone());
                w.restarted_at = Some(*at);
                w.settled = false;
            }
        }
        out
    }

    /// Restarts what the plan says, each after a last leadership check; before the first
    /// restart of a revision into a namespace, a dry-run pod must come back with that revision.
    async fn act(&mut self, plan: &plan::Plan, caches: &Caches, policy: &InjectionPolicy) {
        let mut restarted = Vec::new();
        self.restart_planned(plan, caches, &mut restarted).await;
        // One Event per pass, naming every workload it restarted.
        if let Some(note) = plan::restarted_note(&plan.policy, &plan.revision, &restarted) {
            publish(&self.recorder, policy, EventType::Normal, "Restarted", note).await;
        }
    }

    /// Restarts what the plan says, each after a last leadership check; what it restarted goes
    /// into `restarted`.
    async fn restart_planned(
        &mut self,
        plan: &plan::Plan,
        caches: &Caches,
        restarted: &mut Vec<WorkloadRef>,
    ) {
        for id in &plan.restart {
            let Some(template) = template_of(caches, id) else {
                continue;
            };
            let key = (
                plan.policy.clone(),
                plan.revision.clone(),
                id.namespace.clone(),
            );
            if !self.verified.contains(&key) {
                match dry_run(&self.client, id, &template, &plan.policy, &plan.revision).await {
                    Ok(()) => {
                        self.verified.insert(key);
                    }
                    Err(e) => {
                        tracing::warn!(policy = %plan.policy, error = %e, label = e.label(), "rollout: not restarting yet");
                        continue;
                    }
                }
            }
            if !self.leading.now() {
                return;
            }
            let value = plan::restarted_for(&plan.policy, &plan.revision);
            let now = Timestamp::now();
            match restart(&self.client, id, &value, now).await {
                Ok(()) => {
                    tracing::info!(policy = %plan.policy, workload = %id, revision = %plan.revision, "rollout: restarted");
                    self.written.insert(id.clone(), (value, now));
                    restarted.push(id.clone());
                }
                Err(e) => {
                    tracing::warn!(policy = %plan.policy, error = %e, label = e.label(), "rollout: restart failed");
                }
            }
        }
    }

    /// Writes `status.rollout` and `RolledOut` when they changed: a phase change at once,
    /// progress at most every [`STATUS_INTERVAL`]; a Warning Event when the rollout halts.
    /// True when the status says what the plan does (written now or before).
    async fn report(
        &mut self,
        plan: &plan::Plan,
        policy: &InjectionPolicy,
        caches: &Caches,
    ) -> bool {
        let name = policy.name_any();
        let cached = policy.status.as_ref().and_then(|s| s.rollout.clone());
        let (known, last_write) = match self.reported.get(&name) {
            Some((uid, s, at)) if uid == &policy.uid() && cached.as_ref() != Some(s) => {
                (Some(s.clone()), Some(*at))
            }
            Some((_, _, at)) => (cached, Some(*at)),
            None => (cached, None),
        };
        if known.as_ref() == Some(&plan.status) {
            return true;
        }
        let phase_changed = known.as_ref().map(|s| (s.phase, &s.revision, &s.stable))
            != Some((
                plan.status.phase,
                &plan.status.revision,
                &plan.status.stable,
            ));
        if !phase_changed && last_write.is_some_and(|at| at.elapsed() < STATUS_INTERVAL) {
            return false;
        }
        if !self.leading.now() {
            return false;
        }
        let mut conditions = policy
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let (status, reason, message) = rolled_out(&plan.status);
        set_condition(
            &mut conditions,
            condition::ROLLED_OUT,
            status,
            reason,
            &message,
            policy.metadata.generation,
            Timestamp::now(),
        );
        let rolled = conditions
            .into_iter()
            .filter(|c| c.type_ == condition::ROLLED_OUT)
            .collect::<Vec<_>>();
        let patch = serde_json::json!({
            "apiVersion": InjectionPolicy::api_version(&()),
            "kind": InjectionPolicy::kind(&()),
            "status": {"conditions": rolled, "rollout": &plan.status},
        });
        let api: Api<InjectionPolicy> = Api::all(self.client.clone());
        if let Err(source) = api
            .patch_status(
                &name,
                &PatchParams::apply(ROLLOUT_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            let e = Error::Status {
                policy: name,
                source,
            };
            tracing::warn!(error = %e, label = e.label(), "rollout: status not written");
            return false;
        }
        self.reported.insert(
            name.clone(),
            (policy.uid(), plan.status.clone(), Instant::now()),
        );
        let timeout = policy
            .spec
            .rollout
            .as_ref()
            .and_then(|r| r.timeout())
            .unwrap_or(DEFAULT_TIMEOUT);
        if let Some((pod, why)) = &plan.newly_failed_pod {
            let note = format!(
                "Rollout of revision {} halted: the in-place update of {pod} was not proven within {}s: {why}. Nothing more is changed until the template changes or `kubectl splice rollout resume`; `kubectl splice rollout undo` puts the earlier images back on the pods this revision updated.",
                plan.revision,
                timeout.as_secs(),
            );
            publish(
                &self.recorder,
                policy,
                EventType::Warning,
                "RolloutHalted",
                note,
            )
            .await;
        }
        let newly_blocked =
            known.as_ref().map_or(0, |k| k.not_in_place) != plan.status.not_in_place;
        if newly_blocked
            && let Some(note) = plan::not_in_place_note(&name, &plan.revision, &plan.not_in_place)
        {
            publish(
                &self.recorder,
                policy,
                EventType::Warning,
                "NeedsRestart",
                note,
            )
            .await;
        }
        if let Some(failed) = &plan.newly_failed {
            let detail = match what_failed(&self.client, caches, failed, &name).await {
                Some(d) => format!(" ({d})"),
                None => String::new(),
            };
            let note = format!(
                "Rollout of revision {} halted: {failed} did not become fully available within {}s of its restart{detail}. Nothing more is restarted until the template changes or `kubectl splice rollout resume`.",
                plan.revision,
                timeout.as_secs(),
            );
            publish(
                &self.recorder,
                policy,
                EventType::Warning,
                "RolloutHalted",
                note,
            )
            .await;
        }
        true
    }
}

/// The version of `policy` the pod's record names (`view::version`), empty without one.
fn recorded_version(pod: &Pod, policy: &str) -> String {
    view::injected_versions(pod.metadata.annotations.as_ref())
        .into_iter()
        .find(|(p, _)| p == policy)
        .map(|(_, v)| v)
        .unwrap_or_default()
}

fn pod_ref(pod: &view::PodRecord) -> PodRef {
    PodRef {
        namespace: pod.namespace.to_string(),
        name: pod.name.clone(),
    }
}

fn in_canary(
    c: &Candidate,
    contexts: &HashMap<String, splice_engine::NamespaceContext>,
    pod: &view::PodRecord,
) -> bool {
    c.canary.as_ref().is_some_and(|scope| {
        let ns_labels = contexts.get(&*pod.namespace).map(|n| &n.labels);
        scope.holds(ns_labels, &pod.labels)
    })
}

/// The namespace as the engine sees it, from the view (its name alone when not seen yet).
fn namespace_context(
    contexts: &HashMap<String, splice_engine::NamespaceContext>,
    name: &str,
) -> splice_engine::NamespaceContext {
    contexts
        .get(name)
        .cloned()
        .unwrap_or_else(|| splice_engine::NamespaceContext {
            name: name.to_owned(),
            ..Default::default()
        })
}

/// Sets what the status keeps of the revisions: the promoted one stays while a canary is open and
/// becomes the one in force when it is promoted or when no canary is configured (so that a canary
/// added later pins it); the canary's while open.
fn pin(plan: &mut plan::Plan, c: &Candidate) {
    let open = c.canary.is_some() && !plan.promote;
    let current = || {
        Some(StableRevision {
            template_hash: c.compiled.template_hash().to_owned(),
            generation: c.compiled.generation(),
            spec: serde_json::to_value(c.compiled.spec()).ok()?,
        })
    };
    plan.status.stable = match &c.stable {
        Some(kept) if open => Some(kept.clone()),
        _ => current(),
    };
    plan.status.canary_revision = open.then(|| c.compiled.template_hash().to_owned());
}

/// The `RolledOut` condition for a rollout status: (status, reason, message).
pub fn rolled_out(s: &RolloutStatus) -> (ConditionStatus, &'static str, String) {
    let settled = matches!(s.phase, RolloutPhase::Idle | RolloutPhase::Complete);
    if s.not_in_place > 0 && settled {
        return (
            ConditionStatus::False,
            "NeedsRestart",
            format!(
                "revision {}: {} pod(s) need a restart, which strategy InPlace never does; {} pod(s) updated in place{}",
                s.revision,
                s.not_in_place,
                s.updated_in_place,
                manual_note(s.manual)
            ),
        );
    }
    match s.phase {
        RolloutPhase::Idle => (
            ConditionStatus::True,
            "NothingToRestart",
            format!("no workload needs a restart for revision {}", s.revision),
        ),
        RolloutPhase::Canary => (
            ConditionStatus::False,
            "Canary",
            format!(
                "revision {} is in canary: {} canary workload(s) restarting, {} done; every other pod keeps revision {} until the canary is healthy or `kubectl splice rollout promote`{}",
                s.canary_revision.as_deref().unwrap_or(&s.revision),
                s.restarting,
                s.done,
                s.stable
                    .as_ref()
                    .map_or("(none)", |st| st.template_hash.as_str()),
                manual_note(s.manual)
            ),
        ),
        RolloutPhase::Complete => (
            ConditionStatus::True,
            "Complete",
            format!(
                "{} workload(s) restarted for revision {} and fully available{}{}",
                s.done,
                s.revision,
                in_place_note(s),
                manual_note(s.manual)
            ),
        ),
        RolloutPhase::Rolling => (
            ConditionStatus::False,
            "Rolling",
            format!(
                "revision {}: {} restarting, {} waiting, {} done{}{}",
                s.revision,
                s.restarting,
                s.outdated,
                s.done,
                in_place_note(s),
                manual_note(s.manual)
            ),
        ),
        RolloutPhase::Halted if s.halted_by.as_deref() == Some(plan::HALT_REQUESTED) => (
            ConditionStatus::False,
            "Halted",
            format!(
                "revision {}: halted on request (annotation {ROLLOUT_HALT_ANNOTATION}); `kubectl splice rollout resume` continues",
                s.revision
            ),
        ),
        RolloutPhase::Halted
            if s.halted_by
                .as_deref()
                .is_some_and(|b| b.starts_with("Pod/")) =>
        {
            (
                ConditionStatus::False,
                "Halted",
                format!(
                    "revision {}: the in-place update of {} was not proven within the timeout; nothing more is changed until the template changes or `kubectl splice rollout resume` (`kubectl splice rollout undo` puts the earlier images back)",
                    s.revision,
                    s.halted_by.as_deref().unwrap_or("a pod")
                ),
            )
        }
        RolloutPhase::Halted => (
            ConditionStatus::False,
            "Halted",
            format!(
                "revision {}: {} did not become fully available within the timeout; nothing more is restarted until the template changes or `kubectl splice rollout resume`",
                s.revision,
                s.halted_by.as_deref().unwrap_or("a workload")
            ),
        ),
    }
}

fn in_place_note(s: &RolloutStatus) -> String {
    match (s.updating, s.updated_in_place) {
        (0, 0) => String::new(),
        (u, d) => format!("; in place: {u} updating, {d} updated"),
    }
}

fn manual_note(manual: i64) -> String {
    if manual == 0 {
        String::new()
    } else {
        format!(
            "; {manual} pod(s) no workload restart replaces (bare or Job pods) need recreating by hand"
        )
    }
}

/// What the rollout reads of a workload, the same for the three kinds it restarts.
struct Parts<'a> {
    selector: &'a LabelSelector,
    template: &'a PodTemplateSpec,
    progress: Progress,
    paused: bool,
}

/// A workload kind the rollout restarts through its pod template.
trait Restartable:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
    const KIND: Kind;
    /// `None` without a spec, or when a template change does not replace its pods (update
    /// strategy `OnDelete`): then its pods count as `manual`, rather than a restart that never
    /// settles and halts the rollout.
    fn parts(&self) -> Option<Parts<'_>>;
}

impl<'a> Parts<'a> {
    /// `counts`: pods desired, existing, of the latest template, available.
    fn new(
        meta: &ObjectMeta,
        selector: &'a LabelSelector,
        template: &'a PodTemplateSpec,
        observed_generation: Option<i64>,
        [desired, current, updated, available]: [i32; 4],
        paused: bool,
    ) -> Self {
        Parts {
            selector,
            template,
            progress: Progress {
                generation: meta.generation.unwrap_or(0),
                observed_generation: observed_generation.unwrap_or(0),
                desired,
                current,
                updated,
                available,
            },
            paused,
        }
    }
}

// Each kind names its own counts; reading them borrows the status rather than cloning it on
// every pass over every workload.
impl Restartable for Deployment {
    const KIND: Kind = Kind::Deployment;
    fn parts(&self) -> Option<Parts<'_>> {
        let spec = self.spec.as_ref()?;
        let s = self.status.as_ref();
        let n = |f: fn(&DeploymentStatus) -> Option<i32>| s.and_then(f).unwrap_or(0);
        Some(Parts::new(
            &self.metadata,
            &spec.selector,
            &spec.template,
            s.and_then(|s| s.observed_generation),
            [
                spec.replicas.unwrap_or(1),
                n(|s| s.replicas),
                n(|s| s.updated_replicas),
                n(|s| s.available_replicas),
            ],
            spec.paused.unwrap_or(false),
        ))
    }
}

/// Whether a workload's update strategy leaves its pods alone until someone deletes them.
fn on_delete(strategy: Option<&str>) -> bool {
    strategy == Some("OnDelete")
}

impl Restartable for StatefulSet {
    const KIND: Kind = Kind::StatefulSet;
    fn parts(&self) -> Option<Parts<'_>> {
        let spec = self.spec.as_ref()?;
        if on_delete(
            spec.update_strategy
                .as_ref()
                .and_then(|u| u.type_.as_deref()),
        ) {
            return None;
        }
        let s = self.status.as_ref();
        let n = |f: fn(&StatefulSetStatus) -> Option<i32>| s.and_then(f).unwrap_or(0);
        Some(Parts::new(
            &self.metadata,
            &spec.selector,
            &spec.template,
            s.and_then(|s| s.observed_generation),
            [
                spec.replicas.unwrap_or(1),
                n(|s| Some(s.replicas)),
                n(|s| s.updated_replicas),
                n(|s| s.available_replicas),
            ],
            false,
        ))
    }
}

impl Restartable for DaemonSet {
    const KIND: Kind = Kind::DaemonSet;
    fn parts(&self) -> Option<Parts<'_>> {
        let spec = self.spec.as_ref()?;
        if on_delete(
            spec.update_strategy
                .as_ref()
                .and_then(|u| u.type_.as_deref()),
        ) {
            return None;
        }
        let s = self.status.as_ref();
        let n = |f: fn(&DaemonSetStatus) -> Option<i32>| s.and_then(f).unwrap_or(0);
        Some(Parts::new(
            &self.metadata,
            &spec.selector,
            &spec.template,
            s.and_then(|s| s.observed_generation),
            [
                n(|s| Some(s.desired_number_scheduled)),
                n(|s| Some(s.current_number_scheduled)),
                n(|s| s.updated_number_scheduled),
                n(|s| s.number_available),
            ],
            false,
        ))
    }
}

fn collect<K: Restartable>(
    store: &Store<K>,
    budgets: &[Arc<PodDisruptionBudget>],
    out: &mut Vec<Workload>,
) {
    for object in store.state() {
        if let Some(parts) = object.parts() {
            out.push(workload(K::KIND, object.meta(), parts, budgets));
        }
    }
}

fn workload(
    kind: Kind,
    meta: &ObjectMeta,
    parts: Parts<'_>,
    budgets: &[Arc<PodDisruptionBudget>],
) -> Workload {
    let Parts {
        selector,
        template,
        progress,
        paused,
    } = parts;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let annotations = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref());
    let labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let disruption_blocked = budgets.iter().any(|b| {
        b.metadata.namespace.as_deref() == Some(namespace.as_str())
            && b.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|s| {
                    Selector::read(Some(s)).matches(|k| labels.get(k).map(String::as_str))
                })
            && b.status
                .as_ref()
                .is_some_and(|s| s.disruptions_allowed.unwrap_or(0) == 0)
    });
    Workload {
        id: WorkloadRef {
            kind,
            namespace,
            name: meta.name.clone().unwrap_or_default(),
        },
        selector: Selector::read(Some(selector)),
        restarted_for: annotations.and_then(|a| a.get(RESTARTED_FOR_ANNOTATION).cloned()),
        restarted_at: annotations
            .and_then(|a| a.get(RESTARTED_AT_ANNOTATION))
            .and_then(|t| t.parse().ok()),
        paused,
        settled: plan::settled(progress),
        disruption_blocked,
    }
}

fn template_of(caches: &Caches, id: &WorkloadRef) -> Option<PodTemplateSpec> {
    match id.kind {
        Kind::Deployment => template_in(&caches.deployments, id),
        Kind::StatefulSet => template_in(&caches.statefulsets, id),
        Kind::DaemonSet => template_in(&caches.daemonsets, id),
    }
}

fn template_in<K: Restartable>(store: &Store<K>, id: &WorkloadRef) -> Option<PodTemplateSpec> {
    let object = store.get(&reflector::ObjectRef::new(&id.name).within(&id.namespace))?;
    object.parts().map(|p| p.template.clone())
}

/// Server-side applies the restart annotations to the workload's pod template, under
/// [`ROLLOUT_MANAGER`] and without force: only these two fields become Splice's.
async fn restart(
    client: &Client,
    id: &WorkloadRef,
    restarted_for: &str,
    at: Timestamp,
) -> Result<(), Error> {
    let patch = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": id.kind.as_str(),
        "metadata": {"name": id.name, "namespace": id.namespace},
        "spec": {"template": {"metadata": {"annotations": {
            RESTARTED_AT_ANNOTATION: at.to_string(),
            RESTARTED_FOR_ANNOTATION: restarted_for,
        }}}},
    });
    let params = PatchParams::apply(ROLLOUT_MANAGER);
    let patch = Patch::Apply(&patch);
    let result = match id.kind {
        Kind::Deployment => apply_to::<Deployment>(client, id, &params, &patch).await,
        Kind::StatefulSet => apply_to::<StatefulSet>(client, id, &params, &patch).await,
        Kind::DaemonSet => apply_to::<DaemonSet>(client, id, &params, &patch).await,
    };
    result.map_err(|source| Error::Restart {
        workload: id.to_string(),
        source,
    })
}

async fn apply_to<K: Restartable>(
    client: &Client,
    id: &WorkloadRef,
    params: &PatchParams,
    patch: &Patch<&serde_json::Value>,
) -> Result<(), kube::Error> {
    Api::<K>::namespaced(client.clone(), &id.namespace)
        .patch(&id.name, params, patch)
        .await
        .map(drop)
}

/// A server-side dry-run create of a pod from the workload's template: right after the webhook
/// (re)starts, a pod can still be admitted uninjected under `Ignore`, and a restart then would
/// replace injected pods with bare ones.
async fn dry_run(
    client: &Client,
    id: &WorkloadRef,
    template: &PodTemplateSpec,
    policy: &str,
    revision: &str,
) -> Result<(), Error> {
    let mut meta = template.metadata.clone().unwrap_or_default();
    meta.name = None;
    meta.generate_name = Some("splice-rollout-check-".into());
    meta.namespace = Some(id.namespace.clone());
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(STATUS_ANNOTATION);
    }
    let pod = Pod {
        metadata: meta,
        spec: template.spec.clone(),
        status: None,
    };
    let params = PostParams {
        dry_run: true,
        field_manager: Some(ROLLOUT_MANAGER.into()),
    };
    let created = Api::<Pod>::namespaced(client.clone(), &id.namespace)
        .create(&params, &pod)
        .await
        .map_err(|source| Error::DryRun {
            workload: id.to_string(),
            source,
        })?;
    let injected = view::injected_versions(created.metadata.annotations.as_ref());
    match injected.iter().find(|(p, _)| p == policy) {
        Some((_, h)) if h == revision => Ok(()),
        other => Err(Error::NotServedYet {
            workload: id.to_string(),
            revision: revision.to_owned(),
            got: other.map_or_else(
                || "no injection".to_owned(),
                |(_, h)| format!("revision {h}"),
            ),
        }),
    }
}

/// Names a pod of the workload and an injected container of the policy's that is not ready or
/// restarting, when one can be seen.
async fn what_failed(
    client: &Client,
    caches: &Caches,
    id: &WorkloadRef,
    policy: &str,
) -> Option<String> {
    let template = template_of(caches, id)?;
    let labels = template.metadata.and_then(|m| m.labels)?;
    let selector = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods = Api::<Pod>::namespaced(client.clone(), &id.namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .ok()?;
    for pod in pods.items {
        let injected = injected_containers(pod.metadata.annotations.as_ref(), policy);
        let Some(status) = pod.status.as_ref() else {
            continue;
        };
        let statuses = status
            .container_statuses
            .iter()
            .flatten()
            .chain(status.init_container_statuses.iter().flatten());
        for c in statuses {
            if injected.contains(&c.name) && (!c.ready || c.restart_count > 0) {
                return Some(format!(
                    "pod {} container {} ready={} restarts={}",
                    pod.name_any(),
                    c.name,
                    c.ready,
                    c.restart_count
                ));
            }
        }
    }
    None
}

/// The containers and init containers `policy` injected, from `splice.dev/status`.
fn injected_containers(
    annotations: Option<&BTreeMap<String, String>>,
    policy: &str,
) -> Vec<String> {
    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Entry {
        #[serde(default)]
        containers: Vec<String>,
        #[serde(default)]
        init_containers: Vec<String>,
    }
    annotations
        .and_then(|a| a.get(STATUS_ANNOTATION))
        .and_then(|raw| serde_json::from_str::<BTreeMap<String, Entry>>(raw).ok())
        .and_then(|mut m| m.remove(policy))
        .map(|e| e.containers.into_iter().chain(e.init_containers).collect())
        .unwrap_or_default()
}

async fn publish(
    recorder: &Recorder,
    policy: &InjectionPolicy,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(crate::policy::error::truncate(note, 1000)),
        action: "Rollout".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, &policy.object_ref(&())).await {
        tracing::warn!(policy = %policy.name_any(), error = %e, "could not publish the {reason} Event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_updated_on_delete_is_not_restartable_so_its_pods_count_manual() {
        let set = |strategy: &str| -> StatefulSet {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "db", "namespace": "a"},
                "spec": {
                    "selector": {"matchLabels": {"app": "db"}},
                    "serviceName": "db",
                    "template": {"metadata": {"labels": {"app": "db"}}},
                    "updateStrategy": {"type": strategy},
                },
            }))
            .unwrap()
        };
        assert!(set("RollingUpdate").parts().is_some());
        assert!(set("OnDelete").parts().is_none());
        let daemons: DaemonSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "agent", "namespace": "a"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}}},
                "updateStrategy": {"type": "OnDelete"},
            },
        }))
        .unwrap();
        assert!(daemons.parts().is_none());
    }

    #[test]
    fn a_halted_rollout_reads_rolled_out_false_halted_naming_the_workload() {
        let s = RolloutStatus {
            revision: "r2".into(),
            phase: RolloutPhase::Halted,
            halted_by: Some("Deployment/a/w".into()),
            ..RolloutStatus::default()
        };
        let (status, reason, message) = rolled_out(&s);
        assert_eq!((status, reason), (ConditionStatus::False, "Halted"));
        assert!(message.contains("Deployment/a/w"), "{message}");
    }

    #[test]
    fn a_complete_rollout_reads_rolled_out_true_and_counts_manual_pods() {
        let s = RolloutStatus {
            revision: "r2".into(),
            phase: RolloutPhase::Complete,
            done: 3,
            manual: 2,
            ..RolloutStatus::default()
        };
        let (status, reason, message) = rolled_out(&s);
        assert_eq!((status, reason), (ConditionStatus::True, "Complete"));
        assert!(message.contains("2 pod(s)"), "{message}");
    }

    #[test]
    fn injected_containers_are_read_from_the_status_annotation() {
        let a: BTreeMap<String, String> = [(
            STATUS_ANNOTATION.to_owned(),
            r#"{"mesh":{"hash":"h","containers":["proxy"],"initContainers":["init"]},"x":{"containers":["y"]}}"#
                .to_owned(),
        )]
        .into();
        assert_eq!(injected_containers(Some(&a), "mesh"), ["proxy", "init"]);
        assert!(injected_containers(None, "mesh").is_empty());
    }
}
