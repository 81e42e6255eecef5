//! Pure: the admission probe's decisions. Which namespaces to probe for a policy, which labels
//! make its objectSelector select the probe pod, what the probe pod is, how to read what the API
//! server answered, and what the Verified condition and `status.probe` say about it. The I/O is in
//! [`super::probe`].

use splice_engine::Selector;
use splice_engine::selector::Op;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use splice_crds::{
    ConditionStatus, InjectionPolicyStatus, OPT_OUT_LABEL, Operation, ProbeLatency, ProbeStatus,
    condition, set_condition,
};
use splice_engine::explain::{selects_namespace, selects_pod};
use splice_engine::{self, CompiledPolicy, Exclusions, NamespaceContext};

/// Marks a probe pod as Splice's (the pod is never stored: every probe is a dry run).
pub const PROBE_LABEL: &str = "splice.dev/probe";
/// The Pod Security admission's enforce level of a namespace.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";
/// What the Pod Security admission enforces on a namespace without the label: upstream's default
/// (its admission configuration's `defaults.enforce`) is `privileged`.
pub const DEFAULT_ENFORCE_LEVEL: &str = "privileged";
/// The probe's one container: tiny, and never pulled (the pod is never scheduled).
pub const PROBE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// Recent probes kept per policy for the latency figures.
pub const WINDOW: usize = 20;
/// Fewer samples than this never make a policy slow: one slow answer is not a trend.
pub const MIN_SLOW_SAMPLES: usize = 3;

/// The Pod Security enforce level of a namespace, as the admission reads it.
pub fn enforce_level(namespace: &NamespaceContext) -> &str {
    namespace
        .labels
        .get(ENFORCE_LABEL)
        .map_or(DEFAULT_ENFORCE_LEVEL, String::as_str)
}

/// The namespaces to probe for `policy`, sorted: of those it selects (never an excluded one), the
/// first by name of each distinct Pod Security enforce level, plus those named in a problem last
/// time that it still selects.
pub fn plan_namespaces<'a>(
    policy: &CompiledPolicy,
    namespaces: impl IntoIterator<Item = &'a NamespaceContext>,
    exclusions: &Exclusions,
    earlier: &[String],
) -> Vec<String> {
    let mut selected: Vec<&NamespaceContext> = namespaces
        .into_iter()
        .filter(|ns| selects_namespace(policy, ns, exclusions))
        .collect();
    selected.sort_by(|a, b| a.name.cmp(&b.name));
    let mut per_level: BTreeMap<&str, &str> = BTreeMap::new();
    for ns in &selected {
        per_level.entry(enforce_level(ns)).or_insert(&ns.name);
    }
    let mut out: Vec<String> = per_level.values().map(|n| (*n).to_owned()).collect();
    for name in earlier {
        if selected.iter().any(|ns| &ns.name == name) {
            out.push(name.clone());
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Labels a pod must carry for `policy`'s objectSelector to select it, plus [`PROBE_LABEL`]:
/// `matchLabels` as they are, `In` its first value, `Exists` some value, and `NotIn` and
/// `DoesNotExist` met by leaving the key out. Checked against the policy's own compiled selector,
/// so an answer is always one the webhook agrees with.
pub fn probe_labels(policy: &CompiledPolicy) -> Result<BTreeMap<String, String>, String> {
    if !policy.spec().operations.contains(&Operation::Create) {
        return Err(
            "the probe creates a pod, and this policy only acts on UPDATE, so a create cannot \
             show whether it works"
                .to_owned(),
        );
    }
    let mut labels = BTreeMap::new();
    let selector = Selector::read(policy.spec().object_selector.as_ref());
    for r in selector.requirements() {
        match &r.op {
            Op::In(values) => {
                if !labels.contains_key(&r.key)
                    && let Some(first) = values.first()
                {
                    labels.insert(r.key.clone(), first.clone());
                }
            }
            Op::Exists => {
                labels
                    .entry(r.key.clone())
                    .or_insert_with(|| "probe".to_owned());
            }
            Op::NotIn(_) | Op::DoesNotExist | Op::Unknown(_) => {}
        }
    }
    let mentioned = selector.requirements().iter().any(|r| r.key == PROBE_LABEL);
    if !mentioned {
        labels.insert(PROBE_LABEL.to_owned(), "true".to_owned());
    }
    if selects_pod(policy, &labels) {
        Ok(labels)
    } else {
        Err(format!(
            "no pod labels satisfy spec.objectSelector (tried {labels:?}), so no pod can be \
             selected and there is nothing to probe"
        ))
    }
}

/// The probe pod: it satisfies Pod Security `restricted` and asks for next to nothing, so a
/// refusal is never about the probe's own content. `opted_out` makes it the baseline, which no
/// Splice policy injects.
pub fn probe_pod(
    name: &str,
    policy: &str,
    labels: &BTreeMap<String, String>,
    opted_out: bool,
) -> Result<Pod, String> {
    let mut labels = labels.clone();
    if opted_out {
        labels.insert(OPT_OUT_LABEL.to_owned(), "false".to_owned());
    }
    let resources = serde_json::json!({"cpu": "10m", "memory": "16Mi"});
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"splice.dev/probe-of": policy},
        },
        "spec": {
            "automountServiceAccountToken": false,
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [{
                "name": "probe",
                "image": PROBE_IMAGE,
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                    "readOnlyRootFilesystem": true,
                },
                "resources": {"requests": resources, "limits": resources},
            }],
        },
    }))
    .map_err(|e| format!("building the probe pod: {e}"))
}

/// What the API server answered to one dry-run create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Admitted; `hash` is the template hash of the policy's entry in the returned pod's
    /// `splice.dev/status`, when it carries one.
    Admitted { hash: Option<String> },
    /// Refused, with the API server's own message.
    Refused { code: u16, message: String },
    /// No answer (connection, timeout, an unreadable reply): nobody's verdict.
    Failed(String),
}

/// One dry-run create and how long its round trip took.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub answer: Answer,
    pub round_trip: Duration,
}

/// What the probe pod is called in the messages it keeps: every probe has a unique name, and a
/// message that changed with it would rewrite the status at every probe.
pub const PROBE_POD_PLACEHOLDER: &str = "<probe pod>";

/// The API server's message without the probe pod's unique name.
pub fn without_pod_name(message: &str, pod_name: &str) -> String {
    message.replace(pod_name, PROBE_POD_PLACEHOLDER)
}

/// The template hash of `policy`'s injection the pod the API server returned (JSON) carries, if
/// any.
pub fn injected_hash(pod_json: &str, policy: &str) -> Result<Option<String>, String> {
    splice_engine::provenance(pod_json)
        .map(|mut p| p.remove(policy).map(|e| e.hash))
        .map_err(|e| e.to_string())
}

/// The probe of one namespace: the injected pod, and the opted-out baseline when it was needed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceProbe {
    pub namespace: String,
    pub injected: Probe,
    pub baseline: Option<Probe>,
}

/// What the probe knows of the policy it verifies, to tell its refusals from others'.
#[derive(Clone, Debug, Default)]
pub struct Subject {
    /// `<policy>.splice.dev`, as the API server names it in a failed call.
    pub webhook_name: String,
    /// Names of the containers and init containers the policy injects.
    pub containers: Vec<String>,
    /// (policy, container) of other policies that select the same namespaces.
    pub others: Vec<(String, String)>,
    pub timeout_seconds: i32,
    /// The policy is in force in-tree (a MutatingAdmissionPolicy): no webhook is called, so the
    /// latency over the baseline is the in-tree policy's.
    pub in_tree: bool,
}

/// Injected containers by name, as the API server quotes them in a refusal.
pub fn injected_containers(policy: &CompiledPolicy) -> Vec<String> {
    let t = &policy.spec().template;
    t.init_containers
        .iter()
        .chain(&t.containers)
        .map(|c| c.name.clone())
        .collect()
}

/// What one namespace's probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    Admitted,
    NotInjected(String),
    Rejected(String),
    /// The refusal is about what another policy injects.
    RefusedForOthers(String),
    /// Even the baseline is refused.
    BaselineRefused(String),
    Failed(String),
}

fn names_container(message: &str, name: &str) -> bool {
    message.contains(&format!("\"{name}\""))
}

/// Reads one namespace's probe.
pub fn classify(probe: &NamespaceProbe, subject: &Subject) -> Finding {
    match &probe.injected.answer {
        Answer::Admitted { hash: Some(_) } => Finding::Admitted,
        Answer::Admitted { hash: None } => Finding::NotInjected(
            "the API server admitted it without this policy's injection and said nothing about \
             the webhook: it was not reached (failurePolicy Ignore hides why) or did not act"
                .to_owned(),
        ),
        Answer::Failed(e) => Finding::Failed(e.clone()),
        Answer::Refused { message, .. } => {
            if message.contains(&format!(
                "failed calling webhook \"{}\"",
                subject.webhook_name
            )) {
                return Finding::NotInjected(format!(
                    "the API server could not call the webhook: {message}"
                ));
            }
            if message.contains(&format!(
                "admission webhook \"{}\" denied the request",
                subject.webhook_name
            )) {
                return Finding::NotInjected(format!("the webhook refused the pod: {message}"));
            }
            match probe.baseline.as_ref().map(|b| &b.answer) {
                Some(Answer::Admitted { .. }) => {}
                Some(Answer::Refused { message, .. }) => {
                    return Finding::BaselineRefused(message.clone());
                }
                Some(Answer::Failed(e)) => return Finding::Failed(e.clone()),
                None => {
                    return Finding::Failed(
                        "the injected probe was refused and no baseline was probed".to_owned(),
                    );
                }
            }
            let ours = subject
                .containers
                .iter()
                .any(|c| names_container(message, c));
            let theirs: Vec<&str> = subject
                .others
                .iter()
                .filter(|(_, c)| names_container(message, c))
                .map(|(p, _)| p.as_str())
                .collect();
            if !ours && !theirs.is_empty() {
                Finding::RefusedForOthers(format!(
                    "refused for what policy {} injects: {message}",
                    theirs.join(", ")
                ))
            } else {
                Finding::Rejected(message.clone())
            }
        }
    }
}

/// Recent probe latencies of one policy: (round trip, share attributable to the webhooks).
#[derive(Clone, Debug, Default)]
pub struct Window {
    samples: VecDeque<(Duration, Duration)>,
}

impl Window {
    pub fn push(&mut self, round_trip: Duration, webhook: Duration) {
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back((round_trip, webhook));
    }

    fn len(&self) -> usize {
        self.samples.len()
    }

    /// Nearest-rank p99 of (round trip, webhook share); `None` when empty.
    pub fn p99(&self) -> Option<(Duration, Duration)> {
        let rank = |mut v: Vec<Duration>| {
            v.sort();
            let i = (v.len() * 99).div_ceil(100).saturating_sub(1);
            v.get(i).copied()
        };
        let rt = rank(self.samples.iter().map(|s| s.0).collect())?;
        let wh = rank(self.samples.iter().map(|s| s.1).collect())?;
        Some((rt, wh))
    }

    pub fn figures(&self) -> Option<ProbeLatency> {
        let (rt, wh) = self.p99()?;
        Some(ProbeLatency {
            round_trip_p99_ms: millis(rt),
            webhook_p99_ms: millis(wh),
            samples: self.len() as i64,
        })
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Reasons of the Verified condition (and `status.probe.result`).
pub mod reason {
    pub const VERIFIED: &str = "Verified";
    pub const NOT_INJECTED: &str = "NotInjected";
    pub const REJECTED: &str = "RejectedByAdmission";
    pub const SLOW: &str = "SlowAdmission";
    pub const PROBE_REFUSED: &str = "ProbeRefused";
    pub const PROBE_FAILED: &str = "ProbeFailed";
    pub const NO_NAMESPACE: &str = "NoNamespaceSelected";
    pub const NO_PROBE_POD: &str = "NoProbePod";
}

/// What the Verified condition should say. `detail` is the part that only changes with the
/// result; `figures` (latency) changes with every probe and alone never causes a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judgement {
    pub status: ConditionStatus,
    pub reason: &'static str,
    pub detail: String,
    pub figures: String,
    /// Namespaces probed.
    pub namespaces: Vec<String>,
    /// Namespaces where the problem was found.
    pub affected: Vec<String>,
}

impl Judgement {
    pub fn message(&self) -> String {
        if self.figures.is_empty() {
            self.detail.clone()
        } else {
            format!("{} {}", self.detail, self.figures)
        }
    }

    /// A verdict without probes (nothing to probe, or no probe pod possible).
    pub fn unknown(reason: &'static str, detail: String) -> Self {
        Judgement {
            status: ConditionStatus::Unknown,
            reason,
            detail,
            figures: String::new(),
            namespaces: Vec::new(),
            affected: Vec::new(),
        }
    }

    /// Whether this is worth a Warning Event when the condition turns to it.
    pub fn warns(&self) -> bool {
        self.status == ConditionStatus::False
    }
}

/// Notes are bounded so one pathological message cannot make a status huge.
const MAX_QUOTED: usize = 600;

fn quote(s: &str) -> String {
    if s.len() <= MAX_QUOTED {
        return s.to_owned();
    }
    let mut cut = MAX_QUOTED;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &s[..cut])
}

/// The verdict on a policy from this round's probes and its latency window.
pub fn judge(probes: &[NamespaceProbe], subject: &Subject, window: &Window) -> Judgement {
    let namespaces: Vec<String> = probes.iter().map(|p| p.namespace.clone()).collect();
    let findings: Vec<(&str, Finding)> = probes
        .iter()
        .map(|p| (p.namespace.as_str(), classify(p, subject)))
        .collect();
    let pick = |want: fn(&Finding) -> Option<&String>| -> Vec<(&str, &String)> {
        findings
            .iter()
            .filter_map(|(ns, f)| want(f).map(|m| (*ns, m)))
            .collect()
    };
    let listed = |hits: &[(&str, &String)]| {
        hits.iter()
            .map(|(ns, m)| format!("in {ns}: {}", quote(m)))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let names = |hits: &[(&str, &String)]| hits.iter().map(|(ns, _)| (*ns).to_owned()).collect();
    let attributable_to = if subject.in_tree {
        "the in-tree admission policy"
    } else {
        "webhooks"
    };
    let figures = match window.p99() {
        Some((rt, wh)) => format!(
            "Latency p99 over the last {} probes: {} ms round trip, {} ms attributable to {attributable_to}.",
            window.len(),
            millis(rt),
            millis(wh)
        ),
        None => String::new(),
    };
    let verdict = |status, reason, detail: String, affected: Vec<String>| Judgement {
        status,
        reason,
        detail,
        figures: figures.clone(),
        namespaces: namespaces.clone(),
        affected,
    };

    let rejected = pick(|f| match f {
        Finding::Rejected(m) => Some(m),
        _ => None,
    });
    if !rejected.is_empty() {
        return verdict(
            ConditionStatus::False,
            reason::REJECTED,
            format!(
                "The API server refuses pods with this policy's injection but admits the same \
                 pod without it, so every pod it selects there is refused: {}. Fix \
                 spec.template (or the namespace's admission rules).",
                listed(&rejected)
            ),
            names(&rejected),
        );
    }
    let missing = pick(|f| match f {
        Finding::NotInjected(m) => Some(m),
        _ => None,
    });
    if !missing.is_empty() {
        return verdict(
            ConditionStatus::False,
            reason::NOT_INJECTED,
            format!(
                "A dry-run pod this policy selects came back without its injection: {}. Pods it \
                 selects are admitted uninjected (failurePolicy Ignore) or refused (Fail): check \
                 that the API server reaches Splice's webhook (Service, certificate, network).",
                listed(&missing)
            ),
            names(&missing),
        );
    }
    if let Some((_, wh)) = window.p99() {
        let limit =
            Duration::from_millis(u64::try_from(subject.timeout_seconds).unwrap_or(0) * 500);
        if window.len() >= MIN_SLOW_SAMPLES && wh > limit {
            return verdict(
                ConditionStatus::False,
                reason::SLOW,
                format!(
                    "Admission through the webhooks takes more than half of spec.timeoutSeconds \
                     ({} s): past the timeout, pods are admitted uninjected (Ignore) or refused \
                     (Fail).",
                    subject.timeout_seconds
                ),
                namespaces.clone(),
            );
        }
    }
    let refused = pick(|f| match f {
        Finding::BaselineRefused(m) | Finding::RefusedForOthers(m) => Some(m),
        _ => None,
    });
    if !refused.is_empty() {
        return verdict(
            ConditionStatus::Unknown,
            reason::PROBE_REFUSED,
            format!(
                "The probe was refused for reasons that are not this policy's (even without its \
                 injection, or for another policy's), so it cannot be verified there: {}.",
                listed(&refused)
            ),
            names(&refused),
        );
    }
    let failed = pick(|f| match f {
        Finding::Failed(m) => Some(m),
        _ => None,
    });
    if !failed.is_empty() {
        return verdict(
            ConditionStatus::Unknown,
            reason::PROBE_FAILED,
            format!(
                "The probe got no answer from the API server: {}.",
                listed(&failed)
            ),
            names(&failed),
        );
    }
    verdict(
        ConditionStatus::True,
        reason::VERIFIED,
        format!(
            "Dry-run pods in namespace(s) {} were admitted with this policy's injection.",
            namespaces.join(", ")
        ),
        Vec::new(),
    )
}

/// True when the status already says `j` for `generation`: same condition status, reason and
/// detail, same namespaces. Latency figures and the probe time alone never cause a write.
pub fn already_reported(
    status: Option<&InjectionPolicyStatus>,
    generation: Option<i64>,
    j: &Judgement,
) -> bool {
    let Some(status) = status else {
        return false;
    };
    let Some(c) = status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::VERIFIED)
    else {
        return false;
    };
    let Some(p) = &status.probe else {
        return false;
    };
    c.status == j.status.as_str()
        && c.reason == j.reason
        && c.observed_generation == generation
        && c.message.starts_with(&j.detail)
        && p.result == j.reason
        && p.namespaces == j.namespaces
        && p.affected_namespaces == j.affected
}

/// The Verified condition and `status.probe` to apply for `j`, keeping the condition's
/// lastTransitionTime unless its status flips.
pub fn probe_status(
    current: Option<&InjectionPolicyStatus>,
    generation: Option<i64>,
    j: &Judgement,
    window: &Window,
    now: Timestamp,
) -> (Condition, ProbeStatus) {
    let mut conditions: Vec<Condition> = current
        .into_iter()
        .flat_map(|s| &s.conditions)
        .filter(|c| c.type_ == condition::VERIFIED)
        .cloned()
        .collect();
    set_condition(
        &mut conditions,
        condition::VERIFIED,
        j.status,
        j.reason,
        &j.message(),
        generation,
        now,
    );
    // set_condition always leaves the condition in the list; the fallback is never taken.
    let verified = conditions.pop().unwrap_or_else(|| Condition {
        type_: condition::VERIFIED.to_owned(),
        status: j.status.as_str().to_owned(),
        reason: j.reason.to_owned(),
        message: j.message(),
        observed_generation: generation,
        last_transition_time: Time(now),
    });
    let probe = ProbeStatus {
        result: j.reason.to_owned(),
        namespaces: j.namespaces.clone(),
        affected_namespaces: j.affected.clone(),
        probe_time: Some(now.to_string()),
        latency: window.figures(),
    };
    (verified, probe)
}

/// Spaces requests so that, however many policies there are, the probe never sends more than
/// `rate` per second (after a burst of `burst`). Each call reserves one request and says how long
/// to wait before sending it.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(rate: f64, burst: f64, now: Instant) -> Self {
        TokenBucket {
            rate,
            burst,
            tokens: burst,
            last: now,
        }
    }

    pub fn reserve(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst) - 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

/// `interval` moved by up to ±10 % from `random`, so policies probed together drift apart.
pub fn jittered(interval: Duration, random: u64) -> Duration {
    let unit = random as f64 / u64::MAX as f64;
    interval.mul_f64(0.9 + 0.2 * unit)
}

#[cfg(test)]
mod tests {
    use splice_crds::InjectionPolicySpec;

    use super::*;

    fn policy(yaml: &str) -> CompiledPolicy {
        let spec: InjectionPolicySpec = serde_yaml::from_str(yaml).unwrap();
        CompiledPolicy::compile("mesh", 1, &spec).unwrap()
    }

    fn ns(name: &str, labels: &[(&str, &str)]) -> NamespaceContext {
        let mut l: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        l.insert("kubernetes.io/metadata.name".into(), name.into());
        NamespaceContext {
            name: name.into(),
            labels: l,
            annotations: BTreeMap::new(),
        }
    }

    fn subject() -> Subject {
        Subject {
            webhook_name: "mesh.splice.dev".into(),
            containers: vec!["proxy-init".into(), "proxy".into()],
            others: vec![("logs".into(), "shipper".into())],
            timeout_seconds: 2,
            in_tree: false,
        }
    }

    fn admitted(injected: bool, ms: u64) -> Probe {
        Probe {
            answer: Answer::Admitted {
                hash: injected.then(|| "h".to_owned()),
            },
            round_trip: Duration::from_millis(ms),
        }
    }

    fn refused(message: &str) -> Probe {
        Probe {
            answer: Answer::Refused {
                code: 403,
                message: message.into(),
            },
            round_trip: Duration::from_millis(5),
        }
    }

    fn probe(namespace: &str, injected: Probe, baseline: Option<Probe>) -> NamespaceProbe {
        NamespaceProbe {
            namespace: namespace.into(),
            injected,
            baseline,
        }
    }

    #[test]
    fn one_namespace_per_enforce_level_is_probed_never_an_excluded_or_unselected_one() {
        let p = policy("namespaceSelector: {matchLabels: {mesh: on}}\n");
        let all = [
            ns("b-priv", &[("mesh", "on")]),
            ns("a-priv", &[("mesh", "on")]),
            ns(
                "c-restricted",
                &[("mesh", "on"), (ENFORCE_LABEL, "restricted")],
            ),
            ns(
                "d-restricted",
                &[("mesh", "on"), (ENFORCE_LABEL, "restricted")],
            ),
            ns("e-baseline", &[("mesh", "on"), (ENFORCE_LABEL, "baseline")]),
            ns("off", &[]),
            ns("kube-system", &[("mesh", "on")]),
            ns("splice-system", &[("mesh", "on")]),
        ];
        let excl = Exclusions::default_for("splice-system");
        assert_eq!(
            plan_namespaces(&p, &all, &excl, &[]),
            ["a-priv", "c-restricted", "e-baseline"]
        );
        // A namespace named in a problem last time stays probed while it is selected.
        let earlier = ["d-restricted".to_owned(), "off".to_owned()];
        assert_eq!(
            plan_namespaces(&p, &all, &excl, &earlier),
            ["a-priv", "c-restricted", "d-restricted", "e-baseline"]
        );
    }

    #[test]
    fn a_namespace_without_the_enforce_label_counts_as_privileged() {
        assert_eq!(enforce_level(&ns("a", &[])), "privileged");
        assert_eq!(
            enforce_level(&ns("a", &[(ENFORCE_LABEL, "restricted")])),
            "restricted"
        );
    }

    #[test]
    fn probe_labels_satisfy_match_labels_and_expressions() {
        let p = policy(
            "objectSelector:\n  matchLabels: {app: web}\n  matchExpressions:\n  - {key: tier, operator: In, values: [front, back]}\n  - {key: mesh, operator: Exists}\n  - {key: legacy, operator: DoesNotExist}\n  - {key: env, operator: NotIn, values: [dev]}\n",
        );
        let labels = probe_labels(&p).unwrap();
        assert_eq!(labels["app"], "web");
        assert_eq!(labels["tier"], "front");
        assert!(labels.contains_key("mesh"));
        assert!(!labels.contains_key("legacy"));
        assert!(!labels.contains_key("env"));
        assert_eq!(labels[PROBE_LABEL], "true");
    }

    #[test]
    fn an_update_only_policy_cannot_be_probed_by_a_create() {
        let err = probe_labels(&policy("operations: [UPDATE]\n")).unwrap_err();
        assert!(err.contains("UPDATE"), "{err}");
    }

    #[test]
    fn a_denial_by_the_policys_own_webhook_is_not_injected_not_a_rejection() {
        let msg = "admission webhook \"mesh.splice.dev\" denied the request: template error";
        let j = judge(
            &[probe("shop", refused(msg), Some(admitted(false, 3)))],
            &subject(),
            &Window::default(),
        );
        assert_eq!(j.reason, reason::NOT_INJECTED);
        assert!(j.detail.contains("template error"), "{}", j.detail);
    }

    #[test]
    fn an_object_selector_no_pod_can_satisfy_is_reported_not_probed() {
        let p = policy(
            "objectSelector:\n  matchLabels: {app: web}\n  matchExpressions:\n  - {key: app, operator: NotIn, values: [web]}\n",
        );
        let err = probe_labels(&p).unwrap_err();
        assert!(err.contains("spec.objectSelector"), "{err}");
    }

    #[test]
    fn the_probe_pod_satisfies_restricted_and_the_baseline_is_opted_out() {
        let labels = BTreeMap::from([("app".to_owned(), "web".to_owned())]);
        let pod = probe_pod("splice-probe-1", "mesh", &labels, false).unwrap();
        let spec = pod.spec.as_ref().unwrap();
        let psc = spec.security_context.as_ref().unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(
            psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
            Some("RuntimeDefault")
        );
        let c = &spec.containers[0];
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_owned()])
        );
        assert_eq!(c.image.as_deref(), Some(PROBE_IMAGE));
        assert_eq!(pod.metadata.name.as_deref(), Some("splice-probe-1"));
        assert!(
            !pod.metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key(OPT_OUT_LABEL)
        );
        let baseline = probe_pod("splice-probe-2", "mesh", &labels, true).unwrap();
        assert_eq!(
            baseline.metadata.labels.as_ref().unwrap()[OPT_OUT_LABEL],
            "false"
        );
    }

    #[test]
    fn a_returned_pod_is_injected_only_with_the_policys_own_status_entry() {
        let pod = serde_json::json!({"metadata": {"annotations": {
            "splice.dev/status": "{\"logs\":{\"hash\":\"h\"}}"
        }}})
        .to_string();
        assert_eq!(injected_hash(&pod, "logs"), Ok(Some("h".to_owned())));
        assert_eq!(injected_hash(&pod, "mesh"), Ok(None));
        assert_eq!(injected_hash("{}", "mesh"), Ok(None));
    }

    #[test]
    fn a_refusal_only_the_injected_pod_gets_is_the_policys() {
        let msg = "pods \"splice-probe-1\" is forbidden: violates PodSecurity \"restricted:latest\": \
                   unrestricted capabilities (container \"proxy-init\" must not include \"NET_ADMIN\")";
        let j = judge(
            &[
                probe("shop", refused(msg), Some(admitted(false, 4))),
                probe("web", admitted(true, 6), Some(admitted(false, 4))),
            ],
            &subject(),
            &Window::default(),
        );
        assert_eq!(j.status, ConditionStatus::False);
        assert_eq!(j.reason, reason::REJECTED);
        assert_eq!(j.affected, ["shop"]);
        assert_eq!(j.namespaces, ["shop", "web"]);
        assert!(j.detail.contains("in shop:"), "{}", j.detail);
        assert!(j.detail.contains("\"proxy-init\""), "{}", j.detail);
    }

    #[test]
    fn the_same_refusal_of_two_probes_reads_the_same() {
        let a = without_pod_name(
            "pods \"splice-probe-1a\" is forbidden: x",
            "splice-probe-1a",
        );
        let b = without_pod_name(
            "pods \"splice-probe-2b\" is forbidden: x",
            "splice-probe-2b",
        );
        assert_eq!(a, b);
        assert_eq!(a, "pods \"<probe pod>\" is forbidden: x");
    }

    #[test]
    fn a_refusal_the_baseline_also_gets_is_not_blamed_on_the_policy() {
        let j = judge(
            &[probe(
                "shop",
                refused("exceeded quota"),
                Some(refused("exceeded quota")),
            )],
            &subject(),
            &Window::default(),
        );
        assert_eq!(j.status, ConditionStatus::Unknown);
        assert_eq!(j.reason, reason::PROBE_REFUSED);
        assert!(j.detail.contains("exceeded quota"));
    }

    #[test]
    fn a_refusal_naming_only_another_policys_container_is_not_blamed_on_this_one() {
        let j = judge(
            &[probe(
                "shop",
                refused("container \"shipper\" must not include \"SYS_ADMIN\""),
                Some(admitted(false, 3)),
            )],
            &subject(),
            &Window::default(),
        );
        assert_eq!(j.reason, reason::PROBE_REFUSED);
        assert!(j.detail.contains("policy logs"), "{}", j.detail);
    }

    #[test]
    fn an_admitted_pod_without_the_injection_is_not_injected() {
        let j = judge(
            &[probe("shop", admitted(false, 3), None)],
            &subject(),
            &Window::default(),
        );
        assert_eq!(j.status, ConditionStatus::False);
        assert_eq!(j.reason, reason::NOT_INJECTED);
        assert!(j.detail.contains("not reached"), "{}", j.detail);
    }

    #[test]
    fn a_failed_webhook_call_is_not_injected_with_the_api_servers_reason() {
        let msg = "Internal error occurred: failed calling webhook \"mesh.splice.dev\": failed to \
                   call webhook: Post \"https://127.0.0.1:1/inject/mesh\": dial tcp \
                   127.0.0.1:1: connect: connection refused";
        let j = judge(
            &[probe("shop", refused(msg), None)],
            &subject(),
            &Window::default(),
        );
        assert_eq!(j.reason, reason::NOT_INJECTED);
        assert!(j.detail.contains("connection refused"), "{}", j.detail);
    }

    #[test]
    fn an_in_tree_policys_latency_is_attributed_to_its_admission_policy_not_to_webhooks() {
        let mut w = Window::default();
        w.push(Duration::from_millis(12), Duration::from_millis(3));
        let in_tree = Subject {
            in_tree: true,
            ..subject()
        };
        let j = judge(&[probe("a", admitted(true, 12), None)], &in_tree, &w);
        assert_eq!(j.reason, reason::VERIFIED);
        assert!(
            j.figures
                .contains("3 ms attributable to the in-tree admission policy"),
            "{}",
            j.figures
        );
        assert!(!j.figures.contains("webhook"), "{}", j.figures);
    }

    #[test]
    fn webhook_latency_over_half_the_timeout_is_slow_admission_with_the_figures() {
        let mut w = Window::default();
        for ms in [1100, 1200, 1300] {
            w.push(Duration::from_millis(ms + 10), Duration::from_millis(ms));
        }
        let j = judge(&[probe("shop", admitted(true, 1310), None)], &subject(), &w);
        assert_eq!(j.reason, reason::SLOW);
        assert_eq!(j.status, ConditionStatus::False);
        assert!(
            j.figures.contains("1300 ms attributable to webhooks"),
            "{}",
            j.figures
        );
        // Two slow samples are not yet a trend.
        let mut w = Window::default();
        for ms in [1100, 1200] {
            w.push(Duration::from_millis(ms), Duration::from_millis(ms));
        }
        let j = judge(&[probe("shop", admitted(true, 1310), None)], &subject(), &w);
        assert_eq!(j.reason, reason::VERIFIED);
    }

    #[test]
    fn admitted_and_injected_everywhere_is_verified_naming_namespaces_and_latency() {
        let mut w = Window::default();
        w.push(Duration::from_millis(12), Duration::from_millis(4));
        let j = judge(
            &[
                probe("a", admitted(true, 12), None),
                probe("b", admitted(true, 12), None),
            ],
            &subject(),
            &w,
        );
        assert_eq!(j.status, ConditionStatus::True);
        assert!(j.message().contains("a, b"), "{}", j.message());
        assert!(j.message().contains("12 ms round trip"), "{}", j.message());
    }

    #[test]
    fn only_a_new_result_is_worth_a_write_not_new_latency_figures() {
        let mut w = Window::default();
        w.push(Duration::from_millis(12), Duration::from_millis(4));
        let j = judge(&[probe("a", admitted(true, 12), None)], &subject(), &w);
        let t0 = Timestamp::from_second(100).unwrap();
        let (c, p) = probe_status(None, Some(3), &j, &w, t0);
        let status = InjectionPolicyStatus {
            conditions: vec![c],
            probe: Some(p),
            ..Default::default()
        };
        assert!(already_reported(Some(&status), Some(3), &j));
        w.push(Duration::from_millis(40), Duration::from_millis(30));
        let faster = judge(&[probe("a", admitted(true, 40), None)], &subject(), &w);
        assert!(already_reported(Some(&status), Some(3), &faster));
        assert!(!already_reported(Some(&status), Some(4), &j));
        let elsewhere = judge(&[probe("b", admitted(true, 12), None)], &subject(), &w);
        assert!(!already_reported(Some(&status), Some(3), &elsewhere));
        let broken = judge(&[probe("a", admitted(false, 12), None)], &subject(), &w);
        assert!(!already_reported(Some(&status), Some(3), &broken));
    }

    #[test]
    fn the_transition_time_moves_only_when_verified_flips() {
        let w = Window::default();
        let ok = judge(&[probe("a", admitted(true, 1), None)], &subject(), &w);
        let t0 = Timestamp::from_second(100).unwrap();
        let (c, p) = probe_status(None, Some(1), &ok, &w, t0);
        let status = InjectionPolicyStatus {
            conditions: vec![c],
            probe: Some(p),
            ..Default::default()
        };
        let t1 = Timestamp::from_second(200).unwrap();
        let (same, _) = probe_status(Some(&status), Some(2), &ok, &w, t1);
        assert_eq!(same.last_transition_time, Time(t0));
        assert_eq!(same.observed_generation, Some(2));
        let bad = judge(&[probe("a", admitted(false, 1), None)], &subject(), &w);
        let (flipped, p) = probe_status(Some(&status), Some(2), &bad, &w, t1);
        assert_eq!(flipped.last_transition_time, Time(t1));
        assert_eq!(flipped.status, "False");
        assert_eq!(p.result, reason::NOT_INJECTED);
        assert_eq!(p.affected_namespaces, ["a"]);
    }

    #[test]
    fn the_token_bucket_spaces_requests_after_the_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(5.0, 2.0, t0);
        assert_eq!(b.reserve(t0), Duration::ZERO);
        assert_eq!(b.reserve(t0), Duration::ZERO);
        let third = b.reserve(t0);
        assert!((third.as_secs_f64() - 0.2).abs() < 1e-9, "{third:?}");
        let fourth = b.reserve(t0);
        assert!((fourth.as_secs_f64() - 0.4).abs() < 1e-9, "{fourth:?}");
        // After a quiet second the bucket is full again (never more than the burst).
        let later = t0 + Duration::from_secs(10);
        assert_eq!(b.reserve(later), Duration::ZERO);
        assert_eq!(b.reserve(later), Duration::ZERO);
        assert!(b.reserve(later) > Duration::ZERO);
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        let i = Duration::from_secs(60);
        assert_eq!(jittered(i, 0), Duration::from_secs(54));
        assert_eq!(jittered(i, u64::MAX), Duration::from_secs(66));
        let mid = jittered(i, u64::MAX / 2);
        assert!(mid > Duration::from_secs(59) && mid < Duration::from_secs(61));
    }

    #[test]
    fn p99_is_the_nearest_rank() {
        let mut w = Window::default();
        for ms in 1..=30u64 {
            w.push(Duration::from_millis(ms), Duration::from_millis(ms));
        }
        // The window keeps the last 20 (11..=30); p99 of 20 is the largest.
        assert_eq!(w.len(), WINDOW);
        assert_eq!(w.p99().unwrap().0, Duration::from_millis(30));
        assert!(Window::default().p99().is_none());
    }
}
