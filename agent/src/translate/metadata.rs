//! The `istio` filter metadata istiod puts on generated resources to name the config they came
//! from (see [`pasa_proto::config_path`]): a cluster carries its DestinationRule, a route its
//! VirtualService. `pasactl proxy-config` (like istioctl) shows them as `name.namespace`.
//!
//! Only the `config` field is written. istiod also marks subset clusters with `subset`, but a
//! Struct of two fields is a protobuf map, encoded in hash order here, and a resource's version
//! is a digest of its encoding: it would change without a change of content.

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind as ValueKind};
use pasa_proto::Kind;
use pasa_proto::config_path::{CONFIG_FIELD, FILTER_METADATA_KEY, config_path};

use crate::model::registry::Meta;

/// `filter_metadata["istio"]["config"]` = the config path of the resource of `kind` named by `meta`.
pub(super) fn config_metadata(kind: Kind, meta: &Meta) -> Metadata {
    let path = config_path(kind, &meta.namespace, &meta.name);
    let fields = [(
        CONFIG_FIELD.to_string(),
        Value {
            kind: Some(ValueKind::StringValue(path)),
        },
    )];
    Metadata {
        filter_metadata: [(
            FILTER_METADATA_KEY.to_string(),
            Struct {
                fields: fields.into_iter().collect(),
            },
        )]
        .into_iter()
        .collect(),
        ..Default::default()
    }
}

/// The pod label Istio's injector sets on workloads with a sidecar (`istio`), which auto mTLS
/// reads.
pub(super) const TLS_MODE_LABEL: &str = "security.istio.io/tlsMode";
/// Where an endpoint's transport socket match metadata goes.
pub(super) const TRANSPORT_SOCKET_MATCH: &str = "envoy.transport_socket_match";

/// A single-field Struct under `filter` (one field, so its encoding is stable).
pub(super) fn one_field(filter: &str, field: &str, value: &str) -> Metadata {
    Metadata {
        filter_metadata: [(filter.to_string(), single(field, value))]
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

/// `{field: value}` as a protobuf Struct.
pub(super) fn single(field: &str, value: &str) -> Struct {
    Struct {
        fields: [(
            field.to_string(),
            Value {
                kind: Some(ValueKind::StringValue(value.to_string())),
            },
        )]
        .into_iter()
        .collect(),
    }
}
