//! Translation unit tests: a small Bookinfo-like mesh written as store resources. Its helpers
//! serve the other test modules, which each hold the tests of one concern: clusters
//! (`cluster_tests`), a workload's inbound side (`inbound_tests`), what an update rebuilds
//! (`reuse_tests`).

use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, LbPolicy,
};
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::config::route::v3::{Route, RouteAction, RouteConfiguration};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier as TcpClusterSpecifier;
use pasa_proto::store::v1::Resource;
use prost::Message;
use serde_json::json;

use super::*;
use crate::testing::resource;

pub(super) const REVIEWS: &str = "reviews.default.svc.cluster.local";

pub(super) fn reviews_service() -> Resource {
    resource(
        "ServiceEndpoints",
        "default",
        "reviews",
        json!({
            "addresses": ["10.96.0.20"],
            "ports": [{"name": "http", "port": 9080}],
            "endpoints": [
                {"address": "10.0.0.1", "labels": {"app": "reviews", "version": "v1"},
                 "locality": "us-east/a"},
                {"address": "10.0.0.2", "labels": {"app": "reviews", "version": "v2"},
                 "locality": "us-east/b"},
                {"address": "10.0.0.3", "labels": {"app": "reviews", "version": "v3"},
                 "locality": "us-east/b"}
            ]
        }),
        1,
    )
}

pub(super) fn reviews_rule(revision: u64) -> Resource {
    resource(
        "DestinationRule",
        "default",
        "reviews",
        json!({"host": "reviews", "subsets": [
            {"name": "v1", "labels": {"version": "v1"}},
            {"name": "v2", "labels": {"version": "v2"}},
            {"name": "v3", "labels": {"version": "v3"}}
        ]}),
        revision,
    )
}

pub(super) fn reviews_split() -> Resource {
    resource(
        "VirtualService",
        "default",
        "reviews",
        json!({"hosts": ["reviews"], "http": [{
            "name": "split",
            "route": [
                {"destination": {"host": "reviews", "subset": "v1"}, "weight": 80},
                {"destination": {"host": "reviews", "subset": "v2"}, "weight": 20}
            ],
            "retries": {"attempts": 3, "perTryTimeout": "2s", "retryOn": "5xx,503"},
            "fault": {"abort": {"httpStatus": 503, "percentage": {"value": 10}}}
        }]}),
        3,
    )
}

pub(super) fn proxy(ip: &str) -> Proxy {
    crate::testing::sidecar(ip)
}

pub(super) fn cache(resources: Vec<Resource>) -> Cache {
    Cache::from_resources(resources, 10)
}

/// The Gateway `namespace/name` of the ingress gateway (`istio: ingressgateway`): an HTTP server
/// on `port` for every host.
pub(super) fn http_gateway(namespace: &str, name: &str, port: u32) -> Resource {
    resource(
        "Gateway",
        namespace,
        name,
        json!({"selector": {"istio": "ingressgateway"}, "servers": [
            {"port": {"number": port, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]}),
        2,
    )
}

/// A workload of reviews (`app: reviews`) at the address of one of its endpoints.
pub(super) fn reviews_workload() -> Proxy {
    let mut p = proxy("10.0.0.2");
    p.labels = [("app".to_string(), "reviews".to_string())].into();
    p
}

/// What a new translator builds for Envoy from `resources`.
pub(super) fn translate_for(proxy: Proxy, resources: Vec<Resource>) -> crate::resource::Resources {
    Translator::new(proxy)
        .update(&cache(resources), Generator::Envoy)
        .expect("decodes what it encoded")
}

pub(super) fn hcm_of(listener: &Listener) -> HttpConnectionManager {
    let any = listener
        .filter_chains
        .iter()
        .flat_map(|c| &c.filters)
        .find_map(|f| match &f.config_type {
            Some(
                envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(a),
            ) if a.type_url.ends_with("HttpConnectionManager") => Some(a.clone()),
            _ => None,
        })
        .or_else(|| {
            listener
                .api_listener
                .as_ref()
                .and_then(|a| a.api_listener.clone())
        })
        .expect("an HTTP connection manager");
    HttpConnectionManager::decode(any.value.as_slice()).unwrap()
}

/// The HTTP connection manager of `l`'s filter chain `chain` (of the first chain that has one
/// when `chain` is empty).
pub(super) fn hcm_in(l: &Listener, chain: &str) -> HttpConnectionManager {
    let f = l
        .filter_chains
        .iter()
        .filter(|c| chain.is_empty() || c.name == chain)
        .flat_map(|c| &c.filters)
        .find(|f| f.name.ends_with("http_connection_manager"))
        .expect("a connection manager");
    let Some(envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any)) =
        &f.config_type
    else {
        panic!("typed")
    };
    HttpConnectionManager::decode(any.value.as_slice()).unwrap()
}

fn rds_name(listener: &Listener) -> String {
    match hcm_of(listener).route_specifier {
        Some(RouteSpecifier::Rds(rds)) => rds.route_config_name,
        other => panic!("not RDS: {other:?}"),
    }
}

pub(super) fn route_action(route: &Route) -> &RouteAction {
    match &route.action {
        Some(Action::Route(a)) => a,
        other => panic!("not a route action: {other:?}"),
    }
}

pub(super) fn vhost<'a>(
    config: &'a RouteConfiguration,
    name: &str,
) -> &'a envoy_types::pb::envoy::config::route::v3::VirtualHost {
    config
        .virtual_hosts
        .iter()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("no virtual host {name} in {:?}", config.virtual_hosts))
}

#[test]
fn sidecar_gets_istiod_names_subsets_and_weighted_routes() {
    let mut t = Translator::new(proxy("10.0.0.9"));
    let out = t
        .update(
            &cache(vec![reviews_service(), reviews_rule(2), reviews_split()]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    let names: Vec<&str> = out.clusters.keys().map(String::as_str).collect();
    for expected in [
        "BlackHoleCluster",
        "InboundPassthroughCluster",
        "PassthroughCluster",
        "outbound|9080||reviews.default.svc.cluster.local",
        "outbound|9080|v1|reviews.default.svc.cluster.local",
        "outbound|9080|v2|reviews.default.svc.cluster.local",
        "outbound|9080|v3|reviews.default.svc.cluster.local",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    let v2 = &out.clusters["outbound|9080|v2|reviews.default.svc.cluster.local"];
    assert_eq!(
        v2.cluster_discovery_type,
        Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32))
    );
    assert_eq!(
        v2.eds_cluster_config.as_ref().unwrap().service_name,
        "outbound|9080|v2|reviews.default.svc.cluster.local"
    );
    assert_eq!(v2.lb_policy, LbPolicy::LeastRequest as i32);

    // EDS: the subset's endpoints only, by locality, each locality weighted.
    let eds = &out.endpoints["outbound|9080|v2|reviews.default.svc.cluster.local"];
    assert_eq!(eds.endpoints.len(), 1);
    assert_eq!(eds.endpoints[0].locality.as_ref().unwrap().zone, "b");
    assert_eq!(eds.endpoints[0].lb_endpoints.len(), 1);
    assert_eq!(
        eds.endpoints[0]
            .load_balancing_weight
            .as_ref()
            .unwrap()
            .value,
        1
    );
    let all = &out.endpoints["outbound|9080||reviews.default.svc.cluster.local"];
    assert_eq!(
        all.endpoints
            .iter()
            .map(|l| l.lb_endpoints.len())
            .sum::<usize>(),
        3
    );

    // LDS → RDS "9080" → virtual host reviews...:9080 with the short names.
    let listener = &out.listeners["0.0.0.0_9080"];
    assert_eq!(rds_name(listener), "9080");
    for name in ["virtualOutbound", "virtualInbound"] {
        assert!(out.listeners.contains_key(name), "{name}");
    }
    let rc = &out.routes["9080"];
    let vh = vhost(rc, &format!("{REVIEWS}:9080"));
    // Sidecars ignore the port in Host headers, so the domains come without it.
    assert!(rc.ignore_port_in_host_matching);
    for domain in [
        REVIEWS,
        "reviews.default.svc.cluster.local.",
        "reviews",
        "reviews.default",
        "reviews.default.svc",
        "10.96.0.20",
    ] {
        assert!(
            vh.domains.iter().any(|d| d == domain),
            "{domain} not in {:?}",
            vh.domains
        );
    }
    assert_eq!(vh.routes[0].name, "split");
    let action = route_action(&vh.routes[0]);
    let Some(ClusterSpecifier::WeightedClusters(w)) = &action.cluster_specifier else {
        panic!("not weighted: {action:?}");
    };
    let split: Vec<(&str, u32)> = w
        .clusters
        .iter()
        .map(|c| (c.name.as_str(), c.weight.as_ref().unwrap().value))
        .collect();
    assert_eq!(
        split,
        [
            ("outbound|9080|v1|reviews.default.svc.cluster.local", 80),
            ("outbound|9080|v2|reviews.default.svc.cluster.local", 20)
        ]
    );
    let retry = action.retry_policy.as_ref().unwrap();
    assert_eq!(retry.num_retries.as_ref().unwrap().value, 3);
    assert_eq!(retry.retriable_status_codes, [503]);
    assert_eq!(retry.retry_on, "5xx,retriable-status-codes");
    assert!(
        vh.routes[0]
            .typed_per_filter_config
            .contains_key("envoy.filters.http.fault")
    );
    // The catch-all sends unknown hosts on.
    let any = vhost(rc, "allow_any");
    assert_eq!(any.domains, ["*"]);
    assert_eq!(
        route_action(&any.routes[0]).cluster_specifier,
        Some(ClusterSpecifier::Cluster("PassthroughCluster".into()))
    );
}

#[test]
fn service_without_virtual_service_gets_the_default_route() {
    let mut t = Translator::new(proxy("10.0.0.9"));
    let out = t
        .update(&cache(vec![reviews_service()]), Generator::Envoy)
        .expect("decodes what it encoded");
    let vh = vhost(&out.routes["9080"], &format!("{REVIEWS}:9080"));
    assert_eq!(vh.routes.len(), 1);
    assert_eq!(vh.routes[0].name, "default");
    assert_eq!(
        route_action(&vh.routes[0]).cluster_specifier,
        Some(ClusterSpecifier::Cluster(format!(
            "outbound|9080||{REVIEWS}"
        )))
    );
}

#[test]
fn grpc_clients_get_api_listeners_named_host_port() {
    let mut t = Translator::new(proxy("10.0.0.9"));
    let out = t
        .update(
            &cache(vec![reviews_service(), reviews_rule(2), reviews_split()]),
            Generator::Grpc,
        )
        .expect("decodes what it encoded");
    let name = format!("{REVIEWS}:9080");
    let listener = &out.listeners[&name];
    // The service's address, as istiod gives it (gRPC does not read it).
    assert_eq!(
        listener.address,
        Some(crate::translate::endpoint::socket_address(
            "10.96.0.20",
            9080
        ))
    );
    let hcm = hcm_of(listener);
    assert_eq!(
        hcm.http_filters.last().unwrap().name,
        "envoy.filters.http.router"
    );
    assert_eq!(hcm.http_filters[0].name, "envoy.filters.http.fault");
    assert_eq!(rds_name(listener), format!("outbound|9080||{REVIEWS}"));
    let rc = &out.routes[&format!("outbound|9080||{REVIEWS}")];
    let vh = vhost(rc, &name);
    assert!(vh.domains.contains(&name));
    assert!(matches!(
        route_action(&vh.routes[0]).cluster_specifier,
        Some(ClusterSpecifier::WeightedClusters(_))
    ));
    // No sidecar machinery, round robin (gRPC has no least-request).
    assert!(!out.listeners.contains_key("virtualOutbound"));
    assert!(!out.clusters.contains_key("PassthroughCluster"));
    assert_eq!(
        out.clusters[&format!("outbound|9080|v1|{REVIEWS}")].lb_policy,
        LbPolicy::RoundRobin as i32
    );
    // Every route target and every EDS cluster exists.
    for c in out.clusters.values() {
        if c.eds_cluster_config.is_some() {
            assert!(out.endpoints.contains_key(&c.name), "{}", c.name);
        }
    }
}

#[test]
fn tcp_services_get_a_listener_on_their_virtual_ip() {
    let db = resource(
        "ServiceEntry",
        "default",
        "db",
        json!({"hosts": ["db.example.com"], "addresses": ["192.168.7.7"],
               "ports": [{"number": 5432, "name": "tcp-pg", "protocol": "TCP"}],
               "resolution": "STATIC", "endpoints": [{"address": "192.168.7.8"}]}),
        1,
    );
    let mut t = Translator::new(proxy("10.0.0.9"));
    let out = t
        .update(&cache(vec![db]), Generator::Envoy)
        .expect("decodes what it encoded");
    let l = &out.listeners["192.168.7.7_5432"];
    let f = &l.filter_chains[0].filters[0];
    let Some(envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any)) =
        &f.config_type
    else {
        panic!()
    };
    let proxy = TcpProxy::decode(any.value.as_slice()).unwrap();
    assert_eq!(
        proxy.cluster_specifier,
        Some(TcpClusterSpecifier::Cluster(
            "outbound|5432||db.example.com".into()
        ))
    );
}

#[test]
fn sidecar_egress_and_export_to_narrow_what_is_seen() {
    let other_ns = resource(
        "ServiceEndpoints",
        "shop",
        "cart",
        json!({"addresses": ["10.96.1.1"], "ports": [{"name": "http", "port": 8080}]}),
        2,
    );
    let private = resource(
        "ServiceEndpoints",
        "billing",
        "ledger",
        json!({"addresses": ["10.96.2.1"], "ports": [{"name": "http", "port": 8080}],
               "exportTo": ["."]}),
        3,
    );
    let mut t = Translator::new(proxy("10.0.0.9"));
    let out = t
        .update(
            &cache(vec![reviews_service(), other_ns.clone(), private.clone()]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    assert!(
        out.clusters
            .contains_key("outbound|8080||cart.shop.svc.cluster.local")
    );
    assert!(
        !out.clusters
            .contains_key("outbound|8080||ledger.billing.svc.cluster.local")
    );

    let sidecar = resource(
        "Sidecar",
        "default",
        "default",
        json!({"egress": [{"hosts": ["./*", "istio-system/*"]}],
               "outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}}),
        4,
    );
    let resources = vec![reviews_service(), other_ns, private, sidecar];
    let out = t
        .update(&cache(resources.clone()), Generator::Envoy)
        .expect("decodes what it encoded");
    assert!(
        !out.clusters
            .contains_key("outbound|8080||cart.shop.svc.cluster.local")
    );
    assert!(
        out.clusters
            .contains_key(&format!("outbound|9080||{REVIEWS}"))
    );
    assert!(
        out.routes["9080"]
            .virtual_hosts
            .iter()
            .any(|v| v.name == "block_all")
    );

    // The subscription follows the egress hosts instead of asking for everything.
    let sub = crate::subscription::subscription(&proxy("10.0.0.9"), &cache(resources));
    assert!(
        sub.rules
            .iter()
            .all(|r| { !(r.kinds.is_empty() && r.namespaces.is_empty() && r.hosts.is_empty()) })
    );
    assert!(
        sub.rules
            .iter()
            .any(|r| r.namespaces == ["default"] && r.hosts == ["*"])
    );
}

/// A Sidecar naming its egress by FQDN still sees a VirtualService written with the short name
/// (istiod resolves VirtualService hosts in their namespace before matching egress hosts).
#[test]
fn egress_by_fqdn_sees_a_virtual_service_written_with_the_short_name() {
    let sidecar = resource(
        "Sidecar",
        "default",
        "default",
        json!({"egress": [{"hosts": [format!("default/{REVIEWS}")]}]}),
        4,
    );
    let mut t = Translator::new(proxy("10.0.0.9"));
    let out = t
        .update(
            &cache(vec![
                reviews_service(),
                reviews_rule(2),
                reviews_split(),
                sidecar,
            ]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    let host = vhost(&out.routes["9080"], &format!("{REVIEWS}:9080"));
    assert_eq!(host.routes.len(), 1);
    assert_eq!(host.routes[0].name, "split", "the VirtualService applies");
}

#[test]
fn destination_rule_in_the_proxy_namespace_wins_over_the_root_namespace() {
    let root = resource(
        "DestinationRule",
        "istio-system",
        "mesh-wide",
        json!({"host": "*.local", "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}}}),
        2,
    );
    let local = resource(
        "DestinationRule",
        "default",
        "reviews",
        json!({"host": REVIEWS, "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}}}),
        3,
    );
    let mut t = Translator::new(proxy("10.0.0.9"));
    let name = format!("outbound|9080||{REVIEWS}");
    let out = t
        .update(
            &cache(vec![reviews_service(), root.clone()]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    assert_eq!(out.clusters[&name].lb_policy, LbPolicy::Random as i32);
    let out = t
        .update(
            &cache(vec![reviews_service(), root, local]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    assert_eq!(out.clusters[&name].lb_policy, LbPolicy::RoundRobin as i32);
}

#[test]
fn services_known_by_cidr_share_the_wildcard_listener_by_prefix() {
    let se = |name: &str, host: &str, cidr: &str, revision| {
        resource(
            "ServiceEntry",
            "default",
            name,
            json!({"hosts": [host], "addresses": [cidr],
                   "ports": [{"number": 9999, "name": "tcp", "protocol": "TCP"}]}),
            revision,
        )
    };
    let mut t = Translator::new(proxy("10.0.0.9"));
    let out = t
        .update(
            &cache(vec![
                se("a", "a.example", "10.1.0.0/16", 1),
                se("b", "b.example", "10.1.2.3/16", 2),
                se("c", "c.example", "10.1.2.0/24", 3),
            ]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    let listener = &out.listeners["0.0.0.0_9999"];
    let prefixes: Vec<(String, u32)> = listener
        .filter_chains
        .iter()
        .map(|c| {
            let r = &c.filter_chain_match.as_ref().unwrap().prefix_ranges[0];
            (
                r.address_prefix.clone(),
                r.prefix_len.as_ref().unwrap().value,
            )
        })
        .collect();
    // b's range is a's once the host bits are cleared: the older entry keeps it.
    assert_eq!(
        prefixes,
        [("10.1.0.0".to_string(), 16), ("10.1.2.0".to_string(), 24)]
    );
}

#[test]
fn tls_routes_pick_destinations_by_sni() {
    let se = resource(
        "ServiceEntry",
        "default",
        "payments",
        json!({"hosts": ["*.payments.example"], "addresses": ["240.0.0.9"],
               "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
               "resolution": "NONE"}),
        1,
    );
    let vs = resource(
        "VirtualService",
        "default",
        "payments",
        json!({"hosts": ["*.payments.example"], "tls": [{
            "match": [{"port": 443, "sniHosts": ["eu.payments.example"]}],
            "route": [{"destination": {"host": "eu.payments.example"}}]}]}),
        2,
    );
    let mut t = Translator::new(proxy("10.0.0.9"));
    let out = t
        .update(&cache(vec![se, vs]), Generator::Envoy)
        .expect("decodes what it encoded");
    let l = &out.listeners["240.0.0.9_443"];
    assert_eq!(
        l.listener_filters[0].name,
        "envoy.filters.listener.tls_inspector"
    );
    assert_eq!(l.filter_chains.len(), 1);
    let m = l.filter_chains[0].filter_chain_match.as_ref().unwrap();
    assert_eq!(m.server_names, ["eu.payments.example"]);
    let Some(envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any)) =
        &l.filter_chains[0].filters[0].config_type
    else {
        panic!()
    };
    assert_eq!(
        TcpProxy::decode(any.value.as_slice())
            .unwrap()
            .cluster_specifier,
        Some(TcpClusterSpecifier::Cluster(
            "outbound|443||eu.payments.example".into()
        ))
    );
    // Any other server name follows the outbound traffic policy, as with istiod.
    assert_eq!(
        l.default_filter_chain.as_ref().unwrap().name,
        "PassthroughFilterChain"
    );
}

#[test]
fn allow_any_dynamic_dns_sends_unknown_plaintext_http_to_the_forward_proxy() {
    let mut p = proxy("10.0.0.9");
    p.mesh.outbound_policy = crate::mesh::OutboundPolicy::AllowAnyDynamicDns;
    let mut t = Translator::new(p);
    let out = t
        .update(&cache(vec![reviews_service()]), Generator::Envoy)
        .expect("decodes what it encoded");
    assert!(out.clusters.contains_key("AllowAnyDynamicDNSCluster"));
    let vo = &out.listeners["virtualOutbound"];
    let names: Vec<&str> = vo.filter_chains.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "virtualOutbound-blackhole",
            "virtualOutbound-catchall-tcp-http",
            "virtualOutbound-catchall-tcp"
        ]
    );
    let http = &vo.filter_chains[1];
    assert_eq!(
        http.filter_chain_match
            .as_ref()
            .unwrap()
            .application_protocols,
        ["http/1.1", "h2c"]
    );
    // Known HTTP ports end in the dynamic forward proxy too, TLS and TCP in the passthrough.
    let rc = &out.routes["9080"];
    let last = rc.virtual_hosts.last().unwrap();
    assert_eq!(last.name, "allow_any_dynamic_dns");
    assert_eq!(
        route_action(&last.routes[0]).cluster_specifier,
        Some(ClusterSpecifier::Cluster(
            "AllowAnyDynamicDNSCluster".into()
        ))
    );
}

#[test]
fn legacy_allocator_gives_a_host_the_same_address_across_service_entries() {
    let se = |name: &str, port: u32, protocol: &str, rev: u64| {
        resource(
            "ServiceEntry",
            "default",
            name,
            json!({"hosts": ["istio.io"], "location": "MESH_EXTERNAL", "resolution": "DNS",
                   "ports": [{"number": port, "name": name, "protocol": protocol}]}),
            rev,
        )
    };
    let mut p = proxy("1.1.1.1");
    p.dns_capture = true;
    p.dns_auto_allocate = true;
    p.flags.ip_autoallocate = false;
    let mut t = Translator::new(p);
    let out = t
        .update(
            &cache(vec![
                se("http", 80, "HTTP", 1),
                se("https", 443, "HTTPS", 2),
            ]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    // Both entries' ports are served; the TLS one on the allocated address.
    assert!(out.listeners.contains_key("240.240.91.120_443"));
    assert!(out.listeners.contains_key("0.0.0.0_80"));
    assert!(out.clusters.contains_key("outbound|443||istio.io"));
}

#[test]
fn a_router_serves_its_gateways_http_servers_and_the_bound_routes() {
    let gateway = http_gateway("default", "bookinfo-gateway", 8080);
    let vs = resource(
        "VirtualService",
        "default",
        "bookinfo",
        json!({"hosts": ["*"], "gateways": ["bookinfo-gateway"], "http": [{
            "match": [{"uri": {"prefix": "/reviews"}}],
            "route": [{"destination": {"host": "reviews", "port": {"number": 9080}}}]}]}),
        3,
    );
    let mut router = proxy("10.0.0.50");
    router.kind = ProxyType::Router;
    router.namespace = "istio-system".into();
    router.labels = [("istio".to_string(), "ingressgateway".to_string())].into();
    let mut t = Translator::new(router);
    let out = t
        .update(
            &cache(vec![reviews_service(), gateway, vs]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    let names: Vec<&str> = out.listeners.keys().map(String::as_str).collect();
    assert_eq!(names, ["0.0.0.0_8080"], "no sidecar listeners on a router");
    assert_eq!(rds_name(&out.listeners["0.0.0.0_8080"]), "http.8080");
    let vh = vhost(&out.routes["http.8080"], "*:8080");
    assert_eq!(
        route_action(&vh.routes[0]).cluster_specifier,
        Some(ClusterSpecifier::Cluster(format!(
            "outbound|9080||{REVIEWS}"
        )))
    );
    assert!(
        out.clusters
            .contains_key(&format!("outbound|9080||{REVIEWS}"))
    );
}

#[test]
fn virtual_hosts_encoded_around_their_routes_are_the_bytes_of_the_message() {
    let weighted = Route {
        name: "split".into(),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster("outbound|80|v2|a".into())),
            ..Default::default()
        })),
        ..route::default_route("outbound|80||a")
    };
    let domains = vec!["a.ns.svc.cluster.local".to_string(), "a".to_string()];
    for routes in [
        vec![],
        vec![route::default_route("outbound|80||a")],
        vec![weighted, route::default_route("outbound|80||a")],
    ] {
        let cookie = registry::PersistentSession::Cookie {
            name: "s".into(),
            path: "/".into(),
        };
        for (attempts, session) in [(true, None), (false, None), (true, Some(&cookie))] {
            let mut whole =
                route::virtual_host("a:80".into(), domains.clone(), routes.clone(), attempts);
            if let Some(session) = session {
                session::configure(&mut whole.typed_per_filter_config, session);
            }
            assert_eq!(
                route::encoded_virtual_host(
                    "a:80",
                    &domains,
                    &route::encoded_routes(&routes),
                    (attempts, session)
                ),
                whole.encode_to_vec(),
                "{routes:?}"
            );
        }
    }
}

/// The names of the HTTP filters of `listener`'s chain named `chain` (any chain when empty).
pub(super) fn http_filter_names(listener: &Listener, chain: &str) -> Vec<String> {
    let mut one = listener.clone();
    one.filter_chains
        .retain(|c| chain.is_empty() || c.name == chain);
    hcm_of(&one)
        .http_filters
        .iter()
        .map(|f| f.name.clone())
        .collect()
}

#[test]
fn a_gateway_api_wildcard_host_leaves_its_services_to_no_virtual_service() {
    // Two services under `*.example.com`, one also under `*.shop.example.com`.
    let service = |name: &str, ip: &str| {
        resource(
            "ServiceEntry",
            "default",
            name,
            json!({"hosts": [format!("{name}.shop.example.com")], "addresses": [ip],
                   "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                   "resolution": "STATIC", "endpoints": [{"address": "10.3.0.1"}]}),
            1,
        )
    };
    let user = resource(
        "VirtualService",
        "default",
        "everything",
        json!({"hosts": ["*.example.com"],
               "http": [{"name": "user", "route": [{"destination": {"host": "web.shop.example.com"}}]}]}),
        2,
    );
    // What the syncer writes for an HTTPRoute on a ServiceEntry with a wildcard host beside
    // `web`'s: the wildcard names no service, but is the most specific one for `cart`.
    let mut generated = resource(
        "VirtualService",
        "default",
        "default~web.shop.example.com",
        json!({"hosts": ["web.shop.example.com", "*.shop.example.com"], "gateways": ["mesh"],
               "http": [{"name": "default.route.0",
                         "route": [{"destination": {"host": "web.shop.example.com",
                                                    "port": {"number": 80}}}]}]}),
        3,
    );
    generated.annotations = [(
        "internal.istio.io/route-semantics".to_string(),
        "gateway".to_string(),
    )]
    .into_iter()
    .collect();
    let out = translate_for(
        proxy("10.0.0.9"),
        vec![
            service("web", "240.0.0.1"),
            service("cart", "240.0.0.2"),
            user,
            generated,
        ],
    );
    let cart = vhost(&out.routes["80"], "cart.shop.example.com:80");
    assert_eq!(
        cart.routes[0].name, "default",
        "istiod leaves `cart` to no VirtualService: the user's wider wildcard does not claim it"
    );
    let web = vhost(&out.routes["80"], "web.shop.example.com:80");
    assert_eq!(web.routes[0].name, "default.route.0");
}

/// `reviews` with one endpoint of service account `bookinfo-reviews`, and a DestinationRule
/// asking for ISTIO_MUTUAL to it.
pub(super) fn mutual_reviews() -> (Resource, Resource) {
    let service = resource(
        "ServiceEndpoints",
        "default",
        "reviews",
        json!({"addresses": ["10.96.0.20"], "ports": [{"name": "http", "port": 9080}],
               "endpoints": [{"address": "10.0.0.1", "serviceAccount": "bookinfo-reviews"}]}),
        1,
    );
    let rule = resource(
        "DestinationRule",
        "default",
        "reviews",
        json!({"host": "reviews", "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}}}),
        2,
    );
    (service, rule)
}
