//! Crash consistency: `pasa-store` is killed with SIGKILL in the middle of a write loop, several
//! times; after each restart every acknowledged write is there and the change log has no gap.

mod common;

use std::collections::BTreeMap;

use common::{Watch, apply};
use pasa_proto::store::v1::store_client::StoreClient;
use pasa_proto::store::v1::{Rule, Subscription};
use serde_json::json;
use tokio::process::Child;

const ROUNDS: u64 = 5;

/// Starts the server binary on `dir` and waits for its ready line.
async fn start(dir: &std::path::Path) -> (Child, String) {
    common::start_process([std::ffi::OsStr::new("--data-dir"), dir.as_os_str()]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    // name -> (revision, counter) of the last acknowledged write of that object.
    let mut acked: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut counter = 0u64;
    for round in 0..ROUNDS {
        let (mut child, addr) = start(dir.path()).await;
        let mut client = StoreClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        check(&mut client, &acked).await;

        // Write batches until the kill lands: the kill comes after a varying number of
        // acknowledged batches while further writes are in flight.
        // Over the rounds the log grows past one replay page (1024 revisions).
        let kill_after = 40 + round * 57 % 150;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<(Vec<(String, u64)>, u64)>(1024);
        let writer = tokio::spawn(async move {
            let mut n = counter;
            loop {
                n += 1;
                let size = 1 + (n % 5) as usize;
                let names: Vec<String> = (0..size)
                    .map(|i| format!("obj-{}", (n * 7 + i as u64) % 97))
                    .collect();
                let docs = names
                    .iter()
                    .map(|name| {
                        json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
                               "metadata": {"name": name, "namespace": "crash",
                                            "annotations": {"counter": n.to_string()}},
                               "spec": {"host": format!("{name}.crash.svc.cluster.local")}})
                    })
                    .collect();
                match client
                    .apply(pasa_proto::store::v1::ApplyRequest {
                        documents: docs_of(docs),
                        dry_run: false,
                    })
                    .await
                {
                    Ok(r) => {
                        let r = r.into_inner();
                        assert!(r.errors.is_empty(), "{:?}", r.errors);
                        let written = r
                            .results
                            .iter()
                            .map(|res| (res.r#ref.clone().unwrap_or_default().name, res.revision))
                            .collect();
                        if tx.send((written, n)).await.is_err() {
                            return n;
                        }
                    }
                    Err(_) => return n,
                }
            }
        });
        let mut batches = 0;
        while let Some((written, n)) = rx.recv().await {
            for (name, revision) in written {
                acked.insert(name, (revision, n));
            }
            batches += 1;
            if batches == kill_after {
                child.start_kill().expect("SIGKILL");
            }
        }
        counter = writer.await.unwrap() + 1;
        let _ = child.wait().await;
    }
    let (_child, addr) = start(dir.path()).await;
    let mut client = StoreClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    check(&mut client, &acked).await;
    // The restarted store still takes writes after its last revision.
    let r = apply(
        &mut client,
        vec![
            json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
                    "metadata": {"name": "after", "namespace": "crash"},
                    "spec": {"egress": [{"hosts": ["./*"]}]}}),
        ],
    )
    .await;
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

fn docs_of(docs: Vec<serde_json::Value>) -> Vec<pasa_proto::store::v1::ApplyDocument> {
    docs.iter().map(common::doc).collect()
}

/// Every acknowledged write is present (at its revision or later), and the log replays from
/// revision 1 to the head with no gap.
async fn check(
    client: &mut StoreClient<tonic::transport::Channel>,
    acked: &BTreeMap<String, (u64, u64)>,
) {
    let mut w = Watch::open_raw(
        client,
        Subscription {
            rules: vec![Rule::default()],
        },
        1,
    )
    .await;
    let (events, head) = w.until_synced().await;
    let revisions: Vec<u64> = events.iter().map(|e| e.revision).collect();
    assert_eq!(
        revisions,
        (1..=head).collect::<Vec<_>>(),
        "no gap in the change log"
    );
    let list = client
        .list(pasa_proto::store::v1::ListRequest {
            selector: None,
            revision: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.revision, head);
    let stored: BTreeMap<String, (u64, u64)> = list
        .resources
        .iter()
        .map(|r| {
            let n = r
                .annotations
                .get("counter")
                .map_or(0, |c| c.parse().unwrap());
            (r.name.clone(), (r.mod_revision, n))
        })
        .collect();
    for (name, (revision, n)) in acked {
        let (stored_rev, stored_n) = stored
            .get(name)
            .unwrap_or_else(|| panic!("acknowledged {name} is missing"));
        assert!(
            stored_rev >= revision && stored_n >= n,
            "{name}: acknowledged at revision {revision} (write {n}), stored {stored_rev} (write {stored_n})"
        );
    }
    println!(
        "crash check: head revision {head}, {} objects, {} acknowledged objects present",
        stored.len(),
        acked.len()
    );
}
