//! Policies under the same terms share one webhook entry: one API-server call per pod for all of
//! them, applied in name order; entries change as policies come, go, pause and change without a
//! pod missed or injected twice.

#[path = "../src/operator.rs"]
mod operator;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhook, MutatingWebhookConfiguration};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use operator::*;
use serde_json::{Value, json};
use splice_crds::InjectionPolicy;
use splice_e2e::{TestNamespace, wait_until};

/// Policy `i` of a group: a container, an env var and a label of its own, and for even `i` an
/// init container.
fn member_spec(instance: &str, i: usize) -> Value {
    let mut template = json!({
        "containers": [{"name": format!("side-{i:02}"), "image": format!("registry.invalid/side:{i}")}],
        "env": [{"name": format!("FROM_{i:02}"), "value": "yes"}],
        "labels": {format!("p{i:02}.example/injected"): "true"},
    });
    if i.is_multiple_of(2) {
        template["initContainers"] =
            json!([{"name": format!("init-{i:02}"), "image": "registry.invalid/init:1"}]);
    }
    json!({
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "failurePolicy": "Ignore",
        "timeoutSeconds": 10,
        "template": template,
    })
}

/// How many times the API server has called the webhook `webhook` for a pod CREATE.
async fn calls(client: &Client, webhook: &str) -> Result<u64> {
    let text = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    let mut total = 0.0;
    for line in text.lines() {
        if line.starts_with("apiserver_admission_webhook_admission_duration_seconds_count{")
            && line.contains(&format!("name=\"{webhook}\""))
            && line.contains("operation=\"CREATE\"")
        {
            let value = line.rsplit(' ').next().unwrap_or("0");
            total += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    Ok(total as u64)
}

async fn status_entry(client: &Client, policy: &str) -> Result<Option<String>> {
    let api: Api<InjectionPolicy> = Api::all(client.clone());
    Ok(api
        .get(policy)
        .await?
        .status
        .and_then(|s| s.webhook_configuration))
}

/// Waits until every policy in `names` is Ready and its status names `entry`.
async fn wait_entry(client: &Client, names: &[String], entry: &str) -> Result<()> {
    for name in names {
        wait_policy(client, name, "True", Duration::from_secs(60)).await?;
    }
    wait_until(
        Duration::from_secs(60),
        &format!("{names:?} to be served by {entry}"),
        || async {
            for name in names {
                if status_entry(client, name).await?.as_deref() != Some(entry) {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await
}

/// Waits until every policy in `names` is Ready and served by one shared entry; returns it.
async fn wait_shared(client: &Client, names: &[String]) -> Result<String> {
    for name in names {
        wait_policy(client, name, "True", Duration::from_secs(60)).await?;
    }
    wait_until(
        Duration::from_secs(60),
        &format!("{names:?} to share one entry"),
        || async {
            let mut entries = Vec::new();
            for name in names {
                entries.push(status_entry(client, name).await?);
            }
            let first = entries.first().cloned().flatten().unwrap_or_default();
            Ok(first.starts_with("splice--group-")
                && entries.iter().all(|e| e.as_deref() == Some(first.as_str())))
        },
    )
    .await?;
    status_entry(client, &names[0])
        .await?
        .context("no entry in status")
}

/// The configurations this test's policies own.
async fn owned_configurations(client: &Client, instance: &str) -> Result<Vec<String>> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let mut names: Vec<String> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|c| {
            c.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.name.starts_with(instance))
        })
        .filter_map(|c| c.metadata.name)
        .collect();
    names.sort();
    Ok(names)
}

/// Waits until `entry` is the only configuration the test's policies own.
async fn wait_sole(s: &Setup, entry: &str) -> Result<()> {
    wait_until(
        Duration::from_secs(30),
        &format!("{entry} to be the only configuration left"),
        || async { Ok(owned_configurations(&s.client, &s.instance).await? == [entry.to_owned()]) },
    )
    .await
}

/// The URL or Service path the API server calls for `hook`.
fn target_of(hook: &MutatingWebhook) -> String {
    let service = hook.client_config.service.as_ref();
    hook.client_config
        .url
        .clone()
        .or_else(|| service.and_then(|s| s.path.clone()))
        .unwrap_or_default()
}

fn count(names: &[String], name: &str) -> usize {
    names.iter().filter(|n| *n == name).count()
}

#[tokio::test]
async fn ten_overlapping_policies_inject_each_pod_once_in_name_order_with_one_call() -> Result<()> {
    // No admission probe: its dry-run creates would be calls too.
    let s = Setup::start_with("shared", &["--probe-interval", "0"]).await?;
    let names: Vec<String> = (0..10).map(|i| s.policy(&format!("p{i:02}"))).collect();
    // Reinvocation IfNeeded (the default): the injected containers carry the token mount the
    // API server's ServiceAccount plugin would add when it runs again, so nothing changes after
    // the entry's call and the API server has no reason to call it a second time.
    for (i, name) in names.iter().enumerate() {
        s.apply(name, member_spec(&s.instance, i)).await?;
    }
    let entry = wait_shared(&s.client, &names).await?;
    // One entry, none of the policies' own.
    wait_sole(&s, &entry).await?;
    let api: Api<MutatingWebhookConfiguration> = Api::all(s.client.clone());
    let config = api.get(&entry).await?;
    let hooks = config.webhooks.unwrap_or_default();
    ensure!(hooks.len() == 1, "{hooks:?}");
    let webhook = hooks[0].name.clone();
    let path = target_of(&hooks[0]);
    ensure!(
        path.ends_with(&splice_engine::entry::entry_path(
            names.iter().map(String::as_str)
        )),
        "{path}"
    );
    let owners = config.metadata.owner_references.unwrap_or_default();
    ensure!(owners.len() == 10, "{owners:?}");

    let ns = s.app_namespace().await?;
    wait_injecting(&s.client, &ns.name, &[], "side-09").await?;
    let pods: Api<Pod> = ns.api();
    let before = calls(&s.client, &webhook).await?;
    let n = 200;
    for k in 0..n {
        pods.create(&PostParams::default(), &pod(&format!("web-{k:03}"), &[]))
            .await?;
    }
    let after = calls(&s.client, &webhook).await?;
    ensure!(
        after - before == n,
        "the API server called the shared entry {} times for {n} pods",
        after - before
    );

    let expected_containers: Vec<String> = std::iter::once("app".to_owned())
        .chain((0..10).map(|i| format!("side-{i:02}")))
        .collect();
    let expected_init: Vec<String> = (0..10).step_by(2).map(|i| format!("init-{i:02}")).collect();
    for created in pods.list(&ListParams::default()).await?.items {
        let pod_name = created.metadata.name.clone().unwrap_or_default();
        ensure!(
            container_names(&created) == expected_containers,
            "{pod_name}: containers {:?}",
            container_names(&created)
        );
        ensure!(
            init_container_names(&created) == expected_init,
            "{pod_name}: init containers {:?}",
            init_container_names(&created)
        );
        let app = &created.spec.as_ref().context("spec")?.containers[0];
        let env: Vec<String> = app.env.iter().flatten().map(|e| e.name.clone()).collect();
        for i in 0..10 {
            ensure!(
                count(&env, &format!("FROM_{i:02}")) == 1,
                "{pod_name}: env {env:?}"
            );
        }
        let labels = created.metadata.labels.clone().unwrap_or_default();
        ensure!(
            (0..10).all(|i| labels.contains_key(&format!("p{i:02}.example/injected"))),
            "{pod_name}: {labels:?}"
        );
        let status: BTreeMap<String, Value> = serde_json::from_str(
            created
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("splice.dev/status"))
                .context("no splice.dev/status")?,
        )?;
        let recorded: Vec<&String> = status.keys().collect();
        ensure!(
            recorded == names.iter().collect::<Vec<_>>(),
            "{pod_name}: {recorded:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn policies_under_different_terms_keep_their_own_entries_and_terms() -> Result<()> {
    let s = Setup::start("terms").await?;
    let base = |timeout: i64, failure: &str, container: &str| {
        json!({
            "namespaceSelector": {"matchLabels": {s.instance.clone(): "on"}},
            "failurePolicy": failure,
            "timeoutSeconds": timeout,
            "template": {"containers": [{"name": container, "image": "registry.invalid/x:1"}]},
        })
    };
    let specs = [
        ("a", base(10, "Ignore", "a")),
        ("b", base(10, "Ignore", "b")),
        ("c", base(5, "Ignore", "c")),
        // Asks for Fail; the availability guard holds it at Ignore (one replica here), and it
        // still does not share with the Ignore policies.
        ("d", base(10, "Fail", "d")),
    ];
    for (name, spec) in &specs {
        s.apply(&s.policy(name), spec.clone()).await?;
    }
    let shared = |name: &str| s.policy(name);
    for (name, _) in &specs {
        wait_policy(&s.client, &shared(name), "True", Duration::from_secs(60)).await?;
    }
    wait_shared(&s.client, &[shared("a"), shared("b")]).await?;
    wait_entry(
        &s.client,
        &[shared("c")],
        &format!("splice-{}", shared("c")),
    )
    .await?;
    wait_entry(
        &s.client,
        &[shared("d")],
        &format!("splice-{}", shared("d")),
    )
    .await?;

    let api: Api<MutatingWebhookConfiguration> = Api::all(s.client.clone());
    let policies: Api<InjectionPolicy> = Api::all(s.client.clone());
    for (name, spec) in &specs {
        let policy = policies.get(&shared(name)).await?;
        let status = policy.status.context("status")?;
        let entry = status.webhook_configuration.context("entry")?;
        let hook = api
            .get(&entry)
            .await?
            .webhooks
            .unwrap_or_default()
            .remove(0);
        ensure!(
            hook.timeout_seconds == spec["timeoutSeconds"].as_i64().map(|t| t as i32),
            "{name}: timeout {:?} in {entry}",
            hook.timeout_seconds
        );
        ensure!(
            hook.failure_policy.as_deref() == status.effective_failure_policy.map(|f| f.as_str()),
            "{name}: failurePolicy {:?} in {entry}, status says {:?}",
            hook.failure_policy,
            status.effective_failure_policy
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_group_changing_under_load_never_misses_or_doubles_a_pod() -> Result<()> {
    let s = Setup::start("churn").await?;
    let name = |i: usize| s.policy(&format!("p{i:02}"));
    // p00..p03 from the start; p04 joins; p01 pauses; p02 moves to another entry (new timeout)
    // and back; p03 is deleted.
    for i in 0..4 {
        s.apply(&name(i), member_spec(&s.instance, i)).await?;
    }
    let first: Vec<String> = (0..4).map(name).collect();
    let entry = wait_shared(&s.client, &first).await?;
    let ns = s.app_namespace().await?;
    wait_injecting(&s.client, &ns.name, &[], "side-03").await?;
    wait_sole(&s, &entry).await?;

    let pods: Api<Pod> = ns.api();
    let stop = Arc::new(AtomicBool::new(false));
    let mut creators = Vec::new();
    for worker in 0..3 {
        let pods = pods.clone();
        let stop = Arc::clone(&stop);
        creators.push(tokio::spawn(async move {
            let mut created = 0usize;
            let mut refused = Vec::new();
            let mut k = 0;
            while !stop.load(Ordering::Relaxed) {
                let p = pod(&format!("w{worker}-{k:04}"), &[]);
                k += 1;
                match pods.create(&PostParams::default(), &p).await {
                    Ok(_) => created += 1,
                    Err(e) => refused.push(e.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            (created, refused)
        }));
    }
    let started = tokio::time::Instant::now();
    let settle = Duration::from_secs(4);
    tokio::time::sleep(settle).await;
    s.apply(&name(4), member_spec(&s.instance, 4)).await?;
    tokio::time::sleep(settle).await;
    let mut paused = member_spec(&s.instance, 1);
    paused["paused"] = json!(true);
    s.apply(&name(1), paused).await?;
    tokio::time::sleep(settle).await;
    let mut moved = member_spec(&s.instance, 2);
    moved["timeoutSeconds"] = json!(7);
    s.apply(&name(2), moved).await?;
    tokio::time::sleep(settle).await;
    s.apply(&name(2), member_spec(&s.instance, 2)).await?;
    tokio::time::sleep(settle).await;
    let policies: Api<InjectionPolicy> = Api::all(s.client.clone());
    policies.delete(&name(3), &DeleteParams::default()).await?;
    tokio::time::sleep(settle).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let mut created = 0;
    for c in creators {
        let (n, refused) = c.await?;
        ensure!(refused.is_empty(), "pod creates refused: {refused:?}");
        created += n;
    }
    let rate = created as f64 / elapsed.as_secs_f64();
    ensure!(rate >= 10.0, "only {rate:.1} pods/s were created");

    // Policies in force throughout (p00 and p02, which moved and came back) are in every pod,
    // once; the others at most once.
    let listed = pods.list(&ListParams::default()).await?.items;
    let stored: Vec<&Pod> = listed
        .iter()
        .filter(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with('w'))
        })
        .collect();
    ensure!(
        stored.len() == created,
        "{} stored, {created} created",
        stored.len()
    );
    for p in &stored {
        let pod_name = p.metadata.name.clone().unwrap_or_default();
        let containers = container_names(p);
        for i in 0..5 {
            let side = format!("side-{i:02}");
            let n = count(&containers, &side);
            if i == 0 || i == 2 {
                ensure!(n == 1, "{pod_name}: {side} {n} times: {containers:?}");
            } else if n > 1 {
                bail!("{pod_name}: {side} {n} times: {containers:?}");
            }
        }
        let env: Vec<String> = p.spec.as_ref().context("spec")?.containers[0]
            .env
            .iter()
            .flatten()
            .map(|e| e.name.clone())
            .collect();
        for i in 0..5 {
            ensure!(
                count(&env, &format!("FROM_{i:02}")) <= 1,
                "{pod_name}: env {env:?}"
            );
        }
        ensure!(
            count(&env, "FROM_00") == 1 && count(&env, "FROM_02") == 1,
            "{pod_name}: env {env:?}"
        );
    }
    // The survivors end in one entry again, and nothing of p01 (paused) or p03 (deleted) is left
    // in it.
    let survivors = [name(0), name(2), name(4)];
    let entry = wait_shared(&s.client, &survivors).await?;
    wait_sole(&s, &entry).await?;
    let api: Api<MutatingWebhookConfiguration> = Api::all(s.client.clone());
    let hook = api
        .get(&entry)
        .await?
        .webhooks
        .unwrap_or_default()
        .remove(0);
    let target = target_of(&hook);
    ensure!(
        target.ends_with(&splice_engine::entry::entry_path(
            survivors.iter().map(String::as_str)
        )),
        "{target}"
    );
    Ok(())
}

/// The containers a dry-run create of a fresh pod gets in namespace `ns`, after `app`.
async fn injected(client: &Client, ns: &str, k: usize) -> Result<Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let created = pods
        .create(
            &PostParams {
                dry_run: true,
                ..PostParams::default()
            },
            &pod(&format!("cell-{k:03}"), &[]),
        )
        .await?;
    Ok(container_names(&created).into_iter().skip(1).collect())
}

/// Every call the API server made to the webhooks of configuration `entry`.
async fn calls_to(client: &Client, entry: &str) -> Result<u64> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let mut total = 0;
    for hook in api.get(entry).await?.webhooks.unwrap_or_default() {
        total += calls(client, &hook.name).await?;
    }
    Ok(total)
}

/// Sets (or with null removes) one label of namespace `ns`.
async fn relabel(
    api: &Api<k8s_openapi::api::core::v1::Namespace>,
    ns: &str,
    key: &str,
    value: Value,
) -> Result<()> {
    let patch = json!({"metadata": {"labels": {key: value}}});
    api.patch(
        ns,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn policies_with_different_namespace_selectors_cost_one_call_judged_by_the_api_server()
-> Result<()> {
    let s = Setup::start_with("cells", &["--probe-interval", "0"]).await?;
    let key = |k: &str| format!("{}-{k}", s.instance);
    let names: Vec<String> = ["a", "b", "c"].iter().map(|k| s.policy(k)).collect();
    for (name, k) in names.iter().zip(["a", "b", "c"]) {
        s.apply(
            name,
            json!({
                "namespaceSelector": {"matchLabels": {key(k): "on"}},
                "failurePolicy": "Ignore",
                "timeoutSeconds": 10,
                "template": {"containers": [{"name": format!("side-{k}"), "image": "registry.invalid/x:1"}]},
            }),
        )
        .await?;
    }
    let entry = wait_shared(&s.client, &names).await?;
    wait_sole(&s, &entry).await?;
    let api: Api<MutatingWebhookConfiguration> = Api::all(s.client.clone());
    let hooks = api.get(&entry).await?.webhooks.unwrap_or_default();
    ensure!(
        hooks.len() == 7,
        "one webhook per set of selectors: {hooks:?}"
    );

    // Every combination of the three labels: the pod gets exactly the policies whose selectors
    // hold, in name order, for one call (none where no selector holds).
    let sets: [&[&str]; 5] = [&["a"], &["a", "b"], &["b", "c"], &["a", "b", "c"], &[]];
    let mut k = 0;
    for set in sets {
        let labels: Vec<(String, &str)> = set.iter().map(|l| (key(l), "on")).collect();
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let ns = TestNamespace::create("e2e-cells", &labels).await?;
        let expected: Vec<String> = set.iter().map(|l| format!("side-{l}")).collect();
        // The first pod right after the namespace exists: the API server judges the selectors
        // from its own view (reading the namespace itself if its cache lacks it).
        let before = calls_to(&s.client, &entry).await?;
        let n = 20;
        for _ in 0..n {
            k += 1;
            let got = injected(&s.client, &ns.name, k).await?;
            ensure!(
                got == expected,
                "namespace labelled {set:?}: pod got {got:?}"
            );
        }
        let made = calls_to(&s.client, &entry).await? - before;
        let want = if set.is_empty() { 0 } else { n as u64 };
        ensure!(made == want, "{set:?}: {made} calls for {n} creates");
    }

    // Opting a namespace in to one more selector: every pod created while the API server's view
    // catches up gets the old set or the new one, never neither, and soon the new one.
    let ns = TestNamespace::create("e2e-cells", &[(key("a").as_str(), "on")]).await?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(s.client.clone());
    let old = vec!["side-a".to_owned()];
    let new = vec!["side-a".to_owned(), "side-b".to_owned()];
    for round in 0..5 {
        relabel(&namespaces, &ns.name, &key("b"), json!("on")).await?;
        let mut seen_new = false;
        for _ in 0..40 {
            k += 1;
            let got = injected(&s.client, &ns.name, k).await?;
            ensure!(
                got == old || got == new,
                "round {round}: while opting in, a pod got {got:?}"
            );
            seen_new |= got == new;
            if seen_new {
                break;
            }
        }
        ensure!(seen_new, "round {round}: the new label never took effect");
        relabel(&namespaces, &ns.name, &key("b"), Value::Null).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            k += 1;
            if injected(&s.client, &ns.name, k).await? == old {
                break;
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "round {round}: the label never went"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// A webhook calling Splice's Service at `path`, as a server-side dry run.
async fn service_entry(
    client: &Client,
    path: &str,
) -> Result<kube::Result<MutatingWebhookConfiguration>> {
    let entry: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "e2e-service-path"},
        "webhooks": [{
            "name": "group.splice.dev",
            "clientConfig": {"service": {"namespace": "splice-system", "name": "splice", "path": path}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
        }],
    }))?;
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    Ok(api
        .create(
            &PostParams {
                dry_run: true,
                ..PostParams::default()
            },
            &entry,
        )
        .await)
}

#[tokio::test]
async fn the_api_server_accepts_a_shared_or_canary_entrys_path_in_a_service_reference() -> Result<()>
{
    let client = splice_e2e::client().await?;
    let names = ["a-mesh", "b.logs", "c-trace"];
    let path = splice_engine::entry::entry_path(names);
    let canary = splice_engine::entry::canary_path("b.logs");
    for path in [&path, &canary] {
        service_entry(&client, path)
            .await?
            .with_context(|| format!("the API server refused {path}"))?;
    }
    // What earlier versions wrote (still read by the webhook) is refused there: the reason the
    // separator is `/` and a canary's entry has a prefix of its own.
    for earlier in ["/inject/a-mesh,b.logs", "/inject/b.logs@canary"] {
        let refused = service_entry(&client, earlier).await?;
        ensure!(
            matches!(&refused, Err(kube::Error::Api(e)) if e.code == 422),
            "{earlier} in a Service path: {refused:?}"
        );
    }
    Ok(())
}
