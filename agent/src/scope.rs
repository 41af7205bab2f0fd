//! Scope: what a proxy sees of the mesh, and the store subscription that fetches exactly that.
//!
//! As in istiod, a sidecar's view is decided by the Sidecar resource that applies to it (one in
//! its namespace selecting its labels, else one in its namespace without a selector, else the
//! root namespace's) and by `exportTo`: a service, VirtualService or DestinationRule is visible
//! when it is exported to the proxy's namespace and, for services and VirtualServices, named by an
//! egress host `namespace/host` of that Sidecar. Without a Sidecar the egress hosts are `*/*`:
//! everything exported to the namespace.
//!
//! The subscription is derived from the same view, iteratively: Sidecars of the proxy's and the
//! root namespace first; then the egress hosts; then the destinations the visible VirtualServices
//! route to, so their clusters can be built. A router (gateway) instead follows every Gateway,
//! its own services, the VirtualServices bound to the Gateways that apply to it, and their
//! destinations. Each store
//! change that alters the view alters the subscription, and the store then adds or removes what
//! entered or left it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use pasa_proto::host;
use pasa_proto::istio::destination_rule::DestinationRule;
use pasa_proto::istio::sidecar::{OutboundTrafficPolicyMode, Sidecar};
use pasa_proto::istio::virtual_service::VirtualService;
use pasa_proto::store::v1::{Rule, Subscription};

use crate::cache::Cache;
use crate::mesh::OutboundPolicy;
use crate::translate::Proxy;
use crate::translate::registry::{Config, Registry, Service, selects};
use pasa_proto::node::ProxyType;

/// `exportTo` of a resource in `resource_ns`: whether `viewer_ns` sees it. Empty means the mesh
/// default, everywhere.
pub fn exported_to(export_to: &[String], resource_ns: &str, viewer_ns: &str) -> bool {
    if export_to.is_empty() {
        return true;
    }
    export_to.iter().any(|e| match e.as_str() {
        "*" => true,
        "." => resource_ns == viewer_ns,
        "~" => false,
        ns => ns == viewer_ns,
    })
}

/// One egress host of a Sidecar: `namespace/host`, the namespace `*` for any.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct EgressHost {
    pub namespace: String,
    pub host: String,
}

impl EgressHost {
    fn parse(text: &str, sidecar_ns: &str) -> Option<EgressHost> {
        let (ns, host) = text.split_once('/')?;
        let namespace = match ns {
            "." => sidecar_ns.to_string(),
            "~" => return None,
            other => other.to_string(),
        };
        Some(EgressHost {
            namespace,
            host: host.to_string(),
        })
    }

    /// Whether a resource of `namespace` for `hostname` falls under this egress host.
    pub fn covers(&self, namespace: &str, hostname: &str) -> bool {
        (self.namespace == "*" || self.namespace == namespace)
            && host::matches(&self.host, hostname)
    }
}

/// A proxy's view of the registry.
#[derive(Debug, Clone)]
pub struct SidecarScope {
    /// The Sidecar resource that applies, if any.
    pub sidecar: Option<Arc<Config<Sidecar>>>,
    /// Egress hosts of the catch-all egress listener (`*/*` without a Sidecar).
    pub egress: Vec<EgressHost>,
    pub outbound_policy: OutboundPolicy,
    config_namespace: String,
    root_namespace: String,
}

impl SidecarScope {
    /// The scope of `proxy` given what the registry holds.
    pub fn of(proxy: &Proxy, registry: &Registry) -> SidecarScope {
        let ns = &proxy.config_namespace;
        let root = &proxy.mesh.root_namespace;
        let mut candidates: Vec<&Arc<Config<Sidecar>>> = registry
            .sidecars()
            .filter(|s| &s.meta.namespace == ns || &s.meta.namespace == root)
            .collect();
        candidates.sort_by_key(|s| (s.meta.created, s.meta.name.clone()));
        let with_selector = candidates.iter().find(|s| {
            &s.meta.namespace == ns
                && s.spec
                    .workload_selector
                    .as_ref()
                    .is_some_and(|w| selects(&w.labels, &proxy.labels))
        });
        let plain = |namespace: &String| {
            candidates
                .iter()
                .find(|s| &s.meta.namespace == namespace && s.spec.workload_selector.is_none())
        };
        let sidecar = with_selector
            .or_else(|| plain(ns))
            .or_else(|| plain(root))
            .map(|s| Arc::clone(s));
        let everything = || {
            vec![EgressHost {
                namespace: "*".into(),
                host: "*".into(),
            }]
        };
        let egress = match &sidecar {
            Some(s) => {
                // The listener without a port is the catch-all; without one, the first. A
                // Sidecar without egress listeners (one that sets only its outbound policy or
                // its ingress) sees everything, as istiod reads it.
                let listener = s
                    .spec
                    .egress
                    .iter()
                    .find(|e| e.port.is_none())
                    .or(s.spec.egress.first());
                listener
                    .map(|l| {
                        l.hosts
                            .iter()
                            .filter_map(|h| EgressHost::parse(h, ns))
                            .collect()
                    })
                    .unwrap_or_else(everything)
            }
            None => everything(),
        };
        let outbound_policy = sidecar
            .as_ref()
            .and_then(|s| s.spec.outbound_traffic_policy.as_ref())
            .map(|p| match p.mode {
                OutboundTrafficPolicyMode::RegistryOnly => OutboundPolicy::RegistryOnly,
                _ => OutboundPolicy::AllowAny,
            })
            .unwrap_or(proxy.mesh.outbound_policy);
        SidecarScope {
            sidecar,
            egress,
            outbound_policy,
            config_namespace: ns.clone(),
            root_namespace: root.clone(),
        }
    }

    /// Istio's default scope (egress `*/*`): everything exported to the namespace.
    pub fn sees_everything(&self) -> bool {
        self.egress
            .iter()
            .any(|e| e.namespace == "*" && e.host == "*")
    }

    fn in_egress(&self, namespace: &str, hostname: &str) -> bool {
        self.egress.iter().any(|e| e.covers(namespace, hostname))
    }

    /// The services this proxy sees, one per host: a Kubernetes service before ServiceEntries,
    /// then one in the proxy's own namespace, then the oldest declaration. Later declarations of
    /// the host like it (same namespace, registry, resolution and `exportTo`) add the ports it
    /// lacks, as istiod merges ServiceEntries sharing a host.
    pub fn services(&self, registry: &Registry) -> Vec<Arc<Service>> {
        registry
            .services()
            .values()
            .filter_map(|list| {
                let visible: Vec<&Arc<Service>> = list
                    .iter()
                    .filter(|s| {
                        exported_to(&s.export_to, &s.namespace, &self.config_namespace)
                            && self.in_egress(&s.namespace, &s.hostname)
                    })
                    .collect();
                let first = visible
                    .iter()
                    .find(|s| s.kubernetes)
                    .or_else(|| {
                        visible
                            .iter()
                            .find(|s| s.namespace == self.config_namespace)
                    })
                    .or_else(|| visible.first())?;
                let mut merged: Option<Service> = None;
                for other in &visible {
                    if Arc::ptr_eq(other, first)
                        || other.namespace != first.namespace
                        || other.kubernetes != first.kubernetes
                        || other.resolution != first.resolution
                        || other.export_to != first.export_to
                    {
                        continue;
                    }
                    for port in &other.ports {
                        let base = merged.get_or_insert_with(|| first.as_ref().clone());
                        if base.port(port.number).is_none() {
                            base.ports.push(port.clone());
                        }
                    }
                }
                Some(merged.map_or_else(|| Arc::clone(first), Arc::new))
            })
            .collect()
    }

    /// The VirtualServices for sidecars (gateway `mesh`) this proxy sees, oldest first.
    pub fn virtual_services(&self, registry: &Registry) -> Vec<Arc<Config<VirtualService>>> {
        let mut list: Vec<Arc<Config<VirtualService>>> = registry
            .virtual_services()
            .filter(|vs| {
                let mesh =
                    vs.spec.gateways.is_empty() || vs.spec.gateways.iter().any(|g| g == "mesh");
                mesh && exported_to(
                    &vs.spec.export_to,
                    &vs.meta.namespace,
                    &self.config_namespace,
                ) && vs
                    .spec
                    .hosts
                    .iter()
                    .any(|h| self.in_egress(&vs.meta.namespace, h))
            })
            .cloned()
            .collect();
        list.sort_by(|a, b| a.meta.age_key().cmp(&b.meta.age_key()));
        list
    }

    /// The DestinationRules exported to this proxy's namespace, indexed by host.
    pub fn destination_rules(&self, proxy: &Proxy, registry: &Registry) -> DestinationRules {
        let mut index = DestinationRules {
            exact: HashMap::new(),
            wildcards: Vec::new(),
            config_namespace: self.config_namespace.clone(),
            root_namespace: self.root_namespace.clone(),
        };
        for dr in registry.destination_rules() {
            let ns = &dr.meta.namespace;
            if !exported_to(&dr.spec.export_to, ns, &self.config_namespace) {
                continue;
            }
            let host = proxy.resolve_host(&dr.spec.host, ns);
            if host.starts_with('*') {
                index.wildcards.push((host, Arc::clone(dr)));
            } else {
                index.exact.entry(host).or_default().push(Arc::clone(dr));
            }
        }
        index
    }
}

/// The DestinationRules a proxy sees, by the host they apply to.
#[derive(Debug, Clone, Default)]
pub struct DestinationRules {
    exact: HashMap<String, Vec<Arc<Config<DestinationRule>>>>,
    wildcards: Vec<(String, Arc<Config<DestinationRule>>)>,
    config_namespace: String,
    root_namespace: String,
}

impl DestinationRules {
    /// The DestinationRule that applies to `service`: one in the proxy's namespace, else the
    /// service's, else the root namespace's, else any other exported here; within one namespace
    /// an exact host before wildcards (longer first), then the oldest.
    pub fn for_service(&self, service: &Service) -> Option<Arc<Config<DestinationRule>>> {
        let exact = self
            .exact
            .get(&service.hostname)
            .into_iter()
            .flatten()
            .map(|dr| (0usize, dr));
        let wildcards = self
            .wildcards
            .iter()
            .filter(|(h, _)| host::matches(h, &service.hostname))
            .map(|(h, dr)| (usize::MAX - h.len(), dr));
        exact
            .chain(wildcards)
            .min_by_key(|(specificity, dr)| {
                let ns = &dr.meta.namespace;
                let tier = if *ns == self.config_namespace {
                    0u8
                } else if *ns == service.namespace {
                    1
                } else if *ns == self.root_namespace {
                    2
                } else {
                    3
                };
                (
                    tier,
                    *specificity,
                    dr.meta.created,
                    ns.as_str(),
                    dr.meta.name.as_str(),
                )
            })
            .map(|(_, dr)| Arc::clone(dr))
    }
}

/// The store subscription `proxy` needs, given what it has seen so far (see the module doc).
pub fn subscription(proxy: &Proxy, cache: &Cache) -> Subscription {
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
    let mut rules = vec![Rule {
        kinds: vec!["Sidecar".into()],
        namespaces: dedup(vec![
            proxy.config_namespace.clone(),
            proxy.mesh.root_namespace.clone(),
        ]),
        ..Default::default()
    }];
    if scope.sees_everything() {
        // Istio's default: everything exported to the namespace (filtered here, not in the store).
        rules.push(Rule::default());
        return Subscription { rules };
    }
    // The proxy's own services, endpoints and workload entries (inbound side).
    rules.push(Rule {
        kinds: vec![
            "ServiceEndpoints".into(),
            "ServiceEntry".into(),
            "WorkloadEntry".into(),
        ],
        namespaces: vec![proxy.namespace.clone()],
        ..Default::default()
    });
    let service_kinds = || {
        vec![
            "ServiceEndpoints".to_string(),
            "ServiceEntry".to_string(),
            "VirtualService".to_string(),
        ]
    };
    for egress in &scope.egress {
        rules.push(Rule {
            kinds: service_kinds(),
            namespaces: if egress.namespace == "*" {
                Vec::new()
            } else {
                vec![egress.namespace.clone()]
            },
            hosts: vec![egress.host.clone()],
            ..Default::default()
        });
    }
    // DestinationRules apply by host from any namespace (proxy's, service's, root).
    let mut dr_hosts: BTreeSet<String> = scope.egress.iter().map(|e| e.host.clone()).collect();
    // Destinations of visible VirtualServices, so their clusters can be built.
    let mut destinations = BTreeSet::new();
    for vs in virtual_services {
        add_destinations(proxy, vs, &mut destinations);
    }
    if !destinations.is_empty() {
        rules.push(Rule {
            kinds: vec!["ServiceEndpoints".into(), "ServiceEntry".into()],
            hosts: destinations.iter().cloned().collect(),
            ..Default::default()
        });
        dr_hosts.extend(destinations);
    }
    rules.push(Rule {
        kinds: vec!["DestinationRule".into()],
        hosts: dr_hosts.into_iter().collect(),
        ..Default::default()
    });
    // Endpoints of visible ServiceEntries that select WorkloadEntries.
    let selector_namespaces: BTreeSet<String> = services
        .filter(|s| !s.kubernetes)
        .map(|s| s.namespace.clone())
        .filter(|ns| ns != &proxy.namespace)
        .collect();
    if !selector_namespaces.is_empty() {
        rules.push(Rule {
            kinds: vec!["WorkloadEntry".into()],
            namespaces: selector_namespaces.into_iter().collect(),
            ..Default::default()
        });
    }
    Subscription { rules }
}

/// A router's scope, derived as istiod scopes a gateway: every Gateway (few, and selector matching
/// is not a store dimension); the router's own services, which decide the ports it listens on and
/// which service-bound Gateways apply (those of its namespace, and the services Gateways name in
/// `internal.istio.io/gateway-service` in theirs); the VirtualServices bound to the Gateways that
/// apply to it, and the services and DestinationRules of their destinations; and, when a server
/// passes TLS through by SNI-DNAT (`AUTO_PASSTHROUGH`), the services and DestinationRules of the
/// hosts it serves.
fn router_subscription(proxy: &Proxy, registry: &Registry) -> Subscription {
    use crate::translate::gateway::merge;
    use pasa_proto::istio::gateway::TlsMode;

    let own_kinds = || vec!["ServiceEndpoints".to_string(), "ServiceEntry".to_string()];
    let mut rules = vec![
        Rule {
            kinds: vec!["Gateway".into()],
            ..Default::default()
        },
        Rule {
            kinds: [own_kinds(), vec!["WorkloadEntry".to_string()]].concat(),
            namespaces: vec![proxy.namespace.clone()],
            ..Default::default()
        },
    ];
    for g in registry.gateways() {
        if let Some(list) = g.meta.annotations.get(merge::GATEWAY_SERVICE_ANNOTATION) {
            rules.push(Rule {
                kinds: own_kinds(),
                namespaces: vec![g.meta.namespace.clone()],
                hosts: dedup(list.split(',').map(|h| h.trim().to_string()).collect()),
                ..Default::default()
            });
        }
    }
    let applying = merge::applying(proxy, registry);
    let selected: BTreeSet<String> = applying.iter().map(merge::Applied::name).collect();
    if selected.is_empty() {
        return Subscription { rules };
    }
    rules.push(Rule {
        kinds: vec!["VirtualService".into()],
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
            .any(|g| selected.contains(&pasa_proto::gateway::resolve_gateway_name(g, ns)));
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
            kinds: [own_kinds(), vec!["DestinationRule".to_string()]].concat(),
            hosts,
            ..Default::default()
        });
    }
    Subscription { rules }
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

#[cfg(test)]
mod tests;
