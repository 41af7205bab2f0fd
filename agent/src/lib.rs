//! The PASA agent: runs next to each proxy, watches its slice of the store, translates Istio
//! configuration to xDS locally and serves it over a Unix socket.
//!
//! Built so far: the proxy's identity. Scope, cache, translation and the ADS server each get a
//! module here.

pub mod identity;
