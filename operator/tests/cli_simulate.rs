//! `splice simulate`, run as a user would.

mod cli_support;

use cli_support::{Workspace, env_policy, pod, sidecar_policy};

fn simulate(ws: &Workspace, policies: &[&str], pod_yaml: &str, extra: &[&str]) -> cli_support::Run {
    cli_support::run_with_policies(ws, "simulate", policies, "pod.yaml", pod_yaml, extra)
}

/// A webhook policy that adds a label to the pod; `reinvocation` is `IfNeeded` or `Never`.
/// Policies of different timeouts never share a webhook entry, so each is a webhook of its own.
fn timed_label_policy(name: &str, reinvocation: &str, timeout: u32) -> String {
    mode_label_policy(name, reinvocation, timeout, "Webhook")
}

/// A policy that adds a label to the pod, in `mode` (a static label can run in-tree).
fn mode_label_policy(name: &str, reinvocation: &str, timeout: u32, mode: &str) -> String {
    format!(
        "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {{name: {name}}}\n\
         spec:\n  mode: {mode}\n  reinvocationPolicy: {reinvocation}\n  timeoutSeconds: {timeout}\n  template:\n    labels: {{{name}: \"yes\"}}\n"
    )
}

/// `env_policy` with a timeout of its own (a webhook entry of its own).
fn timed_env_policy(name: &str, var: &str, value: &str, timeout: u32) -> String {
    env_policy(name, var, value)
        .replace("spec:\n", &format!("spec:\n  timeoutSeconds: {timeout}\n"))
}

#[test]
fn each_webhook_call_and_its_patch_are_shown_in_name_order() {
    let ws = Workspace::new();
    let run = simulate(
        &ws,
        &[&sidecar_policy("zeta", ""), &sidecar_policy("alpha", "")],
        &pod("web", "shop", "{app: web}"),
        &[],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let alpha = run.stdout.find("step 1: alpha").expect("alpha first");
    let zeta = run.stdout.find("step 2: zeta").expect("zeta second");
    assert!(alpha < zeta, "{run:?}");
    assert!(
        run.stdout.contains(r#""op":"add""#),
        "patches shown: {run:?}"
    );
    assert!(run.stdout.contains("alpha-proxy"), "{run:?}");
    assert!(
        run.stdout.contains("result: changed by alpha, zeta"),
        "{run:?}"
    );
}

#[test]
fn an_if_needed_webhook_is_called_again_after_a_later_change_and_a_never_one_is_not() {
    let ws = Workspace::new();
    let run = simulate(
        &ws,
        &[
            &timed_label_policy("a-first", "IfNeeded", 1),
            &timed_label_policy("b-never", "Never", 2),
            &timed_label_policy("c-last", "IfNeeded", 3),
        ],
        &pod("web", "shop", "{app: web}"),
        &[],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("reinvocation pass"), "{run:?}");
    // a-first ran before later changes: called again. b-never: never. c-last: nothing changed
    // after it, so the API server does not call it again.
    assert!(
        run.stdout
            .contains("step 4: a-first (reinvoked): no change"),
        "{run:?}"
    );
    assert!(!run.stdout.contains("b-never (reinvoked)"), "{run:?}");
    assert!(!run.stdout.contains("c-last (reinvoked)"), "{run:?}");
    assert!(!run.stdout.contains("step 5"), "{run:?}");
}

#[test]
fn an_in_tree_policy_is_not_called_again_even_when_it_asks_if_needed() {
    let ws = Workspace::new();
    let run = simulate(
        &ws,
        &[
            &mode_label_policy("a-in-tree", "IfNeeded", 1, "InTree"),
            &timed_label_policy("b-webhook", "IfNeeded", 2),
        ],
        &pod("web", "shop", "{app: web}"),
        &[],
    );
    assert_eq!(run.code, 0, "{run:?}");
    // The derived MutatingAdmissionPolicy runs under `Never`: its second run would be empty.
    assert!(run.stdout.contains("a-in-tree"), "{run:?}");
    assert!(!run.stdout.contains("a-in-tree (reinvoked)"), "{run:?}");
    assert!(
        run.stdout
            .contains("result: changed by a-in-tree, b-webhook"),
        "{run:?}"
    );
}

#[test]
fn skipped_webhooks_say_why() {
    let ws = Workspace::new();
    let policy = sidecar_policy(
        "mesh",
        "  namespaceSelector: {matchLabels: {mesh: enabled}}",
    );
    let run = simulate(&ws, &[&policy], &pod("web", "shop", "{}"), &[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("step 1: mesh: not called"), "{run:?}");
    assert!(run.stdout.contains("namespaceSelector"), "{run:?}");
    assert!(run.stdout.contains("result: unchanged"), "{run:?}");
}

#[test]
fn all_orders_reports_two_policies_setting_the_same_env_var_differently() {
    let ws = Workspace::new();
    let run = simulate(
        &ws,
        &[
            &timed_env_policy("debug-logs", "LOG_LEVEL", "debug", 1),
            &timed_env_policy("quiet-logs", "LOG_LEVEL", "warn", 2),
        ],
        &pod("web", "shop", "{app: web}"),
        &["--all-orders"],
    );
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stdout.contains("order-dependent"), "{run:?}");
    assert!(
        run.stdout.contains("spec.containers[app].env[LOG_LEVEL]"),
        "the logical path is named: {run:?}"
    );
    assert!(
        run.stdout.contains("debug-logs, quiet-logs"),
        "both policies named: {run:?}"
    );
    assert!(run.stdout.contains(r#""debug""#), "{run:?}");
    assert!(run.stdout.contains(r#""warn""#), "{run:?}");
}

#[test]
fn all_orders_reports_nothing_for_independent_policies() {
    let ws = Workspace::new();
    let run = simulate(
        &ws,
        &[
            &sidecar_policy("mesh", "  timeoutSeconds: 1"),
            &timed_env_policy("logging", "LOG_FORMAT", "json", 2),
            &timed_label_policy("team", "IfNeeded", 3),
        ],
        &pod("web", "shop", "{app: web}"),
        &["--all-orders"],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(!run.stdout.contains("order-dependent"), "{run:?}");
    assert!(
        run.stdout.contains("order-independent: all 6 orders"),
        "{run:?}"
    );
}

#[test]
fn all_orders_refuses_more_policies_than_it_can_replay() {
    let ws = Workspace::new();
    let many: Vec<String> = (0..9)
        .map(|i| timed_env_policy(&format!("p{i}"), &format!("V{i}"), "1", i + 1))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let run = simulate(&ws, &many, &pod("web", "shop", "{}"), &["--all-orders"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    assert!(run.stderr.contains("at most 8 webhook entries"), "{run:?}");
}

#[test]
fn a_workload_is_simulated_through_its_pod_template() {
    let ws = Workspace::new();
    let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: shop}\n\
        spec:\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers: [{name: app, image: x}]\n";
    let run = simulate(&ws, &[&sidecar_policy("mesh", "")], deployment, &[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.contains("Deployment shop/web (pod template)"),
        "{run:?}"
    );
    assert!(run.stdout.contains("mesh-proxy"), "{run:?}");
}

#[test]
fn more_than_one_document_is_refused() {
    let ws = Workspace::new();
    let two = format!("{}---\n{}", pod("a", "shop", "{}"), pod("b", "shop", "{}"));
    let run = simulate(&ws, &[&sidecar_policy("mesh", "")], &two, &[]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    assert!(
        run.stderr.contains("pod.yaml") && run.stderr.contains("exactly one"),
        "{run:?}"
    );
}

#[test]
fn a_bad_policy_is_refused_with_nothing_on_stdout() {
    let ws = Workspace::new();
    let run = simulate(
        &ws,
        &[&sidecar_policy("mesh", "  timeoutSeconds: \"x\"")],
        &pod("web", "shop", "{}"),
        &["--all-orders"],
    );
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    assert!(run.stderr.contains("policy-0.yaml: document 1"), "{run:?}");
    assert!(run.stderr.contains("spec.timeoutSeconds"), "{run:?}");
}

#[test]
fn policies_sharing_a_webhook_entry_apply_in_name_order_in_one_call_and_their_conflict_is_settled()
{
    let ws = Workspace::new();
    // Webhook mode: in-tree policies are mutating admission policies, never a shared entry.
    let webhook = |p: String| p.replace("spec:\n", "spec:\n  mode: Webhook\n");
    let (quiet, debug) = (
        webhook(env_policy("quiet-logs", "LOG_LEVEL", "warn")),
        webhook(env_policy("debug-logs", "LOG_LEVEL", "debug")),
    );
    let run = simulate(
        &ws,
        &[&quiet, &debug],
        &pod("web", "shop", "{app: web}"),
        &["--all-orders"],
    );
    // Same terms: one entry, so one order; the first in name order sets the variable and the
    // second keeps it, saying so.
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .contains("one call, applying debug-logs → quiet-logs in that order"),
        "{run:?}"
    );
    assert!(
        run.stdout.contains("order-independent: all 1 orders"),
        "{run:?}"
    );
    let run = simulate(
        &ws,
        &[&quiet, &debug],
        &pod("web", "shop", "{app: web}"),
        &[],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains(r#""value":"debug""#), "{run:?}");
    assert!(!run.stdout.contains(r#""value":"warn""#), "{run:?}");
    assert!(
        run.stdout.contains("kept"),
        "the skipped item is named: {run:?}"
    );
}

#[test]
fn a_policy_failing_in_a_shared_entry_is_left_out_under_ignore_and_fails_the_call_under_fail() {
    let ws = Workspace::new();
    let webhook = |p: String| p.replace("spec:\n", "spec:\n  mode: Webhook\n");
    let team = webhook(env_policy(
        "b-team",
        "TEAM",
        "{{ pod.metadata.labels.team }}",
    ));
    let level = webhook(env_policy("a-level", "LOG_LEVEL", "warn"));
    let unlabelled = pod("web", "shop", "{app: web}");

    // As the webhook answers: the others still inject, and a warning names the one left out.
    let run = simulate(&ws, &[&team, &level], &unlabelled, &[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .contains("one call, applying a-level → b-team in that order"),
        "{run:?}"
    );
    assert!(
        run.stdout
            .contains("step 2: b-team: failed, left out of its entry's call"),
        "{run:?}"
    );
    assert!(
        run.stdout
            .contains("warning: splice policy b-team did not inject (failurePolicy Ignore)"),
        "{run:?}"
    );
    assert!(run.stdout.contains("result: changed by a-level"), "{run:?}");

    let fail = |p: &str| p.replace("spec:\n", "spec:\n  failurePolicy: Fail\n");
    let run = simulate(&ws, &[&fail(&team), &fail(&level)], &unlabelled, &[]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("b-team"), "{run:?}");
}

/// A policy that stays on the webhook (a filter), named to sort first.
fn filter_policy(name: &str) -> String {
    format!(
        "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {{name: {name}}}\n\
         spec:\n  template:\n    annotations: {{{name}: \"{{{{ namespace.name | upper }}}}\"}}\n"
    )
}

#[test]
fn in_tree_policies_run_before_every_webhook_and_each_policy_says_its_mode() {
    let ws = Workspace::new();
    let run = simulate(
        &ws,
        &[&filter_policy("a-webhook"), &sidecar_policy("z-tree", "")],
        &pod("web", "shop", "{app: web}"),
        &[],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let tree = run
        .stdout
        .find("step 1: z-tree")
        .expect("the in-tree policy first");
    let hook = run
        .stdout
        .find("step 2: a-webhook")
        .expect("the webhook second");
    assert!(tree < hook, "{run:?}");
    assert!(
        run.stdout
            .contains("MutatingAdmissionPolicy splice-z-tree (in-tree): z-tree"),
        "{run:?}"
    );
    assert!(run.stdout.contains("policy z-tree: mode InTree"), "{run:?}");
    assert!(
        run.stdout
            .contains("policy a-webhook: mode Webhook, because")
            && run.stdout.contains("namespace.name | upper"),
        "{run:?}"
    );
}

#[test]
fn mode_in_tree_is_refused_offline_for_a_policy_that_needs_the_webhook_naming_the_expression() {
    let ws = Workspace::new();
    let policy = filter_policy("a-webhook").replace("spec:\n", "spec:\n  mode: InTree\n");
    let run = simulate(&ws, &[&policy], &pod("web", "shop", "{app: web}"), &[]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("spec.mode is InTree")
            && run.stderr.contains("namespace.name | upper")
            && run.stderr.contains("spec.template.annotations"),
        "{run:?}"
    );
}
