//! `deploy/crd.yaml` is what cluster admins apply; it must be exactly what the types generate.

use std::path::Path;

#[test]
fn the_committed_crd_matches_the_generated_one() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crd.yaml");
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}\ndeploy/crd.yaml is missing: run `cargo run -p splice -- crd > deploy/crd.yaml`",
            path.display()
        )
    });
    let generated = splice_crds::crd_yaml().expect("the CRD renders");
    if committed != generated {
        let first_difference = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
        panic!(
            "deploy/crd.yaml is stale: run `cargo run -p splice -- crd > deploy/crd.yaml`\n\
             (first difference at line {}: committed {:?}, generated {:?})",
            first_difference + 1,
            committed
                .lines()
                .nth(first_difference)
                .unwrap_or("<end of file>"),
            generated
                .lines()
                .nth(first_difference)
                .unwrap_or("<end of file>"),
        );
    }
}

#[test]
fn the_committed_crd_is_the_injection_policy_crd() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crd.yaml");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return; // reported by the test above
    };
    let crd: serde_json::Value = serde_yaml::from_str(&text).expect("deploy/crd.yaml is YAML");
    assert_eq!(crd["kind"], "CustomResourceDefinition");
    assert_eq!(crd["metadata"]["name"], "injectionpolicies.splice.dev");
    assert_eq!(crd["spec"]["scope"], "Cluster");
}
