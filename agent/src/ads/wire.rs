//! The two responses the agent sends, written by hand instead of taken from envoy-types: their
//! resources are the snapshot's own `Arc<Resource>`s, encoded straight from it. With envoy-types'
//! `DiscoveryResponse` (which owns its `Any`s) every push copied each resource it carried, the
//! whole CDS of a scope on every DestinationRule change, before the connection encoded it again.
//! The wire format is Envoy's, field for field (tests hold it against envoy-types' messages);
//! the fields the agent never sets (`canary`, `control_plane`, `ttl`, `cache_control`,
//! `metadata`) are read and skipped. A Delta resource's `aliases` are set for VHDS (the names
//! Envoy asked a virtual host by), and a resource without a body (an empty `Any`) is sent
//! without one: VHDS's "no such host".
//!
//! The gRPC services are generated (`build.rs`) with these as their responses and envoy-types'
//! requests; see [`service`](super::service).

use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::Resource as EnvoyResource;
use envoy_types::pb::google::protobuf::Any;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{
    DecodeContext, WireType, encode_key, encode_varint, encoded_len_varint, key_len, message,
    skip_field, string,
};
use prost::{DecodeError, Message};

use crate::resource::Resource;

/// `envoy.service.discovery.v3.DiscoveryResponse` (state of the world).
#[derive(Clone, PartialEq, Default, Debug)]
pub struct DiscoveryResponse {
    pub version_info: String,
    /// Each encoded as its `Any` body.
    pub resources: Vec<Arc<Resource>>,
    pub type_url: String,
    pub nonce: String,
}

/// `envoy.service.discovery.v3.DeltaDiscoveryResponse`.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct DeltaDiscoveryResponse {
    pub system_version_info: String,
    /// Name and resource: each encoded as an `envoy.service.discovery.v3.Resource` with its
    /// name, version and body.
    pub resources: Vec<(String, Arc<Resource>)>,
    pub type_url: String,
    pub removed_resources: Vec<String>,
    pub nonce: String,
    /// Aliases of resources, by resource name (VHDS only).
    pub aliases: std::collections::BTreeMap<String, Vec<String>>,
}

fn encode_string(tag: u32, value: &String, buf: &mut impl BufMut) {
    if !value.is_empty() {
        string::encode(tag, value, buf);
    }
}

fn string_len(tag: u32, value: &String) -> usize {
    if value.is_empty() {
        0
    } else {
        string::encoded_len(tag, value)
    }
}

/// Names the field a decode error came from, as prost's generated code does.
fn named<T>(
    message: &'static str,
    (field, merged): (&'static str, Result<T, DecodeError>),
) -> Result<T, DecodeError> {
    merged.map_err(|mut e| {
        e.push(message, field);
        e
    })
}

/// A decoded body: the agent's resources carry a version, which the SotW wire does not.
fn unversioned(body: Any) -> Arc<Resource> {
    Arc::new(Resource {
        version: String::new(),
        body,
    })
}

impl Message for DiscoveryResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encode_string(1, &self.version_info, buf);
        for resource in &self.resources {
            message::encode(2, &resource.body, buf);
        }
        encode_string(4, &self.type_url, buf);
        encode_string(5, &self.nonce, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let field = match tag {
            1 => (
                "version_info",
                string::merge(wire_type, &mut self.version_info, buf, ctx),
            ),
            2 => {
                let mut body = Any::default();
                let merged = message::merge(wire_type, &mut body, buf, ctx);
                self.resources.push(unversioned(body));
                ("resources", merged)
            }
            4 => (
                "type_url",
                string::merge(wire_type, &mut self.type_url, buf, ctx),
            ),
            5 => ("nonce", string::merge(wire_type, &mut self.nonce, buf, ctx)),
            _ => return skip_field(wire_type, tag, buf, ctx),
        };
        named("DiscoveryResponse", field)
    }

    fn encoded_len(&self) -> usize {
        string_len(1, &self.version_info)
            + self
                .resources
                .iter()
                .map(|r| message::encoded_len(2, &r.body))
                .sum::<usize>()
            + string_len(4, &self.type_url)
            + string_len(5, &self.nonce)
    }

    fn clear(&mut self) {
        *self = DiscoveryResponse::default();
    }
}

/// The length of one Delta resource's message body: version (1), body (2, none when empty),
/// name (3), aliases (4).
fn delta_resource_len(name: &String, resource: &Resource, aliases: &[String]) -> usize {
    string_len(1, &resource.version)
        + body_len(resource)
        + string_len(3, name)
        + string::encoded_len_repeated(4, aliases)
}

fn body_len(resource: &Resource) -> usize {
    if resource.body.type_url.is_empty() {
        0
    } else {
        message::encoded_len(2, &resource.body)
    }
}

impl Message for DeltaDiscoveryResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encode_string(1, &self.system_version_info, buf);
        for (name, resource) in &self.resources {
            let aliases = self.aliases.get(name).map_or(&[][..], Vec::as_slice);
            encode_key(2, WireType::LengthDelimited, buf);
            encode_varint(delta_resource_len(name, resource, aliases) as u64, buf);
            encode_string(1, &resource.version, buf);
            if !resource.body.type_url.is_empty() {
                message::encode(2, &resource.body, buf);
            }
            encode_string(3, name, buf);
            string::encode_repeated(4, aliases, buf);
        }
        encode_string(4, &self.type_url, buf);
        encode_string(5, &self.nonce, buf);
        string::encode_repeated(6, &self.removed_resources, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let field = match tag {
            1 => (
                "system_version_info",
                string::merge(wire_type, &mut self.system_version_info, buf, ctx),
            ),
            2 => {
                let mut resource = EnvoyResource::default();
                let merged = message::merge(wire_type, &mut resource, buf, ctx);
                if !resource.aliases.is_empty() {
                    self.aliases
                        .insert(resource.name.clone(), resource.aliases.clone());
                }
                self.resources.push((
                    resource.name,
                    Arc::new(Resource {
                        version: resource.version,
                        body: resource.resource.unwrap_or_default(),
                    }),
                ));
                ("resources", merged)
            }
            4 => (
                "type_url",
                string::merge(wire_type, &mut self.type_url, buf, ctx),
            ),
            5 => ("nonce", string::merge(wire_type, &mut self.nonce, buf, ctx)),
            6 => (
                "removed_resources",
                string::merge_repeated(wire_type, &mut self.removed_resources, buf, ctx),
            ),
            _ => return skip_field(wire_type, tag, buf, ctx),
        };
        named("DeltaDiscoveryResponse", field)
    }

    fn encoded_len(&self) -> usize {
        string_len(1, &self.system_version_info)
            + self
                .resources
                .iter()
                .map(|(name, resource)| {
                    let aliases = self.aliases.get(name).map_or(&[][..], Vec::as_slice);
                    let len = delta_resource_len(name, resource, aliases);
                    key_len(2) + encoded_len_varint(len as u64) + len
                })
                .sum::<usize>()
            + string_len(4, &self.type_url)
            + string_len(5, &self.nonce)
            + string::encoded_len_repeated(6, &self.removed_resources)
    }

    fn clear(&mut self) {
        *self = DeltaDiscoveryResponse::default();
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::ControlPlane;
    use envoy_types::pb::envoy::service::discovery::v3 as envoy;

    use super::*;

    fn resource(version: &str, type_url: &str, value: &[u8]) -> Arc<Resource> {
        Arc::new(Resource {
            version: version.into(),
            body: Any {
                type_url: type_url.into(),
                value: value.to_vec(),
            },
        })
    }

    const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

    /// Writes exactly what envoy-types writes for the same response, reads back what it wrote,
    /// and reads envoy-types' encoding of the fields it never sets without losing the rest.
    #[test]
    fn sotw_is_envoys_wire_format() {
        let a = resource("v1", CLUSTER, b"\x0a\x01a");
        let b = resource("v2", CLUSTER, &[0xab; 300]);
        let empty = resource("v3", CLUSTER, b"");
        let cases = [
            DiscoveryResponse::default(),
            DiscoveryResponse {
                version_info: "abc".into(),
                resources: vec![Arc::clone(&a), b, empty],
                type_url: CLUSTER.into(),
                nonce: "0000000000000001".into(),
            },
        ];
        for ours in cases {
            let theirs = envoy::DiscoveryResponse {
                version_info: ours.version_info.clone(),
                resources: ours.resources.iter().map(|r| r.body.clone()).collect(),
                type_url: ours.type_url.clone(),
                nonce: ours.nonce.clone(),
                ..Default::default()
            };
            let bytes = ours.encode_to_vec();
            assert_eq!(bytes, theirs.encode_to_vec());
            assert_eq!(bytes.len(), ours.encoded_len());
            let read = DiscoveryResponse::decode(bytes.as_slice()).unwrap();
            assert_eq!(read.encode_to_vec(), bytes);
        }
        let with_more = envoy::DiscoveryResponse {
            version_info: "v".into(),
            resources: vec![a.body.clone()],
            canary: true,
            control_plane: Some(ControlPlane {
                identifier: "istiod".into(),
            }),
            nonce: "n".into(),
            ..Default::default()
        };
        let read = DiscoveryResponse::decode(with_more.encode_to_vec().as_slice()).unwrap();
        assert_eq!(read.resources[0].body, a.body);
        assert_eq!(
            (read.version_info.as_str(), read.nonce.as_str()),
            ("v", "n")
        );
    }

    #[test]
    fn delta_is_envoys_wire_format() {
        let cases = [
            DeltaDiscoveryResponse::default(),
            DeltaDiscoveryResponse {
                system_version_info: "sys".into(),
                resources: vec![
                    (
                        "outbound|80||a".into(),
                        resource("v1", CLUSTER, b"\x0a\x01a"),
                    ),
                    (String::new(), resource("", CLUSTER, &[7; 200])),
                    ("b".into(), resource("v2", CLUSTER, b"")),
                ],
                type_url: CLUSTER.into(),
                removed_resources: vec!["gone".into(), String::new(), "also".into()],
                nonce: "0000000000000002".into(),
                aliases: Default::default(),
            },
        ];
        for ours in cases {
            let theirs = envoy::DeltaDiscoveryResponse {
                system_version_info: ours.system_version_info.clone(),
                resources: ours
                    .resources
                    .iter()
                    .map(|(name, r)| envoy::Resource {
                        name: name.clone(),
                        version: r.version.clone(),
                        resource: Some(r.body.clone()),
                        ..Default::default()
                    })
                    .collect(),
                type_url: ours.type_url.clone(),
                removed_resources: ours.removed_resources.clone(),
                nonce: ours.nonce.clone(),
                ..Default::default()
            };
            let bytes = ours.encode_to_vec();
            assert_eq!(bytes, theirs.encode_to_vec());
            assert_eq!(bytes.len(), ours.encoded_len());
            assert_eq!(
                DeltaDiscoveryResponse::decode(bytes.as_slice()).unwrap(),
                ours
            );
        }
    }

    /// A field of the wrong type is named in the error.
    #[test]
    fn a_bad_field_is_named() {
        // Field 2 (resources) as a varint.
        let err = DiscoveryResponse::decode(&[0x10, 0x01][..]).unwrap_err();
        assert!(
            err.to_string().contains("DiscoveryResponse.resources"),
            "{err}"
        );
        let err = DeltaDiscoveryResponse::decode(&[0x30, 0x01][..]).unwrap_err();
        assert!(
            err.to_string()
                .contains("DeltaDiscoveryResponse.removed_resources"),
            "{err}"
        );
    }
}
