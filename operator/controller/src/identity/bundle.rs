//! The identity trust bundle: which roots the ClusterTrustBundle `splice.dev:identity:roots`
//! holds, and the object itself. Pure.
//!
//! The roots are Splice's CA bundle (one CA, two during a rotation) plus every root the bundle
//! published before that some live issued certificate still chains to: a pod issued under the
//! old CA keeps being trusted by its peers until its certificate expires.

use std::collections::BTreeMap;

use k8s_openapi::api::certificates::v1beta1::{
    ClusterTrustBundle, ClusterTrustBundleSpec, PodCertificateRequest,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use splice_crds::{IDENTITY_SIGNER, MANAGED_BY_LABEL, MANAGER};

use crate::certs::ca::{inspect, split_bundle};

/// The bundle's name: signer-linked names start with the signer name, `/` turned to `:`.
pub const BUNDLE_NAME: &str = "splice.dev:identity:roots";

/// Of an issued certificate: the key id of the root its intermediate was issued by, and when
/// the leaf expires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chained {
    pub root_key_id: String,
    pub not_after: i64,
}

/// What `pcr`'s issued chain (leaf, intermediate) says of its root; `None` when not issued by
/// this signer's chain shape.
pub fn chained(pcr: &PodCertificateRequest) -> Option<Chained> {
    let status = pcr.status.as_ref()?;
    let chain = split_bundle(status.certificate_chain.as_deref()?);
    let leaf = inspect(chain.first()?, "an issued certificate").ok()?;
    let intermediate = inspect(chain.get(1)?, "an identity intermediate").ok()?;
    Some(Chained {
        root_key_id: intermediate.issuer_key_id,
        not_after: leaf.not_after,
    })
}

/// The roots to publish: `ca_bundle` first, then each root of `published` that is not in it and
/// that a certificate in `issued` living past `now` chains to.
pub fn roots(ca_bundle: &str, published: &str, issued: &[Chained], now: i64) -> Vec<String> {
    let mut out = split_bundle(ca_bundle);
    for root in split_bundle(published) {
        if out.contains(&root) {
            continue;
        }
        let Ok(info) = inspect(&root, "a published root") else {
            continue;
        };
        let needed = issued
            .iter()
            .any(|c| c.not_after > now && !info.key_id.is_empty() && c.root_key_id == info.key_id);
        if needed {
            out.push(root);
        }
    }
    out
}

/// The ClusterTrustBundle holding `roots`.
pub fn desired(roots: &[String]) -> ClusterTrustBundle {
    ClusterTrustBundle {
        metadata: ObjectMeta {
            name: Some(BUNDLE_NAME.to_owned()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_owned(),
                MANAGER.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: ClusterTrustBundleSpec {
            signer_name: Some(IDENTITY_SIGNER.to_owned()),
            trust_bundle: roots.concat(),
        },
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::certificates::v1beta1::PodCertificateRequestStatus;
    use time::Duration;

    use super::*;
    use crate::identity::sign::Intermediate;
    use crate::identity::sign::tests::{csr, now, root};
    use crate::identity::sign::{spki_of_request, subject_key};

    fn issued_by(root: &crate::certs::ca::KeyedCert, hours: i64) -> PodCertificateRequest {
        let inter = Intermediate::new(root, "cluster.local", now()).unwrap();
        let key = subject_key(&spki_of_request(&csr(&rcgen::PKCS_ED25519)).unwrap()).unwrap();
        let chain = inter
            .issue(
                &key,
                false,
                "spiffe://cluster.local/ns/a/sa/b",
                now(),
                now() + Duration::hours(hours),
            )
            .unwrap();
        PodCertificateRequest {
            status: Some(PodCertificateRequestStatus {
                certificate_chain: Some(chain),
                ..PodCertificateRequestStatus::default()
            }),
            ..PodCertificateRequest::default()
        }
    }

    #[test]
    fn an_old_root_stays_while_a_live_certificate_chains_to_it_and_goes_after() {
        let (old, new) = (root(), root());
        let live = chained(&issued_by(&old, 24)).unwrap();
        let t = now().unix_timestamp();
        let kept = roots(&new.cert_pem, &old.cert_pem, std::slice::from_ref(&live), t);
        assert_eq!(kept, vec![new.cert_pem.clone(), old.cert_pem.clone()]);
        let expired = roots(&new.cert_pem, &old.cert_pem, &[live], t + 25 * 3600);
        assert_eq!(expired, vec![new.cert_pem.clone()]);
        // A published root no certificate chains to is dropped at once.
        assert_eq!(
            roots(&new.cert_pem, &old.cert_pem, &[], t),
            vec![new.cert_pem]
        );
    }

    #[test]
    fn the_ca_bundle_is_kept_whole_and_never_twice() {
        let (a, b) = (root(), root());
        let bundle = format!("{}{}", a.cert_pem, b.cert_pem);
        assert_eq!(
            roots(&bundle, &bundle, &[], 0),
            vec![a.cert_pem, b.cert_pem]
        );
    }

    #[test]
    fn the_bundle_is_signer_linked_and_labelled() {
        let b = desired(&["x".into()]);
        assert!(BUNDLE_NAME.starts_with(&format!("{}:", IDENTITY_SIGNER.replace('/', ":"))));
        assert_eq!(b.spec.signer_name.as_deref(), Some(IDENTITY_SIGNER));
        assert_eq!(b.metadata.labels.unwrap()[MANAGED_BY_LABEL], MANAGER);
    }
}
