//! `pasactl`, PASA's command line: apply, get, delete and watch resources, validate files as the
//! write path would, and show what agents serve (`proxy-config`, `proxy-status`), with kubectl's
//! and istioctl's habits. It speaks the store API (to a store or to PCP in front of one) and
//! agents' admin endpoints, and links no storage engine.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod cli;
pub use pasa_envoy_json as envoy_json;
