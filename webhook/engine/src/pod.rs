//! A pod as the engine reads it, once, and the provenance record it carries.

use splice_crds::STATUS_ANNOTATION;
use view::{FromJson, PodView, Str};

use crate::*;
use splice_json::{self as json, Cursor};

/// A pod as the engine takes it: its JSON text, never round-tripped through a typed struct, and
/// what the engine reads of it, read in the same pass that checks the text is JSON.
#[derive(Debug)]
pub struct Pod<'a> {
    pub(crate) text: &'a str,
    /// What the engine reads, or why the value (valid JSON) is not shaped like a pod, with its
    /// offset counted from the value's start.
    pub(crate) view: Result<PodView<'a>, json::Error>,
}

impl<'a> Pod<'a> {
    /// Reads a whole JSON document. Text that is not JSON is refused here; JSON not shaped like a
    /// pod is kept with its shape error, which the engine reports only if asked to inject into it.
    pub fn parse(text: &'a str) -> Result<Self, EngineError> {
        Cursor::new(text)
            .document(Self::read)
            .map_err(|e| EngineError::InvalidObject(e.to_string()))
    }

    /// Reads the value at the cursor, as [`Pod::parse`] reads a document: the admission envelope
    /// reads `request.object` this way, so the pod is neither checked nor read a second time.
    pub fn read(c: &mut Cursor<'a>) -> Result<Self, json::Error> {
        c.peek();
        let start = c.offset();
        let mut reader = c.clone();
        let view = match PodView::read(&mut reader) {
            Ok(view) => {
                *c = reader;
                Ok(view)
            }
            // The view stopped at the first misshapen field; a syntax error may still follow.
            Err(e) if e.kind() == json::ErrorKind::Shape => {
                c.skip_value()?;
                Err(e.relative_to(start))
            }
            Err(e) => return Err(e),
        };
        Ok(Pod {
            text: c.since(start),
            view,
        })
    }

    /// The pod's JSON text, verbatim.
    pub fn text(&self) -> &'a str {
        self.text
    }

    /// The name of the token volume the ServiceAccount plugin added (the first
    /// `kube-api-access-*`, as the planner takes it).
    pub(crate) fn token_volume(&self) -> Option<&str> {
        self.view
            .as_ref()
            .ok()?
            .spec
            .as_ref()?
            .volumes
            .as_ref()?
            .0
            .iter()
            .map(|v| v.name())
            .find(|n| n.starts_with(crate::compile::TOKEN_VOLUME_PREFIX))
    }

    /// The text before and after the value of `metadata.managedFields`; the whole text and ""
    /// when there is none (or the value is not shaped like a pod).
    pub(crate) fn around_managed_fields(&self) -> (&'a str, &'a str) {
        let whole = (self.text, "");
        let Some(raw) = self
            .view
            .as_ref()
            .ok()
            .and_then(|v| v.metadata.as_ref())
            .and_then(|m| m.managed_fields)
        else {
            return whole;
        };
        let Some(start) = raw
            .get()
            .as_ptr()
            .addr()
            .checked_sub(self.text.as_ptr().addr())
        else {
            return whole;
        };
        let end = start + raw.get().len();
        match (self.text.get(..start), self.text.get(end..)) {
            (Some(before), Some(after)) => (before, after),
            _ => whole,
        }
    }

    pub(crate) fn view(&self) -> Result<&PodView<'a>, EngineError> {
        self.view
            .as_ref()
            .map_err(|e| EngineError::InvalidObject(e.to_string()))
    }
}

pub(crate) fn parse_value(object: &str) -> Result<serde_json::Value, EngineError> {
    serde_json::from_str(object).map_err(|e| EngineError::InvalidObject(e.to_string()))
}

/// Reads `text` as each of the engine's pod views with the JSON cursor and with the serde readers
/// it replaced; an error describes the first disagreement. For the differential fuzz target.
#[cfg(feature = "serde-oracle")]
#[doc(hidden)]
pub fn oracle_check_views(text: &str) -> Result<(), String> {
    view::oracle::check(text)
}

/// Reads the `splice.dev/status` annotation of a pod (raw JSON): what each Splice policy injected.
/// An absent annotation gives an empty map.
pub fn provenance(object: &str) -> Result<Provenance, EngineError> {
    let view: PodView<'_> =
        view::from_str(object).map_err(|e| EngineError::InvalidObject(e.to_string()))?;
    let raw = view
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(STATUS_ANNOTATION));
    let Some(raw) = raw else {
        return Ok(Provenance::new());
    };
    let text: Str<'_> = view::from_str(raw.get()).map_err(|e| {
        EngineError::InvalidObject(format!("metadata.annotations[{STATUS_ANNOTATION:?}]: {e}"))
    })?;
    serde_json::from_str(&text).map_err(|e| {
        EngineError::InvalidObject(format!("metadata.annotations[{STATUS_ANNOTATION:?}]: {e}"))
    })
}
