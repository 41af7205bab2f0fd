//! Validation of a `MeshConfig` object (Istio's mesh config, kept in the store for the agents):
//! the fields PASA reads must parse, and the external authorizers among the extension providers
//! must be usable, as istiod's mesh-config validation requires. Other fields are kept as
//! written.

use std::collections::HashSet;

use pasa_istio::mesh_config::MeshConfig;
use pasa_proto::Object;

use super::common::{validate_fqdn, validate_ip_address, validate_ip_subnet, validate_port};
use super::{Path, Report, parse};

/// Checks one MeshConfig.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(mesh) = parse::<MeshConfig>(obj, report) else {
        return;
    };
    let spec = Path::spec();
    if let Some(value) = mesh.other.get("meshNetworks") {
        validate_mesh_networks(&spec.field("meshNetworks"), value, report);
    }
    let mut names = HashSet::new();
    for (i, provider) in mesh.extension_providers.iter().enumerate() {
        let at = spec.field("extensionProviders").index(i);
        if provider.name.is_empty() {
            report.error(
                &at.field("name"),
                "extension provider name must not be empty",
            );
        } else if !names.insert(provider.name.as_str()) {
            report.error(
                &at.field("name"),
                format!(
                    "extension provider name must be unique, found duplicate: {}",
                    provider.name
                ),
            );
        }
        let target = |report: &mut Report, field: &str, service: &str, port: u32, status: &str| {
            let here = at.field(field);
            if service.is_empty() {
                report.error(&here.field("service"), "service must not be empty");
            }
            report.check(&here.field("port"), validate_port(i64::from(port)));
            if !status.is_empty()
                && !status
                    .parse::<u16>()
                    .is_ok_and(|c| (100..=599).contains(&c))
            {
                report.error(
                    &here.field("statusOnError"),
                    format!("unsupported statusOnError {status}"),
                );
            }
        };
        if let Some(http) = &provider.envoy_ext_authz_http {
            target(
                report,
                "envoyExtAuthzHttp",
                &http.service,
                http.port,
                &http.status_on_error,
            );
            if !http.path_prefix.is_empty() && !http.path_prefix.starts_with('/') {
                report.error(
                    &at.field("envoyExtAuthzHttp").field("pathPrefix"),
                    format!(
                        "pathPrefix should begin with `/` but found {:?}",
                        http.path_prefix
                    ),
                );
            }
        }
        if let Some(grpc) = &provider.envoy_ext_authz_grpc {
            target(
                report,
                "envoyExtAuthzGrpc",
                &grpc.service,
                grpc.port,
                &grpc.status_on_error,
            );
        }
    }
    for (i, alias) in mesh.trust_domain_aliases.iter().enumerate() {
        if alias.is_empty() {
            report.error(
                &spec.field("trustDomainAliases").index(i),
                "must not be empty",
            );
        }
    }
}

/// The mesh's networks (`meshNetworks`), as istiod checks them: each endpoint set is a
/// registry or an address range (exactly one), each gateway an address or a Service's FQDN
/// (exactly one) with a port.
fn validate_mesh_networks(at: &Path, value: &serde_json::Value, report: &mut Report) {
    use pasa_istio::mesh_networks::MeshNetworks;
    let networks: MeshNetworks = match serde_json::from_value(value.clone()) {
        Ok(n) => n,
        Err(e) => {
            report.error(at, format!("not Istio's MeshNetworks: {e}"));
            return;
        }
    };
    for (name, network) in &networks.networks {
        let here = at.field("networks").key(name);
        for (i, e) in network.endpoints.iter().enumerate() {
            let at = here.field("endpoints").index(i);
            match (e.from_registry.is_empty(), e.from_cidr.is_empty()) {
                (false, true) => {}
                (true, false) => {
                    report.check(&at.field("fromCidr"), validate_ip_subnet(&e.from_cidr))
                }
                _ => report.error(&at, "exactly one of fromRegistry and fromCidr must be set"),
            }
        }
        for (i, g) in network.gateways.iter().enumerate() {
            let at = here.field("gateways").index(i);
            match (g.registry_service_name.is_empty(), g.address.is_empty()) {
                (false, true) => report.check(
                    &at.field("registryServiceName"),
                    validate_fqdn(&g.registry_service_name),
                ),
                (true, false) => {
                    if validate_ip_address(&g.address).is_err() {
                        report.check(&at.field("address"), validate_fqdn(&g.address));
                    }
                }
                _ => report.error(
                    &at,
                    "exactly one of registryServiceName and address must be set",
                ),
            }
            report.check(&at.field("port"), validate_port(i64::from(g.port)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(spec: serde_json::Value) -> Report {
        let obj = Object::from_json(
            &serde_json::json!({"apiVersion": "pasa.io/v1alpha1", "kind": "MeshConfig",
                                "metadata": {"name": "mesh", "namespace": "istio-system"},
                                "spec": spec}),
            "default",
            pasa_istio::generated::is_generated_object,
        )
        .unwrap();
        super::super::validate(&obj)
    }

    #[test]
    fn external_authorizers_must_be_usable_and_the_rest_is_kept() {
        let ok = check(serde_json::json!({
        "trustDomain": "example.org",
        "accessLogFile": "/dev/stdout",
        "extensionProviders": [
            {"name": "authz", "envoyExtAuthzHttp": {"service": "authz.foo.svc.cluster.local", "port": 8000}},
            {"name": "zipkin", "zipkin": {"service": "zipkin.istio-system.svc.cluster.local", "port": 9411}},
        ]}));
        assert!(ok.is_valid(), "{:?}", ok.errors);
        let bad = check(serde_json::json!({"extensionProviders": [
            {"name": "a", "envoyExtAuthzGrpc": {"service": "", "port": 0, "statusOnError": "999"}},
            {"name": "a", "envoyExtAuthzHttp": {"service": "x", "port": 80, "pathPrefix": "check"}},
            {"name": "b", "envoyExtAuthzHttp": {"service": "x", "port": 80, "unknown": 1}},
        ]}));
        let fields: Vec<&str> = bad.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            ["spec.extensionProviders[2].envoyExtAuthzHttp.unknown"],
            "a field the authorizer does not have stops the parse: {:?}",
            bad.errors
        );
        let bad = check(serde_json::json!({"extensionProviders": [
            {"name": "a", "envoyExtAuthzGrpc": {"service": "", "port": 0, "statusOnError": "999"}},
            {"name": "a", "envoyExtAuthzHttp": {"service": "x", "port": 80, "pathPrefix": "check"}},
        ]}));
        let fields: Vec<&str> = bad.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.extensionProviders[0].envoyExtAuthzGrpc.service",
                "spec.extensionProviders[0].envoyExtAuthzGrpc.port",
                "spec.extensionProviders[0].envoyExtAuthzGrpc.statusOnError",
                "spec.extensionProviders[1].name",
                "spec.extensionProviders[1].envoyExtAuthzHttp.pathPrefix",
            ]
        );
    }

    /// The mesh's networks are checked as istiod checks them, each problem at its field.
    #[test]
    fn mesh_networks_are_checked() {
        let ok = check(serde_json::json!({"meshNetworks": {"networks": {"n1": {
            "endpoints": [{"fromRegistry": "c1"}, {"fromCidr": "10.0.0.0/16"}],
            "gateways": [{"registryServiceName": "eastwest.istio-system.svc.cluster.local",
                          "port": 15443},
                         {"address": "35.1.2.3", "port": 15443}]}}}}));
        assert!(ok.is_valid(), "{:?}", ok.errors);
        let bad = check(serde_json::json!({"meshNetworks": {"networks": {"n1": {
            "endpoints": [{"fromRegistry": "c1", "fromCidr": "10.0.0.0/16"},
                          {"fromCidr": "10.0.0.0/99"}],
            "gateways": [{"port": 15443}, {"address": "35.1.2.3", "port": 0}]}}}}));
        let fields: Vec<&str> = bad.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.meshNetworks.networks[n1].endpoints[0]",
                "spec.meshNetworks.networks[n1].endpoints[1].fromCidr",
                "spec.meshNetworks.networks[n1].gateways[0]",
                "spec.meshNetworks.networks[n1].gateways[1].port",
            ]
        );
        let unknown =
            check(serde_json::json!({"meshNetworks": {"networks": {"n1": {"gatways": []}}}}));
        let fields: Vec<&str> = unknown.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.meshNetworks"]);
    }
}
