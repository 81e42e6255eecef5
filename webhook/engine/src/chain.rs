//! Several policies admitted in one call, in a given order: each policy sees the pod as the ones
//! before it left it, and the answer is one patch that writes the provenance annotation once.
//!
//! A shared webhook entry serves a group of policies with one API-server round trip; this is what
//! it answers. Each policy's own patch is planned by [`crate::inject`] exactly as for a call of its
//! own, so a policy behaves the same whether it shares a call or not.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use json_patch::{AddOperation, PatchOperation};
use serde_json::Value;
use splice_crds::STATUS_ANNOTATION;

use crate::cache::{ChainCache, ChainKey, KeptAnswer};
use crate::{CompiledPolicy, Decision, EngineError, Injection, Pod, PodRequest, inject};

/// What a chain of policies decided for one pod.
#[derive(Debug)]
pub struct Chained {
    /// Each policy's decision, in the order the policies were given. A policy that failed
    /// contributed nothing to [`Chained::patch`]; the policies after it still ran.
    pub decisions: Vec<Result<Decision, EngineError>>,
    /// The whole call: every policy's operations in order as one JSON array, and every policy's
    /// warnings in order.
    pub whole: Injection,
}

/// [`inject_in_order`] as the webhook runs it: a request equal to one answered before gets that
/// answer from `cache` (see [`ChainCache`] for what "equal" covers). A single policy has caches
/// of its own; a chain's later policies see a pod the earlier ones annotated, which those caches
/// never keep, so without this every chain would be planned afresh for each pod of a burst.
pub fn inject_in_order_kept(
    cache: &ChainCache,
    policies: &[&Arc<CompiledPolicy>],
    request: &PodRequest<'_>,
) -> Chained {
    let refs: Vec<&CompiledPolicy> = policies.iter().map(|p| &***p).collect();
    if refs.len() < 2 {
        return inject_in_order(&refs, request);
    }
    let exact = refs.iter().any(|p| p.reads_pod());
    let (object, token) = if exact {
        (Cow::Borrowed(request.object.text()), None)
    } else {
        let (before, after) = request.object.around_managed_fields();
        let text = [before, after].concat();
        match request.object.token_volume() {
            Some(token) if !refs.iter().any(|p| p.names_token_volumes) => {
                let masked = text.replace(token, crate::compile::TOKEN_MASK);
                (Cow::Owned(masked), Some(token))
            }
            _ => (Cow::Owned(text), None),
        }
    };
    let key = ChainKey {
        policies,
        operation: request.operation,
        selection: request.selection,
        namespace: request.namespace,
        exclusions: request.exclusions,
        trust_domain: request.trust_domain,
        object: &object,
        token,
    };
    if let Some(kept) = cache.get(&key) {
        return Chained {
            decisions: kept.decisions.into_iter().map(Ok).collect(),
            whole: kept.whole,
        };
    }
    let chained = inject_in_order(&refs, request);
    let decided: Option<Vec<Decision>> = chained
        .decisions
        .iter()
        .map(|d| d.as_ref().ok().cloned())
        .collect();
    if let Some(decisions) = decided {
        let answer = KeptAnswer {
            decisions,
            whole: chained.whole.clone(),
        };
        cache.insert(&key, answer);
    }
    chained
}

/// Admits `request.object` through `policies` in the order given.
pub fn inject_in_order(policies: &[&CompiledPolicy], request: &PodRequest<'_>) -> Chained {
    // One policy (most calls): its own patch as it planned it, shared with other pods of its
    // shape; nothing to apply for a next policy, nothing to join.
    if let [only] = policies {
        let decided = inject(only, request);
        let whole = match &decided {
            Ok(Decision::Inject(i)) => i.clone(),
            _ => Injection {
                patch: Bytes::from_static(b"[]"),
                changed: false,
                warnings: Vec::new(),
            },
        };
        return Chained {
            decisions: vec![decided],
            whole,
        };
    }
    let mut chain = Chain::default();
    let mut decisions = Vec::with_capacity(policies.len());
    for (i, policy) in policies.iter().enumerate() {
        let mut decided = match chain.text.as_deref() {
            None => inject(policy, request),
            Some(text) => Pod::parse(text).and_then(|pod| {
                inject(
                    policy,
                    &PodRequest {
                        object: &pod,
                        ..*request
                    },
                )
            }),
        };
        if let Ok(Decision::Inject(injection)) = &decided
            && injection.changed
        {
            let more = i + 1 < policies.len();
            if let Err(e) = chain.push(&injection.patch, request.object.text(), more) {
                decided = Err(e);
            }
        }
        if let Ok(Decision::Inject(injection)) = &decided {
            chain.warnings.extend(injection.warnings.iter().cloned());
        }
        decisions.push(decided);
    }
    let changed = !chain.ops.is_empty();
    if let Some(doc) = &chain.doc {
        one_status_write(&mut chain.ops, doc);
    }
    let patch = if changed {
        serde_json::to_vec(&chain.ops).map_or_else(|_| Bytes::from_static(b"[]"), Bytes::from)
    } else {
        Bytes::from_static(b"[]")
    };
    Chained {
        decisions,
        whole: Injection {
            patch,
            changed,
            warnings: chain.warnings,
        },
    }
}

#[derive(Default)]
struct Chain {
    /// The pod with every patch so far applied; `None` while nothing changed it.
    doc: Option<Value>,
    /// `doc` as text, for the next policy to read; `None` while nothing changed the pod.
    text: Option<String>,
    ops: Vec<PatchOperation>,
    warnings: Vec<String>,
}

impl Chain {
    /// Applies one policy's patch to the pod so far; `more` when another policy reads the result.
    fn push(&mut self, patch: &[u8], original: &str, more: bool) -> Result<(), EngineError> {
        let inapplicable =
            |e: String| EngineError::Bug(format!("the engine produced an inapplicable patch: {e}"));
        let ops: json_patch::Patch =
            serde_json::from_slice(patch).map_err(|e| inapplicable(e.to_string()))?;
        let doc = match &mut self.doc {
            Some(doc) => doc,
            None => self.doc.insert(
                serde_json::from_str(original)
                    .map_err(|e| EngineError::InvalidObject(e.to_string()))?,
            ),
        };
        // json_patch leaves the document as it was when an operation fails.
        json_patch::patch(doc, &ops).map_err(|e| inapplicable(e.to_string()))?;
        self.ops.extend(ops.0);
        self.text = if more {
            Some(serde_json::to_string(doc).map_err(|e| inapplicable(e.to_string()))?)
        } else {
            None
        };
        Ok(())
    }
}

/// The status annotation as a JSON pointer.
const STATUS_POINTER: &str = "/metadata/annotations/splice.dev~1status";

/// When several policies each rewrote the provenance annotation, keeps one write of its final
/// value, last: nothing between reads it, so the result is the same and the patch smaller.
fn one_status_write(ops: &mut Vec<PatchOperation>, doc: &Value) {
    let writes_status = |op: &PatchOperation| match op {
        PatchOperation::Add(a) if a.path.as_str() == "/metadata/annotations" => {
            a.value.get(STATUS_ANNOTATION).is_some()
        }
        PatchOperation::Add(a) => a.path.as_str() == STATUS_POINTER,
        PatchOperation::Replace(r) => r.path.as_str() == STATUS_POINTER,
        PatchOperation::Remove(r) => r.path.as_str() == STATUS_POINTER,
        _ => false,
    };
    if ops.iter().filter(|op| writes_status(op)).count() < 2 {
        return;
    }
    let Some(status) = doc
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(STATUS_ANNOTATION))
        .cloned()
    else {
        return;
    };
    ops.retain_mut(|op| match op {
        PatchOperation::Add(a) if a.path.as_str() == "/metadata/annotations" => {
            if let Some(map) = a.value.as_object_mut() {
                map.remove(STATUS_ANNOTATION);
            }
            true
        }
        other => !writes_status(other),
    });
    if let Ok(path) = json_patch::jsonptr::PointerBuf::parse(STATUS_POINTER) {
        ops.push(PatchOperation::Add(AddOperation {
            path,
            value: status,
        }));
    }
}
