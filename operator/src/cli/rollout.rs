//! `splice rollout status|halt|resume|promote POLICY`: shows and steers a policy's rollout
//! (`spec.rollout`). `halt`, `resume` and `promote` only annotate the policy; the leader reads the
//! annotations at its next pass, so a request made while no replica leads is kept until one does.

use std::process::ExitCode;

use anyhow::{Context as _, bail};
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use splice_controller::rollout::plan::HALT_REQUESTED;
use splice_crds::{
    InjectionPolicy, ROLLOUT_HALT_ANNOTATION, ROLLOUT_PROMOTE_ANNOTATION,
    ROLLOUT_RESUME_ANNOTATION, RolloutPhase, condition,
};

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
}

pub fn main(args: Args, cluster: &super::ClusterArgs) -> ExitCode {
    let mut halted = false;
    let code = super::run_to_exit(async {
        let client = cluster.client().await?;
        let api: Api<InjectionPolicy> = Api::all(client);
        match args.action {
            Action::Status { policy, watch } => {
                let p = api
                    .get(&policy)
                    .await
                    .with_context(|| format!("reading policy {policy}"))?;
                let line = describe(&p);
                println!("{line}");
                if watch && !finished(&p) {
                    // Follows until complete, or halted with no resume pending.
                    halted = follow(&api, &policy, line).await?;
                } else {
                    halted = phase(&p) == Some(RolloutPhase::Halted);
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
        }
        Ok(())
    });
    if code == ExitCode::SUCCESS && halted {
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
    fn a_policy_without_rollout_says_so() {
        let mut p = policy(None);
        p.spec.rollout = None;
        assert!(describe(&p).contains("no spec.rollout"));
        assert!(finished(&p));
    }
}
