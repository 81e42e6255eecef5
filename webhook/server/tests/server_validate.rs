//! The validating webhook route, `POST /validate`, driven in memory through the request handler:
//! what it refuses (with the field path), admits (with warnings), leaves alone, and counts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use splice_server::server::{Handler, VALIDATE_PATH};

fn review(operation: &str, object: Option<Value>) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "req-1",
            "kind": {"group": "splice.dev", "version": "v1alpha1", "kind": "InjectionPolicy"},
            "resource": {"group": "splice.dev", "version": "v1alpha1", "resource": "injectionpolicies"},
            "operation": operation,
            "name": "mesh",
            "object": object,
            "oldObject": null,
            "dryRun": true,
        }
    })
    .to_string()
}

fn policy(spec: Value) -> Value {
    json!({
        "apiVersion": "splice.dev/v1alpha1",
        "kind": "InjectionPolicy",
        "metadata": {"name": "mesh", "generation": 1},
        "spec": spec,
    })
}

async fn post(handler: &Handler, body: String) -> (u16, Vec<u8>) {
    let request = http::Request::builder()
        .method("POST")
        .uri(VALIDATE_PATH)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = handler.handle(request).await;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, body.to_vec())
}

async fn answer(handler: &Handler, body: String) -> Value {
    let (status, body) = post(handler, body).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["response"]["uid"], "req-1");
    v["response"].clone()
}

#[tokio::test]
async fn a_policy_with_an_undefined_value_is_denied_naming_the_field() {
    let handler = Handler::with_static_policies([]);
    let spec =
        json!({"template": {"containers": [{"name": "p", "image": "{{ values.missing }}"}]}});
    let r = answer(&handler, review("UPDATE", Some(policy(spec)))).await;
    assert_eq!(r["allowed"], false);
    let message = r["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("spec.template.containers[0].image"),
        "{message}"
    );
    assert!(message.contains("values.missing"), "{message}");
    assert_eq!(r["status"]["code"], 422);
}

#[tokio::test]
async fn privileged_content_without_allow_privileged_is_denied_naming_the_capability() {
    let handler = Handler::with_static_policies([]);
    let spec = json!({"template": {"initContainers": [{"name": "net", "image": "i",
        "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]}});
    let r = answer(&handler, review("CREATE", Some(policy(spec)))).await;
    assert_eq!(r["allowed"], false);
    let message = r["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("spec.template.initContainers[0].securityContext.capabilities.add[0]"),
        "{message}"
    );
    assert!(message.contains("allowPrivileged"), "{message}");
}

#[tokio::test]
async fn a_policy_reading_the_pod_name_is_allowed_with_a_warning() {
    let handler = Handler::with_static_policies([]);
    let spec = json!({"template": {"containers": [{"name": "p", "image": "i",
        "env": [{"name": "POD", "value": "{{ pod.metadata.name }}"}]}]}});
    let r = answer(&handler, review("CREATE", Some(policy(spec)))).await;
    assert_eq!(r["allowed"], true);
    assert!(r.get("patch").is_none());
    let warnings = r["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let w = warnings[0].as_str().unwrap();
    assert!(
        w.starts_with("spec.template.containers[0].env[0].value reads pod.metadata.name"),
        "{w}"
    );
}

#[tokio::test]
async fn a_delete_is_allowed_whatever_the_old_object() {
    let handler = Handler::with_static_policies([]);
    let r = answer(&handler, review("DELETE", None)).await;
    assert_eq!(r["allowed"], true);
    assert!(r.get("warnings").is_none());
}

#[tokio::test]
async fn a_malformed_review_or_a_create_without_object_is_a_400_with_a_reason() {
    let handler = Handler::with_static_policies([]);
    let (status, body) = post(&handler, "{\"apiVersion\":".to_owned()).await;
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("truncated"));
    let (status, body) = post(&handler, review("CREATE", None)).await;
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("request.object is missing"));
}

#[tokio::test]
async fn validations_are_counted_under_the_fixed_validate_label() {
    let mut registry = splice_server::metrics::Registry::default();
    let metrics = std::sync::Arc::new(splice_server::metrics::Metrics::register(&mut registry));
    let handler = Handler::new(
        splice_server::server::WebhookConfig::new("splice-system"),
        std::sync::Arc::new(splice_server::store::PolicyStore::new()),
        std::sync::Arc::new(splice_server::store::NamespaceStore::new()),
        std::sync::Arc::clone(&metrics),
        None,
    );
    let bad = json!({"template": {"labels": {"a": "{{ nope }}"}}});
    answer(&handler, review("CREATE", Some(policy(bad)))).await;
    answer(&handler, review("CREATE", Some(policy(json!({}))))).await;
    let text = splice_server::metrics::render(&registry);
    assert!(
        text.contains(r#"splice_admission_requests_total{policy="_validate",outcome="denied"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"splice_admission_requests_total{policy="_validate",outcome="allowed"} 1"#),
        "{text}"
    );
}
