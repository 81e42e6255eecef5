//! The engine reuses renderings across requests when templates do not read the pod. These tests
//! pin what a reused rendering may never do: leak one namespace's content into another, outlive a
//! change of the namespace's labels, or hide a rendering error.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod engine_common;

use std::collections::BTreeMap;

use engine_common::*;
use serde_json::{Value, json};
use splice_crds::Operation;
use splice_engine::{EngineError, NamespaceContext, PodRequest, Selection, inject};

fn pod() -> Value {
    json!({
        "kind": "Pod",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "web:1"}]}
    })
}

fn ns_with(name: &str, labels: &[(&str, &str)]) -> NamespaceContext {
    NamespaceContext {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        ..Default::default()
    }
}

const READS_LABELS: &str = r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: team-env}
spec:
  template:
    env:
      - {name: TEAM, value: "{{ namespace.labels.team }}"}
      - {name: NS, value: "{{ namespace.name }}"}
    annotations:
      example.com/team: "{{ namespace.labels.team }}"
"#;

fn env_value(out: &Value, name: &str) -> String {
    out["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| e["value"].as_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("no env {name} in {out}"))
}

#[test]
fn each_namespace_gets_its_own_name_rendered_when_requests_alternate() {
    let policy = sidecar();
    for round in 0..3 {
        for name in ["shop", "billing", "shop"] {
            let (_, out) = apply(&policy, Operation::Create, &pod(), &ns(name));
            assert_eq!(
                out["spec"]["initContainers"][1]["args"][2],
                format!("--domain={name}.svc.cluster.local"),
                "round {round}"
            );
        }
    }
}

#[test]
fn a_change_of_the_namespace_labels_is_seen_by_the_next_request() {
    let policy = policy(READS_LABELS);
    let (_, first) = apply(
        &policy,
        Operation::Create,
        &pod(),
        &ns_with("shop", &[("team", "red")]),
    );
    assert_eq!(env_value(&first, "TEAM"), "red");
    let (_, second) = apply(
        &policy,
        Operation::Create,
        &pod(),
        &ns_with("shop", &[("team", "blue")]),
    );
    assert_eq!(env_value(&second, "TEAM"), "blue");
    assert_eq!(
        second["metadata"]["annotations"]["example.com/team"],
        "blue"
    );
    // And back: a reused rendering must be the one for this exact context.
    let (_, third) = apply(
        &policy,
        Operation::Create,
        &pod(),
        &ns_with("shop", &[("team", "red")]),
    );
    assert_eq!(env_value(&third, "TEAM"), "red");
}

#[test]
fn a_rendering_error_is_reported_on_every_request_not_only_the_first() {
    let policy = policy(READS_LABELS);
    let text = pod().to_string();
    let ex = exclusions();
    let no_team = ns_with("shop", &[]);
    for _ in 0..3 {
        let err = inject(
            &policy,
            &PodRequest {
                operation: Operation::Create,
                object: &splice_engine::Pod::parse(&text).unwrap(),
                namespace: &no_team,
                exclusions: &ex,
                trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN,
                selection: Selection::Evaluate,
            },
        )
        .expect_err("namespace without the team label");
        assert!(matches!(err, EngineError::Render { .. }), "{err}");
    }
    // The namespace gains the label: the same policy now renders.
    let (_, out) = apply(
        &policy,
        Operation::Create,
        &pod(),
        &ns_with("shop", &[("team", "green")]),
    );
    assert_eq!(env_value(&out, "TEAM"), "green");
}

#[test]
fn an_update_after_a_create_renders_metadata_only_and_a_create_after_an_update_renders_everything()
{
    let yaml = r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: both}
spec:
  operations: [CREATE, UPDATE]
  template:
    env: [{name: NS, value: "{{ namespace.name }}"}]
    labels: {example.com/ns: "{{ namespace.name }}"}
"#;
    let policy = policy(yaml);
    let (_, created) = apply(&policy, Operation::Create, &pod(), &ns("shop"));
    assert_eq!(env_value(&created, "NS"), "shop");
    let (_, updated) = apply(&policy, Operation::Update, &pod(), &ns("shop"));
    assert_eq!(updated["metadata"]["labels"]["example.com/ns"], "shop");
    assert!(
        updated["spec"]["containers"][0].get("env").is_none(),
        "an UPDATE must not touch containers: {updated}"
    );
    let (_, again) = apply(&policy, Operation::Create, &pod(), &ns("shop"));
    assert_eq!(env_value(&again, "NS"), "shop");
}

#[test]
fn the_patch_is_the_same_from_a_fresh_policy_and_from_a_warm_one() {
    for pod_text in [POD_3K, POD_8K, POD_45K, POD_2000_ENV] {
        let warm = sidecar();
        let shop = ns("shop");
        for _ in 0..2 {
            let _ = decide(&warm, Operation::Create, pod_text, &shop);
        }
        let fresh = sidecar();
        let a = decide(&warm, Operation::Create, pod_text, &shop);
        let b = decide(&fresh, Operation::Create, pod_text, &shop);
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }
}
