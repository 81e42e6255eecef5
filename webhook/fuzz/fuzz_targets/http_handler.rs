//! Raw bytes → an HTTP/1.1 request (parsed with httparse) → the webhook's request handler, with a
//! real compiled policy loaded and no TLS. Checks, beyond "no panic":
//! - the status is one the handler is documented to return;
//! - a 200 is an allowing AdmissionReview echoing a non-empty uid;
//! - a patch, when present, is base64 JSON Patch that applies cleanly to the request's object.
#![no_main]

use std::sync::LazyLock;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use libfuzzer_sys::fuzz_target;
use splice_engine::CompiledPolicy;
use splice_server::server::Handler;

const POLICY: &str = include_str!("../../testdata/policy-sidecar.yaml");

struct Harness {
    runtime: tokio::runtime::Runtime,
    handler: Handler,
}

static HARNESS: LazyLock<Harness> = LazyLock::new(|| {
    let policy: splice_crds::InjectionPolicy =
        serde_yaml::from_str(POLICY).expect("the fixture policy parses");
    let name = policy
        .metadata
        .name
        .clone()
        .expect("the fixture policy has a name");
    let compiled = CompiledPolicy::compile(&name, 1, &policy.spec).expect("the fixture compiles");
    let handler = Handler::with_static_policies([compiled]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    Harness { runtime, handler }
});

fn parse(data: &[u8]) -> Option<(http::Request<Full<Bytes>>, Bytes)> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut parsed = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(head_len) = parsed.parse(data).ok()? else {
        return None;
    };
    let mut builder = http::Request::builder()
        .method(parsed.method?)
        .uri(parsed.path?);
    for header in parsed.headers.iter() {
        let name = http::HeaderName::from_bytes(header.name.as_bytes()).ok()?;
        let value = http::HeaderValue::from_bytes(header.value).ok()?;
        builder = builder.header(name, value);
    }
    let body = Bytes::copy_from_slice(data.get(head_len..)?);
    let request = builder.body(Full::new(body.clone())).ok()?;
    Some((request, body))
}

fuzz_target!(|data: &[u8]| {
    let Some((request, body_in)) = parse(data) else {
        return;
    };
    let harness = &*HARNESS;
    let response = harness.runtime.block_on(harness.handler.handle(request));
    let status = response.status().as_u16();
    assert!(
        matches!(status, 200 | 400 | 404 | 405 | 413 | 415 | 500),
        "unexpected status {status}"
    );
    let body_out = harness
        .runtime
        .block_on(response.into_body().collect())
        .expect("a Full body cannot fail")
        .to_bytes();
    if status == 500 {
        // Engine errors are fine; a caught engine panic is a bug (and libFuzzer's panic hook
        // aborts on it before we get here anyway).
        assert!(!body_out.starts_with(b"splice could not compute the injection: internal error"));
    }
    if status != 200 {
        return;
    }
    let review: serde_json::Value = serde_json::from_slice(&body_out).expect("a 200 carries JSON");
    let response = &review["response"];
    assert_eq!(response["allowed"], true);
    let Some(patch) = response.get("patch").and_then(|p| p.as_str()) else {
        return;
    };
    assert_eq!(response["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .expect("the patch is base64");
    let patch: json_patch::Patch = serde_json::from_slice(&patch).expect("the patch is JSON Patch");
    // The server never parses numbers it does not read, so a body it patched may still hold one
    // serde_json::Value cannot represent (1e999); the patch was checked above, the apply is not.
    let Ok(sent) = serde_json::from_slice::<serde_json::Value>(&body_in) else {
        return;
    };
    let mut object = sent["request"]["object"].clone();
    json_patch::patch(&mut object, &patch)
        .expect("the patch applies to the object it was made for");
});
