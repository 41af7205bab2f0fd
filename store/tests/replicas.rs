//! Several `pasa-store` processes on one TiKV — here the in-process fake of PD and TiKV (a fake:
//! see `pasa_tikv::fake`), reached through tikv-client's real transaction path. Each replica
//! follows the others' writes through the change log; watchers on every replica see every write
//! once, in revision order; writers through several replicas leave no gap; a replica killed with
//! SIGKILL loses nothing its watchers cannot resume on another.

mod common;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Instant;

use common::{WAIT, Watch};
use pasa_proto::store::v1::store_client::StoreClient;
use pasa_proto::store::v1::{
    ApplyRequest, Event, ListRequest, Rule, Subscription, WatchCreate, WatchRequest, watch_request,
    watch_response,
};
use pasa_tikv::fake::FakeTikv;
use serde_json::json;
use tokio::process::Child;
use tonic::transport::Channel;

/// Writes refused as contended, across the tests of this file.
static CONTENDED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

struct Replica {
    child: Child,
    addr: String,
}

impl Replica {
    /// Starts `pasa-store --backend tikv` and waits for its ready line.
    async fn start(pd: &str) -> Replica {
        let (child, addr) =
            common::start_process(["--backend", "tikv", "--pd", pd, "--key-prefix", "replicas/"])
                .await;
        Replica { child, addr }
    }

    async fn client(&self) -> StoreClient<Channel> {
        StoreClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect")
    }
}

fn dr(name: &str, counter: u64) -> serde_json::Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
           "metadata": {"name": name, "namespace": "replicas",
                        "annotations": {"counter": counter.to_string()}},
           "spec": {"host": format!("{name}.replicas.svc.cluster.local")}})
}

/// Applies; returns (name, revision) of each object written.
async fn write(
    client: &mut StoreClient<Channel>,
    docs: &[serde_json::Value],
) -> Vec<(String, u64)> {
    let r = client
        .apply(ApplyRequest {
            documents: docs.iter().map(common::doc).collect(),
            dry_run: false,
        })
        .await
        .expect("apply")
        .into_inner();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    r.results
        .into_iter()
        .map(|res| (res.r#ref.unwrap_or_default().name, res.revision))
        .collect()
}

/// Reads events until revision `head` has been delivered.
async fn events_until(w: &mut Watch, head: u64) -> Vec<Event> {
    let mut events = Vec::new();
    while w.last_revision < head {
        if let Some(watch_response::Response::Events(b)) = w.next().await.response {
            events.extend(b.events);
        }
    }
    events
}

fn everything() -> Subscription {
    Subscription {
        rules: vec![Rule::default()],
    }
}

/// Every acknowledged write is in the list `client` gets, at its revision or later; returns how
/// many objects the list holds.
async fn assert_acknowledged_present(
    client: &mut StoreClient<Channel>,
    acked: &BTreeMap<String, u64>,
) -> usize {
    let listed = client
        .list(ListRequest::default())
        .await
        .unwrap()
        .into_inner();
    let stored: BTreeMap<String, u64> = listed
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.mod_revision))
        .collect();
    for (name, revision) in acked {
        let at = stored
            .get(name)
            .unwrap_or_else(|| panic!("acknowledged {name} is missing"));
        assert!(
            at >= revision,
            "{name}: acknowledged at {revision}, stored at {at}"
        );
    }
    stored.len()
}

fn revisions(events: &[Event]) -> Vec<u64> {
    events.iter().map(|e| e.revision).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_through_one_replica_reaches_watchers_on_every_replica_once_in_order() {
    let fake = FakeTikv::start((Ipv4Addr::LOCALHOST, 0).into()).unwrap();
    let a = Replica::start(&fake.pd_address()).await;
    let b = Replica::start(&fake.pd_address()).await;
    let mut on_a = Watch::open_raw(&mut a.client().await, everything(), 0).await;
    let mut on_b = Watch::open_raw(&mut b.client().await, everything(), 0).await;
    on_a.until_synced().await;
    on_b.until_synced().await;

    // How long an idle replica takes to notice another's commit: one write, timed.
    let mut writer = a.client().await;
    let started = Instant::now();
    let head = write(&mut writer, &[dr("first", 0)]).await[0].1;
    let first_on_b = events_until(&mut on_b, head).await;
    assert_eq!(revisions(&first_on_b), [head]);
    println!(
        "replicas: a write through A reached a watcher on idle B after {:?}",
        started.elapsed()
    );
    assert_eq!(revisions(&events_until(&mut on_a, head).await), [head]);

    for n in 1..=60 {
        let docs: Vec<_> = (0..1 + n % 3)
            .map(|i| dr(&format!("obj-{}", (n * 5 + i) % 17), n))
            .collect();
        write(&mut writer, &docs).await;
    }
    let head = writer
        .list(ListRequest::default())
        .await
        .unwrap()
        .into_inner()
        .revision;
    let from_a = events_until(&mut on_a, head).await;
    let from_b = events_until(&mut on_b, head).await;
    let expected: Vec<u64> = (2..=head).collect();
    assert_eq!(
        revisions(&from_a),
        expected,
        "A: every revision once, in order"
    );
    assert_eq!(
        revisions(&from_b),
        expected,
        "B: every revision once, in order"
    );
    let names = |events: &[Event]| -> Vec<(String, i32)> {
        events
            .iter()
            .map(|e| (e.resource.as_ref().unwrap().name.clone(), e.r#type))
            .collect()
    };
    assert_eq!(
        names(&from_a),
        names(&from_b),
        "both replicas tell the same story"
    );
    // Both answer reads at the same head.
    let listed_b = b
        .client()
        .await
        .list(ListRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed_b.revision, head);
    println!("replicas: {head} revisions delivered once, in order, on both replicas");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_through_two_replicas_leave_no_gap_and_lose_nothing() {
    let fake = FakeTikv::start((Ipv4Addr::LOCALHOST, 0).into()).unwrap();
    let a = Replica::start(&fake.pd_address()).await;
    let b = Replica::start(&fake.pd_address()).await;
    let mut writers = Vec::new();
    for (replica, tag) in [(&a, "a"), (&b, "b")] {
        let mut client = replica.client().await;
        let tag = tag.to_string();
        writers.push(tokio::spawn(async move {
            let mut acked = BTreeMap::new();
            for n in 1..=80u64 {
                // Names shared between the writers, so they also change each other's objects.
                let docs = vec![
                    dr(&format!("shared-{}", n % 13), n),
                    dr(&format!("{tag}-{n}"), n),
                ];
                for (name, revision) in write(&mut client, &docs).await {
                    acked.insert(name, revision);
                }
            }
            acked
        }));
    }
    let mut acked: BTreeMap<String, u64> = BTreeMap::new();
    for w in writers {
        for (name, revision) in w.await.unwrap() {
            let e = acked.entry(name).or_default();
            *e = (*e).max(revision);
        }
    }
    let head = acked.values().copied().max().unwrap();
    for replica in [&a, &b] {
        let mut client = replica.client().await;
        // A replica answers from what it has followed so far: read its log until the last
        // acknowledged write, then its list.
        let mut w = Watch::open_raw(&mut client, everything(), 1).await;
        let events = events_until(&mut w, head).await;
        assert_eq!(
            revisions(&events),
            (1..=head).collect::<Vec<_>>(),
            "no gap in the change log"
        );
        let objects = assert_acknowledged_present(&mut client, &acked).await;
        println!(
            "replicas: concurrent writers through two replicas, head {head}, {objects} objects, \
             no gap; {} writes refused as contended and sent again",
            CONTENDED.load(std::sync::atomic::Ordering::Relaxed)
        );
    }
    assert_eq!(fake.locked_keys(), 0, "no transaction left unfinished");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_of_a_replica_killed_with_sigkill_resume_on_another_losing_nothing() {
    let fake = FakeTikv::start((Ipv4Addr::LOCALHOST, 0).into()).unwrap();
    let mut a = Replica::start(&fake.pd_address()).await;
    let b = Replica::start(&fake.pd_address()).await;

    // A watcher on A, reading raw so the stream's end is seen.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(WatchRequest {
        request: Some(watch_request::Request::Create(WatchCreate {
            subscription: Some(everything()),
            from_revision: 1,
            identity: None,
        })),
    })
    .await
    .unwrap();
    let mut stream = a
        .client()
        .await
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();

    // A writer through B throughout; A is killed once the watcher has seen some of it.
    let mut writer = b.client().await;
    let writing = tokio::spawn(async move {
        let mut last = 0;
        for n in 1..=150u64 {
            last = write(&mut writer, &[dr(&format!("obj-{}", n % 23), n)]).await[0].1;
        }
        last
    });
    let mut seen: Vec<u64> = Vec::new();
    let mut killed = false;
    // The stream ends (or errs) when A dies.
    while let Ok(Some(msg)) = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("a message in time")
    {
        if let Some(watch_response::Response::Events(batch)) = msg.response {
            seen.extend(batch.events.iter().map(|e| e.revision));
        }
        if !killed && seen.len() >= 40 {
            a.child.start_kill().expect("SIGKILL");
            killed = true;
        }
    }
    assert!(killed, "the stream ended before the kill");
    let _ = a.child.wait().await;
    let resume_from = seen.last().copied().unwrap_or(0) + 1;
    let head = writing.await.unwrap();
    let mut on_b = Watch::open_raw(&mut b.client().await, everything(), resume_from).await;
    let rest = events_until(&mut on_b, head).await;
    seen.extend(revisions(&rest));
    assert_eq!(
        seen,
        (1..=head).collect::<Vec<_>>(),
        "every revision once, across the kill"
    );
    println!(
        "replicas: watcher killed on A after {} revisions, resumed on B from {resume_from}, {head} in all",
        resume_from - 1
    );
}

/// Opens a report stream to `replica` for one proxy, as an agent does; the stream stays open
/// while the returned sender lives.
async fn report(
    replica: &Replica,
    node: &str,
    pod: &str,
) -> tokio::sync::mpsc::Sender<pasa_proto::store::v1::ReportStatusRequest> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pasa_proto::store::v1::ReportStatusRequest {
        status: Some(pasa_proto::store::v1::ProxyStatus {
            node_id: node.into(),
            pod_name: pod.into(),
            namespace: "replicas".into(),
            ..Default::default()
        }),
    })
    .await
    .unwrap();
    let mut client = replica.client().await;
    tokio::spawn(async move {
        let _ = client
            .report_status(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await;
    });
    tx
}

async fn proxies(replica: &Replica, local_only: bool) -> Vec<String> {
    let mut client = replica.client().await;
    let answer = pasa_proto::client::list_proxy_status(
        &mut client,
        pasa_proto::store::v1::ListProxyStatusRequest {
            local_only,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    answer
        .proxies
        .iter()
        .filter_map(|p| p.status.as_ref().map(|s| s.pod_name.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_status_asked_of_one_replica_answers_for_every_replica() {
    let fake = FakeTikv::start((Ipv4Addr::LOCALHOST, 0).into()).unwrap();
    let a = Replica::start(&fake.pd_address()).await;
    let b = Replica::start(&fake.pd_address()).await;
    let _cart = report(
        &a,
        "sidecar~10.0.0.1~cart-1.replicas~replicas.svc.cluster.local",
        "cart-1",
    )
    .await;
    let _shop = report(
        &b,
        "sidecar~10.0.0.2~shop-1.replicas~replicas.svc.cluster.local",
        "shop-1",
    )
    .await;
    // Replicas announce themselves as they start; wait (bounded) until each knows the other.
    let deadline = Instant::now() + WAIT;
    loop {
        let (on_a, on_b) = (proxies(&a, false).await, proxies(&b, false).await);
        if on_a == ["cart-1", "shop-1"] && on_b == on_a {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "A lists {on_a:?}, B lists {on_b:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        proxies(&a, true).await,
        ["cart-1"],
        "local_only: A's own agents"
    );
    assert_eq!(
        proxies(&b, true).await,
        ["shop-1"],
        "local_only: B's own agents"
    );
}

/// A replica on the fake, in this process.
fn replica_in_process(pd: &str, config: pasa_store::StoreConfig) -> pasa_store::Store {
    let backend = pasa_store::backend::tikv::TikvBackend::connect(
        &[pd.to_string()],
        "compaction/",
        std::time::Duration::from_secs(5),
    )
    .unwrap();
    pasa_store::Store::open(
        std::sync::Arc::new(backend),
        config,
        pasa_store::metrics::Metrics::new(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_fell_behind_the_compacted_log_rebuilds_from_the_backend() {
    let fake = FakeTikv::start((Ipv4Addr::LOCALHOST, 0).into()).unwrap();
    let config = pasa_store::StoreConfig {
        log_retention: 4,
        ..Default::default()
    };
    let a = replica_in_process(&fake.pd_address(), config.clone());
    // B does not follow on its own for the length of the test: it hears of A's writes only
    // when it writes itself, long after A compacted them away.
    let b = replica_in_process(
        &fake.pd_address(),
        pasa_store::StoreConfig {
            tail_interval: std::time::Duration::from_secs(3600),
            ..config
        },
    );
    for n in 0..30 {
        a.apply(vec![common::doc(&dr(&format!("obj-{}", n % 7), n))], false)
            .await
            .unwrap();
    }
    let compacted = a.status().compact_revision;
    assert!(compacted > 0, "A compacted its log");
    assert_eq!(b.revision(), 0, "B has not followed");
    let selector = pasa_store::selector::Selector::everything();
    let names = |objects: &[std::sync::Arc<pasa_proto::store::v1::Resource>]| -> Vec<String> {
        objects.iter().map(|r| r.name.clone()).collect()
    };
    let (before, _) = a.list(&selector, 0).await.unwrap();

    let written = b
        .apply(vec![common::doc(&dr("from-b", 0))], false)
        .await
        .unwrap();
    assert!(written.errors.is_empty(), "{:?}", written.errors);
    assert_eq!(written.revision, 31, "B wrote after everything A wrote");
    let (on_b, head) = b.list(&selector, 0).await.unwrap();
    assert_eq!(head, 31);
    let mut expected = names(&before);
    expected.push("from-b".into());
    expected.sort();
    let mut got = names(&on_b);
    got.sort();
    assert_eq!(got, expected, "B holds A's objects and its own");
    assert!(b.status().compact_revision >= compacted);
    a.shutdown();
    b.shutdown();
}

#[test]
fn an_unreachable_pd_stops_pasa_store_within_seconds_naming_it() {
    let free = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let started = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pasa-store"))
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--backend", "tikv", "--pd", &free, "--tikv-timeout", "2s"])
        .output()
        .unwrap();
    let took = started.elapsed();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(took < std::time::Duration::from_secs(10), "took {took:?}");
    assert!(said.contains("PD") && said.contains(&free), "{said}");
    assert!(!said.contains("panicked"), "{said}");
    let error = said
        .lines()
        .find(|l| l.starts_with("Error:"))
        .unwrap_or_default();
    println!("replicas: unreachable PD refused in {took:?}: {error}");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pasa-store"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--backend",
            "tikv",
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("--pd"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_while_writing_leaves_locks_that_the_other_resolves() {
    let fake = FakeTikv::start((Ipv4Addr::LOCALHOST, 0).into()).unwrap();
    // A dead writer's locks expire after a second here, not tikv-client's 20 s.
    fake.cap_lock_ttl(std::time::Duration::from_secs(1));
    let mut a = Replica::start(&fake.pd_address()).await;
    let b = Replica::start(&fake.pd_address()).await;

    // Writes through A, without pause, until A dies; A is killed mid-stream.
    let mut through_a = a.client().await;
    let (acked_tx, mut acked_rx) = tokio::sync::mpsc::unbounded_channel();
    let writing = tokio::spawn(async move {
        for n in 1.. {
            let docs = [
                dr(&format!("obj-{}", n % 11), n),
                dr(&format!("new-{n}"), n),
            ];
            let answer = through_a
                .apply(ApplyRequest {
                    documents: docs.iter().map(common::doc).collect(),
                    dry_run: false,
                })
                .await;
            match answer {
                Ok(r) => {
                    for res in r.into_inner().results {
                        let _ = acked_tx.send((res.r#ref.unwrap_or_default().name, res.revision));
                    }
                }
                Err(_) => return,
            }
        }
    });
    let mut acked: BTreeMap<String, u64> = BTreeMap::new();
    while acked.len() < 20 {
        let (name, revision) = acked_rx.recv().await.expect("writes through A");
        acked.insert(name, revision);
    }
    // The kill lands while A holds locks: the fake shows them.
    let deadline = Instant::now() + WAIT;
    while fake.locked_keys() == 0 {
        assert!(Instant::now() < deadline, "A never held a lock");
        tokio::task::yield_now().await;
    }
    a.child.start_kill().expect("SIGKILL");
    let _ = a.child.wait().await;
    writing.await.unwrap();
    while let Ok((name, revision)) = acked_rx.try_recv() {
        acked.insert(name, revision);
    }
    let left = fake.locked_keys();

    // B writes once A's locks expire, and holds every write A acknowledged, with no gap.
    let started = Instant::now();
    let head = write(&mut b.client().await, &[dr("after-a", 0)]).await[0].1;
    let took = started.elapsed();
    let mut w = Watch::open_raw(&mut b.client().await, everything(), 1).await;
    let events = events_until(&mut w, head).await;
    assert_eq!(
        revisions(&events),
        (1..=head).collect::<Vec<_>>(),
        "no gap in the change log"
    );
    assert_acknowledged_present(&mut b.client().await, &acked).await;
    println!(
        "replicas: A killed while writing left {left} keys locked; B's next write took {took:?} \
         (head {head}, {} acknowledged writes present)",
        acked.len()
    );
}
