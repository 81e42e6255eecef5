//! `spec.valuesFrom`: values read from ConfigMaps and Secrets.
//!
//! One resolution for the webhook and the CLI: [`resolve`] takes the data of the objects at hand
//! ([`DataSources`], fed by a watch on every replica, or by `--values-from` files offline) and a
//! policy's `valuesFrom`, and returns the values to merge after `spec.values` (later entries
//! replace earlier keys), which of them came from a Secret, and a digest per source object that
//! `splice.dev/status` records so coverage and `explain` can tell which pods are stale and why.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use sha2::{Digest, Sha256};
use splice_crds::{InjectionPolicySpec, ValuesFromSource};

/// The kind of object a value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SourceKind {
    ConfigMap,
    Secret,
}

impl SourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::ConfigMap => "ConfigMap",
            SourceKind::Secret => "Secret",
        }
    }
}

/// A ConfigMap or Secret, by namespace and name. Displays as `ConfigMap mesh-system/mesh-config`,
/// the form conditions, errors and the status annotation use.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceRef {
    pub kind: SourceKind,
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for SourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

/// The data of the ConfigMaps and Secrets at hand (a Secret's values decoded as UTF-8).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DataSources {
    objects: BTreeMap<SourceRef, Arc<BTreeMap<String, String>>>,
}

impl DataSources {
    /// Records (or replaces) an object's data; returns true when it changed.
    pub fn insert(&mut self, object: SourceRef, data: BTreeMap<String, String>) -> bool {
        if self.objects.get(&object).is_some_and(|d| **d == data) {
            return false;
        }
        self.objects.insert(object, Arc::new(data));
        true
    }
    /// Forgets an object; returns true when it was known.
    pub fn remove(&mut self, object: &SourceRef) -> bool {
        self.objects.remove(object).is_some()
    }
    /// Replaces every object of `kind` in `namespace` (a watch's relist).
    pub fn replace_namespace(
        &mut self,
        kind: SourceKind,
        namespace: &str,
        objects: impl IntoIterator<Item = (String, BTreeMap<String, String>)>,
    ) {
        self.objects
            .retain(|r, _| !(r.kind == kind && r.namespace == namespace));
        for (name, data) in objects {
            self.insert(
                SourceRef {
                    kind,
                    namespace: namespace.to_owned(),
                    name,
                },
                data,
            );
        }
    }
    pub fn get(&self, object: &SourceRef) -> Option<&BTreeMap<String, String>> {
        self.objects.get(object).map(|d| &**d)
    }
}

/// Why a policy's `valuesFrom` cannot be resolved. Each names the entry and the object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ValuesFromError {
    /// A required object, or a required key of it, does not exist.
    #[error("spec.valuesFrom[{entry}]: {object} {}", match key { Some(k) => format!("key {k} not found"), None => "not found".to_owned() })]
    SourceMissing {
        entry: usize,
        object: SourceRef,
        key: Option<String>,
    },
    /// The object is in a namespace Splice may not read (`splice run --values-namespaces`).
    #[error(
        "spec.valuesFrom[{entry}]: {object}: namespace {} is not one Splice reads values from (allowed: {})",
        object.namespace, allowed.join(", ")
    )]
    NamespaceNotAllowed {
        entry: usize,
        object: SourceRef,
        allowed: Vec<String>,
    },
}

impl ValuesFromError {
    /// Stable label for metrics and conditions.
    pub fn label(&self) -> &'static str {
        self.into()
    }
    /// The field of the policy the error is about (`spec.valuesFrom[1]`).
    pub fn field(&self) -> String {
        let (ValuesFromError::SourceMissing { entry, .. }
        | ValuesFromError::NamespaceNotAllowed { entry, .. }) = self;
        format!("spec.valuesFrom[{entry}]")
    }
}

/// What a policy's `valuesFrom` resolved to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvedValues {
    /// The values `valuesFrom` adds, merged in list order (not including `spec.values`).
    pub values: BTreeMap<String, String>,
    /// Keys of `values` whose value came from a Secret.
    pub secret_keys: BTreeSet<String>,
    /// Per source object (`ConfigMap ns/name`), 12 hex digits of SHA-256 over what was read of
    /// it (`-` when an optional object is absent). Recorded per policy in `splice.dev/status`.
    pub digests: BTreeMap<String, String>,
}

impl ResolvedValues {
    /// The values a template reads: `spec.values`, then these on top.
    pub fn merged(&self, spec: &InjectionPolicySpec) -> BTreeMap<String, String> {
        let mut all = spec.values.clone();
        all.extend(self.values.iter().map(|(k, v)| (k.clone(), v.clone())));
        all
    }
}

/// The object an entry reads, its key (None for `configMapRef`) and whether it may be absent.
pub fn entry_source<'e>(
    entry: &'e ValuesFromSource,
    default_namespace: &str,
) -> Option<(SourceRef, Option<&'e str>, bool)> {
    let object = |kind, name: &str, namespace: &Option<String>| SourceRef {
        kind,
        namespace: namespace
            .clone()
            .unwrap_or_else(|| default_namespace.to_owned()),
        name: name.to_owned(),
    };
    if let Some(r) = &entry.config_map_key_ref {
        return Some((
            object(SourceKind::ConfigMap, &r.name, &r.namespace),
            Some(&r.key),
            r.optional,
        ));
    }
    if let Some(r) = &entry.secret_key_ref {
        return Some((
            object(SourceKind::Secret, &r.name, &r.namespace),
            Some(&r.key),
            r.optional,
        ));
    }
    entry.config_map_ref.as_ref().map(|r| {
        (
            object(SourceKind::ConfigMap, &r.name, &r.namespace),
            None,
            r.optional,
        )
    })
}

/// Every object a spec reads, in entry order (repeats kept).
pub fn sources(spec: &InjectionPolicySpec, default_namespace: &str) -> Vec<SourceRef> {
    spec.values_from
        .iter()
        .filter_map(|e| entry_source(e, default_namespace).map(|(o, _, _)| o))
        .collect()
}

/// The first entry reading from a namespace outside `allowed`: what apply can check without the
/// data (the validating webhook), and the first thing [`resolve`] checks.
pub fn check_namespaces(
    spec: &InjectionPolicySpec,
    default_namespace: &str,
    allowed: &[String],
) -> Result<(), ValuesFromError> {
    for (entry, source) in spec.values_from.iter().enumerate() {
        if let Some((object, _, _)) = entry_source(source, default_namespace)
            && !allowed.contains(&object.namespace)
        {
            return Err(ValuesFromError::NamespaceNotAllowed {
                entry,
                object,
                allowed: allowed.to_vec(),
            });
        }
    }
    Ok(())
}

/// Resolves `spec.valuesFrom` against `data`. `allowed` lists the namespaces values may come
/// from (`None`: any, offline). An optional object or key that is absent adds nothing, so a
/// template's `default` applies.
pub fn resolve(
    spec: &InjectionPolicySpec,
    default_namespace: &str,
    allowed: Option<&[String]>,
    data: &DataSources,
) -> Result<ResolvedValues, ValuesFromError> {
    if let Some(allowed) = allowed {
        check_namespaces(spec, default_namespace, allowed)?;
    }
    let mut out = ResolvedValues::default();
    // What was read of each object, to digest: key → value (None: the key was absent).
    let mut read: BTreeMap<SourceRef, Option<BTreeMap<String, Option<String>>>> = BTreeMap::new();
    for (entry, source) in spec.values_from.iter().enumerate() {
        // The CRD's rules guarantee one source; an entry without one reads nothing.
        let Some((object, key, optional)) = entry_source(source, default_namespace) else {
            continue;
        };
        let Some(found) = data.get(&object) else {
            if !optional {
                return Err(ValuesFromError::SourceMissing {
                    entry,
                    object,
                    key: key.map(str::to_owned),
                });
            }
            read.entry(object).or_insert(None);
            continue;
        };
        let seen = read
            .entry(object.clone())
            .or_insert(None)
            .get_or_insert_with(BTreeMap::new);
        match key {
            Some(key) => {
                let value = found.get(key);
                seen.insert(key.to_owned(), value.cloned());
                let name = source.name.clone().unwrap_or_default();
                match value {
                    Some(v) => {
                        if object.kind == SourceKind::Secret {
                            out.secret_keys.insert(name.clone());
                        } else {
                            out.secret_keys.remove(&name);
                        }
                        out.values.insert(name, v.clone());
                    }
                    None if optional => {}
                    None => {
                        return Err(ValuesFromError::SourceMissing {
                            entry,
                            object,
                            key: Some(key.to_owned()),
                        });
                    }
                }
            }
            None => {
                let prefix = source.prefix.as_deref().unwrap_or_default();
                for (k, v) in found {
                    seen.insert(k.clone(), Some(v.clone()));
                    let name = format!("{prefix}{k}");
                    out.secret_keys.remove(&name);
                    out.values.insert(name, v.clone());
                }
            }
        }
    }
    for (object, seen) in read {
        let digest = match seen {
            None => "-".to_owned(),
            Some(seen) => digest(&seen),
        };
        out.digests.insert(object.to_string(), digest);
    }
    Ok(out)
}

/// 12 hex digits of SHA-256 over the keys and values read, length-prefixed so no two readings
/// collide by concatenation.
fn digest(seen: &BTreeMap<String, Option<String>>) -> String {
    let mut h = Sha256::new();
    for (k, v) in seen {
        h.update((k.len() as u64).to_be_bytes());
        h.update(k.as_bytes());
        match v {
            Some(v) => {
                h.update([1]);
                h.update((v.len() as u64).to_be_bytes());
                h.update(v.as_bytes());
            }
            None => h.update([0]),
        }
    }
    hex(&h.finalize()[..6])
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Placeholder values for a policy compiled without its data (at apply, where the objects may
/// not exist yet): every key an entry names gets a stand-in, Secret-fed ones marked as such.
/// Keys a `configMapRef` brings are unknown until resolution; templates reading them are
/// checked against the real data on every replica.
pub(crate) fn placeholders(spec: &InjectionPolicySpec) -> ResolvedValues {
    let mut out = ResolvedValues::default();
    for source in &spec.values_from {
        let Some(name) = &source.name else { continue };
        if source.secret_key_ref.is_some() {
            out.secret_keys.insert(name.clone());
        } else {
            out.secret_keys.remove(name);
        }
        out.values.insert(name.clone(), "valuesFrom".to_owned());
    }
    out
}

/// A ConfigMap's values (`binaryData` is not text and is not read).
pub fn config_map_data(cm: &ConfigMap) -> BTreeMap<String, String> {
    cm.data.clone().unwrap_or_default()
}

/// A Secret's values as UTF-8 text (`stringData` too, as the API server would merge it; bytes
/// that are not UTF-8 are replaced, which only the `sha256` filter could ever see).
pub fn secret_data(secret: &Secret) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
        .collect();
    out.extend(secret.string_data.clone().unwrap_or_default());
    out
}

impl DataSources {
    /// Adds every object of `other` (a later file replaces an earlier one's object).
    pub fn extend(&mut self, other: DataSources) {
        self.objects.extend(other.objects);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use splice_crds::{ValuesKeyRef, ValuesObjectRef};

    fn cm(ns: &str, name: &str, data: &[(&str, &str)]) -> (SourceRef, BTreeMap<String, String>) {
        (
            SourceRef {
                kind: SourceKind::ConfigMap,
                namespace: ns.into(),
                name: name.into(),
            },
            data.iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        )
    }

    fn key_ref(name: &str, object: &str, key: &str, optional: bool) -> ValuesFromSource {
        ValuesFromSource {
            name: Some(name.into()),
            config_map_key_ref: Some(ValuesKeyRef {
                name: object.into(),
                key: key.into(),
                namespace: None,
                optional,
            }),
            ..Default::default()
        }
    }

    fn spec(entries: Vec<ValuesFromSource>) -> InjectionPolicySpec {
        InjectionPolicySpec {
            values_from: entries,
            values: [("image".to_owned(), "from-spec".to_owned())].into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_later_entry_replaces_an_earlier_key_and_spec_values_come_first() {
        let mut data = DataSources::default();
        let (r, d) = cm("splice-system", "a", &[("image", "a:1")]);
        data.insert(r, d);
        let (r, d) = cm("splice-system", "b", &[("image", "b:1"), ("port", "80")]);
        data.insert(r, d);
        let spec = spec(vec![
            key_ref("image", "a", "image", false),
            ValuesFromSource {
                config_map_ref: Some(ValuesObjectRef {
                    name: "b".into(),
                    namespace: None,
                    optional: false,
                }),
                ..Default::default()
            },
        ]);
        let r = resolve(&spec, "splice-system", None, &data).unwrap();
        let merged = r.merged(&spec);
        assert_eq!(merged["image"], "b:1");
        assert_eq!(merged["port"], "80");
        assert_eq!(r.digests.len(), 2);
    }

    #[test]
    fn a_missing_required_key_names_the_entry_the_object_and_the_key() {
        let mut data = DataSources::default();
        let (r, d) = cm("mesh-system", "mesh-config", &[]);
        data.insert(r, d);
        let mut entry = key_ref("image", "mesh-config", "image", false);
        if let Some(r) = entry.config_map_key_ref.as_mut() {
            r.namespace = Some("mesh-system".into());
        }
        let err = resolve(&spec(vec![entry]), "splice-system", None, &data).unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.valuesFrom[0]: ConfigMap mesh-system/mesh-config key image not found"
        );
        assert_eq!(err.label(), "source_missing");
    }

    #[test]
    fn an_optional_absent_key_adds_nothing_and_digests_as_absent_object() {
        let spec = spec(vec![key_ref("proxy", "gone", "image", true)]);
        let r = resolve(&spec, "splice-system", None, &DataSources::default()).unwrap();
        assert!(r.values.is_empty());
        assert_eq!(r.digests["ConfigMap splice-system/gone"], "-");
    }

    #[test]
    fn a_namespace_outside_the_allowed_ones_is_refused() {
        let mut entry = key_ref("image", "c", "image", false);
        if let Some(r) = entry.config_map_key_ref.as_mut() {
            r.namespace = Some("other".into());
        }
        let err = resolve(
            &spec(vec![entry]),
            "splice-system",
            Some(&["splice-system".to_owned()]),
            &DataSources::default(),
        )
        .unwrap_err();
        assert_eq!(err.label(), "namespace_not_allowed");
        assert!(err.to_string().contains("ConfigMap other/c"), "{err}");
    }

    #[test]
    fn the_digest_changes_only_when_what_was_read_changes() {
        let spec = spec(vec![key_ref("image", "a", "image", false)]);
        let mut data = DataSources::default();
        let (r, d) = cm("splice-system", "a", &[("image", "a:1"), ("other", "x")]);
        data.insert(r.clone(), d);
        let first = resolve(&spec, "splice-system", None, &data).unwrap();
        data.insert(r.clone(), cm("", "", &[("image", "a:1"), ("other", "y")]).1);
        let unrelated = resolve(&spec, "splice-system", None, &data).unwrap();
        data.insert(r, cm("", "", &[("image", "a:2")]).1);
        let changed = resolve(&spec, "splice-system", None, &data).unwrap();
        assert_eq!(first.digests, unrelated.digests);
        assert_ne!(first.digests, changed.digests);
    }

    #[test]
    fn secret_data_and_string_data_are_both_read() {
        let secret = Secret {
            data: Some([("t".to_owned(), k8s_openapi::ByteString(b"hello".to_vec()))].into()),
            string_data: Some([("u".to_owned(), "plain".to_owned())].into()),
            ..Default::default()
        };
        let data = secret_data(&secret);
        assert_eq!(data["t"], "hello");
        assert_eq!(data["u"], "plain");
    }

    fn secret_policy(annotation: &str) -> InjectionPolicySpec {
        let mut spec: InjectionPolicySpec = serde_json::from_value(serde_json::json!({
            "valuesFrom": [
                {"name": "token", "secretKeyRef": {"name": "mesh-token", "key": "token"}},
                {"configMapRef": {"name": "mesh-defaults"}, "prefix": "mesh_"},
            ],
            "template": {"containers": [{"name": "proxy", "image": "{{ values.mesh_image | default('proxy:1') }}"}]},
        }))
        .unwrap();
        spec.template
            .annotations
            .insert("mesh/token".into(), annotation.into());
        spec
    }

    fn secret_data_sources() -> DataSources {
        let mut data = DataSources::default();
        data.insert(
            SourceRef {
                kind: SourceKind::Secret,
                namespace: "splice-system".into(),
                name: "mesh-token".into(),
            },
            [("token".to_owned(), "s3cret".to_owned())].into(),
        );
        let (r, d) = cm("splice-system", "mesh-defaults", &[("image", "proxy:2")]);
        data.insert(r, d);
        data
    }

    #[test]
    fn a_secret_read_through_sha256_renders_its_hash_and_never_the_secret() {
        let spec = secret_policy("{{ values.token | sha256 }}");
        let data = resolve(&spec, "splice-system", None, &secret_data_sources()).unwrap();
        let c = crate::CompiledPolicy::compile_with("mesh", 1, &spec, &data).unwrap();
        let rendered = &c.templates.annotations[0];
        let expected = hex(&Sha256::digest(b"s3cret"));
        assert_eq!(rendered.static_value(), Some(expected.as_str()));
        assert_eq!(c.templates.containers[0].base()["image"], "proxy:2");
        assert_eq!(c.data_digests().len(), 2);
        // Without the data (at apply) the same policy compiles with stand-ins.
        crate::CompiledPolicy::compile("mesh", 1, &spec).unwrap();
    }

    #[test]
    fn a_secret_shown_in_the_pod_spec_is_refused_naming_the_field_and_the_entry() {
        for template in [
            "{{ values.token }}",
            "{{ values.token | upper }}",
            "x{{ values.token ~ 'y' }}",
            "{{ values.token }}-{{ pod.metadata.name }}",
        ] {
            let spec = secret_policy(template);
            let err = crate::CompiledPolicy::compile("mesh", 1, &spec).unwrap_err();
            let text = err.to_string();
            assert_eq!(
                err.field(),
                "spec.template.annotations[\"mesh/token\"]",
                "{template}"
            );
            assert!(text.contains("spec.valuesFrom[0]"), "{template}: {text}");
            let data = resolve(&spec, "splice-system", None, &secret_data_sources()).unwrap();
            let err = crate::CompiledPolicy::compile_with("mesh", 1, &spec, &data).unwrap_err();
            assert!(!err.to_string().contains("s3cret"), "{template}: {err}");
        }
    }
}
