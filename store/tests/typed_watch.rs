//! The typed watch client (`pasa_proto::watch`) against a real store: a snapshot reads as
//! Init, InitApply, InitDone; live changes keep their action; a subscription update is answered
//! with changes and a SYNCED paired with that subscription; a resumed watch replays without a
//! snapshot; a compacted revision and a store shutdown end the stream with what to do next.

mod common;

use std::sync::Arc;
use std::time::SystemTime;

use common::*;
use pasa_proto::store::v1::{CancelReason, Rule, Subscription};
use pasa_proto::watch::{Action, Watch, WatchError, WatchEvent, WatchStart};
use pasa_store::StoreConfig;
use serde_json::{Value, json};

fn vs(ns: &str, name: &str, host: &str) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
           "metadata": {"name": name, "namespace": ns},
           "spec": {"hosts": [host], "http": [{"route": [{"destination": {"host": host}}]}]}})
}

fn namespaces(names: &[&str]) -> Subscription {
    Subscription {
        rules: vec![Rule {
            namespaces: names.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        }],
    }
}

async fn next(watch: &mut Watch) -> Result<WatchEvent, WatchError> {
    tokio::time::timeout(WAIT, watch.next())
        .await
        .expect("timed out waiting for a watch event")
}

async fn event(watch: &mut Watch) -> WatchEvent {
    next(watch).await.expect("the watch goes on")
}

/// `ACTION namespace/name` of each change, in order.
fn names(event: &WatchEvent) -> Vec<String> {
    match event {
        WatchEvent::Changes(changes) => changes
            .iter()
            .map(|c| {
                format!(
                    "{} {}/{}",
                    c.action.as_str(),
                    c.resource.namespace,
                    c.resource.name
                )
            })
            .collect(),
        WatchEvent::InitApply { objects, .. } => objects
            .iter()
            .map(|r| format!("LISTED {}/{}", r.namespace, r.name))
            .collect(),
        other => panic!("expected objects, got {other:?}"),
    }
}

fn commit_times(event: &WatchEvent) -> Vec<Option<SystemTime>> {
    match event {
        WatchEvent::Changes(changes) => changes.iter().map(|c| c.committed).collect(),
        other => panic!("expected changes, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_changes_and_subscription_updates_read_as_typed_events() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path(), StoreConfig::default()).await;
    let mut client = server.client().await;
    apply_ok(
        &mut client,
        vec![
            vs("shop", "cart", "cart.shop.svc.cluster.local"),
            vs("bank", "pay", "pay.bank.svc.cluster.local"),
        ],
    )
    .await;

    let shop = namespaces(&["shop"]);
    let mut watch = Watch::connect(
        &server.addr.to_string(),
        WatchStart {
            subscription: shop.clone(),
            ..Default::default()
        },
    )
    .await
    .expect("watch");
    assert_eq!(event(&mut watch).await, WatchEvent::Init);
    let listed = event(&mut watch).await;
    assert_eq!(names(&listed), ["LISTED shop/cart"]);
    assert!(matches!(listed, WatchEvent::InitApply { revision: 2, .. }));
    assert_eq!(
        event(&mut watch).await,
        WatchEvent::InitDone {
            revision: 2,
            subscription: Arc::new(shop.clone())
        }
    );

    // Live changes keep their action, and carry when the store committed them.
    let before = SystemTime::now();
    apply_ok(
        &mut client,
        vec![vs("shop", "cart", "cart2.shop.svc.cluster.local")],
    )
    .await;
    let after = SystemTime::now();
    let modified = event(&mut watch).await;
    assert_eq!(names(&modified), ["MODIFIED shop/cart"]);
    let committed = commit_times(&modified)[0].expect("a live change has its commit time");
    assert!(before <= committed && committed <= after);

    // A wider subscription: the bank's object arrives, then SYNCED for that subscription.
    let both = namespaces(&["shop", "bank"]);
    assert!(watch.update(both.clone()));
    assert!(watch.updating());
    assert_eq!(watch.subscription(), &both);
    let answer = event(&mut watch).await;
    assert_eq!(names(&answer), ["ADDED bank/pay"]);
    assert_eq!(
        commit_times(&answer),
        [None],
        "an update's answer is no commit"
    );
    assert!(watch.updating(), "sent, but its answer is not complete yet");
    match event(&mut watch).await {
        WatchEvent::Synced { subscription, .. } => assert_eq!(*subscription, both),
        other => panic!("expected SYNCED, got {other:?}"),
    }
    assert!(!watch.updating());

    // Two updates before either is answered: the second replaces the first, which never goes
    // out; the one SYNCED answers the second.
    watch.update(namespaces(&["nowhere"]));
    watch.update(namespaces(&["bank"]));
    assert_eq!(names(&event(&mut watch).await), ["DELETED shop/cart"]);
    match event(&mut watch).await {
        WatchEvent::Synced { subscription, .. } => {
            assert_eq!(*subscription, namespaces(&["bank"]))
        }
        other => panic!("expected SYNCED, got {other:?}"),
    }
    // The same subscription again is not an update.
    assert!(!watch.update(namespaces(&["bank"])));
    assert!(!watch.updating());

    client
        .delete(pasa_proto::store::v1::DeleteRequest {
            refs: vec![pasa_proto::store::v1::ObjectRef {
                kind: "VirtualService".into(),
                namespace: "bank".into(),
                name: "pay".into(),
            }],
            ..Default::default()
        })
        .await
        .expect("delete");
    let deleted = event(&mut watch).await;
    assert_eq!(names(&deleted), ["DELETED bank/pay"]);
    let WatchEvent::Changes(changes) = &deleted else {
        unreachable!()
    };
    assert_eq!(changes[0].action, Action::Deleted);
    let last = changes[0].revision;
    drop(watch);

    // Resumed from before the delete: the replay, then SYNCED, and no snapshot.
    let mut resumed = Watch::open(
        &mut client,
        WatchStart {
            subscription: namespaces(&["bank"]),
            from_revision: last,
            ..Default::default()
        },
    )
    .await
    .expect("resume");
    let replayed = event(&mut resumed).await;
    assert_eq!(names(&replayed), ["DELETED bank/pay"]);
    assert_eq!(
        commit_times(&replayed),
        [changes[0].committed],
        "a replay keeps the commit time from the change log"
    );
    assert!(changes[0].committed.is_some());
    assert!(matches!(
        event(&mut resumed).await,
        WatchEvent::Synced { revision, .. } if revision == last
    ));

    // A change the watch does not select, then the store shutting down: the stream ends with
    // where to resume, after that change (the watch had everything up to it), not after its own
    // last event, so a quiet watcher replays nothing.
    let quiet = apply_ok(
        &mut client,
        vec![vs("shop", "other", "other.shop.svc.cluster.local")],
    )
    .await
    .revision;
    assert!(quiet > last);
    server.stop().await;
    match next(&mut resumed).await {
        Err(WatchError::CutOff {
            reason,
            resume_revision,
            ..
        }) => {
            assert_eq!(reason, CancelReason::Shutdown);
            assert_eq!(resume_revision, quiet + 1);
        }
        other => panic!("expected a cut-off, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_revision_and_a_refused_subscription_end_the_watch() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        log_retention: 5,
        ..StoreConfig::default()
    };
    let server = TestServer::start(dir.path(), config).await;
    let mut client = server.client().await;
    for i in 0..20 {
        apply_ok(
            &mut client,
            vec![vs("shop", &format!("v{i}"), "cart.shop.svc.cluster.local")],
        )
        .await;
    }
    let mut old = Watch::open(
        &mut client,
        WatchStart {
            subscription: namespaces(&["shop"]),
            from_revision: 2,
            ..Default::default()
        },
    )
    .await
    .expect("watch");
    match next(&mut old).await {
        Err(e @ WatchError::Compacted { .. }) => {
            assert_eq!(e.label(), "compacted");
            let WatchError::Compacted {
                compact_revision, ..
            } = e
            else {
                unreachable!()
            };
            assert!(compact_revision >= 2, "{compact_revision}");
        }
        other => panic!("expected COMPACTED, got {other:?}"),
    }

    let bad = Subscription {
        rules: vec![Rule {
            kinds: vec!["NoSuchKind".into()],
            ..Default::default()
        }],
    };
    let refused = match Watch::open(
        &mut client,
        WatchStart {
            subscription: bad,
            ..Default::default()
        },
    )
    .await
    {
        Ok(mut watch) => {
            // The refusal may come as the stream's first answer.
            assert_eq!(event(&mut watch).await, WatchEvent::Init);
            next(&mut watch).await.expect_err("refused")
        }
        Err(e) => e,
    };
    assert!(matches!(refused, WatchError::Refused(_)), "{refused:?}");
    assert!(refused.to_string().contains("NoSuchKind"), "{refused}");

    let unreachable = Watch::connect("not an address", WatchStart::default())
        .await
        .err()
        .expect("not an address");
    assert_eq!(unreachable.label(), "unreachable");
    assert!(unreachable.to_string().contains("not an address"));
    server.stop().await;
}
