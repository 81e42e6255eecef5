//! The reconciler against a fake API server (kube's tower-test mock): which requests one
//! reconcile makes, so "steady state makes no writes" is checked without a cluster.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Client;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::{reflector, watcher};
use serde_json::{Value, json};
use splice_crds::{InjectionPolicy, InjectionPolicySpec, InjectionPolicyStatus, Operation};
use splice_engine::CompiledPolicy;
use tokio::sync::watch;
use tower_test::mock;

use super::error::Error;
use super::reconcile::reconcile;
use crate::Context;
use crate::context::ContextParts;
use crate::leader::Leadership;

const MWC_PATH: &str =
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/splice-p";
const STATUS_PATH: &str = "/apis/splice.dev/v1alpha1/injectionpolicies/p/status";
const MAP_PATH: &str = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies/splice-p";
const BINDING_PATH: &str =
    "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings/splice-p";

/// What the fake API server holds and saw.
#[derive(Default)]
struct FakeApi {
    configuration: Option<Value>,
    /// The in-tree objects, by path.
    in_tree: std::collections::BTreeMap<String, Value>,
    status_writes: Vec<Value>,
    /// (method, path) of every request, in order.
    requests: Vec<(Method, String)>,
    /// The template hash a dry-run pod comes back injected with (`None`: uninjected).
    injects: Option<String>,
    /// The query of every dry-run pod create.
    dry_runs: Vec<String>,
}

type Shared = Arc<Mutex<FakeApi>>;

fn respond(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Body::from(serde_json::to_vec(body).unwrap_or_default()))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn not_found() -> Response<Body> {
    respond(
        StatusCode::NOT_FOUND,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

/// Serves the few requests a reconcile makes, recording each.
fn fake_api(state: Shared) -> Client {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        let mut handle = std::pin::pin!(handle);
        while let Some((request, send)) = handle.next_request().await {
            let method = request.method().clone();
            let path = request.uri().path().to_owned();
            let query = request.uri().query().unwrap_or_default().to_owned();
            let body = request
                .into_body()
                .collect_bytes()
                .await
                .unwrap_or_default();
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let mut api = state.lock().unwrap();
            api.requests.push((method.clone(), path.clone()));
            let response = match (method, path.as_str()) {
                (Method::GET, MWC_PATH) => match &api.configuration {
                    Some(c) => respond(StatusCode::OK, c),
                    None => not_found(),
                },
                (Method::PATCH, MWC_PATH) => {
                    let mut stored = body.clone();
                    stored["metadata"]["uid"] = json!("mwc-uid");
                    // What the API server adds: defaults and bookkeeping.
                    stored["metadata"]["resourceVersion"] = json!("7");
                    stored["webhooks"][0]["rules"][0]["scope"] = json!("Namespaced");
                    api.configuration = Some(stored.clone());
                    respond(StatusCode::OK, &stored)
                }
                (Method::PATCH, STATUS_PATH) => {
                    api.status_writes.push(body["status"].clone());
                    let mut policy = serde_json::to_value(policy()).unwrap_or_default();
                    policy["status"] = body["status"].clone();
                    policy["metadata"]["resourceVersion"] = json!("2");
                    respond(StatusCode::OK, &policy)
                }
                (Method::POST, p) if p.ends_with("/events") => respond(StatusCode::CREATED, &body),
                (Method::POST, p) if p.ends_with("/pods") => {
                    api.dry_runs.push(query.clone());
                    let mut pod = body.clone();
                    if let Some(hash) = &api.injects {
                        pod["metadata"]["annotations"]["splice.dev/status"] =
                            json!(json!({"p": {"hash": hash}}).to_string());
                    }
                    respond(StatusCode::CREATED, &pod)
                }
                (Method::GET, p @ (MAP_PATH | BINDING_PATH)) => match api.in_tree.get(p) {
                    Some(o) => respond(StatusCode::OK, o),
                    None => not_found(),
                },
                (Method::PATCH, p @ (MAP_PATH | BINDING_PATH)) => {
                    let mut stored = body.clone();
                    stored["metadata"]["uid"] = json!("in-tree-uid");
                    stored["metadata"]["creationTimestamp"] = json!("2020-01-01T00:00:00Z");
                    api.in_tree.insert(p.to_owned(), stored.clone());
                    respond(StatusCode::OK, &stored)
                }
                (Method::DELETE, MWC_PATH) => {
                    api.configuration = None;
                    respond(
                        StatusCode::OK,
                        &json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                    )
                }
                _ => not_found(),
            };
            drop(api);
            send.send_response(response);
        }
    });
    Client::new(service, "default")
}

fn policy() -> InjectionPolicy {
    let spec: InjectionPolicySpec = serde_json::from_value(json!({
        "mode": "Webhook",
        "namespaceSelector": {"matchLabels": {"mesh": "on"}},
        "template": {"containers": [{"name": "proxy", "image": "registry.invalid/proxy:1"}]}
    }))
    .unwrap();
    let mut p = InjectionPolicy::new("p", spec);
    p.metadata.uid = Some("policy-uid".into());
    p.metadata.generation = Some(1);
    p.metadata.resource_version = Some("1".into());
    p
}

fn context(client: Client, leading: bool, policies: &[InjectionPolicy]) -> Arc<Context> {
    context_with(client, leading, policies, &[("apps", "on")])
}

/// A context whose leader has listed these namespaces, each with its `mesh` label.
fn context_with(
    client: Client,
    leading: bool,
    policies: &[InjectionPolicy],
    namespaces: &[(&str, &str)],
) -> Arc<Context> {
    let settings = crate::context::tests::settings();
    let (store, mut writer) = reflector::store();
    for p in policies {
        writer.apply_watcher_event(&watcher::Event::Apply(p.clone()));
    }
    let (_ca_tx, ca) = watch::channel(Some(Arc::new("-----BEGIN CERTIFICATE-----\n".to_owned())));
    // The senders may go: a receiver keeps the last value.
    let namespaces = Arc::new(Mutex::new(crate::view::Namespaces {
        contexts: namespaces
            .iter()
            .map(|(name, mesh)| {
                let context = splice_engine::NamespaceContext {
                    name: (*name).to_owned(),
                    labels: [("mesh".to_owned(), (*mesh).to_owned())].into(),
                    ..Default::default()
                };
                ((*name).to_owned(), context)
            })
            .collect(),
        synced: true,
        generation: 1,
    }));
    let parts = ContextParts::for_tests(
        client,
        &settings,
        store,
        ca,
        Leadership::fixed(leading),
        namespaces,
    );
    Arc::new(Context::new(&settings, parts))
}

/// Every request but reads and dry-run pod creates (the evidence of enforcement, which stores
/// nothing; `FakeApi::dry_runs` checks they are dry runs).
fn writes(api: &Shared) -> Vec<(Method, String)> {
    api.lock()
        .unwrap()
        .requests
        .iter()
        .filter(|(m, p)| *m != Method::GET && !(*m == Method::POST && p.ends_with("/pods")))
        .cloned()
        .collect()
}

fn clear(api: &Shared) {
    api.lock().unwrap().requests.clear();
}

/// The policy as the watch would deliver it after the status write.
fn with_written_status(api: &Shared) -> InjectionPolicy {
    let status: InjectionPolicyStatus =
        serde_json::from_value(api.lock().unwrap().status_writes.last().cloned().unwrap()).unwrap();
    let mut p = policy();
    p.status = Some(status);
    p.metadata.resource_version = Some("2".into());
    p
}

fn ready(status: &Value) -> Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Reconciles `policy` as the watch delivers it after each status write, until Ready is True
/// (at most 4 times, a second apart at most); returns the actions.
async fn until_ready(api: &Shared, ctx: &Arc<Context>, first: InjectionPolicy) -> Vec<Action> {
    let mut actions = vec![reconcile(Arc::new(first), Arc::clone(ctx)).await.unwrap()];
    for _ in 0..4 {
        let last = api.lock().unwrap().status_writes.last().cloned().unwrap();
        if ready(&last)["status"] == "True" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let current = with_written_status(api);
        actions.push(reconcile(Arc::new(current), Arc::clone(ctx)).await.unwrap());
    }
    actions
}

/// Reconciles `first`, then it as the watch delivers it after each status write, every 500 ms
/// (at most 10 times) until Ready is True; returns the last status written.
async fn settle(api: &Shared, ctx: &Arc<Context>, first: InjectionPolicy) -> Value {
    let mut current = first.clone();
    let mut status = Value::Null;
    for _ in 0..10 {
        reconcile(Arc::new(current), Arc::clone(ctx)).await.unwrap();
        status = api.lock().unwrap().status_writes.last().cloned().unwrap();
        if ready(&status)["status"] == "True" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        current = with_written_status(api);
        current.spec = first.spec.clone();
    }
    status
}

#[tokio::test]
async fn a_new_policy_is_ready_once_a_dry_run_pod_comes_back_injected_then_costs_one_read() {
    let api = Shared::default();
    let client = fake_api(Arc::clone(&api));
    let ctx = context(client, true, &[policy()]);
    let hash = CompiledPolicy::compile("p", 1, &policy().spec)
        .unwrap()
        .template_hash()
        .to_owned();
    api.lock().unwrap().injects = Some(hash.clone());

    let actions = until_ready(&api, &ctx, policy()).await;
    let requests = api.lock().unwrap().requests.clone();
    let write = requests
        .iter()
        .position(|(m, p)| *m == Method::PATCH && p == MWC_PATH);
    let look = requests
        .iter()
        .position(|(m, p)| *m == Method::POST && p == "/api/v1/namespaces/apps/pods");
    assert!(
        write.is_some() && look > write,
        "the evidence is a pod create in the selected namespace, after the write: {requests:?}"
    );
    assert!(
        api.lock()
            .unwrap()
            .dry_runs
            .iter()
            .all(|q| q.contains("dryRun=All")),
        "only dry runs"
    );
    let status = api.lock().unwrap().status_writes.last().cloned().unwrap();
    let r = ready(&status);
    assert_eq!(r["status"], "True", "{status}");
    assert_eq!(r["observedGeneration"], 1);
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("dry-run pod in namespace apps came back with its injection"),
        "{r}"
    );
    assert_eq!(status["enforcement"]["evidence"], "Probe");
    assert_eq!(status["enforcement"]["revision"], json!(hash));
    assert!(
        actions[..actions.len() - 1]
            .iter()
            .all(|a| *a != Action::requeue(super::reconcile::RESYNC)),
        "a reconcile without evidence looks again soon: {actions:?}"
    );
    assert_eq!(
        actions.last(),
        Some(&Action::requeue(super::reconcile::RESYNC))
    );
    let configuration: MutatingWebhookConfiguration =
        serde_json::from_value(api.lock().unwrap().configuration.clone().unwrap()).unwrap();
    assert_eq!(configuration.webhooks.unwrap()[0].name, "p.splice.dev");

    clear(&api);
    let current = with_written_status(&api);
    reconcile(Arc::new(current), Arc::clone(&ctx))
        .await
        .unwrap();
    assert_eq!(
        api.lock().unwrap().requests,
        vec![(Method::GET, MWC_PATH.to_owned())],
        "steady state reads the configuration once, probes nothing and writes nothing"
    );
}

#[tokio::test]
async fn ready_waits_while_the_dry_run_pod_comes_back_without_the_injection_and_says_so_once() {
    let api = Shared::default();
    let ctx = context(fake_api(Arc::clone(&api)), true, &[policy()]);
    let action = reconcile(Arc::new(policy()), Arc::clone(&ctx))
        .await
        .unwrap();
    assert!(action != Action::requeue(super::reconcile::RESYNC));
    let status = api.lock().unwrap().status_writes.last().cloned().unwrap();
    let r = ready(&status);
    assert_eq!(
        (r["status"].as_str(), r["reason"].as_str()),
        (Some("False"), Some("AwaitingEnforcement")),
        "{status}"
    );
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("came back without the injection"),
        "{r}"
    );
    assert!(status.get("enforcement").is_none());

    clear(&api);
    let current = with_written_status(&api);
    reconcile(Arc::new(current), Arc::clone(&ctx))
        .await
        .unwrap();
    assert!(
        writes(&api).is_empty(),
        "looking again writes no status while nothing changed: {:?}",
        writes(&api)
    );
    assert_eq!(api.lock().unwrap().dry_runs.len(), 2, "it did look again");
}

#[tokio::test]
async fn without_a_selected_namespace_ready_waits_the_settle_time_and_names_that_evidence() {
    let api = Shared::default();
    let ctx = context_with(
        fake_api(Arc::clone(&api)),
        true,
        &[policy()],
        &[("apps", "off")],
    );
    let started = std::time::Instant::now();
    let status = settle(&api, &ctx, policy()).await;
    assert_eq!(ready(&status)["status"], "True", "{status}");
    assert!(
        started.elapsed() >= super::enforcement::SETTLE,
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status["enforcement"]["evidence"], "SettleTime");
    assert!(
        ready(&status)["message"]
            .as_str()
            .unwrap()
            .contains("no existing namespace is selected"),
        "{status}"
    );
    assert!(api.lock().unwrap().dry_runs.is_empty());
}

#[tokio::test]
async fn a_template_the_probe_pod_cannot_satisfy_is_not_probed_and_ready_waits_the_settle_time() {
    let api = Shared::default();
    let mut p = policy();
    // The probe pod carries no `app` label: the engine refuses to render it, so a dry run
    // would come back uninjected whether or not the API server enforces the policy.
    p.spec = serde_json::from_value(json!({
        "mode": "Webhook",
        "namespaceSelector": {"matchLabels": {"mesh": "on"}},
        "template": {"annotations": {"app": "{{ pod.metadata.labels.app }}"}}
    }))
    .unwrap();
    let ctx = context(fake_api(Arc::clone(&api)), true, &[p.clone()]);
    let status = settle(&api, &ctx, p).await;
    assert_eq!(ready(&status)["status"], "True", "{status}");
    assert_eq!(status["enforcement"]["evidence"], "SettleTime");
    assert!(
        status["enforcement"]["detail"]
            .as_str()
            .unwrap()
            .contains("cannot be rendered for the probe pod"),
        "{status}"
    );
    assert!(api.lock().unwrap().dry_runs.is_empty(), "no dry run");
}

#[tokio::test]
async fn a_reconcile_before_the_status_write_is_watched_does_not_write_again() {
    let api = Shared::default();
    let ctx = context(fake_api(Arc::clone(&api)), true, &[policy()]);
    reconcile(Arc::new(policy()), Arc::clone(&ctx))
        .await
        .unwrap();
    clear(&api);
    // The cache still holds the object without status.
    reconcile(Arc::new(policy()), Arc::clone(&ctx))
        .await
        .unwrap();
    assert!(writes(&api).is_empty(), "{:?}", writes(&api));
}

#[tokio::test]
async fn a_deleted_configuration_is_recreated_with_an_event_and_no_status_write() {
    let api = Shared::default();
    let ctx = context(fake_api(Arc::clone(&api)), true, &[policy()]);
    reconcile(Arc::new(policy()), Arc::clone(&ctx))
        .await
        .unwrap();
    let current = with_written_status(&api);
    api.lock().unwrap().configuration = None;
    clear(&api);

    reconcile(Arc::new(current), Arc::clone(&ctx))
        .await
        .unwrap();
    let w = writes(&api);
    assert_eq!(w[0], (Method::PATCH, MWC_PATH.to_owned()));
    assert!(w.iter().all(|(_, p)| p != STATUS_PATH), "{w:?}");
    assert_eq!(
        w.iter().filter(|(m, _)| *m == Method::POST).count(),
        1,
        "one drift Event"
    );
}

#[tokio::test]
async fn pausing_deletes_the_configuration_and_reports_paused() {
    let api = Shared::default();
    let ctx = context(fake_api(Arc::clone(&api)), true, &[policy()]);
    reconcile(Arc::new(policy()), Arc::clone(&ctx))
        .await
        .unwrap();
    let mut paused = with_written_status(&api);
    paused.spec.paused = true;
    paused.metadata.generation = Some(2);
    clear(&api);

    reconcile(Arc::new(paused), Arc::clone(&ctx)).await.unwrap();
    let w = writes(&api);
    assert_eq!(w[0], (Method::DELETE, MWC_PATH.to_owned()));
    assert_eq!(w[1], (Method::PATCH, STATUS_PATH.to_owned()));
    assert!(api.lock().unwrap().configuration.is_none());
    let status = api.lock().unwrap().status_writes.last().cloned().unwrap();
    let ready = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("False"), Some("Paused"))
    );
    assert!(status.get("webhookConfiguration").is_none());
}

#[tokio::test]
async fn a_replica_that_is_not_leader_writes_nothing() {
    let api = Shared::default();
    let ctx = context(fake_api(Arc::clone(&api)), false, &[policy()]);
    let result = reconcile(Arc::new(policy()), Arc::clone(&ctx)).await;
    assert!(matches!(result, Err(Error::NotLeader)), "{result:?}");
    assert!(writes(&api).is_empty(), "{:?}", writes(&api));
}

#[tokio::test]
async fn operations_in_a_policy_reach_the_rules() {
    let api = Shared::default();
    let mut p = policy();
    p.spec.operations = vec![Operation::Create, Operation::Update];
    let ctx = context(fake_api(Arc::clone(&api)), true, std::slice::from_ref(&p));
    reconcile(Arc::new(p), ctx).await.unwrap();
    let stored = api.lock().unwrap().configuration.clone().unwrap();
    assert_eq!(
        stored["webhooks"][0]["rules"][0]["operations"],
        json!(["CREATE", "UPDATE"])
    );
}

#[tokio::test]
async fn an_auto_policy_of_static_content_is_written_in_tree_and_no_webhook_configuration() {
    let api = Shared::default();
    let mut p = policy();
    p.spec.mode = splice_crds::Mode::Auto;
    let ctx = context(fake_api(Arc::clone(&api)), true, std::slice::from_ref(&p));
    reconcile(Arc::new(p), ctx).await.unwrap();
    let w = writes(&api);
    assert_eq!(w[0], (Method::PATCH, MAP_PATH.to_owned()), "{w:?}");
    assert_eq!(w[1], (Method::PATCH, BINDING_PATH.to_owned()), "{w:?}");
    assert!(w.iter().all(|(_, path)| path != MWC_PATH), "{w:?}");
    let status = api.lock().unwrap().status_writes.last().cloned().unwrap();
    assert_eq!(status["mode"], json!("InTree"));
    assert!(status.get("webhookConfiguration").is_none());
    let map = api.lock().unwrap().in_tree.get(MAP_PATH).cloned().unwrap();
    assert_eq!(map["spec"]["mutations"][0]["patchType"], json!("JSONPatch"));
}
