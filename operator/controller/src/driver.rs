//! The one shape of the leader's periodic loops (coverage, the admission probe, and those to
//! come): wait for the policy listing and the leader's view, tick at the loop's period, take one
//! [`Snapshot`], let the loop decide ([`Loop::pass`], pure), write the status slices it decided
//! through its owner's [`status::Writer`], take its own writes and looks (the probe's dry runs)
//! and decide again from what they came to ([`Loop::judge`], pure), every write after a last
//! leadership check, then publish the Events the tick decided besides its writes' own
//! ([`Loop::events`]) and its metrics. A loop's state is plain data: its decisions are
//! unit-tested with snapshots built by hand, without a cluster.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use splice_crds::{InjectionPolicy, InjectionPolicyStatus};
use splice_engine::{CompiledPolicy, NamespaceContext};
use splice_server::store::PolicyStore;

use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::policy::conditions::{PlannedEvent, Severity};
use crate::status::{self, Outcome, Owner};
use crate::view::{LeaderView, PodRecord, Policies};

/// What one tick of a loop decides from: the policies, the webhook's compilations, the leader's
/// namespaces and pods, the loop's own writes that the cache does not show yet, and what else the
/// loop reads (`extra`: [`Loop::Extra`]).
#[derive(Clone, Default)]
pub struct Snapshot<X = ()> {
    pub policies: Vec<Arc<InjectionPolicy>>,
    /// The webhook's compiled policies by entry name (a canary's under `<policy>@canary`).
    pub served: BTreeMap<String, Arc<CompiledPolicy>>,
    pub namespaces: Arc<HashMap<String, NamespaceContext>>,
    /// Bumped by the namespace watch on every change.
    pub namespaces_generation: u64,
    /// Empty unless the loop reads pods ([`Loop::PODS`]).
    pub pods: Arc<Vec<Arc<PodRecord>>>,
    pub pods_generation: u64,
    /// Per policy, the slice this loop's owner wrote that the cache does not show yet.
    pub pending: HashMap<String, InjectionPolicyStatus>,
    /// Per policy, when this replica last wrote its owner's slice, shown by the cache or not (the
    /// rollout's throttle).
    pub written_at: HashMap<String, Instant>,
    pub extra: X,
}

impl<X> Snapshot<X> {
    /// The status to decide from: the cached one, with `owner`'s pending write as its slice.
    pub fn status<'a>(
        &'a self,
        owner: Owner,
        policy: &'a InjectionPolicy,
    ) -> Option<Cow<'a, InjectionPolicyStatus>> {
        match self.pending.get(&policy.name_any()) {
            Some(slice) => Some(Cow::Owned(owner.overlay(policy.status.as_ref(), slice))),
            None => policy.status.as_ref().map(Cow::Borrowed),
        }
    }

    /// The revision in force the webhook serves for `name`, as `policy::in_force::in_force_of`
    /// reads it from the live store: the canary's entry first.
    pub fn in_force_of(&self, name: &str) -> Option<Arc<CompiledPolicy>> {
        self.served
            .get(&splice_engine::entry::canary_key(name))
            .or_else(|| self.served.get(name))
            .cloned()
    }
}

/// When a tick runs: the monotonic instant for scheduling, the wall clock for the status.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    pub at: Instant,
    pub wall: Timestamp,
}

impl Now {
    pub fn current() -> Self {
        Now {
            at: Instant::now(),
            wall: Timestamp::now(),
        }
    }
}

/// One write a loop decided: its owner's slice of a policy's status, and what follows it.
#[derive(Clone, Debug)]
pub struct Write {
    pub policy: Arc<InjectionPolicy>,
    /// The whole slice: what the owner set before and omits here is removed.
    pub slice: InjectionPolicyStatus,
    /// Published once the slice is written (not when it was already up to date).
    pub then: Option<PlannedEvent>,
    /// Logged once the slice is written.
    pub log: Option<String>,
}

/// What a pass decided: status writes now, the loop's own writes (`acts`) and looks to take
/// before judging.
pub struct Pass<L, A = Infallible> {
    pub writes: Vec<Write>,
    pub acts: Vec<A>,
    pub looks: Vec<L>,
}

impl<L, A> Default for Pass<L, A> {
    fn default() -> Self {
        Pass {
            writes: Vec::new(),
            acts: Vec::new(),
            looks: Vec::new(),
        }
    }
}

/// A leader loop: its decisions, pure, over plain state; [`run`] does the rest.
pub trait Loop: Send + 'static {
    /// Names the loop in logs.
    const NAME: &'static str;
    /// Whose slice of the status it writes.
    const OWNER: Owner;
    /// Whether it reads the pods (a snapshot costs an Arc per pod, taken when they changed).
    const PODS: bool;
    /// How many of a tick's acts are taken at once (each after its own leadership check): 1
    /// keeps their order; the signer's answers are independent.
    const ACTS_AT_ONCE: usize = 1;
    /// What it asks to look at between deciding and judging (the probe's dry runs).
    type Look: Send + 'static;
    /// Its own writes besides status slices (a rollout's restarts), each taken after a last
    /// leadership check; `Infallible` for none.
    type Act: Send + 'static;
    /// What a look or an act came to, for [`Loop::judge`].
    type Seen: Send + 'static;
    /// What its looks need (a client, a token bucket); not part of its decisions.
    type Io: Send + Sync + 'static;
    /// What it reads besides the view, copied from its `Io` at each tick (a rollout's workloads
    /// and budgets); `()` for none.
    type Extra: Default + Send + Sync + 'static;

    fn period(&self) -> Duration;

    /// Resolves when something `Io` watches calls for a tick before the period is up (a new
    /// request to the signer); never, by default.
    fn woken(io: &Self::Io) -> impl Future<Output = ()> + Send {
        let _ = io;
        std::future::pending()
    }

    /// Whether the tick just taken left work that the next pass can do at once (the signer
    /// issues once the pods it read are known), rather than at the next period.
    fn again(&self) -> bool {
        false
    }

    /// Decides from one snapshot. Pure; runs off the async workers (it may be CPU work).
    fn pass(&mut self, view: &Snapshot<Self::Extra>, now: Now) -> Pass<Self::Look, Self::Act>;

    /// Waits until what `Io` keeps is listed (a rollout's workload caches); false: never.
    fn ready(io: &Self::Io) -> impl Future<Output = bool> + Send {
        let _ = io;
        async { true }
    }

    /// Copies what the pass reads besides the view out of `Io`.
    fn extra(io: &Self::Io) -> Self::Extra {
        let _ = io;
        Self::Extra::default()
    }

    /// Takes the looks `pass` asked for (I/O only).
    fn look(
        io: &Self::Io,
        view: &Snapshot<Self::Extra>,
        looks: Vec<Self::Look>,
    ) -> impl Future<Output = Vec<Self::Seen>> + Send {
        let _ = (io, view, looks);
        async { Vec::new() }
    }

    /// Takes one of its own writes (I/O only).
    fn act(io: &Self::Io, act: Self::Act) -> impl Future<Output = Self::Seen> + Send;

    /// Decides what the acts and looks came to. Pure.
    fn judge(
        &mut self,
        view: &Snapshot<Self::Extra>,
        seen: Vec<Self::Seen>,
        now: Now,
    ) -> Vec<Write> {
        let _ = (view, seen, now);
        Vec::new()
    }

    /// A write to `policy` failed.
    fn failed(&mut self, policy: &str, now: Now);

    /// The Events this tick decided besides those that follow a write (a rollout's one
    /// `Restarted` per pass), published at its end after a last leadership check.
    fn events(&mut self) -> Vec<(Arc<InjectionPolicy>, PlannedEvent)> {
        Vec::new()
    }

    /// Publishes what the last pass measured.
    fn publish(&mut self, metrics: &Metrics);
}

/// What [`reflect`] can watch.
pub trait Watched:
    Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// A wake-up for a loop's [`Loop::woken`]: rung for each object seen that `calls` calls for.
pub struct Wake<K> {
    pub notify: Arc<tokio::sync::Notify>,
    pub calls: fn(&K) -> bool,
}

/// Keeps `writer`'s store current from a watch of `api` (managedFields dropped: nothing reads
/// them); for a loop that owns caches besides the view, run inside its task so that ending the
/// term ends the watch. `what` names the watch in warnings.
pub async fn reflect<K: Watched>(
    api: kube::Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    what: &'static str,
) {
    reflect_waking(api, config, writer, what, None).await;
}

/// [`reflect`], and `wake` rung, once the store holds an object, if it calls for it.
pub async fn reflect_waking<K: Watched>(
    api: kube::Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    what: &'static str,
    wake: Option<Wake<K>>,
) {
    let wake = wake.as_ref();
    watcher(api, config)
        .default_backoff()
        .modify(|o| o.managed_fields_mut().clear())
        .reflect(writer)
        .for_each(|event| async move {
            match event {
                Err(e) => tracing::warn!(error = %e, "{what}"),
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    if let Some(w) = wake
                        && (w.calls)(&o)
                    {
                        w.notify.notify_one();
                    }
                }
                Ok(_) => {}
            }
        })
        .await;
}

/// What every loop reads and writes through.
pub struct Inputs {
    pub policies: Policies,
    pub view: LeaderView,
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub leading: Leadership,
}

/// Runs `l` until the term ends (or this replica stops leading).
pub async fn run<L: Loop>(mut l: L, io: L::Io, inputs: Inputs) {
    let Inputs {
        policies,
        view,
        client,
        recorder,
        metrics,
        leading,
    } = inputs;
    let Policies {
        cache,
        mut listed,
        webhook_policies: served,
    } = policies;
    tracing::debug!(what = L::NAME, "waiting for the policy cache");
    if listed.wait_for(|l| *l).await.is_err() || !L::ready(&io).await {
        return;
    }
    let writer = status::Writer::new(client, L::OWNER, leading.clone());
    let mut views = Views::default();
    let mut ticker = tokio::time::interval(l.period());
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = L::woken(&io) => {}
        }
        let Some(snapshot) = views.take::<L>(&cache, &served, &view, &writer, &io) else {
            tracing::debug!(what = L::NAME, "waiting for the pod and namespace lists");
            continue;
        };
        // Between terms, or past the renew deadline: nothing to decide until the term says.
        if !leading.now() {
            continue;
        }
        // Policies × pods is CPU work: off the async workers, which also serve admissions.
        let decided = tokio::task::spawn_blocking(move || {
            let pass = l.pass(&snapshot, Now::current());
            (l, snapshot, pass)
        })
        .await;
        let Ok((back, snapshot, pass)) = decided else {
            return;
        };
        l = back;
        if !write(&mut l, &writer, &recorder, &leading, pass.writes).await {
            return;
        }
        let mut seen = Vec::new();
        let mut acts = futures::stream::iter(pass.acts)
            .map(|act| {
                let (io, leading) = (&io, &leading);
                async move {
                    if leading.now() {
                        Some(L::act(io, act).await)
                    } else {
                        None
                    }
                }
            })
            .buffered(L::ACTS_AT_ONCE.max(1));
        while let Some(done) = acts.next().await {
            let Some(done) = done else {
                return;
            };
            seen.push(done);
        }
        if !pass.looks.is_empty() {
            seen.extend(L::look(&io, &snapshot, pass.looks).await);
        }
        if !seen.is_empty() {
            let writes = l.judge(&snapshot, seen, Now::current());
            if !write(&mut l, &writer, &recorder, &leading, writes).await {
                return;
            }
        }
        let events = l.events();
        if !events.is_empty() && !leading.now() {
            return;
        }
        for (policy, event) in events {
            publish(&recorder, &policy, event).await;
        }
        l.publish(&metrics);
        if l.again() {
            ticker.reset_immediately();
        }
    }
}

/// Applies `writes` in order, each after a last leadership check; false once this replica no
/// longer leads.
async fn write<L: Loop>(
    l: &mut L,
    writer: &status::Writer,
    recorder: &Recorder,
    leading: &Leadership,
    writes: Vec<Write>,
) -> bool {
    for w in writes {
        if !leading.now() {
            return false;
        }
        let name = w.policy.name_any();
        match writer.apply(&w.policy, &w.slice).await {
            Ok(Outcome::UpToDate) => {}
            Ok(Outcome::NotLeader) => return false,
            Ok(Outcome::Written) => {
                if let Some(log) = &w.log {
                    tracing::info!(policy = %name, what = L::NAME, "{log}");
                }
                if let Some(event) = w.then {
                    publish(recorder, &w.policy, event).await;
                }
            }
            Err(e) => {
                let label = e.label();
                let what = L::NAME;
                tracing::warn!(policy = %name, what, error = %e, label, "status not written");
                l.failed(&name, Now::current());
            }
        }
    }
    true
}

async fn publish(recorder: &Recorder, policy: &InjectionPolicy, event: PlannedEvent) {
    let reason = event.reason.clone();
    let ev = Event {
        type_: match event.severity {
            Severity::Normal => EventType::Normal,
            Severity::Warning => EventType::Warning,
        },
        reason: event.reason,
        note: Some(event.note),
        action: event.action.to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, &policy.object_ref(&())).await {
        let policy = policy.name_any();
        tracing::warn!(%policy, %reason, error = %e, "could not publish an Event");
    }
}

/// The namespaces and pods last copied out of the view, copied again only when they changed.
#[derive(Default)]
struct Views {
    namespaces: Option<(u64, Arc<HashMap<String, NamespaceContext>>)>,
    pods: Option<(u64, Arc<Vec<Arc<PodRecord>>>)>,
}

impl Views {
    /// One snapshot for `L`; `None` until the lists it reads are synced.
    fn take<L: Loop>(
        &mut self,
        cache: &Store<InjectionPolicy>,
        served: &PolicyStore,
        view: &LeaderView,
        writer: &status::Writer,
        io: &L::Io,
    ) -> Option<Snapshot<L::Extra>> {
        let (namespaces, namespaces_generation) = {
            let n = view
                .namespaces
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !n.synced {
                return None;
            }
            let copy = match self.namespaces.take() {
                Some((generation, copy)) if generation == n.generation => copy,
                _ => Arc::new(n.contexts.clone()),
            };
            self.namespaces = Some((n.generation, Arc::clone(&copy)));
            (copy, n.generation)
        };
        let (pods, pods_generation) = if L::PODS {
            let p = view.pods.lock().unwrap_or_else(PoisonError::into_inner);
            if !p.synced {
                return None;
            }
            let copy = match self.pods.take() {
                Some((generation, copy)) if generation == p.generation => copy,
                _ => Arc::new(p.snapshot()),
            };
            self.pods = Some((p.generation, Arc::clone(&copy)));
            (copy, p.generation)
        } else {
            (Arc::default(), 0)
        };
        let policies = cache.state();
        let served = served
            .names()
            .into_iter()
            .filter_map(|n| Some((n.clone(), served.get(&n)?)))
            .collect();
        let written_at = policies
            .iter()
            .filter_map(|p| Some((p.name_any(), writer.written_at(&p.name_any())?)))
            .collect();
        Some(Snapshot {
            pending: writer.pending(&policies),
            written_at,
            policies,
            served,
            namespaces,
            namespaces_generation,
            pods,
            pods_generation,
            extra: L::extra(io),
        })
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::events::Reporter;
    use kube::runtime::{reflector, watcher};
    use serde_json::{Value, json};
    use splice_crds::Coverage;
    use tokio::sync::watch;

    use super::*;
    use crate::status::tests::{Requests, fake_api};

    /// A loop that decides one coverage write with an Event, every pass.
    struct Once;

    impl Loop for Once {
        const NAME: &'static str = "test";
        const OWNER: Owner = Owner::Coverage;
        const PODS: bool = false;
        type Look = ();
        type Act = Infallible;
        type Seen = ();
        type Io = ();
        type Extra = ();

        fn period(&self) -> Duration {
            Duration::from_millis(10)
        }

        fn pass(&mut self, view: &Snapshot, _now: Now) -> Pass<()> {
            let writes = view
                .policies
                .iter()
                .map(|p| Write {
                    policy: Arc::clone(p),
                    slice: InjectionPolicyStatus {
                        coverage: Some(Coverage {
                            matched: 1,
                            ..Coverage::default()
                        }),
                        ..InjectionPolicyStatus::default()
                    },
                    then: Some(PlannedEvent {
                        severity: Severity::Warning,
                        reason: "Tested".into(),
                        action: "Test",
                        note: "n".into(),
                    }),
                    log: None,
                })
                .collect();
            Pass {
                writes,
                ..Pass::default()
            }
        }

        async fn act(_io: &(), act: Infallible) {
            match act {}
        }

        fn failed(&mut self, _policy: &str, _now: Now) {}

        fn publish(&mut self, _metrics: &Metrics) {}
    }

    fn inputs(client: Client, leading: bool) -> Inputs {
        let (store, mut writer) = reflector::store::<InjectionPolicy>();
        let mut p = InjectionPolicy::new("mesh", Default::default());
        p.metadata.uid = Some("u1".into());
        p.metadata.resource_version = Some("5".into());
        writer.apply_watcher_event(&watcher::Event::Apply(p));
        let view = LeaderView::default();
        view.namespaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .synced = true;
        let reporter = Reporter {
            controller: "splice".into(),
            instance: None,
        };
        Inputs {
            policies: Policies {
                cache: store,
                listed: watch::channel(true).1,
                webhook_policies: Arc::new(PolicyStore::new()),
            },
            view,
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics: Arc::new(Metrics::new()),
            leading: Leadership::fixed(leading),
        }
    }

    /// The requests of [`Once`] run for `time`, leading or not.
    async fn requests(leading: bool, time: Duration) -> Vec<(String, String, Value)> {
        let seen = Requests::default();
        let task = tokio::spawn(run(Once, (), inputs(fake_api(Arc::clone(&seen)), leading)));
        tokio::time::sleep(time).await;
        task.abort();
        seen.lock().unwrap().clone()
    }

    #[tokio::test]
    async fn a_decided_slice_is_applied_under_its_owners_manager_once_then_its_event_follows() {
        let seen = requests(true, Duration::from_millis(300)).await;
        let patches: Vec<_> = seen.iter().filter(|(m, _, _)| m == "PATCH").collect();
        // Later passes decide the same slice: the writer knows it is written (the cache lags).
        let [(_, uri, body)] = patches.as_slice() else {
            panic!("one status write: {seen:?}")
        };
        assert!(uri.contains("/injectionpolicies/mesh/status"), "{uri}");
        assert!(uri.contains("fieldManager=splice-coverage") && uri.contains("force=true"));
        assert_eq!(
            body["status"],
            json!({"coverage": {"matched": 1, "current": 0, "outdated": 0, "missed": 0}})
        );
        let events: Vec<_> = seen
            .iter()
            .filter(|(m, u, _)| m == "POST" && u.contains("events"))
            .collect();
        assert_eq!(events.len(), 1, "{seen:?}");
        assert_eq!(events[0].2["reason"], "Tested");
    }

    #[tokio::test]
    async fn a_replica_that_does_not_lead_decides_and_writes_nothing() {
        assert!(requests(false, Duration::from_millis(100)).await.is_empty());
    }
}
