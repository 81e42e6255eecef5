//! The rollout's I/O, what [`super::decide`] decided and nothing more: the restarts with their
//! dry-run check, the in-place updates and resize records, each after a last leadership check;
//! the reads of pods to sort and prove, and of a failed workload's pods.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use splice_crds::InjectionPolicy;
use splice_engine::change::Path;
use splice_engine::{CompiledPolicy, Exclusions, NamespaceContext};

use super::decide::{InPlace, recorded_version};
use super::plan::{self, PodRef, WorkloadRef};
use super::pods::{self, RESIZE_UNSERVED, Sorted};
use super::{Caches, dry_run, restart, template_of, what_failed};
use crate::leader::Leadership;

/// Pods read at once.
const READS_IN_FLIGHT: usize = 16;

/// What the rollout's acts and looks go through.
pub struct Io {
    pub(super) client: Client,
    pub(super) caches: Caches,
    pub(super) exclusions: Exclusions,
    pub(super) trust_domain: String,
    /// Checked before each write of an act that makes several.
    pub(super) leading: Leadership,
    /// Set by the first resize the API server does not serve: later ones restart at once.
    pub(super) resize_unserved: AtomicBool,
}

/// A policy's revision, as an act names it.
#[derive(Clone)]
pub struct Of {
    pub policy: Arc<InjectionPolicy>,
    pub name: String,
    pub revision: String,
    /// With `spec.overrides`, by namespace: the mark a restart there records with the revision.
    pub marks: BTreeMap<String, String>,
}

/// One of the rollout's writes.
pub enum Act {
    /// A plan's restarts in its order, and the namespaces where its revision is verified.
    Restart(Of, Vec<WorkloadRef>, HashSet<String>),
    /// A plan's in-place updates, each pod read and sorted again first.
    Update(Of, Arc<CompiledPolicy>, Vec<(PodRef, NamespaceContext)>),
    /// The record of a resize the kubelet made.
    Record(InPlace),
}

/// One of the rollout's reads.
pub enum Look {
    /// A pod to sort, and the version it carries.
    Sort(InPlace, String),
    /// A pod updated in place, whose proof to read.
    Prove(InPlace),
    /// A workload whose timeout halts the policy's rollout: what its pods show.
    WhatFailed(String, WorkloadRef),
}

/// What one in-place update came to.
pub enum Updated {
    Written {
        resize: bool,
        at: Timestamp,
    },
    /// Its change needs a restart after all.
    NotInPlace(Sorted),
    /// It changed since it was read: sorted again.
    Stale,
}

/// What an act or a look came to.
pub enum Seen {
    /// Namespaces newly verified, and the workloads restarted: (workload, restartedFor, at).
    Restarted(Of, Vec<String>, Vec<(WorkloadRef, String, Timestamp)>),
    Updated(Of, Vec<(PodRef, Updated)>),
    /// When the record was written; `None` when it was not.
    Recorded(InPlace, Option<Timestamp>),
    Sorted(InPlace, String, Box<Pod>),
    Proved(InPlace, Box<Pod>),
    /// The policy, and what the failed workload's pods show.
    Failed(String, Option<String>),
    /// A pod gone, or not read (logged).
    Nothing,
}

pub async fn act(io: &Io, act: Act) -> Seen {
    match act {
        Act::Restart(of, workloads, verified) => restart_planned(io, of, workloads, verified).await,
        Act::Update(of, compiled, pods) => update_planned(io, of, &compiled, pods).await,
        Act::Record(p) => record(io, p).await,
    }
}

pub async fn look(io: &Io, looks: Vec<Look>) -> Vec<Seen> {
    futures::stream::iter(looks)
        .map(|l| read(io, l))
        .buffer_unordered(READS_IN_FLIGHT)
        .collect()
        .await
}

async fn read(io: &Io, look: Look) -> Seen {
    let (p, sort) = match look {
        Look::WhatFailed(policy, id) => {
            let detail = what_failed(&io.client, &io.caches, &id, &policy).await;
            return Seen::Failed(policy, detail);
        }
        Look::Sort(p, recorded) => (p, Some(recorded)),
        Look::Prove(p) => (p, None),
    };
    match pods::read(&io.client, &p.pod).await {
        Ok(Some(pod)) => match sort {
            Some(recorded) => Seen::Sorted(p, recorded, Box::new(pod)),
            None => Seen::Proved(p, Box::new(pod)),
        },
        Ok(None) => Seen::Nothing,
        Err(e) => {
            let what = if sort.is_some() {
                "not sorted"
            } else {
                "no proof read"
            };
            tracing::warn!(error = %e, label = e.label(), "rollout: {what}");
            Seen::Nothing
        }
    }
}

/// Restarts what the plan says, each after a last leadership check; before the first restart of
/// a revision into a namespace, a dry-run pod must come back with that revision.
async fn restart_planned(
    io: &Io,
    of: Of,
    workloads: Vec<WorkloadRef>,
    mut verified: HashSet<String>,
) -> Seen {
    let (mut newly, mut restarted) = (Vec::new(), Vec::new());
    for id in workloads {
        let Some(template) = template_of(&io.caches, &id) else {
            continue;
        };
        if !verified.contains(&id.namespace) {
            if let Err(e) = dry_run(&io.client, &id, &template, &of.name, &of.revision).await {
                tracing::warn!(policy = %of.name, error = %e, label = e.label(), "rollout: not restarting yet");
                continue;
            }
            verified.insert(id.namespace.clone());
            newly.push(id.namespace.clone());
        }
        if !io.leading.now() {
            break;
        }
        let mark = of.marks.get(&id.namespace).map(String::as_str);
        let value = plan::restarted_for(&of.name, &of.revision, mark);
        let now = Timestamp::now();
        match restart(&io.client, &id, &value, now).await {
            Ok(()) => {
                tracing::info!(policy = %of.name, workload = %id, revision = %of.revision, "rollout: restarted");
                restarted.push((id, value, now));
            }
            Err(e) => {
                tracing::warn!(policy = %of.name, error = %e, label = e.label(), "rollout: restart failed");
            }
        }
    }
    Seen::Restarted(of, newly, restarted)
}

/// Updates the planned pods in place, each read again and sorted again first (a pod changed
/// since is decided again, never overwritten), after a last leadership check.
async fn update_planned(
    io: &Io,
    of: Of,
    compiled: &CompiledPolicy,
    planned: Vec<(PodRef, NamespaceContext)>,
) -> Seen {
    let mut out = Vec::new();
    for (id, ns) in planned {
        let pod = match pods::read(&io.client, &id).await {
            Ok(Some(pod)) => pod,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(error = %e, label = e.label(), "rollout: not updated");
                continue;
            }
        };
        let change = match pods::sort(compiled, &pod, &ns, &io.exclusions, &io.trust_domain) {
            Ok(change) => change,
            Err(message) => {
                let e = pods::PodError::Sort { pod: id, message };
                tracing::warn!(error = %e, label = e.label(), "rollout: not updated");
                continue;
            }
        };
        let recorded = || recorded_version(&pod, &of.name);
        if !change.path.in_place() {
            let sorted = Sorted::of(&of.revision, &recorded(), &change.path);
            out.push((id, Updated::NotInPlace(sorted)));
            continue;
        }
        let resize = matches!(change.path, Path::Resize(_));
        if resize && io.resize_unserved.load(Ordering::Relaxed) {
            let sorted = Sorted::resize_unserved(&of.revision, &recorded());
            out.push((id, Updated::NotInPlace(sorted)));
            continue;
        }
        if !io.leading.now() {
            break;
        }
        match pods::write(&io.client, &id, &pod, &change, &of.name, &of.revision).await {
            Ok(()) => {
                tracing::info!(policy = %of.name, pod = %id, path = %change.path, "rollout: updated in place");
                let at = Timestamp::now();
                out.push((id, Updated::Written { resize, at }));
            }
            Err(e) if e.resize_unserved() => {
                if !io.resize_unserved.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "rollout: {RESIZE_UNSERVED}: resizes restart the pods' workloads instead");
                }
                let sorted = Sorted::resize_unserved(&of.revision, &recorded());
                out.push((id, Updated::NotInPlace(sorted)));
            }
            Err(e) => {
                tracing::warn!(error = %e, label = e.label(), "rollout: not updated");
                if e.stale() {
                    out.push((id, Updated::Stale));
                }
            }
        }
    }
    Seen::Updated(of, out)
}

/// Writes the record of a resize the kubelet made, on the pod read and sorted again.
async fn record(io: &Io, p: InPlace) -> Seen {
    let pod = match pods::read(&io.client, &p.pod).await {
        Ok(Some(pod)) => pod,
        Ok(None) => return Seen::Nothing,
        Err(e) => {
            tracing::warn!(error = %e, label = e.label(), "rollout: record after resize");
            return Seen::Recorded(p, None);
        }
    };
    let Ok(change) = pods::sort(
        &p.compiled,
        &pod,
        &p.namespace,
        &io.exclusions,
        &io.trust_domain,
    ) else {
        return Seen::Recorded(p, None);
    };
    let records = change.path.in_place() && !matches!(change.path, Path::Resize(_));
    if !records || !io.leading.now() {
        return Seen::Recorded(p, None);
    }
    match pods::write(&io.client, &p.pod, &pod, &change, &p.name, &p.revision).await {
        Ok(()) => Seen::Recorded(p, Some(Timestamp::now())),
        Err(e) => {
            tracing::warn!(error = %e, label = e.label(), "rollout: record after resize");
            Seen::Recorded(p, None)
        }
    }
}
