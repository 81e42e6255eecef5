//! The policy fixture table (`crds/tests/fixtures/policies/`) through the real API server with
//! the generated CRD applied, beside the offline validator (`splice_crds::validate_policy`, which
//! `splice inject` and `simulate` run): each fixture is a server-side dry-run create with strict
//! field validation (as `kubectl apply` does), and both must accept and refuse the same ones,
//! naming the same field. No Splice runs here: only the CRD's schema and CEL rules decide.

#[path = "../src/operator.rs"]
mod operator;

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail, ensure};
use kube::Client;
use operator::install_crd;
use serde_json::Value;
use splice_crds::validate_policy;
use splice_e2e::repo_root;

/// The API server's answer to a dry-run create of `object`: `Err` with its message if refused.
async fn dry_run_create(client: &Client, object: &Value) -> Result<Result<(), String>> {
    let request = http::Request::post(
        "/apis/splice.dev/v1alpha1/injectionpolicies?dryRun=All&fieldValidation=Strict",
    )
    .header(http::header::CONTENT_TYPE, "application/json")
    .body(serde_json::to_vec(object)?)?;
    match client.request::<Value>(request).await {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(status)) => Ok(Err(status.message)),
        Err(other) => Err(other).context("the dry-run create did not get an answer"),
    }
}

#[tokio::test]
async fn the_api_server_and_the_offline_validator_accept_and_refuse_the_same_policies() -> Result<()>
{
    let client = splice_e2e::client().await?;
    install_crd(&client).await?;

    let dir = repo_root().join("crds/tests/fixtures/policies");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    paths.sort();
    ensure!(paths.len() >= 10, "too few fixtures in {}", dir.display());

    let mut disagreements = Vec::new();
    for path in &paths {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        let text = std::fs::read_to_string(path)?;
        let object: Value = serde_yaml::from_str(&text).with_context(|| name.to_owned())?;
        let field = text.lines().find_map(|l| l.strip_prefix("# field: "));

        let offline = validate_policy(&object);
        let server = dry_run_create(&client, &object).await?;
        let agree = match (&server, field) {
            (Ok(()), None) => offline.is_empty(),
            (Err(message), Some(field)) => {
                message.contains(field) && offline.iter().any(|v| v.field == field)
            }
            _ => false,
        };
        if !agree {
            disagreements.push(format!(
                "{name}: expected {}; API server: {server:?}; offline: {offline:?}",
                field.map_or("acceptance".to_owned(), |f| format!("a refusal at {f}"))
            ));
        }
    }
    if !disagreements.is_empty() {
        bail!("{}", disagreements.join("\n"));
    }
    Ok(())
}
