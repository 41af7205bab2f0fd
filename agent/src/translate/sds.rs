//! Where Envoy fetches each TLS secret a generated resource names, as istiod points it there.
//!
//! - The workload certificate (`default`), the mesh root (`ROOTCA`) and certificates mounted in
//!   the pod (`file-cert:<cert>~<key>`, `file-root:<ca>`) come from the istio-agent in the pod,
//!   over its SDS socket: the `sds-grpc` cluster of Istio's bootstrap. The first two always exist,
//!   so Envoy waits for them (no initial fetch timeout).
//! - Credentials (`credentialName` of a Gateway, DestinationRule or Sidecar: `kubernetes://<name>`
//!   and `kubernetes://<name>-cacert`) come over ADS, from the xDS server. They may not exist, so
//!   Envoy's default fetch timeout applies: a missing credential does not hold back the whole
//!   listener or cluster.

use std::time::Duration as StdDuration;

use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiConfigSource, ApiVersion, ConfigSource, GrpcService,
    api_config_source::ApiType, grpc_service,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::SdsSecretConfig;
use envoy_types::pb::google::protobuf::Duration;

use crate::model::secrets::{CA_SUFFIX, KUBERNETES_PREFIX, ROOT_CA, WORKLOAD_CERTIFICATE};
/// The cluster of Istio's bootstrap that reaches the istio-agent's SDS server.
const SDS_CLUSTER: &str = "sds-grpc";

/// A secret the pod's istio-agent serves: the workload certificate, the root, or mounted files.
pub(super) fn from_istio_agent(name: &str) -> SdsSecretConfig {
    let always_there = name == WORKLOAD_CERTIFICATE || name == ROOT_CA;
    SdsSecretConfig {
        name: name.to_string(),
        sds_config: Some(ConfigSource {
            config_source_specifier: Some(ConfigSourceSpecifier::ApiConfigSource(
                ApiConfigSource {
                    api_type: ApiType::Grpc as i32,
                    set_node_on_first_message_only: true,
                    transport_api_version: ApiVersion::V3 as i32,
                    grpc_services: vec![GrpcService {
                        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                            grpc_service::EnvoyGrpc {
                                cluster_name: SDS_CLUSTER.into(),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            )),
            resource_api_version: ApiVersion::V3 as i32,
            initial_fetch_timeout: always_there.then(|| duration(StdDuration::ZERO)),
            ..Default::default()
        }),
    }
}

/// A credential named by `credentialName`, over ADS (`kubernetes://<name>` unless the name
/// already says where it lives).
pub(super) fn credential(name: &str) -> SdsSecretConfig {
    let name = if name.contains("://") {
        name.to_string()
    } else {
        format!("{KUBERNETES_PREFIX}{name}")
    };
    SdsSecretConfig {
        name,
        sds_config: Some(ConfigSource {
            config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
            resource_api_version: ApiVersion::V3 as i32,
            ..Default::default()
        }),
    }
}

/// The CA bundle of a credential (`<credential>-cacert`), over ADS.
pub(super) fn credential_ca(name: &str) -> SdsSecretConfig {
    credential(&format!("{name}{CA_SUFFIX}"))
}

fn duration(d: StdDuration) -> Duration {
    Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_certificates_come_from_the_istio_agent_and_are_waited_for() {
        for name in [WORKLOAD_CERTIFICATE, ROOT_CA] {
            let sds = from_istio_agent(name);
            let source = sds.sds_config.unwrap();
            let Some(ConfigSourceSpecifier::ApiConfigSource(api)) = source.config_source_specifier
            else {
                panic!("{name}: an API config source");
            };
            let Some(grpc_service::TargetSpecifier::EnvoyGrpc(grpc)) =
                &api.grpc_services[0].target_specifier
            else {
                panic!("{name}: an Envoy gRPC service");
            };
            assert_eq!(grpc.cluster_name, "sds-grpc");
            assert!(api.set_node_on_first_message_only);
            assert_eq!(source.initial_fetch_timeout, Some(Duration::default()));
        }
        let file = from_istio_agent("file-cert:/etc/certs/cert.pem~/etc/certs/key.pem");
        assert_eq!(file.sds_config.unwrap().initial_fetch_timeout, None);
    }

    #[test]
    fn credentials_come_over_ads_and_may_be_missing() {
        let sds = credential("web-cert");
        assert_eq!(sds.name, "kubernetes://web-cert");
        let source = sds.sds_config.unwrap();
        assert!(matches!(
            source.config_source_specifier,
            Some(ConfigSourceSpecifier::Ads(_))
        ));
        assert_eq!(
            source.initial_fetch_timeout, None,
            "Envoy's default: a missing credential does not hold back the listener"
        );
        assert_eq!(
            credential_ca("web-cert").name,
            "kubernetes://web-cert-cacert"
        );
        assert_eq!(
            credential("kubernetes-gateway://ns/web").name,
            "kubernetes-gateway://ns/web"
        );
    }
}
