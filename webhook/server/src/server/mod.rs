//! The HTTPS admission server: TLS from the swappable [`CertResolver`], HTTP/1.1 keep-alive,
//! `POST /inject/<policy>`, `POST /validate` (InjectionPolicies), and a graceful drain on shutdown.
//!
//! On hyper directly, without a framework: two routes need no router, and the connection loop is
//! ours anyway for the TLS acceptor, the connection cap, the header deadline and the drain.

mod conn;
mod handler;
pub mod validate;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

#[cfg(feature = "bench-baselines")]
pub use handler::NULL_POLICY_LABEL;
pub use handler::{
    AdmissionHook, Admitted, Handler, UNKNOWN_POLICY_LABEL, VALIDATE_PATH, VALIDATE_POLICY_LABEL,
};

use crate::admin::Readiness;
use crate::metrics::Metrics;
use crate::store::{NamespaceStore, PolicyStore};
use crate::tls::{self, CertResolver, TlsError};
use splice_engine::Exclusions;

/// The API server sends at most 3 MiB of request body to a webhook (its own request limit).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Tunables of the webhook server. [`WebhookConfig::new`] gives production defaults.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// Namespaces never injected (kube-system, kube-node-lease, Splice's own).
    pub exclusions: Exclusions,
    /// The SPIFFE trust domain of `{{ identity.spiffeID }}` (`splice run --trust-domain`).
    pub trust_domain: String,
    /// Larger bodies get 413, enforced while reading.
    pub max_body_bytes: usize,
    /// How long a keep-alive connection may sit between requests. Longer than the API server's
    /// own idle timeout (90 s), so that the client, not the server, closes idle connections and
    /// never races a request against a server-side close.
    pub idle_timeout: Duration,
    /// Once a request's first byte arrives, its head must be complete within this.
    pub header_read_timeout: Duration,
    /// The request body must be complete within this, counted from the head.
    pub body_read_timeout: Duration,
    pub tls_handshake_timeout: Duration,
    /// After shutdown is requested, keep serving this long with readiness false, so endpoints
    /// stop routing here before the listener closes. Every response in this time says
    /// `Connection: close`: a client that pooled connections to this replica (the API server
    /// keeps them per Service name, whatever the endpoints say) retires each one after its next
    /// request, instead of writing a request into one the drain then closes.
    pub shutdown_delay: Duration,
    /// Once the listener is closed, how long a connection must have waited for its next request
    /// before the drain closes it. Closing an idle connection races the client writing a request
    /// into it, which then fails (the API server does not retry a POST); a connection left unused
    /// this long is one the client's pool rarely picks, and one it does pick meanwhile is answered
    /// with `Connection: close` and retired by the client itself. Zero closes idle connections at
    /// once.
    pub drain_idle: Duration,
    /// How long in-flight requests may take to finish once the listener is closed; every
    /// connection still open then is closed.
    pub drain_timeout: Duration,
    /// New connections beyond this are closed at once.
    pub max_connections: usize,
    /// Serve `POST /null` (allowed, object not parsed) and `POST /null/read` (allowed after
    /// reading the review as `/inject` does, without the engine): baselines for benchmarks only,
    /// built with the `bench-baselines` feature.
    #[cfg(feature = "bench-baselines")]
    pub null_handler: bool,
    /// How long a request may wait for the watch to deliver a policy (or a namespace whose
    /// labels or annotations a template reads) that the API server already knows: the leader can
    /// write a webhook configuration before this replica's watch delivers its policy. `None` when
    /// no watch feeds the stores (`splice webhook` with static policies).
    pub cache_wait: Option<Duration>,
    /// Where `spec.valuesFrom` may read (`splice run --values-namespaces`) and where an entry
    /// without a namespace reads, so `/validate` refuses a source elsewhere at apply; `None`
    /// judges no namespace (`splice webhook`).
    pub values_scope: Option<validate::ValuesScope>,
    /// Whether the API server serves PodCertificateRequests (`None` inside: not known yet), so
    /// `/validate` refuses `spec.identity` without them; `None`: not judged (`splice webhook`).
    pub pod_certificates: Option<tokio::sync::watch::Receiver<Option<bool>>>,
}

impl WebhookConfig {
    /// Production defaults; `own_namespace` is added to the mandatory exclusions.
    pub fn new(own_namespace: &str) -> Self {
        WebhookConfig {
            exclusions: Exclusions::default_for(own_namespace),
            trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN.into(),
            max_body_bytes: MAX_BODY_BYTES,
            idle_timeout: Duration::from_secs(120),
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            tls_handshake_timeout: Duration::from_secs(10),
            shutdown_delay: Duration::ZERO,
            drain_idle: Duration::ZERO,
            drain_timeout: Duration::from_secs(25),
            max_connections: 4096,
            #[cfg(feature = "bench-baselines")]
            null_handler: false,
            // Under the smallest timeoutSeconds (1 s), with room for the engine and the network.
            cache_wait: Some(Duration::from_millis(750)),
            values_scope: None,
            pod_certificates: None,
        }
    }
}

/// What [`WebhookServer::serve`] did, for logs and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServeSummary {
    /// TCP connections accepted.
    pub connections: u64,
    /// Connections still busy when the drain timeout ran out, then closed.
    pub aborted: usize,
}

/// The webhook server. Build it, then [`serve`](WebhookServer::serve) a listener.
pub struct WebhookServer {
    config: WebhookConfig,
    handler: Handler,
    tls: Arc<rustls::ServerConfig>,
    readiness: Option<Arc<Readiness>>,
}

impl WebhookServer {
    pub fn new(
        config: WebhookConfig,
        policies: Arc<PolicyStore>,
        namespaces: Arc<NamespaceStore>,
        metrics: Arc<Metrics>,
        cert_resolver: Arc<CertResolver>,
    ) -> Result<Self, TlsError> {
        Self::with_hook(config, policies, namespaces, metrics, cert_resolver, None)
    }

    /// Like [`WebhookServer::new`], with a hook called after every non-dry-run injection.
    pub fn with_hook(
        config: WebhookConfig,
        policies: Arc<PolicyStore>,
        namespaces: Arc<NamespaceStore>,
        metrics: Arc<Metrics>,
        cert_resolver: Arc<CertResolver>,
        hook: Option<Arc<dyn AdmissionHook>>,
    ) -> Result<Self, TlsError> {
        let tls = tls::server_config(cert_resolver)?;
        let handler = Handler::new(config.clone(), policies, namespaces, metrics, hook);
        Ok(WebhookServer {
            config,
            handler,
            tls,
            readiness: None,
        })
    }

    /// Readiness to turn false as soon as shutdown is requested.
    pub fn readiness(mut self, readiness: Arc<Readiness>) -> Self {
        self.readiness = Some(readiness);
        self
    }

    /// The request handler, for driving requests without TLS (tests, fuzzing).
    pub fn handler(&self) -> Handler {
        self.handler.clone()
    }

    /// Serves `listener` until `shutdown` completes, then: readiness false, `shutdown_delay` of
    /// continued service, listener closed, every connection asked to finish its current request
    /// and close (an idle one once it has been idle `drain_idle`), and after `drain_timeout` the
    /// stragglers are dropped.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> ServeSummary {
        let acceptor = TlsAcceptor::from(Arc::clone(&self.tls));
        let (drain_tx, drain_rx) = watch::channel(false);
        let mut connections: JoinSet<()> = JoinSet::new();
        let mut summary = ServeSummary::default();

        let readiness = self.readiness.clone();
        let delay = self.config.shutdown_delay;
        let closing = Arc::new(AtomicBool::new(false));
        let closing_flag = Arc::clone(&closing);
        let stop = async move {
            shutdown.await;
            closing_flag.store(true, Ordering::Relaxed);
            if let Some(readiness) = &readiness {
                readiness.set_draining();
            }
            tracing::info!(
                delay_ms = delay.as_millis() as u64,
                "shutdown requested; draining"
            );
            tokio::time::sleep(delay).await;
        };
        tokio::pin!(stop);

        loop {
            tokio::select! {
                biased;
                () = &mut stop => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok((stream, _peer)) => {
                        summary.connections += 1;
                        if connections.len() >= self.config.max_connections {
                            tracing::warn!(limit = self.config.max_connections, "connection limit reached; closing a new connection");
                            drop(stream);
                            continue;
                        }
                        connections.spawn(connection(
                            stream,
                            acceptor.clone(),
                            self.handler.clone(),
                            self.config.clone(),
                            drain_rx.clone(),
                            Arc::clone(&closing),
                        ));
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }

        drop(listener);
        let _ = drain_tx.send(true);
        let drained = tokio::time::timeout(self.config.drain_timeout, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            summary.aborted = connections.len();
            tracing::warn!(
                connections = summary.aborted,
                "drain timeout; closing busy connections"
            );
            connections.shutdown().await;
        }
        tracing::info!(connections = summary.connections, "webhook server stopped");
        summary
    }
}

async fn connection(
    stream: TcpStream,
    acceptor: TlsAcceptor,
    handler: Handler,
    config: WebhookConfig,
    mut drain: watch::Receiver<bool>,
    closing: Arc<AtomicBool>,
) {
    // Responses are single small writes; Nagle would only add latency.
    let _ = stream.set_nodelay(true);
    let tls =
        match tokio::time::timeout(config.tls_handshake_timeout, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!("TLS handshake timed out");
                return;
            }
        };
    let phase = Arc::new(conn::RequestPhase::default());
    let io = TokioIo::new(conn::HeaderDeadline::new(
        tls,
        Arc::clone(&phase),
        config.header_read_timeout,
    ));
    let service_phase = Arc::clone(&phase);
    let service = service_fn(move |request| {
        let handler = handler.clone();
        let phase = Arc::clone(&service_phase);
        let closing = Arc::clone(&closing);
        async move {
            phase.busy();
            let mut response = handler.handle(request).await;
            phase.idle();
            if closing.load(Ordering::Relaxed) {
                response.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            Ok::<_, Infallible>(response)
        }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .keep_alive(true)
        // hyper's header timer also runs while a keep-alive connection waits for its next
        // request, so it is the idle timeout here; conn::HeaderDeadline bounds the head itself.
        .header_read_timeout(config.idle_timeout);
    let served = builder.serve_connection(io, service);
    tokio::pin!(served);
    let linger = config.drain_idle;
    let drained = async move {
        // An error means the server is gone: drain as well.
        let _ = drain.wait_for(|draining| *draining).await;
        // Every answer now says `Connection: close`, so a request ends the connection anyway.
        loop {
            let wait = match phase.idle_for() {
                Some(idle) if idle >= linger => break,
                Some(idle) => linger - idle,
                None => linger.max(Duration::from_millis(10)),
            };
            tokio::time::sleep(wait).await;
        }
    };
    let result = tokio::select! {
        result = served.as_mut() => result,
        () = drained => {
            served.as_mut().graceful_shutdown();
            served.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}
