//! Hand-built resources shaped like istiod's output for a sidecar, to check the simulator against
//! corpus expectations without a translator: the capture listeners (`virtualOutbound` on 15001,
//! `virtualInbound` on 15006, each refusing traffic sent to its own port) and the inbound side of
//! a workload with a TCP port 70, an HTTP port 80 and a protocol-sniffed port 81, with mutual TLS
//! disabled.

use envoy_types::pb::envoy::config::core::v3::{Address, SocketAddress, address, socket_address};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter, listener_filter,
};
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier as RouteCluster;
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route,
};
use envoy_types::pb::envoy::extensions::filters::listener::http_inspector::v3::HttpInspector;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier;
use envoy_types::pb::google::protobuf::UInt32Value;
use envoy_types::util::pack_any;
use pasa_agent::resource::Resources;

fn wildcard(port: u32) -> Option<Address> {
    Some(Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: "0.0.0.0".into(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    })
}

fn tcp(cluster: &str) -> Vec<Filter> {
    vec![Filter {
        name: "envoy.filters.network.tcp_proxy".into(),
        config_type: Some(filter::ConfigType::TypedConfig(pack_any(TcpProxy {
            stat_prefix: cluster.into(),
            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.into())),
            ..Default::default()
        }))),
    }]
}

/// An HTTP connection manager with one inline virtual host sending everything to `cluster`.
fn http(virtual_host: &str, cluster: &str) -> Vec<Filter> {
    let routes = RouteConfiguration {
        name: cluster.into(),
        virtual_hosts: vec![VirtualHost {
            name: virtual_host.into(),
            domains: vec!["*".into()],
            routes: vec![Route {
                name: "default".into(),
                r#match: Some(RouteMatch {
                    path_specifier: Some(PathSpecifier::Prefix("/".into())),
                    ..Default::default()
                }),
                action: Some(route::Action::Route(RouteAction {
                    cluster_specifier: Some(RouteCluster::Cluster(cluster.into())),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    vec![Filter {
        name: "envoy.filters.network.http_connection_manager".into(),
        config_type: Some(filter::ConfigType::TypedConfig(pack_any(
            HttpConnectionManager {
                stat_prefix: virtual_host.into(),
                route_specifier: Some(RouteSpecifier::RouteConfig(routes)),
                ..Default::default()
            },
        ))),
    }]
}

fn chain(
    name: &str,
    port: Option<u32>,
    transport: &str,
    alpn: &[&str],
    filters: Vec<Filter>,
) -> FilterChain {
    FilterChain {
        name: name.into(),
        filter_chain_match: Some(FilterChainMatch {
            destination_port: port.map(|value| UInt32Value { value }),
            transport_protocol: transport.into(),
            application_protocols: alpn.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        }),
        filters,
        ..Default::default()
    }
}

fn inspectors() -> Vec<ListenerFilter> {
    vec![
        ListenerFilter {
            name: "envoy.filters.listener.tls_inspector".into(),
            config_type: Some(listener_filter::ConfigType::TypedConfig(pack_any(
                TlsInspector::default(),
            ))),
            ..Default::default()
        },
        ListenerFilter {
            name: "envoy.filters.listener.http_inspector".into(),
            config_type: Some(listener_filter::ConfigType::TypedConfig(pack_any(
                HttpInspector::default(),
            ))),
            ..Default::default()
        },
    ]
}

const HTTP_ALPN: &[&str] = &["http/1.1", "h2c"];

/// The sidecar described in the module documentation.
pub fn sidecar_with_mtls_disabled() -> Resources {
    let mut r = Resources::default();
    r.listeners.insert(
        "virtualOutbound".into(),
        Listener {
            name: "virtualOutbound".into(),
            address: wildcard(15001),
            filter_chains: vec![chain(
                "virtualOutbound-blackhole",
                Some(15001),
                "",
                &[],
                tcp("BlackHoleCluster"),
            )],
            default_filter_chain: Some(FilterChain {
                name: "PassthroughFilterChain".into(),
                filters: tcp("PassthroughCluster"),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    let passthrough = "InboundPassthroughCluster";
    r.listeners.insert(
        "virtualInbound".into(),
        Listener {
            name: "virtualInbound".into(),
            address: wildcard(15006),
            listener_filters: inspectors(),
            filter_chains: vec![
                chain(
                    "virtualInbound-blackhole",
                    Some(15006),
                    "",
                    &[],
                    tcp("BlackHoleCluster"),
                ),
                chain("0.0.0.0_70", Some(70), "", &[], tcp("inbound|70||")),
                chain(
                    "0.0.0.0_80",
                    Some(80),
                    "",
                    &[],
                    http("inbound|http|80", "inbound|80||"),
                ),
                chain(
                    "0.0.0.0_81",
                    Some(81),
                    "raw_buffer",
                    HTTP_ALPN,
                    http("inbound|http|81", "inbound|81||"),
                ),
                chain(
                    "0.0.0.0_81",
                    Some(81),
                    "raw_buffer",
                    &[],
                    tcp("inbound|81||"),
                ),
                chain("0.0.0.0_81", Some(81), "tls", &[], tcp("inbound|81||")),
                chain(
                    "virtualInbound-catchall-http",
                    None,
                    "raw_buffer",
                    HTTP_ALPN,
                    http("inbound|http|0", passthrough),
                ),
                chain("virtualInbound", None, "raw_buffer", &[], tcp(passthrough)),
                chain("virtualInbound", None, "tls", &[], tcp(passthrough)),
            ],
            ..Default::default()
        },
    );
    r
}
