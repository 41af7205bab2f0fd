//! The agent following a real store server on loopback: the initial snapshot, live changes, the
//! cache saved when complete, degraded while the store is away, and resuming from the last
//! revision when it is back, on the same server or on another replica of the store.

use std::sync::Arc;
use std::time::Duration;

mod common;

use common::store::StoreServer;
use pasa_agent::cache::{Cache, Key};
use pasa_agent::follow::{FollowConfig, Link, follow};
use pasa_proto::store::v1::{Rule, SubscriberIdentity, Subscription};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(20);

async fn start(dir: &std::path::Path, port: u16) -> StoreServer {
    StoreServer::start(dir, port).await
}

async fn apply(server: &StoreServer, name: &str, host: &str) {
    server.apply_rule(name, host).await;
}

async fn until<T: Clone>(rx: &mut watch::Receiver<T>, what: &str, ok: impl Fn(&T) -> bool) -> T {
    tokio::time::timeout(WAIT, rx.wait_for(|v| ok(v)))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .expect("publisher alive")
        .clone()
}

/// Everything in namespace `shop`.
fn shop() -> Subscription {
    Subscription {
        rules: vec![Rule {
            namespaces: vec!["shop".into()],
            ..Default::default()
        }],
    }
}

/// Only what is about one host.
fn host(fqdn: &str) -> Subscription {
    Subscription {
        rules: vec![Rule {
            hosts: vec![fqdn.into()],
            ..Default::default()
        }],
    }
}

/// Following `servers` with `subscription`, as cart-1 of shop, keeping nothing on disk.
fn config(servers: &str, subscription: watch::Receiver<Subscription>) -> FollowConfig {
    FollowConfig {
        servers: pasa_proto::client::Servers::parse(servers).unwrap(),
        subscription,
        identity: SubscriberIdentity {
            node_id: "sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local".into(),
            ..Default::default()
        },
        cache_dir: None,
        metrics: None,
        saved: None,
        liveness: pasa_agent::follow::DEFAULT_LIVENESS,
    }
}

fn names(cache: &Cache) -> Vec<String> {
    cache.iter().map(|(k, _)| k.name.clone()).collect()
}

fn key(name: &str) -> Key {
    Key {
        kind: pasa_proto::Kind::DestinationRule,
        namespace: "shop".into(),
        name: name.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_resumes_and_saves() {
    let data = tempfile::tempdir().unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let server = start(data.path(), 0).await;
    let port = server.addr.port();
    apply(&server, "cart", "cart").await;

    let (saved_tx, mut saved) = watch::channel(0);
    let config = FollowConfig {
        servers: pasa_proto::client::Servers::parse(&server.addr.to_string()).unwrap(),
        subscription: watch::channel(shop()).1,
        identity: SubscriberIdentity {
            node_id: "sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local".into(),
            ..Default::default()
        },
        cache_dir: Some(cache_dir.path().to_path_buf()),
        metrics: None,
        saved: Some(saved_tx),
        liveness: pasa_agent::follow::DEFAULT_LIVENESS,
    };
    let (published, mut caches) = watch::channel(Arc::new(Cache::default()));
    let (link_tx, mut link) = watch::channel(Link::default());
    let (stop_tx, stop) = watch::channel(false);
    let follower = tokio::spawn(follow(config, Cache::default(), published, link_tx, stop));

    // The snapshot, then SYNCED: saved to disk.
    until(&mut link, "synced", |l| *l == Link::Synced).await;
    let c = until(&mut caches, "the snapshot", |c| {
        c.get(&key("cart")).is_some()
    })
    .await;
    until(&mut saved, "the snapshot saved", |r| *r == c.revision()).await;
    let on_disk = Cache::load(cache_dir.path()).unwrap().expect("saved cache");
    assert_eq!(on_disk.revision(), c.revision());

    // A live change arrives.
    apply(&server, "checkout", "checkout").await;
    until(&mut caches, "the live change", |c| {
        c.get(&key("checkout")).is_some()
    })
    .await;

    // The store goes away: degraded, the cache is kept.
    server.stop().await;
    until(&mut link, "degraded", |l| matches!(l, Link::Degraded(_))).await;
    assert_eq!(caches.borrow().len(), 2);

    // Back on the same address: resumed from the revision, what changed meanwhile arrives.
    let server = start(data.path(), port).await;
    apply(&server, "payments", "payments").await;
    until(&mut caches, "the change after the restart", |c| {
        c.get(&key("payments")).is_some()
    })
    .await;
    until(&mut link, "synced again", |l| *l == Link::Synced).await;
    assert_eq!(caches.borrow().len(), 3);

    // Stopped: the newest cache is on disk when the follower returns.
    stop_tx.send_replace(true);
    tokio::time::timeout(WAIT, follower).await.unwrap().unwrap();
    let on_disk = Cache::load(cache_dir.path()).unwrap().expect("saved cache");
    assert_eq!(on_disk.revision(), caches.borrow().revision());
    assert_eq!(on_disk.len(), 3);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_subscription_adds_and_removes_objects() {
    let data = tempfile::tempdir().unwrap();
    let server = start(data.path(), 0).await;
    let port = server.addr.port();
    apply(&server, "cart", "cart").await;
    apply(&server, "checkout", "checkout").await;

    let (scope, subscription) = watch::channel(shop());
    let config = config(&server.addr.to_string(), subscription);
    let (published, mut caches) = watch::channel(Arc::new(Cache::default()));
    let (link_tx, mut link) = watch::channel(Link::default());
    let (stop_tx, stop) = watch::channel(false);
    let follower = tokio::spawn(follow(config, Cache::default(), published, link_tx, stop));
    until(&mut link, "synced", |l| *l == Link::Synced).await;
    let c = until(&mut caches, "both", |c| c.len() == 2).await;
    assert!(
        c.answers(&shop()),
        "the snapshot's SYNCED answers the first subscription"
    );
    assert!(!c.answers(&host("cart.shop.svc.cluster.local")));

    // Narrowed on the open stream: what no longer matches is deleted.
    scope.send_replace(host("cart.shop.svc.cluster.local"));
    let c = until(&mut caches, "narrowed", |c| c.len() == 1).await;
    assert_eq!(names(&c), ["cart"]);
    // Live changes follow the new subscription.
    apply(&server, "payments", "payments").await;
    apply(&server, "cart", "cart.shop.svc.cluster.local").await;
    let c = until(&mut caches, "cart changed", |c| {
        c.get(&key("cart"))
            .is_some_and(|r| r.spec_json.contains("svc.cluster.local"))
    })
    .await;
    assert_eq!(names(&c), ["cart"], "payments is out of scope");

    // Widened: what now matches is added, and the cache says when the whole answer is in (the
    // store's SYNCED after the update).
    scope.send_replace(shop());
    let c = until(&mut caches, "widened and answered", |c| {
        c.answers(&shop()) && c.answered() == Some(&shop())
    })
    .await;
    assert_eq!(names(&c), ["cart", "checkout", "payments"]);

    // Changed while the store is away: the next watch starts over under the new subscription.
    server.stop().await;
    until(&mut link, "degraded", |l| matches!(l, Link::Degraded(_))).await;
    scope.send_replace(host("checkout.shop.svc.cluster.local"));
    let server = start(data.path(), port).await;
    let c = until(&mut caches, "relisted", |c| {
        c.len() == 1 && !c.snapshot_pending()
    })
    .await;
    assert_eq!(names(&c), ["checkout"]);
    until(&mut link, "synced again", |l| *l == Link::Synced).await;

    stop_tx.send_replace(true);
    tokio::time::timeout(WAIT, follower).await.unwrap().unwrap();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moves_to_another_store_replica_and_resumes_there() {
    let fake = pasa_tikv::fake::FakeTikv::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let a = StoreServer::start_on_tikv(&fake.pd_address()).await;
    let b = StoreServer::start_on_tikv(&fake.pd_address()).await;
    apply(&a, "cart", "cart").await;
    let config = config(&format!("{},{}", a.addr, b.addr), watch::channel(shop()).1);
    let (published, mut caches) = watch::channel(Arc::new(Cache::default()));
    let (link_tx, mut link) = watch::channel(Link::default());
    let (stop_tx, stop) = watch::channel(false);
    let follower = tokio::spawn(follow(config, Cache::default(), published, link_tx, stop));
    until(&mut link, "synced on A", |l| *l == Link::Synced).await;
    let before = until(&mut caches, "cart", |c| c.get(&key("cart")).is_some()).await;

    // A stops; what is written through B arrives, on top of the cache kept from A.
    a.stop().await;
    until(&mut link, "degraded", |l| matches!(l, Link::Degraded(_))).await;
    apply(&b, "checkout", "checkout").await;
    let after = until(&mut caches, "checkout, through B", |c| {
        c.get(&key("checkout")).is_some()
    })
    .await;
    until(&mut link, "synced on B", |l| *l == Link::Synced).await;
    assert_eq!(names(&after), ["cart", "checkout"]);
    assert!(after.revision() > before.revision());
    stop_tx.send_replace(true);
    tokio::time::timeout(WAIT, follower).await.unwrap().unwrap();
    b.stop().await;
}
