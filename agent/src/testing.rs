//! Fixtures for the crate's unit tests: store resources and proxies as translation sees them.

use std::net::IpAddr;

use pasa_istio::node::ProxyType;
use pasa_proto::store::v1::Resource;
use serde_json::Value;

use crate::identity::Locality;
use crate::mesh::MeshSettings;
use crate::model::proxy::{Flags, Proxy};

/// A store resource as the store would hand it over (revisions in creation order).
pub(crate) fn resource(
    kind: &str,
    namespace: &str,
    name: &str,
    spec: Value,
    revision: u64,
) -> Resource {
    Resource {
        api_version: "networking.istio.io/v1".into(),
        kind: kind.into(),
        namespace: namespace.into(),
        name: name.into(),
        spec_json: spec.to_string(),
        create_revision: revision,
        mod_revision: revision,
        version: 1,
        ..Default::default()
    }
}

/// A sidecar in `default` at `ip`, with Istio's default mesh settings.
pub(crate) fn sidecar(ip: &str) -> Proxy {
    let ip: IpAddr = ip.parse().expect("an IP address");
    Proxy {
        kind: ProxyType::Sidecar,
        ips: vec![ip],
        namespace: "default".into(),
        config_namespace: "default".into(),
        labels: Default::default(),
        dns_domain: "default.svc.cluster.local".into(),
        cluster_id: "Kubernetes".into(),
        network: String::new(),
        requested_network_view: Vec::new(),
        mesh_id: String::new(),
        pod_name: format!("workload-{ip}"),
        service_cluster: "istio-proxy.default".into(),
        locality: Locality::default(),
        mesh: MeshSettings::default(),
        flags: Flags::default(),
        dns_capture: false,
        dns_auto_allocate: false,
        build: Default::default(),
        proxy_config: None,
        learned: None,
    }
}

/// The ingress gateway pod `istio=ingressgateway` in `istio-system` at `ip`.
pub(crate) fn router(ip: &str) -> Proxy {
    Proxy {
        kind: ProxyType::Router,
        namespace: "istio-system".into(),
        config_namespace: "istio-system".into(),
        labels: [("istio".to_string(), "ingressgateway".to_string())].into(),
        dns_domain: "istio-system.svc.cluster.local".into(),
        ..sidecar(ip)
    }
}
