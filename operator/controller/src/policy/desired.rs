//! What one policy should be, decided before anything is written: the revision in force, the
//! mode, the failure policy, the webhook entry that serves it, its conflicts and the partners a
//! change of it can affect. Pure: it reads the policy and what the leader knows of the cluster
//! ([`World`]) and calls no API.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::ResourceExt;
use splice_crds::{InjectionPolicy, InjectionPolicyStatus};

use super::conditions::{FailurePolicyDecision, effective_failure_policy};
use super::conflicts::{Conflict, conflicts_of};
use super::in_force::{EntrySpec, EntrySpecs, InForce, in_force, open_canary};
use super::intree;
use super::neighbours::Stamp;
use crate::guard::GuardStatus;
use splice_engine::ModeDecision;
use splice_engine::entry::{Group, Member, Plan, webhook_configuration_name};

/// What the leader knows of the cluster when it decides one policy.
pub struct World<'a> {
    /// Every managed policy, as the controller's cache holds them.
    pub policies: &'a [Arc<InjectionPolicy>],
    /// The spec each policy serves in a webhook.
    pub entry_specs: &'a EntrySpecs,
    /// Whether the availability guard lets `Fail` be in force.
    pub guard: &'a GuardStatus,
    /// What tells this Splice's shared webhook entries from another instance's.
    pub instance: &'a str,
    /// The policy's status as this replica last knows it (its own write, until the watch shows it).
    pub status: Option<&'a InjectionPolicyStatus>,
}

/// The decision for one policy.
pub struct Desired<'p> {
    /// The revision in force: the current spec if it compiles, else the last good one, if any.
    pub in_force: InForce,
    /// The policy with the spec in force: what its webhook entry or in-tree objects are made of.
    pub served: Cow<'p, InjectionPolicy>,
    pub mode: ModeDecision,
    pub failure_policy: FailurePolicyDecision,
    pub conflicts: Vec<Conflict>,
    /// Every policy this Splice serves by webhook, grouped into entries; this one with the spec
    /// in force, or left out when it serves none.
    pub plan: Plan,
    /// The entry that serves this policy, when a webhook does.
    pub group: Option<Group>,
    /// The policies whose reconcile a change of this one can change (conflicts, entry partners),
    /// each with the version of it this decision read.
    pub partners: BTreeMap<String, Stamp>,
    /// The configuration the status names: the entry's, else the one that served it so far.
    pub configuration: String,
    /// Members leaving this policy's shared entry with their move still in flight (a change
    /// their own reconcile has not reported: the status still names this entry). Their new paths
    /// are written before this entry is rewritten without them, as their own reconciles would,
    /// so none has a moment unserved whichever reconcile runs first.
    pub leaving: Vec<String>,
}

/// Decides what `policy` should be in `world`.
pub fn desired<'p>(policy: &'p InjectionPolicy, world: &World<'_>) -> Desired<'p> {
    let name = policy.name_any();
    let in_force = in_force(policy);
    // The entry is rendered from the spec in force: an invalid update leaves it exactly as the
    // last good generation had it.
    let served = match &in_force {
        InForce::LastGood { compiled, .. } => Cow::Owned(InjectionPolicy {
            spec: compiled.spec().clone(),
            ..policy.clone()
        }),
        InForce::Current(_) | InForce::Nothing(_) => Cow::Borrowed(policy),
    };
    let canary = in_force
        .compiled()
        .and_then(|c| open_canary(policy, c.template_hash()))
        .map(|(canary, _)| canary.clone());
    let mode =
        splice_engine::intree::decide(served.spec.mode, in_force.compiled(), canary.is_some());
    let failure_policy = match &mode.program {
        Some(_) => intree::failure_policy(served.spec.failure_policy),
        None => effective_failure_policy(served.spec.failure_policy, world.guard),
    };
    let conflicts = conflicts_of(policy, world.policies.iter().map(AsRef::as_ref));
    // In webhook mode only; in-tree, a policy is no webhook entry's.
    let serves = !policy.spec.paused && in_force.compiled().is_some() && mode.program.is_none();
    let plan = plan_entries(
        world,
        policy,
        serves.then(|| EntrySpec {
            spec: served.spec.clone(),
            canary,
        }),
    );
    let group = plan.group_of(&name).cloned();
    let mut names: BTreeSet<&str> = conflicts.iter().map(|c| c.other.as_str()).collect();
    names.extend(
        group
            .iter()
            .flat_map(|g| g.members.iter().map(|m| m.name.as_str())),
    );
    names.remove(name.as_str());
    let partners = world
        .policies
        .iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| names.contains(n))
        })
        .map(|p| (p.name_any(), Stamp::of(p)))
        .collect();
    let configuration = match &group {
        Some(g) => g.configuration.clone(),
        None => world
            .status
            .and_then(|s| s.webhook_configuration.clone())
            .unwrap_or_else(|| webhook_configuration_name(&name)),
    };
    let leaving = group
        .as_ref()
        .map(|g| leaving_in_flight(policy, g, world))
        .unwrap_or_default();
    Desired {
        in_force,
        served,
        mode,
        failure_policy,
        conflicts,
        plan,
        group,
        partners,
        configuration,
        leaving,
    }
}

/// The policies their status says `group`'s configuration serves, that the plan moves elsewhere
/// while still served by webhook, and whose latest change their reconcile has not reported yet. Only when
/// `this` is already served by that configuration: a policy joining it must write it.
fn leaving_in_flight(this: &InjectionPolicy, group: &Group, world: &World<'_>) -> Vec<String> {
    let configuration = group.configuration.as_str();
    let names_it = |s: Option<&InjectionPolicyStatus>| {
        s.and_then(|s| s.webhook_configuration.as_deref()) == Some(configuration)
    };
    if !names_it(world.status) {
        return Vec::new();
    }
    let this_name = this.name_any();
    world
        .policies
        .iter()
        .filter(|p| p.name_any() != this_name)
        .filter(|p| names_it(p.status.as_ref()))
        .filter(|p| !group.members.iter().any(|m| m.name == p.name_any()))
        .filter(|p| p.status.as_ref().and_then(|s| s.observed_generation) != p.metadata.generation)
        .filter(|p| world.entry_specs.get(p).is_some())
        .map(|p| p.name_any())
        .collect()
}

/// Every policy this Splice serves, grouped into webhook entries. `this` is planned with the spec
/// its reconcile just decided (`None`: it serves nothing); the others with the spec each serves.
fn plan_entries(world: &World<'_>, this: &InjectionPolicy, this_served: Option<EntrySpec>) -> Plan {
    let member = |p: &InjectionPolicy, served: &EntrySpec| Member {
        name: p.name_any(),
        uid: p.metadata.uid.clone().unwrap_or_default(),
        failure_policy: effective_failure_policy(served.spec.failure_policy, world.guard).effective,
        spec: served.spec.clone(),
        canary: served.canary.clone(),
    };
    let this_name = this.name_any();
    let others = world
        .policies
        .iter()
        .filter(|p| p.name_any() != this_name)
        .filter_map(|p| world.entry_specs.get(p).map(|served| member(p, &served)));
    let this = this_served.map(|served| member(this, &served));
    Plan::new(others.chain(this), world.instance)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use splice_crds::{FailurePolicy, Mode};

    use super::*;

    fn policy(name: &str, spec: Value) -> Arc<InjectionPolicy> {
        let mut p = InjectionPolicy::new(name, serde_json::from_value(spec).unwrap());
        p.metadata.uid = Some(format!("{name}-uid"));
        p.metadata.generation = Some(1);
        Arc::new(p)
    }

    fn webhook(name: &str, image: &str) -> Arc<InjectionPolicy> {
        policy(
            name,
            json!({
                "mode": "Webhook",
                "namespaceSelector": {"matchLabels": {"mesh": "on"}},
                "template": {"containers": [{"name": name, "image": image}]}
            }),
        )
    }

    fn decide<'p>(
        policy: &'p InjectionPolicy,
        all: &[Arc<InjectionPolicy>],
        guard: &GuardStatus,
        status: Option<&InjectionPolicyStatus>,
    ) -> Desired<'p> {
        let specs = EntrySpecs::default();
        let world = World {
            policies: all,
            entry_specs: &specs,
            guard,
            instance: "splice-system/",
            status,
        };
        desired(policy, &world)
    }

    #[test]
    fn a_webhook_policy_alone_has_its_own_entry_and_no_partners() {
        let p = webhook("mesh", "registry.invalid/proxy:1");
        let d = decide(&p, &[Arc::clone(&p)], &GuardStatus::not_observed(), None);
        assert!(matches!(d.in_force, InForce::Current(_)));
        assert_eq!(d.mode.effective, Mode::Webhook);
        assert!(d.mode.program.is_none());
        let group = d.group.expect("an entry");
        assert_eq!(group.names(), vec!["mesh"]);
        assert_eq!(d.configuration, "splice-mesh");
        assert!(d.partners.is_empty());
        assert!(d.conflicts.is_empty());
    }

    #[test]
    fn policies_on_the_same_terms_share_an_entry_and_are_each_others_partners() {
        let a = webhook("a", "registry.invalid/a:1");
        let b = webhook("b", "registry.invalid/b:1");
        let all = [Arc::clone(&a), Arc::clone(&b)];
        let d = decide(&a, &all, &GuardStatus::not_observed(), None);
        let group = d.group.expect("an entry");
        assert!(group.is_shared(), "{:?}", group.names());
        assert_eq!(d.configuration, group.configuration);
        assert_eq!(
            d.partners.keys().cloned().collect::<BTreeSet<_>>(),
            BTreeSet::from(["b".to_owned()])
        );
    }

    #[test]
    fn a_static_auto_policy_runs_in_tree_in_no_entry_with_its_own_failure_policy() {
        let p = policy(
            "static",
            json!({
                "namespaceSelector": {"matchLabels": {"mesh": "on"}},
                "failurePolicy": "Fail",
                "template": {"containers": [{"name": "agent", "image": "registry.invalid/agent:1"}]}
            }),
        );
        let d = decide(&p, &[Arc::clone(&p)], &GuardStatus::not_observed(), None);
        assert_eq!(d.mode.effective, Mode::InTree);
        assert!(d.mode.program.is_some());
        assert!(d.group.is_none());
        assert_eq!(d.configuration, "splice-static");
        assert_eq!(
            d.failure_policy.effective,
            intree::failure_policy(FailurePolicy::Fail).effective
        );
    }

    #[test]
    fn fail_is_not_in_force_for_a_webhook_policy_until_the_guard_allows_it() {
        let mut spec = json!({
            "mode": "Webhook",
            "failurePolicy": "Fail",
            "template": {"containers": [{"name": "proxy", "image": "registry.invalid/proxy:1"}]}
        });
        let p = policy("strict", spec.take());
        let d = decide(&p, &[Arc::clone(&p)], &GuardStatus::not_observed(), None);
        assert_eq!(d.failure_policy.effective, FailurePolicy::Ignore);
        assert_eq!(
            d.group.expect("an entry").members[0].failure_policy,
            FailurePolicy::Ignore
        );
    }

    #[test]
    fn a_paused_policy_is_in_no_entry_and_names_the_configuration_that_served_it() {
        let mut p = (*webhook("mesh", "registry.invalid/proxy:1")).clone();
        p.spec.paused = true;
        let status = InjectionPolicyStatus {
            webhook_configuration: Some("splice-shared-1234".into()),
            ..InjectionPolicyStatus::default()
        };
        let d = decide(&p, &[], &GuardStatus::not_observed(), Some(&status));
        assert!(d.group.is_none());
        assert_eq!(d.configuration, "splice-shared-1234");
    }

    #[test]
    fn a_member_moving_out_of_a_shared_entry_is_named_until_its_move_is_reported() {
        let [a, b, c] = ["a", "b", "c"].map(|n| webhook(n, "registry.invalid/x:1"));
        let all = [Arc::clone(&a), Arc::clone(&b), Arc::clone(&c)];
        let shared = decide(&a, &all, &GuardStatus::not_observed(), None).configuration;
        let served_by = |generation| InjectionPolicyStatus {
            webhook_configuration: Some(shared.clone()),
            observed_generation: Some(generation),
            ..InjectionPolicyStatus::default()
        };
        // b moves out (a new timeout, generation 2) and its reconcile has not reported it yet.
        let mut moved = (*b).clone();
        moved.spec.timeout_seconds = 7;
        moved.metadata.generation = Some(2);
        moved.status = Some(served_by(1));
        let a_status = served_by(1);
        let all = [Arc::clone(&a), Arc::new(moved.clone()), Arc::clone(&c)];
        let d = decide(&a, &all, &GuardStatus::not_observed(), Some(&a_status));
        assert_eq!(d.configuration, shared, "a and c still share it");
        assert_eq!(d.leaving, ["b"]);
        assert_ne!(
            d.plan.group_of("b").map(|g| g.configuration.as_str()),
            Some(shared.as_str())
        );

        // Once b reported its move, nothing is in flight.
        moved.status = Some(InjectionPolicyStatus {
            webhook_configuration: Some("splice-b".into()),
            observed_generation: Some(2),
            ..InjectionPolicyStatus::default()
        });
        let all = [Arc::clone(&a), Arc::new(moved.clone()), Arc::clone(&c)];
        let d = decide(&a, &all, &GuardStatus::not_observed(), Some(&a_status));
        assert!(d.leaving.is_empty());

        // A paused member is not served: dropping it at once is what pausing asks.
        moved.spec.paused = true;
        moved.status = Some(served_by(1));
        let all = [Arc::clone(&a), Arc::new(moved), Arc::clone(&c)];
        let d = decide(&a, &all, &GuardStatus::not_observed(), Some(&a_status));
        assert!(d.leaving.is_empty());
    }

    #[test]
    fn overlapping_policies_injecting_the_same_container_are_conflict_partners() {
        let a = webhook("a", "registry.invalid/a:1");
        let mut b = (*webhook("b", "registry.invalid/b:1")).clone();
        b.spec.template.containers[0].name = "a".into();
        // Different terms, so no shared entry: the partner comes from the conflict alone.
        b.spec.timeout_seconds = 7;
        let all = [Arc::clone(&a), Arc::new(b)];
        let d = decide(&a, &all, &GuardStatus::not_observed(), None);
        assert_eq!(d.conflicts.len(), 1, "{:?}", d.conflicts);
        assert!(d.partners.contains_key("b"));
    }
}
