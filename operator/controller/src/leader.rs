//! Leader election on a `coordination.k8s.io/v1` Lease in Splice's namespace.
//!
//! Follows client-go's protocol so the Lease reads the same in `kubectl get lease`: the leader
//! renews every retry period; a candidate takes over when the record it sees has not changed for
//! the lease duration, measured on its own clock (never by comparing its clock with the leader's
//! `renewTime`, which would make clock skew a split brain); a leader that cannot renew within the
//! renew deadline, which is shorter than the lease duration, steps down before anyone else may
//! take over. Every update is conditional on the resourceVersion read, so two candidates can never
//! both win.
//!
//! Written here because kube-runtime has no leader election, and the two properties above (own
//! clock, step down before expiry) are what keeps two leaders from writing at once.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::retry::is_conflict;

/// How the election is run.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Name of the Lease object.
    pub name: String,
    /// Unique per replica (the pod name in a cluster).
    pub identity: String,
    /// How long a record must stay unchanged before a candidate takes over.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal; shorter than
    /// `lease_duration` so it stops before anyone else may start.
    pub renew_deadline: Duration,
    /// How often the leader renews and candidates retry.
    pub retry_period: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseConfigError {
    #[error(
        "the renew deadline ({renew:?}) must be shorter than the lease duration ({lease:?}), or a \
         leader could still act after another replica took over"
    )]
    RenewNotShorter { renew: Duration, lease: Duration },
    #[error("the retry period ({retry:?}) must be shorter than the renew deadline ({renew:?})")]
    RetryNotShorter { retry: Duration, renew: Duration },
    #[error("the lease duration must be at least one second")]
    TooShort,
}

impl LeaseConfig {
    pub fn validate(&self) -> Result<(), LeaseConfigError> {
        if self.lease_duration < Duration::from_secs(1) {
            return Err(LeaseConfigError::TooShort);
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(LeaseConfigError::RenewNotShorter {
                renew: self.renew_deadline,
                lease: self.lease_duration,
            });
        }
        if self.retry_period >= self.renew_deadline {
            return Err(LeaseConfigError::RetryNotShorter {
                retry: self.retry_period,
                renew: self.renew_deadline,
            });
        }
        Ok(())
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

/// The parts of a Lease record that show whether its holder is alive.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RecordKey {
    holder: Option<String>,
    renew_time: Option<Timestamp>,
    duration: Option<i32>,
    transitions: Option<i32>,
}

impl RecordKey {
    fn of(spec: Option<&LeaseSpec>) -> Self {
        RecordKey {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty()),
            renew_time: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
            duration: spec.and_then(|s| s.lease_duration_seconds),
            transitions: spec.and_then(|s| s.lease_transitions),
        }
    }
}

/// What a candidate should do with the record it just read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// We hold the lease: renew it.
    Renew,
    /// Nobody holds it, or the holder stopped renewing: take it.
    Acquire,
    /// Someone else holds a live lease.
    Follow,
}

/// Tracks when the record last changed, on the local monotonic clock.
#[derive(Debug, Default)]
pub struct Observer {
    last: Option<(RecordKey, Instant)>,
}

impl Observer {
    /// Decides, given the record read at `now`. A record that changed since the last read
    /// restarts the expiry clock.
    pub fn decide(&mut self, spec: Option<&LeaseSpec>, identity: &str, now: Instant) -> Decision {
        let key = RecordKey::of(spec);
        let Some(holder) = key.holder.clone() else {
            self.last = Some((key, now));
            return Decision::Acquire;
        };
        if holder == identity {
            self.last = Some((key, now));
            return Decision::Renew;
        }
        let seen_at = match &self.last {
            Some((previous, at)) if *previous == key => *at,
            _ => now,
        };
        let lease =
            Duration::from_secs(u64::try_from(key.duration.unwrap_or(1).max(1)).unwrap_or(1));
        self.last = Some((key, seen_at));
        if now.duration_since(seen_at) >= lease {
            Decision::Acquire
        } else {
            Decision::Follow
        }
    }
}

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// The record a new holder writes.
fn acquired(previous: Option<&LeaseSpec>, config: &LeaseConfig) -> LeaseSpec {
    let previous_holder = previous.and_then(|s| s.holder_identity.clone());
    let transitions = previous.and_then(|s| s.lease_transitions).unwrap_or(0);
    let changed_hands = previous_holder.as_deref() != Some(config.identity.as_str());
    LeaseSpec {
        holder_identity: Some(config.identity.clone()),
        lease_duration_seconds: Some(config.duration_seconds()),
        acquire_time: Some(now_micro()),
        renew_time: Some(now_micro()),
        lease_transitions: Some(if changed_hands && previous.is_some() {
            transitions + 1
        } else {
            transitions
        }),
        ..LeaseSpec::default()
    }
}

/// Whether this replica leads, as seen by the tasks that write: the election's last word and the
/// instant it stops holding without another renewal (the renew deadline after the renewal was
/// sent). [`Leadership::now`] reads both, so a replica that was paused past its deadline (a stopped
/// process, a starved runtime) writes nothing even before its election loop has run again and said
/// so: by then another replica may lead.
#[derive(Clone, Debug)]
pub struct Leadership(watch::Receiver<Option<Instant>>);

/// The election's side of [`Leadership`].
pub type LeadershipSender = watch::Sender<Option<Instant>>;

impl Leadership {
    /// A new election's channel; not leading until the election says so.
    pub fn channel() -> (LeadershipSender, Leadership) {
        let (tx, rx) = watch::channel(None);
        (tx, Leadership(rx))
    }

    /// A leadership no election changes (tests, one-off tools): leading or not, for good.
    pub fn fixed(leading: bool) -> Leadership {
        let until = leading.then(|| {
            let now = Instant::now();
            now.checked_add(Duration::from_secs(10 * 365 * 24 * 3600))
                .unwrap_or(now)
        });
        Leadership(watch::channel(until).1)
    }

    /// Whether this replica may write now.
    pub fn now(&self) -> bool {
        matches!(*self.0.borrow(), Some(until) if Instant::now() < until)
    }

    /// Waits until the election makes this replica leader; false once the election has ended.
    pub async fn begun(&mut self) -> bool {
        self.0.wait_for(Option::is_some).await.is_ok()
    }

    /// Waits until the election says this replica no longer leads; false once the election has
    /// ended (which also ends leadership).
    pub async fn ended(&mut self) -> bool {
        self.0.wait_for(Option::is_none).await.is_ok()
    }
}

/// Runs the election until `shutdown` resolves, publishing whether this replica leads on
/// `leading`. On shutdown a leader releases the Lease so another replica takes over at once.
pub async fn run(
    api: Api<Lease>,
    config: LeaseConfig,
    leading: LeadershipSender,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut observer = Observer::default();
    let mut last_renewal: Option<Instant> = None;
    loop {
        // The deadline runs from before the request: the API server may record the renewal at
        // any point while it is in flight, and other replicas count from that record.
        let sent = Instant::now();
        let outcome = step(&api, &config, &mut observer).await;
        let now = Instant::now();
        match outcome {
            Ok(true) => {
                if leading.borrow().is_none() {
                    tracing::info!(identity = %config.identity, lease = %config.name, "became leader");
                }
                last_renewal = Some(sent);
                leading.send_replace(Some(sent + config.renew_deadline));
            }
            Ok(false) => {
                if leading.borrow().is_some() {
                    tracing::warn!(identity = %config.identity, "lost the lease to another replica");
                }
                last_renewal = None;
                leading.send_replace(None);
            }
            Err(e) => {
                tracing::warn!(error = %e, lease = %config.name, "lease request failed");
                let expired =
                    last_renewal.is_none_or(|at| now.duration_since(at) >= config.renew_deadline);
                if leading.borrow().is_some() && expired {
                    tracing::warn!(identity = %config.identity, "could not renew the lease in time; stepping down");
                    leading.send_replace(None);
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(config.retry_period) => {}
            _ = shutdown.changed() => break,
        }
        if *shutdown.borrow() {
            break;
        }
    }
    if leading.borrow().is_some() {
        leading.send_replace(None);
        release(&api, &config).await;
    }
}

/// One read-decide-write round. `Ok(true)` when this replica holds the lease afterwards.
async fn step(
    api: &Api<Lease>,
    config: &LeaseConfig,
    observer: &mut Observer,
) -> Result<bool, kube::Error> {
    let current = api.get_opt(&config.name).await?;
    let spec = current.as_ref().and_then(|l| l.spec.as_ref());
    match observer.decide(spec, &config.identity, Instant::now()) {
        Decision::Follow => Ok(false),
        Decision::Renew => {
            let mut lease = current.unwrap_or_default();
            let mut spec = lease.spec.take().unwrap_or_default();
            spec.renew_time = Some(now_micro());
            spec.lease_duration_seconds = Some(config.duration_seconds());
            lease.spec = Some(spec);
            write(api, config, lease).await
        }
        Decision::Acquire => {
            let spec = acquired(spec, config);
            match current {
                Some(mut lease) => {
                    lease.spec = Some(spec);
                    write(api, config, lease).await
                }
                None => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(config.name.clone()),
                            ..ObjectMeta::default()
                        },
                        spec: Some(spec),
                    };
                    match api.create(&PostParams::default(), &lease).await {
                        Ok(_) => Ok(true),
                        Err(e) if is_conflict(&e) => Ok(false),
                        Err(e) => Err(e),
                    }
                }
            }
        }
    }
}

/// Replaces the Lease, conditional on the resourceVersion read; losing that race means someone
/// else wrote first, so we do not hold it.
async fn write(api: &Api<Lease>, config: &LeaseConfig, lease: Lease) -> Result<bool, kube::Error> {
    match api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if is_conflict(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the lease up: no holder, so candidates acquire on their next try.
async fn release(api: &Api<Lease>, config: &LeaseConfig) {
    let Ok(Some(mut lease)) = api.get_opt(&config.name).await else {
        return;
    };
    let Some(spec) = lease.spec.as_mut() else {
        return;
    };
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now_micro());
    match api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => tracing::info!(identity = %config.identity, "released the lease"),
        Err(e) => {
            tracing::warn!(error = %e, "could not release the lease; another replica takes over when it expires")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: &str, renew_secs: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(Timestamp::from_second(renew_secs).unwrap())),
            lease_duration_seconds: Some(duration),
            ..LeaseSpec::default()
        }
    }

    fn config() -> LeaseConfig {
        LeaseConfig {
            name: "splice-leader".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    #[test]
    fn a_leader_past_its_renew_deadline_may_not_write_before_its_election_says_so() {
        let (tx, leading) = Leadership::channel();
        assert!(!leading.now(), "nobody leads before the election");
        let now = Instant::now();
        tx.send_replace(Some(now + Duration::from_secs(10)));
        assert!(leading.now());
        // What a process stopped past its deadline finds on waking: still the flag, no time.
        tx.send_replace(now.checked_sub(Duration::from_millis(1)));
        assert!(!leading.now());
        assert!(Leadership::fixed(true).now());
        assert!(!Leadership::fixed(false).now());
    }

    #[test]
    fn an_absent_or_released_lease_is_acquired_at_once() {
        let mut o = Observer::default();
        let now = Instant::now();
        assert_eq!(o.decide(None, "me", now), Decision::Acquire);
        let released = LeaseSpec {
            holder_identity: Some(String::new()),
            ..record("x", 1, 1)
        };
        assert_eq!(o.decide(Some(&released), "me", now), Decision::Acquire);
    }

    #[test]
    fn our_own_lease_is_renewed() {
        let mut o = Observer::default();
        assert_eq!(
            o.decide(Some(&record("me", 1, 15)), "me", Instant::now()),
            Decision::Renew
        );
    }

    #[test]
    fn a_live_holder_is_followed_until_its_record_stops_changing_for_the_lease_duration() {
        let mut o = Observer::default();
        let t0 = Instant::now();
        assert_eq!(
            o.decide(Some(&record("other", 100, 15)), "me", t0),
            Decision::Follow
        );
        // The holder keeps renewing: each new record restarts the clock.
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(
            o.decide(Some(&record("other", 110, 15)), "me", t1),
            Decision::Follow
        );
        let t2 = t1 + Duration::from_secs(14);
        assert_eq!(
            o.decide(Some(&record("other", 110, 15)), "me", t2),
            Decision::Follow
        );
        let t3 = t1 + Duration::from_secs(15);
        assert_eq!(
            o.decide(Some(&record("other", 110, 15)), "me", t3),
            Decision::Acquire
        );
    }

    #[test]
    fn a_stale_renew_time_alone_does_not_expire_a_lease_we_just_started_watching() {
        // renewTime is from the holder's clock, which may be skewed; only our own clock counts.
        let mut o = Observer::default();
        assert_eq!(
            o.decide(Some(&record("other", 0, 15)), "me", Instant::now()),
            Decision::Follow
        );
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let c = config();
        let taken = acquired(
            Some(&LeaseSpec {
                lease_transitions: Some(3),
                ..record("other", 1, 15)
            }),
            &c,
        );
        assert_eq!(taken.holder_identity.as_deref(), Some("me"));
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.lease_duration_seconds, Some(15));
        let again = acquired(
            Some(&LeaseSpec {
                lease_transitions: Some(4),
                ..record("me", 1, 15)
            }),
            &c,
        );
        assert_eq!(again.lease_transitions, Some(4));
        assert_eq!(acquired(None, &c).lease_transitions, Some(0));
    }

    #[test]
    fn a_renew_deadline_not_shorter_than_the_lease_is_refused() {
        let mut c = config();
        assert!(c.validate().is_ok());
        c.renew_deadline = c.lease_duration;
        assert!(matches!(
            c.validate(),
            Err(LeaseConfigError::RenewNotShorter { .. })
        ));
        let mut c = config();
        c.retry_period = c.renew_deadline;
        assert!(matches!(
            c.validate(),
            Err(LeaseConfigError::RetryNotShorter { .. })
        ));
    }
}
