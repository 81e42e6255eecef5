//! Other mutators touch what Splice injected: the ServiceAccount admission plugin mounts its token
//! into every container (injected ones too) and other webhooks add env vars. Those additions are
//! not drift, and must survive a reinvocation.

mod engine_common;

use engine_common::*;
use serde_json::json;

fn bare_pod() -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "shop", "labels": {"app": "p"}},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]}
    })
}

#[test]
fn a_token_mount_added_to_an_injected_sidecar_does_not_trigger_reinjection() {
    let policy = sidecar();
    let (_, mut pod) = create(&policy, &bare_pod());
    // What the ServiceAccount plugin does when built-in plugins re-run after the webhooks.
    let mount = json!({"name": "kube-api-access-x", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true});
    for c in pod["spec"]["initContainers"].as_array_mut().unwrap() {
        let mounts = c
            .as_object_mut()
            .unwrap()
            .entry("volumeMounts")
            .or_insert(json!([]));
        mounts.as_array_mut().unwrap().push(mount.clone());
    }
    pod["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "kube-api-access-x", "projected": {"sources": []}}));

    let (again, out) = create(&policy, &pod);
    assert!(
        !again.changed,
        "no patch expected, got warnings {:?}",
        again.warnings
    );
    for c in out["spec"]["initContainers"].as_array().unwrap() {
        assert!(
            names(&c["volumeMounts"])
                .iter()
                .any(|n| n == "kube-api-access-x")
        );
    }
}

#[test]
fn a_changed_value_in_an_injected_sidecar_is_still_repaired() {
    let policy = sidecar();
    let (_, mut pod) = create(&policy, &bare_pod());
    let image = pod["spec"]["initContainers"][1]["image"].clone();
    pod["spec"]["initContainers"][1]["image"] = json!("someone-else:evil");

    let (again, out) = create(&policy, &pod);
    assert!(again.changed);
    assert_eq!(out["spec"]["initContainers"][1]["image"], image);
    assert_eq!(
        names(&out["spec"]["initContainers"]).len(),
        2,
        "never a duplicate"
    );
}
