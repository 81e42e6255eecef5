//! In-place updates, pure: the one write that brings a running pod to a revision
//! ([`update_patch`]), the marker it leaves ([`Marker`], annotation `splice.dev/in-place`), the
//! proof that the kubelet acted and nothing else restarted ([`proof`]), and the write that puts
//! the earlier images back ([`undo_patch`]). The engine decides the path
//! (`splice_engine::change::sort`); the rollout loop fetches, writes and reports.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use splice_crds::{IN_PLACE_ANNOTATION, STATUS_ANNOTATION};
use splice_engine::ProvenanceEntry;
use splice_engine::change::{Change, Path, Place};

/// What one policy's in-place update recorded on a pod, before the update.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    /// The revision the pod was updated to (`view::revision`).
    pub revision: String,
    /// When (RFC 3339): the timeout counts from here.
    pub at: String,
    /// The pod's UID and `metadata.generation` before the update: the kubelet has acted once
    /// `status.observedGeneration` passes it.
    pub uid: String,
    pub generation: i64,
    /// The changed containers: their image and image ID before.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub changed: BTreeMap<String, Before>,
    /// Every other container's `restartCount` before.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub restarts: BTreeMap<String, i32>,
    /// The policy's record before, which `rollout undo` puts back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<ProvenanceEntry>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Before {
    pub image: String,
    #[serde(default)]
    pub image_id: String,
    /// `initContainers` (a native sidecar) rather than `containers`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sidecar: bool,
}

impl Marker {
    pub fn at(&self) -> Option<Timestamp> {
        self.at.parse().ok()
    }
}

/// Every policy's marker on a pod, by policy name; none when absent or unreadable.
pub fn markers(annotations: Option<&BTreeMap<String, String>>) -> BTreeMap<String, Marker> {
    annotations
        .and_then(|a| a.get(IN_PLACE_ANNOTATION))
        .and_then(|raw| serde_json::from_str(raw).ok())
        .unwrap_or_default()
}

fn statuses(pod: &Pod) -> impl Iterator<Item = &ContainerStatus> {
    pod.status.iter().flat_map(|s| {
        s.container_statuses
            .iter()
            .flatten()
            .chain(s.init_container_statuses.iter().flatten())
    })
}

fn status_of<'a>(pod: &'a Pod, container: &str) -> Option<&'a ContainerStatus> {
    statuses(pod).find(|s| s.name == container)
}

/// The strategic-merge patch of the one in-place write: the changed images, Splice's labels and
/// annotations as the new revision has them, the new record, and the marker. `None` for a path
/// that is not a pod update (a restart, a resize). The patch carries the pod's
/// `resourceVersion`, so a pod changed since it was read (deleted, its image edited by someone
/// else) refuses it with a conflict, and is decided again rather than overwritten.
pub fn update_patch(
    pod: &Pod,
    change: &Change,
    policy: &str,
    revision: &str,
    now: Timestamp,
) -> Option<Value> {
    let images = match &change.path {
        Path::Images(images) => images.as_slice(),
        Path::Record | Path::Metadata => &[],
        Path::Resize(_) | Path::Restart(_) => return None,
    };
    let meta = &pod.metadata;
    let mut marker = Marker {
        revision: revision.to_owned(),
        at: now.to_string(),
        uid: meta.uid.clone().unwrap_or_default(),
        generation: meta.generation.unwrap_or(0),
        record: change.before.clone(),
        ..Marker::default()
    };
    let (mut containers, mut init) = (Vec::new(), Vec::new());
    for i in images {
        let sidecar = i.place != Place::Container;
        marker.changed.insert(
            i.container.clone(),
            Before {
                image: i.from.clone(),
                image_id: status_of(pod, &i.container)
                    .map(|s| s.image_id.clone())
                    .unwrap_or_default(),
                sidecar,
            },
        );
        let c = json!({"name": i.container, "image": i.to});
        if sidecar {
            init.push(c)
        } else {
            containers.push(c)
        }
    }
    if !images.is_empty() {
        marker.restarts = statuses(pod)
            .filter(|s| !marker.changed.contains_key(&s.name))
            .map(|s| (s.name.clone(), s.restart_count))
            .collect();
    }
    let mut all = markers(meta.annotations.as_ref());
    all.insert(policy.to_owned(), marker);
    let new_meta = &change.object["metadata"];
    let mut annotations = map_diff(
        meta.annotations.as_ref(),
        new_meta["annotations"].as_object(),
    );
    annotations.insert(
        IN_PLACE_ANNOTATION.to_owned(),
        Value::String(serde_json::to_string(&all).ok()?),
    );
    let labels = map_diff(meta.labels.as_ref(), new_meta["labels"].as_object());
    let mut patch = json!({
        "metadata": {
            "resourceVersion": meta.resource_version,
            "annotations": annotations,
        },
    });
    if !labels.is_empty() {
        patch["metadata"]["labels"] = Value::Object(labels);
    }
    if !containers.is_empty() {
        patch["spec"]["containers"] = Value::Array(containers);
    }
    if !init.is_empty() {
        patch["spec"]["initContainers"] = Value::Array(init);
    }
    Some(patch)
}

/// What a merge patch must say to turn `old` into `new`: changed and added keys, removed ones
/// as null.
fn map_diff(
    old: Option<&BTreeMap<String, String>>,
    new: Option<&Map<String, Value>>,
) -> Map<String, Value> {
    let mut out = Map::new();
    let empty = BTreeMap::new();
    let old = old.unwrap_or(&empty);
    if let Some(new) = new {
        for (k, v) in new {
            if old.get(k).map(|o| Value::String(o.clone())).as_ref() != Some(v) {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    for k in old.keys() {
        if !new.is_some_and(|n| n.contains_key(k)) {
            out.insert(k.clone(), Value::Null);
        }
    }
    out
}

/// Where an in-place update stands on the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Proof {
    /// Same UID, the kubelet acted, every changed container runs its new image and is Ready
    /// (started, for a native sidecar without a readiness probe), no other container restarted.
    Done,
    /// Not yet, and why (the kubelet has not acted, a container is not Ready yet).
    Waiting(String),
    /// It cannot come any more: another container restarted, or the pod is not the one updated.
    Broken(String),
}

/// What `splice explain` and `kubectl splice rollout status` print for a proof.
impl std::fmt::Display for Proof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Proof::Done => write!(
                f,
                "proven (same UID, new image Ready, no other container restarted)"
            ),
            Proof::Waiting(why) => write!(f, "waiting: {why}"),
            Proof::Broken(why) => write!(f, "broken: {why}"),
        }
    }
}

/// The proof of `marker` on `pod`: see [`Proof`].
pub fn proof(pod: &Pod, marker: &Marker) -> Proof {
    if pod.metadata.uid.as_deref() != Some(marker.uid.as_str()) {
        return Proof::Broken("the pod is not the one updated (its UID changed)".into());
    }
    for (name, before) in &marker.restarts {
        let now = status_of(pod, name).map(|s| s.restart_count);
        if now.is_some_and(|n| n > *before) {
            return Proof::Broken(format!(
                "container {name} restarted during the update (restartCount {before} -> {})",
                now.unwrap_or_default()
            ));
        }
    }
    if marker.changed.is_empty() {
        return Proof::Done;
    }
    let observed = pod
        .status
        .as_ref()
        .and_then(|s| s.observed_generation)
        .unwrap_or(0);
    if observed <= marker.generation {
        return Proof::Waiting(format!(
            "the kubelet has not acted on the update yet (observedGeneration {observed})"
        ));
    }
    for (name, before) in &marker.changed {
        let Some(s) = status_of(pod, name) else {
            return Proof::Waiting(format!("container {name} has no status yet"));
        };
        if s.image_id.is_empty() || s.image_id == before.image_id {
            return Proof::Waiting(format!("container {name} does not run the new image yet"));
        }
        let probe = pod
            .spec
            .iter()
            .flat_map(|sp| sp.init_containers.iter().flatten())
            .find(|c| &c.name == name)
            .is_some_and(|c| c.readiness_probe.is_some());
        let ready = s.ready || (before.sidecar && !probe && s.started == Some(true));
        if !ready {
            return Proof::Waiting(format!(
                "container {name} runs the new image, not Ready yet"
            ));
        }
    }
    Proof::Done
}

/// The write `rollout undo` makes on a pod `policy` updated in place: the images before, the
/// record before, the marker gone; `resourceVersion` as the precondition. `None` when the pod
/// carries no marker of the policy.
pub fn undo_patch(pod: &Pod, policy: &str) -> Option<Value> {
    let meta = &pod.metadata;
    let mut all = markers(meta.annotations.as_ref());
    let marker = all.remove(policy)?;
    let mut status: BTreeMap<String, Value> = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(STATUS_ANNOTATION))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    match &marker.record {
        Some(before) => {
            status.insert(policy.to_owned(), serde_json::to_value(before).ok()?);
        }
        None => {
            status.remove(policy);
        }
    }
    let (mut containers, mut init) = (Vec::new(), Vec::new());
    for (name, before) in &marker.changed {
        let c = json!({"name": name, "image": before.image});
        if before.sidecar {
            init.push(c)
        } else {
            containers.push(c)
        }
    }
    let in_place = if all.is_empty() {
        Value::Null
    } else {
        Value::String(serde_json::to_string(&all).ok()?)
    };
    let mut patch = json!({
        "metadata": {
            "resourceVersion": meta.resource_version,
            "annotations": {
                STATUS_ANNOTATION: serde_json::to_string(&status).ok()?,
                IN_PLACE_ANNOTATION: in_place,
            },
        },
    });
    if !containers.is_empty() {
        patch["spec"]["containers"] = Value::Array(containers);
    }
    if !init.is_empty() {
        patch["spec"]["initContainers"] = Value::Array(init);
    }
    Some(patch)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use splice_engine::change::ImageChange;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "web-1", "namespace": "shop", "uid": "u1", "generation": 1,
                "resourceVersion": "42",
                "labels": {"app": "web"},
                "annotations": {STATUS_ANNOTATION: "{\"mesh\":{\"hash\":\"old\",\"initContainers\":[\"proxy\"]}}"},
            },
            "spec": {
                "initContainers": [{"name": "proxy", "image": "proxy:1", "restartPolicy": "Always"}],
                "containers": [{"name": "app", "image": "web:1"}],
            },
            "status": {
                "observedGeneration": 1,
                "initContainerStatuses": [{"name": "proxy", "image": "proxy:1", "imageID": "sha256:p1",
                    "ready": true, "started": true, "restartCount": 0}],
                "containerStatuses": [{"name": "app", "image": "web:1", "imageID": "sha256:w1",
                    "ready": true, "started": true, "restartCount": 2}],
            },
        }))
        .unwrap()
    }

    fn image_change() -> Change {
        let mut object = serde_json::to_value(pod()).unwrap();
        object["metadata"]["annotations"][STATUS_ANNOTATION] =
            "{\"mesh\":{\"hash\":\"new\",\"initContainers\":[\"proxy\"]}}".into();
        object["spec"]["initContainers"][0]["image"] = "proxy:2".into();
        Change {
            path: Path::Images(vec![ImageChange {
                container: "proxy".into(),
                place: Place::Sidecar,
                from: "proxy:1".into(),
                to: "proxy:2".into(),
            }]),
            object,
            before: Some(ProvenanceEntry {
                hash: "old".into(),
                init_containers: vec!["proxy".into()],
                ..Default::default()
            }),
            after: None,
        }
    }

    /// `pod` after the update and the kubelet's work, with `edit` applied to its status.
    fn updated(edit: impl FnOnce(&mut Value)) -> (Pod, Marker) {
        let patch = update_patch(
            &pod(),
            &image_change(),
            "mesh",
            "new",
            Timestamp::UNIX_EPOCH,
        )
        .unwrap();
        let marker: BTreeMap<String, Marker> = serde_json::from_str(
            patch["metadata"]["annotations"][IN_PLACE_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let mut v = serde_json::to_value(pod()).unwrap();
        v["metadata"]["generation"] = 2.into();
        v["spec"]["initContainers"][0]["image"] = "proxy:2".into();
        v["status"]["observedGeneration"] = 2.into();
        v["status"]["initContainerStatuses"][0]["imageID"] = "sha256:p2".into();
        v["status"]["initContainerStatuses"][0]["restartCount"] = 1.into();
        edit(&mut v);
        (serde_json::from_value(v).unwrap(), marker["mesh"].clone())
    }

    #[test]
    fn the_update_writes_the_image_the_record_and_the_marker_under_the_resource_version() {
        let patch = update_patch(
            &pod(),
            &image_change(),
            "mesh",
            "new",
            Timestamp::UNIX_EPOCH,
        )
        .unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert_eq!(
            patch["spec"]["initContainers"],
            json!([{"name": "proxy", "image": "proxy:2"}])
        );
        assert!(
            patch["spec"].get("containers").is_none(),
            "the app is not touched"
        );
        assert!(
            patch["metadata"]["annotations"][STATUS_ANNOTATION]
                .as_str()
                .unwrap()
                .contains("\"new\"")
        );
        let (_, marker) = updated(|_| {});
        assert_eq!(marker.changed["proxy"].image_id, "sha256:p1");
        assert_eq!(marker.restarts, BTreeMap::from([("app".to_owned(), 2)]));
        assert_eq!(marker.generation, 1);
        assert_eq!(marker.record.unwrap().hash, "old");
    }

    #[test]
    fn the_proof_holds_once_the_sidecar_runs_the_new_image_ready_and_the_app_never_restarted() {
        let (p, m) = updated(|_| {});
        assert_eq!(proof(&p, &m), Proof::Done);
    }

    #[test]
    fn the_proof_waits_for_the_kubelet_and_for_the_new_image() {
        let (p, m) = updated(|v| v["status"]["observedGeneration"] = 1.into());
        assert!(matches!(proof(&p, &m), Proof::Waiting(r) if r.contains("kubelet")));
        let (p, m) =
            updated(|v| v["status"]["initContainerStatuses"][0]["imageID"] = "sha256:p1".into());
        assert!(matches!(proof(&p, &m), Proof::Waiting(r) if r.contains("new image")));
        let (p, m) = updated(|v| v["status"]["initContainerStatuses"][0]["ready"] = false.into());
        assert_eq!(
            proof(&p, &m),
            Proof::Done,
            "a sidecar without a probe: started is enough"
        );
        let (p, m) = updated(|v| {
            v["status"]["initContainerStatuses"][0]["ready"] = false.into();
            v["spec"]["initContainers"][0]["readinessProbe"] = json!({"exec": {"command": ["x"]}});
        });
        assert!(matches!(proof(&p, &m), Proof::Waiting(r) if r.contains("not Ready")));
    }

    #[test]
    fn an_application_restart_or_another_uid_breaks_the_proof() {
        let (p, m) = updated(|v| v["status"]["containerStatuses"][0]["restartCount"] = 3.into());
        assert!(matches!(proof(&p, &m), Proof::Broken(r) if r.contains("container app restarted")));
        let (p, m) = updated(|v| v["metadata"]["uid"] = "u2".into());
        assert!(matches!(proof(&p, &m), Proof::Broken(_)));
    }

    #[test]
    fn undo_puts_the_earlier_image_and_record_back_and_drops_the_marker() {
        let (mut p, _) = updated(|_| {});
        let patch = update_patch(
            &pod(),
            &image_change(),
            "mesh",
            "new",
            Timestamp::UNIX_EPOCH,
        )
        .unwrap();
        let annotations = p.metadata.annotations.get_or_insert_default();
        for (k, v) in patch["metadata"]["annotations"].as_object().unwrap() {
            annotations.insert(k.clone(), v.as_str().unwrap().to_owned());
        }
        let undo = undo_patch(&p, "mesh").unwrap();
        assert_eq!(
            undo["spec"]["initContainers"],
            json!([{"name": "proxy", "image": "proxy:1"}])
        );
        assert_eq!(
            undo["metadata"]["annotations"][IN_PLACE_ANNOTATION],
            Value::Null
        );
        assert!(
            undo["metadata"]["annotations"][STATUS_ANNOTATION]
                .as_str()
                .unwrap()
                .contains("\"old\"")
        );
        assert_eq!(
            undo_patch(&pod(), "mesh"),
            None,
            "no marker, nothing to undo"
        );
    }
}
