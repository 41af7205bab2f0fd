//! `pasa-pcp --store ADDR` in front of a separate store server: writes are validated by PCP and
//! land in that store; reads and watches pass through.

mod common;

use std::sync::Arc;

use common::{Pcp, examples};
use pasa_proto::store::v1::store_client::StoreClient;
use pasa_proto::store::v1::{
    CancelReason, ListRequest, Rule, Subscription, WatchCreate, WatchRequest, watch_request,
    watch_response,
};
use pasa_store::backend::sled::SledBackend;
use pasa_store::metrics::Metrics;
use pasa_store::store::{Store, StoreConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcp_fronts_a_remote_store() {
    // The store server, in this process.
    let dir = tempfile::tempdir().unwrap();
    let backend = SledBackend::open(dir.path()).expect("open sled");
    let (store_addr, stop, server) = serve(Arc::new(backend)).await;

    let pcp = Pcp::start_args(&["--store", &store_addr]);

    // A watch through PCP, opened before the writes.
    let mut through_pcp = StoreClient::connect(format!("http://{}", pcp.addr))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(WatchRequest {
        request: Some(watch_request::Request::Create(WatchCreate {
            subscription: Some(Subscription {
                rules: vec![Rule {
                    namespaces: vec!["shop".into()],
                    ..Default::default()
                }],
            }),
            from_revision: 0,
            identity: None,
        })),
    })
    .await
    .unwrap();
    let mut watch = through_pcp
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("watch through pcp")
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert!(
        matches!(first.response, Some(watch_response::Response::Synced(_))),
        "{first:?}"
    );

    // Writes through PCP land in the remote store.
    let shop = examples().join("shop");
    let pcp_for_cli = tokio::task::spawn_blocking(move || {
        let out = pcp.ok(&["apply", "-f", shop.to_str().unwrap()]);
        (pcp, out)
    });
    let (pcp, out) = pcp_for_cli.await.unwrap();
    assert!(out.contains("virtualservice/shop/cart created"), "{out}");
    let mut direct = StoreClient::connect(format!("http://{store_addr}"))
        .await
        .unwrap();
    let listed = direct
        .list(ListRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        listed.resources.len(),
        9,
        "every shop object is in the store"
    );

    // The watch through PCP hears of them.
    let mut seen = 0;
    while seen < 9 {
        let msg = watch.message().await.unwrap().expect("watch open");
        if let Some(watch_response::Response::Events(batch)) = msg.response {
            seen += batch.events.len();
        }
    }

    // A bad document is refused by PCP and never reaches the store.
    let broken = examples().join("broken.yaml");
    let (pcp, out) = tokio::task::spawn_blocking(move || {
        let out = pcp.ctl(&["apply", "-f", broken.to_str().unwrap()]);
        (pcp, out)
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let after = direct
        .list(ListRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after.revision, listed.revision, "nothing written");

    // Several sled-backed store servers hold different data: PCP refuses to front them together.
    let refused = common::pcp_command()
        .args(["--store", &format!("{store_addr},{store_addr}")])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("sled"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    // PCP shutting down ends the watch it forwards with SHUTDOWN and where to resume; the client
    // then closes its side, as an agent does before it reconnects.
    let terminated = tokio::task::spawn_blocking(move || pcp.terminate());
    let mut notice = None;
    while let Ok(Some(msg)) = watch.message().await {
        if let Some(watch_response::Response::Cancelled(c)) = msg.response {
            notice = Some(c);
            break;
        }
    }
    drop((tx, watch));
    let notice = notice.expect("a SHUTDOWN notice");
    assert_eq!(notice.reason, CancelReason::Shutdown as i32);
    assert_eq!(notice.resume_revision, listed.revision + 1);
    terminated.await.unwrap();

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// A store server on `backend`, in this process: its address, what stops it, and its task.
async fn serve(
    backend: Arc<dyn pasa_store::backend::Backend>,
) -> (
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let store = Store::open(backend, StoreConfig::default(), Metrics::new()).unwrap();
    let bound = pasa_store::server::bind(
        store,
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let addr = bound.grpc_addr().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(bound.run("store", async move {
        let _ = stopped.await;
    }));
    (addr, stop, server)
}

/// A store replica on the fake PD/TiKV (a fake: see `pasa_tikv::fake`), in this process.
async fn replica(
    pd: &str,
) -> (
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let backend = pasa_store::backend::tikv::TikvBackend::connect(
        &[pd.to_string()],
        "pcp-replicas/",
        std::time::Duration::from_secs(5),
    )
    .expect("connect to the fake PD");
    serve(Arc::new(backend)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcp_writes_through_another_store_replica_when_one_is_gone() {
    let fake = pasa_tikv::fake::FakeTikv::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let (a, stop_a, server_a) = replica(&fake.pd_address()).await;
    let (b, stop_b, server_b) = replica(&fake.pd_address()).await;
    let pcp = Pcp::start_args(&["--store", &format!("{a},{b}")]);
    let shop = examples().join("shop");
    let (pcp, out) = tokio::task::spawn_blocking(move || {
        let out = pcp.ok(&["apply", "-f", shop.to_str().unwrap()]);
        (pcp, out)
    })
    .await
    .unwrap();
    assert!(out.contains("virtualservice/shop/cart created"), "{out}");

    // A goes away; every write after it goes through B.
    let _ = stop_a.send(());
    server_a.await.unwrap().unwrap();
    let v2_only = examples().join("shop-v2-only.yaml");
    let (pcp, out) = tokio::task::spawn_blocking(move || {
        let out = pcp.ok(&["apply", "-f", v2_only.to_str().unwrap()]);
        (pcp, out)
    })
    .await
    .unwrap();
    assert!(out.contains("configured"), "{out}");
    let mut direct = StoreClient::connect(format!("http://{b}")).await.unwrap();
    let listed = direct
        .list(ListRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed
            .resources
            .iter()
            .any(|r| r.kind == "VirtualService" && r.version == 2),
        "the write after A stopped is in B"
    );
    tokio::task::spawn_blocking(move || pcp.terminate())
        .await
        .unwrap();
    let _ = stop_b.send(());
    server_b.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcp_keeps_its_embedded_store_on_tikv() {
    let fake = pasa_tikv::fake::FakeTikv::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let pd = fake.pd_address();
    let out = tokio::task::spawn_blocking(move || {
        let pcp = Pcp::start_args(&["--backend", "tikv", "--pd", &pd]);
        let shop = examples().join("shop");
        let applied = pcp.ok(&["apply", "-f", shop.to_str().unwrap()]);
        let status = pcp.ok(&["status"]);
        pcp.terminate();
        (applied, status)
    })
    .await
    .unwrap();
    assert!(
        out.0.contains("virtualservice/shop/cart created"),
        "{}",
        out.0
    );
    assert!(
        out.1
            .lines()
            .any(|l| l.starts_with("BACKEND") && l.ends_with("tikv")),
        "{}",
        out.1
    );
}
