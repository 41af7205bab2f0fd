//! EDS: the endpoints of a cluster (`ClusterLoadAssignment`), filtered by the subset's labels,
//! grouped by locality, with each locality weighted by the sum of its endpoints' weights (gRPC
//! clients drop a locality without a weight).

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{
    Address, HealthStatus, Locality, Metadata, SocketAddress, address,
    socket_address::PortSpecifier,
};
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, LocalityLbEndpoints};
use envoy_types::pb::google::protobuf::UInt32Value;

use pasa_istio::label_selector::selects;
use prost::Message;

use super::builders::{field_len, length_delimited, string_field};
use super::metadata;
use crate::model::authn::PeerModes;
use crate::model::registry::{Health, Instance, Service, ServicePort};

mod locality;
mod shaping;
pub use locality::effective_setting;
pub(super) use locality::{LocalityLb, ProxyPlace};
pub use shaping::keep_mtls_only;
pub(super) use shaping::{Shaping, dr_mtls};

/// The endpoints of one service port, each built and encoded once as an `LbEndpoint` and grouped
/// by locality: the load assignments of the port's clusters (the default one and one per subset)
/// are assembled from those encodings, so a subset costs a filter and a copy, not a second build.
#[derive(Debug)]
pub(super) struct PortEndpoints<'s> {
    /// In locality order, each locality once.
    localities: Vec<LocalityEndpoints<'s>>,
}

/// The endpoints of one locality, in the order the service lists them.
#[derive(Debug)]
struct LocalityEndpoints<'s> {
    /// `LocalityLbEndpoints.locality`, encoded as a field.
    locality: Vec<u8>,
    endpoints: Vec<EncodedEndpoint<'s>>,
}

/// An endpoint serving the port, with its encoded `LbEndpoint` and its weight.
#[derive(Debug)]
struct EncodedEndpoint<'s> {
    instance: &'s Instance,
    encoded: Vec<u8>,
    weight: u32,
    /// The port it is reached on.
    port: u32,
    /// Whether the encoding says it takes Istio mutual TLS.
    mtls: bool,
}

/// One locality of an assignment as it is written: its encoded `locality` field, its encoded
/// endpoints, its weight (none: unset) and its priority.
#[derive(Debug)]
struct Group<'e> {
    locality: &'e [u8],
    endpoints: Vec<std::borrow::Cow<'e, [u8]>>,
    weight: Option<u32>,
    priority: u32,
}

/// `ClusterLoadAssignment` for `cluster` with `groups`, encoded directly: the same bytes as
/// encoding the message, sized exactly (it is kept as long as it is served).
fn write_assignment(cluster: &str, groups: &[Group<'_>]) -> Vec<u8> {
    use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
    let group_len = |g: &Group| {
        g.locality.len()
            + g.endpoints
                .iter()
                .map(|e| field_len(2, e.len()))
                .sum::<usize>()
            + g.weight.map_or(0, |w| {
                prost::encoding::message::encoded_len(3, &UInt32Value { value: w })
            })
            + if g.priority == 0 {
                0
            } else {
                key_len(5) + encoded_len_varint(u64::from(g.priority))
            }
    };
    let lens: Vec<usize> = groups.iter().map(group_len).collect();
    let total = if cluster.is_empty() {
        0
    } else {
        field_len(1, cluster.len())
    } + lens.iter().map(|l| field_len(2, *l)).sum::<usize>();
    // Fields in the order a message encoding writes them: ClusterLoadAssignment's
    // cluster_name (1) and endpoints (2); LocalityLbEndpoints' locality (1), lb_endpoints
    // (2), load_balancing_weight (3) and priority (5).
    let mut out = Vec::with_capacity(total);
    string_field(1, cluster, &mut out);
    for (g, len) in groups.iter().zip(&lens) {
        length_delimited(2, *len, &mut out);
        out.extend_from_slice(g.locality);
        for e in &g.endpoints {
            length_delimited(2, e.len(), &mut out);
            out.extend_from_slice(e);
        }
        if let Some(value) = g.weight {
            prost::encoding::message::encode(3, &UInt32Value { value }, &mut out);
        }
        if g.priority != 0 {
            encode_key(5, WireType::Varint, &mut out);
            encode_varint(u64::from(g.priority), &mut out);
        }
    }
    debug_assert_eq!(out.len(), total);
    out
}

/// What a proxy's endpoints are shaped by beyond each cluster's own rule (see [`Shaping`]):
/// the mesh's networks, where the proxy is, the hosts local to each cluster, the mesh config's
/// locality load balancing, and whether HBONE is preferred.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct EndpointSettings {
    pub networks: crate::model::network::Networks,
    /// The proxy's locality (`region/zone/subzone`, empty when not known).
    pub locality: String,
    pub labels: BTreeMap<String, String>,
    pub cluster: String,
    /// The mesh config's `localityLbSetting` (Istio's default: on).
    pub mesh_locality: Option<pasa_istio::destination_rule::LocalityLoadBalancerSetting>,
    pub cluster_local: ClusterLocal,
    /// `PILOT_PREFER_SENDING_HBONE`.
    pub hbone: bool,
}

// The locality setting holds no floats: equality is an equivalence.
impl Eq for EndpointSettings {}

impl std::hash::Hash for EndpointSettings {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.networks.hash(state);
        (&self.locality, &self.labels, &self.cluster).hash(state);
        serde_json::to_string(&self.mesh_locality)
            .unwrap_or_default()
            .hash(state);
        (&self.cluster_local, self.hbone).hash(state);
    }
}

impl EndpointSettings {
    /// The settings of a proxy of `locality`, `labels` and `cluster`, in `networks`, under `mesh`.
    pub(crate) fn of(
        networks: crate::model::network::Networks,
        (locality, labels, cluster): (String, &BTreeMap<String, String>, &str),
        mesh: Option<&pasa_istio::mesh_config::MeshConfig>,
        domain_suffix: &str,
        hbone: bool,
    ) -> EndpointSettings {
        let mesh_locality = match mesh.and_then(|m| m.other.get("localityLbSetting")) {
            Some(written) => serde_json::from_value(written.clone()).ok(),
            // Istio's default mesh config turns it on.
            None => Some(pasa_istio::destination_rule::LocalityLoadBalancerSetting {
                enabled: Some(true),
                ..Default::default()
            }),
        };
        EndpointSettings {
            networks,
            locality,
            labels: labels.clone(),
            cluster: cluster.to_string(),
            mesh_locality,
            cluster_local: ClusterLocal::of(mesh, domain_suffix),
            hbone,
        }
    }

    /// Where the proxy is, for locality load balancing.
    pub(super) fn place(&self) -> ProxyPlace<'_> {
        ProxyPlace {
            locality: &self.locality,
            labels: &self.labels,
            cluster: &self.cluster,
            network: &self.networks.network,
        }
    }
}

/// The hosts whose endpoints a proxy takes only from its own cluster (istiod's cluster-local
/// hosts): `*.kube-system.svc.<domain>` and `kubernetes.default.svc.<domain>` unless the mesh
/// config says otherwise, and those its `serviceSettings` mark `clusterLocal` (a later entry
/// overrides an earlier one, the most specific host wins).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct ClusterLocal {
    hosts: BTreeMap<String, bool>,
}

impl ClusterLocal {
    fn of(mesh: Option<&pasa_istio::mesh_config::MeshConfig>, domain_suffix: &str) -> ClusterLocal {
        let mut hosts: BTreeMap<String, bool> = [
            (format!("*.kube-system.svc.{domain_suffix}"), true),
            (format!("kubernetes.default.svc.{domain_suffix}"), true),
        ]
        .into();
        let settings = mesh
            .and_then(|m| m.other.get("serviceSettings"))
            .and_then(serde_json::Value::as_array);
        for entry in settings.into_iter().flatten() {
            let local = entry
                .pointer("/settings/clusterLocal")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(false);
            let listed = entry.get("hosts").and_then(serde_json::Value::as_array);
            for host in listed.into_iter().flatten().filter_map(|h| h.as_str()) {
                hosts.insert(host.to_string(), local);
            }
        }
        ClusterLocal { hosts }
    }

    /// Whether `host`'s endpoints come from the proxy's cluster only.
    pub(crate) fn is_local(&self, host: &str) -> bool {
        if let Some(local) = self.hosts.get(host) {
            return *local;
        }
        self.hosts
            .iter()
            .filter(|(pattern, _)| {
                pattern
                    .strip_prefix('*')
                    .is_some_and(|suffix| host.ends_with(suffix))
            })
            .max_by_key(|(pattern, _)| pattern.len())
            .is_some_and(|(_, local)| *local)
    }
}

/// Where the endpoints of a service are, which their metadata says as istiod's does:
/// - an endpoint whose workload has a sidecar takes Istio mutual TLS (auto mTLS), unless a
///   PeerAuthentication of its namespace turns it off for its port (then it is sent plaintext);
/// - for Istio's proxy, each names its workload (`istio.workload`: `<workload>;<namespace>;
///   <canonical service>;<canonical revision>;<cluster>`), which Istio's stats report for a peer
///   that does not say who it is (no sidecar, or the request failed before it could). Upstream
///   Envoy reads none of it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Where<'a> {
    /// The namespace of the service's endpoints.
    pub namespace: &'a str,
    /// For Istio's proxy, the cluster the endpoints' workloads are named in.
    pub workload_cluster: Option<&'a str>,
    pub peer_modes: &'a PeerModes,
    /// For a cluster-local service: the proxy's cluster, the only one whose endpoints it takes
    /// (and those that say no cluster).
    pub local_cluster: Option<&'a str>,
}

impl<'s> PortEndpoints<'s> {
    /// The endpoints of `service` that serve `port`, which are `at`; draining ones only for a
    /// service whose persistent sessions are sent them (see [`Health`]).
    pub(super) fn new(service: &'s Service, port: &ServicePort, at: Where<'_>) -> Self {
        let draining = service
            .persistent_session
            .as_ref()
            .is_some_and(|s| s.sends_draining());
        PortEndpoints::of(
            service
                .endpoints
                .iter()
                .filter(|e| draining || e.health != Health::Draining)
                .filter(|e| {
                    at.local_cluster
                        .is_none_or(|own| e.cluster.is_empty() || *e.cluster == *own)
                })
                .filter_map(|e| Some((e, e.ports.get(&port.number).copied()?))),
            Some(at),
        )
    }

    /// Endpoints with the port each is reached on.
    fn of(endpoints: impl Iterator<Item = (&'s Instance, u32)>, at: Option<Where<'_>>) -> Self {
        let mut endpoints: Vec<EncodedEndpoint> = endpoints
            .map(|(e, target)| {
                let mtls = takes_mtls(e, target, at);
                EncodedEndpoint {
                    instance: e,
                    encoded: encoded_lb_endpoint(e, target, e.weight.max(1), mtls, at),
                    weight: e.weight.max(1),
                    port: target,
                    mtls,
                }
            })
            .collect();
        // Stable: within a locality, the service's order.
        endpoints.sort_by(|a, b| a.instance.locality.cmp(&b.instance.locality));
        let mut localities: Vec<LocalityEndpoints> = Vec::new();
        for e in endpoints {
            match localities.last_mut() {
                Some(l) if l.endpoints[0].instance.locality == e.instance.locality => {
                    l.endpoints.push(e)
                }
                _ => localities.push(LocalityEndpoints {
                    locality: LocalityLbEndpoints {
                        locality: Some(parse_locality(&e.instance.locality)),
                        ..Default::default()
                    }
                    .encode_to_vec(),
                    endpoints: vec![e],
                }),
            }
        }
        PortEndpoints { localities }
    }

    /// The load assignment of `cluster`: the endpoints that carry the `subset` labels (less
    /// those known unhealthy, unless `unhealthy`), grouped by locality, each locality weighted
    /// by the sum of its endpoints' weights, then shaped as `shaping` says (networks, mutual
    /// TLS, locality load balancing); encoded, the same bytes as encoding the message.
    pub(super) fn assignment(
        &self,
        cluster: &str,
        subset: Option<&BTreeMap<String, String>>,
        unhealthy: bool,
        shaping: &Shaping<'_>,
    ) -> Vec<u8> {
        let selected = self.localities.iter().filter_map(|locality| {
            let chosen: Vec<&EncodedEndpoint> = locality
                .endpoints
                .iter()
                .filter(|e| unhealthy || e.instance.health != Health::Unhealthy)
                .filter(|e| subset.is_none_or(|labels| selects(labels, &e.instance.labels)))
                .collect();
            (!chosen.is_empty()).then_some((locality, chosen))
        });
        if shaping.is_plain() {
            let groups: Vec<Group> = selected
                .map(|(locality, chosen)| Group {
                    locality: &locality.locality,
                    weight: Some(chosen.iter().map(|e| e.weight).sum()),
                    endpoints: chosen
                        .into_iter()
                        .map(|e| std::borrow::Cow::Borrowed(e.encoded.as_slice()))
                        .collect(),
                    priority: 0,
                })
                .collect();
            return write_assignment(cluster, &groups);
        }
        shaping::assign(cluster, selected, shaping)
    }

    /// The same, as a message (for a cluster that carries it inline).
    pub(super) fn message(
        &self,
        cluster: &str,
        subset: Option<&BTreeMap<String, String>>,
        unhealthy: bool,
    ) -> ClusterLoadAssignment {
        // Decoding what was just encoded from messages cannot fail.
        let plain = Shaping::default();
        ClusterLoadAssignment::decode(
            self.assignment(cluster, subset, unhealthy, &plain)
                .as_slice(),
        )
        .unwrap_or_default()
    }

    /// For DNS clusters: the endpoints as host names to resolve, or the service host itself when
    /// it lists none (the ServiceEntry its workload, as istiod names it).
    pub(super) fn dns(
        &self,
        cluster: &str,
        subset: Option<&BTreeMap<String, String>>,
        service: &Service,
        port: &ServicePort,
        at: Where<'_>,
    ) -> ClusterLoadAssignment {
        // Endpoints to resolve (a ServiceEntry's) have no known health.
        let assignment = self.message(cluster, subset, true);
        if !assignment.endpoints.is_empty() {
            return assignment;
        }
        let host = service
            .external_name
            .clone()
            .unwrap_or_else(|| service.hostname.clone());
        let instance = Instance {
            workload: service.source.name.as_str().into(),
            ..Instance::at(&host)
        };
        PortEndpoints::of(std::iter::once((&instance, port.target_port)), Some(at))
            .message(cluster, None, true)
    }
}

/// An endpoint as Envoy's `LbEndpoint` (its address on `port`, its health when known, its
/// weight, and whether it takes Istio mutual TLS), written directly: the same bytes as encoding the message, without
/// building it (an endpoint-heavy scope has tens of thousands, and the message's strings and
/// metadata map are most of the work of encoding one).
fn encoded_lb_endpoint(
    instance: &Instance,
    port: u32,
    weight: u32,
    mtls: bool,
    at: Option<Where<'_>>,
) -> Vec<u8> {
    use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
    // Endpoint.address (1) → Address: pipe (2) { path (1) } or socket_address (1) { address (2),
    // port_value (3) }.
    let (address_tag, address_len) = match instance.address.strip_prefix("unix://") {
        Some(path) => (
            2,
            if path.is_empty() {
                0
            } else {
                field_len(1, path.len())
            },
        ),
        None => (
            1,
            if instance.address.is_empty() {
                0
            } else {
                field_len(2, instance.address.len())
            } + key_len(3)
                + encoded_len_varint(u64::from(port)),
        ),
    };
    let address_field = field_len(address_tag, address_len);
    let endpoint_len = field_len(1, address_field);
    let weight = u64::from(weight.max(1));
    let weight_len = key_len(1) + encoded_len_varint(weight);
    let health = health_status(instance.health) as u64;
    let health_len = if health == 0 {
        0
    } else {
        key_len(2) + encoded_len_varint(health)
    };
    let tls = istio_mtls_metadata(instance).filter(|_| mtls);
    let workload = endpoint_workload(instance, at);
    // Metadata (3): its map's entries one after the other, as its encoding writes them.
    let metadata_len = tls.map_or(0, <[u8]>::len) + workload.as_ref().map_or(0, Vec::len);
    let total = if metadata_len == 0 {
        0
    } else {
        field_len(3, metadata_len)
    } + field_len(4, weight_len)
        + field_len(1, endpoint_len)
        + health_len;
    // LbEndpoint's fields in the order its message encoding writes them, by tag: the
    // host_identifier oneof's endpoint (1), health_status (2), metadata (3),
    // load_balancing_weight (4).
    let mut out = Vec::with_capacity(total);
    length_delimited(1, endpoint_len, &mut out);
    length_delimited(1, address_field, &mut out);
    length_delimited(address_tag, address_len, &mut out);
    match instance.address.strip_prefix("unix://") {
        Some(path) => string_field(1, path, &mut out),
        None => {
            string_field(2, &instance.address, &mut out);
            encode_key(3, WireType::Varint, &mut out);
            encode_varint(u64::from(port), &mut out);
        }
    }
    if health != 0 {
        encode_key(2, WireType::Varint, &mut out);
        encode_varint(health, &mut out);
    }
    if metadata_len > 0 {
        length_delimited(3, metadata_len, &mut out);
        out.extend_from_slice(tls.unwrap_or_default());
        out.extend_from_slice(workload.as_deref().unwrap_or_default());
    }
    length_delimited(4, weight_len, &mut out);
    encode_key(1, WireType::Varint, &mut out);
    encode_varint(weight, &mut out);
    debug_assert_eq!(out.len(), total);
    out
}

/// Whether an endpoint takes Istio mutual TLS unless its cluster's DestinationRule says
/// otherwise: its workload has a sidecar, and no PeerAuthentication turns it off for its port.
fn takes_mtls(instance: &Instance, port: u32, at: Option<Where<'_>>) -> bool {
    istio_mtls_metadata(instance).is_some()
        && at.is_none_or(|at| !at.peer_modes.disables(at.namespace, &instance.labels, port))
}

/// Envoy's word for an endpoint's health (UNKNOWN, the default, is not written).
fn health_status(health: Health) -> HealthStatus {
    match health {
        Health::Unknown => HealthStatus::Unknown,
        Health::Healthy => HealthStatus::Healthy,
        Health::Unhealthy => HealthStatus::Unhealthy,
        Health::Draining => HealthStatus::Draining,
    }
}

/// The entry of `LbEndpoint.metadata` for an endpoint that takes Istio mutual TLS (its workload
/// has a sidecar), encoded: the same for every such endpoint, so encoded once.
fn istio_mtls_metadata(instance: &Instance) -> Option<&'static [u8]> {
    static ENCODED: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let istio = instance
        .labels
        .get(metadata::TLS_MODE_LABEL)
        .map(String::as_str)
        == Some("istio");
    istio.then(|| {
        ENCODED
            .get_or_init(|| istio_mtls().encode_to_vec())
            .as_slice()
    })
}

/// The transport socket match of an endpoint that takes Istio mutual TLS: auto mTLS picks the
/// cluster's `tlsMode-istio` transport socket for it.
fn istio_mtls() -> Metadata {
    metadata::one_field(metadata::TRANSPORT_SOCKET_MATCH, "tlsMode", "istio")
}

/// The workload entry of `LbEndpoint.metadata` of an endpoint, for Istio's proxy only (see
/// [`Where`]): named in the endpoint's own cluster, else in the proxy's.
fn endpoint_workload(instance: &Instance, at: Option<Where<'_>>) -> Option<Vec<u8>> {
    let at = at?;
    let proxy_cluster = at.workload_cluster?;
    let cluster = if instance.cluster.is_empty() {
        proxy_cluster
    } else {
        &instance.cluster
    };
    Some(workload_metadata(instance, at.namespace, cluster))
}

/// The entry of `LbEndpoint.metadata` naming the endpoint's workload in `cluster`, encoded (an
/// unknown workload's name is left empty, as istiod leaves it). Its canonical service and
/// revision are its labels' (`service.istio.io/canonical-name`, `app.kubernetes.io/name`,
/// `app`, else the workload's name; `service.istio.io/canonical-revision`,
/// `app.kubernetes.io/version`, `version`, else none), as istiod reads them.
fn workload_metadata(instance: &Instance, namespace: &str, cluster: &str) -> Vec<u8> {
    let label = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| instance.labels.get(*k))
            .map(String::as_str)
    };
    let service = label(&[
        "service.istio.io/canonical-name",
        "app.kubernetes.io/name",
        "app",
    ])
    .unwrap_or(&instance.workload);
    let revision = label(&[
        "service.istio.io/canonical-revision",
        "app.kubernetes.io/version",
        "version",
    ])
    .filter(|r| *r != "latest")
    .unwrap_or("");
    let value = [&*instance.workload, namespace, service, revision, cluster].join(";");
    metadata::one_field("istio", "workload", &value).encode_to_vec()
}

impl Instance {
    /// An endpoint at `address` and nothing else known of it.
    fn at(address: &str) -> Instance {
        Instance {
            address: address.to_string(),
            ports: Default::default(),
            labels: Default::default(),
            locality: "".into(),
            weight: 1,
            network: "".into(),
            cluster: "".into(),
            service_account: "".into(),
            workload: "".into(),
            health: Health::Unknown,
        }
    }
}

/// A one-endpoint assignment of an inbound cluster, as istiod writes it: the address alone (no
/// locality, no weights).
pub(super) fn single(cluster: &str, address: &str, port: u32) -> ClusterLoadAssignment {
    use envoy_types::pb::envoy::config::endpoint::v3::{Endpoint, LbEndpoint, lb_endpoint};
    ClusterLoadAssignment {
        cluster_name: cluster.to_string(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: vec![LbEndpoint {
                host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                    address: Some(socket_address(address, port)),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn parse_locality(text: &str) -> Locality {
    let mut parts = text.splitn(3, '/');
    Locality {
        region: parts.next().unwrap_or("").to_string(),
        zone: parts.next().unwrap_or("").to_string(),
        sub_zone: parts.next().unwrap_or("").to_string(),
    }
}

/// An Envoy address: `ip:port`, a DNS name with a port, or a Unix socket (`unix://path`).
pub(super) fn socket_address(address: &str, port: u32) -> Address {
    if let Some(path) = address.strip_prefix("unix://") {
        return Address {
            address: Some(address::Address::Pipe(
                envoy_types::pb::envoy::config::core::v3::Pipe {
                    path: path.to_string(),
                    mode: 0,
                },
            )),
        };
    }
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: address.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::endpoint::v3::{
        Endpoint, LbEndpoint, lb_endpoint::HostIdentifier,
    };

    use super::*;

    fn instance(address: &str, locality: &str, version: &str, weight: u32) -> Instance {
        Instance {
            address: address.into(),
            ports: std::sync::Arc::new([(80, 8080)].into()),
            labels: std::sync::Arc::new(
                [
                    ("version".to_string(), version.to_string()),
                    (metadata::TLS_MODE_LABEL.to_string(), "istio".to_string()),
                ]
                .into(),
            ),
            locality: locality.into(),
            weight,
            network: "".into(),
            cluster: "".into(),
            service_account: "".into(),
            workload: "".into(),
            health: Health::Unknown,
        }
    }

    /// An endpoint as Envoy's `LbEndpoint`, built as a message: its address on `port`, its
    /// health, its weight, and whether it takes Istio mutual TLS (what [`encoded_lb_endpoint`]
    /// writes).
    fn lb_endpoint(instance: &Instance, port: u32) -> LbEndpoint {
        LbEndpoint {
            host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                address: Some(socket_address(&instance.address, port)),
                ..Default::default()
            })),
            health_status: health_status(instance.health) as i32,
            load_balancing_weight: Some(UInt32Value {
                value: instance.weight.max(1),
            }),
            // A workload with a sidecar takes Istio mTLS: auto mTLS picks the cluster's
            // `tlsMode-istio` transport socket for it.
            metadata: (instance
                .labels
                .get(metadata::TLS_MODE_LABEL)
                .map(String::as_str)
                == Some("istio"))
            .then(|| metadata::one_field(metadata::TRANSPORT_SOCKET_MATCH, "tlsMode", "istio")),
        }
    }

    /// The message an assignment encodes, written out by hand.
    fn expected(cluster: &str, groups: &[(&str, &[&Instance])]) -> ClusterLoadAssignment {
        ClusterLoadAssignment {
            cluster_name: cluster.into(),
            endpoints: groups
                .iter()
                .map(|(locality, instances)| LocalityLbEndpoints {
                    locality: Some(parse_locality(locality)),
                    lb_endpoints: instances.iter().map(|i| lb_endpoint(i, 8080)).collect(),
                    load_balancing_weight: Some(UInt32Value {
                        value: instances.iter().map(|i| i.weight.max(1)).sum(),
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn assembled_assignments_are_the_bytes_of_the_message() {
        let a = instance("10.0.0.1", "us/east-a", "v1", 1);
        let b = Instance {
            health: Health::Unhealthy,
            ..instance("10.0.0.2", "us/east-b", "v2", 3)
        };
        let c = Instance {
            health: Health::Healthy,
            ..instance("10.0.0.3", "us/east-a", "v2", 0)
        };
        let endpoints = PortEndpoints::of([&a, &b, &c].into_iter().map(|i| (i, 8080)), None);
        let all = expected(
            "outbound|80||r",
            &[("us/east-a", &[&a, &c]), ("us/east-b", &[&b])],
        );
        assert_eq!(
            endpoints.assignment("outbound|80||r", None, true, &Shaping::default()),
            all.encode_to_vec()
        );
        let v2: BTreeMap<String, String> = [("version".to_string(), "v2".to_string())].into();
        let subset = expected(
            "outbound|80|v2|r",
            &[("us/east-a", &[&c]), ("us/east-b", &[&b])],
        );
        assert_eq!(
            endpoints.assignment("outbound|80|v2|r", Some(&v2), true, &Shaping::default()),
            subset.encode_to_vec()
        );
        assert_eq!(
            endpoints.message("outbound|80|v2|r", Some(&v2), true),
            subset
        );
        let none: BTreeMap<String, String> = [("version".to_string(), "v9".to_string())].into();
        assert_eq!(
            endpoints.message("outbound|80|v9|r", Some(&none), true),
            expected("outbound|80|v9|r", &[])
        );
        // Without the unhealthy endpoint, its locality goes with it.
        assert_eq!(
            endpoints.assignment("outbound|80|v2|r", Some(&v2), false, &Shaping::default()),
            expected("outbound|80|v2|r", &[("us/east-a", &[&c])]).encode_to_vec()
        );
    }

    #[test]
    fn endpoints_written_directly_are_the_bytes_of_the_message() {
        let tls = |mode: &str| [(metadata::TLS_MODE_LABEL.to_string(), mode.to_string())];
        let cases = [
            ("10.0.0.1", 8080, 1, tls("istio").to_vec()),
            ("10.0.0.1", 0, 0, vec![]),
            ("2001:db8::1", 65535, 300, tls("disabled").to_vec()),
            ("backend.example.com", 443, 7, tls("istio").to_vec()),
            ("unix:///var/run/app.sock", 0, 1, tls("istio").to_vec()),
            ("unix://", 80, 1, vec![]),
            ("", 80, 200_000, vec![]),
        ];
        for (address, port, weight, labels) in cases {
            for health in [
                Health::Unknown,
                Health::Healthy,
                Health::Unhealthy,
                Health::Draining,
            ] {
                let mut instance = instance(address, "", "v1", weight);
                instance.labels = std::sync::Arc::new(labels.clone().into_iter().collect());
                instance.health = health;
                assert_eq!(
                    encoded_lb_endpoint(
                        &instance,
                        port,
                        instance.weight,
                        takes_mtls(&instance, port, None),
                        None
                    ),
                    lb_endpoint(&instance, port).encode_to_vec(),
                    "{address}:{port} weight {weight} {health:?} labels {:?}",
                    instance.labels
                );
            }
        }
    }

    #[test]
    fn for_istios_proxy_each_endpoint_names_its_workload_as_istiod_does() {
        use envoy_types::pb::envoy::config::endpoint::v3::LbEndpoint;
        let peer_modes = PeerModes::default();
        let at = Where {
            namespace: "bookinfo",
            workload_cluster: Some("Kubernetes"),
            peer_modes: &peer_modes,
            local_cluster: None,
        };
        let workload_of = |labels: &[(&str, &str)], workload: &str| {
            let mut instance = instance("10.0.0.1", "", "v1", 1);
            instance.labels = std::sync::Arc::new(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            instance.workload = workload.into();
            let endpoint = LbEndpoint::decode(
                encoded_lb_endpoint(
                    &instance,
                    80,
                    1,
                    takes_mtls(&instance, 80, Some(at)),
                    Some(at),
                )
                .as_slice(),
            )
            .unwrap();
            let metadata = endpoint.metadata.unwrap_or_default().filter_metadata;
            // Mutual TLS is still said beside it.
            assert_eq!(
                metadata.contains_key(metadata::TRANSPORT_SOCKET_MATCH),
                labels.contains(&(metadata::TLS_MODE_LABEL, "istio"))
            );
            metadata
                .get("istio")
                .map(|s| format!("{:?}", s.fields["workload"].kind))
        };
        let said = |s: &str| {
            Some(format!(
                "{:?}",
                Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(
                    s.into()
                ))
            ))
        };
        // Canonical service and revision from the labels, in istiod's order.
        assert_eq!(
            workload_of(
                &[
                    ("app", "reviews"),
                    ("version", "v2"),
                    (metadata::TLS_MODE_LABEL, "istio")
                ],
                "reviews-v2"
            ),
            said("reviews-v2;bookinfo;reviews;v2;Kubernetes")
        );
        assert_eq!(
            workload_of(
                &[
                    ("app", "reviews"),
                    ("service.istio.io/canonical-name", "reviews-svc"),
                    ("app.kubernetes.io/version", "2.1"),
                ],
                "reviews-v2"
            ),
            said("reviews-v2;bookinfo;reviews-svc;2.1;Kubernetes")
        );
        // Without labels: the workload's name, and no revision ("latest" is not sent).
        assert_eq!(
            workload_of(&[("version", "latest")], "db"),
            said("db;bookinfo;db;;Kubernetes")
        );
        // An unknown workload's name is empty; its canonical service still comes from its
        // labels.
        assert_eq!(
            workload_of(&[("app", "x")], ""),
            said(";bookinfo;x;;Kubernetes")
        );
        // Upstream Envoy's endpoints carry none of it.
        let mut instance = instance("10.0.0.1", "", "v1", 1);
        instance.workload = "db".into();
        let upstream = Where {
            workload_cluster: None,
            ..at
        };
        let plain = LbEndpoint::decode(
            encoded_lb_endpoint(
                &instance,
                80,
                1,
                takes_mtls(&instance, 80, Some(upstream)),
                Some(upstream),
            )
            .as_slice(),
        )
        .unwrap();
        assert!(
            !plain
                .metadata
                .unwrap_or_default()
                .filter_metadata
                .contains_key("istio")
        );
    }
}
