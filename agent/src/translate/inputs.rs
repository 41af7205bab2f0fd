//! What each generator's output was built from, fingerprinted so that an update rebuilds only
//! what its inputs changed: the config read whole by listeners and route configurations, the
//! services and VirtualServices a route follows, and the shapes of services as clusters read them.

use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::{Arc, Weak};

use pasa_istio::destination_rule::DestinationRule;
use pasa_istio::node::ProxyType;
use pasa_istio::virtual_service::VirtualService;
use pasa_proto::Kind;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::cache::Cache;
use crate::model::proxy::{Generator, Proxy};
use crate::model::registry::{self, Config, Service};

use super::view::{RulesChanged, View};
use super::{fingerprint, hash};

/// Fingerprints of the config read whole by the listeners and by the route configurations (the
/// parts not followed per service).
pub(super) struct GlobalInputs {
    pub(super) listeners: u64,
    pub(super) routes: u64,
}

impl GlobalInputs {
    pub(super) fn of(
        view: &View<'_>,
        cache: &Cache,
        generator: Generator,
        shapes: &mut Shapes,
    ) -> Self {
        let router = view.proxy.kind == ProxyType::Router;
        let grpc = generator == Generator::Grpc;
        let mut listeners = std::collections::hash_map::DefaultHasher::new();
        let mut routes = std::collections::hash_map::DefaultHasher::new();
        for (key, resource) in cache.iter() {
            let (for_listeners, for_routes) = match key.kind {
                _ if router => (true, false),
                // Followed through the services.
                Kind::ServiceEndpoints => (false, false),
                Kind::ServiceEntry | Kind::WorkloadEntry => (true, false),
                // Followed per route configuration (and below, for TCP and TLS routes).
                Kind::DestinationRule | Kind::VirtualService => (grpc, false),
                // The inbound side's modes.
                Kind::PeerAuthentication => (true, false),
                // The inbound side's RBAC filters (the mesh config: CUSTOM's providers, trust
                // domain aliases).
                // A gRPC server's too (without CUSTOM or JWT: gRPC has neither).
                Kind::AuthorizationPolicy => (true, false),
                Kind::MeshConfig | Kind::RequestAuthentication | Kind::JsonWebKeySet => {
                    (!grpc, false)
                }
                // Applied to what was built, as it is handed out (see `envoy_filter`,
                // `telemetry`, `extensions`).
                Kind::EnvoyFilter
                | Kind::Telemetry
                | Kind::WasmPlugin
                | Kind::TrafficExtension
                | Kind::ImagePullSecret => (false, false),
                // Not translated yet: stored and validated, not applied by the agent.
                Kind::ProxyConfig | Kind::WorkloadGroup => (false, false),
                Kind::Sidecar | Kind::Gateway => (true, true),
            };
            if for_listeners {
                key.hash(&mut listeners);
                resource.mod_revision.hash(&mut listeners);
            }
            if for_routes {
                key.hash(&mut routes);
                resource.mod_revision.hash(&mut routes);
            }
        }
        // What the connection managers and routes take from the proxy's settings and the
        // mesh config.
        view.route_settings.hash(&mut listeners);
        view.route_settings.hash(&mut routes);
        // What an on-demand proxy learned decides which services it sees, as a Sidecar does.
        view.proxy.learned.hash(&mut listeners);
        view.proxy.learned.hash(&mut routes);
        if !router && !grpc {
            // The rules of the services the workload serves shape its inbound clusters.
            for local in view.local_instances() {
                if let Some(dr) = view.destination_rules.for_inbound(local.service) {
                    config_identity(&dr.meta, &mut listeners);
                }
            }
        }
        if !router {
            for vs in view.registry.virtual_services() {
                if !vs.spec.tcp.is_empty() || !vs.spec.tls.is_empty() {
                    config_identity(&vs.meta, &mut listeners);
                }
            }
            for service in view.registry.services().values().flatten() {
                shapes.of(service).listener.hash(&mut listeners);
            }
        }
        GlobalInputs {
            listeners: listeners.finish(),
            routes: routes.finish(),
        }
    }
}

pub(super) fn config_identity(meta: &registry::Meta, h: &mut impl Hasher) {
    (&meta.namespace, &meta.name, meta.created, meta.revision).hash(h);
}

/// The visible services of each port, and whether a wildcard service has it: worked out once per
/// update for the route configurations.
#[derive(Default)]
pub(super) struct PortIndex {
    pub(super) ports: FxHashMap<u32, (Vec<Arc<Service>>, bool)>,
}

/// What the route configuration `name` of a sidecar reads: the services of its port (their
/// shape, and the DestinationRule that decides their default route's hash policy), the aliases
/// (Kubernetes `ExternalName` services), the VirtualServices that may route the port, in order,
/// and their destinations' shape and DestinationRule.
pub(super) fn route_inputs(
    view: &View<'_>,
    name: &str,
    global: u64,
    shapes: &mut Shapes,
    index: &mut PortIndex,
) -> u64 {
    let port = name
        .rsplit_once(':')
        .map_or(name, |(_, port)| port)
        .parse::<u32>()
        .unwrap_or(0);
    let (services, wildcard_service) = index.ports.entry(port).or_insert_with(|| {
        let services: Vec<Arc<Service>> = view
            .services
            .values()
            .filter(|s| s.port(port).is_some() || view.is_alias(s))
            .cloned()
            .collect();
        let wildcard = services.iter().any(|s| s.hostname.starts_with('*'));
        (services, wildcard)
    });
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (name, global).hash(&mut h);
    for service in services.iter() {
        follow_service(view, service, shapes, &mut h);
    }
    for (i, vs) in view.virtual_services.iter().enumerate() {
        let relevant = port == 80
            || *wildcard_service
            || view.vs_hosts[i].resolved.iter().any(|host| {
                host.starts_with('*')
                    || view
                        .services
                        .get(host)
                        .is_some_and(|s| s.port(port).is_some())
            });
        if !relevant {
            continue;
        }
        (i, virtual_service_inputs(view, vs, shapes)).hash(&mut h);
    }
    h.finish()
}

/// What a VirtualService's routes read: the VirtualService, and its destinations' shape and
/// DestinationRule (they decide cluster names and hash policies).
pub(super) fn virtual_service_inputs(
    view: &View<'_>,
    vs: &Arc<Config<VirtualService>>,
    shapes: &mut Shapes,
) -> u64 {
    let id = Arc::as_ptr(vs) as usize;
    if let Some(known) = shapes.follow.virtual_services.get(&id)
        && known.is_current(view)
    {
        return known.inputs;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    config_identity(&vs.meta, &mut h);
    let mut destinations = Vec::new();
    for host in vs.spec.destination_hosts() {
        let host = view.proxy.resolve_host(host, &vs.meta.namespace);
        let service = view.services.get(&host);
        match service {
            Some(service) => follow_service(view, service, shapes, &mut h),
            None => host.hash(&mut h),
        }
        destinations.push((host, service.map(Arc::downgrade)));
    }
    let inputs = h.finish();
    shapes.follow.virtual_services.insert(
        id,
        VirtualServiceInputs {
            _virtual_service: Arc::clone(vs),
            destinations,
            inputs,
        },
    );
    inputs
}

/// A service as routes read it: its shape, and what hash policies read of its DestinationRule.
pub(super) fn follow_service(
    view: &View<'_>,
    service: &Arc<Service>,
    shapes: &mut Shapes,
    h: &mut impl Hasher,
) {
    shapes.followed(view, service).route_fingerprint.hash(h);
}

/// Fingerprints of services, computed once per service allocation: the registry rebuilds a
/// service only when its resource changed, so most are reused from one update to the next.
#[derive(Debug, Default)]
pub(super) struct Shapes {
    /// By the service's address; the entry holds the service, so the address is not reused
    /// while it is here.
    pub(super) memo: FxHashMap<usize, (Arc<Service>, ShapeOf)>,
    /// What route configurations read of a DestinationRule (see [`hash::rule_fingerprint`]),
    /// likewise by address.
    pub(super) rules: FxHashMap<usize, (Arc<Config<DestinationRule>>, u64)>,
    proxy_ips: Vec<String>,
    /// What also depends on the view's DestinationRule index.
    follow: FollowMemo,
}

/// What is worked out with the view's DestinationRule index, kept across updates except where
/// the index changed (see [`RulesChanged`]): each service's DestinationRule and how routes
/// follow it, and each visible VirtualService's inputs, by address.
#[derive(Debug, Default)]
pub(super) struct FollowMemo {
    pub(super) services: FxHashMap<usize, Followed>,
    pub(super) virtual_services: FxHashMap<usize, VirtualServiceInputs>,
}

/// Of a service that [`Shapes::memo`] holds (so its address is not reused while this is here).
#[derive(Debug)]
pub(super) struct Followed {
    /// The DestinationRule that applies to it.
    pub(super) rule: Option<Arc<Config<DestinationRule>>>,
    /// Its shape and what hash policies read of its rule.
    route_fingerprint: u64,
}

#[derive(Debug)]
pub(super) struct VirtualServiceInputs {
    /// Held, so that its address (the key) is not reused while the entry is here.
    pub(super) _virtual_service: Arc<Config<VirtualService>>,
    /// Each destination host, resolved, with the visible service it named then (its allocation
    /// kept by the `Weak`, so that a later service cannot be taken for it).
    pub(super) destinations: Vec<(String, Option<Weak<Service>>)>,
    pub(super) inputs: u64,
}

impl VirtualServiceInputs {
    /// Whether its destinations still name the same services: then its inputs hold, as long as
    /// what the rules changed was forgotten first ([`Shapes::begin`]).
    pub(super) fn is_current(&self, view: &View<'_>) -> bool {
        self.destinations
            .iter()
            .all(|(host, seen)| match (view.services.get(host), seen) {
                (Some(now), Some(then)) => std::ptr::eq(Arc::as_ptr(now), then.as_ptr()),
                (None, None) => true,
                _ => false,
            })
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct ShapeOf {
    /// All but the endpoints.
    pub(super) shape: u64,
    /// What a sidecar's listeners read (see [`hash_listener_inputs`]).
    pub(super) listener: u64,
}

impl Shapes {
    pub(super) fn begin(&mut self, proxy: &Proxy, view: &View<'_>) {
        let follow = &mut self.follow;
        match &view.rules_changed {
            None => {}
            Some(RulesChanged::All) => {
                follow.services.clear();
                follow.virtual_services.clear();
            }
            Some(RulesChanged::Hosts(hosts)) => {
                let memo = &self.memo;
                follow.services.retain(|id, _| {
                    memo.get(id)
                        .is_some_and(|(service, _)| !hosts.contains(&service.hostname))
                });
                follow
                    .virtual_services
                    .retain(|_, v| !v.destinations.iter().any(|(host, _)| hosts.contains(host)));
            }
        }
        if self.proxy_ips.is_empty() {
            self.proxy_ips = proxy.ips.iter().map(IpAddr::to_string).collect();
        }
    }

    pub(super) fn of(&mut self, service: &Arc<Service>) -> ShapeOf {
        let ips = &self.proxy_ips;
        self.memo
            .entry(Arc::as_ptr(service) as usize)
            .or_insert_with(|| {
                let shape = fingerprint(|h| hash_listener_inputs(service, &[], false, h));
                let listener = fingerprint(|h| hash_listener_inputs(service, ips, true, h));
                (Arc::clone(service), ShapeOf { shape, listener })
            })
            .1
    }

    /// The DestinationRule that applies to `service`, and how routes follow the service.
    pub(super) fn followed(&mut self, view: &View<'_>, service: &Arc<Service>) -> &Followed {
        let id = Arc::as_ptr(service) as usize;
        if !self.follow.services.contains_key(&id) {
            let rule = view.destination_rules.for_service(service);
            let rule_fingerprint = rule.as_ref().map(|dr| self.rule(dr));
            let shape = self.of(service).shape;
            let route_fingerprint = fingerprint(|h| (shape, rule_fingerprint).hash(h));
            let followed = Followed {
                rule,
                route_fingerprint,
            };
            self.follow.services.insert(id, followed);
        }
        &self.follow.services[&id]
    }

    pub(super) fn rule(&mut self, dr: &Arc<Config<DestinationRule>>) -> u64 {
        self.rules
            .entry(Arc::as_ptr(dr) as usize)
            .or_insert_with(|| {
                let fingerprint = fingerprint(|h| {
                    (&dr.meta.namespace, &dr.meta.name, &dr.spec.host).hash(h);
                    hash::rule_fingerprint(&dr.spec).hash(h);
                });
                (Arc::clone(dr), fingerprint)
            })
            .1
    }

    /// Forgets the services and rules nobody else holds any more, and the VirtualServices
    /// `view` does not see.
    pub(super) fn end(&mut self, view: &View<'_>) {
        self.memo
            .retain(|_, (service, _)| Arc::strong_count(service) > 1);
        self.rules.retain(|_, (dr, _)| Arc::strong_count(dr) > 1);
        let memo = &self.memo;
        self.follow.services.retain(|id, _| memo.contains_key(id));
        if self.follow.virtual_services.len() > view.virtual_services.len() {
            let visible: FxHashSet<usize> = view
                .virtual_services
                .iter()
                .map(|vs| Arc::as_ptr(vs) as usize)
                .collect();
            self.follow
                .virtual_services
                .retain(|id, _| visible.contains(id));
        }
    }
}

/// What a sidecar's listener builders read of a service: all but its endpoints, and of those
/// only the proxy's own (its inbound listeners) and, for a passthrough service without an
/// address, every endpoint's address and ports (a listener each). Without `endpoints`, its shape
/// alone (what route configurations read).
pub(super) fn hash_listener_inputs(
    service: &Service,
    proxy_ips: &[String],
    with_endpoints: bool,
    h: &mut impl Hasher,
) {
    let Service {
        hostname,
        namespace,
        addresses,
        ports,
        resolution,
        external,
        export_to,
        endpoints,
        kubernetes,
        external_name,
        // Read by clusters only.
        subject_alt_names: _,
        traffic_distribution: _,
        persistent_session,
        created,
        revision: _,
        source,
    } = service;
    (hostname, namespace, addresses, export_to, external_name).hash(h);
    persistent_session.hash(h);
    (external, kubernetes, created, source).hash(h);
    format!("{ports:?}{resolution:?}").hash(h);
    if !with_endpoints {
        return;
    }
    let per_endpoint = *resolution == registry::Resolution::Passthrough && addresses.is_empty();
    for e in endpoints {
        if proxy_ips.contains(&e.address) {
            format!("{e:?}").hash(h);
        } else if per_endpoint {
            e.address.hash(h);
            e.ports.hash(h);
        }
    }
}
