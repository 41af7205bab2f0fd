//! `proxy-config listener`: ADDRESSES, PORT, MATCH, DESTINATION — one row per filter chain, as
//! istioctl describes them: what a chain matches (`SNI: …; Trans: …; App: …; Addr: …`, or
//! `ALL`) and where it sends traffic (`Route: 9080`, `Cluster: outbound|…`, `Inline Route: …`,
//! `PassthroughCluster`, `Non-HTTP/Non-TCP`).

use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::{Address, socket_address::PortSpecifier};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, filter,
};
use envoy_types::pb::envoy::config::route::v3::{
    RouteConfiguration, VirtualHost, route, route_action,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    TcpProxy, tcp_proxy::ClusterSpecifier,
};
use prost::Message;

use super::route::describe_match;
use crate::cli::table;

pub const HEADER: [&str; 4] = ["ADDRESSES", "PORT", "MATCH", "DESTINATION"];

const HCM: &str = "envoy.filters.network.http_connection_manager";
const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";
const BLACK_HOLE: &str = "BlackHoleCluster";

/// istioctl's listener filters: each given one must hold.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ListenerFilter {
    /// Only listeners on this address.
    #[arg(long)]
    pub address: Option<String>,
    /// Only listeners on this port.
    #[arg(long)]
    pub port: Option<u32>,
    /// Only listeners of this type: HTTP, TCP or HTTP+TCP.
    #[arg(long = "type")]
    pub kind: Option<String>,
}

impl ListenerFilter {
    pub fn keeps(&self, listener: &Listener) -> bool {
        if let Some(address) = &self.address
            && !addresses(listener)
                .iter()
                .any(|a| a.eq_ignore_ascii_case(address))
        {
            return false;
        }
        if self.port.is_some_and(|p| p != port(listener)) {
            return false;
        }
        self.kind
            .as_ref()
            .is_none_or(|k| k.eq_ignore_ascii_case(listener_type(listener)))
    }
}

fn address_text(address: Option<&Address>) -> String {
    match address.and_then(|a| a.address.as_ref()) {
        Some(AddressKind::SocketAddress(s)) => s.address.clone(),
        Some(AddressKind::Pipe(p)) => p.path.clone(),
        _ => String::new(),
    }
}

/// The listener's address, then its additional ones.
fn addresses(listener: &Listener) -> Vec<String> {
    std::iter::once(address_text(listener.address.as_ref()))
        .chain(
            listener
                .additional_addresses
                .iter()
                .map(|a| address_text(a.address.as_ref())),
        )
        .collect()
}

fn port(listener: &Listener) -> u32 {
    match listener.address.as_ref().and_then(|a| a.address.as_ref()) {
        Some(AddressKind::SocketAddress(s)) => match s.port_specifier {
            Some(PortSpecifier::PortValue(p)) => p,
            _ => 0,
        },
        _ => 0,
    }
}

fn chains(listener: &Listener) -> impl Iterator<Item = &FilterChain> {
    listener
        .filter_chains
        .iter()
        .chain(listener.default_filter_chain.iter())
}

fn typed<M: Message + Default>(filter: &Filter) -> Option<Result<M, prost::DecodeError>> {
    match &filter.config_type {
        Some(filter::ConfigType::TypedConfig(any)) => Some(M::decode(any.value.as_slice())),
        _ => None,
    }
}

/// The TCP proxy's single cluster (empty for weighted clusters).
fn tcp_cluster(proxy: &TcpProxy) -> &str {
    match &proxy.cluster_specifier {
        Some(ClusterSpecifier::Cluster(c)) => c,
        _ => "",
    }
}

fn is_black_hole(filter: &Filter) -> bool {
    matches!(typed::<TcpProxy>(filter), Some(Ok(p)) if tcp_cluster(&p) == BLACK_HOLE)
}

/// HTTP, TCP, HTTP+TCP or UNKNOWN, from the filters of all chains (TCP proxies to the black
/// hole do not count).
fn listener_type(listener: &Listener) -> &'static str {
    let filters = chains(listener).flat_map(|c| c.filters.iter());
    let (mut http, mut tcp) = (false, false);
    for f in filters {
        if f.name == HCM {
            http = true;
        } else if f.name == TCP_PROXY && !is_black_hole(f) {
            tcp = true;
        }
    }
    match (http, tcp) {
        (true, false) => "HTTP",
        (true, true) => "HTTP+TCP",
        (false, true) => "TCP",
        (false, false) => "UNKNOWN",
    }
}

/// ALPN lists istioctl names.
const PROTOCOL_NAMES: [(&str, &[&str]); 4] = [
    (
        "App: HTTP TLS",
        &[
            "http/1.0",
            "http/1.1",
            "h2c",
            "istio-http/1.0",
            "istio-http/1.1",
            "istio-h2",
        ],
    ),
    (
        "App: Istio HTTP Plain",
        &["istio", "istio-http/1.0", "istio-http/1.1", "istio-h2"],
    ),
    ("App: TCP TLS", &["istio-peer-exchange", "istio"]),
    ("App: HTTP", &["http/1.0", "http/1.1", "h2c"]),
];

/// What a filter chain matches, as istioctl writes it.
pub fn describe_chain_match(m: Option<&FilterChainMatch>) -> String {
    let default = FilterChainMatch::default();
    let m = m.unwrap_or(&default);
    let mut parts = Vec::new();
    if !m.server_names.is_empty() {
        parts.push(format!("SNI: {}", m.server_names.join(",")));
    }
    if !m.transport_protocol.is_empty() {
        parts.push(format!("Trans: {}", m.transport_protocol));
    }
    if !m.application_protocols.is_empty() {
        let named = PROTOCOL_NAMES.iter().find(|(_, list)| {
            m.application_protocols
                .iter()
                .map(String::as_str)
                .eq(list.iter().copied())
        });
        parts.push(match named {
            Some((name, _)) => name.to_string(),
            None => format!("App: {}", m.application_protocols.join(",")),
        });
    }
    let port = m
        .destination_port
        .as_ref()
        .map(|p| format!(":{}", p.value))
        .unwrap_or_default();
    if !m.prefix_ranges.is_empty() {
        let ranges: Vec<String> = m
            .prefix_ranges
            .iter()
            .map(|r| {
                format!(
                    "{}/{}",
                    r.address_prefix,
                    r.prefix_len.as_ref().map_or(0, |l| l.value)
                )
            })
            .collect();
        parts.push(format!("Addr: {}{port}", ranges.join(",")));
    } else if !port.is_empty() {
        parts.push(format!("Addr: *{port}"));
    }
    if parts.is_empty() {
        "ALL".into()
    } else {
        parts.join("; ")
    }
}

/// `Cluster: <name>`, or the name alone for Istio's special clusters (`PassthroughCluster`, …).
fn cluster_destination(name: &str) -> String {
    if name.contains("Cluster") {
        name.to_string()
    } else {
        format!("Cluster: {name}")
    }
}

/// Where a filter chain's filters send traffic, as istioctl writes it.
pub fn describe_destination(filters: &[Filter]) -> String {
    for f in filters {
        if f.name == HCM {
            return match typed::<HttpConnectionManager>(f) {
                Some(Ok(hcm)) => match hcm.route_specifier {
                    Some(RouteSpecifier::RouteConfig(rc)) => describe_inline_routes(&rc),
                    Some(RouteSpecifier::Rds(rds)) if !rds.route_config_name.is_empty() => {
                        format!("Route: {}", rds.route_config_name)
                    }
                    _ => "HTTP".into(),
                },
                Some(Err(e)) => e.to_string(),
                None => "HTTP".into(),
            };
        }
        if f.name == TCP_PROXY && !is_black_hole(f) {
            return match typed::<TcpProxy>(f) {
                Some(Ok(proxy)) => cluster_destination(tcp_cluster(&proxy)),
                Some(Err(e)) => e.to_string(),
                None => cluster_destination(""),
            };
        }
    }
    "Non-HTTP/Non-TCP".into()
}

/// An inline route configuration: the cluster when it sends everything to one, otherwise
/// `Inline Route: <domains> <matches>; …`.
fn describe_inline_routes(rc: &RouteConfiguration) -> String {
    if let Some(cluster) = match_all_cluster(rc) {
        return cluster_destination(cluster);
    }
    let hosts: Vec<String> = rc
        .virtual_hosts
        .iter()
        .map(|vh| {
            let routes = describe_routes(vh);
            if vh.domains.len() == 1 && vh.domains[0] == "*" {
                routes
            } else {
                format!("{} {routes}", vh.domains.join("/"))
            }
        })
        .collect();
    format!("Inline Route: {}", hosts.join("; "))
}

fn describe_routes(vh: &VirtualHost) -> String {
    vh.routes
        .iter()
        .map(|r| describe_match(r.r#match.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The cluster of a route configuration that sends every request (one `*` host, one `/` prefix
/// route) to one cluster.
fn match_all_cluster(rc: &RouteConfiguration) -> Option<&str> {
    let [vh] = rc.virtual_hosts.as_slice() else {
        return None;
    };
    if vh.domains != ["*"] {
        return None;
    }
    let [r] = vh.routes.as_slice() else {
        return None;
    };
    let prefix_slash = matches!(
        r.r#match.as_ref().and_then(|m| m.path_specifier.as_ref()),
        Some(envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier::Prefix(p)) if p == "/"
    );
    if !prefix_slash {
        return None;
    }
    match &r.action {
        Some(route::Action::Route(action)) => match &action.cluster_specifier {
            Some(route_action::ClusterSpecifier::Cluster(c)) => Some(c),
            _ => None,
        },
        _ => None,
    }
}

/// One row per filter chain of the listeners kept: listeners by port, address and type, chains
/// by destination (descending, as istioctl).
pub fn rows<'a>(listeners: impl IntoIterator<Item = &'a Listener>) -> Vec<Vec<String>> {
    let mut listeners: Vec<&Listener> = listeners.into_iter().collect();
    listeners.sort_by(|a, b| {
        (port(a), address_text(a.address.as_ref()), listener_type(a)).cmp(&(
            port(b),
            address_text(b.address.as_ref()),
            listener_type(b),
        ))
    });
    let mut rows = Vec::new();
    for l in listeners {
        let addresses = addresses(l).join(",");
        let port = port(l).to_string();
        let mut matches: Vec<(String, String)> = chains(l)
            .map(|c| {
                (
                    describe_chain_match(c.filter_chain_match.as_ref()),
                    describe_destination(&c.filters),
                )
            })
            .collect();
        matches.sort_by(|a, b| b.1.cmp(&a.1));
        for (m, destination) in matches {
            rows.push(vec![addresses.clone(), port.clone(), m, destination]);
        }
    }
    rows
}

/// The table of `listeners`.
pub fn render<'a>(listeners: impl IntoIterator<Item = &'a Listener>) -> String {
    table::render(&HEADER, &rows(listeners), table::NARROW)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::SocketAddress;
    use envoy_types::pb::envoy::config::route::v3::{Route, RouteAction, RouteMatch, route_match};
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::Rds;
    use envoy_types::pb::google::protobuf::UInt32Value;
    use envoy_types::util::pack_any;

    fn filter<M: prost::Name + Message>(name: &str, config: M) -> Filter {
        Filter {
            name: name.into(),
            config_type: Some(filter::ConfigType::TypedConfig(pack_any(config))),
        }
    }

    fn tcp(cluster: &str) -> Filter {
        filter(
            TCP_PROXY,
            TcpProxy {
                cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.into())),
                ..Default::default()
            },
        )
    }

    fn rds(name: &str) -> Filter {
        filter(
            HCM,
            HttpConnectionManager {
                route_specifier: Some(RouteSpecifier::Rds(Rds {
                    route_config_name: name.into(),
                    ..Default::default()
                })),
                ..Default::default()
            },
        )
    }

    fn listener(address: &str, port: u32, chains: Vec<FilterChain>) -> Listener {
        Listener {
            name: format!("{address}_{port}"),
            address: Some(Address {
                address: Some(AddressKind::SocketAddress(SocketAddress {
                    address: address.into(),
                    port_specifier: Some(PortSpecifier::PortValue(port)),
                    ..Default::default()
                })),
            }),
            filter_chains: chains,
            ..Default::default()
        }
    }

    fn chain(m: Option<FilterChainMatch>, filters: Vec<Filter>) -> FilterChain {
        FilterChain {
            filter_chain_match: m,
            filters,
            ..Default::default()
        }
    }

    #[test]
    fn destinations_as_istioctl_writes_them() {
        assert_eq!(describe_destination(&[rds("9080")]), "Route: 9080");
        assert_eq!(
            describe_destination(&[tcp("outbound|3306||mysql.default.svc.cluster.local")]),
            "Cluster: outbound|3306||mysql.default.svc.cluster.local"
        );
        assert_eq!(
            describe_destination(&[tcp("PassthroughCluster")]),
            "PassthroughCluster"
        );
        assert_eq!(describe_destination(&[tcp(BLACK_HOLE)]), "Non-HTTP/Non-TCP");
        assert_eq!(describe_destination(&[]), "Non-HTTP/Non-TCP");
        let inline = |domains: Vec<&str>, prefix: &str, cluster: &str| {
            filter(
                HCM,
                HttpConnectionManager {
                    route_specifier: Some(RouteSpecifier::RouteConfig(RouteConfiguration {
                        virtual_hosts: vec![VirtualHost {
                            domains: domains.into_iter().map(String::from).collect(),
                            routes: vec![Route {
                                r#match: Some(RouteMatch {
                                    path_specifier: Some(route_match::PathSpecifier::Prefix(
                                        prefix.into(),
                                    )),
                                    ..Default::default()
                                }),
                                action: Some(route::Action::Route(RouteAction {
                                    cluster_specifier: Some(
                                        route_action::ClusterSpecifier::Cluster(cluster.into()),
                                    ),
                                    ..Default::default()
                                })),
                                ..Default::default()
                            }],
                            ..Default::default()
                        }],
                        ..Default::default()
                    })),
                    ..Default::default()
                },
            )
        };
        assert_eq!(
            describe_destination(&[inline(vec!["*"], "/", "inbound|9080||")]),
            "Cluster: inbound|9080||"
        );
        assert_eq!(
            describe_destination(&[inline(vec!["*"], "/", "InboundPassthroughCluster")]),
            "InboundPassthroughCluster"
        );
        assert_eq!(
            describe_destination(&[inline(vec!["a", "b"], "/api", "x")]),
            "Inline Route: a/b /api*"
        );
    }

    #[test]
    fn chain_matches_as_istioctl_writes_them() {
        assert_eq!(describe_chain_match(None), "ALL");
        let m = FilterChainMatch {
            transport_protocol: "tls".into(),
            application_protocols: vec!["istio-peer-exchange".into(), "istio".into()],
            destination_port: Some(UInt32Value { value: 9080 }),
            ..Default::default()
        };
        assert_eq!(
            describe_chain_match(Some(&m)),
            "Trans: tls; App: TCP TLS; Addr: *:9080"
        );
        let m = FilterChainMatch {
            server_names: vec!["a.example.com".into()],
            application_protocols: vec!["h2".into()],
            ..Default::default()
        };
        assert_eq!(
            describe_chain_match(Some(&m)),
            "SNI: a.example.com; App: h2"
        );
    }

    #[test]
    fn rows_by_port_then_destination_and_filters() {
        let listeners = [
            listener(
                "0.0.0.0",
                9080,
                vec![
                    chain(None, vec![tcp("PassthroughCluster")]),
                    chain(None, vec![rds("9080")]),
                ],
            ),
            listener(
                "10.96.0.30",
                3306,
                vec![chain(None, vec![tcp("outbound|3306||db")])],
            ),
        ];
        let rows = rows(&listeners);
        assert_eq!(
            rows[0],
            ["10.96.0.30", "3306", "ALL", "Cluster: outbound|3306||db"]
        );
        assert_eq!(rows[1], ["0.0.0.0", "9080", "ALL", "Route: 9080"]);
        assert_eq!(rows[2], ["0.0.0.0", "9080", "ALL", "PassthroughCluster"]);

        let http = ListenerFilter {
            kind: Some("http+tcp".into()),
            ..Default::default()
        };
        assert!(http.keeps(&listeners[0]) && !http.keeps(&listeners[1]));
        let by_address = ListenerFilter {
            address: Some("10.96.0.30".into()),
            port: Some(3306),
            ..Default::default()
        };
        assert!(!by_address.keeps(&listeners[0]) && by_address.keeps(&listeners[1]));
    }
}
