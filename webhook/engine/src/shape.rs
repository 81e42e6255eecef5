//! What a pod's patch depends on, as a key: pods of one template (a Deployment's replicas) get the
//! same patch, so the planner's answer for the first serves the rest.
//!
//! The key holds exactly what [`super::plan::plan`] reads from a pod that carries no
//! `splice.dev/status` annotation (a pod no Splice policy has touched; every other pod is planned
//! afresh): which objects, lists and maps are present; for each label and annotation the policy
//! sets, whether the pod has it with the same value, another, or not at all; the application
//! containers' names in order; and, per list, which of the policy's items the pod already holds by
//! name, as one bit per rendered item. Names of the pod's own items that no rendered item shares
//! (most env vars) do not change the patch and stay out of it, and so does everything the planner
//! does not read (images, the pod's name, its managedFields). Two pods with one key get one patch,
//! warnings included. Every field is fixed in size or prefixed with its length, so two different
//! sets of inputs never write the same bytes.

use splice_crds::Operation;

use super::plan::{Status, fingerprint};
use super::template::{RItem, Rendered};
use super::view::{self, PodView, Raw, Str};

/// A per-list bitmask needs at most this many rendered items; a larger policy is planned afresh.
const MAX_ITEMS: usize = 64;

/// Appends the key of `view` for `rendered` to `out`. False when the pod cannot share a patch: it
/// carries a status annotation, an annotation the policy sets is not a string (the planner reports
/// that as an error), or a rendered list is too long for a bitmask.
pub(crate) fn key(
    operation: Operation,
    view: &PodView<'_>,
    status: &Status,
    rendered: &Rendered<'_>,
    out: &mut Vec<u8>,
) -> bool {
    let lists = [
        &rendered.init_containers,
        &rendered.containers,
        &rendered.volumes,
        &rendered.env,
        &rendered.volume_mounts,
    ];
    if status.annotated || lists.iter().any(|l| l.len() > MAX_ITEMS) {
        return false;
    }
    let meta = view.metadata.as_ref();
    let annotations = meta.and_then(|m| m.annotations.as_ref());
    out.push(match operation {
        Operation::Create => b'C',
        _ => b'U',
    });
    let labels = meta.and_then(|m| m.labels.as_ref());
    out.extend_from_slice(&[
        u8::from(meta.is_some()),
        u8::from(labels.is_some()),
        u8::from(annotations.is_some()),
    ]);
    if let Some(labels) = labels {
        for (k, want) in &rendered.labels {
            out.push(match labels.get(k) {
                None => 0,
                Some(have) if **have == **want => 1,
                Some(_) => 2,
            });
        }
    }
    if let Some(annotations) = annotations {
        for (k, want) in &rendered.annotations {
            out.push(match annotations.get(k).map(decode) {
                None => 0,
                Some(Some(have)) if *have == **want => 1,
                Some(Some(_)) => 2,
                Some(None) => return false,
            });
        }
    }
    if operation != Operation::Create {
        return true;
    }

    let spec = view.spec.as_ref();
    let init = spec.and_then(|s| s.init_containers.as_deref());
    let containers = spec.and_then(|s| s.containers.as_deref());
    let volumes = spec.and_then(|s| s.volumes.as_deref());
    out.extend_from_slice(&[
        u8::from(spec.is_some()),
        u8::from(init.is_some()),
        u8::from(containers.is_some()),
        u8::from(volumes.is_some()),
    ]);
    // Containers and init containers share one name space: an injected one is skipped when the
    // pod already has either of that name.
    let occupied = init
        .into_iter()
        .flatten()
        .map(|c| c.name())
        .chain(containers.into_iter().flatten().map(|c| c.name()));
    push_mask(out, held(&rendered.init_containers, occupied.clone()));
    push_mask(out, held(&rendered.containers, occupied));
    push_mask(
        out,
        held(
            &rendered.volumes,
            volumes.into_iter().flatten().map(|v| v.name()),
        ),
    );
    if rendered.env.is_empty() && rendered.volume_mounts.is_empty() {
        return true;
    }
    // Env and mounts go to every container, by index, and the summary and the status name them.
    let containers = containers.unwrap_or(&[]);
    push_len(out, containers.len());
    for c in containers {
        push_len(out, c.name().len());
        out.extend_from_slice(c.name().as_bytes());
        let env = c.env.as_deref();
        out.push(u8::from(env.is_some()));
        push_mask(
            out,
            held(&rendered.env, env.into_iter().flatten().map(|e| e.name())),
        );
        let mounts = c.volume_mounts.as_deref();
        out.push(u8::from(mounts.is_some()));
        push_mask(
            out,
            held(
                &rendered.volume_mounts,
                mounts.into_iter().flatten().map(|m| m.path()),
            ),
        );
    }
    true
}

/// An annotation value as the planner compares it, `None` when it is not a JSON string.
fn decode<'a>(raw: &Raw<'a>) -> Option<Str<'a>> {
    view::from_str::<Str<'_>>(raw.get()).ok()
}

/// One bit per rendered item whose key is among `names`.
fn held<'s>(items: &[RItem<'_>], names: impl Iterator<Item = &'s str>) -> u64 {
    if items.is_empty() {
        return 0;
    }
    // Most of a pod's names (its env vars) are none of the injected ones: their fingerprints turn
    // them away before any comparison.
    let prints = items.iter().fold(0, |m, item| m | fingerprint(&item.key));
    let mut mask = 0;
    for name in names {
        if prints & fingerprint(name) == 0 {
            continue;
        }
        for (i, item) in items.iter().enumerate() {
            if item.key == name {
                mask |= 1u64 << (i % MAX_ITEMS);
            }
        }
    }
    mask
}

fn push_mask(out: &mut Vec<u8>, mask: u64) {
    out.extend_from_slice(&mask.to_le_bytes());
}

fn push_len(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}
