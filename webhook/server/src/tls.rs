//! The serving certificate, held in memory and swappable without a restart.
//!
//! The operator loads the certificate from a Secret and calls [`CertResolver::swap`] when it is
//! renewed; every TLS handshake asks the resolver for the current key, so a swap takes effect on
//! the next handshake and never disturbs connections already established.

use std::io::BufReader;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Why a certificate or key could not be loaded.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum TlsError {
    #[error("the certificate PEM holds no CERTIFICATE block")]
    NoCertificate,
    #[error("the key PEM holds no private key (PKCS#8, SEC1 or PKCS#1 block)")]
    NoPrivateKey,
    #[error("malformed PEM: {0}")]
    #[strum(serialize = "malformed_pem")]
    Pem(#[source] std::io::Error),
    #[error("unsupported private key: {0}")]
    UnsupportedKey(#[source] rustls::Error),
    #[error("the private key does not match the certificate")]
    KeyMismatch,
    #[error("cannot build the TLS configuration: {0}")]
    Config(#[source] rustls::Error),
}

impl TlsError {
    /// Stable label for metrics and logs.
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

/// The crypto provider every Splice TLS endpoint uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses a PEM certificate chain (leaf first) and its PEM private key into a key rustls can
/// serve, checking that the key belongs to the leaf certificate.
pub fn certified_key_from_pem(
    chain_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut BufReader::new(chain_pem))
        .collect::<Result<_, _>>()
        .map_err(TlsError::Pem)?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let key = rustls_pemfile::private_key(&mut BufReader::new(key_pem))
        .map_err(TlsError::Pem)?
        .ok_or(TlsError::NoPrivateKey)?;
    let signing_key = provider()
        .key_provider
        .load_private_key(key)
        .map_err(TlsError::UnsupportedKey)?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        Ok(()) => Ok(Arc::new(certified)),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(TlsError::KeyMismatch)
        }
        Err(other) => Err(TlsError::UnsupportedKey(other)),
    }
}

/// A [`ResolvesServerCert`] whose certificate can be replaced at any time, lock-free.
#[derive(Debug, Default)]
pub struct CertResolver {
    current: ArcSwapOption<CertifiedKey>,
}

impl CertResolver {
    /// A resolver with no certificate yet: handshakes fail until [`CertResolver::swap`] is called.
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_key(key: Arc<CertifiedKey>) -> Self {
        let resolver = Self::new();
        resolver.swap(key);
        resolver
    }

    /// Serves `key` from the next handshake on; returns the key it replaced.
    pub fn swap(&self, key: Arc<CertifiedKey>) -> Option<Arc<CertifiedKey>> {
        self.current.swap(Some(key))
    }

    /// Loads a PEM chain and key and swaps them in; on error the current key stays in place.
    pub fn swap_pem(&self, chain_pem: &[u8], key_pem: &[u8]) -> Result<(), TlsError> {
        self.swap(certified_key_from_pem(chain_pem, key_pem)?);
        Ok(())
    }

    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current.load_full()
    }

    pub fn is_loaded(&self) -> bool {
        self.current.load().is_some()
    }

    /// When the leaf certificate being served expires (Unix seconds), if it can be read.
    pub fn not_after(&self) -> Option<i64> {
        let key = self.current.load_full()?;
        not_after_unix(key.end_entity_cert().ok()?.as_ref())
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.load_full()
    }
}

/// The rustls configuration of the webhook listener: TLS 1.3 preferred, TLS 1.2 allowed,
/// HTTP/1.1 by ALPN, certificates from `resolver`.
pub fn server_config(resolver: Arc<CertResolver>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Reads `tbsCertificate.validity.notAfter` from a DER certificate, as Unix seconds; `None` when
/// the bytes do not start with a whole X.509 certificate.
pub fn not_after_unix(cert_der: &[u8]) -> Option<i64> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    Some(cert.validity().not_after.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(not_after: (i32, u8, u8)) -> (String, String) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn a_matching_pem_pair_loads_and_reports_its_expiry() {
        let (cert, key) = self_signed((2031, 3, 4));
        let resolver = CertResolver::new();
        assert!(!resolver.is_loaded());
        resolver.swap_pem(cert.as_bytes(), key.as_bytes()).unwrap();
        assert!(resolver.is_loaded());
        // 2031-03-04T00:00:00Z
        assert_eq!(resolver.not_after(), Some(1_930_348_800));
    }

    #[test]
    fn a_key_from_another_certificate_is_refused() {
        let (cert, _) = self_signed((2030, 1, 1));
        let (_, other_key) = self_signed((2030, 1, 1));
        let err = certified_key_from_pem(cert.as_bytes(), other_key.as_bytes()).unwrap_err();
        assert_eq!(err.label(), "key_mismatch");
    }

    #[test]
    fn pem_without_a_certificate_or_a_key_names_what_is_missing() {
        let (cert, key) = self_signed((2030, 1, 1));
        assert!(matches!(
            certified_key_from_pem(key.as_bytes(), key.as_bytes()),
            Err(TlsError::NoCertificate)
        ));
        assert!(matches!(
            certified_key_from_pem(cert.as_bytes(), cert.as_bytes()),
            Err(TlsError::NoPrivateKey)
        ));
        assert!(matches!(
            certified_key_from_pem(b"", b""),
            Err(TlsError::NoCertificate)
        ));
    }

    #[test]
    fn a_failed_swap_keeps_the_current_certificate() {
        let (cert, key) = self_signed((2030, 1, 1));
        let resolver = CertResolver::new();
        resolver.swap_pem(cert.as_bytes(), key.as_bytes()).unwrap();
        let before = resolver.current().unwrap();
        assert!(resolver.swap_pem(b"garbage", b"garbage").is_err());
        assert!(Arc::ptr_eq(&before, &resolver.current().unwrap()));
    }

    #[test]
    fn generalized_time_after_2049_is_read() {
        // Dates from 2050 on are GeneralizedTime in DER.
        let (cert, key) = self_signed((2051, 1, 1));
        let ck = certified_key_from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
        let der = ck.end_entity_cert().unwrap();
        assert_eq!(not_after_unix(der.as_ref()), Some(2_556_144_000));
    }

    #[test]
    fn truncated_der_yields_no_expiry_instead_of_panicking() {
        let (cert, key) = self_signed((2030, 1, 1));
        let ck = certified_key_from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
        let der = ck.end_entity_cert().unwrap().as_ref().to_vec();
        for cut in 0..der.len() {
            assert_eq!(not_after_unix(&der[..cut]), None, "cut at {cut}");
        }
        assert_eq!(not_after_unix(&[]), None);
        assert_eq!(not_after_unix(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
    }

    #[test]
    fn the_server_config_offers_http1_by_alpn() {
        let config = server_config(Arc::new(CertResolver::new())).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }
}
