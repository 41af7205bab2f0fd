//! The agent reaches the store over mutual TLS (`--store-ca`) with its workload certificate
//! (`--cert-dir`), and the store decides what it may read by that certificate's identity: an
//! agent whose certificate names another namespace than the proxy it serves is refused, and
//! says why in its sync status.

mod common;

use std::path::Path;

use common::agent::Agent;
use common::store::StoreServer;
use pasa_store::access::TlsArgs;
use pasa_testing::pki::FakeCa;
use serde_json::Value;

const NODE: &str = "sidecar~10.0.0.7~web-1.shop~shop.svc.cluster.local";

/// Istio's file names for the workload certificate of `spiffe` under `dir`.
fn workload_certificate(ca: &FakeCa, dir: &Path, spiffe: &str) {
    common::sidecar::workload_certificate_for(dir, ca.issuer(), spiffe);
}

fn store_state(body: &str) -> (String, String) {
    let doc: Value = serde_json::from_str(body).unwrap();
    let store = &doc["store"];
    (
        store["state"].as_str().unwrap_or_default().to_string(),
        store["reason"].as_str().unwrap_or_default().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_reads_as_its_certificate_says_not_as_its_node_id_claims() {
    let dir = tempfile::tempdir().unwrap();
    let ca = FakeCa::new("cluster.local");
    let ca_path = ca.write(dir.path());
    let (cert, key) = ca
        .issue(
            Some("spiffe://cluster.local/ns/pasa-system/sa/pasa-store"),
            &["127.0.0.1"],
        )
        .write(dir.path(), "store");
    let store = StoreServer::start_secured(
        &dir.path().join("data"),
        &TlsArgs {
            grpc_tls_cert: Some(cert),
            grpc_tls_key: Some(key),
            grpc_client_ca: Some(ca_path.clone()),
            grpc_operator: vec![],
        },
    )
    .await;

    let ca_arg = ca_path.to_str().unwrap().to_string();
    // Its own namespace: synced.
    let own = dir.path().join("own");
    workload_certificate(
        &ca,
        &own.join("certs"),
        "spiffe://cluster.local/ns/shop/sa/web",
    );
    let certs = own.join("certs");
    let agent = Agent::start_in(
        NODE,
        store.addr,
        &own,
        &["--cert-dir", certs.to_str().unwrap(), "--store-ca", &ca_arg],
    );
    agent
        .until("/sync_status", "synced over mutual TLS", |_, b| {
            store_state(b).0 == "Synced"
        })
        .await;
    agent.terminate();

    // A certificate of `bank` serving a proxy of `shop`: refused, and the agent says why.
    let other = dir.path().join("other");
    workload_certificate(
        &ca,
        &other.join("certs"),
        "spiffe://cluster.local/ns/bank/sa/teller",
    );
    let certs = other.join("certs");
    let agent = Agent::start_in(
        NODE,
        store.addr,
        &other,
        &["--cert-dir", certs.to_str().unwrap(), "--store-ca", &ca_arg],
    );
    let body = agent
        .until("/sync_status", "refused", |_, b| {
            store_state(b).1.contains("watch refused")
        })
        .await;
    let (state, reason) = store_state(&body);
    assert_eq!(state, "Degraded");
    assert!(
        reason.contains("identity.node_id: names namespace \"shop\", not the caller's (spiffe://cluster.local/ns/bank/sa/teller)"),
        "{reason}"
    );
    agent.terminate();

    // Without --store-ca the agent speaks plaintext, which the store does not accept.
    let plain = dir.path().join("plain");
    let agent = Agent::start_in(NODE, store.addr, &plain, &[]);
    agent
        .until("/sync_status", "unreachable in plaintext", |_, b| {
            let (state, reason) = store_state(b);
            state == "Degraded" && !reason.is_empty() && !reason.contains("saved")
        })
        .await;
    agent.terminate();
    store.stop().await;
}
