//! Outbound route configurations of a sidecar, as istiod builds them.
//!
//! For a port, the services with that port (HTTP or sniffed) and the VirtualServices naming them
//! become virtual hosts: first one per VirtualService (oldest first), holding the services its
//! hosts claim (an exact host claims its service; a wildcard claims the services it is the most
//! specific VirtualService for) and its hosts that name no service; then one per service without
//! a VirtualService, with the default route. A virtual host name or a domain already taken by an
//! earlier virtual host is not repeated, so the older VirtualService wins. Port 80 also carries
//! the VirtualServices whose hosts name no service at all. Virtual hosts are sorted by name and
//! the catch-all (`allow_any`, `block_all`, `allow_any_dynamic_dns`) goes last.
//!
//! A sniffed service bound to its own address (`<vip>_<port>`) gets the route configuration
//! `<host>:<port>`: only its own virtual host, matching any domain.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
use envoy_types::pb::google::protobuf::BoolValue;
use pasa_proto::istio::virtual_service::VirtualService;
use prost::Message;
use rustc_hash::FxHashSet;

use super::super::{Shapes, View, follow_service, names, route, virtual_service_inputs};
use super::catch_all;
use crate::model::registry::{Config, Resolution, Service};
use crate::resource::Resource;

/// What a sidecar's route configurations reuse from one build to the next: the routes of each
/// VirtualService for a port, each service's virtual host before de-duplication, and each route
/// configuration's encoded virtual hosts. A VirtualService change then builds that
/// VirtualService's routes and encodes its virtual hosts; the rest of the configuration is
/// copied from the previous encoding.
#[derive(Debug, Default)]
pub(in crate::translate) struct Reuse {
    routes: RouteMemo,
    /// By port, then by service host.
    hosts: HashMap<u32, HashMap<String, ServiceHost>>,
    /// By route configuration name, then by a fingerprint of the virtual host's name, domains
    /// and routes.
    encoded: HashMap<String, HashMap<u64, Arc<Vec<u8>>>>,
}

impl Reuse {
    /// Forgets what belongs to route configurations no longer asked for, and to VirtualServices
    /// and services no longer visible.
    pub(in crate::translate) fn retain(&mut self, view: &View<'_>, names: &BTreeSet<String>) {
        self.encoded.retain(|name, _| names.contains(name));
        let visible: FxHashSet<(&str, &str)> = view
            .virtual_services
            .iter()
            .map(|vs| (vs.meta.namespace.as_str(), vs.meta.name.as_str()))
            .collect();
        self.routes
            .0
            .retain(|(ns, name, _), _| visible.contains(&(ns.as_str(), name.as_str())));
        // Entries of services no longer visible, swept once there are more entries than
        // visible services (so the sweep is rare, and what it leaves is bounded).
        for hosts in self.hosts.values_mut() {
            if hosts.len() > view.services.len() {
                hosts.retain(|host, _| view.services.contains_key(host));
            }
        }
    }
}

/// The routes of each VirtualService for a port: by VirtualService (namespace, name) and port,
/// with the fingerprint of what they read.
#[derive(Debug, Default)]
struct RouteMemo(HashMap<(String, String, u32), BuiltRoutes>);

impl RouteMemo {
    /// The routes of `vs` for `port`, built again only when what they read changed.
    fn get(
        &mut self,
        view: &View<'_>,
        vs: &Arc<Config<VirtualService>>,
        port: u32,
        shapes: &mut Shapes,
    ) -> BuiltRoutes {
        let inputs = virtual_service_inputs(view, vs, shapes);
        let key = (vs.meta.namespace.clone(), vs.meta.name.clone(), port);
        match self.0.get(&key) {
            Some((seen, routes)) if *seen == inputs => (inputs, Arc::clone(routes)),
            _ => {
                let routes = Arc::new(route::virtual_service_routes(
                    vs,
                    port,
                    pasa_proto::gateway::MESH,
                    view,
                ));
                self.0.insert(key, (inputs, Arc::clone(&routes)));
                (inputs, routes)
            }
        }
    }
}

/// A service's virtual host on a port before de-duplication against the other virtual hosts:
/// its name and domains, worked out again only when the service or its aliases change.
#[derive(Debug)]
struct ServiceHost {
    /// What it was worked out from.
    service: Arc<Service>,
    aliases: Vec<String>,
    /// `<host>:<port>`.
    name: String,
    domains: Vec<String>,
    /// Each domain in lower case (domains are unique without regard to case); `None` when they
    /// all are already (the common case: no second copy is kept).
    lower: Option<Vec<String>>,
    /// Whether each domain is also a short form of one of the names (see [`route::alt_hosts`]).
    short: Vec<bool>,
    /// [`identity`] of the name and all the domains.
    identity: u64,
}

impl ServiceHost {
    fn of(view: &View<'_>, service: &Arc<Service>, port: u32) -> ServiceHost {
        let aliases = view
            .aliases
            .get(&service.hostname)
            .cloned()
            .unwrap_or_default();
        let (domains, alt) = service_domains(view, service, &aliases);
        let name = names::host_port(&service.hostname, port);
        ServiceHost {
            service: Arc::clone(service),
            identity: identity(&name, &domains),
            name,
            lower: Some(domains.iter().map(|d| d.to_lowercase()).collect::<Vec<_>>())
                .filter(|lower| *lower != domains),
            short: domains.iter().map(|d| alt.contains(d)).collect(),
            domains,
            aliases,
        }
    }

    /// Domain `i` in lower case.
    fn lower_case(&self, i: usize) -> &str {
        match &self.lower {
            Some(lower) => &lower[i],
            None => &self.domains[i],
        }
    }

    fn is_current(&self, view: &View<'_>, service: &Arc<Service>) -> bool {
        Arc::ptr_eq(&self.service, service)
            && view
                .aliases
                .get(&service.hostname)
                .map_or(&[][..], Vec::as_slice)
                == self.aliases.as_slice()
    }
}

/// Routes as built, with the fingerprint of what they read.
type BuiltRoutes = (u64, Arc<Vec<Route>>);

/// The route configuration named `name` (`"80"` or `"host:81"`), encoded.
pub(in crate::translate) fn route_config(
    view: &View<'_>,
    name: &str,
    reuse: &mut Reuse,
    shapes: &mut Shapes,
) -> Option<Arc<Resource>> {
    let (sniffed, port) = match name.rsplit_once(':') {
        Some((host, port)) => (Some(host), port.parse::<u32>().ok()?),
        None => (None, name.parse::<u32>().ok()?),
    };
    let Reuse {
        routes,
        hosts,
        encoded: encodings,
    } = reuse;
    let mut planned = port_virtual_hosts(view, port, routes, hosts, shapes);
    let config = RouteConfiguration {
        name: name.to_string(),
        validate_clusters: Some(BoolValue { value: false }),
        ignore_port_in_host_matching: true,
        ..Default::default()
    };
    if let Some(host) = sniffed {
        // Only its own virtual host, matching any domain: built as a message.
        planned.retain(|vh| vh.domains.iter().any(|d| d == host || d == name));
        let mut vhosts: Vec<VirtualHost> =
            planned.into_iter().map(|p| p.build(view, port)).collect();
        if let [only] = vhosts.as_mut_slice() {
            only.domains = vec!["*".into()];
        }
        vhosts.sort_by(|a, b| a.name.cmp(&b.name));
        return Some(Resource::pack(&RouteConfiguration {
            virtual_hosts: vhosts,
            ..config
        }));
    }
    planned.sort_by(|a, b| a.name.cmp(&b.name));
    let previous = encodings.remove(name).unwrap_or_default();
    let mut kept = HashMap::with_capacity(planned.len());
    let mut encoded = Vec::with_capacity(planned.len() + 1);
    for vh in planned {
        let key = vh.fingerprint(view, port, shapes);
        let bytes = match previous.get(&key) {
            Some(bytes) => Arc::clone(bytes),
            None => Arc::new(vh.build(view, port).encode_to_vec()),
        };
        kept.insert(key, Arc::clone(&bytes));
        encoded.push(bytes);
    }
    encodings.insert(name.to_string(), kept);
    encoded.push(Arc::new(
        catch_all(view.scope.outbound_policy).encode_to_vec(),
    ));
    Some(assemble(config, &encoded))
}

/// Encodes a route configuration from its virtual hosts' encodings, in the field order a
/// message encoding has (the name, the virtual hosts, then the rest): the same bytes as
/// encoding the whole message.
fn assemble(config: RouteConfiguration, virtual_hosts: &[Arc<Vec<u8>>]) -> Arc<Resource> {
    use prost::encoding::{WireType, encode_key, encode_varint};
    let head = RouteConfiguration {
        name: config.name.clone(),
        ..Default::default()
    };
    let rest = RouteConfiguration {
        name: String::new(),
        ..config
    };
    let size: usize = virtual_hosts.iter().map(|v| v.len() + 6).sum();
    let mut buf = Vec::with_capacity(head.encoded_len() + size + rest.encoded_len());
    head.encode_raw(&mut buf);
    for vh in virtual_hosts {
        encode_key(2, WireType::LengthDelimited, &mut buf);
        encode_varint(vh.len() as u64, &mut buf);
        buf.extend_from_slice(vh);
    }
    rest.encode_raw(&mut buf);
    Resource::from_encoded::<RouteConfiguration>(buf)
}

/// A group of names sharing routes.
struct Wrapper<'v> {
    services: Vec<&'v Arc<Service>>,
    /// Hosts naming no service (resolved, in lower case).
    hosts: Vec<&'v str>,
    routes: Routes<'v>,
}

/// Where a virtual host's routes come from.
#[derive(Clone)]
enum Routes<'v> {
    /// A VirtualService's, with the fingerprint of what they read.
    VirtualService(u64, Arc<Vec<Route>>),
    /// The default route of a service without a VirtualService.
    Default(&'v Arc<Service>),
}

/// A virtual host as planned: built (and encoded) only when no earlier build has it.
struct Planned<'v> {
    name: Cow<'v, str>,
    domains: Cow<'v, [String]>,
    /// [`identity`] of `name` and `domains`.
    identity: u64,
    routes: Routes<'v>,
}

/// A fingerprint of a virtual host's name and domains.
fn identity(name: &str, domains: &[String]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (name, domains).hash(&mut h);
    h.finish()
}

impl Planned<'_> {
    fn build(self, view: &View<'_>, port: u32) -> VirtualHost {
        let routes = match self.routes {
            Routes::VirtualService(_, routes) => routes.as_ref().clone(),
            Routes::Default(service) => vec![view.default_route(service, port)],
        };
        route::virtual_host(self.name.into_owned(), self.domains.into_owned(), routes)
    }

    /// What the virtual host is built from.
    fn fingerprint(&self, view: &View<'_>, port: u32, shapes: &mut Shapes) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (self.identity, port).hash(&mut h);
        match &self.routes {
            Routes::VirtualService(inputs, _) => (0u8, inputs).hash(&mut h),
            Routes::Default(service) => {
                1u8.hash(&mut h);
                follow_service(view, service, shapes, &mut h);
            }
        }
        h.finish()
    }
}

fn http_or_sniffed(service: &Service, port: u32) -> bool {
    service
        .port(port)
        .is_some_and(|p| p.protocol.is_none() || p.is_http())
}

/// The virtual hosts of `port` (without the catch-all), in build order.
fn port_virtual_hosts<'v>(
    view: &'v View<'_>,
    port: u32,
    routes: &mut RouteMemo,
    hosts: &'v mut HashMap<u32, HashMap<String, ServiceHost>>,
    shapes: &mut Shapes,
) -> Vec<Planned<'v>> {
    let on_port = |host: &str| view.services.get(host).filter(|s| s.port(port).is_some());
    let services = || view.services.iter().filter(|(_, s)| s.port(port).is_some());
    let mut wrappers: Vec<Wrapper<'_>> = Vec::new();
    for (i, vs) in view.virtual_services.iter().enumerate() {
        let vs_hosts = &view.vs_hosts[i].lower;
        if port != 80 && !selects_a_service(vs_hosts, view, port) {
            continue;
        }
        let (inputs, routes) = routes.get(view, vs, port, shapes);
        if routes.is_empty() {
            continue;
        }
        let mut other_hosts = Vec::new();
        let mut claimed: Vec<&Arc<Service>> = Vec::new();
        for host in vs_hosts.iter().filter(|h| !h.starts_with('*')) {
            match on_port(host) {
                Some(s) => claimed.push(s),
                None => other_hosts.push(host.as_str()),
            }
        }
        for host in vs_hosts.iter().filter(|h| h.starts_with('*')) {
            let mut found = false;
            for (name, s) in services() {
                if !pasa_proto::host::matches(host, name) {
                    continue;
                }
                found = true;
                if view
                    .virtual_service_for(name)
                    .is_some_and(|owner| Arc::ptr_eq(owner, vs))
                {
                    claimed.push(s);
                }
            }
            if !found {
                other_hosts.push(host.as_str());
            }
        }
        claimed.retain(|s| http_or_sniffed(s, port));
        if claimed.is_empty() && port != 80 {
            continue;
        }
        wrappers.push(Wrapper {
            services: claimed,
            hosts: other_hosts,
            routes: Routes::VirtualService(inputs, routes),
        });
    }
    let with_vs: FxHashSet<&str> = wrappers
        .iter()
        .flat_map(|w| w.services.iter().map(|s| s.hostname.as_str()))
        .collect();
    for (name, service) in services() {
        if with_vs.contains(name.as_str())
            || view.is_alias(service)
            || !http_or_sniffed(service, port)
        {
            continue;
        }
        wrappers.push(Wrapper {
            services: vec![service],
            hosts: Vec::new(),
            routes: Routes::Default(service),
        });
    }

    // Each service's name and domains, from the last build where still current.
    let port_hosts = hosts.entry(port).or_default();
    for service in wrappers.iter().flat_map(|w| w.services.iter()) {
        match port_hosts.get_mut(service.hostname.as_str()) {
            Some(known) if known.is_current(view, service) => {}
            Some(known) => *known = ServiceHost::of(view, service, port),
            None => {
                port_hosts.insert(
                    service.hostname.clone(),
                    ServiceHost::of(view, service, port),
                );
            }
        }
    }
    let port_hosts = &*port_hosts;

    // A short form is left out where it is the name of a service here (with or without port).
    let fqdns: FxHashSet<&str> = wrappers
        .iter()
        .flat_map(|w| w.services.iter().map(|s| s.hostname.as_str()))
        .collect();
    let port_suffix = format!(":{port}");
    let is_fqdn = |d: &str| {
        fqdns.contains(d)
            || d.strip_suffix(port_suffix.as_str())
                .is_some_and(|h| fqdns.contains(h))
    };
    let services_planned = fqdns.len();
    let mut names_taken: FxHashSet<Cow<'_, str>> =
        FxHashSet::with_capacity_and_hasher(services_planned, Default::default());
    let mut domains_taken: FxHashSet<&str> =
        FxHashSet::with_capacity_and_hasher(services_planned * 6, Default::default());
    let mut out = Vec::new();
    for w in wrappers {
        for host in &w.hosts {
            let name = names::host_port(host, port);
            if names_taken.insert(Cow::Owned(name.clone())) && domains_taken.insert(host) {
                let domains = vec![host.to_string()];
                out.push(Planned {
                    identity: identity(&name, &domains),
                    name: Cow::Owned(name),
                    domains: Cow::Owned(domains),
                    routes: w.routes.clone(),
                });
            }
        }
        for service in &w.services {
            let Some(planned) = port_hosts.get(service.hostname.as_str()) else {
                continue;
            };
            if !names_taken.insert(Cow::Borrowed(planned.name.as_str())) {
                continue;
            }
            // The domains kept, copied only once one is left out.
            let mut kept: Option<Vec<String>> = None;
            for (i, domain) in planned.domains.iter().enumerate() {
                let keep = !(planned.short[i] && is_fqdn(domain))
                    && domains_taken.insert(planned.lower_case(i));
                match (&mut kept, keep) {
                    (Some(kept), true) => kept.push(domain.clone()),
                    (None, false) => kept = Some(planned.domains[..i].to_vec()),
                    _ => {}
                }
            }
            let (domains, identity) = match kept {
                None => (Cow::Borrowed(planned.domains.as_slice()), planned.identity),
                Some(kept) => {
                    let id = identity(&planned.name, &kept);
                    (Cow::Owned(kept), id)
                }
            };
            if !domains.is_empty() {
                out.push(Planned {
                    name: Cow::Borrowed(planned.name.as_str()),
                    domains,
                    identity,
                    routes: w.routes.clone(),
                });
            }
        }
    }
    out
}

/// Whether some VirtualService host names (or covers) a service of the port, or a wildcard
/// service of the port covers it.
fn selects_a_service(hosts: &[String], view: &View<'_>, port: u32) -> bool {
    let on_port = || view.services.iter().filter(|(_, s)| s.port(port).is_some());
    hosts.iter().any(|h| {
        view.services.get(h).is_some_and(|s| s.port(port).is_some())
            || on_port().any(|(s, _)| {
                (h.starts_with('*') && pasa_proto::host::matches(h, s))
                    || (s.starts_with('*') && pasa_proto::host::matches(s, h))
            })
    })
}

/// The domains of a service's virtual host: its name and its aliases' names, with the short
/// forms valid from the proxy's namespace, `*.`-prefixed forms for headless Kubernetes
/// services, and its addresses. Also returns the short forms alone.
fn service_domains(
    view: &View<'_>,
    service: &Service,
    aliases: &[String],
) -> (Vec<String>, Vec<String>) {
    let mut domains = Vec::new();
    let mut all_alt = Vec::new();
    for name in std::iter::once(&service.hostname).chain(aliases) {
        let alt = route::alt_hosts(name, &view.proxy.dns_domain);
        domains.push(name.clone());
        domains.extend(alt.iter().cloned());
        all_alt.extend(alt);
    }
    if service.resolution == Resolution::Passthrough && service.kubernetes {
        let wild: Vec<String> = domains.iter().map(|d| format!("*.{d}")).collect();
        domains.extend(wild);
    }
    for address in &service.addresses {
        if !address.contains('/') && address != "0.0.0.0" {
            domains.push(address.clone());
        }
    }
    (domains, all_alt)
}
