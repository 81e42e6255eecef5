//! The leader's one view of the cluster's pods and namespaces: one metadata-only watch of each
//! (a compact record per pod: namespace, name, UID, labels, creation time, owner kind, the
//! versions in `splice.dev/status`), and the one rule that says where a selected pod stands for a policy
//! ([`classify`]: current, outdated or missed). Coverage, the admission probe, the rollout, the
//! identity signer and the reconcile's evidence of enforcement read it; none keeps a watch of its
//! own.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt, watcher};
use splice_crds::{InjectionPolicy, STATUS_ANNOTATION, condition};
use splice_engine::explain::{selects_namespace, selects_pod};
use splice_engine::overrides::Resolved;
use splice_engine::{CompiledPolicy, Exclusions, NamespaceContext, OverrideRecord};
use splice_server::store::PolicyStore;
use tokio::sync::watch;

/// What coverage keeps of one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRecord {
    pub namespace: Arc<str>,
    pub name: String,
    /// Its UID: a PodCertificateRequest names the pod it was made for by UID.
    pub uid: String,
    /// `spec.serviceAccountName`; empty when unset ("default", as the API server takes it) or
    /// unknown: the metadata-only watch never sees the spec, so the identity signer reads it
    /// from the pod itself once per pod (`identity::Signer`).
    pub service_account: String,
    pub labels: BTreeMap<String, String>,
    pub created: Option<Timestamp>,
    /// (policy, version) for each entry of `splice.dev/status`: the template hash, and the data
    /// digests of `valuesFrom` when it recorded some ([`version`]).
    pub injected: Vec<(String, String)>,
    /// The kind of its controller, so the rollout knows which workload can replace it.
    pub owner: PodOwner,
    /// (policy, revision, when) for each in-place update recorded in `splice.dev/in-place`.
    pub in_place: Vec<(String, String, Option<Timestamp>)>,
    /// (policy, what it recorded of its overrides) for each entry of `splice.dev/status` that
    /// recorded some: a namespace's annotation can outdate the pod ([`classify`]).
    pub overrides: Vec<(String, BTreeMap<String, OverrideRecord>)>,
}

impl PodRecord {
    /// When `policy` updated the pod in place to `revision`, if it did.
    pub fn updated_in_place(&self, policy: &str, revision: &str) -> Option<Option<Timestamp>> {
        self.in_place
            .iter()
            .find(|(p, r, _)| p == policy && r == revision)
            .map(|(_, _, at)| *at)
    }

    pub(crate) fn recorded_overrides(
        &self,
        policy: &str,
    ) -> Option<&BTreeMap<String, OverrideRecord>> {
        self.overrides
            .iter()
            .find(|(p, _)| p == policy)
            .map(|(_, o)| o)
    }

    pub(crate) fn recorded_hash(&self, policy: &str) -> Option<&str> {
        self.injected
            .iter()
            .find(|(p, _)| p == policy)
            .map(|(_, h)| h.as_str())
    }
}

/// What a pod's entry must equal to be current: the template hash, then each `valuesFrom`
/// source's data digest. One string per pod keeps the record compact.
pub fn version(hash: &str, data: &BTreeMap<String, String>) -> String {
    let mut v = hash.to_owned();
    for (source, digest) in data {
        v.extend([" ", source, "=", digest]);
    }
    v
}

/// The version of `policy` a current pod carries: what coverage compares and what a rollout
/// restarts workloads for.
pub fn revision(policy: &CompiledPolicy) -> String {
    version(policy.template_hash(), policy.data_digests())
}

/// Where one selected pod stands for a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
    Current,
    Outdated,
    Missed,
}

/// The state of every pod `policy` selects and counts (see [`count`]); pods it does not select,
/// and uninjected pods it is not expected to carry, are left out. `in_force_since` is when the
/// API server was seen enforcing it ([`in_force_since`]; `None`: it is not, so no pod can have
/// been missed).
pub fn classify<'a>(
    policy: &'a CompiledPolicy,
    in_force_since: Option<Timestamp>,
    namespaces: &'a HashMap<String, NamespaceContext>,
    exclusions: &'a Exclusions,
    pods: impl IntoIterator<Item = &'a PodRecord> + 'a,
) -> impl Iterator<Item = (&'a PodRecord, PodState)> + 'a {
    let current = revision(policy);
    let expects_creates = policy
        .spec()
        .operations
        .contains(&splice_crds::Operation::Create);
    let missable_after = in_force_since;
    let mut namespace_selected: HashMap<&'a str, bool> = HashMap::new();
    // What a pod taking nothing from its own annotations gets, per namespace: resolved once.
    let mut from_namespace: HashMap<&'a str, Option<Resolved>> = HashMap::new();
    pods.into_iter().filter_map(move |pod| {
        let ns_ok = *namespace_selected.entry(&pod.namespace).or_insert_with(|| {
            let fallback;
            let context = match namespaces.get(&*pod.namespace) {
                Some(c) => c,
                None => {
                    // Not seen yet: its name is all selectors can use (the implied label).
                    fallback = NamespaceContext {
                        name: pod.namespace.to_string(),
                        ..NamespaceContext::default()
                    };
                    &fallback
                }
            };
            selects_namespace(policy, context, exclusions)
        });
        if !ns_ok || !selects_pod(policy, &pod.labels) {
            return None;
        }
        let state = match pod.recorded_hash(policy.name()) {
            Some(h) if h == current => {
                let now = from_namespace
                    .entry(&pod.namespace)
                    .or_insert_with(|| from_namespace_of(policy, namespaces, &pod.namespace));
                let recorded = pod.recorded_overrides(policy.name());
                if now.as_ref().is_some_and(|n| n.drifted(recorded).is_some()) {
                    PodState::Outdated
                } else {
                    PodState::Current
                }
            }
            Some(_) => PodState::Outdated,
            None => {
                let after = match (pod.created, missable_after) {
                    (Some(created), Some(since)) => created >= since,
                    _ => false,
                };
                if !(after && expects_creates) {
                    return None;
                }
                PodState::Missed
            }
        };
        Some((pod, state))
    })
}

/// What `policy`'s overrides give a pod of `namespace` from the namespace alone
/// ([`splice_engine::overrides::Resolved::drifted`] then compares a pod's record with it).
fn from_namespace_of(
    policy: &CompiledPolicy,
    namespaces: &HashMap<String, NamespaceContext>,
    namespace: &str,
) -> Option<Resolved> {
    let empty = BTreeMap::new();
    let annotations = namespaces.get(namespace).map_or(&empty, |c| &c.annotations);
    policy.overrides().from_namespace(namespace, annotations)
}

/// When the policy's Ready condition last turned True, if it is True: Ready turns True only once
/// the API server is seen enforcing the policy, at a whole second after the evidence
/// (`policy::enforcement`), so every pod created from that second on, uninjected, was missed.
/// Ready stays True through a change while the earlier generation stays in force.
pub fn in_force_since(policy: &InjectionPolicy) -> Option<Timestamp> {
    let status = policy.status.as_ref()?;
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY)?;
    (c.status == "True" && !policy.spec.paused).then_some(c.last_transition_time.0)
}

/// (policy, [`version`]) for each entry of a pod's `splice.dev/status`; none when it is absent
/// or unreadable.
pub fn injected_versions(annotations: Option<&BTreeMap<String, String>>) -> Vec<(String, String)> {
    recorded(annotations).0
}

/// Per policy entry of a pod's `splice.dev/status`: its [`version`], and what it recorded of its
/// overrides when it recorded some.
type Recorded = (
    Vec<(String, String)>,
    Vec<(String, BTreeMap<String, OverrideRecord>)>,
);

fn recorded(annotations: Option<&BTreeMap<String, String>>) -> Recorded {
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(default)]
        hash: String,
        #[serde(default)]
        data: BTreeMap<String, String>,
        #[serde(default)]
        overrides: BTreeMap<String, OverrideRecord>,
    }
    let Some(entries) = annotations
        .and_then(|a| a.get(STATUS_ANNOTATION))
        .and_then(|raw| serde_json::from_str::<BTreeMap<String, Entry>>(raw).ok())
    else {
        return Recorded::default();
    };
    let mut out = Recorded::default();
    for (policy, e) in entries {
        out.0.push((policy.clone(), version(&e.hash, &e.data)));
        if !e.overrides.is_empty() {
            out.1.push((policy, e.overrides));
        }
    }
    out
}

/// (policy, revision, when) of each entry of a pod's `splice.dev/in-place` (written by the
/// rollout's in-place updates, `rollout::inplace::Marker`); none when absent or unreadable.
fn in_place_updates(
    annotations: Option<&BTreeMap<String, String>>,
) -> Vec<(String, String, Option<Timestamp>)> {
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(default)]
        revision: String,
        #[serde(default)]
        at: String,
    }
    annotations
        .and_then(|a| a.get(splice_crds::IN_PLACE_ANNOTATION))
        .and_then(|raw| serde_json::from_str::<BTreeMap<String, Entry>>(raw).ok())
        .map(|m| {
            m.into_iter()
                .map(|(p, e)| (p, e.revision, e.at.parse().ok()))
                .collect()
        })
        .unwrap_or_default()
}

/// Reads the pod's record from its metadata; `None` for a pod without a namespace.
pub fn record(
    meta: &PartialObjectMeta<Pod>,
    interned: &mut HashMap<String, Arc<str>>,
) -> Option<PodRecord> {
    let ns = meta.metadata.namespace.as_deref()?;
    let namespace = match interned.get(ns) {
        Some(n) => Arc::clone(n),
        None => {
            let n: Arc<str> = Arc::from(ns);
            interned.insert(ns.to_owned(), Arc::clone(&n));
            n
        }
    };
    let (injected, overrides) = recorded(meta.metadata.annotations.as_ref());
    let owner = meta
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| PodOwner::from_kind(&o.kind))
        .unwrap_or_default();
    Some(PodRecord {
        namespace,
        name: meta.name_any(),
        uid: meta.metadata.uid.clone().unwrap_or_default(),
        service_account: String::new(),
        labels: meta.metadata.labels.clone().unwrap_or_default(),
        created: meta.metadata.creation_timestamp.as_ref().map(|t| t.0),
        injected,
        owner,
        in_place: in_place_updates(meta.metadata.annotations.as_ref()),
        overrides,
    })
}

/// The leader's pods, from its one metadata-only watch ([`watch_pods`]), read by coverage and
/// by the rollout.
#[derive(Default)]
pub struct Pods {
    records: HashMap<(Arc<str>, String), Arc<PodRecord>>,
    interned: HashMap<String, Arc<str>>,
    pub synced: bool,
    /// Bumped on every change.
    pub generation: u64,
}

impl Pods {
    /// A snapshot of Arcs, so the pod watch is never blocked for the length of a pass.
    pub fn snapshot(&self) -> Vec<Arc<PodRecord>> {
        self.records.values().cloned().collect()
    }
}

/// The namespaces' labels, from the leader's one metadata-only watch ([`watch_namespaces`]),
/// read by coverage and by the admission probe.
#[derive(Default)]
pub struct Namespaces {
    pub contexts: HashMap<String, NamespaceContext>,
    pub synced: bool,
    /// Bumped on every change.
    pub generation: u64,
}

/// The leader's namespace and pod watches' state, shared by coverage, the probe and the rollout.
#[derive(Clone, Default)]
pub struct LeaderView {
    pub namespaces: Arc<Mutex<Namespaces>>,
    pub pods: Arc<Mutex<Pods>>,
}

/// Where coverage finds the policies.
pub struct Policies {
    /// The controller's cache, shared (a reflector of its own would hold every policy twice).
    pub cache: Store<InjectionPolicy>,
    /// True once `cache` holds the first full list.
    pub listed: watch::Receiver<bool>,
    /// The webhook's compiled policies, reused rather than compiled again.
    pub webhook_policies: Arc<PolicyStore>,
}

/// Keeps `state` current from a metadata-only watch of every pod; a task of the leader's term.
pub async fn watch_pods(api: Api<PartialObjectMeta<Pod>>, state: Arc<Mutex<Pods>>) {
    let mut listing: Vec<PartialObjectMeta<Pod>> = Vec::new();
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    while let Some(event) = events.next().await {
        let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
        let s = &mut *s;
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(p)) => listing.push(p),
            Ok(watcher::Event::InitDone) => {
                s.records.clear();
                for p in listing.drain(..) {
                    if let Some(r) = record(&p, &mut s.interned) {
                        s.records
                            .insert((Arc::clone(&r.namespace), r.name.clone()), Arc::new(r));
                    }
                }
                s.synced = true;
                s.generation = s.generation.wrapping_add(1);
            }
            Ok(watcher::Event::Apply(p)) => {
                if let Some(r) = record(&p, &mut s.interned) {
                    let key = (Arc::clone(&r.namespace), r.name.clone());
                    if s.records.get(&key).map(|x| &**x) != Some(&r) {
                        s.records.insert(key, Arc::new(r));
                        s.generation = s.generation.wrapping_add(1);
                    }
                }
            }
            Ok(watcher::Event::Delete(p)) => {
                if let Some(r) = record(&p, &mut s.interned) {
                    s.records.remove(&(r.namespace, r.name));
                    s.generation = s.generation.wrapping_add(1);
                }
            }
            Err(e) => tracing::warn!(error = %e, "watching pod metadata for coverage"),
        }
    }
}

pub(crate) async fn watch_namespaces(
    api: Api<PartialObjectMeta<Namespace>>,
    state: Arc<Mutex<Namespaces>>,
) {
    let mut listing: Vec<PartialObjectMeta<Namespace>> = Vec::new();
    let context = |n: &PartialObjectMeta<Namespace>| NamespaceContext {
        name: n.name_any(),
        labels: n.metadata.labels.clone().unwrap_or_default(),
        // Overrides read them: a namespace's annotation can outdate its pods.
        annotations: n.metadata.annotations.clone().unwrap_or_default(),
    };
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    while let Some(event) = events.next().await {
        let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(n)) => listing.push(n),
            Ok(watcher::Event::InitDone) => {
                s.contexts = listing
                    .drain(..)
                    .map(|n| (n.name_any(), context(&n)))
                    .collect();
                s.synced = true;
                s.generation = s.generation.wrapping_add(1);
            }
            Ok(watcher::Event::Apply(n)) => {
                let c = context(&n);
                if s.contexts.get(&c.name) != Some(&c) {
                    s.contexts.insert(c.name.clone(), c);
                    s.generation = s.generation.wrapping_add(1);
                }
            }
            Ok(watcher::Event::Delete(n)) => {
                s.contexts.remove(&n.name_any());
                s.generation = s.generation.wrapping_add(1);
            }
            Err(e) => tracing::warn!(error = %e, "watching namespaces"),
        }
    }
}

/// The kind of a pod's controller (its ownerReference with `controller: true`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PodOwner {
    /// A bare pod.
    #[default]
    None,
    ReplicaSet,
    StatefulSet,
    DaemonSet,
    Job,
    Other,
}

impl PodOwner {
    pub fn from_kind(kind: &str) -> Self {
        match kind {
            "ReplicaSet" => PodOwner::ReplicaSet,
            "StatefulSet" => PodOwner::StatefulSet,
            "DaemonSet" => PodOwner::DaemonSet,
            "Job" => PodOwner::Job,
            _ => PodOwner::Other,
        }
    }
}
