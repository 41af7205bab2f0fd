//! Typed models of Istio's networking resources (`networking.istio.io`), read from the protobuf JSON
//! form the CRDs use.
//!
//! One model serves all three API versions: v1alpha3, v1beta1 and v1 share one schema. Parsing is
//! strict, as istiod's webhook is: an unknown field, a value of the wrong type or two members of one
//! `oneof` are errors that name the field path. Semantic rules (ranges, formats, combinations) are
//! PCP's validation; translation in the agent reads the same models.

pub mod common;
pub mod destination_rule;
pub mod gateway;
pub mod service_entry;
pub mod sidecar;
pub mod virtual_service;
pub mod workload_entry;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::object::FieldError;

/// Reads a resource's `spec` into its model. The error names the field at fault, from `spec`.
pub fn parse_spec<T: DeserializeOwned>(spec: &Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(spec).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." || path.is_empty() {
            "spec".to_string()
        } else {
            format!("spec.{path}")
        };
        FieldError {
            field,
            message: e.into_inner().to_string(),
        }
    })
}
