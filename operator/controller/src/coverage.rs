//! Coverage: how many of the pods a policy selects carry its injection, with the current or an
//! outdated template, and how many it missed. The leader keeps a metadata-only watch on every pod
//! (a compact record each: namespace, labels, creation time, the hashes in `splice.dev/status`),
//! counts every policy once per pass when something changed, exports the counts as
//! `splice_coverage_pods{policy,state}` and writes `status.coverage` only when a count changed.
//!
//! "Matched" is defined so that it can be honest: pods are only injected when created, so a pod
//! that existed before the policy's webhook configuration was in force is not expected to carry
//! it. A selected pod counts as matched when it carries the policy's injection (any template), or
//! when it was created after the WebhookConfigured condition turned True (plus a grace period for
//! the API server to load the configuration) without carrying it: that pod is "missed", e.g.
//! admitted while the webhook was unreachable under failurePolicy Ignore.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::leader::Leadership;
use crate::metrics::Metrics;
pub use crate::rollout::plan::PodOwner;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use splice_crds::{Coverage, InjectionPolicy, STATUS_ANNOTATION, condition};
use splice_engine::explain::{selects_namespace, selects_pod};
use splice_engine::{CompiledPolicy, Exclusions, NamespaceContext};
use splice_server::store::PolicyStore;
use tokio::sync::watch;

/// The field manager of `status.coverage`: its own, so the reconciler's server-side apply of the
/// rest of the status (manager `splice`) neither removes nor fights over it.
pub const COVERAGE_MANAGER: &str = "splice-coverage";
/// One counting pass at most this often, so pod churn costs at most one status write per policy
/// per period, and an idle cluster none.
pub const PERIOD: Duration = Duration::from_secs(5);
/// Missed pods named in an Event.
const EXAMPLES: usize = 5;

/// What coverage keeps of one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRecord {
    pub namespace: Arc<str>,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub created: Option<Timestamp>,
    /// (policy, version) for each entry of `splice.dev/status`: the template hash, and the data
    /// digests of `valuesFrom` when it recorded some ([`version`]).
    pub injected: Vec<(String, String)>,
    /// The kind of its controller, so the rollout knows which workload can replace it.
    pub owner: PodOwner,
}

impl PodRecord {
    fn recorded_hash(&self, policy: &str) -> Option<&str> {
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

/// The counts for one policy, and a few missed pods to name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Count {
    pub coverage: Coverage,
    pub missed_examples: Vec<String>,
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
            Some(h) if h == current => PodState::Current,
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

/// Counts the pods `policy` selects (see [`classify`]).
pub fn count<'a>(
    policy: &'a CompiledPolicy,
    in_force_since: Option<Timestamp>,
    namespaces: &'a HashMap<String, NamespaceContext>,
    exclusions: &'a Exclusions,
    pods: impl IntoIterator<Item = &'a PodRecord> + 'a,
) -> Count {
    let mut out = Count::default();
    for (pod, state) in classify(policy, in_force_since, namespaces, exclusions, pods) {
        let c = &mut out.coverage;
        c.matched += 1;
        match state {
            PodState::Current => c.current += 1,
            PodState::Outdated => c.outdated += 1,
            PodState::Missed => {
                c.missed += 1;
                if out.missed_examples.len() < EXAMPLES {
                    out.missed_examples
                        .push(format!("{}/{}", pod.namespace, pod.name));
                }
            }
        }
    }
    out
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
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(default)]
        hash: String,
        #[serde(default)]
        data: BTreeMap<String, String>,
    }
    annotations
        .and_then(|a| a.get(STATUS_ANNOTATION))
        .and_then(|raw| serde_json::from_str::<BTreeMap<String, Entry>>(raw).ok())
        .map(|m| {
            m.into_iter()
                .map(|(p, e)| (p, version(&e.hash, &e.data)))
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
    let injected = injected_versions(meta.metadata.annotations.as_ref());
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
        labels: meta.metadata.labels.clone().unwrap_or_default(),
        created: meta.metadata.creation_timestamp.as_ref().map(|t| t.0),
        injected,
        owner,
    })
}

/// (uid, generation, compiled policy).
type CompiledEntry = (Option<String>, Option<i64>, Arc<CompiledPolicy>);
/// (pod generation, namespace generation, (policy, resourceVersion)…): what the last pass saw.
type Seen = (u64, u64, Vec<(String, Option<String>, String)>);

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
pub struct Observed {
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

/// The leader's coverage loop; cancelled with the rest of the leader's work.
pub async fn run(
    client: Client,
    splice_namespace: String,
    policies: Policies,
    observed: Observed,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    leading: Leadership,
) {
    let Policies {
        cache: policies,
        mut listed,
        webhook_policies: served,
    } = policies;
    let Observed { namespaces, pods } = observed;
    tracing::debug!("coverage: waiting for the policy cache");
    if listed.wait_for(|l| *l).await.is_err() {
        return;
    }
    tracing::debug!("coverage: counting");
    let exclusions = Exclusions::default_for(&splice_namespace);
    let api: Api<InjectionPolicy> = Api::all(client);
    let mut compiled: HashMap<String, CompiledEntry> = HashMap::new();
    // What this replica last wrote per policy (uid, coverage), until the cache shows it.
    let mut written: HashMap<String, (Option<String>, Coverage)> = HashMap::new();
    let mut last_seen: Option<Seen> = None;
    let mut ticker = tokio::time::interval(PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let all = policies.state();
        // The served entry's data digests too: a valuesFrom change moves no resourceVersion.
        let mut fingerprint: Vec<(String, Option<String>, String)> = all
            .iter()
            .map(|p| {
                let name = p.name_any();
                let data = served
                    .get(&name)
                    .map(|c| version("", c.data_digests()))
                    .unwrap_or_default();
                (name, p.resource_version(), data)
            })
            .collect();
        fingerprint.sort();
        let (pods_gen, pods_synced) = {
            let p = pods.lock().unwrap_or_else(PoisonError::into_inner);
            (p.generation, p.synced)
        };
        let (ns_gen, ns_synced, contexts) = {
            let n = namespaces.lock().unwrap_or_else(PoisonError::into_inner);
            (n.generation, n.synced, n.contexts.clone())
        };
        if !pods_synced || !ns_synced {
            tracing::debug!(
                pods_synced,
                ns_synced,
                "coverage: waiting for the pod and namespace lists"
            );
            continue;
        }
        let seen = (pods_gen, ns_gen, fingerprint);
        if last_seen.as_ref() == Some(&seen) {
            continue;
        }
        last_seen = Some(seen);

        let mut work = Vec::with_capacity(all.len());
        for policy in &all {
            let name = policy.name_any();
            let key = (policy.uid(), policy.metadata.generation);
            // The webhook's own compilation of this generation, when it has it: a second one per
            // policy (templates, selectors, render caches) would double that memory.
            if let Some(c) = crate::policy::in_force::in_force_of(&served, &name)
                .filter(|c| Some(c.generation()) == key.1)
            {
                compiled.remove(&name);
                work.push((Arc::clone(policy), c));
                continue;
            }
            let c = match compiled.get(&name) {
                Some((uid, generation, c)) if (uid, generation) == (&key.0, &key.1) => {
                    Arc::clone(c)
                }
                _ => {
                    match CompiledPolicy::compile(&name, key.1.unwrap_or_default(), &policy.spec) {
                        Ok(c) => {
                            let c = Arc::new(c);
                            compiled.insert(name.clone(), (key.0, key.1, Arc::clone(&c)));
                            c
                        }
                        // The reconciler reports an invalid policy; nothing is injected for it.
                        Err(_) => continue,
                    }
                }
            };
            work.push((Arc::clone(policy), c));
        }
        let snapshot = pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .snapshot();
        let excl = exclusions.clone();
        let started = std::time::Instant::now();
        // Policies × pods is CPU work: off the async workers, which also serve admissions.
        let pass = tokio::task::spawn_blocking(move || {
            let mut gauges = HashMap::new();
            let mut results = Vec::with_capacity(work.len());
            for (policy, c) in work {
                let n = count(
                    &c,
                    in_force_since(&policy),
                    &contexts,
                    &excl,
                    snapshot.iter().map(|r| &**r),
                );
                let cv = n.coverage;
                gauges.insert(
                    c.name().to_owned(),
                    [cv.matched, cv.current, cv.outdated, cv.missed],
                );
                results.push((policy, n));
            }
            (gauges, results)
        })
        .await;
        let Ok((gauges, results)) = pass else {
            return;
        };
        tracing::debug!(
            policies = results.len(),
            pods = pods_gen,
            took = ?started.elapsed(),
            "coverage pass"
        );
        compiled.retain(|name, _| gauges.contains_key(name));
        compiled.shrink_to_fit();
        written.retain(|name, _| gauges.contains_key(name));
        metrics.set_coverage(gauges);

        for (policy, n) in results {
            let name = policy.name_any();
            let cached = policy.status.as_ref().and_then(|s| s.coverage);
            let known = match written.get(&name) {
                Some((uid, cv)) if uid == &policy.uid() && cached != Some(*cv) => Some(*cv),
                _ => cached,
            };
            // An absent coverage reads as zero, so a policy that matches nothing costs no write.
            let before = known.unwrap_or_default();
            if before == n.coverage {
                continue;
            }
            if !leading.now() {
                return;
            }
            let patch = serde_json::json!({
                "apiVersion": InjectionPolicy::api_version(&()),
                "kind": InjectionPolicy::kind(&()),
                "status": { "coverage": n.coverage },
            });
            match api
                .patch_status(
                    &name,
                    &PatchParams::apply(COVERAGE_MANAGER).force(),
                    &Patch::Apply(&patch),
                )
                .await
            {
                Ok(_) => {
                    written.insert(name.clone(), (policy.uid(), n.coverage));
                }
                Err(e) => {
                    tracing::warn!(policy = %name, error = %e, "could not write status.coverage");
                    // Look again next pass even if nothing else changes.
                    last_seen = None;
                    continue;
                }
            }
            if n.coverage.missed > before.missed {
                let note = format!(
                    "{} pod(s) this policy selects were admitted without its injection (e.g. {}): \
                     the webhook was unreachable or failed open, or the API server had not yet \
                     seen their namespace's new labels. Recreate them to inject.",
                    n.coverage.missed,
                    n.missed_examples.join(", ")
                );
                let ev = Event {
                    type_: EventType::Warning,
                    reason: "PodsMissed".into(),
                    note: Some(note),
                    action: "CountCoverage".into(),
                    secondary: None,
                };
                if let Err(e) = recorder.publish(&ev, &policy.object_ref(&())).await {
                    tracing::warn!(policy = %name, error = %e, "could not publish the PodsMissed Event");
                }
            }
        }
    }
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
        annotations: BTreeMap::new(),
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

#[cfg(test)]
mod tests {
    use splice_crds::InjectionPolicySpec;

    use super::*;

    fn policy(yaml: &str) -> CompiledPolicy {
        let spec: InjectionPolicySpec = serde_yaml::from_str(yaml).unwrap();
        CompiledPolicy::compile("mesh", 1, &spec).unwrap()
    }

    fn pod(
        ns: &str,
        name: &str,
        labels: &[(&str, &str)],
        created: i64,
        hash: Option<&str>,
    ) -> PodRecord {
        PodRecord {
            namespace: Arc::from(ns),
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            created: Some(Timestamp::from_second(created).unwrap()),
            injected: hash
                .map(|h| vec![("mesh".to_owned(), h.to_owned())])
                .unwrap_or_default(),
            owner: PodOwner::None,
        }
    }

    fn at(s: i64) -> Option<Timestamp> {
        Some(Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn pods_are_counted_as_current_outdated_or_missed() {
        let p = policy("objectSelector: {matchLabels: {app: web}}\ntemplate: {labels: {a: b}}\n");
        let h = p.template_hash().to_owned();
        let pods = [
            pod("shop", "current", &[("app", "web")], 2000, Some(&h)),
            pod("shop", "outdated", &[("app", "web")], 500, Some("old")),
            pod("shop", "missed", &[("app", "web")], 2000, None),
            pod("shop", "before", &[("app", "web")], 500, None),
            pod("shop", "just-before-ready", &[("app", "web")], 999, None),
            pod("shop", "missed-at-ready", &[("app", "web")], 1000, None),
            pod("shop", "other", &[("app", "api")], 2000, None),
            pod("kube-system", "excluded", &[("app", "web")], 2000, None),
        ];
        let n = count(
            &p,
            at(1000),
            &HashMap::new(),
            &Exclusions::default_for("splice-system"),
            &pods,
        );
        assert_eq!(
            n.coverage,
            Coverage {
                matched: 4,
                current: 1,
                outdated: 1,
                missed: 2
            }
        );
        assert_eq!(n.missed_examples, ["shop/missed", "shop/missed-at-ready"]);
    }

    #[test]
    fn without_a_configuration_in_force_nothing_is_missed() {
        let p = policy("{}\n");
        let pods = [pod("shop", "a", &[], 2000, None)];
        let n = count(
            &p,
            None,
            &HashMap::new(),
            &Exclusions::default_for("s"),
            &pods,
        );
        assert_eq!(n.coverage, Coverage::default());
    }

    #[test]
    fn an_update_only_policy_misses_no_pod() {
        let p = policy("operations: [UPDATE]\n");
        let pods = [pod("shop", "a", &[], 2000, None)];
        let n = count(
            &p,
            at(0),
            &HashMap::new(),
            &Exclusions::default_for("s"),
            &pods,
        );
        assert_eq!(n.coverage.missed, 0);
    }

    #[test]
    fn namespace_labels_come_from_the_namespace_records() {
        let p = policy("namespaceSelector: {matchLabels: {mesh: on}}\n");
        let pods = [
            pod("a", "x", &[], 2000, None),
            pod("b", "y", &[], 2000, None),
        ];
        let mut namespaces = HashMap::new();
        namespaces.insert(
            "a".to_owned(),
            NamespaceContext {
                name: "a".into(),
                labels: [("mesh".to_owned(), "on".to_owned())].into(),
                ..Default::default()
            },
        );
        let n = count(&p, at(0), &namespaces, &Exclusions::default_for("s"), &pods);
        assert_eq!(n.coverage.missed, 1);
        assert_eq!(n.missed_examples, ["a/x"]);
    }

    #[test]
    fn a_pod_record_keeps_the_hashes_of_its_status_annotation() {
        let mut meta = PartialObjectMeta::<Pod>::default();
        meta.metadata.namespace = Some("shop".into());
        meta.metadata.name = Some("web".into());
        meta.metadata.annotations = Some(
            [(
                STATUS_ANNOTATION.to_owned(),
                r#"{"mesh":{"hash":"h1","containers":["proxy"]}}"#.to_owned(),
            )]
            .into(),
        );
        let r = record(&meta, &mut HashMap::new()).unwrap();
        assert_eq!(r.injected, [("mesh".to_owned(), "h1".to_owned())]);
        assert_eq!(r.recorded_hash("mesh"), Some("h1"));
    }
}
