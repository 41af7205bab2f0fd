//! Scope with the real binary: a Sidecar that narrows a proxy's egress narrows the agent's store
//! subscription on the live watch, and what left the scope disappears from the served xDS and
//! from the agent's saved cache.

mod common;

use common::agent::{Agent, served};
use common::store::StoreServer;
use prost::Message;
use serde_json::{Value, json};

const NODE_ID: &str = "sidecar~10.0.0.9~web-1.default~default.svc.cluster.local";

fn service(name: &str, namespace: &str) -> Value {
    json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
           "metadata": {"name": name, "namespace": namespace},
           "spec": {"addresses": ["10.96.1.1"], "ports": [{"name": "http", "port": 8080}],
                    "endpoints": [{"address": "10.1.1.1"}]}})
}

fn clusters(dump: &str) -> Vec<String> {
    served(dump, "CDS")
}

/// Namespaces of the objects in the agent's saved cache.
fn saved_namespaces(cache_dir: &std::path::Path) -> Vec<String> {
    let bytes = std::fs::read(cache_dir.join("snapshot.pb")).unwrap_or_default();
    let saved = pasa_proto::store::v1::ListResponse::decode(bytes.as_slice()).unwrap();
    let mut ns: Vec<String> = saved.resources.into_iter().map(|r| r.namespace).collect();
    ns.sort();
    ns.dedup();
    ns
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrower_sidecar_narrows_the_subscription_and_the_served_config() {
    let data = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let store = StoreServer::start(data.path(), 0).await;
    store
        .apply(&[service("web", "default"), service("cart", "shop")])
        .await;
    let agent = Agent::start_as(NODE_ID, store.addr, run.path(), cache.path());
    let cart = "outbound|8080||cart.shop.svc.cluster.local";
    let web = "outbound|8080||web.default.svc.cluster.local";
    agent
        .until("/config_dump", "both services served", |_, b| {
            let c = clusters(b);
            c.iter().any(|n| n == cart) && c.iter().any(|n| n == web)
        })
        .await;

    // Only its own namespace: the store stops sending `shop`, and cart leaves the served config.
    store
        .apply(&[
            json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
            "metadata": {"name": "default", "namespace": "default"},
            "spec": {"egress": [{"hosts": ["./*"]}]}}),
        ])
        .await;
    agent
        .until("/config_dump", "cart gone", |_, b| {
            let c = clusters(b);
            !c.iter().any(|n| n == cart) && c.iter().any(|n| n == web)
        })
        .await;
    let deadline = tokio::time::Instant::now() + common::agent::WAIT;
    while saved_namespaces(cache.path()).contains(&"shop".to_string()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "shop's objects are still in the agent's cache: its subscription did not narrow"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(saved_namespaces(cache.path()), ["default"]);

    // Widened again: cart comes back.
    store
        .apply(&[
            json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
            "metadata": {"name": "default", "namespace": "default"},
            "spec": {"egress": [{"hosts": ["./*", "shop/*"]}]}}),
        ])
        .await;
    agent
        .until("/config_dump", "cart back", |_, b| {
            clusters(b).iter().any(|n| n == cart)
        })
        .await;
}
