//! `splice run`'s wiring and lifecycle: the servers and the caches every replica keeps
//! ([`feeds`]), the election, and the leader's work for each term it holds ([`leadership`]),
//! including the orphan sweep ([`janitor`]).

mod feeds;
mod janitor;
mod leadership;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::api::Api;
use kube::runtime::watcher;
use splice_crds::InjectionPolicy;
use splice_engine::SourceKind;
use splice_engine::values_from;
use splice_server::admin::{AdminServer, Readiness};
use splice_server::metrics::Registry;
use splice_server::server::{WebhookConfig, WebhookServer};
use splice_server::store::{NamespaceStore, PolicyStore};
use splice_server::tls::CertResolver;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::feeds::{feed_namespace_store, feed_policy_store, feed_values, track_readiness};
use self::leadership::{lead, supervise_leadership};
use crate::certs::ServingCert;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::values::ValuesCache;
use crate::{Settings, certs, leader};

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
    let (tx, rx) = signals();
    let mut config = WebhookConfig::new(&settings.namespace);
    // After SIGTERM (which the preStop sleep delays until the pod has left the ready endpoints),
    // 2 s more of service with `Connection: close` retires the API server's pooled connections to
    // this replica before the drain closes them: measured on the real node, a leader pod deleted
    // under 20 creates/s otherwise cost one create an EOF.
    config.shutdown_delay = Duration::from_secs(2);
    // A pooled connection the API server did not use in those 2 s may still be picked at the
    // moment the drain closes it: close only connections idle this long (the preStop sleep, the
    // delay and this stay within the chart's 30 s grace).
    config.drain_idle = Duration::from_secs(10);
    config.trust_domain = settings.trust_domain.clone();
    config.values_scope = Some(splice_server::server::validate::ValuesScope {
        allowed: settings.values_namespaces.clone(),
        default_namespace: settings.namespace.clone(),
    });
    config.pod_certificates = Some(rx.pod_certificates.clone());
    let server = WebhookServer::new(
        config,
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
    // The data of `valuesFrom`: one ConfigMap and one Secret watch per allowed namespace.
    let values = Arc::new(ValuesCache::new(
        settings.values_namespaces.clone(),
        settings.namespace.clone(),
    ));
    let values_feeds = spawn_values_feeds(&client, &settings, &values, tx.values_synced);
    let mut background: Vec<JoinHandle<()>> = values_feeds;
    background.extend([
        tokio::spawn(feed_policy_store(
            policy_api(&client),
            watcher_config(&settings.policy_selector),
            Arc::clone(&policies),
            (Arc::clone(&values), rx.values_synced),
            tx.policies_changed,
            tx.policies_synced,
        )),
        tokio::spawn(feed_namespace_store(
            Api::all(client.clone()),
            Arc::clone(&namespaces),
            tx.namespaces_synced,
        )),
        tokio::spawn(certs::load_certificates(
            Api::namespaced(client.clone(), &settings.namespace),
            Arc::clone(&resolver),
            Arc::clone(&metrics),
            tx.ca_bundle,
            tx.secret_changed,
            tx.serving,
        )),
        tokio::spawn(certs::report_serving(
            Api::namespaced(client.clone(), &settings.namespace),
            settings.lease.identity.clone(),
            rx.serving.clone(),
            settings.lease.retry_period,
            settings.lease.lease_duration,
        )),
        tokio::spawn(crate::identity::track_served(
            client.clone(),
            tx.pod_certificates,
        )),
        tokio::spawn(track_readiness(
            Arc::clone(&readiness),
            rx.policies_synced,
            rx.namespaces_synced,
        )),
    ]);

    // The election, and the leader's work whenever this replica leads.
    let (leading_tx, leading_rx) = Leadership::channel();
    let election = tokio::spawn(leader::run(
        Api::<Lease>::namespaced(client.clone(), &settings.namespace),
        settings.lease.clone(),
        leading_tx,
        stop_rx.clone(),
    ));
    let caches = Caches {
        values: Arc::clone(&values),
        webhook_policies: Arc::clone(&policies),
        ca_bundle: rx.ca_bundle,
        policies_changed: rx.policies_changed,
        secret_changed: rx.secret_changed,
        serving: rx.serving,
        pod_certificates: rx.pod_certificates.clone(),
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
    let _ = tokio::time::timeout(Duration::from_secs(5), election).await;
    for task in background {
        task.abort();
    }
    let _ = webhook_task.await;
    let _ = admin_task.await;
    Ok(())
}

/// The watch channels between every replica's feeds and what reads them, sending ends.
struct Senders {
    policies_changed: watch::Sender<u64>,
    policies_synced: watch::Sender<bool>,
    namespaces_synced: watch::Sender<bool>,
    values_synced: watch::Sender<bool>,
    ca_bundle: watch::Sender<Option<Arc<String>>>,
    secret_changed: watch::Sender<u64>,
    serving: watch::Sender<ServingCert>,
    pod_certificates: watch::Sender<Option<bool>>,
}

/// The receiving ends of [`Senders`].
struct Receivers {
    policies_changed: watch::Receiver<u64>,
    policies_synced: watch::Receiver<bool>,
    namespaces_synced: watch::Receiver<bool>,
    values_synced: watch::Receiver<bool>,
    ca_bundle: watch::Receiver<Option<Arc<String>>>,
    secret_changed: watch::Receiver<u64>,
    serving: watch::Receiver<ServingCert>,
    pod_certificates: watch::Receiver<Option<bool>>,
}

/// Every channel of [`run`]'s feeds, made in one place.
fn signals() -> (Senders, Receivers) {
    let (policies_changed, policies_changed_rx) = watch::channel(0u64);
    let (policies_synced, policies_synced_rx) = watch::channel(false);
    let (namespaces_synced, namespaces_synced_rx) = watch::channel(false);
    let (values_synced, values_synced_rx) = watch::channel(false);
    let (ca_bundle, ca_bundle_rx) = watch::channel(None);
    let (secret_changed, secret_changed_rx) = watch::channel(0u64);
    let (serving, serving_rx) = watch::channel(ServingCert::default());
    let (pod_certificates, pod_certificates_rx) = watch::channel(None);
    (
        Senders {
            policies_changed,
            policies_synced,
            namespaces_synced,
            values_synced,
            ca_bundle,
            secret_changed,
            serving,
            pod_certificates,
        },
        Receivers {
            policies_changed: policies_changed_rx,
            policies_synced: policies_synced_rx,
            namespaces_synced: namespaces_synced_rx,
            values_synced: values_synced_rx,
            ca_bundle: ca_bundle_rx,
            secret_changed: secret_changed_rx,
            serving: serving_rx,
            pod_certificates: pod_certificates_rx,
        },
    )
}

/// One ConfigMap and one Secret watch per allowed namespace into `values`, and a task that marks
/// it synced (and says so on `synced`) once every one has listed.
fn spawn_values_feeds(
    client: &Client,
    settings: &Settings,
    values: &Arc<ValuesCache>,
    synced: watch::Sender<bool>,
) -> Vec<JoinHandle<()>> {
    let mut feeds: Vec<JoinHandle<()>> = Vec::new();
    let mut listed = Vec::new();
    for namespace in &settings.values_namespaces {
        let (tx, rx) = watch::channel(false);
        feeds.push(tokio::spawn(feed_values(
            Api::<ConfigMap>::namespaced(client.clone(), namespace),
            SourceKind::ConfigMap,
            values_from::config_map_data,
            namespace.clone(),
            Arc::clone(values),
            tx,
        )));
        listed.push(rx);
        let (tx, rx) = watch::channel(false);
        feeds.push(tokio::spawn(feed_values(
            Api::<Secret>::namespaced(client.clone(), namespace),
            SourceKind::Secret,
            values_from::secret_data,
            namespace.clone(),
            Arc::clone(values),
            tx,
        )));
        listed.push(rx);
    }
    let values = Arc::clone(values);
    feeds.push(tokio::spawn(async move {
        for mut rx in listed {
            let _ = rx.wait_for(|s| *s).await;
        }
        values.set_synced();
        synced.send_replace(true);
    }));
    feeds
}

pub(super) fn policy_api(client: &Client) -> Api<InjectionPolicy> {
    Api::all(client.clone())
}

pub(super) fn watcher_config(selector: &Option<String>) -> watcher::Config {
    let config = watcher::Config::default();
    match selector {
        Some(s) if !s.is_empty() => config.labels(s),
        _ => config,
    }
}

pub(super) async fn wait_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// A stream that yields once per change of a watch channel.
pub(super) fn changes<T: Send + Sync + 'static>(
    rx: watch::Receiver<T>,
) -> impl Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    })
}

/// What every replica keeps current and the leader's work reads.
#[derive(Clone)]
pub(super) struct Caches {
    /// The data of `valuesFrom`.
    pub(super) values: Arc<ValuesCache>,
    /// The webhook's compiled policies.
    pub(super) webhook_policies: Arc<PolicyStore>,
    pub(super) ca_bundle: watch::Receiver<Option<Arc<String>>>,
    pub(super) policies_changed: watch::Receiver<u64>,
    pub(super) secret_changed: watch::Receiver<u64>,
    pub(super) serving: watch::Receiver<ServingCert>,
    /// Whether the API server serves PodCertificateRequests (`None`: not known yet).
    pub(super) pod_certificates: watch::Receiver<Option<bool>>,
}
