//! A watcher that stops reading is cut off once its bounded queue is full (the store keeps no
//! more for it), other watchers are unaffected, and the slow one resumes from the revision it
//! was told without losing or repeating an event.

mod common;

use common::*;
use pasa_proto::store::v1::{CancelReason, Rule, StatusRequest, watch_response};
use pasa_store::StoreConfig;
use serde_json::json;

const WRITES: u64 = 300;

/// `WRITES` big objects, one write each: they fill a non-reading watcher's HTTP/2 window
/// quickly, then its queue.
async fn write_load(
    client: &mut pasa_proto::store::v1::store_client::StoreClient<tonic::transport::Channel>,
    prefix: &str,
) {
    let filler = "x".repeat(16 * 1024);
    for i in 0..WRITES {
        apply_ok(
            client,
            vec![
                json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
                "metadata": {"name": format!("{prefix}-{i}"), "namespace": "load",
                             "annotations": {"filler": filler}},
                "spec": {"hosts": [format!("{prefix}{i}.example.com")]}}),
            ],
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_watcher_is_cut_off_and_resumes_without_loss() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        watch_queue: 4,
        ..StoreConfig::default()
    };
    let server = TestServer::start(dir.path(), config).await;
    let mut client = server.client().await;
    let all = || vec![Rule::default()];
    // Each watcher on its own connection, as agents are: unread data of one stream must not
    // hold up another stream's HTTP/2 connection window.
    let mut slow_client = server.client().await;
    let mut slow = Watch::open_raw(&mut slow_client, fenced(all()), 0).await;
    let (_, start) = slow.until_synced().await;
    let mut fast_client = server.client().await;
    let mut fast = Watch::open_raw(&mut fast_client, fenced(all()), 0).await;
    fast.until_synced().await;

    let fast_reader = tokio::spawn(async move {
        let mut revisions = Vec::new();
        while (revisions.len() as u64) < WRITES {
            if let Some(watch_response::Response::Events(b)) = fast.next().await.response {
                revisions.extend(b.events.iter().map(|e| e.revision));
            }
        }
        (revisions, fast)
    });
    write_load(&mut client, "se").await;
    let head = start + WRITES;
    // The fast watcher stays open (and registered) until the end of the test.
    let (fast_revisions, _fast) = fast_reader.await.unwrap();
    assert_eq!(
        fast_revisions,
        (start + 1..=head).collect::<Vec<_>>(),
        "the fast watcher got everything, in order"
    );

    // The slow watcher is no longer registered: nothing more is queued for it.
    let status = client.status(StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(status.watchers, 1, "only the fast watcher is left");

    // Reading now: what was in flight, then the cut-off notice with a resume revision.
    let mut seen = Vec::new();
    let resume = loop {
        match slow.next().await.response {
            Some(watch_response::Response::Events(b)) => {
                seen.extend(b.events.iter().map(|e| e.revision))
            }
            Some(watch_response::Response::Cancelled(c)) => {
                assert_eq!(c.reason, CancelReason::SlowConsumer as i32, "{c:?}");
                break c.resume_revision;
            }
            Some(watch_response::Response::Progress(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    assert!(resume < head, "cut off before the end (resume at {resume})");
    assert_eq!(seen, (start + 1..resume).collect::<Vec<_>>());

    let mut resumed = Watch::open_raw(&mut slow_client, fenced(all()), resume).await;
    let (replayed, synced) = resumed.until_synced().await;
    assert_eq!(synced, head);
    seen.extend(replayed.iter().map(|e| e.revision));
    assert_eq!(
        seen,
        (start + 1..=head).collect::<Vec<_>>(),
        "every event exactly once across the cut-off"
    );
    server.stop().await;
}

/// A watcher that stops reading for good: once cut off, its stream's task does not stay parked
/// on a send the client will never take; it ends (freeing what it holds) within the notice
/// wait, while another watcher keeps getting everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_never_reads_again_ends_its_stream() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        watch_queue: 4,
        watch_notice_wait: std::time::Duration::from_millis(200),
        ..StoreConfig::default()
    };
    let server = TestServer::start(dir.path(), config).await;
    let mut client = server.client().await;
    let all = || vec![Rule::default()];
    let mut silent_client = server.client().await;
    let mut silent = Watch::open_raw(&mut silent_client, fenced(all()), 0).await;
    silent.until_synced().await;
    let mut other_client = server.client().await;
    let mut other = Watch::open_raw(&mut other_client, fenced(all()), 0).await;
    let (_, start) = other.until_synced().await;
    let streams = || server.store.metrics().watch_streams.get();
    assert_eq!(streams(), 2);

    let reader = tokio::spawn(async move {
        let mut last = 0;
        while last < start + WRITES {
            if let Some(watch_response::Response::Events(b)) = other.next().await.response {
                last = b.events.iter().map(|e| e.revision).max().unwrap_or(last);
            }
        }
        (last, other)
    });
    write_load(&mut client, "quiet").await;
    let (last, _other) = reader.await.unwrap();
    assert_eq!(last, start + WRITES, "the other watcher got everything");

    // The silent one never reads again; its stream ends anyway.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while streams() != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the silent watcher's stream is still served ({} streams)",
            streams()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let status = client.status(StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(status.watchers, 1);
    drop(silent);
    server.stop().await;
}
