//! The `pasa-agent` binary end to end: a real store on loopback, the agent following it, a fake
//! xDS client on its socket, and its admin endpoint; then degraded mode from the saved cache.

mod common;

use std::process::Command;

use common::agent::{Agent, NODE_ID};
use common::store::StoreServer;
use common::*;
use serde_json::Value;

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

fn store_state(body: &str) -> String {
    json(body)["store"]["state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_reports_and_survives_the_store_going_away() {
    let data = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let store = StoreServer::start(data.path(), 0).await;
    let port = store.addr.port();
    store.apply_rule("cart", "cart").await;

    let agent = Agent::start(store.addr, run.path(), cache.path());
    assert_eq!(agent.get("/healthz").await.0, 200);
    // The watch is synced, then the first translation is published with its revision.
    agent
        .until("/sync_status", "Synced and translated", |_, b| {
            store_state(b) == "Synced" && json(b)["revision"].as_u64().unwrap_or(0) > 0
        })
        .await;
    let (code, metrics) = agent.get("/metrics").await;
    assert_eq!(code, 200);
    // Push-to-ACK times and NACK counts appear with their first observation, per type.
    // Translated at least once (the first answer only tells the agent its scope; the store's
    // answer to the widened subscription is translated again).
    assert!(
        metrics.lines().any(|l| l
            .strip_prefix("pasa_agent_translation_seconds_count ")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .is_some_and(|n| n >= 1.0)),
        "{metrics}"
    );
    for name in [
        "pasa_agent_xds_connections 0",
        "pasa_agent_store_revision",
        "pasa_agent_degraded 0",
        "pasa_agent_resources{type=\"CDS\",generator=\"envoy\"}",
    ] {
        assert!(metrics.contains(name), "{name} missing:\n{metrics}");
    }
    let (code, reason) = agent.get("/readyz").await;
    assert_eq!(code, 503, "not ready without a client: {reason}");
    assert!(reason.contains("no xDS client"), "{reason}");

    // A client subscribes to every cluster and ACKs: ready, and SYNCED in the status.
    let mut client = FakeSotwClient::connect(&agent.uds, node()).await;
    client.request(CDS, &[], "", "").await;
    let r = client.recv().await;
    assert_eq!(kind_of(&r.type_url), CDS);
    client.ack(&r, &[]).await;
    agent.until("/readyz", "ready", |code, _| code == 200).await;
    let status = json(&agent.get("/sync_status").await.1);
    let conn = &status["connections"][0];
    assert_eq!(
        conn["node"],
        "sidecar~10.0.0.1~fake.default~default.svc.cluster.local"
    );
    assert_eq!(conn["generator"], "envoy");
    assert_eq!(conn["protocol"], "SotW");
    assert_eq!(conn["types"]["CDS"]["state"], "SYNCED");
    assert_eq!(
        conn["types"]["CDS"]["version_acked"],
        r.version_info.as_str()
    );
    assert_eq!(conn["types"]["LDS"]["state"], "NOT SENT");
    let dump = json(&agent.get("/config_dump").await.1);
    assert!(dump["generators"]["envoy"]["CDS"].is_array(), "{dump}");
    assert_eq!(agent.get("/config_dump?format=debug").await.0, 200);

    // The store goes away: degraded, still serving, and the reconnects are counted by reason.
    store.stop().await;
    agent
        .until("/sync_status", "Degraded", |_, b| {
            store_state(b) == "Degraded"
        })
        .await;
    agent
        .until("/metrics", "an unreachable store counted", |_, m| {
            m.contains("pasa_agent_store_reconnects_total{reason=\"unreachable\"}")
        })
        .await;
    let uds = agent.uds.clone();
    agent.terminate();
    assert!(!uds.exists(), "the socket is removed on shutdown");

    // Restarted without a store: serves the saved cache at once, degraded.
    let agent = Agent::start(store_addr(port), run.path(), cache.path());
    let status = json(&agent.get("/sync_status").await.1);
    assert_eq!(status["store"]["state"], "Degraded", "{status}");
    // Why: the saved cache is being served, or (once the first attempt failed) the store is
    // unreachable.
    let reason = status["store"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("saved") || reason.contains("cannot reach the store"),
        "{status}"
    );
    assert!(status["revision"].as_u64().unwrap() > 0, "{status}");
    let (_, metrics) = agent.get("/metrics").await;
    assert!(metrics.contains("pasa_agent_degraded 1"), "{metrics}");
    let mut client = FakeSotwClient::connect(&agent.uds, node()).await;
    client.request(CDS, &[], "", "").await;
    let r = client.recv().await;
    client.ack(&r, &[]).await;
    agent
        .until("/readyz", "ready while degraded", |code, _| code == 200)
        .await;

    // The store is back on the same address: the agent resumes and is synced.
    let store = StoreServer::start(data.path(), port).await;
    agent
        .until("/sync_status", "Synced again", |_, b| {
            store_state(b) == "Synced"
        })
        .await;
    agent.terminate();
    store.stop().await;
}

/// Next to Istio's injection, pilot-agent forwards its Envoy's xDS to the agent over loopback
/// TCP (Delta, plaintext): the same ADS is served there as on the Unix socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ads_is_also_served_on_a_loopback_tcp_address() {
    let data = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    let store = StoreServer::start(data.path(), 0).await;
    store.apply_rule("cart", "cart").await;
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let listen = format!("127.0.0.1:{port}");
    let agent = Agent::start_in(
        NODE_ID,
        store.addr,
        run.path(),
        &["--xds-listen", listen.as_str()],
    );
    let mut client = FakeDeltaClient::connect_tcp(listen.parse().unwrap(), node()).await;
    client.subscribe(CDS, &["*"], &[]).await;
    let r = client.recv().await;
    assert_eq!(kind_of(&r.type_url), CDS);
    assert!(!r.resources.is_empty(), "clusters served over TCP");
    drop(client);
    agent.terminate();

    // Anything but loopback is refused: this ADS has no TLS.
    let out = Command::new(env!("CARGO_BIN_EXE_pasa-agent"))
        .args(["--node-id", NODE_ID, "--xds-listen", "0.0.0.0:15011"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a loopback address"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Standalone-injected, kubelet probes the app through the agent's status listener: the
/// original probes (here a TCP probe of the store's port, open, and of a closed one) run
/// against the pod's address from the node ID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_probes_are_answered_on_the_status_listener() {
    let data = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    let store = StoreServer::start(data.path(), 0).await;
    let free = || {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let (status_port, closed) = (free(), free());
    let probers = serde_json::json!({
        "/app-health/app/livez": {"tcpSocket": {"port": store.addr.port()}},
        "/app-health/app/readyz": {"tcpSocket": {"port": closed}},
    })
    .to_string();
    let status = format!("127.0.0.1:{status_port}");
    let agent = Agent::start_in(
        "sidecar~127.0.0.1~app.default~default.svc.cluster.local",
        store.addr,
        run.path(),
        &[
            "--status-listen",
            status.as_str(),
            "--app-probers",
            probers.as_str(),
        ],
    );
    let addr: std::net::SocketAddr = status.parse().unwrap();
    let get = |path: &'static str| common::agent::http_get(addr, path);
    assert_eq!(get("/app-health/app/livez").await.0, 200);
    let (code, why) = get("/app-health/app/readyz").await;
    assert_eq!(code, 503, "{why}");
    assert!(why.contains(&format!("port {closed}")), "{why}");
    assert_eq!(get("/app-health/other/livez").await.0, 404);
    agent.terminate();
}

fn store_addr(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

#[test]
fn a_bad_node_id_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_pasa-agent"))
        .args([
            "--node-id",
            "sidecar~not-an-ip~x.ns~d",
            "--uds",
            "/nonexistent/x.sock",
        ])
        .output()
        .expect("run pasa-agent");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--node-id"), "{stderr}");
    assert!(stderr.contains("not an IP address"), "{stderr}");

    let out = Command::new(env!("CARGO_BIN_EXE_pasa-agent"))
        .output()
        .expect("run pasa-agent");
    assert_eq!(
        out.status.code(),
        Some(2),
        "a missing --node-id is a usage error"
    );
}

/// Translation runs under a budget: past it, the translation is counted (and logged) and its
/// result still served once done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_translation_past_its_budget_is_counted_and_still_served() {
    let data = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let store = StoreServer::start(data.path(), 0).await;
    store.apply_rule("cart", "cart").await;
    // A budget no translation meets.
    let agent = Agent::start_with(
        common::agent::NODE_ID,
        store.addr,
        run.path(),
        cache.path(),
        &["--translation-budget", "0s"],
    );
    agent
        .until("/sync_status", "Synced and translated", |_, b| {
            store_state(b) == "Synced" && json(b)["revision"].as_u64().unwrap_or(0) > 0
        })
        .await;
    let metrics = agent
        .until("/metrics", "a translation over budget counted", |_, m| {
            m.lines().any(|l| {
                l.strip_prefix("pasa_agent_translations_over_budget_total ")
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .is_some_and(|v| v >= 1.0)
            })
        })
        .await;
    assert!(
        metrics.contains("pasa_agent_resources{type=\"CDS\",generator=\"envoy\"}"),
        "the translation is served all the same:\n{metrics}"
    );
}

/// A store change is timed from the store's commit to the client's ACK of the push it caused
/// (`pasa_agent_propagation_seconds`, per type); the first snapshot, no commit, is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_is_timed_from_its_commit_to_the_clients_ack() {
    let data = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let store = StoreServer::start(data.path(), 0).await;
    store
        .apply(&[serde_json::json!({
            "apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
            "metadata": {"name": "cart", "namespace": "shop"},
            "spec": {"addresses": ["10.96.0.7"], "ports": [{"name": "http", "port": 80}],
                     "endpoints": [{"address": "10.10.0.7"}]}
        })])
        .await;
    let agent = Agent::start(store.addr, run.path(), cache.path());
    let cart = "outbound|80||cart.shop.svc.cluster.local";
    let mut client = FakeSotwClient::connect(&agent.uds, node()).await;
    client.request(CDS, &[], "", "").await;
    let first = client.recv().await;
    assert!(
        names(&first).iter().any(|n| n == cart),
        "{:?}",
        names(&first)
    );
    client.ack(&first, &[]).await;
    agent
        .until("/sync_status", "the first CDS ACKed", |_, b| {
            json(b)["connections"][0]["types"]["CDS"]["state"] == "SYNCED"
        })
        .await;
    let (_, metrics) = agent.get("/metrics").await;
    assert!(
        !metrics.contains("pasa_agent_propagation_seconds_count"),
        "the snapshot is no commit:\n{metrics}"
    );

    // A DestinationRule changes cart's cluster: one commit, one CDS push, one observation.
    store
        .apply(&[serde_json::json!({
            "apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": "cart", "namespace": "shop"},
            "spec": {"host": "cart.shop.svc.cluster.local",
                     "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 7}}}}
        })])
        .await;
    let pushed = client.recv().await;
    assert_eq!(kind_of(&pushed.type_url), CDS);
    assert_ne!(pushed.version_info, first.version_info);
    client.ack(&pushed, &[]).await;
    let metrics = agent
        .until("/metrics", "the change's propagation observed", |_, m| {
            m.contains("pasa_agent_propagation_seconds_count{type=\"CDS\"} 1")
        })
        .await;
    let sum: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("pasa_agent_propagation_seconds_sum{type=\"CDS\"} "))
        .and_then(|v| v.trim().parse().ok())
        .expect("a sum");
    assert!(
        sum > 0.0 && sum < 60.0,
        "from the commit, not the epoch: {sum}"
    );
}

/// The arguments of an agent for `NODE_ID` on the socket `uds`, with its cache in `cache` and
/// its admin endpoint on `admin`, following `server`.
fn agent_args<'a>(
    server: &'a str,
    uds: &'a std::path::Path,
    cache: &'a std::path::Path,
    admin: &'a str,
) -> Vec<&'a str> {
    vec![
        "--node-id",
        NODE_ID,
        "--server",
        server,
        "--uds",
        uds.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
        "--admin",
        admin,
    ]
}

/// A second agent given the socket a running agent serves refuses to start, naming the socket,
/// and leaves the first one serving on it; a socket file nothing answers on (left by an agent
/// that was killed) is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_on_a_served_socket_refuses_and_a_stale_socket_is_replaced() {
    let data = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    let store = StoreServer::start(data.path(), 0).await;
    store.apply_rule("cart", "cart").await;
    let first = Agent::start(store.addr, run.path(), &run.path().join("cache"));

    let server = store.addr.to_string();
    let other_cache = run.path().join("other-cache");
    let (status, stderr) = common::agent::run_to_exit(&agent_args(
        &server,
        &first.uds,
        &other_cache,
        "127.0.0.1:0",
    ));
    assert!(
        !status.success(),
        "the second agent exits non-zero: {stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{} is in use: another agent serves it",
            first.uds.display()
        )),
        "{stderr}"
    );
    // The first agent still serves its socket.
    let mut client = FakeSotwClient::connect(&first.uds, node()).await;
    client.request(CDS, &[], "", "").await;
    assert_eq!(kind_of(&client.recv().await.type_url), CDS);
    drop(client);
    let uds = first.uds.clone();
    first.terminate();
    assert!(!uds.exists(), "the first agent removes its socket");

    // A stale socket file (nothing listens on it): replaced, and served.
    drop(std::os::unix::net::UnixListener::bind(&uds).unwrap());
    assert!(uds.exists());
    let agent = Agent::start(store.addr, run.path(), &run.path().join("cache"));
    let mut client = FakeSotwClient::connect(&agent.uds, node()).await;
    client.request(CDS, &[], "", "").await;
    assert_eq!(kind_of(&client.recv().await.type_url), CDS);
    drop(client);
    agent.terminate();
    store.stop().await;
}

/// A start that fails on a port (the admin port in use) leaves no socket behind: the port is
/// bound before the socket, and a socket this process made goes with it.
#[test]
fn a_start_that_fails_on_the_admin_port_leaves_no_socket() {
    let run = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = taken.local_addr().unwrap().to_string();
    let uds = run.path().join("xds.sock");
    let cache = run.path().join("cache");
    let (status, stderr) =
        common::agent::run_to_exit(&agent_args("127.0.0.1:1", &uds, &cache, &admin));
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("binding the admin listener on {admin}")),
        "{stderr}"
    );
    assert!(!uds.exists(), "no socket left behind: {stderr}");
}

/// A store that hangs (stopped with SIGSTOP: its kernel still holds the connection open) is
/// noticed: with no message on the watch, not even the store's progress markers, for
/// `--store-liveness`, the agent is degraded and reconnects; once the store runs again the
/// agent is synced again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_store_leaves_the_agent_degraded_until_it_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(pasa_testing::workspace_binary("pasa-store", "pasa-store"))
        .arg("--data-dir")
        .arg(dir.path().join("db"))
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--progress-interval-secs", "1"])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start pasa-store");
    let lines = common::agent::line_channel(std::io::BufReader::new(
        child.stdout.take().expect("stdout"),
    ));
    let store = pasa_testing::Process::new("pasa-store", child);
    let addr = loop {
        let line = lines
            .recv_timeout(common::agent::WAIT)
            .expect("pasa-store's ready line");
        if let Some((grpc, _)) = pasa_store::server::parse_ready_line(&line) {
            break grpc;
        }
    };
    let signal = |name: &str| {
        let sent = Command::new("kill")
            .args([name, &store.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill {name}");
    };

    let run = tempfile::tempdir().unwrap();
    let agent = Agent::start_in(NODE_ID, addr, run.path(), &["--store-liveness", "2s"]);
    agent
        .until("/sync_status", "Synced", |_, b| store_state(b) == "Synced")
        .await;

    signal("-STOP");
    let status = agent
        .until("/sync_status", "Degraded by a hung store", |_, b| {
            store_state(b) == "Degraded"
        })
        .await;
    // Resumed before the assertions, so a failing one leaves nothing stopped (the store is
    // killed when `store` drops either way).
    signal("-CONT");
    let reason = json(&status)["store"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        reason.contains(&format!("the store at {addr} sent nothing for 2s")),
        "{status}"
    );
    agent
        .until("/metrics", "a silent store counted", |_, m| {
            m.contains("pasa_agent_store_reconnects_total{reason=\"silent\"}")
        })
        .await;
    agent
        .until("/sync_status", "Synced again", |_, b| {
            store_state(b) == "Synced"
        })
        .await;
    agent.terminate();
    store.terminate();
}
