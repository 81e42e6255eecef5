//! The ValidatingWebhookConfiguration through which the API server asks Splice to judge every
//! InjectionPolicy CREATE and UPDATE (`POST /validate`, dry runs included) with the compiler that
//! serves it. Pure render and comparison first; then the small writer the leader runs.
//!
//! `failurePolicy: Ignore`: an outage of Splice never blocks applying or deleting a policy (the
//! reconcile refuses what does not compile anyway). One configuration per Splice instance, named
//! after its namespace, whose objectSelector is the instance's `--policy-selector`, so instances
//! sharing a cluster never judge each other's policies. Owned by the InjectionPolicy CRD, so it
//! is garbage-collected with it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::leader::Leadership;
use crate::metrics::Metrics;
use futures::StreamExt;
use k8s_openapi::Resource as _;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use splice_crds::{MANAGED_BY_LABEL, MANAGER};
use splice_server::server::VALIDATE_PATH;
use tokio::sync::watch;

use super::apply::{Removal, apply_if_changed, remove_if_ours};
use super::render::ClientTarget;

/// The CRD that owns the configuration.
pub const CRD_NAME: &str = "injectionpolicies.splice.dev";
/// The webhook's name, which kubectl prints with a refusal (`admission webhook "…" denied`).
pub const VALIDATING_WEBHOOK_NAME: &str = "validate.splice.dev";
/// How long the API server waits for a verdict; under `Ignore`, a slow Splice only costs this.
const TIMEOUT_SECONDS: i32 = 5;
/// How often the configuration is compared again when nothing signalled a change.
const RESYNC: Duration = Duration::from_secs(300);
/// Wait after a failed pass before the next.
const RETRY: Duration = Duration::from_secs(5);

/// `splice_reconcile_total{result}` of a failed write of the validating configuration.
pub const ERROR_LABEL: &str = "validating_configuration_error";

/// Name of the configuration of the Splice instance in `splice_namespace`.
pub fn validating_configuration_name(splice_namespace: &str) -> String {
    format!("splice-validate-{splice_namespace}")
}

/// What decides the configuration.
#[derive(Clone, Copy, Debug)]
pub struct ValidatingContext<'a> {
    pub target: &'a ClientTarget,
    pub splice_namespace: &'a str,
    /// The same CA bundle the mutating configurations carry (so a rotation covers it).
    pub ca_bundle: &'a [u8],
    /// The instance's `--policy-selector`, parsed.
    pub policy_selector: Option<&'a LabelSelector>,
    /// The CRD's uid, when it could be read.
    pub crd_uid: Option<&'a str>,
}

/// The desired configuration.
pub fn render_validating(cx: &ValidatingContext<'_>) -> ValidatingWebhookConfiguration {
    let owner = cx.crd_uid.map(|uid| OwnerReference {
        api_version: CustomResourceDefinition::API_VERSION.to_owned(),
        kind: CustomResourceDefinition::KIND.to_owned(),
        name: CRD_NAME.to_owned(),
        uid: uid.to_owned(),
        // Blocking the CRD's deletion would need update on its finalizers; nothing is gained.
        controller: None,
        block_owner_deletion: None,
    });
    let webhook = ValidatingWebhook {
        name: VALIDATING_WEBHOOK_NAME.to_owned(),
        admission_review_versions: vec!["v1".to_owned()],
        client_config: cx.target.client_config_at(VALIDATE_PATH, cx.ca_bundle),
        failure_policy: Some("Ignore".to_owned()),
        match_policy: Some("Equivalent".to_owned()),
        object_selector: cx.policy_selector.cloned(),
        rules: Some(vec![RuleWithOperations {
            api_groups: Some(vec!["splice.dev".to_owned()]),
            api_versions: Some(vec!["v1alpha1".to_owned()]),
            operations: Some(vec!["CREATE".to_owned(), "UPDATE".to_owned()]),
            resources: Some(vec!["injectionpolicies".to_owned()]),
            scope: Some("Cluster".to_owned()),
        }]),
        side_effects: "None".to_owned(),
        timeout_seconds: Some(TIMEOUT_SECONDS),
        namespace_selector: None,
        match_conditions: None,
    };
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(validating_configuration_name(cx.splice_namespace)),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_owned(),
                MANAGER.to_owned(),
            )])),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![webhook]),
    }
}

/// Parses a label selector in kubectl's syntax (`a=b,c!=d,e,!f,g in (h,i),j notin (k)`), as
/// `--policy-selector` takes it, into the structured form a webhook's objectSelector needs.
pub fn parse_label_selector(text: &str) -> Result<LabelSelector, String> {
    let mut labels = BTreeMap::new();
    let mut expressions = Vec::new();
    for term in split_terms(text)? {
        let term = term.trim();
        if term.is_empty() {
            return Err(format!("{text:?}: an empty requirement"));
        }
        let requirement = |key: &str, operator: &str, values: Option<Vec<String>>| {
            let key = key.trim();
            if key.is_empty() || key.contains(char::is_whitespace) {
                return Err(format!("{text:?}: invalid key {key:?}"));
            }
            Ok(LabelSelectorRequirement {
                key: key.to_owned(),
                operator: operator.to_owned(),
                values,
            })
        };
        let set = |rest: &str| -> Result<Vec<String>, String> {
            let inner = rest
                .trim()
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| format!("{text:?}: expected (values) in {term:?}"))?;
            Ok(inner.split(',').map(|v| v.trim().to_owned()).collect())
        };
        if let Some(key) = term.strip_prefix('!') {
            expressions.push(requirement(key, "DoesNotExist", None)?);
        } else if let Some((key, value)) = term.split_once("!=") {
            expressions.push(requirement(
                key,
                "NotIn",
                Some(vec![value.trim().to_owned()]),
            )?);
        } else if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
            let key = requirement(key, "In", None)?.key;
            labels.insert(key, value.trim().to_owned());
        } else if let Some((key, rest)) = term.split_once(" notin ") {
            expressions.push(requirement(key, "NotIn", Some(set(rest)?))?);
        } else if let Some((key, rest)) = term.split_once(" in ") {
            expressions.push(requirement(key, "In", Some(set(rest)?))?);
        } else {
            expressions.push(requirement(term, "Exists", None)?);
        }
    }
    Ok(LabelSelector {
        match_labels: (!labels.is_empty()).then_some(labels),
        match_expressions: (!expressions.is_empty()).then_some(expressions),
    })
}

/// Splits on commas outside parentheses.
fn split_terms(text: &str) -> Result<Vec<&str>, String> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("{text:?}: unbalanced ')'"))?
            }
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("{text:?}: unbalanced '('"));
    }
    terms.push(&text[start..]);
    Ok(terms)
}

/// What the writer is configured with.
#[derive(Clone, Debug)]
pub struct Writer {
    pub target: ClientTarget,
    pub splice_namespace: String,
    pub policy_selector: Option<String>,
    /// False: the configuration is removed (if it is Splice's) and kept absent.
    pub enabled: bool,
}

/// Keeps the configuration written while this replica leads (the task is dropped when it stops
/// leading): on every CA bundle change, on any change to the configuration (drift is repaired),
/// and every [`RESYNC`]. Writes by server-side apply, and only when the observed configuration
/// does not already say everything the desired one says.
pub async fn maintain(
    client: Client,
    writer: Writer,
    mut ca_bundle: watch::Receiver<Option<Arc<String>>>,
    leading: Leadership,
    metrics: Arc<Metrics>,
) {
    let selector = match writer.policy_selector.as_deref().map(parse_label_selector) {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => {
            // Without the selector the configuration would judge other instances' policies.
            tracing::error!(error = %e, "--policy-selector cannot become an objectSelector; not writing the validating webhook configuration");
            return;
        }
    };
    let name = validating_configuration_name(&writer.splice_namespace);
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let mut changes = std::pin::pin!(
        watcher(
            api.clone(),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
        )
        .default_backoff()
    );
    loop {
        let bundle = ca_bundle.borrow_and_update().clone();
        let wait = match bundle {
            _ if !writer.enabled => match ensure_absent(&api, &name, &leading).await {
                Ok(()) => RESYNC,
                Err(e) => {
                    tracing::warn!(configuration = %name, error = %e, "could not remove the validating webhook configuration; retrying");
                    RETRY
                }
            },
            None => RESYNC,
            Some(bundle) => {
                let started = std::time::Instant::now();
                match ensure(&api, &crds, &writer, selector.as_ref(), &bundle, &leading).await {
                    Ok(()) => RESYNC,
                    Err(e) => {
                        // Counted where failed policy reconciles are, so the same alert sees it.
                        metrics.observe_reconcile(ERROR_LABEL, started.elapsed());
                        tracing::warn!(configuration = %name, error = %e, "could not write the validating webhook configuration; retrying");
                        RETRY
                    }
                }
            }
        };
        tokio::select! {
            changed = ca_bundle.changed() => if changed.is_err() { return },
            event = changes.next() => if event.is_none() { return },
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Deletes the configuration when it exists and is Splice's (labelled managed by Splice).
async fn ensure_absent(
    api: &Api<ValidatingWebhookConfiguration>,
    name: &str,
    leading: &Leadership,
) -> Result<(), kube::Error> {
    let removal = remove_if_ours(api, leading, None, name)
        .await
        .map_err(|f| f.source)?;
    if removal == Removal::Removed {
        tracing::info!(configuration = %name, "removed the validating webhook configuration (--validating-webhook=false)");
    }
    Ok(())
}

async fn ensure(
    api: &Api<ValidatingWebhookConfiguration>,
    crds: &Api<CustomResourceDefinition>,
    writer: &Writer,
    selector: Option<&LabelSelector>,
    ca_bundle: &str,
    leading: &Leadership,
) -> Result<(), kube::Error> {
    // Without the CRD's uid the configuration is written unowned (and owned on a later pass):
    // judging policies matters more than its garbage collection.
    let crd_uid = match crds.get_metadata_opt(CRD_NAME).await {
        Ok(crd) => crd.and_then(|c| c.metadata.uid),
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the InjectionPolicy CRD to own the validating webhook configuration");
            None
        }
    };
    let desired = render_validating(&ValidatingContext {
        target: &writer.target,
        splice_namespace: &writer.splice_namespace,
        ca_bundle: ca_bundle.as_bytes(),
        policy_selector: selector,
        crd_uid: crd_uid.as_deref(),
    });
    // Not leading: the next leader writes it.
    apply_if_changed(api, leading, &desired)
        .await
        .map_err(|f| f.source)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use crate::policy::render::is_up_to_date;

    fn url() -> ClientTarget {
        ClientTarget::from_url("https://127.0.0.1:8443").unwrap()
    }

    #[test]
    fn one_ignore_webhook_judges_policy_creates_and_updates_at_the_validate_path() {
        let selector = parse_label_selector("e2e.splice.dev/instance=a").unwrap();
        let c = render_validating(&ValidatingContext {
            target: &url(),
            splice_namespace: "splice-a",
            ca_bundle: b"CA PEM",
            policy_selector: Some(&selector),
            crd_uid: Some("crd-uid"),
        });
        assert_eq!(c.metadata.name.as_deref(), Some("splice-validate-splice-a"));
        assert_eq!(
            c.metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
            MANAGER
        );
        let owner = &c.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("CustomResourceDefinition", CRD_NAME, "crd-uid")
        );
        let hooks = c.webhooks.as_ref().unwrap();
        assert_eq!(hooks.len(), 1);
        let w = &hooks[0];
        assert_eq!(w.failure_policy.as_deref(), Some("Ignore"));
        assert_eq!(w.side_effects, "None");
        assert_eq!(w.admission_review_versions, vec!["v1"]);
        assert_eq!(
            w.client_config.url.as_deref(),
            Some("https://127.0.0.1:8443/validate")
        );
        assert_eq!(w.client_config.ca_bundle.as_ref().unwrap().0, b"CA PEM");
        let rule = &w.rules.as_ref().unwrap()[0];
        assert_eq!(
            rule.operations.as_deref(),
            Some(&["CREATE".to_owned(), "UPDATE".to_owned()][..])
        );
        assert_eq!(
            (
                rule.api_groups.as_deref(),
                rule.resources.as_deref(),
                rule.api_versions.as_deref()
            ),
            (
                Some(&["splice.dev".to_owned()][..]),
                Some(&["injectionpolicies".to_owned()][..]),
                Some(&["v1alpha1".to_owned()][..])
            )
        );
        assert_eq!(
            w.object_selector.as_ref().unwrap().match_labels,
            Some(BTreeMap::from([(
                "e2e.splice.dev/instance".to_owned(),
                "a".to_owned()
            )]))
        );
    }

    #[test]
    fn without_a_selector_or_crd_uid_every_policy_is_judged_and_nothing_owns_it() {
        let target = ClientTarget::Service {
            namespace: "splice-system".into(),
            name: "splice".into(),
            port: 443,
        };
        let c = render_validating(&ValidatingContext {
            target: &target,
            splice_namespace: "splice-system",
            ca_bundle: b"",
            policy_selector: None,
            crd_uid: None,
        });
        let w = &c.webhooks.as_ref().unwrap()[0];
        assert!(w.object_selector.is_none());
        assert!(c.metadata.owner_references.is_none());
        let svc = w.client_config.service.as_ref().unwrap();
        assert_eq!(svc.path.as_deref(), Some(VALIDATE_PATH));
    }

    #[test]
    fn a_new_ca_bundle_or_an_edited_failure_policy_is_drift_and_foreign_labels_are_not() {
        let cx = ValidatingContext {
            target: &url(),
            splice_namespace: "s",
            ca_bundle: b"A",
            policy_selector: None,
            crd_uid: None,
        };
        let desired = render_validating(&cx);
        let mut observed = desired.clone();
        observed
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "x".into());
        assert!(is_up_to_date(&desired, &observed));
        let rotated = render_validating(&ValidatingContext {
            ca_bundle: b"A+B",
            ..cx
        });
        assert!(!is_up_to_date(&rotated, &observed));
        observed.webhooks.as_mut().unwrap()[0].failure_policy = Some("Fail".into());
        assert!(!is_up_to_date(&desired, &observed));
    }

    #[test]
    fn label_selectors_parse_in_kubectls_syntax() {
        let s = parse_label_selector("a=b, c==d,e!=f,g,!h,i in (j, k),l notin (m)").unwrap();
        assert_eq!(
            s.match_labels,
            Some(BTreeMap::from([
                ("a".to_owned(), "b".to_owned()),
                ("c".to_owned(), "d".to_owned())
            ]))
        );
        let exprs: Vec<(String, String, Option<Vec<String>>)> = s
            .match_expressions
            .unwrap()
            .into_iter()
            .map(|r| (r.key, r.operator, r.values))
            .collect();
        let v = |x: &[&str]| Some(x.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(
            exprs,
            vec![
                ("e".into(), "NotIn".into(), v(&["f"])),
                ("g".into(), "Exists".into(), None),
                ("h".into(), "DoesNotExist".into(), None),
                ("i".into(), "In".into(), v(&["j", "k"])),
                ("l".into(), "NotIn".into(), v(&["m"])),
            ]
        );
        for bad in ["a=b,", "x in (a", "x in a", "a b=c"] {
            assert!(parse_label_selector(bad).is_err(), "{bad}");
        }
    }
}
