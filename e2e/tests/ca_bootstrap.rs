//! Two replicas starting at the same moment in a namespace without any Secret end up with one CA:
//! only the leader creates it, the other reads it, and both serve a chain that verifies against it.

#[path = "../src/operator.rs"]
mod operator;

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Secret;
use operator::*;
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
