//! The services of Kubernetes Services (ServiceEndpoints) and their endpoints, merged from the
//! parts (EndpointSlices) that name them.

use std::collections::BTreeMap;
use std::sync::Arc;

use pasa_istio::host;
use pasa_istio::persistent_session::PersistentSession;
use pasa_istio::service_endpoints::{EndpointView, KubePort, ServiceEndpoints};
use pasa_proto::Kind;

use crate::cache::Key;

use super::interned::Shared;
use super::{EndpointPorts, Instance, Meta, Resolution, Service, ServicePort};

/// A part of a Kubernetes Service's endpoints (one EndpointSlice), parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The name of the service (of the part's namespace).
    service: String,
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

/// The service with the endpoints of its parts after its own, each part's endpoints reached on
/// the ports the part lists for the service's ports (or by `targetPort`, for a port it does not
/// list).
pub(super) fn merge_parts<'p>(
    service: &Service,
    kube_ports: &[KubePort],
    parts: impl Iterator<Item = &'p Part>,
) -> Service {
    let mut merged = service.clone();
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
    merged
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
        .map(|e| shared.instance(e, EndpointPorts::default()))
        .collect();
    Part {
        service: spec.service,
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
) -> (Service, Arc<[KubePort]>) {
    let ServiceEndpoints {
        addresses,
        ports: kube_ports,
        endpoints,
        external_name,
        export_to,
        selector: _,
        service: _,
        endpoint_ports: _,
        cluster: _,
        external_addresses: _,
        network_gateways: _,
    } = spec;
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
            shared.instance(e, ports)
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
        hostname: host::service_fqdn(&meta.name, &meta.namespace, domain_suffix),
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
        created: meta.created,
        revision: meta.revision,
        source: Key {
            kind: Kind::ServiceEndpoints,
            namespace: meta.namespace.clone(),
            name: meta.name,
        },
        namespace: meta.namespace,
    };
    (service, kube_ports.into())
}
