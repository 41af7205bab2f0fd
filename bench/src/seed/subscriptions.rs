//! The subscription each pod's proxy asks the store for, derived as its agent derives it: the
//! proxy of the pod (its labels, service account, cluster and network), and its scope over what
//! the store holds, by the agent's own scope code.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use anyhow::Context;
use pasa_agent::cache::Cache;
use pasa_agent::identity::IdentityArgs;
use pasa_agent::model::proxy::Proxy;
use pasa_agent::model::registry::Registry;
use pasa_agent::run::Scope;
use pasa_proto::store::v1::Subscription;
use pasa_store::Store;
use pasa_store::selector::Selector;

use super::mesh::{self, Mesh};
use crate::clusters::Topology;

/// The identity options `pod`'s agent runs with (node ID, labels, service account, the
/// cluster and network of its pod).
pub fn identity_of(topology: &Topology, w: &mesh::Workload, pod: &mesh::Pod) -> IdentityArgs {
    IdentityArgs {
        node_id: pod.node_id(&w.namespace),
        labels: format!("app={},version={}", w.app, pod.version),
        service_account: w.app.clone(),
        cluster_id: topology.cluster_id(pod.cluster),
        network: topology.network(pod.cluster),
        ..Default::default()
    }
}

/// The proxy of `pod` as its agent sees itself.
pub fn proxy_of(topology: &Topology, w: &mesh::Workload, pod: &mesh::Pod) -> anyhow::Result<Proxy> {
    let identity = identity_of(topology, w, pod).resolve()?;
    Ok(Proxy::from_identity(&identity, Default::default()))
}

/// The proxy of `pod` under `scope`: on demand, it has learned the hosts its workload calls,
/// as its agent learns them once the application has called each (see `docs/on-demand.md`).
pub fn scoped_proxy_of(
    mesh: &Mesh,
    w: &mesh::Workload,
    pod: &mesh::Pod,
    scope: Scope,
) -> anyhow::Result<Proxy> {
    let mut proxy = proxy_of(&mesh.topology, w, pod)?;
    if scope == Scope::OnDemand {
        let called = w.calls.iter().map(|&j| mesh.workloads[j].host.clone());
        proxy.learned = Some(Arc::new(called.collect()));
    }
    Ok(proxy)
}

/// Each proxy's subscription, as its agent derives it, by workload and cluster: the pods of a
/// workload in one cluster share theirs (they differ in their version label only, which no
/// Sidecar selects on). Equal subscriptions share one `Arc`, as the store's hub keeps one
/// selector for watchers that subscribe alike.
pub struct Subscriptions {
    by_proxy: BTreeMap<(String, usize), Arc<Subscription>>,
}

impl Subscriptions {
    /// The subscription of `pod` of `w`.
    pub fn of(&self, w: &mesh::Workload, pod: &mesh::Pod) -> Option<&Arc<Subscription>> {
        self.by_proxy.get(&(w.app.clone(), pod.cluster))
    }

    /// Subscriptions derived: one per workload and cluster.
    pub fn derived(&self) -> usize {
        self.by_proxy.len()
    }

    /// Different subscriptions among them.
    pub fn distinct(&self) -> usize {
        self.by_proxy
            .values()
            .map(Arc::as_ptr)
            .collect::<BTreeSet<_>>()
            .len()
    }
}

/// What the store holds, parsed into the agent's registry: what [`derive_from`] derives each
/// scope's subscriptions from.
pub async fn registry_over(store: &Store) -> anyhow::Result<Registry> {
    let everything = Selector {
        rules: vec![pasa_store::selector::Rule::default()],
    };
    let (listed, revision) = store
        .list(&everything, 0)
        .await
        .context("cannot list the loaded objects")?;
    Ok(registry_of(listed.iter().map(|r| (**r).clone()), revision))
}

/// `objects` parsed into the agent's registry, as an agent parses its cache.
fn registry_of(
    objects: impl Iterator<Item = pasa_proto::store::v1::Resource>,
    revision: u64,
) -> Registry {
    let cache = Cache::from_resources(objects, revision);
    let mut registry = Registry::default();
    registry.update(&cache, "cluster.local");
    registry
}

/// Each workload's subscription in each cluster under `scope`, as its pods' agents derive it:
/// the scope of the workload's first pod in that cluster over `registry`.
pub fn derive_from(
    mesh: &Mesh,
    registry: &Registry,
    scope: Scope,
) -> anyhow::Result<Subscriptions> {
    let mut by_proxy = BTreeMap::new();
    for w in &mesh.workloads {
        let mut derived: Vec<Arc<Subscription>> = Vec::new();
        for c in 0..mesh.topology.clusters() {
            let Some(pod) = w.pods.iter().find(|p| p.cluster == c) else {
                continue;
            };
            let proxy = scoped_proxy_of(mesh, w, pod, scope)?;
            let subscription = pasa_agent::subscription::subscription_of(&proxy, registry);
            let shared = match derived.iter().find(|d| ***d == subscription) {
                Some(same) => Arc::clone(same),
                None => {
                    let new = Arc::new(subscription);
                    derived.push(Arc::clone(&new));
                    new
                }
            };
            by_proxy.insert((w.app.clone(), c), shared);
        }
    }
    Ok(Subscriptions { by_proxy })
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::clusters::ClusterArgs;
    use crate::seed::mesh::Shape;
    use crate::seed::{keys_of, manifest};

    /// A proxy of a mesh of three clusters on two networks: it is in its pod's cluster and
    /// network, and subscribes to every cluster's object of each service it calls, of its own
    /// namespace's and of the root namespace's (the network gateways among them), and to no
    /// other service's: by its Sidecar, or on demand once it has called them; without a
    /// Sidecar, the eager scope is every service.
    #[test]
    fn a_proxy_subscribes_to_its_services_in_every_cluster_and_to_the_gateways() {
        for (sidecars, scope) in [
            (true, Scope::Eager),
            (false, Scope::OnDemand),
            (false, Scope::Eager),
        ] {
            a_proxy_subscribes_to(sidecars, scope);
        }
    }

    fn a_proxy_subscribes_to(sidecars: bool, scope: Scope) {
        let topology = Topology::new(ClusterArgs {
            clusters: 3,
            networks: 2,
        })
        .unwrap();
        let mesh = Mesh::generate(Shape {
            services: 60,
            pods: 600,
            virtual_services: 3,
            seed: 7,
            topology,
            sidecars,
        });
        let stored = mesh.objects.iter().zip(1..).map(|(r, revision)| {
            let mut r = r.clone();
            (r.create_revision, r.mod_revision) = (revision, revision);
            r
        });
        let registry = registry_of(stored, mesh.objects.len() as u64);
        let subscriptions = derive_from(&mesh, &registry, scope).unwrap();
        assert_eq!(subscriptions.derived(), 60 * 3);
        let whole_mesh = !sidecars && scope == Scope::Eager;
        // A workload outside the root namespace, calling services of other namespaces.
        let w = mesh
            .workloads
            .iter()
            .find(|w| {
                w.calls
                    .iter()
                    .any(|&j| mesh.workloads[j].namespace != w.namespace)
            })
            .unwrap();
        let pod = w.pods.iter().find(|p| p.cluster == 1).unwrap();
        let proxy = proxy_of(&topology, w, pod).unwrap();
        assert_eq!(
            (proxy.cluster_id.as_str(), proxy.network.as_str()),
            ("cluster-2", "network-2")
        );
        let selector = Selector::from_pb(subscriptions.of(w, pod).unwrap()).unwrap();
        let called: BTreeSet<(&str, &str)> = w
            .calls
            .iter()
            .map(|&j| {
                let c = &mesh.workloads[j];
                (c.namespace.as_str(), c.app.as_str())
            })
            .collect();
        let (mut of_called, mut gateways) = (0, 0);
        for o in mesh.objects.iter().filter(|o| o.kind == "ServiceEndpoints") {
            let spec: Value = serde_json::from_str(&o.spec_json).unwrap();
            let service = spec["service"].as_str().unwrap_or(&o.name);
            let calls = called.contains(&(o.namespace.as_str(), service));
            let gateway = spec.get("networkGateways").is_some();
            let related = match scope {
                _ if whole_mesh => true,
                // Its Sidecar's egress: what it calls, its namespace and the root namespace.
                Scope::Eager => {
                    calls || o.namespace == w.namespace || o.namespace == mesh::ISTIO_SYSTEM
                }
                // What it called, the services of its namespace (one of them is its own: its
                // inbound side), and the network gateways.
                Scope::OnDemand => calls || o.namespace == w.namespace || gateway,
            };
            let (_, keys) = keys_of(&manifest(o)).unwrap();
            assert_eq!(
                selector.matches(&keys),
                related,
                "{}/{} (of {service}, cluster {}): related {related} ({scope:?})",
                o.namespace,
                o.name,
                spec["cluster"]
            );
            of_called += usize::from(calls);
            gateways += usize::from(gateway && related);
        }
        assert_eq!(
            of_called,
            called.len() * 3,
            "each called service in 3 clusters"
        );
        assert_eq!(gateways, 3, "a network gateway per cluster");
    }
}
