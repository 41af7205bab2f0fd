//! What a proxy subscribes to: a router follows the Gateways that apply to it; a sidecar its
//! namespace's and the root's policies.

use std::collections::BTreeMap;

use pasa_proto::store::v1::{Resource, Rule};
use serde_json::{Value, json};

use super::*;
use crate::testing::resource;

fn router() -> Proxy {
    crate::testing::router("10.0.0.50")
}

fn subscription_for(resources: Vec<Resource>) -> Vec<Rule> {
    subscription(&router(), &Cache::from_resources(resources, 100)).rules
}

/// The service that fronts the router pod: port 443 to 8443, endpoint the router's address.
fn router_service(namespace: &str, host: &str) -> Resource {
    resource(
        "ServiceEntry",
        namespace,
        "ingress",
        json!({"hosts": [host], "ports": [{"number": 443, "targetPort": 8443, "name": "tls",
               "protocol": "TLS"}], "resolution": "STATIC",
               "endpoints": [{"address": "10.0.0.50"}]}),
        1,
    )
}

fn gateway(name: &str, annotation: Option<&str>, servers: Value, revision: u64) -> Resource {
    let mut r = resource(
        "Gateway",
        "istio-system",
        name,
        json!({"servers": servers}),
        revision,
    );
    if let Some(hosts) = annotation {
        r.annotations = BTreeMap::from([(
            "internal.istio.io/gateway-service".to_string(),
            hosts.to_string(),
        )])
        .into_iter()
        .collect();
    }
    r
}

fn rule_with(rules: &[Rule], kind: &str, pred: impl Fn(&Rule) -> bool) -> bool {
    rules
        .iter()
        .any(|r| r.kinds.iter().any(|k| k == kind) && pred(r))
}

#[test]
fn a_router_subscribes_to_its_own_services_and_the_ones_gateways_are_bound_to() {
    let host = "ingress.other.svc.cluster.local";
    let rules = subscription_for(vec![
        router_service("other", host),
        gateway(
            "bound",
            Some(host),
            json!([{"port": {"number": 443, "name": "tls", "protocol": "TLS"},
                    "hosts": ["*.example.com"], "tls": {"mode": "PASSTHROUGH"}}]),
            2,
        ),
    ]);
    // Its namespace's services decide the ports it listens on.
    assert!(rule_with(&rules, "ServiceEndpoints", |r| r.namespaces
        == ["istio-system"]
        && r.hosts.is_empty()));
    // The services a Gateway names, in the Gateway's namespace.
    assert!(rule_with(&rules, "ServiceEntry", |r| r.namespaces
        == ["istio-system"]
        && r.hosts == [host]));
    // The service lives in another namespace than the Gateway: the Gateway does not apply, so no
    // VirtualService of it is asked for.
    assert!(!rule_with(&rules, "VirtualService", |_| true));
}

#[test]
fn a_gateway_bound_to_the_routers_service_brings_its_virtual_services_and_sni_dnat_hosts() {
    let host = "ingress.istio-system.svc.cluster.local";
    let vs = resource(
        "VirtualService",
        "default",
        "tls",
        json!({"hosts": ["a.example.com"], "gateways": ["istio-system/bound"],
               "tls": [{"match": [{"sniHosts": ["a.example.com"]}],
                        "route": [{"destination": {"host": "a"}}]}]}),
        3,
    );
    let rules = subscription_for(vec![
        router_service("istio-system", host),
        gateway(
            "bound",
            Some(host),
            json!([
                {"port": {"number": 443, "name": "tls", "protocol": "TLS"},
                 "hosts": ["*.example.com"], "tls": {"mode": "PASSTHROUGH"}},
                {"port": {"number": 443, "name": "mesh", "protocol": "TLS"},
                 "hosts": ["*.local"], "tls": {"mode": "AUTO_PASSTHROUGH"}}]),
            2,
        ),
        vs,
    ]);
    assert!(rule_with(&rules, "VirtualService", |r| r.gateways
        == ["istio-system/bound"]));
    // The TLS route's destination and every service SNI-DNAT may reach, with their rules.
    assert!(rule_with(&rules, "DestinationRule", |r| {
        r.hosts.iter().any(|h| h == "a.default.svc.cluster.local")
            && r.hosts.iter().any(|h| h == "*.local")
    }));
}

#[test]
fn a_gateway_selecting_other_routers_brings_nothing_but_gateways_and_own_services() {
    let mut other = gateway(
        "other",
        None,
        json!([{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]),
        2,
    );
    other.spec_json = json!({"selector": {"istio": "egressgateway"}, "servers": [
        {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]})
    .to_string();
    let rules = subscription_for(vec![other]);
    assert_eq!(rules.len(), 5, "{rules:?}");
    assert!(rule_with(&rules, "Gateway", |r| r.namespaces.is_empty()));
    // Every network gateway, by the one value the store indexes them under.
    assert!(rule_with(&rules, "ServiceEndpoints", |r| r.gateways
        == [pasa_istio::service_endpoints::NETWORK_GATEWAYS_INDEX]
        && r.hosts.is_empty()
        && r.namespaces.is_empty()));
    // The PeerAuthentications of every namespace: whether a destination's port takes mutual
    // TLS.
    assert!(rule_with(&rules, "PeerAuthentication", |r| r
        .namespaces
        .is_empty()));
    // The router's own AuthorizationPolicies: its namespace's (here the root namespace too).
    assert!(rule_with(&rules, "AuthorizationPolicy", |r| r.namespaces
        == ["istio-system"]));
}

#[test]
fn a_sidecar_subscribes_to_the_peer_authentications_of_its_namespace_and_the_root() {
    let proxy = crate::testing::sidecar("10.0.0.9");
    let rules = subscription(&proxy, &Cache::default()).rules;
    let namespaces = |kind: &str| -> Vec<String> {
        rules
            .iter()
            .filter(|r| r.kinds.iter().any(|k| k == kind))
            .flat_map(|r| r.namespaces.clone())
            .collect()
    };
    assert_eq!(
        namespaces("PeerAuthentication"),
        ["default", "istio-system"]
    );
    assert_eq!(
        namespaces("AuthorizationPolicy"),
        ["default", "istio-system"]
    );
    assert_eq!(namespaces("EnvoyFilter"), ["default", "istio-system"]);
    assert!(rule_with(&rules, "Sidecar", |r| !r.namespaces.is_empty()));
}

/// A sidecar that has seen nothing asks only for what decides its scope; once the store has
/// answered that (here: no Sidecar, Istio's default), it asks for what that scope sees.
#[test]
fn a_fresh_sidecar_asks_for_its_scope_first_then_for_what_it_sees() {
    let proxy = crate::testing::sidecar("10.0.0.9");
    let fresh = subscription(&proxy, &Cache::default()).rules;
    assert_eq!(fresh.len(), 1, "{fresh:?}");
    assert_eq!(
        fresh[0].kinds,
        [
            "Sidecar",
            "PeerAuthentication",
            "AuthorizationPolicy",
            "RequestAuthentication",
            "EnvoyFilter",
            "Telemetry",
            "WasmPlugin",
            "TrafficExtension",
            "ImagePullSecret",
            "MeshConfig",
            "JsonWebKeySet"
        ]
    );
    let mut answered = Cache::default();
    answered.set_answered(std::sync::Arc::new(Subscription {
        rules: fresh.clone(),
    }));
    let widened = subscription(&proxy, &answered).rules;
    let shared = Rule {
        kinds: pasa_proto::Kind::shared()
            .map(|k| k.as_str().to_string())
            .collect(),
        ..Default::default()
    };
    assert!(
        widened.contains(&shared),
        "no Sidecar: everything exported to the namespace: {widened:?}"
    );
    // It may send to any namespace: the PeerAuthentications of all of them.
    assert!(rule_with(&widened, "PeerAuthentication", |r| r
        .namespaces
        .is_empty()));
    assert!(
        !shared
            .kinds
            .iter()
            .any(|k| k == "AuthorizationPolicy" || k == "Sidecar"),
        "other namespaces' policies are not asked for: {shared:?}"
    );
    // A router's rules come from the Gateways it sees, not from Sidecars.
    assert!(subscription(&router(), &Cache::default()).rules.len() > 1);
}

#[test]
fn egress_to_a_whole_namespace_asks_for_the_destination_rules_of_its_services_only() {
    let proxy = crate::testing::sidecar("10.0.0.9");
    let service = |ns: &str, name: &str| {
        resource(
            "ServiceEndpoints",
            ns,
            name,
            json!({"addresses": ["10.96.0.1"], "ports": [{"name": "http", "port": 80}]}),
            1,
        )
    };
    let cache = Cache::from_resources(
        vec![
            resource(
                "Sidecar",
                "default",
                "default",
                json!({"egress": [{"hosts": ["./*", "istio-system/*", "shop/cart.shop.svc.cluster.local"]}]}),
                1,
            ),
            service("default", "web"),
            service("istio-system", "istiod"),
            service("elsewhere", "db"),
        ],
        10,
    );
    let rules = subscription(&proxy, &cache).rules;
    let dr: Vec<&Rule> = rules
        .iter()
        .filter(|r| r.kinds.iter().any(|k| k == "DestinationRule"))
        .collect();
    assert_eq!(dr.len(), 1, "{rules:?}");
    let hosts: Vec<&str> = dr[0].hosts.iter().map(String::as_str).collect();
    // Not every rule of the mesh: the namespaces' services, and the host egress names.
    assert!(!hosts.contains(&"*"), "{hosts:?}");
    for host in [
        "web.default.svc.cluster.local",
        "istiod.istio-system.svc.cluster.local",
        "cart.shop.svc.cluster.local",
    ] {
        assert!(hosts.contains(&host), "{host} missing from {hosts:?}");
    }
    assert!(
        !hosts.contains(&"db.elsewhere.svc.cluster.local"),
        "{hosts:?}"
    );
}

/// An on-demand sidecar that has learned nothing asks for its own namespace's and the root's
/// policies, its namespace's services (inbound) and the network gateways, and for nothing
/// else: every rule is held to a namespace, a host or the gateways. A learned host brings its
/// service, VirtualServices and DestinationRules, the PeerAuthentications of its namespace, and
/// what its VirtualService routes to; a host a Sidecar does not import stays out.
#[test]
fn an_on_demand_sidecar_asks_for_what_it_learned_and_nothing_else() {
    const REVIEWS: &str = "reviews.bookinfo.svc.cluster.local";
    const RATINGS: &str = "ratings.bookinfo.svc.cluster.local";
    let proxy = crate::testing::sidecar("10.0.0.9");
    let service = |name: &str, rev: u64| {
        resource(
            "ServiceEndpoints",
            "bookinfo",
            name,
            json!({"addresses": [format!("10.96.0.{rev}")], "ports": [{"name": "http", "port": 9080}]}),
            rev,
        )
    };
    let routes = resource(
        "VirtualService",
        "bookinfo",
        "reviews",
        json!({"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "ratings"}}]}]}),
        3,
    );
    let mut registry = Registry::default();
    let cache = Cache::from_resources(
        vec![service("reviews", 1), service("ratings", 2), routes],
        10,
    );
    registry.update(&cache, "cluster.local");
    let bounded =
        |r: &Rule| !r.namespaces.is_empty() || !r.hosts.is_empty() || !r.gateways.is_empty();

    let learning = |hosts: &[&str]| Proxy {
        learned: Some(Arc::new(hosts.iter().map(|h| h.to_string()).collect())),
        ..proxy.clone()
    };
    let nothing = subscription_of(&learning(&[]), &registry).rules;
    assert!(nothing.iter().all(bounded), "{nothing:#?}");
    assert!(
        !rule_with(&nothing, "DestinationRule", |_| true),
        "{nothing:#?}"
    );

    let rules = subscription_of(&learning(&[REVIEWS]), &registry).rules;
    assert!(rules.iter().all(bounded), "{rules:#?}");
    let for_host =
        |kind: &str, host: &str| rule_with(&rules, kind, |r| r.hosts.iter().any(|h| h == host));
    assert!(for_host("ServiceEndpoints", REVIEWS) && for_host("VirtualService", REVIEWS));
    assert!(for_host("DestinationRule", REVIEWS));
    // What the VirtualService routes to: its service and rules, for its cluster.
    assert!(
        for_host("ServiceEndpoints", RATINGS) && for_host("DestinationRule", RATINGS),
        "{rules:#?}"
    );
    assert!(rule_with(&rules, "PeerAuthentication", |r| r.namespaces
        == ["bookinfo"]));

    // A Sidecar importing only its own namespace: bookinfo's reviews is not the proxy's to see.
    let sidecar = resource(
        "Sidecar",
        "default",
        "default",
        json!({"egress": [{"hosts": ["./*"]}]}),
        4,
    );
    let cache = Cache::from_resources(
        vec![service("reviews", 1), service("ratings", 2), sidecar],
        10,
    );
    let mut registry = Registry::default();
    registry.update(&cache, "cluster.local");
    let scope = SidecarScope::of(&learning(&[REVIEWS]), &registry);
    assert!(scope.services(&registry).is_empty(), "{:?}", scope.egress);
}

/// A proxy that learned thousands of hosts (an aggregator calling hundreds of services, each
/// spelling learning the names a resolver would try) subscribes with a few rules the store
/// accepts, its hosts in lists: the store refuses a subscription of more than
/// `MAX_RULES` rules, and the proxy's scope would stop widening.
#[test]
fn learned_hosts_are_asked_for_in_lists_within_the_stores_bounds() {
    let proxy = crate::testing::sidecar("10.0.0.9");
    let hosts: Vec<String> = (0..3000)
        .map(|i| format!("svc-{i}.ns-{}.svc.cluster.local", i % 100))
        .collect();
    let services: Vec<Resource> = hosts
        .iter()
        .take(300)
        .enumerate()
        .map(|(i, h)| {
            let (name, rest) = h.split_once('.').unwrap();
            let namespace = rest.split('.').next().unwrap();
            resource(
                "ServiceEndpoints",
                namespace,
                name,
                json!({"addresses": [format!("10.96.{}.{}", i / 256, i % 256)],
                       "ports": [{"name": "http", "port": 80}]}),
                i as u64 + 1,
            )
        })
        .collect();
    let mut registry = Registry::default();
    registry.update(&Cache::from_resources(services, 1000), "cluster.local");
    let learned = Proxy {
        learned: Some(Arc::new(hosts.iter().cloned().collect())),
        ..proxy
    };
    let subscription = subscription_of(&learned, &registry);
    assert!(
        subscription.rules.len() < 20,
        "{}",
        subscription.rules.len()
    );
    pasa_store::selector::Selector::from_pb(&subscription)
        .expect("the store takes the subscription");
    // Every learned host is still asked for: its service, routes and rules.
    for host in &hosts {
        for kind in ["ServiceEndpoints", "VirtualService", "DestinationRule"] {
            assert!(
                rule_with(&subscription.rules, kind, |r| r.hosts.contains(host)),
                "{kind} of {host}"
            );
        }
    }
}
