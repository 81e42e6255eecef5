//! The operator: every replica serves the webhook from caches it keeps current; the replica that
//! holds the Lease also turns policies into webhook configurations, keeps the CA Secret and writes
//! status and Events.
//!
//! Layout: [`policy`] turns one InjectionPolicy into its webhook configuration and status (pure
//! decisions in `render`, `conditions`, `conflicts`, `serving`; API calls in `reconcile` and
//! `validating`); [`certs`] keeps the CA and serving certificates (pure decisions in `ca` and
//! `rotation`, API calls in its root); [`guard`] decides whether `Fail` may be in force,
//! [`coverage`] counts pods injected or missed, [`probe`] sends the admission probe's dry runs and
//! [`verdict`] (pure) reads them; [`leader`] keeps the Lease; wiring here.

pub mod certs;
pub mod coverage;
pub mod guard;
pub mod leader;
pub mod metrics;
pub mod policy;
pub mod probe;
pub mod retry;
pub mod verdict;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, MutatingWebhookConfiguration,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use splice_crds::{InjectionPolicy, InjectionPolicyStatus, MANAGED_BY_LABEL, MANAGER};
use splice_engine::{CompiledPolicy, NamespaceContext};
use splice_server::admin::{AdminServer, Readiness};
use splice_server::metrics::Registry;
use splice_server::server::{WebhookConfig, WebhookServer};
use splice_server::store::{NamespaceStore, PolicyStore};
use splice_server::tls::CertResolver;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use self::certs::{Serving, rotation};
use self::leader::{Leadership, LeaseConfig};
use self::metrics::Metrics;
use self::policy::reconcile::{Error, error_policy, reconcile};
use self::policy::render::ClientTarget;
use self::policy::{neighbours, reconcile, serving, validating};

/// Everything `splice run` is configured with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Splice's own namespace: the Lease and the CA Secret live here, and no pod in it is injected.
    pub namespace: String,
    /// How the API server reaches the webhook (Service or `--webhook-url`).
    pub target: ClientTarget,
    /// Names the serving certificate carries: the Service's DNS names and, for an outside
    /// webhook, the URL's host.
    pub serving_names: Vec<String>,
    /// Only policies matching this label selector are served and managed (empty: all). Lets
    /// several independent Splice instances share a cluster, e.g. in tests or for canaries.
    pub policy_selector: Option<String>,
    /// Whether the leader keeps the ValidatingWebhookConfiguration for policies (else removes it).
    pub validating_webhook: bool,
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub lease: LeaseConfig,
    /// Certificate lifetimes, renewal point and rotation delays.
    pub certs: rotation::Timing,
    /// Where the availability guard looks (Splice's Deployment) and how long it holds.
    pub guard: guard::GuardConfig,
    /// How often the leader's admission probe verifies each policy; `None` turns it off.
    pub probe_interval: Option<Duration>,
}

/// What every reconcile reads and shares.
pub struct Context {
    /// The client every read and write goes through.
    pub client: Client,
    /// Splice's own namespace (excluded from every webhook).
    pub namespace: String,
    /// How the API server reaches the webhook.
    pub target: ClientTarget,
    /// Every managed policy as the controller sees them, for conflict detection.
    pub policies: Store<InjectionPolicy>,
    /// The CA PEM the API server must trust; `None` until the Secret has been loaded.
    pub ca_bundle: watch::Receiver<Option<Arc<String>>>,
    /// Publishes Events on policies.
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// Whether this replica holds the Lease; checked before every write.
    pub leading: Leadership,
    /// Whether the availability guard lets `Fail` be in force.
    pub guard: watch::Receiver<guard::GuardStatus>,
    /// Why Splice cannot keep its certificates (a Secret it did not create), if it cannot.
    pub certificate_problem: watch::Receiver<Option<String>>,
    /// The certificate this replica serves (its NotAfter goes into every status).
    pub serving: watch::Receiver<Serving>,
    /// Who conflicted with whom at the last reconcile, so a spec change re-reconciles only the
    /// policies whose conflicts it can change.
    pub neighbours: Arc<neighbours::Neighbours>,
    /// What tells this Splice's shared webhook entries from another instance's in the cluster.
    pub instance: String,
    /// The spec each policy serves, for grouping policies into shared webhook entries.
    pub served: serving::ServedSpecs,
    /// Consecutive failures per policy, for the retry backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// The status this replica last wrote per policy, until the watch delivers it.
    written: Mutex<HashMap<String, WrittenStatus>>,
}

struct WrittenStatus {
    uid: Option<String>,
    /// resourceVersion of the object the write was based on.
    based_on: Option<String>,
    status: InjectionPolicyStatus,
}

impl Context {
    pub fn new(
        client: Client,
        settings: &Settings,
        policies: Store<InjectionPolicy>,
        ca_bundle: watch::Receiver<Option<Arc<String>>>,
        metrics: Arc<Metrics>,
        leading: Leadership,
    ) -> Self {
        let reporter = Reporter {
            controller: MANAGER.to_owned(),
            instance: Some(settings.lease.identity.clone()),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            namespace: settings.namespace.clone(),
            target: settings.target.clone(),
            policies,
            ca_bundle,
            metrics,
            leading,
            // Until a guard is attached, `Fail` is never in force.
            guard: watch::channel(guard::GuardStatus::not_observed()).1,
            certificate_problem: watch::channel(None).1,
            serving: watch::channel(Serving::default()).1,
            // Without a controller reading the queue, requeues go nowhere.
            neighbours: Arc::new(neighbours::Neighbours::new().0),
            instance: format!(
                "{}/{}",
                settings.namespace,
                settings.policy_selector.as_deref().unwrap_or_default()
            ),
            served: serving::ServedSpecs::default(),
            failures: Mutex::default(),
            written: Mutex::default(),
        }
    }

    pub fn with_serving(mut self, serving: watch::Receiver<Serving>) -> Self {
        self.serving = serving;
        self
    }

    pub fn with_certificate_problem(mut self, problem: watch::Receiver<Option<String>>) -> Self {
        self.certificate_problem = problem;
        self
    }

    pub fn with_neighbours(mut self, neighbours: Arc<neighbours::Neighbours>) -> Self {
        self.neighbours = neighbours;
        self
    }

    pub fn with_guard(mut self, guard: watch::Receiver<guard::GuardStatus>) -> Self {
        self.guard = guard;
        self
    }

    pub(crate) fn ensure_leading(&self) -> Result<(), Error> {
        if self.leading.now() {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    pub(crate) fn count_failure(&self, policy: &str) -> u32 {
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        let n = failures.entry(policy.to_owned()).or_default();
        *n = n.saturating_add(1);
        *n
    }

    pub(crate) fn reset_backoff(&self, policy: &str) {
        self.failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(policy);
    }

    /// The status to compare against: the cached object's, unless the cache still holds the very
    /// version our last status write was based on (its watch event has not arrived yet), in which
    /// case what we wrote. Without this, a reconcile right after a write would write again.
    pub(crate) fn last_known_status(
        &self,
        policy: &InjectionPolicy,
    ) -> Option<InjectionPolicyStatus> {
        let name = policy.name_any();
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        match written.get(&name) {
            Some(w)
                if w.uid == policy.metadata.uid
                    && w.based_on == policy.metadata.resource_version =>
            {
                Some(w.status.clone())
            }
            Some(_) => {
                // The cache has moved past our write: it is the truth again.
                written.remove(&name);
                policy.status.clone()
            }
            None => policy.status.clone(),
        }
    }

    pub(crate) fn remember_status(
        &self,
        policy: &InjectionPolicy,
        _written: &InjectionPolicy,
        status: &InjectionPolicyStatus,
    ) {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                policy.name_any(),
                WrittenStatus {
                    uid: policy.metadata.uid.clone(),
                    based_on: policy.metadata.resource_version.clone(),
                    status: status.clone(),
                },
            );
    }
}

/// Runs `splice run` until `shutdown` resolves: the webhook and admin servers and the caches on
/// every replica, the controller on the leader.
pub async fn run(
    client: Client,
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    settings.lease.validate()?;
    let mut registry = Registry::default();
    let admission = Arc::new(splice_server::metrics::Metrics::register(&mut registry));
    let metrics = Arc::new(Metrics::register(&mut registry));
    let registry = Arc::new(registry);
    let policies = Arc::new(PolicyStore::new());
    let namespaces = Arc::new(NamespaceStore::new());
    let resolver = Arc::new(CertResolver::new());
    let readiness = Arc::new(Readiness::new(Arc::clone(&resolver)));

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = {
        let rx = stop_rx.clone();
        move || wait_true(rx.clone())
    };

    let webhook_listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot listen for webhook requests on {}: {e}",
                settings.listen
            )
        })?;
    let admin_listener = tokio::net::TcpListener::bind(settings.admin_listen)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot listen for admin requests on {}: {e}",
                settings.admin_listen
            )
        })?;
    tracing::info!(
        webhook = %settings.listen,
        admin = %settings.admin_listen,
        namespace = %settings.namespace,
        identity = %settings.lease.identity,
        "splice run starting"
    );
    let server = WebhookServer::new(
        WebhookConfig::new(&settings.namespace),
        Arc::clone(&policies),
        Arc::clone(&namespaces),
        admission,
        Arc::clone(&resolver),
    )?
    .readiness(Arc::clone(&readiness));
    let webhook_task = tokio::spawn(server.serve(webhook_listener, stopped()));
    let admin = AdminServer::new(registry, Arc::clone(&readiness));
    let admin_task = tokio::spawn(admin.serve(admin_listener, stopped()));

    // Caches every replica keeps: the webhook answers from them.
    let (policies_changed_tx, policies_changed) = watch::channel(0u64);
    let (policies_synced_tx, policies_synced) = watch::channel(false);
    let (namespaces_synced_tx, namespaces_synced) = watch::channel(false);
    let (ca_tx, ca_rx) = watch::channel::<Option<Arc<String>>>(None);
    let (secret_changed_tx, secret_changed) = watch::channel(0u64);
    let (served_tx, served_rx) = watch::channel(Serving::default());
    let mut background: Vec<JoinHandle<()>> = vec![
        tokio::spawn(feed_policy_store(
            policy_api(&client),
            watcher_config(&settings.policy_selector),
            Arc::clone(&policies),
            policies_changed_tx,
            policies_synced_tx,
        )),
        tokio::spawn(feed_namespace_store(
            Api::all(client.clone()),
            Arc::clone(&namespaces),
            namespaces_synced_tx,
        )),
        tokio::spawn(certs::load_certificates(
            Api::namespaced(client.clone(), &settings.namespace),
            Arc::clone(&resolver),
            Arc::clone(&metrics),
            ca_tx,
            secret_changed_tx,
            served_tx,
        )),
        tokio::spawn(certs::report_serving(
            Api::namespaced(client.clone(), &settings.namespace),
            settings.lease.identity.clone(),
            served_rx.clone(),
            settings.lease.retry_period,
            settings.lease.lease_duration,
        )),
        tokio::spawn(track_readiness(
            Arc::clone(&readiness),
            policies_synced,
            namespaces_synced,
        )),
    ];

    // The election, and the leader's work whenever this replica leads.
    let (leading_tx, leading_rx) = Leadership::channel();
    background.push(tokio::spawn(leader::run(
        Api::<Lease>::namespaced(client.clone(), &settings.namespace),
        settings.lease.clone(),
        leading_tx,
        stop_rx.clone(),
    )));
    let caches = Caches {
        served: Arc::clone(&policies),
        ca_bundle: ca_rx,
        policies_changed,
        secret_changed,
        serving: served_rx,
    };
    let supervisor = {
        let (client, settings, metrics) = (client.clone(), settings.clone(), Arc::clone(&metrics));
        tokio::spawn(supervise_leadership(
            Arc::clone(&metrics),
            leading_rx,
            move |leading| {
                lead(
                    client.clone(),
                    settings.clone(),
                    Arc::clone(&metrics),
                    leading,
                    caches.clone(),
                )
            },
        ))
    };

    shutdown.await;
    tracing::info!("shutting down");
    stop_tx.send_replace(true);
    readiness.set_draining();
    supervisor.abort();
    // The election loop releases the Lease on the way out; give it a moment to do so.
    if let Some(election) = background.pop() {
        let _ = tokio::time::timeout(Duration::from_secs(5), election).await;
    }
    for task in background {
        task.abort();
    }
    let _ = webhook_task.await;
    let _ = admin_task.await;
    Ok(())
}

fn policy_api(client: &Client) -> Api<InjectionPolicy> {
    Api::all(client.clone())
}

fn watcher_config(selector: &Option<String>) -> watcher::Config {
    let config = watcher::Config::default();
    match selector {
        Some(s) if !s.is_empty() => config.labels(s),
        _ => config,
    }
}

async fn wait_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// A stream that yields once per change of a watch channel.
fn changes<T: Send + Sync + 'static>(
    rx: watch::Receiver<T>,
) -> impl Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    })
}

/// What every replica keeps current and the leader's work reads.
#[derive(Clone)]
struct Caches {
    /// The webhook's compiled policies.
    served: Arc<PolicyStore>,
    ca_bundle: watch::Receiver<Option<Arc<String>>>,
    policies_changed: watch::Receiver<u64>,
    secret_changed: watch::Receiver<u64>,
    serving: watch::Receiver<Serving>,
}

/// The tasks of one leadership term, owned together: ending the term (or dropping it) aborts
/// every one of them, whichever await each is in. A dropped `JoinHandle` would detach its task
/// instead, and a task that outlived its term would keep writing as a leader.
#[derive(Default)]
struct Term {
    tasks: JoinSet<()>,
}

impl Term {
    fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(task);
    }

    /// Aborts every task of the term and waits until each has stopped.
    async fn end(mut self) {
        self.tasks.shutdown().await;
    }
}

/// Starts a term (`begin`) whenever this replica becomes leader and ends it, every task of it,
/// when it stops being leader; a replica elected again starts one new term, never a second
/// copy of a loop.
async fn supervise_leadership(
    metrics: Arc<Metrics>,
    mut leading: Leadership,
    mut begin: impl FnMut(Leadership) -> Term,
) {
    loop {
        if !leading.begun().await {
            return;
        }
        tracing::info!("leading: starting the controller");
        metrics.set_leader(true);
        let term = begin(leading.clone());
        let lost = !leading.ended().await;
        term.end().await;
        metrics.set_leader(false);
        tracing::info!("no longer leading: controller stopped");
        if lost {
            return;
        }
    }
}

/// The leader's work for one term: keep the CA Secret and the validating configuration, run the
/// controller, sweep orphans, the guard, coverage and the probe, each a task of the term.
fn lead(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    leading: Leadership,
    caches: Caches,
) -> Term {
    let mut term = Term::default();
    let Caches {
        served,
        ca_bundle,
        policies_changed,
        secret_changed,
        serving,
    } = caches;
    let policies = policy_api(&client);
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let (neighbours, requeue) = neighbours::Neighbours::new();
    let neighbours = Arc::new(neighbours);
    let (store, writer) = reflector::store::<InjectionPolicy>();
    // `Store::wait_until_ready` wakes only the last of several waiters (its oneshot keeps one
    // waker), and the controller's runner is one: every other task waits on this instead.
    let (listed_tx, listed) = watch::channel(false);
    let policy_events = {
        let neighbours = Arc::clone(&neighbours);
        let store = store.clone();
        watcher(policies, watcher_config(&settings.policy_selector))
            .default_backoff()
            .modify(slim)
            .reflect(writer)
            .inspect(move |event| match event {
                Ok(watcher::Event::Delete(p)) => neighbours.forget(&p.name_any()),
                // A relist does not report what was deleted during the gap; the store knows.
                Ok(watcher::Event::InitDone) => {
                    neighbours.forget_all_but(|name| store.get(&ObjectRef::new(name)).is_some());
                    listed_tx.send_replace(true);
                }
                _ => {}
            })
            .applied_objects()
    };
    let controller = Controller::for_stream(policy_events, store);
    let secret_changed_for_status = secret_changed.clone();
    let keeper = certs::Keeper::new(&client, &settings, controller.store(), leading.clone());
    let certificate_problem = keeper.problems();
    term.spawn(certs::maintain_ca(keeper, secret_changed));
    term.spawn(validating::maintain(
        client.clone(),
        validating::Writer {
            target: settings.target.clone(),
            splice_namespace: settings.namespace.clone(),
            policy_selector: settings.policy_selector.clone(),
            enabled: settings.validating_webhook,
        },
        ca_bundle.clone(),
        leading.clone(),
        Arc::clone(&metrics),
    ));
    term.spawn(sweep_orphans(
        client.clone(),
        controller.store(),
        listed.clone(),
        leading.clone(),
        policies_changed.clone(),
    ));
    let (guard_tx, guard_rx) = watch::channel(guard::GuardStatus::not_observed());
    term.spawn(guard::watch(
        client.clone(),
        settings.guard.clone(),
        settings.policy_selector.clone(),
        Arc::clone(&metrics),
        guard_tx,
    ));
    let ctx = Arc::new(
        Context::new(
            client.clone(),
            &settings,
            controller.store(),
            ca_bundle.clone(),
            metrics,
            leading,
        )
        .with_neighbours(neighbours)
        .with_guard(guard_rx.clone())
        .with_certificate_problem(certificate_problem.clone())
        .with_serving(serving),
    );
    // One namespace watch for coverage and the probe.
    let namespaces = Arc::new(Mutex::new(coverage::Namespaces::default()));
    term.spawn(coverage::watch_namespaces(
        Api::all(client.clone()),
        Arc::clone(&namespaces),
    ));
    term.spawn(coverage::run(
        client.clone(),
        settings.namespace.clone(),
        coverage::Policies {
            cache: controller.store(),
            listed: listed.clone(),
            served: Arc::clone(&served),
        },
        Arc::clone(&namespaces),
        Arc::clone(&ctx.metrics),
        ctx.recorder.clone(),
        ctx.leading.clone(),
    ));
    if let Some(interval) = settings.probe_interval {
        term.spawn(probe::run(
            client.clone(),
            probe::Config {
                interval,
                splice_namespace: settings.namespace.clone(),
            },
            coverage::Policies {
                cache: ctx.policies.clone(),
                listed,
                served,
            },
            Arc::clone(&namespaces),
            Arc::clone(&ctx.metrics),
            ctx.recorder.clone(),
            ctx.leading.clone(),
        ));
    }
    // A spec change or deletion re-reconciles only its conflict partners (`neighbours`); a new CA
    // changes every caBundle; the guard's verdict changes every policy that requests Fail.
    let everything = futures::stream::select(changes(ca_bundle), changes(guard_rx.clone()));
    // A new serving certificate changes every policy's certificateNotAfter.
    let everything = futures::stream::select(everything, changes(secret_changed_for_status));
    let everything = futures::stream::select(everything, changes(certificate_problem));
    let controller = controller
        .owns(
            configurations,
            watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGER}")),
        )
        // The in-tree objects of a policy, for drift repair like its webhook configuration.
        .owns(
            Api::<MutatingAdmissionPolicy>::all(client.clone()),
            watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGER}")),
        )
        .owns(
            Api::<MutatingAdmissionPolicyBinding>::all(client),
            watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGER}")),
        )
        .reconcile_all_on(everything)
        .reconcile_on(requeue)
        .with_config(controller::Config::default().concurrency(4));
    term.spawn(async move {
        // Without this, a new leader would first write every Fail policy with Ignore, then Fail
        // again.
        guard::first_verdict(guard_rx, guard::FIRST_VERDICT_WAIT).await;
        controller
            .run(reconcile, error_policy, ctx)
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "controller event");
                }
            })
            .await;
    });
    term
}

/// What the leader's cache keeps of a policy: everything but managedFields and kubectl's
/// last-applied copy of the spec, which nothing reads and which can be most of a small object.
fn slim(policy: &mut InjectionPolicy) {
    policy.managed_fields_mut().clear();
    if let Some(annotations) = policy.metadata.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// Deletes Splice-labelled webhook configurations whose owning policy is gone. Garbage
/// collection normally does this first; the sweep covers clusters where it is off or behind.
async fn sweep_orphans(
    client: Client,
    known: Store<InjectionPolicy>,
    listed: watch::Receiver<bool>,
    leading: Leadership,
    mut policies_changed: watch::Receiver<u64>,
) {
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let policies = policy_api(&client);
    wait_true(listed).await;
    loop {
        if let Err(e) = sweep_once(&configurations, &policies, &known, &leading).await {
            tracing::warn!(error = %e, "orphan sweep failed");
        }
        // The in-tree objects of a deleted policy go the same way.
        let maps = Api::<MutatingAdmissionPolicy>::all(client.clone());
        let bindings = Api::<MutatingAdmissionPolicyBinding>::all(client.clone());
        for result in [
            sweep_once(&bindings, &policies, &known, &leading).await,
            sweep_once(&maps, &policies, &known, &leading).await,
        ] {
            if let Err(e) = result {
                tracing::warn!(error = %e, "orphan sweep of in-tree objects failed");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(reconcile::RESYNC) => {}
            changed = policies_changed.changed() => if changed.is_err() { return },
        }
    }
}

async fn sweep_once<K>(
    configurations: &Api<K>,
    policies: &Api<InjectionPolicy>,
    known: &Store<InjectionPolicy>,
    leading: &Leadership,
) -> Result<(), kube::Error>
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let managed = configurations
        .list_metadata(&ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGER}")))
        .await?;
    'configurations: for configuration in managed {
        // A shared entry has one owner per policy it serves: it is an orphan once all are gone.
        let owners: Vec<_> = configuration
            .owner_references()
            .iter()
            .filter(|o| {
                o.kind == InjectionPolicy::kind(&())
                    && o.api_version == InjectionPolicy::api_version(&())
            })
            .collect();
        if owners.is_empty() {
            continue;
        }
        for owner in &owners {
            let cached = known.get(&ObjectRef::new(&owner.name));
            if cached.as_ref().and_then(|p| p.metadata.uid.as_ref()) == Some(&owner.uid) {
                continue 'configurations;
            }
            // Not in the cache: maybe deleted, maybe created a moment ago, maybe another
            // instance's (outside --policy-selector). Only the API can tell.
            let alive = policies.get_opt(&owner.name).await?;
            if alive.as_ref().and_then(|p| p.metadata.uid.as_ref()) == Some(&owner.uid) {
                continue 'configurations;
            }
        }
        let owner = owners[0];
        if !leading.now() {
            return Ok(());
        }
        let name = configuration.name_any();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: configuration.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match configurations.delete(&name, &params).await {
            Ok(_) => {
                tracing::info!(configuration = %name, policy = %owner.name, "removed the configuration of a deleted policy")
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Keeps the webhook's policy store equal to the managed policies, serving for each the
/// generation in force ([`serving::in_force`]): an update that does not compile leaves the last
/// good one in place. Compiles once per change of what decides that. Signals `changed` when the
/// set of (policy, generation) changes and `synced` once the first full list is in.
async fn feed_policy_store(
    api: Api<InjectionPolicy>,
    config: watcher::Config,
    store: Arc<PolicyStore>,
    changed: watch::Sender<u64>,
    synced: watch::Sender<bool>,
) {
    let mut compiled: HashMap<String, CompileKey> = HashMap::new();
    let mut listing: Vec<InjectionPolicy> = Vec::new();
    let bump = |changed: &watch::Sender<u64>| changed.send_modify(|n| *n = n.wrapping_add(1));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(p)) => listing.push(p),
            Ok(watcher::Event::InitDone) => {
                let mut entries = Vec::new();
                let mut keys = HashMap::new();
                for p in listing.drain(..) {
                    let name = p.name_any();
                    let (key, entry) = match compiled.get(&name) {
                        Some(key) if key.still(&p) => (key.clone(), store.get(&name)),
                        _ => serve(&p, store.get(&name)),
                    };
                    if let Some(entry) = entry {
                        entries.push((name.clone(), entry));
                    }
                    keys.insert(name, key);
                }
                store.replace_all(entries);
                compiled = keys;
                bump(&changed);
                synced.send_replace(true);
            }
            Ok(watcher::Event::Apply(p)) => {
                let name = p.name_any();
                if compiled.get(&name).is_some_and(|key| key.still(&p)) {
                    continue;
                }
                let (key, entry) = serve(&p, store.get(&name));
                match entry {
                    Some(c) => {
                        store.insert(name.clone(), c);
                    }
                    None => {
                        store.remove(&name);
                    }
                }
                compiled.insert(name, key);
                bump(&changed);
            }
            Ok(watcher::Event::Delete(p)) => {
                let name = p.name_any();
                store.remove(&name);
                compiled.remove(&name);
                bump(&changed);
            }
            Err(e) => tracing::warn!(error = %e, "watching InjectionPolicies"),
        }
    }
}

/// What the compiled entry of a policy was decided from: its uid and generation, and, while the
/// current generation does not compile, the generation the status keeps in force. A status-only
/// update changes none of these and recompiles nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CompileKey {
    uid: Option<String>,
    generation: Option<i64>,
    /// `None` when the current generation compiled.
    kept: Option<Option<i64>>,
}

impl CompileKey {
    fn still(&self, policy: &InjectionPolicy) -> bool {
        self.uid == policy.metadata.uid
            && self.generation == policy.metadata.generation
            && self.kept.is_none_or(|kept| {
                kept == policy.status.as_ref().and_then(|s| s.serving_generation)
            })
    }
}

/// The entry to serve for `policy`, given the one this replica serves now.
fn serve(
    policy: &InjectionPolicy,
    serving: Option<Arc<CompiledPolicy>>,
) -> (CompileKey, Option<Arc<CompiledPolicy>>) {
    let name = policy.name_any();
    let in_force = serving::in_force(policy);
    let kept = match &in_force {
        serving::InForce::Current(_) => None,
        _ => Some(policy.status.as_ref().and_then(|s| s.serving_generation)),
    };
    let key = CompileKey {
        uid: policy.metadata.uid.clone(),
        generation: policy.metadata.generation,
        kept,
    };
    if let Some(error) = in_force.error() {
        tracing::warn!(policy = %name, generation = policy.metadata.generation, error = %error, "policy does not compile; serving the last generation that did, if any");
    }
    let entry = match in_force.into_compiled() {
        Some(c) => Some(Arc::new(c)),
        // The status may not record the last good generation yet (the leader writes it after
        // this replica compiled it): keep serving what this replica already had of this policy.
        None => serving.filter(|s| {
            policy
                .metadata
                .generation
                .is_some_and(|g| s.generation() < g)
        }),
    };
    (key, entry)
}

fn namespace_context(ns: &Namespace) -> NamespaceContext {
    NamespaceContext {
        name: ns.name_any(),
        labels: ns.metadata.labels.clone().unwrap_or_default(),
        annotations: ns.metadata.annotations.clone().unwrap_or_default(),
    }
}

/// Keeps the webhook's namespace store equal to the cluster's namespaces.
async fn feed_namespace_store(
    api: Api<Namespace>,
    store: Arc<NamespaceStore>,
    synced: watch::Sender<bool>,
) {
    let mut listing = Vec::new();
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(ns)) => {
                listing.push((ns.name_any(), Arc::new(namespace_context(&ns))))
            }
            Ok(watcher::Event::InitDone) => {
                store.replace_all(listing.drain(..));
                synced.send_replace(true);
            }
            Ok(watcher::Event::Apply(ns)) => {
                let context = namespace_context(&ns);
                if store.get(&context.name).as_deref() != Some(&context) {
                    store.insert(context.name.clone(), Arc::new(context));
                }
            }
            Ok(watcher::Event::Delete(ns)) => {
                store.remove(&ns.name_any());
            }
            Err(e) => tracing::warn!(error = %e, "watching Namespaces"),
        }
    }
}

/// Ready once both caches listed everything (the certificate is checked by `Readiness` itself).
async fn track_readiness(
    readiness: Arc<Readiness>,
    mut policies: watch::Receiver<bool>,
    mut namespaces: watch::Receiver<bool>,
) {
    let _ = policies.wait_for(|s| *s).await;
    let _ = namespaces.wait_for(|s| *s).await;
    readiness.set_caches_synced(true);
    tracing::info!("policy and namespace caches synced");
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http::{Request, Response};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use kube::client::Body;
    use tokio::time::Instant;
    use tower_test::mock;

    use super::*;
    use crate::policy::render::ClientTarget;

    /// What the tests run Splice with: an outside webhook URL, default timings.
    pub(crate) fn settings() -> Settings {
        Settings {
            namespace: "splice-system".into(),
            target: ClientTarget::from_url("https://127.0.0.1:9443").unwrap(),
            serving_names: vec!["127.0.0.1".into()],
            policy_selector: None,
            validating_webhook: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            lease: LeaseConfig {
                name: "splice-leader".into(),
                identity: "test".into(),
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
            },
            certs: rotation::Timing::default(),
            guard: guard::GuardConfig {
                namespace: "splice-system".into(),
                deployment: "splice".into(),
                hold: Duration::from_secs(60),
            },
            probe_interval: Some(Duration::from_secs(60)),
        }
    }

    /// Waits (at most 5 s) until `done` holds.
    async fn eventually(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// How many loops hold `alive`: the test and the supervisor's `begin` hold one each.
    fn running(alive: &Arc<()>) -> usize {
        Arc::strong_count(alive) - 2
    }

    /// A term of three loops, each holding `alive` while it runs: one waits forever, one sleeps
    /// in a loop, one waits on a channel nobody writes to.
    fn three_loops(alive: &Arc<()>, begun: &Arc<AtomicUsize>) -> Term {
        begun.fetch_add(1, Ordering::SeqCst);
        let mut term = Term::default();
        let held = Arc::clone(alive);
        term.spawn(async move {
            let _held = held;
            std::future::pending::<()>().await;
        });
        let held = Arc::clone(alive);
        term.spawn(async move {
            let _held = held;
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let held = Arc::clone(alive);
        term.spawn(async move {
            let _held = held;
            let (_tx, mut rx) = watch::channel(0u8);
            let _ = rx.wait_for(|v| *v > 0).await;
        });
        term
    }

    /// A supervisor whose every term is [`three_loops`], and the election that drives it.
    fn supervise_three_loops(
        alive: &Arc<()>,
        begun: &Arc<AtomicUsize>,
    ) -> (leader::LeadershipSender, JoinHandle<()>) {
        let (tx, leading) = Leadership::channel();
        let (alive, begun) = (Arc::clone(alive), Arc::clone(begun));
        let supervisor = tokio::spawn(supervise_leadership(
            Arc::new(Metrics::new()),
            leading,
            move |_| three_loops(&alive, &begun),
        ));
        (tx, supervisor)
    }

    fn elect(tx: &leader::LeadershipSender, leading: bool) {
        tx.send_replace(leading.then(|| Instant::now() + Duration::from_secs(60)));
    }

    #[tokio::test]
    async fn losing_leadership_ends_every_task_of_the_term_whatever_it_awaits() {
        let (alive, begun) = (Arc::new(()), Arc::new(AtomicUsize::new(0)));
        let (tx, supervisor) = supervise_three_loops(&alive, &begun);
        elect(&tx, true);
        eventually("the term's three loops run", || running(&alive) == 3).await;
        elect(&tx, false);
        eventually("every loop of the term has ended", || running(&alive) == 0).await;
        assert!(!supervisor.is_finished(), "the supervisor waits for the next term");
        supervisor.abort();
    }

    #[tokio::test]
    async fn a_replica_elected_again_runs_each_loop_once() {
        let (alive, begun) = (Arc::new(()), Arc::new(AtomicUsize::new(0)));
        let (tx, supervisor) = supervise_three_loops(&alive, &begun);
        elect(&tx, true);
        eventually("the first term runs", || running(&alive) == 3).await;
        elect(&tx, false);
        eventually("the first term ended", || running(&alive) == 0).await;
        elect(&tx, true);
        eventually("the second term runs", || begun.load(Ordering::SeqCst) == 2).await;
        eventually("the second term's loops run", || running(&alive) == 3).await;
        // Renewals within a term start nothing more.
        elect(&tx, true);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(running(&alive), 3, "each loop runs once");
        assert_eq!(begun.load(Ordering::SeqCst), 2);
        supervisor.abort();
    }

    #[tokio::test]
    async fn ending_a_real_term_leaves_no_task_that_can_reach_the_api() {
        // An API server that never answers: every task of the term is parked on a request.
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let requests = Arc::new(AtomicUsize::new(0));
        let answering = tokio::spawn({
            let requests = Arc::clone(&requests);
            async move {
                let mut handle = std::pin::pin!(handle);
                let mut parked = Vec::new();
                // `None` once every clone of the client is gone.
                while let Some(request) = handle.next_request().await {
                    requests.fetch_add(1, Ordering::SeqCst);
                    parked.push(request);
                }
            }
        });
        let client = Client::new(service, "default");
        let (_ca_tx, ca_bundle) = watch::channel(None);
        let (_changed_tx, policies_changed) = watch::channel(0);
        let (_secret_tx, secret_changed) = watch::channel(0);
        let (_serving_tx, serving) = watch::channel(Serving::default());
        let term = lead(
            client,
            settings(),
            Arc::new(Metrics::new()),
            Leadership::fixed(true),
            Caches {
                served: Arc::new(PolicyStore::new()),
                ca_bundle,
                policies_changed,
                secret_changed,
                serving,
            },
        );
        // The CA loop, the validating configuration, and the policy, namespace and pod watches.
        eventually("the term's loops are waiting on the API", || {
            requests.load(Ordering::SeqCst) >= 5
        })
        .await;
        term.end().await;
        tokio::time::timeout(Duration::from_secs(5), answering)
            .await
            .expect("a task of the ended term still holds a client")
            .expect("the fake API server ran");
    }

    #[test]
    fn the_leaders_cache_drops_managed_fields_and_last_applied_but_keeps_the_rest() {
        let mut p = InjectionPolicy::new("p", Default::default());
        p.spec.paused = true;
        p.metadata.generation = Some(4);
        p.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kubectl".into()),
            ..ManagedFieldsEntry::default()
        }]);
        p.metadata.annotations = Some(BTreeMap::from([
            (
                "kubectl.kubernetes.io/last-applied-configuration".to_owned(),
                "{\"spec\":{}}".to_owned(),
            ),
            ("team".to_owned(), "a".to_owned()),
        ]));
        slim(&mut p);
        assert!(p.metadata.managed_fields.unwrap_or_default().is_empty());
        assert_eq!(
            p.metadata.annotations,
            Some(BTreeMap::from([("team".to_owned(), "a".to_owned())]))
        );
        assert!(p.spec.paused);
        assert_eq!(p.metadata.generation, Some(4));
    }
}
