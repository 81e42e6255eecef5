//! Which path a running pod's injection takes to a new revision ([`sort`]): the engine re-injects
//! the pod as it runs (its own items replaced by the new revision's, as on reinvocation), then
//! compares the result with the pod. Only what Kubernetes lets a running pod change qualifies
//! for an in-place path: images of containers and native sidecars (a pod update), CPU and memory
//! (`pods/resize`), labels and annotations. Everything else restarts the pod's workload.
//!
//! The comparison reads the injected items as the API server stored them: a key the template
//! left out and the API server defaulted (`imagePullPolicy`, a probe's `periodSeconds`, ...) is
//! not a change, and quantities compare by value (`0.5` is `500m`).

use std::collections::BTreeSet;

use serde_json::Value;
use splice_crds::STATUS_ANNOTATION;

use crate::provenance::ProvenanceEntry;
use crate::{CompiledPolicy, Decision, EngineError, PodRequest, SkipReason, inject_and_apply};

/// Keys the API server defaults inside containers, probes, ports and volumes: absent from a
/// rendered item, present on the stored one, they are not a change.
const DEFAULTED: &[&str] = &[
    "terminationMessagePath",
    "terminationMessagePolicy",
    "imagePullPolicy",
    "timeoutSeconds",
    "periodSeconds",
    "successThreshold",
    "failureThreshold",
    "scheme",
    "protocol",
    "apiVersion",
    "defaultMode",
];

/// How the change reaches a running pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Path {
    /// Only the record differs (the rendering is the same): one metadata write.
    Record,
    /// Only Splice's labels or annotations differ: one metadata write.
    Metadata,
    /// Only images of injected containers (and Splice's labels or annotations) differ: one pod
    /// update.
    Images(Vec<ImageChange>),
    /// Only CPU or memory of injected containers differs: `pods/resize`, then the record.
    Resize(Vec<ResourceChange>),
    /// The pod's workload must be restarted.
    Restart(Restart),
}

impl Path {
    /// Stable label for metrics, status and `explain`.
    pub fn label(&self) -> &'static str {
        match self {
            Path::Record | Path::Metadata => "metadata",
            Path::Images(_) => "image",
            Path::Resize(_) => "resize",
            Path::Restart(_) => "restart",
        }
    }

    /// Whether the pod can reach the revision without a restart.
    pub fn in_place(&self) -> bool {
        !matches!(self, Path::Restart(_))
    }
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Record => write!(f, "in place: only the record changes"),
            Path::Metadata => write!(f, "in place: only Splice's labels or annotations change"),
            Path::Images(images) => {
                let names: Vec<String> = images
                    .iter()
                    .map(|i| format!("{} {} -> {}", i.container, i.from, i.to))
                    .collect();
                write!(f, "in place: image of {}", names.join(", "))
            }
            Path::Resize(r) => {
                let names: Vec<&str> = r.iter().map(|r| r.container.as_str()).collect();
                write!(f, "in place: resize of {}", names.join(", "))
            }
            Path::Restart(r) => write!(f, "restart: {r}"),
        }
    }
}

/// Where an injected container sits in the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Place {
    /// `spec.containers`.
    Container,
    /// `spec.initContainers` with `restartPolicy: Always`.
    Sidecar,
    /// A regular init container: it has run, and would not run again in place.
    Init,
}

impl Place {
    /// The pod spec list that holds it.
    pub fn list(self) -> &'static str {
        match self {
            Place::Container => "containers",
            Place::Sidecar | Place::Init => "initContainers",
        }
    }
}

/// One injected container's image, before and after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageChange {
    pub container: String,
    pub place: Place,
    pub from: String,
    pub to: String,
}

/// One injected container's new `resources`.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceChange {
    pub container: String,
    pub place: Place,
    pub resources: Value,
}

/// Why a change needs a restart, with a stable label.
#[derive(Clone, Debug, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Restart {
    /// The policy would not inject the pod now (its selectors or the exclusions).
    NotSelected(SkipReason),
    /// A field Kubernetes does not change on a running pod: `spec...` path.
    Field(String),
    /// An image and CPU or memory change together (two writes no single proof covers).
    ImageAndResources,
    /// The image of a regular init container, which has run already.
    InitContainerImage(String),
    /// A resize that would change the pod's QoS class, which the API server refuses.
    QosClass {
        from: &'static str,
        to: &'static str,
    },
    /// Something other than CPU or memory in an injected container's resources.
    OtherResource(String),
}

impl Restart {
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

impl std::fmt::Display for Restart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Restart::NotSelected(r) => {
                write!(f, "the policy would not inject it now ({})", r.label())
            }
            Restart::Field(path) => write!(f, "{path} changes, which a running pod cannot"),
            Restart::ImageAndResources => {
                write!(f, "an image and CPU or memory change together")
            }
            Restart::InitContainerImage(c) => write!(
                f,
                "the image of init container {c} changes, and it has run already"
            ),
            Restart::QosClass { from, to } => {
                write!(f, "a resize would change the QoS class from {from} to {to}")
            }
            Restart::OtherResource(path) => {
                write!(f, "{path} changes; only CPU and memory resize in place")
            }
        }
    }
}

/// A running pod's path to the policy's revision, and the pod as that revision would leave it
/// (what an in-place write aims at: images, labels, annotations and the record).
#[derive(Clone, Debug)]
pub struct Change {
    pub path: Path,
    pub object: Value,
    /// The policy's record on the pod before and after.
    pub before: Option<ProvenanceEntry>,
    pub after: Option<ProvenanceEntry>,
}

/// Sorts the change `policy` makes to the running pod in `request` (operation CREATE, selection
/// `Evaluate`, as offline): see the module doc.
pub fn sort(policy: &CompiledPolicy, request: &PodRequest<'_>) -> Result<Change, EngineError> {
    let old = crate::pod::parse_value(request.object.text())?;
    let before = entry(&old, policy.name());
    let (decision, new) = inject_and_apply(policy, request)?;
    if let Decision::Skip(reason) = decision {
        return Ok(Change {
            path: Path::Restart(Restart::NotSelected(reason)),
            object: new,
            before,
            after: None,
        });
    }
    let after = entry(&new, policy.name());
    let path = path_between(&old, &new, after.as_ref());
    Ok(Change {
        path,
        object: new,
        before,
        after,
    })
}

/// The policy's entry of a pod's `splice.dev/status`.
fn entry(pod: &Value, policy: &str) -> Option<ProvenanceEntry> {
    let text = pod
        .pointer("/metadata/annotations")?
        .get(STATUS_ANNOTATION)?
        .as_str()?;
    let mut all: crate::Provenance = serde_json::from_str(text).ok()?;
    all.remove(policy)
}

/// The path from the running pod `old` to `new`; `injected` names the policy's items.
fn path_between(old: &Value, new: &Value, injected: Option<&ProvenanceEntry>) -> Path {
    let mut diffs = Vec::new();
    diff(
        &mut String::from("spec"),
        &old["spec"],
        &new["spec"],
        &mut diffs,
    );
    let metadata = old["metadata"]["labels"] != new["metadata"]["labels"]
        || annotations_differ(
            &old["metadata"]["annotations"],
            &new["metadata"]["annotations"],
        );
    let ours: BTreeSet<&str> = injected
        .map(|e| {
            e.containers
                .iter()
                .chain(&e.init_containers)
                .map(String::as_str)
                .collect()
        })
        .unwrap_or_default();
    let mut images = Vec::new();
    let mut resized: BTreeSet<(String, Place)> = BTreeSet::new();
    for d in &diffs {
        let Some((list, name, rest)) = split_container(d) else {
            return Path::Restart(Restart::Field(d.clone()));
        };
        if !ours.contains(name) {
            return Path::Restart(Restart::Field(d.clone()));
        }
        let Some(place) = place_of(&new["spec"], list, name) else {
            return Path::Restart(Restart::Field(d.clone()));
        };
        match rest {
            "image" => {
                if place == Place::Init {
                    return Path::Restart(Restart::InitContainerImage(name.to_owned()));
                }
                let image = |pod: &Value| {
                    container(&pod["spec"], list, name)
                        .and_then(|c| c["image"].as_str())
                        .unwrap_or_default()
                        .to_owned()
                };
                images.push(ImageChange {
                    container: name.to_owned(),
                    place,
                    from: image(old),
                    to: image(new),
                });
            }
            r if r == "resources"
                || ["requests", "limits"].iter().any(|k| {
                    r.strip_prefix("resources.")
                        .and_then(|r| r.strip_prefix(k))
                        .is_some_and(|t| t.is_empty() || t == ".cpu" || t == ".memory")
                }) =>
            {
                if place == Place::Init {
                    return Path::Restart(Restart::Field(d.clone()));
                }
                resized.insert((name.to_owned(), place));
            }
            r if r.starts_with("resources") => {
                return Path::Restart(Restart::OtherResource(d.clone()));
            }
            _ => return Path::Restart(Restart::Field(d.clone())),
        }
    }
    if !images.is_empty() && !resized.is_empty() {
        return Path::Restart(Restart::ImageAndResources);
    }
    if !images.is_empty() {
        return Path::Images(images);
    }
    if !resized.is_empty() {
        let (from, to) = (qos_class(&old["spec"]), qos_class(&new["spec"]));
        if from != to {
            return Path::Restart(Restart::QosClass { from, to });
        }
        let changes = resized
            .into_iter()
            .map(|(name, place)| ResourceChange {
                resources: container(&new["spec"], place.list(), &name)
                    .map(|c| c["resources"].clone())
                    .unwrap_or(Value::Null),
                container: name,
                place,
            })
            .collect();
        return Path::Resize(changes);
    }
    if metadata {
        Path::Metadata
    } else {
        Path::Record
    }
}

/// Whether annotations differ beyond the record itself.
fn annotations_differ(old: &Value, new: &Value) -> bool {
    let without = |v: &Value| {
        let mut m = v.as_object().cloned().unwrap_or_default();
        m.shift_remove(STATUS_ANNOTATION);
        m
    };
    without(old) != without(new)
}

/// `spec.containers[NAME].rest` → ("containers", NAME, rest).
fn split_container(path: &str) -> Option<(&'static str, &str, &str)> {
    for list in ["containers", "initContainers"] {
        if let Some(rest) = path
            .strip_prefix("spec.")
            .and_then(|p| p.strip_prefix(list))
            .and_then(|p| p.strip_prefix('['))
        {
            let (name, rest) = rest.split_once(']')?;
            let list: &'static str = if list == "containers" {
                "containers"
            } else {
                "initContainers"
            };
            return Some((list, name, rest.strip_prefix('.').unwrap_or(rest)));
        }
    }
    None
}

fn container<'a>(spec: &'a Value, list: &str, name: &str) -> Option<&'a Value> {
    spec[list]
        .as_array()?
        .iter()
        .find(|c| c["name"].as_str() == Some(name))
}

fn place_of(spec: &Value, list: &str, name: &str) -> Option<Place> {
    let c = container(spec, list, name)?;
    Some(match list {
        "containers" => Place::Container,
        _ if c["restartPolicy"].as_str() == Some("Always") => Place::Sidecar,
        _ => Place::Init,
    })
}

/// Every path where `new` differs from the stored `old`, containers named by name. A key only
/// `old` has is a change unless the API server defaults it ([`DEFAULTED`]) or it is empty.
fn diff(path: &mut String, old: &Value, new: &Value, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            for (k, nv) in n {
                let len = path.len();
                path.push('.');
                path.push_str(k);
                match o.get(k) {
                    Some(ov) => diff(path, ov, nv, out),
                    None if is_empty(nv) => {}
                    None => out.push(path.clone()),
                }
                path.truncate(len);
            }
            for (k, ov) in o {
                if !n.contains_key(k) && !DEFAULTED.contains(&k.as_str()) && !is_empty(ov) {
                    out.push(format!("{path}.{k}"));
                }
            }
        }
        (Value::Array(o), Value::Array(n)) => {
            let named = |v: &[Value]| -> Option<Vec<String>> {
                v.iter()
                    .map(|i| i["name"].as_str().map(str::to_owned))
                    .collect()
            };
            let containers = path.ends_with("containers") || path.ends_with("Containers");
            match (containers, named(o), named(n)) {
                (true, Some(on), Some(nn)) if on == nn => {
                    for ((ov, nv), name) in o.iter().zip(n).zip(&nn) {
                        let len = path.len();
                        path.push('[');
                        path.push_str(name);
                        path.push(']');
                        diff(path, ov, nv, out);
                        path.truncate(len);
                    }
                }
                (true, _, _) => out.push(format!("{path} (the containers or their order)")),
                _ if o.len() != n.len() => out.push(path.clone()),
                _ => {
                    for (i, (ov, nv)) in o.iter().zip(n).enumerate() {
                        let len = path.len();
                        path.push_str(&format!("[{i}]"));
                        diff(path, ov, nv, out);
                        path.truncate(len);
                    }
                }
            }
        }
        (Value::String(o), Value::String(n)) if o == n || same_quantity(o, n) => {}
        (o, n) if o == n => {}
        _ => out.push(path.clone()),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Null => true,
        _ => false,
    }
}

/// Two quantity strings of one value (`0.5` and `500m`, `1Gi` and `1024Mi`). A small parser
/// rather than a crate: the engine compares a handful per pod and needs no arithmetic.
fn same_quantity(a: &str, b: &str) -> bool {
    match (quantity(a), quantity(b)) {
        (Some(x), Some(y)) => (x - y).abs() <= f64::EPSILON * x.abs().max(y.abs()) * 4.0,
        _ => false,
    }
}

fn quantity(s: &str) -> Option<f64> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let n: f64 = number.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e => {
            let exp: i32 = e.strip_prefix(['e', 'E'])?.parse().ok()?;
            10f64.powi(exp)
        }
    };
    Some(n * scale)
}

/// A pod spec's QoS class, as the kubelet computes it from CPU and memory of every container
/// and init container: Guaranteed when each sets limits equal to requests for both, BestEffort
/// when none sets any, Burstable otherwise.
pub fn qos_class(spec: &Value) -> &'static str {
    let all: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|l| spec[*l].as_array())
        .flatten()
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in all {
        let r = &c["resources"];
        for res in ["cpu", "memory"] {
            let (req, lim) = (r["requests"][res].as_str(), r["limits"][res].as_str());
            any |= req.is_some() || lim.is_some();
            // A limit alone defaults the request to it.
            let req = req.or(lim);
            let equal = match (req, lim) {
                (Some(a), Some(b)) => a == b || same_quantity(a, b),
                _ => false,
            };
            guaranteed &= equal;
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use splice_crds::{InjectionPolicy, Operation};

    use super::*;
    use crate::{Exclusions, NamespaceContext, Pod, Selection};

    const POLICY: &str = include_str!("../../testdata/policy-sidecar.yaml");

    fn policy(edit: impl FnOnce(&mut serde_yaml::Value)) -> CompiledPolicy {
        let mut doc: serde_yaml::Value = serde_yaml::from_str(POLICY).unwrap();
        edit(&mut doc);
        let p: InjectionPolicy = serde_yaml::from_value(doc).unwrap();
        CompiledPolicy::compile("mesh-proxy", 3, &p.spec).unwrap()
    }

    fn app_pod() -> Value {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "shop", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "web:1"}]},
        })
    }

    fn run(policy: &CompiledPolicy, pod: &Value) -> Change {
        let text = pod.to_string();
        let ns = NamespaceContext {
            name: "shop".into(),
            ..Default::default()
        };
        let ex = Exclusions::default_for("splice-system");
        let req = PodRequest {
            operation: Operation::Create,
            object: &Pod::parse(&text).unwrap(),
            namespace: &ns,
            exclusions: &ex,
            trust_domain: crate::identity::DEFAULT_TRUST_DOMAIN,
            selection: Selection::Evaluate,
        };
        sort(policy, &req).unwrap()
    }

    /// The pod as admitted by `policy`, then stored: the API server's defaults added to every
    /// injected container.
    fn running(policy: &CompiledPolicy) -> Value {
        let mut pod = run(policy, &app_pod()).object;
        for list in ["containers", "initContainers"] {
            for c in pod["spec"][list].as_array_mut().unwrap() {
                let c = c.as_object_mut().unwrap();
                c.insert(
                    "terminationMessagePath".into(),
                    "/dev/termination-log".into(),
                );
                c.insert("imagePullPolicy".into(), "IfNotPresent".into());
                c.entry("resources").or_insert(serde_json::json!({}));
                if let Some(p) = c.get_mut("readinessProbe") {
                    p["timeoutSeconds"] = 1.into();
                    p["httpGet"]["scheme"] = "HTTP".into();
                }
            }
        }
        pod
    }

    fn set(doc: &mut serde_yaml::Value, path: &[&str], v: serde_yaml::Value) {
        let mut at = doc;
        for p in &path[..path.len() - 1] {
            at = match p.parse::<usize>() {
                Ok(i) => &mut at[i],
                Err(_) => &mut at[*p],
            };
        }
        at[path[path.len() - 1]] = v;
    }

    #[test]
    fn the_same_revision_on_a_stored_pod_is_no_change_despite_the_api_servers_defaults() {
        let p = policy(|_| {});
        let change = run(&p, &running(&p));
        assert_eq!(change.path, Path::Record);
    }

    #[test]
    fn a_new_sidecar_image_is_an_in_place_image_update_of_that_native_sidecar() {
        let old = policy(|_| {});
        let pod = running(&old);
        let new = policy(|d| set(d, &["spec", "values", "proxyImage"], "proxy:2".into()));
        let change = run(&new, &pod);
        let Path::Images(images) = &change.path else {
            panic!("{:?}", change.path)
        };
        assert_eq!(
            images,
            &[ImageChange {
                container: "mesh-proxy".into(),
                place: Place::Sidecar,
                from: "registry.example/mesh/proxy:1.4.2".into(),
                to: "proxy:2".into(),
            }]
        );
        assert_eq!(change.before.unwrap().hash, old.template_hash());
        assert_eq!(change.after.unwrap().hash, new.template_hash());
        assert!(change.path.in_place());
    }

    #[test]
    fn a_regular_init_containers_new_image_restarts_since_it_has_run() {
        let pod = running(&policy(|_| {}));
        let new = policy(|d| set(d, &["spec", "values", "initImage"], "init:2".into()));
        assert_eq!(
            run(&new, &pod).path,
            Path::Restart(Restart::InitContainerImage("mesh-init".into()))
        );
    }

    #[test]
    fn a_sidecars_cpu_within_its_qos_class_is_a_resize() {
        let pod = running(&policy(|_| {}));
        let new = policy(|d| {
            set(
                d,
                &[
                    "spec",
                    "template",
                    "initContainers",
                    "1",
                    "resources",
                    "requests",
                    "cpu",
                ],
                "200m".into(),
            )
        });
        let Path::Resize(r) = run(&new, &pod).path else {
            panic!()
        };
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].container, "mesh-proxy");
        assert_eq!(r[0].resources["requests"]["cpu"], "200m");
    }

    #[test]
    fn a_quantity_written_another_way_is_no_change() {
        let pod = running(&policy(|_| {}));
        let new = policy(|d| {
            set(
                d,
                &[
                    "spec",
                    "template",
                    "initContainers",
                    "1",
                    "resources",
                    "limits",
                    "cpu",
                ],
                "1000m".into(),
            )
        });
        assert_eq!(run(&new, &pod).path, Path::Record);
    }

    #[test]
    fn an_env_change_restarts_and_names_the_field() {
        let pod = running(&policy(|_| {}));
        let new = policy(|d| {
            set(
                d,
                &["spec", "template", "env", "0", "value"],
                "false".into(),
            );
        });
        let Path::Restart(Restart::Field(f)) = run(&new, &pod).path else {
            panic!()
        };
        assert_eq!(f, "spec.containers[app].env[0].value", "{f}");
    }

    #[test]
    fn an_image_and_a_resource_change_together_restart() {
        let pod = running(&policy(|_| {}));
        let new = policy(|d| {
            set(d, &["spec", "values", "proxyImage"], "proxy:2".into());
            set(
                d,
                &[
                    "spec",
                    "template",
                    "initContainers",
                    "1",
                    "resources",
                    "requests",
                    "memory",
                ],
                "128Mi".into(),
            );
        });
        assert_eq!(
            run(&new, &pod).path,
            Path::Restart(Restart::ImageAndResources)
        );
    }

    #[test]
    fn a_resize_that_would_change_the_qos_class_restarts() {
        // Every container Guaranteed, then the sidecar's limit raised above its request.
        let guaranteed = |d: &mut serde_yaml::Value, cpu: &str| {
            let r = serde_yaml::from_str::<serde_yaml::Value>(&format!(
                "{{requests: {{cpu: 100m, memory: 64Mi}}, limits: {{cpu: {cpu}, memory: 64Mi}}}}"
            ))
            .unwrap();
            set(
                d,
                &["spec", "template", "initContainers", "0", "resources"],
                r.clone(),
            );
            set(
                d,
                &["spec", "template", "initContainers", "1", "resources"],
                r,
            );
        };
        let mut pod = running(&policy(|d| guaranteed(d, "100m")));
        pod["spec"]["containers"][0]["resources"] = serde_json::json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}});
        assert_eq!(qos_class(&pod["spec"]), "Guaranteed");
        let new = policy(|d| {
            guaranteed(d, "100m");
            set(
                d,
                &[
                    "spec",
                    "template",
                    "initContainers",
                    "1",
                    "resources",
                    "limits",
                    "cpu",
                ],
                "200m".into(),
            );
        });
        assert_eq!(
            run(&new, &pod).path,
            Path::Restart(Restart::QosClass {
                from: "Guaranteed",
                to: "Burstable"
            })
        );
    }

    #[test]
    fn only_an_annotation_change_is_a_metadata_patch() {
        let pod = running(&policy(|_| {}));
        let new = policy(|d| {
            set(
                d,
                &["spec", "template", "annotations", "mesh.example/owner"],
                "platform".into(),
            )
        });
        assert_eq!(run(&new, &pod).path, Path::Metadata);
    }

    #[test]
    fn a_pod_the_policy_no_longer_selects_restarts_with_the_reason() {
        let pod = running(&policy(|_| {}));
        let mut pod2 = pod.clone();
        pod2["metadata"]["labels"]["mesh.example/exclude"] = "yes".into();
        let change = run(&policy(|_| {}), &pod2);
        assert_eq!(
            change.path,
            Path::Restart(Restart::NotSelected(SkipReason::ObjectNotSelected))
        );
    }

    #[test]
    fn quantities_compare_by_value() {
        assert!(same_quantity("0.5", "500m"));
        assert!(same_quantity("1Gi", "1024Mi"));
        assert!(same_quantity("1e3", "1k"));
        assert!(!same_quantity("1G", "1Gi"));
        assert!(!same_quantity("abc", "abc "));
    }
}
