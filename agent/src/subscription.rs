//! The store subscription a proxy needs: exactly what its scope (see [`crate::model::scope`])
//! reads.
//!
//! For a sidecar it is derived from the scope, iteratively: Sidecars and PeerAuthentications of the
//! proxy's and the root namespace first; then the egress hosts; then the destinations the visible VirtualServices
//! route to, so their clusters can be built. A router (gateway) instead follows every Gateway,
//! its own services, the VirtualServices bound to the Gateways that apply to it, and their
//! destinations. Each store change that alters the view alters the subscription, and the store
//! then adds or removes what entered or left it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use pasa_istio::node::ProxyType;
use pasa_istio::virtual_service::VirtualService;
use pasa_proto::Kind;
use pasa_proto::store::v1::{Rule, Subscription};

use crate::cache::Cache;
use crate::model::proxy::Proxy;
use crate::model::registry::{Config, Registry, Service};
use crate::model::scope::SidecarScope;

/// The store subscription `proxy` needs, given what it has seen so far (see the module doc).
///
/// A sidecar that has seen nothing yet (an empty cache, no answered subscription) asks first
/// only for what decides its scope: the Sidecars and PeerAuthentications of its namespaces.
/// Without them it could not tell "no Sidecar" (Istio's default: see everything) from "not
/// fetched yet", and would list the whole store at every start (at 100k pods, megabytes per
/// agent, for a scope it narrows a moment later). The answer then widens the subscription.
pub fn subscription(proxy: &Proxy, cache: &Cache) -> Subscription {
    if proxy.kind != ProxyType::Router && cache.is_empty() && cache.answered().is_none() {
        return Subscription {
            rules: vec![scope_rule(proxy)],
        };
    }
    let mut registry = Registry::default();
    registry.update(cache, &proxy.mesh.domain_suffix);
    subscription_of(proxy, &registry)
}

/// [`subscription`] from an already parsed registry.
pub fn subscription_of(proxy: &Proxy, registry: &Registry) -> Subscription {
    let scope = SidecarScope::of(proxy, registry);
    if proxy.kind == ProxyType::Router || scope.sees_everything() {
        return subscription_in(proxy, registry, &scope, &[], std::iter::empty());
    }
    let services = scope.services(registry);
    subscription_in(
        proxy,
        registry,
        &scope,
        &scope.virtual_services(registry),
        services.iter(),
    )
}

/// [`subscription_of`] from what translation already worked out of the proxy's view: its scope,
/// and the VirtualServices and services that scope makes visible.
pub fn subscription_in<'a>(
    proxy: &Proxy,
    registry: &Registry,
    scope: &SidecarScope,
    virtual_services: &[Arc<Config<VirtualService>>],
    services: impl Iterator<Item = &'a Arc<Service>>,
) -> Subscription {
    if proxy.kind == ProxyType::Router {
        return router_subscription(proxy, registry);
    }
    let mut rules = vec![scope_rule(proxy)];
    if scope.sees_everything() {
        // Istio's default: everything exported to the namespace (filtered here, not in the
        // store), but policies only of the proxy's own namespace and the root (the scope rule).
        rules.push(Rule {
            kinds: Kind::shared().map(|k| k.as_str().to_string()).collect(),
            ..Default::default()
        });
        rules.push(destination_peer_authentications(Vec::new()));
        return Subscription { rules };
    }
    rules.extend(network_gateways(proxy, registry));
    // The proxy's own services, endpoints and workload entries (inbound side).
    rules.push(Rule {
        kinds: kinds(&[
            Kind::ServiceEndpoints,
            Kind::ServiceEntry,
            Kind::WorkloadEntry,
        ]),
        namespaces: vec![proxy.namespace.clone()],
        ..Default::default()
    });
    let service_kinds = || {
        kinds(&[
            Kind::ServiceEndpoints,
            Kind::ServiceEntry,
            Kind::VirtualService,
        ])
    };
    // The egress hosts, one rule per namespace they name: a rule takes a list of hosts, and
    // the store bounds the rules of a subscription (an on-demand proxy learns hundreds of
    // hosts, a Sidecar may list as many).
    let mut egress_hosts: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for egress in &scope.egress {
        egress_hosts
            .entry(egress.namespace.as_str())
            .or_default()
            .insert(egress.host.as_str());
    }
    for (namespace, hosts) in egress_hosts {
        rules.push(Rule {
            kinds: service_kinds(),
            namespaces: if namespace == "*" {
                Vec::new()
            } else {
                vec![namespace.to_string()]
            },
            hosts: hosts.into_iter().map(str::to_string).collect(),
            ..Default::default()
        });
    }
    // DestinationRules apply by host from any namespace (proxy's, service's, root): those of
    // the hosts egress names or matches by a pattern. Egress to every host of one namespace
    // (`./*`, `istio-system/*`) asks for the DestinationRules of that namespace's visible
    // services, not for every rule of the mesh (a service appearing there shows up through the
    // rules above, and then its DestinationRules are asked for).
    let services: Vec<&Arc<Service>> = services.collect();
    // (An empty list of namespaces would be every namespace: none is asked for then.)
    if !services.is_empty() {
        rules.push(destination_peer_authentications(dedup(
            services.iter().map(|s| s.namespace.clone()).collect(),
        )));
    }
    let whole: BTreeSet<&str> = scope
        .egress
        .iter()
        .filter(|e| e.host == "*" && e.namespace != "*")
        .map(|e| e.namespace.as_str())
        .collect();
    let mut dr_hosts: BTreeSet<String> = scope
        .egress
        .iter()
        .filter(|e| e.host != "*" || e.namespace == "*")
        .map(|e| e.host.clone())
        .collect();
    dr_hosts.extend(
        services
            .iter()
            .filter(|s| whole.contains(s.namespace.as_str()))
            .map(|s| s.hostname.clone()),
    );
    // Destinations of visible VirtualServices, so their clusters can be built; not those an
    // egress host already asks for in every namespace (an on-demand proxy's learned hosts, whose
    // routes mostly lead to themselves: the subscription then does not change, and the store
    // is not asked again, when their VirtualServices arrive).
    let mut destinations = BTreeSet::new();
    for vs in virtual_services {
        add_destinations(proxy, vs, &mut destinations);
    }
    for e in scope.egress.iter().filter(|e| e.namespace == "*") {
        destinations.remove(&e.host);
    }
    if !destinations.is_empty() {
        rules.push(Rule {
            kinds: kinds(&[Kind::ServiceEndpoints, Kind::ServiceEntry]),
            hosts: destinations.iter().cloned().collect(),
            ..Default::default()
        });
        dr_hosts.extend(destinations);
    }
    // (No hosts would be every host: none is asked for then.)
    if !dr_hosts.is_empty() {
        rules.push(Rule {
            kinds: kinds(&[Kind::DestinationRule]),
            hosts: dr_hosts.into_iter().collect(),
            ..Default::default()
        });
    }
    // Endpoints of visible ServiceEntries that select WorkloadEntries.
    let selector_namespaces: BTreeSet<String> = services
        .iter()
        .filter(|s| !s.kubernetes)
        .map(|s| s.namespace.clone())
        .filter(|ns| ns != &proxy.namespace)
        .collect();
    if !selector_namespaces.is_empty() {
        rules.push(Rule {
            kinds: kinds(&[Kind::WorkloadEntry]),
            namespaces: selector_namespaces.into_iter().collect(),
            ..Default::default()
        });
    }
    Subscription { rules }
}

/// Every network gateway of the mesh (Services labelled with a network, which the store
/// indexes under one value, and those the mesh config's networks name by service): endpoints
/// of another network are reached through them, and their number in every network weighs
/// every endpoint (see `crate::model::network`). They are a few per network and cluster,
/// never the mesh.
fn network_gateways(proxy: &Proxy, registry: &Registry) -> Vec<Rule> {
    let mut rules = vec![Rule {
        kinds: kinds(&[Kind::ServiceEndpoints]),
        gateways: vec![pasa_istio::service_endpoints::NETWORK_GATEWAYS_INDEX.to_string()],
        ..Default::default()
    }];
    let named: BTreeSet<String> = registry
        .mesh_config(&proxy.mesh.root_namespace)
        .and_then(|m| m.mesh_networks())
        .into_iter()
        .flat_map(|m| m.networks.into_values())
        .flat_map(|n| n.gateways)
        .map(|g| g.registry_service_name)
        .filter(|h| !h.is_empty())
        .collect();
    if !named.is_empty() {
        rules.push(Rule {
            kinds: kinds(&[Kind::ServiceEndpoints]),
            hosts: named.into_iter().collect(),
            ..Default::default()
        });
    }
    rules
}

/// What decides a sidecar's scope: Sidecars and EnvoyFilters apply from the proxy's config
/// namespace, PeerAuthentications and AuthorizationPolicies from its workload namespace (the same, but for
/// a proxy told otherwise); all of them also from the root namespace.
fn scope_rule(proxy: &Proxy) -> Rule {
    Rule {
        kinds: kinds(&[
            Kind::Sidecar,
            Kind::PeerAuthentication,
            Kind::AuthorizationPolicy,
            Kind::RequestAuthentication,
            Kind::EnvoyFilter,
            Kind::Telemetry,
            Kind::WasmPlugin,
            Kind::TrafficExtension,
            // Their modules' pull secrets, of their namespaces.
            Kind::ImagePullSecret,
            // Kept in the root namespace only.
            Kind::MeshConfig,
            Kind::JsonWebKeySet,
        ]),
        namespaces: dedup(vec![
            proxy.config_namespace.clone(),
            proxy.namespace.clone(),
            proxy.mesh.root_namespace.clone(),
        ]),
        ..Default::default()
    }
}

/// A router's scope, derived as istiod scopes a gateway: every Gateway (few, and selector matching
/// is not a store dimension); the router's own services, which decide the ports it listens on and
/// which service-bound Gateways apply (those of its namespace, and the services Gateways name in
/// `internal.istio.io/gateway-service` in theirs); the VirtualServices bound to the Gateways that
/// apply to it, and the services and DestinationRules of their destinations; and, when a server
/// passes TLS through by SNI-DNAT (`AUTO_PASSTHROUGH`), the services and DestinationRules of the
/// hosts it serves.
fn router_subscription(proxy: &Proxy, registry: &Registry) -> Subscription {
    use crate::model::gateway;
    use pasa_istio::gateway::TlsMode;

    const OWN_KINDS: [Kind; 2] = [Kind::ServiceEndpoints, Kind::ServiceEntry];
    let mut rules = vec![
        Rule {
            kinds: kinds(&[Kind::Gateway]),
            ..Default::default()
        },
        // The security policies and EnvoyFilters that may apply to the router itself, and the
        // mesh config (kept in the root namespace).
        Rule {
            kinds: kinds(&[
                Kind::AuthorizationPolicy,
                Kind::RequestAuthentication,
                Kind::EnvoyFilter,
                Kind::Telemetry,
                Kind::WasmPlugin,
                Kind::TrafficExtension,
                Kind::ImagePullSecret,
                Kind::MeshConfig,
                Kind::JsonWebKeySet,
            ]),
            namespaces: dedup(vec![
                proxy.namespace.clone(),
                proxy.mesh.root_namespace.clone(),
            ]),
            ..Default::default()
        },
        Rule {
            kinds: kinds(&[OWN_KINDS.as_slice(), &[Kind::WorkloadEntry]].concat()),
            namespaces: vec![proxy.namespace.clone()],
            ..Default::default()
        },
        // A router sends to services of any namespace (and routers are few).
        destination_peer_authentications(Vec::new()),
    ];
    rules.extend(network_gateways(proxy, registry));
    for g in registry.gateways() {
        if let Some(list) = g.meta.annotations.get(gateway::GATEWAY_SERVICE_ANNOTATION) {
            rules.push(Rule {
                kinds: kinds(&OWN_KINDS),
                namespaces: vec![gateway::services_namespace(g).to_string()],
                hosts: dedup(list.split(',').map(|h| h.trim().to_string()).collect()),
                ..Default::default()
            });
        }
    }
    let applying = gateway::applying(proxy, registry);
    let selected: BTreeSet<String> = applying.iter().map(gateway::Applied::name).collect();
    if selected.is_empty() {
        return Subscription { rules };
    }
    rules.push(Rule {
        kinds: kinds(&[Kind::VirtualService]),
        gateways: selected.iter().cloned().collect(),
        ..Default::default()
    });
    let mut destinations = BTreeSet::new();
    for vs in registry.virtual_services() {
        let ns = &vs.meta.namespace;
        let bound = vs
            .spec
            .gateways
            .iter()
            .any(|g| selected.contains(&pasa_istio::gateway::resolve_gateway_name(g, ns)));
        if bound {
            add_destinations(proxy, vs, &mut destinations);
        }
    }
    // SNI-DNAT reaches every service a server host covers.
    for applied in &applying {
        for server in &applied.gateway.spec.servers {
            if server
                .tls
                .as_ref()
                .is_some_and(|t| t.mode == TlsMode::AutoPassthrough)
            {
                destinations.extend(
                    server
                        .hosts
                        .iter()
                        .map(|h| h.split_once('/').map_or(h.as_str(), |(_, h)| h).to_string()),
                );
            }
        }
    }
    if !destinations.is_empty() {
        let hosts: Vec<String> = destinations.into_iter().collect();
        rules.push(Rule {
            kinds: kinds(&[OWN_KINDS.as_slice(), &[Kind::DestinationRule]].concat()),
            hosts,
            ..Default::default()
        });
    }
    Subscription { rules }
}

/// The PeerAuthentications of the namespaces of the services a proxy sends to (every namespace
/// when `namespaces` is empty): one that turns mutual TLS off for a destination's port makes
/// the proxy send it plaintext (see `translate::endpoint`), as istiod's endpoints say.
fn destination_peer_authentications(namespaces: Vec<String>) -> Rule {
    Rule {
        kinds: kinds(&[Kind::PeerAuthentication]),
        namespaces,
        ..Default::default()
    }
}

/// The hosts a VirtualService sends traffic to (routes, mirrors, TCP and TLS routes), resolved.
fn add_destinations(proxy: &Proxy, vs: &Config<VirtualService>, out: &mut BTreeSet<String>) {
    let ns = &vs.meta.namespace;
    out.extend(
        vs.spec
            .destination_hosts()
            .map(|h| proxy.resolve_host(h, ns)),
    );
}

fn dedup(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

/// The `kinds` of a subscription rule, as the wire names them.
fn kinds(kinds: &[Kind]) -> Vec<String> {
    kinds.iter().map(|k| k.as_str().to_string()).collect()
}

#[cfg(test)]
mod tests;
