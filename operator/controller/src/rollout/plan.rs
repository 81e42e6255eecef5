//! The rollout's decision, pure: from every policy with `spec.rollout`, the workloads its pods
//! belong to and what is already restarting, which workloads to restart now under the budget,
//! and where each policy's rollout stands. No API call; the caller ([`super::run`]) gathers the
//! inputs from its caches and writes what this decides.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use splice_crds::{RolloutPhase, RolloutStatus};
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
    let (first, rest) = restarted.split_at(restarted.len().min(NAMED_PER_EVENT));
    if first.is_empty() {
        return None;
    }
    let mut names: Vec<String> = first.iter().map(ToString::to_string).collect();
    if !rest.is_empty() {
        names.push(format!("and {} more", rest.len()));
    }
    Some(format!(
        "Restarted {} for revision {revision} of policy {policy}: {}; their pods carried an \
         outdated or missing injection",
        match restarted.len() {
            1 => "1 workload".to_owned(),
            n => format!("{n} workloads"),
        },
        names.join(", ")
    ))
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

/// One pod's need, with what attributes it to a workload.
#[derive(Clone, Copy, Debug)]
pub struct PodNeeding<'a> {
    pub namespace: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub owner: PodOwner,
    pub need: PodNeed,
    /// The policy's open canary selects it (its namespace's labels and its own).
    pub in_canary: bool,
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
    /// The open canary is promoted now: every canary workload is fully available on the new
    /// revision, or a promotion was requested.
    pub promote: bool,
    pub status: RolloutStatus,
}

/// `haltedBy` of a rollout halted by `splice.dev/rollout-halt`.
pub const HALT_REQUESTED: &str = "halt requested";

/// The restart annotation's value for a policy's revision.
pub fn restarted_for(policy: &str, revision: &str) -> String {
    format!("{policy}@{revision}")
}

/// Plans every policy's rollout in one pass, so the cluster-wide `cap` holds across policies.
/// `excluded` are namespaces never touched (the mandatory exclusions and Splice's own); a
/// workload two policies want restarted is restarted by the first (name order) only.
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
    // First every policy's standing, so the workloads restarting for any of them count against
    // the cap before anything new starts.
    let mut standings = Vec::with_capacity(policies.len());
    let mut in_flight = 0usize;
    for p in policies {
        let (standing, manual, canary) = stand(p, &workloads, &by_namespace, now);
        in_flight += standing
            .values()
            .filter(|s| **s == Standing::Restarting)
            .count();
        standings.push((standing, manual, canary));
    }
    let mut chosen: HashSet<usize> = HashSet::new();
    let mut out = Vec::with_capacity(policies.len());
    for (p, (standing, manual, canary_workloads)) in policies.iter().zip(standings) {
        let mut status = RolloutStatus {
            revision: p.revision.to_owned(),
            manual,
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
        let halted = p.held || p.halted_by.is_some() || first_failed.is_some();
        let mut restart = Vec::new();
        let mut waiting = Vec::new();
        let mut free = p
            .limits
            .max_concurrent
            .saturating_sub(status.restarting as usize);
        for (&i, _) in standing.iter().filter(|(_, s)| **s == Standing::Needs) {
            let w = workloads[i];
            let in_namespace = per_namespace.get(w.id.namespace.as_str()).copied();
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
            } else if free == 0 {
                Some(Wait::PolicyBudget)
            } else if in_namespace.unwrap_or(0) >= p.limits.max_per_namespace {
                Some(Wait::NamespaceBudget)
            } else if in_flight >= cap {
                Some(Wait::ClusterBudget)
            } else {
                None
            };
            match wait {
                Some(reason) => waiting.push((w.id.clone(), reason)),
                None => {
                    free -= 1;
                    in_flight += 1;
                    chosen.insert(i);
                    *per_namespace.entry(&w.id.namespace).or_default() += 1;
                    restart.push(w.id.clone());
                }
            }
        }
        let moved = restart.len() as i64;
        status.outdated -= moved;
        status.restarting += moved;
        // The gate: while a canary is open, every workload restarted for this revision is a
        // canary's. It opens when none is left to restart or restarting, none failed, and at
        // least one is fully available on the new revision: no evidence, no promotion.
        let canary_left = standing
            .iter()
            .any(|(i, s)| *s == Standing::Needs && canary_workloads.contains(i));
        let promote = p.canary
            && !halted
            && (p.promote_requested || (!canary_left && status.restarting == 0 && status.done > 0));
        status.phase = if halted {
            RolloutPhase::Halted
        } else if p.canary && !promote {
            RolloutPhase::Canary
        } else if status.restarting > 0 || status.outdated > 0 {
            RolloutPhase::Rolling
        } else if status.done > 0 {
            RolloutPhase::Complete
        } else {
            RolloutPhase::Idle
        };
        status.halted_by = match (p.halted_by, first_failed) {
            (Some(before), _) => Some(before.to_owned()),
            (None, Some(i)) => Some(workloads[i].id.to_string()),
            (None, None) => p.held.then(|| HALT_REQUESTED.to_owned()),
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
        out.push(Plan {
            policy: p.policy.to_owned(),
            revision: p.revision.to_owned(),
            restart,
            waiting,
            newly_failed,
            promote,
            status,
        });
    }
    out
}

/// Still rolling from this policy's restart for an earlier revision (a halted one, say): the new
/// revision replaces that restart rather than waiting for a rollout that may never finish.
fn rolling_for_us(w: &Workload, policy: &str) -> bool {
    w.restarted_for
        .as_deref()
        .and_then(|r| r.split_once('@'))
        .is_some_and(|(p, _)| p == policy)
}

/// Each workload's standing for the policy (ordered, so plans are deterministic), and the pods
/// no workload restart can reach (`manual`).
fn stand(
    p: &PolicyInput<'_>,
    workloads: &[&Workload],
    by_namespace: &HashMap<&str, Vec<usize>>,
    now: Timestamp,
) -> (BTreeMap<usize, Standing>, i64, HashSet<usize>) {
    let mine = restarted_for(p.policy, p.revision);
    let mut standing: BTreeMap<usize, Standing> = BTreeMap::new();
    // Every workload restarted for this revision, needing it or not any more.
    for (i, w) in workloads.iter().enumerate() {
        if w.restarted_for.as_deref() != Some(mine.as_str()) {
            continue;
        }
        let timed_out = w
            .restarted_at
            .and_then(|t| {
                let timeout = i64::try_from(p.limits.timeout.as_secs()).ok()?;
                t.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(timeout))
                    .ok()
            })
            .is_some_and(|deadline| now > deadline);
        let before_resume = match (w.restarted_at, p.resumed_at) {
            (Some(at), Some(resumed)) => at <= resumed,
            _ => false,
        };
        let s = if w.settled {
            Standing::Done
        } else if timed_out && before_resume {
            Standing::FailedBeforeResume
        } else if timed_out {
            Standing::Failed
        } else {
            Standing::Restarting
        };
        standing.insert(i, s);
    }
    let mut manual = 0;
    let mut canary = HashSet::new();
    for pod in &p.pods {
        if pod.need == PodNeed::Missed && !p.limits.repair_missed {
            continue;
        }
        let owner = by_namespace.get(pod.namespace).and_then(|candidates| {
            candidates.iter().copied().find(|&i| {
                let w = workloads[i];
                w.id.kind.owns_pods_of(pod.owner)
                    && !w.selector.requirements().is_empty()
                    && w.selector
                        .matches(|k| pod.labels.get(k).map(String::as_str))
            })
        });
        match owner {
            Some(i) => {
                standing.entry(i).or_insert(Standing::Needs);
                if pod.in_canary {
                    canary.insert(i);
                }
            }
            None => manual += 1,
        }
    }
    (standing, manual, canary)
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
        w.restarted_for = Some(restarted_for("mesh", revision));
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
        busy.restarted_for = Some(restarted_for("other", "x"));
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
            w.restarted_for = Some(restarted_for("other", "x"));
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
}
