//! `spec.valuesFrom` on the real API server, with two `splice run` replicas of one instance: a
//! ConfigMap edit reaches what new pods get on both (measured: through the API server, which
//! calls replica A, and by direct AdmissionReview calls to replica B's webhook), a deleted source
//! gives Ready=False naming it while the last good data keeps being injected, coverage counts a
//! pod rendered with older data as outdated and `splice explain` names the source, and a Secret
//! fed into a field that would show it is refused at apply.

#[path = "../src/operator.rs"]
mod operator;

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use operator::*;
use serde_json::{Value, json};
use splice_crds::InjectionPolicy;
use splice_e2e::{dry_run, wait_until};

/// Edits of the ConfigMap whose propagation is measured.
const EDITS: usize = 10;
/// The bound asserted on one propagation: generous, so a loaded CI machine never fails it. The
/// goal (p99 ≤ 2 s) is measured and reported, not asserted.
const PROPAGATION_BOUND: Duration = Duration::from_secs(30);

fn image(n: usize) -> String {
    format!("registry.invalid/proxy:{n}")
}

fn config_map(name: &str, image: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"image": image},
    }))
    .unwrap_or_default()
}

fn policy_spec(instance: &str) -> Value {
    json!({
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "objectSelector": {"matchLabels": {"app": "web"}},
        "valuesFrom": [
            {"name": "proxyImage", "configMapKeyRef": {"name": "mesh-config", "key": "image"}},
        ],
        "template": {"containers": [{"name": "mesh-proxy", "image": "{{ values.proxyImage }}"}]},
    })
}

/// The image the API server's dry run of a `web` pod gets (through replica A).
async fn image_via_apiserver(pods: &Api<Pod>) -> Result<Option<String>> {
    let created = pods
        .create(&dry_run(), &pod("web", &[("app", "web")]))
        .await?;
    Ok(image_of(&created, "mesh-proxy"))
}

/// The JSON Patch replica B's webhook answers for a `web` pod in `namespace`, called directly
/// (the API server calls only the URL the leader wrote, replica A's).
async fn patch_via_replica(port: u16, policy: &str, namespace: &str) -> Result<String> {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "e2e-values", "operation": "CREATE", "namespace": namespace, "dryRun": true,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "userInfo": {"username": "e2e"},
            "object": serde_json::to_value(pod("web", &[("app", "web")]))?,
        },
    });
    // Loopback only; the serving certificate is Splice's own, so no CA check here (-k).
    let out = tokio::process::Command::new("curl")
        .args([
            "-sk",
            "--max-time",
            "5",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            "@-",
            &format!("https://127.0.0.1:{port}/inject/{policy}"),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("running curl")?;
    let mut child = out;
    if let Some(mut stdin) = child.stdin.take() {
        use tokio::io::AsyncWriteExt;
        stdin.write_all(review.to_string().as_bytes()).await?;
    }
    let output = child.wait_with_output().await?;
    let answer: Value = serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "replica answer: {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })?;
    let patch = answer["response"]["patch"].clone();
    if patch.is_null() {
        return Ok(String::new());
    }
    let bytes: k8s_openapi::ByteString = serde_json::from_value(patch)?;
    Ok(String::from_utf8_lossy(&bytes.0).into_owned())
}

fn report(via: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "REPORT values_from propagation via={via} n={} p50={:.0}ms p99={:.0}ms max={:.0}ms",
        samples.len(),
        splice_e2e::quantile(&samples, 0.5).as_secs_f64() * 1000.0,
        splice_e2e::quantile(&samples, 0.99).as_secs_f64() * 1000.0,
        samples.last().copied().unwrap_or_default().as_secs_f64() * 1000.0,
    );
}

#[tokio::test]
async fn cluster_data_reaches_both_replicas_is_versioned_in_pods_and_a_secret_is_never_shown()
-> Result<()> {
    let s = Setup::start("values").await?;
    let _validating = ValidatingCleanup(s.splice_ns.name.clone());
    // Replica B: same namespace and instance; it writes replica A's URL too, so the API server
    // always calls A and B is measured by direct calls.
    let mut b_options = SpliceOptions::new(&s.splice_ns.name, &s.instance);
    b_options.url_port = Some(s.splice.port);
    b_options.log_name = format!("splice-{}-b", s.instance);
    let b = Splice::start(b_options).await?;

    let config_maps: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.splice_ns.name);
    config_maps
        .create(
            &PostParams::default(),
            &config_map("mesh-config", &image(0)),
        )
        .await?;
    let app = s.app_namespace().await?;
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &app.name);
    let name = s.policy("proxy");
    s.apply(&name, policy_spec(&s.instance)).await?;
    wait_policy(&s.client, &name, "True", Duration::from_secs(60)).await?;
    wait_until(
        Duration::from_secs(60),
        "the first data to be injected",
        || {
            let pods = pods.clone();
            async move { Ok(image_via_apiserver(&pods).await.ok().flatten() == Some(image(0))) }
        },
    )
    .await?;

    // (a) Each edit, measured until both replicas render it.
    let mut via_apiserver = Vec::new();
    let mut via_replica_b = Vec::new();
    for n in 1..=EDITS {
        let want = image(n);
        config_maps
            .patch(
                "mesh-config",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"image": want}})),
            )
            .await?;
        let edited = Instant::now();
        let api_side = async {
            loop {
                if image_via_apiserver(&pods).await.ok().flatten().as_deref() == Some(&want) {
                    return Ok(edited.elapsed());
                }
                if edited.elapsed() > PROPAGATION_BOUND {
                    bail!("edit {n}: the API server's dry runs never got {want}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let b_side = async {
            loop {
                let patch = patch_via_replica(b.port, &name, &app.name)
                    .await
                    .unwrap_or_default();
                if patch.contains(&want) {
                    return Ok(edited.elapsed());
                }
                if edited.elapsed() > PROPAGATION_BOUND {
                    bail!("edit {n}: replica B never rendered {want}; last patch {patch}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let (a, b_took): (Result<Duration>, Result<Duration>) = tokio::join!(api_side, b_side);
        via_apiserver.push(a?);
        via_replica_b.push(b_took?);
    }
    report("apiserver-dry-run(replica-A)", via_apiserver);
    report("direct-admission-review(replica-B)", via_replica_b);

    // (d) A stored pod rendered with the current data, then the data changes: outdated, and
    // explain names the source.
    pods.create(&PostParams::default(), &pod("web-1", &[("app", "web")]))
        .await?;
    let policies: Api<InjectionPolicy> = Api::all(s.client.clone());
    let coverage = |field: &'static str| {
        let policies = policies.clone();
        let name = name.clone();
        async move {
            let p = policies.get(&name).await?;
            let c = p.status.and_then(|s| s.coverage).unwrap_or_default();
            Ok::<_, anyhow::Error>(match field {
                "current" => c.current,
                _ => c.outdated,
            })
        }
    };
    wait_until(
        Duration::from_secs(60),
        "the pod to count as current",
        || {
            let f = coverage("current");
            async move { Ok(f.await? == 1) }
        },
    )
    .await?;
    let changed = image(EDITS + 1);
    config_maps
        .patch(
            "mesh-config",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"image": changed}})),
        )
        .await?;
    wait_until(
        Duration::from_secs(60),
        "the pod to count as outdated",
        || {
            let f = coverage("outdated");
            async move { Ok(f.await? == 1) }
        },
    )
    .await?;
    let source = format!("ConfigMap {}/mesh-config", s.splice_ns.name);
    let (text, stderr) = explain_online("web-1", &app.name, &s.splice_ns.name)?;
    assert!(
        text.contains("outdated") && text.contains(&source),
        "splice explain should name {source}: {text}{}",
        stderr
    );

    // (b) The source deleted: Ready=False naming it; the last good data keeps being injected.
    config_maps
        .delete("mesh-config", &DeleteParams::default())
        .await?;
    let p = wait_policy(&s.client, &name, "False", Duration::from_secs(60)).await?;
    let ready = condition(&p, "Ready").context("Ready")?;
    assert_eq!(ready.reason, "SourceMissing", "{ready:?}");
    assert!(
        ready.message.contains(&format!("{source} key image")),
        "{ready:?}"
    );
    assert_eq!(
        image_via_apiserver(&pods).await?,
        Some(changed.clone()),
        "the last good data keeps being injected"
    );
    // The leader (either replica) exports it.
    let gauge = format!("splice_values_source_problem{{policy=\"{name}\"}} 1");
    wait_until(Duration::from_secs(30), "the problem gauge", || {
        let (a, b) = (&s.splice, &b);
        let gauge = gauge.clone();
        async move {
            let text = format!("{}{}", a.metrics().await?, b.metrics().await?);
            Ok(text.contains(&gauge))
        }
    })
    .await?;
    // Recreated: Ready again, with the new data.
    config_maps
        .create(
            &PostParams::default(),
            &config_map("mesh-config", &image(EDITS + 2)),
        )
        .await?;
    wait_policy(&s.client, &name, "True", Duration::from_secs(60)).await?;
    wait_until(Duration::from_secs(30), "the recreated data", || {
        let pods = pods.clone();
        async move { Ok(image_via_apiserver(&pods).await.ok().flatten() == Some(image(EDITS + 2))) }
    })
    .await?;

    // (c) A Secret fed into an env value (which shows it in the pod spec) is refused at apply,
    // naming the field and the entry; through `sha256` it is admitted.
    let secrets: Api<Secret> = Api::namespaced(s.client.clone(), &s.splice_ns.name);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "mesh-token"},
                "stringData": {"token": "e2e-secret-value"},
            }))?,
        )
        .await?;
    let secret_spec = |value: &str| {
        json!({
            "mode": "Webhook",
            "namespaceSelector": {"matchLabels": {s.instance.clone(): "on"}},
            "valuesFrom": [{"name": "token", "secretKeyRef": {"name": "mesh-token", "key": "token"}}],
            "template": {"containers": [{"name": "sidecar", "image": "registry.invalid/sidecar:1",
                "env": [{"name": "TOKEN", "value": value}]}]},
        })
    };
    let apply_dry = |policy: String, spec: Value| {
        let policies = policies.clone();
        let instance = s.instance.clone();
        async move {
            let mut params = PatchParams::apply(TEST_MANAGER).force();
            params.dry_run = true;
            let body = json!({
                "apiVersion": "splice.dev/v1alpha1", "kind": "InjectionPolicy",
                "metadata": {"name": policy, "labels": {INSTANCE_LABEL: instance}},
                "spec": spec,
            });
            policies
                .patch(&policy, &params, &Patch::Apply(&body))
                .await
                .map(|_| ())
                .map_err(|e| match e {
                    kube::Error::Api(s) => s.message,
                    other => other.to_string(),
                })
        }
    };
    let leak = s.policy("leak");
    // The API server loads the validating configuration asynchronously: wait for the refusal.
    let deadline = Instant::now() + Duration::from_secs(60);
    let refusal = loop {
        match apply_dry(leak.clone(), secret_spec("{{ values.token }}")).await {
            Err(m) if m.contains("denied the request") => break m,
            other => {
                if Instant::now() > deadline {
                    bail!("the Secret leak was never refused at apply: {other:?}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        refusal.contains("spec.template.containers[0].env[0].value")
            && refusal.contains("spec.valuesFrom[0]")
            && !refusal.contains("e2e-secret-value"),
        "{refusal}"
    );
    // A source outside --values-namespaces (Splice's own namespace here) is refused at apply.
    let mut elsewhere = secret_spec("{{ values.token | sha256 }}");
    elsewhere["valuesFrom"][0]["secretKeyRef"]["namespace"] = "kube-system".into();
    let refusal = apply_dry(s.policy("elsewhere"), elsewhere)
        .await
        .err()
        .unwrap_or_default();
    assert!(
        refusal.contains("spec.valuesFrom[0]: Secret kube-system/mesh-token"),
        "{refusal}"
    );
    apply_dry(
        s.policy("hashed"),
        secret_spec("{{ values.token | sha256 }}"),
    )
    .await
    .map_err(|m| anyhow::anyhow!("a Secret read through sha256 should be admitted: {m}"))?;

    let _ = pods.delete("web-1", &DeleteParams::default()).await;
    drop(b);
    Ok(())
}
