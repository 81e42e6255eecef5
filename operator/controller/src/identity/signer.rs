//! The signer's decisions, a [`Loop`] under the shared driver: each pass decides every pending
//! request from one snapshot (the requests, the CA Secret and the trust bundle from the signer's
//! own caches, the pods from the leader's view) and signs the ones it issues right there, off the
//! async workers; [`super`] only writes what it decided. State is plain data: which requests this
//! replica answered or must retry, the pods it read, the intermediate.

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
/// Pods read per pass (their service account, or a pod the view does not show yet), so a burst
/// of new pods spreads over ticks; the reads go 16 at once.
const MAX_LOOKS: usize = 256;
/// A request waiting longer than this counts as old in `splice_identity_pending_requests`.
const OLD_SECONDS: i64 = 30;

/// What a pass reads besides the view, copied from the signer's caches at each tick.
#[derive(Clone, Default)]
pub struct Extra {
    pub requests: Vec<Arc<PodCertificateRequest>>,
    /// Splice's CA Secret (`None`: not listed or not created yet).
    pub ca: Option<Arc<Secret>>,
    /// This instance's trust bundle as published (`None`: absent).
    pub bundle: Option<Arc<ClusterTrustBundle>>,
    /// Whether the API server serves ClusterTrustBundles at all.
    pub bundles: bool,
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
    /// The pod read for a request: `None` when no pod of that name has the request's UID.
    Pod {
        request: String,
        pod_uid: String,
        pod: Option<Box<PodRecord>>,
    },
}

/// The signer's state across the ticks of one term.
pub struct Signer {
    config: Config,
    exclusions: Exclusions,
    intermediate: Option<Intermediate>,
    /// The active CA's certificate and since when this term has seen it in the published bundle.
    trusted: Option<(String, Instant)>,
    /// This instance's bundle name.
    bundle_name: String,
    /// Requests this replica answered (or saw answered by a conflict), by UID, until the watch
    /// shows the answer.
    answered: HashMap<String, Instant>,
    /// Requests whose last attempt failed: failures and when to try again.
    retry: HashMap<String, (u32, Instant)>,
    /// Pods read, by UID, with their service account (immutable for a pod's life); `None`: no
    /// such pod. A read settles what the view lacks or may show late.
    fetched: HashMap<String, Option<PodRecord>>,
    /// Whether the last judge read pods whose requests the next pass can decide at once.
    read_some: bool,
    last_bundle: Option<Instant>,
    /// The CA Secret's resourceVersion the last bundle was computed from: a new CA is published
    /// at once, not at the next period.
    bundle_ca: Option<String>,
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
            bundle_name: bundle::name(&config.splice_namespace),
            config,
            intermediate: None,
            trusted: None,
            bundle_ca: None,
            answered: HashMap::new(),
            retry: HashMap::new(),
            fetched: HashMap::new(),
            read_some: false,
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
        trusted: bool,
        pass: &mut Pass<Look, Act>,
    ) {
        let pods: HashMap<(&str, &str), &PodRecord> = view
            .pods
            .iter()
            .map(|p| ((&*p.namespace, p.name.as_str()), &**p))
            .collect();
        let live: HashSet<&str> = pods
            .values()
            .map(|p| p.uid.as_str())
            .chain(pending.iter().map(|r| r.spec.pod_uid.as_str()))
            .collect();
        self.fetched.retain(|uid, _| live.contains(uid.as_str()));
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
            let (pod, look) = match known(&self.fetched, pod, pcr, &uid) {
                Known::Pod(pod, look) => (pod.map(|p| *p), look),
                // Not in the view (yet, or gone): read before deciding, never denied unread.
                Known::Unread(look) => {
                    ask(&mut pass.looks, look);
                    continue;
                }
            };
            let decision = decide::decide(pcr, pod.as_deref(), &scope, now.wall.as_second());
            if matches!(decision, Decision::Leave) {
                continue;
            }
            // Only an issue depends on the service account assumed: read it first.
            if let (Some(look), Decision::Issue(_)) = (look, &decision) {
                ask(&mut pass.looks, look);
                continue;
            }
            let signed = answer(
                &mut self.intermediate,
                &self.config,
                (ca, trusted),
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

    /// Whether the kubelets have had time to give every pod the active CA's root: it has been in
    /// the published bundle for the propagation time (or no bundle is served, so nothing waits).
    fn active_trusted(&mut self, view: &View, ca: &CaState, now: Now) -> bool {
        if !view.extra.bundles {
            return true;
        }
        let published = view
            .extra
            .bundle
            .as_ref()
            .is_some_and(|b| bundle::holds(&b.spec.trust_bundle, &ca.active.cert_pem));
        if !published {
            self.trusted = None;
            return false;
        }
        let since = match &self.trusted {
            Some((pem, since)) if *pem == ca.active.cert_pem => *since,
            _ => now.at,
        };
        self.trusted = Some((ca.active.cert_pem.clone(), since));
        now.at.duration_since(since) >= self.config.trust_propagation
    }

    /// The trust bundle as it should be: the CA's roots, and each root that left them while a
    /// certificate chaining to it may still live.
    fn bundle(&self, view: &View, ca: &CaState, now: Now) -> ClusterTrustBundle {
        let published = view.extra.bundle.as_deref();
        let hold = self.config.max_lifetime_seconds.saturating_add(
            i64::try_from(self.config.trust_propagation.as_secs()).unwrap_or(i64::MAX),
        );
        let (roots, until) = bundle::roots(
            &ca.bundle(),
            published.map_or("", |b| b.spec.trust_bundle.as_str()),
            &published.map(bundle::kept_until).unwrap_or_default(),
            now.wall.as_second(),
            hold,
        );
        bundle::desired(&self.bundle_name, &roots, &until)
    }
}

/// What is known of the pod a request names.
enum Known<'a> {
    /// The pod as read, or as the view has it (with the look that reads its service account when
    /// the view lacks it: the request's is assumed until then); `None`: read, and gone. Boxed:
    /// a record is ten times the size of a look.
    Pod(Option<Box<Cow<'a, PodRecord>>>, Option<Look>),
    /// Not in the view with the request's UID, not read yet.
    Unread(Look),
}

fn known<'a>(
    fetched: &'a HashMap<String, Option<PodRecord>>,
    pod: Option<&'a PodRecord>,
    pcr: &PodCertificateRequest,
    request: &str,
) -> Known<'a> {
    let look = || Look {
        request: request.to_owned(),
        namespace: pcr.namespace().unwrap_or_default(),
        pod: pcr.spec.pod_name.clone(),
        pod_uid: pcr.spec.pod_uid.clone(),
    };
    if let Some(read) = fetched.get(&pcr.spec.pod_uid) {
        return Known::Pod(read.as_ref().map(|r| Box::new(Cow::Borrowed(r))), None);
    }
    match pod.filter(|p| p.uid == pcr.spec.pod_uid) {
        None => Known::Unread(look()),
        Some(found) if !found.service_account.is_empty() => {
            Known::Pod(Some(Box::new(Cow::Borrowed(found))), None)
        }
        Some(found) => {
            let mut assumed = found.clone();
            assumed
                .service_account
                .clone_from(&pcr.spec.service_account_name);
            Known::Pod(Some(Box::new(Cow::Owned(assumed))), Some(look()))
        }
    }
}

/// Adds `look` unless that pod is asked for already or the pass has its [`MAX_LOOKS`].
fn ask(looks: &mut Vec<Look>, look: Look) {
    if looks.len() < MAX_LOOKS && !looks.iter().any(|l| l.pod_uid == look.pod_uid) {
        looks.push(look);
    }
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
    ca: (&CaState, bool),
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

/// Signs `issue` under the intermediate, made anew under the active CA when [`keeps`] says the
/// current one will not do.
fn sign_leaf(
    intermediate: &mut Option<Intermediate>,
    config: &Config,
    (ca, trusted): (&CaState, bool),
    issue: &decide::Issue,
    at: i64,
) -> Result<String, IdentityError> {
    let offset =
        |s: i64| OffsetDateTime::from_unix_timestamp(s).map_err(|_| IdentityError::Time(s));
    let now = offset(at)?;
    let until = offset(at + config.max_lifetime_seconds + 3600)?;
    let current = match intermediate.take() {
        Some(i) if keeps(&i, &ca.active, trusted, until) => i,
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

/// Whether to keep signing under `current` (able to sign until `until`): while it was made under
/// the active CA, and after a rotation while the new root is not yet in every pod
/// (`active_trusted` false), since a leaf chaining to it would fail its peers' checks. A leader
/// without one (a new term) can only sign under the active CA.
fn keeps(
    current: &Intermediate,
    active: &crate::certs::ca::KeyedCert,
    active_trusted: bool,
    until: OffsetDateTime,
) -> bool {
    current.serves(active, until) || (!active_trusted && current.not_after >= until)
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
    /// Answers are independent writes, each conditional on the request read.
    const ACTS_AT_ONCE: usize = 16;
    type Look = Look;
    type Act = Act;
    type Seen = Seen;
    type Io = super::Io;
    type Extra = Extra;

    fn period(&self) -> Duration {
        PERIOD
    }

    /// A new pending request: decided now, not at the next period.
    fn woken(io: &super::Io) -> impl std::future::Future<Output = ()> + Send {
        io.wake.notified()
    }

    /// The pods just read let their requests be decided at once.
    fn again(&self) -> bool {
        self.read_some
    }

    fn pass(&mut self, view: &View, now: Now) -> Pass<Look, Act> {
        self.read_some = false;
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
        let ca_version = view
            .extra
            .ca
            .as_ref()
            .and_then(|s| s.metadata.resource_version.clone());
        let bundle_due = self
            .last_bundle
            .is_none_or(|at| now.at.duration_since(at) >= BUNDLE_PERIOD)
            || ca_version != self.bundle_ca;
        let mut pass = Pass::default();
        let Some(ca) = self.ca(view) else {
            return pass;
        };
        // Every pass, so the time a new root was published counts from when it was, not from
        // the next request.
        let trusted = self.active_trusted(view, &ca, now);
        if !pending.is_empty() {
            self.answer_all(view, &ca, &pending, now, trusted, &mut pass);
        }
        if bundle_due {
            self.last_bundle = Some(now.at);
            self.bundle_ca = ca_version;
            let desired = self.bundle(view, &ca, now);
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
                Seen::Pod { pod_uid, pod, .. } => {
                    self.fetched.insert(pod_uid, pod.map(|p| *p));
                    self.read_some = true;
                }
                Seen::Failed { request } => {
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
    use crate::certs::ca::{inspect, split_bundle};
    use crate::certs::rotation::ca_secret;
    use crate::identity::decide::tests::{NOW, pod, policy, request};
    use crate::identity::decide::{DEFAULT_MAX_LIFETIME_SECONDS, ISSUED};
    use crate::identity::sign::tests::root;

    fn signer() -> Signer {
        Signer::new(Config {
            trust_domain: "cluster.local".into(),
            splice_namespace: "splice-system".into(),
            max_lifetime_seconds: DEFAULT_MAX_LIFETIME_SECONDS,
            trust_propagation: crate::identity::TRUST_PROPAGATION,
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
                bundles: false,
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

    /// `view` with `ca` in the Secret (at `version`), its bundle published, and request `n`.
    fn with_ca(view: &View, ca: &CaState, version: &str, n: u32) -> View {
        let mut view = view.clone();
        let mut secret = ca_secret("splice-system", ca);
        secret.metadata.resource_version = Some(version.into());
        view.extra.ca = Some(Arc::new(secret));
        view.extra.bundles = true;
        let roots = split_bundle(&ca.bundle());
        view.extra.bundle = Some(Arc::new(bundle::desired("b", &roots, &BTreeMap::new())));
        let mut request = request();
        request.metadata.uid = Some(format!("req-{n}"));
        request.metadata.name = Some(format!("req-{n}"));
        view.extra.requests = vec![Arc::new(request)];
        view
    }

    /// The key id of the root the one issued chain of `pass` leads to.
    fn issuer_root(pass: &Pass<Look, Act>) -> String {
        let all = answers(pass);
        let [answer] = all.as_slice() else {
            panic!("one answer: {:?}", pass.acts)
        };
        let chain = split_bundle(answer.status.certificate_chain.as_deref().unwrap());
        inspect(&chain[1], "intermediate").unwrap().issuer_key_id
    }

    fn key_id(ca: &crate::certs::ca::KeyedCert) -> String {
        inspect(&ca.cert_pem, "root").unwrap().key_id
    }

    #[test]
    fn after_a_rotation_certificates_chain_to_the_old_root_until_the_new_one_was_published_for_the_propagation_time()
     {
        let (old, new) = (root(), root());
        let before = CaState::fresh(old.clone());
        let after = CaState {
            phase: crate::certs::rotation::Phase::Serving,
            active: new.clone(),
            next: None,
            previous: Some(old.cert_pem.clone()),
        };
        let (mut s, base) = (signer(), Instant::now());
        let plain = view(vec![pod()]);
        let pass = s.pass(&with_ca(&plain, &before, "1", 1), at(base, 0));
        assert_eq!(issuer_root(&pass), key_id(&old));
        // The rotation promoted the new CA; the bundle holds both roots from t=10 on, a pass
        // with no request sees it.
        let rotated = |n| with_ca(&plain, &after, "2", n);
        let mut idle = rotated(2);
        idle.extra.requests.clear();
        assert!(answers(&s.pass(&idle, at(base, 10))).is_empty());
        for (n, t) in [(3, 60), (4, 129)] {
            let pass = s.pass(&rotated(n), at(base, t));
            assert_eq!(issuer_root(&pass), key_id(&old), "at {t}s");
        }
        let pass = s.pass(&rotated(5), at(base, 130));
        assert_eq!(issuer_root(&pass), key_id(&new));
        // A new term has no intermediate under the old CA, whose key is gone: the new root.
        let pass = signer().pass(&rotated(6), at(base, 10));
        assert_eq!(issuer_root(&pass), key_id(&new));
    }

    #[test]
    fn a_new_root_not_yet_in_the_published_bundle_is_never_chained_to_by_a_signer_that_can_wait() {
        let (old, new) = (root(), root());
        let (mut s, base) = (signer(), Instant::now());
        let plain = view(vec![pod()]);
        s.pass(
            &with_ca(&plain, &CaState::fresh(old.clone()), "1", 1),
            at(base, 0),
        );
        let mut unpublished = with_ca(&plain, &CaState::fresh(new), "2", 2);
        let only_old = bundle::desired("b", std::slice::from_ref(&old.cert_pem), &BTreeMap::new());
        unpublished.extra.bundle = Some(Arc::new(only_old));
        let pass = s.pass(&unpublished, at(base, 600));
        assert_eq!(issuer_root(&pass), key_id(&old));
    }

    #[test]
    fn a_changed_ca_secret_is_published_at_once_not_at_the_next_period() {
        let (mut s, base) = (signer(), Instant::now());
        let plain = view(vec![pod()]);
        let first = with_ca(&plain, &CaState::fresh(root()), "1", 1);
        assert_eq!(bundles(&s.pass(&first, at(base, 0))), 1);
        assert_eq!(bundles(&s.pass(&first, at(base, 5))), 0);
        let rotated = with_ca(&plain, &CaState::fresh(root()), "2", 2);
        assert_eq!(bundles(&s.pass(&rotated, at(base, 6))), 1);
        assert_eq!(bundles(&s.pass(&rotated, at(base, 7))), 0);
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
        let mut read = pod();
        read.service_account = account.into();
        let seen = Seen::Pod {
            request: look.request.clone(),
            pod_uid: look.pod_uid.clone(),
            pod: Some(Box::new(read)),
        };
        s.judge(view, vec![seen], at(base, 1));
        assert!(s.again(), "the next pass comes at once");
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
    }

    #[test]
    fn a_pod_the_view_does_not_show_is_read_first_and_denied_only_when_the_read_finds_none() {
        for exists in [true, false] {
            let (mut s, base, empty) = (signer(), Instant::now(), view(Vec::new()));
            // The view may lag a pod made a moment ago: no answer before reading it.
            let pass = s.pass(&empty, at(base, 0));
            assert!(answers(&pass).is_empty());
            let [look] = pass.looks.as_slice() else {
                panic!("one look: {:?}", pass.looks)
            };
            let seen = Seen::Pod {
                request: look.request.clone(),
                pod_uid: look.pod_uid.clone(),
                pod: exists.then(|| Box::new(pod())),
            };
            s.judge(&empty, vec![seen], at(base, 0));
            let pass = s.pass(&empty, at(base, 0));
            let answer = answers(&pass)[0];
            if exists {
                assert_eq!(answer.outcome, "issued");
            } else {
                assert_eq!(answer.outcome, "denied");
                assert!(answer.denied.is_none(), "no pod to warn");
            }
        }
    }

    #[test]
    fn without_a_ca_nothing_is_answered_or_published() {
        let mut view = view(vec![pod()]);
        view.extra.ca = None;
        let pass = signer().pass(&view, at(Instant::now(), 0));
        assert!(pass.acts.is_empty() && pass.looks.is_empty());
    }
}
