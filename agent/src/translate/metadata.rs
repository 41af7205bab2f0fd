//! The `istio` filter metadata istiod puts on generated resources to name the config they came
//! from (see [`pasa_istio::config_path`]): a cluster carries its DestinationRule, a route its
//! VirtualService. `pasactl proxy-config` (like istioctl) shows them as `name.namespace`.
//!
//! For Istio's proxy, clusters also carry the `services` they are for (host, name, namespace),
//! which Istio's stats label requests with ([`cluster_field`]). A Struct of several fields is a
//! protobuf map, which Envoy's generated types keep in hash order, and a resource's version is
//! a digest of its encoding: such metadata is encoded here in key order. (istiod also marks
//! subset clusters with `subset`; PASA does not.)

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind as ValueKind};
use pasa_istio::config_path::{CONFIG_FIELD, FILTER_METADATA_KEY, config_path};
use pasa_proto::Kind;

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
pub(super) use crate::model::registry::TLS_MODE_LABEL;
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

/// A service as Istio's stats name it in a cluster's metadata: its host, name and namespace (a
/// ServiceEntry's host is its name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ServiceLabel {
    pub host: String,
    pub name: String,
    pub namespace: String,
}

impl ServiceLabel {
    pub(super) fn of(service: &crate::model::registry::Service) -> ServiceLabel {
        ServiceLabel {
            host: service.hostname.clone(),
            name: if service.kubernetes {
                service.source.name.clone()
            } else {
                service.hostname.clone()
            },
            namespace: service.namespace.clone(),
        }
    }
}

/// `envoy.config.core.v3.Metadata` with its maps in key order.
#[derive(Clone, PartialEq, prost::Message)]
struct SortedMetadata {
    #[prost(btree_map = "string, message", tag = "1")]
    filter_metadata: std::collections::BTreeMap<String, prost_types::Struct>,
}

/// A cluster's `metadata` field, encoded (to append to a cluster's encoding; empty for none):
/// `filter_metadata["istio"]` with `config`, the config path of the DestinationRule that shaped
/// it (`config`), `services`, the services it is for (Istio's proxy's stats read them), and
/// `external` for a service outside the mesh (its metadata exchange skips it), and the
/// DestinationRule `subset` of a subset's cluster.
pub(super) fn cluster_field(
    config: Option<&Meta>,
    services: &[ServiceLabel],
    external: bool,
    subset: Option<&str>,
    alpn_override: bool,
) -> Vec<u8> {
    use prost::Message;
    use prost_types::value::Kind as K;
    let string = |s: &str| prost_types::Value {
        kind: Some(K::StringValue(s.to_string())),
    };
    let mut istio = prost_types::Struct::default();
    if let Some(meta) = config {
        istio.fields.insert(
            CONFIG_FIELD.to_string(),
            string(&config_path(
                Kind::DestinationRule,
                &meta.namespace,
                &meta.name,
            )),
        );
    }
    if !services.is_empty() {
        let values = services
            .iter()
            .map(|s| prost_types::Value {
                kind: Some(K::StructValue(prost_types::Struct {
                    fields: [
                        ("host".to_string(), string(&s.host)),
                        ("name".to_string(), string(&s.name)),
                        ("namespace".to_string(), string(&s.namespace)),
                    ]
                    .into_iter()
                    .collect(),
                })),
            })
            .collect();
        istio.fields.insert(
            "services".to_string(),
            prost_types::Value {
                kind: Some(K::ListValue(prost_types::ListValue { values })),
            },
        );
    }
    if let Some(subset) = subset {
        istio.fields.insert("subset".to_string(), string(subset));
    }
    if alpn_override {
        // The cluster originates TLS of its own: Istio's proxy keeps the ALPN it sets.
        istio
            .fields
            .insert("alpn_override".to_string(), string("false"));
    }
    if external {
        // The metadata exchange skips services outside the mesh.
        istio.fields.insert(
            "external".to_string(),
            prost_types::Value {
                kind: Some(K::BoolValue(true)),
            },
        );
    }
    if istio.fields.is_empty() {
        return Vec::new();
    }
    let metadata = SortedMetadata {
        filter_metadata: [(FILTER_METADATA_KEY.to_string(), istio)]
            .into_iter()
            .collect(),
    }
    .encode_to_vec();
    // `Cluster.metadata` is field 25.
    let mut out = Vec::with_capacity(metadata.len() + 3);
    prost::encoding::encode_key(25, prost::encoding::WireType::LengthDelimited, &mut out);
    prost::encoding::encode_varint(metadata.len() as u64, &mut out);
    out.extend_from_slice(&metadata);
    out
}
