use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Status of a condition, as the API spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(value: bool) -> Self {
        if value {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

/// Sets condition `type_` in `conditions`, keeping `lastTransitionTime` unless the status itself
/// changes: watchers (kubectl wait, Argo CD, Flux) read a moved transition time as a new event.
/// Returns true when anything about the condition changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let status = status.as_str();
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == type_) {
        let transitioned = existing.status != status;
        let changed = transitioned
            || existing.reason != reason
            || existing.message != message
            || existing.observed_generation != observed_generation;
        if transitioned {
            existing.last_transition_time = Time(now);
        }
        existing.status = status.to_owned();
        existing.reason = reason.to_owned();
        existing.message = message.to_owned();
        existing.observed_generation = observed_generation;
        return changed;
    }
    conditions.push(Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation,
        last_transition_time: Time(now),
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn a_new_condition_is_added_with_the_current_time() {
        let mut c = Vec::new();
        assert!(set_condition(
            &mut c,
            "Ready",
            ConditionStatus::True,
            "Configured",
            "ok",
            Some(1),
            ts(10)
        ));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].last_transition_time, Time(ts(10)));
        assert_eq!(c[0].observed_generation, Some(1));
    }

    #[test]
    fn transition_time_stays_when_only_the_message_or_generation_changes() {
        let mut c = Vec::new();
        set_condition(
            &mut c,
            "Ready",
            ConditionStatus::True,
            "Configured",
            "ok",
            Some(1),
            ts(10),
        );
        assert!(set_condition(
            &mut c,
            "Ready",
            ConditionStatus::True,
            "Configured",
            "still ok",
            Some(2),
            ts(20)
        ));
        assert_eq!(c[0].last_transition_time, Time(ts(10)));
        assert_eq!(c[0].message, "still ok");
        assert_eq!(c[0].observed_generation, Some(2));
    }

    #[test]
    fn transition_time_moves_when_the_status_flips() {
        let mut c = Vec::new();
        set_condition(
            &mut c,
            "Ready",
            ConditionStatus::True,
            "Configured",
            "ok",
            Some(1),
            ts(10),
        );
        assert!(set_condition(
            &mut c,
            "Ready",
            ConditionStatus::False,
            "Paused",
            "paused",
            Some(1),
            ts(30)
        ));
        assert_eq!(c[0].last_transition_time, Time(ts(30)));
        assert_eq!(c[0].status, "False");
    }

    #[test]
    fn setting_an_identical_condition_reports_no_change() {
        let mut c = Vec::new();
        set_condition(
            &mut c,
            "Ready",
            ConditionStatus::True,
            "Configured",
            "ok",
            Some(1),
            ts(10),
        );
        assert!(!set_condition(
            &mut c,
            "Ready",
            ConditionStatus::True,
            "Configured",
            "ok",
            Some(1),
            ts(99)
        ));
        assert_eq!(c[0].last_transition_time, Time(ts(10)));
    }
}
