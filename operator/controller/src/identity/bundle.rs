//! The identity trust bundle: which roots the ClusterTrustBundle `splice.dev:identity:<Splice's
//! namespace>` holds, and the object itself. Pure.
//!
//! One bundle per Splice instance, since each has its own CA; pods project every bundle of the
//! signer (`labelSelector: {}`), so peers injected by different instances trust each other.
//! The roots are the instance's CA bundle (one CA, two during a rotation) plus every root the
//! bundle published before that some live issued certificate still chains to: a pod issued under
//! the old CA keeps being trusted by its peers until its certificate expires.

use std::collections::BTreeMap;

use k8s_openapi::api::certificates::v1beta1::{ClusterTrustBundle, ClusterTrustBundleSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use splice_crds::{IDENTITY_SIGNER, MANAGED_BY_LABEL, MANAGER};

use crate::certs::ca::{inspect, split_bundle};

/// The name every Splice used before bundles were per instance; a leader deletes it if Splice
/// made it, since its roots are no longer kept.
pub const LEGACY_NAME: &str = "splice.dev:identity:roots";

/// The bundle of the Splice instance in `namespace`: signer-linked names start with the signer
/// name, `/` turned to `:`, then `:`.
pub fn name(namespace: &str) -> String {
    format!("{}:{namespace}", IDENTITY_SIGNER.replace('/', ":"))
}

/// Annotation on the bundle: until when (unix seconds) each root no longer in the CA bundle is
/// kept, by key id. Written the first time the root is seen leaving, so a new leader keeps the
/// date; requests cannot say it, since the controller-manager deletes them after 15 minutes.
pub const KEPT_UNTIL: &str = "splice.dev/roots-kept-until";

/// The roots to publish and the [`KEPT_UNTIL`] dates: `ca_bundle` first, then each root of
/// `published` that left it less than `hold` seconds ago (a certificate chaining to it may live
/// that long: the longest lifetime, plus the time the signer may still issue under it).
pub fn roots(
    ca_bundle: &str,
    published: &str,
    kept_until: &BTreeMap<String, i64>,
    now: i64,
    hold: i64,
) -> (Vec<String>, BTreeMap<String, i64>) {
    let mut out = split_bundle(ca_bundle);
    let mut until = BTreeMap::new();
    for root in split_bundle(published) {
        if out.contains(&root) {
            continue;
        }
        let Ok(info) = inspect(&root, "a published root") else {
            continue;
        };
        let kept = kept_until
            .get(&info.key_id)
            .copied()
            .unwrap_or(now.saturating_add(hold));
        if now < kept {
            out.push(root);
            until.insert(info.key_id, kept);
        }
    }
    (out, until)
}

/// The [`KEPT_UNTIL`] dates `bundle` carries; none when absent or unreadable (every retired root
/// is then kept for a whole hold again: too long, never too short).
pub fn kept_until(bundle: &ClusterTrustBundle) -> BTreeMap<String, i64> {
    bundle
        .annotations()
        .get(KEPT_UNTIL)
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// Whether `root` (one PEM certificate) is among the roots `published` holds.
pub fn holds(published: &str, root: &str) -> bool {
    split_bundle(root)
        .first()
        .is_some_and(|r| split_bundle(published).contains(r))
}

/// The ClusterTrustBundle `name` holding `roots`, with the dates retired ones are kept until.
pub fn desired(
    name: &str,
    roots: &[String],
    kept_until: &BTreeMap<String, i64>,
) -> ClusterTrustBundle {
    let annotations = (!kept_until.is_empty()).then(|| {
        BTreeMap::from([(
            KEPT_UNTIL.to_owned(),
            serde_json::to_string(kept_until).unwrap_or_default(),
        )])
    });
    ClusterTrustBundle {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            annotations,
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
    use super::*;
    use crate::identity::sign::tests::root;

    const HOLD: i64 = 86_400 + 120;

    fn key_id(pem: &str) -> String {
        inspect(pem, "root").unwrap().key_id
    }

    #[test]
    fn a_retired_root_is_kept_for_the_hold_from_when_it_left_even_across_leaders() {
        let (old, new) = (root(), root());
        let both = format!("{}{}", old.cert_pem, new.cert_pem);
        // Retired at t=100: kept, dated t=100+HOLD.
        let (kept, until) = roots(&new.cert_pem, &both, &BTreeMap::new(), 100, HOLD);
        assert_eq!(kept, vec![new.cert_pem.clone(), old.cert_pem.clone()]);
        assert_eq!(until, BTreeMap::from([(key_id(&old.cert_pem), 100 + HOLD)]));
        // Later passes (any leader reading the annotation back) keep the date, not a new one.
        let published = desired("b", &kept, &until);
        let read = kept_until(&published);
        let (again, until_again) = roots(&new.cert_pem, &both, &read, 5_000, HOLD);
        assert_eq!((again.len(), &until_again), (2, &until));
        // At the date it goes.
        let (gone, none) = roots(&new.cert_pem, &both, &read, 100 + HOLD, HOLD);
        assert_eq!(gone, vec![new.cert_pem.clone()]);
        assert!(none.is_empty());
        assert!(desired("b", &gone, &none).metadata.annotations.is_none());
    }

    #[test]
    fn the_ca_bundle_is_kept_whole_and_never_twice() {
        let (a, b) = (root(), root());
        let bundle = format!("{}{}", a.cert_pem, b.cert_pem);
        let (kept, until) = roots(&bundle, &bundle, &BTreeMap::new(), 0, HOLD);
        assert_eq!(kept, vec![a.cert_pem, b.cert_pem]);
        assert!(until.is_empty());
    }

    #[test]
    fn an_unreadable_date_keeps_the_root_for_a_whole_hold_again() {
        let (old, new) = (root(), root());
        let mut published = desired(
            "b",
            &[new.cert_pem.clone(), old.cert_pem.clone()],
            &BTreeMap::new(),
        );
        published.metadata.annotations =
            Some(BTreeMap::from([(KEPT_UNTIL.into(), "{oops".into())]));
        let read = kept_until(&published);
        let (kept, until) = roots(&new.cert_pem, &published.spec.trust_bundle, &read, 7, HOLD);
        assert_eq!(kept.len(), 2);
        assert_eq!(until[&key_id(&old.cert_pem)], 7 + HOLD);
    }

    #[test]
    fn each_instance_has_its_own_signer_linked_and_labelled_bundle() {
        let b = desired(&name("splice-system"), &["x".into()], &BTreeMap::new());
        assert_eq!(
            b.metadata.name.as_deref(),
            Some("splice.dev:identity:splice-system")
        );
        assert_ne!(name("a"), name("b"));
        assert_eq!(b.spec.signer_name.as_deref(), Some(IDENTITY_SIGNER));
        assert_eq!(b.metadata.labels.unwrap()[MANAGED_BY_LABEL], MANAGER);
    }
}
