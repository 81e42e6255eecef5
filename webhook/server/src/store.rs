//! In-memory stores the request path reads: compiled policies and namespace contexts.
//!
//! Readers never lock: each store is an [`ArcSwap`] of an immutable map, so a request sees one
//! consistent snapshot while writers (the operator's reflectors, or the static loader) publish a
//! new map. Writes copy the map, which is fine at the rate policies and namespaces change.
//! A request that finds no entry yet can wait, bounded, for the watch that feeds the store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use splice_engine::{CompiledPolicy, NamespaceContext};

/// A name → `Arc<T>` map with lock-free reads and copy-on-write updates.
#[derive(Debug)]
pub struct SnapshotMap<T> {
    entries: ArcSwap<HashMap<String, Arc<T>>>,
    /// Bumped after every write, for [`SnapshotMap::wait_for`].
    written: watch::Sender<u64>,
}

impl<T> Default for SnapshotMap<T> {
    fn default() -> Self {
        SnapshotMap {
            entries: ArcSwap::from_pointee(HashMap::new()),
            written: watch::channel(0).0,
        }
    }
}

impl<T> SnapshotMap<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// The entry named `name` in the current snapshot.
    pub fn get(&self, name: &str) -> Option<Arc<T>> {
        self.entries.load().get(name).cloned()
    }

    /// The entry named `name`, waiting up to `within` for a writer to add it.
    pub async fn wait_for(&self, name: &str, within: Duration) -> Option<Arc<T>> {
        // Nearly every request finds its entry: no subscription and no timer for those.
        if let Some(found) = self.get(name) {
            return Some(found);
        }
        // Subscribed before the next look, so a write between the look and the wait still wakes.
        let mut written = self.written.subscribe();
        let deadline = tokio::time::sleep(within);
        tokio::pin!(deadline);
        loop {
            if let Some(found) = self.get(name) {
                return Some(found);
            }
            tokio::select! {
                changed = written.changed() => if changed.is_err() { return None },
                () = &mut deadline => return self.get(name),
            }
        }
    }

    fn wrote(&self) {
        self.written.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Adds or replaces the entry `name`; returns the one it replaced.
    pub fn insert(&self, name: impl Into<String>, value: Arc<T>) -> Option<Arc<T>> {
        let name = name.into();
        let mut previous = None;
        self.entries.rcu(|current| {
            let mut next = HashMap::clone(current);
            previous = next.insert(name.clone(), Arc::clone(&value));
            next
        });
        self.wrote();
        previous
    }

    /// Removes the entry `name`; returns it if it was there.
    pub fn remove(&self, name: &str) -> Option<Arc<T>> {
        let mut previous = None;
        self.entries.rcu(|current| {
            let mut next = HashMap::clone(current);
            previous = next.remove(name);
            next
        });
        self.wrote();
        previous
    }

    /// Replaces every entry at once (a reflector's re-list); readers see either the old set or
    /// the new one, never a mix.
    pub fn replace_all(&self, entries: impl IntoIterator<Item = (String, Arc<T>)>) {
        self.entries.store(Arc::new(entries.into_iter().collect()));
        self.wrote();
    }

    /// Names in the current snapshot, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.entries.load().keys().cloned().collect();
        names.sort();
        names
    }

    pub fn len(&self) -> usize {
        self.entries.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.load().is_empty()
    }
}

/// Compiled policies by policy name: what `/inject/<policy>` looks up.
pub type PolicyStore = SnapshotMap<CompiledPolicy>;

/// Namespace labels and annotations by namespace name, fed by a reflector on Namespaces. Empty in
/// static mode, where [`namespace_context`] falls back to the name alone.
pub type NamespaceStore = SnapshotMap<NamespaceContext>;

/// The context a pod admitted into `namespace` is injected with: the stored one, or, when the
/// namespace is unknown (static mode, or a namespace created a moment ago), just its name and the
/// label the API server sets on every namespace, so name-based selectors still work.
pub fn namespace_context(store: &NamespaceStore, namespace: &str) -> Arc<NamespaceContext> {
    if let Some(known) = store.get(namespace) {
        return known;
    }
    let mut labels = std::collections::BTreeMap::new();
    labels.insert(
        splice_crds::NAMESPACE_NAME_LABEL.to_owned(),
        namespace.to_owned(),
    );
    Arc::new(NamespaceContext {
        name: namespace.to_owned(),
        labels,
        annotations: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inserted_entry_is_visible_and_a_removed_one_is_gone() {
        let store: SnapshotMap<u32> = SnapshotMap::new();
        assert!(store.insert("a", Arc::new(1)).is_none());
        assert_eq!(store.insert("a", Arc::new(2)).as_deref(), Some(&1));
        assert_eq!(store.get("a").as_deref(), Some(&2));
        assert_eq!(store.remove("a").as_deref(), Some(&2));
        assert!(store.get("a").is_none());
        assert!(store.remove("a").is_none());
    }

    #[test]
    fn replace_all_drops_entries_not_in_the_new_set() {
        let store: SnapshotMap<u32> = SnapshotMap::new();
        store.insert("old", Arc::new(1));
        store.replace_all([("new".to_owned(), Arc::new(2))]);
        assert_eq!(store.names(), vec!["new".to_owned()]);
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn a_reader_keeps_its_snapshot_while_a_writer_replaces_the_entry() {
        let store: SnapshotMap<String> = SnapshotMap::new();
        store.insert("p", Arc::new("v1".to_owned()));
        let held = store.get("p");
        store.insert("p", Arc::new("v2".to_owned()));
        assert_eq!(held.as_deref().map(String::as_str), Some("v1"));
        assert_eq!(store.get("p").as_deref().map(String::as_str), Some("v2"));
    }

    #[test]
    fn concurrent_inserts_all_survive() {
        let store: Arc<SnapshotMap<usize>> = Arc::new(SnapshotMap::new());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    for i in 0..100 {
                        store.insert(format!("{t}-{i}"), Arc::new(i));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(store.len(), 400);
    }

    #[tokio::test]
    async fn a_waiting_reader_gets_the_entry_a_writer_adds_within_the_bound() {
        let store: Arc<SnapshotMap<u32>> = Arc::new(SnapshotMap::new());
        let writer = Arc::clone(&store);
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            writer.insert("other", Arc::new(1));
            writer.insert("p", Arc::new(7));
        });
        let found = store.wait_for("p", Duration::from_secs(10)).await;
        assert_eq!(found.as_deref(), Some(&7));
        late.await.unwrap();
    }

    #[tokio::test]
    async fn a_waiting_reader_gives_up_at_the_bound_when_nothing_arrives() {
        let store: SnapshotMap<u32> = SnapshotMap::new();
        store.insert("other", Arc::new(1));
        assert!(
            store
                .wait_for("p", Duration::from_millis(30))
                .await
                .is_none()
        );
    }

    #[test]
    fn an_unknown_namespace_gets_its_name_label() {
        let store = NamespaceStore::new();
        let ctx = namespace_context(&store, "team-a");
        assert_eq!(ctx.name, "team-a");
        assert_eq!(
            ctx.labels
                .get("kubernetes.io/metadata.name")
                .map(String::as_str),
            Some("team-a")
        );
    }

    #[test]
    fn a_known_namespace_uses_the_stored_context() {
        let store = NamespaceStore::new();
        let mut ctx = NamespaceContext {
            name: "team-a".to_owned(),
            ..Default::default()
        };
        ctx.labels.insert("mesh".to_owned(), "enabled".to_owned());
        store.insert("team-a", Arc::new(ctx.clone()));
        assert_eq!(*namespace_context(&store, "team-a"), ctx);
    }
}
