//! The admin server: plain HTTP on its own port, for the kubelet and Prometheus.
//!
//! - `GET /healthz`: 200 while the process serves at all (liveness).
//! - `GET /readyz`: 200 only with a certificate loaded, the caches synced and no shutdown under
//!   way; otherwise 503 naming each unmet condition.
//! - `GET /metrics`: the metrics [`Registry`] in the Prometheus text format.
//!
//! On hyper directly, like the admission server: three GET routes need no framework.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::metrics::{self, Registry};
use crate::tls::CertResolver;

/// Whether this replica should receive admission traffic.
#[derive(Debug)]
pub struct Readiness {
    certificate: Arc<CertResolver>,
    caches_synced: AtomicBool,
    draining: AtomicBool,
}

impl Readiness {
    /// Not ready until `certificate` holds a key and [`Readiness::set_caches_synced`] is called.
    pub fn new(certificate: Arc<CertResolver>) -> Self {
        Readiness {
            certificate,
            caches_synced: AtomicBool::new(false),
            draining: AtomicBool::new(false),
        }
    }

    /// The operator calls this once its policy and namespace reflectors have listed everything
    /// (and with `false` if a re-list starts over); static mode has nothing to sync.
    pub fn set_caches_synced(&self, synced: bool) {
        self.caches_synced.store(synced, Ordering::Release);
    }

    /// Shutdown has begun: report not ready from now on.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.unmet().is_empty()
    }

    /// Each condition that keeps this replica from being ready.
    pub fn unmet(&self) -> Vec<&'static str> {
        let mut unmet = Vec::new();
        if !self.certificate.is_loaded() {
            unmet.push("no serving certificate loaded");
        }
        if !self.caches_synced.load(Ordering::Acquire) {
            unmet.push("policy and namespace caches not synced");
        }
        if self.draining.load(Ordering::Acquire) {
            unmet.push("shutting down");
        }
        unmet
    }
}

/// Serves `/healthz`, `/readyz` and `/metrics`.
#[derive(Clone, Debug)]
pub struct AdminServer {
    registry: Arc<Registry>,
    readiness: Arc<Readiness>,
}

impl AdminServer {
    pub fn new(registry: Arc<Registry>, readiness: Arc<Readiness>) -> Self {
        AdminServer {
            registry,
            readiness,
        }
    }

    /// Answers one admin request.
    pub fn handle<B>(&self, request: &Request<B>) -> Response<Full<Bytes>> {
        if request.method() != Method::GET && request.method() != Method::HEAD {
            let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET is allowed\n");
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return response;
        }
        match request.uri().path() {
            "/healthz" | "/livez" => plain(StatusCode::OK, "ok\n"),
            "/readyz" => {
                let unmet = self.readiness.unmet();
                if unmet.is_empty() {
                    plain(StatusCode::OK, "ok\n")
                } else {
                    let mut body = String::new();
                    for reason in unmet {
                        body.push_str(reason);
                        body.push('\n');
                    }
                    plain(StatusCode::SERVICE_UNAVAILABLE, body)
                }
            }
            "/metrics" => {
                let mut response =
                    Response::new(Full::new(Bytes::from(metrics::render(&self.registry))));
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(metrics::CONTENT_TYPE),
                );
                response
            }
            _ => plain(
                StatusCode::NOT_FOUND,
                "not found; try /healthz, /readyz or /metrics\n",
            ),
        }
    }

    /// Serves `listener` until `shutdown` completes.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        let mut connections = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let server = self.clone();
                        connections.spawn(async move {
                            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                                let response = server.handle(&request);
                                async move { Ok::<_, Infallible>(response) }
                            });
                            let mut builder = http1::Builder::new();
                            builder
                                .timer(TokioTimer::new())
                                .header_read_timeout(Duration::from_secs(30));
                            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "admin accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
        connections.shutdown().await;
    }
}

fn plain(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn get(server: &AdminServer, path: &str) -> (StatusCode, String) {
        let request = Request::get(path).body(()).unwrap();
        let response = server.handle(&request);
        let status = response.status();
        let body = futures_body(response.into_body());
        (status, body)
    }

    fn futures_body(body: Full<Bytes>) -> String {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes = rt.block_on(body.collect()).unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    fn key() -> Arc<rustls::sign::CertifiedKey> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["x".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        crate::tls::certified_key_from_pem(cert.pem().as_bytes(), key.serialize_pem().as_bytes())
            .unwrap()
    }

    #[test]
    fn readiness_needs_a_certificate_and_synced_caches_and_drops_on_shutdown() {
        let resolver = Arc::new(CertResolver::new());
        let readiness = Arc::new(Readiness::new(Arc::clone(&resolver)));
        let server = AdminServer::new(Arc::default(), Arc::clone(&readiness));

        let (status, body) = get(&server, "/readyz");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("no serving certificate loaded"), "{body}");
        assert!(body.contains("caches not synced"), "{body}");

        resolver.swap(key());
        readiness.set_caches_synced(true);
        assert_eq!(get(&server, "/readyz"), (StatusCode::OK, "ok\n".to_owned()));

        readiness.set_draining();
        let (status, body) = get(&server, "/readyz");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "shutting down\n");
        // Liveness is unaffected by readiness.
        assert_eq!(get(&server, "/healthz").0, StatusCode::OK);
    }

    #[test]
    fn metrics_are_served_as_prometheus_text() {
        let mut registry = Registry::default();
        let metrics = metrics::Metrics::register(&mut registry);
        metrics
            .admission("mesh")
            .observe(metrics::Outcome::Injected, Duration::from_millis(1));
        let readiness = Arc::new(Readiness::new(Arc::new(CertResolver::new())));
        let server = AdminServer::new(Arc::new(registry), readiness);
        let request = Request::get("/metrics").body(()).unwrap();
        let response = server.handle(&request);
        assert_eq!(
            response.headers().get(header::CONTENT_TYPE).unwrap(),
            metrics::CONTENT_TYPE
        );
        let body = futures_body(response.into_body());
        assert!(
            body.contains(
                "splice_admission_requests_total{policy=\"mesh\",outcome=\"injected\"} 1"
            ),
            "{body}"
        );
    }

    #[test]
    fn other_paths_and_methods_are_refused() {
        let readiness = Arc::new(Readiness::new(Arc::new(CertResolver::new())));
        let server = AdminServer::new(Arc::default(), readiness);
        assert_eq!(get(&server, "/nope").0, StatusCode::NOT_FOUND);
        let post = Request::post("/metrics").body(()).unwrap();
        assert_eq!(
            server.handle(&post).status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
    }
}
