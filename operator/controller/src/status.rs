//! Which field manager owns which part of a policy's status, declared once. Each writer applies
//! its own slice by server-side apply under its own manager, so none removes or reverts another's
//! fields; before comparing, each keeps only its own slice of what it read.

use splice_crds::{InjectionPolicyStatus, MANAGER, condition};

/// The field manager of `status.coverage`.
pub const COVERAGE_MANAGER: &str = "splice-coverage";
/// The field manager of `status.probe` and the Verified condition.
pub const PROBE_MANAGER: &str = "splice-probe";
/// The field manager of `status.rollout`, the RolledOut condition and the restart annotations on
/// workloads' pod templates.
pub const ROLLOUT_MANAGER: &str = "splice-rollout";

/// A writer of part of a policy's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// The reconcile: everything the others do not own.
    Reconcile,
    /// `status.coverage`.
    Coverage,
    /// `status.probe` and the Verified condition.
    Probe,
    /// `status.rollout` and the RolledOut condition.
    Rollout,
}

impl Owner {
    pub const fn manager(self) -> &'static str {
        match self {
            Owner::Reconcile => MANAGER,
            Owner::Coverage => COVERAGE_MANAGER,
            Owner::Probe => PROBE_MANAGER,
            Owner::Rollout => ROLLOUT_MANAGER,
        }
    }

    /// The owner of the condition `type_`.
    pub fn of_condition(type_: &str) -> Self {
        match type_ {
            condition::VERIFIED => Owner::Probe,
            condition::ROLLED_OUT => Owner::Rollout,
            _ => Owner::Reconcile,
        }
    }

    /// Keeps in `status` only what this owner writes.
    pub fn keep_own(self, status: &mut InjectionPolicyStatus) {
        status
            .conditions
            .retain(|c| Owner::of_condition(&c.type_) == self);
        if self != Owner::Coverage {
            status.coverage = None;
        }
        if self != Owner::Probe {
            status.probe = None;
        }
        if self != Owner::Rollout {
            status.rollout = None;
        }
        if self != Owner::Reconcile {
            let own = (
                std::mem::take(&mut status.conditions),
                status.coverage.take(),
                status.probe.take(),
                status.rollout.take(),
            );
            *status = InjectionPolicyStatus::default();
            (
                status.conditions,
                status.coverage,
                status.probe,
                status.rollout,
            ) = own;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use splice_crds::{Coverage, ProbeStatus, RolloutStatus};

    fn full() -> InjectionPolicyStatus {
        let c = |t: &str| Condition {
            type_: t.into(),
            status: "True".into(),
            reason: "R".into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        InjectionPolicyStatus {
            observed_generation: Some(1),
            template_hash: Some("h".into()),
            conditions: vec![
                c(condition::READY),
                c(condition::VERIFIED),
                c(condition::ROLLED_OUT),
            ],
            coverage: Some(Coverage::default()),
            probe: Some(ProbeStatus::default()),
            rollout: Some(RolloutStatus::default()),
            ..Default::default()
        }
    }

    fn types(s: &InjectionPolicyStatus) -> Vec<&str> {
        s.conditions.iter().map(|c| c.type_.as_str()).collect()
    }

    #[test]
    fn each_owner_keeps_exactly_its_own_slice_of_the_status() {
        let mut s = full();
        Owner::Reconcile.keep_own(&mut s);
        assert_eq!(types(&s), [condition::READY]);
        assert_eq!(s.template_hash.as_deref(), Some("h"));
        assert!(s.coverage.is_none() && s.probe.is_none() && s.rollout.is_none());

        let mut s = full();
        Owner::Probe.keep_own(&mut s);
        assert_eq!(types(&s), [condition::VERIFIED]);
        assert!(s.probe.is_some() && s.coverage.is_none() && s.rollout.is_none());
        assert_eq!(s.template_hash, None);

        let mut s = full();
        Owner::Rollout.keep_own(&mut s);
        assert_eq!(types(&s), [condition::ROLLED_OUT]);
        assert!(s.rollout.is_some() && s.probe.is_none());

        let mut s = full();
        Owner::Coverage.keep_own(&mut s);
        assert!(s.conditions.is_empty());
        assert!(s.coverage.is_some() && s.observed_generation.is_none());
        assert_eq!(Owner::Coverage.manager(), "splice-coverage");
    }
}
