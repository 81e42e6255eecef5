//! `splice explain -f POD -p POLICY`, run as a user would.

mod cli_support;

use cli_support::{Workspace, pod, run_with_policies, sidecar_policy};

/// An `Auto` policy that could run in-tree, with a pinned canary.
fn canary_policy() -> String {
    sidecar_policy(
        "mesh",
        "  rollout:\n    canary:\n      objectSelector: {matchLabels: {track: canary}}",
    )
}

/// The status the cluster gives a policy whose template changed since `promoted` was promoted,
/// as `kubectl get injectionpolicy mesh -o yaml` prints it.
fn promoted_status(promoted: &str) -> String {
    format!(
        "status:
  rollout:
    revision: current
    phase: Canary
    outdated: 0
    restarting: 0
    done: 0
    failed: 0
    manual: 0
    canaryRevision: current
    stable:
      templateHash: {promoted}
      generation: 1
      spec: {{template: {{labels: {{v: '1'}}}}}}
"
    )
}

fn explain(ws: &Workspace, policy: &str, extra: &[&str]) -> cli_support::Run {
    let pod = pod("web", "shop", "{app: web}");
    let run = run_with_policies(ws, "explain", &[policy], "pod.yaml", &pod, extra);
    assert_eq!(run.code, 0, "{run:?}");
    run
}

#[test]
fn with_an_open_canary_explain_reports_mode_webhook_and_gives_the_canary_as_the_reason() {
    let ws = Workspace::new();
    let open = format!("{}{}", canary_policy(), promoted_status("earlier"));

    let report = explain(&ws, &open, &["-o", "json"]).json();
    let mesh = &report["policies"][0];
    assert_eq!(mesh["mode"], "Webhook", "{report:#}");
    let reason = mesh["modeReason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("spec.rollout.canary: "), "{reason}");
    assert!(
        reason.contains("in-tree again once it is promoted"),
        "{reason}"
    );
    let table = explain(&ws, &open, &[]).stdout;
    assert!(
        table.contains("mesh: mode Webhook, because spec.rollout.canary: "),
        "{table}"
    );

    // The same policy before any promotion, and once the template in force is the promoted one:
    // no canary is open, so it runs in-tree, as the cluster serves it.
    let hash = mesh["templateHash"].as_str().unwrap_or_default().to_owned();
    for closed in [
        canary_policy(),
        format!("{}{}", canary_policy(), promoted_status(&hash)),
    ] {
        let report = explain(&ws, &closed, &["-o", "json"]).json();
        assert_eq!(report["policies"][0]["mode"], "InTree", "{report:#}");
        assert!(
            report["policies"][0].get("modeReason").is_none(),
            "{report:#}"
        );
    }
}
