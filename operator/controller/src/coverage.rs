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
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use crate::leader::Leadership;
use crate::metrics::Metrics;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use splice_crds::{Coverage, InjectionPolicy};
use splice_engine::{CompiledPolicy, Exclusions, NamespaceContext};

use crate::view::{LeaderView, PodRecord, PodState, Policies, classify, in_force_since, version};

pub use crate::status::COVERAGE_MANAGER;
/// One counting pass at most this often, so pod churn costs at most one status write per policy
/// per period, and an idle cluster none.
pub const PERIOD: Duration = Duration::from_secs(5);
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
/// (pod generation, namespace generation, (policy, resourceVersion)…): what the last pass saw.
type Seen = (u64, u64, Vec<(String, Option<String>, String)>);

/// The leader's coverage loop; cancelled with the rest of the leader's work.
pub async fn run(
    client: Client,
    splice_namespace: String,
    policies: Policies,
    observed: LeaderView,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    leading: Leadership,
) {
    let Policies {
        cache: policies,
        mut listed,
        webhook_policies: served,
    } = policies;
    let LeaderView { namespaces, pods } = observed;
    tracing::debug!("coverage: waiting for the policy cache");
    if listed.wait_for(|l| *l).await.is_err() {
        return;
    }
    tracing::debug!("coverage: counting");
    let exclusions = Exclusions::default_for(&splice_namespace);
    let api: Api<InjectionPolicy> = Api::all(client);
    let mut compiled: HashMap<String, CompiledEntry> = HashMap::new();
    // What this replica last wrote per policy (uid, coverage), until the cache shows it.
    let mut written: HashMap<String, (Option<String>, Coverage)> = HashMap::new();
    let mut last_seen: Option<Seen> = None;
    let mut ticker = tokio::time::interval(PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let all = policies.state();
        // The served entry's data digests too: a valuesFrom change moves no resourceVersion.
        let mut fingerprint: Vec<(String, Option<String>, String)> = all
            .iter()
            .map(|p| {
                let name = p.name_any();
                let data = served
                    .get(&name)
                    .map(|c| version("", c.data_digests()))
                    .unwrap_or_default();
                (name, p.resource_version(), data)
            })
            .collect();
        fingerprint.sort();
        let (pods_gen, pods_synced) = {
            let p = pods.lock().unwrap_or_else(PoisonError::into_inner);
            (p.generation, p.synced)
        };
        let (ns_gen, ns_synced, contexts) = {
            let n = namespaces.lock().unwrap_or_else(PoisonError::into_inner);
            (n.generation, n.synced, n.contexts.clone())
        };
        if !pods_synced || !ns_synced {
            tracing::debug!(
                pods_synced,
                ns_synced,
                "coverage: waiting for the pod and namespace lists"
            );
            continue;
        }
        let seen = (pods_gen, ns_gen, fingerprint);
        if last_seen.as_ref() == Some(&seen) {
            continue;
        }
        last_seen = Some(seen);

        let mut work = Vec::with_capacity(all.len());
        for policy in &all {
            let name = policy.name_any();
            let key = (policy.uid(), policy.metadata.generation);
            // The webhook's own compilation of this generation, when it has it: a second one per
            // policy (templates, selectors, render caches) would double that memory.
            if let Some(c) = crate::policy::in_force::in_force_of(&served, &name)
                .filter(|c| Some(c.generation()) == key.1)
            {
                compiled.remove(&name);
                work.push((Arc::clone(policy), c));
                continue;
            }
            let c = match compiled.get(&name) {
                Some((uid, generation, c)) if (uid, generation) == (&key.0, &key.1) => {
                    Arc::clone(c)
                }
                _ => {
                    match CompiledPolicy::compile(&name, key.1.unwrap_or_default(), &policy.spec) {
                        Ok(c) => {
                            let c = Arc::new(c);
                            compiled.insert(name.clone(), (key.0, key.1, Arc::clone(&c)));
                            c
                        }
                        // The reconciler reports an invalid policy; nothing is injected for it.
                        Err(_) => continue,
                    }
                }
            };
            work.push((Arc::clone(policy), c));
        }
        let snapshot = pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .snapshot();
        let excl = exclusions.clone();
        let started = std::time::Instant::now();
        // Policies × pods is CPU work: off the async workers, which also serve admissions.
        let pass = tokio::task::spawn_blocking(move || {
            let mut gauges = HashMap::new();
            let mut results = Vec::with_capacity(work.len());
            for (policy, c) in work {
                let n = count(
                    &c,
                    in_force_since(&policy),
                    &contexts,
                    &excl,
                    snapshot.iter().map(|r| &**r),
                );
                let cv = n.coverage;
                gauges.insert(
                    c.name().to_owned(),
                    [cv.matched, cv.current, cv.outdated, cv.missed],
                );
                results.push((policy, n));
            }
            (gauges, results)
        })
        .await;
        let Ok((gauges, results)) = pass else {
            return;
        };
        tracing::debug!(
            policies = results.len(),
            pods = pods_gen,
            took = ?started.elapsed(),
            "coverage pass"
        );
        compiled.retain(|name, _| gauges.contains_key(name));
        compiled.shrink_to_fit();
        written.retain(|name, _| gauges.contains_key(name));
        metrics.set_coverage(gauges);

        for (policy, n) in results {
            let name = policy.name_any();
            let cached = policy.status.as_ref().and_then(|s| s.coverage);
            let known = match written.get(&name) {
                Some((uid, cv)) if uid == &policy.uid() && cached != Some(*cv) => Some(*cv),
                _ => cached,
            };
            // An absent coverage reads as zero, so a policy that matches nothing costs no write.
            let before = known.unwrap_or_default();
            if before == n.coverage {
                continue;
            }
            if !leading.now() {
                return;
            }
            let patch = serde_json::json!({
                "apiVersion": InjectionPolicy::api_version(&()),
                "kind": InjectionPolicy::kind(&()),
                "status": { "coverage": n.coverage },
            });
            match api
                .patch_status(
                    &name,
                    &PatchParams::apply(COVERAGE_MANAGER).force(),
                    &Patch::Apply(&patch),
                )
                .await
            {
                Ok(_) => {
                    written.insert(name.clone(), (policy.uid(), n.coverage));
                }
                Err(e) => {
                    tracing::warn!(policy = %name, error = %e, "could not write status.coverage");
                    // Look again next pass even if nothing else changes.
                    last_seen = None;
                    continue;
                }
            }
            if n.coverage.missed > before.missed {
                let note = format!(
                    "{} pod(s) this policy selects were admitted without its injection (e.g. {}): \
                     the webhook was unreachable or failed open, or the API server had not yet \
                     seen their namespace's new labels. Recreate them to inject.",
                    n.coverage.missed,
                    n.missed_examples.join(", ")
                );
                let ev = Event {
                    type_: EventType::Warning,
                    reason: "PodsMissed".into(),
                    note: Some(note),
                    action: "CountCoverage".into(),
                    secondary: None,
                };
                if let Err(e) = recorder.publish(&ev, &policy.object_ref(&())).await {
                    tracing::warn!(policy = %name, error = %e, "could not publish the PodsMissed Event");
                }
            }
        }
    }
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
}
