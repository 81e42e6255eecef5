//! What the signer does with one PodCertificateRequest: issue (with which SPIFFE ID, key and
//! times), deny or fail. Pure: the pod (its record in the leader's view), the policies and the
//! clock are handed in.
//!
//! A request is issued only for a pod that exists with the request's UID and service account,
//! that a Ready policy with `spec.identity` selects now (namespace and pod selectors, as the
//! webhook and coverage decide), and that carries that policy's injection (its
//! `splice.dev/status` names the policy): a pod that writes its own `podCertificate` volume naming
//! the signer gets nothing. The SPIFFE ID comes from the fields the API server verified
//! (namespace and `spec.serviceAccountName`), never from labels or annotations.

use std::collections::HashMap;

use k8s_openapi::api::certificates::v1beta1::{PodCertificateRequest, PodCertificateRequestStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use splice_crds::{IDENTITY_SIGNER, InjectionPolicy, MIN_IDENTITY_EXPIRATION_SECONDS, condition};
use splice_engine::explain::{selects_namespace, selects_pod};
use splice_engine::{CompiledPolicy, Exclusions, NamespaceContext};

use super::sign;
use crate::view::PodRecord;

pub const ISSUED: &str = "Issued";
pub const DENIED: &str = "Denied";
pub const FAILED: &str = "Failed";

/// The signer's own cap on a certificate's lifetime (24 h), below any request's maximum.
pub const DEFAULT_MAX_LIFETIME_SECONDS: i64 = 86_400;
/// How far a certificate starts in the past, for nodes whose clock runs behind: the API server
/// refuses a notBefore 5 minutes or more from its own clock, so a minute less.
pub const BACKDATE_SECONDS: i64 = 240;
/// The API server wants beginRefreshAt at least this far after notBefore and before notAfter.
pub const REFRESH_MARGIN_SECONDS: i64 = 600;
/// A test knob on the policy: refresh this many seconds after notBefore (at least
/// [`REFRESH_MARGIN_SECONDS`]) rather than at half the lifetime.
pub const REFRESH_AFTER_ANNOTATION: &str = "splice.dev/identity-refresh-after-seconds";

/// The key types the signer can name (rcgen on ring); P-521 is not one of them.
pub const SUPPORTED_KEYS: &str = "ECDSAP256, ECDSAP384, ED25519, RSA3072, RSA4096";

/// What the signer knows besides the request and the pod.
pub struct Scope<'a> {
    pub trust_domain: &'a str,
    pub max_lifetime_seconds: i64,
    pub exclusions: &'a Exclusions,
    pub namespaces: &'a HashMap<String, NamespaceContext>,
    /// Each policy with the revision the webhook serves for it (`None`: not served).
    pub policies: &'a [(&'a InjectionPolicy, Option<&'a CompiledPolicy>)],
}

/// A certificate to issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issue {
    pub spiffe_id: String,
    /// The policy whose injection the pod carries.
    pub policy: String,
    /// The subject's SubjectPublicKeyInfo, DER.
    pub spki: Vec<u8>,
    pub not_before: i64,
    pub not_after: i64,
    pub begin_refresh_at: i64,
}

/// What to do with one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Issue(Issue),
    /// Denied: the request is not one the signer issues for (an Event on the pod too).
    Deny {
        reason: &'static str,
        message: String,
    },
    /// The signer cannot issue it.
    Fail {
        reason: &'static str,
        message: String,
    },
    /// Another Splice instance's to answer: the pod's record names only policies this one does
    /// not manage (`--policy-selector`), so denying would refuse that instance's pod.
    Leave,
}

fn deny(reason: &'static str, message: String) -> Decision {
    Decision::Deny { reason, message }
}

/// Whether the signer still has to answer `pcr`: it names Splice's signer and carries none of
/// Issued, Denied or Failed.
pub fn is_pending(pcr: &PodCertificateRequest) -> bool {
    pcr.spec.signer_name == IDENTITY_SIGNER
        && !pcr
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    [ISSUED, DENIED, FAILED].contains(&c.type_.as_str()) && c.status == "True"
                })
            })
}

/// Whether `policy` is Ready for its current generation.
pub fn ready_now(policy: &InjectionPolicy) -> bool {
    policy.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == condition::READY
                && c.status == "True"
                && c.observed_generation == policy.metadata.generation
        })
    })
}

/// Decides `pcr` for `pod` (`None`: no pod of that name) at `now` (Unix seconds).
pub fn decide(
    pcr: &PodCertificateRequest,
    pod: Option<&PodRecord>,
    signer: &Scope,
    now: i64,
) -> Decision {
    let ns = pcr.namespace().unwrap_or_default();
    let spec = &pcr.spec;
    let named = format!("pod {ns}/{}", spec.pod_name);
    let Some(pod) = pod.filter(|p| p.uid == spec.pod_uid) else {
        return deny(
            "PodNotFound",
            format!("{named} with UID {} does not exist", spec.pod_uid),
        );
    };
    // Unset is "default", as the API server takes it.
    let account = match pod.service_account.as_str() {
        "" => "default",
        named => named,
    };
    if account != spec.service_account_name {
        return deny(
            "ServiceAccountMismatch",
            format!(
                "{named} runs as {account}, the request names {}",
                spec.service_account_name
            ),
        );
    }
    let managed = |name: &str| signer.policies.iter().any(|(p, _)| p.name_any() == name);
    if !pod.injected.is_empty() && !pod.injected.iter().any(|(p, _)| managed(p)) {
        return Decision::Leave;
    }
    let Some((policy, lifetime_cap)) = selecting_policy(pod, &ns, signer) else {
        return deny(
            "NotSelected",
            format!(
                "{named} carries no injection of a Ready InjectionPolicy with spec.identity that selects it"
            ),
        );
    };
    if let Some(keys) = spec
        .unverified_user_annotations
        .as_ref()
        .filter(|a| !a.is_empty())
    {
        let keys: Vec<&str> = keys.keys().map(String::as_str).collect();
        return deny(
            "UnrecognizedAnnotation",
            format!("the signer reads no annotation; got {}", keys.join(", ")),
        );
    }
    let spki = match subject_spki(pcr) {
        Ok(spki) => spki,
        Err(d) => return d,
    };
    let max = i64::from(spec.max_expiration_seconds.unwrap_or(86_400));
    let lifetime = max.min(signer.max_lifetime_seconds).min(lifetime_cap);
    if lifetime < i64::from(MIN_IDENTITY_EXPIRATION_SECONDS) {
        return Decision::Fail {
            reason: "LifetimeTooShort",
            message: format!(
                "the longest lifetime allowed is {lifetime} s, below the API server's 3600 s"
            ),
        };
    }
    let not_before = now - BACKDATE_SECONDS;
    let not_after = not_before + lifetime;
    Decision::Issue(Issue {
        spiffe_id: splice_engine::identity::spiffe_id(
            signer.trust_domain,
            &ns,
            Some(&spec.service_account_name),
        ),
        policy: policy.name_any(),
        spki,
        not_before,
        not_after,
        begin_refresh_at: refresh_at(not_before, not_after, refresh_after(policy)),
    })
}

/// The first policy (by name) that gives `pod` an identity, with its lifetime cap.
fn selecting_policy<'a>(
    pod: &PodRecord,
    ns: &str,
    signer: &'a Scope,
) -> Option<(&'a InjectionPolicy, i64)> {
    let fallback = NamespaceContext {
        name: ns.to_owned(),
        ..NamespaceContext::default()
    };
    let context = signer.namespaces.get(ns).unwrap_or(&fallback);
    let mut found: Vec<(&InjectionPolicy, i64)> = signer
        .policies
        .iter()
        .filter_map(|(policy, compiled)| {
            let identity = policy.spec.identity.as_ref()?;
            let compiled = (*compiled)?;
            let selected = ready_now(policy)
                && selects_namespace(compiled, context, signer.exclusions)
                && selects_pod(compiled, &pod.labels)
                && pod.injected.iter().any(|(p, _)| *p == policy.name_any());
            selected.then_some((*policy, i64::from(identity.max_expiration_seconds)))
        })
        .collect();
    found.sort_by_key(|(p, _)| p.name_any());
    found.into_iter().next()
}

/// The subject key: from the stub PKCS#10 request, else the deprecated pkixPublicKey.
fn subject_spki(pcr: &PodCertificateRequest) -> Result<Vec<u8>, Decision> {
    let spec = &pcr.spec;
    let spki = if !spec.stub_pkc_s10_request.0.is_empty() {
        sign::spki_of_request(&spec.stub_pkc_s10_request.0).map_err(|e| Decision::Fail {
            reason: "MalformedRequest",
            message: e.to_string(),
        })?
    } else {
        match spec.pkix_public_key.as_ref() {
            Some(k) if !k.0.is_empty() => k.0.clone(),
            _ => {
                return Err(Decision::Fail {
                    reason: "MalformedRequest",
                    message: "the request carries no public key".into(),
                });
            }
        }
    };
    sign::subject_key(&spki).map_err(|_| {
        deny(
            "UnsupportedKeyType",
            format!("the signer issues for {SUPPORTED_KEYS} keys"),
        )
    })?;
    Ok(spki)
}

fn refresh_after(policy: &InjectionPolicy) -> Option<i64> {
    policy
        .annotations()
        .get(REFRESH_AFTER_ANNOTATION)?
        .trim()
        .parse()
        .ok()
}

/// Half the lifetime, or `after` seconds past notBefore, kept inside the API server's bounds.
pub fn refresh_at(not_before: i64, not_after: i64, after: Option<i64>) -> i64 {
    let at = not_before + after.unwrap_or((not_after - not_before) / 2);
    at.clamp(
        not_before + REFRESH_MARGIN_SECONDS,
        not_after - REFRESH_MARGIN_SECONDS,
    )
}

fn time(unix: i64) -> Option<Time> {
    Timestamp::from_second(unix).ok().map(Time)
}

fn terminal(
    pcr: &PodCertificateRequest,
    type_: &str,
    reason: &str,
    message: &str,
    now: i64,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: "True".into(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: pcr.metadata.generation,
        last_transition_time: time(now).unwrap_or(Time(Timestamp::UNIX_EPOCH)),
    }
}

/// The status the signer writes for an issued certificate (`chain`: leaf then intermediate).
pub fn issued_status(
    pcr: &PodCertificateRequest,
    issue: &Issue,
    chain: String,
    now: i64,
) -> PodCertificateRequestStatus {
    let message = format!("issued {} for policy {}", issue.spiffe_id, issue.policy);
    PodCertificateRequestStatus {
        conditions: Some(vec![terminal(pcr, ISSUED, "Issued", &message, now)]),
        certificate_chain: Some(chain),
        not_before: time(issue.not_before),
        not_after: time(issue.not_after),
        begin_refresh_at: time(issue.begin_refresh_at),
    }
}

/// The status the signer writes for a denied or failed request.
pub fn refused_status(
    pcr: &PodCertificateRequest,
    type_: &str,
    reason: &str,
    message: &str,
    now: i64,
) -> PodCertificateRequestStatus {
    PodCertificateRequestStatus {
        conditions: Some(vec![terminal(pcr, type_, reason, message, now)]),
        ..PodCertificateRequestStatus::default()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use k8s_openapi::ByteString;
    use k8s_openapi::api::certificates::v1beta1::PodCertificateRequestSpec;
    use rcgen::PKCS_ECDSA_P256_SHA256;
    use splice_crds::InjectionPolicyStatus;

    use super::*;
    use crate::identity::sign::tests::csr;
    use crate::view::PodOwner;

    pub(crate) const NOW: i64 = 1_800_000_000;

    /// Policy `mesh` selecting `app=web`, with `spec.identity` capped at `max_expiration`
    /// seconds, Ready at its generation when `ready`.
    pub(crate) fn policy(max_expiration: i32, ready: bool) -> (InjectionPolicy, CompiledPolicy) {
        let spec = serde_json::json!({
            "objectSelector": {"matchLabels": {"app": "web"}},
            "template": {"containers": [{"name": "proxy", "image": "proxy:1"}]},
            "identity": {"mountPath": "/var/run/identity", "maxExpirationSeconds": max_expiration},
        });
        let mut p: InjectionPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "splice.dev/v1alpha1", "kind": "InjectionPolicy",
            "metadata": {"name": "mesh", "uid": "u1", "generation": 1},
            "spec": spec,
        }))
        .unwrap();
        p.status = Some(InjectionPolicyStatus {
            conditions: vec![Condition {
                type_: condition::READY.into(),
                status: if ready { "True" } else { "False" }.into(),
                reason: "Test".into(),
                message: String::new(),
                observed_generation: Some(1),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
            }],
            ..InjectionPolicyStatus::default()
        });
        let compiled = CompiledPolicy::compile("mesh", 1, &p.spec).unwrap();
        (p, compiled)
    }

    /// Pod `shop/web-1` (UID `pod-1`, service account `web-sa`, `app=web`) carrying `mesh`'s
    /// injection.
    pub(crate) fn pod() -> PodRecord {
        PodRecord {
            namespace: Arc::from("shop"),
            name: "web-1".into(),
            uid: "pod-1".into(),
            service_account: "web-sa".into(),
            labels: [("app".to_owned(), "web".to_owned())].into(),
            created: None,
            injected: vec![("mesh".to_owned(), "h".to_owned())],
            owner: PodOwner::ReplicaSet,
            in_place: Vec::new(),
            overrides: Vec::new(),
        }
    }

    /// The kubelet's request `req-1` for [`pod`] with a fresh P-256 key.
    pub(crate) fn request() -> PodCertificateRequest {
        let mut r = PodCertificateRequest {
            spec: PodCertificateRequestSpec {
                signer_name: IDENTITY_SIGNER.into(),
                pod_name: "web-1".into(),
                pod_uid: "pod-1".into(),
                service_account_name: "web-sa".into(),
                max_expiration_seconds: Some(86_400),
                stub_pkc_s10_request: ByteString(csr(&PKCS_ECDSA_P256_SHA256)),
                ..PodCertificateRequestSpec::default()
            },
            ..PodCertificateRequest::default()
        };
        r.metadata.namespace = Some("shop".into());
        r.metadata.name = Some("req-1".into());
        r.metadata.uid = Some("req-uid".into());
        r.metadata.resource_version = Some("7".into());
        r
    }

    fn decide_with(
        pcr: &PodCertificateRequest,
        pod: Option<&PodRecord>,
        policy: &(InjectionPolicy, CompiledPolicy),
        max_lifetime_seconds: i64,
    ) -> Decision {
        let exclusions = Exclusions::default_for("splice-system");
        let namespaces = HashMap::new();
        let policies = [(&policy.0, Some(&policy.1))];
        let scope = Scope {
            trust_domain: "cluster.local",
            max_lifetime_seconds,
            exclusions: &exclusions,
            namespaces: &namespaces,
            policies: &policies,
        };
        decide(pcr, pod, &scope, NOW)
    }

    fn issued(d: Decision) -> Issue {
        match d {
            Decision::Issue(i) => i,
            other => panic!("expected an issue: {other:?}"),
        }
    }

    fn reason(d: &Decision) -> (&'static str, &'static str) {
        match d {
            Decision::Issue(_) => ("issue", ""),
            Decision::Deny { reason, .. } => ("deny", reason),
            Decision::Fail { reason, .. } => ("fail", reason),
            Decision::Leave => ("leave", ""),
        }
    }

    #[test]
    fn a_pod_injected_only_by_another_instances_policies_is_left_to_that_instance() {
        let mut theirs = pod();
        theirs.injected = vec![("other-mesh".to_owned(), "h".to_owned())];
        let d = decide_with(&request(), Some(&theirs), &policy(86_400, true), 86_400);
        assert_eq!(reason(&d), ("leave", ""));
        // One of ours among them: decided here (a Deny names the pod to its own instance).
        theirs.injected.push(("mesh".to_owned(), "h".to_owned()));
        let d = decide_with(&request(), Some(&theirs), &policy(86_400, true), 86_400);
        assert_eq!(reason(&d), ("issue", ""));
    }

    #[test]
    fn a_pod_a_ready_identity_policy_selects_and_injected_is_issued_its_spiffe_id() {
        let i = issued(decide_with(
            &request(),
            Some(&pod()),
            &policy(86_400, true),
            DEFAULT_MAX_LIFETIME_SECONDS,
        ));
        assert_eq!(i.spiffe_id, "spiffe://cluster.local/ns/shop/sa/web-sa");
        assert_eq!(i.policy, "mesh");
        assert!(sign::subject_key(&i.spki).is_ok());
    }

    #[test]
    fn a_pod_no_ready_identity_policy_selects_and_injected_is_denied_not_selected() {
        let mut other = pod();
        other.labels = [("app".to_owned(), "db".to_owned())].into();
        let mut uninjected = pod();
        uninjected.injected.clear();
        for (pod, ready) in [(other, true), (uninjected, true), (pod(), false)] {
            let d = decide_with(&request(), Some(&pod), &policy(86_400, ready), 86_400);
            assert_eq!(reason(&d), ("deny", "NotSelected"), "{pod:?} ready={ready}");
        }
    }

    #[test]
    fn a_missing_pod_or_one_with_another_uid_is_denied_pod_not_found() {
        let mut replaced = pod();
        replaced.uid = "pod-2".into();
        for pod in [None, Some(&replaced)] {
            let d = decide_with(&request(), pod, &policy(86_400, true), 86_400);
            assert_eq!(reason(&d), ("deny", "PodNotFound"));
        }
    }

    #[test]
    fn a_pod_running_as_another_service_account_than_the_request_names_is_denied() {
        let mut r = request();
        r.spec.service_account_name = "admin".into();
        let d = decide_with(&r, Some(&pod()), &policy(86_400, true), 86_400);
        assert_eq!(reason(&d), ("deny", "ServiceAccountMismatch"));
        // Unset is "default", as the API server takes it.
        let mut unset = pod();
        unset.service_account.clear();
        r.spec.service_account_name = "default".into();
        let i = issued(decide_with(&r, Some(&unset), &policy(86_400, true), 86_400));
        assert_eq!(i.spiffe_id, "spiffe://cluster.local/ns/shop/sa/default");
    }

    /// A P-521 SubjectPublicKeyInfo (its point is not checked): a key rcgen on ring cannot name.
    fn p521_spki() -> Vec<u8> {
        let mut der = vec![0x30, 0x81, 0x9b, 0x30, 0x10];
        der.extend([0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01]);
        der.extend([0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x23]);
        der.extend([0x03, 0x81, 0x86, 0x00, 0x04]);
        der.extend([7u8; 132]);
        der
    }

    #[test]
    fn an_unsupported_key_type_is_denied_and_a_malformed_key_fails_with_their_reasons() {
        let policy = policy(86_400, true);
        let mut p521 = request();
        p521.spec.stub_pkc_s10_request = ByteString(Vec::new());
        p521.spec.pkix_public_key = Some(ByteString(p521_spki()));
        let d = decide_with(&p521, Some(&pod()), &policy, 86_400);
        assert_eq!(reason(&d), ("deny", "UnsupportedKeyType"));
        let mut garbage = request();
        garbage.spec.stub_pkc_s10_request = ByteString(b"nope".to_vec());
        let d = decide_with(&garbage, Some(&pod()), &policy, 86_400);
        assert_eq!(reason(&d), ("fail", "MalformedRequest"));
        let mut none = request();
        none.spec.stub_pkc_s10_request = ByteString(Vec::new());
        let d = decide_with(&none, Some(&pod()), &policy, 86_400);
        assert_eq!(reason(&d), ("fail", "MalformedRequest"));
    }

    #[test]
    fn the_lifetime_is_capped_by_the_policy_and_the_signer_and_refresh_lies_inside_its_margins() {
        // (policy's maxExpirationSeconds, signer's cap, lifetime)
        for (policy_max, signer_max, lifetime) in [
            (7_200, 86_400, 7_200),
            (86_400, 18_000, 18_000),
            (86_400, 86_400, 86_400),
        ] {
            let i = issued(decide_with(
                &request(),
                Some(&pod()),
                &policy(policy_max, true),
                signer_max,
            ));
            assert_eq!(i.not_before, NOW - BACKDATE_SECONDS);
            assert!(NOW - i.not_before < 300, "the API server's 5-minute window");
            assert_eq!(i.not_after - i.not_before, lifetime);
            assert!(i.begin_refresh_at >= i.not_before + REFRESH_MARGIN_SECONDS);
            assert!(i.begin_refresh_at <= i.not_after - REFRESH_MARGIN_SECONDS);
        }
        // A knob asking for a refresh right away still waits the margin.
        assert_eq!(refresh_at(0, 3_600, Some(1)), REFRESH_MARGIN_SECONDS);
        assert_eq!(
            refresh_at(0, 3_600, Some(9_999)),
            3_600 - REFRESH_MARGIN_SECONDS
        );
    }
}
