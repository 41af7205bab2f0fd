//! What a Service is to other networks, as istiod works it out: the addresses it is reached at
//! from outside its cluster (`spec.externalAddresses`) and the network gateways it is
//! (`spec.networkGateways`, for a Service labelled `topology.istio.io/network`); and the
//! gateways the mesh config's `meshNetworks` gives by DNS name.
//!
//! Gateways known by DNS name stand for the addresses the name resolves to, resolved by PCP as
//! istiod resolves them (`RESOLVE_HOSTNAME_GATEWAYS`, see [`crate::gateway_names`]): a
//! labelled Service's load balancer names, the load balancer names of a Service `meshNetworks`
//! names by `registryServiceName` (written resolved in its `externalAddresses`, which is what
//! agents read of it), and `meshNetworks` gateway addresses that are names (written as a
//! generated object of network gateways, [`mesh_network_gateways`]).

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Service};
use pasa_istio::generated::{GENERATED, PARENTS_ANNOTATION};
use pasa_istio::mesh_config::MESH_CONFIG_NAME;
use pasa_istio::mesh_networks::MeshNetworks;
use pasa_istio::service_endpoints::{DEFAULT_GATEWAY_PORT, GATEWAY_PORT_LABEL, NETWORK_LABEL};
use serde_json::{Value, json};

use super::Workloads;

/// The Service annotation (JSON labels) that makes a `NodePort` Service a gateway reached at its
/// nodes' external IPs, on the nodes those labels select (istiod's
/// `traffic.istio.io/nodeSelector`).
pub const NODE_SELECTOR_ANNOTATION: &str = "traffic.istio.io/nodeSelector";
/// The port network gateways take HBONE on (istiod's default).
pub const GATEWAY_HBONE_PORT: i32 = 15008;

/// Where a Service is reached from outside its cluster, and how its ports map there.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct External {
    /// Its load balancer's ingress addresses (an IP, else a host name, each), then its
    /// `externalIPs`; for a `NodePort` gateway with neither, the external IPs of the nodes its
    /// [`NODE_SELECTOR_ANNOTATION`] selects.
    pub addresses: Vec<String>,
    /// For a `NodePort` gateway: each service port's node port.
    pub node_ports: BTreeMap<i32, i32>,
}

/// Whether a Service is a `NodePort` gateway: of type `NodePort` and annotated with the nodes
/// it is reached on. Its addresses change with the nodes.
pub fn is_node_port_gateway(svc: &Service) -> bool {
    let annotated = svc
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(NODE_SELECTOR_ANNOTATION));
    annotated && svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("NodePort")
}

/// Where a Service is reached from outside its cluster, as istiod reads it: a `LoadBalancer`'s
/// ingress addresses (an IP, else a host name: names are not resolved here, as cloud load
/// balancers' names do not keep their addresses), then `externalIPs` (of any type). A
/// `NodePort` gateway ([`is_node_port_gateway`]) with neither is reached at the `ExternalIP` of
/// each node whose labels include those of its annotation (a JSON map; one that does not read
/// selects every node, as istiod's reading of it does), sorted; and through the node ports.
pub fn external_addresses(svc: &Service, workloads: &impl Workloads) -> External {
    let spec = svc.spec.as_ref();
    let kind = spec.and_then(|s| s.type_.as_deref());
    let mut addresses: Vec<String> = Vec::new();
    if kind == Some("LoadBalancer") {
        let ingress = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref());
        for i in ingress.into_iter().flatten() {
            match (i.ip.as_deref(), i.hostname.as_deref()) {
                (Some(ip), _) if !ip.is_empty() => addresses.push(ip.to_string()),
                (_, Some(host)) if !host.is_empty() => addresses.push(host.to_string()),
                _ => {}
            }
        }
    }
    addresses.extend(
        spec.and_then(|s| s.external_ips.as_ref())
            .into_iter()
            .flatten()
            .filter(|ip| !ip.is_empty())
            .cloned(),
    );
    let mut node_ports = BTreeMap::new();
    if is_node_port_gateway(svc) {
        for p in spec.and_then(|s| s.ports.as_ref()).into_iter().flatten() {
            if let Some(node_port) = p.node_port {
                node_ports.insert(p.port, node_port);
            }
        }
        if addresses.is_empty() {
            let selector: BTreeMap<String, String> = svc
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(NODE_SELECTOR_ANNOTATION))
                .and_then(|v| serde_json::from_str(v).ok())
                .unwrap_or_default();
            let mut at: Vec<String> = workloads
                .nodes()
                .iter()
                .filter(|node| {
                    let labels = node.metadata.labels.as_ref();
                    selector
                        .iter()
                        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
                })
                .filter_map(|node| node_external_ip(node))
                .collect();
            at.sort();
            at.dedup();
            addresses = at;
        }
    }
    External {
        addresses,
        node_ports,
    }
}

/// A node's first `ExternalIP` address.
fn node_external_ip(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "ExternalIP" && !a.address.is_empty())
        .map(|a| a.address.clone())
}

/// The network gateways a Service is, as istiod works them out from a Service labelled
/// `topology.istio.io/network`: one per address it is reached at from outside its cluster
/// (`addresses`), into that network, on the port its `networking.istio.io/gatewayPort` label
/// names (15443 when absent or not a port) and, when it has a port 15008, for HBONE too. A
/// `NodePort` gateway is reached on the node port of that port. An address that is a DNS name
/// (a cloud load balancer's) stands for the addresses it resolves to, as istiod resolves it
/// (`workloads` tells them; one not resolved yet is no gateway yet). A Service with
/// neither port is no gateway (istiod says so in a warning, as here). One that takes HBONE
/// alone is written with port 0, as istiod keeps it: sidecars do not use it, but it counts
/// among its network's gateways.
pub fn network_gateways(
    svc: &Service,
    external: &External,
    workloads: &impl Workloads,
) -> Vec<Value> {
    let labels = svc.metadata.labels.as_ref();
    let Some(network) = labels
        .and_then(|l| l.get(NETWORK_LABEL))
        .filter(|n| !n.is_empty())
    else {
        return Vec::new();
    };
    let shown = || {
        format!(
            "{}/{}",
            svc.metadata.namespace.as_deref().unwrap_or_default(),
            svc.metadata.name.as_deref().unwrap_or_default()
        )
    };
    let mut port = DEFAULT_GATEWAY_PORT as i32;
    if let Some(text) = labels.and_then(|l| l.get(GATEWAY_PORT_LABEL)) {
        match text.parse::<i32>() {
            Ok(n) => port = n,
            Err(_) => tracing::warn!(service = %shown(), value = %text,
                "the {GATEWAY_PORT_LABEL} label is not a number; the gateway port is {DEFAULT_GATEWAY_PORT}"),
        }
    }
    let ports = svc.spec.as_ref().and_then(|s| s.ports.as_ref());
    let has = |n: i32| ports.into_iter().flatten().any(|p| p.port == n);
    let (mtls, hbone) = (has(port), has(GATEWAY_HBONE_PORT));
    if !mtls && !hbone {
        tracing::warn!(service = %shown(), network = %network,
            "labelled a network gateway, but it has neither port {port} nor port \
             {GATEWAY_HBONE_PORT}: not a gateway");
        return Vec::new();
    }
    let reached = |port: i32| external.node_ports.get(&port).copied().unwrap_or(port);
    let port = if mtls { reached(port) } else { 0 };
    let addresses = resolved(&external.addresses, workloads);
    addresses
        .iter()
        .map(|address| {
            let mut gateway = json!({"network": network, "address": address, "port": port});
            if hbone {
                gateway["hbonePort"] = json!(reached(GATEWAY_HBONE_PORT));
            }
            gateway
        })
        .collect()
}

/// `addresses` with each DNS name among them replaced by the addresses it resolves to, as last
/// resolved (`workloads` tells them; a name not resolved yet is left out).
pub fn resolved(addresses: &[String], workloads: &impl Workloads) -> Vec<String> {
    addresses
        .iter()
        .flat_map(|address| match address.parse::<IpAddr>() {
            Ok(_) => vec![address.clone()],
            Err(_) => workloads
                .gateway_addresses(address)
                .unwrap_or_default()
                .iter()
                .map(ToString::to_string)
                .collect(),
        })
        .collect()
}

/// The store name of the network gateways `meshNetworks` gives by DNS name.
pub fn mesh_network_gateways_name() -> String {
    format!("{MESH_CONFIG_NAME}~{GENERATED}~network")
}

/// The gateways the mesh config's `meshNetworks` gives by an address that is a DNS name, at
/// the addresses it resolves to (`resolve`: as last resolved, none yet: none), as a
/// `ServiceEndpoints` holding only network gateways, in the mesh's root namespace; `None` when
/// there are none. Those given by IP address agents read from the mesh config itself; those
/// given by `registryServiceName` are their Service's external addresses.
pub fn mesh_network_gateways(
    mesh: &MeshNetworks,
    root_namespace: &str,
    resolve: impl Fn(&str) -> Option<Vec<IpAddr>>,
) -> Option<Value> {
    let mut gateways = Vec::new();
    for (network, n) in &mesh.networks {
        for g in &n.gateways {
            if g.address.is_empty() || g.address.parse::<IpAddr>().is_ok() {
                continue;
            }
            for ip in resolve(&g.address).unwrap_or_default() {
                gateways
                    .push(json!({"network": network, "address": ip.to_string(), "port": g.port}));
            }
        }
    }
    if gateways.is_empty() {
        return None;
    }
    Some(json!({
        "apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
        "metadata": {"name": mesh_network_gateways_name(), "namespace": root_namespace,
                     "annotations": {PARENTS_ANNOTATION:
                                     format!("MeshConfig/{MESH_CONFIG_NAME}.{root_namespace}")}},
        "spec": {"networkGateways": gateways},
    }))
}

/// The Services the mesh config's `meshNetworks` names as gateways (`registryServiceName`, a
/// Service's host name `<name>.<namespace>.svc.<domain_suffix>`), as (namespace, name).
pub fn registry_gateway_services(
    mesh: &MeshNetworks,
    domain_suffix: &str,
) -> std::collections::BTreeSet<(String, String)> {
    let suffix = format!(".svc.{domain_suffix}");
    mesh.networks
        .values()
        .flat_map(|n| &n.gateways)
        .filter_map(|g| {
            let (name, namespace) = g
                .registry_service_name
                .strip_suffix(&suffix)?
                .split_once('.')?;
            (!namespace.contains('.')).then(|| (namespace.to_string(), name.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::convert::Pod;

    struct Nodes(Vec<Arc<Node>>);

    impl Workloads for Nodes {
        fn pod(&self, _: &str, _: &str) -> Option<Arc<Pod>> {
            None
        }
        fn node(&self, _: &str) -> Option<Arc<Node>> {
            None
        }
        fn service(&self, _: &str, _: &str) -> Option<Arc<Service>> {
            None
        }
        fn nodes(&self) -> Vec<Arc<Node>> {
            self.0.clone()
        }
        fn gateway_addresses(&self, name: &str) -> Option<Vec<std::net::IpAddr>> {
            (name == "lb.example.com").then(|| vec!["35.9.9.9".parse().unwrap()])
        }
    }

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn node(name: &str, pool: &str, external: Option<&str>) -> Arc<Node> {
        let mut addresses = vec![json!({"type": "InternalIP", "address": "10.0.0.9"})];
        if let Some(ip) = external {
            addresses.push(json!({"type": "ExternalIP", "address": ip}));
        }
        Arc::new(from(json!({
            "metadata": {"name": name, "labels": {"pool": pool}},
            "status": {"addresses": addresses},
        })))
    }

    fn worked_out(svc: &Service, nodes: &Nodes) -> (Vec<String>, Vec<Value>) {
        let external = external_addresses(svc, nodes);
        let gateways = network_gateways(svc, &external, nodes);
        (external.addresses, gateways)
    }

    #[test]
    fn a_load_balancer_gateway_is_one_gateway_per_address() {
        let svc: Service = from(json!({
            "metadata": {"name": "eastwest", "namespace": "istio-system",
                         "labels": {"topology.istio.io/network": "n2"}},
            "spec": {"type": "LoadBalancer", "externalIPs": ["192.0.2.7"],
                     "ports": [{"name": "tls", "port": 15443}, {"name": "hbone", "port": 15008}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "35.1.2.3"},
                                                    {"hostname": "lb.example.com"}, {}]}},
        }));
        let (addresses, gateways) = worked_out(&svc, &Nodes(Vec::new()));
        assert_eq!(addresses, ["35.1.2.3", "lb.example.com", "192.0.2.7"]);
        // The load balancer's name stands for what it resolves to.
        assert_eq!(
            gateways,
            ["35.1.2.3", "35.9.9.9", "192.0.2.7"].map(|a| json!({
                "network": "n2", "address": a, "port": 15443, "hbonePort": 15008}))
        );
        // The port its label names, when the Service has it; a label that is not a number
        // leaves 15443.
        let mut labelled = svc.clone();
        let mut label = |value: &str| {
            let labels = labelled.metadata.labels.get_or_insert_default();
            labels.insert(GATEWAY_PORT_LABEL.into(), value.into());
            labelled.clone()
        };
        // A port it does not have: a gateway for HBONE alone (port 0, as istiod keeps it).
        assert_eq!(
            worked_out(&label("15444"), &Nodes(Vec::new())).1[0],
            json!({"network": "n2", "address": "35.1.2.3", "port": 0, "hbonePort": 15008})
        );
        let labelled = label("not-a-port");
        assert_eq!(worked_out(&labelled, &Nodes(Vec::new())).1.len(), 3);
        // Not labelled with a network: external addresses, no gateway.
        let mut plain = svc;
        plain.metadata.labels = None;
        let (addresses, none) = worked_out(&plain, &Nodes(Vec::new()));
        assert_eq!(addresses.len(), 3);
        assert!(none.is_empty());
    }

    #[test]
    fn a_node_port_gateway_is_reached_at_its_selected_nodes_on_the_node_port() {
        let svc: Service = from(json!({
            "metadata": {"name": "eastwest", "namespace": "istio-system",
                         "labels": {"topology.istio.io/network": "n2"},
                         "annotations": {"traffic.istio.io/nodeSelector": "{\"pool\": \"edge\"}"}},
            "spec": {"type": "NodePort",
                     "ports": [{"name": "tls", "port": 15443, "nodePort": 31443}]},
        }));
        let nodes = Nodes(vec![
            node("b", "edge", Some("198.51.100.2")),
            node("a", "edge", Some("198.51.100.1")),
            node("c", "inner", Some("198.51.100.3")),
            node("d", "edge", None),
        ]);
        assert!(is_node_port_gateway(&svc));
        let (addresses, gateways) = worked_out(&svc, &nodes);
        assert_eq!(addresses, ["198.51.100.1", "198.51.100.2"]);
        assert_eq!(
            gateways,
            [
                json!({"network": "n2", "address": "198.51.100.1", "port": 31443}),
                json!({"network": "n2", "address": "198.51.100.2", "port": 31443}),
            ]
        );
        // Without the annotation a NodePort Service is reached at no node.
        let mut plain = svc;
        plain.metadata.annotations = None;
        assert!(!is_node_port_gateway(&plain));
        assert_eq!(worked_out(&plain, &nodes), (vec![], vec![]));
    }
}
