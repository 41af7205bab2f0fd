//! Gateways with the real binary: a `router~` agent subscribes to the Gateways that select its
//! pod, the VirtualServices bound to them and their destinations — nothing else of the mesh — and
//! follows bindings as they change; Envoy-style ADS clients (SotW and Delta) get the gateway's
//! listeners, routes, clusters and endpoints.

mod common;

use common::agent::{Agent, served};
use common::store::StoreServer;
use common::{CDS, EDS, FakeDeltaClient, FakeSotwClient, LDS, RDS, names};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::route::v3::{
    RouteConfiguration, route, route_action, route_match,
};
use prost::Message;
use serde_json::{Value, json};

const ROUTER: &str = "router~10.1.0.9~istio-ingressgateway-5d4c8f7b9-qx2lm.istio-system~istio-system.svc.cluster.local";
const LABELS: &str = "istio=ingressgateway,app=istio-ingressgateway";

const PRODUCTPAGE: &str = "outbound|9080||productpage.default.svc.cluster.local";
const REVIEWS: &str = "outbound|9080||reviews.default.svc.cluster.local";
const CART: &str = "outbound|8080||cart.shop.svc.cluster.local";

fn service(name: &str, namespace: &str, port: u32, endpoint: &str) -> Value {
    json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
           "metadata": {"name": name, "namespace": namespace},
           "spec": {"addresses": ["10.96.1.1"], "ports": [{"name": "http", "port": port}],
                    "endpoints": [{"address": endpoint}]}})
}

fn gateway(name: &str, selector: &str) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"selector": {"istio": selector},
                    "servers": [{"port": {"number": 8080, "name": "http", "protocol": "HTTP"},
                                 "hosts": ["*"]}]}})
}

/// The `bookinfo` VirtualService bound to `gateway`, sending `/productpage` to productpage and,
/// when `cart` is set, `/cart` to the shop's cart service.
fn bookinfo(gateway: &str, cart: bool) -> Value {
    let mut http = vec![json!({"match": [{"uri": {"exact": "/productpage"}}],
                               "route": [{"destination": {"host": "productpage",
                                                          "port": {"number": 9080}}}]})];
    if cart {
        http.push(json!({"match": [{"uri": {"prefix": "/cart"}}],
                         "route": [{"destination": {"host": "cart.shop.svc.cluster.local"}}]}));
    }
    json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
           "metadata": {"name": "bookinfo", "namespace": "default"},
           "spec": {"hosts": ["*"], "gateways": [gateway], "http": http}})
}

/// The mesh: three services, the ingress Gateway and one for an egress gateway (which the
/// ingress must not hear of), a sidecar-only VirtualService for reviews.
fn mesh() -> Vec<Value> {
    vec![
        service("productpage", "default", 9080, "10.1.1.1"),
        service("reviews", "default", 9080, "10.1.1.2"),
        service("cart", "shop", 8080, "10.1.2.1"),
        gateway("bookinfo-gateway", "ingressgateway"),
        gateway("egress", "egressgateway"),
        bookinfo("bookinfo-gateway", false),
        json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
               "metadata": {"name": "reviews", "namespace": "default"},
               "spec": {"hosts": ["reviews"],
                        "http": [{"route": [{"destination": {"host": "reviews"}}]}]}}),
    ]
}

/// `Kind namespace/name` of every object in the agent's saved cache.
fn saved(cache_dir: &std::path::Path) -> Vec<String> {
    let bytes = std::fs::read(cache_dir.join("snapshot.pb")).unwrap_or_default();
    let saved = pasa_proto::store::v1::ListResponse::decode(bytes.as_slice()).unwrap();
    let mut objects: Vec<String> = saved
        .resources
        .into_iter()
        .map(|r| format!("{} {}/{}", r.kind, r.namespace, r.name))
        .collect();
    objects.sort();
    objects
}

async fn until_saved(cache_dir: &std::path::Path, what: &str, ok: impl Fn(&[String]) -> bool) {
    let deadline = tokio::time::Instant::now() + common::agent::WAIT;
    loop {
        let objects = saved(cache_dir);
        if ok(&objects) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for the saved cache to hold {what}; it holds {objects:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

fn start_router(store: &StoreServer, run: &std::path::Path, cache: &std::path::Path) -> Agent {
    Agent::start_with(ROUTER, store.addr, run, cache, &["--labels", LABELS])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_subscribes_to_its_gateways_bound_routes_and_their_destinations() {
    let (data, run, cache) = (tempdir(), tempdir(), tempdir());
    let store = StoreServer::start(data.path(), 0).await;
    store.apply(&mesh()).await;
    let agent = start_router(&store, run.path(), cache.path());

    let dump = agent
        .until("/config_dump", "the gateway's listener", |_, b| {
            served(b, "LDS") == ["0.0.0.0_8080"]
                && served(b, "CDS").iter().any(|c| c == PRODUCTPAGE)
        })
        .await;
    assert_eq!(served(&dump, "RDS"), ["http.8080"]);
    let clusters = served(&dump, "CDS");
    assert!(
        !clusters.iter().any(|c| c == REVIEWS || c == CART),
        "only the routes' destinations: {clusters:?}"
    );
    // What the store sent: its Gateways, the VirtualService bound to them, its destination. The
    // sidecar-only VirtualService and the services nothing routes to stay out.
    until_saved(cache.path(), "the router's scope", |objects| {
        objects.contains(&"VirtualService default/bookinfo".to_string())
            && objects.contains(&"ServiceEndpoints default/productpage".to_string())
    })
    .await;
    let objects = saved(cache.path());
    for outside in [
        "VirtualService default/reviews",
        "ServiceEndpoints default/reviews",
        "ServiceEndpoints shop/cart",
    ] {
        assert!(
            !objects.contains(&outside.to_string()),
            "{outside} is outside the router's scope, yet it holds {objects:?}"
        );
    }

    // A new destination on a bound route widens the scope to it.
    store.apply(&[bookinfo("bookinfo-gateway", true)]).await;
    agent
        .until("/config_dump", "the cart cluster", |_, b| {
            served(b, "CDS").iter().any(|c| c == CART)
        })
        .await;
    until_saved(cache.path(), "the cart service", |objects| {
        objects.contains(&"ServiceEndpoints shop/cart".to_string())
    })
    .await;

    // Bound to the egress gateway instead: the routes leave the ingress, and so do their
    // destinations.
    store.apply(&[bookinfo("egress", true)]).await;
    let dump = agent
        .until("/config_dump", "the destinations gone", |_, b| {
            let clusters = served(b, "CDS");
            !clusters.iter().any(|c| c == CART || c == PRODUCTPAGE)
        })
        .await;
    assert_eq!(
        served(&dump, "LDS"),
        ["0.0.0.0_8080"],
        "the server stays, without routes"
    );
    until_saved(cache.path(), "no destinations", |objects| {
        !objects.iter().any(|o| o.starts_with("ServiceEndpoints"))
            && !objects.contains(&"VirtualService default/bookinfo".to_string())
    })
    .await;
    agent.terminate();
    store.stop().await;
}

fn router_node() -> Node {
    Node {
        id: ROUTER.into(),
        ..Default::default()
    }
}

fn route_config(any: &envoy_types::pb::google::protobuf::Any) -> RouteConfiguration {
    RouteConfiguration::decode(any.value.as_slice()).unwrap()
}

/// `(path, cluster)` of each route of the route configuration.
fn routes_of(config: &RouteConfiguration) -> Vec<(String, String)> {
    config
        .virtual_hosts
        .iter()
        .flat_map(|vh| vh.routes.iter())
        .map(|r| {
            let path = match r.r#match.as_ref().and_then(|m| m.path_specifier.as_ref()) {
                Some(route_match::PathSpecifier::Path(p)) => p.clone(),
                Some(route_match::PathSpecifier::Prefix(p)) => format!("{p}*"),
                _ => String::new(),
            };
            let cluster = match &r.action {
                Some(route::Action::Route(a)) => match &a.cluster_specifier {
                    Some(route_action::ClusterSpecifier::Cluster(c)) => c.clone(),
                    _ => String::new(),
                },
                _ => String::new(),
            };
            (path, cluster)
        })
        .collect()
}

/// An Envoy gateway over SotW: CDS and LDS as wildcards, then EDS and RDS for what they name,
/// each ACKed; a route change applied to the store reaches it as an RDS push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_gateway_over_sotw_gets_listeners_routes_clusters_and_endpoints() {
    let (data, run, cache) = (tempdir(), tempdir(), tempdir());
    let store = StoreServer::start(data.path(), 0).await;
    store.apply(&mesh()).await;
    let agent = start_router(&store, run.path(), cache.path());
    agent
        .until("/config_dump", "the gateway's clusters", |_, b| {
            served(b, "CDS").iter().any(|c| c == PRODUCTPAGE)
        })
        .await;

    let mut envoy = FakeSotwClient::connect(&agent.uds, router_node()).await;
    envoy.request(CDS, &[], "", "").await;
    let cds = envoy.recv().await;
    assert!(
        names(&cds).contains(&PRODUCTPAGE.to_string()),
        "{:?}",
        names(&cds)
    );
    envoy.ack(&cds, &[]).await;
    envoy.request(EDS, &[PRODUCTPAGE], "", "").await;
    let eds = envoy.recv().await;
    assert_eq!(names(&eds), [PRODUCTPAGE]);
    envoy.ack(&eds, &[PRODUCTPAGE]).await;
    envoy.request(LDS, &[], "", "").await;
    let lds = envoy.recv().await;
    assert_eq!(names(&lds), ["0.0.0.0_8080"]);
    envoy.ack(&lds, &[]).await;
    envoy.request(RDS, &["http.8080"], "", "").await;
    let rds = envoy.recv().await;
    assert_eq!(names(&rds), ["http.8080"]);
    assert_eq!(
        routes_of(&route_config(&rds.resources[0])),
        [("/productpage".to_string(), PRODUCTPAGE.to_string())]
    );
    envoy.ack(&rds, &["http.8080"]).await;
    agent
        .until("/readyz", "the gateway ready", |code, _| code == 200)
        .await;

    // A new route: CDS first (the new cluster), then the route configuration naming it.
    store.apply(&[bookinfo("bookinfo-gateway", true)]).await;
    let mut pushed = Vec::new();
    loop {
        let response = envoy.recv().await;
        let kind = common::kind_of(&response.type_url);
        pushed.push(kind);
        if kind == RDS {
            assert_eq!(
                routes_of(&route_config(&response.resources[0])),
                [
                    ("/productpage".to_string(), PRODUCTPAGE.to_string()),
                    ("/cart*".to_string(), CART.to_string()),
                ]
            );
            break;
        }
        let names_now = match kind {
            k if k == EDS => vec![PRODUCTPAGE],
            k if k == RDS => vec!["http.8080"],
            _ => vec![],
        };
        envoy.ack(&response, &names_now).await;
    }
    assert_eq!(
        pushed.first(),
        Some(&CDS),
        "the new cluster before the route: {pushed:?}"
    );
    agent.terminate();
    store.stop().await;
}

/// An Envoy gateway over Delta: wildcard CDS and LDS, then EDS and RDS by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_gateway_over_delta_gets_listeners_routes_clusters_and_endpoints() {
    let (data, run, cache) = (tempdir(), tempdir(), tempdir());
    let store = StoreServer::start(data.path(), 0).await;
    store.apply(&mesh()).await;
    let agent = start_router(&store, run.path(), cache.path());
    agent
        .until("/config_dump", "the gateway's clusters", |_, b| {
            served(b, "CDS").iter().any(|c| c == PRODUCTPAGE)
        })
        .await;

    let mut envoy = FakeDeltaClient::connect(&agent.uds, router_node()).await;
    envoy.subscribe(CDS, &[], &[]).await;
    let cds = envoy.recv().await;
    let clusters: Vec<String> = cds.resources.iter().map(|r| r.name.clone()).collect();
    assert!(clusters.contains(&PRODUCTPAGE.to_string()), "{clusters:?}");
    assert!(!clusters.contains(&CART.to_string()), "{clusters:?}");
    envoy.ack(&cds).await;
    envoy.subscribe(EDS, &[PRODUCTPAGE], &[]).await;
    let eds = envoy.recv().await;
    assert_eq!(eds.resources.len(), 1);
    assert_eq!(eds.resources[0].name, PRODUCTPAGE);
    envoy.ack(&eds).await;
    envoy.subscribe(LDS, &[], &[]).await;
    let lds = envoy.recv().await;
    let listeners: Vec<&str> = lds.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(listeners, ["0.0.0.0_8080"]);
    envoy.ack(&lds).await;
    envoy.subscribe(RDS, &["http.8080"], &[]).await;
    let rds = envoy.recv().await;
    assert_eq!(rds.resources.len(), 1);
    let body = rds.resources[0].resource.as_ref().expect("a route body");
    assert_eq!(
        routes_of(&route_config(body)),
        [("/productpage".to_string(), PRODUCTPAGE.to_string())]
    );
    envoy.ack(&rds).await;
    agent
        .until("/readyz", "the gateway ready", |code, _| code == 200)
        .await;
    agent.terminate();
    store.stop().await;
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}
