//! Kubernetes objects as the store keeps them: Istio config as it is (name, labels,
//! annotations, spec), a Service becomes the `ServiceEndpoints` object of
//! its name (addresses, ports, selector, `ExternalName`, `exportTo`, the addresses it is reached
//! at from outside its cluster and the network gateways it is), and each of its
//! EndpointSlices a part of its endpoints (`<slice>.endpointslice`, see
//! `pasa_istio::service_endpoints`), its ready endpoints with what istiod reads of their pods
//! (labels, service account, network) and nodes (locality). Everything written carries the label
//! `pasa.io/cluster: <cluster ID>`: what the syncer of that cluster owns, and says its cluster in
//! `spec.cluster`. A remote cluster's objects have names of their own ([`ClusterNames`]).

pub mod network;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::DynamicObject;
use pasa_istio::persistent_session::PersistentSession;
use pasa_istio::service_endpoints::{
    REMOTE_SERVICE_NAME_SUFFIX, SLICE_NAME_SUFFIX, cluster_name_part,
};
use pasa_istio::workload_entry;
use pasa_proto::Kind;
use serde_json::{Map, Value, json};

/// The label on every object a cluster's syncer writes: its cluster ID.
pub const CLUSTER_LABEL: &str = "pasa.io/cluster";
/// The Service annotation istiod reads for a service's visibility.
pub const EXPORT_TO_ANNOTATION: &str = "networking.istio.io/exportTo";
/// The label EndpointSlices name their Service by.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// A pod's locality, `region.zone.subzone`, overriding its node's (istiod reads it too).
pub const LOCALITY_LABEL: &str = "istio-locality";
/// A pod's network, for multi-network meshes; on a cluster's system namespace, the network of
/// the cluster's endpoints whose pods do not say; on a Service, the network it is a gateway into.
pub use pasa_istio::service_endpoints::NETWORK_LABEL;
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const SUBZONE_LABEL: &str = "topology.istio.io/subzone";
/// Istio's label naming a pod's workload. An endpoint's labels carry it (its pod's own, else the
/// name worked out by [`workload_name`]): Istio's telemetry names the endpoint's workload by it.
pub const WORKLOAD_NAME_LABEL: &str = "service.istio.io/workload-name";

/// Where an object lives in the store.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoreKey {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl StoreKey {
    /// The ServiceEndpoints object named `name` (a cluster's syncer names its objects by
    /// [`ClusterNames`]).
    pub fn service_endpoints(namespace: &str, name: &str) -> StoreKey {
        StoreKey {
            kind: Kind::ServiceEndpoints,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// The store's request to delete this object (one already gone is not an error).
    pub fn delete_request(&self) -> pasa_proto::store::v1::DeleteRequest {
        pasa_proto::store::v1::DeleteRequest {
            refs: vec![pasa_proto::store::v1::ObjectRef {
                kind: self.kind.as_str().to_string(),
                namespace: self.namespace.clone(),
                name: self.name.clone(),
            }],
            expected_mod_revision: None,
            ignore_not_found: true,
        }
    }
}

/// Whose objects a syncer writes, and under which names. PCP's own cluster (the config
/// cluster) keeps the names of its Services and EndpointSlices (`<service>`,
/// `<slice>.endpointslice`); a remote cluster's are named for it (`<service>.<cluster>.cluster`,
/// `<slice>.<cluster>.endpointslice`, see `pasa_istio::service_endpoints`), so that the same
/// Service in two clusters is two objects, and no cluster's syncer can write, or delete, an
/// object of another's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNames {
    /// The cluster's ID: the `pasa.io/cluster` label and `spec.cluster` of what it writes.
    pub id: String,
    /// A remote cluster (names of its own), or PCP's own.
    pub remote: bool,
    /// `.<cluster>.cluster` and `.<cluster>.endpointslice` for a remote cluster.
    service_suffix: String,
    slice_suffix: String,
}

/// What a ServiceEndpoints key of a cluster stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source<'a> {
    /// The Service of this name (of the key's namespace).
    Service(&'a str),
    /// The EndpointSlice of this name.
    Slice(&'a str),
}

impl ClusterNames {
    /// PCP's own cluster, `id`.
    pub fn own(id: &str) -> ClusterNames {
        ClusterNames {
            id: id.to_string(),
            remote: false,
            service_suffix: String::new(),
            slice_suffix: SLICE_NAME_SUFFIX.to_string(),
        }
    }

    /// A remote cluster, `id`.
    pub fn remote(id: &str) -> ClusterNames {
        let part = cluster_name_part(id);
        ClusterNames {
            id: id.to_string(),
            remote: true,
            service_suffix: format!(".{part}{REMOTE_SERVICE_NAME_SUFFIX}"),
            slice_suffix: format!(".{part}{SLICE_NAME_SUFFIX}"),
        }
    }

    /// The key of the Service `name`'s object.
    pub fn service_key(&self, namespace: &str, name: &str) -> StoreKey {
        StoreKey {
            kind: Kind::ServiceEndpoints,
            namespace: namespace.to_string(),
            name: format!("{name}{}", self.service_suffix),
        }
    }

    /// The key of the part the EndpointSlice `slice` holds.
    pub fn slice_key(&self, namespace: &str, slice: &str) -> StoreKey {
        StoreKey {
            kind: Kind::ServiceEndpoints,
            namespace: namespace.to_string(),
            name: format!("{slice}{}", self.slice_suffix),
        }
    }

    /// The Service or EndpointSlice a ServiceEndpoints key of this cluster stands for; `None`
    /// for a name this cluster's syncer never writes (which it therefore deletes).
    pub fn source<'a>(&self, key: &'a StoreKey) -> Option<Source<'a>> {
        if key.kind != Kind::ServiceEndpoints {
            return None;
        }
        if let Some(slice) = key.name.strip_suffix(&self.slice_suffix) {
            return Some(Source::Slice(slice));
        }
        if self.remote {
            return key
                .name
                .strip_suffix(&self.service_suffix)
                .filter(|s| !s.contains('.'))
                .map(Source::Service);
        }
        Some(Source::Service(&key.name))
    }
}

impl std::fmt::Display for StoreKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

/// A Pod as the syncer reads it: its metadata, service account and node, nothing else. Read
/// into this shape straight from the API server's JSON, so the containers and status of
/// 100,000 pods are never held (the full `Pod` type costs kilobytes a pod even trimmed).
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PodSpec,
}

#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
}

impl kube::Resource for Pod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Pod".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What the conversion of an EndpointSlice reads of the cluster: its pods and nodes, and its
/// Service (whose labels may ask for persistent sessions).
pub trait Workloads {
    fn pod(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Pod>>;
    fn node(&self, name: &str) -> Option<std::sync::Arc<Node>>;
    fn service(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Service>>;
    /// Every node (a `NodePort` gateway Service is reached at those its annotation selects).
    fn nodes(&self) -> Vec<std::sync::Arc<Node>>;
    /// The addresses a network gateway's DNS name resolves to, as last resolved (see
    /// [`crate::gateway_names`]); none yet, or without a resolver: no gateway at that name.
    fn gateway_addresses(&self, name: &str) -> Option<Vec<std::net::IpAddr>> {
        let _ = name;
        None
    }
    /// Whether the Service `namespace/name` is a gateway the mesh config's `meshNetworks`
    /// names (`registryServiceName`): the DNS names among its external addresses then stand
    /// for what they resolve to.
    fn registry_gateway(&self, namespace: &str, name: &str) -> bool {
        let _ = (namespace, name);
        false
    }
}

/// A store document: apiVersion, kind, metadata and spec.
/// A document of PASA's own kind `key.kind`.
pub(crate) fn document(
    key: &StoreKey,
    labels: BTreeMap<String, String>,
    spec: Map<String, Value>,
) -> Value {
    json!({
        "apiVersion": format!("{}/{}", key.kind.group(), key.kind.versions()[0]),
        "kind": key.kind.as_str(),
        "metadata": {"name": key.name, "namespace": key.namespace, "labels": labels},
        "spec": spec,
    })
}

fn owned_labels(
    labels: Option<&BTreeMap<String, String>>,
    cluster: &str,
) -> BTreeMap<String, String> {
    let mut labels = labels.cloned().unwrap_or_default();
    labels.insert(CLUSTER_LABEL.to_string(), cluster.to_string());
    labels
}

/// Objects PCP generates (from Ingresses, from the Gateway API), labelled as this cluster's, as
/// documents by key.
pub fn generated(objects: Vec<pasa_proto::Object>, cluster: &str) -> BTreeMap<StoreKey, Value> {
    objects
        .into_iter()
        .map(|mut o| {
            o.labels
                .insert(CLUSTER_LABEL.to_string(), cluster.to_string());
            let key = StoreKey {
                kind: o.kind,
                namespace: o.namespace.clone(),
                name: o.name.clone(),
            };
            (key, o.to_document())
        })
        .collect()
}

/// An Istio config object as the store keeps it: its name, labels, annotations and spec, at
/// the version it was read. A WorkloadEntry whose health is checked also carries its `Healthy`
/// condition, as the `pasa.io/healthy` annotation (the store keeps no status).
pub fn config(key: &StoreKey, api_version: &str, obj: &DynamicObject, cluster: &str) -> Value {
    let mut doc = json!({
        "apiVersion": api_version,
        "kind": key.kind.as_str(),
        "metadata": {"name": key.name, "namespace": key.namespace,
                     "labels": owned_labels(obj.metadata.labels.as_ref(), cluster)},
        "spec": obj.data.get("spec").cloned().unwrap_or_else(|| json!({})),
    });
    let mut annotations = obj.metadata.annotations.clone().unwrap_or_default();
    if key.kind == Kind::WorkloadEntry && workload_entry::health_checked(&annotations) {
        annotations.insert(
            workload_entry::HEALTHY_ANNOTATION.into(),
            // No condition (not probed yet) is not healthy.
            healthy_condition(&obj.data)
                .is_some_and(|c| c["status"] == "True")
                .to_string(),
        );
    }
    if !annotations.is_empty() {
        doc["metadata"]["annotations"] = json!(annotations);
    }
    doc
}

/// A WorkloadEntry's `Healthy` condition (which istiod sets from its workload's probes), in the
/// status of its `data`.
pub(crate) fn healthy_condition(data: &Value) -> Option<&Value> {
    data.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Healthy")
}

/// The ServiceEndpoints object of a Service of `cluster`: everything but its endpoints, which
/// its EndpointSlices hold. It says its cluster (`spec.cluster`), and a remote cluster's names
/// its Service (`spec.service`, its own name being the cluster's, see [`ClusterNames`]); the
/// addresses it is reached at from outside the cluster and the network gateways it is are
/// worked out as istiod works them out ([`network::external_addresses`],
/// [`network::network_gateways`]), from
/// the Service and, for a `NodePort` gateway, the cluster's nodes (`workloads`).
pub fn service(
    svc: &Service,
    cluster: &ClusterNames,
    workloads: &impl Workloads,
) -> Option<(StoreKey, Value)> {
    let namespace = svc.metadata.namespace.as_deref()?;
    let name = svc.metadata.name.as_deref()?;
    let key = cluster.service_key(namespace, name);
    let spec = svc.spec.as_ref();
    let mut out = Map::new();
    let mut addresses: Vec<&str> = spec
        .and_then(|s| s.cluster_ips.as_ref())
        .map(|ips| ips.iter().map(String::as_str).collect())
        .unwrap_or_default();
    if addresses.is_empty()
        && let Some(ip) = spec.and_then(|s| s.cluster_ip.as_deref())
    {
        addresses.push(ip);
    }
    addresses.retain(|a| !a.is_empty() && !a.eq_ignore_ascii_case("none"));
    if !addresses.is_empty() {
        out.insert("addresses".into(), json!(addresses));
    }
    let ports: Vec<Value> = spec
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .map(|p| {
            let mut port = Map::new();
            if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
                port.insert("name".into(), json!(name));
            }
            port.insert("port".into(), json!(p.port));
            if let Some(protocol) = p.protocol.as_deref().filter(|p| *p != "TCP") {
                port.insert("protocol".into(), json!(protocol));
            }
            match &p.target_port {
                Some(IntOrString::Int(n)) if *n != p.port => {
                    port.insert("targetPort".into(), json!(n));
                }
                Some(IntOrString::String(name)) => {
                    port.insert("targetPort".into(), json!(name));
                }
                _ => {}
            }
            if let Some(app) = p.app_protocol.as_deref() {
                port.insert("appProtocol".into(), json!(app));
            }
            Value::Object(port)
        })
        .collect();
    if !ports.is_empty() {
        out.insert("ports".into(), Value::Array(ports));
    }
    if let Some(selector) = spec
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
    {
        out.insert("selector".into(), json!(selector));
    }
    if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName")
        && let Some(target) = spec.and_then(|s| s.external_name.as_deref())
    {
        out.insert("externalName".into(), json!(target));
    }
    if let Some(export_to) = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXPORT_TO_ANNOTATION))
    {
        let list: Vec<&str> = export_to
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if !list.is_empty() {
            out.insert("exportTo".into(), json!(list));
        }
    }
    if cluster.remote {
        out.insert("service".into(), json!(name));
    }
    out.insert("cluster".into(), json!(cluster.id));
    let mut external = network::external_addresses(svc, workloads);
    let gateways = network::network_gateways(svc, &external, workloads);
    // Agents find a gateway `meshNetworks` names by its Service's external addresses.
    if workloads.registry_gateway(namespace, name) {
        external.addresses = network::resolved(&external.addresses, workloads);
    }
    if !external.addresses.is_empty() {
        out.insert("externalAddresses".into(), json!(external.addresses));
    }
    if !gateways.is_empty() {
        out.insert("networkGateways".into(), json!(gateways));
    }
    let labels = owned_labels(svc.metadata.labels.as_ref(), &cluster.id);
    Some((key.clone(), document(&key, labels, out)))
}

/// The part of its service's endpoints an EndpointSlice holds: its IP endpoints, each with its
/// pod's labels, service account and network and its locality, and the port each service port is
/// reached on. `None` for a slice of no Service or of FQDN addresses (istiod ignores those).
///
/// Readiness as istiod reads it: an endpoint whose `ready` condition is true or unknown is ready;
/// one not ready is kept as `ready: false` (proxies see it UNHEALTHY) when `unready` says so,
/// unless it is terminating, or may be (the condition unknown): then it is left out, so that a
/// rollout's old pods do not count against the new ones. But for a Service with persistent
/// sessions, a terminating endpoint still serving (or that may be) is kept as draining, for the
/// sessions it holds.
pub fn slice(
    eps: &EndpointSlice,
    cluster: &ClusterNames,
    workloads: &impl Workloads,
    endpoints: &EndpointSettings<'_>,
) -> Option<(StoreKey, Value)> {
    let unready = endpoints.unready;
    let namespace = eps.metadata.namespace.as_deref()?;
    let name = eps.metadata.name.as_deref()?;
    let service = eps.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    if eps.address_type == "FQDN" {
        return None;
    }
    let key = cluster.slice_key(namespace, name);
    let sessions = workloads.service(namespace, service).is_some_and(|svc| {
        let labels = svc.metadata.labels.as_ref();
        labels.is_some_and(|l| PersistentSession::of(l).is_some())
    });
    let mut out = Map::new();
    out.insert("service".into(), json!(service));
    let ports: BTreeMap<&str, i32> = eps
        .ports
        .iter()
        .flatten()
        .filter_map(|p| Some((p.name.as_deref().unwrap_or(""), p.port?)))
        .collect();
    if !ports.is_empty() {
        out.insert("endpointPorts".into(), json!(ports));
    }
    let mut written = Vec::new();
    for e in &eps.endpoints {
        let conditions = e.conditions.as_ref();
        let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
        let terminating = conditions.and_then(|c| c.terminating).unwrap_or(true);
        let serving = conditions.and_then(|c| c.serving).unwrap_or(true);
        let Some(address) = e.addresses.first() else {
            continue;
        };
        let draining = !ready && sessions && serving && terminating;
        if !ready && !draining && (terminating || !unready) {
            continue;
        }
        let pod = e
            .target_ref
            .as_ref()
            .filter(|r| r.kind.as_deref() == Some("Pod"))
            .and_then(|r| {
                let ns = r.namespace.as_deref().unwrap_or(namespace);
                workloads.pod(ns, r.name.as_deref()?)
            });
        let mut endpoint = Map::new();
        endpoint.insert("address".into(), json!(address));
        let pod_labels = pod.as_ref().and_then(|p| p.metadata.labels.as_ref());
        if let Some(pod) = &pod {
            let mut labels = pod_labels.cloned().unwrap_or_default();
            labels
                .entry(WORKLOAD_NAME_LABEL.to_string())
                .or_insert_with(|| workload_name(pod));
            endpoint.insert("labels".into(), json!(labels));
        }
        let node_name = e
            .node_name
            .as_deref()
            .or_else(|| pod.as_ref()?.spec.node_name.as_deref());
        let locality = locality(pod_labels, node_name.and_then(|n| workloads.node(n)));
        if !locality.is_empty() {
            endpoint.insert("locality".into(), json!(locality));
        }
        let network = pod_labels
            .and_then(|l| l.get(NETWORK_LABEL))
            .map(String::as_str)
            .filter(|n| !n.is_empty())
            .unwrap_or(endpoints.network);
        if !network.is_empty() {
            endpoint.insert("network".into(), json!(network));
        }
        if let Some(pod) = &pod {
            let account = pod
                .spec
                .service_account_name
                .as_deref()
                .unwrap_or("default");
            endpoint.insert("serviceAccount".into(), json!(account));
        }
        if !ready {
            endpoint.insert("ready".into(), json!(false));
        }
        if draining {
            endpoint.insert("draining".into(), json!(true));
        }
        written.push(Value::Object(endpoint));
    }
    if !written.is_empty() {
        out.insert("endpoints".into(), Value::Array(written));
    }
    out.insert("cluster".into(), json!(cluster.id));
    Some((
        key.clone(),
        document(&key, owned_labels(None, &cluster.id), out),
    ))
}

/// How a slice's endpoints are written, besides what the slice and its pods say.
#[derive(Debug, Clone, Copy)]
pub struct EndpointSettings<'a> {
    /// Endpoints not ready (and not terminating) are written `ready: false` (else left out).
    pub unready: bool,
    /// The network of endpoints whose pods do not name one: the cluster's system namespace's
    /// `topology.istio.io/network` label, as istiod reads it (empty: none).
    pub network: &'a str,
}

/// The name of the workload `pod` belongs to, as istiod works it out from the pod's controller
/// (none but its own name for a pod not named by a controller): a Deployment's for a
/// ReplicaSet it made (the ReplicaSet's name less its `pod-template-hash`), an Argo Rollout's
/// likewise, an OpenShift DeploymentConfig's (its `deploymentconfig` label) for its
/// ReplicationController, a CronJob's for a Job named `<cronjob>-<8 to 10 digits>`, else the
/// controller's own name.
pub fn workload_name(pod: &Pod) -> String {
    let meta = &pod.metadata;
    let name = meta.name.clone().unwrap_or_default();
    let labels = meta.labels.as_ref();
    let label = |key: &str| {
        labels
            .and_then(|l| l.get(key))
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    };
    if meta.generate_name.as_deref().is_none_or(str::is_empty) {
        return name;
    }
    let Some(controller) = meta
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
    else {
        return name;
    };
    let owner = controller.name.as_str();
    let hashed = |hash_label: &str| {
        label(hash_label)
            .filter(|hash| owner.ends_with(hash))
            .and_then(|hash| owner.strip_suffix(&format!("-{hash}")))
            .map(str::to_string)
    };
    let workload = match controller.kind.as_str() {
        "ReplicaSet" => hashed("pod-template-hash")
            .or_else(|| hashed("rollouts-pod-template-hash"))
            .unwrap_or_else(|| owner.to_string()),
        "ReplicationController" => label("deploymentconfig").unwrap_or(owner).to_string(),
        "Job" => owner
            .rsplit_once('-')
            .filter(|(job, digits)| {
                !job.is_empty()
                    && (8..=10).contains(&digits.len())
                    && digits.bytes().all(|b| b.is_ascii_digit())
            })
            .map_or(owner, |(cron_job, _)| cron_job)
            .to_string(),
        _ => owner.to_string(),
    };
    if workload.is_empty() { name } else { workload }
}

/// `region/zone/subzone`: the pod's `istio-locality` label (dots for slashes), else its node's
/// topology labels; empty when neither says.
fn locality(
    pod_labels: Option<&BTreeMap<String, String>>,
    node: Option<std::sync::Arc<Node>>,
) -> String {
    if let Some(l) = pod_labels.and_then(|l| l.get(LOCALITY_LABEL)) {
        return l.replace('.', "/");
    }
    let Some(labels) = node.as_ref().and_then(|n| n.metadata.labels.as_ref()) else {
        return String::new();
    };
    let get = |k: &str| labels.get(k).map(String::as_str).unwrap_or("");
    let parts = [get(REGION_LABEL), get(ZONE_LABEL), get(SUBZONE_LABEL)];
    let used = parts
        .iter()
        .rposition(|p| !p.is_empty())
        .map_or(0, |i| i + 1);
    parts[..used].join("/")
}

/// The pods an EndpointSlice's endpoints point at (namespace, name), and the nodes they run on:
/// what, changed, changes the slice's part.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SliceReferences {
    pub pods: Vec<(String, String)>,
    pub nodes: Vec<String>,
    /// Its Service's name (in its namespace).
    pub service: Option<String>,
}

/// What an EndpointSlice's part reads besides the slice.
pub fn slice_references(eps: &EndpointSlice) -> SliceReferences {
    let namespace = eps.metadata.namespace.as_deref().unwrap_or_default();
    let mut pods = Vec::new();
    let mut nodes = Vec::new();
    for e in &eps.endpoints {
        if let Some(r) = e
            .target_ref
            .as_ref()
            .filter(|r| r.kind.as_deref() == Some("Pod"))
            && let Some(name) = &r.name
        {
            pods.push((
                r.namespace.clone().unwrap_or(namespace.to_string()),
                name.clone(),
            ));
        }
        if let Some(node) = &e.node_name {
            nodes.push(node.clone());
        }
    }
    pods.sort();
    pods.dedup();
    nodes.sort();
    nodes.dedup();
    let service = eps.metadata.labels.as_ref();
    let service = service.and_then(|l| l.get(SERVICE_NAME_LABEL)).cloned();
    SliceReferences {
        pods,
        nodes,
        service,
    }
}

/// The parts of a stored document a syncer compares with what it would write: kind, name,
/// labels, annotations and spec (the store's bookkeeping and a missing map versus an empty one
/// do not count).
pub fn comparable(doc: &Value) -> Value {
    let metadata = &doc["metadata"];
    let map = |v: &Value| match v {
        Value::Object(m) if !m.is_empty() => v.clone(),
        _ => json!({}),
    };
    json!({
        "kind": doc["kind"],
        "namespace": metadata["namespace"],
        "name": metadata["name"],
        "labels": map(&metadata["labels"]),
        "annotations": map(&metadata["annotations"]),
        "spec": map(&doc["spec"]),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    struct Cluster {
        pods: BTreeMap<(String, String), Arc<Pod>>,
        nodes: BTreeMap<String, Arc<Node>>,
        services: BTreeMap<(String, String), Arc<Service>>,
    }

    impl Workloads for Cluster {
        fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
            self.pods.get(&(namespace.into(), name.into())).cloned()
        }
        fn node(&self, name: &str) -> Option<Arc<Node>> {
            self.nodes.get(name).cloned()
        }
        fn service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
            self.services.get(&(namespace.into(), name.into())).cloned()
        }
        fn nodes(&self) -> Vec<Arc<Node>> {
            self.nodes.values().cloned().collect()
        }
    }

    fn none() -> Cluster {
        Cluster {
            pods: BTreeMap::new(),
            nodes: BTreeMap::new(),
            services: BTreeMap::new(),
        }
    }

    fn settings(unready: bool) -> EndpointSettings<'static> {
        EndpointSettings {
            unready,
            network: "",
        }
    }

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_health_checked_workload_entry_carries_its_healthy_condition() {
        let key = StoreKey {
            kind: Kind::WorkloadEntry,
            namespace: "vms".into(),
            name: "vm-1".into(),
        };
        let entry = |annotations: Value, status: Value| -> DynamicObject {
            from(json!({
                "apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
                "metadata": {"name": "vm-1", "namespace": "vms", "annotations": annotations},
                "spec": {"address": "10.1.0.5", "labels": {"app": "vm"}},
                "status": status,
            }))
        };
        let healthy = |annotations: Value, status: Value| {
            let doc = config(
                &key,
                "networking.istio.io/v1",
                &entry(annotations, status),
                "c",
            );
            doc["metadata"]["annotations"]
                .get(workload_entry::HEALTHY_ANNOTATION)
                .cloned()
        };
        let checked = json!({"proxy.istio.io/health-checks-enabled": "true"});
        let condition = |status: &str| {
            json!({"conditions": [
                {"type": "Other", "status": "True"},
                {"type": "Healthy", "status": status, "reason": "HTTPGet"}]})
        };
        assert_eq!(
            healthy(checked.clone(), condition("True")),
            Some(json!("true"))
        );
        assert_eq!(
            healthy(checked.clone(), condition("False")),
            Some(json!("false"))
        );
        // Not probed yet: not healthy, as istiod takes it.
        assert_eq!(healthy(checked, json!({})), Some(json!("false")));
        // Health not checked: nothing added.
        assert_eq!(healthy(json!({"a": "b"}), condition("False")), None);
    }

    #[test]
    fn a_service_becomes_its_service_endpoints_object() {
        let svc: Service = from(json!({
            "metadata": {"name": "reviews", "namespace": "bookinfo", "labels": {"app": "reviews"},
                         "annotations": {"networking.istio.io/exportTo": ".,istio-system"}},
            "spec": {"clusterIP": "10.96.0.12", "clusterIPs": ["10.96.0.12", "fd00::12"],
                     "selector": {"app": "reviews"},
                     "ports": [{"name": "http", "port": 9080, "targetPort": 9080, "protocol": "TCP"},
                               {"name": "grpc-x", "port": 7070, "targetPort": "grpc", "appProtocol": "grpc"},
                               {"name": "dns", "port": 53, "protocol": "UDP"}]},
        }));
        let (key, doc) = service(&svc, &ClusterNames::own("Kubernetes"), &none()).unwrap();
        assert_eq!(key.to_string(), "ServiceEndpoints/bookinfo/reviews");
        assert_eq!(
            doc,
            json!({
                "apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
                "metadata": {"name": "reviews", "namespace": "bookinfo",
                             "labels": {"app": "reviews", "pasa.io/cluster": "Kubernetes"}},
                "spec": {
                    "addresses": ["10.96.0.12", "fd00::12"],
                    "ports": [{"name": "http", "port": 9080},
                              {"name": "grpc-x", "port": 7070, "targetPort": "grpc", "appProtocol": "grpc"},
                              {"name": "dns", "port": 53, "protocol": "UDP"}],
                    "selector": {"app": "reviews"},
                    "exportTo": [".", "istio-system"],
                    "cluster": "Kubernetes",
                },
            })
        );
        let headless: Service = from(json!({
            "metadata": {"name": "db", "namespace": "a"},
            "spec": {"clusterIP": "None", "type": "ClusterIP"},
        }));
        let own = ClusterNames::own("c");
        assert_eq!(
            service(&headless, &own, &none()).unwrap().1["spec"],
            json!({"cluster": "c"})
        );
        let external: Service = from(json!({
            "metadata": {"name": "ext", "namespace": "a"},
            "spec": {"type": "ExternalName", "externalName": "api.example.com"},
        }));
        assert_eq!(
            service(&external, &own, &none()).unwrap().1["spec"],
            json!({"externalName": "api.example.com", "cluster": "c"})
        );
    }

    #[test]
    fn a_slice_becomes_a_part_with_what_its_pods_and_nodes_say() {
        let pod: Pod = from(json!({
            "metadata": {"name": "reviews-v2-abc", "namespace": "bookinfo",
                         "labels": {"app": "reviews", "version": "v2"}},
            "spec": {"serviceAccountName": "bookinfo-reviews", "nodeName": "n1", "containers": []},
        }));
        let node: Node = from(json!({
            "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/region": "us-east1",
                                                  "topology.kubernetes.io/zone": "us-east1-b"}},
        }));
        let cluster = Cluster {
            pods: [(("bookinfo".into(), "reviews-v2-abc".into()), Arc::new(pod))].into(),
            nodes: [("n1".into(), Arc::new(node))].into(),
            services: BTreeMap::new(),
        };
        let eps: EndpointSlice = from(json!({
            "metadata": {"name": "reviews-x7k2p", "namespace": "bookinfo",
                         "labels": {"kubernetes.io/service-name": "reviews"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 9080, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.42.0.8"], "conditions": {"ready": true}, "nodeName": "n1",
                 "targetRef": {"kind": "Pod", "name": "reviews-v2-abc", "namespace": "bookinfo"}},
                // Not ready and perhaps terminating (the condition unknown): left out.
                {"addresses": ["10.42.0.9"], "conditions": {"ready": false}},
                {"addresses": ["10.42.0.10"]},
                // Not ready and not terminating: kept, not ready.
                {"addresses": ["10.42.0.11"],
                 "conditions": {"ready": false, "serving": false, "terminating": false}},
                // Terminating (still serving): left out.
                {"addresses": ["10.42.0.12"],
                 "conditions": {"ready": false, "serving": true, "terminating": true}},
            ],
        }));
        let own = ClusterNames::own("Kubernetes");
        let (key, doc) = slice(&eps, &own, &cluster, &settings(true)).unwrap();
        assert_eq!(key.name, "reviews-x7k2p.endpointslice");
        assert_eq!(own.source(&key), Some(Source::Slice("reviews-x7k2p")));
        assert_eq!(
            doc["spec"],
            json!({
                "service": "reviews",
                "endpointPorts": {"http": 9080},
                "endpoints": [
                    {"address": "10.42.0.8", "labels": {"app": "reviews", "version": "v2",
                        "service.istio.io/workload-name": "reviews-v2-abc"},
                     "locality": "us-east1/us-east1-b", "serviceAccount": "bookinfo-reviews"},
                    {"address": "10.42.0.10"},
                    {"address": "10.42.0.11", "ready": false},
                ],
                "cluster": "Kubernetes",
            })
        );
        assert_eq!(
            doc["metadata"]["labels"],
            json!({"pasa.io/cluster": "Kubernetes"})
        );
        assert_eq!(
            slice_references(&eps),
            SliceReferences {
                pods: vec![("bookinfo".into(), "reviews-v2-abc".into())],
                nodes: vec!["n1".into()],
                service: Some("reviews".into()),
            }
        );
        let mut fqdn = eps.clone();
        fqdn.address_type = "FQDN".into();
        assert!(slice(&fqdn, &own, &cluster, &settings(true)).is_none());
        // Without unready endpoints, as istiod without PILOT_AUTO_SEND_UNHEALTHY_ENDPOINTS.
        let (_, doc) = slice(&eps, &own, &cluster, &settings(false)).unwrap();
        let addresses: Vec<&Value> = doc["spec"]["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| &e["address"])
            .collect();
        assert_eq!(addresses, [&json!("10.42.0.8"), &json!("10.42.0.10")]);

        // A Service with persistent sessions keeps what is terminating but still serving (or
        // may be) as draining, for the sessions on it.
        let mut sessions = cluster;
        let svc: Service = from(json!({
            "metadata": {"name": "reviews", "namespace": "bookinfo",
                         "labels": {"istio.io/persistent-session": "session"}},
        }));
        sessions
            .services
            .insert(("bookinfo".into(), "reviews".into()), Arc::new(svc));
        let mut eps = eps;
        eps.endpoints.push(from(json!({"addresses": ["10.42.0.13"],
            "conditions": {"ready": false, "serving": false, "terminating": true}})));
        let (_, doc) = slice(&eps, &own, &sessions, &settings(true)).unwrap();
        let endpoints = doc["spec"]["endpoints"].as_array().unwrap();
        assert_eq!(
            endpoints[1..],
            [
                json!({"address": "10.42.0.9", "ready": false, "draining": true}),
                json!({"address": "10.42.0.10"}),
                json!({"address": "10.42.0.11", "ready": false}),
                json!({"address": "10.42.0.12", "ready": false, "draining": true}),
            ]
        );
    }

    /// A remote cluster's Service and slice are named for it and name their Service; the same
    /// Service of PCP's own cluster keeps its names. Each cluster reads back only its own keys.
    #[test]
    fn a_remote_clusters_objects_are_named_for_it() {
        let svc: Service = from(json!({
            "metadata": {"name": "reviews", "namespace": "bookinfo"},
            "spec": {"clusterIP": "10.96.0.12", "ports": [{"name": "http", "port": 9080}]},
        }));
        let remote = ClusterNames::remote("east");
        let (key, doc) = service(&svc, &remote, &none()).unwrap();
        assert_eq!(key.name, "reviews.east.cluster");
        assert_eq!(doc["spec"]["service"], "reviews");
        assert_eq!(doc["spec"]["cluster"], "east");
        assert_eq!(doc["metadata"]["labels"]["pasa.io/cluster"], "east");
        let own = ClusterNames::own("Kubernetes");
        let (own_key, own_doc) = service(&svc, &own, &none()).unwrap();
        assert_eq!(own_key.name, "reviews");
        assert_eq!(own_doc["spec"].get("service"), None);
        let eps: EndpointSlice = from(json!({
            "metadata": {"name": "reviews-x", "namespace": "bookinfo",
                         "labels": {"kubernetes.io/service-name": "reviews"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.42.0.8"]}],
        }));
        // Endpoints whose pods name no network are of the cluster's (its system namespace's).
        let settings = EndpointSettings {
            unready: true,
            network: "n-east",
        };
        let (part, doc) = slice(&eps, &remote, &none(), &settings).unwrap();
        assert_eq!(part.name, "reviews-x.east.endpointslice");
        assert_eq!(
            doc["spec"],
            json!({"service": "reviews", "cluster": "east",
                   "endpoints": [{"address": "10.42.0.8", "network": "n-east"}]})
        );
        assert_eq!(remote.source(&key), Some(Source::Service("reviews")));
        assert_eq!(remote.source(&part), Some(Source::Slice("reviews-x")));
        assert_eq!(remote.source(&own_key), None);
        assert_eq!(own.source(&own_key), Some(Source::Service("reviews")));
        assert_eq!(
            own.source(&own.slice_key("bookinfo", "reviews-x")),
            Some(Source::Slice("reviews-x"))
        );
        // Another remote cluster's keys are not this one's.
        let west = ClusterNames::remote("west");
        assert_eq!(west.source(&key), None);
        assert_eq!(west.source(&part), None);
    }

    #[test]
    fn a_pods_workload_is_named_as_istiod_names_it() {
        let pod = |name: &str, owner: Option<(&str, &str)>, labels: Value| -> Pod {
            let mut meta = json!({"name": name, "generateName": "x-", "labels": labels});
            if let Some((kind, owner)) = owner {
                meta["ownerReferences"] = json!([
                    {"apiVersion": "v1", "kind": "Other", "name": "not-the-controller", "uid": "u0"},
                    {"apiVersion": "apps/v1", "kind": kind, "name": owner, "uid": "u1",
                     "controller": true},
                ]);
            }
            from(json!({"metadata": meta, "spec": {}}))
        };
        let cases = [
            (
                pod(
                    "reviews-v1-7d9f-abcde",
                    Some(("ReplicaSet", "reviews-v1-7d9f")),
                    json!({"pod-template-hash": "7d9f"}),
                ),
                "reviews-v1",
            ),
            (
                pod(
                    "canary-5c-x",
                    Some(("ReplicaSet", "canary-5c")),
                    json!({"rollouts-pod-template-hash": "5c"}),
                ),
                "canary",
            ),
            // A ReplicaSet of no Deployment.
            (pod("rs-x", Some(("ReplicaSet", "rs")), json!({})), "rs"),
            (
                pod(
                    "web-1-x",
                    Some(("ReplicationController", "web-1")),
                    json!({"deploymentconfig": "web"}),
                ),
                "web",
            ),
            (
                pod(
                    "report-28934520-x",
                    Some(("Job", "report-28934520")),
                    json!({}),
                ),
                "report",
            ),
            (
                pod("once-x", Some(("Job", "once-12")), json!({})),
                "once-12",
            ),
            (pod("db-0", Some(("StatefulSet", "db")), json!({})), "db"),
            (pod("bare", None, json!({})), "bare"),
        ];
        for (pod, workload) in cases {
            assert_eq!(workload_name(&pod), workload, "{:?}", pod.metadata.name);
        }
        // A pod not named by its controller is its own workload; the syncer keeps only the
        // controller of a pod's owners, which is all the name needs.
        let mut named = pod("named", Some(("ReplicaSet", "rs")), json!({}));
        named.metadata.generate_name = None;
        assert_eq!(workload_name(&named), "named");
        let mut kept = pod("x", Some(("ReplicaSet", "rs")), json!({}));
        crate::follow::trim_pod(&mut kept);
        assert_eq!(
            kept.metadata.owner_references.as_ref().map(Vec::len),
            Some(1)
        );
        assert_eq!(workload_name(&kept), "rs");
    }

    #[test]
    fn locality_from_the_pod_label_then_the_node() {
        let labels: BTreeMap<String, String> = [(LOCALITY_LABEL.into(), "r1.z1.s1".into())].into();
        assert_eq!(locality(Some(&labels), None), "r1/z1/s1");
        let node: Node = from(json!({"metadata": {"name": "n", "labels": {REGION_LABEL: "r"}}}));
        assert_eq!(locality(None, Some(Arc::new(node))), "r");
        assert_eq!(locality(None, None), "");
    }

    #[test]
    fn comparison_ignores_bookkeeping_and_empty_maps() {
        let written = json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
            "metadata": {"name": "a", "namespace": "n", "labels": {"x": "y"}}, "spec": {}});
        let stored = json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
            "metadata": {"name": "a", "namespace": "n", "labels": {"x": "y"}, "annotations": {},
                         "resourceVersion": "7"}});
        assert_eq!(comparable(&written), comparable(&stored));
        let changed = json!({"kind": "ServiceEndpoints",
            "metadata": {"name": "a", "namespace": "n", "labels": {"x": "z"}}, "spec": {}});
        assert_ne!(comparable(&written), comparable(&changed));
    }
}
