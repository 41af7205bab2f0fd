//! The Kubernetes objects of a case (`kube`) as the store's `ServiceEndpoints`, the way the
//! Kubernetes syncer writes them: one per Service, with the ready addresses its Endpoints and
//! EndpointSlices list, labelled (and given named container ports) from the Pod at each address.

use std::collections::BTreeMap;

use pasa_istio::service_endpoints::{Endpoint, KubePort, ServiceEndpoints, TargetPort};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::created;

/// Kubernetes kinds a case may hold that are not Services or their endpoints: Ingresses become
/// Istio config ([`ingress_config`]), as PCP's syncer converts them.
const IGNORED_KINDS: &[&str] = &["Ingress", "IngressClass"];

/// The label tying an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The Istio annotation limiting where a Service is visible.
const EXPORT_TO: &str = "networking.istio.io/exportTo";

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Meta {
    name: String,
    namespace: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

impl Meta {
    fn namespace(&self) -> &str {
        if self.namespace.is_empty() {
            "default"
        } else {
            &self.namespace
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Service {
    metadata: Meta,
    spec: ServiceSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ServiceSpec {
    #[serde(rename = "type")]
    kind: String,
    #[serde(rename = "clusterIP")]
    cluster_ip: String,
    #[serde(rename = "clusterIPs")]
    cluster_ips: Vec<String>,
    ports: Vec<ServicePort>,
    selector: BTreeMap<String, String>,
    external_name: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ServicePort {
    name: String,
    port: u32,
    protocol: String,
    target_port: Option<TargetPort>,
    app_protocol: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EndpointSlice {
    metadata: Meta,
    endpoints: Vec<SliceEndpoint>,
    ports: Vec<NamedPort>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SliceEndpoint {
    addresses: Vec<String>,
    conditions: Conditions,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Conditions {
    ready: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct NamedPort {
    name: String,
    port: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Endpoints {
    metadata: Meta,
    subsets: Vec<Subset>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Subset {
    addresses: Vec<EndpointAddress>,
    ports: Vec<NamedPort>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct EndpointAddress {
    ip: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Pod {
    metadata: Meta,
    spec: PodSpec,
    status: PodStatus,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PodSpec {
    containers: Vec<Container>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Container {
    ports: Vec<ContainerPort>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ContainerPort {
    name: String,
    container_port: u32,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct PodStatus {
    #[serde(rename = "podIP")]
    pod_ip: String,
    #[serde(rename = "podIPs")]
    pod_ips: Vec<EndpointAddress>,
}

/// One address a Service's endpoints list, with the port of each named service port.
struct Backend {
    namespace: String,
    service: String,
    address: String,
    ports: Vec<NamedPort>,
}

fn parse<T: DeserializeOwned>(doc: &Value, i: usize) -> Result<T, String> {
    serde_json::from_value(doc.clone()).map_err(|e| {
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
        format!("kube document {i} ({kind}): {e}")
    })
}

/// The Gateways and VirtualServices istiod generates for the Ingresses among `docs` (those its
/// default mesh config serves; IngressClasses and named Service ports resolved from `docs`), as
/// documents.
pub fn ingress_config(docs: &[Value], domain_suffix: &str) -> Result<Vec<Value>, String> {
    use pasa_kube::ingress::{self, Ingress, Settings};
    fn of_kind<'a>(docs: &'a [Value], kind: &'a str) -> impl Iterator<Item = &'a Value> {
        docs.iter().filter(move |d| d["kind"] == kind)
    }
    let ingresses = of_kind(docs, "Ingress")
        .map(|d| {
            serde_json::from_value::<Ingress>(d.clone()).map_err(|e| format!("an Ingress: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let settings = Settings {
        domain_suffix: domain_suffix.to_string(),
        ..Settings::default()
    };
    let controller_of = |class: &str| {
        of_kind(docs, "IngressClass")
            .find(|d| d["metadata"]["name"] == class)
            .and_then(|d| d["spec"]["controller"].as_str().map(str::to_string))
    };
    let served: Vec<Ingress> = ingresses
        .into_iter()
        .filter(|i| ingress::served(&settings, i, controller_of))
        .collect();
    let services: Vec<Service> = of_kind(docs, "Service")
        .map(|d| serde_json::from_value(d.clone()).unwrap_or_default())
        .collect();
    let named_port = |namespace: &str, name: &str, port: &str| {
        services
            .iter()
            .find(|s| s.metadata.namespace() == namespace && s.metadata.name == name)?
            .spec
            .ports
            .iter()
            .find(|p| p.name == port)
            .map(|p| p.port)
    };
    Ok(ingress::convert(&settings, &served, named_port)
        .iter()
        .map(pasa_proto::Object::to_document)
        .collect())
}

/// Whether a document is a Gateway API object.
pub fn is_gateway_api(doc: &Value) -> bool {
    doc["apiVersion"]
        .as_str()
        .is_some_and(|v| v.starts_with(&format!("{}/", pasa_kube::gateway_api::GROUP)))
}

/// The Istio config the Gateway API objects of `config` become (as PCP's syncer converts them),
/// with the Services of `kube` and the ServiceEntries of `config` as the cluster.
pub fn gateway_api_config(
    config: &[Value],
    kube: &[Value],
    domain_suffix: &str,
) -> Result<Vec<Value>, String> {
    use pasa_kube::gateway_api::{self, Input, Settings};
    if !config.iter().any(is_gateway_api) {
        return Ok(Vec::new());
    }
    let mut input = Input::default();
    for doc in kube.iter().chain(config) {
        input.add(doc, domain_suffix)?;
        if let Some(ns) = doc["metadata"]["namespace"].as_str() {
            input.namespaces.entry(ns.to_string()).or_default();
        }
    }
    let settings = Settings {
        domain_suffix: domain_suffix.to_string(),
        ..Settings::default()
    };
    Ok(gateway_api::convert(&settings, &input)
        .iter()
        .map(pasa_proto::Object::to_document)
        .collect())
}

/// `metadata.name` of a document, for messages.
pub fn name_of(doc: &Value) -> String {
    doc.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The `ServiceEndpoints` documents of the Services among `docs`, each with the Service's
/// creation timestamp (empty when absent).
pub fn service_endpoints(docs: &[Value]) -> Result<Vec<(String, Value)>, String> {
    let mut services = Vec::new();
    let mut backends = Vec::new();
    let mut pods = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
        match kind {
            "Service" => services.push((created(doc), parse::<Service>(doc, i)?)),
            "EndpointSlice" => {
                let slice: EndpointSlice = parse(doc, i)?;
                let Some(service) = slice.metadata.labels.get(SERVICE_NAME_LABEL) else {
                    return Err(format!(
                        "kube document {i}: EndpointSlice {:?} has no {SERVICE_NAME_LABEL} label",
                        slice.metadata.name
                    ));
                };
                for ep in slice
                    .endpoints
                    .iter()
                    .filter(|e| e.conditions.ready != Some(false))
                {
                    for address in &ep.addresses {
                        backends.push(Backend {
                            namespace: slice.metadata.namespace().to_string(),
                            service: service.clone(),
                            address: address.clone(),
                            ports: copy_ports(&slice.ports),
                        });
                    }
                }
            }
            "Endpoints" => {
                let eps: Endpoints = parse(doc, i)?;
                for subset in &eps.subsets {
                    for address in &subset.addresses {
                        backends.push(Backend {
                            namespace: eps.metadata.namespace().to_string(),
                            service: eps.metadata.name.clone(),
                            address: address.ip.clone(),
                            ports: copy_ports(&subset.ports),
                        });
                    }
                }
            }
            "Pod" => pods.push(parse::<Pod>(doc, i)?),
            k if IGNORED_KINDS.contains(&k) => {}
            other => {
                return Err(format!(
                    "kube document {i}: kind {other:?} is not one the conversion knows (Service, Endpoints, EndpointSlice, Pod; ignored: {IGNORED_KINDS:?})"
                ));
            }
        }
    }
    Ok(services
        .into_iter()
        .map(|(created, svc)| (created, document(&svc, &backends, &pods)))
        .collect())
}

fn copy_ports(ports: &[NamedPort]) -> Vec<NamedPort> {
    ports
        .iter()
        .map(|p| NamedPort {
            name: p.name.clone(),
            port: p.port,
        })
        .collect()
}

fn document(svc: &Service, backends: &[Backend], pods: &[Pod]) -> Value {
    let ns = svc.metadata.namespace();
    let spec = &svc.spec;
    let headless = spec.cluster_ip == "None";
    let addresses = if spec.kind == "ExternalName" || headless {
        Vec::new()
    } else if !spec.cluster_ips.is_empty() {
        spec.cluster_ips.clone()
    } else if spec.cluster_ip.is_empty() {
        Vec::new()
    } else {
        vec![spec.cluster_ip.clone()]
    };
    let ports: Vec<KubePort> = spec
        .ports
        .iter()
        .map(|p| KubePort {
            name: p.name.clone(),
            port: p.port,
            protocol: p.protocol.clone(),
            target_port: p.target_port.clone(),
            app_protocol: p.app_protocol.clone(),
        })
        .collect();
    let endpoints = backends
        .iter()
        .filter(|b| b.namespace == ns && b.service == svc.metadata.name)
        .map(|b| endpoint(b, &ports, pods))
        .collect();
    let export_to = svc
        .metadata
        .annotations
        .get(EXPORT_TO)
        .map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let spec = ServiceEndpoints {
        addresses,
        ports,
        selector: spec.selector.clone(),
        endpoints,
        external_name: if spec.kind == "ExternalName" {
            spec.external_name.clone()
        } else {
            String::new()
        },
        export_to,
        ..Default::default()
    };
    json!({
        "apiVersion": "pasa.io/v1alpha1",
        "kind": "ServiceEndpoints",
        "metadata": {
            "name": svc.metadata.name,
            "namespace": ns,
            "labels": svc.metadata.labels,
            "annotations": svc.metadata.annotations,
        },
        "spec": serde_json::to_value(spec).unwrap_or(Value::Null),
    })
}

/// An endpoint: the Pod's labels and container ports when a Pod has its address, and the port a
/// named target port resolves to from the endpoints' own port list.
fn endpoint(b: &Backend, ports: &[KubePort], pods: &[Pod]) -> Endpoint {
    let mut ep = Endpoint {
        address: b.address.clone(),
        ..Default::default()
    };
    let pod = pods.iter().find(|p| {
        p.metadata.namespace() == b.namespace
            && (p.status.pod_ip == b.address || p.status.pod_ips.iter().any(|a| a.ip == b.address))
    });
    if let Some(pod) = pod {
        ep.labels = pod.metadata.labels.clone();
        for c in &pod.spec.containers {
            for p in c.ports.iter().filter(|p| !p.name.is_empty()) {
                ep.ports.insert(p.name.clone(), p.container_port);
            }
        }
    }
    for port in ports {
        if let Some(TargetPort::Name(target)) = &port.target_port
            && let Some(listed) = b.ports.iter().find(|p| p.name == port.name)
        {
            ep.ports.entry(target.clone()).or_insert(listed.port);
        }
    }
    ep
}
