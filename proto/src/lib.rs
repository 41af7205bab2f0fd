//! The vocabulary every PASA part shares: the store API (`pasa.store.v1`), resource kinds,
//! the Kubernetes-style object envelope, the typed Istio networking models, and Istio's host and
//! gateway-name semantics.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod client;
pub mod config_path;
pub mod digest;
pub mod duration;
pub mod event;
pub mod gateway;
pub mod gateway_api;
pub mod host;
pub mod ingress;
pub mod istio;
pub mod kind;
pub mod label_selector;
pub mod node;
pub mod object;
pub mod regex;
pub mod service_endpoints;
pub mod spiffe;
pub mod sync_state;
pub mod visibility;
pub mod watch;

/// The store API, generated from `proto/pasa/store/v1/store.proto`.
pub mod store {
    pub mod v1 {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("pasa.store.v1");
        pub use crate::event::Event;
    }
}

/// Istio's CA API (`istio.v1.auth.IstioCertificateService`), generated from
/// `proto/istio/v1/auth/ca.proto`: the agent requests workload certificates with it.
pub mod istio_ca {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("istio.v1.auth");
}

pub use kind::Kind;
pub use object::Object;
