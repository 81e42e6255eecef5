//! Renderings kept across requests.
//!
//! A policy whose templates do not read `pod` renders the same content for every pod of a
//! namespace (rendering is deterministic: no clock, no randomness), so it is rendered once per
//! namespace and reused, already serialized. The cache lives in the [`super::CompiledPolicy`], so a
//! new policy generation starts empty. Failed renderings are not cached: the error is recomputed
//! for every request, exactly as without the cache.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use bytes::Bytes;
use splice_crds::Operation;

use super::facts::PodFacts;
use super::template::OwnedRendered;
use super::{CompiledPolicy, Decision, Exclusions, Injection, NamespaceContext, Selection};

// A poisoned lock only means another request panicked mid-insert; the map is still a valid map,
// so both caches keep using it.
fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

/// Namespaces kept per policy; past this the cache starts over (bounds memory with many
/// namespaces, at the cost of one rendering per namespace afterwards).
const MAX_ENTRIES: usize = 256;

struct Entry {
    /// The namespace the rendering was made for, when templates read more than its name.
    context: Option<NamespaceContext>,
    rendered: Arc<OwnedRendered>,
}

/// How much of the namespace a rendering depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Only `policy` and `values`: one rendering for every namespace.
    Policy,
    /// `namespace.name` as well.
    NamespaceName,
    /// Labels or annotations of the namespace too: reused only for an identical context.
    NamespaceContext,
}

#[derive(Default)]
pub(crate) struct RenderCache {
    /// One map for full renderings, one for the metadata-only renderings of UPDATEs.
    maps: [RwLock<HashMap<String, Entry>>; 2],
}

impl std::fmt::Debug for RenderCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = |m: &RwLock<HashMap<String, Entry>>| m.read().map(|m| m.len()).unwrap_or(0);
        f.debug_struct("RenderCache")
            .field("full", &len(&self.maps[0]))
            .field("meta_only", &len(&self.maps[1]))
            .finish()
    }
}

impl RenderCache {
    /// The cached rendering for `ns`, or the one `render` makes (then cached).
    pub fn get_or_render<E>(
        &self,
        scope: Scope,
        meta_only: bool,
        ns: &NamespaceContext,
        render: impl FnOnce() -> Result<OwnedRendered, E>,
    ) -> Result<Arc<OwnedRendered>, E> {
        let map = &self.maps[usize::from(meta_only)];
        let key = match scope {
            Scope::Policy => "",
            Scope::NamespaceName | Scope::NamespaceContext => ns.name.as_str(),
        };
        let fits = |e: &Entry| scope != Scope::NamespaceContext || e.context.as_ref() == Some(ns);
        {
            let read = read(map);
            if let Some(e) = read.get(key).filter(|e| fits(e)) {
                return Ok(Arc::clone(&e.rendered));
            }
        }
        let rendered = Arc::new(render()?);
        let mut write = write(map);
        if write.len() >= MAX_ENTRIES && !write.contains_key(key) {
            write.clear();
        }
        write.insert(
            key.to_owned(),
            Entry {
                context: (scope == Scope::NamespaceContext).then(|| ns.clone()),
                rendered: Arc::clone(&rendered),
            },
        );
        Ok(rendered)
    }

    /// Entries held (both maps), for tests.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.maps
            .iter()
            .map(|m| m.read().map(|m| m.len()).unwrap_or(0))
            .sum()
    }
}

/// Bytes of patches kept per policy (their JSON, warnings and pod facts); past this the cache
/// starts over: about 100 pod shapes of a sidecar injection (a namespace's worth of Deployments),
/// half a megabyte per policy at most. Each entry also keeps its rendering alive (a few KB, shared
/// by every shape of a namespace) until the entry goes.
const MAX_PLAN_BYTES: usize = 512 << 10;

/// Patches kept across requests: the engine's answer for one rendering and one pod's
/// [`PodFacts`], so that the replicas of a template after the first are answered with a copy. The
/// planner reads nothing else of such a pod, so a kept patch is the one it would plan. Like
/// renderings, failed plans are not kept, and the cache lives in the compiled policy.
#[derive(Default)]
pub(crate) struct PlanCache {
    /// Seeded per cache: which pods collide cannot be chosen from outside.
    hasher: foldhash::fast::RandomState,
    map: RwLock<Plans>,
}

#[derive(Default)]
struct Plans {
    /// By the hash of (rendering, facts); entries of one hash are told apart by comparing both.
    by_hash: HashMap<u64, Vec<Plan>>,
    bytes: usize,
}

impl Plans {
    fn clear(&mut self) {
        self.by_hash.clear();
        self.bytes = 0;
    }
}

struct Plan {
    /// The rendering the patch was made from: held, so that its address cannot be reused by
    /// another rendering while the entry lives.
    rendering: Arc<OwnedRendered>,
    facts: PodFacts<'static>,
    /// The pod's token volume, when its name was masked in `facts`.
    token: Option<Box<str>>,
    injection: Injection,
}

impl std::fmt::Debug for PlanCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let map = read(&self.map);
        f.debug_struct("PlanCache")
            .field("plans", &map.by_hash.values().map(Vec::len).sum::<usize>())
            .field("bytes", &map.bytes)
            .finish()
    }
}

impl PlanCache {
    fn hash(&self, rendering: &Arc<OwnedRendered>, facts: &PodFacts<'_>) -> u64 {
        self.hasher.hash_one((Arc::as_ptr(rendering).addr(), facts))
    }

    /// A copy of the injection kept for `facts` planned with `rendering`. `token` is the pod's
    /// token volume when `facts` has its name masked: every pod the API server admits has one of
    /// its own (`kube-api-access-<random>`), which the planner only mounts, so a plan kept for
    /// another pod is this pod's with the name put back.
    pub fn get(
        &self,
        rendering: &Arc<OwnedRendered>,
        facts: &PodFacts<'_>,
        token: Option<&str>,
    ) -> Option<Injection> {
        let hash = self.hash(rendering, facts);
        let map = read(&self.map);
        map.by_hash
            .get(&hash)?
            .iter()
            .find(|p| Arc::ptr_eq(&p.rendering, rendering) && p.facts == *facts)
            .map(|p| for_token(&p.injection, p.token.as_deref(), token, renamed))
    }

    pub fn insert(
        &self,
        rendering: &Arc<OwnedRendered>,
        facts: PodFacts<'_>,
        token: Option<&str>,
        injection: &Injection,
    ) {
        let hash = self.hash(rendering, &facts);
        let size = facts.bytes()
            + injection.patch.len()
            + injection.warnings.iter().map(String::len).sum::<usize>();
        let mut map = write(&self.map);
        if map.bytes + size > MAX_PLAN_BYTES {
            map.clear();
            if size > MAX_PLAN_BYTES {
                return;
            }
        }
        let plans = map.by_hash.entry(hash).or_default();
        if plans
            .iter()
            .any(|p| Arc::ptr_eq(&p.rendering, rendering) && p.facts == facts)
        {
            return;
        }
        plans.push(Plan {
            rendering: Arc::clone(rendering),
            facts: facts.into_owned(),
            token: token.map(Into::into),
            injection: injection.clone(),
        });
        map.bytes += size;
    }

    /// Patches held, for tests.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        read(&self.map).by_hash.values().map(Vec::len).sum()
    }
}

/// Bytes of pods kept by a [`ChainCache`] (their text, patches and warnings), and answers kept;
/// past either it starts over. A burst of one Deployment's pods needs one entry.
const MAX_CHAIN_BYTES: usize = 2 << 20;
const MAX_CHAINS: usize = 256;

/// Whole answers of shared entries, kept by the exact request: the policies (by address, held
/// weakly: the address cannot be reused while the entry lives, and a replaced policy's caches are
/// freed all the same), the operation, the namespace context, the configuration, and the pod's
/// text. Two pods of one ReplicaSet reach admission alike (`generateName`, no uid) but for two
/// things, which the comparison leaves out unless a policy reads the pod:
/// `metadata.managedFields`, whose timestamp moves every second and which the engine never
/// reads; and the name of the token volume the ServiceAccount plugin adds
/// (`kube-api-access-<random>`), which the engine reads only to mount it into the containers it
/// injects. So pods that differ only in that name share an answer, with the name replaced in
/// it (unless a policy's spec or data itself holds `kube-api-access-`). The engine is
/// deterministic and treats the name as opaque, so the answer is the one it would plan.
#[derive(Default)]
pub struct ChainCache {
    hasher: foldhash::fast::RandomState,
    map: RwLock<Chains>,
}

#[derive(Default)]
struct Chains {
    by_hash: HashMap<u64, Vec<KeptChain>>,
    bytes: usize,
    count: usize,
}

pub(crate) struct ChainKey<'r> {
    pub policies: &'r [&'r Arc<CompiledPolicy>],
    pub operation: Operation,
    pub selection: Selection,
    pub namespace: &'r NamespaceContext,
    pub exclusions: &'r Exclusions,
    pub trust_domain: &'r str,
    /// The pod's text, without what is left out of the comparison.
    pub object: &'r str,
    /// The pod's token volume when its name is left out of `object`.
    pub token: Option<&'r str>,
}

struct KeptChain {
    policies: Vec<Weak<CompiledPolicy>>,
    operation: Operation,
    selection: Selection,
    namespace: NamespaceContext,
    exclusions: Exclusions,
    trust_domain: String,
    object: Box<str>,
    token: Option<Box<str>>,
    answer: KeptAnswer,
}

/// A chain's answer when every policy decided without error (errors are recomputed): each
/// policy's decision, and the whole call's patch and warnings.
#[derive(Clone)]
pub(crate) struct KeptAnswer {
    pub decisions: Vec<Decision>,
    pub whole: Injection,
}

/// `injection` for a pod whose token volume is `now` where the planned one's was `was`.
fn renamed(injection: &Injection, was: &str, now: &str) -> Injection {
    Injection {
        patch: match std::str::from_utf8(&injection.patch) {
            Ok(text) => Bytes::from(text.replace(was, now)),
            Err(_) => injection.patch.clone(),
        },
        changed: injection.changed,
        warnings: injection
            .warnings
            .iter()
            .map(|w| w.replace(was, now))
            .collect(),
    }
}

/// What was kept for a pod whose token volume was `was`, for one whose token volume is `now`
/// (both masked in the key, or neither).
fn for_token<T: Clone>(
    kept: &T,
    was: Option<&str>,
    now: Option<&str>,
    rename: impl Fn(&T, &str, &str) -> T,
) -> T {
    match (was, now) {
        (Some(was), Some(now)) if was != now => rename(kept, was, now),
        _ => kept.clone(),
    }
}

impl KeptAnswer {
    /// The answer for a pod whose token volume is `now` where this one's was `was`.
    fn renamed(&self, was: &str, now: &str) -> KeptAnswer {
        KeptAnswer {
            decisions: self
                .decisions
                .iter()
                .map(|d| match d {
                    Decision::Inject(i) => Decision::Inject(renamed(i, was, now)),
                    other => other.clone(),
                })
                .collect(),
            whole: renamed(&self.whole, was, now),
        }
    }
}

impl KeptChain {
    fn is(&self, key: &ChainKey<'_>) -> bool {
        self.policies.len() == key.policies.len()
            && self
                .policies
                .iter()
                .zip(key.policies)
                .all(|(a, b)| std::ptr::eq(a.as_ptr(), Arc::as_ptr(b)))
            && self.operation == key.operation
            && self.selection == key.selection
            && *self.object == *key.object
            && self.token.is_some() == key.token.is_some()
            && self.namespace == *key.namespace
            && self.exclusions == *key.exclusions
            && *self.trust_domain == *key.trust_domain
    }
}

impl std::fmt::Debug for ChainCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let map = read(&self.map);
        f.debug_struct("ChainCache")
            .field("chains", &map.by_hash.values().map(Vec::len).sum::<usize>())
            .field("bytes", &map.bytes)
            .finish()
    }
}

impl ChainCache {
    fn hash(&self, key: &ChainKey<'_>) -> u64 {
        let addrs: Vec<usize> = key.policies.iter().map(|p| Arc::as_ptr(p).addr()).collect();
        self.hasher
            .hash_one((addrs, &key.namespace.name, key.object))
    }

    pub(crate) fn get(&self, key: &ChainKey<'_>) -> Option<KeptAnswer> {
        let hash = self.hash(key);
        let map = read(&self.map);
        map.by_hash.get(&hash)?.iter().find(|k| k.is(key)).map(|k| {
            for_token(
                &k.answer,
                k.token.as_deref(),
                key.token,
                KeptAnswer::renamed,
            )
        })
    }

    pub(crate) fn insert(&self, key: &ChainKey<'_>, answer: KeptAnswer) {
        let hash = self.hash(key);
        let size = key.object.len()
            + answer.whole.patch.len()
            + answer.whole.warnings.iter().map(String::len).sum::<usize>();
        let mut map = write(&self.map);
        if map.bytes + size > MAX_CHAIN_BYTES || map.count >= MAX_CHAINS {
            map.by_hash.clear();
            map.count = 0;
            map.bytes = 0;
            if size > MAX_CHAIN_BYTES {
                return;
            }
        }
        let chains = map.by_hash.entry(hash).or_default();
        if chains.iter().any(|k| k.is(key)) {
            return;
        }
        chains.push(KeptChain {
            policies: key.policies.iter().map(|p| Arc::downgrade(p)).collect(),
            operation: key.operation,
            selection: key.selection,
            namespace: key.namespace.clone(),
            exclusions: key.exclusions.clone(),
            trust_domain: key.trust_domain.to_owned(),
            object: key.object.into(),
            token: key.token.map(Into::into),
            answer,
        });
        map.bytes += size;
        map.count += 1;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use splice_crds::Operation;

    use crate::template::Rendered;

    fn empty() -> Result<OwnedRendered, serde_json::Error> {
        Rendered::default().to_owned_rendering()
    }

    #[test]
    fn a_policy_scoped_rendering_is_made_once_for_every_namespace() {
        let cache = RenderCache::default();
        let mut renders = 0;
        for name in ["a", "b", "c"] {
            cache
                .get_or_render(
                    Scope::Policy,
                    false,
                    &NamespaceContext {
                        name: name.into(),
                        ..Default::default()
                    },
                    || {
                        renders += 1;
                        empty()
                    },
                )
                .unwrap();
        }
        assert_eq!(renders, 1);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn the_cache_starts_over_instead_of_growing_past_its_bound() {
        let cache = RenderCache::default();
        for i in 0..(MAX_ENTRIES * 2 + 3) {
            let ns = NamespaceContext {
                name: format!("ns-{i}"),
                ..Default::default()
            };
            cache
                .get_or_render(Scope::NamespaceName, false, &ns, empty)
                .unwrap();
            assert!(cache.len() <= MAX_ENTRIES);
        }
        assert_eq!(cache.len(), 3);
    }

    fn injection(patch_len: usize) -> Injection {
        Injection {
            patch: vec![b' '; patch_len].into(),
            changed: true,
            warnings: vec!["splice policy p injected: containers x".to_owned()],
        }
    }

    /// The facts of a pod whose one container holds the env vars `env`.
    fn facts(env: &[&'static str]) -> PodFacts<'static> {
        let text = serde_json::json!({
            "spec": {"containers": [{
                "name": "app",
                "env": env.iter().map(|n| serde_json::json!({"name": n})).collect::<Vec<_>>(),
            }]}
        })
        .to_string();
        let view: crate::view::PodView<'_> = crate::view::from_str(&text).unwrap();
        PodFacts::read(Operation::Create, &view, [].into_iter(), [].into_iter()).into_owned()
    }

    #[test]
    fn a_kept_patch_is_found_by_its_rendering_and_facts_only() {
        let cache = PlanCache::default();
        let (r1, r2) = (Arc::new(Rendered::default()), Arc::new(Rendered::default()));
        cache.insert(&r1, facts(&["A"]), None, &injection(10));
        assert_eq!(
            cache.get(&r1, &facts(&["A"]), None).map(|i| i.patch.len()),
            Some(10)
        );
        assert!(cache.get(&r1, &facts(&["B"]), None).is_none());
        assert!(cache.get(&r1, &facts(&["A", "B"]), None).is_none());
        assert!(cache.get(&r2, &facts(&["A"]), None).is_none());
    }

    #[test]
    fn the_plan_cache_starts_over_past_its_byte_bound_and_never_keeps_an_oversized_patch() {
        let cache = PlanCache::default();
        let r = Arc::new(Rendered::default());
        let big = MAX_PLAN_BYTES / 8;
        let names: Vec<&'static str> = (0..20)
            .map(|i| &*Box::leak(format!("V{i}").into_boxed_str()))
            .collect();
        for name in &names {
            cache.insert(&r, facts(&[name]), None, &injection(big));
            let held = cache.map.read().unwrap().bytes;
            assert!(held <= MAX_PLAN_BYTES, "{held} bytes held");
        }
        assert!(cache.len() < 20);
        cache.insert(&r, facts(&["BIG"]), None, &injection(MAX_PLAN_BYTES));
        assert!(cache.get(&r, &facts(&["BIG"]), None).is_none());
    }

    #[test]
    fn the_facts_of_a_kept_patch_count_towards_the_byte_bound() {
        let cache = PlanCache::default();
        let r = Arc::new(Rendered::default());
        let many: Vec<&'static str> = (0..2000)
            .map(|i| &*Box::leak(format!("A_LONG_ENV_VAR_NAME_{i}").into_boxed_str()))
            .collect();
        let f = facts(&many);
        let at_least = many.iter().map(|n| n.len()).sum::<usize>();
        cache.insert(&r, f, None, &injection(1));
        assert!(cache.map.read().unwrap().bytes > at_least);
    }

    #[test]
    fn a_failed_rendering_is_not_kept() {
        let cache = RenderCache::default();
        let ns = NamespaceContext::default();
        let failed: Result<_, &str> =
            cache.get_or_render(Scope::NamespaceName, false, &ns, || Err("boom"));
        assert!(failed.is_err());
        assert_eq!(cache.len(), 0);
    }
}
