//! `splice rotate`, and the certificate flags of `splice run`.
//!
//! `splice rotate` only annotates the CA Secret: the leader, which is the one writer of that
//! Secret, sees the annotation through its watch and begins the rotation (removing the
//! annotation in the same write). So a request made while no replica leads is kept until one does.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::parse_duration;
use splice_controller::certs::ca::Lifetimes;
use splice_controller::certs::rotation::{CA_SECRET, ROTATE_ANNOTATION, Timing};

/// Certificate lifetimes and rotation delays of `splice run`.
#[derive(clap::Args, Debug)]
pub struct CertArgs {
    /// Lifetime of the webhook CA (e.g. `26280h`, `5m`, `90s`; a bare number is seconds).
    #[arg(long, env = "SPLICE_CA_LIFETIME", default_value = "26280h", value_parser = parse_duration)]
    ca_lifetime: Duration,

    /// Lifetime of the serving certificate; never longer than what is left of the CA's.
    #[arg(long, env = "SPLICE_SERVING_CERT_LIFETIME", default_value = "2160h", value_parser = parse_duration)]
    serving_cert_lifetime: Duration,

    /// Fraction of a certificate's lifetime after which it is renewed (the CA rotated), in (0, 1).
    #[arg(long, env = "SPLICE_CERT_RENEW_FRACTION", default_value_t = 2.0 / 3.0)]
    cert_renew_fraction: f64,

    /// How long every webhook configuration must carry a new CA before serving certificates it
    /// signed are used: time for the API server to load the new caBundle.
    #[arg(long, env = "SPLICE_CA_PROPAGATION_DELAY", default_value = "10s", value_parser = parse_duration)]
    ca_propagation_delay: Duration,

    /// How long every replica must serve the new CA's chain before the old CA leaves the bundles.
    #[arg(long, env = "SPLICE_CA_ROTATION_GRACE", default_value = "60s", value_parser = parse_duration)]
    ca_rotation_grace: Duration,
}

impl CertArgs {
    pub fn timing(&self) -> anyhow::Result<Timing> {
        let fraction = self.cert_renew_fraction;
        if !(fraction > 0.0 && fraction < 1.0) {
            bail!("--cert-renew-fraction must be between 0 and 1 (exclusive), got {fraction}");
        }
        if self.ca_lifetime < Duration::from_secs(30) {
            bail!(
                "--ca-lifetime must be at least 30s, got {:?}",
                self.ca_lifetime
            );
        }
        if self.serving_cert_lifetime > self.ca_lifetime {
            bail!(
                "--serving-cert-lifetime ({:?}) must not exceed --ca-lifetime ({:?})",
                self.serving_cert_lifetime,
                self.ca_lifetime
            );
        }
        if self.serving_cert_lifetime < Duration::from_secs(10) {
            bail!(
                "--serving-cert-lifetime must be at least 10s, got {:?}",
                self.serving_cert_lifetime
            );
        }
        let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
        Ok(Timing {
            lifetimes: Lifetimes {
                ca: time::Duration::seconds(secs(self.ca_lifetime)),
                serving: time::Duration::seconds(secs(self.serving_cert_lifetime)),
                renew_fraction: fraction,
            },
            propagation: secs(self.ca_propagation_delay),
            grace: secs(self.ca_rotation_grace),
        })
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    splice: super::SpliceNamespace,
}

pub fn main(args: Args, cluster: &super::ClusterArgs) -> ExitCode {
    super::run_to_exit(async {
        request(&args.splice.namespace, cluster).await?;
        println!(
            "rotation requested; the leader records its progress in the \
             splice.dev/ca-rotation-phase annotation of Secret {}/{CA_SECRET}",
            args.splice.namespace
        );
        Ok(())
    })
}

async fn request(namespace: &str, cluster: &super::ClusterArgs) -> anyhow::Result<()> {
    let client = cluster.client().await?;
    let secrets: Api<Secret> = Api::namespaced(client, namespace);
    let at = time::OffsetDateTime::now_utc().unix_timestamp().to_string();
    let patch = json!({"metadata": {"annotations": {ROTATE_ANNOTATION: at}}});
    // A merge patch, not apply: it must fail on a missing Secret rather than create one.
    secrets
        .patch(CA_SECRET, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating Secret {namespace}/{CA_SECRET}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        certs: CertArgs,
    }

    fn timing(argv: &[&str]) -> Result<Timing, String> {
        let cli = Cli::try_parse_from(std::iter::once("run").chain(argv.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.certs.timing().map_err(|e| e.to_string())
    }

    #[test]
    fn by_default_the_ca_lives_three_years_serving_certificates_ninety_days_renewed_at_two_thirds()
    {
        let t = timing(&[]).unwrap();
        assert_eq!(t.lifetimes.ca, time::Duration::days(3 * 365));
        assert_eq!(t.lifetimes.serving, time::Duration::days(90));
        assert!((t.lifetimes.renew_fraction - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!((t.propagation, t.grace), (10, 60));
    }

    #[test]
    fn compressed_lifetimes_are_accepted_for_tests() {
        let t = timing(&[
            "--ca-lifetime",
            "2m",
            "--serving-cert-lifetime",
            "40s",
            "--cert-renew-fraction",
            "0.5",
            "--ca-rotation-grace",
            "3",
        ])
        .unwrap();
        assert_eq!(t.lifetimes.ca, time::Duration::seconds(120));
        assert_eq!(t.lifetimes.serving, time::Duration::seconds(40));
        assert_eq!(t.grace, 3);
    }

    #[test]
    fn inconsistent_certificate_flags_are_refused_with_the_flag_named() {
        let err = timing(&["--cert-renew-fraction", "1.5"]).unwrap_err();
        assert!(err.contains("--cert-renew-fraction"), "{err}");
        let err = timing(&["--ca-lifetime", "1h", "--serving-cert-lifetime", "2h"]).unwrap_err();
        assert!(err.contains("--serving-cert-lifetime"), "{err}");
        let err = timing(&["--ca-lifetime", "5s"]).unwrap_err();
        assert!(err.contains("--ca-lifetime"), "{err}");
        let err = timing(&["--ca-rotation-grace", "5 weeks"]).unwrap_err();
        assert!(err.contains("unknown unit"), "{err}");
    }
}
