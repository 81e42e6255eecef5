//! The injection engine: (policy, incoming pod as raw JSON, namespace context) → JSON Patch.
//!
//! Pure and synchronous: no I/O, no clock, no global state. The webhook calls it on the request
//! path and `splice inject` calls it offline, so both give byte-identical results.

use std::collections::BTreeMap;

use splice_crds::{InjectionPolicySpec, Operation};

mod provenance;

pub use provenance::{Provenance, ProvenanceEntry};

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

impl Exclusions {
    /// The mandatory exclusions plus Splice's own namespace.
    pub fn default_for(splice_namespace: &str) -> Self {
        let _ = splice_namespace;
        todo!()
    }

    /// True when pods in `namespace` must never be injected.
    pub fn excludes(&self, namespace: &str) -> bool {
        let _ = namespace;
        todo!()
    }
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
    pub fn generation(&self) -> i64 {
        todo!()
    }
    /// Evaluates the namespace and object selectors (full LabelSelector semantics). `None` when
    /// both select; otherwise the reason this policy leaves the pod alone.
    pub fn check_selectors(
        &self,
        _namespace: &NamespaceContext,
        _pod_labels: &BTreeMap<String, String>,
    ) -> Option<SkipReason> {
        todo!()
    }
    /// True when both selectors select the pod.
    pub fn selects(
        &self,
        namespace: &NamespaceContext,
        pod_labels: &BTreeMap<String, String>,
    ) -> bool {
        self.check_selectors(namespace, pod_labels).is_none()
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
        match self {
            SkipReason::ExcludedNamespace => "excluded_namespace",
            SkipReason::OptedOut => "opted_out",
            SkipReason::NamespaceNotSelected => "namespace_not_selected",
            SkipReason::ObjectNotSelected => "object_not_selected",
            SkipReason::OperationNotConfigured => "operation_not_configured",
            SkipReason::NotAPod => "not_a_pod",
        }
    }
}

/// Errors in a policy (found when compiling it). Each names the policy and the field.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A `{{ … }}` expression does not parse, names a variable outside `pod`, `namespace`,
    /// `policy` and `values`, or (for a template that only reads `policy`/`values`) fails to
    /// render.
    #[error("policy {policy}: {field}: {message}")]
    Template {
        policy: String,
        field: String,
        message: String,
    },
    /// A label selector that Kubernetes would reject (unknown operator, values where none are
    /// allowed, no values where some are required).
    #[error("policy {policy}: {field}: {message}")]
    Selector {
        policy: String,
        field: String,
        message: String,
    },
    /// Two injected items of the same kind share a name (containers and init containers share
    /// one name space).
    #[error("policy {policy}: {field}: duplicate name {name:?}")]
    DuplicateName {
        policy: String,
        field: String,
        name: String,
    },
    /// A field the engine needs is missing or unusable (empty name, reserved key, ...).
    #[error("policy {policy}: {field}: {message}")]
    InvalidField {
        policy: String,
        field: String,
        message: String,
    },
}

impl PolicyError {
    /// Stable label for metrics and conditions.
    pub fn label(&self) -> &'static str {
        match self {
            PolicyError::Template { .. } => "template",
            PolicyError::Selector { .. } => "selector",
            PolicyError::DuplicateName { .. } => "duplicate_name",
            PolicyError::InvalidField { .. } => "invalid_field",
        }
    }
}

/// Errors while injecting one pod.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The object is not valid JSON, or a field the engine reads has the wrong type.
    #[error("invalid object: {0}")]
    InvalidObject(String),
    /// A template failed to render for this pod (undefined variable, out of fuel, too large).
    #[error("policy {policy}: {field}: {message}")]
    Render {
        policy: String,
        field: String,
        message: String,
    },
    /// A rendered value is unusable (an empty or duplicate name, an invalid label value).
    #[error("policy {policy}: {field}: {message}")]
    InvalidRender {
        policy: String,
        field: String,
        message: String,
    },
}

impl EngineError {
    /// Stable label for `splice_admission_requests_total{outcome}` and logs.
    pub fn label(&self) -> &'static str {
        match self {
            EngineError::InvalidObject(_) => "invalid_object",
            EngineError::Render { .. } => "render",
            EngineError::InvalidRender { .. } => "invalid_render",
        }
    }
}

/// Decides and computes the injection of `policy` into `request.object`.
pub fn inject(_policy: &CompiledPolicy, _request: &PodRequest<'_>) -> Result<Decision, EngineError> {
    todo!()
}

/// Like [`inject`], and also returns the object with the patch applied (the input unchanged when
/// the decision is a skip or the patch is empty). `splice inject` and `splice simulate` use it.
pub fn inject_and_apply(
    _policy: &CompiledPolicy,
    _request: &PodRequest<'_>,
) -> Result<(Decision, serde_json::Value), EngineError> {
    todo!()
}

/// Reads the `splice.dev/status` annotation of a pod (raw JSON): what each Splice policy injected.
/// An absent annotation gives an empty map.
pub fn provenance(_object: &str) -> Result<Provenance, EngineError> {
    todo!()
}
