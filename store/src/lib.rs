//! UCS, PASA's store: raw Istio resources under a global revision, inverted indexes on kind,
//! namespace, host and gateway, and selector watches that hear only about what matches.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod access;
pub mod backend;
pub mod hub;
pub mod index;
pub mod metrics;
pub mod peers;
pub mod record;
pub mod selector;
pub mod server;
pub mod service;
pub mod status;
pub mod store;
pub mod tls;
mod watch;

pub use store::{Store, StoreConfig, StoreError};
