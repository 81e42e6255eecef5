//! The `splice.dev/v1alpha1` API: [`InjectionPolicy`], its status, and the conditions helper.
//!
//! This crate has no runtime dependencies (no client, no async): it is shared by the webhook, the
//! operator and the offline CLI, and the CRD YAML is generated from it (`splice crd`).

mod conditions;
mod policy;

pub use conditions::{ConditionStatus, set_condition};
pub use policy::*;

/// The label every Splice-owned object carries.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`] and the server-side-apply field manager.
pub const MANAGER: &str = "splice";
/// A pod carrying this label with value `"false"` is never injected.
pub const OPT_OUT_LABEL: &str = "splice.dev/inject";
/// Provenance annotation recording what each policy injected.
pub const STATUS_ANNOTATION: &str = "splice.dev/status";
/// Namespaces no policy may ever inject into, whatever its selectors say (Splice's own namespace is
/// added at run time).
pub const ALWAYS_EXCLUDED_NAMESPACES: [&str; 2] = ["kube-system", "kube-node-lease"];
/// The label the API server sets on every namespace to its own name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The CRD as YAML, exactly as committed in `deploy/crd.yaml`.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;
    serde_yaml::to_string(&InjectionPolicy::crd())
}
