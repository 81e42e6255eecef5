//! `splice explain`: for one pod, every policy, whether it selects the pod and what decided, what
//! each policy injected (from the pod's `splice.dev/status` record) and whether that injection is
//! outdated. Online (`splice explain POD -n NS`) reads the pod, its namespace and the policies from
//! the cluster; offline (`-f pod.yaml -p policy.yaml…`) reads files. Both hand the same inputs to
//! [`explain`], so they print the same thing for the same objects.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;
use serde_json::Value;
use splice_crds::PodSecurityLevel;
use splice_engine::entry::CanaryScope;
use splice_engine::explain::{self as why, InjectionState, Verdict};
use splice_engine::{
    self, CompiledPolicy, Exclusions, ModeDecision, NamespaceContext, Provenance, ProvenanceEntry,
};

use k8s_openapi::api::core::v1::Pod;
use splice_controller::rollout::{inplace, pods};
use splice_crds::RolloutStrategy;

use super::offline::{self, DEFAULT_SPLICE_NAMESPACE, InputError, NamespaceArgs};
use splice_engine::entry::{Member, Plan};

#[derive(clap::Args)]
pub struct Args {
    /// The pod to explain, read from the cluster (current kubeconfig) in --namespace: NAME, or
    /// kubectl's TYPE/NAME (`pod/NAME`, `pods/NAME`, `po/NAME`).
    #[arg(
        value_name = "POD",
        conflicts_with = "file",
        required_unless_present = "file"
    )]
    pod: Option<String>,
    /// Explain a pod (or a workload's pod template) from a file instead; `-` reads stdin.
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "POD.yaml",
        requires = "policies"
    )]
    file: Option<PathBuf>,
    /// InjectionPolicy files or directories (offline only; online reads the cluster's).
    #[arg(short = 'p', long = "policy", value_name = "POLICY.yaml", num_args = 1.., requires = "file")]
    policies: Vec<PathBuf>,
    #[command(flatten)]
    namespace: NamespaceArgs,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    output: Format,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Table,
    Json,
}

pub fn main(args: Args, cluster: &super::ClusterArgs) -> ExitCode {
    let result = match (&args.pod, &args.file) {
        (_, Some(file)) => offline_inputs(&args, file).map_err(|e| e.to_string()),
        (Some(pod), None) => online_inputs(&args, pod, cluster),
        (None, None) => Err("give a POD name, or -f POD.yaml with -p POLICY.yaml".to_owned()),
    };
    let inputs = match result {
        Ok(i) => i,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let report = match explain(&inputs) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {}: {e}", inputs.title);
            return ExitCode::from(2);
        }
    };
    let text = match args.output {
        Format::Table => render_table(&report),
        Format::Json => match serde_json::to_string_pretty(&report) {
            Ok(s) => s + "\n",
            Err(e) => {
                eprintln!("error: cannot serialize the report: {e}");
                return ExitCode::from(2);
            }
        },
    };
    super::print_or_fail(&text, ExitCode::SUCCESS)
}

/// One policy as explain sees it: compiled, or why it cannot be.
pub(crate) struct PolicyInput {
    pub name: String,
    pub paused: bool,
    pub compiled: Result<CompiledPolicy, String>,
    /// The admission probe's last result, from the policy's status (online only).
    pub probe: Option<ProbeReport>,
    /// Its Ready condition: whether the API server is seen enforcing it (online only).
    pub ready: Option<ReadyReport>,
    /// The webhook configuration serving it, from its status (online only; offline it is
    /// planned as Splice would).
    pub entry: Option<String>,
    /// Its open canary, from its spec and status (online only).
    pub canary: Option<CanaryInput>,
    /// The mode it runs in, decided as the controller does, with its open canary (`None` when it
    /// does not compile).
    pub mode: Option<ModeDecision>,
}

/// An open canary: its selectors, the revision it gets and the promoted one everyone else gets.
#[derive(Debug)]
pub(crate) struct CanaryInput {
    pub selectors: splice_crds::Canary,
    pub canary_revision: String,
    pub promoted_revision: String,
}

impl CanaryInput {
    /// The canary of `policy`, open as `open_canary` decides (`canary`, `stable`), with the
    /// revision its status says the canary gets.
    fn of(
        policy: &splice_crds::InjectionPolicy,
        canary: &splice_crds::Canary,
        stable: &splice_crds::StableRevision,
    ) -> Option<CanaryInput> {
        let rollout = policy.status.as_ref()?.rollout.as_ref()?;
        Some(CanaryInput {
            selectors: canary.clone(),
            canary_revision: rollout.canary_revision.clone()?,
            promoted_revision: stable.template_hash.clone(),
        })
    }
}

/// Which revision of a policy with an open canary a pod like this one gets, and why.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RevisionReport {
    /// The canary's selectors match the pod's namespace and labels.
    pub in_canary: bool,
    pub canary_revision: String,
    pub promoted_revision: String,
    /// What a new pod like this one gets.
    pub new_pods_get: String,
}

/// The webhook entry that serves a policy, and the policies it applies in one call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EntryReport {
    /// The MutatingWebhookConfiguration's name.
    pub configuration: String,
    /// The policies the entry applies in this namespace, in order (name order); this one alone
    /// when not shared.
    pub order: Vec<String>,
}

/// The admission probe's last result for a policy: its Verified condition and `status.probe`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ProbeReport {
    /// True, False or Unknown.
    pub verified: String,
    pub reason: String,
    pub message: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub affected_namespaces: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_time: Option<String>,
}

impl ProbeReport {
    /// What the policy's status says about the probe, if it says anything.
    pub fn from_status(status: Option<&splice_crds::InjectionPolicyStatus>) -> Option<Self> {
        let status = status?;
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == splice_crds::condition::VERIFIED)?;
        let probe = status.probe.clone().unwrap_or_default();
        Some(ProbeReport {
            verified: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            namespaces: probe.namespaces,
            affected_namespaces: probe.affected_namespaces,
            probe_time: probe.probe_time,
        })
    }
}

/// A policy's Ready condition: Ready is True for a generation only once the API server is seen
/// enforcing it, so a False (or an older `observedGeneration`) says what it still waits for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ReadyReport {
    pub status: String,
    pub reason: String,
    pub message: String,
    /// The generation Ready speaks of, and the policy's own.
    pub observed_generation: Option<i64>,
    pub generation: Option<i64>,
    /// `status.enforcement.evidence`: `Probe` or `SettleTime`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
}

impl ReadyReport {
    pub fn from_policy(policy: &splice_crds::InjectionPolicy) -> Option<Self> {
        let status = policy.status.as_ref()?;
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == splice_crds::condition::READY)?;
        Some(ReadyReport {
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            observed_generation: c.observed_generation,
            generation: policy.metadata.generation,
            evidence: status.enforcement.as_ref().map(|e| e.evidence.clone()),
        })
    }

    /// True when Ready says the API server enforces the policy's current generation.
    fn enforced(&self) -> bool {
        self.status == "True" && self.observed_generation == self.generation
    }
}

/// Everything [`explain`] needs, from the cluster or from files.
pub(crate) struct Inputs {
    /// `Pod shop/web`, for the heading and errors.
    pub title: String,
    /// The pod (or pod template) as JSON.
    pub pod: Value,
    pub namespace: NamespaceContext,
    pub exclusions: Exclusions,
    /// The SPIFFE trust domain `{{ identity.spiffeID }}` names.
    pub trust_domain: String,
    pub policies: Vec<PolicyInput>,
    /// The pod's PodCertificateRequests to Splice's signer (online only), or why they could not
    /// be read (an API server that does not serve them).
    pub identity_requests: Option<Result<Vec<IdentityRequest>, String>>,
}

/// One PodCertificateRequest of the pod to `splice.dev/identity`, as its status says.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct IdentityRequest {
    pub name: String,
    /// Issued, Denied, Failed or Pending.
    pub state: String,
    /// The condition's reason and message, or when an issued certificate expires and refreshes.
    pub detail: String,
}

impl IdentityRequest {
    pub(crate) fn of(pcr: &k8s_openapi::api::certificates::v1beta1::PodCertificateRequest) -> Self {
        let name = pcr.metadata.name.clone().unwrap_or_default();
        let status = pcr.status.as_ref();
        let settled = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.status == "True"));
        match settled {
            Some(c) if c.type_ == splice_controller::identity::decide::ISSUED => {
                let at = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
                    t.map_or_else(|| "?".to_owned(), |t| t.0.to_string())
                };
                IdentityRequest {
                    name,
                    state: splice_controller::identity::decide::ISSUED.into(),
                    detail: format!(
                        "valid until {}, the kubelet refreshes it from {}",
                        at(status.and_then(|s| s.not_after.as_ref())),
                        at(status.and_then(|s| s.begin_refresh_at.as_ref()))
                    ),
                }
            }
            Some(c) => IdentityRequest {
                name,
                state: c.type_.clone(),
                detail: format!("{}: {}", c.reason, c.message),
            },
            None => IdentityRequest {
                name,
                state: "Pending".into(),
                detail: format!(
                    "not answered yet (created {})",
                    pcr.metadata
                        .creation_timestamp
                        .as_ref()
                        .map_or_else(|| "?".to_owned(), |t| t.0.to_string())
                ),
            },
        }
    }
}

/// The pod's identity, when a policy that selects it has `spec.identity`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct IdentityReport {
    #[serde(rename = "spiffeID")]
    pub spiffe_id: String,
    /// The selecting policies with `spec.identity`.
    pub policies: Vec<String>,
    /// Its requests to the signer (online only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<Vec<IdentityRequest>>,
    /// Why the requests could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_error: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Report {
    pub pod: String,
    pub namespace: String,
    /// True when some policy's injection on this pod came from an earlier template.
    pub outdated: bool,
    pub policies: Vec<PolicyReport>,
    /// Entries of `splice.dev/status` whose policy no longer exists.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unknown_policies: BTreeMap<String, ProvenanceEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<IdentityReport>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PolicyReport {
    pub name: String,
    /// Whether the policy selects this pod (false for paused or invalid policies).
    pub matches: bool,
    /// What decided, in words.
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    pub paused: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub operations: Vec<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
    /// The strictest Pod Security level the policy's injected content satisfies (absent when it
    /// does not compile): a namespace enforcing a stricter level refuses the injected pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_security: Option<PodSecurityLevel>,
    /// The mode the policy runs in (InTree or Webhook; absent when it does not compile), and why
    /// the webhook when it could have run in-tree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<splice_crds::Mode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode_reason: Option<String>,
    pub injection: InjectionState,
    /// What the pod's record says this policy injected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub injected: Option<ProvenanceEntry>,
    /// The admission probe's last result for the policy (online only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeReport>,
    /// Its Ready condition (online only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<ReadyReport>,
    /// The webhook entry serving the policy (absent when none does: paused or invalid).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook_entry: Option<EntryReport>,
    /// While the policy's canary is open: which revision pods like this one get.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<RevisionReport>,
    /// With `spec.rollout` and an outdated injection: the path the rollout takes this pod on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout_path: Option<PathReport>,
    /// The in-place update the policy made on this pod (its `splice.dev/in-place` marker).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_place: Option<InPlaceReport>,
    /// With `spec.overrides`: each value the pod gets now and where it comes from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overrides: Option<OverridesReport>,
}

/// What a policy's overrides give the pod now, from its annotations, its namespace's and the
/// defaults: the values, or the refusal its admission would get.
#[derive(Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OverridesReport {
    pub values: Vec<OverrideValue>,
    /// The pod's annotation its policy does not accept: its admission is denied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Namespace annotations set aside for their default.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub namespace_refused: Vec<String>,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct OverrideValue {
    pub name: String,
    pub annotation: String,
    pub value: String,
    /// `pod`, `namespace` or `default`.
    pub from: &'static str,
}

fn overrides_report(
    compiled: &CompiledPolicy,
    pod: &Value,
    namespace: &NamespaceContext,
) -> Option<OverridesReport> {
    let overrides = compiled.overrides();
    if overrides.is_empty() {
        return None;
    }
    let annotations = pod.pointer("/metadata/annotations");
    let own = |key: &str| annotations.and_then(|a| a.get(key)).and_then(Value::as_str);
    Some(
        match overrides.resolve(own, &namespace.name, &namespace.annotations) {
            Ok(r) => OverridesReport {
                values: r
                    .values
                    .into_iter()
                    .map(|c| OverrideValue {
                        name: c.name,
                        annotation: c.annotation,
                        value: c.value,
                        from: c.origin.as_str(),
                    })
                    .collect(),
                refused: None,
                namespace_refused: r
                    .namespace_refusals
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
            },
            Err(refusal) => OverridesReport {
                values: Vec::new(),
                refused: Some(refusal.to_string()),
                namespace_refused: Vec::new(),
            },
        },
    )
}

/// How an outdated pod reaches the new revision, as the engine sorts it
/// (`splice_engine::change::sort`).
#[derive(Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PathReport {
    /// `metadata`, `image`, `resize`, `restart`; `waits` outside an open canary; `unknown` when
    /// the change cannot be sorted.
    pub label: &'static str,
    pub why: String,
}

/// An in-place update on the pod, from its marker, and where its proof stands.
#[derive(Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct InPlaceReport {
    pub revision: String,
    pub at: String,
    pub proof: String,
}

/// The pure core shared by the online and offline paths. Fails only when the pod's
/// `splice.dev/status` annotation cannot be read.
pub(crate) fn explain(inputs: &Inputs) -> Result<Report, String> {
    let text = inputs.pod.to_string();
    let mut provenance: Provenance = splice_engine::provenance(&text).map_err(|e| e.to_string())?;
    let labels: BTreeMap<String, String> = inputs
        .pod
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    let entries = entries_of(&inputs.policies);
    let mut policies = Vec::new();
    for p in &inputs.policies {
        let injected = provenance.remove(&p.name);
        let webhook_entry = entries.get(&p.name).cloned();
        let report = match &p.compiled {
            Err(error) => PolicyReport {
                name: p.name.clone(),
                matches: false,
                reason: "invalid: the policy does not compile, so it is not served".into(),
                verdict: None,
                paused: p.paused,
                error: Some(error.clone()),
                operations: Vec::new(),
                template_hash: None,
                pod_security: None,
                mode: None,
                mode_reason: None,
                injection: match &injected {
                    Some(e) => InjectionState::Outdated {
                        recorded_hash: e.hash.clone(),
                        changed_sources: Vec::new(),
                    },
                    None => InjectionState::NotInjected,
                },
                injected,
                probe: p.probe.clone(),
                ready: p.ready.clone(),
                webhook_entry,
                revision: None,
                rollout_path: None,
                in_place: None,
                overrides: None,
            },
            Ok(compiled) => {
                let verdict = why::decide(compiled, &inputs.namespace, &inputs.exclusions, &labels);
                let reason = if p.paused {
                    format!("paused: no webhook configuration ({})", verdict.describe())
                } else {
                    verdict.describe()
                };
                let single: Provenance = injected
                    .iter()
                    .map(|e| (p.name.clone(), e.clone()))
                    .collect();
                PolicyReport {
                    name: p.name.clone(),
                    matches: verdict.selected() && !p.paused,
                    reason,
                    verdict: Some(verdict),
                    paused: p.paused,
                    error: None,
                    operations: compiled
                        .spec()
                        .operations
                        .iter()
                        .map(|o| o.as_str())
                        .collect(),
                    template_hash: Some(compiled.template_hash().to_owned()),
                    pod_security: Some(compiled.pod_security().level),
                    mode: p.mode.as_ref().map(|m| m.effective),
                    mode_reason: p
                        .mode
                        .as_ref()
                        .and_then(|m| m.webhook_only.as_ref())
                        .map(ToString::to_string),
                    injection: why::injection_state(compiled, &single, &inputs.namespace),
                    injected,
                    probe: p.probe.clone(),
                    ready: p.ready.clone(),
                    webhook_entry,
                    revision: p.canary.as_ref().map(|c| {
                        let in_canary = CanaryScope::of(&c.selectors)
                            .holds(Some(&inputs.namespace.labels), &labels);
                        RevisionReport {
                            in_canary,
                            canary_revision: c.canary_revision.clone(),
                            promoted_revision: c.promoted_revision.clone(),
                            new_pods_get: if in_canary {
                                c.canary_revision.clone()
                            } else {
                                c.promoted_revision.clone()
                            },
                        }
                    }),
                    rollout_path: None,
                    in_place: None,
                    overrides: overrides_report(compiled, &inputs.pod, &inputs.namespace),
                }
            }
        };
        policies.push(report);
    }
    // A partitioned entry calls, for this namespace, only the policies whose namespace selectors
    // hold here (an entry of one selector calls all of them or none).
    let elsewhere: Vec<String> = policies
        .iter()
        .filter(|p| matches!(p.verdict, Some(Verdict::NamespaceSelector { .. })))
        .map(|p| p.name.clone())
        .collect();
    for p in &mut policies {
        if let Some(e) = &mut p.webhook_entry {
            e.order.retain(|n| !elsewhere.contains(n));
        }
    }
    // A pod outside an open canary that carries the promoted revision is pinned, not outdated:
    // recreating it gives it that revision again.
    let pinned = |p: &PolicyReport| {
        p.revision.as_ref().is_some_and(|r| {
            p.injected
                .as_ref()
                .is_some_and(|e| e.hash == r.new_pods_get)
        })
    };
    let outdated = policies
        .iter()
        .any(|p| matches!(p.injection, InjectionState::Outdated { .. }) && !pinned(p));
    let pod: Option<Pod> = serde_json::from_value(inputs.pod.clone()).ok();
    for (report, input) in policies.iter_mut().zip(&inputs.policies) {
        let (Some(pod), Ok(compiled)) = (&pod, &input.compiled) else {
            continue;
        };
        if let Some(m) = inplace::markers(pod.metadata.annotations.as_ref()).get(&input.name) {
            report.in_place = Some(InPlaceReport {
                revision: m.revision.clone(),
                at: m.at.clone(),
                proof: inplace::proof(pod, m).to_string(),
            });
        }
        if matches!(report.injection, InjectionState::Outdated { .. }) && !pinned(report) {
            report.rollout_path = rollout_path(compiled, report, pod, inputs);
        }
    }
    Ok(Report {
        pod: inputs.title.clone(),
        namespace: inputs.namespace.name.clone(),
        outdated,
        identity: identity(inputs, &policies),
        policies,
        unknown_policies: provenance,
    })
}

/// The pod's SPIFFE ID and its requests, when a selecting policy gives it an identity.
fn identity(inputs: &Inputs, reports: &[PolicyReport]) -> Option<IdentityReport> {
    let policies: Vec<String> = reports
        .iter()
        .zip(&inputs.policies)
        .filter(|(r, p)| {
            r.matches
                && p.compiled
                    .as_ref()
                    .is_ok_and(|c| c.spec().identity.is_some())
        })
        .map(|(r, _)| r.name.clone())
        .collect();
    if policies.is_empty() {
        return None;
    }
    let namespace = &inputs.namespace.name;
    let account = inputs
        .pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str);
    let (requests, requests_error) = match &inputs.identity_requests {
        None => (None, None),
        Some(Ok(r)) => (Some(r.clone()), None),
        Some(Err(e)) => (None, Some(e.clone())),
    };
    Some(IdentityReport {
        spiffe_id: splice_engine::identity::spiffe_id(&inputs.trust_domain, namespace, account),
        policies,
        requests,
        requests_error,
    })
}

/// The path `policy`'s rollout takes the outdated `pod` on, or `None` without `spec.rollout`.
fn rollout_path(
    policy: &CompiledPolicy,
    report: &PolicyReport,
    pod: &Pod,
    inputs: &Inputs,
) -> Option<PathReport> {
    let strategy = policy.spec().rollout.as_ref()?.strategy;
    let in_canary = report.revision.as_ref().is_none_or(|r| r.in_canary);
    Some(sorted_path(
        policy,
        strategy,
        pod,
        (&inputs.namespace, &inputs.exclusions, &inputs.trust_domain),
        in_canary,
    ))
}

/// The path an outdated `pod` takes to `policy` under `strategy`, as the engine sorts it (the
/// leader's one rule): shared by `splice explain` and `kubectl splice rollout status`.
/// `in_canary`: the pod gets the revision in force (true when no canary is open).
pub(crate) fn sorted_path(
    policy: &CompiledPolicy,
    strategy: RolloutStrategy,
    pod: &Pod,
    (namespace, exclusions, trust_domain): (&NamespaceContext, &Exclusions, &str),
    in_canary: bool,
) -> PathReport {
    if strategy == RolloutStrategy::Restart {
        return PathReport {
            label: "restart",
            why: "restart: spec.rollout.strategy is Restart".into(),
        };
    }
    // Outside an open canary the pod gets the promoted revision until the promotion.
    if !in_canary {
        return PathReport {
            label: "waits",
            why: "waits: outside the open canary, it moves once the canary is promoted".into(),
        };
    }
    match pods::sort(policy, pod, namespace, exclusions, trust_domain) {
        Ok(change) => PathReport {
            label: change.path.label(),
            why: match (&change.path, strategy) {
                (p, RolloutStrategy::InPlace) if !p.in_place() => {
                    format!("{p} (strategy InPlace restarts nothing: counted in notInPlace)")
                }
                (p, _) => p.to_string(),
            },
        },
        Err(e) => PathReport {
            label: "unknown",
            why: format!("cannot sort the change: {e}"),
        },
    }
}

/// Each served policy's webhook entry: as the statuses name them when they do (online), else as
/// Splice would plan them (offline, failure policies as asked for).
fn entries_of(policies: &[PolicyInput]) -> BTreeMap<String, EntryReport> {
    let mut by_entry: BTreeMap<String, Vec<String>> = BTreeMap::new();
    if policies.iter().any(|p| p.entry.is_some()) {
        for p in policies {
            if let Some(entry) = &p.entry
                && !p.paused
            {
                by_entry
                    .entry(entry.clone())
                    .or_default()
                    .push(p.name.clone());
            }
        }
    } else {
        let members = policies.iter().filter(|p| !p.paused).filter_map(|p| {
            let spec = p.compiled.as_ref().ok()?.spec();
            Some(Member {
                name: p.name.clone(),
                uid: p.name.clone(),
                spec: spec.clone(),
                failure_policy: spec.failure_policy,
                canary: None,
            })
        });
        let plan = Plan::new(members, &format!("{DEFAULT_SPLICE_NAMESPACE}/"));
        for g in plan.groups() {
            by_entry.insert(
                g.configuration.clone(),
                g.names().into_iter().map(str::to_owned).collect(),
            );
        }
    }
    let mut out = BTreeMap::new();
    for (configuration, mut order) in by_entry {
        order.sort();
        for name in &order {
            out.insert(
                name.clone(),
                EntryReport {
                    configuration: configuration.clone(),
                    order: order.clone(),
                },
            );
        }
    }
    out
}

/// What brings an outdated pod to the current template: the rollout's paths where every
/// outdated policy has one (`restart` under `InPlace` restarts nothing), else a recreation.
fn outdated_remedy(report: &Report) -> &'static str {
    let paths: Vec<&str> = report
        .policies
        .iter()
        .filter(|p| matches!(p.injection, InjectionState::Outdated { .. }))
        .map(|p| p.rollout_path.as_ref().map_or("", |r| r.label))
        .collect();
    let all = |labels: &[&str]| paths.iter().all(|p| labels.contains(p));
    if all(&["metadata", "image", "resize"]) {
        "the rollout updates it in place, see below"
    } else if !paths.contains(&"") {
        "spec.rollout's path for it is below"
    } else {
        "recreate the pod to pick up the current template"
    }
}

fn render_identity(out: &mut String, id: &IdentityReport) {
    let _ = writeln!(
        out,
        "\nIdentity (spec.identity of {}): {}",
        id.policies.join(", "),
        id.spiffe_id
    );
    match (&id.requests, &id.requests_error) {
        (_, Some(e)) => {
            let _ = writeln!(out, "  its certificate requests cannot be read: {e}");
        }
        (Some(requests), None) if requests.is_empty() => {
            let _ = writeln!(
                out,
                "  no PodCertificateRequest yet: the kubelet makes one when it mounts the volume"
            );
        }
        (Some(requests), None) => {
            for r in requests {
                let _ = writeln!(
                    out,
                    "  PodCertificateRequest {}: {} ({})",
                    r.name, r.state, r.detail
                );
            }
        }
        (None, None) => {}
    }
}

fn render_table(report: &Report) -> String {
    let mut out = String::new();
    // A policy that selects the pod but left nothing on it is the case users ask about most
    // (admitted while the webhook was unreachable, or created before the policy): say so first.
    let missing: Vec<&str> = report
        .policies
        .iter()
        .filter(|p| p.matches && p.injection == InjectionState::NotInjected)
        .map(|p| p.name.as_str())
        .collect();
    let verdict = if report.outdated {
        format!("injection OUTDATED ({})", outdated_remedy(report))
    } else if !missing.is_empty() {
        format!(
            "NOT injected by {} although selected (admitted while the webhook was unreachable, \
             before the policy existed, or a moment after its namespace was labelled, before the \
             API server saw the label; recreate the pod to inject)",
            missing.join(", ")
        )
    } else {
        "injection up to date".to_owned()
    };
    let _ = writeln!(
        out,
        "{} in namespace {}: {verdict}",
        report.pod, report.namespace
    );
    let rows: Vec<[String; 5]> = report
        .policies
        .iter()
        .map(|p| {
            [
                p.name.clone(),
                if p.matches { "yes" } else { "no" }.to_owned(),
                state_text(&p.injection),
                p.pod_security
                    .map_or_else(|| "-".to_owned(), |l| l.as_str().to_owned()),
                p.reason.clone(),
            ]
        })
        .collect();
    let header = [
        "POLICY",
        "MATCHES",
        "INJECTION",
        "POD SECURITY",
        "DECIDED BY",
    ];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut String, cells: [&str; 5]| {
        let _ = writeln!(
            out,
            "{:<w0$}  {:<w1$}  {:<w2$}  {:<w3$}  {}",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3],
        );
    };
    line(&mut out, header);
    for row in &rows {
        line(&mut out, [&row[0], &row[1], &row[2], &row[3], &row[4]]);
    }
    if report.policies.is_empty() {
        let _ = writeln!(out, "(no policies)");
    }
    for p in &report.policies {
        match (p.mode, &p.mode_reason) {
            (Some(splice_crds::Mode::InTree), _) => {
                let _ = writeln!(out, "{}: mode InTree (a MutatingAdmissionPolicy)", p.name);
            }
            (Some(_), Some(why)) => {
                let _ = writeln!(out, "{}: mode Webhook, because {why}", p.name);
            }
            (Some(_), None) => {
                let _ = writeln!(out, "{}: mode Webhook (requested)", p.name);
            }
            (None, _) => {}
        }
    }
    for p in &report.policies {
        if let Some(r) = &p.revision {
            let carries = p.injected.as_ref().map(|e| e.hash.as_str());
            let _ = writeln!(
                out,
                "{}: canary open (revision {}; promoted {}): this pod is {} the canary, so a pod like it gets {}{}",
                p.name,
                r.canary_revision,
                r.promoted_revision,
                if r.in_canary { "in" } else { "outside" },
                r.new_pods_get,
                match carries {
                    Some(h) if h == r.new_pods_get => "; it carries that revision",
                    Some(_) => "; it carries another",
                    None => "",
                }
            );
        }
    }
    for p in &report.policies {
        if let Some(path) = &p.rollout_path {
            let _ = writeln!(out, "{}: rollout path: {}", p.name, path.why);
        }
        if let Some(m) = &p.in_place {
            let _ = writeln!(
                out,
                "{}: updated in place to revision {} at {}: {}",
                p.name, m.revision, m.at, m.proof
            );
        }
    }
    for p in &report.policies {
        if let Some(error) = &p.error {
            let _ = writeln!(out, "\n{}: {error}", p.name);
        }
    }
    for p in &report.policies {
        let Some(o) = &p.overrides else { continue };
        let _ = writeln!(out, "\n{}: overrides", p.name);
        if let Some(refused) = &o.refused {
            let _ = writeln!(out, "  REFUSED at admission: {refused}");
        }
        for v in &o.values {
            let source = match v.from {
                "pod" => format!("the pod's annotation {}", v.annotation),
                "namespace" => format!(
                    "namespace {}'s annotation {}",
                    report.namespace, v.annotation
                ),
                _ => "the default".to_owned(),
            };
            let _ = writeln!(out, "  {} = {:?} (from {source})", v.name, v.value);
        }
        for n in &o.namespace_refused {
            let _ = writeln!(out, "  set aside, the default is used: {n}");
        }
    }
    // Policies sharing one webhook entry are applied in one call, in a fixed order.
    let mut shown: Vec<&str> = Vec::new();
    for p in &report.policies {
        if let Some(e) = &p.webhook_entry
            && e.order.len() > 1
            && !shown.contains(&e.configuration.as_str())
        {
            if shown.is_empty() {
                let _ = writeln!(
                    out,
                    "\nShared webhook entries (one call each, in this order):"
                );
            }
            shown.push(&e.configuration);
            let _ = writeln!(out, "  {}: {}", e.configuration, e.order.join(" → "));
        }
    }
    if let Some(id) = &report.identity {
        render_identity(&mut out, id);
    }
    let waiting: Vec<(&str, &ReadyReport)> = report
        .policies
        .iter()
        .filter_map(|p| p.ready.as_ref().map(|r| (p.name.as_str(), r)))
        .filter(|(_, r)| !r.enforced())
        .collect();
    if !waiting.is_empty() {
        let _ = writeln!(
            out,
            "\nNot Ready for their current generation (a pod created now may not get it):"
        );
    }
    for (name, r) in waiting {
        let _ = writeln!(
            out,
            "  {name}: Ready={} {} (generation {}, policy at {}): {}",
            r.status,
            r.reason,
            r.observed_generation.unwrap_or_default(),
            r.generation.unwrap_or_default(),
            r.message
        );
    }
    let probed: Vec<(&str, &ProbeReport)> = report
        .policies
        .iter()
        .filter_map(|p| p.probe.as_ref().map(|r| (p.name.as_str(), r)))
        .collect();
    if !probed.is_empty() {
        let _ = writeln!(out, "\nAdmission probe, last result by policy:");
    }
    for (name, r) in probed {
        let at = r
            .probe_time
            .as_deref()
            .map(|t| format!(" (since {t})"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {name}: Verified={} {}{at}: {}",
            r.verified, r.reason, r.message
        );
    }
    let injected: Vec<(&str, &ProvenanceEntry)> = report
        .policies
        .iter()
        .filter_map(|p| p.injected.as_ref().map(|e| (p.name.as_str(), e)))
        .chain(report.unknown_policies.iter().map(|(n, e)| (n.as_str(), e)))
        .collect();
    if injected.is_empty() {
        let _ = writeln!(out, "\nNothing on this pod was injected by Splice.");
    } else {
        let _ = writeln!(
            out,
            "\nInjected, by policy (from {}):",
            splice_crds::STATUS_ANNOTATION
        );
    }
    for (name, e) in injected {
        let unknown = if report.unknown_policies.contains_key(name) {
            " (policy no longer exists)"
        } else {
            ""
        };
        let _ = writeln!(out, "  {name}{unknown}: template {}", e.hash);
        let list = |out: &mut String, what: &str, items: &[String]| {
            if !items.is_empty() {
                let _ = writeln!(out, "    {what}: {}", items.join(", "));
            }
        };
        list(&mut out, "init containers", &e.init_containers);
        list(&mut out, "containers", &e.containers);
        list(&mut out, "volumes", &e.volumes);
        for (container, vars) in &e.env {
            list(&mut out, &format!("env in {container}"), vars);
        }
        for (container, mounts) in &e.volume_mounts {
            list(&mut out, &format!("volume mounts in {container}"), mounts);
        }
        list(&mut out, "labels", &e.labels);
        list(&mut out, "annotations", &e.annotations);
        let overrides: Vec<String> = e
            .overrides
            .iter()
            .map(|(name, r)| format!("{name} from {} (sha256 {})", r.from, r.sha256))
            .collect();
        list(&mut out, "overrides", &overrides);
    }
    out
}

fn state_text(s: &InjectionState) -> String {
    match s {
        InjectionState::NotInjected => "not injected".into(),
        InjectionState::Current => "current".into(),
        InjectionState::Outdated {
            recorded_hash,
            changed_sources,
        } if changed_sources.is_empty() => format!("outdated (was {recorded_hash})"),
        InjectionState::Outdated {
            changed_sources, ..
        } => {
            // `override NAME`: the value it took from the namespace changed there.
            let (overrides, data): (Vec<&String>, Vec<&String>) = changed_sources
                .iter()
                .partition(|s| s.starts_with("override "));
            let mut why = Vec::new();
            if !data.is_empty() {
                let data: Vec<&str> = data.iter().map(|s| s.as_str()).collect();
                why.push(format!("valuesFrom data changed: {}", data.join(", ")));
            }
            if !overrides.is_empty() {
                let names: Vec<&str> = overrides
                    .iter()
                    .filter_map(|s| s.strip_prefix("override "))
                    .collect();
                why.push(format!("namespace value changed: {}", names.join(", ")));
            }
            format!("outdated ({})", why.join("; "))
        }
    }
}

fn offline_inputs(args: &Args, file: &std::path::Path) -> Result<Inputs, InputError> {
    args.namespace
        .validate()
        .map_err(|e| InputError::file("--namespace-label", e))?;
    offline::stdin_at_most_once(args.policies.iter().chain([&file.to_path_buf()]))?;
    let mut loaded = offline::load_policies_at(&args.policies, args.namespace.revision)?;
    let paused = offline::without_paused(&mut loaded);
    offline::resolve_values_from(
        &mut loaded,
        &args.namespace.values_from,
        &args.namespace.splice_namespace,
    )?;
    let offline::Subject {
        title,
        pod,
        own_namespace,
        ..
    } = offline::read_subject(file)?;
    // Paused policies still compiled; load them again as data to explain them.
    let mut policies: Vec<PolicyInput> = loaded
        .into_iter()
        .map(|p| PolicyInput {
            name: p.name,
            paused: false,
            compiled: Ok(p.compiled),
            probe: None,
            ready: None,
            entry: None,
            canary: None,
            mode: Some(p.mode),
        })
        .collect();
    if !paused.is_empty() {
        let mut all = offline::load_policies_at(&args.policies, args.namespace.revision)?;
        all.retain(|p| paused.contains(&p.name));
        policies.extend(all.into_iter().map(|p| PolicyInput {
            name: p.name,
            paused: true,
            compiled: Ok(p.compiled),
            probe: None,
            ready: None,
            entry: None,
            canary: None,
            mode: Some(p.mode),
        }));
        policies.sort_by(|a, b| a.name.cmp(&b.name));
    }
    Ok(Inputs {
        title,
        pod,
        namespace: args.namespace.context(own_namespace.as_deref()),
        exclusions: args.namespace.exclusions(),
        trust_domain: args.namespace.trust_domain.clone(),
        policies,
        identity_requests: None,
    })
}

fn online_inputs(args: &Args, pod: &str, cluster: &super::ClusterArgs) -> Result<Inputs, String> {
    if !args.namespace.namespace_labels.is_empty() {
        return Err(
            "--namespace-label is for -f (offline); online the namespace's own labels are used"
                .into(),
        );
    }
    if !args.namespace.namespace_annotations.is_empty() {
        return Err(
            "--namespace-annotation is for -f (offline); online the namespace's own \
                    annotations are used"
                .into(),
        );
    }
    let pod = pod_name(pod)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(fetch(args, pod, cluster))
}

/// The pod's name from NAME or kubectl's TYPE/NAME, so a name copied from `kubectl get pods -o
/// name` works; another type is refused rather than looked up as a pod of that name.
fn pod_name(arg: &str) -> Result<&str, String> {
    let Some((kind, name)) = arg.split_once('/') else {
        return Ok(arg);
    };
    if !["pod", "pods", "po"].contains(&kind.to_ascii_lowercase().as_str()) {
        return Err(format!(
            "{arg:?} names a {kind}; splice explain explains one pod: give POD or pod/POD (for a \
             workload's pod template, use -f)"
        ));
    }
    if name.is_empty() || name.contains('/') {
        return Err(format!("{arg:?} is not pod/NAME"));
    }
    Ok(name)
}

async fn fetch(args: &Args, name: &str, cluster: &super::ClusterArgs) -> Result<Inputs, String> {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::ResourceExt;
    use kube::api::{Api, ListParams};
    use splice_controller::policy::in_force;
    use splice_crds::InjectionPolicy;
    use splice_engine::intree;

    let client = cluster
        .client()
        .await
        .map_err(|e| format!("cannot reach the cluster: {e:#}"))?;
    let ns_name = match &args.namespace.namespace {
        Some(n) => n.clone(),
        None => client.default_namespace().to_owned(),
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns_name);
    let pod = pods
        .get_opt(name)
        .await
        .map_err(|e| format!("reading pod {ns_name}/{name}: {e}"))?
        .ok_or_else(|| format!("pod {name:?} not found in namespace {ns_name:?}"))?;
    let namespace = Api::<Namespace>::all(client.clone())
        .get_opt(&ns_name)
        .await
        .map_err(|e| format!("reading namespace {ns_name}: {e}"))?
        .ok_or_else(|| format!("namespace {ns_name:?} not found"))?;
    let list = Api::<InjectionPolicy>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing InjectionPolicies: {e}"))?;
    let data = values_data(&client, &list.items, &args.namespace.splice_namespace).await;
    let mut policies: Vec<PolicyInput> = list
        .items
        .iter()
        .map(|p| {
            let name = p.name_any();
            let compiled = compile_online(p, &args.namespace.splice_namespace, &data);
            let open = compiled
                .as_ref()
                .ok()
                .and_then(|c| in_force::open_canary(p, c.template_hash()));
            PolicyInput {
                mode: compiled
                    .as_ref()
                    .ok()
                    .map(|c| intree::decide(p.spec.mode, Some(c), open.is_some())),
                canary: open.and_then(|(canary, stable)| CanaryInput::of(p, canary, stable)),
                compiled,
                paused: p.spec.paused,
                probe: ProbeReport::from_status(p.status.as_ref()),
                ready: ReadyReport::from_policy(p),
                entry: p
                    .status
                    .as_ref()
                    .and_then(|s| s.webhook_configuration.clone()),
                name,
            }
        })
        .collect();
    policies.sort_by(|a, b| a.name.cmp(&b.name));
    let pod_json = serde_json::to_value(&pod).map_err(|e| format!("pod {ns_name}/{name}: {e}"))?;
    let wants_identity = policies.iter().any(|p| {
        p.compiled
            .as_ref()
            .is_ok_and(|c| c.spec().identity.is_some())
    });
    let identity_requests = if wants_identity {
        Some(identity_requests(&client, &ns_name, name).await)
    } else {
        None
    };
    Ok(Inputs {
        title: format!("Pod {ns_name}/{name}"),
        pod: pod_json,
        namespace: NamespaceContext {
            name: ns_name,
            labels: namespace.metadata.labels.clone().unwrap_or_default(),
            annotations: namespace.metadata.annotations.clone().unwrap_or_default(),
        },
        exclusions: args.namespace.exclusions(),
        trust_domain: args.namespace.trust_domain.clone(),
        policies,
        identity_requests,
    })
}

/// The pod's requests to Splice's signer, newest last; the error names what failed (an API
/// server without PodCertificateRequests answers 404).
async fn identity_requests(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
) -> Result<Vec<IdentityRequest>, String> {
    use k8s_openapi::api::certificates::v1beta1::PodCertificateRequest;
    let api: kube::Api<PodCertificateRequest> = kube::Api::namespaced(client.clone(), namespace);
    let mut list: Vec<PodCertificateRequest> = api
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|e| format!("listing PodCertificateRequests in {namespace}: {e}"))?
        .items
        .into_iter()
        .filter(|r| r.spec.pod_name == pod && r.spec.signer_name == splice_crds::IDENTITY_SIGNER)
        .collect();
    list.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .cmp(&b.metadata.creation_timestamp)
    });
    Ok(list.iter().map(IdentityRequest::of).collect())
}

/// A policy read from the cluster, compiled with the `valuesFrom` data read now (`data`), so
/// explain can name the source a pod's data trails and `rollout status` sorts pods against what
/// the webhook renders.
pub(crate) fn compile_online(
    p: &splice_crds::InjectionPolicy,
    splice_namespace: &str,
    data: &splice_engine::DataSources,
) -> Result<CompiledPolicy, String> {
    use kube::ResourceExt;
    let name = p.name_any();
    let generation = p.metadata.generation.unwrap_or_default();
    let resolved = (!p.spec.values_from.is_empty())
        .then(|| splice_engine::values_from::resolve(&p.spec, splice_namespace, None, data).ok())
        .flatten();
    match &resolved {
        Some(r) => CompiledPolicy::compile_with(&name, generation, &p.spec, r),
        None => CompiledPolicy::compile(&name, generation, &p.spec),
    }
    .map_err(|e| e.to_string())
}

/// The ConfigMaps and Secrets the policies' `valuesFrom` read, as far as this user may read
/// them (one that cannot be read leaves that policy compared by template hash alone).
pub(crate) async fn values_data(
    client: &kube::Client,
    policies: &[splice_crds::InjectionPolicy],
    splice_namespace: &str,
) -> splice_engine::DataSources {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube::api::Api;
    use splice_engine::{SourceKind, values_from};
    let mut data = splice_engine::DataSources::default();
    let mut wanted: Vec<splice_engine::SourceRef> = policies
        .iter()
        .flat_map(|p| values_from::sources(&p.spec, splice_namespace))
        .collect();
    wanted.sort();
    wanted.dedup();
    for object in wanted {
        let values = match object.kind {
            SourceKind::ConfigMap => {
                Api::<ConfigMap>::namespaced(client.clone(), &object.namespace)
                    .get_opt(&object.name)
                    .await
                    .ok()
                    .flatten()
                    .map(|cm| values_from::config_map_data(&cm))
            }
            SourceKind::Secret => Api::<Secret>::namespaced(client.clone(), &object.namespace)
                .get_opt(&object.name)
                .await
                .ok()
                .flatten()
                .map(|s| values_from::secret_data(&s)),
        };
        if let Some(values) = values {
            data.insert(object, values);
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use splice_crds::InjectionPolicySpec;

    use super::*;

    #[test]
    fn a_pod_is_named_by_name_or_by_kubectls_type_slash_name() {
        for arg in ["debug", "pod/debug", "pods/debug", "po/debug", "Pod/debug"] {
            assert_eq!(pod_name(arg), Ok("debug"), "{arg}");
        }
    }

    #[test]
    fn another_type_or_an_empty_name_is_refused_saying_why() {
        let e = pod_name("deployment/web").unwrap_err();
        assert!(e.contains("names a deployment"), "{e}");
        assert!(e.contains("pod/POD"), "{e}");
        assert!(pod_name("pod/").is_err());
        assert!(pod_name("pod/a/b").is_err());
    }

    fn input(name: &str, yaml: &str, paused: bool) -> PolicyInput {
        let spec: InjectionPolicySpec = serde_yaml::from_str(yaml).unwrap();
        let compiled = CompiledPolicy::compile(name, 1, &spec).map_err(|e| e.to_string());
        PolicyInput {
            name: name.into(),
            paused,
            mode: compiled
                .as_ref()
                .ok()
                .map(|c| splice_engine::intree::decide(spec.mode, Some(c), false)),
            compiled,
            probe: None,
            ready: None,
            entry: None,
            canary: None,
        }
    }

    fn inputs(namespace: &str, pod: Value, policies: Vec<PolicyInput>) -> Inputs {
        Inputs {
            title: "Pod x".into(),
            pod,
            namespace: NamespaceContext {
                name: namespace.into(),
                ..Default::default()
            },
            exclusions: Exclusions::default_for("splice-system"),
            trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN.into(),
            policies,
            identity_requests: None,
        }
    }

    #[test]
    fn a_selected_identity_policy_shows_the_pods_spiffe_id_and_its_requests_answers() {
        let id = input(
            "id",
            "identity: {mountPath: /var/run/id}\ntemplate:\n  containers: [{name: proxy, image: p}]\n",
            false,
        );
        let plain = input(
            "plain",
            "template:\n  containers: [{name: log, image: l}]\n",
            false,
        );
        let pod = serde_json::json!({
            "metadata": {"labels": {"app": "web"}},
            "spec": {"serviceAccountName": "web", "containers": [{"name": "app"}]}
        });
        let mut i = inputs("shop", pod, vec![id, plain]);
        let none = explain(&i).unwrap();
        let report = none.identity.as_ref().unwrap();
        assert_eq!(report.spiffe_id, "spiffe://cluster.local/ns/shop/sa/web");
        assert_eq!(report.policies, ["id"]);
        assert!(report.requests.is_none(), "offline reads no requests");
        let pcr: k8s_openapi::api::certificates::v1beta1::PodCertificateRequest =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web-abc", "namespace": "shop"},
                "spec": {"signerName": "splice.dev/identity", "podName": "x", "podUID": "u",
                         "serviceAccountName": "web", "serviceAccountUID": "s", "nodeName": "n",
                         "nodeUID": "nu", "pkixPublicKey": "", "proofOfPossession": ""},
                "status": {"conditions": [{"type": "Denied", "status": "True",
                    "reason": "NotSelected", "message": "no Ready identity policy selects it",
                    "lastTransitionTime": "2026-12-06T00:00:00Z"}]}
            }))
            .unwrap();
        i.identity_requests = Some(Ok(vec![IdentityRequest::of(&pcr)]));
        let table = render_table(&explain(&i).unwrap());
        assert!(
            table.contains("Identity (spec.identity of id): spiffe://cluster.local/ns/shop/sa/web"),
            "{table}"
        );
        assert!(
            table.contains("PodCertificateRequest web-abc: Denied (NotSelected: no Ready identity policy selects it)"),
            "{table}"
        );
        i.identity_requests = Some(Ok(Vec::new()));
        let table = render_table(&explain(&i).unwrap());
        assert!(table.contains("no PodCertificateRequest yet"), "{table}");
        i.policies.remove(0);
        assert!(
            explain(&i).unwrap().identity.is_none(),
            "no identity policy, no identity"
        );
    }

    #[test]
    fn each_policy_is_reported_with_what_decided_and_what_it_injected() {
        let mesh = input(
            "mesh",
            "objectSelector: {matchLabels: {app: web}}\ntemplate:\n  containers: [{name: proxy, image: p}]\n",
            false,
        );
        let hash = mesh.compiled.as_ref().unwrap().template_hash().to_owned();
        let status = serde_json::json!({
            "mesh": {"hash": hash, "containers": ["proxy"], "env": {"app": ["A"]}},
            "gone": {"hash": "h0", "volumes": ["v"]},
        })
        .to_string();
        let pod = serde_json::json!({
            "metadata": {"labels": {"app": "web"}, "annotations": {"splice.dev/status": status}},
            "spec": {"containers": [{"name": "app"}]}
        });
        let logs = input("logs", "objectSelector: {matchLabels: {logs: on}}\n", false);
        let r = explain(&inputs("shop", pod, vec![logs, mesh])).unwrap();
        assert!(!r.outdated);
        assert_eq!(r.policies[0].name, "logs");
        assert!(!r.policies[0].matches);
        assert!(
            r.policies[0]
                .reason
                .contains("spec.objectSelector.matchLabels[\"logs\"]"),
            "{}",
            r.policies[0].reason
        );
        assert!(r.policies[1].matches);
        assert_eq!(r.policies[1].injection, InjectionState::Current);
        let injected = r.policies[1].injected.as_ref().unwrap();
        assert_eq!(injected.containers, ["proxy"]);
        assert_eq!(injected.env["app"], ["A"]);
        assert!(r.unknown_policies.contains_key("gone"));
        let table = render_table(&r);
        assert!(table.contains("env in app: A"), "{table}");
        assert!(table.contains("gone (policy no longer exists)"), "{table}");
    }

    #[test]
    fn a_selected_pod_without_the_policys_injection_is_called_out_first() {
        let mesh = input(
            "mesh",
            "template:\n  containers: [{name: proxy, image: p}]\n",
            false,
        );
        let pod = serde_json::json!({"spec": {"containers": [{"name": "app"}]}});
        let r = explain(&inputs("shop", pod, vec![mesh])).unwrap();
        assert_eq!(r.policies[0].injection, InjectionState::NotInjected);
        let headline = render_table(&r)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned();
        assert!(headline.contains("NOT injected by mesh"), "{headline}");
        assert!(!headline.contains("up to date"), "{headline}");
    }

    #[test]
    fn a_recorded_hash_from_an_earlier_template_makes_the_pod_outdated() {
        let status = serde_json::json!({"mesh": {"hash": "earlier"}}).to_string();
        let pod = serde_json::json!({
            "metadata": {"annotations": {"splice.dev/status": status}},
            "spec": {"containers": [{"name": "app"}]}
        });
        let r = explain(&inputs(
            "shop",
            pod,
            vec![input("mesh", "template: {labels: {a: b}}\n", false)],
        ))
        .unwrap();
        assert!(r.outdated);
        assert!(render_table(&r).contains("OUTDATED"));
    }

    #[test]
    fn with_a_canary_open_a_pod_outside_it_is_pinned_to_the_promoted_revision_not_outdated() {
        let pod = |labels: Value| {
            let status = serde_json::json!({"mesh": {"hash": "promoted"}}).to_string();
            serde_json::json!({
                "metadata": {"labels": labels, "annotations": {"splice.dev/status": status}},
                "spec": {"containers": [{"name": "app"}]}
            })
        };
        let canary = || {
            let mut p = input("mesh", "template: {labels: {a: b}}\n", false);
            p.canary = Some(CanaryInput {
                selectors: serde_yaml::from_str("objectSelector: {matchLabels: {track: canary}}")
                    .unwrap(),
                canary_revision: "new".into(),
                promoted_revision: "promoted".into(),
            });
            p
        };
        let outside = explain(&inputs("shop", pod(serde_json::json!({})), vec![canary()])).unwrap();
        assert!(
            !outside.outdated,
            "recreating it would give it the promoted revision again"
        );
        let r = outside.policies[0]
            .revision
            .as_ref()
            .expect("a canary report");
        assert!(!r.in_canary);
        assert_eq!(r.new_pods_get, "promoted");
        let table = render_table(&outside);
        assert!(
            table.contains("this pod is outside the canary, so a pod like it gets promoted; it carries that revision"),
            "{table}"
        );

        let inside = explain(&inputs(
            "shop",
            pod(serde_json::json!({"track": "canary"})),
            vec![canary()],
        ))
        .unwrap();
        assert!(
            inside.outdated,
            "in the canary, the promoted revision is the old one"
        );
        assert_eq!(
            inside.policies[0].revision.as_ref().unwrap().new_pods_get,
            "new"
        );
    }

    #[test]
    fn an_outdated_pod_under_a_rollout_is_told_its_path_and_its_in_place_proof() {
        let spec = |strategy: &str, image: &str| {
            format!(
                "rollout: {{strategy: {strategy}}}\ntemplate:\n  containers: [{{name: proxy, image: \"{image}\"}}]\n"
            )
        };
        let old = input("mesh", &spec("Auto", "proxy:1"), false);
        let old_hash = old.compiled.as_ref().unwrap().template_hash().to_owned();
        let status = serde_json::json!({"mesh": {"hash": old_hash, "containers": ["proxy"]}});
        let marker = serde_json::json!({"mesh": {"revision": "r0", "at": "2026-01-01T00:00:00Z",
            "uid": "u1", "generation": 1}});
        let pod = serde_json::json!({
            "metadata": {"name": "web-1", "uid": "u1", "annotations": {
                "splice.dev/status": status.to_string(),
                "splice.dev/in-place": marker.to_string(),
            }},
            "spec": {"containers": [
                {"name": "app", "image": "web:1"},
                {"name": "proxy", "image": "proxy:1"},
            ]}
        });
        let r = explain(&inputs(
            "shop",
            pod.clone(),
            vec![input("mesh", &spec("Auto", "proxy:2"), false)],
        ))
        .unwrap();
        let path = r.policies[0].rollout_path.as_ref().unwrap();
        assert_eq!(path.label, "image");
        let table = render_table(&r);
        assert!(
            table.contains("injection OUTDATED (the rollout updates it in place, see below)"),
            "{table}"
        );
        assert!(
            table.contains("mesh: rollout path: in place: image of proxy proxy:1 -> proxy:2"),
            "{table}"
        );
        assert!(
            table.contains(
                "mesh: updated in place to revision r0 at 2026-01-01T00:00:00Z: proven (same UID"
            ),
            "{table}"
        );

        let r = explain(&inputs(
            "shop",
            pod,
            vec![input("mesh", &spec("Restart", "proxy:2"), false)],
        ))
        .unwrap();
        assert_eq!(
            r.policies[0].rollout_path.as_ref().unwrap().why,
            "restart: spec.rollout.strategy is Restart"
        );
    }

    #[test]
    fn paused_policies_and_excluded_namespaces_never_match() {
        let pod = serde_json::json!({"metadata": {}, "spec": {"containers": [{"name": "app"}]}});
        let r = explain(&inputs(
            "kube-system",
            pod.clone(),
            vec![input("a", "{}\n", false)],
        ))
        .unwrap();
        assert!(!r.policies[0].matches);
        assert!(
            r.policies[0]
                .reason
                .contains("namespace kube-system is never injected")
        );
        let r = explain(&inputs("shop", pod, vec![input("a", "{}\n", true)])).unwrap();
        assert!(!r.policies[0].matches);
        assert!(r.policies[0].reason.starts_with("paused"));
    }

    #[test]
    fn the_probes_last_result_is_shown_for_each_policy_that_has_one() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let status = splice_crds::InjectionPolicyStatus {
            conditions: vec![Condition {
                type_: "Verified".into(),
                status: "False".into(),
                reason: "RejectedByAdmission".into(),
                message: "refused in shop: container \"init\" must not include \"NET_ADMIN\""
                    .into(),
                observed_generation: Some(1),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            }],
            probe: Some(splice_crds::ProbeStatus {
                result: "RejectedByAdmission".into(),
                namespaces: vec!["shop".into()],
                affected_namespaces: vec!["shop".into()],
                probe_time: Some("2026-01-01T00:00:00Z".into()),
                latency: None,
            }),
            ..Default::default()
        };
        let mut mesh = input("mesh", "{}\n", false);
        mesh.probe = ProbeReport::from_status(Some(&status));
        let quiet = input("quiet", "{}\n", false);
        assert!(ProbeReport::from_status(None).is_none());
        let pod = serde_json::json!({"spec": {"containers": [{"name": "app"}]}});
        let r = explain(&inputs("shop", pod, vec![mesh, quiet])).unwrap();
        let probe = r.policies[0].probe.as_ref().unwrap();
        assert_eq!(probe.affected_namespaces, ["shop"]);
        assert!(r.policies[1].probe.is_none());
        let table = render_table(&r);
        assert!(
            table.contains("mesh: Verified=False RejectedByAdmission (since 2026-01-01T00:00:00Z)"),
            "{table}"
        );
        assert!(table.contains("NET_ADMIN"), "{table}");
        assert!(!table.contains("quiet: Verified"), "{table}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json["policies"][0]["probe"]["reason"],
            "RejectedByAdmission"
        );
    }

    #[test]
    fn a_policy_the_api_server_is_not_seen_enforcing_is_named_with_what_ready_waits_for() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let policy = |generation: i64, status: &str, reason: &str, message: &str| {
            let mut p: splice_crds::InjectionPolicy = serde_json::from_value(serde_json::json!({
                "apiVersion": "splice.dev/v1alpha1", "kind": "InjectionPolicy",
                "metadata": {"name": "x", "generation": generation},
                "spec": {"template": {}}
            }))
            .unwrap();
            p.status = Some(splice_crds::InjectionPolicyStatus {
                conditions: vec![Condition {
                    type_: "Ready".into(),
                    status: status.into(),
                    reason: reason.into(),
                    message: message.into(),
                    observed_generation: Some(1),
                    last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                }],
                ..Default::default()
            });
            p
        };
        let mut mesh = input("mesh", "{}\n", false);
        mesh.ready = ReadyReport::from_policy(&policy(
            1,
            "False",
            "NotEnforced",
            "a dry-run pod came back without the injection",
        ));
        let mut logs = input("logs", "{}\n", false);
        logs.ready = ReadyReport::from_policy(&policy(2, "True", "Configured", "gen 1 in force"));
        let mut quiet = input("quiet", "{}\n", false);
        quiet.ready = ReadyReport::from_policy(&policy(1, "True", "Configured", "fine"));
        let pod = serde_json::json!({"spec": {"containers": [{"name": "app"}]}});
        let table = render_table(&explain(&inputs("shop", pod, vec![mesh, logs, quiet])).unwrap());
        assert!(
            table.contains(
                "mesh: Ready=False NotEnforced (generation 1, policy at 1): a dry-run pod came \
                 back without the injection"
            ),
            "{table}"
        );
        assert!(
            table.contains("logs: Ready=True Configured (generation 1, policy at 2)"),
            "True for an earlier generation is not Ready for this one: {table}"
        );
        assert!(!table.contains("quiet: Ready"), "{table}");
    }

    #[test]
    fn an_unreadable_status_annotation_is_an_error() {
        let pod = serde_json::json!({
            "metadata": {"annotations": {"splice.dev/status": "{not json"}},
            "spec": {"containers": []}
        });
        let err = explain(&inputs("shop", pod, vec![])).unwrap_err();
        assert!(err.contains("splice.dev/status"), "{err}");
    }

    #[test]
    fn a_partitioned_entry_shows_the_order_of_the_policies_its_call_applies_in_this_namespace() {
        let selecting = |ns: &str, c: &str| {
            format!(
                "namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}\n\
                 template:\n  containers: [{{name: {c}, image: i}}]\n"
            )
        };
        let pod = serde_json::json!({"metadata": {"name": "web"}, "spec": {"containers": []}});
        let report = explain(&inputs(
            "shop",
            pod,
            vec![
                input("a-mesh", &selecting("shop", "a"), false),
                input("b-other", &selecting("bank", "b"), false),
                input("c-logs", &selecting("shop", "c"), false),
            ],
        ))
        .unwrap();
        let entries: Vec<_> = report
            .policies
            .iter()
            .map(|p| p.webhook_entry.clone().expect("every policy is served"))
            .collect();
        // One configuration for the three, whose call in `shop` applies the two selecting it.
        assert!(
            entries
                .iter()
                .all(|e| e.configuration == entries[0].configuration)
        );
        assert_eq!(entries[0].order, ["a-mesh", "c-logs"]);
    }

    #[test]
    fn policies_sharing_a_webhook_entry_are_shown_with_its_order() {
        let sidecar = |c: &str| format!("template:\n  containers: [{{name: {c}, image: i}}]\n");
        let pod = serde_json::json!({"metadata": {"name": "web"}, "spec": {"containers": []}});
        let mut alone = sidecar("c");
        alone.insert_str(0, "timeoutSeconds: 7\n");
        let report = explain(&inputs(
            "shop",
            pod.clone(),
            vec![
                input("b-logs", &sidecar("b"), false),
                input("a-mesh", &sidecar("a"), false),
                input("c-alone", &alone, false),
                input("d-paused", &sidecar("d"), true),
            ],
        ))
        .unwrap();
        let entry = |name: &str| {
            report
                .policies
                .iter()
                .find(|p| p.name == name)
                .and_then(|p| p.webhook_entry.clone())
        };
        let shared = entry("a-mesh").unwrap();
        assert_eq!(shared.order, ["a-mesh", "b-logs"]);
        assert_eq!(entry("b-logs"), Some(shared.clone()));
        assert_eq!(entry("c-alone").unwrap().configuration, "splice-c-alone");
        assert_eq!(entry("d-paused"), None);
        let table = render_table(&report);
        assert!(
            table.contains(&format!("{}: a-mesh → b-logs", shared.configuration)),
            "{table}"
        );

        // Online, the statuses name the entries.
        let mut online = vec![
            input("b-logs", &sidecar("b"), false),
            input("a-mesh", &sidecar("a"), false),
        ];
        for p in &mut online {
            p.entry = Some("splice--group-0123456789".into());
        }
        let report = explain(&inputs("shop", pod, online)).unwrap();
        assert_eq!(
            report.policies[0]
                .webhook_entry
                .as_ref()
                .unwrap()
                .configuration,
            "splice--group-0123456789"
        );
    }
}
