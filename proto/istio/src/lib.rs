//! Istio's model and semantics, as every PASA part reads them: the typed models of Istio's
//! resources (`networking.istio.io`, `security.istio.io`, `telemetry.istio.io` and
//! `extensions.istio.io` as far as the store keeps them, with the mesh config and proxy config),
//! the store's own mesh-model kind ([`service_endpoints`]), and the rules istiod applies to them:
//! hosts, gateway names, `exportTo`, label selectors, node IDs, SPIFFE identities, config paths,
//! and the marks of the config generated from Kubernetes Ingresses and the Gateway API. The wire
//! (the store's API, the object envelope, kinds) is `pasa_proto`'s.
//!
//! One model serves all three API versions: v1alpha3, v1beta1 and v1 share one schema. Parsing is
//! strict, as istiod's webhook is: an unknown field, a value of the wrong type or two members of one
//! `oneof` are errors that name the field path. Semantic rules (ranges, formats, combinations) are
//! PCP's validation; translation in the agent reads the same models.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod authorization_policy;
pub mod common;
pub mod config_path;
pub mod destination_rule;
pub mod digest;
pub mod envoy_filter;
pub mod extensions;
pub mod gateway;
pub mod generated;
pub mod host;
pub mod label_selector;
pub mod mesh_config;
pub mod mesh_networks;
pub mod node;
pub mod peer_authentication;
pub mod persistent_session;
pub mod proxy_config;
pub mod regex;
pub mod request_authentication;
pub mod service_endpoints;
pub mod service_entry;
pub mod sidecar;
pub mod spiffe;
pub mod telemetry;
pub mod virtual_service;
pub mod visibility;
pub mod workload_entry;
pub mod workload_group;

use serde::de::DeserializeOwned;
use serde_json::Value;

use pasa_proto::object::FieldError;

/// Reads a resource's `spec` into its model. The error names the field at fault, from `spec`.
pub fn parse_spec<T: DeserializeOwned>(spec: &Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(spec).map_err(spec_error)
}

/// A protobuf field name as protobuf JSON spells it: `proxy_metadata` → `proxyMetadata` (Istio's
/// decoders accept either).
pub fn json_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Reads a resource's `spec`, as JSON text, into its model without building a JSON tree first
/// (what a reader of stored resources does for every object). The error names the field at
/// fault, as [`parse_spec`]'s does: a spec that does not parse is read again, tracking the path.
pub fn parse_spec_json<T: DeserializeOwned>(json: &str) -> Result<T, FieldError> {
    if let Ok(spec) = serde_json::from_str(json) {
        return Ok(spec);
    }
    let mut de = serde_json::Deserializer::from_str(json);
    let spec = serde_path_to_error::deserialize(&mut de).map_err(spec_error)?;
    de.end().map_err(|e| FieldError {
        field: "spec".into(),
        message: e.to_string(),
    })?;
    Ok(spec)
}

fn spec_error<E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> FieldError {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sidecar::Sidecar;

    #[test]
    fn a_spec_read_from_text_is_the_spec_read_from_its_tree() {
        let text = r#"{"egress": [{"hosts": ["./*"]}], "outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}}"#;
        let tree: Value = serde_json::from_str(text).unwrap();
        assert_eq!(
            parse_spec_json::<Sidecar>(text).unwrap(),
            parse_spec::<Sidecar>(&tree).unwrap()
        );
    }

    #[test]
    fn a_spec_that_does_not_parse_names_the_field_as_from_its_tree() {
        let text = r#"{"egress": [{"hosts": ["./*"]}], "outboundTrafficPolicy": {"mode": "NOPE"}}"#;
        let tree: Value = serde_json::from_str(text).unwrap();
        let from_text = parse_spec_json::<Sidecar>(text).unwrap_err();
        let from_tree = parse_spec::<Sidecar>(&tree).unwrap_err();
        assert_eq!(from_text.field, "spec.outboundTrafficPolicy.mode");
        assert_eq!(from_text.field, from_tree.field);
        let trailing = parse_spec_json::<Sidecar>(r#"{} {"#).unwrap_err();
        assert_eq!(trailing.field, "spec");
    }
}
