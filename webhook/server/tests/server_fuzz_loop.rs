//! A randomized loop over the request handler, the stable-toolchain twin of the `http_handler`
//! cargo-fuzz target: mutated AdmissionReview requests (byte flips, truncation, splices of JSON
//! fragments, header changes) must never panic and must keep the handler's promises. Runs
//! `SPLICE_FUZZ_ITERS` iterations (default 3000) from seed `SPLICE_FUZZ_SEED`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use splice_engine::CompiledPolicy;
use splice_server::server::Handler;

const POLICY: &str = include_str!("../../testdata/policy-sidecar.yaml");
const POD_3K: &str = include_str!("../../testdata/pod-3k.json");
const SMALL_POD: &str = r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web","namespace":"shop","labels":{"app":"web"},"annotations":{"a/b~c":"x"}},"spec":{"containers":[{"name":"app","image":"nginx","env":[{"name":"MESH_ENABLED","value":"no"}]}],"volumes":[{"name":"mesh-certs","emptyDir":{}}]}}"#;

const FRAGMENTS: &[&str] = &[
    "null",
    "true",
    "0",
    "-1",
    "1e999",
    "\"\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "[]",
    "{}",
    "[[[[",
    "}}}",
    r#"{"name":"mesh-proxy"}"#,
    r#""initContainers":[]"#,
    r#""containers":null"#,
    r#""labels":{"app":1}"#,
    r#""uid":"x""#,
    r#""operation":"DELETE""#,
    r#""dryRun":"yes""#,
    r#""kind":{"kind":"Pod"}"#,
    r#""namespace":"kube-system""#,
    r#""splice.dev/status":"{}""#,
    "\u{feff}",
    "\\",
    "~1",
    "/",
];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn review(pod: &str, op: &str, ns: &str, dry: bool) -> String {
    format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u-1","kind":{{"group":"","version":"v1","kind":"Pod"}},"resource":{{"group":"","version":"v1","resource":"pods"}},"namespace":"{ns}","operation":"{op}","userInfo":{{"username":"x"}},"object":{pod},"oldObject":null,"dryRun":{dry}}}}}"#
    )
}

fn mutate(rng: &mut Rng, mut body: Vec<u8>) -> Vec<u8> {
    for _ in 0..=rng.below(4) {
        let at = rng.below(body.len() + 1);
        match rng.below(6) {
            0 if !body.is_empty() => {
                let i = rng.below(body.len());
                body[i] ^= 1 << rng.below(8);
            }
            1 => body.truncate(at),
            2 => {
                let f = FRAGMENTS[rng.below(FRAGMENTS.len())];
                body.splice(at..at, f.bytes());
            }
            3 if at < body.len() => {
                // Replace a span with a fragment: often swaps a whole value.
                let end = (at + rng.below(40)).min(body.len());
                let f = FRAGMENTS[rng.below(FRAGMENTS.len())];
                body.splice(at..end, f.bytes());
            }
            4 if !body.is_empty() => {
                let i = rng.below(body.len());
                body.insert(at, body[i]);
            }
            _ => {}
        }
    }
    body
}

fn check(sent: &[u8], status: u16, out: &[u8]) {
    assert!(
        matches!(status, 200 | 400 | 404 | 405 | 413 | 415 | 500),
        "status {status}"
    );
    if status == 500 {
        assert!(
            !out.starts_with(b"splice could not compute the injection: internal error"),
            "the engine panicked on {}",
            String::from_utf8_lossy(sent)
        );
    }
    if status != 200 {
        return;
    }
    let review: serde_json::Value = serde_json::from_slice(out).expect("a 200 carries JSON");
    let response = &review["response"];
    assert_eq!(response["allowed"], true);
    let Some(patch) = response.get("patch").and_then(|p| p.as_str()) else {
        return;
    };
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).expect("JSON Patch");
    // The server never parses numbers it does not read, so a body it patched may still hold one
    // serde_json::Value cannot represent (1e999); the patch was checked above, the apply is not.
    let Ok(sent) = serde_json::from_slice::<serde_json::Value>(sent) else {
        return;
    };
    let mut object = sent["request"]["object"].clone();
    json_patch::patch(&mut object, &patch).unwrap_or_else(|e| {
        panic!(
            "patch does not apply ({e}) to {}",
            sent["request"]["object"]
        )
    });
}

#[test]
fn mutated_requests_never_panic_and_every_patch_applies() {
    let iterations: usize = std::env::var("SPLICE_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let seed: u64 = std::env::var("SPLICE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_cafe);

    let policy: splice_crds::InjectionPolicy = serde_yaml::from_str(POLICY).unwrap();
    let name = policy.metadata.name.clone().unwrap();
    let compiled = CompiledPolicy::compile(&name, 1, &policy.spec).unwrap();
    let handler = Handler::with_static_policies([compiled]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();

    let bases: Vec<String> = vec![
        review(SMALL_POD, "CREATE", "shop", false),
        review(POD_3K, "CREATE", "shop", false),
        review(SMALL_POD, "UPDATE", "shop", true),
        review("null", "DELETE", "shop", false),
        review(SMALL_POD, "CREATE", "kube-system", false),
    ];
    let paths = [
        "/inject/mesh-proxy",
        "/inject/mesh-proxy?timeout=3s",
        "/inject/other",
        "/null",
        "/",
    ];
    let types = [
        "application/json",
        "application/json; charset=utf-8",
        "text/plain",
        "",
    ];
    let mut rng = Rng(seed | 1);
    let (mut ok, mut patched) = (0usize, 0usize);
    for _ in 0..iterations {
        let base = bases[rng.below(bases.len())].clone().into_bytes();
        let body = if rng.below(8) == 0 {
            base
        } else {
            mutate(&mut rng, base)
        };
        let mut request = http::Request::builder()
            .method(if rng.below(20) == 0 { "PUT" } else { "POST" })
            .uri(paths[rng.below(paths.len())]);
        let content_type = types[rng.below(types.len())];
        if !content_type.is_empty() {
            request = request.header("content-type", content_type);
        }
        let request = request.body(Full::new(Bytes::from(body.clone()))).unwrap();
        let response = runtime.block_on(handler.handle(request));
        let status = response.status().as_u16();
        let out = runtime
            .block_on(response.into_body().collect())
            .unwrap()
            .to_bytes();
        check(&body, status, &out);
        if status == 200 {
            ok += 1;
            if out.windows(9).any(|w| w == b"\"patch\":\"") {
                patched += 1;
            }
        }
    }
    eprintln!("{iterations} iterations: {ok} answered 200, {patched} with a patch");
    // The mutations must leave enough valid requests for the patch check to mean something.
    if iterations >= 1000 {
        assert!(
            patched > iterations / 100,
            "only {patched} patched responses"
        );
    }
}
