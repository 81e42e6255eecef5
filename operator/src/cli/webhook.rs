//! `splice webhook`: the admission server alone, with policies from files and no cluster. The same
//! server `splice run` embeds; used for benchmarks and for trying Splice out.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use splice_controller::metrics::Metrics;
use splice_server::admin::{AdminServer, Readiness};
use splice_server::metrics::Registry;
use splice_server::server::{WebhookConfig, WebhookServer};
use splice_server::store::{NamespaceStore, PolicyStore};
use splice_server::tls::CertResolver;
use tokio::net::TcpListener;

use super::offline::{self, DEFAULT_SPLICE_NAMESPACE};

#[derive(clap::Args)]
pub struct Args {
    /// InjectionPolicy files (several documents each, or directories of them). Each policy is
    /// served at `/inject/<metadata.name>`.
    #[arg(short = 'p', long = "policy", value_name = "FILE", required = true, num_args = 1..)]
    policies: Vec<PathBuf>,
    /// PEM certificate chain, leaf first (ECDSA recommended). Re-read on SIGHUP.
    #[arg(long, value_name = "FILE")]
    tls_cert: PathBuf,
    /// PEM private key of the leaf certificate. Re-read on SIGHUP.
    #[arg(long, value_name = "FILE")]
    tls_key: PathBuf,
    /// Address of the HTTPS admission listener.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// Address of the plain-HTTP admin listener (/healthz, /readyz, /metrics); none when absent.
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<SocketAddr>,
    /// Splice's own namespace, never injected (like kube-system and kube-node-lease).
    #[arg(long, value_name = "NAME", default_value = DEFAULT_SPLICE_NAMESPACE)]
    splice_namespace: String,
    /// ConfigMaps and Secrets (multi-document YAML) the policies' `spec.valuesFrom` read
    /// (repeatable); read once at start.
    #[arg(long = "values-from", value_name = "FILE")]
    values_from: Vec<PathBuf>,
    /// Also serve the benchmark baselines `POST /null` (allowed, without parsing the object) and
    /// `POST /null/read` (allowed after reading the review as /inject does, without the engine).
    /// Only in a binary built with the `bench-baselines` feature.
    #[cfg(feature = "bench-baselines")]
    #[arg(long)]
    null_handler: bool,
    /// Seconds to keep serving, not ready, after SIGTERM before closing the listener.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    shutdown_delay: u64,
    /// Once the listener is closed, seconds a connection must have been idle before it is closed
    /// (a client may be writing into an idle connection the moment it closes).
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    drain_idle: u64,
    /// Seconds in-flight requests get to finish once the listener is closed.
    #[arg(long, value_name = "SECONDS", default_value_t = 25)]
    drain_timeout: u64,
    /// Runtime worker threads; defaults to the CPUs this process may run on.
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
}

pub fn main(args: Args) -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<()> {
    // Everything that can be wrong with the input is checked before a socket is opened.
    let mut loaded = offline::load_policies(&args.policies)?;
    // Served with their data, never with the stand-ins apply checks with.
    offline::resolve_values_from(&mut loaded, &args.values_from, &args.splice_namespace)?;
    let resolver = Arc::new(CertResolver::new());
    load_certificate(&resolver, &args.tls_cert, &args.tls_key)?;

    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(workers) = args.workers {
        runtime.worker_threads(workers.max(1));
    }
    let runtime = runtime.build().context("cannot start the async runtime")?;
    runtime.block_on(serve(args, loaded, resolver))
}

fn load_certificate(resolver: &CertResolver, cert: &Path, key: &Path) -> Result<()> {
    let chain = std::fs::read(cert).with_context(|| format!("{}: cannot read", cert.display()))?;
    let key_pem = std::fs::read(key).with_context(|| format!("{}: cannot read", key.display()))?;
    resolver.swap_pem(&chain, &key_pem).with_context(|| {
        format!(
            "{} / {}: not a usable certificate and key",
            cert.display(),
            key.display()
        )
    })
}

async fn serve(
    args: Args,
    loaded: Vec<offline::LoadedPolicy>,
    resolver: Arc<CertResolver>,
) -> Result<()> {
    let policies = Arc::new(PolicyStore::new());
    let names: Vec<String> = loaded.iter().map(|p| p.name.clone()).collect();
    policies.replace_all(loaded.into_iter().map(|p| (p.name, Arc::new(p.compiled))));

    // The admission metrics and the served certificate's expiry: all of the controller's metrics
    // that apply without a cluster.
    let mut registry = Registry::default();
    let admission = Arc::new(splice_server::metrics::Metrics::register(&mut registry));
    let metrics = Arc::new(Metrics::register(&mut registry));
    let registry = Arc::new(registry);
    record_expiry(&metrics, &resolver);
    let readiness = Arc::new(Readiness::new(Arc::clone(&resolver)));
    // No cluster, so no caches to wait for.
    readiness.set_caches_synced(true);

    let mut config = WebhookConfig::new(&args.splice_namespace);
    #[cfg(feature = "bench-baselines")]
    {
        config.null_handler = args.null_handler;
    }
    // Static policies and no namespace watch: nothing would arrive by waiting.
    config.cache_wait = None;
    config.shutdown_delay = Duration::from_secs(args.shutdown_delay);
    config.drain_idle = Duration::from_secs(args.drain_idle);
    config.drain_timeout = Duration::from_secs(args.drain_timeout);

    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let admin_listener = match args.admin_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))?,
        ),
        None => None,
    };

    let server = WebhookServer::new(
        config,
        policies,
        Arc::new(NamespaceStore::new()),
        admission,
        Arc::clone(&resolver),
    )
    .context("cannot configure TLS")?
    .readiness(Arc::clone(&readiness));

    tracing::info!(
        listen = %listener.local_addr().unwrap_or(args.listen),
        admin = ?admin_listener.as_ref().and_then(|l| l.local_addr().ok()),
        policies = ?names,
        "splice webhook serving"
    );

    let reloader = tokio::spawn(reload_on_sighup(
        Arc::clone(&resolver),
        Arc::clone(&metrics),
        args.tls_cert.clone(),
        args.tls_key.clone(),
    ));
    let (webhook_done, admin_stop) = tokio::sync::oneshot::channel::<()>();
    let admin = admin_listener.map(|listener| {
        let admin = AdminServer::new(Arc::clone(&registry), Arc::clone(&readiness));
        tokio::spawn(admin.serve(listener, async {
            let _ = admin_stop.await;
        }))
    });

    let summary = server.serve(listener, shutdown_signal()).await;
    // The admin port stays up through the drain so probes see "not ready", then goes too.
    let _ = webhook_done.send(());
    if let Some(admin) = admin {
        let _ = admin.await;
    }
    reloader.abort();
    tracing::info!(
        connections = summary.connections,
        aborted = summary.aborted,
        "splice webhook stopped"
    );
    Ok(())
}

fn record_expiry(metrics: &Metrics, resolver: &CertResolver) {
    if let Some(not_after) = resolver.not_after() {
        metrics.set_certificate_expiry("serving", not_after);
    }
}

/// SIGHUP re-reads the certificate files and swaps them in without dropping a connection; a bad
/// pair is logged and the current certificate stays.
async fn reload_on_sighup(
    resolver: Arc<CertResolver>,
    metrics: Arc<Metrics>,
    cert: PathBuf,
    key: PathBuf,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP; certificate reload disabled");
        return;
    };
    while hangups.recv().await.is_some() {
        match load_certificate(&resolver, &cert, &key) {
            Ok(()) => {
                record_expiry(&metrics, &resolver);
                tracing::info!("serving certificate reloaded");
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "certificate reload failed; keeping the current one")
            }
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the server");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutdown signal received");
}
