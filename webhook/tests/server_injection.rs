//! The admission server with real compiled policies: patches over the wire, dryRun, skips, the
//! namespace store, engine errors and the metrics they leave.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod server_common;

use std::sync::{Arc, Mutex};

use base64::Engine as _;
use server_common::*;
use splice_webhook::engine::{CompiledPolicy, NamespaceContext, SkipReason};
use splice_webhook::metrics::Outcome;
use splice_webhook::server::{AdmissionHook, Admitted};
use splice_webhook::store::PolicyStore;

const SIDECAR_POLICY: &str = include_str!("../testdata/policy-sidecar.yaml");
const POD_8K: &str = include_str!("../testdata/pod-8k.json");

fn compile(yaml: &str) -> (String, Arc<CompiledPolicy>) {
    let policy: splice_crds::InjectionPolicy = serde_yaml::from_str(yaml).unwrap();
    let name = policy.metadata.name.clone().unwrap();
    let generation = policy.metadata.generation.unwrap_or(1);
    let compiled = CompiledPolicy::compile(&name, generation, &policy.spec).unwrap();
    (name, Arc::new(compiled))
}

fn store_with(yamls: &[&str]) -> Arc<PolicyStore> {
    let store = Arc::new(PolicyStore::new());
    for yaml in yamls {
        let (name, policy) = compile(yaml);
        store.insert(name, policy);
    }
    store
}

#[derive(Default)]
struct Recorder(Mutex<Vec<(String, String, bool)>>);

impl AdmissionHook for Recorder {
    fn admitted(&self, a: &Admitted<'_>) {
        self.0
            .lock()
            .unwrap()
            .push((a.policy.to_owned(), a.uid.to_owned(), a.changed));
    }
}

fn patch_of(reply: &Reply) -> Option<Vec<u8>> {
    let v = reply.json();
    let patch = v["response"].get("patch")?.as_str()?.to_owned();
    assert_eq!(v["response"]["patchType"], "JSONPatch");
    Some(
        base64::engine::general_purpose::STANDARD
            .decode(patch)
            .unwrap(),
    )
}

fn apply(pod: &str, patch: &[u8]) -> serde_json::Value {
    let mut doc: serde_json::Value = serde_json::from_str(pod).unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(patch).unwrap();
    json_patch::patch(&mut doc, &patch).unwrap();
    doc
}

#[tokio::test]
async fn a_pod_gets_the_sidecar_patch_with_warnings_and_is_counted() {
    let server = Running::start_with(config(), store_with(&[SIDECAR_POLICY]), None).await;
    let body = pod_review("uid-1", "shop", false, POD_8K);
    let reply = exchange(
        &server,
        &post("/inject/mesh-proxy", "application/json", body.as_bytes()),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    assert_eq!(v["response"]["uid"], "uid-1");
    assert_eq!(v["response"]["allowed"], true);
    assert!(!v["response"]["warnings"].as_array().unwrap().is_empty());

    let patched = apply(POD_8K, &patch_of(&reply).expect("a patch"));
    let init: Vec<&str> = patched["spec"]["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(
        init.contains(&"mesh-proxy") && init.contains(&"mesh-init"),
        "{init:?}"
    );
    assert_eq!(
        patched["metadata"]["labels"]["mesh.example/injected"],
        "true"
    );

    let m = server.metrics.admission("mesh-proxy");
    assert_eq!(m.requests(Outcome::Injected), 1);
    assert_eq!(m.injections(), 1);
    assert_eq!(m.duration().count(), 1);
    let text = server.metrics.render();
    assert!(
        text.contains(
            r#"splice_admission_requests_total{policy="mesh-proxy",outcome="injected"} 1"#
        ),
        "{text}"
    );
    assert!(text.contains(r#"splice_injections_total{policy="mesh-proxy"} 1"#));
}

#[tokio::test]
async fn the_patched_pod_sent_again_gets_no_patch() {
    let server = Running::start_with(config(), store_with(&[SIDECAR_POLICY]), None).await;
    let body = pod_review("first", "shop", false, POD_8K);
    let reply = exchange(
        &server,
        &post("/inject/mesh-proxy", "application/json", body.as_bytes()),
    )
    .await;
    let patched = apply(POD_8K, &patch_of(&reply).unwrap()).to_string();

    let body = pod_review("second", "shop", false, &patched);
    let reply = exchange(
        &server,
        &post("/inject/mesh-proxy", "application/json", body.as_bytes()),
    )
    .await;
    assert_eq!(reply.status, 200);
    assert!(patch_of(&reply).is_none(), "{}", reply.text());
    assert_eq!(
        server
            .metrics
            .admission("mesh-proxy")
            .requests(Outcome::Unchanged),
        1
    );
}

#[tokio::test]
async fn dry_run_returns_the_same_patch_and_skips_the_side_effect_hook() {
    let recorder = Arc::new(Recorder::default());
    let server = Running::start_with(
        config(),
        store_with(&[SIDECAR_POLICY]),
        Some(Arc::clone(&recorder) as Arc<dyn AdmissionHook>),
    )
    .await;
    let dry = pod_review("dry", "shop", true, POD_8K);
    let dry_reply = exchange(
        &server,
        &post("/inject/mesh-proxy", "application/json", dry.as_bytes()),
    )
    .await;
    assert!(recorder.0.lock().unwrap().is_empty());
    assert_eq!(server.metrics.admission("mesh-proxy").injections(), 0);

    let real = pod_review("real", "shop", false, POD_8K);
    let real_reply = exchange(
        &server,
        &post("/inject/mesh-proxy", "application/json", real.as_bytes()),
    )
    .await;
    assert_eq!(
        patch_of(&dry_reply).unwrap(),
        patch_of(&real_reply).unwrap()
    );
    assert_eq!(
        *recorder.0.lock().unwrap(),
        vec![("mesh-proxy".to_owned(), "real".to_owned(), true)]
    );
    assert_eq!(
        server
            .metrics
            .admission("mesh-proxy")
            .requests(Outcome::Injected),
        2
    );
    assert_eq!(server.metrics.admission("mesh-proxy").injections(), 1);
}

#[tokio::test]
async fn non_pods_deletes_and_excluded_namespaces_are_allowed_without_a_patch() {
    let server = Running::start_with(config(), store_with(&[SIDECAR_POLICY]), None).await;
    let deployment = review(
        r#"{"uid":"d","kind":{"group":"apps","version":"v1","kind":"Deployment"},"resource":{"group":"apps","version":"v1","resource":"deployments"},"operation":"CREATE","namespace":"shop","object":{"kind":"Deployment","metadata":{"name":"x"}}}"#,
    );
    let delete = review(
        r#"{"uid":"del","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"operation":"DELETE","namespace":"shop","object":null,"oldObject":{"metadata":{"name":"x"}}}"#,
    );
    let system = pod_review("sys", "kube-system", false, POD_8K);
    let own = pod_review("own", "splice-system", false, POD_8K);
    for (uid, body) in [
        ("d", deployment),
        ("del", delete),
        ("sys", system),
        ("own", own),
    ] {
        let reply = exchange(
            &server,
            &post("/inject/mesh-proxy", "application/json", body.as_bytes()),
        )
        .await;
        assert_eq!(reply.status, 200, "{uid}: {}", reply.text());
        assert_eq!(reply.json()["response"]["uid"], uid);
        assert_eq!(reply.json()["response"]["allowed"], true);
        assert!(patch_of(&reply).is_none(), "{uid}: {}", reply.text());
    }
    let m = server.metrics.admission("mesh-proxy");
    assert_eq!(m.skips(SkipReason::NotAPod), 1);
    assert_eq!(m.skips(SkipReason::OperationNotConfigured), 1);
    assert_eq!(m.skips(SkipReason::ExcludedNamespace), 2);
    assert_eq!(m.requests(Outcome::Skipped), 4);
    assert!(server.metrics.render().contains(
        r#"splice_injection_skipped_total{policy="mesh-proxy",reason="excluded_namespace"} 2"#
    ));
}

const NAMESPACE_SCOPED_POLICY: &str = r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: labelled}
spec:
  namespaceSelector: {matchLabels: {mesh: enabled}}
  template:
    labels: {injected-into: "{{ namespace.name }}"}
"#;

#[tokio::test]
async fn the_namespace_store_decides_namespace_selection() {
    let server = Running::start_with(config(), store_with(&[NAMESPACE_SCOPED_POLICY]), None).await;
    let body = pod_review("u", "team-a", false, SMALL_POD);
    let request = post("/inject/labelled", "application/json", body.as_bytes());

    // Unknown namespace: only its name label is known, and it does not select.
    let reply = exchange(&server, &request).await;
    assert!(patch_of(&reply).is_none());
    assert_eq!(
        server
            .metrics
            .admission("labelled")
            .skips(SkipReason::NamespaceNotSelected),
        1
    );

    let mut ctx = NamespaceContext {
        name: "team-a".to_owned(),
        ..Default::default()
    };
    ctx.labels.insert("mesh".to_owned(), "enabled".to_owned());
    server.namespaces.insert("team-a", Arc::new(ctx));
    let reply = exchange(&server, &request).await;
    let patched = apply(
        SMALL_POD,
        &patch_of(&reply).expect("a patch once the namespace is labelled"),
    );
    assert_eq!(patched["metadata"]["labels"]["injected-into"], "team-a");
}

#[tokio::test]
async fn a_policy_added_or_removed_at_run_time_takes_effect_on_the_next_request() {
    let server = Running::start_with(config(), Arc::new(PolicyStore::new()), None).await;
    let body = pod_review("u", "shop", false, POD_8K);
    let request = post("/inject/mesh-proxy", "application/json", body.as_bytes());
    assert!(exchange(&server, &request).await.json()["response"]["warnings"].is_array());

    let (name, policy) = compile(SIDECAR_POLICY);
    server.policies.insert(name, policy);
    assert!(patch_of(&exchange(&server, &request).await).is_some());

    server.policies.remove("mesh-proxy");
    let reply = exchange(&server, &request).await;
    assert!(patch_of(&reply).is_none());
}

#[tokio::test]
async fn an_object_the_engine_cannot_read_gets_500_so_the_failure_policy_applies() {
    let server = Running::start_with(config(), store_with(&[SIDECAR_POLICY]), None).await;
    let broken = r#"{"kind":"Pod","metadata":{"name":"x","labels":{"app":"x"}},"spec":{"containers":"not-a-list"}}"#;
    let body = pod_review("u", "shop", false, broken);
    let reply = exchange(
        &server,
        &post("/inject/mesh-proxy", "application/json", body.as_bytes()),
    )
    .await;
    assert_eq!(reply.status, 500, "{}", reply.text());
    assert!(
        reply.text().contains("could not compute the injection"),
        "{}",
        reply.text()
    );
    assert_eq!(
        server
            .metrics
            .admission("mesh-proxy")
            .requests(Outcome::Error),
        1
    );
}
