//! Helpers for the operator's end-to-end tests: the CRD, `splice run` as a child process with its
//! own namespace, Lease and policy selector, and policies that clean up after themselves.
//!
//! Included by the operator test files with `#[path]`, so it compiles against the shared helpers
//! in `splice_e2e` without changing that crate's root. Each test binary uses a different subset.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use splice_crds::{InjectionPolicy, RolloutPhase, RolloutStatus};
use splice_e2e::{
    ChildGuard, NODE_LABEL, PortWait, TestNamespace, free_port, repo_root, unique_suffix,
    wait_dry_run, wait_for_child_port, wait_until,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The label whose value scopes one `splice run` to the policies of one test.
pub const INSTANCE_LABEL: &str = "e2e.splice.dev/instance";
/// Field manager of everything the tests apply.
pub const TEST_MANAGER: &str = "splice-e2e";

/// The `splice` binary: `$SPLICE_BIN` (set by `e2e/run-e2e.sh`), else the workspace's debug build.
pub fn splice_bin() -> Result<PathBuf> {
    let path = std::env::var_os("SPLICE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/debug/splice"));
    if !path.is_file() {
        bail!(
            "{} does not exist: run `cargo build -p splice` first (or set SPLICE_BIN)",
            path.display()
        );
    }
    Ok(path)
}

/// Installs (or updates) the InjectionPolicy CRD and waits until it is served. With
/// `SPLICE_E2E_CRD_INSTALLED=1` the CRD already in the cluster is used as is (a cluster whose CRD
/// is managed by someone else).
pub async fn install_crd(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = splice_crds::crd();
    let name = crd.metadata.name.clone().unwrap_or_default();
    if std::env::var_os("SPLICE_E2E_CRD_INSTALLED").is_none_or(|v| v != "1") {
        crds.patch(
            &name,
            &PatchParams::apply(TEST_MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .context("applying the InjectionPolicy CRD")?;
    }
    wait_until(Duration::from_secs(30), "the CRD to be established", || {
        let crds = crds.clone();
        let name = name.clone();
        async move {
            let crd = crds.get(&name).await?;
            Ok(crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True"))
        }
    })
    .await
}

/// Options of one `splice run` child.
#[derive(Clone, Debug)]
pub struct SpliceOptions {
    /// Splice's namespace (Lease, Secret); must exist.
    pub namespace: String,
    /// Value of [`INSTANCE_LABEL`] on the policies this instance manages.
    pub instance: String,
    /// Lease identity; `None` lets splice pick one (host and pid).
    pub identity: Option<String>,
    /// Webhook port; a free one when `None`.
    pub port: Option<u16>,
    /// `--webhook-url` port, when different from the listen port (replicas sharing one URL).
    pub url_port: Option<u16>,
    /// Admin port; a free one when `None` (a restart keeps it so a scraper sees one target).
    pub admin_port: Option<u16>,
    pub lease: Option<(u64, u64, u64)>,
    /// Name for the log file under `target/e2e-logs/`.
    pub log_name: String,
    /// More `splice run` arguments, e.g. `--fail-closed-hold 5s`.
    pub extra_args: Vec<String>,
    /// The kubeconfig `splice run` uses; the admin's when `None`.
    pub kubeconfig: Option<PathBuf>,
}

impl SpliceOptions {
    pub fn new(namespace: &str, instance: &str) -> Self {
        SpliceOptions {
            namespace: namespace.to_owned(),
            instance: instance.to_owned(),
            identity: None,
            port: None,
            url_port: None,
            admin_port: None,
            lease: None,
            log_name: format!("splice-{instance}"),
            extra_args: Vec::new(),
            kubeconfig: None,
        }
    }
}

/// A running `splice run`, killed with SIGKILL when dropped.
pub struct Splice {
    pub child: Option<ChildGuard>,
    pub port: u16,
    pub admin_port: u16,
    pub log: PathBuf,
    pub options: SpliceOptions,
}

impl Splice {
    /// Starts `splice run` and waits until it is ready (certificate loaded, caches synced).
    pub async fn start(options: SpliceOptions) -> Result<Self> {
        let splice = Self::spawn(options).await?;
        splice.wait_ready().await?;
        Ok(splice)
    }

    /// Starts `splice run` and waits only for its admin port (it may never become ready, e.g.
    /// when it refuses a Secret it did not create).
    pub async fn spawn(options: SpliceOptions) -> Result<Self> {
        // A port found free can still be taken before the child binds it; the child then exits
        // saying it cannot listen, and a fresh pair of ports is tried.
        const ATTEMPTS: usize = 3;
        let mut attempt = 1;
        loop {
            match Self::spawn_once(&options).await? {
                Ok(splice) => return Ok(splice),
                Err(log)
                    if attempt < ATTEMPTS
                        && options.port.is_none()
                        && options.admin_port.is_none() =>
                {
                    eprintln!("splice {}: {log}; retrying", options.log_name);
                    attempt += 1;
                }
                Err(log) => bail!("splice {}: {log}", options.log_name),
            }
        }
    }

    /// One attempt: the running child, or (as the inner error) why it exited because a port was
    /// taken, from its log.
    async fn spawn_once(options: &SpliceOptions) -> Result<std::result::Result<Self, String>> {
        let port = match options.port {
            Some(p) => p,
            None => free_port()?,
        };
        let admin_port = match options.admin_port {
            Some(p) => p,
            None => free_port()?,
        };
        let logs = repo_root().join("target/e2e-logs");
        std::fs::create_dir_all(&logs)?;
        let log = logs.join(format!("{}.log", options.log_name));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let log_start = file.metadata()?.len();
        let mut cmd = Command::new(splice_bin()?);
        cmd.arg("run")
            .arg("--namespace")
            .arg(&options.namespace)
            .arg("--webhook-url")
            .arg(format!(
                "https://127.0.0.1:{}",
                options.url_port.unwrap_or(port)
            ))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--admin-listen")
            .arg(format!("127.0.0.1:{admin_port}"))
            .arg("--policy-selector")
            .arg(format!("{INSTANCE_LABEL}={}", options.instance))
            .env(
                "KUBECONFIG",
                options
                    .kubeconfig
                    .clone()
                    .unwrap_or_else(splice_e2e::kubeconfig_path),
            )
            .env("SPLICE_LOG", "info,splice=debug")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        if let Some(identity) = &options.identity {
            cmd.arg("--identity").arg(identity);
        }
        if let Some((duration, renew, retry)) = options.lease {
            cmd.arg("--lease-duration")
                .arg(duration.to_string())
                .arg("--lease-renew-deadline")
                .arg(renew.to_string())
                .arg("--lease-retry-period")
                .arg(retry.to_string());
        }
        cmd.args(&options.extra_args);
        let mut child = ChildGuard::spawn(&mut cmd)?;
        match wait_for_child_port(&mut child, admin_port, Duration::from_secs(20)).await {
            Ok(()) => Ok(Ok(Splice {
                child: Some(child),
                port,
                admin_port,
                log,
                options: options.clone(),
            })),
            Err(why) => {
                let text = std::fs::read(&log).unwrap_or_default();
                let tail = String::from_utf8_lossy(text.get(log_start as usize..).unwrap_or(&[]));
                let mut last: Vec<&str> = tail.lines().rev().take(4).collect();
                last.reverse();
                let tail = last.join(" | ");
                let what = format!(
                    "admin port {admin_port} never opened: {why}; the end of {}: {tail}",
                    log.display()
                );
                if matches!(why, PortWait::Exited(_)) && tail.contains("cannot listen") {
                    Ok(Err(what))
                } else {
                    bail!("splice {}: {what}", options.log_name)
                }
            }
        }
    }

    /// Waits until /readyz answers 200.
    pub async fn wait_ready(&self) -> Result<()> {
        let admin_port = self.admin_port;
        let log = self.log.clone();
        wait_until(
            Duration::from_secs(30),
            "splice to become ready",
            || async move {
                Ok(http_get(admin_port, "/readyz")
                    .await
                    .map(|(code, _)| code == 200)
                    .unwrap_or(false))
            },
        )
        .await
        .with_context(|| format!("see {}", log.display()))?;
        Ok(())
    }

    /// SIGKILL, as when a node dies: no lease release, no cleanup.
    pub fn kill(&mut self) {
        self.child.take();
    }

    /// The Prometheus text of its admin port.
    pub async fn metrics(&self) -> Result<String> {
        let (code, body) = http_get(self.admin_port, "/metrics").await?;
        if code != 200 {
            bail!("/metrics answered {code}");
        }
        Ok(body)
    }
}

/// A bare HTTP/1.0 GET on 127.0.0.1 (the admin port is plain HTTP); returns status and body.
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response)).await??;
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("malformed HTTP response: {response:.80}"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

/// Applies the policy `name` with `spec`, labelled for `instance`. A spec that says no `mode`
/// gets `Webhook`: most tests exercise the webhook's own machinery (its configuration, the
/// certificates, the guard); tests/intree.rs says `Auto` or `InTree` where it means them.
pub async fn apply_policy(
    client: &Client,
    instance: &str,
    name: &str,
    mut spec: Value,
) -> Result<()> {
    if let Some(map) = spec.as_object_mut() {
        map.entry("mode").or_insert_with(|| json!("Webhook"));
    }
    let typed: Api<InjectionPolicy> = Api::all(client.clone());
    typed
        .patch(
            name,
            &PatchParams::apply(TEST_MANAGER).force(),
            &Patch::Apply(&policy_body(instance, name, &spec)),
        )
        .await
        .with_context(|| format!("applying policy {name}"))?;
    Ok(())
}

/// The policy `name` with `spec`, labelled for `instance`, as applied.
pub fn policy_body(instance: &str, name: &str, spec: &Value) -> Value {
    json!({
        "apiVersion": "splice.dev/v1alpha1",
        "kind": "InjectionPolicy",
        "metadata": {"name": name, "labels": {INSTANCE_LABEL: instance}},
        "spec": spec,
    })
}

/// Server-side apply of the policy as given (no default mode), dry run or not: the stored
/// policy, or the API server's message (a refusal's words are what validating tests check).
pub async fn try_apply_policy(
    client: &Client,
    instance: &str,
    name: &str,
    spec: &Value,
    dry: bool,
) -> Result<InjectionPolicy, String> {
    let api: Api<InjectionPolicy> = Api::all(client.clone());
    let mut params = PatchParams::apply(TEST_MANAGER).force();
    params.dry_run = dry;
    api.patch(
        name,
        &params,
        &Patch::Apply(&policy_body(instance, name, spec)),
    )
    .await
    .map_err(|e| match e {
        kube::Error::Api(s) => s.message,
        other => other.to_string(),
    })
}

/// Removes the validating configuration of the Splice in namespace `.0` when dropped: it is
/// owned by the CRD, which outlives the test.
pub struct ValidatingCleanup(pub String);

impl Drop for ValidatingCleanup {
    fn drop(&mut self) {
        let name = format!("splice-validate-{}", self.0);
        splice_e2e::in_fresh_runtime(move |client| async move {
            let _ = Api::<
                k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration,
            >::all(client)
            .delete(&name, &DeleteParams::default())
            .await;
        });
    }
}

/// `splice explain POD -n NAMESPACE` against the cluster, for the Splice in `splice_namespace`:
/// its output (stdout, then stderr).
pub fn explain_online(
    pod: &str,
    namespace: &str,
    splice_namespace: &str,
) -> Result<(String, String)> {
    let out = std::process::Command::new(splice_bin()?)
        .args([
            "explain",
            pod,
            "-n",
            namespace,
            "--splice-namespace",
            splice_namespace,
        ])
        .env("KUBECONFIG", splice_e2e::kubeconfig_path())
        .output()?;
    Ok((
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// The value of the exposition line for `series` (name and labels as written) in `text`.
pub fn metric_value(text: &str, series: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(str::to_owned)
}

pub fn condition<'a>(
    policy: &'a InjectionPolicy,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    policy
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// Waits until `name` reports Ready=`status` for its current generation (the condition's own
/// `observedGeneration`, as `kubectl wait` reads it); returns the policy.
pub async fn wait_policy(
    client: &Client,
    name: &str,
    status: &str,
    timeout: Duration,
) -> Result<InjectionPolicy> {
    let api: Api<InjectionPolicy> = Api::all(client.clone());
    let mut last = None;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(p) = api.get_opt(name).await? {
            let current =
                p.status.as_ref().and_then(|s| s.observed_generation) == p.metadata.generation;
            let ready = condition(&p, "Ready").filter(|c| {
                c.observed_generation
                    .is_none_or(|g| Some(g) == p.metadata.generation)
            });
            if current && ready.is_some_and(|c| c.status == status) {
                return Ok(p);
            }
            last = Some(p);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "policy {name} did not reach Ready={status} within {timeout:?}; last status: {}",
                last.and_then(|p| p.status)
                    .map(|s| format!("{s:?}"))
                    .unwrap_or_else(|| "none".into())
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deletes every policy of one instance (and so, by ownership, their webhook configurations)
/// when dropped, pass or fail.
pub struct PolicyCleanup {
    pub instance: String,
}

impl Drop for PolicyCleanup {
    fn drop(&mut self) {
        let selector = format!("{INSTANCE_LABEL}={}", self.instance);
        splice_e2e::in_fresh_runtime(move |client| async move {
            let api: Api<InjectionPolicy> = Api::all(client);
            let _ = api
                .delete_collection(
                    &DeleteParams::default(),
                    &ListParams::default().labels(&selector),
                )
                .await;
        });
    }
}

/// A pod with one application container and `labels`.
pub fn pod(name: &str, labels: &[(&str, &str)]) -> Pod {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]}
    }))
    .unwrap_or_default()
}

pub fn container_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default()
}

pub fn init_container_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .map(|c| c.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default()
}

pub fn image_of(pod: &Pod, container: &str) -> Option<String> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == container)?
        .image
        .clone()
}

/// The webhook configuration Splice keeps for `policy`, if any: the one its status names (a
/// shared entry), else its own `splice-<policy>`.
pub async fn configuration(
    client: &Client,
    policy: &str,
) -> Result<Option<MutatingWebhookConfiguration>> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let policies: Api<InjectionPolicy> = Api::all(client.clone());
    let named = policies
        .get_opt(policy)
        .await?
        .and_then(|p| p.status)
        .and_then(|s| s.webhook_configuration);
    if let Some(name) = named
        && let Some(found) = api.get_opt(&name).await?
    {
        return Ok(Some(found));
    }
    Ok(api.get_opt(&format!("splice-{policy}")).await?)
}

/// Waits until the API server calls the webhook for `policy` in `namespace`: a server-side dry
/// run (no side effect) shows `container`. The API server loads new webhook configurations
/// asynchronously, so a configuration that exists is not yet one that is called.
pub async fn wait_injecting(
    client: &Client,
    namespace: &str,
    labels: &[(&str, &str)],
    container: &str,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    wait_dry_run(
        &pods,
        &pod("probe", labels),
        Duration::from_secs(30),
        &format!("{container} to be injected in {namespace}"),
        |created| {
            container_names(created)
                .iter()
                .chain(init_container_names(created).iter())
                .any(|n| n == container)
        },
    )
    .await
}

/// Whether the chain served on 127.0.0.1:`port` verifies against `ca_pem` alone, for the IP
/// 127.0.0.1: a real TLS handshake with `openssl s_client`, so it shows what the replica serves
/// right now, not what it reports.
pub async fn serves_chain_of(port: u16, ca_pem: &str) -> Result<bool> {
    let dir = std::env::temp_dir().join(format!("splice-e2e-ca-{}", splice_e2e::unique_suffix()));
    std::fs::create_dir_all(&dir)?;
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca_pem)?;
    let output = tokio::process::Command::new("openssl")
        .args(["s_client", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["-verify_return_error", "-verify_ip", "127.0.0.1", "-CAfile"])
        .arg(&ca_file)
        .stdin(Stdio::null())
        .output()
        .await
        .context("running openssl s_client")?;
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(output.status.success() && text.contains("Verify return code: 0 (ok)"))
}

/// Runs the control plane's kubectl with the admin kubeconfig, from the repository root; returns
/// stdout, or fails with the command and its output.
pub fn kubectl(args: &[&str]) -> Result<String> {
    let bin = splice_e2e::controlplane_bin_dir()?.join("kubectl");
    let out = Command::new(&bin)
        .args(args)
        .env("KUBECONFIG", splice_e2e::kubeconfig_path())
        .current_dir(repo_root())
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "kubectl {} failed: {}{}",
            args.join(" "),
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

/// The admin kubeconfig's current context, credentials inlined, as JSON (`clusters[0]`,
/// `users[0]`), to build other kubeconfigs from.
pub fn admin_kubeconfig() -> Result<Value> {
    let text = kubectl(&[
        "config",
        "view",
        "--raw",
        "--minify",
        "--flatten",
        "-o",
        "json",
    ])?;
    Ok(serde_json::from_str(&text)?)
}

/// The user name the API server gives Splice's ServiceAccount as deploy/ installs it.
pub const SPLICE_SERVICE_ACCOUNT: &str = "system:serviceaccount:splice-system:splice";

/// A client that acts as Splice's ServiceAccount (with its groups), through the admin's right to
/// impersonate: it has exactly what deploy/rbac.yaml grants and the admission policies allow.
pub async fn as_splice_service_account() -> Result<Client> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let kubeconfig = Kubeconfig::read_from(splice_e2e::kubeconfig_path())?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    config.auth_info.impersonate = Some(SPLICE_SERVICE_ACCOUNT.into());
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".into(),
        "system:serviceaccounts:splice-system".into(),
        "system:authenticated".into(),
    ]);
    Ok(Client::try_from(config)?)
}

/// One test's Splice: its namespace, its instance label, the running process, and the cleanup
/// of its policies.
pub struct Setup {
    pub client: Client,
    pub instance: String,
    // Dropped in this order: Splice stops, its policies go, then its namespace.
    pub splice: Splice,
    _cleanup: PolicyCleanup,
    pub splice_ns: TestNamespace,
}

impl Setup {
    pub async fn start(prefix: &str) -> Result<Self> {
        Self::start_with(prefix, &[]).await
    }

    /// Like [`Setup::start`], with more `splice run` arguments.
    pub async fn start_with(prefix: &str, extra_args: &[&str]) -> Result<Self> {
        Self::start_configured(prefix, |options| {
            options.extra_args = extra_args.iter().map(|a| (*a).to_owned()).collect();
        })
        .await
    }

    /// Like [`Setup::start`], with the `splice run` options adjusted by `configure`.
    pub async fn start_configured(
        prefix: &str,
        configure: impl FnOnce(&mut SpliceOptions),
    ) -> Result<Self> {
        let client = splice_e2e::client().await?;
        install_crd(&client).await?;
        let instance = format!("{prefix}-{}", unique_suffix());
        let splice_ns = TestNamespace::create("e2e-splice", &[]).await?;
        let cleanup = PolicyCleanup {
            instance: instance.clone(),
        };
        let mut options = SpliceOptions::new(&splice_ns.name, &instance);
        configure(&mut options);
        let splice = Splice::start(options).await?;
        Ok(Setup {
            client,
            instance,
            splice_ns,
            splice,
            _cleanup: cleanup,
        })
    }

    /// A unique policy name for this test.
    pub fn policy(&self, name: &str) -> String {
        format!("{}-{name}", self.instance)
    }

    /// A namespace selected by this test's policies (label `<instance>=on`).
    pub async fn app_namespace(&self) -> Result<TestNamespace> {
        TestNamespace::create("e2e-app", &[(&self.instance, "on")]).await
    }

    pub async fn apply(&self, name: &str, spec: Value) -> Result<()> {
        apply_policy(&self.client, &self.instance, name, spec).await
    }
}

/// A policy injecting one container into pods of namespaces labelled `<instance>=on`.
pub fn sidecar_spec(instance: &str, container: &str, image: &str) -> Value {
    json!({
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "template": {"containers": [{"name": container, "image": image}]}
    })
}

/// The Warning Events with `reason` recorded about the policy `policy`.
async fn warnings(client: &Client, policy: &str, reason: &str) -> Result<Vec<Event>> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let mut all = events.list(&ListParams::default()).await?.items;
    all.retain(|e| {
        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(policy)
            && e.reason.as_deref() == Some(reason)
            && e.type_.as_deref() == Some("Warning")
    });
    Ok(all)
}

/// How many Warning Events with `reason` were recorded about the policy `policy`.
pub async fn warning_events(client: &Client, policy: &str, reason: &str) -> Result<usize> {
    Ok(warnings(client, policy, reason).await?.len())
}

/// The notes of the Warning Events with `reason` recorded about the policy `policy`.
pub async fn event_notes(client: &Client, policy: &str, reason: &str) -> Result<Vec<String>> {
    let all = warnings(client, policy, reason).await?;
    Ok(all.into_iter().filter_map(|e| e.note).collect())
}

/// Who holds the leader Lease `splice-leader` of `leases`' namespace.
pub async fn lease_holder(
    leases: &Api<k8s_openapi::api::coordination::v1::Lease>,
) -> Result<Option<String>> {
    Ok(leases
        .get_opt("splice-leader")
        .await?
        .and_then(|l| l.spec?.holder_identity))
}

// The rollout tests' Deployments (tests/rollout.rs, tests/rollout_repair.rs): the test
// application on the real node, and what a watch of them sees.

/// The test application's image, imported into the real node.
pub const TESTAPP: &str = "splice-testapp:e2e";
/// The pod-template annotation a rollout restart writes: `<policy>@<revision>`.
pub const RESTARTED_FOR: &str = "splice.dev/restartedFor";
/// The container [`rollout_policy`] injects.
pub const ROLLOUT_SIDECAR: &str = "rollout-sidecar";

/// A policy injecting one sidecar (`args`, with `REV` in its env) into namespaces labelled
/// `<instance>=on`, with a rollout.
pub fn rollout_policy(
    instance: &str,
    mode: &str,
    rev: &str,
    args: &[&str],
    rollout: Value,
) -> Value {
    json!({
        "mode": mode,
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "template": {"containers": [{
            "name": ROLLOUT_SIDECAR,
            "image": TESTAPP,
            "imagePullPolicy": "Never",
            "args": args,
            "env": [{"name": "REV", "value": rev}],
        }]},
        "rollout": rollout,
    })
}

/// A one-replica Deployment of the test application on the real node. `minReadySeconds`, as a
/// canary's workloads want: a sidecar that is Ready for a moment between crashes never counts as
/// available, so the Deployment keeps its old pod (without it a crash-looping revision took a
/// Deployment to 0 available in the canary e2e).
pub fn deployment(name: &str, instance: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"e2e-rollout": instance}},
        "spec": {
            "replicas": 1,
            "minReadySeconds": 5,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {NODE_LABEL: "real"},
                    "tolerations": [{"key": NODE_LABEL, "operator": "Equal", "value": "real", "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{
                        "name": "app",
                        "image": TESTAPP,
                        "imagePullPolicy": "Never",
                        "args": ["sleep"],
                    }],
                },
            },
        },
    })
}

/// What `kubectl rollout status` waits for (and the rollout's planner too).
pub fn settled(d: &Deployment) -> bool {
    let (Some(spec), Some(status)) = (d.spec.as_ref(), d.status.as_ref()) else {
        return false;
    };
    let desired = spec.replicas.unwrap_or(1);
    let updated = status.updated_replicas.unwrap_or(0);
    status.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
        && updated >= desired
        && status.replicas.unwrap_or(0) <= updated
        && status.available_replicas.unwrap_or(0) >= desired
}

pub fn restarted_for(d: &Deployment) -> Option<&str> {
    d.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(RESTARTED_FOR)
        .map(String::as_str)
}

/// Creates `count` Deployments ([`deployment`]) in each namespace and waits until every one is
/// available with its pod injected by `policy` at `hash` (`None`: not injected by it).
pub async fn deploy(
    client: &Client,
    namespaces: &[TestNamespace],
    count: usize,
    instance: &str,
    policy: &str,
    hash: Option<&str>,
) -> Result<()> {
    for ns in namespaces {
        let api: Api<Deployment> = ns.api();
        for i in 0..count {
            let name = format!("app-{i}");
            api.patch(
                &name,
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&deployment(&name, instance)),
            )
            .await?;
        }
    }
    wait_until(
        Duration::from_secs(180),
        &format!("every Deployment available with its pod injected at {hash:?}"),
        || async {
            for ns in namespaces {
                let ds = ns.api::<Deployment>().list(&ListParams::default()).await?;
                if ds.items.len() != count || !ds.items.iter().all(settled) {
                    return Ok(false);
                }
            }
            all_at(client, namespaces, count, policy, hash).await
        },
    )
    .await
}

/// True when the namespaces hold exactly `per_namespace` pods each, every one carrying the
/// policy's injection at `hash` (terminating pods count, so the old ones must be gone).
pub async fn all_current(
    client: &Client,
    namespaces: &[TestNamespace],
    per_namespace: usize,
    policy: &str,
    hash: &str,
) -> Result<bool> {
    all_at(client, namespaces, per_namespace, policy, Some(hash)).await
}

/// Like [`all_current`], with `None` for pods the policy did not inject at all.
pub async fn all_at(
    client: &Client,
    namespaces: &[TestNamespace],
    per_namespace: usize,
    policy: &str,
    hash: Option<&str>,
) -> Result<bool> {
    for ns in namespaces {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
        let list = pods.list(&ListParams::default()).await?;
        if list.items.len() != per_namespace {
            return Ok(false);
        }
        for p in &list.items {
            let status = p
                .annotations()
                .get("splice.dev/status")
                .and_then(|s| serde_json::from_str::<Value>(s).ok());
            let got = status
                .as_ref()
                .and_then(|s| s.get(policy))
                .and_then(|e| e.get("hash"))
                .and_then(Value::as_str);
            if got != hash {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

pub async fn template_hash(api: &Api<InjectionPolicy>, name: &str) -> Result<Option<String>> {
    Ok(api.get(name).await?.status.and_then(|s| s.template_hash))
}

/// Waits until the policy's `status.rollout` is at `revision` in `phase` and `done(status)`.
pub async fn wait_rollout(
    api: &Api<InjectionPolicy>,
    name: &str,
    revision: &str,
    phase: RolloutPhase,
    timeout: Duration,
    done: impl Fn(&RolloutStatus) -> bool,
) -> Result<RolloutStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        let s = api.get(name).await?.status.and_then(|s| s.rollout);
        if let Some(s) = &s
            && s.revision == revision
            && s.phase == phase
            && done(s)
        {
            return Ok(s.clone());
        }
        if Instant::now() > deadline {
            bail!("the rollout of {revision} did not reach {phase:?} within {timeout:?}: {s:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn ensure_rolled_out(
    api: &Api<InjectionPolicy>,
    name: &str,
    status: &str,
    reason: &str,
) -> Result<()> {
    let p = api.get(name).await?;
    let rolled = condition(&p, "RolledOut").context("no RolledOut condition")?;
    ensure!(
        rolled.status == status && rolled.reason == reason,
        "RolledOut is {} {}, expected {status} {reason}",
        rolled.status,
        rolled.reason
    );
    Ok(())
}

/// What a watch of the test's Deployments saw during a rollout of `mine`.
#[derive(Default)]
pub struct Observed {
    /// Most Deployments restarted for `mine` and not settled at any one time.
    pub max_restarting: usize,
    /// Fewest available replicas any Deployment had (they all want 1, maxUnavailable 0), of
    /// those available when the watch first saw them: one already down (a halted canary's) has
    /// not fallen during this rollout.
    pub min_available: Option<i32>,
    /// The Deployment that had them, and its status then.
    pub least_available: Option<String>,
    /// Deployments seen restarted for `mine`.
    pub restarted: usize,
}

/// Watches every Deployment labelled `e2e-rollout=<instance>` until dropped.
pub fn watch_deployments(
    client: &Client,
    instance: &str,
    mine: String,
) -> (Arc<Mutex<Observed>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Observed::default()));
    let api: Api<Deployment> = Api::all(client.clone());
    let config = watcher::Config::default().labels(&format!("e2e-rollout={instance}"));
    let out = Arc::clone(&seen);
    let task = tokio::spawn(async move {
        let mut state: HashMap<(String, String), Deployment> = HashMap::new();
        let mut up_at_first: HashMap<(String, String), bool> = HashMap::new();
        let mut events = std::pin::pin!(watcher(api, config));
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) => {
                    let key = (d.namespace().unwrap_or_default(), d.name_any());
                    up_at_first.entry(key.clone()).or_insert_with(|| {
                        d.status
                            .as_ref()
                            .and_then(|s| s.available_replicas)
                            .unwrap_or(0)
                            >= 1
                    });
                    state.insert(key, d);
                }
                Ok(watcher::Event::Delete(d)) => {
                    state.remove(&(d.namespace().unwrap_or_default(), d.name_any()));
                }
                _ => continue,
            }
            let restarting = state
                .values()
                .filter(|d| restarted_for(d) == Some(&mine) && !settled(d))
                .count();
            let restarted = state
                .values()
                .filter(|d| restarted_for(d) == Some(&mine))
                .count();
            let available = state
                .iter()
                .filter(|(key, _)| up_at_first.get(*key).copied().unwrap_or(false))
                .map(|((ns, name), d)| {
                    let n = d
                        .status
                        .as_ref()
                        .and_then(|s| s.available_replicas)
                        .unwrap_or(0);
                    (n, format!("{ns}/{name}: {:?}", d.status))
                })
                .min_by_key(|(n, _)| *n);
            let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
            o.max_restarting = o.max_restarting.max(restarting);
            o.restarted = restarted;
            if let Some((a, which)) = available
                && o.min_available.is_none_or(|m| a < m)
            {
                o.min_available = Some(a);
                o.least_available = Some(which);
            }
        }
    });
    (seen, task)
}

/// Each Deployment's `deployment.kubernetes.io/revision`: 1 + the times its template changed.
pub async fn revisions(namespaces: &[TestNamespace]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for ns in namespaces {
        for d in ns
            .api::<Deployment>()
            .list(&ListParams::default())
            .await?
            .items
        {
            let rev = d
                .annotations()
                .get("deployment.kubernetes.io/revision")
                .cloned()
                .unwrap_or_default();
            out.insert(format!("{}/{}", ns.name, d.name_any()), rev);
        }
    }
    Ok(out)
}

/// How a rollout the tests waited for ended.
pub struct Completed {
    /// From the given start until `status.rollout` was Complete.
    pub took: Duration,
    pub status: RolloutStatus,
    /// What the watch of the Deployments saw meanwhile.
    pub max_restarting: usize,
    pub min_available: Option<i32>,
    pub least_available: Option<String>,
    pub restarted: usize,
    /// Each Deployment's revision afterwards ([`revisions`]).
    pub revisions: BTreeMap<String, String>,
}

/// Waits until the rollout of `revision` is Complete with every Deployment of the namespaces
/// done and every pod carrying `revision`, then stops `watch` ([`watch_deployments`]).
pub async fn wait_complete(
    client: &Client,
    namespaces: &[TestNamespace],
    per_namespace: usize,
    name: &str,
    revision: &str,
    since: Instant,
    watch: (Arc<Mutex<Observed>>, tokio::task::JoinHandle<()>),
) -> Result<Completed> {
    let policies: Api<InjectionPolicy> = Api::all(client.clone());
    let total = per_namespace * namespaces.len();
    let status = wait_rollout(
        &policies,
        name,
        revision,
        RolloutPhase::Complete,
        Duration::from_secs(300),
        |s| s.done == total as i64,
    )
    .await?;
    let took = since.elapsed();
    wait_until(
        Duration::from_secs(90),
        &format!("every pod current at {revision}"),
        || all_current(client, namespaces, per_namespace, name, revision),
    )
    .await?;
    let (seen, task) = watch;
    task.abort();
    let revisions = revisions(namespaces).await?;
    let o = seen.lock().unwrap_or_else(|e| e.into_inner());
    Ok(Completed {
        took,
        status,
        max_restarting: o.max_restarting,
        min_available: o.min_available,
        least_available: o.least_available.clone(),
        restarted: o.restarted,
        revisions,
    })
}

/// What a completed rollout must show: never more than `budget` Deployments restarting at once,
/// none below its availability, each restarted exactly once (one revision past `before`), and
/// `RolledOut` True, reason Complete.
pub async fn ensure_restarted_once(
    client: &Client,
    name: &str,
    budget: usize,
    done: &Completed,
    before: &BTreeMap<String, String>,
) -> Result<()> {
    ensure!(
        done.max_restarting <= budget,
        "the watch saw {} Deployments restarting at once (budget {budget})",
        done.max_restarting
    );
    ensure!(
        done.min_available.is_some_and(|a| a >= 1),
        "a Deployment fell below its availability: {:?} ({})",
        done.min_available,
        done.least_available.as_deref().unwrap_or("none seen")
    );
    ensure!(
        done.revisions.len() == before.len(),
        "Deployments before {before:?}, after {:?}",
        done.revisions
    );
    for (deployment, rev) in &done.revisions {
        let was: u32 = before
            .get(deployment)
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let now: u32 = rev.parse().unwrap_or(0);
        ensure!(
            now == was + 1,
            "{deployment} went from revision {was} to {now}: restarted {} times",
            now.saturating_sub(was)
        );
    }
    let policies: Api<InjectionPolicy> = Api::all(client.clone());
    ensure_rolled_out(&policies, name, "True", "Complete").await
}

/// Sends signal `name` (`STOP`, `CONT`, ...) to a running `splice run`.
pub fn signal(splice: &Splice, name: &str) -> Result<()> {
    let pid = splice
        .child
        .as_ref()
        .context("the replica is not running")?
        .0
        .id();
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()?;
    if !status.success() {
        bail!("kill -{name} {pid} failed");
    }
    Ok(())
}
