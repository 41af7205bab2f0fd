//! CDS: one outbound cluster per service port (`outbound|<port>||<host>`) and per DestinationRule
//! subset (`outbound|<port>|<subset>|<host>`), with the DestinationRule's traffic policy (load
//! balancer, connection pool as circuit breakers, outlier detection, client TLS), and the special
//! clusters (`PassthroughCluster`, `BlackHoleCluster`, `InboundPassthroughCluster`). The HTTP a
//! cluster speaks upstream is decided as istiod decides it (see [`Upstream`]).
//!
//! This module builds a service's clusters ([`service_clusters`]) from what the proxy and the
//! mesh config say ([`ClusterSettings`]); the rest lives by concept:
//! - [`traffic_policy`]: the DestinationRule policy a cluster takes, merged ([`Policy`]), and its
//!   load balancer, connection pool and outlier detection as cluster fields;
//! - [`tls`]: auto mTLS and the ISTIO_MUTUAL transport sockets;
//! - [`upstream`]: the HTTP a cluster speaks upstream and its protocol options;
//! - [`special`]: the clusters not of a service (passthrough, black hole, inbound).

use envoy_types::pb::envoy::config::cluster::v3::circuit_breakers::Thresholds;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbPolicy,
};
use envoy_types::pb::envoy::config::cluster::v3::{
    CircuitBreakers, Cluster, UpstreamConnectionOptions,
};
use envoy_types::pb::envoy::config::core::v3::{
    HealthStatus, HealthStatusSet, TcpKeepalive, TransportSocket, transport_socket::ConfigType,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, TlsParameters, UpstreamTlsContext,
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    tls_parameters::TlsProtocol,
};
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::{Duration, UInt32Value};
use pasa_istio::destination_rule::SimpleLb;
use pasa_istio::destination_rule::{ClientTlsMode, ClientTlsSettings, DestinationRule};

use envoy_types::util::pack_any;

use pasa_istio::node::ProxyType;

use super::builders::{ads, field_len, grpc_ads, length_delimited};
use super::endpoint;
use super::metadata;
use super::{Generator, names, sds};
use crate::model::authn::PeerModes;
use crate::model::proxy::ProxyBuild;
use crate::model::registry::{Config, Resolution, Service, ServicePort};
use crate::model::secrets;

mod special;
mod tls;
mod traffic_policy;
mod upstream;
pub(super) use special::{
    allow_any_dynamic_dns, black_hole, inbound, inbound_passthrough, passthrough,
};
pub(super) use tls::exact_sans;
use tls::{MutualContexts, TLS_SOCKET, TRANSPORT_SOCKET, auto_mtls, auto_mtls_len, file};
pub(super) use traffic_policy::Policy;
use traffic_policy::{apply_connection_pool, apply_load_balancer, outlier_detection};
use upstream::{HTTP_PROTOCOL_OPTIONS, Upstream, auto_tls, http_settings, upstream_http_options};

/// Istio's default connect timeout (`connectTimeout` in MeshConfig).
const CONNECT_TIMEOUT: Duration = Duration {
    seconds: 10,
    nanos: 0,
};

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
        local_cluster: settings
            .endpoints
            .cluster_local
            .is_local(&service.hostname)
            .then_some(settings.cluster_id.as_str()),
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
                let (locality, force) = endpoint::effective_setting(
                    settings.endpoints.mesh_locality.as_ref(),
                    policy
                        .load_balancer
                        .as_ref()
                        .and_then(|lb| lb.locality_lb_setting.as_ref()),
                    service.traffic_distribution,
                );
                let failover = policy.outlier_detection.is_some() || force;
                let shaping = endpoint::Shaping {
                    dr_mtls: endpoint::dr_mtls(dr.map(|d| &d.spec), subset, port.number),
                    networks: Some(&settings.endpoints.networks),
                    hbone: settings.endpoints.hbone && generator != Generator::Grpc,
                    // A setting with neither weights nor failover in force changes nothing.
                    locality: locality
                        .as_deref()
                        .filter(|l| failover || !l.distribute.is_empty())
                        .map(|setting| endpoint::LocalityLb {
                            setting,
                            failover,
                            proxy: settings.endpoints.place(),
                        }),
                    at: Some(at),
                };
                endpoints
                    .get_or_init(|| endpoint::PortEndpoints::new(service, port, at))
                    .assignment(&name, labels, policy.sends_unhealthy(), &shaping)
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
    /// What endpoints are shaped by: networks, locality, cluster-local hosts.
    pub(super) endpoints: endpoint::EndpointSettings,
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
        endpoints: endpoint::EndpointSettings,
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
            endpoints,
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
