//! Which policies to look at again when one policy's spec changes or it goes away.
//!
//! Conflicts are pairwise, so a spec change of P can change the Conflicted condition of another
//! policy Q; but only of a Q that P conflicted with before (Q's status may name P) or conflicts
//! with now. Likewise a shared webhook entry: P joining or leaving it changes the entry of every
//! other policy in it, before and after. Those are P's *partners*. Re-reconciling just those,
//! instead of every policy, keeps a template change O(1) reconciles when policies do not clash,
//! and 1,000 policies applied at once O(n) instead of O(n²).
//!
//! The leader records, per policy, what its last reconcile read: the version of each partner and
//! the entry its plan gave it. A new generation of P (or its first look) queues a partner Q only
//! if Q's last reconcile did not decide from this very version of P, or P's plan now gives Q
//! another entry. Without that test, 1,000 policies applied at once bounced reconciles between
//! entry partners that had each already read the other (see docs/performance.md). A deletion
//! queues every recorded partner.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, PoisonError};

use futures::channel::mpsc;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use splice_crds::InjectionPolicy;
use splice_engine::entry::{Group, Plan};

/// One version of a policy's spec: a recreated policy has another uid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    pub uid: Option<String>,
    pub generation: Option<i64>,
}

impl Stamp {
    pub fn of(policy: &InjectionPolicy) -> Stamp {
        Stamp {
            uid: policy.metadata.uid.clone(),
            generation: policy.metadata.generation,
        }
    }
}

/// What the last reconcile of one policy read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    pub stamp: Stamp,
    /// Its partners (the policies it conflicted with or shared a webhook entry with), each at
    /// the version this reconcile read.
    pub others: BTreeMap<String, Stamp>,
    /// What its entry was made of ([`fingerprint`]); `None` when no webhook entry served it.
    pub entry: Option<u64>,
}

/// What makes one entry differ from another: its names and its members' served specs and
/// failure policies. Versions would not do: a policy's first status write changes its version
/// but not what it serves.
pub fn fingerprint(group: Option<&Group>) -> Option<u64> {
    let group = group?;
    let mut h = DefaultHasher::new();
    group.configuration.hash(&mut h);
    group.webhook.hash(&mut h);
    for m in &group.members {
        m.name.hash(&mut h);
        m.uid.hash(&mut h);
        m.failure_policy.as_str().hash(&mut h);
        // A spec that does not serialize hashes as empty; it cannot be served either.
        serde_json::to_vec(&m.spec).unwrap_or_default().hash(&mut h);
    }
    Some(h.finish())
}

/// Pure: the policies (other than `changed`) whose conflicts or entry can differ after `changed`
/// changed: those it named as last recorded, those whose record names it, and those it names now
/// (`None`: it was deleted).
pub fn affected<'a>(
    recorded: &HashMap<String, Seen>,
    changed: &str,
    now: Option<impl IntoIterator<Item = &'a String>>,
) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = BTreeSet::new();
    if let Some(seen) = recorded.get(changed) {
        out.extend(seen.others.keys().cloned());
    }
    out.extend(
        recorded
            .iter()
            .filter(|(name, seen)| name.as_str() != changed && seen.others.contains_key(changed))
            .map(|(name, _)| name.clone()),
    );
    if let Some(now) = now {
        out.extend(now.into_iter().cloned());
    }
    out.remove(changed);
    out
}

/// Pure: whether `partner`'s last reconcile (`seen`, `None` if it has none) is out of date after
/// `changed` was decided at `stamp` with `plan`: it read another version of `changed`, or the
/// plan gives it another entry than the one it wrote.
pub fn stale(
    seen: Option<&Seen>,
    partner: &str,
    changed: &str,
    stamp: &Stamp,
    plan: &Plan,
) -> bool {
    let Some(seen) = seen else {
        return true;
    };
    seen.others.get(changed) != Some(stamp) || seen.entry != fingerprint(plan.group_of(partner))
}

/// The leader's record of what each policy's reconcile read, and the queue of policies to
/// reconcile again.
pub struct Neighbours {
    recorded: Mutex<HashMap<String, Seen>>,
    requeue: mpsc::UnboundedSender<ObjectRef<InjectionPolicy>>,
}

impl Neighbours {
    /// The record and the receiving end of its queue (to feed `Controller::reconcile_on`).
    pub fn new() -> (Self, mpsc::UnboundedReceiver<ObjectRef<InjectionPolicy>>) {
        let (tx, rx) = mpsc::unbounded();
        (
            Neighbours {
                recorded: Mutex::default(),
                requeue: tx,
            },
            rx,
        )
    }

    /// Records what a reconcile of `policy` read: its `partners` at the versions it saw and the
    /// `plan` it decided. When its spec is new to this record (a new generation, a new policy, or
    /// the first look of a new leader), queues the policies whose reconcile is now stale
    /// ([`stale`]). The same generation queues nothing, so partners reconciled in turn do not
    /// bounce reconciles back.
    pub fn observed(
        &self,
        policy: &InjectionPolicy,
        partners: BTreeMap<String, Stamp>,
        plan: &Plan,
    ) {
        let name = policy.name_any();
        let now = Seen {
            stamp: Stamp::of(policy),
            entry: fingerprint(plan.group_of(&name)),
            others: partners,
        };
        let mut recorded = self.recorded.lock().unwrap_or_else(PoisonError::into_inner);
        let same_spec = recorded.get(&name).is_some_and(|s| s.stamp == now.stamp);
        let queue: BTreeSet<String> = if same_spec {
            BTreeSet::new()
        } else {
            affected(&recorded, &name, Some(now.others.keys()))
                .into_iter()
                .filter(|p| stale(recorded.get(p), p, &name, &now.stamp, plan))
                .collect()
        };
        recorded.insert(name, now);
        drop(recorded);
        self.send(queue);
    }

    /// A policy left the cache (deleted, or no longer selected): queues the policies whose
    /// conflicts or entry named it or that it named.
    pub fn forget(&self, name: &str) {
        let mut recorded = self.recorded.lock().unwrap_or_else(PoisonError::into_inner);
        let queue = affected(&recorded, name, None::<Vec<&String>>);
        recorded.remove(name);
        drop(recorded);
        self.send(queue);
    }

    /// After a relist: forgets (and queues the partners of) every recorded policy `present` no
    /// longer knows.
    pub fn forget_all_but(&self, present: impl Fn(&str) -> bool) {
        let gone: Vec<String> = self
            .recorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .filter(|name| !present(name))
            .cloned()
            .collect();
        for name in gone {
            self.forget(&name);
        }
    }

    fn send(&self, names: BTreeSet<String>) {
        for name in names {
            tracing::debug!(policy = %name, "a partner changed; reconciling again");
            // The receiver is gone only when the controller stopped with leadership; then nothing
            // needs reconciling here.
            let _ = self.requeue.unbounded_send(ObjectRef::new(&name));
        }
    }
}

#[cfg(test)]
mod tests {
    use splice_crds::FailurePolicy;
    use splice_engine::entry::Member;

    use super::*;

    fn stamp(generation: i64) -> Stamp {
        Stamp {
            uid: Some("u".into()),
            generation: Some(generation),
        }
    }

    fn seen(generation: i64, others: &[&str]) -> Seen {
        Seen {
            stamp: stamp(generation),
            others: others.iter().map(|s| ((*s).to_owned(), stamp(1))).collect(),
            entry: None,
        }
    }

    fn names(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn record(entries: &[(&str, Seen)]) -> HashMap<String, Seen> {
        entries
            .iter()
            .map(|(n, s)| ((*n).to_owned(), s.clone()))
            .collect()
    }

    fn now(v: &[&str]) -> Option<BTreeSet<String>> {
        Some(names(v))
    }

    #[test]
    fn a_policy_that_no_longer_conflicts_requeues_its_former_partners_on_both_sides() {
        // a named b in its own status, c named a in c's status; a conflicts with nobody now.
        let r = record(&[
            ("a", seen(1, &["b"])),
            ("b", seen(1, &["a"])),
            ("c", seen(1, &["a"])),
            ("d", seen(1, &[])),
        ]);
        assert_eq!(affected(&r, "a", now(&[]).as_ref()), names(&["b", "c"]));
    }

    #[test]
    fn a_policy_that_starts_conflicting_requeues_its_new_partners() {
        let r = record(&[
            ("a", seen(1, &[])),
            ("b", seen(1, &[])),
            ("c", seen(1, &[])),
        ]);
        assert_eq!(affected(&r, "a", now(&["c"]).as_ref()), names(&["c"]));
    }

    #[test]
    fn a_deleted_policy_requeues_what_it_conflicted_with_and_nothing_else() {
        let r = record(&[
            ("a", seen(1, &["b"])),
            ("b", seen(1, &["a", "e"])),
            ("e", seen(1, &["b"])),
            ("f", seen(1, &[])),
        ]);
        assert_eq!(affected(&r, "a", None::<&BTreeSet<String>>), names(&["b"]));
        // Deleting a policy never recorded (e.g. invalid from the start) touches nothing.
        assert!(affected(&r, "zzz", None::<&BTreeSet<String>>).is_empty());
    }

    #[test]
    fn unrelated_policies_and_the_policy_itself_are_never_requeued() {
        let r = record(&[
            ("a", seen(1, &["a", "b"])),
            ("b", seen(1, &["a"])),
            ("x", seen(1, &["y"])),
            ("y", seen(1, &["x"])),
        ]);
        let out = affected(&r, "a", now(&["a", "b"]).as_ref());
        assert_eq!(out, names(&["b"]));
    }

    fn policy(name: &str, generation: i64) -> InjectionPolicy {
        let mut p = InjectionPolicy::new(name, Default::default());
        p.metadata.uid = Some("u".into());
        p.metadata.generation = Some(generation);
        p
    }

    /// Partners read at generation 1.
    fn partners(others: &[&str]) -> BTreeMap<String, Stamp> {
        others.iter().map(|o| ((*o).to_owned(), stamp(1))).collect()
    }

    /// One shared entry of `members` on the same terms.
    fn entry(members: &[&str]) -> Plan {
        Plan::new(
            members.iter().map(|name| Member {
                name: (*name).to_owned(),
                uid: "u".into(),
                spec: Default::default(),
                failure_policy: FailurePolicy::Ignore,
                canary: None,
            }),
            "test",
        )
    }

    fn drain(rx: &mut mpsc::UnboundedReceiver<ObjectRef<InjectionPolicy>>) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        while let Ok(r) = rx.try_recv() {
            out.insert(r.name);
        }
        out
    }

    #[test]
    fn only_a_new_generation_queues_partners_so_reconciles_do_not_bounce() {
        let none = Plan::default();
        let (n, mut rx) = Neighbours::new();
        n.observed(&policy("b", 1), BTreeMap::new(), &none);
        assert!(drain(&mut rx).is_empty());
        // a appears and clashes with b: b must show it.
        n.observed(&policy("a", 1), partners(&["b"]), &none);
        assert_eq!(drain(&mut rx), names(&["b"]));
        // b's reconcile now sees a; b's spec did not change, so a is not queued again.
        n.observed(&policy("b", 1), partners(&["a"]), &none);
        assert!(drain(&mut rx).is_empty());
        // a resync of a at the same generation queues nothing.
        n.observed(&policy("a", 1), partners(&["b"]), &none);
        assert!(drain(&mut rx).is_empty());
        // a's template changes so the clash is gone: b, which read a at 1, must drop it.
        n.observed(&policy("a", 2), BTreeMap::new(), &none);
        assert_eq!(drain(&mut rx), names(&["b"]));
    }

    #[test]
    fn a_new_policy_does_not_queue_an_entry_partner_that_already_decided_from_it() {
        let (n, mut rx) = Neighbours::new();
        // Both are in the cache: a's first reconcile already plans b into its entry.
        n.observed(&policy("a", 1), partners(&["b"]), &entry(&["a", "b"]));
        assert_eq!(drain(&mut rx), names(&["b"]), "b has not decided yet");
        // b's first reconcile reads a at the version a's record holds, with the same entry: a
        // already wrote what b would ask it to.
        n.observed(&policy("b", 1), partners(&["a"]), &entry(&["a", "b"]));
        assert!(drain(&mut rx).is_empty());
    }

    #[test]
    fn a_new_policy_queues_entry_partners_whose_entry_it_changes() {
        let (n, mut rx) = Neighbours::new();
        n.observed(&policy("a", 1), partners(&["b"]), &entry(&["a", "b"]));
        n.observed(&policy("b", 1), partners(&["a"]), &entry(&["a", "b"]));
        drain(&mut rx);
        // c joins the entry: a and b read c (they had never seen it) and their entry grows.
        n.observed(
            &policy("c", 1),
            partners(&["a", "b"]),
            &entry(&["a", "b", "c"]),
        );
        assert_eq!(drain(&mut rx), names(&["a", "b"]));
    }

    #[test]
    fn a_partner_that_read_another_version_is_queued_even_with_the_same_entry() {
        let (n, mut rx) = Neighbours::new();
        n.observed(&policy("a", 1), partners(&["b"]), &entry(&["a", "b"]));
        n.observed(&policy("b", 1), partners(&["a"]), &entry(&["a", "b"]));
        drain(&mut rx);
        // a's generation 2 serves the same spec (say, only a label changed the generation):
        // b's conflicts were decided from a's generation 1, so b looks again.
        n.observed(&policy("a", 2), partners(&["b"]), &entry(&["a", "b"]));
        assert_eq!(drain(&mut rx), names(&["b"]));
    }

    #[test]
    fn an_entry_differs_by_its_members_specs_not_only_by_their_names() {
        let plain = entry(&["a", "b"]);
        let mut members = plain
            .group_of("a")
            .map(|g| g.members.clone())
            .unwrap_or_default();
        // b's values change what it injects, not the terms it is called under.
        members[1].spec.values.insert("version".into(), "2".into());
        let other = Plan::new(members, "test");
        assert_eq!(other.group_of("a").map(Group::names), Some(vec!["a", "b"]));
        assert_eq!(
            fingerprint(plain.group_of("a")),
            fingerprint(entry(&["a", "b"]).group_of("a"))
        );
        assert_ne!(
            fingerprint(plain.group_of("a")),
            fingerprint(other.group_of("a"))
        );
        assert_eq!(fingerprint(Plan::default().group_of("a")), None);
    }

    #[test]
    fn forgetting_a_policy_queues_its_partners_once() {
        let none = Plan::default();
        let (n, mut rx) = Neighbours::new();
        n.observed(&policy("a", 1), partners(&["b"]), &none);
        n.observed(&policy("b", 1), partners(&["a"]), &none);
        n.observed(&policy("c", 1), BTreeMap::new(), &none);
        drain(&mut rx);
        n.forget("a");
        assert_eq!(drain(&mut rx), names(&["b"]));
        n.forget("a");
        // b's own record still names a until b is reconciled, so a second forget (a relist
        // delivering the deletion again) queues b again; harmless, and c is never touched.
        assert_eq!(drain(&mut rx), names(&["b"]));
    }
}
