//! What every PASA process (store, control plane, agent) does alike at run time, in one place:
//! hearing that it must stop ([`signal`]), telling its parts to stop and giving them a deadline
//! ([`drain`]), logging ([`logs`]), the admin endpoint's `/metrics`, `/healthz` and `/readyz`
//! ([`admin`]), waiting before trying again ([`backoff`]), sharing one copy of equal values
//! ([`interned`]), giving the system back the memory the allocator holds free
//! ([`memory`]), fetching over HTTP(S) ([`fetch`]), and telling errors with their causes
//! ([`error`]). It links no storage engine: the agent, in every pod, stands on it too.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod admin;
pub mod backoff;
pub mod blocking;
pub mod drain;
pub mod error;
pub mod fetch;
pub mod interned;
pub mod logs;
pub mod memory;
pub mod signal;
