//! Load generator for `make bench-admission` (its load rows, e2e/bench/load.py): N server-side
//! dry-run pod creates (`dryRun=All`: the whole admission chain runs, nothing is stored) into one
//! namespace from C concurrent clients, every answer checked for the expected number of injected
//! containers. Prints one JSON object: latency percentiles, errors, timeouts, throughput, and the
//! concurrency actually reached (requests in flight at once, connections open to the API server).
//!
//!   admission_load --namespace NS --creates N --clients C --expect K [--warmup W] [--timeout S]
//!                  [--pod FILE]
//!
//! `--pod` sends the pod in FILE (JSON) instead of the one-container load pod; `--expect` then
//! counts its containers beyond the first, whoever put them there.
//! KUBECONFIG names the cluster (the local control plane's admin kubeconfig).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::{Client, Config};
use serde_json::{Value, json};

/// Error answers kept verbatim in the output (per kind), so a failed row says why.
const SAMPLES: usize = 5;

struct Args {
    namespace: String,
    pod: Option<String>,
    creates: usize,
    clients: usize,
    expect: usize,
    warmup: usize,
    timeout: Duration,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        namespace: String::new(),
        pod: None,
        creates: 10_000,
        clients: 32,
        expect: 1,
        warmup: 200,
        timeout: Duration::from_secs(30),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        let number = || -> Result<usize> {
            value
                .parse()
                .with_context(|| format!("{flag}: not a whole number: {value}"))
        };
        match flag.as_str() {
            "--namespace" => args.namespace = value.clone(),
            "--pod" => args.pod = Some(value.clone()),
            "--creates" => args.creates = number()?,
            "--clients" => args.clients = number()?,
            "--expect" => args.expect = number()?,
            "--warmup" => args.warmup = number()?,
            "--timeout" => args.timeout = Duration::from_secs(number()? as u64),
            _ => bail!(
                "unknown argument {flag}; usage: admission_load --namespace NS --creates N \
                 --clients C --expect K [--warmup W] [--timeout SECONDS] [--pod FILE]"
            ),
        }
    }
    if args.namespace.is_empty() || args.clients == 0 || args.creates == 0 {
        bail!("--namespace is required; --creates and --clients must be at least 1");
    }
    Ok(args)
}

/// What one create came to.
enum Outcome {
    Ok,
    Error(String),
    Timeout(String),
}

/// The load pod: labels the load policies' object selectors look at (app=load, tier=web); or
/// the pod in `file`.
fn pod_body(file: Option<&str>) -> Result<Vec<u8>> {
    if let Some(file) = file {
        let text = std::fs::read(file).with_context(|| format!("--pod {file}"))?;
        serde_json::from_slice::<Value>(&text)
            .with_context(|| format!("--pod {file}: not a JSON document"))?;
        return Ok(text);
    }
    Ok(serde_json::to_vec(&json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "load", "labels": {"app": "load", "tier": "web"}},
        "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
    }))?)
}

async fn create(client: &Client, path: &str, body: &[u8], args: &Args) -> Outcome {
    let request = match http::Request::post(path)
        .header("content-type", "application/json")
        .body(body.to_vec())
    {
        Ok(r) => r,
        Err(e) => return Outcome::Error(format!("building the request: {e}")),
    };
    match tokio::time::timeout(args.timeout, client.request_text(request)).await {
        Err(_) => Outcome::Timeout(format!("no answer within {:?}", args.timeout)),
        Ok(Err(kube::Error::Api(status))) => {
            let text = format!("{} {}: {}", status.code, status.reason, status.message);
            let lower = status.message.to_lowercase();
            // A webhook the API server gave up on answers 500 with "context deadline exceeded"
            // (failurePolicy Fail); any 5xx or timeout wording counts as a timeout, not a refusal.
            if status.code >= 500
                || lower.contains("deadline exceeded")
                || lower.contains("timeout")
            {
                Outcome::Timeout(text)
            } else {
                Outcome::Error(text)
            }
        }
        Ok(Err(e)) => Outcome::Error(format!("transport: {e}")),
        Ok(Ok(text)) => match injected(&text) {
            Ok(n) if n == args.expect => Outcome::Ok,
            Ok(n) => Outcome::Error(format!("injected {n} containers, expected {}", args.expect)),
            Err(e) => Outcome::Error(format!("reading the answer: {e:#}")),
        },
    }
}

/// Containers the admission chain added to the one-container load pod.
fn injected(text: &str) -> Result<usize> {
    let pod: Value = serde_json::from_str(text)?;
    let containers = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .context("no spec.containers in the answer")?;
    Ok(containers.len().saturating_sub(1))
}

#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    errors: usize,
    timeouts: usize,
    error_samples: Vec<String>,
    timeout_samples: Vec<String>,
}

/// Runs `n` creates from `args.clients` tasks sharing one client (hyper's pool opens a
/// connection per request in flight); returns the tally and the most requests seen in flight.
async fn run(client: &Client, args: &Args, n: usize) -> Result<(Tally, usize)> {
    let path = format!("/api/v1/namespaces/{}/pods?dryRun=All", args.namespace);
    let body = Arc::new(pod_body(args.pod.as_deref())?);
    let next = Arc::new(AtomicUsize::new(0));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut tasks = Vec::new();
    for _ in 0..args.clients {
        let (client, path, body) = (client.clone(), path.clone(), body.clone());
        let (next, in_flight, peak, tally) =
            (next.clone(), in_flight.clone(), peak.clone(), tally.clone());
        let args = Args {
            namespace: String::new(),
            pod: None,
            ..*args
        };
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < n {
                let now = in_flight.fetch_add(1, Ordering::Relaxed) + 1;
                peak.fetch_max(now, Ordering::Relaxed);
                let start = Instant::now();
                let outcome = create(&client, &path, &body, &args).await;
                let elapsed = start.elapsed();
                in_flight.fetch_sub(1, Ordering::Relaxed);
                let Ok(mut t) = tally.lock() else { return };
                t.latencies.push(elapsed);
                match outcome {
                    Outcome::Ok => {}
                    Outcome::Error(why) => {
                        t.errors += 1;
                        if t.error_samples.len() < SAMPLES {
                            t.error_samples.push(why);
                        }
                    }
                    Outcome::Timeout(why) => {
                        t.timeouts += 1;
                        if t.timeout_samples.len() < SAMPLES {
                            t.timeout_samples.push(why);
                        }
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.context("a client task failed")?;
    }
    let tally = Arc::try_unwrap(tally)
        .map_err(|_| anyhow::anyhow!("client tasks still hold the tally"))?
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a client task panicked"))?;
    Ok((tally, peak.load(Ordering::Relaxed)))
}

/// Established TCP connections from this process to `port` on 127.0.0.1: the process's socket
/// inodes (/proc/self/fd) found in /proc/net/tcp. Shows how many connections the pool opened.
fn connections_to(port: u16) -> Result<usize> {
    let mut inodes = HashSet::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let target = std::fs::read_link(entry?.path()).unwrap_or_default();
        let target = target.to_string_lossy();
        if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'))
        {
            inodes.insert(inode.to_string());
        }
    }
    let want = format!(":{port:04X}");
    let mut count = 0;
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local, remote, state (01 = ESTABLISHED), ..., inode at index 9.
            if f.len() > 9 && f[2].ends_with(&want) && f[3] == "01" && inodes.contains(f[9]) {
                count += 1;
            }
        }
    }
    Ok(count)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let config = Config::infer().await.context("reading KUBECONFIG")?;
    let port = config.cluster_url.port_u16().unwrap_or(443);
    let client = Client::try_from(config)?;

    if args.warmup > 0 {
        let (warm, _) = run(&client, &args, args.warmup).await?;
        if warm.errors + warm.timeouts > 0 {
            eprintln!(
                "admission_load: warm-up: {} errors, {} timeouts (not counted); first: {:?}",
                warm.errors,
                warm.timeouts,
                warm.error_samples.first().or(warm.timeout_samples.first())
            );
        }
    }
    let start = Instant::now();
    let (mut tally, peak) = run(&client, &args, args.creates).await?;
    let wall = start.elapsed().as_secs_f64();
    let connections = connections_to(port).unwrap_or(0);
    tally.latencies.sort();
    let l = &tally.latencies;
    let out = json!({
        "namespace": args.namespace,
        "n": l.len(),
        "clients": args.clients,
        "expect": args.expect,
        "p50_ms": percentile(l, 50.0),
        "p99_ms": percentile(l, 99.0),
        "max_ms": percentile(l, 100.0),
        "errors": tally.errors,
        "timeouts": tally.timeouts,
        "error_samples": tally.error_samples,
        "timeout_samples": tally.timeout_samples,
        "wall_s": wall,
        "creates_per_s": if wall > 0.0 { l.len() as f64 / wall } else { 0.0 },
        "max_in_flight": peak,
        "connections": connections,
    });
    println!("{out}");
    Ok(())
}
