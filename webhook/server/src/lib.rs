//! The HTTPS admission server: reads AdmissionReviews, asks the engine, answers; keeps the policy
//! and namespace stores it reads from; serves the admin endpoints.
pub mod admin;
pub mod admission;
pub mod metrics;
pub mod server;
pub mod store;
pub mod tls;
