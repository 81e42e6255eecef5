//! The rollout's pod I/O for in-place updates: read a pod in full, sort its change with the
//! engine (`splice_engine::change`), write the one update or the resize, and read the proof.
//! What to write is decided by the pure parts ([`super::inplace`], [`super::plan`]).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use splice_crds::Operation;
use splice_engine::change::{self, Change, Path};
use splice_engine::{CompiledPolicy, Exclusions, NamespaceContext, PodRequest, Selection};

use super::inplace;
use super::plan::{PodPath, PodRef};
use crate::status::ROLLOUT_MANAGER;

/// What can go wrong with one pod, each with a stable label for the logs.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum PodError {
    #[error("reading {pod}: {source}")]
    Read { pod: PodRef, source: kube::Error },
    #[error("sorting the change of {pod}: {message}")]
    Sort { pod: PodRef, message: String },
    #[error("updating {pod} in place: {source}")]
    Update { pod: PodRef, source: kube::Error },
    #[error("resizing {pod}: {source}")]
    Resize { pod: PodRef, source: kube::Error },
}

impl PodError {
    pub fn label(&self) -> &'static str {
        self.into()
    }

    /// The pod changed (or went) since it was read: decide again, never overwrite.
    pub fn stale(&self) -> bool {
        matches!(
            self,
            PodError::Update { source: kube::Error::Api(s), .. }
                | PodError::Resize { source: kube::Error::Api(s), .. }
                if s.code == 409 || s.code == 404
        ) && !self.resize_unserved()
    }
}

impl PodError {
    /// The API server does not serve `pods/resize` (a 404 that names no pod: the pod itself was
    /// just read).
    pub fn resize_unserved(&self) -> bool {
        matches!(
            self,
            PodError::Resize { source: kube::Error::Api(s), .. }
                if s.code == 404 && s.details.as_ref().is_none_or(|d| d.name.is_empty())
        )
    }
}

/// A pod's sorted path, as the planner and the reports use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sorted {
    /// The revision it was sorted for, and the version the pod carried then.
    pub revision: String,
    pub recorded: String,
    pub path: PodPath,
    /// The path's label and its reason, for Events and logs.
    pub why: String,
}

impl Sorted {
    /// A resize the API server cannot take: the pod's workload restarts instead.
    pub fn resize_unserved(revision: &str, recorded: &str) -> Self {
        Sorted {
            revision: revision.to_owned(),
            recorded: recorded.to_owned(),
            path: PodPath::Restart,
            why: format!("restart: {RESIZE_UNSERVED}"),
        }
    }

    pub fn of(revision: &str, recorded: &str, path: &Path) -> Self {
        Sorted {
            revision: revision.to_owned(),
            recorded: recorded.to_owned(),
            path: if path.in_place() {
                PodPath::InPlace
            } else {
                PodPath::Restart
            },
            why: path.to_string(),
        }
    }
}

/// Why a resize falls back to a restart on an API server without the subresource.
pub const RESIZE_UNSERVED: &str = "the API server does not serve pods/resize";

pub async fn read(client: &Client, pod: &PodRef) -> Result<Option<Pod>, PodError> {
    Api::<Pod>::namespaced(client.clone(), &pod.namespace)
        .get_opt(&pod.name)
        .await
        .map_err(|source| PodError::Read {
            pod: pod.clone(),
            source,
        })
}

/// The engine's sorting of `policy`'s change to the running `pod`: the one rule, shared with
/// `splice explain` and `kubectl splice rollout status`.
pub fn sort(
    policy: &CompiledPolicy,
    pod: &Pod,
    namespace: &NamespaceContext,
    exclusions: &Exclusions,
    trust_domain: &str,
) -> Result<Change, String> {
    let text = serde_json::to_string(pod).map_err(|e| e.to_string())?;
    let object = splice_engine::Pod::parse(&text).map_err(|e| e.to_string())?;
    let request = PodRequest {
        operation: Operation::Create,
        object: &object,
        namespace,
        exclusions,
        trust_domain,
        selection: Selection::Evaluate,
    };
    change::sort(policy, &request).map_err(|e| e.to_string())
}

/// Writes the in-place update `change` plans for `pod` (one strategic-merge patch under the
/// pod's `resourceVersion`), or its resize (`pods/resize`). Returns the path taken.
pub async fn write(
    client: &Client,
    id: &PodRef,
    pod: &Pod,
    change: &Change,
    policy: &str,
    revision: &str,
) -> Result<(), PodError> {
    let api = Api::<Pod>::namespaced(client.clone(), &id.namespace);
    let params = PatchParams {
        field_manager: Some(ROLLOUT_MANAGER.into()),
        ..PatchParams::default()
    };
    if let Path::Resize(resized) = &change.path {
        let mut patch =
            serde_json::json!({"metadata": {"resourceVersion": pod.metadata.resource_version}});
        for r in resized {
            let c = serde_json::json!({"name": r.container, "resources": r.resources});
            match patch["spec"][r.place.list()].as_array_mut() {
                Some(list) => list.push(c),
                None => patch["spec"][r.place.list()] = serde_json::json!([c]),
            }
        }
        return api
            .patch_subresource("resize", &id.name, &params, &Patch::Strategic(&patch))
            .await
            .map(drop)
            .map_err(|source| PodError::Resize {
                pod: id.clone(),
                source,
            });
    }
    let Some(patch) = inplace::update_patch(pod, change, policy, revision, Timestamp::now()) else {
        return Ok(());
    };
    api.patch(&id.name, &params, &Patch::Strategic(&patch))
        .await
        .map(drop)
        .map_err(|source| PodError::Update {
            pod: id.clone(),
            source,
        })
}

/// Where a resize stands on the pod: the kubelet's `PodResizePending`/`PodResizeInProgress`
/// conditions, and the allocated resources of each resized container against its spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resized {
    Done,
    Waiting(String),
    /// The kubelet cannot make it (`Infeasible`): the pod falls back to a restart.
    Infeasible(String),
}

pub fn resized(pod: &Pod) -> Resized {
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten();
    for c in conditions {
        if c.status != "True" {
            continue;
        }
        match (c.type_.as_str(), c.reason.as_deref()) {
            ("PodResizePending", Some("Infeasible")) => {
                return Resized::Infeasible(c.message.clone().unwrap_or_default());
            }
            ("PodResizePending" | "PodResizeInProgress", reason) => {
                return Resized::Waiting(format!("{} ({})", c.type_, reason.unwrap_or_default()));
            }
            _ => {}
        }
    }
    let spec = pod.spec.iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    });
    let statuses: Vec<_> = pod
        .status
        .iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        })
        .collect();
    for c in spec {
        let Some(want) = c.resources.as_ref() else {
            continue;
        };
        let got = statuses
            .iter()
            .find(|s| s.name == c.name)
            .and_then(|s| s.resources.as_ref());
        // Each CPU or memory the spec sets must be what the kubelet reports allocated.
        let pairs = [
            (
                want.requests.as_ref(),
                got.and_then(|g| g.requests.as_ref()),
            ),
            (want.limits.as_ref(), got.and_then(|g| g.limits.as_ref())),
        ];
        for (want, got) in pairs {
            for (k, v) in want.into_iter().flatten() {
                if (k == "cpu" || k == "memory") && got.and_then(|g| g.get(k)) != Some(v) {
                    return Resized::Waiting(format!("container {} is not resized yet", c.name));
                }
            }
        }
    }
    let observed = pod.status.as_ref().and_then(|s| s.observed_generation);
    if observed < pod.metadata.generation {
        return Resized::Waiting("the kubelet has not acted on the resize yet".into());
    }
    Resized::Done
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn resize_failed(status: serde_json::Value) -> PodError {
        PodError::Resize {
            pod: PodRef {
                namespace: "shop".into(),
                name: "p".into(),
            },
            source: kube::Error::Api(Box::new(serde_json::from_value(status).unwrap())),
        }
    }

    #[test]
    fn a_404_naming_no_pod_means_the_api_server_lacks_pods_resize_one_naming_it_a_pod_gone() {
        let unserved = resize_failed(json!({"code": 404, "reason": "NotFound",
            "message": "the server could not find the requested resource"}));
        assert!(unserved.resize_unserved() && !unserved.stale());
        let gone = resize_failed(json!({"code": 404, "reason": "NotFound",
            "message": "pods \"p\" not found", "details": {"name": "p", "kind": "pods"}}));
        assert!(!gone.resize_unserved() && gone.stale());
        let conflict = resize_failed(json!({"code": 409, "reason": "Conflict"}));
        assert!(!conflict.resize_unserved() && conflict.stale());
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "generation": 2},
            "spec": {
                "initContainers": [{"name": "proxy", "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "20m"}}}],
                "containers": [{"name": "app", "resources": {}}],
            },
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_resize_is_done_once_the_kubelet_allocated_what_the_spec_sets() {
        let allocated = |cpu: &str| {
            json!({
                "observedGeneration": 2,
                "initContainerStatuses": [{"name": "proxy", "image": "", "imageID": "",
                    "ready": true, "restartCount": 0, "resources": {"requests": {"cpu": cpu}}}],
                "containerStatuses": [{"name": "app", "image": "", "imageID": "",
                    "ready": true, "restartCount": 0}],
            })
        };
        assert_eq!(resized(&pod(allocated("20m"))), Resized::Done);
        assert!(
            matches!(resized(&pod(allocated("10m"))), Resized::Waiting(w) if w.contains("proxy"))
        );
        let mut behind = allocated("20m");
        behind["observedGeneration"] = 1.into();
        assert!(matches!(resized(&pod(behind)), Resized::Waiting(_)));
    }

    #[test]
    fn an_infeasible_resize_is_told_apart_from_a_pending_one() {
        let condition = |reason: &str| {
            json!({"conditions": [{"type": "PodResizePending", "status": "True",
                "reason": reason, "message": "Node didn't have enough capacity"}]})
        };
        assert_eq!(
            resized(&pod(condition("Infeasible"))),
            Resized::Infeasible("Node didn't have enough capacity".into())
        );
        assert!(matches!(
            resized(&pod(condition("Deferred"))),
            Resized::Waiting(_)
        ));
    }
}
