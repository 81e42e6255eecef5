//! Certificate primitives of Splice's own certificate authority: issuing a CA and serving
//! certificates with rcgen, reading them back, and deciding whether they are still usable. Pure:
//! no API calls (the Secrets and the rotation live in [`super::rotation`]).

use std::fmt;
use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType, SerialNumber,
};
use time::{Duration, OffsetDateTime};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::X509Certificate;

/// Certificates start slightly in the past so a node whose clock runs behind still accepts them.
pub const BACKDATE: Duration = Duration::minutes(5);

/// The backdate of a certificate living `lifetime`: [`BACKDATE`], but at most a tenth of the
/// lifetime, so compressed test lifetimes (minutes) are not dominated by it and their renewal
/// point (a fraction of NotBefore..NotAfter) stays close to the configured fraction.
fn backdate(lifetime: Duration) -> Duration {
    BACKDATE.min(lifetime / 10)
}

/// How long certificates live and when they are renewed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lifetimes {
    pub ca: Duration,
    pub serving: Duration,
    /// Fraction of a lifetime after which a certificate is renewed, in (0, 1).
    pub renew_fraction: f64,
}

impl Default for Lifetimes {
    fn default() -> Self {
        Lifetimes {
            ca: Duration::days(3 * 365),
            serving: Duration::days(90),
            renew_fraction: 2.0 / 3.0,
        }
    }
}

/// A certificate and its private key, both PEM. `Debug` never prints the key.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyedCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for KeyedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedCert")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum CaError {
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{what} is not a usable certificate: {reason}")]
    BadCertificate { what: &'static str, reason: String },
}

impl CaError {
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

fn new_key() -> Result<KeyPair, CaError> {
    Ok(KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?)
}

/// A random 128-bit serial. rcgen's default serial is a hash of the subject key; a random one is
/// what RFC 5280 asks for. The randomness comes from the operating system's CSPRNG through a
/// throwaway P-256 key (whose public point is uniformly chosen), so no extra RNG crate is needed.
pub(crate) fn random_serial() -> Result<SerialNumber, CaError> {
    let throwaway = new_key()?;
    let raw = throwaway.public_key_raw();
    // Skip the 0x04 uncompressed-point tag; clear the top bit so the DER integer stays positive.
    let mut bytes: Vec<u8> = raw.iter().skip(1).take(16).copied().collect();
    if let Some(first) = bytes.first_mut() {
        *first &= 0x7f;
        // A leading zero byte would make the serial shorter than intended; keep it non-zero.
        if *first == 0 {
            *first = 1;
        }
    }
    Ok(SerialNumber::from(bytes))
}

/// The parameters of a CA named `common_name`, with `path_len` CAs allowed below it (1 for
/// Splice's own, whose identity intermediate signs the pods' leaves; 0 for that intermediate):
/// certificate and CRL signing, SHA-256 key identifiers, a random serial. The caller sets the
/// validity.
pub(crate) fn ca_params_named(
    common_name: &str,
    path_len: u8,
) -> Result<CertificateParams, CaError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "splice.dev");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(path_len));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.key_identifier_method = KeyIdMethod::Sha256;
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial()?);
    Ok(params)
}

fn ca_params(now: OffsetDateTime, lifetime: Duration) -> Result<CertificateParams, CaError> {
    let mut params = ca_params_named("splice webhook CA", 1)?;
    params.not_before = now - backdate(lifetime);
    params.not_after = now + lifetime;
    Ok(params)
}

/// A new self-signed CA valid from now for `lifetime`.
pub fn new_ca(now: OffsetDateTime, lifetime: Duration) -> Result<KeyedCert, CaError> {
    let key = new_key()?;
    let cert = ca_params(now, lifetime)?.self_signed(&key)?;
    Ok(KeyedCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Issues a serving certificate for `names` (DNS names or IP addresses), signed by `ca`. Its
/// NotAfter never passes the CA's: a leaf outliving its issuer would fail verification early.
pub fn issue_serving(
    ca: &KeyedCert,
    names: &[String],
    now: OffsetDateTime,
    lifetime: Duration,
) -> Result<KeyedCert, CaError> {
    let ca_info = inspect(&ca.cert_pem, "the CA certificate")?;
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key)?;
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
    params.key_identifier_method = KeyIdMethod::Sha256;
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial()?);
    params.not_before = now - backdate(lifetime);
    let ca_not_after = OffsetDateTime::from_unix_timestamp(ca_info.not_after).map_err(|e| {
        CaError::BadCertificate {
            what: "the CA certificate",
            reason: e.to_string(),
        }
    })?;
    params.not_after = (now + lifetime).min(ca_not_after);
    let key = new_key()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(KeyedCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// What a stored certificate says, as far as renewal and identification are concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    pub not_before: i64,
    pub not_after: i64,
    /// DNS names and IP addresses (as text).
    pub names: Vec<String>,
    /// Serial number in lowercase hex: random, so it names a certificate in logs, annotations and
    /// replica reports without exposing anything secret.
    pub serial: String,
    /// Authority key identifier in hex (empty when absent): which CA issued this certificate.
    pub issuer_key_id: String,
    /// Subject key identifier in hex (empty when absent).
    pub key_id: String,
    pub is_ca: bool,
    /// A CA's path length constraint: how many CAs it allows below it (`None`: no limit).
    pub path_len: Option<u32>,
}

impl CertInfo {
    /// The instant at which `fraction` of the lifetime has passed.
    pub fn renew_at(&self, fraction: f64) -> i64 {
        let lifetime = (self.not_after - self.not_before).max(0) as f64;
        self.not_before + (lifetime * fraction) as i64
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_pem(pem: &str, what: &'static str) -> Result<x509_parser::pem::Pem, CaError> {
    let bad = |reason: String| CaError::BadCertificate { what, reason };
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| bad(e.to_string()))?;
    Ok(pem)
}

fn info(cert: &X509Certificate<'_>, what: &'static str) -> Result<CertInfo, CaError> {
    use x509_parser::extensions::ParsedExtension;
    let bad = |reason: String| CaError::BadCertificate { what, reason };
    let mut names = Vec::new();
    let san = cert
        .subject_alternative_name()
        .map_err(|e| bad(e.to_string()))?;
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
    let mut issuer_key_id = String::new();
    let mut key_id = String::new();
    let mut path_len = None;
    for ext in cert.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::BasicConstraints(bc) => path_len = bc.path_len_constraint,
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                if let Some(id) = &aki.key_identifier {
                    issuer_key_id = hex(id.0);
                }
            }
            ParsedExtension::SubjectKeyIdentifier(id) => key_id = hex(id.0),
            _ => {}
        }
    }
    Ok(CertInfo {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        names,
        serial: hex(cert.raw_serial()),
        issuer_key_id,
        key_id,
        is_ca: cert.is_ca(),
        path_len,
    })
}

/// Reads the validity, names and identifiers of a PEM certificate (the first of a bundle).
pub fn inspect(pem: &str, what: &'static str) -> Result<CertInfo, CaError> {
    let pem = parse_pem(pem, what)?;
    let cert = pem.parse_x509().map_err(|e| CaError::BadCertificate {
        what,
        reason: e.to_string(),
    })?;
    info(&cert, what)
}

/// Splits a PEM bundle into its certificates (each re-encoded as its own PEM block).
pub fn split_bundle(bundle: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in bundle.lines() {
        if line.starts_with("-----BEGIN CERTIFICATE-----") {
            current.clear();
        }
        current.push_str(line.trim_end());
        current.push('\n');
        if line.starts_with("-----END CERTIFICATE-----") {
            out.push(std::mem::take(&mut current));
        }
    }
    out
}

/// Why `ca` cannot sign at `now`, if it cannot: unparsable, not a CA, expired, or its key does not
/// match. `None` when usable.
pub fn ca_unusable(ca: &KeyedCert, now: i64) -> Option<String> {
    let pem = match parse_pem(&ca.cert_pem, "the CA certificate") {
        Ok(p) => p,
        Err(e) => return Some(e.to_string()),
    };
    let cert = match pem.parse_x509() {
        Ok(c) => c,
        Err(e) => return Some(format!("the CA certificate does not parse: {e}")),
    };
    if !cert.is_ca() {
        return Some("the CA certificate is not a CA".to_owned());
    }
    let not_after = cert.validity().not_after.timestamp();
    if now >= not_after {
        return Some("the CA certificate has expired".to_owned());
    }
    match KeyPair::from_pem(&ca.key_pem) {
        Ok(key) if key.public_key_raw() == cert.public_key().subject_public_key.data.as_ref() => {
            None
        }
        Ok(_) => Some("the CA key does not match the CA certificate".to_owned()),
        Err(e) => Some(format!("the CA key does not parse: {e}")),
    }
}

/// Why `serving` must be re-issued by `ca` for `names` at `now`, if it must: unparsable, not
/// signed by `ca`, key mismatch, a missing name, or past the renewal point. `None` when it can be
/// served as is.
pub fn serving_renewal(
    serving: &KeyedCert,
    ca_cert_pem: &str,
    names: &[String],
    now: i64,
    renew_fraction: f64,
) -> Option<String> {
    let Ok(ca_pem) = parse_pem(ca_cert_pem, "the CA certificate") else {
        return Some("the issuing CA does not parse".to_owned());
    };
    let Ok(ca) = ca_pem.parse_x509() else {
        return Some("the issuing CA does not parse".to_owned());
    };
    let serving_pem = match parse_pem(&serving.cert_pem, "the serving certificate") {
        Ok(p) => p,
        Err(e) => return Some(e.to_string()),
    };
    let cert = match serving_pem.parse_x509() {
        Ok(c) => c,
        Err(e) => return Some(format!("the serving certificate does not parse: {e}")),
    };
    if cert.verify_signature(Some(ca.public_key())).is_err() {
        return Some("the serving certificate is not signed by the current CA".to_owned());
    }
    match KeyPair::from_pem(&serving.key_pem) {
        Ok(key) if key.public_key_raw() == cert.public_key().subject_public_key.data.as_ref() => {}
        _ => return Some("the serving key does not match its certificate".to_owned()),
    }
    let info = match info(&cert, "the serving certificate") {
        Ok(i) => i,
        Err(e) => return Some(e.to_string()),
    };
    if let Some(missing) = names.iter().find(|n| !info.names.contains(n)) {
        return Some(format!("the serving certificate does not name {missing:?}"));
    }
    if now >= info.renew_at(renew_fraction) {
        return Some("the serving certificate is past its renewal point".to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::extensions::ParsedExtension;

    fn names() -> Vec<String> {
        vec![
            "splice.splice-system.svc".into(),
            "splice.splice-system.svc.cluster.local".into(),
            "127.0.0.1".into(),
        ]
    }

    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
    }

    fn ca() -> KeyedCert {
        new_ca(now(), Duration::days(30)).unwrap()
    }

    fn der(pem: &str) -> Vec<u8> {
        x509_parser::pem::parse_x509_pem(pem.as_bytes())
            .unwrap()
            .1
            .contents
    }

    #[test]
    fn the_ca_is_a_p256_cert_signing_ca_allowing_one_intermediate_with_explicit_validity_and_key_ids()
     {
        let ca = ca();
        let der = der(&ca.cert_pem);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let bc = cert.basic_constraints().unwrap().unwrap().value;
        assert!(bc.ca);
        // The identity signer's intermediate, and no CA below it.
        assert_eq!(bc.path_len_constraint, Some(1));
        assert!(cert.key_usage().unwrap().unwrap().value.key_cert_sign());
        let exts: Vec<_> = cert
            .extensions()
            .iter()
            .map(|e| e.parsed_extension())
            .collect();
        assert!(
            exts.iter()
                .any(|e| matches!(e, ParsedExtension::SubjectKeyIdentifier(_)))
        );
        assert!(
            exts.iter()
                .any(|e| matches!(e, ParsedExtension::AuthorityKeyIdentifier(_)))
        );
        let info = inspect(&ca.cert_pem, "ca").unwrap();
        assert_eq!(info.not_before, (now() - BACKDATE).unix_timestamp());
        assert_eq!(
            info.not_after,
            (now() + Duration::days(30)).unix_timestamp()
        );
        assert!(info.is_ca);
        assert!(
            KeyPair::from_pem(&ca.key_pem)
                .unwrap()
                .is_compatible(&PKCS_ECDSA_P256_SHA256)
        );
    }

    #[test]
    fn serials_are_random_and_sixteen_bytes() {
        let a = inspect(&ca().cert_pem, "a").unwrap();
        let b = inspect(&ca().cert_pem, "b").unwrap();
        assert_ne!(a.serial, b.serial);
        assert_eq!(a.serial.len(), 32, "{}", a.serial);
    }

    #[test]
    fn the_serving_certificate_names_every_host_is_for_server_auth_and_points_at_its_ca() {
        let ca = ca();
        let serving = issue_serving(&ca, &names(), now(), Duration::days(7)).unwrap();
        let info = inspect(&serving.cert_pem, "serving").unwrap();
        assert_eq!(info.names, names());
        assert!(!info.is_ca);
        assert_eq!(
            info.issuer_key_id,
            inspect(&ca.cert_pem, "ca").unwrap().key_id
        );
        let der = der(&serving.cert_pem);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert!(
            cert.extended_key_usage()
                .unwrap()
                .unwrap()
                .value
                .server_auth
        );
        assert_eq!(
            serving_renewal(
                &serving,
                &ca.cert_pem,
                &names(),
                now().unix_timestamp(),
                2.0 / 3.0
            ),
            None
        );
    }

    #[test]
    fn the_serving_certificate_never_outlives_its_ca() {
        let ca = ca();
        let serving = issue_serving(&ca, &names(), now(), Duration::days(365)).unwrap();
        let info = inspect(&serving.cert_pem, "serving").unwrap();
        assert_eq!(
            info.not_after,
            inspect(&ca.cert_pem, "ca").unwrap().not_after
        );
    }

    #[test]
    fn the_serving_certificate_is_renewed_at_the_configured_fraction_of_its_life() {
        let ca = ca();
        let serving = issue_serving(&ca, &names(), now(), Duration::days(9)).unwrap();
        let at = |days: i64| (now() + Duration::days(days)).unix_timestamp();
        // Lifetime is 9 days plus the 5-minute backdate: 2/3 falls just before day 6.
        assert_eq!(
            serving_renewal(&serving, &ca.cert_pem, &names(), at(5), 2.0 / 3.0),
            None
        );
        assert!(serving_renewal(&serving, &ca.cert_pem, &names(), at(6), 2.0 / 3.0).is_some());
        assert_eq!(
            serving_renewal(&serving, &ca.cert_pem, &names(), at(7), 0.9),
            None
        );
    }

    #[test]
    fn a_serving_certificate_missing_a_name_or_from_another_ca_is_reissued() {
        let a = ca();
        let b = ca();
        let serving = issue_serving(&a, &names(), now(), Duration::days(7)).unwrap();
        let t = now().unix_timestamp();
        let other = serving_renewal(&serving, &b.cert_pem, &names(), t, 2.0 / 3.0).unwrap();
        assert!(other.contains("not signed"), "{other}");
        let mut more = names();
        more.push("10.0.0.7".into());
        let missing = serving_renewal(&serving, &a.cert_pem, &more, t, 2.0 / 3.0).unwrap();
        assert!(missing.contains("10.0.0.7"), "{missing}");
    }

    #[test]
    fn an_expired_or_mismatched_or_garbage_ca_is_unusable() {
        let a = ca();
        let t = now().unix_timestamp();
        assert_eq!(ca_unusable(&a, t), None);
        let expired = (now() + Duration::days(31)).unix_timestamp();
        assert!(ca_unusable(&a, expired).unwrap().contains("expired"));
        let b = ca();
        let mixed = KeyedCert {
            cert_pem: a.cert_pem.clone(),
            key_pem: b.key_pem,
        };
        assert!(ca_unusable(&mixed, t).unwrap().contains("key"));
        let garbage = KeyedCert {
            cert_pem: "nope".into(),
            key_pem: "nope".into(),
        };
        assert!(ca_unusable(&garbage, t).is_some());
        let serving = issue_serving(&a, &names(), now(), Duration::days(7)).unwrap();
        assert!(ca_unusable(&serving, t).unwrap().contains("not a CA"));
    }

    #[test]
    fn a_short_lifetime_is_backdated_by_a_tenth_so_renewal_stays_near_two_thirds() {
        let ca = new_ca(now(), Duration::seconds(60)).unwrap();
        let info = inspect(&ca.cert_pem, "ca").unwrap();
        assert_eq!(info.not_before, now().unix_timestamp() - 6);
        let after_issue = info.renew_at(2.0 / 3.0) - now().unix_timestamp();
        assert!((36..=40).contains(&after_issue), "{after_issue}");
    }

    #[test]
    fn debug_output_never_contains_a_private_key() {
        assert!(!format!("{:?}", ca()).contains("PRIVATE KEY"));
    }

    #[test]
    fn a_bundle_splits_into_its_certificates_in_order() {
        let a = ca();
        let b = ca();
        let bundle = format!("{}{}", a.cert_pem, b.cert_pem);
        let parts = split_bundle(&bundle);
        assert_eq!(parts.len(), 2);
        assert_eq!(
            inspect(&parts[1], "b").unwrap(),
            inspect(&b.cert_pem, "b").unwrap()
        );
        assert!(split_bundle("garbage").is_empty());
    }
}
