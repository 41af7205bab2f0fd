//! Listeners and route configurations of an Envoy sidecar.
//!
//! Outbound: one `0.0.0.0_<port>` listener per HTTP port of the visible services, routed by the
//! route configuration named after the port; one listener per virtual IP (`<vip>_<port>`) for
//! TCP services, or per endpoint address for headless ones; `virtualOutbound` (15001) catches the
//! rest and sends it to `PassthroughCluster` (or `BlackHoleCluster` under `REGISTRY_ONLY`).
//! Inbound: `virtualInbound` (15006) with filter chains per port of the workload's services (or
//! of the Sidecar's ingress listeners) to `inbound|<port>||` clusters, plaintext and Istio mTLS,
//! and catch-all chains to `InboundPassthroughCluster`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{
    CidrRange, TrafficDirection, TransportSocket, transport_socket,
};
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::{DirectResponseAction, Route, RouteConfiguration};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, SdsSecretConfig,
    common_tls_context::ValidationContextType,
};
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};
use envoy_types::util::pack_any;
use pasa_proto::istio::common::Protocol;

use super::cluster::{self, ads};
use super::endpoint::socket_address;
use super::filters::{self, Routes};
use super::registry::{Resolution, Service};
use super::route;
use super::{Resources, View, names, tls};
use crate::mesh::{InboundPolicy, OutboundPolicy};

/// Outbound listeners and route configurations.
pub(super) fn outbound(view: &View<'_>, out: &mut Resources) {
    let mut http_ports: BTreeMap<u32, Vec<&Arc<Service>>> = BTreeMap::new();
    // TCP filter chains of the wildcard listener of each port: services known by a CIDR match
    // on it (the longest prefix wins), services without an address are the fallback.
    let mut wildcard_tcp: BTreeMap<u32, Vec<(Option<Prefix>, FilterChain)>> = BTreeMap::new();
    // Oldest first: when two services claim one address, the older one keeps it.
    let mut services: Vec<&Arc<Service>> = view.services.values().collect();
    services.sort_by(|a, b| (a.created, &a.hostname).cmp(&(b.created, &b.hostname)));
    for service in services {
        for port in &service.ports {
            if port.protocol == Some(Protocol::Udp) {
                continue;
            }
            if port.is_http() {
                http_ports.entry(port.number).or_default().push(service);
                continue;
            }
            let clusters = tcp_clusters(view, service, port.number);
            let chain = || FilterChain {
                filters: vec![filters::tcp_proxy(&clusters[0].0, &clusters)],
                ..Default::default()
            };
            let mut ips: Vec<String> = Vec::new();
            for address in &service.addresses {
                match parse_cidr(address) {
                    Some(prefix) => {
                        let chains = wildcard_tcp.entry(port.number).or_default();
                        if chains.iter().all(|(p, _)| *p != Some(prefix)) {
                            let mut c = chain();
                            c.filter_chain_match = Some(FilterChainMatch {
                                prefix_ranges: vec![CidrRange {
                                    address_prefix: prefix.0.to_string(),
                                    prefix_len: Some(UInt32Value { value: prefix.1 }),
                                }],
                                ..Default::default()
                            });
                            chains.push((Some(prefix), c));
                        }
                    }
                    None => ips.push(address.clone()),
                }
            }
            if service.addresses.is_empty() {
                if service.resolution == Resolution::Passthrough && service.kubernetes {
                    // Headless: one listener per endpoint address.
                    ips.extend(service.endpoints.iter().map(|e| e.address.clone()));
                } else {
                    let chains = wildcard_tcp.entry(port.number).or_default();
                    if chains.iter().all(|(p, _)| p.is_some()) {
                        chains.push((None, chain()));
                    }
                }
            }
            // TLS rules of its VirtualService route by SNI on its own listeners.
            let sni = tls::sni_chains(view, service, port.number);
            for ip in ips {
                let name = names::listener(&ip, port.number);
                if !out.listeners.contains_key(&name) {
                    let mut listener = if sni.is_empty() {
                        outbound_listener(&name, &ip, port.number, vec![chain()])
                    } else {
                        outbound_listener(&name, &ip, port.number, sni.clone())
                    };
                    if !sni.is_empty() {
                        listener.listener_filters = filters::tls_inspector();
                    }
                    out.listeners.insert(name.clone(), listener);
                }
            }
        }
    }
    for (port, chains) in wildcard_tcp {
        if http_ports.contains_key(&port) {
            tracing::debug!(port, "TCP services on a port HTTP services use: HTTP wins");
            continue;
        }
        let name = names::listener("0.0.0.0", port);
        let chains = chains.into_iter().map(|(_, c)| c).collect();
        out.listeners.insert(
            name.clone(),
            outbound_listener(&name, "0.0.0.0", port, chains),
        );
    }
    for (port, services) in http_ports {
        let name = names::listener("0.0.0.0", port);
        let hcm = filters::http_connection_manager(
            &format!("outbound_0.0.0.0_{port}"),
            Routes::Rds(port.to_string()),
        );
        let chain = FilterChain {
            filters: vec![filters::hcm_filter(hcm)],
            ..Default::default()
        };
        out.listeners.insert(
            name.clone(),
            outbound_listener(&name, "0.0.0.0", port, vec![chain]),
        );
        out.routes
            .insert(port.to_string(), route_config(view, port, &services));
    }
    // Virtual hosts of VirtualService hosts that name no service go on every HTTP port.
    out.listeners.insert(
        names::VIRTUAL_OUTBOUND.into(),
        virtual_outbound(view.scope.outbound_policy),
    );
}

fn outbound_listener(name: &str, ip: &str, port: u32, chains: Vec<FilterChain>) -> Listener {
    Listener {
        name: name.to_string(),
        address: Some(socket_address(ip, port)),
        filter_chains: chains,
        traffic_direction: TrafficDirection::Outbound as i32,
        bind_to_port: Some(BoolValue { value: false }),
        ..Default::default()
    }
}

/// A masked address and its prefix length.
type Prefix = (IpAddr, u32);

/// An address written as a CIDR (`10.0.0.0/8`), with the insignificant bits cleared.
fn parse_cidr(text: &str) -> Option<Prefix> {
    let (ip, len) = text.split_once('/')?;
    let ip: IpAddr = ip.parse().ok()?;
    let len: u32 = len.parse().ok()?;
    let masked = match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let mask = if len == 0 {
                0
            } else {
                u32::MAX << (32 - len.min(32))
            };
            IpAddr::V4((bits & mask).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len.min(128))
            };
            IpAddr::V6((bits & mask).into())
        }
    };
    Some((masked, len))
}

/// The clusters a TCP connection to `service` on `port` goes to: the first TCP rule of its
/// VirtualService that applies to the port, else the service's own cluster.
fn tcp_clusters(view: &View<'_>, service: &Service, port: u32) -> Vec<(String, u32)> {
    if let Some(vs) = view.virtual_service_for(&service.hostname) {
        for rule in &vs.spec.tcp {
            let applies = rule.matches.is_empty()
                || rule.matches.iter().any(|m| m.port == 0 || m.port == port);
            if applies && !rule.route.is_empty() {
                return view.weighted_clusters(&rule.route, &vs.meta.namespace, port);
            }
        }
    }
    vec![(names::outbound_cluster(port, "", &service.hostname), 100)]
}

/// The route configuration of one outbound HTTP port: a virtual host per service on the port
/// (its VirtualService's routes, or the default route), one per VirtualService host that names no
/// service, and the catch-all.
fn route_config(view: &View<'_>, port: u32, services: &[&Arc<Service>]) -> RouteConfiguration {
    let mut vhosts = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for service in services {
        let routes = match view.virtual_service_for(&service.hostname) {
            Some(vs) => route::http_routes(&vs.spec.http, &vs.meta.namespace, port, view),
            None => vec![view.default_route(service, port)],
        };
        if routes.is_empty() {
            continue;
        }
        seen.insert(service.hostname.clone());
        vhosts.push(route::virtual_host(
            names::host_port(&service.hostname, port),
            route::domains(
                &service.hostname,
                Some(service),
                port,
                &view.proxy.dns_domain,
            ),
            routes,
        ));
    }
    for vs in &view.virtual_services {
        for h in &vs.spec.hosts {
            let host = view.proxy.resolve_host(h, &vs.meta.namespace);
            if seen.contains(&host) || view.services.contains_key(&host) {
                continue;
            }
            if view.virtual_service_for(&host).map(|v| Arc::ptr_eq(v, vs)) != Some(true) {
                continue;
            }
            let routes = route::http_routes(&vs.spec.http, &vs.meta.namespace, port, view);
            if routes.is_empty() {
                continue;
            }
            seen.insert(host.clone());
            vhosts.push(route::virtual_host(
                names::host_port(&host, port),
                route::domains(&host, None, port, &view.proxy.dns_domain),
                routes,
            ));
        }
    }
    vhosts.push(catch_all(view.scope.outbound_policy));
    RouteConfiguration {
        name: port.to_string(),
        virtual_hosts: vhosts,
        validate_clusters: Some(BoolValue { value: false }),
        ..Default::default()
    }
}

fn catch_all(policy: OutboundPolicy) -> envoy_types::pb::envoy::config::route::v3::VirtualHost {
    let (name, action) = match policy {
        OutboundPolicy::AllowAny => (
            names::ALLOW_ANY,
            route::default_route(names::PASSTHROUGH_CLUSTER)
                .action
                .unwrap_or_else(|| Action::DirectResponse(DirectResponseAction::default())),
        ),
        OutboundPolicy::RegistryOnly => (
            names::BLOCK_ALL,
            Action::DirectResponse(DirectResponseAction {
                status: 502,
                ..Default::default()
            }),
        ),
    };
    let route = Route {
        name: name.into(),
        r#match: route::default_route("").r#match,
        action: Some(action),
        ..Default::default()
    };
    route::virtual_host(name.into(), vec!["*".into()], vec![route])
}

fn virtual_outbound(policy: OutboundPolicy) -> Listener {
    let cluster = match policy {
        OutboundPolicy::AllowAny => names::PASSTHROUGH_CLUSTER,
        OutboundPolicy::RegistryOnly => names::BLACK_HOLE_CLUSTER,
    };
    let chain = FilterChain {
        name: cluster.into(),
        filters: vec![filters::tcp_proxy(cluster, &[(cluster.to_string(), 100)])],
        ..Default::default()
    };
    Listener {
        name: names::VIRTUAL_OUTBOUND.into(),
        address: Some(socket_address("0.0.0.0", names::VIRTUAL_OUTBOUND_PORT)),
        use_original_dst: Some(BoolValue { value: true }),
        filter_chains: vec![chain],
        traffic_direction: TrafficDirection::Outbound as i32,
        ..Default::default()
    }
}

/// One port the workload receives on.
#[derive(Debug, Clone, PartialEq, Eq)]
struct InboundPort {
    port: u32,
    http: bool,
    /// Where to forward (a Sidecar ingress listener's `defaultEndpoint`), else the original
    /// destination.
    endpoint: Option<(String, u32)>,
}

/// Inbound clusters and `virtualInbound`.
pub(super) fn inbound(view: &View<'_>, out: &mut Resources) {
    let ports = inbound_ports(view);
    let mut chains = Vec::new();
    for p in &ports {
        let cluster_name = names::inbound_cluster(p.port);
        out.clusters.insert(
            cluster_name.clone(),
            cluster::inbound(p.port, p.endpoint.clone()),
        );
        for tls in [false, true] {
            chains.push(inbound_chain(p, &cluster_name, tls));
        }
    }
    let passthrough = match view.proxy.mesh.inbound_policy {
        InboundPolicy::Passthrough | InboundPolicy::Localhost => names::INBOUND_PASSTHROUGH_CLUSTER,
    };
    // Catch-all chains: HTTP and raw TCP to the original destination.
    let http_catch_all = filters::http_connection_manager(
        "InboundPassthroughCluster",
        Routes::Inline(Box::new(RouteConfiguration {
            name: names::INBOUND_PASSTHROUGH_CLUSTER.into(),
            virtual_hosts: vec![route::virtual_host(
                "inbound|http|0".into(),
                vec!["*".into()],
                vec![route::default_route(passthrough)],
            )],
            validate_clusters: Some(BoolValue { value: false }),
            ..Default::default()
        })),
    );
    chains.push(FilterChain {
        name: "virtualInbound-catchall-http".into(),
        filter_chain_match: Some(FilterChainMatch {
            transport_protocol: "raw_buffer".into(),
            application_protocols: vec!["http/1.1".into(), "h2c".into()],
            ..Default::default()
        }),
        filters: vec![filters::hcm_filter(http_catch_all)],
        ..Default::default()
    });
    chains.push(FilterChain {
        name: names::VIRTUAL_INBOUND.into(),
        filter_chain_match: Some(FilterChainMatch {
            transport_protocol: "raw_buffer".into(),
            ..Default::default()
        }),
        filters: vec![filters::tcp_proxy(
            passthrough,
            &[(passthrough.to_string(), 100)],
        )],
        ..Default::default()
    });
    out.listeners.insert(
        names::VIRTUAL_INBOUND.into(),
        Listener {
            name: names::VIRTUAL_INBOUND.into(),
            address: Some(socket_address("0.0.0.0", names::VIRTUAL_INBOUND_PORT)),
            use_original_dst: Some(BoolValue { value: true }),
            listener_filters: filters::capture_listener_filters(true),
            filter_chains: chains,
            traffic_direction: TrafficDirection::Inbound as i32,
            ..Default::default()
        },
    );
    out.clusters.insert(
        names::INBOUND_PASSTHROUGH_CLUSTER.into(),
        cluster::inbound_passthrough(),
    );
}

fn inbound_chain(p: &InboundPort, cluster_name: &str, mtls: bool) -> FilterChain {
    let filter = if p.http {
        // Inbound routes forward once: retries are the caller's sidecar's business.
        let mut route = route::default_route(cluster_name);
        if let Some(Action::Route(action)) = &mut route.action {
            action.retry_policy = None;
        }
        filters::hcm_filter(filters::http_connection_manager(
            &format!("inbound_0.0.0.0_{}", p.port),
            Routes::Inline(Box::new(RouteConfiguration {
                name: cluster_name.to_string(),
                virtual_hosts: vec![route::virtual_host(
                    names::inbound_virtual_host(p.port),
                    vec!["*".into()],
                    vec![route],
                )],
                validate_clusters: Some(BoolValue { value: false }),
                ..Default::default()
            })),
        ))
    } else {
        filters::tcp_proxy(cluster_name, &[(cluster_name.to_string(), 100)])
    };
    let mut chain = FilterChain {
        name: names::listener("0.0.0.0", p.port),
        filter_chain_match: Some(FilterChainMatch {
            destination_port: Some(UInt32Value { value: p.port }),
            transport_protocol: if mtls { "tls" } else { "raw_buffer" }.into(),
            application_protocols: if mtls {
                if p.http {
                    vec![
                        "istio-http/1.0".into(),
                        "istio-http/1.1".into(),
                        "istio-h2".into(),
                    ]
                } else {
                    vec!["istio-peer-exchange".into(), "istio".into()]
                }
            } else {
                Vec::new()
            },
            ..Default::default()
        }),
        filters: vec![filter],
        ..Default::default()
    };
    if mtls {
        chain.transport_socket = Some(istio_mutual_server());
    }
    chain
}

/// The server side of Istio mutual TLS: the workload certificate (`default`) and the mesh root
/// (`ROOTCA`) over SDS, client certificates required.
fn istio_mutual_server() -> TransportSocket {
    let sds = |name: &str| SdsSecretConfig {
        name: name.into(),
        sds_config: Some(ads()),
    };
    let context = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_sds_secret_configs: vec![sds("default")],
            validation_context_type: Some(ValidationContextType::ValidationContextSdsSecretConfig(
                sds("ROOTCA"),
            )),
            alpn_protocols: vec!["h2".into(), "http/1.1".into()],
            ..Default::default()
        }),
        require_client_certificate: Some(BoolValue { value: true }),
        ..Default::default()
    };
    TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(context))),
    }
}

/// The ports the workload receives on: the Sidecar's ingress listeners when it has any, else
/// the ports of the services that list this proxy's address as an endpoint.
fn inbound_ports(view: &View<'_>) -> Vec<InboundPort> {
    if let Some(sidecar) = &view.scope.sidecar
        && !sidecar.spec.ingress.is_empty()
    {
        return sidecar
            .spec
            .ingress
            .iter()
            .filter_map(|i| {
                let port = i.port.as_ref()?;
                let endpoint = parse_endpoint(&i.default_endpoint, port.number);
                Some(InboundPort {
                    port: port.number,
                    http: Protocol::parse(&port.protocol).is_some_and(Protocol::is_http),
                    endpoint,
                })
            })
            .collect();
    }
    let ips: Vec<String> = view.proxy.ips.iter().map(IpAddr::to_string).collect();
    let mut ports: BTreeMap<u32, InboundPort> = BTreeMap::new();
    for service in view.registry.services().values().flatten() {
        if service.namespace != view.proxy.namespace && service.kubernetes {
            continue;
        }
        for instance in service
            .endpoints
            .iter()
            .filter(|e| ips.contains(&e.address))
        {
            for port in &service.ports {
                let Some(target) = instance.ports.get(&port.number).copied() else {
                    continue;
                };
                ports.entry(target).or_insert(InboundPort {
                    port: target,
                    http: port.is_http(),
                    endpoint: None,
                });
            }
        }
    }
    ports.into_values().collect()
}

/// `127.0.0.1:8080`, `0.0.0.0:8080` (original destination) or `unix://…`.
fn parse_endpoint(text: &str, port: u32) -> Option<(String, u32)> {
    if text.is_empty() {
        return Some(("127.0.0.1".into(), port));
    }
    if text.starts_with("unix://") {
        return Some((text.to_string(), 0));
    }
    let (host, p) = text.rsplit_once(':')?;
    let p: u32 = p.parse().ok()?;
    if host == "0.0.0.0" {
        return None;
    }
    Some((host.to_string(), p))
}

/// The special clusters every sidecar has.
pub(super) fn special_clusters(out: &mut Resources) {
    for c in [cluster::passthrough(), cluster::black_hole()] {
        out.clusters.insert(c.name.clone(), c);
    }
}
