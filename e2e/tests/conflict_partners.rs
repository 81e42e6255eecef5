//! A spec change re-reconciles only the changed policy and its conflict partners (before and
//! after the change), not every policy. These tests prove the partners are still reached: a
//! conflict appears and clears on both policies when only one of them changes, and clears on the
//! survivor when the other is deleted.

#[path = "../src/operator.rs"]
mod operator;

use std::time::Duration;

use anyhow::Result;
use kube::Client;
use kube::api::{Api, DeleteParams};
use operator::*;
use serde_json::{Value, json};
use splice_crds::InjectionPolicy;
use splice_e2e::{TestNamespace, unique_suffix, wait_until};

fn sidecar(instance: &str, container: &str, image: &str) -> Value {
    json!({
        "namespaceSelector": {"matchLabels": {instance: "on"}},
        "template": {"containers": [{"name": container, "image": image}]}
    })
}

/// Waits until `policy`'s Conflicted condition has `status` (and, when True, names `other`).
async fn wait_conflicted(client: &Client, policy: &str, other: &str, status: &str) -> Result<()> {
    let api: Api<InjectionPolicy> = Api::all(client.clone());
    wait_until(
        Duration::from_secs(30),
        &format!("{policy} to have Conflicted={status} (about {other})"),
        || {
            let api = api.clone();
            async move {
                let p = api.get(policy).await?;
                Ok(condition(&p, "Conflicted").is_some_and(|c| {
                    c.status == status && (status != "True" || c.message.contains(other))
                }))
            }
        },
    )
    .await
}

#[tokio::test]
async fn a_conflict_follows_one_sided_changes_and_a_deletion_on_both_policies() -> Result<()> {
    let client = splice_e2e::client().await?;
    install_crd(&client).await?;
    let instance = format!("partners-{}", unique_suffix());
    let splice_ns = TestNamespace::create("e2e-splice", &[]).await?;
    let _cleanup = PolicyCleanup {
        instance: instance.clone(),
    };
    let _splice = Splice::start(SpliceOptions::new(&splice_ns.name, &instance)).await?;
    let a = format!("{instance}-a");
    let b = format!("{instance}-b");
    // A bystander with items of its own: present throughout, so the partners are found among
    // more than the two policies involved.
    let c = format!("{instance}-c");
    apply_policy(
        &client,
        &instance,
        &c,
        sidecar(&instance, "logger", "registry.invalid/logger:1"),
    )
    .await?;
    apply_policy(
        &client,
        &instance,
        &a,
        sidecar(&instance, "proxy", "registry.invalid/proxy:1"),
    )
    .await?;
    apply_policy(
        &client,
        &instance,
        &b,
        sidecar(&instance, "proxy", "registry.invalid/proxy:2"),
    )
    .await?;
    wait_conflicted(&client, &a, &b, "True").await?;
    wait_conflicted(&client, &b, &a, "True").await?;

    // Only b changes (it renames its container): a, which did not change, must clear too.
    apply_policy(
        &client,
        &instance,
        &b,
        sidecar(&instance, "proxy-b", "registry.invalid/proxy:2"),
    )
    .await?;
    wait_conflicted(&client, &b, &a, "False").await?;
    wait_conflicted(&client, &a, &b, "False").await?;

    // Only b changes back: a, unchanged, must show the conflict again.
    apply_policy(
        &client,
        &instance,
        &b,
        sidecar(&instance, "proxy", "registry.invalid/proxy:3"),
    )
    .await?;
    wait_conflicted(&client, &a, &b, "True").await?;
    wait_conflicted(&client, &b, &a, "True").await?;

    // b is deleted: a clears.
    let api: Api<InjectionPolicy> = Api::all(client.clone());
    api.delete(&b, &DeleteParams::default()).await?;
    wait_conflicted(&client, &a, &b, "False").await?;

    // The bystander never conflicted with either.
    let bystander = api.get(&c).await?;
    assert_eq!(
        condition(&bystander, "Conflicted").map(|c| c.status.as_str()),
        Some("False")
    );
    Ok(())
}
