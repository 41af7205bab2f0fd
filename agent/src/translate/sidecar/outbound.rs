//! Outbound listeners of a sidecar, built as istiod builds them.
//!
//! Every port of every visible service (oldest service first) asks for a listener keyed by bind
//! address and port: HTTP ports share `0.0.0.0_<port>`, TCP and protocol-sniffed ports bind to the
//! service's virtual IP (`<vip>_<port>`), or share the wildcard listener with a destination
//! prefix match when the service is known by a CIDR, or bind to each endpoint address when the
//! service is headless. A second request for an existing key merges into it: HTTP and TCP on one
//! listener turn it into a sniffed one (an HTTP chain matched by the ALPN the HTTP inspector
//! detects, beside the TCP chains), TCP chains with distinct matches add up, an identical match
//! is dropped (the older service keeps it). Every listener ends in a fall-through chain to
//! `PassthroughCluster` (or `BlackHoleCluster` under `REGISTRY_ONLY`) unless one of its own
//! chains matches everything.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{CidrRange, Metadata, TrafficDirection};
use envoy_types::pb::envoy::config::listener::v3::{
    AdditionalAddress, Filter, FilterChain, FilterChainMatch, Listener,
};
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};
use pasa_istio::common::Protocol;
use pasa_istio::virtual_service::TcpRoute;

use super::super::endpoint::socket_address;
use super::super::filters::{self, Routes};
use super::super::{Built, View, hcm, metadata, names};
use super::{PLAINTEXT_HTTP_ALPNS, Prefix, catch_all_tcp, parse_cidr};
use crate::model::registry::{Config, Resolution, Service, ServicePort};
use pasa_istio::virtual_service::VirtualService;

/// How a listener treats the traffic of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListenerProtocol {
    Http,
    Tcp,
    /// Unknown: sniffed, HTTP and TCP chains side by side.
    Auto,
}

fn listener_protocol(protocol: Option<Protocol>) -> Option<ListenerProtocol> {
    match protocol {
        None => Some(ListenerProtocol::Auto),
        Some(Protocol::Udp) => None,
        Some(p) if p.is_http() => Some(ListenerProtocol::Http),
        Some(_) => Some(ListenerProtocol::Tcp),
    }
}

/// What a filter chain does once matched.
#[derive(Debug, Clone)]
enum ChainAction {
    /// A TCP proxy (or another network filter).
    Network(Box<Filter>),
    /// An HTTP connection manager taking the route configuration of that name over RDS.
    Http { rds: String },
}

/// One filter chain of an outbound listener, before it becomes Envoy configuration.
#[derive(Debug, Clone)]
struct ChainOpts {
    sni_hosts: Vec<String>,
    cidrs: Vec<String>,
    alpn: Vec<String>,
    transport: String,
    action: ChainAction,
    /// The VirtualService a TCP or TLS route came from (its `istio` config metadata).
    metadata: Option<Metadata>,
}

impl ChainOpts {
    fn network(filter: Filter, cidrs: &[String], sni_hosts: Vec<String>) -> ChainOpts {
        ChainOpts {
            sni_hosts,
            cidrs: cidrs.to_vec(),
            alpn: Vec::new(),
            transport: String::new(),
            action: ChainAction::Network(Box::new(filter)),
            metadata: None,
        }
    }

    /// Marked as routed by `vs`, as istiod marks such chains.
    fn from(mut self, vs: &Config<VirtualService>) -> ChainOpts {
        self.metadata = Some(metadata::config_metadata(
            pasa_proto::Kind::VirtualService,
            &vs.meta,
        ));
        self
    }

    fn is_match_all(&self) -> bool {
        (self.sni_hosts.is_empty() || self.sni_hosts.iter().any(|s| s == "*"))
            && self.alpn.is_empty()
            && self.transport.is_empty()
            && self.cidrs.is_empty()
    }

    /// Whether both chains match exactly the same traffic (Envoy would reject the pair).
    fn conflicts_with(&self, other: &ChainOpts) -> bool {
        if self.transport != other.transport || self.alpn != other.alpn {
            return false;
        }
        let sni = |hosts: &[String]| -> BTreeSet<String> {
            hosts.iter().filter(|h| *h != "*").cloned().collect()
        };
        let cidrs = |list: &[String]| -> BTreeSet<Prefix> {
            list.iter()
                .filter_map(|c| prefix_of(c))
                .filter(|(ip, _)| !ip.is_unspecified())
                .collect()
        };
        sni(&self.sni_hosts) == sni(&other.sni_hosts) && cidrs(&self.cidrs) == cidrs(&other.cidrs)
    }

    fn filter_chain_match(&self) -> Option<FilterChainMatch> {
        if self.is_match_all() {
            return None;
        }
        let mut m = FilterChainMatch {
            application_protocols: self.alpn.clone(),
            transport_protocol: self.transport.clone(),
            ..Default::default()
        };
        if !self.sni_hosts.iter().any(|s| s == "*") {
            let mut hosts = self.sni_hosts.clone();
            hosts.sort();
            m.server_names = hosts;
        }
        let mut cidrs = self.cidrs.clone();
        cidrs.sort();
        for c in &cidrs {
            if let Some((ip, len)) = prefix_of(c)
                && !ip.is_unspecified()
            {
                m.prefix_ranges.push(CidrRange {
                    address_prefix: ip.to_string(),
                    prefix_len: Some(UInt32Value { value: len }),
                });
            }
        }
        Some(m)
    }
}

/// An address or CIDR as a prefix (`1.2.3.4` is `1.2.3.4/32`).
fn prefix_of(text: &str) -> Option<Prefix> {
    if text.contains('/') {
        return parse_cidr(text);
    }
    let ip: IpAddr = text.parse().ok()?;
    Some((ip, if ip.is_ipv4() { 32 } else { 128 }))
}

/// One listener being built.
#[derive(Debug)]
struct Entry {
    port: u32,
    /// Primary bind address first.
    binds: Vec<String>,
    chains: Vec<ChainOpts>,
    /// The protocol the listener serves; `None` once it sniffs.
    protocol: Option<Protocol>,
}

/// How a service's port reaches a listener.
struct ListenerRequest<'s> {
    service: &'s Service,
    port: &'s ServicePort,
    binds: Vec<String>,
    cidrs: Vec<String>,
}

/// Builds the outbound listeners into `out` and returns the route configurations they name:
/// per port (`"80"`), and per sniffed service port bound to its address (`"host:81"`).
pub(super) fn listeners(view: &View<'_>, out: &mut Built) -> BTreeSet<String> {
    let mut builder = Builder {
        view,
        wildcards: wildcards(&view.proxy.ips),
        entries: BTreeMap::new(),
        routes: BTreeSet::new(),
    };
    let mut services: Vec<&Arc<Service>> = view.services.values().collect();
    services.sort_by(|a, b| (a.created, &a.hostname).cmp(&(b.created, &b.hostname)));
    for service in services {
        for port in &service.ports {
            builder.service_port(service, port);
        }
    }
    let Builder {
        entries, routes, ..
    } = builder;
    let fallthrough = catch_all_tcp(view.scope.outbound_policy);
    let detection_timeout = view.protocol_detection_timeout();
    for entry in entries.into_values() {
        let listener = finish(
            entry,
            &fallthrough,
            view.hcm(hcm::Class::SidecarOutbound),
            detection_timeout,
        );
        out.listeners.insert(listener.name.clone(), listener);
    }
    routes
}

/// The wildcard addresses of a proxy: IPv4, IPv6 or both, the proxy's first family first.
fn wildcards(ips: &[IpAddr]) -> Vec<String> {
    let v4 = ips.iter().any(IpAddr::is_ipv4);
    let v6 = ips.iter().any(IpAddr::is_ipv6);
    match (v4, v6) {
        (false, true) => vec!["::".into()],
        (true, true) => vec!["0.0.0.0".into(), "::".into()],
        _ => vec!["0.0.0.0".into()],
    }
}

struct Builder<'v, 'a> {
    view: &'v View<'a>,
    wildcards: Vec<String>,
    entries: BTreeMap<(String, u32), Entry>,
    routes: BTreeSet<String>,
}

impl Builder<'_, '_> {
    fn wildcard(&self) -> &str {
        &self.wildcards[0]
    }

    /// The addresses of `service` this proxy can use, its primary first; `0.0.0.0` (or `::`)
    /// when it has none.
    fn addresses(&self, service: &Service) -> Vec<String> {
        let proxy_v4 = self.view.proxy.ips.iter().any(IpAddr::is_ipv4);
        let proxy_v6 = self.view.proxy.ips.iter().any(IpAddr::is_ipv6);
        let usable: Vec<String> = service
            .addresses
            .iter()
            .filter(|a| match prefix_of(a) {
                Some((IpAddr::V4(_), _)) => proxy_v4,
                Some((IpAddr::V6(_), _)) => proxy_v6,
                None => false,
            })
            .cloned()
            .collect();
        if !usable.is_empty() {
            return usable;
        }
        if let Some(first) = service.addresses.first() {
            return vec![first.clone()];
        }
        if let Some(auto) = self.view.auto_address(service)
            && proxy_v4
        {
            return vec![auto.to_string()];
        }
        let dual = proxy_v4 && proxy_v6;
        if !service.kubernetes && proxy_v6 && !proxy_v4 {
            vec!["::".into()]
        } else if !service.kubernetes && dual {
            vec!["0.0.0.0".into(), "::".into()]
        } else {
            vec!["0.0.0.0".into()]
        }
    }

    fn service_port(&mut self, service: &Service, port: &ServicePort) {
        if service.external_name.is_some() && service.kubernetes {
            // An alias: its names are served by the concrete service's listeners.
            return;
        }
        let Some(lp) = listener_protocol(port.protocol) else {
            return;
        };
        let primary_unspecified =
            service.addresses.is_empty() && self.view.auto_address(service).is_none();
        if service.resolution == Resolution::Passthrough
            && primary_unspecified
            && lp != ListenerProtocol::Http
        {
            let instances: Vec<_> = service
                .endpoints
                .iter()
                .filter(|e| e.ports.contains_key(&port.number))
                .collect();
            if !service.kubernetes && instances.is_empty() {
                self.build(ListenerRequest {
                    service,
                    port,
                    binds: Vec::new(),
                    cidrs: Vec::new(),
                });
                return;
            }
            let own = self.view.proxy.ips.first().map(IpAddr::to_string);
            for instance in instances {
                if instance.address.parse::<IpAddr>().is_err()
                    || Some(&instance.address) == own.as_ref()
                {
                    continue;
                }
                self.build(ListenerRequest {
                    service,
                    port,
                    binds: vec![instance.address.clone()],
                    cidrs: Vec::new(),
                });
            }
            return;
        }
        self.build(ListenerRequest {
            service,
            port,
            binds: Vec::new(),
            cidrs: Vec::new(),
        });
    }

    fn build(&mut self, mut req: ListenerRequest<'_>) {
        let Some(lp) = listener_protocol(req.port.protocol) else {
            return;
        };
        match lp {
            ListenerProtocol::Tcp | ListenerProtocol::Auto => {
                if req.binds.is_empty() {
                    let addresses = self.addresses(req.service);
                    if !req.service.kubernetes
                        && !req.service.addresses.is_empty()
                        && addresses.len() > 1
                    {
                        // istiod makes a service of each address of a ServiceEntry: one
                        // listener (or CIDR chain) per address, never one listener with the
                        // others as additional addresses, which Envoy refuses when another
                        // ServiceEntry has a listener on one of them.
                        for address in addresses {
                            let (binds, cidrs) = if address.contains('/') {
                                (self.wildcards.clone(), vec![address])
                            } else {
                                (vec![address], Vec::new())
                            };
                            self.build(ListenerRequest {
                                service: req.service,
                                port: req.port,
                                binds,
                                cidrs,
                            });
                        }
                        return;
                    }
                    if addresses[0].contains('/') {
                        req.binds = self.wildcards.clone();
                        req.cidrs = addresses;
                    } else {
                        req.binds = addresses;
                    }
                }
            }
            ListenerProtocol::Http => {
                if req.binds.is_empty() {
                    req.binds = self.wildcards.clone();
                }
            }
        }
        let key = (req.binds[0].clone(), req.port.number);
        let current = self.entries.get(&key).map(|e| e.protocol);
        let mut protocol = req.port.protocol;
        #[derive(PartialEq)]
        enum Merge {
            New,
            Upgrade,
            Add,
        }
        let (chains, merge) = match lp {
            ListenerProtocol::Http => {
                let merge = match current {
                    None => Merge::New,
                    Some(p) if p.is_some_and(Protocol::is_tcp) => Merge::Upgrade,
                    Some(_) => return,
                };
                let mut chain = self.http_chain(&req, lp);
                if req.binds[0] == self.wildcard() {
                    chain.alpn = PLAINTEXT_HTTP_ALPNS.iter().map(|s| s.to_string()).collect();
                    chain.transport = "raw_buffer".into();
                    protocol = None;
                }
                (vec![chain], merge)
            }
            ListenerProtocol::Tcp => {
                let merge = match current {
                    None => Merge::New,
                    Some(p) if p.is_some_and(Protocol::is_http) => Merge::Upgrade,
                    Some(_) => Merge::Add,
                };
                (self.tcp_chains(&req), merge)
            }
            ListenerProtocol::Auto => match current {
                Some(p) if p.is_some_and(Protocol::is_http) => {
                    (self.sniffed_chains(&req, lp), Merge::New)
                }
                Some(p) if p.is_some_and(Protocol::is_tcp) => {
                    (self.sniffed_chains(&req, lp), Merge::Upgrade)
                }
                Some(_) => (self.tcp_chains(&req), Merge::Add),
                None => (self.sniffed_chains(&req, lp), Merge::New),
            },
        };
        if let Some(existing) = current
            && merge != Merge::New
            && well_known_conflict(req.port.protocol, existing)
        {
            tracing::debug!(
                port = req.port.number,
                "protocol conflict on a well-known port"
            );
            return;
        }
        for chain in &chains {
            if let ChainAction::Http { rds } = &chain.action {
                self.routes.insert(rds.clone());
            }
        }
        match (merge, self.entries.get_mut(&key)) {
            (Merge::New, _) | (_, None) => {
                self.entries.insert(
                    key,
                    Entry {
                        port: req.port.number,
                        binds: req.binds,
                        chains,
                        protocol,
                    },
                );
            }
            (Merge::Upgrade, Some(entry)) => {
                merge_chains(entry, chains);
                entry.protocol = None;
            }
            (Merge::Add, Some(entry)) => merge_chains(entry, chains),
        }
    }

    /// A TCP chain set followed by the HTTP chain the HTTP inspector selects.
    fn sniffed_chains(&self, req: &ListenerRequest<'_>, lp: ListenerProtocol) -> Vec<ChainOpts> {
        let mut chains = self.tcp_chains(req);
        let mut http = self.http_chain(req, lp);
        http.alpn = PLAINTEXT_HTTP_ALPNS.iter().map(|s| s.to_string()).collect();
        http.transport = "raw_buffer".into();
        chains.push(http);
        chains
    }

    fn http_chain(&self, req: &ListenerRequest<'_>, lp: ListenerProtocol) -> ChainOpts {
        let rds = if lp == ListenerProtocol::Auto && req.binds[0] != self.wildcard() {
            names::host_port(&req.service.hostname, req.port.number)
        } else {
            req.port.number.to_string()
        };
        ChainOpts {
            sni_hosts: Vec::new(),
            cidrs: Vec::new(),
            alpn: Vec::new(),
            transport: String::new(),
            action: ChainAction::Http { rds },
            metadata: None,
        }
    }

    /// The VirtualServices whose hosts cover the service, oldest first.
    fn virtual_services_for(&self, service: &Service) -> Vec<&Arc<Config<VirtualService>>> {
        self.view
            .virtual_services
            .iter()
            .filter(|vs| {
                vs.spec.hosts.iter().any(|h| {
                    let host = self.view.proxy.resolve_host(h, &vs.meta.namespace);
                    pasa_istio::host::matches(&host, &service.hostname)
                })
            })
            .collect()
    }

    /// The chains of a TCP (or TLS) port: VirtualService TLS or TCP rules, else the service's
    /// own cluster.
    fn tcp_chains(&self, req: &ListenerRequest<'_>) -> Vec<ChainOpts> {
        let vss = self.virtual_services_for(req.service);
        let listen = req.port.number;
        let service = req.service;
        let default_cluster = || {
            let port = match service.ports.as_slice() {
                [only] => only.number,
                _ => listen,
            };
            let cluster = names::outbound_cluster(port, "", &service.hostname);
            filters::tcp_proxy(&cluster, &[(cluster.clone(), 100)])
        };
        let mut out = Vec::new();
        if req.port.protocol.is_some_and(Protocol::is_tls) {
            let mut handled = BTreeSet::new();
            for vs in &vss {
                for rule in &vs.spec.tls {
                    if rule.route.is_empty() {
                        continue;
                    }
                    for m in rule.matches.iter().filter(|m| self.l4_applies(*m, listen)) {
                        let cidrs = if m.destination_subnets.is_empty() {
                            req.cidrs.clone()
                        } else {
                            m.destination_subnets.clone()
                        };
                        let key = format!(
                            "{}|{}",
                            m.sni_hosts.join(","),
                            m.destination_subnets.join(",")
                        );
                        if handled.insert(key) {
                            out.push(
                                ChainOpts::network(
                                    self.route_filter(&rule.route, vs, listen),
                                    &cidrs,
                                    m.sni_hosts.clone(),
                                )
                                .from(vs),
                            );
                        }
                    }
                }
            }
            if out.is_empty() {
                let address = self.addresses(service).remove(0);
                let address = if address.contains('/') {
                    String::new()
                } else {
                    address
                };
                let wildcard_bound = address == self.wildcard() && req.binds[0] == self.wildcard();
                let needs_sni = !req.cidrs.is_empty()
                    || address.is_empty()
                    || wildcard_bound
                    || (service.hostname.starts_with('*')
                        && service.resolution == Resolution::DynamicDns);
                let sni = if needs_sni {
                    let mut hosts = vec![service.hostname.clone()];
                    for alias in self.view.aliases_of(&service.hostname) {
                        hosts.extend(super::super::route::alt_hosts(
                            alias,
                            &self.view.proxy.dns_domain,
                        ));
                        hosts.push(alias.to_string());
                    }
                    hosts
                } else {
                    Vec::new()
                };
                out.push(ChainOpts::network(default_cluster(), &req.cidrs, sni));
            }
            return out;
        }
        for vs in &vss {
            for rule in &vs.spec.tcp {
                if rule.route.is_empty() {
                    continue;
                }
                // A rule without matches, or a match that applies here for every subnet, takes
                // the whole listener; the others take the subnets their matches name.
                let applying: Vec<_> = rule
                    .matches
                    .iter()
                    .filter(|m| self.l4_applies(*m, listen))
                    .collect();
                if rule.matches.is_empty()
                    || applying.iter().any(|m| m.destination_subnets.is_empty())
                {
                    out.push(
                        ChainOpts::network(
                            self.tcp_route_filter(rule, vs, listen),
                            &req.cidrs,
                            Vec::new(),
                        )
                        .from(vs),
                    );
                    return out;
                }
                let subnets: Vec<String> = applying
                    .iter()
                    .flat_map(|m| m.destination_subnets.iter().cloned())
                    .collect();
                if !subnets.is_empty() {
                    out.push(
                        ChainOpts::network(
                            self.tcp_route_filter(rule, vs, listen),
                            &subnets,
                            Vec::new(),
                        )
                        .from(vs),
                    );
                    let mut a = subnets.clone();
                    a.sort();
                    let mut b = req.cidrs.clone();
                    b.sort();
                    if a == b {
                        return out;
                    }
                }
            }
        }
        out.push(ChainOpts::network(
            default_cluster(),
            &req.cidrs,
            Vec::new(),
        ));
        out
    }

    fn tcp_route_filter(&self, rule: &TcpRoute, vs: &Config<VirtualService>, port: u32) -> Filter {
        self.route_filter(&rule.route, vs, port)
    }

    fn route_filter(
        &self,
        routes: &[pasa_istio::virtual_service::RouteDestination],
        vs: &Config<VirtualService>,
        port: u32,
    ) -> Filter {
        filters::tcp_route(self.view, routes, &vs.meta, port)
    }

    /// Whether a TLS or TCP match applies to this sidecar on `port`.
    fn l4_applies(&self, m: &impl L4Conditions, port: u32) -> bool {
        let (gateways, source_labels, match_port, source_namespace) = m.conditions();
        let proxy = self.view.proxy;
        (gateways.is_empty() || gateways.iter().any(|g| g == "mesh"))
            && pasa_istio::label_selector::selects(source_labels, &proxy.labels)
            && (match_port == 0 || match_port == port)
            && (source_namespace.is_empty() || source_namespace == proxy.namespace)
    }
}

/// The conditions TLS and TCP matches share: gateways, source labels, port, source namespace.
trait L4Conditions {
    fn conditions(
        &self,
    ) -> (
        &[String],
        &std::collections::BTreeMap<String, String>,
        u32,
        &str,
    );
}

impl L4Conditions for pasa_istio::virtual_service::TlsMatchAttributes {
    fn conditions(
        &self,
    ) -> (
        &[String],
        &std::collections::BTreeMap<String, String>,
        u32,
        &str,
    ) {
        (
            &self.gateways,
            &self.source_labels,
            self.port,
            &self.source_namespace,
        )
    }
}

impl L4Conditions for pasa_istio::virtual_service::L4MatchAttributes {
    fn conditions(
        &self,
    ) -> (
        &[String],
        &std::collections::BTreeMap<String, String>,
        u32,
        &str,
    ) {
        (
            &self.gateways,
            &self.source_labels,
            self.port,
            &self.source_namespace,
        )
    }
}

/// Mongo and MySQL share a port with nothing else (the inspectors would break them).
fn well_known_conflict(incoming: Option<Protocol>, existing: Option<Protocol>) -> bool {
    let special = |p: Option<Protocol>| matches!(p, Some(Protocol::Mongo | Protocol::MySql));
    (special(incoming) || special(existing)) && incoming != existing
}

/// Adds the chains that match traffic no existing chain matches.
fn merge_chains(entry: &mut Entry, incoming: Vec<ChainOpts>) {
    for chain in incoming {
        if entry.chains.iter().any(|c| c.conflicts_with(&chain)) {
            tracing::debug!(
                port = entry.port,
                "outbound filter chain conflicts with an older service's; dropped"
            );
            continue;
        }
        entry.chains.push(chain);
    }
}

/// The Envoy listener of an entry: its chains (a match-all chain as the default chain), the
/// fall-through chain when none matches everything, and the inspectors the matches need.
fn finish(
    entry: Entry,
    fallthrough: &Filter,
    options: &hcm::Options,
    detection_timeout: envoy_types::pb::google::protobuf::Duration,
) -> Listener {
    let primary = &entry.binds[0];
    let name = names::listener(primary, entry.port);
    let needs_tls = entry.chains.iter().any(|c| !c.sni_hosts.is_empty());
    let needs_http = entry.chains.iter().any(|c| !c.alpn.is_empty());
    let mut listener = Listener {
        name: name.clone(),
        address: Some(socket_address(primary, entry.port)),
        additional_addresses: entry.binds[1..]
            .iter()
            .map(|b| AdditionalAddress {
                address: Some(socket_address(b, entry.port)),
                ..Default::default()
            })
            .collect(),
        traffic_direction: TrafficDirection::Outbound as i32,
        bind_to_port: Some(BoolValue { value: false }),
        continue_on_listener_filters_timeout: true,
        listener_filters: filters::inspectors(needs_tls, needs_http),
        // Only protocol sniffing may wait, for as long as the mesh config says.
        listener_filters_timeout: Some(if needs_http {
            detection_timeout
        } else {
            Default::default()
        }),
        ..Default::default()
    };
    let stat_prefix = format!("outbound_{name}");
    for opts in entry.chains {
        let filter = match &opts.action {
            ChainAction::Network(f) => f.as_ref().clone(),
            ChainAction::Http { rds } => {
                let mut hcm =
                    filters::http_connection_manager(&stat_prefix, Routes::Rds(rds.clone()));
                options.apply(&mut hcm);
                filters::hcm_filter(hcm)
            }
        };
        let mut chain = FilterChain {
            filters: vec![filter],
            metadata: opts.metadata.clone(),
            transport_socket_connect_timeout: filters::transport_socket_connect_timeout(),
            ..Default::default()
        };
        match opts.filter_chain_match() {
            None => listener.default_filter_chain = Some(chain),
            Some(m) => {
                chain.filter_chain_match = Some(m);
                listener.filter_chains.push(chain);
            }
        }
    }
    if listener.filter_chains.is_empty() {
        listener
            .filter_chains
            .extend(listener.default_filter_chain.take());
    } else if listener.default_filter_chain.is_none() {
        listener.default_filter_chain = Some(FilterChain {
            name: names::PASSTHROUGH_FILTER_CHAIN.into(),
            filter_chain_match: Some(FilterChainMatch::default()),
            filters: vec![fallthrough.clone()],
            ..Default::default()
        });
    }
    listener
}
