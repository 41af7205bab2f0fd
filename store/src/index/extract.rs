//! Index keys of an object, extracted at write time the way istiod reads the same fields:
//! VirtualService `spec.hosts` (short names resolved) and `spec.gateways` (`mesh` when absent),
//! DestinationRule `spec.host`, ServiceEntry `spec.hosts` (kept as written), Gateway server hosts
//! (the `namespace/` prefix dropped) and the Gateway itself as `namespace/name`, and the FQDN of a
//! ServiceEndpoints' service (for a part of a service's endpoints, the service it names). The
//! virtual IPs of ServiceEndpoints and ServiceEntries (`spec.addresses`, CIDR ranges aside) are
//! host keys too: an on-demand proxy asked for an address finds its service by it.

use pasa_istio::gateway::{MESH, resolve_gateway_name};
use pasa_istio::host::{check_pattern, resolve_short_name, service_fqdn};
use pasa_istio::service_endpoints::NETWORK_GATEWAYS_INDEX;
use pasa_proto::Kind;
use pasa_proto::object::{FieldError, Object};
use pasa_proto::store::v1::IndexKeys;
use serde_json::Value;

/// Extracts the index keys, or reports every field whose value cannot be indexed.
pub fn index_keys(obj: &Object, domain_suffix: &str) -> Result<IndexKeys, Vec<FieldError>> {
    let mut errors = Vec::new();
    let mut hosts = Vec::new();
    let mut gateways = Vec::new();
    let spec = &obj.spec;
    let ns = obj.namespace.as_str();
    match obj.kind {
        Kind::VirtualService => {
            for (path, h) in strings(spec, "hosts", "spec.hosts", &mut errors) {
                push_host(
                    &mut hosts,
                    resolve_short_name(h, ns, domain_suffix),
                    path,
                    &mut errors,
                );
            }
            for (_, g) in strings(spec, "gateways", "spec.gateways", &mut errors) {
                gateways.push(resolve_gateway_name(g, ns));
            }
            if gateways.is_empty() {
                gateways.push(MESH.to_string());
            }
        }
        Kind::DestinationRule => match spec.get("host") {
            None | Some(Value::Null) => {}
            Some(Value::String(h)) => push_host(
                &mut hosts,
                resolve_short_name(h, ns, domain_suffix),
                "spec.host".into(),
                &mut errors,
            ),
            Some(_) => errors.push(field_error("spec.host", "must be a string")),
        },
        Kind::ServiceEntry => {
            for (path, h) in strings(spec, "hosts", "spec.hosts", &mut errors) {
                push_host(&mut hosts, h.to_string(), path, &mut errors);
            }
            hosts.extend(addresses(spec));
        }
        Kind::Gateway => {
            gateways.push(format!("{ns}/{}", obj.name));
            if let Some(servers) = list(spec, "servers", "spec.servers", &mut errors) {
                for (i, server) in servers.iter().enumerate() {
                    let at = format!("spec.servers[{i}].hosts");
                    for (path, h) in strings(server, "hosts", &at, &mut errors) {
                        let dns = h.split_once('/').map_or(h, |(_, dns)| dns);
                        push_host(&mut hosts, dns.to_string(), path, &mut errors);
                    }
                }
            }
        }
        // The service's host and addresses; a part of its endpoints is found by the service it
        // names.
        Kind::ServiceEndpoints => {
            match spec.get("service") {
                None | Some(Value::Null) => hosts.push(service_fqdn(&obj.name, ns, domain_suffix)),
                Some(Value::String(s)) if s.is_empty() => {
                    hosts.push(service_fqdn(&obj.name, ns, domain_suffix))
                }
                Some(Value::String(s)) => hosts.push(service_fqdn(s, ns, domain_suffix)),
                Some(_) => errors.push(field_error("spec.service", "must be a string")),
            }
            hosts.extend(addresses(spec));
        }
        // Namespace-scoped: found by their namespace.
        Kind::Sidecar
        | Kind::WorkloadEntry
        | Kind::PeerAuthentication
        | Kind::AuthorizationPolicy
        | Kind::RequestAuthentication
        | Kind::EnvoyFilter
        | Kind::WorkloadGroup
        | Kind::ProxyConfig
        | Kind::Telemetry
        | Kind::WasmPlugin
        | Kind::TrafficExtension
        | Kind::MeshConfig
        | Kind::JsonWebKeySet
        | Kind::ImagePullSecret => {}
    }
    // A network gateway Service is found by what it is: proxies follow every one of them.
    if obj.kind == Kind::ServiceEndpoints
        && spec
            .get("networkGateways")
            .and_then(Value::as_array)
            .is_some_and(|g| !g.is_empty())
    {
        gateways.push(NETWORK_GATEWAYS_INDEX.to_string());
    }
    hosts.sort();
    hosts.dedup();
    gateways.sort();
    gateways.dedup();
    if errors.is_empty() {
        Ok(IndexKeys { hosts, gateways })
    } else {
        Err(errors)
    }
}

/// The addresses of `spec.addresses` that are one address (not a CIDR range), written as the
/// agent writes an address it is asked for. What is not one is left to validation.
fn addresses(spec: &Value) -> impl Iterator<Item = String> + '_ {
    spec.get("addresses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str()?.parse::<std::net::IpAddr>().ok())
        .map(|a| a.to_string())
}

fn field_error(field: &str, message: &str) -> FieldError {
    FieldError {
        field: field.to_string(),
        message: message.to_string(),
    }
}

fn push_host(hosts: &mut Vec<String>, host: String, path: String, errors: &mut Vec<FieldError>) {
    match check_pattern(&host) {
        Ok(()) => hosts.push(host),
        Err(e) => errors.push(FieldError {
            field: path,
            message: e.to_string(),
        }),
    }
}

fn list<'a>(
    v: &'a Value,
    key: &str,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Option<&'a Vec<Value>> {
    match v.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => Some(items),
        Some(_) => {
            errors.push(field_error(path, "must be a list"));
            None
        }
    }
}

/// The string items of the list `v[key]`, with their field paths; other items are errors.
fn strings<'a>(
    v: &'a Value,
    key: &str,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Vec<(String, &'a str)> {
    let mut out = Vec::new();
    for (i, item) in list(v, key, path, errors).into_iter().flatten().enumerate() {
        match item.as_str() {
            Some(s) => out.push((format!("{path}[{i}]"), s)),
            None => errors.push(field_error(&format!("{path}[{i}]"), "must be a string")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys_of(doc: Value) -> Result<IndexKeys, Vec<FieldError>> {
        let obj = Object::from_json(&doc, "default", pasa_istio::generated::is_generated_object)
            .expect("structurally valid");
        index_keys(&obj, "cluster.local")
    }

    #[test]
    fn virtual_service_hosts_and_gateways() {
        let keys = keys_of(json!({
            "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "bookinfo", "namespace": "bookinfo"},
            "spec": {"hosts": ["productpage", "*.example.com", "reviews.default"],
                     "gateways": ["bookinfo-gateway", "mesh", "istio-system/ingress"]}
        }))
        .unwrap();
        assert_eq!(
            keys.hosts,
            [
                "*.example.com",
                "productpage.bookinfo.svc.cluster.local",
                "reviews.default"
            ]
        );
        assert_eq!(
            keys.gateways,
            ["bookinfo/bookinfo-gateway", "istio-system/ingress", "mesh"]
        );
        let mesh_only = keys_of(json!({
            "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "r"}, "spec": {"hosts": ["reviews"]}
        }))
        .unwrap();
        assert_eq!(mesh_only.gateways, ["mesh"]);
    }

    #[test]
    fn other_kinds() {
        let dr = keys_of(
            json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": "r"}, "spec": {"host": "reviews"}}),
        )
        .unwrap();
        assert_eq!(dr.hosts, ["reviews.default.svc.cluster.local"]);
        let se = keys_of(
            json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": "w"}, "spec": {"hosts": ["*.wikipedia.org", "api"]}}),
        )
        .unwrap();
        assert_eq!(
            se.hosts,
            ["*.wikipedia.org", "api"],
            "SE hosts are not resolved"
        );
        let gw = keys_of(json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": "istio-system"},
            "spec": {"servers": [{"hosts": ["bookinfo/*.bookinfo.com", "*"]}, {"hosts": ["./a.com"]}]}}))
        .unwrap();
        assert_eq!(gw.hosts, ["*", "*.bookinfo.com", "a.com"]);
        assert_eq!(gw.gateways, ["istio-system/gw"]);
        let sep = keys_of(
            json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
            "metadata": {"name": "reviews", "namespace": "bookinfo"}, "spec": {}}),
        )
        .unwrap();
        assert_eq!(sep.hosts, ["reviews.bookinfo.svc.cluster.local"]);
        let part = keys_of(
            json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
            "metadata": {"name": "reviews-x7k2p.endpointslice", "namespace": "bookinfo"},
            "spec": {"service": "reviews"}}),
        )
        .unwrap();
        assert_eq!(part.hosts, ["reviews.bookinfo.svc.cluster.local"]);
        // Virtual IPs are host keys too, written as the agent writes an address; a CIDR range
        // (a ServiceEntry's) is not one address.
        let with_vips = keys_of(
            json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
            "metadata": {"name": "ratings", "namespace": "bookinfo"},
            "spec": {"addresses": ["10.96.0.21", "fd00:0::21"]}}),
        )
        .unwrap();
        assert_eq!(
            with_vips.hosts,
            [
                "10.96.0.21",
                "fd00::21",
                "ratings.bookinfo.svc.cluster.local"
            ]
        );
        let entry = keys_of(
            json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": "api"},
            "spec": {"hosts": ["api.example.com"], "addresses": ["240.0.0.7", "10.1.0.0/16"]}}),
        )
        .unwrap();
        assert_eq!(entry.hosts, ["240.0.0.7", "api.example.com"]);
        let remote_gateway = keys_of(
            json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
            "metadata": {"name": "eastwest.cluster2.cluster", "namespace": "istio-system"},
            "spec": {"service": "eastwest", "cluster": "cluster2",
                     "ports": [{"name": "tls", "port": 15443}],
                     "networkGateways": [{"network": "n2", "address": "35.1.2.3", "port": 15443}]}}),
        )
        .unwrap();
        assert_eq!(
            remote_gateway.hosts,
            ["eastwest.istio-system.svc.cluster.local"]
        );
        assert_eq!(remote_gateway.gateways, [NETWORK_GATEWAYS_INDEX]);
        let sidecar = keys_of(
            json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
            "metadata": {"name": "default"}, "spec": {"egress": [{"hosts": ["./*"]}]}}),
        )
        .unwrap();
        assert_eq!(sidecar, IndexKeys::default());
    }

    #[test]
    fn unindexable_fields_are_named() {
        let errors = keys_of(json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "r"}, "spec": {"hosts": ["ok.com", 3, "a.*.com"], "gateways": "gw"}}))
        .unwrap_err();
        let fields: Vec<_> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.hosts[1]", "spec.hosts[2]", "spec.gateways"]);
        let errors = keys_of(
            json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
            "metadata": {"name": "r.endpointslice"}, "spec": {"service": 7}}),
        )
        .unwrap_err();
        assert_eq!(errors[0].field, "spec.service");
    }
}
