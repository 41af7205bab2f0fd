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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
use envoy_types::pb::google::protobuf::BoolValue;
use pasa_proto::istio::virtual_service::VirtualService;
use prost::Message;

use super::super::registry::{Config, Resolution, Service};
use super::super::{Shapes, View, follow_service, names, route, virtual_service_inputs};
use super::catch_all;
use crate::resource::Resource;

/// What a sidecar's route configurations reuse from one build to the next: the routes of each
/// VirtualService for a port, and each route configuration's encoded virtual hosts. A
/// VirtualService change then builds that VirtualService's routes and encodes its virtual hosts;
/// the rest of the configuration is copied from the previous encoding.
#[derive(Debug, Default)]
pub(in crate::translate) struct Reuse {
    /// By VirtualService (namespace, name) and port, with the fingerprint of what they read.
    routes: HashMap<(String, String, u32), BuiltRoutes>,
    /// By route configuration name, then by a fingerprint of the virtual host's name, domains
    /// and routes.
    encoded: HashMap<String, HashMap<u64, Arc<Vec<u8>>>>,
}

impl Reuse {
    /// Forgets what belongs to route configurations no longer asked for, and to VirtualServices
    /// no longer visible.
    pub(in crate::translate) fn retain(&mut self, view: &View<'_>, names: &BTreeSet<String>) {
        self.encoded.retain(|name, _| names.contains(name));
        let visible: BTreeSet<(&str, &str)> = view
            .virtual_services
            .iter()
            .map(|vs| (vs.meta.namespace.as_str(), vs.meta.name.as_str()))
            .collect();
        self.routes
            .retain(|(ns, name, _), _| visible.contains(&(ns.as_str(), name.as_str())));
    }

    /// The routes of `vs` for `port`, built again only when what they read changed.
    fn virtual_service_routes(
        &mut self,
        view: &View<'_>,
        vs: &Arc<Config<VirtualService>>,
        port: u32,
        shapes: &mut Shapes,
    ) -> BuiltRoutes {
        let inputs = virtual_service_inputs(view, vs, shapes);
        let key = (vs.meta.namespace.clone(), vs.meta.name.clone(), port);
        match self.routes.get(&key) {
            Some((seen, routes)) if *seen == inputs => (inputs, Arc::clone(routes)),
            _ => {
                let routes = Arc::new(route::virtual_service_routes(
                    vs,
                    port,
                    pasa_proto::gateway::MESH,
                    view,
                ));
                self.routes.insert(key, (inputs, Arc::clone(&routes)));
                (inputs, routes)
            }
        }
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
    let mut planned = port_virtual_hosts(view, port, reuse, shapes);
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
    let previous = reuse.encoded.remove(name).unwrap_or_default();
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
    reuse.encoded.insert(name.to_string(), kept);
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
    hosts: Vec<String>,
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
    name: String,
    domains: Vec<String>,
    routes: Routes<'v>,
}

impl Planned<'_> {
    fn build(self, view: &View<'_>, port: u32) -> VirtualHost {
        let routes = match self.routes {
            Routes::VirtualService(_, routes) => routes.as_ref().clone(),
            Routes::Default(service) => vec![view.default_route(service, port)],
        };
        route::virtual_host(self.name, self.domains, routes)
    }

    /// What the virtual host is built from.
    fn fingerprint(&self, view: &View<'_>, port: u32, shapes: &mut Shapes) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&self.name, &self.domains, port).hash(&mut h);
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
    reuse: &mut Reuse,
    shapes: &mut Shapes,
) -> Vec<Planned<'v>> {
    let services: BTreeMap<&str, &Arc<Service>> = view
        .services
        .values()
        .filter(|s| s.port(port).is_some())
        .map(|s| (s.hostname.as_str(), s))
        .collect();
    let resolved = |vs: &Config<VirtualService>| -> Vec<String> {
        vs.spec
            .hosts
            .iter()
            .map(|h| {
                view.proxy
                    .resolve_host(h, &vs.meta.namespace)
                    .to_lowercase()
            })
            .collect()
    };
    let mut wrappers: Vec<Wrapper<'_>> = Vec::new();
    for vs in &view.virtual_services {
        let hosts = resolved(vs);
        if port != 80 && !selects_a_service(&hosts, &services) {
            continue;
        }
        let (inputs, routes) = reuse.virtual_service_routes(view, vs, port, shapes);
        if routes.is_empty() {
            continue;
        }
        let mut other_hosts = Vec::new();
        let mut claimed: Vec<&Arc<Service>> = Vec::new();
        for host in hosts.iter().filter(|h| !h.starts_with('*')) {
            match services.get(host.as_str()) {
                Some(s) => claimed.push(s),
                None => other_hosts.push(host.clone()),
            }
        }
        for host in hosts.iter().filter(|h| h.starts_with('*')) {
            let mut found = false;
            for (name, s) in &services {
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
                other_hosts.push(host.clone());
            }
        }
        let claimed: Vec<&Arc<Service>> = claimed
            .into_iter()
            .filter(|s| http_or_sniffed(s, port))
            .collect();
        if claimed.is_empty() && port != 80 {
            continue;
        }
        wrappers.push(Wrapper {
            services: claimed,
            hosts: other_hosts,
            routes: Routes::VirtualService(inputs, routes),
        });
    }
    let with_vs: BTreeSet<&str> = wrappers
        .iter()
        .flat_map(|w| w.services.iter().map(|s| s.hostname.as_str()))
        .collect();
    for (name, service) in &services {
        if with_vs.contains(name) || view.is_alias(service) || !http_or_sniffed(service, port) {
            continue;
        }
        wrappers.push(Wrapper {
            services: vec![service],
            hosts: Vec::new(),
            routes: Routes::Default(service),
        });
    }

    let known_fqdn: BTreeSet<String> = wrappers
        .iter()
        .flat_map(|w| w.services.iter())
        .flat_map(|s| [s.hostname.clone(), names::host_port(&s.hostname, port)])
        .collect();
    let mut names_taken = BTreeSet::new();
    let mut domains_taken = BTreeSet::new();
    let mut out = Vec::new();
    for w in wrappers {
        let mut plan = |host: &str, domains: Vec<String>, alt: Vec<String>| {
            let name = names::host_port(host, port);
            if !names_taken.insert(name.clone()) {
                return;
            }
            let domains: Vec<String> = domains
                .into_iter()
                .filter(|d| !(alt.contains(d) && known_fqdn.contains(d)))
                .filter(|d| domains_taken.insert(d.to_lowercase()))
                .collect();
            if !domains.is_empty() {
                out.push(Planned {
                    name,
                    domains,
                    routes: w.routes.clone(),
                });
            }
        };
        for host in &w.hosts {
            plan(host, vec![host.clone()], Vec::new());
        }
        for service in &w.services {
            let (domains, alt) = service_domains(view, service);
            plan(&service.hostname, domains, alt);
        }
    }
    out
}

/// Whether some VirtualService host names (or covers) a service of the port, or a wildcard
/// service covers it.
fn selects_a_service(hosts: &[String], services: &BTreeMap<&str, &Arc<Service>>) -> bool {
    hosts.iter().any(|h| {
        services.contains_key(h.as_str())
            || services.keys().any(|s| {
                (h.starts_with('*') && pasa_proto::host::matches(h, s))
                    || (s.starts_with('*') && pasa_proto::host::matches(s, h))
            })
    })
}

/// The domains of a service's virtual host: its name and its aliases' names, with the short
/// forms valid from the proxy's namespace, `*.`-prefixed forms for headless Kubernetes
/// services, and its addresses. Also returns the short forms alone.
fn service_domains(view: &View<'_>, service: &Service) -> (Vec<String>, Vec<String>) {
    let mut domains = Vec::new();
    let mut all_alt = Vec::new();
    let mut names = vec![service.hostname.clone()];
    names.extend(
        view.aliases_of(&service.hostname)
            .into_iter()
            .map(str::to_string),
    );
    for name in &names {
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
