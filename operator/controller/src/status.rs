//! Which field manager owns which part of a policy's status, declared once, and the one writer of
//! a slice ([`Writer`]). Each owner applies its own slice by server-side apply under its own
//! manager, so none removes or reverts another's fields; before comparing, each keeps only its own
//! slice of what it read, with what it wrote that the cache does not show yet ([`Memory`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use splice_crds::{InjectionPolicy, InjectionPolicyStatus, MANAGER, condition};
use std::time::Instant;

use crate::leader::Leadership;

/// The field manager of `status.coverage` and the OverridesAccepted condition.
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
    /// `status.coverage` and the OverridesAccepted condition.
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
            condition::OVERRIDES_ACCEPTED => Owner::Coverage,
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

    /// This owner's slice of `status` (empty without a status).
    pub fn slice(self, status: Option<&InjectionPolicyStatus>) -> InjectionPolicyStatus {
        let mut own = status.cloned().unwrap_or_default();
        self.keep_own(&mut own);
        own
    }

    /// `status` with this owner's slice replaced by `own`'s; the other owners' slices stay.
    pub fn overlay(
        self,
        status: Option<&InjectionPolicyStatus>,
        own: &InjectionPolicyStatus,
    ) -> InjectionPolicyStatus {
        let mut own = own.clone();
        self.keep_own(&mut own);
        let mut out = status.cloned().unwrap_or_default();
        out.conditions
            .retain(|c| Owner::of_condition(&c.type_) != self);
        let others = std::mem::take(&mut out.conditions);
        match self {
            Owner::Reconcile => {
                let kept = (out.coverage.take(), out.probe.take(), out.rollout.take());
                out = own;
                (out.coverage, out.probe, out.rollout) = kept;
                out.conditions.extend(others);
            }
            Owner::Coverage | Owner::Probe | Owner::Rollout => {
                match self {
                    Owner::Coverage => out.coverage = own.coverage,
                    Owner::Probe => out.probe = own.probe,
                    _ => out.rollout = own.rollout,
                }
                out.conditions = others;
                out.conditions.extend(own.conditions);
            }
        }
        out
    }
}

/// How long a write is trusted over a cache that does not show it. The watch shows a write within
/// a second; past this the cache is the truth again (someone else changed the slice since).
pub const CATCH_UP: Duration = Duration::from_secs(30);

/// What one owner wrote per policy, kept until the cache shows it, so a pass right after a write
/// compares with the write rather than with the cache's older copy and does not write again.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    written: HashMap<String, Written>,
}

#[derive(Clone, Debug)]
struct Written {
    uid: Option<String>,
    /// The slice as the API server stored it; `None` once the cache has shown it.
    slice: Option<InjectionPolicyStatus>,
    at: Instant,
}

impl Memory {
    /// Remembers that `slice` (as the API server stored it) was written to `policy` at `at`.
    pub fn wrote(&mut self, policy: &InjectionPolicy, slice: InjectionPolicyStatus, at: Instant) {
        let written = Written {
            uid: policy.uid(),
            slice: Some(slice),
            at,
        };
        self.written.insert(policy.name_any(), written);
    }

    /// What `owner` wrote to `policy` that its cached status does not show yet, if anything. A
    /// write the cache shows, or older than [`CATCH_UP`], is no longer pending.
    pub fn pending(
        &mut self,
        owner: Owner,
        policy: &InjectionPolicy,
        now: Instant,
    ) -> Option<InjectionPolicyStatus> {
        let w = self.written.get_mut(&policy.name_any())?;
        let slice = w.slice.take()?;
        let shown = owner.slice(policy.status.as_ref()) == slice;
        let still = w.uid == policy.uid() && !shown && now.duration_since(w.at) < CATCH_UP;
        still.then(|| {
            w.slice = Some(slice.clone());
            slice
        })
    }

    /// When this replica last wrote `policy`'s slice, shown by the cache or not.
    pub fn written_at(&self, policy: &str) -> Option<Instant> {
        self.written.get(policy).map(|w| w.at)
    }

    /// Forgets the policies `keep` says are gone.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.written.retain(|name, _| keep(name));
    }
}

/// What [`Writer::apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The slice already says this; nothing was sent.
    UpToDate,
    /// This replica no longer leads; nothing was sent.
    NotLeader,
    Written,
}

/// Why a slice was not written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("could not write the {manager} slice of policy {policy}'s status: {source}")]
    Patch {
        policy: String,
        manager: &'static str,
        #[source]
        source: kube::Error,
    },
}

impl WriteError {
    /// A stable label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            WriteError::Patch { .. } => "status_patch",
        }
    }
}

/// The one writer of one owner's slice of policies' status: compares the slice with what is known
/// ([`Memory`]), checks leadership, and applies it under the owner's field manager.
pub struct Writer {
    api: Api<InjectionPolicy>,
    owner: Owner,
    leading: Leadership,
    memory: Mutex<Memory>,
}

impl Writer {
    pub fn new(client: Client, owner: Owner, leading: Leadership) -> Self {
        Writer {
            api: Api::all(client),
            owner,
            leading,
            memory: Mutex::default(),
        }
    }

    pub fn owner(&self) -> Owner {
        self.owner
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The status to compare with: the cached one, with what this writer wrote that the cache
    /// does not show yet in place of its slice.
    pub fn known(&self, policy: &InjectionPolicy) -> Option<InjectionPolicyStatus> {
        match self.memory().pending(self.owner, policy, Instant::now()) {
            Some(slice) => Some(self.owner.overlay(policy.status.as_ref(), &slice)),
            None => policy.status.clone(),
        }
    }

    /// The writes the cache does not show yet, per policy of `policies`; forgets the others.
    pub fn pending(
        &self,
        policies: &[Arc<InjectionPolicy>],
    ) -> HashMap<String, InjectionPolicyStatus> {
        let mut memory = self.memory();
        let names: std::collections::HashSet<String> =
            policies.iter().map(|p| p.name_any()).collect();
        memory.retain(|n| names.contains(n));
        let now = Instant::now();
        policies
            .iter()
            .filter_map(|p| Some((p.name_any(), memory.pending(self.owner, p, now)?)))
            .collect()
    }

    /// When this writer last wrote `policy`'s slice (the rollout's throttle).
    pub fn written_at(&self, policy: &str) -> Option<Instant> {
        self.memory().written_at(policy)
    }

    /// Applies `slice` (this owner's part of it) to `policy` unless the known status already
    /// holds it, and only while this replica leads.
    pub async fn apply(
        &self,
        policy: &InjectionPolicy,
        slice: &InjectionPolicyStatus,
    ) -> Result<Outcome, WriteError> {
        let slice = self.owner.slice(Some(slice));
        let known = self.known(policy);
        if self.owner.slice(known.as_ref()) == slice {
            return Ok(Outcome::UpToDate);
        }
        if !self.leading.now() {
            return Ok(Outcome::NotLeader);
        }
        let name = policy.name_any();
        let manager = self.owner.manager();
        // Server-side apply of the whole slice: a field this manager set before and omits now is
        // removed, which a merge patch would not do.
        let patch = serde_json::json!({
            "apiVersion": InjectionPolicy::api_version(&()),
            "kind": InjectionPolicy::kind(&()),
            "status": slice,
        });
        let stored = self
            .api
            .patch_status(
                &name,
                &PatchParams::apply(manager).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(|source| WriteError::Patch {
                policy: name,
                manager,
                source,
            })?;
        // What the server stored is what the cache will show (times in whole seconds).
        let stored = match stored.status {
            Some(s) => self.owner.slice(Some(&s)),
            None => slice,
        };
        self.memory().wrote(policy, stored, Instant::now());
        Ok(Outcome::Written)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use http::{Request, Response};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use kube::client::Body;
    use serde_json::{Value, json};
    use splice_crds::{Coverage, ProbeStatus, RolloutStatus};
    use tower_test::mock;

    /// (method, path?query, body) of every request.
    pub(crate) type Requests = Arc<Mutex<Vec<(String, String, Value)>>>;

    /// An API server that stores nothing and answers every write with what was sent.
    pub(crate) fn fake_api(seen: Requests) -> Client {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        tokio::spawn(async move {
            let mut handle = std::pin::pin!(handle);
            while let Some((request, send)) = handle.next_request().await {
                let method = request.method().to_string();
                let uri = request.uri().to_string();
                let body = request.into_body().collect_bytes().await.unwrap();
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let answer = if uri.contains("/status") {
                    json!({"apiVersion": "splice.dev/v1alpha1", "kind": "InjectionPolicy",
                        "metadata": {"name": "mesh", "uid": "u1", "resourceVersion": "6"},
                        "spec": {}, "status": body["status"]})
                } else {
                    body.clone()
                };
                seen.lock().unwrap().push((method, uri, body));
                let bytes = serde_json::to_vec(&answer).unwrap();
                send.send_response(
                    Response::builder()
                        .status(200)
                        .body(Body::from(bytes))
                        .unwrap(),
                );
            }
        });
        Client::new(service, "default")
    }

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

    fn policy(uid: &str, coverage: Option<Coverage>) -> InjectionPolicy {
        let mut p = InjectionPolicy::new("p", Default::default());
        p.metadata.uid = Some(uid.into());
        p.status = Some(InjectionPolicyStatus {
            coverage,
            ..Default::default()
        });
        p
    }

    fn counted(matched: i64) -> InjectionPolicyStatus {
        InjectionPolicyStatus {
            coverage: Some(Coverage {
                matched,
                ..Coverage::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_write_is_known_until_the_cache_shows_it_then_the_cache_is_the_truth() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(1);
        let mut m = Memory::default();
        let before = policy("u", counted(1).coverage);
        m.wrote(&before, counted(2), t0);
        assert_eq!(m.pending(Owner::Coverage, &before, later), Some(counted(2)));
        let shown = policy("u", counted(2).coverage);
        assert_eq!(m.pending(Owner::Coverage, &shown, later), None);
        // Once shown, a later change by someone else is the truth, not the old write.
        assert_eq!(m.pending(Owner::Coverage, &before, later), None);
        assert_eq!(m.written_at("p"), Some(t0), "the throttle still knows when");
    }

    #[test]
    fn a_write_the_cache_never_shows_is_trusted_only_until_catch_up() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        let before = policy("u", None);
        m.wrote(&before, counted(2), t0);
        let almost = t0 + CATCH_UP - Duration::from_millis(1);
        assert_eq!(
            m.pending(Owner::Coverage, &before, almost),
            Some(counted(2))
        );
        assert_eq!(m.pending(Owner::Coverage, &before, t0 + CATCH_UP), None);
    }

    #[test]
    fn a_write_to_an_object_deleted_and_created_again_is_forgotten() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        m.wrote(&policy("old", None), counted(2), t0);
        assert_eq!(m.pending(Owner::Coverage, &policy("new", None), t0), None);
    }

    #[test]
    fn an_overlay_replaces_only_its_owners_slice() {
        let mut verified = full();
        verified.conditions[1].reason = "NotInjected".into();
        verified.probe = Some(ProbeStatus {
            result: "NotInjected".into(),
            ..ProbeStatus::default()
        });
        let own = Owner::Probe.slice(Some(&verified));
        let s = Owner::Probe.overlay(Some(&full()), &own);
        assert_eq!(
            types(&s),
            [condition::READY, condition::ROLLED_OUT, condition::VERIFIED]
        );
        assert_eq!(s.conditions[2].reason, "NotInjected");
        assert_eq!(s.probe, verified.probe);
        assert_eq!(s.template_hash.as_deref(), Some("h"));
        assert!(s.coverage.is_some() && s.rollout.is_some());

        let mut ready = full();
        ready.template_hash = Some("h2".into());
        ready.coverage = None;
        let s = Owner::Reconcile.overlay(Some(&full()), &Owner::Reconcile.slice(Some(&ready)));
        assert_eq!(s.template_hash.as_deref(), Some("h2"));
        assert_eq!(
            types(&s),
            [condition::READY, condition::VERIFIED, condition::ROLLED_OUT]
        );
        assert!(s.coverage.is_some() && s.probe.is_some() && s.rollout.is_some());
    }

    fn rolled_out(revision: &str) -> InjectionPolicyStatus {
        let mut s = full();
        Owner::Rollout.keep_own(&mut s);
        s.rollout = Some(RolloutStatus {
            revision: revision.into(),
            ..RolloutStatus::default()
        });
        s
    }

    #[tokio::test]
    async fn a_rollout_slice_is_applied_whole_under_its_manager_and_not_again_until_it_changes() {
        let requests = Requests::default();
        let client = fake_api(Arc::clone(&requests));
        let writer = Writer::new(client, Owner::Rollout, Leadership::fixed(true));
        let mut p = policy("u1", None);
        p.metadata.name = Some("mesh".into());
        p.status = Some(full());
        let slice = rolled_out("r2");
        assert_eq!(writer.apply(&p, &slice).await.unwrap(), Outcome::Written);
        // The cache still holds the old status: the write is known, nothing is sent again.
        assert_eq!(writer.apply(&p, &slice).await.unwrap(), Outcome::UpToDate);
        let sent = requests.lock().unwrap().clone();
        let [(method, uri, body)] = sent.as_slice() else {
            panic!("one request: {sent:?}")
        };
        assert_eq!(method, "PATCH");
        assert!(uri.contains("fieldManager=splice-rollout") && uri.contains("force=true"));
        assert_eq!(body["status"], serde_json::to_value(&slice).unwrap());
        assert_eq!(body["status"]["conditions"].as_array().unwrap().len(), 1);
        let known = writer.known(&p).unwrap();
        assert_eq!(known.rollout.unwrap().revision, "r2");
        assert_eq!(
            known.template_hash.as_deref(),
            Some("h"),
            "others' fields stay"
        );
        assert!(writer.written_at("mesh").is_some(), "the throttle's clock");
    }

    #[tokio::test]
    async fn a_writer_that_does_not_lead_sends_nothing() {
        let requests = Requests::default();
        let client = fake_api(Arc::clone(&requests));
        let writer = Writer::new(client, Owner::Coverage, Leadership::fixed(false));
        let p = policy("u1", None);
        assert_eq!(
            writer.apply(&p, &counted(1)).await.unwrap(),
            Outcome::NotLeader
        );
        assert!(requests.lock().unwrap().is_empty());
    }
}
