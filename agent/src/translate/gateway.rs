//! Listeners and route configurations of a router (ingress or egress gateway), from the Gateways
//! whose selector matches its labels and the VirtualServices bound to them.
//!
//! So far: servers whose traffic is HTTP once it reaches the proxy (HTTP, HTTP2, GRPC, and HTTPS
//! or TLS servers that terminate TLS). One listener per port (`0.0.0.0_<port>`, or
//! `<bind>_<port>`); plain HTTP servers share the route configuration `http.<port>`, each
//! terminating server gets its own `https.<port>.<portName>.<gateway>.<namespace>` behind a filter
//! chain selected by its hosts as server names. A route configuration holds one virtual host per
//! host of a bound VirtualService that the server's hosts admit (`host:port`), or `blackhole:<port>`
//! when none. TLS passthrough, AUTO_PASSTHROUGH, TCP and TLS routes and conflicts between servers
//! are the next steps.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{
    TrafficDirection, TransportSocket, transport_socket,
};
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost, virtual_host};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, SdsSecretConfig,
    common_tls_context::ValidationContextType,
};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;
use pasa_proto::host;
use pasa_proto::istio::common::Protocol;
use pasa_proto::istio::gateway::{Gateway, Server, TlsMode};

use super::cluster::ads;
use super::endpoint::socket_address;
use super::filters::{self, Routes};
use super::registry::{Config, selects};
use super::{Built, View, route};

/// One server of one Gateway, with where it came from.
struct Bound<'a> {
    gateway: &'a Arc<Config<Gateway>>,
    server: &'a Server,
}

impl Bound<'_> {
    /// `namespace/name` of the Gateway, as VirtualServices bind to it.
    fn gateway_name(&self) -> String {
        format!("{}/{}", self.gateway.meta.namespace, self.gateway.meta.name)
    }

    fn port(&self) -> u32 {
        self.server.port.as_ref().map_or(0, |p| p.number)
    }

    fn protocol(&self) -> Option<Protocol> {
        self.server
            .port
            .as_ref()
            .and_then(|p| Protocol::parse(&p.protocol))
    }

    /// Terminates TLS (or never had any) and routes HTTP.
    fn serves_http(&self) -> bool {
        match self.protocol() {
            Some(p) if p.is_http() => true,
            Some(Protocol::Https | Protocol::Tls) => self
                .server
                .tls
                .as_ref()
                .is_some_and(|t| !t.mode.is_passthrough()),
            _ => false,
        }
    }

    fn terminates_tls(&self) -> bool {
        matches!(self.protocol(), Some(Protocol::Https | Protocol::Tls)) && self.serves_http()
    }

    /// The route configuration name istiod gives this server.
    fn route_name(&self) -> String {
        let port = self.port();
        let bind = if self.server.bind.is_empty() {
            String::new()
        } else {
            format!(".{}", self.server.bind)
        };
        if self.terminates_tls() {
            let port_name = self.server.port.as_ref().map_or("", |p| p.name.as_str());
            format!(
                "https.{port}.{port_name}.{}.{}{bind}",
                self.gateway.meta.name, self.gateway.meta.namespace
            )
        } else {
            format!("http.{port}{bind}")
        }
    }
}

/// The Gateways that select this router, oldest first.
fn gateways<'a>(view: &'a View<'_>) -> Vec<&'a Arc<Config<Gateway>>> {
    let mut list: Vec<&Arc<Config<Gateway>>> = view
        .registry
        .gateways()
        .filter(|g| selects(&g.spec.selector, &view.proxy.labels))
        .collect();
    list.sort_by(|a, b| a.meta.age_key().cmp(&b.meta.age_key()));
    list
}

/// Listeners and route configurations of a router.
pub(super) fn listeners_and_routes(view: &View<'_>, out: &mut Built) {
    let gateways = gateways(view);
    // Servers by listener (bind address, port), in Gateway then server order.
    let mut by_listener: BTreeMap<(String, u32), Vec<Bound<'_>>> = BTreeMap::new();
    for gateway in &gateways {
        for server in &gateway.spec.servers {
            let bound = Bound { gateway, server };
            if bound.port() == 0 || !bound.serves_http() {
                continue;
            }
            let bind = if server.bind.is_empty() {
                "0.0.0.0".to_string()
            } else {
                server.bind.clone()
            };
            by_listener
                .entry((bind, bound.port()))
                .or_default()
                .push(bound);
        }
    }
    for ((bind, port), servers) in by_listener {
        let mut chains = Vec::new();
        let mut plain: Vec<&Bound<'_>> = Vec::new();
        for bound in &servers {
            if bound.terminates_tls() {
                let name = bound.route_name();
                out.routes
                    .insert(name.clone(), route_config(view, &name, port, &[bound]));
                chains.push(tls_chain(bound, &name));
            } else {
                plain.push(bound);
            }
        }
        if !plain.is_empty() {
            let name = plain[0].route_name();
            out.routes
                .insert(name.clone(), route_config(view, &name, port, &plain));
            let hcm = filters::http_connection_manager(&name, Routes::Rds(name.clone()));
            chains.push(FilterChain {
                filters: vec![filters::hcm_filter(hcm)],
                ..Default::default()
            });
        }
        let name = super::names::listener(&bind, port);
        out.listeners.insert(
            name.clone(),
            Listener {
                name,
                address: Some(socket_address(&bind, port)),
                filter_chains: chains,
                traffic_direction: TrafficDirection::Outbound as i32,
                ..Default::default()
            },
        );
    }
}

/// A terminating server's chain: selected by its hosts as server names, TLS from its credential.
fn tls_chain(bound: &Bound<'_>, route_name: &str) -> FilterChain {
    let server_names: Vec<String> = bound
        .server
        .hosts
        .iter()
        .map(|h| h.split_once('/').map_or(h.as_str(), |(_, h)| h).to_string())
        .filter(|h| h != "*")
        .collect();
    let hcm = filters::http_connection_manager(route_name, Routes::Rds(route_name.to_string()));
    FilterChain {
        filter_chain_match: Some(FilterChainMatch {
            server_names,
            ..Default::default()
        }),
        filters: vec![filters::hcm_filter(hcm)],
        transport_socket: server_tls(bound.server),
        ..Default::default()
    }
}

/// The server side of a Gateway's TLS: the credential over SDS (`credentialName`, or the
/// workload certificate for ISTIO_MUTUAL), client certificates required for the mutual modes.
fn server_tls(server: &Server) -> Option<TransportSocket> {
    let tls = server.tls.as_ref()?;
    let sds = |name: &str| SdsSecretConfig {
        name: name.to_string(),
        sds_config: Some(ads()),
    };
    let mut common = CommonTlsContext {
        alpn_protocols: vec!["h2".into(), "http/1.1".into()],
        ..Default::default()
    };
    let mutual = tls.mode.is_mutual();
    match tls.mode {
        TlsMode::IstioMutual => {
            common.tls_certificate_sds_secret_configs = vec![sds("default")];
            common.validation_context_type = Some(
                ValidationContextType::ValidationContextSdsSecretConfig(sds("ROOTCA")),
            );
        }
        _ if !tls.credential_name.is_empty() => {
            let credential = format!("kubernetes://{}", tls.credential_name);
            common.tls_certificate_sds_secret_configs = vec![sds(&credential)];
            if mutual {
                common.validation_context_type =
                    Some(ValidationContextType::ValidationContextSdsSecretConfig(
                        sds(&format!("{credential}-cacert")),
                    ));
            }
        }
        _ => {
            let file = format!("file-cert:{}~{}", tls.server_certificate, tls.private_key);
            common.tls_certificate_sds_secret_configs = vec![sds(&file)];
        }
    }
    let context = DownstreamTlsContext {
        common_tls_context: Some(common),
        require_client_certificate: Some(BoolValue { value: mutual }),
        ..Default::default()
    };
    Some(TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(context))),
    })
}

/// The virtual hosts of the servers sharing one route configuration.
fn route_config(
    view: &View<'_>,
    name: &str,
    port: u32,
    servers: &[&Bound<'_>],
) -> RouteConfiguration {
    let mut vhosts: BTreeMap<String, VirtualHost> = BTreeMap::new();
    let https_redirect = servers
        .iter()
        .any(|b| b.server.tls.as_ref().is_some_and(|t| t.https_redirect));
    for bound in servers {
        let gateway = bound.gateway_name();
        for vs in view.registry.virtual_services() {
            let ns = &vs.meta.namespace;
            if !vs
                .spec
                .gateways
                .iter()
                .any(|g| pasa_proto::gateway::resolve_gateway_name(g, ns) == gateway)
            {
                continue;
            }
            for vs_host in &vs.spec.hosts {
                let Some(hostname) = admitted(
                    bound.server,
                    &bound.gateway.meta.namespace,
                    ns,
                    &view.proxy.resolve_host(vs_host, ns),
                ) else {
                    continue;
                };
                let key = format!("{hostname}:{port}");
                if vhosts.contains_key(&key) {
                    continue;
                }
                let routes = route::http_routes(&vs.spec.http, ns, port, &gateway, view);
                let mut vh = route::virtual_host(
                    key.clone(),
                    vec![hostname.clone(), format!("{hostname}:*")],
                    routes,
                );
                if https_redirect {
                    vh.require_tls = virtual_host::TlsRequirementType::All as i32;
                }
                vhosts.insert(key, vh);
            }
        }
    }
    // A redirecting server answers for its own hosts even with no VirtualService bound.
    for bound in servers {
        if !bound.server.tls.as_ref().is_some_and(|t| t.https_redirect) {
            continue;
        }
        for h in &bound.server.hosts {
            let hostname = h.split_once('/').map_or(h.as_str(), |(_, h)| h);
            let key = format!("{hostname}:{port}");
            if vhosts.contains_key(&key) {
                continue;
            }
            let mut vh = route::virtual_host(
                key.clone(),
                vec![hostname.to_string(), format!("{hostname}:*")],
                Vec::new(),
            );
            vh.require_tls = virtual_host::TlsRequirementType::All as i32;
            vhosts.insert(key, vh);
        }
    }
    let mut virtual_hosts: Vec<VirtualHost> = vhosts.into_values().collect();
    if virtual_hosts.is_empty() {
        virtual_hosts.push(route::virtual_host(
            format!("blackhole:{port}"),
            vec!["*".into()],
            Vec::new(),
        ));
    }
    RouteConfiguration {
        name: name.to_string(),
        virtual_hosts,
        validate_clusters: Some(BoolValue { value: false }),
        ..Default::default()
    }
}

/// The host a VirtualService host becomes on a server: the more specific of the two when one of
/// the server's hosts (`namespace/host`, namespace `*` or `.` for the Gateway's) admits it.
fn admitted(
    server: &Server,
    gateway_namespace: &str,
    vs_namespace: &str,
    vs_host: &str,
) -> Option<String> {
    server.hosts.iter().find_map(|h| {
        let (ns, pattern) = h.split_once('/').unwrap_or(("*", h));
        let ns_ok =
            ns == "*" || ns == vs_namespace || (ns == "." && vs_namespace == gateway_namespace);
        if !ns_ok || !host::matches(pattern, vs_host) {
            return None;
        }
        // The narrower name: `*.example.com` on the server and `a.example.com` in the VS give
        // `a.example.com`, and the other way round too.
        let narrower = if pattern.starts_with('*') && !vs_host.starts_with('*') {
            vs_host
        } else if (vs_host.starts_with('*') && !pattern.starts_with('*'))
            || pattern.len() > vs_host.len()
        {
            pattern
        } else {
            vs_host
        };
        Some(narrower.to_string())
    })
}
