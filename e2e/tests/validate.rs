//! Splice's validating webhook for InjectionPolicies on the real control plane: what the compiler
//! refuses is refused at apply time (naming the field), what it warns about is admitted with a
//! warning kubectl prints, and a Deployment's pods get what the README says for a template that
//! reads `pod.metadata.name`.
//!
//! Each test runs its own `splice run` (own namespace, so its own ValidatingWebhookConfiguration,
//! whose objectSelector is the test's instance label).

#[path = "../src/operator.rs"]
mod operator;

use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use operator::*;
use serde_json::{Value, json};
use splice_crds::{InjectionPolicy, PodSecurityLevel};
use splice_e2e::{dry_run, wait_until};

/// One test's Splice (the shared [`Setup`]), once the API server calls its validating webhook.
struct Validated(Setup);

impl std::ops::Deref for Validated {
    type Target = Setup;
    fn deref(&self) -> &Setup {
        &self.0
    }
}

impl Validated {
    async fn start(prefix: &str) -> Result<Self> {
        let s = Validated(Setup::start(prefix).await?);
        s.wait_validating().await?;
        Ok(s)
    }

    /// Server-side apply of the policy, dry run or not: the API server's answer.
    async fn apply(&self, name: &str, spec: &Value, dry: bool) -> Result<InjectionPolicy, String> {
        try_apply_policy(&self.client, &self.instance, name, spec, dry).await
    }

    /// The API server loads webhook configurations asynchronously: waits until a dry-run apply
    /// of a policy with an undefined value is refused, which only Splice refuses.
    async fn wait_validating(&self) -> Result<()> {
        let name = self.policy("probe");
        let spec = undefined_value_spec(&self.instance);
        wait_until(
            Duration::from_secs(60),
            "the validating webhook to be called",
            || async {
                Ok(self
                    .apply(&name, &spec, true)
                    .await
                    .is_err_and(|m| m.contains("denied the request")))
            },
        )
        .await
    }

    /// Runs the control plane's own kubectl with `args`, `stdin` as input; (success, stderr).
    fn kubectl(&self, args: &[&str], stdin: &str) -> Result<(bool, String)> {
        use std::io::Write;
        let bin = splice_e2e::controlplane_bin_dir()?.join("kubectl");
        let mut child = std::process::Command::new(&bin)
            .args(args)
            .env("KUBECONFIG", splice_e2e::kubeconfig_path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .with_context(|| format!("running {}", bin.display()))?;
        child
            .stdin
            .take()
            .context("kubectl's stdin")?
            .write_all(stdin.as_bytes())?;
        let out = child.wait_with_output()?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }
}

impl Drop for Validated {
    fn drop(&mut self) {
        // The configuration is owned by the CRD, which outlives the test: remove this instance's.
        let name = format!("splice-validate-{}", self.splice_ns.name);
        self.0.splice.kill();
        splice_e2e::in_fresh_runtime(move |client| async move {
            let _ = Api::<ValidatingWebhookConfiguration>::all(client)
                .delete(&name, &DeleteParams::default())
                .await;
        });
    }
}

fn sidecar_spec(instance: &str, env_value: &str) -> Value {
    json!({
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "template": {"containers": [{"name": "sidecar", "image": "registry.invalid/sidecar:1",
            "env": [{"name": "POD", "value": env_value}]}]}
    })
}

fn undefined_value_spec(instance: &str) -> Value {
    sidecar_spec(instance, "{{ values.nope }}")
}

#[tokio::test]
async fn a_live_policy_edited_to_an_undefined_value_is_refused_at_apply_with_the_field_path()
-> Result<()> {
    let s = Validated::start("val-undef").await?;
    let name = s.policy("mesh");
    s.apply(&name, &sidecar_spec(&s.instance, "static"), false)
        .await
        .map_err(anyhow::Error::msg)?;
    let live = wait_policy(&s.client, &name, "True", Duration::from_secs(30)).await?;

    for dry in [true, false] {
        let refused = match s
            .apply(&name, &undefined_value_spec(&s.instance), dry)
            .await
        {
            Ok(_) => bail!("the edit was admitted (dry run: {dry})"),
            Err(message) => message,
        };
        ensure!(
            refused.contains("validate.splice.dev")
                && refused.contains("spec.template.containers[0].env[0].value")
                && refused.contains("values.nope"),
            "dry run {dry}: {refused}"
        );
    }
    let api: Api<InjectionPolicy> = Api::all(s.client.clone());
    let after = api.get(&name).await?;
    assert_eq!(after.metadata.generation, live.metadata.generation);
    assert_eq!(after.spec, live.spec);
    Ok(())
}

#[tokio::test]
async fn a_net_admin_policy_without_allow_privileged_is_refused_at_apply() -> Result<()> {
    let s = Validated::start("val-priv").await?;
    let name = s.policy("net");
    let mut spec = json!({
        "namespaceSelector": {"matchLabels": {s.instance.as_str(): "on"}},
        "template": {"initContainers": [{"name": "net-init", "image": "registry.invalid/init:1",
            "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]}
    });
    let refused = match s.apply(&name, &spec, false).await {
        Ok(_) => bail!("a NET_ADMIN policy without allowPrivileged was admitted"),
        Err(message) => message,
    };
    ensure!(
        refused.contains("spec.template.initContainers[0].securityContext.capabilities.add[0]")
            && refused.contains("NET_ADMIN")
            && refused.contains("allowPrivileged"),
        "{refused}"
    );

    spec["allowPrivileged"] = json!(true);
    s.apply(&name, &spec, false)
        .await
        .map_err(anyhow::Error::msg)?;
    let p = wait_policy(&s.client, &name, "True", Duration::from_secs(30)).await?;
    assert_eq!(
        p.status.and_then(|st| st.pod_security),
        Some(PodSecurityLevel::Privileged)
    );
    Ok(())
}

#[tokio::test]
async fn a_policy_reading_the_pod_name_is_admitted_with_a_warning_and_leaves_a_deployments_pods_uninjected()
-> Result<()> {
    let s = Validated::start("val-name").await?;
    let name = s.policy("named");
    let spec = sidecar_spec(&s.instance, "{{ pod.metadata.name }}");
    let manifest = serde_json::to_string(&policy_body(&s.instance, &name, &spec))?;
    let (ok, stderr) = s.kubectl(&["apply", "--server-side", "-f", "-"], &manifest)?;
    ensure!(ok, "kubectl apply failed: {stderr}");
    ensure!(
        stderr
            .contains("Warning: spec.template.containers[0].env[0].value reads pod.metadata.name"),
        "kubectl printed no warning: {stderr}"
    );
    let p = wait_policy(&s.client, &name, "True", Duration::from_secs(30)).await?;
    let status = p.status.unwrap_or_default();
    ensure!(
        status
            .warnings
            .iter()
            .any(|w| w.contains("reads pod.metadata.name")),
        "{:?}",
        status.warnings
    );

    let ns = s.app_namespace().await?;
    // A pod with a name is injected, with its name.
    wait_injecting(&s.client, &ns.name, &[], "sidecar").await?;
    let pods: Api<Pod> = ns.api();
    let named = pods.create(&dry_run(), &pod("web-0", &[])).await?;
    let env = named
        .spec
        .as_ref()
        .and_then(|sp| sp.containers.iter().find(|c| c.name == "sidecar"))
        .and_then(|c| c.env.clone())
        .unwrap_or_default();
    assert_eq!(env[0].value.as_deref(), Some("web-0"));

    // A Deployment's pods are created with generateName: the template fails, and under
    // failurePolicy Ignore they are admitted without the injection.
    let deployments: Api<Deployment> = ns.api();
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]}}}
    }))?;
    deployments.create(&Default::default(), &deployment).await?;
    let list = ListParams::default().labels("app=web");
    wait_until(
        Duration::from_secs(60),
        "the Deployment's 2 pods",
        || async { Ok(pods.list(&list).await?.items.len() == 2) },
    )
    .await?;
    for p in pods.list(&list).await?.items {
        assert!(p.metadata.generate_name.is_some(), "{:?}", p.metadata);
        assert_eq!(container_names(&p), vec!["app".to_owned()]);
    }
    Ok(())
}
