//! `spec.identity`: the pod's own certificate from Splice's signer.
//!
//! Identity is not a second injection: [`template`] folds its volumes and read-only mounts into
//! the policy's template, so the planner, the conflict checks, reinvocation, the
//! `splice.dev/status` record, the template hash and `splice inject` treat them as the author's
//! own items. [`check`] refuses what would not mount; `{{ identity.spiffeID }}` is rendered per
//! request from the run's trust domain ([`context`]).

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{
    ClusterTrustBundleProjection, Container, PodCertificateProjection, ProjectedVolumeSource,
    Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use minijinja::Value as JValue;
use splice_crds::{
    IDENTITY_SIGNER, IDENTITY_TRUST_VOLUME, IDENTITY_VOLUME, Identity, InjectionPolicySpec,
    InjectionTemplate,
};

/// The file of the `podCertificate` projection: the key, then the chain, leaf first.
pub const CREDENTIAL_BUNDLE_FILE: &str = "credentialbundle.pem";
/// The file of the `clusterTrustBundle` projection.
pub const TRUST_BUNDLE_FILE: &str = "ca.pem";
/// Why `spec.identity` cannot work on an API server without PodCertificateRequests: said by
/// `/validate` at apply and by the Ready condition (`PodCertificatesUnavailable`).
pub const UNSERVED: &str = "the API server does not serve certificates.k8s.io/v1beta1 \
    podcertificaterequests (feature gate PodCertificateRequest and --runtime-config \
    certificates.k8s.io/v1beta1/podcertificaterequests=true): it drops a podCertificate volume \
    without a word, so no pod would get a certificate";
/// The trust domain when the run names none (`--trust-domain`).
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";
/// The service account a pod runs as when its spec names none.
const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// The SPIFFE ID Splice's signer certifies for a pod: one per service account and namespace.
pub fn spiffe_id(trust_domain: &str, namespace: &str, service_account: Option<&str>) -> String {
    let sa = service_account
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_SERVICE_ACCOUNT);
    format!("spiffe://{trust_domain}/ns/{namespace}/sa/{sa}")
}

/// The `identity` a template reads, for a pod of `namespace` given as JSON (`spec` inside).
pub(crate) fn context(trust_domain: &str, namespace: &str, pod: &serde_json::Value) -> JValue {
    let sa = pod
        .pointer("/spec/serviceAccountName")
        .and_then(serde_json::Value::as_str);
    minijinja::context! { spiffeID => spiffe_id(trust_domain, namespace, sa) }
}

/// The template as injected: `spec.template` plus, with `spec.identity`, its volumes and each
/// chosen injected container's mounts of them. Borrowed when the policy has no identity.
pub fn template(spec: &InjectionPolicySpec) -> Cow<'_, InjectionTemplate> {
    let Some(id) = &spec.identity else {
        return Cow::Borrowed(&spec.template);
    };
    let mut t = spec.template.clone();
    t.volumes.push(Volume {
        name: IDENTITY_VOLUME.into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![VolumeProjection {
                pod_certificate: Some(PodCertificateProjection {
                    signer_name: IDENTITY_SIGNER.into(),
                    key_type: <&str>::from(id.key_type).into(),
                    max_expiration_seconds: Some(id.max_expiration_seconds),
                    credential_bundle_path: Some(CREDENTIAL_BUNDLE_FILE.into()),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    });
    if id.trust_bundle_path.is_some() {
        t.volumes.push(Volume {
            name: IDENTITY_TRUST_VOLUME.into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection {
                    cluster_trust_bundle: Some(ClusterTrustBundleProjection {
                        signer_name: Some(IDENTITY_SIGNER.into()),
                        // Unset would select nothing; empty selects every bundle of the signer,
                        // which only holders of `attest` on it can publish (the old and new CA
                        // during a rotation alike).
                        label_selector: Some(LabelSelector::default()),
                        path: TRUST_BUNDLE_FILE.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    for c in t.init_containers.iter_mut().chain(t.containers.iter_mut()) {
        if mounts_in(id, &c.name) {
            c.volume_mounts
                .get_or_insert_with(Vec::new)
                .extend(mounts(id));
        }
    }
    Cow::Owned(t)
}

/// Whether the injected container `name` mounts the identity.
fn mounts_in(id: &Identity, name: &str) -> bool {
    id.containers.is_empty() || id.containers.iter().any(|c| c == name)
}

/// The read-only mounts of the identity volumes.
fn mounts(id: &Identity) -> impl Iterator<Item = VolumeMount> + '_ {
    paths(id).map(|(volume, path, _)| VolumeMount {
        name: volume.into(),
        mount_path: path.into(),
        read_only: Some(true),
        ..Default::default()
    })
}

/// (volume, mount path, field) of each identity mount.
fn paths(id: &Identity) -> impl Iterator<Item = (&'static str, &str, &'static str)> + '_ {
    std::iter::once((IDENTITY_VOLUME, id.mount_path.as_str(), "mountPath")).chain(
        id.trust_bundle_path
            .as_deref()
            .map(|p| (IDENTITY_TRUST_VOLUME, p, "trustBundlePath")),
    )
}

/// What makes `spec.identity` unusable with this template: (field, message).
pub(crate) fn check(spec: &InjectionPolicySpec) -> Result<(), (String, String)> {
    let Some(id) = &spec.identity else {
        return Ok(());
    };
    let t = &spec.template;
    let injected: Vec<&Container> = t.init_containers.iter().chain(&t.containers).collect();
    if injected.is_empty() {
        return Err((
            "spec.identity".into(),
            "the template injects no container or init container, so nothing would mount the \
             identity"
                .into(),
        ));
    }
    for (i, name) in id.containers.iter().enumerate() {
        if !injected.iter().any(|c| &c.name == name) {
            return Err((
                format!("spec.identity.containers[{i}]"),
                format!(
                    "{name:?} is not a container or init container of spec.template (the \
                     identity is only mounted in injected containers)"
                ),
            ));
        }
    }
    // The signer signs with ring, which has no P-521: every such request would be denied.
    if id.key_type == splice_crds::IdentityKeyType::EcdsaP521 {
        return Err((
            "spec.identity.keyType".into(),
            "Splice's signer does not issue for ECDSAP521 keys; use ECDSAP256, ECDSAP384, \
             ED25519, RSA3072 or RSA4096"
                .into(),
        ));
    }
    if let Some(trust) = &id.trust_bundle_path
        && trust == &id.mount_path
    {
        return Err((
            "spec.identity.trustBundlePath".into(),
            format!("{trust:?} is also spec.identity.mountPath"),
        ));
    }
    for (list, items) in [
        ("initContainers", &t.init_containers),
        ("containers", &t.containers),
    ] {
        for (i, c) in items.iter().enumerate() {
            if !mounts_in(id, &c.name) {
                continue;
            }
            for (j, m) in c.volume_mounts.iter().flatten().enumerate() {
                if let Some((_, path, field)) = paths(id).find(|(_, p, _)| *p == m.mount_path) {
                    return Err((
                        format!("spec.identity.{field}"),
                        format!(
                            "{path:?} is already the mountPath of \
                             spec.template.{list}[{i}].volumeMounts[{j}]"
                        ),
                    ));
                }
            }
        }
    }
    for (i, v) in t.volumes.iter().enumerate() {
        if v.name == IDENTITY_VOLUME || v.name == IDENTITY_TRUST_VOLUME {
            return Err((
                format!("spec.template.volumes[{i}].name"),
                format!("{:?} is reserved for spec.identity's volumes", v.name),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use serde_json::{Value, json};
    use splice_crds::{Mode, Operation};

    use super::DEFAULT_TRUST_DOMAIN;
    use crate::*;

    /// A policy injecting an init container and a sidecar, with `identity` as given (YAML).
    fn spec(identity: &str, annotation: &str) -> splice_crds::InjectionPolicySpec {
        serde_yaml::from_str(&format!(
            r#"
template:
  initContainers:
    - {{name: setup, image: "setup:1"}}
  containers:
    - name: proxy
      image: "proxy:1"
      volumeMounts: [{{name: scratch, mountPath: /scratch}}]
  volumes:
    - {{name: scratch, emptyDir: {{}}}}
  annotations:
    example.com/id: {annotation:?}
{identity}
"#
        ))
        .unwrap()
    }

    const IDENTITY: &str = "identity:\n  mountPath: /var/run/identity\n  keyType: ED25519\n  \
                            maxExpirationSeconds: 7200\n  trustBundlePath: /var/run/trust";

    fn compile(spec: &splice_crds::InjectionPolicySpec) -> Result<CompiledPolicy, PolicyError> {
        CompiledPolicy::compile("ident", 1, spec)
    }

    const POD: &str = r#"{"metadata":{"name":"web","namespace":"shop"},
        "spec":{"serviceAccountName":"web-sa","containers":[{"name":"app","image":"app:1"}]}}"#;

    /// The pod after `policy`'s injection in namespace `shop`, with the patch's warnings.
    fn apply(policy: &CompiledPolicy, pod: &str, trust_domain: &str) -> (Value, Injection) {
        let ns = NamespaceContext {
            name: "shop".into(),
            ..Default::default()
        };
        let ex = Exclusions::default_for("splice-system");
        let object = Pod::parse(pod).unwrap();
        let req = PodRequest {
            operation: Operation::Create,
            object: &object,
            namespace: &ns,
            exclusions: &ex,
            trust_domain,
            selection: Selection::Evaluate,
        };
        match inject_and_apply(policy, &req).unwrap() {
            (Decision::Inject(i), pod) => (pod, i),
            (other, _) => panic!("expected an injection, got {other:?}"),
        }
    }

    fn mounts(pod: &Value, list: &str, name: &str) -> Value {
        pod["spec"][list]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c["volumeMounts"].clone())
            .unwrap_or(Value::Null)
    }

    fn identity_mounts() -> Value {
        json!([
            {"name": "splice-identity", "mountPath": "/var/run/identity", "readOnly": true},
            {"name": "splice-identity-trust", "mountPath": "/var/run/trust", "readOnly": true},
        ])
    }

    #[test]
    fn identity_injects_the_pod_certificate_and_trust_bundle_volumes_read_only_in_every_injected_container()
     {
        let policy = compile(&spec(IDENTITY, "x")).unwrap();
        let (pod, _) = apply(&policy, POD, DEFAULT_TRUST_DOMAIN);
        assert_eq!(
            pod["spec"]["volumes"],
            json!([
                {"name": "scratch", "emptyDir": {}},
                {"name": "splice-identity", "projected": {"sources": [{"podCertificate": {
                    "signerName": "splice.dev/identity",
                    "keyType": "ED25519",
                    "maxExpirationSeconds": 7200,
                    "credentialBundlePath": "credentialbundle.pem",
                }}]}},
                {"name": "splice-identity-trust", "projected": {"sources": [{"clusterTrustBundle": {
                    "signerName": "splice.dev/identity",
                    "labelSelector": {},
                    "path": "ca.pem",
                }}]}},
            ])
        );
        assert_eq!(mounts(&pod, "initContainers", "setup"), identity_mounts());
        let mut proxy = json!([{"name": "scratch", "mountPath": "/scratch"}]);
        proxy
            .as_array_mut()
            .unwrap()
            .extend(identity_mounts().as_array().unwrap().iter().cloned());
        assert_eq!(mounts(&pod, "containers", "proxy"), proxy);
        // The application's own container is the template's, not the identity's.
        assert_eq!(mounts(&pod, "containers", "app"), Value::Null);
        // The status record lists the volumes, so coverage and rollout see them.
        let record = provenance(&pod.to_string()).unwrap();
        assert_eq!(
            record["ident"].volumes,
            ["scratch", "splice-identity", "splice-identity-trust"]
        );
    }

    #[test]
    fn without_a_trust_bundle_path_only_the_certificate_volume_is_injected() {
        let policy = compile(&spec("identity: {mountPath: /id}", "x")).unwrap();
        let (pod, _) = apply(&policy, POD, DEFAULT_TRUST_DOMAIN);
        let names: Vec<&Value> = pod["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| &v["name"])
            .collect();
        assert_eq!(names, ["scratch", "splice-identity"]);
        assert_eq!(
            pod["spec"]["volumes"][1]["projected"]["sources"][0]["podCertificate"],
            json!({"signerName": "splice.dev/identity", "keyType": "ECDSAP256",
                   "maxExpirationSeconds": 86400, "credentialBundlePath": "credentialbundle.pem"})
        );
    }

    #[test]
    fn identity_containers_mounts_it_only_in_the_named_injected_containers() {
        let policy = compile(&spec(
            "identity: {mountPath: /id, containers: [proxy]}",
            "x",
        ))
        .unwrap();
        let (pod, _) = apply(&policy, POD, DEFAULT_TRUST_DOMAIN);
        assert_eq!(mounts(&pod, "initContainers", "setup"), Value::Null);
        assert_eq!(
            mounts(&pod, "containers", "proxy"),
            json!([{"name": "scratch", "mountPath": "/scratch"},
                   {"name": "splice-identity", "mountPath": "/id", "readOnly": true}])
        );
    }

    #[test]
    fn a_reinvoked_identity_injection_changes_nothing() {
        let policy = compile(&spec(IDENTITY, "{{ identity.spiffeID }}")).unwrap();
        let (once, _) = apply(&policy, POD, DEFAULT_TRUST_DOMAIN);
        let (twice, again) = apply(&policy, &once.to_string(), DEFAULT_TRUST_DOMAIN);
        assert!(!again.changed, "{}", String::from_utf8_lossy(&again.patch));
        assert_eq!(once, twice);
    }

    #[test]
    fn a_pod_that_already_has_a_splice_identity_volume_keeps_its_own_like_any_template_volume() {
        let pod = r#"{"metadata":{"name":"web","namespace":"shop"},"spec":{
            "containers":[{"name":"app","image":"app:1"}],
            "volumes":[{"name":"splice-identity","emptyDir":{}}]}}"#;
        let policy = compile(&spec("identity: {mountPath: /id}", "x")).unwrap();
        let (out, injection) = apply(&policy, pod, DEFAULT_TRUST_DOMAIN);
        let own: Vec<&Value> = out["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["name"] == "splice-identity")
            .collect();
        assert_eq!(own, [&json!({"name": "splice-identity", "emptyDir": {}})]);
        assert!(
            injection
                .warnings
                .iter()
                .any(|w| w.contains("splice-identity")),
            "{:?}",
            injection.warnings
        );
    }

    #[test]
    fn identity_spiffe_id_names_the_trust_domain_the_namespace_and_the_service_account() {
        let policy = compile(&spec(IDENTITY, "{{ identity.spiffeID }}")).unwrap();
        let (pod, _) = apply(&policy, POD, "prod.example");
        assert_eq!(
            pod["metadata"]["annotations"]["example.com/id"],
            "spiffe://prod.example/ns/shop/sa/web-sa"
        );
        let no_sa = r#"{"metadata":{"name":"web"},"spec":{"containers":[{"name":"app"}]}}"#;
        let (pod, _) = apply(&policy, no_sa, DEFAULT_TRUST_DOMAIN);
        assert_eq!(
            pod["metadata"]["annotations"]["example.com/id"],
            "spiffe://cluster.local/ns/shop/sa/default"
        );
    }

    #[test]
    fn reading_identity_without_spec_identity_is_a_compile_error_naming_the_field() {
        let err = compile(&spec("", "{{ identity.spiffeID }}")).unwrap_err();
        assert_eq!(err.field(), "spec.template.annotations[\"example.com/id\"]");
        assert!(
            err.to_string().contains("unknown variable 'identity'")
                && err.to_string().contains("identity needs spec.identity"),
            "{err}"
        );
    }

    fn refusal(identity: &str) -> (String, String) {
        let err = compile(&spec(identity, "x")).unwrap_err();
        (err.field().to_owned(), err.to_string())
    }

    #[test]
    fn a_key_type_the_signer_cannot_sign_is_refused_at_compile_naming_the_ones_it_can() {
        let (field, message) = refusal("identity: {mountPath: /id, keyType: ECDSAP521}");
        assert_eq!(field, "spec.identity.keyType");
        assert!(message.contains("ECDSAP384"), "{message}");
        assert!(compile(&spec("identity: {mountPath: /id, keyType: ED25519}", "x")).is_ok());
    }

    #[test]
    fn identity_containers_must_name_injected_containers() {
        let (field, message) = refusal("identity: {mountPath: /id, containers: [proxy, app]}");
        assert_eq!(field, "spec.identity.containers[1]");
        assert!(message.contains("\"app\" is not a container"), "{message}");
    }

    #[test]
    fn identity_paths_must_not_collide_with_a_mount_of_the_same_container_or_each_other() {
        let (field, message) = refusal("identity: {mountPath: /scratch}");
        assert_eq!(field, "spec.identity.mountPath");
        assert!(
            message.contains("spec.template.containers[0].volumeMounts[0]"),
            "{message}"
        );
        let (field, _) = refusal("identity: {mountPath: /id, trustBundlePath: /scratch}");
        assert_eq!(field, "spec.identity.trustBundlePath");
        let (field, _) = refusal("identity: {mountPath: /id, trustBundlePath: /id}");
        assert_eq!(field, "spec.identity.trustBundlePath");
        // A container that does not mount the identity may use the path for itself.
        compile(&spec(
            "identity: {mountPath: /scratch, containers: [setup]}",
            "x",
        ))
        .unwrap();
    }

    #[test]
    fn identity_needs_an_injected_container_and_its_volume_names_are_reserved() {
        let bare: splice_crds::InjectionPolicySpec =
            serde_yaml::from_str("identity: {mountPath: /id}\ntemplate: {labels: {a: b}}").unwrap();
        assert_eq!(compile(&bare).unwrap_err().field(), "spec.identity");
        let mut taken = spec("identity: {mountPath: /id}", "x");
        taken.template.volumes[0].name = "splice-identity".into();
        assert_eq!(
            compile(&taken).unwrap_err().field(),
            "spec.template.volumes[0].name"
        );
    }

    #[test]
    fn an_identity_policy_runs_on_the_webhook_and_in_tree_names_spec_identity_as_the_reason() {
        let policy = compile(&spec("identity: {mountPath: /id}", "x")).unwrap();
        for requested in [Mode::Auto, Mode::InTree] {
            let decided = intree::decide(requested, Some(&policy), false);
            assert_eq!(decided.effective, Mode::Webhook);
            assert_eq!(decided.webhook_only.unwrap().field, "spec.identity");
        }
        // Without identity the same template runs in-tree.
        let plain = compile(&spec("", "x")).unwrap();
        assert_eq!(
            intree::decide(Mode::Auto, Some(&plain), false).effective,
            Mode::InTree
        );
    }

    #[test]
    fn a_change_of_an_identity_field_changes_the_template_hash() {
        let hash = |identity: &str| {
            compile(&spec(identity, "x"))
                .unwrap()
                .template_hash()
                .to_owned()
        };
        let plain = hash("");
        let with = hash("identity: {mountPath: /id}");
        assert_ne!(plain, with);
        assert_ne!(with, hash("identity: {mountPath: /id, keyType: RSA3072}"));
        assert_ne!(
            with,
            hash("identity: {mountPath: /id, trustBundlePath: /ca}")
        );
        // A policy without identity keeps the hash it had before identity existed.
        assert_eq!(
            plain,
            template::template_hash("ident", &spec("", "x")).unwrap()
        );
    }
}
