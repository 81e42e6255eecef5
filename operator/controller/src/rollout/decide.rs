//! The rollout's decisions, pure, over plain state ([`Rollout`]): from one snapshot, which
//! policies roll out and where each stands ([`plan::plan`], [`pin`], [`halt`]), the status to
//! write and when, the restarts and in-place updates to make, and the pods to read; then what
//! those came to. [`super::io`] makes the writes and reads; [`crate::driver`] runs both.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use splice_crds::{
    InjectionPolicy, InjectionPolicyStatus, ROLLOUT_HALT_ANNOTATION, ROLLOUT_PROMOTE_ANNOTATION,
    ROLLOUT_RESUME_ANNOTATION, RolloutPhase, RolloutStatus, RolloutStrategy, StableRevision,
    condition, set_condition,
};
use splice_engine::entry::CanaryScope;
use splice_engine::{CompiledPolicy, Exclusions, NamespaceContext};

use super::io::{Act, Look, Of, Seen, Updated};
use super::plan::{
    self, InPlaceProof, Limits, PodNeed, PodNeeding, PodPath, PodRef, PolicyInput, Updating,
    Workload, WorkloadRef,
};
use super::pods::{self, Resized, Sorted};
use super::{DEFAULT_TIMEOUT, STATUS_INTERVAL, rolled_out};
use crate::driver::{Now, Pass, Snapshot, Write};
use crate::policy::conditions::{PlannedEvent, Severity};
use crate::policy::in_force;
use crate::status::Owner;
use crate::view::{self, PodRecord, PodState};

/// How many outdated pods one pass reads in full to sort, at most (the rest wait a pass).
const SORT_PER_PASS: usize = 500;
/// At most one `UpdatedInPlace` Event per policy in this many seconds, naming every pod updated
/// since the last: an Event per pass made the Events' writes grow with the rollout's duration.
const UPDATED_EVENT_EVERY: i64 = 30;

/// What a rollout pass decides from: the snapshot, with every workload as its cache shows it.
pub type View = Snapshot<Vec<Workload>>;

/// A pod this replica updated or resized in place: (policy, revision, when).
type PodWrite = (String, String, Timestamp);

/// The rollout loop's state: what it wrote that the caches do not show yet, and what it last
/// read of the pods it sorts and proves.
pub struct Rollout {
    exclusions: Exclusions,
    /// The run's SPIFFE trust domain (see [`pods::sort`]).
    trust_domain: String,
    /// Cluster-wide cap on workloads restarting at once.
    max_concurrent: usize,
    /// What this replica restarted, until its cache shows it: (restartedFor, restartedAt).
    written: HashMap<WorkloadRef, (String, Timestamp)>,
    /// (policy, revision, namespace) where a dry-run pod came back injected with the revision.
    verified: HashSet<(String, String, String)>,
    /// Per outdated pod: its change's path as last sorted, so a pod is read in full once per
    /// revision rather than every pass.
    paths: HashMap<PodRef, Sorted>,
    /// Per pod updated in place: (revision, proof) as last read; a proven pod is not read again.
    proofs: HashMap<PodRef, (String, InPlaceProof)>,
    /// Pods this replica updated in place, until the cache shows it.
    written_pods: HashMap<PodRef, PodWrite>,
    /// Pods resized and waiting for the kubelet before their record is written.
    resizing: HashMap<PodRef, PodWrite>,
    /// Resizes the kubelet made: the next pass writes their record.
    resized: HashSet<PodRef>,
    /// This tick's Events that follow no status write (`Restarted`, `UpdatedInPlace`).
    events: Vec<(Arc<InjectionPolicy>, PlannedEvent)>,
    /// Per policy, the pods updated in place that no `UpdatedInPlace` Event named yet: (the
    /// policy, the revision, the pods).
    unnamed: BTreeMap<String, (Arc<InjectionPolicy>, String, Vec<PodRef>)>,
    /// Per policy, when its last `UpdatedInPlace` Event was planned.
    named_at: HashMap<String, Timestamp>,
    /// Whether the last looks proved pods done, freeing budget the next pass can use at once.
    freed: bool,
    /// This tick's Events that follow its status writes; a write that fails drops its own.
    held: Vec<(Arc<InjectionPolicy>, Held)>,
    /// What the last pass measured, until published.
    pub(super) gauges: Option<HashMap<String, [i64; 6]>>,
}

/// An Event that follows a status write.
enum Held {
    Event(PlannedEvent),
    /// A workload's timeout halts the rollout: named with what its pods show, once looked at.
    Halted {
        workload: WorkloadRef,
        revision: String,
        timeout: Duration,
        detail: Option<String>,
    },
}

/// One policy's inputs, owned, so the planner's input can borrow them.
pub struct Candidate {
    pub policy: Arc<InjectionPolicy>,
    pub name: String,
    pub compiled: Arc<CompiledPolicy>,
    /// What its current pods carry: template hash and `valuesFrom` data digests.
    pub revision: String,
    /// With `spec.overrides`, by namespace: what the values its pods take from the namespace
    /// come to, recorded with a restart there (`plan::restarted_for`).
    pub marks: BTreeMap<String, String>,
    pub limits: Limits,
    /// A halt recorded in status, not lifted by a resume: (by, at).
    pub halt: Option<(String, Option<Timestamp>)>,
    pub held: bool,
    pub resumed_at: Option<Timestamp>,
    /// The open canary's selectors, namespace and object.
    pub canary: Option<CanaryScope>,
    pub promote_requested: bool,
    /// The promoted revision the status keeps.
    pub stable: Option<StableRevision>,
    pub strategy: RolloutStrategy,
}

/// The policies that roll out now, by name: with `spec.rollout`, unpaused, and served.
pub fn candidates(view: &View) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = view
        .policies
        .iter()
        .filter_map(|p| candidate(view, p))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn candidate(view: &View, policy: &Arc<InjectionPolicy>) -> Option<Candidate> {
    let rollout = policy.spec.rollout.as_ref()?;
    if policy.spec.paused {
        return None;
    }
    let name = policy.name_any();
    // The generation this replica's webhook serves: what new pods get.
    let compiled = view.in_force_of(&name)?;
    let revision = view::revision(&compiled);
    let marks = view
        .namespaces
        .iter()
        .filter_map(|(name, context)| {
            let mark = compiled
                .overrides()
                .namespace_mark(name, &context.annotations)?;
            Some((name.clone(), mark))
        })
        .collect();
    let canary =
        in_force::open_canary(policy, compiled.template_hash()).map(|(c, _)| CanaryScope::of(c));
    let annotations = policy.annotations();
    let resumed_at = annotations
        .get(ROLLOUT_RESUME_ANNOTATION)
        .and_then(|v| v.split_once('@'))
        .filter(|(r, _)| *r == revision)
        .and_then(|(_, at)| at.parse::<Timestamp>().ok());
    let status = policy.status.as_ref().and_then(|s| s.rollout.as_ref());
    Some(Candidate {
        halt: halt(status, &revision, resumed_at),
        held: annotations.contains_key(ROLLOUT_HALT_ANNOTATION),
        promote_requested: annotations
            .get(ROLLOUT_PROMOTE_ANNOTATION)
            .is_some_and(|h| h == compiled.template_hash()),
        stable: in_force::stable(policy).cloned(),
        limits: limits(rollout),
        strategy: rollout.strategy,
        policy: Arc::clone(policy),
        name,
        compiled,
        revision,
        marks,
        resumed_at,
        canary,
    })
}

/// A pod that carries the current revision yet is outdated: a value it took from its namespace's
/// annotation changed. An in-place update is proven per revision, so such a pod is restarted.
fn outdated_by_overrides_only(c: &Candidate, pod: &PodRecord) -> bool {
    pod.recorded_hash(&c.name) == Some(c.revision.as_str())
}

fn limits(rollout: &splice_crds::Rollout) -> Limits {
    Limits {
        max_concurrent: usize::try_from(rollout.max_concurrent).unwrap_or(1),
        max_per_namespace: usize::try_from(rollout.max_concurrent_per_namespace).unwrap_or(1),
        timeout: rollout.timeout().unwrap_or(DEFAULT_TIMEOUT),
        repair_missed: rollout.repair_missed,
    }
}

/// The halt `status` records for `revision` that still holds: (by, at). A halt holds until a
/// resume requested after it; a requested halt is the annotation's and ends with it.
pub fn halt(
    status: Option<&RolloutStatus>,
    revision: &str,
    resumed_at: Option<Timestamp>,
) -> Option<(String, Option<Timestamp>)> {
    let r = status.filter(|r| r.phase == RolloutPhase::Halted && r.revision == revision)?;
    let at = r.halted_at.as_deref().and_then(|t| t.parse().ok());
    let lifted = match (at, resumed_at) {
        (Some(at), Some(resumed)) => resumed > at,
        (None, Some(_)) => true,
        _ => false,
    };
    let by = r.halted_by.clone()?;
    (!lifted && by != plan::HALT_REQUESTED).then_some((by, at))
}

/// Sets what the status keeps of the revisions: the promoted one stays while a canary is open and
/// becomes the one in force when it is promoted or when no canary is configured (so that a canary
/// added later pins it); the canary's while open.
pub fn pin(plan: &mut plan::Plan, c: &Candidate) {
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

/// `status.rollout` and the RolledOut condition for `status`, the condition's transition time
/// kept from `known` when its status did not change.
fn slice(
    status: &RolloutStatus,
    policy: &InjectionPolicy,
    known: Option<&InjectionPolicyStatus>,
    now: Timestamp,
) -> InjectionPolicyStatus {
    // The rollout's slice holds the RolledOut condition alone.
    let mut conditions = Owner::Rollout.slice(known).conditions;
    let (s, reason, message) = rolled_out(status);
    let generation = policy.metadata.generation;
    set_condition(
        &mut conditions,
        condition::ROLLED_OUT,
        s,
        reason,
        &message,
        generation,
        now,
    );
    InjectionPolicyStatus {
        conditions,
        rollout: Some(status.clone()),
        ..InjectionPolicyStatus::default()
    }
}

fn event(severity: Severity, reason: &str, note: String) -> PlannedEvent {
    PlannedEvent {
        severity,
        reason: reason.to_owned(),
        action: "Rollout",
        note: crate::policy::error::truncate(note, 1000),
    }
}

fn promoted(plan: &plan::Plan, c: &Candidate) -> PlannedEvent {
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
    event(Severity::Normal, "Promoted", note)
}

fn halted_note(workload: &WorkloadRef, revision: &str, timeout: Duration, detail: &str) -> String {
    format!(
        "Rollout of revision {revision} halted: {workload} did not become fully available within \
         {}s of its restart{detail}. Nothing more is restarted until the template changes or \
         `kubectl splice rollout resume`.",
        timeout.as_secs(),
    )
}

/// The version of `policy` the pod's record names (`view::version`), empty without one.
pub fn recorded_version(pod: &Pod, policy: &str) -> String {
    view::injected_versions(pod.metadata.annotations.as_ref())
        .into_iter()
        .find(|(p, _)| p == policy)
        .map(|(_, v)| v)
        .unwrap_or_default()
}

pub fn pod_ref(pod: &PodRecord) -> PodRef {
    PodRef {
        namespace: pod.namespace.to_string(),
        name: pod.name.clone(),
    }
}

fn in_canary(c: &Candidate, contexts: &HashMap<String, NamespaceContext>, pod: &PodRecord) -> bool {
    c.canary.as_ref().is_some_and(|scope| {
        let ns_labels = contexts.get(&*pod.namespace).map(|n| &n.labels);
        scope.holds(ns_labels, &pod.labels)
    })
}

/// The namespace as the engine sees it, from the view (its name alone when not seen yet).
pub fn namespace_context(
    contexts: &HashMap<String, NamespaceContext>,
    name: &str,
) -> NamespaceContext {
    contexts
        .get(name)
        .cloned()
        .unwrap_or_else(|| NamespaceContext {
            name: name.to_owned(),
            ..Default::default()
        })
}

impl Rollout {
    pub fn new(splice_namespace: &str, max_concurrent: usize, trust_domain: &str) -> Self {
        Rollout {
            exclusions: Exclusions::default_for(splice_namespace),
            trust_domain: trust_domain.to_owned(),
            max_concurrent,
            written: HashMap::new(),
            verified: HashSet::new(),
            paths: HashMap::new(),
            proofs: HashMap::new(),
            written_pods: HashMap::new(),
            resizing: HashMap::new(),
            resized: HashSet::new(),
            events: Vec::new(),
            unnamed: BTreeMap::new(),
            named_at: HashMap::new(),
            freed: false,
            held: Vec::new(),
            gauges: None,
        }
    }

    /// One planning pass: the status writes now, the restarts and in-place updates to make,
    /// and the pods to read for the next pass.
    pub fn decide(&mut self, view: &View, now: Now) -> Pass<Look, Act> {
        self.freed = false;
        self.name_updated_pods(now.wall);
        let candidates = candidates(view);
        self.named_at
            .retain(|p, _| candidates.iter().any(|c| c.name == *p));
        if candidates.is_empty() {
            self.gauges = Some(HashMap::new());
            return Pass::default();
        }
        self.forget(&view.pods);
        let workloads = self.workloads(&view.extra);
        let inputs: Vec<PolicyInput<'_>> = candidates.iter().map(|c| self.input(c, view)).collect();
        let excluded = &self.exclusions.namespaces;
        let mut plans = plan::plan(&inputs, &workloads, excluded, self.max_concurrent, now.wall);
        drop(inputs);
        for (plan, c) in plans.iter_mut().zip(&candidates) {
            pin(plan, c);
        }
        self.gauges = Some(gauges(&plans));
        let mut pass = Pass::default();
        self.reads(&candidates, view, &mut pass);
        for (plan, c) in plans.into_iter().zip(&candidates) {
            self.acts(&plan, c, view, &mut pass.acts);
            self.report(&plan, c, view, now, &mut pass);
        }
        pass
    }

    /// Forgets own writes once the cache shows them, and pods gone.
    fn forget(&mut self, pods: &[Arc<PodRecord>]) {
        let live: HashMap<PodRef, &PodRecord> = pods.iter().map(|p| (pod_ref(p), &**p)).collect();
        self.paths.retain(|k, _| live.contains_key(k));
        self.proofs.retain(|k, _| live.contains_key(k));
        self.resizing.retain(|k, _| live.contains_key(k));
        self.resized.retain(|k| live.contains_key(k));
        self.written_pods.retain(|k, (policy, revision, _)| {
            live.get(k)
                .is_some_and(|p| p.updated_in_place(policy, revision).is_none())
        });
    }

    /// Every workload as the planner sees it, with this replica's own restarts laid over a
    /// cache that may not show them yet.
    fn workloads(&mut self, cached: &[Workload]) -> Vec<Workload> {
        let mut out = cached.to_vec();
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

    fn input<'v>(&'v self, c: &'v Candidate, view: &'v View) -> PolicyInput<'v> {
        let contexts = &view.namespaces;
        let pods = view::classify(
            &c.compiled,
            view::in_force_since(&c.policy),
            contexts,
            &self.exclusions,
            view.pods.iter().map(|p| &**p),
        )
        .filter_map(|(pod, state)| {
            let need = match state {
                PodState::Current => return None,
                PodState::Outdated => PodNeed::Outdated,
                PodState::Missed => PodNeed::Missed,
            };
            if !outdated_by_overrides_only(c, pod)
                && self.in_flight(&c.name, &c.revision, pod).is_some()
            {
                return None;
            }
            Some(PodNeeding {
                namespace: &pod.namespace,
                name: &pod.name,
                labels: &pod.labels,
                owner: pod.owner,
                need,
                in_canary: in_canary(c, contexts, pod),
                path: self.path_of(c, pod),
            })
        })
        .collect();
        PolicyInput {
            policy: &c.name,
            revision: &c.revision,
            limits: c.limits,
            halted_by: c.halt.as_ref().map(|(by, _)| by.as_str()),
            halted_at: c.halt.as_ref().and_then(|(_, at)| *at),
            held: c.held,
            resumed_at: c.resumed_at,
            pods,
            canary: c.canary.is_some(),
            promote_requested: c.promote_requested,
            strategy: c.strategy,
            updating: self.updating(c, view),
            marks: &c.marks,
        }
    }

    /// The path the planner reads for an outdated pod: `Restart` under that strategy, else
    /// what the last sorting found for this revision and the version the pod carries.
    fn path_of(&self, c: &Candidate, pod: &PodRecord) -> PodPath {
        if c.strategy == RolloutStrategy::Restart || outdated_by_overrides_only(c, pod) {
            return PodPath::Restart;
        }
        let recorded = pod.recorded_hash(&c.name).unwrap_or_default();
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
        pod: &PodRecord,
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
    fn updating<'v>(&'v self, c: &'v Candidate, view: &'v View) -> Vec<Updating<'v>> {
        if c.strategy == RolloutStrategy::Restart {
            return Vec::new();
        }
        let contexts = &view.namespaces;
        let pods = view.pods.iter().map(|p| &**p);
        view::classify(&c.compiled, None, contexts, &self.exclusions, pods)
            .filter_map(|(pod, _)| {
                let at = self.in_flight(&c.name, &c.revision, pod)?;
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

    /// The pods to read for the next pass: outdated pods not sorted yet for their policy's
    /// revision, pods updated in place whose proof is not in yet; and the records of the
    /// resizes the kubelet made, to write now.
    fn reads(&mut self, candidates: &[Candidate], view: &View, pass: &mut Pass<Look, Act>) {
        let mut sorts = 0;
        for c in candidates {
            if c.strategy == RolloutStrategy::Restart {
                continue;
            }
            let since = view::in_force_since(&c.policy);
            let pods = view.pods.iter().map(|p| &**p);
            let contexts = &view.namespaces;
            for (pod, state) in view::classify(&c.compiled, since, contexts, &self.exclusions, pods)
            {
                let key = pod_ref(pod);
                if self.in_flight(&c.name, &c.revision, pod).is_some() {
                    if self.resized.remove(&key) {
                        let namespace = namespace_context(contexts, &key.namespace);
                        pass.acts.push(Act::Record(in_place(c, key, namespace)));
                    } else if !self.proven(&key, &c.revision) {
                        pass.looks
                            .push(Look::Prove(in_place(c, key, NamespaceContext::default())));
                    }
                } else if state == PodState::Outdated
                    && self.path_of(c, pod) == PodPath::Unsorted
                    && sorts < SORT_PER_PASS
                {
                    sorts += 1;
                    let recorded = pod.recorded_hash(&c.name).unwrap_or_default().to_owned();
                    let namespace = namespace_context(contexts, &key.namespace);
                    pass.looks
                        .push(Look::Sort(in_place(c, key, namespace), recorded));
                }
            }
        }
    }

    fn proven(&self, key: &PodRef, revision: &str) -> bool {
        self.proofs
            .get(key)
            .is_some_and(|(r, p)| r == revision && *p == InPlaceProof::Done)
    }

    /// The plan's restarts, with the namespaces already verified, and its in-place updates.
    fn acts(&self, plan: &plan::Plan, c: &Candidate, view: &View, acts: &mut Vec<Act>) {
        let of = || Of {
            policy: Arc::clone(&c.policy),
            name: plan.policy.clone(),
            revision: plan.revision.clone(),
            marks: c.marks.clone(),
        };
        if !plan.restart.is_empty() {
            let verified = self
                .verified
                .iter()
                .filter(|(p, r, _)| *p == plan.policy && *r == plan.revision)
                .map(|(_, _, ns)| ns.clone())
                .collect();
            acts.push(Act::Restart(of(), plan.restart.clone(), verified));
        }
        if !plan.update.is_empty() {
            let pods = plan
                .update
                .iter()
                .map(|id| {
                    (
                        id.clone(),
                        namespace_context(&view.namespaces, &id.namespace),
                    )
                })
                .collect();
            acts.push(Act::Update(of(), Arc::clone(&c.compiled), pods));
        }
    }

    /// Writes `status.rollout` and RolledOut when they changed: a phase change at once, progress
    /// at most every [`STATUS_INTERVAL`]; the Events that follow the write are held for it.
    fn report(
        &mut self,
        plan: &plan::Plan,
        c: &Candidate,
        view: &View,
        now: Now,
        pass: &mut Pass<Look, Act>,
    ) {
        let status = view.status(Owner::Rollout, &c.policy);
        let known = status.as_ref().and_then(|s| s.rollout.as_ref());
        if known == Some(&plan.status) {
            if plan.promote {
                self.events.push((Arc::clone(&c.policy), promoted(plan, c)));
            }
            return;
        }
        let shown = |s: &RolloutStatus| (s.phase, s.revision.clone(), s.stable.clone());
        let phase_changed = known.map(shown) != Some(shown(&plan.status));
        let recent = view
            .written_at
            .get(&c.name)
            .is_some_and(|at| now.at.saturating_duration_since(*at) < STATUS_INTERVAL);
        if !phase_changed && recent {
            return;
        }
        self.hold(plan, c, known, pass);
        pass.writes.push(Write {
            policy: Arc::clone(&c.policy),
            slice: slice(&plan.status, &c.policy, status.as_deref(), now.wall),
            then: None,
            log: None,
        });
    }

    /// The Events that follow a status write: the halts, the pods strategy InPlace leaves, a
    /// promotion.
    fn hold(
        &mut self,
        plan: &plan::Plan,
        c: &Candidate,
        known: Option<&RolloutStatus>,
        pass: &mut Pass<Look, Act>,
    ) {
        let mut held = Vec::new();
        let timeout = c.limits.timeout;
        if let Some((pod, why)) = &plan.newly_failed_pod {
            let note = format!(
                "Rollout of revision {} halted: the in-place update of {pod} was not proven within {}s: {why}. Nothing more is changed until the template changes or `kubectl splice rollout resume`; `kubectl splice rollout undo` puts the earlier images back on the pods this revision updated.",
                plan.revision,
                timeout.as_secs(),
            );
            held.push(Held::Event(event(Severity::Warning, "RolloutHalted", note)));
        }
        let newly_blocked = known.map_or(0, |k| k.not_in_place) != plan.status.not_in_place;
        if newly_blocked
            && let Some(note) = plan::not_in_place_note(&c.name, &plan.revision, &plan.not_in_place)
        {
            held.push(Held::Event(event(Severity::Warning, "NeedsRestart", note)));
        }
        if let Some(failed) = &plan.newly_failed {
            pass.looks
                .push(Look::WhatFailed(c.name.clone(), failed.clone()));
            held.push(Held::Halted {
                workload: failed.clone(),
                revision: plan.revision.clone(),
                timeout,
                detail: None,
            });
        }
        if plan.promote {
            held.push(Held::Event(promoted(plan, c)));
        }
        self.held
            .extend(held.into_iter().map(|h| (Arc::clone(&c.policy), h)));
    }

    /// Takes in what the acts and looks came to.
    pub fn judged(&mut self, seen: Vec<Seen>) {
        for s in seen {
            match s {
                Seen::Restarted(of, verified, restarted) => self.restarted(of, verified, restarted),
                Seen::Updated(of, pods) => self.updated(of, pods),
                Seen::Recorded(p, at) => {
                    if let Some(at) = at {
                        self.resizing.remove(&p.pod);
                        self.written_pods.insert(p.pod, (p.name, p.revision, at));
                    }
                }
                Seen::Sorted(p, recorded, pod) => self.sort(&p, &recorded, &pod),
                Seen::Proved(p, pod) => self.prove(&p, &pod),
                Seen::Failed(policy, detail) => self.detail(&policy, detail),
                Seen::Nothing => {}
            }
        }
    }

    fn restarted(
        &mut self,
        of: Of,
        verified: Vec<String>,
        restarted: Vec<(WorkloadRef, String, Timestamp)>,
    ) {
        for ns in verified {
            let key = (of.name.clone(), of.revision.clone(), ns);
            self.verified.insert(key);
        }
        let ids: Vec<WorkloadRef> = restarted.iter().map(|(id, _, _)| id.clone()).collect();
        let written = restarted.into_iter().map(|(id, v, at)| (id, (v, at)));
        self.written.extend(written);
        // One Event per pass, naming every workload it restarted.
        if let Some(note) = plan::restarted_note(&of.name, &of.revision, &ids) {
            let e = event(Severity::Normal, "Restarted", note);
            self.events.push((of.policy, e));
        }
    }

    fn updated(&mut self, of: Of, pods: Vec<(PodRef, Updated)>) {
        let mut names = Vec::new();
        for (id, outcome) in pods {
            match outcome {
                Updated::Written { resize, at } => {
                    let into = if resize {
                        &mut self.resizing
                    } else {
                        &mut self.written_pods
                    };
                    into.insert(id.clone(), (of.name.clone(), of.revision.clone(), at));
                    names.push(id);
                }
                Updated::NotInPlace(sorted) => {
                    self.paths.insert(id, sorted);
                }
                Updated::Stale => {
                    self.paths.remove(&id);
                }
            }
        }
        if names.is_empty() {
            return;
        }
        // A new revision names the pods of the last one first.
        if self
            .unnamed
            .get(&of.name)
            .is_some_and(|(_, revision, _)| *revision != of.revision)
        {
            self.name_updated(&of.name);
        }
        let (_, _, pods) = self
            .unnamed
            .entry(of.name.clone())
            .or_insert_with(|| (of.policy, of.revision, Vec::new()));
        pods.extend(names);
    }

    /// Plans the `UpdatedInPlace` Event of each policy whose last one is [`UPDATED_EVENT_EVERY`]
    /// old (or that had none), naming the pods updated since.
    pub fn name_updated_pods(&mut self, now: Timestamp) {
        let due: Vec<String> = self
            .unnamed
            .keys()
            .filter(|p| {
                self.named_at
                    .get(*p)
                    .is_none_or(|at| now.as_second() - at.as_second() >= UPDATED_EVENT_EVERY)
            })
            .cloned()
            .collect();
        for policy in due {
            self.name_updated(&policy);
            self.named_at.insert(policy, now);
        }
    }

    fn name_updated(&mut self, policy: &str) {
        let Some((p, revision, pods)) = self.unnamed.remove(policy) else {
            return;
        };
        if let Some(note) = plan::updated_note(policy, &revision, &pods) {
            let e = event(Severity::Normal, "UpdatedInPlace", note);
            self.events.push((p, e));
        }
    }

    fn sort(&mut self, p: &InPlace, recorded: &str, pod: &Pod) {
        match pods::sort(
            &p.compiled,
            pod,
            &p.namespace,
            &self.exclusions,
            &self.trust_domain,
        ) {
            Ok(change) => {
                tracing::debug!(pod = %p.pod, path = %change.path, "rollout: sorted");
                let sorted = Sorted::of(&p.revision, recorded, &change.path);
                self.paths.insert(p.pod.clone(), sorted);
            }
            Err(message) => {
                let e = pods::PodError::Sort {
                    pod: p.pod.clone(),
                    message,
                };
                tracing::warn!(error = %e, label = e.label(), "rollout: not sorted");
            }
        }
    }

    /// Reads the proof of an in-place update on `pod`; a resize the kubelet made gets its
    /// record next pass, one it refused sends the pod to a restart.
    fn prove(&mut self, p: &InPlace, pod: &Pod) {
        let key = p.pod.clone();
        if self.resizing.contains_key(&key) {
            match pods::resized(pod) {
                Resized::Waiting(why) => {
                    let proof = (p.revision.clone(), InPlaceProof::Waiting(why));
                    self.proofs.insert(key, proof);
                }
                Resized::Infeasible(why) => {
                    tracing::info!(pod = %key, reason = %why, "rollout: resize infeasible; the pod's workload restarts instead");
                    self.resizing.remove(&key);
                    let why = format!("restart: the kubelet reports the resize Infeasible ({why})");
                    // Keyed by the version the pod still carries, so it is not sorted again
                    // (its spec now holds the new resources, which would read as no change).
                    let sorted = Sorted {
                        revision: p.revision.clone(),
                        recorded: recorded_version(pod, &p.name),
                        path: PodPath::Restart,
                        why,
                    };
                    self.paths.insert(key, sorted);
                }
                Resized::Done => {
                    self.resized.insert(key);
                }
            }
            return;
        }
        let markers = super::inplace::markers(pod.metadata.annotations.as_ref());
        let proof = match markers.get(&p.name).filter(|m| m.revision == p.revision) {
            Some(m) => match super::inplace::proof(pod, m) {
                super::inplace::Proof::Done => InPlaceProof::Done,
                super::inplace::Proof::Waiting(w) => InPlaceProof::Waiting(w),
                super::inplace::Proof::Broken(b) => InPlaceProof::Broken(b),
            },
            None => InPlaceProof::Waiting("the update is not on the pod yet".into()),
        };
        self.freed |= proof == InPlaceProof::Done && !self.proven(&key, &p.revision);
        self.proofs.insert(key, (p.revision.clone(), proof));
    }

    /// Whether pods were just proved done: their budget is free for the next pass now, not a
    /// period later (the proofs are read after the pass planned, so each stage would otherwise
    /// wait a whole period more).
    pub fn freed(&self) -> bool {
        self.freed
    }

    /// What the pods of a failed workload show, for its `RolloutHalted` Event.
    fn detail(&mut self, policy: &str, found: Option<String>) {
        for (p, h) in &mut self.held {
            if let Held::Halted { detail, .. } = h
                && p.name_any() == policy
            {
                *detail = found.clone();
            }
        }
    }

    /// A status write failed: the Events that would follow it are dropped.
    pub fn drop_held(&mut self, policy: &str) {
        self.held.retain(|(p, _)| p.name_any() != policy);
    }

    /// This tick's Events: those of the acts, then those that follow a write.
    pub fn take_events(&mut self) -> Vec<(Arc<InjectionPolicy>, PlannedEvent)> {
        let held = self.held.drain(..).map(|(policy, h)| {
            let e = match h {
                Held::Event(e) => e,
                Held::Halted {
                    workload,
                    revision,
                    timeout,
                    detail,
                } => {
                    let detail = detail.map(|d| format!(" ({d})")).unwrap_or_default();
                    let note = halted_note(&workload, &revision, timeout, &detail);
                    event(Severity::Warning, "RolloutHalted", note)
                }
            };
            (policy, e)
        });
        let mut out: Vec<_> = self.events.drain(..).collect();
        out.extend(held);
        out
    }
}

/// One pod of a policy's in-place rollout, with what sorting its change needs.
#[derive(Clone)]
pub struct InPlace {
    pub pod: PodRef,
    pub name: String,
    pub revision: String,
    pub compiled: Arc<CompiledPolicy>,
    pub namespace: NamespaceContext,
}

fn in_place(c: &Candidate, pod: PodRef, namespace: NamespaceContext) -> InPlace {
    InPlace {
        pod,
        name: c.name.clone(),
        revision: c.revision.clone(),
        compiled: Arc::clone(&c.compiled),
        namespace,
    }
}

/// `splice_rollout_workloads` per policy: outdated, restarting, done, failed, manual, halted.
fn gauges(plans: &[plan::Plan]) -> HashMap<String, [i64; 6]> {
    plans
        .iter()
        .map(|p| {
            let s = &p.status;
            let halted = i64::from(s.phase == RolloutPhase::Halted);
            let counts = [s.outdated, s.restarting, s.done, s.failed, s.manual, halted];
            (p.policy.clone(), counts)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Instant;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use splice_crds::IN_PLACE_ANNOTATION;
    use splice_engine::selector::Selector;

    use super::*;
    use crate::view::PodOwner;

    fn spec(strategy: &str) -> serde_json::Value {
        serde_json::json!({
            "objectSelector": {"matchLabels": {"app": "web"}},
            "template": {"labels": {"a": "b"}},
            "rollout": {"strategy": strategy},
        })
    }

    fn policy(strategy: &str, rollout: Option<RolloutStatus>) -> Arc<InjectionPolicy> {
        let mut p: InjectionPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "splice.dev/v1alpha1", "kind": "InjectionPolicy",
            "metadata": {"name": "mesh", "uid": "u1", "generation": 1},
            "spec": spec(strategy),
        }))
        .unwrap();
        p.status = rollout.map(|r| InjectionPolicyStatus {
            rollout: Some(r),
            ..InjectionPolicyStatus::default()
        });
        Arc::new(p)
    }

    fn compiled(strategy: &str) -> Arc<CompiledPolicy> {
        let spec = serde_json::from_value(spec(strategy)).unwrap();
        Arc::new(CompiledPolicy::compile("mesh", 1, &spec).unwrap())
    }

    fn outdated_pod() -> PodRecord {
        PodRecord {
            namespace: Arc::from("shop"),
            name: "web-1".into(),
            uid: "web-1".into(),
            service_account: String::new(),
            labels: [("app".to_owned(), "web".to_owned())].into(),
            created: Some(Timestamp::from_second(500).unwrap()),
            injected: vec![("mesh".to_owned(), "old".to_owned())],
            owner: PodOwner::ReplicaSet,
            in_place: Vec::new(),
            overrides: Vec::new(),
        }
    }

    fn deployment() -> Workload {
        let selector = LabelSelector {
            match_labels: Some([("app".to_owned(), "web".to_owned())].into()),
            ..LabelSelector::default()
        };
        Workload {
            id: WorkloadRef {
                kind: plan::Kind::Deployment,
                namespace: "shop".into(),
                name: "web".into(),
            },
            selector: Selector::read(Some(&selector)),
            restarted_for: None,
            restarted_at: None,
            paused: false,
            settled: true,
            disruption_blocked: false,
        }
    }

    fn view(strategy: &str, rollout: Option<RolloutStatus>) -> View {
        Snapshot {
            policies: vec![policy(strategy, rollout)],
            served: [("mesh".to_owned(), compiled(strategy))].into(),
            pods: Arc::new(vec![Arc::new(outdated_pod())]),
            extra: vec![deployment()],
            ..Snapshot::default()
        }
    }

    fn rollout() -> Rollout {
        Rollout::new(
            "splice-system",
            10,
            splice_engine::identity::DEFAULT_TRUST_DOMAIN,
        )
    }

    fn pod_key() -> PodRef {
        PodRef {
            namespace: "shop".into(),
            name: "web-1".into(),
        }
    }

    /// The slice a pass wrote, as pending in the writer's memory since `ago`.
    fn written(v: &mut View, slice: InjectionPolicyStatus, ago: Duration) {
        v.pending.insert("mesh".into(), slice);
        let at = Instant::now().checked_sub(ago).unwrap();
        v.written_at.insert("mesh".into(), at);
    }

    #[test]
    fn a_planned_restart_is_acted_once_and_its_status_written_once() {
        let mut r = rollout();
        let mut v = view("Restart", None);
        let pass = r.decide(&v, Now::current());
        let [Act::Restart(of, workloads, verified)] = pass.acts.as_slice() else {
            panic!("one restart act")
        };
        assert_eq!(workloads.as_slice(), [deployment().id]);
        assert!(
            verified.is_empty(),
            "the namespace is checked by a dry run first"
        );
        let [w] = pass.writes.as_slice() else {
            panic!("one status write")
        };
        let status = w.slice.rollout.clone().unwrap();
        assert_eq!(status.phase, RolloutPhase::Rolling);
        assert_eq!(status.revision, of.revision);
        let [c] = w.slice.conditions.as_slice() else {
            panic!("the RolledOut condition alone")
        };
        assert_eq!(
            (c.type_.as_str(), c.reason.as_str()),
            ("RolledOut", "Rolling")
        );
        assert!(w.slice.coverage.is_none() && w.slice.probe.is_none());

        let of = Of {
            policy: Arc::clone(&of.policy),
            name: of.name.clone(),
            revision: of.revision.clone(),
            marks: BTreeMap::new(),
        };
        let value = plan::restarted_for(&of.name, &of.revision, None);
        let at = Timestamp::now();
        r.judged(vec![Seen::Restarted(
            of,
            vec!["shop".into()],
            vec![(deployment().id, value, at)],
        )]);
        let events = r.take_events();
        let [(_, e)] = events.as_slice() else {
            panic!("one Restarted Event: {}", events.len())
        };
        assert_eq!((e.reason.as_str(), e.action), ("Restarted", "Rollout"));
        assert!(e.note.contains("Deployment/shop/web"), "{}", e.note);

        written(&mut v, w.slice.clone(), Duration::from_secs(1));
        let again = r.decide(&v, Now::current());
        assert!(again.writes.is_empty(), "written once");
        assert!(
            again.acts.is_empty(),
            "restarted once: its own restart is laid over the cache"
        );
        assert!(r.take_events().is_empty());
    }

    fn rolling(outdated: i64, revision: &str) -> RolloutStatus {
        RolloutStatus {
            revision: revision.into(),
            phase: RolloutPhase::Rolling,
            outdated,
            ..RolloutStatus::default()
        }
    }

    #[test]
    fn progress_is_written_at_most_every_status_interval_a_phase_change_at_once() {
        let revision = view::revision(&compiled("Restart"));
        let mut first = rollout().decide(&view("Restart", None), Now::current());
        let planned = first.writes.remove(0).slice.rollout.unwrap();
        // The same phase, other counts, written 5 s ago: held back.
        let mut other = planned.clone();
        other.outdated += 3;
        let slice = |s: RolloutStatus| InjectionPolicyStatus {
            rollout: Some(s),
            ..InjectionPolicyStatus::default()
        };
        let mut v = view("Restart", None);
        written(&mut v, slice(other.clone()), Duration::from_secs(5));
        assert!(rollout().decide(&v, Now::current()).writes.is_empty());
        // 11 s ago: written.
        written(&mut v, slice(other), Duration::from_secs(11));
        assert_eq!(rollout().decide(&v, Now::current()).writes.len(), 1);
        // Another phase, 1 s ago: written at once.
        let mut idle = rolling(0, &revision);
        idle.phase = RolloutPhase::Idle;
        idle.stable = planned.stable.clone();
        written(&mut v, slice(idle), Duration::from_secs(1));
        assert_eq!(rollout().decide(&v, Now::current()).writes.len(), 1);
        // Nothing is written without a policy to roll out.
        let mut none = view("Restart", None);
        none.served.clear();
        let mut r = rollout();
        assert!(r.decide(&none, Now::current()).writes.is_empty());
        assert_eq!(r.gauges, Some(HashMap::new()));
    }

    fn halted(by: &str, at: Option<&str>, revision: &str) -> RolloutStatus {
        RolloutStatus {
            revision: revision.into(),
            phase: RolloutPhase::Halted,
            halted_by: Some(by.into()),
            halted_at: at.map(str::to_owned),
            ..RolloutStatus::default()
        }
    }

    fn ts(s: &str) -> Option<Timestamp> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn a_halt_holds_until_a_resume_requested_after_it() {
        let at = "2026-01-01T00:00:10Z";
        let s = halted("Deployment/shop/web", Some(at), "r2");
        let holds = Some(("Deployment/shop/web".to_owned(), ts(at)));
        assert_eq!(halt(Some(&s), "r2", None), holds);
        assert_eq!(halt(Some(&s), "r2", ts("2026-01-01T00:00:05Z")), holds);
        assert_eq!(halt(Some(&s), "r2", ts("2026-01-01T00:00:20Z")), None);
        // Another revision, or not halted: nothing holds.
        assert_eq!(halt(Some(&s), "r3", None), None);
        assert_eq!(halt(Some(&rolling(1, "r2")), "r2", None), None);
        assert_eq!(halt(None, "r2", None), None);
        // A halt without its time yields to any resume; a requested halt is the annotation's.
        let untimed = halted("Deployment/shop/web", None, "r2");
        assert_eq!(halt(Some(&untimed), "r2", ts(at)), None);
        assert!(halt(Some(&untimed), "r2", None).is_some());
        let requested = halted(plan::HALT_REQUESTED, Some(at), "r2");
        assert_eq!(halt(Some(&requested), "r2", None), None);
    }

    fn candidate(canary: bool, stable: Option<StableRevision>) -> Candidate {
        let v = view("Restart", None);
        let mut c = candidates(&v).remove(0);
        c.canary = canary
            .then(|| CanaryScope::of(&serde_json::from_value(serde_json::json!({})).unwrap()));
        c.stable = stable;
        c
    }

    fn empty_plan(promote: bool) -> plan::Plan {
        plan::Plan {
            policy: "mesh".into(),
            revision: "r".into(),
            restart: Vec::new(),
            waiting: Vec::new(),
            newly_failed: None,
            newly_failed_pod: None,
            update: Vec::new(),
            not_in_place: Vec::new(),
            promote,
            status: RolloutStatus::default(),
        }
    }

    #[test]
    fn pin_keeps_the_promoted_revision_while_a_canary_is_open() {
        let kept = StableRevision {
            template_hash: "old".into(),
            generation: 1,
            spec: serde_json::json!({}),
        };
        let c = candidate(true, Some(kept.clone()));
        let hash = c.compiled.template_hash().to_owned();
        let mut open = empty_plan(false);
        pin(&mut open, &c);
        assert_eq!(open.status.stable, Some(kept.clone()));
        assert_eq!(open.status.canary_revision.as_deref(), Some(hash.as_str()));
        let mut promoted = empty_plan(true);
        pin(&mut promoted, &c);
        let stable = promoted.status.stable.unwrap();
        assert_eq!((stable.template_hash, stable.generation), (hash.clone(), 1));
        assert_eq!(promoted.status.canary_revision, None);
        // No canary: the revision in force is the stable one, so a canary added later pins it.
        let mut plain = empty_plan(false);
        pin(&mut plain, &candidate(false, Some(kept)));
        assert_eq!(plain.status.stable.map(|s| s.template_hash), Some(hash));
    }

    fn marked(revision: &str) -> Pod {
        let marker = serde_json::json!({"mesh": {
            "revision": revision, "at": "2026-01-01T00:00:00Z", "uid": "p1", "generation": 1,
        }});
        let annotations: BTreeMap<String, String> =
            [(IN_PLACE_ANNOTATION.to_owned(), marker.to_string())].into();
        let mut pod = Pod::default();
        pod.metadata.uid = Some("p1".into());
        pod.metadata.annotations = Some(annotations);
        pod
    }

    #[test]
    fn an_in_place_pod_is_sorted_updated_proven_and_counted_updated() {
        let mut r = rollout();
        let v = view("Auto", None);
        let revision = view::revision(&compiled("Auto"));
        let first = r.decide(&v, Now::current());
        assert!(first.acts.is_empty(), "an unsorted pod waits");
        let [Look::Sort(p, recorded)] = first.looks.as_slice() else {
            panic!("one pod to sort")
        };
        assert_eq!((&p.pod, recorded.as_str()), (&pod_key(), "old"));
        let sorted = Sorted {
            revision: revision.clone(),
            recorded: "old".into(),
            path: PodPath::InPlace,
            why: "image".into(),
        };
        r.paths.insert(pod_key(), sorted);

        let second = r.decide(&v, Now::current());
        let [Act::Update(of, _, pods)] = second.acts.as_slice() else {
            panic!("one update act")
        };
        assert_eq!(pods[0].0, pod_key());
        let of = Of {
            policy: Arc::clone(&of.policy),
            name: of.name.clone(),
            revision: of.revision.clone(),
            marks: BTreeMap::new(),
        };
        let done = Updated::Written {
            resize: false,
            at: Timestamp::now(),
        };
        r.judged(vec![Seen::Updated(of.clone(), vec![(pod_key(), done)])]);
        r.name_updated_pods(Timestamp::now());
        let events = r.take_events();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].1.reason, "UpdatedInPlace");

        // Pods updated within 30 s of that Event are named together in the next one.
        let t0 = Timestamp::now();
        let later = |s: i64| t0 + k8s_openapi::jiff::SignedDuration::from_secs(s);
        for (i, t) in [(2, 1), (3, 10), (4, 29)] {
            let mut pod = pod_key();
            pod.name = format!("web-{i}");
            let done = Updated::Written {
                resize: false,
                at: later(t),
            };
            r.judged(vec![Seen::Updated(of.clone(), vec![(pod, done)])]);
            r.name_updated_pods(later(t));
            assert!(r.take_events().is_empty(), "an Event {t}s after the last");
        }
        r.name_updated_pods(later(31));
        let events = r.take_events();
        let [(_, e)] = events.as_slice() else {
            panic!("one Event naming three pods: {}", events.len())
        };
        assert!(e.note.starts_with("Updated 3 pods in place"), "{}", e.note);

        let third = r.decide(&v, Now::current());
        assert!(third.acts.is_empty(), "updated once");
        let [Look::Prove(p)] = third.looks.as_slice() else {
            panic!("its proof to read")
        };
        let updating = third.writes[0].slice.rollout.as_ref().unwrap();
        assert_eq!((updating.updating, updating.updated_in_place), (1, 0));
        r.judged(vec![Seen::Proved(p.clone(), Box::new(marked(&revision)))]);
        assert!(
            r.freed(),
            "the next pass comes at once to use the freed budget"
        );

        let fourth = r.decide(&v, Now::current());
        assert!(fourth.looks.is_empty(), "a proven pod is not read again");
        let s = fourth.writes[0].slice.rollout.as_ref().unwrap();
        assert_eq!((s.updating, s.updated_in_place), (0, 1));
    }

    #[test]
    fn a_new_leader_finds_a_pod_updated_mid_stage_by_its_marker_and_proves_it_never_updates_it_again()
     {
        let revision = view::revision(&compiled("Auto"));
        let mut updated = outdated_pod();
        updated.injected = vec![("mesh".to_owned(), revision.clone())];
        updated.in_place = vec![("mesh".to_owned(), revision.clone(), Some(Timestamp::now()))];
        let mut v = view("Auto", None);
        v.pods = Arc::new(vec![Arc::new(updated)]);
        // A replica that never saw this rollout: nothing in its memory.
        let mut r = rollout();
        let pass = r.decide(&v, Now::current());
        assert!(
            pass.acts.is_empty(),
            "not updated again: {:?}",
            pass.acts.len()
        );
        let [Look::Prove(p)] = pass.looks.as_slice() else {
            panic!("its proof to read, nothing to sort")
        };
        assert_eq!(p.pod, pod_key());
        let s = pass.writes[0].slice.rollout.as_ref().unwrap();
        assert_eq!((s.updating, s.updated_in_place), (1, 0));
        r.judged(vec![Seen::Proved(p.clone(), Box::new(marked(&revision)))]);
        let next = r.decide(&v, Now::current());
        assert!(next.acts.is_empty() && next.looks.is_empty());
    }

    #[test]
    fn the_events_that_follow_a_write_go_with_a_failed_one() {
        let mut r = rollout();
        let mut v = view("Restart", None);
        let status = RolloutStatus {
            not_in_place: 0,
            ..rolling(1, "x")
        };
        v.policies = vec![policy("Restart", Some(status))];
        let mut plan = empty_plan(true);
        plan.status.not_in_place = 1;
        plan.not_in_place = vec![pod_key()];
        let c = candidates(&v).remove(0);
        let mut pass = Pass::default();
        r.report(&plan, &c, &v, Now::current(), &mut pass);
        assert_eq!(pass.writes.len(), 1);
        r.drop_held("mesh");
        assert!(r.take_events().is_empty());
        r.report(&plan, &c, &v, Now::current(), &mut pass);
        let reasons: Vec<_> = r.take_events().into_iter().map(|(_, e)| e.reason).collect();
        assert_eq!(reasons, ["NeedsRestart", "Promoted"]);
    }

    #[test]
    fn an_infeasible_resize_sends_the_pod_to_a_restart_keyed_by_the_version_it_carries() {
        let mut r = rollout();
        let v = view("Auto", None);
        let c = candidates(&v).remove(0);
        let at = Timestamp::now();
        r.resizing
            .insert(pod_key(), ("mesh".into(), c.revision.clone(), at));
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"annotations": {
                splice_crds::STATUS_ANNOTATION: r#"{"mesh":{"hash":"old"}}"#,
            }},
            "status": {"conditions": [{
                "type": "PodResizePending", "status": "True", "reason": "Infeasible",
                "message": "no room",
            }]},
        }))
        .unwrap();
        pod.metadata.uid = Some("p1".into());
        let p = in_place(&c, pod_key(), NamespaceContext::default());
        r.judged(vec![Seen::Proved(p, Box::new(pod))]);
        assert!(r.resizing.is_empty());
        assert_eq!(r.path_of(&c, &outdated_pod()), PodPath::Restart);
    }
}
