//! `splice rollout status|halt|resume|promote|undo POLICY`: shows and steers a policy's rollout
//! (`spec.rollout`). `halt`, `resume` and `promote` only annotate the policy; the leader reads the
//! annotations at its next pass, so a request made while no replica leads is kept until one does.
//! `status` also lists each outdated pod's path as the engine sorts it
//! (`splice_engine::change::sort`, the leader's one rule); `undo` writes the pods itself.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::{Context as _, anyhow, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use splice_controller::policy::in_force;
use splice_controller::rollout::ROLLOUT_MANAGER;
use splice_controller::rollout::inplace::{self, Proof};
use splice_controller::rollout::plan::HALT_REQUESTED;
use splice_crds::{
    InjectionPolicy, ROLLOUT_HALT_ANNOTATION, ROLLOUT_PROMOTE_ANNOTATION,
    ROLLOUT_RESUME_ANNOTATION, RolloutPhase, RolloutStrategy, STATUS_ANNOTATION, condition,
};
use splice_engine::entry::CanaryScope;
use splice_engine::{Exclusions, NamespaceContext, Provenance};

use super::explain::{compile_online, sorted_path, values_data};
use super::offline::DEFAULT_SPLICE_NAMESPACE;
use splice_engine::identity::DEFAULT_TRUST_DOMAIN;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// Show where the policy's rollout stands; `-w` follows it until it completes or halts.
    Status {
        policy: String,
        /// Print a line at every change until the rollout completes (exit 0) or halts (exit 1).
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// Restart nothing more until `resume` (annotates the policy with splice.dev/rollout-halt).
    Halt { policy: String },
    /// Lift a halt of the current revision, requested or after a failed workload: workloads that
    /// failed before now no longer halt the rollout.
    Resume { policy: String },
    /// Promote the open canary now, healthy or not: every other pod gets its revision and the
    /// rest of the cluster rolls to it (annotates the policy with splice.dev/rollout-promote).
    Promote { policy: String },
    /// Put the pods a halted in-place stage updated back to the images before, in place.
    ///
    /// On every pod the halted revision updated in place (its splice.dev/in-place marker), puts
    /// back the images from before, which are the promoted revision's, and the record from
    /// before, in place: no application restarts. Only while the rollout is Halted: otherwise
    /// the leader would update the pods again.
    Undo { policy: String },
}

pub fn main(args: Args, cluster: &super::ClusterArgs) -> ExitCode {
    // Halted (status), or a pod not put back (undo): exit 1 after a normal run.
    let mut failed = false;
    let code = super::run_to_exit(async {
        let client = cluster.client().await?;
        let api: Api<InjectionPolicy> = Api::all(client.clone());
        match args.action {
            Action::Status { policy, watch } => {
                let p = api
                    .get(&policy)
                    .await
                    .with_context(|| format!("reading policy {policy}"))?;
                let line = describe(&p);
                println!("{line}");
                // The per-pod listing needs more than the policy (pods, namespaces): without
                // it the status line still stands.
                match pod_paths(&client, &p).await {
                    Ok(lines) => print!("{lines}"),
                    Err(e) => eprintln!("note: no per-pod paths: {e:#}"),
                }
                if watch && !finished(&p) {
                    // Follows until complete, or halted with no resume pending.
                    failed = follow(&api, &policy, line).await?;
                } else {
                    failed = phase(&p) == Some(RolloutPhase::Halted);
                }
            }
            Action::Halt { policy } => {
                annotate(&api, &policy, json!({ROLLOUT_HALT_ANNOTATION: now()})).await?;
                println!(
                    "policy {policy}: halt requested; the leader restarts nothing more until `rollout resume`"
                );
            }
            Action::Resume { policy } => {
                let p = api
                    .get(&policy)
                    .await
                    .with_context(|| format!("reading policy {policy}"))?;
                let revision = revision(&p).with_context(|| {
                    format!("policy {policy} has no revision in force to resume")
                })?;
                let value = format!("{revision}@{}", now());
                annotate(
                    &api,
                    &policy,
                    json!({ROLLOUT_HALT_ANNOTATION: null, ROLLOUT_RESUME_ANNOTATION: value}),
                )
                .await?;
                println!("policy {policy}: rollout of revision {revision} resumed");
            }
            Action::Promote { policy } => {
                let p = api
                    .get(&policy)
                    .await
                    .with_context(|| format!("reading policy {policy}"))?;
                let canary = p
                    .status
                    .as_ref()
                    .and_then(|s| s.rollout.as_ref())
                    .and_then(|r| r.canary_revision.clone())
                    .with_context(|| {
                        format!("policy {policy}: no canary is open, nothing to promote")
                    })?;
                annotate(&api, &policy, json!({ROLLOUT_PROMOTE_ANNOTATION: canary})).await?;
                println!(
                    "policy {policy}: promotion of canary revision {canary} requested; the leader promotes it at its next pass"
                );
            }
            Action::Undo { policy } => {
                let p = api
                    .get(&policy)
                    .await
                    .with_context(|| format!("reading policy {policy}"))?;
                let revision = halted_stage(&p).map_err(|e| anyhow!(e))?;
                let all = Api::<Pod>::all(client.clone())
                    .list(&ListParams::default())
                    .await
                    .context("listing pods")?;
                let mut undone = Undone::default();
                for pod in all.items.iter().filter(|p| undoes(p, &policy, &revision)) {
                    let id = pod_id(pod);
                    match undo(&client, pod, &policy, &revision).await {
                        Ok(true) => undone.put_back.push(id),
                        Ok(false) => undone.skipped.push(id),
                        Err(e) => undone.failed.push((id, format!("{e:#}"))),
                    }
                }
                println!("{}", undone.message(&policy, &revision));
                failed = !undone.failed.is_empty();
            }
        }
        Ok(())
    });
    if code == ExitCode::SUCCESS && failed {
        ExitCode::FAILURE
    } else {
        code
    }
}

fn now() -> String {
    Timestamp::now().to_string()
}

fn phase(p: &InjectionPolicy) -> Option<RolloutPhase> {
    Some(p.status.as_ref()?.rollout.as_ref()?.phase)
}

/// The revision in force (the one the rollout rolls out), else the last one it reported.
fn revision(p: &InjectionPolicy) -> Option<String> {
    let s = p.status.as_ref()?;
    s.template_hash
        .clone()
        .or_else(|| s.rollout.as_ref().map(|r| r.revision.clone()))
}

/// Complete, idle, or halted with no resume pending (a resume the leader has not acted on yet
/// leaves the status halted for a moment).
fn finished(p: &InjectionPolicy) -> bool {
    let Some(r) = p.status.as_ref().and_then(|s| s.rollout.as_ref()) else {
        return p.spec.rollout.is_none();
    };
    match r.phase {
        RolloutPhase::Complete | RolloutPhase::Idle => true,
        RolloutPhase::Rolling | RolloutPhase::Canary => false,
        RolloutPhase::Halted => !resume_pending(p, r),
    }
}

fn resume_pending(p: &InjectionPolicy, r: &splice_crds::RolloutStatus) -> bool {
    let annotations = p.metadata.annotations.clone().unwrap_or_default();
    if r.halted_by.as_deref() == Some(HALT_REQUESTED) {
        return !annotations.contains_key(ROLLOUT_HALT_ANNOTATION);
    }
    let resumed = annotations
        .get(ROLLOUT_RESUME_ANNOTATION)
        .and_then(|v| v.split_once('@'))
        .filter(|(revision, _)| *revision == r.revision)
        .and_then(|(_, at)| at.parse::<Timestamp>().ok());
    let halted = r
        .halted_at
        .as_deref()
        .and_then(|t| t.parse::<Timestamp>().ok());
    match (resumed, halted) {
        (Some(resumed), Some(halted)) => resumed > halted,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// The revision of the halted stage `undo` acts on; refused unless the rollout is Halted.
fn halted_stage(p: &InjectionPolicy) -> Result<String, String> {
    let name = p.name_any();
    let Some(r) = p.status.as_ref().and_then(|s| s.rollout.as_ref()) else {
        return Err(format!(
            "policy {name} reports no rollout; undo acts only on a halted in-place stage"
        ));
    };
    if r.phase != RolloutPhase::Halted {
        return Err(format!(
            "policy {name}: the rollout is {}, not Halted; undo acts only on a halted stage, \
             else the leader would update the pods again (halt it first: `rollout halt {name}`)",
            r.phase.as_str()
        ));
    }
    Ok(r.revision.clone())
}

/// Whether `pod` carries `policy`'s in-place marker for `revision`: a pod the stage changed.
fn undoes(pod: &Pod, policy: &str, revision: &str) -> bool {
    inplace::markers(pod.metadata.annotations.as_ref())
        .get(policy)
        .is_some_and(|m| m.revision == revision)
}

fn pod_id(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

/// Puts `pod` back; false when it went, or no longer carries the stage's marker. The patch's
/// `resourceVersion` refuses a pod changed since it was read: read it again once and retry.
async fn undo(
    client: &kube::Client,
    pod: &Pod,
    policy: &str,
    revision: &str,
) -> anyhow::Result<bool> {
    let api = Api::<Pod>::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let name = pod.name_any();
    let params = PatchParams {
        field_manager: Some(ROLLOUT_MANAGER.into()),
        ..PatchParams::default()
    };
    let mut current = pod.clone();
    for retry in [true, false] {
        let Some(patch) = inplace::undo_patch(&current, policy) else {
            return Ok(false);
        };
        match api.patch(&name, &params, &Patch::Strategic(&patch)).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(false),
            Err(kube::Error::Api(s)) if s.code == 409 && retry => {
                match api.get_opt(&name).await.context("reading it again")? {
                    Some(p) if undoes(&p, policy, revision) => current = p,
                    _ => return Ok(false),
                }
            }
            Err(e) => return Err(e).context("patching it"),
        }
    }
    bail!("it changed again while being put back")
}

/// What `undo` did, pod by pod (`namespace/name`).
#[derive(Debug, Default)]
struct Undone {
    put_back: Vec<String>,
    /// Gone, or no longer carrying the stage's marker, when written.
    skipped: Vec<String>,
    failed: Vec<(String, String)>,
}

/// At most this many pods are named in a line.
const NAMED: usize = 10;

fn named(pods: &[String]) -> String {
    let mut text = pods
        .iter()
        .take(NAMED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if pods.len() > NAMED {
        text.push_str(&format!(" and {} more", pods.len() - NAMED));
    }
    text
}

impl Undone {
    fn message(&self, policy: &str, revision: &str) -> String {
        if self.put_back.is_empty() && self.skipped.is_empty() && self.failed.is_empty() {
            return format!(
                "policy {policy}: no pod carries an in-place update of revision {revision}; \
                 nothing to undo"
            );
        }
        let mut text = format!(
            "policy {policy}: put {} pod(s) back in place to the images before revision {revision}",
            self.put_back.len()
        );
        if !self.put_back.is_empty() {
            text.push_str(&format!(": {}", named(&self.put_back)));
        }
        if !self.skipped.is_empty() {
            text.push_str(&format!(
                "\n  skipped {} pod(s), gone or changed since: {}",
                self.skipped.len(),
                named(&self.skipped)
            ));
        }
        for (pod, why) in &self.failed {
            text.push_str(&format!("\n  could not put back {pod}: {why}"));
        }
        text
    }
}

/// Under `strategy: Auto` or `InPlace`, each outdated pod's path and each pod updating in place,
/// as lines; empty under `Restart` or without `spec.rollout`.
async fn pod_paths(client: &kube::Client, p: &InjectionPolicy) -> anyhow::Result<String> {
    let name = p.name_any();
    let Some(rollout) = &p.spec.rollout else {
        return Ok(String::new());
    };
    if rollout.strategy == RolloutStrategy::Restart {
        return Ok(String::new());
    }
    let data = values_data(client, std::slice::from_ref(p), DEFAULT_SPLICE_NAMESPACE).await;
    let compiled = compile_online(p, DEFAULT_SPLICE_NAMESPACE, &data)
        .map_err(|e| anyhow!("policy {name} does not compile: {e}"))?;
    // The leader's revision (what records and markers name: the template hash and, with
    // `valuesFrom`, the data digests), else the one this compile gives.
    let current = p
        .status
        .as_ref()
        .and_then(|s| s.rollout.as_ref())
        .map(|r| r.revision.clone())
        .unwrap_or_else(|| splice_controller::view::revision(&compiled));
    let all = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing pods")?;
    let namespaces: BTreeMap<String, NamespaceContext> = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing namespaces")?
        .items
        .into_iter()
        .map(|n| {
            let context = NamespaceContext {
                name: n.name_any(),
                labels: n.metadata.labels.unwrap_or_default(),
                annotations: n.metadata.annotations.unwrap_or_default(),
            };
            (context.name.clone(), context)
        })
        .collect();
    let canary =
        in_force::open_canary(p, compiled.template_hash()).map(|(c, _)| CanaryScope::of(c));
    let exclusions = Exclusions::default_for(DEFAULT_SPLICE_NAMESPACE);
    let mut outdated = Vec::new();
    let mut updating = Vec::new();
    for pod in &all.items {
        if let Some(m) = inplace::markers(pod.metadata.annotations.as_ref())
            .get(&name)
            .filter(|m| m.revision == current)
        {
            updating.push((pod_id(pod), inplace::proof(pod, m)));
        }
        if !outdated_for(pod, &name, &current) {
            continue;
        }
        let ns = pod.namespace().unwrap_or_default();
        let ns = namespaces.get(&ns).cloned().unwrap_or(NamespaceContext {
            name: ns,
            ..NamespaceContext::default()
        });
        let outside = canary.as_ref().is_some_and(|c| {
            !c.holds(
                Some(&ns.labels),
                pod.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
            )
        });
        let path = sorted_path(
            &compiled,
            rollout.strategy,
            pod,
            (&ns, &exclusions, DEFAULT_TRUST_DOMAIN),
            !outside,
        );
        outdated.push((pod_id(pod), path.why));
    }
    Ok(render_pods(&outdated, &updating))
}

/// Whether `pod`'s record names `policy` with a revision other than `current`.
fn outdated_for(pod: &Pod, policy: &str, current: &str) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(STATUS_ANNOTATION))
        .and_then(|s| serde_json::from_str::<Provenance>(s).ok())
        .and_then(|mut all| all.remove(policy))
        .is_some_and(|e| e.hash != current)
}

/// The per-pod lines of `rollout status`: outdated pods with their path, then pods updating in
/// place with their proof, pod names aligned.
fn render_pods(outdated: &[(String, String)], updating: &[(String, Proof)]) -> String {
    let width = outdated
        .iter()
        .map(|(p, _)| p)
        .chain(updating.iter().map(|(p, _)| p))
        .map(|p| p.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    if !outdated.is_empty() {
        out.push_str(&format!("  outdated pods ({}), by path:\n", outdated.len()));
    }
    for (pod, path) in outdated {
        out.push_str(&format!("    {pod:<width$}  {path}\n"));
    }
    if !updating.is_empty() {
        out.push_str(&format!("  updated in place ({}):\n", updating.len()));
    }
    for (pod, proof) in updating {
        out.push_str(&format!("    {pod:<width$}  {proof}\n"));
    }
    out
}

async fn annotate(
    api: &Api<InjectionPolicy>,
    policy: &str,
    annotations: serde_json::Value,
) -> anyhow::Result<()> {
    // A merge patch, not apply: it must fail on a missing policy rather than create one.
    let patch = json!({"metadata": {"annotations": annotations}});
    api.patch(policy, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotating policy {policy}"))?;
    Ok(())
}

/// Prints the rollout at every change until it completes or halts; true when it halted.
async fn follow(api: &Api<InjectionPolicy>, policy: &str, printed: String) -> anyhow::Result<bool> {
    let config = watcher::Config::default().fields(&format!("metadata.name={policy}"));
    let mut last = Some(printed);
    let mut events = std::pin::pin!(watcher(api.clone(), config).applied_objects());
    while let Some(p) = events.next().await {
        let p = p.with_context(|| format!("watching policy {policy}"))?;
        let line = describe(&p);
        if last.as_ref() != Some(&line) {
            println!("{line}");
            last = Some(line);
        }
        if finished(&p) {
            return Ok(phase(&p) == Some(RolloutPhase::Halted));
        }
    }
    bail!("the watch of policy {policy} ended")
}

/// One line (two with the condition) a person reads: phase, revision and counts.
fn describe(p: &InjectionPolicy) -> String {
    let name = p.metadata.name.as_deref().unwrap_or_default();
    if p.spec.rollout.is_none() {
        return format!("{name}: no spec.rollout: template changes restart nothing");
    }
    let Some(s) = p.status.as_ref().and_then(|s| s.rollout.as_ref()) else {
        return format!("{name}: rollout not reported yet (no leader, or not Ready)");
    };
    let mut line = format!(
        "{name}: {} revision {}: {} restarting, {} waiting, {} done, {} failed",
        s.phase.as_str(),
        s.revision,
        s.restarting,
        s.outdated,
        s.done,
        s.failed
    );
    if s.manual > 0 {
        line.push_str(&format!(", {} pod(s) to recreate by hand", s.manual));
    }
    for (n, what) in [
        (s.updating, "updating in place"),
        (s.updated_in_place, "updated in place"),
        (
            s.not_in_place,
            "not in place (strategy InPlace restarts nothing)",
        ),
    ] {
        if n > 0 {
            line.push_str(&format!(", {n} {what}"));
        }
    }
    if let Some(by) = &s.halted_by {
        line.push_str(&format!("; halted by {by}"));
    }
    if let (Some(canary), Some(stable)) = (&s.canary_revision, &s.stable) {
        line.push_str(&format!(
            "; canary gets template {canary}, every other pod {}",
            stable.template_hash
        ));
    }
    let rolled = p.status.as_ref().and_then(|st| {
        st.conditions
            .iter()
            .find(|c| c.type_ == condition::ROLLED_OUT)
    });
    if let Some(c) = rolled {
        line.push_str(&format!(
            "\n  RolledOut={} {}: {}",
            c.status, c.reason, c.message
        ));
    }
    line
}

#[cfg(test)]
mod tests {
    use splice_crds::{InjectionPolicySpec, InjectionPolicyStatus, Rollout, RolloutStatus};

    use super::*;

    fn policy(rollout: Option<RolloutStatus>) -> InjectionPolicy {
        let mut p = InjectionPolicy::new(
            "mesh",
            InjectionPolicySpec {
                rollout: Some(Rollout::default()),
                ..Default::default()
            },
        );
        p.status = Some(InjectionPolicyStatus {
            rollout,
            template_hash: Some("h2".into()),
            ..Default::default()
        });
        p
    }

    #[test]
    fn status_names_the_phase_revision_and_counts() {
        let p = policy(Some(RolloutStatus {
            revision: "h2".into(),
            phase: RolloutPhase::Rolling,
            outdated: 4,
            restarting: 2,
            done: 3,
            manual: 1,
            ..Default::default()
        }));
        assert_eq!(
            describe(&p),
            "mesh: Rolling revision h2: 2 restarting, 4 waiting, 3 done, 0 failed, 1 pod(s) to recreate by hand"
        );
        assert!(!finished(&p));
    }

    #[test]
    fn a_halted_rollout_names_what_halted_it_and_ends_a_watch() {
        let p = policy(Some(RolloutStatus {
            revision: "h2".into(),
            phase: RolloutPhase::Halted,
            failed: 1,
            halted_by: Some("Deployment/a/w".into()),
            ..Default::default()
        }));
        assert!(describe(&p).ends_with("; halted by Deployment/a/w"));
        assert!(finished(&p));
    }

    #[test]
    fn a_watch_goes_on_while_a_resume_is_pending() {
        let mut p = policy(Some(RolloutStatus {
            revision: "h2".into(),
            phase: RolloutPhase::Halted,
            halted_by: Some("Deployment/a/w".into()),
            halted_at: Some("2026-01-01T00:00:00Z".into()),
            ..Default::default()
        }));
        p.metadata.annotations = Some(
            [(
                ROLLOUT_RESUME_ANNOTATION.to_owned(),
                "h2@2026-01-01T00:01:00Z".to_owned(),
            )]
            .into(),
        );
        assert!(!finished(&p), "resumed after the halt");
        let mut requested = policy(Some(RolloutStatus {
            revision: "h2".into(),
            phase: RolloutPhase::Halted,
            halted_by: Some(HALT_REQUESTED.into()),
            ..Default::default()
        }));
        assert!(!finished(&requested), "the halt annotation is gone");
        requested.metadata.annotations =
            Some([(ROLLOUT_HALT_ANNOTATION.to_owned(), "t".to_owned())].into());
        assert!(finished(&requested));
    }

    #[test]
    fn resume_names_the_revision_in_force_not_a_stale_report() {
        let p = policy(Some(RolloutStatus {
            revision: "h1".into(),
            ..Default::default()
        }));
        assert_eq!(revision(&p).as_deref(), Some("h2"));
        let mut p = policy(Some(RolloutStatus {
            revision: "h1".into(),
            ..Default::default()
        }));
        if let Some(s) = p.status.as_mut() {
            s.template_hash = None;
        }
        assert_eq!(revision(&p).as_deref(), Some("h1"));
    }

    #[test]
    fn status_adds_the_in_place_counts_when_there_are_any() {
        let p = policy(Some(RolloutStatus {
            revision: "h2".into(),
            phase: RolloutPhase::Rolling,
            updating: 2,
            updated_in_place: 5,
            not_in_place: 1,
            ..Default::default()
        }));
        assert!(
            describe(&p).ends_with(
                ", 2 updating in place, 5 updated in place, 1 not in place (strategy InPlace \
                 restarts nothing)"
            ),
            "{}",
            describe(&p)
        );
        let quiet = policy(Some(RolloutStatus::default()));
        assert!(!describe(&quiet).contains("in place"));
    }

    /// A pod in `shop` whose record names `mesh` at `hash` and whose marker names `marked`.
    fn pod(name: &str, hash: &str, marked: Option<(&str, &str)>) -> Pod {
        let mut annotations = BTreeMap::from([(
            STATUS_ANNOTATION.to_owned(),
            json!({"mesh": {"hash": hash}, "logs": {"hash": "l1"}}).to_string(),
        )]);
        if let Some((policy, revision)) = marked {
            annotations.insert(
                splice_crds::IN_PLACE_ANNOTATION.to_owned(),
                json!({policy: {"revision": revision, "at": "2026-01-01T00:00:00Z", "uid": "u",
                    "generation": 1, "changed": {"proxy": {"image": "proxy:1", "sidecar": true}}}})
                .to_string(),
            );
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "annotations": annotations},
        }))
        .unwrap()
    }

    #[test]
    fn undo_is_refused_unless_the_rollout_is_halted_saying_why() {
        let rolling = policy(Some(RolloutStatus {
            revision: "h2".into(),
            phase: RolloutPhase::Rolling,
            ..Default::default()
        }));
        let e = halted_stage(&rolling).unwrap_err();
        assert!(e.contains("is Rolling, not Halted"), "{e}");
        assert!(e.contains("the leader would update the pods again"), "{e}");
        assert!(halted_stage(&policy(None)).is_err());
        let halted = policy(Some(RolloutStatus {
            revision: "h2".into(),
            phase: RolloutPhase::Halted,
            ..Default::default()
        }));
        assert_eq!(halted_stage(&halted).as_deref(), Ok("h2"));
    }

    #[test]
    fn undo_takes_only_the_pods_the_halted_revision_updated_in_place_for_the_policy() {
        assert!(undoes(&pod("a", "h2", Some(("mesh", "h2"))), "mesh", "h2"));
        assert!(
            !undoes(&pod("b", "h1", Some(("mesh", "h1"))), "mesh", "h2"),
            "an earlier stage's update is not this stage's"
        );
        assert!(!undoes(&pod("c", "h2", Some(("logs", "h2"))), "mesh", "h2"));
        assert!(!undoes(&pod("d", "h2", None), "mesh", "h2"));
    }

    #[test]
    fn undo_counts_the_pods_put_back_names_ten_then_says_how_many_more_and_names_failures() {
        let undone = Undone {
            put_back: (1..=12).map(|i| format!("shop/web-{i}")).collect(),
            skipped: vec!["shop/gone".into()],
            failed: vec![("shop/web-13".into(), "patching it: forbidden".into())],
        };
        let text = undone.message("mesh", "h2");
        assert_eq!(
            text,
            "policy mesh: put 12 pod(s) back in place to the images before revision h2: \
             shop/web-1, shop/web-2, shop/web-3, shop/web-4, shop/web-5, shop/web-6, shop/web-7, \
             shop/web-8, shop/web-9, shop/web-10 and 2 more\n  \
             skipped 1 pod(s), gone or changed since: shop/gone\n  \
             could not put back shop/web-13: patching it: forbidden"
        );
        assert!(
            Undone::default()
                .message("mesh", "h2")
                .contains("nothing to undo")
        );
    }

    #[test]
    fn a_pod_is_outdated_when_its_record_names_the_policy_with_another_revision() {
        assert!(outdated_for(&pod("a", "h1", None), "mesh", "h2"));
        assert!(!outdated_for(&pod("a", "h2", None), "mesh", "h2"));
        assert!(
            !outdated_for(&pod("a", "h1", None), "other", "h2"),
            "no record of the policy"
        );
    }

    #[test]
    fn status_lists_each_outdated_pods_path_and_each_in_place_proof_aligned() {
        use splice_engine::change::{ImageChange, Path, Place, Restart};
        let image = Path::Images(vec![ImageChange {
            container: "proxy".into(),
            place: Place::Sidecar,
            from: "proxy:1".into(),
            to: "proxy:2".into(),
        }]);
        let env = Path::Restart(Restart::Field("spec.containers[app].env[0].value".into()));
        let text = render_pods(
            &[
                ("shop/web-1".into(), image.to_string()),
                ("shop/web-22".into(), env.to_string()),
            ],
            &[(
                "shop/api-1".into(),
                Proof::Waiting("container proxy does not run the new image yet".into()),
            )],
        );
        assert_eq!(
            text,
            "  outdated pods (2), by path:\n\
             \x20   shop/web-1   in place: image of proxy proxy:1 -> proxy:2\n\
             \x20   shop/web-22  restart: spec.containers[app].env[0].value changes, which a \
             running pod cannot\n\
             \x20 updated in place (1):\n\
             \x20   shop/api-1   waiting: container proxy does not run the new image yet\n"
        );
        assert_eq!(render_pods(&[], &[]), "");
    }

    #[test]
    fn a_policy_without_rollout_says_so() {
        let mut p = policy(None);
        p.spec.rollout = None;
        assert!(describe(&p).contains("no spec.rollout"));
        assert!(finished(&p));
    }
}
