//! What real Envoy and real traffic demand of the generated configuration beyond what the
//! protos allow: each test pins a rule that Envoy 1.40 enforced by rejecting an update, or that
//! real requests through a captured sidecar or a gateway showed (and that istiod follows, where
//! a gRPC client never checked). `agent/tests/envoy_accepts.rs` serves the whole corpus to real
//! Envoy, `envoy_gateway.rs` and `envoy_sidecar.rs` send traffic through it; these keep each rule
//! visible where the translation is.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::{
    ClusterSpecifier, HostRewriteSpecifier,
};
use envoy_types::pb::envoy::config::route::v3::weighted_cluster::cluster_weight;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
    UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
};
use prost::Message;
use serde_json::{Value, json};

use super::*;
use crate::testing::{resource, router, sidecar};

fn web(addresses: &[&str]) -> pasa_proto::store::v1::Resource {
    resource(
        "ServiceEndpoints",
        "default",
        "web",
        json!({
            "addresses": addresses,
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [
                {"address": "10.0.0.1", "labels": {"app": "web", "version": "v1"}},
                {"address": "10.0.0.2", "labels": {"app": "web", "version": "v2"}}
            ]
        }),
        1,
    )
}

fn translate(proxy: Proxy, resources: Vec<pasa_proto::store::v1::Resource>) -> Resources {
    let cache = Cache::from_resources(resources, 10);
    Translator::new(proxy)
        .update(&cache, Generator::Envoy)
        .expect("decodes what it encoded")
}

fn http_options(cluster: &Cluster) -> HttpProtocolOptions {
    let any = &cluster.typed_extension_protocol_options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    HttpProtocolOptions::decode(any.value.as_slice()).unwrap()
}

#[test]
fn inbound_bind_addresses_carry_port_zero() {
    // `BindConfigValidationError.SourceAddress: port_specifier is required`: without it every
    // CDS update of a sidecar was refused.
    let out = translate(sidecar("10.0.0.1"), vec![web(&["10.96.0.1"])]);
    for name in ["InboundPassthroughCluster", "inbound|8080||"] {
        let cluster = out.clusters.get(name);
        let Some(cluster) = cluster else { continue };
        if let Some(bind) = &cluster.upstream_bind_config {
            let source = bind.source_address.as_ref().unwrap();
            assert_eq!(source.address, "127.0.0.6");
            assert_eq!(
                source.port_specifier,
                Some(PortSpecifier::PortValue(0)),
                "{name}"
            );
        }
    }
    let passthrough = &out.clusters["InboundPassthroughCluster"];
    assert!(passthrough.upstream_bind_config.is_some());
}

#[test]
fn connection_pool_settings_on_an_http1_port_keep_http1_upstream() {
    // Envoy requires `upstream_protocol_options` in HttpProtocolOptions.
    let dr = resource(
        "DestinationRule",
        "default",
        "web",
        json!({"host": "web", "trafficPolicy": {"connectionPool": {"http": {
            "maxRequestsPerConnection": 10, "idleTimeout": "30s"}}}}),
        2,
    );
    let out = translate(sidecar("10.0.0.9"), vec![web(&["10.96.0.1"]), dr]);
    let options = http_options(&out.clusters["outbound|8080||web.default.svc.cluster.local"]);
    assert!(options.common_http_protocol_options.is_some());
    match options.upstream_protocol_options {
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(explicit)) => assert!(matches!(
            explicit.protocol_config,
            Some(ProtocolConfig::HttpProtocolOptions(_))
        )),
        other => panic!("no upstream protocol: {other:?}"),
    }
}

#[test]
fn a_host_header_becomes_the_authority_rewrite() {
    // `:-prefixed or host headers may not be modified`: Envoy refused the whole route
    // configuration.
    let vs = resource(
        "VirtualService",
        "default",
        "web",
        json!({"hosts": ["web"], "http": [
            {"match": [{"uri": {"prefix": "/a"}}],
             "headers": {"request": {"set": {"Host": "a.internal", "x-a": "1"}, "remove": ["host"]}},
             "route": [{"destination": {"host": "web"}}]},
            {"route": [
                {"destination": {"host": "web"}, "weight": 50,
                 "headers": {"request": {"add": {":authority": "b.internal"}}}},
                {"destination": {"host": "web"}, "weight": 50}
            ]}
        ]}),
        2,
    );
    let out = translate(sidecar("10.0.0.9"), vec![web(&["10.96.0.1"]), vs]);
    let routes = &out.routes["8080"];
    let all: Vec<_> = routes
        .virtual_hosts
        .iter()
        .flat_map(|v| &v.routes)
        .collect();
    for route in &all {
        for h in route
            .request_headers_to_add
            .iter()
            .filter_map(|o| o.header.as_ref())
        {
            assert!(
                !h.key.eq_ignore_ascii_case("host") && !h.key.starts_with(':'),
                "{h:?}"
            );
        }
        assert!(route.request_headers_to_remove.iter().all(|h| h != "host"));
    }
    let Some(Action::Route(first)) = &all[0].action else {
        panic!("a route action")
    };
    assert_eq!(
        first.host_rewrite_specifier,
        Some(HostRewriteSpecifier::HostRewriteLiteral(
            "a.internal".into()
        ))
    );
    assert_eq!(all[0].request_headers_to_add.len(), 1, "x-a stays");
    let Some(Action::Route(split)) = &all[1].action else {
        panic!("a route action")
    };
    let Some(ClusterSpecifier::WeightedClusters(weighted)) = &split.cluster_specifier else {
        panic!("weighted clusters")
    };
    assert_eq!(
        weighted.clusters[0].host_rewrite_specifier,
        Some(cluster_weight::HostRewriteSpecifier::HostRewriteLiteral(
            "b.internal".into()
        ))
    );
    assert!(weighted.clusters[0].request_headers_to_add.is_empty());
}

#[test]
fn a_router_reaches_a_headless_service_by_eds() {
    // A gateway cannot use an original-destination cluster: every request got 503.
    let db = resource(
        "ServiceEndpoints",
        "default",
        "db",
        json!({"ports": [{"name": "http", "port": 8080}],
               "endpoints": [{"address": "10.0.0.5", "labels": {"app": "db"}}]}),
        1,
    );
    let gw = resource(
        "Gateway",
        "istio-system",
        "gw",
        json!({"selector": {"istio": "ingressgateway"}, "servers": [
            {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]}),
        2,
    );
    let vs = resource(
        "VirtualService",
        "default",
        "db",
        json!({"hosts": ["db.example.com"], "gateways": ["istio-system/gw"],
               "http": [{"route": [{"destination": {"host": "db"}}]}]}),
        3,
    );
    let name = "outbound|8080||db.default.svc.cluster.local";
    let out = translate(router("10.0.0.20"), vec![db.clone(), gw, vs]);
    let cluster = &out.clusters[name];
    assert_eq!(
        cluster.cluster_discovery_type,
        Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32))
    );
    assert_eq!(out.endpoints[name].endpoints.len(), 1);
    // A sidecar still forwards to the original destination.
    let out = translate(sidecar("10.0.0.9"), vec![db]);
    assert_eq!(
        out.clusters[name].cluster_discovery_type,
        Some(ClusterDiscoveryType::Type(
            DiscoveryType::OriginalDst as i32
        ))
    );
}

#[test]
fn connection_managers_carry_istiods_filters_and_grpc_clients_no_cors() {
    // A CORS policy on a route needs the CORS filter in the connection manager.
    let out = translate(sidecar("10.0.0.9"), vec![web(&["10.96.0.1"])]);
    let filters = |listener| -> Vec<String> {
        super::tests::hcm_of(listener)
            .http_filters
            .iter()
            .map(|f| f.name.clone())
            .collect()
    };
    assert_eq!(
        filters(&out.listeners["0.0.0.0_8080"]),
        [
            "envoy.filters.http.grpc_stats",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "envoy.filters.http.router"
        ]
    );
    let cache = Cache::from_resources(vec![web(&["10.96.0.1"])], 10);
    let grpc = Translator::new(sidecar("10.0.0.9"))
        .update(&cache, Generator::Grpc)
        .expect("decodes what it encoded");
    let listener = &grpc.listeners["web.default.svc.cluster.local:8080"];
    let filters: Vec<String> = super::tests::hcm_of(listener)
        .http_filters
        .iter()
        .map(|f| f.name.clone())
        .collect();
    assert_eq!(
        filters,
        ["envoy.filters.http.fault", "envoy.filters.http.router"]
    );
}

#[test]
fn simple_tls_with_a_credential_only_verifies_the_server() {
    // As istiod: a sidecar takes a credential by name only from a rule that selects it.
    let dr = |selector: Value| {
        resource(
            "DestinationRule",
            "default",
            "web",
            json!({"host": "web", "workloadSelector": selector,
                   "trafficPolicy": {"tls": {"mode": "SIMPLE", "credentialName": "web-ca"}}}),
            2,
        )
    };
    let mut client = sidecar("10.0.0.9");
    client.labels.insert("app".into(), "client".into());
    let socket = |selector: Value| {
        let out = translate(client.clone(), vec![web(&["10.96.0.1"]), dr(selector)]);
        out.clusters["outbound|8080||web.default.svc.cluster.local"]
            .transport_socket
            .clone()
    };
    assert_eq!(socket(Value::Null), None);
    assert_eq!(socket(json!({"matchLabels": {"app": "other"}})), None);
    let Some(ConfigType::TypedConfig(any)) = socket(json!({"matchLabels": {"app": "client"}}))
        .expect("TLS")
        .config_type
    else {
        panic!("typed config")
    };
    let tls = UpstreamTlsContext::decode(any.value.as_slice()).unwrap();
    // No SNI given: Envoy takes the request's host (`auto_sni`).
    assert_eq!(tls.sni, "");
    let common = tls.common_tls_context.unwrap();
    assert!(common.tls_certificate_sds_secret_configs.is_empty());
    assert!(common.validation_context_type.is_some());
}

#[test]
fn each_address_of_a_service_entry_gets_its_own_listener() {
    // Envoy refuses a listener whose additional address another listener binds.
    let se = |name: &str, addresses: &[&str], revision| {
        resource(
            "ServiceEntry",
            "default",
            name,
            json!({"hosts": [format!("{name}.example")], "addresses": addresses,
                   "ports": [{"number": 9999, "name": "tcp", "protocol": "TCP"}],
                   "resolution": "STATIC", "endpoints": [{"address": "192.0.2.1"}]}),
            revision,
        )
    };
    let out = translate(
        sidecar("10.0.0.9"),
        vec![
            se("a", &["1.1.1.1"], 1),
            se("b", &["2.2.2.2", "1.1.1.1"], 2),
        ],
    );
    for listener in ["1.1.1.1_9999", "2.2.2.2_9999"] {
        assert!(
            out.listeners[listener].additional_addresses.is_empty(),
            "{listener}"
        );
    }
}

#[test]
fn virtual_inbound_hands_nothing_off_by_original_destination() {
    // With a hand-off, inbound connections went to the outbound listener of the same port,
    // which forwarded them back to the pod: a loop until the connection limit.
    let out = translate(sidecar("10.0.0.1"), vec![web(&["10.96.0.1"])]);
    assert_eq!(out.listeners["virtualInbound"].use_original_dst, None);
    assert!(
        out.listeners["virtualOutbound"]
            .use_original_dst
            .is_some_and(|b| b.value)
    );
}

#[test]
fn a_sidecar_without_egress_listeners_sees_everything() {
    // A Sidecar that only sets its outbound policy took every service out of scope.
    let sidecar_resource = resource(
        "Sidecar",
        "default",
        "default",
        json!({"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}}),
        2,
    );
    let out = translate(
        sidecar("10.0.0.9"),
        vec![web(&["10.96.0.1"]), sidecar_resource],
    );
    assert!(
        out.clusters
            .contains_key("outbound|8080||web.default.svc.cluster.local")
    );
    assert!(out.listeners.contains_key("0.0.0.0_8080"));
}

#[test]
fn auto_mtls_reaches_workloads_with_a_sidecar_over_istio_mutual() {
    let mut with_sidecar = web(&["10.96.0.1"]);
    with_sidecar.spec_json = with_sidecar.spec_json.replace(
        r#""version":"v1""#,
        r#""version":"v1","security.istio.io/tlsMode":"istio""#,
    );
    let out = translate(sidecar("10.0.0.9"), vec![with_sidecar]);
    let name = "outbound|8080||web.default.svc.cluster.local";
    let matches = &out.clusters[name].transport_socket_matches;
    let names: Vec<&str> = matches.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["tlsMode-istio", "tlsMode-disabled"]);
    let marked: Vec<bool> = out.endpoints[name]
        .endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .map(|e| {
            e.metadata.as_ref().is_some_and(|m| {
                m.filter_metadata
                    .contains_key("envoy.transport_socket_match")
            })
        })
        .collect();
    assert_eq!(
        marked,
        [true, false],
        "only the labelled workload is marked"
    );
    // A DestinationRule's TLS wins; a gRPC client gets none of it.
    let dr = resource(
        "DestinationRule",
        "default",
        "web",
        json!({"host": "web", "trafficPolicy": {"tls": {"mode": "DISABLE"}}}),
        2,
    );
    let out = translate(sidecar("10.0.0.9"), vec![web(&["10.96.0.1"]), dr]);
    assert!(out.clusters[name].transport_socket_matches.is_empty());
}
