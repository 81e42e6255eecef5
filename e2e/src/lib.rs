//! Helpers shared by the end-to-end tests: a client for the local control plane, a namespace per
//! test, and child processes that are always stopped.
//!
//! The tests run against the real control plane that `e2e/run-e2e.sh` (or `make up`) starts; they
//! never touch the addresses kwok invents for pods and nodes: every connection is to 127.0.0.1.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// Where `make up` writes the admin kubeconfig.
pub fn kubeconfig_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SPLICE_KUBECONFIG") {
        return p.into();
    }
    let run_dir = std::env::var_os("SPLICE_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| home().join(".cache"));
            cache.join("splice/run")
        });
    run_dir.join("kubeconfig")
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
}

/// The directory holding the control-plane binaries (kubectl, agnhost …).
pub fn controlplane_bin_dir() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("SPLICE_CONTROLPLANE_BIN") {
        return Ok(p.into());
    }
    let script = repo_root().join("e2e/controlplane/build.sh");
    let out = Command::new(&script)
        .arg("--print-bin-dir")
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// Runs `bin args` with the admin kubeconfig from the repository root, feeding `stdin`; returns
/// stdout, or fails naming the command and its output.
pub fn run_tool(bin: &std::path::Path, args: &[&str], stdin: Option<&str>) -> Result<String> {
    use std::io::Write as _;
    use std::process::Stdio;
    let mut child = Command::new(bin)
        .args(args)
        .env("KUBECONFIG", kubeconfig_path())
        .current_dir(repo_root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", bin.display()))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{} {} failed: {}{}",
            bin.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// helm: `SPLICE_HELM` if set, else built (once, cached) by e2e/helm/build.sh.
pub fn helm_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("SPLICE_HELM") {
        return Ok(p.into());
    }
    let path = run_tool(&repo_root().join("e2e/helm/build.sh"), &[], None)?;
    Ok(path.trim().into())
}

/// The repository root (the parent of this crate).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The admin user's client configuration for the local control plane.
async fn admin_config() -> Result<Config> {
    let path = kubeconfig_path();
    let kubeconfig = Kubeconfig::read_from(&path).with_context(|| {
        format!(
            "reading {} (is the control plane up? run `make up`)",
            path.display()
        )
    })?;
    Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
}

/// A client for the local control plane, as the admin user.
pub async fn client() -> Result<Client> {
    Ok(Client::try_from(admin_config().await?)?)
}

/// Whether kube-controller-manager's garbage collector follows the object with `uid` through
/// an informer of its kind. Until it does, the collector knows the object only as the owner named
/// by a dependent's ownerReference, and it rediscovers kinds only every 30 s: a custom resource
/// deleted together with a CRD created less than that ago can leave its dependents behind for
/// good, because the collector can no longer map the kind to look the owner up.
pub async fn garbage_collector_observes(uid: &str) -> Result<bool> {
    let url_file = kubeconfig_path().with_file_name("controller-manager.url");
    let url = std::fs::read_to_string(&url_file)
        .with_context(|| format!("reading {}", url_file.display()))?;
    let mut config = admin_config().await?;
    config.cluster_url = url.trim().parse().context("the controller-manager URL")?;
    let request = http::Request::get(format!(
        "/debug/controllers/garbage-collector-controller/graph?uid={uid}"
    ))
    .body(Vec::new())?;
    let graph = Client::try_from(config)?.request_text(request).await?;
    // The graph is DOT: one `"<uid>" [ key="value" ... ];` block per node.
    Ok(graph
        .split("];")
        .find(|node| node.contains(&format!("uid=\"{uid}\"")))
        .is_some_and(|node| node.contains("virtual=\"false\"")))
}

/// A namespace owned by one test, deleted when dropped.
pub struct TestNamespace {
    pub client: Client,
    pub name: String,
}

impl TestNamespace {
    /// Creates `<prefix>-<random suffix>` with `labels`.
    pub async fn create(prefix: &str, labels: &[(&str, &str)]) -> Result<Self> {
        let client = client().await?;
        let name = format!("{prefix}-{}", unique_suffix());
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        // Pods cannot be created until the controller-manager has made the default ServiceAccount.
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), &name);
        wait_until(
            Duration::from_secs(30),
            "the default ServiceAccount",
            || async { Ok(sas.get_opt("default").await?.is_some()) },
        )
        .await?;
        Ok(Self { client, name })
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let name = self.name.clone();
        in_fresh_runtime(move |client| async move {
            let _ = Api::<Namespace>::all(client)
                .delete(&name, &DeleteParams::default())
                .await;
        });
    }
}

/// Runs cleanup from `Drop`. It needs a runtime and a client of its own: the test's client drives
/// its connection from a task on the test's runtime, which is blocked while `drop` runs.
pub fn in_fresh_runtime<F, Fut>(work: F)
where
    F: FnOnce(Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let _ = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            if let Ok(client) = client().await {
                work(client).await;
            }
        });
    })
    .join();
}

/// A suffix unique across tests and runs (time-based, with the process id).
pub fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:x}{:x}{n}", std::process::id() & 0xfff, nanos & 0xffff)
}

/// Polls `check` every 200 ms until it returns true or `timeout` passes.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() >= deadline {
            match last_err {
                Some(e) => {
                    bail!("timed out after {timeout:?} waiting for {what}; last error: {e:#}")
                }
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Server-side dry run: the API server admits the object, webhooks included, and stores nothing.
pub fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

/// Waits until a dry-run create of `probe` comes back as a pod for which `admitted` holds. The
/// API server loads webhook configurations asynchronously, so one that exists is not yet one
/// that is called; a dry run shows when it is, without creating anything.
pub async fn wait_dry_run(
    pods: &Api<Pod>,
    probe: &Pod,
    timeout: Duration,
    what: &str,
    admitted: impl Fn(&Pod) -> bool,
) -> Result<()> {
    wait_until(timeout, what, || async {
        Ok(admitted(&pods.create(&dry_run(), probe).await?))
    })
    .await
}

/// A free TCP port on 127.0.0.1, taken from 20000–32767: below Linux's ephemeral range
/// (32768–60999), so no outgoing connection (the tests make thousands) can take it between this
/// check and the child's own bind. Bound and released; each call in a process starts at a new
/// place, so two tests of one binary do not race for the same port.
pub fn free_port() -> Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_768;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(7_919)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
    for _ in 0..256 {
        let step = NEXT.fetch_add(97, Ordering::Relaxed);
        let port = (LOW + seed.wrapping_add(step) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port on 127.0.0.1 in {LOW}..{}", LOW + SPAN)
}

/// A child process killed (SIGKILL) and reaped when dropped, so a failing test leaves nothing.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    pub fn spawn(cmd: &mut Command) -> Result<Self> {
        Ok(Self(
            cmd.spawn().with_context(|| format!("spawning {cmd:?}"))?,
        ))
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How waiting for a child's port ended, when it did not open.
#[derive(Debug)]
pub enum PortWait {
    /// The child exited first, with this status.
    Exited(std::process::ExitStatus),
    /// Neither happened within the timeout.
    TimedOut,
}

impl std::fmt::Display for PortWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortWait::Exited(status) => write!(f, "the process exited ({status})"),
            PortWait::TimedOut => f.write_str("timed out"),
        }
    }
}

/// Waits until `child` accepts TCP connections on 127.0.0.1:`port`, and stops waiting as soon as
/// it exits (a child that could not bind must not cost the whole timeout, nor be reported as
/// slow).
pub async fn wait_for_child_port(
    child: &mut ChildGuard,
    port: u16,
    timeout: Duration,
) -> std::result::Result<(), PortWait> {
    let deadline = Instant::now() + timeout;
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        if let Ok(Some(status)) = child.0.try_wait() {
            return Err(PortWait::Exited(status));
        }
        if Instant::now() >= deadline {
            return Err(PortWait::TimedOut);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// agnhost's `webhook` server (the Go webhook upstream Kubernetes tests with) on a free loopback
/// port, serving a throw-away certificate for 127.0.0.1; stopped when dropped.
pub struct AgnhostWebhook {
    pub port: u16,
    /// The CA that signed its certificate, PEM: a webhook configuration's `caBundle`.
    pub ca_pem: String,
    /// Its certificate and key files, removed when it stops.
    dir: PathBuf,
    _child: ChildGuard,
}

impl Drop for AgnhostWebhook {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl AgnhostWebhook {
    /// Starts it with `extra_args` after the TLS and port flags; `tag` names its certificate
    /// directory and CA.
    pub async fn start(tag: &str, extra_args: &[&str]) -> Result<Self> {
        let tls = ThrowawayTls::new(tag)?;
        let dir = std::env::temp_dir().join(format!("splice-e2e-agnhost-{tag}"));
        std::fs::create_dir_all(&dir)?;
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, &tls.cert_pem)?;
        std::fs::write(&key, &tls.key_pem)?;
        let port = free_port()?;
        let mut child = ChildGuard::spawn(
            Command::new(controlplane_bin_dir()?.join("agnhost"))
                .arg("webhook")
                .arg(format!("--tls-cert-file={}", cert.display()))
                .arg(format!("--tls-private-key-file={}", key.display()))
                .arg(format!("--port={port}"))
                .args(extra_args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null()),
        )?;
        wait_for_child_port(&mut child, port, Duration::from_secs(20))
            .await
            .map_err(|why| anyhow::anyhow!("agnhost webhook on port {port}: {why}"))?;
        Ok(Self {
            port,
            ca_pem: tls.ca_pem,
            dir,
            _child: child,
        })
    }
}

/// A throw-away CA and a serving certificate for 127.0.0.1 signed by it, PEM, valid for an hour.
struct ThrowawayTls {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl ThrowawayTls {
    fn new(tag: &str) -> Result<Self> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
        let now = time::OffsetDateTime::now_utc();
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name
            .push(DnType::CommonName, format!("e2e throw-away CA {tag}"));
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.not_before = now - time::Duration::minutes(1);
        ca.not_after = now + time::Duration::hours(1);
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate()?;
        let mut leaf = CertificateParams::new(Vec::<String>::new())?;
        leaf.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse()?)];
        leaf.not_before = now - time::Duration::minutes(1);
        leaf.not_after = now + time::Duration::hours(1);
        let cert = leaf.signed_by(&key, &issuer)?;
        Ok(Self {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Deletes a cluster-scoped MutatingWebhookConfiguration when dropped, so a failing test does not
/// leave a webhook that intercepts other tests' pods.
pub struct WebhookConfigurationGuard(pub String);

impl Drop for WebhookConfigurationGuard {
    fn drop(&mut self) {
        let name = self.0.clone();
        in_fresh_runtime(move |client| async move {
            let api: Api<MutatingWebhookConfiguration> = Api::all(client);
            let _ = api.delete(&name, &DeleteParams::default()).await;
        });
    }
}

/// The label (and taint) of the one real node `make up` starts.
pub const NODE_LABEL: &str = "e2e.splice.dev/node";

/// The name of the one real node.
pub async fn real_node(client: &Client) -> Result<String> {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let list = nodes
        .list(&kube::api::ListParams::default().labels(&format!("{NODE_LABEL}=real")))
        .await?;
    anyhow::ensure!(
        list.items.len() == 1,
        "expected one node labelled {NODE_LABEL}=real (make up starts it), found {}",
        list.items.len()
    );
    Ok(list.items[0].metadata.name.clone().unwrap_or_default())
}

/// Prints a measured figure and appends it to target/e2e-logs/<file>-report.txt, which outlives
/// the run (cargo test hides a passing test's output).
pub fn report(file: &str, line: String) {
    eprintln!("{line}");
    let dir = repo_root().join("target/e2e-logs");
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{file}-report.txt")))
    {
        use std::io::Write as _;
        let _ = writeln!(f, "{line}");
    }
}

/// The audit log the control plane writes: `$SPLICE_AUDIT_LOG` (run-e2e.sh sets it), else
/// `audit.log` beside the kubeconfig. `e2e/audit-policy.yaml` says what it records.
pub fn audit_log() -> Result<PathBuf> {
    let path = std::env::var_os("SPLICE_AUDIT_LOG")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            kubeconfig_path()
                .parent()
                .map(|d| d.join("audit.log"))
                .unwrap_or_default()
        });
    if !path.is_file() {
        bail!(
            "no audit log at {}: start the control plane with e2e/run-e2e.sh, or with \
             SPLICE_APISERVER_ARGS=\"--audit-policy-file e2e/audit-policy.yaml --audit-log-path \
             <run dir>/audit.log\"",
            path.display()
        );
    }
    Ok(path)
}

/// Every completed request the audit log at `log` holds, as the API server wrote it.
pub fn audit_events(log: &std::path::Path) -> Result<Vec<serde_json::Value>> {
    let text =
        std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["stage"] == "ResponseComplete")
        .collect())
}

/// The `q` quantile (0 to 1) of `sorted` samples, nearest rank; zero without samples.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
