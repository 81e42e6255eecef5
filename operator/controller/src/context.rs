//! What `splice run` is configured with ([`Settings`]) and what every reconcile reads and shares
//! ([`Context`]): the client, the caches, the leadership check and what this replica last wrote.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use splice_crds::{InjectionPolicy, MANAGER};
use tokio::sync::watch;

use crate::certs::{ServingCert, rotation};
use crate::guard;
use crate::leader::{Leadership, LeaseConfig};
use crate::metrics::Metrics;
use crate::policy::error::Error;
use crate::policy::render::ClientTarget;
use crate::policy::{enforcement, in_force, neighbours};
use crate::status::{self, Owner};
use crate::values::ValuesCache;

/// Everything `splice run` is configured with.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Splice's own namespace: the Lease and the CA Secret live here, and no pod in it is injected.
    pub namespace: String,
    /// How the API server reaches the webhook (Service or `--webhook-url`).
    pub target: ClientTarget,
    /// Names the serving certificate carries: the Service's DNS names and, for an outside
    /// webhook, the URL's host.
    pub serving_names: Vec<String>,
    /// Only policies matching this label selector are served and managed (empty: all). Lets
    /// several independent Splice instances share a cluster, e.g. in tests or for canaries.
    pub policy_selector: Option<String>,
    /// Whether the leader keeps the ValidatingWebhookConfiguration for policies (else removes it).
    pub validating_webhook: bool,
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub lease: LeaseConfig,
    /// Certificate lifetimes, renewal point and rotation delays.
    pub certs: rotation::Timing,
    /// Where the availability guard looks (Splice's Deployment) and how long it holds.
    pub guard: guard::GuardConfig,
    /// How often the leader's admission probe verifies each policy; `None` turns it off.
    pub probe_interval: Option<Duration>,
    /// Cluster-wide cap on workloads the rollout restarts at once, across all policies.
    pub rollout_max_concurrent: usize,
    /// Namespaces `spec.valuesFrom` may read ConfigMaps and Secrets from (watched by every
    /// replica); a source elsewhere is refused.
    pub values_namespaces: Vec<String>,
    /// The SPIFFE trust domain of the pod identities Splice signs (`spec.identity`).
    pub trust_domain: String,
    /// How long a new CA's root is published before pod certificates chain to it.
    pub identity_trust_propagation: std::time::Duration,
}

/// What every reconcile reads and shares.
pub struct Context {
    /// The client every read and write goes through.
    pub client: Client,
    /// Splice's own namespace (excluded from every webhook).
    pub namespace: String,
    /// How the API server reaches the webhook.
    pub target: ClientTarget,
    /// Every managed policy as the controller sees them, for conflict detection.
    pub policies: Store<InjectionPolicy>,
    /// The CA PEM the API server must trust; `None` until the Secret has been loaded.
    pub ca_bundle: watch::Receiver<Option<Arc<String>>>,
    /// Publishes Events on policies.
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// Whether this replica holds the Lease; checked before every write.
    pub leading: Leadership,
    /// Whether the availability guard lets `Fail` be in force.
    pub guard: watch::Receiver<guard::GuardStatus>,
    /// Why Splice cannot keep its certificates (a Secret it did not create), if it cannot.
    pub certificate_problem: watch::Receiver<Option<String>>,
    /// The certificate this replica serves (its NotAfter goes into every status).
    pub serving: watch::Receiver<ServingCert>,
    /// Who conflicted with whom at the last reconcile, so a spec change re-reconciles only the
    /// policies whose conflicts it can change.
    pub neighbours: Arc<neighbours::Neighbours>,
    /// What tells this Splice's shared webhook entries from another instance's in the cluster.
    pub instance: String,
    /// The spec each policy serves, for grouping policies into shared webhook entries.
    pub entry_specs: in_force::EntrySpecs,
    /// The data of `valuesFrom`, to report a missing source in Ready.
    pub values: Arc<ValuesCache>,
    /// The leader's namespace watch, to pick where a dry-run pod shows a generation enforced.
    pub namespaces: Arc<Mutex<crate::view::Namespaces>>,
    /// Whether the API server serves PodCertificateRequests (`None`: not known yet).
    pub pod_certificates: watch::Receiver<Option<bool>>,
    /// Generations written but not yet seen enforced, per policy (see [`enforcement`]).
    awaiting: Mutex<HashMap<String, enforcement::Awaiting>>,
    /// Consecutive failures per policy, for the retry backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// The writer of the reconcile's slice of each status (what it wrote, until the watch
    /// delivers it).
    pub status: status::Writer,
}

/// Every input a [`Context`] is built from, each required: a forgotten one is a compile error,
/// not a placeholder that silently stays (tests build theirs with [`ContextParts::for_tests`]).
pub struct ContextParts {
    pub client: Client,
    pub policies: Store<InjectionPolicy>,
    pub ca_bundle: watch::Receiver<Option<Arc<String>>>,
    pub metrics: Arc<Metrics>,
    pub leading: Leadership,
    pub guard: watch::Receiver<guard::GuardStatus>,
    pub certificate_problem: watch::Receiver<Option<String>>,
    pub serving: watch::Receiver<ServingCert>,
    pub neighbours: Arc<neighbours::Neighbours>,
    pub values: Arc<ValuesCache>,
    pub namespaces: Arc<Mutex<crate::view::Namespaces>>,
    pub pod_certificates: watch::Receiver<Option<bool>>,
}

impl Context {
    pub fn new(settings: &Settings, parts: ContextParts) -> Self {
        let reporter = Reporter {
            controller: MANAGER.to_owned(),
            instance: Some(settings.lease.identity.clone()),
        };
        let status = status::Writer::new(
            parts.client.clone(),
            Owner::Reconcile,
            parts.leading.clone(),
        );
        Context {
            recorder: Recorder::new(parts.client.clone(), reporter),
            client: parts.client,
            namespace: settings.namespace.clone(),
            target: settings.target.clone(),
            policies: parts.policies,
            ca_bundle: parts.ca_bundle,
            metrics: parts.metrics,
            leading: parts.leading,
            guard: parts.guard,
            certificate_problem: parts.certificate_problem,
            serving: parts.serving,
            neighbours: parts.neighbours,
            instance: format!(
                "{}/{}",
                settings.namespace,
                settings.policy_selector.as_deref().unwrap_or_default()
            ),
            entry_specs: in_force::EntrySpecs::default(),
            values: parts.values,
            namespaces: parts.namespaces,
            pod_certificates: parts.pod_certificates,
            awaiting: Mutex::default(),
            failures: Mutex::default(),
            status,
        }
    }

    pub(crate) fn ensure_leading(&self) -> Result<(), Error> {
        if self.leading.now() {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    /// This leader's record of `generation` of `policy` awaiting evidence, one look taken: the
    /// record as it was before this look.
    pub(crate) fn look_at(
        &self,
        policy: &InjectionPolicy,
        generation: i64,
        now: k8s_openapi::jiff::Timestamp,
    ) -> enforcement::Awaiting {
        let mut awaiting = self.awaiting.lock().unwrap_or_else(PoisonError::into_inner);
        let uid = policy.uid();
        let entry = awaiting
            .entry(policy.name_any())
            .or_insert_with(|| enforcement::Awaiting::new(uid.clone(), generation, now));
        if entry.uid != uid || entry.generation != generation {
            *entry = enforcement::Awaiting::new(uid, generation, now);
        }
        let seen = entry.clone();
        entry.looks = entry.looks.saturating_add(1);
        seen
    }

    /// Keeps the sighting that showed `policy`'s awaited generation enforced, so the looks until
    /// Ready may report it need no new dry run.
    pub(crate) fn saw_enforced(&self, policy: &str, sighting: enforcement::Sighting) {
        if let Some(a) = self
            .awaiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(policy)
        {
            a.seen = Some(sighting);
        }
    }

    /// Forgets what awaited evidence for `policy`: it is enforced, or nothing is awaited.
    pub(crate) fn forget_awaiting(&self, policy: &str) {
        self.awaiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(policy);
    }

    pub(crate) fn count_failure(&self, policy: &str) -> u32 {
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        let n = failures.entry(policy.to_owned()).or_default();
        *n = n.saturating_add(1);
        *n
    }

    pub(crate) fn reset_backoff(&self, policy: &str) {
        self.failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(policy);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    impl ContextParts {
        /// What the unit tests run a reconcile with: no guard verdict (so `Fail` is never in
        /// force), no certificate problem, no serving certificate yet, a requeue queue nobody
        /// reads and an empty `valuesFrom` cache.
        pub(crate) fn for_tests(
            client: Client,
            settings: &Settings,
            policies: Store<InjectionPolicy>,
            ca_bundle: watch::Receiver<Option<Arc<String>>>,
            leading: Leadership,
            namespaces: Arc<Mutex<crate::view::Namespaces>>,
        ) -> Self {
            ContextParts {
                client,
                policies,
                ca_bundle,
                metrics: Arc::new(Metrics::new()),
                leading,
                guard: watch::channel(guard::GuardStatus::not_observed()).1,
                certificate_problem: watch::channel(None).1,
                serving: watch::channel(ServingCert::default()).1,
                neighbours: Arc::new(neighbours::Neighbours::new().0),
                values: Arc::new(ValuesCache::new(
                    settings.values_namespaces.clone(),
                    settings.namespace.clone(),
                )),
                namespaces,
                pod_certificates: watch::channel(Some(true)).1,
            }
        }
    }
    use crate::certs::rotation;
    use crate::guard;

    /// What the tests run Splice with: an outside webhook URL, default timings.
    pub(crate) fn settings() -> Settings {
        Settings {
            namespace: "splice-system".into(),
            target: ClientTarget::from_url("https://127.0.0.1:9443").unwrap(),
            serving_names: vec!["127.0.0.1".into()],
            policy_selector: None,
            validating_webhook: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            lease: LeaseConfig {
                name: "splice-leader".into(),
                identity: "test".into(),
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
            },
            certs: rotation::Timing::default(),
            guard: guard::GuardConfig {
                namespace: "splice-system".into(),
                deployment: "splice".into(),
                hold: Duration::from_secs(60),
            },
            probe_interval: Some(Duration::from_secs(60)),
            rollout_max_concurrent: crate::rollout::DEFAULT_MAX_CONCURRENT,
            values_namespaces: vec!["splice-system".into()],
            trust_domain: "cluster.local".into(),
            identity_trust_propagation: crate::identity::TRUST_PROPAGATION,
        }
    }
}
