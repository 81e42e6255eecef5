//! The caches every replica keeps for its webhook: the compiled policies in force and the
//! namespaces, and readiness once both listed everything.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use splice_crds::InjectionPolicy;
use splice_engine::entry::canary_key;
use splice_engine::{CompiledPolicy, NamespaceContext, SourceKind, SourceRef};
use splice_server::admin::Readiness;
use splice_server::store::{NamespaceStore, PolicyStore};
use tokio::sync::watch;

use crate::policy::in_force;
use crate::values::ValuesCache;

/// Keeps the webhook's policy store equal to the managed policies, serving for each the
/// generation in force ([`in_force::in_force`]): an update that does not compile leaves the last
/// good one in place. Compiles once per change of what decides that, and a policy with
/// `valuesFrom` again when its data changes (the values come from `values`, whose first listing
/// this waits for, so a replica never serves a policy without its data). Signals `changed` when
/// the set of (policy, generation) changes and `synced` once the first full list is in.
pub(super) async fn feed_policy_store(
    api: Api<InjectionPolicy>,
    config: watcher::Config,
    store: Arc<PolicyStore>,
    values: (Arc<ValuesCache>, watch::Receiver<bool>),
    changed: watch::Sender<u64>,
    synced: watch::Sender<bool>,
) {
    let (values, mut values_synced) = values;
    let _ = values_synced.wait_for(|s| *s).await;
    let mut data_changed = values.subscribe();
    data_changed.mark_unchanged();
    let mut compiled: HashMap<String, CompileKey> = HashMap::new();
    // The policies that read `valuesFrom`, to compile again when their data changes.
    let mut reading: HashMap<String, InjectionPolicy> = HashMap::new();
    let mut listing: Vec<InjectionPolicy> = Vec::new();
    let bump = |changed: &watch::Sender<u64>| changed.send_modify(|n| *n = n.wrapping_add(1));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    loop {
        let event = tokio::select! {
            event = events.next() => match event {
                Some(event) => event,
                None => break,
            },
            Ok(()) = data_changed.changed() => {
                let mut any = false;
                for p in reading.values() {
                    let (_, served) = serve(p, &store, &values);
                    any |= put(&store, p, served);
                }
                if any {
                    bump(&changed);
                }
                continue;
            }
        };
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(p)) => listing.push(p),
            Ok(watcher::Event::InitDone) => {
                let mut entries = Vec::new();
                let mut keys = HashMap::new();
                reading.clear();
                for p in listing.drain(..) {
                    let name = p.name_any();
                    remember(&mut reading, &p);
                    let (key, served) = match compiled.get(&name) {
                        Some(key) if key.still(&p) => (key.clone(), Served::kept(&store, &p)),
                        _ => serve(&p, &store, &values),
                    };
                    entries.extend(served.entries(&p));
                    keys.insert(name, key);
                }
                store.replace_all(entries);
                compiled = keys;
                bump(&changed);
                synced.send_replace(true);
            }
            Ok(watcher::Event::Apply(p)) => {
                let name = p.name_any();
                remember(&mut reading, &p);
                if compiled.get(&name).is_some_and(|key| key.still(&p)) {
                    continue;
                }
                let (key, served) = serve(&p, &store, &values);
                put(&store, &p, served);
                compiled.insert(name, key);
                bump(&changed);
            }
            Ok(watcher::Event::Delete(p)) => {
                let name = p.name_any();
                reading.remove(&name);
                store.remove(&name);
                store.remove(&canary_key(&name));
                compiled.remove(&name);
                bump(&changed);
            }
            Err(e) => tracing::warn!(error = %e, "watching InjectionPolicies"),
        }
    }
}

/// What the compiled entry of a policy was decided from: its uid and generation, and, while the
/// current generation does not compile, the generation the status keeps in force. A status-only
/// update changes none of these and recompiles nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CompileKey {
    uid: Option<String>,
    generation: Option<i64>,
    /// `None` when the current generation compiled.
    kept: Option<Option<i64>>,
    /// The promoted revision's template hash, which decides whether a canary is open.
    stable: Option<String>,
}

impl CompileKey {
    fn still(&self, policy: &InjectionPolicy) -> bool {
        self.uid == policy.metadata.uid
            && self.generation == policy.metadata.generation
            && self.kept.is_none_or(|kept| {
                kept == policy.status.as_ref().and_then(|s| s.serving_generation)
            })
            && self.stable.as_deref() == in_force::stable(policy).map(|s| s.template_hash.as_str())
    }
}

/// Keeps `p` among the policies to compile again on a data change when it reads `valuesFrom`.
fn remember(reading: &mut HashMap<String, InjectionPolicy>, p: &InjectionPolicy) {
    if p.spec.values_from.is_empty() && !reads_kept_values(p) {
        reading.remove(&p.name_any());
    } else {
        reading.insert(p.name_any(), p.clone());
    }
}

/// True when the generation the status keeps in force reads `valuesFrom` (the current spec may
/// not, while it does not compile).
fn reads_kept_values(policy: &InjectionPolicy) -> bool {
    policy
        .status
        .as_ref()
        .and_then(|s| s.serving_spec.as_ref())
        .and_then(|s| s.get("valuesFrom"))
        .is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()))
}

/// What one policy serves: the revision in force, and, while its canary is open, the promoted
/// revision for the pods outside it. The store keeps the first under the canary key when the
/// policy has a canary, and what pods outside the canary get under the policy's name
/// ([`splice_engine::entry::canary_key`]).
struct Served {
    current: Option<Arc<CompiledPolicy>>,
    /// `Some` while a canary is open.
    stable: Option<Arc<CompiledPolicy>>,
}

impl Served {
    /// What the store holds for `policy` now.
    fn kept(store: &PolicyStore, policy: &InjectionPolicy) -> Served {
        let name = policy.name_any();
        match store.get(&canary_key(&name)) {
            Some(current) => {
                let outside = store.get(&name);
                let open = outside.as_ref().is_some_and(|o| !Arc::ptr_eq(o, &current));
                Served {
                    current: Some(current),
                    stable: outside.filter(|_| open),
                }
            }
            None => Served {
                current: store.get(&name),
                stable: None,
            },
        }
    }

    /// The store's entries for `policy`: (key, compiled).
    fn entries(self, policy: &InjectionPolicy) -> Vec<(String, Arc<CompiledPolicy>)> {
        let name = policy.name_any();
        let has_canary = policy
            .spec
            .rollout
            .as_ref()
            .is_some_and(|r| r.canary.is_some());
        let mut out = Vec::with_capacity(2);
        if let Some(current) = self.current {
            if has_canary {
                out.push((canary_key(&name), Arc::clone(&current)));
            }
            out.push((name, self.stable.unwrap_or(current)));
        }
        out
    }
}

/// Writes `served` into the store; true when an entry changed.
fn put(store: &PolicyStore, policy: &InjectionPolicy, served: Served) -> bool {
    let name = policy.name_any();
    let entries = served.entries(policy);
    let mut changed = false;
    for key in [canary_key(&name), name] {
        let now = store.get(&key);
        let next = entries.iter().find(|(k, _)| *k == key).map(|(_, c)| c);
        let same = match (&now, next) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        if same {
            continue;
        }
        changed = true;
        match next {
            Some(c) => store.insert(key, Arc::clone(c)),
            None => store.remove(&key),
        };
    }
    changed
}

/// What to serve for `policy`, given what this replica serves now.
fn serve(
    policy: &InjectionPolicy,
    store: &PolicyStore,
    values: &ValuesCache,
) -> (CompileKey, Served) {
    let name = policy.name_any();
    let now = Served::kept(store, policy);
    let in_force = in_force::in_force(policy);
    let kept = match &in_force {
        in_force::InForce::Current(_) => None,
        _ => Some(policy.status.as_ref().and_then(|s| s.serving_generation)),
    };
    let key = CompileKey {
        uid: policy.metadata.uid.clone(),
        generation: policy.metadata.generation,
        kept,
        stable: in_force::stable(policy).map(|s| s.template_hash.clone()),
    };
    if let Some(error) = in_force.error() {
        tracing::warn!(policy = %name, generation = policy.metadata.generation, error = %error, "policy does not compile; serving the last generation that did, if any");
    }
    let current = match in_force.into_compiled() {
        Some(c) if !c.spec().values_from.is_empty() => with_data(c, now.current.clone(), values),
        Some(c) => Some(Arc::new(c)),
        // The status may not record the last good generation yet (the leader writes it after
        // this replica compiled it): keep serving what this replica already had of this policy.
        None => now.current.clone().filter(|s| {
            policy
                .metadata
                .generation
                .is_some_and(|g| s.generation() < g)
        }),
    };
    let stable = current
        .as_ref()
        .and_then(|c| in_force::compile_stable(policy, c.template_hash()))
        .and_then(|s| {
            if !s.spec().values_from.is_empty() {
                return with_data(s, now.stable.clone(), values);
            }
            match &now.stable {
                Some(kept) if kept.generation() == s.generation() && kept.spec() == s.spec() => {
                    Some(Arc::clone(kept))
                }
                _ => Some(Arc::new(s)),
            }
        });
    (key, Served { current, stable })
}

/// `compiled` (checked without its data) compiled again with the data it reads; while that data
/// cannot be resolved or does not compile, the entry served now stays (the last good rendering:
/// the leader reports the problem in Ready). An unchanged rendering keeps its entry, caches and
/// all.
fn with_data(
    compiled: CompiledPolicy,
    serving: Option<Arc<CompiledPolicy>>,
    values: &ValuesCache,
) -> Option<Arc<CompiledPolicy>> {
    let name = compiled.name().to_owned();
    let resolved = match values.resolve(compiled.spec()) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(policy = %name, error = %e, "valuesFrom cannot be resolved; the last good rendering, if any, keeps serving");
            return serving;
        }
    };
    if let Some(s) = &serving
        && s.generation() == compiled.generation()
        && s.spec() == compiled.spec()
        && s.data_digests() == &resolved.digests
    {
        return serving;
    }
    match CompiledPolicy::compile_with(&name, compiled.generation(), compiled.spec(), &resolved) {
        Ok(c) => Some(Arc::new(c)),
        Err(e) => {
            tracing::warn!(policy = %name, error = %e, "policy does not compile with its valuesFrom data; the last good rendering, if any, keeps serving");
            serving
        }
    }
}

/// Keeps the ConfigMaps (or Secrets) of one namespace in `cache`; `synced` once listed. Logs
/// name objects, never their data.
pub(super) async fn feed_values<K>(
    api: Api<K>,
    kind: SourceKind,
    data: fn(&K) -> std::collections::BTreeMap<String, String>,
    namespace: String,
    cache: Arc<ValuesCache>,
    synced: watch::Sender<bool>,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    let object = |name: String| SourceRef {
        kind,
        namespace: namespace.clone(),
        name,
    };
    let mut listing = Vec::new();
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(o)) => listing.push((o.name_any(), data(&o))),
            Ok(watcher::Event::InitDone) => {
                let objects = std::mem::take(&mut listing);
                cache.update(|d| {
                    d.replace_namespace(kind, &namespace, objects);
                    true
                });
                synced.send_replace(true);
            }
            Ok(watcher::Event::Apply(o)) => {
                let values = data(&o);
                cache.update(|d| d.insert(object(o.name_any()), values));
            }
            Ok(watcher::Event::Delete(o)) => {
                cache.update(|d| d.remove(&object(o.name_any())));
            }
            Err(e) => {
                tracing::warn!(error = %e, kind = kind.as_str(), namespace = %namespace, "watching valuesFrom sources")
            }
        }
    }
}

fn namespace_context(ns: &Namespace) -> NamespaceContext {
    NamespaceContext {
        name: ns.name_any(),
        labels: ns.metadata.labels.clone().unwrap_or_default(),
        annotations: ns.metadata.annotations.clone().unwrap_or_default(),
    }
}

/// Keeps the webhook's namespace store equal to the cluster's namespaces.
pub(super) async fn feed_namespace_store(
    api: Api<Namespace>,
    store: Arc<NamespaceStore>,
    synced: watch::Sender<bool>,
) {
    let mut listing = Vec::new();
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(ns)) => {
                listing.push((ns.name_any(), Arc::new(namespace_context(&ns))))
            }
            Ok(watcher::Event::InitDone) => {
                store.replace_all(listing.drain(..));
                synced.send_replace(true);
            }
            Ok(watcher::Event::Apply(ns)) => {
                let context = namespace_context(&ns);
                if store.get(&context.name).as_deref() != Some(&context) {
                    store.insert(context.name.clone(), Arc::new(context));
                }
            }
            Ok(watcher::Event::Delete(ns)) => {
                store.remove(&ns.name_any());
            }
            Err(e) => tracing::warn!(error = %e, "watching Namespaces"),
        }
    }
}

/// Ready once both caches listed everything (the certificate is checked by `Readiness` itself).
pub(super) async fn track_readiness(
    readiness: Arc<Readiness>,
    mut policies: watch::Receiver<bool>,
    mut namespaces: watch::Receiver<bool>,
) {
    // The policy feed waits for the valuesFrom sources first, so policies synced implies them.
    let _ = policies.wait_for(|s| *s).await;
    let _ = namespaces.wait_for(|s| *s).await;
    readiness.set_caches_synced(true);
    tracing::info!("policy and namespace caches synced");
}
