//! `virtualInbound` and the inbound clusters, as istiod builds them.
//!
//! One chain configuration per port the workload receives on: the Sidecar's ingress listeners
//! when it has any (bound to the proxy's address, with their own TLS when enabled), else the
//! target ports of the services that select the proxy (the oldest service wins a port). Each
//! becomes one or more filter chains according to the port's mutual TLS mode and protocol:
//! `DISABLE` plaintext only, `STRICT` Istio mTLS only, `PERMISSIVE` both; HTTP ports get
//! connection managers, TCP ports TCP proxies, ports without a protocol both (plaintext HTTP told
//! apart by the HTTP inspector, mTLS HTTP by its ALPN). Passthrough chains (`virtualInbound`,
//! `virtualInbound-catchall-http`) take what no port chain matches, shaped by the mode too, and a
//! chain refuses traffic sent to 15006 itself. TLS and HTTP inspectors run only on the ports whose
//! chains need them.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{
    TrafficDirection, TransportSocket, transport_socket,
};
use envoy_types::pb::envoy::config::listener::v3::listener_filter_chain_match_predicate::{
    MatchSet, Rule,
};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter,
    ListenerFilterChainMatchPredicate,
};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SdsSecretConfig,
    TlsParameters,
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    tls_parameters::TlsProtocol,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use envoy_types::pb::envoy::r#type::v3::Int32Range;
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};
use envoy_types::util::pack_any;
use pasa_istio::common::Protocol;
use pasa_istio::gateway::{ServerTlsSettings, TlsMode};

use super::super::authz::ProxyAuthz as Authz;
use super::super::cluster::{self};
use super::super::endpoint::socket_address;
use super::super::filters::{self, Routes};
use super::super::{Built, View, hcm, metadata, names, route, sds};
use super::PLAINTEXT_HTTP_ALPNS;
use crate::model::authn::{MergedPolicy, MtlsMode};
use crate::model::proxy::ProxyBuild;
use crate::model::registry::{Config, Meta};
use crate::model::secrets;
use pasa_istio::destination_rule::DestinationRule;
use pasa_istio::virtual_service::HttpRetry;

const MTLS_HTTP_ALPNS: [&str; 3] = ["istio-http/1.0", "istio-http/1.1", "istio-h2"];
const ALL_ISTIO_MTLS_ALPNS: [&str; 5] = [
    "istio",
    "istio-peer-exchange",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
];
const MTLS_TCP_ALPNS: [&str; 2] = ["istio-peer-exchange", "istio"];

/// The protocol a chain serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Http,
    Tcp,
    /// Both, told apart at connection time.
    Auto,
}

fn kind_of(protocol: Option<Protocol>) -> Kind {
    match protocol {
        None => Kind::Auto,
        Some(p) if p.is_http() => Kind::Http,
        Some(_) => Kind::Tcp,
    }
}

/// One port the workload receives on.
#[derive(Debug, Clone)]
struct ChainConfig {
    port: u32,
    protocol: Option<Protocol>,
    /// The address the chain is named after.
    bind: String,
    /// Where the inbound cluster sends (`None`: the original destination).
    endpoint: Option<(String, u32)>,
    /// TLS a Sidecar ingress listener terminates itself.
    tls: Option<ServerTlsSettings>,
    passthrough: bool,
    /// The services the port serves, as istiod labels the inbound cluster for Istio's stats:
    /// those with the first one's service port (by number: the target ports are the same).
    services: Vec<(u32, metadata::ServiceLabel)>,
    /// The Envoy build served: only Istio's proxy negotiates the in-band metadata exchange.
    build: ProxyBuild,
    /// The DestinationRule of the (first) service the port serves, with its service port: its
    /// connection pool applies to the inbound cluster too.
    rule: Option<(Arc<Config<DestinationRule>>, u32)>,
    /// The Sidecar whose ingress listener this is: its chains carry its config path, and are
    /// traced as `<sidecar>.<namespace>:<port>/*` (istiod's stand-in for a hostname).
    sidecar: Option<Meta>,
}

/// What every inbound chain of the proxy shares: its authorization filters, the connection
/// manager's settings, the mesh config's `defaultInboundHttpRetryPolicy`, and how mutual TLS
/// servers check clients.
struct Shared<'a> {
    authz: &'a Authz,
    hcm: &'a hcm::Options,
    retry: Option<&'a HttpRetry>,
    mtls: &'a MeshMtls,
}

impl ChainConfig {
    fn name(&self, kind: Kind) -> String {
        match (self.passthrough, kind) {
            (true, Kind::Http) => names::VIRTUAL_INBOUND_CATCH_ALL_HTTP.into(),
            (true, _) => names::VIRTUAL_INBOUND.into(),
            (false, _) => names::listener(&self.bind, self.port),
        }
    }

    fn cluster(&self) -> String {
        if self.passthrough {
            names::INBOUND_PASSTHROUGH_CLUSTER.into()
        } else {
            names::inbound_cluster(self.port)
        }
    }
}

/// A filter chain variant: match and whether it terminates TLS.
struct MatchOption {
    alpn: &'static [&'static str],
    transport: &'static str,
    kind: Kind,
    tls: bool,
}

const fn opt(
    alpn: &'static [&'static str],
    transport: &'static str,
    kind: Kind,
    tls: bool,
) -> MatchOption {
    MatchOption {
        alpn,
        transport,
        kind,
        tls,
    }
}

/// The chains of a port, by mode and protocol, as istiod lays them out.
fn match_options(mode: MtlsMode, kind: Kind) -> Vec<MatchOption> {
    use Kind::{Http, Tcp};
    match (kind, mode) {
        (Http, MtlsMode::Strict) => vec![opt(&[], "tls", Http, true)],
        (Http, MtlsMode::Permissive) => vec![
            opt(&ALL_ISTIO_MTLS_ALPNS, "tls", Http, true),
            opt(&[], "raw_buffer", Http, false),
        ],
        (Http, MtlsMode::Disable) => vec![opt(&[], "raw_buffer", Http, false)],
        (Kind::Auto, MtlsMode::Strict) => vec![
            opt(&MTLS_HTTP_ALPNS, "tls", Http, true),
            opt(&[], "tls", Tcp, true),
        ],
        (Kind::Auto, MtlsMode::Permissive) => vec![
            opt(&MTLS_HTTP_ALPNS, "tls", Http, true),
            opt(&PLAINTEXT_HTTP_ALPNS, "raw_buffer", Http, false),
            opt(&MTLS_TCP_ALPNS, "tls", Tcp, true),
            opt(&[], "raw_buffer", Tcp, false),
            opt(&[], "tls", Tcp, false),
        ],
        (Kind::Auto, MtlsMode::Disable) => vec![
            opt(&PLAINTEXT_HTTP_ALPNS, "raw_buffer", Http, false),
            opt(&[], "raw_buffer", Tcp, false),
        ],
        (Tcp, MtlsMode::Strict) => vec![opt(&[], "tls", Tcp, true)],
        (Tcp, MtlsMode::Permissive) => vec![
            opt(&ALL_ISTIO_MTLS_ALPNS, "tls", Tcp, true),
            opt(&[], "tls", Tcp, false),
            opt(&[], "raw_buffer", Tcp, false),
        ],
        (Tcp, MtlsMode::Disable) => vec![opt(&[], "raw_buffer", Tcp, false)],
    }
}

/// Inbound clusters and `virtualInbound`.
pub(in super::super) fn inbound(view: &View<'_>, out: &mut Built) {
    let authz = Authz::of(view);
    let policy = MergedPolicy::compose(
        view.registry.peer_authentications(),
        &view.proxy.mesh.root_namespace,
        &view.proxy.namespace,
        &view.proxy.labels,
    );
    let mut chains = vec![blackhole_chain()];
    // Passthrough: unmatched traffic, and ports with their own mode but no service.
    let mut passthrough_ports = vec![0];
    passthrough_ports.extend(policy.per_port.keys().copied());
    let configs = chain_configs(view);
    let mtls = MeshMtls::of(view.registry.mesh_config(&view.proxy.mesh.root_namespace));
    let shared = Shared {
        authz: &authz,
        hcm: view.hcm(hcm::Class::SidecarInbound),
        retry: view.retry_defaults.inbound.as_ref(),
        mtls: &mtls,
    };
    for port in passthrough_ports {
        if port != 0 && configs.iter().any(|c| c.port == port) {
            continue;
        }
        let cc = ChainConfig {
            port,
            protocol: None,
            bind: String::new(),
            endpoint: None,
            tls: None,
            passthrough: true,
            services: Vec::new(),
            build: view.proxy.build,
            rule: None,
            sidecar: None,
        };
        let mode = policy.for_port(port);
        chains.extend(port_chains(
            &cc,
            mode,
            &match_options(mode, Kind::Auto),
            &shared,
        ));
    }
    for cc in &configs {
        let cluster_name = cc.cluster();
        out.clusters.insert(
            cluster_name.clone(),
            cluster::inbound(
                cc.port,
                cc.endpoint.clone(),
                cc.protocol,
                &view.cluster_settings,
                cc.rule.as_ref().map(|(dr, port)| (&dr.spec, *port)),
            ),
        );
        // The rule that shaped it (when it has a traffic policy), and, for Istio's stats, the
        // services it is for.
        let rule = cc
            .rule
            .as_ref()
            .filter(|(dr, _)| dr.spec.traffic_policy.is_some())
            .map(|(dr, _)| &dr.meta);
        let labels: Vec<metadata::ServiceLabel> = if view.proxy.build == ProxyBuild::Istio {
            cc.services.iter().map(|(_, l)| l.clone()).collect()
        } else {
            Vec::new()
        };
        let field = metadata::cluster_field(rule, &labels, false, None, false);
        if !field.is_empty() {
            out.cluster_fields.insert(cluster_name.clone(), field);
        }
        let mode = policy.for_port(cc.port);
        match &cc.tls {
            Some(tls) if mode == MtlsMode::Disable => {
                let kind = kind_of(cc.protocol);
                let mut chain = chain(cc, &opt(&[], "tls", kind, false), mode, &shared);
                chain.transport_socket = Some(custom_tls(tls));
                chains.push(chain);
            }
            _ => {
                let options = match_options(mode, kind_of(cc.protocol));
                chains.extend(port_chains(cc, mode, &options, &shared));
            }
        }
    }
    let listener_filters = listener_filters(&chains);
    out.listeners.insert(
        names::VIRTUAL_INBOUND.into(),
        Listener {
            name: names::VIRTUAL_INBOUND.into(),
            address: Some(socket_address("0.0.0.0", names::VIRTUAL_INBOUND_PORT)),
            // No hand-off by original destination (istiod sets none here): the original_dst
            // listener filter restores the destination and the filter chains match on it. A
            // hand-off would give inbound connections to the outbound listener of the same
            // port, which forwards them back to the pod: a loop.
            listener_filters,
            filter_chains: chains,
            traffic_direction: TrafficDirection::Inbound as i32,
            continue_on_listener_filters_timeout: true,
            listener_filters_timeout: Some(view.protocol_detection_timeout()),
            max_connections_to_accept_per_socket_event: filters::accept_one_per_event(),
            ..Default::default()
        },
    );
    out.clusters.insert(
        names::INBOUND_PASSTHROUGH_CLUSTER.into(),
        cluster::inbound_passthrough(&view.cluster_settings),
    );
}

fn port_chains(
    cc: &ChainConfig,
    mode: MtlsMode,
    options: &[MatchOption],
    shared: &Shared<'_>,
) -> Vec<FilterChain> {
    options.iter().map(|o| chain(cc, o, mode, shared)).collect()
}

fn chain(cc: &ChainConfig, o: &MatchOption, mode: MtlsMode, shared: &Shared<'_>) -> FilterChain {
    let authz = shared.authz;
    let cluster_name = cc.cluster();
    let filters = match o.kind {
        Kind::Http => vec![http_filter(cc, &cluster_name, shared)],
        _ => authz.tcp_chain(vec![filters::tcp_proxy(
            &cluster_name,
            &[(cluster_name.clone(), 100)],
        )]),
    };
    FilterChain {
        name: cc.name(o.kind),
        filter_chain_match: Some(FilterChainMatch {
            destination_port: (cc.port > 0).then_some(UInt32Value { value: cc.port }),
            transport_protocol: o.transport.into(),
            application_protocols: o.alpn.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }),
        filters,
        transport_socket: (o.tls && mode != MtlsMode::Disable)
            .then(|| istio_mutual_server(o.kind == Kind::Http, cc.build, shared.mtls)),
        metadata: cc
            .sidecar
            .as_ref()
            .map(|m| metadata::config_metadata(pasa_proto::Kind::Sidecar, m)),
        ..Default::default()
    }
}

/// The connection manager of an inbound HTTP chain: one virtual host, everything to the cluster,
/// retried only as the mesh config's inbound policy says (see [`route::default_inbound_route`]).
fn http_filter(cc: &ChainConfig, cluster_name: &str, shared: &Shared<'_>) -> Filter {
    // Traced as the service the port serves, as istiod names it (`:0/*` for passthrough; a
    // Sidecar ingress listener's as the Sidecar).
    let (host, port) = match &cc.sidecar {
        Some(sidecar) => (format!("{}.{}", sidecar.name, sidecar.namespace), cc.port),
        None => cc
            .services
            .first()
            .map_or((String::new(), cc.port), |(port, label)| {
                (label.host.clone(), *port)
            }),
    };
    let route = route::default_inbound_route(
        cluster_name,
        format!("{host}:{port}/*"),
        shared.retry,
        cc.protocol.is_some_and(|p| p.is_grpc()),
    );
    let (stat_prefix, vhost) = if cc.passthrough {
        (cluster_name.to_string(), names::inbound_virtual_host(0))
    } else {
        (
            format!("inbound_{}", cc.name(Kind::Http)),
            names::inbound_virtual_host(cc.port),
        )
    };
    let mut hcm = filters::http_connection_manager(
        &stat_prefix,
        Routes::Inline(Box::new(RouteConfiguration {
            name: cluster_name.to_string(),
            virtual_hosts: vec![route::virtual_host(
                vhost,
                vec!["*".into()],
                vec![route],
                shared.hcm.attempt_count,
            )],
            validate_clusters: Some(BoolValue { value: false }),
            ..Default::default()
        })),
    );
    // Authorization first: a request it refuses goes no further.
    hcm.http_filters
        .splice(0..0, shared.authz.http.iter().cloned());
    // As istiod's inbound connection manager: by default the app learns its mTLS peer from
    // X-Forwarded-Client-Cert (the peer's subject, URI and DNS SANs appended); HTTP/2 options
    // on an HTTP/2 or gRPC port.
    shared.hcm.apply(&mut hcm);
    if cc
        .protocol
        .is_some_and(|p| matches!(p, Protocol::Http2 | Protocol::Grpc | Protocol::GrpcWeb))
    {
        hcm.http2_protocol_options = Some(Default::default());
    }
    filters::hcm_filter(hcm)
}

/// Traffic sent to the inbound capture port itself would loop: refused.
fn blackhole_chain() -> FilterChain {
    let cluster = names::BLACK_HOLE_CLUSTER;
    FilterChain {
        name: names::VIRTUAL_INBOUND_BLACKHOLE.into(),
        filter_chain_match: Some(FilterChainMatch {
            destination_port: Some(UInt32Value {
                value: names::VIRTUAL_INBOUND_PORT,
            }),
            ..Default::default()
        }),
        filters: vec![filters::tcp_proxy(cluster, &[(cluster.to_string(), 100)])],
        ..Default::default()
    }
}

/// Original destination, then the TLS and HTTP inspectors, each limited to the ports whose
/// chains need it (chains without a port stand for all other ports).
fn listener_filters(chains: &[FilterChain]) -> Vec<ListenerFilter> {
    let mut needs: BTreeMap<u32, (bool, bool)> = BTreeMap::new();
    for c in chains {
        let m = c.filter_chain_match.clone().unwrap_or_default();
        let port = m.destination_port.map_or(0, |p| p.value);
        let tls = m.transport_protocol == "tls";
        let http = m
            .application_protocols
            .iter()
            .any(|a| PLAINTEXT_HTTP_ALPNS.contains(&a.as_str()));
        let entry = needs.entry(port).or_default();
        entry.0 |= tls;
        entry.1 |= http;
    }
    let mut out = vec![filters::original_dst()];
    let mut inspectors = filters::inspectors(true, true).into_iter();
    let (Some(mut tls), Some(mut http)) = (inspectors.next(), inspectors.next()) else {
        return out;
    };
    if needs.values().any(|n| n.0) {
        let default_on = needs.get(&0).is_some_and(|n| n.0);
        let ports: Vec<u32> = needs
            .iter()
            .filter(|(p, n)| **p != 0 && n.0 != default_on)
            .map(|(p, _)| *p)
            .collect();
        if !ports.is_empty() {
            let listed = ports_predicate(&ports);
            tls.filter_disabled = Some(if default_on {
                listed
            } else {
                ListenerFilterChainMatchPredicate {
                    rule: Some(Rule::NotMatch(Box::new(listed))),
                }
            });
        }
        out.push(tls);
    }
    if needs.values().any(|n| n.1) {
        let ports: Vec<u32> = needs
            .iter()
            .filter(|(_, n)| !n.1)
            .map(|(p, _)| *p)
            .collect();
        if !ports.is_empty() {
            http.filter_disabled = Some(ports_predicate(&ports));
        }
        out.push(http);
    }
    out
}

/// A predicate matching any of `ports`.
fn ports_predicate(ports: &[u32]) -> ListenerFilterChainMatchPredicate {
    let mut rules: Vec<ListenerFilterChainMatchPredicate> = ports
        .iter()
        .map(|p| ListenerFilterChainMatchPredicate {
            rule: Some(Rule::DestinationPortRange(Int32Range {
                start: *p as i32,
                end: *p as i32 + 1,
            })),
        })
        .collect();
    if rules.len() == 1 {
        return rules.remove(0);
    }
    ListenerFilterChainMatchPredicate {
        rule: Some(Rule::OrMatch(MatchSet { rules })),
    }
}

/// The server side of Istio mutual TLS: the workload certificate (`default`) and the mesh root
/// (`ROOTCA`) over SDS, client certificates required. Only Istio's proxy (`build`) negotiates
/// ALPN `istio-peer-exchange` on TCP: a peer negotiating it writes its metadata in band first,
/// which upstream Envoy, without the exchange filter, would pass to the application.
fn istio_mutual_server(http: bool, build: ProxyBuild, mesh: &MeshMtls) -> TransportSocket {
    let alpn: &[&str] = if http || build != ProxyBuild::Istio {
        &["h2", "http/1.1"]
    } else {
        &["istio-peer-exchange", "h2", "http/1.1"]
    };
    #[allow(deprecated)] // istiod's field: any SAN type, by prefix
    let trusted = CertificateValidationContext {
        match_subject_alt_names: mesh
            .trust_domains
            .iter()
            .map(|td| StringMatcher {
                match_pattern: Some(MatchPattern::Prefix(format!("spiffe://{td}/"))),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    downstream_tls(
        sds::from_istio_agent(secrets::WORKLOAD_CERTIFICATE),
        Some(ValidationContextType::CombinedValidationContext(
            CombinedCertificateValidationContext {
                default_validation_context: Some(trusted),
                validation_context_sds_secret_config: Some(sds::from_istio_agent(secrets::ROOT_CA)),
                ..Default::default()
            },
        )),
        true,
        alpn.iter().map(|s| s.to_string()).collect(),
        Some(TlsParameters {
            cipher_suites: mesh.ciphers.clone(),
            tls_minimum_protocol_version: mesh.min_version as i32,
            tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
            ..Default::default()
        }),
    )
}

/// What istiod's inbound mTLS servers take from the mesh config: the trust domains whose
/// SPIFFE identities a client certificate must carry (`trustDomain`, default `cluster.local`,
/// its aliases and the CA certificates' trust domains; none checked without a mesh config in
/// the store, as the agent cannot tell the mesh's), and `meshMTLS`' minimum TLS version (1.2
/// by default) and cipher suites (Istio's strong list by default).
#[derive(Debug)]
pub(super) struct MeshMtls {
    trust_domains: Vec<String>,
    min_version: TlsProtocol,
    ciphers: Vec<String>,
}

impl MeshMtls {
    pub(super) fn of(mesh: Option<&pasa_istio::mesh_config::MeshConfig>) -> MeshMtls {
        let mut trust_domains = Vec::new();
        if let Some(mesh) = mesh {
            let own = mesh
                .trust_domain
                .clone()
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| "cluster.local".into());
            let from_cas = mesh
                .other
                .get("caCertificates")
                .and_then(serde_json::Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|ca| ca.get("trustDomains")?.as_array())
                .flatten()
                .filter_map(|td| td.as_str().map(str::to_string));
            for td in std::iter::once(own)
                .chain(mesh.trust_domain_aliases.iter().cloned())
                .chain(from_cas)
            {
                if !td.is_empty() && !trust_domains.contains(&td) {
                    trust_domains.push(td);
                }
            }
        }
        let mtls = mesh.and_then(|m| m.other.get("meshMTLS"));
        let min_version = match mtls
            .and_then(|m| m.get("minProtocolVersion"))
            .and_then(serde_json::Value::as_str)
        {
            Some("TLSV1_3") => TlsProtocol::TlSv13,
            _ => TlsProtocol::TlSv12,
        };
        let ciphers = mtls
            .and_then(|m| m.get("cipherSuites"))
            .and_then(serde_json::Value::as_array)
            .map(|list| {
                list.iter()
                    .filter_map(|c| c.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_else(|| {
                [
                    "ECDHE-ECDSA-AES256-GCM-SHA384",
                    "ECDHE-RSA-AES256-GCM-SHA384",
                    "ECDHE-ECDSA-AES128-GCM-SHA256",
                    "ECDHE-RSA-AES128-GCM-SHA256",
                    "AES256-GCM-SHA384",
                    "AES128-GCM-SHA256",
                ]
                .map(String::from)
                .to_vec()
            });
        MeshMtls {
            trust_domains,
            min_version,
            ciphers,
        }
    }
}

/// TLS a Sidecar ingress listener terminates with files it names (`file-cert:<cert>~<key>`,
/// `file-root:<ca>`), or with a credential.
fn custom_tls(tls: &ServerTlsSettings) -> TransportSocket {
    let certificate = if !tls.credential_name.is_empty() {
        sds::credential(&tls.credential_name)
    } else {
        sds::from_istio_agent(&format!(
            "{}{}~{}",
            secrets::FILE_CERT_PREFIX,
            tls.server_certificate,
            tls.private_key
        ))
    };
    let mutual = matches!(tls.mode, TlsMode::Mutual | TlsMode::IstioMutual);
    let validation =
        (mutual && !tls.ca_certificates.is_empty()).then(|| {
            ValidationContextType::ValidationContextSdsSecretConfig(sds::from_istio_agent(
                &format!("{}{}", secrets::FILE_ROOT_PREFIX, tls.ca_certificates),
            ))
        });
    downstream_tls(certificate, validation, mutual, Vec::new(), None)
}

fn downstream_tls(
    certificate: SdsSecretConfig,
    validation: Option<ValidationContextType>,
    require_client_certificate: bool,
    alpn: Vec<String>,
    tls_params: Option<TlsParameters>,
) -> TransportSocket {
    let context = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_sds_secret_configs: vec![certificate],
            validation_context_type: validation,
            alpn_protocols: alpn,
            tls_params,
            ..Default::default()
        }),
        require_client_certificate: Some(BoolValue {
            value: require_client_certificate,
        }),
        ..Default::default()
    };
    TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(context))),
    }
}

/// The proxy's first globally routable address, else the wildcard: what Sidecar ingress
/// listeners without a `bind` are named after.
fn inbound_bind(ips: &[IpAddr]) -> String {
    let global = ips.iter().find(|ip| match ip {
        IpAddr::V4(v4) => {
            !(v4.is_loopback()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_link_local()
                || v4.is_broadcast())
        }
        IpAddr::V6(v6) => {
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (v6.segments()[0] & 0xffc0) == 0xfe80)
        }
    });
    match global {
        Some(ip) => ip.to_string(),
        None => "0.0.0.0".into(),
    }
}

/// The ports the workload receives on, by port: the Sidecar's ingress listeners when it has
/// any, else the target ports of the services that list this proxy's address as an endpoint.
fn chain_configs(view: &View<'_>) -> Vec<ChainConfig> {
    let mut by_port: BTreeMap<u32, ChainConfig> = BTreeMap::new();
    let instances = view.local_instances();
    if let Some(sidecar) = &view.scope.sidecar
        && !sidecar.spec.ingress.is_empty()
    {
        for i in &sidecar.spec.ingress {
            let Some(port) = i.port.as_ref() else {
                continue;
            };
            let mut protocol = Protocol::parse(&port.protocol);
            let tls = i
                .tls
                .clone()
                .filter(|_| view.proxy.flags.tls_on_sidecar_ingress);
            if tls.is_some() {
                protocol = protocol.map(after_tls_termination);
            }
            let bind = if i.bind.is_empty() {
                inbound_bind(&view.proxy.ips)
            } else {
                i.bind.clone()
            };
            // The service the port serves, if one does (istiod's labels stand for no other).
            let serving = instances.iter().find(|l| l.target == port.number);
            let services = serving
                .map(|l| (l.service_port, metadata::ServiceLabel::of(l.service)))
                .into_iter()
                .collect();
            let rule = serving.and_then(|l| {
                Some((
                    view.destination_rules.for_inbound(l.service)?,
                    l.service_port,
                ))
            });
            by_port.entry(port.number).or_insert(ChainConfig {
                port: port.number,
                protocol,
                endpoint: parse_endpoint(&i.default_endpoint, &view.proxy.ips),
                bind,
                tls,
                passthrough: false,
                services,
                build: view.proxy.build,
                rule,
                sidecar: Some(sidecar.meta.clone()),
            });
        }
        return by_port.into_values().collect();
    }
    for local in &instances {
        let cc = by_port.entry(local.target).or_insert(ChainConfig {
            port: local.target,
            protocol: local.protocol,
            bind: "0.0.0.0".into(),
            endpoint: None,
            tls: None,
            passthrough: false,
            services: Vec::new(),
            build: view.proxy.build,
            rule: view
                .destination_rules
                .for_inbound(local.service)
                .map(|dr| (dr, local.service_port)),
            sidecar: None,
        });
        let label = metadata::ServiceLabel::of(local.service);
        let first_port = cc.services.first().map_or(local.service_port, |(p, _)| *p);
        if local.service_port == first_port
            && !cc.services.iter().any(|(_, l)| l.host == label.host)
        {
            cc.services.push((local.service_port, label));
        }
    }
    by_port.into_values().collect()
}

/// What a port carries once its TLS is terminated (`HTTPS` is `HTTP`, `TLS` is `TCP`).
fn after_tls_termination(p: Protocol) -> Protocol {
    match p {
        Protocol::Https => Protocol::Http,
        Protocol::Tls => Protocol::Tcp,
        other => other,
    }
}

/// A Sidecar ingress listener's `defaultEndpoint`: `127.0.0.1:8080` or `[::1]:8080`,
/// `0.0.0.0:8080` or `[::]:8080` (the proxy's own address of that family, else localhost), or
/// `unix://…`. Empty (or unreadable) means the original destination.
fn parse_endpoint(text: &str, ips: &[IpAddr]) -> Option<(String, u32)> {
    if text.starts_with("unix://") {
        return Some((text.to_string(), 0));
    }
    let (host, p) = text.rsplit_once(':')?;
    let p: u32 = p.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let own = |v4: bool, fallback: &str| {
        ips.iter()
            .find(|ip| ip.is_ipv4() == v4)
            .map_or_else(|| fallback.to_string(), IpAddr::to_string)
    };
    let address = match host {
        "0.0.0.0" => own(true, "127.0.0.1"),
        "::" => own(false, "::1"),
        other => other.to_string(),
    };
    Some((address, p))
}
