//! Router translation, one behaviour per test: what a client of the gateway would notice.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier as RouteCluster;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
use pasa_proto::store::v1::Resource;
use prost::Message;
use serde_json::{Value, json};

use super::super::{Generator, Proxy, Resources, Translator};
use crate::cache::Cache;
use crate::testing::resource;

const ROUTER_IP: &str = "10.0.0.50";

fn router() -> Proxy {
    crate::testing::router(ROUTER_IP)
}

fn translate(resources: Vec<Resource>) -> Resources {
    Translator::new(router())
        .update(&Cache::from_resources(resources, 100), Generator::Envoy)
        .expect("decodes what it encoded")
}

/// A Gateway selecting the router.
fn gateway(name: &str, servers: Value, revision: u64) -> Resource {
    resource(
        "Gateway",
        "istio-system",
        name,
        json!({"selector": {"istio": "ingressgateway"}, "servers": servers}),
        revision,
    )
}

fn server(port: u32, protocol: &str, hosts: &[&str], tls: Option<Value>) -> Value {
    let mut s = json!({"port": {"number": port, "name": format!("p{port}"), "protocol": protocol},
                       "hosts": hosts});
    if let Some(tls) = tls {
        s["tls"] = tls;
    }
    s
}

fn service(name: &str, port: u32, endpoint: &str) -> Resource {
    resource(
        "ServiceEndpoints",
        "default",
        name,
        json!({"addresses": ["10.96.0.9"], "ports": [{"name": "tcp", "port": port}],
               "endpoints": [{"address": endpoint, "labels": {"version": "v1"}}]}),
        1,
    )
}

fn tcp_proxy_of(chain: &FilterChain) -> TcpProxy {
    let any = chain
        .filters
        .iter()
        .find_map(|f| match &f.config_type {
            Some(filter::ConfigType::TypedConfig(a)) if a.type_url.ends_with("TcpProxy") => {
                Some(a.clone())
            }
            _ => None,
        })
        .expect("a TCP proxy");
    TcpProxy::decode(any.value.as_slice()).unwrap()
}

fn single_cluster(chain: &FilterChain) -> String {
    match tcp_proxy_of(chain).cluster_specifier {
        Some(ClusterSpecifier::Cluster(c)) => c,
        other => panic!("not a single cluster: {other:?}"),
    }
}

/// The chain whose SNI names include `sni`.
fn chain_for<'a>(listener: &'a Listener, sni: &str) -> &'a FilterChain {
    listener
        .filter_chains
        .iter()
        .find(|c| {
            c.filter_chain_match
                .as_ref()
                .is_some_and(|m| m.server_names.iter().any(|s| s == sni))
        })
        .unwrap_or_else(|| panic!("no chain for SNI {sni} in {}", listener.name))
}

fn has_tls_inspector(listener: &Listener) -> bool {
    listener
        .listener_filters
        .iter()
        .any(|f| f.name == "envoy.filters.listener.tls_inspector")
}

fn tls_route_vs(name: &str, sni: &str, route: Value, revision: u64) -> Resource {
    resource(
        "VirtualService",
        "default",
        name,
        json!({"hosts": [sni], "gateways": ["istio-system/gw"],
               "tls": [{"match": [{"port": 443, "sniHosts": [sni]}], "route": route}]}),
        revision,
    )
}

#[test]
fn passthrough_servers_route_tls_by_sni_to_the_virtual_services_destinations() {
    let out = translate(vec![
        service("a", 443, "10.1.0.1"),
        gateway(
            "gw",
            json!([server(
                443,
                "TLS",
                &["*.example.com"],
                Some(json!({"mode": "PASSTHROUGH"}))
            )]),
            2,
        ),
        tls_route_vs(
            "single",
            "a.example.com",
            json!([{"destination": {"host": "a"}}]),
            3,
        ),
        tls_route_vs(
            "split",
            "b.example.com",
            json!([{"destination": {"host": "a", "subset": "v1"}, "weight": 80},
                   {"destination": {"host": "a", "subset": "v2"}, "weight": 20}]),
            4,
        ),
        // A later VirtualService claiming an SNI name already routed is left out.
        tls_route_vs(
            "late",
            "a.example.com",
            json!([{"destination": {"host": "late"}}]),
            5,
        ),
    ]);
    let listener = &out.listeners["0.0.0.0_443"];
    assert!(has_tls_inspector(listener), "SNI needs the TLS inspector");
    assert_eq!(listener.filter_chains.len(), 2);
    let a = chain_for(listener, "a.example.com");
    assert!(
        a.transport_socket.is_none(),
        "passthrough does not terminate"
    );
    assert_eq!(
        single_cluster(a),
        "outbound|443||a.default.svc.cluster.local"
    );
    assert_eq!(
        tcp_proxy_of(a).stat_prefix,
        "outbound|443||a.default.svc.cluster.local"
    );
    let split = tcp_proxy_of(chain_for(listener, "b.example.com"));
    assert_eq!(split.stat_prefix, "split.default");
    let Some(ClusterSpecifier::WeightedClusters(w)) = split.cluster_specifier else {
        panic!("not weighted");
    };
    let weights: Vec<(&str, u32)> = w
        .clusters
        .iter()
        .map(|c| (c.name.as_str(), c.weight))
        .collect();
    assert_eq!(
        weights,
        [
            ("outbound|443|v1|a.default.svc.cluster.local", 80),
            ("outbound|443|v2|a.default.svc.cluster.local", 20)
        ]
    );
    assert!(
        out.routes.is_empty(),
        "passthrough has no route configuration"
    );
}

/// A Gateway passing the mesh's TLS through by SNI-DNAT on 15443.
fn auto_passthrough_gateway() -> Resource {
    gateway(
        "gw",
        json!([server(
            15443,
            "TLS",
            &["*.default.svc.cluster.local"],
            Some(json!({"mode": "AUTO_PASSTHROUGH"}))
        )]),
        2,
    )
}

#[test]
fn auto_passthrough_routes_sni_dnat_names_to_clusters_of_that_name() {
    let rule = resource(
        "DestinationRule",
        "default",
        "a",
        json!({"host": "a", "subsets": [{"name": "v1", "labels": {"version": "v1"}}],
               "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}}}),
        3,
    );
    let out = translate(vec![
        service("a", 9080, "10.1.0.1"),
        service("elsewhere-only", 9090, "10.1.0.2"),
        rule,
        auto_passthrough_gateway(),
    ]);
    let listener = &out.listeners["0.0.0.0_15443"];
    assert!(has_tls_inspector(listener));
    let plain = "outbound_.9080_._.a.default.svc.cluster.local";
    let subset = "outbound_.9080_.v1_.a.default.svc.cluster.local";
    for name in [plain, subset] {
        let chain = chain_for(listener, name);
        assert_eq!(single_cluster(chain), name);
        let alpn = &chain
            .filter_chain_match
            .as_ref()
            .unwrap()
            .application_protocols;
        assert!(alpn.iter().any(|a| a == "istio"), "{alpn:?}");
        let cluster: &Cluster = &out.clusters[name];
        assert!(
            cluster.transport_socket.is_none(),
            "the client's mTLS passes through: no TLS of the gateway's own"
        );
        assert_eq!(
            cluster.eds_cluster_config.as_ref().unwrap().service_name,
            name
        );
    }
    // Endpoints are served under the SNI-DNAT name, the subset's filtered by its labels.
    assert_eq!(out.endpoints[subset].cluster_name, subset);
    assert_eq!(out.endpoints[subset].endpoints.len(), 1);
    // Both services' hosts are covered by the server's wildcard.
    let no_rule = &out.clusters["outbound_.9090_._.elsewhere-only.default.svc.cluster.local"];
    // Without a DestinationRule a mesh cluster takes auto mTLS; an SNI-DNAT one does not (the
    // client's mTLS passes through).
    assert!(
        no_rule.transport_socket_matches.is_empty() && no_rule.transport_socket.is_none(),
        "{:?}",
        no_rule.transport_socket_matches
    );
}

#[test]
fn sni_dnat_clusters_name_their_service_for_istios_stats_in_stable_bytes() {
    let input = || {
        vec![
            service("a", 9080, "10.1.0.1"),
            resource(
                "DestinationRule",
                "default",
                "a",
                json!({"host": "a", "subsets": [{"name": "v1", "labels": {"version": "v1"}}]}),
                3,
            ),
            auto_passthrough_gateway(),
        ]
    };
    let mut proxy = router();
    proxy.build = crate::model::proxy::ProxyBuild::Istio;
    // Fresh translators: the labels' maps would come out in a new hash order each time.
    let bytes = |name: &str| {
        let generated = Translator::new(proxy.clone())
            .generate(&Cache::from_resources(input(), 100), Generator::Envoy);
        generated.clusters[name].body.value.clone()
    };
    for name in [
        "outbound_.9080_._.a.default.svc.cluster.local",
        "outbound_.9080_.v1_.a.default.svc.cluster.local",
    ] {
        let first = bytes(name);
        for _ in 0..5 {
            assert_eq!(bytes(name), first, "{name}");
        }
        let cluster = Cluster::decode(first.as_slice()).unwrap();
        let istio = &cluster.metadata.unwrap().filter_metadata["istio"];
        let services = format!("{:?}", istio.fields["services"]);
        assert!(
            services.contains("a.default.svc.cluster.local"),
            "{services}"
        );
    }
}

#[test]
fn without_auto_passthrough_there_are_no_sni_dnat_clusters() {
    let out = translate(vec![
        service("a", 9080, "10.1.0.1"),
        gateway("gw", json!([server(80, "HTTP", &["*"], None)]), 2),
    ]);
    assert!(!out.clusters.keys().any(|k| k.starts_with("outbound_.")));
}

fn tcp_vs(revision: u64) -> Resource {
    resource(
        "VirtualService",
        "default",
        "db",
        json!({"hosts": ["*"], "gateways": ["istio-system/gw"],
               "tcp": [{"match": [{"port": 31400}], "route": [{"destination": {"host": "a"}}]}]}),
        revision,
    )
}

#[test]
fn tcp_servers_proxy_to_the_tcp_route_and_are_not_built_without_one() {
    let out = translate(vec![
        service("a", 3306, "10.1.0.1"),
        gateway(
            "gw",
            json!([
                server(31400, "TCP", &["*"], None),
                server(31401, "TCP", &["*"], None)
            ]),
            2,
        ),
        tcp_vs(3),
    ]);
    let listener = &out.listeners["0.0.0.0_31400"];
    assert!(!has_tls_inspector(listener));
    assert_eq!(
        single_cluster(&listener.filter_chains[0]),
        "outbound|3306||a.default.svc.cluster.local"
    );
    // The match names port 31400: nothing routes 31401, so istiod builds no listener for it.
    assert!(!out.listeners.contains_key("0.0.0.0_31401"));
}

#[test]
fn tls_servers_that_terminate_proxy_the_tcp_route_behind_tls() {
    let out = translate(vec![
        service("a", 3306, "10.1.0.1"),
        gateway(
            "gw",
            json!([server(
                31400,
                "TLS",
                &["db.example.com"],
                Some(json!({"mode": "SIMPLE", "credentialName": "db-cert"}))
            )]),
            2,
        ),
        tcp_vs(3),
    ]);
    let listener = &out.listeners["0.0.0.0_31400"];
    let chain = chain_for(listener, "db.example.com");
    assert!(chain.transport_socket.is_some(), "TLS is terminated");
    assert_eq!(
        single_cluster(chain),
        "outbound|3306||a.default.svc.cluster.local"
    );
    assert!(out.routes.is_empty(), "no HTTP: no route configuration");
}

#[test]
fn an_http_server_on_a_port_an_earlier_tcp_server_holds_is_left_out() {
    let out = translate(vec![
        service("a", 3306, "10.1.0.1"),
        gateway("gw", json!([server(31400, "TCP", &["*"], None)]), 2),
        resource(
            "Gateway",
            "istio-system",
            "later",
            json!({"selector": {"istio": "ingressgateway"},
                   "servers": [server(31400, "HTTP", &["*"], None)]}),
            4,
        ),
        tcp_vs(3),
    ]);
    let listener = &out.listeners["0.0.0.0_31400"];
    assert_eq!(listener.filter_chains.len(), 1);
    tcp_proxy_of(&listener.filter_chains[0]);
    assert!(!out.routes.contains_key("http.31400"));
}

#[test]
fn plain_http_servers_of_several_gateways_share_one_route_configuration() {
    let vs = |name: &str, host: &str, gw: &str, dest: &str, revision: u64| {
        resource(
            "VirtualService",
            "default",
            name,
            json!({"hosts": [host], "gateways": [gw],
                   "http": [{"route": [{"destination": {"host": dest, "port": {"number": 80}}}]}]}),
            revision,
        )
    };
    let out = translate(vec![
        gateway(
            "gw",
            json!([server(80, "HTTP", &["a.example.com"], None)]),
            2,
        ),
        gateway(
            "other",
            json!([server(80, "HTTP2", &["b.example.com"], None)]),
            3,
        ),
        vs("a", "a.example.com", "istio-system/gw", "a", 4),
        vs("b", "b.example.com", "istio-system/other", "b", 5),
    ]);
    assert_eq!(out.listeners.len(), 1);
    let names: Vec<&str> = out.routes["http.80"]
        .virtual_hosts
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(names, ["a.example.com:80", "b.example.com:80"]);
}

#[test]
fn a_later_virtual_service_adds_its_routes_to_the_host_and_catch_alls_go_last() {
    let vs = |name: &str, rules: Value, revision: u64| {
        resource(
            "VirtualService",
            "default",
            name,
            json!({"hosts": ["a.example.com"], "gateways": ["istio-system/gw"], "http": rules}),
            revision,
        )
    };
    let out = translate(vec![
        gateway("gw", json!([server(80, "HTTP", &["*"], None)]), 2),
        vs(
            "first",
            json!([{"route": [{"destination": {"host": "all"}}]}]),
            3,
        ),
        vs(
            "second",
            json!([{"match": [{"uri": {"prefix": "/special"}}],
                    "route": [{"destination": {"host": "special"}}]}]),
            4,
        ),
    ]);
    let vh = &out.routes["http.80"].virtual_hosts[0];
    let clusters: Vec<String> = vh
        .routes
        .iter()
        .map(|r| match &r.action {
            Some(Action::Route(a)) => match &a.cluster_specifier {
                Some(RouteCluster::Cluster(c)) => c.clone(),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        clusters,
        [
            "outbound|80||special.default.svc.cluster.local",
            "outbound|80||all.default.svc.cluster.local"
        ]
    );
}

/// A Service of the router pod: port 80 received on 8080.
fn router_service(labels: &[(&str, &str)]) -> Resource {
    let mut r = resource(
        "ServiceEntry",
        "istio-system",
        "ingress",
        json!({"hosts": ["ingress.istio-system.svc.cluster.local"],
               "ports": [{"number": 80, "targetPort": 8080, "name": "http", "protocol": "HTTP"}],
               "resolution": "STATIC", "endpoints": [{"address": ROUTER_IP}]}),
        1,
    );
    r.labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<BTreeMap<_, _>>()
        .into_iter()
        .collect();
    r
}

fn http_vs(revision: u64) -> Resource {
    resource(
        "VirtualService",
        "default",
        "web",
        json!({"hosts": ["example.com"], "gateways": ["istio-system/gw"],
               "http": [{"route": [{"destination": {"host": "web"}}]}]}),
        revision,
    )
}

#[test]
fn a_server_port_of_the_routers_service_is_listened_on_its_target_port() {
    let out = translate(vec![
        router_service(&[]),
        gateway("gw", json!([server(80, "HTTP", &["example.com"], None)]), 2),
        http_vs(3),
    ]);
    assert!(!out.listeners.contains_key("0.0.0.0_80"));
    assert!(out.listeners.contains_key("0.0.0.0_8080"));
    // The virtual host keeps the port clients use.
    assert_eq!(
        out.routes["http.8080"].virtual_hosts[0].name,
        "example.com:80"
    );
}

#[test]
fn a_service_opting_out_of_port_translation_leaves_the_port_as_declared() {
    let out = translate(vec![
        router_service(&[(
            "experimental.istio.io/disable-gateway-port-translation",
            "true",
        )]),
        gateway("gw", json!([server(80, "HTTP", &["example.com"], None)]), 2),
        http_vs(3),
    ]);
    assert!(out.listeners.contains_key("0.0.0.0_80"));
    assert!(!out.listeners.contains_key("0.0.0.0_8080"));
}

#[test]
fn a_gateway_bound_to_a_service_serves_only_that_services_ports() {
    let mut bound = resource(
        "Gateway",
        "istio-system",
        "gw",
        json!({"servers": [server(80, "HTTP", &["example.com"], None),
                           server(81, "HTTP", &["example.com"], None)]}),
        2,
    );
    bound.annotations = [(
        "internal.istio.io/gateway-service".to_string(),
        "ingress.istio-system.svc.cluster.local".to_string(),
    )]
    .into_iter()
    .collect();
    let out = translate(vec![router_service(&[]), bound.clone(), http_vs(3)]);
    let names: Vec<&str> = out.listeners.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["0.0.0.0_8080"],
        "port 81 is not a port of the service"
    );
    // A ListenerSet's Gateway lives in the set's namespace: bound through its parent's.
    let mut from_set = bound.clone();
    from_set.namespace = "team".into();
    from_set.name = "set~istio-autogenerated-k8s-gateway~http".into();
    let out = translate(vec![router_service(&[]), from_set.clone(), http_vs(3)]);
    assert!(
        out.listeners.is_empty(),
        "no Service of that name in the set's namespace"
    );
    from_set.annotations.insert(
        "internal.istio.io/parent-namespace".to_string(),
        "istio-system".to_string(),
    );
    let out = translate(vec![router_service(&[]), from_set, http_vs(3)]);
    assert!(out.listeners.contains_key("0.0.0.0_8080"));
    // Bound to a service the router is no endpoint of: the Gateway does not apply at all.
    let mut elsewhere = router_service(&[]);
    elsewhere.spec_json = elsewhere.spec_json.replace(ROUTER_IP, "10.9.9.9");
    let out = translate(vec![elsewhere, bound, http_vs(3)]);
    assert!(out.listeners.is_empty());
}

#[test]
fn the_gateway_is_the_edge_for_client_addresses_and_certificates() {
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::ForwardClientCertDetails;
    let out = translate(vec![gateway(
        "web",
        json!([server(8080, "HTTP", &["*"], None)]),
        1,
    )]);
    let chain = &out.listeners["0.0.0.0_8080"].filter_chains[0];
    let Some(filter::ConfigType::TypedConfig(any)) = &chain.filters[0].config_type else {
        panic!("the connection manager has a typed config");
    };
    let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
    // X-Forwarded-For from outside is not trusted: the peer is the client.
    assert_eq!(hcm.use_remote_address.map(|b| b.value), Some(true));
    assert_eq!(hcm.xff_num_trusted_hops, 0);
    // A client's own X-Forwarded-Client-Cert is replaced, never passed on.
    assert_eq!(
        hcm.forward_client_cert_details,
        ForwardClientCertDetails::SanitizeSet as i32
    );
    let details = hcm
        .set_current_client_cert_details
        .expect("cert details set");
    assert!(details.cert && details.uri && details.dns);
}

/// The DownstreamTlsContext of a chain.
fn downstream_tls(chain: &FilterChain) -> DownstreamTlsContext {
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    match chain
        .transport_socket
        .as_ref()
        .and_then(|t| t.config_type.as_ref())
    {
        Some(ConfigType::TypedConfig(any)) => {
            DownstreamTlsContext::decode(any.value.as_slice()).expect("a DownstreamTlsContext")
        }
        other => panic!("no TLS: {other:?}"),
    }
}

#[test]
fn gateway_tls_follows_istiods_credentials_ca_and_parameters() {
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::common_tls_context::ValidationContextType;
    let mutual = json!({"mode": "OPTIONAL_MUTUAL", "insecureSkipVerify": true,
        "credentialNames": ["kubernetes-gateway://istio-system/rsa",
                            "kubernetes-gateway://istio-system/ecdsa"],
        "caCertCredentialName": "configmap://istio-system/clients-cacert",
        "cipherSuites": ["ECDHE-RSA-AES128-GCM-SHA256"], "minProtocolVersion": "TLSV1_3"});
    let out = translate(vec![
        service("a", 3306, "10.1.0.1"),
        gateway(
            "gw",
            json!([
                server(31400, "TLS", &["db.example.com"], Some(mutual)),
                server(
                    31400,
                    "TLS",
                    &["other.example.com"],
                    Some(json!({"mode": "SIMPLE", "credentialName": "builtin://"}))
                ),
            ]),
            2,
        ),
        tcp_vs(3),
    ]);
    let context = downstream_tls(chain_for(&out.listeners["0.0.0.0_31400"], "db.example.com"));
    assert_eq!(
        context.require_client_certificate.map(|b| b.value),
        Some(false)
    );
    let common = context.common_tls_context.expect("a common context");
    let names: Vec<&str> = common
        .tls_certificate_sds_secret_configs
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "kubernetes-gateway://istio-system/rsa",
            "kubernetes-gateway://istio-system/ecdsa"
        ]
    );
    match common.validation_context_type {
        Some(ValidationContextType::CombinedValidationContext(c)) => {
            assert_eq!(
                c.validation_context_sds_secret_config
                    .map(|s| s.name)
                    .as_deref(),
                Some("configmap://istio-system/clients-cacert")
            );
            assert_eq!(
                c.default_validation_context
                    .map(|d| d.trust_chain_verification),
                Some(1),
                "insecureSkipVerify accepts untrusted client certificates"
            );
        }
        other => panic!("no combined validation context: {other:?}"),
    }
    let params = common.tls_params.expect("TLS parameters");
    assert_eq!(params.cipher_suites, ["ECDHE-RSA-AES128-GCM-SHA256"]);
    assert_eq!(params.tls_minimum_protocol_version, 4, "TLSv1_3");
    // `builtin://` is the workload certificate from the istio-agent's SDS.
    let builtin = downstream_tls(chain_for(
        &out.listeners["0.0.0.0_31400"],
        "other.example.com",
    ));
    let certs = builtin
        .common_tls_context
        .expect("a common context")
        .tls_certificate_sds_secret_configs;
    assert_eq!(certs[0].name, "default");
}
