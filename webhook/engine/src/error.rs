//! What can go wrong: in a policy, found when compiling it ([`PolicyError`]); while injecting one
//! pod ([`EngineError`]). Each has a stable label.

/// Errors in a policy (found when compiling it). Each names the policy and the field.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
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
    /// Content Pod Security `baseline` forbids, without `spec.allowPrivileged`.
    #[error("policy {policy}: {field}: {message}")]
    Privileged {
        policy: String,
        field: String,
        message: String,
    },
}

impl PolicyError {
    /// Stable label for metrics and conditions.
    pub fn label(&self) -> &'static str {
        self.into()
    }

    /// The policy field the error is about.
    pub fn field(&self) -> &str {
        match self {
            PolicyError::Template { field, .. }
            | PolicyError::Selector { field, .. }
            | PolicyError::DuplicateName { field, .. }
            | PolicyError::InvalidField { field, .. }
            | PolicyError::Privileged { field, .. } => field,
        }
    }
}

/// Errors while injecting one pod.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
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
    /// The engine contradicted itself (a patch it planned does not serialize or does not apply):
    /// a bug in Splice, not in the pod or the policy. Its detail names no pod content, so callers
    /// log it whole.
    #[error("engine bug: {0}")]
    Bug(String),
}

impl EngineError {
    /// Stable label for `splice_admission_requests_total{outcome}` and logs.
    pub fn label(&self) -> &'static str {
        self.into()
    }
}
