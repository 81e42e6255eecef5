//! The rollout's decision, pure: from every policy with `spec.rollout`, the workloads its pods
//! belong to and what is already restarting, which workloads to restart now under the budget,
//! and where each policy's rollout stands. No API call; the caller ([`super::decide`]) gathers
//! the inputs from its snapshot and decides what to write.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use splice_crds::{RolloutPhase, RolloutStatus, RolloutStrategy};
use splice_engine::selector::Selector;

pub use crate::view::PodOwner;

/// The workload kinds a rollout restarts (through their pod template).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Deployment,
    StatefulSet,
    DaemonSet,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Deployment => "Deployment",
            Kind::StatefulSet => "StatefulSet",
            Kind::DaemonSet => "DaemonSet",
        }
    }

    /// The kind of a pod's controller that makes the pod this kind's: a Deployment's pods are
    /// its ReplicaSets'.
    fn owns_pods_of(self, owner: PodOwner) -> bool {
        matches!(
            (self, owner),
            (Kind::Deployment, PodOwner::ReplicaSet)
                | (Kind::StatefulSet, PodOwner::StatefulSet)
                | (Kind::DaemonSet, PodOwner::DaemonSet)
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadRef {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for WorkloadRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

/// Workloads one `Restarted` Event names before it only counts the rest (the note stays under
/// the Event's 1,000 characters).
const NAMED_PER_EVENT: usize = 10;

/// The note of the one `Restarted` Event of a planning pass; `None` when it restarted nothing.
pub fn restarted_note(policy: &str, revision: &str, restarted: &[WorkloadRef]) -> Option<String> {
    let (count, names) = named(restarted, "workload")?;
    Some(format!(
        "Restarted {count} for revision {revision} of policy {policy}: {names}; their pods \
         carried an outdated or missing injection"
    ))
}

/// The note of the one `UpdatedInPlace` Event of a planning pass; `None` when it updated none.
pub fn updated_note(policy: &str, revision: &str, updated: &[PodRef]) -> Option<String> {
    let (count, names) = named(updated, "pod")?;
    Some(format!(
        "Updated {count} in place for revision {revision} of policy {policy}: {names}; no \
         workload restarts for them"
    ))
}

/// The note of the Warning that names the pods `strategy: InPlace` leaves outdated.
pub fn not_in_place_note(policy: &str, revision: &str, pods: &[PodRef]) -> Option<String> {
    let (count, names) = named(pods, "pod")?;
    Some(format!(
        "{count} of policy {policy} need a restart for revision {revision}, which strategy \
         InPlace never does: {names}; restart their workloads, or set strategy Auto"
    ))
}

/// ("N things", the first [`NAMED_PER_EVENT`] names and how many more), so a note stays under
/// the Event's 1,000 characters; `None` for none.
fn named<T: std::fmt::Display>(items: &[T], noun: &str) -> Option<(String, String)> {
    let (first, rest) = items.split_at(items.len().min(NAMED_PER_EVENT));
    if first.is_empty() {
        return None;
    }
    let mut names: Vec<String> = first.iter().map(ToString::to_string).collect();
    if !rest.is_empty() {
        names.push(format!("and {} more", rest.len()));
    }
    let count = match items.len() {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    };
    Some((count, names.join(", ")))
}

/// What the planner knows of one workload.
#[derive(Clone, Debug)]
pub struct Workload {
    pub id: WorkloadRef,
    /// Its pod selector (`spec.selector`).
    pub selector: Selector,
    /// The pod template's `splice.dev/restartedFor` (`<policy>@<revision>`) and `restartedAt`.
    pub restarted_for: Option<String>,
    pub restarted_at: Option<Timestamp>,
    /// `spec.paused` (Deployments).
    pub paused: bool,
    /// Rolled out and fully available: see [`settled`].
    pub settled: bool,
    /// A PodDisruptionBudget selecting its pods allows no disruption now.
    pub disruption_blocked: bool,
}

/// The numbers [`settled`] reads from a workload's spec and status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub generation: i64,
    pub observed_generation: i64,
    /// Pods wanted (`spec.replicas`, a DaemonSet's `desiredNumberScheduled`).
    pub desired: i32,
    /// Pods that exist (`status.replicas`, a DaemonSet's `currentNumberScheduled`).
    pub current: i32,
    /// Pods of the latest template.
    pub updated: i32,
    pub available: i32,
}

/// Whether the workload's controller has rolled out its latest template and every pod is
/// available: what `kubectl rollout status` waits for. False while it is rolling (generation not
/// observed, pods of an older template left) or not fully available.
pub fn settled(p: Progress) -> bool {
    p.observed_generation >= p.generation
        && p.updated >= p.desired
        && p.current <= p.updated
        && p.available >= p.desired
}

/// A pod of the policy's that a restart could bring to the current revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodNeed {
    Outdated,
    Missed,
}

/// How an outdated pod's change can reach it, as the engine sorted it
/// (`splice_engine::change::sort`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPath {
    /// Not sorted yet (its full object not read yet): it waits.
    Unsorted,
    /// An image, CPU or memory, labels or annotations: in place.
    InPlace,
    /// Anything else: its workload restarts.
    Restart,
}

/// One pod's need, with what attributes it to a workload.
#[derive(Clone, Copy, Debug)]
pub struct PodNeeding<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub owner: PodOwner,
    pub need: PodNeed,
    /// The policy's open canary selects it (its namespace's labels and its own).
    pub in_canary: bool,
    /// For an outdated pod under `Auto` or `InPlace`; `Restart` otherwise.
    pub path: PodPath,
}

/// A pod updated in place for the policy's revision, and where its proof stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Updating<'a> {
    pub pod: PodRef,
    /// When it was updated: the timeout counts from here.
    pub at: Option<Timestamp>,
    pub proof: InPlaceProof,
    pub in_canary: bool,
    /// The namespace, borrowed for the budget's count.
    pub namespace: &'a str,
}

/// The proof of one in-place update, as the rollout last read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InPlaceProof {
    Done,
    Waiting(String),
    /// It cannot come any more (another container restarted): fails at once.
    Broken(String),
}

/// A pod, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pod/{}/{}", self.namespace, self.name)
    }
}

/// The rollout settings of one policy, as the planner uses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_concurrent: usize,
    pub max_per_namespace: usize,
    pub timeout: Duration,
    pub repair_missed: bool,
}

/// One policy's input.
#[derive(Clone, Debug)]
pub struct PolicyInput<'a> {
    pub policy: &'a str,
    /// The template hash the webhook injects now.
    pub revision: &'a str,
    pub limits: Limits,
    /// What halted this revision's rollout before and when, as `status.rollout` says (unless a
    /// resume came after): a halted rollout stays halted until the revision changes.
    pub halted_by: Option<&'a str>,
    pub halted_at: Option<Timestamp>,
    /// A halt requested on the policy (`splice.dev/rollout-halt`).
    pub held: bool,
    /// When a resume of this revision was requested: workloads restarted before it that
    /// failed no longer halt the rollout.
    pub resumed_at: Option<Timestamp>,
    /// The policy's pods that are outdated or missed, in the namespaces it selects.
    pub pods: Vec<PodNeeding<'a>>,
    /// A canary is open: only workloads of canary pods restart, until it is promoted.
    pub canary: bool,
    /// `kubectl splice rollout promote` asked to promote this canary now.
    pub promote_requested: bool,
    pub strategy: RolloutStrategy,
    /// Pods updated in place for this revision.
    pub updating: Vec<Updating<'a>>,
    /// With `spec.overrides`, by namespace: what the values its pods take from it come to
    /// (`Overrides::namespace_mark`), recorded with each restart.
    pub marks: &'a BTreeMap<String, String>,
}

/// Why a workload that needs a restart is not restarted now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    Paused,
    /// Rolling already, or not fully available.
    NotSettled,
    DisruptionBudget,
    PolicyBudget,
    NamespaceBudget,
    ClusterBudget,
    Halted,
    /// Outside the open canary: waits for its promotion.
    Canary,
}

/// Where one workload stands for a policy's revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Standing {
    Needs,
    Restarting,
    Done,
    Failed,
    /// Failed, restarted before a resume: counted, but halts nothing.
    FailedBeforeResume,
}

/// What to do for one policy, and its status once done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub policy: String,
    pub revision: String,
    pub restart: Vec<WorkloadRef>,
    pub waiting: Vec<(WorkloadRef, Wait)>,
    /// The workload that timed out first, when the rollout halts now for the first time.
    pub newly_failed: Option<WorkloadRef>,
    /// Or the pod whose in-place update failed first, and why.
    pub newly_failed_pod: Option<(PodRef, String)>,
    /// Pods to update in place now.
    pub update: Vec<PodRef>,
    /// Under `strategy: InPlace`, outdated pods whose change needs a restart.
    pub not_in_place: Vec<PodRef>,
    /// The open canary is promoted now: every canary workload is fully available on the new
    /// revision, or a promotion was requested.
    pub promote: bool,
    pub status: RolloutStatus,
}

/// `haltedBy` of a rollout halted by `splice.dev/rollout-halt`.
pub const HALT_REQUESTED: &str = "halt requested";

/// The restart annotation's value for a policy's revision.
pub fn restarted_for(policy: &str, revision: &str, mark: Option<&str>) -> String {
    match mark {
        None => format!("{policy}@{revision}"),
        Some(mark) => format!("{policy}@{revision}~{mark}"),
    }
}

/// Plans every policy's rollout in one pass, so the cluster-wide `cap` holds across policies.
/// `excluded` are namespaces never touched (the mandatory exclusions and Splice's own); a
/// workload two policies want restarted is restarted by the first (name order) only. The budget
/// counts workloads restarting and pods updating in place alike.
pub fn plan(
    policies: &[PolicyInput<'_>],
    workloads: &[Workload],
    excluded: &[String],
    cap: usize,
    now: Timestamp,
) -> Vec<Plan> {
    let mut workloads: Vec<&Workload> = workloads
        .iter()
        .filter(|w| !excluded.contains(&w.id.namespace))
        .collect();
    workloads.sort_by(|a, b| a.id.cmp(&b.id));
    let mut by_namespace: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, w) in workloads.iter().enumerate() {
        by_namespace.entry(&w.id.namespace).or_default().push(i);
    }
    // First every policy's standing, so what is restarting or updating for any of them counts
    // against the cap before anything new starts.
    let mut stoods = Vec::with_capacity(policies.len());
    let mut in_flight = 0usize;
    for p in policies {
        let stood = stand(p, &workloads, &by_namespace, now);
        in_flight += stood
            .standing
            .values()
            .filter(|s| **s == Standing::Restarting)
            .count();
        in_flight += p
            .updating
            .iter()
            .filter(|u| pod_standing(p, u, now) == Standing::Restarting)
            .count();
        stoods.push(stood);
    }
    let mut chosen: HashSet<usize> = HashSet::new();
    let mut out = Vec::with_capacity(policies.len());
    for (p, stood) in policies.iter().zip(stoods) {
        let Stood {
            standing,
            manual,
            canary: canary_workloads,
            in_place,
            not_in_place,
            unsorted,
        } = stood;
        let mut status = RolloutStatus {
            revision: p.revision.to_owned(),
            manual,
            not_in_place: not_in_place.len() as i64,
            outdated: unsorted,
            ..RolloutStatus::default()
        };
        let mut per_namespace: HashMap<&str, usize> = HashMap::new();
        let mut first_failed: Option<usize> = None;
        for (&i, s) in &standing {
            match s {
                Standing::Restarting => {
                    status.restarting += 1;
                    *per_namespace.entry(&workloads[i].id.namespace).or_default() += 1;
                }
                Standing::Done => status.done += 1,
                Standing::Failed => {
                    status.failed += 1;
                    first_failed.get_or_insert(i);
                }
                Standing::FailedBeforeResume => status.failed += 1,
                Standing::Needs => status.outdated += 1,
            }
        }
        let mut first_failed_pod: Option<(PodRef, String)> = None;
        for u in &p.updating {
            match pod_standing(p, u, now) {
                Standing::Restarting => {
                    status.updating += 1;
                    *per_namespace.entry(u.namespace).or_default() += 1;
                }
                Standing::Done => status.updated_in_place += 1,
                Standing::Failed => {
                    status.failed += 1;
                    let why = match &u.proof {
                        InPlaceProof::Broken(r) | InPlaceProof::Waiting(r) => r.clone(),
                        InPlaceProof::Done => String::new(),
                    };
                    first_failed_pod.get_or_insert((u.pod.clone(), why));
                }
                Standing::FailedBeforeResume | Standing::Needs => status.failed += 1,
            }
        }
        let halted =
            p.held || p.halted_by.is_some() || first_failed.is_some() || first_failed_pod.is_some();
        let mut restart = Vec::new();
        let mut waiting = Vec::new();
        let mut free = p
            .limits
            .max_concurrent
            .saturating_sub((status.restarting + status.updating) as usize);
        let mut budget = |namespace: &str, per_namespace: &mut HashMap<&str, usize>| {
            let in_namespace = per_namespace.get(namespace).copied().unwrap_or(0);
            if free == 0 {
                Some(Wait::PolicyBudget)
            } else if in_namespace >= p.limits.max_per_namespace {
                Some(Wait::NamespaceBudget)
            } else if in_flight >= cap {
                Some(Wait::ClusterBudget)
            } else {
                free -= 1;
                in_flight += 1;
                None
            }
        };
        for (&i, _) in standing.iter().filter(|(_, s)| **s == Standing::Needs) {
            let w = workloads[i];
            let wait = if halted {
                Some(Wait::Halted)
            } else if p.canary && !canary_workloads.contains(&i) {
                Some(Wait::Canary)
            } else if w.paused {
                Some(Wait::Paused)
            } else if (!w.settled && !rolling_for_us(w, p.policy)) || chosen.contains(&i) {
                Some(Wait::NotSettled)
            } else if w.disruption_blocked {
                Some(Wait::DisruptionBudget)
            } else {
                budget(&w.id.namespace, &mut per_namespace)
            };
            match wait {
                Some(reason) => waiting.push((w.id.clone(), reason)),
                None => {
                    chosen.insert(i);
                    *per_namespace.entry(&w.id.namespace).or_default() += 1;
                    restart.push(w.id.clone());
                }
            }
        }
        // Canary pods first, then the rest in order.
        let mut update = Vec::new();
        let mut in_place = in_place;
        in_place.sort_by_key(|(_, _, in_canary)| !*in_canary);
        for (pod, namespace, in_canary) in &in_place {
            let go = !halted
                && (!p.canary || *in_canary)
                && budget(namespace, &mut per_namespace).is_none();
            if go {
                *per_namespace.entry(namespace).or_default() += 1;
                update.push(pod.clone());
            }
        }
        status.outdated += (in_place.len() - update.len()) as i64;
        let moved = restart.len() as i64;
        status.outdated -= moved;
        status.restarting += moved;
        status.updating += update.len() as i64;
        // The gate: while a canary is open, every workload restarted and every pod updated for
        // this revision is a canary's. It opens when none is left to change or changing, none
        // failed, and at least one is on the new revision: no evidence, no promotion.
        let canary_left = standing
            .iter()
            .any(|(i, s)| *s == Standing::Needs && canary_workloads.contains(i))
            || in_place
                .iter()
                .any(|(pod, _, c)| *c && !update.contains(pod));
        let promote = p.canary
            && !halted
            && (p.promote_requested
                || (!canary_left
                    && status.restarting == 0
                    && status.updating == 0
                    && status.done + status.updated_in_place > 0));
        status.phase = if halted {
            RolloutPhase::Halted
        } else if p.canary && !promote {
            RolloutPhase::Canary
        } else if status.restarting > 0 || status.outdated > 0 || status.updating > 0 {
            RolloutPhase::Rolling
        } else if status.done > 0 || status.updated_in_place > 0 {
            RolloutPhase::Complete
        } else {
            RolloutPhase::Idle
        };
        status.halted_by = match (p.halted_by, first_failed, &first_failed_pod) {
            (Some(before), _, _) => Some(before.to_owned()),
            (None, Some(i), _) => Some(workloads[i].id.to_string()),
            (None, None, Some((pod, _))) => Some(pod.to_string()),
            (None, None, None) => p.held.then(|| HALT_REQUESTED.to_owned()),
        };
        if status.halted_by.is_some() {
            let at = if p.halted_by.is_some() {
                p.halted_at.unwrap_or(now)
            } else {
                now
            };
            status.halted_at = Some(at.to_string());
        }
        let newly_failed = match (p.halted_by, first_failed) {
            (None, Some(i)) => Some(workloads[i].id.clone()),
            _ => None,
        };
        let newly_failed_pod = match (p.halted_by, first_failed) {
            (None, None) => first_failed_pod,
            _ => None,
        };
        out.push(Plan {
            policy: p.policy.to_owned(),
            revision: p.revision.to_owned(),
            restart,
            waiting,
            newly_failed,
            newly_failed_pod,
            update,
            not_in_place,
            promote,
            status,
        });
    }
    out
}

/// Where a pod updated in place stands: proven (done), waiting within the timeout (counted as
/// restarting), or failed (its proof broke, or did not come within the timeout).
fn pod_standing(p: &PolicyInput<'_>, u: &Updating<'_>, now: Timestamp) -> Standing {
    match &u.proof {
        InPlaceProof::Done => Standing::Done,
        InPlaceProof::Broken(_) => match expiry(p, u.at, now) {
            Expiry::BeforeResume => Standing::FailedBeforeResume,
            _ if u.at.zip(p.resumed_at).is_some_and(|(at, r)| at <= r) => {
                Standing::FailedBeforeResume
            }
            _ => Standing::Failed,
        },
        InPlaceProof::Waiting(_) => match expiry(p, u.at, now) {
            Expiry::Within => Standing::Restarting,
            Expiry::BeforeResume => Standing::FailedBeforeResume,
            Expiry::Expired => Standing::Failed,
        },
    }
}

/// Still rolling from this policy's restart for an earlier revision (a halted one, say): the new
/// revision replaces that restart rather than waiting for a rollout that may never finish.
fn rolling_for_us(w: &Workload, policy: &str) -> bool {
    w.restarted_for
        .as_deref()
        .and_then(|r| r.split_once('@'))
        .is_some_and(|(p, _)| p == policy)
}

/// What [`stand`] finds for one policy.
struct Stood<'p> {
    /// Each workload's standing (ordered, so plans are deterministic).
    standing: BTreeMap<usize, Standing>,
    /// Pods no workload restart can reach.
    manual: i64,
    /// Workloads of canary pods.
    canary: HashSet<usize>,
    /// Outdated pods to update in place, in order: (pod, namespace, in the canary).
    in_place: Vec<(PodRef, &'p str, bool)>,
    /// Under `InPlace`, pods whose change needs a restart.
    not_in_place: Vec<PodRef>,
    /// Outdated pods not sorted yet.
    unsorted: i64,
}

/// Each workload's standing for the policy, and where each outdated pod goes: its workload's
/// restart, an in-place update, or (under `InPlace`, needing a restart) nowhere, counted.
fn stand<'p>(
    p: &PolicyInput<'p>,
    workloads: &[&Workload],
    by_namespace: &HashMap<&str, Vec<usize>>,
    now: Timestamp,
) -> Stood<'p> {
    let mine = |namespace: &str| {
        restarted_for(
            p.policy,
            p.revision,
            p.marks.get(namespace).map(String::as_str),
        )
    };
    let mut standing: BTreeMap<usize, Standing> = BTreeMap::new();
    // Every workload restarted for this revision (and its namespace's override values), needing
    // it or not any more.
    for (i, w) in workloads.iter().enumerate() {
        if w.restarted_for.as_deref() != Some(mine(&w.id.namespace).as_str()) {
            continue;
        }
        let s = if w.settled {
            Standing::Done
        } else {
            match expiry(p, w.restarted_at, now) {
                Expiry::Within => Standing::Restarting,
                Expiry::BeforeResume => Standing::FailedBeforeResume,
                Expiry::Expired => Standing::Failed,
            }
        };
        standing.insert(i, s);
    }
    let mut stood = Stood {
        standing,
        manual: 0,
        canary: HashSet::new(),
        in_place: Vec::new(),
        not_in_place: Vec::new(),
        unsorted: 0,
    };
    let owner_of = |pod: &PodNeeding<'_>| {
        by_namespace.get(pod.namespace).and_then(|candidates| {
            candidates.iter().copied().find(|&i| {
                let w = workloads[i];
                w.id.kind.owns_pods_of(pod.owner)
                    && !w.selector.requirements().is_empty()
                    && w.selector
                        .matches(|k| pod.labels.get(k).map(String::as_str))
            })
        })
    };
    let needs_restart = |pod: &PodNeeding<'_>| {
        pod.need == PodNeed::Missed
            || p.strategy == RolloutStrategy::Restart
            || pod.path == PodPath::Restart
    };
    let wanted = p
        .pods
        .iter()
        .filter(|pod| pod.need == PodNeed::Outdated || p.limits.repair_missed);
    // Restarts first, so a pod whose workload restarts anyway is left to that restart.
    for pod in wanted.clone().filter(|pod| needs_restart(pod)) {
        let id = PodRef {
            namespace: pod.namespace.to_owned(),
            name: pod.name.to_owned(),
        };
        if p.strategy == RolloutStrategy::InPlace {
            stood.not_in_place.push(id);
            continue;
        }
        match owner_of(pod) {
            Some(i) => {
                stood.standing.entry(i).or_insert(Standing::Needs);
                if pod.in_canary {
                    stood.canary.insert(i);
                }
            }
            None => stood.manual += 1,
        }
    }
    for pod in wanted.filter(|pod| !needs_restart(pod)) {
        if owner_of(pod).is_some_and(|i| stood.standing.contains_key(&i)) {
            continue;
        }
        match pod.path {
            PodPath::Unsorted => stood.unsorted += 1,
            _ => stood.in_place.push((
                PodRef {
                    namespace: pod.namespace.to_owned(),
                    name: pod.name.to_owned(),
                },
                pod.namespace,
                pod.in_canary,
            )),
        }
    }
    stood
}

/// Where something started at `at` stands against the policy's timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expiry {
    Within,
    /// Timed out, started before a resume: counted, halts nothing.
    BeforeResume,
    Expired,
}

fn expiry(p: &PolicyInput<'_>, at: Option<Timestamp>, now: Timestamp) -> Expiry {
    let timed_out = at
        .and_then(|t| {
            let timeout = i64::try_from(p.limits.timeout.as_secs()).ok()?;
            t.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(timeout))
                .ok()
        })
        .is_some_and(|deadline| now > deadline);
    let before_resume = match (at, p.resumed_at) {
        (Some(at), Some(resumed)) => at <= resumed,
        _ => false,
    };
    match (timed_out, before_resume) {
        (false, _) => Expiry::Within,
        (true, true) => Expiry::BeforeResume,
        (true, false) => Expiry::Expired,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_restarted_event_per_pass_names_its_workloads_and_counts_past_ten() {
        let id = |n: usize| WorkloadRef {
            kind: Kind::Deployment,
            namespace: "shop".into(),
            name: format!("web-{n}"),
        };
        assert_eq!(restarted_note("mesh", "abc", &[]), None);
        let one = restarted_note("mesh", "abc", &[id(1)]).unwrap();
        assert_eq!(
            one,
            "Restarted 1 workload for revision abc of policy mesh: Deployment/shop/web-1; their \
             pods carried an outdated or missing injection"
        );
        let many: Vec<WorkloadRef> = (0..13).map(id).collect();
        let note = restarted_note("mesh", "abc", &many).unwrap();
        assert!(note.starts_with("Restarted 13 workloads"), "{note}");
        assert!(
            note.contains("Deployment/shop/web-9, and 3 more;"),
            "{note}"
        );
        assert!(!note.contains("web-10"), "{note}");
        assert!(note.len() < 1000);
    }

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use super::*;

    static NO_MARKS: BTreeMap<String, String> = BTreeMap::new();

    const NOW: i64 = 10_000;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn labels(app: &str) -> BTreeMap<String, String> {
        [("app".to_owned(), app.to_owned())].into()
    }

    fn deployment(ns: &str, name: &str) -> Workload {
        Workload {
            id: WorkloadRef {
                kind: Kind::Deployment,
                namespace: ns.into(),
                name: name.into(),
            },
            selector: Selector::read(Some(&LabelSelector {
                match_labels: Some(labels(name)),
                ..Default::default()
            })),
            restarted_for: None,
            restarted_at: None,
            paused: false,
            settled: true,
            disruption_blocked: false,
            // Every field set, so a test changes only what it is about.
        }
    }

    fn restarted(mut w: Workload, revision: &str, at: i64, settled: bool) -> Workload {
        w.restarted_for = Some(restarted_for("mesh", revision, None));
        w.restarted_at = Some(ts(at));
        w.settled = settled;
        w
    }

    fn limits(max: usize, per_ns: usize) -> Limits {
        Limits {
            max_concurrent: max,
            max_per_namespace: per_ns,
            timeout: Duration::from_secs(300),
            repair_missed: false,
        }
    }

    struct Pods(Vec<(String, BTreeMap<String, String>, PodOwner, PodNeed)>);

    impl Pods {
        fn of(workloads: &[Workload], need: PodNeed) -> Self {
            Pods(
                workloads
                    .iter()
                    .map(|w| {
                        (
                            w.id.namespace.clone(),
                            labels(&w.id.name),
                            PodOwner::ReplicaSet,
                            need,
                        )
                    })
                    .collect(),
            )
        }

        fn needing(&self) -> Vec<PodNeeding<'_>> {
            self.0
                .iter()
                .map(|(ns, l, owner, need)| PodNeeding {
                    namespace: ns,
                    name: l.get("app").map_or("", String::as_str),
                    path: PodPath::Restart,
                    labels: l,
                    owner: *owner,
                    need: *need,
                    in_canary: ns.starts_with("canary"),
                })
                .collect()
        }
    }

    fn input<'a>(pods: &'a Pods, limits: Limits) -> PolicyInput<'a> {
        PolicyInput {
            policy: "mesh",
            revision: "r2",
            limits,
            halted_by: None,
            halted_at: None,
            held: false,
            resumed_at: None,
            pods: pods.needing(),
            canary: false,
            promote_requested: false,
            strategy: RolloutStrategy::Restart,
            updating: Vec::new(),
            marks: &NO_MARKS,
        }
    }

    fn one(p: PolicyInput<'_>, workloads: &[Workload], cap: usize) -> Plan {
        plan(&[p], workloads, &[], cap, ts(NOW)).remove(0)
    }

    fn names(refs: &[WorkloadRef]) -> Vec<String> {
        refs.iter().map(|r| r.to_string()).collect()
    }

    #[test]
    fn outdated_workloads_restart_up_to_the_policys_budget_one_per_namespace() {
        let workloads = [
            deployment("a", "w1"),
            deployment("a", "w2"),
            deployment("b", "w3"),
            deployment("c", "w4"),
        ];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let p = one(input(&pods, limits(2, 1)), &workloads, 10);
        assert_eq!(
            names(&p.restart),
            ["Deployment/a/w1", "Deployment/b/w3"],
            "two at once, never two in namespace a"
        );
        assert_eq!(p.status.restarting, 2);
        assert_eq!(p.status.outdated, 2);
        assert_eq!(p.status.phase, RolloutPhase::Rolling);
        assert_eq!(
            p.waiting,
            [
                (workloads[1].id.clone(), Wait::NamespaceBudget),
                (workloads[3].id.clone(), Wait::PolicyBudget),
            ]
        );
    }

    #[test]
    fn a_namespace_allowance_above_one_lets_a_namespace_restart_several() {
        let workloads = [deployment("a", "w1"), deployment("a", "w2")];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let p = one(input(&pods, limits(3, 2)), &workloads, 10);
        assert_eq!(p.restart.len(), 2);
        let p = one(input(&pods, limits(3, 1)), &workloads, 10);
        assert_eq!(p.restart.len(), 1);
        assert_eq!(
            p.waiting,
            [(workloads[1].id.clone(), Wait::NamespaceBudget)]
        );
    }

    #[test]
    fn workloads_already_restarting_use_the_budget() {
        let workloads = [
            restarted(deployment("a", "w1"), "r2", NOW - 10, false),
            deployment("b", "w2"),
            deployment("c", "w3"),
        ];
        let pods = Pods::of(&workloads[1..], PodNeed::Outdated);
        let p = one(input(&pods, limits(2, 1)), &workloads, 10);
        assert_eq!(names(&p.restart), ["Deployment/b/w2"]);
        assert_eq!(p.status.restarting, 2);
    }

    #[test]
    fn the_cluster_cap_holds_across_policies() {
        let workloads = [
            deployment("a", "w1"),
            deployment("b", "w2"),
            deployment("c", "w3"),
        ];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let mut other = input(&pods, limits(5, 5));
        other.policy = "other";
        let plans = plan(
            &[input(&pods, limits(5, 5)), other],
            &workloads,
            &[],
            2,
            ts(NOW),
        );
        assert_eq!(plans[0].restart.len(), 2);
        assert!(plans[1].restart.is_empty(), "the cap of 2 is used up");
        assert!(
            plans[1]
                .waiting
                .iter()
                .all(|(_, w)| matches!(w, Wait::NotSettled | Wait::ClusterBudget)),
            "{:?}",
            plans[1].waiting
        );
    }

    #[test]
    fn workloads_restarting_for_another_policy_count_against_the_cap() {
        let mut busy = deployment("z", "busy");
        busy.restarted_for = Some(restarted_for("other", "x", None));
        busy.restarted_at = Some(ts(NOW));
        busy.settled = false;
        let workloads = [deployment("a", "w1"), busy];
        let pods = Pods::of(&workloads[..1], PodNeed::Outdated);
        let mut other_pods = Pods(vec![]);
        other_pods.0.clear();
        let other = PolicyInput {
            policy: "other",
            revision: "x",
            limits: limits(1, 1),
            halted_by: None,
            halted_at: None,
            held: false,
            resumed_at: None,
            pods: other_pods.needing(),
            canary: false,
            promote_requested: false,
            strategy: RolloutStrategy::Restart,
            updating: Vec::new(),
            marks: &NO_MARKS,
        };
        let plans = plan(
            &[input(&pods, limits(5, 5)), other],
            &workloads,
            &[],
            1,
            ts(NOW),
        );
        assert!(plans[0].restart.is_empty());
        assert_eq!(
            plans[0].waiting,
            [(workloads[0].id.clone(), Wait::ClusterBudget)]
        );
    }

    #[test]
    fn a_paused_rolling_unavailable_or_disruption_blocked_workload_waits() {
        let mut paused = deployment("a", "paused");
        paused.paused = true;
        let mut rolling = deployment("b", "rolling");
        rolling.settled = false;
        let mut blocked = deployment("c", "blocked");
        blocked.disruption_blocked = true;
        let workloads = [paused, rolling, blocked];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let p = one(input(&pods, limits(10, 10)), &workloads, 10);
        assert!(p.restart.is_empty());
        assert_eq!(
            p.waiting.iter().map(|(_, w)| *w).collect::<Vec<_>>(),
            [Wait::Paused, Wait::NotSettled, Wait::DisruptionBudget]
        );
        assert_eq!(p.status.outdated, 3);
        assert_eq!(p.status.phase, RolloutPhase::Rolling);
    }

    #[test]
    fn a_workload_restarted_for_this_revision_is_never_restarted_again() {
        // Its pods still look outdated (the cache lags, or a pod was admitted uninjected): a
        // new leader must not restart it a second time.
        let workloads = [
            restarted(deployment("a", "rolling"), "r2", NOW - 10, false),
            restarted(deployment("b", "done"), "r2", NOW - 100, true),
        ];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let p = one(input(&pods, limits(10, 10)), &workloads, 10);
        assert!(p.restart.is_empty());
        assert_eq!((p.status.restarting, p.status.done), (1, 1));
    }

    #[test]
    fn a_workload_restarted_for_an_earlier_revision_restarts_again() {
        let workloads = [restarted(deployment("a", "w"), "r1", NOW - 1000, true)];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let p = one(input(&pods, limits(1, 1)), &workloads, 10);
        assert_eq!(names(&p.restart), ["Deployment/a/w"]);
    }

    #[test]
    fn a_workload_restarted_for_an_earlier_namespace_value_of_its_overrides_restarts_again() {
        // Same revision, but its namespace's override values moved since (mark m1 to m2).
        let mut w = deployment("a", "w");
        w.restarted_for = Some(restarted_for("mesh", "r2", Some("m1")));
        w.restarted_at = Some(ts(NOW - 1000));
        let workloads = [w];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let marks: BTreeMap<String, String> = [("a".to_owned(), "m2".to_owned())].into();
        let p = one(
            PolicyInput {
                marks: &marks,
                ..input(&pods, limits(1, 1))
            },
            &workloads,
            10,
        );
        assert_eq!(names(&p.restart), ["Deployment/a/w"]);
        // Restarted for m2 already: never again.
        let mut done = workloads[0].clone();
        done.restarted_for = Some(restarted_for("mesh", "r2", Some("m2")));
        let done = [done];
        let p = one(
            PolicyInput {
                marks: &marks,
                ..input(&pods, limits(1, 1))
            },
            &done,
            10,
        );
        assert!(p.restart.is_empty());
    }

    #[test]
    fn when_every_restarted_workload_is_available_the_rollout_is_complete() {
        let workloads = [
            restarted(deployment("a", "w1"), "r2", NOW - 100, true),
            deployment("b", "untouched"),
        ];
        let pods = Pods(vec![]);
        let p = one(input(&pods, limits(1, 1)), &workloads, 10);
        assert_eq!(p.status.phase, RolloutPhase::Complete);
        assert_eq!(p.status.done, 1);
        let nothing: [Workload; 0] = [];
        let p = one(input(&pods, limits(1, 1)), &nothing, 10);
        assert_eq!(p.status.phase, RolloutPhase::Idle);
    }

    #[test]
    fn a_workload_not_available_within_the_timeout_halts_the_rollout() {
        let workloads = [
            restarted(deployment("a", "stuck"), "r2", NOW - 301, false),
            deployment("b", "next"),
        ];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let p = one(input(&pods, limits(5, 5)), &workloads, 10);
        assert!(p.restart.is_empty(), "nothing more is restarted");
        assert_eq!(p.status.phase, RolloutPhase::Halted);
        assert_eq!(p.status.failed, 1);
        assert_eq!(p.status.halted_by.as_deref(), Some("Deployment/a/stuck"));
        assert_eq!(p.newly_failed, Some(workloads[0].id.clone()));
        assert_eq!(p.waiting, [(workloads[1].id.clone(), Wait::Halted)]);
    }

    #[test]
    fn a_halted_rollout_stays_halted_after_the_failed_workload_recovers() {
        let workloads = [
            restarted(deployment("a", "stuck"), "r2", NOW - 400, true),
            deployment("b", "next"),
        ];
        let pods = Pods::of(&workloads[1..], PodNeed::Outdated);
        let mut i = input(&pods, limits(5, 5));
        i.halted_by = Some("Deployment/a/stuck");
        let p = one(i, &workloads, 10);
        assert!(p.restart.is_empty());
        assert_eq!(p.status.phase, RolloutPhase::Halted);
        assert_eq!(p.newly_failed, None, "the halt was reported before");
    }

    #[test]
    fn a_halt_request_restarts_nothing_and_reads_halted() {
        let workloads = [deployment("a", "w")];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let mut i = input(&pods, limits(5, 5));
        i.held = true;
        let p = one(i, &workloads, 10);
        assert!(p.restart.is_empty());
        assert_eq!(p.status.phase, RolloutPhase::Halted);
        assert_eq!(p.status.halted_by.as_deref(), Some(HALT_REQUESTED));
        assert_eq!(p.newly_failed, None, "no workload failed");
    }

    #[test]
    fn after_a_resume_a_workload_that_failed_before_it_no_longer_halts() {
        let workloads = [
            restarted(deployment("a", "stuck"), "r2", NOW - 400, false),
            deployment("b", "next"),
        ];
        let pods = Pods::of(&workloads[1..], PodNeed::Outdated);
        let mut i = input(&pods, limits(5, 5));
        i.resumed_at = Some(ts(NOW - 10));
        let p = one(i, &workloads, 10);
        assert_eq!(names(&p.restart), ["Deployment/b/next"]);
        assert_eq!(p.status.failed, 1);
        assert_eq!(p.status.phase, RolloutPhase::Rolling);
    }

    #[test]
    fn a_halt_keeps_the_time_it_was_first_recorded() {
        let workloads = [restarted(deployment("a", "stuck"), "r2", NOW - 400, false)];
        let pods = Pods(vec![]);
        let mut i = input(&pods, limits(5, 5));
        i.halted_by = Some("Deployment/a/stuck");
        i.halted_at = Some(ts(NOW - 50));
        let p = one(i, &workloads, 10);
        assert_eq!(p.status.halted_at, Some(ts(NOW - 50).to_string()));
        let p = one(input(&pods, limits(5, 5)), &workloads, 10);
        assert_eq!(p.status.halted_at, Some(ts(NOW).to_string()), "halted now");
    }

    #[test]
    fn within_the_timeout_a_slow_workload_is_still_restarting() {
        let workloads = [restarted(deployment("a", "slow"), "r2", NOW - 299, false)];
        let pods = Pods(vec![]);
        let p = one(input(&pods, limits(1, 1)), &workloads, 10);
        assert_eq!(p.status.phase, RolloutPhase::Rolling);
        assert_eq!(p.status.restarting, 1);
    }

    #[test]
    fn missed_pods_restart_their_workload_only_with_repair_missed() {
        let workloads = [deployment("a", "w")];
        let pods = Pods::of(&workloads, PodNeed::Missed);
        let p = one(input(&pods, limits(1, 1)), &workloads, 10);
        assert!(p.restart.is_empty());
        assert_eq!(p.status.phase, RolloutPhase::Idle);
        let mut l = limits(1, 1);
        l.repair_missed = true;
        let p = one(input(&pods, l), &workloads, 10);
        assert_eq!(names(&p.restart), ["Deployment/a/w"]);
    }

    #[test]
    fn bare_pods_job_pods_and_pods_of_no_known_workload_are_manual() {
        let workloads = [deployment("a", "w")];
        let pods = Pods(vec![
            ("a".into(), labels("w"), PodOwner::None, PodNeed::Outdated),
            (
                "a".into(),
                labels("batch"),
                PodOwner::Job,
                PodNeed::Outdated,
            ),
            // A ReplicaSet of its own, no Deployment selects it.
            (
                "a".into(),
                labels("x"),
                PodOwner::ReplicaSet,
                PodNeed::Outdated,
            ),
        ]);
        let p = one(input(&pods, limits(1, 1)), &workloads, 10);
        assert!(p.restart.is_empty());
        assert_eq!(p.status.manual, 3);
        assert_eq!(p.status.outdated, 0);
    }

    #[test]
    fn excluded_namespaces_are_never_touched() {
        let workloads = [
            deployment("kube-system", "dns"),
            deployment("splice-system", "splice"),
        ];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let excluded = ["kube-system".to_owned(), "splice-system".to_owned()];
        let p = plan(
            &[input(&pods, limits(5, 5))],
            &workloads,
            &excluded,
            10,
            ts(NOW),
        )
        .remove(0);
        assert!(p.restart.is_empty());
        assert_eq!(p.status.outdated, 0);
    }

    #[test]
    fn pods_belong_to_the_workload_of_their_kind_whose_selector_matches() {
        let mut sts = deployment("a", "db");
        sts.id.kind = Kind::StatefulSet;
        let mut ds = deployment("a", "agent");
        ds.id.kind = Kind::DaemonSet;
        let workloads = [deployment("a", "db"), sts, ds];
        let pods = Pods(vec![
            (
                "a".into(),
                labels("db"),
                PodOwner::StatefulSet,
                PodNeed::Outdated,
            ),
            (
                "a".into(),
                labels("agent"),
                PodOwner::DaemonSet,
                PodNeed::Outdated,
            ),
        ]);
        let p = one(input(&pods, limits(5, 1)), &workloads, 10);
        assert_eq!(
            names(&p.restart),
            ["StatefulSet/a/db"],
            "the Deployment of the same labels is not the owner; one per namespace"
        );
        assert_eq!(p.status.outdated, 1);
    }

    #[test]
    fn a_workload_two_policies_want_is_restarted_once() {
        let workloads = [deployment("a", "w")];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let mut other = input(&pods, limits(5, 5));
        other.policy = "other";
        let plans = plan(
            &[input(&pods, limits(5, 5)), other],
            &workloads,
            &[],
            10,
            ts(NOW),
        );
        assert_eq!(plans[0].restart.len(), 1);
        assert!(plans[1].restart.is_empty());
    }

    #[test]
    fn settled_is_what_kubectl_rollout_status_waits_for() {
        let done = Progress {
            generation: 2,
            observed_generation: 2,
            desired: 3,
            current: 3,
            updated: 3,
            available: 3,
        };
        assert!(settled(done));
        assert!(!settled(Progress {
            observed_generation: 1,
            ..done
        }));
        assert!(!settled(Progress { updated: 2, ..done }));
        assert!(!settled(Progress { current: 4, ..done }), "old pods left");
        assert!(!settled(Progress {
            available: 2,
            ..done
        }));
    }

    #[test]
    fn durations_parse_like_the_schema_allows() {
        use splice_crds::parse_duration;
        assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("45s"), Some(Duration::from_secs(45)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("m"), None);
        assert_eq!(parse_duration("5x"), None);
    }

    fn canary_input(pods: &Pods) -> PolicyInput<'_> {
        PolicyInput {
            canary: true,
            ..input(pods, limits(5, 1))
        }
    }

    #[test]
    fn while_a_canary_is_open_only_canary_workloads_restart_and_the_rest_wait_for_it() {
        let workloads = [
            deployment("canary-a", "w1"),
            deployment("canary-a", "w2"),
            deployment("prod", "w3"),
        ];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let p = one(canary_input(&pods), &workloads, 10);
        assert_eq!(p.restart, vec![workloads[0].id.clone()]);
        assert!(p.waiting.contains(&(workloads[2].id.clone(), Wait::Canary)));
        assert!(
            p.waiting
                .contains(&(workloads[1].id.clone(), Wait::NamespaceBudget))
        );
        assert_eq!(p.status.phase, RolloutPhase::Canary);
        assert!(!p.promote);
    }

    #[test]
    fn the_canary_is_promoted_once_every_canary_workload_is_available_on_the_new_revision() {
        let workloads = [
            restarted(deployment("canary-a", "w1"), "r2", NOW - 30, true),
            deployment("prod", "w3"),
        ];
        let pods = Pods::of(&workloads[1..], PodNeed::Outdated);
        let p = one(canary_input(&pods), &workloads, 10);
        assert!(p.promote);
        assert!(
            p.restart.is_empty(),
            "the rest waits for the promotion to be written"
        );
        assert_eq!(p.status.phase, RolloutPhase::Rolling);

        let still = [
            restarted(deployment("canary-a", "w1"), "r2", NOW - 30, false),
            deployment("prod", "w3"),
        ];
        let p = one(canary_input(&pods), &still, 10);
        assert!(
            !p.promote,
            "a canary workload still restarting holds the gate"
        );
        assert_eq!(p.status.phase, RolloutPhase::Canary);
    }

    #[test]
    fn a_canary_workload_that_times_out_halts_the_rollout_and_nothing_outside_restarts() {
        let workloads = [
            restarted(deployment("canary-a", "w1"), "r2", NOW - 400, false),
            deployment("prod", "w3"),
        ];
        let pods = Pods::of(&workloads[1..], PodNeed::Outdated);
        let p = one(canary_input(&pods), &workloads, 10);
        assert!(!p.promote);
        assert!(p.restart.is_empty());
        assert_eq!(p.status.phase, RolloutPhase::Halted);
        assert_eq!(p.newly_failed, Some(workloads[0].id.clone()));
    }

    #[test]
    fn a_canary_with_no_workload_waits_for_a_requested_promotion() {
        let workloads = [deployment("prod", "w3")];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let p = one(canary_input(&pods), &workloads, 10);
        assert!(!p.promote, "no canary workload: no evidence, no promotion");
        assert_eq!(p.status.phase, RolloutPhase::Canary);
        let requested = PolicyInput {
            promote_requested: true,
            ..canary_input(&pods)
        };
        assert!(one(requested, &workloads, 10).promote);
    }

    #[test]
    fn a_workload_stuck_on_this_policys_earlier_revision_is_restarted_for_the_new_one() {
        let stuck = restarted(deployment("a", "w1"), "r1", NOW - 600, false);
        let other = {
            let mut w = deployment("b", "w2");
            w.restarted_for = Some(restarted_for("other", "x", None));
            w.settled = false;
            w
        };
        let workloads = [stuck, other];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let p = one(input(&pods, limits(5, 5)), &workloads, 10);
        assert_eq!(p.restart, vec![workloads[0].id.clone()]);
        assert!(
            p.waiting
                .contains(&(workloads[1].id.clone(), Wait::NotSettled)),
            "another policy's rollout is not ours to replace"
        );
    }

    /// Pods of `workloads` needing the revision along `path` under `strategy`.
    fn in_place_input<'a>(
        needing: &'a [PodNeeding<'a>],
        strategy: RolloutStrategy,
        limits: Limits,
    ) -> PolicyInput<'a> {
        PolicyInput {
            pods: needing.to_vec(),
            strategy,
            ..input(&EMPTY, limits)
        }
    }

    static EMPTY: Pods = Pods(Vec::new());

    fn with_path<'a>(pods: &'a Pods, path: PodPath) -> Vec<PodNeeding<'a>> {
        pods.needing()
            .into_iter()
            .map(|p| PodNeeding { path, ..p })
            .collect()
    }

    fn pod(ns: &str, name: &str) -> PodRef {
        PodRef {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn updating<'a>(ns: &'a str, name: &str, at: i64, proof: InPlaceProof) -> Updating<'a> {
        Updating {
            pod: pod(ns, name),
            at: Some(ts(at)),
            proof,
            in_canary: false,
            namespace: ns,
        }
    }

    #[test]
    fn under_auto_a_pod_whose_change_is_in_place_is_updated_and_its_workload_not_restarted() {
        let workloads = [deployment("a", "w1"), deployment("b", "w2")];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let needing = with_path(&pods, PodPath::InPlace);
        let p = one(
            in_place_input(&needing, RolloutStrategy::Auto, limits(5, 1)),
            &workloads,
            10,
        );
        assert!(p.restart.is_empty(), "{:?}", p.restart);
        assert_eq!(p.update, [pod("a", "w1"), pod("b", "w2")]);
        assert_eq!(p.status.updating, 2);
        assert_eq!(p.status.phase, RolloutPhase::Rolling);
    }

    #[test]
    fn under_auto_a_pod_whose_change_needs_a_restart_restarts_its_workload() {
        let workloads = [deployment("a", "w1")];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let needing = with_path(&pods, PodPath::Restart);
        let p = one(
            in_place_input(&needing, RolloutStrategy::Auto, limits(5, 1)),
            &workloads,
            10,
        );
        assert_eq!(names(&p.restart), ["Deployment/a/w1"]);
        assert!(p.update.is_empty());
    }

    #[test]
    fn under_in_place_a_pod_needing_a_restart_is_counted_and_named_and_nothing_restarts() {
        let workloads = [deployment("a", "w1")];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let needing = with_path(&pods, PodPath::Restart);
        let p = one(
            in_place_input(&needing, RolloutStrategy::InPlace, limits(5, 1)),
            &workloads,
            10,
        );
        assert!(p.restart.is_empty() && p.update.is_empty());
        assert_eq!(p.not_in_place, [pod("a", "w1")]);
        assert_eq!(p.status.not_in_place, 1);
        let note = not_in_place_note("mesh", "r2", &p.not_in_place).unwrap();
        assert!(note.contains("Pod/a/w1"), "{note}");
    }

    #[test]
    fn a_pod_not_sorted_yet_waits_and_is_counted_outdated() {
        let workloads = [deployment("a", "w1")];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let needing = with_path(&pods, PodPath::Unsorted);
        let p = one(
            in_place_input(&needing, RolloutStrategy::Auto, limits(5, 1)),
            &workloads,
            10,
        );
        assert!(p.restart.is_empty() && p.update.is_empty());
        assert_eq!(p.status.outdated, 1);
        assert_eq!(p.status.phase, RolloutPhase::Rolling);
    }

    #[test]
    fn pods_updating_in_place_use_the_budget_next_to_workloads_restarting() {
        let workloads = [
            restarted(deployment("a", "w1"), "r2", NOW - 10, false),
            deployment("b", "w2"),
            deployment("c", "w3"),
        ];
        let pods = Pods::of(&workloads[1..], PodNeed::Outdated);
        let needing = with_path(&pods, PodPath::InPlace);
        let mut input = in_place_input(&needing, RolloutStrategy::Auto, limits(3, 1));
        input.updating = vec![updating(
            "z",
            "p0",
            NOW - 5,
            InPlaceProof::Waiting("x".into()),
        )];
        let p = one(input, &workloads, 10);
        assert_eq!(
            p.update,
            [pod("b", "w2")],
            "3 at once: one restarting, one updating, one new"
        );
        assert_eq!(p.status.updating, 2);
        assert_eq!(p.status.restarting, 1);
        assert_eq!(p.status.outdated, 1);
        // And the cluster cap counts them too.
        let mut input = in_place_input(&needing, RolloutStrategy::Auto, limits(9, 9));
        input.updating = vec![updating(
            "z",
            "p0",
            NOW - 5,
            InPlaceProof::Waiting("x".into()),
        )];
        let p = one(input, &workloads, 2);
        assert!(p.update.is_empty(), "the cap of 2 is used up");
    }

    #[test]
    fn an_in_place_update_not_proven_within_the_timeout_halts_naming_the_pod_and_why() {
        let workloads = [deployment("a", "w1")];
        let mut input = input(&EMPTY, limits(5, 1));
        input.strategy = RolloutStrategy::Auto;
        input.updating = vec![updating(
            "a",
            "w1-x",
            NOW - 301,
            InPlaceProof::Waiting("container proxy runs the new image, not Ready yet".into()),
        )];
        let p = one(input.clone(), &workloads, 10);
        assert_eq!(p.status.phase, RolloutPhase::Halted);
        assert_eq!(p.status.halted_by.as_deref(), Some("Pod/a/w1-x"));
        let (pod_ref, why) = p.newly_failed_pod.unwrap();
        assert_eq!(pod_ref, pod("a", "w1-x"));
        assert!(why.contains("container proxy"), "{why}");
        // Within the timeout it is still updating.
        input.updating[0].at = Some(ts(NOW - 10));
        let p = one(input, &workloads, 10);
        assert_eq!(p.status.phase, RolloutPhase::Rolling);
        assert_eq!(p.status.updating, 1);
    }

    #[test]
    fn a_broken_proof_halts_at_once_and_a_proven_one_completes() {
        let workloads = [deployment("a", "w1")];
        let mut input = input(&EMPTY, limits(5, 1));
        input.strategy = RolloutStrategy::Auto;
        input.updating = vec![updating(
            "a",
            "w1-x",
            NOW - 1,
            InPlaceProof::Broken("container app restarted during the update".into()),
        )];
        let p = one(input.clone(), &workloads, 10);
        assert_eq!(p.status.phase, RolloutPhase::Halted);
        input.updating[0].proof = InPlaceProof::Done;
        let p = one(input, &workloads, 10);
        assert_eq!(p.status.phase, RolloutPhase::Complete);
        assert_eq!(p.status.updated_in_place, 1);
        assert!(p.newly_failed_pod.is_none());
    }

    #[test]
    fn with_a_canary_open_only_canary_pods_are_updated_in_place() {
        let workloads = [deployment("canary-a", "w1"), deployment("prod", "w2")];
        let pods = Pods::of(&workloads, PodNeed::Outdated);
        let needing = with_path(&pods, PodPath::InPlace);
        let mut input = in_place_input(&needing, RolloutStrategy::Auto, limits(5, 5));
        input.canary = true;
        let p = one(input, &workloads, 10);
        assert_eq!(p.update, [pod("canary-a", "w1")]);
        assert_eq!(p.status.phase, RolloutPhase::Canary);
        assert!(!p.promote, "the canary pod is not proven yet");
    }

    #[test]
    fn a_pod_whose_workload_restarts_anyway_is_left_to_that_restart() {
        let workloads = [deployment("a", "w1")];
        let mut pods = Pods::of(&workloads, PodNeed::Outdated);
        pods.0.push(pods.0[0].clone());
        let mut needing = with_path(&pods, PodPath::InPlace);
        needing[1].path = PodPath::Restart;
        let p = one(
            in_place_input(&needing, RolloutStrategy::Auto, limits(5, 5)),
            &workloads,
            10,
        );
        assert_eq!(names(&p.restart), ["Deployment/a/w1"]);
        assert!(p.update.is_empty());
    }

    #[test]
    fn a_bare_pod_with_an_in_place_change_is_updated_never_counted_manual() {
        let pods = Pods(vec![(
            "a".into(),
            labels("lonely"),
            PodOwner::None,
            PodNeed::Outdated,
        )]);
        let needing = with_path(&pods, PodPath::InPlace);
        let p = one(
            in_place_input(&needing, RolloutStrategy::Auto, limits(5, 5)),
            &[],
            10,
        );
        assert_eq!(p.update, [pod("a", "lonely")]);
        assert_eq!(p.status.manual, 0);
    }
}
