//! The PASA agent: runs next to each proxy, watches its slice of the store, translates Istio
//! configuration to xDS locally and serves it over a Unix socket.
//!
//! [`identity`]: the proxy's identity. [`follow`]: the store watch feeding [`cache`], the local
//! copy of its raw resources (with the last good snapshot on disk). [`model`]: what istiod works
//! out before building xDS (the proxy, the parsed registry, SidecarScope, gateway selection,
//! PeerAuthentication), which [`subscription`] (what the proxy fetches from the store) and
//! [`translate`] (raw config to the xDS resources istiod would send, as encoded, versioned
//! [`resource`]s) both stand on. [`simulate`]: walks a request through generated xDS. [`ads`]:
//! the ADS server (SotW and Delta). [`admin`] and [`metrics`]: status, readiness and Prometheus
//! metrics. [`report`]: the proxy's sync state, reported to the store for
//! `pasactl proxy-status`. [`credentials`]: TLS credentials from mounted Secrets, served over
//! SDS. [`bootstrap`]: Envoy's bootstrap for the pod's proxy; [`envoy`]: Envoy run as the
//! agent's child. [`run`]: the `pasa-agent` binary's wiring.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod admin;
pub mod ads;
pub mod bootstrap;
pub mod cache;
pub mod credentials;
pub mod envoy;
pub mod follow;
pub mod identity;
pub mod mesh;
pub mod metrics;
pub mod model;
pub mod on_demand;
pub mod probes;
pub mod report;
pub mod resource;
pub mod run;
pub mod simulate;
pub mod subscription;
pub mod supervisor;
pub mod translate;
pub mod wasm;
mod worker;

#[cfg(test)]
mod testing;
