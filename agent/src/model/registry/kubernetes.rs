//! The services of Kubernetes Services (ServiceEndpoints) and their endpoints, merged from the
//! parts (EndpointSlices) that name them.

use std::collections::BTreeMap;
use std::sync::Arc;

use pasa_istio::host;
use pasa_istio::persistent_session::PersistentSession;
use pasa_istio::service_endpoints::{
    EndpointView, KubePort, NetworkGateway, ServiceEndpoints, TrafficDistribution,
};
use pasa_proto::Kind;

use crate::cache::Key;

use super::interned::Shared;
use super::{EndpointPorts, Instance, Meta, Resolution, Service, ServicePort};

/// A Kubernetes Service as one cluster has it, parsed: its service, its ports as written (which
/// resolve the ports of the endpoints its parts hold), and what it says of the cluster and the
/// networks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterService {
    /// The Service's name (the object's, or the `spec.service` another cluster's names).
    name: String,
    pub(super) service: Arc<Service>,
    pub(super) ports: Arc<[KubePort]>,
    /// The cluster that reported it (empty: not said).
    pub(super) cluster: String,
    /// The network gateways it is.
    pub(super) network_gateways: Vec<NetworkGateway>,
    /// Where it is reached from outside its cluster.
    pub(super) external_addresses: Vec<String>,
}

impl ClusterService {
    /// Whether it states network gateways and nothing else: no ports, no endpoints.
    pub(super) fn is_gateways_only(&self) -> bool {
        !self.network_gateways.is_empty()
            && self.ports.is_empty()
            && self.service.endpoints.is_empty()
    }

    /// The key of the service it is a cluster's view of: the Service's own name (`spec.service`
    /// for another cluster's object).
    pub(super) fn service_key(&self, namespace: &str) -> Key {
        Key {
            kind: Kind::ServiceEndpoints,
            namespace: namespace.to_string(),
            name: self.name.clone(),
        }
    }
}

/// A part of a Kubernetes Service's endpoints (one EndpointSlice), parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The name of the service (of the part's namespace).
    service: String,
    /// The cluster that reported it (empty: not said).
    cluster: String,
    /// The port the endpoints receive on, by service port name.
    endpoint_ports: BTreeMap<String, u32>,
    /// The endpoints, their `ports` left empty: they depend on the service's ports.
    endpoints: Vec<Instance>,
    /// Each endpoint's container ports by name (for named `targetPort`s), where it has any.
    named_ports: Vec<BTreeMap<String, u32>>,
    revision: u64,
}

impl Part {
    pub(super) fn service_key(&self, namespace: &str) -> Key {
        Key {
            kind: Kind::ServiceEndpoints,
            namespace: namespace.to_string(),
            name: self.service.clone(),
        }
    }
}

/// The service one or several clusters have (`services`, each with the parts of its endpoints
/// it has in its cluster), as istiod's aggregate registry makes it:
/// - the service is the primary's (PCP's own cluster's object, which keeps the Service's name,
///   else the first cluster's): its ports, resolution and age;
/// - its addresses are those of `cluster` (the proxy's: istiod's `ClusterVIPs`), else the
///   primary's;
/// - its endpoints are each cluster's, the clusters in ID order (istiod's shard order), each
///   cluster's own endpoints first, then its parts' in name order.
///
/// One cluster without parts is its service as it is, shared.
pub(super) fn merge_clusters(
    services: &[&ClusterService],
    parts: &[&Part],
    cluster: &str,
) -> Option<Arc<Service>> {
    let primary = *services.first()?;
    if services.len() == 1 && parts.is_empty() {
        return Some(Arc::clone(&primary.service));
    }
    let mut merged = (*primary.service).clone();
    if services.len() == 1 {
        merge_parts(&mut merged, &primary.ports, parts.iter().copied());
        return Some(Arc::new(merged));
    }
    merged.endpoints.clear();
    let mut by_cluster: Vec<&ClusterService> = services.to_vec();
    by_cluster.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    for one in &by_cluster {
        merged.revision = merged.revision.max(one.service.revision);
        merged
            .endpoints
            .extend(one.service.endpoints.iter().cloned());
        let own = parts.iter().copied().filter(|p| p.cluster == one.cluster);
        merge_parts(&mut merged, &one.ports, own);
    }
    if let Some(local) = by_cluster
        .iter()
        .find(|s| s.cluster == cluster && !s.service.addresses.is_empty())
    {
        merged.addresses = local.service.addresses.clone();
    }
    Some(Arc::new(merged))
}

/// Appends the endpoints of `parts` to `merged`, each part's endpoints reached on the ports the
/// part lists for the service's ports (or by `targetPort`, for a port it does not list).
fn merge_parts<'p>(
    merged: &mut Service,
    kube_ports: &[KubePort],
    parts: impl Iterator<Item = &'p Part>,
) {
    let mut shared = Shared::default();
    for part in parts {
        merged.revision = merged.revision.max(part.revision);
        for (i, endpoint) in part.endpoints.iter().enumerate() {
            let named = part.named_ports.get(i);
            let ports = shared.ports(kube_ports.iter().filter_map(|p| {
                let target = match part.endpoint_ports.get(&p.name) {
                    Some(listed) => *listed,
                    None => p.endpoint_port_by(|name| named?.get(name).copied())?,
                };
                Some((p.port, target))
            }));
            merged.endpoints.push(Instance {
                ports,
                ..endpoint.clone()
            });
        }
    }
}

/// A part of a service's endpoints, built from its spec as read.
pub(super) fn part_from_kubernetes(meta: &Meta, spec: ServiceEndpoints<EndpointView<'_>>) -> Part {
    let mut shared = Shared::default();
    let has_named = spec.endpoints.iter().any(|e| !e.ports.is_empty());
    let named_ports = if has_named {
        let owned = |e: &EndpointView| e.ports.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        spec.endpoints.iter().map(owned).collect()
    } else {
        Vec::new()
    };
    let endpoints = spec
        .endpoints
        .iter()
        .map(|e| shared.instance(e, EndpointPorts::default(), &spec.cluster))
        .collect();
    Part {
        service: spec.service,
        cluster: spec.cluster,
        endpoint_ports: spec.endpoint_ports,
        endpoints,
        named_ports,
        revision: meta.revision,
    }
}

/// The service of a ServiceEndpoints, built from its spec as read (its strings still in the
/// JSON): an endpoint's strings are copied once, and what endpoints have alike only once.
pub(super) fn from_kubernetes(
    meta: Meta,
    spec: ServiceEndpoints<EndpointView<'_>>,
    domain_suffix: &str,
) -> ClusterService {
    let ServiceEndpoints {
        addresses,
        ports: kube_ports,
        endpoints,
        external_name,
        export_to,
        selector: _,
        service: service_name,
        endpoint_ports: _,
        cluster,
        external_addresses,
        network_gateways,
        traffic_distribution,
    } = spec;
    // Another cluster's object names its Service.
    let name = if service_name.is_empty() {
        meta.name.clone()
    } else {
        service_name
    };
    let ports: Vec<ServicePort> = kube_ports
        .iter()
        .map(|p| ServicePort {
            name: p.name.clone(),
            number: p.port,
            protocol: p.application_protocol(),
            target_port: p.port,
        })
        .collect();
    let mut shared = Shared::default();
    let endpoints = endpoints
        .iter()
        .map(|e| {
            let ports = shared.ports(kube_ports.iter().filter_map(|p| {
                let target = p.endpoint_port_by(|name| e.ports.get(name).copied())?;
                Some((p.port, target))
            }));
            shared.instance(e, ports, &cluster)
        })
        .collect();
    let external_name = (!external_name.is_empty()).then_some(external_name);
    let addresses: Vec<String> = addresses
        .into_iter()
        .filter(|a| !a.eq_ignore_ascii_case("none"))
        .collect();
    let resolution = if external_name.is_some() {
        Resolution::DnsRoundRobin
    } else if addresses.is_empty() {
        // Headless: callers pick a pod address themselves.
        Resolution::Passthrough
    } else {
        Resolution::ClientSideLb
    };
    let service = Service {
        hostname: host::service_fqdn(&name, &meta.namespace, domain_suffix),
        addresses,
        ports,
        resolution,
        external: external_name.is_some(),
        export_to,
        endpoints,
        kubernetes: true,
        external_name,
        subject_alt_names: Vec::new(),
        persistent_session: PersistentSession::of(&meta.labels),
        traffic_distribution: TrafficDistribution::parse(&traffic_distribution),
        created: meta.created,
        revision: meta.revision,
        source: Key {
            kind: Kind::ServiceEndpoints,
            namespace: meta.namespace.clone(),
            name: meta.name,
        },
        namespace: meta.namespace,
    };
    ClusterService {
        name,
        service: Arc::new(service),
        ports: kube_ports.into(),
        cluster,
        network_gateways,
        external_addresses,
    }
}
