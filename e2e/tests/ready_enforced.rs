//! Ready means the API server enforces the policy (issue 42): `kubectl apply`, `kubectl wait
//! --for=condition=Ready`, then a pod created at once is injected, in either mode and after a
//! template change; a pod that still slips through is counted missed and named in an Event. Also
//! measures what the API server itself takes to load a MutatingAdmissionPolicy and a webhook
//! configuration, the facts behind Ready's evidence (`target/e2e-logs/ready_enforced-report.txt`).

#[path = "../src/operator.rs"]
mod operator;

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, MutatingWebhook,
    MutatingWebhookConfiguration, RuleWithOperations, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use operator::*;
use serde_json::{Value, json};
use splice_crds::InjectionPolicy;
use splice_e2e::{AgnhostWebhook, TestNamespace, WebhookConfigurationGuard, dry_run, report};

const REPORT: &str = "ready_enforced";

fn summary(what: &str, mut samples: Vec<Duration>) -> String {
    samples.sort();
    format!(
        "{what}: n={} p50={:.0} ms p99={:.0} ms max={:.0} ms",
        samples.len(),
        splice_e2e::quantile(&samples, 0.5).as_secs_f64() * 1000.0,
        splice_e2e::quantile(&samples, 0.99).as_secs_f64() * 1000.0,
        samples.last().copied().unwrap_or_default().as_secs_f64() * 1000.0
    )
}

/// Dry-run creates of a labelled pod every 10 ms until `done` holds for the returned pod; the
/// time from `since`.
async fn until_admitted_as(
    pods: &Api<Pod>,
    since: Instant,
    done: impl Fn(&Pod) -> bool,
) -> Result<Duration> {
    let probe = pod("load", &[("app", "load")]);
    while since.elapsed() < Duration::from_secs(30) {
        if let Ok(created) = pods.create(&dry_run(), &probe).await
            && done(&created)
        {
            return Ok(since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("not enforced within 30 s")
}

fn label_of(pod: &Pod, key: &str) -> Option<String> {
    pod.labels().get(key).cloned()
}

/// A MutatingAdmissionPolicy that labels pods `e2e-load=<value>` in namespaces labelled
/// `<key>=on`, and its binding.
fn labelling_policy(name: &str, key: &str, value: &str) -> Result<(Value, Value)> {
    let selector = json!({"matchLabels": {key: "on"}});
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "matchConstraints": {
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["pods"]}],
                "namespaceSelector": selector,
            },
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {
                "expression": format!(
                    "Object{{metadata: Object.metadata{{labels: {{\"e2e-load\": \"{value}\"}}}}}}"
                ),
            }}],
        }
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "matchResources": {"namespaceSelector": selector}},
    });
    Ok((policy, binding))
}

/// The cause of the issue, measured: after its write, the API server enforces a new or changed
/// MutatingAdmissionPolicy only at its policy source's next refresh (a 1 s ticker), while a
/// webhook configuration is called within milliseconds.
#[tokio::test]
async fn the_api_server_enforces_an_admission_policy_up_to_a_second_after_its_write_a_webhook_at_once()
-> Result<()> {
    let key = format!("e2e-load-{}", splice_e2e::unique_suffix());
    let ns = TestNamespace::create("e2e-load", &[(&key, "on")]).await?;
    let pods: Api<Pod> = ns.api();
    let maps: Api<MutatingAdmissionPolicy> = Api::all(ns.client.clone());
    let bindings: Api<MutatingAdmissionPolicyBinding> = Api::all(ns.client.clone());
    let name = key.clone();
    let cleanup = || async {
        let _ = bindings.delete(&name, &DeleteParams::default()).await;
        let _ = maps.delete(&name, &DeleteParams::default()).await;
    };
    const TRIES: usize = 15;
    let (mut new, mut changed) = (Vec::new(), Vec::new());
    let mut first_dry_run_missed = 0;
    for i in 0..TRIES {
        let (policy, binding) = labelling_policy(&name, &key, &format!("new-{i}"))?;
        maps.create(&PostParams::default(), &serde_json::from_value(policy)?)
            .await?;
        bindings
            .create(&PostParams::default(), &serde_json::from_value(binding)?)
            .await?;
        let written = Instant::now();
        let want = format!("new-{i}");
        let first = pods
            .create(&dry_run(), &pod("load", &[("app", "load")]))
            .await?;
        if label_of(&first, "e2e-load").as_deref() != Some(&want) {
            first_dry_run_missed += 1;
        }
        new.push(
            until_admitted_as(&pods, written, |p| {
                label_of(p, "e2e-load").as_deref() == Some(&want)
            })
            .await
            .with_context(|| format!("new policy, try {i}"))?,
        );
        // A changed expression: the old one applies until the refresh.
        let mut current = maps.get(&name).await?;
        let (policy, _) = labelling_policy(&name, &key, &format!("changed-{i}"))?;
        let spec: MutatingAdmissionPolicy = serde_json::from_value(policy)?;
        current.spec = spec.spec;
        maps.replace(&name, &PostParams::default(), &current)
            .await?;
        let written = Instant::now();
        let want = format!("changed-{i}");
        changed.push(
            until_admitted_as(&pods, written, |p| {
                label_of(p, "e2e-load").as_deref() == Some(&want)
            })
            .await
            .with_context(|| format!("changed policy, try {i}"))?,
        );
        cleanup().await;
        // The deletion too is seen at a refresh; the next try starts from none.
        until_admitted_as(&pods, Instant::now(), |p| label_of(p, "e2e-load").is_none()).await?;
    }
    report(
        REPORT,
        format!(
            "MutatingAdmissionPolicy + binding created, then dry runs every 10 ms: the first \
             dry run right after the write came back without the mutation in {first_dry_run_missed} \
             of {TRIES}"
        ),
    );
    report(
        REPORT,
        summary("MutatingAdmissionPolicy created -> enforced", new.clone()),
    );
    report(
        REPORT,
        summary(
            "MutatingAdmissionPolicy changed -> enforced",
            changed.clone(),
        ),
    );

    // A webhook configuration, for comparison (agnhost's /add-label webhook).
    let agnhost = AgnhostWebhook::start(&key, &[]).await?;
    let configs: Api<MutatingWebhookConfiguration> = Api::all(ns.client.clone());
    let mut webhook = Vec::new();
    for i in 0..TRIES {
        let config_name = format!("{key}-{i}");
        let config = MutatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(config_name.clone()),
                ..Default::default()
            },
            webhooks: Some(vec![MutatingWebhook {
                name: "load.e2e.splice.dev".into(),
                client_config: WebhookClientConfig {
                    url: Some(format!("https://127.0.0.1:{}/add-label", agnhost.port)),
                    ca_bundle: Some(k8s_openapi::ByteString(agnhost.ca_pem.clone().into_bytes())),
                    ..Default::default()
                },
                rules: Some(vec![RuleWithOperations {
                    api_groups: Some(vec!["".into()]),
                    api_versions: Some(vec!["v1".into()]),
                    operations: Some(vec!["CREATE".into()]),
                    resources: Some(vec!["pods".into()]),
                    scope: Some("Namespaced".into()),
                }]),
                namespace_selector: Some(LabelSelector {
                    match_labels: Some([(key.clone(), "on".to_owned())].into()),
                    ..Default::default()
                }),
                side_effects: "None".into(),
                admission_review_versions: vec!["v1".into()],
                failure_policy: Some("Fail".into()),
                timeout_seconds: Some(10),
                ..Default::default()
            }]),
        };
        configs.create(&PostParams::default(), &config).await?;
        let _guard = WebhookConfigurationGuard(config_name.clone());
        let written = Instant::now();
        webhook.push(
            until_admitted_as(&pods, written, |p| p.labels().contains_key("added-label")).await?,
        );
        configs
            .delete(&config_name, &DeleteParams::default())
            .await?;
        until_admitted_as(&pods, Instant::now(), |p| {
            !p.labels().contains_key("added-label")
        })
        .await?;
    }
    report(
        REPORT,
        summary("MutatingWebhookConfiguration created -> called", webhook),
    );
    // What the settle time (policy::enforcement::SETTLE, 3 s) rests on.
    let slowest = new
        .iter()
        .chain(&changed)
        .max()
        .copied()
        .unwrap_or_default();
    ensure!(
        slowest < Duration::from_secs(3),
        "an admission policy took {slowest:?} to load: more than the 3 s settle time Ready \
         falls back on"
    );
    Ok(())
}

/// The policy, as a user keeps it in a file.
fn policy_yaml(name: &str, instance: &str, key: &str, mode: &str, image: &str) -> String {
    format!(
        "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata:\n  name: {name}\n  \
         labels: {{{INSTANCE_LABEL}: {instance}}}\nspec:\n  mode: {mode}\n  namespaceSelector: \
         {{matchLabels: {{{key}: \"on\"}}}}\n  template:\n    initContainers:\n    - name: \
         proxy\n      image: {image}\n      restartPolicy: Always\n"
    )
}

/// `kubectl apply -f -` then `kubectl wait --for=condition=Ready`: the user's script; the time
/// from the apply to the wait's return.
fn apply_and_wait(name: &str, yaml: &str) -> Result<Duration> {
    let bin = splice_e2e::controlplane_bin_dir()?.join("kubectl");
    let started = Instant::now();
    splice_e2e::run_tool(&bin, &["apply", "-f", "-"], Some(yaml))?;
    kubectl(&[
        "wait",
        "--for=condition=Ready",
        &format!("injectionpolicy/{name}"),
        "--timeout=60s",
    ])?;
    Ok(started.elapsed())
}

fn injected_image(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .init_containers
        .as_ref()?
        .iter()
        .find(|c| c.name == "proxy")?
        .image
        .clone()
}

#[tokio::test]
async fn a_pod_created_right_after_kubectl_wait_ready_is_injected_in_either_mode() -> Result<()> {
    let s = Setup::start("ready").await?;
    const TRIES: usize = 50;
    for mode in ["InTree", "Webhook"] {
        let mut uninjected = Vec::new();
        let mut ready_after = Vec::new();
        let mut evidence = std::collections::BTreeMap::<String, usize>::new();
        for i in 0..TRIES {
            let key = format!("{}-{}{i}", s.instance, mode.to_lowercase());
            let ns = TestNamespace::create("e2e-ready", &[(&key, "on")]).await?;
            let name = s.policy(&format!("{}{i}", mode.to_lowercase()));
            let yaml = policy_yaml(&name, &s.instance, &key, mode, "registry.invalid/proxy:1");
            ready_after.push(apply_and_wait(&name, &yaml)?);
            let created = ns
                .api::<Pod>()
                .create(&PostParams::default(), &pod("app", &[]))
                .await?;
            if injected_image(&created).is_none() {
                uninjected.push(format!("{}/app", ns.name));
            }
            let policies: Api<InjectionPolicy> = Api::all(s.client.clone());
            let p = policies.get(&name).await?;
            let status = p.status.clone().unwrap_or_default();
            ensure!(
                status.mode.map(|m| m.as_str().to_owned()).as_deref() == Some(mode),
                "policy {name} runs as {:?}, not {mode}",
                status.mode
            );
            let kind = match status.enforcement {
                Some(e) if Some(e.observed_generation) == p.metadata.generation => e.evidence,
                Some(_) => "another generation's".to_owned(),
                None => "none".to_owned(),
            };
            *evidence.entry(kind).or_default() += 1;
            policies.delete(&name, &DeleteParams::default()).await?;
        }
        report(
            REPORT,
            format!(
                "{mode}: apply, kubectl wait Ready, create a pod at once: {} of {TRIES} \
                 uninjected; evidence {evidence:?}",
                uninjected.len()
            ),
        );
        report(
            REPORT,
            summary(&format!("{mode}: apply -> Ready"), ready_after),
        );
        ensure!(
            uninjected.is_empty(),
            "{mode}: uninjected pods {uninjected:?}"
        );
        ensure!(
            evidence.get("Probe") == Some(&TRIES),
            "{mode}: Ready rests on a dry-run pod in a selected namespace: {evidence:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn after_kubectl_wait_ready_at_the_new_generation_a_pod_never_gets_the_previous_template()
-> Result<()> {
    let s = Setup::start("ready-change").await?;
    let ns = s.app_namespace().await?;
    let name = s.policy("mesh");
    const TRIES: usize = 50;
    let mut stale = Vec::new();
    let mut ready_after = Vec::new();
    let mut previous_ready_kept = 0;
    let policies: Api<InjectionPolicy> = Api::all(s.client.clone());
    let yaml = |i: usize| {
        policy_yaml(
            &name,
            &s.instance,
            &s.instance,
            "Auto",
            &format!("registry.invalid/proxy:v{i}"),
        )
    };
    apply_and_wait(&name, &yaml(0))?;
    for i in 1..=TRIES {
        let want = format!("registry.invalid/proxy:v{i}");
        let started = Instant::now();
        let bin = splice_e2e::controlplane_bin_dir()?.join("kubectl");
        splice_e2e::run_tool(&bin, &["apply", "-f", "-"], Some(&yaml(i)))?;
        // Right after the apply, Ready still reports the generation in force, True.
        let p = policies.get(&name).await?;
        if let Some(r) = condition(&p, "Ready")
            && r.status == "True"
            && r.observed_generation < p.metadata.generation
        {
            previous_ready_kept += 1;
        }
        kubectl(&[
            "wait",
            "--for=condition=Ready",
            &format!("injectionpolicy/{name}"),
            "--timeout=60s",
        ])?;
        ready_after.push(started.elapsed());
        let created = ns
            .api::<Pod>()
            .create(&PostParams::default(), &pod(&format!("app-{i}"), &[]))
            .await?;
        if injected_image(&created).as_deref() != Some(want.as_str()) {
            stale.push(format!(
                "{}: {:?}",
                created.name_any(),
                injected_image(&created)
            ));
        }
    }
    let mode = policies
        .get(&name)
        .await?
        .status
        .and_then(|s| s.mode)
        .map(|m| m.as_str().to_owned());
    report(
        REPORT,
        format!(
            "template change ({mode:?}): apply, kubectl wait Ready, create a pod at once: {} of \
             {TRIES} with another template; Ready seen True for the earlier generation right \
             after the apply in {previous_ready_kept}",
            stale.len()
        ),
    );
    report(
        REPORT,
        summary("template change: apply -> Ready", ready_after),
    );
    ensure!(stale.is_empty(), "pods with another template: {stale:?}");
    Ok(())
}

#[tokio::test]
async fn a_pod_that_slips_through_right_after_ready_is_counted_missed_and_named() -> Result<()> {
    let s = Setup::start("ready-missed").await?;
    let ns = s.app_namespace().await?;
    let name = s.policy("mesh");
    let mut spec = sidecar_spec(&s.instance, "proxy", "registry.invalid/proxy:1");
    spec["timeoutSeconds"] = json!(2);
    s.apply(&name, spec).await?;
    wait_policy(&s.client, &name, "True", Duration::from_secs(60)).await?;
    // Splice hangs right after Ready: the API server gives up on the webhook (Ignore) and
    // admits the pod uninjected, well within the 10 s coverage used to forgive.
    signal(&s.splice, "STOP")?;
    let created = ns
        .api::<Pod>()
        .create(&PostParams::default(), &pod("slipped", &[]))
        .await;
    signal(&s.splice, "CONT")?;
    let created = created?;
    ensure!(
        !container_names(&created).contains(&"proxy".to_owned()),
        "the pod was injected after all"
    );
    let named = format!("{}/slipped", ns.name);
    let policies: Api<InjectionPolicy> = Api::all(s.client.clone());
    splice_e2e::wait_until(
        Duration::from_secs(60),
        "coverage to count it missed",
        || async {
            let p = policies.get(&name).await?;
            Ok(p.status
                .and_then(|s| s.coverage)
                .is_some_and(|c| c.missed >= 1))
        },
    )
    .await?;
    splice_e2e::wait_until(
        Duration::from_secs(30),
        "a PodsMissed Event naming it",
        || async {
            let notes = event_notes(&s.client, &name, "PodsMissed").await?;
            Ok(notes.iter().any(|n| n.contains(&named)))
        },
    )
    .await?;
    Ok(())
}
