//! CDS: one outbound cluster per service port (`outbound|<port>||<host>`) and per DestinationRule
//! subset (`outbound|<port>|<subset>|<host>`), with the DestinationRule's traffic policy (load
//! balancer, connection pool as circuit breakers, outlier detection, client TLS), and the special
//! clusters (`PassthroughCluster`, `BlackHoleCluster`, `InboundPassthroughCluster`). The HTTP a
//! cluster speaks upstream is decided as istiod decides it (see [`Upstream`]).

use envoy_types::pb::envoy::config::cluster::v3::circuit_breakers::Thresholds;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbConfig, LbPolicy, RingHashLbConfig,
    TransportSocketMatch, ring_hash_lb_config::HashFunction,
};
use envoy_types::pb::envoy::config::cluster::v3::{
    CircuitBreakers, Cluster, OutlierDetection, UpstreamConnectionOptions,
};
use envoy_types::pb::envoy::config::core::v3::{
    BindConfig, HealthStatus, HealthStatusSet, HttpProtocolOptions, SocketAddress, TcpKeepalive,
    TransportSocket, UpstreamHttpProtocolOptions, socket_address, transport_socket::ConfigType,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, TlsParameters, UpstreamTlsContext,
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    tls_parameters::TlsProtocol,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::{Duration, UInt32Value, UInt64Value};
use pasa_istio::destination_rule::{
    ClientTlsMode, ClientTlsSettings, ConnectionPoolSettings, DestinationRule,
    OutlierDetection as IstioOutlier, TrafficPolicy,
};
use pasa_istio::destination_rule::{H2UpgradePolicy, HttpSettings, LoadBalancerSettings, SimpleLb};

use envoy_types::util::pack_any;

use pasa_istio::common::Protocol;

use pasa_istio::node::ProxyType;

use super::builders::{
    ads, duration, field_len, grpc_ads, http1_options, length_delimited, string_field,
};
use super::endpoint;
use super::metadata;
use super::{Generator, names, sds};
use crate::model::authn::PeerModes;
use crate::model::proxy::ProxyBuild;
use crate::model::registry::{Config, Resolution, Service, ServicePort};
use crate::model::secrets;

/// Istio's default connect timeout (`connectTimeout` in MeshConfig).
const CONNECT_TIMEOUT: Duration = Duration {
    seconds: 10,
    nanos: 0,
};

/// The traffic policy that applies to one cluster, as istiod merges it: a DestinationRule's
/// top-level policy, then the subset's, the subset's fields (load balancer, connection pool,
/// outlier detection, TLS) replacing those it sets. A policy's port-level settings for the port
/// stand for that whole policy: they inherit nothing from it, and what they leave out is left to
/// the defaults (and a subset's replace all four fields).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Policy {
    pub load_balancer: Option<LoadBalancerSettings>,
    pub connection_pool: Option<ConnectionPoolSettings>,
    pub outlier_detection: Option<IstioOutlier>,
    pub tls: Option<ClientTlsSettings>,
    /// The rule selects workloads (`workloadSelector`).
    pub selects_workloads: bool,
}

impl Policy {
    pub(super) fn of(dr: Option<&DestinationRule>, subset: Option<&str>, port: u32) -> Policy {
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
    fn sends_unhealthy(&self) -> bool {
        self.outlier_detection
            .as_ref()
            .is_none_or(|o| o.min_health_percent <= 0)
    }

    /// The TLS it originates (SIMPLE or MUTUAL), as istiod applies it. A sidecar does not take
    /// a credential by name from a rule without a workload selector (istiod leaves TLS out
    /// there, so that a credential meant for an egress gateway does not hold up every sidecar
    /// the rule reaches).
    fn originated(&self, sidecar: bool) -> Option<&ClientTlsSettings> {
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

/// One cluster of a service as built: its name, its encoding and, for an EDS cluster, its
/// encoded load assignment.
pub(super) struct BuiltCluster {
    pub name: String,
    /// `None` when only the load assignments were asked for.
    pub encoded: Option<Vec<u8>>,
    /// How many bytes at the end of `encoded` are its `metadata` field (encoded in key order,
    /// see [`metadata::cluster_field`]).
    pub metadata_len: usize,
    pub assignment: Option<Vec<u8>>,
}

/// Clusters (and, for EDS clusters, their load assignments) of one service: per port the default
/// cluster and one per subset of its DestinationRule. A router cannot forward to the original
/// destination (it is itself the destination of its clients' connections), so it reaches a
/// headless service's endpoints by EDS, as istiod builds it.
///
/// The clusters of a port differ in a few fields of their own (name, EDS service name, inline
/// endpoints, the SNI of their transport sockets); the rest follows from the port and the traffic
/// policy, and subsets without a policy of their own share the default cluster's. So each cluster
/// is encoded as its own fields followed by the shared fields, encoded once per port and policy:
/// a protobuf parser merges the two (they set disjoint fields) into the message built whole.
pub(super) fn service_clusters(
    service: &Service,
    dr: Option<&Config<DestinationRule>>,
    generator: Generator,
    (proxy, build, settings): (ProxyType, ProxyBuild, &ClusterSettings),
    (clusters, out): (bool, &mut Vec<BuiltCluster>),
) {
    let as_eds;
    let service = if proxy == ProxyType::Router && service.resolution == Resolution::Passthrough {
        as_eds = Service {
            resolution: Resolution::ClientSideLb,
            ..service.clone()
        };
        &as_eds
    } else {
        service
    };
    // The DestinationRule that shaped the clusters, as istiod records it, and, for Istio's
    // stats, the service they are for.
    let service_labels: Vec<metadata::ServiceLabel> = (build == ProxyBuild::Istio)
        .then(|| metadata::ServiceLabel::of(service))
        .into_iter()
        .collect();
    let external = build == ProxyBuild::Istio && service.external;
    // gRPC clients read no metadata; istiod gives them none.
    let grpc = generator == Generator::Grpc;
    let metadata = if grpc {
        Vec::new()
    } else {
        metadata::cluster_field(
            dr.map(|dr| &dr.meta),
            &service_labels,
            external,
            None,
            false,
        )
    };
    let at = endpoint::Where {
        namespace: &service.namespace,
        workload_cluster: (build == ProxyBuild::Istio).then_some(settings.cluster_id.as_str()),
        peer_modes: &settings.peer_modes,
    };
    let mut target = Target {
        service,
        identities: std::cell::OnceCell::new(),
        mutual: MutualContexts::new(build),
        generator,
        settings,
        at,
        sidecar: proxy != ProxyType::Router,
    };
    for port in &service.ports {
        // Built by the first cluster of the port that reads endpoints, shared by the others.
        let endpoints = std::cell::OnceCell::new();
        let mut shared: Vec<((Policy, bool), Shared)> = Vec::new();
        let mut subsets: Vec<Option<&str>> = vec![None];
        if let Some(dr) = dr {
            subsets.extend(dr.spec.subsets.iter().map(|s| Some(s.name.as_str())));
        }
        for subset in subsets {
            let labels = subset.and_then(|name| {
                dr.and_then(|d| d.spec.subsets.iter().find(|s| s.name == name))
                    .map(|s| &s.labels)
            });
            let name =
                names::outbound_cluster(port.number, subset.unwrap_or(""), &service.hostname);
            let policy = Policy::of(dr.map(|d| &d.spec), subset, port.number);
            let assignment = (service.resolution == Resolution::ClientSideLb).then(|| {
                endpoints
                    .get_or_init(|| endpoint::PortEndpoints::new(service, port, at))
                    .assignment(&name, labels, policy.sends_unhealthy())
            });
            if !clusters {
                out.push(BuiltCluster {
                    name,
                    encoded: None,
                    metadata_len: 0,
                    assignment,
                });
                continue;
            }
            // The default cluster of a service with persistent sessions keeps draining
            // endpoints for the sessions on them, as istiod's does.
            let keeps_draining = subset.is_none() && service.persistent_session.is_some();
            let key = (policy, keeps_draining);
            let at = match shared.iter().position(|(k, _)| *k == key) {
                Some(at) => at,
                None => {
                    let part = target.shared(port, &key.0, keeps_draining);
                    shared.push((key, part));
                    shared.len() - 1
                }
            };
            let ((policy, _), part) = &shared[at];
            // A subset's cluster also names its subset; one originating TLS of its own says so.
            let alpn_override = policy
                .tls
                .as_ref()
                .is_some_and(|t| matches!(t.mode, ClientTlsMode::Simple | ClientTlsMode::Mutual));
            let own_metadata = (!grpc && (subset.is_some() || alpn_override)).then(|| {
                metadata::cluster_field(
                    dr.map(|dr| &dr.meta),
                    &service_labels,
                    external,
                    subset,
                    alpn_override,
                )
            });
            let metadata = own_metadata.as_deref().unwrap_or(&metadata);
            let encoded = target.own(
                Own {
                    name: &name,
                    port,
                    subset: subset.unwrap_or(""),
                    policy,
                    shared: part,
                    metadata,
                },
                (&endpoints, labels),
            );
            out.push(BuiltCluster {
                name,
                encoded: Some(encoded),
                metadata_len: metadata.len(),
                assignment,
            });
        }
    }
}

/// The fields the clusters of one port and traffic policy share, encoded, and what that decides
/// for each cluster's own fields.
struct Shared {
    encoded: Vec<u8>,
    /// Endpoints by EDS (a passthrough load balancer turns an EDS cluster into an original
    /// destination one).
    eds: bool,
    /// Istio's auto mTLS: transport socket matches by the endpoint's `tlsMode`.
    auto_mtls: bool,
}

/// What one cluster sets for itself.
struct Own<'a> {
    name: &'a str,
    port: &'a ServicePort,
    subset: &'a str,
    policy: &'a Policy,
    shared: &'a Shared,
    /// The encoded `metadata` field (see [`metadata::cluster_field`]).
    metadata: &'a [u8],
}

/// The service whose clusters are built, with what its clusters share.
struct Target<'s> {
    service: &'s Service,
    /// Its workloads' SPIFFE IDs, worked out once if a cluster pins them.
    identities: std::cell::OnceCell<Vec<String>>,
    mutual: MutualContexts,
    generator: Generator,
    settings: &'s ClusterSettings,
    /// Where its endpoints are (see [`endpoint::Where`]).
    at: endpoint::Where<'s>,
    /// For a sidecar (which detects protocols), not a router.
    sidecar: bool,
}

/// What clusters take from the proxy and the mesh config, as istiod sets them up:
///
/// - how DNS clusters resolve: the address family of the proxy's own addresses (IPv4 only
///   unless the proxy has only IPv6 ones), re-resolved every `dnsRefreshRate` of the mesh config
///   (60s by default; Envoy's own is 5s) or the record's TTL, with 100 ms of jitter, through
///   c-ares with at most 100 UDP queries per connection;
/// - the trust domain endpoints' service accounts are identities of, pinned by mutual TLS
///   (the mesh config's `trustDomain`, `cluster.local` by default), and its aliases;
/// - whether HTTP/1.1 to services is upgraded to HTTP/2 (the mesh config's `h2UpgradePolicy`),
///   and the TCP keepalive of every upstream connection (its `tcpKeepalive`, under what a
///   DestinationRule sets).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ClusterSettings {
    family: i32,
    refresh: Duration,
    trust_domain: String,
    trust_domain_aliases: Vec<String>,
    /// The proxy's cluster: the one its endpoints' workloads are named in.
    cluster_id: String,
    /// Whether destinations take mutual TLS on their ports.
    peer_modes: PeerModes,
    /// HTTP/1 header names keep their case upstream (see [`super::builders::http1_options`]).
    pub(super) preserve_case: bool,
    /// The mesh config's `h2UpgradePolicy` is `UPGRADE`.
    h2_upgrade: bool,
    /// The mesh config's `tcpKeepalive`.
    tcp_keepalive: Option<Keepalive>,
}

/// TCP keepalive as Envoy takes it: probes, and the idle time and interval in whole seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
struct Keepalive {
    probes: Option<u32>,
    time: Option<u32>,
    interval: Option<u32>,
}

impl Keepalive {
    /// `over`'s settings where it gives them, `self`'s elsewhere (istiod lays a
    /// DestinationRule's over the mesh config's, field by field).
    fn under(self, over: &pasa_istio::destination_rule::TcpKeepalive) -> Keepalive {
        let seconds = |d: &Option<pasa_istio::common::Duration>| {
            d.as_ref().map(|d| u32::try_from(d.seconds).unwrap_or(0))
        };
        Keepalive {
            probes: (over.probes > 0).then_some(over.probes).or(self.probes),
            time: seconds(&over.time).or(self.time),
            interval: seconds(&over.interval).or(self.interval),
        }
    }

    fn envoy(self) -> UpstreamConnectionOptions {
        let u32v = |v: Option<u32>| v.map(|value| UInt32Value { value });
        UpstreamConnectionOptions {
            // SO_KEEPALIVE, the OS's timings but those given.
            tcp_keepalive: Some(TcpKeepalive {
                keepalive_probes: u32v(self.probes),
                keepalive_time: u32v(self.time),
                keepalive_interval: u32v(self.interval),
            }),
            ..Default::default()
        }
    }
}

impl ClusterSettings {
    pub(crate) fn of(
        ips: &[std::net::IpAddr],
        cluster_id: &str,
        mesh: Option<&pasa_istio::mesh_config::MeshConfig>,
        peer_modes: PeerModes,
        preserve_case: bool,
    ) -> ClusterSettings {
        use envoy_types::pb::envoy::config::cluster::v3::cluster::DnsLookupFamily;
        let family = if !ips.is_empty() && ips.iter().all(std::net::IpAddr::is_ipv6) {
            DnsLookupFamily::V6Only
        } else {
            DnsLookupFamily::V4Only
        };
        let refresh = mesh
            .and_then(|m| m.positive_duration_nanos("dnsRefreshRate"))
            .unwrap_or(60_000_000_000);
        let tcp_keepalive = mesh
            .and_then(|m| m.other.get("tcpKeepalive"))
            .and_then(|k| {
                serde_json::from_value::<pasa_istio::destination_rule::TcpKeepalive>(k.clone()).ok()
            })
            .map(|k| Keepalive::default().under(&k));
        ClusterSettings {
            h2_upgrade: mesh
                .and_then(|m| m.other.get("h2UpgradePolicy"))
                .is_some_and(|p| p == "UPGRADE"),
            tcp_keepalive,
            trust_domain: mesh
                .and_then(|m| m.trust_domain.clone())
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| "cluster.local".into()),
            trust_domain_aliases: mesh
                .map(|m| m.trust_domain_aliases.clone())
                .unwrap_or_default(),
            family: family as i32,
            refresh: super::builders::nanos(refresh),
            cluster_id: cluster_id.to_string(),
            peer_modes,
            preserve_case,
        }
    }

    /// Puts these settings on `cluster`, a DNS cluster.
    #[allow(deprecated)] // istiod's fields
    fn apply(&self, cluster: &mut Cluster) {
        use envoy_types::pb::envoy::extensions::network::dns_resolver::cares::v3::CaresDnsResolverConfig;
        cluster.dns_lookup_family = self.family;
        cluster.dns_refresh_rate = Some(self.refresh);
        cluster.respect_dns_ttl = true;
        cluster.dns_jitter = Some(Duration {
            seconds: 0,
            nanos: 100_000_000,
        });
        cluster.typed_dns_resolver_config = Some(
            envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig {
                name: "envoy.network.dns_resolver.cares".into(),
                typed_config: Some(pack_any(CaresDnsResolverConfig {
                    udp_max_queries: Some(UInt32Value { value: 100 }),
                    ..Default::default()
                })),
            },
        );
    }
}

/// `service`'s SPIFFE identities under `settings`, worked out once into `cell` (a field of a
/// [`Target`], borrowed alone so that its other fields stay free).
fn identities<'c>(
    cell: &'c std::cell::OnceCell<Vec<String>>,
    service: &Service,
    settings: &ClusterSettings,
) -> &'c [String] {
    cell.get_or_init(|| service.identities(&settings.trust_domain, &settings.trust_domain_aliases))
}

impl<'s> Target<'s> {
    fn identities(&self) -> &[String] {
        identities(&self.identities, self.service, self.settings)
    }

    /// The HTTP the clusters of `port` under `policy` speak upstream.
    fn upstream(&self, port: &ServicePort, policy: &Policy) -> Upstream {
        Upstream::of(
            port.protocol,
            self.sidecar,
            self.settings.preserve_case,
            Some(self.settings.h2_upgrade),
            http_settings(policy.connection_pool.as_ref()),
        )
    }

    /// The fields every cluster of `port` under `policy` has: discovery type, timeouts, load
    /// balancer, circuit breakers, outlier detection, upstream HTTP options; and, where
    /// `keeps_draining`, the endpoint statuses a session may still be sent to.
    fn shared(&self, port: &ServicePort, policy: &Policy, keeps_draining: bool) -> Shared {
        let service = self.service;
        if self.generator == Generator::Grpc && service.resolution == Resolution::ClientSideLb {
            return grpc_shared(policy, keeps_draining);
        }
        let mut cluster = Cluster {
            connect_timeout: Some(CONNECT_TIMEOUT),
            ..Default::default()
        };
        if keeps_draining {
            keep_draining(&mut cluster);
        }
        let kind = match service.resolution {
            Resolution::ClientSideLb => DiscoveryType::Eds,
            Resolution::Dns => DiscoveryType::StrictDns,
            Resolution::DnsRoundRobin => DiscoveryType::LogicalDns,
            Resolution::Passthrough | Resolution::DynamicDns => {
                cluster.lb_policy = LbPolicy::ClusterProvided as i32;
                DiscoveryType::OriginalDst
            }
        };
        cluster.cluster_discovery_type = Some(ClusterDiscoveryType::Type(kind as i32));
        if matches!(kind, DiscoveryType::StrictDns | DiscoveryType::LogicalDns) {
            self.settings.apply(&mut cluster);
        }
        if kind != DiscoveryType::OriginalDst {
            apply_load_balancer(&mut cluster, policy.load_balancer.as_ref(), self.generator);
            // No panic mode (Envoy's sends to every endpoint once half are unhealthy), as
            // istiod: it sends unready endpoints too, which panic mode would pick.
            cluster
                .common_lb_config
                .get_or_insert_default()
                .healthy_panic_threshold = Some(Percent { value: 0.0 });
        }
        let common = apply_connection_pool(
            &mut cluster,
            policy.connection_pool.as_ref(),
            self.settings.tcp_keepalive,
        );
        if let Some(od) = &policy.outlier_detection {
            cluster.outlier_detection = Some(outlier_detection(od));
            if od.min_health_percent >= 0 && kind != DiscoveryType::OriginalDst {
                cluster
                    .common_lb_config
                    .get_or_insert_default()
                    .healthy_panic_threshold = Some(Percent {
                    value: f64::from(od.min_health_percent),
                });
            }
        }
        if let Some(options) = upstream_http_options(
            common,
            self.upstream(port, policy),
            http_settings(policy.connection_pool.as_ref()),
            auto_tls(policy.originated(self.sidecar)),
        ) {
            cluster
                .typed_extension_protocol_options
                .insert(HTTP_PROTOCOL_OPTIONS.into(), pack_any(options));
        }
        Shared {
            eds: cluster.cluster_discovery_type
                == Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
            auto_mtls: policy.tls.is_none()
                && self.generator == Generator::Envoy
                && !service.external
                // Not to original destinations (istiod's headless services and passthrough)
                // nor to dynamic forward proxies.
                && matches!(
                    service.resolution,
                    Resolution::ClientSideLb | Resolution::Dns | Resolution::DnsRoundRobin
                ),
            encoded: prost::Message::encode_to_vec(&cluster),
        }
    }

    /// One cluster's own fields, encoded and followed by the shared ones.
    fn own(
        &mut self,
        own: Own<'_>,
        (endpoints, labels): (
            &std::cell::OnceCell<endpoint::PortEndpoints<'s>>,
            Option<&std::collections::BTreeMap<String, String>>,
        ),
    ) -> Vec<u8> {
        let Own {
            name,
            port,
            subset,
            policy,
            shared,
            metadata,
        } = own;
        let service = self.service;
        let at = self.at;
        let endpoints =
            || endpoints.get_or_init(|| endpoint::PortEndpoints::new(service, port, at));
        let mut cluster = Cluster {
            name: name.to_string(),
            alt_stat_name: names::delimited_stats(name),
            ..Default::default()
        };
        match service.resolution {
            Resolution::ClientSideLb => {
                if shared.eds {
                    cluster.eds_cluster_config = Some(EdsClusterConfig {
                        eds_config: Some(match self.generator {
                            Generator::Envoy => ads(),
                            Generator::Grpc => grpc_ads(),
                        }),
                        service_name: name.to_string(),
                    });
                }
            }
            Resolution::Dns | Resolution::DnsRoundRobin => {
                cluster.load_assignment = Some(endpoints().dns(name, labels, service, port, at));
            }
            Resolution::Passthrough | Resolution::DynamicDns => {}
        }
        // The transport sockets, encoded (the ISTIO_MUTUAL ones are assembled from pieces).
        let socket = policy.tls.as_ref().and_then(|tls| match self.generator {
            Generator::Envoy => self.upstream_tls(tls, port, subset, policy),
            Generator::Grpc => super::grpc::upstream_tls(tls.mode, self.identities())
                .map(|s| prost::Message::encode_to_vec(&s)),
        });
        let h2 = self.upstream(port, policy) == Upstream::Http2;
        let matches = shared
            .auto_mtls
            .then(|| self.mutual_socket(port.number, subset, h2));
        // Sized exactly: the encoding is kept as long as it is served.
        let total = prost::Message::encoded_len(&cluster)
            + socket
                .as_ref()
                .map_or(0, |s| field_len(TRANSPORT_SOCKET, s.len()))
            + matches.as_ref().map_or(0, |s| auto_mtls_len(s.len()))
            + shared.encoded.len()
            + metadata.len();
        let mut encoded = Vec::with_capacity(total);
        prost::Message::encode_raw(&cluster, &mut encoded);
        if let Some(socket) = socket {
            length_delimited(TRANSPORT_SOCKET, socket.len(), &mut encoded);
            encoded.extend_from_slice(&socket);
        }
        if let Some(socket) = matches {
            auto_mtls(&socket, &mut encoded);
        }
        encoded.extend_from_slice(&shared.encoded);
        encoded.extend_from_slice(metadata);
        debug_assert_eq!(encoded.len(), total);
        encoded
    }

    /// The ISTIO_MUTUAL transport socket of auto mTLS: pinned to the service's identities;
    /// offering HTTP/2 by ALPN for an `h2` port.
    fn mutual_socket(&mut self, port: u32, subset: &str, h2: bool) -> Vec<u8> {
        let sni = names::istio_mutual_sni(port, subset, &self.service.hostname);
        let sans = identities(&self.identities, self.service, self.settings);
        self.mutual.socket(sans, &sni, h2)
    }

    /// Client TLS of a DestinationRule as Envoy's upstream TLS transport socket. ISTIO_MUTUAL
    /// verifies the peer against the mesh root and pins it to the DestinationRule's
    /// `subjectAltNames`, else to the service's `identities` (its workloads' SPIFFE IDs), as
    /// istiod does.
    fn upstream_tls(
        &mut self,
        tls: &ClientTlsSettings,
        port: &ServicePort,
        subset: &str,
        policy: &Policy,
    ) -> Option<Vec<u8>> {
        let h2 = self.upstream(port, policy) == Upstream::Http2;
        let port = port.number;
        let hostname = &self.service.hostname;
        let mut common = CommonTlsContext::default();
        let sni;
        match tls.mode {
            ClientTlsMode::Disable => return None,
            ClientTlsMode::IstioMutual => {
                let sans = if tls.subject_alt_names.is_empty() {
                    identities(&self.identities, self.service, self.settings)
                } else {
                    &tls.subject_alt_names
                };
                let sni = names::istio_mutual_sni(port, subset, hostname);
                return Some(self.mutual.socket(sans, &sni, h2));
            }
            _ => {
                policy.originated(self.sidecar)?;
                // Names to pin the server to: the rule's, else those a ServiceEntry states.
                let sans = if tls.subject_alt_names.is_empty() && !self.service.kubernetes {
                    identities(&self.identities, self.service, self.settings)
                } else {
                    &tls.subject_alt_names
                };
                #[allow(deprecated)] // istiod's field: any SAN type, matched exactly
                let pinned = |crl: &str| CertificateValidationContext {
                    match_subject_alt_names: exact_sans(sans),
                    crl: (!crl.is_empty()).then(|| file(crl)),
                    ..Default::default()
                };
                let verify = tls.insecure_skip_verify != Some(true);
                if !tls.credential_name.is_empty() {
                    // SIMPLE only verifies the server (the `-cacert`); MUTUAL also presents the
                    // credential's own certificate.
                    if tls.mode == ClientTlsMode::Mutual {
                        common.tls_certificate_sds_secret_configs =
                            vec![sds::credential(&tls.credential_name)];
                    }
                    common.validation_context_type = verify.then(|| {
                        ValidationContextType::CombinedValidationContext(
                            CombinedCertificateValidationContext {
                                default_validation_context: Some(pinned("")),
                                validation_context_sds_secret_config: Some(sds::credential_ca(
                                    &tls.credential_name,
                                )),
                                ..Default::default()
                            },
                        )
                    });
                } else {
                    // Files of the pod, served over SDS (read again as they change), as istiod
                    // names them: the client certificate `file-cert:<cert>~<key>`, the CA
                    // `file-root:<ca>`, the system's roots when none is named (the server is
                    // always verified, unless `insecureSkipVerify`), pinned to the SANs given.
                    if tls.mode == ClientTlsMode::Mutual && !tls.client_certificate.is_empty() {
                        common.tls_certificate_sds_secret_configs =
                            vec![sds::from_istio_agent(&format!(
                                "{}{}~{}",
                                secrets::FILE_CERT_PREFIX,
                                tls.client_certificate,
                                tls.private_key
                            ))];
                    }
                    common.validation_context_type = Some(if verify {
                        let ca = if tls.ca_certificates.is_empty() {
                            secrets::SYSTEM_ROOTS
                        } else {
                            &tls.ca_certificates
                        };
                        ValidationContextType::CombinedValidationContext(
                            CombinedCertificateValidationContext {
                                default_validation_context: Some(pinned(&tls.ca_crl)),
                                validation_context_sds_secret_config: Some(sds::from_istio_agent(
                                    &format!("{}{ca}", secrets::FILE_ROOT_PREFIX),
                                )),
                                ..Default::default()
                            },
                        )
                    } else {
                        ValidationContextType::ValidationContext(Default::default())
                    });
                }
                common.tls_params = Some(TlsParameters {
                    tls_minimum_protocol_version: TlsProtocol::TlSv12 as i32,
                    tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
                    ..Default::default()
                });
                if h2 {
                    common.alpn_protocols = vec!["h2".into()];
                }
                // None given: Envoy takes the request's host (see `auto_tls`).
                sni = tls.sni.clone();
            }
        }
        let context = UpstreamTlsContext {
            common_tls_context: Some(common),
            sni,
            ..Default::default()
        };
        Some(prost::Message::encode_to_vec(&TransportSocket {
            name: TLS_SOCKET.into(),
            config_type: Some(ConfigType::TypedConfig(pack_any(context))),
        }))
    }
}

/// The fields istiod's gRPC generator gives the clusters of a port under `policy`: EDS; the
/// load balancer when gRPC implements it (least request, consistent hashing; round robin, gRPC's
/// own default, is left unsaid, and so is what gRPC lacks); of the connection pool only
/// `http2MaxRequests`, gRPC's one circuit breaker (gRFC A32). No outlier detection, timeouts or
/// HTTP options: istiod sends none. TLS is each cluster's own.
fn grpc_shared(policy: &Policy, keeps_draining: bool) -> Shared {
    let mut cluster = Cluster {
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        ..Default::default()
    };
    if keeps_draining {
        keep_draining(&mut cluster);
    }
    if let Some(lb) = &policy.load_balancer {
        if lb.consistent_hash().is_some() {
            apply_load_balancer(&mut cluster, Some(lb), Generator::Grpc);
        } else if matches!(
            lb.simple(),
            Some(SimpleLb::LeastConn | SimpleLb::LeastRequest)
        ) {
            cluster.lb_policy = LbPolicy::LeastRequest as i32;
        }
    }
    let max_requests = policy
        .connection_pool
        .as_ref()
        .and_then(|cp| cp.http.as_ref())
        .map_or(0, |http| http.http2_max_requests);
    if max_requests > 0 {
        cluster.circuit_breakers = Some(CircuitBreakers {
            thresholds: vec![Thresholds {
                max_requests: Some(UInt32Value {
                    value: max_requests as u32,
                }),
                ..Default::default()
            }],
            ..Default::default()
        });
    }
    Shared {
        eds: true,
        auto_mtls: false,
        encoded: prost::Message::encode_to_vec(&cluster),
    }
}

/// The statuses of the endpoints a request may still be sent to when a persistent session
/// names one (Envoy's host override), as istiod sets them for a service with persistent
/// sessions: DRAINING besides those Envoy takes by default (HEALTHY, UNKNOWN, DEGRADED). Envoy
/// keeps such endpoints (as UNHEALTHY) instead of dropping them, and balances no new request to
/// them.
fn keep_draining(cluster: &mut Cluster) {
    cluster
        .common_lb_config
        .get_or_insert_default()
        .override_host_status = Some(HealthStatusSet {
        statuses: [
            HealthStatus::Healthy,
            HealthStatus::Draining,
            HealthStatus::Unknown,
            HealthStatus::Degraded,
        ]
        .map(|s| s as i32)
        .to_vec(),
    });
}

/// `Cluster.transport_socket` and `Cluster.transport_socket_matches`, for clusters assembled from
/// encoded pieces.
const TRANSPORT_SOCKET: u32 = 24;
const TRANSPORT_SOCKET_MATCHES: u32 = 43;
/// `TransportSocketMatch.transport_socket`.
const MATCH_SOCKET: u32 = 3;

const TLS_SOCKET: &str = "envoy.transport_sockets.tls";

/// Istio's auto mTLS for a cluster without TLS settings: endpoints whose workload has a sidecar
/// (`tlsMode: istio` endpoint metadata) are reached over ISTIO_MUTUAL (`socket`, encoded), the
/// others in plaintext. Appends the cluster's `transport_socket_matches`.
fn auto_mtls(socket: &[u8], out: &mut Vec<u8>) {
    let head = &*TLS_ISTIO_HEAD;
    length_delimited(
        TRANSPORT_SOCKET_MATCHES,
        head.len() + field_len(MATCH_SOCKET, socket.len()),
        out,
    );
    out.extend_from_slice(head);
    length_delimited(MATCH_SOCKET, socket.len(), out);
    out.extend_from_slice(socket);
    out.extend_from_slice(&TLS_DISABLED);
}

/// The length of what [`auto_mtls`] appends for a socket of `socket` bytes.
fn auto_mtls_len(socket: usize) -> usize {
    field_len(
        TRANSPORT_SOCKET_MATCHES,
        TLS_ISTIO_HEAD.len() + field_len(MATCH_SOCKET, socket),
    ) + TLS_DISABLED.len()
}

/// The `tlsMode-istio` match without its transport socket, encoded.
static TLS_ISTIO_HEAD: std::sync::LazyLock<Vec<u8>> =
    std::sync::LazyLock::new(|| prost::Message::encode_to_vec(&tls_istio(None)));

/// The `tlsMode-disabled` match, encoded as a field of a cluster.
static TLS_DISABLED: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    prost::Message::encode_to_vec(&Cluster {
        transport_socket_matches: vec![tls_disabled()],
        ..Default::default()
    })
});

/// Auto mTLS's match for endpoints of workloads with a sidecar.
fn tls_istio(socket: Option<TransportSocket>) -> TransportSocketMatch {
    TransportSocketMatch {
        name: "tlsMode-istio".into(),
        r#match: Some(metadata::single("tlsMode", "istio")),
        transport_socket: socket,
    }
}

/// Auto mTLS's match for the other endpoints: plaintext.
fn tls_disabled() -> TransportSocketMatch {
    use envoy_types::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
    TransportSocketMatch {
        name: "tlsMode-disabled".into(),
        r#match: Some(Default::default()),
        transport_socket: Some(TransportSocket {
            name: "envoy.transport_sockets.raw_buffer".into(),
            config_type: Some(ConfigType::TypedConfig(pack_any(RawBuffer::default()))),
        }),
    }
}

/// ISTIO_MUTUAL upstream TLS contexts of one service's clusters, encoded once per set of
/// pinned SANs: the clusters differ only in SNI, so each transport socket is the encoded
/// common context followed by its SNI (the bytes encoding the whole message gives).
struct MutualContexts {
    build: ProxyBuild,
    encoded: Vec<MutualContext>,
}

/// One ISTIO_MUTUAL context: its pinned SANs, whether it offers HTTP/2, and the encoded
/// `UpstreamTlsContext` holding only the common context.
struct MutualContext {
    sans: Vec<String>,
    h2: bool,
    encoded: Vec<u8>,
}

impl MutualContexts {
    fn new(build: ProxyBuild) -> MutualContexts {
        MutualContexts {
            build,
            encoded: Vec::new(),
        }
    }

    /// The ISTIO_MUTUAL transport socket pinned to `sans`, with `sni`, offering HTTP/2 when
    /// `h2`: an encoded `TransportSocket` (name, then an `Any` of the `UpstreamTlsContext`).
    fn socket(&mut self, sans: &[String], sni: &str, h2: bool) -> Vec<u8> {
        let at = match self
            .encoded
            .iter()
            .position(|c| c.sans == sans && c.h2 == h2)
        {
            Some(at) => at,
            None => {
                let context = UpstreamTlsContext {
                    common_tls_context: Some(istio_mutual_common(sans, self.build, h2)),
                    ..Default::default()
                };
                self.encoded.push(MutualContext {
                    sans: sans.to_vec(),
                    h2,
                    encoded: prost::Message::encode_to_vec(&context),
                });
                self.encoded.len() - 1
            }
        };
        let context = &self.encoded[at].encoded;
        let (name, type_url) = &*SOCKET_HEAD;
        // Any.value: the context, then `sni` (UpstreamTlsContext field 2, after the common
        // context, field 1).
        let sni_len = if sni.is_empty() {
            0
        } else {
            field_len(2, sni.len())
        };
        let value = context.len() + sni_len;
        let any = type_url.len() + field_len(2, value);
        let mut out = Vec::with_capacity(name.len() + field_len(3, any));
        out.extend_from_slice(name);
        // TransportSocket.typed_config (3), an Any: type_url (1), value (2).
        length_delimited(3, any, &mut out);
        out.extend_from_slice(type_url);
        length_delimited(2, value, &mut out);
        out.extend_from_slice(context);
        string_field(2, sni, &mut out);
        out
    }
}

/// The encoded name field of a TLS transport socket, and the encoded type URL field of an `Any`
/// holding an `UpstreamTlsContext`.
static SOCKET_HEAD: std::sync::LazyLock<(Vec<u8>, Vec<u8>)> = std::sync::LazyLock::new(|| {
    use envoy_types::pb::google::protobuf::Any;
    let name = TransportSocket {
        name: TLS_SOCKET.into(),
        config_type: None,
    };
    let type_url = Any {
        type_url: <UpstreamTlsContext as prost::Name>::type_url(),
        value: Vec::new(),
    };
    (
        prost::Message::encode_to_vec(&name),
        prost::Message::encode_to_vec(&type_url),
    )
});

/// Matchers of a peer's SANs, each matched exactly (istiod's `match_subject_alt_names`).
pub(super) fn exact_sans(sans: &[String]) -> Vec<StringMatcher> {
    sans.iter()
        .map(|san| StringMatcher {
            match_pattern: Some(string_matcher::MatchPattern::Exact(san.clone())),
            ..Default::default()
        })
        .collect()
}

/// The common TLS context of ISTIO_MUTUAL: the workload certificate, and the mesh root with the
/// peer pinned to `sans`. Istio's proxy (`build`) also offers ALPN `istio-peer-exchange`, paired
/// with its clusters' metadata exchange filter; upstream Envoy does not (as istiod with the
/// exchange disabled): a server negotiating it writes its metadata in band first, which upstream
/// Envoy would pass to the application. An HTTP/2 cluster's also offers `h2`, as istiod's.
fn istio_mutual_common(sans: &[String], build: ProxyBuild, h2: bool) -> CommonTlsContext {
    #[allow(deprecated)] // istiod's field: any SAN type, matched exactly
    let pinned = CertificateValidationContext {
        match_subject_alt_names: exact_sans(sans),
        ..Default::default()
    };
    CommonTlsContext {
        tls_certificate_sds_secret_configs: vec![sds::from_istio_agent(
            secrets::WORKLOAD_CERTIFICATE,
        )],
        validation_context_type: Some(ValidationContextType::CombinedValidationContext(
            CombinedCertificateValidationContext {
                default_validation_context: Some(pinned),
                validation_context_sds_secret_config: Some(sds::from_istio_agent(secrets::ROOT_CA)),
                ..Default::default()
            },
        )),
        alpn_protocols: (build == ProxyBuild::Istio)
            .then_some("istio-peer-exchange")
            .into_iter()
            .chain(["istio"])
            .chain(h2.then_some("h2"))
            .map(String::from)
            .collect(),
        // TLS 1.3 where the server speaks it (Envoy's client default stops at 1.2), as istiod.
        tls_params: Some(TlsParameters {
            tls_minimum_protocol_version: TlsProtocol::TlSv12 as i32,
            tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn apply_load_balancer(
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
fn apply_connection_pool(
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
fn unlimited_circuit_breakers() -> Option<CircuitBreakers> {
    Some(CircuitBreakers {
        thresholds: vec![unlimited()],
        ..Default::default()
    })
}

/// A passthrough cluster's HTTP upstream: the protocol the client spoke, idle connections closed
/// after 5 minutes, as istiod sets them.
fn passthrough_http_options(
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

fn outlier_detection(od: &IstioOutlier) -> OutlierDetection {
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

fn file(path: &str) -> envoy_types::pb::envoy::config::core::v3::DataSource {
    use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
    envoy_types::pb::envoy::config::core::v3::DataSource {
        specifier: Some(Specifier::Filename(path.to_string())),
        ..Default::default()
    }
}

/// The key of a cluster's upstream HTTP options.
const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// The HTTP a cluster speaks upstream, worked out in istiod's order: from its port's protocol
/// (and whether HTTP/1 keeps header names' case); then, toward a service, the upgrade to
/// HTTP/2 (see [`upgrades`]), which only takes where nothing was said yet; then the rule's
/// `useClientProtocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upstream {
    /// Nothing said: HTTP/1.1 (explicitly so where other options are set).
    Unsaid,
    /// HTTP/1.1 keeping header names' case.
    Http1PreservingCase,
    /// HTTP/2, gRPC, gRPC-Web, or upgraded.
    Http2,
    /// What the client spoke (HTTP/1 keeping header names' case when `true`): a port whose
    /// protocol a sidecar detects, or a rule's `useClientProtocol`.
    Downstream(bool),
}

impl Upstream {
    /// For a port of `protocol` (`detects`: on a sidecar, which detects protocols; a router
    /// speaks HTTP/1 where it is not said), with the rule's HTTP settings `http`; toward a
    /// service, `mesh_upgrade` is the mesh config's upgrade (None for the local workload).
    fn of(
        protocol: Option<Protocol>,
        detects: bool,
        preserve_case: bool,
        mesh_upgrade: Option<bool>,
        http: Option<&HttpSettings>,
    ) -> Upstream {
        let mut chosen = match protocol {
            Some(Protocol::Http2 | Protocol::Grpc | Protocol::GrpcWeb) => Upstream::Http2,
            Some(p) if p.is_http() && preserve_case => Upstream::Http1PreservingCase,
            None if preserve_case => Upstream::Http1PreservingCase,
            _ => Upstream::Unsaid,
        };
        if protocol.is_none() && detects {
            chosen = Upstream::Downstream(preserve_case);
        }
        if chosen == Upstream::Unsaid
            && mesh_upgrade.is_some_and(|mesh| upgrades(protocol, mesh, http))
        {
            chosen = Upstream::Http2;
        }
        if http.is_some_and(|h| h.use_client_protocol) {
            chosen = Upstream::Downstream(chosen == Upstream::Http1PreservingCase);
        }
        chosen
    }
}

/// Whether HTTP/1.1 toward a service is upgraded to HTTP/2, as istiod decides it: never under
/// `useClientProtocol`; as the rule's `h2UpgradePolicy` says when it says (`UPGRADE` upgrades
/// any port); otherwise an HTTP port when the mesh config upgrades.
fn upgrades(protocol: Option<Protocol>, mesh: bool, http: Option<&HttpSettings>) -> bool {
    if let Some(http) = http {
        if http.use_client_protocol {
            return false;
        }
        match http.h2_upgrade_policy {
            H2UpgradePolicy::Upgrade => return true,
            H2UpgradePolicy::DoNotUpgrade => return false,
            H2UpgradePolicy::Default | H2UpgradePolicy::Unknown(_) => {}
        }
    }
    mesh && protocol.is_some_and(|p| p.is_http())
}

/// The HTTP settings of a connection pool.
fn http_settings(cp: Option<&ConnectionPoolSettings>) -> Option<&HttpSettings> {
    cp.and_then(|cp| cp.http.as_ref())
}

/// What Envoy works out per request for TLS it originates without an `sni`, as istiod has it:
/// the request's host as SNI, and the server's certificate verified for that host unless the
/// rule pins names or skips verification.
fn auto_tls(originated: Option<&ClientTlsSettings>) -> Option<UpstreamHttpProtocolOptions> {
    let tls = originated.filter(|t| t.sni.is_empty())?;
    Some(UpstreamHttpProtocolOptions {
        auto_sni: true,
        auto_san_validation: tls.subject_alt_names.is_empty()
            && tls.insecure_skip_verify != Some(true),
        ..Default::default()
    })
}

/// A cluster's upstream HTTP options, when it has any: connection-pool settings (`common`), the
/// protocol (Envoy requires one where options are set: HTTP/1.1 where nothing was said, as
/// istiod's), for HTTP/2 the rule's stream limit and PING keepalive (`http`), and what Envoy
/// works out per request for originated TLS (`auto`).
fn upstream_http_options(
    common: Option<HttpProtocolOptions>,
    upstream: Upstream,
    http: Option<&HttpSettings>,
    auto: Option<UpstreamHttpProtocolOptions>,
) -> Option<envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions> {
    use envoy_types::pb::envoy::config::core::v3::{Http2ProtocolOptions, KeepaliveSettings};
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
        ExplicitHttpConfig, UpstreamProtocolOptions, UseDownstreamHttpConfig,
        explicit_http_config::ProtocolConfig,
    };
    let explicit = |config| {
        UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
            protocol_config: Some(config),
        })
    };
    let protocol = match upstream {
        Upstream::Http2 => {
            let streams = http.map_or(0, |h| h.max_concurrent_streams);
            explicit(ProtocolConfig::Http2ProtocolOptions(Http2ProtocolOptions {
                max_concurrent_streams: (streams > 0).then_some(UInt32Value {
                    value: streams as u32,
                }),
                connection_keepalive: http.and_then(|h| h.http2_keep_alive.as_ref()).map(|k| {
                    KeepaliveSettings {
                        interval: k.interval.as_ref().map(duration),
                        timeout: k.timeout.as_ref().map(duration),
                        ..Default::default()
                    }
                }),
                ..Default::default()
            }))
        }
        Upstream::Downstream(preserve_case) => {
            UpstreamProtocolOptions::UseDownstreamProtocolConfig(UseDownstreamHttpConfig {
                http_protocol_options: Some(http1_options(preserve_case)),
                http2_protocol_options: Some(Default::default()),
                ..Default::default()
            })
        }
        Upstream::Http1PreservingCase => {
            explicit(ProtocolConfig::HttpProtocolOptions(http1_options(true)))
        }
        Upstream::Unsaid if common.is_some() || auto.is_some() => {
            explicit(ProtocolConfig::HttpProtocolOptions(http1_options(false)))
        }
        Upstream::Unsaid => return None,
    };
    Some(
        envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions {
            common_http_protocol_options: common,
            upstream_http_protocol_options: auto,
            upstream_protocol_options: Some(protocol),
            ..Default::default()
        },
    )
}

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
pub(super) fn passthrough(settings: &ClusterSettings) -> Cluster {
    Cluster {
        circuit_breakers: unlimited_circuit_breakers(),
        typed_extension_protocol_options: passthrough_http_options(settings.preserve_case),
        upstream_connection_options: settings.tcp_keepalive.map(Keepalive::envoy),
        ..original_destination(names::PASSTHROUGH_CLUSTER)
    }
}

/// `AllowAnyDynamicDNSCluster`: a dynamic forward proxy resolving each request's host, where
/// unknown plaintext HTTP goes under `ALLOW_ANY_DYNAMIC_DNS`.
pub(super) fn allow_any_dynamic_dns() -> Cluster {
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
pub(super) fn black_hole() -> Cluster {
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
pub(super) fn inbound_passthrough(settings: &ClusterSettings) -> Cluster {
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
pub(super) fn inbound(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_protocol_is_decided_in_istiods_order() {
        let http = |policy: H2UpgradePolicy, client: bool| HttpSettings {
            h2_upgrade_policy: policy,
            use_client_protocol: client,
            ..Default::default()
        };
        let upgrade = http(H2UpgradePolicy::Upgrade, false);
        let keep = http(H2UpgradePolicy::DoNotUpgrade, false);
        let client = http(H2UpgradePolicy::Default, true);
        let (h, t) = (Some(Protocol::Http), Some(Protocol::Tcp));
        use Upstream::*;
        for (protocol, detects, preserve, mesh, rule, want) in [
            // The mesh config upgrades HTTP ports only; a rule says for its own.
            (h, true, false, Some(true), None, Http2),
            (t, true, false, Some(true), None, Unsaid),
            (h, true, false, Some(true), Some(&keep), Unsaid),
            (t, true, false, Some(false), Some(&upgrade), Http2),
            // Not toward the workload itself.
            (h, true, false, None, Some(&upgrade), Unsaid),
            // Where the protocol was decided already, the upgrade does not take.
            (
                None,
                true,
                false,
                Some(false),
                Some(&upgrade),
                Downstream(false),
            ),
            (None, false, false, Some(false), Some(&upgrade), Http2),
            (
                h,
                true,
                true,
                Some(true),
                Some(&upgrade),
                Http1PreservingCase,
            ),
            // The client's protocol, keeping HTTP/1's header case where it was kept.
            (h, true, true, Some(true), Some(&client), Downstream(true)),
            (
                Some(Protocol::Grpc),
                true,
                true,
                Some(true),
                Some(&client),
                Downstream(false),
            ),
        ] {
            assert_eq!(
                Upstream::of(protocol, detects, preserve, mesh, rule),
                want,
                "{protocol:?} detects {detects} preserve {preserve} mesh {mesh:?} {rule:?}"
            );
        }
    }

    /// The ISTIO_MUTUAL transport socket as a message, built whole.
    fn whole_socket(sans: &[String], sni: &str) -> TransportSocket {
        TransportSocket {
            name: TLS_SOCKET.into(),
            config_type: Some(ConfigType::TypedConfig(pack_any(UpstreamTlsContext {
                common_tls_context: Some(istio_mutual_common(sans, ProxyBuild::Envoy, false)),
                sni: sni.into(),
                ..Default::default()
            }))),
        }
    }

    #[test]
    fn an_istio_mutual_socket_is_the_encoding_of_the_whole_socket() {
        let sans = vec!["spiffe://cluster.local/ns/a/sa/b".to_string()];
        let mut contexts = MutualContexts::new(ProxyBuild::Envoy);
        for sni in [
            "outbound_.80_.v1_.a.svc.cluster.local",
            "outbound_.81_._.a",
            "",
        ] {
            let socket = contexts.socket(&sans, sni, false);
            assert_eq!(
                socket,
                prost::Message::encode_to_vec(&whole_socket(&sans, sni))
            );
        }
        // The context is encoded once for all.
        assert_eq!(contexts.encoded.len(), 1);
        // An HTTP/2 cluster's offers `h2` too: another context.
        contexts.socket(&sans, "", true);
        assert_eq!(contexts.encoded.len(), 2);
    }

    #[test]
    fn assembled_auto_mtls_matches_are_the_bytes_of_the_messages() {
        let sans = vec!["spiffe://cluster.local/ns/a/sa/b".to_string()];
        let sni = "outbound_.80_.v1_.a.svc.cluster.local";
        let socket = MutualContexts::new(ProxyBuild::Envoy).socket(&sans, sni, false);
        let mut assembled = Vec::new();
        auto_mtls(&socket, &mut assembled);
        let whole = Cluster {
            transport_socket_matches: vec![
                tls_istio(Some(whole_socket(&sans, sni))),
                tls_disabled(),
            ],
            ..Default::default()
        };
        assert_eq!(assembled, prost::Message::encode_to_vec(&whole));
        // And as a cluster's transport socket.
        let mut field = Vec::new();
        length_delimited(TRANSPORT_SOCKET, socket.len(), &mut field);
        field.extend_from_slice(&socket);
        let whole = Cluster {
            transport_socket: Some(whole_socket(&sans, sni)),
            ..Default::default()
        };
        assert_eq!(field, prost::Message::encode_to_vec(&whole));
    }
}
