//! The seed's mesh, generated deterministically from a seed: namespaces of services, each with
//! its pods as endpoints (version labels, localities, a service account, Istio's `tlsMode`
//! label), DestinationRules with subsets and traffic policies, VirtualServices with header
//! matches, weighted subsets and retries, and a dependency graph (each workload calls 5–30
//! others, a few hot services are called by many, one service in 500 is an aggregator calling
//! 200) written as one Sidecar per workload whose
//! egress hosts are what it calls, as a large mesh must.
//!
//! The root namespace holds the mesh's own services (istiod, the ingress gateway) beside the
//! ingress Gateway. Per service: one `ServiceEndpoints` (its pods), two DestinationRules (the owner's, and a
//! consumer's override exported to the consumer's namespace only) and up to three
//! VirtualServices (the mesh route, the ingress route, and a consumer's override exported to the
//! consumer's namespace only), as the article the seed comes from counts them (about three and
//! two per service). Every object is valid as PCP validates it (a test holds that).
//!
//! With several clusters (see [`crate::clusters`]) each service runs in every cluster: its pods
//! are dealt to the clusters in turn, and each cluster has its own `ServiceEndpoints` of the
//! service (its own addresses and its pods); with several networks each cluster has a network
//! gateway. The configuration (rules, routes, Sidecars) is the mesh's, written once.

use std::collections::BTreeSet;

use pasa_proto::Kind;
use pasa_proto::store::v1::Resource;
use rand::Rng;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

use crate::clusters::Topology;

/// Namespace of the ingress gateway.
pub const ISTIO_SYSTEM: &str = "istio-system";
/// Services per namespace, on average.
const SERVICES_PER_NAMESPACE: usize = 20;
/// Calls of a workload to other services, at least and at most.
const CALLS: (usize, usize) = (5, 30);
/// One service in this many is hot: half of all workloads call each hot service.
const HOT_EVERY: usize = 100;
/// One service in this many is an aggregator (an API front end) calling
/// [`AGGREGATOR_CALLS`] others: the widest sidecar scope of the mesh, the one A1 measures.
const AGGREGATOR_EVERY: usize = 500;
const AGGREGATOR_CALLS: usize = 200;
/// Regions and zones per region of the pods' localities.
const REGIONS: usize = 3;
const ZONES: usize = 3;

/// What the seed generates.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub services: usize,
    pub pods: usize,
    /// VirtualServices per service, 1 to 3.
    pub virtual_services: usize,
    pub seed: u64,
    /// The clusters and networks the pods are spread over.
    pub topology: Topology,
    /// One Sidecar per workload (its egress hosts are what it calls); without them every proxy's
    /// scope is the whole mesh, as in most meshes, unless the proxy learns it on demand.
    pub sidecars: bool,
}

/// One service and its pods.
#[derive(Debug, Clone)]
pub struct Workload {
    pub namespace: String,
    /// The service's name, and its pods' `app` label.
    pub app: String,
    pub host: String,
    pub pods: Vec<Pod>,
    /// Indexes of the services it calls.
    pub calls: Vec<usize>,
}

#[derive(Debug, Clone)]
pub struct Pod {
    pub name: String,
    pub ip: String,
    pub version: &'static str,
    /// The cluster it runs in (counted from 0; see [`Topology`]).
    pub cluster: usize,
}

impl Pod {
    /// The node ID its proxy presents, as Istio's injector makes it.
    pub fn node_id(&self, namespace: &str) -> String {
        format!(
            "sidecar~{}~{}.{namespace}~{namespace}.svc.cluster.local",
            self.ip, self.name
        )
    }
}

/// The generated mesh.
#[derive(Debug, Clone)]
pub struct Mesh {
    pub objects: Vec<Resource>,
    pub workloads: Vec<Workload>,
    pub topology: Topology,
}

/// Name of namespace `i`.
fn namespace(i: usize) -> String {
    format!("ns-{i}")
}

/// An address of a /8 from a number: `10.<base + n / 65536>.<n / 256 % 256>.<n % 256>`.
fn address(base: usize, n: usize) -> String {
    format!("10.{}.{}.{}", base + n / 65536, n / 256 % 256, n % 256)
}

/// The address of service `i` in cluster `c`: each cluster gives its services addresses of its
/// own, in `10.96.0.0/16` for the first.
pub fn service_address(i: usize, c: usize) -> String {
    address(if c == 0 { 96 } else { 100 + c }, i)
}

fn object(kind: Kind, namespace: &str, name: &str, spec: Value) -> Resource {
    Resource {
        api_version: format!("{}/{}", kind.group(), kind.versions()[0]),
        kind: kind.as_str().to_string(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        spec_json: spec.to_string(),
        ..Default::default()
    }
}

impl Mesh {
    pub fn generate(shape: Shape) -> Mesh {
        let mut rng = StdRng::seed_from_u64(shape.seed);
        let services = shape.services.max(1);
        let namespaces = services.div_ceil(SERVICES_PER_NAMESPACE);
        let mut workloads: Vec<Workload> = (0..services)
            .map(|i| {
                let ns = namespace(i % namespaces);
                let app = format!("svc-{i}");
                Workload {
                    host: format!("{app}.{ns}.svc.cluster.local"),
                    namespace: ns,
                    app,
                    pods: Vec::new(),
                    calls: Vec::new(),
                }
            })
            .collect();
        // Pods: each service gets a share drawn between half and one and a half of the mean,
        // every service at least one pod in each cluster.
        let clusters = shape.topology.clusters();
        let weights: Vec<f64> = (0..services).map(|_| rng.random_range(0.5..1.5)).collect();
        let total: f64 = weights.iter().sum();
        let mut counts: Vec<usize> = weights
            .iter()
            .map(|w| {
                ((w / total) * shape.pods as f64)
                    .floor()
                    .max(clusters as f64) as usize
            })
            .collect();
        let mut assigned: usize = counts.iter().sum();
        let mut i = 0;
        while assigned < shape.pods {
            counts[i % services] += 1;
            assigned += 1;
            i += 1;
        }
        let mut next_pod = 0;
        for (w, count) in workloads.iter_mut().zip(&counts) {
            for k in 0..*count {
                let version = match rng.random_range(0..10) {
                    0..6 => "v1",
                    6..9 => "v2",
                    _ => "v3",
                };
                w.pods.push(Pod {
                    name: format!("{}-{version}-{k}", w.app),
                    ip: address(128, next_pod),
                    version,
                    cluster: k % clusters,
                });
                next_pod += 1;
            }
        }
        // The dependency graph: hot services called by half of the workloads, the rest drawn.
        let hot: Vec<usize> = (0..services).step_by(HOT_EVERY).collect();
        for (i, w) in workloads.iter_mut().enumerate() {
            let mut calls = BTreeSet::new();
            for &h in &hot {
                if h != i && rng.random_bool(0.5) {
                    calls.insert(h);
                }
            }
            let wanted = if i % AGGREGATOR_EVERY == AGGREGATOR_EVERY / 2 {
                AGGREGATOR_CALLS
            } else {
                rng.random_range(CALLS.0..=CALLS.1)
            }
            .min(services.saturating_sub(1));
            let mut bound = 0;
            while calls.len() < wanted && bound < 10 * wanted.max(CALLS.1) {
                let j = rng.random_range(0..services);
                if j != i {
                    calls.insert(j);
                }
                bound += 1;
            }
            w.calls = calls.into_iter().collect();
        }

        let topology = shape.topology;
        let mut objects = vec![ingress_gateway()];
        objects.extend(mesh_services());
        objects.extend(
            topology
                .gateway_services()
                .into_iter()
                .map(|(name, spec)| object(Kind::ServiceEndpoints, ISTIO_SYSTEM, &name, spec)),
        );
        for (i, w) in workloads.iter().enumerate() {
            objects.extend(service_endpoints(i, w, &topology, &mut rng));
            objects.push(owner_rule(w, &mut rng));
            if shape.sidecars {
                objects.push(sidecar(w, &workloads));
            }
            // A consumer of the service, in another namespace when there is one.
            let callers = || {
                workloads
                    .iter()
                    .filter(|c| c.calls.binary_search(&i).is_ok())
            };
            let consumer = callers()
                .find(|c| c.namespace != w.namespace)
                .or_else(|| callers().next())
                .unwrap_or(w);
            objects.push(consumer_rule(w, &consumer.namespace));
            let routes = [
                mesh_route(w, &mut rng),
                ingress_route(w),
                consumer_route(w, &consumer.namespace),
            ];
            objects.extend(routes.into_iter().take(shape.virtual_services.clamp(1, 3)));
        }
        Mesh {
            objects,
            workloads,
            topology,
        }
    }

    /// Every pod with its workload.
    pub fn pods(&self) -> impl Iterator<Item = (&Workload, &Pod)> {
        self.workloads
            .iter()
            .flat_map(|w| w.pods.iter().map(move |p| (w, p)))
    }
}

/// The mesh's own services in its root namespace, which every Sidecar's `istio-system/*` egress
/// makes visible: istiod and the ingress gateway (their pods are not the seed's subscribers).
fn mesh_services() -> Vec<Resource> {
    let service = |name: &str, ports: Value, labels: Value, base: usize| {
        let endpoints: Vec<Value> = (0..2)
            .map(|k| json!({"address": address(64, base + k), "labels": labels}))
            .collect();
        object(
            Kind::ServiceEndpoints,
            ISTIO_SYSTEM,
            name,
            json!({"addresses": [address(95, base)], "ports": ports, "endpoints": endpoints}),
        )
    };
    vec![
        service(
            "istiod",
            json!([{"name": "grpc-xds", "port": 15012}, {"name": "https-webhook", "port": 443,
                    "targetPort": 15017}]),
            json!({"app": "istiod"}),
            0,
        ),
        service(
            "istio-ingressgateway",
            json!([{"name": "http2", "port": 80, "targetPort": 8080},
                   {"name": "https", "port": 443, "targetPort": 8443}]),
            json!({"istio": "ingressgateway"}),
            2,
        ),
    ]
}

/// The ingress gateway every service's ingress route binds to.
fn ingress_gateway() -> Resource {
    object(
        Kind::Gateway,
        ISTIO_SYSTEM,
        "ingress",
        json!({"selector": {"istio": "ingressgateway"}, "servers": [
            {"port": {"number": 80, "name": "http", "protocol": "HTTP"},
             "hosts": ["*/*.example.com"]}]}),
    )
}

/// The service's object in each cluster: that cluster's addresses and pods.
fn service_endpoints(
    i: usize,
    w: &Workload,
    topology: &Topology,
    rng: &mut StdRng,
) -> Vec<Resource> {
    let mut ports = vec![json!({"name": "http", "port": 80, "targetPort": 8080})];
    if i.is_multiple_of(4) {
        ports.push(json!({"name": "grpc", "port": 9090, "appProtocol": "grpc"}));
    }
    let mut by_cluster: Vec<Vec<Value>> = vec![Vec::new(); topology.clusters()];
    for p in &w.pods {
        let region = rng.random_range(0..REGIONS);
        let zone = rng.random_range(0..ZONES);
        by_cluster[p.cluster].push(json!({"address": p.ip,
               "labels": {"app": w.app, "version": p.version,
                          "security.istio.io/tlsMode": "istio"},
               "locality": format!("region-{region}/zone-{region}{zone}"),
               "serviceAccount": w.app}));
    }
    by_cluster
        .into_iter()
        .enumerate()
        .map(|(c, endpoints)| {
            let mut spec = json!({"addresses": [service_address(i, c)], "ports": ports,
                                  "endpoints": endpoints});
            topology.place(&mut spec, &w.app, c);
            object(
                Kind::ServiceEndpoints,
                &w.namespace,
                &topology.object_name(&w.app, c),
                spec,
            )
        })
        .collect()
}

fn subsets() -> Value {
    json!([{"name": "v1", "labels": {"version": "v1"}},
           {"name": "v2", "labels": {"version": "v2"}},
           {"name": "v3", "labels": {"version": "v3"}}])
}

/// The service owner's DestinationRule: subsets, load balancer, connection pool, outlier
/// detection.
fn owner_rule(w: &Workload, rng: &mut StdRng) -> Resource {
    let lb = if rng.random_bool(0.2) {
        json!({"consistentHash": {"httpHeaderName": "x-user"}})
    } else {
        json!({"simple": "LEAST_REQUEST"})
    };
    object(
        Kind::DestinationRule,
        &w.namespace,
        &w.app,
        owner_rule_spec(w, lb),
    )
}

/// The spec of the owner's rule with load balancer `lb` (the seed's batch changes it).
pub fn owner_rule_spec(w: &Workload, lb: Value) -> Value {
    json!({"host": w.app, "subsets": subsets(), "trafficPolicy": {
        "loadBalancer": lb,
        "connectionPool": {"tcp": {"maxConnections": 1000},
                           "http": {"http2MaxRequests": 1000, "maxRequestsPerConnection": 100}},
        "outlierDetection": {"consecutive5xxErrors": 5, "interval": "10s",
                             "baseEjectionTime": "30s"}}})
}

/// A consumer's override: its own timeouts towards the service, for its namespace only.
fn consumer_rule(w: &Workload, consumer: &str) -> Resource {
    object(
        Kind::DestinationRule,
        consumer,
        &format!("{}-{}-client", w.app, w.namespace),
        json!({"host": w.host, "exportTo": ["."], "subsets": subsets(), "trafficPolicy": {
            "connectionPool": {"tcp": {"connectTimeout": "2s"}}}}),
    )
}

/// The mesh route: canary users to v2 by header, the rest split by weight, with retries.
fn mesh_route(w: &Workload, rng: &mut StdRng) -> Resource {
    let canary = rng.random_range(1..=20);
    let retries = json!({"attempts": 3, "perTryTimeout": "2s", "retryOn": "5xx,connect-failure"});
    object(
        Kind::VirtualService,
        &w.namespace,
        &w.app,
        json!({"hosts": [w.app], "http": [
            {"name": "canary", "match": [{"headers": {"x-canary": {"exact": "true"}}}],
             "route": [{"destination": {"host": w.app, "subset": "v2"}}], "retries": retries},
            {"name": "split", "timeout": "10s", "retries": retries, "route": [
                {"destination": {"host": w.app, "subset": "v1"}, "weight": 100 - canary},
                {"destination": {"host": w.app, "subset": "v2"}, "weight": canary}]}]}),
    )
}

/// The ingress route: the service's public host on the ingress gateway.
fn ingress_route(w: &Workload) -> Resource {
    object(
        Kind::VirtualService,
        &w.namespace,
        &format!("{}-ingress", w.app),
        json!({"hosts": [format!("{}.{}.example.com", w.app, w.namespace)],
               "gateways": [format!("{ISTIO_SYSTEM}/ingress")],
               "http": [{"match": [{"uri": {"prefix": "/api"}}],
                         "route": [{"destination": {"host": w.host, "subset": "v1",
                                                    "port": {"number": 80}}}]}]}),
    )
}

/// A consumer's override route, for its namespace only: a fault to try its own resilience.
fn consumer_route(w: &Workload, consumer: &str) -> Resource {
    object(
        Kind::VirtualService,
        consumer,
        &format!("{}-{}-client", w.app, w.namespace),
        json!({"hosts": [w.host], "exportTo": ["."], "http": [
            {"match": [{"headers": {"x-chaos": {"exact": "delay"}}}],
             "fault": {"delay": {"percentage": {"value": 100.0}, "fixedDelay": "1s"}},
             "route": [{"destination": {"host": w.host}}]},
            {"route": [{"destination": {"host": w.host}}]}]}),
    )
}

/// The workload's Sidecar: egress to what it calls and to the mesh's own namespace.
fn sidecar(w: &Workload, all: &[Workload]) -> Resource {
    let mut hosts: Vec<String> = w
        .calls
        .iter()
        .map(|&j| format!("{}/{}", all[j].namespace, all[j].host))
        .collect();
    hosts.push(format!("{ISTIO_SYSTEM}/*"));
    object(
        Kind::Sidecar,
        &w.namespace,
        &w.app,
        json!({"workloadSelector": {"labels": {"app": w.app}},
               "egress": [{"hosts": hosts}]}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Mesh {
        Mesh::generate(Shape {
            services: 60,
            pods: 2000,
            virtual_services: 3,
            seed: 7,
            topology: Topology::default(),
            sidecars: true,
        })
    }

    #[test]
    fn the_mesh_is_what_the_seed_says() {
        let mesh = small();
        assert_eq!(mesh.pods().count(), 2000);
        assert_eq!(mesh.workloads.len(), 60);
        let count = |kind: Kind| {
            mesh.objects
                .iter()
                .filter(|o| o.kind == kind.as_str())
                .count()
        };
        // The services and the mesh's own two.
        assert_eq!(count(Kind::ServiceEndpoints), 62);
        assert_eq!(count(Kind::DestinationRule), 120);
        assert_eq!(count(Kind::VirtualService), 180);
        assert_eq!(count(Kind::Sidecar), 60);
        for w in &mesh.workloads {
            assert!(!w.pods.is_empty());
            assert!(
                (CALLS.0..=CALLS.1 + 1).contains(&w.calls.len()),
                "{} calls {}",
                w.app,
                w.calls.len()
            );
        }
        // Unique pod addresses and object identities.
        let ips: BTreeSet<&str> = mesh.pods().map(|(_, p)| p.ip.as_str()).collect();
        assert_eq!(ips.len(), 2000);
        let ids: BTreeSet<(&str, &str, &str)> = mesh
            .objects
            .iter()
            .map(|o| (o.kind.as_str(), o.namespace.as_str(), o.name.as_str()))
            .collect();
        assert_eq!(ids.len(), mesh.objects.len());
        // Deterministic.
        let again = small();
        assert_eq!(again.objects, mesh.objects);
    }

    fn three_clusters_on_two_networks() -> Mesh {
        Mesh::generate(Shape {
            services: 60,
            pods: 2000,
            virtual_services: 3,
            seed: 7,
            topology: Topology::new(crate::clusters::ClusterArgs {
                clusters: 3,
                networks: 2,
            })
            .unwrap(),
            sidecars: true,
        })
    }

    /// Each service in each cluster: PCP's own under the Service's name, the others under
    /// remote names naming the Service, each cluster's pods and network; a network gateway per
    /// cluster; the configuration once.
    #[test]
    fn a_mesh_of_three_clusters_has_each_service_in_each() {
        let mesh = three_clusters_on_two_networks();
        let spec = |ns: &str, name: &str| -> Value {
            let o = mesh
                .objects
                .iter()
                .find(|o| o.kind == "ServiceEndpoints" && o.namespace == ns && o.name == name)
                .unwrap_or_else(|| panic!("no ServiceEndpoints {ns}/{name}"));
            serde_json::from_str(&o.spec_json).unwrap()
        };
        let count = |kind: Kind| {
            mesh.objects
                .iter()
                .filter(|o| o.kind == kind.as_str())
                .count()
        };
        // 60 services in 3 clusters, the mesh's own two, 3 gateways.
        assert_eq!(count(Kind::ServiceEndpoints), 180 + 2 + 3);
        assert_eq!(count(Kind::DestinationRule), 120);
        assert_eq!(count(Kind::Sidecar), 60);
        assert_eq!(mesh.pods().count(), 2000);
        let networks = ["network-1", "network-2", "network-1"];
        for w in &mesh.workloads {
            let mut endpoints = 0;
            for (c, network) in networks.iter().enumerate() {
                let name = match c {
                    0 => w.app.clone(),
                    _ => format!("{}.cluster-{}.cluster", w.app, c + 1),
                };
                let s = spec(&w.namespace, &name);
                assert_eq!(s["cluster"], format!("cluster-{}", c + 1), "{name}");
                assert_eq!(
                    s["service"],
                    if c == 0 { json!(null) } else { json!(w.app) }
                );
                let pods: Vec<&str> = w
                    .pods
                    .iter()
                    .filter(|p| p.cluster == c)
                    .map(|p| p.ip.as_str())
                    .collect();
                let listed = s["endpoints"].as_array().unwrap();
                assert!(!listed.is_empty(), "{name} has pods");
                assert_eq!(
                    listed
                        .iter()
                        .map(|e| e["address"].as_str().unwrap())
                        .collect::<Vec<_>>(),
                    pods
                );
                assert!(listed.iter().all(|e| e["network"] == *network), "{name}");
                endpoints += listed.len();
            }
            assert_eq!(endpoints, w.pods.len());
        }
        for (c, network) in networks.iter().enumerate() {
            let name = match c {
                0 => "istio-eastwestgateway".to_string(),
                _ => format!("istio-eastwestgateway.cluster-{}.cluster", c + 1),
            };
            let s = spec(ISTIO_SYSTEM, &name);
            assert_eq!(s["cluster"], format!("cluster-{}", c + 1));
            assert_eq!(s["networkGateways"][0]["network"], *network);
            assert_eq!(s["networkGateways"][0]["port"], 15443);
        }
    }

    #[test]
    fn every_object_is_valid_as_pcp_validates_it() {
        let objects = small()
            .objects
            .into_iter()
            .chain(three_clusters_on_two_networks().objects);
        for o in objects {
            let doc = json!({"apiVersion": o.api_version, "kind": o.kind,
                "metadata": {"name": o.name, "namespace": o.namespace},
                "spec": serde_json::from_str::<Value>(&o.spec_json).expect("JSON")});
            let obj = pasa_proto::Object::from_json(
                &doc,
                "default",
                pasa_istio::generated::is_generated_object,
            )
            .expect("a sound object");
            let report = pasa_validation::validation::validate(&obj);
            assert!(
                report.errors.is_empty(),
                "{} {}/{}: {:?}",
                o.kind,
                o.namespace,
                o.name,
                report.errors
            );
        }
    }
}
