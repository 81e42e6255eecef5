//! From (what the pod carries, what this policy would inject now) to JSON Patch operations.
//!
//! Each list (init containers, containers, volumes, and env / volumeMounts of each application
//! container) is compared with what the policy would inject: when it already holds exactly that
//! (same template hash, same items in the same order, every rendered field present with the same
//! value) it is left alone; otherwise this policy's earlier items are removed and the current ones
//! added. Items the policy did not record are the author's (or another webhook's): they are never
//! touched, and an injected item of the same name is skipped with a warning.

use std::borrow::Cow;
use std::collections::HashSet;

use serde_json::Value;
use splice_crds::{Operation, STATUS_ANNOTATION};

use super::patch::{Op, OpValue, Path, Text};
use super::provenance::{EntryRef, Names, ProvenanceEntry, push_name};
use super::template::{RItem, Rendered};
use super::view::{
    self, ContainerView, Entries, Mount, Named, PodView, Raw, RawContainerView, RawPodView, Str,
};
use super::{EngineError, validate};

/// The `splice.dev/status` annotation as found on the pod.
#[derive(Debug, Default)]
pub(crate) struct Status {
    /// Every policy's entry, in the annotation's order; other policies' entries are written back
    /// untouched.
    pub entries: serde_json::Map<String, Value>,
    /// This policy's entry, when present and readable.
    pub mine: Option<ProvenanceEntry>,
    /// The annotation was present but not a JSON object of entries.
    pub unreadable: bool,
    /// The annotation is present, readable or not (`{}` included: the planner then replaces it
    /// rather than adding it).
    pub annotated: bool,
}

impl Status {
    pub fn read(view: &PodView<'_>, policy: &str) -> Status {
        let raw = view
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(STATUS_ANNOTATION));
        let Some(raw) = raw else {
            return Status::default();
        };
        let parsed = view::from_str::<Str<'_>>(raw.get())
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Map<String, Value>>(&s).ok());
        let Some(entries) = parsed else {
            return Status {
                unreadable: true,
                annotated: true,
                ..Status::default()
            };
        };
        let mine = entries
            .get(policy)
            .and_then(|v| serde_json::from_value::<ProvenanceEntry>(v.clone()).ok());
        Status {
            entries,
            mine,
            unreadable: false,
            annotated: true,
        }
    }

    /// Containers and init containers that other Splice policies recorded: they are injected, not
    /// application containers.
    fn others_containers(&self, policy: &str) -> HashSet<&str> {
        let mut out = HashSet::new();
        for (name, entry) in &self.entries {
            if name == policy {
                continue;
            }
            for list in ["containers", "initContainers"] {
                if let Some(items) = entry.get(list).and_then(Value::as_array) {
                    out.extend(items.iter().filter_map(Value::as_str));
                }
            }
        }
        out
    }
}

pub(crate) struct PlanInput<'a, 'x> {
    pub policy: &'a str,
    pub hash: &'a str,
    pub operation: Operation,
    pub object: &'a str,
    pub view: &'a PodView<'a>,
    pub status: &'a Status,
    pub rendered: &'x Rendered<'x>,
}

#[derive(Debug)]
pub(crate) struct Plan<'x> {
    pub ops: Vec<Op<'x>>,
    pub warnings: Vec<String>,
}

/// A small set of names: linear for a handful (cheaper than hashing), hashed beyond. Either way
/// a 64-bit mask of the names' fingerprints (length, first and last byte) turns most absent names
/// away first: every env name of the pod is tested against the injected ones, and generated names
/// often share a length or a prefix, rarely all three.
struct NameSet<'s> {
    /// The bit of every name's fingerprint.
    mask: u64,
    names: SetNames<'s>,
}

enum SetNames<'s> {
    Small(Vec<&'s str>),
    Hashed(HashSet<&'s str>),
}

impl<'s> NameSet<'s> {
    fn new(names: impl IntoIterator<Item = &'s str>) -> Self {
        let v: Vec<&str> = names.into_iter().collect();
        let mask = v.iter().fold(0, |m, n| m | fingerprint(n));
        let names = if v.len() <= 8 {
            SetNames::Small(v)
        } else {
            SetNames::Hashed(v.into_iter().collect())
        };
        NameSet { mask, names }
    }
    /// Inlined: it runs for every env name and mount path of every application container.
    #[inline(always)]
    fn contains(&self, name: &str) -> bool {
        if self.mask & fingerprint(name) == 0 {
            return false;
        }
        match &self.names {
            SetNames::Small(v) => v.contains(&name),
            SetNames::Hashed(h) => h.contains(name),
        }
    }
    fn is_empty(&self) -> bool {
        self.mask == 0
    }
}

#[inline(always)]
pub(crate) fn fingerprint(name: &str) -> u64 {
    let b = name.as_bytes();
    let first = usize::from(b.first().copied().unwrap_or(0));
    let last = usize::from(b.last().copied().unwrap_or(0));
    1 << ((b.len() + first * 7 + last * 13) % 64)
}

/// True when every field of `desired` is in `actual` with the same value, so fields the API server
/// defaults after a patch do not count as a change. True when everything the policy would inject is still there. Additions by other mutators are
/// not drift: the API server's ServiceAccount plugin mounts its token into every container,
/// injected ones included, and other webhooks add env vars; re-injecting on those would strip
/// their work on every reinvocation. So arrays match when the desired elements appear in
/// `actual` in order, with anything else in between.
fn subset(desired: &Value, actual: &Value) -> bool {
    match (desired, actual) {
        (Value::Object(d), Value::Object(a)) => d
            .iter()
            .all(|(k, dv)| a.get(k).is_some_and(|av| subset(dv, av))),
        (Value::Array(d), Value::Array(a)) => {
            let mut rest = a.iter();
            d.iter().all(|dv| rest.any(|av| subset(dv, av)))
        }
        _ => desired == actual,
    }
}

fn invalid(e: impl std::fmt::Display) -> EngineError {
    EngineError::InvalidObject(e.to_string())
}

/// The outcome for one list.
struct ListPlan<'x> {
    /// Pod indices of this policy's earlier items, to remove (only when `changed`).
    remove: Vec<usize>,
    add: Vec<&'x RItem<'x>>,
    changed: bool,
}

impl<'x> ListPlan<'x> {
    /// `ours`: (pod index, key) of the items the policy recorded; `desired`: what it would inject
    /// now; `raw`: the pod's raw item at an index, for comparing content.
    fn new<'r>(
        ours: Vec<(usize, &str)>,
        desired: Vec<&'x RItem<'x>>,
        hash_same: bool,
        raw: impl Fn(usize) -> Result<Option<Raw<'r>>, EngineError>,
    ) -> Result<Self, EngineError> {
        let mut same = hash_same
            && ours.len() == desired.len()
            && ours.iter().zip(&desired).all(|((_, k), d)| *k == d.key);
        if same {
            for ((i, _), d) in ours.iter().zip(&desired) {
                let Some(raw) = raw(*i)? else {
                    same = false;
                    break;
                };
                let actual: Value = serde_json::from_str(raw.get()).map_err(invalid)?;
                if !subset(&d.value, &actual) {
                    same = false;
                    break;
                }
            }
        }
        Ok(ListPlan {
            remove: if same {
                Vec::new()
            } else {
                ours.into_iter().map(|(i, _)| i).collect()
            },
            add: desired,
            changed: !same,
        })
    }
}

/// Renders a list of names for a warning, cut after a few.
fn names<'s>(items: impl ExactSizeIterator<Item = &'s str>) -> String {
    let mut s = String::new();
    push_names(&mut s, items);
    s
}

/// Appends a list of names for a warning, cut after a few.
fn push_names<'s>(out: &mut String, items: impl ExactSizeIterator<Item = &'s str>) {
    const SHOWN: usize = 6;
    let total = items.len();
    for (i, name) in items.take(SHOWN).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(name);
    }
    if total > SHOWN {
        out.push_str(" and ");
        out.push_str(&(total - SHOWN).to_string());
        out.push_str(" more");
    }
}

/// The "injected: …" summary, one part per kind of item, built in one string.
struct Summary(String);

impl Summary {
    fn part<'s>(&mut self, what: &str, items: impl ExactSizeIterator<Item = &'s str>) {
        if !self.0.is_empty() {
            self.0.push_str("; ");
        }
        self.0.push_str(what);
        push_names(&mut self.0, items);
    }
}

/// One appended list of the pod: a list of `spec`, or a list of application container `ci`.
#[derive(Clone, Copy)]
enum List {
    /// The list's pointer, and that pointer with `/-`.
    Spec(&'static str, &'static str),
    /// `/spec/containers/{ci}` + suffix, and the suffix with `/-`.
    Container(usize, &'static str, &'static str),
}

impl List {
    fn whole(self) -> Path<'static> {
        match self {
            List::Spec(p, _) => Path::Fixed(p),
            List::Container(ci, suffix, _) => Path::Container(ci, suffix),
        }
    }
    fn index(self, i: usize) -> Path<'static> {
        match self {
            List::Spec(p, _) => Path::Index(p, i),
            List::Container(ci, suffix, _) => Path::ContainerIndex(ci, suffix, i),
        }
    }
    fn append(self) -> Path<'static> {
        match self {
            List::Spec(_, p) => Path::Fixed(p),
            List::Container(ci, _, suffix) => Path::Container(ci, suffix),
        }
    }
}

pub(crate) fn plan<'x>(input: PlanInput<'x, 'x>) -> Result<Plan<'x>, EngineError> {
    let PlanInput {
        policy,
        hash,
        operation,
        object,
        view,
        status,
        rendered,
    } = input;
    let mut warnings = Vec::new();
    if status.unreadable {
        warnings.push(format!(
            "splice policy {policy}: replaced an unreadable {STATUS_ANNOTATION} annotation"
        ));
    }
    let mine = status.mine.as_ref();
    let hash_same = mine.is_some_and(|m| m.hash == hash);
    let empty = ProvenanceEntry::default();
    let rec = mine.unwrap_or(&empty);

    let mut new_entry = EntryRef {
        hash,
        ..EntryRef::default()
    };
    // Sized for a typical sidecar policy, so that neither grows while the plan is built.
    let mut spec_ops: Vec<Op<'x>> = Vec::with_capacity(16);
    let mut injected = Summary(String::with_capacity(256));
    let mut any_list_changed = false;

    if operation == Operation::Create {
        let spec = view.spec.as_ref();
        let pod_init: &[Named<'_>] = spec
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or(&[]);
        let pod_containers: &[ContainerView<'_>] =
            spec.and_then(|s| s.containers.as_deref()).unwrap_or(&[]);
        let pod_volumes: &[Named<'_>] = spec.and_then(|s| s.volumes.as_deref()).unwrap_or(&[]);

        // The second, raw pass is only needed to confirm an earlier injection is intact.
        let raw_pod: Option<RawPodView<'_>> = if hash_same {
            Some(view::from_str(object).map_err(invalid)?)
        } else {
            None
        };
        let raw_spec = raw_pod.as_ref().and_then(|r| r.spec.as_ref());

        // Containers and init containers share one name space in a pod.
        let rec_init = NameSet::new(rec.init_containers.iter().map(String::as_str));
        let rec_cont = NameSet::new(rec.containers.iter().map(String::as_str));
        let occupied = NameSet::new(
            pod_init
                .iter()
                .map(Named::name)
                .filter(|n| !rec_init.contains(n))
                .chain(
                    pod_containers
                        .iter()
                        .map(ContainerView::name)
                        .filter(|n| !rec_cont.contains(n)),
                ),
        );
        let keep = |items: &'x [RItem<'x>], what: &str, warnings: &mut Vec<String>| {
            items
                .iter()
                .filter(|i| {
                    let taken = occupied.contains(i.key.as_ref());
                    if taken {
                        warnings.push(format!(
                            "splice policy {policy}: kept the pod's own container {:?}; the injected {what} of that name was skipped",
                            i.key
                        ));
                    }
                    !taken
                })
                .collect::<Vec<_>>()
        };

        // Init containers (native sidecars first, in template order, before the pod's own).
        let ours: Vec<(usize, &str)> = pod_init
            .iter()
            .enumerate()
            .filter(|(_, c)| rec_init.contains(c.name()))
            .map(|(i, c)| (i, c.name()))
            .collect();
        let desired = keep(&rendered.init_containers, "init container", &mut warnings);
        let init = ListPlan::new(ours, desired, hash_same, |i| {
            Ok(raw_at(raw_spec.and_then(|s| s.init_containers.as_ref()), i))
        })?;
        if init.changed {
            for &i in init.remove.iter().rev() {
                spec_ops.push(Op::Remove(Path::Index("/spec/initContainers", i)));
            }
            let absent = spec.and_then(|s| s.init_containers.as_ref()).is_none();
            if absent && !init.add.is_empty() {
                spec_ops.push(Op::Add(
                    Path::Fixed("/spec/initContainers"),
                    OpValue::Items(init.add.clone()),
                ));
            } else if !absent {
                for (k, item) in init.add.iter().enumerate() {
                    spec_ops.push(Op::Add(
                        Path::Index("/spec/initContainers", k),
                        OpValue::Item(item),
                    ));
                }
            }
            if !init.add.is_empty() {
                injected.part("init containers ", init.add.iter().map(|i| i.key.as_ref()));
            }
        }
        new_entry.init_containers = Names::Items(init.add);

        // Env and volume mounts, per application container (not injected ones, by any policy).
        let others = status.others_containers(policy);
        let mut env_kept: Kept<'_> = Vec::new();
        let mut mount_kept: Kept<'_> = Vec::new();
        let mut env_into: Vec<&str> = Vec::new();
        let mut mounts_into: Vec<&str> = Vec::new();
        if !rendered.env.is_empty()
            || !rendered.volume_mounts.is_empty()
            || !rec.env.is_empty()
            || !rec.volume_mounts.is_empty()
        {
            let raw_containers = raw_spec.and_then(|s| s.containers.as_ref());
            // The same for every container: built once.
            let env_keys = NameSet::new(rendered.env.iter().map(|e| e.key.as_ref()));
            let mount_keys = NameSet::new(rendered.volume_mounts.iter().map(|m| m.key.as_ref()));
            for (ci, c) in pod_containers.iter().enumerate() {
                let cname = c.name();
                if rec_cont.contains(cname) || others.contains(cname) {
                    continue;
                }
                let mut raw_c: Option<RawContainerView<'_>> = None;

                // Env.
                let rec_env =
                    NameSet::new(rec.env.get(cname).into_iter().flatten().map(String::as_str));
                let env_plan = container_list(
                    &mut spec_ops,
                    List::Container(ci, "/env", "/env/-"),
                    c.env.as_deref().map(|l| l.iter().map(Named::name)),
                    (&rec_env, &env_keys, &rendered.env),
                    (&mut env_kept, cname),
                    hash_same,
                    || Ok(raw_container(&mut raw_c, raw_containers, ci)?.env.clone()),
                )?;
                if env_plan.changed && !env_plan.add.is_empty() {
                    env_into.push(cname);
                }
                if !env_plan.add.is_empty() {
                    new_entry.env.push((cname, Names::Items(env_plan.add)));
                }

                // Volume mounts, identified by mount path.
                let rec_m = NameSet::new(
                    rec.volume_mounts
                        .get(cname)
                        .into_iter()
                        .flatten()
                        .map(String::as_str),
                );
                let mount_plan = container_list(
                    &mut spec_ops,
                    List::Container(ci, "/volumeMounts", "/volumeMounts/-"),
                    c.volume_mounts
                        .as_deref()
                        .map(|l| l.iter().map(Mount::path)),
                    (&rec_m, &mount_keys, &rendered.volume_mounts),
                    (&mut mount_kept, cname),
                    hash_same,
                    || {
                        Ok(raw_container(&mut raw_c, raw_containers, ci)?
                            .volume_mounts
                            .clone())
                    },
                )?;
                if mount_plan.changed && !mount_plan.add.is_empty() {
                    mounts_into.push(cname);
                }
                if !mount_plan.add.is_empty() {
                    new_entry
                        .volume_mounts
                        .push((cname, Names::Items(mount_plan.add)));
                }
            }
        }
        EntryRef::sort_map(&mut new_entry.env);
        EntryRef::sort_map(&mut new_entry.volume_mounts);
        env_kept.sort_by(|a, b| a.0.cmp(b.0));
        mount_kept.sort_by(|a, b| a.0.cmp(b.0));
        for (c, vars) in &env_kept {
            warnings.push(format!(
                "splice policy {policy}: kept the pod's own env {} in container {c:?}; the injected value was skipped",
                names(vars.iter().copied())
            ));
        }
        for (c, paths) in &mount_kept {
            warnings.push(format!(
                "splice policy {policy}: kept the pod's own volume mount at {} in container {c:?}; the injected mount was skipped",
                names(paths.iter().copied())
            ));
        }
        if !env_into.is_empty() {
            injected.part("env ", rendered.env.iter().map(|i| i.key.as_ref()));
            injected.0.push_str(" into ");
            push_names(&mut injected.0, env_into.iter().copied());
        }
        if !mounts_into.is_empty() {
            injected.part(
                "volume mounts ",
                rendered.volume_mounts.iter().map(|i| i.key.as_ref()),
            );
            injected.0.push_str(" into ");
            push_names(&mut injected.0, mounts_into.iter().copied());
        }

        // Containers, appended after the pod's own.
        let ours: Vec<(usize, &str)> = pod_containers
            .iter()
            .enumerate()
            .filter(|(_, c)| rec_cont.contains(c.name()))
            .map(|(i, c)| (i, c.name()))
            .collect();
        let desired = keep(&rendered.containers, "container", &mut warnings);
        let cont = ListPlan::new(ours, desired, hash_same, |i| {
            Ok(raw_at(raw_spec.and_then(|s| s.containers.as_ref()), i))
        })?;
        if cont.changed {
            emit_list(
                &mut spec_ops,
                List::Spec("/spec/containers", "/spec/containers/-"),
                spec.and_then(|s| s.containers.as_ref()).is_none(),
                &cont,
            );
            if !cont.add.is_empty() {
                injected.part("containers ", cont.add.iter().map(|i| i.key.as_ref()));
            }
        }
        new_entry.containers = Names::Items(cont.add);

        // Volumes.
        let rec_vol = NameSet::new(rec.volumes.iter().map(String::as_str));
        let mut ours = Vec::new();
        let mut pod_own_vol = Vec::with_capacity(pod_volumes.len());
        for (i, v) in pod_volumes.iter().enumerate() {
            if rec_vol.contains(v.name()) {
                ours.push((i, v.name()));
            } else {
                pod_own_vol.push(v.name());
            }
        }
        let occupied_vol = NameSet::new(pod_own_vol);
        let desired: Vec<&RItem<'x>> = rendered
            .volumes
            .iter()
            .filter(|v| {
                let t = occupied_vol.contains(v.key.as_ref());
                if t {
                    warnings.push(format!(
                        "splice policy {policy}: kept the pod's own volume {:?}; the injected volume of that name was skipped",
                        v.key
                    ));
                }
                !t
            })
            .collect();
        let vols = ListPlan::new(ours, desired, hash_same, |i| {
            Ok(raw_at(raw_spec.and_then(|s| s.volumes.as_ref()), i))
        })?;
        if vols.changed {
            emit_list(
                &mut spec_ops,
                List::Spec("/spec/volumes", "/spec/volumes/-"),
                spec.and_then(|s| s.volumes.as_ref()).is_none(),
                &vols,
            );
            if !vols.add.is_empty() {
                injected.part("volumes ", vols.add.iter().map(|i| i.key.as_ref()));
            }
        }
        new_entry.volumes = Names::Items(vols.add);
        any_list_changed = !spec_ops.is_empty();
        if !spec_ops.is_empty() && spec.is_none() {
            spec_ops.insert(0, Op::Add(Path::Fixed("/spec"), OpValue::EmptyObject));
        }
    } else if let Some(m) = mine {
        // UPDATE: a pod's containers and volumes are immutable; keep the record of them.
        new_entry = EntryRef::of(m);
    }

    // Labels and annotations, compared key by key.
    let meta = view.metadata.as_ref();
    let mut meta_ops: Vec<Op<'x>> = Vec::with_capacity(8);
    let pod_labels = meta.and_then(|m| m.labels.as_ref());
    let (labels_added, owned) = plan_map(
        policy,
        "label",
        "/metadata/labels",
        pod_labels,
        |v: &Str<'_>| Ok(Cow::Owned(v.to_string())),
        &rec.labels,
        &rendered.labels,
        &mut meta_ops,
        &mut warnings,
    )?;
    new_entry.labels = Names::Strs(owned);
    let pod_annotations = meta.and_then(|m| m.annotations.as_ref());
    let (annotations_added, owned) = plan_map(
        policy,
        "annotation",
        "/metadata/annotations",
        pod_annotations,
        |v: &Raw<'_>| {
            view::from_str::<Str<'_>>(v.get())
                .map(|s| Cow::Owned(s.to_string()))
                .map_err(|e| invalid(format!("metadata.annotations: {e}")))
        },
        &rec.annotations,
        &rendered.annotations,
        &mut meta_ops,
        &mut warnings,
    )?;
    new_entry.annotations = Names::Strs(owned);
    if !labels_added.is_empty() {
        injected.part("labels ", labels_added.iter().copied());
    }
    if !annotations_added.is_empty() {
        injected.part("annotations ", annotations_added.iter().copied());
    }

    // Provenance: rewrite the status annotation when this policy's entry changed.
    let changed = match &status.mine {
        None => true,
        Some(m) => EntryRef::of(m).to_json() != new_entry.to_json(),
    };
    if changed {
        let text = if status.entries.keys().all(|k| k == policy) {
            // The common case, only this policy on the pod: written straight into the escaped
            // form the patch carries, with no intermediate JSON tree or string.
            let mut text = Vec::with_capacity(1024);
            text.push(b'{');
            push_name(&mut text, policy, true);
            text.push(b':');
            new_entry.write(&mut text, true);
            text.push(b'}');
            Text::Escaped(text)
        } else {
            let mut entries = status.entries.clone();
            let value: Value = serde_json::from_slice(&new_entry.to_json()).map_err(invalid)?;
            entries.insert(policy.to_owned(), value);
            Text::Plain(Cow::Owned(
                serde_json::to_string(&entries).map_err(invalid)?,
            ))
        };
        let annotations_absent = pod_annotations.is_none();
        // When the map itself was just created by an "add", fold the status into it.
        let folded = meta_ops.iter_mut().find_map(|op| match op {
            Op::Add(Path::Fixed("/metadata/annotations"), OpValue::StrMap(entries)) => {
                Some(entries)
            }
            _ => None,
        });
        if let Some(entries) = folded {
            entries.push((Cow::Borrowed(STATUS_ANNOTATION), text));
        } else if annotations_absent {
            meta_ops.push(Op::Add(
                Path::Fixed("/metadata/annotations"),
                OpValue::StrMap(vec![(Cow::Borrowed(STATUS_ANNOTATION), text)]),
            ));
        } else {
            let path = Path::Key("/metadata/annotations", Cow::Borrowed(STATUS_ANNOTATION));
            let present = pod_annotations.is_some_and(|a| a.get(STATUS_ANNOTATION).is_some());
            meta_ops.push(if present {
                Op::Replace(path, OpValue::Str(text))
            } else {
                Op::Add(path, OpValue::Str(text))
            });
        }
    }
    if !meta_ops.is_empty() && meta.is_none() {
        meta_ops.insert(0, Op::Add(Path::Fixed("/metadata"), OpValue::EmptyObject));
    }

    let mut ops = meta_ops;
    ops.extend(spec_ops);
    if !injected.0.is_empty() {
        let verb = match mine {
            Some(m) if any_list_changed && m.hash != hash => "re-injected (policy changed)",
            Some(_) if any_list_changed => {
                "re-injected (the pod no longer matched its recorded injection)"
            }
            _ => "injected",
        };
        let mut summary = String::with_capacity(policy.len() + verb.len() + injected.0.len() + 18);
        summary.push_str("splice policy ");
        summary.push_str(policy);
        summary.push(' ');
        summary.push_str(verb);
        summary.push_str(": ");
        summary.push_str(&injected.0);
        warnings.insert(0, summary);
    }
    Ok(Plan { ops, warnings })
}

/// Per container, the keys of the author's items that were kept over the policy's.
type Kept<'s> = Vec<(&'s str, Vec<&'s str>)>;

/// Plans one list of an application container (env, or volume mounts) and emits its operations.
/// `pod_keys` are the keys of the container's items, `None` when it has no such list; `raw` gives
/// the container's raw items of the list, asked for only when the items this policy injected
/// earlier must be compared with what it would inject now.
fn container_list<'s, 'x, 'r>(
    ops: &mut Vec<Op<'x>>,
    list: List,
    pod_keys: Option<impl Iterator<Item = &'s str>>,
    (recorded, desired_keys, rendered): (&NameSet<'_>, &NameSet<'_>, &'x [RItem<'x>]),
    kept: (&mut Kept<'s>, &'s str),
    hash_same: bool,
    raw: impl FnOnce() -> Result<Option<Vec<Raw<'r>>>, EngineError>,
) -> Result<ListPlan<'x>, EngineError>
where
    'x: 's,
{
    let absent = pod_keys.is_none();
    let (ours, desired) = split_list(
        pod_keys.into_iter().flatten(),
        recorded,
        desired_keys,
        rendered,
        kept,
    );
    let needs_raw = hash_same && !ours.is_empty() && ours.len() == desired.len();
    let raw_items = if needs_raw { raw()? } else { None };
    let plan = ListPlan::new(ours, desired, hash_same, |j| {
        Ok(raw_items.as_ref().and_then(|l| l.get(j).copied()))
    })?;
    if plan.changed {
        emit_list(ops, list, absent, &plan);
    }
    Ok(plan)
}

/// One list of an application container: the pod's items this policy recorded (index, key), and
/// the rendered items to inject now, less those whose key an item the policy did not record
/// already holds (the author's: it stays, and `kept` notes it for the warning).
fn split_list<'s, 'x>(
    pod_keys: impl Iterator<Item = &'s str>,
    recorded: &NameSet<'_>,
    desired_keys: &NameSet<'_>,
    rendered: &'x [RItem<'x>],
    (kept_list, container): (&mut Kept<'s>, &'s str),
) -> (Vec<(usize, &'s str)>, Vec<&'x RItem<'x>>)
where
    'x: 's,
{
    let mut ours = Vec::new();
    let mut taken: Vec<&str> = Vec::new();
    if !recorded.is_empty() || !desired_keys.is_empty() {
        // Most pods carry no earlier injection: then only the desired keys are looked up.
        let any_recorded = !recorded.is_empty();
        for (j, key) in pod_keys.enumerate() {
            if any_recorded && recorded.contains(key) {
                ours.push((j, key));
            } else if desired_keys.contains(key) {
                taken.push(key);
            }
        }
    }
    let desired = if taken.is_empty() {
        rendered.iter().collect()
    } else {
        rendered
            .iter()
            .filter(|item| {
                let t = taken.contains(&item.key.as_ref());
                if t {
                    kept(kept_list, container, item.key.as_ref());
                }
                !t
            })
            .collect()
    };
    (ours, desired)
}

/// Records that the pod's own `name` in container `c` kept an injected item out.
fn kept<'s>(list: &mut Kept<'s>, c: &'s str, name: &'s str) {
    match list.iter_mut().find(|(k, _)| *k == c) {
        Some((_, names)) => names.push(name),
        None => list.push((c, vec![name])),
    }
}

fn raw_at<'o>(list: Option<&Vec<Raw<'o>>>, i: usize) -> Option<Raw<'o>> {
    list.and_then(|l| l.get(i).copied())
}

/// The raw view of container `ci`, parsed on first use.
fn raw_container<'r, 'o>(
    slot: &'r mut Option<RawContainerView<'o>>,
    containers: Option<&Vec<Raw<'o>>>,
    ci: usize,
) -> Result<&'r RawContainerView<'o>, EngineError> {
    if slot.is_none() {
        let raw = containers
            .and_then(|l| l.get(ci).copied())
            .ok_or_else(|| invalid("spec.containers changed between two reads"))?;
        *slot = Some(view::from_str(raw.get()).map_err(invalid)?);
    }
    slot.as_ref()
        .ok_or_else(|| invalid("spec.containers changed between two reads"))
}

/// Emits the operations for one appended list: remove this policy's earlier items (highest index
/// first, so the others keep their index), then append the current ones, creating the list when
/// it was absent.
fn emit_list<'x>(ops: &mut Vec<Op<'x>>, list: List, absent: bool, plan: &ListPlan<'x>) {
    for &i in plan.remove.iter().rev() {
        ops.push(Op::Remove(list.index(i)));
    }
    if absent {
        if !plan.add.is_empty() {
            ops.push(Op::Add(list.whole(), OpValue::Items(plan.add.clone())));
        }
    } else {
        for item in &plan.add {
            ops.push(Op::Add(list.append(), OpValue::Item(item)));
        }
    }
}

/// Plans one string map (labels or annotations): returns the keys added and the keys this policy
/// owns afterwards (in template order).
#[allow(clippy::too_many_arguments)]
fn plan_map<'x, V>(
    policy: &str,
    what: &str,
    base: &'static str,
    pod: Option<&Entries<'_, V>>,
    decode: impl Fn(&V) -> Result<Cow<'static, str>, EngineError>,
    recorded: &[String],
    desired: &'x [(Cow<'x, str>, Cow<'x, str>)],
    ops: &mut Vec<Op<'x>>,
    warnings: &mut Vec<String>,
) -> Result<(Vec<&'x str>, Vec<&'x str>), EngineError> {
    let mut added = Vec::new();
    let mut owned = Vec::new();
    let mut new_map: Vec<(Cow<'x, str>, Text<'x>)> = Vec::new();
    for (k, value) in desired {
        let key: &'x str = k;
        if what == "label" {
            validate::label_value(value).map_err(|e| EngineError::InvalidRender {
                policy: policy.to_owned(),
                field: {
                    let mut f = "spec.template.labels".to_owned();
                    super::template::push_key(&mut f, key);
                    f
                },
                message: format!("rendered label value {value:?} {e}"),
            })?;
        }
        let ours = recorded.iter().any(|r| r == key);
        match pod.and_then(|p| p.get(key)) {
            None => {
                added.push(key);
                owned.push(key);
                if pod.is_none() {
                    new_map.push((
                        Cow::Borrowed(key),
                        Text::Plain(Cow::Borrowed(value.as_ref())),
                    ));
                } else {
                    ops.push(Op::Add(
                        Path::Key(base, Cow::Borrowed(key)),
                        OpValue::Str(Text::Plain(Cow::Borrowed(value.as_ref()))),
                    ));
                }
            }
            Some(current) => {
                let current = decode(current)?;
                if ours {
                    owned.push(key);
                    if current != *value {
                        added.push(key);
                        ops.push(Op::Replace(
                            Path::Key(base, Cow::Borrowed(key)),
                            OpValue::Str(Text::Plain(Cow::Borrowed(value.as_ref()))),
                        ));
                    }
                } else if current != *value {
                    warnings.push(format!(
                        "splice policy {policy}: kept the pod's own {what} {key:?}; the injected value was skipped"
                    ));
                }
            }
        }
    }
    for key in recorded {
        if desired.iter().any(|(k, _)| k == key) || key == STATUS_ANNOTATION {
            continue;
        }
        if pod.is_some_and(|p| p.get(key).is_some()) {
            ops.push(Op::Remove(Path::Key(base, Cow::Owned(key.clone()))));
        }
    }
    if !new_map.is_empty() {
        ops.push(Op::Add(Path::Fixed(base), OpValue::StrMap(new_map)));
    }
    Ok((added, owned))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The fingerprint mask only turns names away, never one in the set (small or hashed).
        #[test]
        fn a_name_set_holds_exactly_its_names(
            set in proptest::collection::vec("[A-Z_0-9]{0,14}", 0..12),
            probes in proptest::collection::vec("[A-Z_0-9]{0,14}", 0..12),
        ) {
            let names = NameSet::new(set.iter().map(String::as_str));
            prop_assert_eq!(names.is_empty(), set.is_empty());
            for n in set.iter().chain(&probes) {
                prop_assert_eq!(names.contains(n), set.contains(n), "{:?}", n);
            }
        }
    }
}
