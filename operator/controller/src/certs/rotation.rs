//! The CA's life as data and pure decisions: what the two Secrets hold, which phase a rotation is
//! in, what the caBundle must be, and what the leader does next given what it observed and the
//! time. No API calls here ([`super`] does them), so every transition is unit-tested.
//!
//! A rotation never leaves the API server without a trusted path to a serving replica:
//! 1. `Trusting`: the new CA joins every caBundle beside the old one; serving certificates are
//!    still the old CA's.
//! 2. `Serving`: once every owned configuration carried both CAs for the propagation delay, the
//!    new CA becomes the issuer and every replica swaps to a certificate it signed.
//! 3. Back to `Stable`: once every live replica served the new chain for the grace period, the old
//!    CA leaves the bundles.
//!
//! The phase and both CAs live in the CA Secret, so a leader killed at any step resumes there.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use splice_crds::{MANAGED_BY_LABEL, MANAGER};

use super::ca::{self, KeyedCert, Lifetimes};

/// Holds the CA (and, during a rotation, the other one) and the bundle the API server trusts.
pub const CA_SECRET: &str = "splice-ca";
/// Holds the serving certificate every replica loads.
pub const SERVING_SECRET: &str = "splice-webhook-tls";
/// The standard `kubernetes.io/tls` keys: in the CA Secret, the issuing CA; in the serving
/// Secret, the serving certificate.
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
/// The trust bundle (CA Secret) or the issuing CA (serving Secret).
pub const CA_CRT: &str = "ca.crt";
/// The incoming CA, during `Trusting`.
pub const NEXT_CRT: &str = "next.crt";
pub const NEXT_KEY: &str = "next.key";
/// The outgoing CA's certificate (its key is no longer needed), during `Serving`.
pub const PREVIOUS_CRT: &str = "previous.crt";
/// Annotation of the CA Secret holding the phase.
pub const PHASE_ANNOTATION: &str = "splice.dev/ca-rotation-phase";
/// Annotation on the CA Secret that asks the leader for a rotation (`splice rotate` sets it).
pub const ROTATE_ANNOTATION: &str = "splice.dev/rotate";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Stable,
    Trusting,
    Serving,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Stable => "Stable",
            Phase::Trusting => "Trusting",
            Phase::Serving => "Serving",
        }
    }

    fn parse(s: &str) -> Option<Phase> {
        match s {
            "Stable" => Some(Phase::Stable),
            "Trusting" => Some(Phase::Trusting),
            "Serving" => Some(Phase::Serving),
            _ => None,
        }
    }
}

/// What the CA Secret holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaState {
    pub phase: Phase,
    /// The CA that signs serving certificates.
    pub active: KeyedCert,
    /// `Trusting`: the CA that will take over.
    pub next: Option<KeyedCert>,
    /// `Serving`: the CA being retired, still trusted.
    pub previous: Option<String>,
}

impl CaState {
    pub fn fresh(active: KeyedCert) -> Self {
        CaState {
            phase: Phase::Stable,
            active,
            next: None,
            previous: None,
        }
    }

    /// The caBundle every owned configuration must carry: one CA, or two during a rotation,
    /// never more. The older CA comes first so the order is stable across the whole rotation.
    pub fn bundle(&self) -> String {
        match self.phase {
            Phase::Stable => self.active.cert_pem.clone(),
            Phase::Trusting => match &self.next {
                Some(next) => format!("{}{}", self.active.cert_pem, next.cert_pem),
                None => self.active.cert_pem.clone(),
            },
            Phase::Serving => match &self.previous {
                Some(previous) => format!("{previous}{}", self.active.cert_pem),
                None => self.active.cert_pem.clone(),
            },
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum StateError {
    #[error("Secret {CA_SECRET} has no {0:?} key")]
    MissingKey(&'static str),
    #[error("Secret {CA_SECRET}: {0:?} is not UTF-8 PEM")]
    NotPem(&'static str),
    #[error("Secret {CA_SECRET} has an unknown rotation phase {0:?}")]
    UnknownPhase(String),
}

impl StateError {
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), MANAGER.to_owned())])
}

/// Whether Splice created `secret`: only such Secrets are ever overwritten.
pub fn is_ours(secret: &Secret) -> bool {
    secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == MANAGER)
}

/// Whether someone asked for a rotation on the CA Secret.
pub fn rotation_requested(secret: &Secret) -> bool {
    secret
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ROTATE_ANNOTATION))
}

fn bytes(s: &str) -> ByteString {
    ByteString(s.as_bytes().to_vec())
}

fn tls_secret(
    namespace: &str,
    name: &str,
    data: BTreeMap<String, ByteString>,
    annotations: Option<BTreeMap<String, String>>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels()),
            annotations,
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The CA Secret storing `state`.
pub fn ca_secret(namespace: &str, state: &CaState) -> Secret {
    let mut data = BTreeMap::from([
        (TLS_CRT.to_owned(), bytes(&state.active.cert_pem)),
        (TLS_KEY.to_owned(), bytes(&state.active.key_pem)),
        (CA_CRT.to_owned(), bytes(&state.bundle())),
    ]);
    if let Some(next) = &state.next {
        data.insert(NEXT_CRT.to_owned(), bytes(&next.cert_pem));
        data.insert(NEXT_KEY.to_owned(), bytes(&next.key_pem));
    }
    if let Some(previous) = &state.previous {
        data.insert(PREVIOUS_CRT.to_owned(), bytes(previous));
    }
    let annotations =
        BTreeMap::from([(PHASE_ANNOTATION.to_owned(), state.phase.as_str().to_owned())]);
    tls_secret(namespace, CA_SECRET, data, Some(annotations))
}

/// The serving Secret: the certificate, its key and the CA that issued it.
pub fn serving_secret(namespace: &str, serving: &KeyedCert, issuer_pem: &str) -> Secret {
    let data = BTreeMap::from([
        (TLS_CRT.to_owned(), bytes(&serving.cert_pem)),
        (TLS_KEY.to_owned(), bytes(&serving.key_pem)),
        (CA_CRT.to_owned(), bytes(issuer_pem)),
    ]);
    tls_secret(namespace, SERVING_SECRET, data, None)
}

fn get(secret: &Secret, key: &'static str) -> Result<Option<String>, StateError> {
    match secret.data.as_ref().and_then(|d| d.get(key)) {
        None => Ok(None),
        Some(b) => String::from_utf8(b.0.clone())
            .map(Some)
            .map_err(|_| StateError::NotPem(key)),
    }
}

fn require(secret: &Secret, key: &'static str) -> Result<String, StateError> {
    get(secret, key)?.ok_or(StateError::MissingKey(key))
}

/// The state stored in the CA Secret. A phase whose companion CA is missing is reported, so the
/// caller repairs the Secret rather than guessing.
pub fn ca_state(secret: &Secret) -> Result<CaState, StateError> {
    let phase = match secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PHASE_ANNOTATION))
    {
        None => Phase::Stable,
        Some(p) => Phase::parse(p).ok_or_else(|| StateError::UnknownPhase(p.clone()))?,
    };
    let active = KeyedCert {
        cert_pem: require(secret, TLS_CRT)?,
        key_pem: require(secret, TLS_KEY)?,
    };
    let next = match phase {
        Phase::Trusting => Some(KeyedCert {
            cert_pem: require(secret, NEXT_CRT)?,
            key_pem: require(secret, NEXT_KEY)?,
        }),
        _ => None,
    };
    let previous = match phase {
        Phase::Serving => Some(require(secret, PREVIOUS_CRT)?),
        _ => None,
    };
    Ok(CaState {
        phase,
        active,
        next,
        previous,
    })
}

/// The bundle the CA Secret publishes (what every replica hands to the controller).
pub fn published_bundle(secret: &Secret) -> Option<String> {
    get(secret, CA_CRT).ok().flatten()
}

/// The serving certificate and key in the serving Secret.
pub fn serving_cert(secret: &Secret) -> Result<KeyedCert, StateError> {
    Ok(KeyedCert {
        cert_pem: require(secret, TLS_CRT)?,
        key_pem: require(secret, TLS_KEY)?,
    })
}

/// Timing of rotations (seconds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    pub lifetimes: Lifetimes,
    /// How long every owned configuration must carry the new bundle before the API server is
    /// assumed to use it.
    pub propagation: i64,
    /// How long every replica must serve the new chain before the old CA leaves the bundles.
    pub grace: i64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            lifetimes: Lifetimes::default(),
            propagation: 10,
            grace: 60,
        }
    }
}

/// What the leader saw, besides the CA Secret.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    pub now: i64,
    /// Since when every owned configuration carries exactly the state's bundle (continuously).
    pub bundle_published_since: Option<i64>,
    /// Since when every live replica serves a certificate issued by the active CA.
    pub replicas_serving_since: Option<i64>,
    pub rotate_requested: bool,
}

/// The leader's next move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to write; look again at `until` (or when something changes).
    Wait { until: Option<i64> },
    /// The active CA cannot sign (expired, corrupt): start over with a new one. Overlap is moot:
    /// the API server cannot verify the old chain anyway.
    Replace { reason: String },
    /// Phase 1: add a new CA to the bundles.
    BeginRotation { reason: String },
    /// Phase 2: the new CA becomes the issuer.
    Promote,
    /// Phase 3: the old CA leaves the bundles.
    Retire,
}

/// Decides the next step for `state`.
pub fn decide(state: &CaState, observed: &Observed, timing: &Timing) -> Step {
    let now = observed.now;
    let next_usable = state
        .next
        .as_ref()
        .is_some_and(|n| ca::ca_unusable(n, now).is_none());
    if let Some(reason) = ca::ca_unusable(&state.active, now) {
        // The incoming CA is already trusted: take it rather than start from nothing.
        if state.phase == Phase::Trusting && next_usable {
            return Step::Promote;
        }
        return Step::Replace { reason };
    }
    match state.phase {
        Phase::Stable => {
            let info = ca::inspect(&state.active.cert_pem, "the CA certificate");
            let renew_at = info
                .as_ref()
                .map(|i| i.renew_at(timing.lifetimes.renew_fraction))
                .unwrap_or(now);
            if observed.rotate_requested {
                Step::BeginRotation {
                    reason: "a rotation was requested".to_owned(),
                }
            } else if now >= renew_at {
                Step::BeginRotation {
                    reason: "the CA is past its renewal point".to_owned(),
                }
            } else if info.is_ok_and(|i| i.path_len == Some(0)) {
                // Made by a Splice before pod identity, whose signer needs a CA below this one.
                Step::BeginRotation {
                    reason: "the CA allows no intermediate CA below it, which the pod identity \
                             signer needs"
                        .to_owned(),
                }
            } else {
                Step::Wait {
                    until: Some(renew_at),
                }
            }
        }
        Phase::Trusting => {
            if !next_usable {
                return Step::BeginRotation {
                    reason: "the incoming CA is unusable".to_owned(),
                };
            }
            match observed.bundle_published_since {
                Some(since) if now >= since + timing.propagation => Step::Promote,
                Some(since) => Step::Wait {
                    until: Some(since + timing.propagation),
                },
                None => Step::Wait { until: None },
            }
        }
        Phase::Serving => {
            let previous_expired = state.previous.as_ref().is_none_or(|p| {
                ca::inspect(p, "the previous CA").map_or(true, |i| now >= i.not_after)
            });
            if previous_expired {
                return Step::Retire;
            }
            match observed.replicas_serving_since {
                Some(since) if now >= since + timing.grace => Step::Retire,
                Some(since) => Step::Wait {
                    until: Some(since + timing.grace),
                },
                None => Step::Wait { until: None },
            }
        }
    }
}

/// The state after `step`; `new_ca` is a freshly generated CA, used by `Replace` and
/// `BeginRotation` only.
pub fn apply(state: &CaState, step: &Step, new_ca: Option<KeyedCert>) -> Option<CaState> {
    match step {
        Step::Wait { .. } => None,
        Step::Replace { .. } => new_ca.map(CaState::fresh),
        Step::BeginRotation { .. } => new_ca.map(|next| CaState {
            phase: Phase::Trusting,
            active: state.active.clone(),
            next: Some(next),
            previous: None,
        }),
        Step::Promote => {
            let next = state.next.clone()?;
            Some(CaState {
                phase: Phase::Serving,
                previous: Some(state.active.cert_pem.clone()),
                active: next,
                next: None,
            })
        }
        Step::Retire => Some(CaState {
            phase: Phase::Stable,
            active: state.active.clone(),
            next: None,
            previous: None,
        }),
    }
}

/// Whether every bundle equals `wanted`, compared certificate by certificate so whitespace does
/// not matter. No configuration at all is vacuously true: nothing can call the old chain.
pub fn all_carry(bundles: &[Option<String>], wanted: &str) -> bool {
    let wanted = ca::split_bundle(wanted);
    bundles
        .iter()
        .all(|b| b.as_deref().map(ca::split_bundle).as_ref() == Some(&wanted))
}

/// One replica's report of what it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaReport {
    pub identity: String,
    /// Key identifier of the CA that issued the certificate it serves (empty: none loaded).
    pub issuer_key_id: String,
    /// When it last confirmed (Unix seconds).
    pub renewed: i64,
}

/// Whether every live replica (one that reported within `ttl`) serves a certificate issued by the
/// CA with `active_key_id`. A replica that stopped reporting is dead (SIGKILL leaves its record
/// behind) and cannot hold the rotation up; at least one live report is required.
pub fn all_serve(reports: &[ReplicaReport], active_key_id: &str, now: i64, ttl: i64) -> bool {
    let live: Vec<_> = reports.iter().filter(|r| now - r.renewed <= ttl).collect();
    !live.is_empty() && live.iter().all(|r| r.issuer_key_id == active_key_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::{Duration, OffsetDateTime};

    const T0: i64 = 1_800_000_000;

    fn at(t: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(t).unwrap()
    }

    fn timing() -> Timing {
        Timing {
            lifetimes: Lifetimes {
                ca: Duration::seconds(300),
                serving: Duration::seconds(100),
                renew_fraction: 2.0 / 3.0,
            },
            propagation: 5,
            grace: 10,
        }
    }

    fn new_ca(t: i64) -> KeyedCert {
        ca::new_ca(at(t), Duration::seconds(300)).unwrap()
    }

    fn observed(now: i64) -> Observed {
        Observed {
            now,
            ..Observed::default()
        }
    }

    /// Renewal point of a CA made at `t` with a 300 s lifetime and a 5 min backdate.
    fn renew_point(t: i64) -> i64 {
        let info = ca::inspect(&new_ca(t).cert_pem, "ca").unwrap();
        info.renew_at(2.0 / 3.0)
    }

    #[test]
    fn a_stable_ca_waits_for_its_renewal_point_then_begins_a_rotation() {
        let state = CaState::fresh(new_ca(T0));
        let renew = renew_point(T0);
        assert_eq!(
            decide(&state, &observed(T0), &timing()),
            Step::Wait { until: Some(renew) }
        );
        assert!(matches!(
            decide(&state, &observed(renew), &timing()),
            Step::BeginRotation { .. }
        ));
    }

    #[test]
    fn a_ca_that_allows_no_intermediate_below_it_is_rotated_at_once() {
        // As a Splice before pod identity made it: path length 0.
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = ca::ca_params_named("splice webhook CA", 0).unwrap();
        params.not_before = at(T0 - 300);
        params.not_after = at(T0 + 3000);
        let old = KeyedCert {
            cert_pem: params.self_signed(&key).unwrap().pem(),
            key_pem: key.serialize_pem(),
        };
        let step = decide(&CaState::fresh(old), &observed(T0), &timing());
        assert!(
            matches!(&step, Step::BeginRotation { reason } if reason.contains("intermediate")),
            "{step:?}"
        );
        // Splice's own CA allows one: it waits for its renewal point.
        let state = CaState::fresh(new_ca(T0));
        assert!(matches!(
            decide(&state, &observed(T0), &timing()),
            Step::Wait { .. }
        ));
    }

    #[test]
    fn a_requested_rotation_begins_at_once_only_from_stable() {
        let state = CaState::fresh(new_ca(T0));
        let mut o = observed(T0);
        o.rotate_requested = true;
        assert!(matches!(
            decide(&state, &o, &timing()),
            Step::BeginRotation { reason } if reason.contains("requested")
        ));
        let trusting = apply(&state, &Step::Promote, None);
        assert!(trusting.is_none(), "no next CA, nothing to promote");
        let trusting = apply(
            &state,
            &Step::BeginRotation {
                reason: String::new(),
            },
            Some(new_ca(T0)),
        )
        .unwrap();
        assert_eq!(decide(&trusting, &o, &timing()), Step::Wait { until: None });
    }

    #[test]
    fn the_new_ca_is_promoted_only_after_every_configuration_carried_both_for_the_delay() {
        let old = new_ca(T0);
        let state = apply(
            &CaState::fresh(old.clone()),
            &Step::BeginRotation {
                reason: String::new(),
            },
            Some(new_ca(T0 + 1)),
        )
        .unwrap();
        assert_eq!(state.phase, Phase::Trusting);
        assert_eq!(ca::split_bundle(&state.bundle()).len(), 2);
        let mut o = observed(T0 + 2);
        assert_eq!(decide(&state, &o, &timing()), Step::Wait { until: None });
        o.bundle_published_since = Some(T0 + 2);
        assert_eq!(
            decide(&state, &o, &timing()),
            Step::Wait {
                until: Some(T0 + 7)
            }
        );
        o.now = T0 + 7;
        assert_eq!(decide(&state, &o, &timing()), Step::Promote);

        let serving = apply(&state, &Step::Promote, None).unwrap();
        assert_eq!(serving.phase, Phase::Serving);
        assert_eq!(Some(&serving.active), state.next.as_ref());
        assert_eq!(serving.previous.as_deref(), Some(old.cert_pem.as_str()));
        assert_eq!(
            ca::split_bundle(&serving.bundle()),
            ca::split_bundle(&state.bundle()),
            "promotion does not change the bundle, so no configuration is rewritten for it"
        );
    }

    #[test]
    fn the_old_ca_is_retired_only_after_every_replica_served_the_new_chain_for_the_grace() {
        let state = CaState {
            phase: Phase::Serving,
            active: new_ca(T0 + 1),
            next: None,
            previous: Some(new_ca(T0).cert_pem),
        };
        let mut o = observed(T0 + 10);
        assert_eq!(decide(&state, &o, &timing()), Step::Wait { until: None });
        o.replicas_serving_since = Some(T0 + 10);
        assert_eq!(
            decide(&state, &o, &timing()),
            Step::Wait {
                until: Some(T0 + 20)
            }
        );
        o.now = T0 + 20;
        assert_eq!(decide(&state, &o, &timing()), Step::Retire);
        let stable = apply(&state, &Step::Retire, None).unwrap();
        assert_eq!(stable.phase, Phase::Stable);
        assert_eq!(stable.bundle(), state.active.cert_pem);
    }

    #[test]
    fn a_previous_ca_that_already_expired_is_retired_without_waiting() {
        let state = CaState {
            phase: Phase::Serving,
            active: new_ca(T0 + 200),
            next: None,
            previous: Some(new_ca(T0).cert_pem),
        };
        assert_eq!(decide(&state, &observed(T0 + 301), &timing()), Step::Retire);
    }

    #[test]
    fn an_expired_ca_at_start_is_replaced_but_a_trusted_incoming_one_is_promoted() {
        let state = CaState::fresh(new_ca(T0));
        assert!(matches!(
            decide(&state, &observed(T0 + 400), &timing()),
            Step::Replace { reason } if reason.contains("expired")
        ));
        let trusting = CaState {
            phase: Phase::Trusting,
            active: new_ca(T0),
            next: Some(new_ca(T0 + 200)),
            previous: None,
        };
        assert_eq!(
            decide(&trusting, &observed(T0 + 400), &timing()),
            Step::Promote
        );
    }

    #[test]
    fn a_bundle_never_holds_more_than_two_cas_in_any_phase() {
        let a = new_ca(T0);
        let mut state = CaState::fresh(a);
        for i in 0..3 {
            let begin = Step::BeginRotation {
                reason: String::new(),
            };
            for step in [begin, Step::Promote, Step::Retire] {
                let fresh = matches!(step, Step::BeginRotation { .. }).then(|| new_ca(T0 + i));
                state = apply(&state, &step, fresh).unwrap();
                assert!(ca::split_bundle(&state.bundle()).len() <= 2);
            }
            assert_eq!(ca::split_bundle(&state.bundle()).len(), 1);
        }
    }

    #[test]
    fn the_state_round_trips_through_the_secret_in_every_phase() {
        let stable = CaState::fresh(new_ca(T0));
        let trusting = apply(
            &stable,
            &Step::BeginRotation {
                reason: String::new(),
            },
            Some(new_ca(T0)),
        )
        .unwrap();
        let serving = apply(&trusting, &Step::Promote, None).unwrap();
        for state in [stable, trusting, serving] {
            let secret = ca_secret("ns", &state);
            assert!(is_ours(&secret));
            assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
            assert_eq!(ca_state(&secret).unwrap(), state);
            assert_eq!(published_bundle(&secret), Some(state.bundle()));
            let text = format!("{:?}", ca_state(&secret).unwrap());
            assert!(!text.contains("PRIVATE KEY"), "keys never reach Debug");
        }
    }

    #[test]
    fn a_secret_missing_its_phase_companion_or_with_an_unknown_phase_is_reported() {
        let trusting = apply(
            &CaState::fresh(new_ca(T0)),
            &Step::BeginRotation {
                reason: String::new(),
            },
            Some(new_ca(T0)),
        )
        .unwrap();
        let mut secret = ca_secret("ns", &trusting);
        secret.data.as_mut().unwrap().remove(NEXT_KEY);
        assert_eq!(ca_state(&secret), Err(StateError::MissingKey(NEXT_KEY)));
        secret
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(PHASE_ANNOTATION.into(), "Sideways".into());
        assert!(matches!(
            ca_state(&secret),
            Err(StateError::UnknownPhase(p)) if p == "Sideways"
        ));
    }

    #[test]
    fn a_secret_without_the_managed_by_label_is_not_ours_and_the_annotation_requests_rotation() {
        let mut secret = ca_secret("ns", &CaState::fresh(new_ca(T0)));
        assert!(!rotation_requested(&secret));
        secret
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ROTATE_ANNOTATION.into(), "now".into());
        assert!(rotation_requested(&secret));
        secret.metadata.labels = None;
        assert!(!is_ours(&secret));
    }

    #[test]
    fn configurations_carry_the_bundle_only_when_every_one_holds_exactly_its_certificates() {
        let a = new_ca(T0).cert_pem;
        let b = new_ca(T0).cert_pem;
        let both = format!("{a}{b}");
        assert!(all_carry(&[], &both));
        assert!(all_carry(&[Some(format!("{a}\n{b}"))], &both));
        assert!(!all_carry(&[Some(both.clone()), Some(a.clone())], &both));
        assert!(!all_carry(&[Some(format!("{b}{a}")), None], &both));
    }

    #[test]
    fn dead_replicas_do_not_hold_a_rotation_up_but_a_live_one_on_the_old_chain_does() {
        let report = |id: &str, issuer: &str, renewed| ReplicaReport {
            identity: id.into(),
            issuer_key_id: issuer.into(),
            renewed,
        };
        let now = T0;
        assert!(!all_serve(&[], "new", now, 15));
        assert!(all_serve(
            &[report("a", "new", now - 1), report("dead", "old", now - 60)],
            "new",
            now,
            15
        ));
        assert!(!all_serve(
            &[report("a", "new", now - 1), report("b", "old", now - 2)],
            "new",
            now,
            15
        ));
    }
}
