//! The Helm chart in deploy/chart/: with default values it renders the same objects as the
//! kustomize base, passes `helm lint`, and the API server accepts it in a server-side dry run.
//! helm is built from its pinned Go module (e2e/helm/build.sh), kubectl is the control plane's.

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use serde::Deserialize as _;
use serde_json::Value;
use splice_e2e::{controlplane_bin_dir, helm_bin as helm, repo_root, run_tool as run};

fn kubectl() -> Result<std::path::PathBuf> {
    Ok(controlplane_bin_dir()?.join("kubectl"))
}

/// `helm template` of the chart into `namespace` with extra `--set` values.
fn render_chart(namespace: &str, set: &[&str]) -> Result<String> {
    let mut args = vec![
        "template",
        "splice",
        "deploy/chart",
        "--namespace",
        namespace,
        "--include-crds",
    ];
    for s in set {
        args.extend(["--set", s]);
    }
    run(&helm()?, &args, None)
}

/// The YAML stream's objects keyed by `Kind namespace/name`.
fn objects(yaml: &str) -> Result<BTreeMap<String, Value>> {
    let mut by_key = BTreeMap::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = Value::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        let field = |path: &str| value.pointer(path).and_then(Value::as_str).unwrap_or("");
        let key = format!(
            "{} {}/{}",
            field("/kind"),
            field("/metadata/namespace"),
            field("/metadata/name")
        );
        if by_key.insert(key.clone(), value).is_some() {
            bail!("{key} appears twice");
        }
    }
    Ok(by_key)
}

/// The JSON pointer of the first place `a` and `b` differ, with both values there.
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                (Some(l), Some(r)) => first_difference(l, r, &format!("{at}/{k}")),
                (l, r) => Some(format!("{at}/{k}: {l:?} vs {r:?}")),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (l, r))| first_difference(l, r, &format!("{at}/{i}"))),
        // kustomize writes the CRD's `30.0` as `30`: the same number.
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => None,
        _ if a == b => None,
        _ => Some(format!("{at}: {a} vs {b}")),
    }
}

#[test]
fn the_chart_with_default_values_renders_the_kustomize_base_objects_except_the_namespace() {
    let mut chart = objects(&render_chart("splice-system", &[]).unwrap()).unwrap();
    // The chart's one object of its own: the pre-delete hook that removes the admission
    // configuration Helm does not own (deleting the base deletes the CRD, which does that).
    let hook = chart.remove("Job splice-system/splice-uninstall").unwrap();
    assert_eq!(
        hook.pointer("/metadata/annotations/helm.sh~1hook"),
        Some(&Value::String("pre-delete".into()))
    );
    let mut base =
        objects(&run(&kubectl().unwrap(), &["kustomize", "deploy/"], None).unwrap()).unwrap();
    // Helm installs into a namespace it is given (`helm install -n splice-system
    // --create-namespace`); labelling it for Pod Security is the README's step.
    assert!(base.remove("Namespace /splice-system").is_some());
    // Helm copies crds/ verbatim (no templating), so the CRD lacks the label kustomize adds.
    let crd = base
        .get_mut("CustomResourceDefinition /injectionpolicies.splice.dev")
        .and_then(|c| c.pointer_mut("/metadata/labels"))
        .and_then(Value::as_object_mut)
        .unwrap();
    crd.remove("app.kubernetes.io/part-of");
    if crd.is_empty() {
        let meta = base
            .get_mut("CustomResourceDefinition /injectionpolicies.splice.dev")
            .and_then(|c| c.pointer_mut("/metadata"))
            .and_then(Value::as_object_mut)
            .unwrap();
        meta.remove("labels");
    }
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        base.keys().collect::<Vec<_>>(),
        "the chart and the kustomize base render different sets of objects"
    );
    for (key, object) in &base {
        let rendered = chart.get(key).unwrap();
        assert_eq!(
            first_difference(rendered, object, ""),
            None,
            "{key}: chart (left) and base (right) differ"
        );
    }
}

#[test]
fn the_charts_prometheus_rule_carries_the_alert_rules_and_the_runbook_base_url() {
    let rendered = render_chart(
        "splice-system",
        &[
            "prometheusRule.enabled=true",
            "serviceMonitor.enabled=true",
            "prometheusRule.runbookBaseURL=https://docs.example/runbooks.md",
        ],
    )
    .unwrap();
    let chart = objects(&rendered).unwrap();
    assert!(chart.contains_key("ServiceMonitor splice-system/splice"));
    let rule = chart.get("PrometheusRule splice-system/splice").unwrap();
    let generated = std::fs::read_to_string(repo_root().join("deploy/alerts/prometheus-rule.yaml"))
        .unwrap()
        .replace(
            "runbook_url: docs/runbooks.md",
            "runbook_url: https://docs.example/runbooks.md",
        );
    let expected = objects(&generated).unwrap();
    let expected = expected.get("PrometheusRule splice-system/splice").unwrap();
    assert_eq!(rule.get("spec"), expected.get("spec"));
    assert!(rendered.contains("runbook_url: https://docs.example/runbooks.md#splicenoleader"));
}

#[test]
fn values_for_image_replicas_log_format_lifetimes_and_probe_interval_reach_the_deployment() {
    let chart = objects(
        &render_chart(
            "splice-system",
            &[
                "image.repository=registry.example/splice",
                "image.tag=1.2.3",
                "replicas=3",
                "logFormat=text",
                "certificates.caLifetime=8760h",
                "certificates.servingCertLifetime=720h",
                "probeInterval=30s",
            ],
        )
        .unwrap(),
    )
    .unwrap();
    let deployment = chart.get("Deployment splice-system/splice").unwrap();
    assert_eq!(deployment.pointer("/spec/replicas"), Some(&Value::from(3)));
    let container = deployment
        .pointer("/spec/template/spec/containers/0")
        .unwrap();
    assert_eq!(
        container.get("image"),
        Some(&Value::from("registry.example/splice:1.2.3"))
    );
    let env: BTreeMap<&str, &str> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e.get("value")?.as_str()?)))
        .collect();
    assert_eq!(env.get("SPLICE_LOG_FORMAT"), Some(&"text"));
    assert_eq!(env.get("SPLICE_CA_LIFETIME"), Some(&"8760h"));
    assert_eq!(env.get("SPLICE_SERVING_CERT_LIFETIME"), Some(&"720h"));
    assert_eq!(env.get("SPLICE_PROBE_INTERVAL"), Some(&"30s"));
}

#[test]
fn values_from_namespaces_reach_the_deployment_and_grant_read_only_there() {
    let chart = objects(
        &render_chart(
            "splice-system",
            &["valuesFrom.namespaces={splice-system,mesh-system}"],
        )
        .unwrap(),
    )
    .unwrap();
    let container = chart
        .get("Deployment splice-system/splice")
        .and_then(|d| d.pointer("/spec/template/spec/containers/0"))
        .unwrap();
    let values_namespaces = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "SPLICE_VALUES_NAMESPACES")
        .and_then(|e| e["value"].as_str());
    assert_eq!(values_namespaces, Some("splice-system,mesh-system"));
    let role = chart.get("Role mesh-system/splice-values").unwrap();
    assert_eq!(
        role.pointer("/rules/0/verbs"),
        Some(&serde_json::json!(["get", "list", "watch"]))
    );
    assert!(chart.contains_key("RoleBinding mesh-system/splice-values"));
    // Splice's own namespace is covered by its Role already.
    assert!(!chart.contains_key("Role splice-system/splice-values"));
}

#[test]
fn helm_lint_passes_with_default_and_with_monitoring_values() {
    let helm = helm().unwrap();
    run(&helm, &["lint", "--strict", "deploy/chart"], None).unwrap();
    run(
        &helm,
        &[
            "lint",
            "--strict",
            "deploy/chart",
            "--set",
            "prometheusRule.enabled=true,serviceMonitor.enabled=true",
        ],
        None,
    )
    .unwrap();
}

#[test]
fn the_api_server_accepts_the_default_chart_in_a_server_side_dry_run() {
    // `default` exists on every cluster; a dry run does not create the release namespace.
    let rendered = render_chart("default", &[]).unwrap();
    let out = run(
        &kubectl().unwrap(),
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&rendered),
    )
    .unwrap();
    assert!(
        out.contains("deployment.apps/splice created (server dry run)"),
        "{out}"
    );
    assert!(
        out.contains("customresourcedefinition.apiextensions.k8s.io/injectionpolicies.splice.dev"),
        "{out}"
    );
}
