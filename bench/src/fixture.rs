//! A generated, realistically scoped mesh: namespaces of services (each with ServiceEndpoints and
//! often a DestinationRule and a VirtualService), external ServiceEntries (some of them wildcard),
//! a Sidecar per namespace plus the root one in `istio-system`, and sidecar subscriptions that
//! name the hosts their workload talks to, mostly services of their own and a few "neighbour"
//! namespaces.
//!
//! Everything is drawn from the caller's RNG, so a seed fixes the mesh.

use std::collections::HashSet;

use pasa_proto::Kind;
use pasa_proto::store::v1::{IndexKeys, Resource};
use pasa_store::selector::{Rule, Selector};
use rand::Rng;
use rand::seq::IndexedRandom;

/// Namespace of the mesh's root Sidecar and its ingress gateway.
pub const ISTIO_SYSTEM: &str = "istio-system";
/// The ingress gateway some VirtualServices bind to.
pub const INGRESS_GATEWAY: &str = "istio-system/ingress";
/// Neighbour namespaces each namespace mostly talks to.
const NEIGHBOURS: usize = 3;
/// External APIs per external domain, on average.
const APIS_PER_DOMAIN: usize = 10;

/// The generated objects and what subscriptions draw their hosts from.
pub struct Mesh {
    /// Every object, each with its index keys filled in.
    pub objects: Vec<Resource>,
    namespaces: usize,
    /// Service FQDNs by namespace index.
    services_by_ns: Vec<Vec<String>>,
    /// Every service FQDN.
    services: Vec<String>,
    /// Exact external ServiceEntry hosts (`api-<j>.example-<k>.com`).
    external_hosts: Vec<String>,
    /// Number of external domains (`example-<k>.com`).
    external_domains: usize,
    /// Neighbour namespace indexes of each namespace.
    neighbours: Vec<Vec<usize>>,
}

/// Name of namespace `i`.
pub fn namespace(i: usize) -> String {
    format!("ns-{i}")
}

fn resource(
    kind: Kind,
    namespace: &str,
    name: String,
    hosts: Vec<String>,
    gateways: Vec<String>,
) -> Resource {
    let api_version = format!("{}/{}", kind.group(), kind.versions()[0]);
    Resource {
        api_version,
        kind: kind.as_str().to_string(),
        namespace: namespace.to_string(),
        name,
        spec_json: "{}".to_string(),
        index: Some(IndexKeys { hosts, gateways }),
        ..Default::default()
    }
}

impl Mesh {
    /// Generates `objects` objects over `namespaces` namespaces (both at least 1).
    pub fn generate(objects: usize, namespaces: usize, rng: &mut impl Rng) -> Mesh {
        let namespaces = namespaces.max(1);
        let mut out = Vec::with_capacity(objects);

        // A Sidecar per namespace and the root one, at most a tenth of the objects.
        let sidecars = (namespaces + 1).min(objects / 10);
        for i in 0..sidecars {
            let ns = if i == 0 {
                ISTIO_SYSTEM.to_string()
            } else {
                namespace(i - 1)
            };
            out.push(resource(
                Kind::Sidecar,
                &ns,
                "default".into(),
                vec![],
                vec![],
            ));
        }

        // About 5% external ServiceEntries, a tenth of them wildcards.
        let entries = (objects / 20).min(objects - out.len());
        let external_domains = entries.div_ceil(APIS_PER_DOMAIN).max(1);
        let mut external_hosts = Vec::new();
        for j in 0..entries {
            let domain = rng.random_range(0..external_domains);
            let host = if rng.random_bool(0.1) {
                format!("*.example-{domain}.com")
            } else {
                let h = format!("api-{j}.example-{domain}.com");
                external_hosts.push(h.clone());
                h
            };
            let ns = namespace(rng.random_range(0..namespaces));
            out.push(resource(
                Kind::ServiceEntry,
                &ns,
                format!("se-{j}"),
                vec![host],
                vec![],
            ));
        }

        // The rest: services, each with ServiceEndpoints, often a DestinationRule and a
        // VirtualService (bound to the mesh, some also to the ingress gateway).
        let mut services_by_ns = vec![Vec::new(); namespaces];
        let mut services = Vec::new();
        let mut j = 0;
        while out.len() < objects {
            let ns_index = j % namespaces;
            let ns = namespace(ns_index);
            let name = format!("svc-{j}");
            let fqdn = format!("{name}.{ns}.svc.cluster.local");
            out.push(resource(
                Kind::ServiceEndpoints,
                &ns,
                name.clone(),
                vec![fqdn.clone()],
                vec![],
            ));
            if out.len() < objects && rng.random_bool(0.5) {
                out.push(resource(
                    Kind::DestinationRule,
                    &ns,
                    name.clone(),
                    vec![fqdn.clone()],
                    vec![],
                ));
            }
            if out.len() < objects && rng.random_bool(0.3) {
                let mut gateways = vec!["mesh".to_string()];
                if rng.random_bool(0.2) {
                    gateways.push(INGRESS_GATEWAY.to_string());
                }
                gateways.sort();
                out.push(resource(
                    Kind::VirtualService,
                    &ns,
                    name,
                    vec![fqdn.clone()],
                    gateways,
                ));
            }
            services_by_ns[ns_index].push(fqdn.clone());
            services.push(fqdn);
            j += 1;
        }

        let neighbours = (0..namespaces)
            .map(|_| {
                (0..NEIGHBOURS.min(namespaces))
                    .map(|_| rng.random_range(0..namespaces))
                    .collect()
            })
            .collect();
        Mesh {
            objects: out,
            namespaces,
            services_by_ns,
            services,
            external_hosts,
            external_domains,
            neighbours,
        }
    }

    /// A random service FQDN of namespace `ns`, or of any namespace if it has none.
    fn service_in(&self, ns: usize, rng: &mut impl Rng) -> Option<String> {
        self.services_by_ns[ns]
            .choose(rng)
            .or_else(|| self.services.choose(rng))
            .cloned()
    }

    /// A random host a workload in namespace `ns` would talk to.
    fn host_for(&self, ns: usize, rng: &mut impl Rng) -> Option<String> {
        let roll: f64 = rng.random();
        if roll < 0.25 {
            self.service_in(ns, rng)
        } else if roll < 0.85 {
            let neighbour = self.neighbours[ns].choose(rng).copied().unwrap_or(ns);
            self.service_in(neighbour, rng)
        } else if roll < 0.95 {
            self.services.choose(rng).cloned()
        } else {
            self.external_hosts
                .choose(rng)
                .or_else(|| self.services.choose(rng))
                .cloned()
        }
    }

    /// The subscription of sidecar number `index`: Sidecars of its namespace and the root one,
    /// plus 10 to 30 hosts it talks to, about a tenth of the time with one wildcard.
    pub fn subscriber(&self, index: usize, rng: &mut impl Rng) -> Selector {
        let ns = index % self.namespaces;
        let sidecars = Rule {
            kinds: vec![Kind::Sidecar],
            namespaces: vec![namespace(ns), ISTIO_SYSTEM.to_string()],
            ..Default::default()
        };
        let want = rng.random_range(10..=30);
        let mut seen = HashSet::with_capacity(want);
        let mut hosts = Vec::with_capacity(want + 1);
        // Small meshes may have fewer distinct hosts than wanted: give up after a few misses.
        for _ in 0..want * 4 {
            if hosts.len() == want {
                break;
            }
            if let Some(h) = self.host_for(ns, rng)
                && seen.insert(h.clone())
            {
                hosts.push(h);
            }
        }
        if rng.random_bool(0.1) {
            let wildcard = if rng.random_bool(0.5) {
                format!(
                    "*.example-{}.com",
                    rng.random_range(0..self.external_domains)
                )
            } else {
                let target = self.neighbours[ns].choose(rng).copied().unwrap_or(ns);
                format!("*.{}.svc.cluster.local", namespace(target))
            };
            hosts.push(wildcard);
        }
        let mut rules = vec![sidecars];
        if !hosts.is_empty() {
            rules.push(Rule {
                hosts,
                ..Default::default()
            });
        }
        Selector { rules }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn mesh_has_the_requested_size_and_unique_objects() {
        let mut rng = StdRng::seed_from_u64(1);
        let mesh = Mesh::generate(500, 5, &mut rng);
        assert_eq!(mesh.objects.len(), 500);
        let unique: HashSet<_> = mesh
            .objects
            .iter()
            .map(|r| (r.kind.clone(), r.namespace.clone(), r.name.clone()))
            .collect();
        assert_eq!(unique.len(), 500);
        for i in 0..50 {
            let sel = mesh.subscriber(i, &mut rng);
            assert_eq!(sel.rules.len(), 2);
            assert!(sel.rules[1].hosts.len() >= 10);
        }
    }

    #[test]
    fn same_seed_same_mesh() {
        let a = Mesh::generate(300, 3, &mut StdRng::seed_from_u64(7));
        let b = Mesh::generate(300, 3, &mut StdRng::seed_from_u64(7));
        assert_eq!(a.objects, b.objects);
    }
}
