//! Translation unit tests: a small Bookinfo-like mesh written as store resources.

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
use serde_json::{Value, json};

use super::authz::HTTP_RBAC;
use super::*;
use crate::testing::resource;

const REVIEWS: &str = "reviews.default.svc.cluster.local";

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

fn reviews_split() -> Resource {
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

fn proxy(ip: &str) -> Proxy {
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

fn route_action(route: &Route) -> &RouteAction {
    match &route.action {
        Some(Action::Route(a)) => a,
        other => panic!("not a route action: {other:?}"),
    }
}

fn vhost<'a>(
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
fn a_destination_rule_change_rebuilds_only_its_host() {
    let ratings = resource(
        "ServiceEndpoints",
        "default",
        "ratings",
        json!({"addresses": ["10.96.0.30"], "ports": [{"name": "http", "port": 9080}],
               "endpoints": [{"address": "10.0.1.1"}]}),
        4,
    );
    let mut t = Translator::new(proxy("10.0.0.9"));
    let before = t
        .update(
            &cache(vec![reviews_service(), reviews_rule(2), ratings.clone()]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    assert_eq!(t.rebuilt().services, 2);
    let mut rule = reviews_rule(7);
    rule.spec_json =
        json!({"host": "reviews", "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}},
        "subsets": [{"name": "v1", "labels": {"version": "v1"}}]})
        .to_string();
    let after = t
        .update(
            &cache(vec![reviews_service(), rule, ratings]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    assert_eq!(t.rebuilt().services, 1);
    assert_eq!(before.routes, after.routes);
    assert!(
        !after
            .clusters
            .contains_key(&format!("outbound|9080|v2|{REVIEWS}"))
    );
    assert_eq!(
        after.clusters[&format!("outbound|9080||{REVIEWS}")].lb_policy,
        LbPolicy::RoundRobin as i32
    );
}

#[test]
fn a_virtual_service_change_encodes_only_its_virtual_hosts() {
    let service = |i: usize| {
        resource(
            "ServiceEndpoints",
            "default",
            &format!("svc-{i}"),
            json!({"addresses": [format!("10.96.1.{i}")], "ports": [{"name": "http", "port": 9080}],
                   "endpoints": [{"address": format!("10.0.1.{i}")}]}),
            1 + i as u64,
        )
    };
    let split = |revision: u64, v1: u32, hosts: Value| Resource {
        create_revision: 20,
        ..resource(
            "VirtualService",
            "default",
            "svc-0",
            json!({"hosts": hosts, "http": [{"route": [
                {"destination": {"host": "svc-0", "port": {"number": 9080}}, "weight": v1},
                {"destination": {"host": "svc-1", "port": {"number": 9080}}, "weight": 100 - v1}]}]}),
            revision,
        )
    };
    let rule = |revision: u64, lb: Value| Resource {
        create_revision: 30,
        ..resource(
            "DestinationRule",
            "default",
            "svc-3",
            json!({"host": "svc-3", "trafficPolicy": {"loadBalancer": lb}}),
            revision,
        )
    };
    let services: Vec<Resource> = (0..8).map(service).collect();
    let with = |extra: Vec<Resource>| {
        let mut all = services.clone();
        all.extend(extra);
        cache(all)
    };
    let round_robin = json!({"simple": "ROUND_ROBIN"});
    let mut t = Translator::new(proxy("10.0.0.9"));
    let first = t
        .update(
            &with(vec![
                split(20, 80, json!(["svc-0"])),
                rule(30, round_robin.clone()),
            ]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    assert_eq!(t.rebuilt().virtual_hosts, 8, "one per service, built once");

    // New weights: the route configuration of its port, and in it only its virtual host.
    let weights = with(vec![
        split(40, 50, json!(["svc-0"])),
        rule(30, round_robin.clone()),
    ]);
    let reweighted = t.update(&weights, Generator::Envoy).expect("decodes");
    let rebuilt = t.rebuilt();
    assert_eq!(
        (rebuilt.routes, rebuilt.virtual_hosts),
        (1, 1),
        "{rebuilt:?}"
    );
    assert_ne!(first.routes["9080"], reweighted.routes["9080"]);
    let scratch = |c: &Cache| {
        Translator::new(proxy("10.0.0.9"))
            .update(c, Generator::Envoy)
            .expect("decodes")
    };
    assert_eq!(reweighted.routes, scratch(&weights).routes);

    // Another host: the virtual hosts are planned again, and the one whose domains it takes
    // is encoded again with its own (the unchanged ones are copied).
    let hosts = with(vec![
        split(41, 50, json!(["svc-0", "svc-2"])),
        rule(30, round_robin),
    ]);
    let rehosted = t.update(&hosts, Generator::Envoy).expect("decodes");
    let rebuilt = t.rebuilt();
    assert_eq!(rehosted.routes, scratch(&hosts).routes);
    assert_eq!(rebuilt.routes, 1);
    assert!(
        (1..=2).contains(&rebuilt.virtual_hosts),
        "svc-2 joins svc-0's virtual host: {rebuilt:?}"
    );

    // A hash policy on a service without a VirtualService: its default route only.
    let hashed = with(vec![
        split(41, 50, json!(["svc-0", "svc-2"])),
        rule(50, json!({"consistentHash": {"httpHeaderName": "x-user"}})),
    ]);
    let out = t.update(&hashed, Generator::Envoy).expect("decodes");
    let rebuilt = t.rebuilt();
    assert_eq!(out.routes, scratch(&hashed).routes);
    assert_eq!(
        (rebuilt.routes, rebuilt.virtual_hosts),
        (1, 1),
        "{rebuilt:?}"
    );
}

#[test]
fn an_endpoint_change_rebuilds_its_service_and_not_the_listeners() {
    // One object, modified: created at revision 1, modified at `revision`.
    let endpoints = |revision: u64, extra: &str| Resource {
        create_revision: 1,
        ..resource(
            "ServiceEndpoints",
            "default",
            "reviews",
            json!({"addresses": ["10.96.0.20"], "ports": [{"name": "http", "port": 9080}],
                   "endpoints": [{"address": "10.0.0.1", "labels": {"version": "v1"}},
                                 {"address": extra, "labels": {"version": "v2"}}]}),
            revision,
        )
    };
    let mut t = Translator::new(proxy("10.0.0.9"));
    let split = reviews_split();
    let before = t
        .update(
            &cache(vec![
                endpoints(1, "10.0.0.2"),
                reviews_rule(2),
                split.clone(),
            ]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    assert!(t.rebuilt().listeners);

    // Another pod of the service: its clusters and load assignments, nothing else.
    let after = t
        .update(
            &cache(vec![
                endpoints(5, "10.0.0.7"),
                reviews_rule(2),
                split.clone(),
            ]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    let rebuilt = t.rebuilt();
    assert_eq!(rebuilt.services, 1);
    assert!(!rebuilt.listeners, "listeners kept");
    assert_eq!(rebuilt.routes, 0, "route configurations kept");
    assert_eq!(
        rebuilt.clusters, 0,
        "EDS clusters read no endpoints: not encoded again"
    );
    let own = after
        .endpoints
        .keys()
        .filter(|k| k.ends_with(REVIEWS))
        .count();
    assert_eq!(
        rebuilt.assignments, own,
        "the service's load assignments, each subset's"
    );
    assert_eq!(before.listeners, after.listeners);
    assert_eq!(before.routes, after.routes);
    let eds = &after.endpoints[&format!("outbound|9080|v2|{REVIEWS}")];
    assert_eq!(eds.endpoints[0].lb_endpoints.len(), 1);
    assert_ne!(before.endpoints, after.endpoints);

    // The proxy's own address joins the service: its inbound listener changes.
    let own = t
        .update(
            &cache(vec![endpoints(6, "10.0.0.9"), reviews_rule(2), split]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    assert!(
        t.rebuilt().listeners,
        "the inbound side follows the proxy's own endpoints"
    );
    assert_ne!(
        own.listeners["virtualInbound"],
        after.listeners["virtualInbound"]
    );
}

/// The endpoints `cluster`'s load assignment holds (of 10.0.0.1 to 10.0.0.3), with the health
/// each is sent with.
fn held_endpoints(
    out: &Resources,
    cluster: &str,
) -> Vec<(
    String,
    envoy_types::pb::envoy::config::core::v3::HealthStatus,
)> {
    use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
    out.endpoints[cluster]
        .endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .map(|e| {
            let Some(HostIdentifier::Endpoint(endpoint)) = &e.host_identifier else {
                panic!("no endpoint in {e:?}");
            };
            let address = format!("{:?}", endpoint.address);
            let ip = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
                .into_iter()
                .find(|ip| address.contains(ip))
                .expect("a known address");
            (ip.to_string(), e.health_status())
        })
        .collect()
}

#[test]
fn unready_endpoints_are_sent_unhealthy_unless_a_panic_threshold_could_pick_them() {
    use envoy_types::pb::envoy::config::core::v3::HealthStatus;
    let service = resource(
        "ServiceEndpoints",
        "default",
        "reviews",
        json!({"addresses": ["10.96.0.20"], "ports": [{"name": "http", "port": 9080}],
               "endpoints": [{"address": "10.0.0.1", "labels": {"version": "v1"}},
                             {"address": "10.0.0.2", "labels": {"version": "v2"}},
                             {"address": "10.0.0.3", "labels": {"version": "v2"},
                              "ready": false}]}),
        1,
    );
    // The rule's panic threshold for every cluster but v2's, whose own outlier detection
    // sets none.
    let rule = resource(
        "DestinationRule",
        "default",
        "reviews",
        json!({"host": "reviews",
               "trafficPolicy": {"outlierDetection": {"consecutive5xxErrors": 5,
                                                      "minHealthPercent": 50}},
               "subsets": [
                   {"name": "v1", "labels": {"version": "v1"}},
                   {"name": "v2", "labels": {"version": "v2"},
                    "trafficPolicy": {"outlierDetection": {"consecutive5xxErrors": 5}}}]}),
        2,
    );
    let held = |out: &Resources, subset: &str| {
        held_endpoints(out, &format!("outbound|9080|{subset}|{REVIEWS}"))
    };
    let healthy = |ip: &str| (ip.to_string(), HealthStatus::Healthy);
    let unhealthy = |ip: &str| (ip.to_string(), HealthStatus::Unhealthy);

    // Without a rule: every endpoint, each as healthy as it is.
    let out = Translator::new(proxy("10.0.0.9"))
        .update(&cache(vec![service.clone()]), Generator::Envoy)
        .expect("decodes what it encoded");
    assert_eq!(
        held(&out, ""),
        [
            healthy("10.0.0.1"),
            healthy("10.0.0.2"),
            unhealthy("10.0.0.3")
        ]
    );

    let out = Translator::new(proxy("10.0.0.9"))
        .update(&cache(vec![service, rule]), Generator::Envoy)
        .expect("decodes what it encoded");
    assert_eq!(held(&out, ""), [healthy("10.0.0.1"), healthy("10.0.0.2")]);
    assert_eq!(held(&out, "v1"), [healthy("10.0.0.1")]);
    assert_eq!(
        held(&out, "v2"),
        [healthy("10.0.0.2"), unhealthy("10.0.0.3")]
    );
    // Panic mode as the policy says: at the rule's threshold, or off.
    let threshold = |subset: &str| {
        out.clusters[&format!("outbound|9080|{subset}|{REVIEWS}")]
            .common_lb_config
            .as_ref()
            .and_then(|c| c.healthy_panic_threshold.as_ref())
            .map(|p| p.value)
    };
    assert_eq!(threshold(""), Some(50.0));
    assert_eq!(threshold("v2"), Some(0.0));
}

/// Persistent sessions as istiod serves them: a service labelled for them keeps its draining
/// endpoints (DRAINING, on its default cluster, which lets a session's host override pick
/// them); others never get theirs; with the stateful session filter on, outbound connection
/// managers carry it before the router and the service's virtual host and the routes to it
/// configure it.
#[test]
fn persistent_sessions_keep_draining_endpoints_and_configure_the_session_filter() {
    use envoy_types::pb::envoy::config::core::v3::HealthStatus;
    use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3::{
        StatefulSessionPerRoute, stateful_session_per_route::Override,
    };
    use envoy_types::pb::envoy::extensions::http::stateful_session::cookie::v3::CookieBasedSessionState;
    let service = |name: &str, ip: &str, labels: &[(&str, &str)], revision: u64| {
        let mut r = resource(
            "ServiceEndpoints",
            "default",
            name,
            json!({"addresses": [ip], "ports": [{"name": "http", "port": 9080}],
                   "endpoints": [{"address": "10.0.0.1", "labels": {"version": "v1"}},
                                 {"address": "10.0.0.2", "labels": {"version": "v1"},
                                  "ready": false, "draining": true},
                                 {"address": "10.0.0.3", "labels": {"version": "v2",
                                                                    "istio.io/draining": "yes"}}]}),
            revision,
        );
        r.labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        r
    };
    let carts = service(
        "carts",
        "10.96.0.30",
        &[("istio.io/persistent-session", "sid:/shop")],
        1,
    );
    let plain = service("plain", "10.96.0.31", &[], 2);
    let by_header = service(
        "byheader",
        "10.96.0.32",
        &[("istio.io/persistent-session-header", "x-session")],
        3,
    );
    let rule = resource(
        "DestinationRule",
        "default",
        "carts",
        json!({"host": "carts", "subsets": [{"name": "v1", "labels": {"version": "v1"}}]}),
        4,
    );
    let routes = resource(
        "VirtualService",
        "default",
        "front",
        json!({"hosts": ["plain"],
               "http": [{"route": [{"destination": {"host": "plain"}, "weight": 50},
                                   {"destination": {"host": "carts"}, "weight": 50}]}]}),
        5,
    );
    let resources = vec![carts, plain, by_header, rule, routes];
    let held = held_endpoints;
    let overrides = |out: &Resources, cluster: &str| {
        out.clusters[cluster]
            .common_lb_config
            .as_ref()
            .and_then(|c| c.override_host_status.as_ref())
            .map(|s| s.statuses.clone())
    };
    let carts = "outbound|9080||carts.default.svc.cluster.local";
    let carts_v1 = "outbound|9080|v1|carts.default.svc.cluster.local";
    let plain = "outbound|9080||plain.default.svc.cluster.local";
    let by_header = "outbound|9080||byheader.default.svc.cluster.local";
    let keeps = Some(
        [
            HealthStatus::Healthy,
            HealthStatus::Draining,
            HealthStatus::Unknown,
            HealthStatus::Degraded,
        ]
        .map(|s| s as i32)
        .to_vec(),
    );
    for filter in [false, true] {
        // A workload of the services, so that it has an inbound side too.
        let mut p = proxy("10.0.0.1");
        p.flags.persistent_session_filter = filter;
        let out = Translator::new(p)
            .update(&cache(resources.clone()), Generator::Envoy)
            .expect("decodes what it encoded");
        let draining = |ip: &str| (ip.to_string(), HealthStatus::Draining);
        let healthy = |ip: &str| (ip.to_string(), HealthStatus::Healthy);
        // Draining endpoints (by the syncer's mark or by label) for cookie sessions only.
        assert_eq!(
            held(&out, carts),
            [
                healthy("10.0.0.1"),
                draining("10.0.0.2"),
                draining("10.0.0.3")
            ]
        );
        assert_eq!(
            held(&out, carts_v1),
            [healthy("10.0.0.1"), draining("10.0.0.2")]
        );
        assert_eq!(held(&out, plain), [healthy("10.0.0.1")]);
        assert_eq!(held(&out, by_header), [healthy("10.0.0.1")]);
        // The default clusters of services with sessions keep them; subsets and others not.
        assert_eq!(overrides(&out, carts), keeps);
        assert_eq!(overrides(&out, by_header), keeps);
        assert_eq!(overrides(&out, carts_v1), None);
        assert_eq!(overrides(&out, plain), None);

        // The filter, on outbound connection managers, just before the router.
        let names = http_filter_names(&out.listeners["0.0.0.0_9080"], "");
        assert_eq!(
            names.iter().any(|n| n == session::FILTER),
            filter,
            "{names:?}"
        );
        if filter {
            assert_eq!(names[names.len() - 2], session::FILTER, "{names:?}");
        }
        let config = &out.routes["9080"];
        let session_of = |per_filter: &std::collections::HashMap<
            String,
            envoy_types::pb::google::protobuf::Any,
        >| {
            let any = per_filter.get(session::FILTER)?;
            let per_route = StatefulSessionPerRoute::decode(any.value.as_slice()).unwrap();
            let Some(Override::StatefulSession(s)) = per_route.r#override else {
                panic!("no session in {per_route:?}");
            };
            let state = s.session_state.unwrap();
            assert_eq!(state.name, "envoy.http.stateful_session.cookie");
            let cookie =
                CookieBasedSessionState::decode(state.typed_config.unwrap().value.as_slice())
                    .unwrap()
                    .cookie
                    .unwrap();
            Some((cookie.name, cookie.path))
        };
        let cookie = filter.then(|| ("sid".to_string(), "/shop".to_string()));
        let vh = vhost(config, "carts.default.svc.cluster.local:9080");
        assert_eq!(session_of(&vh.typed_per_filter_config), cookie);
        // plain has no sessions of its own, but its VirtualService's route to several services
        // takes the first one's with sessions.
        let vh = vhost(config, "plain.default.svc.cluster.local:9080");
        assert_eq!(session_of(&vh.typed_per_filter_config), None);
        assert_eq!(session_of(&vh.routes[0].typed_per_filter_config), cookie);
        // Never on the inbound side.
        let inbound = http_filter_names(&out.listeners["virtualInbound"], "0.0.0.0_9080");
        assert!(!inbound.iter().any(|n| n == session::FILTER), "{inbound:?}");

        // A gRPC client's listener for the service carries the service's own session first.
        let mut p = proxy("10.0.0.9");
        p.flags.persistent_session_filter = filter;
        let out = Translator::new(p)
            .update(&cache(resources.clone()), Generator::Grpc)
            .expect("decodes what it encoded");
        let first = |host: &str| {
            let listener = &out.listeners[&format!("{host}.default.svc.cluster.local:9080")];
            hcm_of(listener).http_filters[0].name.clone()
        };
        assert_eq!(first("carts") == session::FILTER, filter);
        assert_eq!(first("plain"), "envoy.filters.http.fault");
        assert_eq!(overrides(&out, carts), keeps);
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
fn workload_of_a_service_gets_inbound_clusters_and_chains() {
    let mut t = Translator::new(proxy("10.0.0.2"));
    let out = t
        .update(&cache(vec![reviews_service()]), Generator::Envoy)
        .expect("decodes what it encoded");
    assert!(out.clusters.contains_key("inbound|9080||"));
    let inbound = &out.listeners["virtualInbound"];
    assert!(
        inbound
            .filter_chains
            .iter()
            .any(|c| c.name == "0.0.0.0_9080")
    );
    let mut other = Translator::new(proxy("10.0.0.9"));
    let out = other
        .update(&cache(vec![reviews_service()]), Generator::Envoy)
        .expect("decodes what it encoded");
    assert!(!out.clusters.contains_key("inbound|9080||"));
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
fn consistent_hash_sets_ring_hash_and_the_route_hash_policy() {
    use envoy_types::pb::envoy::config::route::v3::route_action::hash_policy::PolicySpecifier;
    let rule = resource(
        "DestinationRule",
        "default",
        "reviews",
        json!({"host": "reviews", "trafficPolicy": {"loadBalancer": {
            "consistentHash": {"httpHeaderName": "x-user", "ringHash": {"minimumRingSize": "2048"}}}}}),
        2,
    );
    let mut t = Translator::new(proxy("10.0.0.9"));
    let out = t
        .update(&cache(vec![reviews_service(), rule]), Generator::Envoy)
        .expect("decodes what it encoded");
    let c = &out.clusters[&format!("outbound|9080||{REVIEWS}")];
    assert_eq!(c.lb_policy, LbPolicy::RingHash as i32);
    let vh = vhost(&out.routes["9080"], &format!("{REVIEWS}:9080"));
    // Both the default route of a service without a VirtualService and a VirtualService route
    // to it hash by the key.
    assert_eq!(route_action(&vh.routes[0]).hash_policy.len(), 1);
    let vs = resource(
        "VirtualService",
        "default",
        "reviews",
        json!({"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}}]}]}),
        3,
    );
    let rule = resource(
        "DestinationRule",
        "default",
        "reviews",
        json!({"host": "reviews", "trafficPolicy": {"loadBalancer": {
            "consistentHash": {"httpHeaderName": "x-user"}}}}),
        2,
    );
    let out = t
        .update(&cache(vec![reviews_service(), rule, vs]), Generator::Envoy)
        .expect("decodes what it encoded");
    let vh = vhost(&out.routes["9080"], &format!("{REVIEWS}:9080"));
    let policy = &route_action(&vh.routes[0]).hash_policy;
    assert_eq!(policy.len(), 1);
    assert!(matches!(
        &policy[0].policy_specifier,
        Some(PolicySpecifier::Header(h)) if h.header_name == "x-user"
    ));
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

/// The protocols a `virtualInbound` chain for `port` accepts: (transport, ALPN, terminates TLS).
fn inbound_chains_for(out: &Resources, port: u32) -> Vec<(String, Vec<String>, bool)> {
    out.listeners["virtualInbound"]
        .filter_chains
        .iter()
        .filter_map(|c| {
            let m = c.filter_chain_match.as_ref()?;
            (m.destination_port.as_ref()?.value == port).then(|| {
                (
                    m.transport_protocol.clone(),
                    m.application_protocols.clone(),
                    c.transport_socket.is_some(),
                )
            })
        })
        .collect()
}

#[test]
fn peer_authentication_shapes_inbound_chains_per_port() {
    let pa = |ns: &str, name: &str, spec: Value, rev: u64| {
        let mut r = resource("PeerAuthentication", ns, name, spec, rev);
        r.api_version = "security.istio.io/v1".into();
        r
    };
    let mesh_strict = pa(
        "istio-system",
        "default",
        json!({"mtls": {"mode": "STRICT"}}),
        2,
    );
    let port_disabled = pa(
        "default",
        "reviews",
        json!({"selector": {"matchLabels": {"app": "reviews"}},
               "portLevelMtls": {"9080": {"mode": "DISABLE"}}}),
        3,
    );
    let mut p = proxy("10.0.0.2");
    p.labels.insert("app".into(), "reviews".into());
    // Mesh-wide STRICT: the HTTP port accepts Istio mTLS only.
    let mut t = Translator::new(p.clone());
    let out = t
        .update(
            &cache(vec![reviews_service(), mesh_strict.clone()]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    assert_eq!(
        inbound_chains_for(&out, 9080),
        [("tls".into(), vec![], true)]
    );
    // The workload's port-level DISABLE wins for its port: plaintext only.
    let mut t = Translator::new(p);
    let out = t
        .update(
            &cache(vec![reviews_service(), mesh_strict, port_disabled]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    assert_eq!(
        inbound_chains_for(&out, 9080),
        [("raw_buffer".into(), vec![], false)]
    );
    // Without any policy the port is PERMISSIVE: mTLS by ALPN, or plaintext.
    let mut t = Translator::new(proxy("10.0.0.2"));
    let out = t
        .update(&cache(vec![reviews_service()]), Generator::Envoy)
        .expect("decodes what it encoded");
    let chains = inbound_chains_for(&out, 9080);
    assert_eq!(chains.len(), 2);
    assert!(chains[0].2 && chains[0].1.contains(&"istio-http/1.1".to_string()));
    assert_eq!(chains[1], ("raw_buffer".into(), vec![], false));
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
fn subset_clusters_share_their_port_policy_and_differ_where_their_own_policy_does() {
    use envoy_types::pb::envoy::config::core::v3::TransportSocket;
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    fn sni(socket: Option<&TransportSocket>) -> String {
        let Some(ConfigType::TypedConfig(any)) = socket.and_then(|s| s.config_type.as_ref()) else {
            panic!("no typed transport socket in {socket:?}");
        };
        UpstreamTlsContext::decode(any.value.as_slice())
            .expect("an upstream TLS context")
            .sni
    }
    let mut rule = reviews_rule(2);
    rule.spec_json = json!({"host": "reviews",
    "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"},
                      "outlierDetection": {"consecutive5xxErrors": 7, "interval": "5s"}},
    "subsets": [
        {"name": "v1", "labels": {"version": "v1"}},
        {"name": "v2", "labels": {"version": "v2"},
         "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}, "tls": {"mode": "ISTIO_MUTUAL"}}},
        {"name": "v3", "labels": {"version": "v3"}}
    ]})
    .to_string();
    let out = Translator::new(proxy("10.0.0.9"))
        .update(&cache(vec![reviews_service(), rule]), Generator::Envoy)
        .expect("decodes what it encoded");
    let cluster = |subset: &str| &out.clusters[&format!("outbound|9080|{subset}|{REVIEWS}")];
    let default = cluster("");
    for subset in ["v1", "v3"] {
        let c = cluster(subset);
        let name = format!("outbound|9080|{subset}|{REVIEWS}");
        assert_eq!(c.name, name);
        assert_eq!(c.eds_cluster_config.as_ref().unwrap().service_name, name);
        // What the port and the rule's policy decide is the default cluster's.
        assert_eq!(c.lb_policy, LbPolicy::RoundRobin as i32);
        assert_eq!(c.outlier_detection, default.outlier_detection);
        assert_eq!(c.circuit_breakers, default.circuit_breakers);
        // The rule, and the subset the cluster is for, as istiod records them.
        let istio = &c.metadata.as_ref().unwrap().filter_metadata["istio"].fields;
        let default_istio = &default.metadata.as_ref().unwrap().filter_metadata["istio"].fields;
        assert_eq!(istio["config"], default_istio["config"]);
        assert_eq!(
            istio["subset"].kind,
            Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(
                subset.into()
            ))
        );
        assert!(!default_istio.contains_key("subset"));
        assert_eq!(c.connect_timeout, default.connect_timeout);
        assert_eq!(c.cluster_discovery_type, default.cluster_discovery_type);
        // Auto mTLS, with the subset's own SNI.
        assert_eq!(c.transport_socket_matches.len(), 2);
        assert_eq!(
            sni(c.transport_socket_matches[0].transport_socket.as_ref()),
            format!("outbound_.9080_.{subset}_.{REVIEWS}")
        );
        assert_eq!(c.transport_socket, None);
    }
    assert_eq!(
        sni(default.transport_socket_matches[0]
            .transport_socket
            .as_ref()),
        format!("outbound_.9080_._.{REVIEWS}")
    );
    // v2's own policy: its load balancer and its TLS, the rule's outlier detection.
    let v2 = cluster("v2");
    assert_eq!(v2.lb_policy, LbPolicy::Random as i32);
    assert_eq!(v2.outlier_detection, default.outlier_detection);
    assert!(v2.outlier_detection.is_some());
    assert!(v2.transport_socket_matches.is_empty());
    assert_eq!(
        sni(v2.transport_socket.as_ref()),
        format!("outbound_.9080_.v2_.{REVIEWS}")
    );
    assert_eq!(
        v2.eds_cluster_config.as_ref().unwrap().service_name,
        v2.name
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
fn authorization_policies_put_rbac_first_on_the_inbound_side_and_on_routers() {
    let deny = |ns: &str, name: &str, selector: Value, revision: u64| {
        resource(
            "AuthorizationPolicy",
            ns,
            name,
            json!({"selector": {"matchLabels": selector}, "action": "DENY",
                   "rules": [{"to": [{"operation": {"paths": ["/admin"]}}]}]}),
            revision,
        )
    };
    // A workload of reviews: its inbound HTTP chain gets the RBAC filter once a policy selects
    // it, and not for a policy of other workloads.
    let mut workload = proxy("10.0.0.2");
    workload.labels = [("app".to_string(), "reviews".to_string())].into();
    let mut t = Translator::new(workload);
    let chain = "0.0.0.0_9080";
    let out = t
        .update(
            &cache(vec![
                reviews_service(),
                deny("default", "other", json!({"app": "ratings"}), 5),
            ]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    let names = http_filter_names(&out.listeners["virtualInbound"], chain);
    assert!(!names.contains(&HTTP_RBAC.to_string()), "{names:?}");
    let out = t
        .update(
            &cache(vec![
                reviews_service(),
                deny("default", "other", json!({"app": "ratings"}), 5),
                deny("default", "reviews", json!({"app": "reviews"}), 6),
            ]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    let names = http_filter_names(&out.listeners["virtualInbound"], chain);
    assert_eq!(names[0], HTTP_RBAC, "{names:?}");

    // A router selected by a policy of the root namespace.
    let gateway = http_gateway("istio-system", "gw", 8080);
    let mut t = Translator::new(crate::testing::router("10.0.0.50"));
    let out = t
        .update(
            &cache(vec![
                gateway,
                deny(
                    "istio-system",
                    "edge",
                    json!({"istio": "ingressgateway"}),
                    7,
                ),
            ]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    let names = http_filter_names(&out.listeners["0.0.0.0_8080"], "");
    assert_eq!(names[0], HTTP_RBAC, "{names:?}");

    // A Gateway API gateway's pods: a policy attached to their Gateway by targetRef applies,
    // one attached to another Gateway does not.
    let targeted = |name: &str, gateway: &str, revision: u64| {
        resource(
            "AuthorizationPolicy",
            "istio-system",
            name,
            json!({"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                   "name": gateway}],
                   "action": "DENY", "rules": [{"to": [{"operation": {"paths": ["/admin"]}}]}]}),
            revision,
        )
    };
    let mut router = crate::testing::router("10.0.0.50");
    router.labels.insert(
        pasa_istio::authorization_policy::GATEWAY_NAME_LABEL.into(),
        "web".into(),
    );
    let filters = |policy: Resource| {
        let out = Translator::new(router.clone())
            .update(
                &cache(vec![http_gateway("istio-system", "gw", 8080), policy]),
                Generator::Envoy,
            )
            .expect("decodes what it encoded");
        http_filter_names(&out.listeners["0.0.0.0_8080"], "")
    };
    let names = filters(targeted("for-web", "web", 8));
    assert_eq!(names[0], HTTP_RBAC, "{names:?}");
    let names = filters(targeted("for-api", "api", 9));
    assert!(!names.contains(&HTTP_RBAC.to_string()), "{names:?}");
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

/// Mutual TLS pins a service to its service accounts' identities in the mesh's trust domain
/// (`cluster.local` unless the mesh config names another) and its aliases, as istiod does; a
/// changed trust domain rebuilds the clusters.
#[test]
fn mutual_tls_pins_identities_in_the_meshs_trust_domain() {
    use envoy_types::pb::envoy::config::core::v3::transport_socket;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        UpstreamTlsContext, common_tls_context::ValidationContextType,
    };
    use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher;
    let (service, rule) = mutual_reviews();
    let mesh = |spec: Value| resource("MeshConfig", "istio-system", "mesh", spec, 3);
    let pinned = |out: &crate::resource::Resources| -> Vec<String> {
        let cluster = &out.clusters[&format!("outbound|9080||{REVIEWS}")];
        let socket = cluster.transport_socket.as_ref().expect("ISTIO_MUTUAL");
        let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
            panic!("typed config");
        };
        let context = UpstreamTlsContext::decode(any.value.as_slice()).unwrap();
        let Some(ValidationContextType::CombinedValidationContext(combined)) =
            context.common_tls_context.unwrap().validation_context_type
        else {
            panic!("a combined validation context");
        };
        #[allow(deprecated)]
        combined
            .default_validation_context
            .unwrap()
            .match_subject_alt_names
            .into_iter()
            .filter_map(|m| match m.match_pattern {
                Some(string_matcher::MatchPattern::Exact(e)) => Some(e),
                _ => None,
            })
            .collect()
    };
    let mut translator = Translator::new(proxy("10.0.0.9"));
    let out = translator
        .update(
            &cache(vec![service.clone(), rule.clone()]),
            Generator::Envoy,
        )
        .unwrap();
    assert_eq!(
        pinned(&out),
        ["spiffe://cluster.local/ns/default/sa/bookinfo-reviews"]
    );
    let out = translator
        .update(
            &cache(vec![
                service.clone(),
                rule.clone(),
                mesh(json!({"trustDomain": "example.org"})),
            ]),
            Generator::Envoy,
        )
        .unwrap();
    assert_eq!(
        pinned(&out),
        ["spiffe://example.org/ns/default/sa/bookinfo-reviews"]
    );
    // Its aliases too, as istiod expands them.
    let out = translator
        .update(
            &cache(vec![
                service,
                rule,
                mesh(json!({"trustDomain": "example.org", "trustDomainAliases": ["old.example"]})),
            ]),
            Generator::Envoy,
        )
        .unwrap();
    assert_eq!(
        pinned(&out),
        [
            "spiffe://example.org/ns/default/sa/bookinfo-reviews",
            "spiffe://old.example/ns/default/sa/bookinfo-reviews"
        ]
    );
}

#[test]
fn the_rule_of_a_service_the_workload_serves_limits_its_inbound_cluster_too() {
    let limited = |revision: u64| {
        resource(
            "DestinationRule",
            "default",
            "reviews",
            json!({"host": "reviews", "trafficPolicy": {"connectionPool": {
                "tcp": {"maxConnections": 7}, "http": {"http2MaxRequests": 9}}}}),
            revision,
        )
    };
    let mut t = Translator::new(reviews_workload());
    let out = t
        .update(&cache(vec![reviews_service()]), Generator::Envoy)
        .expect("decodes what it encoded");
    let thresholds = |out: &crate::resource::Resources| {
        out.clusters["inbound|9080||"]
            .circuit_breakers
            .clone()
            .unwrap()
            .thresholds[0]
    };
    assert_eq!(
        thresholds(&out).max_connections.map(|v| v.value),
        Some(u32::MAX)
    );
    // The rule arrives later: the inbound cluster follows it (server-side, as istiod).
    let out = t
        .update(
            &cache(vec![reviews_service(), limited(5)]),
            Generator::Envoy,
        )
        .expect("decodes what it encoded");
    let limits = thresholds(&out);
    assert_eq!(limits.max_connections.map(|v| v.value), Some(7));
    assert_eq!(limits.max_requests.map(|v| v.value), Some(9));
}
