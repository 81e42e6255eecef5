//! The serde readers of the engine's pod views: what the cursor-based readers replaced, kept as
//! the oracle of the differential tests and the fuzz target (never in a production build).

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::*;

/// Implements serde's `Deserialize` for a view declared with `object_view!`: a JSON object only,
/// the listed keys read, every other one skipped, a repeated key keeping its last value.
macro_rules! deserialize_view {
    ($name:ident<$lt:lifetime> { $($field:ident = $key:literal),* }) => {
        impl<'de: $lt, $lt> ::serde::de::Deserialize<'de> for $name<$lt> {
            fn deserialize<D: ::serde::de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V<$lt>(::std::marker::PhantomData<&$lt ()>);
                impl<'de: $lt, $lt> ::serde::de::Visitor<'de> for V<$lt> {
                    type Value = $name<$lt>;
                    fn expecting(&self, f: &mut ::std::fmt::Formatter) -> ::std::fmt::Result {
                        f.write_str("an object")
                    }
                    fn visit_map<A: ::serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                        let mut out = $name::default();
                        while let Some(key) = map.next_key::<$crate::view::Str<'de>>()? {
                            match &*key {
                                $($key => out.$field = map.next_value()?,)*
                                _ => {
                                    map.next_value::<::serde::de::IgnoredAny>()?;
                                }
                            }
                        }
                        Ok(out)
                    }
                }
                d.deserialize_map(V(::std::marker::PhantomData))
            }
        }
    };
}
pub(crate) use deserialize_view;

impl<'de: 'a, 'a> Deserialize<'de> for Raw<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'de serde_json::value::RawValue>::deserialize(d).map(|r| Raw(r.get()))
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

impl<'de, T: Deserialize<'de>> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = List<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a sequence")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
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

fn same<'a, T>(text: &'a str) -> Result<(), String>
where
    T: FromJson<'a> + Deserialize<'a> + PartialEq + fmt::Debug,
{
    let ours = from_str::<T>(text);
    let theirs = serde_json::from_str::<T>(text);
    match (&ours, &theirs) {
        (Ok(a), Ok(b)) if a == b => Ok(()),
        (Err(_), Err(_)) => Ok(()),
        _ => Err(format!(
            "{}: cursor {ours:?} vs serde {theirs:?}",
            std::any::type_name::<T>()
        )),
    }
}

/// Reads `text` as every view with the cursor and with serde; an error describes the first
/// disagreement (in acceptance or in what was read).
pub fn check(text: &str) -> Result<(), String> {
    same::<PodView<'_>>(text)?;
    same::<RawPodView<'_>>(text)?;
    same::<RawContainerView<'_>>(text)?;
    same::<ContainerView<'_>>(text)?;
    same::<Named<'_>>(text)?;
    same::<Mount<'_>>(text)?;
    same::<Option<Str<'_>>>(text)
}
