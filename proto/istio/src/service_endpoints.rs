//! The store's own `ServiceEndpoints` kind (`pasa.io/v1alpha1`): a Kubernetes Service with its
//! endpoints, as the Kubernetes syncer writes it (or a user with `pasactl apply`). Its name
//! and namespace are the Service's; its host is `<name>.<namespace>.svc.<domain suffix>`.
//!
//! ```yaml
//! apiVersion: pasa.io/v1alpha1
//! kind: ServiceEndpoints
//! metadata: {name: reviews, namespace: default}
//! spec:
//!   addresses: [10.96.0.12]          # the Service's cluster IPs; none = headless
//!   ports:
//!   - {name: http, port: 9080, targetPort: 9080}
//!   endpoints:
//!   - address: 10.42.0.7
//!     labels: {app: reviews, version: v1}
//!     locality: us-east1/us-east1-b
//!   - {address: 10.42.0.9, ready: false}   # not ready: sent as UNHEALTHY, takes no traffic
//! ```
//!
//! An endpoint is ready unless it says `ready: false`. As istiod does, a proxy is told of an
//! endpoint that is not ready (Kubernetes' `ready` condition false, the pod not terminating) as
//! UNHEALTHY: it sends it no traffic, but counts it, and sees it change without a new endpoint
//! list. Only a cluster whose DestinationRule sets `outlierDetection.minHealthPercent` above 0
//! leaves it out (that panic threshold would send traffic to it). Terminating endpoints are not
//! written at all, but for a service with persistent sessions (labelled
//! `istio.io/persistent-session` or `istio.io/persistent-session-header`): there an endpoint
//! that is terminating but still serving is written `ready: false, draining: true`, and proxies
//! get it as DRAINING, so that the sessions it holds can finish on it (as istiod, which also
//! sends any endpoint labelled `istio.io/draining` as DRAINING). New requests never go to it.
//!
//! A large Service's endpoints may also come in parts, one object per Kubernetes EndpointSlice
//! (at most 100 endpoints each), so that one pod's change rewrites its slice, not the whole
//! service. A part names its service in `spec.service` and carries only endpoints, with the port
//! each serves per service port name (`endpointPorts`, as an EndpointSlice lists them); the
//! service object carries the rest. Agents merge the parts into the service: its endpoints are
//! the service object's own, then each part's in name order. The Kubernetes syncer names a part
//! `<slice name>.endpointslice`, a name no Service can have (Service names have no dots).
//!
//! ```yaml
//! apiVersion: pasa.io/v1alpha1
//! kind: ServiceEndpoints
//! metadata: {name: reviews-7xk2p.endpointslice, namespace: default}
//! spec:
//!   service: reviews
//!   endpointPorts: {http: 9080}
//!   endpoints:
//!   - {address: 10.42.0.8, labels: {app: reviews, version: v2}}
//! ```

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::common::Protocol;

/// A Kubernetes Service and its endpoints: owned ([`Endpoint`]), or, where a large service is
/// read often (the agent), borrowed from the JSON it is read from ([`EndpointView`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(
    deny_unknown_fields,
    rename_all = "camelCase",
    bound(deserialize = "E: Deserialize<'de>")
)]
pub struct ServiceEndpoints<E = Endpoint> {
    /// The service's virtual IPs (`clusterIPs`); empty for a headless service.
    #[serde(default)]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub ports: Vec<KubePort>,
    /// The pods' labels the Service selects (informational: endpoints are listed).
    #[serde(default)]
    pub selector: BTreeMap<String, String>,
    /// Endpoints, ready or not (see the module's documentation).
    #[serde(default)]
    pub endpoints: Vec<E>,
    /// For `type: ExternalName`: the DNS name the service stands for.
    #[serde(default)]
    pub external_name: String,
    /// Namespaces the service is visible to (the `networking.istio.io/exportTo` annotation).
    #[serde(default)]
    pub export_to: Vec<String>,
    /// Set on a part of a service's endpoints: the Service (of this namespace) they belong to.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service: String,
    /// On a part: the port its endpoints receive on, by service port name (an EndpointSlice's
    /// `ports`); a service port not listed is resolved by its `targetPort` as usual.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub endpoint_ports: BTreeMap<String, u32>,
    /// The cluster whose registry reported the service or part (istiod's cluster ID). Empty:
    /// not said (an object written by hand), which every proxy takes as its own cluster's.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    /// Where the Service is reached from outside its cluster: its load balancer's ingress
    /// addresses (IPs or host names), then its `externalIPs`. Mesh networks name gateways by
    /// service (`registryServiceName`); this is where they are.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external_addresses: Vec<String>,
    /// The network gateways this Service is (it is labelled `topology.istio.io/network`), as
    /// the syncer worked them out from the Service and its nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_gateways: Vec<NetworkGateway>,
    /// How traffic prefers near endpoints (the Service's `spec.trafficDistribution`, or its
    /// `networking.istio.io/traffic-distribution` annotation): `PreferClose`,
    /// `PreferSameZone` or `PreferSameNode`; anything else, or nothing, prefers nothing.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub traffic_distribution: String,
}

/// A Service's preference for near endpoints (see [`ServiceEndpoints::traffic_distribution`]),
/// which istiod turns into failover by network and locality.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrafficDistribution {
    /// `PreferClose` or `PreferSameZone`: the same network, region and zone first.
    PreferSameZone,
    /// `PreferSameNode`: ... and the same subzone and node.
    PreferSameNode,
}

impl TrafficDistribution {
    /// The preference a Service's field or annotation states, if any.
    pub fn parse(written: &str) -> Option<TrafficDistribution> {
        match written {
            "PreferClose" | "PreferSameZone" => Some(TrafficDistribution::PreferSameZone),
            "PreferSameNode" => Some(TrafficDistribution::PreferSameNode),
            _ => None,
        }
    }
}

/// A gateway into a network: traffic for the network's endpoints that comes from another
/// network goes to it (Istio mutual TLS, the endpoint's cluster named by SNI), as istiod's
/// `NetworkGateway`.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NetworkGateway {
    /// The network it leads into.
    pub network: String,
    /// An IP, or a DNS name (resolved before use).
    pub address: String,
    /// The port for Istio mutual TLS (by default 15443).
    pub port: u32,
    /// The port for HBONE, if it takes HBONE (ambient); 0: it does not.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hbone_port: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The label naming a workload's (or a network gateway Service's) network.
pub const NETWORK_LABEL: &str = "topology.istio.io/network";
/// The label of a network gateway Service naming the port it takes mutual TLS on.
pub const GATEWAY_PORT_LABEL: &str = "networking.istio.io/gatewayPort";
/// The port network gateways take mutual TLS on unless their Service says otherwise.
pub const DEFAULT_GATEWAY_PORT: u32 = 15443;
/// The value the store indexes a network gateway Service under (in its gateways dimension):
/// proxies follow every network gateway with one subscription rule.
pub const NETWORK_GATEWAYS_INDEX: &str = "network-gateways";

/// The part of the names of a remote cluster's objects that names the cluster: its ID where
/// that is a DNS label, else the ID made one (lower case, other characters `-`) with a hash of
/// the ID after it, so that two IDs never share a name.
pub fn cluster_name_part(cluster: &str) -> String {
    let mut part: String = cluster
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    if part != cluster || part.is_empty() || part.starts_with('-') || part.ends_with('-') {
        // FNV-1a: stable across builds and platforms.
        let hash = cluster.bytes().fold(0x811c_9dc5_u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        part = format!("c{}-{hash:08x}", part.trim_matches('-'));
        part = part.replace("--", "-");
    }
    part
}

/// The store name of a remote cluster's Service object: `<service>.<cluster>.cluster` (see
/// [`cluster_name_part`]). Its `spec.service` names the Service; the syncer of PCP's own
/// cluster keeps the Service's own name.
pub fn remote_service_name(service: &str, cluster: &str) -> String {
    format!(
        "{service}.{}{REMOTE_SERVICE_NAME_SUFFIX}",
        cluster_name_part(cluster)
    )
}

/// The suffix of a remote cluster's Service object's name.
pub const REMOTE_SERVICE_NAME_SUFFIX: &str = ".cluster";

/// The store name of the part a remote cluster's EndpointSlice holds:
/// `<slice>.<cluster>.endpointslice`.
pub fn remote_slice_name(slice: &str, cluster: &str) -> String {
    format!("{slice}.{}{SLICE_NAME_SUFFIX}", cluster_name_part(cluster))
}

/// A Service port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubePort {
    /// The port's name; its prefix (`http-…`, `grpc-…`) tells Istio the protocol.
    #[serde(default)]
    pub name: String,
    pub port: u32,
    /// `TCP` (default), `UDP` or `SCTP`: the transport, not the application protocol.
    #[serde(default)]
    pub protocol: String,
    /// Where the endpoints receive: a number, or the name of a container port (see
    /// [`Endpoint::ports`]). Absent: the same as `port`.
    #[serde(default)]
    pub target_port: Option<TargetPort>,
    /// `appProtocol` (`http`, `grpc`, `kubernetes.io/h2c`, …): wins over the name.
    #[serde(default)]
    pub app_protocol: String,
}

/// `targetPort`: a number or a named container port.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum TargetPort {
    Number(u32),
    Name(String),
}

/// One endpoint (a pod or VM address).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Endpoint {
    pub address: String,
    /// The workload's labels (subsets select on them).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Container ports by name, for named `targetPort`s.
    #[serde(default)]
    pub ports: BTreeMap<String, u32>,
    /// `region/zone/subzone`.
    #[serde(default)]
    pub locality: String,
    /// Load-balancing weight (0: 1).
    #[serde(default)]
    pub weight: u32,
    #[serde(default)]
    pub network: String,
    #[serde(default)]
    pub service_account: String,
    /// Whether it is ready to serve (Kubernetes' `ready` condition); written only when false.
    #[serde(default = "ready", skip_serializing_if = "is_ready")]
    pub ready: bool,
    /// Whether it is shutting down but still serving the sessions it has (see the module's
    /// documentation); written only when true.
    #[serde(default, skip_serializing_if = "is_false")]
    pub draining: bool,
}

impl Default for Endpoint {
    fn default() -> Self {
        Endpoint {
            address: String::new(),
            labels: BTreeMap::new(),
            ports: BTreeMap::new(),
            locality: String::new(),
            weight: 0,
            network: String::new(),
            service_account: String::new(),
            ready: true,
            draining: false,
        }
    }
}

/// An endpoint is ready unless it says otherwise.
fn ready() -> bool {
    true
}

fn is_ready(ready: &bool) -> bool {
    *ready
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// An [`Endpoint`] read without copying its strings out of the JSON (unless they hold escapes):
/// the same fields under the same rules, which a test holds equal.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EndpointView<'a> {
    #[serde(borrow)]
    pub address: Cow<'a, str>,
    #[serde(default, borrow)]
    pub labels: BTreeMap<Cow<'a, str>, Cow<'a, str>>,
    #[serde(default, borrow)]
    pub ports: BTreeMap<Cow<'a, str>, u32>,
    #[serde(default, borrow)]
    pub locality: Cow<'a, str>,
    #[serde(default)]
    pub weight: u32,
    #[serde(default, borrow)]
    pub network: Cow<'a, str>,
    #[serde(default, borrow)]
    pub service_account: Cow<'a, str>,
    #[serde(default = "ready")]
    pub ready: bool,
    #[serde(default)]
    pub draining: bool,
}

impl From<Endpoint> for EndpointView<'static> {
    fn from(e: Endpoint) -> Self {
        EndpointView {
            address: e.address.into(),
            labels: e
                .labels
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            ports: e.ports.into_iter().map(|(k, v)| (k.into(), v)).collect(),
            locality: e.locality.into(),
            weight: e.weight,
            network: e.network.into(),
            service_account: e.service_account.into(),
            ready: e.ready,
            draining: e.draining,
        }
    }
}

impl<E> ServiceEndpoints<E> {
    /// The same service with each endpoint turned by `f`.
    pub fn map_endpoints<F>(self, f: impl FnMut(E) -> F) -> ServiceEndpoints<F> {
        ServiceEndpoints {
            addresses: self.addresses,
            ports: self.ports,
            selector: self.selector,
            endpoints: self.endpoints.into_iter().map(f).collect(),
            external_name: self.external_name,
            export_to: self.export_to,
            service: self.service,
            endpoint_ports: self.endpoint_ports,
            cluster: self.cluster,
            external_addresses: self.external_addresses,
            network_gateways: self.network_gateways,
            traffic_distribution: self.traffic_distribution,
        }
    }

    /// The name of the Service this object holds endpoints of: `spec.service` for a part, else
    /// the object's own name.
    pub fn service_name<'a>(&'a self, object_name: &'a str) -> &'a str {
        if self.service.is_empty() {
            object_name
        } else {
            &self.service
        }
    }

    /// Whether the object `object_name` holding this spec is a part of a service's endpoints
    /// (see the module's documentation): it names its service, and is not that Service as
    /// another cluster has it — the object named [`remote_service_name`] of its service and
    /// cluster, which may have no ports at all (an `ExternalName` or a headless Service).
    pub fn is_part(&self, object_name: &str) -> bool {
        !self.service.is_empty()
            && (self.cluster.is_empty()
                || object_name != remote_service_name(&self.service, &self.cluster))
    }
}

/// The suffix of the name the Kubernetes syncer gives the part of a service's endpoints that
/// an EndpointSlice holds.
pub const SLICE_NAME_SUFFIX: &str = ".endpointslice";

impl KubePort {
    /// The application protocol as istiod infers it for a Kubernetes port: `appProtocol`, else the
    /// port name's prefix before `-`, else unknown (`None`, which Istio detects by sniffing).
    /// UDP ports are UDP whatever the name.
    pub fn application_protocol(&self) -> Option<Protocol> {
        if self.protocol.eq_ignore_ascii_case("udp") {
            return Some(Protocol::Udp);
        }
        if !self.app_protocol.is_empty() {
            return match self.app_protocol.as_str() {
                "kubernetes.io/h2c" => Some(Protocol::Http2),
                "kubernetes.io/ws" => Some(Protocol::Http),
                "kubernetes.io/wss" => Some(Protocol::Https),
                other => Protocol::parse(other),
            };
        }
        let prefix = self.name.split('-').next().unwrap_or("");
        match Protocol::parse(prefix) {
            // A UDP application protocol on a TCP port is not taken from a name.
            Some(Protocol::Udp) => None,
            other => other,
        }
    }

    /// The port an endpoint receives on for this service port.
    pub fn endpoint_port(&self, endpoint: &Endpoint) -> Option<u32> {
        self.endpoint_port_by(|name| endpoint.ports.get(name).copied())
    }

    /// The port an endpoint receives on for this service port, given its container port of a
    /// name (`named`).
    pub fn endpoint_port_by(&self, named: impl FnOnce(&str) -> Option<u32>) -> Option<u32> {
        match &self.target_port {
            None => Some(self.port),
            Some(TargetPort::Number(0)) => Some(self.port),
            Some(TargetPort::Number(n)) => Some(*n),
            Some(TargetPort::Name(name)) => named(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(name: &str, app: &str) -> KubePort {
        KubePort {
            name: name.into(),
            port: 80,
            app_protocol: app.into(),
            ..Default::default()
        }
    }

    #[test]
    fn protocol_from_app_protocol_then_name() {
        assert_eq!(
            port("http-web", "").application_protocol(),
            Some(Protocol::Http)
        );
        assert_eq!(
            port("grpc", "").application_protocol(),
            Some(Protocol::Grpc)
        );
        assert_eq!(port("web", "").application_protocol(), None);
        assert_eq!(
            port("tcp", "kubernetes.io/h2c").application_protocol(),
            Some(Protocol::Http2)
        );
        assert_eq!(port("udp-dns", "").application_protocol(), None);
    }

    /// A remote cluster's objects are named for it; IDs that are not DNS labels are made one
    /// and told apart by a hash.
    #[test]
    fn remote_names_name_the_cluster() {
        assert_eq!(
            remote_service_name("reviews", "cluster2"),
            "reviews.cluster2.cluster"
        );
        assert_eq!(
            remote_slice_name("reviews-x7k2p", "cluster2"),
            "reviews-x7k2p.cluster2.endpointslice"
        );
        let upper = cluster_name_part("Kubernetes");
        let lower = cluster_name_part("kubernetes");
        assert_eq!(lower, "kubernetes");
        assert!(upper.starts_with("ckubernetes-") && upper.len() == "ckubernetes-".len() + 8);
        assert_ne!(cluster_name_part("a_b"), cluster_name_part("a.b"));
        for id in ["Kubernetes", "a_b", "_", "-x-", "east.1"] {
            let part = cluster_name_part(id);
            assert!(
                part.split('-').all(|p| !p.is_empty())
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{id} -> {part}"
            );
        }
    }

    #[test]
    fn named_target_ports_come_from_the_endpoint() {
        let mut p = port("http", "");
        p.target_port = Some(TargetPort::Name("web".into()));
        let mut ep = Endpoint::default();
        assert_eq!(p.endpoint_port(&ep), None);
        ep.ports.insert("web".into(), 8080);
        assert_eq!(p.endpoint_port(&ep), Some(8080));
        let spec: ServiceEndpoints = serde_json::from_str(
            r#"{"ports":[{"name":"http","port":80,"targetPort":"web"},{"port":81,"targetPort":9000}]}"#,
        )
        .unwrap();
        assert_eq!(spec.ports[1].target_port, Some(TargetPort::Number(9000)));
    }

    /// The borrowed endpoint reads what the owned one reads, and refuses what it refuses.
    #[test]
    fn an_endpoint_view_reads_as_the_endpoint_does() {
        let documents = [
            r#"{"address":"10.1.0.7","labels":{"app":"reviews","version":"v1"},"ports":{"web":8080},
                "locality":"us-east1/us-east1-b","weight":3,"network":"n1","serviceAccount":"reviews"}"#,
            r#"{"address":"10.1.0.8"}"#,
            r#"{"address":"10.1.0.10","ready":false}"#,
            r#"{"address":"10.1.0.11","ready":false,"draining":true}"#,
            // Escapes cannot be borrowed: those strings are copied.
            r#"{"address":"10.1.0.9","labels":{"a\"b":"c\u0041"},"serviceAccount":"sa\/x"}"#,
        ];
        for doc in documents {
            let owned: Endpoint = serde_json::from_str(doc).unwrap();
            let view: EndpointView = serde_json::from_str(doc).unwrap();
            assert_eq!(view, EndpointView::from(owned), "{doc}");
        }
        let view: EndpointView = serde_json::from_str(documents[0]).unwrap();
        assert!(matches!(view.address, Cow::Borrowed(_)));
        let refused = [
            r#"{"address":"10.1.0.7","zone":"x"}"#,
            r#"{"labels":{"app":"x"}}"#,
            r#"{"address":"10.1.0.7","weight":-1}"#,
            r#"{"address":"10.1.0.7","ready":"no"}"#,
            r#"{"address":"10.1.0.7","draining":"yes"}"#,
        ];
        for doc in refused {
            assert!(serde_json::from_str::<Endpoint>(doc).is_err(), "{doc}");
            assert!(serde_json::from_str::<EndpointView>(doc).is_err(), "{doc}");
        }
        let spec: ServiceEndpoints<EndpointView> = serde_json::from_str(
            r#"{"ports":[{"name":"http","port":80,"targetPort":"web"}],"endpoints":[{"address":"10.1.0.7","ports":{"web":8080}}]}"#,
        )
        .unwrap();
        let target =
            spec.ports[0].endpoint_port_by(|name| spec.endpoints[0].ports.get(name).copied());
        assert_eq!(target, Some(8080));
    }
}
