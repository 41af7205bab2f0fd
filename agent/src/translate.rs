//! Translation: from the proxy and the raw Istio configuration in its scope to the xDS resources
//! istiod would send it, with istiod's names (see the project's naming notes).

pub mod authn;
mod cluster;
mod endpoint;
mod filters;
pub(crate) mod gateway;
mod grpc;
mod hash;
mod metadata;
pub mod names;
pub mod registry;
mod route;
pub mod sds;
mod sidecar;

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;

/// Generated resources of one proxy, by type and name (an owned copy, for tools and tests).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resources {
    pub clusters: BTreeMap<String, Cluster>,
    pub endpoints: BTreeMap<String, ClusterLoadAssignment>,
    pub listeners: BTreeMap<String, Listener>,
    pub routes: BTreeMap<String, RouteConfiguration>,
}

/// One generation of a proxy's resources as the translator keeps them: encoded as served
/// (packed body and version), and shared, so that a resource it did not rebuild is the same
/// allocation as in the previous generation. Only what was rebuilt is encoded again, and the
/// typed messages live only while they are built: in a pod, the encoded form is a fraction of
/// the typed one (prost messages hold every optional field inline).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Generated {
    pub clusters: BTreeMap<String, Arc<Resource>>,
    pub endpoints: BTreeMap<String, Arc<Resource>>,
    pub listeners: BTreeMap<String, Arc<Resource>>,
    pub routes: BTreeMap<String, Arc<Resource>>,
}

impl Generated {
    /// The typed resources, decoded (for tools and tests).
    pub fn to_resources(&self) -> Resources {
        fn typed<M: prost::Message + Default>(
            map: &BTreeMap<String, Arc<Resource>>,
        ) -> BTreeMap<String, M> {
            map.iter()
                .map(|(name, r)| {
                    let message = M::decode(r.body.value.as_slice())
                        .expect("the translator decodes what it encoded");
                    (name.clone(), message)
                })
                .collect()
        }
        Resources {
            clusters: typed(&self.clusters),
            endpoints: typed(&self.endpoints),
            listeners: typed(&self.listeners),
            routes: typed(&self.routes),
        }
    }

    /// Packs typed resources.
    pub fn from_resources(resources: &Resources) -> Generated {
        Generated {
            clusters: packed(resources.clusters.iter()),
            endpoints: packed(resources.endpoints.iter()),
            listeners: packed(resources.listeners.iter()),
            routes: packed(resources.routes.iter()),
        }
    }
}

/// What the listener and route builders fill.
#[derive(Debug, Default)]
pub(crate) struct Built {
    pub clusters: BTreeMap<String, Cluster>,
    /// Load assignments of clusters built here (a router's SNI-DNAT clusters).
    pub endpoints: BTreeMap<String, ClusterLoadAssignment>,
    pub listeners: BTreeMap<String, Listener>,
    pub routes: BTreeMap<String, RouteConfiguration>,
}

/// Each value of a map behind an `Arc`.
fn packed<'a, M: prost::Message + prost::Name + 'a>(
    messages: impl Iterator<Item = (&'a String, &'a M)>,
) -> BTreeMap<String, Arc<Resource>> {
    messages
        .map(|(name, message)| (name.clone(), Resource::pack(message)))
        .collect()
}

use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::Node;
use pasa_proto::Kind;
use pasa_proto::node::ProxyType;

use crate::ads::Resource;
use crate::cache::Cache;
use crate::identity::{Identity, Locality};
use crate::mesh::MeshSettings;
use crate::scope::{DestinationRules, SidecarScope};
use pasa_proto::istio::virtual_service::VirtualService;
use registry::{Config, Registry, Service};
use route::Destinations;

/// The proxy resources are generated for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proxy {
    pub kind: ProxyType,
    /// The workload's addresses (the node ID's IP first).
    pub ips: Vec<IpAddr>,
    /// The namespace the pod runs in.
    pub namespace: String,
    /// The namespace that decides config visibility (`exportTo`, Sidecar lookup); the pod's
    /// namespace for sidecars.
    pub config_namespace: String,
    pub labels: BTreeMap<String, String>,
    /// The proxy's DNS domain (`<namespace>.svc.cluster.local`), for short names in virtual host
    /// domains.
    pub dns_domain: String,
    pub cluster_id: String,
    pub network: String,
    pub locality: Locality,
    pub mesh: MeshSettings,
    pub flags: Flags,
    /// The proxy answers its application's DNS queries (`ISTIO_META_DNS_CAPTURE`).
    pub dns_capture: bool,
    /// ... and wants addresses allocated for ServiceEntry hosts without one
    /// (`ISTIO_META_DNS_AUTO_ALLOCATE`).
    pub dns_auto_allocate: bool,
}

/// Control-plane feature flags that change what is generated; istiod's defaults by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flags {
    /// Terminate the TLS a Sidecar ingress listener declares (`ENABLE_TLS_ON_SIDECAR_INGRESS`);
    /// off, its `tls` is ignored.
    pub tls_on_sidecar_ingress: bool,
    /// ServiceEntry addresses come from the allocation controller (`ENABLE_IP_AUTOALLOCATE`);
    /// off, the older allocator derives them from host names (see
    /// [`registry::legacy_auto_addresses`]).
    pub ip_autoallocate: bool,
}

impl Default for Flags {
    fn default() -> Self {
        Flags {
            tls_on_sidecar_ingress: false,
            ip_autoallocate: true,
        }
    }
}

impl Proxy {
    /// The proxy an agent started with `identity` serves.
    pub fn from_identity(identity: &Identity, mesh: MeshSettings) -> Proxy {
        Proxy {
            kind: identity.node.proxy_type,
            ips: vec![identity.node.ip],
            namespace: identity.namespace.clone(),
            config_namespace: identity.namespace.clone(),
            labels: identity.labels.clone(),
            dns_domain: format!("{}.svc.{}", identity.namespace, mesh.domain_suffix),
            cluster_id: identity.cluster_id.clone(),
            network: identity.network.clone(),
            locality: identity.locality.clone(),
            mesh,
            flags: Flags::default(),
            dns_capture: false,
            dns_auto_allocate: false,
        }
    }
}

impl Proxy {
    /// A host as written in an Istio resource of `namespace`, resolved as istiod resolves it.
    pub fn resolve_host(&self, host: &str, namespace: &str) -> String {
        pasa_proto::host::resolve_short_name(host, namespace, &self.mesh.config_domain_suffix)
    }
}

/// Which resources a client gets, chosen per ADS connection from the client's node metadata, as
/// istiod chooses: `GENERATOR: grpc` gets proxyless gRPC resources, anything else Envoy's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Generator {
    /// Envoy sidecar or router: real listeners, filter chains, RDS by port.
    #[default]
    Envoy,
    /// A proxyless gRPC client: API listeners named `host:port`.
    Grpc,
}

impl Generator {
    /// The generator a client asks for in its node metadata.
    pub fn of_node(node: &Node) -> Generator {
        use envoy_types::pb::google::protobuf::value::Kind;
        let asked = node
            .metadata
            .as_ref()
            .and_then(|m| m.fields.get("GENERATOR"))
            .and_then(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.as_str()),
                _ => None,
            });
        match asked {
            Some("grpc") => Generator::Grpc,
            _ => Generator::Envoy,
        }
    }
}

/// What a proxy sees, worked out once per update and shared by the generators.
pub(crate) struct View<'a> {
    proxy: &'a Proxy,
    registry: &'a Registry,
    scope: SidecarScope,
    /// Visible services by host.
    services: BTreeMap<String, Arc<Service>>,
    /// Visible VirtualServices for sidecars, oldest first.
    virtual_services: Vec<Arc<Config<VirtualService>>>,
    /// Visible DestinationRules, by host.
    destination_rules: DestinationRules,
    /// The VirtualService for each exact host (the oldest that names it).
    vs_by_host: BTreeMap<String, usize>,
    /// Wildcard hosts of VirtualServices, with the VirtualService's position.
    vs_wildcards: Vec<(String, usize)>,
    /// Kubernetes `ExternalName` services by the host they alias.
    aliases: BTreeMap<String, Vec<String>>,
    /// Addresses allocated to ServiceEntry hosts without one, by namespace and host, when this
    /// proxy uses them.
    auto_addresses: BTreeMap<(String, String), String>,
}

impl<'a> View<'a> {
    fn new(proxy: &'a Proxy, registry: &'a Registry) -> View<'a> {
        let scope = SidecarScope::of(proxy, registry);
        let services: BTreeMap<String, Arc<Service>> = scope
            .services(registry)
            .into_iter()
            .map(|s| (s.hostname.clone(), s))
            .collect();
        let virtual_services = scope.virtual_services(registry);
        let mut vs_by_host = BTreeMap::new();
        let mut vs_wildcards = Vec::new();
        for (i, vs) in virtual_services.iter().enumerate() {
            for h in &vs.spec.hosts {
                let host = proxy.resolve_host(h, &vs.meta.namespace);
                if host.starts_with('*') {
                    vs_wildcards.push((host, i));
                } else {
                    vs_by_host.entry(host).or_insert(i);
                }
            }
        }
        // The most specific wildcard first (longest), then the oldest.
        vs_wildcards.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let destination_rules = scope.destination_rules(proxy, registry);
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
        View {
            proxy,
            registry,
            destination_rules,
            scope,
            services,
            virtual_services,
            vs_by_host,
            vs_wildcards,
            aliases,
            auto_addresses,
        }
    }

    /// The port a route destination goes to: the one it names, else the service's only port,
    /// else the listener's.
    fn destination_port(
        &self,
        destination: &pasa_proto::istio::virtual_service::Destination,
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
        let mut route = route::default_route(&names::outbound_cluster(port, "", &service.hostname));
        let destination = pasa_proto::istio::virtual_service::Destination {
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
    /// wildcard covering it.
    fn virtual_service_for(&self, host: &str) -> Option<&Arc<Config<VirtualService>>> {
        let i = self.vs_by_host.get(host).copied().or_else(|| {
            self.vs_wildcards
                .iter()
                .find(|(w, _)| pasa_proto::host::matches(w, host))
                .map(|(_, i)| *i)
        })?;
        self.virtual_services.get(i)
    }
}

impl Destinations for View<'_> {
    fn cluster(
        &self,
        destination: &pasa_proto::istio::virtual_service::Destination,
        namespace: &str,
        port: u32,
    ) -> String {
        let host = self.proxy.resolve_host(&destination.host, namespace);
        let port = self.destination_port(destination, &host, port);
        names::outbound_cluster(port, &destination.subset, &host)
    }

    fn hash_policy(
        &self,
        destinations: &[&pasa_proto::istio::virtual_service::Destination],
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
    inputs: u64,
    /// Cluster name → cluster.
    clusters: Vec<(String, Arc<Resource>)>,
    /// Cluster name → load assignment.
    assignments: Vec<(String, Arc<Resource>)>,
}

/// Listeners and route configurations, and what they were built from.
#[derive(Debug)]
struct ListenerOutput {
    inputs: u64,
    listeners: BTreeMap<String, Arc<Resource>>,
    routes: BTreeMap<String, Arc<Resource>>,
    clusters: BTreeMap<String, Arc<Resource>>,
    endpoints: BTreeMap<String, Arc<Resource>>,
}

/// Generates resources for one proxy and keeps them current as the cache changes.
///
/// Work is reused at two grains: the clusters and load assignments of a service are rebuilt only
/// when the service (its resource, or the WorkloadEntries it selects) or the DestinationRule that
/// applies to it changed; a sidecar's listeners and route configurations only when what they read
/// changed: a VirtualService, Sidecar or other config, or a service's shape (hosts, addresses,
/// ports, resolution, visibility) — not its endpoints, except the proxy's own (inbound) and those
/// of a passthrough service without an address (one listener each). A DestinationRule change
/// therefore rebuilds the clusters of its host and nothing else; an endpoint change, the
/// service's clusters and load assignments. (A router's listeners also follow DestinationRules
/// and endpoints, through its SNI-DNAT clusters, and are rebuilt on any change.)
#[derive(Debug)]
pub struct Translator {
    proxy: Proxy,
    registry: Registry,
    hosts: HashMap<(Generator, String), HostOutput>,
    listeners: HashMap<Generator, ListenerOutput>,
    /// Services whose clusters were rebuilt by the last update (for tests and metrics).
    rebuilt: usize,
    /// Whether the last update rebuilt the listeners and route configurations.
    listeners_rebuilt: bool,
    /// The store subscription the last update's view of the config calls for.
    subscription: pasa_proto::store::v1::Subscription,
}

impl Translator {
    pub fn new(proxy: Proxy) -> Self {
        Self {
            proxy,
            registry: Registry::default(),
            hosts: HashMap::new(),
            listeners: HashMap::new(),
            rebuilt: 0,
            listeners_rebuilt: false,
            subscription: Default::default(),
        }
    }

    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    /// The store subscription this proxy needs, given the config the last
    /// [`Translator::generate`] read (see [`crate::scope`]); before any, none.
    pub fn subscription(&self) -> pasa_proto::store::v1::Subscription {
        self.subscription.clone()
    }

    /// How many services had their clusters rebuilt by the last [`Translator::update`].
    pub fn rebuilt_services(&self) -> usize {
        self.rebuilt
    }

    /// Whether the last [`Translator::update`] rebuilt the listeners and route configurations.
    pub fn rebuilt_listeners(&self) -> bool {
        self.listeners_rebuilt
    }

    /// Brings the resources for `generator` up to date with `cache` and returns a copy of them.
    pub fn update(&mut self, cache: &Cache, generator: Generator) -> Resources {
        self.generate(cache, generator).to_resources()
    }

    /// Brings the resources for `generator` up to date with `cache` and returns them, shared
    /// with the translator's memory of what it built.
    pub fn generate(&mut self, cache: &Cache, generator: Generator) -> Generated {
        let changed = self.registry.update(cache, &self.proxy.mesh.domain_suffix);
        let _ = changed;
        let view = View::new(&self.proxy, &self.registry);
        self.subscription = crate::scope::subscription_in(
            &self.proxy,
            &self.registry,
            &view.scope,
            &view.virtual_services,
            view.services.values(),
        );
        let mut out = Generated::default();
        self.rebuilt = 0;
        let mut live = std::collections::HashSet::new();
        for service in view.services.values() {
            let dr = view.destination_rules.for_service(service);
            let inputs = fingerprint(|h| {
                service.hostname.hash(h);
                service.source.hash(h);
                service.revision.hash(h);
                service.created.hash(h);
                // Ports merged in from other declarations of the host.
                for p in &service.ports {
                    (p.number, &p.name, format!("{:?}", p.protocol)).hash(h);
                }
                if let Some(dr) = &dr {
                    dr.meta.namespace.hash(h);
                    dr.meta.name.hash(h);
                    dr.meta.revision.hash(h);
                }
            });
            let key = (generator, service.hostname.clone());
            live.insert(key.clone());
            let fresh = self.hosts.get(&key).is_some_and(|o| o.inputs == inputs);
            if !fresh {
                self.rebuilt += 1;
                let mut built = Vec::new();
                cluster::service_clusters(
                    service,
                    dr.as_deref(),
                    generator,
                    self.proxy.kind,
                    &mut built,
                );
                let mut output = HostOutput {
                    inputs,
                    clusters: Vec::with_capacity(built.len()),
                    assignments: Vec::with_capacity(built.len()),
                };
                for (cluster, assignment) in built {
                    output
                        .clusters
                        .push((cluster.name.clone(), Resource::pack(&cluster)));
                    if let Some(a) = assignment {
                        output
                            .assignments
                            .push((a.0.cluster_name.clone(), Resource::pack(&a.0)));
                    }
                }
                self.hosts.insert(key.clone(), output);
            }
            if let Some(o) = self.hosts.get(&key) {
                for (name, c) in &o.clusters {
                    out.clusters.insert(name.clone(), Arc::clone(c));
                }
                for (name, a) in &o.assignments {
                    out.endpoints.insert(name.clone(), Arc::clone(a));
                }
            }
        }
        self.hosts
            .retain(|k, _| k.0 != generator || live.contains(k));

        // A router's SNI-DNAT clusters follow DestinationRule subsets and endpoints, so its
        // listeners are rebuilt on any change.
        let router = self.proxy.kind == ProxyType::Router;
        let ips: Vec<String> = self.proxy.ips.iter().map(IpAddr::to_string).collect();
        let inputs = fingerprint(|h| {
            for (key, resource) in cache.iter() {
                let read_whole = router
                    || (key.kind != "DestinationRule"
                        && key.kind != Kind::ServiceEndpoints.as_str());
                if read_whole {
                    key.hash(h);
                    resource.mod_revision.hash(h);
                }
            }
            if !router {
                for service in self.registry.services().values().flatten() {
                    if service.source.kind == Kind::ServiceEndpoints.as_str() {
                        hash_listener_inputs(service, &ips, h);
                    }
                }
            }
        });
        let fresh = self
            .listeners
            .get(&generator)
            .is_some_and(|o| o.inputs == inputs);
        self.listeners_rebuilt = !fresh;
        if !fresh {
            let mut built = Built::default();
            match generator {
                Generator::Envoy => {
                    sidecar::special_clusters(view.scope.outbound_policy, &mut built);
                    match self.proxy.kind {
                        ProxyType::Sidecar => {
                            sidecar::outbound(&view, &mut built);
                            sidecar::inbound(&view, &mut built);
                        }
                        ProxyType::Router => gateway::listeners_and_routes(&view, &mut built),
                    }
                }
                Generator::Grpc => grpc::listeners_and_routes(&view, &mut built),
            }
            self.listeners.insert(
                generator,
                ListenerOutput {
                    inputs,
                    listeners: packed(built.listeners.iter()),
                    routes: packed(built.routes.iter()),
                    clusters: packed(built.clusters.iter()),
                    endpoints: packed(built.endpoints.iter()),
                },
            );
        }
        if let Some(o) = self.listeners.get(&generator) {
            out.listeners = o.listeners.clone();
            out.routes = o.routes.clone();
            for (name, c) in &o.clusters {
                out.clusters.insert(name.clone(), Arc::clone(c));
            }
            for (name, a) in &o.endpoints {
                out.endpoints.insert(name.clone(), Arc::clone(a));
            }
        }
        out
    }
}

/// What a sidecar's listener and route builders read of a service: all but its endpoints, and
/// of those only the proxy's own (its inbound listeners) and, for a passthrough service without
/// an address, every endpoint's address and ports (a listener each).
fn hash_listener_inputs(service: &Service, proxy_ips: &[String], h: &mut impl Hasher) {
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
        created,
        revision: _,
        source,
    } = service;
    (hostname, namespace, addresses, export_to, external_name).hash(h);
    (external, kubernetes, created, source).hash(h);
    format!("{ports:?}{resolution:?}").hash(h);
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
mod tests;
