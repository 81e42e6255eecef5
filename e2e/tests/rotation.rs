//! CA rotation against the real control plane, with lifetimes compressed by flags: pods created
//! continuously through the API server are all injected exactly once while the CA rotates, and a
//! leader SIGKILLed inside any rotation phase leaves a successor that finishes the rotation.

#[path = "../src/operator.rs"]
mod operator;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use operator::*;
use serde_json::json;
use splice_crds::InjectionPolicy;
use splice_e2e::{TestNamespace, unique_suffix, wait_until};

const LEASE: (u64, u64, u64) = (6, 4, 1);

fn text(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
}

/// The CA Secret as the test sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CaView {
    phase: String,
    /// The active CA's certificate.
    active: String,
    /// Certificates in the published bundle.
    bundle_len: usize,
}

async fn ca_view(secrets: &Api<Secret>) -> Result<Option<CaView>> {
    let Some(s) = secrets.get_opt("splice-ca").await? else {
        return Ok(None);
    };
    Ok(Some(CaView {
        phase: s
            .annotations()
            .get("splice.dev/ca-rotation-phase")
            .cloned()
            .unwrap_or_default(),
        active: text(&s, "tls.crt").unwrap_or_default(),
        bundle_len: text(&s, "ca.crt")
            .unwrap_or_default()
            .matches("BEGIN CERTIFICATE")
            .count(),
    }))
}

/// The most CAs any webhook of `policy`'s configuration carries.
async fn configuration_bundle_len(client: &Client, policy: &str) -> Result<usize> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let Some(c) = api.get_opt(&format!("splice-{policy}")).await? else {
        return Ok(0);
    };
    Ok(c.webhooks
        .unwrap_or_default()
        .iter()
        .map(|w| {
            w.client_config
                .ca_bundle
                .as_ref()
                .map(|b| {
                    String::from_utf8_lossy(&b.0)
                        .matches("BEGIN CERTIFICATE")
                        .count()
                })
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0))
}

/// Pods created continuously at `per_second` into `namespace`; counts failures and pods not
/// carrying `container` exactly once.
struct Load {
    stop: Arc<AtomicBool>,
    /// Results count only while set (cleared between a leader's death and the recovery).
    counting: Arc<AtomicBool>,
    attempted: Arc<AtomicU64>,
    created: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    not_once: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
    started: Instant,
}

impl Load {
    fn start(pods: Api<Pod>, container: &'static str, per_second: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let counting = Arc::new(AtomicBool::new(true));
        let attempted = Arc::new(AtomicU64::new(0));
        let a = attempted.clone();
        let created = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let not_once = Arc::new(AtomicU64::new(0));
        let (s, k, c, f, n) = (
            stop.clone(),
            counting.clone(),
            created.clone(),
            failed.clone(),
            not_once.clone(),
        );
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second);
            let mut inflight = tokio::task::JoinSet::new();
            let mut i = 0u64;
            while !s.load(Ordering::Relaxed) {
                tick.tick().await;
                i += 1;
                a.store(i, Ordering::Relaxed);
                let pods = pods.clone();
                let (k, c, f, n) = (k.clone(), c.clone(), f.clone(), n.clone());
                inflight.spawn(async move {
                    let name = format!("load-{i}");
                    let counted_at_start = k.load(Ordering::Relaxed);
                    // No scheduler takes these pods: thousands of unschedulable pods would keep the
                    // default scheduler writing FailedScheduling Events for minutes after the test,
                    // into whatever test runs next.
                    let mut body = pod(&name, &[]);
                    if let Some(spec) = body.spec.as_mut() {
                        spec.scheduler_name = Some("splice-e2e-unscheduled".to_owned());
                    }
                    let result = pods.create(&PostParams::default(), &body).await;
                    if !(counted_at_start && k.load(Ordering::Relaxed)) {
                        return;
                    }
                    match result {
                        Ok(p) => {
                            c.fetch_add(1, Ordering::Relaxed);
                            let copies = container_names(&p)
                                .iter()
                                .filter(|n| n.as_str() == container)
                                .count();
                            if copies != 1 {
                                n.fetch_add(1, Ordering::Relaxed);
                                eprintln!("pod {name}: {copies} copies of {container}");
                            }
                        }
                        Err(e) => {
                            f.fetch_add(1, Ordering::Relaxed);
                            eprintln!("pod {name}: create failed: {e}");
                        }
                    }
                });
            }
            while inflight.join_next().await.is_some() {}
        });
        Load {
            stop,
            counting,
            attempted,
            created,
            failed,
            not_once,
            task,
            started: Instant::now(),
        }
    }

    /// Stops and returns (created, failed, not exactly once, creates sent per second).
    async fn finish(self) -> (u64, u64, u64, f64) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        let elapsed = self.started.elapsed().as_secs_f64();
        let created = self.created.load(Ordering::Relaxed);
        let failed = self.failed.load(Ordering::Relaxed);
        (
            created,
            failed,
            self.not_once.load(Ordering::Relaxed),
            self.attempted.load(Ordering::Relaxed) as f64 / elapsed,
        )
    }
}

struct Rig {
    client: Client,
    instance: String,
    policy: String,
    splice_ns: TestNamespace,
    app_ns: TestNamespace,
    _cleanup: PolicyCleanup,
}

impl Rig {
    async fn new(prefix: &str) -> Result<Self> {
        let client = splice_e2e::client().await?;
        install_crd(&client).await?;
        let instance = format!("{prefix}-{}", unique_suffix());
        let splice_ns = TestNamespace::create("e2e-splice", &[]).await?;
        let app_ns = TestNamespace::create("e2e-app", &[(&instance, "on")]).await?;
        Ok(Rig {
            policy: format!("{instance}-p"),
            _cleanup: PolicyCleanup {
                instance: instance.clone(),
            },
            client,
            instance,
            splice_ns,
            app_ns,
        })
    }

    fn options(&self, who: &str, certs: &[&str]) -> SpliceOptions {
        let mut o = SpliceOptions::new(&self.splice_ns.name, &self.instance);
        o.identity = Some(format!("{}-{who}", self.instance));
        o.lease = Some(LEASE);
        o.log_name = format!("splice-{}-{who}", self.instance);
        o.extra_args = certs.iter().map(|s| (*s).to_owned()).collect();
        o
    }

    async fn holder(&self) -> Result<Option<String>> {
        Ok(self
            .splice_ns
            .api::<Lease>()
            .get_opt("splice-leader")
            .await?
            .and_then(|l| l.spec?.holder_identity))
    }

    async fn wait_leader(&self, who: &str) -> Result<()> {
        let wanted = format!("{}-{who}", self.instance);
        wait_until(
            Duration::from_secs(30),
            &format!("{who} to lead"),
            || async { Ok(self.holder().await?.as_deref() == Some(wanted.as_str())) },
        )
        .await
    }

    async fn apply_policy(&self) -> Result<()> {
        apply_policy(
            &self.client,
            &self.instance,
            &self.policy,
            json!({
                "namespaceSelector": {"matchLabels": {self.instance.clone(): "on"}},
                "template": {"containers": [{"name": "proxy", "image": "registry.invalid/proxy:1"}]}
            }),
        )
        .await?;
        wait_policy(&self.client, &self.policy, "True", Duration::from_secs(30)).await?;
        wait_injecting(&self.client, &self.app_ns.name, &[], "proxy").await
    }
}

#[tokio::test]
async fn three_ca_rotations_under_continuous_pod_creation_fail_no_create_and_inject_every_pod_once()
-> Result<()> {
    let rig = Rig::new("rotate").await?;
    // A one-minute CA renewed at about two thirds, a 20 s serving certificate: three rotations
    // and several serving renewals in about two minutes.
    let certs = [
        "--ca-lifetime",
        "60s",
        "--serving-cert-lifetime",
        "20s",
        "--ca-propagation-delay",
        "3s",
        "--ca-rotation-grace",
        "3s",
    ];
    let a = Splice::start(rig.options("a", &certs)).await?;
    rig.wait_leader("a").await?;
    let b = Splice::start(rig.options("b", &certs)).await?;
    rig.apply_policy().await?;
    let secrets = rig.splice_ns.api::<Secret>();

    let load = Load::start(rig.app_ns.api::<Pod>(), "proxy", 15);
    let mut rotations: Vec<Duration> = Vec::new();
    let mut last: Option<CaView> = None;
    let mut rotation_began: Option<Instant> = None;
    let mut max_bundle = 0usize;
    let deadline = Instant::now() + Duration::from_secs(240);
    while rotations.len() < 3 {
        if Instant::now() > deadline {
            bail!("only {} rotations within 4 minutes", rotations.len());
        }
        let view = ca_view(&secrets).await?.context("the CA Secret")?;
        max_bundle = max_bundle
            .max(view.bundle_len)
            .max(configuration_bundle_len(&rig.client, &rig.policy).await?);
        if last.as_ref().map(|l| &l.phase) != Some(&view.phase) {
            match view.phase.as_str() {
                "Trusting" => rotation_began = Some(Instant::now()),
                "Stable" if rotation_began.is_some() => {
                    let took = rotation_began
                        .take()
                        .map(|t| t.elapsed())
                        .unwrap_or_default();
                    // Every replica serves the new CA's chain: a handshake with it alone verifies.
                    for (who, port) in [("a", a.port), ("b", b.port)] {
                        assert!(
                            serves_chain_of(port, &view.active).await?,
                            "replica {who} does not serve the new CA's chain after rotation {}",
                            rotations.len() + 1
                        );
                    }
                    rotations.push(took);
                }
                _ => {}
            }
        }
        last = Some(view);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The chain's NotAfter is in every policy's status and in the metrics: with a 20 s serving
    // lifetime, it is never more than 20 s ahead, and it moves as certificates are renewed.
    let not_after_in_status = || async {
        let p: InjectionPolicy = Api::all(rig.client.clone()).get(&rig.policy).await?;
        let at = p
            .status
            .and_then(|s| s.certificate_not_after)
            .context("status.certificateNotAfter")?;
        Ok::<_, anyhow::Error>(at.parse::<k8s_openapi::jiff::Timestamp>()?.as_second())
    };
    let first = not_after_in_status().await?;
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default()
    };
    assert!(
        first > now() - 5 && first <= now() + 21,
        "certificateNotAfter {first} vs now {}",
        now()
    );
    wait_until(
        Duration::from_secs(30),
        "certificateNotAfter to move",
        || async { Ok(not_after_in_status().await? > first) },
    )
    .await?;
    for (who, r) in [("a", &a), ("b", &b)] {
        let metrics = r.metrics().await?;
        for cert in ["serving", "ca"] {
            assert!(
                metrics.lines().any(|l| l.starts_with(&format!(
                    "splice_certificate_expiry_timestamp_seconds{{cert=\"{cert}\"}}"
                ))),
                "replica {who} exposes no {cert} expiry"
            );
        }
    }
    let (created, failed, not_once, rate) = load.finish().await;
    println!(
        "rotations (Trusting -> Stable): {rotations:?}; pods: {created} created, {failed} failed, \
         {not_once} not injected exactly once, {rate:.1}/s; at most {max_bundle} CAs in a bundle"
    );
    assert_eq!(failed, 0, "failed creates");
    assert_eq!(not_once, 0, "pods not injected exactly once");
    assert!(rate >= 10.0, "creation rate {rate:.1}/s");
    assert!(max_bundle <= 2, "a bundle held {max_bundle} CAs");
    drop((a, b));
    Ok(())
}

/// The replicas of the kill test, replaced one by one as the leader is killed.
struct Replicas {
    live: Vec<(String, Splice)>,
    started: usize,
}

#[tokio::test]
async fn a_leader_killed_inside_each_rotation_phase_three_times_leaves_a_converged_rotation()
-> Result<()> {
    let rig = Rig::new("rotkill").await?;
    // Lifetimes long enough that only forced rotations happen; delays long enough to kill inside.
    let certs = [
        "--ca-lifetime",
        "1h",
        "--serving-cert-lifetime",
        "20m",
        "--ca-propagation-delay",
        "4s",
        "--ca-rotation-grace",
        "8s",
    ];
    let mut replicas = Replicas {
        live: Vec::new(),
        started: 0,
    };
    let start = |replicas: &mut Replicas| {
        replicas.started += 1;
        let who = format!("r{}", replicas.started);
        (who.clone(), rig.options(&who, &certs))
    };
    let (who, o) = start(&mut replicas);
    replicas.live.push((who.clone(), Splice::start(o).await?));
    rig.wait_leader(&who).await?;
    let (who, o) = start(&mut replicas);
    replicas.live.push((who, Splice::start(o).await?));
    rig.apply_policy().await?;
    let secrets = rig.splice_ns.api::<Secret>();
    let load = Load::start(rig.app_ns.api::<Pod>(), "proxy", 10);
    let mut max_bundle = 0usize;
    let mut recoveries: Vec<(String, Duration)> = Vec::new();
    let mut kills = std::collections::BTreeMap::<&str, u32>::new();
    let mut last_kill = Instant::now();

    for rotation in 1..=3 {
        let before = ca_view(&secrets).await?.context("the CA Secret")?;
        let status = std::process::Command::new(splice_bin()?)
            .args(["rotate", "--namespace", &rig.splice_ns.name])
            .env("KUBECONFIG", splice_e2e::kubeconfig_path())
            .output()?;
        assert!(status.status.success(), "splice rotate: {status:?}");

        for phase in ["Trusting", "Serving", "Grace"] {
            // Wait until the rotation is inside `phase`, then SIGKILL the leader.
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if Instant::now() > deadline {
                    bail!("rotation {rotation}: never observed phase {phase}");
                }
                let view = ca_view(&secrets).await?.context("the CA Secret")?;
                max_bundle = max_bundle
                    .max(view.bundle_len)
                    .max(configuration_bundle_len(&rig.client, &rig.policy).await?);
                let inside = match phase {
                    "Grace" => {
                        // Serving, and every live replica already serves the new chain.
                        let mut all = view.phase == "Serving";
                        for (_, r) in &replicas.live {
                            all = all && serves_chain_of(r.port, &view.active).await?;
                        }
                        all
                    }
                    p => view.phase == p,
                };
                if inside {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let holder = rig.holder().await?.unwrap_or_default();
            let Some(index) = replicas
                .live
                .iter()
                .position(|(who, _)| holder == format!("{}-{who}", rig.instance))
            else {
                bail!("rotation {rotation}, {phase}: no live replica holds the Lease ({holder})");
            };
            load.counting.store(false, Ordering::Relaxed);
            let (killed, mut leader) = replicas.live.remove(index);
            leader.kill();
            let killed_at = Instant::now();
            last_kill = killed_at;
            *kills.entry(phase).or_default() += 1;
            let (who, o) = start(&mut replicas);
            replicas.live.push((who, Splice::start(o).await?));

            // Recovered: a live replica leads, the configuration points at it and the API server
            // injects through it again.
            let live: Vec<(String, u16)> = replicas
                .live
                .iter()
                .map(|(w, r)| (format!("{}-{w}", rig.instance), r.port))
                .collect();
            wait_until(
                Duration::from_secs(60),
                &format!("rotation {rotation}: recovery after killing {killed} in {phase}"),
                || {
                    let live = live.clone();
                    let rig = &rig;
                    async move {
                        let Some(holder) = rig.holder().await? else {
                            return Ok(false);
                        };
                        let Some((_, port)) = live.iter().find(|(id, _)| *id == holder) else {
                            return Ok(false);
                        };
                        let url = configuration(&rig.client, &rig.policy)
                            .await?
                            .and_then(|c| c.webhooks?.first()?.client_config.url.clone());
                        Ok(url == Some(format!("https://127.0.0.1:{port}/inject/{}", rig.policy)))
                    }
                },
            )
            .await?;
            wait_injecting(&rig.client, &rig.app_ns.name, &[], "proxy").await?;
            load.counting.store(true, Ordering::Relaxed);
            recoveries.push((format!("r{rotation} {phase}"), killed_at.elapsed()));
        }

        // Converged: back to one CA, a new one, in the Secret and in the configuration.
        let converged_from = last_kill;
        let deadline = converged_from + Duration::from_secs(60);
        loop {
            if Instant::now() > deadline {
                bail!("rotation {rotation} did not converge within 60 s of the last kill");
            }
            let view = ca_view(&secrets).await?.context("the CA Secret")?;
            let configured = configuration_bundle_len(&rig.client, &rig.policy).await?;
            max_bundle = max_bundle.max(view.bundle_len).max(configured);
            if view.phase == "Stable"
                && view.bundle_len == 1
                && configured == 1
                && view.active != before.active
            {
                for (who, r) in &replicas.live {
                    assert!(
                        serves_chain_of(r.port, &view.active).await?,
                        "rotation {rotation}: {who} does not serve the new chain"
                    );
                }
                recoveries.push((
                    format!("r{rotation} converged after its last kill"),
                    converged_from.elapsed(),
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        wait_policy(&rig.client, &rig.policy, "True", Duration::from_secs(30)).await?;
    }
    let (created, failed, not_once, rate) = load.finish().await;
    println!(
        "kills per phase: {kills:?}; recovery after each kill and convergence: {recoveries:?}; \
         pods counted after recovery: {created} created, {failed} failed, {not_once} not \
         injected exactly once ({rate:.1}/s); at most {max_bundle} CAs in a bundle"
    );
    assert!(kills.values().all(|n| *n >= 3), "{kills:?}");
    assert_eq!(failed, 0, "failed creates after recovery");
    assert_eq!(not_once, 0, "pods not injected exactly once after recovery");
    assert!(max_bundle <= 2, "a bundle held {max_bundle} CAs");
    drop(replicas);
    Ok(())
}
