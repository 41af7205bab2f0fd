//! Validation of the store's own `ServiceEndpoints` kind (a Kubernetes Service with its
//! endpoints, or a part of its endpoints: see `pasa_istio::service_endpoints`). Kubernetes
//! checked the Service and EndpointSlices the syncer reads; these rules hold hand-written objects
//! (`pasactl apply`) to the same shape, so that an agent never meets one it must ignore.

use std::collections::BTreeSet;

use pasa_istio::service_endpoints::{ServiceEndpoints, TargetPort};
use pasa_proto::Object;

use super::common::{
    is_dns1123_label, validate_fqdn, validate_ip_address, validate_labels, validate_port,
};
use super::{Path, Report, parse};

/// Checks one ServiceEndpoints.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(spec) = parse::<ServiceEndpoints>(obj, report) else {
        return;
    };
    let at = Path::spec();
    if spec.is_part(&obj.name) {
        validate_part(obj, &spec, &at, report);
    } else if !spec.service.is_empty() && !is_dns1123_label(&spec.service) {
        report.error(
            &at.field("service"),
            format!(
                "{:?} is not a Service name (a DNS-1123 label)",
                spec.service
            ),
        );
    } else if !spec.endpoint_ports.is_empty() {
        report.error(
            &at.field("endpointPorts"),
            "only a part of a service's endpoints (one with spec.service) lists endpointPorts",
        );
    }
    let mut numbers = BTreeSet::new();
    let mut names = BTreeSet::new();
    for (i, port) in spec.ports.iter().enumerate() {
        let at = at.field("ports").index(i);
        report.check(&at.field("port"), validate_port(i64::from(port.port)));
        if !numbers.insert((port.port, port.protocol.to_ascii_uppercase())) {
            report.error(
                &at.field("port"),
                format!("port {} is listed twice", port.port),
            );
        }
        if !names.insert(port.name.as_str()) {
            report.error(
                &at.field("name"),
                format!("port name {:?} is used twice", port.name),
            );
        }
        if spec.ports.len() > 1 && port.name.is_empty() {
            report.error(
                &at.field("name"),
                "required when a service has several ports",
            );
        }
        match &port.target_port {
            Some(TargetPort::Number(n)) if *n != 0 => {
                report.check(&at.field("targetPort"), validate_port(i64::from(*n)))
            }
            Some(TargetPort::Name(name)) if name.is_empty() => {
                report.error(&at.field("targetPort"), "must not be empty")
            }
            _ => {}
        }
    }
    for (i, address) in spec.addresses.iter().enumerate() {
        if !address.eq_ignore_ascii_case("none") {
            report.check(
                &at.field("addresses").index(i),
                validate_ip_address(address),
            );
        }
    }
    for (i, address) in spec.external_addresses.iter().enumerate() {
        let at = at.field("externalAddresses").index(i);
        if validate_ip_address(address).is_err() {
            report.check(&at, validate_fqdn(address));
        }
    }
    for (i, gateway) in spec.network_gateways.iter().enumerate() {
        let at = at.field("networkGateways").index(i);
        if gateway.network.is_empty() {
            report.error(&at.field("network"), "required: the network it leads into");
        }
        if validate_ip_address(&gateway.address).is_err() {
            report.check(&at.field("address"), validate_fqdn(&gateway.address));
        }
        // A gateway that takes HBONE only has no mutual TLS port (sidecars do not use it).
        if gateway.port != 0 || gateway.hbone_port == 0 {
            report.check(&at.field("port"), validate_port(i64::from(gateway.port)));
        }
        if gateway.hbone_port != 0 {
            report.check(
                &at.field("hbonePort"),
                validate_port(i64::from(gateway.hbone_port)),
            );
        }
    }
    for (i, endpoint) in spec.endpoints.iter().enumerate() {
        let at = at.field("endpoints").index(i);
        report.check(&at.field("address"), validate_ip_address(&endpoint.address));
        validate_labels(&at.field("labels"), &endpoint.labels, report);
        for (name, port) in &endpoint.ports {
            report.check(
                &at.field("ports").key(name),
                validate_port(i64::from(*port)),
            );
        }
    }
}

/// A part holds endpoints only; what describes the service is the service object's.
fn validate_part(obj: &Object, spec: &ServiceEndpoints, at: &Path, report: &mut Report) {
    if !is_dns1123_label(&spec.service) {
        report.error(
            &at.field("service"),
            format!(
                "{:?} is not a Service name (a DNS-1123 label)",
                spec.service
            ),
        );
    }
    if spec.service == obj.name {
        report.error(
            &at.field("service"),
            "a part of a service's endpoints cannot have the service's own name",
        );
    }
    let owned_by_service = [
        ("addresses", spec.addresses.is_empty()),
        ("ports", spec.ports.is_empty()),
        ("selector", spec.selector.is_empty()),
        ("externalName", spec.external_name.is_empty()),
        ("exportTo", spec.export_to.is_empty()),
        ("externalAddresses", spec.external_addresses.is_empty()),
        ("networkGateways", spec.network_gateways.is_empty()),
    ];
    for (field, empty) in owned_by_service {
        if !empty {
            report.error(
                &at.field(field),
                format!(
                    "belongs on the service object {:?}, not on a part of its endpoints \
                     (spec.service is set)",
                    spec.service
                ),
            );
        }
    }
    for (name, port) in &spec.endpoint_ports {
        report.check(
            &at.field("endpointPorts").key(name),
            validate_port(i64::from(*port)),
        );
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::validation::validate;
    use pasa_proto::Object;

    fn errors(name: &str, spec: serde_json::Value) -> Vec<String> {
        let obj = Object::from_json(
            &json!({
                "apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
                "metadata": {"name": name, "namespace": "bookinfo"}, "spec": spec,
            }),
            "default",
            pasa_istio::generated::is_generated_object,
        )
        .unwrap();
        validate(&obj)
            .errors
            .iter()
            .map(|p| p.field.clone())
            .collect()
    }

    #[test]
    fn services_and_parts_of_their_endpoints() {
        let service = json!({
            "addresses": ["10.96.0.12"],
            "ports": [{"name": "http", "port": 9080, "targetPort": "web"}],
            "endpoints": [{"address": "10.42.0.7", "labels": {"app": "reviews"}, "ports": {"web": 9080}}],
        });
        assert_eq!(errors("reviews", service), Vec::<String>::new());
        let part = json!({
            "service": "reviews", "endpointPorts": {"http": 9080},
            "endpoints": [{"address": "10.42.0.8"}, {"address": "fd00::8"}],
        });
        assert_eq!(
            errors("reviews-x7k2p.endpointslice", part),
            Vec::<String>::new()
        );
    }

    #[test]
    fn bad_fields_are_named() {
        assert_eq!(
            errors(
                "reviews",
                json!({"ports": [{"name": "http", "port": 0}, {"name": "http", "port": 80}],
                       "endpoints": [{"address": "pod-a"}], "endpointPorts": {"http": 80}})
            ),
            [
                "spec.endpointPorts",
                "spec.ports[0].port",
                "spec.ports[1].name",
                "spec.endpoints[0].address"
            ]
        );
        assert_eq!(
            errors(
                "reviews-x7k2p.endpointslice",
                json!({"service": "Reviews_1", "ports": [{"name": "http", "port": 80}],
                       "exportTo": ["."], "endpointPorts": {"http": 70000}})
            ),
            [
                "spec.service",
                "spec.ports",
                "spec.exportTo",
                "spec.endpointPorts[http]"
            ]
        );
        assert_eq!(
            errors("reviews", json!({"service": "reviews"})),
            ["spec.service"]
        );
        // Another cluster's Service says which cluster it is of (else it is a part, which
        // has no ports); its gateways are checked.
        assert_eq!(
            errors(
                "reviews.cluster2.cluster",
                json!({"service": "reviews", "ports": [{"name": "http", "port": 80}]})
            ),
            ["spec.ports"]
        );
        assert_eq!(
            errors(
                "reviews.cluster2.cluster",
                json!({"service": "reviews", "cluster": "cluster2",
                       "ports": [{"name": "http", "port": 80}]})
            ),
            Vec::<String>::new()
        );
        // ... with no ports at all (an ExternalName Service of that cluster).
        assert_eq!(
            errors(
                "legacy.cluster2.cluster",
                json!({"service": "legacy", "cluster": "cluster2",
                       "externalName": "legacy.example.com"})
            ),
            Vec::<String>::new()
        );
        // A part that says its cluster is still a part.
        assert_eq!(
            errors(
                "reviews-x7k2p.cluster2.endpointslice",
                json!({"service": "reviews", "cluster": "cluster2",
                       "ports": [{"name": "http", "port": 80}]})
            ),
            ["spec.ports"]
        );
        assert_eq!(
            errors(
                "eastwest.cluster2.cluster",
                json!({"service": "eastwest", "cluster": "cluster2",
                       "ports": [{"name": "tls", "port": 15443}],
                       "externalAddresses": ["35.1.2.3", "lb.example.com", "no_such host"],
                       "networkGateways": [{"network": "", "address": "35.1.2.3", "port": 15443},
                                           {"network": "n2", "address": "a b", "port": 0}]})
            ),
            [
                "spec.externalAddresses[2]",
                "spec.networkGateways[0].network",
                "spec.networkGateways[1].address",
                "spec.networkGateways[1].port"
            ]
        );
        assert_eq!(
            errors("reviews", json!({"endpoint": []})),
            ["spec.endpoint"]
        );
    }
}
