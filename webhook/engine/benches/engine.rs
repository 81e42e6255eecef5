//! One injection of the realistic sidecar policy (`testdata/policy-sidecar.yaml`: init container,
//! native sidecar, volume, env, mount, label, annotation) into pods of several sizes.
// A benchmark with a broken fixture must stop at once.
#![allow(clippy::expect_used)]

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group};
use splice_crds::Operation;
use splice_engine::{
    CompiledPolicy, Decision, EngineError, Exclusions, NamespaceContext, Pod, PodRequest,
    Selection, inject, inject_and_apply,
};

#[path = "../../benches/common/mod.rs"]
mod common;
use common::{PODS, POLICY, compile, load_average, thread_cpu_ns};

/// One request as the webhook serves it: the object read (checked as JSON, the engine's facts
/// taken in the same pass), then the injection decided and planned.
#[derive(Clone, Copy)]
struct Req<'a> {
    object: &'a str,
    namespace: &'a NamespaceContext,
    exclusions: &'a Exclusions,
}

impl<'a> Req<'a> {
    fn with(self, object: &'a str) -> Self {
        Req { object, ..self }
    }
    fn inject(&self, policy: &CompiledPolicy) -> Result<Decision, EngineError> {
        let pod = Pod::parse(self.object)?;
        inject(policy, &self.request(&pod))
    }
    fn inject_and_apply(
        &self,
        policy: &CompiledPolicy,
    ) -> Result<(Decision, serde_json::Value), EngineError> {
        let pod = Pod::parse(self.object)?;
        inject_and_apply(policy, &self.request(&pod))
    }
    fn request<'p>(&'p self, pod: &'p Pod<'p>) -> PodRequest<'p> {
        PodRequest {
            operation: Operation::Create,
            object: pod,
            namespace: self.namespace,
            exclusions: self.exclusions,
            trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN,
            selection: Selection::Evaluate,
        }
    }
}

/// `pod` with one more env var in its first container, named by `i`: each is a pod shape the
/// policy has not seen, as a Deployment's first pod is.
fn new_shape(pod: &str, i: usize) -> String {
    pod.replacen(
        "\"env\":[",
        &format!("\"env\":[{{\"name\":\"SHAPE_{i}\",\"value\":\"x\"}},"),
        1,
    )
}

fn bench(c: &mut Criterion) {
    let ns = NamespaceContext {
        name: "shop".into(),
        ..Default::default()
    };
    let exclusions = Exclusions::default_for("splice-system");
    let sidecar = compile(POLICY);
    // The same policy with one template that reads the pod: the engine then builds the full
    // JSON tree of the pod for rendering.
    let reads_pod = compile(&POLICY.replace(
        "\"--policy={{ policy.name }}\"",
        "\"--pod={{ pod.metadata.name }}\"",
    ));
    let from_cluster = values_from_variant();
    let mut group = c.benchmark_group("inject");
    for (name, pod) in PODS {
        group.throughput(Throughput::Bytes(pod.len() as u64));
        for (variant, policy) in [
            ("sidecar", &sidecar),
            ("sidecar-reads-pod", &reads_pod),
            ("sidecar-values-from", &from_cluster),
        ] {
            let req = Req {
                object: pod,
                namespace: &ns,
                exclusions: &exclusions,
            };
            assert!(matches!(req.inject(policy), Ok(Decision::Inject(i)) if i.changed));
            group.bench_with_input(BenchmarkId::new(variant, name), &req, |b, req| {
                b.iter(|| req.inject(policy))
            });
        }
        // The first pod of a shape: the engine keeps the patch it plans for a pod's shape and
        // answers the replicas after it with that patch (the `sidecar` rows above). Here each pod
        // has an env var no earlier pod had, so the patch is planned, serialized and kept again,
        // as for a Deployment's first pod; the rendering stays cached.
        let req = Req {
            object: pod,
            namespace: &ns,
            exclusions: &exclusions,
        };
        let mut shapes = 0..;
        group.bench_with_input(
            BenchmarkId::new("sidecar-new-shape", name),
            &req,
            |b, req| {
                b.iter_batched(
                    || new_shape(pod, shapes.next().unwrap_or_default()),
                    |pod| req.with(&pod).inject(&sidecar),
                    BatchSize::SmallInput,
                )
            },
        );
        // Reinvocation on the engine's own output: the idempotence check, empty patch.
        let (_, injected) = req.inject_and_apply(&sidecar).expect("injects");
        let injected = injected.to_string();
        let req = Req {
            object: &injected,
            namespace: &ns,
            exclusions: &exclusions,
        };
        assert!(matches!(req.inject(&sidecar), Ok(Decision::Inject(i)) if !i.changed));
        group.bench_with_input(
            BenchmarkId::new("reinvocation-noop", name),
            &req,
            |b, req| b.iter(|| req.inject(&sidecar)),
        );
    }
    group.finish();

    // The patch path (what the webhook runs per request, and `splice inject` without the
    // mutated object; warm, it answers a replica with the patch kept for its shape) against the
    // offline full path (which also builds the mutated object) and against the first request
    // after a policy (re)load, whose rendering is not cached yet: the ratios document what the
    // fast path saves.
    let mut group = c.benchmark_group("path");
    for (name, pod) in PODS {
        let req = Req {
            object: pod,
            namespace: &ns,
            exclusions: &exclusions,
        };
        group.bench_with_input(BenchmarkId::new("patch-warm", name), &req, |b, req| {
            b.iter(|| req.inject(&sidecar))
        });
        group.bench_with_input(BenchmarkId::new("patch-cold", name), &req, |b, req| {
            b.iter_batched_ref(
                || compile(POLICY),
                |policy| req.inject(policy),
                BatchSize::SmallInput,
            )
        });
        group.bench_with_input(BenchmarkId::new("full-object", name), &req, |b, req| {
            b.iter(|| req.inject_and_apply(&sidecar))
        });
    }
    group.finish();

    // Reference points: the cost of merely scanning the JSON, and of the engine with nothing to
    // render per request (every template static).
    let mut group = c.benchmark_group("reference");
    let static_policy = compile(
        &POLICY
            .replace("{{ namespace.name }}", "shop")
            .replace("\"--policy={{ policy.name }}\"", "\"--policy=mesh-proxy\""),
    );
    for (name, pod) in PODS {
        group.bench_with_input(BenchmarkId::new("scan-json", name), pod, |b, pod| {
            b.iter(|| serde_json::from_str::<serde::de::IgnoredAny>(pod))
        });
        group.bench_with_input(BenchmarkId::new("parse-value", name), pod, |b, pod| {
            b.iter(|| serde_json::from_str::<serde_json::Value>(pod))
        });
        let req = Req {
            object: pod,
            namespace: &ns,
            exclusions: &exclusions,
        };
        group.bench_with_input(BenchmarkId::new("static-sidecar", name), &req, |b, req| {
            b.iter(|| req.inject(&static_policy))
        });
        // An opted-out pod: the engine reads its view and stops, so this is the parse alone.
        let opted_out = pod.replace("\"tier\":\"frontend\"", "\"splice.dev/inject\":\"false\"");
        let req = req.with(&opted_out);
        assert!(matches!(
            req.inject(&static_policy),
            Ok(Decision::Skip(splice_engine::SkipReason::OptedOut))
        ));
        group.bench_with_input(BenchmarkId::new("view-only", name), &req, |b, req| {
            b.iter(|| req.inject(&static_policy))
        });
    }
    group.finish();
}

/// The same policy with both images read from a ConfigMap and a Secret's fingerprint as an
/// annotation (`spec.valuesFrom`), compiled with that data as every replica compiles it: the
/// request path renders from the compiled policy either way, so the two rows should match.
fn values_from_variant() -> CompiledPolicy {
    use splice_crds::InjectionPolicy;
    use splice_engine::values_from::{self, DataSources, SourceKind, SourceRef};
    let mut p: InjectionPolicy = serde_yaml::from_str(POLICY).expect("policy YAML");
    for key in ["proxyImage", "initImage"] {
        p.spec.values.remove(key);
    }
    p.spec.values_from = serde_json::from_value(serde_json::json!([
        {"name": "proxyImage", "configMapKeyRef": {"name": "mesh-config", "key": "proxy"}},
        {"name": "initImage", "configMapKeyRef": {"name": "mesh-config", "key": "init"}},
        {"name": "token", "secretKeyRef": {"name": "mesh-token", "key": "token"}},
    ]))
    .expect("valuesFrom");
    p.spec.template.annotations.insert(
        "mesh.example/token".into(),
        "{{ values.token | sha256 }}".into(),
    );
    let mut data = DataSources::default();
    let object = |kind, name: &str| SourceRef {
        kind,
        namespace: "splice-system".into(),
        name: name.into(),
    };
    data.insert(
        object(SourceKind::ConfigMap, "mesh-config"),
        [
            (
                "proxy".to_owned(),
                "registry.example/mesh/proxy:1.4.2".to_owned(),
            ),
            (
                "init".to_owned(),
                "registry.example/mesh/proxy-init:1.4.2".to_owned(),
            ),
        ]
        .into(),
    );
    data.insert(
        object(SourceKind::Secret, "mesh-token"),
        [("token".to_owned(), "bench-token".to_owned())].into(),
    );
    let resolved =
        values_from::resolve(&p.spec, "splice-system", None, &data).expect("sources resolve");
    CompiledPolicy::compile_with("mesh-proxy", 3, &p.spec, &resolved).expect("compiles")
}

criterion_group!(benches, bench);

/// Mean CPU µs of `f` over `n` calls (one reading per batch, so the read itself is noise).
fn cpu_us(n: u32, mut f: impl FnMut(u32)) -> Option<f64> {
    let start = thread_cpu_ns()?;
    for i in 0..n {
        f(i);
    }
    let end = thread_cpu_ns()?;
    Some((end - start) as f64 / 1e3 / f64::from(n))
}

/// A table of CPU µs per call, the slow and fast paths side by side; skipped where
/// the thread CPU clock is missing. Runs after criterion unless a filter was given.
fn cpu_table() {
    if thread_cpu_ns().is_none() {
        println!("(no thread CPU clock: CPU-time table skipped)");
        return;
    }
    let ns = NamespaceContext {
        name: "shop".into(),
        ..Default::default()
    };
    let exclusions = Exclusions::default_for("splice-system");
    let warm = compile(POLICY);
    println!(
        "\nCPU µs per call (thread CPU time, best of 5 batches; load average {}):",
        load_average()
    );
    println!(
        "| pod | scan only (IgnoredAny) | scan only (cursor) | parse to Value | patch, warm (a replica: patch kept) | patch, first request after a policy load | patch + mutated object (offline) | full / warm |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (name, pod) in PODS {
        let req = Req {
            object: pod,
            namespace: &ns,
            exclusions: &exclusions,
        };
        let best = |n: u32, f: &mut dyn FnMut(u32)| {
            (0..5)
                .filter_map(|_| cpu_us(n, &mut *f))
                .fold(f64::INFINITY, f64::min)
        };
        // Batches of about 40 MB of input (tens of milliseconds): long enough to average over
        // caches and interrupts, short enough that one of five escapes the other tenants.
        let n = u32::try_from((40_000_000 / pod.len()).clamp(200, 10_000)).unwrap_or(1000);
        let scan = best(n, &mut |_| {
            let _ = std::hint::black_box(serde_json::from_str::<serde::de::IgnoredAny>(pod));
        });
        let cursor = best(n, &mut |_| {
            let _ = std::hint::black_box(splice_json::validate(std::hint::black_box(pod)));
        });
        let value = best(n, &mut |_| {
            let _ = std::hint::black_box(serde_json::from_str::<serde_json::Value>(pod));
        });
        let patch = best(n, &mut |_| {
            let _ = std::hint::black_box(req.inject(&warm));
        });
        let fresh: Vec<CompiledPolicy> = (0..100).map(|_| compile(POLICY)).collect();
        let cold = cpu_us(100, |i| {
            let _ = std::hint::black_box(req.inject(&fresh[i as usize]));
        })
        .unwrap_or(f64::NAN);
        let full = best(n / 4, &mut |_| {
            let _ = std::hint::black_box(req.inject_and_apply(&warm));
        });
        println!(
            "| {name} ({} B) | {scan:.1} | {cursor:.1} | {value:.1} | {patch:.1} | {cold:.1} | {full:.1} | {:.1}× |",
            pod.len(),
            full / patch
        );
    }
    chain_table(&ns, &exclusions);
}

/// `n` policies as a shared entry serves them: each selects every pod and adds its own one-image
/// sidecar, as in `make bench-admission`'s splice10 and load rows.
fn sidecar_policies(n: usize) -> Vec<std::sync::Arc<CompiledPolicy>> {
    (0..n)
        .map(|i| {
            std::sync::Arc::new(compile(&format!(
                "apiVersion: splice.dev/v1alpha1\nkind: InjectionPolicy\nmetadata: {{name: p{i:02}}}\n\
                 spec:\n  template:\n    containers: [{{name: sidecar-{i}, image: registry.example/s{i}:1}}]\n"
            )))
        })
        .collect()
}

/// CPU µs of one call serving N policies in one chain (`inject_in_order`, the shared entry's
/// path), against one policy: the engine's share of the "ten policies cost ≤ 1.5× one" ratio.
/// "kept" is the webhook's path for the pods of a burst after the first (`inject_in_order_kept`,
/// the answer kept for an equal request).
fn chain_table(ns: &NamespaceContext, exclusions: &Exclusions) {
    let sets = [1, 10, 17].map(sidecar_policies);
    println!("\nCPU µs per call, N one-sidecar policies in one chain (the shared entry's call):");
    println!("| pod | 1 | 10 | 17 | 10 / 1 | 10, kept | 17, kept |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, pod) in PODS.iter().take(2) {
        let req = Req {
            object: pod,
            namespace: ns,
            exclusions,
        };
        let best = |f: &mut dyn FnMut()| {
            (0..5)
                .filter_map(|_| cpu_us(400, |_| f()))
                .fold(f64::INFINITY, f64::min)
        };
        let mut row = Vec::new();
        for policies in &sets {
            let refs: Vec<&CompiledPolicy> = policies.iter().map(|p| &**p).collect();
            let once = || {
                let parsed = Pod::parse(req.object).expect("the pod parses");
                splice_engine::inject_in_order(&refs, &req.request(&parsed))
            };
            assert!(once().whole.changed, "the chain injects");
            row.push(best(&mut || {
                let _ = std::hint::black_box(once());
            }));
        }
        for policies in &sets[1..] {
            let held: Vec<&std::sync::Arc<CompiledPolicy>> = policies.iter().collect();
            let cache = splice_engine::ChainCache::default();
            row.push(best(&mut || {
                let parsed = Pod::parse(req.object).expect("the pod parses");
                let _ = std::hint::black_box(splice_engine::inject_in_order_kept(
                    &cache,
                    &held,
                    &req.request(&parsed),
                ));
            }));
        }
        println!(
            "| {name} ({} B) | {:.1} | {:.1} | {:.1} | {:.2}× | {:.1} | {:.1} |",
            pod.len(),
            row[0],
            row[1],
            row[2],
            row[1] / row[0],
            row[3],
            row[4]
        );
    }
}

/// `ENGINE_CALLS=N`: the warm patch path on the 8.5 KB pod N times and nothing else, for counting
/// instructions under valgrind (`--tool=callgrind --toggle-collect='*engine::inject*'`), a figure
/// that machine load does not move. It reads the object as the webhook does: checked and viewed
/// in one pass. `ENGINE_PART=validate` counts only checking the pod as JSON, and
/// `ENGINE_PART=read` that check with the engine's view of the pod (the webhook's read of
/// `request.object`), to split the figure. The warm path of a replica answers with the patch kept
/// for its shape; `ENGINE_PART=new-shape` counts the first pod of a shape instead (each call's pod
/// has an env var no earlier pod had, so each is planned, serialized and kept).
fn calls_only(n: u32) {
    let ns = NamespaceContext {
        name: "shop".into(),
        ..Default::default()
    };
    let exclusions = Exclusions::default_for("splice-system");
    let warm = compile(POLICY);
    let req = Req {
        object: PODS[1].1,
        namespace: &ns,
        exclusions: &exclusions,
    };
    let shapes: Vec<String> = match std::env::var("ENGINE_PART").as_deref() {
        Ok("new-shape") => (0..n as usize).map(|i| new_shape(req.object, i)).collect(),
        _ => Vec::new(),
    };
    let part = std::env::var("ENGINE_PART").unwrap_or_default();
    for i in 0..n as usize {
        let text = std::hint::black_box(req.object);
        match part.as_str() {
            "new-shape" => {
                let pod = shapes.get(i).map_or(text, String::as_str);
                let _ = std::hint::black_box(req.with(pod).inject(&warm));
            }
            "validate" => {
                let _ = std::hint::black_box(splice_json::validate(text));
            }
            "read" => {
                let _ = std::hint::black_box(Pod::parse(text));
            }
            _ => {
                let _ = std::hint::black_box(std::hint::black_box(&req).inject(&warm));
            }
        }
    }
}

fn main() {
    if let Some(n) = std::env::var("ENGINE_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        calls_only(n);
        return;
    }
    // CPU_TABLE_ONLY=1 prints the table alone (a quick look on a busy machine).
    if std::env::var_os("CPU_TABLE_ONLY").is_some() {
        cpu_table();
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
    // A filter argument means a focused criterion run: skip the table then.
    let filtered = std::env::args().skip(1).any(|a| !a.starts_with('-'));
    if !filtered {
        cpu_table();
    }
}
