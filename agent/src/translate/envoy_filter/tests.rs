//! EnvoyFilter patches on what a sidecar and a router are built, through the translator.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use pasa_proto::store::v1::Resource as StoreResource;
use prost::Message;
use serde_json::{Value, json};

use crate::cache::Cache;
use crate::model::proxy::Generator;
use crate::testing::resource;
use crate::translate::Translator;
use crate::translate::tests::{
    cache, hcm_of, http_filter_names, http_gateway, reviews_rule, reviews_service,
    reviews_workload, translate_for as translate,
};

const LUA: &str = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua";

fn envoy_filter(ns: &str, name: &str, spec: Value, revision: u64) -> StoreResource {
    resource("EnvoyFilter", ns, name, spec, revision)
}

/// A Lua filter inserted before the router of the inbound HTTP chains.
fn lua_before_router(selector: Value, code: &str) -> Value {
    json!({
        "workloadSelector": {"labels": selector},
        "configPatches": [{
            "applyTo": "HTTP_FILTER",
            "match": {"context": "SIDECAR_INBOUND", "listener": {"filterChain": {"filter": {
                "name": "envoy.filters.network.http_connection_manager",
                "subFilter": {"name": "envoy.filters.http.router"}}}}},
            "patch": {"operation": "INSERT_BEFORE", "value": {
                "name": "envoy.lua",
                "typed_config": {"@type": LUA, "inlineCode": code}}}
        }]
    })
}

#[test]
fn an_http_filter_goes_before_the_router_of_the_selected_workloads_inbound_chains() {
    let filter = envoy_filter(
        "default",
        "lua",
        lua_before_router(
            json!({"app": "reviews"}),
            "function envoy_on_response(h) end",
        ),
        5,
    );
    let out = translate(reviews_workload(), vec![reviews_service(), filter.clone()]);
    let names = http_filter_names(&out.listeners["virtualInbound"], "0.0.0.0_9080");
    let lua = names
        .iter()
        .position(|n| n == "envoy.lua")
        .expect("inserted");
    assert_eq!(names[lua + 1], "envoy.filters.http.router", "{names:?}");
    // Not outbound (the context is inbound), and not on another workload.
    for l in out
        .listeners
        .values()
        .filter(|l| l.name != "virtualInbound")
    {
        for c in &l.filter_chains {
            let mut one = l.clone();
            one.filter_chains = vec![c.clone()];
            if c.filters
                .iter()
                .any(|f| f.name.ends_with("http_connection_manager"))
            {
                assert!(!http_filter_names(&one, "").contains(&"envoy.lua".to_string()));
            }
        }
    }
    let mut other = crate::testing::sidecar("10.0.0.2");
    other.labels = [("app".to_string(), "ratings".to_string())].into();
    let out = translate(other, vec![reviews_service(), filter]);
    let names = http_filter_names(&out.listeners["virtualInbound"], "0.0.0.0_9080");
    assert!(!names.contains(&"envoy.lua".to_string()), "{names:?}");
}

#[test]
fn priority_then_root_namespace_first_decide_the_order() {
    // Both insert first: the one applied last ends first.
    let first = |selector: Value, name: &str, priority: i32| {
        json!({
            "workloadSelector": {"labels": selector},
            "priority": priority,
            "configPatches": [{
                "applyTo": "HTTP_FILTER",
                "match": {"context": "SIDECAR_INBOUND", "listener": {"filterChain": {"filter": {
                    "name": "envoy.filters.network.http_connection_manager"}}}},
                "patch": {"operation": "INSERT_FIRST", "value": {
                    "name": name, "typed_config": {"@type": LUA, "inlineCode": "-- x"}}}
            }]
        })
    };
    // The filter names at the top of the inbound chain with the namespace's EnvoyFilter at
    // `priority` and the root namespace's at 0.
    let order = |priority: i32| {
        let out = translate(
            reviews_workload(),
            vec![
                reviews_service(),
                envoy_filter(
                    "default",
                    "a",
                    first(json!({"app": "reviews"}), "ns", priority),
                    5,
                ),
                envoy_filter(
                    "istio-system",
                    "b",
                    first(json!({"app": "reviews"}), "root", 0),
                    6,
                ),
            ],
        );
        http_filter_names(&out.listeners["virtualInbound"], "0.0.0.0_9080")[..2].to_vec()
    };
    assert_eq!(
        order(0),
        ["ns", "root"],
        "the root namespace's applied first"
    );
    assert_eq!(order(-1), ["root", "ns"], "lower priority first");
}

#[test]
fn a_virtual_host_merge_adds_a_response_header_to_outbound_routes() {
    let filter = envoy_filter(
        "istio-system",
        "header",
        json!({"configPatches": [{
            "applyTo": "VIRTUAL_HOST",
            "match": {"context": "SIDECAR_OUTBOUND", "routeConfiguration": {
                "portNumber": 9080, "vhost": {"name": "reviews.default.svc.cluster.local:9080"}}},
            "patch": {"operation": "MERGE", "value": {"response_headers_to_add": [{
                "header": {"key": "x-patched", "value": "yes"},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]}}
        }]}),
        5,
    );
    let out = translate(reviews_workload(), vec![reviews_service(), filter]);
    let rc: &RouteConfiguration = &out.routes["9080"];
    let vh = rc
        .virtual_hosts
        .iter()
        .find(|v| v.name == "reviews.default.svc.cluster.local:9080")
        .unwrap();
    let added = &vh.response_headers_to_add[0];
    assert_eq!(added.header.as_ref().unwrap().key, "x-patched");
    assert_eq!(
        added.append_action,
        HeaderAppendAction::OverwriteIfExistsOrAdd as i32
    );
    for other in rc.virtual_hosts.iter().filter(|v| v.name != vh.name) {
        assert!(other.response_headers_to_add.is_empty(), "{}", other.name);
    }
}

#[test]
fn routes_are_removed_inserted_and_merged_by_name_and_action() {
    let filter = envoy_filter(
        "default",
        "routes",
        json!({"configPatches": [
            {"applyTo": "HTTP_ROUTE",
             "match": {"routeConfiguration": {"vhost": {
                 "name": "reviews.default.svc.cluster.local:9080",
                 "route": {"name": "default", "action": "ROUTE"}}}},
             "patch": {"operation": "MERGE", "value": {"route": {"timeout": "7s"}}}},
            {"applyTo": "HTTP_ROUTE",
             "match": {"routeConfiguration": {"vhost": {
                 "name": "reviews.default.svc.cluster.local:9080",
                 "route": {"name": "default"}}}},
             "patch": {"operation": "INSERT_BEFORE", "value": {
                 "name": "teapot", "match": {"prefix": "/teapot"},
                 "direct_response": {"status": 418}}}}
        ]}),
        5,
    );
    let out = translate(reviews_workload(), vec![reviews_service(), filter]);
    let vh = out.routes["9080"]
        .virtual_hosts
        .iter()
        .find(|v| v.name == "reviews.default.svc.cluster.local:9080")
        .unwrap()
        .clone();
    let names: Vec<&str> = vh.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["teapot", "default"]);
    let Some(envoy_types::pb::envoy::config::route::v3::route::Action::Route(action)) =
        &vh.routes[1].action
    else {
        panic!("a route action")
    };
    assert_eq!(action.timeout.as_ref().unwrap().seconds, 7);
    // Removing by name.
    let remove = envoy_filter(
        "default",
        "routes",
        json!({"configPatches": [{"applyTo": "HTTP_ROUTE",
            "match": {"routeConfiguration": {"vhost": {"route": {"name": "default"}}}},
            "patch": {"operation": "REMOVE"}}]}),
        6,
    );
    let out = translate(reviews_workload(), vec![reviews_service(), remove]);
    for vh in &out.routes["9080"].virtual_hosts {
        assert!(vh.routes.iter().all(|r| r.name != "default"), "{}", vh.name);
    }
}

#[test]
fn clusters_are_merged_by_service_port_and_subset_removed_and_added() {
    let filter = envoy_filter(
        "istio-system",
        "clusters",
        json!({"configPatches": [
            {"applyTo": "CLUSTER",
             "match": {"context": "SIDECAR_OUTBOUND", "cluster": {
                 "service": "reviews.default.svc.cluster.local", "portNumber": 9080,
                 "subset": "v1"}},
             "patch": {"operation": "MERGE", "value": {"connect_timeout": "3s",
                 "per_connection_buffer_limit_bytes": 1024}}},
            {"applyTo": "CLUSTER",
             "match": {"cluster": {"subset": "v3"}},
             "patch": {"operation": "REMOVE"}},
            {"applyTo": "CLUSTER",
             "patch": {"operation": "ADD", "value": {"name": "added", "type": "STATIC",
                 "connect_timeout": "1s"}}}
        ]}),
        5,
    );
    let out = translate(
        reviews_workload(),
        vec![reviews_service(), reviews_rule(2), filter],
    );
    let v1: &Cluster = &out.clusters["outbound|9080|v1|reviews.default.svc.cluster.local"];
    assert_eq!(v1.connect_timeout.as_ref().unwrap().seconds, 3);
    assert_eq!(
        v1.per_connection_buffer_limit_bytes.map(|v| v.value),
        Some(1024)
    );
    let v2 = &out.clusters["outbound|9080|v2|reviews.default.svc.cluster.local"];
    assert_ne!(
        v2.per_connection_buffer_limit_bytes.map(|v| v.value),
        Some(1024)
    );
    assert!(
        !out.clusters
            .contains_key("outbound|9080|v3|reviews.default.svc.cluster.local")
    );
    assert!(out.clusters.contains_key("added"));
    // Inbound clusters keep their own.
    assert!(out.clusters.contains_key("inbound|9080||"));
}

#[test]
fn listeners_and_filter_chains_are_removed_and_added() {
    let filter = envoy_filter(
        "default",
        "listeners",
        json!({"configPatches": [
            {"applyTo": "LISTENER",
             "match": {"context": "SIDECAR_OUTBOUND", "listener": {"portNumber": 9080}},
             "patch": {"operation": "REMOVE"}},
            {"applyTo": "LISTENER",
             "match": {"context": "SIDECAR_OUTBOUND"},
             "patch": {"operation": "ADD", "value": {"name": "extra",
                 "address": {"socket_address": {"address": "127.0.0.1", "port_value": 18080}},
                 "filter_chains": [{"filters": [{"name": "envoy.filters.network.tcp_proxy",
                     "typed_config": {
                         "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                         "stat_prefix": "extra", "cluster": "BlackHoleCluster"}}]}]}}},
            {"applyTo": "FILTER_CHAIN",
             "match": {"context": "SIDECAR_INBOUND", "listener": {"portNumber": 9080,
                 "filterChain": {"transportProtocol": "tls"}}},
             "patch": {"operation": "REMOVE"}}
        ]}),
        5,
    );
    let before = translate(reviews_workload(), vec![reviews_service()]);
    let out = translate(reviews_workload(), vec![reviews_service(), filter]);
    assert!(before.listeners.contains_key("0.0.0.0_9080"));
    assert!(!out.listeners.contains_key("0.0.0.0_9080"));
    let extra: &Listener = &out.listeners["extra"];
    assert_eq!(extra.filter_chains.len(), 1);
    let tls_on_9080 = |l: &Listener| {
        l.filter_chains
            .iter()
            .filter(|c| {
                c.filter_chain_match.as_ref().is_some_and(|m| {
                    m.destination_port.map(|p| p.value) == Some(9080)
                        && m.transport_protocol == "tls"
                })
            })
            .count()
    };
    assert!(tls_on_9080(&before.listeners["virtualInbound"]) > 0);
    assert_eq!(tls_on_9080(&out.listeners["virtualInbound"]), 0);
    assert!(
        out.listeners["virtualInbound"].filter_chains.len()
            < before.listeners["virtualInbound"].filter_chains.len()
    );
}

#[test]
fn a_network_filter_merge_merges_the_connection_managers_typed_config() {
    let filter = envoy_filter(
        "default",
        "hcm",
        json!({"configPatches": [{"applyTo": "NETWORK_FILTER",
            "match": {"context": "SIDECAR_INBOUND", "listener": {"filterChain": {"filter": {
                "name": "envoy.filters.network.http_connection_manager"}}}},
            "patch": {"operation": "MERGE", "value": {
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "server_name": "patched", "common_http_protocol_options": {"idle_timeout": "9s"}}}}}]}),
        5,
    );
    let out = translate(reviews_workload(), vec![reviews_service(), filter]);
    let mut one = out.listeners["virtualInbound"].clone();
    one.filter_chains.retain(|c| c.name == "0.0.0.0_9080");
    let hcm = hcm_of(&one);
    assert_eq!(hcm.server_name, "patched");
    assert_eq!(
        hcm.common_http_protocol_options
            .unwrap()
            .idle_timeout
            .unwrap()
            .seconds,
        9
    );
    // What the agent set is kept: the filters and the inline routes.
    assert!(
        hcm.http_filters
            .iter()
            .any(|f| f.name == "envoy.filters.http.router")
    );
    assert!(hcm.route_specifier.is_some());
}

#[test]
fn proxy_version_and_metadata_decide_whether_a_patch_applies() {
    let with_proxy = |proxy: Value| {
        envoy_filter(
            "default",
            "versioned",
            json!({"configPatches": [{"applyTo": "CLUSTER",
                "match": {"proxy": proxy, "cluster": {"name": "inbound|9080||"}},
                "patch": {"operation": "REMOVE"}}]}),
            5,
        )
    };
    let removed = |proxy: Value| {
        let out = translate(
            reviews_workload(),
            vec![reviews_service(), with_proxy(proxy)],
        );
        !out.clusters.contains_key("inbound|9080||")
    };
    assert!(removed(json!({"proxyVersion": r"^1\.2[0-9].*"})));
    assert!(!removed(json!({"proxyVersion": r"^1\.16.*"})));
    assert!(removed(json!({"metadata": {"NAMESPACE": "default"}})));
    assert!(!removed(json!({"metadata": {"NAMESPACE": "other"}})));
}

#[test]
fn a_value_that_does_not_read_skips_its_patch_only() {
    let filter = envoy_filter(
        "default",
        "mixed",
        json!({"configPatches": [
            {"applyTo": "CLUSTER", "match": {"cluster": {"name": "inbound|9080||"}},
             "patch": {"operation": "MERGE", "value": {"connect_timeout": {"not": "a duration"}}}},
            {"applyTo": "CLUSTER", "match": {"cluster": {"name": "inbound|9080||"}},
             "patch": {"operation": "MERGE", "value": {"alt_stat_name": "kept"}}}
        ]}),
        5,
    );
    let out = translate(reviews_workload(), vec![reviews_service(), filter]);
    assert_eq!(out.clusters["inbound|9080||"].alt_stat_name, "kept");
}

#[test]
fn a_router_applies_gateway_patches_and_unchanged_resources_are_not_patched_again() {
    let gateway = http_gateway("istio-system", "gw", 8080);
    let filter = envoy_filter(
        "istio-system",
        "gw-header",
        json!({"configPatches": [{"applyTo": "ROUTE_CONFIGURATION",
            "match": {"context": "GATEWAY", "routeConfiguration": {"portNumber": 8080}},
            "patch": {"operation": "MERGE", "value": {"response_headers_to_add": [{
                "header": {"key": "x-gateway", "value": "1"}}]}}}]}),
        5,
    );
    let mut router = crate::testing::router("10.0.0.50");
    router.labels = [("istio".to_string(), "ingressgateway".to_string())].into();
    let resources = vec![reviews_service(), gateway, filter];
    let mut t = Translator::new(router);
    let cache: Cache = cache(resources.clone());
    let first = t.generate(&cache, Generator::Envoy);
    let rc = first.routes.get("http.8080").expect("the gateway's routes");
    let decoded = RouteConfiguration::decode(rc.body.value.as_slice()).unwrap();
    assert_eq!(
        decoded.response_headers_to_add[0]
            .header
            .as_ref()
            .unwrap()
            .key,
        "x-gateway"
    );
    let second = t.generate(&cache, Generator::Envoy);
    assert!(std::sync::Arc::ptr_eq(rc, &second.routes["http.8080"]));
}

#[test]
fn cluster_names_read_as_istiod_reads_them() {
    use crate::translate::names::read_cluster;
    assert_eq!(
        read_cluster("outbound|9080|v1|reviews.default.svc.cluster.local"),
        (9080, "v1", "reviews.default.svc.cluster.local")
    );
    assert_eq!(
        read_cluster("outbound_.443_.v2_.api.example.com"),
        (443, "v2", "api.example.com")
    );
    assert_eq!(read_cluster("inbound|9080||"), (9080, "", ""));
    assert_eq!(
        read_cluster("inbound|9080"),
        (0, "", ""),
        "a port needs what follows it"
    );
    assert_eq!(read_cluster("BlackHoleCluster"), (0, "", ""));
}

#[test]
fn a_gateway_route_matches_by_the_service_port_its_listener_serves() {
    // The router is the endpoint of a service whose port 80 it receives on 8080: a patch for
    // port 80 selects the route configuration `http.8080`, one for 8080 does not.
    let router_service = resource(
        "ServiceEndpoints",
        "istio-system",
        "istio-ingressgateway",
        json!({"addresses": ["10.96.0.80"],
               "ports": [{"name": "http2", "port": 80, "targetPort": 8080}],
               "endpoints": [{"address": "10.0.0.50", "labels": {"istio": "ingressgateway"}}]}),
        1,
    );
    let gateway = http_gateway("istio-system", "gw", 80);
    let patched = |port: u32| {
        let filter = envoy_filter(
            "istio-system",
            "by-port",
            json!({"configPatches": [{"applyTo": "ROUTE_CONFIGURATION",
                "match": {"context": "GATEWAY", "routeConfiguration": {"portNumber": port}},
                "patch": {"operation": "MERGE", "value": {"response_headers_to_add": [
                    {"header": {"key": "x-port", "value": "1"}}]}}}]}),
            5,
        );
        let out = translate(
            crate::testing::router("10.0.0.50"),
            vec![router_service.clone(), gateway.clone(), filter],
        );
        !out.routes["http.8080"].response_headers_to_add.is_empty()
    };
    assert!(patched(80));
    assert!(!patched(8080));
}

#[test]
fn the_metadata_keys_the_injector_trusts_the_agent_with_are_known() {
    let mut proxy = reviews_workload();
    proxy.network = "net-1".into();
    for key in pasa_istio::envoy_filter::AGENT_KNOWN_METADATA {
        assert!(super::node_metadata(&proxy, key).is_some(), "{key}");
    }
}

#[test]
fn an_inbound_cluster_is_of_the_services_its_port_serves() {
    let remove_of = |service: &str| {
        envoy_filter(
            "default",
            "inbound",
            json!({"configPatches": [{"applyTo": "CLUSTER",
                "match": {"context": "SIDECAR_INBOUND", "cluster": {"service": service}},
                "patch": {"operation": "REMOVE"}}]}),
            5,
        )
    };
    let out = translate(
        reviews_workload(),
        vec![
            reviews_service(),
            remove_of("reviews.default.svc.cluster.local"),
        ],
    );
    assert!(!out.clusters.contains_key("inbound|9080||"));
    let out = translate(
        reviews_workload(),
        vec![
            reviews_service(),
            remove_of("ratings.default.svc.cluster.local"),
        ],
    );
    assert!(out.clusters.contains_key("inbound|9080||"));
}

#[test]
fn extension_configs_added_are_served_over_ecds_whatever_their_context() {
    let filter = envoy_filter(
        "istio-system",
        "ecds",
        json!({"configPatches": [
            {"applyTo": "EXTENSION_CONFIG", "match": {"context": "GATEWAY"},
             "patch": {"operation": "ADD", "value": {
                 "name": "shared-lua", "typed_config": {"@type": LUA, "inlineCode": "x"}}}},
            // Only ADD adds.
            {"applyTo": "EXTENSION_CONFIG",
             "patch": {"operation": "MERGE", "value": {"name": "merged"}}}]}),
        3,
    );
    let out = translate(reviews_workload(), vec![reviews_service(), filter]);
    let names: Vec<&String> = out.extension_configs.keys().collect();
    assert_eq!(names, ["shared-lua"]);
    let config = &out.extension_configs["shared-lua"];
    assert_eq!(config.typed_config.as_ref().unwrap().type_url, LUA);
}

#[test]
fn patches_of_istios_own_filters_apply_to_istios_proxy_only() {
    // The classic metrics customisation: a tag on the inbound requests_total, by patching
    // istio.stats's configuration; and a TypedStruct for Istio's peer metadata filter.
    let stats = envoy_filter(
        "default",
        "stats",
        json!({"configPatches": [{
            "applyTo": "HTTP_FILTER",
            "match": {"context": "SIDECAR_INBOUND", "listener": {"filterChain": {"filter": {
                "name": "envoy.filters.network.http_connection_manager",
                "subFilter": {"name": "istio.stats"}}}}},
            "patch": {"operation": "MERGE", "value": {
                "typed_config": {"@type": "type.googleapis.com/stats.PluginConfig",
                    "metrics": [{"name": "requests_total",
                                 "dimensions": {"request_host": "request.host"}}]}}}
        }, {
            "applyTo": "HTTP_FILTER",
            "match": {"context": "SIDECAR_INBOUND", "listener": {"filterChain": {"filter": {
                "name": "envoy.filters.network.http_connection_manager",
                "subFilter": {"name": "envoy.filters.http.router"}}}}},
            "patch": {"operation": "INSERT_BEFORE", "value": {
                "name": "peer-copy",
                "typed_config": {"@type": "type.googleapis.com/udpa.type.v1.TypedStruct",
                    "type_url": "type.googleapis.com/io.istio.http.peer_metadata.Config",
                    "value": {"downstream_discovery": [{"workload_discovery": {}}]}}}}
        }]}),
        3,
    );
    let mesh = resource(
        "MeshConfig",
        "istio-system",
        "mesh",
        json!({"defaultProviders": {"metrics": ["prometheus"]}}),
        1,
    );
    let resources = vec![reviews_service(), mesh, stats];
    let mut istio = reviews_workload();
    istio.build = crate::model::proxy::ProxyBuild::Istio;
    let out = translate(istio, resources.clone());
    let hcm = crate::translate::tests::hcm_in(&out.listeners["virtualInbound"], "0.0.0.0_9080");
    let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert!(names.contains(&"peer-copy"), "{names:?}");
    let stats = hcm
        .http_filters
        .iter()
        .find(|f| f.name == "istio.stats")
        .expect("istio.stats");
    let Some(
        envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType::TypedConfig(any),
    ) = &stats.config_type
    else {
        panic!("typed")
    };
    let config =
        pasa_proto::istio_proxy::stats::PluginConfig::decode(any.value.as_slice()).unwrap();
    // istiod's own setting kept, the patch's merged in.
    assert!(config.disable_host_header_fallback);
    assert_eq!(config.metrics[0].name, "requests_total");
    assert_eq!(config.metrics[0].dimensions["request_host"], "request.host");

    // Upstream Envoy has neither filter: both patches are left out.
    let out = translate(reviews_workload(), resources);
    let names = http_filter_names(&out.listeners["virtualInbound"], "0.0.0.0_9080");
    assert!(
        !names.iter().any(|n| n == "peer-copy" || n == "istio.stats"),
        "{names:?}"
    );
}
