//! `spec.overrides` through the engine: precedence, refusals, provenance, and what a policy may
//! declare.

// A helper outside #[test] functions: a policy that compiles where it should not stops the test.
#![allow(clippy::panic)]

mod engine_common;

use engine_common::*;
use proptest::prelude::*;
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

/// A CPU value whose fate the test knows without the engine: millicores (accepted under 1000m),
/// whole cores (accepted only at 0), or not a quantity at all.
#[derive(Clone, Debug)]
enum Cpu {
    Milli(u32),
    Cores(u32),
    NotAQuantity(String),
}

impl Cpu {
    fn text(&self) -> String {
        match self {
            Cpu::Milli(n) => format!("{n}m"),
            Cpu::Cores(n) => n.to_string(),
            Cpu::NotAQuantity(s) => s.clone(),
        }
    }
    fn accepted(&self) -> bool {
        match self {
            Cpu::Milli(n) => *n < 1000,
            Cpu::Cores(n) => *n == 0,
            Cpu::NotAQuantity(_) => false,
        }
    }
}

fn cpu() -> impl Strategy<Value = Cpu> {
    prop_oneof![
        (0u32..2000).prop_map(Cpu::Milli),
        (0u32..4).prop_map(Cpu::Cores),
        "[a-z]{1,6}|[0-9]+x|-|\\.".prop_map(Cpu::NotAQuantity),
    ]
}

fn level() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("debug".to_owned()),
        Just("info".to_owned()),
        Just("warn".to_owned()),
        "[a-z]{0,8}",
    ]
}

/// How many random annotation sets the property below tries: 10⁵ unless
/// `SPLICE_OVERRIDE_CASES` says otherwise.
fn cases() -> u32 {
    std::env::var("SPLICE_OVERRIDE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

/// Compiled once: the property runs 10⁵ cases.
static COMPILED: std::sync::LazyLock<splice_engine::CompiledPolicy> =
    std::sync::LazyLock::new(|| policy(PROXY));

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Over random pod and namespace annotations: a pod value outside its rule is refused, no
    /// rendered value is ever outside its rule, each comes from the pod, else the namespace, else
    /// the default, and the webhook's patch gives the offline CLI's object (`apply` checks).
    #[test]
    fn no_value_outside_its_rule_is_rendered_and_precedence_holds(
        pod_cpu in proptest::option::of(cpu()),
        ns_cpu in proptest::option::of(cpu()),
        pod_level in proptest::option::of(level()),
        ns_level in proptest::option::of(level()),
    ) {
        let p = &*COMPILED;
        let mut annotations = serde_json::Map::new();
        if let Some(c) = &pod_cpu {
            annotations.insert("mesh.example/proxy-cpu".into(), c.text().into());
        }
        if let Some(l) = &pod_level {
            annotations.insert("mesh.example/log-level".into(), l.clone().into());
        }
        let mut namespace = Vec::new();
        if let Some(c) = &ns_cpu {
            namespace.push(("mesh.example/proxy-cpu", c.text()));
        }
        if let Some(l) = &ns_level {
            namespace.push(("mesh.example/log-level", l.clone()));
        }
        let namespace: Vec<(&str, &str)> = namespace.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let team = shop(&namespace);
        let object = pod(Value::Object(annotations));
        if pod_cpu.as_ref().is_some_and(|c| !c.accepted()) {
            let d = decide(p, Operation::Create, &object.to_string(), &team);
            prop_assert!(matches!(d, Decision::Refuse(_)), "{d:?}");
            return Ok(());
        }
        let (_, out) = apply(p, Operation::Create, &object, &team);
        let (want_cpu, cpu_from) = match (&pod_cpu, &ns_cpu) {
            (Some(c), _) => (c.text(), "pod"),
            (None, Some(c)) if c.accepted() => (c.text(), "namespace"),
            _ => ("100m".to_owned(), "default"),
        };
        // The log level is the namespace's alone (from: [Namespace]): the pod's is ignored.
        let allowed = ["debug", "info", "warn"];
        let (want_level, level_from) = match &ns_level {
            Some(l) if allowed.contains(&l.as_str()) => (l.clone(), "namespace"),
            _ => ("info".to_owned(), "default"),
        };
        let rendered = proxy(&out);
        prop_assert_eq!(rendered["resources"]["requests"]["cpu"].as_str(), Some(want_cpu.as_str()));
        let want_args = format!("--log-level={want_level}");
        prop_assert_eq!(rendered["args"][0].as_str(), Some(want_args.as_str()));
        let recorded = &status(&out)["mesh"]["overrides"];
        prop_assert_eq!(recorded["proxyCPU"]["from"].as_str(), Some(cpu_from));
        prop_assert_eq!(recorded["logLevel"]["from"].as_str(), Some(level_from));
    }
}

fn with_selinux_type(allowed: &str) -> Result<splice_engine::CompiledPolicy, PolicyError> {
    try_policy(&format!(
        "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {{name: p}}\nspec:\n  \
         overrides: [{{name: se, annotation: a/se, type: string, default: container_t, \
         privileged: true, rule: \"self in [{allowed}]\"}}]\n  template:\n    containers:\n      \
         - name: s\n        image: s:1\n        securityContext: {{seLinuxOptions: {{type: \
         '{{{{ overrides.se }}}}'}}}}\n"
    ))
}

#[test]
fn pod_security_is_judged_over_every_value_a_privileged_override_allows() {
    // Only types baseline allows: the level is what the rest of the content says.
    let safe = with_selinux_type("'container_t', 'container_init_t'").unwrap();
    assert_ne!(
        safe.pod_security().level,
        splice_crds::PodSecurityLevel::Privileged
    );
    // One value baseline forbids: privileged, naming it, and refused without allowPrivileged.
    let e = with_selinux_type("'container_t', 'spc_t'").unwrap_err();
    assert!(e.to_string().contains("spc_t"), "{e}");
    assert_eq!(
        e.field(),
        "spec.template.containers[0].securityContext.seLinuxOptions.type"
    );
}
