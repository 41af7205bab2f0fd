//! Envoy builders every output shares (clusters, routes, listeners, hash policies): a leaf the
//! other translation modules stand on, so that none borrows helpers from a sibling.

use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use envoy_types::pb::envoy::config::core::v3::{AggregatedConfigSource, ApiVersion, ConfigSource};
use envoy_types::pb::google::protobuf::Duration;

/// HTTP/1 options: header names in the case they came in (`proxyHeaders.preserveHttp1HeaderCase`
/// of the proxy's settings), else Envoy's (lower case).
pub(super) fn http1_options(
    preserve_case: bool,
) -> envoy_types::pb::envoy::config::core::v3::Http1ProtocolOptions {
    use envoy_types::pb::envoy::config::core::v3::http1_protocol_options::{
        HeaderKeyFormat, header_key_format::HeaderFormat,
    };
    use envoy_types::pb::envoy::config::core::v3::{Http1ProtocolOptions, TypedExtensionConfig};
    use envoy_types::pb::google::protobuf::Any;
    Http1ProtocolOptions {
        header_key_format: preserve_case.then(|| HeaderKeyFormat {
            header_format: Some(HeaderFormat::StatefulFormatter(TypedExtensionConfig {
                name: "preserve_case".into(),
                typed_config: Some(Any {
                    type_url: "type.googleapis.com/envoy.extensions.http.header_formatters.preserve_case.v3.PreserveCaseFormatterConfig".into(),
                    value: Vec::new(),
                }),
            })),
        }),
        ..Default::default()
    }
}

/// ADS as the config source of EDS clusters and RDS route configurations.
pub(super) fn ads() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        initial_fetch_timeout: Some(Duration {
            seconds: 0,
            nanos: 0,
        }),
        ..grpc_ads()
    }
}

/// ADS as istiod names it to proxyless gRPC clients: nothing else set.
pub(super) fn grpc_ads() -> ConfigSource {
    ConfigSource {
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    }
}

/// The port of a listener's socket address (none for another address).
pub(super) fn listener_port(
    l: &envoy_types::pb::envoy::config::listener::v3::Listener,
) -> Option<u32> {
    use envoy_types::pb::envoy::config::core::v3::{address, socket_address::PortSpecifier};
    match l.address.as_ref()?.address.as_ref()? {
        address::Address::SocketAddress(s) => match s.port_specifier {
            Some(PortSpecifier::PortValue(p)) => Some(p),
            _ => None,
        },
        _ => None,
    }
}

/// An Istio duration as a protobuf one.
/// `nanos` nanoseconds as a protobuf Duration.
pub(super) fn nanos(nanos: i64) -> Duration {
    Duration {
        seconds: nanos / 1_000_000_000,
        nanos: (nanos % 1_000_000_000) as i32,
    }
}

pub(super) fn duration(d: &pasa_istio::common::Duration) -> Duration {
    Duration {
        seconds: d.seconds,
        nanos: d.nanos,
    }
}

/// Appends a string field as a message encoding writes it (an empty string is not written), for
/// encodings assembled from pieces.
pub(super) fn string_field(tag: u32, value: &str, out: &mut Vec<u8>) {
    if !value.is_empty() {
        length_delimited(tag, value.len(), out);
        out.extend_from_slice(value.as_bytes());
    }
}

/// Appends the key and length of a length-delimited field whose `len` bytes follow.
pub(super) fn length_delimited(tag: u32, len: usize, out: &mut Vec<u8>) {
    use prost::encoding::{WireType, encode_key, encode_varint};
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(len as u64, out);
}

/// The encoded length of a length-delimited field of `len` bytes: key, length and the bytes.
pub(super) fn field_len(tag: u32, len: usize) -> usize {
    prost::encoding::key_len(tag) + prost::encoding::encoded_len_varint(len as u64) + len
}

/// A JSON object as a protobuf `Struct`, its fields (at every depth) in name order, so that it
/// is encoded alike each time: a resource's version is a digest of its encoding. (Envoy's
/// generated `Struct` keeps its fields in a hash map; its encoding is the same message.)
pub(super) fn json_struct(
    fields: &serde_json::Map<String, serde_json::Value>,
) -> prost_types::Struct {
    use prost_types::value::Kind;
    use serde_json::Value;
    fn value(v: &Value) -> prost_types::Value {
        let kind = match v {
            Value::Null => Kind::NullValue(0),
            Value::Bool(b) => Kind::BoolValue(*b),
            Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
            Value::String(s) => Kind::StringValue(s.clone()),
            Value::Array(a) => Kind::ListValue(prost_types::ListValue {
                values: a.iter().map(value).collect(),
            }),
            Value::Object(m) => Kind::StructValue(json_struct(m)),
        };
        prost_types::Value { kind: Some(kind) }
    }
    prost_types::Struct {
        fields: fields.iter().map(|(k, v)| (k.clone(), value(v))).collect(),
    }
}

/// `fields` (a JSON object) as the configuration of type `type_url` (`type.googleapis.com/...`),
/// in xDS's `TypedStruct`: how istiod configures the filters of Istio's proxy it has no types
/// for.
pub(super) fn typed_struct(
    type_url: &str,
    fields: &serde_json::Value,
) -> envoy_types::pb::google::protobuf::Any {
    use prost::Message;
    let value = fields.as_object().map(json_struct).unwrap_or_default();
    envoy_types::pb::google::protobuf::Any {
        type_url: "type.googleapis.com/udpa.type.v1.TypedStruct".into(),
        value: pasa_proto::istio_proxy::typed_struct::TypedStruct {
            type_url: type_url.into(),
            value: Some(value),
        }
        .encode_to_vec(),
    }
}
