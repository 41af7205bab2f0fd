//! The proxy config is generated for, and which generator its clients ask for.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::Node;
use pasa_istio::mesh_config::MeshConfig;
use pasa_istio::node::ProxyType;
use pasa_istio::proxy_config::MeshProxyConfig;

use crate::identity::{Identity, Locality};
use crate::mesh::MeshSettings;

/// The Istio version the agent's proxies claim (their node's `ISTIO_VERSION`): istiod reads
/// features from it, and EnvoyFilters match it (`match.proxy.proxyVersion`).
pub const ISTIO_VERSION: &str = "1.28.0";

/// The proxy resources are generated for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proxy {
    pub kind: ProxyType,
    /// The workload's addresses (the node ID's IP first).
    pub ips: Vec<IpAddr>,
    /// The namespace the pod runs in.
    pub namespace: String,
    /// The namespace that decides config visibility (`exportTo`, Sidecar lookup); the pod's
    /// namespace for sidecars.
    pub config_namespace: String,
    pub labels: BTreeMap<String, String>,
    /// The proxy's DNS domain (`<namespace>.svc.cluster.local`), for short names in virtual host
    /// domains.
    pub dns_domain: String,
    pub cluster_id: String,
    pub network: String,
    /// The networks whose endpoints it is sent besides its own (empty: every network).
    pub requested_network_view: Vec<String>,
    /// The mesh the proxy is in (its node's `MESH_ID`); empty when not given.
    pub mesh_id: String,
    /// The pod's name.
    pub pod_name: String,
    /// Istio's service cluster (`<app>.<namespace>`, the node's `cluster`): the name spans
    /// give the proxy.
    pub service_cluster: String,
    pub locality: Locality,
    pub mesh: MeshSettings,
    pub flags: Flags,
    /// The proxy answers its application's DNS queries (`ISTIO_META_DNS_CAPTURE`).
    pub dns_capture: bool,
    /// ... and wants addresses allocated for ServiceEntry hosts without one
    /// (`ISTIO_META_DNS_AUTO_ALLOCATE`).
    pub dns_auto_allocate: bool,
    /// The Envoy build served: Istio's own filters only for Istio's proxy.
    pub build: ProxyBuild,
    /// The proxy's own settings (pilot-agent's `PROXY_CONFIG`, which Istio's injection works out
    /// for the pod); without them, the mesh config's `defaultConfig` holds, as for istiod.
    pub proxy_config: Option<MeshProxyConfig>,
    /// For an on-demand proxy, the hosts it has learned (its scope is narrowed to them, see
    /// [`crate::on_demand`]); `None` for the eager scope.
    pub learned: Option<std::sync::Arc<std::collections::BTreeSet<String>>>,
}

/// The Envoy build a proxy runs: upstream Envoy, or Istio's proxy (with Istio's own filters for
/// metrics and metadata exchange).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ProxyBuild {
    /// Upstream Envoy (the agent runs it itself): none of Istio's filters.
    #[default]
    Envoy,
    /// Istio's proxy (`istio-proxy`, with pilot-agent): Istio's metrics, metadata exchange and
    /// ALPN filters, as istiod sends them.
    Istio,
}

/// Control-plane feature flags that change what is generated; istiod's defaults by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flags {
    /// Terminate the TLS a Sidecar ingress listener declares (`ENABLE_TLS_ON_SIDECAR_INGRESS`);
    /// off, its `tls` is ignored.
    pub tls_on_sidecar_ingress: bool,
    /// ServiceEntry addresses come from the allocation controller (`ENABLE_IP_AUTOALLOCATE`);
    /// off, the older allocator derives them from host names (see
    /// [`super::registry::legacy_auto_addresses`]).
    pub ip_autoallocate: bool,
    /// Envoy's stateful session filter for services with persistent sessions
    /// (`PILOT_ENABLE_PERSISTENT_SESSION_FILTER`, off by default, as istiod).
    pub persistent_session_filter: bool,
    /// Endpoints that take HBONE are sent as such even when they take Istio mutual TLS too
    /// (`PILOT_PREFER_SENDING_HBONE`, off by default, as istiod).
    pub prefer_hbone: bool,
}

impl Default for Flags {
    fn default() -> Self {
        Flags {
            tls_on_sidecar_ingress: false,
            ip_autoallocate: true,
            persistent_session_filter: false,
            prefer_hbone: false,
        }
    }
}

impl Proxy {
    /// The proxy an agent started with `identity` serves.
    pub fn from_identity(identity: &Identity, mesh: MeshSettings) -> Proxy {
        Proxy {
            kind: identity.node.proxy_type,
            ips: vec![identity.node.ip],
            namespace: identity.namespace.clone(),
            config_namespace: identity.namespace.clone(),
            labels: identity.labels.clone(),
            dns_domain: format!("{}.svc.{}", identity.namespace, mesh.domain_suffix),
            cluster_id: identity.cluster_id.clone(),
            network: identity.network.clone(),
            requested_network_view: identity.requested_network_view.clone(),
            mesh_id: identity.mesh_id.clone(),
            pod_name: identity.pod_name.clone(),
            service_cluster: identity.service_cluster(),
            locality: identity.locality.clone(),
            mesh,
            flags: Flags::default(),
            dns_capture: false,
            dns_auto_allocate: false,
            build: ProxyBuild::Envoy,
            proxy_config: (!identity.proxy_config.is_empty())
                .then(|| identity.proxy_config.clone()),
            learned: None,
        }
    }

    /// The settings the proxy runs with: its own, else `mesh`'s `defaultConfig` (istiod's
    /// choice for a node whose metadata has no `PROXY_CONFIG`).
    pub fn settings(&self, mesh: Option<&MeshConfig>) -> Cow<'_, MeshProxyConfig> {
        match (&self.proxy_config, mesh) {
            (Some(own), _) => Cow::Borrowed(own),
            (None, Some(mesh)) => Cow::Owned(mesh.default_config()),
            (None, None) => Cow::Owned(MeshProxyConfig::defaults()),
        }
    }
}

impl Proxy {
    /// A host as written in an Istio resource of `namespace`, resolved as istiod resolves it.
    pub fn resolve_host(&self, host: &str, namespace: &str) -> String {
        pasa_istio::host::resolve_short_name(host, namespace, &self.mesh.config_domain_suffix)
    }
}

/// Which resources a client gets, chosen per ADS connection from the client's node metadata, as
/// istiod chooses: `GENERATOR: grpc` gets proxyless gRPC resources, anything else Envoy's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Generator {
    /// Envoy sidecar or router: real listeners, filter chains, RDS by port.
    #[default]
    Envoy,
    /// A proxyless gRPC client: API listeners named `host:port`.
    Grpc,
}

impl Generator {
    /// The generator a client asks for in its node metadata.
    pub fn of_node(node: &Node) -> Generator {
        use envoy_types::pb::google::protobuf::value::Kind;
        let asked = node
            .metadata
            .as_ref()
            .and_then(|m| m.fields.get("GENERATOR"))
            .and_then(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.as_str()),
                _ => None,
            });
        match asked {
            Some("grpc") => Generator::Grpc,
            _ => Generator::Envoy,
        }
    }
}
