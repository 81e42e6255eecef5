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
/// How far a certificate starts in the past, for nodes whose clock runs behind.
pub const BACKDATE_SECONDS: i64 = 300;
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
        spiffe_id: format!(
            "spiffe://{}/ns/{ns}/sa/{}",
            signer.trust_domain, spec.service_account_name
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
