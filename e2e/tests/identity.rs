//! Pod identity on the real node: Splice's signer answers the kubelet's PodCertificateRequests
//! for the pods a policy with `spec.identity` injected. Three pods of one Deployment get three
//! certificates, each with its SPIFFE ID and chaining to the ClusterTrustBundle Splice publishes;
//! the applications (`testapp serve --tls` / `fetch --tls`) complete mTLS through the pod network
//! in both directions, each checking the other's SPIFFE ID; a hand-written pod naming the signer
//! is Denied with a Warning; a CA rotation under two pods exchanging mTLS requests breaks none of
//! them, while a pod started after it and the early refresh the test forces (`beginRefreshAt`)
//! get certificates under the new CA, which the application serves.
//!
//! Splice runs as a local process (`splice run`); the pods really run on the real node, whose
//! control plane serves PodCertificateRequests (`make up`, unless SPLICE_POD_CERTIFICATES=0).

#[path = "../src/operator.rs"]
mod operator;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::certificates::v1beta1::{ClusterTrustBundle, PodCertificateRequest};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use operator::*;
use serde_json::{Value, json};
use splice_e2e::{NODE_LABEL, TestNamespace, real_node, wait_until};

const SIGNER: &str = "splice.dev/identity";
const SIDECAR: &str = "mtls";
const MOUNT: &str = "/var/run/splice/identity";
const ROOTS: &str = "/var/run/splice/roots";
const PORT: u16 = 8443;

fn report(line: String) {
    splice_e2e::report("identity", line);
}

/// The ClusterTrustBundle of the Splice instance in `splice_ns`.
fn bundle_of(splice_ns: &str) -> String {
    format!("splice.dev:identity:{splice_ns}")
}

/// The roots `splice_ns`'s instance publishes.
async fn roots_of(client: &kube::Client, splice_ns: &str) -> Result<String> {
    let name = bundle_of(splice_ns);
    Ok(Api::<ClusterTrustBundle>::all(client.clone())
        .get(&name)
        .await
        .with_context(|| format!("the trust bundle {name}"))?
        .spec
        .trust_bundle)
}

fn spiffe(ns: &str, sa: &str) -> String {
    format!("spiffe://cluster.local/ns/{ns}/sa/{sa}")
}

/// A policy giving pods of namespaces labelled `<instance>=on` an identity, with a native sidecar
/// that serves HTTPS on it to the pods of service accounts `web` and `client` only.
fn identity_policy(instance: &str) -> Value {
    let peers = "spiffe://cluster.local/ns/{{ namespace.name }}/sa/web,\
                 spiffe://cluster.local/ns/{{ namespace.name }}/sa/client";
    json!({
        "mode": "Auto",
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "identity": {
            "mountPath": MOUNT,
            "trustBundlePath": ROOTS,
            "keyType": "ECDSAP256",
            "maxExpirationSeconds": 3600,
        },
        "template": {"initContainers": [{
            "name": SIDECAR,
            "image": TESTAPP,
            "imagePullPolicy": "Never",
            "restartPolicy": "Always",
            "args": ["serve", "--tls", MOUNT, "--tls-bundle", "credentialbundle.pem",
                     "--tls-roots", format!("{ROOTS}/ca.pem"), "--port", PORT.to_string(),
                     "--peer", peers],
        }]},
    })
}

/// A pod spec on the real node running the test application as service account `sa`.
fn pod_spec(sa: &str) -> Value {
    json!({
        "serviceAccountName": sa,
        "nodeSelector": {NODE_LABEL: "real"},
        "tolerations": [{"key": NODE_LABEL, "operator": "Equal", "value": "real", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "app", "image": TESTAPP, "imagePullPolicy": "Never", "args": ["sleep"]}],
    })
}

async fn service_account(ns: &TestNamespace, name: &str) -> Result<()> {
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    ns.api::<ServiceAccount>()
        .create(&PostParams::default(), &sa)
        .await?;
    Ok(())
}

/// The live pods of `ns` whose sidecar started, by name, with their IPs.
async fn started(ns: &TestNamespace) -> Result<BTreeMap<String, String>> {
    let pods = ns.api::<Pod>().list(&ListParams::default()).await?;
    Ok(pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let status = p.status.as_ref()?;
            let sidecar = status
                .init_container_statuses
                .iter()
                .flatten()
                .find(|c| c.name == SIDECAR)?;
            let ip = status.pod_ip.clone()?;
            (sidecar.started == Some(true)).then(|| (p.name_any(), ip))
        })
        .collect())
}

/// The issued chains of `ns`'s requests to the signer, by pod name, oldest first.
async fn issued(ns: &str) -> Result<BTreeMap<String, Vec<String>>> {
    let api: Api<PodCertificateRequest> = Api::namespaced(splice_e2e::client().await?, ns);
    let mut list = api.list(&ListParams::default()).await?.items;
    list.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .cmp(&b.metadata.creation_timestamp)
    });
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in list.iter().filter(|r| r.spec.signer_name == SIGNER) {
        if let Some(chain) = r.status.as_ref().and_then(|s| s.certificate_chain.clone()) {
            out.entry(r.spec.pod_name.clone()).or_default().push(chain);
        }
    }
    Ok(out)
}

/// The DER certificates of a PEM chain.
fn ders(pem: &str) -> Result<Vec<Vec<u8>>> {
    x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
        .map(|p| Ok(p?.contents))
        .collect()
}

/// The leaf's serial (hex) and its one SPIFFE URI.
fn leaf_of(chain: &str) -> Result<(String, String)> {
    let certs = ders(chain)?;
    let leaf = certs.first().context("an empty chain")?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf)?;
    let san = cert
        .subject_alternative_name()?
        .context("a leaf without a subjectAltName")?;
    let uris: Vec<String> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(u) => Some((*u).to_owned()),
            _ => None,
        })
        .collect();
    ensure!(uris.len() == 1, "one URI SAN expected, got {uris:?}");
    Ok((cert.raw_serial_as_string(), uris[0].clone()))
}

/// Whether each certificate of `chain` is signed by the next, and the last by one of `roots`.
fn chains_to(chain: &str, roots: &str) -> Result<bool> {
    let certs = ders(chain)?;
    let roots = ders(roots)?;
    let parsed: Vec<_> = certs
        .iter()
        .map(|d| x509_parser::parse_x509_certificate(d).map(|(_, c)| c))
        .collect::<Result<_, _>>()?;
    for pair in parsed.windows(2) {
        if pair[0]
            .verify_signature(Some(pair[1].public_key()))
            .is_err()
        {
            return Ok(false);
        }
    }
    let last = parsed.last().context("an empty chain")?;
    for root in &roots {
        let (_, root) = x509_parser::parse_x509_certificate(root)?;
        if last.verify_signature(Some(root.public_key())).is_ok() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A serial as lower-case hex without separators or leading zeros (Go's `%x` of a big.Int).
fn hex(serial: &str) -> String {
    let digits: String = serial
        .chars()
        .filter(char::is_ascii_hexdigit)
        .collect::<String>()
        .to_lowercase();
    digits.trim_start_matches('0').to_owned()
}

/// Runs `testapp fetch` in `pod`'s sidecar against `url`, expecting the server to be `peer`.
fn fetch(ns: &str, pod: &str, url: &str, peer: &str) -> Result<String> {
    kubectl(&[
        "exec",
        "-n",
        ns,
        pod,
        "-c",
        SIDECAR,
        "--",
        "/testapp",
        "fetch",
        "--tls",
        MOUNT,
        "--tls-bundle",
        "credentialbundle.pem",
        "--tls-roots",
        &format!("{ROOTS}/ca.pem"),
        "--peer",
        peer,
        url,
    ])
}

/// Splice with an identity policy, a namespace it selects holding the service accounts `web`
/// and `client`.
async fn start(prefix: &str) -> Result<(Setup, TestNamespace, String)> {
    let setup = Setup::start(prefix).await?;
    let name = setup.policy("id");
    setup.apply(&name, identity_policy(&setup.instance)).await?;
    wait_policy(&setup.client, &name, "True", Duration::from_secs(60)).await?;
    let ns = setup.app_namespace().await?;
    service_account(&ns, "web").await?;
    service_account(&ns, "client").await?;
    Ok((setup, ns, name))
}

#[tokio::test]
async fn three_pods_get_three_certificates_chaining_to_the_bundle_and_complete_mtls_checking_each_others_spiffe_id()
-> Result<()> {
    let client = splice_e2e::client().await?;
    real_node(&client).await?;
    let (setup, ns, _name) = start("identity").await?;
    let mut web = deployment("web", &setup.instance);
    web["spec"]["replicas"] = 3.into();
    web["spec"]["template"]["spec"] = pod_spec("web");
    let created = Instant::now();
    ns.api::<k8s_openapi::api::apps::v1::Deployment>()
        .patch(
            "web",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&web),
        )
        .await?;
    let bare: Pod = serde_json::from_value(json!({
        "metadata": {"name": "client"}, "spec": pod_spec("client"),
    }))?;
    ns.api::<Pod>()
        .create(&PostParams::default(), &bare)
        .await?;
    wait_until(
        Duration::from_secs(180),
        "4 pods with their sidecar started (certificates issued and mounted)",
        || async { Ok(started(&ns).await?.len() == 4) },
    )
    .await?;
    let up = created.elapsed();
    let pods = started(&ns).await?;
    let chains = issued(&ns.name).await?;
    let roots = roots_of(&client, &setup.splice_ns.name).await?;
    let mut serials = Vec::new();
    for (pod, chain) in &chains {
        let chain = chain.last().context("no chain")?;
        let (serial, id) = leaf_of(chain)?;
        let sa = if pod == "client" { "client" } else { "web" };
        ensure!(id == spiffe(&ns.name, sa), "pod {pod}: SPIFFE ID {id}");
        ensure!(
            chains_to(chain, &roots)?,
            "pod {pod}: its chain does not reach its instance's bundle"
        );
        serials.push(serial);
    }
    ensure!(
        chains.len() == 4,
        "4 pods with a certificate expected: {:?}",
        chains.keys()
    );
    serials.sort();
    serials.dedup();
    ensure!(serials.len() == 4, "4 different certificates expected");

    let (client_ip, web_pods): (Vec<_>, Vec<_>) = pods.iter().partition(|(n, _)| *n == "client");
    let (_, client_ip) = client_ip.first().context("the client pod")?;
    let (web_pod, web_ip) = web_pods.first().context("a web pod")?;
    let out = fetch(
        &ns.name,
        "client",
        &format!("https://{web_ip}:{PORT}/whoami"),
        &spiffe(&ns.name, "web"),
    )?;
    let client_id = spiffe(&ns.name, "client");
    ensure!(
        out.contains(&format!("fetch ok peer={}", spiffe(&ns.name, "web")))
            && out.contains(&format!("body={client_id}")),
        "client -> web: {out}"
    );
    let back = fetch(
        &ns.name,
        web_pod,
        &format!("https://{client_ip}:{PORT}/whoami"),
        &client_id,
    )?;
    ensure!(
        back.contains(&format!("fetch ok peer={client_id}")),
        "web -> client: {back}"
    );
    // The client checks the server's ID: a wrong expectation is refused.
    let wrong = fetch(
        &ns.name,
        "client",
        &format!("https://{web_ip}:{PORT}/whoami"),
        &spiffe(&ns.name, "default"),
    );
    ensure!(
        wrong.is_err(),
        "a fetch expecting another SPIFFE ID succeeded: {wrong:?}"
    );
    report(format!(
        "4 pods issued, mounted and started in {:.1}s; mTLS both ways between {web_pod} and client",
        up.as_secs_f64()
    ));
    Ok(())
}

#[tokio::test]
async fn a_hand_written_pod_naming_the_signer_is_denied_with_a_warning_and_gets_nothing()
-> Result<()> {
    let client = splice_e2e::client().await?;
    real_node(&client).await?;
    let (_setup, _ns, _name) = start("identity-deny").await?;
    // A namespace no policy selects, and a pod that writes the projection itself.
    let rogue = TestNamespace::create("e2e-rogue", &[]).await?;
    let mut spec = pod_spec("default");
    spec["containers"][0]["volumeMounts"] = json!([{"name": "id", "mountPath": MOUNT}]);
    spec["volumes"] = json!([{"name": "id", "projected": {"sources": [{"podCertificate": {
        "signerName": SIGNER, "keyType": "ECDSAP256", "credentialBundlePath": "credentialbundle.pem",
    }}]}}]);
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "rogue"}, "spec": spec}))?;
    rogue
        .api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await?;
    let requests: Api<PodCertificateRequest> = rogue.api();
    wait_until(
        Duration::from_secs(90),
        "the rogue pod's request denied",
        || async {
            let list = requests.list(&ListParams::default()).await?.items;
            Ok(list.iter().any(|r| {
                r.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c.type_ == "Denied" && c.status == "True" && c.reason == "NotSelected"
                        })
                    })
            }))
        },
    )
    .await?;
    ensure!(
        issued(&rogue.name).await?.is_empty(),
        "the rogue pod got a certificate"
    );
    let events: Api<Event> = rogue.api();
    wait_until(
        Duration::from_secs(30),
        "a Warning on the rogue pod",
        || async {
            let list = events.list(&ListParams::default()).await?.items;
            Ok(list.iter().any(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("rogue")
                    && e.note.as_deref().is_some_and(|n| n.contains("denied"))
            }))
        },
    )
    .await?;
    let phase = rogue
        .api::<Pod>()
        .get("rogue")
        .await?
        .status
        .and_then(|s| s.phase)
        .unwrap_or_default();
    ensure!(phase != "Running", "the rogue pod runs without its volume");
    report("a pod naming the signer from an unselected namespace: Denied NotSelected, a Warning, no certificate".into());
    Ok(())
}

/// mTLS requests in both directions between `(from, url, peer)` pairs, from a thread of their
/// own until `stop`: (requests that succeeded, what each failure said).
fn traffic(
    ns: String,
    pairs: Vec<(String, String, String)>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(usize, Vec<String>)> {
    std::thread::spawn(move || {
        let (mut ok, mut failed) = (0, Vec::new());
        while !stop.load(Ordering::Relaxed) {
            for (from, url, peer) in &pairs {
                match fetch(&ns, from, url, peer) {
                    Ok(out) if out.contains("fetch ok") => ok += 1,
                    Ok(out) => failed.push(format!("{from} -> {url}: {out}")),
                    Err(e) => failed.push(format!("{from} -> {url}: {e:#}")),
                }
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        (ok, failed)
    })
}

/// The pod's newest issued chain.
async fn newest_chain(ns: &str, pod: &str) -> Result<String> {
    issued(ns)
        .await?
        .get(pod)
        .and_then(|c| c.last().cloned())
        .with_context(|| format!("a chain for {pod}"))
}

#[tokio::test]
async fn a_ca_rotation_under_live_mtls_breaks_no_request_and_new_certificates_come_from_the_new_ca()
-> Result<()> {
    let client = splice_e2e::client().await?;
    real_node(&client).await?;
    let (setup, ns, name) = start("identity-rotate").await?;
    // The earliest refresh the API server allows: 10 minutes after notBefore, which the signer
    // backdates 4 minutes, so about 6 minutes from now.
    let policies: Api<splice_crds::InjectionPolicy> = Api::all(client.clone());
    policies
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "splice.dev/identity-refresh-after-seconds": "1"}}})),
        )
        .await?;
    for (pod, sa) in [("server", "web"), ("client", "client")] {
        let p: Pod =
            serde_json::from_value(json!({"metadata": {"name": pod}, "spec": pod_spec(sa)}))?;
        ns.api::<Pod>().create(&PostParams::default(), &p).await?;
    }
    wait_until(Duration::from_secs(180), "both pods started", || async {
        Ok(started(&ns).await?.len() == 2)
    })
    .await?;
    let ips = started(&ns).await?;
    let ip = |pod: &str| ips.get(pod).cloned().with_context(|| format!("{pod}'s IP"));
    let url = format!("https://{}:{PORT}/whoami", ip("server")?);
    let (web, client_id) = (spiffe(&ns.name, "web"), spiffe(&ns.name, "client"));
    let first_serial = leaf_of(&newest_chain(&ns.name, "server").await?)?.0;
    let out = fetch(&ns.name, "client", &url, &web)?;
    ensure!(out.contains("fetch ok"), "{out}");
    let old_roots = roots_of(&client, &setup.splice_ns.name).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let live = traffic(
        ns.name.clone(),
        vec![
            ("client".into(), url.clone(), web.clone()),
            (
                "server".into(),
                format!("https://{}:{PORT}/whoami", ip("client")?),
                client_id.clone(),
            ),
        ],
        Arc::clone(&stop),
    );
    let asked = Instant::now();
    let rotate = std::process::Command::new(splice_bin()?)
        .args(["rotate", "--namespace", &setup.splice_ns.name])
        .env("KUBECONFIG", splice_e2e::kubeconfig_path())
        .output()?;
    ensure!(rotate.status.success(), "splice rotate: {rotate:?}");
    wait_until(
        Duration::from_secs(60),
        "the new CA's root in the instance's bundle",
        || async { Ok(ders(&roots_of(&client, &setup.splice_ns.name).await?)?.len() >= 2) },
    )
    .await?;
    let published = asked.elapsed();

    // Past Splice's trust propagation (2 minutes by default) a new pod's certificate chains to
    // the new root, which the kubelet has projected into the live pods by then.
    tokio::time::sleep(Duration::from_secs(150)).await;
    let p: Pod =
        serde_json::from_value(json!({"metadata": {"name": "late"}, "spec": pod_spec("client")}))?;
    ns.api::<Pod>().create(&PostParams::default(), &p).await?;
    wait_until(Duration::from_secs(180), "the late pod started", || async {
        Ok(started(&ns).await?.contains_key("late"))
    })
    .await?;
    let late = newest_chain(&ns.name, "late").await?;
    ensure!(
        !chains_to(&late, &old_roots)?,
        "the late pod's certificate still chains to the old CA"
    );
    let late_ip = started(&ns)
        .await?
        .get("late")
        .cloned()
        .context("late IP")?;
    for (from, to, peer) in [
        ("late", url.clone(), web.clone()),
        (
            "server",
            format!("https://{late_ip}:{PORT}/whoami"),
            client_id.clone(),
        ),
    ] {
        let out = fetch(&ns.name, from, &to, &peer)?;
        ensure!(out.contains("fetch ok"), "{from} -> {to}: {out}");
    }

    wait_until(
        Duration::from_secs(600),
        "a second certificate for the server pod",
        || async {
            Ok(issued(&ns.name)
                .await?
                .get("server")
                .is_some_and(|c| c.len() >= 2))
        },
    )
    .await?;
    let refreshed = newest_chain(&ns.name, "server").await?;
    let new_serial = leaf_of(&refreshed)?.0;
    ensure!(new_serial != first_serial, "the refresh kept the serial");
    ensure!(
        !chains_to(&refreshed, &old_roots)?
            && chains_to(&refreshed, &roots_of(&client, &setup.splice_ns.name).await?)?,
        "the refreshed certificate does not chain to the new CA only"
    );
    // The kubelet writes the new bundle; the server reads it at the next handshake.
    let want = hex(&new_serial);
    wait_until(
        Duration::from_secs(120),
        "the server presents the new certificate",
        || async {
            let out = fetch(&ns.name, "client", &url, &web)?;
            let served = out
                .split_whitespace()
                .find_map(|w| w.strip_prefix("leaf_serial="))
                .map(hex);
            Ok(out.contains("fetch ok") && served.as_deref() == Some(want.as_str()))
        },
    )
    .await?;
    stop.store(true, Ordering::Relaxed);
    let (ok, failed) = live
        .join()
        .map_err(|_| anyhow::anyhow!("the traffic thread panicked"))?;
    ensure!(
        failed.is_empty(),
        "{} of {} mTLS requests failed during the rotation, first: {}",
        failed.len(),
        ok + failed.len(),
        failed[0]
    );
    ensure!(ok > 100, "only {ok} mTLS requests were made");
    report(format!(
        "CA rotation under live mTLS: {ok} requests, 0 failed; new root published {:.0}s after \
         `splice rotate`; a pod started 150s later chains to the new CA and talks both ways with \
         the old-CA pods; the early refresh came {:.0}s after the rotation, under the new CA, \
         served at the next handshake",
        published.as_secs_f64(),
        asked.elapsed().as_secs_f64()
    ));
    drop(setup);
    Ok(())
}
