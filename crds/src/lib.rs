//! The `splice.dev/v1alpha1` API: [`InjectionPolicy`], its status, and the conditions helper.
//!
//! This crate has no runtime dependencies (no client, no async): it is shared by the webhook, the
//! operator and the offline CLI, and the CRD YAML is generated from it (`splice crd`).

mod conditions;
mod policy;
mod validation;

pub use conditions::{ConditionStatus, set_condition};
pub use policy::*;
pub use validation::{
    KNOWN_FORMATS, KNOWN_KEYWORDS, Violation, as_admitted, policy_schema, validate_policy,
};

/// The label every Splice-owned object carries.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`] and the server-side-apply field manager.
pub const MANAGER: &str = "splice";
/// A pod carrying this label with value `"false"` is never injected.
pub const OPT_OUT_LABEL: &str = "splice.dev/inject";
/// Provenance annotation recording what each policy injected.
pub const STATUS_ANNOTATION: &str = "splice.dev/status";
/// On a pod updated in place by a rollout, per policy: the revision, when, and what the pod ran
/// before (images, image IDs, restart counts, the earlier record): the proof and `rollout undo`
/// read it.
pub const IN_PLACE_ANNOTATION: &str = "splice.dev/in-place";
/// Namespaces no policy may ever inject into, whatever its selectors say (Splice's own namespace is
/// added at run time).
pub const ALWAYS_EXCLUDED_NAMESPACES: [&str; 2] = ["kube-system", "kube-node-lease"];
/// The label the API server sets on every namespace to its own name.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The CRD as YAML, exactly as committed in `deploy/crd.yaml`.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    serde_yaml::to_string(&crd())
}

/// The CRD: the schema generated from the Rust types, plus the bounds that the API server's CEL
/// cost estimator needs on the k8s-openapi `Container` schema (which declares none). Without them
/// the API server rejects the CEL rules as too expensive. The bounds are real limits: a container
/// name is a DNS label (63), capability names are short, and no injected container needs more
/// than 64 ports or 32 added capabilities.
pub fn crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt;
    let mut crd = InjectionPolicy::crd();
    for version in &mut crd.spec.versions {
        let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        let Some(template) = schema
            .properties
            .as_mut()
            .and_then(|p| p.get_mut("spec"))
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("template"))
            .and_then(|t| t.properties.as_mut())
        else {
            continue;
        };
        for list in ["containers", "initContainers"] {
            if let Some(container) = template.get_mut(list).and_then(|l| array_items(l)) {
                bound_container(container);
            }
        }
    }
    crd
}

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray,
};

fn array_items(list: &mut JSONSchemaProps) -> Option<&mut JSONSchemaProps> {
    match list.items.as_mut()? {
        JSONSchemaPropsOrArray::Schema(item) => Some(item),
        JSONSchemaPropsOrArray::Schemas(_) => None,
    }
}

fn bound_container(container: &mut JSONSchemaProps) {
    let Some(props) = container.properties.as_mut() else {
        return;
    };
    if let Some(name) = props.get_mut("name") {
        name.max_length = Some(63);
    }
    if let Some(ports) = props.get_mut("ports") {
        ports.max_items = Some(64);
    }
    let add = props
        .get_mut("securityContext")
        .and_then(|s| s.properties.as_mut())
        .and_then(|p| p.get_mut("capabilities"))
        .and_then(|c| c.properties.as_mut())
        .and_then(|p| p.get_mut("add"));
    if let Some(add) = add {
        add.max_items = Some(32);
        if let Some(item) = array_items(add) {
            item.max_length = Some(64);
        }
    }
}
