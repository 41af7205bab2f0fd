//! Admission of Istio config, the same for every way it comes in (the control plane's gRPC
//! write path, its admission webhook, `pasactl validate` and `apply`): reading manifests as
//! kubectl does ([`manifest`]), the object's structure and Istio-parity validation with field
//! paths ([`validation`]), cross-resource warnings ([`analysis`]), and one verdict per batch with
//! its problems formatted for the API ([`admission`]). It links no store and no server.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod admission;
pub mod analysis;
pub mod manifest;
pub mod validation;
