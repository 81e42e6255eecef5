//! Pod identity where the API server does not serve PodCertificateRequests: a policy with
//! `spec.identity` is refused at apply by Splice's validating webhook, naming the missing API,
//! and one stored before that webhook existed is Ready=False `PodCertificatesUnavailable` with
//! `splice_policy_pod_certificates_unavailable` at 1.
//!
//! These need a control plane started without pod certificates (`SPLICE_POD_CERTIFICATES=0`),
//! unlike the rest of the suite: they are `#[ignore]`d, so the main run skips them, and
//! e2e/run-gate-off.sh (called by e2e/run-e2e.sh) runs them with `--ignored` on a kwok-only
//! control plane of their own. Each test first checks that the API server lacks the API, so a
//! run against the wrong cluster fails instead of passing for the wrong reason.

#[path = "../src/operator.rs"]
mod operator;

use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use kube::Client;
use kube::api::Api;
use operator::*;
use serde_json::{Value, json};
use splice_crds::InjectionPolicy;
use splice_e2e::{TestNamespace, unique_suffix, wait_until};

/// What Splice says the API server lacks (splice_engine::identity::UNSERVED), in the words that
/// matter to whoever reads the refusal: the resource, and the feature gate to turn on.
const UNSERVED: &str =
    "the API server does not serve certificates.k8s.io/v1beta1 podcertificaterequests";
const GATE: &str = "feature gate PodCertificateRequest";

/// Fails unless discovery shows no podcertificaterequests in certificates.k8s.io/v1beta1 (the
/// group version absent altogether counts), while certificates.k8s.io/v1 answers: proof that
/// this is the control plane without pod certificates, and that discovery itself works.
async fn ensure_pod_certificates_unserved(client: &Client) -> Result<()> {
    let v1 = client
        .list_api_group_resources("certificates.k8s.io/v1")
        .await
        .context("discovery of certificates.k8s.io/v1")?;
    ensure!(
        v1.resources
            .iter()
            .any(|r| r.name == "certificatesigningrequests"),
        "discovery of certificates.k8s.io/v1 lacks certificatesigningrequests: {:?}",
        v1.resources.iter().map(|r| &r.name).collect::<Vec<_>>()
    );
    match client
        .list_api_group_resources("certificates.k8s.io/v1beta1")
        .await
    {
        Ok(list) => ensure!(
            !list
                .resources
                .iter()
                .any(|r| r.name == "podcertificaterequests"),
            "this API server serves certificates.k8s.io/v1beta1 podcertificaterequests: these \
             tests need a control plane started with SPLICE_POD_CERTIFICATES=0 \
             (e2e/run-gate-off.sh)"
        ),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => bail!("discovery of certificates.k8s.io/v1beta1: {e}"),
    }
    Ok(())
}

/// A policy giving pods of namespaces labelled `<instance>=on` an identity mounted into one
/// sidecar. No pod is ever created: only the policy's fate matters here.
fn identity_spec(instance: &str) -> Value {
    json!({
        "mode": "Webhook",
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "identity": {"mountPath": "/var/run/splice/identity"},
        "template": {"containers": [{"name": "proxy", "image": "registry.invalid/proxy:1"}]},
    })
}

#[tokio::test]
#[ignore = "needs a control plane without pod certificates: e2e/run-gate-off.sh"]
async fn a_policy_with_identity_is_refused_at_apply_naming_the_missing_pod_certificate_api()
-> Result<()> {
    let client = splice_e2e::client().await?;
    ensure_pod_certificates_unserved(&client).await?;
    let s = Setup::start("gate-off-refused").await?;
    let _validating = ValidatingCleanup(s.splice_ns.name.clone());
    let name = s.policy("id");
    let spec = identity_spec(&s.instance);
    // The API server loads the validating configuration asynchronously, and Splice judges
    // spec.identity only once its first discovery answered: until both, a dry run is admitted.
    wait_until(
        Duration::from_secs(60),
        "Splice's validating webhook to refuse spec.identity",
        || async {
            Ok(try_apply_policy(&client, &s.instance, &name, &spec, true)
                .await
                .is_err_and(|m| m.contains(UNSERVED)))
        },
    )
    .await?;

    let refused = match try_apply_policy(&client, &s.instance, &name, &spec, false).await {
        Ok(_) => bail!("a policy with spec.identity was stored"),
        Err(m) => m,
    };
    for words in ["denied the request", "spec.identity", UNSERVED, GATE] {
        ensure!(refused.contains(words), "{words:?} not in: {refused}");
    }
    splice_e2e::report("identity-gate-off", format!("refused at apply: {refused}"));
    let policies: Api<InjectionPolicy> = Api::all(client.clone());
    ensure!(
        policies.get_opt(&name).await?.is_none(),
        "the refused policy exists"
    );
    // The refusal is about spec.identity alone: the same policy without it is admitted.
    let mut plain = spec.clone();
    plain
        .as_object_mut()
        .context("the spec is an object")?
        .remove("identity");
    try_apply_policy(&client, &s.instance, &name, &plain, true)
        .await
        .map_err(|m| anyhow::anyhow!("the policy without spec.identity was refused: {m}"))?;
    Ok(())
}

#[tokio::test]
#[ignore = "needs a control plane without pod certificates: e2e/run-gate-off.sh"]
async fn a_policy_with_identity_stored_before_splice_is_not_ready_pod_certificates_unavailable_and_counted()
-> Result<()> {
    let client = splice_e2e::client().await?;
    ensure_pod_certificates_unserved(&client).await?;
    install_crd(&client).await?;
    let instance = format!("gate-off-stored-{}", unique_suffix());
    let splice_ns = TestNamespace::create("e2e-splice", &[]).await?;
    let _validating = ValidatingCleanup(splice_ns.name.clone());
    let _cleanup = PolicyCleanup {
        instance: instance.clone(),
    };
    // Stored while no Splice (and so no validating webhook of this instance) runs, as a policy
    // applied before the API was turned off, or before Splice was installed.
    let name = format!("{instance}-id");
    let stored = try_apply_policy(&client, &instance, &name, &identity_spec(&instance), false)
        .await
        .map_err(|m| anyhow::anyhow!("storing the policy before Splice runs: {m}"))?;
    ensure!(
        stored.spec.identity.is_some(),
        "stored without spec.identity"
    );

    let splice = Splice::start(SpliceOptions::new(&splice_ns.name, &instance)).await?;
    // Until Splice's first discovery answered it does not know the API is missing: wait for the
    // reason, not just for Ready=False.
    let policies: Api<InjectionPolicy> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let policy = loop {
        let p = policies.get(&name).await?;
        let current = condition(&p, "Ready").is_some_and(|c| {
            c.observed_generation == p.metadata.generation
                && c.reason == "PodCertificatesUnavailable"
        });
        if current {
            break p;
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "policy {name} not Ready PodCertificatesUnavailable within 60s; last status: \
                 {:?}; see {}",
                p.status,
                splice.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let ready = condition(&policy, "Ready").context("no Ready condition")?;
    ensure!(
        ready.status == "False",
        "Ready is {}: {}",
        ready.status,
        ready.message
    );
    for words in ["spec.identity", UNSERVED] {
        ensure!(
            ready.message.contains(words),
            "{words:?} not in Ready: {}",
            ready.message
        );
    }
    splice_e2e::report(
        "identity-gate-off",
        format!(
            "stored before Splice: Ready False {}: {}",
            ready.reason, ready.message
        ),
    );
    let series = format!(r#"splice_policy_pod_certificates_unavailable{{policy="{name}"}}"#);
    wait_until(Duration::from_secs(10), &format!("{series} 1"), || async {
        Ok(metric_value(&splice.metrics().await?, &series).as_deref() == Some("1"))
    })
    .await?;
    // The signer does not run either: nothing would ever ask it.
    let text = splice.metrics().await?;
    ensure!(
        metric_value(&text, "splice_identity_signer_available").as_deref() == Some("0"),
        "splice_identity_signer_available is not 0: {text}"
    );
    Ok(())
}
