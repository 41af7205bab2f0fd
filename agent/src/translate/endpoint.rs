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

use super::metadata;
use crate::model::registry::{Instance, Service, ServicePort, selects};

/// A load assignment being built for one cluster.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Assignment(pub ClusterLoadAssignment);

impl Assignment {
    /// The endpoints of `service` on `port` that carry `subset` labels.
    pub(super) fn new(
        cluster: &str,
        service: &Service,
        port: &ServicePort,
        subset: Option<&BTreeMap<String, String>>,
    ) -> Assignment {
        let chosen = service
            .endpoints
            .iter()
            .filter(|e| subset.is_none_or(|labels| selects(labels, &e.labels)))
            .filter_map(|e| {
                let target = e.ports.get(&port.number).copied()?;
                Some((e, target))
            });
        Assignment(group(cluster, chosen))
    }

    /// For DNS clusters: the endpoints as host names to resolve, or the service host itself when
    /// it lists none.
    pub(super) fn dns(self, service: &Service, port: &ServicePort) -> ClusterLoadAssignment {
        if !self.0.endpoints.is_empty() {
            return self.0;
        }
        let host = service
            .external_name
            .clone()
            .unwrap_or_else(|| service.hostname.clone());
        single(&self.0.cluster_name, &host, port.number)
    }
}

fn group<'a>(
    cluster: &str,
    endpoints: impl Iterator<Item = (&'a Instance, u32)>,
) -> ClusterLoadAssignment {
    let mut by_locality: BTreeMap<&str, Vec<LbEndpoint>> = BTreeMap::new();
    for (instance, port) in endpoints {
        by_locality
            .entry(instance.locality.as_str())
            .or_default()
            .push(LbEndpoint {
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
            });
    }
    ClusterLoadAssignment {
        cluster_name: cluster.to_string(),
        endpoints: by_locality
            .into_iter()
            .map(|(locality, lb_endpoints)| {
                let weight: u32 = lb_endpoints
                    .iter()
                    .map(|e| e.load_balancing_weight.as_ref().map_or(1, |w| w.value))
                    .sum();
                LocalityLbEndpoints {
                    locality: Some(parse_locality(locality)),
                    lb_endpoints,
                    load_balancing_weight: Some(UInt32Value { value: weight }),
                    ..Default::default()
                }
            })
            .collect(),
        ..Default::default()
    }
}

/// A one-endpoint assignment.
pub(super) fn single(cluster: &str, address: &str, port: u32) -> ClusterLoadAssignment {
    let instance = Instance {
        address: address.to_string(),
        ports: BTreeMap::new(),
        labels: BTreeMap::new(),
        locality: String::new(),
        weight: 1,
        network: String::new(),
        service_account: String::new(),
    };
    group(cluster, std::iter::once((&instance, port)))
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
