//! Clusters and their load assignments through the translator: endpoint health, persistent
//! sessions' draining endpoints, consistent hashing, subsets' shared policy, mutual TLS's pinned
//! identities, and the rule an inbound cluster takes.

use envoy_types::pb::envoy::config::cluster::v3::cluster::LbPolicy;
use prost::Message;
use serde_json::{Value, json};

use crate::testing::resource;

use super::tests::{
    REVIEWS, cache, hcm_of, http_filter_names, mutual_reviews, proxy, reviews_rule,
    reviews_service, reviews_workload, route_action, vhost,
};
use super::*;

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
