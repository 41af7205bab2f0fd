//! TLS routes: a VirtualService's `tls` rules route unterminated TLS by SNI. On a sidecar each
//! rule's match becomes a filter chain of the service's outbound listener, selected by server
//! name (and destination subnets), that proxies the connection to the rule's destinations; a
//! connection matching no rule goes to the service itself.

use envoy_types::pb::envoy::config::core::v3::CidrRange;
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch};
use envoy_types::pb::google::protobuf::UInt32Value;

use super::filters;
use super::registry::Service;
use super::{View, names};

/// The filter chains of `service`'s TLS rules on `port`, then the fallback chain; empty when its
/// VirtualService has no TLS rule for the port.
pub(super) fn sni_chains(view: &View<'_>, service: &Service, port: u32) -> Vec<FilterChain> {
    let Some(vs) = view.virtual_service_for(&service.hostname) else {
        return Vec::new();
    };
    let mut chains = Vec::new();
    for rule in &vs.spec.tls {
        let clusters = view.weighted_clusters(&rule.route, &vs.meta.namespace, port);
        if clusters.is_empty() {
            continue;
        }
        for m in &rule.matches {
            if m.port != 0 && m.port != port {
                continue;
            }
            if !m.gateways.is_empty() && !m.gateways.iter().any(|g| g == "mesh") {
                continue;
            }
            let prefix_ranges = m
                .destination_subnets
                .iter()
                .filter_map(|subnet| cidr_range(subnet))
                .collect();
            chains.push(FilterChain {
                filter_chain_match: Some(FilterChainMatch {
                    server_names: m.sni_hosts.clone(),
                    prefix_ranges,
                    transport_protocol: "tls".into(),
                    ..Default::default()
                }),
                filters: vec![filters::tcp_proxy(&clusters[0].0, &clusters)],
                ..Default::default()
            });
        }
    }
    if !chains.is_empty() {
        let own = names::outbound_cluster(port, "", &service.hostname);
        chains.push(FilterChain {
            filters: vec![filters::tcp_proxy(&own, &[(own.clone(), 100)])],
            ..Default::default()
        });
    }
    chains
}

/// `10.0.0.0/8` or a single address as a CIDR range.
fn cidr_range(text: &str) -> Option<CidrRange> {
    let (address, len) = match text.split_once('/') {
        Some((a, l)) => (a, l.parse().ok()?),
        None => (text, if text.contains(':') { 128 } else { 32 }),
    };
    Some(CidrRange {
        address_prefix: address.to_string(),
        prefix_len: Some(UInt32Value { value: len }),
    })
}
