//! The on-demand shape of a sidecar's configuration (see `docs/on-demand.md`): what the eager
//! translator built for the proxy's narrowed scope, with its outbound HTTP route
//! configurations served by VHDS. Each such route configuration keeps its settings and loses
//! its virtual hosts, which become VirtualHost resources of their own, named
//! `<route config>/<virtual host>`: those the eager configuration holds, but for their name,
//! which is the resource's (Envoy keeps a route configuration's VHDS virtual hosts by the name
//! in the message, and removes them by the resource's name). Its catch-all (`allow_any`,
//! `block_all`, `allow_any_dynamic_dns`, domain `*`) is kept the same way, but never sent as it
//! is: while Envoy holds a virtual host matching every host, it never asks VHDS; the agent
//! answers a host nothing else matches with it, for that host alone. Every connection manager
//! routing by such a route configuration gets the on-demand filter (with on-demand CDS from
//! ADS) before its router: a request no virtual host matches is held while Envoy asks for it.
//!
//! Outbound route configurations are the port-named ones (`9080`) and [`names::ON_DEMAND_ROUTE`]
//! (the one `virtualOutbound` sends plaintext HTTP of other ports to). Inbound ones, and a
//! sniffed service's own (`<host>:<port>`, whose one virtual host matches any domain), stay
//! whole.

use std::collections::BTreeSet;

use envoy_types::pb::envoy::config::listener::v3::{Filter, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, Vhds};
use envoy_types::pb::envoy::extensions::filters::http::on_demand::v3::{OnDemand, OnDemandCds};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_connection_manager::RouteSpecifier, http_filter,
};
use envoy_types::util::pack_any;
use prost::Message;

use super::builders::ads;
use super::{filters, names};
use crate::resource::{Generated, Resource};

/// The on-demand filter's name.
pub(super) const ON_DEMAND_FILTER: &str = "envoy.filters.http.on_demand";

/// Whether the route configuration `name` is served on demand.
pub(super) fn serves_on_demand(name: &str) -> bool {
    name == names::ON_DEMAND_ROUTE || name.parse::<u16>().is_ok()
}

/// Reshapes `generated` (a sidecar's, for Envoy) for the on-demand scope (see the module doc).
pub(super) fn reshape(generated: &mut Generated) {
    let mut on_demand = BTreeSet::new();
    let mut reshaped = Vec::new();
    for (name, resource) in generated.routes.iter() {
        if !serves_on_demand(name) {
            continue;
        }
        let Ok(mut config) = RouteConfiguration::decode(resource.body.value.as_slice()) else {
            continue;
        };
        for mut vh in std::mem::take(&mut config.virtual_hosts) {
            vh.name = format!("{name}/{}", vh.name);
            generated
                .virtual_hosts
                .insert(vh.name.clone(), Resource::pack(&vh));
        }
        config.vhds = Some(Vhds {
            config_source: Some(ads()),
        });
        reshaped.push((name.clone(), Resource::pack(&config)));
        on_demand.insert(name.clone());
    }
    generated.routes.extend(reshaped);
    let mut held = Vec::new();
    for (name, resource) in generated.listeners.iter() {
        let Ok(mut listener) = Listener::decode(resource.body.value.as_slice()) else {
            continue;
        };
        let mut changed = false;
        for chain in listener
            .filter_chains
            .iter_mut()
            .chain(listener.default_filter_chain.as_mut())
        {
            for f in &mut chain.filters {
                changed |= hold_unrouted(f, &on_demand);
            }
        }
        if changed {
            held.push((name.clone(), Resource::pack(&listener)));
        }
    }
    generated.listeners.extend(held);
}

/// Puts the on-demand filter before the router of `f`, when it is a connection manager routing
/// by a route configuration of `on_demand`; whether it changed.
fn hold_unrouted(f: &mut Filter, on_demand: &BTreeSet<String>) -> bool {
    if f.name != filters::HCM {
        return false;
    }
    let Some(filter::ConfigType::TypedConfig(any)) = &mut f.config_type else {
        return false;
    };
    let Ok(mut hcm) = HttpConnectionManager::decode(any.value.as_slice()) else {
        return false;
    };
    let Some(RouteSpecifier::Rds(rds)) = &hcm.route_specifier else {
        return false;
    };
    if !on_demand.contains(&rds.route_config_name)
        || hcm.http_filters.iter().any(|h| h.name == ON_DEMAND_FILTER)
    {
        return false;
    }
    let at = hcm
        .http_filters
        .iter()
        .position(|h| h.name == filters::ROUTER)
        .unwrap_or(hcm.http_filters.len());
    hcm.http_filters.insert(at, on_demand_filter());
    any.value = hcm.encode_to_vec();
    true
}

/// The on-demand filter, asking for clusters by ADS too.
fn on_demand_filter() -> HttpFilter {
    HttpFilter {
        name: ON_DEMAND_FILTER.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(OnDemand {
            odcds: Some(OnDemandCds {
                source: Some(ads()),
                ..Default::default()
            }),
        }))),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::cache::Cache;
    use crate::model::proxy::Generator;
    use crate::testing::{resource, sidecar};
    use crate::translate::Translator;
    use crate::translate::tests::hcm_in;

    /// An on-demand sidecar that learned `reviews`: its port's route configuration is served by
    /// VHDS (no virtual host inline, no catch-all), the virtual host a resource of its own, its
    /// connection manager holding unrouted requests (the on-demand filter before the router);
    /// `virtualOutbound` sends plaintext HTTP to `on-demand`. The eager sidecar has none of it.
    #[test]
    fn an_on_demand_sidecar_serves_its_virtual_hosts_by_vhds() {
        let cache = Cache::from_resources(
            vec![
                resource(
                    "ServiceEndpoints",
                    "default",
                    "reviews",
                    json!({"addresses": ["10.96.0.20"], "ports": [{"name": "http", "port": 9080}]}),
                    1,
                ),
                resource(
                    "ServiceEndpoints",
                    "default",
                    "ratings",
                    json!({"addresses": ["10.96.0.21"], "ports": [{"name": "http", "port": 9080}]}),
                    2,
                ),
            ],
            10,
        );
        let learned = ["reviews.default.svc.cluster.local".to_string()];
        let proxy = crate::model::proxy::Proxy {
            learned: Some(Arc::new(learned.into())),
            ..sidecar("10.0.0.9")
        };
        let lazy = Translator::new(proxy).generate(&cache, Generator::Envoy);
        let config = RouteConfiguration::decode(lazy.routes["9080"].body.value.as_slice()).unwrap();
        assert!(config.vhds.is_some() && config.virtual_hosts.is_empty());
        assert_eq!(
            lazy.virtual_hosts.keys().collect::<Vec<_>>(),
            [
                "9080/allow_any",
                "9080/reviews.default.svc.cluster.local:9080",
                "on-demand/allow_any"
            ],
            "the learned service only, and the catch-alls"
        );
        let on_demand =
            RouteConfiguration::decode(lazy.routes[names::ON_DEMAND_ROUTE].body.value.as_slice())
                .unwrap();
        assert!(on_demand.vhds.is_some() && on_demand.virtual_hosts.is_empty());
        let listener =
            |name: &str| Listener::decode(lazy.listeners[name].body.value.as_slice()).unwrap();
        let filter_names = |hcm: HttpConnectionManager| -> Vec<String> {
            hcm.http_filters.into_iter().map(|f| f.name).collect()
        };
        for (name, chain) in [("0.0.0.0_9080", ""), (names::VIRTUAL_OUTBOUND, "")] {
            let hcm = hcm_in(&listener(name), chain);
            let filters = filter_names(hcm);
            let at = filters.iter().position(|f| f == ON_DEMAND_FILTER);
            assert_eq!(
                at.map(|at| filters[at + 1].as_str()),
                Some(filters::ROUTER),
                "{name}: {filters:?}"
            );
        }

        let eager = Translator::new(sidecar("10.0.0.9")).generate(&cache, Generator::Envoy);
        assert!(eager.virtual_hosts.is_empty());
        assert!(!eager.routes.contains_key(names::ON_DEMAND_ROUTE));
        let config =
            RouteConfiguration::decode(eager.routes["9080"].body.value.as_slice()).unwrap();
        assert!(config.vhds.is_none() && config.virtual_hosts.len() == 3);
    }
}
