//! A DestinationRule's traffic policy for one cluster: merged as istiod merges it ([`Policy`]),
//! and its load balancer, connection pool (as circuit breakers) and outlier detection as Envoy's
//! cluster fields.

use envoy_types::pb::envoy::config::cluster::v3::circuit_breakers::Thresholds;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, LbConfig, LbPolicy, RingHashLbConfig,
    ring_hash_lb_config::HashFunction,
};
use envoy_types::pb::envoy::config::cluster::v3::{CircuitBreakers, Cluster, OutlierDetection};
use envoy_types::pb::envoy::config::core::v3::HttpProtocolOptions;
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::{Duration, UInt32Value, UInt64Value};
use envoy_types::util::pack_any;
use pasa_istio::destination_rule::{
    ClientTlsMode, ClientTlsSettings, ConnectionPoolSettings, DestinationRule,
    OutlierDetection as IstioOutlier, TrafficPolicy,
};
use pasa_istio::destination_rule::{LoadBalancerSettings, SimpleLb};

use crate::model::secrets;

use super::super::Generator;
use super::super::builders::{duration, http1_options};
use super::Keepalive;
use super::upstream::HTTP_PROTOCOL_OPTIONS;

/// The traffic policy that applies to one cluster, as istiod merges it: a DestinationRule's
/// top-level policy, then the subset's, the subset's fields (load balancer, connection pool,
/// outlier detection, TLS) replacing those it sets. A policy's port-level settings for the port
/// stand for that whole policy: they inherit nothing from it, and what they leave out is left to
/// the defaults (and a subset's replace all four fields).
#[derive(Debug, Clone, Default, PartialEq)]
pub(in crate::translate) struct Policy {
    pub load_balancer: Option<LoadBalancerSettings>,
    pub connection_pool: Option<ConnectionPoolSettings>,
    pub outlier_detection: Option<IstioOutlier>,
    pub tls: Option<ClientTlsSettings>,
    /// The rule selects workloads (`workloadSelector`).
    pub selects_workloads: bool,
}

impl Policy {
    pub(in crate::translate) fn of(
        dr: Option<&DestinationRule>,
        subset: Option<&str>,
        port: u32,
    ) -> Policy {
        let mut policy = Policy::default();
        let Some(dr) = dr else { return policy };
        policy.apply(dr.traffic_policy.as_ref(), port);
        if let Some(subset) = subset
            && let Some(s) = dr.subsets.iter().find(|s| s.name == subset)
        {
            policy.apply(s.traffic_policy.as_ref(), port);
        }
        policy.selects_workloads = dr.workload_selector.is_some();
        policy
    }

    /// Whether the cluster's endpoints include those known unhealthy (not ready), as istiod
    /// sends them: unless an outlier detection sets `minHealthPercent`, whose panic threshold
    /// would send traffic to them (without it, panic mode is off).
    pub(super) fn sends_unhealthy(&self) -> bool {
        self.outlier_detection
            .as_ref()
            .is_none_or(|o| o.min_health_percent <= 0)
    }

    /// The TLS it originates (SIMPLE or MUTUAL), as istiod applies it. A sidecar does not take
    /// a credential by name from a rule without a workload selector (istiod leaves TLS out
    /// there, so that a credential meant for an egress gateway does not hold up every sidecar
    /// the rule reaches).
    pub(super) fn originated(&self, sidecar: bool) -> Option<&ClientTlsSettings> {
        let tls = self.tls.as_ref()?;
        let by_name = !tls.credential_name.is_empty()
            && !tls.credential_name.starts_with(secrets::CONFIG_MAP_PREFIX);
        (matches!(tls.mode, ClientTlsMode::Simple | ClientTlsMode::Mutual)
            && !(by_name && sidecar && !self.selects_workloads))
            .then_some(tls)
    }

    fn apply(&mut self, tp: Option<&TrafficPolicy>, port: u32) {
        let Some(tp) = tp else { return };
        match tp
            .port_level_settings
            .iter()
            .find(|p| p.port.as_ref().is_some_and(|s| s.number == port))
        {
            Some(p) => {
                *self = Policy {
                    load_balancer: p.load_balancer.clone(),
                    connection_pool: p.connection_pool.clone(),
                    outlier_detection: p.outlier_detection.clone(),
                    tls: p.tls.clone(),
                    selects_workloads: false,
                }
            }
            None => {
                replace_if_set(&mut self.load_balancer, &tp.load_balancer);
                replace_if_set(&mut self.connection_pool, &tp.connection_pool);
                replace_if_set(&mut self.outlier_detection, &tp.outlier_detection);
                replace_if_set(&mut self.tls, &tp.tls);
            }
        }
    }
}

fn replace_if_set<T: Clone>(kept: &mut Option<T>, set: &Option<T>) {
    if set.is_some() {
        kept.clone_from(set);
    }
}

pub(super) fn apply_load_balancer(
    cluster: &mut Cluster,
    lb: Option<&LoadBalancerSettings>,
    generator: Generator,
) {
    // Istio's default is LEAST_REQUEST; gRPC clients do not implement it, so istiod's gRPC
    // generator leaves round robin.
    let default = match generator {
        Generator::Envoy => LbPolicy::LeastRequest,
        Generator::Grpc => LbPolicy::RoundRobin,
    };
    let policy = match lb {
        None => default,
        Some(p) => {
            if let Some(hash) = p.consistent_hash() {
                // As istiod: the ring's or Maglev table's size when given; without either,
                // the deprecated field's ring size, else Envoy's 1024, said explicitly.
                let (policy, config) = match (hash.maglev(), hash.ring_hash()) {
                    (Some(maglev), _) => (
                        LbPolicy::Maglev,
                        (maglev.table_size.0 > 0).then_some(LbConfig::MaglevLbConfig(
                            envoy_types::pb::envoy::config::cluster::v3::cluster::MaglevLbConfig {
                                table_size: Some(UInt64Value {
                                    value: maglev.table_size.0,
                                }),
                            },
                        )),
                    ),
                    (None, Some(ring)) => (
                        LbPolicy::RingHash,
                        (ring.minimum_ring_size.0 > 0).then(|| ring_size(ring.minimum_ring_size.0)),
                    ),
                    (None, None) => (
                        LbPolicy::RingHash,
                        Some(ring_size(if hash.minimum_ring_size.0 > 0 {
                            hash.minimum_ring_size.0
                        } else {
                            1024
                        })),
                    ),
                };
                if config.is_some() {
                    cluster.lb_config = config;
                }
                policy
            } else {
                let policy = match p.simple() {
                    Some(SimpleLb::Random) => LbPolicy::Random,
                    Some(SimpleLb::RoundRobin) => LbPolicy::RoundRobin,
                    Some(SimpleLb::Passthrough) => {
                        // The cluster's own fields follow: no EDS config.
                        cluster.cluster_discovery_type = Some(ClusterDiscoveryType::Type(
                            DiscoveryType::OriginalDst as i32,
                        ));
                        LbPolicy::ClusterProvided
                    }
                    Some(SimpleLb::LeastConn | SimpleLb::LeastRequest) => LbPolicy::LeastRequest,
                    _ => default,
                };
                if let Some(slow_start) = slow_start(p) {
                    use envoy_types::pb::envoy::config::cluster::v3::cluster::{
                        LeastRequestLbConfig, RoundRobinLbConfig,
                    };
                    match policy {
                        LbPolicy::LeastRequest => {
                            cluster.lb_config =
                                Some(LbConfig::LeastRequestLbConfig(LeastRequestLbConfig {
                                    slow_start_config: Some(slow_start),
                                    ..Default::default()
                                }))
                        }
                        LbPolicy::RoundRobin => {
                            cluster.lb_config =
                                Some(LbConfig::RoundRobinLbConfig(RoundRobinLbConfig {
                                    slow_start_config: Some(slow_start),
                                }))
                        }
                        _ => {}
                    }
                }
                policy
            }
        }
    };
    cluster.lb_policy = policy as i32;
}

/// Slow start of new endpoints (`warmup`, else the older `warmupDurationSecs`), as istiod sets
/// it: linear unless an aggression is given, from 10% unless a minimum is.
fn slow_start(
    lb: &LoadBalancerSettings,
) -> Option<envoy_types::pb::envoy::config::cluster::v3::cluster::SlowStartConfig> {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::SlowStartConfig;
    use envoy_types::pb::envoy::config::core::v3::RuntimeDouble;
    match (&lb.warmup, &lb.warmup_duration_secs) {
        (Some(warmup), _) => Some(SlowStartConfig {
            slow_start_window: warmup.duration.as_ref().map(duration),
            aggression: Some(RuntimeDouble {
                default_value: warmup.aggression.unwrap_or(1.0),
                // istiod's: a key no runtime sets.
                runtime_key: "(".into(),
            }),
            min_weight_percent: Some(Percent {
                value: warmup.minimum_percent.unwrap_or(10.0),
            }),
        }),
        (None, Some(window)) => Some(SlowStartConfig {
            slow_start_window: Some(duration(window)),
            ..Default::default()
        }),
        (None, None) => None,
    }
}

fn ring_size(minimum: u64) -> LbConfig {
    LbConfig::RingHashLbConfig(RingHashLbConfig {
        minimum_ring_size: Some(UInt64Value { value: minimum }),
        hash_function: HashFunction::XxHash as i32,
        ..Default::default()
    })
}

/// Circuit breakers from the connection pool; returns the common HTTP options it sets.
pub(super) fn apply_connection_pool(
    cluster: &mut Cluster,
    cp: Option<&ConnectionPoolSettings>,
    mesh_keepalive: Option<Keepalive>,
) -> Option<HttpProtocolOptions> {
    let mut common = None;
    let mut thresholds = Thresholds::default();
    let u32v = |v: i32| (v > 0).then_some(UInt32Value { value: v as u32 });
    let keepalive = match cp
        .and_then(|cp| cp.tcp.as_ref())
        .and_then(|t| t.tcp_keepalive.as_ref())
    {
        Some(rule) => Some(mesh_keepalive.unwrap_or_default().under(rule)),
        None => mesh_keepalive,
    };
    cluster.upstream_connection_options = keepalive.map(Keepalive::envoy);
    if let Some(cp) = cp {
        if let Some(tcp) = &cp.tcp {
            thresholds.max_connections = u32v(tcp.max_connections);
            if let Some(t) = &tcp.connect_timeout {
                cluster.connect_timeout = Some(duration(t));
            }
        }
        let http = cp.http.as_ref();
        let tcp = cp.tcp.as_ref();
        if let Some(http) = http {
            thresholds.max_pending_requests = u32v(http.http1_max_pending_requests);
            thresholds.max_requests = u32v(http.http2_max_requests);
            thresholds.max_retries = u32v(http.max_retries);
        }
        // Idle timeout (HTTP's, else TCP's), requests per connection, connection lifetime; any
        // HTTP/2 setting makes the options too (empty for HTTP/1, as istiod's).
        let idle_timeout = http
            .and_then(|h| h.idle_timeout.as_ref())
            .or_else(|| tcp.and_then(|t| t.idle_timeout.as_ref()));
        let per_connection = http.map_or(0, |h| h.max_requests_per_connection);
        let lifetime = tcp.and_then(|t| t.max_connection_duration.as_ref());
        let http2 =
            http.is_some_and(|h| h.max_concurrent_streams > 0 || h.http2_keep_alive.is_some());
        if idle_timeout.is_some() || per_connection > 0 || lifetime.is_some() || http2 {
            common = Some(HttpProtocolOptions {
                idle_timeout: idle_timeout.map(duration),
                max_requests_per_connection: u32v(per_connection),
                max_connection_duration: lifetime.map(duration),
                ..Default::default()
            });
        }
    }
    // Istio sets the limits to the maximum unless configured, so Envoy's low defaults never cut
    // traffic by surprise.
    let max = unlimited();
    thresholds.max_connections = thresholds.max_connections.or(max.max_connections);
    thresholds.max_pending_requests = thresholds.max_pending_requests.or(max.max_pending_requests);
    thresholds.max_requests = thresholds.max_requests.or(max.max_requests);
    thresholds.max_retries = thresholds.max_retries.or(max.max_retries);
    cluster.circuit_breakers = Some(CircuitBreakers {
        thresholds: vec![thresholds],
        ..Default::default()
    });
    common
}

/// Circuit breakers at the maximum: Envoy's defaults (1024 connections, pending and active
/// requests, 3 retries) would refuse traffic under load that istiod's proxies pass.
fn unlimited() -> Thresholds {
    let max = Some(UInt32Value { value: u32::MAX });
    Thresholds {
        max_connections: max,
        max_pending_requests: max,
        max_requests: max,
        max_retries: max,
        ..Default::default()
    }
}

/// As [`unlimited`], as a cluster's field.
pub(super) fn unlimited_circuit_breakers() -> Option<CircuitBreakers> {
    Some(CircuitBreakers {
        thresholds: vec![unlimited()],
        ..Default::default()
    })
}

/// A passthrough cluster's HTTP upstream: the protocol the client spoke, idle connections closed
/// after 5 minutes, as istiod sets them.
pub(super) fn passthrough_http_options(
    preserve_case: bool,
) -> std::collections::HashMap<String, envoy_types::pb::google::protobuf::Any> {
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
        UpstreamProtocolOptions, UseDownstreamHttpConfig,
    };
    let options = envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions {
        common_http_protocol_options: Some(HttpProtocolOptions {
            idle_timeout: Some(Duration {
                seconds: 300,
                nanos: 0,
            }),
            ..Default::default()
        }),
        upstream_protocol_options: Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(
            UseDownstreamHttpConfig {
                http_protocol_options: Some(http1_options(preserve_case)),
                http2_protocol_options: Some(Default::default()),
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    [(HTTP_PROTOCOL_OPTIONS.to_string(), pack_any(options))].into()
}

pub(super) fn outlier_detection(od: &IstioOutlier) -> OutlierDetection {
    let u32v = |v: u32| Some(UInt32Value { value: v });
    let mut out = OutlierDetection {
        interval: od.interval.as_ref().map(duration),
        base_ejection_time: od.base_ejection_time.as_ref().map(duration),
        max_ejection_percent: (od.max_ejection_percent > 0).then_some(UInt32Value {
            value: od.max_ejection_percent as u32,
        }),
        split_external_local_origin_errors: od.split_external_local_origin_errors,
        ..Default::default()
    };
    if let Some(n) = od.consecutive_5xx_errors {
        out.consecutive_5xx = u32v(n);
        out.enforcing_consecutive_5xx = u32v(if n > 0 { 100 } else { 0 });
    } else if od.consecutive_errors > 0 {
        out.consecutive_5xx = u32v(od.consecutive_errors as u32);
    } else {
        out.enforcing_consecutive_5xx = u32v(0);
    }
    if let Some(n) = od.consecutive_gateway_errors {
        out.consecutive_gateway_failure = u32v(n);
        out.enforcing_consecutive_gateway_failure = u32v(if n > 0 { 100 } else { 0 });
    }
    if let Some(n) = od.consecutive_local_origin_failures {
        out.consecutive_local_origin_failure = u32v(n);
        out.enforcing_consecutive_local_origin_failure = u32v(100);
    }
    // Istio turns success-rate ejection off.
    out.enforcing_success_rate = u32v(0);
    out
}
