//! Listeners and route configurations of an Envoy sidecar.
//!
//! Outbound ([`outbound`]): listeners per service port as istiod builds them (`0.0.0.0_<port>`
//! shared by HTTP, `<vip>_<port>` for TCP and sniffed ports, per endpoint for headless services),
//! route configurations per port ([`routes`]), and `virtualOutbound` (15001), which refuses
//! traffic sent to its own port and hands the rest to the outbound traffic policy.
//! Inbound ([`inbound`]): `virtualInbound` (15006) with filter chains per port of the workload's
//! services (or of the Sidecar's ingress listeners), shaped by the PeerAuthentication mTLS mode of
//! the port, and passthrough chains for the rest.

mod inbound;
mod outbound;
mod routes;

use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener,
};
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, Route, RouteConfiguration, VirtualHost,
};
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};

use super::cluster;
use super::endpoint::socket_address;
use super::filters::{self, Routes};
use super::route;
use super::{Built, View, hcm, names};
use crate::mesh::OutboundPolicy;
pub(super) use routes::{Reuse, route_config};

pub(super) use inbound::inbound;

/// The ALPN values the HTTP inspector reports for plaintext HTTP/1.1 and HTTP/2.
const PLAINTEXT_HTTP_ALPNS: [&str; 2] = ["http/1.1", "h2c"];

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

/// Where unmatched outbound TCP goes under `policy`.
fn catch_all_cluster(policy: OutboundPolicy) -> &'static str {
    if policy.allows_any() {
        names::PASSTHROUGH_CLUSTER
    } else {
        names::BLACK_HOLE_CLUSTER
    }
}

/// The TCP proxy unmatched outbound traffic ends in.
fn catch_all_tcp(policy: OutboundPolicy) -> Filter {
    let cluster = catch_all_cluster(policy);
    filters::tcp_proxy(cluster, &[(cluster.to_string(), 100)])
}

/// Outbound listeners and `virtualOutbound`; the names of the route configurations they ask
/// for go to `out.route_names` (built on their own by [`route_config`]).
pub(super) fn outbound(view: &View<'_>, out: &mut Built) {
    let route_names = outbound::listeners(view, out);
    out.route_names.extend(route_names);
    if view.proxy.learned.is_some() {
        // `virtualOutbound`'s HTTP chain of an on-demand proxy: only the catch-all, for hosts
        // nothing else matches (see `translate::lazy`). Ports are in its hosts' domains.
        let options = view.hcm(hcm::Class::SidecarOutbound);
        let config = catch_all_config(
            names::ON_DEMAND_ROUTE,
            view.scope.outbound_policy,
            options,
            false,
        );
        out.routes.insert(config.name.clone(), config);
    }
    out.listeners.insert(
        names::VIRTUAL_OUTBOUND.into(),
        virtual_outbound(
            view.scope.outbound_policy,
            view.hcm(hcm::Class::SidecarOutbound),
            view.proxy.learned.is_some(),
        ),
    );
}

/// The catch-all virtual host of an outbound route configuration.
fn catch_all(policy: OutboundPolicy, options: &hcm::Options) -> VirtualHost {
    let (name, action) = match policy {
        OutboundPolicy::AllowAny => (
            names::ALLOW_ANY,
            passthrough_action(names::PASSTHROUGH_CLUSTER, options),
        ),
        OutboundPolicy::AllowAnyDynamicDns => (
            names::ALLOW_ANY_DYNAMIC_DNS,
            passthrough_action(names::ALLOW_ANY_DYNAMIC_DNS_CLUSTER, options),
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
    route::virtual_host(
        name.into(),
        vec!["*".into()],
        vec![route],
        options.attempt_count,
    )
}

/// A route configuration `name` holding only the catch-all of `policy`.
fn catch_all_config(
    name: &str,
    policy: OutboundPolicy,
    options: &hcm::Options,
    ignore_port_in_host_matching: bool,
) -> RouteConfiguration {
    RouteConfiguration {
        name: name.into(),
        virtual_hosts: vec![catch_all(policy, options)],
        validate_clusters: Some(BoolValue { value: false }),
        ignore_port_in_host_matching,
        max_direct_response_body_size_bytes: route::max_direct_response_body(),
        ..Default::default()
    }
}

/// Everything to `cluster`, without timeout or retries.
fn passthrough_action(cluster: &str, options: &hcm::Options) -> Action {
    let mut action = route::default_route(cluster)
        .action
        .unwrap_or_else(|| Action::DirectResponse(DirectResponseAction::default()));
    if let Action::Route(ra) = &mut action {
        ra.retry_policy = None;
        ra.append_x_forwarded_host = options.x_forwarded_host;
    }
    action
}

/// `virtualOutbound`: traffic sent to 15001 itself is refused (it would loop); plaintext HTTP
/// goes to the route configuration served on demand for an `on_demand` proxy (which has no
/// listener yet for the ports it has not learned; see `translate::lazy`), else to the dynamic
/// forward proxy under `ALLOW_ANY_DYNAMIC_DNS`; the rest where the outbound traffic policy
/// says.
fn virtual_outbound(policy: OutboundPolicy, options: &hcm::Options, on_demand: bool) -> Listener {
    let black_hole = names::BLACK_HOLE_CLUSTER;
    let mut chains = vec![FilterChain {
        name: names::VIRTUAL_OUTBOUND_BLACKHOLE.into(),
        filter_chain_match: Some(FilterChainMatch {
            destination_port: Some(UInt32Value {
                value: names::VIRTUAL_OUTBOUND_PORT,
            }),
            ..Default::default()
        }),
        filters: vec![filters::tcp_proxy(
            black_hole,
            &[(black_hole.to_string(), 100)],
        )],
        ..Default::default()
    }];
    let dynamic_dns = policy == OutboundPolicy::AllowAnyDynamicDns;
    if dynamic_dns || on_demand {
        let mut hcm = if on_demand {
            filters::http_connection_manager(
                "outbound_virtualOutbound_on_demand",
                Routes::Rds(names::ON_DEMAND_ROUTE.into()),
            )
        } else {
            filters::http_connection_manager(
                "outbound_virtualOutbound_allow_any_dynamic_dns",
                Routes::Inline(Box::new(catch_all_config(
                    names::ALLOW_ANY_DYNAMIC_DNS,
                    policy,
                    options,
                    true,
                ))),
            )
        };
        options.apply(&mut hcm);
        chains.push(FilterChain {
            name: format!("{}-http", names::VIRTUAL_OUTBOUND_CATCH_ALL_TCP),
            filter_chain_match: Some(FilterChainMatch {
                application_protocols: PLAINTEXT_HTTP_ALPNS.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }),
            filters: vec![filters::hcm_filter(hcm)],
            ..Default::default()
        });
    }
    chains.push(FilterChain {
        name: names::VIRTUAL_OUTBOUND_CATCH_ALL_TCP.into(),
        filters: vec![catch_all_tcp(policy)],
        ..Default::default()
    });
    Listener {
        name: names::VIRTUAL_OUTBOUND.into(),
        address: Some(socket_address("0.0.0.0", names::VIRTUAL_OUTBOUND_PORT)),
        use_original_dst: Some(BoolValue { value: true }),
        filter_chains: chains,
        listener_filters: filters::inspectors(false, dynamic_dns || on_demand),
        traffic_direction: TrafficDirection::Outbound as i32,
        max_connections_to_accept_per_socket_event: filters::accept_one_per_event(),
        ..Default::default()
    }
}

/// The special clusters every sidecar has, and the dynamic forward proxy cluster when the
/// outbound traffic policy uses it.
pub(super) fn special_clusters(
    policy: OutboundPolicy,
    settings: &cluster::ClusterSettings,
    out: &mut Built,
) {
    for c in [cluster::passthrough(settings), cluster::black_hole()] {
        out.clusters.insert(c.name.clone(), c);
    }
    if policy == OutboundPolicy::AllowAnyDynamicDns {
        let c = cluster::allow_any_dynamic_dns();
        out.clusters.insert(c.name.clone(), c);
    }
}
