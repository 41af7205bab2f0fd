//! What istiod's gRPC generator sends a proxyless gRPC client: per service port an API listener
//! named `<host>:<port>` whose connection manager takes its routes over RDS from the route
//! configuration `outbound|<port>||<host>`; that route configuration holds one virtual host for
//! the service with its VirtualService's routes (or the default route). Clusters and endpoints
//! are the outbound ones every generator shares, except for mesh TLS: gRPC clients take their
//! certificates from the certificate providers of their bootstrap, not from SDS.

use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateProviderPluginInstance, CertificateValidationContext, CommonTlsContext,
    UpstreamTlsContext, common_tls_context,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::util::pack_any;
use pasa_proto::istio::destination_rule::ClientTlsMode;

use super::filters::{self, Routes};
use super::route;
use super::{Built, View, names};

pub(super) fn listeners_and_routes(view: &View<'_>, out: &mut Built) {
    for service in view.services.values() {
        for port in &service.ports {
            let listener_name = names::host_port(&service.hostname, port.number);
            let route_name = names::outbound_cluster(port.number, "", &service.hostname);
            let mut hcm =
                filters::http_connection_manager(&listener_name, Routes::Rds(route_name.clone()));
            // gRPC clients refuse filters they do not implement; istiod gives them none for
            // CORS (a browser concern).
            hcm.http_filters.retain(|f| f.name != route::CORS_FILTER);
            out.listeners.insert(
                listener_name.clone(),
                Listener {
                    name: listener_name.clone(),
                    api_listener: Some(ApiListener {
                        api_listener: Some(pack_any(hcm)),
                    }),
                    ..Default::default()
                },
            );
            let routes = match view.virtual_service_for(&service.hostname) {
                Some(vs) => {
                    route::virtual_service_routes(vs, port.number, pasa_proto::gateway::MESH, view)
                }
                None => Vec::new(),
            };
            let mut routes = if routes.is_empty() {
                vec![view.default_route(service, port.number)]
            } else {
                routes
            };
            for route in &mut routes {
                grpc_deadline(route);
            }
            out.routes.insert(
                route_name.clone(),
                RouteConfiguration {
                    name: route_name,
                    virtual_hosts: vec![route::virtual_host(
                        listener_name,
                        route::domains(
                            &service.hostname,
                            Some(service),
                            port.number,
                            &view.proxy.dns_domain,
                        ),
                        routes,
                        true,
                    )],
                    ..Default::default()
                },
            );
        }
    }
}

/// gRPC clients read a route's timeout from `max_stream_duration` (not the deprecated
/// `max_grpc_timeout` Envoy gets), as istiod writes it for them.
#[allow(deprecated)]
fn grpc_deadline(route: &mut envoy_types::pb::envoy::config::route::v3::Route) {
    use envoy_types::pb::envoy::config::route::v3::route::Action;
    use envoy_types::pb::envoy::config::route::v3::route_action::MaxStreamDuration;
    if let Some(Action::Route(action)) = &mut route.action {
        action.max_grpc_timeout = None;
        action.max_stream_duration = Some(MaxStreamDuration {
            max_stream_duration: action.timeout,
            ..Default::default()
        });
    }
}

/// The certificate provider instance of Istio's gRPC bootstrap.
const CERTIFICATE_PROVIDER: &str = "default";

/// A DestinationRule's client TLS for a proxyless gRPC client, as istiod's gRPC generator builds
/// it: ISTIO_MUTUAL presents the workload certificate and checks the peer against the mesh root,
/// both from the bootstrap's `default` certificate provider (the current fields and the older
/// ones gRPC releases before 1.66 read), and pins the peer to the service's identities. SIMPLE and
/// MUTUAL are not offered to gRPC clients (istiod leaves them out too).
pub(super) fn upstream_tls(mode: ClientTlsMode, identities: &[String]) -> Option<TransportSocket> {
    if mode != ClientTlsMode::IstioMutual {
        return None;
    }
    let provider = |certificate: &str| CertificateProviderPluginInstance {
        instance_name: CERTIFICATE_PROVIDER.into(),
        certificate_name: certificate.into(),
    };
    let legacy = |certificate: &str| common_tls_context::CertificateProviderInstance {
        instance_name: CERTIFICATE_PROVIDER.into(),
        certificate_name: certificate.into(),
    };
    let sans = identities
        .iter()
        .map(|id| StringMatcher {
            match_pattern: Some(string_matcher::MatchPattern::Exact(id.clone())),
            ..Default::default()
        })
        .collect();
    #[allow(deprecated)]
    let common = CommonTlsContext {
        tls_certificate_provider_instance: Some(provider("default")),
        tls_certificate_certificate_provider_instance: Some(legacy("default")),
        validation_context_type: Some(
            common_tls_context::ValidationContextType::CombinedValidationContext(
                common_tls_context::CombinedCertificateValidationContext {
                    default_validation_context: Some(CertificateValidationContext {
                        ca_certificate_provider_instance: Some(provider("ROOTCA")),
                        match_subject_alt_names: sans,
                        ..Default::default()
                    }),
                    validation_context_certificate_provider_instance: Some(legacy("ROOTCA")),
                    ..Default::default()
                },
            ),
        ),
        ..Default::default()
    };
    Some(TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(
            UpstreamTlsContext {
                common_tls_context: Some(common),
                ..Default::default()
            },
        ))),
    })
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::transport_socket;
    use prost::Message;

    use crate::cache::Cache;
    use crate::model::proxy::Generator;
    use crate::translate::Translator;
    #[test]
    fn mesh_tls_comes_from_sds_for_envoy_and_from_certificate_providers_for_grpc() {
        use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
            UpstreamTlsContext, common_tls_context::ValidationContextType,
        };
        let (service, rule) = crate::translate::tests::mutual_reviews();
        let tls_of = |generator| {
            let mut t = Translator::new(crate::testing::sidecar("10.0.0.9"));
            let cache = Cache::from_resources(vec![service.clone(), rule.clone()], 10);
            let out = t
                .update(&cache, generator)
                .expect("decodes what it encoded");
            let socket = out.clusters["outbound|9080||reviews.default.svc.cluster.local"]
                .transport_socket
                .clone()
                .expect("mesh TLS");
            let Some(transport_socket::ConfigType::TypedConfig(any)) = socket.config_type else {
                panic!("a typed TLS context");
            };
            UpstreamTlsContext::decode(any.value.as_slice())
                .unwrap()
                .common_tls_context
                .unwrap()
        };
        // Envoy: the workload certificate over the istio-agent's SDS.
        let envoy = tls_of(Generator::Envoy);
        assert_eq!(envoy.tls_certificate_sds_secret_configs[0].name, "default");
        // gRPC: no SDS; the bootstrap's certificate provider, and the peer pinned to its identity.
        let grpc = tls_of(Generator::Grpc);
        assert!(grpc.tls_certificate_sds_secret_configs.is_empty());
        let provider = grpc.tls_certificate_provider_instance.expect("a provider");
        assert_eq!(
            (
                provider.instance_name.as_str(),
                provider.certificate_name.as_str()
            ),
            ("default", "default")
        );
        let Some(ValidationContextType::CombinedValidationContext(combined)) =
            grpc.validation_context_type
        else {
            panic!("a combined validation context");
        };
        let validation = combined.default_validation_context.unwrap();
        #[allow(deprecated)] // the field istiod's gRPC generator fills and gRPC clients read
        let sans = validation.match_subject_alt_names;
        assert_eq!(
            validation
                .ca_certificate_provider_instance
                .unwrap()
                .certificate_name,
            "ROOTCA"
        );
        assert_eq!(
            format!("{:?}", sans[0].match_pattern),
            format!(
                "{:?}",
                Some(
                    envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern::Exact(
                        "spiffe://cluster.local/ns/default/sa/bookinfo-reviews".into()
                    )
                )
            )
        );
    }
}
