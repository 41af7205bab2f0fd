//! Which Gateways apply to a router and how their servers merge into listeners, as istiod merges
//! them: Gateways oldest first (then by name, then namespace); each server's port translated to
//! the port the router really listens on; servers that cannot share a listener with an earlier
//! one left out.
//!
//! A Gateway applies when its selector matches the router's labels (no selector: every router),
//! or, with the `internal.istio.io/gateway-service` annotation, when one of the listed services
//! of the Gateway's namespace (its parent Gateway's, `internal.istio.io/parent-namespace`, for a
//! ListenerSet's) has the router as an endpoint. The router's *service targets* are
//! the ports of the services whose endpoints include one of its addresses: a server port equal to
//! such a service port is served on the endpoint's target port (`80` becomes `8080` for a Service
//! `80 → 8080`). A Gateway bound by annotation serves only ports of its services; a selected one
//! keeps a port no service exposes as it is, and takes the first service that exposes it, unless
//! that service carries `experimental.istio.io/disable-gateway-port-translation`.
//!
//! Conflicts, per listener port: plain HTTP servers merge into one route configuration
//! (`http.<port>`); a plain server of another protocol, or a second plain non-HTTP server, on a
//! port a plain server holds is dropped (unless it binds another address); TLS servers share a
//! port, told apart by SNI, but a server naming a host an earlier TLS server on that port and
//! bind already named is dropped whole, and two terminating HTTPS servers need distinct route
//! names.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use pasa_istio::common::Protocol;
use pasa_istio::gateway::{Gateway, Server, TlsMode};
use pasa_istio::label_selector::selects;

use super::proxy::Proxy;
use super::registry::{Config, Registry};

/// The annotation binding a Gateway to services instead of a label selector: a comma-separated
/// list of service host names, each in the Gateway's namespace.
pub use pasa_istio::generated::GATEWAY_SERVICE_ANNOTATION;
/// The label by which a service opts out of gateway port translation.
pub const DISABLE_PORT_TRANSLATION_LABEL: &str =
    "experimental.istio.io/disable-gateway-port-translation";

/// One port of a service that has the router as an endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceTarget {
    pub hostname: String,
    pub namespace: String,
    /// The service port.
    pub port: u32,
    /// Where the router receives it.
    pub target_port: u32,
    /// The service opted out of port translation.
    pub no_translation: bool,
}

/// A Gateway that applies to the router, with the service ports it is served for.
#[derive(Debug, Clone)]
pub struct Applied<'a> {
    pub gateway: &'a Arc<Config<Gateway>>,
    /// Chosen by label selector (ports without a service are served as they are).
    pub by_selector: bool,
    pub targets: Vec<ServiceTarget>,
}

impl Applied<'_> {
    /// `namespace/name`, as VirtualServices bind to it.
    pub fn name(&self) -> String {
        format!("{}/{}", self.gateway.meta.namespace, self.gateway.meta.name)
    }
}

/// The service ports whose endpoints include one of the proxy's addresses, oldest service first.
pub fn service_targets(proxy: &Proxy, registry: &Registry) -> Vec<ServiceTarget> {
    let mut services: Vec<_> = registry
        .services()
        .values()
        .filter_map(|list| list.first())
        .collect();
    services.sort_by(|a, b| (a.created, &a.hostname).cmp(&(b.created, &b.hostname)));
    let ips: Vec<String> = proxy.ips.iter().map(ToString::to_string).collect();
    let mut out = Vec::new();
    for service in services {
        let no_translation = registry
            .resource(&service.source)
            .is_some_and(|r| r.labels.contains_key(DISABLE_PORT_TRANSLATION_LABEL));
        for endpoint in service
            .endpoints
            .iter()
            .filter(|e| ips.contains(&e.address))
        {
            for (port, target) in endpoint.ports.iter() {
                let t = ServiceTarget {
                    hostname: service.hostname.clone(),
                    namespace: service.namespace.clone(),
                    port: *port,
                    target_port: *target,
                    no_translation,
                };
                if !out.contains(&t) {
                    out.push(t);
                }
            }
        }
    }
    out
}

/// The namespace of the Services a Gateway binds to by `internal.istio.io/gateway-service`: its
/// own, or, for one PCP generated from a ListenerSet's listener, its parent Gateway's
/// (`internal.istio.io/parent-namespace`).
pub fn services_namespace(gateway: &Config<Gateway>) -> &str {
    gateway
        .meta
        .annotations
        .get(pasa_istio::generated::PARENT_NAMESPACE_ANNOTATION)
        .filter(|ns| {
            !ns.is_empty()
                && pasa_istio::generated::is_internal_gateway_reference(&gateway.meta.name)
        })
        .unwrap_or(&gateway.meta.namespace)
}

/// The Gateways that apply to the proxy, in istiod's order: oldest first, then name, then
/// namespace.
pub fn applying<'a>(proxy: &Proxy, registry: &'a Registry) -> Vec<Applied<'a>> {
    let mut gateways: Vec<&Arc<Config<Gateway>>> = registry.gateways().collect();
    gateways.sort_by(|a, b| a.meta.age_key().cmp(&b.meta.age_key()));
    let targets = service_targets(proxy, registry);
    let mut out = Vec::new();
    for gateway in gateways {
        if let Some(list) = gateway.meta.annotations.get(GATEWAY_SERVICE_ANNOTATION) {
            let known: BTreeSet<&str> = list.split(',').map(str::trim).collect();
            let namespace = services_namespace(gateway);
            let mine: Vec<ServiceTarget> = targets
                .iter()
                .filter(|t| known.contains(t.hostname.as_str()) && t.namespace == namespace)
                .cloned()
                .collect();
            if !mine.is_empty() {
                out.push(Applied {
                    gateway,
                    by_selector: false,
                    targets: mine,
                });
            }
        } else if selects(&gateway.spec.selector, &proxy.labels) {
            out.push(Applied {
                gateway,
                by_selector: true,
                targets: targets.clone(),
            });
        }
    }
    out
}

/// The ports a server port is listened on.
fn resolve_ports(number: u32, targets: &[ServiceTarget], by_selector: bool) -> Vec<u32> {
    let mut ports = BTreeSet::new();
    for t in targets {
        if t.no_translation && by_selector {
            continue;
        }
        if t.port == number {
            if by_selector {
                return vec![t.target_port];
            }
            ports.insert(t.target_port);
        }
    }
    if ports.is_empty() && by_selector {
        return vec![number];
    }
    ports.into_iter().collect()
}

/// One server of one Gateway on one listener port.
#[derive(Debug, Clone)]
pub struct Bound<'a> {
    pub gateway: &'a Arc<Config<Gateway>>,
    /// The server, its hosts in istiod's form (`ns/host` or `host`).
    pub server: Server,
    /// Its route configuration, empty when it does not route HTTP.
    pub route_name: String,
}

impl Bound<'_> {
    /// `namespace/name` of the Gateway.
    pub fn gateway_name(&self) -> String {
        format!("{}/{}", self.gateway.meta.namespace, self.gateway.meta.name)
    }

    /// The port the server declares.
    pub fn port(&self) -> u32 {
        self.server.port.as_ref().map_or(0, |p| p.number)
    }

    pub fn protocol(&self) -> Option<Protocol> {
        protocol_of(&self.server)
    }

    pub fn tls_mode(&self) -> Option<TlsMode> {
        self.server.tls.as_ref().map(|t| t.mode)
    }

    pub fn is_passthrough(&self) -> bool {
        self.tls_mode().is_some_and(TlsMode::is_passthrough)
    }

    /// An HTTPS server that terminates TLS: HTTP behind its own filter chain.
    pub fn terminates_https(&self) -> bool {
        self.server.tls.is_some()
            && self.protocol() == Some(Protocol::Https)
            && !self.is_passthrough()
    }

    /// Its hosts without namespaces, sorted and deduplicated: the SNI names of its chain.
    pub fn sni_hosts(&self) -> Vec<String> {
        let set: BTreeSet<String> = self
            .server
            .hosts
            .iter()
            .map(|h| h.split_once('/').map_or(h.as_str(), |(_, h)| h).to_string())
            .collect();
        set.into_iter().collect()
    }
}

fn protocol_of(server: &Server) -> Option<Protocol> {
    server
        .port
        .as_ref()
        .and_then(|p| Protocol::parse(&p.protocol))
}

fn is_http(p: Option<Protocol>) -> bool {
    p.is_some_and(Protocol::is_http)
}

/// Routes HTTP: an HTTP protocol, or HTTPS that is not passed through.
fn is_http_server(server: &Server) -> bool {
    let p = protocol_of(server);
    is_http(p)
        || (p == Some(Protocol::Https)
            && !server.tls.as_ref().is_some_and(|t| t.mode.is_passthrough()))
}

/// Has TLS settings and is not an HTTP server redirecting to HTTPS.
fn is_tls_server(server: &Server) -> bool {
    server.tls.is_some() && !is_http(protocol_of(server))
}

/// A route configuration name of [`route_name`]'s, read as istiod reads it (its EnvoyFilter
/// matches): `http.<port>`, or
/// `https.<port>.<port name>.<gateway>.<namespace>` (port, port name, `namespace/gateway`).
pub fn read_route_name(name: &str) -> (u32, &str, String) {
    if let Some(port) = name.strip_prefix("http.") {
        return (port.parse().unwrap_or(0), "", String::new());
    }
    if let Some(rest) = name.strip_prefix("https.")
        && name.matches('.').count() == 4
    {
        let parts: Vec<&str> = rest.split('.').collect();
        return (
            parts[0].parse().unwrap_or(0),
            parts[1],
            format!("{}/{}", parts[3], parts[2]),
        );
    }
    (0, "", String::new())
}

/// istiod's route configuration name for a server on `port`: `http.<port>[.<bind>]` for HTTP,
/// `https.<port>.<portName>.<gateway>.<namespace>[.<bind>]` for terminating HTTPS (with the
/// declared port), empty otherwise.
fn route_name(server: &Server, port: u32, gateway: &Config<Gateway>) -> String {
    let bind = if server.bind.is_empty() {
        String::new()
    } else {
        format!(".{}", server.bind)
    };
    let p = protocol_of(server);
    if is_http(p) {
        return format!("http.{port}{bind}");
    }
    let passthrough = server.tls.as_ref().is_some_and(|t| t.mode.is_passthrough());
    if p == Some(Protocol::Https) && !passthrough {
        let declared = server.port.as_ref().map_or(0, |p| p.number);
        let name = server.port.as_ref().map_or("", |p| p.name.as_str());
        return format!(
            "https.{declared}.{name}.{}.{}{bind}",
            gateway.meta.name, gateway.meta.namespace
        );
    }
    String::new()
}

/// `./host` becomes `<gateway namespace>/host`, `*/host` becomes `host`, `*/*` alone `*`.
fn sanitize(server: &Server, namespace: &str) -> Server {
    let mut out = server.clone();
    let mut hosts = Vec::new();
    for h in &server.hosts {
        match h.split_once('/') {
            Some((".", host)) => hosts.push(format!("{namespace}/{host}")),
            Some(("*", "*")) => {
                hosts = vec!["*".to_string()];
                break;
            }
            Some(("*", host)) => hosts.push(host.to_string()),
            _ => hosts.push(h.clone()),
        }
    }
    out.hosts = hosts;
    out
}

/// A listener a merged gateway needs: port, the protocol of its first server, bind address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServerPort {
    pub number: u32,
    pub protocol: String,
    pub bind: String,
}

impl ServerPort {
    pub fn is_http(&self) -> bool {
        is_http(Protocol::parse(&self.protocol))
    }
}

/// The servers of one [`ServerPort`], by index into [`Merged::bound`].
#[derive(Debug, Clone, Default)]
pub struct MergedServers {
    pub servers: Vec<usize>,
    /// The route configuration of plain HTTP servers.
    pub route_name: String,
}

/// Every Gateway of the router merged into one.
#[derive(Debug, Default)]
pub struct Merged<'a> {
    pub bound: Vec<Bound<'a>>,
    /// Listener ports in the order they were first seen.
    pub ports: Vec<ServerPort>,
    pub servers: HashMap<ServerPort, MergedServers>,
    /// HTTP route configurations and the servers they serve.
    pub by_route: BTreeMap<String, Vec<usize>>,
    /// Some server passes TLS through by the SNI-DNAT convention (`AUTO_PASSTHROUGH`).
    pub auto_passthrough: bool,
}

impl<'a> Merged<'a> {
    fn add(&mut self, b: Bound<'a>) -> usize {
        self.bound.push(b);
        self.bound.len() - 1
    }

    /// A server on a port (and bind) first seen now.
    fn add_first(&mut self, at: usize, sp: ServerPort, plain: &mut HashMap<u32, ServerPort>) {
        let server = &self.bound[at].server;
        if !is_tls_server(server) {
            plain.insert(sp.number, sp.clone());
        }
        let route = self.bound[at].route_name.clone();
        if is_http_server(server) {
            self.by_route.insert(route.clone(), vec![at]);
        }
        self.servers.insert(
            sp.clone(),
            MergedServers {
                servers: vec![at],
                route_name: route,
            },
        );
        self.ports.push(sp);
    }
}

/// Merges the servers of the applying Gateways (see the module doc).
pub fn merge<'a>(gateways: &[Applied<'a>]) -> Merged<'a> {
    let mut m = Merged::default();
    let mut ports_seen: BTreeSet<u32> = BTreeSet::new();
    let mut plain: HashMap<u32, ServerPort> = HashMap::new();
    let mut tls_binds: HashMap<u32, BTreeSet<String>> = HashMap::new();
    // Per listener port, TLS host → bind.
    let mut tls_hosts: HashMap<u32, HashMap<String, String>> = HashMap::new();
    for applied in gateways {
        let gateway = applied.gateway;
        for original in &gateway.spec.servers {
            let Some(port) = original.port.as_ref() else {
                continue;
            };
            let server = sanitize(original, &gateway.meta.namespace);
            for resolved in resolve_ports(port.number, &applied.targets, applied.by_selector) {
                let route = route_name(&server, resolved, gateway);
                if server.tls.is_some() {
                    let known = tls_hosts.entry(resolved).or_default();
                    if !check_duplicates(&server.hosts, &server.bind, known).is_empty() {
                        tracing::debug!(gateway = %applied.name(), port = resolved,
                            "server left out: a host is already served over TLS on this port");
                        continue;
                    }
                    if server
                        .tls
                        .as_ref()
                        .is_some_and(|t| t.mode == TlsMode::AutoPassthrough)
                    {
                        m.auto_passthrough = true;
                    }
                }
                let sp = ServerPort {
                    number: resolved,
                    protocol: port.protocol.clone(),
                    bind: server.bind.clone(),
                };
                let bound = Bound {
                    gateway,
                    server: server.clone(),
                    route_name: route.clone(),
                };
                if !ports_seen.insert(resolved) {
                    merge_onto_port(&mut m, bound, sp, &mut plain, &mut tls_binds);
                } else {
                    let at = m.add(bound);
                    m.add_first(at, sp, &mut plain);
                }
            }
        }
    }
    m
}

/// A server on a port some earlier server already uses.
fn merge_onto_port<'a>(
    m: &mut Merged<'a>,
    bound: Bound<'a>,
    sp: ServerPort,
    plain: &mut HashMap<u32, ServerPort>,
    tls_binds: &mut HashMap<u32, BTreeSet<String>>,
) {
    let route = bound.route_name.clone();
    let protocol = protocol_of(&bound.server);
    if let Some(current) = plain.get(&sp.number).cloned() {
        let mergeable = {
            let existing = Protocol::parse(&current.protocol);
            (is_http(existing) || existing == protocol) && is_http(protocol)
        };
        if current.bind == sp.bind && (!mergeable || route.is_empty()) {
            tracing::debug!(gateway = %bound.gateway_name(), port = sp.number,
                "server left out: it conflicts with an earlier server on this port");
            return;
        }
        let at = m.add(bound);
        if current.bind != sp.bind {
            if let Some(ms) = m.servers.get_mut(&sp) {
                ms.route_name = route.clone();
                ms.servers.push(at);
                m.by_route.entry(route).or_default().push(at);
            } else {
                m.add_first(at, sp, plain);
            }
        } else {
            if let Some(ms) = m.servers.get_mut(&current) {
                ms.servers.push(at);
            }
            m.by_route.entry(route).or_default().push(at);
        }
        return;
    }
    if !is_tls_server(&bound.server) {
        let at = m.add(bound);
        m.add_first(at, sp, plain);
        return;
    }
    if is_http_server(&bound.server) && (route.is_empty() || m.by_route.contains_key(&route)) {
        tracing::debug!(gateway = %bound.gateway_name(), port = sp.number,
            "server left out: its HTTPS route name is already taken on this port");
        return;
    }
    let new_bind = tls_binds
        .entry(sp.number)
        .or_default()
        .insert(sp.bind.clone());
    if bound.server.tls.is_none() && !new_bind {
        return;
    }
    let http = is_http_server(&bound.server);
    let at = m.add(bound);
    if http {
        m.by_route.insert(route, vec![at]);
    }
    match m.servers.get_mut(&sp) {
        Some(ms) => ms.servers.push(at),
        None => {
            m.servers.insert(
                sp.clone(),
                MergedServers {
                    servers: vec![at],
                    route_name: String::new(),
                },
            );
            m.ports.push(sp);
        }
    }
}

/// The hosts already known on the same bind; when there are none, all of `hosts` become known.
pub fn check_duplicates(
    hosts: &[String],
    bind: &str,
    known: &mut HashMap<String, String>,
) -> Vec<String> {
    let duplicates: Vec<String> = hosts
        .iter()
        .filter(|h| known.get(*h).is_some_and(|b| b == bind))
        .cloned()
        .collect();
    if duplicates.is_empty() {
        for h in hosts {
            known.insert(h.clone(), bind.to_string());
        }
    }
    duplicates
}
