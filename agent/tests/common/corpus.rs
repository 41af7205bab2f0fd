//! The traffic-simulation corpus (`simulation/` of the conformance folder): its case format, and
//! the conversion of a case into what the agent works on: store resources for the cache and the
//! proxy to translate for. Comparing outcomes with expectations is in [`check`].

pub mod check;
pub mod istiod_like;
pub mod kube;
pub mod multinetwork;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use pasa_agent::mesh::{InboundPolicy, MeshSettings, OutboundPolicy};
use pasa_agent::model::proxy::{Flags, Proxy};
use pasa_agent::simulate::{Call, ChainTls, TrafficError};
use pasa_istio::node::ProxyType;
use pasa_proto::store::v1::Resource;
use pasa_proto::{Kind, Object};
use serde::Deserialize;
use serde_json::Value;

/// The corpus's `simulation` folder, if it is there.
pub fn simulation_dir() -> Option<PathBuf> {
    pasa_testing::conformance_dir("simulation").map(|dir| dir.join("simulation"))
}

/// One case: a proxy, the configuration it sees, and either calls or a route table to check.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub name: String,
    pub proxy: ProxySpec,
    /// Control-plane feature flags the case changed; those the translator knows go to
    /// [`Flags`].
    #[serde(default)]
    pub flags: BTreeMap<String, bool>,
    #[serde(default)]
    pub mesh: Option<MeshSpec>,
    /// Istio resources, multi-document YAML.
    #[serde(default)]
    pub config: String,
    /// Kubernetes objects, multi-document YAML.
    #[serde(default)]
    pub kube: String,
    #[serde(default)]
    pub inbound_clusters: Option<BTreeMap<String, ClusterCheck>>,
    #[serde(default)]
    pub calls: Option<Vec<CallCase>>,
    /// Route-table cases: the route configuration to inspect...
    #[serde(default)]
    pub route_config: Option<String>,
    /// ...and domain to expected clusters.
    #[serde(default)]
    pub virtual_hosts: Option<BTreeMap<String, Vec<String>>>,
    pub source: Source,
}

impl Case {
    /// Whether this is a route-table case rather than a call case.
    pub fn is_route_table(&self) -> bool {
        self.route_config.is_some()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    pub test: String,
    #[serde(default)]
    pub variant: Option<String>,
    pub line: u64,
}

/// The `proxy` block.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxySpec {
    #[serde(rename = "type")]
    pub kind: String,
    pub namespace: String,
    pub config_namespace: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub ip: Option<String>,
    #[serde(default)]
    pub ips: Vec<String>,
    pub dns_domain: String,
    #[serde(default)]
    pub istio_version: String,
    #[serde(default)]
    pub cluster_id: Option<String>,
    #[serde(default)]
    pub dns_capture: bool,
    #[serde(default)]
    pub dns_auto_allocate: bool,
}

/// The `mesh` block: a partial MeshConfig.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MeshSpec {
    #[serde(default)]
    pub root_namespace: Option<String>,
    #[serde(default)]
    pub outbound_traffic_policy: Option<PolicySpec>,
    #[serde(default)]
    pub inbound_traffic_policy: Option<PolicySpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    pub mode: String,
}

/// One call and what the reference made of it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallCase {
    /// Some calls have none; calls are identified by position.
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub call: Call,
    pub expect: Expect,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    #[serde(default)]
    pub error: Option<TrafficError>,
    #[serde(default)]
    pub listener: Option<String>,
    #[serde(default)]
    pub filter_chain: Option<String>,
    #[serde(default)]
    pub route_config: Option<String>,
    #[serde(default)]
    pub virtual_host: Option<String>,
    #[serde(default)]
    pub route: Option<String>,
    #[serde(default)]
    pub cluster: Option<String>,
    #[serde(default)]
    pub strict: bool,
    #[serde(default)]
    pub known_bug: Option<String>,
    #[serde(default)]
    pub filter_chain_tls: Option<ChainTls>,
}

/// Expected endpoints and services of one generated inbound cluster.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterCheck {
    #[serde(default)]
    pub endpoints: Vec<String>,
    #[serde(default)]
    pub services: Vec<String>,
}

/// Reads a case file.
pub fn load(path: &Path) -> Result<Vec<Case>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    serde_saphyr::from_str(&text).map_err(|e| format!("not a list of cases: {e}"))
}

/// The store resources of a case: its Istio `config` and its Kubernetes `kube` (Services with
/// their endpoints, as `ServiceEndpoints`). Revisions follow document order, except that objects
/// with a `metadata.creationTimestamp` are ordered by it (after those without one, as Kubernetes
/// objects without a timestamp count as oldest); objects with the same timestamp share their
/// creation revision.
pub fn resources(case: &Case, domain_suffix: &str) -> Result<Vec<Resource>, String> {
    let mut dated: Vec<(String, Resource)> = Vec::new();
    let config_docs = documents(&case.config, "config")?;
    let kube_docs = documents(&case.kube, "kube")?;
    // Gateway API routes become Istio config, as PCP's syncer converts them; the generated
    // objects are dated by the oldest route they come from.
    for doc in kube::gateway_api_config(&config_docs, &kube_docs, domain_suffix)? {
        let resource = store_resource(&doc, domain_suffix)
            .map_err(|e| format!("config: what the Gateway API objects became: {e}"))?;
        dated.push((String::new(), resource));
    }
    for (i, doc) in config_docs.into_iter().enumerate() {
        if kube::is_gateway_api(&doc) {
            continue;
        }
        let at = format!("config document {}", i + 1);
        dated.push((
            created(&doc),
            config_resource(&doc, domain_suffix).map_err(|e| format!("{at}: {e}"))?,
        ));
    }
    for doc in kube::ingress_config(&kube_docs, domain_suffix)? {
        // Generated config carries no creation time: it counts as oldest, as in istiod.
        let resource = store_resource(&doc, domain_suffix)
            .map_err(|e| format!("kube: what the Ingresses became: {e}"))?;
        dated.push((String::new(), resource));
    }
    for (created, doc) in kube::service_endpoints(&kube_docs)? {
        let resource = store_resource(&doc, domain_suffix).map_err(|e| {
            format!(
                "kube: the ServiceEndpoints made of Service {}: {e}",
                kube::name_of(&doc)
            )
        })?;
        dated.push((created, resource));
    }
    dated.sort_by(|a, b| a.0.cmp(&b.0));
    // Objects with the same timestamp (all undated ones included) were created at the same
    // moment in the original harness, where Istio orders them by name, then namespace: they share
    // their creation revision so that the translator sees the same tie.
    let mut out = Vec::with_capacity(dated.len());
    let mut group: Option<(String, u64)> = None;
    for ((stamp, mut r), revision) in dated.into_iter().zip(1u64..) {
        let created = match &group {
            Some((s, at)) if *s == stamp => *at,
            _ => {
                group = Some((stamp, revision));
                revision
            }
        };
        r.create_revision = created;
        r.mod_revision = revision;
        r.version = 1;
        out.push(r);
    }
    Ok(out)
}

/// The documents of a multi-document YAML string (empty documents dropped).
pub fn documents(text: &str, what: &str) -> Result<Vec<Value>, String> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|e| format!("{what}: not YAML: {e}"))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// `metadata.creationTimestamp` (RFC 3339, so text order is time order), empty when absent.
pub fn created(doc: &Value) -> String {
    doc.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn config_resource(doc: &Value, domain_suffix: &str) -> Result<Resource, String> {
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
    if Kind::from_kind_field(kind).is_none() {
        return Err(format!("kind {kind:?} is not a kind of the store"));
    }
    store_resource(doc, domain_suffix)
}

/// A document of a store kind, structurally checked, with its index keys.
fn store_resource(doc: &Value, domain_suffix: &str) -> Result<Resource, String> {
    let joined = |errors: Vec<pasa_proto::object::FieldError>| {
        errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    };
    let obj = Object::from_json(doc, "default", pasa_istio::generated::is_generated_object)
        .map_err(joined)?;
    let index = pasa_store::index::extract::index_keys(&obj, domain_suffix).map_err(joined)?;
    let mut resource = obj.to_resource();
    resource.index = Some(index);
    Ok(resource)
}

/// The proxy of a case, with its mesh settings.
pub fn proxy(case: &Case) -> Result<Proxy, String> {
    let p = &case.proxy;
    let kind = match p.kind.as_str() {
        "sidecar" => ProxyType::Sidecar,
        "router" => ProxyType::Router,
        other => return Err(format!("proxy.type {other:?}: expected sidecar or router")),
    };
    let mut ips: Vec<IpAddr> = Vec::new();
    for ip in p.ip.iter().chain(&p.ips) {
        ips.push(
            ip.parse()
                .map_err(|_| format!("proxy IP {ip:?} is not an IP address"))?,
        );
    }
    if ips.is_empty() {
        return Err("proxy: neither ip nor ips is set".into());
    }
    Ok(Proxy {
        kind,
        ips,
        namespace: p.namespace.clone(),
        config_namespace: p.config_namespace.clone(),
        labels: p.labels.clone(),
        dns_domain: p.dns_domain.clone(),
        cluster_id: p.cluster_id.clone().unwrap_or_else(|| "Kubernetes".into()),
        network: String::new(),
        requested_network_view: Vec::new(),
        mesh_id: String::new(),
        pod_name: String::new(),
        service_cluster: format!("istio-proxy.{}", p.namespace),
        locality: Default::default(),
        mesh: mesh(case.mesh.as_ref())?,
        flags: Flags {
            tls_on_sidecar_ingress: case
                .flags
                .get("EnableTLSOnSidecarIngress")
                .copied()
                .unwrap_or(false),
            ip_autoallocate: case
                .flags
                .get("EnableIPAutoallocate")
                .copied()
                .unwrap_or(true),
            persistent_session_filter: case
                .flags
                .get("EnablePersistentSessionFilter")
                .copied()
                .unwrap_or(false),
            prefer_hbone: case.flags.get("PreferHBONESend").copied().unwrap_or(false),
        },
        dns_capture: p.dns_capture,
        dns_auto_allocate: p.dns_auto_allocate,
        build: Default::default(),
        proxy_config: None,
        learned: None,
    })
}

fn mesh(spec: Option<&MeshSpec>) -> Result<MeshSettings, String> {
    // The harness reads Istio config without a domain suffix: `b` in `default` is `b.default`.
    let mut mesh = MeshSettings {
        config_domain_suffix: String::new(),
        ..MeshSettings::default()
    };
    let Some(spec) = spec else {
        return Ok(mesh);
    };
    if let Some(root) = &spec.root_namespace {
        mesh.root_namespace = root.clone();
    }
    if let Some(policy) = &spec.outbound_traffic_policy {
        mesh.outbound_policy = match policy.mode.as_str() {
            "ALLOW_ANY" => OutboundPolicy::AllowAny,
            "REGISTRY_ONLY" => OutboundPolicy::RegistryOnly,
            "ALLOW_ANY_DYNAMIC_DNS" => OutboundPolicy::AllowAnyDynamicDns,
            other => {
                return Err(format!(
                    "mesh.outboundTrafficPolicy.mode {other:?} has no counterpart in the agent's mesh settings"
                ));
            }
        };
    }
    if let Some(policy) = &spec.inbound_traffic_policy {
        mesh.inbound_policy = match policy.mode.as_str() {
            "PASSTHROUGH" => InboundPolicy::Passthrough,
            "LOCALHOST" => InboundPolicy::Localhost,
            other => {
                return Err(format!(
                    "mesh.inboundTrafficPolicy.mode {other:?} has no counterpart in the agent's mesh settings"
                ));
            }
        };
    }
    Ok(mesh)
}
