//! Istio's samples (Bookinfo, helloworld, httpbin from the conformance corpus) translate cleanly,
//! and the resources generated for Bookinfo are pinned by snapshots, as protobuf JSON.
//!
//! The corpus is read at run time from `../shared/conformance` beside the workspace
//! (`PASA_CONFORMANCE_DIR` overrides it); without it the tests say loudly that they skipped.
//!
//! Kubernetes objects of the samples become the store's `ServiceEndpoints`: each Service gets a
//! virtual IP `10.96.0.<n>` and one endpoint `10.1.<n>.<m>` per Deployment its selector matches,
//! with the Deployment's pod labels (numbered in file order, so the snapshots are stable).

mod common;

use std::collections::BTreeMap;

use common::samples::{self, corpus, to_store};
use pasa_testing::yaml_docs;

use envoy_types::pb::google::protobuf::Any;
use pasa_agent::cache::Cache;
use pasa_agent::model::proxy::{Generator, Proxy};
use pasa_agent::resource::Resources;
use pasa_agent::translate::Translator;
use serde_json::{Value, json};

fn proxy(node_id: &str) -> Proxy {
    proxy_with_labels(node_id, "")
}

fn proxy_with_labels(node_id: &str, labels: &str) -> Proxy {
    samples::proxy(node_id, labels)
}

/// A resource as protobuf JSON with `Any` resolved (pasactl's Envoy descriptors).
fn to_json(any: &Any) -> Value {
    pasactl::envoy_json::to_json("", any).unwrap_or_else(|e| panic!("{e}"))
}

/// All generated resources as JSON, by type and name.
fn dump(resources: &Resources) -> Value {
    fn by_name<T: prost::Name + prost::Message + Clone>(m: &BTreeMap<String, T>) -> Value {
        m.iter()
            .map(|(name, r)| {
                (
                    name.clone(),
                    to_json(&envoy_types::util::pack_any(r.clone())),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
    json!({
        "clusters": by_name(&resources.clusters),
        "endpoints": by_name(&resources.endpoints),
        "listeners": by_name(&resources.listeners),
        "routes": by_name(&resources.routes),
    })
}

/// Every reference resolves: RDS names, EDS service names, route and TCP proxy targets.
fn check_references(resources: &Resources, what: &str) {
    let dump = dump(resources);
    let mut referenced_clusters = Vec::new();
    let mut referenced_routes = Vec::new();
    fn walk(v: &Value, clusters: &mut Vec<String>, routes: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("cluster", Value::String(s)) => clusters.push(s.clone()),
                        ("routeConfigName", Value::String(s)) => routes.push(s.clone()),
                        ("clusters", Value::Array(list)) => {
                            for c in list {
                                if let Some(name) = c["name"].as_str() {
                                    clusters.push(name.to_string());
                                }
                            }
                        }
                        _ => walk(v, clusters, routes),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, clusters, routes)),
            _ => {}
        }
    }
    walk(
        &dump["listeners"],
        &mut referenced_clusters,
        &mut referenced_routes,
    );
    walk(
        &dump["routes"],
        &mut referenced_clusters,
        &mut referenced_routes,
    );
    for c in referenced_clusters {
        assert!(
            resources.clusters.contains_key(&c),
            "{what}: cluster {c} is referenced but not generated"
        );
    }
    for r in referenced_routes {
        assert!(
            resources.routes.contains_key(&r),
            "{what}: route config {r} is referenced but not generated"
        );
    }
    for c in resources.clusters.values() {
        if let Some(eds) = &c.eds_cluster_config {
            assert!(
                resources.endpoints.contains_key(&eds.service_name),
                "{what}: cluster {} has no load assignment",
                c.name
            );
        }
    }
}

const PRODUCTPAGE: &str =
    "sidecar~10.1.4.1~productpage-v1-6b746f74dc-9stvs.default~default.svc.cluster.local";

#[test]
fn every_sample_translates_cleanly() {
    let Some(corpus) = corpus() else { return };
    let samples = corpus.join("samples");
    let files = samples::files(&samples);
    // Bookinfo's services and subsets, as its guide has them applied before any routing.
    let mut platform = yaml_docs(&samples.join("bookinfo/platform/bookinfo.yaml"));
    platform.extend(yaml_docs(
        &samples.join("bookinfo/networking/destination-rule-all.yaml"),
    ));
    let mut translated = 0;
    for file in &files {
        // Each file on top of Bookinfo, as it would be applied to a mesh.
        let mut docs = platform.clone();
        docs.extend(yaml_docs(file));
        let resources = to_store(&docs);
        let cache = Cache::from_resources(resources, 100);
        for generator in [Generator::Envoy, Generator::Grpc] {
            let mut t = Translator::new(proxy(PRODUCTPAGE));
            let out = t
                .update(&cache, generator)
                .expect("decodes what it encoded");
            assert!(!out.clusters.is_empty(), "{}: no clusters", file.display());
            check_references(&out, &format!("{} ({generator:?})", file.display()));
        }
        translated += 1;
    }
    println!(
        "samples: {translated} of {} files translated cleanly",
        files.len()
    );
    assert_eq!(translated, files.len());
}

fn bookinfo(extra: &[&str]) -> Option<Cache> {
    let corpus = corpus()?;
    let samples = corpus.join("samples/bookinfo");
    let mut docs = yaml_docs(&samples.join("platform/bookinfo.yaml"));
    for f in extra {
        docs.extend(yaml_docs(&samples.join("networking").join(f)));
    }
    Some(Cache::from_resources(to_store(&docs), 100))
}

#[test]
fn bookinfo_reviews_80_20_for_the_productpage_sidecar() {
    let Some(cache) = bookinfo(&[
        "destination-rule-all.yaml",
        "virtual-service-reviews-80-20.yaml",
    ]) else {
        return;
    };
    let out = Translator::new(proxy(PRODUCTPAGE))
        .update(&cache, Generator::Envoy)
        .expect("decodes what it encoded");
    insta::assert_json_snapshot!("bookinfo_productpage_sidecar", dump(&out));
}

#[test]
fn bookinfo_reviews_80_20_for_a_proxyless_grpc_client() {
    let Some(cache) = bookinfo(&[
        "destination-rule-all.yaml",
        "virtual-service-reviews-80-20.yaml",
    ]) else {
        return;
    };
    let out = Translator::new(proxy(PRODUCTPAGE))
        .update(&cache, Generator::Grpc)
        .expect("decodes what it encoded");
    insta::assert_json_snapshot!("bookinfo_productpage_grpc", dump(&out));
}

#[test]
fn bookinfo_fault_injection_and_header_routing() {
    let Some(cache) = bookinfo(&[
        "destination-rule-all.yaml",
        "virtual-service-all-v1.yaml",
        "virtual-service-reviews-jason-v2-v3.yaml",
        "virtual-service-ratings-test-delay.yaml",
    ]) else {
        return;
    };
    let out = Translator::new(proxy(PRODUCTPAGE))
        .update(&cache, Generator::Envoy)
        .expect("decodes what it encoded");
    insta::assert_json_snapshot!("bookinfo_routes_fault_and_headers", dump(&out)["routes"]);
}

const INGRESS_GATEWAY: &str = "router~10.1.0.9~istio-ingressgateway-5d4c8f7b9-qx2lm.istio-system~istio-system.svc.cluster.local";

/// The Bookinfo ingress: `bookinfo-gateway` (port 8080, any host) with the `bookinfo`
/// VirtualService, translated for the ingress gateway pod `istio=ingressgateway` in
/// `istio-system`, with every destination of the routes pinned to v1 by `virtual-service-all-v1`
/// (which binds to the mesh only, so the gateway's routes must not change).
#[test]
fn bookinfo_ingress_gateway() {
    let Some(cache) = bookinfo(&[
        "bookinfo-gateway.yaml",
        "destination-rule-all.yaml",
        "virtual-service-all-v1.yaml",
    ]) else {
        return;
    };
    let router = proxy_with_labels(
        INGRESS_GATEWAY,
        "istio=ingressgateway,app=istio-ingressgateway",
    );
    let out = Translator::new(router)
        .update(&cache, Generator::Envoy)
        .expect("decodes what it encoded");
    check_references(&out, "bookinfo ingress gateway");
    let listeners: Vec<&String> = out.listeners.keys().collect();
    assert_eq!(
        listeners,
        ["0.0.0.0_8080"],
        "one listener for the one server port"
    );
    let routes: Vec<&String> = out.routes.keys().collect();
    assert_eq!(routes, ["http.8080"]);
    insta::assert_json_snapshot!("bookinfo_ingress_gateway", dump(&out));
}

/// The HTTP filters of the sidecar's inbound chains for `port` (every chain of the port has the
/// same), and their names.
fn inbound_http_filters(dump: &Value, port: u16) -> (&Value, Vec<&str>) {
    let inbound = &dump["listeners"]["virtualInbound"];
    let per_chain: Vec<&Value> = inbound["filterChains"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["filterChainMatch"]["destinationPort"] == port)
        .flat_map(|c| c["filters"].as_array().into_iter().flatten())
        .filter(|f| f["name"] == "envoy.filters.network.http_connection_manager")
        .map(|f| &f["typedConfig"]["httpFilters"])
        .collect();
    assert!(
        !per_chain.is_empty(),
        "no inbound chain for {port}: {inbound}"
    );
    assert!(
        per_chain.windows(2).all(|w| w[0] == w[1]),
        "every chain of the port has the same filters"
    );
    let names = per_chain[0]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["name"].as_str())
        .collect();
    (per_chain[0], names)
}

const REVIEWS_V1: &str =
    "sidecar~10.1.3.1~reviews-v1-545db77b95-v44zk.default~default.svc.cluster.local";

/// Bookinfo's reviews with the security policies a production mesh puts on it: mesh-wide mTLS,
/// only productpage may call it (GET), `/admin` denied to everyone, tokens of one issuer checked
/// (keys inline), and `/reviews/0` checked by the mesh's external authorizer. The filters of its
/// inbound HTTP chains for port 9080, in order, are pinned: ext_authz (with its RBAC shadow
/// rules), JWT, then RBAC DENY and ALLOW.
#[test]
fn bookinfo_security_for_the_reviews_sidecar() {
    let Some(corpus) = corpus() else {
        return;
    };
    let samples = corpus.join("samples/bookinfo");
    let mut docs = yaml_docs(&samples.join("platform/bookinfo.yaml"));
    let security = |kind: &str, namespace: &str, name: &str, spec: Value| {
        let api_version = match kind {
            "MeshConfig" => "pasa.io/v1alpha1",
            _ => "security.istio.io/v1",
        };
        json!({"apiVersion": api_version, "kind": kind,
               "metadata": {"name": name, "namespace": namespace}, "spec": spec})
    };
    docs.extend([
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "ext-authz", "namespace": "default"},
               "spec": {"ports": [{"name": "grpc", "port": 9000}], "selector": {"app": "ext-authz"}}}),
        security("MeshConfig", "istio-system", "mesh", json!({
            "trustDomain": "cluster.local",
            "extensionProviders": [{"name": "ext-authz", "envoyExtAuthzGrpc": {
                "service": "ext-authz.default.svc.cluster.local", "port": 9000, "timeout": "0.5s"}}]})),
        security("PeerAuthentication", "istio-system", "default", json!({"mtls": {"mode": "STRICT"}})),
        security("AuthorizationPolicy", "default", "reviews-viewer", json!({
            "selector": {"matchLabels": {"app": "reviews"}},
            "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/default/sa/bookinfo-productpage"]}}],
                       "to": [{"operation": {"methods": ["GET"]}}]}]})),
        security("AuthorizationPolicy", "istio-system", "deny-admin", json!({
            "action": "DENY", "rules": [{"to": [{"operation": {"paths": ["/admin*"]}}]}]})),
        security("AuthorizationPolicy", "default", "reviews-ext", json!({
            "selector": {"matchLabels": {"app": "reviews"}},
            "action": "CUSTOM", "provider": {"name": "ext-authz"},
            "rules": [{"to": [{"operation": {"paths": ["/reviews/0"]}}]}]})),
        security("RequestAuthentication", "default", "reviews-jwt", json!({
            "selector": {"matchLabels": {"app": "reviews"}},
            "jwtRules": [{"issuer": "testing@secure.istio.io",
                          "jwks": "{\"keys\":[{\"kty\":\"EC\",\"crv\":\"P-256\",\"kid\":\"k1\",\"x\":\"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU\",\"y\":\"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0\"}]}",
                          "fromHeaders": [{"name": "x-jwt", "prefix": "Bearer "}]}]})),
    ]);
    let cache = Cache::from_resources(to_store(&docs), 100);
    let out = Translator::new(proxy_with_labels(REVIEWS_V1, "app=reviews,version=v1"))
        .update(&cache, Generator::Envoy)
        .expect("decodes what it encoded");
    check_references(&out, "bookinfo reviews with security policies");
    let dump = dump(&out);
    let (http_filters, names) = inbound_http_filters(&dump, 9080);
    assert_eq!(
        names[..5],
        [
            "envoy.filters.http.rbac",
            "envoy.filters.http.ext_authz",
            "envoy.filters.http.jwt_authn",
            "envoy.filters.http.rbac",
            "envoy.filters.http.rbac",
        ],
        "{names:?}"
    );
    insta::assert_json_snapshot!("bookinfo_reviews_security", http_filters);
}

/// Bookinfo's reviews v1 with the EnvoyFilters a platform team typically writes: a Lua filter
/// before the router of its inbound HTTP chains (its own namespace, selected by `app`), a
/// mesh-wide circuit breaker merged into the outbound clusters of ratings, and a response header
/// merged into the virtual host of ratings on the outbound port. The patched parts are pinned.
#[test]
fn bookinfo_envoy_filters_for_the_reviews_sidecar() {
    let Some(corpus) = corpus() else {
        return;
    };
    let samples = corpus.join("samples/bookinfo");
    let mut docs = yaml_docs(&samples.join("platform/bookinfo.yaml"));
    let filter = |namespace: &str, name: &str, spec: Value| {
        json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter",
               "metadata": {"name": name, "namespace": namespace}, "spec": spec})
    };
    docs.extend([
        filter("default", "reviews-lua", json!({
            "workloadSelector": {"labels": {"app": "reviews"}},
            "configPatches": [{"applyTo": "HTTP_FILTER",
                "match": {"context": "SIDECAR_INBOUND", "listener": {"portNumber": 9080,
                    "filterChain": {"filter": {"name": "envoy.filters.network.http_connection_manager",
                        "subFilter": {"name": "envoy.filters.http.router"}}}}},
                "patch": {"operation": "INSERT_BEFORE", "value": {"name": "envoy.lua",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                        "inlineCode": "function envoy_on_response(h) h:headers():add('x-reviews', 'v1') end"}}}}]})),
        filter("istio-system", "ratings-breaker", json!({
            "configPatches": [{"applyTo": "CLUSTER",
                "match": {"context": "SIDECAR_OUTBOUND", "cluster": {
                    "service": "ratings.default.svc.cluster.local", "portNumber": 9080}},
                "patch": {"operation": "MERGE", "value": {"circuit_breakers": {"thresholds": [
                    {"max_connections": 100, "max_pending_requests": 10}]}}}}]})),
        filter("default", "ratings-header", json!({
            "workloadSelector": {"labels": {"app": "reviews"}},
            "configPatches": [{"applyTo": "VIRTUAL_HOST",
                "match": {"context": "SIDECAR_OUTBOUND", "routeConfiguration": {"portNumber": 9080,
                    "vhost": {"name": "ratings.default.svc.cluster.local:9080"}}},
                "patch": {"operation": "MERGE", "value": {"response_headers_to_add": [
                    {"header": {"key": "x-called-by", "value": "reviews"}}]}}}]})),
    ]);
    let cache = Cache::from_resources(to_store(&docs), 100);
    let out = Translator::new(proxy_with_labels(REVIEWS_V1, "app=reviews,version=v1"))
        .update(&cache, Generator::Envoy)
        .expect("decodes what it encoded");
    check_references(&out, "bookinfo reviews with EnvoyFilters");
    let dump = dump(&out);
    let (inbound_http_filters, names) = inbound_http_filters(&dump, 9080);
    assert_eq!(
        names[names.len() - 2..],
        ["envoy.lua", "envoy.filters.http.router"]
    );
    let ratings_vhost = dump["routes"]["9080"]["virtualHosts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "ratings.default.svc.cluster.local:9080")
        .expect("ratings' virtual host");
    let ratings_cluster = &dump["clusters"]["outbound|9080||ratings.default.svc.cluster.local"];
    insta::assert_json_snapshot!(
        "bookinfo_reviews_envoy_filters",
        json!({
            "inbound 9080 HTTP filters": inbound_http_filters,
            "outbound|9080||ratings circuit breakers": ratings_cluster["circuitBreakers"],
            "ratings:9080 virtual host": ratings_vhost,
        })
    );
    // Not patched: the virtual host of details on the same port.
    let details = dump["routes"]["9080"]["virtualHosts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "details.default.svc.cluster.local:9080")
        .expect("details' virtual host");
    assert!(details.get("responseHeadersToAdd").is_none(), "{details}");
}
