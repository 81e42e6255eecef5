//! RFC 6902 JSON Patch: the operations the engine emits, their serialization, and a small applier
//! for producing the mutated object (`splice inject`, `splice simulate`).

use std::borrow::Cow;

use serde_json::Value;

use super::template::RItem;
use super::wire::Writer;

/// Appends `token` to a JSON pointer, escaping `~` as `~0` and `/` as `~1` (RFC 6901).
pub(crate) fn push_token(pointer: &mut String, token: &str) {
    pointer.push('/');
    if !token.contains(['~', '/']) {
        pointer.push_str(token);
        return;
    }
    for c in token.chars() {
        match c {
            '~' => pointer.push_str("~0"),
            '/' => pointer.push_str("~1"),
            c => pointer.push(c),
        }
    }
}

pub(crate) fn pointer(tokens: &[&str]) -> String {
    let mut p = String::new();
    for t in tokens {
        push_token(&mut p, t);
    }
    p
}

/// A value in an operation, kept borrowed until serialization.
#[derive(Debug)]
pub(crate) enum OpValue<'x> {
    /// One rendered item (container, volume, env var, ...).
    Item(&'x RItem<'x>),
    /// A new array of rendered items (the parent list was absent).
    Items(Vec<&'x RItem<'x>>),
    Str(Cow<'x, str>),
    /// A new object of string values (labels or annotations that were absent).
    StrMap(Vec<(Cow<'x, str>, Cow<'x, str>)>),
    EmptyObject,
}

#[derive(Debug)]
pub(crate) enum Op<'x> {
    Add(String, OpValue<'x>),
    Replace(String, OpValue<'x>),
    Remove(String),
}

impl OpValue<'_> {
    fn write(&self, out: &mut Writer) -> Result<(), serde_json::Error> {
        match self {
            OpValue::Item(item) => write_item(item, out)?,
            OpValue::Items(items) => {
                out.byte(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.byte(b',');
                    }
                    write_item(item, out)?;
                }
                out.byte(b']');
            }
            OpValue::Str(s) => out.string(s),
            OpValue::StrMap(entries) => {
                out.byte(b'{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.byte(b',');
                    }
                    out.string(k);
                    out.byte(b':');
                    out.string(v);
                }
                out.byte(b'}');
            }
            OpValue::EmptyObject => out.bytes(b"{}"),
        }
        Ok(())
    }

    pub fn to_value(&self) -> Value {
        match self {
            OpValue::Item(item) => item.value.as_ref().clone(),
            OpValue::Items(items) => {
                Value::Array(items.iter().map(|i| i.value.as_ref().clone()).collect())
            }
            OpValue::Str(s) => Value::String(s.to_string()),
            OpValue::StrMap(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
                    .collect(),
            ),
            OpValue::EmptyObject => Value::Object(Default::default()),
        }
    }
}

impl Op<'_> {
    /// About the length of this operation's JSON (exact for pre-serialized items and strings
    /// without escapes).
    fn size_hint(&self) -> usize {
        let (path, value) = match self {
            Op::Add(p, v) | Op::Replace(p, v) => (p, Some(v)),
            Op::Remove(p) => (p, None),
        };
        let value = match value {
            None => 0,
            Some(v) => 10 + v.size_hint(),
        };
        32 + path.len() + value
    }
}

impl OpValue<'_> {
    fn size_hint(&self) -> usize {
        let item = |i: &RItem<'_>| i.json.map_or(256, |j| j.json.len() + 2) + 1;
        match self {
            OpValue::Item(i) => item(i),
            OpValue::Items(items) => 2 + items.iter().map(|i| item(i)).sum::<usize>(),
            OpValue::Str(s) => s.len() + 2,
            OpValue::StrMap(entries) => {
                2 + entries
                    .iter()
                    .map(|(k, v)| k.len() + v.len() + 6)
                    .sum::<usize>()
            }
            OpValue::EmptyObject => 2,
        }
    }
}

fn write_item(item: &RItem<'_>, out: &mut Writer) -> Result<(), serde_json::Error> {
    match item.json {
        Some(json) => out.fragment(json),
        None => out.value(item.value.as_ref())?,
    }
    Ok(())
}

/// A patch as JSON text and as the standard base64 of that text (what an AdmissionResponse
/// carries).
pub(crate) struct Serialized {
    pub json: Vec<u8>,
    pub base64: Vec<u8>,
}

/// Serializes `ops` as a JSON array, with its base64.
pub(crate) fn serialize(ops: &[Op<'_>]) -> Result<Serialized, serde_json::Error> {
    // Sized from the operations, so that a patch carrying whole containers is written without
    // growing the buffer several times.
    let size: usize = ops.iter().map(Op::size_hint).sum();
    let mut out = Writer::with_capacity(2 + size);
    out.byte(b'[');
    for (i, op) in ops.iter().enumerate() {
        if i > 0 {
            out.byte(b',');
        }
        let (name, path, value): (&[u8], _, _) = match op {
            Op::Add(p, v) => (b"{\"op\":\"add\",\"path\":", p, Some(v)),
            Op::Replace(p, v) => (b"{\"op\":\"replace\",\"path\":", p, Some(v)),
            Op::Remove(p) => (b"{\"op\":\"remove\",\"path\":", p, None),
        };
        out.bytes(name);
        out.string(path);
        if let Some(v) = value {
            out.bytes(b",\"value\":");
            v.write(&mut out)?;
        }
        out.byte(b'}');
    }
    out.byte(b']');
    let (json, base64) = out.finish();
    Ok(Serialized { json, base64 })
}

/// Why applying an operation failed: a bug in the engine, never a property of the input, since the
/// engine only emits paths it has seen.
#[derive(Debug)]
pub(crate) struct ApplyError(pub String);

fn unescape(token: &str) -> Cow<'_, str> {
    if token.contains('~') {
        Cow::Owned(token.replace("~1", "/").replace("~0", "~"))
    } else {
        Cow::Borrowed(token)
    }
}

/// Applies `ops` to `doc` in order.
pub(crate) fn apply(doc: &mut Value, ops: &[Op<'_>]) -> Result<(), ApplyError> {
    for op in ops {
        let (path, value) = match op {
            Op::Add(p, v) | Op::Replace(p, v) => (p, Some(v)),
            Op::Remove(p) => (p, None),
        };
        let (parent_path, last) = path
            .rsplit_once('/')
            .ok_or_else(|| ApplyError(format!("invalid path {path}")))?;
        let last = unescape(last);
        let parent = doc
            .pointer_mut(parent_path)
            .ok_or_else(|| ApplyError(format!("no parent for {path}")))?;
        match (op, parent) {
            (Op::Add(..), Value::Object(map)) | (Op::Replace(..), Value::Object(map)) => {
                map.insert(
                    last.into_owned(),
                    value.map(OpValue::to_value).unwrap_or_default(),
                );
            }
            (Op::Remove(_), Value::Object(map)) => {
                map.shift_remove(last.as_ref())
                    .ok_or_else(|| ApplyError(format!("nothing to remove at {path}")))?;
            }
            (Op::Add(..), Value::Array(items)) => {
                let v = value.map(OpValue::to_value).unwrap_or_default();
                if last == "-" {
                    items.push(v);
                } else {
                    let i = index(&last, items.len() + 1, path)?;
                    items.insert(i, v);
                }
            }
            (Op::Replace(..), Value::Array(items)) => {
                let i = index(&last, items.len(), path)?;
                items[i] = value.map(OpValue::to_value).unwrap_or_default();
            }
            (Op::Remove(_), Value::Array(items)) => {
                let i = index(&last, items.len(), path)?;
                items.remove(i);
            }
            _ => return Err(ApplyError(format!("parent of {path} is not a container"))),
        }
    }
    Ok(())
}

fn index(token: &str, bound: usize, path: &str) -> Result<usize, ApplyError> {
    token
        .parse::<usize>()
        .ok()
        .filter(|i| *i < bound)
        .ok_or_else(|| ApplyError(format!("index out of range in {path}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_tokens_escape_tilde_before_slash() {
        assert_eq!(
            pointer(&["metadata", "annotations", "a~b/c"]),
            "/metadata/annotations/a~0b~1c"
        );
        assert_eq!(unescape("a~0b~1c"), "a~b/c");
        // "~01" is "~" followed by "1", not "/".
        assert_eq!(pointer(&["~1"]), "/~01");
        assert_eq!(unescape("~01"), "~1");
    }
}
