//! Borrowed, partial views of a pod's raw JSON.
//!
//! The engine reads a handful of fields (names, labels, annotations, env names, mount paths) and
//! skips everything else without allocating, in one pass of [`splice_json::Cursor`]. Every view
//! accepts only a JSON object (serde's derive would also accept an array for a struct, which would
//! make the engine emit paths that do not exist).
//!
//! The serde readers of the same views live in [`oracle`], for tests and the fuzz target only
//! (feature `serde-oracle`): the differential tests check the cursor against them.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::ops::Deref;

use splice_json::{Cursor, Error};

/// A value read from a cursor, as its serde `Deserialize` would read it.
pub(crate) trait FromJson<'a>: Sized {
    fn read(c: &mut Cursor<'a>) -> Result<Self, Error>;
}

/// Reads a whole document (nothing but whitespace may follow the value).
pub(crate) fn from_str<'a, T: FromJson<'a>>(text: &'a str) -> Result<T, Error> {
    Cursor::new(text).document(T::read)
}

impl<'a, T: FromJson<'a>> FromJson<'a> for Option<T> {
    fn read(c: &mut Cursor<'a>) -> Result<Self, Error> {
        if c.null()? {
            Ok(None)
        } else {
            T::read(c).map(Some)
        }
    }
}

/// The verbatim text of a JSON value (validated, not decoded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Raw<'a>(&'a str);

impl<'a> Raw<'a> {
    pub fn get(&self) -> &'a str {
        self.0
    }
}

impl<'a> FromJson<'a> for Raw<'a> {
    fn read(c: &mut Cursor<'a>) -> Result<Self, Error> {
        c.raw_value().map(Raw)
    }
}

impl<'a, T: FromJson<'a>> FromJson<'a> for Vec<T> {
    fn read(c: &mut Cursor<'a>) -> Result<Self, Error> {
        let mut items = c.array()?;
        let mut out = Vec::new();
        while c.item(&mut items)? {
            out.push(T::read(c)?);
        }
        Ok(out)
    }
}

/// A JSON string, borrowed from the input unless it holds escapes.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Str<'a>(pub Cow<'a, str>);

impl Deref for Str<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'a> FromJson<'a> for Str<'a> {
    fn read(c: &mut Cursor<'a>) -> Result<Self, Error> {
        c.string().map(Str)
    }
}

/// The entries of a JSON object, in document order (labels, annotations).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Entries<'a, V>(pub Vec<(Str<'a>, V)>);

impl<'a, V> Entries<'a, V> {
    pub fn get(&self, key: &str) -> Option<&V> {
        self.0.iter().find(|(k, _)| &**k == key).map(|(_, v)| v)
    }
}

impl<'a, T: FromJson<'a>> FromJson<'a> for Entries<'a, T> {
    fn read(c: &mut Cursor<'a>) -> Result<Self, Error> {
        let mut members = c.object()?;
        // Room for a typical pod's labels or annotations without growing.
        let mut out: Vec<(Str<'a>, T)> = Vec::with_capacity(8);
        while let Some(k) = c.key(&mut members)? {
            let v = T::read(c)?;
            // JSON objects with a repeated key keep the last value, as serde_json::Value and the
            // API server do.
            if let Some(slot) = out.iter_mut().find(|(ek, _)| *ek.0 == *k) {
                slot.1 = v;
            } else {
                out.push((Str(k), v));
            }
        }
        Ok(Entries(out))
    }
}

/// A JSON array of items the engine reads. It starts with room for a typical pod's list: grown from
/// empty, a 20-variable env would be reallocated four times on every request.
#[derive(Debug, PartialEq)]
pub(crate) struct List<T>(pub Vec<T>);

/// Room for a typical pod's list.
const TYPICAL: usize = 16;

impl<T> Deref for List<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<'a, T: FromJson<'a>> FromJson<'a> for List<T> {
    fn read(c: &mut Cursor<'a>) -> Result<Self, Error> {
        let mut items = c.array()?;
        let mut out = Vec::with_capacity(TYPICAL);
        while c.item(&mut items)? {
            out.push(T::read(c)?);
        }
        Ok(List(out))
    }
}

/// Declares a struct that deserializes only from a JSON object, reading the listed keys and
/// skipping every other one. A repeated key keeps its last value.
///
/// A view declared `flat [keys]` (all its fields `Option<Str>`) first tries
/// [`Cursor::flat_object`], which recognises the listed keys without scanning them: most env
/// entries and volume mounts are objects of plain strings, read in one pass.
macro_rules! object_view {
    (flat [$($known:literal),*] $(#[$m:meta])* $name:ident<$lt:lifetime> { $($field:ident : $ty:ty = $key:literal),* $(,)? }) => {
        object_view!(@struct $(#[$m])* $name<$lt> { $($field : $ty),* });

        impl<$lt> FromJson<$lt> for $name<$lt> {
            // Inlined into its list's loop: one call per env entry was a tenth of its cost.
            #[inline(always)]
            fn read(c: &mut Cursor<$lt>) -> Result<Self, Error> {
                let mut out = $name::default();
                let flat = c.flat_object(&[$($known),*], |key, value| match key {
                    // A boolean where a string field is: the general reader names the error.
                    $($key => match value {
                        Some(v) => {
                            out.$field = Some(Str(Cow::Borrowed(v)));
                            true
                        }
                        None => false,
                    },)*
                    _ => true,
                });
                if flat {
                    return Ok(out);
                }
                let mut out = $name::default();
                object_view!(@members c, out, $($field = $key),*);
                Ok(out)
            }
        }

        object_view!(@serde $name<$lt> { $($field = $key),* });
    };
    ($(#[$m:meta])* $name:ident<$lt:lifetime> { $($field:ident : $ty:ty = $key:literal),* $(,)? }) => {
        object_view!(@struct $(#[$m])* $name<$lt> { $($field : $ty),* });

        impl<$lt> FromJson<$lt> for $name<$lt> {
            fn read(c: &mut Cursor<$lt>) -> Result<Self, Error> {
                let mut out = $name::default();
                object_view!(@members c, out, $($field = $key),*);
                Ok(out)
            }
        }

        object_view!(@serde $name<$lt> { $($field = $key),* });
    };
    (@struct $(#[$m:meta])* $name:ident<$lt:lifetime> { $($field:ident : $ty:ty),* }) => {
        $(#[$m])*
        #[derive(Debug, Default, PartialEq)]
        pub(crate) struct $name<$lt> {
            $(pub $field: $ty,)*
            _l: PhantomData<&$lt ()>,
        }
    };
    (@members $c:ident, $out:ident, $($field:ident = $key:literal),*) => {
        let mut members = $c.object()?;
        while let Some(key) = $c.key(&mut members)? {
            match &*key {
                $($key => $out.$field = FromJson::read($c)?,)*
                _ => $c.skip_value()?,
            }
        }
    };
    (@serde $name:ident<$lt:lifetime> { $($field:ident = $key:literal),* }) => {
        #[cfg(any(test, feature = "serde-oracle"))]
        oracle::deserialize_view!($name<$lt> { $($field = $key),* });
    };
}

object_view! {
    /// A pod, or a PodTemplateSpec (no `kind`).
    PodView<'a> {
        kind: Option<Str<'a>> = "kind",
        metadata: Option<MetaView<'a>> = "metadata",
        spec: Option<SpecView<'a>> = "spec",
    }
}

object_view! {
    MetaView<'a> {
        namespace: Option<Str<'a>> = "namespace",
        labels: Option<Entries<'a, Str<'a>>> = "labels",
        // Annotation values stay raw: a last-applied-configuration annotation is kilobytes of
        // escaped JSON that the engine never needs to decode.
        annotations: Option<Entries<'a, Raw<'a>>> = "annotations",
        // Kept raw for its place in the text only: a chain's answer is reused for a pod that
        // differs from an earlier one in nothing else (see `ChainCache`).
        managed_fields: Option<Raw<'a>> = "managedFields",
    }
}

object_view! {
    SpecView<'a> {
        init_containers: Option<List<Named<'a>>> = "initContainers",
        containers: Option<List<ContainerView<'a>>> = "containers",
        volumes: Option<List<Named<'a>>> = "volumes",
    }
}

object_view! {
    // The keys of an env entry or a volume, most common first.
    flat ["name", "value"] Named<'a> {
        name: Option<Str<'a>> = "name",
    }
}

object_view! {
    ContainerView<'a> {
        name: Option<Str<'a>> = "name",
        env: Option<List<Named<'a>>> = "env",
        volume_mounts: Option<List<Mount<'a>>> = "volumeMounts",
    }
}

object_view! {
    flat ["name", "mountPath", "readOnly"] Mount<'a> {
        mount_path: Option<Str<'a>> = "mountPath",
    }
}

// Second, rarer pass: the raw JSON of list items, for comparing what a pod carries with what the
// policy would inject now.
object_view! {
    RawPodView<'a> {
        spec: Option<RawSpecView<'a>> = "spec",
    }
}

object_view! {
    RawSpecView<'a> {
        init_containers: Option<Vec<Raw<'a>>> = "initContainers",
        containers: Option<Vec<Raw<'a>>> = "containers",
        volumes: Option<Vec<Raw<'a>>> = "volumes",
    }
}

object_view! {
    RawContainerView<'a> {
        env: Option<Vec<Raw<'a>>> = "env",
        volume_mounts: Option<Vec<Raw<'a>>> = "volumeMounts",
    }
}

impl Named<'_> {
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }
}

impl ContainerView<'_> {
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }
}

impl Mount<'_> {
    pub fn path(&self) -> &str {
        self.mount_path.as_deref().unwrap_or("")
    }
}

/// The cursor's views against the serde readers they replaced.
#[cfg(any(test, feature = "serde-oracle"))]
pub mod oracle;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use splice_json::testkit::{SEEDS, mutated};

    /// Any JSON value, with strings full of what a skip must step over: quotes, backslashes,
    /// brackets, control characters (escaped when serialized) and non-ASCII.
    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "[\"\\\\\\[\\]{},:a-z0-9 \u{1}\n\t\u{e9}\u{1F600}/]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(serde_json::Value::Array),
                prop::collection::vec(("[a-zA-Z\"\\\\]{0,6}", inner), 0..5)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A real pod with members added just inside some of its objects: keys the views read (so
    /// values of the wrong type and repeated keys too) and keys they skip, each with any value,
    /// serialized compactly or with spaces.
    fn valid_pod() -> impl Strategy<Value = String> {
        const KEYS: &[&str] = &[
            "x",
            "name",
            "env",
            "spec",
            "metadata",
            "labels",
            "annotations",
            "containers",
            "volumeMounts",
            "mountPath",
            "kind",
            "n\\u0061me",
            "volumes",
        ];
        let member = (
            any::<prop::sample::Index>(),
            0..KEYS.len(),
            json_value(),
            any::<bool>(),
        );
        (0..4usize, prop::collection::vec(member, 1..4)).prop_map(|(seed, members)| {
            let mut doc = SEEDS[seed].to_owned();
            for (at, key, value, pretty) in members {
                let opens: Vec<usize> = doc.match_indices("{\"").map(|(i, _)| i).collect();
                let Some(&i) = opens.get(at.index(opens.len().max(1))) else {
                    continue;
                };
                let value = if pretty {
                    serde_json::to_string_pretty(&value)
                } else {
                    serde_json::to_string(&value)
                }
                .unwrap();
                let member = format!("\"{}\" : {value} ,", KEYS[key]);
                doc.insert_str(i + 1, &member);
                // A `{"` inside a string inserted before is no object: undo what that broke.
                if serde_json::from_str::<serde::de::IgnoredAny>(&doc).is_err() {
                    doc.replace_range(i + 1..i + 1 + member.len(), "");
                }
            }
            doc
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn views_of_mutated_pods_equal_what_serde_read(doc in mutated()) {
            if let Err(e) = oracle::check(&doc) {
                prop_assert!(false, "{}", e);
            }
        }

        #[test]
        fn views_of_pods_with_members_added_anywhere_equal_what_serde_read(doc in valid_pod()) {
            if let Err(e) = oracle::check(&doc) {
                prop_assert!(false, "{}", e);
            }
        }
    }

    #[test]
    fn escapes_and_brackets_inside_skipped_strings_do_not_end_a_container() {
        // Numbers before a closing bracket, too.
        let text = r#"{"x":"a\"}]\\","spec":{"y":["]","\"",{"z":-1.5e3}],"containers":[{"q":1e2,
            "name":"c\u00e9","w":[true,false,null]}]},"metadata":{"labels":{"k":"v\n"}}}"#;
        oracle::check(text).unwrap();
        let pod: PodView<'_> = from_str(text).unwrap();
        let c = &pod.spec.unwrap().containers.unwrap()[0];
        assert_eq!(c.name(), "c\u{e9}");
    }

    #[test]
    fn views_of_the_fixtures_equal_what_serde_read() {
        for seed in SEEDS {
            oracle::check(seed).unwrap();
        }
        let pod: PodView<'_> = from_str(SEEDS[1]).unwrap();
        assert!(pod.spec.as_ref().is_some_and(|s| s.containers.is_some()));
    }

    #[test]
    fn a_repeated_key_keeps_its_last_value_and_first_place() {
        let text = r#"{"metadata":{"labels":{"a":"1","b":"2","a":"3"}},
            "spec":{"containers":[{"name":"x","name":"y"}]},"spec":{"volumes":[]}}"#;
        oracle::check(text).unwrap();
        let pod: PodView<'_> = from_str(text).unwrap();
        let labels = pod.metadata.unwrap().labels.unwrap();
        let pairs: Vec<(&str, &str)> = labels.0.iter().map(|(k, v)| (&**k, &**v)).collect();
        assert_eq!(pairs, [("a", "3"), ("b", "2")]);
        let spec = pod.spec.unwrap();
        assert!(
            spec.containers.is_none(),
            "the second spec replaced the first"
        );
    }

    #[test]
    fn an_env_entry_or_mount_reads_the_same_whether_or_not_it_takes_the_flat_road() {
        // Flat: plain strings and booleans only. Not flat: whitespace, an escape, a number,
        // null, a nested object, a boolean where the field is, a truncated or empty object.
        let cases = [
            (r#"{"name":"A","value":"b"}"#, Some("A"), None),
            (
                r#"{"name":"d","readOnly":true,"mountPath":"/d"}"#,
                Some("d"),
                Some("/d"),
            ),
            (
                r#"{"name":"a","name":"b","mountPath":"/x","mountPath":"/y"}"#,
                Some("b"),
                Some("/y"),
            ),
            (r#"{}"#, None, None),
            (r#"{"value":"v","readOnly":false}"#, None, None),
            (r#"{ "name":"A"}"#, Some("A"), None),
            (r#"{"name" :"A","mountPath": "/p"}"#, Some("A"), Some("/p")),
            (r#"{"name":"A","mountPath":"/p"}"#, Some("A"), Some("/p")),
            (r#"{"name":"A","value":1}"#, Some("A"), None),
            (r#"{"name":null,"mountPath":null}"#, None, None),
            (r#"{"name":"A","valueFrom":{"name":"B"}}"#, Some("A"), None),
            // Keys that start like the ones recognised whole.
            (
                r#"{"name2":"x","names":"y","name":"A","mountPathX":"/n"}"#,
                Some("A"),
                None,
            ),
            (
                r#"{"nam":"x","value":"v","mountPat":"/n","mountPath":"/m"}"#,
                None,
                Some("/m"),
            ),
        ];
        for (text, name, path) in cases {
            oracle::check(text).unwrap();
            let named: Named<'_> = from_str(text).unwrap();
            assert_eq!(named.name.as_deref(), name, "{text}");
            let mount: Mount<'_> = from_str(text).unwrap();
            assert_eq!(mount.mount_path.as_deref(), path, "{text}");
        }
        for text in [
            r#"{"name":true}"#,
            r#"{"mountPath":false,"name":"a"}"#,
            r#"{"name":"A""#,
            r#"{"name":"A","#,
            r#"{"name":"A",}"#,
            r#"{"name":"A" "value":"b"}"#,
            r#"{"name":"A"]"#,
            r#"{"name":"a
b"}"#,
        ] {
            oracle::check(text).unwrap();
            assert!(
                from_str::<Named<'_>>(text).is_err() || from_str::<Mount<'_>>(text).is_err(),
                "{text}"
            );
        }
    }

    #[test]
    fn only_an_object_is_read_where_a_struct_is() {
        for text in [
            "[]",
            r#"{"spec":[]}"#,
            r#"{"spec":{"containers":{}}}"#,
            r#""x""#,
        ] {
            oracle::check(text).unwrap();
            assert!(from_str::<PodView<'_>>(text).is_err(), "{text}");
        }
    }
}
