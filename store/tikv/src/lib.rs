//! PASA's way into TiKV. [`Tikv`] is a blocking, transactional key-value client on tikv-client
//! (which brings an older gRPC stack of its own: it stays inside this crate, and only byte strings
//! leave it). With the `fake` feature, [`fake::FakeTikv`] is an in-process fake of PD and TiKV
//! for tests and for trying replicas by hand.

mod client;
#[cfg(feature = "fake")]
pub mod fake;

pub use client::{DEFAULT_TIMEOUT, Locked, Mutation, Tikv, TikvError};
