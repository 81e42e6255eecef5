//! The CA's I/O: the leader keeps the two Secrets and drives rotations ([`maintain_ca`]); every
//! replica loads the serving certificate straight from the watched Secret into memory and
//! publishes the trust bundle ([`load_certificates`]), and reports which CA issued what it serves
//! ([`report_serving`]). Decisions are in [`ca`] (issuing and reading certificates) and [`rotation`]
//! (when to rotate).
//!
//! How the leader knows every replica serves the new chain: each replica keeps a Lease of its own
//! (`splice-replica-<identity>`) naming the key identifier of the CA that issued the certificate
//! it has loaded, renewed every retry period. The leader reads those records instead of probing
//! replicas because it cannot reach them in general (pod IPs behind a Service load-balance; the
//! e2e replicas run on ports the leader does not know), and a record is written by the only party
//! that knows what it serves. A record not renewed within the lease duration belongs to a dead
//! replica (SIGKILL leaves it behind) and is ignored. Leases are what the cluster already uses for
//! heartbeats, and renewing them is not a write to anything the steady-state test counts.

pub mod ca;
pub mod rotation;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::Metrics;
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use splice_crds::{InjectionPolicy, MANAGED_BY_LABEL, MANAGER};
use splice_server::tls::CertResolver;
use time::OffsetDateTime;
use tokio::sync::watch;

use self::ca::{CaError, KeyedCert};
use self::rotation::{
    CA_SECRET, CaState, Observed, Phase, ReplicaReport, SERVING_SECRET, Step, Timing,
};
use crate::Settings;
use crate::leader::Leadership;
use crate::policy::validating::validating_configuration_name;
use crate::retry::is_conflict;

/// Label of the per-replica report Leases.
pub const REPLICA_LABEL: &str = "splice.dev/replica-report";
/// Annotation of a report Lease: key identifier of the CA that issued the served certificate.
pub const SERVING_ISSUER_ANNOTATION: &str = "splice.dev/serving-issuer";

/// How often the leader looks at configurations and replica reports during a rotation.
const ROTATION_POLL: Duration = Duration::from_secs(1);
/// A report not renewed for this many report TTLs belongs to a replica that is gone for good.
const STALE_REPORTS: i64 = 20;
/// The longest the leader sleeps in steady state (a Secret change wakes it earlier).
const MAX_SLEEP: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error(transparent)]
    Ca(#[from] CaError),
    /// Leadership ended (or its renew deadline passed) before a write: nothing was written.
    #[error("not leading: {what} was not written")]
    NotLeader { what: &'static str },
    #[error("reading or writing {what}: {source}")]
    Kube {
        what: &'static str,
        source: kube::Error,
    },
}

impl CertsError {
    pub fn label(&self) -> &'static str {
        match self {
            CertsError::Ca(e) => e.label(),
            CertsError::NotLeader { .. } => "not_leader",
            CertsError::Kube { .. } => "kube",
        }
    }
}

fn kube_err(what: &'static str) -> impl FnOnce(kube::Error) -> CertsError {
    move |source| CertsError::Kube { what, source }
}

fn unix_now() -> i64 {
    OffsetDateTime::now_utc().unix_timestamp()
}

/// The name of `identity`'s report Lease: a DNS-1123 subdomain whatever the identity holds.
pub fn replica_lease_name(identity: &str) -> String {
    let cleaned: String = identity
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(200)
        .collect();
    let cleaned = cleaned.trim_matches(['-', '.']);
    if cleaned.is_empty() {
        "splice-replica-unnamed".to_owned()
    } else {
        format!("splice-replica-{cleaned}")
    }
}

/// What the leader needs to keep the CA.
pub struct Keeper {
    pub secrets: Api<Secret>,
    pub configurations: Api<MutatingWebhookConfiguration>,
    /// The policies' validating configuration carries the bundle too.
    pub validating: Api<ValidatingWebhookConfiguration>,
    pub leases: Api<Lease>,
    pub namespace: String,
    pub names: Vec<String>,
    pub timing: Timing,
    /// Reports older than this are from dead replicas (seconds).
    pub report_ttl: i64,
    /// This instance's policies: only their configurations count.
    pub policies: Store<InjectionPolicy>,
    pub recorder: Recorder,
    /// Why the certificates cannot be kept (a Secret Splice did not create), for policy status.
    pub problem: watch::Sender<Option<String>>,
    /// Asked before every write: a replica that lost the Lease while alive writes nothing.
    pub leading: Leadership,
}

/// Since-times the leader measured itself; lost with leadership, which only makes the next
/// leader wait the delays again (never shorter).
#[derive(Default)]
struct Seen {
    published: Option<(String, i64)>,
    serving: Option<(String, i64)>,
    refused: BTreeMap<&'static str, String>,
}

impl Keeper {
    pub fn new(
        client: &Client,
        settings: &Settings,
        policies: Store<InjectionPolicy>,
        leading: Leadership,
    ) -> Self {
        let reporter = Reporter {
            controller: MANAGER.to_owned(),
            instance: Some(settings.lease.identity.clone()),
        };
        Keeper {
            secrets: Api::namespaced(client.clone(), &settings.namespace),
            configurations: Api::all(client.clone()),
            validating: Api::all(client.clone()),
            leases: Api::namespaced(client.clone(), &settings.namespace),
            namespace: settings.namespace.clone(),
            names: settings.serving_names.clone(),
            timing: settings.certs,
            report_ttl: i64::try_from(settings.lease.lease_duration.as_secs()).unwrap_or(15),
            policies,
            recorder: Recorder::new(client.clone(), reporter),
            problem: watch::channel(None).0,
            leading,
        }
    }

    fn ensure_leading(&self, what: &'static str) -> Result<(), CertsError> {
        if self.leading.now() {
            Ok(())
        } else {
            Err(CertsError::NotLeader { what })
        }
    }

    /// Follows why the certificates cannot be kept (`None` while they can).
    pub fn problems(&self) -> watch::Receiver<Option<String>> {
        self.problem.subscribe()
    }
}

/// The leader's CA loop: runs until its term ends (the task is aborted with the term).
pub async fn maintain_ca(keeper: Keeper, mut secret_changed: watch::Receiver<u64>) {
    let mut seen = Seen::default();
    let mut failures = 0u32;
    loop {
        let wait = match keeper.step(&mut seen).await {
            Ok(wait) => {
                failures = 0;
                wait
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                let delay = crate::retry::backoff(failures).min(Duration::from_secs(30));
                tracing::warn!(error = %e, kind = e.label(), retry_in = ?delay, "could not keep the webhook CA");
                delay
            }
        };
        if wait.is_zero() {
            continue;
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            changed = secret_changed.changed() => if changed.is_err() { return },
        }
    }
}

impl Keeper {
    /// One look at everything and at most one write; returns how long to wait before the next.
    async fn step(&self, seen: &mut Seen) -> Result<Duration, CertsError> {
        let now = unix_now();
        let lifetimes = self.timing.lifetimes;
        let existing = self
            .secrets
            .get_opt(CA_SECRET)
            .await
            .map_err(kube_err("the CA Secret"))?;
        let Some(secret) = existing else {
            let state = CaState::fresh(ca::new_ca(OffsetDateTime::now_utc(), lifetimes.ca)?);
            self.ensure_leading("the CA Secret")?;
            match self
                .secrets
                .create(
                    &PostParams::default(),
                    &rotation::ca_secret(&self.namespace, &state),
                )
                .await
            {
                Ok(_) => tracing::info!(secret = CA_SECRET, "created the webhook CA"),
                // Another leader-to-be created it first: read theirs.
                Err(e) if is_conflict(&e) => {}
                Err(e) => return Err(kube_err("the CA Secret")(e)),
            }
            return Ok(Duration::ZERO);
        };
        if !rotation::is_ours(&secret) {
            self.refuse(seen, CA_SECRET, &secret).await;
            return Ok(MAX_SLEEP);
        }
        seen.refused.remove(CA_SECRET);
        let state = match rotation::ca_state(&secret) {
            Ok(state) => state,
            Err(e) => {
                tracing::warn!(secret = CA_SECRET, error = %e, kind = e.label(), "repairing the corrupt CA Secret with a new CA");
                let state = CaState::fresh(ca::new_ca(OffsetDateTime::now_utc(), lifetimes.ca)?);
                self.replace_ca(&secret, &state).await?;
                return Ok(Duration::ZERO);
            }
        };

        // A serving certificate is only issued by a CA that can sign: an expired or corrupt one is
        // replaced first (below), and the next pass issues from its successor.
        let serving_check = match ca::ca_unusable(&state.active, now) {
            None => self.ensure_serving(seen, &state, now).await?,
            Some(_) => now,
        };
        if seen.refused.is_empty() {
            self.problem.send_if_modified(|p| p.take().is_some());
        }

        let observed = Observed {
            now,
            bundle_published_since: match state.phase {
                Phase::Trusting => self.bundle_published_since(seen, &state, now).await?,
                _ => None,
            },
            replicas_serving_since: match state.phase {
                Phase::Serving => self.replicas_serving_since(seen, &state, now).await?,
                _ => None,
            },
            rotate_requested: rotation::rotation_requested(&secret),
        };
        let step = rotation::decide(&state, &observed, &self.timing);
        let until = match &step {
            Step::Wait { until } => *until,
            _ => {
                let fresh = match step {
                    Step::Replace { .. } | Step::BeginRotation { .. } => {
                        Some(ca::new_ca(OffsetDateTime::now_utc(), lifetimes.ca)?)
                    }
                    _ => None,
                };
                if let Some(next) = rotation::apply(&state, &step, fresh) {
                    self.replace_ca(&secret, &next).await?;
                    tracing::info!(secret = CA_SECRET, from = state.phase.as_str(), to = next.phase.as_str(), step = ?StepName(&step), "CA rotation step");
                }
                return Ok(Duration::ZERO);
            }
        };
        let mut wait = match state.phase {
            Phase::Stable => MAX_SLEEP,
            Phase::Trusting | Phase::Serving => ROTATION_POLL,
        };
        for at in [until, Some(serving_check)].into_iter().flatten() {
            let secs = u64::try_from(at.saturating_sub(now)).unwrap_or(0);
            wait = wait.min(Duration::from_secs(secs.max(1)));
        }
        Ok(wait)
    }

    async fn replace_ca(&self, existing: &Secret, state: &CaState) -> Result<(), CertsError> {
        let mut secret = rotation::ca_secret(&self.namespace, state);
        // Optimistic concurrency: a stale leader's write fails instead of undoing a newer step.
        secret.metadata.resource_version = existing.metadata.resource_version.clone();
        self.ensure_leading("the CA Secret")?;
        match self
            .secrets
            .replace(CA_SECRET, &PostParams::default(), &secret)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(kube_err("the CA Secret")(e)),
        }
    }

    /// Makes the serving Secret hold a certificate issued by the active CA for every name, not past
    /// its renewal point; returns when to check it again (Unix seconds).
    async fn ensure_serving(
        &self,
        seen: &mut Seen,
        state: &CaState,
        now: i64,
    ) -> Result<i64, CertsError> {
        let lifetimes = self.timing.lifetimes;
        let existing = self
            .secrets
            .get_opt(SERVING_SECRET)
            .await
            .map_err(kube_err("the serving Secret"))?;
        let reason = match &existing {
            None => Some("there is none".to_owned()),
            Some(s) if !rotation::is_ours(s) => {
                self.refuse(seen, SERVING_SECRET, s).await;
                return Ok(now + MAX_SLEEP.as_secs() as i64);
            }
            Some(s) => match rotation::serving_cert(s) {
                Err(e) => Some(e.to_string()),
                Ok(cert) => ca::serving_renewal(
                    &cert,
                    &state.active.cert_pem,
                    &self.names,
                    now,
                    lifetimes.renew_fraction,
                ),
            },
        };
        seen.refused.remove(SERVING_SECRET);
        let Some(reason) = reason else {
            let renew_at = existing
                .as_ref()
                .and_then(|s| rotation::serving_cert(s).ok())
                .and_then(|c| ca::inspect(&c.cert_pem, "the serving certificate").ok())
                .map_or(now, |i| i.renew_at(lifetimes.renew_fraction));
            return Ok(renew_at);
        };
        let serving = ca::issue_serving(
            &state.active,
            &self.names,
            OffsetDateTime::now_utc(),
            lifetimes.serving,
        )?;
        let mut secret =
            rotation::serving_secret(&self.namespace, &serving, &state.active.cert_pem);
        self.ensure_leading("the serving Secret")?;
        let result = match existing {
            None => self.secrets.create(&PostParams::default(), &secret).await,
            Some(s) => {
                secret.metadata.resource_version = s.metadata.resource_version.clone();
                self.secrets
                    .replace(SERVING_SECRET, &PostParams::default(), &secret)
                    .await
            }
        };
        match result {
            Ok(_) => {
                let serial = ca::inspect(&serving.cert_pem, "the serving certificate")
                    .map(|i| i.serial)
                    .unwrap_or_default();
                tracing::info!(secret = SERVING_SECRET, reason = %reason, serial = %serial, "issued a serving certificate");
                Ok(now)
            }
            Err(e) if is_conflict(&e) => Ok(now),
            Err(e) => Err(kube_err("the serving Secret")(e)),
        }
    }

    /// Since when every configuration of this instance's policies, and the validating one,
    /// carries the state's bundle.
    async fn bundle_published_since(
        &self,
        seen: &mut Seen,
        state: &CaState,
        now: i64,
    ) -> Result<Option<i64>, CertsError> {
        let wanted = state.bundle();
        let listed = self
            .configurations
            .list(&ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGER}")))
            .await
            .map_err(kube_err("webhook configurations"))?;
        let ours: std::collections::HashSet<String> = self
            .policies
            .state()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        let validating = self
            .validating
            .get_opt(&validating_configuration_name(&self.namespace))
            .await
            .map_err(kube_err("the validating webhook configuration"))?;
        let mutating = listed
            .items
            .iter()
            .filter(|c| c.owner_references().iter().any(|o| ours.contains(&o.uid)))
            .flat_map(|c| c.webhooks.clone().unwrap_or_default())
            .map(|w| w.client_config);
        let validating = validating
            .into_iter()
            .flat_map(|c| c.webhooks.unwrap_or_default())
            .map(|w| w.client_config);
        let bundles: Vec<Option<String>> = mutating
            .chain(validating)
            .map(|c| c.ca_bundle.and_then(|b| String::from_utf8(b.0).ok()))
            .collect();
        if !rotation::all_carry(&bundles, &wanted) {
            seen.published = None;
            return Ok(None);
        }
        let since = match &seen.published {
            Some((bundle, since)) if *bundle == wanted => *since,
            _ => now,
        };
        seen.published = Some((wanted, since));
        Ok(Some(since))
    }

    /// Since when every live replica serves a certificate issued by the active CA.
    async fn replicas_serving_since(
        &self,
        seen: &mut Seen,
        state: &CaState,
        now: i64,
    ) -> Result<Option<i64>, CertsError> {
        let active = ca::inspect(&state.active.cert_pem, "the CA certificate")?.key_id;
        let reports = self.replica_reports(now).await?;
        if !rotation::all_serve(&reports, &active, now, self.report_ttl) {
            seen.serving = None;
            return Ok(None);
        }
        let since = match &seen.serving {
            Some((id, since)) if *id == active => *since,
            _ => now,
        };
        seen.serving = Some((active, since));
        Ok(Some(since))
    }

    async fn replica_reports(&self, now: i64) -> Result<Vec<ReplicaReport>, CertsError> {
        let leases = self
            .leases
            .list(&ListParams::default().labels(REPLICA_LABEL))
            .await
            .map_err(kube_err("replica reports"))?;
        // Every replica that ever ran left a report (pods get new names); the long-dead ones are
        // removed here, during rotations only, so the steady state still writes nothing.
        for lease in &leases.items {
            let renewed = lease
                .spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0.as_second());
            if renewed.is_none_or(|r| now - r > STALE_REPORTS * self.report_ttl) {
                self.ensure_leading("a dead replica's report")?;
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: lease.uid(),
                        resource_version: lease.resource_version(),
                    }),
                    ..DeleteParams::default()
                };
                if let Err(e) = self.leases.delete(&lease.name_any(), &params).await {
                    tracing::debug!(error = %e, "could not remove a dead replica's report");
                }
            }
        }
        Ok(leases
            .items
            .iter()
            .filter_map(|l| {
                let spec = l.spec.as_ref()?;
                Some(ReplicaReport {
                    identity: spec.holder_identity.clone()?,
                    issuer_key_id: l
                        .annotations()
                        .get(SERVING_ISSUER_ANNOTATION)
                        .cloned()
                        .unwrap_or_default(),
                    renewed: spec.renew_time.as_ref()?.0.as_second(),
                })
            })
            .collect())
    }

    /// A Secret Splice did not create is left alone; say so once per Secret (log and Event).
    async fn refuse(&self, seen: &mut Seen, name: &'static str, secret: &Secret) {
        let version = secret.resource_version().unwrap_or_default();
        if seen.refused.get(name) == Some(&version) {
            return;
        }
        if !self.leading.now() {
            return;
        }
        seen.refused.insert(name, version);
        let note = format!(
            "Secret {name} exists but was not created by Splice (no {MANAGED_BY_LABEL}={MANAGER} \
             label); Splice will not overwrite it. Delete it, or label it, to let Splice manage it."
        );
        tracing::warn!(secret = name, "{note}");
        self.problem.send_replace(Some(note.clone()));
        let event = Event {
            type_: EventType::Warning,
            reason: "ForeignSecret".to_owned(),
            note: Some(note),
            action: "KeepCertificate".to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &secret.object_ref(&())).await {
            tracing::warn!(secret = name, error = %e, "could not publish an Event");
        }
    }
}

/// Logs a step by name only: the step's payload never includes keys, but names keep logs short.
struct StepName<'a>(&'a Step);

impl std::fmt::Debug for StepName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Step::Wait { .. } => f.write_str("Wait"),
            Step::Replace { reason } => write!(f, "Replace({reason})"),
            Step::BeginRotation { reason } => write!(f, "BeginRotation({reason})"),
            Step::Promote => f.write_str("Promote"),
            Step::Retire => f.write_str("Retire"),
        }
    }
}

/// Every replica: loads the serving certificate from its Secret into the webhook server (a watch,
/// straight into memory: no volume, no kubelet sync, no restart), publishes the trust bundle from
/// the CA Secret, and tells [`report_serving`] which CA issued what it now serves.
pub async fn load_certificates(
    api: Api<Secret>,
    resolver: Arc<CertResolver>,
    metrics: Arc<Metrics>,
    ca_bundle: watch::Sender<Option<Arc<String>>>,
    secret_changed: watch::Sender<u64>,
    served: watch::Sender<ServingCert>,
) {
    let by_name = |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
    let ca_events = watcher(api.clone(), by_name(CA_SECRET))
        .default_backoff()
        .touched_objects()
        .map(|e| (true, e));
    let serving_events = watcher(api, by_name(SERVING_SECRET))
        .default_backoff()
        .touched_objects()
        .map(|e| (false, e));
    let mut events = std::pin::pin!(futures::stream::select(ca_events, serving_events));
    let mut loaded: Option<KeyedCert> = None;
    while let Some((is_ca, event)) = events.next().await {
        let secret = match event {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "watching the webhook TLS Secrets");
                continue;
            }
        };
        // Processed first, announced after: whoever reacts to the change (the leader's CA loop,
        // status updates) sees the certificate this event brought.
        'event: {
            if secret.metadata.deletion_timestamp.is_some() || !rotation::is_ours(&secret) {
                break 'event;
            }
            if is_ca {
                let Some(bundle) =
                    rotation::published_bundle(&secret).filter(|b| !ca::split_bundle(b).is_empty())
                else {
                    tracing::warn!(
                        secret = CA_SECRET,
                        "the CA Secret has no usable bundle; keeping the current one"
                    );
                    break 'event;
                };
                if let Ok(info) = rotation::ca_state(&secret)
                    .map_err(|e| e.to_string())
                    .and_then(|s| ca::inspect(&s.active.cert_pem, "ca").map_err(|e| e.to_string()))
                {
                    metrics.set_certificate_expiry("ca", info.not_after);
                }
                ca_bundle.send_if_modified(|current| {
                    let same = current.as_deref() == Some(&bundle);
                    if !same {
                        tracing::info!(
                            secret = CA_SECRET,
                            cas = ca::split_bundle(&bundle).len(),
                            "trust bundle loaded"
                        );
                        *current = Some(Arc::new(bundle));
                    }
                    !same
                });
                break 'event;
            }
            let cert = match rotation::serving_cert(&secret) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "the serving Secret is unusable; keeping the current certificate");
                    break 'event;
                }
            };
            if loaded.as_ref() == Some(&cert) {
                break 'event;
            }
            let info = match ca::inspect(&cert.cert_pem, "serving") {
                Ok(i) => i,
                Err(e) => {
                    tracing::warn!(error = %e, "the serving certificate does not parse; keeping the current one");
                    break 'event;
                }
            };
            if let Err(e) = resolver.swap_pem(cert.cert_pem.as_bytes(), cert.key_pem.as_bytes()) {
                tracing::warn!(error = %e, "the serving certificate does not load; keeping the current one");
                break 'event;
            }
            metrics.set_certificate_expiry("serving", info.not_after);
            tracing::info!(secret = SERVING_SECRET, serial = %info.serial, issuer = %info.issuer_key_id, "serving certificate loaded");
            served.send_replace(ServingCert {
                issuer_key_id: info.issuer_key_id,
                not_after: Some(info.not_after),
            });
            loaded = Some(cert);
        }
        secret_changed.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// The certificate this replica serves: the key identifier of the CA that issued it (what the
/// report Lease names) and the chain's NotAfter (what `status.certificateNotAfter` says).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServingCert {
    pub issuer_key_id: String,
    /// Seconds since the epoch.
    pub not_after: Option<i64>,
}

impl ServingCert {
    /// The chain's NotAfter in RFC 3339.
    pub fn not_after_rfc3339(&self) -> Option<String> {
        Some(Timestamp::from_second(self.not_after?).ok()?.to_string())
    }
}

/// Every replica: keeps its report Lease naming the CA that issued what it serves, renewed every
/// `period` and at once when that changes.
pub async fn report_serving(
    api: Api<Lease>,
    identity: String,
    mut served: watch::Receiver<ServingCert>,
    period: Duration,
    ttl: Duration,
) {
    let name = replica_lease_name(&identity);
    loop {
        let issuer = served.borrow_and_update().issuer_key_id.clone();
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY_LABEL.to_owned(), MANAGER.to_owned()),
                    (REPLICA_LABEL.to_owned(), "true".to_owned()),
                ])),
                annotations: Some(BTreeMap::from([(
                    SERVING_ISSUER_ANNOTATION.to_owned(),
                    issuer,
                )])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.clone()),
                lease_duration_seconds: i32::try_from(ttl.as_secs()).ok(),
                renew_time: Some(MicroTime(Timestamp::now())),
                ..LeaseSpec::default()
            }),
        };
        if let Err(e) = api
            .patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&lease),
            )
            .await
        {
            tracing::debug!(error = %e, "could not renew this replica's serving report");
        }
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            changed = served.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_lease_names_are_valid_whatever_the_identity() {
        assert_eq!(replica_lease_name("Host_123"), "splice-replica-host-123");
        assert_eq!(replica_lease_name("pod-a"), "splice-replica-pod-a");
        let long = replica_lease_name(&"x".repeat(500));
        assert!(long.len() <= 253);
        assert_eq!(replica_lease_name("__"), "splice-replica-unnamed");
    }
}
