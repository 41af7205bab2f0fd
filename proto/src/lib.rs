//! PASA's wire, which every part shares: the store API (`pasa.store.v1`) with its client, watch
//! and events, resource kinds, the Kubernetes-style object envelope, sync states, durations as
//! flags and protobuf JSON write them, and the protos of Istio's CA and proxy filters. Istio's
//! model and semantics (typed resources, hosts, gateway names, `exportTo`) are `pasa_istio`'s,
//! which stands on this crate.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod client;
pub mod duration;
pub mod event;
pub mod kind;
pub mod object;
pub mod sync_state;
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

/// The configurations of Istio's proxy's own filters, generated from `proto/istio/proxy/`:
/// `istio.stats` ([`istio_proxy::stats`]), `istio.alpn` ([`istio_proxy::alpn`]) and the TCP
/// metadata exchange ([`istio_proxy::metadata_exchange`]), which upstream Envoy does not have;
/// and xDS's `TypedStruct` ([`istio_proxy::typed_struct`], `udpa.type.v1` and `xds.type.v3`),
/// a JSON configuration with its type, which Envoy reads and Envoy's generated API lacks.
pub mod istio_proxy {
    pub mod stats {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("stats");
    }
    pub mod alpn {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("istio.envoy.config.filter.http.alpn.v2alpha1");
    }
    pub mod metadata_exchange {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("envoy.tcp.metadataexchange.config");
    }

    pub mod typed_struct {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("udpa.r#type.v1");
        pub mod xds {
            tonic::include_proto!("xds.r#type.v3");
        }
    }

    /// Their encoded `FileDescriptorSet` (with the well-known types they import).
    pub const DESCRIPTORS: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/istio_proxy_descriptors.bin"));

    /// The packages of Istio's proxy's own types: those above, and the others of its filters
    /// (`io.istio.http.peer_metadata.Config`, which istiod sends in a TypedStruct, say).
    const PACKAGES: [&str; 4] = [
        "stats.",
        "istio.envoy.config.filter.",
        "envoy.tcp.metadataexchange.config.",
        "io.istio.",
    ];

    /// Whether the message or enum `full_name` (`stats.PluginConfig`) is one of Istio's proxy's
    /// own, which upstream Envoy does not have.
    pub fn defines(full_name: &str) -> bool {
        PACKAGES.iter().any(|p| full_name.starts_with(p))
    }
}

pub use kind::Kind;
pub use object::Object;
