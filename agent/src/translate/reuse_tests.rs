//! What an update of the translator rebuilds and what it reuses: a DestinationRule, a
//! VirtualService or an endpoint change rebuilds only what reads it.

use envoy_types::pb::envoy::config::cluster::v3::cluster::LbPolicy;
use pasa_proto::store::v1::Resource;
use serde_json::{Value, json};

use crate::testing::resource;

use super::tests::{REVIEWS, cache, proxy, reviews_rule, reviews_service, reviews_split};
use super::*;

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
