//! The agent following a real store server on loopback: the initial snapshot, live changes, the
//! cache saved when complete, degraded while the store is away, and resuming from the last
//! revision when it is back.

use std::sync::Arc;
use std::time::Duration;

use pasa_agent::cache::{Cache, Key};
use pasa_agent::follow::{FollowConfig, Link, follow};
use pasa_proto::store::v1::store_client::StoreClient;
use pasa_proto::store::v1::{ApplyDocument, ApplyRequest, Rule, SubscriberIdentity, Subscription};
use pasa_store::backend::sled::SledBackend;
use pasa_store::metrics::Metrics;
use pasa_store::store::{Store, StoreConfig};
use tokio::sync::{oneshot, watch};

const WAIT: Duration = Duration::from_secs(20);

struct Server {
    addr: std::net::SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start(dir: &std::path::Path, port: u16) -> Server {
    let backend = SledBackend::open(dir).expect("open sled");
    let store = Store::open(Arc::new(backend), StoreConfig::default(), Metrics::new()).unwrap();
    let listen = format!("127.0.0.1:{port}").parse().unwrap();
    let bound = pasa_store::server::bind(store, listen, "127.0.0.1:0".parse().unwrap())
        .await
        .expect("bind");
    let addr = bound.grpc_addr();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(bound.run("test-store", async move {
        let _ = stopped.await;
    }));
    Server { addr, stop, task }
}

impl Server {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

async fn apply(addr: std::net::SocketAddr, name: &str, host: &str) {
    let mut client = StoreClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let doc = format!(
        r#"{{"apiVersion":"networking.istio.io/v1","kind":"DestinationRule","metadata":{{"name":"{name}","namespace":"shop"}},"spec":{{"host":"{host}"}}}}"#
    );
    let r = client
        .apply(ApplyRequest {
            documents: vec![ApplyDocument {
                json: doc,
                expected_mod_revision: None,
            }],
            dry_run: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

async fn until<T: Clone>(rx: &mut watch::Receiver<T>, what: &str, ok: impl Fn(&T) -> bool) -> T {
    tokio::time::timeout(WAIT, rx.wait_for(|v| ok(v)))
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .expect("publisher alive")
        .clone()
}

fn key(name: &str) -> Key {
    Key {
        kind: "DestinationRule".into(),
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
    apply(server.addr, "cart", "cart").await;

    let config = FollowConfig {
        server: server.addr.to_string(),
        subscription: Subscription {
            rules: vec![Rule {
                namespaces: vec!["shop".into()],
                ..Default::default()
            }],
        },
        identity: SubscriberIdentity {
            node_id: "sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local".into(),
            ..Default::default()
        },
        cache_dir: Some(cache_dir.path().to_path_buf()),
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
    let saved = Cache::load(cache_dir.path()).unwrap().expect("saved cache");
    assert_eq!(saved.revision(), c.revision());

    // A live change arrives.
    apply(server.addr, "checkout", "checkout").await;
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
    apply(server.addr, "payments", "payments").await;
    until(&mut caches, "the change after the restart", |c| {
        c.get(&key("payments")).is_some()
    })
    .await;
    until(&mut link, "synced again", |l| *l == Link::Synced).await;
    assert_eq!(caches.borrow().len(), 3);

    stop_tx.send_replace(true);
    tokio::time::timeout(WAIT, follower).await.unwrap().unwrap();
    server.stop().await;
}
