//! VHDS, virtual hosts on demand, as Envoy asks for them (delta ADS only; see
//! `docs/on-demand.md`). The snapshot holds each virtual host of a route configuration served
//! on demand as a VirtualHost resource named `<route config>/<virtual host name>`. Envoy
//! subscribes to a route configuration's name first (a namespace: nothing is sent from the start
//! but a marker that answers it), then to `<route config>/<host as sent>` for each request whose
//! host it cannot route. Such a name is an alias: it is matched against the domains of the route
//! configuration's virtual hosts as Envoy matches them (exact, then the longest `*.` suffix, then
//! the longest `.*` prefix, then `*`; the port dropped first when the route configuration ignores
//! it), and answered with the virtual host under its own name, the alias among its `aliases`.
//! An alias nothing matches is answered without a body, which Envoy reads as "no such host".
//!
//! The wildcard is answered with one virtual host in each on-demand route configuration's
//! namespace, [`SENTINEL`], for a domain no request has (`.invalid` is reserved for that):
//! Envoy holds the route configuration's listeners back until its namespace's first answer
//! (seen with Envoy 1.40: 15 s, its initial fetch timeout, when nothing is answered).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use prost::Message;

use super::snapshot::Snapshot;
use crate::resource::{Resource, TypeKind};
use crate::translate::names::ON_DEMAND_ROUTE;

/// The virtual host every on-demand route configuration starts with (see the module doc).
pub(super) const SENTINEL: &str = "pasa-on-demand";

/// [`SENTINEL`]'s resource in the route configuration `config`: a virtual host for
/// `pasa-on-demand.invalid`, answering 404.
fn sentinel(config: &str) -> Arc<Resource> {
    use envoy_types::pb::envoy::config::route::v3::{
        DirectResponseAction, Route, RouteMatch, route, route_match,
    };
    Resource::pack(&VirtualHost {
        name: format!("{config}/{SENTINEL}"),
        domains: vec![format!("{SENTINEL}.invalid")],
        routes: vec![Route {
            r#match: Some(RouteMatch {
                path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                ..Default::default()
            }),
            action: Some(route::Action::DirectResponse(DirectResponseAction {
                status: 404,
                ..Default::default()
            })),
            ..Default::default()
        }],
        ..Default::default()
    })
}

/// What a VHDS subscription's names select now.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Selected {
    /// Virtual hosts by their resource name, each with the aliases that named it.
    pub found: BTreeMap<String, (Arc<Resource>, BTreeSet<String>)>,
    /// Aliases nothing matches, answered without a body.
    pub missing: BTreeSet<String>,
}

/// What a VHDS subscription (`wildcard`, and `names`) selects of `snapshot`. An alias no virtual
/// host matches is answered only once `settled` (the agent has learned what it may name): with
/// its route configuration's catch-all for that host alone when it has one (the eager
/// configuration's `allow_any` passthrough, or `block_all`), else without a body.
pub(super) fn select(
    wildcard: bool,
    names: &BTreeSet<String>,
    snapshot: &Snapshot,
    settled: impl Fn(&str) -> bool,
) -> Selected {
    let mut selected = Selected::default();
    if wildcard {
        for (name, resource) in snapshot.resources(TypeKind::Route) {
            let on_demand = RouteConfiguration::decode(resource.body.value.as_slice())
                .is_ok_and(|rc| rc.vhds.is_some());
            if on_demand {
                selected.found.insert(
                    format!("{name}/{SENTINEL}"),
                    (sentinel(name), BTreeSet::new()),
                );
            }
        }
    }
    // Each route configuration's table is decoded once, however many names ask it.
    let mut tables: BTreeMap<String, Table> = BTreeMap::new();
    for name in names {
        let Some((config, host)) = name.rsplit_once('/') else {
            continue;
        };
        // `virtualOutbound`'s route configuration answers from the table of the port the host
        // names (80 without one), with that port's domains only: connections of every port
        // share it.
        let port = (config == ON_DEMAND_ROUTE).then(|| port_of(host));
        let table_name = port.map_or_else(|| config.to_string(), |p| p.to_string());
        let table = tables
            .entry(table_name)
            .or_insert_with_key(|table_name| Table::of(snapshot, table_name));
        let resolved = match table.resolve(host) {
            Some(vh) => match port {
                None => Some(vh),
                Some(port) => on_port(config, &vh, port),
            },
            None if !settled(name) => continue,
            None => fallback(config, host, snapshot),
        };
        match resolved {
            Some(vh) => {
                let name_of_it = vh.name.clone();
                selected
                    .found
                    .entry(name_of_it)
                    .or_insert_with(|| (Resource::pack(&vh), BTreeSet::new()))
                    .1
                    .insert(name.clone());
            }
            None => {
                selected.missing.insert(name.clone());
            }
        }
    }
    selected
}

/// The port a host as sent names: its own, else HTTP's.
fn port_of(host: &str) -> u16 {
    crate::on_demand::split_port(host)
        .and_then(|(_, port)| port)
        .unwrap_or(80)
}

/// `vh` (a virtual host of the route configuration of `port`) as `config` serves it: named in
/// `config`, its domains those of `port` only. A sidecar's route configuration of a port
/// ignores the port in matching, so its domains have none: each is given `port` (and kept
/// without one too for 80, which a `Host` without a port names), as `config` is shared by
/// every port.
fn on_port(config: &str, vh: &VirtualHost, port: u16) -> Option<VirtualHost> {
    let mut vh = vh.clone();
    let (_, own) = vh.name.split_once('/')?;
    vh.name = format!("{config}/{own}");
    let mut domains: Vec<String> = Vec::with_capacity(vh.domains.len() * 2);
    for domain in std::mem::take(&mut vh.domains) {
        let on_port = match crate::on_demand::split_port(&domain).and_then(|(_, p)| p) {
            Some(named) if named == port => vec![domain],
            Some(_) => Vec::new(),
            None if port == 80 => vec![format!("{domain}:80"), domain],
            None => vec![format!("{domain}:{port}")],
        };
        for domain in on_port {
            if !domains.contains(&domain) {
                domains.push(domain);
            }
        }
    }
    vh.domains = domains;
    (!vh.domains.is_empty()).then_some(vh)
}

/// What the eager configuration does with `host` in `config`: its catch-all (the eager
/// configuration's `allow_any` passthrough, or `block_all`), for that host alone, named
/// `<config>/<catch-all>:<host>`.
fn fallback(config: &str, host: &str, snapshot: &Snapshot) -> Option<VirtualHost> {
    let table = Table::of(snapshot, config);
    let catch_all = table.catch_all?;
    let (_, own) = catch_all.name.split_once('/')?;
    let host = host.to_ascii_lowercase();
    // A route configuration that ignores the port in matching has domains without one.
    let domain = match crate::on_demand::split_port(&host) {
        Some((name, Some(_))) if table.routes.ignore_port_in_host_matching => name.to_string(),
        _ => host,
    };
    Some(VirtualHost {
        name: format!("{config}/{own}:{domain}"),
        domains: vec![domain],
        ..catch_all
    })
}

/// Whether `vh` is a route configuration's catch-all (it matches every host).
fn is_catch_all(vh: &VirtualHost) -> bool {
    vh.domains.iter().any(|d| d == "*")
}

/// A route configuration's virtual hosts served on demand, decoded, as Envoy would match
/// hosts against them.
struct Table {
    /// The virtual hosts.
    routes: RouteConfiguration,
    /// The route configuration's catch-all, which matches no host here (see [`fallback`]).
    catch_all: Option<VirtualHost>,
}

impl Table {
    fn of(snapshot: &Snapshot, config: &str) -> Table {
        let prefix = format!("{config}/");
        let mut virtual_hosts = Vec::new();
        let mut catch_all = None;
        for (_, r) in snapshot
            .resources(TypeKind::VirtualHost)
            .range(prefix.clone()..)
            .take_while(|(name, _)| name.starts_with(&prefix))
        {
            match VirtualHost::decode(r.body.value.as_slice()) {
                Ok(vh) if is_catch_all(&vh) => catch_all = Some(vh),
                Ok(vh) => virtual_hosts.push(vh),
                Err(_) => {}
            }
        }
        let ignore_port = snapshot
            .resources(TypeKind::Route)
            .get(config)
            .and_then(|r| RouteConfiguration::decode(r.body.value.as_slice()).ok())
            .is_some_and(|rc| rc.ignore_port_in_host_matching);
        Table {
            routes: RouteConfiguration {
                ignore_port_in_host_matching: ignore_port,
                virtual_hosts,
                ..Default::default()
            },
            catch_all,
        }
    }

    /// The virtual host Envoy would route `host` to.
    fn resolve(&self, host: &str) -> Option<VirtualHost> {
        crate::simulate::http::virtual_host(&self.routes, host).cloned()
    }
}

/// What a name a client subscribes to teaches an on-demand agent, as the learner reads it
/// (`<namespace>/<host>`): a VHDS name is one already; a cluster asked for by name (on-demand
/// CDS, when a route names a cluster Envoy does not hold, as after its host was forgotten)
/// names its host (`outbound|<port>|<subset>|<host>`).
pub(super) fn learns_from(kind: TypeKind, name: &str) -> Option<String> {
    match kind {
        TypeKind::VirtualHost if name != "*" => Some(name.to_string()),
        TypeKind::Cluster => {
            let host = name.strip_prefix("outbound|")?.rsplit('|').next()?;
            Some(format!("cds/{host}"))
        }
        _ => None,
    }
}

/// What a client was told a name it asked for is: `<resource name>@<version>`, or nothing for
/// a resource without a body ("no such host").
pub(super) fn answer(name: &str, resource: &Resource) -> String {
    if resource.body.type_url.is_empty() {
        String::new()
    } else {
        format!("{name}@{}", resource.version)
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::route::v3::Vhds;

    use super::*;

    /// Route configuration `80` served on demand (ignoring ports, as istiod's), with a
    /// catch-all when `catch_all`; `9080` served whole; `on-demand` (`virtualOutbound`'s).
    fn snapshot(catch_all: bool) -> Snapshot {
        let mut s = Snapshot::new();
        let on_demand = RouteConfiguration {
            name: "80".into(),
            vhds: Some(Vhds::default()),
            ignore_port_in_host_matching: true,
            ..Default::default()
        };
        let eager = RouteConfiguration {
            name: "9080".into(),
            ..Default::default()
        };
        let outbound = RouteConfiguration {
            name: ON_DEMAND_ROUTE.into(),
            vhds: Some(Vhds::default()),
            ..Default::default()
        };
        for rc in [on_demand, eager, outbound] {
            let r = Resource::pack(&rc);
            s.insert(
                TypeKind::Route,
                rc.name.clone(),
                r.version.clone(),
                r.body.clone(),
            )
            .unwrap();
        }
        let mut hosts = vec![
            (
                "80/web",
                &["web", "web:80", "web.shop.svc.cluster.local"][..],
            ),
            ("80/wiki", &["*.wiki.org"][..]),
        ];
        if catch_all {
            hosts.push(("80/allow_any", &["*"][..]));
        }
        for (name, domains) in hosts {
            let r = Resource::pack(&VirtualHost {
                name: name.into(),
                domains: domains.iter().map(|d| d.to_string()).collect(),
                ..Default::default()
            });
            s.insert(
                TypeKind::VirtualHost,
                name,
                r.version.clone(),
                r.body.clone(),
            )
            .unwrap();
        }
        s
    }

    fn names(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn found(selected: &Selected) -> Vec<(&str, Vec<&str>)> {
        selected
            .found
            .iter()
            .map(|(name, (_, aliases))| {
                (name.as_str(), aliases.iter().map(String::as_str).collect())
            })
            .collect()
    }

    /// The wildcard brings the sentinel of each route configuration served on demand (not of
    /// one served whole); an alias finds its virtual host as Envoy matches domains (port
    /// dropped, case ignored, `*.` suffixes); one nothing matches is missing once settled, and
    /// not answered before.
    #[test]
    fn names_select_as_envoy_matches_hosts() {
        let asked = names(&[
            "80/web:80",
            "80/WEB.shop.svc.cluster.local",
            "80/en.wiki.org",
            "80/nowhere",
        ]);
        let selected = select(true, &asked, &snapshot(false), |_| true);
        assert_eq!(
            found(&selected),
            [
                ("80/pasa-on-demand", vec![]),
                ("80/web", vec!["80/WEB.shop.svc.cluster.local", "80/web:80"]),
                ("80/wiki", vec!["80/en.wiki.org"]),
                ("on-demand/pasa-on-demand", vec![]),
            ],
            "{selected:?}"
        );
        // Host names are case-insensitive, as Envoy matches them.
        assert_eq!(selected.missing, names(&["80/nowhere"]));
        let learning = select(false, &asked, &snapshot(false), |_| false);
        assert!(learning.missing.is_empty() && learning.found.len() == 2);
        assert!(
            select(false, &BTreeSet::new(), &snapshot(false), |_| true)
                .found
                .is_empty()
        );
    }

    /// With a catch-all (the eager configuration's `allow_any`), a settled host nothing matches
    /// gets it for that host alone, under a name of its own, its port dropped where the route
    /// configuration ignores ports; `virtualOutbound`'s route configuration answers from the
    /// table of the host's port, with that port's domains.
    #[test]
    fn unknown_hosts_get_the_catch_all_and_other_ports_their_own_table() {
        let asked = names(&["80/httpbin.org:80", "80/HTTPBIN.org", "on-demand/web:80"]);
        let selected = select(false, &asked, &snapshot(true), |_| true);
        assert_eq!(
            found(&selected),
            [
                (
                    "80/allow_any:httpbin.org",
                    vec!["80/HTTPBIN.org", "80/httpbin.org:80"]
                ),
                ("on-demand/web", vec!["on-demand/web:80"]),
            ],
            "{selected:?}"
        );
        let decode =
            |name: &str| VirtualHost::decode(selected.found[name].0.body.value.as_slice()).unwrap();
        assert_eq!(decode("80/allow_any:httpbin.org").domains, ["httpbin.org"]);
        let web = decode("on-demand/web");
        assert_eq!(web.name, "on-demand/web");
        assert_eq!(
            web.domains,
            [
                "web:80",
                "web",
                "web.shop.svc.cluster.local:80",
                "web.shop.svc.cluster.local"
            ]
        );
        let other_port = select(
            false,
            &names(&["on-demand/web:8080"]),
            &snapshot(true),
            |_| true,
        );
        assert_eq!(other_port.missing, names(&["on-demand/web:8080"]));
    }
}
