//! `spec.overrides` through the engine: precedence, refusals, provenance, and what a policy may
//! declare.

// A helper outside #[test] functions: a policy that compiles where it should not stops the test.
#![allow(clippy::panic)]

mod engine_common;

use engine_common::*;
use serde_json::{Value, json};
use splice_crds::Operation;
use splice_engine::{Decision, NamespaceContext, PolicyError};

const PROXY: &str = include_str!("../../testdata/policy-overrides.yaml");

fn pod(annotations: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "web:1"}]}
    })
}

fn shop(annotations: &[(&str, &str)]) -> NamespaceContext {
    NamespaceContext {
        annotations: annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..ns("shop")
    }
}

fn proxy(out: &Value) -> &Value {
    &out["spec"]["initContainers"][0]
}

#[test]
fn the_pods_annotation_wins_over_the_namespaces_which_wins_over_the_default() {
    let p = policy(PROXY);
    let team = shop(&[
        ("mesh.example/proxy-cpu", "300m"),
        ("mesh.example/log-level", "debug"),
    ]);
    let own = pod(json!({"mesh.example/proxy-cpu": "200m"}));
    let (_, out) = apply(&p, Operation::Create, &own, &team);
    assert_eq!(proxy(&out)["resources"]["requests"]["cpu"], "200m");
    assert_eq!(proxy(&out)["args"][0], "--log-level=debug");
    let recorded = &status(&out)["mesh"]["overrides"];
    assert_eq!(recorded["proxyCPU"]["from"], "pod");
    assert_eq!(recorded["logLevel"]["from"], "namespace");

    let (_, out) = apply(&p, Operation::Create, &pod(json!({})), &shop(&[]));
    assert_eq!(proxy(&out)["resources"]["requests"]["cpu"], "100m");
    assert_eq!(proxy(&out)["args"][0], "--log-level=info");
    assert_eq!(
        status(&out)["mesh"]["overrides"]["proxyCPU"]["from"],
        "default"
    );
}

#[test]
fn a_pod_annotation_outside_the_rule_is_refused_naming_annotation_value_and_message() {
    let p = policy(PROXY);
    let text = pod(json!({"mesh.example/proxy-cpu": "2"})).to_string();
    let d = decide(&p, Operation::Create, &text, &shop(&[]));
    let Decision::Refuse(refused) = d else {
        panic!("expected a refusal, got {d:?}")
    };
    let message = refused.to_string();
    for part in ["mesh", "mesh.example/proxy-cpu", "\"2\"", "at most 1 CPU"] {
        assert!(message.contains(part), "{message:?} lacks {part:?}");
    }
}

#[test]
fn a_namespace_annotation_outside_the_rule_gives_the_default_and_refuses_no_pod() {
    let p = policy(PROXY);
    let (_, out) = apply(
        &p,
        Operation::Create,
        &pod(json!({})),
        &shop(&[("mesh.example/log-level", "trace")]),
    );
    assert_eq!(proxy(&out)["args"][0], "--log-level=info");
    assert_eq!(
        status(&out)["mesh"]["overrides"]["logLevel"]["from"],
        "default"
    );
}

#[test]
fn two_pods_of_one_shape_with_different_annotations_get_their_own_values() {
    // Pods of one template share a kept patch when nothing else differs: overrides must not.
    let p = policy(PROXY);
    let (_, a) = apply(
        &p,
        Operation::Create,
        &pod(json!({"mesh.example/proxy-cpu": "200m"})),
        &shop(&[]),
    );
    let (_, b) = apply(
        &p,
        Operation::Create,
        &pod(json!({"mesh.example/proxy-cpu": "300m"})),
        &shop(&[]),
    );
    assert_eq!(proxy(&a)["resources"]["requests"]["cpu"], "200m");
    assert_eq!(proxy(&b)["resources"]["requests"]["cpu"], "300m");
}

#[test]
fn running_on_its_own_output_gives_an_empty_patch() {
    let p = policy(PROXY);
    let team = shop(&[("mesh.example/log-level", "warn")]);
    let (_, once) = apply(
        &p,
        Operation::Create,
        &pod(json!({"mesh.example/proxy-cpu": "250m"})),
        &team,
    );
    let (again, twice) = apply(&p, Operation::Create, &once, &team);
    assert!(!again.changed, "{}", String::from_utf8_lossy(&again.patch));
    assert_eq!(once, twice);
}

#[test]
fn an_annotation_of_64_kib_is_refused_with_its_size() {
    let p = policy(PROXY);
    let big = "5".repeat(64 * 1024);
    let text = pod(json!({"mesh.example/proxy-cpu": big})).to_string();
    let Decision::Refuse(refused) = decide(&p, Operation::Create, &text, &shop(&[])) else {
        panic!("expected a refusal")
    };
    let message = refused.to_string();
    assert!(message.contains("65536 bytes"), "{message}");
    assert!(message.len() < 600, "the message quotes the whole value");
}

fn refused(yaml_spec: &str) -> PolicyError {
    let yaml = format!(
        "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {{name: p}}\nspec:\n{yaml_spec}"
    );
    match try_policy(&yaml) {
        Ok(_) => panic!("compiled: {yaml_spec}"),
        Err(e) => e,
    }
}

#[test]
fn a_template_reading_an_undeclared_override_is_refused_with_the_declared_ones() {
    let e = refused(
        "  overrides: [{name: cpu, annotation: a/cpu, type: quantity, default: 1m}]\n  \
         template: {annotations: {x: '{{ overrides.memory }}'}}\n",
    );
    let text = e.to_string();
    assert!(text.contains("overrides.memory is not declared"), "{text}");
    assert!(text.contains("declared: cpu"), "{text}");
    let e = refused(
        "  overrides: [{name: cpu, annotation: a/cpu, type: quantity, default: 1m}]\n  \
         template: {annotations: {x: '{{ overrides }}'}}\n",
    );
    assert!(e.to_string().contains("by name"), "{e}");
}

#[test]
fn an_override_reaching_a_security_field_must_be_marked_privileged() {
    let e = refused(
        "  overrides: [{name: user, annotation: a/user, type: string, default: '1000'}]\n  \
         template:\n    containers:\n      - name: s\n        image: s:1\n        \
         securityContext: {seLinuxOptions: {user: '{{ overrides.user }}'}}\n",
    );
    assert_eq!(
        e.field(),
        "spec.template.containers[0].securityContext.seLinuxOptions.user"
    );
    assert!(e.to_string().contains("privileged: true"), "{e}");
    let e = refused(
        "  overrides: [{name: user, annotation: a/user, type: string, default: u, \
         privileged: true}]\n",
    );
    assert_eq!(e.field(), "spec.overrides[0].privileged");
}

#[test]
fn bad_declarations_are_refused_at_compile_naming_the_field() {
    for (spec, field) in [
        (
            "  overrides: [{name: a, annotation: 'not a key!', type: string, default: x}]\n",
            "spec.overrides[0].annotation",
        ),
        (
            "  overrides: [{name: a, annotation: a/b, type: integer, default: ten}]\n",
            "spec.overrides[0].default",
        ),
        (
            "  overrides: [{name: a, annotation: a/b, type: integer, default: '5', rule: 'self >'}]\n",
            "spec.overrides[0].rule",
        ),
        (
            "  overrides: [{name: a, annotation: a/b, type: integer, default: '5', rule: 'self < 3'}]\n",
            "spec.overrides[0].default",
        ),
    ] {
        assert_eq!(refused(spec).field(), field, "{spec}");
    }
}
