//! The availability guard against the real control plane: a real Deployment (pods on kwok nodes,
//! so availableReplicas is computed by the real deployment controller) and real
//! PodDisruptionBudgets decide whether a policy's `failurePolicy: Fail` is put in force; and what
//! each failure policy means once the webhook process is gone.

#[path = "../src/operator.rs"]
mod operator;

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use operator::*;
use serde_json::{Value, json};
use splice_crds::InjectionPolicy;
use splice_e2e::{TestNamespace, unique_suffix, wait_until};

/// Short, so the suite stays quick; the default is 60 s.
const HOLD: Duration = Duration::from_secs(5);
/// The issue's bound on noticing a change.
const REACTION: Duration = Duration::from_secs(10);
const POD_LABEL: (&str, &str) = ("app.kubernetes.io/name", "splice-guard");

struct Setup {
    client: Client,
    policy: String,
    splice: Splice,
    _cleanup: PolicyCleanup,
    app_ns: TestNamespace,
    splice_ns: TestNamespace,
}

impl Setup {
    /// Splice's namespace with its Deployment (2 replicas) and a PDB keeping one; `splice run`
    /// reading them; an app namespace and a policy requesting Fail that selects it.
    async fn start(prefix: &str) -> Result<Self> {
        let client = splice_e2e::client().await?;
        install_crd(&client).await?;
        let instance = format!("{prefix}-{}", unique_suffix());
        let splice_ns = TestNamespace::create("e2e-guard", &[]).await?;
        apply_deployment(&splice_ns, 2).await?;
        apply_budget(&splice_ns, json!(1)).await?;
        wait_available(&splice_ns, 2).await?;

        let cleanup = PolicyCleanup {
            instance: instance.clone(),
        };
        let mut options = SpliceOptions::new(&splice_ns.name, &instance);
        // Short, so a restarted Splice takes over the Lease of a killed one quickly.
        options.lease = Some((4, 3, 1));
        options.extra_args = vec![
            "--deployment-name".into(),
            "splice".into(),
            "--fail-closed-hold".into(),
            format!("{}s", HOLD.as_secs()),
        ];
        let splice = Splice::start(options).await?;
        let app_ns = TestNamespace::create("e2e-guard-app", &[(&instance, "on")]).await?;
        let policy = format!("{instance}-strict");
        apply_policy(
            &client,
            &instance,
            &policy,
            json!({
                "namespaceSelector": {"matchLabels": {&instance: "on"}},
                "failurePolicy": "Fail",
                "template": {"containers": [{"name": "proxy", "image": "registry.invalid/proxy:1"}]}
            }),
        )
        .await?;
        Ok(Setup {
            client,
            policy,
            splice,
            _cleanup: cleanup,
            app_ns,
            splice_ns,
        })
    }

    /// Waits until the policy's webhook is written with `failure_policy` and FailClosed says
    /// `reason`; returns how long that took.
    async fn wait_guard(
        &self,
        failure_policy: &str,
        reason: &str,
        timeout: Duration,
    ) -> Result<Duration> {
        let started = Instant::now();
        let api: Api<InjectionPolicy> = Api::all(self.client.clone());
        loop {
            let written = configuration(&self.client, &self.policy)
                .await?
                .and_then(|c| c.webhooks.unwrap_or_default().first().cloned())
                .and_then(|w| w.failure_policy);
            let p = api.get(&self.policy).await?;
            let fc = condition(&p, "FailClosed").cloned();
            let expected_status = if failure_policy == "Fail" {
                "True"
            } else {
                "False"
            };
            if written.as_deref() == Some(failure_policy)
                && fc
                    .as_ref()
                    .is_some_and(|c| c.reason == reason && c.status == expected_status)
            {
                return Ok(started.elapsed());
            }
            let last = format!(
                "webhook failurePolicy {written:?}, FailClosed {:?}",
                fc.map(|c| (c.status, c.reason, c.message))
            );
            if started.elapsed() > timeout {
                bail!(
                    "within {timeout:?}, policy {} did not reach {failure_policy}/{reason}; last: {last}",
                    self.policy
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The FailClosed condition's reason now.
    async fn reason_now(&self) -> Result<String> {
        let api: Api<InjectionPolicy> = Api::all(self.client.clone());
        let p = api.get(&self.policy).await?;
        Ok(condition(&p, "FailClosed")
            .map(|c| c.reason.clone())
            .unwrap_or_default())
    }
}

fn deployment_body(namespace: &str, replicas: i32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "splice", "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {POD_LABEL.0: POD_LABEL.1}},
            "template": {
                "metadata": {"labels": {POD_LABEL.0: POD_LABEL.1}},
                "spec": {"containers": [{"name": "splice", "image": "registry.invalid/splice:1"}]}
            }
        }
    })
}

async fn apply_deployment(ns: &TestNamespace, replicas: i32) -> Result<()> {
    ns.api::<Deployment>()
        .patch(
            "splice",
            &PatchParams::apply(TEST_MANAGER).force(),
            &Patch::Apply(deployment_body(&ns.name, replicas)),
        )
        .await
        .context("applying Splice's Deployment")?;
    Ok(())
}

/// The budget `splice` selecting the Deployment's pods with `minAvailable: min_available`.
async fn apply_budget(ns: &TestNamespace, min_available: Value) -> Result<()> {
    let body = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "splice", "namespace": ns.name},
        "spec": {
            "minAvailable": min_available,
            "selector": {"matchLabels": {POD_LABEL.0: POD_LABEL.1}}
        }
    });
    ns.api::<PodDisruptionBudget>()
        .patch(
            "splice",
            &PatchParams::apply(TEST_MANAGER).force(),
            &Patch::Apply(body),
        )
        .await
        .context("applying the PodDisruptionBudget")?;
    Ok(())
}

async fn wait_available(ns: &TestNamespace, replicas: i32) -> Result<()> {
    let api = ns.api::<Deployment>();
    wait_until(
        Duration::from_secs(60),
        &format!("{replicas} available replicas"),
        || {
            let api = api.clone();
            async move {
                let d = api.get("splice").await?;
                Ok(d.status.and_then(|s| s.available_replicas).unwrap_or(0) == replicas)
            }
        },
    )
    .await
}

/// Warning Events on the policy with `reason`.
async fn events_with_reason(client: &Client, policy: &str, reason: &str) -> Result<usize> {
    let events: Api<Event> = Api::all(client.clone());
    let list = events
        .list(&ListParams::default().fields(&format!("regarding.name={policy}")))
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .count())
}

#[tokio::test]
async fn fail_is_in_force_only_with_two_available_replicas_and_a_budget_and_returns_after_the_hold()
-> Result<()> {
    let s = Setup::start("guard").await?;
    // 2 available replicas + a PDB keeping one: Fail once the hold has passed.
    s.wait_guard("Fail", "FailInForce", HOLD + REACTION).await?;
    let text = s.splice.metrics().await?;
    assert_eq!(
        metric_value(&text, r#"splice_availability_guard{reason="available"}"#).as_deref(),
        Some("1"),
        "{text}"
    );

    // Scaled to 1: Ignore within 10 s, with the reason, an Event and the metric.
    apply_deployment(&s.splice_ns, 1).await?;
    let took = s
        .wait_guard("Ignore", "InsufficientReplicas", REACTION)
        .await?;
    eprintln!("scaled to 1 -> Ignore after {took:?}");
    wait_until(
        Duration::from_secs(10),
        "a Warning Event naming InsufficientReplicas",
        || async {
            Ok(events_with_reason(&s.client, &s.policy, "InsufficientReplicas").await? > 0)
        },
    )
    .await?;
    let text = s.splice.metrics().await?;
    assert_eq!(
        metric_value(
            &text,
            r#"splice_availability_guard{reason="insufficient_replicas"}"#
        )
        .as_deref(),
        Some("1")
    );
    assert_eq!(
        metric_value(&text, r#"splice_availability_guard{reason="available"}"#).as_deref(),
        Some("0")
    );

    // Back to 2: still Ignore while the hold runs, Fail after it.
    apply_deployment(&s.splice_ns, 2).await?;
    wait_available(&s.splice_ns, 2).await?;
    let available_at = Instant::now();
    s.wait_guard("Ignore", "HoldingBeforeFail", REACTION)
        .await?;
    let took = s.wait_guard("Fail", "FailInForce", HOLD + REACTION).await?;
    let since_available = available_at.elapsed();
    eprintln!("restored -> Fail {since_available:?} after 2 replicas were available");
    ensure!(
        since_available + Duration::from_millis(500) >= HOLD,
        "Fail came back after {since_available:?} (wait {took:?}), before the {HOLD:?} hold"
    );

    // A budget that keeps none: Ignore.
    apply_budget(&s.splice_ns, json!(0)).await?;
    s.wait_guard("Ignore", "DisruptionBudgetAllowsZero", REACTION)
        .await?;
    apply_budget(&s.splice_ns, json!("50%")).await?;
    s.wait_guard("Fail", "FailInForce", HOLD + REACTION).await?;

    // No budget at all: Ignore; restored: Fail after the hold.
    s.splice_ns
        .api::<PodDisruptionBudget>()
        .delete("splice", &DeleteParams::default())
        .await?;
    let took = s
        .wait_guard("Ignore", "NoDisruptionBudget", REACTION)
        .await?;
    eprintln!("PDB deleted -> Ignore after {took:?}");
    apply_budget(&s.splice_ns, json!(1)).await?;
    let restored_at = Instant::now();
    s.wait_guard("Fail", "FailInForce", HOLD + REACTION).await?;
    ensure!(restored_at.elapsed() + Duration::from_millis(500) >= HOLD);
    Ok(())
}

/// A pod that Splice's policy would select, in the app namespace.
fn app_pod(name: &str) -> Pod {
    pod(name, &[])
}

async fn create_in(client: &Client, namespace: &str, name: &str) -> Result<Pod, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.create(&PostParams::default(), &app_pod(name)).await
}

/// kube-system and Splice's own namespace are excluded from every webhook: pods there are created
/// whatever the failure policy and whether or not Splice answers.
async fn excluded_namespaces_still_work(s: &Setup, tag: &str) -> Result<()> {
    let name = format!("guard-{tag}-{}", unique_suffix());
    for ns in ["kube-system", s.splice_ns.name.as_str()] {
        let created = create_in(&s.client, ns, &name)
            .await
            .with_context(|| format!("creating a pod in {ns} while Splice is down"))?;
        assert_eq!(container_names(&created), vec!["app"], "{ns}");
        let pods: Api<Pod> = Api::namespaced(s.client.clone(), ns);
        let _ = pods
            .delete(&name, &DeleteParams::default().grace_period(0))
            .await;
    }
    Ok(())
}

#[tokio::test]
async fn with_the_webhook_process_gone_fail_rejects_naming_the_policy_and_ignore_admits_without_injection()
-> Result<()> {
    // Fail in force, then the process dies.
    let mut s = Setup::start("down-fail").await?;
    s.wait_guard("Fail", "FailInForce", HOLD + REACTION).await?;
    // The API server must be calling the webhook (it loads configurations asynchronously).
    wait_injecting(&s.client, &s.app_ns.name, &[], "proxy").await?;
    s.splice.kill();
    let deadline = Instant::now() + Duration::from_secs(20);
    let rejection = loop {
        match create_in(
            &s.client,
            &s.app_ns.name,
            &format!("rejected-{}", unique_suffix()),
        )
        .await
        {
            Err(kube::Error::Api(status)) => break status.message,
            Err(e) => return Err(e.into()),
            // The API server may still hold a connection that answered; try again.
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Ok(_) => {
                bail!("pods were still admitted 20 s after Splice was killed with Fail in force")
            }
        }
    };
    eprintln!("rejected with: {rejection}");
    assert!(
        rejection.contains(&format!("{}.splice.dev", s.policy)),
        "the rejection names the policy's webhook: {rejection}"
    );
    excluded_namespaces_still_work(&s, "fail").await?;
    drop(s);

    // Ignore in force (no budget), then the process dies.
    let mut s = Setup::start("down-ignore").await?;
    s.wait_guard("Fail", "FailInForce", HOLD + REACTION).await?;
    s.splice_ns
        .api::<PodDisruptionBudget>()
        .delete("splice", &DeleteParams::default())
        .await?;
    s.wait_guard("Ignore", "NoDisruptionBudget", REACTION)
        .await?;
    wait_injecting(&s.client, &s.app_ns.name, &[], "proxy").await?;
    s.splice.kill();
    // Until the API server has noticed the process is gone a create may still be injected, so
    // wait for the first one that is not; none may be rejected.
    let pods: Api<Pod> = s.app_ns.api();
    let mut admitted = None;
    let deadline = Instant::now() + Duration::from_secs(20);
    while admitted.is_none() && Instant::now() < deadline {
        let created = pods
            .create(
                &PostParams::default(),
                &app_pod(&format!("admitted-{}", unique_suffix())),
            )
            .await
            .context("with Ignore in force and Splice down, a pod create must succeed")?;
        if container_names(&created) == vec!["app"] {
            admitted = Some(created);
        }
    }
    let admitted = admitted.context("no pod was admitted without injection within 20 s")?;
    assert!(
        admitted
            .annotations()
            .get(splice_crds::STATUS_ANNOTATION)
            .is_none(),
        "not injected, so no provenance"
    );
    excluded_namespaces_still_work(&s, "ignore").await?;
    assert_eq!(s.reason_now().await?, "NoDisruptionBudget");
    Ok(())
}

#[tokio::test]
async fn a_restarted_splice_keeps_fail_in_force_without_a_detour_through_ignore() -> Result<()> {
    let mut s = Setup::start("restart").await?;
    s.wait_guard("Fail", "FailInForce", HOLD + REACTION).await?;

    // Watch the written failure policy through the whole restart.
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let client = s.client.clone();
    let policy = s.policy.clone();
    let watcher = tokio::spawn(async move {
        let mut seen = Vec::new();
        loop {
            if let Ok(Some(c)) = configuration(&client, &policy).await {
                let hook = c.webhooks.unwrap_or_default().first().cloned();
                seen.push((
                    hook.as_ref().and_then(|h| h.failure_policy.clone()),
                    hook.and_then(|h| h.client_config.url),
                ));
            }
            tokio::select! {
                _ = stop_rx.changed() => return seen,
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    });
    let mut options = s.splice.options.clone();
    options.port = None;
    options.log_name = format!("{}-restarted", options.log_name);
    s.splice.kill();
    s.splice = Splice::start(options).await?;
    // The new process has reconciled once the configuration points at its own port.
    let new_url = format!("https://127.0.0.1:{}/", s.splice.port);
    wait_until(
        Duration::from_secs(30),
        "the new Splice to rewrite the configuration",
        || async {
            Ok(configuration(&s.client, &s.policy)
                .await?
                .and_then(|c| c.webhooks.unwrap_or_default().first().cloned())
                .and_then(|h| h.client_config.url)
                .is_some_and(|u| u.starts_with(&new_url)))
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_tx.send_replace(true);
    let seen = watcher.await?;
    ensure!(seen.len() > 20, "too few observations: {}", seen.len());
    let ignored: Vec<_> = seen
        .iter()
        .filter(|(fp, _)| fp.as_deref() != Some("Fail"))
        .collect();
    ensure!(
        ignored.is_empty(),
        "the webhook left Fail during the restart: {ignored:?}"
    );
    assert_eq!(s.reason_now().await?, "FailInForce");
    Ok(())
}
