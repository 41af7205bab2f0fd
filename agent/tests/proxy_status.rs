//! `pasactl proxy-status` over real agents: a real store, three real `pasa-agent` processes, each
//! with a fake Envoy (an in-process ADS client) on its socket, and what the store answers shown
//! through pasactl's own table and detail page. One fake Envoy ACKs everything, one NACKs its
//! listeners, and the third agent reaches the store through a relay the test cuts (a fake network
//! partition): it keeps serving its cache, degraded, and the store sees its reports stop.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::agent::{Agent, WAIT};
use common::store::StoreServer;
use common::{CDS, FakeSotwClient, LDS};
use envoy_types::pb::envoy::config::core::v3::Node;
use pasa_agent::resource::TypeKind;
use pasa_proto::store::v1::{ListProxyStatusRequest, ListProxyStatusResponse};
use pasa_store::StoreConfig;
use pasactl::cli::proxy_status::{detail, table};
use pasactl::cli::x::wait::lacking;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const CART: &str = "sidecar~10.0.0.11~cart-1.shop~shop.svc.cluster.local";
const WEB: &str = "sidecar~10.0.0.12~web-1.shop~shop.svc.cluster.local";
const PAY: &str = "sidecar~10.0.0.13~pay-1.shop~shop.svc.cluster.local";

/// Quick reports, so the test does not wait for the production defaults.
const REPORT_FLAGS: [&str; 4] = ["--status-interval", "100ms", "--status-heartbeat", "2s"];

/// A TCP relay in front of the store that the test can cut: every open connection is closed and
/// new ones are refused, as a network partition would look to the agent behind it.
struct FakeNetworkPartition {
    addr: SocketAddr,
    cut: Arc<Mutex<bool>>,
    open: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl FakeNetworkPartition {
    async fn start(to: SocketAddr) -> FakeNetworkPartition {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(Mutex::new(false));
        let open: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (cut_flag, conns) = (Arc::clone(&cut), Arc::clone(&open));
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if *cut_flag.lock().unwrap() {
                    drop(inbound);
                    continue;
                }
                conns.lock().unwrap().push(tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                }));
            }
        });
        FakeNetworkPartition {
            addr,
            cut,
            open,
            accept,
        }
    }

    /// Closes every relayed connection and refuses new ones.
    fn cut(&self) {
        *self.cut.lock().unwrap() = true;
        for conn in self.open.lock().unwrap().drain(..) {
            conn.abort();
        }
    }
}

impl Drop for FakeNetworkPartition {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

fn node(id: &str) -> Node {
    Node {
        id: id.into(),
        ..Default::default()
    }
}

/// A fake Envoy on the agent's socket: asks for clusters and listeners and ACKs every response,
/// except listeners when `nack_listeners` (then it NACKs them with an error, as Envoy does when
/// it rejects a listener). Runs until dropped.
async fn fake_envoy(agent: &Agent, node_id: &str, nack_listeners: bool) -> JoinHandle<()> {
    let mut client = FakeSotwClient::connect(&agent.uds, node(node_id)).await;
    client.request(CDS, &[], "", "").await;
    client.request(LDS, &[], "", "").await;
    tokio::spawn(async move {
        let mut accepted: BTreeMap<String, String> = BTreeMap::new();
        while let Some(response) = client.next().await {
            let kind = TypeKind::from_type_url(&response.type_url);
            if nack_listeners && kind == Some(LDS) {
                let last_good = accepted
                    .get(&response.type_url)
                    .cloned()
                    .unwrap_or_default();
                client.nack(&response, &last_good, &[]).await;
            } else {
                accepted.insert(response.type_url.clone(), response.version_info.clone());
                client.ack(&response, &[]).await;
            }
        }
    })
}

async fn list(store: SocketAddr) -> ListProxyStatusResponse {
    let mut client = pasa_proto::client::store_client(
        pasa_proto::client::endpoint(&store.to_string())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    pasa_proto::client::list_proxy_status(&mut client, ListProxyStatusRequest::default())
        .await
        .unwrap()
}

/// Polls the store's proxy list until `ok` holds (guarded by `WAIT`); returns `pasactl
/// proxy-status`'s table of it and the answer.
async fn until(
    store: SocketAddr,
    what: &str,
    ok: impl Fn(&str) -> bool,
) -> (String, ListProxyStatusResponse) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let answer = list(store).await;
        let text = table(&answer);
        if ok(&text) {
            return (text, answer);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; last table:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The cells of the table row of `name`.
fn row(text: &str, name: &str) -> Vec<String> {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no row {name} in\n{text}"));
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect()
}

fn row_is(text: &str, name: &str, states: [&str; 5], degraded: &str) -> bool {
    text.lines().any(|l| l.starts_with(&format!("{name} ")))
        && row(text, name)[2..7] == states
        && row(text, name)[9].starts_with(degraded)
}

const SYNCED: [&str; 5] = ["SYNCED", "SYNCED", "NOT SENT", "NOT SENT", "NOT SENT"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_status_shows_synced_nacking_and_degraded_agents() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreServer::start(&dir.path().join("db"), 0).await;
    store
        .apply_rule("cart", "cart.shop.svc.cluster.local")
        .await;
    let partition = FakeNetworkPartition::start(store.addr).await;

    let start = |node_id: &str, server: SocketAddr, name: &str| {
        let home = dir.path().join(name);
        std::fs::create_dir_all(home.join("cache")).unwrap();
        Agent::start_with(node_id, server, &home, &home.join("cache"), &REPORT_FLAGS)
    };
    let cart = start(CART, store.addr, "cart");
    let web = start(WEB, store.addr, "web");
    let pay = start(PAY, partition.addr, "pay");
    let _cart_envoy = fake_envoy(&cart, CART, false).await;
    let _web_envoy = fake_envoy(&web, WEB, true).await;
    let _pay_envoy = fake_envoy(&pay, PAY, false).await;

    // Every proxy listed by namespace and name; the NACKed listeners are STALE, never ACKed.
    let (text, answer) = until(store.addr, "three reporting proxies", |t| {
        row_is(t, "cart-1.shop", SYNCED, "no")
            && row_is(t, "pay-1.shop", SYNCED, "no")
            && row_is(
                t,
                "web-1.shop",
                [
                    "SYNCED",
                    "STALE (Never Acknowledged)",
                    "NOT SENT",
                    "NOT SENT",
                    "NOT SENT",
                ],
                "no",
            )
    })
    .await;
    let names: Vec<&str> = text
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, ["cart-1.shop", "pay-1.shop", "web-1.shop"], "{text}");
    let header = row(&text, "NAME");
    assert_eq!(
        header,
        [
            "NAME", "TYPE", "CDS", "LDS", "EDS", "RDS", "ECDS", "REVISION", "LAG", "DEGRADED",
            "VERSION"
        ]
    );
    for name in ["cart-1.shop", "web-1.shop", "pay-1.shop"] {
        let cells = row(&text, name);
        assert_eq!(cells[1], "sidecar", "{text}");
        assert_eq!(
            cells[7],
            answer.revision.to_string(),
            "applied revision: {text}"
        );
        assert_eq!(cells[8], "0", "lag: {text}");
        assert_eq!(cells[10], env!("CARGO_PKG_VERSION"), "{text}");
    }

    // The detail page of the NACKing proxy shows the error its Envoy sent.
    let web_entry = answer
        .proxies
        .iter()
        .find(|e| e.status.as_ref().is_some_and(|s| s.node_id == WEB))
        .unwrap();
    let page = detail(web_entry, &answer, now_ms());
    assert!(page.contains(&format!("NODE        {WEB}")), "{page}");
    assert!(
        page.lines()
            .any(|l| l.starts_with("LAST NACK   LDS rejected version")
                && l.ends_with("ago: fake client rejects this")),
        "{page}"
    );
    assert!(page.contains("CONTACT     reporting"), "{page}");
    assert!(page.contains("SCOPE       eager"), "{page}");
    assert!(page.contains(&format!("admin {}", web.admin)), "{page}");

    // `pasactl x wait`: the store's revision reached the proxies that acknowledged it, not the
    // one whose Envoy refused its listeners; a later revision reached none yet.
    let reached = |node_id: &str, revision: u64| {
        let entry = answer
            .proxies
            .iter()
            .find(|e| e.status.as_ref().is_some_and(|s| s.node_id == node_id))
            .unwrap();
        lacking(entry, revision)
    };
    assert_eq!(reached(CART, answer.revision), None);
    assert_eq!(
        reached(WEB, answer.revision).as_deref(),
        Some("LDS not acknowledged")
    );
    assert_eq!(
        reached(CART, answer.revision + 1),
        Some(format!("at revision {}", answer.revision))
    );

    // The partition: the third agent keeps serving its cache, degraded, and the store hears no
    // more from it.
    partition.cut();
    let (text, answer) = until(store.addr, "the partitioned agent lost", |t| {
        row_is(t, "pay-1.shop", SYNCED, "lost contact")
    })
    .await;
    assert!(row_is(&text, "cart-1.shop", SYNCED, "no"), "{text}");
    pay.until("/sync_status", "the agent degraded", |_, body| {
        serde_json::from_str::<serde_json::Value>(body)
            .is_ok_and(|status| status["store"]["state"] == "Degraded")
    })
    .await;
    let pay_entry = answer
        .proxies
        .iter()
        .find(|e| e.status.as_ref().is_some_and(|s| s.node_id == PAY))
        .unwrap();
    let page = detail(pay_entry, &answer, now_ms());
    assert!(page.contains("CONTACT     lost contact"), "{page}");
    assert!(page.contains("LAST NACK   none"), "{page}");
    assert!(
        lacking(pay_entry, answer.revision).is_some_and(|why| why.starts_with("lost contact")),
        "{page}"
    );

    drop(partition);
    store.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_agent_expires() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        proxy_status_expiry: Duration::from_millis(500),
        ..StoreConfig::default()
    };
    let store = StoreServer::start_with(&dir.path().join("db"), 0, config).await;
    let cache = dir.path().join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let agent = Agent::start_with(CART, store.addr, dir.path(), &cache, &REPORT_FLAGS);
    until(store.addr, "the agent reporting", |t| {
        t.lines().any(|l| l.starts_with("cart-1.shop "))
    })
    .await;
    // Killed: no goodbye, so the store keeps it as lost contact until the expiry.
    drop(agent);
    let (text, answer) = until(store.addr, "the agent expired", |t| t.lines().count() == 1).await;
    assert!(answer.proxies.is_empty(), "{text}");
    store.stop().await;
}

/// An agent stopped cleanly (SIGTERM) says goodbye and leaves `pasactl proxy-status` at once;
/// one that is killed stays, as lost contact, until the store's expiry (five minutes here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_agent_leaves_proxy_status_at_once_and_a_killed_one_stays() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreServer::start(&dir.path().join("db"), 0).await;
    let start = |node_id: &str, name: &str| {
        let home = dir.path().join(name);
        std::fs::create_dir_all(home.join("cache")).unwrap();
        Agent::start_with(
            node_id,
            store.addr,
            &home,
            &home.join("cache"),
            &REPORT_FLAGS,
        )
    };
    let cart = start(CART, "cart");
    let web = start(WEB, "web");
    let has = |t: &str, name: &str| t.lines().any(|l| l.starts_with(&format!("{name} ")));
    until(store.addr, "both agents reporting", |t| {
        has(t, "cart-1.shop") && has(t, "web-1.shop")
    })
    .await;

    cart.terminate();
    let (text, _) = until(store.addr, "the stopped agent gone", |t| {
        !has(t, "cart-1.shop")
    })
    .await;
    assert!(row(&text, "web-1.shop")[9].starts_with("no"), "{text}");

    drop(web);
    let (text, _) = until(store.addr, "the killed agent lost", |t| {
        has(t, "web-1.shop") && row(t, "web-1.shop")[9].starts_with("lost contact")
    })
    .await;
    assert!(!has(&text, "cart-1.shop"), "{text}");
    store.stop().await;
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
