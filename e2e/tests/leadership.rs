//! A leader that loses its Lease while alive stops writing: two `splice run` replicas under their
//! own client identities, the leader frozen (SIGSTOP) past its lease duration until the other
//! takes over, then resumed (SIGCONT) while the new leader rotates the CA and reconciles a policy
//! change. What the first replica wrote is read from the API server's audit log, not from
//! Splice's own logs or metrics: `e2e/run-e2e.sh` starts the control plane with
//! `e2e/audit-policy.yaml`, which records every write to what Splice's leader owns.

#[path = "../src/operator.rs"]
mod operator;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use operator::*;
use serde_json::{Value, json};
use splice_e2e::{TestNamespace, audit_events, audit_log, unique_suffix, wait_until};

/// (duration, renew deadline, retry period) in seconds: short, so the test is.
const LEASE: (u64, u64, u64) = (6, 4, 1);

/// One write as the API server recorded it.
#[derive(Debug)]
struct Write {
    user: String,
    verb: String,
    resource: String,
    namespace: String,
    name: String,
    code: i64,
    at: Timestamp,
}

impl Write {
    fn of(event: &Value) -> Option<Write> {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let object = &event["objectRef"];
        let resource = match object["subresource"].as_str() {
            Some(sub) => format!("{}/{sub}", text(&object["resource"])),
            None => text(&object["resource"]),
        };
        // Each replica acts as its own impersonated user; the admin's own requests have none.
        let user = match event["impersonatedUser"]["username"].as_str() {
            Some(u) => u.to_owned(),
            None => text(&event["user"]["username"]),
        };
        Some(Write {
            user,
            verb: text(&event["verb"]),
            resource,
            namespace: text(&object["namespace"]),
            name: text(&object["name"]),
            code: event["responseStatus"]["code"].as_i64().unwrap_or_default(),
            at: event["requestReceivedTimestamp"].as_str()?.parse().ok()?,
        })
    }

    /// Whether only the leader may make this write: the CA and serving Secrets, webhook
    /// configurations, in-tree objects, policy statuses, the leader Lease (not a replica's own
    /// report Lease, which every replica renews).
    fn is_leaders(&self, splice_ns: &str) -> bool {
        let write = matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        );
        write
            && match self.resource.as_str() {
                "secrets" => self.namespace == splice_ns,
                "leases" => self.namespace == splice_ns && self.name == "splice-leader",
                "mutatingwebhookconfigurations"
                | "validatingwebhookconfigurations"
                | "mutatingadmissionpolicies"
                | "mutatingadmissionpolicybindings"
                | "injectionpolicies"
                | "injectionpolicies/status" => true,
                _ => false,
            }
    }
}

fn writes(log: &Path) -> Result<Vec<Write>> {
    Ok(audit_events(log)?.iter().filter_map(Write::of).collect())
}

/// A kubeconfig acting as `user` (with the admin's rights), so the audit log names the replica.
fn kubeconfig_as(user: &str, path: &PathBuf) -> Result<()> {
    let mut config = admin_kubeconfig()?;
    config["users"][0]["user"]["as"] = json!(user);
    config["users"][0]["user"]["as-groups"] = json!(["system:masters", "system:authenticated"]);
    std::fs::write(path, serde_json::to_vec_pretty(&config)?)?;
    Ok(())
}

async fn holder(leases: &Api<Lease>) -> Result<Option<String>> {
    lease_holder(leases).await
}

#[tokio::test]
async fn a_leader_frozen_past_its_lease_writes_nothing_it_owned_once_resumed() -> Result<()> {
    let log = audit_log()?;
    let client = splice_e2e::client().await?;
    install_crd(&client).await?;
    let instance = format!("term-{}", unique_suffix());
    let splice_ns = TestNamespace::create("e2e-splice", &[]).await?;
    let _cleanup = PolicyCleanup {
        instance: instance.clone(),
    };
    let logs = splice_e2e::repo_root().join("target/e2e-logs");
    std::fs::create_dir_all(&logs)?;
    let replica = |who: &str| -> Result<(SpliceOptions, String)> {
        let user = format!("e2e-{instance}-{who}");
        let kubeconfig = logs.join(format!("{user}.kubeconfig"));
        kubeconfig_as(&user, &kubeconfig)?;
        let mut o = SpliceOptions::new(&splice_ns.name, &instance);
        o.identity = Some(format!("{instance}-{who}"));
        o.lease = Some(LEASE);
        o.log_name = format!("splice-{instance}-{who}");
        o.kubeconfig = Some(kubeconfig);
        Ok((o, user))
    };
    let (first_options, first_user) = replica("first")?;
    let (second_options, second_user) = replica("second")?;
    let first_id = first_options.identity.clone().unwrap_or_default();
    let second_id = second_options.identity.clone().unwrap_or_default();

    let first = Splice::start(first_options).await?;
    let leases = splice_ns.api::<Lease>();
    wait_until(Duration::from_secs(20), "the first replica to lead", || {
        let (leases, id) = (leases.clone(), first_id.clone());
        async move { Ok(holder(&leases).await? == Some(id)) }
    })
    .await?;
    // Something of each kind for the leader to keep: a webhook policy and an in-tree one.
    let webhook = format!("{instance}-webhook");
    let in_tree = format!("{instance}-intree");
    apply_policy(
        &client,
        &instance,
        &webhook,
        sidecar_spec(&instance, "proxy", "registry.invalid/proxy:1"),
    )
    .await?;
    let mut spec = sidecar_spec(&instance, "agent", "registry.invalid/agent:1");
    spec["mode"] = json!("InTree");
    apply_policy(&client, &instance, &in_tree, spec).await?;
    for name in [&webhook, &in_tree] {
        wait_policy(&client, name, "True", Duration::from_secs(30)).await?;
    }
    let second = Splice::start(second_options).await?;

    signal(&first, "STOP")?;
    wait_until(
        Duration::from_secs(LEASE.0 + 4 * LEASE.2 + 10),
        "the second replica to take over from the frozen one",
        || {
            let (leases, id) = (leases.clone(), second_id.clone());
            async move { Ok(holder(&leases).await? == Some(id)) }
        },
    )
    .await?;
    // Work for whoever believes it leads once the first wakes: a CA rotation and a new spec.
    let secrets: Api<Secret> = splice_ns.api();
    secrets
        .patch(
            "splice-ca",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"splice.dev/rotate": "leadership-e2e"}}}),
            ),
        )
        .await?;
    signal(&first, "CONT")?;
    apply_policy(
        &client,
        &instance,
        &webhook,
        sidecar_spec(&instance, "proxy", "registry.invalid/proxy:2"),
    )
    .await?;
    wait_until(
        Duration::from_secs(30),
        "the new leader to begin the rotation",
        || {
            let secrets = secrets.clone();
            async move {
                let ca = secrets.get("splice-ca").await?;
                Ok(ca
                    .metadata
                    .annotations
                    .unwrap_or_default()
                    .get("splice.dev/ca-rotation-phase")
                    .is_some_and(|p| p != "Stable"))
            }
        },
    )
    .await?;
    // Room for a resumed replica whose loops outlived its term to act on both.
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        holder(&leases).await?,
        Some(second_id.clone()),
        "the second replica led throughout"
    );
    drop(second);
    drop(first);

    let all = writes(&log)?;
    fn by<'a>(all: &'a [Write], user: &'a str) -> impl Iterator<Item = &'a Write> {
        all.iter().filter(move |w| w.user == user)
    }
    // The second replica's term begins at its first successful write of the leader Lease.
    let taken_over = by(&all, &second_user)
        .filter(|w| w.resource == "leases" && w.name == "splice-leader" && w.code < 300)
        .map(|w| w.at)
        .min()
        .context("the audit log shows no Lease write by the second replica")?;
    assert!(
        by(&all, &first_user).any(|w| w.is_leaders(&splice_ns.name) && w.at < taken_over),
        "the audit log shows the first replica's writes while it led (else it cannot tell them)"
    );
    assert!(
        by(&all, &second_user).any(|w| w.resource == "secrets" && w.name == "splice-ca"),
        "the second replica rotated the CA"
    );
    let stale: Vec<&Write> = by(&all, &first_user)
        .filter(|w| w.is_leaders(&splice_ns.name) && w.at >= taken_over)
        .collect();
    assert!(
        stale.is_empty(),
        "the first replica wrote while the second led: {stale:#?}"
    );
    for name in [&first_user, &second_user] {
        let _ = std::fs::remove_file(logs.join(format!("{name}.kubeconfig")));
    }
    Ok(())
}
