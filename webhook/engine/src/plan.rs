//! The planner: from what a pod carries and what a policy would inject now, the JSON Patch
//! operations and the warnings of one admission.
//!
//! It reads the pod through its [`PodFacts`] (and, for a pod that carries `splice.dev/status`,
//! that record and the raw items it compares), one function per list it plans. Each list (init
//! containers, containers, volumes, and env / volumeMounts of each application container) is
//! compared with what the policy would inject: when it already holds exactly that (same template
//! hash, same items in the same order, every rendered field present with the same value) it is
//! left alone; otherwise this policy's earlier items are removed and the current ones added.
//! Items the policy did not record are the author's (or another webhook's): they are never
//! touched, and an injected item of the same name is skipped with a warning. Labels and
//! annotations are compared key by key, and the policy's entry in the status annotation records
//! what it injected.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};

use serde_json::Value;
use splice_crds::{Operation, STATUS_ANNOTATION};

use super::facts::{Lookups, NotRead, PodFacts, SpecFacts};
use super::patch::{Op, OpValue, Path, Text};
use super::provenance::{EntryRef, Names, OverrideRecord, ProvenanceEntry, push_name};
use super::template::{RItem, Rendered};
use super::view::{self, PodView, Raw, RawContainerView, RawPodView, RawSpecView, Str};
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

/// What the planner reads besides the pod's facts when the pod carries `splice.dev/status` (a pod
/// already admitted once: a reinvocation, or an UPDATE): the record, and the pod's text, read
/// again for its raw items when this policy's earlier injection must be compared with what it
/// would inject now. Such pods are planned afresh every time: the plan cache keeps only patches
/// planned from the facts and the rendering alone.
#[derive(Clone, Copy)]
pub(crate) struct Earlier<'x> {
    pub status: &'x Status,
    pub object: &'x str,
}

pub(crate) struct PlanInput<'x> {
    pub policy: &'x str,
    pub hash: &'x str,
    /// The data digests of `valuesFrom` recorded with the hash.
    pub data: &'x BTreeMap<String, String>,
    /// The overrides' origins and digests for this pod.
    pub overrides: &'x BTreeMap<String, OverrideRecord>,
    pub facts: &'x PodFacts<'x>,
    /// `None` for a pod without the status annotation.
    pub earlier: Option<Earlier<'x>>,
    pub rendered: &'x Rendered<'x>,
}

/// The facts of `view` the planner reads for `rendered`: of the pod's labels and annotations,
/// those the policy sets and those it recorded (which it removes when it no longer sets them).
pub(crate) fn facts<'v>(
    operation: Operation,
    view: &'v PodView<'_>,
    status: &'v Status,
    rendered: &'v Rendered<'_>,
) -> PodFacts<'v> {
    let recorded = |list: fn(&ProvenanceEntry) -> &Vec<String>| {
        status
            .mine
            .iter()
            .flat_map(move |m| list(m).iter().map(String::as_str))
    };
    PodFacts::read(
        operation,
        view,
        rendered
            .labels
            .iter()
            .map(|(k, _)| k.as_ref())
            .chain(recorded(|m| &m.labels)),
        rendered
            .annotations
            .iter()
            .map(|(k, _)| k.as_ref())
            .chain(recorded(|m| &m.annotations)),
    )
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
fn fingerprint(name: &str) -> u64 {
    let b = name.as_bytes();
    let first = usize::from(b.first().copied().unwrap_or(0));
    let last = usize::from(b.last().copied().unwrap_or(0));
    1 << ((b.len() + first * 7 + last * 13) % 64)
}

/// True when everything the policy would inject is still in `actual`: every field of `desired`
/// with the same value, so fields the API server defaults after a patch do not count as a change.
/// Additions by other mutators are not drift either: the API server's ServiceAccount plugin
/// mounts its token into every container, injected ones included, and other webhooks add env
/// vars; re-injecting on those would strip their work on every reinvocation. So arrays match
/// when the desired elements appear in `actual` in order, with anything else in between.
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

/// Plans the patch of `input`: each list of the pod in turn, then its labels, its annotations and
/// this policy's entry in the status annotation. Operations on metadata come first, then those on
/// the spec, each in the order planned.
pub(crate) fn plan<'x>(input: PlanInput<'x>) -> Result<Plan<'x>, EngineError> {
    let PlanInput {
        policy,
        hash,
        data,
        overrides,
        facts,
        earlier,
        rendered,
    } = input;
    let status = earlier.map(|e| e.status);
    let mine = status.and_then(|s| s.mine.as_ref());
    let empty = ProvenanceEntry::default();
    let mut p = Planner {
        policy,
        rendered,
        rec: mine.unwrap_or(&empty),
        hash_same: mine.is_some_and(|m| m.hash == hash),
        warnings: Vec::new(),
        injected: Summary(String::with_capacity(256)),
        entry: EntryRef {
            hash,
            data: Some(data),
            overrides: Some(overrides),
            ..EntryRef::default()
        },
    };
    if status.is_some_and(|s| s.unreadable) {
        p.warnings.push(format!(
            "splice policy {policy}: replaced an unreadable {STATUS_ANNOTATION} annotation"
        ));
    }

    // Sized for a typical sidecar policy, so that neither grows while the plan is built.
    let mut spec_ops: Vec<Op<'x>> = Vec::with_capacity(16);
    if facts.operation == Operation::Create {
        let spec = facts.spec.as_ref();
        // The raw items are read only to confirm that an earlier injection is intact.
        let raw_pod: Option<RawPodView<'x>> = match earlier {
            Some(e) if p.hash_same => Some(view::from_str(e.object).map_err(invalid)?),
            _ => None,
        };
        let raw = raw_pod.as_ref().and_then(|r| r.spec.as_ref());
        let occupied = p.occupied(spec);
        let others = status
            .map(|s| s.others_containers(policy))
            .unwrap_or_default();
        p.init_containers(spec, raw, &occupied, &others, &mut spec_ops)?;
        p.env_and_mounts(spec, raw, &others, &mut spec_ops)?;
        p.containers(spec, raw, &occupied, &mut spec_ops)?;
        p.volumes(spec, raw, &mut spec_ops)?;
        if let Some(volume) = token_volume(spec) {
            with_token_mount(&mut spec_ops, volume);
        }
        if !spec_ops.is_empty() && spec.is_none() {
            spec_ops.insert(0, Op::Add(Path::Fixed("/spec"), OpValue::EmptyObject));
        }
    } else if let Some(m) = mine {
        // UPDATE: a pod's containers and volumes are immutable; keep the record of them.
        p.entry = EntryRef::of(m);
    }
    let any_list_changed = !spec_ops.is_empty();

    let meta = facts.metadata.as_ref();
    let annotations = meta.and_then(|m| m.annotations.as_ref());
    let mut meta_ops: Vec<Op<'x>> = Vec::with_capacity(8);
    p.labels(meta.and_then(|m| m.labels.as_ref()), &mut meta_ops)?;
    p.annotations(annotations, &mut meta_ops)?;
    p.status_annotation(status, annotations.is_none(), &mut meta_ops)?;
    if !meta_ops.is_empty() && meta.is_none() {
        meta_ops.insert(0, Op::Add(Path::Fixed("/metadata"), OpValue::EmptyObject));
    }

    let mut ops = meta_ops;
    ops.extend(spec_ops);
    let Planner {
        mut warnings,
        injected,
        ..
    } = p;
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

/// The pod's ServiceAccount token volume, as the API server's ServiceAccount plugin names it
/// (`kube-api-access-<suffix>`; the first one, as the plugin takes it).
pub(crate) fn token_volume<'x>(spec: Option<&'x SpecFacts<'x>>) -> Option<&'x str> {
    spec?
        .volumes
        .as_deref()?
        .iter()
        .map(AsRef::as_ref)
        .find(|v: &&str| v.starts_with(crate::compile::TOKEN_VOLUME_PREFIX))
}

/// Injected containers and init containers get the token mount the ServiceAccount plugin gives
/// every container, at `/var/run/secrets/kubernetes.io/serviceaccount`.
fn with_token_mount<'x>(ops: &mut [Op<'x>], volume: &'x str) {
    for op in ops {
        let Op::Add(path, value) = op else { continue };
        let containers = matches!(
            path,
            Path::Fixed("/spec/containers" | "/spec/containers/-" | "/spec/initContainers")
                | Path::Index("/spec/initContainers", _)
        );
        if !containers {
            continue;
        }
        *value = match std::mem::replace(value, OpValue::EmptyObject) {
            OpValue::Item(item) => OpValue::MountedItem(item, volume),
            OpValue::Items(items) => OpValue::MountedItems(items, volume),
            other => other,
        };
    }
}

/// One plan while its lists are planned in turn.
struct Planner<'r, 'x> {
    policy: &'x str,
    rendered: &'x Rendered<'x>,
    /// What this policy recorded on the pod (empty when nothing).
    rec: &'r ProvenanceEntry,
    /// The record was made with the current templates: the recorded items may still be current.
    hash_same: bool,
    warnings: Vec<String>,
    injected: Summary,
    /// This policy's entry for the status annotation, filled in list by list.
    entry: EntryRef<'x>,
}

impl<'x> Planner<'_, 'x> {
    /// The names of the pod's own containers and init containers (one name space in a pod): an
    /// injected container of such a name is skipped.
    fn occupied(&self, spec: Option<&'x SpecFacts<'x>>) -> NameSet<'x> {
        let rec_init = NameSet::new(self.rec.init_containers.iter().map(String::as_str));
        let rec_cont = NameSet::new(self.rec.containers.iter().map(String::as_str));
        let init = spec
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or(&[]);
        let containers = spec.and_then(|s| s.containers.as_deref()).unwrap_or(&[]);
        NameSet::new(
            init.iter()
                .map(|n| n.as_ref())
                .filter(|n| !rec_init.contains(n))
                .chain(
                    containers
                        .iter()
                        .map(|c| c.name.as_ref())
                        .filter(|n| !rec_cont.contains(n)),
                ),
        )
    }

    /// The rendered items whose name the pod's own item does not hold already; each one that it
    /// holds is skipped with a warning.
    fn keep(
        &mut self,
        items: &'x [RItem<'x>],
        (own, what): (&str, &str),
        occupied: &NameSet<'_>,
    ) -> Vec<&'x RItem<'x>> {
        let policy = self.policy;
        items
            .iter()
            .filter(|i| {
                let taken = occupied.contains(i.key.as_ref());
                if taken {
                    self.warnings.push(format!(
                        "splice policy {policy}: kept the pod's own {own} {:?}; the injected {what} of that name was skipped",
                        i.key
                    ));
                }
                !taken
            })
            .collect()
    }

    /// Init containers: this policy's go in template order before the pod's own, after those
    /// other Splice policies injected at the head of the list, so that policies applied one after
    /// the other (a shared call, in name order) run their init containers in that order.
    fn init_containers(
        &mut self,
        spec: Option<&'x SpecFacts<'x>>,
        raw: Option<&RawSpecView<'_>>,
        occupied: &NameSet<'_>,
        others: &HashSet<&str>,
        ops: &mut Vec<Op<'x>>,
    ) -> Result<(), EngineError> {
        let pod = spec.and_then(|s| s.init_containers.as_deref());
        let ours = recorded_items(pod, |n| n, &self.rec.init_containers);
        let rendered = self.rendered;
        let desired = self.keep(
            &rendered.init_containers,
            ("container", "init container"),
            occupied,
        );
        let plan = ListPlan::new(ours, desired, self.hash_same, |i| {
            Ok(raw_at(raw.and_then(|s| s.init_containers.as_ref()), i))
        })?;
        if plan.changed {
            for &i in plan.remove.iter().rev() {
                ops.push(Op::Remove(Path::Index("/spec/initContainers", i)));
            }
            if pod.is_none() && !plan.add.is_empty() {
                ops.push(Op::Add(
                    Path::Fixed("/spec/initContainers"),
                    OpValue::Items(plan.add.clone()),
                ));
            } else if let Some(pod) = pod {
                let at = pod
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !plan.remove.contains(i))
                    .take_while(|(_, n)| others.contains(n.as_ref()))
                    .count();
                for (k, item) in plan.add.iter().enumerate() {
                    ops.push(Op::Add(
                        Path::Index("/spec/initContainers", at + k),
                        OpValue::Item(item),
                    ));
                }
            }
            if !plan.add.is_empty() {
                self.injected
                    .part("init containers ", plan.add.iter().map(|i| i.key.as_ref()));
            }
        }
        self.entry.init_containers = Names::Items(plan.add);
        Ok(())
    }

    /// Env and volume mounts, in each application container (not in injected ones, by any
    /// policy), container by container.
    fn env_and_mounts(
        &mut self,
        spec: Option<&'x SpecFacts<'x>>,
        raw: Option<&RawSpecView<'_>>,
        others: &HashSet<&str>,
        ops: &mut Vec<Op<'x>>,
    ) -> Result<(), EngineError> {
        let (rendered, rec, hash_same) = (self.rendered, self.rec, self.hash_same);
        let mut env = PerContainer::new(("/env", "/env/-"), &rendered.env, &rec.env);
        let mut mounts = PerContainer::new(
            ("/volumeMounts", "/volumeMounts/-"),
            &rendered.volume_mounts,
            &rec.volume_mounts,
        );
        if !rendered.env.is_empty()
            || !rendered.volume_mounts.is_empty()
            || !rec.env.is_empty()
            || !rec.volume_mounts.is_empty()
        {
            let raw_containers = raw.and_then(|s| s.containers.as_ref());
            let injected = NameSet::new(rec.containers.iter().map(String::as_str));
            let containers = spec.and_then(|s| s.containers.as_deref()).unwrap_or(&[]);
            for (ci, c) in containers.iter().enumerate() {
                let name: &'x str = &c.name;
                if injected.contains(name) || others.contains(name) {
                    continue;
                }
                let mut raw_c: Option<RawContainerView<'_>> = None;
                env.plan(ops, (ci, name), c.env.as_deref(), hash_same, || {
                    Ok(raw_container(&mut raw_c, raw_containers, ci)?.env.clone())
                })?;
                mounts.plan(
                    ops,
                    (ci, name),
                    c.volume_mounts.as_deref(),
                    hash_same,
                    || {
                        Ok(raw_container(&mut raw_c, raw_containers, ci)?
                            .volume_mounts
                            .clone())
                    },
                )?;
            }
        }
        EntryRef::sort_map(&mut env.entry);
        EntryRef::sort_map(&mut mounts.entry);
        env.kept.sort_by(|a, b| a.0.cmp(b.0));
        mounts.kept.sort_by(|a, b| a.0.cmp(b.0));
        let policy = self.policy;
        for (c, vars) in &env.kept {
            self.warnings.push(format!(
                "splice policy {policy}: kept the pod's own env {} in container {c:?}; the injected value was skipped",
                names(vars.iter().copied())
            ));
        }
        for (c, paths) in &mounts.kept {
            self.warnings.push(format!(
                "splice policy {policy}: kept the pod's own volume mount at {} in container {c:?}; the injected mount was skipped",
                names(paths.iter().copied())
            ));
        }
        for (what, list) in [("env ", &env), ("volume mounts ", &mounts)] {
            if !list.into.is_empty() {
                self.injected
                    .part(what, list.rendered.iter().map(|i| i.key.as_ref()));
                self.injected.0.push_str(" into ");
                push_names(&mut self.injected.0, list.into.iter().copied());
            }
        }
        self.entry.env = env.entry;
        self.entry.volume_mounts = mounts.entry;
        Ok(())
    }

    /// Containers: this policy's are appended after the pod's own.
    fn containers(
        &mut self,
        spec: Option<&'x SpecFacts<'x>>,
        raw: Option<&RawSpecView<'_>>,
        occupied: &NameSet<'_>,
        ops: &mut Vec<Op<'x>>,
    ) -> Result<(), EngineError> {
        let pod = spec.and_then(|s| s.containers.as_deref());
        let ours = recorded_items(pod, |c| &c.name, &self.rec.containers);
        let rendered = self.rendered;
        let desired = self.keep(&rendered.containers, ("container", "container"), occupied);
        let add = self.appended(
            (
                List::Spec("/spec/containers", "/spec/containers/-"),
                "containers ",
            ),
            (ours, desired),
            (pod.is_none(), raw.and_then(|s| s.containers.as_ref())),
            ops,
        )?;
        self.entry.containers = Names::Items(add);
        Ok(())
    }

    /// Volumes, appended after the pod's own.
    fn volumes(
        &mut self,
        spec: Option<&'x SpecFacts<'x>>,
        raw: Option<&RawSpecView<'_>>,
        ops: &mut Vec<Op<'x>>,
    ) -> Result<(), EngineError> {
        let pod = spec.and_then(|s| s.volumes.as_deref());
        let recorded = NameSet::new(self.rec.volumes.iter().map(String::as_str));
        let mut ours = Vec::new();
        let mut own = Vec::with_capacity(pod.map_or(0, <[_]>::len));
        for (i, v) in pod.unwrap_or(&[]).iter().enumerate() {
            if recorded.contains(v) {
                ours.push((i, v.as_ref()));
            } else {
                own.push(v.as_ref());
            }
        }
        let rendered = self.rendered;
        let desired = self.keep(&rendered.volumes, ("volume", "volume"), &NameSet::new(own));
        let add = self.appended(
            (List::Spec("/spec/volumes", "/spec/volumes/-"), "volumes "),
            (ours, desired),
            (pod.is_none(), raw.and_then(|s| s.volumes.as_ref())),
            ops,
        )?;
        self.entry.volumes = Names::Items(add);
        Ok(())
    }

    /// Plans a list of the spec this policy appends to (`absent`: the pod has none), given the
    /// pod's items it recorded and the ones it would inject now; returns the items it holds
    /// afterwards.
    fn appended(
        &mut self,
        (list, what): (List, &str),
        (ours, desired): (Vec<(usize, &str)>, Vec<&'x RItem<'x>>),
        (absent, raw): (bool, Option<&Vec<Raw<'_>>>),
        ops: &mut Vec<Op<'x>>,
    ) -> Result<Vec<&'x RItem<'x>>, EngineError> {
        let plan = ListPlan::new(ours, desired, self.hash_same, |i| Ok(raw_at(raw, i)))?;
        if plan.changed {
            emit_list(ops, list, absent, &plan);
            if !plan.add.is_empty() {
                self.injected
                    .part(what, plan.add.iter().map(|i| i.key.as_ref()));
            }
        }
        Ok(plan.add)
    }

    /// Labels, compared key by key; a rendered value must be a valid label value.
    fn labels(
        &mut self,
        pod: Option<&'x Lookups<'x>>,
        ops: &mut Vec<Op<'x>>,
    ) -> Result<(), EngineError> {
        let (rendered, rec) = (self.rendered, self.rec);
        for (key, value) in &rendered.labels {
            validate::label_value(value).map_err(|e| EngineError::InvalidRender {
                policy: self.policy.to_owned(),
                field: {
                    let mut f = "spec.template.labels".to_owned();
                    super::template::push_key(&mut f, key);
                    f
                },
                message: format!("rendered label value {value:?} {e}"),
            })?;
        }
        let owned = self.map(
            ("label", "labels ", "/metadata/labels"),
            pod,
            |v| Ok(Cow::Borrowed(v)),
            &rec.labels,
            &rendered.labels,
            ops,
        )?;
        self.entry.labels = Names::Strs(owned);
        Ok(())
    }

    /// Annotations, compared key by key; a pod's value it compares must be a JSON string.
    fn annotations(
        &mut self,
        pod: Option<&'x Lookups<'x>>,
        ops: &mut Vec<Op<'x>>,
    ) -> Result<(), EngineError> {
        let (rendered, rec) = (self.rendered, self.rec);
        let owned = self.map(
            ("annotation", "annotations ", "/metadata/annotations"),
            pod,
            |v| {
                view::from_str::<Str<'_>>(v)
                    .map(|s| s.0)
                    .map_err(|e| invalid(format!("metadata.annotations: {e}")))
            },
            &rec.annotations,
            &rendered.annotations,
            ops,
        )?;
        self.entry.annotations = Names::Strs(owned);
        Ok(())
    }

    /// One string map (labels or annotations): notes the keys added in the summary, and returns
    /// the keys this policy owns afterwards (in template order).
    fn map(
        &mut self,
        (what, part, base): (&str, &str, &'static str),
        pod: Option<&'x Lookups<'x>>,
        decode: impl Fn(&'x str) -> Result<Cow<'x, str>, EngineError>,
        recorded: &[String],
        desired: &'x [(Cow<'x, str>, Cow<'x, str>)],
        ops: &mut Vec<Op<'x>>,
    ) -> Result<Vec<&'x str>, EngineError> {
        let policy = self.policy;
        let lookup = |key: &str| match pod {
            None => Ok(None),
            Some(p) => p.get(key).map_err(|NotRead| {
                invalid(format!(
                    "the planner compared the {what} {key:?}, which was not read from the pod"
                ))
            }),
        };
        let mut added = Vec::new();
        let mut owned = Vec::new();
        let mut new_map: Vec<(Cow<'x, str>, Text<'x>)> = Vec::new();
        for (k, value) in desired {
            let key: &'x str = k;
            let ours = recorded.iter().any(|r| r == key);
            match lookup(key)? {
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
                        self.warnings.push(format!(
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
            if lookup(key)?.is_some() {
                ops.push(Op::Remove(Path::Key(base, Cow::Owned(key.clone()))));
            }
        }
        if !new_map.is_empty() {
            ops.push(Op::Add(Path::Fixed(base), OpValue::StrMap(new_map)));
        }
        if !added.is_empty() {
            self.injected.part(part, added.iter().copied());
        }
        Ok(owned)
    }

    /// This policy's entry in the status annotation, rewritten when it changed.
    fn status_annotation(
        &self,
        status: Option<&Status>,
        annotations_absent: bool,
        ops: &mut Vec<Op<'x>>,
    ) -> Result<(), EngineError> {
        let policy = self.policy;
        let changed = match status.and_then(|s| s.mine.as_ref()) {
            None => true,
            Some(m) => EntryRef::of(m).to_json() != self.entry.to_json(),
        };
        if !changed {
            return Ok(());
        }
        let text = match status {
            Some(s) if s.entries.keys().any(|k| k != policy) => {
                let mut entries = s.entries.clone();
                let value: Value =
                    serde_json::from_slice(&self.entry.to_json()).map_err(invalid)?;
                entries.insert(policy.to_owned(), value);
                Text::Plain(Cow::Owned(
                    serde_json::to_string(&entries).map_err(invalid)?,
                ))
            }
            _ => {
                // The common case, only this policy on the pod: written straight into the escaped
                // form the patch carries, with no intermediate JSON tree or string.
                let mut text = Vec::with_capacity(1024);
                text.push(b'{');
                push_name(&mut text, policy, true);
                text.push(b':');
                self.entry.write(&mut text, true);
                text.push(b'}');
                Text::Escaped(text)
            }
        };
        // When the map itself was just created by an "add", fold the status into it.
        let folded = ops.iter_mut().find_map(|op| match op {
            Op::Add(Path::Fixed("/metadata/annotations"), OpValue::StrMap(entries)) => {
                Some(entries)
            }
            _ => None,
        });
        if let Some(entries) = folded {
            entries.push((Cow::Borrowed(STATUS_ANNOTATION), text));
        } else if annotations_absent {
            ops.push(Op::Add(
                Path::Fixed("/metadata/annotations"),
                OpValue::StrMap(vec![(Cow::Borrowed(STATUS_ANNOTATION), text)]),
            ));
        } else {
            let path = Path::Key("/metadata/annotations", Cow::Borrowed(STATUS_ANNOTATION));
            ops.push(if status.is_some_and(|s| s.annotated) {
                Op::Replace(path, OpValue::Str(text))
            } else {
                Op::Add(path, OpValue::Str(text))
            });
        }
        Ok(())
    }
}

/// One list planned in each application container: env (by name) or volume mounts (by path).
struct PerContainer<'r, 'x> {
    /// The list's suffix after `/spec/containers/{i}`, and that suffix with `/-`.
    suffix: (&'static str, &'static str),
    rendered: &'x [RItem<'x>],
    /// The rendered items' keys, the same for every container: built once.
    keys: NameSet<'x>,
    /// What this policy recorded, by container name.
    recorded: &'r BTreeMap<String, Vec<String>>,
    /// Per container, the author's items kept over the policy's (for a warning).
    kept: Kept<'x>,
    /// The containers the items went into this time (for the summary).
    into: Vec<&'x str>,
    /// This policy's items per container, for its entry.
    entry: Vec<(&'x str, Names<'x>)>,
}

impl<'r, 'x> PerContainer<'r, 'x> {
    fn new(
        suffix: (&'static str, &'static str),
        rendered: &'x [RItem<'x>],
        recorded: &'r BTreeMap<String, Vec<String>>,
    ) -> Self {
        PerContainer {
            suffix,
            rendered,
            keys: NameSet::new(rendered.iter().map(|i| i.key.as_ref())),
            recorded,
            kept: Vec::new(),
            into: Vec::new(),
            entry: Vec::new(),
        }
    }

    /// Plans the list of container `ci` named `name`: `pod_keys` are the keys of its items
    /// (`None` when it has no such list), `raw` its raw items, read only when needed.
    fn plan<'o>(
        &mut self,
        ops: &mut Vec<Op<'x>>,
        (ci, name): (usize, &'x str),
        pod_keys: Option<&'x [Cow<'x, str>]>,
        hash_same: bool,
        raw: impl FnOnce() -> Result<Option<Vec<Raw<'o>>>, EngineError>,
    ) -> Result<(), EngineError> {
        let recorded = NameSet::new(
            self.recorded
                .get(name)
                .into_iter()
                .flatten()
                .map(String::as_str),
        );
        let plan = container_list(
            ops,
            List::Container(ci, self.suffix.0, self.suffix.1),
            pod_keys.map(|l| l.iter().map(|k| k.as_ref())),
            (&recorded, &self.keys, self.rendered),
            (&mut self.kept, name),
            hash_same,
            raw,
        )?;
        if plan.changed && !plan.add.is_empty() {
            self.into.push(name);
        }
        if !plan.add.is_empty() {
            self.entry.push((name, Names::Items(plan.add)));
        }
        Ok(())
    }
}

/// The pod's items (index, name) that this policy recorded by name.
fn recorded_items<'s, T>(
    pod: Option<&'s [T]>,
    name: impl Fn(&'s T) -> &'s Cow<'s, str>,
    recorded: &[String],
) -> Vec<(usize, &'s str)> {
    let recorded = NameSet::new(recorded.iter().map(String::as_str));
    pod.unwrap_or(&[])
        .iter()
        .enumerate()
        .map(|(i, item)| (i, name(item).as_ref()))
        .filter(|(_, n)| recorded.contains(n))
        .collect()
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
