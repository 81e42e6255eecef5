//! `splice run`: the controller (leader only), the webhook server and the admin server.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::ValueEnum;
use clap::builder::TypedValueParser as _;

use super::parse_duration;
use splice_controller::{
    self, Settings, guard::GuardConfig, leader::LeaseConfig, policy::render::ClientTarget,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Splice's own namespace: holds the Lease and the CA Secret, and is never injected.
    #[arg(long, env = "SPLICE_NAMESPACE", default_value = "splice-system")]
    namespace: String,

    /// The Service in front of Splice's pods, which the API server calls.
    #[arg(long, env = "SPLICE_SERVICE_NAME", default_value = "splice")]
    service_name: String,

    /// Port of that Service.
    #[arg(long, env = "SPLICE_SERVICE_PORT", default_value_t = 443)]
    service_port: u16,

    /// Call the webhook at this HTTPS URL instead of the Service (a webhook running outside the
    /// cluster, e.g. `https://127.0.0.1:8443`); its host is added to the serving certificate.
    #[arg(long, env = "SPLICE_WEBHOOK_URL")]
    webhook_url: Option<String>,

    /// Only serve and manage policies matching this label selector (e.g. `team=a`); by default
    /// every policy. Lets independent Splice instances share a cluster.
    #[arg(long, env = "SPLICE_POLICY_SELECTOR")]
    policy_selector: Option<String>,

    /// Judge InjectionPolicy creates and updates at apply time through a ValidatingWebhookConfiguration
    /// (`splice-validate-<namespace>`) that the leader keeps; `false` removes it, and policies are
    /// then only checked by the reconcile.
    #[arg(long, env = "SPLICE_VALIDATING_WEBHOOK", default_value_t = true, action = clap::ArgAction::Set)]
    validating_webhook: bool,

    /// Splice's own Deployment (in --namespace): `Fail` is only put in force while it has at
    /// least 2 available replicas and a PodDisruptionBudget keeps one of them.
    #[arg(long, env = "SPLICE_DEPLOYMENT_NAME", default_value = "splice")]
    deployment_name: String,

    /// How long the Deployment and its PodDisruptionBudget must stay sufficient before `Fail`
    /// is put back in force (e.g. `60s`, `2m`; a bare number is seconds). Losing them switches
    /// to Ignore at once.
    #[arg(long, env = "SPLICE_FAIL_CLOSED_HOLD", default_value = "60s", value_parser = parse_duration)]
    fail_closed_hold: Duration,

    /// How often the leader verifies each Ready policy end to end with a server-side dry-run
    /// create of a probe pod (jittered by ±10 %; a policy or namespace change also triggers it;
    /// at most 5 requests per second in all). `0` turns the admission probe off.
    #[arg(long, env = "SPLICE_PROBE_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    probe_interval: Duration,

    /// Workloads the rollout (`spec.rollout` of each policy) restarts at once, across all
    /// policies.
    #[arg(long, env = "SPLICE_ROLLOUT_MAX_CONCURRENT", default_value_t = splice_controller::rollout::DEFAULT_MAX_CONCURRENT, value_parser = clap::value_parser!(u16).range(1..).map(usize::from))]
    rollout_max_concurrent: usize,
    /// Namespaces whose ConfigMaps and Secrets `spec.valuesFrom` may read (comma-separated;
    /// default: Splice's own namespace). Every replica watches them; RBAC must grant get, list
    /// and watch on configmaps and secrets there (the chart's `valuesFrom.namespaces`).
    #[arg(long, env = "SPLICE_VALUES_NAMESPACES", value_delimiter = ',')]
    values_namespaces: Vec<String>,

    /// The SPIFFE trust domain of the pod certificates Splice signs (`spec.identity`): their
    /// URI SAN is `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`.
    #[arg(long, env = "SPLICE_TRUST_DOMAIN", default_value = "cluster.local", value_parser = parse_trust_domain)]
    trust_domain: String,

    /// After a CA rotation, how long the new root is in the published ClusterTrustBundle before
    /// pod certificates chain to it: longer than the kubelets take to project it into pods (they
    /// do at each pod sync, `syncFrequency` plus up to half of it).
    #[arg(long, env = "SPLICE_IDENTITY_TRUST_PROPAGATION", default_value = "2m", value_parser = parse_duration)]
    identity_trust_propagation: Duration,

    /// Address of the webhook (HTTPS) listener.
    #[arg(long, env = "SPLICE_LISTEN", default_value = "0.0.0.0:8443")]
    listen: SocketAddr,

    /// Address of the admin listener (/healthz, /readyz, /metrics).
    #[arg(long, env = "SPLICE_ADMIN_LISTEN", default_value = "0.0.0.0:8080")]
    admin_listen: SocketAddr,

    /// Log format.
    #[arg(long, env = "SPLICE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    /// This replica's identity in the Lease; the pod name in a cluster. Defaults to the host name
    /// and process id.
    #[arg(long, env = "SPLICE_POD_NAME")]
    identity: Option<String>,

    /// Name of the Lease used for leader election.
    #[arg(long, env = "SPLICE_LEASE_NAME", default_value = "splice-leader")]
    lease_name: String,

    /// How long a leader that stopped renewing keeps the Lease, in seconds: the upper bound on
    /// how long the cluster is without a leader after the leader dies.
    #[arg(long, env = "SPLICE_LEASE_DURATION", default_value_t = 15)]
    lease_duration: u64,

    /// How long the leader keeps acting without a successful renewal, in seconds (less than the
    /// lease duration).
    #[arg(long, env = "SPLICE_LEASE_RENEW_DEADLINE", default_value_t = 10)]
    lease_renew_deadline: u64,

    /// How often the leader renews and the other replicas try to acquire, in seconds.
    #[arg(long, env = "SPLICE_LEASE_RETRY_PERIOD", default_value_t = 2)]
    lease_retry_period: u64,

    #[command(flatten)]
    certs: crate::cli::rotate::CertArgs,
}

pub fn main(args: Args, cluster: &super::ClusterArgs) -> ExitCode {
    init_tracing(args.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args, cluster)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "splice run failed");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args, cluster: &super::ClusterArgs) -> anyhow::Result<()> {
    let settings = settings(&args)?;
    let client = cluster.client().await?;
    splice_controller::run(client, settings, shutdown_signal()).await
}

fn settings(args: &Args) -> anyhow::Result<Settings> {
    let service = ClientTarget::Service {
        namespace: args.namespace.clone(),
        name: args.service_name.clone(),
        port: i32::from(args.service_port),
    };
    // The Service names are always in the certificate, so moving from an outside URL to the
    // Service (or back) never needs a new one.
    let mut serving_names = service.subject_alt_names();
    let target = match &args.webhook_url {
        Some(url) => {
            let outside = ClientTarget::from_url(url)?;
            serving_names.extend(outside.subject_alt_names());
            outside
        }
        None => service,
    };
    let lease = LeaseConfig {
        name: args.lease_name.clone(),
        identity: args.identity.clone().unwrap_or_else(default_identity),
        lease_duration: Duration::from_secs(args.lease_duration),
        renew_deadline: Duration::from_secs(args.lease_renew_deadline),
        retry_period: Duration::from_secs(args.lease_retry_period),
    };
    lease.validate()?;
    let certs = args.certs.timing()?;
    Ok(Settings {
        certs,
        namespace: args.namespace.clone(),
        target,
        serving_names,
        policy_selector: args.policy_selector.clone().filter(|s| !s.is_empty()),
        validating_webhook: args.validating_webhook,
        listen: args.listen,
        admin_listen: args.admin_listen,
        lease,
        guard: GuardConfig {
            namespace: args.namespace.clone(),
            deployment: args.deployment_name.clone(),
            hold: args.fail_closed_hold,
        },
        probe_interval: Some(args.probe_interval).filter(|i| !i.is_zero()),
        rollout_max_concurrent: args.rollout_max_concurrent,
        values_namespaces: if args.values_namespaces.is_empty() {
            vec![args.namespace.clone()]
        } else {
            args.values_namespaces.clone()
        },
        trust_domain: args.trust_domain.clone(),
        identity_trust_propagation: args.identity_trust_propagation,
    })
}

/// A SPIFFE trust domain: lowercase letters, digits, `.`, `-` and `_` (the SPIFFE ID spec).
pub(crate) fn parse_trust_domain(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 255 {
        return Err("must be 1 to 255 characters".into());
    }
    match s
        .chars()
        .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '.' | '-' | '_'))
    {
        Some(c) => Err(format!(
            "{c:?} is not allowed: a trust domain holds only lowercase letters, digits, '.', '-' and '_'"
        )),
        None => Ok(s.to_owned()),
    }
}

/// Unique per process, so two replicas on one host never share an identity.
fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "splice".to_owned());
    format!("{host}_{}", std::process::id())
}

fn init_tracing(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("SPLICE_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,kube_runtime=warn,kube_client=warn"));
    // Colours only for a person at a terminal, never in files or log collectors.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Resolves on SIGTERM (what the kubelet sends) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(argv: &[&str]) -> Result<Settings, String> {
        let cli = Cli::try_parse_from(std::iter::once("run").chain(argv.iter().copied()))
            .map_err(|e| e.to_string())?;
        settings(&cli.args).map_err(|e| e.to_string())
    }

    #[test]
    fn by_default_the_webhook_is_reached_through_the_service_in_splice_system() {
        let s = parse(&["--identity", "a"]).unwrap();
        assert_eq!(s.namespace, "splice-system");
        assert_eq!(
            s.target,
            ClientTarget::Service {
                namespace: "splice-system".into(),
                name: "splice".into(),
                port: 443
            }
        );
        assert_eq!(s.lease.lease_duration, Duration::from_secs(15));
        assert_eq!(s.lease.identity, "a");
    }

    #[test]
    fn a_webhook_url_replaces_the_service() {
        let s = parse(&["--webhook-url", "https://127.0.0.1:9443"]).unwrap();
        assert!(matches!(s.target, ClientTarget::Url { ref host, .. } if host == "127.0.0.1"));
    }

    #[test]
    fn the_certificate_names_the_service_and_the_webhook_url_host() {
        let s = parse(&[
            "--namespace",
            "ops",
            "--webhook-url",
            "https://10.1.2.3:9443",
        ])
        .unwrap();
        assert!(s.serving_names.contains(&"splice.ops.svc".to_owned()));
        assert!(s.serving_names.contains(&"10.1.2.3".to_owned()));
        let s = parse(&["--service-name", "hook"]).unwrap();
        assert!(
            s.serving_names
                .contains(&"hook.splice-system.svc.cluster.local".to_owned())
        );
    }

    #[test]
    fn a_plain_http_webhook_url_is_refused_with_the_reason() {
        let err = parse(&["--webhook-url", "http://127.0.0.1:9443"]).unwrap_err();
        assert!(err.contains("https://"), "{err}");
    }

    #[test]
    fn inconsistent_lease_timings_are_refused() {
        let err = parse(&["--lease-duration", "5", "--lease-renew-deadline", "5"]).unwrap_err();
        assert!(err.contains("renew deadline"), "{err}");
    }

    #[test]
    fn the_guard_reads_the_splice_deployment_and_holds_a_minute_unless_told_otherwise() {
        let s = parse(&["--namespace", "ops"]).unwrap();
        assert_eq!(s.guard.deployment, "splice");
        assert_eq!(s.guard.namespace, "ops");
        assert_eq!(s.guard.hold, Duration::from_secs(60));
        let s = parse(&["--deployment-name", "hook", "--fail-closed-hold", "5s"]).unwrap();
        assert_eq!(s.guard.deployment, "hook");
        assert_eq!(s.guard.hold, Duration::from_secs(5));
        assert_eq!(
            parse(&["--fail-closed-hold", "2m"]).unwrap().guard.hold,
            Duration::from_secs(120)
        );
        assert_eq!(
            parse(&["--fail-closed-hold", "7"]).unwrap().guard.hold,
            Duration::from_secs(7)
        );
        let err = parse(&["--fail-closed-hold", "5 days"]).unwrap_err();
        assert!(err.contains("unknown unit"), "{err}");
        assert!(parse(&["--fail-closed-hold", "s"]).is_err());
    }

    #[test]
    fn the_rollout_restarts_at_most_ten_workloads_at_once_unless_told_otherwise() {
        assert_eq!(parse(&[]).unwrap().rollout_max_concurrent, 10);
        assert_eq!(
            parse(&["--rollout-max-concurrent", "3"])
                .unwrap()
                .rollout_max_concurrent,
            3
        );
        assert!(parse(&["--rollout-max-concurrent", "0"]).is_err());
    }

    #[test]
    fn the_probe_runs_every_minute_unless_told_otherwise_and_zero_turns_it_off() {
        assert_eq!(
            parse(&[]).unwrap().probe_interval,
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            parse(&["--probe-interval", "2s"]).unwrap().probe_interval,
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            parse(&["--probe-interval", "0"]).unwrap().probe_interval,
            None
        );
    }

    #[test]
    fn the_trust_domain_is_cluster_local_unless_told_otherwise_and_must_be_a_spiffe_trust_domain() {
        assert_eq!(parse(&[]).unwrap().trust_domain, "cluster.local");
        assert_eq!(
            parse(&["--trust-domain", "prod.example"])
                .unwrap()
                .trust_domain,
            "prod.example"
        );
        for bad in ["", "Prod.example", "a/b", "spiffe://x"] {
            assert!(parse(&["--trust-domain", bad]).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn an_unknown_log_format_is_refused() {
        assert!(parse(&["--log-format", "xml"]).is_err());
    }

    #[test]
    fn two_default_identities_in_one_process_are_stable_and_name_the_process() {
        assert_eq!(default_identity(), default_identity());
        assert!(default_identity().ends_with(&format!("_{}", std::process::id())));
    }
}
