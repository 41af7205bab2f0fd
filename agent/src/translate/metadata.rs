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

use super::registry::Meta;

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
