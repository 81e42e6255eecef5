//! The operator against the real control plane: policies become webhooks the API server calls,
//! with status, drift repair, pausing, restarts and leader election.
//!
//! Each test runs its own `splice run` (own namespace, Lease and `--policy-selector`), so tests
//! never manage each other's cluster-scoped policies; every policy selects only namespaces labelled
//! for its test.

#[path = "../src/operator.rs"]
mod operator;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, WebhookClientConfig,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use operator::*;
use serde_json::json;
use splice_crds::{FailurePolicy, InjectionPolicy};
use splice_e2e::{
    AgnhostWebhook, TestNamespace, WebhookConfigurationGuard, dry_run, unique_suffix, wait_dry_run,
    wait_until,
};

fn pod_in(ns: &TestNamespace) -> Api<Pod> {
    ns.api::<Pod>()
}

#[tokio::test]
async fn an_applied_policy_gets_a_webhook_configuration_with_the_ca_bundle_and_exclusions_and_becomes_ready()
-> Result<()> {
    let s = Setup::start("apply").await?;
    let name = s.policy("mesh");
    s.apply(
        &name,
        sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:1"),
    )
    .await?;

    let p = wait_policy(&s.client, &name, "True", Duration::from_secs(30)).await?;
    let status = p.status.clone().unwrap_or_default();
    assert_eq!(status.observed_generation, p.metadata.generation);
    assert_eq!(
        status.webhook_configuration.as_deref(),
        Some(format!("splice-{name}").as_str())
    );
    assert_eq!(status.effective_failure_policy, Some(FailurePolicy::Ignore));
    assert!(
        status
            .template_hash
            .as_deref()
            .is_some_and(|h| !h.is_empty())
    );
    for (type_, expected) in [
        ("WebhookConfigured", "True"),
        ("FailClosed", "False"),
        ("Conflicted", "False"),
    ] {
        let c = condition(&p, type_).unwrap_or_else(|| panic!("{type_} missing"));
        assert_eq!(c.status, expected, "{type_}: {}", c.message);
        assert_eq!(c.observed_generation, p.metadata.generation, "{type_}");
    }

    let config = configuration(&s.client, &name)
        .await?
        .expect("the webhook configuration exists");
    assert_eq!(
        config
            .labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("splice")
    );
    let owner = &config.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("InjectionPolicy", name.as_str())
    );
    assert_eq!(Some(&owner.uid), p.metadata.uid.as_ref());
    assert_eq!(owner.controller, Some(true));

    let hooks = config.webhooks.clone().unwrap_or_default();
    assert_eq!(hooks.len(), 1);
    let hook = &hooks[0];
    assert_eq!(hook.name, format!("{name}.splice.dev"));
    assert_eq!(hook.failure_policy.as_deref(), Some("Ignore"));
    assert_eq!(hook.side_effects, "None");
    assert_eq!(hook.match_policy.as_deref(), Some("Equivalent"));
    assert_eq!(
        hook.client_config.url.as_deref(),
        Some(format!("https://127.0.0.1:{}/inject/{name}", s.splice.port).as_str())
    );

    // The caBundle is the CA kept in Splice's Secret.
    let secret: Secret = s
        .splice_ns
        .api::<Secret>()
        .get("splice-webhook-tls")
        .await?;
    let ca = secret
        .data
        .unwrap_or_default()
        .get("ca.crt")
        .cloned()
        .expect("ca.crt in the Secret");
    assert!(String::from_utf8_lossy(&ca.0).contains("BEGIN CERTIFICATE"));
    assert_eq!(hook.client_config.ca_bundle.as_ref(), Some(&ca));

    // The mandatory exclusions, on top of the policy's own selector.
    let ns_selector = hook.namespace_selector.clone().unwrap_or_default();
    assert_eq!(
        ns_selector
            .match_labels
            .unwrap_or_default()
            .get(&s.instance)
            .map(String::as_str),
        Some("on")
    );
    let excluded = ns_selector
        .match_expressions
        .unwrap_or_default()
        .into_iter()
        .find(|e| e.key == "kubernetes.io/metadata.name" && e.operator == "NotIn")
        .expect("a NotIn on the namespace name");
    let excluded = excluded.values.unwrap_or_default();
    for ns in ["kube-system", "kube-node-lease", s.splice_ns.name.as_str()] {
        assert!(
            excluded.iter().any(|e| e == ns),
            "{ns} excluded: {excluded:?}"
        );
    }
    let opt_out = hook
        .object_selector
        .clone()
        .unwrap_or_default()
        .match_expressions
        .unwrap_or_default()
        .into_iter()
        .find(|e| e.key == "splice.dev/inject")
        .expect("the opt-out requirement");
    assert_eq!(
        (
            opt_out.operator.as_str(),
            opt_out.values.unwrap_or_default()
        ),
        ("NotIn", vec!["false".to_owned()])
    );
    Ok(())
}

#[tokio::test]
async fn a_policy_requesting_fail_is_written_with_ignore_and_says_why() -> Result<()> {
    let s = Setup::start("failclosed").await?;
    let name = s.policy("strict");
    let mut spec = sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:1");
    spec["failurePolicy"] = json!("Fail");
    s.apply(&name, spec).await?;
    let p = wait_policy(&s.client, &name, "True", Duration::from_secs(30)).await?;
    assert_eq!(
        p.status.as_ref().and_then(|s| s.effective_failure_policy),
        Some(FailurePolicy::Ignore)
    );
    let fc = condition(&p, "FailClosed").expect("FailClosed");
    assert_eq!(
        (fc.status.as_str(), fc.reason.as_str()),
        // This test's Splice has no Deployment: the guard says so (e2e/tests/guard.rs covers the rest).
        ("False", "DeploymentNotFound")
    );
    assert!(fc.message.contains("Ignore"), "{}", fc.message);
    let config = configuration(&s.client, &name)
        .await?
        .expect("configuration");
    assert_eq!(
        config.webhooks.unwrap_or_default()[0]
            .failure_policy
            .as_deref(),
        Some("Ignore")
    );
    Ok(())
}

#[tokio::test]
async fn pods_are_injected_only_where_selected_and_never_in_kube_system() -> Result<()> {
    let s = Setup::start("select").await?;
    let selected = s.app_namespace().await?;
    let other = TestNamespace::create("e2e-app-other", &[]).await?;
    let scoped = s.policy("scoped");
    s.apply(
        &scoped,
        sidecar_spec(&s.instance, "scoped-proxy", "registry.invalid/proxy:1"),
    )
    .await?;
    // Selects every namespace; only pods carrying this test's label, so other tests are unaffected.
    let everywhere = s.policy("everywhere");
    s.apply(
        &everywhere,
        json!({
            "objectSelector": {"matchLabels": {"e2e-everywhere": s.instance.clone()}},
            "template": {"containers": [{"name": "everywhere", "image": "registry.invalid/e:1"}]}
        }),
    )
    .await?;
    wait_policy(&s.client, &scoped, "True", Duration::from_secs(30)).await?;
    wait_policy(&s.client, &everywhere, "True", Duration::from_secs(30)).await?;
    wait_injecting(&s.client, &selected.name, &[], "scoped-proxy").await?;
    let marked = [("e2e-everywhere", s.instance.as_str())];
    wait_injecting(&s.client, &other.name, &marked, "everywhere").await?;

    let injected = pod_in(&selected)
        .create(&PostParams::default(), &pod("injected", &[]))
        .await?;
    assert_eq!(container_names(&injected), ["app", "scoped-proxy"]);
    assert!(injected.annotations().contains_key("splice.dev/status"));

    let elsewhere = pod_in(&other)
        .create(&PostParams::default(), &pod("elsewhere", &[]))
        .await?;
    assert_eq!(container_names(&elsewhere), ["app"]);

    let opted_out = pod_in(&selected)
        .create(
            &PostParams::default(),
            &pod("opted-out", &[("splice.dev/inject", "false")]),
        )
        .await?;
    assert_eq!(container_names(&opted_out), ["app"]);

    // The policy that selects everything reaches pods in a namespace it was never told about...
    let marked_pod = pod_in(&other)
        .create(&PostParams::default(), &pod("marked", &marked))
        .await?;
    assert_eq!(container_names(&marked_pod), ["app", "everywhere"]);
    // ...but never kube-system.
    let kube_system: Api<Pod> = Api::namespaced(s.client.clone(), "kube-system");
    let system_name = format!("e2e-{}", s.instance);
    let system_pod = kube_system
        .create(&PostParams::default(), &pod(&system_name, &marked))
        .await?;
    let _ = kube_system
        .delete(&system_name, &DeleteParams::default().grace_period(0))
        .await;
    assert_eq!(container_names(&system_pod), ["app"]);
    assert!(!system_pod.annotations().contains_key("splice.dev/status"));
    Ok(())
}

#[tokio::test]
async fn a_server_side_dry_run_returns_the_injected_pod_creates_nothing_and_emits_no_event()
-> Result<()> {
    let s = Setup::start("dryrun").await?;
    let ns = s.app_namespace().await?;
    let name = s.policy("dry");
    s.apply(
        &name,
        sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:1"),
    )
    .await?;
    wait_policy(&s.client, &name, "True", Duration::from_secs(30)).await?;
    wait_injecting(&s.client, &ns.name, &[], "proxy").await?;

    let pods = pod_in(&ns);
    let dry = pods.create(&dry_run(), &pod("dry", &[])).await?;
    assert_eq!(container_names(&dry), ["app", "proxy"]);
    assert!(
        pods.get_opt("dry").await?.is_none(),
        "a dry run creates nothing"
    );

    // Give anything asynchronous a moment, then look for Events about the pod in both APIs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events: Vec<Event> = ns.api::<Event>().list(&ListParams::default()).await?.items;
    let about_pod = events
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("dry"))
        .count();
    let core: Vec<CoreEvent> = ns
        .api::<CoreEvent>()
        .list(&ListParams::default())
        .await?
        .items;
    let core_about_pod = core
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some("dry"))
        .count();
    assert_eq!(
        (about_pod, core_about_pod),
        (0, 0),
        "no Event for a dry run"
    );
    Ok(())
}

#[tokio::test]
async fn a_policy_update_changes_new_pods_and_leaves_existing_pods_alone() -> Result<()> {
    let s = Setup::start("update").await?;
    let ns = s.app_namespace().await?;
    let name = s.policy("versioned");
    s.apply(
        &name,
        sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:1"),
    )
    .await?;
    let v1 = wait_policy(&s.client, &name, "True", Duration::from_secs(30)).await?;
    wait_injecting(&s.client, &ns.name, &[], "proxy").await?;
    let pods = pod_in(&ns);
    let before = pods
        .create(&PostParams::default(), &pod("before", &[]))
        .await?;
    assert_eq!(
        image_of(&before, "proxy").as_deref(),
        Some("registry.invalid/proxy:1")
    );

    s.apply(
        &name,
        sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:2"),
    )
    .await?;
    let v2 = wait_policy(&s.client, &name, "True", Duration::from_secs(30)).await?;
    assert!(v2.metadata.generation > v1.metadata.generation);
    let hash = |p: &InjectionPolicy| p.status.as_ref().and_then(|s| s.template_hash.clone());
    assert_ne!(hash(&v1), hash(&v2), "a new template has a new hash");

    // Every replica's cache follows the policy through its own watch; a dry run shows when.
    wait_dry_run(
        &pods,
        &pod("probe", &[]),
        Duration::from_secs(10),
        "the new template to be served",
        |dry| image_of(dry, "proxy").as_deref() == Some("registry.invalid/proxy:2"),
    )
    .await?;
    let after = pods
        .create(&PostParams::default(), &pod("after", &[]))
        .await?;
    assert_eq!(
        image_of(&after, "proxy").as_deref(),
        Some("registry.invalid/proxy:2")
    );

    let before_now = pods.get("before").await?;
    assert_eq!(
        image_of(&before_now, "proxy").as_deref(),
        Some("registry.invalid/proxy:1")
    );
    assert_eq!(container_names(&before_now), ["app", "proxy"]);
    assert_eq!(
        before_now.annotations().get("splice.dev/status"),
        before.annotations().get("splice.dev/status"),
        "the existing pod's provenance is untouched"
    );
    Ok(())
}

#[tokio::test]
async fn two_policies_injecting_the_same_container_differently_are_both_marked_conflicted()
-> Result<()> {
    let s = Setup::start("conflict").await?;
    let a = s.policy("a");
    let b = s.policy("b");
    s.apply(
        &a,
        sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:1"),
    )
    .await?;
    s.apply(
        &b,
        sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:2"),
    )
    .await?;
    let api: Api<InjectionPolicy> = Api::all(s.client.clone());
    for (me, other) in [(&a, &b), (&b, &a)] {
        wait_until(
            Duration::from_secs(30),
            &format!("{me} to be Conflicted naming {other}"),
            || {
                let api = api.clone();
                async move {
                    let p = api.get(me).await?;
                    Ok(condition(&p, "Conflicted").is_some_and(|c| {
                        c.status == "True"
                            && c.message.contains(other.as_str())
                            && c.message.contains("proxy")
                    }))
                }
            },
        )
        .await?;
    }
    // Making the selectors disjoint resolves it for both.
    let mut disjoint = sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:2");
    disjoint["objectSelector"] = json!({"matchLabels": {"tier": "web"}});
    let mut other_side = sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:1");
    other_side["objectSelector"] = json!({"matchLabels": {"tier": "db"}});
    s.apply(&b, disjoint).await?;
    s.apply(&a, other_side).await?;
    for me in [&a, &b] {
        wait_until(
            Duration::from_secs(30),
            &format!("{me} to be no longer Conflicted"),
            || {
                let api = api.clone();
                async move {
                    let p = api.get(me).await?;
                    Ok(condition(&p, "Conflicted").is_some_and(|c| c.status == "False"))
                }
            },
        )
        .await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_template_that_does_not_compile_is_not_ready_and_says_why() -> Result<()> {
    // Without the validating webhook, which would refuse the policy at apply (e2e/tests/validate.rs).
    let s = Setup::start_with("invalid", &["--validating-webhook=false"]).await?;
    let name = s.policy("broken");
    s.apply(
        &name,
        sidecar_spec(&s.instance, "proxy", "registry.invalid/{{ values.image"),
    )
    .await?;
    let p = wait_policy(&s.client, &name, "False", Duration::from_secs(30)).await?;
    let ready = condition(&p, "Ready").expect("Ready");
    assert_eq!(ready.reason, "InvalidTemplate", "{}", ready.message);
    assert!(configuration(&s.client, &name).await?.is_none());
    Ok(())
}

/// Polls until the configuration of `policy` exists (or not); returns how long it took.
async fn wait_configuration(
    client: &Client,
    policy: &str,
    present: bool,
    timeout: Duration,
) -> Result<Duration> {
    let start = Instant::now();
    loop {
        if configuration(client, policy).await?.is_some() == present {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            bail!(
                "configuration of {policy} still {} after {timeout:?}",
                if present { "absent" } else { "present" }
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn hand_deleted_or_edited_configurations_return_paused_ones_stay_gone_and_deleted_policies_take_theirs_along()
-> Result<()> {
    let s = Setup::start("drift").await?;
    let name = s.policy("drift");
    s.apply(
        &name,
        sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:1"),
    )
    .await?;
    wait_policy(&s.client, &name, "True", Duration::from_secs(30)).await?;
    let configs: Api<MutatingWebhookConfiguration> = Api::all(s.client.clone());
    let config_name = format!("splice-{name}");
    let original = configs.get(&config_name).await?;

    // Deleted by hand: back within 5 s, as a new object.
    configs
        .delete(&config_name, &DeleteParams::default())
        .await?;
    wait_configuration(&s.client, &name, false, Duration::from_secs(5))
        .await
        .ok();
    let restored_in = wait_configuration(&s.client, &name, true, Duration::from_secs(5)).await?;
    let restored = configs.get(&config_name).await?;
    assert_ne!(restored.uid(), original.uid());
    println!("configuration deleted by hand restored in {restored_in:?}");

    // Edited by hand (failurePolicy flipped, exclusions dropped): restored within 5 s.
    let edit = json!({"webhooks": [{"name": format!("{name}.splice.dev"), "failurePolicy": "Fail",
                                     "namespaceSelector": {"matchExpressions": null}}]});
    configs
        .patch(
            &config_name,
            &PatchParams::default(),
            &Patch::Strategic(&edit),
        )
        .await?;
    let edited_at = Instant::now();
    wait_until(Duration::from_secs(5), "the edit to be reverted", || {
        let configs = configs.clone();
        let config_name = config_name.clone();
        async move {
            let c = configs.get(&config_name).await?;
            let hook = c
                .webhooks
                .unwrap_or_default()
                .into_iter()
                .next()
                .unwrap_or_default();
            Ok(hook.failure_policy.as_deref() == Some("Ignore")
                && hook
                    .namespace_selector
                    .and_then(|s| s.match_expressions)
                    .is_some_and(|e| !e.is_empty()))
        }
    })
    .await?;
    println!(
        "configuration edited by hand restored in {:?}",
        edited_at.elapsed()
    );

    // Paused: removed, and kept removed.
    let mut paused = sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:1");
    paused["paused"] = json!(true);
    s.apply(&name, paused).await?;
    let p = wait_policy(&s.client, &name, "False", Duration::from_secs(30)).await?;
    assert_eq!(
        condition(&p, "Ready").map(|c| c.reason.as_str()),
        Some("Paused")
    );
    assert_eq!(
        p.status
            .as_ref()
            .and_then(|s| s.webhook_configuration.clone()),
        None
    );
    wait_configuration(&s.client, &name, false, Duration::from_secs(5)).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        configuration(&s.client, &name).await?.is_none(),
        "a paused policy's configuration stays gone"
    );

    // Resumed, then deleted: the configuration goes with the policy.
    s.apply(
        &name,
        sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:1"),
    )
    .await?;
    wait_policy(&s.client, &name, "True", Duration::from_secs(30)).await?;
    wait_configuration(&s.client, &name, true, Duration::from_secs(5)).await?;
    let policies: Api<InjectionPolicy> = Api::all(s.client.clone());
    policies.delete(&name, &DeleteParams::default()).await?;
    let gone_in = wait_configuration(&s.client, &name, false, Duration::from_secs(30)).await?;
    println!("configuration of a deleted policy gone in {gone_in:?}");
    Ok(())
}

#[tokio::test]
async fn two_if_needed_policies_and_a_foreign_if_needed_webhook_inject_exactly_one_copy_into_each_of_200_pods()
-> Result<()> {
    let s = Setup::start("chain").await?;
    let ns = s.app_namespace().await?;
    let a = s.policy("a");
    let b = s.policy("b");
    s.apply(
        &a,
        json!({
            "namespaceSelector": {"matchLabels": {s.instance.clone(): "on"}},
            "reinvocationPolicy": "IfNeeded",
            "template": {
                "containers": [{"name": "sidecar-a", "image": "registry.invalid/a:1"}],
                "env": [{"name": "FROM_A", "value": "1"}],
                "volumes": [{"name": "vol-a", "emptyDir": {}}]
            }
        }),
    )
    .await?;
    s.apply(
        &b,
        json!({
            "namespaceSelector": {"matchLabels": {s.instance.clone(): "on"}},
            "reinvocationPolicy": "IfNeeded",
            "template": {
                "initContainers": [{"name": "init-b", "image": "registry.invalid/b:1", "restartPolicy": "Always"}],
                "labels": {"injected-by-b": "yes"}
            }
        }),
    )
    .await?;
    wait_policy(&s.client, &a, "True", Duration::from_secs(30)).await?;
    wait_policy(&s.client, &b, "True", Duration::from_secs(30)).await?;

    // agnhost's /add-label, registered as a foreign IfNeeded webhook on the same namespace: its
    // change makes the API server re-invoke both Splice webhooks.
    let agnhost = AgnhostWebhook::start(&s.instance, &[]).await?;
    let foreign_name = format!("e2e-foreign-{}", s.instance);
    let configs: Api<MutatingWebhookConfiguration> = Api::all(s.client.clone());
    configs
        .create(
            &PostParams::default(),
            &MutatingWebhookConfiguration {
                metadata: ObjectMeta {
                    name: Some(foreign_name.clone()),
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
    let _foreign = WebhookConfigurationGuard(foreign_name);

    // All three webhooks are live once a dry run shows all three changes.
    let pods = pod_in(&ns);
    wait_dry_run(
        &pods,
        &pod("probe", &[]),
        Duration::from_secs(30),
        "all three webhooks to be called",
        |dry| {
            container_names(dry).contains(&"sidecar-a".to_owned())
                && init_container_names(dry).contains(&"init-b".to_owned())
                && dry.labels().get("added-label").map(String::as_str) == Some("yes")
        },
    )
    .await?;

    let started = Instant::now();
    let mut created = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let pods = pods.clone();
        tasks.spawn(async move {
            pods.create(
                &PostParams::default(),
                &pod(&format!("p-{i}"), &[("app", "x")]),
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
        "200 pods through 3 IfNeeded webhooks in {:?}",
        started.elapsed()
    );

    let stored = pods
        .list(&ListParams::default().labels("app=x"))
        .await?
        .items;
    ensure!(
        stored.len() == 200,
        "expected 200 pods, found {}",
        stored.len()
    );
    for p in created.iter().chain(stored.iter()) {
        let containers = container_names(p);
        let inits = init_container_names(p);
        let count = |list: &[String], n: &str| list.iter().filter(|c| *c == n).count();
        assert_eq!(
            count(&containers, "app"),
            1,
            "{}: {containers:?}",
            p.name_any()
        );
        assert_eq!(
            count(&containers, "sidecar-a"),
            1,
            "{}: {containers:?}",
            p.name_any()
        );
        assert_eq!(containers.len(), 2, "{}: {containers:?}", p.name_any());
        assert_eq!(inits, ["init-b"], "{}", p.name_any());
        let spec = p.spec.clone().unwrap_or_default();
        let volumes: Vec<String> = spec
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.name)
            .collect();
        assert_eq!(
            volumes.iter().filter(|v| *v == "vol-a").count(),
            1,
            "{}: {volumes:?}",
            p.name_any()
        );
        let env: Vec<String> = spec.containers[0]
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(
            env.iter().filter(|e| *e == "FROM_A").count(),
            1,
            "{}: {env:?}",
            p.name_any()
        );
        assert_eq!(
            p.labels().get("added-label").map(String::as_str),
            Some("yes")
        );
        assert_eq!(
            p.labels().get("injected-by-b").map(String::as_str),
            Some("yes")
        );
    }
    Ok(())
}

#[tokio::test]
async fn splice_killed_with_sigkill_and_restarted_converges_without_duplicates_or_lost_state()
-> Result<()> {
    let mut s = Setup::start("restart").await?;
    let ns = s.app_namespace().await?;
    let names: Vec<String> = ["a", "b", "c"].iter().map(|n| s.policy(n)).collect();
    // Different timeouts: one configuration each (policies under the same terms would share one).
    let spec = |i: usize, image: &str| {
        let mut spec = sidecar_spec(&s.instance, &format!("proxy-{i}"), image);
        spec["timeoutSeconds"] = serde_json::json!(10 + i);
        spec
    };
    for (i, name) in names.iter().enumerate() {
        s.apply(name, spec(i, "registry.invalid/proxy:1")).await?;
    }
    for name in &names {
        wait_policy(&s.client, name, "True", Duration::from_secs(30)).await?;
    }
    let secrets = s.splice_ns.api::<Secret>();
    let secret_before = secrets.get("splice-webhook-tls").await?;
    let untouched_before = configuration(&s.client, &names[2])
        .await?
        .expect("configuration c");

    s.splice.kill();
    // While Splice is down: a policy changes and a configuration is deleted by hand.
    s.apply(&names[0], spec(0, "registry.invalid/proxy:2"))
        .await?;
    let configs: Api<MutatingWebhookConfiguration> = Api::all(s.client.clone());
    configs
        .delete(&format!("splice-{}", names[1]), &DeleteParams::default())
        .await?;

    let restarted_at = Instant::now();
    // The same webhook address, as a restarted pod behind its Service would have.
    let mut options = s.splice.options.clone();
    options.port = Some(s.splice.port);
    options.log_name.push_str("-restarted");
    s.splice = Splice::start(options).await?;
    for name in &names {
        let left = Duration::from_secs(30).saturating_sub(restarted_at.elapsed());
        wait_policy(&s.client, name, "True", left).await?;
    }
    wait_configuration(
        &s.client,
        &names[1],
        true,
        Duration::from_secs(30).saturating_sub(restarted_at.elapsed()),
    )
    .await?;
    wait_injecting(&s.client, &ns.name, &[], "proxy-0").await?;
    let probe = pod_in(&ns).create(&dry_run(), &pod("probe", &[])).await?;
    println!("converged {:?} after the restart", restarted_at.elapsed());
    assert!(restarted_at.elapsed() <= Duration::from_secs(30));
    assert_eq!(
        image_of(&probe, "proxy-0").as_deref(),
        Some("registry.invalid/proxy:2")
    );
    let mut containers = container_names(&probe);
    containers.sort();
    assert_eq!(containers, ["app", "proxy-0", "proxy-1", "proxy-2"]);

    // No duplicates, nothing lost: one configuration per policy, the same CA, the same Secret.
    let ours: Vec<MutatingWebhookConfiguration> = configs
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=splice"))
        .await?
        .items
        .into_iter()
        .filter(|c| c.owner_references().iter().any(|o| names.contains(&o.name)))
        .collect();
    assert_eq!(
        ours.len(),
        3,
        "{:?}",
        ours.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    );
    let secret_after = secrets.get("splice-webhook-tls").await?;
    assert_eq!(secret_after.uid(), secret_before.uid());
    assert_eq!(
        secret_after.data, secret_before.data,
        "the CA and serving certificate are reused"
    );
    let ca = secret_after.data.unwrap_or_default().get("ca.crt").cloned();
    for c in &ours {
        assert_eq!(
            c.webhooks.clone().unwrap_or_default()[0]
                .client_config
                .ca_bundle,
            ca
        );
    }
    let untouched_after = configuration(&s.client, &names[2])
        .await?
        .expect("configuration c");
    assert_eq!(untouched_after.uid(), untouched_before.uid());
    assert_eq!(
        untouched_after.resource_version(),
        untouched_before.resource_version(),
        "an up-to-date configuration is not rewritten after a restart"
    );
    // One election Lease; each replica also keeps a serving report (see controller/certs.rs).
    let leases = s
        .splice_ns
        .api::<Lease>()
        .list(&ListParams::default().labels("!splice.dev/replica-report"))
        .await?
        .items;
    assert_eq!(leases.len(), 1);
    Ok(())
}

fn holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref()?.holder_identity.clone()
}

#[tokio::test]
async fn when_the_leader_is_killed_the_other_replica_takes_over_and_the_follower_never_wrote()
-> Result<()> {
    let client = splice_e2e::client().await?;
    install_crd(&client).await?;
    let instance = format!("leader-{}", unique_suffix());
    let splice_ns = TestNamespace::create("e2e-splice", &[]).await?;
    let _cleanup = PolicyCleanup {
        instance: instance.clone(),
    };
    let (duration, renew, retry) = (6u64, 4u64, 1u64);
    let options = |who: &str| {
        let mut o = SpliceOptions::new(&splice_ns.name, &instance);
        o.identity = Some(format!("{instance}-{who}"));
        o.lease = Some((duration, renew, retry));
        o.log_name = format!("splice-{instance}-{who}");
        o
    };
    let mut first = Splice::start(options("first")).await?;
    let leases = splice_ns.api::<Lease>();
    let first_id = format!("{instance}-first");
    let second_id = format!("{instance}-second");
    wait_until(Duration::from_secs(20), "the first replica to lead", || {
        let leases = leases.clone();
        let first_id = first_id.clone();
        async move {
            Ok(leases
                .get_opt("splice-leader")
                .await?
                .as_ref()
                .and_then(holder)
                == Some(first_id))
        }
    })
    .await?;
    let second = Splice::start(options("second")).await?;

    let name = format!("{instance}-p");
    apply_policy(
        &client,
        &instance,
        &name,
        sidecar_spec(&instance, "proxy", "registry.invalid/proxy:1"),
    )
    .await?;
    wait_policy(&client, &name, "True", Duration::from_secs(30)).await?;
    let url = |c: &MutatingWebhookConfiguration| {
        c.webhooks.clone().unwrap_or_default()[0]
            .client_config
            .url
            .clone()
    };
    let config = configuration(&client, &name).await?.expect("configuration");
    assert_eq!(
        url(&config),
        Some(format!("https://127.0.0.1:{}/inject/{name}", first.port))
    );

    // The follower serves the webhook but reconciles nothing and writes nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        holder(&leases.get("splice-leader").await?),
        Some(first_id.clone())
    );
    let follower_metrics = second.metrics().await?;
    assert!(
        !follower_metrics
            .lines()
            .any(|l| l.starts_with("splice_reconcile_total{")),
        "the follower reconciled: {follower_metrics}"
    );
    // A policy becoming Ready is not an Event; a repaired configuration is (a Warning). Both
    // replicas see the deletion; only the leader may repair it and say so.
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    configurations
        .delete(&format!("splice-{name}"), &DeleteParams::default())
        .await?;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let about_policy = || {
        let events = events.clone();
        let name = name.clone();
        async move {
            let items: Vec<Event> = events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
                })
                .collect();
            anyhow::Ok(items)
        }
    };
    let restored_by = |events: &[Event], id: &str| {
        events
            .iter()
            .filter(|e| {
                e.reporting_instance.as_deref() == Some(id)
                    && e.reason.as_deref() == Some("WebhookConfigurationRestored")
                    && e.type_.as_deref() == Some("Warning")
            })
            .count()
    };
    wait_until(
        Duration::from_secs(20),
        "the leader to restore the configuration and publish a Warning",
        || {
            let first_id = first_id.clone();
            async move { Ok(restored_by(&about_policy().await?, &first_id) > 0) }
        },
    )
    .await?;
    // Give a follower that (wrongly) acted on the same deletion time to show it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let about_policy = about_policy().await?;
    let by = |id: &str| {
        about_policy
            .iter()
            .filter(|e| e.reporting_instance.as_deref() == Some(id))
            .count()
    };
    assert!(by(&first_id) > 0, "the leader published the repair Warning");
    assert_eq!(by(&second_id), 0, "the follower published Events");
    // Configurations and status carry only the shared field manager; the follower's silence
    // shows in its metrics (no reconcile, above) and in the Events (none under its name).

    let last_renewal = leases
        .get("splice-leader")
        .await?
        .spec
        .and_then(|s| s.renew_time)
        .map(|t| t.0);
    first.kill();
    let killed_at = Instant::now();
    wait_until(
        Duration::from_secs(duration + 2 * retry + 5),
        "the second replica to lead",
        || {
            let leases = leases.clone();
            let second_id = second_id.clone();
            async move {
                Ok(leases
                    .get_opt("splice-leader")
                    .await?
                    .as_ref()
                    .and_then(holder)
                    == Some(second_id))
            }
        },
    )
    .await?;
    let took_over_in = killed_at.elapsed();
    let lease = leases.get("splice-leader").await?;
    let acquired = lease
        .spec
        .as_ref()
        .and_then(|s| s.acquire_time.as_ref())
        .map(|t| t.0);
    if let (Some(renewed), Some(acquired)) = (last_renewal, acquired) {
        println!(
            "takeover: {took_over_in:?} after SIGKILL; {:?} from the dead leader's last renewal to the new \
             leader's acquisition (lease duration {duration}s, retry period {retry}s)",
            acquired.duration_since(renewed)
        );
    }
    assert!(
        took_over_in <= Duration::from_secs(duration + 2 * retry),
        "takeover took {took_over_in:?}"
    );

    // The new leader acts: the configuration now points at its own URL.
    wait_until(
        Duration::from_secs(15),
        "the new leader to rewrite the configuration",
        || {
            let client = client.clone();
            let name = name.clone();
            let expected = format!("https://127.0.0.1:{}/inject/{name}", second.port);
            async move {
                Ok(configuration(&client, &name).await?.and_then(|c| url(&c)) == Some(expected))
            }
        },
    )
    .await?;
    wait_policy(&client, &name, "True", Duration::from_secs(10)).await?;
    Ok(())
}
