//! CPU time per request of `Handler::handle`, in memory (no TLS, no sockets): the null handler
//! (`/null`, scans the uid only), the read baseline (`/null/read`, reads the review as `/inject`
//! does, no engine) and the sidecar policy (`/inject/<policy>`) side by side on the same
//! AdmissionReviews. Their ratio is the TLS-free part of issue 4's goal (Splice at
//! least 0.7x the requests/s of the null handler).
//!
//! `HANDLER_CALLS=N HANDLER_PATH=/null|/null/read|/inject` runs one path N times and nothing else, for
//! counting instructions under valgrind.
// A benchmark with a broken fixture must stop at once.
#![allow(clippy::expect_used)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use splice_server::server::Handler;

#[path = "../../benches/common/mod.rs"]
mod common;
use common::{PODS, compile, load_average, thread_cpu_ns};

/// An AdmissionReview as the API server sends it for a pod CREATE: user info, no old object.
fn review(pod: &str) -> Bytes {
    Bytes::from(format!(
        r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002","kind":{{"group":"","version":"v1","kind":"Pod"}},"resource":{{"group":"","version":"v1","resource":"pods"}},"requestKind":{{"group":"","version":"v1","kind":"Pod"}},"requestResource":{{"group":"","version":"v1","resource":"pods"}},"namespace":"shop","operation":"CREATE","userInfo":{{"username":"system:serviceaccount:kube-system:replicaset-controller","uid":"6d1a4c8e-0000-4000-8000-000000000001","groups":["system:serviceaccounts","system:serviceaccounts:kube-system","system:authenticated"]}},"object":{pod},"oldObject":null,"dryRun":false,"options":{{"kind":"CreateOptions","apiVersion":"meta.k8s.io/v1"}}}}}}"#
    ))
}

fn handler() -> (Handler, String) {
    let compiled = compile(common::POLICY);
    let path = format!("/inject/{}", compiled.name());
    (Handler::with_static_policies([compiled]), path)
}

/// One request through the handler, the response body read to the end.
fn call(rt: &tokio::runtime::Runtime, handler: &Handler, path: &str, body: &Bytes) -> (u16, Bytes) {
    let request = http::Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/json")
        .header("content-length", body.len())
        .body(Full::new(body.clone()))
        .expect("request");
    rt.block_on(async {
        let response = handler.handle(request).await;
        let status = response.status().as_u16();
        let out = response
            .into_body()
            .collect()
            .await
            .expect("in-memory body")
            .to_bytes();
        (status, out)
    })
}

/// Mean CPU µs per call of `f`, best of 5 batches. A batch runs for at least 150 ms of wall time:
/// the scheduler accounts a running thread's CPU time at tick granularity, so shorter batches
/// read as zero.
fn best_cpu_us(mut f: impl FnMut()) -> Option<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let wall = std::time::Instant::now();
        let start = thread_cpu_ns()?;
        let mut calls = 0u32;
        while calls < 100 || wall.elapsed() < std::time::Duration::from_millis(150) {
            for _ in 0..16 {
                f();
            }
            calls += 16;
        }
        let end = thread_cpu_ns()?;
        best = best.min((end - start) as f64 / 1e3 / f64::from(calls));
    }
    Some(best)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let (handler, inject) = handler();
    if let Some(n) = std::env::var("HANDLER_CALLS")
        .ok()
        .and_then(|n| n.parse::<u32>().ok())
    {
        let path = match std::env::var("HANDLER_PATH").as_deref() {
            Ok(path @ ("/null" | "/null/read")) => path.to_owned(),
            _ => inject,
        };
        let body = review(PODS[1].1);
        for _ in 0..n {
            std::hint::black_box(call(&rt, &handler, &path, std::hint::black_box(&body)));
        }
        return;
    }
    if thread_cpu_ns().is_none() {
        println!("(no thread CPU clock: nothing to measure)");
        return;
    }
    println!(
        "\nHandler::handle, CPU µs per request (thread CPU time, best of 5 batches; load average {}):",
        load_average()
    );
    println!(
        "| review | /null | /null/read | /inject (sidecar, warm) | beyond null | inject req/s ÷ null req/s |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, pod) in PODS {
        let body = review(pod);
        let (status, out) = call(&rt, &handler, "/null", &body);
        assert_eq!(status, 200, "null: {}", String::from_utf8_lossy(&out));
        let (status, out) = call(&rt, &handler, &inject, &body);
        assert!(
            status == 200 && out.windows(9).any(|w| w == b"\"patch\":\""),
            "inject: {status} {}",
            String::from_utf8_lossy(&out)
        );
        let (status, out) = call(&rt, &handler, "/null/read", &body);
        assert_eq!(status, 200, "null/read: {}", String::from_utf8_lossy(&out));
        let null = best_cpu_us(|| {
            std::hint::black_box(call(&rt, &handler, "/null", &body));
        })
        .unwrap_or(f64::NAN);
        let read = best_cpu_us(|| {
            std::hint::black_box(call(&rt, &handler, "/null/read", &body));
        })
        .unwrap_or(f64::NAN);
        let injected = best_cpu_us(|| {
            std::hint::black_box(call(&rt, &handler, &inject, &body));
        })
        .unwrap_or(f64::NAN);
        println!(
            "| {name} ({} B) | {null:.1} | {read:.1} | {injected:.1} | {:.1} | {:.2} |",
            body.len(),
            injected - null,
            null / injected
        );
    }
}
