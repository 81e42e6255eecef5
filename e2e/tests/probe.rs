//! The admission probe against the real control plane: a policy whose injection the cluster's
//! validating admission refuses (Pod Security `restricted`, a ValidatingAdmissionPolicy) is
//! reported `RejectedByAdmission`, a webhook the API server cannot reach `NotInjected`, and the
//! ValidatingAdmissionPolicy shipped in deploy/ refuses any real pod create by Splice's
//! ServiceAccount while letting its dry runs through.
//!
//! Each test runs its own `splice run` with `--probe-interval 2s` and namespaces labelled for it.

#[path = "../src/operator.rs"]
mod operator;

use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, PostParams};
use operator::*;
use serde_json::{Value, json};
use splice_crds::InjectionPolicy;
use splice_e2e::{TestNamespace, dry_run, free_port, unique_suffix, wait_until};

/// How long a test waits for a verdict: many probe intervals, so a slow machine never fails it;
/// the probe itself reports within two intervals of a change.
const VERDICT_WAIT: Duration = Duration::from_secs(90);
const RESTRICTED: (&str, &str) = ("pod-security.kubernetes.io/enforce", "restricted");

/// One test's Splice, probing every 2 s. `url_port`: a port for `--webhook-url` other than the
/// one Splice listens on.
async fn probed(prefix: &str, url_port: Option<u16>) -> Result<Setup> {
    Setup::start_configured(prefix, |options| {
        options.url_port = url_port;
        options.extra_args = vec!["--probe-interval".into(), "2s".into()];
    })
    .await
}

/// Waits until the Verified condition has `reason` at the policy's current generation.
async fn verdict(s: &Setup, name: &str, reason: &str) -> Result<(InjectionPolicy, Condition)> {
    let api: Api<InjectionPolicy> = Api::all(s.client.clone());
    let deadline = tokio::time::Instant::now() + VERDICT_WAIT;
    loop {
        let p = api.get(name).await?;
        if let Some(c) = condition(&p, "Verified")
            && c.reason == reason
            && c.observed_generation == p.metadata.generation
        {
            let c = c.clone();
            return Ok((p, c));
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "policy {name}: no Verified={reason} within {VERDICT_WAIT:?}; last status: {:?}; see {}",
                p.status,
                s.splice.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// An init container adding NET_ADMIN: allowed in the policy (allowPrivileged), refused by Pod
/// Security `restricted` in the pod.
fn net_admin_spec(instance: &str) -> Value {
    json!({
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "allowPrivileged": true,
        "template": {"initContainers": [{
            "name": "probe-init",
            "image": "registry.invalid/init:1",
            "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}
        }]}
    })
}

/// The same init container as `restricted` wants it.
fn restricted_spec(instance: &str) -> Value {
    json!({
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "template": {"initContainers": [{
            "name": "probe-init",
            "image": "registry.invalid/init:1",
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}
        }]}
    })
}

#[tokio::test]
async fn a_net_admin_init_container_in_a_restricted_namespace_is_rejected_by_admission_until_the_policy_is_fixed()
-> Result<()> {
    let s = probed("probe-psa", None).await?;
    let ns = TestNamespace::create("e2e-restricted", &[(&s.instance, "on"), RESTRICTED]).await?;
    let name = s.policy("netadmin");
    s.apply(&name, net_admin_spec(&s.instance)).await?;
    wait_policy(&s.client, &name, "True", Duration::from_secs(60)).await?;

    let (p, c) = verdict(&s, &name, "RejectedByAdmission").await?;
    println!("Verified: {}: {}", c.reason, c.message);
    assert_eq!(c.status, "False");
    for needle in [
        ns.name.as_str(),
        "\"probe-init\"",
        "NET_ADMIN",
        "PodSecurity",
    ] {
        assert!(
            c.message.contains(needle),
            "{needle} missing: {}",
            c.message
        );
    }
    // The probe pod's unique name is left out, so the next probe's refusal reads the same.
    assert!(!c.message.contains("splice-probe-"), "{}", c.message);
    let probe = p
        .status
        .and_then(|s| s.probe)
        .context("status.probe missing")?;
    assert_eq!(probe.result, "RejectedByAdmission");
    assert_eq!(probe.affected_namespaces, std::slice::from_ref(&ns.name));
    assert!(probe.namespaces.contains(&ns.name), "{probe:?}");
    wait_until(
        Duration::from_secs(30),
        "a Warning Event RejectedByAdmission",
        || async { Ok(warning_events(&s.client, &name, "RejectedByAdmission").await? > 0) },
    )
    .await?;

    s.apply(&name, restricted_spec(&s.instance)).await?;
    let (p, c) = verdict(&s, &name, "Verified").await?;
    assert_eq!(c.status, "True");
    assert!(c.message.contains(&ns.name), "{}", c.message);
    let probe = p
        .status
        .and_then(|s| s.probe)
        .context("status.probe missing")?;
    assert!(probe.affected_namespaces.is_empty(), "{probe:?}");
    assert!(probe.latency.is_some_and(|l| l.samples > 0), "{probe:?}");
    let metrics = s.splice.metrics().await?;
    assert!(
        metrics.contains(&format!(
            "splice_probe_total{{policy=\"{name}\",result=\"RejectedByAdmission\"}}"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "splice_probe_duration_seconds_count{{policy=\"{name}\"}}"
        )),
        "{metrics}"
    );

    // A paused policy injects nothing, so there is nothing to verify: the results go.
    let mut paused = restricted_spec(&s.instance);
    paused["paused"] = json!(true);
    s.apply(&name, paused).await?;
    let api: Api<InjectionPolicy> = Api::all(s.client.clone());
    wait_until(
        VERDICT_WAIT,
        "the probe's results to leave the paused policy",
        || async {
            let p = api.get(&name).await?;
            Ok(condition(&p, "Verified").is_none() && p.status.and_then(|s| s.probe).is_none())
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_webhook_the_api_server_cannot_reach_is_reported_not_injected() -> Result<()> {
    // The webhook configuration names a port nothing listens on; the leader keeps running.
    let s = probed("probe-unreachable", Some(free_port()?)).await?;
    let ns = TestNamespace::create("e2e-app", &[(&s.instance, "on")]).await?;
    let name = s.policy("mesh");
    s.apply(
        &name,
        json!({
            "namespaceSelector": {"matchLabels": {&s.instance: "on"}},
            "template": {"containers": [{"name": "proxy", "image": "registry.invalid/proxy:1"}]}
        }),
    )
    .await?;
    // Ready never turns True: the reconcile's own dry-run pod shows the API server admitting
    // pods without the injection, and after 30 s Ready says so.
    let not_ready = wait_policy(&s.client, &name, "False", Duration::from_secs(60)).await?;
    let ready = condition(&not_ready, "Ready").context("Ready")?;
    ensure!(
        ready.reason == "AwaitingEnforcement" || ready.reason == "NotEnforced",
        "{ready:?}"
    );
    wait_until(
        Duration::from_secs(60),
        "Ready=False NotEnforced",
        || async {
            let p = Api::<InjectionPolicy>::all(s.client.clone())
                .get(&name)
                .await?;
            Ok(condition(&p, "Ready").is_some_and(|c| {
                c.reason == "NotEnforced" && c.message.contains("came back without the injection")
            }))
        },
    )
    .await?;

    let (p, c) = verdict(&s, &name, "NotInjected").await?;
    println!("Verified: {}: {}", c.reason, c.message);
    assert_eq!(c.status, "False");
    assert!(c.message.contains(&ns.name), "{}", c.message);
    // Under failurePolicy Ignore the API server admits the pod and says nothing about the call.
    assert!(c.message.contains("not reached"), "{}", c.message);
    let probe = p
        .status
        .and_then(|s| s.probe)
        .context("status.probe missing")?;
    assert_eq!(probe.affected_namespaces, std::slice::from_ref(&ns.name));

    // `splice explain` shows it for the policies of any pod.
    ns.api::<Pod>()
        .create(&PostParams::default(), &pod("web", &[]))
        .await?;
    let out = tokio::process::Command::new(splice_bin()?)
        .args(["explain", "web", "-n", &ns.name, "-o", "json"])
        .env("KUBECONFIG", splice_e2e::kubeconfig_path())
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "splice explain: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout)?;
    let ours = report["policies"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name.as_str()))
        .with_context(|| format!("no policy {name} in {report:#}"))?;
    assert_eq!(ours["probe"]["reason"], "NotInjected", "{ours:#}");
    assert_eq!(ours["probe"]["verified"], "False", "{ours:#}");
    Ok(())
}

/// Deletes a ValidatingAdmissionPolicy and its binding (same name) when dropped.
struct VapGuard(String);

impl Drop for VapGuard {
    fn drop(&mut self) {
        let name = self.0.clone();
        splice_e2e::in_fresh_runtime(move |client| async move {
            let _ = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
                .delete(&name, &DeleteParams::default())
                .await;
            let _ = Api::<ValidatingAdmissionPolicy>::all(client)
                .delete(&name, &DeleteParams::default())
                .await;
        });
    }
}

#[tokio::test]
async fn a_validating_admission_policy_refusing_a_label_the_policy_injects_is_named_in_rejected_by_admission()
-> Result<()> {
    let s = probed("probe-vap", None).await?;
    let ns = TestNamespace::create("e2e-app", &[(&s.instance, "on")]).await?;
    let vap = format!("e2e-refuse-{}", unique_suffix());
    let _guard = VapGuard(vap.clone());
    let label = "e2e.splice.dev/refused";
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": vap},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["pods"]
            }]},
            "validations": [{
                "expression": format!("!has(object.metadata.labels) || !('{label}' in object.metadata.labels)"),
                "message": format!("pods labelled {label} are refused by {vap}")
            }]
        }
    }))?;
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": vap},
        "spec": {
            "policyName": vap,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {&s.instance: "on"}}}
        }
    }))?;
    Api::<ValidatingAdmissionPolicy>::all(s.client.clone())
        .create(&PostParams::default(), &policy)
        .await?;
    Api::<ValidatingAdmissionPolicyBinding>::all(s.client.clone())
        .create(&PostParams::default(), &binding)
        .await?;

    let name = s.policy("labels");
    s.apply(
        &name,
        json!({
            "namespaceSelector": {"matchLabels": {&s.instance: "on"}},
            "template": {"labels": {label: "yes"}}
        }),
    )
    .await?;
    wait_policy(&s.client, &name, "True", Duration::from_secs(60)).await?;

    let (p, c) = verdict(&s, &name, "RejectedByAdmission").await?;
    println!("Verified: {}: {}", c.reason, c.message);
    assert_eq!(c.status, "False");
    assert!(c.message.contains(&ns.name), "{}", c.message);
    assert!(
        c.message
            .contains(&format!("pods labelled {label} are refused by {vap}")),
        "{}",
        c.message
    );
    let probe = p
        .status
        .and_then(|s| s.probe)
        .context("status.probe missing")?;
    assert_eq!(probe.affected_namespaces, std::slice::from_ref(&ns.name));
    Ok(())
}

#[tokio::test]
async fn the_shipped_guard_refuses_a_real_pod_create_by_splices_service_account_but_not_its_dry_runs()
-> Result<()> {
    let client = splice_e2e::client().await?;
    kubectl(&["apply", "-f", "deploy/namespace.yaml"])?;
    kubectl(&["apply", "-f", "deploy/rbac.yaml"])?;
    kubectl(&["apply", "-f", "deploy/probe-guard.yaml"])?;
    let ns = TestNamespace::create("e2e-guard", &[]).await?;
    let splice = as_splice_service_account().await?;
    let pods: Api<Pod> = Api::namespaced(splice, &ns.name);
    let admin_pods: Api<Pod> = Api::namespaced(client, &ns.name);
    let pod = pod("real", &[]);

    // The RBAC lets the probe's dry runs through, and the guard does not refuse them.
    wait_until(
        Duration::from_secs(30),
        "a dry-run create by Splice's ServiceAccount to be admitted",
        || async { Ok(pods.create(&dry_run(), &pod).await.is_ok()) },
    )
    .await?;

    // The API server loads a new ValidatingAdmissionPolicy asynchronously: until it does, a real
    // create goes through, and is undone before trying again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let refusal = loop {
        match pods.create(&PostParams::default(), &pod).await {
            Err(kube::Error::Api(s)) => break s,
            Err(e) => return Err(e.into()),
            Ok(_) => {
                admin_pods
                    .delete("real", &DeleteParams::default().grace_period(0))
                    .await?;
                wait_until(Duration::from_secs(30), "the pod to be gone", || async {
                    Ok(admin_pods.get_opt("real").await?.is_none())
                })
                .await?;
            }
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the guard never refused a real create"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(refusal.code, 403, "{refusal:?}");
    assert!(
        refusal.message.contains("splice-probe-dry-run-only"),
        "{}",
        refusal.message
    );
    assert!(admin_pods.get_opt("real").await?.is_none());
    // Still: a dry run by the same account is admitted.
    pods.create(&dry_run(), &pod).await?;
    // And another account is not concerned: the admin creates the pod for real.
    admin_pods.create(&PostParams::default(), &pod).await?;
    Ok(())
}
