//! The admission server with real compiled policies: patches over the wire, dryRun, skips, the
//! namespace store, engine errors and the metrics they leave.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod server_common;

use std::sync::{Arc, Mutex};

use base64::Engine as _;
use server_common::*;
use splice_engine::{CompiledPolicy, NamespaceContext, SkipReason};
use splice_server::metrics::Outcome;
use splice_server::server::{AdmissionHook, Admitted, WebhookConfig};
use splice_server::store::PolicyStore;

const SIDECAR_POLICY: &str = include_str!("../../testdata/policy-sidecar.yaml");
const POD_8K: &str = include_str!("../../testdata/pod-8k.json");

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
    let text = splice_server::metrics::render(&server.registry);
    assert!(
        text.contains(r#"splice_admission_duration_seconds_count{policy="mesh-proxy"} 1"#),
        "{text}"
    );
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
    assert!(splice_server::metrics::render(&server.registry).contains(
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
async fn the_api_servers_namespace_match_stands_whatever_the_namespace_store_says() {
    let server = Running::start_with(config(), store_with(&[NAMESPACE_SCOPED_POLICY]), None).await;
    let body = pod_review("u", "team-a", false, SMALL_POD);
    let request = post("/inject/labelled", "application/json", body.as_bytes());

    // The store has not seen team-a's label yet (a namespace labelled a moment ago): the API
    // server matched the configuration's namespaceSelector, so the pod is injected.
    let reply = exchange(&server, &request).await;
    let patched = apply(
        SMALL_POD,
        &patch_of(&reply).expect("injected although the store does not know the namespace"),
    );
    assert_eq!(patched["metadata"]["labels"]["injected-into"], "team-a");

    // A stale store that says the namespace does not match changes nothing either.
    let ctx = NamespaceContext {
        name: "team-a".to_owned(),
        ..Default::default()
    };
    server.namespaces.insert("team-a", Arc::new(ctx));
    assert!(patch_of(&exchange(&server, &request).await).is_some());
    assert_eq!(
        server
            .metrics
            .admission("labelled")
            .skips(SkipReason::NamespaceNotSelected),
        0
    );

    // The mandatory exclusions and the opt-out label still hold.
    let body = pod_review("u", "kube-system", false, SMALL_POD);
    let reply = exchange(
        &server,
        &post("/inject/labelled", "application/json", body.as_bytes()),
    )
    .await;
    assert!(patch_of(&reply).is_none());
}

const NAMESPACE_LABEL_POLICY: &str = r#"
apiVersion: splice.dev/v1alpha1
kind: InjectionPolicy
metadata: {name: team-label}
spec:
  template:
    labels: {team: "{{ namespace.labels.team }}"}
"#;

fn watched() -> WebhookConfig {
    let mut config = config();
    config.cache_wait = Some(std::time::Duration::from_secs(10));
    config
}

#[tokio::test]
async fn a_policy_the_watch_delivers_while_the_request_waits_is_injected() {
    let server = Running::start_with(watched(), Arc::new(PolicyStore::new()), None).await;
    let body = pod_review("u", "shop", false, POD_8K);
    let request = post("/inject/mesh-proxy", "application/json", body.as_bytes());
    let policies = Arc::clone(&server.policies);
    let late = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let (name, policy) = compile(SIDECAR_POLICY);
        policies.insert(name, policy);
    });
    let reply = exchange(&server, &request).await;
    late.await.expect("the writer finished");
    assert!(patch_of(&reply).is_some(), "{}", reply.text());
}

#[tokio::test]
async fn a_namespace_the_watch_delivers_while_the_request_waits_feeds_the_template() {
    let server = Running::start_with(watched(), store_with(&[NAMESPACE_LABEL_POLICY]), None).await;
    let body = pod_review("u", "team-b", false, SMALL_POD);
    let request = post("/inject/team-label", "application/json", body.as_bytes());
    let namespaces = Arc::clone(&server.namespaces);
    let late = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut ctx = NamespaceContext {
            name: "team-b".to_owned(),
            ..Default::default()
        };
        ctx.labels.insert("team".to_owned(), "payments".to_owned());
        namespaces.insert("team-b", Arc::new(ctx));
    });
    let reply = exchange(&server, &request).await;
    late.await.expect("the writer finished");
    let patched = apply(SMALL_POD, &patch_of(&reply).expect("injected"));
    assert_eq!(patched["metadata"]["labels"]["team"], "payments");
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

fn policy_yaml(name: &str, failure: &str, spec: &str) -> String {
    format!(
        "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {{name: {name}}}\nspec:\n  failurePolicy: {failure}\n{spec}"
    )
}

fn shared_store() -> Arc<PolicyStore> {
    let a = policy_yaml(
        "a-logs",
        "Ignore",
        "  template:\n    containers: [{name: shipper, image: shipper:1}]",
    );
    let b = policy_yaml(
        "b-broken",
        "Ignore",
        "  template:\n    containers: [{name: x, image: '{{ pod.metadata.labels.missing }}'}]",
    );
    let c = policy_yaml(
        "c-secrets",
        "Ignore",
        "  objectSelector: {matchLabels: {secrets: 'on'}}\n  template:\n    initContainers: [{name: vault, image: vault:1}]",
    );
    let d = policy_yaml(
        "d-strict",
        "Fail",
        "  template:\n    containers: [{name: y, image: '{{ pod.metadata.labels.missing }}'}]",
    );
    store_with(&[&a, &b, &c, &d])
}

#[tokio::test]
async fn a_shared_entry_answers_one_patch_for_its_policies_and_counts_each() {
    let recorder = Arc::new(Recorder::default());
    let hook: Arc<dyn AdmissionHook> = recorder.clone();
    let server = Running::start_with(config(), shared_store(), Some(hook)).await;
    let body = pod_review("uid-s", "team-a", false, SMALL_POD);
    let reply = exchange(
        &server,
        &post(
            "/inject/a-logs,c-secrets",
            "application/json",
            body.as_bytes(),
        ),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let patched = apply(SMALL_POD, &patch_of(&reply).expect("a patch"));
    let containers: Vec<&str> = patched["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(containers, ["app", "shipper"]);
    // c-secrets selects pods labelled secrets=on: decided here, from the pod's labels.
    assert!(patched["spec"].get("initContainers").is_none());
    assert_eq!(
        server
            .metrics
            .admission("a-logs")
            .requests(Outcome::Injected),
        1
    );
    let secrets = server.metrics.admission("c-secrets");
    assert_eq!(secrets.requests(Outcome::Skipped), 1);
    assert_eq!(secrets.skips(SkipReason::ObjectNotSelected), 1);
    let seen: Vec<String> = recorder
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.0.clone())
        .collect();
    assert_eq!(seen, ["a-logs"]);
}

#[tokio::test]
async fn in_a_shared_ignore_entry_a_failing_policy_is_left_out_with_a_warning() {
    let server = Running::start_with(config(), shared_store(), None).await;
    let body = pod_review("uid-i", "team-a", false, SMALL_POD);
    let reply = exchange(
        &server,
        &post(
            "/inject/a-logs,b-broken",
            "application/json",
            body.as_bytes(),
        ),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    let warnings: Vec<&str> = v["response"]["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("b-broken") && w.contains("did not inject")),
        "{warnings:?}"
    );
    let patched = apply(SMALL_POD, &patch_of(&reply).expect("a patch"));
    assert_eq!(patched["spec"]["containers"][1]["name"], "shipper");
    assert_eq!(
        server
            .metrics
            .admission("b-broken")
            .requests(Outcome::Error),
        1
    );
}

#[tokio::test]
async fn a_failing_policy_that_asks_for_fail_fails_the_shared_call() {
    let server = Running::start_with(config(), shared_store(), None).await;
    let body = pod_review("uid-f", "team-a", false, SMALL_POD);
    let reply = exchange(
        &server,
        &post(
            "/inject/a-logs,d-strict",
            "application/json",
            body.as_bytes(),
        ),
    )
    .await;
    assert_eq!(reply.status, 500, "{}", reply.text());
    assert!(reply.text().contains("d-strict"), "{}", reply.text());
    assert_eq!(
        server
            .metrics
            .admission("d-strict")
            .requests(Outcome::Error),
        1
    );
}

#[tokio::test]
async fn a_shared_entry_naming_an_unknown_policy_still_injects_the_known_ones() {
    let mut config = config();
    config.cache_wait = Some(std::time::Duration::from_millis(50));
    let server = Running::start_with(config, shared_store(), None).await;
    let body = pod_review("uid-u", "team-a", false, SMALL_POD);
    let reply = exchange(
        &server,
        &post("/inject/a-logs,gone", "application/json", body.as_bytes()),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let warnings = reply.json()["response"]["warnings"].to_string();
    assert!(
        warnings.contains("no InjectionPolicy") && warnings.contains("gone"),
        "{warnings}"
    );
    let patched = apply(SMALL_POD, &patch_of(&reply).expect("a patch"));
    assert_eq!(patched["spec"]["containers"][1]["name"], "shipper");
    for bad in ["/inject/a-logs,,c-secrets", "/inject/,a-logs"] {
        let reply = exchange(&server, &post(bad, "application/json", body.as_bytes())).await;
        assert_eq!(reply.status, 404, "{bad}: {}", reply.text());
    }
}

#[tokio::test]
async fn a_call_answered_after_the_api_servers_timeout_is_counted_for_each_policy_it_named() {
    let mut config = config();
    config.cache_wait = Some(std::time::Duration::from_millis(300));
    let server = Running::start_with(config, shared_store(), None).await;
    let body = pod_review("uid-t", "team-a", false, SMALL_POD);
    // In time: the API server would wait 10 s.
    let prompt = exchange(
        &server,
        &post(
            "/inject/a-logs?timeout=10s",
            "application/json",
            body.as_bytes(),
        ),
    )
    .await;
    assert_eq!(prompt.status, 200, "{}", prompt.text());
    assert_eq!(server.metrics.admission("a-logs").overdues(), 0);
    // Waiting 300 ms for a policy this replica does not know outlives a 100 ms timeout.
    let late = exchange(
        &server,
        &post(
            "/inject/a-logs,gone?timeout=100ms",
            "application/json",
            body.as_bytes(),
        ),
    )
    .await;
    assert_eq!(late.status, 200, "{}", late.text());
    assert_eq!(server.metrics.admission("a-logs").overdues(), 1);
    assert_eq!(
        server
            .metrics
            .admission(splice_server::server::UNKNOWN_POLICY_LABEL)
            .overdues(),
        1
    );
    let text = splice_server::metrics::render(&server.registry);
    assert!(
        text.contains(r#"splice_admission_over_timeout_total{policy="a-logs"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn a_pod_whose_override_fails_its_rule_is_denied_even_under_ignore_naming_the_annotation() {
    let guarded = policy_yaml(
        "cpu",
        "Ignore",
        "  overrides:\n    - {name: cpu, annotation: mesh.example/cpu, type: quantity, default: 100m, \
         rule: \"quantity(self).isLessThan(quantity('1'))\", message: at most 1 CPU}\n  \
         template:\n    containers: [{name: proxy, image: proxy:1, \
         resources: {requests: {cpu: '{{ overrides.cpu }}'}}}]",
    );
    let logs = policy_yaml(
        "logs",
        "Ignore",
        "  template:\n    containers: [{name: shipper, image: shipper:1}]",
    );
    let server = Running::start_with(config(), store_with(&[&guarded, &logs]), None).await;
    let pod = r#"{"kind":"Pod","metadata":{"name":"x","annotations":{"mesh.example/cpu":"2"}},"spec":{"containers":[{"name":"app","image":"app:1"}]}}"#;
    let body = pod_review("u-deny", "shop", false, pod);
    let reply = exchange(
        &server,
        &post("/inject/logs/cpu", "application/json", body.as_bytes()),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    assert_eq!(v["response"]["allowed"], false, "{v}");
    assert_eq!(v["response"]["status"]["code"], 422);
    let message = v["response"]["status"]["message"].as_str().unwrap();
    for part in ["cpu", "mesh.example/cpu", "\"2\"", "at most 1 CPU"] {
        assert!(message.contains(part), "{message:?} lacks {part:?}");
    }
    assert!(v["response"].get("patch").is_none(), "{v}");
    assert_eq!(server.metrics.admission("cpu").requests(Outcome::Denied), 1);

    let fine = pod.replace("\"2\"", "\"250m\"");
    let body = pod_review("u-ok", "shop", false, &fine);
    let reply = exchange(
        &server,
        &post("/inject/cpu", "application/json", body.as_bytes()),
    )
    .await;
    let patched = apply(&fine, &patch_of(&reply).expect("a patch"));
    assert_eq!(
        patched["spec"]["containers"][1]["resources"]["requests"]["cpu"],
        "250m"
    );
}

#[tokio::test]
async fn an_override_annotation_that_is_not_utf8_gets_a_4xx_naming_the_problem() {
    let guarded = policy_yaml(
        "cpu",
        "Ignore",
        "  overrides:\n    - {name: cpu, annotation: mesh.example/cpu, type: quantity, default: 100m}\n  \
         template:\n    containers: [{name: proxy, image: proxy:1}]",
    );
    let server = Running::start_with(config(), store_with(&[&guarded]), None).await;
    let pod = r#"{"kind":"Pod","metadata":{"name":"x","annotations":{"mesh.example/cpu":"NOTUTF8"}},"spec":{"containers":[{"name":"app","image":"app:1"}]}}"#;
    let mut body = pod_review("u-bytes", "shop", false, pod).into_bytes();
    let at = body
        .windows(7)
        .position(|w| w == b"NOTUTF8")
        .expect("the marker");
    body.splice(at..at + 7, [0xff, 0xfe, b'1']);
    let reply = exchange(&server, &post("/inject/cpu", "application/json", &body)).await;
    assert!(
        (400..500).contains(&reply.status),
        "{} {}",
        reply.status,
        reply.text()
    );
    assert!(reply.text().contains("UTF-8"), "{}", reply.text());
}

#[tokio::test]
async fn a_canary_entry_serves_the_revision_stored_under_the_canary_key_and_counts_under_the_policy()
 {
    let promoted = policy_yaml(
        "mesh",
        "Ignore",
        "  template:\n    containers: [{name: proxy, image: proxy:1}]",
    );
    let in_force = promoted.replace("proxy:1", "proxy:2");
    let store = store_with(&[&promoted]);
    let (_, canary) = compile(&in_force);
    store.insert(splice_engine::entry::canary_key("mesh"), canary);
    let server = Running::start_with(config(), store, None).await;
    let pod = r#"{"kind":"Pod","metadata":{"name":"x"},"spec":{"containers":[{"name":"app","image":"app:1"}]}}"#;
    async fn image_at(server: &Running, pod: &str, path: &str, uid: &str) -> serde_json::Value {
        let body = pod_review(uid, "shop", false, pod);
        let reply = exchange(server, &post(path, "application/json", body.as_bytes())).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.text());
        let patched = apply(pod, &patch_of(&reply).expect("a patch"));
        patched["spec"]["containers"][1]["image"].clone()
    }
    let canary_path = splice_engine::entry::canary_path("mesh");
    assert_eq!(
        image_at(&server, pod, &canary_path, "u-canary").await,
        "proxy:2"
    );
    assert_eq!(
        image_at(&server, pod, "/inject/mesh", "u-stable").await,
        "proxy:1"
    );
    assert_eq!(
        server.metrics.admission("mesh").requests(Outcome::Injected),
        2
    );
}
