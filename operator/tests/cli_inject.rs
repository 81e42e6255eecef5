//! `splice inject`, run as a user would.

mod cli_support;

use cli_support::{Workspace, env_policy, names, pod, sidecar_policy, splice, splice_with_stdin};
use serde_json::Value;

fn inject(ws: &Workspace, policies: &[&str], manifests: &str, extra: &[&str]) -> cli_support::Run {
    cli_support::run_with_policies(ws, "inject", policies, "manifests.yaml", manifests, extra)
}

const CONFIG_MAP: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: shop
data:
  port: "8080"
  enabled: "true"
  text: |
    line one
    line two
"#;

const SERVICE: &str = r#"apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
"#;

fn workload(api_version: &str, kind: &str) -> String {
    let pod_template = r#"
      metadata:
        labels: {app: web}
      spec:
        containers:
          - name: app
            image: registry.example/app:1.0"#;
    match kind {
        "CronJob" => format!(
            "apiVersion: {api_version}\nkind: {kind}\nmetadata: {{name: web, namespace: shop}}\n\
             spec:\n  schedule: \"*/5 * * * *\"\n  jobTemplate:\n    spec:\n      template:{}\n",
            pod_template.replace("\n      ", "\n          ")
        ),
        _ => format!(
            "apiVersion: {api_version}\nkind: {kind}\nmetadata: {{name: web, namespace: shop}}\n\
             spec:\n  selector: {{matchLabels: {{app: web}}}}\n  template:{}\n",
            pod_template.replace("\n      ", "\n    ")
        ),
    }
}

fn pod_spec_of(doc: &Value) -> &Value {
    match doc["kind"].as_str() {
        Some("Pod") => &doc["spec"],
        Some("CronJob") => &doc["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => &doc["spec"]["template"]["spec"],
    }
}

fn assert_injected(doc: &Value, policy: &str) {
    let spec = pod_spec_of(doc);
    assert!(
        names(spec, "initContainers").contains(&format!("{policy}-proxy")),
        "{policy}-proxy not injected into {}: {doc:#}",
        doc["kind"]
    );
    assert!(
        names(spec, "volumes").contains(&format!("{policy}-data")),
        "{doc:#}"
    );
    assert_eq!(names(spec, "containers"), vec!["app"], "{doc:#}");
    let env = spec["containers"][0]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        env.iter().any(|e| e["name"].as_str()
            == Some(&format!(
                "INJECTED_BY_{}",
                policy.to_uppercase().replace('-', "_")
            ))),
        "{doc:#}"
    );
}

fn assert_not_injected(doc: &Value) {
    let spec = pod_spec_of(doc);
    assert!(names(spec, "initContainers").is_empty(), "{doc:#}");
    assert!(spec.get("volumes").is_none(), "{doc:#}");
}

#[test]
fn a_pod_gets_the_sidecar_the_volume_and_the_env_var() {
    let ws = Workspace::new();
    let run = inject(
        &ws,
        &[&sidecar_policy("mesh", "")],
        &pod("web", "shop", "{app: web}"),
        &[],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let docs = run.documents();
    assert_eq!(docs.len(), 1);
    assert_injected(&docs[0], "mesh");
    let env = &docs[0]["spec"]["containers"][0]["env"][0];
    assert_eq!(
        env["value"], "mesh in shop",
        "templates see the policy and the namespace"
    );
    assert!(
        docs[0]["metadata"]["annotations"]["splice.dev/status"].is_string(),
        "provenance recorded: {:#}",
        docs[0]
    );
}

#[test]
fn every_workload_kind_gets_its_pod_template_injected() {
    let kinds = [
        ("apps/v1", "Deployment"),
        ("apps/v1", "StatefulSet"),
        ("apps/v1", "DaemonSet"),
        ("apps/v1", "ReplicaSet"),
        ("batch/v1", "Job"),
        ("batch/v1", "CronJob"),
    ];
    let manifests: Vec<String> = kinds.iter().map(|(a, k)| workload(a, k)).collect();
    let ws = Workspace::new();
    let run = inject(
        &ws,
        &[&sidecar_policy("mesh", "")],
        &manifests.join("---\n"),
        &[],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let docs = run.documents();
    assert_eq!(docs.len(), kinds.len());
    for (doc, (_, kind)) in docs.iter().zip(kinds) {
        assert_eq!(doc["kind"], kind);
        assert_injected(doc, "mesh");
        // The workload itself is left alone: only its pod template changes.
        assert!(doc["metadata"].get("annotations").is_none(), "{doc:#}");
    }
}

#[test]
fn other_documents_pass_through_unchanged_and_in_order() {
    let ws = Workspace::new();
    let input = [
        CONFIG_MAP,
        &pod("web", "shop", "{app: web}"),
        SERVICE,
        "apiVersion: example.com/v1\nkind: Deployment\nmetadata: {name: not-apps}\nspec: {template: {spec: {containers: [{name: x}]}}}\n",
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\nspec: {size: 3, ratio: 1.5, tags: [a, b]}\n",
    ]
    .join("---\n");
    let run = inject(&ws, &[&sidecar_policy("mesh", "")], &input, &[]);
    assert_eq!(run.code, 0, "{run:?}");
    let docs = run.documents();
    let kinds: Vec<&str> = docs
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        kinds,
        ["ConfigMap", "Pod", "Service", "Deployment", "Widget"]
    );

    let original = cli_support::documents(&input);
    for i in [0, 2, 3, 4] {
        assert_eq!(docs[i], original[i], "document {} changed", i + 1);
    }
    assert_injected(&docs[1], "mesh");
    // Strings that look like numbers or booleans stay strings.
    assert_eq!(docs[0]["data"]["port"], "8080");
    assert_eq!(docs[0]["data"]["enabled"], "true");
}

#[test]
fn manifests_can_come_from_stdin() {
    let ws = Workspace::new();
    let policy = ws.file("p.yaml", &sidecar_policy("mesh", ""));
    let run = splice_with_stdin(
        ["inject", "-p", policy.to_str().expect("utf-8"), "-f", "-"],
        &pod("web", "shop", "{app: web}"),
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_injected(&run.documents()[0], "mesh");
}

#[test]
fn check_exits_1_naming_what_would_change_and_0_when_nothing_would() {
    let ws = Workspace::new();
    let input = [CONFIG_MAP, &workload("apps/v1", "Deployment")].join("---\n");
    let run = inject(&ws, &[&sidecar_policy("mesh", "")], &input, &["--check"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    assert!(run.stderr.contains("document 2"), "{run:?}");
    assert!(run.stderr.contains("Deployment shop/web"), "{run:?}");
    assert!(run.stderr.contains("mesh"), "{run:?}");
    assert!(
        !run.stderr.contains("document 1"),
        "the ConfigMap does not change: {run:?}"
    );

    let nothing_to_do = inject(
        &ws,
        &[&sidecar_policy("mesh", "")],
        CONFIG_MAP,
        &["--check"],
    );
    assert_eq!(nothing_to_do.code, 0, "{nothing_to_do:?}");
}

#[test]
fn injecting_its_own_output_changes_nothing() {
    let ws = Workspace::new();
    let policies = [
        sidecar_policy("mesh", ""),
        env_policy("logging", "LOG_FORMAT", "json"),
    ];
    let policies: Vec<&str> = policies.iter().map(String::as_str).collect();
    let input = [
        pod("web", "shop", "{app: web}"),
        workload("apps/v1", "Deployment"),
        workload("batch/v1", "CronJob"),
        CONFIG_MAP.to_owned(),
    ]
    .join("---\n");
    let first = inject(&ws, &policies, &input, &[]);
    assert_eq!(first.code, 0, "{first:?}");

    let again = inject(&ws, &policies, &first.stdout, &["--check"]);
    assert_eq!(
        again.code, 0,
        "a second pass would change something: {again:?}"
    );
    let second = inject(&ws, &policies, &first.stdout, &[]);
    assert_eq!(second.stdout, first.stdout);
}

#[test]
fn json_output_is_an_object_for_one_document_and_a_list_for_several() {
    let ws = Workspace::new();
    let policy = sidecar_policy("mesh", "");
    let one = inject(&ws, &[&policy], &pod("web", "shop", "{}"), &["-o", "json"]);
    assert_eq!(one.code, 0, "{one:?}");
    let v = one.json();
    assert_eq!(v["kind"], "Pod");
    assert_injected(&v, "mesh");

    let input = [CONFIG_MAP, &pod("web", "shop", "{}")].join("---\n");
    let several = inject(&ws, &[&policy], &input, &["-o", "json"]);
    assert_eq!(several.code, 0, "{several:?}");
    let v = several.json();
    assert_eq!(v["apiVersion"], "v1");
    assert_eq!(v["kind"], "List");
    assert_eq!(v["items"][0]["kind"], "ConfigMap");
    assert_eq!(v["items"][0]["data"]["port"], "8080");
    assert_injected(&v["items"][1], "mesh");
}

#[test]
fn the_namespace_selector_sees_the_namespace_labels_given_on_the_command_line() {
    let ws = Workspace::new();
    let policy = sidecar_policy(
        "mesh",
        "  namespaceSelector: {matchLabels: {mesh: enabled}}",
    );
    let input = pod("web", "shop", "{app: web}");

    let unlabelled = inject(&ws, &[&policy], &input, &[]);
    assert_eq!(unlabelled.code, 0, "{unlabelled:?}");
    assert_not_injected(&unlabelled.documents()[0]);

    let labelled = inject(
        &ws,
        &[&policy],
        &input,
        &["--namespace-label", "mesh=enabled"],
    );
    assert_eq!(labelled.code, 0, "{labelled:?}");
    assert_injected(&labelled.documents()[0], "mesh");
}

#[test]
fn the_namespace_name_label_is_set_like_the_api_server_does() {
    let ws = Workspace::new();
    let policy = sidecar_policy(
        "mesh",
        "  namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: payments}}",
    );
    let input = pod("web", "shop", "{app: web}");
    let in_shop = inject(&ws, &[&policy], &input, &[]);
    assert_not_injected(&in_shop.documents()[0]);
    let in_payments = inject(&ws, &[&policy], &input, &["--namespace", "payments"]);
    assert_eq!(in_payments.code, 0, "{in_payments:?}");
    let doc = &in_payments.documents()[0];
    assert_injected(doc, "mesh");
    assert_eq!(
        doc["spec"]["containers"][0]["env"][0]["value"],
        "mesh in payments"
    );
}

#[test]
fn a_pod_in_kube_system_is_never_injected() {
    let ws = Workspace::new();
    let run = inject(
        &ws,
        &[&sidecar_policy("mesh", "")],
        &pod("dns", "kube-system", "{}"),
        &[],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_not_injected(&run.documents()[0]);
    let forced = inject(
        &ws,
        &[&sidecar_policy("mesh", "")],
        &pod("dns", "shop", "{}"),
        &["--namespace", "kube-system", "--check"],
    );
    assert_eq!(forced.code, 0, "{forced:?}");
}

#[test]
fn a_pod_labelled_inject_false_is_never_injected() {
    let ws = Workspace::new();
    let input = pod("web", "shop", r#"{app: web, splice.dev/inject: "false"}"#);
    let run = inject(&ws, &[&sidecar_policy("mesh", "")], &input, &[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_not_injected(&run.documents()[0]);
}

#[test]
fn policies_apply_in_name_order_whatever_the_command_line_order() {
    let ws = Workspace::new();
    let a = sidecar_policy("alpha", "");
    let b = sidecar_policy("beta", "");
    let input = workload("apps/v1", "Deployment");
    let ab = inject(&ws, &[&a, &b], &input, &[]);
    let ba = inject(&ws, &[&b, &a], &input, &[]);
    assert_eq!(ab.code, 0, "{ab:?}");
    assert_eq!(ab.stdout, ba.stdout);
    assert_injected(&ab.documents()[0], "alpha");
    assert_injected(&ab.documents()[0], "beta");
}

#[test]
fn one_policy_file_may_hold_several_policies() {
    let ws = Workspace::new();
    let both = format!(
        "{}---\n{}",
        sidecar_policy("alpha", ""),
        sidecar_policy("beta", "")
    );
    let run = inject(&ws, &[&both], &pod("web", "shop", "{}"), &[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_injected(&run.documents()[0], "alpha");
    assert_injected(&run.documents()[0], "beta");
}

/// Bad input: exit 2, one error line naming the file, the document and the field, no output.
fn assert_refused(run: &cli_support::Run, needles: &[&str]) {
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stdout.is_empty(), "partial output: {run:?}");
    assert!(run.stderr.starts_with("error: "), "{run:?}");
    assert_eq!(run.stderr.trim_end().lines().count(), 1, "{run:?}");
    for needle in needles {
        assert!(run.stderr.contains(needle), "missing {needle:?}: {run:?}");
    }
}

#[test]
fn a_wrongly_typed_policy_field_is_refused_naming_file_document_and_field() {
    let ws = Workspace::new();
    let bad = format!(
        "{}---\n{}",
        sidecar_policy("good", ""),
        sidecar_policy("bad", "  timeoutSeconds: x")
    );
    let run = inject(&ws, &[&bad], &pod("web", "shop", "{}"), &[]);
    assert_refused(
        &run,
        &[
            "policy-0.yaml",
            "document 2",
            "spec.timeoutSeconds",
            "invalid type: string \"x\"",
        ],
    );
}

#[test]
fn policies_the_api_server_would_reject_are_refused() {
    let cases = [
        ("  timeoutSeconds: 45", "spec.timeoutSeconds"),
        ("  timeoutSecond: 5", "spec.timeoutSecond"),
        ("  operations: [DELETE]", "spec.operations[0]"),
        (
            "  namespaceSelector: {matchExpressions: [{key: a, operator: Near}]}",
            "spec.namespaceSelector",
        ),
    ];
    for (extra, field) in cases {
        let ws = Workspace::new();
        let run = inject(
            &ws,
            &[&sidecar_policy("p", extra)],
            &pod("web", "shop", "{}"),
            &[],
        );
        assert_refused(&run, &["policy-0.yaml", "document 1", field]);
    }
}

#[test]
fn privileged_content_without_allow_privileged_is_refused_and_with_it_reports_its_pod_security_level()
 {
    let ws = Workspace::new();
    let policy = r#"apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: net}
spec:
  template:
    initContainers:
      - name: net-init
        image: registry.example/init:1
        securityContext: {capabilities: {add: [NET_ADMIN]}}
"#;
    let run = inject(&ws, &[policy], &pod("web", "shop", "{}"), &[]);
    assert_refused(
        &run,
        &[
            "document 1",
            "spec.template.initContainers[0].securityContext.capabilities.add[0]",
            "allowPrivileged",
        ],
    );
    let allowed = policy.replace("spec:\n", "spec:\n  allowPrivileged: true\n");
    let run = inject(&ws, &[&allowed], &pod("web", "shop", "{}"), &[]);
    assert_eq!(run.code, 0, "{run:?}");
    // Allowed, the level it demands is printed with the first reason.
    assert!(
        run.stderr.contains(
            "policy net: injected content satisfies Pod Security privileged \
             (spec.template.initContainers[0].securityContext.capabilities.add[0] adds the NET_ADMIN capability)"
        ),
        "{run:?}"
    );
}

#[test]
fn duplicate_injected_names_are_refused() {
    let ws = Workspace::new();
    let policy = r#"apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: dup}
spec:
  template:
    initContainers: [{name: proxy, image: a}]
    containers: [{name: proxy, image: b}]
"#;
    let run = inject(&ws, &[policy], &pod("web", "shop", "{}"), &[]);
    assert_refused(
        &run,
        &["document 1", "spec.template.containers[0].name", "proxy"],
    );
}

#[test]
fn a_template_error_names_the_policy_and_the_template_field() {
    let ws = Workspace::new();
    let policy = r#"apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: broken}
spec:
  template:
    containers:
      - name: sidecar
        image: "registry.example/{{ values.missing }}"
"#;
    let run = inject(&ws, &[policy], &pod("web", "shop", "{}"), &[]);
    assert_refused(&run, &["broken", "spec.template.containers[0].image"]);
}

#[test]
fn a_template_that_fails_on_one_pod_names_the_document_and_the_policy() {
    let ws = Workspace::new();
    let policy = r#"apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: team}
spec:
  template:
    env:
      - name: TEAM
        value: "{{ pod.metadata.labels.team }}"
"#;
    let input = [
        pod("ok", "shop", "{team: blue}"),
        pod("unlabelled", "shop", "{}"),
    ]
    .join("---\n");
    let run = inject(&ws, &[policy], &input, &[]);
    assert_refused(
        &run,
        &[
            "manifests.yaml",
            "document 2",
            "Pod shop/unlabelled",
            "team",
        ],
    );
}

#[test]
fn an_unknown_kind_in_a_policy_file_is_refused() {
    let ws = Workspace::new();
    let run = inject(&ws, &[CONFIG_MAP], &pod("web", "shop", "{}"), &[]);
    assert_refused(&run, &["policy-0.yaml", "document 1", "kind", "ConfigMap"]);
}

#[test]
fn two_policies_with_the_same_name_are_refused() {
    let ws = Workspace::new();
    let p = sidecar_policy("mesh", "");
    let run = inject(&ws, &[&p, &p], &pod("web", "shop", "{}"), &[]);
    assert_refused(
        &run,
        &["policy-1.yaml", "document 1", "metadata.name", "mesh"],
    );
}

#[test]
fn malformed_manifests_are_refused_naming_the_document() {
    let ws = Workspace::new();
    let input = format!("{CONFIG_MAP}---\nkind: Pod\nmetadata: {{name: [unclosed\n");
    let run = inject(&ws, &[&sidecar_policy("mesh", "")], &input, &[]);
    assert_refused(&run, &["manifests.yaml", "document 2", "invalid YAML"]);

    let not_an_object = inject(
        &ws,
        &[&sidecar_policy("mesh", "")],
        "- just\n- a list\n",
        &[],
    );
    assert_refused(&not_an_object, &["manifests.yaml", "document 1"]);
}

#[test]
fn malformed_policy_yaml_is_refused_naming_the_document() {
    let ws = Workspace::new();
    let bad = format!("{}---\nspec: {{template: [\n", sidecar_policy("good", ""));
    let run = inject(&ws, &[&bad], &pod("web", "shop", "{}"), &[]);
    assert_refused(&run, &["policy-0.yaml", "document 2", "invalid YAML"]);
}

#[test]
fn a_missing_file_is_refused_by_name() {
    let ws = Workspace::new();
    let policy = ws.file("p.yaml", &sidecar_policy("mesh", ""));
    let missing = ws.path().join("nope.yaml");
    let run = splice([
        "inject",
        "-p",
        policy.to_str().expect("utf-8"),
        "-f",
        missing.to_str().expect("utf-8"),
    ]);
    assert_refused(&run, &["nope.yaml", "cannot read"]);
}

#[test]
fn the_examples_work_as_the_readme_shows() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let arg = |f: &str| examples.join(f).display().to_string();
    let run = splice([
        "inject".to_owned(),
        "-p".into(),
        arg("mesh-proxy.yaml"),
        "-p".into(),
        arg("env-volume.yaml"),
        "-f".into(),
        arg("deployment.yaml"),
        "--namespace-label".into(),
        "mesh=enabled".into(),
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    let docs = run.documents();
    let kinds: Vec<&str> = docs
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds, ["ConfigMap", "Deployment", "Service"]);
    let spec = &docs[1]["spec"]["template"]["spec"];
    assert_eq!(names(spec, "initContainers"), ["mesh-init", "mesh-proxy"]);
    assert_eq!(
        spec["initContainers"][1]["image"],
        "registry.example/proxy:1.4.2"
    );
    assert_eq!(spec["initContainers"][1]["restartPolicy"], "Always");
    let env: Vec<(&str, &str)> = spec["containers"][0]["env"]
        .as_array()
        .expect("env injected")
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    assert!(env.contains(&("APP_NAMESPACE", "shop")), "{env:?}");
    assert!(env.contains(&("APP_NAME", "web")), "{env:?}");
}

#[test]
fn a_paused_policy_is_not_applied_as_its_webhook_is_not_called() {
    let ws = Workspace::new();
    let run = inject(
        &ws,
        &[&sidecar_policy("mesh", "  paused: true")],
        &pod("web", "shop", "{}"),
        &[],
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_not_injected(&run.documents()[0]);
    assert!(run.stderr.contains("mesh is paused"), "{run:?}");
}

#[test]
fn a_list_document_has_its_items_injected() {
    let ws = Workspace::new();
    let list = format!(
        r#"{{"apiVersion": "v1", "kind": "List", "items": [{}, {}]}}"#,
        serde_json::to_string(&cli_support::documents(&pod("web", "shop", "{}"))[0]).expect("json"),
        serde_json::to_string(&cli_support::documents(SERVICE)[0]).expect("json"),
    );
    let run = inject(&ws, &[&sidecar_policy("mesh", "")], &list, &[]);
    assert_eq!(run.code, 0, "{run:?}");
    let doc = &run.documents()[0];
    assert_eq!(doc["kind"], "List");
    assert_injected(&doc["items"][0], "mesh");
    assert_eq!(doc["items"][1], cli_support::documents(SERVICE)[0]);
}

#[test]
fn a_policy_reading_the_pod_name_is_applied_with_the_webhooks_warning_naming_file_and_field() {
    let ws = Workspace::new();
    let policy = r#"apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: named}
spec:
  template:
    env:
      - name: POD
        value: "{{ pod.metadata.name }}"
"#;
    let run = inject(&ws, &[policy], &pod("web", "shop", "{}"), &[]);
    assert_eq!(run.code, 0, "{run:?}");
    let warning = run
        .stderr
        .lines()
        .find(|l| l.starts_with("warning: "))
        .unwrap_or_else(|| panic!("no warning: {run:?}"));
    assert!(warning.contains("policy-0.yaml: document 1"), "{warning}");
    assert!(
        warning.contains("spec.template.env[0].value reads pod.metadata.name"),
        "{warning}"
    );
}

const VALUES_FROM_POLICY: &str = r#"apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata:
  name: mesh
spec:
  values: {proxyImage: from-spec}
  valuesFrom:
    - name: proxyImage
      configMapKeyRef: {name: mesh-config, key: image}
    - name: token
      secretKeyRef: {name: mesh-token, key: token}
  template:
    containers:
      - name: proxy
        image: "{{ values.proxyImage }}"
    annotations:
      mesh.example/token: "{{ values.token | sha256 }}"
"#;

const VALUES_SOURCES: &str = r#"apiVersion: v1
kind: ConfigMap
metadata: {name: mesh-config, namespace: splice-system}
data: {image: registry.example/proxy:2.0}
---
apiVersion: v1
kind: Secret
metadata: {name: mesh-token, namespace: splice-system}
stringData: {token: offline-secret}
"#;

#[test]
fn values_from_files_feed_templates_and_only_a_secrets_fingerprint_reaches_the_pod() {
    let ws = Workspace::new();
    let sources = ws.file("sources.yaml", VALUES_SOURCES);
    let run = inject(
        &ws,
        &[VALUES_FROM_POLICY],
        &pod("web", "shop", "{app: web}"),
        &["--values-from", &sources.display().to_string()],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let doc = &run.documents()[0];
    assert_eq!(
        doc["spec"]["containers"][1]["image"], "registry.example/proxy:2.0",
        "a valuesFrom entry replaces spec.values: {doc:#}"
    );
    assert!(!run.stdout.contains("offline-secret"), "{run:?}");
    let status = doc["metadata"]["annotations"]["splice.dev/status"]
        .as_str()
        .unwrap_or_default();
    assert!(
        status.contains("ConfigMap splice-system/mesh-config"),
        "the data digest is recorded per source: {status}"
    );
}

#[test]
fn a_missing_values_from_source_is_an_error_naming_the_policy_the_entry_and_the_object() {
    let ws = Workspace::new();
    let sources = ws.file(
        "sources.yaml",
        VALUES_SOURCES.split("---").next().unwrap_or_default(),
    );
    let run = inject(
        &ws,
        &[VALUES_FROM_POLICY],
        &pod("web", "shop", "{app: web}"),
        &["--values-from", &sources.display().to_string()],
    );
    assert_eq!(run.code, 2, "{run:?}");
    for part in [
        "policy \"mesh\"",
        "spec.valuesFrom[1]",
        "Secret splice-system/mesh-token key token",
    ] {
        assert!(run.stderr.contains(part), "{part}: {run:?}");
    }
    assert!(run.stdout.is_empty(), "no partial output: {run:?}");
}

const CPU_OVERRIDE_POLICY: &str = include_str!("../../webhook/testdata/policy-overrides.yaml");

fn pod_with_annotation(value: Option<&str>) -> String {
    let annotations = value.map_or(String::new(), |v| {
        format!("\n  annotations: {{mesh.example/proxy-cpu: \"{v}\"}}")
    });
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: shop{annotations}\nspec:\n  containers: [{{name: app, image: web:1}}]\n"
    )
}

fn proxy_cpu(run: &cli_support::Run) -> String {
    let docs = run.documents();
    docs[0]["spec"]["initContainers"][0]["resources"]["requests"]["cpu"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn an_override_reads_the_pod_then_the_namespace_annotation_given_on_the_command_line() {
    let ws = Workspace::new();
    let ns = ["--namespace-annotation", "mesh.example/proxy-cpu=300m"];
    let default = inject(&ws, &[CPU_OVERRIDE_POLICY], &pod_with_annotation(None), &[]);
    assert_eq!(default.code, 0, "{default:?}");
    assert_eq!(proxy_cpu(&default), "100m");
    let from_ns = inject(&ws, &[CPU_OVERRIDE_POLICY], &pod_with_annotation(None), &ns);
    assert_eq!(proxy_cpu(&from_ns), "300m");
    let own = inject(
        &ws,
        &[CPU_OVERRIDE_POLICY],
        &pod_with_annotation(Some("200m")),
        &ns,
    );
    assert_eq!(proxy_cpu(&own), "200m");
}

#[test]
fn a_pod_whose_override_fails_its_rule_is_denied_offline_as_the_webhook_would() {
    let ws = Workspace::new();
    let run = inject(
        &ws,
        &[CPU_OVERRIDE_POLICY],
        &pod_with_annotation(Some("2")),
        &[],
    );
    assert_refused(
        &run,
        &[
            "document 1",
            "denied",
            "mesh.example/proxy-cpu=\"2\"",
            "at most 1 CPU",
        ],
    );
}
