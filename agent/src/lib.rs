//! The PASA agent: runs next to each proxy, watches its slice of the store, translates Istio
//! configuration to xDS locally and serves it over a Unix socket.
//!
//! Built so far: [`ads`], the ADS server. Scope, cache and translation come next.

pub mod ads;
