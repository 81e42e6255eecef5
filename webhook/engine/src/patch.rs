//! RFC 6902 JSON Patch: the operations the engine emits and their serialization (the request
//! path). The mutated object of `splice inject` / `splice simulate` is built by applying the
//! serialized patch with the `json-patch` crate ([`apply`]), so what the CLI shows is what the API
//! server would apply.

use std::borrow::Cow;

use serde_json::Value;

use super::template::RItem;
use super::wire::Writer;

/// Appends `token` to a JSON pointer, escaping `~` as `~0` and `/` as `~1` (RFC 6901).
pub(crate) fn push_token(pointer: &mut String, token: &str) {
    pointer.push('/');
    escaped_token(token, |piece| pointer.push_str(piece));
}

/// `token` escaped as a JSON pointer token (RFC 6901), handed out in pieces: the text between
/// `~` and `/`, and `~0` or `~1` for each of them.
fn escaped_token(token: &str, mut piece: impl FnMut(&str)) {
    let mut rest = token;
    while let Some(at) = rest.find(['~', '/']) {
        piece(&rest[..at]);
        piece(if rest.as_bytes()[at] == b'~' {
            "~0"
        } else {
            "~1"
        });
        rest = &rest[at + 1..];
    }
    piece(rest);
}

#[cfg(test)]
pub(crate) fn pointer(tokens: &[&str]) -> String {
    let mut p = String::new();
    for t in tokens {
        push_token(&mut p, t);
    }
    p
}

/// Where an operation applies, kept in pieces so that no pointer is formatted per request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Path<'x> {
    /// A pointer needing no escape.
    Fixed(&'static str),
    /// `{base}/{index}`.
    Index(&'static str, usize),
    /// `/spec/containers/{index}{suffix}`.
    Container(usize, &'static str),
    /// `/spec/containers/{index}{suffix}/{index}`.
    ContainerIndex(usize, &'static str, usize),
    /// `{base}/{key}`, the key escaped as RFC 6901 says.
    Key(&'static str, Cow<'x, str>),
}

impl Path<'_> {
    /// Writes the pointer as a JSON string.
    fn write(&self, out: &mut Writer) {
        out.byte(b'"');
        match self {
            Path::Fixed(p) => out.string_body(p),
            Path::Index(base, i) => {
                out.string_body(base);
                out.byte(b'/');
                out.decimal(*i);
            }
            Path::Container(i, suffix) => {
                out.bytes(b"/spec/containers/");
                out.decimal(*i);
                out.string_body(suffix);
            }
            Path::ContainerIndex(ci, suffix, i) => {
                out.bytes(b"/spec/containers/");
                out.decimal(*ci);
                out.string_body(suffix);
                out.byte(b'/');
                out.decimal(*i);
            }
            Path::Key(base, key) => {
                out.string_body(base);
                out.byte(b'/');
                escaped_token(key, |piece| out.string_body(piece));
            }
        }
        out.byte(b'"');
    }

    fn len(&self) -> usize {
        match self {
            Path::Fixed(p) => p.len(),
            Path::Index(base, _) => base.len() + 4,
            Path::Container(_, suffix) => 20 + suffix.len(),
            Path::ContainerIndex(_, suffix, _) => 24 + suffix.len(),
            Path::Key(base, key) => base.len() + 1 + key.len(),
        }
    }
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Fixed(p) => f.write_str(p),
            Path::Index(base, i) => write!(f, "{base}/{i}"),
            Path::Container(i, suffix) => write!(f, "/spec/containers/{i}{suffix}"),
            Path::ContainerIndex(ci, suffix, i) => {
                write!(f, "/spec/containers/{ci}{suffix}/{i}")
            }
            Path::Key(base, key) => {
                let mut p = (*base).to_owned();
                push_token(&mut p, key);
                f.write_str(&p)
            }
        }
    }
}

/// A string value: as is, or already escaped for a JSON string (the status annotation, written
/// escaped in the first place because it is JSON inside a JSON string).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Text<'x> {
    Plain(Cow<'x, str>),
    /// The body of a JSON string literal (without its quotes), UTF-8.
    Escaped(Vec<u8>),
}

impl Text<'_> {
    fn write(&self, out: &mut Writer) {
        match self {
            Text::Plain(s) => out.string(s),
            Text::Escaped(body) => {
                out.byte(b'"');
                out.bytes(body);
                out.byte(b'"');
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            Text::Plain(s) => s.len(),
            Text::Escaped(s) => s.len(),
        }
    }
}

/// A value in an operation, kept borrowed until serialization.
#[derive(Debug)]
pub(crate) enum OpValue<'x> {
    /// One rendered item (container, volume, env var, ...).
    Item(&'x RItem<'x>),
    /// A new array of rendered items (the parent list was absent).
    Items(Vec<&'x RItem<'x>>),
    /// An injected container, written with the mount of the pod's ServiceAccount token volume
    /// (named here) that the API server's ServiceAccount plugin would add.
    MountedItem(&'x RItem<'x>, &'x str),
    /// A new array of injected containers, each written as [`OpValue::MountedItem`].
    MountedItems(Vec<&'x RItem<'x>>, &'x str),
    Str(Text<'x>),
    /// A new object of string values (labels or annotations that were absent).
    StrMap(Vec<(Cow<'x, str>, Text<'x>)>),
    EmptyObject,
}

#[derive(Debug)]
pub(crate) enum Op<'x> {
    Add(Path<'x>, OpValue<'x>),
    Replace(Path<'x>, OpValue<'x>),
    Remove(Path<'x>),
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
            OpValue::MountedItem(item, volume) => write_mounted(item, volume, out)?,
            OpValue::MountedItems(items, volume) => {
                out.byte(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.byte(b',');
                    }
                    write_mounted(item, volume, out)?;
                }
                out.byte(b']');
            }
            OpValue::Str(s) => s.write(out),
            OpValue::StrMap(entries) => {
                out.byte(b'{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.byte(b',');
                    }
                    out.string(k);
                    out.byte(b':');
                    v.write(out);
                }
                out.byte(b'}');
            }
            OpValue::EmptyObject => out.bytes(b"{}"),
        }
        Ok(())
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
        let item = |i: &RItem<'_>| i.json.as_ref().map_or(256, |j| j.json_len()) + 1;
        match self {
            OpValue::Item(i) => item(i),
            OpValue::Items(items) => 2 + items.iter().map(|i| item(i)).sum::<usize>(),
            OpValue::MountedItem(i, _) => item(i) + TOKEN_MOUNT_LEN,
            OpValue::MountedItems(items, _) => {
                2 + items
                    .iter()
                    .map(|i| item(i) + TOKEN_MOUNT_LEN)
                    .sum::<usize>()
            }
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

/// Where the API server's ServiceAccount admission plugin mounts the token in every container.
pub(crate) const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// About the length of the mount written by [`write_mounted`].
const TOKEN_MOUNT_LEN: usize = 128;

/// `item` (a container) with the token mount appended, unless it mounts something at that path
/// already: exactly what the ServiceAccount plugin adds when it runs again after the webhooks.
/// Without it the plugin would change the object after this webhook, and the API server would
/// call every `IfNeeded` webhook a second time for each pod.
fn write_mounted(
    item: &RItem<'_>,
    volume: &str,
    out: &mut Writer,
) -> Result<(), serde_json::Error> {
    let mounts = item.value.get("volumeMounts").and_then(Value::as_array);
    let mounted = mounts.is_some_and(|m| {
        m.iter()
            .any(|v| v.get("mountPath").and_then(Value::as_str) == Some(TOKEN_MOUNT_PATH))
    });
    if mounted || !item.value.is_object() {
        return write_item(item, out);
    }
    let mut value = item.value.as_ref().clone();
    let mount =
        serde_json::json!({"name": volume, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH});
    if let Some(list) = value
        .as_object_mut()
        .map(|c| {
            c.entry("volumeMounts")
                .or_insert_with(|| Value::Array(Vec::new()))
        })
        .and_then(Value::as_array_mut)
    {
        list.push(mount);
    }
    out.value(&value)
}

fn write_item(item: &RItem<'_>, out: &mut Writer) -> Result<(), serde_json::Error> {
    match &item.json {
        Some(json) => out.fragment(json),
        None => out.value(item.value.as_ref())?,
    }
    Ok(())
}

/// Serializes `ops` as a JSON array.
pub(crate) fn serialize(ops: &[Op<'_>]) -> Result<Vec<u8>, serde_json::Error> {
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
        path.write(&mut out);
        if let Some(v) = value {
            out.bytes(b",\"value\":");
            v.write(&mut out)?;
        }
        out.byte(b'}');
    }
    out.byte(b']');
    Ok(out.finish())
}

/// Applies a patch [`serialize`] wrote to `doc`. An error is a bug in the engine, never a
/// property of the input, since the engine only emits paths it has seen.
pub(crate) fn apply(doc: &mut Value, patch: &[u8]) -> Result<(), String> {
    let ops: json_patch::Patch = serde_json::from_slice(patch).map_err(|e| e.to_string())?;
    json_patch::patch(doc, &ops).map_err(|e| e.to_string())
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
        // "~01" is "~" followed by "1", not "/".
        assert_eq!(pointer(&["~1"]), "/~01");
    }
}
