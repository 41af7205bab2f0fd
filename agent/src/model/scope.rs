//! SidecarScope: what a proxy sees of the mesh, as istiod decides it.
//!
//! A sidecar's view is decided by the Sidecar resource that applies to it (one in its namespace
//! selecting its labels, else one in its namespace without a selector, else the root
//! namespace's) and by `exportTo`: a service, VirtualService or DestinationRule is visible when
//! it is exported to the proxy's namespace and, for services and VirtualServices, named by an
//! egress host `namespace/host` of that Sidecar. Without a Sidecar the egress hosts are `*/*`:
//! everything exported to the namespace.

use rustc_hash::FxHashMap;
use std::sync::Arc;

use pasa_istio::destination_rule::DestinationRule;
use pasa_istio::host;
use pasa_istio::label_selector::selects;
use pasa_istio::sidecar::{OutboundTrafficPolicyMode, Sidecar};
use pasa_istio::virtual_service::VirtualService;
use pasa_istio::visibility::exported_to;

use super::proxy::Proxy;
use super::registry::{Config, Registry, Service};
use crate::mesh::OutboundPolicy;

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

    /// [`EgressHost::covers`] one way, as for routes made from the Gateway API: every host
    /// `hostname` names must be under this egress host (`*.com` is not imported by `a.com`).
    pub fn contains(&self, namespace: &str, hostname: &str) -> bool {
        (self.namespace == "*" || self.namespace == namespace)
            && host::subset_of(hostname, &self.host)
    }
}

/// A proxy's view of the registry.
#[derive(Debug, Clone)]
pub struct SidecarScope {
    /// The Sidecar resource that applies, if any.
    pub sidecar: Option<Arc<Config<Sidecar>>>,
    /// Egress hosts of the catch-all egress listener (`*/*` without a Sidecar).
    pub(crate) egress: Vec<EgressHost>,
    /// [`SidecarScope::egress`] indexed: an on-demand proxy's scope has an egress host per
    /// learned host, hundreds, which every service is checked against.
    egress_index: EgressIndex,
    pub outbound_policy: OutboundPolicy,
    config_namespace: String,
    root_namespace: String,
    /// The mesh's DNS suffix, to resolve short hosts as istiod does before matching them.
    domain_suffix: String,
}

/// Egress hosts for [`SidecarScope::in_egress`]: the namespaces of each that is no wildcard,
/// and the wildcards.
#[derive(Debug, Clone, Default)]
struct EgressIndex {
    exact: FxHashMap<String, Vec<String>>,
    wildcards: Vec<EgressHost>,
}

impl EgressIndex {
    fn of(egress: &[EgressHost]) -> EgressIndex {
        let mut index = EgressIndex::default();
        for e in egress {
            if e.host.starts_with('*') {
                index.wildcards.push(e.clone());
            } else {
                index
                    .exact
                    .entry(e.host.clone())
                    .or_default()
                    .push(e.namespace.clone());
            }
        }
        index
    }
}

impl SidecarScope {
    /// The scope of `proxy` given what the registry holds.
    pub fn of(proxy: &Proxy, registry: &Registry) -> SidecarScope {
        let eager = SidecarScope::eager(proxy, registry);
        match &proxy.learned {
            Some(learned) => eager.narrowed(registry, learned),
            None => eager,
        }
    }

    /// The scope the Sidecar (or its absence) gives, whatever the proxy has learned.
    fn eager(proxy: &Proxy, registry: &Registry) -> SidecarScope {
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
            egress_index: EgressIndex::of(&egress),
            egress,
            outbound_policy,
            config_namespace: ns.clone(),
            root_namespace: root.clone(),
            domain_suffix: proxy.mesh.config_domain_suffix.clone(),
        }
    }

    /// This scope narrowed to the hosts an on-demand proxy has learned (see
    /// [`crate::on_demand`]): each learned host under every egress host that covers it (any
    /// namespace, without a Sidecar), and the hosts the VirtualServices then visible route to,
    /// the ExternalName services then visible name and the services whose addresses were
    /// learned, under the same rule, until nothing more is added (a route's destination needs
    /// its cluster). A host the scope does not cover stays out: the proxy may not see it.
    pub fn narrowed(
        &self,
        registry: &Registry,
        learned: &std::collections::BTreeSet<String>,
    ) -> SidecarScope {
        let mut hosts = learned.clone();
        loop {
            let mut egress: Vec<EgressHost> = hosts
                .iter()
                .flat_map(|h| {
                    self.egress
                        .iter()
                        .filter(|e| host::matches(&e.host, h))
                        .map(|e| EgressHost {
                            namespace: e.namespace.clone(),
                            host: h.clone(),
                        })
                })
                .collect();
            egress.sort();
            egress.dedup();
            let narrowed = SidecarScope {
                egress_index: EgressIndex::of(&egress),
                egress,
                ..self.clone()
            };
            let before = hosts.len();
            // A Kubernetes ExternalName service is routed as the service it names.
            let targets: Vec<String> = registry
                .services()
                .values()
                .flatten()
                .filter(|s| hosts.contains(&s.hostname))
                .filter_map(|s| s.external_name.clone())
                .collect();
            hosts.extend(targets);
            // A service's virtual IP, as a client called it, stands for the service.
            let addresses: std::collections::BTreeSet<std::net::IpAddr> =
                hosts.iter().filter_map(|h| h.parse().ok()).collect();
            if !addresses.is_empty() {
                let named: Vec<String> = registry
                    .services()
                    .values()
                    .flatten()
                    .filter(|s| {
                        s.addresses
                            .iter()
                            .any(|a| a.parse().is_ok_and(|a| addresses.contains(&a)))
                    })
                    .map(|s| s.hostname.clone())
                    .collect();
                hosts.extend(named);
            }
            for vs in narrowed.virtual_services(registry) {
                hosts.extend(
                    vs.spec.destination_hosts().map(|h| {
                        host::resolve_short_name(h, &vs.meta.namespace, &self.domain_suffix)
                    }),
                );
            }
            if hosts.len() == before {
                return narrowed;
            }
        }
    }

    /// Istio's default scope (egress `*/*`): everything exported to the namespace.
    pub fn sees_everything(&self) -> bool {
        self.egress
            .iter()
            .any(|e| e.namespace == "*" && e.host == "*")
    }

    /// [`EgressHost::covers`] by any egress host: a host that is no wildcard is looked up among
    /// the egress hosts that are none either, and checked against the wildcards.
    fn in_egress(&self, namespace: &str, hostname: &str) -> bool {
        if hostname.starts_with('*') {
            return self.egress.iter().any(|e| e.covers(namespace, hostname));
        }
        let index = &self.egress_index;
        index
            .exact
            .get(hostname)
            .is_some_and(|namespaces| namespaces.iter().any(|n| n == "*" || n == namespace))
            || index
                .wildcards
                .iter()
                .any(|e| e.covers(namespace, hostname))
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

    /// The VirtualServices for sidecars (gateway `mesh`) this proxy sees, in istiod's order:
    /// those private to its namespace, then those exported to it by name, then public ones; in
    /// each, those made from Gateway API routes of the proxy's own namespace first (a
    /// consumer's routes override the producer's), then oldest first. Routes made from the
    /// Gateway API apply only to the registry services they name, of their own namespace unless
    /// the proxy is in it, as istiod applies them.
    pub fn virtual_services(&self, registry: &Registry) -> Vec<Arc<Config<VirtualService>>> {
        let gateway_api = |vs: &Config<VirtualService>| {
            pasa_istio::generated::has_gateway_semantics(&vs.meta.annotations)
        };
        let mut list: Vec<Arc<Config<VirtualService>>> = registry
            .virtual_services()
            .filter(|vs| {
                let mesh =
                    vs.spec.gateways.is_empty() || vs.spec.gateways.iter().any(|g| g == "mesh");
                // A Gateway API route applies to services it names (never through a wildcard),
                // of its own namespace unless the proxy is in it too.
                let applies = !gateway_api(vs)
                    || vs.spec.hosts.iter().any(|h| {
                        registry.services().get(h).is_some_and(|list| {
                            list.iter().any(|s| {
                                s.namespace == vs.meta.namespace
                                    || vs.meta.namespace == self.config_namespace
                            })
                        })
                    });
                mesh && applies
                    && exported_to(
                        &vs.spec.export_to,
                        &vs.meta.namespace,
                        &self.config_namespace,
                    )
                    && vs.spec.hosts.iter().any(|h| {
                        // Short names resolve in the VirtualService's namespace first, as istiod
                        // resolves them before it matches egress hosts.
                        let host = pasa_istio::host::resolve_short_name(
                            h,
                            &vs.meta.namespace,
                            &self.domain_suffix,
                        );
                        if gateway_api(vs) {
                            self.egress
                                .iter()
                                .any(|e| e.contains(&vs.meta.namespace, &host))
                        } else {
                            self.in_egress(&vs.meta.namespace, &host)
                        }
                    })
            })
            .cloned()
            .collect();
        // istiod's order: those private to the proxy's namespace, then those exported to it by
        // name, then the public ones; in each, Gateway API routes of the proxy's namespace
        // first, then oldest first.
        let order = |vs: &Config<VirtualService>| {
            let producer = !(gateway_api(vs) && vs.meta.namespace == self.config_namespace);
            (
                export_tier(
                    &vs.spec.export_to,
                    &vs.meta.namespace,
                    &self.config_namespace,
                ),
                producer,
            )
        };
        list.sort_by(|a, b| (order(a), a.meta.age_key()).cmp(&(order(b), b.meta.age_key())));
        list
    }

    /// The DestinationRules exported to this proxy's namespace, indexed by host: `rules` are
    /// the registry's, each with its host as the proxy resolves it (see
    /// [`Proxy::resolve_host`]). A rule with a workload selector is its namespace's only, and
    /// noted as selecting the proxy (its `labels`) or not.
    pub fn destination_rules<'r>(
        &self,
        rules: impl Iterator<Item = (&'r Arc<Config<DestinationRule>>, &'r str)>,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> DestinationRules {
        let mut index = DestinationRules {
            exact: FxHashMap::default(),
            wildcards: Vec::new(),
            config_namespace: self.config_namespace.clone(),
            root_namespace: self.root_namespace.clone(),
        };
        for (dr, host) in rules {
            let ns = &dr.meta.namespace;
            let selects = dr
                .spec
                .workload_selector
                .as_ref()
                .map(|s| selects(&s.match_labels, labels));
            let visible = match selects {
                Some(_) => *ns == self.config_namespace,
                None => exported_to(&dr.spec.export_to, ns, &self.config_namespace),
            };
            if !visible {
                continue;
            }
            let rule = Rule {
                config: Arc::clone(dr),
                selects,
            };
            let host = host.to_string();
            if host.starts_with('*') {
                index.wildcards.push((host, rule));
            } else {
                index.exact.entry(host).or_default().push(rule);
            }
        }
        index
    }
}

/// The DestinationRules a proxy sees, by the host they apply to.
#[derive(Debug, Clone, Default)]
pub struct DestinationRules {
    exact: FxHashMap<String, Vec<Rule>>,
    wildcards: Vec<(String, Rule)>,
    config_namespace: String,
    root_namespace: String,
}

/// A DestinationRule the proxy sees.
#[derive(Debug, Clone)]
struct Rule {
    config: Arc<Config<DestinationRule>>,
    /// With a workload selector: whether it selects the proxy.
    selects: Option<bool>,
}

impl DestinationRules {
    /// The DestinationRule that applies to the proxy's traffic to `service`, as istiod picks
    /// it: the rules of the proxy's namespace, else of the service's, else of the root
    /// namespace, else any other exported here; within the first of those with a rule for the
    /// host, the most specific host (exact, then the longest wildcard); among its rules one
    /// whose workload selector selects the proxy, else the oldest without a selector. (So a
    /// rule of the proxy's namespace for the host that selects other workloads only leaves the
    /// proxy without a rule, as in istiod.)
    pub fn for_service(&self, service: &Service) -> Option<Arc<Config<DestinationRule>>> {
        self.pick(service, true)
    }

    /// The rule of `service` for the proxy's inbound side (a workload of the service): as
    /// [`DestinationRules::for_service`], but workload selectors are for clients only, so only
    /// rules without one count.
    pub fn for_inbound(&self, service: &Service) -> Option<Arc<Config<DestinationRule>>> {
        self.pick(service, false)
    }

    fn pick(&self, service: &Service, outbound: bool) -> Option<Arc<Config<DestinationRule>>> {
        let exact = self
            .exact
            .get(&service.hostname)
            .into_iter()
            .flatten()
            .map(|rule| (0usize, rule));
        let wildcards = self
            .wildcards
            .iter()
            .filter(|(h, _)| host::matches(h, &service.hostname))
            .map(|(h, rule)| (usize::MAX - h.len(), rule));
        let tier = |rule: &Rule| {
            let ns = &rule.config.meta.namespace;
            if *ns == self.config_namespace {
                0u8
            } else if *ns == service.namespace {
                1
            } else if *ns == self.root_namespace {
                2
            } else {
                3
            }
        };
        let candidates: Vec<(usize, &Rule)> = exact.chain(wildcards).collect();
        let first = candidates
            .iter()
            .map(|(specificity, rule)| (tier(rule), *specificity))
            .min()?;
        fn age<'r>(rule: &&'r Rule) -> (u64, &'r str, &'r str) {
            let meta = &rule.config.meta;
            (meta.created, meta.namespace.as_str(), meta.name.as_str())
        }
        let group = || {
            candidates
                .iter()
                .filter(move |(specificity, rule)| (tier(rule), *specificity) == first)
                .map(|(_, rule)| *rule)
        };
        let selecting = group()
            .filter(|rule| outbound && rule.selects == Some(true))
            .min_by_key(age);
        selecting
            .or_else(|| {
                group()
                    .filter(|rule| rule.selects.is_none())
                    .min_by_key(age)
            })
            .map(|rule| Arc::clone(&rule.config))
    }
}

/// Which of istiod's lists a VirtualService exported to `viewer` is in: 0 private to the
/// viewer's namespace (its own, exported to itself), 1 exported to it by name, 2 public.
fn export_tier(export_to: &[String], namespace: &str, viewer: &str) -> u8 {
    if export_to.is_empty() || export_to.iter().any(|e| e == "*") {
        2
    } else if namespace == viewer && export_to.iter().any(|e| e == "." || e == namespace) {
        0
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::export_tier;

    #[test]
    fn virtual_services_are_private_exported_or_public_as_istiod_lists_them() {
        let to = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(export_tier(&to(&["."]), "shop", "shop"), 0);
        assert_eq!(export_tier(&to(&["shop", "web"]), "shop", "shop"), 0);
        assert_eq!(export_tier(&to(&[".", "web"]), "shop", "web"), 1);
        assert_eq!(export_tier(&to(&[]), "shop", "shop"), 2);
        assert_eq!(export_tier(&to(&["*", "."]), "shop", "shop"), 2);
    }
}
