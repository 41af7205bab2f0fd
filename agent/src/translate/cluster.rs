//! CDS: one outbound cluster per service port (`outbound|<port>||<host>`) and per DestinationRule
//! subset (`outbound|<port>|<subset>|<host>`), with the DestinationRule's traffic policy (load
//! balancer, connection pool as circuit breakers, outlier detection, client TLS), and the special
//! clusters (`PassthroughCluster`, `BlackHoleCluster`, `InboundPassthroughCluster`).

use envoy_types::pb::envoy::config::cluster::v3::circuit_breakers::Thresholds;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbConfig, LbPolicy, RingHashLbConfig,
    ring_hash_lb_config::HashFunction,
};
use envoy_types::pb::envoy::config::cluster::v3::{CircuitBreakers, Cluster, OutlierDetection};
use envoy_types::pb::envoy::config::core::v3::{
    BindConfig, HttpProtocolOptions, SocketAddress, TransportSocket, socket_address,
    transport_socket::ConfigType,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, TlsCertificate, UpstreamTlsContext,
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::pb::google::protobuf::{Duration, UInt32Value, UInt64Value};
use pasa_proto::istio::destination_rule::{
    ClientTlsMode, ClientTlsSettings, ConnectionPoolSettings, DestinationRule,
    OutlierDetection as IstioOutlier, TrafficPolicy,
};
use pasa_proto::istio::destination_rule::{LoadBalancerSettings, SimpleLb};

use envoy_types::util::pack_any;

use pasa_proto::istio::common::Protocol;

use pasa_proto::node::ProxyType;

use super::builders::{ads, duration};
use super::endpoint;
use super::metadata;
use super::{Generator, names, sds};
use crate::model::registry::{Config, Resolution, Service, ServicePort};
use crate::model::secrets;

/// Istio's default connect timeout (`connectTimeout` in MeshConfig).
const CONNECT_TIMEOUT: Duration = Duration {
    seconds: 10,
    nanos: 0,
};

/// The traffic policy that applies to one cluster: a DestinationRule's top-level policy, then its
/// port-level settings for the port, then the subset's policy and its port-level settings; each
/// later setting replaces the earlier one field by field (load balancer, connection pool, outlier
/// detection, TLS), as istiod merges them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Policy {
    pub load_balancer: Option<LoadBalancerSettings>,
    pub connection_pool: Option<ConnectionPoolSettings>,
    pub outlier_detection: Option<IstioOutlier>,
    pub tls: Option<ClientTlsSettings>,
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
        policy
    }

    fn apply(&mut self, tp: Option<&TrafficPolicy>, port: u32) {
        let Some(tp) = tp else { return };
        self.set(
            tp.load_balancer.as_ref(),
            tp.connection_pool.as_ref(),
            tp.outlier_detection.as_ref(),
            tp.tls.as_ref(),
        );
        if let Some(p) = tp
            .port_level_settings
            .iter()
            .find(|p| p.port.as_ref().is_some_and(|s| s.number == port))
        {
            self.set(
                p.load_balancer.as_ref(),
                p.connection_pool.as_ref(),
                p.outlier_detection.as_ref(),
                p.tls.as_ref(),
            );
        }
    }

    fn set(
        &mut self,
        lb: Option<&LoadBalancerSettings>,
        cp: Option<&ConnectionPoolSettings>,
        od: Option<&IstioOutlier>,
        tls: Option<&ClientTlsSettings>,
    ) {
        if let Some(lb) = lb {
            self.load_balancer = Some(lb.clone());
        }
        if let Some(cp) = cp {
            self.connection_pool = Some(cp.clone());
        }
        if let Some(od) = od {
            self.outlier_detection = Some(od.clone());
        }
        if let Some(tls) = tls {
            self.tls = Some(tls.clone());
        }
    }
}

/// Clusters (and, for EDS clusters, their load assignments) of one service: per port the default
/// cluster and one per subset of its DestinationRule. A router cannot forward to the original
/// destination (it is itself the destination of its clients' connections), so it reaches a
/// headless service's endpoints by EDS, as istiod builds it.
pub(super) fn service_clusters(
    service: &Service,
    dr: Option<&Config<DestinationRule>>,
    generator: Generator,
    proxy: ProxyType,
    out: &mut Vec<(Cluster, Option<Vec<u8>>)>,
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
    // The DestinationRule that shaped the clusters, as istiod records it.
    let shaped_by =
        dr.map(|dr| metadata::config_metadata(pasa_proto::Kind::DestinationRule, &dr.meta));
    let mut target = Target {
        service,
        identities: std::cell::OnceCell::new(),
        mutual: MutualContexts::default(),
        generator,
    };
    for port in &service.ports {
        // Built by the first cluster of the port that reads endpoints, shared by the others.
        let endpoints = std::cell::OnceCell::new();
        let mut subsets: Vec<Option<&str>> = vec![None];
        if let Some(dr) = dr {
            subsets.extend(dr.spec.subsets.iter().map(|s| Some(s.name.as_str())));
        }
        for subset in subsets {
            let labels = subset.and_then(|name| {
                dr.and_then(|d| d.spec.subsets.iter().find(|s| s.name == name))
                    .map(|s| s.labels.clone())
            });
            let name =
                names::outbound_cluster(port.number, subset.unwrap_or(""), &service.hostname);
            let policy = Policy::of(dr.map(|d| &d.spec), subset, port.number);
            let (mut cluster, assignment) = target.outbound(
                &name,
                port,
                subset.unwrap_or(""),
                &policy,
                (&endpoints, labels.as_ref()),
            );
            cluster.metadata = shaped_by.clone();
            out.push((cluster, assignment));
        }
    }
}

/// The service whose clusters are built, with what its clusters share.
struct Target<'s> {
    service: &'s Service,
    /// Its workloads' SPIFFE IDs, worked out once if a cluster pins them.
    identities: std::cell::OnceCell<Vec<String>>,
    mutual: MutualContexts,
    generator: Generator,
}

impl<'s> Target<'s> {
    fn identities(&self) -> &[String] {
        self.identities.get_or_init(|| self.service.identities())
    }

    fn outbound(
        &mut self,
        name: &str,
        port: &ServicePort,
        subset: &str,
        policy: &Policy,
        (endpoints, labels): (
            &std::cell::OnceCell<endpoint::PortEndpoints<'s>>,
            Option<&std::collections::BTreeMap<String, String>>,
        ),
    ) -> (Cluster, Option<Vec<u8>>) {
        let service = self.service;
        let endpoints = || endpoints.get_or_init(|| endpoint::PortEndpoints::new(service, port));
        let generator = self.generator;
        let mut cluster = Cluster {
            name: name.to_string(),
            connect_timeout: Some(CONNECT_TIMEOUT),
            ..Default::default()
        };
        let mut assignment = None;
        match service.resolution {
            Resolution::ClientSideLb => {
                cluster.cluster_discovery_type =
                    Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32));
                cluster.eds_cluster_config = Some(EdsClusterConfig {
                    eds_config: Some(ads()),
                    service_name: name.to_string(),
                });
                assignment = Some(endpoints().assignment(name, labels));
            }
            Resolution::Dns | Resolution::DnsRoundRobin => {
                let kind = if service.resolution == Resolution::Dns {
                    DiscoveryType::StrictDns
                } else {
                    DiscoveryType::LogicalDns
                };
                cluster.cluster_discovery_type = Some(ClusterDiscoveryType::Type(kind as i32));
                cluster.load_assignment = Some(endpoints().dns(name, labels, service, port));
            }
            Resolution::Passthrough | Resolution::DynamicDns => {
                cluster.cluster_discovery_type = Some(ClusterDiscoveryType::Type(
                    DiscoveryType::OriginalDst as i32,
                ));
                cluster.lb_policy = LbPolicy::ClusterProvided as i32;
            }
        }
        if service.resolution != Resolution::Passthrough
            && service.resolution != Resolution::DynamicDns
        {
            apply_load_balancer(&mut cluster, policy.load_balancer.as_ref(), generator);
        }
        let common = apply_connection_pool(&mut cluster, policy.connection_pool.as_ref());
        if let Some(od) = &policy.outlier_detection {
            cluster.outlier_detection = Some(outlier_detection(od));
        }
        if policy.tls.is_none()
            && generator == Generator::Envoy
            && !service.external
            && service.resolution == Resolution::ClientSideLb
        {
            cluster.transport_socket_matches = self.auto_mtls(port.number, subset);
        }
        if let Some(tls) = &policy.tls {
            cluster.transport_socket = match generator {
                Generator::Envoy => self.upstream_tls(tls, port.number, subset),
                Generator::Grpc => super::grpc::upstream_tls(tls.mode, self.identities()),
            };
        }
        // HTTP/2 and gRPC ports speak HTTP/2 upstream.
        let http2 = port.is_http() && port.protocol != Some(Protocol::Http);
        if http2 || common.is_some() {
            cluster.typed_extension_protocol_options.insert(
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".into(),
                pack_any(upstream_http_options(common, http2)),
            );
        }
        (cluster, assignment)
    }

    /// Istio's auto mTLS for a cluster without TLS settings: endpoints whose workload has a
    /// sidecar (`tlsMode: istio` endpoint metadata) are reached over ISTIO_MUTUAL, the others in
    /// plaintext.
    fn auto_mtls(
        &mut self,
        port: u32,
        subset: &str,
    ) -> Vec<envoy_types::pb::envoy::config::cluster::v3::cluster::TransportSocketMatch> {
        use envoy_types::pb::envoy::config::cluster::v3::cluster::TransportSocketMatch;
        use envoy_types::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
        let sni = names::istio_mutual_sni(port, subset, &self.service.hostname);
        vec![
            TransportSocketMatch {
                name: "tlsMode-istio".into(),
                r#match: Some(metadata::single("tlsMode", "istio")),
                transport_socket: Some(self.mutual.socket(
                    self.identities.get_or_init(|| self.service.identities()),
                    sni,
                )),
            },
            TransportSocketMatch {
                name: "tlsMode-disabled".into(),
                r#match: Some(Default::default()),
                transport_socket: Some(TransportSocket {
                    name: "envoy.transport_sockets.raw_buffer".into(),
                    config_type: Some(ConfigType::TypedConfig(pack_any(RawBuffer::default()))),
                }),
            },
        ]
    }

    /// Client TLS of a DestinationRule as Envoy's upstream TLS transport socket. ISTIO_MUTUAL
    /// verifies the peer against the mesh root and pins it to the DestinationRule's
    /// `subjectAltNames`, else to the service's `identities` (its workloads' SPIFFE IDs), as
    /// istiod does.
    fn upstream_tls(
        &mut self,
        tls: &ClientTlsSettings,
        port: u32,
        subset: &str,
    ) -> Option<TransportSocket> {
        let hostname = &self.service.hostname;
        let mut common = CommonTlsContext::default();
        let sni;
        match tls.mode {
            ClientTlsMode::Disable => return None,
            ClientTlsMode::IstioMutual => {
                let sans = if tls.subject_alt_names.is_empty() {
                    self.identities.get_or_init(|| self.service.identities())
                } else {
                    &tls.subject_alt_names
                };
                let sni = names::istio_mutual_sni(port, subset, hostname);
                return Some(self.mutual.socket(sans, sni));
            }
            _ => {
                if !tls.credential_name.is_empty() {
                    // SIMPLE only verifies the server (the `-cacert`); MUTUAL also presents the
                    // credential's own certificate.
                    if tls.mode == ClientTlsMode::Mutual {
                        common.tls_certificate_sds_secret_configs =
                            vec![sds::credential(&tls.credential_name)];
                    }
                    common.validation_context_type =
                        Some(ValidationContextType::ValidationContextSdsSecretConfig(
                            sds::credential_ca(&tls.credential_name),
                        ));
                } else {
                    if tls.mode == ClientTlsMode::Mutual && !tls.client_certificate.is_empty() {
                        common.tls_certificates = vec![TlsCertificate {
                            certificate_chain: Some(file(&tls.client_certificate)),
                            private_key: Some(file(&tls.private_key)),
                            ..Default::default()
                        }];
                    }
                    if !tls.ca_certificates.is_empty() {
                        common.validation_context_type =
                            Some(ValidationContextType::ValidationContext(
                                CertificateValidationContext {
                                    trusted_ca: Some(file(&tls.ca_certificates)),
                                    ..Default::default()
                                },
                            ));
                    }
                }
                sni = if tls.sni.is_empty() {
                    hostname.to_string()
                } else {
                    tls.sni.clone()
                };
            }
        }
        let context = UpstreamTlsContext {
            common_tls_context: Some(common),
            sni,
            ..Default::default()
        };
        Some(TransportSocket {
            name: "envoy.transport_sockets.tls".into(),
            config_type: Some(ConfigType::TypedConfig(pack_any(context))),
        })
    }
}

/// ISTIO_MUTUAL upstream TLS contexts of one service's clusters, encoded once per set of
/// pinned SANs: the clusters differ only in SNI, so each transport socket is the encoded
/// common context followed by its SNI (the bytes encoding the whole message gives).
#[derive(Default)]
struct MutualContexts {
    /// Pinned SANs, and the encoded `UpstreamTlsContext` holding only the common context.
    encoded: Vec<(Vec<String>, Vec<u8>)>,
}

impl MutualContexts {
    fn socket(&mut self, sans: &[String], sni: String) -> TransportSocket {
        let at = match self.encoded.iter().position(|(s, _)| s == sans) {
            Some(at) => at,
            None => {
                let context = UpstreamTlsContext {
                    common_tls_context: Some(istio_mutual_common(sans)),
                    ..Default::default()
                };
                self.encoded
                    .push((sans.to_vec(), prost::Message::encode_to_vec(&context)));
                self.encoded.len() - 1
            }
        };
        let mut value = self.encoded[at].1.clone();
        // `sni` is field 2 of UpstreamTlsContext, after the common context (field 1); an
        // empty string is not encoded.
        if !sni.is_empty() {
            prost::encoding::string::encode(2, &sni, &mut value);
        }
        TransportSocket {
            name: "envoy.transport_sockets.tls".into(),
            config_type: Some(ConfigType::TypedConfig(
                envoy_types::pb::google::protobuf::Any {
                    type_url: <UpstreamTlsContext as prost::Name>::type_url(),
                    value,
                },
            )),
        }
    }
}

/// The common TLS context of ISTIO_MUTUAL: the workload certificate, and the mesh root with the
/// peer pinned to `sans`.
fn istio_mutual_common(sans: &[String]) -> CommonTlsContext {
    #[allow(deprecated)] // istiod's field: any SAN type, matched exactly
    let pinned = CertificateValidationContext {
        match_subject_alt_names: sans
            .iter()
            .map(|san| StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact(san.clone())),
                ..Default::default()
            })
            .collect(),
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
        alpn_protocols: vec!["istio-peer-exchange".into(), "istio".into()],
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
                let minimum = hash
                    .ring_hash()
                    .map(|r| r.minimum_ring_size.0)
                    .filter(|n| *n > 0)
                    .unwrap_or(hash.minimum_ring_size.0);
                if hash.maglev().is_some() {
                    LbPolicy::Maglev
                } else {
                    cluster.lb_config = Some(LbConfig::RingHashLbConfig(RingHashLbConfig {
                        minimum_ring_size: (minimum > 0).then_some(UInt64Value { value: minimum }),
                        hash_function: HashFunction::XxHash as i32,
                        ..Default::default()
                    }));
                    LbPolicy::RingHash
                }
            } else {
                match p.simple() {
                    Some(SimpleLb::Random) => LbPolicy::Random,
                    Some(SimpleLb::RoundRobin) => LbPolicy::RoundRobin,
                    Some(SimpleLb::Passthrough) => {
                        cluster.cluster_discovery_type = Some(ClusterDiscoveryType::Type(
                            DiscoveryType::OriginalDst as i32,
                        ));
                        cluster.eds_cluster_config = None;
                        LbPolicy::ClusterProvided
                    }
                    Some(SimpleLb::LeastConn | SimpleLb::LeastRequest) => LbPolicy::LeastRequest,
                    _ => default,
                }
            }
        }
    };
    cluster.lb_policy = policy as i32;
}

/// Circuit breakers from the connection pool; returns the common HTTP options it sets.
fn apply_connection_pool(
    cluster: &mut Cluster,
    cp: Option<&ConnectionPoolSettings>,
) -> Option<HttpProtocolOptions> {
    let mut common = None;
    let mut thresholds = Thresholds::default();
    let u32v = |v: i32| (v > 0).then_some(UInt32Value { value: v as u32 });
    if let Some(cp) = cp {
        if let Some(tcp) = &cp.tcp {
            thresholds.max_connections = u32v(tcp.max_connections);
            if let Some(t) = &tcp.connect_timeout {
                cluster.connect_timeout = Some(duration(t));
            }
        }
        if let Some(http) = &cp.http {
            thresholds.max_pending_requests = u32v(http.http1_max_pending_requests);
            thresholds.max_requests = u32v(http.http2_max_requests);
            thresholds.max_retries = u32v(http.max_retries);
            if http.max_requests_per_connection > 0 || http.idle_timeout.is_some() {
                common = Some(HttpProtocolOptions {
                    idle_timeout: http.idle_timeout.as_ref().map(duration),
                    max_requests_per_connection: u32v(http.max_requests_per_connection),
                    ..Default::default()
                });
            }
        }
    }
    // Istio sets the limits to the maximum unless configured, so Envoy's low defaults never cut
    // traffic by surprise.
    let max = Some(UInt32Value { value: u32::MAX });
    thresholds.max_connections = thresholds.max_connections.or(max);
    thresholds.max_pending_requests = thresholds.max_pending_requests.or(max);
    thresholds.max_requests = thresholds.max_requests.or(max);
    thresholds.max_retries = thresholds.max_retries.or(max);
    cluster.circuit_breakers = Some(CircuitBreakers {
        thresholds: vec![thresholds],
        ..Default::default()
    });
    common
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

fn upstream_http_options(
    common: Option<HttpProtocolOptions>,
    http2: bool,
) -> envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions {
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
        ExplicitHttpConfig, UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
    };
    envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions {
        common_http_protocol_options: common,
        // Envoy requires the upstream protocol; connection-pool settings on an HTTP/1.1 port
        // keep HTTP/1.1, as istiod does.
        upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
            ExplicitHttpConfig {
                protocol_config: Some(if http2 {
                    ProtocolConfig::Http2ProtocolOptions(Default::default())
                } else {
                    ProtocolConfig::HttpProtocolOptions(Default::default())
                }),
            },
        )),
        ..Default::default()
    }
}

/// A cluster that forwards to each connection's original destination.
fn original_destination(name: &str) -> Cluster {
    Cluster {
        name: name.to_string(),
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

/// `PassthroughCluster`: forwards to the original destination.
pub(super) fn passthrough() -> Cluster {
    original_destination(names::PASSTHROUGH_CLUSTER)
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
        connect_timeout: Some(CONNECT_TIMEOUT),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        ..Default::default()
    }
}

/// `InboundPassthroughCluster`: inbound traffic to a port no service declares, forwarded to the
/// original destination from Istio's inbound passthrough source address.
pub(super) fn inbound_passthrough() -> Cluster {
    inbound_original_destination(names::INBOUND_PASSTHROUGH_CLUSTER)
}

/// `inbound|<port>||`: traffic for the local workload, to `endpoint` (`127.0.0.1:<port>` or a
/// Sidecar ingress listener's `defaultEndpoint`), or to the original destination when `None`.
pub(super) fn inbound(port: u32, endpoint: Option<(String, u32)>) -> Cluster {
    let name = names::inbound_cluster(port);
    match endpoint {
        Some((address, port)) => Cluster {
            name: name.clone(),
            connect_timeout: Some(CONNECT_TIMEOUT),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
            load_assignment: Some(endpoint::single(&name, &address, port)),
            ..Default::default()
        },
        None => inbound_original_destination(&name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_istio_mutual_socket_is_the_encoding_of_the_whole_context() {
        let sans = vec!["spiffe://cluster.local/ns/a/sa/b".to_string()];
        let mut contexts = MutualContexts::default();
        for sni in ["outbound_.80_.v1_.a.svc.cluster.local", "outbound_.81_._.a"] {
            let socket = contexts.socket(&sans, sni.into());
            let whole = pack_any(UpstreamTlsContext {
                common_tls_context: Some(istio_mutual_common(&sans)),
                sni: sni.into(),
                ..Default::default()
            });
            assert_eq!(socket.config_type, Some(ConfigType::TypedConfig(whole)));
        }
        // Encoded once for both.
        assert_eq!(contexts.encoded.len(), 1);
    }
}
