//! The TiKV backend against a real TiKV cluster: run with
//! `PD_ADDRS=pd-0:2379,pd-1:2379 cargo test -p pasa-store --test tikv_cluster -- --ignored`.
//! Everything runs under a key prefix of its own, so a shared cluster is not disturbed (the keys
//! stay behind; delete the prefix `pasa-test-` when done). CI has no TiKV: there the same code
//! runs against the fake of PD and TiKV (`tests/replicas.rs`, and the backend's unit test).

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pasa_store::backend::conformance;
use pasa_store::backend::tikv::TikvBackend;
use pasa_store::metrics::Metrics;
use pasa_store::selector::Selector;
use pasa_store::{Store, StoreConfig};
use serde_json::json;

fn pd() -> Vec<String> {
    let addrs = std::env::var("PD_ADDRS")
        .expect("PD_ADDRS=host:port[,host:port…] names the TiKV cluster's PD endpoints");
    addrs.split(',').map(|a| a.trim().to_string()).collect()
}

fn prefix(what: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("pasa-test-{what}-{}-{nanos}/", std::process::id())
}

#[test]
#[ignore = "needs a TiKV cluster (PD_ADDRS)"]
fn a_real_cluster_passes_the_backend_conformance_suite() {
    let (pd, prefix) = (pd(), prefix("conformance"));
    conformance::run(|| TikvBackend::connect(&pd, &prefix, Duration::from_secs(10)).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a TiKV cluster (PD_ADDRS)"]
async fn two_replicas_on_a_real_cluster_follow_each_other() {
    let (pd, prefix) = (pd(), prefix("replicas"));
    let open = || {
        let backend = TikvBackend::connect(&pd, &prefix, Duration::from_secs(10)).unwrap();
        Store::open(Arc::new(backend), StoreConfig::default(), Metrics::new()).unwrap()
    };
    let (a, b) = (open(), open());
    for n in 0..20 {
        let store = if n % 2 == 0 { &a } else { &b };
        let doc = json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": format!("dr-{n}"), "namespace": "real"},
            "spec": {"host": format!("h{n}.real.svc.cluster.local")}});
        let r = store.apply(vec![common::doc(&doc)], false).await.unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
    }
    // Each follows the other's writes within moments.
    let deadline = std::time::Instant::now() + common::WAIT;
    while a.revision() < 20 || b.revision() < 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "replicas did not converge"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (on_a, _) = a.list(&Selector::everything(), 0).await.unwrap();
    let (on_b, _) = b.list(&Selector::everything(), 0).await.unwrap();
    assert_eq!(on_a.len(), 20);
    assert_eq!(on_b.len(), 20);
    a.shutdown();
    b.shutdown();
}
