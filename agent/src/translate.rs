//! Translation: from the proxy and the raw Istio configuration in its scope to the xDS resources
//! istiod would send it, with istiod's names (see the project's naming notes).

pub mod authz;
mod builders;
mod cluster;
mod endpoint;
mod envoy_filter;
pub mod extensions;
mod filters;
pub(crate) mod gateway;
mod grpc;
pub use grpc::{SERVER_LISTENER_PREFIX, grpc_listener};
mod hash;
mod hcm;
mod metadata;
pub mod names;
mod patched;
pub mod providers;
mod route;
pub mod sds;
mod session;
mod sidecar;
mod telemetry;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Weak};

use rustc_hash::{FxHashMap, FxHashSet};

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

use std::net::IpAddr;

use pasa_istio::node::ProxyType;
use pasa_proto::Kind;

use crate::cache::Cache;
use crate::model::proxy::{Generator, Proxy};
use crate::model::registry::{self, Config, Registry, Service};
use crate::model::scope::{DestinationRules, SidecarScope};
use crate::resource::{Generated, Resource, ResourceMap, Resources, packed};
use pasa_istio::destination_rule::DestinationRule;
use pasa_istio::virtual_service::VirtualService;
use route::Destinations;

/// What a proxy sees, worked out once per update and shared by the generators.
pub(crate) struct View<'a> {
    proxy: &'a Proxy,
    registry: &'a Registry,
    scope: SidecarScope,
    /// Visible services by host.
    services: VisibleServices,
    /// Visible VirtualServices for sidecars, oldest first.
    virtual_services: Vec<Arc<Config<VirtualService>>>,
    /// The hosts of each of `virtual_services`, resolved (as written, and in lower case).
    vs_hosts: Vec<Arc<VsHosts>>,
    /// Visible DestinationRules, by host (kept across updates while no DestinationRule and
    /// no part of the scope it depends on changed).
    destination_rules: Arc<DestinationRules>,
    /// Where the index differs from the last update's, if it does.
    rules_changed: Option<RulesChanged>,
    /// The VirtualService for each exact host (the oldest that names it).
    vs_by_host: FxHashMap<String, usize>,
    /// Wildcard hosts of VirtualServices, with the VirtualService's position.
    vs_wildcards: Vec<(String, usize)>,
    /// Kubernetes `ExternalName` services by the host they alias.
    aliases: BTreeMap<String, Vec<String>>,
    /// Addresses allocated to ServiceEntry hosts without one, by namespace and host, when this
    /// proxy uses them.
    auto_addresses: BTreeMap<(String, String), String>,
    /// Connection manager settings per listener class: inbound, outbound, gateway.
    hcm: [hcm::Options; 3],
    /// What clusters take from the proxy and the mesh config.
    cluster_settings: cluster::ClusterSettings,
    /// The mesh config's `defaultHttpRetryPolicy` and `defaultInboundHttpRetryPolicy`.
    retry_defaults: RetryDefaults,
    /// What every route reads of the proxy's settings and the mesh config (outbound attempt
    /// counts and X-Forwarded-Host, the default retry policies), fingerprinted: routes built
    /// under other settings are not reused.
    route_settings: u64,
}

/// The mesh config's default retry policies (a route's own wins).
#[derive(Debug, Default, Hash)]
struct RetryDefaults {
    outbound: Option<pasa_istio::virtual_service::HttpRetry>,
    inbound: Option<pasa_istio::virtual_service::HttpRetry>,
}

impl RetryDefaults {
    fn of(mesh: Option<&pasa_istio::mesh_config::MeshConfig>) -> RetryDefaults {
        let read = |field: &str| {
            let value = mesh.and_then(|m| m.other.get(field))?;
            match serde_json::from_value(value.clone()) {
                Ok(policy) => Some(policy),
                Err(e) => {
                    tracing::warn!(field, error = %e, "mesh config retry policy not applied");
                    None
                }
            }
        };
        RetryDefaults {
            outbound: read("defaultHttpRetryPolicy"),
            inbound: read("defaultInboundHttpRetryPolicy"),
        }
    }
}

/// The services a proxy sees: in host order, and by host.
struct VisibleServices {
    sorted: Vec<Arc<Service>>,
    by_host: FxHashMap<String, usize>,
}

impl VisibleServices {
    /// From services in host order, one per host (as the registry holds them).
    fn new(sorted: Vec<Arc<Service>>) -> Self {
        let mut by_host = FxHashMap::with_capacity_and_hasher(sorted.len(), Default::default());
        for (i, s) in sorted.iter().enumerate() {
            by_host.insert(s.hostname.clone(), i);
        }
        debug_assert!(sorted.is_sorted_by(|a, b| a.hostname < b.hostname));
        VisibleServices { sorted, by_host }
    }

    fn get(&self, host: &str) -> Option<&Arc<Service>> {
        self.by_host.get(host).map(|&i| &self.sorted[i])
    }

    fn contains_key(&self, host: &str) -> bool {
        self.by_host.contains_key(host)
    }

    fn len(&self) -> usize {
        self.sorted.len()
    }

    /// In host order.
    fn values(&self) -> std::slice::Iter<'_, Arc<Service>> {
        self.sorted.iter()
    }

    /// In host order, with their hosts.
    fn iter(&self) -> impl Iterator<Item = (&String, &Arc<Service>)> {
        self.sorted.iter().map(|s| (&s.hostname, s))
    }

    /// The position of `host`'s service in host order.
    fn position(&self, host: &str) -> Option<usize> {
        self.by_host.get(host).copied()
    }

    /// The service at `position` in host order.
    fn at(&self, position: usize) -> &Arc<Service> {
        &self.sorted[position]
    }
}

/// A VirtualService's hosts, resolved as istiod resolves them.
#[derive(Debug)]
struct VsHosts {
    resolved: Vec<String>,
    /// The same, in lower case (as virtual host domains are compared).
    lower: Vec<String>,
    /// A fingerprint of `resolved`.
    fingerprint: u64,
}

impl VsHosts {
    fn of(proxy: &Proxy, vs: &Config<VirtualService>) -> Self {
        let resolved: Vec<String> = vs
            .spec
            .hosts
            .iter()
            .map(|h| proxy.resolve_host(h, &vs.meta.namespace))
            .collect();
        let lower = resolved.iter().map(|h| h.to_lowercase()).collect();
        let fingerprint = fingerprint(|h| resolved.hash(h));
        VsHosts {
            resolved,
            lower,
            fingerprint,
        }
    }
}

/// What a view keeps from one update to the next (its proxy is fixed for a translator).
#[derive(Debug, Default)]
struct ViewMemo {
    destination_rules: DestinationRuleMemo,
    /// The resolved hosts of each visible VirtualService, by its address (each entry holds the
    /// VirtualService, so the address is not reused while it is here).
    virtual_service_hosts: FxHashMap<usize, (Arc<Config<VirtualService>>, Arc<VsHosts>)>,
}

/// The DestinationRule index of the last update, and what it was built from. The index reads
/// only the registry's DestinationRules and the proxy's namespaces (fixed for a translator).
#[derive(Debug, Default)]
struct DestinationRuleMemo {
    /// Every DestinationRule of the registry then, in its order (held, so that none of their
    /// allocations can be reused by a new one that would compare equal by address), with its
    /// host as the proxy resolves it.
    rules: Vec<(Arc<Config<DestinationRule>>, String)>,
    index: Option<Arc<DestinationRules>>,
}

/// The hosts whose DestinationRule may differ from the last update's.
#[derive(Debug)]
enum RulesChanged {
    /// Only these (exact hosts).
    Hosts(FxHashSet<String>),
    /// Any: a wildcard rule came or went, or there was no index before.
    All,
}

impl DestinationRuleMemo {
    /// The index for `scope`: the last one while the registry holds the same DestinationRules
    /// (the same `Arc`s, in the same order), else a new one, with the hosts the difference
    /// touches.
    fn index(
        &mut self,
        proxy: &Proxy,
        registry: &Registry,
        scope: &SidecarScope,
    ) -> (Arc<DestinationRules>, Option<RulesChanged>) {
        let mut now = registry.destination_rules();
        let same = self
            .rules
            .iter()
            .all(|(then, _)| now.next().is_some_and(|r| Arc::ptr_eq(r, then)))
            && now.next().is_none();
        if let (Some(index), true) = (&self.index, same) {
            return (Arc::clone(index), None);
        }
        let mut then: FxHashMap<usize, (Arc<Config<DestinationRule>>, String)> = self
            .rules
            .drain(..)
            .map(|(dr, host)| (Arc::as_ptr(&dr) as usize, (dr, host)))
            .collect();
        let mut changed = FxHashSet::default();
        let mut wildcard = false;
        let mut touched = |host: &str| {
            wildcard |= host.starts_with('*');
            changed.insert(host.to_string());
        };
        for dr in registry.destination_rules() {
            let host = match then.remove(&(Arc::as_ptr(dr) as usize)) {
                Some((_, host)) => host,
                None => {
                    let host = proxy.resolve_host(&dr.spec.host, &dr.meta.namespace);
                    touched(&host);
                    host
                }
            };
            self.rules.push((Arc::clone(dr), host));
        }
        // The rules gone.
        for (_, host) in then.values() {
            touched(host);
        }
        let index = Arc::new(scope.destination_rules(
            self.rules.iter().map(|(dr, host)| (dr, host.as_str())),
            &proxy.labels,
        ));
        let first = self.index.is_none();
        self.index = Some(Arc::clone(&index));
        let changed = if first || wildcard {
            RulesChanged::All
        } else {
            RulesChanged::Hosts(changed)
        };
        (index, Some(changed))
    }
}

/// A port of a service that one of the proxy's addresses serves.
struct LocalInstance<'v> {
    service: &'v Service,
    service_port: u32,
    /// Where the workload receives it.
    target: u32,
    protocol: Option<pasa_istio::common::Protocol>,
}

impl View<'_> {
    /// The ports of the services the proxy's workload serves (oldest service first; a
    /// Kubernetes Service only of its own namespace).
    fn local_instances(&self) -> Vec<LocalInstance<'_>> {
        let ips: Vec<String> = self.proxy.ips.iter().map(IpAddr::to_string).collect();
        let mut services: Vec<&Service> = self
            .registry
            .services()
            .values()
            .flatten()
            .map(|s| s.as_ref())
            .collect();
        services.sort_by(|a, b| (a.created, &a.hostname).cmp(&(b.created, &b.hostname)));
        let mut out = Vec::new();
        for service in services {
            if service.namespace != self.proxy.namespace && service.kubernetes {
                continue;
            }
            for instance in service
                .endpoints
                .iter()
                .filter(|e| ips.contains(&e.address))
            {
                for port in &service.ports {
                    if let Some(target) = instance.ports.get(&port.number).copied() {
                        out.push(LocalInstance {
                            service,
                            service_port: port.number,
                            target,
                            protocol: port.protocol,
                        });
                    }
                }
            }
        }
        out
    }
}

impl<'a> View<'a> {
    fn new(proxy: &'a Proxy, registry: &'a Registry, memo: &mut ViewMemo) -> View<'a> {
        let scope = SidecarScope::of(proxy, registry);
        let services = VisibleServices::new(scope.services(registry));
        let virtual_services = scope.virtual_services(registry);
        let mut vs_by_host = FxHashMap::default();
        let mut vs_wildcards = Vec::new();
        let mut vs_hosts = Vec::with_capacity(virtual_services.len());
        let mut known = std::mem::take(&mut memo.virtual_service_hosts);
        for (i, vs) in virtual_services.iter().enumerate() {
            let id = Arc::as_ptr(vs) as usize;
            let hosts = match known.remove(&id) {
                Some((_, hosts)) => hosts,
                None => Arc::new(VsHosts::of(proxy, vs)),
            };
            for host in &hosts.resolved {
                if host.starts_with('*') {
                    vs_wildcards.push((host.clone(), i));
                } else {
                    vs_by_host.entry(host.clone()).or_insert(i);
                }
            }
            memo.virtual_service_hosts
                .insert(id, (Arc::clone(vs), Arc::clone(&hosts)));
            vs_hosts.push(hosts);
        }
        // The most specific wildcard first (longest), then the oldest.
        vs_wildcards.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let (destination_rules, rules_changed) =
            memo.destination_rules.index(proxy, registry, &scope);
        let mut aliases: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for s in services.values() {
            if let Some(target) = s.external_name.as_ref().filter(|_| s.kubernetes) {
                aliases
                    .entry(target.clone())
                    .or_default()
                    .push(s.hostname.clone());
            }
        }
        let uses_auto =
            proxy.dns_capture && proxy.dns_auto_allocate && !proxy.flags.ip_autoallocate;
        let auto_addresses = if uses_auto {
            registry::legacy_auto_addresses(registry)
        } else {
            BTreeMap::new()
        };
        let mesh = registry.mesh_config(&proxy.mesh.root_namespace);
        let settings = proxy.settings(mesh);
        let hcm = [
            hcm::Class::SidecarInbound,
            hcm::Class::SidecarOutbound,
            hcm::Class::Gateway,
        ]
        .map(|class| {
            hcm::Options::of(class, &settings, mesh)
                .with_sessions(proxy.flags.persistent_session_filter)
        });
        let retry_defaults = RetryDefaults::of(mesh);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&hcm, &retry_defaults).hash(&mut h);
        let preserve_case = hcm[0].preserve_case;
        View {
            hcm,
            cluster_settings: cluster::ClusterSettings::of(
                &proxy.ips,
                &proxy.cluster_id,
                mesh,
                crate::model::authn::PeerModes::of(registry, &proxy.mesh.root_namespace),
                preserve_case,
            ),
            retry_defaults,
            route_settings: h.finish(),
            proxy,
            registry,
            destination_rules,
            rules_changed,
            scope,
            services,
            virtual_services,
            vs_hosts,
            vs_by_host,
            vs_wildcards,
            aliases,
            auto_addresses,
        }
    }

    /// How long listener filters may wait for the first bytes to detect a protocol (the mesh
    /// config's `protocolDetectionTimeout`; 0, the default, waits as long as it takes).
    fn protocol_detection_timeout(&self) -> envoy_types::pb::google::protobuf::Duration {
        builders::nanos(
            self.registry
                .mesh_config(&self.proxy.mesh.root_namespace)
                .and_then(|m| m.positive_duration_nanos("protocolDetectionTimeout"))
                .unwrap_or(0),
        )
    }

    /// The connection manager settings of listeners of `class`.
    fn hcm(&self, class: hcm::Class) -> &hcm::Options {
        &self.hcm[match class {
            hcm::Class::SidecarInbound => 0,
            hcm::Class::SidecarOutbound => 1,
            hcm::Class::Gateway => 2,
        }]
    }

    /// The port a route destination goes to: the one it names, else the service's only port,
    /// else the listener's.
    fn destination_port(
        &self,
        destination: &pasa_istio::virtual_service::Destination,
        host: &str,
        listener_port: u32,
    ) -> u32 {
        match destination.port.as_ref().map(|p| p.number) {
            Some(n) if n != 0 => n,
            _ => match self.services.get(host).map(|s| s.ports.as_slice()) {
                Some([only]) => only.number,
                _ => listener_port,
            },
        }
    }

    /// The route of a service without a VirtualService, with its DestinationRule's hash policy.
    fn default_route(
        &self,
        service: &Service,
        port: u32,
    ) -> envoy_types::pb::envoy::config::route::v3::Route {
        let mut route = route::default_outbound_route(
            &names::outbound_cluster(port, "", &service.hostname),
            &service.hostname,
            port,
            self.retry_defaults.outbound.as_ref(),
        );
        let destination = pasa_istio::virtual_service::Destination {
            host: service.hostname.clone(),
            ..Default::default()
        };
        if let Some(envoy_types::pb::envoy::config::route::v3::route::Action::Route(action)) =
            &mut route.action
        {
            action.hash_policy = self
                .hash_policy(&[&destination], &service.namespace, port)
                .into_iter()
                .collect();
        }
        route
    }

    /// The address allocated to `service` for this proxy, if it has none of its own.
    fn auto_address(&self, service: &Service) -> Option<&str> {
        if !service.addresses.is_empty() {
            return None;
        }
        self.auto_addresses
            .get(&(service.namespace.clone(), service.hostname.clone()))
            .map(String::as_str)
    }

    /// The hosts that alias `host` (Kubernetes `ExternalName` services naming it).
    fn aliases_of(&self, host: &str) -> Vec<&str> {
        self.aliases
            .get(host)
            .map(|list| list.iter().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// Whether `service` only aliases another (a Kubernetes `ExternalName` service): it gets no
    /// listener or virtual host of its own, its names go to the concrete service's.
    fn is_alias(&self, service: &Service) -> bool {
        service.kubernetes && service.external_name.is_some()
    }

    /// The VirtualService that routes `host`: one naming it exactly, else the most specific
    /// wildcard covering it, unless that one was made from Gateway API routes (whose wildcard
    /// hosts name no services: the host is then routed by none, as in istiod).
    fn virtual_service_for(&self, host: &str) -> Option<&Arc<Config<VirtualService>>> {
        if let Some(&i) = self.vs_by_host.get(host) {
            return self.virtual_services.get(i);
        }
        let (_, i) = self
            .vs_wildcards
            .iter()
            .find(|(w, _)| pasa_istio::host::matches(w, host))?;
        let vs = self.virtual_services.get(*i)?;
        (!pasa_istio::generated::has_gateway_semantics(&vs.meta.annotations)).then_some(vs)
    }
}

impl View<'_> {
    /// The persistent sessions of the service `host` names, when the proxy serves them with the
    /// stateful session filter.
    fn session_of(&self, host: &str) -> Option<&registry::PersistentSession> {
        if !self.proxy.flags.persistent_session_filter {
            return None;
        }
        self.services.get(host)?.persistent_session.as_ref()
    }
}

impl Destinations for View<'_> {
    fn persistent_session(
        &self,
        destination: &pasa_istio::virtual_service::Destination,
        namespace: &str,
    ) -> Option<&registry::PersistentSession> {
        self.session_of(&self.proxy.resolve_host(&destination.host, namespace))
    }

    fn append_x_forwarded_host(&self) -> bool {
        self.hcm(hcm::Class::SidecarOutbound).x_forwarded_host
    }

    fn default_retry(&self) -> Option<&pasa_istio::virtual_service::HttpRetry> {
        self.retry_defaults.outbound.as_ref()
    }

    fn cluster(
        &self,
        destination: &pasa_istio::virtual_service::Destination,
        namespace: &str,
        port: u32,
    ) -> String {
        let host = self.proxy.resolve_host(&destination.host, namespace);
        let port = self.destination_port(destination, &host, port);
        names::outbound_cluster(port, &destination.subset, &host)
    }

    fn hash_policy(
        &self,
        destinations: &[&pasa_istio::virtual_service::Destination],
        namespace: &str,
        port: u32,
    ) -> Option<envoy_types::pb::envoy::config::route::v3::route_action::HashPolicy> {
        let mut policies = destinations.iter().map(|d| {
            let host = self.proxy.resolve_host(&d.host, namespace);
            let service = self.services.get(&host)?;
            let port = self.destination_port(d, &host, port);
            let dr = self.destination_rules.for_service(service);
            let subset = (!d.subset.is_empty()).then_some(d.subset.as_str());
            hash::route_hash_policy(&cluster::Policy::of(
                dr.as_deref().map(|c| &c.spec),
                subset,
                port,
            ))
        });
        let first = policies.next()??;
        policies
            .all(|p| p.as_ref() == Some(&first))
            .then_some(first)
    }
}

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
            proxy,
            registry: Registry::default(),
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

    /// The store subscription this proxy needs, given the config the last
    /// [`Translator::generate`] read (see [`crate::subscription`]); before any, none.
    pub fn subscription(&self) -> pasa_proto::store::v1::Subscription {
        self.subscription.clone()
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

/// Fingerprints of the config read whole by the listeners and by the route configurations (the
/// parts not followed per service).
struct GlobalInputs {
    listeners: u64,
    routes: u64,
}

impl GlobalInputs {
    fn of(view: &View<'_>, cache: &Cache, generator: Generator, shapes: &mut Shapes) -> Self {
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

fn config_identity(meta: &registry::Meta, h: &mut impl Hasher) {
    (&meta.namespace, &meta.name, meta.created, meta.revision).hash(h);
}

/// The visible services of each port, and whether a wildcard service has it: worked out once per
/// update for the route configurations.
#[derive(Default)]
struct PortIndex {
    ports: FxHashMap<u32, (Vec<Arc<Service>>, bool)>,
}

/// What the route configuration `name` of a sidecar reads: the services of its port (their
/// shape, and the DestinationRule that decides their default route's hash policy), the aliases
/// (Kubernetes `ExternalName` services), the VirtualServices that may route the port, in order,
/// and their destinations' shape and DestinationRule.
fn route_inputs(
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
fn virtual_service_inputs(
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
fn follow_service(
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
struct Shapes {
    /// By the service's address; the entry holds the service, so the address is not reused
    /// while it is here.
    memo: FxHashMap<usize, (Arc<Service>, ShapeOf)>,
    /// What route configurations read of a DestinationRule (see [`hash::rule_fingerprint`]),
    /// likewise by address.
    rules: FxHashMap<usize, (Arc<Config<DestinationRule>>, u64)>,
    proxy_ips: Vec<String>,
    /// What also depends on the view's DestinationRule index.
    follow: FollowMemo,
}

/// What is worked out with the view's DestinationRule index, kept across updates except where
/// the index changed (see [`RulesChanged`]): each service's DestinationRule and how routes
/// follow it, and each visible VirtualService's inputs, by address.
#[derive(Debug, Default)]
struct FollowMemo {
    services: FxHashMap<usize, Followed>,
    virtual_services: FxHashMap<usize, VirtualServiceInputs>,
}

/// Of a service that [`Shapes::memo`] holds (so its address is not reused while this is here).
#[derive(Debug)]
struct Followed {
    /// The DestinationRule that applies to it.
    rule: Option<Arc<Config<DestinationRule>>>,
    /// Its shape and what hash policies read of its rule.
    route_fingerprint: u64,
}

#[derive(Debug)]
struct VirtualServiceInputs {
    /// Held, so that its address (the key) is not reused while the entry is here.
    _virtual_service: Arc<Config<VirtualService>>,
    /// Each destination host, resolved, with the visible service it named then (its allocation
    /// kept by the `Weak`, so that a later service cannot be taken for it).
    destinations: Vec<(String, Option<Weak<Service>>)>,
    inputs: u64,
}

impl VirtualServiceInputs {
    /// Whether its destinations still name the same services: then its inputs hold, as long as
    /// what the rules changed was forgotten first ([`Shapes::begin`]).
    fn is_current(&self, view: &View<'_>) -> bool {
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
struct ShapeOf {
    /// All but the endpoints.
    shape: u64,
    /// What a sidecar's listeners read (see [`hash_listener_inputs`]).
    listener: u64,
}

impl Shapes {
    fn begin(&mut self, proxy: &Proxy, view: &View<'_>) {
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

    fn of(&mut self, service: &Arc<Service>) -> ShapeOf {
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
    fn followed(&mut self, view: &View<'_>, service: &Arc<Service>) -> &Followed {
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

    fn rule(&mut self, dr: &Arc<Config<DestinationRule>>) -> u64 {
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
    fn end(&mut self, view: &View<'_>) {
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
fn hash_listener_inputs(
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

fn fingerprint(feed: impl FnOnce(&mut std::collections::hash_map::DefaultHasher)) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    feed(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod envoy_rules;
#[cfg(test)]
mod incremental_tests;
#[cfg(test)]
mod tests;
