//! Test harness: a CA, serving certificates, a running server and a raw HTTP/1.1-over-TLS client
//! (raw so tests can send malformed and trickled requests).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use splice_server::admin::Readiness;
use splice_server::metrics::{Metrics, Registry};
use splice_server::server::{ServeSummary, WebhookConfig, WebhookServer};
use splice_server::store::{NamespaceStore, PolicyStore};
use splice_server::tls::{CertResolver, certified_key_from_pem};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

pub struct Ca {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    pub der: CertificateDer<'static>,
}

impl Ca {
    pub fn new() -> Self {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "splice test CA");
        let cert = params.self_signed(&key).unwrap();
        Ca {
            der: cert.der().clone(),
            params,
            key,
        }
    }

    /// A serving certificate for `localhost` / 127.0.0.1, as (chain PEM, key PEM).
    pub fn issue(&self) -> (String, String) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "splice-webhook");
        let issuer = rcgen::Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    pub fn issue_key(&self) -> Arc<rustls::sign::CertifiedKey> {
        let (chain, key) = self.issue();
        certified_key_from_pem(chain.as_bytes(), key.as_bytes()).unwrap()
    }

    pub fn connector(&self) -> TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.der.clone()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(splice_server::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        TlsConnector::from(Arc::new(config))
    }
}

pub struct Running {
    pub addr: SocketAddr,
    pub ca: Ca,
    pub resolver: Arc<CertResolver>,
    pub metrics: Arc<Metrics>,
    /// The registry `metrics` is exported from.
    pub registry: Registry,
    pub policies: Arc<PolicyStore>,
    pub namespaces: Arc<NamespaceStore>,
    pub readiness: Arc<Readiness>,
    stop: Option<oneshot::Sender<()>>,
    pub task: Option<JoinHandle<ServeSummary>>,
}

impl Running {
    pub async fn start(config: WebhookConfig) -> Running {
        Self::start_with(config, Arc::new(PolicyStore::new()), None).await
    }

    pub async fn start_with(
        config: WebhookConfig,
        policies: Arc<PolicyStore>,
        hook: Option<Arc<dyn splice_server::server::AdmissionHook>>,
    ) -> Running {
        let ca = Ca::new();
        let resolver = Arc::new(CertResolver::with_key(ca.issue_key()));
        let mut registry = Registry::default();
        let metrics = Arc::new(Metrics::register(&mut registry));
        let namespaces = Arc::new(NamespaceStore::new());
        let readiness = Arc::new(Readiness::new(Arc::clone(&resolver)));
        readiness.set_caches_synced(true);
        let server = WebhookServer::with_hook(
            config,
            Arc::clone(&policies),
            Arc::clone(&namespaces),
            Arc::clone(&metrics),
            Arc::clone(&resolver),
            hook,
        )
        .unwrap()
        .readiness(Arc::clone(&readiness));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(listener, async {
            let _ = stopped.await;
        }));
        Running {
            addr,
            ca,
            resolver,
            metrics,
            registry,
            policies,
            namespaces,
            readiness,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    pub async fn stopped(&mut self) -> ServeSummary {
        self.shutdown();
        self.task.take().unwrap().await.unwrap()
    }

    pub async fn connect(&self) -> TlsStream<TcpStream> {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        self.ca
            .connector()
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap()
    }
}

pub fn config() -> WebhookConfig {
    let mut config = WebhookConfig::new("splice-system");
    #[cfg(feature = "bench-baselines")]
    {
        config.null_handler = true;
    }
    config.cache_wait = None;
    config
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub fn post(path: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

/// Reads one response (Content-Length framed, as the server always frames them). `None` when the
/// connection closes before a response.
pub async fn read_reply<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    pending: &mut Vec<u8>,
) -> Option<Reply> {
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).into_owned();
            let mut lines = head.split("\r\n");
            let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
            let headers: Vec<(String, String)> = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .collect();
            let length: usize = headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            while pending.len() < end + 4 + length {
                let mut buf = [0u8; 16384];
                let n = stream.read(&mut buf).await.ok()?;
                if n == 0 {
                    return None;
                }
                pending.extend_from_slice(&buf[..n]);
            }
            let body = pending[end + 4..end + 4 + length].to_vec();
            pending.drain(..end + 4 + length);
            return Some(Reply {
                status,
                headers,
                body,
            });
        }
        let mut buf = [0u8; 16384];
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        pending.extend_from_slice(&buf[..n]);
    }
}

/// One request on a fresh connection.
pub async fn exchange(server: &Running, request: &[u8]) -> Reply {
    let mut stream = server.connect().await;
    stream.write_all(request).await.unwrap();
    read_reply(&mut stream, &mut Vec::new())
        .await
        .expect("a response")
}

/// True when the peer closes the connection (EOF or reset) within `within`.
pub async fn closes_within<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    within: Duration,
) -> bool {
    let mut buf = [0u8; 1024];
    match tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    {
        Ok(()) => true,
        Err(_) => false,
    }
}

pub fn review(request: &str) -> String {
    format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{request}}}"#
    )
}

pub fn pod_review(uid: &str, namespace: &str, dry_run: bool, pod: &str) -> String {
    review(&format!(
        r#"{{"uid":"{uid}","kind":{{"group":"","version":"v1","kind":"Pod"}},"resource":{{"group":"","version":"v1","resource":"pods"}},"requestKind":{{"group":"","version":"v1","kind":"Pod"}},"namespace":"{namespace}","operation":"CREATE","userInfo":{{"username":"tester"}},"object":{pod},"oldObject":null,"dryRun":{dry_run},"options":{{"apiVersion":"meta.k8s.io/v1","kind":"CreateOptions"}}}}"#
    ))
}

pub const SMALL_POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web","namespace":"team-a","labels":{"app":"web"}},"spec":{"containers":[{"name":"app","image":"nginx:1.27"}]}}"#;
