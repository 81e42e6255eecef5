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
use splice_engine::{CompiledPolicy, NamespaceContext, SourceKind, SourceRef};
use splice_server::admin::Readiness;
use splice_server::store::{NamespaceStore, PolicyStore};
use tokio::sync::watch;

use crate::policy::serving;
use crate::values::ValuesCache;

/// Keeps the webhook's policy store equal to the managed policies, serving for each the
/// generation in force ([`serving::in_force`]): an update that does not compile leaves the last
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
                for (name, p) in &reading {
                    let current = store.get(name);
                    let (_, entry) = serve(p, current.clone(), &values);
                    let same = match (&current, &entry) {
                        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                        (None, None) => true,
                        _ => false,
                    };
                    if same {
                        continue;
                    }
                    any = true;
                    match entry {
                        Some(c) => store.insert(name.clone(), c),
                        None => store.remove(name),
                    };
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
                    let (key, entry) = match compiled.get(&name) {
                        Some(key) if key.still(&p) => (key.clone(), store.get(&name)),
                        _ => serve(&p, store.get(&name), &values),
                    };
                    if let Some(entry) = entry {
                        entries.push((name.clone(), entry));
                    }
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
                let (key, entry) = serve(&p, store.get(&name), &values);
                match entry {
                    Some(c) => {
                        store.insert(name.clone(), c);
                    }
                    None => {
                        store.remove(&name);
                    }
                }
                compiled.insert(name, key);
                bump(&changed);
            }
            Ok(watcher::Event::Delete(p)) => {
                let name = p.name_any();
                reading.remove(&name);
                store.remove(&name);
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
}

impl CompileKey {
    fn still(&self, policy: &InjectionPolicy) -> bool {
        self.uid == policy.metadata.uid
            && self.generation == policy.metadata.generation
            && self.kept.is_none_or(|kept| {
                kept == policy.status.as_ref().and_then(|s| s.serving_generation)
            })
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

/// The entry to serve for `policy`, given the one this replica serves now.
fn serve(
    policy: &InjectionPolicy,
    serving: Option<Arc<CompiledPolicy>>,
    values: &ValuesCache,
) -> (CompileKey, Option<Arc<CompiledPolicy>>) {
    let name = policy.name_any();
    let in_force = serving::in_force(policy);
    let kept = match &in_force {
        serving::InForce::Current(_) => None,
        _ => Some(policy.status.as_ref().and_then(|s| s.serving_generation)),
    };
    let key = CompileKey {
        uid: policy.metadata.uid.clone(),
        generation: policy.metadata.generation,
        kept,
    };
    if let Some(error) = in_force.error() {
        tracing::warn!(policy = %name, generation = policy.metadata.generation, error = %error, "policy does not compile; serving the last generation that did, if any");
    }
    let entry = match in_force.into_compiled() {
        Some(c) if !c.spec().values_from.is_empty() => with_data(c, serving, values),
        Some(c) => Some(Arc::new(c)),
        // The status may not record the last good generation yet (the leader writes it after
        // this replica compiled it): keep serving what this replica already had of this policy.
        None => serving.filter(|s| {
            policy
                .metadata
                .generation
                .is_some_and(|g| s.generation() < g)
        }),
    };
    (key, entry)
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
