//! The rollout: template changes reach running pods. For every policy with `spec.rollout`, the
//! leader restarts the Deployments, StatefulSets and DaemonSets whose pods carry an outdated
//! injection (or, with `repairMissed`, miss it), under the budget [`plan`] decides, by
//! server-side applying two pod-template annotations under its own field manager; it reports
//! `status.rollout`, the `RolledOut` condition, `splice_rollout_workloads` and Events.
//!
//! Crash-resumable by construction: the restart annotation names `<policy>@<revision>`, so a new
//! leader sees what the last one restarted (and when, for the timeout) and never restarts a
//! workload twice for one revision; a halted rollout is kept in `status.rollout`.
//!
//! Its loop is [`Rollout`] under [`crate::driver`]: [`decide`] decides (pure), [`io`] takes the
//! writes and reads it decided; this module keeps the workload reflectors and their writes.

mod decide;
pub mod inplace;
mod io;
pub mod plan;
pub mod pods;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetStatus, Deployment, DeploymentStatus, StatefulSet, StatefulSetStatus,
};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use splice_crds::{
    ConditionStatus, InjectionPolicy, RESTARTED_AT_ANNOTATION, RESTARTED_FOR_ANNOTATION,
    ROLLOUT_HALT_ANNOTATION, RolloutPhase, RolloutStatus, STATUS_ANNOTATION,
};
use splice_engine::Exclusions;
use splice_engine::selector::Selector;

pub use self::decide::Rollout;
use self::decide::View;
use self::io::{Act, Io, Look, Seen};
use self::plan::{Kind, Progress, Workload, WorkloadRef};
use crate::driver::{self, Inputs, Loop, Now, Pass, Write};
use crate::metrics::Metrics;
use crate::policy::conditions::PlannedEvent;
use crate::status::Owner;
use crate::view;

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
    /// The run's SPIFFE trust domain, for the renderings an in-place update writes.
    pub trust_domain: String,
}

/// What a failed watch of the workload caches says.
const WATCHING: &str = "rollout: watching workloads";

/// The workload caches, each a reflector of the term.
struct Caches {
    deployments: Store<Deployment>,
    statefulsets: Store<StatefulSet>,
    daemonsets: Store<DaemonSet>,
    budgets: Store<PodDisruptionBudget>,
}

/// The leader's rollout loop ([`Rollout`] under the shared driver); a task of the term,
/// cancelled with it.
pub async fn run(config: Config, inputs: Inputs) {
    let client = inputs.client.clone();
    let (deployments, w1) = reflector::store::<Deployment>();
    let (statefulsets, w2) = reflector::store::<StatefulSet>();
    let (daemonsets, w3) = reflector::store::<DaemonSet>();
    let (budgets, w4) = reflector::store::<PodDisruptionBudget>();
    // The watches run inside this task, so ending the term ends them too.
    let every = watcher::Config::default;
    let watches = futures::future::join4(
        driver::reflect(Api::all(client.clone()), every(), w1, WATCHING),
        driver::reflect(Api::all(client.clone()), every(), w2, WATCHING),
        driver::reflect(Api::all(client.clone()), every(), w3, WATCHING),
        driver::reflect(Api::all(client.clone()), every(), w4, WATCHING),
    );
    let io = Io {
        client,
        caches: Caches {
            deployments,
            statefulsets,
            daemonsets,
            budgets,
        },
        exclusions: Exclusions::default_for(&config.splice_namespace),
        trust_domain: config.trust_domain.clone(),
        leading: inputs.leading.clone(),
        resize_unserved: AtomicBool::new(false),
    };
    let rollout = Rollout::new(
        &config.splice_namespace,
        config.max_concurrent,
        &config.trust_domain,
    );
    tokio::select! {
        _ = watches => {}
        _ = driver::run(rollout, io, inputs) => {}
    }
}

impl Loop for Rollout {
    const NAME: &'static str = "rollout";
    const OWNER: Owner = Owner::Rollout;
    const PODS: bool = true;
    type Look = Look;
    type Act = Act;
    type Seen = Seen;
    type Io = Io;
    type Extra = Vec<Workload>;

    fn period(&self) -> Duration {
        PERIOD
    }

    fn pass(&mut self, view: &View, now: Now) -> Pass<Look, Act> {
        self.decide(view, now)
    }

    async fn ready(io: &Io) -> bool {
        let c = &io.caches;
        c.deployments.wait_until_ready().await.is_ok()
            && c.statefulsets.wait_until_ready().await.is_ok()
            && c.daemonsets.wait_until_ready().await.is_ok()
            && c.budgets.wait_until_ready().await.is_ok()
    }

    /// Every workload as its cache shows it (the pass lays this replica's restarts over them).
    fn extra(io: &Io) -> Vec<Workload> {
        let budgets = io.caches.budgets.state();
        let mut out = Vec::new();
        collect(&io.caches.deployments, &budgets, &mut out);
        collect(&io.caches.statefulsets, &budgets, &mut out);
        collect(&io.caches.daemonsets, &budgets, &mut out);
        out
    }

    async fn look(io: &Io, _view: &View, looks: Vec<Look>) -> Vec<Seen> {
        io::look(io, looks).await
    }

    async fn act(io: &Io, act: Act) -> Seen {
        io::act(io, act).await
    }

    fn judge(&mut self, _view: &View, seen: Vec<Seen>, now: Now) -> Vec<Write> {
        self.judged(seen);
        self.name_updated_pods(now.wall);
        Vec::new()
    }

    /// The Events that would follow the write are dropped with it.
    fn failed(&mut self, policy: &str, _now: Now) {
        self.drop_held(policy);
    }

    fn events(&mut self) -> Vec<(Arc<InjectionPolicy>, PlannedEvent)> {
        self.take_events()
    }

    fn again(&self) -> bool {
        self.freed()
    }

    fn publish(&mut self, metrics: &Metrics) {
        if let Some(gauges) = self.gauges.take() {
            metrics.set_rollout(gauges);
        }
    }
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
    crate::driver::Watched + Resource<Scope = k8s_openapi::NamespaceResourceScope>
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
