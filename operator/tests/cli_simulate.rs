//! `splice simulate`, run as a user would.

mod cli_support;

use cli_support::{Workspace, env_policy, pod, sidecar_policy};

fn simulate(ws: &Workspace, policies: &[&str], pod_yaml: &str, extra: &[&str]) -> cli_support::Run {
    cli_support::run_with_policies(ws, "simulate", policies, "pod.yaml", pod_yaml, extra)
}

/// A policy that adds a label to the pod; `reinvocation` is `IfNeeded` or `Never`.
fn label_policy(name: &str, reinvocation: &str) -> String {
    format!(
        "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {{name: {name}}}\n\
         spec:\n  reinvocationPolicy: {reinvocation}\n  template:\n    labels: {{{name}: \"yes\"}}\n"
    )
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
            &label_policy("a-first", "IfNeeded"),
            &label_policy("b-never", "Never"),
            &label_policy("c-last", "IfNeeded"),
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
            &env_policy("debug-logs", "LOG_LEVEL", "debug"),
            &env_policy("quiet-logs", "LOG_LEVEL", "warn"),
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
            &sidecar_policy("mesh", ""),
            &env_policy("logging", "LOG_FORMAT", "json"),
            &label_policy("team", "IfNeeded"),
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
        .map(|i| env_policy(&format!("p{i}"), &format!("V{i}"), "1"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let run = simulate(&ws, &many, &pod("web", "shop", "{}"), &["--all-orders"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    assert!(run.stderr.contains("at most 8 policies"), "{run:?}");
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
            .contains("mutating admission policies (in-tree, run first) in name order: z-tree"),
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
