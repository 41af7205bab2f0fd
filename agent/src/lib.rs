//! The PASA agent: runs next to each proxy, watches its slice of the store, translates Istio
//! configuration to xDS locally and serves it over a Unix socket.
//!
//! [`identity`]: the proxy's identity. [`follow`]: the store watch feeding [`cache`], the local
//! copy of its raw resources (with the last good snapshot on disk). [`translate`]: raw config to
//! xDS. [`simulate`]: walks a request through generated xDS. [`ads`]: the ADS server (SotW and
//! Delta).

pub mod ads;
pub mod cache;
pub mod follow;
pub mod identity;
pub mod mesh;
pub mod simulate;
pub mod translate;
