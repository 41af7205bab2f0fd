//! The Envoy filters listeners are built from: HTTP connection managers (RDS or inline routes),
//! TCP proxies (also those of VirtualService TCP and TLS routes), and the listener filters that read the original destination, TLS and HTTP.

use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, ListenerFilter, filter, listener_filter,
};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::http_inspector::v3::HttpInspector;
use envoy_types::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager::CodecType,
    http_connection_manager::RouteSpecifier, http_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    TcpProxy, tcp_proxy::ClusterSpecifier, tcp_proxy::WeightedCluster,
    tcp_proxy::weighted_cluster::ClusterWeight,
};
use envoy_types::pb::google::protobuf::{Duration, UInt32Value};
use envoy_types::util::pack_any;

use pasa_istio::virtual_service::RouteDestination;

use super::View;
use super::builders::ads;
use super::route::Destinations;
use super::route::{CORS_FILTER, FAULT_FILTER};
use crate::model::registry::Meta;

pub(super) const HCM: &str = "envoy.filters.network.http_connection_manager";
/// The router's name.
pub(super) const ROUTER: &str = "envoy.filters.http.router";
pub(super) const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";
pub(super) const TLS_INSPECTOR: &str = "envoy.filters.listener.tls_inspector";
pub(super) const HTTP_INSPECTOR: &str = "envoy.filters.listener.http_inspector";
const ORIGINAL_DST: &str = "envoy.filters.listener.original_dst";
/// The name of Istio's proxy's metadata exchange filters (HTTP, network and upstream).
pub(super) const MX_FILTER: &str = "istio.metadata_exchange";

/// Where an HTTP connection manager takes its routes from.
pub(super) enum Routes {
    /// RDS over ADS, by name.
    Rds(String),
    Inline(Box<RouteConfiguration>),
}

/// An HTTP connection manager with istiod's filters: fault, CORS, router (the routes'
/// `typed_per_filter_config` needs the first two, and gRPC clients apply faults only when the
/// filter is there).
pub(super) fn http_connection_manager(stat_prefix: &str, routes: Routes) -> HttpConnectionManager {
    let route_specifier = match routes {
        Routes::Rds(name) => RouteSpecifier::Rds(Rds {
            config_source: Some(ads()),
            route_config_name: name,
        }),
        Routes::Inline(config) => RouteSpecifier::RouteConfig(*config),
    };
    HttpConnectionManager {
        codec_type: CodecType::Auto as i32,
        stat_prefix: stat_prefix.to_string(),
        route_specifier: Some(route_specifier),
        http_filters: vec![
            fault(),
            HttpFilter {
                name: CORS_FILTER.into(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
                    envoy_types::pb::envoy::extensions::filters::http::cors::v3::Cors::default(),
                ))),
                ..Default::default()
            },
            router(),
        ],
        ..Default::default()
    }
}

/// The fault filter (routes' fault injection needs it).
pub(super) fn fault() -> HttpFilter {
    HttpFilter {
        name: FAULT_FILTER.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
            HttpFault::default(),
        ))),
        ..Default::default()
    }
}

/// The router, last of a connection manager's filters.
pub(super) fn router() -> HttpFilter {
    HttpFilter {
        name: ROUTER.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
            Router::default(),
        ))),
        ..Default::default()
    }
}

/// The connection manager as a listener's network filter.
pub(super) fn hcm_filter(hcm: HttpConnectionManager) -> Filter {
    Filter {
        name: HCM.into(),
        config_type: Some(filter::ConfigType::TypedConfig(pack_any(hcm))),
    }
}

/// A TCP proxy to one cluster, or to several by weight.
pub(super) fn tcp_proxy(stat_prefix: &str, clusters: &[(String, u32)]) -> Filter {
    let specifier = match clusters {
        [(one, _)] => ClusterSpecifier::Cluster(one.clone()),
        many => ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: many
                .iter()
                .map(|(name, weight)| ClusterWeight {
                    name: name.clone(),
                    weight: *weight,
                    ..Default::default()
                })
                .collect(),
        }),
    };
    let proxy = TcpProxy {
        stat_prefix: stat_prefix.to_string(),
        cluster_specifier: Some(specifier),
        ..Default::default()
    };
    Filter {
        name: TCP_PROXY.into(),
        config_type: Some(filter::ConfigType::TypedConfig(pack_any(proxy))),
    }
}

/// The TCP proxy of a VirtualService's TCP or TLS route, as istiod names it: a single
/// destination's proxy is named after its cluster, a weighted one `<name>.<namespace>` of the
/// VirtualService.
pub(super) fn tcp_route(
    view: &View<'_>,
    routes: &[RouteDestination],
    vs: &Meta,
    port: u32,
) -> Filter {
    let clusters = weighted(view, routes, &vs.namespace, port);
    let stat = match clusters.as_slice() {
        [(one, _)] if routes.len() == 1 => one.clone(),
        _ => format!("{}.{}", vs.name, vs.namespace),
    };
    tcp_proxy(&stat, &clusters)
}

/// Weighted clusters of route destinations (a single destination takes all the weight).
pub(super) fn weighted(
    view: &View<'_>,
    routes: &[RouteDestination],
    namespace: &str,
    port: u32,
) -> Vec<(String, u32)> {
    let single = routes.len() == 1;
    routes
        .iter()
        .filter_map(|r| {
            let d = r.destination.as_ref()?;
            let weight = if single { 100 } else { r.weight.max(0) as u32 };
            Some((view.cluster(d, namespace, port), weight))
        })
        .filter(|(_, w)| *w > 0)
        .collect()
}

/// A listener filter with its typed configuration.
fn listener_filter<M: prost::Name + prost::Message>(name: &str, config: M) -> ListenerFilter {
    ListenerFilter {
        name: name.into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(pack_any(config))),
        ..Default::default()
    }
}

/// Restores the original destination of captured connections.
pub(super) fn original_dst() -> ListenerFilter {
    listener_filter(ORIGINAL_DST, OriginalDst::default())
}

/// The listener filter that strips a PROXY protocol header (v1 or v2) and takes the client's
/// address from it.
pub(super) fn proxy_protocol() -> ListenerFilter {
    listener_filter(
        "envoy.filters.listener.proxy_protocol",
        envoy_types::pb::envoy::extensions::filters::listener::proxy_protocol::v3::ProxyProtocol::default(),
    )
}

/// How long a TLS (or other transport) handshake may take on a listener istiod bounds it on
/// (outbound listeners, gateways): a defence against slow handshakes holding memory.
pub(super) fn transport_socket_connect_timeout() -> Option<Duration> {
    Some(Duration {
        seconds: 15,
        nanos: 0,
    })
}

/// Connections a listener bound to a port accepts per socket event, as istiod sets it: one, so
/// that accepted connections spread over Envoy's workers.
pub(super) fn accept_one_per_event() -> Option<UInt32Value> {
    Some(UInt32Value { value: 1 })
}

/// The inspectors a listener needs: TLS to read SNI and ALPN (reading at most 512 bytes at
/// first, as istiod's), HTTP to tell plaintext HTTP from other bytes.
pub(super) fn inspectors(tls: bool, http: bool) -> Vec<ListenerFilter> {
    let mut out = Vec::new();
    if tls {
        out.push(listener_filter(
            TLS_INSPECTOR,
            TlsInspector {
                initial_read_buffer_size: Some(UInt32Value { value: 512 }),
                ..Default::default()
            },
        ));
    }
    if http {
        out.push(listener_filter(HTTP_INSPECTOR, HttpInspector::default()));
    }
    out
}

/// `chains` without those matching exactly what an earlier one matches: Envoy refuses a whole
/// listener with two such chains (istiod emits them for two Gateways serving the same TLS host
/// on one port, and the listener then stops updating). The first chain, from the oldest
/// server, keeps the traffic, as for HTTP servers that conflict.
pub(super) fn distinct_chains(listener: &str, chains: Vec<FilterChain>) -> Vec<FilterChain> {
    let mut kept: Vec<FilterChain> = Vec::with_capacity(chains.len());
    for chain in chains {
        if kept
            .iter()
            .any(|k| k.filter_chain_match == chain.filter_chain_match)
        {
            tracing::warn!(
                %listener,
                chain = %chain.name,
                "a second filter chain matches the same connections as an earlier one; it is left out"
            );
            continue;
        }
        kept.push(chain);
    }
    kept
}

/// The configuration of Istio's proxy's TCP metadata exchange (on listeners and clusters): the
/// peers' metadata in band, over mutual TLS negotiated with ALPN `istio-peer-exchange`, or else
/// from the workload discovery; as istiod configures it.
pub(super) fn tcp_metadata_exchange() -> envoy_types::pb::google::protobuf::Any {
    super::builders::typed_struct(
        "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange",
        &serde_json::json!({"protocol": "istio-peer-exchange", "enable_discovery": true}),
    )
}

/// The TCP metadata exchange as a listener's network filter (first in its chain, so that RBAC
/// and stats see the peer). Only Istio's proxy has it.
pub(super) fn tcp_listener_mx() -> Filter {
    Filter {
        name: MX_FILTER.into(),
        config_type: Some(filter::ConfigType::TypedConfig(tcp_metadata_exchange())),
    }
}
