//! Listeners, route configurations and extra clusters of a router (ingress, egress or east-west
//! gateway), from the Gateways that apply to it and the VirtualServices bound to them, as istiod
//! builds them.
//!
//! - Which Gateways apply, the port each server is listened on (a Service's target port when a
//!   Service that has the router as an endpoint exposes the server port) and how servers that
//!   share a port merge or conflict: [`merge`].
//! - HTTP, HTTP2 and GRPC servers share `http.<port>`; HTTPS servers that terminate TLS get
//!   `https.<port>.<portName>.<gateway>.<namespace>` behind a filter chain matched by their hosts
//!   as SNI. A route configuration holds one virtual host per host a bound VirtualService and a
//!   server have in common (`host:<declared port>`; later VirtualServices add their routes to an
//!   earlier one's host), or `blackhole:<port>` when none: [`http`].
//! - TCP servers (`tcp` routes), TLS servers that terminate TLS (`tcp` routes behind the TLS
//!   chain), `PASSTHROUGH` servers (`tls` routes, one chain per SNI match) and `AUTO_PASSTHROUGH`
//!   servers (SNI-DNAT chains and `outbound_.<port>_.<subset>_.<host>` clusters): [`tcp`].
//!
//! One listener per port and bind address (`0.0.0.0_<port>` or `<bind>_<port>`), with the TLS
//! inspector when a chain matches SNI or terminates TLS offering ALPN; a listener left without a
//! chain (a TCP server no route matches) is not built, as in istiod. Not covered: QUIC/HTTP3
//! listeners, PROXY protocol, the collapsing of virtual hosts with identical routes into one, and
//! Kubernetes Ingress and Gateway API resources.

mod http;
mod tcp;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{TrafficDirection, TransportSocket};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener,
};
use pasa_istio::virtual_service::VirtualService;

use super::endpoint::socket_address;
use super::filters::{self, Routes};
use super::{Built, View, hcm};
use crate::model::gateway::{self as merge, Bound, Merged};
use crate::model::registry::Config;

/// One filter chain of a gateway listener, before it is built.
#[derive(Debug, Default)]
struct Chain {
    /// SNI names matched; none (or `*`) matches any.
    sni_hosts: Vec<String>,
    /// ALPN values matched; none matches any.
    alpn: Vec<String>,
    /// TLS terminated here.
    tls: Option<TransportSocket>,
    /// The terminating TLS offers ALPN (the TLS inspector must read it).
    offers_alpn: bool,
    filters: Vec<Filter>,
}

impl Chain {
    fn build(self) -> FilterChain {
        let wildcard = self.sni_hosts.iter().any(|h| h == "*");
        let mut server_names = if wildcard { Vec::new() } else { self.sni_hosts };
        server_names.sort();
        let filter_chain_match =
            (!server_names.is_empty() || !self.alpn.is_empty()).then(|| FilterChainMatch {
                server_names,
                application_protocols: self.alpn,
                ..Default::default()
            });
        FilterChain {
            filter_chain_match,
            filters: self.filters,
            transport_socket: self.tls,
            transport_socket_connect_timeout: filters::transport_socket_connect_timeout(),
            ..Default::default()
        }
    }
}

/// The VirtualServices bound to `gateway` (`namespace/name`) and visible to the router, oldest
/// first.
fn bound_virtual_services<'v>(
    view: &'v View<'_>,
    gateway: &str,
) -> Vec<&'v Arc<Config<VirtualService>>> {
    let mut list: Vec<&Arc<Config<VirtualService>>> = view
        .registry
        .virtual_services()
        .filter(|vs| {
            pasa_istio::visibility::exported_to(
                &vs.spec.export_to,
                &vs.meta.namespace,
                &view.proxy.config_namespace,
            )
        })
        .filter(|vs| {
            vs.spec.gateways.iter().any(|g| {
                pasa_istio::gateway::resolve_gateway_name(g, &vs.meta.namespace) == gateway
            })
        })
        .collect();
    list.sort_by(|a, b| a.meta.age_key().cmp(&b.meta.age_key()));
    list
}

/// A listener being assembled from the servers of one or more merged ports.
struct Pending {
    bind: String,
    port: u32,
    chains: Vec<Chain>,
}

/// Listeners, route configurations and SNI-DNAT clusters of a router.
pub(super) fn listeners_and_routes(view: &View<'_>, out: &mut Built) {
    let authz = super::authz::ProxyAuthz::of(view);
    let options = view.hcm(hcm::Class::Gateway);
    let applying = merge::applying(view.proxy, view.registry);
    let merged = merge::merge(&applying);
    let mut pending: BTreeMap<String, Pending> = BTreeMap::new();
    // Per listener port, the SNI names passthrough chains already match, with their bind.
    let mut sni_known: HashMap<u32, HashMap<String, String>> = HashMap::new();
    for sp in &merged.ports {
        let Some(servers) = merged.servers.get(sp) else {
            continue;
        };
        let bind = if sp.bind.is_empty() {
            "0.0.0.0".to_string()
        } else {
            sp.bind.clone()
        };
        let name = super::names::listener(&bind, sp.number);
        let chains = if sp.is_http() {
            vec![http_chain(
                &name,
                &servers.route_name,
                None,
                Vec::new(),
                &authz,
                options,
            )]
        } else {
            servers
                .servers
                .iter()
                .flat_map(|&i| {
                    let bound = &merged.bound[i];
                    if bound.terminates_https() {
                        vec![http_chain(
                            &name,
                            &bound.route_name,
                            http::server_tls(&bound.server, false),
                            bound.sni_hosts(),
                            &authz,
                            options,
                        )]
                    } else {
                        tcp::chains(view, bound, sni_known.entry(sp.number).or_default())
                            .into_iter()
                            .map(|mut chain| {
                                chain.filters = authz.tcp_chain(std::mem::take(&mut chain.filters));
                                chain
                            })
                            .collect()
                    }
                })
                .collect()
        };
        pending
            .entry(name)
            .or_insert_with(|| Pending {
                bind,
                port: sp.number,
                chains: Vec::new(),
            })
            .chains
            .extend(chains);
    }
    for (name, p) in pending {
        if p.chains.is_empty() {
            tracing::debug!(listener = %name, "no filter chain: listener not built");
            continue;
        }
        let inspect_tls = p
            .chains
            .iter()
            .any(|c| !c.sni_hosts.is_empty() || c.offers_alpn);
        out.listeners.insert(
            name.clone(),
            Listener {
                name: name.clone(),
                address: Some(socket_address(&p.bind, p.port)),
                // A PROXY protocol header goes first, before anything inspects the stream.
                listener_filters: options
                    .proxy_protocol
                    .then(filters::proxy_protocol)
                    .into_iter()
                    .chain(filters::inspectors(inspect_tls, false))
                    .collect(),
                filter_chains: filters::distinct_chains(
                    &name,
                    p.chains.into_iter().map(Chain::build).collect(),
                ),
                traffic_direction: TrafficDirection::Outbound as i32,
                max_connections_to_accept_per_socket_event: filters::accept_one_per_event(),
                ..Default::default()
            },
        );
    }
    route_configs(view, &merged, out);
    if merged.auto_passthrough {
        tcp::sni_dnat_clusters(view, out);
    }
}

/// An HTTP connection manager chain of `listener` on RDS `route_name`, terminating TLS when
/// `tls` is set; its stats go by `outbound_<listener>`, as istiod names them.
///
/// As istiod sets up a gateway's connection manager: the gateway is the edge, so the client's
/// address is the peer's (`use_remote_address`, with the trusted X-Forwarded-For hops of the
/// gateway topology, none by default), and by default the X-Forwarded-Client-Cert header a client
/// sent is replaced by the details of its own certificate (SANITIZE_SET with subject,
/// certificate, URI and DNS SANs) when it presented one (see [`hcm::Options`]).
fn http_chain(
    listener: &str,
    route_name: &str,
    tls: Option<TransportSocket>,
    sni_hosts: Vec<String>,
    authz: &super::authz::ProxyAuthz,
    options: &hcm::Options,
) -> Chain {
    let mut hcm = filters::http_connection_manager(
        &format!("outbound_{listener}"),
        Routes::Rds(route_name.to_string()),
    );
    // Authorization first, as on a sidecar's inbound side.
    hcm.http_filters.splice(0..0, authz.http.iter().cloned());
    options.apply(&mut hcm);
    Chain {
        sni_hosts,
        offers_alpn: tls.is_some(),
        tls,
        filters: vec![filters::hcm_filter(hcm)],
        ..Default::default()
    }
}

/// Every HTTP route configuration of the merged servers.
fn route_configs(view: &View<'_>, merged: &Merged<'_>, out: &mut Built) {
    for (name, servers) in &merged.by_route {
        let servers: Vec<&Bound<'_>> = servers.iter().map(|&i| &merged.bound[i]).collect();
        out.routes
            .insert(name.clone(), http::route_config(view, name, &servers));
    }
}

#[cfg(test)]
mod tests;
