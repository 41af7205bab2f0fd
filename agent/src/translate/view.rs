//! What a proxy sees ([`View`]), worked out once per update and shared by the generators: its
//! scope's services, VirtualServices (with their hosts resolved) and DestinationRules (the index
//! kept across updates while its inputs hold), the ports its workload serves, and the settings the
//! builders read of the proxy and the mesh config.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use pasa_istio::destination_rule::DestinationRule;
use pasa_istio::virtual_service::VirtualService;
use rustc_hash::{FxHashMap, FxHashSet};

use crate::model::proxy::Proxy;
use crate::model::registry::{self, Config, Registry, Service};
use crate::model::scope::{DestinationRules, SidecarScope};

use super::fingerprint;
use super::route::Destinations;
use super::{builders, cluster, hash, hcm, names, route};

/// What a proxy sees, worked out once per update and shared by the generators.
pub(crate) struct View<'a> {
    pub(super) proxy: &'a Proxy,
    pub(super) registry: &'a Registry,
    pub(super) scope: SidecarScope,
    /// Visible services by host.
    pub(super) services: VisibleServices,
    /// Visible VirtualServices for sidecars, oldest first.
    pub(super) virtual_services: Vec<Arc<Config<VirtualService>>>,
    /// The hosts of each of `virtual_services`, resolved (as written, and in lower case).
    pub(super) vs_hosts: Vec<Arc<VsHosts>>,
    /// Visible DestinationRules, by host (kept across updates while no DestinationRule and
    /// no part of the scope it depends on changed).
    pub(super) destination_rules: Arc<DestinationRules>,
    /// Where the index differs from the last update's, if it does.
    pub(super) rules_changed: Option<RulesChanged>,
    /// The VirtualService for each exact host (the oldest that names it).
    vs_by_host: FxHashMap<String, usize>,
    /// Wildcard hosts of VirtualServices, with the VirtualService's position.
    vs_wildcards: Vec<(String, usize)>,
    /// Kubernetes `ExternalName` services by the host they alias.
    pub(super) aliases: BTreeMap<String, Vec<String>>,
    /// Addresses allocated to ServiceEntry hosts without one, by namespace and host, when this
    /// proxy uses them.
    auto_addresses: BTreeMap<(String, String), String>,
    /// Connection manager settings per listener class: inbound, outbound, gateway.
    pub(super) hcm: [hcm::Options; 3],
    /// What clusters take from the proxy and the mesh config.
    pub(super) cluster_settings: cluster::ClusterSettings,
    /// The mesh config's `defaultHttpRetryPolicy` and `defaultInboundHttpRetryPolicy`.
    pub(super) retry_defaults: RetryDefaults,
    /// What every route reads of the proxy's settings and the mesh config (outbound attempt
    /// counts and X-Forwarded-Host, the default retry policies), fingerprinted: routes built
    /// under other settings are not reused.
    pub(super) route_settings: u64,
}

/// The mesh config's default retry policies (a route's own wins).
#[derive(Debug, Default, Hash)]
pub(super) struct RetryDefaults {
    pub(super) outbound: Option<pasa_istio::virtual_service::HttpRetry>,
    pub(super) inbound: Option<pasa_istio::virtual_service::HttpRetry>,
}

impl RetryDefaults {
    pub(super) fn of(mesh: Option<&pasa_istio::mesh_config::MeshConfig>) -> RetryDefaults {
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
pub(super) struct VisibleServices {
    pub(super) sorted: Vec<Arc<Service>>,
    by_host: FxHashMap<String, usize>,
}

impl VisibleServices {
    /// From services in host order, one per host (as the registry holds them).
    pub(super) fn new(sorted: Vec<Arc<Service>>) -> Self {
        let mut by_host = FxHashMap::with_capacity_and_hasher(sorted.len(), Default::default());
        for (i, s) in sorted.iter().enumerate() {
            by_host.insert(s.hostname.clone(), i);
        }
        debug_assert!(sorted.is_sorted_by(|a, b| a.hostname < b.hostname));
        VisibleServices { sorted, by_host }
    }

    pub(super) fn get(&self, host: &str) -> Option<&Arc<Service>> {
        self.by_host.get(host).map(|&i| &self.sorted[i])
    }

    pub(super) fn contains_key(&self, host: &str) -> bool {
        self.by_host.contains_key(host)
    }

    pub(super) fn len(&self) -> usize {
        self.sorted.len()
    }

    /// In host order.
    pub(super) fn values(&self) -> std::slice::Iter<'_, Arc<Service>> {
        self.sorted.iter()
    }

    /// In host order, with their hosts.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&String, &Arc<Service>)> {
        self.sorted.iter().map(|s| (&s.hostname, s))
    }

    /// The position of `host`'s service in host order.
    pub(super) fn position(&self, host: &str) -> Option<usize> {
        self.by_host.get(host).copied()
    }

    /// The service at `position` in host order.
    pub(super) fn at(&self, position: usize) -> &Arc<Service> {
        &self.sorted[position]
    }
}

/// A VirtualService's hosts, resolved as istiod resolves them.
#[derive(Debug)]
pub(super) struct VsHosts {
    pub(super) resolved: Vec<String>,
    /// The same, in lower case (as virtual host domains are compared).
    pub(super) lower: Vec<String>,
    /// A fingerprint of `resolved`.
    pub(super) fingerprint: u64,
}

impl VsHosts {
    pub(super) fn of(proxy: &Proxy, vs: &Config<VirtualService>) -> Self {
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
pub(super) struct ViewMemo {
    pub(super) destination_rules: DestinationRuleMemo,
    /// The resolved hosts of each visible VirtualService, by its address (each entry holds the
    /// VirtualService, so the address is not reused while it is here).
    virtual_service_hosts: FxHashMap<usize, (Arc<Config<VirtualService>>, Arc<VsHosts>)>,
}

/// The DestinationRule index of the last update, and what it was built from. The index reads
/// only the registry's DestinationRules and the proxy's namespaces (fixed for a translator).
#[derive(Debug, Default)]
pub(super) struct DestinationRuleMemo {
    /// Every DestinationRule of the registry then, in its order (held, so that none of their
    /// allocations can be reused by a new one that would compare equal by address), with its
    /// host as the proxy resolves it.
    pub(super) rules: Vec<(Arc<Config<DestinationRule>>, String)>,
    pub(super) index: Option<Arc<DestinationRules>>,
}

/// The hosts whose DestinationRule may differ from the last update's.
#[derive(Debug)]
pub(super) enum RulesChanged {
    /// Only these (exact hosts).
    Hosts(FxHashSet<String>),
    /// Any: a wildcard rule came or went, or there was no index before.
    All,
}

impl DestinationRuleMemo {
    /// The index for `scope`: the last one while the registry holds the same DestinationRules
    /// (the same `Arc`s, in the same order), else a new one, with the hosts the difference
    /// touches.
    pub(super) fn index(
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
pub(super) struct LocalInstance<'v> {
    pub(super) service: &'v Service,
    pub(super) service_port: u32,
    /// Where the workload receives it.
    pub(super) target: u32,
    pub(super) protocol: Option<pasa_istio::common::Protocol>,
}

impl View<'_> {
    /// The ports of the services the proxy's workload serves (oldest service first; a
    /// Kubernetes Service only of its own namespace).
    pub(super) fn local_instances(&self) -> Vec<LocalInstance<'_>> {
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
    pub(super) fn new(proxy: &'a Proxy, registry: &'a Registry, memo: &mut ViewMemo) -> View<'a> {
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
                endpoint_settings(proxy, registry, mesh),
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
    pub(super) fn protocol_detection_timeout(&self) -> envoy_types::pb::google::protobuf::Duration {
        builders::nanos(
            self.registry
                .mesh_config(&self.proxy.mesh.root_namespace)
                .and_then(|m| m.positive_duration_nanos("protocolDetectionTimeout"))
                .unwrap_or(0),
        )
    }

    /// The connection manager settings of listeners of `class`.
    pub(super) fn hcm(&self, class: hcm::Class) -> &hcm::Options {
        &self.hcm[match class {
            hcm::Class::SidecarInbound => 0,
            hcm::Class::SidecarOutbound => 1,
            hcm::Class::Gateway => 2,
        }]
    }

    /// The port a route destination goes to: the one it names, else the service's only port,
    /// else the listener's.
    pub(super) fn destination_port(
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
    pub(super) fn default_route(
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
    pub(super) fn auto_address(&self, service: &Service) -> Option<&str> {
        if !service.addresses.is_empty() {
            return None;
        }
        self.auto_addresses
            .get(&(service.namespace.clone(), service.hostname.clone()))
            .map(String::as_str)
    }

    /// The hosts that alias `host` (Kubernetes `ExternalName` services naming it).
    pub(super) fn aliases_of(&self, host: &str) -> Vec<&str> {
        self.aliases
            .get(host)
            .map(|list| list.iter().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// Whether `service` only aliases another (a Kubernetes `ExternalName` service): it gets no
    /// listener or virtual host of its own, its names go to the concrete service's.
    pub(super) fn is_alias(&self, service: &Service) -> bool {
        service.kubernetes && service.external_name.is_some()
    }

    /// The VirtualService that routes `host`: one naming it exactly, else the most specific
    /// wildcard covering it, unless that one was made from Gateway API routes (whose wildcard
    /// hosts name no services: the host is then routed by none, as in istiod).
    pub(super) fn virtual_service_for(&self, host: &str) -> Option<&Arc<Config<VirtualService>>> {
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
    pub(super) fn session_of(&self, host: &str) -> Option<&registry::PersistentSession> {
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

/// What the proxy's endpoints are shaped by (see [`super::endpoint::EndpointSettings`]).
fn endpoint_settings(
    proxy: &Proxy,
    registry: &Registry,
    mesh: Option<&pasa_istio::mesh_config::MeshConfig>,
) -> super::endpoint::EndpointSettings {
    use crate::model::network::{IpFamily, Networks};
    let networks = Networks::new(
        &proxy.network,
        IpFamily::of(&proxy.ips),
        registry.network_gateways(),
    )
    .with_view(&proxy.requested_network_view)
    .with_mesh_networks(mesh.and_then(|m| m.mesh_networks()), |host, cluster| {
        registry
            .external_addresses(host, cluster)
            .into_iter()
            .map(str::to_string)
            .collect()
    });
    let locality = if proxy.locality == crate::identity::Locality::default() {
        String::new()
    } else {
        proxy.locality.to_string()
    };
    super::endpoint::EndpointSettings::of(
        networks,
        (locality, &proxy.labels, &proxy.cluster_id),
        mesh,
        &proxy.mesh.domain_suffix,
        proxy.flags.prefer_hbone,
    )
}
