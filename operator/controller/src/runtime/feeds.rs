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
use splice_engine::{CompiledPolicy, NamespaceContext};
use splice_server::admin::Readiness;
use splice_server::store::{NamespaceStore, PolicyStore};
use tokio::sync::watch;

use crate::policy::serving;

/// Keeps the webhook's policy store equal to the managed policies, serving for each the
/// generation in force ([`serving::in_force`]): an update that does not compile leaves the last
/// good one in place. Compiles once per change of what decides that. Signals `changed` when the
/// set of (policy, generation) changes and `synced` once the first full list is in.
pub(super) async fn feed_policy_store(
    api: Api<InjectionPolicy>,
    config: watcher::Config,
    store: Arc<PolicyStore>,
    changed: watch::Sender<u64>,
    synced: watch::Sender<bool>,
) {
    let mut compiled: HashMap<String, CompileKey> = HashMap::new();
    let mut listing: Vec<InjectionPolicy> = Vec::new();
    let bump = |changed: &watch::Sender<u64>| changed.send_modify(|n| *n = n.wrapping_add(1));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(p)) => listing.push(p),
            Ok(watcher::Event::InitDone) => {
                let mut entries = Vec::new();
                let mut keys = HashMap::new();
                for p in listing.drain(..) {
                    let name = p.name_any();
                    let (key, entry) = match compiled.get(&name) {
                        Some(key) if key.still(&p) => (key.clone(), store.get(&name)),
                        _ => serve(&p, store.get(&name)),
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
                if compiled.get(&name).is_some_and(|key| key.still(&p)) {
                    continue;
                }
                let (key, entry) = serve(&p, store.get(&name));
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

/// The entry to serve for `policy`, given the one this replica serves now.
fn serve(
    policy: &InjectionPolicy,
    serving: Option<Arc<CompiledPolicy>>,
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
    let _ = policies.wait_for(|s| *s).await;
    let _ = namespaces.wait_for(|s| *s).await;
    readiness.set_caches_synced(true);
    tracing::info!("policy and namespace caches synced");
}
