//! Renderings kept across requests.
//!
//! A policy whose templates do not read `pod` renders the same content for every pod of a
//! namespace (rendering is deterministic: no clock, no randomness), so it is rendered once per
//! namespace and reused, already serialized. The cache lives in the [`super::CompiledPolicy`], so a
//! new policy generation starts empty. Failed renderings are not cached: the error is recomputed
//! for every request, exactly as without the cache.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::NamespaceContext;
use super::template::OwnedRendered;

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
        // A poisoned lock only means another request panicked mid-insert; the map is still a
        // valid map, so keep using it.
        {
            let read = map.read().unwrap_or_else(|p| p.into_inner());
            if let Some(e) = read.get(key).filter(|e| fits(e)) {
                return Ok(Arc::clone(&e.rendered));
            }
        }
        let rendered = Arc::new(render()?);
        let mut write = map.write().unwrap_or_else(|p| p.into_inner());
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::template::Rendered;
    use super::*;

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
