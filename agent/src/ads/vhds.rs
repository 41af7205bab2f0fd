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

/// The virtual host every on-demand route configuration starts with (see the module doc).
pub(super) const SENTINEL: &str = "pasa-on-demand";

/// [`SENTINEL`]'s resource: a virtual host for `pasa-on-demand.invalid`, answering 404.
fn sentinel() -> Arc<Resource> {
    use envoy_types::pb::envoy::config::route::v3::{
        DirectResponseAction, Route, RouteMatch, route, route_match,
    };
    static SENTINEL_RESOURCE: std::sync::OnceLock<Arc<Resource>> = std::sync::OnceLock::new();
    Arc::clone(SENTINEL_RESOURCE.get_or_init(|| {
        Resource::pack(&VirtualHost {
            name: SENTINEL.into(),
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
    }))
}

/// What a VHDS subscription's names select now.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Selected {
    /// Virtual hosts by their resource name, each with the aliases that named it.
    pub found: BTreeMap<String, (Arc<Resource>, BTreeSet<String>)>,
    /// Aliases nothing matches, answered without a body.
    pub missing: BTreeSet<String>,
}

/// What a VHDS subscription (`wildcard`, and `names`) selects of `snapshot`.
pub(super) fn select(wildcard: bool, names: &BTreeSet<String>, snapshot: &Snapshot) -> Selected {
    let mut selected = Selected::default();
    if wildcard {
        for (name, resource) in snapshot.resources(TypeKind::Route) {
            let on_demand = RouteConfiguration::decode(resource.body.value.as_slice())
                .is_ok_and(|rc| rc.vhds.is_some());
            if on_demand {
                selected
                    .found
                    .insert(format!("{name}/{SENTINEL}"), (sentinel(), BTreeSet::new()));
            }
        }
    }
    // Each route configuration's table is decoded once, however many names ask it.
    let mut tables: BTreeMap<&str, Table<'_>> = BTreeMap::new();
    for name in names {
        let Some((config, host)) = name.rsplit_once('/') else {
            continue;
        };
        let table = tables
            .entry(config)
            .or_insert_with(|| Table::of(snapshot, config));
        match table.resolve(host) {
            Some((canonical, resource)) => {
                selected
                    .found
                    .entry(canonical)
                    .or_insert_with(|| (resource, BTreeSet::new()))
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

/// A route configuration's virtual hosts served on demand, decoded, as Envoy would match
/// hosts against them.
struct Table<'a> {
    /// Each virtual host's resource name and resource, in the order of `routes`.
    names: Vec<(&'a String, &'a Arc<Resource>)>,
    routes: RouteConfiguration,
}

impl<'a> Table<'a> {
    fn of(snapshot: &'a Snapshot, config: &str) -> Table<'a> {
        let prefix = format!("{config}/");
        let mut names = Vec::new();
        let mut virtual_hosts = Vec::new();
        for (name, r) in snapshot
            .resources(TypeKind::VirtualHost)
            .range(prefix.clone()..)
            .take_while(|(name, _)| name.starts_with(&prefix))
        {
            if let Ok(vh) = VirtualHost::decode(r.body.value.as_slice()) {
                names.push((name, r));
                virtual_hosts.push(vh);
            }
        }
        let ignore_port = snapshot
            .resources(TypeKind::Route)
            .get(config)
            .and_then(|r| RouteConfiguration::decode(r.body.value.as_slice()).ok())
            .is_some_and(|rc| rc.ignore_port_in_host_matching);
        Table {
            names,
            routes: RouteConfiguration {
                ignore_port_in_host_matching: ignore_port,
                virtual_hosts,
                ..Default::default()
            },
        }
    }

    /// The virtual host Envoy would route `host` to, by its resource name.
    fn resolve(&self, host: &str) -> Option<(String, Arc<Resource>)> {
        let matched = crate::simulate::http::virtual_host(&self.routes, host)?;
        let at = self
            .routes
            .virtual_hosts
            .iter()
            .position(|vh| std::ptr::eq(vh, matched))?;
        let (name, r) = self.names[at];
        Some((name.clone(), Arc::clone(r)))
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

    fn snapshot() -> Snapshot {
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
        for rc in [on_demand, eager] {
            let r = Resource::pack(&rc);
            s.insert(
                TypeKind::Route,
                rc.name.clone(),
                r.version.clone(),
                r.body.clone(),
            )
            .unwrap();
        }
        for (name, domains) in [
            ("web", &["web", "web.shop.svc.cluster.local"][..]),
            ("wiki", &["*.wiki.org"][..]),
        ] {
            let r = Resource::pack(&VirtualHost {
                name: name.into(),
                domains: domains.iter().map(|d| d.to_string()).collect(),
                ..Default::default()
            });
            s.insert(
                TypeKind::VirtualHost,
                format!("80/{name}"),
                r.version.clone(),
                r.body.clone(),
            )
            .unwrap();
        }
        s
    }

    /// The wildcard brings the sentinel of each route configuration served on demand (not of
    /// one served whole); an alias finds its virtual host as Envoy matches domains (port
    /// dropped, case ignored, `*.` suffixes); one nothing matches is missing.
    #[test]
    fn names_select_as_envoy_matches_hosts() {
        let names: BTreeSet<String> = [
            "80/web:80",
            "80/WEB.shop.svc.cluster.local",
            "80/en.wiki.org",
            "80/nowhere",
        ]
        .map(String::from)
        .into();
        let selected = select(true, &names, &snapshot());
        let found: Vec<(&str, Vec<&str>)> = selected
            .found
            .iter()
            .map(|(name, (_, aliases))| {
                (name.as_str(), aliases.iter().map(String::as_str).collect())
            })
            .collect();
        assert_eq!(
            found,
            [
                ("80/pasa-on-demand", vec![]),
                ("80/web", vec!["80/WEB.shop.svc.cluster.local", "80/web:80"]),
                ("80/wiki", vec!["80/en.wiki.org"]),
            ],
            "{selected:?}"
        );
        // Host names are case-insensitive, as Envoy matches them.
        assert_eq!(selected.missing, ["80/nowhere"].map(String::from).into());
        assert!(
            select(false, &BTreeSet::new(), &snapshot())
                .found
                .is_empty()
        );
    }
}
