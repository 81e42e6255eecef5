//! The webhook-entry contract shared by the controller (which writes entries), the webhook
//! server (which answers them) and the CLI (which replays them offline): which policies share one
//! entry (a *group*) and in which order they apply, the entry's names, its path (built and read
//! here alone), the most policies one entry serves, and who decides which selector in a call.
//!
//! Every matching webhook costs a pod create one API-server round trip, in sequence, so policies
//! that the API server would call under the same terms are served by one entry and one call; the
//! webhook applies them in name order. The terms: the failure policy in force and the one asked
//! for, the operations, the reinvocation policy, the timeout, and the namespace selector.
//! Only the API server decides namespace selectors with certainty: the webhook's namespace cache
//! can lag it (a namespace labelled a moment ago), and a webhook's `matchConditions` get no
//! namespace object. So policies whose namespace selectors differ share one configuration whose
//! webhooks *partition* the namespaces ([`Group::cells`]): each webhook selects exactly the
//! namespaces where a given set of the members' selectors holds and the others do not, so the API
//! server calls at most one of them and judges every member's selector itself. Object selectors
//! may differ: the webhook decides each one from the pod's own labels, which are in the request. UPDATE is the exception (the API
//! server also matches the old object, which the webhook does not read), so policies that take
//! UPDATE only share with policies of the same object selector.
//!
//! A policy whose canary is open (`spec.rollout.canary`, see [`canary_split`]) has its own
//! configuration with several webhooks: `/inject-canary/<policy>` serves the revision in force to
//! the canary, and `/inject/<policy>` serves the promoted one to every other pod, so the entry it
//! had before the split never hands the new revision to pods outside the canary.
//!
//! An entry serving one policy keeps the policy's own names (`splice-<policy>`,
//! `<policy>.splice.dev`, `/inject/<policy>`); a shared one is named after its terms, so it keeps
//! its name while policies join and leave it. Its path lists its policies in the order they apply
//! (`/inject/<a>/<b>/...`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use sha2::{Digest, Sha256};
use splice_crds::{Canary, FailurePolicy, InjectionPolicySpec, Operation, StableRevision};

use crate::{CompiledPolicy, Selection};

/// The most policies one entry serves: grouping splits larger groups, and the webhook refuses a
/// path that names more.
pub const MAX_MEMBERS: usize = 32;

/// What every entry's path starts with.
const PATH_PREFIX: &str = "/inject/";

/// What a canary's entry path starts with. A marker in the name cannot work: the API server wants
/// every segment of a Service reference's path to be a DNS-1123 subdomain, which a policy name
/// already may be, so only the prefix can tell the canary's entry from a policy's.
const CANARY_PATH_PREFIX: &str = "/inject-canary/";

/// Between the names of an entry's path: `/` (written), `,` (read, from earlier versions).
const SEPARATORS: [char; 2] = ['/', ','];

/// The most webhooks one partitioned configuration holds: a family of policies whose namespace
/// selectors need more keeps one entry per selector. Every webhook costs the API server a
/// namespace-selector check per pod create, a call costs it a round trip.
pub const MAX_CELLS: usize = 16;

/// The most distinct namespace selectors one partition combines (every subset is a candidate cell).
const MAX_SELECTORS: usize = 5;

/// Prefix of a shared configuration's name. A policy's own configuration is `splice-<policy>` and
/// a policy name cannot start with `-`, so the two never collide.
const SHARED_PREFIX: &str = "splice--group-";

/// A policy as grouping sees it: the spec in force and the failure policy written for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    pub name: String,
    pub uid: String,
    pub spec: InjectionPolicySpec,
    pub failure_policy: FailurePolicy,
    /// Set while the policy's canary is open: its entry is its own, split by [`canary_split`].
    pub canary: Option<Canary>,
}

/// The terms under which the API server calls a webhook entry.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Terms {
    failure_policy: &'static str,
    /// The one asked for too: the webhook fails a shared call for a failing policy that asks for
    /// `Fail` even while the guard writes `Ignore`, which must not touch `Ignore` policies.
    requested_failure_policy: &'static str,
    operations: Vec<&'static str>,
    reinvocation: &'static str,
    timeout_seconds: i32,
    namespace_selector: String,
    /// Part of the terms only for policies that take UPDATE.
    object_selector: Option<String>,
    /// The policy's name while its canary is open: no other policy shares its entries.
    alone: Option<String>,
}

impl Terms {
    fn of(m: &Member) -> Terms {
        let mut operations: Vec<&'static str> =
            m.spec.operations.iter().map(|o| o.as_str()).collect();
        operations.sort_unstable();
        operations.dedup();
        let update = m.spec.operations.contains(&Operation::Update);
        Terms {
            failure_policy: m.failure_policy.as_str(),
            requested_failure_policy: m.spec.failure_policy.as_str(),
            operations,
            reinvocation: m.spec.reinvocation_policy.as_str(),
            timeout_seconds: m.spec.timeout_seconds,
            namespace_selector: canonical(m.spec.namespace_selector.as_ref()),
            object_selector: update.then(|| canonical(m.spec.object_selector.as_ref())),
            alone: m.canary.is_some().then(|| m.name.clone()),
        }
    }

    /// The terms without the namespace selector: policies that differ only there may share a
    /// partitioned configuration.
    fn family(&self) -> Terms {
        Terms {
            namespace_selector: PARTITIONED.to_owned(),
            ..self.clone()
        }
    }
}

/// The namespace selector a family's terms carry: no canonical selector text looks like it.
const PARTITIONED: &str = "*";

/// A selector as text, with an empty `matchLabels` and an absent one written alike.
fn canonical(selector: Option<&LabelSelector>) -> String {
    let mut s = selector.cloned().unwrap_or_default();
    if s.match_labels.as_ref().is_some_and(BTreeMap::is_empty) {
        s.match_labels = None;
    }
    if s.match_expressions.as_ref().is_some_and(Vec::is_empty) {
        s.match_expressions = None;
    }
    serde_json::to_string(&s).unwrap_or_default()
}

/// One webhook entry and the policies it serves, in the order they apply.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// The MutatingWebhookConfiguration's name.
    pub configuration: String,
    /// The webhook's name inside it, as the API server reports it in errors.
    pub webhook: String,
    /// Sorted by name: the order the webhook applies them in.
    pub members: Vec<Member>,
    /// Empty when every member has the same namespace selector. Otherwise the webhooks that
    /// partition the namespaces between the members' selectors, one call per pod at most.
    pub cells: Vec<Cell>,
}

/// One webhook of a partitioned group: the namespaces where exactly its members' namespace
/// selectors hold.
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    /// What the API server checks: every requirement of its members' selectors, and for each
    /// other selector of the group one negated requirement (see [`partition`]).
    pub namespace: Vec<LabelSelectorRequirement>,
    /// Indexes into the group's members, in name order.
    pub members: Vec<usize>,
}

impl Group {
    pub fn is_shared(&self) -> bool {
        self.members.len() > 1
    }

    /// The path the webhook answers this entry on.
    pub fn path(&self) -> String {
        entry_path(self.members.iter().map(|m| m.name.as_str()))
    }

    /// The object selector the entry carries: the members' common one, or none when they differ
    /// (the webhook then decides each; see [`selection`]).
    pub fn object_selector(&self) -> Option<&LabelSelector> {
        // A partitioned group's cells carry their own members' (see [`Group::entries`]).
        if !self.cells.is_empty() {
            return None;
        }
        let first = self.members.first()?.spec.object_selector.as_ref();
        let same = one_object_selector(self.members.iter().map(|m| &m.spec));
        if same { first } else { None }
    }

    /// The namespace selector the entry carries: the members' common one, or none when the
    /// group is partitioned (each cell then carries all its requirements).
    pub fn namespace_selector(&self) -> Option<&LabelSelector> {
        if !self.cells.is_empty() {
            return None;
        }
        self.members.first()?.spec.namespace_selector.as_ref()
    }

    pub fn names(&self) -> Vec<&str> {
        self.members.iter().map(|m| m.name.as_str()).collect()
    }

    /// The entries the API server calls for this group: one, or while its policy's canary is
    /// open, the canary's and one per requirement for the pods outside it.
    pub fn entries(&self) -> Vec<Entry> {
        if !self.cells.is_empty() {
            return self
                .cells
                .iter()
                .enumerate()
                .map(|(i, cell)| {
                    let members = || cell.members.iter().map(|&m| &self.members[m]);
                    // The webhook lets the API server decide the object selector of a call whose
                    // policies share one ([`selection`]), so that call's webhook must carry it.
                    let object = match members().next() {
                        Some(first) if one_object_selector(members().map(|m| &m.spec)) => {
                            requirements(first.spec.object_selector.as_ref())
                        }
                        _ => Vec::new(),
                    };
                    Entry {
                        webhook: format!("cell-{i}.{}", self.webhook),
                        path: entry_path(members().map(|m| m.name.as_str())),
                        namespace: cell.namespace.clone(),
                        object,
                    }
                })
                .collect();
        }
        let only = match &self.members[..] {
            [only] => only,
            _ => return vec![Entry::whole(self)],
        };
        let Some(canary) = &only.canary else {
            return vec![Entry::whole(self)];
        };
        canary_split(canary)
            .into_iter()
            .enumerate()
            .map(|(i, split)| {
                let (webhook, path) = if split.stable {
                    (format!("stable-{i}.{}", self.webhook), self.path())
                } else {
                    (self.webhook.clone(), canary_path(&only.name))
                };
                Entry {
                    webhook,
                    path,
                    namespace: split.namespace,
                    object: split.object,
                }
            })
            .collect()
    }
}

/// One webhook of a group's configuration: its name, path, and the requirements it adds to the
/// group's selectors.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub webhook: String,
    pub path: String,
    pub namespace: Vec<LabelSelectorRequirement>,
    pub object: Vec<LabelSelectorRequirement>,
}

impl Entry {
    fn whole(group: &Group) -> Entry {
        Entry {
            webhook: group.webhook.clone(),
            path: group.path(),
            namespace: Vec::new(),
            object: Vec::new(),
        }
    }
}

/// Which pods a canary holds: its two selectors, read once. The planner, `explain` and the tests
/// ask it; the API server decides the same through [`canary_split`]'s webhooks.
#[derive(Clone, Debug)]
pub struct CanaryScope {
    namespace: crate::selector::Selector,
    object: crate::selector::Selector,
}

impl CanaryScope {
    pub fn of(canary: &Canary) -> Self {
        Self {
            namespace: crate::selector::Selector::read(canary.namespace_selector.as_ref()),
            object: crate::selector::Selector::read(canary.object_selector.as_ref()),
        }
    }

    /// Whether a pod with `pod_labels` in a namespace with `namespace_labels` (`None`: not known)
    /// is in the canary.
    pub fn holds(
        &self,
        namespace_labels: Option<&BTreeMap<String, String>>,
        pod_labels: &BTreeMap<String, String>,
    ) -> bool {
        self.namespace
            .matches(|k| namespace_labels.and_then(|l| l.get(k)).map(String::as_str))
            && self
                .object
                .matches(|k| pod_labels.get(k).map(String::as_str))
    }
}

/// The policy's canary while it is open: `spec.rollout.canary` is set, a revision was promoted
/// (`stable`, the status's `rollout.stable`) and the template in force (`template_hash`) is
/// another. Before any promotion there is nothing to pin, so no canary is open. The controller
/// (entries, mode, rollout), every replica (what it serves) and the offline commands (mode)
/// decide with this one function.
pub fn open_canary<'p>(
    spec: &'p InjectionPolicySpec,
    stable: Option<&'p StableRevision>,
    template_hash: &str,
) -> Option<(&'p Canary, &'p StableRevision)> {
    let canary = spec.rollout.as_ref()?.canary.as_ref()?;
    let stable = stable?;
    (stable.template_hash != template_hash).then_some((canary, stable))
}

/// The store key of what a policy's canary gets: the revision in force. Under its own name a
/// policy with an open canary serves the promoted revision, so the entry it had before the split
/// (and the entries for the pods outside the canary) never serve the new one. A policy name cannot
/// hold `@`.
pub fn canary_key(policy: &str) -> String {
    format!("{policy}{CANARY_SUFFIX}")
}

/// The path of the entry that serves `policy`'s canary ([`canary_key`]'s revision).
pub fn canary_path(policy: &str) -> String {
    format!("{CANARY_PATH_PREFIX}{policy}")
}

const CANARY_SUFFIX: &str = "@canary";

/// One part of a canary split: the requirements it adds, and whether its pods get the promoted
/// revision (`stable`) or the new one.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    pub namespace: Vec<LabelSelectorRequirement>,
    pub object: Vec<LabelSelectorRequirement>,
    pub stable: bool,
}

/// Splits every pod a policy selects into the canary and the rest, as selectors the API server
/// evaluates: the canary's requirements r1..rn (namespace first, then object), then for each i
/// "r1..r(i-1) hold and ri does not". The parts are disjoint and together cover everything, so
/// each pod is sent to exactly one entry, with no cache of Splice's in the decision. A
/// LabelSelector cannot express a negation, but one requirement can always be negated.
pub fn canary_split(canary: &Canary) -> Vec<Split> {
    let namespace = requirements(canary.namespace_selector.as_ref());
    let object = requirements(canary.object_selector.as_ref());
    let all: Vec<(bool, &LabelSelectorRequirement)> = namespace
        .iter()
        .map(|r| (true, r))
        .chain(object.iter().map(|r| (false, r)))
        .collect();
    let mut out = vec![Split {
        namespace: namespace.clone(),
        object: object.clone(),
        stable: false,
    }];
    for (i, (in_namespace, r)) in all.iter().enumerate() {
        let mut split = Split {
            namespace: Vec::new(),
            object: Vec::new(),
            stable: true,
        };
        for (kept_namespace, kept) in &all[..i] {
            let side = if *kept_namespace {
                &mut split.namespace
            } else {
                &mut split.object
            };
            side.push((*kept).clone());
        }
        let negated = negate(r);
        if *in_namespace {
            split.namespace.push(negated);
        } else {
            split.object.push(negated);
        }
        out.push(split);
    }
    out
}

/// A selector's requirements, `matchLabels` written as `In` expressions.
fn requirements(selector: Option<&LabelSelector>) -> Vec<LabelSelectorRequirement> {
    let Some(s) = selector else {
        return Vec::new();
    };
    let labels = s
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| LabelSelectorRequirement {
            key: k.clone(),
            operator: "In".to_owned(),
            values: Some(vec![v.clone()]),
        });
    labels
        .chain(s.match_expressions.iter().flatten().cloned())
        .collect()
}

/// The requirement that holds exactly where `r` does not: `NotIn` also matches a missing label,
/// `In` requires it.
fn negate(r: &LabelSelectorRequirement) -> LabelSelectorRequirement {
    let operator = match r.operator.as_str() {
        "In" => "NotIn",
        "NotIn" => "In",
        "Exists" => "DoesNotExist",
        _ => "Exists",
    };
    LabelSelectorRequirement {
        key: r.key.clone(),
        operator: operator.to_owned(),
        values: r.values.clone(),
    }
}

/// Every entry for a set of policies.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    groups: Vec<Group>,
}

impl Plan {
    /// Groups `members`. `instance` tells this Splice's entries from another's in the same cluster
    /// (its namespace and policy selector), so two instances never write one shared entry.
    pub fn new(members: impl IntoIterator<Item = Member>, instance: &str) -> Plan {
        let mut families: BTreeMap<Terms, BTreeMap<Terms, Vec<Member>>> = BTreeMap::new();
        for m in members {
            let terms = Terms::of(&m);
            families
                .entry(terms.family())
                .or_default()
                .entry(terms)
                .or_default()
                .push(m);
        }
        let mut groups = Vec::new();
        for (family, by_terms) in families {
            match partitioned(&family, &by_terms, instance) {
                Some(group) => groups.push(group),
                None => {
                    for (terms, members) in by_terms {
                        groups.extend(chunked(&terms, members, instance));
                    }
                }
            }
        }
        Plan { groups }
    }

    /// The entry that serves `policy`, if it is served.
    pub fn group_of(&self, policy: &str) -> Option<&Group> {
        self.groups
            .iter()
            .find(|g| g.members.iter().any(|m| m.name == policy))
    }

    /// The entry written as configuration `name`, if it is planned.
    pub fn group_named(&self, name: &str) -> Option<&Group> {
        self.groups.iter().find(|g| g.configuration == name)
    }

    pub fn groups(&self) -> &[Group] {
        &self.groups
    }
}

/// Policies under equal terms, in entries of at most [`MAX_MEMBERS`].
fn chunked(terms: &Terms, mut members: Vec<Member>, instance: &str) -> Vec<Group> {
    members.sort_by(|a, b| a.name.cmp(&b.name));
    let id = terms_id(instance, terms);
    let chunks = members.len().div_ceil(MAX_MEMBERS);
    let mut rest = members.into_iter();
    let mut groups = Vec::with_capacity(chunks);
    for chunk in 0..chunks {
        let members: Vec<Member> = rest.by_ref().take(MAX_MEMBERS).collect();
        groups.push(match &members[..] {
            [only] => Group {
                configuration: webhook_configuration_name(&only.name),
                webhook: webhook_name(&only.name),
                members,
                cells: Vec::new(),
            },
            _ => {
                let suffix = if chunk == 0 {
                    id.clone()
                } else {
                    format!("{id}-{chunk}")
                };
                shared(&suffix, members, Vec::new())
            }
        });
    }
    groups
}

fn shared(suffix: &str, members: Vec<Member>, cells: Vec<Cell>) -> Group {
    Group {
        configuration: format!("{SHARED_PREFIX}{suffix}"),
        webhook: format!("group-{suffix}.splice.dev"),
        members,
        cells,
    }
}

/// One partitioned group for a family whose members differ only in their namespace selectors,
/// when it fits: two selectors or more, [`MAX_MEMBERS`] members, [`MAX_CELLS`] cells.
fn partitioned(
    family: &Terms,
    by_terms: &BTreeMap<Terms, Vec<Member>>,
    instance: &str,
) -> Option<Group> {
    let count: usize = by_terms.values().map(Vec::len).sum();
    if by_terms.len() < 2 || count > MAX_MEMBERS {
        return None;
    }
    let selectors: Vec<Vec<LabelSelectorRequirement>> = by_terms
        .values()
        .map(|ms| requirements(ms.first().and_then(|m| m.spec.namespace_selector.as_ref())))
        .collect();
    let parts = partition(&selectors)?;
    let mut members: Vec<(usize, Member)> = by_terms
        .values()
        .enumerate()
        .flat_map(|(s, ms)| ms.iter().map(move |m| (s, m.clone())))
        .collect();
    members.sort_by(|a, b| a.1.name.cmp(&b.1.name));
    let cells = parts
        .into_iter()
        .map(|(held, namespace)| Cell {
            namespace,
            members: members
                .iter()
                .enumerate()
                .filter(|(_, (s, _))| held.contains(s))
                .map(|(i, _)| i)
                .collect(),
        })
        .collect();
    let members = members.into_iter().map(|(_, m)| m).collect();
    Some(shared(&terms_id(instance, family), members, cells))
}

/// The namespaces, split by which of `selectors` hold there: for every non-empty set of
/// selectors that can hold together, the requirements under which exactly those hold (theirs,
/// and for each other selector r1..r(i-1) and not ri, one disjoint piece per i, as in
/// [`canary_split`]). Cells are disjoint, so a namespace matches one at most, and one exactly
/// when any selector holds. Unsatisfiable cells are dropped. Cells holding fewer selectors come
/// first: a namespace that opts in to more selectors moves to a later cell, so a relabel that
/// lands while the API server walks the cells makes it call the old cell, the new one or both
/// (the same policies twice, which injection tolerates), never neither. A relabel that trades one
/// selector for another can match neither in that window (see docs/design.md). `None` past
/// [`MAX_SELECTORS`] or [`MAX_CELLS`].
pub fn partition(
    selectors: &[Vec<LabelSelectorRequirement>],
) -> Option<Vec<(Vec<usize>, Vec<LabelSelectorRequirement>)>> {
    let k = selectors.len();
    if k > MAX_SELECTORS {
        return None;
    }
    let mut cells = Vec::new();
    for mask in 1u32..(1 << k) {
        let held: Vec<usize> = (0..k).filter(|i| mask & (1 << i) != 0).collect();
        let mut pieces: Vec<Vec<LabelSelectorRequirement>> =
            vec![held.iter().flat_map(|&i| selectors[i].clone()).collect()];
        for other in (0..k).filter(|j| mask & (1 << j) == 0) {
            let mut next = Vec::new();
            for piece in &pieces {
                for (i, r) in selectors[other].iter().enumerate() {
                    let mut narrower: Vec<LabelSelectorRequirement> = piece.clone();
                    narrower.extend(selectors[other][..i].iter().cloned());
                    narrower.push(negate(r));
                    if satisfiable(&narrower) {
                        next.push(narrower);
                    }
                }
            }
            if next.len() > MAX_CELLS {
                return None;
            }
            pieces = next;
        }
        for mut piece in pieces.into_iter().filter(|p| satisfiable(p)) {
            let mut seen = Vec::with_capacity(piece.len());
            piece.retain(|r| {
                let new = !seen.contains(r);
                if new {
                    seen.push(r.clone());
                }
                new
            });
            cells.push((held.clone(), piece));
        }
        if cells.len() > MAX_CELLS {
            return None;
        }
    }
    cells.sort_by_key(|(held, _)| held.len());
    Some(cells)
}

fn satisfiable(requirements: &[LabelSelectorRequirement]) -> bool {
    crate::selector::Selector::read(Some(&LabelSelector {
        match_labels: None,
        match_expressions: Some(requirements.to_vec()),
    }))
    .satisfiable()
}

/// Name of the MutatingWebhookConfiguration that serves `policy`.
pub fn webhook_configuration_name(policy: &str) -> String {
    format!("splice-{policy}")
}

/// Name of the single webhook inside that configuration.
pub fn webhook_name(policy: &str) -> String {
    format!("{policy}.splice.dev")
}

/// The webhook name inside configuration `configuration`, as [`Plan::new`] names it.
pub fn webhook_name_of(configuration: &str) -> Option<String> {
    if let Some(suffix) = configuration.strip_prefix(SHARED_PREFIX) {
        return Some(format!("group-{suffix}.splice.dev"));
    }
    configuration.strip_prefix("splice-").map(webhook_name)
}

/// The path of the entry that applies `names` in this order, one segment each: the API server
/// refuses a Service reference whose path has a segment that is not a DNS-1123 subdomain, so a
/// comma-separated list only ever worked with `--webhook-url`.
pub fn entry_path<'n>(names: impl IntoIterator<Item = &'n str>) -> String {
    let mut path = String::from(PATH_PREFIX);
    for (i, name) in names.into_iter().enumerate() {
        if i > 0 {
            path.push('/');
        }
        path.push_str(name);
    }
    path
}

/// An entry's path as the webhook reads it: the policies it names, in the order they apply, and
/// whether it is a canary's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryPath<'a> {
    names: &'a str,
    canary: bool,
}

impl<'a> EntryPath<'a> {
    /// `None` for a path that is no entry's: another prefix, an empty name, a canary's naming
    /// more than one. Names are separated by `/`, or by `,` in the entries earlier versions wrote
    /// (with `--webhook-url`); a policy name holds neither.
    pub fn parse(path: &'a str) -> Option<Self> {
        if let Some(policy) = path.strip_prefix(CANARY_PATH_PREFIX) {
            let one = !policy.is_empty() && !policy.contains(SEPARATORS);
            return one.then_some(Self {
                names: policy,
                canary: true,
            });
        }
        let names = path.strip_prefix(PATH_PREFIX)?;
        names
            .split(SEPARATORS)
            .all(|n| !n.is_empty())
            .then_some(Self {
                names,
                canary: false,
            })
    }

    /// The policies, by name: a canary's entry names its policy, whose canary revision is
    /// stored under [`Self::key`].
    pub fn names(self) -> impl Iterator<Item = &'a str> {
        self.names.split(SEPARATORS)
    }

    /// Where the webhook finds what `name` (one of [`Self::names`]) serves on this entry.
    pub fn key<'n>(self, name: &'n str) -> std::borrow::Cow<'n, str> {
        if self.canary {
            canary_key(name).into()
        } else {
            name.into()
        }
    }

    /// More names than any entry [`Plan::new`] writes: refused rather than looked up.
    pub fn too_long(self) -> bool {
        self.names().nth(MAX_MEMBERS).is_some()
    }
}

/// Whether every spec has the same object selector, an empty and an absent one alike.
fn one_object_selector<'s>(mut specs: impl Iterator<Item = &'s InjectionPolicySpec>) -> bool {
    let Some(first) = specs.next() else {
        return true;
    };
    specs.all(|s| same_selector(first.object_selector.as_ref(), s.object_selector.as_ref()))
}

/// `canonical(a) == canonical(b)` without building either: [`selection`] runs on every admission
/// request, where a clone and a JSON rendering per member per call would be waste.
fn same_selector(a: Option<&LabelSelector>, b: Option<&LabelSelector>) -> bool {
    fn labels(s: Option<&LabelSelector>) -> Option<&BTreeMap<String, String>> {
        s.and_then(|s| s.match_labels.as_ref())
            .filter(|m| !m.is_empty())
    }
    fn expressions(s: Option<&LabelSelector>) -> Option<&Vec<LabelSelectorRequirement>> {
        s.and_then(|s| s.match_expressions.as_ref())
            .filter(|e| !e.is_empty())
    }
    labels(a) == labels(b) && expressions(a) == expressions(b)
}

/// Who decides the selectors for one call of an entry. An entry carries its policies' common
/// namespace selector, and their object selector only when they all have the same one (see
/// [`Group::object_selector`]): then the API server decided both; otherwise the engine decides
/// each object selector from the pod's labels. UPDATE entries are only shared by policies with
/// one object selector (the API server also matches the old object, which the engine does not
/// see), so the API server decides those.
pub fn selection(policies: &[&CompiledPolicy], operation: Operation) -> Selection {
    if operation == Operation::Update || one_object_selector(policies.iter().map(|p| p.spec())) {
        Selection::ByApiServer
    } else {
        Selection::NamespaceByApiServer
    }
}

/// What a policy that fails inside a call (its template cannot be rendered for this pod) does
/// to the call of its entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberFailure {
    /// The call fails, and the API server applies the entry's failure policy.
    FailsTheCall,
    /// The policy is left out with [`left_out_warning`]; the entry's other policies inject.
    LeftOut,
}

/// The one rule for a failing policy, for the webhook and for the offline replay. Alone in its
/// entry, it fails the call and the API server applies its failure policy. In a shared entry
/// (`members` counts every policy the call names, loaded or not), one that asks for `Fail` fails
/// the call too, refusing the pod as its own webhook would; one that asks for `Ignore` is left
/// out, so the others still inject, as separate webhooks would: sharing an entry must not change
/// what a pod gets.
pub fn member_failure(members: usize, requested: FailurePolicy) -> MemberFailure {
    match requested {
        FailurePolicy::Ignore if members > 1 => MemberFailure::LeftOut,
        FailurePolicy::Ignore | FailurePolicy::Fail => MemberFailure::FailsTheCall,
    }
}

/// The response warning naming a policy [`member_failure`] left out, and why.
pub fn left_out_warning(policy: &str, error: &dyn std::fmt::Display) -> String {
    format!("splice policy {policy} did not inject (failurePolicy Ignore): {error}")
}

fn terms_id(instance: &str, terms: &Terms) -> String {
    let mut hash = Sha256::new();
    hash.update(instance.as_bytes());
    hash.update([0]);
    hash.update(format!("{terms:?}").as_bytes());
    let digest = hash.finalize();
    digest.iter().take(5).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use splice_crds::ReinvocationPolicy;

    #[test]
    fn a_failing_policy_fails_the_call_alone_or_under_fail_and_is_left_out_of_a_shared_ignore_entry()
     {
        use MemberFailure::{FailsTheCall, LeftOut};
        assert_eq!(member_failure(1, FailurePolicy::Ignore), FailsTheCall);
        assert_eq!(member_failure(1, FailurePolicy::Fail), FailsTheCall);
        assert_eq!(member_failure(2, FailurePolicy::Fail), FailsTheCall);
        assert_eq!(member_failure(2, FailurePolicy::Ignore), LeftOut);
        assert_eq!(member_failure(MAX_MEMBERS, FailurePolicy::Ignore), LeftOut);
        let warning = left_out_warning("b-broken", &"spec.template.env[0].value: undefined");
        assert_eq!(
            warning,
            "splice policy b-broken did not inject (failurePolicy Ignore): \
             spec.template.env[0].value: undefined"
        );
    }

    #[test]
    fn a_canary_is_open_only_with_a_promoted_revision_other_than_the_template_in_force() {
        let spec = |canary: bool| {
            let mut spec = InjectionPolicySpec::default();
            let yaml = if canary {
                "canary: {objectSelector: {matchLabels: {track: canary}}}"
            } else {
                "{}"
            };
            spec.rollout = Some(serde_yaml::from_str(yaml).unwrap());
            spec
        };
        let promoted = StableRevision {
            template_hash: "old".into(),
            generation: 1,
            spec: serde_json::json!({}),
        };
        let with_canary = spec(true);
        let (canary, stable) = open_canary(&with_canary, Some(&promoted), "new").unwrap();
        assert!(canary.object_selector.is_some());
        assert_eq!(stable.template_hash, "old");
        // Promoted already: the template in force is the pinned one.
        assert!(open_canary(&with_canary, Some(&promoted), "old").is_none());
        // Nothing promoted yet: nothing to pin.
        assert!(open_canary(&with_canary, None, "new").is_none());
        // No canary asked for.
        assert!(open_canary(&spec(false), Some(&promoted), "new").is_none());
        assert!(open_canary(&InjectionPolicySpec::default(), Some(&promoted), "new").is_none());
    }

    #[test]
    fn same_selector_agrees_with_the_canonical_text() {
        let labels = |pairs: &[(&str, &str)]| LabelSelector {
            match_labels: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..LabelSelector::default()
        };
        let exists = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "k".into(),
                operator: "Exists".into(),
                values: None,
            }]),
            ..LabelSelector::default()
        };
        let empty_lists = LabelSelector {
            match_labels: Some(BTreeMap::new()),
            match_expressions: Some(Vec::new()),
        };
        let all = [
            None,
            Some(LabelSelector::default()),
            Some(empty_lists),
            Some(labels(&[("a", "1")])),
            Some(labels(&[("a", "2")])),
            Some(exists),
        ];
        for a in &all {
            for b in &all {
                assert_eq!(
                    same_selector(a.as_ref(), b.as_ref()),
                    canonical(a.as_ref()) == canonical(b.as_ref()),
                    "{a:?} vs {b:?}"
                );
            }
        }
    }

    #[test]
    fn a_path_reads_back_the_names_it_was_built_from_in_order() {
        let path = entry_path(["env", "logs", "mesh"]);
        assert_eq!(path, "/inject/env/logs/mesh");
        let parsed = EntryPath::parse(&path).expect("an entry path");
        assert_eq!(parsed.names().collect::<Vec<_>>(), ["env", "logs", "mesh"]);
        assert!(!parsed.too_long());
        // What earlier versions wrote still reads.
        let earlier = EntryPath::parse("/inject/env,logs,mesh").expect("an entry path");
        assert_eq!(earlier.names().collect::<Vec<_>>(), ["env", "logs", "mesh"]);
    }

    #[test]
    fn every_segment_of_a_shared_or_canary_entrys_path_is_a_dns_subdomain_as_a_service_path_needs()
    {
        let names = ["a-mesh", "b.logs", "c0"];
        let path = entry_path(names);
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        assert_eq!(segments, ["inject", "a-mesh", "b.logs", "c0"]);
        let canary = canary_path("b.logs");
        assert_eq!(canary, "/inject-canary/b.logs");
        let subdomain = |s: &str| {
            !s.is_empty()
                && s.len() <= 253
                && s.split('.').all(|label| {
                    !label.is_empty()
                        && label
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                })
        };
        assert!(segments.iter().all(|s| subdomain(s)), "{path}");
        assert!(
            canary.trim_start_matches('/').split('/').all(subdomain),
            "{canary}"
        );
    }

    #[test]
    fn paths_that_are_no_entrys_are_not_read() {
        for path in [
            "/validate",
            "/inject/",
            "/inject/a,,b",
            "/inject/a//b",
            "/inject/a/",
            "/injectx",
            "/inject-canary/",
            "/inject-canary/a/b",
            "/inject-canary/a,b",
        ] {
            assert_eq!(EntryPath::parse(path), None, "{path}");
        }
    }

    #[test]
    fn a_path_naming_more_policies_than_an_entry_holds_is_too_long() {
        let names: Vec<String> = (0..=MAX_MEMBERS).map(|i| format!("p{i}")).collect();
        let full = entry_path(names.iter().take(MAX_MEMBERS).map(String::as_str));
        assert!(!EntryPath::parse(&full).expect("path").too_long());
        let over = entry_path(names.iter().map(String::as_str));
        assert!(EntryPath::parse(&over).expect("path").too_long());
    }

    fn member(name: &str, edit: impl FnOnce(&mut InjectionPolicySpec)) -> Member {
        let mut spec = InjectionPolicySpec {
            operations: vec![Operation::Create],
            timeout_seconds: 10,
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("team".into(), "shop".into())])),
                match_expressions: None,
            }),
            ..InjectionPolicySpec::default()
        };
        edit(&mut spec);
        Member {
            name: name.into(),
            uid: format!("uid-{name}"),
            spec,
            failure_policy: FailurePolicy::Ignore,
            canary: None,
        }
    }

    fn labels(k: &str, v: &str) -> Option<LabelSelector> {
        Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(k.into(), v.into())])),
            match_expressions: None,
        })
    }

    #[test]
    fn policies_under_the_same_terms_share_one_entry_in_name_order() {
        let plan = Plan::new(
            [
                member("logs", |_| {}),
                member("mesh", |s| s.object_selector = labels("mesh", "on")),
                member("env", |_| {}),
            ],
            "splice-system",
        );
        assert_eq!(plan.groups().len(), 1);
        let g = &plan.groups()[0];
        assert_eq!(g.names(), ["env", "logs", "mesh"]);
        assert!(
            g.configuration.starts_with("splice--group-"),
            "{}",
            g.configuration
        );
        assert_eq!(g.path(), "/inject/env/logs/mesh");
        assert_eq!(
            webhook_name_of(&g.configuration).as_deref(),
            Some(g.webhook.as_str())
        );
        // Different object selectors: the entry carries none, the webhook decides each.
        assert_eq!(g.object_selector(), None);
    }

    #[test]
    fn a_policy_alone_keeps_its_own_configuration_names() {
        let plan = Plan::new([member("mesh", |_| {})], "splice-system");
        let g = plan.group_of("mesh").unwrap();
        assert_eq!(g.configuration, "splice-mesh");
        assert_eq!(g.webhook, "mesh.splice.dev");
        assert_eq!(g.path(), "/inject/mesh");
        assert_eq!(
            webhook_name_of("splice-mesh").as_deref(),
            Some("mesh.splice.dev")
        );
    }

    #[test]
    fn different_terms_are_never_merged() {
        let plan = Plan::new(
            [
                member("a", |_| {}),
                member("b", |s| s.timeout_seconds = 5),
                member("c", |s| s.reinvocation_policy = ReinvocationPolicy::Never),
                member("d", |s| {
                    s.operations = vec![Operation::Create, Operation::Update]
                }),
                Member {
                    failure_policy: FailurePolicy::Fail,
                    ..member("f", |s| s.failure_policy = FailurePolicy::Fail)
                },
                // Asks for Fail, which the availability guard holds at Ignore.
                member("g", |s| s.failure_policy = FailurePolicy::Fail),
            ],
            "splice-system",
        );
        assert_eq!(plan.groups().len(), 6);
        assert!(plan.groups().iter().all(|g| !g.is_shared()));
    }

    #[test]
    fn update_policies_share_only_with_the_same_object_selector() {
        let both = |name: &str, sel: Option<LabelSelector>| {
            member(name, |s| {
                s.operations = vec![Operation::Update, Operation::Create];
                s.object_selector = sel;
            })
        };
        let plan = Plan::new(
            [
                both("a", labels("x", "1")),
                both("b", labels("x", "1")),
                both("c", labels("x", "2")),
            ],
            "splice-system",
        );
        assert_eq!(plan.group_of("a").unwrap().names(), ["a", "b"]);
        assert_eq!(
            plan.group_of("a").unwrap().object_selector(),
            labels("x", "1").as_ref()
        );
        assert!(!plan.group_of("c").unwrap().is_shared());
    }

    #[test]
    fn a_shared_entry_keeps_its_name_as_policies_join_and_leave() {
        let two = Plan::new([member("a", |_| {}), member("b", |_| {})], "splice-system");
        let three = Plan::new(
            [
                member("a", |_| {}),
                member("b", |_| {}),
                member("c", |_| {}),
            ],
            "splice-system",
        );
        assert_eq!(
            two.group_of("a").unwrap().configuration,
            three.group_of("c").unwrap().configuration
        );
        let other_instance = Plan::new([member("a", |_| {}), member("b", |_| {})], "elsewhere");
        assert_ne!(
            two.group_of("a").unwrap().configuration,
            other_instance.group_of("a").unwrap().configuration
        );
    }

    #[test]
    fn a_large_group_is_split_into_entries_of_bounded_size() {
        let plan = Plan::new(
            (0..MAX_MEMBERS + 3).map(|i| member(&format!("p{i:03}"), |_| {})),
            "splice-system",
        );
        let sizes: Vec<usize> = plan.groups().iter().map(|g| g.members.len()).collect();
        assert_eq!(sizes, [MAX_MEMBERS, 3]);
        assert_ne!(
            plan.groups()[0].configuration,
            plan.groups()[1].configuration
        );
    }

    #[test]
    fn equal_selectors_written_differently_still_share() {
        let plan = Plan::new(
            [
                member("a", |s| s.namespace_selector = None),
                member("b", |s| {
                    s.namespace_selector = Some(LabelSelector::default())
                }),
                member("c", |s| {
                    s.namespace_selector = Some(LabelSelector {
                        match_labels: Some(BTreeMap::new()),
                        match_expressions: Some(vec![]),
                    })
                }),
            ],
            "splice-system",
        );
        assert_eq!(plan.groups().len(), 1);
    }

    fn expression(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn selector_of(requirements: &[LabelSelectorRequirement]) -> crate::selector::Selector {
        crate::selector::Selector::read(Some(&LabelSelector {
            match_labels: None,
            match_expressions: Some(requirements.to_vec()),
        }))
    }

    proptest::proptest! {
        /// Every pair of namespace and pod labels is sent to exactly one part of the split, and
        /// to the canary's exactly when the canary's selectors match it.
        #[test]
        fn a_canary_split_sends_every_pod_to_exactly_one_entry(
            ns in proptest::collection::btree_map("[abc]", "[xy]", 0..3),
            pod in proptest::collection::btree_map("[abc]", "[xy]", 0..3),
        ) {
            let canary = Canary {
                namespace_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("a".into(), "x".into())])),
                    match_expressions: Some(vec![expression("b", "DoesNotExist", &[])]),
                }),
                object_selector: Some(LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![
                        expression("c", "NotIn", &["y"]),
                        expression("a", "Exists", &[]),
                    ]),
                }),
            };
            let splits = canary_split(&canary);
            let matching: Vec<&Split> = splits
                .iter()
                .filter(|s| {
                    selector_of(&s.namespace).matches(|k| ns.get(k).map(String::as_str))
                        && selector_of(&s.object).matches(|k| pod.get(k).map(String::as_str))
                })
                .collect();
            proptest::prop_assert_eq!(matching.len(), 1);
            let in_canary = CanaryScope::of(&canary).holds(Some(&ns), &pod);
            proptest::prop_assert_eq!(!matching[0].stable, in_canary);
        }
    }

    #[test]
    fn an_open_canary_gets_its_own_entry_for_the_canary_and_one_per_requirement_for_the_rest() {
        let mut m = member("mesh", |_| {});
        m.canary = Some(Canary {
            namespace_selector: labels("tier", "canary"),
            object_selector: Some(LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![expression("track", "Exists", &[])]),
            }),
        });
        let other = member("other", |_| {});
        let plan = Plan::new([m, other], "i");
        let group = plan.group_of("mesh").expect("served");
        assert_eq!(group.names(), ["mesh"], "an open canary shares no entry");
        let entries = group.entries();
        let paths: Vec<(&str, &str)> = entries
            .iter()
            .map(|e| (e.webhook.as_str(), e.path.as_str()))
            .collect();
        assert_eq!(
            paths,
            [
                ("mesh.splice.dev", "/inject-canary/mesh"),
                ("stable-1.mesh.splice.dev", "/inject/mesh"),
                ("stable-2.mesh.splice.dev", "/inject/mesh"),
            ]
        );
        assert_eq!(
            entries[1].namespace,
            [expression("tier", "NotIn", &["canary"])]
        );
        assert_eq!(
            (&entries[2].namespace, &entries[2].object),
            (
                &vec![expression("tier", "In", &["canary"])],
                &vec![expression("track", "DoesNotExist", &[])]
            )
        );
        let parsed = EntryPath::parse(&entries[0].path).expect("an entry path");
        assert_eq!(parsed.names().collect::<Vec<_>>(), ["mesh"]);
        assert_eq!(parsed.key("mesh"), canary_key("mesh"));
        let stable = EntryPath::parse(&entries[1].path).expect("an entry path");
        assert_eq!(stable.key("mesh"), "mesh");
    }

    fn on(key: &str) -> Option<LabelSelector> {
        Some(LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![expression(key, "Exists", &[])]),
        })
    }

    #[test]
    fn policies_with_different_namespace_selectors_share_one_configuration_of_disjoint_cells() {
        let plan = Plan::new(
            [
                member("mesh", |s| s.namespace_selector = on("mesh")),
                member("logs", |s| s.namespace_selector = on("logs")),
                member("audit", |s| s.namespace_selector = on("logs")),
                member("trace", |s| s.namespace_selector = labels("team", "shop")),
            ],
            "splice-system",
        );
        assert_eq!(plan.groups().len(), 1);
        let g = &plan.groups()[0];
        assert_eq!(g.names(), ["audit", "logs", "mesh", "trace"]);
        assert_eq!(g.namespace_selector(), None);
        let entries = g.entries();
        // Three selectors: seven sets of them can hold, each one cell, those holding one first.
        assert_eq!(entries.len(), 7);
        assert_eq!(
            entries.last().map(|e| e.path.as_str()),
            Some("/inject/audit/logs/mesh/trace")
        );
        let only_mesh = entries
            .iter()
            .find(|e| e.path == "/inject/mesh")
            .expect("a cell for mesh alone");
        assert_eq!(
            only_mesh.namespace,
            [
                expression("mesh", "Exists", &[]),
                expression("logs", "DoesNotExist", &[]),
                expression("team", "NotIn", &["shop"]),
            ]
        );
        let names: std::collections::BTreeSet<&str> =
            entries.iter().map(|e| e.webhook.as_str()).collect();
        assert_eq!(names.len(), entries.len(), "webhook names are unique");
    }

    #[test]
    fn a_cell_whose_policies_share_an_object_selector_carries_it_for_the_api_server() {
        // Selected everywhere but only pods labelled `e`, next to a policy of one namespace with
        // no object selector: the call for `everywhere` alone must not reach unlabelled pods.
        let plan = Plan::new(
            [
                member("everywhere", |s| {
                    s.namespace_selector = None;
                    s.object_selector = labels("e", "1");
                }),
                member("scoped", |s| s.namespace_selector = on("team")),
            ],
            "splice-system",
        );
        let g = &plan.groups()[0];
        assert_eq!(g.object_selector(), None);
        let entries = g.entries();
        let alone = entries
            .iter()
            .find(|e| e.path == "/inject/everywhere")
            .unwrap_or_else(|| panic!("a cell for `everywhere` alone: {entries:?}"));
        assert_eq!(alone.object, [expression("e", "In", &["1"])]);
        let both = entries
            .iter()
            .find(|e| e.path == "/inject/everywhere/scoped")
            .expect("a cell for both");
        assert!(
            both.object.is_empty(),
            "the webhook decides mixed selectors"
        );
        // No namespace has `scoped` without `everywhere`: that cell is left out.
        assert_eq!(entries.len(), 2);
    }

    #[test]
    fn cells_that_no_namespace_can_match_are_left_out() {
        // team=a and team=b never hold together.
        let plan = Plan::new(
            [
                member("a", |s| s.namespace_selector = labels("team", "a")),
                member("b", |s| s.namespace_selector = labels("team", "b")),
            ],
            "splice-system",
        );
        let paths: Vec<String> = plan.groups()[0]
            .entries()
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(paths, ["/inject/a", "/inject/b"]);
    }

    #[test]
    fn a_family_needing_too_many_cells_keeps_one_entry_per_selector() {
        let wide = |key: &str| {
            Some(LabelSelector {
                match_labels: None,
                match_expressions: Some(
                    (0..4)
                        .map(|i| expression(&format!("{key}{i}"), "Exists", &[]))
                        .collect(),
                ),
            })
        };
        let plan = Plan::new(
            [
                member("a", |s| s.namespace_selector = wide("a")),
                member("b", |s| s.namespace_selector = wide("b")),
                member("c", |s| s.namespace_selector = wide("c")),
            ],
            "splice-system",
        );
        assert_eq!(plan.groups().len(), 3);
        assert!(plan.groups().iter().all(|g| g.cells.is_empty()));
    }

    #[test]
    fn a_partitioned_configuration_keeps_its_name_as_selectors_join() {
        let two = Plan::new(
            [
                member("a", |s| s.namespace_selector = on("x")),
                member("b", |s| s.namespace_selector = on("y")),
            ],
            "splice-system",
        );
        let three = Plan::new(
            [
                member("a", |s| s.namespace_selector = on("x")),
                member("b", |s| s.namespace_selector = on("y")),
                member("c", |s| s.namespace_selector = on("z")),
            ],
            "splice-system",
        );
        assert_eq!(
            two.groups()[0].configuration,
            three.groups()[0].configuration
        );
    }

    fn requirement_strategy() -> impl proptest::strategy::Strategy<Value = LabelSelectorRequirement>
    {
        use proptest::prelude::*;
        (
            "[abc]",
            prop_oneof![
                Just("In"),
                Just("NotIn"),
                Just("Exists"),
                Just("DoesNotExist")
            ],
            proptest::collection::btree_set("[xyz]", 1..3),
        )
            .prop_map(|(key, op, values)| LabelSelectorRequirement {
                key,
                operator: op.to_owned(),
                values: matches!(op, "In" | "NotIn").then(|| values.into_iter().collect()),
            })
    }

    proptest::proptest! {
        /// For any namespace labels, the API server calls at most one cell, one exactly when any
        /// selector holds, and that cell's members are exactly the policies whose selectors hold.
        #[test]
        fn a_partition_sends_every_namespace_to_the_one_cell_of_exactly_the_selectors_that_hold(
            selectors in proptest::collection::vec(
                proptest::collection::vec(requirement_strategy(), 0..3), 2..5),
            ns in proptest::collection::btree_map("[abc]", "[xyz]", 0..4),
        ) {
            let Some(cells) = partition(&selectors) else {
                return Ok(());
            };
            let get = |k: &str| ns.get(k).map(String::as_str);
            let holding: Vec<usize> = (0..selectors.len())
                .filter(|&i| selector_of(&selectors[i]).matches(get))
                .collect();
            let matching: Vec<&(Vec<usize>, Vec<LabelSelectorRequirement>)> = cells
                .iter()
                .filter(|(_, reqs)| selector_of(reqs).matches(get))
                .collect();
            if holding.is_empty() {
                proptest::prop_assert!(matching.is_empty());
            } else {
                proptest::prop_assert_eq!(matching.len(), 1);
                proptest::prop_assert_eq!(&matching[0].0, &holding);
            }
            // Opting in to more selectors never moves a namespace to an earlier cell.
            for pair in cells.windows(2) {
                proptest::prop_assert!(pair[0].0.len() <= pair[1].0.len());
            }
        }

        /// `satisfiable` agrees with a search over every labelling of the keys involved, by the
        /// values mentioned and one that is not.
        #[test]
        fn a_selector_is_satisfiable_exactly_when_some_labels_match_it(
            reqs in proptest::collection::vec(requirement_strategy(), 0..5),
        ) {
            let selector = selector_of(&reqs);
            let choices = ["", "x", "y", "z", "fresh"];
            let mut found = false;
            for code in 0..choices.len().pow(3) {
                let mut labels = BTreeMap::new();
                for (i, key) in ["a", "b", "c"].iter().enumerate() {
                    let c = choices[(code / choices.len().pow(i as u32)) % choices.len()];
                    if !c.is_empty() {
                        labels.insert(*key, c);
                    }
                }
                if selector.matches(|k| labels.get(k).copied()) {
                    found = true;
                    break;
                }
            }
            proptest::prop_assert_eq!(selector.satisfiable(), found);
        }
    }
}
