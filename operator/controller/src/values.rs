//! The data of `spec.valuesFrom` every replica keeps: a watch per allowed namespace on
//! ConfigMaps and one on Secrets (`runtime::feeds` runs them), read by the webhook's policy feed
//! and, on the leader, by the reconcile (the `SourceMissing` condition) and coverage.
//!
//! Nothing is fetched per request: the webhook serves policies compiled with this data, and a
//! change recompiles the policies that read it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{PoisonError, RwLock};

use splice_crds::InjectionPolicySpec;
use splice_engine::values_from;
use splice_engine::{DataSources, ResolvedValues, ValuesFromError};
use tokio::sync::watch;

/// The ConfigMaps and Secrets of the allowed namespaces, as last seen by the watches.
#[derive(Debug)]
pub struct ValuesCache {
    data: RwLock<DataSources>,
    /// Namespaces values may be read from (`splice run --values-namespaces`).
    allowed: Vec<String>,
    /// Where an entry without a namespace reads: Splice's own.
    default_namespace: String,
    /// Bumped on every change of the data.
    version: watch::Sender<u64>,
    /// Every watch has listed once.
    synced: AtomicBool,
}

impl ValuesCache {
    pub fn new(allowed: Vec<String>, default_namespace: String) -> Self {
        ValuesCache {
            data: RwLock::new(DataSources::default()),
            allowed,
            default_namespace,
            version: watch::channel(0).0,
            synced: AtomicBool::new(false),
        }
    }

    /// True once every watch listed its objects: before, a source may only seem missing.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Called once every watch has listed; subscribers hear of it.
    pub fn set_synced(&self) {
        self.synced.store(true, Ordering::Release);
        self.version.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub fn allowed(&self) -> &[String] {
        &self.allowed
    }

    /// Notified after each change of the data.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Resolves a policy's `valuesFrom` against the data, as the webhook and the CLI do.
    pub fn resolve(&self, spec: &InjectionPolicySpec) -> Result<ResolvedValues, ValuesFromError> {
        let data = self.data.read().unwrap_or_else(PoisonError::into_inner);
        values_from::resolve(spec, &self.default_namespace, Some(&self.allowed), &data)
    }

    /// Changes the data with `f`; subscribers hear of it when `f` says it changed something.
    pub fn update(&self, f: impl FnOnce(&mut DataSources) -> bool) {
        let changed = {
            let mut data = self.data.write().unwrap_or_else(PoisonError::into_inner);
            f(&mut data)
        };
        if changed {
            self.version.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use splice_engine::{SourceKind, SourceRef};

    use super::*;

    #[test]
    fn a_change_notifies_subscribers_and_an_identical_write_does_not() {
        let cache = ValuesCache::new(vec!["splice-system".into()], "splice-system".into());
        let rx = cache.subscribe();
        let object = SourceRef {
            kind: SourceKind::ConfigMap,
            namespace: "splice-system".into(),
            name: "mesh".into(),
        };
        let data = || [("image".to_owned(), "p:1".to_owned())].into();
        cache.update(|d| d.insert(object.clone(), data()));
        assert!(rx.has_changed().unwrap());
        let mut rx = cache.subscribe();
        rx.mark_unchanged();
        cache.update(|d| d.insert(object.clone(), data()));
        assert!(!rx.has_changed().unwrap());
    }
}
