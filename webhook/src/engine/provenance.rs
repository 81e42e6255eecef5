//! The `splice.dev/status` annotation: per policy, the template hash and what it injected, so a
//! later call can tell its own items from the author's and remove them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What one policy recorded on a pod. Lists are in injection order; `env` and `volumeMounts` are
/// keyed by the application container that received them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvenanceEntry {
    pub hash: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
    /// Container name → names of the env vars added to it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, Vec<String>>,
    /// Container name → mount paths added to it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub volume_mounts: BTreeMap<String, Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotations: Vec<String>,
}

/// Every policy's entry in a pod's `splice.dev/status` annotation, by policy name.
pub type Provenance = BTreeMap<String, ProvenanceEntry>;
