//! The webhook's chain with its cache (`inject_in_order_kept`): a request equal to an earlier one
//! but for `metadata.managedFields` gets the earlier answer, byte for byte what the chain would
//! plan; anything else that could change the answer is planned afresh.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod engine_common;

use std::sync::Arc;

use engine_common::{exclusions, ns, policy};
use serde_json::{Value, json};
use splice_crds::Operation;
use splice_engine::{
    ChainCache, Chained, CompiledPolicy, NamespaceContext, Pod, PodRequest, Selection,
    inject_in_order, inject_in_order_kept,
};

fn named(name: &str, body: &str) -> Arc<CompiledPolicy> {
    Arc::new(policy(&format!(
        "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {{name: {name}}}\nspec:\n{body}"
    )))
}

fn sidecar(name: &str) -> Arc<CompiledPolicy> {
    named(
        name,
        &format!(
            "  template:\n    containers: [{{name: {name}, image: '{name}:{{{{ namespace.name }}}}'}}]"
        ),
    )
}

/// A pod as a ReplicaSet's reach admission: `generateName`, and managedFields stamped `time`.
fn pod(time: &str, labels: Value) -> String {
    serde_json::to_string(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": "web-", "namespace": "shop", "labels": labels,
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                               "apiVersion": "v1", "time": time, "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:metadata": {}}}]
        },
        "spec": {"containers": [{"name": "app", "image": "app:1"}]}
    }))
    .unwrap()
}

fn run(
    cache: Option<&ChainCache>,
    policies: &[&Arc<CompiledPolicy>],
    text: &str,
    namespace: &NamespaceContext,
) -> Chained {
    let object = Pod::parse(text).unwrap();
    let ex = exclusions();
    let request = PodRequest {
        operation: Operation::Create,
        object: &object,
        namespace,
        exclusions: &ex,
        trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN,
        selection: Selection::Evaluate,
    };
    match cache {
        Some(cache) => inject_in_order_kept(cache, policies, &request),
        None => {
            let refs: Vec<&CompiledPolicy> = policies.iter().map(|p| &***p).collect();
            inject_in_order(&refs, &request)
        }
    }
}

/// The same answer, and whether it is the kept one (the patch shares the earlier one's buffer).
fn same(a: &Chained, b: &Chained) -> bool {
    assert_eq!(a.whole.patch, b.whole.patch);
    assert_eq!(a.whole.warnings, b.whole.warnings);
    assert_eq!(a.whole.changed, b.whole.changed);
    a.whole.patch.as_ptr() == b.whole.patch.as_ptr()
}

#[test]
fn a_pod_differing_only_in_managed_fields_gets_the_kept_answer_equal_to_a_fresh_plan() {
    let (a, b) = (sidecar("a-mesh"), sidecar("b-logs"));
    let cache = ChainCache::default();
    let shop = ns("shop");
    let first = run(
        Some(&cache),
        &[&a, &b],
        &pod("2026-12-07T10:00:00Z", json!({"app": "web"})),
        &shop,
    );
    assert!(first.whole.changed);
    let later = pod("2026-12-07T10:00:01Z", json!({"app": "web"}));
    let kept = run(Some(&cache), &[&a, &b], &later, &shop);
    assert!(same(&first, &kept), "the second pod was planned again");
    let fresh = run(None, &[&a, &b], &later, &shop);
    assert!(!same(&kept, &fresh));
    assert_eq!(kept.decisions.len(), 2);
    assert!(kept.decisions.iter().all(Result::is_ok));
}

#[test]
fn a_pod_a_policy_or_a_namespace_that_differs_is_planned_afresh() {
    let (a, b) = (sidecar("a-mesh"), sidecar("b-logs"));
    let cache = ChainCache::default();
    let shop = ns("shop");
    let text = pod("2026-12-07T10:00:00Z", json!({"app": "web"}));
    let first = run(Some(&cache), &[&a, &b], &text, &shop);

    let relabelled = pod("2026-12-07T10:00:00Z", json!({"app": "api"}));
    assert!(!same(
        &first,
        &run(Some(&cache), &[&a, &b], &relabelled, &shop)
    ));

    let other_order = run(Some(&cache), &[&b, &a], &text, &shop);
    assert!(
        !first.whole.patch.is_empty()
            && other_order.whole.patch.as_ptr() != first.whole.patch.as_ptr()
    );

    // The same policy compiled again (a new generation or valuesFrom data): a new answer.
    let a_again = sidecar("a-mesh");
    assert!(!same(
        &first,
        &run(Some(&cache), &[&a_again, &b], &text, &shop)
    ));

    let mut labelled = ns("shop");
    labelled.labels.insert("team".into(), "x".into());
    assert!(!same(
        &first,
        &run(Some(&cache), &[&a, &b], &text, &labelled)
    ));

    // Another namespace renders another image.
    let other = run(Some(&cache), &[&a, &b], &text, &ns("bank"));
    assert_ne!(other.whole.patch, first.whole.patch);

    // And the original request still gets its kept answer.
    assert!(same(&first, &run(Some(&cache), &[&a, &b], &text, &shop)));
}

#[test]
fn a_policy_that_reads_the_pod_keeps_answers_only_for_a_byte_identical_pod() {
    let reads = named(
        "a-mesh",
        "  template:\n    containers: [{name: a-mesh, image: 'mesh:1', args: ['{{ pod.metadata.generateName }}']}]",
    );
    let b = sidecar("b-logs");
    let cache = ChainCache::default();
    let shop = ns("shop");
    let text = pod("2026-12-07T10:00:00Z", json!({"app": "web"}));
    let first = run(Some(&cache), &[&reads, &b], &text, &shop);
    assert!(same(
        &first,
        &run(Some(&cache), &[&reads, &b], &text, &shop)
    ));
    let later = pod("2026-12-07T10:00:01Z", json!({"app": "web"}));
    assert!(!same(
        &first,
        &run(Some(&cache), &[&reads, &b], &later, &shop)
    ));
}

#[test]
fn a_failed_chain_is_not_kept() {
    let broken = named(
        "a-broken",
        "  template:\n    containers: [{name: x, image: '{{ pod.metadata.labels.missing }}'}]",
    );
    let b = sidecar("b-logs");
    let cache = ChainCache::default();
    let shop = ns("shop");
    let text = pod("2026-12-07T10:00:00Z", json!({"app": "web"}));
    let first = run(Some(&cache), &[&broken, &b], &text, &shop);
    assert!(first.decisions[0].is_err(), "{:?}", first.decisions[0]);
    let again = run(Some(&cache), &[&broken, &b], &text, &shop);
    assert!(!same(&first, &again));
    assert!(again.decisions[0].is_err());
}

#[test]
fn a_kept_answer_does_not_keep_a_replaced_policy_alive() {
    let (a, b) = (sidecar("a-mesh"), sidecar("b-logs"));
    let cache = ChainCache::default();
    let text = pod("2026-12-07T10:00:00Z", json!({"app": "web"}));
    run(Some(&cache), &[&a, &b], &text, &ns("shop"));
    let watched = Arc::downgrade(&a);
    drop(a);
    assert!(
        watched.upgrade().is_none(),
        "the cache holds the policy (and its caches)"
    );
}

/// A pod as the API server hands it to webhooks: the ServiceAccount plugin's token volume, named
/// `kube-api-access-<suffix>`, mounted into its container.
fn pod_with_token(suffix: &str) -> String {
    let token = format!("kube-api-access-{suffix}");
    serde_json::to_string(&json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "web-", "namespace": "shop", "labels": {"app": "web"}},
        "spec": {
            "serviceAccountName": "default",
            "containers": [{"name": "app", "image": "app:1", "volumeMounts": [
                {"name": token, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                 "readOnly": true}]}],
            "volumes": [{"name": token, "projected": {"sources": [{"serviceAccountToken":
                {"path": "token", "expirationSeconds": 3607}}]}}]
        }
    }))
    .unwrap()
}

#[test]
fn pods_differing_only_in_their_token_volume_share_an_answer_with_the_name_replaced() {
    let (a, b) = (sidecar("a-mesh"), sidecar("b-logs"));
    let cache = ChainCache::default();
    let shop = ns("shop");
    let first = run(Some(&cache), &[&a, &b], &pod_with_token("abcde"), &shop);
    assert!(String::from_utf8_lossy(&first.whole.patch).contains("kube-api-access-abcde"));
    let second_pod = pod_with_token("vwxyz");
    let kept = run(Some(&cache), &[&a, &b], &second_pod, &shop);
    let fresh = run(None, &[&a, &b], &second_pod, &shop);
    assert_eq!(
        kept.whole.patch, fresh.whole.patch,
        "the kept answer is the one the chain plans"
    );
    assert_eq!(kept.whole.warnings, fresh.whole.warnings);
    let text = String::from_utf8_lossy(&kept.whole.patch);
    assert!(
        text.contains("kube-api-access-vwxyz") && !text.contains("abcde"),
        "{text}"
    );
    // The same pod again: the answer kept for it, as it was.
    let again = run(Some(&cache), &[&a, &b], &pod_with_token("abcde"), &shop);
    assert!(same(&first, &again));
}

#[test]
fn a_policy_whose_spec_names_a_token_volume_gets_no_answer_planned_for_another_token() {
    // The template mounts the first pod's token volume by name: for that pod it is the pod's
    // own volume, for the second one a volume the pod lacks. Each gets what the chain plans.
    let named_mount = named(
        "a-mesh",
        "  template:\n    containers: [{name: a-mesh, image: 'mesh:1', volumeMounts: \
         [{name: kube-api-access-abcde, mountPath: /token}]}]",
    );
    let b = sidecar("b-logs");
    let cache = ChainCache::default();
    let shop = ns("shop");
    run(
        Some(&cache),
        &[&named_mount, &b],
        &pod_with_token("abcde"),
        &shop,
    );
    let second_pod = pod_with_token("vwxyz");
    let kept = run(Some(&cache), &[&named_mount, &b], &second_pod, &shop);
    let fresh = run(None, &[&named_mount, &b], &second_pod, &shop);
    assert_eq!(kept.whole.patch, fresh.whole.patch);
    assert_eq!(kept.decisions.len(), fresh.decisions.len());
}
