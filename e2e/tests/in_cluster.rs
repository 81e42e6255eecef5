//! Splice as its users run it: the image `make image` built, installed by the chart (or `kubectl
//! apply -k` of a placement-only overlay of deploy/) onto the real node that `make up` starts,
//! called by the API server through its Service, and injecting pods a kubelet really starts.
//!
//! Every test installs into the real `splice-system` and so takes one lock: they run one after
//! another. Test binaries run one after another too, so no other test's Splice shares the cluster.
//! The figures each test measures are printed as `REPORT ...` lines (docs/performance.md).

#[path = "../src/operator.rs"]
mod operator;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, EvictParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use operator::*;
use serde_json::{Value, json};
use splice_crds::InjectionPolicy;
use splice_e2e::{NODE_LABEL, TestNamespace, real_node, wait_until};
use tokio::sync::Mutex;

const NAMESPACE: &str = "splice-system";
const TESTAPP: &str = "splice-testapp:e2e";
/// The injected items every test's policy adds, each of which must appear exactly once.
const INIT: &str = "splice-init";
const SIDECAR: &str = "splice-sidecar";
const VOLUME: &str = "splice-shared";
const ENV: &str = "SPLICE_INJECTED";

fn report(line: String) {
    splice_e2e::report("in_cluster", line);
}

/// One install of Splice at a time.
static SERIAL: Mutex<()> = Mutex::const_new(());

fn run(bin: &std::path::Path, args: &[&str]) -> Result<String> {
    splice_e2e::run_tool(bin, args, None)
}

fn helm(args: &[&str]) -> Result<String> {
    run(&splice_e2e::helm_bin()?, args)
}

/// The placement the issue's install command gives: the real node only.
const PLACEMENT: [&str; 4] = [
    "--set-json",
    r#"nodeSelector={"e2e.splice.dev/node":"real"}"#,
    "--set-json",
    r#"tolerations=[{"key":"e2e.splice.dev/node","operator":"Equal","value":"real","effect":"NoSchedule"}]"#,
];

/// How Splice was installed, so it is removed the same way.
#[derive(Clone, Copy, PartialEq)]
enum Via {
    Helm,
    Kustomize,
}

/// Splice installed in `splice-system`; uninstalled (and the namespace gone) when dropped.
struct Installed {
    client: Client,
    via: Via,
    removed: bool,
}

impl Installed {
    /// `helm install` with the chart's defaults apart from placement (and `extra` values), then
    /// two Ready replicas.
    async fn helm(extra: &[&str]) -> Result<Self> {
        let client = splice_e2e::client().await?;
        wait_namespace_gone(&client).await?;
        let mut args = vec![
            "install",
            "splice",
            "deploy/chart",
            "-n",
            NAMESPACE,
            "--create-namespace",
        ];
        args.extend(PLACEMENT);
        args.extend(extra);
        let installed = Installed {
            client,
            via: Via::Helm,
            removed: false,
        };
        helm(&args)?;
        installed.wait_replicas_ready(2).await?;
        Ok(installed)
    }

    /// `kubectl apply -k` of e2e/overlays/real-node (deploy/ plus placement only).
    async fn kustomize() -> Result<Self> {
        let client = splice_e2e::client().await?;
        wait_namespace_gone(&client).await?;
        let installed = Installed {
            client,
            via: Via::Kustomize,
            removed: false,
        };
        kubectl(&["apply", "--server-side", "-k", "e2e/overlays/real-node"])?;
        installed.wait_replicas_ready(2).await?;
        Ok(installed)
    }

    fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// Splice's pods, Ready or not, that are not terminating.
    async fn splice_pods(&self) -> Result<Vec<Pod>> {
        Ok(self
            .pods()
            .list(&ListParams::default().labels("app.kubernetes.io/name=splice"))
            .await?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect())
    }

    /// Waits until the Deployment has exactly `n` updated, Ready replicas and no others, each on
    /// the real node. The pods are part of the wait: right after a replica is deleted, the
    /// Deployment's status can still read `n` Ready while its replacement is not yet scheduled.
    async fn wait_replicas_ready(&self, n: i32) -> Result<()> {
        let deployments = self.deployments();
        let real = real_node(&self.client).await?;
        wait_until(
            Duration::from_secs(180),
            &format!("{n} Ready Splice replicas on the real node"),
            || {
                let deployments = deployments.clone();
                let real = real.clone();
                async move {
                    let Some(d) = deployments.get_opt("splice").await? else {
                        return Ok(false);
                    };
                    let generation = d.metadata.generation;
                    let s = d.status.unwrap_or_default();
                    let settled = s.observed_generation == generation
                        && s.replicas == Some(n)
                        && s.updated_replicas == Some(n)
                        && s.ready_replicas == Some(n)
                        && s.available_replicas == Some(n);
                    if !settled {
                        return Ok(false);
                    }
                    let pods = self.splice_pods().await?;
                    for pod in &pods {
                        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                        // Bound elsewhere is a wrong placement, not a pod still on its way.
                        if let Some(node) = node.filter(|node| *node != real) {
                            bail!(
                                "Splice pod {} runs on {node}, not the real node {real}",
                                pod.metadata.name.clone().unwrap_or_default()
                            );
                        }
                    }
                    Ok(pods.len() == n as usize && pods.iter().all(|p| ready_on(p, &real)))
                }
            },
        )
        .await
        .with_context(|| self.diagnose())
    }

    /// What a failed wait shows: Splice's pods and their states.
    fn diagnose(&self) -> String {
        kubectl(&["-n", NAMESPACE, "get", "pods,deploy,events", "-o", "wide"])
            .unwrap_or_else(|e| format!("(kubectl get failed: {e})"))
    }

    /// Waits until no Splice pod is terminating any more (a deleted replica serves through its
    /// preStop delay and drain: an event is over only once it is gone).
    async fn wait_no_terminating(&self) -> Result<()> {
        let pods = self.pods();
        wait_until(
            Duration::from_secs(120),
            "terminating Splice pods to be gone",
            || {
                let pods = pods.clone();
                async move {
                    Ok(pods
                        .list(&ListParams::default().labels("app.kubernetes.io/name=splice"))
                        .await?
                        .items
                        .iter()
                        .all(|p| p.metadata.deletion_timestamp.is_none()))
                }
            },
        )
        .await
    }

    /// The pod holding the leader Lease.
    async fn leader(&self) -> Result<String> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NAMESPACE);
        let lease = leases.get("splice-leader").await?;
        lease
            .spec
            .and_then(|s| s.holder_identity)
            .context("the splice-leader Lease has no holder")
    }

    async fn uninstall(&mut self) -> Result<()> {
        self.removed = true;
        remove(&self.client, self.via).await
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        let via = self.via;
        splice_e2e::in_fresh_runtime(move |client| async move {
            let _ = remove(&client, via).await;
        });
    }
}

/// Uninstalls Splice the way it was installed, then deletes its namespace and waits until it is
/// gone (the next install needs it fresh).
async fn remove(client: &Client, via: Via) -> Result<()> {
    // The namespace goes even when the uninstall command failed; its error is reported after.
    let uninstalled = match via {
        Via::Helm => helm(&["uninstall", "splice", "-n", NAMESPACE, "--wait"]),
        Via::Kustomize => kubectl(&[
            "delete",
            "-k",
            "e2e/overlays/real-node",
            "--wait=true",
            "--ignore-not-found",
        ]),
    };
    let _ = Api::<Namespace>::all(client.clone())
        .delete(NAMESPACE, &DeleteParams::default())
        .await;
    let gone = wait_namespace_gone(client).await;
    uninstalled?;
    gone
}

async fn wait_namespace_gone(client: &Client) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    wait_until(
        Duration::from_secs(120),
        "namespace splice-system to be gone",
        || {
            let namespaces = namespaces.clone();
            async move { Ok(namespaces.get_opt(NAMESPACE).await?.is_none()) }
        },
    )
    .await
}

/// Whether `pod` has the condition Ready=True.
fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `pod` is bound to `node` and Ready.
fn ready_on(pod: &Pod, node: &str) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node) && is_ready(pod)
}

/// A policy injecting an init container that exits 0, a native sidecar serving /healthz, a shared
/// volume (mounted into both and every application container) and an env var, into pods of
/// namespaces labelled `key=on`. Pinned to the webhook: the point is the call through the Service.
fn injecting_policy(key: &str, failure_policy: &str) -> Value {
    let restricted = json!({
        "allowPrivilegeEscalation": false,
        "runAsNonRoot": true,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"}
    });
    let mount = json!([{"name": VOLUME, "mountPath": "/splice"}]);
    json!({
        "mode": "Webhook",
        "failurePolicy": failure_policy,
        "namespaceSelector": {"matchLabels": {key: "on"}},
        "template": {
            "initContainers": [
                {
                    "name": INIT,
                    "image": TESTAPP,
                    "imagePullPolicy": "Never",
                    "args": ["--mark", "/splice/init", "exit", "0"],
                    "volumeMounts": mount,
                    "securityContext": restricted,
                },
                {
                    "name": SIDECAR,
                    "image": TESTAPP,
                    "imagePullPolicy": "Never",
                    "restartPolicy": "Always",
                    "args": ["--mark", "/splice/sidecar", "serve", "--port", "9091"],
                    "startupProbe": {"httpGet": {"path": "/healthz", "port": 9091}, "periodSeconds": 1},
                    "volumeMounts": mount,
                    "securityContext": restricted,
                },
            ],
            "volumes": [{"name": VOLUME, "emptyDir": {}}],
            "volumeMounts": mount,
            "env": [{"name": ENV, "value": "{{ namespace.name }}"}],
        },
    })
}

/// A Deployment of the test application on the real node.
fn app_deployment(name: &str, replicas: i32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {NODE_LABEL: "real"},
                    "tolerations": [{"key": NODE_LABEL, "operator": "Equal", "value": "real", "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 5,
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "app",
                        "image": TESTAPP,
                        "imagePullPolicy": "Never",
                        "args": ["serve", "--port", "8080"],
                        "env": [{"name": "SHOW_PATHS", "value": "/splice"}],
                        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1},
                        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                    }],
                },
            },
        },
    })
}

/// How many times each injected item is in `pod`: init container, sidecar, volume, the env var
/// in the application container.
fn injected_counts(pod: &Pod) -> [usize; 4] {
    let Some(spec) = pod.spec.as_ref() else {
        return [0; 4];
    };
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    let count_init = |name: &str| inits.iter().filter(|c| c.name == name).count();
    let volumes = spec
        .volumes
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|v| v.name == VOLUME)
        .count();
    let env = spec
        .containers
        .iter()
        .filter(|c| c.name == "app")
        .flat_map(|c| c.env.as_deref().unwrap_or_default())
        .filter(|e| e.name == ENV)
        .count();
    [count_init(INIT), count_init(SIDECAR), volumes, env]
}

fn injected_once(pod: &Pod) -> bool {
    injected_counts(pod) == [1, 1, 1, 1]
}

/// A bare pod for the create load (it never needs to run: dry runs, and kwok nodes).
fn load_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "load"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "app", "image": TESTAPP, "imagePullPolicy": "Never"}],
        }
    }))
    .unwrap_or_default()
}

/// Applies `policy` (no instance label: the chart's Splice manages every policy) and waits for
/// Ready=True; deleted when dropped.
struct TestPolicy {
    name: String,
}

impl TestPolicy {
    async fn apply(client: &Client, name: &str, spec: Value) -> Result<Self> {
        let api: Api<InjectionPolicy> = Api::all(client.clone());
        let body = json!({
            "apiVersion": "splice.dev/v1alpha1", "kind": "InjectionPolicy",
            "metadata": {"name": name}, "spec": spec,
        });
        api.patch(
            name,
            &PatchParams::apply("splice-e2e").force(),
            &Patch::Apply(&body),
        )
        .await
        .with_context(|| format!("applying policy {name}"))?;
        let policy = TestPolicy { name: name.into() };
        wait_policy(client, name, "True", Duration::from_secs(60)).await?;
        Ok(policy)
    }
}

impl Drop for TestPolicy {
    fn drop(&mut self) {
        let name = self.name.clone();
        splice_e2e::in_fresh_runtime(move |client| async move {
            let _ = Api::<InjectionPolicy>::all(client)
                .delete(&name, &DeleteParams::default())
                .await;
        });
    }
}

/// The reason of the policy's FailClosed condition and the failurePolicy its webhook entry has.
async fn guard_state(client: &Client, policy: &str) -> Result<(String, String)> {
    let p = Api::<InjectionPolicy>::all(client.clone())
        .get(policy)
        .await?;
    let reason = condition(&p, "FailClosed")
        .map(|c| c.reason.clone())
        .unwrap_or_default();
    let entry = configuration(client, policy)
        .await?
        .and_then(|c| c.webhooks)
        .and_then(|w| w.into_iter().next())
        .and_then(|w| w.failure_policy)
        .unwrap_or_default();
    Ok((reason, entry))
}

/// Seconds until the policy's entry has `failure_policy` and FailClosed's reason satisfies `reason`.
async fn wait_guard(
    client: &Client,
    policy: &str,
    failure_policy: &str,
    reason: impl Fn(&str) -> bool,
    timeout: Duration,
) -> Result<f64> {
    let start = Instant::now();
    let mut last = (String::new(), String::new());
    while start.elapsed() < timeout {
        last = guard_state(client, policy).await?;
        if last.1 == failure_policy && reason(&last.0) {
            return Ok(start.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!(
        "policy {policy}: after {timeout:?} the entry says {} and FailClosed {}, expected {failure_policy}",
        last.1,
        last.0
    )
}

/// Seconds until the policy's `Fail` is in force (after the guard's 60 s hold from the moment
/// both replicas were available).
async fn fail_in_force(client: &Client, policy: &str) -> Result<f64> {
    wait_guard(
        client,
        policy,
        "Fail",
        |r| r == "FailInForce",
        Duration::from_secs(150),
    )
    .await
}

/// What most tests start from: Splice installed by the chart, a namespace labelled for the `Fail`
/// policy `policy`, and that policy Ready and in force. Dropped in reverse: policy, namespace,
/// Splice.
async fn installed_with_fail_policy(
    policy: &str,
) -> Result<(Installed, TestNamespace, TestPolicy)> {
    let install = Installed::helm(&[]).await?;
    let key = format!("incluster-{}", splice_e2e::unique_suffix());
    let ns = TestNamespace::create(policy, &[(key.as_str(), "on")]).await?;
    let applied =
        TestPolicy::apply(&install.client, policy, injecting_policy(&key, "Fail")).await?;
    fail_in_force(&install.client, policy).await?;
    Ok((install, ns, applied))
}

/// Every webhook entry of Splice's configurations points at the Service, none at a URL.
async fn entries_use_the_service(client: &Client) -> Result<()> {
    let configs: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let list = configs
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=splice"))
        .await?;
    ensure!(!list.items.is_empty(), "no Splice webhook configuration");
    for config in list.items {
        for hook in config.webhooks.unwrap_or_default() {
            let cc = &hook.client_config;
            ensure!(cc.url.is_none(), "{} has url {:?}", hook.name, cc.url);
            let service = cc.service.as_ref().context("no service reference")?;
            ensure!(
                service.name == "splice" && service.namespace == NAMESPACE,
                "{} calls {}/{}",
                hook.name,
                service.namespace,
                service.name
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_chart_installs_splice_on_the_real_node_and_injected_pods_really_run() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let (install, ns, _policy) = installed_with_fail_policy("incluster-run").await?;
    let client = install.client.clone();
    entries_use_the_service(&client).await?;
    // What the chart must have made real: the budget, the ServiceAccount, the webhook guard.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NAMESPACE);
    ensure!(
        pdbs.get_opt("splice").await?.is_some(),
        "no PodDisruptionBudget"
    );
    kubectl(&["-n", NAMESPACE, "get", "serviceaccount", "splice"])?;
    kubectl(&[
        "get",
        "validatingadmissionpolicy",
        "splice-own-webhook-configurations-only",
    ])?;

    let deployments: Api<Deployment> = ns.api();
    let body: Deployment = serde_json::from_value(app_deployment("app", 1))?;
    deployments.create(&PostParams::default(), &body).await?;
    wait_until(
        Duration::from_secs(120),
        "the app Deployment to be available",
        || {
            let deployments = deployments.clone();
            async move {
                let d = deployments.get("app").await?;
                Ok(d.status.and_then(|s| s.available_replicas) == Some(1))
            }
        },
    )
    .await
    .with_context(|| {
        kubectl(&["-n", &ns.name, "get", "pods,events", "-o", "wide"]).unwrap_or_default()
    })?;

    let pods: Api<Pod> = ns.api();
    let pod = pods
        .list(&ListParams::default().labels("app=app"))
        .await?
        .items
        .into_iter()
        .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .context("no Running app pod")?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    ensure!(
        injected_once(&pod),
        "the pod's injection: {:?}",
        injected_counts(&pod)
    );
    ensure!(
        pod.spec.as_ref().and_then(|s| s.node_name.clone()) == Some(real_node(&client).await?),
        "the app pod is not on the real node"
    );
    let status = pod.status.clone().unwrap_or_default();
    let inits = status.init_container_statuses.unwrap_or_default();
    let init = inits
        .iter()
        .find(|s| s.name == INIT)
        .context("no init status")?;
    let exit = init
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    ensure!(
        exit == Some(0),
        "the injected init container ended with {exit:?}"
    );
    let sidecar = inits
        .iter()
        .find(|s| s.name == SIDECAR)
        .context("no sidecar status")?;
    ensure!(
        sidecar.started == Some(true)
            && sidecar
                .state
                .as_ref()
                .and_then(|s| s.running.as_ref())
                .is_some(),
        "the native sidecar is not running: {sidecar:?}"
    );

    // The application's own log: what it saw when it started.
    let log = pods
        .logs(
            &name,
            &LogParams {
                container: Some("app".into()),
                ..LogParams::default()
            },
        )
        .await?;
    ensure!(
        log.lines().any(|l| l == format!("env {ENV}={}", ns.name)),
        "the app did not see the injected env; its log:\n{log}"
    );
    // The init container wrote "exit <ns>", the sidecar "serve <ns>": both were on the volume
    // when the application started, the init container's first.
    let init_mark = log
        .lines()
        .find_map(|l| l.strip_prefix("file /splice/init: exit "))
        .and_then(|n| n.trim().parse::<i128>().ok());
    let sidecar_mark = log
        .lines()
        .find_map(|l| l.strip_prefix("file /splice/sidecar: serve "))
        .and_then(|n| n.trim().parse::<i128>().ok());
    let (Some(init_mark), Some(sidecar_mark)) = (init_mark, sidecar_mark) else {
        bail!(
            "the app did not see both marks on the injected volume at its start; its log:\n{log}"
        );
    };
    ensure!(
        init_mark < sidecar_mark,
        "the init container ({init_mark}) did not run before the sidecar ({sidecar_mark})"
    );
    let sidecar_log = pods
        .logs(
            &name,
            &LogParams {
                container: Some(SIDECAR.into()),
                ..LogParams::default()
            },
        )
        .await?;
    ensure!(
        sidecar_log.contains("serving on 9091"),
        "sidecar log:\n{sidecar_log}"
    );
    report(format!(
        "REPORT in-cluster: injected pod {name} Ready on the real node; init exited 0, sidecar started before the app"
    ));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_guard_counts_the_real_replicas_and_the_budget() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let policy = "incluster-guard";
    let (install, _ns, _policy) = installed_with_fail_policy(policy).await?;
    let client = install.client.clone();

    let scale = |n: i32| {
        let deployments = install.deployments();
        async move {
            deployments
                .patch(
                    "splice",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": n}})),
                )
                .await
        }
    };
    scale(1).await?;
    let down = wait_guard(
        &client,
        policy,
        "Ignore",
        |r| r == "InsufficientReplicas",
        Duration::from_secs(60),
    )
    .await?;
    scale(2).await?;
    install.wait_replicas_ready(2).await?;
    let up = fail_in_force(&client, policy).await?;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NAMESPACE);
    pdbs.delete("splice", &DeleteParams::default()).await?;
    let no_budget = wait_guard(
        &client,
        policy,
        "Ignore",
        |r| r == "NoDisruptionBudget",
        Duration::from_secs(60),
    )
    .await?;
    report(format!(
        "REPORT guard with real replicas: scaled to 1 -> Ignore in {down:.1}s; back to 2 -> Fail in {up:.1}s after both Ready (hold 60s); PDB deleted -> Ignore in {no_budget:.1}s"
    ));
    Ok(())
}

/// One create through the API server under load.
#[derive(Clone, Debug)]
struct Outcome {
    at: Instant,
    latency: Duration,
    /// None: admitted and injected exactly once; Some(why) otherwise.
    failure: Option<String>,
    real: bool,
}

/// Creates pods in `namespace` until `stop`: server-side dry runs every 50 ms (20/s, from two
/// workers) and a real pod (on the kwok nodes) every 3 s. Each admitted pod must carry the
/// injection exactly once.
fn start_load(
    client: &Client,
    namespace: &str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Outcome>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    tokio::spawn(async move {
        let outcomes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut workers = tokio::task::JoinSet::new();
        for worker in 0..3 {
            let pods = pods.clone();
            let stop = stop.clone();
            let outcomes = outcomes.clone();
            workers.spawn(async move {
                let mut n = 0u64;
                let period = if worker == 2 {
                    Duration::from_secs(3)
                } else {
                    Duration::from_millis(100)
                };
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    n += 1;
                    let real = worker == 2;
                    let name = format!("load-{worker}-{n}");
                    let params = PostParams {
                        dry_run: !real,
                        ..PostParams::default()
                    };
                    let at = Instant::now();
                    let result = pods.create(&params, &load_pod(&name)).await;
                    let latency = at.elapsed();
                    let failure = match result {
                        Ok(pod) if injected_once(&pod) => None,
                        Ok(pod) => {
                            Some(format!("{name} admitted with {:?}", injected_counts(&pod)))
                        }
                        Err(e) => Some(format!("{name}: {e}")),
                    };
                    if let Ok(mut all) = outcomes.lock() {
                        all.push(Outcome {
                            at,
                            latency,
                            failure,
                            real,
                        });
                    }
                }
            });
        }
        while workers.join_next().await.is_some() {}
        outcomes.lock().map(|v| v.clone()).unwrap_or_default()
    })
}

/// N, failures and p99 latency of the creates started in [from, to).
fn window(
    outcomes: &[Outcome],
    from: Instant,
    to: Instant,
) -> (usize, usize, usize, Duration, Vec<String>) {
    let mut in_window: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.at >= from && o.at < to)
        .collect();
    in_window.sort_by_key(|o| o.latency);
    let n = in_window.len();
    let p99 = in_window
        .get((n * 99).div_ceil(100).saturating_sub(1))
        .map(|o| o.latency)
        .unwrap_or_default();
    let failures: Vec<String> = in_window.iter().filter_map(|o| o.failure.clone()).collect();
    let real = in_window.iter().filter(|o| o.real).count();
    (n, real, failures.len(), p99, failures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_create_fails_while_splice_is_upgraded_evicted_killed_or_rotated() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let policy = "incluster-load";
    let (install, ns, _policy) = installed_with_fail_policy(policy).await?;
    let client = install.client.clone();
    wait_injecting(&client, &ns.name, &[], SIDECAR).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(&client, &ns.name, stop.clone());
    // Whether Fail stayed in force: the entry's failurePolicy, sampled every 250 ms.
    let sampler = {
        let client = client.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut not_fail = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                match guard_state(&client, policy).await {
                    Ok((reason, entry)) if entry != "Fail" => {
                        not_fail.push(format!("{entry} ({reason})"))
                    }
                    Ok(_) => {}
                    Err(e) => not_fail.push(format!("unreadable: {e}")),
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            not_fail
        })
    };
    let mut windows: Vec<(&str, Instant, Instant)> = Vec::new();
    tokio::time::sleep(Duration::from_secs(3)).await;

    // 1. helm upgrade rolls the Deployment (a changed pod annotation), one new pod at a time.
    let start = Instant::now();
    let upgrade = tokio::task::spawn_blocking(|| {
        helm(&[
            "upgrade",
            "splice",
            "deploy/chart",
            "-n",
            NAMESPACE,
            "--reuse-values",
            "--set",
            "podAnnotations.e2e\\.splice\\.dev/rolled=1",
            "--wait",
            "--timeout",
            "5m",
        ])
    });
    upgrade.await??;
    install.wait_replicas_ready(2).await?;
    install.wait_no_terminating().await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    windows.push(("helm upgrade", start, Instant::now()));
    fail_in_force(&client, policy).await?;

    // 2. One Splice pod evicted through the Eviction API (the budget allows one).
    let start = Instant::now();
    let victim = install
        .splice_pods()
        .await?
        .into_iter()
        .next()
        .context("no Splice pod")?;
    install
        .pods()
        .evict(
            &victim.metadata.name.clone().unwrap_or_default(),
            &EvictParams::default(),
        )
        .await?;
    install.wait_replicas_ready(2).await?;
    install.wait_no_terminating().await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    windows.push(("eviction", start, Instant::now()));
    fail_in_force(&client, policy).await?;

    // 3. The leader's pod deleted.
    let start = Instant::now();
    let leader = install.leader().await?;
    install
        .pods()
        .delete(&leader, &DeleteParams::default())
        .await?;
    wait_until(Duration::from_secs(60), "another leader", || {
        let leader = leader.clone();
        let install = &install;
        async move { Ok(install.leader().await.is_ok_and(|l| l != leader)) }
    })
    .await?;
    install.wait_replicas_ready(2).await?;
    install.wait_no_terminating().await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    windows.push(("leader pod deleted", start, Instant::now()));
    fail_in_force(&client, policy).await?;

    // 4. A CA rotation, through to its end (the old CA leaves the bundles).
    let start = Instant::now();
    let splice = splice_bin()?;
    run(&splice, &["rotate", "-n", NAMESPACE])?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let phase = |s: &Secret| {
        s.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("splice.dev/ca-rotation-phase").cloned())
            .unwrap_or_default()
    };
    wait_until(Duration::from_secs(60), "the rotation to start", || {
        let secrets = secrets.clone();
        async move { Ok(phase(&secrets.get("splice-ca").await?) != "Stable") }
    })
    .await?;
    wait_until(
        Duration::from_secs(180),
        "the rotation to end (Stable)",
        || {
            let secrets = secrets.clone();
            async move { Ok(phase(&secrets.get("splice-ca").await?) == "Stable") }
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    windows.push(("CA rotation", start, Instant::now()));

    stop.store(true, Ordering::Relaxed);
    let outcomes = load.await?;
    let not_fail = sampler.await?;
    ensure!(
        not_fail.is_empty(),
        "Fail was not in force throughout: {} samples saw {:?}",
        not_fail.len(),
        not_fail.first()
    );
    let mut failed = Vec::new();
    for (event, from, to) in &windows {
        let (n, real, failures, p99, why) = window(&outcomes, *from, *to);
        let secs = to.duration_since(*from).as_secs_f64();
        report(format!(
            "REPORT disruption '{event}': {failures} failed of {n} creates ({real} real pods) over {secs:.0}s, p99 {:.1} ms",
            p99.as_secs_f64() * 1000.0
        ));
        ensure!(
            n as f64 >= secs * 10.0 * 0.8,
            "'{event}': only {n} creates in {secs:.0}s (load fell below 10/s)"
        );
        if failures > 0 {
            failed.push(format!("{event}: {}", why.join("; ")));
        }
    }
    let (n, _, failures, _, why) = window(&outcomes, outcomes[0].at, Instant::now());
    ensure!(
        failed.is_empty() && failures == 0,
        "{failures} of {n} creates failed over the whole run: {}",
        why.join("; ")
    );
    drop(ns);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cluster_heals_after_both_splice_pods_are_deleted() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let policy = "incluster-heal";
    let (install, ns, _policy) = installed_with_fail_policy(policy).await?;
    let client = install.client.clone();
    wait_injecting(&client, &ns.name, &[], SIDECAR).await?;

    let pods: Api<Pod> = ns.api();
    // First as a rollout or a drain deletes pods (graceful: preStop, then SIGTERM), then as a
    // node loss does (no grace: the processes are killed at once).
    for (how, params) in [
        ("graceful", DeleteParams::default()),
        (
            "forced, grace 0",
            DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        ),
    ] {
        fail_in_force(&client, policy).await?;
        let victims: Vec<String> = install
            .splice_pods()
            .await?
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        ensure!(
            victims.len() == 2,
            "expected 2 Splice pods, found {victims:?}"
        );
        let start = Instant::now();
        for victim in &victims {
            install.pods().delete(victim, &params).await?;
        }
        // Creates go on: refused while no replica answers (Fail), never admitted without the
        // injection, and admitted with it again once a replica is back.
        let mut refused = 0usize;
        let mut first_refusal = None;
        let mut n = 0usize;
        let healed = loop {
            n += 1;
            let dry_run = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            match pods.create(&dry_run, &load_pod(&format!("heal-{n}"))).await {
                Ok(pod) if injected_once(&pod) => {
                    // Healed only once the deleted pods are gone and a new one is Ready, not
                    // while the old ones still drain or die.
                    let now: Vec<Pod> = install
                        .pods()
                        .list(&ListParams::default().labels("app.kubernetes.io/name=splice"))
                        .await?
                        .items;
                    let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
                    if now.iter().all(|p| !victims.contains(&name(p))) && now.iter().any(is_ready) {
                        break start.elapsed();
                    }
                }
                Ok(pod) => bail!(
                    "{how}: a pod was admitted without its injection while Splice was down: {:?}",
                    injected_counts(&pod)
                ),
                Err(e) => {
                    refused += 1;
                    // The API server's message, without the Status it repeats it in.
                    first_refusal
                        .get_or_insert_with(|| e.to_string().chars().take(200).collect::<String>());
                }
            }
            ensure!(
                start.elapsed() < Duration::from_secs(120),
                "{how}: creates did not succeed with the injection within 2 minutes ({refused} refused)"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        install.wait_replicas_ready(2).await?;
        report(format!(
            "REPORT heal ({how}): both Splice pods deleted; injected creates again after {:.1}s; {refused} of {n} creates refused meanwhile (first: {}), none admitted without the injection",
            healed.as_secs_f64(),
            first_refusal.as_deref().unwrap_or("none")
        ));
    }
    Ok(())
}

/// Every admission object labelled as Splice's.
fn splice_admission_objects() -> Result<String> {
    kubectl(&[
        "get",
        "mutatingwebhookconfigurations,validatingwebhookconfigurations,mutatingadmissionpolicies,mutatingadmissionpolicybindings",
        "-l",
        "app.kubernetes.io/managed-by=splice",
        "-o",
        "name",
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uninstalling_leaves_no_admission_configuration_and_injected_pods_keep_running()
-> Result<()> {
    let _serial = SERIAL.lock().await;
    for via in [Via::Helm, Via::Kustomize] {
        let mut install = match via {
            Via::Helm => Installed::helm(&[]).await?,
            Via::Kustomize => Installed::kustomize().await?,
        };
        let client = install.client.clone();
        let key = format!("incluster-{}", splice_e2e::unique_suffix());
        let ns = TestNamespace::create("incluster-uninstall", &[(key.as_str(), "on")]).await?;
        // One policy through the webhook, one in-tree, so both kinds of configuration exist.
        let webhook = TestPolicy::apply(
            &client,
            "incluster-uninstall",
            injecting_policy(&key, "Ignore"),
        )
        .await?;
        let mut intree_spec = injecting_policy(&key, "Ignore");
        intree_spec["mode"] = json!("InTree");
        intree_spec["template"] = json!({"labels": {"incluster.splice.dev/intree": "yes"}});
        let intree = TestPolicy::apply(&client, "incluster-uninstall-intree", intree_spec).await?;
        let deployments: Api<Deployment> = ns.api();
        let body: Deployment = serde_json::from_value(app_deployment("app", 1))?;
        deployments.create(&PostParams::default(), &body).await?;
        wait_until(
            Duration::from_secs(120),
            "the app Deployment to be available",
            || {
                let deployments = deployments.clone();
                async move {
                    Ok(deployments
                        .get("app")
                        .await?
                        .status
                        .and_then(|s| s.available_replicas)
                        == Some(1))
                }
            },
        )
        .await?;
        let before = splice_admission_objects()?;
        ensure!(
            before.contains("mutatingwebhookconfiguration"),
            "no webhook configuration before: {before}"
        );
        ensure!(
            before.contains("mutatingadmissionpolic"),
            "no admission policy before: {before}"
        );
        let pods: Api<Pod> = ns.api();
        let running = pods
            .list(&ListParams::default().labels("app=app"))
            .await?
            .items;
        ensure!(
            running.len() == 1 && injected_once(&running[0]),
            "the app pod is not injected"
        );
        let app_pod = running[0].metadata.name.clone().unwrap_or_default();

        // helm: the hook stops Splice and deletes what it wrote; the policies stay. kustomize:
        // deleting the base deletes the CRD and so the policies; the garbage collector then
        // removes what they owned.
        install.uninstall().await?;
        wait_until(
            Duration::from_secs(60),
            "no Splice admission objects",
            || async { Ok(splice_admission_objects()?.trim().is_empty()) },
        )
        .await
        .with_context(|| format!("left: {}", splice_admission_objects().unwrap_or_default()))?;
        // The injected pod keeps running: the same pod, Ready, no restart.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let pod = pods.get(&app_pod).await?;
        let status = pod.status.unwrap_or_default();
        ensure!(
            status.phase.as_deref() == Some("Running"),
            "the app pod is {:?}",
            status.phase
        );
        let restarts: i32 = status
            .container_statuses
            .unwrap_or_default()
            .iter()
            .map(|c| c.restart_count)
            .sum();
        ensure!(
            restarts == 0,
            "the app pod's containers restarted {restarts} times"
        );
        report(format!(
            "REPORT uninstall ({}): no admission object left; injected pod {app_pod} still Running",
            if via == Via::Helm {
                "helm uninstall"
            } else {
                "kubectl delete -k"
            }
        ));
        drop((webhook, intree, ns));
    }
    Ok(())
}
