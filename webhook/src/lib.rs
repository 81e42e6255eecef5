//! The injection engine and the HTTPS admission server.
pub mod admin;
pub mod admission;
pub mod engine;
pub mod json;
pub mod metrics;
pub mod server;
pub mod store;
pub mod tls;
