//! One InjectionPolicy turned into what serves it: the webhook configuration the API server calls,
//! the policy's status and Events, the ValidatingWebhookConfiguration that checks policies at
//! apply. Pure decisions in [`desired`] (what a policy should be), [`render`], [`conditions`],
//! [`conflicts`], [`neighbours`], [`in_force`] (which generation is in force) and
//! [`enforcement`] (whether the API server is seen enforcing it); API calls in [`reconcile`], [`intree_apply`] and
//! [`validating`], each object written through [`apply`]; a reconcile's failures in [`error`].

pub mod apply;
pub mod conditions;
pub mod conflicts;
pub mod desired;
pub mod enforcement;
pub mod error;

pub mod in_force;
pub mod intree;
pub mod intree_apply;
pub mod neighbours;
pub mod reconcile;
#[cfg(test)]
mod reconcile_tests;
pub mod render;
pub mod validating;
