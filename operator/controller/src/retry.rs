//! Failed API steps: how long one waits before it tries again (the reconcile and the CA loop
//! share it), and which failures only lost a race to a concurrent writer.

use std::time::Duration;

/// The longest wait between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Delay before the retry that follows `failures` consecutive failures: 1 s, doubling.
pub fn backoff(failures: u32) -> Duration {
    let secs = 1u64
        .checked_shl(failures.saturating_sub(1))
        .unwrap_or(u64::MAX);
    Duration::from_secs(secs).min(MAX_BACKOFF)
}

/// A write lost to a concurrent one (409: conflict or already exists).
pub(crate) fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_one_second_up_to_five_minutes() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(5), Duration::from_secs(16));
        assert_eq!(backoff(40), MAX_BACKOFF);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}
