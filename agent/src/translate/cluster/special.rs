//! The clusters that are not a service's: original destination (`PassthroughCluster`, the
//! gateway's dynamic DNS one), `BlackHoleCluster`, and the inbound ones (`InboundPassthroughCluster`
//! and one per inbound port).

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, LbPolicy,
};
use envoy_types::pb::envoy::config::core::v3::{BindConfig, SocketAddress, socket_address};
use envoy_types::pb::google::protobuf::Duration;
use envoy_types::util::pack_any;
use pasa_istio::common::Protocol;
use pasa_istio::destination_rule::DestinationRule;

use super::super::endpoint;
use super::super::names;
use super::traffic_policy::{
    Policy, apply_connection_pool, passthrough_http_options, unlimited_circuit_breakers,
};
use super::upstream::{HTTP_PROTOCOL_OPTIONS, Upstream, http_settings, upstream_http_options};
use super::{CONNECT_TIMEOUT, ClusterSettings, Keepalive};

/// A cluster that forwards to each connection's original destination.
fn original_destination(name: &str) -> Cluster {
    Cluster {
        name: name.to_string(),
        alt_stat_name: names::delimited_stats(name),
        connect_timeout: Some(CONNECT_TIMEOUT),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(
            DiscoveryType::OriginalDst as i32,
        )),
        lb_policy: LbPolicy::ClusterProvided as i32,
        ..Default::default()
    }
}

/// [`original_destination`] for inbound traffic: sent from Istio's inbound passthrough source
/// address, so the workload's own outbound capture lets it through.
fn inbound_original_destination(name: &str) -> Cluster {
    Cluster {
        upstream_bind_config: Some(BindConfig {
            // Envoy requires a port: 0 lets the kernel choose one, as istiod writes it.
            source_address: Some(SocketAddress {
                address: "127.0.0.6".into(),
                port_specifier: Some(socket_address::PortSpecifier::PortValue(0)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..original_destination(name)
    }
}

/// `PassthroughCluster`: forwards to the original destination (with the mesh config's TCP
/// keepalive).
pub(in crate::translate) fn passthrough(settings: &ClusterSettings) -> Cluster {
    Cluster {
        circuit_breakers: unlimited_circuit_breakers(),
        typed_extension_protocol_options: passthrough_http_options(settings.preserve_case),
        upstream_connection_options: settings.tcp_keepalive.map(Keepalive::envoy),
        ..original_destination(names::PASSTHROUGH_CLUSTER)
    }
}

/// `AllowAnyDynamicDNSCluster`: a dynamic forward proxy resolving each request's host, where
/// unknown plaintext HTTP goes under `ALLOW_ANY_DYNAMIC_DNS`.
pub(in crate::translate) fn allow_any_dynamic_dns() -> Cluster {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::CustomClusterType;
    use envoy_types::pb::envoy::extensions::clusters::dynamic_forward_proxy::v3::{
        ClusterConfig, cluster_config::ClusterImplementationSpecifier,
    };
    use envoy_types::pb::envoy::extensions::common::dynamic_forward_proxy::v3::DnsCacheConfig;
    let config = ClusterConfig {
        cluster_implementation_specifier: Some(ClusterImplementationSpecifier::DnsCacheConfig(
            DnsCacheConfig {
                name: names::ALLOW_ANY_DYNAMIC_DNS.into(),
                ..Default::default()
            },
        )),
        allow_insecure_cluster_options: true,
        ..Default::default()
    };
    Cluster {
        name: names::ALLOW_ANY_DYNAMIC_DNS_CLUSTER.into(),
        alt_stat_name: names::delimited_stats(names::ALLOW_ANY_DYNAMIC_DNS_CLUSTER),
        connect_timeout: Some(CONNECT_TIMEOUT),
        lb_policy: LbPolicy::ClusterProvided as i32,
        cluster_discovery_type: Some(ClusterDiscoveryType::ClusterType(CustomClusterType {
            name: "envoy.clusters.dynamic_forward_proxy".into(),
            typed_config: Some(pack_any(config)),
        })),
        ..Default::default()
    }
}

/// `BlackHoleCluster`: a static cluster without endpoints.
pub(in crate::translate) fn black_hole() -> Cluster {
    Cluster {
        name: names::BLACK_HOLE_CLUSTER.into(),
        alt_stat_name: names::delimited_stats(names::BLACK_HOLE_CLUSTER),
        connect_timeout: Some(CONNECT_TIMEOUT),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        ..Default::default()
    }
}

/// `InboundPassthroughCluster`: inbound traffic to a port no service declares, forwarded to the
/// original destination from Istio's inbound passthrough source address.
pub(in crate::translate) fn inbound_passthrough(settings: &ClusterSettings) -> Cluster {
    let inbound = inbound_original_destination(names::INBOUND_PASSTHROUGH_CLUSTER);
    Cluster {
        name: inbound.name,
        upstream_bind_config: inbound.upstream_bind_config,
        // The outbound one's stat name, as istiod's: their stats count together.
        ..passthrough(settings)
    }
}

/// `inbound|<port>||`: traffic for the local workload, to `endpoint` (`127.0.0.1:<port>` or a
/// Sidecar ingress listener's `defaultEndpoint`), or to the original destination when `None`;
/// upstream, the HTTP its port's `protocol` says (what the client spoke, where it is detected).
/// The connection pool of the `rule` of the service the port serves applies here too, for its
/// service port (`rule`'s second), as istiod applies it: the server takes what its clients may
/// send.
pub(in crate::translate) fn inbound(
    port: u32,
    endpoint: Option<(String, u32)>,
    protocol: Option<Protocol>,
    settings: &ClusterSettings,
    rule: Option<(&DestinationRule, u32)>,
) -> Cluster {
    let name = names::inbound_cluster(port);
    let cluster = match endpoint {
        Some((address, port)) => Cluster {
            name: name.clone(),
            alt_stat_name: names::delimited_stats(&name),
            connect_timeout: Some(CONNECT_TIMEOUT),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
            load_assignment: Some(endpoint::single(&name, &address, port)),
            ..Default::default()
        },
        None => Cluster {
            // Original destinations are never cleaned up, as istiod has it for inbound.
            cleanup_interval: Some(Duration {
                seconds: 9_223_372_035,
                nanos: 0,
            }),
            ..inbound_original_destination(&name)
        },
    };
    let mut cluster = Cluster {
        common_lb_config: Some(Default::default()),
        ..cluster
    };
    let policy = rule.map(|(dr, service_port)| Policy::of(Some(dr), None, service_port));
    let pool = policy.as_ref().and_then(|p| p.connection_pool.as_ref());
    let common = apply_connection_pool(&mut cluster, pool, settings.tcp_keepalive);
    // No HTTP/2 upgrade toward the workload itself.
    let upstream = Upstream::of(
        protocol,
        true,
        settings.preserve_case,
        None,
        http_settings(pool),
    );
    cluster.typed_extension_protocol_options =
        upstream_http_options(common, upstream, http_settings(pool), None)
            .map(|options| [(HTTP_PROTOCOL_OPTIONS.to_string(), pack_any(options))].into())
            .unwrap_or_default();
    cluster
}
