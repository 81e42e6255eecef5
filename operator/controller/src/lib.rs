//! The operator: every replica serves the webhook from caches it keeps current; the replica that
//! holds the Lease also turns policies into webhook configurations, keeps the CA Secret and writes
//! status and Events.
//!
//! Layout: [`policy`] turns one InjectionPolicy into its webhook configuration and status (pure
//! decisions in `render`, `conditions`, `conflicts`, `in_force`, `enforcement`; API calls in `reconcile` and
//! `validating`); [`certs`] keeps the CA and serving certificates (pure decisions in `ca` and
//! `rotation`, API calls in its root); [`guard`] decides whether `Fail` may be in force,
//! [`view`] is the leader's one pod and namespace watch and the rule for where a pod stands,
//! [`coverage`] counts pods injected or missed, [`status`] says which manager owns which status
//! field, [`rollout`] restarts workloads with outdated pods, [`probe`] sends the admission probe's dry runs and
//! [`verdict`] (pure) reads them; [`leader`] keeps the Lease; [`runtime`] wires them for
//! `splice run` and runs the leader's work one term at a time; [`context`] is what reconciles share.

pub mod certs;
pub mod context;
pub mod coverage;
pub mod driver;
pub mod guard;
pub mod identity;
pub mod leader;
pub mod metrics;
pub mod policy;
pub mod probe;
pub mod retry;
pub mod rollout;
pub mod runtime;
pub mod status;
pub mod values;
pub mod verdict;
pub mod view;

pub use context::{Context, ContextParts, Settings};
pub use runtime::run;
