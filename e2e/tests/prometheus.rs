//! A real Prometheus (Debian's `prometheus`, on loopback) scraping `splice run`'s admin port,
//! with Splice's alert rules loaded from a copy of deploy/alerts/splice-rules.yaml in which every
//! `for:` is cut to 1s (generated here, so the rules tested are the shipped ones): every metric
//! the contract (docs/design.md, "Metrics") names reaches Prometheus through a scrape, every rule
//! evaluates without error, and pods admitted while Splice's webhook is down under
//! failurePolicy Ignore make the coverage alert (SplicePodsMissed) go pending or firing.
//!
//! `SPLICE_PROMETHEUS` names the binary (default: `prometheus` on PATH).

#[path = "../src/operator.rs"]
mod operator;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use operator::*;
use serde_json::{Value, json};
use splice_e2e::{ChildGuard, free_port, repo_root, unique_suffix, wait_for_child_port};

/// The metric names the contract's table lists, with their type.
fn contract_metrics() -> Result<Vec<(String, String)>> {
    let design = std::fs::read_to_string(repo_root().join("docs/design.md"))?;
    let section = design
        .split("\n## ")
        .find(|s| s.starts_with("Metrics"))
        .context("docs/design.md has no Metrics section")?;
    let metrics: Vec<(String, String)> = section
        .lines()
        .filter_map(|l| {
            let mut cells = l.strip_prefix("| `splice_")?.split('|');
            let name = format!("splice_{}", cells.next()?.trim().trim_end_matches('`'));
            Some((name, cells.next()?.trim().to_owned()))
        })
        .collect();
    ensure!(
        metrics.len() >= 10,
        "found only {metrics:?} in docs/design.md"
    );
    Ok(metrics)
}

/// The series names Prometheus stores for a metric of `kind`.
fn series_names(name: &str, kind: &str) -> Vec<String> {
    match kind {
        "histogram" => ["_bucket", "_sum", "_count"]
            .iter()
            .map(|s| format!("{name}{s}"))
            .collect(),
        _ => vec![name.to_owned()],
    }
}

/// deploy/alerts/splice-rules.yaml with every `for:` duration cut to 1s.
fn compressed_rules() -> Result<String> {
    let rules = std::fs::read_to_string(repo_root().join("deploy/alerts/splice-rules.yaml"))?;
    let mut cut = 0;
    let text: Vec<String> = rules
        .lines()
        .map(|l| {
            let indent = l.len() - l.trim_start().len();
            if l.trim_start().starts_with("for: ") {
                cut += 1;
                format!("{}for: 1s", &l[..indent])
            } else {
                l.to_owned()
            }
        })
        .collect();
    ensure!(cut > 0, "no `for:` in splice-rules.yaml to compress");
    Ok(text.join("\n") + "\n")
}

/// A Prometheus child scraping one target every second, killed when dropped.
struct Prometheus {
    _child: ChildGuard,
    port: u16,
    _dir: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Prometheus {
    async fn start(name: &str, target_port: u16, rules: &str) -> Result<Self> {
        let dir = TempDir(std::env::temp_dir().join(format!("splice-e2e-{name}")));
        std::fs::create_dir_all(&dir.0)?;
        std::fs::write(dir.0.join("rules.yaml"), rules)?;
        let config = json!({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [dir.0.join("rules.yaml")],
            "scrape_configs": [{
                "job_name": "splice",
                "static_configs": [{"targets": [format!("127.0.0.1:{target_port}")]}],
            }],
        });
        // JSON is YAML.
        std::fs::write(dir.0.join("prometheus.yml"), config.to_string())?;
        let logs = repo_root().join("target/e2e-logs");
        std::fs::create_dir_all(&logs)?;
        let log = std::fs::File::create(logs.join(format!("{name}.log")))?;
        let port = free_port()?;
        let bin = std::env::var_os("SPLICE_PROMETHEUS").unwrap_or_else(|| "prometheus".into());
        let mut child = ChildGuard::spawn(
            Command::new(bin)
                .arg(format!(
                    "--config.file={}",
                    dir.0.join("prometheus.yml").display()
                ))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.0.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log),
        )
        .context("starting prometheus (Debian package prometheus; or set SPLICE_PROMETHEUS)")?;
        if let Err(why) = wait_for_child_port(&mut child, port, Duration::from_secs(30)).await {
            bail!("prometheus never listened on {port}: {why}; see target/e2e-logs/{name}.log");
        }
        let prometheus = Prometheus {
            _child: child,
            port,
            _dir: dir,
        };
        splice_e2e::wait_until(
            Duration::from_secs(30),
            "prometheus to be ready",
            || async { Ok(http_get(prometheus.port, "/-/ready").await?.0 == 200) },
        )
        .await?;
        Ok(prometheus)
    }

    /// `data` of a successful answer of the HTTP API at `path`.
    async fn api(&self, path: &str) -> Result<Value> {
        let (code, body) = http_get(self.port, path).await?;
        let answer: Value = serde_json::from_str(&body)
            .with_context(|| format!("GET {path}: {code} {body:.200}"))?;
        ensure!(
            code == 200 && answer["status"] == "success",
            "GET {path}: {code} {answer}"
        );
        Ok(answer["data"].clone())
    }

    /// The values of an instant query.
    async fn query(&self, promql: &str) -> Result<Vec<f64>> {
        let data = self
            .api(&format!("/api/v1/query?query={}", url_encode(promql)))
            .await?;
        Ok(data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["value"][1].as_str()?.parse().ok())
            .collect())
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Alert names in a rule file.
fn alert_names(rules: &str) -> BTreeSet<String> {
    rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- alert: "))
        .map(|a| a.trim().to_owned())
        .collect()
}

#[tokio::test]
async fn prometheus_scrapes_every_contract_metric_and_fires_the_coverage_alert_when_the_webhook_is_down()
-> Result<()> {
    let mut setup = Setup::start_with("prom", &["--probe-interval", "2s"]).await?;
    let rules = compressed_rules()?;
    let prometheus = Prometheus::start(
        &format!("prometheus-{}", unique_suffix()),
        setup.splice.admin_port,
        &rules,
    )
    .await?;
    let app = setup.app_namespace().await?;
    let name = setup.policy("mesh");
    let mut spec = sidecar_spec(&setup.instance, "mesh-proxy", "registry.invalid/proxy:1");
    spec["objectSelector"] = json!({"matchLabels": {"app": "web"}});
    spec["operations"] = json!(["CREATE", "UPDATE"]);
    // A rollout, so its gauge is exported too (its only pod is bare: counted manual).
    spec["rollout"] = json!({});
    setup.apply(&name, spec).await?;
    let ready = wait_policy(&setup.client, &name, "True", Duration::from_secs(60)).await?;
    wait_injecting(&setup.client, &app.name, &[("app", "web")], "mesh-proxy").await?;

    // Traffic for every counter: a pod injected, then (an UPDATE the webhook sees because the old
    // pod matches) opted out, which the policy skips.
    let pods: Api<Pod> = app.api();
    let injected = pods
        .create(&PostParams::default(), &pod("injected", &[("app", "web")]))
        .await?;
    ensure!(container_names(&injected).contains(&"mesh-proxy".to_owned()));
    pods.patch(
        "injected",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"splice.dev/inject": "false"}}})),
    )
    .await?;

    // Every contract metric, as Prometheus stored it from the scrapes.
    let contract = contract_metrics()?;
    let expected: BTreeSet<String> = contract
        .iter()
        .flat_map(|(n, k)| series_names(n, k))
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let stored = loop {
        let names: BTreeSet<String> = prometheus
            .api("/api/v1/label/__name__/values")
            .await?
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| Some(v.as_str()?.to_owned()))
            .filter(|n| n.starts_with("splice_"))
            .collect();
        let missing: Vec<&String> = expected.difference(&names).collect();
        if missing.is_empty() {
            break names;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "Prometheus never stored {missing:?} (it has {names:?}); see {}",
            setup.splice.log.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // And nothing outside the contract.
    let unlisted: Vec<&String> = stored.difference(&expected).collect();
    ensure!(
        unlisted.is_empty(),
        "Splice exports {unlisted:?}, which docs/design.md does not list"
    );
    // The scrape parsed: the target is up with no error.
    let targets = prometheus.api("/api/v1/targets").await?;
    let target = &targets["activeTargets"][0];
    ensure!(
        target["health"] == "up" && target["lastError"] == "",
        "scrape target: {target}"
    );
    // Every shipped alert is loaded and evaluates against real series without error.
    let wanted_alerts = alert_names(&rules);
    splice_e2e::wait_until(
        Duration::from_secs(30),
        "every alert rule to evaluate",
        || async {
            let groups = prometheus.api("/api/v1/rules?type=alert").await?;
            let mut healthy = BTreeSet::new();
            for rule in groups["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            {
                let alert = rule["name"].as_str().unwrap_or("").to_owned();
                ensure!(
                    rule["health"] != "err",
                    "alert {alert} fails to evaluate: {}",
                    rule["lastError"]
                );
                if rule["health"] == "ok" {
                    healthy.insert(alert);
                }
            }
            Ok(healthy == wanted_alerts)
        },
    )
    .await?;

    // Pods created within the grace period after the configuration went in force are not
    // counted as missed; wait it out, and until Prometheus holds the count before the outage.
    let in_force = condition(&ready, "WebhookConfigured")
        .context("WebhookConfigured condition")?
        .last_transition_time
        .0;
    let missed_now = format!("splice_coverage_pods{{policy=\"{name}\",state=\"missed\"}}");
    loop {
        let waited = k8s_openapi::jiff::Timestamp::now().duration_since(in_force);
        if waited.as_secs() > 11 && prometheus.query(&missed_now).await? == [0.0] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let quiet = prometheus
        .api("/api/v1/alerts")
        .await?
        .to_string()
        .contains("SplicePodsMissed");
    ensure!(
        !quiet,
        "SplicePodsMissed is active before any pod was missed"
    );

    // The webhook stops (Splice is killed); under Ignore the API server admits the pod without
    // the sidecar. Splice comes back on the same ports, so Prometheus scrapes the same target.
    setup.splice.kill();
    let missed = pods
        .create(&PostParams::default(), &pod("missed", &[("app", "web")]))
        .await?;
    ensure!(
        !container_names(&missed).contains(&"mesh-proxy".to_owned()),
        "the webhook was down, yet the pod was injected"
    );
    let mut options = setup.splice.options.clone();
    options.port = Some(setup.splice.port);
    options.admin_port = Some(setup.splice.admin_port);
    options.log_name.push_str("-restarted");
    setup.splice = Splice::start(options).await?;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let alerts = prometheus.api("/api/v1/alerts").await?;
        let active = alerts["alerts"].as_array().into_iter().flatten().find(|a| {
            a["labels"]["alertname"] == "SplicePodsMissed" && a["labels"]["policy"] == name
        });
        if let Some(alert) = active {
            ensure!(
                alert["state"] == "pending" || alert["state"] == "firing",
                "{alert}"
            );
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "SplicePodsMissed never went pending or firing for {name}; alerts: {alerts}; \
             missed in Prometheus: {:?}; see {}",
            prometheus.query(&missed_now).await?,
            setup.splice.log.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}
