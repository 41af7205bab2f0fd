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
use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Weak};

use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_types::pb::google::protobuf::BoolValue;
use pasa_istio::virtual_service::VirtualService;
use prost::Message;
use rustc_hash::{FxHashMap, FxHashSet};

use super::super::{
    Rebuilt, Shapes, View, follow_service, hcm, names, route, virtual_service_inputs,
};
use super::catch_all;
use crate::model::registry::{Config, PersistentSession, Resolution, Service};
use crate::resource::Resource;

/// What a sidecar's route configurations reuse from one build to the next: the routes of each
/// VirtualService for a port, each service's virtual host before de-duplication, each route
/// configuration's plan (see [`Plan`]) and encoded virtual hosts. A VirtualService change that
/// leaves its hosts alone then builds that VirtualService's routes and encodes its virtual
/// hosts; the rest of the configuration is copied from the previous encoding.
#[derive(Debug, Default)]
pub(in crate::translate) struct Reuse {
    routes: RouteMemo,
    /// By port, then by service host.
    hosts: FxHashMap<u32, FxHashMap<String, ServiceHost>>,
    /// By route configuration name, then by a fingerprint of the virtual host's name, domains
    /// and routes.
    encoded: FxHashMap<String, FxHashMap<u64, Arc<Vec<u8>>>>,
    /// By route configuration name.
    plans: FxHashMap<String, Plan>,
}

impl Reuse {
    /// Forgets what belongs to route configurations no longer asked for, and to VirtualServices
    /// and services no longer visible.
    pub(in crate::translate) fn retain(&mut self, view: &View<'_>, names: &BTreeSet<String>) {
        self.encoded.retain(|name, _| names.contains(name));
        self.plans.retain(|name, _| names.contains(name));
        let visible: FxHashSet<usize> = view
            .virtual_services
            .iter()
            .map(|vs| Arc::as_ptr(vs) as usize)
            .collect();
        self.routes.0.retain(|(vs, _), _| visible.contains(vs));
        // Entries of services no longer visible, swept once there are more entries than
        // visible services (so the sweep is rare, and what it leaves is bounded).
        for hosts in self.hosts.values_mut() {
            if hosts.len() > view.services.len() {
                hosts.retain(|host, _| view.services.contains_key(host));
            }
        }
    }
}

/// The routes of each VirtualService for a port: by the VirtualService's address and the port,
/// with the fingerprint of what they read. An entry holds its VirtualService, so the address is
/// not reused while it is here; a changed VirtualService is a new allocation, hence a new entry
/// (the old one goes when it is no longer visible).
#[derive(Debug, Default)]
struct RouteMemo(FxHashMap<(usize, u32), MemoRoutes>);

/// A VirtualService's routes for a port.
#[derive(Debug)]
struct MemoRoutes {
    /// Held, so that its address (the key) is not reused while the entry is here.
    _virtual_service: Arc<Config<VirtualService>>,
    routes: BuiltRoutes,
}

impl RouteMemo {
    /// The routes of `vs` for `port`, built again only when what they read changed.
    fn get(
        &mut self,
        view: &View<'_>,
        vs: &Arc<Config<VirtualService>>,
        port: u32,
        shapes: &mut Shapes,
    ) -> BuiltRoutes {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (
            virtual_service_inputs(view, vs, shapes),
            view.route_settings,
        )
            .hash(&mut h);
        let inputs = h.finish();
        let key = (Arc::as_ptr(vs) as usize, port);
        match self.0.get(&key) {
            Some(MemoRoutes {
                routes: (seen, routes),
                ..
            }) if *seen == inputs => (inputs, Arc::clone(routes)),
            _ => {
                let routes = Arc::new(route::encoded_routes(&route::virtual_service_routes(
                    vs,
                    port,
                    pasa_istio::gateway::MESH,
                    view,
                )));
                let memo = MemoRoutes {
                    _virtual_service: Arc::clone(vs),
                    routes: (inputs, Arc::clone(&routes)),
                };
                self.0.insert(key, memo);
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
///
/// They are kept encoded ([`route::encoded_routes`], empty when there are none): a scope's routes
/// are kept for as long as their VirtualServices do not change, and the encoding is a fraction
/// of the messages (each holds every optional field inline). A virtual host is encoded around
/// them without building them again.
type BuiltRoutes = (u64, Arc<Vec<u8>>);

/// The virtual hosts of a route configuration as last planned (in order), with what planning
/// read: a fingerprint of the hosts of each visible VirtualService, in order, and whether it
/// makes virtual hosts on the port (see [`makes_virtual_hosts`]); the visible services (compared
/// by allocation; a `Weak` keeps the allocation, so its address is not reused, and frees the
/// service). While these are the same, so is the plan, and the positions it holds: a change
/// that leaves them alone (a VirtualService's routes, a DestinationRule's hash policy) builds
/// only the virtual hosts it changed.
#[derive(Debug)]
struct Plan {
    virtual_services: u64,
    services: Vec<Weak<Service>>,
    hosts: Vec<PlannedHost>,
}

impl Plan {
    fn holds(&self, view: &View<'_>, virtual_services: u64) -> bool {
        self.virtual_services == virtual_services
            && self.services.len() == view.services.len()
            && self
                .services
                .iter()
                .zip(view.services.values())
                .all(|(then, now)| std::ptr::eq(then.as_ptr(), Arc::as_ptr(now)))
    }
}

/// A virtual host as planned, by positions in the view.
#[derive(Debug)]
struct PlannedHost {
    names: Names,
    /// [`identity`] of its name and domains.
    identity: u64,
    routes: Source,
}

/// A planned virtual host's name and domains.
#[derive(Debug)]
enum Names {
    /// Those of the [`ServiceHost`] of the visible service at this position.
    Service(usize),
    /// Its own: a VirtualService host that names no service, or a service's name with some
    /// of its domains left out (taken by an earlier virtual host).
    Own { name: String, domains: Vec<String> },
}

/// Where a planned virtual host's routes come from.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// The routes of the visible VirtualService at this position.
    VirtualService(usize),
    /// The default route of the visible service at this position.
    Default(usize),
}

/// A planned virtual host's routes, for this update.
enum Routes<'v> {
    /// A VirtualService's, with the fingerprint of what they read.
    VirtualService(u64, Arc<Vec<u8>>),
    /// The default route of a service without a VirtualService.
    Default(&'v Arc<Service>),
}

/// The route configuration named `name` (`"80"` or `"host:81"`), encoded.
pub(in crate::translate) fn route_config(
    view: &View<'_>,
    name: &str,
    reuse: &mut Reuse,
    shapes: &mut Shapes,
    counts: &mut Rebuilt,
) -> Option<Arc<Resource>> {
    let (sniffed, port) = match name.rsplit_once(':') {
        Some((host, port)) => (Some(host), port.parse::<u32>().ok()?),
        None => (None, name.parse::<u32>().ok()?),
    };
    let Reuse {
        routes,
        hosts,
        encoded: encodings,
        plans,
    } = reuse;
    let port_hosts = hosts.entry(port).or_default();
    let config = RouteConfiguration {
        name: name.to_string(),
        validate_clusters: Some(BoolValue { value: false }),
        ignore_port_in_host_matching: true,
        max_direct_response_body_size_bytes: route::max_direct_response_body(),
        ..Default::default()
    };
    if let Some(host) = sniffed {
        // Only its own virtual host, matching any domain: built as a message.
        let planned = port_virtual_hosts(view, port, routes, port_hosts, shapes);
        let mut vhosts: Vec<VirtualHost> = planned
            .iter()
            .filter(|vh| {
                let (_, domains) = vh.names(view, port_hosts);
                domains.iter().any(|d| d == host || d == name)
            })
            .map(|vh| {
                let source = vh.source(view, port, routes, shapes);
                // Decoding what was just encoded from messages cannot fail.
                VirtualHost::decode(vh.build(view, port, port_hosts, source).as_slice())
                    .unwrap_or_default()
            })
            .collect();
        if let [only] = vhosts.as_mut_slice() {
            only.domains = vec!["*".into()];
        }
        vhosts.sort_by(|a, b| a.name.cmp(&b.name));
        return Some(Resource::pack(&RouteConfiguration {
            virtual_hosts: vhosts,
            ..config
        }));
    }
    let virtual_services = planned_virtual_services(view, port, routes, shapes);
    let plan = match plans.remove(name) {
        Some(plan) if plan.holds(view, virtual_services) => plan,
        _ => Plan {
            virtual_services,
            services: view.services.values().map(Arc::downgrade).collect(),
            hosts: port_virtual_hosts(view, port, routes, port_hosts, shapes),
        },
    };
    let port_hosts = &*port_hosts;
    let previous = encodings.remove(name).unwrap_or_default();
    let mut kept = FxHashMap::with_capacity_and_hasher(plan.hosts.len(), Default::default());
    let mut encoded = Vec::with_capacity(plan.hosts.len() + 1);
    for vh in &plan.hosts {
        let source = vh.source(view, port, routes, shapes);
        let key = vh.fingerprint(view, port, &source, shapes);
        let bytes = match previous.get(&key) {
            Some(bytes) => Arc::clone(bytes),
            None => {
                counts.virtual_hosts += 1;
                Arc::new(vh.build(view, port, port_hosts, source))
            }
        };
        kept.insert(key, Arc::clone(&bytes));
        encoded.push(bytes);
    }
    encodings.insert(name.to_string(), kept);
    plans.insert(name.to_string(), plan);
    encoded.push(Arc::new(
        catch_all(
            view.scope.outbound_policy,
            view.hcm(hcm::Class::SidecarOutbound),
        )
        .encode_to_vec(),
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

/// A group of names sharing routes: services (by position) and hosts naming no service
/// (resolved, in lower case).
struct Wrapper<'v> {
    services: Vec<usize>,
    hosts: Vec<&'v str>,
    routes: Source,
}

/// A fingerprint of a virtual host's name and domains.
fn identity(name: &str, domains: &[String]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (name, domains).hash(&mut h);
    h.finish()
}

impl PlannedHost {
    fn names<'h>(
        &'h self,
        view: &View<'_>,
        port_hosts: &'h FxHashMap<String, ServiceHost>,
    ) -> (&'h str, &'h [String]) {
        match &self.names {
            Names::Own { name, domains } => (name, domains),
            Names::Service(i) => {
                let host = &port_hosts[view.services.at(*i).hostname.as_str()];
                (&host.name, &host.domains)
            }
        }
    }

    fn source<'v>(
        &self,
        view: &'v View<'_>,
        port: u32,
        routes: &mut RouteMemo,
        shapes: &mut Shapes,
    ) -> Routes<'v> {
        match self.routes {
            Source::VirtualService(i) => {
                let (inputs, routes) = routes.get(view, &view.virtual_services[i], port, shapes);
                Routes::VirtualService(inputs, routes)
            }
            Source::Default(i) => Routes::Default(view.services.at(i)),
        }
    }

    /// The virtual host, encoded.
    fn build(
        &self,
        view: &View<'_>,
        port: u32,
        port_hosts: &FxHashMap<String, ServiceHost>,
        source: Routes<'_>,
    ) -> Vec<u8> {
        let default;
        let routes = match &source {
            Routes::VirtualService(_, routes) => routes.as_slice(),
            Routes::Default(service) => {
                default = route::encoded_routes(&[view.default_route(service, port)]);
                default.as_slice()
            }
        };
        let (name, domains) = self.names(view, port_hosts);
        route::encoded_virtual_host(
            name,
            domains,
            routes,
            (
                view.hcm(hcm::Class::SidecarOutbound).attempt_count,
                self.session(view),
            ),
        )
    }

    /// The persistent sessions of the service the virtual host is named after, when served.
    fn session<'v>(&self, view: &'v View<'_>) -> Option<&'v PersistentSession> {
        match &self.names {
            Names::Service(i) => view.session_of(&view.services.at(*i).hostname),
            Names::Own { .. } => None,
        }
    }

    /// What the virtual host is built from.
    fn fingerprint(
        &self,
        view: &View<'_>,
        port: u32,
        source: &Routes<'_>,
        shapes: &mut Shapes,
    ) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (self.identity, port, self.session(view)).hash(&mut h);
        view.route_settings.hash(&mut h);
        match source {
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

/// Whether the VirtualService at position `i` makes virtual hosts on `port`: its hosts select
/// a service of the port (any, on port 80), and it has routes for the port.
fn makes_virtual_hosts(
    view: &View<'_>,
    i: usize,
    port: u32,
    routes: &mut RouteMemo,
    shapes: &mut Shapes,
) -> bool {
    (port == 80 || selects_a_service(&view.vs_hosts[i].lower, view, port))
        && !routes
            .get(view, &view.virtual_services[i], port, shapes)
            .1
            .is_empty()
}

/// What planning the virtual hosts of `port` reads of the VirtualServices (see [`Plan`]).
fn planned_virtual_services(
    view: &View<'_>,
    port: u32,
    routes: &mut RouteMemo,
    shapes: &mut Shapes,
) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    port.hash(&mut h);
    for i in 0..view.virtual_services.len() {
        let makes = makes_virtual_hosts(view, i, port, routes, shapes);
        (view.vs_hosts[i].fingerprint, makes).hash(&mut h);
    }
    h.finish()
}

/// The virtual hosts of `port` (without the catch-all), sorted by name.
fn port_virtual_hosts(
    view: &View<'_>,
    port: u32,
    routes: &mut RouteMemo,
    port_hosts: &mut FxHashMap<String, ServiceHost>,
    shapes: &mut Shapes,
) -> Vec<PlannedHost> {
    let on_port = |host: &str| {
        view.services
            .position(host)
            .filter(|&p| view.services.at(p).port(port).is_some())
    };
    let services = || {
        view.services
            .values()
            .enumerate()
            .filter(|(_, s)| s.port(port).is_some())
    };
    let mut wrappers: Vec<Wrapper<'_>> = Vec::new();
    for (i, vs) in view.virtual_services.iter().enumerate() {
        if !makes_virtual_hosts(view, i, port, routes, shapes) {
            continue;
        }
        let vs_hosts = &view.vs_hosts[i].lower;
        let mut other_hosts = Vec::new();
        let mut claimed: Vec<usize> = Vec::new();
        for host in vs_hosts.iter().filter(|h| !h.starts_with('*')) {
            match on_port(host) {
                Some(p) => claimed.push(p),
                None => other_hosts.push(host.as_str()),
            }
        }
        let expands = !pasa_istio::generated::has_gateway_semantics(&vs.meta.annotations);
        for host in vs_hosts.iter().filter(|h| h.starts_with('*')) {
            let mut found = false;
            // Gateway API routes' wildcard hosts name no services.
            let candidates = if expands {
                services().collect()
            } else {
                Vec::new()
            };
            for (p, s) in candidates {
                if !pasa_istio::host::matches(host, &s.hostname) {
                    continue;
                }
                found = true;
                if view
                    .virtual_service_for(&s.hostname)
                    .is_some_and(|owner| Arc::ptr_eq(owner, vs))
                {
                    claimed.push(p);
                }
            }
            if !found {
                other_hosts.push(host.as_str());
            }
        }
        claimed.retain(|&p| http_or_sniffed(view.services.at(p), port));
        if claimed.is_empty() && port != 80 {
            continue;
        }
        wrappers.push(Wrapper {
            services: claimed,
            hosts: other_hosts,
            routes: Source::VirtualService(i),
        });
    }
    let with_vs: FxHashSet<usize> = wrappers
        .iter()
        .flat_map(|w| w.services.iter().copied())
        .collect();
    for (p, service) in services() {
        if with_vs.contains(&p) || view.is_alias(service) || !http_or_sniffed(service, port) {
            continue;
        }
        wrappers.push(Wrapper {
            services: vec![p],
            hosts: Vec::new(),
            routes: Source::Default(p),
        });
    }

    // Each service's name and domains, from the last build where still current.
    for &p in wrappers.iter().flat_map(|w| w.services.iter()) {
        let service = view.services.at(p);
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
        .flat_map(|w| w.services.iter())
        .map(|&p| view.services.at(p).hostname.as_str())
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
    // With each its name, to sort by.
    let mut out: Vec<(Cow<'_, str>, PlannedHost)> = Vec::new();
    for w in wrappers {
        for host in &w.hosts {
            let name = names::host_port(host, port);
            if names_taken.insert(Cow::Owned(name.clone())) && domains_taken.insert(host) {
                let domains = vec![host.to_string()];
                out.push((
                    Cow::Owned(name.clone()),
                    PlannedHost {
                        identity: identity(&name, &domains),
                        names: Names::Own { name, domains },
                        routes: w.routes,
                    },
                ));
            }
        }
        for &p in &w.services {
            let Some(planned) = port_hosts.get(view.services.at(p).hostname.as_str()) else {
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
            let (names, identity) = match kept {
                None => (Names::Service(p), planned.identity),
                Some(kept) if kept.is_empty() => continue,
                Some(kept) => {
                    let id = identity(&planned.name, &kept);
                    let names = Names::Own {
                        name: planned.name.clone(),
                        domains: kept,
                    };
                    (names, id)
                }
            };
            out.push((
                Cow::Borrowed(planned.name.as_str()),
                PlannedHost {
                    names,
                    identity,
                    routes: w.routes,
                },
            ));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.into_iter().map(|(_, planned)| planned).collect()
}

/// Whether some VirtualService host names (or covers) a service of the port, or a wildcard
/// service of the port covers it.
fn selects_a_service(hosts: &[String], view: &View<'_>, port: u32) -> bool {
    let on_port = || view.services.iter().filter(|(_, s)| s.port(port).is_some());
    hosts.iter().any(|h| {
        view.services.get(h).is_some_and(|s| s.port(port).is_some())
            || on_port().any(|(s, _)| {
                (h.starts_with('*') && pasa_istio::host::matches(h, s))
                    || (s.starts_with('*') && pasa_istio::host::matches(s, h))
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
