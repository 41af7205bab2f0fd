//! PASA's link to Kubernetes.
pub mod namespaces;
