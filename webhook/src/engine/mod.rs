//! The injection engine: (policy, incoming pod as raw JSON, namespace context) → JSON Patch.
//!
//! Pure and synchronous: no I/O, no clock, no global state. The webhook calls it on the request
//! path and `splice inject` calls it offline, so both give byte-identical results.
//!
//! API SURFACE FIXED BY THE LEAD; bodies are being written in the engine work item.

use std::collections::BTreeMap;

use splice_crds::{InjectionPolicySpec, Operation};

/// The namespace a pod is admitted into, as templates and namespace selectors see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceContext {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// Namespaces that are never injected, whatever a policy selects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exclusions {
    /// kube-system, kube-node-lease and Splice's own namespace.
    pub namespaces: Vec<String>,
}

/// A policy checked and compiled once (templates parsed, selectors validated, hash computed), then
/// shared read-only by every request.
#[derive(Debug)]
pub struct CompiledPolicy {
    _private: (),
}

impl CompiledPolicy {
    /// Compiles `spec` for the policy `name` at `generation`. Fails with an error naming the field
    /// (e.g. `spec.template.containers[0].image`) when a template does not parse or a selector is
    /// invalid.
    pub fn compile(
        _name: &str,
        _generation: i64,
        _spec: &InjectionPolicySpec,
    ) -> Result<Self, PolicyError> {
        todo!()
    }
    pub fn name(&self) -> &str {
        todo!()
    }
    /// Stable hash of everything that decides the injected content (template + values + policy
    /// name); recorded in `splice.dev/status` and `status.templateHash`.
    pub fn template_hash(&self) -> &str {
        todo!()
    }
    pub fn spec(&self) -> &InjectionPolicySpec {
        todo!()
    }
}

/// One admission of one pod (or one pod template, offline).
#[derive(Clone, Copy, Debug)]
pub struct PodRequest<'a> {
    pub operation: Operation,
    /// The pod (or PodTemplateSpec: `metadata` + `spec`) as raw JSON, never round-tripped through a
    /// typed struct.
    pub object: &'a str,
    pub namespace: &'a NamespaceContext,
    pub exclusions: &'a Exclusions,
}

/// What the engine decided for one pod.
#[derive(Debug)]
pub enum Decision {
    /// A patch to apply (possibly empty when the pod already carries the current injection).
    Inject(Injection),
    /// Nothing to do, and why (with a stable label for metrics).
    Skip(SkipReason),
}

#[derive(Debug)]
pub struct Injection {
    /// RFC 6902 operations, already serialized as a JSON array; `b"[]"` when nothing changes.
    pub patch: Vec<u8>,
    /// True when `patch` holds at least one operation.
    pub changed: bool,
    /// Human-readable warnings for the AdmissionResponse (injected items, skipped author items).
    pub warnings: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    ExcludedNamespace,
    OptedOut,
    NamespaceNotSelected,
    ObjectNotSelected,
    OperationNotConfigured,
    NotAPod,
}

impl SkipReason {
    /// Stable label for `splice_injection_skipped_total{reason}`.
    pub fn label(self) -> &'static str {
        todo!()
    }
}

/// Errors in a policy (found when compiling it).
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {}

/// Errors while injecting one pod.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {}

/// Decides and computes the injection of `policy` into `request.object`.
pub fn inject(_policy: &CompiledPolicy, _request: &PodRequest<'_>) -> Result<Decision, EngineError> {
    todo!()
}
