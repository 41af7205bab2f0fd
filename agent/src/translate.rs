//! Translation: from the proxy and the raw Istio configuration in its scope to the xDS resources
//! istiod would send it, with istiod's names (see the project's naming notes).
//!
//! This module holds the [`Translator`], its per-generator entry points and what it keeps of
//! each generator's output between updates. What a proxy sees, shared by the builders, is in
//! [`view`] ([`View`]); what each output was built from, fingerprinted so that an update
//! rebuilds only what changed, in [`inputs`]. The builders are the other submodules, one per
//! resource or concern (clusters, routes, listeners of sidecars and gateways, authorization,
//! telemetry, EnvoyFilter patches…).

pub mod authz;
mod builders;
mod cluster;
mod endpoint;
pub use endpoint::{effective_setting as effective_locality_setting, keep_mtls_only};
mod envoy_filter;
pub mod extensions;
mod filters;
pub(crate) mod gateway;
mod grpc;
pub use grpc::{SERVER_LISTENER_PREFIX, grpc_listener};
mod hash;
mod hcm;
mod inputs;
mod lazy;
mod metadata;
pub mod names;
mod patched;
pub mod providers;
mod route;
pub mod sds;
mod session;
mod sidecar;
mod telemetry;
mod view;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;

/// What the listener and route builders fill.
#[derive(Debug, Default)]
pub(crate) struct Built {
    pub clusters: BTreeMap<String, Cluster>,
    /// Encoded fields appended to clusters of `clusters`, by name: metadata whose maps must be
    /// encoded in key order (see [`metadata::cluster_field`]).
    pub cluster_fields: BTreeMap<String, Vec<u8>>,
    /// Load assignments of clusters built here (a router's SNI-DNAT clusters).
    pub endpoints: BTreeMap<String, ClusterLoadAssignment>,
    pub listeners: BTreeMap<String, Listener>,
    pub routes: BTreeMap<String, RouteConfiguration>,
    /// The route configurations a sidecar's listeners ask for by RDS (built on their own).
    pub route_names: BTreeSet<String>,
}

use pasa_istio::node::ProxyType;

use crate::cache::Cache;
use crate::model::proxy::{Generator, Proxy};
use crate::model::registry::{self, Config, Registry, Service};
use crate::resource::{Generated, Resource, ResourceMap, Resources, packed};
use pasa_istio::destination_rule::DestinationRule;

use inputs::{
    GlobalInputs, PortIndex, Shapes, follow_service, route_inputs, virtual_service_inputs,
};
pub(crate) use view::View;
use view::ViewMemo;

/// The clusters and load assignments of one service, and what they were built from.
#[derive(Debug)]
struct HostOutput {
    service: Arc<Service>,
    rule: Option<Arc<Config<DestinationRule>>>,
    /// Cluster name → cluster.
    clusters: Vec<(String, Arc<Resource>)>,
    /// Cluster name → load assignment.
    assignments: Vec<(String, Arc<Resource>)>,
    /// What its clusters took from the proxy and the mesh config.
    settings: cluster::ClusterSettings,
}

impl HostOutput {
    /// Whether it was built from `service` and `rule` (the same allocations, or equal ones)
    /// under `settings`.
    fn built_from(
        &self,
        service: &Arc<Service>,
        rule: Option<&Arc<Config<DestinationRule>>>,
        settings: &cluster::ClusterSettings,
    ) -> bool {
        same(&self.service, service)
            && same_rule(self.rule.as_ref(), rule)
            && self.settings == *settings
    }
}

fn same<T: PartialEq>(a: &Arc<T>, b: &Arc<T>) -> bool {
    Arc::ptr_eq(a, b) || **a == **b
}

fn same_rule(
    a: Option<&Arc<Config<DestinationRule>>>,
    b: Option<&Arc<Config<DestinationRule>>>,
) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => same(a, b),
        _ => false,
    }
}

/// Whether `old` and `new` build the same clusters: the same shape (see [`Shapes`]), and the
/// same endpoints as far as clusters read them: only for the identities they accept, unless they
/// carry them inline (their load assignment does not go by EDS).
fn same_clusters(
    old: &Arc<Service>,
    new: &Arc<Service>,
    proxy: ProxyType,
    shapes: &mut Shapes,
) -> bool {
    let eds = new.resolution == registry::Resolution::ClientSideLb
        || (proxy == ProxyType::Router && new.resolution == registry::Resolution::Passthrough);
    shapes.of(old).shape == shapes.of(new).shape
        && if eds {
            old.identities("", &[]) == new.identities("", &[])
        } else {
            old.endpoints == new.endpoints
        }
}

/// Listeners (and the route configurations built with them), and what they were built from.
#[derive(Debug, Default)]
struct ListenerOutput {
    inputs: u64,
    listeners: ResourceMap,
    /// Route configurations built with the listeners (routers, gRPC).
    routes: ResourceMap,
    /// The route configurations a sidecar's listeners ask for, built on their own.
    route_names: BTreeSet<String>,
    /// Clusters and load assignments built with the listeners; they take precedence over a
    /// service's of the same name.
    clusters: Vec<(String, Arc<Resource>)>,
    endpoints: Vec<(String, Arc<Resource>)>,
}

/// Everything the translator keeps of one generator's resources between updates.
#[derive(Debug, Default)]
struct Outputs {
    /// By service host.
    hosts: FxHashMap<String, HostOutput>,
    /// The union of the services' clusters and load assignments.
    host_clusters: ResourceMap,
    host_endpoints: ResourceMap,
    listeners: Option<ListenerOutput>,
    /// A fingerprint of what each of a sidecar's route configurations was built from, by name.
    routes: FxHashMap<String, u64>,
    route_map: ResourceMap,
    /// What building them again reuses.
    reuse: sidecar::Reuse,
    /// The extensions put on the listeners, then telemetry (access logs, tracing, metrics),
    /// then the EnvoyFilter patches applied, last (Envoy only: istiod applies none of them to
    /// proxyless gRPC).
    extensions: extensions::Memo,
    telemetry: telemetry::Memo,
    patched: envoy_filter::Memo,
}

/// What one [`Translator::generate`] built again (and encoded), for tests and the bench.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// Services whose clusters or load assignments were built again.
    pub services: usize,
    /// Clusters encoded again (those of the services above whose inputs changed).
    pub clusters: usize,
    /// Load assignments encoded again.
    pub assignments: usize,
    /// Whether the listeners were built again.
    pub listeners: bool,
    /// Route configurations built again.
    pub routes: usize,
    /// Virtual hosts of those encoded again (the others are copied from the last encoding; a
    /// sniffed service's own `<host>:<port>` configuration is built whole and not counted).
    pub virtual_hosts: usize,
}

/// Generates resources for one proxy and keeps them current as the cache changes.
///
/// Every output is rebuilt only when what it reads changed:
/// - a service's clusters and load assignments, when the service (its resource, or the
///   WorkloadEntries it selects) or the DestinationRule that applies to it changed; its clusters
///   are encoded again only when more than its endpoints changed (EDS clusters read endpoints
///   only for the identities they accept);
/// - a sidecar's listeners, when config they read changed: a Sidecar, a PeerAuthentication, a
///   ServiceEntry, a VirtualService with TCP or TLS routes, a service's shape (hosts, addresses,
///   ports, resolution, visibility) — not DestinationRules or HTTP routes, and of endpoints only
///   the proxy's own (inbound) and those of a passthrough service without an address (a listener
///   each);
/// - a sidecar's route configuration of a port, when a service of that port, a VirtualService
///   that may route it, or a destination of one (its shape and DestinationRule, which decide
///   cluster names and hash policies) changed; and within it, only the virtual hosts whose
///   routes or names changed are encoded again (see `sidecar::routes`).
///
/// Routers and proxyless gRPC clients build listeners and routes together: a router's SNI-DNAT
/// clusters follow DestinationRule subsets and endpoints, so its listeners are rebuilt on any
/// change; a gRPC client's on any change but of endpoints.
///
/// The resources are kept in persistent maps updated in place, so a generation costs what it
/// rebuilt, and handing it out ([`Generated`]) is O(1).
#[derive(Debug)]
pub struct Translator {
    proxy: Proxy,
    registry: Registry,
    outputs: HashMap<Generator, Outputs>,
    shapes: Shapes,
    rebuilt: Rebuilt,
    /// The store subscription the last update's view of the config calls for.
    subscription: pasa_proto::store::v1::Subscription,
    view: ViewMemo,
    /// Where Wasm modules not in the pod's files come from (none: nowhere).
    modules: Option<std::sync::Arc<dyn extensions::ModuleSource>>,
}

impl Translator {
    pub fn new(proxy: Proxy) -> Self {
        Self {
            registry: Registry::for_cluster(&proxy.cluster_id),
            proxy,
            outputs: HashMap::new(),
            shapes: Shapes::default(),
            rebuilt: Rebuilt::default(),
            subscription: Default::default(),
            view: ViewMemo::default(),
            modules: None,
        }
    }

    /// Takes the Wasm modules of extensions that are not files in the pod from `modules`.
    pub fn with_modules(mut self, modules: std::sync::Arc<dyn extensions::ModuleSource>) -> Self {
        self.modules = Some(modules);
        self
    }

    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    /// The hosts an on-demand proxy has learned (see [`crate::on_demand`]): the next
    /// [`Translator::generate`] builds for the scope they narrow to.
    pub fn set_learned(&mut self, learned: std::sync::Arc<std::collections::BTreeSet<String>>) {
        self.proxy.learned = Some(learned);
    }

    /// The store subscription this proxy needs, given the config the last
    /// [`Translator::generate`] read (see [`crate::subscription`]); before any, none.
    pub fn subscription(&self) -> pasa_proto::store::v1::Subscription {
        self.subscription.clone()
    }

    /// The store subscription this proxy needs over `cache`, worked out from its scope alone,
    /// without translating: whether the cache answers a scope just widened is known before a
    /// translation for it is worth its cost.
    pub fn subscription_over(&mut self, cache: &Cache) -> pasa_proto::store::v1::Subscription {
        self.registry.update(cache, &self.proxy.mesh.domain_suffix);
        crate::subscription::subscription_of(&self.proxy, &self.registry)
    }

    /// What the last [`Translator::generate`] built again.
    pub fn rebuilt(&self) -> Rebuilt {
        self.rebuilt
    }

    /// Brings the resources for `generator` up to date with `cache` and returns a copy of them,
    /// decoded (for tools and tests; the agent serves [`Translator::generate`]'s).
    pub fn update(
        &mut self,
        cache: &Cache,
        generator: Generator,
    ) -> Result<Resources, prost::DecodeError> {
        self.generate(cache, generator).to_resources()
    }

    /// Brings the resources for `generator` up to date with `cache` and returns them, shared
    /// with the translator's memory of what it built.
    pub fn generate(&mut self, cache: &Cache, generator: Generator) -> Generated {
        let Translator {
            proxy,
            registry,
            outputs,
            shapes,
            rebuilt,
            subscription,
            view: view_memo,
            modules,
        } = self;
        registry.update(cache, &proxy.mesh.domain_suffix);
        let view = View::new(proxy, registry, view_memo);
        *subscription = crate::subscription::subscription_in(
            proxy,
            registry,
            &view.scope,
            &view.virtual_services,
            view.services.values(),
        );
        shapes.begin(proxy, &view);
        let out = outputs.entry(generator).or_default();
        let mut counts = Rebuilt::default();
        out.update_hosts(&view, generator, shapes, &mut counts);
        let inputs = GlobalInputs::of(&view, cache, generator, shapes);
        out.update_listeners(&view, generator, inputs.listeners, &mut counts);
        out.update_routes(&view, inputs.routes, shapes, &mut counts);
        shapes.end(&view);
        *rebuilt = counts;
        let mut generated = out.generated();
        if generator == Generator::Envoy {
            // Extensions before telemetry: the metadata exchange goes before the extensions
            // of every phase, and the metrics after them, as in istiod.
            out.extensions
                .apply(proxy, registry, modules.as_deref(), &mut generated);
            out.telemetry.apply(proxy, registry, &mut generated);
            out.patched.apply(proxy, registry, &mut generated);
            if proxy.learned.is_some() && proxy.kind == ProxyType::Sidecar {
                lazy::reshape(&mut generated);
            }
        }
        generated
    }
}

impl Outputs {
    /// Rebuilds the clusters and load assignments of the services whose inputs changed, and
    /// drops those of services no longer visible.
    fn update_hosts(
        &mut self,
        view: &View<'_>,
        generator: Generator,
        shapes: &mut Shapes,
        counts: &mut Rebuilt,
    ) {
        let kind = view.proxy.kind;
        for service in view.services.values() {
            let rule = shapes.followed(view, service).rule.clone();
            let old = self.hosts.get(&service.hostname);
            if old.is_some_and(|o| o.built_from(service, rule.as_ref(), &view.cluster_settings)) {
                continue;
            }
            counts.services += 1;
            let kept_clusters = old
                .filter(|o| {
                    same_rule(o.rule.as_ref(), rule.as_ref())
                        && same_clusters(&o.service, service, kind, shapes)
                        && o.settings == view.cluster_settings
                })
                .map(|o| o.clusters.clone());
            let mut built = Vec::new();
            // Kept clusters are not built again: only their load assignments.
            cluster::service_clusters(
                service,
                rule.as_deref(),
                generator,
                (kind, view.proxy.build, &view.cluster_settings),
                (kept_clusters.is_none(), &mut built),
            );
            let mut output = HostOutput {
                service: Arc::clone(service),
                settings: view.cluster_settings.clone(),
                rule,
                clusters: Vec::with_capacity(built.len()),
                assignments: Vec::with_capacity(built.len()),
            };
            for cluster::BuiltCluster {
                name,
                encoded,
                assignment,
                ..
            } in built
            {
                if let Some(encoded) = assignment {
                    counts.assignments += 1;
                    let a = Resource::from_encoded::<ClusterLoadAssignment>(encoded);
                    output.assignments.push((name.clone(), a));
                }
                if let Some(mut encoded) = encoded {
                    counts.clusters += 1;
                    telemetry::exchange_upstream(view.proxy.build, &name, &mut encoded);
                    let c = Resource::from_encoded::<Cluster>(encoded);
                    output.clusters.push((name, c));
                }
            }
            if let Some(kept) = kept_clusters {
                output.clusters = kept;
            }
            if let Some(old) = self.hosts.remove(&service.hostname) {
                self.forget(&old);
            }
            lay(&mut self.host_clusters, &output.clusters);
            lay(&mut self.host_endpoints, &output.assignments);
            self.hosts.insert(service.hostname.clone(), output);
        }
        // Every visible service has its entry now: any more are of services no longer visible.
        if self.hosts.len() == view.services.len() {
            return;
        }
        let gone: Vec<String> = self
            .hosts
            .keys()
            .filter(|h| !view.services.contains_key(h))
            .cloned()
            .collect();
        for host in gone {
            if let Some(old) = self.hosts.remove(&host) {
                self.forget(&old);
            }
        }
    }

    /// Removes what `old` put in the union maps (what another service has put there since
    /// stays).
    fn forget(&mut self, old: &HostOutput) {
        unlay(&mut self.host_clusters, &old.clusters);
        unlay(&mut self.host_endpoints, &old.assignments);
    }

    fn update_listeners(
        &mut self,
        view: &View<'_>,
        generator: Generator,
        inputs: u64,
        counts: &mut Rebuilt,
    ) {
        if self.listeners.as_ref().is_some_and(|o| o.inputs == inputs) {
            return;
        }
        counts.listeners = true;
        let mut built = Built::default();
        match generator {
            Generator::Envoy => match view.proxy.kind {
                ProxyType::Sidecar => {
                    sidecar::special_clusters(
                        view.scope.outbound_policy,
                        &view.cluster_settings,
                        &mut built,
                    );
                    sidecar::outbound(view, &mut built);
                    sidecar::inbound(view, &mut built);
                }
                ProxyType::Router => {
                    // A router has no original destination to pass unknown traffic to.
                    let c = cluster::black_hole();
                    built.clusters.insert(c.name.clone(), c);
                    gateway::listeners_and_routes(view, &mut built);
                }
            },
            Generator::Grpc => grpc::listeners_and_routes(view, &mut built),
        }
        self.listeners = Some(ListenerOutput {
            inputs,
            listeners: packed(built.listeners.iter()),
            routes: packed(built.routes.iter()),
            route_names: built.route_names,
            clusters: built
                .clusters
                .iter()
                .map(|(name, c)| {
                    let mut encoded = prost::Message::encode_to_vec(c);
                    if let Some(fields) = built.cluster_fields.get(name) {
                        encoded.extend_from_slice(fields);
                    }
                    telemetry::exchange_upstream(view.proxy.build, name, &mut encoded);
                    (name.clone(), Resource::from_encoded::<Cluster>(encoded))
                })
                .collect(),
            endpoints: packed(built.endpoints.iter()).into_iter().collect(),
        });
    }

    /// Rebuilds the route configurations a sidecar's listeners ask for whose inputs changed.
    fn update_routes(
        &mut self,
        view: &View<'_>,
        global: u64,
        shapes: &mut Shapes,
        counts: &mut Rebuilt,
    ) {
        let Some(listeners) = &self.listeners else {
            return;
        };
        let names = &listeners.route_names;
        let mut on_port = PortIndex::default();
        for name in names {
            let inputs = route_inputs(view, name, global, shapes, &mut on_port);
            if self.routes.get(name) == Some(&inputs) {
                continue;
            }
            counts.routes += 1;
            match sidecar::route_config(view, name, &mut self.reuse, shapes, counts) {
                Some(rc) => self.route_map.insert(name.clone(), rc),
                None => self.route_map.remove(name),
            };
            self.routes.insert(name.clone(), inputs);
        }
        self.routes.retain(|name, _| names.contains(name));
        if counts.routes > 0 {
            self.reuse.retain(view, names);
        }
        let stale: Vec<String> = self
            .route_map
            .keys()
            .filter(|name| !names.contains(*name))
            .cloned()
            .collect();
        for name in stale {
            self.route_map.remove(&name);
        }
    }

    /// The resources as they stand: O(1) but for the clusters and load assignments built with
    /// the listeners, which are laid over the services'.
    fn generated(&self) -> Generated {
        let mut out = Generated {
            clusters: self.host_clusters.clone(),
            endpoints: self.host_endpoints.clone(),
            listeners: ResourceMap::new(),
            routes: self.route_map.clone(),
            extension_configs: ResourceMap::new(),
            virtual_hosts: ResourceMap::new(),
        };
        if let Some(l) = &self.listeners {
            out.listeners = l.listeners.clone();
            out.routes
                .extend(l.routes.iter().map(|(k, v)| (k.clone(), Arc::clone(v))));
            lay(&mut out.clusters, &l.clusters);
            lay(&mut out.endpoints, &l.endpoints);
        }
        out
    }
}

/// Puts `entries` into `map`, over what it holds under their names.
fn lay(map: &mut ResourceMap, entries: &[(String, Arc<Resource>)]) {
    for (name, r) in entries {
        map.insert(name.clone(), Arc::clone(r));
    }
}

/// Takes out of `map` what [`lay`] put there from `entries`, unless it was replaced since.
fn unlay(map: &mut ResourceMap, entries: &[(String, Arc<Resource>)]) {
    for (name, r) in entries {
        if map.get(name).is_some_and(|x| Arc::ptr_eq(x, r)) {
            map.remove(name);
        }
    }
}

/// A fingerprint of what `feed` hashes: what the view and the memos of the generators' inputs
/// are keyed on.
fn fingerprint(feed: impl FnOnce(&mut std::collections::hash_map::DefaultHasher)) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    feed(&mut hasher);
    std::hash::Hasher::finish(&hasher)
}

#[cfg(test)]
mod cluster_tests;
#[cfg(test)]
mod envoy_rules;
#[cfg(test)]
mod inbound_tests;
#[cfg(test)]
mod incremental_tests;
#[cfg(test)]
mod reuse_tests;
#[cfg(test)]
mod tests;
