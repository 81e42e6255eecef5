//! The engine over arbitrary input: it must never panic, every patch it emits must apply (with the
//! independent json-patch crate) to give its own mutated object, running it again on that object
//! must give an empty patch, and the patch path (which may answer with a patch kept for an earlier
//! input of the same shape) must give what the full path plans afresh.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use splice_crds::{InjectionPolicy, Operation};
use splice_engine::{
    CompiledPolicy, Decision, Exclusions, NamespaceContext, Pod, PodRequest, Selection, inject,
    inject_and_apply,
};

const SIDECAR: &str = include_str!("../../testdata/policy-sidecar.yaml");

fn policies() -> &'static [CompiledPolicy] {
    static POLICIES: OnceLock<Vec<CompiledPolicy>> = OnceLock::new();
    POLICIES.get_or_init(|| {
        let compile = |yaml: &str| {
            let p: InjectionPolicy = serde_yaml::from_str(yaml).expect("policy YAML");
            let name = p.metadata.name.clone().expect("name");
            CompiledPolicy::compile(&name, 1, &p.spec).expect("compiles")
        };
        vec![
            compile(SIDECAR),
            // Reads the pod and selects nothing in particular.
            compile(
                &SIDECAR
                    .replace(
                        "\"--policy={{ policy.name }}\"",
                        "\"--kind={{ pod.kind | default('none') }}\"",
                    )
                    .replace("      - {key: app, operator: Exists}\n", ""),
            ),
        ]
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(object) = std::str::from_utf8(rest) else {
        return;
    };
    let policy = &policies()[usize::from(selector) % policies().len()];
    let operation = if selector & 0x80 == 0 {
        Operation::Create
    } else {
        Operation::Update
    };
    let ns = NamespaceContext {
        name: "shop".into(),
        ..Default::default()
    };
    let ex = Exclusions::default_for("splice-system");
    let Ok(pod) = Pod::parse(object) else {
        return;
    };
    let req = PodRequest {
        operation,
        object: &pod,
        namespace: &ns,
        exclusions: &ex,
        selection: Selection::Evaluate,
    };
    let Ok((Decision::Inject(injection), mutated)) = inject_and_apply(policy, &req) else {
        return;
    };
    let ops: json_patch::Patch = serde_json::from_slice(&injection.patch).expect("patch is JSON");
    let mut doc: serde_json::Value = serde_json::from_str(object).expect("input parsed once");
    json_patch::patch(&mut doc, &ops).expect("patch applies");
    assert_eq!(doc, mutated, "json-patch and the engine disagree");
    assert_eq!(injection.changed, !ops.0.is_empty());
    match inject(policy, &req) {
        Ok(Decision::Inject(kept)) => {
            assert_eq!(kept.patch, injection.patch, "the patch path's patch differs");
            assert_eq!(kept.warnings, injection.warnings);
            assert_eq!(kept.changed, injection.changed);
        }
        other => panic!("the patch path answered {other:?} where the full path injected"),
    }

    let again_text = mutated.to_string();
    let again_pod = Pod::parse(&again_text).expect("the engine's output is JSON");
    let again = PodRequest {
        object: &again_pod,
        ..req
    };
    match inject_and_apply(policy, &again) {
        Ok((Decision::Inject(second), _)) => assert!(
            !second.changed,
            "not idempotent: {}",
            String::from_utf8_lossy(&second.patch)
        ),
        Ok((Decision::Skip(reason), _)) => panic!("skipped its own output: {reason:?}"),
        // A template reading the pod may fail on what it did not fail on before (e.g. size).
        Err(_) => {}
    }
});
