//! Helpers shared by the engine test files.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;
use splice_crds::{InjectionPolicy, Operation};
use splice_engine::{
    CompiledPolicy, Decision, Exclusions, Injection, NamespaceContext, Pod, PodRequest, Selection,
    inject, inject_and_apply,
};

pub const SIDECAR_POLICY: &str = include_str!("../../../testdata/policy-sidecar.yaml");
pub const POD_3K: &str = include_str!("../../../testdata/pod-3k.json");
pub const POD_8K: &str = include_str!("../../../testdata/pod-8k.json");
pub const POD_45K: &str = include_str!("../../../testdata/pod-45k.json");
pub const POD_2000_ENV: &str = include_str!("../../../testdata/pod-2000-env.json");

/// Compiles an InjectionPolicy manifest.
pub fn policy(yaml: &str) -> CompiledPolicy {
    try_policy(yaml).unwrap()
}

pub fn try_policy(yaml: &str) -> Result<CompiledPolicy, splice_engine::PolicyError> {
    let p: InjectionPolicy = serde_yaml::from_str(yaml).expect("policy YAML");
    let name = p.metadata.name.clone().expect("policy name");
    CompiledPolicy::compile(&name, p.metadata.generation.unwrap_or(1), &p.spec)
}

pub fn sidecar() -> CompiledPolicy {
    policy(SIDECAR_POLICY)
}

pub fn ns(name: &str) -> NamespaceContext {
    NamespaceContext {
        name: name.into(),
        ..Default::default()
    }
}

pub fn exclusions() -> Exclusions {
    Exclusions::default_for("splice-system")
}

pub fn decide(
    policy: &CompiledPolicy,
    op: Operation,
    pod: &str,
    ns: &NamespaceContext,
) -> Decision {
    let ex = exclusions();
    inject(
        policy,
        &PodRequest {
            operation: op,
            object: &Pod::parse(pod).unwrap(),
            namespace: ns,
            exclusions: &ex,
            trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN,
            selection: Selection::Evaluate,
        },
    )
    .unwrap()
}

/// Injects, checks the patch applied by the independent json-patch crate gives the engine's own
/// mutated object, and returns both.
pub fn apply(
    policy: &CompiledPolicy,
    op: Operation,
    pod: &Value,
    ns: &NamespaceContext,
) -> (Injection, Value) {
    let text = serde_json::to_string(pod).unwrap();
    let ex = exclusions();
    let req = PodRequest {
        operation: op,
        object: &Pod::parse(&text).unwrap(),
        namespace: ns,
        exclusions: &ex,
        trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN,
        selection: Selection::Evaluate,
    };
    let (decision, mutated) = inject_and_apply(policy, &req).unwrap();
    let Decision::Inject(injection) = decision else {
        panic!("expected an injection, got {decision:?}");
    };
    let ops: json_patch::Patch = serde_json::from_slice(&injection.patch).unwrap();
    let mut doc = pod.clone();
    json_patch::patch(&mut doc, &ops).unwrap_or_else(|e| {
        panic!(
            "patch does not apply: {e}\npatch: {}",
            String::from_utf8_lossy(&injection.patch)
        )
    });
    assert_eq!(
        doc, mutated,
        "json-patch result differs from the engine's object"
    );
    assert_eq!(injection.changed, !ops.0.is_empty());
    (injection, mutated)
}

pub fn create(policy: &CompiledPolicy, pod: &Value) -> (Injection, Value) {
    apply(policy, Operation::Create, pod, &ns("shop"))
}

pub fn names(list: &Value) -> Vec<String> {
    list.as_array()
        .map(|a| {
            a.iter()
                .map(|i| i["name"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

pub fn status(pod: &Value) -> Value {
    let s = pod["metadata"]["annotations"]["splice.dev/status"]
        .as_str()
        .expect("status annotation");
    serde_json::from_str(s).unwrap()
}
