//! Policies admitted in one call through `inject_in_order`: the same pod as calling each policy in
//! turn, one provenance write, failures confined to the failing policy.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod engine_common;

use engine_common::{apply, exclusions, ns, policy};
use serde_json::{Value, json};
use splice_crds::{Operation, STATUS_ANNOTATION};
use splice_engine::{
    CompiledPolicy, Decision, Pod, PodRequest, Selection, SkipReason, inject_in_order,
};

fn named(name: &str, body: &str) -> CompiledPolicy {
    policy(&format!(
        "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {{name: {name}}}\nspec:\n{body}"
    ))
}

fn mesh() -> CompiledPolicy {
    named(
        "a-mesh",
        "  template:
    initContainers: [{name: mesh-init, image: init:1}]
    containers: [{name: proxy, image: proxy:1}]
    volumes: [{name: certs, emptyDir: {}}]
    volumeMounts: [{name: certs, mountPath: /certs}]
    annotations: {mesh.example/enabled: 'true'}",
    )
}

fn logs() -> CompiledPolicy {
    named(
        "b-logs",
        "  template:
    containers: [{name: shipper, image: 'shipper:{{ namespace.name }}'}]
    env: [{name: LOG_FORMAT, value: json}]
    labels: {logs.example/shipped: 'yes'}
    annotations: {logs.example/format: json}",
    )
}

fn secrets() -> CompiledPolicy {
    named(
        "c-secrets",
        "  objectSelector: {matchLabels: {secrets: 'on'}}
  template:
    initContainers: [{name: secrets-init, image: vault:1}]",
    )
}

fn pod(labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "web-", "namespace": "shop", "labels": labels},
        "spec": {
            "initContainers": [{"name": "migrate", "image": "app:1"}],
            "containers": [{"name": "app", "image": "app:1"}]
        }
    })
}

fn chain(
    policies: &[&CompiledPolicy],
    pod: &Value,
    selection: Selection,
) -> (splice_engine::Chained, Value) {
    let text = serde_json::to_string(pod).unwrap();
    let object = Pod::parse(&text).unwrap();
    let ex = exclusions();
    let namespace = ns("shop");
    let chained = inject_in_order(
        policies,
        &PodRequest {
            operation: Operation::Create,
            object: &object,
            namespace: &namespace,
            exclusions: &ex,
            trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN,
            selection,
        },
    );
    let ops: json_patch::Patch = serde_json::from_slice(&chained.whole.patch).unwrap();
    let mut doc = pod.clone();
    json_patch::patch(&mut doc, &ops).unwrap();
    (chained, doc)
}

fn status_writes(patch: &[u8]) -> usize {
    let ops: Vec<Value> = serde_json::from_slice(patch).unwrap();
    ops.iter()
        .filter(|op| {
            let path = op["path"].as_str().unwrap();
            path == "/metadata/annotations/splice.dev~1status"
                || (path == "/metadata/annotations" && op["value"].get(STATUS_ANNOTATION).is_some())
        })
        .count()
}

#[test]
fn one_call_gives_the_pod_that_calling_each_policy_in_turn_gives() {
    let (mesh, logs, secrets) = (mesh(), logs(), secrets());
    let original = pod(json!({"app": "web", "secrets": "on"}));
    let (chained, once) = chain(&[&mesh, &logs, &secrets], &original, Selection::Evaluate);
    assert!(chained.whole.changed);

    let mut in_turn = original.clone();
    for p in [&mesh, &logs, &secrets] {
        in_turn = apply(p, Operation::Create, &in_turn, &ns("shop")).1;
    }
    assert_eq!(once, in_turn);
    let names = |list: &str| -> Vec<String> {
        once["spec"][list]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        names("initContainers"),
        ["mesh-init", "secrets-init", "migrate"]
    );
    assert_eq!(names("containers"), ["app", "proxy", "shipper"]);
}

#[test]
fn the_provenance_annotation_is_written_once_with_every_policy_in_it() {
    let (mesh, logs, secrets) = (mesh(), logs(), secrets());
    let (chained, once) = chain(
        &[&mesh, &logs, &secrets],
        &pod(json!({"secrets": "on"})),
        Selection::Evaluate,
    );
    assert_eq!(
        status_writes(&chained.whole.patch),
        1,
        "{}",
        String::from_utf8_lossy(&chained.whole.patch)
    );
    let status: Value = serde_json::from_str(
        once["metadata"]["annotations"][STATUS_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let recorded: Vec<&String> = status.as_object().unwrap().keys().collect();
    assert_eq!(recorded, ["a-mesh", "b-logs", "c-secrets"]);
    // The policies' own annotations are all there beside it.
    assert_eq!(
        once["metadata"]["annotations"]["mesh.example/enabled"],
        "true"
    );
    assert_eq!(
        once["metadata"]["annotations"]["logs.example/format"],
        "json"
    );
}

#[test]
fn a_chain_run_again_on_its_own_output_changes_nothing() {
    let (mesh, logs, secrets) = (mesh(), logs(), secrets());
    let policies = [&mesh, &logs, &secrets];
    let (_, once) = chain(
        &policies,
        &pod(json!({"secrets": "on"})),
        Selection::Evaluate,
    );
    let (again, twice) = chain(&policies, &once, Selection::Evaluate);
    assert!(
        !again.whole.changed,
        "{}",
        String::from_utf8_lossy(&again.whole.patch)
    );
    assert_eq!(&again.whole.patch[..], b"[]");
    assert_eq!(once, twice);
}

#[test]
fn a_policy_that_fails_leaves_the_others_to_inject() {
    let broken = named(
        "b-broken",
        "  template:\n    containers: [{name: x, image: '{{ pod.metadata.labels.missing }}'}]",
    );
    let (mesh, secrets) = (mesh(), secrets());
    let (chained, once) = chain(
        &[&mesh, &broken, &secrets],
        &pod(json!({"secrets": "on"})),
        Selection::Evaluate,
    );
    assert!(matches!(chained.decisions[0], Ok(Decision::Inject(_))));
    assert!(chained.decisions[1].is_err(), "{:?}", chained.decisions[1]);
    assert!(matches!(chained.decisions[2], Ok(Decision::Inject(_))));
    let containers = once["spec"]["initContainers"].as_array().unwrap();
    assert_eq!(containers.len(), 3);
    assert!(
        once["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["name"] != "x")
    );
}

#[test]
fn in_a_shared_call_each_object_selector_is_decided_from_the_pods_labels() {
    let (mesh, secrets) = (mesh(), secrets());
    // The namespace selector is the API server's: a policy selecting another namespace still
    // injects, since the shared entry's namespace selector already matched.
    let elsewhere = named(
        "d-elsewhere",
        "  namespaceSelector: {matchLabels: {team: other}}\n  template:\n    labels: {seen: 'yes'}",
    );
    let (chained, once) = chain(
        &[&mesh, &secrets, &elsewhere],
        &pod(json!({"secrets": "off"})),
        Selection::NamespaceByApiServer,
    );
    assert!(matches!(
        chained.decisions[1],
        Ok(Decision::Skip(SkipReason::ObjectNotSelected))
    ));
    assert!(matches!(chained.decisions[2], Ok(Decision::Inject(_))));
    assert_eq!(once["metadata"]["labels"]["seen"], "yes");
    assert_eq!(once["spec"]["initContainers"].as_array().unwrap().len(), 2);
}

#[test]
fn a_single_policy_answers_with_its_own_patch() {
    let mesh = mesh();
    let original = pod(json!({}));
    let (chained, once) = chain(&[&mesh], &original, Selection::Evaluate);
    let (alone, by_itself) = apply(&mesh, Operation::Create, &original, &ns("shop"));
    assert_eq!(chained.whole.patch, alone.patch);
    assert_eq!(once, by_itself);
}

/// A pod as it reaches webhooks: the ServiceAccount plugin has added its token volume and mounted
/// it in the pod's own containers.
fn pod_with_token() -> Value {
    let mount = json!({"name": "kube-api-access-x7k2p", "readOnly": true,
                       "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"});
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {
            "containers": [{"name": "app", "image": "app:1", "volumeMounts": [mount]}],
            "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"sources": []}}]
        }
    })
}

fn token_mounts(container: &Value) -> usize {
    container["volumeMounts"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount")
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn injected_containers_get_the_token_mount_the_service_account_plugin_would_add() {
    let (mesh, logs) = (mesh(), logs());
    let (_, once) = chain(&[&mesh, &logs], &pod_with_token(), Selection::Evaluate);
    for list in ["initContainers", "containers"] {
        for c in once["spec"][list].as_array().unwrap() {
            assert_eq!(token_mounts(c), 1, "{list}: {c}");
            let last = c["volumeMounts"].as_array().unwrap().last().unwrap();
            if c["name"] != "app" {
                assert_eq!(last["name"], "kube-api-access-x7k2p", "appended last: {c}");
                assert_eq!(last["readOnly"], true);
            }
        }
    }
    // The ServiceAccount plugin, run again, would change nothing; neither would the policies.
    let (again, _) = chain(&[&mesh, &logs], &once, Selection::Evaluate);
    assert!(
        !again.whole.changed,
        "{}",
        String::from_utf8_lossy(&again.whole.patch)
    );
}

#[test]
fn without_a_token_volume_or_with_a_mount_of_its_own_nothing_is_added() {
    let mesh = mesh();
    let (_, plain) = chain(&[&mesh], &pod(json!({})), Selection::Evaluate);
    assert!(
        plain["spec"]["containers"][1].get("volumeMounts").is_none(),
        "{plain}"
    );

    let own = named(
        "a-own",
        "  template:
    containers:
    - name: agent
      image: agent:1
      volumeMounts: [{name: creds, mountPath: /var/run/secrets/kubernetes.io/serviceaccount}]",
    );
    let (_, mounted) = chain(&[&own], &pod_with_token(), Selection::Evaluate);
    let agent = &mounted["spec"]["containers"][1];
    assert_eq!(token_mounts(agent), 1, "{agent}");
    assert_eq!(agent["volumeMounts"][0]["name"], "creds");
}
