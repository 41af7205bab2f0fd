//! EDS: the endpoints of a cluster (`ClusterLoadAssignment`), filtered by the subset's labels,
//! grouped by locality, with each locality weighted by the sum of its endpoints' weights (gRPC
//! clients drop a locality without a weight).

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{
    Address, Locality, SocketAddress, address, socket_address::PortSpecifier,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint::HostIdentifier,
};
use envoy_types::pb::google::protobuf::UInt32Value;

use prost::Message;

use super::builders::{field_len, length_delimited, string_field};
use super::metadata;
use crate::model::registry::{Instance, Service, ServicePort, selects};

/// The endpoints of one service port, each built and encoded once as an `LbEndpoint` and grouped
/// by locality: the load assignments of the port's clusters (the default one and one per subset)
/// are assembled from those encodings, so a subset costs a filter and a copy, not a second build.
#[derive(Debug)]
pub(super) struct PortEndpoints<'s> {
    /// In locality order, each locality once.
    localities: Vec<LocalityEndpoints<'s>>,
}

/// The endpoints of one locality, in the order the service lists them.
#[derive(Debug)]
struct LocalityEndpoints<'s> {
    /// `LocalityLbEndpoints.locality`, encoded as a field.
    locality: Vec<u8>,
    endpoints: Vec<EncodedEndpoint<'s>>,
}

/// An endpoint serving the port, with its encoded `LbEndpoint` and its weight.
#[derive(Debug)]
struct EncodedEndpoint<'s> {
    instance: &'s Instance,
    encoded: Vec<u8>,
    weight: u32,
}

impl<'s> PortEndpoints<'s> {
    /// The endpoints of `service` that serve `port`.
    pub(super) fn new(service: &'s Service, port: &ServicePort) -> Self {
        PortEndpoints::of(
            service
                .endpoints
                .iter()
                .filter_map(|e| Some((e, e.ports.get(&port.number).copied()?))),
        )
    }

    /// Endpoints with the port each is reached on.
    fn of(endpoints: impl Iterator<Item = (&'s Instance, u32)>) -> Self {
        let mut endpoints: Vec<EncodedEndpoint> = endpoints
            .map(|(e, target)| {
                let lb = lb_endpoint(e, target);
                let weight = lb.load_balancing_weight.as_ref().map_or(1, |w| w.value);
                EncodedEndpoint {
                    instance: e,
                    encoded: lb.encode_to_vec(),
                    weight,
                }
            })
            .collect();
        // Stable: within a locality, the service's order.
        endpoints.sort_by(|a, b| a.instance.locality.cmp(&b.instance.locality));
        let mut localities: Vec<LocalityEndpoints> = Vec::new();
        for e in endpoints {
            match localities.last_mut() {
                Some(l) if l.endpoints[0].instance.locality == e.instance.locality => {
                    l.endpoints.push(e)
                }
                _ => localities.push(LocalityEndpoints {
                    locality: LocalityLbEndpoints {
                        locality: Some(parse_locality(&e.instance.locality)),
                        ..Default::default()
                    }
                    .encode_to_vec(),
                    endpoints: vec![e],
                }),
            }
        }
        PortEndpoints { localities }
    }

    /// The load assignment of `cluster`: the endpoints that carry the `subset` labels, grouped
    /// by locality, each locality weighted by the sum of its endpoints' weights; encoded, the
    /// same bytes as encoding the message.
    pub(super) fn assignment(
        &self,
        cluster: &str,
        subset: Option<&BTreeMap<String, String>>,
    ) -> Vec<u8> {
        // The selected endpoints of each locality that has any, with the locality's length and
        // weight; then the encoding, sized exactly (it is kept as long as it is served).
        let mut selected: Vec<&EncodedEndpoint> = Vec::new();
        let mut groups: Vec<(&LocalityEndpoints, usize, UInt32Value, usize)> = Vec::new();
        for locality in &self.localities {
            let from = selected.len();
            selected.extend(
                locality
                    .endpoints
                    .iter()
                    .filter(|e| subset.is_none_or(|labels| selects(labels, &e.instance.labels))),
            );
            let chosen = &selected[from..];
            if chosen.is_empty() {
                continue;
            }
            let weight = UInt32Value {
                value: chosen.iter().map(|e| e.weight).sum(),
            };
            let len = locality.locality.len()
                + chosen
                    .iter()
                    .map(|e| field_len(2, e.encoded.len()))
                    .sum::<usize>()
                + prost::encoding::message::encoded_len(3, &weight);
            groups.push((locality, from, weight, len));
        }
        let total = if cluster.is_empty() {
            0
        } else {
            field_len(1, cluster.len())
        } + groups.iter().map(|g| field_len(2, g.3)).sum::<usize>();
        // Fields in the order a message encoding writes them: ClusterLoadAssignment's
        // cluster_name (1) and endpoints (2); LocalityLbEndpoints' locality (1), lb_endpoints
        // (2) and load_balancing_weight (3).
        let mut out = Vec::with_capacity(total);
        string_field(1, cluster, &mut out);
        for (at, (locality, from, weight, len)) in groups.iter().enumerate() {
            let to = groups.get(at + 1).map_or(selected.len(), |next| next.1);
            length_delimited(2, *len, &mut out);
            out.extend_from_slice(&locality.locality);
            for e in &selected[*from..to] {
                length_delimited(2, e.encoded.len(), &mut out);
                out.extend_from_slice(&e.encoded);
            }
            prost::encoding::message::encode(3, weight, &mut out);
        }
        debug_assert_eq!(out.len(), total);
        out
    }

    /// The same, as a message (for a cluster that carries it inline).
    pub(super) fn message(
        &self,
        cluster: &str,
        subset: Option<&BTreeMap<String, String>>,
    ) -> ClusterLoadAssignment {
        // Decoding what was just encoded from messages cannot fail.
        ClusterLoadAssignment::decode(self.assignment(cluster, subset).as_slice())
            .unwrap_or_default()
    }

    /// For DNS clusters: the endpoints as host names to resolve, or the service host itself when
    /// it lists none.
    pub(super) fn dns(
        &self,
        cluster: &str,
        subset: Option<&BTreeMap<String, String>>,
        service: &Service,
        port: &ServicePort,
    ) -> ClusterLoadAssignment {
        let assignment = self.message(cluster, subset);
        if !assignment.endpoints.is_empty() {
            return assignment;
        }
        let host = service
            .external_name
            .clone()
            .unwrap_or_else(|| service.hostname.clone());
        single(cluster, &host, port.number)
    }
}

/// An endpoint as Envoy's `LbEndpoint`: its address on `port`, its weight, and whether it takes
/// Istio mutual TLS.
fn lb_endpoint(instance: &Instance, port: u32) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
            address: Some(socket_address(&instance.address, port)),
            ..Default::default()
        })),
        load_balancing_weight: Some(UInt32Value {
            value: instance.weight.max(1),
        }),
        // A workload with a sidecar takes Istio mTLS: auto mTLS picks the cluster's
        // `tlsMode-istio` transport socket for it.
        metadata: (instance
            .labels
            .get(metadata::TLS_MODE_LABEL)
            .map(String::as_str)
            == Some("istio"))
        .then(|| metadata::one_field(metadata::TRANSPORT_SOCKET_MATCH, "tlsMode", "istio")),
        ..Default::default()
    }
}

/// A one-endpoint assignment.
pub(super) fn single(cluster: &str, address: &str, port: u32) -> ClusterLoadAssignment {
    let instance = Instance {
        address: address.to_string(),
        ports: Default::default(),
        labels: Default::default(),
        locality: String::new(),
        weight: 1,
        network: String::new(),
        service_account: String::new(),
    };
    PortEndpoints::of(std::iter::once((&instance, port))).message(cluster, None)
}

fn parse_locality(text: &str) -> Locality {
    let mut parts = text.splitn(3, '/');
    Locality {
        region: parts.next().unwrap_or("").to_string(),
        zone: parts.next().unwrap_or("").to_string(),
        sub_zone: parts.next().unwrap_or("").to_string(),
    }
}

/// An Envoy address: `ip:port`, a DNS name with a port, or a Unix socket (`unix://path`).
pub(super) fn socket_address(address: &str, port: u32) -> Address {
    if let Some(path) = address.strip_prefix("unix://") {
        return Address {
            address: Some(address::Address::Pipe(
                envoy_types::pb::envoy::config::core::v3::Pipe {
                    path: path.to_string(),
                    mode: 0,
                },
            )),
        };
    }
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: address.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(address: &str, locality: &str, version: &str, weight: u32) -> Instance {
        Instance {
            address: address.into(),
            ports: std::sync::Arc::new([(80, 8080)].into()),
            labels: std::sync::Arc::new(
                [
                    ("version".to_string(), version.to_string()),
                    (metadata::TLS_MODE_LABEL.to_string(), "istio".to_string()),
                ]
                .into(),
            ),
            locality: locality.into(),
            weight,
            network: String::new(),
            service_account: String::new(),
        }
    }

    /// The message an assignment encodes, written out by hand.
    fn expected(cluster: &str, groups: &[(&str, &[&Instance])]) -> ClusterLoadAssignment {
        ClusterLoadAssignment {
            cluster_name: cluster.into(),
            endpoints: groups
                .iter()
                .map(|(locality, instances)| LocalityLbEndpoints {
                    locality: Some(parse_locality(locality)),
                    lb_endpoints: instances.iter().map(|i| lb_endpoint(i, 8080)).collect(),
                    load_balancing_weight: Some(UInt32Value {
                        value: instances.iter().map(|i| i.weight.max(1)).sum(),
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn assembled_assignments_are_the_bytes_of_the_message() {
        let a = instance("10.0.0.1", "us/east-a", "v1", 1);
        let b = instance("10.0.0.2", "us/east-b", "v2", 3);
        let c = instance("10.0.0.3", "us/east-a", "v2", 0);
        let endpoints = PortEndpoints::of([&a, &b, &c].into_iter().map(|i| (i, 8080)));
        let all = expected(
            "outbound|80||r",
            &[("us/east-a", &[&a, &c]), ("us/east-b", &[&b])],
        );
        assert_eq!(
            endpoints.assignment("outbound|80||r", None),
            all.encode_to_vec()
        );
        let v2: BTreeMap<String, String> = [("version".to_string(), "v2".to_string())].into();
        let subset = expected(
            "outbound|80|v2|r",
            &[("us/east-a", &[&c]), ("us/east-b", &[&b])],
        );
        assert_eq!(
            endpoints.assignment("outbound|80|v2|r", Some(&v2)),
            subset.encode_to_vec()
        );
        assert_eq!(endpoints.message("outbound|80|v2|r", Some(&v2)), subset);
        let none: BTreeMap<String, String> = [("version".to_string(), "v9".to_string())].into();
        assert_eq!(
            endpoints.message("outbound|80|v9|r", Some(&none)),
            expected("outbound|80|v9|r", &[])
        );
    }
}
