//! Pure: which generation of a policy is in force.
//!
//! An update that makes a policy invalid never removes or weakens what serves it: the last
//! generation that compiled, whose spec the status keeps (`servingGeneration`, `servingSpec`),
//! stays in force on every replica and in the webhook configuration until the spec is fixed. The
//! leader and every replica decide with the same function, so they never disagree on it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use kube::ResourceExt;
use serde_json::Value;
use splice_crds::{Canary, InjectionPolicy, InjectionPolicySpec, StableRevision};
use splice_engine::{CompiledPolicy, PolicyError};

/// What a policy serves, decided from the object alone.
#[derive(Debug)]
pub enum InForce {
    /// The current generation compiles.
    Current(CompiledPolicy),
    /// The current generation does not compile (`error`); the last one that did stays in force.
    LastGood {
        compiled: CompiledPolicy,
        error: PolicyError,
    },
    /// Nothing compiles: the policy never did, or the kept spec no longer does.
    Nothing(PolicyError),
}

impl InForce {
    /// The compiled policy in force, if any.
    pub fn compiled(&self) -> Option<&CompiledPolicy> {
        match self {
            InForce::Current(c) | InForce::LastGood { compiled: c, .. } => Some(c),
            InForce::Nothing(_) => None,
        }
    }

    pub fn into_compiled(self) -> Option<CompiledPolicy> {
        match self {
            InForce::Current(c) | InForce::LastGood { compiled: c, .. } => Some(c),
            InForce::Nothing(_) => None,
        }
    }

    /// Why the current generation is not the one in force.
    pub fn error(&self) -> Option<&PolicyError> {
        match self {
            InForce::Current(_) => None,
            InForce::LastGood { error, .. } | InForce::Nothing(error) => Some(error),
        }
    }

    /// The generation in force and its spec, as the status records them.
    pub fn record(&self) -> Option<(i64, Value)> {
        let compiled = self.compiled()?;
        let spec = serde_json::to_value(compiled.spec()).ok()?;
        Some((compiled.generation(), spec))
    }
}

/// Compiles the current spec, or, when it does not compile, the last good one the status kept.
pub fn in_force(policy: &InjectionPolicy) -> InForce {
    let name = policy.name_any();
    let generation = policy.metadata.generation.unwrap_or_default();
    let error = match CompiledPolicy::compile(&name, generation, &policy.spec) {
        Ok(compiled) => return InForce::Current(compiled),
        Err(e) => e,
    };
    match last_good(policy) {
        Some((kept, spec)) if kept < generation => {
            match CompiledPolicy::compile(&name, kept, &spec) {
                Ok(compiled) => InForce::LastGood { compiled, error },
                Err(_) => InForce::Nothing(error),
            }
        }
        _ => InForce::Nothing(error),
    }
}

/// The spec each policy serves, compiled once per version of the policy: grouping reads every
/// policy's on every reconcile, and compiling them all each time would make a burst of n policy
/// changes cost n² compilations.
#[derive(Debug, Default)]
pub struct EntrySpecs(Mutex<HashMap<String, (Version, Served)>>);

/// What a policy serves by webhook: the spec in force, and its canary while one is open.
#[derive(Debug, PartialEq)]
pub struct EntrySpec {
    pub spec: InjectionPolicySpec,
    pub canary: Option<Canary>,
}

/// The spec a policy serves, if any.
type Served = Option<Arc<EntrySpec>>;

/// What decides the spec in force: the spec (its generation) and the last good one in the status,
/// and the promoted revision, which decides whether a canary is open.
#[derive(Debug, PartialEq, Eq)]
struct Version {
    uid: Option<String>,
    generation: Option<i64>,
    serving_generation: Option<i64>,
    stable: Option<String>,
}

impl EntrySpecs {
    /// What `policy` serves in a webhook, or `None` when it serves none (paused, being deleted,
    /// nothing compiles, or it runs in-tree).
    pub fn get(&self, policy: &InjectionPolicy) -> Served {
        if policy.spec.paused || policy.metadata.deletion_timestamp.is_some() {
            return None;
        }
        let version = Version {
            uid: policy.metadata.uid.clone(),
            generation: policy.metadata.generation,
            serving_generation: policy.status.as_ref().and_then(|s| s.serving_generation),
            stable: stable(policy).map(|s| s.template_hash.clone()),
        };
        let name = policy.name_any();
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((v, served)) = known.get(&name)
            && *v == version
        {
            return served.clone();
        }
        // A policy running in-tree is served by its MutatingAdmissionPolicy, not by a webhook.
        let served = in_force(policy).into_compiled().and_then(|c| {
            let canary = open_canary(policy, c.template_hash()).map(|(canary, _)| canary.clone());
            let in_tree = splice_engine::intree::decide(c.spec().mode, Some(&c), canary.is_some())
                .program
                .is_some();
            (!in_tree).then(|| {
                Arc::new(EntrySpec {
                    spec: c.spec().clone(),
                    canary,
                })
            })
        });
        known.insert(name, (version, served.clone()));
        served
    }
}

/// The revision in force that a replica's webhook store serves for `name` (what a canary gets,
/// and everything else when no canary is open).
pub fn in_force_of(
    store: &splice_server::store::PolicyStore,
    name: &str,
) -> Option<Arc<CompiledPolicy>> {
    store
        .get(&splice_engine::entry::canary_key(name))
        .or_else(|| store.get(name))
}

/// The promoted revision the status keeps, when the policy has `spec.rollout`.
pub fn stable(policy: &InjectionPolicy) -> Option<&StableRevision> {
    policy.spec.rollout.as_ref()?;
    policy.status.as_ref()?.rollout.as_ref()?.stable.as_ref()
}

/// The policy's canary while it is open, as [`splice_engine::entry::open_canary`] decides from
/// its spec and its promoted revision: the leader (entries, mode, rollout), every replica (what
/// it serves) and the CLI decide with that one function.
pub fn open_canary<'p>(
    policy: &'p InjectionPolicy,
    template_hash: &str,
) -> Option<(&'p Canary, &'p StableRevision)> {
    splice_engine::entry::open_canary(&policy.spec, stable(policy), template_hash)
}

/// The promoted revision's spec, compiled, while `policy`'s canary is open.
pub fn compile_stable(policy: &InjectionPolicy, template_hash: &str) -> Option<CompiledPolicy> {
    let (_, stable) = open_canary(policy, template_hash)?;
    let spec: InjectionPolicySpec = serde_json::from_value(stable.spec.clone()).ok()?;
    CompiledPolicy::compile(&policy.name_any(), stable.generation, &spec).ok()
}

/// The generation the status says is in force, and its spec.
fn last_good(policy: &InjectionPolicy) -> Option<(i64, InjectionPolicySpec)> {
    let status = policy.status.as_ref()?;
    let generation = status.serving_generation?;
    let spec = serde_json::from_value(status.serving_spec.clone()?).ok()?;
    Some((generation, spec))
}

#[cfg(test)]
mod tests {
    use splice_crds::InjectionPolicyStatus;

    use super::*;

    fn policy(generation: i64, image: &str) -> InjectionPolicy {
        let spec: InjectionPolicySpec = serde_yaml::from_str(&format!(
            "values: {{tag: '1.0'}}\ntemplate:\n  containers:\n  - name: proxy\n    image: \"{image}\"\n"
        ))
        .unwrap();
        let mut p = InjectionPolicy::new("mesh", spec);
        p.metadata.generation = Some(generation);
        p
    }

    fn kept(mut p: InjectionPolicy, from: &InjectionPolicy) -> InjectionPolicy {
        let record = in_force(from).record().unwrap();
        p.status = Some(InjectionPolicyStatus {
            serving_generation: Some(record.0),
            serving_spec: Some(record.1),
            ..Default::default()
        });
        p
    }

    #[test]
    fn a_spec_that_compiles_is_in_force() {
        let p = policy(3, "proxy:{{ values.tag }}");
        let in_force = in_force(&p);
        assert!(matches!(in_force, InForce::Current(_)));
        assert_eq!(in_force.record().unwrap().0, 3);
    }

    #[test]
    fn an_invalid_update_keeps_the_last_generation_that_compiled_in_force() {
        let good = policy(3, "proxy:{{ values.tag }}");
        let bad = kept(policy(4, "proxy:{{ values.nope }}"), &good);
        let in_force = in_force(&bad);
        let InForce::LastGood { compiled, error } = &in_force else {
            panic!("expected the last good generation, got {in_force:?}");
        };
        assert_eq!(compiled.generation(), 3);
        assert_eq!(
            compiled.template_hash(),
            super::in_force(&good).compiled().unwrap().template_hash()
        );
        assert!(
            error
                .to_string()
                .contains("spec.template.containers[0].image")
        );
        assert_eq!(in_force.record().unwrap().0, 3);
    }

    #[test]
    fn a_policy_that_never_compiled_has_nothing_in_force() {
        let bad = policy(1, "proxy:{{ values.nope }}");
        assert!(matches!(in_force(&bad), InForce::Nothing(_)));
        assert!(in_force(&bad).record().is_none());
    }

    #[test]
    fn a_kept_spec_is_not_used_for_its_own_generation_or_a_later_one() {
        // Splice's rules changed under a stored spec: what no longer compiles is not served.
        let good = policy(4, "proxy:{{ values.tag }}");
        let mut bad = kept(policy(4, "proxy:{{ values.nope }}"), &good);
        assert!(matches!(in_force(&bad), InForce::Nothing(_)));
        bad.metadata.generation = Some(5);
        assert!(matches!(in_force(&bad), InForce::LastGood { .. }));
    }
}
