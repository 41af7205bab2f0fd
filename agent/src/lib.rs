//! The PASA agent: runs next to each proxy, watches its slice of the store, translates Istio
//! configuration to xDS locally and serves it over a Unix socket.
//!
//! Built so far: [`identity`], the proxy's identity, and [`ads`], the ADS server (SotW and Delta).
//! Scope, cache and translation come next.

pub mod ads;
pub mod identity;
