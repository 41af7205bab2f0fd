//! The PASA agent: runs next to each proxy, watches its slice of the store, translates Istio
//! configuration to xDS locally and serves it over a Unix socket.
//!
//! Not built yet: the store it watches comes first. Its scope, cache, translation and ADS server
//! will each get a module here.
