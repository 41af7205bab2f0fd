//! The multi-network corpus (`multinetwork/` of the conformance folder): istiod's expectations
//! for the endpoints of a service spread over clusters and networks (split horizon through
//! network gateways, the mutual TLS filter of SNI-DNAT clusters) and for locality failover by
//! labels. Each case becomes store resources — one `ServiceEndpoints` per cluster (shard) of the
//! service, one per network gateway, the case's PeerAuthentications and DestinationRules — and
//! a proxy; the agent's translator builds the proxy's endpoints, which are compared with the
//! case as its README says.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, LbEndpoint};
use pasa_agent::cache::Cache;
use pasa_agent::identity::Locality;
use pasa_agent::mesh::MeshSettings;
use pasa_agent::model::proxy::{Flags, Generator, Proxy, ProxyBuild};
use pasa_agent::translate::Translator;
use pasa_istio::node::ProxyType;
use pasa_istio::service_endpoints::remote_service_name;
use pasa_proto::store::v1::Resource;
use serde::Deserialize;
use serde_json::{Value, json};

/// The corpus's `multinetwork` folder, if it is there.
pub fn dir() -> Option<PathBuf> {
    pasa_testing::conformance_dir("multinetwork").map(|dir| dir.join("multinetwork"))
}

/// An EDS case file: named environments and the cases that use them.
#[derive(Debug, Deserialize)]
pub struct EdsFile {
    pub environments: BTreeMap<String, Environment>,
    pub cases: Vec<EdsCase>,
}

#[derive(Debug, Deserialize)]
pub struct Environment {
    #[serde(default)]
    pub services: Vec<Value>,
    #[serde(default)]
    pub network_gateways: Vec<GatewaySpec>,
    pub endpoints: Shards,
}

#[derive(Debug, Deserialize)]
pub struct GatewaySpec {
    pub network: String,
    #[serde(default)]
    pub cluster: String,
    pub address: String,
    pub port: u32,
    #[serde(default)]
    pub hbone_port: u32,
}

#[derive(Debug, Deserialize)]
pub struct Shards {
    pub service: String,
    pub shards: Vec<Shard>,
}

#[derive(Debug, Deserialize)]
pub struct Shard {
    pub shard: String,
    pub endpoints: Vec<EndpointSpec>,
}

#[derive(Debug, Deserialize)]
pub struct EndpointSpec {
    pub addresses: Vec<String>,
    pub port: u32,
    pub service_port_name: String,
    #[serde(default)]
    pub network: String,
    #[serde(default)]
    pub cluster_id: String,
    #[serde(default)]
    pub tls_mode: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
pub struct EdsCase {
    pub name: String,
    #[serde(default)]
    pub flags: BTreeMap<String, bool>,
    pub environment: String,
    #[serde(default)]
    pub config: String,
    pub proxy: ProxySpec,
    pub cluster: String,
    pub expect: Expect,
}

#[derive(Debug, Deserialize)]
pub struct ProxySpec {
    pub namespace: String,
    #[serde(default)]
    pub network: String,
    #[serde(default)]
    pub cluster_id: String,
    pub ip_addresses: Vec<String>,
    pub ip_family: String,
}

#[derive(Debug, Deserialize)]
pub struct Expect {
    pub localities: Vec<ExpectLocality>,
    #[serde(default)]
    pub workload_metadata: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
pub struct ExpectLocality {
    #[serde(default)]
    pub weight: u32,
    pub endpoints: Vec<ExpectEndpoint>,
}

#[derive(Debug, Deserialize)]
pub struct ExpectEndpoint {
    pub address: String,
    pub weight: u32,
}

/// Why an EDS case cannot be run, if it cannot.
pub fn skip_reason(case: &EdsCase) -> Option<&'static str> {
    (case.proxy.ip_family == "unknown").then_some(
        "the original test forces the IP family of a proxy that has an IPv4 address to \
         \"unknown\"; the agent works a proxy's family out of its addresses, so it cannot be \
         told apart from an IPv4 proxy",
    )
}

/// The store resources of an environment and a case's config.
pub fn eds_resources(env: &Environment, config: &str) -> Result<Vec<Resource>, String> {
    let mut docs = Vec::new();
    let service = &env.endpoints.service;
    let (name, namespace) = service
        .split_once('.')
        .and_then(|(n, rest)| Some((n, rest.split_once('.')?.0)))
        .ok_or_else(|| format!("service {service:?} is not <name>.<namespace>.svc..."))?;
    let port = env
        .services
        .iter()
        .find(|s| s.get("hostname").and_then(Value::as_str) == Some(service.as_str()))
        .and_then(|s| s.pointer("/ports/0"))
        .cloned()
        .ok_or_else(|| format!("no port for {service}"))?;
    let port_name = port.get("name").and_then(Value::as_str).unwrap_or_default();
    let port_number = port.get("port").and_then(Value::as_u64).unwrap_or_default();
    for shard in &env.endpoints.shards {
        // The endpoints' own cluster (a shard whose endpoints name none is PCP's own,
        // unnamed cluster: the Service's own object).
        let cluster = shard
            .endpoints
            .first()
            .map_or(shard.shard.as_str(), |e| e.cluster_id.as_str());
        let endpoints: Vec<Value> = shard
            .endpoints
            .iter()
            .map(|e| {
                let mut labels = e.labels.clone();
                if !e.tls_mode.is_empty() {
                    labels.insert("security.istio.io/tlsMode".into(), e.tls_mode.clone());
                }
                json!({
                    "address": e.addresses.first().cloned().unwrap_or_default(),
                    "labels": labels,
                    "network": e.network,
                    "ports": {e.service_port_name.clone(): e.port},
                })
            })
            .collect();
        let mut spec = json!({
            "addresses": ["10.96.0.10"],
            "ports": [{"name": port_name, "port": port_number, "targetPort": port_name}],
            "endpoints": endpoints,
        });
        let object_name = if cluster.is_empty() {
            name.to_string()
        } else {
            spec["service"] = json!(name);
            spec["cluster"] = json!(cluster);
            remote_service_name(name, cluster)
        };
        docs.push(json!({
            "apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
            "metadata": {"name": object_name, "namespace": namespace}, "spec": spec,
        }));
    }
    for (i, g) in env.network_gateways.iter().enumerate() {
        docs.push(json!({
            "apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
            "metadata": {"name": format!("network-gateway-{i}"), "namespace": "istio-system"},
            "spec": {
                "cluster": g.cluster,
                "networkGateways": [{"network": g.network, "address": g.address,
                    "port": g.port, "hbonePort": g.hbone_port}],
            },
        }));
    }
    docs.extend(super::documents(config, "config")?);
    in_order(&docs)
}

/// Store resources of `docs`, each created at its own revision, in order.
fn in_order(docs: &[Value]) -> Result<Vec<Resource>, String> {
    let mut resources = Vec::new();
    for (doc, revision) in docs.iter().zip(1u64..) {
        let mut r = super::store_resource(doc, "cluster.local")?;
        r.create_revision = revision;
        r.mod_revision = revision;
        r.version = 1;
        resources.push(r);
    }
    Ok(resources)
}

/// The proxy of an EDS case: a sidecar of Istio's proxy (its endpoints name their workloads).
pub fn eds_proxy(case: &EdsCase) -> Result<Proxy, String> {
    let ips = case
        .proxy
        .ip_addresses
        .iter()
        .map(|ip| ip.parse().map_err(|_| format!("proxy IP {ip:?}")))
        .collect::<Result<Vec<_>, String>>()?;
    Ok(proxy(
        ips,
        &case.proxy.namespace,
        (&case.proxy.cluster_id, &case.proxy.network),
        (Locality::default(), BTreeMap::new()),
        Flags {
            prefer_hbone: case
                .flags
                .get("PILOT_PREFER_SENDING_HBONE")
                .copied()
                .unwrap_or(false),
            ..Flags::default()
        },
    ))
}

fn proxy(
    ips: Vec<std::net::IpAddr>,
    namespace: &str,
    (cluster, network): (&str, &str),
    (locality, labels): (Locality, BTreeMap<String, String>),
    flags: Flags,
) -> Proxy {
    Proxy {
        kind: ProxyType::Sidecar,
        ips,
        namespace: namespace.to_string(),
        config_namespace: namespace.to_string(),
        labels,
        dns_domain: format!("{namespace}.svc.cluster.local"),
        cluster_id: cluster.to_string(),
        network: network.to_string(),
        requested_network_view: Vec::new(),
        mesh_id: String::new(),
        pod_name: "app".into(),
        service_cluster: format!("app.{namespace}"),
        locality,
        mesh: MeshSettings::default(),
        flags,
        dns_capture: false,
        dns_auto_allocate: false,
        build: ProxyBuild::Istio,
        proxy_config: None,
        learned: None,
    }
}

/// The load assignment of `cluster` the translator builds for `proxy` from `resources`. An
/// SNI-DNAT cluster (`outbound_.<port>_.<subset>_.<host>`) is what an `AUTO_PASSTHROUGH`
/// gateway would serve: the outbound cluster's endpoints that take Istio mutual TLS.
pub fn load_assignment(
    proxy: Proxy,
    resources: Vec<Resource>,
    cluster: &str,
) -> Result<ClusterLoadAssignment, String> {
    let revision = resources.iter().map(|r| r.mod_revision).max().unwrap_or(0);
    let cache = Cache::from_resources(resources, revision);
    let generated = Translator::new(proxy)
        .update(&cache, Generator::Envoy)
        .map_err(|e| e.to_string())?;
    let outbound = match sni_dnat(cluster) {
        Some(outbound) => outbound,
        None => cluster.to_string(),
    };
    let mut assignment = generated
        .endpoints
        .get(&outbound)
        .cloned()
        .ok_or_else(|| format!("no endpoints for {outbound}"))?;
    if outbound != cluster {
        pasa_agent::translate::keep_mtls_only(&mut assignment);
    }
    Ok(assignment)
}

/// `outbound_.<port>_.<subset>_.<host>` as `outbound|<port>|<subset>|<host>`.
fn sni_dnat(cluster: &str) -> Option<String> {
    let rest = cluster.strip_prefix("outbound_.")?;
    let (port, rest) = rest.split_once("_.")?;
    let (subset, host) = rest.split_once("_.")?;
    Some(format!("outbound|{port}|{subset}|{host}"))
}

/// An endpoint's address as the original test reads it: its socket address, or the host of an
/// internal address's endpoint ID.
fn address(e: &LbEndpoint) -> String {
    use envoy_types::pb::envoy::config::core::v3::address::Address;
    use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
    let Some(HostIdentifier::Endpoint(endpoint)) = &e.host_identifier else {
        return String::new();
    };
    match endpoint.address.as_ref().and_then(|a| a.address.as_ref()) {
        Some(Address::SocketAddress(s)) => s.address.clone(),
        Some(Address::EnvoyInternalAddress(i)) => i
            .endpoint_id
            .rsplit_once(':')
            .map_or(i.endpoint_id.clone(), |(h, _)| {
                h.trim_matches(['[', ']']).to_string()
            }),
        _ => String::new(),
    }
}

/// What the original test asserts, compared (see the corpus README): localities by position
/// (sorted by their first endpoint's address), their weights, each endpoint's weight by
/// address, and the workload metadata in output order.
pub fn compare(expect: &Expect, got: &ClusterLoadAssignment) -> Vec<String> {
    let mut diffs = Vec::new();
    let mut localities: Vec<_> = got.endpoints.iter().collect();
    localities.sort_by_key(|l| l.lb_endpoints.first().map(address).unwrap_or_default());
    if localities.len() != expect.localities.len() {
        diffs.push(format!(
            "{} localities, expected {}",
            localities.len(),
            expect.localities.len()
        ));
        return diffs;
    }
    for (i, (l, want)) in localities.iter().zip(&expect.localities).enumerate() {
        let weight = l.load_balancing_weight.map_or(0, |w| w.value);
        if weight != want.weight {
            diffs.push(format!(
                "locality {i}: weight {weight}, expected {}",
                want.weight
            ));
        }
        let got: Vec<(String, u32)> = l
            .lb_endpoints
            .iter()
            .map(|e| (address(e), e.load_balancing_weight.map_or(0, |w| w.value)))
            .collect();
        let mut sorted_got = got.clone();
        sorted_got.sort();
        let mut sorted_want: Vec<(String, u32)> = want
            .endpoints
            .iter()
            .map(|e| (e.address.clone(), e.weight))
            .collect();
        sorted_want.sort();
        if sorted_got != sorted_want {
            diffs.push(format!(
                "locality {i}: endpoints {sorted_got:?}, expected {sorted_want:?}"
            ));
        }
    }
    if let Some(want) = &expect.workload_metadata {
        let got: Vec<String> = got
            .endpoints
            .iter()
            .flat_map(|l| &l.lb_endpoints)
            .map(|e| {
                e.metadata
                    .as_ref()
                    .and_then(|m| m.filter_metadata.get("istio"))
                    .and_then(|s| s.fields.get("workload"))
                    .and_then(|v| match &v.kind {
                        Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(s)) => {
                            Some(s.clone())
                        }
                        _ => None,
                    })
                    .unwrap_or_default()
            })
            .collect();
        if &got != want {
            diffs.push(format!("workload metadata {got:?}, expected {want:?}"));
        }
    }
    diffs
}

/// A failover-priority case (`locality-failover-priority.yaml`).
#[derive(Debug, Deserialize)]
pub struct FailoverCase {
    pub name: String,
    pub mesh: Value,
    pub config: String,
    pub proxy: FailoverProxy,
    pub localities: Vec<FailoverLocality>,
    pub expect: FailoverExpect,
}

#[derive(Debug, Deserialize)]
pub struct FailoverProxy {
    pub locality: LocalitySpec,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
pub struct LocalitySpec {
    #[serde(default)]
    pub region: String,
    #[serde(default)]
    pub zone: String,
    #[serde(default)]
    pub sub_zone: String,
}

impl LocalitySpec {
    fn text(&self) -> String {
        format!("{}/{}/{}", self.region, self.zone, self.sub_zone)
    }
}

#[derive(Debug, Deserialize)]
pub struct FailoverLocality {
    pub locality: LocalitySpec,
    pub endpoints: Vec<FailoverEndpoint>,
}

#[derive(Debug, Deserialize)]
pub struct FailoverEndpoint {
    pub addresses: Vec<String>,
    pub port: u32,
    #[serde(default)]
    pub weight: u32,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
pub struct FailoverExpect {
    pub localities: Vec<FailoverExpectLocality>,
}

#[derive(Debug, Deserialize)]
pub struct FailoverExpectLocality {
    pub priority: u32,
    pub weight: u32,
}

/// Why a failover case cannot be run, if it cannot.
pub fn failover_skip_reason(case: &FailoverCase) -> Option<&'static str> {
    let mut seen = std::collections::BTreeSet::new();
    let repeated = case
        .localities
        .iter()
        .any(|l| !seen.insert(l.locality.text()));
    repeated.then_some(
        "the Go fixture hands the function the same locality twice, in an order no endpoint \
         builder makes (istiod, like the agent, groups a cluster's endpoints by locality, \
         sorted); run through the translator, the repeated localities become one",
    )
}

/// A failover case run through the translator: a STATIC ServiceEntry for the DestinationRule's
/// host holding the case's endpoints in their localities, the mesh's locality setting, and a
/// proxy in the case's locality with its labels. Returns the differences from what the test
/// asserts (the count of localities, and each one's weight and priority, by position).
pub fn run_failover(case: &FailoverCase) -> Result<Vec<String>, String> {
    let config = super::documents(&case.config, "config")?;
    let host = config
        .iter()
        .find_map(|d| d.pointer("/spec/host").and_then(Value::as_str))
        .ok_or("no DestinationRule host")?
        .to_string();
    let port = case
        .localities
        .first()
        .and_then(|l| l.endpoints.first())
        .map_or(80, |e| e.port);
    let endpoints: Vec<Value> = case
        .localities
        .iter()
        .flat_map(|l| {
            l.endpoints.iter().map(move |e| {
                json!({"address": e.addresses[0], "labels": e.labels,
                       "locality": l.locality.text(), "weight": e.weight.max(1)})
            })
        })
        .collect();
    let mut docs = vec![
        json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": "test", "namespace": "default"},
            "spec": {"hosts": [host], "location": "MESH_INTERNAL", "resolution": "STATIC",
                     "ports": [{"number": port, "name": "tcp", "protocol": "TCP"}],
                     "endpoints": endpoints}}),
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "MeshConfig",
            "metadata": {"name": "mesh", "namespace": "istio-system"}, "spec": case.mesh}),
    ];
    docs.extend(config);
    let resources = in_order(&docs)?;
    let l = &case.proxy.locality;
    let proxy = proxy(
        vec!["10.0.0.100".parse().map_err(|_| "proxy IP")?],
        "default",
        ("", ""),
        (
            Locality {
                region: l.region.clone(),
                zone: l.zone.clone(),
                subzone: l.sub_zone.clone(),
            },
            case.proxy.labels.clone(),
        ),
        Flags::default(),
    );
    let got = load_assignment(proxy, resources, &format!("outbound|{port}||{host}"))?;
    let mut diffs = Vec::new();
    if got.endpoints.len() != case.expect.localities.len() {
        diffs.push(format!(
            "{} localities, expected {}",
            got.endpoints.len(),
            case.expect.localities.len()
        ));
        return Ok(diffs);
    }
    for (i, (l, want)) in got
        .endpoints
        .iter()
        .zip(&case.expect.localities)
        .enumerate()
    {
        let weight = l.load_balancing_weight.map_or(0, |w| w.value);
        if (l.priority, weight) != (want.priority, want.weight) {
            diffs.push(format!(
                "locality {i}: priority {} weight {weight}, expected priority {} weight {}",
                l.priority, want.priority, want.weight
            ));
        }
    }
    Ok(diffs)
}

/// A locality-setting case (`locality-lb-setting.yaml`).
#[derive(Debug, Deserialize)]
pub struct SettingCase {
    pub name: String,
    pub mesh: Option<Value>,
    pub destination_rule: Option<Value>,
    pub service: Option<Value>,
    pub expect: Option<Value>,
}

/// The differences between the setting the agent takes as in force and the case's.
pub fn run_setting(case: &SettingCase) -> Result<Vec<String>, String> {
    use pasa_istio::destination_rule::LocalityLoadBalancerSetting;
    let read =
        |v: &Option<Value>, what: &str| -> Result<Option<LocalityLoadBalancerSetting>, String> {
            v.clone()
                .map(serde_json::from_value)
                .transpose()
                .map_err(|e| format!("{what}: {e}"))
        };
    let mesh = read(&case.mesh, "mesh")?;
    let dr = read(&case.destination_rule, "destination_rule")?;
    let want = read(&case.expect, "expect")?;
    let distribution = case
        .service
        .as_ref()
        .and_then(|s| s.get("trafficDistribution"))
        .and_then(Value::as_str)
        .and_then(pasa_istio::service_endpoints::TrafficDistribution::parse);
    let (got, _) =
        pasa_agent::translate::effective_locality_setting(mesh.as_ref(), dr.as_ref(), distribution);
    let got = got.map(std::borrow::Cow::into_owned);
    Ok(if got == want {
        Vec::new()
    } else {
        vec![format!("setting {got:?}, expected {want:?}")]
    })
}

/// The case files of the folder, by name.
pub fn files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    files
}
