//! The clusters and networks a generated mesh spreads over (`--clusters`, `--networks`), and
//! how each cluster's objects are written to the store, as the syncers of a multicluster PCP
//! write them (see `pasa_istio::service_endpoints`):
//! - cluster `cluster-1` is PCP's own: a Service there is the ServiceEndpoints of the Service's
//!   own name; in cluster `cluster-<k>` it is `<service>.cluster-<k>.cluster`, naming the
//!   Service in `spec.service`, with its own addresses, ports and endpoints; both say their
//!   cluster in `spec.cluster`;
//! - the clusters are placed on networks `network-1`, `network-2`, … round-robin; with more
//!   than one network, every endpoint says its cluster's network, and each cluster has an
//!   east-west gateway Service in the root namespace (`spec.networkGateways`: its network,
//!   reached on its load balancer's address, port 15443), which every proxy follows.
//!
//! One cluster (the default) is the single-cluster store as before: objects say no cluster,
//! endpoints no network, and proxies have the agent's default cluster ID.

use anyhow::ensure;
use pasa_istio::service_endpoints::{DEFAULT_GATEWAY_PORT, remote_service_name};
use serde_json::{Value, json};

/// Clusters a mesh may spread over, at most: the generated addresses of each cluster's
/// Services stay apart up to this many.
pub const MAX_CLUSTERS: usize = 16;
/// The Service each cluster's network gateway is, in the root namespace.
pub const GATEWAY_SERVICE: &str = "istio-eastwestgateway";
/// The cluster ID of a single-cluster mesh: the agent's default (`ISTIO_META_CLUSTER_ID`).
const SINGLE_CLUSTER_ID: &str = "Kubernetes";

/// `--clusters` and `--networks`, as the modes that generate a mesh take them.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct ClusterArgs {
    /// Kubernetes clusters the services' pods are spread over (`cluster-1` is PCP's own; the
    /// others are written as remote clusters' objects).
    #[arg(long, default_value_t = 1)]
    pub clusters: usize,
    /// Networks the clusters are placed on, round-robin (at most --clusters); with more than
    /// one, each cluster has a network gateway and traffic between networks goes through them.
    #[arg(long, default_value_t = 1)]
    pub networks: usize,
}

impl Default for ClusterArgs {
    fn default() -> Self {
        ClusterArgs {
            clusters: 1,
            networks: 1,
        }
    }
}

/// The clusters and networks of a mesh (see the module's documentation). Clusters are counted
/// from 0 here; their IDs from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topology {
    clusters: usize,
    networks: usize,
}

impl Default for Topology {
    fn default() -> Self {
        Topology {
            clusters: 1,
            networks: 1,
        }
    }
}

impl Topology {
    /// The topology `args` ask for, or what is wrong with them.
    pub fn new(args: ClusterArgs) -> anyhow::Result<Topology> {
        ensure!(
            (1..=MAX_CLUSTERS).contains(&args.clusters),
            "--clusters is 1 to {MAX_CLUSTERS}"
        );
        ensure!(
            (1..=args.clusters).contains(&args.networks),
            "--networks is 1 to --clusters ({})",
            args.clusters
        );
        Ok(Topology {
            clusters: args.clusters,
            networks: args.networks,
        })
    }

    pub fn clusters(&self) -> usize {
        self.clusters
    }

    pub fn networks(&self) -> usize {
        self.networks
    }

    /// Whether objects say their cluster (more than one cluster).
    fn multicluster(&self) -> bool {
        self.clusters > 1
    }

    /// The ID of cluster `c`: `cluster-<c + 1>`, or the agent's default for a single cluster.
    pub fn cluster_id(&self, c: usize) -> String {
        if self.multicluster() {
            format!("cluster-{}", c + 1)
        } else {
            SINGLE_CLUSTER_ID.to_string()
        }
    }

    /// The network of cluster `c`: `network-<c mod networks + 1>`; none with one network.
    pub fn network(&self, c: usize) -> String {
        if self.networks > 1 {
            format!("network-{}", c % self.networks + 1)
        } else {
            String::new()
        }
    }

    /// The store name of Service `service`'s object in cluster `c`.
    pub fn object_name(&self, service: &str, c: usize) -> String {
        if c == 0 {
            service.to_string()
        } else {
            remote_service_name(service, &self.cluster_id(c))
        }
    }

    /// Makes `spec`, a Service's object, cluster `c`'s: its cluster, and for a remote cluster
    /// the Service it is of; every endpoint in the cluster's network.
    pub fn place(&self, spec: &mut Value, service: &str, c: usize) {
        if !self.multicluster() {
            return;
        }
        spec["cluster"] = json!(self.cluster_id(c));
        if c > 0 {
            spec["service"] = json!(service);
        }
        let network = self.network(c);
        if network.is_empty() {
            return;
        }
        if let Some(endpoints) = spec["endpoints"].as_array_mut() {
            for e in endpoints {
                e["network"] = json!(network);
            }
        }
    }

    /// The network gateway Services, one per cluster (its network's gateway there), as
    /// `(object name, spec)` of the root namespace; none with one network.
    pub fn gateway_services(&self) -> Vec<(String, Value)> {
        if self.networks < 2 {
            return Vec::new();
        }
        (0..self.clusters)
            .map(|c| {
                let network = self.network(c);
                let external = format!("10.90.0.{}", c + 1);
                let mut spec = json!({
                    "addresses": [format!("10.91.0.{}", c + 1)],
                    "ports": [{"name": "tls", "port": DEFAULT_GATEWAY_PORT}],
                    "endpoints": [{"address": format!("10.92.0.{}", c + 1),
                                   "labels": {"istio": "eastwestgateway"}}],
                    "externalAddresses": [external],
                    "networkGateways": [{"network": network, "address": external,
                                         "port": DEFAULT_GATEWAY_PORT}],
                });
                self.place(&mut spec, GATEWAY_SERVICE, c);
                (self.object_name(GATEWAY_SERVICE, c), spec)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology(clusters: usize, networks: usize) -> Topology {
        Topology::new(ClusterArgs { clusters, networks }).unwrap()
    }

    #[test]
    fn one_cluster_writes_what_a_single_cluster_store_holds() {
        let one = topology(1, 1);
        assert_eq!(one.cluster_id(0), "Kubernetes");
        assert_eq!(one.network(0), "");
        let mut spec = json!({"endpoints": [{"address": "10.0.0.1"}]});
        let before = spec.clone();
        one.place(&mut spec, "reviews", 0);
        assert_eq!(spec, before);
        assert!(one.gateway_services().is_empty());
    }

    #[test]
    fn clusters_are_named_and_placed_on_networks_round_robin() {
        let t = topology(3, 2);
        let ids: Vec<String> = (0..3).map(|c| t.cluster_id(c)).collect();
        assert_eq!(ids, ["cluster-1", "cluster-2", "cluster-3"]);
        let networks: Vec<String> = (0..3).map(|c| t.network(c)).collect();
        assert_eq!(networks, ["network-1", "network-2", "network-1"]);
        assert_eq!(t.object_name("reviews", 0), "reviews");
        assert_eq!(t.object_name("reviews", 2), "reviews.cluster-3.cluster");

        let mut own = json!({"endpoints": [{"address": "10.0.0.1"}]});
        t.place(&mut own, "reviews", 0);
        assert_eq!(own["cluster"], "cluster-1");
        assert!(own.get("service").is_none());
        let mut remote = json!({"endpoints": [{"address": "10.0.0.2"}]});
        t.place(&mut remote, "reviews", 1);
        assert_eq!(
            (&remote["cluster"], &remote["service"]),
            (&json!("cluster-2"), &json!("reviews"))
        );
        assert_eq!(remote["endpoints"][0]["network"], "network-2");

        let gateways = t.gateway_services();
        assert_eq!(gateways.len(), 3);
        assert_eq!(gateways[1].0, "istio-eastwestgateway.cluster-2.cluster");
        assert_eq!(gateways[1].1["networkGateways"][0]["network"], "network-2");
        assert_eq!(gateways[1].1["networkGateways"][0]["port"], 15443);
        assert!(topology(3, 1).gateway_services().is_empty());
    }

    #[test]
    fn impossible_topologies_are_refused() {
        for (clusters, networks) in [(0, 1), (2, 3), (2, 0), (MAX_CLUSTERS + 1, 1)] {
            assert!(Topology::new(ClusterArgs { clusters, networks }).is_err());
        }
    }
}
