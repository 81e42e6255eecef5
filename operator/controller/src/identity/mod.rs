//! The pod identity signer `splice.dev/identity` (leader only): answers the kubelets'
//! PodCertificateRequests for pods a Ready policy with `spec.identity` injected, and keeps the
//! ClusterTrustBundle of the roots their certificates chain to.
//!
//! Shape: a [`crate::driver::Loop`]. [`decide`] (pure) says what to do with one request, [`sign`]
//! (pure) issues under an intermediate made in memory under Splice's active CA, [`bundle`] (pure)
//! says which roots to publish, [`signer::Signer`] decides a whole tick from one snapshot. This
//! file performs: the watches of the requests, the CA Secret and the bundle (tasks of the signer's
//! run, so they end with the term), each answer written once (`podcertificaterequests/status`
//! under the resourceVersion read, so a second leader's write is a conflict, never a second
//! certificate), the bundle through `policy::apply::apply_if_changed`, and the pods read for
//! their service account. Never silent: `splice_identity_*` metrics, a Warning Event on each
//! denied pod.

pub mod bundle;
pub mod decide;
pub mod sign;
pub mod signer;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::PartialObjectMetaExt;
use tokio::sync::Notify;

use k8s_openapi::api::certificates::v1beta1::{ClusterTrustBundle, PodCertificateRequest};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::watch;

use self::signer::{Act, Answer, Extra, Look, Seen, Signer};
use crate::certs::rotation::CA_SECRET;
use crate::driver::{self, Inputs};
use crate::leader::Leadership;
use crate::policy::apply::{Removal, apply_if_changed, remove_if_ours};
use crate::retry::is_conflict;
use crate::view;
use splice_crds::IDENTITY_SIGNER;

/// How often the signer looks for requests to answer.
pub const PERIOD: Duration = Duration::from_secs(1);
/// How often the trust bundle is compared with what it should hold (and restored if deleted).
pub const BUNDLE_PERIOD: Duration = Duration::from_secs(30);

/// What the signer is configured with.
#[derive(Clone, Debug)]
pub struct Config {
    pub trust_domain: String,
    pub splice_namespace: String,
    pub max_lifetime_seconds: i64,
    /// How long a new root must have been in the published bundle before certificates chain to
    /// it: the kubelets must have projected it into every pod that checks a peer.
    pub trust_propagation: Duration,
}

/// The default of [`Config::trust_propagation`]: a kubelet projects a pod's volumes again at
/// its periodic sync, every `syncFrequency` (1 min) plus up to half of it as jitter; 2 min
/// leaves a margin over that 90 s.
pub const TRUST_PROPAGATION: Duration = Duration::from_secs(120);

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
    #[error(transparent)]
    Sign(#[from] sign::SignError),
    #[error("{0} is not a time a certificate can hold")]
    Time(i64),
    #[error("another Splice instance answers this request")]
    NotOurs,
}

impl IdentityError {
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

/// What the API server serves of `certificates.k8s.io/v1beta1` (separate feature gates).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    pub requests: bool,
    pub bundles: bool,
}

/// Which of podcertificaterequests and clustertrustbundles the API server serves; a failed
/// discovery counts as neither.
pub async fn served(client: &Client) -> Served {
    discover(client).await.unwrap_or_default()
}

/// One discovery of `certificates.k8s.io/v1beta1`: a group version not served at all (404) is
/// an answer (nothing served), any other failure is not.
async fn discover(client: &Client) -> Result<Served, kube::Error> {
    match client
        .list_api_group_resources("certificates.k8s.io/v1beta1")
        .await
    {
        Ok(list) => {
            let has = |name: &str| list.resources.iter().any(|r| r.name == name);
            Ok(Served {
                requests: has("podcertificaterequests"),
                bundles: has("clustertrustbundles"),
            })
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Served::default()),
        Err(e) => Err(e),
    }
}

/// How often every replica asks discovery again whether PodCertificateRequests are served.
pub const SERVED_PERIOD: Duration = Duration::from_secs(60);

/// Keeps `tx` at whether the API server serves podcertificaterequests, on every replica (`None`
/// until discovery answered; a failed discovery keeps the last answer): `/validate` refuses
/// `spec.identity` without them and the reconcile says so in Ready.
pub async fn track_served(client: Client, tx: watch::Sender<Option<bool>>) {
    let mut ticker = tokio::time::interval(SERVED_PERIOD);
    loop {
        ticker.tick().await;
        let served = match discover(&client).await {
            Ok(served) => served.requests,
            Err(e) => {
                tracing::debug!(error = %e, "discovery of certificates.k8s.io/v1beta1");
                continue;
            }
        };
        tx.send_if_modified(|known| {
            let changed = *known != Some(served);
            *known = Some(served);
            changed
        });
    }
}

/// What a failed watch of the signer's caches says.
const WATCHING: &str = "identity signer: watching";

/// What the signer's acts and looks go through: its caches, each kept by a watch of its run.
pub struct Io {
    client: Client,
    recorder: kube::runtime::events::Recorder,
    leading: Leadership,
    requests: Store<PodCertificateRequest>,
    /// Only Splice's CA Secret (a field selector on its name).
    ca: Store<Secret>,
    /// Only this instance's bundle; `None` when the API server does not serve
    /// clustertrustbundles (certificates are issued, no bundle is published).
    bundle: Option<Store<ClusterTrustBundle>>,
    /// Rung for each new pending request (see [`Signer::woken`]).
    wake: Arc<Notify>,
    /// Whether the older versions' shared bundle was looked at this term (after this instance's
    /// own was first written, so pods never find no bundle at all).
    legacy_checked: std::sync::atomic::AtomicBool,
}

/// Runs the signer until the term ends: nothing when the API server does not serve
/// podcertificaterequests (then `splice_identity_signer_available` is 0 and a warning says so).
pub async fn run(config: Config, inputs: Inputs) {
    let served = served(&inputs.client).await;
    inputs.metrics.set_identity_available(served.requests);
    if !served.requests {
        tracing::warn!(
            "the API server does not serve certificates.k8s.io/v1beta1 podcertificaterequests: \
             the splice.dev/identity signer does not run, spec.identity pods get no certificate"
        );
        return;
    }
    if !served.bundles {
        tracing::warn!(
            "the API server does not serve certificates.k8s.io/v1beta1 clustertrustbundles: the \
             identity signer publishes no trust bundle, peers must get its roots another way"
        );
    }
    let client = inputs.client.clone();
    let bundle_name = bundle::name(&config.splice_namespace);
    let wake = Arc::new(Notify::new());
    let (requests, w1) = reflector::store();
    let (ca, w2) = reflector::store();
    let (bundle, w3) = served.bundles.then(reflector::store).unzip();
    let named = |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
    let bundle_watch = async {
        match w3 {
            Some(w3) => {
                let api = Api::all(client.clone());
                driver::reflect(api, named(&bundle_name), w3, WATCHING).await;
            }
            None => std::future::pending().await,
        }
    };
    // The watches run inside this task, so ending the term ends them too.
    let watches = futures::future::join3(
        // Only this signer's requests (a field the API server selects on for them).
        driver::reflect_waking(
            Api::all(client.clone()),
            watcher::Config::default().fields(&format!("spec.signerName={IDENTITY_SIGNER}")),
            w1,
            WATCHING,
            Some(driver::Wake {
                notify: Arc::clone(&wake),
                calls: decide::is_pending,
            }),
        ),
        driver::reflect(
            Api::namespaced(client.clone(), &config.splice_namespace),
            named(CA_SECRET),
            w2,
            WATCHING,
        ),
        bundle_watch,
    );
    let io = Io {
        client: client.clone(),
        recorder: inputs.recorder.clone(),
        leading: inputs.leading.clone(),
        requests,
        ca,
        bundle,
        wake: Arc::clone(&wake),
        legacy_checked: std::sync::atomic::AtomicBool::new(false),
    };
    tokio::select! {
        _ = watches => {}
        () = driver::run(Signer::new(config), io, inputs) => {}
    }
}

async fn ready(io: &Io) -> bool {
    io.requests.wait_until_ready().await.is_ok()
        && io.ca.wait_until_ready().await.is_ok()
        && match &io.bundle {
            Some(bundle) => bundle.wait_until_ready().await.is_ok(),
            None => true,
        }
}

fn extra(io: &Io) -> Extra {
    Extra {
        requests: io.requests.state(),
        ca: io
            .ca
            .state()
            .into_iter()
            .find(|s| s.name_any() == CA_SECRET),
        bundles: io.bundle.is_some(),
        // Its watch selects this instance's bundle by name.
        bundle: io
            .bundle
            .as_ref()
            .and_then(|b| b.state().into_iter().next()),
    }
}

/// Deletes the bundle every Splice shared before bundles were per instance, if Splice made it:
/// nothing keeps its roots current any more. A failure is logged; the next term tries again.
async fn delete_legacy_bundle(io: &Io, api: &Api<ClusterTrustBundle>) {
    match remove_if_ours(api, &io.leading, None, bundle::LEGACY_NAME).await {
        Ok(Removal::Removed) => tracing::info!(
            bundle = bundle::LEGACY_NAME,
            "identity signer: deleted the bundle older versions shared; each instance has its own"
        ),
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(step = e.step.verb(), error = %e.source, bundle = bundle::LEGACY_NAME, "identity signer: deleting the bundle older versions shared")
        }
    }
}

async fn act(io: &Io, act: Act) -> Seen {
    match act {
        Act::Answer(answer) => write_answer(io, *answer).await,
        // Not served: nothing to publish to (said once at the start).
        Act::Bundle(_) if io.bundle.is_none() => Seen::Bundle,
        Act::Bundle(desired) => {
            let api = Api::<ClusterTrustBundle>::all(io.client.clone());
            match apply_if_changed(&api, &io.leading, &*desired).await {
                Ok(_) => {
                    if !io
                        .legacy_checked
                        .swap(true, std::sync::atomic::Ordering::Relaxed)
                    {
                        delete_legacy_bundle(io, &api).await;
                    }
                }
                Err(e) => {
                    tracing::warn!(step = e.step.verb(), error = %e.source, "identity signer: writing the trust bundle");
                }
            }
            Seen::Bundle
        }
    }
}

/// Replaces the request's status under the resourceVersion it was read at; then logs the answer
/// and, for a denial, publishes a Warning on the pod.
async fn write_answer(io: &Io, answer: Answer) -> Seen {
    let Answer {
        request: pcr,
        status,
        outcome,
        denied,
        note,
    } = answer;
    let request = pcr.uid().unwrap_or_default();
    let ns = pcr.namespace().unwrap_or_default();
    let api = Api::<PodCertificateRequest>::namespaced(io.client.clone(), &ns);
    let mut object = (*pcr).clone();
    object.status = Some(status);
    match api
        .replace_status(&pcr.name_any(), &PostParams::default(), &object)
        .await
    {
        Ok(_) => {}
        Err(e) if is_conflict(&e) => return Seen::Conflict { request },
        Err(e) => {
            let e = IdentityError::Write(e);
            tracing::warn!(namespace = %ns, %request, error = %e, label = e.label(), "identity request not answered");
            return Seen::Failed { request };
        }
    }
    tracing::info!(namespace = %ns, %outcome, "identity signer: {note}");
    if let Some(d) = denied {
        let event = Event {
            type_: EventType::Warning,
            reason: format!("Identity{}", d.reason),
            note: Some(format!(
                "PodCertificateRequest {} denied: {}",
                pcr.name_any(),
                d.message
            )),
            action: "SignIdentity".into(),
            secondary: None,
        };
        if let Err(e) = io.recorder.publish(&event, &d.pod).await {
            tracing::warn!(namespace = %ns, %request, error = %e, "could not publish an Event");
        }
    }
    Seen::Answered {
        request,
        outcome,
        latency: latency(&pcr),
    }
}

fn latency(pcr: &PodCertificateRequest) -> Option<Duration> {
    let created = pcr.metadata.creation_timestamp.as_ref()?.0;
    let elapsed = k8s_openapi::jiff::Timestamp::now().duration_since(created);
    Duration::try_from(elapsed).ok()
}

/// Reads each pod a request names, 16 at once: its record as the view would hold it, with its
/// service account (unset: "default", as the API server takes it).
async fn look(io: &Io, looks: Vec<Look>) -> Vec<Seen> {
    futures::stream::iter(looks)
        .map(|look| read_pod(io, look))
        .buffer_unordered(16)
        .collect()
        .await
}

async fn read_pod(io: &Io, look: Look) -> Seen {
    let api = Api::<Pod>::namespaced(io.client.clone(), &look.namespace);
    match api.get_opt(&look.pod).await {
        Ok(found) => {
            let pod = found
                .filter(|p| p.metadata.uid.as_deref() == Some(look.pod_uid.as_str()))
                .and_then(|p| {
                    let account = p
                        .spec
                        .and_then(|s| s.service_account_name)
                        .filter(|a| !a.is_empty())
                        .unwrap_or_else(|| "default".to_owned());
                    let meta = p.metadata.into_response_partial::<Pod>();
                    let mut record = view::record(&meta, &mut HashMap::new())?;
                    record.service_account = account;
                    Some(Box::new(record))
                });
            Seen::Pod {
                request: look.request,
                pod_uid: look.pod_uid,
                pod,
            }
        }
        Err(source) => {
            let e = IdentityError::Read {
                what: "the pod",
                source,
            };
            tracing::warn!(namespace = %look.namespace, pod = %look.pod, error = %e, label = e.label(), "identity signer: reading a pod");
            Seen::Failed {
                request: look.request,
            }
        }
    }
}
