//! Borrowed, partial views of a pod's raw JSON.
//!
//! The engine reads a handful of fields (names, labels, annotations, env names, mount paths) and
//! skips everything else without allocating. Every view accepts only a JSON object (serde's derive
//! would also accept an array for a struct, which would make the engine emit paths that do not
//! exist).

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Deref;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// A JSON string, borrowed from the input unless it holds escapes.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Str<'a>(pub Cow<'a, str>);

impl Deref for Str<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Str<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V(PhantomData))
    }
}

/// The entries of a JSON object, in document order (labels, annotations).
#[derive(Debug, Default)]
pub(crate) struct Entries<'a, V>(pub Vec<(Str<'a>, V)>);

impl<'a, V> Entries<'a, V> {
    pub fn get(&self, key: &str) -> Option<&V> {
        self.0.iter().find(|(k, _)| &**k == key).map(|(_, v)| v)
    }
}

impl<'de: 'a, 'a, T: Deserialize<'de>> Deserialize<'de> for Entries<'a, T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a, T>(PhantomData<(&'a (), T)>);
        impl<'de: 'a, 'a, T: Deserialize<'de>> Visitor<'de> for V<'a, T> {
            type Value = Entries<'a, T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(k) = map.next_key::<Str<'a>>()? {
                    let v = map.next_value::<T>()?;
                    // JSON objects with a repeated key keep the last value, as serde_json::Value
                    // and the API server do.
                    if let Some(slot) = out.iter_mut().find(|(ek, _): &&mut (Str<'a>, T)| *ek == k)
                    {
                        slot.1 = v;
                    } else {
                        out.push((k, v));
                    }
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

/// A JSON array of items the engine reads. It starts with room for a typical pod's list: grown from
/// empty, a 20-variable env would be reallocated four times on every request.
#[derive(Debug)]
pub(crate) struct List<T>(pub Vec<T>);

impl<T> Deref for List<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = List<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a sequence")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                const TYPICAL: usize = 16;
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(TYPICAL).min(TYPICAL));
                while let Some(item) = seq.next_element()? {
                    out.push(item);
                }
                Ok(List(out))
            }
        }
        d.deserialize_seq(V(PhantomData))
    }
}

/// Declares a struct that deserializes only from a JSON object, reading the listed keys and
/// skipping every other one. A repeated key keeps its last value.
macro_rules! object_view {
    ($(#[$m:meta])* $name:ident<$lt:lifetime> { $($field:ident : $ty:ty = $key:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Default)]
        pub(crate) struct $name<$lt> {
            $(pub $field: $ty,)*
            _l: PhantomData<&$lt ()>,
        }

        impl<'de: $lt, $lt> Deserialize<'de> for $name<$lt> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V<$lt>(PhantomData<&$lt ()>);
                impl<'de: $lt, $lt> Visitor<'de> for V<$lt> {
                    type Value = $name<$lt>;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str("an object")
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                        let mut out = $name::default();
                        while let Some(key) = map.next_key::<Str<'de>>()? {
                            match &*key {
                                $($key => out.$field = map.next_value()?,)*
                                _ => {
                                    map.next_value::<IgnoredAny>()?;
                                }
                            }
                        }
                        Ok(out)
                    }
                }
                d.deserialize_map(V(PhantomData))
            }
        }
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
        annotations: Option<Entries<'a, &'a RawValue>> = "annotations",
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
    Named<'a> {
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
    Mount<'a> {
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
        init_containers: Option<Vec<&'a RawValue>> = "initContainers",
        containers: Option<Vec<&'a RawValue>> = "containers",
        volumes: Option<Vec<&'a RawValue>> = "volumes",
    }
}

object_view! {
    RawContainerView<'a> {
        env: Option<Vec<&'a RawValue>> = "env",
        volume_mounts: Option<Vec<&'a RawValue>> = "volumeMounts",
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
