//! What istiod's gRPC generator sends a proxyless gRPC client: per service port an API listener
//! named `<host>:<port>` whose connection manager takes its routes over RDS from the route
//! configuration `outbound|<port>||<host>`; that route configuration holds one virtual host for
//! the service with its VirtualService's routes (or the default route). Clusters and endpoints
//! are the outbound ones every generator shares, with only the fields gRPC reads (see
//! `cluster::grpc_shared`); mesh TLS comes from the certificate providers of the client's
//! bootstrap, not from SDS. A client of the service's namespace may name it by a short name
//! (see [`grpc_listener`]).
//!
//! A proxyless gRPC *server* asks for the listener of the address it listens on,
//! `xds.istio.io/grpc/lds/inbound/<ip>:<port>`, and serves calls only as that listener says:
//! mutual TLS from the PeerAuthentications, RBAC from the AuthorizationPolicies (see
//! [`server_listeners`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use envoy_types::pb::envoy::config::listener::v3::{
    ApiListener, Filter, FilterChain, Listener, filter,
};
use envoy_types::pb::envoy::config::route::v3::{
    NonForwardingAction, Route, RouteConfiguration, RouteMatch, VirtualHost,
    route::Action as RouteAction, route_match,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, Rds, http_connection_manager::RouteSpecifier,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateProviderPluginInstance, CertificateValidationContext, CommonTlsContext,
    DownstreamTlsContext, UpstreamTlsContext, common_tls_context,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;
use pasa_istio::destination_rule::ClientTlsMode;
use prost::Message;

use super::endpoint::socket_address;
use super::filters;
use super::{Built, View, authz, builders, names, route, session};
use crate::model::authn::{MergedPolicy, MtlsMode};
use crate::model::registry::TLS_MODE_LABEL;
use crate::resource::{Resource, ResourceMap};

/// The names of the listeners proxyless gRPC servers ask for (the
/// `server_listener_resource_name_template` of Istio's gRPC bootstrap): this, then the
/// `<ip>:<port>` the server listens on.
pub const SERVER_LISTENER_PREFIX: &str = "xds.istio.io/grpc/lds/inbound/";
/// The host in the name of the listener kept per served port: [`server_listener`] answers it for
/// whatever address a server on that port listens on.
const ANY_HOST: &str = "*";

pub(super) fn listeners_and_routes(view: &View<'_>, out: &mut Built) {
    for service in view.services.values() {
        for port in &service.ports {
            let listener_name = names::host_port(&service.hostname, port.number);
            let route_name = names::outbound_cluster(port.number, "", &service.hostname);
            // Only the filters gRPC clients implement (none for CORS, a browser concern); first,
            // the service's persistent sessions (gRPC's cookie affinity), as istiod sets them.
            let mut http_filters = vec![filters::fault(), filters::router()];
            if let Some(session) = view.session_of(&service.hostname) {
                http_filters.insert(0, session::filter_for(session));
            }
            let hcm = HttpConnectionManager {
                route_specifier: Some(RouteSpecifier::Rds(Rds {
                    config_source: Some(builders::grpc_ads()),
                    route_config_name: route_name.clone(),
                })),
                http_filters,
                ..Default::default()
            };
            // The service's address, as istiod gives it (gRPC does not read it).
            let address = service
                .addresses
                .iter()
                .find(|a| !a.contains('/'))
                .map_or("0.0.0.0", String::as_str);
            out.listeners.insert(
                listener_name.clone(),
                Listener {
                    name: listener_name.clone(),
                    address: Some(socket_address(address, port.number)),
                    api_listener: Some(ApiListener {
                        api_listener: Some(pack_any(hcm)),
                    }),
                    ..Default::default()
                },
            );
            let routes = match view.virtual_service_for(&service.hostname) {
                Some(vs) => {
                    route::virtual_service_routes(vs, port.number, pasa_istio::gateway::MESH, view)
                }
                None => Vec::new(),
            };
            // A VirtualService's deadlines as gRPC reads them; the default route keeps the
            // deadline Envoy reads (none), as istiod leaves it.
            let routes = if routes.is_empty() {
                vec![view.default_route(service, port.number)]
            } else {
                let mut routes = routes;
                routes.iter_mut().for_each(grpc_deadline);
                routes
            };
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
    server_listeners(view, out);
}

/// A listener per port the workload serves a service on, for a gRPC server listening there,
/// as istiod's gRPC generator builds it; [`server_listener`] hands it out under the name the
/// server asks for. One filter chain, without a match (gRPC servers match chains on little
/// more than the transport):
/// - mutual TLS when the port's PeerAuthentication mode is STRICT, or PERMISSIVE on a pod
///   labelled `security.istio.io/tlsMode: istio` (its clients use mutual TLS automatically, and
///   a gRPC server cannot take both); plaintext otherwise. The server presents the workload
///   certificate of its bootstrap's `default` certificate provider and requires the client's,
///   signed by the mesh root;
/// - a connection manager whose filters are the RBAC filters of the AuthorizationPolicies that
///   apply (see [`authz::grpc_server_filters`]), then the router, and whose one route hands every
///   call to the server (a non-forwarding action).
fn server_listeners(view: &View<'_>, out: &mut Built) {
    let ports: BTreeSet<u32> = view.local_instances().iter().map(|l| l.target).collect();
    if ports.is_empty() {
        return;
    }
    let proxy = view.proxy;
    let policy = MergedPolicy::compose(
        view.registry.peer_authentications(),
        &proxy.mesh.root_namespace,
        &proxy.namespace,
        &proxy.labels,
    );
    let auto_mtls = proxy
        .labels
        .get(TLS_MODE_LABEL)
        .is_some_and(|v| v == "istio");
    let mut http_filters = authz::grpc_server_filters(view);
    http_filters.push(filters::router());
    for port in ports {
        let mutual = match policy.for_port(port) {
            MtlsMode::Strict => true,
            MtlsMode::Permissive => auto_mtls,
            MtlsMode::Disable => false,
        };
        let suffix = if mutual { "mtls" } else { "plaintext" };
        let hcm = HttpConnectionManager {
            route_specifier: Some(RouteSpecifier::RouteConfig(RouteConfiguration {
                name: "inbound".into(),
                virtual_hosts: vec![VirtualHost {
                    domains: vec!["*".into()],
                    routes: vec![Route {
                        r#match: Some(RouteMatch {
                            path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                            ..Default::default()
                        }),
                        action: Some(RouteAction::NonForwardingAction(NonForwardingAction {})),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            })),
            http_filters: http_filters.clone(),
            ..Default::default()
        };
        let chain = FilterChain {
            name: format!("inbound-{suffix}"),
            filters: vec![Filter {
                name: format!("inbound-hcm{suffix}"),
                config_type: Some(filter::ConfigType::TypedConfig(pack_any(hcm))),
            }],
            transport_socket: mutual.then(|| TransportSocket {
                name: TLS_SOCKET.into(),
                config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(
                    DownstreamTlsContext {
                        common_tls_context: Some(common_tls(Vec::new())),
                        require_client_certificate: Some(BoolValue { value: true }),
                        ..Default::default()
                    },
                ))),
            }),
            ..Default::default()
        };
        let name = server_listener_name(ANY_HOST, port);
        out.listeners.insert(
            name.clone(),
            Listener {
                name,
                address: Some(socket_address("0.0.0.0", port)),
                filter_chains: vec![chain],
                ..Default::default()
            },
        );
    }
}

fn server_listener_name(host: &str, port: u32) -> String {
    let mut name = String::from(SERVER_LISTENER_PREFIX);
    name.push_str(&names::host_port(host, port));
    name
}

/// A listener a proxyless gRPC client asks for by a name the translation does not hold, made
/// as asked, as istiod makes it:
/// - a server's, `xds.istio.io/grpc/lds/inbound/<ip>:<port>` (see [`server_listener`]);
/// - a client's for a service of its own namespace named `<name>:<port>`,
///   `<name>.<namespace>:<port>` or `<name>.<namespace>.svc:<port>` (the proxy's `dns_domain` is
///   `<namespace>.svc.<cluster domain>`): the listener of the full name, named as asked (its
///   routes are the full name's; their domains list the short names too).
pub fn grpc_listener(
    name: &str,
    listeners: &ResourceMap,
    dns_domain: &str,
) -> Option<Arc<Resource>> {
    if name.starts_with(SERVER_LISTENER_PREFIX) {
        return server_listener(name, listeners);
    }
    let (host, port) = name.rsplit_once(':')?;
    let port: u32 = port.parse().ok()?;
    let full = full_name(host, dns_domain)?;
    let kept = listeners.get(&names::host_port(&full, port))?;
    renamed(kept, name, |_| {})
}

/// The full name of `host` when it is a short name of a service of the proxy's namespace.
fn full_name(host: &str, dns_domain: &str) -> Option<String> {
    let (namespace, _) = dns_domain.split_once(".svc.")?;
    if !host.contains('.') {
        return Some(format!("{host}.{dns_domain}"));
    }
    let short = host
        .strip_suffix(&format!(".{namespace}"))
        .or_else(|| host.strip_suffix(&format!(".{namespace}.svc")))?;
    Some(format!("{short}.{dns_domain}"))
}

/// The listener for the gRPC server that asks for `name` (`xds.istio.io/grpc/lds/inbound/<ip>:<port>`):
/// the one `listeners` holds for its port, named and addressed as asked. `None` when `name` is
/// not a server's listener, or no service of the workload targets its port (as istiod, which
/// leaves the server without a listener, so it does not serve).
fn server_listener(name: &str, listeners: &ResourceMap) -> Option<Arc<Resource>> {
    let address = name.strip_prefix(SERVER_LISTENER_PREFIX)?;
    let (host, port) = address.rsplit_once(':')?;
    let host = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.strip_suffix(']')?,
        None if host.contains(':') => return None,
        None => host,
    };
    let port: u32 = port.parse().ok()?;
    let kept = listeners.get(&server_listener_name(ANY_HOST, port))?;
    renamed(kept, name, |listener| {
        listener.address = Some(socket_address(host, port));
    })
}

/// `kept` under the name `name`, changed by `change`.
fn renamed(
    kept: &Resource,
    name: &str,
    change: impl FnOnce(&mut Listener),
) -> Option<Arc<Resource>> {
    let mut listener = Listener::decode(kept.body.value.as_slice()).ok()?;
    listener.name = name.to_string();
    change(&mut listener);
    Some(Resource::pack(&listener))
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
const TLS_SOCKET: &str = "envoy.transport_sockets.tls";

/// A DestinationRule's client TLS for a proxyless gRPC client, as istiod's gRPC generator builds
/// it: ISTIO_MUTUAL (see [`common_tls`]) pinning the peer to the service's identities. SIMPLE
/// and MUTUAL are not offered to gRPC clients (istiod leaves them out too).
pub(super) fn upstream_tls(mode: ClientTlsMode, identities: &[String]) -> Option<TransportSocket> {
    if mode != ClientTlsMode::IstioMutual {
        return None;
    }
    let sans = identities
        .iter()
        .map(|id| StringMatcher {
            match_pattern: Some(string_matcher::MatchPattern::Exact(id.clone())),
            ..Default::default()
        })
        .collect();
    Some(TransportSocket {
        name: TLS_SOCKET.into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(
            UpstreamTlsContext {
                common_tls_context: Some(common_tls(sans)),
                ..Default::default()
            },
        ))),
    })
}

/// Istio mutual TLS for gRPC: the workload certificate presented and the peer's checked against
/// the mesh root, both from the bootstrap's `default` certificate provider (the current fields
/// and the older ones gRPC releases before 1.66 read); the peer's name one of `sans`, when any.
fn common_tls(sans: Vec<StringMatcher>) -> CommonTlsContext {
    let provider = |certificate: &str| CertificateProviderPluginInstance {
        instance_name: CERTIFICATE_PROVIDER.into(),
        certificate_name: certificate.into(),
    };
    let legacy = |certificate: &str| common_tls_context::CertificateProviderInstance {
        instance_name: CERTIFICATE_PROVIDER.into(),
        certificate_name: certificate.into(),
    };
    #[allow(deprecated)]
    CommonTlsContext {
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
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::transport_socket;
    use envoy_types::pb::envoy::config::listener::v3::Listener;
    use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    use prost::Message;
    use serde_json::{Value, json};

    use std::collections::BTreeMap;

    use super::{SERVER_LISTENER_PREFIX, grpc_listener, server_listener};
    use crate::cache::Cache;
    use crate::model::proxy::Generator;
    use crate::resource::Resource;
    use crate::resource::ResourceMap;
    use crate::testing::resource;
    use crate::translate::Translator;
    use crate::translate::tests::reviews_service;

    /// What the gRPC generator builds for `proxy` from `resources`: its listeners as built, and
    /// packed as the ADS server holds them.
    fn grpc_listeners(
        proxy: crate::model::proxy::Proxy,
        resources: Vec<pasa_proto::store::v1::Resource>,
    ) -> (BTreeMap<String, Listener>, ResourceMap) {
        let out = Translator::new(proxy)
            .update(&Cache::from_resources(resources, 100), Generator::Grpc)
            .expect("decodes what it encoded");
        let kept = out
            .listeners
            .iter()
            .map(|(n, l)| (n.clone(), Resource::pack(l)))
            .collect();
        (out.listeners, kept)
    }

    /// What a gRPC server of reviews (`10.0.0.2`, `app: reviews` and `labels`) listening on
    /// `0.0.0.0:9080` is sent, given `policies`.
    fn server_of(
        labels: &[(&str, &str)],
        policies: Vec<pasa_proto::store::v1::Resource>,
    ) -> Listener {
        let mut proxy = crate::testing::sidecar("10.0.0.2");
        proxy.labels = [("app", "reviews")]
            .iter()
            .chain(labels)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut resources = vec![reviews_service()];
        resources.extend(policies);
        let (_, kept) = grpc_listeners(proxy, resources);
        let name = format!("{SERVER_LISTENER_PREFIX}0.0.0.0:9080");
        let served = server_listener(&name, &kept).expect("a listener for a served port");
        Listener::decode(served.body.value.as_slice()).unwrap()
    }

    fn security(
        kind: &str,
        name: &str,
        spec: Value,
        revision: u64,
    ) -> pasa_proto::store::v1::Resource {
        let mut r = resource(kind, "default", name, spec, revision);
        r.api_version = "security.istio.io/v1".into();
        r
    }

    fn server_hcm(listener: &Listener) -> HttpConnectionManager {
        let chain = &listener.filter_chains[0];
        let Some(envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(
            any,
        )) = &chain.filters[0].config_type
        else {
            panic!("a typed connection manager");
        };
        HttpConnectionManager::decode(any.value.as_slice()).unwrap()
    }

    #[test]
    fn a_server_listener_is_made_for_the_address_asked_for() {
        let mut proxy = crate::testing::sidecar("10.0.0.2");
        proxy.labels = [("app".to_string(), "reviews".to_string())].into();
        let (_, kept) = grpc_listeners(proxy, vec![reviews_service()]);
        for (address, host) in [
            ("0.0.0.0:9080", "0.0.0.0"),
            ("[::]:9080", "::"),
            ("10.0.0.2:9080", "10.0.0.2"),
        ] {
            let name = format!("{SERVER_LISTENER_PREFIX}{address}");
            let served = server_listener(&name, &kept).expect(address);
            let listener = Listener::decode(served.body.value.as_slice()).unwrap();
            assert_eq!(listener.name, name);
            assert_eq!(
                listener.address,
                Some(crate::translate::endpoint::socket_address(host, 9080))
            );
        }
        // No service targets the port, the name is not a server's, or not an address.
        for name in [
            format!("{SERVER_LISTENER_PREFIX}0.0.0.0:9090"),
            "reviews.default.svc.cluster.local:9080".to_string(),
            format!("{SERVER_LISTENER_PREFIX}::9080"),
            format!("{SERVER_LISTENER_PREFIX}0.0.0.0"),
        ] {
            assert!(server_listener(&name, &kept).is_none(), "{name}");
        }
    }

    #[test]
    fn a_client_may_name_a_service_of_its_namespace_by_a_short_name() {
        let (listeners, kept) =
            grpc_listeners(crate::testing::sidecar("10.0.0.9"), vec![reviews_service()]);
        let domain = "default.svc.cluster.local";
        let full = &listeners["reviews.default.svc.cluster.local:9080"];
        for name in [
            "reviews:9080",
            "reviews.default:9080",
            "reviews.default.svc:9080",
        ] {
            let made = grpc_listener(name, &kept, domain).expect(name);
            let listener = Listener::decode(made.body.value.as_slice()).unwrap();
            // The full name's listener (its routes), named as asked.
            assert_eq!(listener.name, name);
            assert_eq!(listener.api_listener, full.api_listener);
        }
        // Another namespace's short names, another port, or no domain to expand with.
        for (name, domain) in [
            ("reviews.shop:9080", domain),
            ("reviews:9090", domain),
            ("reviews", domain),
            ("reviews:9080", ""),
        ] {
            assert!(grpc_listener(name, &kept, domain).is_none(), "{name}");
        }
    }

    #[test]
    fn a_server_uses_mutual_tls_when_its_mode_says_so_or_its_clients_use_it_automatically() {
        let mutual = |l: &Listener| {
            let chain = &l.filter_chains[0];
            assert_eq!(l.filter_chains.len(), 1);
            (chain.name.clone(), chain.transport_socket.is_some())
        };
        // PERMISSIVE (no policy): plaintext, unless the pod's clients use mutual TLS
        // automatically (a gRPC server cannot take both).
        assert_eq!(
            mutual(&server_of(&[], vec![])),
            ("inbound-plaintext".into(), false)
        );
        let auto = [("security.istio.io/tlsMode", "istio")];
        assert_eq!(
            mutual(&server_of(&auto, vec![])),
            ("inbound-mtls".into(), true)
        );
        let mode = |mode: &str| {
            security(
                "PeerAuthentication",
                "default",
                json!({"mtls": {"mode": mode}}),
                10,
            )
        };
        assert_eq!(
            mutual(&server_of(&[], vec![mode("STRICT")])),
            ("inbound-mtls".into(), true)
        );
        assert_eq!(
            mutual(&server_of(&auto, vec![mode("DISABLE")])),
            ("inbound-plaintext".into(), false)
        );
    }

    #[test]
    fn a_server_enforces_allow_and_deny_and_what_it_cannot_check_is_not_sent() {
        let policy = |name: &str, spec: Value, annotations: &[(&str, &str)], revision| {
            let mut r = security("AuthorizationPolicy", name, spec, revision);
            r.annotations = annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            r
        };
        let from = |sa: &str| json!([{"from": [{"source": {"principals": [format!("cluster.local/ns/default/sa/{sa}")]}}]}]);
        let listener = server_of(
            &[],
            vec![
                policy(
                    "allow",
                    json!({"action": "ALLOW", "rules": from("frontend")}),
                    &[],
                    10,
                ),
                // Dry-run: not enforced.
                policy(
                    "trial",
                    json!({"action": "DENY", "rules": from("frontend")}),
                    &[("istio.io/dry-run", "true")],
                    11,
                ),
                // gRPC has neither AUDIT nor CUSTOM.
                policy("audit", json!({"action": "AUDIT", "rules": [{}]}), &[], 12),
                policy("nothing", json!({"action": "ALLOW"}), &[], 13),
            ],
        );
        let hcm = server_hcm(&listener);
        let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            ["envoy.filters.http.rbac", "envoy.filters.http.router"]
        );
        let Some(envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType::TypedConfig(any)) =
            &hcm.http_filters[0].config_type
        else {
            panic!("typed RBAC");
        };
        let rules = HttpRbac::decode(any.value.as_slice())
            .unwrap()
            .rules
            .unwrap();
        let mut policies: Vec<&String> = rules.policies.keys().collect();
        policies.sort();
        // An ALLOW policy without rules ("allow nothing") matches nothing, so with it nothing
        // but the frontend's calls is allowed: istiod's gRPC generator dropped it.
        assert_eq!(policies, ["default-allow-0", "default-nothing-0"]);
        use envoy_types::pb::envoy::config::rbac::v3::{Permission, permission};
        let never = Permission {
            rule: Some(permission::Rule::NotRule(Box::new(Permission {
                rule: Some(permission::Rule::Any(true)),
            }))),
        };
        assert_eq!(rules.policies["default-nothing-0"].permissions, [never]);
    }
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
