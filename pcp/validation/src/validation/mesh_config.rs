//! Validation of a `MeshConfig` object (Istio's mesh config, kept in the store for the agents):
//! the fields PASA reads must parse, and the external authorizers among the extension providers
//! must be usable, as istiod's mesh-config validation requires. Other fields are kept as
//! written.

use std::collections::HashSet;

use pasa_istio::mesh_config::MeshConfig;
use pasa_proto::Object;

use super::common::validate_port;
use super::{Path, Report, parse};

/// Checks one MeshConfig.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(mesh) = parse::<MeshConfig>(obj, report) else {
        return;
    };
    let spec = Path::spec();
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
}
