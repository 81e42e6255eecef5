//! The `splice.dev/status` annotation: per policy, the template hash and what it injected, so a
//! later call can tell its own items from the author's and remove them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::template::RItem;

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
    /// Per `valuesFrom` source (`ConfigMap ns/name`), the digest of the data the pod was
    /// rendered with, so coverage and `explain` can say which pods are stale and why.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
    /// Per `spec.overrides` name, where the pod's value came from and its digest.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overrides: BTreeMap<String, OverrideRecord>,
}

/// What `splice.dev/status` records of one override: its origin (`pod`, `namespace`, `default`)
/// and the first 16 hex digits of the value's SHA-256 (the value is on the pod or namespace).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverrideRecord {
    pub from: String,
    pub sha256: String,
}

/// Every policy's entry in a pod's `splice.dev/status` annotation, by policy name.
pub type Provenance = BTreeMap<String, ProvenanceEntry>;

/// The names of one list of an entry, borrowed from wherever they are.
#[derive(Debug)]
pub(crate) enum Names<'a> {
    /// The keys of rendered items.
    Items(Vec<&'a RItem<'a>>),
    /// A list recorded on the pod.
    Recorded(&'a [String]),
    Strs(Vec<&'a str>),
}

impl Default for Names<'_> {
    fn default() -> Self {
        Names::Strs(Vec::new())
    }
}

impl<'a> Names<'a> {
    pub fn len(&self) -> usize {
        match self {
            Names::Items(v) => v.len(),
            Names::Recorded(v) => v.len(),
            Names::Strs(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[cfg(test)]
    pub fn get(&self, i: usize) -> Option<&str> {
        match self {
            Names::Items(v) => v.get(i).map(|item| item.key.as_ref()),
            Names::Recorded(v) => v.get(i).map(String::as_str),
            Names::Strs(v) => v.get(i).copied(),
        }
    }
}

/// A [`ProvenanceEntry`] as the planner builds it, borrowing every name instead of copying it,
/// and written straight to JSON text: the planner builds one per request.
#[derive(Debug, Default)]
pub(crate) struct EntryRef<'a> {
    pub hash: &'a str,
    pub init_containers: Names<'a>,
    pub containers: Names<'a>,
    pub volumes: Names<'a>,
    /// By container name, in name order.
    pub env: Vec<(&'a str, Names<'a>)>,
    /// By container name, in name order.
    pub volume_mounts: Vec<(&'a str, Names<'a>)>,
    pub labels: Names<'a>,
    pub annotations: Names<'a>,
    /// The data digests (`ProvenanceEntry::data`); `None` when there are none.
    pub data: Option<&'a BTreeMap<String, String>>,
    /// The overrides' origins (`ProvenanceEntry::overrides`); `None` when there are none.
    pub overrides: Option<&'a BTreeMap<String, OverrideRecord>>,
}

impl<'a> EntryRef<'a> {
    pub fn of(e: &'a ProvenanceEntry) -> Self {
        let map = |m: &'a BTreeMap<String, Vec<String>>| {
            m.iter()
                .map(|(k, v)| (k.as_str(), Names::Recorded(v)))
                .collect()
        };
        EntryRef {
            hash: &e.hash,
            init_containers: Names::Recorded(&e.init_containers),
            containers: Names::Recorded(&e.containers),
            volumes: Names::Recorded(&e.volumes),
            env: map(&e.env),
            volume_mounts: map(&e.volume_mounts),
            labels: Names::Recorded(&e.labels),
            annotations: Names::Recorded(&e.annotations),
            data: Some(&e.data),
            overrides: Some(&e.overrides),
        }
    }

    /// Puts a map built in container order into name order; of two entries for one container
    /// (a pod repeating a container name), the later one stays, as a map insert would keep it.
    pub fn sort_map(map: &mut Vec<(&'a str, Names<'a>)>) {
        if map.is_sorted_by(|a, b| a.0 < b.0) {
            return;
        }
        map.reverse();
        map.sort_by(|a, b| a.0.cmp(b.0));
        map.dedup_by(|later, kept| later.0 == kept.0);
    }

    /// Writes the entry as serde_json writes a [`ProvenanceEntry`]; when `nested`, already
    /// escaped as the body of a JSON string (the entry lives in an annotation's value).
    pub fn write(&self, out: &mut Vec<u8>, nested: bool) {
        let q: &[u8] = if nested { b"\\\"" } else { b"\"" };
        let field = |out: &mut Vec<u8>, name: &str| {
            out.push(b',');
            out.extend_from_slice(q);
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(q);
            out.push(b':');
        };
        let list = |out: &mut Vec<u8>, names: &Names<'_>| {
            out.push(b'[');
            let mut first = true;
            let mut item = |n: &str| {
                if !first {
                    out.push(b',');
                }
                first = false;
                push_name(out, n, nested);
            };
            match names {
                Names::Items(v) => v.iter().for_each(|i| item(&i.key)),
                Names::Recorded(v) => v.iter().for_each(|n| item(n)),
                Names::Strs(v) => v.iter().for_each(|n| item(n)),
            }
            out.push(b']');
        };
        let map = |out: &mut Vec<u8>, entries: &[(&str, Names<'_>)]| {
            out.push(b'{');
            for (i, (k, names)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                push_name(out, k, nested);
                out.push(b':');
                list(out, names);
            }
            out.push(b'}');
        };
        out.push(b'{');
        out.extend_from_slice(q);
        out.extend_from_slice(b"hash");
        out.extend_from_slice(q);
        out.push(b':');
        push_name(out, self.hash, nested);
        for (name, names) in [
            ("initContainers", &self.init_containers),
            ("containers", &self.containers),
            ("volumes", &self.volumes),
        ] {
            if !names.is_empty() {
                field(out, name);
                list(out, names);
            }
        }
        for (name, entries) in [("env", &self.env), ("volumeMounts", &self.volume_mounts)] {
            if !entries.is_empty() {
                field(out, name);
                map(out, entries);
            }
        }
        for (name, names) in [("labels", &self.labels), ("annotations", &self.annotations)] {
            if !names.is_empty() {
                field(out, name);
                list(out, names);
            }
        }
        if let Some(data) = self.data.filter(|d| !d.is_empty()) {
            field(out, "data");
            out.push(b'{');
            for (i, (k, v)) in data.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                push_name(out, k, nested);
                out.push(b':');
                push_name(out, v, nested);
            }
            out.push(b'}');
        }
        if let Some(overrides) = self.overrides.filter(|o| !o.is_empty()) {
            field(out, "overrides");
            out.push(b'{');
            for (i, (name, record)) in overrides.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                push_name(out, name, nested);
                out.push(b':');
                out.push(b'{');
                out.extend_from_slice(q);
                out.extend_from_slice(b"from");
                out.extend_from_slice(q);
                out.push(b':');
                push_name(out, &record.from, nested);
                field(out, "sha256");
                push_name(out, &record.sha256, nested);
                out.push(b'}');
            }
            out.push(b'}');
        }
        out.push(b'}');
    }

    /// The entry as JSON text.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        self.write(&mut out, false);
        out
    }
}

/// Writes `s` as a JSON string; when `nested`, escaped once more as the body of a JSON string.
pub(crate) fn push_name(out: &mut Vec<u8>, s: &str, nested: bool) {
    if !nested {
        splice_json::push_json_str(out, s);
    } else if splice_json::string_stop(s.as_bytes()).is_none() {
        out.extend_from_slice(b"\\\"");
        out.extend_from_slice(s.as_bytes());
        out.extend_from_slice(b"\\\"");
    } else {
        let mut once = Vec::with_capacity(s.len() + 8);
        splice_json::push_json_str(&mut once, s);
        // `once` is the escape of a str, so it is UTF-8.
        splice_json::push_json_body(out, &String::from_utf8_lossy(&once));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use proptest::prelude::*;

    use super::*;

    fn entry() -> impl Strategy<Value = ProvenanceEntry> {
        let name = "[a-z\"\\\\/~. \\x01é-]{0,6}";
        let names = proptest::collection::vec(name, 0..3);
        let map = proptest::collection::btree_map(name, names.clone(), 0..3);
        (
            name,
            (names.clone(), names.clone(), names.clone()),
            (map.clone(), map),
            (names.clone(), names),
            proptest::collection::btree_map(name, name, 0..3),
            proptest::collection::btree_map(
                name,
                (name, name).prop_map(|(from, sha256)| OverrideRecord { from, sha256 }),
                0..3,
            ),
        )
            .prop_map(
                |(
                    hash,
                    (i, c, v),
                    (env, volume_mounts),
                    (labels, annotations),
                    data,
                    overrides,
                )| {
                    ProvenanceEntry {
                        hash,
                        init_containers: i,
                        containers: c,
                        volumes: v,
                        env,
                        volume_mounts,
                        labels,
                        annotations,
                        data,
                        overrides,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn an_entry_is_written_as_serde_writes_it_plain_and_inside_a_string(e in entry()) {
            let serde = serde_json::to_string(&e).unwrap();
            let r = EntryRef::of(&e);
            prop_assert_eq!(String::from_utf8(r.to_json()).unwrap(), serde.clone());
            let mut nested = b"\"".to_vec();
            r.write(&mut nested, true);
            nested.push(b'"');
            let inner: String = serde_json::from_slice(&nested).unwrap();
            prop_assert_eq!(inner, serde);
        }

        #[test]
        fn a_map_in_container_order_is_put_in_name_order_keeping_the_later_duplicate(
            keys in proptest::collection::vec("[a-c]", 0..6),
        ) {
            let mut map: Vec<(&str, Names<'_>)> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| (k.as_str(), Names::Strs(vec![["0", "1", "2", "3", "4", "5"][i]])))
                .collect();
            let expected: BTreeMap<String, String> = map
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.get(0).unwrap().to_owned()))
                .collect();
            EntryRef::sort_map(&mut map);
            let got: Vec<(String, String)> = map
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.get(0).unwrap().to_owned()))
                .collect();
            prop_assert_eq!(got, expected.into_iter().collect::<Vec<_>>());
        }
    }
}
