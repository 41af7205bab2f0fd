//! PASA's link to Kubernetes: the syncer that keeps the store's copy of a cluster's services and
//! endpoints (and the namespaces the injecting webhook reads) equal to the cluster's, the remote
//! clusters whose service registries are synced beside PCP's own ([`remote`]), and the
//! conversions it runs, of Kubernetes Ingresses ([`ingress`]) and the Gateway API
//! ([`gateway_api`]) into the Istio config istiod generates from them.
pub mod connect;
pub mod convert;
#[cfg(feature = "fake-apiserver")]
pub mod fake_apiserver;
pub mod follow;
pub mod gateway_api;
pub mod gateway_names;
pub mod ingress;
pub mod lease;
pub mod metrics;
pub mod namespaces;
pub mod problem;
pub mod pull_secrets;
pub mod remote;
pub mod selectors;
pub mod syncer;

pub use kube::Client;
