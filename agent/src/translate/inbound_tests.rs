//! A workload's inbound side through the translator: its clusters and `virtualInbound` chains,
//! shaped per port by PeerAuthentication, and authorization's RBAC filters first on them (and on
//! routers).

use pasa_proto::store::v1::Resource;
use serde_json::{Value, json};

use crate::testing::resource;

use super::authz::HTTP_RBAC;
use super::tests::{cache, http_filter_names, http_gateway, proxy, reviews_service};
use super::*;

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
