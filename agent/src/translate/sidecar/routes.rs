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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_types::pb::google::protobuf::BoolValue;
use pasa_proto::istio::virtual_service::VirtualService;

use super::super::registry::{Config, Resolution, Service};
use super::super::{View, names, route};
use super::catch_all;

/// The route configuration named `name` (`"80"` or `"host:81"`).
pub(in crate::translate) fn route_config(
    view: &View<'_>,
    name: &str,
) -> Option<RouteConfiguration> {
    let (sniffed, port) = match name.rsplit_once(':') {
        Some((host, port)) => (Some(host), port.parse::<u32>().ok()?),
        None => (None, name.parse::<u32>().ok()?),
    };
    let mut vhosts = port_virtual_hosts(view, port);
    match sniffed {
        Some(host) => {
            vhosts.retain(|vh| vh.domains.iter().any(|d| d == host || d == name));
            if let [only] = vhosts.as_mut_slice() {
                only.domains = vec!["*".into()];
            }
            vhosts.sort_by(|a, b| a.name.cmp(&b.name));
        }
        None => {
            vhosts.sort_by(|a, b| a.name.cmp(&b.name));
            vhosts.push(catch_all(view.scope.outbound_policy));
        }
    }
    Some(RouteConfiguration {
        name: name.to_string(),
        virtual_hosts: vhosts,
        validate_clusters: Some(BoolValue { value: false }),
        ignore_port_in_host_matching: true,
        ..Default::default()
    })
}

/// A group of names sharing routes.
struct Wrapper<'v> {
    services: Vec<&'v Arc<Service>>,
    hosts: Vec<String>,
    routes: Vec<envoy_types::pb::envoy::config::route::v3::Route>,
}

fn http_or_sniffed(service: &Service, port: u32) -> bool {
    service
        .port(port)
        .is_some_and(|p| p.protocol.is_none() || p.is_http())
}

/// The virtual hosts of `port` (without the catch-all), in build order.
fn port_virtual_hosts(view: &View<'_>, port: u32) -> Vec<VirtualHost> {
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
        let routes = route::virtual_service_routes(vs, port, pasa_proto::gateway::MESH, view);
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
            routes,
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
            routes: vec![view.default_route(service, port)],
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
        let mut build = |host: &str, domains: Vec<String>, alt: Vec<String>| {
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
                out.push(route::virtual_host(name, domains, w.routes.clone()));
            }
        };
        for host in &w.hosts {
            build(host, vec![host.clone()], Vec::new());
        }
        for service in &w.services {
            let (domains, alt) = service_domains(view, service);
            build(&service.hostname, domains, alt);
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
