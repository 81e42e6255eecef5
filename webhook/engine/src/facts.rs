//! What the planner reads of a pod, as one value: [`PodFacts`].
//!
//! The planner ([`super::plan`]) reads the pod only through its facts; for a pod that already
//! carries `splice.dev/status` it also reads that record and, to confirm an earlier injection is
//! intact, the raw items. A pod without the annotation (the first admission of every pod) is
//! planned from its facts and the rendering alone, so two such pods with equal facts get the
//! same patch: the plan cache ([`super::cache::PlanCache`]) keys on the rendering and the facts,
//! and cannot disagree with the planner, which has nothing else of the pod to read.
//!
//! The facts hold the names of the pod's lists (the planner tests each against the names it
//! injects) and, of its labels and annotations, only the keys the planner compares: a
//! StatefulSet's per-pod labels or a Job's completion index stay out, so the replicas of one
//! template share one patch. Values the planner never reads (images, env values, the pod's name)
//! are not in them at all.

use std::borrow::Cow;
use std::mem::size_of;

use splice_crds::Operation;

use super::view::{ContainerView, Entries, Mount, Named, PodView};

/// What the planner reads of one pod for one admission.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PodFacts<'a> {
    pub operation: Operation,
    pub metadata: Option<MetaFacts<'a>>,
    /// Read on CREATE only: a pod's lists cannot change on UPDATE, and the planner leaves them.
    pub spec: Option<SpecFacts<'a>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MetaFacts<'a> {
    /// `None` when the pod has no labels object.
    pub labels: Option<Lookups<'a>>,
    /// `None` when the pod has no annotations object. Values are raw JSON text: the planner
    /// decodes the ones it compares, and reports one that is not a string.
    pub annotations: Option<Lookups<'a>>,
}

/// The pod's value for each key of a map the planner was asked to compare (`None`: absent).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Lookups<'a>(Vec<(Cow<'a, str>, Option<Cow<'a, str>>)>);

/// A key the facts were not built with: the planner asked for more than it said it would read.
#[derive(Debug)]
pub(crate) struct NotRead;

impl<'a> Lookups<'a> {
    fn read<V>(
        map: &'a Entries<'_, V>,
        keys: impl Iterator<Item = &'a str>,
        text: impl Fn(&'a V) -> &'a str,
    ) -> Self {
        let mut out: Vec<(Cow<'a, str>, Option<Cow<'a, str>>)> = Vec::new();
        for key in keys {
            if out.iter().all(|(k, _)| k != key) {
                let value = map.get(key).map(|v| Cow::Borrowed(text(v)));
                out.push((Cow::Borrowed(key), value));
            }
        }
        Lookups(out)
    }

    /// The pod's value for `key`: `Ok(None)` when the pod has no such key.
    pub fn get(&self, key: &str) -> Result<Option<&str>, NotRead> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_deref())
            .ok_or(NotRead)
    }

    fn into_owned(self) -> Lookups<'static> {
        Lookups(
            self.0
                .into_iter()
                .map(|(k, v)| (owned(k), v.map(owned)))
                .collect(),
        )
    }

    fn bytes(&self) -> usize {
        self.0
            .iter()
            .map(|(k, v)| {
                size_of::<(Cow<'_, str>, Option<Cow<'_, str>>)>()
                    + k.len()
                    + v.as_ref().map_or(0, |v| v.len())
            })
            .sum()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SpecFacts<'a> {
    /// Names, in the pod's order; `None` when the pod has no such list.
    pub init_containers: Option<Vec<Cow<'a, str>>>,
    pub containers: Option<Vec<ContainerFacts<'a>>>,
    pub volumes: Option<Vec<Cow<'a, str>>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ContainerFacts<'a> {
    pub name: Cow<'a, str>,
    /// Env var names, in order; `None` when the container has no `env`.
    pub env: Option<Vec<Cow<'a, str>>>,
    /// Mount paths, in order; `None` when the container has no `volumeMounts`.
    pub volume_mounts: Option<Vec<Cow<'a, str>>>,
}

impl<'a> PodFacts<'a> {
    /// These facts with the volume `name` called `mask` (a kept plan's key: see
    /// [`super::cache::PlanCache`]).
    pub fn with_volume_masked(&self, name: &str, mask: &'static str) -> PodFacts<'a> {
        let mut out = self.clone();
        if let Some(volumes) = out.spec.as_mut().and_then(|s| s.volumes.as_mut()) {
            for v in volumes.iter_mut().filter(|v| v.as_ref() == name) {
                *v = Cow::Borrowed(mask);
            }
        }
        out
    }

    /// The facts of `view` for an admission of `operation`, with the labels and annotations of
    /// the keys given (the planner says which: [`super::plan::facts`]).
    pub fn read(
        operation: Operation,
        view: &'a PodView<'_>,
        label_keys: impl Iterator<Item = &'a str>,
        annotation_keys: impl Iterator<Item = &'a str>,
    ) -> Self {
        let metadata = view.metadata.as_ref().map(|m| MetaFacts {
            labels: m
                .labels
                .as_ref()
                .map(|l| Lookups::read(l, label_keys, |v| &**v)),
            annotations: m
                .annotations
                .as_ref()
                .map(|a| Lookups::read(a, annotation_keys, |v| v.get())),
        });
        let spec = match operation {
            Operation::Create => view.spec.as_ref().map(|s| SpecFacts {
                init_containers: s.init_containers.as_deref().map(|l| names(l, Named::name)),
                containers: s.containers.as_deref().map(|l| {
                    l.iter()
                        .map(|c: &ContainerView<'_>| ContainerFacts {
                            name: Cow::Borrowed(c.name()),
                            env: c.env.as_deref().map(|l| names(l, Named::name)),
                            volume_mounts: c
                                .volume_mounts
                                .as_deref()
                                .map(|l| names(l, Mount::path)),
                        })
                        .collect()
                }),
                volumes: s.volumes.as_deref().map(|l| names(l, Named::name)),
            }),
            _ => None,
        };
        PodFacts {
            operation,
            metadata,
            spec,
        }
    }

    /// A copy that borrows nothing, for the plan cache.
    pub fn into_owned(self) -> PodFacts<'static> {
        let list = |l: Vec<Cow<'a, str>>| l.into_iter().map(owned).collect();
        PodFacts {
            operation: self.operation,
            metadata: self.metadata.map(|m| MetaFacts {
                labels: m.labels.map(Lookups::into_owned),
                annotations: m.annotations.map(Lookups::into_owned),
            }),
            spec: self.spec.map(|s| SpecFacts {
                init_containers: s.init_containers.map(list),
                containers: s.containers.map(|l| {
                    l.into_iter()
                        .map(|c| ContainerFacts {
                            name: owned(c.name),
                            env: c.env.map(list),
                            volume_mounts: c.volume_mounts.map(list),
                        })
                        .collect()
                }),
                volumes: s.volumes.map(list),
            }),
        }
    }

    /// About how many bytes an owned copy holds, for the plan cache's bound.
    pub fn bytes(&self) -> usize {
        let list = |l: &Option<Vec<Cow<'_, str>>>| {
            l.iter()
                .flatten()
                .map(|n| size_of::<Cow<'_, str>>() + n.len())
                .sum::<usize>()
        };
        let meta = self.metadata.as_ref().map_or(0, |m| {
            m.labels.as_ref().map_or(0, Lookups::bytes)
                + m.annotations.as_ref().map_or(0, Lookups::bytes)
        });
        let spec = self.spec.as_ref().map_or(0, |s| {
            list(&s.init_containers)
                + list(&s.volumes)
                + s.containers
                    .iter()
                    .flatten()
                    .map(|c| {
                        size_of::<ContainerFacts<'_>>()
                            + c.name.len()
                            + list(&c.env)
                            + list(&c.volume_mounts)
                    })
                    .sum::<usize>()
        });
        size_of::<PodFacts<'_>>() + meta + spec
    }
}

fn names<'a, T>(items: &'a [T], name: impl Fn(&'a T) -> &'a str) -> Vec<Cow<'a, str>> {
    items.iter().map(|i| Cow::Borrowed(name(i))).collect()
}

fn owned(s: Cow<'_, str>) -> Cow<'static, str> {
    Cow::Owned(s.into_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;
    use crate::view;

    fn facts_of(pod: &serde_json::Value) -> PodFacts<'static> {
        let text = pod.to_string();
        let view: PodView<'_> = view::from_str(&text).unwrap();
        PodFacts::read(
            Operation::Create,
            &view,
            ["injected"].into_iter(),
            ["note"].into_iter(),
        )
        .into_owned()
    }

    fn pod(name: &str, env: &str, value: &str, tier: &str, injected: &str) -> serde_json::Value {
        json!({
            "metadata": {
                "name": name,
                "labels": {"tier": tier, "injected": injected},
                "annotations": {"note": "n", "other": name},
            },
            "spec": {"containers": [{
                "name": "app",
                "image": name,
                "env": [{"name": env, "value": value}],
                "volumeMounts": [{"name": "v", "mountPath": "/data"}],
            }]},
        })
    }

    #[test]
    fn facts_hold_the_names_and_the_compared_keys_and_nothing_else() {
        let a = facts_of(&pod("a", "X", "1", "web", "no"));
        // Another name and image, env value, and labels and annotations the planner does not
        // compare: the same facts.
        assert_eq!(a, facts_of(&pod("b", "X", "2", "db", "no")));
        // Another env name, or another value of a compared label: other facts.
        assert_ne!(a, facts_of(&pod("a", "Y", "1", "web", "no")));
        assert_ne!(a, facts_of(&pod("a", "X", "1", "web", "yes")));
    }

    #[test]
    fn a_key_the_facts_were_not_built_with_is_refused_rather_than_read_as_absent() {
        let a = facts_of(&pod("a", "X", "1", "web", "no"));
        let labels = a.metadata.as_ref().unwrap().labels.as_ref().unwrap();
        assert_eq!(labels.get("injected").unwrap(), Some("no"));
        assert!(labels.get("tier").is_err());
    }
}
