//! The injection engine and the HTTPS admission server.
pub mod engine;
