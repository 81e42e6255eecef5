use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Upper bounds on what one policy may inject. They keep CEL validation within the API server's
/// cost budget and keep a single admission response small.
pub const MAX_INJECTED_CONTAINERS: usize = 16;
pub const MAX_INJECTED_VOLUMES: usize = 32;
pub const MAX_INJECTED_ENV: usize = 128;
pub const MAX_INJECTED_MOUNTS: usize = 32;
pub const MAX_VALUES: usize = 64;
/// At most this many `valuesFrom` entries: each is a watched object on every replica.
pub const MAX_VALUES_FROM: usize = 16;
/// At most this many `overrides` per policy.
pub const MAX_OVERRIDES: usize = 32;
/// The longest override value, default or annotation, in bytes: a longer annotation is refused at
/// admission (the API server allows 256 KiB of annotations; none of it should reach a template).
pub const MAX_OVERRIDE_VALUE_BYTES: usize = 4096;
/// The longest override rule, in characters.
pub const MAX_OVERRIDE_RULE_LEN: usize = 1024;

/// What to inject into pods, and where. Cluster-scoped: one policy serves every namespace its
/// `namespaceSelector` selects.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "splice.dev",
    version = "v1alpha1",
    kind = "InjectionPolicy",
    plural = "injectionpolicies",
    shortname = "ipol",
    category = "splice",
    status = "InjectionPolicyStatus",
    doc = "A Splice InjectionPolicy: what to inject into pods (containers, init containers, volumes, env, mounts, labels, annotations) and which pods, through a mutating admission webhook Splice configures and serves. `status` says whether it is in force and verified.",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Verified","type":"string","jsonPath":".status.conditions[?(@.type==\"Verified\")].reason"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".status.mode"}"#,
    printcolumn = r#"{"name":"Effective failure policy","type":"string","jsonPath":".status.effectiveFailurePolicy"}"#,
    printcolumn = r#"{"name":"Pod security","type":"string","jsonPath":".status.podSecurity"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct InjectionPolicySpec {
    /// Namespaces whose pods are injected. Absent selects every namespace (the mandatory
    /// exclusions always apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// Pods that are injected, by their labels. Absent selects every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_selector: Option<LabelSelector>,

    /// Admission operations that trigger injection. UPDATE only applies labels and annotations,
    /// because a pod's containers are immutable after creation.
    #[serde(default = "default_operations")]
    #[schemars(length(min = 1, max = 2))]
    #[x_kube(validation = Rule::new("self.all(o, self.exists_one(p, p == o))").message("operations must not repeat"))]
    pub operations: Vec<Operation>,

    /// The failure policy requested. `Fail` is only put in force when Splice itself is highly
    /// available; see status.effectiveFailurePolicy.
    #[serde(default)]
    pub failure_policy: FailurePolicy,

    /// How long the API server waits for the webhook, in seconds.
    #[serde(default = "default_timeout_seconds")]
    #[schemars(range(min = 1, max = 30))]
    pub timeout_seconds: i32,

    /// Whether the API server calls this webhook again when a later webhook changed the pod.
    #[serde(default)]
    pub reinvocation_policy: ReinvocationPolicy,

    /// Break-glass: true removes this policy's webhook configuration until set back to false.
    #[serde(default)]
    pub paused: bool,

    /// Allows injected content that Pod Security `baseline` forbids: privileged containers,
    /// capabilities beyond baseline's list, host ports, hostPath volumes, `Unconfined` seccomp or
    /// AppArmor profiles, custom SELinux options, an unmasked /proc, Windows HostProcess. Without
    /// it such a policy is refused: at apply by Splice's validating webhook, and by the reconcile
    /// in any case. `status.podSecurity` says which level the injected content satisfies.
    #[serde(default)]
    pub allow_privileged: bool,

    /// How the policy is put in force. `Auto` (the default) runs it inside the API server as a
    /// MutatingAdmissionPolicy when every template expression has a CEL equivalent with the same
    /// result, and through Splice's webhook otherwise (status.mode says which, and the
    /// `InTree` condition names the expression that kept the webhook). `InTree` requires the
    /// in-tree form (a policy that cannot have it is refused at apply); `Webhook` always uses the
    /// webhook.
    #[serde(default)]
    pub mode: Mode,

    /// Values that templates read as `values.<key>`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_VALUES))]
    pub values: BTreeMap<String, String>,

    /// Values read from ConfigMaps and Secrets, merged into `values` in list order after
    /// `spec.values` (a later entry replaces an earlier key). Every replica watches the objects
    /// and re-renders when they change. A Secret-fed value may only be read through the
    /// `sha256` filter, so it never appears in the pod spec.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_VALUES_FROM))]
    pub values_from: Vec<ValuesFromSource>,

    /// What is injected.
    #[serde(default)]
    pub template: InjectionTemplate,

    /// Opt-in: restart the Deployments, StatefulSets and DaemonSets whose pods carry an outdated
    /// injection of this policy (or miss it, with `repairMissed`), under a budget. Absent:
    /// nothing is restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,

    /// Give each selected pod its own certificate: the kubelet generates the key and asks
    /// Splice's signer `splice.dev/identity` for a certificate naming the pod's SPIFFE ID
    /// (`spiffe://<trust domain>/ns/<namespace>/sa/<service account>`), through a
    /// `podCertificate` projected volume Splice injects. Needs Pod Certificates (KEP-4317) on
    /// the API server and the kubelets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Identity>,

    /// Values a workload may set through an annotation on its pod or its namespace, read in
    /// templates as `overrides.<name>`: the pod's annotation wins over the namespace's, which
    /// wins over `default`. Each value is checked against its type and rule; a pod whose
    /// annotation fails is refused at admission, whatever the failure policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_OVERRIDES))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[x_kube(validation = Rule::new("self.all(o, self.exists_one(p, p.annotation == o.annotation))")
        .message("each override must read a different annotation"))]
    pub overrides: Vec<Override>,
}

/// One value a workload may set: `spec.overrides[]`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Override {
    /// The name templates read it by: `{{ overrides.<name> }}`.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z_][A-Za-z0-9_]*$')")
        .message("must be letters, digits and '_', not starting with a digit"))]
    pub name: String,
    /// The annotation key, a label-style key (`mesh.example/proxy-cpu`), read on the pod and
    /// its namespace as `from` allows.
    #[schemars(length(min = 1, max = 317))]
    pub annotation: String,
    /// How the value is read and what `self` is in `rule`: `string`, `integer` (a 64-bit
    /// integer), `boolean` (`true` or `false`), or `quantity` (a Kubernetes quantity such as
    /// `100m`; `self` is its text, so rules write `quantity(self)`).
    #[serde(rename = "type")]
    pub type_: OverrideType,
    /// The value when neither the pod nor the namespace sets it. It must have the type and
    /// pass the rule.
    #[schemars(length(max = MAX_OVERRIDE_VALUE_BYTES))]
    pub default: String,
    /// A CEL expression over `self`, the typed value, that must be true for the value to be
    /// used (`quantity(self).isLessThan(quantity('1'))`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_OVERRIDE_RULE_LEN))]
    pub rule: Option<String>,
    /// What a refusal says when the rule is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub message: Option<String>,
    /// Where a value may come from: `Pod`, `Namespace`, or both (the default).
    #[serde(default = "OverrideSource::both")]
    #[schemars(length(min = 1, max = 2))]
    #[x_kube(validation = Rule::new("self.all(s, self.exists_one(t, t == s))")
        .message("each source may be listed once"))]
    pub from: Vec<OverrideSource>,
    /// Allows the value to reach a field Pod Security judges (anything under `securityContext`,
    /// `hostPath` or `hostPort`). Only with a `rule` that bounds the value to an enumerated set
    /// (`self in ['a', 'b']`, alone or first in a conjunction): Pod Security judges the injected
    /// content with each of those values, and the worst one counts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub privileged: bool,
}

/// The type of an override's value.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum OverrideType {
    String,
    Integer,
    Boolean,
    Quantity,
}

impl OverrideType {
    pub fn as_str(self) -> &'static str {
        match self {
            OverrideType::String => "string",
            OverrideType::Integer => "integer",
            OverrideType::Boolean => "boolean",
            OverrideType::Quantity => "quantity",
        }
    }
}

/// Where an override's value may be read.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OverrideSource {
    Pod,
    Namespace,
}

impl OverrideSource {
    pub fn both() -> Vec<OverrideSource> {
        vec![OverrideSource::Pod, OverrideSource::Namespace]
    }
}

/// The signer that `spec.identity` volumes name; Splice signs for it and nothing else.
pub const IDENTITY_SIGNER: &str = "splice.dev/identity";
/// The name of the projected volume `spec.identity` injects.
pub const IDENTITY_VOLUME: &str = "splice-identity";
/// The name of the projected volume `spec.identity.trustBundlePath` injects.
pub const IDENTITY_TRUST_VOLUME: &str = "splice-identity-trust";
/// Shortest and longest certificate lifetime a policy may ask for (1 h, 91 days): the bounds
/// the API server puts on `maxExpirationSeconds`.
pub const MIN_IDENTITY_EXPIRATION_SECONDS: i32 = 3600;
pub const MAX_IDENTITY_EXPIRATION_SECONDS: i32 = 91 * 86400;

/// `spec.identity`: where the pod's certificate is mounted, for which containers, and its key.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    /// Where the credential bundle (`credentialbundle.pem`: the private key, then the
    /// certificate chain, leaf first) is mounted, read-only.
    #[schemars(length(min = 2, max = 256))]
    #[x_kube(validation = Rule::new("self.startsWith('/') && !self.contains(':') && !self.split('/').exists(p, p == '..')")
        .message("must be an absolute path without ':' or '..'"))]
    pub mount_path: String,

    /// The injected containers (and init containers) that mount it, by name. Empty: every
    /// container the template injects.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_INJECTED_CONTAINERS))]
    pub containers: Vec<String>,

    /// The key the kubelet generates.
    #[serde(default)]
    pub key_type: IdentityKeyType,

    /// The longest certificate lifetime asked for; the signer may issue shorter ones.
    #[serde(default = "default_identity_expiration")]
    #[schemars(range(min = MIN_IDENTITY_EXPIRATION_SECONDS, max = MAX_IDENTITY_EXPIRATION_SECONDS))]
    pub max_expiration_seconds: i32,

    /// Where the signer's trust bundle (`ca.pem`, from the ClusterTrustBundle Splice publishes)
    /// is mounted in the same containers, so they can check their peers. Absent: not mounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 256))]
    #[x_kube(validation = Rule::new("self.startsWith('/') && !self.contains(':') && !self.split('/').exists(p, p == '..')")
        .message("must be an absolute path without ':' or '..'"))]
    pub trust_bundle_path: Option<String>,
}

fn default_identity_expiration() -> i32 {
    86400
}

/// `spec.identity.keyType`: the key types the kubelet can generate for a `podCertificate`
/// volume.
#[derive(
    JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
)]
pub enum IdentityKeyType {
    #[serde(rename = "RSA3072")]
    #[strum(serialize = "RSA3072")]
    Rsa3072,
    #[serde(rename = "RSA4096")]
    #[strum(serialize = "RSA4096")]
    Rsa4096,
    #[default]
    #[serde(rename = "ECDSAP256")]
    #[strum(serialize = "ECDSAP256")]
    EcdsaP256,
    #[serde(rename = "ECDSAP384")]
    #[strum(serialize = "ECDSAP384")]
    EcdsaP384,
    #[serde(rename = "ECDSAP521")]
    #[strum(serialize = "ECDSAP521")]
    EcdsaP521,
    #[serde(rename = "ED25519")]
    #[strum(serialize = "ED25519")]
    Ed25519,
}

/// Longest `spec.rollout.timeout` accepted (24 h), so a typo cannot park a rollout for weeks.
pub const MAX_ROLLOUT_TIMEOUT_SECONDS: u64 = 24 * 3600;

/// How template changes reach running pods: which workloads restart, how many at once, and when
/// the rollout halts.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// This policy's workloads restarting at once.
    #[serde(default = "default_one")]
    #[schemars(range(min = 1, max = 100))]
    pub max_concurrent: i32,

    /// This policy's workloads restarting at once in one namespace.
    #[serde(default = "default_one")]
    #[schemars(range(min = 1, max = 100))]
    pub max_concurrent_per_namespace: i32,

    /// How long a restarted workload may take to be fully available on its new pods (a
    /// duration such as `45s`, `5m`, `1h30m`; at least 1s, at most 24h). A workload that takes
    /// longer halts the policy's rollout.
    #[serde(default = "default_rollout_timeout")]
    #[schemars(length(min = 2, max = 24))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]{1,5}h)?([0-9]{1,5}m)?([0-9]{1,5}s)?$')")
        .message("must be a duration of h, m and s units in that order, e.g. 45s, 5m, 1h30m"))]
    pub timeout: String,

    /// Also restart workloads with pods the policy missed (admitted without its injection, e.g.
    /// while the webhook was unreachable under `Ignore`).
    #[serde(default)]
    pub repair_missed: bool,

    /// A pinned canary: when the template changes, only pods these selectors match are admitted
    /// with the new revision, and only their workloads restart; every other pod keeps the
    /// promoted revision until the canary workloads are healthy (or `kubectl splice rollout
    /// promote`). The API server decides the split: the canary is one webhook entry, the rest
    /// one entry per requirement, each negating it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<Canary>,

    /// How a running pod gets the change: `Auto` updates it in place where Kubernetes allows the
    /// change on a running pod (an injected container's image, CPU or memory, Splice's labels
    /// and annotations) and restarts its workload otherwise; `InPlace` never restarts a workload
    /// and counts the pods it cannot change in place; `Restart` always restarts.
    #[serde(default)]
    pub strategy: RolloutStrategy,
}

/// `spec.rollout.strategy`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RolloutStrategy {
    #[default]
    Auto,
    InPlace,
    Restart,
}

impl Default for Rollout {
    fn default() -> Self {
        Rollout {
            max_concurrent: 1,
            max_concurrent_per_namespace: 1,
            timeout: default_rollout_timeout(),
            repair_missed: false,
            canary: None,
            strategy: RolloutStrategy::Auto,
        }
    }
}

impl Rollout {
    /// `timeout` as a duration; `None` when it does not parse or is out of bounds (the schema
    /// refuses such a value at apply).
    pub fn timeout(&self) -> Option<std::time::Duration> {
        parse_duration(&self.timeout)
            .filter(|d| d.as_secs() >= 1 && d.as_secs() <= MAX_ROLLOUT_TIMEOUT_SECONDS)
    }
}

/// Parses `1h2m3s`-style durations (each unit at most once, in that order, at least one).
pub fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let mut rest = text;
    let mut total: u64 = 0;
    let mut any = false;
    for (unit, seconds) in [('h', 3600u64), ('m', 60), ('s', 1)] {
        if let Some(i) = rest.find(unit) {
            let n: u64 = rest.get(..i)?.parse().ok()?;
            total = total.checked_add(n.checked_mul(seconds)?)?;
            rest = rest.get(i + 1..)?;
            any = true;
        }
    }
    (any && rest.is_empty()).then(|| std::time::Duration::from_secs(total))
}

/// Most requirements a canary may have (matchLabels entries and matchExpressions, both
/// selectors): each is one more webhook entry for the pods outside the canary.
pub const MAX_CANARY_REQUIREMENTS: usize = 8;

/// The canary's selectors, ANDed with the policy's own.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.namespaceSelector) && has(self.namespaceSelector.matchLabels) ? size(self.namespaceSelector.matchLabels) : 0) + \
    (has(self.namespaceSelector) && has(self.namespaceSelector.matchExpressions) ? size(self.namespaceSelector.matchExpressions) : 0) + \
    (has(self.objectSelector) && has(self.objectSelector.matchLabels) ? size(self.objectSelector.matchLabels) : 0) + \
    (has(self.objectSelector) && has(self.objectSelector.matchExpressions) ? size(self.objectSelector.matchExpressions) : 0) >= 1")
    .message("an empty canary selects every pod, so no pod would keep the promoted revision: give it at least one label or expression"))]
#[x_kube(validation = Rule::new("(has(self.namespaceSelector) && has(self.namespaceSelector.matchLabels) ? size(self.namespaceSelector.matchLabels) : 0) + \
    (has(self.namespaceSelector) && has(self.namespaceSelector.matchExpressions) ? size(self.namespaceSelector.matchExpressions) : 0) + \
    (has(self.objectSelector) && has(self.objectSelector.matchLabels) ? size(self.objectSelector.matchLabels) : 0) + \
    (has(self.objectSelector) && has(self.objectSelector.matchExpressions) ? size(self.objectSelector.matchExpressions) : 0) <= 8")
    .message("at most 8 requirements in all: each one is another webhook entry for the pods outside the canary"))]
pub struct Canary {
    /// Namespaces of the canary (labels as the API server sees them at admission).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn'] ? has(e.values) && size(e.values) > 0 : (e.operator in ['Exists', 'DoesNotExist'] && (!has(e.values) || size(e.values) == 0)))")
        .message("each expression's operator is In or NotIn with values, or Exists or DoesNotExist without"))]
    pub namespace_selector: Option<LabelSelector>,
    /// Pods of the canary, by their own labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn'] ? has(e.values) && size(e.values) > 0 : (e.operator in ['Exists', 'DoesNotExist'] && (!has(e.values) || size(e.values) == 0)))")
        .message("each expression's operator is In or NotIn with values, or Exists or DoesNotExist without"))]
    pub object_selector: Option<LabelSelector>,
}

fn default_one() -> i32 {
    1
}

fn default_rollout_timeout() -> String {
    "5m".to_owned()
}

/// A policy annotation (any value; `kubectl splice rollout halt` writes the time) that halts its
/// rollout: nothing more is restarted while it is there.
pub const ROLLOUT_HALT_ANNOTATION: &str = "splice.dev/rollout-halt";
/// A policy annotation naming the canary's template hash (`kubectl splice rollout promote`
/// writes it): that canary is promoted at once, healthy or not.
pub const ROLLOUT_PROMOTE_ANNOTATION: &str = "splice.dev/rollout-promote";
/// A policy annotation, `<revision>@<RFC 3339 time>` (`kubectl splice rollout resume` writes
/// it), that lifts a halt of that revision recorded before that time: workloads that failed
/// before it no longer halt the rollout.
pub const ROLLOUT_RESUME_ANNOTATION: &str = "splice.dev/rollout-resume";

/// The pod-template annotation a restart sets to its time (RFC 3339), like `kubectl rollout
/// restart`'s `kubectl.kubernetes.io/restartedAt`.
pub const RESTARTED_AT_ANNOTATION: &str = "splice.dev/restartedAt";
/// The pod-template annotation naming what a restart was for: `<policy>@<revision>`.
pub const RESTARTED_FOR_ANNOTATION: &str = "splice.dev/restartedFor";

/// The content a policy injects. String values may hold `{{ … }}` expressions over `pod`,
/// `namespace`, `policy` and `values`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.initContainers) || !has(self.containers) || \
    !self.initContainers.exists(i, self.containers.exists(c, c.name == i.name))")
    .message("an injected init container and an injected container must not share a name"))]
pub struct InjectionTemplate {
    /// Inserted before the pod's own init containers. Native sidecars are init containers with
    /// `restartPolicy: Always`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_INJECTED_CONTAINERS))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub init_containers: Vec<Container>,

    /// Appended after the pod's own containers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_INJECTED_CONTAINERS))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub containers: Vec<Container>,

    /// Added to the pod's volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_INJECTED_VOLUMES))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub volumes: Vec<Volume>,

    /// Added to every application container (never to injected ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_INJECTED_ENV))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub env: Vec<EnvVar>,

    /// Added to every application container (never to injected ones).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_INJECTED_MOUNTS))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["mountPath"]))]
    pub volume_mounts: Vec<VolumeMount>,

    /// Pod labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_VALUES))]
    pub labels: BTreeMap<String, String>,

    /// Pod annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_VALUES))]
    pub annotations: BTreeMap<String, String>,
}

/// One source of `values`: exactly one of `configMapKeyRef`, `secretKeyRef`, `configMapRef`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.configMapKeyRef) ? 1 : 0) + (has(self.secretKeyRef) ? 1 : 0) + (has(self.configMapRef) ? 1 : 0) == 1")
    .message("exactly one of configMapKeyRef, secretKeyRef, configMapRef must be set"))]
#[x_kube(validation = Rule::new("has(self.configMapRef) || has(self.name)")
    .message("name (the values key) is required with configMapKeyRef and secretKeyRef"))]
#[x_kube(validation = Rule::new("!has(self.configMapRef) || !has(self.name)")
    .message("name is not allowed with configMapRef (every key is read; use prefix)"))]
#[x_kube(validation = Rule::new("!has(self.prefix) || has(self.configMapRef)")
    .message("prefix is only allowed with configMapRef"))]
pub struct ValuesFromSource {
    /// The key templates read as `values.<name>` (configMapKeyRef and secretKeyRef).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub name: Option<String>,
    /// One key of a ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<ValuesKeyRef>,
    /// One key of a Secret; readable only as `{{ values.<name> | sha256 }}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<ValuesKeyRef>,
    /// Every key of a ConfigMap, read as `values.<prefix><key>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ValuesObjectRef>,
    /// Prepended to every key of `configMapRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub prefix: Option<String>,
}

/// A key of a ConfigMap or Secret.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ValuesKeyRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
    /// Defaults to Splice's own namespace; must be one of `splice run --values-namespaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
    /// When true, an absent object or key leaves the value out (a template's `default` applies).
    #[serde(default)]
    pub optional: bool,
}

/// A whole ConfigMap.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ValuesObjectRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Defaults to Splice's own namespace; must be one of `splice run --values-namespaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
    /// When true, an absent object contributes no values.
    #[serde(default)]
    pub optional: bool,
}

#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
pub enum Operation {
    #[serde(rename = "CREATE")]
    Create,
    #[serde(rename = "UPDATE")]
    Update,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
        }
    }
}

/// How a policy is put in force: requested in `spec.mode`, in force in `status.mode`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    #[default]
    Auto,
    Webhook,
    InTree,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Auto => "Auto",
            Mode::Webhook => "Webhook",
            Mode::InTree => "InTree",
        }
    }
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FailurePolicy {
    #[default]
    Ignore,
    Fail,
}

impl FailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Ignore => "Ignore",
            FailurePolicy::Fail => "Fail",
        }
    }
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ReinvocationPolicy {
    #[default]
    IfNeeded,
    Never,
}

impl ReinvocationPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ReinvocationPolicy::IfNeeded => "IfNeeded",
            ReinvocationPolicy::Never => "Never",
        }
    }
}

/// An object whose fields the API server keeps as they are (a copy of a spec the schema above
/// already validated when it was applied).
fn opaque_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

fn default_operations() -> Vec<Operation> {
    vec![Operation::Create]
}

fn default_timeout_seconds() -> i32 {
    3
}

/// What the operator last observed and did for a policy.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InjectionPolicyStatus {
    /// The generation the status below describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Ready, WebhookConfigured, FailClosed, Conflicted and Verified.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The mode in force: `Webhook` (Splice's webhook serves the policy) or `InTree` (a
    /// MutatingAdmissionPolicy and its binding, both named `splice-<policy>`, do).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,

    /// Name of the MutatingWebhookConfiguration that serves this policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_configuration: Option<String>,

    /// The failure policy actually written into the webhook configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_failure_policy: Option<FailurePolicy>,

    /// Hash of the template and values the webhook injects, as recorded in `splice.dev/status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,

    /// The generation in force: the last one that compiled. It trails `metadata.generation` while
    /// the current spec is invalid (Ready=False says why); the webhook keeps serving this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_generation: Option<i64>,

    /// The spec of `servingGeneration`, kept so that a replica that starts while the current spec
    /// is invalid still serves the last good one. Splice writes it; nothing else should.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "opaque_object")]
    pub serving_spec: Option<serde_json::Value>,

    /// When the certificate chain the API server verifies to call this webhook expires (RFC
    /// 3339): the serving certificate's NotAfter, which never passes its CA's. Splice renews it
    /// long before; a date in the past means renewal is stuck.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_not_after: Option<String>,

    /// The strictest Pod Security Standards level the injected content satisfies on its own
    /// (containers, init containers, volumes and the annotations it sets): pods injected by this
    /// policy can only be admitted in namespaces that enforce this level or a laxer one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security: Option<PodSecurityLevel>,

    /// What the policy does that its author may not mean, one sentence each naming the field: a
    /// template reading a pod field absent at admission, privileged content the pod controls.
    /// The validating webhook returns the same warnings at apply time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub warnings: Vec<String>,

    /// What shows that the API server enforces the generation Ready reports: a server-side
    /// dry-run pod that came back with this generation's injection, or, where no pod can be
    /// probed, the measured time the API server takes to load a new configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforcement: Option<EnforcementStatus>,

    /// Pods this policy selects, from the operator's pod watch (written by field manager
    /// `splice-coverage`, at most once per pass and only when a count changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<Coverage>,

    /// What the admission probe last found: a server-side dry-run create of a probe pod in the
    /// namespaces this policy selects (written by field manager `splice-probe`, only when the
    /// result changes; the Verified condition says the same in words).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeStatus>,

    /// The rollout of the current revision to running workloads, when `spec.rollout` is set
    /// (written by field manager `splice-rollout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
}

/// Where the rollout of one revision stands. Counts are workloads (Deployments, StatefulSets,
/// DaemonSets), except `manual`, which counts pods.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The template hash being rolled out.
    pub revision: String,
    pub phase: RolloutPhase,
    /// Workloads with outdated (or, with repairMissed, missed) pods not restarted yet.
    pub outdated: i64,
    /// Restarted for this revision and not fully available yet, within the timeout.
    pub restarting: i64,
    /// Restarted for this revision and fully available.
    pub done: i64,
    /// Restarted for this revision and not fully available within the timeout.
    pub failed: i64,
    /// Outdated or missed pods no workload restart can replace (bare pods, Job pods): recreate
    /// them by hand.
    pub manual: i64,
    /// What halted the rollout: a workload, `<kind>/<namespace>/<name>`, or a halt request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted_by: Option<String>,
    /// When it halted (RFC 3339); a resume requested later lifts the halt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted_at: Option<String>,
    /// The promoted revision: what pods outside the canary get while a canary is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable: Option<StableRevision>,
    /// The template hash the canary gets, while a canary is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_revision: Option<String>,
    /// Pods updated in place for this revision whose proof is not in yet (the kubelet has not
    /// acted, or the changed container is not running the new image and Ready), within the
    /// timeout.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub updating: i64,
    /// Pods updated in place for this revision and proven: same UID, the new image running and
    /// Ready, no other container restarted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub updated_in_place: i64,
    /// Under `strategy: InPlace`, outdated pods whose change needs a restart, which this
    /// strategy never does: restart their workloads by hand, or use `Auto`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_in_place: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// The promoted revision of a policy with `spec.rollout`: the spec it was rendered from, kept so
/// that every replica serves it to pods outside an open canary. `valuesFrom` data is read live
/// by both revisions.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StableRevision {
    /// Its template hash (what `splice.dev/status` records in a pod).
    pub template_hash: String,
    pub generation: i64,
    /// The spec, as written when it was promoted.
    #[schemars(schema_with = "opaque_object")]
    pub spec: serde_json::Value,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RolloutPhase {
    /// Nothing to restart.
    #[default]
    Idle,
    /// A canary is open: only canary workloads restart; the rest wait for the promotion.
    Canary,
    /// Workloads are restarting or wait for the budget.
    Rolling,
    /// Every workload that needed it was restarted and is fully available.
    Complete,
    /// A restarted workload did not become available within the timeout; nothing more is
    /// restarted until the template changes.
    Halted,
}

impl RolloutPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutPhase::Idle => "Idle",
            RolloutPhase::Canary => "Canary",
            RolloutPhase::Rolling => "Rolling",
            RolloutPhase::Complete => "Complete",
            RolloutPhase::Halted => "Halted",
        }
    }
}

/// The evidence that the API server enforces a generation (see `status.enforcement`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EnforcementStatus {
    /// The generation the evidence is for; Ready's `observedGeneration` is this one.
    pub observed_generation: i64,
    /// `Probe`: a dry-run pod in `namespace` came back with the injection of `revision`.
    /// `SettleTime`: nothing could be probed (`detail` says why), so Ready waited for the
    /// measured time the API server takes to load a new configuration.
    pub evidence: String,
    /// The namespace of the dry-run pod, for `Probe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The revision (template hash, and `valuesFrom` digests) the dry-run pod carried, for
    /// `Probe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Why no pod could be probed, for `SettleTime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// When the evidence was seen (RFC 3339): the generation is enforced from then on.
    pub since: String,
}

/// The admission probe's result for one policy. Rewritten only when the result, the namespaces
/// or the generation change, so the figures are those of the probe that found this result;
/// `splice_probe_duration_seconds` and `splice_probe_total` follow every probe.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ProbeStatus {
    /// The Verified condition's reason: Verified, NotInjected, RejectedByAdmission,
    /// SlowAdmission, ProbeRefused, ProbeFailed, NoNamespaceSelected or NoProbePod.
    pub result: String,
    /// The namespaces probed (one per distinct Pod Security enforce level among those the policy
    /// selects, plus those named in a problem before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// The namespaces where the probe found the problem `result` names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub affected_namespaces: Vec<String>,
    /// When the probe that found this result ran (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_time: Option<String>,
    /// Latency over the recent probes of this policy, when any was admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<ProbeLatency>,
}

/// Probe latency figures, in milliseconds, over the recent window of one policy's probes.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ProbeLatency {
    /// p99 of the dry-run create's round trip through the API server.
    pub round_trip_p99_ms: i64,
    /// p99 of the share attributable to the webhooks: the injected probe's round trip minus the
    /// opted-out baseline's, in the same namespace.
    pub webhook_p99_ms: i64,
    /// Probes in the window.
    pub samples: i64,
}

/// A Pod Security Standards level, as the `pod-security.kubernetes.io/enforce` namespace label
/// names it. Ordered from the laxest to the strictest.
#[derive(
    JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
#[serde(rename_all = "lowercase")]
pub enum PodSecurityLevel {
    Privileged,
    Baseline,
    Restricted,
}

impl PodSecurityLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            PodSecurityLevel::Privileged => "privileged",
            PodSecurityLevel::Baseline => "baseline",
            PodSecurityLevel::Restricted => "restricted",
        }
    }
}

impl std::fmt::Display for PodSecurityLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Pod counts for one policy. `matched` counts pods the policy selects that carry its injection
/// (from any template) plus those created after its webhook configuration was in force that do
/// not (`missed`): a pod that existed before the policy is not expected to carry it, since pods
/// are only injected when created.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Coverage {
    /// Pods the policy selects that carry its injection or should (the sum of the three below).
    pub matched: i64,
    /// Injected with the policy's current template.
    pub current: i64,
    /// Injected with an earlier template (recreate them to update).
    pub outdated: i64,
    /// Matched but not injected (e.g. admitted while the webhook was unreachable, failing open).
    pub missed: i64,
}

/// Condition types.
pub mod condition {
    pub const READY: &str = "Ready";
    pub const WEBHOOK_CONFIGURED: &str = "WebhookConfigured";
    pub const FAIL_CLOSED: &str = "FailClosed";
    pub const CONFLICTED: &str = "Conflicted";
    /// Whether the policy runs in-tree, and when not, the expression that keeps the webhook.
    pub const IN_TREE: &str = "InTree";
    /// Set by the admission probe (field manager `splice-probe`), never by the reconciler.
    pub const VERIFIED: &str = "Verified";
    /// Set by the rollout (field manager `splice-rollout`) when `spec.rollout` is set.
    pub const ROLLED_OUT: &str = "RolledOut";
    /// Set by coverage (field manager `splice-coverage`) when `spec.overrides` is set: False
    /// names the namespaces whose annotation an override refuses (their pods get the default).
    pub const OVERRIDES_ACCEPTED: &str = "OverridesAccepted";
}
