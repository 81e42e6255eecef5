//! Signing pod identities: an intermediate CA under Splice's active CA, made in memory (its key
//! is never stored) and replaced when the active CA changes or when it could no longer cover a
//! full leaf, and the leaves it issues: no subject, one URI SAN (the SPIFFE ID), client and
//! server authentication. Pure: no API calls.

use rcgen::{
    CertificateParams, CustomExtension, DistinguishedName, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyIdMethod, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType, SubjectPublicKeyInfo,
};
use time::{Duration, OffsetDateTime};

use crate::certs::ca::{self, KeyedCert};

/// How long an intermediate lives (capped by the CA's own NotAfter).
pub const INTERMEDIATE_LIFETIME: Duration = Duration::days(30);

/// The object identifier of the name constraints extension (RFC 5280, 4.2.1.10).
const NAME_CONSTRAINTS: &[u64] = &[2, 5, 29, 30];

#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum SignError {
    /// The subject key is not one rcgen can name in a certificate.
    #[error("unsupported public key: {0}")]
    UnsupportedKey(String),
    #[error("the stub certificate request is not a PKCS#10 request: {0}")]
    MalformedRequest(String),
    #[error("issuing: {0}")]
    Issue(#[from] rcgen::Error),
    #[error(transparent)]
    Ca(#[from] ca::CaError),
    #[error("the intermediate cannot cover a certificate until {0}")]
    IntermediateTooShort(OffsetDateTime),
}

impl SignError {
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

/// The SubjectPublicKeyInfo (DER) of a DER PKCS#10 request. The API server checked its
/// signature at creation; only the key is read.
pub fn spki_of_request(csr_der: &[u8]) -> Result<Vec<u8>, SignError> {
    use x509_parser::prelude::FromDer;
    let (_, csr) = x509_parser::certification_request::X509CertificationRequest::from_der(csr_der)
        .map_err(|e| SignError::MalformedRequest(e.to_string()))?;
    Ok(csr.certification_request_info.subject_pki.raw.to_vec())
}

/// The subject key as rcgen takes it; `UnsupportedKey` for a type it cannot name (with the ring
/// backend: P-521).
pub fn subject_key(spki_der: &[u8]) -> Result<SubjectPublicKeyInfo, SignError> {
    SubjectPublicKeyInfo::from_der(spki_der).map_err(|e| SignError::UnsupportedKey(e.to_string()))
}

/// An intermediate CA for identities, issued by `root` (Splice's active CA).
pub struct Intermediate {
    /// The root's certificate it was issued by, to tell when the active CA changed.
    pub root_pem: String,
    pub cert_pem: String,
    pub not_after: OffsetDateTime,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Intermediate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intermediate")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// The DER of a name constraints extension permitting only URIs whose host is `trust_domain`
/// (rcgen's subtrees have no URI form). A SPIFFE ID's host is its trust domain.
fn uri_name_constraints(trust_domain: &str) -> Vec<u8> {
    fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        let len = content.len();
        if len < 0x80 {
            out.push(len as u8);
        } else if len < 0x100 {
            out.extend([0x81, len as u8]);
        } else {
            out.extend([0x82, (len >> 8) as u8, len as u8]);
        }
        out.extend_from_slice(content);
        out
    }
    // NameConstraints { permittedSubtrees [0] { GeneralSubtree { uniformResourceIdentifier [6] } } }
    let uri = tlv(0x86, trust_domain.as_bytes());
    let subtree = tlv(0x30, &uri);
    let permitted = tlv(0xa0, &subtree);
    tlv(0x30, &permitted)
}

fn offset(ts: i64) -> Result<OffsetDateTime, SignError> {
    OffsetDateTime::from_unix_timestamp(ts).map_err(|e| {
        SignError::Ca(ca::CaError::BadCertificate {
            what: "the CA certificate",
            reason: e.to_string(),
        })
    })
}

impl Intermediate {
    /// A new intermediate under `root`, living [`INTERMEDIATE_LIFETIME`] but never past the
    /// root, path length 0, URIs constrained to `trust_domain`.
    pub fn new(
        root: &KeyedCert,
        trust_domain: &str,
        now: OffsetDateTime,
    ) -> Result<Self, SignError> {
        let root_info = ca::inspect(&root.cert_pem, "the CA certificate")?;
        let root_issuer =
            Issuer::from_ca_cert_pem(&root.cert_pem, KeyPair::from_pem(&root.key_pem)?)?;
        let mut params = ca::ca_params_named("splice identity signer", 0)?;
        let mut constraints =
            CustomExtension::from_oid_content(NAME_CONSTRAINTS, uri_name_constraints(trust_domain));
        constraints.set_criticality(true);
        params.custom_extensions = vec![constraints];
        params.not_before = now - ca::BACKDATE;
        let not_after = (now + INTERMEDIATE_LIFETIME).min(offset(root_info.not_after)?);
        params.not_after = not_after;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let cert = params.signed_by(&key, &root_issuer)?;
        let cert_pem = cert.pem();
        Ok(Intermediate {
            root_pem: root.cert_pem.clone(),
            issuer: Issuer::from_ca_cert_pem(&cert_pem, key)?,
            cert_pem,
            not_after,
        })
    }

    /// Whether it may still sign for `root` a leaf living until `until`.
    pub fn serves(&self, root: &KeyedCert, until: OffsetDateTime) -> bool {
        self.root_pem == root.cert_pem && self.not_after >= until
    }

    /// A leaf for `spiffe_id` and the key `subject`, valid `not_before..not_after`: the chain,
    /// leaf then this intermediate, PEM.
    pub fn issue(
        &self,
        subject: &SubjectPublicKeyInfo,
        rsa: bool,
        spiffe_id: &str,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> Result<String, SignError> {
        if not_after > self.not_after {
            return Err(SignError::IntermediateTooShort(not_after));
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = vec![SanType::URI(spiffe_id.try_into()?)];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = if rsa {
            vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ]
        } else {
            vec![KeyUsagePurpose::DigitalSignature]
        };
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_identifier_method = KeyIdMethod::Sha256;
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(ca::random_serial()?);
        params.not_before = not_before;
        params.not_after = not_after;
        let leaf = params.signed_by(subject, &self.issuer)?;
        Ok(format!("{}{}", leaf.pem(), self.cert_pem))
    }
}

/// Whether a SubjectPublicKeyInfo holds an RSA key (its leaves may also encipher keys).
pub fn is_rsa(spki_der: &[u8]) -> bool {
    use x509_parser::prelude::FromDer;
    x509_parser::x509::SubjectPublicKeyInfo::from_der(spki_der).is_ok_and(|(_, s)| {
        s.algorithm.algorithm == x509_parser::oid_registry::OID_PKCS1_RSAENCRYPTION
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use rcgen::{PKCS_ECDSA_P384_SHA384, PKCS_ED25519, SignatureAlgorithm};
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    use x509_parser::pem::Pem;
    use x509_parser::prelude::X509Certificate;

    use super::*;

    pub(crate) fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
    }

    pub(crate) fn root() -> KeyedCert {
        ca::new_ca(now(), Duration::days(365)).unwrap()
    }

    /// A DER PKCS#10 request for a fresh key of `alg`, as the kubelet makes one (empty subject).
    pub(crate) fn csr(alg: &'static SignatureAlgorithm) -> Vec<u8> {
        let key = KeyPair::generate_for(alg).unwrap();
        let params = CertificateParams::default();
        params.serialize_request(&key).unwrap().der().to_vec()
    }

    fn pems(chain: &str) -> Vec<Pem> {
        Pem::iter_from_buffer(chain.as_bytes())
            .map(Result::unwrap)
            .collect()
    }

    fn issue(alg: &'static SignatureAlgorithm) -> (KeyedCert, String) {
        let root = root();
        let inter = Intermediate::new(&root, "cluster.local", now()).unwrap();
        let spki = spki_of_request(&csr(alg)).unwrap();
        let key = subject_key(&spki).unwrap();
        let chain = inter
            .issue(
                &key,
                is_rsa(&spki),
                "spiffe://cluster.local/ns/shop/sa/web",
                now(),
                now() + Duration::hours(24),
            )
            .unwrap();
        (root, chain)
    }

    #[test]
    fn a_leaf_verifies_up_to_the_root_and_names_only_its_spiffe_id() {
        for alg in [
            &PKCS_ECDSA_P256_SHA256,
            &PKCS_ECDSA_P384_SHA384,
            &PKCS_ED25519,
        ] {
            let (root, chain) = issue(alg);
            let chain = pems(&chain);
            let [leaf, inter] = chain.as_slice() else {
                panic!("leaf then intermediate")
            };
            let root = pems(&root.cert_pem).remove(0);
            let (leaf, inter, root): (X509Certificate, X509Certificate, X509Certificate) = (
                leaf.parse_x509().unwrap(),
                inter.parse_x509().unwrap(),
                root.parse_x509().unwrap(),
            );
            leaf.verify_signature(Some(inter.public_key())).unwrap();
            inter.verify_signature(Some(root.public_key())).unwrap();
            assert!(leaf.subject().iter().next().is_none(), "no subject");
            let san = leaf.subject_alternative_name().unwrap().unwrap();
            assert_eq!(
                san.value.general_names,
                vec![GeneralName::URI("spiffe://cluster.local/ns/shop/sa/web")]
            );
            assert!(!leaf.is_ca());
            let eku = leaf.extended_key_usage().unwrap().unwrap().value;
            assert!(eku.server_auth && eku.client_auth);
            let ku = leaf.key_usage().unwrap().unwrap().value;
            assert!(ku.digital_signature() && !ku.key_encipherment());
            assert_eq!(
                leaf.validity().not_before.timestamp(),
                now().unix_timestamp()
            );
            assert_eq!(
                leaf.validity().not_after.timestamp(),
                (now() + Duration::hours(24)).unix_timestamp()
            );
            let bc = inter.basic_constraints().unwrap().unwrap().value;
            assert!(bc.ca && bc.path_len_constraint == Some(0));
        }
    }

    #[test]
    fn the_intermediate_permits_only_uris_of_the_trust_domain() {
        let inter = Intermediate::new(&root(), "cluster.local", now()).unwrap();
        let pem = pems(&inter.cert_pem).remove(0);
        let cert = pem.parse_x509().unwrap();
        let nc = cert
            .extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::NameConstraints(nc) => Some((e.critical, nc.clone())),
                _ => None,
            })
            .unwrap();
        assert!(nc.0, "critical");
        let permitted = nc.1.permitted_subtrees.unwrap();
        assert_eq!(permitted.len(), 1);
        assert_eq!(permitted[0].base, GeneralName::URI("cluster.local"));
    }

    #[test]
    fn a_leaf_never_outlives_its_intermediate_and_a_new_root_needs_a_new_intermediate() {
        let root = root();
        let inter = Intermediate::new(&root, "cluster.local", now()).unwrap();
        assert!(inter.serves(&root, now() + Duration::days(29)));
        assert!(!inter.serves(&root, now() + Duration::days(31)));
        assert!(!inter.serves(&super::tests::root(), now()));
        let key = subject_key(&spki_of_request(&csr(&PKCS_ED25519)).unwrap()).unwrap();
        let late = inter.issue(
            &key,
            false,
            "spiffe://cluster.local/ns/a/sa/b",
            now(),
            now() + Duration::days(31),
        );
        assert!(matches!(late, Err(SignError::IntermediateTooShort(_))));
    }

    #[test]
    fn malformed_requests_and_unknown_keys_are_named() {
        assert_eq!(
            spki_of_request(b"nope").unwrap_err().label(),
            "malformed_request"
        );
        assert_eq!(
            subject_key(b"\x30\x00").unwrap_err().label(),
            "unsupported_key"
        );
    }
}
