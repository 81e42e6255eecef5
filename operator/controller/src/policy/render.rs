//! Pure: an `InjectionPolicy` becomes the MutatingWebhookConfiguration that serves it, and a check
//! of whether an observed configuration already says everything the desired one says.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
use kube::Resource;
use serde_json::Value;

use splice_crds::{
    ALWAYS_EXCLUDED_NAMESPACES, FailurePolicy, InjectionPolicy, MANAGED_BY_LABEL, MANAGER,
    NAMESPACE_NAME_LABEL, OPT_OUT_LABEL,
};
use splice_engine::entry::{Group, Member, Plan};

/// Longest policy name whose webhook name `<policy>.splice.dev` is still a valid DNS subdomain
/// (253 characters); `splice-<policy>` is shorter, so this bound covers both.
pub const MAX_POLICY_NAME_LEN: usize = 253 - ".splice.dev".len();

/// How the API server reaches the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientTarget {
    /// The in-cluster Service in front of Splice's pods.
    Service {
        namespace: String,
        name: String,
        port: i32,
    },
    /// A webhook outside the cluster: `https://host[:port][/prefix]`, without a trailing slash.
    Url { base: String, host: String },
}

impl ClientTarget {
    /// Parses `--webhook-url`. The API server only calls webhooks over HTTPS, and rejects URLs
    /// with a query, a fragment or user info, so those are refused here with the reason.
    pub fn from_url(url: &str) -> Result<Self, RenderError> {
        let invalid = |why: &str| RenderError::InvalidWebhookUrl {
            url: url.to_owned(),
            reason: why.to_owned(),
        };
        let rest = url
            .strip_prefix("https://")
            .ok_or_else(|| invalid("it must start with https://"))?;
        if rest.contains(['?', '#']) {
            return Err(invalid("it must not have a query or a fragment"));
        }
        let (authority, _path) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.contains('@') {
            return Err(invalid("it must not carry user info"));
        }
        let host = if let Some(bracketed) = authority.strip_prefix('[') {
            let (ip, after) = bracketed
                .split_once(']')
                .ok_or_else(|| invalid("unterminated IPv6 address"))?;
            if !(after.is_empty() || after.starts_with(':')) {
                return Err(invalid("unexpected text after the IPv6 address"));
            }
            ip.parse::<IpAddr>()
                .map_err(|_| invalid("invalid IPv6 address"))?;
            ip.to_owned()
        } else {
            let (host, port) = authority.split_once(':').unwrap_or((authority, ""));
            if !port.is_empty() && port.parse::<u16>().is_err() {
                return Err(invalid("the port is not a number between 0 and 65535"));
            }
            host.to_owned()
        };
        if host.is_empty() {
            return Err(invalid("it has no host"));
        }
        Ok(ClientTarget::Url {
            base: url.trim_end_matches('/').to_owned(),
            host,
        })
    }

    /// Names the serving certificate must carry for the API server to trust the webhook.
    pub fn subject_alt_names(&self) -> Vec<String> {
        match self {
            ClientTarget::Service {
                namespace, name, ..
            } => vec![
                name.clone(),
                format!("{name}.{namespace}"),
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
            ],
            ClientTarget::Url { host, .. } => vec![host.clone()],
        }
    }

    /// How the API server calls `path` on Splice's webhook server, trusting `ca_bundle`.
    pub(crate) fn client_config_at(&self, path: &str, ca_bundle: &[u8]) -> WebhookClientConfig {
        let ca_bundle = Some(ByteString(ca_bundle.to_vec()));
        match self {
            ClientTarget::Service {
                namespace,
                name,
                port,
            } => WebhookClientConfig {
                ca_bundle,
                service: Some(ServiceReference {
                    name: name.clone(),
                    namespace: namespace.clone(),
                    path: Some(path.to_owned()),
                    port: Some(*port),
                }),
                url: None,
            },
            ClientTarget::Url { base, .. } => WebhookClientConfig {
                ca_bundle,
                service: None,
                url: Some(format!("{base}{path}")),
            },
        }
    }
}

/// Why a policy cannot be rendered.
#[derive(Debug, thiserror::Error, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum RenderError {
    #[error(
        "policy name {name:?} is {len} characters long; at most {max} fit in the webhook name \
         `<policy>.splice.dev`"
    )]
    NameTooLong {
        name: String,
        len: usize,
        max: usize,
    },
    #[error("policy {0:?} has no metadata.uid yet, so it cannot own its webhook configuration")]
    MissingUid(String),
    #[error("invalid --webhook-url {url:?}: {reason}")]
    InvalidWebhookUrl { url: String, reason: String },
}

impl RenderError {
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

/// Everything besides the policy that decides its webhook configuration.
#[derive(Clone, Copy, Debug)]
pub struct RenderContext<'a> {
    pub target: &'a ClientTarget,
    /// Splice's own namespace, excluded like kube-system.
    pub splice_namespace: &'a str,
    /// PEM of every CA the API server should trust for the webhook.
    pub ca_bundle: &'a [u8],
}

/// The desired webhook configuration for `policy` alone, with the failure policy actually in
/// force.
pub fn render(
    policy: &InjectionPolicy,
    failure_policy: FailurePolicy,
    cx: &RenderContext<'_>,
) -> Result<MutatingWebhookConfiguration, RenderError> {
    let name = policy.meta().name.clone().unwrap_or_default();
    let uid = policy.meta().uid.clone().unwrap_or_default();
    let group = Plan::new(
        [Member {
            name,
            uid,
            spec: policy.spec.clone(),
            failure_policy,
            canary: None,
        }],
        cx.splice_namespace,
    );
    match group.groups() {
        [only] => render_group(only, cx),
        _ => Err(RenderError::MissingUid(String::new())),
    }
}

/// The desired webhook configuration for one entry: a policy alone, or the policies that share
/// it (all owning it, so it is garbage-collected with the last of them).
pub fn render_group(
    group: &Group,
    cx: &RenderContext<'_>,
) -> Result<MutatingWebhookConfiguration, RenderError> {
    let Some(first) = group.members.first() else {
        return Err(RenderError::MissingUid(String::new()));
    };
    let mut owners = Vec::with_capacity(group.members.len());
    for m in &group.members {
        if m.name.len() > MAX_POLICY_NAME_LEN {
            return Err(RenderError::NameTooLong {
                name: m.name.clone(),
                len: m.name.len(),
                max: MAX_POLICY_NAME_LEN,
            });
        }
        if m.uid.is_empty() {
            return Err(RenderError::MissingUid(m.name.clone()));
        }
        owners.push(OwnerReference {
            api_version: InjectionPolicy::api_version(&()).into_owned(),
            kind: InjectionPolicy::kind(&()).into_owned(),
            name: m.name.clone(),
            uid: m.uid.clone(),
            // One controller per object: a shared entry has several owners and none controls it.
            controller: Some(!group.is_shared()),
            block_owner_deletion: Some(true),
        });
    }
    // Every member has the same terms (see `groups`): the first one's are the entry's.
    let spec = &first.spec;
    let operations: Vec<String> = spec
        .operations
        .iter()
        .map(|o| o.as_str().to_owned())
        .collect();

    let webhooks = group
        .entries()
        .into_iter()
        .map(|entry| MutatingWebhook {
            name: entry.webhook,
            admission_review_versions: vec!["v1".to_owned()],
            client_config: cx.target.client_config_at(&entry.path, cx.ca_bundle),
            failure_policy: Some(first.failure_policy.as_str().to_owned()),
            match_policy: Some("Equivalent".to_owned()),
            namespace_selector: Some(namespace_selector(
                narrowed(group.namespace_selector(), entry.namespace).as_ref(),
                cx.splice_namespace,
            )),
            object_selector: Some(object_selector(
                narrowed(group.object_selector(), entry.object).as_ref(),
            )),
            reinvocation_policy: Some(spec.reinvocation_policy.as_str().to_owned()),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![String::new()]),
                api_versions: Some(vec!["v1".to_owned()]),
                operations: Some(operations.clone()),
                resources: Some(vec!["pods".to_owned()]),
                scope: Some("Namespaced".to_owned()),
            }]),
            side_effects: "None".to_owned(),
            timeout_seconds: Some(spec.timeout_seconds),
            match_conditions: None,
        })
        .collect();

    Ok(MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(group.configuration.clone()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_owned(),
                MANAGER.to_owned(),
            )])),
            owner_references: Some(owners),
            ..ObjectMeta::default()
        },
        webhooks: Some(webhooks),
    })
}

/// Namespaces that no webhook may ever select.
pub fn excluded_namespaces(splice_namespace: &str) -> Vec<String> {
    let mut names: Vec<String> = ALWAYS_EXCLUDED_NAMESPACES
        .iter()
        .map(|n| (*n).to_owned())
        .collect();
    if !names.iter().any(|n| n == splice_namespace) {
        names.push(splice_namespace.to_owned());
    }
    names
}

/// The policy's namespace selector AND "not one of the excluded namespaces". Requirements in a
/// selector are ANDed, so appending one can only narrow what the policy selects.
pub(crate) fn namespace_selector(
    policy: Option<&LabelSelector>,
    splice_namespace: &str,
) -> LabelSelector {
    with_requirement(
        policy,
        LabelSelectorRequirement {
            key: NAMESPACE_NAME_LABEL.to_owned(),
            operator: "NotIn".to_owned(),
            values: Some(excluded_namespaces(splice_namespace)),
        },
    )
}

/// `selector` with `extra` requirements ANDed (a canary split's), `None` when both are empty.
fn narrowed(
    selector: Option<&LabelSelector>,
    extra: Vec<LabelSelectorRequirement>,
) -> Option<LabelSelector> {
    if extra.is_empty() {
        return selector.cloned();
    }
    let mut s = selector.cloned().unwrap_or_default();
    s.match_expressions
        .get_or_insert_with(Vec::new)
        .extend(extra);
    Some(s)
}

/// The policy's object selector AND "not opted out".
pub(crate) fn object_selector(policy: Option<&LabelSelector>) -> LabelSelector {
    with_requirement(
        policy,
        LabelSelectorRequirement {
            key: OPT_OUT_LABEL.to_owned(),
            operator: "NotIn".to_owned(),
            values: Some(vec!["false".to_owned()]),
        },
    )
}

fn with_requirement(
    policy: Option<&LabelSelector>,
    extra: LabelSelectorRequirement,
) -> LabelSelector {
    let mut selector = policy.cloned().unwrap_or_default();
    // An empty matchLabels map and an absent one mean the same; dropping it keeps the written
    // object identical to what the API server stores, so the drift check stays exact.
    if selector
        .match_labels
        .as_ref()
        .is_some_and(BTreeMap::is_empty)
    {
        selector.match_labels = None;
    }
    selector
        .match_expressions
        .get_or_insert_with(Vec::new)
        .push(extra);
    selector
}

/// True when `observed` already says everything `desired` says, so applying `desired` would change
/// nothing. Fields the API server defaults, or other managers add (labels, annotations, owner
/// references, other webhooks in the list), do not count as drift: server-side apply would leave
/// them alone anyway, and treating them as drift would write on every reconcile.
pub fn is_up_to_date<T: serde::Serialize>(desired: &T, observed: &T) -> bool {
    let (Ok(desired), Ok(observed)) = (
        serde_json::to_value(desired),
        serde_json::to_value(observed),
    ) else {
        return false;
    };
    contains(&observed, &desired, &[])
}

/// Lists that server-side apply merges by key rather than replacing whole.
fn merge_key(path: &[&str]) -> Option<&'static str> {
    match path {
        ["webhooks"] => Some("name"),
        ["metadata", "ownerReferences"] => Some("uid"),
        _ => None,
    }
}

fn contains(observed: &Value, desired: &Value, path: &[&str]) -> bool {
    match (observed, desired) {
        (Value::Object(o), Value::Object(d)) => d.iter().all(|(key, dv)| {
            let mut child = path.to_vec();
            child.push(key);
            match o.get(key) {
                Some(ov) => contains(ov, dv, &child),
                None => dv.is_null(),
            }
        }),
        (Value::Array(o), Value::Array(d)) => match merge_key(path) {
            Some(key) => d.iter().all(|dv| {
                let id = dv.get(key);
                o.iter()
                    .find(|ov| id.is_some() && ov.get(key) == id)
                    .is_some_and(|ov| contains(ov, dv, &[]))
            }),
            // Atomic lists (rules, selector requirements, their values): an extra element changes
            // the meaning, so the lengths must match.
            None => o.len() == d.len() && o.iter().zip(d).all(|(ov, dv)| contains(ov, dv, &[])),
        },
        _ => observed == desired,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use splice_crds::{InjectionPolicySpec, Operation, ReinvocationPolicy};

    fn policy(name: &str, spec: InjectionPolicySpec) -> InjectionPolicy {
        let mut p = InjectionPolicy::new(name, spec);
        p.metadata.uid = Some("uid-1".into());
        p
    }

    fn spec() -> InjectionPolicySpec {
        InjectionPolicySpec {
            operations: vec![Operation::Create],
            timeout_seconds: 3,
            ..InjectionPolicySpec::default()
        }
    }

    fn service() -> ClientTarget {
        ClientTarget::Service {
            namespace: "splice-system".into(),
            name: "splice".into(),
            port: 443,
        }
    }

    fn render_one(p: &InjectionPolicy, target: &ClientTarget) -> MutatingWebhookConfiguration {
        let cx = RenderContext {
            target,
            splice_namespace: "splice-system",
            ca_bundle: b"CA PEM",
        };
        render(p, FailurePolicy::Ignore, &cx).unwrap()
    }

    fn only_webhook(c: &MutatingWebhookConfiguration) -> &MutatingWebhook {
        let hooks = c.webhooks.as_ref().unwrap();
        assert_eq!(hooks.len(), 1);
        &hooks[0]
    }

    #[test]
    fn a_policy_becomes_one_owned_labelled_webhook_with_the_contract_fields() {
        let mut s = spec();
        s.timeout_seconds = 7;
        s.reinvocation_policy = ReinvocationPolicy::Never;
        s.operations = vec![Operation::Create, Operation::Update];
        let c = render_one(&policy("mesh", s), &service());

        assert_eq!(c.metadata.name.as_deref(), Some("splice-mesh"));
        assert_eq!(
            c.metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
            "splice"
        );
        let owner = &c.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.api_version.as_str(),
                owner.name.as_str()
            ),
            ("InjectionPolicy", "splice.dev/v1alpha1", "mesh")
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );

        let w = only_webhook(&c);
        assert_eq!(w.name, "mesh.splice.dev");
        assert_eq!(w.side_effects, "None");
        assert_eq!(w.admission_review_versions, vec!["v1"]);
        assert_eq!(w.match_policy.as_deref(), Some("Equivalent"));
        assert_eq!(w.timeout_seconds, Some(7));
        assert_eq!(w.reinvocation_policy.as_deref(), Some("Never"));
        assert_eq!(w.failure_policy.as_deref(), Some("Ignore"));
        let rule = &w.rules.as_ref().unwrap()[0];
        assert_eq!(rule.api_groups.as_deref(), Some(&[String::new()][..]));
        assert_eq!(rule.resources.as_deref(), Some(&["pods".to_owned()][..]));
        assert_eq!(
            rule.operations.as_deref(),
            Some(&["CREATE".to_owned(), "UPDATE".to_owned()][..])
        );
        let svc = w.client_config.service.as_ref().unwrap();
        assert_eq!(svc.path.as_deref(), Some("/inject/mesh"));
        assert_eq!(
            (svc.name.as_str(), svc.namespace.as_str()),
            ("splice", "splice-system")
        );
        assert_eq!(w.client_config.ca_bundle.as_ref().unwrap().0, b"CA PEM");
    }

    #[test]
    fn the_exclusions_are_added_to_whatever_the_policy_selects() {
        let mut s = spec();
        s.namespace_selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("mesh".into(), "on".into())])),
            match_expressions: None,
        });
        s.object_selector = Some(LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "app".into(),
                operator: "Exists".into(),
                values: None,
            }]),
        });
        let c = render_one(&policy("p", s), &service());
        let w = only_webhook(&c);

        let ns = w.namespace_selector.as_ref().unwrap();
        assert_eq!(ns.match_labels.as_ref().unwrap()["mesh"], "on");
        let exprs = ns.match_expressions.as_ref().unwrap();
        assert_eq!(exprs.len(), 1);
        assert_eq!(exprs[0].key, NAMESPACE_NAME_LABEL);
        assert_eq!(exprs[0].operator, "NotIn");
        assert_eq!(
            exprs[0].values.as_deref().unwrap(),
            ["kube-system", "kube-node-lease", "splice-system"]
        );

        let obj = w
            .object_selector
            .as_ref()
            .unwrap()
            .match_expressions
            .as_ref()
            .unwrap();
        assert_eq!(obj.len(), 2);
        assert_eq!(obj[0].key, "app");
        assert_eq!(
            (obj[1].key.as_str(), obj[1].operator.as_str()),
            (OPT_OUT_LABEL, "NotIn")
        );
        assert_eq!(obj[1].values.as_deref().unwrap(), ["false"]);
    }

    #[test]
    fn a_policy_that_selects_everything_still_excludes_the_system_namespaces() {
        let c = render_one(&policy("all", spec()), &service());
        let ns = only_webhook(&c).namespace_selector.clone().unwrap();
        assert_eq!(ns.match_labels, None);
        assert_eq!(
            ns.match_expressions.unwrap()[0]
                .values
                .as_ref()
                .unwrap()
                .len(),
            3
        );
    }

    #[test]
    fn an_outside_webhook_is_called_by_url_with_the_policy_path() {
        let target = ClientTarget::from_url("https://127.0.0.1:8443/").unwrap();
        let c = render_one(&policy("p", spec()), &target);
        let cc = &only_webhook(&c).client_config;
        assert_eq!(cc.url.as_deref(), Some("https://127.0.0.1:8443/inject/p"));
        assert!(cc.service.is_none());
    }

    #[test]
    fn webhook_urls_that_the_api_server_would_refuse_are_rejected_with_the_reason() {
        for (url, why) in [
            ("http://127.0.0.1:8443", "https://"),
            ("https://127.0.0.1:8443/?a=b", "query"),
            ("https://user@host", "user info"),
            ("https://:8443", "no host"),
            ("https://host:99999", "port"),
            ("https://[::1", "IPv6"),
        ] {
            let err = ClientTarget::from_url(url).unwrap_err().to_string();
            assert!(err.contains(why), "{url}: {err}");
        }
    }

    #[test]
    fn the_certificate_names_cover_the_service_or_the_url_host() {
        let names = service().subject_alt_names();
        assert!(names.contains(&"splice.splice-system.svc".to_owned()));
        let ip = ClientTarget::from_url("https://[::1]:9443")
            .unwrap()
            .subject_alt_names();
        assert_eq!(ip, vec!["::1".to_owned()]);
        let dns = ClientTarget::from_url("https://webhook.example:9443/x").unwrap();
        assert_eq!(dns.subject_alt_names(), vec!["webhook.example".to_owned()]);
    }

    #[test]
    fn a_policy_name_too_long_for_the_webhook_name_is_an_error() {
        let name = "a".repeat(MAX_POLICY_NAME_LEN + 1);
        let cx = RenderContext {
            target: &service(),
            splice_namespace: "s",
            ca_bundle: b"",
        };
        let err = render(&policy(&name, spec()), FailurePolicy::Ignore, &cx).unwrap_err();
        assert!(matches!(err, RenderError::NameTooLong { .. }));
    }

    #[test]
    fn a_policy_without_uid_cannot_be_rendered() {
        let mut p = policy("p", spec());
        p.metadata.uid = None;
        let cx = RenderContext {
            target: &service(),
            splice_namespace: "s",
            ca_bundle: b"",
        };
        assert_eq!(
            render(&p, FailurePolicy::Ignore, &cx).unwrap_err(),
            RenderError::MissingUid("p".into())
        );
    }

    #[test]
    fn server_defaults_and_foreign_metadata_are_not_drift() {
        let desired = render_one(&policy("p", spec()), &service());
        let mut observed = desired.clone();
        observed.metadata.resource_version = Some("42".into());
        observed
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "x".into());
        observed.webhooks.as_mut().unwrap()[0]
            .rules
            .as_mut()
            .unwrap()[0]
            .scope = Some("*".into());
        // The scope is one we set, so it *is* drift; put it back and check the rest.
        assert!(!is_up_to_date(&desired, &observed));
        observed.webhooks.as_mut().unwrap()[0]
            .rules
            .as_mut()
            .unwrap()[0]
            .scope = Some("Namespaced".into());
        observed.webhooks.as_mut().unwrap()[0].match_conditions = Some(vec![]);
        assert!(is_up_to_date(&desired, &observed));
    }

    #[test]
    fn an_edited_field_we_own_is_drift() {
        let desired = render_one(&policy("p", spec()), &service());
        let mut observed = desired.clone();
        observed.webhooks.as_mut().unwrap()[0].failure_policy = Some("Fail".into());
        assert!(!is_up_to_date(&desired, &observed));

        let mut observed = desired.clone();
        let sel = observed.webhooks.as_mut().unwrap()[0]
            .namespace_selector
            .as_mut()
            .unwrap();
        sel.match_expressions.as_mut().unwrap()[0]
            .values
            .as_mut()
            .unwrap()
            .pop();
        assert!(!is_up_to_date(&desired, &observed));

        let mut observed = desired.clone();
        observed.webhooks.as_mut().unwrap()[0].name = "renamed.splice.dev".into();
        assert!(!is_up_to_date(&desired, &observed));

        let mut observed = desired.clone();
        observed.metadata.owner_references = None;
        assert!(!is_up_to_date(&desired, &observed));
    }

    #[test]
    fn an_added_selector_requirement_is_drift() {
        let desired = render_one(&policy("p", spec()), &service());
        let mut observed = desired.clone();
        let sel = observed.webhooks.as_mut().unwrap()[0]
            .object_selector
            .as_mut()
            .unwrap();
        sel.match_expressions
            .as_mut()
            .unwrap()
            .push(LabelSelectorRequirement {
                key: "x".into(),
                operator: "Exists".into(),
                values: None,
            });
        assert!(!is_up_to_date(&desired, &observed));
    }
}
