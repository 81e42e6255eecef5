//! The availability guard: `Fail` makes every matching pod creation depend on Splice answering, so
//! it is only put in force while Splice's own Deployment has at least two available replicas and a
//! PodDisruptionBudget keeps at least one of them through voluntary disruptions (node drains).
//! Once in force it stays through a dip in available replicas while the Deployment still asks for
//! two (a rollout, an eviction, a killed pod): the Deployment restores them, Splice's namespace is
//! never intercepted, and dropping to `Ignore` then would admit pods uninjected while no replica
//! answers. A configuration that cannot keep two (fewer replicas asked for, no fitting budget)
//! drops it at once.
//!
//! [`assess`] is pure (what the Deployment and the budgets say right now); [`Hold`] adds the
//! anti-flap rule (down at once, back up only after the condition held for a while); [`watch`]
//! feeds both from the API and publishes a [`GuardStatus`] the reconciler reads.

use splice_engine::Selector;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use splice_crds::{FailurePolicy, InjectionPolicy};
use tokio::sync::watch as channel;

/// Replicas that must be available before `Fail` is allowed: with one, a single restart or node
/// drain makes every matching pod creation fail.
pub const MIN_AVAILABLE_REPLICAS: i32 = 2;

/// Why `Fail` is not in force. The names are the FailClosed condition's reasons; `label()` is the
/// metric's label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumIter)]
#[strum(serialize_all = "snake_case")]
pub enum Reason {
    /// The guard has not read the Deployment and budgets yet.
    NotObserved,
    DeploymentNotFound,
    InsufficientReplicas,
    NoDisruptionBudget,
    DisruptionBudgetDoesNotSelect,
    DisruptionBudgetAllowsZero,
    /// Everything is in place, but not yet for the whole hold time.
    HoldingBeforeFail,
}

impl Reason {
    /// The FailClosed condition's reason (CamelCase, as Kubernetes reasons are).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotObserved => "AvailabilityNotObserved",
            Reason::DeploymentNotFound => "DeploymentNotFound",
            Reason::InsufficientReplicas => "InsufficientReplicas",
            Reason::NoDisruptionBudget => "NoDisruptionBudget",
            Reason::DisruptionBudgetDoesNotSelect => "DisruptionBudgetDoesNotSelect",
            Reason::DisruptionBudgetAllowsZero => "DisruptionBudgetAllowsZero",
            Reason::HoldingBeforeFail => "HoldingBeforeFail",
        }
    }

    /// Stable label for `splice_availability_guard{reason}`.
    pub fn label(self) -> &'static str {
        self.into()
    }
}

/// What Splice's own objects say right now, before the hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Assessment {
    /// Enough replicas and a budget that keeps one; `budget` names it.
    Available {
        budget: String,
    },
    Unavailable {
        reason: Reason,
        message: String,
    },
    /// The Deployment asks for enough replicas and a budget keeps one, but fewer are available
    /// right now: `Fail` is not put in force, and stays if it already is.
    Degraded {
        message: String,
    },
}

/// Judges Splice's Deployment `name` and the PodDisruptionBudgets of its namespace.
pub fn assess(
    name: &str,
    deployment: Option<&Deployment>,
    budgets: &[PodDisruptionBudget],
) -> Assessment {
    let unavailable = |reason, message: String| Assessment::Unavailable { reason, message };
    let Some(deployment) = deployment.filter(|d| d.metadata.deletion_timestamp.is_none()) else {
        return unavailable(
            Reason::DeploymentNotFound,
            format!(
                "Splice's Deployment {name} does not exist in its namespace (or is being deleted)"
            ),
        );
    };
    let spec = deployment.spec.as_ref();
    let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
    if replicas < MIN_AVAILABLE_REPLICAS {
        return unavailable(
            Reason::InsufficientReplicas,
            format!(
                "Splice's Deployment {name} asks for {replicas} replica(s); Fail needs at least \
                 {MIN_AVAILABLE_REPLICAS}"
            ),
        );
    }
    let pod_labels = spec
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();

    if budgets.is_empty() {
        return unavailable(
            Reason::NoDisruptionBudget,
            format!(
                "no PodDisruptionBudget exists in Splice's namespace, so a node drain may evict \
                 every replica of {name} at once"
            ),
        );
    }
    let mut selecting = Vec::new();
    let mut not_selecting = Vec::new();
    for budget in budgets {
        let budget_name = budget.name_any();
        let selector = budget.spec.as_ref().and_then(|s| s.selector.as_ref());
        if selector.is_some_and(|s| selects(s, &pod_labels)) {
            selecting.push(budget);
        } else {
            not_selecting.push(budget_name);
        }
    }
    if selecting.is_empty() {
        return unavailable(
            Reason::DisruptionBudgetDoesNotSelect,
            format!(
                "no PodDisruptionBudget selects the pods of Deployment {name} (checked: {})",
                not_selecting.join(", ")
            ),
        );
    }
    let mut zero = Vec::new();
    for budget in selecting {
        match kept_available(budget, replicas) {
            Ok(kept) if kept >= 1 => {
                let available = deployment
                    .status
                    .as_ref()
                    .and_then(|s| s.available_replicas)
                    .unwrap_or(0);
                if available < MIN_AVAILABLE_REPLICAS {
                    return Assessment::Degraded {
                        message: format!(
                            "Splice's Deployment {name} has {available} available replica(s); \
                             Fail needs at least {MIN_AVAILABLE_REPLICAS}"
                        ),
                    };
                }
                return Assessment::Available {
                    budget: budget.name_any(),
                };
            }
            Ok(kept) => zero.push(format!("{} keeps {kept} of {replicas}", budget.name_any())),
            Err(why) => zero.push(format!("{} {why}", budget.name_any())),
        }
    }
    unavailable(
        Reason::DisruptionBudgetAllowsZero,
        format!(
            "every PodDisruptionBudget selecting Deployment {name} lets all its pods be evicted \
             ({})",
            zero.join("; ")
        ),
    )
}

/// How many of `replicas` pods the budget keeps through voluntary disruptions. Percentages are
/// rounded up, as the disruption controller does for both fields.
fn kept_available(budget: &PodDisruptionBudget, replicas: i32) -> Result<i32, String> {
    let spec = budget.spec.as_ref();
    if let Some(min) = spec.and_then(|s| s.min_available.as_ref()) {
        return scaled(min, replicas).map_err(|e| format!("has an invalid minAvailable: {e}"));
    }
    if let Some(max) = spec.and_then(|s| s.max_unavailable.as_ref()) {
        let max =
            scaled(max, replicas).map_err(|e| format!("has an invalid maxUnavailable: {e}"))?;
        return Ok(replicas.saturating_sub(max).max(0));
    }
    Err("sets neither minAvailable nor maxUnavailable".to_owned())
}

/// An int-or-percent against `total`, rounded up.
fn scaled(value: &IntOrString, total: i32) -> Result<i32, String> {
    match value {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(s) => {
            let percent: i64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .filter(|p| *p >= 0)
                .ok_or_else(|| {
                    format!("{s:?} is neither an integer nor a percentage like \"50%\"")
                })?;
            let scaled = (percent * i64::from(total.max(0)) + 99) / 100;
            Ok(i32::try_from(scaled).unwrap_or(i32::MAX))
        }
    }
}

/// LabelSelector semantics for policy/v1 budgets: an empty selector selects every pod; an
/// unknown operator selects nothing (the API server would not have accepted it anyway).
fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    Selector::read(Some(selector)).matches(|k| labels.get(k).map(String::as_str))
}

/// What the reconciler writes for a policy requesting `Fail`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardStatus {
    /// `None` while `Fail` may be in force.
    pub blocked: Option<(Reason, String)>,
}

impl GuardStatus {
    pub fn not_observed() -> Self {
        GuardStatus {
            blocked: Some((
                Reason::NotObserved,
                "Splice has not read its Deployment and PodDisruptionBudgets yet".to_owned(),
            )),
        }
    }

    #[cfg(test)]
    pub fn allows_fail(&self) -> bool {
        self.blocked.is_none()
    }

    /// `splice_availability_guard{reason}`'s label: `available`, or the reason.
    pub fn label(&self) -> &'static str {
        match &self.blocked {
            None => "available",
            Some((reason, _)) => reason.label(),
        }
    }
}

/// The anti-flap rule: any problem blocks `Fail` at once; `Fail` comes back only after the
/// Deployment and budget have been fine for `hold` without interruption.
#[derive(Clone, Debug)]
pub struct Hold {
    hold: Duration,
    fine_since: Option<Instant>,
    in_force: bool,
}

impl Hold {
    /// `in_force` seeds the state: a restarted or newly elected leader that finds `Fail` already
    /// in force keeps it without a new hold (if the objects are still fine), instead of flapping
    /// every webhook to Ignore and back.
    pub fn new(hold: Duration, in_force: bool) -> Self {
        Hold {
            hold,
            fine_since: None,
            in_force,
        }
    }

    /// Folds one assessment in; returns the status and, while holding, when to look again.
    pub fn update(
        &mut self,
        assessment: &Assessment,
        now: Instant,
    ) -> (GuardStatus, Option<Instant>) {
        match assessment {
            Assessment::Unavailable { reason, message } => {
                self.in_force = false;
                self.fine_since = None;
                (
                    GuardStatus {
                        blocked: Some((*reason, message.clone())),
                    },
                    None,
                )
            }
            Assessment::Degraded { message } if self.in_force => {
                tracing::warn!(
                    %message,
                    "availability guard: Fail stays in force while the Deployment restores its replicas"
                );
                (GuardStatus { blocked: None }, None)
            }
            Assessment::Degraded { message } => {
                self.fine_since = None;
                (
                    GuardStatus {
                        blocked: Some((Reason::InsufficientReplicas, message.clone())),
                    },
                    None,
                )
            }
            Assessment::Available { .. } if self.in_force => (GuardStatus { blocked: None }, None),
            Assessment::Available { budget } => {
                let since = *self.fine_since.get_or_insert(now);
                let until = since + self.hold;
                if now >= until {
                    self.in_force = true;
                    return (GuardStatus { blocked: None }, None);
                }
                // No countdown in the message: it would change the status on every look.
                (
                    GuardStatus {
                        blocked: Some((
                            Reason::HoldingBeforeFail,
                            format!(
                                "Splice has enough available replicas and PodDisruptionBudget \
                                 {budget} keeps one, but Fail is put in force only after that \
                                 has held for {}s without interruption",
                                self.hold.as_secs(),
                            ),
                        )),
                    },
                    Some(until),
                )
            }
        }
    }
}

/// Where the guard looks.
#[derive(Clone, Debug)]
pub struct GuardConfig {
    pub namespace: String,
    pub deployment: String,
    pub hold: Duration,
}

/// How long a new leader waits for the guard's first verdict before reconciling anyway (with
/// `Fail` not in force).
pub const FIRST_VERDICT_WAIT: Duration = Duration::from_secs(10);

/// Resolves once the guard has judged the objects at least once, or after `limit`.
pub async fn first_verdict(mut status: channel::Receiver<GuardStatus>, limit: Duration) {
    let observed = status.wait_for(|s| !matches!(&s.blocked, Some((Reason::NotObserved, _))));
    if tokio::time::timeout(limit, observed).await.is_err() {
        tracing::warn!(
            waited = ?limit,
            "availability guard: no verdict yet (can Splice read its Deployment and PodDisruptionBudgets?); Fail stays off until it has one"
        );
    }
}

/// Watches the Deployment and the budgets, and publishes the guard's status whenever it changes.
/// Runs until the receiver side is gone.
pub async fn watch(
    client: Client,
    config: GuardConfig,
    policy_selector: Option<String>,
    metrics: Arc<Metrics>,
    status: channel::Sender<GuardStatus>,
) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &config.namespace);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &config.namespace);
    let in_force = fail_in_force(&Api::all(client), policy_selector.as_deref()).await;
    let mut hold = Hold::new(config.hold, in_force);
    metrics.set_availability_guard(status.borrow().label());

    let by_name =
        watcher::Config::default().fields(&format!("metadata.name={}", config.deployment));
    let deployment_events = watcher(deployments, by_name)
        .default_backoff()
        .map(|e| Seen::Deployment(Box::new(e)));
    let budget_events = watcher(budgets, watcher::Config::default())
        .default_backoff()
        .map(|e| Seen::Budget(Box::new(e)));
    let mut events = std::pin::pin!(futures::stream::select(deployment_events, budget_events));
    let mut objects = Observed::default();
    let mut wake: Option<Instant> = None;
    loop {
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            event = events.next() => match event {
                Some(seen) => objects.apply(seen),
                None => return,
            },
            () = sleep => {}
            () = status.closed() => return,
        }
        // Both must have listed once, or a budget not yet seen would read as missing.
        if !objects.synced() {
            continue;
        }
        let budgets: Vec<PodDisruptionBudget> = objects.budgets.values().cloned().collect();
        let assessment = assess(&config.deployment, objects.deployment.as_ref(), &budgets);
        let (next, at) = hold.update(&assessment, Instant::now());
        wake = at;
        let changed = status.send_if_modified(|current| {
            let same = *current == next;
            if !same {
                *current = next.clone();
            }
            !same
        });
        if changed {
            metrics.set_availability_guard(next.label());
            match &next.blocked {
                None => {
                    tracing::info!(deployment = %config.deployment, "availability guard: Fail may be in force")
                }
                Some((reason, message)) => {
                    tracing::info!(reason = reason.as_str(), %message, "availability guard: Fail is not in force")
                }
            }
        }
    }
}

enum Seen {
    Deployment(Box<Result<watcher::Event<Deployment>, watcher::Error>>),
    Budget(Box<Result<watcher::Event<PodDisruptionBudget>, watcher::Error>>),
}

/// The guard's own small cache: one Deployment and the namespace's budgets, each with whether its
/// first full list is in.
#[derive(Default)]
struct Observed {
    deployment: Option<Deployment>,
    deployment_listing: Option<Deployment>,
    deployment_synced: bool,
    budgets: BTreeMap<String, PodDisruptionBudget>,
    budget_listing: BTreeMap<String, PodDisruptionBudget>,
    budgets_synced: bool,
}

impl Observed {
    fn synced(&self) -> bool {
        self.deployment_synced && self.budgets_synced
    }

    fn apply(&mut self, seen: Seen) {
        match seen {
            Seen::Deployment(event) => match *event {
                Ok(watcher::Event::Init) => self.deployment_listing = None,
                Ok(watcher::Event::InitApply(d)) => self.deployment_listing = Some(d),
                Ok(watcher::Event::InitDone) => {
                    self.deployment = self.deployment_listing.take();
                    self.deployment_synced = true;
                }
                Ok(watcher::Event::Apply(d)) => self.deployment = Some(d),
                Ok(watcher::Event::Delete(_)) => self.deployment = None,
                Err(e) => {
                    tracing::warn!(error = %e, "availability guard: watching Splice's Deployment")
                }
            },
            Seen::Budget(event) => match *event {
                Ok(watcher::Event::Init) => self.budget_listing.clear(),
                Ok(watcher::Event::InitApply(b)) => {
                    self.budget_listing.insert(b.name_any(), b);
                }
                Ok(watcher::Event::InitDone) => {
                    self.budgets = std::mem::take(&mut self.budget_listing);
                    self.budgets_synced = true;
                }
                Ok(watcher::Event::Apply(b)) => {
                    self.budgets.insert(b.name_any(), b);
                }
                Ok(watcher::Event::Delete(b)) => {
                    self.budgets.remove(&b.name_any());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "availability guard: watching PodDisruptionBudgets")
                }
            },
        }
    }
}

/// True when a managed policy already reports `Fail` in force (read once, at start).
async fn fail_in_force(policies: &Api<InjectionPolicy>, selector: Option<&str>) -> bool {
    let params = match selector {
        Some(s) => ListParams::default().labels(s),
        None => ListParams::default(),
    };
    match policies.list(&params).await {
        Ok(list) => list.items.iter().any(|p| {
            p.status.as_ref().and_then(|s| s.effective_failure_policy) == Some(FailurePolicy::Fail)
        }),
        Err(e) => {
            tracing::warn!(error = %e, "could not read whether Fail was in force; starting with the hold");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};
    use k8s_openapi::api::core::v1::PodTemplateSpec;
    use k8s_openapi::api::policy::v1::PodDisruptionBudgetSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, ObjectMeta};
    use strum::IntoEnumIterator;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn deployment(replicas: i32, available: i32) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some("splice".into()),
                ..ObjectMeta::default()
            },
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels(&[("app.kubernetes.io/name", "splice")])),
                        ..ObjectMeta::default()
                    }),
                    spec: None,
                },
                ..DeploymentSpec::default()
            }),
            status: Some(DeploymentStatus {
                available_replicas: Some(available),
                ..DeploymentStatus::default()
            }),
        }
    }

    fn selector(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: Some(labels(pairs)),
            match_expressions: None,
        }
    }

    fn budget(
        name: &str,
        selector: Option<LabelSelector>,
        min: Option<IntOrString>,
        max: Option<IntOrString>,
    ) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector,
                min_available: min,
                max_unavailable: max,
                ..PodDisruptionBudgetSpec::default()
            }),
            status: None,
        }
    }

    fn good_budget() -> PodDisruptionBudget {
        budget(
            "splice",
            Some(selector(&[("app.kubernetes.io/name", "splice")])),
            Some(IntOrString::Int(1)),
            None,
        )
    }

    fn reason(a: &Assessment) -> Option<Reason> {
        match a {
            Assessment::Available { .. } => None,
            Assessment::Unavailable { reason, .. } => Some(*reason),
            Assessment::Degraded { .. } => Some(Reason::InsufficientReplicas),
        }
    }

    #[test]
    fn two_available_replicas_and_a_selecting_budget_that_keeps_one_allow_fail() {
        let a = assess("splice", Some(&deployment(2, 2)), &[good_budget()]);
        assert_eq!(
            a,
            Assessment::Available {
                budget: "splice".into()
            }
        );
    }

    #[test]
    fn a_missing_or_deleted_deployment_blocks_fail_and_names_it() {
        let a = assess("splice", None, &[good_budget()]);
        assert_eq!(reason(&a), Some(Reason::DeploymentNotFound));
        assert!(format!("{a:?}").contains("Deployment splice"));
        let mut d = deployment(2, 2);
        d.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(
            reason(&assess("splice", Some(&d), &[good_budget()])),
            Some(Reason::DeploymentNotFound)
        );
    }

    #[test]
    fn fewer_than_two_replicas_asked_for_block_fail_with_the_count() {
        let a = assess("splice", Some(&deployment(1, 1)), &[good_budget()]);
        assert_eq!(reason(&a), Some(Reason::InsufficientReplicas));
        let Assessment::Unavailable { message, .. } = a else {
            unreachable!()
        };
        assert!(message.contains("asks for 1"), "{message}");
    }

    #[test]
    fn fewer_than_two_available_of_two_asked_for_is_degraded_with_the_count() {
        let a = assess("splice", Some(&deployment(2, 1)), &[good_budget()]);
        let Assessment::Degraded { message } = a else {
            panic!("expected Degraded, got {a:?}")
        };
        assert!(message.contains("1 available"), "{message}");
        let mut no_status = deployment(3, 0);
        no_status.status = None;
        assert!(matches!(
            assess("splice", Some(&no_status), &[good_budget()]),
            Assessment::Degraded { .. }
        ));
    }

    #[test]
    fn a_dip_in_available_replicas_keeps_fail_in_force_but_never_puts_it_in_force() {
        let now = Instant::now();
        let degraded = assess("splice", Some(&deployment(2, 0)), &[good_budget()]);
        let (status, _) = Hold::new(Duration::from_secs(60), true).update(&degraded, now);
        assert!(status.allows_fail(), "{status:?}");
        let mut cold = Hold::new(Duration::from_secs(60), false);
        let (status, _) = cold.update(&degraded, now);
        assert_eq!(
            status.blocked.map(|(r, _)| r),
            Some(Reason::InsufficientReplicas)
        );
        // Back to two available: the hold starts from here, not from before the dip.
        let fine = assess("splice", Some(&deployment(2, 2)), &[good_budget()]);
        let (status, _) = cold.update(&fine, now + Duration::from_secs(59));
        assert!(!status.allows_fail());
        // Scaled to one while in force: Ignore at once.
        let mut hot = Hold::new(Duration::from_secs(60), true);
        let one = assess("splice", Some(&deployment(1, 1)), &[good_budget()]);
        assert!(!hot.update(&one, now).0.allows_fail());
    }

    #[test]
    fn no_budget_at_all_blocks_fail() {
        let a = assess("splice", Some(&deployment(2, 2)), &[]);
        assert_eq!(reason(&a), Some(Reason::NoDisruptionBudget));
    }

    #[test]
    fn a_budget_whose_selector_does_not_match_the_pod_template_blocks_fail_and_is_named() {
        let other = budget(
            "other",
            Some(selector(&[("app", "db")])),
            Some(IntOrString::Int(1)),
            None,
        );
        let null = budget("null-selector", None, Some(IntOrString::Int(1)), None);
        let a = assess("splice", Some(&deployment(2, 2)), &[other, null]);
        assert_eq!(reason(&a), Some(Reason::DisruptionBudgetDoesNotSelect));
        let Assessment::Unavailable { message, .. } = a else {
            unreachable!()
        };
        assert!(
            message.contains("other") && message.contains("null-selector"),
            "{message}"
        );
    }

    #[test]
    fn an_empty_selector_selects_every_pod_and_expressions_are_evaluated() {
        let empty = budget(
            "all",
            Some(LabelSelector::default()),
            Some(IntOrString::Int(1)),
            None,
        );
        assert_eq!(
            reason(&assess("splice", Some(&deployment(2, 2)), &[empty])),
            None
        );
        let expr = |op: &str, values: Option<Vec<String>>| {
            budget(
                "expr",
                Some(LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: "app.kubernetes.io/name".into(),
                        operator: op.into(),
                        values,
                    }]),
                }),
                Some(IntOrString::Int(1)),
                None,
            )
        };
        let d = deployment(2, 2);
        assert_eq!(
            reason(&assess(
                "splice",
                Some(&d),
                &[expr("In", Some(vec!["splice".into()]))]
            )),
            None
        );
        assert_eq!(
            reason(&assess("splice", Some(&d), &[expr("Exists", None)])),
            None
        );
        assert_eq!(
            reason(&assess(
                "splice",
                Some(&d),
                &[expr("NotIn", Some(vec!["splice".into()]))]
            )),
            Some(Reason::DisruptionBudgetDoesNotSelect)
        );
        assert_eq!(
            reason(&assess("splice", Some(&d), &[expr("DoesNotExist", None)])),
            Some(Reason::DisruptionBudgetDoesNotSelect)
        );
    }

    #[test]
    fn a_budget_with_min_available_zero_or_max_unavailable_all_blocks_fail() {
        let sel = || Some(selector(&[("app.kubernetes.io/name", "splice")]));
        let d = deployment(2, 2);
        for b in [
            budget("zero", sel(), Some(IntOrString::Int(0)), None),
            budget("max-all", sel(), None, Some(IntOrString::Int(2))),
            budget(
                "max-pct",
                sel(),
                None,
                Some(IntOrString::String("100%".into())),
            ),
            budget(
                "min-pct",
                sel(),
                Some(IntOrString::String("0%".into())),
                None,
            ),
            budget("neither", sel(), None, None),
            budget(
                "garbage",
                sel(),
                Some(IntOrString::String("half".into())),
                None,
            ),
        ] {
            let name = b.name_any();
            let a = assess("splice", Some(&d), &[b]);
            assert_eq!(
                reason(&a),
                Some(Reason::DisruptionBudgetAllowsZero),
                "{name}"
            );
            assert!(format!("{a:?}").contains(&name), "{a:?}");
        }
    }

    #[test]
    fn percentages_are_resolved_against_the_replica_count_and_rounded_up() {
        let sel = || Some(selector(&[("app.kubernetes.io/name", "splice")]));
        // 50% of 2 is 1 kept.
        let half = budget("half", sel(), Some(IntOrString::String("50%".into())), None);
        assert_eq!(
            reason(&assess("splice", Some(&deployment(2, 2)), &[half])),
            None
        );
        // 10% of 3 rounds up to 1 kept.
        let tenth = budget(
            "tenth",
            sel(),
            Some(IntOrString::String("10%".into())),
            None,
        );
        assert_eq!(
            reason(&assess("splice", Some(&deployment(3, 3)), &[tenth])),
            None
        );
        // maxUnavailable 50% of 3 rounds up to 2 unavailable: 1 kept.
        let max_half = budget(
            "max-half",
            sel(),
            None,
            Some(IntOrString::String("50%".into())),
        );
        assert_eq!(
            reason(&assess("splice", Some(&deployment(3, 3)), &[max_half])),
            None
        );
        // maxUnavailable 60% of 2 rounds up to 2: none kept.
        let max_most = budget(
            "max-most",
            sel(),
            None,
            Some(IntOrString::String("60%".into())),
        );
        assert_eq!(
            reason(&assess("splice", Some(&deployment(2, 2)), &[max_most])),
            Some(Reason::DisruptionBudgetAllowsZero)
        );
        assert_eq!(scaled(&IntOrString::String("-5%".into()), 2).ok(), None);
    }

    #[test]
    fn with_several_budgets_one_selecting_budget_that_keeps_a_pod_is_enough() {
        let sel = || Some(selector(&[("app.kubernetes.io/name", "splice")]));
        let zero = budget("a-zero", sel(), Some(IntOrString::Int(0)), None);
        let unrelated = budget(
            "b-other",
            Some(selector(&[("app", "x")])),
            Some(IntOrString::Int(1)),
            None,
        );
        let a = assess(
            "splice",
            Some(&deployment(2, 2)),
            &[zero.clone(), unrelated.clone(), good_budget()],
        );
        assert_eq!(
            a,
            Assessment::Available {
                budget: "splice".into()
            }
        );
        // Without the good one, the selecting budget that keeps nothing decides the reason.
        let a = assess("splice", Some(&deployment(2, 2)), &[zero, unrelated]);
        assert_eq!(reason(&a), Some(Reason::DisruptionBudgetAllowsZero));
    }

    #[test]
    fn fail_comes_back_only_after_the_hold_and_goes_away_at_once() {
        let t0 = Instant::now();
        let hold = Duration::from_secs(60);
        let mut h = Hold::new(hold, false);
        let fine = Assessment::Available {
            budget: "splice".into(),
        };
        let bad = Assessment::Unavailable {
            reason: Reason::InsufficientReplicas,
            message: "1 available".into(),
        };

        let (s, wake) = h.update(&fine, t0);
        assert_eq!(
            s.blocked.as_ref().map(|b| b.0),
            Some(Reason::HoldingBeforeFail)
        );
        assert_eq!(wake, Some(t0 + hold));
        let (s, _) = h.update(&fine, t0 + Duration::from_secs(59));
        assert!(!s.allows_fail());
        let (s, wake) = h.update(&fine, t0 + hold);
        assert!(s.allows_fail());
        assert_eq!(wake, None);

        // Down immediately, with the reason.
        let (s, _) = h.update(&bad, t0 + Duration::from_secs(61));
        assert_eq!(
            s.blocked.as_ref().map(|b| b.0),
            Some(Reason::InsufficientReplicas)
        );
        assert_eq!(s.label(), "insufficient_replicas");
    }

    #[test]
    fn a_flapping_deployment_restarts_the_hold_every_time() {
        let t0 = Instant::now();
        let hold = Duration::from_secs(60);
        let mut h = Hold::new(hold, false);
        let fine = Assessment::Available {
            budget: "splice".into(),
        };
        let bad = Assessment::Unavailable {
            reason: Reason::InsufficientReplicas,
            message: String::new(),
        };
        for i in 0..5u64 {
            let base = t0 + Duration::from_secs(40 * i);
            assert!(!h.update(&fine, base).0.allows_fail());
            assert!(
                !h.update(&bad, base + Duration::from_secs(30))
                    .0
                    .allows_fail()
            );
        }
        let restart = t0 + Duration::from_secs(200);
        let (_, wake) = h.update(&fine, restart);
        assert_eq!(wake, Some(restart + hold));
        assert!(
            !h.update(&fine, restart + Duration::from_secs(59))
                .0
                .allows_fail()
        );
        assert!(h.update(&fine, restart + hold).0.allows_fail());
    }

    #[test]
    fn fail_already_in_force_at_start_is_kept_while_the_objects_stay_fine() {
        let fine = Assessment::Available {
            budget: "splice".into(),
        };
        let mut h = Hold::new(Duration::from_secs(60), true);
        assert!(h.update(&fine, Instant::now()).0.allows_fail());
        let mut cold = Hold::new(Duration::from_secs(60), false);
        assert!(!cold.update(&fine, Instant::now()).0.allows_fail());
    }

    #[tokio::test]
    async fn a_new_leader_waits_for_the_first_verdict_but_not_forever() {
        let (tx, rx) = channel::channel(GuardStatus::not_observed());
        let waiting = tokio::spawn(first_verdict(rx, Duration::from_secs(30)));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished());
        tx.send_replace(GuardStatus { blocked: None });
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("resolves on the first verdict")
            .unwrap();

        let (_tx, rx) = channel::channel(GuardStatus::not_observed());
        let started = Instant::now();
        first_verdict(rx, Duration::from_millis(50)).await;
        assert!(started.elapsed() >= Duration::from_millis(50));
    }

    #[test]
    fn every_reason_has_a_distinct_condition_reason_and_metric_label() {
        let reasons: std::collections::HashSet<_> = Reason::iter().map(Reason::as_str).collect();
        let labels: std::collections::HashSet<_> = Reason::iter().map(Reason::label).collect();
        assert_eq!(reasons.len(), Reason::iter().count());
        assert_eq!(labels.len(), Reason::iter().count());
        assert!(!labels.contains("available"));
        assert_eq!(GuardStatus::not_observed().label(), "not_observed");
    }
}
