//! HTTP on a router: the route configurations of merged servers (`http.<port>` shared by plain
//! HTTP servers, one per terminating HTTPS server) and the server-side TLS of terminating chains.

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteConfiguration, VirtualHost, virtual_host,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SdsSecretConfig,
    TlsParameters,
    certificate_validation_context::TrustChainVerification,
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    tls_parameters,
};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;
use pasa_istio::gateway::{Server, ServerTlsSettings, TlsMode, TlsProtocol};
use pasa_istio::host;

use super::super::{View, cluster, hcm, route, sds, session};
use super::bound_virtual_services;
use crate::model::gateway::Bound;
use crate::model::secrets;

/// The virtual hosts of the servers sharing one route configuration, named after each server's
/// declared port (`host:80` on the listener of target port 8080).
pub(super) fn route_config(
    view: &View<'_>,
    name: &str,
    servers: &[&Bound<'_>],
) -> RouteConfiguration {
    let mut vhosts: BTreeMap<String, VirtualHost> = BTreeMap::new();
    let attempt_count = view.hcm(hcm::Class::Gateway).attempt_count;
    for bound in servers {
        let gateway = bound.gateway_name();
        let port = bound.port();
        let redirect = bound.server.tls.as_ref().is_some_and(|t| t.https_redirect);
        for vs in bound_virtual_services(view, &gateway) {
            let ns = &vs.meta.namespace;
            let vs_hosts: Vec<String> = vs
                .spec
                .hosts
                .iter()
                .map(|h| view.proxy.resolve_host(h, ns))
                .collect();
            let hosts = intersection(&bound.server, ns, &vs_hosts);
            if hosts.is_empty() {
                continue;
            }
            let routes = route::virtual_service_routes(vs, port, &gateway, view);
            for hostname in hosts {
                let hostname = hostname.to_ascii_lowercase();
                match vhosts.get_mut(&hostname) {
                    // A later VirtualService for the same host adds its routes after the earlier's.
                    Some(vh) => {
                        vh.routes.extend(routes.iter().cloned());
                        if redirect {
                            vh.require_tls = virtual_host::TlsRequirementType::All as i32;
                        }
                    }
                    None => {
                        let mut vh = route::virtual_host(
                            format!("{hostname}:{port}"),
                            vec![hostname.clone()],
                            routes.clone(),
                            attempt_count,
                        );
                        // The persistent sessions of the service the host names exactly.
                        if let Some(session) = view.session_of(&hostname) {
                            session::configure(&mut vh.typed_per_filter_config, session);
                        }
                        if redirect {
                            vh.require_tls = virtual_host::TlsRequirementType::All as i32;
                        }
                        vhosts.insert(hostname, vh);
                    }
                }
            }
        }
        // A redirecting server answers for its own hosts even with no VirtualService bound.
        if redirect {
            for h in &bound.server.hosts {
                let hostname = h
                    .split_once('/')
                    .map_or(h.as_str(), |(_, h)| h)
                    .to_ascii_lowercase();
                let vh = vhosts.entry(hostname.clone()).or_insert_with(|| {
                    route::virtual_host(
                        format!("{hostname}:{port}"),
                        vec![hostname.clone()],
                        Vec::new(),
                        attempt_count,
                    )
                });
                vh.require_tls = virtual_host::TlsRequirementType::All as i32;
            }
        }
    }
    let mut virtual_hosts: Vec<VirtualHost> = vhosts
        .into_values()
        .map(|mut vh| {
            vh.routes = catch_all_last(std::mem::take(&mut vh.routes));
            vh
        })
        .collect();
    virtual_hosts.sort_by(|a, b| a.name.cmp(&b.name));
    if virtual_hosts.is_empty() {
        let port = servers.first().map_or(0, |b| b.port());
        // istiod's answers 404 and says nothing of attempts.
        virtual_hosts.push(route::virtual_host(
            format!("blackhole:{port}"),
            vec!["*".into()],
            Vec::new(),
            false,
        ));
    }
    RouteConfiguration {
        name: name.to_string(),
        virtual_hosts,
        validate_clusters: Some(BoolValue { value: false }),
        ignore_port_in_host_matching: true,
        max_direct_response_body_size_bytes: route::max_direct_response_body(),
        ..Default::default()
    }
}

/// Routes that match every request move behind the others (they would hide them).
fn catch_all_last(routes: Vec<Route>) -> Vec<Route> {
    let (catch_all, rest): (Vec<Route>, Vec<Route>) = routes.into_iter().partition(is_catch_all);
    rest.into_iter().chain(catch_all).collect()
}

fn is_catch_all(r: &Route) -> bool {
    r.r#match.as_ref().is_some_and(route::is_catch_all)
}

/// The hosts a VirtualService serves on a server: for each pair of a server host (whose
/// namespace part, if any, must be the VirtualService's) and a VirtualService host that overlap,
/// the narrower of the two.
pub(super) fn intersection(
    server: &Server,
    vs_namespace: &str,
    vs_hosts: &[String],
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for pattern in host_patterns(server, vs_namespace) {
        for vs_host in vs_hosts {
            if host::matches(pattern, vs_host) {
                out.insert(narrower(pattern, vs_host).to_string());
            }
        }
    }
    out
}

/// The server's host patterns that a VirtualService of `vs_namespace` may use: those without a
/// namespace part, or whose namespace part is the VirtualService's (or `*`).
pub(super) fn host_patterns<'s>(
    server: &'s Server,
    vs_namespace: &'s str,
) -> impl Iterator<Item = &'s str> + 's {
    server
        .hosts
        .iter()
        .filter_map(move |h| match h.split_once('/') {
            Some((ns, host)) if ns == vs_namespace || ns == "*" => Some(host),
            Some(_) => None,
            None => Some(h.as_str()),
        })
}

/// Of two overlapping hosts, the one the other covers.
fn narrower<'a>(a: &'a str, b: &'a str) -> &'a str {
    match (a.strip_prefix('*'), b.strip_prefix('*')) {
        (Some(_), None) => b,
        (None, Some(_)) => a,
        (Some(sa), Some(sb)) if sa.len() < sb.len() => b,
        _ => a,
    }
}

/// The server side of a Gateway's TLS, as istiod builds it: the credentials over SDS
/// (`credentialName`, or each of `credentialNames`; `builtin://` is the workload certificate;
/// files otherwise), or the workload certificate for ISTIO_MUTUAL. For MUTUAL and
/// OPTIONAL_MUTUAL, client certificates are checked against the CA of `caCertCredentialName`
/// (else the first credential's `-cacert`), with the SANs, SPKI and hashes to match, and
/// accepted untrusted with `insecureSkipVerify`; required only for MUTUAL (and ISTIO_MUTUAL).
/// Protocol versions and cipher suites apply to SIMPLE and the mutual modes. Every server offers
/// `h2` and `http/1.1`, as from istiod; an ISTIO_MUTUAL TCP server of Istio's proxy
/// (`exchange`) offers the in-band metadata exchange (`istio-peer-exchange`) first.
pub(super) fn server_tls(server: &Server, exchange: bool) -> Option<TransportSocket> {
    let tls = server.tls.as_ref()?;
    let mut common = CommonTlsContext {
        alpn_protocols: exchange
            .then_some("istio-peer-exchange")
            .into_iter()
            .chain(["h2", "http/1.1"])
            .map(String::from)
            .collect(),
        ..Default::default()
    };
    // Client certificates are checked (MUTUAL, OPTIONAL_MUTUAL) and required (not OPTIONAL).
    let mutual = tls.mode.is_mutual();
    let required = matches!(tls.mode, TlsMode::Mutual | TlsMode::IstioMutual);
    let credentials: Vec<&str> = if tls.credential_names.is_empty() {
        Some(tls.credential_name.as_str())
            .filter(|n| !n.is_empty())
            .into_iter()
            .collect()
    } else {
        tls.credential_names.iter().map(String::as_str).collect()
    };
    match tls.mode {
        TlsMode::IstioMutual => {
            common.tls_certificate_sds_secret_configs =
                vec![sds::from_istio_agent(secrets::WORKLOAD_CERTIFICATE)];
            common.validation_context_type =
                Some(ValidationContextType::ValidationContextSdsSecretConfig(
                    sds::from_istio_agent(secrets::ROOT_CA),
                ));
        }
        _ if !credentials.is_empty() => {
            common.tls_certificate_sds_secret_configs =
                credentials.iter().map(|n| credential(n)).collect();
            if mutual {
                let ca = if tls.ca_cert_credential_name.is_empty() {
                    format!("{}{}", credentials[0], secrets::CA_SUFFIX)
                } else {
                    tls.ca_cert_credential_name.clone()
                };
                #[allow(deprecated)] // istiod's field: any SAN type, matched exactly
                let default = CertificateValidationContext {
                    match_subject_alt_names: cluster::exact_sans(&tls.subject_alt_names),
                    verify_certificate_spki: tls.verify_certificate_spki.clone(),
                    verify_certificate_hash: tls.verify_certificate_hash.clone(),
                    trust_chain_verification: if tls.insecure_skip_verify == Some(true) {
                        TrustChainVerification::AcceptUntrusted as i32
                    } else {
                        TrustChainVerification::VerifyTrustChain as i32
                    },
                    ..Default::default()
                };
                common.validation_context_type =
                    Some(ValidationContextType::CombinedValidationContext(
                        CombinedCertificateValidationContext {
                            default_validation_context: Some(default),
                            validation_context_sds_secret_config: Some(credential(&ca)),
                            ..Default::default()
                        },
                    ));
            }
        }
        _ => {
            let file = format!("file-cert:{}~{}", tls.server_certificate, tls.private_key);
            common.tls_certificate_sds_secret_configs = vec![sds::from_istio_agent(&file)];
        }
    }
    if matches!(
        tls.mode,
        TlsMode::Simple | TlsMode::Mutual | TlsMode::OptionalMutual
    ) {
        common.tls_params = tls_params(tls);
    }
    let context = DownstreamTlsContext {
        common_tls_context: Some(common),
        require_client_certificate: Some(BoolValue { value: required }),
        ..Default::default()
    };
    Some(TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(context))),
    })
}

/// A credential over SDS: `builtin://` is the workload certificate (and its `-cacert` the mesh
/// root), anything else a named secret.
fn credential(name: &str) -> SdsSecretConfig {
    const BUILTIN: &str = "builtin://";
    if name == BUILTIN {
        sds::from_istio_agent(secrets::WORKLOAD_CERTIFICATE)
    } else if name.strip_suffix(secrets::CA_SUFFIX) == Some(BUILTIN) {
        sds::from_istio_agent(secrets::ROOT_CA)
    } else {
        sds::credential(name)
    }
}

/// A server's protocol versions and cipher suites, when it sets any.
fn tls_params(tls: &ServerTlsSettings) -> Option<TlsParameters> {
    let version = |v: TlsProtocol| match v {
        TlsProtocol::Auto | TlsProtocol::Unknown(_) => None,
        TlsProtocol::V1_0 => Some(tls_parameters::TlsProtocol::TlSv10),
        TlsProtocol::V1_1 => Some(tls_parameters::TlsProtocol::TlSv11),
        TlsProtocol::V1_2 => Some(tls_parameters::TlsProtocol::TlSv12),
        TlsProtocol::V1_3 => Some(tls_parameters::TlsProtocol::TlSv13),
    };
    let min = version(tls.min_protocol_version);
    let max = version(tls.max_protocol_version);
    if min.is_none() && max.is_none() && tls.cipher_suites.is_empty() {
        return None;
    }
    Some(TlsParameters {
        tls_minimum_protocol_version: min.map_or(0, |v| v as i32),
        tls_maximum_protocol_version: max.map_or(0, |v| v as i32),
        cipher_suites: tls.cipher_suites.clone(),
        ..Default::default()
    })
}
