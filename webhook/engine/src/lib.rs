//! The injection engine: (policy, incoming pod as raw JSON, namespace context) → JSON Patch.
//!
//! Pure and synchronous: no I/O, no clock, no global state. The webhook calls it on the request
//! path and `splice inject` calls it offline, so both give byte-identical results.
//!
//! This file only lists the modules and what the crate exports.

mod cache;
mod chain;
pub mod change;
mod compile;
pub mod entry;
mod error;
pub mod explain;
mod facts;
pub mod identity;
mod inject;
pub mod intree;
pub mod overrides;
mod patch;
mod plan;
mod pod;
pub mod podsecurity;
mod provenance;
pub mod selector;
mod template;
mod validate;
pub mod values_from;
mod view;
pub mod warnings;

pub(crate) mod wire;

pub use cache::ChainCache;
pub use chain::{Chained, inject_in_order, inject_in_order_kept};
pub use compile::CompiledPolicy;
pub use error::{EngineError, PolicyError};
pub use inject::{
    Decision, Exclusions, Injection, NamespaceContext, PodRequest, Refused, Selection, SkipReason,
    inject, inject_and_apply,
};
pub use intree::{CelVariable, InTreeProgram, ModeDecision, WebhookOnly};
#[cfg(feature = "serde-oracle")]
pub use pod::oracle_check_views;
pub use pod::{Pod, provenance};
pub use podsecurity::PodSecurity;
pub use provenance::{OverrideRecord, Provenance, ProvenanceEntry};
pub use selector::Selector;
pub use template::{FUEL, MAX_RENDERED_LEN, MAX_SOURCE_LEN};
pub use values_from::{DataSources, ResolvedValues, SourceKind, SourceRef, ValuesFromError};
pub use warnings::PolicyWarning;
