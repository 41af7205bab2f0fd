//! Non-HTTP servers of a router: TCP servers (VirtualService `tcp` routes through a TCP proxy),
//! TLS servers that terminate TLS and then proxy TCP, TLS `PASSTHROUGH` servers (one chain per
//! SNI match of the bound VirtualServices' `tls` routes) and `AUTO_PASSTHROUGH` servers (SNI-DNAT:
//! one chain per service port and subset, matched by the cluster name as SNI, to a cluster of
//! that name, `outbound_.<port>_.<subset>_.<host>`).

use std::collections::HashMap;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use pasa_istio::common::Protocol;
use pasa_istio::gateway::TlsMode;
use pasa_istio::virtual_service::VirtualService;
use prost::Message;

use super::super::{Built, Generator, View, cluster, endpoint, filters, names};
use super::{Chain, bound_virtual_services, http};
use crate::model::gateway::{Bound, check_duplicates};
use crate::model::proxy::ProxyBuild;
use crate::model::registry::{Config, Service};

/// The ALPN values of Istio mutual TLS: what an `AUTO_PASSTHROUGH` chain accepts.
const ISTIO_MTLS_ALPNS: [&str; 5] = [
    "istio",
    "istio-peer-exchange",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
];

/// The chains of one non-HTTP server. `sni_known` holds the SNI names earlier passthrough chains
/// of the listener already match (on their bind address); a repeated one is left out.
pub(super) fn chains(
    view: &View<'_>,
    bound: &Bound<'_>,
    sni_known: &mut HashMap<String, String>,
) -> Vec<Chain> {
    match bound.tls_mode() {
        None => tcp_routes(view, bound)
            .map(|filter| Chain {
                filters: vec![filter],
                ..Default::default()
            })
            .into_iter()
            .collect(),
        Some(TlsMode::AutoPassthrough) => auto_passthrough(view, &bound.sni_hosts()),
        Some(TlsMode::Passthrough) => tls_routes(view, bound, sni_known),
        Some(mode) => tcp_routes(view, bound)
            .map(|filter| {
                // Istio's proxy learns the downstream peer of Istio mutual TLS, as from istiod.
                let exchange =
                    mode == TlsMode::IstioMutual && view.proxy.build == ProxyBuild::Istio;
                Chain {
                    sni_hosts: bound.sni_hosts(),
                    tls: http::server_tls(&bound.server, exchange),
                    filters: exchange
                        .then(filters::tcp_listener_mx)
                        .into_iter()
                        .chain([filter])
                        .collect(),
                    ..Default::default()
                }
            })
            .into_iter()
            .collect(),
    }
}

/// Whether one of the VirtualService's hosts overlaps one of the server's (a `ns/host` server
/// host only for VirtualServices of that namespace).
fn serves_hosts_of(bound: &Bound<'_>, vs: &Config<VirtualService>) -> bool {
    super::http::host_patterns(&bound.server, &vs.meta.namespace).any(|pattern| {
        vs.spec
            .hosts
            .iter()
            .any(|v| pasa_istio::host::matches(pattern, v))
    })
}

/// A TLS or TCP match's port and gateway conditions, against this server.
fn l4_match(port: u32, gateways: &[String], vs_namespace: &str, bound: &Bound<'_>) -> bool {
    let gateway = bound.gateway_name();
    (port == 0 || port == bound.port())
        && (gateways.is_empty()
            || gateways
                .iter()
                .any(|g| pasa_istio::gateway::resolve_gateway_name(g, vs_namespace) == gateway))
}

/// The TCP proxy of the first `tcp` route of a bound VirtualService that matches the server.
fn tcp_routes(
    view: &View<'_>,
    bound: &Bound<'_>,
) -> Option<envoy_types::pb::envoy::config::listener::v3::Filter> {
    for vs in bound_virtual_services(view, &bound.gateway_name()) {
        if !serves_hosts_of(bound, vs) {
            continue;
        }
        let ns = &vs.meta.namespace;
        for rule in &vs.spec.tcp {
            let matched = rule.matches.is_empty()
                || rule
                    .matches
                    .iter()
                    .any(|m| l4_match(m.port, &m.gateways, ns, bound));
            if matched && !rule.route.is_empty() {
                return Some(filters::tcp_route(
                    view,
                    &rule.route,
                    &vs.meta,
                    bound.port(),
                ));
            }
        }
    }
    None
}

/// One chain per SNI match of the bound VirtualServices' `tls` routes.
fn tls_routes(
    view: &View<'_>,
    bound: &Bound<'_>,
    sni_known: &mut HashMap<String, String>,
) -> Vec<Chain> {
    let mut out = Vec::new();
    for vs in bound_virtual_services(view, &bound.gateway_name()) {
        if !serves_hosts_of(bound, vs) {
            continue;
        }
        let ns = &vs.meta.namespace;
        for rule in vs.spec.tls.iter().filter(|r| !r.route.is_empty()) {
            for m in &rule.matches {
                if !l4_match(m.port, &m.gateways, ns, bound) {
                    continue;
                }
                if !check_duplicates(&m.sni_hosts, &bound.server.bind, sni_known).is_empty() {
                    tracing::debug!(virtual_service = %vs.meta.name, namespace = %ns,
                        "TLS match left out: its SNI names are already routed on this port");
                    continue;
                }
                out.push(Chain {
                    sni_hosts: m.sni_hosts.clone(),
                    filters: vec![filters::tcp_route(
                        view,
                        &rule.route,
                        &vs.meta,
                        bound.port(),
                    )],
                    ..Default::default()
                });
            }
        }
    }
    out
}

/// `hostname` is one of the names `pattern` covers.
fn subset_of(hostname: &str, pattern: &str) -> bool {
    match pattern.strip_prefix('*') {
        Some(suffix) => hostname.ends_with(suffix),
        None => hostname == pattern,
    }
}

/// The services SNI-DNAT reaches: inside the mesh, concrete (not aliases).
fn sni_dnat_services<'v>(view: &'v View<'_>) -> impl Iterator<Item = &'v Service> {
    view.services
        .values()
        .filter(|s| !s.external && !view.is_alias(s))
        .map(|s| s.as_ref())
}

/// Ports SNI-DNAT serves (not UDP).
fn dnat_ports(service: &Service) -> impl Iterator<Item = u32> + '_ {
    service
        .ports
        .iter()
        .filter(|p| p.protocol != Some(Protocol::Udp))
        .map(|p| p.number)
}

/// Subset names of the DestinationRule that applies to `service`.
fn subsets(view: &View<'_>, service: &Service) -> Vec<String> {
    view.destination_rules
        .for_service(service)
        .map(|dr| dr.spec.subsets.iter().map(|s| s.name.clone()).collect())
        .unwrap_or_default()
}

/// One chain per port and subset of every service a server host covers, matched by the
/// SNI-DNAT cluster name and the Istio mutual TLS ALPNs, to that cluster.
fn auto_passthrough(view: &View<'_>, hosts: &[String]) -> Vec<Chain> {
    let mut out = Vec::new();
    for service in sni_dnat_services(view) {
        if !hosts.iter().any(|h| subset_of(&service.hostname, h)) {
            continue;
        }
        let subsets = subsets(view, service);
        for port in dnat_ports(service) {
            for subset in std::iter::once("").chain(subsets.iter().map(String::as_str)) {
                let name = names::istio_mutual_sni(port, subset, &service.hostname);
                out.push(Chain {
                    sni_hosts: vec![name.clone()],
                    alpn: ISTIO_MTLS_ALPNS.iter().map(|s| s.to_string()).collect(),
                    filters: vec![filters::tcp_proxy(&name, &[(name.clone(), 100)])],
                    ..Default::default()
                });
            }
        }
    }
    out
}

/// The SNI-DNAT clusters a router with an `AUTO_PASSTHROUGH` server needs: the outbound
/// clusters of every mesh service port and subset, named `outbound_.<port>_.<subset>_.<host>`,
/// without upstream TLS (the client's TLS passes through). Their metadata (the rule, and for
/// Istio's proxy the service its stats name) is kept as encoded, in key order.
pub(super) fn sni_dnat_clusters(view: &View<'_>, out: &mut Built) {
    for service in sni_dnat_services(view) {
        let mut tcp_only = service.clone();
        tcp_only.ports.retain(|p| p.protocol != Some(Protocol::Udp));
        let dr = view.destination_rules.for_service(service);
        let mut built = Vec::new();
        cluster::service_clusters(
            &tcp_only,
            dr.as_deref(),
            Generator::Envoy,
            (
                pasa_istio::node::ProxyType::Router,
                view.proxy.build,
                &view.cluster_settings,
            ),
            (true, &mut built),
        );
        for cluster::BuiltCluster {
            name,
            encoded,
            metadata_len,
            assignment,
        } in built
        {
            let (Some(name), Some(mut encoded)) = (dnat_name(&name), encoded) else {
                continue;
            };
            let metadata = encoded.split_off(encoded.len() - metadata_len);
            // Decoding what was just encoded from a message cannot fail.
            let mut c = Cluster::decode(encoded.as_slice()).unwrap_or_default();
            c.name = name.clone();
            c.alt_stat_name = names::delimited_stats(&name);
            // No upstream TLS of the router's own, auto mTLS included.
            c.transport_socket = None;
            c.transport_socket_matches.clear();
            if let Some(eds) = c.eds_cluster_config.as_mut() {
                eds.service_name = name.clone();
            }
            if let Some(la) = c.load_assignment.as_mut() {
                la.cluster_name = name.clone();
            }
            if let Some(mut a) = assignment
                .and_then(|encoded| ClusterLoadAssignment::decode(encoded.as_slice()).ok())
            {
                a.cluster_name = name.clone();
                endpoint::keep_mtls_only(&mut a);
                out.endpoints.insert(name.clone(), a);
            }
            if !metadata.is_empty() {
                out.cluster_fields.insert(name.clone(), metadata);
            }
            out.clusters.insert(name, c);
        }
    }
}

/// `outbound|<port>|<subset>|<host>` as an SNI-DNAT cluster name.
fn dnat_name(outbound: &str) -> Option<String> {
    let mut parts = outbound.splitn(4, '|');
    let (Some("outbound"), Some(port), Some(subset), Some(host)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    Some(names::istio_mutual_sni(port.parse().ok()?, subset, host))
}
