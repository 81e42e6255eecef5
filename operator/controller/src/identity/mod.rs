//! The pod identity signer `splice.dev/identity` (leader only): answers the kubelets'
//! PodCertificateRequests for pods a Ready policy with `spec.identity` injected, and keeps the
//! ClusterTrustBundle of the roots their certificates chain to.
//!
//! Shape: [`decide`] (pure) says what to do with one request, [`sign`] (pure) issues under an
//! intermediate made in memory under Splice's active CA, [`bundle`] (pure) says which roots to
//! publish; this file performs: one watch of the requests, one tick that reads the pods it needs,
//! writes each answer once (`podcertificaterequests/status` under the resourceVersion read, so a
//! second leader's write is a conflict, never a second certificate), and the bundle through
//! `policy::apply::apply_if_changed`. Never silent: `splice_identity_*` metrics, a Warning Event
//! on each denied pod.

pub mod bundle;
pub mod decide;
pub mod sign;

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::certificates::v1beta1::{
    ClusterTrustBundle, PodCertificateRequest, PodCertificateRequestStatus,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use splice_crds::InjectionPolicy;
use splice_engine::{CompiledPolicy, Exclusions};
use time::OffsetDateTime;

use self::decide::{DENIED, Decision, FAILED, Signer};
use self::sign::Intermediate;
use crate::certs::rotation::{CA_SECRET, CaState, ca_state};
use crate::driver::Inputs;
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::policy::apply::apply_if_changed;
use crate::retry::{backoff, is_conflict};

/// How often the signer looks for requests to answer.
pub const PERIOD: Duration = Duration::from_secs(1);
/// How often the trust bundle is compared with what it should hold (and restored if deleted).
pub const BUNDLE_PERIOD: Duration = Duration::from_secs(30);
/// How long an answer this replica wrote is trusted while the watch does not show it yet.
const REMEMBER: Duration = Duration::from_secs(300);

/// What the signer is configured with.
#[derive(Clone, Debug)]
pub struct Config {
    pub trust_domain: String,
    pub splice_namespace: String,
    pub max_lifetime_seconds: i64,
}

#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum IdentityError {
    #[error("reading {what}: {source}")]
    Read {
        what: &'static str,
        source: kube::Error,
    },
    #[error("writing the request's status: {0}")]
    Write(kube::Error),
    #[error("the CA Secret: {0}")]
    Ca(#[from] crate::certs::rotation::StateError),
    #[error(transparent)]
    Sign(#[from] sign::SignError),
}

impl IdentityError {
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

/// Whether the API server serves `certificates.k8s.io/v1beta1` podcertificaterequests.
pub async fn served(client: &Client) -> bool {
    match client
        .list_api_group_resources("certificates.k8s.io/v1beta1")
        .await
    {
        Ok(list) => list
            .resources
            .iter()
            .any(|r| r.name == "podcertificaterequests"),
        Err(_) => false,
    }
}

/// The signer's state across ticks of one term.
struct State {
    config: Config,
    exclusions: Exclusions,
    intermediate: Option<Intermediate>,
    /// Requests this replica answered, by UID, until the watch shows the answer.
    answered: HashMap<String, Instant>,
    /// Requests whose last write failed: failures and when to try again.
    retry: HashMap<String, (u32, Instant)>,
    last_bundle: Option<Instant>,
}

/// Runs the signer until the term ends: nothing when the API server does not serve
/// podcertificaterequests (then `splice_identity_signer_available` is 0 and a warning says so).
pub async fn run(config: Config, inputs: Inputs) {
    let metrics = Arc::clone(&inputs.metrics);
    if !served(&inputs.client).await {
        metrics.set_identity_available(false);
        tracing::warn!(
            "the API server does not serve certificates.k8s.io/v1beta1 podcertificaterequests: \
             the splice.dev/identity signer does not run, spec.identity pods get no certificate"
        );
        return;
    }
    metrics.set_identity_available(true);
    let (store, writer) = reflector::store::<PodCertificateRequest>();
    let requests = watcher(
        Api::<PodCertificateRequest>::all(inputs.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .for_each(|_| async {});
    let exclusions = Exclusions::default_for(&config.splice_namespace);
    let state = State {
        config,
        exclusions,
        intermediate: None,
        answered: HashMap::new(),
        retry: HashMap::new(),
        last_bundle: None,
    };
    tokio::select! {
        () = requests => {}
        () = tick_forever(state, store, inputs) => {}
    }
}

async fn tick_forever(mut state: State, store: Store<PodCertificateRequest>, inputs: Inputs) {
    if store.wait_until_ready().await.is_err() {
        return;
    }
    let mut listed = inputs.policies.listed.clone();
    if listed.wait_for(|l| *l).await.is_err() {
        return;
    }
    let mut ticker = tokio::time::interval(PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if !inputs.leading.now() {
            continue;
        }
        let requests = store.state();
        let now = Instant::now();
        state
            .answered
            .retain(|_, at| now.duration_since(*at) < REMEMBER);
        let pending: Vec<_> = requests
            .iter()
            .filter(|r| {
                decide::is_pending(r) && !state.answered.contains_key(&r.uid().unwrap_or_default())
            })
            .cloned()
            .collect();
        publish_pending(&inputs.metrics, &pending);
        let due = state
            .last_bundle
            .is_none_or(|at| now.duration_since(at) >= BUNDLE_PERIOD);
        if pending.is_empty() && !due {
            continue;
        }
        let ca = match read_ca(&inputs.client, &state.config.splice_namespace).await {
            Ok(ca) => ca,
            Err(e) => {
                tracing::warn!(error = %e, label = e.label(), "identity signer: the CA is not readable");
                continue;
            }
        };
        for pcr in pending {
            answer(&mut state, &ca, &pcr, &inputs).await;
        }
        if due {
            state.last_bundle = Some(now);
            keep_bundle(&inputs.client, &inputs.leading, &ca, &requests).await;
        }
    }
}

/// Exports how many requests wait, and how many of them for more than 30 s.
fn publish_pending(metrics: &Metrics, pending: &[Arc<PodCertificateRequest>]) {
    let now = k8s_openapi::jiff::Timestamp::now();
    let old = pending
        .iter()
        .filter(|r| {
            r.metadata
                .creation_timestamp
                .as_ref()
                .is_some_and(|t| now.as_second() - t.0.as_second() > 30)
        })
        .count();
    let old = i64::try_from(old).unwrap_or(i64::MAX);
    let all = i64::try_from(pending.len()).unwrap_or(i64::MAX);
    metrics.set_identity_pending(all - old, old);
}

async fn read_ca(client: &Client, namespace: &str) -> Result<CaState, IdentityError> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(CA_SECRET)
        .await
        .map_err(|source| IdentityError::Read {
            what: "the CA Secret",
            source,
        })?;
    Ok(ca_state(&secret)?)
}

/// Decides one request, takes it and reports it; a failed write waits its backoff.
async fn answer(state: &mut State, ca: &CaState, pcr: &PodCertificateRequest, inputs: &Inputs) {
    let uid = pcr.uid().unwrap_or_default();
    if state
        .retry
        .get(&uid)
        .is_some_and(|(_, at)| Instant::now() < *at)
    {
        return;
    }
    let ns = pcr.namespace().unwrap_or_default();
    let pods = Api::<Pod>::namespaced(inputs.client.clone(), &ns);
    let pod = match pods.get_opt(&pcr.spec.pod_name).await {
        Ok(p) => p,
        Err(source) => {
            return failed(
                state,
                &uid,
                &IdentityError::Read {
                    what: "the pod",
                    source,
                },
            );
        }
    };
    let decision = decide_now(state, pcr, pod.as_ref(), inputs);
    let now = OffsetDateTime::now_utc();
    let (status, outcome) = match status_for(state, ca, pcr, &decision, now) {
        Ok(s) => s,
        Err(e) => return failed(state, &uid, &e),
    };
    if !inputs.leading.now() {
        return;
    }
    match write_status(&inputs.client, pcr, status).await {
        Ok(()) => {
            state.retry.remove(&uid);
            state.answered.insert(uid, Instant::now());
            inputs.metrics.observe_identity(outcome, latency(pcr));
            report(pcr, pod.as_ref(), &decision, &inputs.recorder).await;
        }
        // Someone else answered (or the request changed): the watch will show it.
        Err(IdentityError::Write(e)) if is_conflict(&e) => {
            state.answered.insert(uid, Instant::now());
        }
        Err(e) => failed(state, &uid, &e),
    }
}

fn failed(state: &mut State, uid: &str, e: &IdentityError) {
    let entry = state
        .retry
        .entry(uid.to_owned())
        .or_insert((0, Instant::now()));
    entry.0 = entry.0.saturating_add(1);
    entry.1 = Instant::now() + backoff(entry.0);
    tracing::warn!(request = uid, error = %e, label = e.label(), "identity request not answered");
}

fn decide_now(
    state: &State,
    pcr: &PodCertificateRequest,
    pod: Option<&Pod>,
    inputs: &Inputs,
) -> Decision {
    let policies: Vec<Arc<InjectionPolicy>> = inputs.policies.cache.state();
    let served = &inputs.policies.webhook_policies;
    let compiled: Vec<Option<Arc<CompiledPolicy>>> = policies
        .iter()
        .map(|p| {
            let name = p.name_any();
            served
                .get(&splice_engine::entry::canary_key(&name))
                .or_else(|| served.get(&name))
        })
        .collect();
    let pairs: Vec<(&InjectionPolicy, Option<&CompiledPolicy>)> = policies
        .iter()
        .zip(&compiled)
        .map(|(p, c)| (&**p, c.as_deref()))
        .collect();
    let namespaces = inputs
        .view
        .namespaces
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contexts
        .clone();
    let signer = Signer {
        trust_domain: &state.config.trust_domain,
        max_lifetime_seconds: state.config.max_lifetime_seconds,
        exclusions: &state.exclusions,
        namespaces: &namespaces,
        policies: &pairs,
    };
    decide::decide(
        pcr,
        pod,
        &signer,
        OffsetDateTime::now_utc().unix_timestamp(),
    )
}

/// The status to write for `decision`, signing when it issues; the outcome's metric label.
fn status_for(
    state: &mut State,
    ca: &CaState,
    pcr: &PodCertificateRequest,
    decision: &Decision,
    now: OffsetDateTime,
) -> Result<(PodCertificateRequestStatus, &'static str), IdentityError> {
    let at = now.unix_timestamp();
    let issue = match decision {
        Decision::Deny { reason, message } => {
            return Ok((
                decide::refused_status(pcr, DENIED, reason, message, at),
                "denied",
            ));
        }
        Decision::Fail { reason, message } => {
            return Ok((
                decide::refused_status(pcr, FAILED, reason, message, at),
                "failed",
            ));
        }
        Decision::Issue(issue) => issue,
    };
    let until = now + time::Duration::seconds(state.config.max_lifetime_seconds + 3600);
    if !state
        .intermediate
        .as_ref()
        .is_some_and(|i| i.serves(&ca.active, until))
    {
        state.intermediate = Some(Intermediate::new(
            &ca.active,
            &state.config.trust_domain,
            now,
        )?);
    }
    let Some(intermediate) = state.intermediate.as_ref() else {
        return Err(sign::SignError::IntermediateTooShort(until).into());
    };
    let key = sign::subject_key(&issue.spki)?;
    let at_time = |s: i64| OffsetDateTime::from_unix_timestamp(s).unwrap_or(now);
    let chain = intermediate.issue(
        &key,
        sign::is_rsa(&issue.spki),
        &issue.spiffe_id,
        at_time(issue.not_before),
        at_time(issue.not_after),
    )?;
    Ok((decide::issued_status(pcr, issue, chain, at), "issued"))
}

/// Replaces the request's status, conditional on the resourceVersion it was read at.
async fn write_status(
    client: &Client,
    pcr: &PodCertificateRequest,
    status: PodCertificateRequestStatus,
) -> Result<(), IdentityError> {
    let ns = pcr.namespace().unwrap_or_default();
    let api = Api::<PodCertificateRequest>::namespaced(client.clone(), &ns);
    let mut object = pcr.clone();
    object.metadata.managed_fields = None;
    object.status = Some(status);
    api.replace_status(&pcr.name_any(), &PostParams::default(), &object)
        .await
        .map(|_| ())
        .map_err(IdentityError::Write)
}

fn latency(pcr: &PodCertificateRequest) -> Option<Duration> {
    let created = pcr.metadata.creation_timestamp.as_ref()?.0;
    let elapsed = k8s_openapi::jiff::Timestamp::now().duration_since(created);
    Duration::try_from(elapsed).ok()
}

/// Logs the answer (never the request or the key) and, for a denial, a Warning on the pod.
async fn report(
    pcr: &PodCertificateRequest,
    pod: Option<&Pod>,
    decision: &Decision,
    recorder: &Recorder,
) {
    let request = pcr.name_any();
    let ns = pcr.namespace().unwrap_or_default();
    let (reason, message) = match decision {
        Decision::Issue(i) => {
            tracing::info!(namespace = %ns, %request, spiffe_id = %i.spiffe_id, "identity issued");
            return;
        }
        Decision::Fail { reason, message } => {
            tracing::warn!(namespace = %ns, %request, reason, %message, "identity request failed");
            return;
        }
        Decision::Deny { reason, message } => (reason, message),
    };
    tracing::warn!(namespace = %ns, %request, reason, %message, "identity request denied");
    let Some(pod) = pod else { return };
    let event = Event {
        type_: EventType::Warning,
        reason: format!("Identity{reason}"),
        note: Some(format!("PodCertificateRequest {request} denied: {message}")),
        action: "SignIdentity".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &pod.object_ref(&())).await {
        tracing::warn!(namespace = %ns, %request, error = %e, "could not publish an Event");
    }
}

/// Writes the trust bundle when it differs from the roots it should hold (restored if deleted).
async fn keep_bundle(
    client: &Client,
    leading: &Leadership,
    ca: &CaState,
    requests: &[Arc<PodCertificateRequest>],
) {
    let api = Api::<ClusterTrustBundle>::all(client.clone());
    let published = match api.get_opt(bundle::BUNDLE_NAME).await {
        Ok(b) => b.map(|b| b.spec.trust_bundle).unwrap_or_default(),
        Err(e) => {
            tracing::warn!(error = %e, "identity signer: reading the trust bundle");
            return;
        }
    };
    let issued: Vec<bundle::Chained> = requests.iter().filter_map(|r| bundle::chained(r)).collect();
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let roots = bundle::roots(&ca.bundle(), &published, &issued, now);
    if let Err(e) = apply_if_changed(&api, leading, &bundle::desired(&roots)).await {
        tracing::warn!(step = e.step.verb(), error = %e.source, "identity signer: writing the trust bundle");
    }
}
