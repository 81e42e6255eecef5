//! Two replicas starting at the same moment in a namespace without any Secret end up with one CA:
//! only the leader creates it, the other reads it, and both serve a chain that verifies against it.

#[path = "../src/operator.rs"]
mod operator;

use std::time::{Duration, Instant};

use std::collections::BTreeMap;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use operator::*;
use serde_json::json;
use splice_e2e::{TestNamespace, unique_suffix, wait_until};

fn text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
}

#[tokio::test]
async fn two_replicas_started_together_without_secrets_make_exactly_one_ca_ten_times_over()
-> Result<()> {
    let client = splice_e2e::client().await?;
    install_crd(&client).await?;
    let started = Instant::now();
    for round in 0..10 {
        let instance = format!("boot-{}", unique_suffix());
        let splice_ns = TestNamespace::create("e2e-splice", &[]).await?;
        let secrets = splice_ns.api::<Secret>();
        ensure!(secrets.get_opt("splice-ca").await?.is_none());
        ensure!(secrets.get_opt("splice-webhook-tls").await?.is_none());
        let options = |who: &str| {
            let mut o = SpliceOptions::new(&splice_ns.name, &instance);
            o.identity = Some(format!("{instance}-{who}"));
            o.lease = Some((6, 4, 1));
            o.log_name = format!("splice-{instance}-{who}");
            o
        };
        let (a, b) = tokio::join!(Splice::start(options("a")), Splice::start(options("b")));
        let (a, b) = (a?, b?);

        let ca_secret = secrets.get("splice-ca").await?;
        let ca_pem = text(&ca_secret, "tls.crt").context("tls.crt in splice-ca")?;
        let bundle = text(&ca_secret, "ca.crt").context("ca.crt in splice-ca")?;
        assert_eq!(
            bundle.matches("BEGIN CERTIFICATE").count(),
            1,
            "round {round}: the bundle holds one CA"
        );
        assert_eq!(bundle.trim(), ca_pem.trim());
        for (who, replica) in [("a", &a), ("b", &b)] {
            let port = replica.port;
            let ca_pem = ca_pem.clone();
            wait_until(
                Duration::from_secs(20),
                &format!("round {round}: replica {who} to serve a chain of the one CA"),
                || {
                    let ca_pem = ca_pem.clone();
                    async move { serves_chain_of(port, &ca_pem).await }
                },
            )
            .await?;
        }
        // Exactly one replica created a CA, once: the logs of both say so.
        let created: usize = [&a.log, &b.log]
            .iter()
            .map(|log| {
                std::fs::read_to_string(log)
                    .unwrap_or_default()
                    .matches("created the webhook CA")
                    .count()
            })
            .sum();
        assert_eq!(created, 1, "round {round}: CAs created: {created}");
        // And the Secret still holds the CA both serve (no second CA replaced the first).
        let again = secrets.get("splice-ca").await?;
        assert_eq!(text(&again, "tls.crt"), Some(ca_pem));
        drop((a, b));
    }
    println!(
        "10 rounds of two simultaneous replicas: one CA each time, {:?} in total",
        started.elapsed()
    );
    Ok(())
}

/// A self-signed CA valid from `from` to `to` (relative to now), with its key, PEM.
fn ca_pem(from: time::Duration, to: time::Duration) -> Result<(String, String)> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let now = time::OffsetDateTime::now_utc();
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, "e2e CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.not_before = now + from;
    params.not_after = now + to;
    Ok((params.self_signed(&key)?.pem(), key.serialize_pem()))
}

/// A `kubernetes.io/tls` Secret named `name` holding `ca` as both CA and bundle.
fn tls_secret(name: &str, (cert, key): &(String, String), ours: bool) -> Secret {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: ours.then(|| {
                BTreeMap::from([(
                    splice_crds::MANAGED_BY_LABEL.to_owned(),
                    splice_crds::MANAGER.to_owned(),
                )])
            }),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(BTreeMap::from([
            ("tls.crt".to_owned(), bytes(cert)),
            ("tls.key".to_owned(), bytes(key)),
            ("ca.crt".to_owned(), bytes(cert)),
        ])),
        ..Secret::default()
    }
}

#[tokio::test]
async fn a_ca_secret_splice_did_not_create_is_never_overwritten_and_an_event_and_the_policy_status_say_why()
-> Result<()> {
    let client = splice_e2e::client().await?;
    install_crd(&client).await?;
    let instance = format!("foreign-{}", unique_suffix());
    let splice_ns = TestNamespace::create("e2e-splice", &[]).await?;
    let secrets = splice_ns.api::<Secret>();
    let foreign = ca_pem(time::Duration::minutes(-1), time::Duration::hours(1))?;
    let created = secrets
        .create(
            &PostParams::default(),
            &tls_secret("splice-ca", &foreign, false),
        )
        .await?;
    let mut o = SpliceOptions::new(&splice_ns.name, &instance);
    o.log_name = format!("splice-{instance}");
    let splice = Splice::spawn(o).await?;
    let events = splice_ns.api::<Event>();
    wait_until(
        Duration::from_secs(30),
        "a ForeignSecret Event about splice-ca",
        || async {
            Ok(events
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("ForeignSecret")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("splice-ca")
                        && e.note
                            .as_deref()
                            .is_some_and(|n| n.contains("not created by Splice"))
                }))
        },
    )
    .await?;
    // Give the leader several more passes: the Secret is still exactly what we wrote.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = secrets.get("splice-ca").await?;
    assert_eq!(after.resource_version(), created.resource_version());
    assert_eq!(after.data, created.data);
    // And nothing signed by a CA Splice cannot vouch for is served.
    assert!(secrets.get_opt("splice-webhook-tls").await?.is_none());
    // A policy says why it cannot become ready.
    let _cleanup = PolicyCleanup {
        instance: instance.clone(),
    };
    let name = format!("{instance}-p");
    apply_policy(
        &client,
        &instance,
        &name,
        json!({"template": {"containers": [{"name": "proxy", "image": "registry.invalid/p:1"}]}}),
    )
    .await?;
    let policy = wait_policy(&client, &name, "False", Duration::from_secs(30)).await?;
    let ready = condition(&policy, "Ready").context("Ready")?;
    assert_eq!(ready.reason, "CertificateUnavailable");
    assert!(
        ready.message.contains("not created by Splice"),
        "{}",
        ready.message
    );
    drop(splice);
    Ok(())
}

#[tokio::test]
async fn an_expired_ca_at_start_is_replaced_and_a_corrupted_one_is_repaired() -> Result<()> {
    let client = splice_e2e::client().await?;
    install_crd(&client).await?;
    let instance = format!("repair-{}", unique_suffix());
    let splice_ns = TestNamespace::create("e2e-splice", &[]).await?;
    let secrets = splice_ns.api::<Secret>();
    let expired = ca_pem(time::Duration::hours(-2), time::Duration::hours(-1))?;
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("splice-ca", &expired, true),
        )
        .await?;
    let mut o = SpliceOptions::new(&splice_ns.name, &instance);
    o.log_name = format!("splice-{instance}");
    let splice = Splice::start(o).await?;

    // Replaced: a different CA, alone in the bundle, and the replica serves its chain.
    let current = |secrets: kube::Api<Secret>| async move {
        let s = secrets.get("splice-ca").await?;
        Ok::<_, anyhow::Error>((text(&s, "tls.crt"), text(&s, "ca.crt")))
    };
    let port = splice.port;
    wait_until(Duration::from_secs(30), "a new CA served", || {
        let secrets = secrets.clone();
        let expired = expired.0.clone();
        async move {
            let (ca, bundle) = current(secrets).await?;
            let Some(ca) = ca else { return Ok(false) };
            Ok(ca != expired
                && bundle.as_deref() == Some(ca.as_str())
                && serves_chain_of(port, &ca).await?)
        }
    })
    .await?;
    let (replaced, _) = current(secrets.clone()).await?;

    // Corrupted (still labelled Splice's): repaired with a new CA, served again.
    secrets
        .patch(
            "splice-ca",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"tls.crt": "bm90IGEgY2VydGlmaWNhdGU="}})),
        )
        .await?;
    wait_until(
        Duration::from_secs(30),
        "the corrupt CA repaired and served",
        || {
            let secrets = secrets.clone();
            let replaced = replaced.clone();
            async move {
                let (ca, bundle) = current(secrets).await?;
                let Some(ca) = ca else { return Ok(false) };
                Ok(ca.contains("BEGIN CERTIFICATE")
                    && Some(&ca) != replaced.as_ref()
                    && bundle.as_deref() == Some(ca.as_str())
                    && serves_chain_of(port, &ca).await?)
            }
        },
    )
    .await?;
    drop(splice);
    Ok(())
}
