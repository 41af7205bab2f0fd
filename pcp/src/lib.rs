//! PCP, PASA's control plane server: the store API with every write admitted first (embedded
//! store or remote), the admission webhook, and the Kubernetes syncer. What admission checks
//! is `pasa-validation`'s; the command line is `pasactl`'s own crate.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod debug;
pub mod jwks;
pub mod kubernetes;
pub mod mesh;
pub mod metrics;
pub mod server;
pub mod webhook;
pub mod write;
