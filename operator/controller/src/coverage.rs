//! Coverage: how many of the pods a policy selects carry its injection, with the current or an
//! outdated template, and how many it missed, counted once per pass over the leader's view
//! ([`crate::view`]) when something changed; exported as `splice_coverage_pods{policy,state}`,
//! written to `status.coverage` only when a count changed.
//!
//! "Matched" is defined so that it can be honest: pods are only injected when created, so a pod
//! that existed before the policy was in force is not expected to carry it. A selected pod counts
//! as matched when it carries the policy's injection (any template), or when it was created once
//! Ready had turned True (the API server seen enforcing the policy) without carrying it: that pod
//! is "missed", e.g. admitted while the webhook was unreachable under failurePolicy Ignore.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use splice_crds::{
    ConditionStatus, Coverage, InjectionPolicy, InjectionPolicyStatus, condition, set_condition,
};
use splice_engine::explain::selects_namespace;
use splice_engine::{CompiledPolicy, Exclusions, NamespaceContext};

use crate::driver::{self, Inputs, Loop, Now, Pass, Snapshot, Write};
use crate::metrics::Metrics;
use crate::policy::conditions::{PlannedEvent, Severity};
use crate::status::Owner;
use crate::view::{PodRecord, PodState, classify, in_force_since, version};

pub use crate::status::COVERAGE_MANAGER;
/// One counting pass at most this often, so pod churn costs at most one status write per policy
/// per period, and an idle cluster none.
pub const PERIOD: Duration = Duration::from_secs(5);
/// A count that only moved (no pod newly missed, not the last outdated pod gone) is written at
/// most this often: during a rollout the counts move every pass, and a write per pass was a tenth
/// of a write per pod updated in place.
pub const SETTLING_INTERVAL: Duration = Duration::from_secs(15);
/// Missed pods named in an Event.
const EXAMPLES: usize = 5;

/// The counts for one policy, and a few missed pods to name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Count {
    pub coverage: Coverage,
    pub missed_examples: Vec<String>,
}

/// Counts the pods `policy` selects (see [`classify`]).
pub fn count<'a>(
    policy: &'a CompiledPolicy,
    in_force_since: Option<Timestamp>,
    namespaces: &'a HashMap<String, NamespaceContext>,
    exclusions: &'a Exclusions,
    pods: impl IntoIterator<Item = &'a PodRecord> + 'a,
) -> Count {
    let mut out = Count::default();
    for (pod, state) in classify(policy, in_force_since, namespaces, exclusions, pods) {
        let c = &mut out.coverage;
        c.matched += 1;
        match state {
            PodState::Current => c.current += 1,
            PodState::Outdated => c.outdated += 1,
            PodState::Missed => {
                c.missed += 1;
                if out.missed_examples.len() < EXAMPLES {
                    out.missed_examples
                        .push(format!("{}/{}", pod.namespace, pod.name));
                }
            }
        }
    }
    out
}

/// (uid, generation, compiled policy).
type CompiledEntry = (Option<String>, Option<i64>, Arc<CompiledPolicy>);
/// (pod generation, namespace generation, (policy, resourceVersion, data)…): what a pass saw.
type Seen = (u64, u64, Vec<(String, Option<String>, String)>);

/// The leader's coverage loop ([`Counting`] under the shared driver); ends with the term.
pub async fn run(splice_namespace: String, inputs: Inputs) {
    driver::run(Counting::new(&splice_namespace), (), inputs).await;
}

/// The coverage loop's state: plain data, decided over by [`Loop::pass`].
pub struct Counting {
    exclusions: Exclusions,
    /// Compilations of policies the webhook does not serve at their generation, kept per
    /// (uid, generation) so a pass compiles only what changed.
    compiled: HashMap<String, CompiledEntry>,
    last_seen: Option<Seen>,
    /// What the last pass counted, until published.
    gauges: Option<HashMap<String, [i64; 4]>>,
}

impl Counting {
    pub fn new(splice_namespace: &str) -> Self {
        Counting {
            exclusions: Exclusions::default_for(splice_namespace),
            compiled: HashMap::new(),
            last_seen: None,
            gauges: None,
        }
    }

    /// Each policy with its compiled generation; a policy that does not compile is left out (the
    /// reconcile reports it; nothing is injected for it).
    fn compile(&mut self, view: &Snapshot) -> Vec<(Arc<InjectionPolicy>, Arc<CompiledPolicy>)> {
        let mut work = Vec::with_capacity(view.policies.len());
        for policy in &view.policies {
            let name = policy.name_any();
            let key = (policy.uid(), policy.metadata.generation);
            // The webhook's own compilation of this generation, when it has it: a second one per
            // policy (templates, selectors, render caches) would double that memory.
            if let Some(c) = view
                .in_force_of(&name)
                .filter(|c| Some(c.generation()) == key.1)
            {
                self.compiled.remove(&name);
                work.push((Arc::clone(policy), c));
                continue;
            }
            let c = match self.compiled.get(&name) {
                Some((uid, generation, c)) if (uid, generation) == (&key.0, &key.1) => {
                    Arc::clone(c)
                }
                _ => {
                    match CompiledPolicy::compile(&name, key.1.unwrap_or_default(), &policy.spec) {
                        Ok(c) => {
                            let c = Arc::new(c);
                            self.compiled
                                .insert(name.clone(), (key.0, key.1, Arc::clone(&c)));
                            c
                        }
                        Err(_) => continue,
                    }
                }
            };
            work.push((Arc::clone(policy), c));
        }
        work
    }
}

/// What a pass depends on besides the pods and namespaces: each policy's resourceVersion, and the
/// served entry's data digests (a valuesFrom change moves no resourceVersion).
fn seen(view: &Snapshot) -> Seen {
    let mut policies: Vec<(String, Option<String>, String)> = view
        .policies
        .iter()
        .map(|p| {
            let name = p.name_any();
            let data = view
                .served
                .get(&name)
                .map(|c| version("", c.data_digests()))
                .unwrap_or_default();
            (name, p.resource_version(), data)
        })
        .collect();
    policies.sort();
    (view.pods_generation, view.namespaces_generation, policies)
}

impl Loop for Counting {
    const NAME: &'static str = "coverage";
    const OWNER: Owner = Owner::Coverage;
    const PODS: bool = true;
    type Look = Infallible;
    type Act = Infallible;
    type Seen = Infallible;
    type Io = ();
    type Extra = ();

    fn period(&self) -> Duration {
        PERIOD
    }

    /// Counts every policy when anything it depends on changed; writes the counts that differ
    /// from the known ones.
    fn pass(&mut self, view: &Snapshot, now: Now) -> Pass<Infallible> {
        let seen = seen(view);
        if self.last_seen.as_ref() == Some(&seen) {
            return Pass::default();
        }
        self.last_seen = Some(seen);
        let mut gauges = HashMap::new();
        let mut writes = Vec::new();
        for (policy, c) in self.compile(view) {
            let pods = view.pods.iter().map(|r| &**r);
            let since = in_force_since(&policy);
            let n = count(&c, since, &view.namespaces, &self.exclusions, pods);
            let cv = n.coverage;
            gauges.insert(
                c.name().to_owned(),
                [cv.matched, cv.current, cv.outdated, cv.missed],
            );
            let known_slice = view.status(Owner::Coverage, &policy);
            let known = known_slice.as_ref().and_then(|s| s.coverage);
            let accepted = overrides_accepted(&c, &view.namespaces, &self.exclusions);
            let conditions = conditions_of(&policy, known_slice.as_deref(), accepted.as_ref(), now);
            let conditions_moved =
                Owner::Coverage.slice(known_slice.as_deref()).conditions != conditions;
            let recent = view
                .written_at
                .get(c.name())
                .is_some_and(|at| now.at.saturating_duration_since(*at) < SETTLING_INTERVAL);
            if recent && !conditions_moved && known.is_some_and(|k| !urgent(&k, &n.coverage)) {
                if known != Some(n.coverage) {
                    // Held back: count again next tick, whatever changes.
                    self.last_seen = None;
                }
                continue;
            }
            // Warned once per new set of refusals: the condition's message names them.
            let refused_anew = conditions_moved && accepted.as_ref().is_some_and(|a| a.refused > 0);
            writes.extend(write_of(
                &policy,
                known,
                &n,
                Slice {
                    conditions,
                    conditions_moved,
                    refused: accepted.filter(|_| refused_anew),
                },
            ));
        }
        self.compiled.retain(|name, _| gauges.contains_key(name));
        self.compiled.shrink_to_fit();
        self.gauges = Some(gauges);
        Pass {
            writes,
            ..Pass::default()
        }
    }

    async fn act(_io: &(), act: Infallible) -> Infallible {
        act
    }

    /// Looks again next pass even if nothing else changes.
    fn failed(&mut self, _policy: &str, _now: Now) {
        self.last_seen = None;
    }

    fn publish(&mut self, metrics: &Metrics) {
        if let Some(gauges) = self.gauges.take() {
            metrics.set_coverage(gauges);
        }
    }
}

/// Whether `now` must be written at once rather than with the next settled count: a pod newly
/// missed (its Warning goes with the write), or every selected pod current again.
fn urgent(known: &Coverage, now: &Coverage) -> bool {
    now.missed > known.missed || (now.outdated == 0 && known.outdated > 0)
}

/// What a policy's overrides make of the namespaces it selects: how many annotations they
/// refuse, and the condition's message. `None` for a policy without overrides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    pub refused: usize,
    pub message: String,
}

/// The namespaces whose annotations `policy`'s overrides refuse, among those it selects (at most
/// [`EXAMPLES`] named). Their pods get the default; no pod is refused for a namespace's value.
pub fn overrides_accepted(
    policy: &CompiledPolicy,
    namespaces: &HashMap<String, NamespaceContext>,
    exclusions: &Exclusions,
) -> Option<Accepted> {
    let overrides = policy.overrides();
    if overrides.is_empty() {
        return None;
    }
    let mut names: Vec<&String> = namespaces.keys().collect();
    names.sort();
    let mut refusals = Vec::new();
    for name in names {
        let context = &namespaces[name];
        if !selects_namespace(policy, context, exclusions) {
            continue;
        }
        if let Some(r) = overrides.from_namespace(name, &context.annotations) {
            refusals.extend(r.namespace_refusals);
        }
    }
    let message = if refusals.is_empty() {
        "every override annotation on the namespaces this policy selects is accepted".to_owned()
    } else {
        let shown: Vec<String> = refusals
            .iter()
            .take(EXAMPLES)
            .map(ToString::to_string)
            .collect();
        let more = refusals.len().saturating_sub(EXAMPLES);
        format!(
            "{} namespace annotation(s) refused, their pods get the default: {}{}",
            refusals.len(),
            shown.join("; "),
            if more > 0 {
                format!("; and {more} more")
            } else {
                String::new()
            }
        )
    };
    Some(Accepted {
        refused: refusals.len(),
        message,
    })
}

/// The coverage slice's conditions: OverridesAccepted for a policy with overrides, none else.
fn conditions_of(
    policy: &InjectionPolicy,
    known: Option<&InjectionPolicyStatus>,
    accepted: Option<&Accepted>,
    now: Now,
) -> Vec<Condition> {
    let Some(a) = accepted else {
        return Vec::new();
    };
    let mut conditions = Owner::Coverage.slice(known).conditions;
    let (status, reason) = if a.refused == 0 {
        (ConditionStatus::True, "Accepted")
    } else {
        (ConditionStatus::False, "NamespaceValueRefused")
    };
    set_condition(
        &mut conditions,
        condition::OVERRIDES_ACCEPTED,
        status,
        reason,
        &a.message,
        policy.metadata.generation,
        now.wall,
    );
    conditions
}

/// The conditions a coverage write carries, and the refusals to warn about.
struct Slice {
    conditions: Vec<Condition>,
    conditions_moved: bool,
    /// Set when namespace annotations are refused and the condition names a new set of them.
    refused: Option<Accepted>,
}

/// The write `n` comes to for `policy` whose known coverage is `known`: none when it and the
/// conditions say the same (an absent coverage reads as zero, so a policy that matches nothing
/// costs no write); a PodsMissed Warning with it when more pods were missed than before, else an
/// OverrideRefused Warning when the condition names new refusals.
fn write_of(
    policy: &Arc<InjectionPolicy>,
    known: Option<Coverage>,
    n: &Count,
    slice: Slice,
) -> Option<Write> {
    let before = known.unwrap_or_default();
    if before == n.coverage && !slice.conditions_moved {
        return None;
    }
    let refused = slice.refused.map(|a| PlannedEvent {
        severity: Severity::Warning,
        reason: "OverrideRefused".into(),
        action: "CheckOverrides",
        note: a.message,
    });
    let then = (n.coverage.missed > before.missed).then(|| PlannedEvent {
        severity: Severity::Warning,
        reason: "PodsMissed".into(),
        action: "CountCoverage",
        note: format!(
            "{} pod(s) this policy selects were admitted without its injection (e.g. {}): the \
             webhook was unreachable or failed open, or the API server had not yet seen their \
             namespace's new labels. Recreate them to inject.",
            n.coverage.missed,
            n.missed_examples.join(", ")
        ),
    });
    Some(Write {
        policy: Arc::clone(policy),
        slice: InjectionPolicyStatus {
            coverage: Some(n.coverage),
            conditions: slice.conditions,
            ..InjectionPolicyStatus::default()
        },
        then: then.or(refused),
        log: None,
    })
}

#[cfg(test)]
mod tests {
    use splice_crds::InjectionPolicySpec;

    use super::*;
    use crate::view::{PodOwner, record};
    use k8s_openapi::api::core::v1::Pod;
    use kube::core::PartialObjectMeta;
    use splice_crds::STATUS_ANNOTATION;

    fn policy(yaml: &str) -> CompiledPolicy {
        let spec: InjectionPolicySpec = serde_yaml::from_str(yaml).unwrap();
        CompiledPolicy::compile("mesh", 1, &spec).unwrap()
    }

    fn pod(
        ns: &str,
        name: &str,
        labels: &[(&str, &str)],
        created: i64,
        hash: Option<&str>,
    ) -> PodRecord {
        PodRecord {
            namespace: Arc::from(ns),
            name: name.into(),
            uid: format!("{ns}/{name}"),
            service_account: String::new(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            created: Some(Timestamp::from_second(created).unwrap()),
            injected: hash
                .map(|h| vec![("mesh".to_owned(), h.to_owned())])
                .unwrap_or_default(),
            owner: PodOwner::None,
            in_place: Vec::new(),
            overrides: Vec::new(),
        }
    }

    fn at(s: i64) -> Option<Timestamp> {
        Some(Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn pods_are_counted_as_current_outdated_or_missed() {
        let p = policy("objectSelector: {matchLabels: {app: web}}\ntemplate: {labels: {a: b}}\n");
        let h = p.template_hash().to_owned();
        let pods = [
            pod("shop", "current", &[("app", "web")], 2000, Some(&h)),
            pod("shop", "outdated", &[("app", "web")], 500, Some("old")),
            pod("shop", "missed", &[("app", "web")], 2000, None),
            pod("shop", "before", &[("app", "web")], 500, None),
            pod("shop", "just-before-ready", &[("app", "web")], 999, None),
            pod("shop", "missed-at-ready", &[("app", "web")], 1000, None),
            pod("shop", "other", &[("app", "api")], 2000, None),
            pod("kube-system", "excluded", &[("app", "web")], 2000, None),
        ];
        let n = count(
            &p,
            at(1000),
            &HashMap::new(),
            &Exclusions::default_for("splice-system"),
            &pods,
        );
        assert_eq!(
            n.coverage,
            Coverage {
                matched: 4,
                current: 1,
                outdated: 1,
                missed: 2
            }
        );
        assert_eq!(n.missed_examples, ["shop/missed", "shop/missed-at-ready"]);
    }

    #[test]
    fn a_namespace_annotation_change_outdates_the_pods_that_took_its_value() {
        let p = policy(
            "overrides: [{name: cpu, annotation: mesh.example/cpu, type: quantity, default: 100m}]\n\
             template: {annotations: {cpu: '{{ overrides.cpu }}'}}\n",
        );
        let h = p.template_hash().to_owned();
        let record = |from: &str, value: &str| {
            let rec = splice_engine::OverrideRecord {
                from: from.into(),
                sha256: splice_engine::overrides::digest(value),
            };
            vec![("mesh".to_owned(), [("cpu".to_owned(), rec)].into())]
        };
        let mut from_ns = pod("shop", "from-namespace", &[], 2000, Some(&h));
        from_ns.overrides = record("namespace", "200m");
        let mut own = pod("shop", "own", &[], 2000, Some(&h));
        own.overrides = record("pod", "300m");
        let namespaces = |value: &str| {
            let context = NamespaceContext {
                name: "shop".into(),
                annotations: [("mesh.example/cpu".to_owned(), value.to_owned())].into(),
                ..NamespaceContext::default()
            };
            HashMap::from([("shop".to_owned(), context)])
        };
        let exclusions = Exclusions::default_for("s");
        let pods = [from_ns, own];
        let same = count(&p, at(0), &namespaces("200m"), &exclusions, &pods);
        assert_eq!((same.coverage.current, same.coverage.outdated), (2, 0));
        let changed = count(&p, at(0), &namespaces("400m"), &exclusions, &pods);
        assert_eq!(
            (changed.coverage.current, changed.coverage.outdated),
            (1, 1)
        );
    }

    #[test]
    fn a_refused_namespace_annotation_is_named_in_the_condition_and_selected_namespaces_only() {
        let p = policy(
            "namespaceSelector: {matchLabels: {mesh: 'on'}}\n\
             overrides: [{name: level, annotation: mesh.example/level, type: string, \
             default: info, rule: \"self in ['info', 'debug']\", message: 'info or debug'}]\n",
        );
        let ns = |name: &str, mesh: &str, level: &str| {
            let context = NamespaceContext {
                name: name.into(),
                labels: [("mesh".to_owned(), mesh.to_owned())].into(),
                annotations: [("mesh.example/level".to_owned(), level.to_owned())].into(),
            };
            (name.to_owned(), context)
        };
        let exclusions = Exclusions::default_for("s");
        let namespaces = HashMap::from([
            ns("good", "on", "debug"),
            ns("bad", "on", "trace"),
            ns("unselected", "off", "trace"),
        ]);
        let a = overrides_accepted(&p, &namespaces, &exclusions).unwrap();
        assert_eq!(a.refused, 1);
        assert!(a.message.contains("namespace bad"), "{}", a.message);
        assert!(a.message.contains("info or debug"), "{}", a.message);
        assert!(!a.message.contains("unselected"), "{}", a.message);
        let fine = HashMap::from([ns("good", "on", "debug")]);
        assert_eq!(
            overrides_accepted(&p, &fine, &exclusions).unwrap().refused,
            0
        );
        assert_eq!(
            overrides_accepted(&policy("{}\n"), &namespaces, &exclusions),
            None
        );
    }

    #[test]
    fn without_a_configuration_in_force_nothing_is_missed() {
        let p = policy("{}\n");
        let pods = [pod("shop", "a", &[], 2000, None)];
        let n = count(
            &p,
            None,
            &HashMap::new(),
            &Exclusions::default_for("s"),
            &pods,
        );
        assert_eq!(n.coverage, Coverage::default());
    }

    #[test]
    fn an_update_only_policy_misses_no_pod() {
        let p = policy("operations: [UPDATE]\n");
        let pods = [pod("shop", "a", &[], 2000, None)];
        let n = count(
            &p,
            at(0),
            &HashMap::new(),
            &Exclusions::default_for("s"),
            &pods,
        );
        assert_eq!(n.coverage.missed, 0);
    }

    #[test]
    fn namespace_labels_come_from_the_namespace_records() {
        let p = policy("namespaceSelector: {matchLabels: {mesh: on}}\n");
        let pods = [
            pod("a", "x", &[], 2000, None),
            pod("b", "y", &[], 2000, None),
        ];
        let mut namespaces = HashMap::new();
        namespaces.insert(
            "a".to_owned(),
            NamespaceContext {
                name: "a".into(),
                labels: [("mesh".to_owned(), "on".to_owned())].into(),
                ..Default::default()
            },
        );
        let n = count(&p, at(0), &namespaces, &Exclusions::default_for("s"), &pods);
        assert_eq!(n.coverage.missed, 1);
        assert_eq!(n.missed_examples, ["a/x"]);
    }

    #[test]
    fn a_pod_record_keeps_the_hashes_of_its_status_annotation() {
        let mut meta = PartialObjectMeta::<Pod>::default();
        meta.metadata.namespace = Some("shop".into());
        meta.metadata.name = Some("web".into());
        meta.metadata.annotations = Some(
            [(
                STATUS_ANNOTATION.to_owned(),
                r#"{"mesh":{"hash":"h1","containers":["proxy"]}}"#.to_owned(),
            )]
            .into(),
        );
        let r = record(&meta, &mut HashMap::new()).unwrap();
        assert_eq!(r.injected, [("mesh".to_owned(), "h1".to_owned())]);
        assert_eq!(r.recorded_hash("mesh"), Some("h1"));
    }

    /// A policy named `mesh` selecting `app: web`, Ready (in force) since second 1000.
    fn cached_policy(coverage: Option<Coverage>) -> Arc<InjectionPolicy> {
        let mut p: InjectionPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "splice.dev/v1alpha1", "kind": "InjectionPolicy",
            "metadata": {"name": "mesh", "uid": "u1", "generation": 1, "resourceVersion": "5"},
            "spec": {
                "objectSelector": {"matchLabels": {"app": "web"}},
                "template": {"labels": {"a": "b"}}
            }
        }))
        .unwrap();
        p.status = Some(splice_crds::InjectionPolicyStatus {
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: splice_crds::condition::READY.into(),
                status: "True".into(),
                reason: "Configured".into(),
                message: String::new(),
                observed_generation: Some(1),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    Timestamp::from_second(1000).unwrap(),
                ),
            }],
            coverage,
            ..Default::default()
        });
        Arc::new(p)
    }

    fn view(policy: Arc<InjectionPolicy>, pods: Vec<PodRecord>) -> Snapshot {
        Snapshot {
            policies: vec![policy],
            pods: Arc::new(pods.into_iter().map(Arc::new).collect()),
            pods_generation: 1,
            namespaces_generation: 1,
            ..Snapshot::default()
        }
    }

    fn now() -> Now {
        Now::current()
    }

    /// `matched` pods selected, `missed` of them missed.
    fn missing(matched: i64, missed: i64) -> Coverage {
        Coverage {
            matched,
            missed,
            ..Coverage::default()
        }
    }

    fn missed_two() -> Vec<PodRecord> {
        vec![
            pod("shop", "a", &[("app", "web")], 2000, None),
            pod("shop", "b", &[("app", "web")], 2000, None),
        ]
    }

    #[test]
    fn a_pass_writes_a_changed_count_and_warns_naming_the_missed_pods() {
        let mut c = Counting::new("splice-system");
        let pass = c.pass(&view(cached_policy(None), missed_two()), now());
        let [w] = pass.writes.as_slice() else {
            panic!("one write: {:?}", pass.writes)
        };
        let counted = missing(2, 2);
        assert_eq!(w.slice.coverage, Some(counted));
        assert!(w.slice.conditions.is_empty() && w.slice.probe.is_none());
        let event = w.then.as_ref().expect("a PodsMissed Event");
        assert_eq!(
            (event.reason.as_str(), event.action, event.severity),
            ("PodsMissed", "CountCoverage", Severity::Warning)
        );
        assert!(
            event.note.contains("(e.g. shop/a, shop/b)"),
            "{}",
            event.note
        );
        assert_eq!(c.gauges.as_ref().unwrap()["mesh"], [2, 0, 0, 2]);
    }

    #[test]
    fn an_unchanged_view_is_not_counted_again_until_a_write_fails() {
        let mut c = Counting::new("splice-system");
        let v = view(cached_policy(None), missed_two());
        assert_eq!(c.pass(&v, now()).writes.len(), 1);
        c.publish(&Metrics::new());
        let again = c.pass(&v, now());
        assert!(again.writes.is_empty() && c.gauges.is_none());
        c.failed("mesh", now());
        assert_eq!(
            c.pass(&v, now()).writes.len(),
            1,
            "counted again after a failure"
        );
    }

    #[test]
    fn a_count_the_cache_or_a_pending_write_holds_is_not_written_again() {
        let counted = missing(2, 2);
        let mut c = Counting::new("splice-system");
        let shown = view(cached_policy(Some(counted)), missed_two());
        assert!(c.pass(&shown, now()).writes.is_empty());

        let mut c = Counting::new("splice-system");
        let mut pending = view(cached_policy(None), missed_two());
        pending.pending.insert(
            "mesh".into(),
            splice_crds::InjectionPolicyStatus {
                coverage: Some(counted),
                ..Default::default()
            },
        );
        assert!(c.pass(&pending, now()).writes.is_empty());
    }

    #[test]
    fn a_policy_that_matches_nothing_costs_no_write_but_exports_zeros() {
        let mut c = Counting::new("splice-system");
        let pass = c.pass(&view(cached_policy(None), Vec::new()), now());
        assert!(pass.writes.is_empty());
        assert_eq!(c.gauges.as_ref().unwrap()["mesh"], [0, 0, 0, 0]);
    }

    #[test]
    fn fewer_missed_pods_are_written_without_a_warning() {
        let before = missing(3, 3);
        let mut c = Counting::new("splice-system");
        let pass = c.pass(&view(cached_policy(Some(before)), missed_two()), now());
        let [w] = pass.writes.as_slice() else {
            panic!("one write")
        };
        assert_eq!(w.slice.coverage.map(|c| c.missed), Some(2));
        assert!(w.then.is_none());
    }

    #[test]
    fn a_count_that_only_moved_waits_for_the_settling_interval_a_newly_missed_pod_does_not() {
        let written = |ago: Duration| {
            let now = now();
            let mut v = view(cached_policy(Some(missing(3, 3))), missed_two());
            v.written_at.insert("mesh".into(), now.at - ago);
            (v, now)
        };
        let mut c = Counting::new("splice-system");
        let (v, at) = written(Duration::from_secs(1));
        assert!(c.pass(&v, at).writes.is_empty(), "held back");
        let (v, at) = written(Duration::from_secs(2));
        assert!(
            c.pass(&v, at).writes.is_empty() && c.gauges.is_some(),
            "counted again on the next tick though nothing changed"
        );
        let (v, at) = written(SETTLING_INTERVAL);
        assert_eq!(c.pass(&v, at).writes.len(), 1, "written once settled");

        let mut c = Counting::new("splice-system");
        let mut v = view(cached_policy(Some(missing(2, 1))), missed_two());
        let at = now();
        v.written_at.insert("mesh".into(), at.at);
        let pass = c.pass(&v, at);
        assert!(
            pass.writes.len() == 1 && pass.writes[0].then.is_some(),
            "a newly missed pod is written and warned at once"
        );
    }

    #[test]
    fn a_policy_that_does_not_compile_is_not_counted() {
        let mut p = (*cached_policy(None)).clone();
        p.spec.object_selector = serde_json::from_value(serde_json::json!(
            {"matchExpressions": [{"key": "app", "operator": "Bogus"}]}
        ))
        .unwrap();
        let mut c = Counting::new("splice-system");
        let pass = c.pass(&view(Arc::new(p), missed_two()), now());
        assert!(pass.writes.is_empty());
        assert!(c.gauges.as_ref().unwrap().is_empty());
    }
}
