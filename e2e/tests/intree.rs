//! In-tree mode (issue 20) on the real control plane: a policy whose templates have CEL
//! equivalents runs as a MutatingAdmissionPolicy, gives stored pods identical to its webhook's,
//! keeps injecting with Splice stopped, and switches modes without a pod left uninjected.

#[path = "../src/operator.rs"]
mod operator;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, MutatingWebhook,
    MutatingWebhookConfiguration, RuleWithOperations, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use operator::*;
use serde_json::{Value, json};
use splice_crds::{FailurePolicy, InjectionPolicy, Mode};
use splice_e2e::{
    AgnhostWebhook, TestNamespace, WebhookConfigurationGuard, wait_dry_run, wait_until,
};

/// Waits until the policy is Ready for its generation with `status.mode == mode`.
async fn wait_mode(client: &Client, name: &str, mode: Mode) -> Result<InjectionPolicy> {
    let api: Api<InjectionPolicy> = Api::all(client.clone());
    let ok = wait_until(
        Duration::from_secs(45),
        &format!("{name} in mode {mode:?}"),
        || async {
            let p = api.get(name).await?;
            let s = p.status.clone().unwrap_or_default();
            Ok(s.observed_generation == p.metadata.generation
                && s.mode == Some(mode)
                && condition(&p, "Ready").is_some_and(|c| c.status == "True"))
        },
    )
    .await;
    let last = api.get(name).await?;
    ok.with_context(|| format!("last status: {:?}", last.status))?;
    Ok(last)
}

async fn in_tree_objects(client: &Client, policy: &str) -> Result<(bool, bool, bool)> {
    let name = format!("splice-{policy}");
    let map = Api::<MutatingAdmissionPolicy>::all(client.clone())
        .get_opt(&name)
        .await?;
    let binding = Api::<MutatingAdmissionPolicyBinding>::all(client.clone())
        .get_opt(&name)
        .await?;
    let webhook = configuration(client, policy).await?;
    Ok((map.is_some(), binding.is_some(), webhook.is_some()))
}

/// The spec of `examples/mesh-proxy.yaml`, selecting this test's namespaces.
fn example_spec(instance: &str) -> Result<Value> {
    let path = splice_e2e::repo_root().join("examples/mesh-proxy.yaml");
    let doc: Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
    let mut spec = doc["spec"].clone();
    spec["namespaceSelector"] = json!({"matchLabels": {instance: "on"}});
    spec["mode"] = json!("Auto");
    Ok(spec)
}

#[tokio::test]
async fn the_example_policy_runs_in_tree_under_auto_with_no_webhook_configuration() -> Result<()> {
    let s = Setup::start("intree-example").await?;
    let name = s.policy("mesh");
    s.apply(&name, example_spec(&s.instance)?).await?;
    let p = wait_mode(&s.client, &name, Mode::InTree).await?;
    let status = p.status.clone().unwrap_or_default();
    assert_eq!(status.webhook_configuration, None);
    assert_eq!(
        condition(&p, "InTree").map(|c| c.reason.as_str()),
        Some("InTree")
    );
    assert_eq!(
        in_tree_objects(&s.client, &name).await?,
        (true, true, false)
    );
    let map = Api::<MutatingAdmissionPolicy>::all(s.client.clone())
        .get(&format!("splice-{name}"))
        .await?;
    assert_eq!(
        map.labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("splice")
    );
    assert_eq!(
        map.owner_references().first().map(|o| o.uid.as_str()),
        p.metadata.uid.as_deref()
    );

    // Steady state: the objects Splice wrote are not written again.
    let versions = || async {
        let map = Api::<MutatingAdmissionPolicy>::all(s.client.clone())
            .get(&format!("splice-{name}"))
            .await?;
        let binding = Api::<MutatingAdmissionPolicyBinding>::all(s.client.clone())
            .get(&format!("splice-{name}"))
            .await?;
        anyhow::Ok((map.resource_version(), binding.resource_version()))
    };
    let before = versions().await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(versions().await?, before, "no write in steady state");

    let ns = s.app_namespace().await?;
    let pods = ns.api::<Pod>();
    wait_injecting(&s.client, &ns.name, &[], "mesh-proxy").await?;
    let created = pods
        .create(&PostParams::default(), &pod("app", &[("app", "x")]))
        .await?;
    assert_eq!(
        init_container_names(&created),
        ["mesh-init", "mesh-proxy"],
        "injected init containers before the pod's own"
    );
    let record = created
        .annotations()
        .get("splice.dev/status")
        .cloned()
        .unwrap_or_default();
    let entry: Value = serde_json::from_str(&record)?;
    assert_eq!(
        entry[&name]["hash"].as_str(),
        status.template_hash.as_deref(),
        "the provenance record carries the policy's template hash"
    );

    // The admission probe and coverage read in-tree pods as they read webhook pods.
    let api: Api<InjectionPolicy> = Api::all(s.client.clone());
    wait_until(Duration::from_secs(90), "Verified and counted", || async {
        let p = api.get(&name).await?;
        let verified = condition(&p, "Verified").is_some_and(|c| c.status == "True");
        let current = p
            .status
            .and_then(|s| s.coverage)
            .is_some_and(|c| c.current >= 1 && c.missed == 0);
        Ok(verified && current)
    })
    .await?;

    // Drift: a deleted binding is restored.
    Api::<MutatingAdmissionPolicyBinding>::all(s.client.clone())
        .delete(&format!("splice-{name}"), &Default::default())
        .await?;
    wait_until(Duration::from_secs(30), "the binding restored", || async {
        Ok(in_tree_objects(&s.client, &name).await?.1)
    })
    .await?;

    // Paused removes both paths.
    let mut paused = example_spec(&s.instance)?;
    paused["paused"] = json!(true);
    s.apply(&name, paused).await?;
    wait_until(Duration::from_secs(30), "both paths removed", || async {
        Ok(in_tree_objects(&s.client, &name).await? == (false, false, false))
    })
    .await?;
    Ok(())
}

/// The differential policy: every kind of item, static strings and every kind of plain
/// reference the in-tree form reads.
fn differential_spec(instance: &str, mode: &str) -> Value {
    json!({
        "mode": mode,
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "values": {"image": "registry.invalid/proxy:1"},
        "template": {
            "initContainers": [
                {"name": "diff-init", "image": "{{ values.image }}", "args": ["--ns", "{{ namespace.name }}"]},
                {"name": "diff-proxy", "image": "{{ values.image }}", "restartPolicy": "Always",
                 "ports": [{"containerPort": 15001, "name": "proxy"}],
                 "env": [{"name": "POD_APP", "value": "app={{ pod.metadata.labels.app }} via {{ policy.name }}/{{ values.image }}"}]}
            ],
            "containers": [{"name": "diff-side", "image": "registry.invalid/side:1",
                            "resources": {"requests": {"cpu": "10m"}}}],
            "volumes": [{"name": "diff-certs", "emptyDir": {"medium": "Memory"}}],
            "env": [
                {"name": "DIFF_NS", "value": "{{ namespace.name }}"},
                {"name": "DIFF_TEAM", "value": "team {{ namespace.labels.team }}"}
            ],
            "volumeMounts": [{"name": "diff-certs", "mountPath": "/etc/diff", "readOnly": true}],
            "labels": {"diff.example/injected": "true"},
            "annotations": {
                "diff.example/ns": "{{ namespace.name }}",
                "diff.example/pod": "{{ pod.metadata.labels[\"app\"] }} in {{ pod.metadata.namespace }}",
                "diff.example/static": "yes"
            }
        }
    })
}

/// Pod `i` of the corpus: each varies what the planner looks at (own init containers, native
/// sidecars, names colliding with injected ones, absent lists, several containers, labels and
/// annotations absent or colliding, generateName, the opt-out label, another policy's record).
fn corpus_pod(i: usize) -> Value {
    let mut meta = serde_json::Map::new();
    if i % 7 == 3 {
        meta.insert("generateName".into(), json!(format!("gen-{i}-")));
    } else {
        meta.insert("name".into(), json!(format!("p-{i}")));
    }
    let mut labels = serde_json::Map::new();
    // Pods without `app` make the POD_APP reference fail: both modes then admit them untouched.
    // Some pods carry no annotations at all (the record then comes with the whole map).
    if i % 11 != 5 {
        labels.insert("app".into(), json!(format!("a{}", i % 4)));
    }
    if i % 5 == 1 {
        labels.insert("diff.example/injected".into(), json!("mine"));
    }
    if i % 13 == 7 {
        labels.insert("splice.dev/inject".into(), json!("false"));
    }
    labels.insert("corpus".into(), json!("yes"));
    meta.insert("labels".into(), Value::Object(labels));
    let mut annotations = serde_json::Map::new();
    if !i.is_multiple_of(10) {
        annotations.insert("owner".into(), json!(format!("team-{}", i % 3)));
    }
    if i % 6 == 2 {
        annotations.insert("diff.example/static".into(), json!("author"));
    }
    if i % 8 == 6 {
        annotations.insert(
            "splice.dev/status".into(),
            json!(r#"{"other":{"hash":"0123456789abcdef","containers":["helper"]}}"#),
        );
    }
    if !annotations.is_empty() {
        meta.insert("annotations".into(), Value::Object(annotations));
    }
    let mut containers = vec![json!({"name": "app", "image": "registry.invalid/app:1"})];
    if i % 4 == 1 {
        containers.push(json!({"name": "worker", "image": "registry.invalid/w:1",
            "env": [{"name": "DIFF_NS", "value": "author"}, {"name": "OTHER", "value": "x"}]}));
        containers.push(json!({"name": "b-second", "image": "registry.invalid/b:1",
            "volumeMounts": [{"name": "data", "mountPath": "/etc/diff"}]}));
    }
    if i % 8 == 6 {
        containers.push(json!({"name": "helper", "image": "registry.invalid/h:1"}));
    }
    if i % 9 == 4 {
        containers.push(json!({"name": "diff-side", "image": "registry.invalid/mine:1"}));
    }
    let mut spec = serde_json::Map::new();
    spec.insert("containers".into(), Value::Array(containers));
    match i % 5 {
        1 => {
            spec.insert(
                "initContainers".into(),
                json!([{"name": "setup", "image": "registry.invalid/s:1"}]),
            );
        }
        2 => {
            spec.insert(
                "initContainers".into(),
                json!([
                {"name": "own-sidecar", "image": "registry.invalid/o:1", "restartPolicy": "Always"},
                {"name": "setup", "image": "registry.invalid/s:1"}]),
            );
        }
        3 => {
            spec.insert(
                "initContainers".into(),
                json!([{"name": "diff-init", "image": "registry.invalid/author-init:1"}]),
            );
        }
        _ => {}
    }
    let mut volumes = Vec::new();
    if i % 4 == 1 {
        volumes.push(json!({"name": "data", "emptyDir": {}}));
    }
    if i % 6 == 4 {
        volumes.push(json!({"name": "diff-certs", "emptyDir": {}}));
    }
    if !volumes.is_empty() {
        spec.insert("volumes".into(), Value::Array(volumes));
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
}

const CORPUS: usize = 60;

/// Waits until a dry run of a corpus pod that every template renders for comes back injected.
async fn wait_corpus_injected(ns: &TestNamespace) -> Result<()> {
    let probe: Pod = serde_json::from_value(corpus_pod(1))?;
    wait_dry_run(
        &ns.api::<Pod>(),
        &probe,
        Duration::from_secs(30),
        "the corpus injected",
        |p| container_names(p).iter().any(|c| c == "diff-side"),
    )
    .await
}

/// Creates the corpus in `ns`; returns the stored pods by corpus index, normalized: without the
/// fields the API server, the scheduler and kwok generate, with the namespace's name replaced.
async fn create_corpus(ns: &TestNamespace) -> Result<BTreeMap<usize, Value>> {
    let pods = ns.api::<Pod>();
    let mut out = BTreeMap::new();
    for i in 0..CORPUS {
        let pod: Pod = serde_json::from_value(corpus_pod(i))?;
        let created = pods
            .create(&PostParams::default(), &pod)
            .await
            .with_context(|| format!("creating corpus pod {i}"))?;
        out.insert(i, created.name_any());
    }
    let mut stored = BTreeMap::new();
    for (i, name) in out {
        let p = pods.get(&name).await?;
        stored.insert(i, normalize(serde_json::to_value(&p)?, &ns.name)?);
    }
    Ok(stored)
}

fn normalize(mut pod: Value, namespace: &str) -> Result<Value> {
    if let Some(meta) = pod["metadata"].as_object_mut() {
        for k in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "managedFields",
            "generation",
        ] {
            meta.remove(k);
        }
        if meta.contains_key("generateName") {
            meta.remove("name");
        }
    }
    if let Some(o) = pod.as_object_mut() {
        o.remove("status");
    }
    if let Some(spec) = pod["spec"].as_object_mut() {
        spec.remove("nodeName");
    }
    // The service account token volume gets a random suffix.
    let text = pod.to_string().replace(namespace, "NAMESPACE");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find("kube-api-access-") {
        let end = at + "kube-api-access-".len();
        out.push_str(&rest[..end]);
        rest = &rest[(end + 5).min(rest.len())..];
    }
    out.push_str(rest);
    Ok(serde_json::from_str(&out)?)
}

#[tokio::test]
async fn differential_the_same_corpus_through_the_webhook_and_in_tree_stores_identical_pods()
-> Result<()> {
    differential("intree-diff", differential_spec).await
}

/// Without env and volume mounts, the record of a pod that lacks every injected name is the
/// constant the engine precomputed (`first_record`); the corpus holds such pods and others.
#[tokio::test]
async fn differential_without_env_or_mounts_a_precomputed_record_stores_identical_pods()
-> Result<()> {
    differential("intree-diff-plain", |instance, mode| {
        let mut spec = differential_spec(instance, mode);
        if let Some(t) = spec["template"].as_object_mut() {
            t.remove("env");
            t.remove("volumeMounts");
        }
        spec
    })
    .await
}

/// Stores the corpus through the webhook, then in-tree with Splice stopped, and compares.
async fn differential(label: &str, spec: impl Fn(&str, &str) -> Value) -> Result<()> {
    let mut s = Setup::start(label).await?;
    let name = s.policy("diff");
    let team = [("team", "blue")];
    let ns_webhook = TestNamespace::create("e2e-app", &[(&s.instance, "on"), team[0]]).await?;
    let ns_intree = TestNamespace::create("e2e-app", &[(&s.instance, "on"), team[0]]).await?;

    s.apply(&name, spec(&s.instance, "Webhook")).await?;
    wait_mode(&s.client, &name, Mode::Webhook).await?;
    wait_corpus_injected(&ns_webhook).await?;
    let through_webhook = create_corpus(&ns_webhook).await?;

    s.apply(&name, spec(&s.instance, "InTree")).await?;
    wait_mode(&s.client, &name, Mode::InTree).await?;
    wait_until(
        Duration::from_secs(30),
        "the webhook configuration removed",
        || async { Ok(in_tree_objects(&s.client, &name).await? == (true, true, false)) },
    )
    .await?;
    // Nothing but the API server may inject from here on.
    s.splice.kill();
    wait_corpus_injected(&ns_intree).await?;
    let in_tree = create_corpus(&ns_intree).await?;

    let mut differences = Vec::new();
    let mut injected = 0;
    for (i, w) in &through_webhook {
        let t = &in_tree[i];
        if w != t {
            differences.push(format!("pod {i}:\n  webhook: {w}\n  in-tree: {t}"));
        }
        if w["metadata"]["annotations"]["splice.dev/status"]
            .as_str()
            .is_some_and(|r| r.contains(&name))
        {
            injected += 1;
        }
    }
    ensure!(
        differences.is_empty(),
        "{} of {CORPUS} pods differ:\n{}",
        differences.len(),
        differences.join("\n")
    );
    ensure!(
        injected >= CORPUS * 2 / 3,
        "only {injected} pods were injected"
    );
    println!("differential ({label}): {CORPUS} pods identical, {injected} injected");
    Ok(())
}

#[tokio::test]
async fn a_filter_keeps_the_webhook_under_auto_and_in_tree_is_refused_at_apply_naming_it()
-> Result<()> {
    let s = Setup::start("intree-filter").await?;
    let name = s.policy("upper");
    let spec = |mode: &str| {
        json!({
            "mode": mode,
            "namespaceSelector": {"matchLabels": {s.instance.clone(): "on"}},
            "template": {"containers": [{"name": "proxy", "image": "registry.invalid/p:1",
                "env": [{"name": "NS", "value": "{{ namespace.name | upper }}"}]}]}
        })
    };
    s.apply(&name, spec("Auto")).await?;
    let p = wait_mode(&s.client, &name, Mode::Webhook).await?;
    let c = condition(&p, "InTree").context("InTree condition")?;
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NeedsWebhook")
    );
    assert!(
        c.message
            .contains("spec.template.containers[0].env[0].value")
            && c.message.contains("{{ namespace.name | upper }}"),
        "{}",
        c.message
    );
    assert!(configuration(&s.client, &name).await?.is_some());

    // The validating webhook is loaded asynchronously: retry until it answers.
    let refused = std::sync::Mutex::new(String::new());
    wait_until(
        Duration::from_secs(30),
        "InTree refused at apply",
        || async {
            match s.apply(&s.policy("upper-intree"), spec("InTree")).await {
                Ok(()) => {
                    let api: Api<InjectionPolicy> = Api::all(s.client.clone());
                    let _ = api
                        .delete(&s.policy("upper-intree"), &Default::default())
                        .await;
                    Ok(false)
                }
                Err(e) => {
                    let m = format!("{e:#}");
                    let done = m.contains("spec.mode is InTree");
                    if let Ok(mut r) = refused.lock() {
                        *r = m;
                    }
                    Ok(done)
                }
            }
        },
    )
    .await?;
    let message = refused.lock().map(|m| m.clone()).unwrap_or_default();
    assert!(
        message.contains("{{ namespace.name | upper }}")
            && message.contains("spec.template.containers[0].env[0].value"),
        "{message}"
    );
    Ok(())
}

#[tokio::test]
async fn fail_in_tree_is_in_force_at_once_and_pods_are_injected_with_splice_stopped() -> Result<()>
{
    let mut s = Setup::start("intree-fail").await?;
    let name = s.policy("fail");
    let mut spec = sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:1");
    spec["mode"] = json!("Auto");
    spec["failurePolicy"] = json!("Fail");
    s.apply(&name, spec).await?;
    // One replica and no PodDisruptionBudget: the webhook's guard would hold Fail back.
    let p = wait_mode(&s.client, &name, Mode::InTree).await?;
    let status = p.status.clone().unwrap_or_default();
    assert_eq!(status.effective_failure_policy, Some(FailurePolicy::Fail));
    let fc = condition(&p, "FailClosed").context("FailClosed")?;
    assert_eq!(fc.status, "True");
    assert!(
        fc.message.contains("no availability guard"),
        "{}",
        fc.message
    );
    let ns = s.app_namespace().await?;
    wait_injecting(&s.client, &ns.name, &[], "proxy").await?;

    s.splice.kill();
    let pods = ns.api::<Pod>();
    for i in 0..10 {
        let created = pods
            .create(&PostParams::default(), &pod(&format!("down-{i}"), &[]))
            .await
            .context("a pod create with Splice stopped")?;
        assert_eq!(container_names(&created), ["app", "proxy"]);
    }
    Ok(())
}

/// How many times each injected item appears in `p`.
fn copies(p: &Pod, containers: &[&str], inits: &[&str]) -> Vec<(String, usize)> {
    let c = container_names(p);
    let ic = init_container_names(p);
    containers
        .iter()
        .map(|n| (n.to_string(), c.iter().filter(|x| x == n).count()))
        .chain(
            inits
                .iter()
                .map(|n| (n.to_string(), ic.iter().filter(|x| x == n).count())),
        )
        .collect()
}

#[tokio::test]
async fn switching_webhook_to_in_tree_and_back_at_ten_pods_a_second_injects_every_pod_exactly_once()
-> Result<()> {
    let s = Setup::start("intree-switch").await?;
    let name = s.policy("switch");
    let spec = |mode: &str| {
        let mut v = sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:1");
        v["mode"] = json!(mode);
        v["template"]["initContainers"] =
            json!([{"name": "native", "image": "registry.invalid/n:1", "restartPolicy": "Always"}]);
        v
    };
    s.apply(&name, spec("Webhook")).await?;
    wait_mode(&s.client, &name, Mode::Webhook).await?;
    let ns = s.app_namespace().await?;
    wait_injecting(&s.client, &ns.name, &[], "proxy").await?;

    let pods = ns.api::<Pod>();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let creator = {
        let (pods, stop) = (pods.clone(), stop.clone());
        tokio::spawn(async move {
            let mut created = Vec::new();
            let mut i = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                let p = pods
                    .create(
                        &PostParams::default(),
                        &pod(&format!("s-{i}"), &[("app", "s")]),
                    )
                    .await;
                created.push(p);
                i += 1;
            }
            created
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.apply(&name, spec("InTree")).await?;
    // The moment with both paths: the admission policy is written, the webhook configuration not
    // yet removed. Pods admitted now meet both, and still get each item once.
    wait_until(Duration::from_secs(30), "both paths in place", || async {
        Ok(in_tree_objects(&s.client, &name).await? == (true, true, true))
    })
    .await?;
    let both = ns.api::<Pod>();
    wait_dry_run(
        &both,
        &pod("both", &[]),
        Duration::from_secs(10),
        "in-tree in force",
        |p| p.annotations().get("splice.dev/status").is_some(),
    )
    .await?;
    for i in 0..5 {
        let p = both
            .create(&PostParams::default(), &pod(&format!("both-{i}"), &[]))
            .await?;
        let c = copies(&p, &["proxy"], &["native"]);
        ensure!(c.iter().all(|(_, n)| *n == 1), "with both paths: {c:?}");
    }
    ensure!(
        in_tree_objects(&s.client, &name).await? == (true, true, true),
        "the webhook configuration went before the pods were created with both paths"
    );
    wait_mode(&s.client, &name, Mode::InTree).await?;
    wait_until(
        Duration::from_secs(30),
        "webhook configuration gone",
        || async { Ok(in_tree_objects(&s.client, &name).await? == (true, true, false)) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.apply(&name, spec("Webhook")).await?;
    wait_mode(&s.client, &name, Mode::Webhook).await?;
    wait_until(Duration::from_secs(30), "in-tree objects gone", || async {
        Ok(in_tree_objects(&s.client, &name).await? == (false, false, true))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let created = creator.await?;
    let total = created.len();
    let mut refused = Vec::new();
    for r in &created {
        match r {
            Ok(p) => {
                let c = copies(p, &["proxy"], &["native"]);
                ensure!(c.iter().all(|(_, n)| *n == 1), "{}: {c:?}", p.name_any());
            }
            Err(e) => refused.push(e.to_string()),
        }
    }
    ensure!(
        refused.is_empty(),
        "{} creates refused: {refused:?}",
        refused.len()
    );
    ensure!(total >= 60, "only {total} pods created during the switches");
    println!("mode switch: {total} pods, each injected exactly once");
    Ok(())
}

#[tokio::test]
async fn two_in_tree_policies_and_a_webhook_policy_with_agnhost_add_label_inject_each_item_once_in_200_pods()
-> Result<()> {
    let s = Setup::start("intree-mix").await?;
    let ns = s.app_namespace().await?;
    let selector = json!({"matchLabels": {s.instance.clone(): "on"}});
    let (a, b, c) = (s.policy("a"), s.policy("b"), s.policy("c"));
    s.apply(
        &a,
        json!({"mode": "Auto", "namespaceSelector": selector, "reinvocationPolicy": "IfNeeded",
        "template": {"containers": [{"name": "sidecar-a", "image": "registry.invalid/a:1"}],
                     "env": [{"name": "FROM_A", "value": "{{ namespace.name }}"}],
                     "volumes": [{"name": "vol-a", "emptyDir": {}}]}}),
    )
    .await?;
    s.apply(&b, json!({"mode": "Auto", "namespaceSelector": selector, "reinvocationPolicy": "IfNeeded",
        "template": {"initContainers": [{"name": "init-b", "image": "registry.invalid/b:1", "restartPolicy": "Always"}],
                     "labels": {"injected-by-b": "yes"}}})).await?;
    s.apply(
        &c,
        json!({"mode": "Webhook", "namespaceSelector": selector, "reinvocationPolicy": "IfNeeded",
        "template": {"containers": [{"name": "sidecar-c", "image": "registry.invalid/c:1"}],
                     "env": [{"name": "FROM_C", "value": "1"}]}}),
    )
    .await?;
    wait_mode(&s.client, &a, Mode::InTree).await?;
    wait_mode(&s.client, &b, Mode::InTree).await?;
    wait_mode(&s.client, &c, Mode::Webhook).await?;

    let agnhost = AgnhostWebhook::start(&s.instance, &[]).await?;
    let foreign = format!("e2e-foreign-{}", s.instance);
    Api::<MutatingWebhookConfiguration>::all(s.client.clone())
        .create(
            &PostParams::default(),
            &MutatingWebhookConfiguration {
                metadata: ObjectMeta {
                    name: Some(foreign.clone()),
                    ..Default::default()
                },
                webhooks: Some(vec![MutatingWebhook {
                    name: "add-label.e2e.splice.dev".into(),
                    client_config: WebhookClientConfig {
                        url: Some(format!("https://127.0.0.1:{}/add-label", agnhost.port)),
                        ca_bundle: Some(k8s_openapi::ByteString(
                            agnhost.ca_pem.clone().into_bytes(),
                        )),
                        ..Default::default()
                    },
                    rules: Some(vec![RuleWithOperations {
                        api_groups: Some(vec![String::new()]),
                        api_versions: Some(vec!["v1".into()]),
                        operations: Some(vec!["CREATE".into()]),
                        resources: Some(vec!["pods".into()]),
                        scope: Some("Namespaced".into()),
                    }]),
                    namespace_selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([(s.instance.clone(), "on".to_owned())])),
                        ..Default::default()
                    }),
                    side_effects: "None".into(),
                    admission_review_versions: vec!["v1".into()],
                    failure_policy: Some("Fail".into()),
                    reinvocation_policy: Some("IfNeeded".into()),
                    timeout_seconds: Some(10),
                    ..Default::default()
                }]),
            },
        )
        .await?;
    let _foreign = WebhookConfigurationGuard(foreign);
    let pods = ns.api::<Pod>();
    wait_dry_run(
        &pods,
        &pod("probe", &[]),
        Duration::from_secs(30),
        "all four mutators",
        |p| {
            copies(p, &["sidecar-a", "sidecar-c"], &["init-b"])
                .iter()
                .all(|(_, n)| *n == 1)
                && p.labels().get("added-label").map(String::as_str) == Some("yes")
        },
    )
    .await?;

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut created = Vec::new();
    for i in 0..200 {
        let pods = pods.clone();
        tasks.spawn(async move {
            pods.create(
                &PostParams::default(),
                &pod(&format!("m-{i}"), &[("app", "m")]),
            )
            .await
        });
        if tasks.len() >= 8
            && let Some(r) = tasks.join_next().await
        {
            created.push(r??);
        }
    }
    while let Some(r) = tasks.join_next().await {
        created.push(r??);
    }
    println!(
        "200 pods through 2 in-tree policies, 1 Splice webhook and agnhost in {:?}",
        started.elapsed()
    );
    let stored = pods
        .list(&ListParams::default().labels("app=m"))
        .await?
        .items;
    ensure!(
        stored.len() == 200,
        "expected 200 pods, found {}",
        stored.len()
    );
    for p in &stored {
        let n = copies(p, &["app", "sidecar-a", "sidecar-c"], &["init-b"]);
        ensure!(n.iter().all(|(_, n)| *n == 1), "{}: {n:?}", p.name_any());
        let app = p
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().find(|c| c.name == "app"));
        let env: Vec<String> = app
            .and_then(|c| c.env.as_ref())
            .map(|e| e.iter().map(|v| v.name.clone()).collect())
            .unwrap_or_default();
        ensure!(
            env == ["FROM_A", "FROM_C"] || env == ["FROM_C", "FROM_A"],
            "{}: env {env:?}",
            p.name_any()
        );
        let record: Value = serde_json::from_str(
            p.annotations()
                .get("splice.dev/status")
                .map(String::as_str)
                .unwrap_or("{}"),
        )?;
        for policy in [&a, &b, &c] {
            ensure!(
                record.get(policy.as_str()).is_some(),
                "{}: no record of {policy}: {record}",
                p.name_any()
            );
        }
    }
    Ok(())
}
