//! PCP, PASA's control plane: the write path into the store and `pasactl`.
//!
//! Today PCP runs the store embedded and serves its API; Istio-parity validation, the admission
//! webhook and the Kubernetes syncer come next, each in its own module.

pub mod cli;
pub mod manifest;
pub mod validation;
