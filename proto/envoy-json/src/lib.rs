//! Envoy resources as protobuf JSON, as istioctl prints them (camelCase fields, defaults left
//! out, nested `Any` with their `@type`), and back: `pasactl proxy-config -o json` and the
//! agent's snapshot tests print with it; the agent reads EnvoyFilter patch values with it
//! ([`encode`]) and merges them as istiod does ([`merge`]). The descriptors are envoy-types' own
//! (see `build.rs`), decoded once, on first use: a process that never prints or patches never
//! holds them.

pub mod merge;

use std::sync::OnceLock;

use envoy_types::pb::google::protobuf::Any;
use prost_reflect::{DescriptorPool, DynamicMessage};
use serde_json::Value;

/// The encoded `FileDescriptorSet` written by `build.rs`.
const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy_descriptors.bin"));

#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    #[error("the Envoy API's descriptors do not load: {0}")]
    Descriptors(String),
    #[error("a {patch} cannot be merged into a {target}: the types differ")]
    TypesDiffer { target: String, patch: String },
    #[error("{name}: no Envoy descriptor for {type_url}")]
    UnknownType { name: String, type_url: String },
    #[error("{name}: cannot decode it as {type_url}: {source}")]
    Decode {
        name: String,
        type_url: String,
        #[source]
        source: prost::DecodeError,
    },
    #[error(
        "{name}: cannot read it as {type_url} ({source}); it may hold a type Envoy's API does not define"
    )]
    Read {
        name: String,
        type_url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{name}: cannot print it as JSON ({source}); it may hold a type Envoy's API does not define"
    )]
    Print {
        name: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The Envoy API's descriptors.
pub fn pool() -> Result<&'static DescriptorPool, JsonError> {
    static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(DESCRIPTORS).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| JsonError::Descriptors(e.clone()))
}

/// The resource `name`, sent as `any`, as protobuf JSON.
pub fn to_json(name: &str, any: &Any) -> Result<Value, JsonError> {
    let type_name = any.type_url.rsplit('/').next().unwrap_or_default();
    let descriptor =
        pool()?
            .get_message_by_name(type_name)
            .ok_or_else(|| JsonError::UnknownType {
                name: name.to_string(),
                type_url: any.type_url.clone(),
            })?;
    let message = DynamicMessage::decode(descriptor, any.value.as_slice()).map_err(|source| {
        JsonError::Decode {
            name: name.to_string(),
            type_url: any.type_url.clone(),
            source,
        }
    })?;
    serde_json::to_value(&message).map_err(|source| JsonError::Print {
        name: name.to_string(),
        source,
    })
}

/// `value`, protobuf JSON of the message `type_name` (such as `envoy.config.cluster.v3.Cluster`),
/// encoded; fields the message does not have are ignored, as istiod ignores them in an
/// EnvoyFilter's patch values. `name` says what is read, for errors.
pub fn encode(name: &str, type_name: &str, value: &Value) -> Result<Vec<u8>, JsonError> {
    let descriptor =
        pool()?
            .get_message_by_name(type_name)
            .ok_or_else(|| JsonError::UnknownType {
                name: name.to_string(),
                type_url: type_name.to_string(),
            })?;
    let options = prost_reflect::DeserializeOptions::new().deny_unknown_fields(false);
    let message = DynamicMessage::deserialize_with_options(descriptor, value.clone(), &options)
        .map_err(|source| JsonError::Read {
            name: name.to_string(),
            type_url: type_name.to_string(),
            source,
        })?;
    Ok(prost::Message::encode_to_vec(&message))
}

/// A resource in protobuf JSON naming its type (`@type`, as Envoy's `/config_dump` writes each
/// resource), encoded back as the `Any` it was sent as.
pub fn from_json(name: &str, value: &Value) -> Result<Any, JsonError> {
    let type_url = value
        .get("@type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let type_name = type_url.rsplit('/').next().unwrap_or_default();
    let descriptor =
        pool()?
            .get_message_by_name(type_name)
            .ok_or_else(|| JsonError::UnknownType {
                name: name.to_string(),
                type_url: type_url.clone(),
            })?;
    let mut fields = value.clone();
    if let Some(object) = fields.as_object_mut() {
        object.remove("@type");
    }
    let options = prost_reflect::DeserializeOptions::new().deny_unknown_fields(false);
    let message = DynamicMessage::deserialize_with_options(descriptor, fields, &options).map_err(
        |source| JsonError::Read {
            name: name.to_string(),
            type_url: type_url.clone(),
            source,
        },
    )?;
    Ok(Any {
        type_url,
        value: prost::Message::encode_to_vec(&message),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::core::v3::TransportSocket;
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    use envoy_types::util::pack_any;

    #[test]
    fn resources_print_with_nested_types() {
        let cluster = Cluster {
            name: "outbound|9080||reviews.default.svc.cluster.local".into(),
            transport_socket: Some(TransportSocket {
                name: "envoy.transport_sockets.tls".into(),
                config_type: Some(ConfigType::TypedConfig(pack_any(UpstreamTlsContext {
                    sni: "reviews".into(),
                    ..Default::default()
                }))),
            }),
            ..Default::default()
        };
        let any = pack_any(cluster);
        let json = to_json("c", &any).unwrap();
        // And back, as read from Envoy's own /config_dump (which names each resource's type).
        let mut named = json.clone();
        named["@type"] = Value::String(any.type_url.clone());
        assert_eq!(from_json("c", &named).unwrap(), any);
        assert_eq!(
            json["name"],
            "outbound|9080||reviews.default.svc.cluster.local"
        );
        assert_eq!(
            json["transportSocket"]["typedConfig"]["@type"],
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
        );
        assert_eq!(json["transportSocket"]["typedConfig"]["sni"], "reviews");
    }

    #[test]
    fn an_unknown_type_is_named() {
        let any = Any {
            type_url: "type.googleapis.com/example.Unknown".into(),
            value: vec![],
        };
        let e = to_json("x", &any).unwrap_err();
        assert!(
            e.to_string()
                .contains("no Envoy descriptor for type.googleapis.com/example.Unknown"),
            "{e}"
        );
    }
}
