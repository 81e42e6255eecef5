//! The admission server over real TLS: protocol, bad input, timeouts, certificate swap, drain.
//! Nothing here needs a compiled policy (see server_injection.rs for that).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod server_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use server_common::*;
use splice_server::metrics::Outcome;
use splice_server::server::UNKNOWN_POLICY_LABEL;
use tokio::io::AsyncWriteExt;

#[tokio::test]
async fn an_unknown_policy_is_allowed_unchanged_with_a_warning_and_counted() {
    let server = Running::start(config()).await;
    let body = pod_review("uid-7", "team-a", false, SMALL_POD);
    let reply = exchange(
        &server,
        &post(
            "/inject/nope?timeout=3s",
            "application/json",
            body.as_bytes(),
        ),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    assert_eq!(v["response"]["uid"], "uid-7");
    assert_eq!(v["response"]["allowed"], true);
    assert!(v["response"].get("patch").is_none());
    assert!(v["response"].get("patchType").is_none());
    let warning = v["response"]["warnings"][0].as_str().unwrap();
    assert!(warning.contains("no InjectionPolicy"), "{warning}");
    assert_eq!(
        server
            .metrics
            .admission(UNKNOWN_POLICY_LABEL)
            .requests(Outcome::UnknownPolicy),
        1
    );
    // The path's name never becomes a label value.
    assert!(server.metrics.admission_if_seen("nope").is_none());
}

#[tokio::test]
async fn bad_bodies_get_400_with_the_reason() {
    let server = Running::start(config()).await;
    let full = pod_review("u", "team-a", false, SMALL_POD);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", Vec::new(), "empty"),
        (
            "truncated",
            full.as_bytes()[..full.len() / 2].to_vec(),
            "truncated",
        ),
        ("not json", b"<xml/>".to_vec(), "not JSON"),
        (
            "no request",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
            "no request",
        ),
        (
            "no uid",
            review(r#"{"kind":{"version":"v1","kind":"Pod"},"operation":"CREATE"}"#).into_bytes(),
            "request.uid",
        ),
        (
            "v1beta1",
            full.replace("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
                .into_bytes(),
            "apiVersion",
        ),
    ];
    for (name, body, reason) in cases {
        let reply = exchange(&server, &post("/inject/nope", "application/json", &body)).await;
        assert_eq!(reply.status, 400, "{name}: {}", reply.text());
        assert!(reply.text().contains(reason), "{name}: {}", reply.text());
    }
}

#[tokio::test]
async fn wrong_method_and_content_type_are_refused() {
    let server = Running::start(config()).await;
    let reply = exchange(
        &server,
        b"GET /inject/p HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .await;
    assert_eq!(reply.status, 405);
    assert_eq!(reply.header("allow"), Some("POST"));

    let body = pod_review("u", "team-a", false, SMALL_POD);
    let reply = exchange(&server, &post("/inject/p", "text/plain", body.as_bytes())).await;
    assert_eq!(reply.status, 415);
    let reply = exchange(
        &server,
        &post(
            "/inject/p",
            "application/json; charset=utf-8",
            body.as_bytes(),
        ),
    )
    .await;
    assert_eq!(reply.status, 200);

    let reply = exchange(
        &server,
        &post("/mutate", "application/json", body.as_bytes()),
    )
    .await;
    assert_eq!(reply.status, 404);
}

#[tokio::test]
async fn a_body_over_3_mib_gets_413_whether_declared_or_streamed() {
    let server = Running::start(config()).await;
    // Declared: refused from the headers, before any body is read.
    let mut stream = server.connect().await;
    stream
        .write_all(
            b"POST /inject/p HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 3145729\r\n\r\n",
        )
        .await
        .unwrap();
    let reply = read_reply(&mut stream, &mut Vec::new()).await.unwrap();
    assert_eq!(reply.status, 413);

    // Streamed in chunks with no length: refused once the running total passes the cap.
    let mut stream = server.connect().await;
    stream
        .write_all(
            b"POST /inject/p HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .await
        .unwrap();
    let chunk = vec![b' '; 256 * 1024];
    let mut sent = 0usize;
    let writer = async {
        while sent <= 4 * 1024 * 1024 {
            let head = format!("{:x}\r\n", chunk.len());
            if stream.write_all(head.as_bytes()).await.is_err()
                || stream.write_all(&chunk).await.is_err()
                || stream.write_all(b"\r\n").await.is_err()
            {
                break;
            }
            sent += chunk.len();
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    let reply = read_reply(&mut stream, &mut Vec::new()).await.unwrap();
    assert_eq!(reply.status, 413);
    assert!(reply.text().contains("3145728"), "{}", reply.text());
}

#[tokio::test]
async fn the_null_handler_answers_allowed_with_the_uid_and_is_off_by_default() {
    let server = Running::start(config()).await;
    let body = pod_review("null-uid", "team-a", false, SMALL_POD);
    let reply = exchange(&server, &post("/null", "application/json", body.as_bytes())).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["response"]["uid"], "null-uid");
    assert_eq!(reply.json()["response"]["allowed"], true);

    let mut off = config();
    off.null_handler = false;
    let server = Running::start(off).await;
    let reply = exchange(&server, &post("/null", "application/json", body.as_bytes())).await;
    assert_eq!(reply.status, 404);
}

#[tokio::test]
async fn the_null_read_baseline_reads_the_review_then_allows_without_a_patch() {
    let server = Running::start(config()).await;
    let body = pod_review("read-uid", "team-a", false, SMALL_POD);
    let reply = exchange(
        &server,
        &post("/null/read", "application/json", body.as_bytes()),
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["response"]["uid"], "read-uid");
    assert_eq!(reply.json()["response"]["allowed"], true);
    assert!(reply.json()["response"].get("patch").is_none());

    // It reads what /inject reads: a review /null would answer is refused here.
    let truncated = &body.as_bytes()[..body.len() - 3];
    let reply = exchange(&server, &post("/null", "application/json", truncated)).await;
    assert_eq!(reply.status, 200);
    let reply = exchange(&server, &post("/null/read", "application/json", truncated)).await;
    assert_eq!(reply.status, 400);
    assert!(reply.text().contains("truncated"), "{}", reply.text());

    let mut off = config();
    off.null_handler = false;
    let server = Running::start(off).await;
    let reply = exchange(
        &server,
        &post("/null/read", "application/json", body.as_bytes()),
    )
    .await;
    assert_eq!(reply.status, 404);
}

#[tokio::test]
async fn the_null_containers_baseline_appends_n_constant_containers_and_refuses_other_counts() {
    let server = Running::start(config()).await;
    let body = pod_review("n-uid", "team-a", false, SMALL_POD);
    let reply = exchange(
        &server,
        &post("/null/containers/3", "application/json", body.as_bytes()),
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["response"]["uid"], "n-uid");
    let patch = reply.json()["response"]["patch"]
        .as_str()
        .map(|p| base64::engine::general_purpose::STANDARD.decode(p).unwrap())
        .unwrap();
    let ops: Vec<serde_json::Value> = serde_json::from_slice(&patch).unwrap();
    let names: Vec<&str> = ops
        .iter()
        .map(|op| op["value"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["null-sidecar-1", "null-sidecar-2", "null-sidecar-3"]
    );
    assert!(ops.iter().all(|op| op["path"] == "/spec/containers/-"));
    for path in [
        "/null/containers/0",
        "/null/containers/33",
        "/null/containers/x",
    ] {
        let reply = exchange(&server, &post(path, "application/json", body.as_bytes())).await;
        assert_eq!(reply.status, 404, "{path}");
    }
}

#[tokio::test]
async fn one_connection_serves_many_requests() {
    let server = Running::start(config()).await;
    let mut stream = server.connect().await;
    let mut pending = Vec::new();
    for i in 0..20 {
        let body = pod_review(&format!("u{i}"), "team-a", false, SMALL_POD);
        stream
            .write_all(&post("/null", "application/json", body.as_bytes()))
            .await
            .unwrap();
        let reply = read_reply(&mut stream, &mut pending).await.unwrap();
        assert_eq!(reply.json()["response"]["uid"], format!("u{i}"));
    }
}

#[tokio::test]
async fn a_trickled_header_is_cut_off_but_an_idle_connection_is_kept() {
    let mut cfg = config();
    cfg.header_read_timeout = Duration::from_millis(300);
    cfg.idle_timeout = Duration::from_secs(10);
    let server = Running::start(cfg).await;

    let mut slow = server.connect().await;
    slow.write_all(b"POST /null HTTP/1.1\r\nHost: loc")
        .await
        .unwrap();
    let started = Instant::now();
    assert!(closes_within(&mut slow, Duration::from_secs(3)).await);
    assert!(started.elapsed() >= Duration::from_millis(250));

    let mut idle = server.connect().await;
    tokio::time::sleep(Duration::from_millis(900)).await;
    let body = pod_review("late", "team-a", false, SMALL_POD);
    idle.write_all(&post("/null", "application/json", body.as_bytes()))
        .await
        .unwrap();
    let reply = read_reply(&mut idle, &mut Vec::new()).await.unwrap();
    assert_eq!(reply.json()["response"]["uid"], "late");
    // And again after a pause longer than the header timeout between requests.
    tokio::time::sleep(Duration::from_millis(700)).await;
    idle.write_all(&post("/null", "application/json", body.as_bytes()))
        .await
        .unwrap();
    assert_eq!(
        read_reply(&mut idle, &mut Vec::new()).await.unwrap().status,
        200
    );
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let mut cfg = config();
    cfg.idle_timeout = Duration::from_millis(400);
    let server = Running::start(cfg).await;
    let mut stream = server.connect().await;
    let body = pod_review("u", "team-a", false, SMALL_POD);
    stream
        .write_all(&post("/null", "application/json", body.as_bytes()))
        .await
        .unwrap();
    assert_eq!(
        read_reply(&mut stream, &mut Vec::new())
            .await
            .unwrap()
            .status,
        200
    );
    assert!(closes_within(&mut stream, Duration::from_secs(3)).await);
}

#[tokio::test]
async fn a_slow_body_gets_408() {
    let mut cfg = config();
    cfg.body_read_timeout = Duration::from_millis(300);
    let server = Running::start(cfg).await;
    let mut stream = server.connect().await;
    stream
        .write_all(b"POST /null HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\":")
        .await
        .unwrap();
    let reply = read_reply(&mut stream, &mut Vec::new()).await.unwrap();
    assert_eq!(reply.status, 408);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapping_the_certificate_under_load_drops_no_handshake_and_no_request() {
    let server = Arc::new(Running::start(config()).await);
    let first = server.resolver.current().unwrap();
    let second = server.ca.issue_key();
    let first_leaf = first.end_entity_cert().unwrap().as_ref().to_vec();
    let second_leaf = second.end_entity_cert().unwrap().as_ref().to_vec();

    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swaps = Arc::new(AtomicUsize::new(0));
    let swapper = {
        let (server, done, swaps) = (Arc::clone(&server), Arc::clone(&done), Arc::clone(&swaps));
        let (first, second) = (Arc::clone(&first), Arc::clone(&second));
        tokio::spawn(async move {
            let mut flip = false;
            while !done.load(Ordering::Relaxed) {
                server.resolver.swap(if flip {
                    Arc::clone(&first)
                } else {
                    Arc::clone(&second)
                });
                flip = !flip;
                swaps.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        })
    };

    const CLIENTS: usize = 32;
    const CONNECTIONS_EACH: usize = 25;
    let seen_first = Arc::new(AtomicUsize::new(0));
    let seen_second = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let server = Arc::clone(&server);
            let (seen_first, seen_second) = (Arc::clone(&seen_first), Arc::clone(&seen_second));
            let (first_leaf, second_leaf) = (first_leaf.clone(), second_leaf.clone());
            tokio::spawn(async move {
                let mut failures = Vec::new();
                for i in 0..CONNECTIONS_EACH {
                    let uid = format!("c{c}-{i}");
                    let body = pod_review(&uid, "team-a", false, SMALL_POD);
                    // A fresh TCP connection and a full handshake each time.
                    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
                    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                    let mut tls = match server.ca.connector().connect(name, tcp).await {
                        Ok(tls) => tls,
                        Err(e) => {
                            failures.push(format!("{uid}: handshake: {e}"));
                            continue;
                        }
                    };
                    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0]
                        .as_ref()
                        .to_vec();
                    if leaf == first_leaf {
                        seen_first.fetch_add(1, Ordering::Relaxed);
                    } else if leaf == second_leaf {
                        seen_second.fetch_add(1, Ordering::Relaxed);
                    }
                    let path = if i % 2 == 0 {
                        "/null"
                    } else {
                        "/inject/unknown"
                    };
                    if let Err(e) = tls
                        .write_all(&post(path, "application/json", body.as_bytes()))
                        .await
                    {
                        failures.push(format!("{uid}: write: {e}"));
                        continue;
                    }
                    match read_reply(&mut tls, &mut Vec::new()).await {
                        Some(reply)
                            if reply.status == 200
                                && reply.json()["response"]["uid"] == uid.as_str() => {}
                        other => failures.push(format!("{uid}: {other:?}")),
                    }
                }
                failures
            })
        })
        .collect();
    let mut failures = Vec::new();
    for client in clients {
        failures.extend(client.await.unwrap());
    }
    done.store(true, Ordering::Relaxed);
    swapper.await.unwrap();

    assert!(
        failures.is_empty(),
        "{} failures: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let (a, b) = (
        seen_first.load(Ordering::Relaxed),
        seen_second.load(Ordering::Relaxed),
    );
    assert_eq!(a + b, CLIENTS * CONNECTIONS_EACH);
    assert!(
        a > 0 && b > 0,
        "both certificates must have been served (first {a}, second {b})"
    );
    assert!(swaps.load(Ordering::Relaxed) > 10);
}

#[tokio::test]
async fn shutdown_turns_readiness_false_finishes_the_request_in_flight_and_closes() {
    let mut server = Running::start(config()).await;
    assert!(server.readiness.is_ready());

    // A request whose body is only half sent when shutdown begins.
    let body = pod_review("in-flight", "team-a", false, SMALL_POD);
    let request = post("/null", "application/json", body.as_bytes());
    let (first, rest) = request.split_at(request.len() - 20);
    let mut stream = server.connect().await;
    stream.write_all(first).await.unwrap();
    // An idle keep-alive connection, which should simply be closed.
    let mut idle = server.connect().await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    server.shutdown();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!server.readiness.is_ready());
    assert!(closes_within(&mut idle, Duration::from_secs(2)).await);

    stream.write_all(rest).await.unwrap();
    let reply = read_reply(&mut stream, &mut Vec::new()).await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["response"]["uid"], "in-flight");
    assert_eq!(reply.header("connection"), Some("close"));

    let summary = server.stopped().await;
    assert_eq!(summary.aborted, 0);
    assert!(summary.connections >= 2);
    assert!(tokio::net::TcpStream::connect(server.addr).await.is_err());
}

#[tokio::test]
async fn the_drain_timeout_closes_a_connection_that_never_finishes() {
    let mut cfg = config();
    cfg.drain_timeout = Duration::from_millis(200);
    cfg.body_read_timeout = Duration::from_secs(30);
    let mut server = Running::start(cfg).await;
    let mut stream = server.connect().await;
    stream
        .write_all(b"POST /null HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let summary = server.stopped().await;
    assert_eq!(summary.aborted, 1);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(closes_within(&mut stream, Duration::from_secs(1)).await);
}

#[tokio::test]
async fn a_shutdown_delay_keeps_serving_while_not_ready() {
    let mut cfg = config();
    cfg.shutdown_delay = Duration::from_millis(500);
    let mut server = Running::start(cfg).await;
    server.shutdown();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!server.readiness.is_ready());
    let body = pod_review("during-delay", "team-a", false, SMALL_POD);
    let reply = exchange(&server, &post("/null", "application/json", body.as_bytes())).await;
    assert_eq!(reply.status, 200);
    server.stopped().await;
}

#[tokio::test]
async fn during_the_shutdown_delay_a_pooled_connection_is_answered_then_retired_with_connection_close()
 {
    let mut cfg = config();
    cfg.shutdown_delay = Duration::from_millis(800);
    let mut server = Running::start(cfg).await;
    let mut stream = server.connect().await;
    let mut pending = Vec::new();
    let body = pod_review("before", "team-a", false, SMALL_POD);
    stream
        .write_all(&post("/null", "application/json", body.as_bytes()))
        .await
        .unwrap();
    let reply = read_reply(&mut stream, &mut pending).await.unwrap();
    assert_eq!(reply.status, 200);
    assert_ne!(reply.header("connection"), Some("close"));
    server.shutdown();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The same kept-alive connection: still served, told to close, and closed.
    let body = pod_review("during-delay", "team-a", false, SMALL_POD);
    stream
        .write_all(&post("/null", "application/json", body.as_bytes()))
        .await
        .unwrap();
    let reply = read_reply(&mut stream, &mut pending).await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("connection"), Some("close"));
    assert!(closes_within(&mut stream, Duration::from_millis(500)).await);
    server.stopped().await;
}

#[tokio::test]
async fn the_drain_closes_an_idle_connection_only_once_it_has_been_idle_drain_idle_and_answers_it_meanwhile()
 {
    let mut cfg = config();
    cfg.drain_idle = Duration::from_millis(700);
    let mut server = Running::start(cfg).await;
    let mut used = server.connect().await;
    let mut unused = server.connect().await;
    let connected = Instant::now();
    server.shutdown();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        tokio::net::TcpStream::connect(server.addr).await.is_err(),
        "the listener is closed: the drain has begun"
    );
    // A pooled connection picked during the drain is answered, told to close, and closed.
    let body = pod_review("in-drain", "team-a", false, SMALL_POD);
    used.write_all(&post("/null", "application/json", body.as_bytes()))
        .await
        .unwrap();
    let reply = read_reply(&mut used, &mut Vec::new()).await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("connection"), Some("close"));
    assert!(closes_within(&mut used, Duration::from_millis(500)).await);
    // The one never used is closed by the drain, but not before it has been idle 700 ms.
    assert!(closes_within(&mut unused, Duration::from_secs(3)).await);
    assert!(
        connected.elapsed() >= Duration::from_millis(650),
        "closed after {:?}",
        connected.elapsed()
    );
    assert_eq!(server.stopped().await.aborted, 0);
}

#[tokio::test]
async fn raw_garbage_on_the_socket_does_not_disturb_other_clients() {
    let server = Running::start(config()).await;
    for garbage in [
        &b"\x00\x01\x02\x03"[..],
        b"POST /inject/x HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        b"POST /inject/x HTTP/9.9\r\n\r\n",
        b"POST /inject/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\nzz\r\n",
    ] {
        let mut stream = server.connect().await;
        stream.write_all(garbage).await.unwrap();
        let mut pending = Vec::new();
        if let Some(reply) = read_reply(&mut stream, &mut pending).await {
            assert!(reply.status >= 400, "{reply:?}");
        }
    }
    // Plain TCP without TLS.
    let mut plain = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    plain.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    assert!(closes_within(&mut plain, Duration::from_secs(3)).await);

    let body = pod_review("fine", "team-a", false, SMALL_POD);
    let reply = exchange(&server, &post("/null", "application/json", body.as_bytes())).await;
    assert_eq!(reply.status, 200);
}
