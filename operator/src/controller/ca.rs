//! The interim certificate authority: a CA and a serving certificate, created once by the leader
//! and kept in a `kubernetes.io/tls` Secret in Splice's namespace, so every replica serves the same
//! chain and a restart reuses it (the caBundle of every webhook stays valid).
//!
//! Rotation with overlapping bundles belongs to the certificate-authority work; until then the
//! serving certificate is re-issued (by the same CA) when it lacks a name the API server needs or is
//! past two thirds of its lifetime, and the CA is only replaced when it is unusable.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
};
use splice_crds::{MANAGED_BY_LABEL, MANAGER};
use time::{Duration, OffsetDateTime};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::X509Certificate;

/// The Secret holding the CA and the serving certificate.
pub const SECRET_NAME: &str = "splice-webhook-tls";
/// Keys of that Secret: the standard `kubernetes.io/tls` pair, plus the CA.
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const CA_CRT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";

/// Lifetime of the CA. Long, because replacing it changes every caBundle.
pub const CA_VALIDITY: Duration = Duration::days(3 * 365);
/// Lifetime of the serving certificate; re-issued after two thirds of it.
pub const SERVING_VALIDITY: Duration = Duration::days(365);
/// Certificates start slightly in the past so a node whose clock runs behind still accepts them.
const BACKDATE: Duration = Duration::minutes(5);

/// The CA and serving certificate with their keys, all PEM. `Debug` never prints the keys.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsMaterial {
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca_cert_pem", &self.ca_cert_pem)
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("Secret {SECRET_NAME} has no {0:?} key")]
    MissingKey(&'static str),
    #[error("{what} is not a usable certificate: {reason}")]
    BadCertificate { what: &'static str, reason: String },
    #[error("reading or writing Secret {SECRET_NAME}: {0}")]
    Kube(#[from] kube::Error),
    #[error(
        "Secret {SECRET_NAME} kept changing while Splice tried to update it; another writer is \
         fighting over it"
    )]
    Contended,
}

impl CaError {
    pub fn label(&self) -> &'static str {
        match self {
            CaError::Generate(_) => "generate",
            CaError::MissingKey(_) => "missing_key",
            CaError::BadCertificate { .. } => "bad_certificate",
            CaError::Kube(_) => "kube",
            CaError::Contended => "contended",
        }
    }
}

fn new_key() -> Result<KeyPair, CaError> {
    Ok(KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?)
}

fn ca_params(now: OffsetDateTime) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "splice webhook CA");
    dn.push(DnType::OrganizationName, "splice.dev");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = now - BACKDATE;
    params.not_after = now + CA_VALIDITY;
    params
}

/// Issues a serving certificate for `names` (DNS names or IP addresses), signed by the CA.
pub fn issue_serving(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    names: &[String],
    now: OffsetDateTime,
) -> Result<(String, String), CaError> {
    let ca_key = KeyPair::from_pem(ca_key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        names.first().map_or("splice webhook", String::as_str),
    );
    params.distinguished_name = dn;
    params.subject_alt_names = names
        .iter()
        .map(|n| match n.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => Ok(SanType::DnsName(n.clone().try_into()?)),
        })
        .collect::<Result<_, rcgen::Error>>()?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = now - BACKDATE;
    params.not_after = now + SERVING_VALIDITY;
    let key = new_key()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A new CA and a serving certificate for `names` signed by it.
pub fn new_material(names: &[String], now: OffsetDateTime) -> Result<TlsMaterial, CaError> {
    let ca_key = new_key()?;
    let ca_cert = ca_params(now).self_signed(&ca_key)?;
    let ca_cert_pem = ca_cert.pem();
    let ca_key_pem = ca_key.serialize_pem();
    let (cert_pem, key_pem) = issue_serving(&ca_cert_pem, &ca_key_pem, names, now)?;
    Ok(TlsMaterial {
        ca_cert_pem,
        ca_key_pem,
        cert_pem,
        key_pem,
    })
}

/// What a stored certificate says, as far as renewal is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    pub not_before: i64,
    pub not_after: i64,
    /// DNS names and IP addresses (as text).
    pub names: Vec<String>,
}

fn parse_pem(pem: &str, what: &'static str) -> Result<x509_parser::pem::Pem, CaError> {
    let bad = |reason: String| CaError::BadCertificate { what, reason };
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| bad(e.to_string()))?;
    Ok(pem)
}

fn info(cert: &X509Certificate<'_>, what: &'static str) -> Result<CertInfo, CaError> {
    let mut names = Vec::new();
    let san = cert
        .subject_alternative_name()
        .map_err(|e| CaError::BadCertificate {
            what,
            reason: e.to_string(),
        })?;
    for name in san.iter().flat_map(|ext| ext.value.general_names.iter()) {
        match name {
            GeneralName::DNSName(dns) => names.push((*dns).to_owned()),
            GeneralName::IPAddress(bytes) => {
                if let Ok(octets) = <[u8; 4]>::try_from(*bytes) {
                    names.push(IpAddr::from(octets).to_string());
                } else if let Ok(octets) = <[u8; 16]>::try_from(*bytes) {
                    names.push(IpAddr::from(octets).to_string());
                }
            }
            _ => {}
        }
    }
    Ok(CertInfo {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        names,
    })
}

/// Reads the validity and names of a PEM certificate.
pub fn inspect(pem: &str, what: &'static str) -> Result<CertInfo, CaError> {
    let pem = parse_pem(pem, what)?;
    let cert = pem.parse_x509().map_err(|e| CaError::BadCertificate {
        what,
        reason: e.to_string(),
    })?;
    info(&cert, what)
}

/// What has to be issued again before the stored material can be served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The CA is unusable (expired, not a CA, or its key does not match); everything is new.
    Ca(String),
    /// The serving certificate must be re-issued by the existing CA.
    Serving(String),
}

fn past_two_thirds(info: &CertInfo, now: i64) -> bool {
    let lifetime = info.not_after - info.not_before;
    now >= info.not_before + lifetime * 2 / 3
}

/// Whether `material` can be served as is for `names` at `now`, and if not, what to re-issue.
pub fn renewal_needed(
    material: &TlsMaterial,
    names: &[String],
    now: OffsetDateTime,
) -> Option<Renewal> {
    let now = now.unix_timestamp();
    let ca_pem = match parse_pem(&material.ca_cert_pem, "the CA certificate") {
        Ok(p) => p,
        Err(e) => return Some(Renewal::Ca(e.to_string())),
    };
    let ca = match ca_pem.parse_x509() {
        Ok(c) => c,
        Err(e) => {
            return Some(Renewal::Ca(format!(
                "the CA certificate does not parse: {e}"
            )));
        }
    };
    if !ca.is_ca() {
        return Some(Renewal::Ca("the CA certificate is not a CA".to_owned()));
    }
    let ca_info = match info(&ca, "the CA certificate") {
        Ok(i) => i,
        Err(e) => return Some(Renewal::Ca(e.to_string())),
    };
    if now >= ca_info.not_after {
        return Some(Renewal::Ca("the CA certificate has expired".to_owned()));
    }
    match KeyPair::from_pem(&material.ca_key_pem) {
        Ok(key) if key.public_key_raw() == ca.public_key().subject_public_key.data.as_ref() => {}
        Ok(_) => {
            return Some(Renewal::Ca(
                "the CA key does not match the CA certificate".to_owned(),
            ));
        }
        Err(e) => return Some(Renewal::Ca(format!("the CA key does not parse: {e}"))),
    }

    let serving = match parse_pem(&material.cert_pem, "the serving certificate") {
        Ok(p) => p,
        Err(e) => return Some(Renewal::Serving(e.to_string())),
    };
    let cert = match serving.parse_x509() {
        Ok(c) => c,
        Err(e) => {
            return Some(Renewal::Serving(format!(
                "the serving certificate does not parse: {e}"
            )));
        }
    };
    if cert.verify_signature(Some(ca.public_key())).is_err() {
        return Some(Renewal::Serving(
            "the serving certificate is not signed by the CA".to_owned(),
        ));
    }
    match KeyPair::from_pem(&material.key_pem) {
        Ok(key) if key.public_key_raw() == cert.public_key().subject_public_key.data.as_ref() => {}
        _ => {
            return Some(Renewal::Serving(
                "the serving key does not match its certificate".to_owned(),
            ));
        }
    }
    let info = match info(&cert, "the serving certificate") {
        Ok(i) => i,
        Err(e) => return Some(Renewal::Serving(e.to_string())),
    };
    if let Some(missing) = names.iter().find(|n| !info.names.contains(n)) {
        return Some(Renewal::Serving(format!(
            "the serving certificate does not name {missing:?}"
        )));
    }
    if past_two_thirds(&info, now) {
        return Some(Renewal::Serving(
            "the serving certificate is past two thirds of its lifetime".to_owned(),
        ));
    }
    None
}

/// The Secret that stores `material` in `namespace`.
pub fn to_secret(namespace: &str, material: &TlsMaterial) -> Secret {
    let data = BTreeMap::from([
        (
            TLS_CRT.to_owned(),
            ByteString(material.cert_pem.clone().into_bytes()),
        ),
        (
            TLS_KEY.to_owned(),
            ByteString(material.key_pem.clone().into_bytes()),
        ),
        (
            CA_CRT.to_owned(),
            ByteString(material.ca_cert_pem.clone().into_bytes()),
        ),
        (
            CA_KEY.to_owned(),
            ByteString(material.ca_key_pem.clone().into_bytes()),
        ),
    ]);
    Secret {
        metadata: ObjectMeta {
            name: Some(SECRET_NAME.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_owned(),
                MANAGER.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The material stored in `secret`.
pub fn from_secret(secret: &Secret) -> Result<TlsMaterial, CaError> {
    let get = |key: &'static str| -> Result<String, CaError> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or(CaError::MissingKey(key))?;
        String::from_utf8(bytes.0.clone()).map_err(|_| CaError::BadCertificate {
            what: key,
            reason: "not UTF-8 PEM".to_owned(),
        })
    };
    Ok(TlsMaterial {
        ca_cert_pem: get(CA_CRT)?,
        ca_key_pem: get(CA_KEY)?,
        cert_pem: get(TLS_CRT)?,
        key_pem: get(TLS_KEY)?,
    })
}

/// Makes sure the Secret holds material that can be served for `names`, creating or repairing
/// it, and returns that material. Leader only: this is the one place Splice writes Secrets.
pub async fn ensure(
    api: &Api<Secret>,
    namespace: &str,
    names: &[String],
) -> Result<TlsMaterial, CaError> {
    // Concurrent writers (a leader that has not yet noticed it lost the lease) are resolved by the
    // API server's optimistic concurrency: a conflict re-reads and decides again.
    for _ in 0..5 {
        let now = OffsetDateTime::now_utc();
        let existing = api.get_opt(SECRET_NAME).await?;
        let Some(existing) = existing else {
            let material = new_material(names, now)?;
            match api
                .create(&PostParams::default(), &to_secret(namespace, &material))
                .await
            {
                Ok(_) => {
                    tracing::info!(
                        secret = SECRET_NAME,
                        "created the webhook CA and serving certificate"
                    );
                    return Ok(material);
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        let material = match from_secret(&existing) {
            Ok(current) => match renewal_needed(&current, names, now) {
                None => return Ok(current),
                Some(Renewal::Serving(why)) => {
                    tracing::info!(secret = SECRET_NAME, reason = %why, "re-issuing the serving certificate");
                    let (cert_pem, key_pem) =
                        issue_serving(&current.ca_cert_pem, &current.ca_key_pem, names, now)?;
                    TlsMaterial {
                        cert_pem,
                        key_pem,
                        ..current
                    }
                }
                Some(Renewal::Ca(why)) => {
                    tracing::warn!(secret = SECRET_NAME, reason = %why, "replacing the webhook CA");
                    new_material(names, now)?
                }
            },
            Err(e) => {
                tracing::warn!(secret = SECRET_NAME, error = %e, "replacing an unusable webhook TLS Secret");
                new_material(names, now)?
            }
        };
        let mut secret = to_secret(namespace, &material);
        secret.metadata.resource_version = existing.metadata.resource_version.clone();
        match api
            .replace(SECRET_NAME, &PostParams::default(), &secret)
            .await
        {
            Ok(_) => return Ok(material),
            Err(e) if is_conflict(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(CaError::Contended)
}

pub(crate) fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["splice.splice-system.svc".into(), "127.0.0.1".into()]
    }

    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
    }

    #[test]
    fn new_material_has_explicit_validity_and_the_requested_names() {
        let m = new_material(&names(), now()).unwrap();
        let ca = inspect(&m.ca_cert_pem, "ca").unwrap();
        assert_eq!(
            ca.not_after - ca.not_before,
            (CA_VALIDITY + BACKDATE).whole_seconds()
        );
        let serving = inspect(&m.cert_pem, "serving").unwrap();
        assert_eq!(
            serving.not_before,
            now().unix_timestamp() - BACKDATE.whole_seconds()
        );
        assert_eq!(
            serving.not_after,
            (now() + SERVING_VALIDITY).unix_timestamp()
        );
        assert_eq!(serving.names, names());
        assert!(m.key_pem.contains("PRIVATE KEY"));
        assert_eq!(renewal_needed(&m, &names(), now()), None);
    }

    #[test]
    fn the_keys_are_ecdsa_p256() {
        let m = new_material(&names(), now()).unwrap();
        for pem in [&m.ca_key_pem, &m.key_pem] {
            let key = KeyPair::from_pem(pem).unwrap();
            assert!(key.is_compatible(&PKCS_ECDSA_P256_SHA256));
        }
    }

    #[test]
    fn debug_output_never_contains_a_private_key() {
        let m = new_material(&names(), now()).unwrap();
        assert!(!format!("{m:?}").contains("PRIVATE KEY"));
    }

    #[test]
    fn a_secret_round_trips_the_material() {
        let m = new_material(&names(), now()).unwrap();
        let s = to_secret("ns", &m);
        assert_eq!(s.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(from_secret(&s).unwrap(), m);
    }

    #[test]
    fn a_secret_without_the_ca_key_is_reported_by_key_name() {
        let m = new_material(&names(), now()).unwrap();
        let mut s = to_secret("ns", &m);
        s.data.as_mut().unwrap().remove(CA_KEY);
        assert!(matches!(
            from_secret(&s),
            Err(CaError::MissingKey("ca.key"))
        ));
    }

    #[test]
    fn a_new_name_reissues_the_serving_certificate_from_the_same_ca() {
        let m = new_material(&names(), now()).unwrap();
        let mut wanted = names();
        wanted.push("10.0.0.7".into());
        assert!(
            matches!(renewal_needed(&m, &wanted, now()), Some(Renewal::Serving(r)) if r.contains("10.0.0.7"))
        );
        let (cert_pem, key_pem) =
            issue_serving(&m.ca_cert_pem, &m.ca_key_pem, &wanted, now()).unwrap();
        let renewed = TlsMaterial {
            cert_pem,
            key_pem,
            ..m
        };
        assert_eq!(renewal_needed(&renewed, &wanted, now()), None);
    }

    #[test]
    fn the_serving_certificate_is_renewed_after_two_thirds_of_its_life() {
        let m = new_material(&names(), now()).unwrap();
        let early = now() + Duration::days(200);
        assert_eq!(renewal_needed(&m, &names(), early), None);
        let late = now() + Duration::days(250);
        assert!(matches!(
            renewal_needed(&m, &names(), late),
            Some(Renewal::Serving(_))
        ));
    }

    #[test]
    fn a_serving_certificate_from_another_ca_is_reissued() {
        let a = new_material(&names(), now()).unwrap();
        let b = new_material(&names(), now()).unwrap();
        let mixed = TlsMaterial {
            cert_pem: b.cert_pem,
            key_pem: b.key_pem,
            ..a
        };
        assert!(
            matches!(renewal_needed(&mixed, &names(), now()), Some(Renewal::Serving(r)) if r.contains("not signed"))
        );
    }

    #[test]
    fn an_expired_or_mismatched_ca_is_replaced() {
        let a = new_material(&names(), now()).unwrap();
        let later = now() + CA_VALIDITY + Duration::days(1);
        assert!(matches!(
            renewal_needed(&a, &names(), later),
            Some(Renewal::Ca(_))
        ));
        let b = new_material(&names(), now()).unwrap();
        let wrong_key = TlsMaterial {
            ca_key_pem: b.ca_key_pem,
            ..a
        };
        assert!(
            matches!(renewal_needed(&wrong_key, &names(), now()), Some(Renewal::Ca(r)) if r.contains("key"))
        );
    }

    #[test]
    fn garbage_in_the_secret_is_not_a_panic() {
        let m = TlsMaterial {
            ca_cert_pem: "nope".into(),
            ca_key_pem: "nope".into(),
            cert_pem: "nope".into(),
            key_pem: "nope".into(),
        };
        assert!(matches!(
            renewal_needed(&m, &names(), now()),
            Some(Renewal::Ca(_))
        ));
        assert!(
            inspect(
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                "x"
            )
            .is_err()
        );
    }
}
