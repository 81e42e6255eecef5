//! The signer's decisions, a [`Loop`] under the shared driver: each pass decides every pending
//! request from one snapshot (the requests, the CA Secret and the trust bundle from the signer's
//! own caches, the pods from the leader's view) and signs the ones it issues right there, off the
//! async workers; [`super`] only writes what it decided. State is plain data: which requests this
//! replica answered or must retry, the service accounts it read, the intermediate.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::certificates::v1beta1::{
    ClusterTrustBundle, PodCertificateRequest, PodCertificateRequestStatus,
};
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use splice_crds::InjectionPolicy;
use splice_engine::{CompiledPolicy, Exclusions};
use time::OffsetDateTime;

use super::decide::{self, DENIED, Decision, FAILED, Scope};
use super::sign::{self, Intermediate};
use super::{BUNDLE_PERIOD, Config, IdentityError, PERIOD, bundle};
use crate::certs::rotation::{CaState, ca_state};
use crate::driver::{Loop, Now, Pass, Snapshot, Write};
use crate::metrics::Metrics;
use crate::retry::backoff;
use crate::status::Owner;
use crate::view::PodRecord;

/// How long an answer this replica wrote is trusted while the watch does not show it yet.
const REMEMBER: Duration = Duration::from_secs(300);
/// Pods read per pass for their service account, so a burst of new pods spreads over ticks.
const MAX_LOOKS: usize = 64;
/// A request waiting longer than this counts as old in `splice_identity_pending_requests`.
const OLD_SECONDS: i64 = 30;

/// What a pass reads besides the view, copied from the signer's caches at each tick.
#[derive(Clone, Default)]
pub struct Extra {
    pub requests: Vec<Arc<PodCertificateRequest>>,
    /// Splice's CA Secret (`None`: not listed or not created yet).
    pub ca: Option<Arc<Secret>>,
    /// The trust bundle as published (`None`: absent).
    pub bundle: Option<Arc<ClusterTrustBundle>>,
}

pub type View = Snapshot<Extra>;

/// One answer to write: the request as read (its resourceVersion makes a second leader's write a
/// conflict), the status, and what follows it.
#[derive(Debug)]
pub struct Answer {
    pub request: Arc<PodCertificateRequest>,
    pub status: PodCertificateRequestStatus,
    /// `issued`, `denied` or `failed` (the metric's label).
    pub outcome: &'static str,
    /// For a denial of a pod that exists: the Warning Event on it.
    pub denied: Option<Denial>,
    /// What the log says once it is written (never the request or the key).
    pub note: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Denial {
    pub pod: ObjectReference,
    pub reason: &'static str,
    pub message: String,
}

#[derive(Debug)]
pub enum Act {
    Answer(Box<Answer>),
    /// The trust bundle as it should be, applied when it differs.
    Bundle(Box<ClusterTrustBundle>),
}

/// A pod to read for its service account (the view's metadata-only records lack it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Look {
    /// The request waiting for it (its UID).
    pub request: String,
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
}

/// What an act or a look came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    Answered {
        request: String,
        outcome: &'static str,
        latency: Option<Duration>,
    },
    /// The request changed since it was read (another leader answered): the watch will say.
    Conflict {
        request: String,
    },
    Failed {
        request: String,
    },
    Bundle,
    /// `account`: the pod's service account; `None` when the pod could not be read as the
    /// request names it.
    Account {
        request: String,
        pod_uid: String,
        account: Option<String>,
    },
}

/// The signer's state across the ticks of one term.
pub struct Signer {
    config: Config,
    exclusions: Exclusions,
    intermediate: Option<Intermediate>,
    /// Requests this replica answered (or saw answered by a conflict), by UID, until the watch
    /// shows the answer.
    answered: HashMap<String, Instant>,
    /// Requests whose last attempt failed: failures and when to try again.
    retry: HashMap<String, (u32, Instant)>,
    /// Service accounts read from the pods, by pod UID (immutable for a pod's life).
    accounts: HashMap<String, String>,
    last_bundle: Option<Instant>,
    /// Why the CA cannot sign, as last logged (logged again only when it changes).
    ca_problem: Option<String>,
    /// (young, old) pending requests, until published.
    gauges: Option<(i64, i64)>,
    /// Answers written since the last publish: outcome and latency.
    outcomes: Vec<(&'static str, Option<Duration>)>,
}

impl Signer {
    pub fn new(config: Config) -> Self {
        Signer {
            exclusions: Exclusions::default_for(&config.splice_namespace),
            config,
            intermediate: None,
            answered: HashMap::new(),
            retry: HashMap::new(),
            accounts: HashMap::new(),
            last_bundle: None,
            ca_problem: None,
            gauges: None,
            outcomes: Vec::new(),
        }
    }

    /// The CA to sign under; `None` (logged once per problem) when the Secret is absent or
    /// unreadable.
    fn ca(&mut self, view: &View) -> Option<CaState> {
        let state = match view.extra.ca.as_deref() {
            Some(secret) => ca_state(secret).map_err(|e| format!("{e} ({})", e.label())),
            None => Err("the CA Secret does not exist yet".to_owned()),
        };
        match state {
            Ok(ca) => {
                self.ca_problem = None;
                Some(ca)
            }
            Err(problem) => {
                if self.ca_problem.as_ref() != Some(&problem) {
                    tracing::warn!(%problem, "identity signer: the CA cannot sign");
                    self.ca_problem = Some(problem);
                }
                None
            }
        }
    }

    /// Decides (and signs) each pending request not waiting for a retry.
    fn answer_all(
        &mut self,
        view: &View,
        ca: &CaState,
        pending: &[&Arc<PodCertificateRequest>],
        now: Now,
        pass: &mut Pass<Look, Act>,
    ) {
        let pods: HashMap<(&str, &str), &PodRecord> = view
            .pods
            .iter()
            .map(|p| ((&*p.namespace, p.name.as_str()), &**p))
            .collect();
        let live: HashSet<&str> = pods.values().map(|p| p.uid.as_str()).collect();
        self.accounts.retain(|uid, _| live.contains(uid.as_str()));
        let compiled: Vec<Option<Arc<CompiledPolicy>>> = view
            .policies
            .iter()
            .map(|p| view.in_force_of(&p.name_any()))
            .collect();
        let policies: Vec<(&InjectionPolicy, Option<&CompiledPolicy>)> = view
            .policies
            .iter()
            .zip(&compiled)
            .map(|(p, c)| (&**p, c.as_deref()))
            .collect();
        let scope = Scope {
            trust_domain: &self.config.trust_domain,
            max_lifetime_seconds: self.config.max_lifetime_seconds,
            exclusions: &self.exclusions,
            namespaces: &view.namespaces,
            policies: &policies,
        };
        for pcr in pending {
            let uid = pcr.uid().unwrap_or_default();
            if self.retry.get(&uid).is_some_and(|(_, at)| now.at < *at) {
                continue;
            }
            let ns = pcr.namespace().unwrap_or_default();
            let pod = pods
                .get(&(ns.as_str(), pcr.spec.pod_name.as_str()))
                .copied();
            let (pod, look) = with_account(&self.accounts, pod, pcr, &uid);
            let decision = decide::decide(pcr, pod.as_deref(), &scope, now.wall.as_second());
            if matches!(decision, Decision::Leave) {
                continue;
            }
            // Only an issue depends on the service account assumed: read it first.
            if let (Some(look), Decision::Issue(_)) = (look, &decision) {
                let asked = pass.looks.iter().any(|l| l.pod_uid == look.pod_uid);
                if !asked && pass.looks.len() < MAX_LOOKS {
                    pass.looks.push(look);
                }
                continue;
            }
            let signed = answer(
                &mut self.intermediate,
                &self.config,
                ca,
                pcr,
                pod.as_deref(),
                decision,
                now,
            );
            match signed {
                Ok(a) => pass.acts.push(Act::Answer(Box::new(a))),
                Err(e) => {
                    tracing::warn!(request = %uid, error = %e, label = e.label(), "identity request not answered");
                    back_off(&mut self.retry, &uid, now.at);
                }
            }
        }
    }

    /// The trust bundle as it should be: the CA's roots, and each published root a live issued
    /// certificate still chains to.
    fn bundle(view: &View, ca: &CaState, now: Now) -> ClusterTrustBundle {
        let published = view
            .extra
            .bundle
            .as_ref()
            .map_or("", |b| b.spec.trust_bundle.as_str());
        let issued: Vec<bundle::Chained> = view
            .extra
            .requests
            .iter()
            .filter_map(|r| bundle::chained(r))
            .collect();
        let roots = bundle::roots(&ca.bundle(), published, &issued, now.wall.as_second());
        bundle::desired(&roots)
    }
}

/// `pod` with its service account: the record's, or the one read before. When neither knows
/// it, the request's is assumed, with the look that reads the pod's own. A missing pod or another
/// UID goes to `decide` as it is (PodNotFound).
fn with_account<'a>(
    accounts: &HashMap<String, String>,
    pod: Option<&'a PodRecord>,
    pcr: &PodCertificateRequest,
    request: &str,
) -> (Option<Cow<'a, PodRecord>>, Option<Look>) {
    let Some(found) = pod.filter(|p| p.uid == pcr.spec.pod_uid) else {
        return (pod.map(Cow::Borrowed), None);
    };
    if !found.service_account.is_empty() {
        return (Some(Cow::Borrowed(found)), None);
    }
    let mut known = found.clone();
    let look = match accounts.get(&found.uid) {
        Some(account) => {
            known.service_account.clone_from(account);
            None
        }
        None => {
            known
                .service_account
                .clone_from(&pcr.spec.service_account_name);
            Some(Look {
                request: request.to_owned(),
                namespace: found.namespace.to_string(),
                pod: found.name.clone(),
                pod_uid: found.uid.clone(),
            })
        }
    };
    (Some(Cow::Owned(known)), look)
}

fn back_off(retry: &mut HashMap<String, (u32, Instant)>, request: &str, now: Instant) {
    let entry = retry.entry(request.to_owned()).or_insert((0, now));
    entry.0 = entry.0.saturating_add(1);
    entry.1 = now + backoff(entry.0);
}

/// The answer to write for `decision`, signed when it issues.
fn answer(
    intermediate: &mut Option<Intermediate>,
    config: &Config,
    ca: &CaState,
    pcr: &Arc<PodCertificateRequest>,
    pod: Option<&PodRecord>,
    decision: Decision,
    now: Now,
) -> Result<Answer, IdentityError> {
    let at = now.wall.as_second();
    let request = pcr.name_any();
    let (status, outcome, note, denied) = match decision {
        Decision::Deny { reason, message } => {
            let status = decide::refused_status(pcr, DENIED, reason, &message, at);
            let denied = pod.map(|p| Denial {
                pod: pod_ref(p),
                reason,
                message: message.clone(),
            });
            (
                status,
                "denied",
                format!("denied {request}: {reason}: {message}"),
                denied,
            )
        }
        Decision::Fail { reason, message } => {
            let status = decide::refused_status(pcr, FAILED, reason, &message, at);
            (
                status,
                "failed",
                format!("failed {request}: {reason}: {message}"),
                None,
            )
        }
        // `answer_all` never answers these.
        Decision::Leave => return Err(IdentityError::NotOurs),
        Decision::Issue(issue) => {
            let chain = sign_leaf(intermediate, config, ca, &issue, at)?;
            let note = format!("issued {} to {request}", issue.spiffe_id);
            (
                decide::issued_status(pcr, &issue, chain, at),
                "issued",
                note,
                None,
            )
        }
    };
    Ok(Answer {
        request: Arc::clone(pcr),
        status,
        outcome,
        denied,
        note,
    })
}

/// Signs `issue` under the intermediate, made anew when the active CA changed or when it could
/// not cover a leaf of the longest lifetime (with an hour to spare).
fn sign_leaf(
    intermediate: &mut Option<Intermediate>,
    config: &Config,
    ca: &CaState,
    issue: &decide::Issue,
    at: i64,
) -> Result<String, IdentityError> {
    let offset =
        |s: i64| OffsetDateTime::from_unix_timestamp(s).map_err(|_| IdentityError::Time(s));
    let now = offset(at)?;
    let until = offset(at + config.max_lifetime_seconds + 3600)?;
    let current = match intermediate.take() {
        Some(i) if i.serves(&ca.active, until) => i,
        _ => Intermediate::new(&ca.active, &config.trust_domain, now)?,
    };
    let intermediate = intermediate.insert(current);
    let key = sign::subject_key(&issue.spki)?;
    Ok(intermediate.issue(
        &key,
        sign::is_rsa(&issue.spki),
        &issue.spiffe_id,
        offset(issue.not_before)?,
        offset(issue.not_after)?,
    )?)
}

fn pod_ref(pod: &PodRecord) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(pod.namespace.to_string()),
        name: Some(pod.name.clone()),
        uid: Some(pod.uid.clone()),
        ..ObjectReference::default()
    }
}

/// (young, old): pending requests at most [`OLD_SECONDS`] old, and older.
fn ages(pending: &[&Arc<PodCertificateRequest>], now: Timestamp) -> (i64, i64) {
    let old = pending
        .iter()
        .filter(|r| {
            r.metadata
                .creation_timestamp
                .as_ref()
                .is_some_and(|t| now.as_second() - t.0.as_second() > OLD_SECONDS)
        })
        .count();
    let old = i64::try_from(old).unwrap_or(i64::MAX);
    let all = i64::try_from(pending.len()).unwrap_or(i64::MAX);
    (all - old, old)
}

impl Loop for Signer {
    const NAME: &'static str = "identity";
    /// It writes no policy status (its writes are acts): the writer it is given stays unused.
    const OWNER: Owner = Owner::Coverage;
    const PODS: bool = true;
    type Look = Look;
    type Act = Act;
    type Seen = Seen;
    type Io = super::Io;
    type Extra = Extra;

    fn period(&self) -> Duration {
        PERIOD
    }

    fn pass(&mut self, view: &View, now: Now) -> Pass<Look, Act> {
        self.answered
            .retain(|_, at| now.at.duration_since(*at) < REMEMBER);
        let pending: Vec<&Arc<PodCertificateRequest>> = view
            .extra
            .requests
            .iter()
            .filter(|r| {
                decide::is_pending(r) && !self.answered.contains_key(&r.uid().unwrap_or_default())
            })
            .collect();
        self.gauges = Some(ages(&pending, now.wall));
        // A request deleted or answered meanwhile needs no more retries.
        if !self.retry.is_empty() {
            let waiting: HashSet<String> = pending.iter().filter_map(|r| r.uid()).collect();
            self.retry.retain(|uid, _| waiting.contains(uid));
        }
        let bundle_due = self
            .last_bundle
            .is_none_or(|at| now.at.duration_since(at) >= BUNDLE_PERIOD);
        let mut pass = Pass::default();
        if pending.is_empty() && !bundle_due {
            return pass;
        }
        let Some(ca) = self.ca(view) else {
            return pass;
        };
        if !pending.is_empty() {
            self.answer_all(view, &ca, &pending, now, &mut pass);
        }
        if bundle_due {
            self.last_bundle = Some(now.at);
            let desired = Self::bundle(view, &ca, now);
            pass.acts.push(Act::Bundle(Box::new(desired)));
        }
        pass
    }

    async fn ready(io: &super::Io) -> bool {
        super::ready(io).await
    }

    fn extra(io: &super::Io) -> Extra {
        super::extra(io)
    }

    async fn look(io: &super::Io, _view: &View, looks: Vec<Look>) -> Vec<Seen> {
        super::look(io, looks).await
    }

    async fn act(io: &super::Io, act: Act) -> Seen {
        super::act(io, act).await
    }

    /// Remembers what was answered (by this replica or, on a conflict, by another) and backs
    /// off what failed.
    fn judge(&mut self, _view: &View, seen: Vec<Seen>, now: Now) -> Vec<Write> {
        for s in seen {
            match s {
                Seen::Answered {
                    request,
                    outcome,
                    latency,
                } => {
                    self.retry.remove(&request);
                    self.answered.insert(request, now.at);
                    self.outcomes.push((outcome, latency));
                }
                Seen::Conflict { request } => {
                    self.retry.remove(&request);
                    self.answered.insert(request, now.at);
                }
                Seen::Account {
                    pod_uid,
                    account: Some(account),
                    ..
                } => {
                    self.accounts.insert(pod_uid, account);
                }
                Seen::Failed { request } | Seen::Account { request, .. } => {
                    back_off(&mut self.retry, &request, now.at);
                }
                Seen::Bundle => {}
            }
        }
        Vec::new()
    }

    fn failed(&mut self, _policy: &str, _now: Now) {}

    fn publish(&mut self, metrics: &Metrics) {
        metrics.set_identity_available(true);
        if let Some((young, old)) = self.gauges.take() {
            metrics.set_identity_pending(young, old);
        }
        for (outcome, latency) in self.outcomes.drain(..) {
            metrics.observe_identity(outcome, latency);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::certs::ca::split_bundle;
    use crate::certs::rotation::ca_secret;
    use crate::identity::decide::tests::{NOW, pod, policy, request};
    use crate::identity::decide::{DEFAULT_MAX_LIFETIME_SECONDS, ISSUED};
    use crate::identity::sign::tests::root;

    fn signer() -> Signer {
        Signer::new(Config {
            trust_domain: "cluster.local".into(),
            splice_namespace: "splice-system".into(),
            max_lifetime_seconds: DEFAULT_MAX_LIFETIME_SECONDS,
        })
    }

    /// One pending request for [`pod`] (given as `pods`), `mesh` Ready and served, and a CA
    /// made with rcgen.
    fn view(pods: Vec<PodRecord>) -> View {
        let (policy, compiled) = policy(86_400, true);
        let ca = CaState::fresh(root());
        Snapshot {
            policies: vec![Arc::new(policy)],
            served: BTreeMap::from([("mesh".to_owned(), Arc::new(compiled))]),
            pods: Arc::new(pods.into_iter().map(Arc::new).collect()),
            extra: Extra {
                requests: vec![Arc::new(request())],
                ca: Some(Arc::new(ca_secret("splice-system", &ca))),
                bundle: None,
            },
            ..Snapshot::default()
        }
    }

    fn at(base: Instant, seconds: u64) -> Now {
        Now {
            at: base + Duration::from_secs(seconds),
            wall: Timestamp::from_second(NOW + i64::try_from(seconds).unwrap()).unwrap(),
        }
    }

    fn answers(pass: &Pass<Look, Act>) -> Vec<&Answer> {
        pass.acts
            .iter()
            .filter_map(|a| match a {
                Act::Answer(a) => Some(&**a),
                Act::Bundle(_) => None,
            })
            .collect()
    }

    fn bundles(pass: &Pass<Look, Act>) -> usize {
        pass.acts
            .iter()
            .filter(|a| matches!(a, Act::Bundle(_)))
            .count()
    }

    fn written(a: &Answer) -> Seen {
        Seen::Answered {
            request: a.request.uid().unwrap(),
            outcome: a.outcome,
            latency: None,
        }
    }

    #[test]
    fn one_pending_request_gives_exactly_one_answer_signed_under_the_intermediate() {
        let (mut s, view, base) = (signer(), view(vec![pod()]), Instant::now());
        let pass = s.pass(&view, at(base, 0));
        let all = answers(&pass);
        let [answer] = all.as_slice() else {
            panic!("one answer: {:?}", pass.acts)
        };
        assert_eq!(answer.outcome, "issued");
        assert_eq!(answer.request.resource_version().as_deref(), Some("7"));
        let conditions = answer.status.conditions.clone().unwrap_or_default();
        assert_eq!(conditions[0].type_, ISSUED);
        let chain = split_bundle(answer.status.certificate_chain.as_deref().unwrap());
        assert_eq!(chain.len(), 2, "leaf then intermediate");
        assert!(answer.denied.is_none());
    }

    #[test]
    fn a_request_answered_here_or_by_another_leader_is_never_answered_again() {
        for conflict in [false, true] {
            let (mut s, view, base) = (signer(), view(vec![pod()]), Instant::now());
            let pass = s.pass(&view, at(base, 0));
            let answer = answers(&pass)[0];
            // A second leader wrote first: the write under the resourceVersion read conflicts.
            let seen = if conflict {
                Seen::Conflict {
                    request: answer.request.uid().unwrap(),
                }
            } else {
                written(answer)
            };
            assert!(s.judge(&view, vec![seen], at(base, 0)).is_empty());
            // The cache still shows the request pending: no second certificate.
            for t in 1..5 {
                assert!(answers(&s.pass(&view, at(base, t))).is_empty());
            }
        }
    }

    #[test]
    fn a_failed_write_is_tried_again_after_its_backoff() {
        let (mut s, view, base) = (signer(), view(vec![pod()]), Instant::now());
        let request = answers(&s.pass(&view, at(base, 0)))[0]
            .request
            .uid()
            .unwrap();
        s.judge(&view, vec![Seen::Failed { request }], at(base, 0));
        assert!(answers(&s.pass(&view, at(base, 0))).is_empty());
        assert_eq!(answers(&s.pass(&view, at(base, 60))).len(), 1);
    }

    #[test]
    fn the_bundle_act_comes_at_most_once_per_thirty_seconds() {
        let (mut s, view, base) = (signer(), view(vec![pod()]), Instant::now());
        let counts: Vec<usize> = [0, 1, 15, 29, 30, 31, 59, 60]
            .into_iter()
            .map(|t| bundles(&s.pass(&view, at(base, t))))
            .collect();
        assert_eq!(counts, vec![1, 0, 0, 0, 1, 0, 0, 1]);
        let pass = s.pass(&view, at(base, 90));
        let Some(Act::Bundle(b)) = pass.acts.last() else {
            panic!("a bundle")
        };
        let ca = ca_state(view.extra.ca.as_deref().unwrap()).unwrap();
        assert_eq!(b.spec.trust_bundle, ca.bundle());
    }

    /// A view whose pod record lacks its service account, as the metadata-only watch has it.
    fn metadata_only() -> View {
        let mut p = pod();
        p.service_account.clear();
        view(vec![p])
    }

    /// The first pass answers nothing and reads the pod; the read says `account`.
    fn read_as(s: &mut Signer, view: &View, base: Instant, account: &str) {
        let pass = s.pass(view, at(base, 0));
        assert!(answers(&pass).is_empty());
        let [look] = pass.looks.as_slice() else {
            panic!("one look: {:?}", pass.looks)
        };
        assert_eq!(
            (look.pod.as_str(), look.pod_uid.as_str()),
            ("web-1", "pod-1")
        );
        let seen = Seen::Account {
            request: look.request.clone(),
            pod_uid: look.pod_uid.clone(),
            account: Some(account.into()),
        };
        s.judge(view, vec![seen], at(base, 1));
    }

    #[test]
    fn a_pod_whose_service_account_the_view_lacks_is_read_once_then_answered() {
        let (mut s, view, base) = (signer(), metadata_only(), Instant::now());
        read_as(&mut s, &view, base, "web-sa");
        let pass = s.pass(&view, at(base, 1));
        assert!(pass.looks.is_empty());
        assert_eq!(answers(&pass)[0].outcome, "issued");
    }

    #[test]
    fn a_pod_no_policy_selects_is_denied_without_reading_its_service_account() {
        let mut unselected = pod();
        unselected.service_account.clear();
        unselected.labels.clear();
        let pass = signer().pass(&view(vec![unselected]), at(Instant::now(), 0));
        assert!(pass.looks.is_empty());
        assert_eq!(answers(&pass)[0].outcome, "denied");
    }

    #[test]
    fn a_pod_whose_service_account_differs_from_the_one_read_is_denied() {
        let (mut s, view, base) = (signer(), metadata_only(), Instant::now());
        read_as(&mut s, &view, base, "admin");
        let pass = s.pass(&view, at(base, 1));
        let denial = answers(&pass)[0].denied.clone().unwrap();
        assert_eq!(denial.reason, "ServiceAccountMismatch");
    }

    #[test]
    fn a_denial_names_the_pod_for_its_warning_and_a_missing_pod_has_none() {
        let mut other = pod();
        other.labels.clear();
        let (mut s, base) = (signer(), Instant::now());
        let pass = s.pass(&view(vec![other]), at(base, 0));
        let denial = answers(&pass)[0].denied.clone().unwrap();
        assert_eq!(denial.reason, "NotSelected");
        assert_eq!(denial.pod.name.as_deref(), Some("web-1"));
        assert_eq!(denial.pod.uid.as_deref(), Some("pod-1"));
        let pass = signer().pass(&view(Vec::new()), at(base, 0));
        let answer = answers(&pass)[0];
        assert_eq!(answer.outcome, "denied");
        assert!(answer.denied.is_none());
    }

    #[test]
    fn without_a_ca_nothing_is_answered_or_published() {
        let mut view = view(vec![pod()]);
        view.extra.ca = None;
        let pass = signer().pass(&view, at(Instant::now(), 0));
        assert!(pass.acts.is_empty() && pass.looks.is_empty());
    }
}
