//! `spec.overrides` on the real API server: a value comes from the pod's annotation, else its
//! namespace's, else the default; a pod whose annotation fails its rule is denied with the
//! annotation, the value and the rule's message, under `failurePolicy: Ignore`; a namespace value
//! that fails gives the default and is named in the OverridesAccepted condition; `splice explain`
//! names each value's origin and `splice inject` renders offline what the API server stored; and,
//! on the real node, a namespace value change outdates the pods that took it and the rollout
//! restarts their Deployments, and so does the next change.

#[path = "../src/operator.rs"]
mod operator;

use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use operator::*;
use serde_json::{Value, json};
use splice_crds::InjectionPolicy;
use splice_e2e::{TestNamespace, dry_run, real_node, wait_until};

const CPU: &str = "mesh.example/proxy-cpu";
const LEVEL: &str = "mesh.example/log-level";

/// The policy the engine's, the server's and the CLI's tests read, limited to this test's
/// namespaces.
fn overrides_spec(instance: &str) -> Result<Value> {
    let policy: Value =
        serde_yaml::from_str(include_str!("../../webhook/testdata/policy-overrides.yaml"))?;
    let mut spec = policy["spec"].clone();
    spec["namespaceSelector"] = json!({"matchLabels": {instance: "on"}});
    spec["failurePolicy"] = json!("Ignore");
    Ok(spec)
}

async fn annotate(client: &kube::Client, namespace: &str, annotations: Value) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    api.patch(
        namespace,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
    )
    .await?;
    Ok(())
}

fn web(cpu: Option<&str>) -> Pod {
    let mut p = pod("web", &[("app", "web")]);
    if let Some(cpu) = cpu {
        p.annotations_mut().insert(CPU.into(), cpu.into());
    }
    p
}

/// The injected proxy's CPU request and log-level argument.
fn proxy_of(p: &Pod) -> (String, String) {
    let v = serde_json::to_value(p).unwrap_or_default();
    let proxy = &v["spec"]["initContainers"][0];
    (
        proxy["resources"]["requests"]["cpu"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        proxy["args"][0].as_str().unwrap_or_default().to_owned(),
    )
}

/// Where each override's value came from, as `splice.dev/status` records it.
fn origins(p: &Pod, policy: &str) -> Value {
    p.annotations()
        .get("splice.dev/status")
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
        .map(|s| s[policy]["overrides"].clone())
        .unwrap_or_default()
}

/// Waits until the API server's dry run of `pod` gets the proxy `(cpu, args)`.
async fn wait_proxy(pods: &Api<Pod>, pod: &Pod, want: (&str, &str)) -> Result<Pod> {
    let mut last = None;
    for _ in 0..300 {
        let created = pods.create(&dry_run(), pod).await?;
        let got = proxy_of(&created);
        if (got.0.as_str(), got.1.as_str()) == want {
            return Ok(created);
        }
        last = Some(got);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the dry run never got the proxy {want:?}; last {last:?}")
}

#[tokio::test]
async fn a_value_comes_from_the_pod_then_the_namespace_then_the_default_and_a_bad_one_is_denied()
-> Result<()> {
    let s = Setup::start("overrides").await?;
    let _validating = ValidatingCleanup(s.splice_ns.name.clone());
    let app = s.app_namespace().await?;
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &app.name);
    let name = s.policy("proxy");
    s.apply(&name, overrides_spec(&s.instance)?).await?;
    wait_policy(&s.client, &name, "True", Duration::from_secs(60)).await?;

    // The default, then the namespace's value, then the pod's own.
    let created = wait_proxy(&pods, &web(None), ("100m", "--log-level=info")).await?;
    assert_eq!(origins(&created, &name)["proxyCPU"]["from"], "default");
    annotate(&s.client, &app.name, json!({CPU: "300m", LEVEL: "debug"})).await?;
    let created = wait_proxy(&pods, &web(None), ("300m", "--log-level=debug")).await?;
    assert_eq!(origins(&created, &name)["proxyCPU"]["from"], "namespace");
    let created = pods.create(&dry_run(), &web(Some("200m"))).await?;
    assert_eq!(
        proxy_of(&created),
        ("200m".into(), "--log-level=debug".into())
    );
    assert_eq!(origins(&created, &name)["proxyCPU"]["from"], "pod");
    assert_eq!(origins(&created, &name)["logLevel"]["from"], "namespace");

    // A pod's value outside the rule: denied, though the policy fails open.
    let denied = pods
        .create(&PostParams::default(), &web(Some("2")))
        .await
        .err()
        .context("a pod asking for 2 CPUs was admitted")?
        .to_string();
    for part in [CPU, "\"2\"", "at most 1 CPU", &name] {
        ensure!(
            denied.contains(part),
            "the denial {denied:?} lacks {part:?}"
        );
    }

    // A namespace's value outside the rule: the default, no pod refused, the policy says so.
    annotate(&s.client, &app.name, json!({LEVEL: "trace"})).await?;
    wait_proxy(&pods, &web(None), ("300m", "--log-level=info")).await?;
    let policies: Api<InjectionPolicy> = Api::all(s.client.clone());
    wait_until(
        Duration::from_secs(60),
        "OverridesAccepted=False naming the namespace",
        || async {
            let p = policies.get(&name).await?;
            Ok(condition(&p, "OverridesAccepted").is_some_and(|c| {
                c.status == "False"
                    && c.reason == "NamespaceValueRefused"
                    && c.message.contains(&format!("namespace {}", app.name))
                    && c.message.contains("\"trace\"")
            }))
        },
    )
    .await?;
    ensure!(
        event_notes(&s.client, &name, "OverrideRefused")
            .await?
            .iter()
            .any(|n| n.contains(&app.name)),
        "no OverrideRefused Event names {}",
        app.name
    );
    annotate(&s.client, &app.name, json!({LEVEL: "debug"})).await?;
    wait_until(
        Duration::from_secs(60),
        "OverridesAccepted=True",
        || async {
            let p = policies.get(&name).await?;
            Ok(condition(&p, "OverridesAccepted").is_some_and(|c| c.status == "True"))
        },
    )
    .await?;

    // A stored pod: explain names each value's origin, and the CLI renders it alike offline.
    wait_proxy(&pods, &web(Some("250m")), ("250m", "--log-level=debug")).await?;
    let stored = pods
        .create(&PostParams::default(), &web(Some("250m")))
        .await?;
    let (text, _) = explain_online("web", &app.name, &s.splice_ns.name)?;
    for line in [
        format!("proxyCPU = \"250m\" (from the pod's annotation {CPU})"),
        format!(
            "logLevel = \"debug\" (from namespace {}'s annotation {LEVEL})",
            app.name
        ),
    ] {
        ensure!(text.contains(&line), "explain lacks {line:?}: {text}");
    }

    let dir = tempfile_dir()?;
    let policy_file = dir.join("policy.yaml");
    let policy = policies.get(&name).await?;
    std::fs::write(&policy_file, serde_yaml::to_string(&policy)?)?;
    let pod_file = dir.join("pod.yaml");
    std::fs::write(&pod_file, serde_yaml::to_string(&web(Some("250m")))?)?;
    let offline = std::process::Command::new(splice_bin()?)
        .args(["inject", "-o", "json", "-p"])
        .arg(&policy_file)
        .arg("-f")
        .arg(&pod_file)
        .args(["--namespace", &app.name, "--namespace-annotation"])
        .arg(format!("{LEVEL}=debug"))
        .arg("--namespace-label")
        .arg(format!("{}=on", s.instance))
        .output()?;
    ensure!(
        offline.status.success(),
        "splice inject failed: {}",
        String::from_utf8_lossy(&offline.stderr)
    );
    let rendered: Pod = serde_json::from_slice(&offline.stdout)?;
    ensure!(
        proxy_of(&rendered) == proxy_of(&stored),
        "offline {:?} differs from the API server's {:?}",
        proxy_of(&rendered),
        proxy_of(&stored)
    );
    ensure!(origins(&rendered, &name) == origins(&stored, &name));

    // Checked at apply: a rule that does not compile is refused, naming the field (the API
    // server loads the validating configuration asynchronously, hence the wait).
    let mut bad = overrides_spec(&s.instance)?;
    bad["overrides"][0]["rule"] = json!("quantity(self) <");
    let refused = s.policy("bad");
    wait_until(
        Duration::from_secs(60),
        "a bad rule to be refused at apply",
        || {
            let (client, instance, refused, bad) = (
                s.client.clone(),
                s.instance.clone(),
                refused.clone(),
                bad.clone(),
            );
            async move {
                Ok(try_apply_policy(&client, &instance, &refused, &bad, true)
                    .await
                    .err()
                    .is_some_and(|m| m.contains("spec.overrides[0].rule")))
            }
        },
    )
    .await?;
    Ok(())
}

fn tempfile_dir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "splice-e2e-overrides-{}",
        splice_e2e::unique_suffix()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The injected sidecar's `LOG_LEVEL` in every pod of `ns`, when each has the sidecar.
async fn levels(ns: &TestNamespace) -> Result<Vec<String>> {
    let list = ns.api::<Pod>().list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .map(|p| {
            let v = serde_json::to_value(p).unwrap_or_default();
            v["spec"]["containers"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["name"] == ROLLOUT_SIDECAR))
                .and_then(|c| c["env"][0]["value"].as_str())
                .unwrap_or("none")
                .to_owned()
        })
        .collect())
}

#[tokio::test]
async fn a_namespace_value_change_outdates_the_pods_that_took_it_and_the_rollout_restarts_them()
-> Result<()> {
    let s = Setup::start("overrides-rollout").await?;
    let _validating = ValidatingCleanup(s.splice_ns.name.clone());
    real_node(&s.client).await?;
    let ns = TestNamespace::create("e2e-overrides", &[(&s.instance, "on")]).await?;
    annotate(&s.client, &ns.name, json!({LEVEL: "debug"})).await?;
    let name = s.policy("level");
    let spec = json!({
        "namespaceSelector": {"matchLabels": {&s.instance: "on"}},
        "overrides": [{
            "name": "logLevel", "annotation": LEVEL, "type": "string", "default": "info",
            "rule": "self in ['debug', 'info', 'warn']", "from": ["Namespace"],
        }],
        "template": {"containers": [{
            "name": ROLLOUT_SIDECAR,
            "image": TESTAPP,
            "imagePullPolicy": "Never",
            "args": ["sleep"],
            "env": [{"name": "LOG_LEVEL", "value": "{{ overrides.logLevel }}"}],
        }]},
        "rollout": {"maxConcurrent": 2, "maxConcurrentPerNamespace": 2, "timeout": "3m"},
    });
    s.apply(&name, spec).await?;
    wait_policy(&s.client, &name, "True", Duration::from_secs(60)).await?;
    wait_injecting(&s.client, &ns.name, &[("app", "probe")], ROLLOUT_SIDECAR).await?;
    let policies: Api<InjectionPolicy> = Api::all(s.client.clone());
    let hash = template_hash(&policies, &name)
        .await?
        .context("no template hash")?;
    let namespaces = [ns];
    deploy(&s.client, &namespaces, 2, &s.instance, &name, Some(&hash)).await?;
    ensure!(levels(&namespaces[0]).await? == ["debug", "debug"]);

    // The namespace's value changes: its pods are outdated though the template is not, and the
    // rollout restarts their Deployments; the new pods take the new value.
    annotate(&s.client, &namespaces[0].name, json!({LEVEL: "warn"})).await?;
    wait_until(
        Duration::from_secs(240),
        "every pod to carry LOG_LEVEL=warn and count as current",
        || async {
            let p = policies.get(&name).await?;
            let coverage = p.status.and_then(|s| s.coverage).unwrap_or_default();
            Ok(levels(&namespaces[0]).await? == ["warn", "warn"]
                && coverage.current == 2
                && coverage.outdated == 0)
        },
    )
    .await?;
    let deployments = namespaces[0]
        .api::<Deployment>()
        .list(&ListParams::default())
        .await?;
    for d in &deployments.items {
        ensure!(
            restarted_for(d).is_some_and(|r| r.starts_with(&name)),
            "{} was not restarted by the rollout: {:?}",
            d.name_any(),
            restarted_for(d)
        );
    }

    // A second change restarts them again: the restart records the namespace's values too.
    annotate(&s.client, &namespaces[0].name, json!({LEVEL: "debug"})).await?;
    wait_until(
        Duration::from_secs(240),
        "every pod to carry LOG_LEVEL=debug again",
        || async {
            let p = policies.get(&name).await?;
            let coverage = p.status.and_then(|s| s.coverage).unwrap_or_default();
            Ok(levels(&namespaces[0]).await? == ["debug", "debug"]
                && coverage.current == 2
                && coverage.outdated == 0)
        },
    )
    .await?;
    Ok(())
}
