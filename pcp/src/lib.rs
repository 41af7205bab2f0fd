//! PCP, PASA's control plane: Istio-parity validation, the write path into the store (embedded
//! or remote), the admission webhook, and `pasactl`.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod admission;
pub mod analysis;
pub mod cli;
pub mod envoy_json;
pub mod manifest;
pub mod metrics;
pub mod server;
pub mod validation;
pub mod webhook;
pub mod write;
