//! The `admission.k8s.io/v1` AdmissionReview wire format, parsed lean.
//!
//! The request is read in one pass of [`splice_json::Cursor`]: strings point into the body when
//! they hold no escapes, and the object is checked and read into the engine's pod view in that same
//! pass ([`Pod`]), so the server never builds a tree of the pod nor reads it twice. Unknown
//! fields (userInfo, oldObject, options) are skipped after being checked to be JSON.

use std::borrow::Cow;

use splice_engine::Pod;
use splice_json::push_json_str;
use splice_json::{self as json, Cursor};

/// The only AdmissionReview version Splice registers for (`admissionReviewVersions: [v1]`).
pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

/// The fields of the envelope Splice reads, as found (absent or `null` is `None`).
#[derive(Debug, Default)]
struct WireReview<'a> {
    api_version: Option<Cow<'a, str>>,
    kind: Option<Cow<'a, str>>,
    request: Option<WireRequest<'a>>,
}

#[derive(Debug, Default)]
struct WireRequest<'a> {
    uid: Option<Cow<'a, str>>,
    kind: Option<WireGroupVersion<'a>>,
    resource: Option<WireGroupVersion<'a>>,
    sub_resource: Option<Cow<'a, str>>,
    operation: Option<Cow<'a, str>>,
    namespace: Option<Cow<'a, str>>,
    name: Option<Cow<'a, str>>,
    object: Option<Pod<'a>>,
    dry_run: Option<bool>,
}

/// A GroupVersionKind or a GroupVersionResource: `name` is the kind or the resource.
#[derive(Debug, Default)]
struct WireGroupVersion<'a> {
    group: Option<Cow<'a, str>>,
    version: Option<Cow<'a, str>>,
    name: Option<Cow<'a, str>>,
}

/// Reads one field into `slot`. A field seen twice is refused, as serde's derive does: two uids
/// would leave the reply's uid a guess.
fn field<'a, T>(
    c: &mut Cursor<'a>,
    slot: &mut Option<Option<T>>,
    read: impl FnOnce(&mut Cursor<'a>) -> Result<T, json::Error>,
) -> Result<(), json::Error> {
    if slot.is_some() {
        return Err(c.shape_error("a field appears twice"));
    }
    *slot = Some(if c.null()? { None } else { Some(read(c)?) });
    Ok(())
}

fn text<'a>(c: &mut Cursor<'a>) -> Result<Cow<'a, str>, json::Error> {
    c.string()
}

fn read_review<'a>(c: &mut Cursor<'a>) -> Result<WireReview<'a>, json::Error> {
    let (mut api_version, mut kind, mut request) = (None, None, None);
    let mut members = c.object()?;
    while let Some(key) = c.key(&mut members)? {
        match &*key {
            "apiVersion" => field(c, &mut api_version, text)?,
            "kind" => field(c, &mut kind, text)?,
            "request" => field(c, &mut request, read_request)?,
            _ => c.skip_value()?,
        }
    }
    Ok(WireReview {
        api_version: api_version.flatten(),
        kind: kind.flatten(),
        request: request.flatten(),
    })
}

fn read_request<'a>(c: &mut Cursor<'a>) -> Result<WireRequest<'a>, json::Error> {
    let (mut uid, mut kind, mut resource, mut sub_resource) = (None, None, None, None);
    let (mut operation, mut namespace, mut name, mut object, mut dry_run) =
        (None, None, None, None, None);
    let mut members = c.object()?;
    while let Some(key) = c.key(&mut members)? {
        match &*key {
            "uid" => field(c, &mut uid, text)?,
            "kind" => field(c, &mut kind, |c| read_group_version(c, "kind"))?,
            "resource" => field(c, &mut resource, |c| read_group_version(c, "resource"))?,
            "subResource" => field(c, &mut sub_resource, text)?,
            "operation" => field(c, &mut operation, text)?,
            "namespace" => field(c, &mut namespace, text)?,
            "name" => field(c, &mut name, text)?,
            "object" => field(c, &mut object, Pod::read)?,
            "dryRun" => field(c, &mut dry_run, Cursor::boolean)?,
            _ => c.skip_value()?,
        }
    }
    Ok(WireRequest {
        uid: uid.flatten(),
        kind: kind.flatten(),
        resource: resource.flatten(),
        sub_resource: sub_resource.flatten(),
        operation: operation.flatten(),
        namespace: namespace.flatten(),
        name: name.flatten(),
        object: object.flatten(),
        dry_run: dry_run.flatten(),
    })
}

fn read_group_version<'a>(
    c: &mut Cursor<'a>,
    name_key: &str,
) -> Result<WireGroupVersion<'a>, json::Error> {
    let (mut group, mut version, mut name) = (None, None, None);
    let mut members = c.object()?;
    while let Some(key) = c.key(&mut members)? {
        match &*key {
            "group" => field(c, &mut group, text)?,
            "version" => field(c, &mut version, text)?,
            k if k == name_key => field(c, &mut name, text)?,
            _ => c.skip_value()?,
        }
    }
    Ok(WireGroupVersion {
        group: group.flatten(),
        version: version.flatten(),
        name: name.flatten(),
    })
}

/// `request.operation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdmissionOperation {
    Create,
    Update,
    Delete,
    Connect,
}

impl AdmissionOperation {
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionOperation::Create => "CREATE",
            AdmissionOperation::Update => "UPDATE",
            AdmissionOperation::Delete => "DELETE",
            AdmissionOperation::Connect => "CONNECT",
        }
    }

    /// The operation as policies configure it; `None` for those no policy can select.
    pub fn injectable(self) -> Option<splice_crds::Operation> {
        match self {
            AdmissionOperation::Create => Some(splice_crds::Operation::Create),
            AdmissionOperation::Update => Some(splice_crds::Operation::Update),
            AdmissionOperation::Delete | AdmissionOperation::Connect => None,
        }
    }
}

/// A checked AdmissionReview request, borrowing from the body.
#[derive(Debug)]
pub struct Review<'a> {
    pub api_version: Cow<'a, str>,
    pub kind: Cow<'a, str>,
    pub uid: Cow<'a, str>,
    pub operation: AdmissionOperation,
    /// True when the request is about the `pods` resource itself (core/v1, no subresource).
    pub is_pod: bool,
    pub namespace: Cow<'a, str>,
    pub name: Option<Cow<'a, str>>,
    /// The incoming object, verbatim and checked to be JSON, with the engine's view of it read in
    /// the same pass. Present for every CREATE and UPDATE of a pod.
    pub object: Option<Pod<'a>>,
    pub dry_run: bool,
}

/// Why a body is not an AdmissionReview Splice can answer (HTTP 400).
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ReviewError {
    #[error("the request body is empty")]
    #[strum(serialize = "empty_body")]
    Empty,
    #[error("the request body is truncated: {0}")]
    #[strum(serialize = "truncated_body")]
    Truncated(#[source] json::Error),
    #[error("the request body is not JSON: {0}")]
    NotJson(#[source] json::Error),
    #[error("the request body is not an AdmissionReview: {0}")]
    #[strum(serialize = "not_an_admission_review")]
    Shape(#[source] json::Error),
    #[error("apiVersion is {0:?}; Splice only speaks {API_VERSION}")]
    #[strum(serialize = "unsupported_api_version")]
    ApiVersion(String),
    #[error("kind is {0:?}; expected {KIND}")]
    #[strum(serialize = "wrong_kind")]
    Kind(String),
    #[error("the AdmissionReview has no request")]
    NoRequest,
    #[error("request.uid is missing or empty")]
    NoUid,
    #[error("request.kind is missing")]
    #[strum(serialize = "no_request_kind")]
    NoKind,
    #[error("request.operation is {0:?}; expected CREATE, UPDATE, DELETE or CONNECT")]
    #[strum(serialize = "unknown_operation")]
    Operation(String),
    #[error("request.object is missing for a {0} of a pod")]
    NoObject(&'static str),
    #[error("request.namespace is missing for a pod")]
    NoNamespace,
}

impl ReviewError {
    /// Stable label for logs and metrics.
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

/// Echoing request input in an error message is useful, but only a little of it.
fn clip(value: &str) -> String {
    const MAX: usize = 64;
    match value.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &value[..cut]),
        None => value.to_owned(),
    }
}

/// Parses and checks an AdmissionReview body.
pub fn parse_review(body: &[u8]) -> Result<Review<'_>, ReviewError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ReviewError::Empty);
    }
    let wire = json::utf8(body)
        .and_then(|text| Cursor::new(text).document(read_review))
        .map_err(|e| match e.kind() {
            json::ErrorKind::Eof => ReviewError::Truncated(e),
            json::ErrorKind::Syntax => ReviewError::NotJson(e),
            json::ErrorKind::Shape => ReviewError::Shape(e),
        })?;
    let api_version = wire.api_version.unwrap_or_default();
    if api_version != API_VERSION {
        return Err(ReviewError::ApiVersion(clip(&api_version)));
    }
    let kind = wire.kind.unwrap_or_default();
    if kind != KIND {
        return Err(ReviewError::Kind(clip(&kind)));
    }
    let request = wire.request.ok_or(ReviewError::NoRequest)?;
    let uid = request
        .uid
        .filter(|u| !u.is_empty())
        .ok_or(ReviewError::NoUid)?;
    let gvk = request.kind.ok_or(ReviewError::NoKind)?;
    let operation = match request.operation.as_deref() {
        Some("CREATE") => AdmissionOperation::Create,
        Some("UPDATE") => AdmissionOperation::Update,
        Some("DELETE") => AdmissionOperation::Delete,
        Some("CONNECT") => AdmissionOperation::Connect,
        other => return Err(ReviewError::Operation(clip(other.unwrap_or_default()))),
    };
    let is_core_v1 = |gv: &WireGroupVersion<'_>| {
        gv.group.as_deref().unwrap_or_default().is_empty() && gv.version.as_deref() == Some("v1")
    };
    let kind_is_pod = gvk.name.as_deref() == Some("Pod") && is_core_v1(&gvk);
    // The resource is optional in practice (hand-written reviews); when present it must agree.
    let resource_is_pods = request
        .resource
        .as_ref()
        .is_none_or(|r| r.name.as_deref() == Some("pods") && is_core_v1(r));
    let whole_object = request.sub_resource.unwrap_or_default().is_empty();
    let is_pod = kind_is_pod && resource_is_pods && whole_object;
    let namespace = request.namespace.unwrap_or_default();
    let object = request.object;
    if is_pod {
        if operation.injectable().is_some() && object.is_none() {
            return Err(ReviewError::NoObject(operation.as_str()));
        }
        if namespace.is_empty() {
            return Err(ReviewError::NoNamespace);
        }
    }
    Ok(Review {
        api_version,
        kind,
        uid,
        operation,
        is_pod,
        namespace,
        name: request.name.filter(|n| !n.is_empty()),
        object,
        dry_run: request.dry_run.unwrap_or(false),
    })
}

/// Serializes an allowing AdmissionReview response echoing the request's `apiVersion`, `kind` and
/// `uid`. `patch` (a serialized JSON Patch array) is included, base64-encoded with
/// `patchType: JSONPatch`, only when `Some`. Written by hand: it is on every request, and the
/// base64 text needs no escaping, which a serializer would check byte by byte.
pub fn allowed_response(
    api_version: &str,
    kind: &str,
    uid: &str,
    patch: Option<&[u8]>,
    warnings: &[String],
) -> Vec<u8> {
    const HEAD: &[u8] = br#"{"apiVersion":"#;
    const PATCH: &[u8] = br#","patchType":"JSONPatch","patch":""#;
    // Escapes can grow a string 6-fold, but rarely do: size for the plain text, and let the
    // rare escaped string grow the buffer once.
    let warnings_len: usize = warnings.iter().map(|w| w.len() + 3).sum();
    let mut out = Vec::with_capacity(
        HEAD.len()
            + 64
            + PATCH.len()
            + api_version.len()
            + kind.len()
            + uid.len()
            + patch.map_or(0, |p| p.len().div_ceil(3) * 4)
            + warnings_len,
    );
    out.extend_from_slice(HEAD);
    push_json_str(&mut out, api_version);
    out.extend_from_slice(br#","kind":"#);
    push_json_str(&mut out, kind);
    out.extend_from_slice(br#","response":{"uid":"#);
    push_json_str(&mut out, uid);
    out.extend_from_slice(br#","allowed":true"#);
    if let Some(patch) = patch {
        out.extend_from_slice(PATCH);
        // SSSE3/AVX2/NEON chosen at run time: the patch is most of the response.
        base64_simd::STANDARD.encode_append(patch, &mut out);
        out.push(b'"');
    }
    if let Some((first, rest)) = warnings.split_first() {
        out.extend_from_slice(br#","warnings":["#);
        push_json_str(&mut out, first);
        for w in rest {
            out.push(b',');
            push_json_str(&mut out, w);
        }
        out.push(b']');
    }
    out.extend_from_slice(b"}}");
    out
}

/// Serializes a refusing AdmissionReview response: `status.message` is what kubectl prints after
/// "denied the request:"; `code` 422 with reason `Invalid` says the object is at fault, not the
/// caller's permissions. Warnings ride along, as on an allowed response.
pub fn denied_response(
    api_version: &str,
    kind: &str,
    uid: &str,
    message: &str,
    warnings: &[String],
) -> Vec<u8> {
    let mut response = serde_json::json!({
        "uid": uid,
        "allowed": false,
        "status": {"code": 422, "reason": "Invalid", "message": message},
    });
    if !warnings.is_empty() {
        response["warnings"] = serde_json::json!(warnings);
    }
    let review = serde_json::json!({
        "apiVersion": api_version,
        "kind": kind,
        "response": response,
    });
    serde_json::to_vec(&review).unwrap_or_default()
}

/// Finds `request.uid` without parsing the body: the benchmark's null handler measures the server
/// stack alone. It looks for the first `"uid"` key, which in an AdmissionReview is the request's.
#[cfg(any(test, feature = "bench-baselines"))]
pub fn scan_uid(body: &[u8]) -> Option<&str> {
    const KEY: &[u8] = b"\"uid\"";
    let at = body.windows(KEY.len()).position(|w| w == KEY)?;
    let rest = body.get(at + KEY.len()..)?;
    let rest = rest
        .trim_ascii_start()
        .strip_prefix(b":")?
        .trim_ascii_start();
    let rest = rest.strip_prefix(b"\"")?;
    let end = rest.iter().position(|&b| b == b'"' || b == b'\\')?;
    std::str::from_utf8(rest.get(..end)?).ok()
}

/// The serde reader this module used before the cursor, kept as the oracle of a differential test.
#[cfg(test)]
mod serde_oracle {
    #![allow(clippy::all)]
    use std::borrow::Cow;

    use serde_json::value::RawValue;

    use super::{API_VERSION, AdmissionOperation, KIND, Review};

    /// A string borrowed from the body when possible. `Option<Cow<str>>` alone never borrows.
    #[derive(Debug, serde::Deserialize)]
    #[serde(transparent)]
    struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

    #[derive(Debug, serde::Deserialize)]
    struct WireReview<'a> {
        #[serde(rename = "apiVersion", borrow)]
        api_version: Option<Text<'a>>,
        #[serde(borrow)]
        kind: Option<Text<'a>>,
        #[serde(borrow)]
        request: Option<WireRequest<'a>>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct WireRequest<'a> {
        #[serde(borrow)]
        uid: Option<Text<'a>>,
        #[serde(borrow)]
        kind: Option<WireGroupVersionKind<'a>>,
        #[serde(borrow)]
        resource: Option<WireGroupVersionResource<'a>>,
        #[serde(borrow)]
        sub_resource: Option<Text<'a>>,
        #[serde(borrow)]
        operation: Option<Text<'a>>,
        #[serde(borrow)]
        namespace: Option<Text<'a>>,
        #[serde(borrow)]
        name: Option<Text<'a>>,
        #[serde(borrow)]
        object: Option<&'a RawValue>,
        dry_run: Option<bool>,
    }

    #[derive(Debug, serde::Deserialize)]
    struct WireGroupVersionKind<'a> {
        #[serde(borrow)]
        group: Option<Text<'a>>,
        #[serde(borrow)]
        version: Option<Text<'a>>,
        #[serde(borrow)]
        kind: Option<Text<'a>>,
    }

    #[derive(Debug, serde::Deserialize)]
    struct WireGroupVersionResource<'a> {
        #[serde(borrow)]
        group: Option<Text<'a>>,
        #[serde(borrow)]
        version: Option<Text<'a>>,
        #[serde(borrow)]
        resource: Option<Text<'a>>,
    }

    fn text<'a>(t: Option<Text<'a>>) -> Option<Cow<'a, str>> {
        t.map(|t| t.0)
    }

    pub(super) fn parse_review(body: &[u8]) -> Result<Review<'_>, &'static str> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err("empty_body");
        }
        let wire: WireReview<'_> = serde_json::from_slice(body).map_err(|e| {
            if e.is_eof() {
                "truncated_body"
            } else if e.is_syntax() {
                "not_json"
            } else {
                "not_an_admission_review"
            }
        })?;
        let api_version = text(wire.api_version).unwrap_or_default();
        if api_version != API_VERSION {
            return Err("unsupported_api_version");
        }
        let kind = text(wire.kind).unwrap_or_default();
        if kind != KIND {
            return Err("wrong_kind");
        }
        let request = wire.request.ok_or("no_request")?;
        let uid = text(request.uid)
            .filter(|u| !u.is_empty())
            .ok_or("no_uid")?;
        let gvk = request.kind.ok_or("no_request_kind")?;
        let operation = match text(request.operation).as_deref() {
            Some("CREATE") => AdmissionOperation::Create,
            Some("UPDATE") => AdmissionOperation::Update,
            Some("DELETE") => AdmissionOperation::Delete,
            Some("CONNECT") => AdmissionOperation::Connect,
            _ => return Err("unknown_operation"),
        };
        let is_core_v1 = |group: Option<Text<'_>>, version: Option<Text<'_>>| {
            text(group).unwrap_or_default().is_empty() && text(version).as_deref() == Some("v1")
        };
        let kind_is_pod =
            text(gvk.kind).as_deref() == Some("Pod") && is_core_v1(gvk.group, gvk.version);
        // The resource is optional in practice (hand-written reviews); when present it must agree.
        let resource_is_pods = request.resource.is_none_or(|r| {
            text(r.resource).as_deref() == Some("pods") && is_core_v1(r.group, r.version)
        });
        let whole_object = text(request.sub_resource).unwrap_or_default().is_empty();
        let is_pod = kind_is_pod && resource_is_pods && whole_object;
        let namespace = text(request.namespace).unwrap_or_default();
        let object = request.object.filter(|o| o.get() != "null");
        if is_pod {
            if operation.injectable().is_some() && object.is_none() {
                return Err("no_object");
            }
            if namespace.is_empty() {
                return Err("no_namespace");
            }
        }
        Ok(Review {
            api_version,
            kind,
            uid,
            operation,
            is_pod,
            namespace,
            name: text(request.name).filter(|n| !n.is_empty()),
            // serde checked the object already; the pod view comes from the engine's reader.
            object: object.and_then(|o| splice_engine::Pod::parse(o.get()).ok()),
            dry_run: request.dry_run.unwrap_or(false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(request: &str) -> String {
        format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{request}}}"#
        )
    }

    /// The object of POD_CREATE.
    const POD: &str = r#"{"metadata":{"name":"p"},"spec":{"containers":[{"name":"app"}]}}"#;

    const POD_CREATE: &str = r#"{"uid":"u-1","kind":{"group":"","version":"v1","kind":"Pod"},
        "resource":{"group":"","version":"v1","resource":"pods"},"operation":"CREATE",
        "namespace":"team-a","userInfo":{"username":"x"},
        "object":{"metadata":{"name":"p"},"spec":{"containers":[{"name":"app"}]}},"dryRun":true}"#;

    #[test]
    fn a_pod_create_is_parsed_and_its_object_kept_verbatim() {
        let body = review(POD_CREATE);
        let r = parse_review(body.as_bytes()).unwrap();
        assert_eq!(r.uid, "u-1");
        assert_eq!(r.operation, AdmissionOperation::Create);
        assert!(r.is_pod);
        assert!(r.dry_run);
        assert_eq!(r.namespace, "team-a");
        assert_eq!(r.object.map(|o| o.text()), Some(POD));
        assert!(
            matches!(r.uid, Cow::Borrowed(_)),
            "uid should borrow from the body"
        );
    }

    /// The object of POD_CREATE with `spec.containers` a string: JSON, but no pod.
    const MISSHAPEN: &str = r#"{"metadata":{"name":"p"},"spec":{"containers":"app"}}"#;

    #[test]
    fn a_misshapen_object_is_still_checked_to_its_end() {
        let body = review(&POD_CREATE.replace(POD, MISSHAPEN));
        assert!(parse_review(body.as_bytes()).is_ok());
        // A syntax error after the misshapen field is the body's: a 400, not an engine error.
        let broken = MISSHAPEN.replace("}}", r#"},"x":[1 2]}"#);
        let body = review(&POD_CREATE.replace(POD, &broken));
        assert_eq!(
            parse_review(body.as_bytes()).unwrap_err().label(),
            "not_json"
        );
    }

    #[test]
    fn a_misshapen_object_fails_the_engine_as_the_offline_read_fails_it() {
        let body = review(&POD_CREATE.replace(POD, MISSHAPEN));
        let review = parse_review(body.as_bytes()).unwrap();
        let object = review.object.unwrap();
        assert_eq!(object.text(), MISSHAPEN);
        let offline_object = splice_engine::Pod::parse(MISSHAPEN).unwrap();
        let spec = serde_json::from_value(serde_json::json!({
            "template": {"containers": [{"name": "proxy", "image": "r.invalid/p:1"}]}
        }))
        .unwrap();
        let policy = splice_engine::CompiledPolicy::compile("p", 1, &spec).unwrap();
        let namespace = splice_engine::NamespaceContext::default();
        let exclusions = splice_engine::Exclusions::default_for("splice-system");
        let request = |object| splice_engine::PodRequest {
            operation: splice_crds::Operation::Create,
            object,
            namespace: &namespace,
            exclusions: &exclusions,
            trust_domain: splice_engine::identity::DEFAULT_TRUST_DOMAIN,
            selection: splice_engine::Selection::Evaluate,
        };
        let online = splice_engine::inject(&policy, &request(&object)).unwrap_err();
        let offline = splice_engine::inject(&policy, &request(&offline_object)).unwrap_err();
        // The same message, the offset counted from the object's start in both.
        assert_eq!(online.to_string(), offline.to_string());
        assert_eq!(online.label(), "invalid_object");
    }

    #[test]
    fn an_escaped_uid_is_decoded() {
        let body = review(&POD_CREATE.replace(r#""u-1""#, r#""u\u002d1""#));
        assert_eq!(parse_review(body.as_bytes()).unwrap().uid, "u-1");
    }

    #[test]
    fn bad_bodies_are_told_apart() {
        let label = |b: &str| parse_review(b.as_bytes()).unwrap_err().label();
        assert_eq!(label(""), "empty_body");
        assert_eq!(label("  \n"), "empty_body");
        let full = review(POD_CREATE);
        assert_eq!(label(&full[..full.len() / 2]), "truncated_body");
        assert_eq!(label("hello"), "not_json");
        assert_eq!(label("[1,2]"), "not_an_admission_review");
        assert_eq!(
            label(r#"{"apiVersion":"admission.k8s.io/v1beta1"}"#),
            "unsupported_api_version"
        );
        assert_eq!(
            label(r#"{"apiVersion":"admission.k8s.io/v1","kind":"Pod"}"#),
            "wrong_kind"
        );
        assert_eq!(
            label(r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#),
            "no_request"
        );
        assert_eq!(label(&review(r#"{"kind":{"kind":"Pod"}}"#)), "no_uid");
        assert_eq!(label(&review(r#"{"uid":""}"#)), "no_uid");
        assert_eq!(label(&review(r#"{"uid":"u"}"#)), "no_request_kind");
        assert_eq!(
            label(&review(
                r#"{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"PATCH"}"#
            )),
            "unknown_operation"
        );
        assert_eq!(
            label(&review(
                r#"{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","namespace":"a"}"#
            )),
            "no_object"
        );
        assert_eq!(
            label(&review(
                r#"{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","object":{}}"#
            )),
            "no_namespace"
        );
    }

    #[test]
    fn a_duplicated_uid_is_refused_rather_than_guessed() {
        let body = review(r#"{"uid":"a","uid":"b","kind":{"version":"v1","kind":"Pod"}}"#);
        assert_eq!(
            parse_review(body.as_bytes()).unwrap_err().label(),
            "not_an_admission_review"
        );
    }

    #[test]
    fn error_messages_clip_what_they_echo() {
        let long = "x".repeat(10_000);
        let body = format!(r#"{{"apiVersion":"{long}"}}"#);
        let message = parse_review(body.as_bytes()).unwrap_err().to_string();
        assert!(message.len() < 200, "{message}");
    }

    #[test]
    fn a_delete_without_object_and_non_pods_are_parsed() {
        let body = review(
            r#"{"uid":"u","kind":{"version":"v1","kind":"Pod"},"operation":"DELETE","namespace":"a","object":null}"#,
        );
        let r = parse_review(body.as_bytes()).unwrap();
        assert_eq!(r.operation, AdmissionOperation::Delete);
        assert!(r.object.is_none());

        let body = review(
            r#"{"uid":"u","kind":{"group":"apps","version":"v1","kind":"Deployment"},"operation":"CREATE","namespace":"a","object":{}}"#,
        );
        assert!(!parse_review(body.as_bytes()).unwrap().is_pod);

        let body = review(
            r#"{"uid":"u","kind":{"version":"v1","kind":"Pod"},"resource":{"version":"v1","resource":"pods"},"subResource":"status","operation":"UPDATE","namespace":"a","object":{}}"#,
        );
        assert!(!parse_review(body.as_bytes()).unwrap().is_pod);
    }

    #[test]
    fn a_response_carries_the_patch_only_when_there_is_one() {
        let with = allowed_response(API_VERSION, KIND, "u", Some(b"[]"), &["w".to_owned()]);
        let v: serde_json::Value = serde_json::from_slice(&with).unwrap();
        assert_eq!(v["apiVersion"], API_VERSION);
        assert_eq!(v["kind"], KIND);
        assert_eq!(v["response"]["uid"], "u");
        assert_eq!(v["response"]["allowed"], true);
        assert_eq!(v["response"]["patchType"], "JSONPatch");
        assert_eq!(v["response"]["patch"], "W10=");
        assert_eq!(v["response"]["warnings"][0], "w");

        let without = allowed_response(API_VERSION, KIND, "u", None, &[]);
        let v: serde_json::Value = serde_json::from_slice(&without).unwrap();
        let response = v["response"].as_object().unwrap();
        assert!(!response.contains_key("patch"));
        assert!(!response.contains_key("patchType"));
        assert!(!response.contains_key("warnings"));
    }

    /// What a parse tells the handler, for comparing two readers.
    fn outcome(r: Result<Review<'_>, &'static str>) -> String {
        match r {
            Ok(r) => format!(
                "{} {} {} {:?} {} {} {:?} {:?} {}",
                r.api_version,
                r.kind,
                r.uid,
                r.operation,
                r.is_pod,
                r.namespace,
                r.name,
                r.object.map(|o| o.text()),
                r.dry_run
            ),
            Err(label) => label.to_owned(),
        }
    }

    fn same_as_serde(body: &str) -> Result<(), String> {
        let ours = outcome(parse_review(body.as_bytes()).map_err(|e| e.label()));
        let theirs = outcome(serde_oracle::parse_review(body.as_bytes()));
        // serde's derive reads a struct from an array too; the cursor wants an object, as the
        // API server sends.
        let serde_read_an_array = body.trim_start().starts_with('[');
        // Where serde read a wrongly typed field before a syntax error later on, it reports the
        // type; the cursor reports whichever comes first too, but tells a byte that cannot start
        // a value as a syntax error. Either way the body is refused.
        let both_refused_as_malformed = ours != theirs
            && [&ours, &theirs].iter().all(|o| {
                ["not_json", "not_an_admission_review", "truncated_body"].contains(&o.as_str())
            });
        if ours == theirs || serde_read_an_array || both_refused_as_malformed {
            Ok(())
        } else {
            Err(format!("cursor {ours} vs serde {theirs}"))
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        #[test]
        fn mutated_reviews_are_read_as_the_serde_reader_read_them(
            doc in splice_json::testkit::mutated_review()
        ) {
            if let Err(e) = same_as_serde(&doc) {
                proptest::prop_assert!(false, "{} on {:?}", e, doc);
            }
        }
    }

    #[test]
    fn the_fixture_reviews_are_read_as_the_serde_reader_read_them() {
        same_as_serde(&review(POD_CREATE)).unwrap();
        for pod in &splice_json::testkit::SEEDS[..4] {
            let body = review(&POD_CREATE.replace(
                r#"{"metadata":{"name":"p"},"spec":{"containers":[{"name":"app"}]}}"#,
                pod,
            ));
            same_as_serde(&body).unwrap();
            assert!(parse_review(body.as_bytes()).unwrap().object.is_some());
        }
    }

    #[test]
    fn an_object_that_is_not_json_is_refused_with_the_envelope() {
        let body = review(&POD_CREATE.replace(r#"{"name":"app"}"#, r#"{"name":"app",}"#));
        assert_eq!(
            parse_review(body.as_bytes()).unwrap_err().label(),
            "not_json"
        );
        let body = review(&POD_CREATE.replace(r#""p""#, "\"\\ud800\""));
        // A lone surrogate inside the object is skipped as serde skips it; the engine decides.
        assert!(parse_review(body.as_bytes()).is_ok());
        let mut bytes = review(POD_CREATE).into_bytes();
        let at = bytes.iter().position(|&b| b == b'p').unwrap();
        bytes[at] = 0xff;
        assert_eq!(parse_review(&bytes).unwrap_err().label(), "not_json");
    }

    #[test]
    fn strings_in_a_response_are_escaped_as_serde_escapes_them() {
        let mut every_byte: String = (0u8..0x80).map(char::from).collect();
        every_byte.push_str("é\u{2028}\u{1F600}");
        for s in ["", "u-1", "a\"b\\c", "\u{7f}", every_byte.as_str()] {
            let mut ours = Vec::new();
            push_json_str(&mut ours, s);
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                serde_json::to_string(s).unwrap()
            );
        }
        let warnings = ["w\"1".to_owned(), "w2".to_owned()];
        let body = allowed_response(API_VERSION, KIND, "u\n", Some(b"[{}]"), &warnings);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["response"]["uid"], "u\n");
        assert_eq!(v["response"]["warnings"][0], "w\"1");
        assert_eq!(v["response"]["warnings"][1], "w2");
    }

    #[test]
    fn the_uid_scanner_finds_the_request_uid() {
        let body = review(POD_CREATE);
        assert_eq!(scan_uid(body.as_bytes()), Some("u-1"));
        assert_eq!(scan_uid(br#"{"uid" : "abc"}"#), Some("abc"));
        assert_eq!(scan_uid(br#"{"uid":"abc"#), None);
        assert_eq!(scan_uid(b"nothing"), None);
    }
}
