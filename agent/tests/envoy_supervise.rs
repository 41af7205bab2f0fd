//! `pasa-agent --envoy`: the agent runs Envoy as its child, as pilot-agent does. With the real
//! binary and real Envoy (in a network namespace of its own: `--envoy` is given a one-line
//! wrapper that enters it, and Envoy's admin is a Unix socket the agent reaches):
//!
//! - `/healthz/ready` turns 200 once Envoy says it is ready and holds the agent's configuration;
//! - a rotated workload certificate (`--cert-dir` rewritten) reaches Envoy over SDS;
//! - an Envoy that dies is started again (the readiness comes back);
//! - SIGTERM drains Envoy's listeners for `--drain-duration`, stops Envoy, and the agent exits
//!   with Envoy's status (0), leaving no Envoy behind.
//!
//! Needs `envoy` and root; says loudly when it skipped.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::envoy::{self, Netns, WAIT, envoy_binary};
use common::sidecar;
use common::store::StoreServer;
use serde_json::json;

const NODE: &str = "sidecar~10.10.0.1~web-1.shop~shop.svc.cluster.local";

/// The pids in `netns` (`ip netns pids`).
fn pids(netns: &Netns) -> Vec<u32> {
    let out = std::process::Command::new("ip")
        .args(["netns", "pids", &netns.name])
        .output()
        .expect("ip netns pids");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

async fn until_ready(agent: &Agent, what: &str) {
    agent
        .until("/healthz/ready", what, |code, _| code == 200)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_runs_envoy_restarts_it_and_drains_it() {
    if envoy::skip_without_envoy("the_agent_runs_envoy_restarts_it_and_drains_it") {
        return;
    }
    let data = tempfile::tempdir().expect("temporary directory");
    let store = StoreServer::start(&data.path().join("db"), 0).await;
    store
        .apply(&[json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
                        "metadata": {"name": "web", "namespace": "shop"},
                        "spec": {"addresses": ["10.96.7.1"],
                                 "ports": [{"name": "http", "port": 80}],
                                 "endpoints": [{"address": "10.10.0.1", "labels": {"app": "web"}}]}})])
        .await;
    let certs = data.path().join("certs");
    sidecar::workload_certificate(&certs, &sidecar::ca(), "web");

    let netns = Netns::create();
    let wrapper = data.path().join("envoy-in-netns");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec ip netns exec {} {} \"$@\"\n",
            netns.name,
            envoy_binary().expect("envoy").display()
        ),
    )
    .expect("write the wrapper");
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let admin = format!("unix:{}", data.path().join("envoy-admin.sock").display());
    let agent = Agent::start_in(
        NODE,
        store.addr,
        &data.path().join("agent"),
        &[
            "--labels",
            "app=web",
            "--cert-dir",
            certs.to_str().expect("UTF-8"),
            "--envoy",
            wrapper.to_str().expect("UTF-8"),
            "--envoy-admin",
            &admin,
            "--drain-duration",
            "1s",
            "--credential-poll",
            "100ms",
        ],
    );
    until_ready(&agent, "Envoy ready with the agent's configuration").await;

    // The workload certificate rotates (istio-csr or SPIRE rewrite the files): Envoy gets it.
    let admin_socket = data.path().join("envoy-admin.sock");
    let sds_updates = || async {
        let stream = tokio::net::UnixStream::connect(&admin_socket)
            .await
            .expect("Envoy's admin socket");
        let (_, stats) = common::envoy::http_exchange(stream, "GET", "/stats?filter=^sds.default")
            .await
            .expect("Envoy's stats");
        stats
            .lines()
            .find_map(|l| l.strip_prefix("sds.default.update_success: "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = sds_updates().await;
    assert!(before >= 1, "Envoy got the workload certificate over SDS");
    sidecar::workload_certificate(&certs, &sidecar::ca(), "web");
    let deadline = Instant::now() + WAIT;
    while sds_updates().await <= before {
        assert!(
            Instant::now() < deadline,
            "the rotated certificate never reached Envoy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("a rotated workload certificate reached Envoy over SDS");

    let first = pids(&netns);
    assert_eq!(first.len(), 1, "one Envoy in its namespace: {first:?}");
    println!("Envoy {} ready", first[0]);

    // Envoy dies: the agent starts it again.
    std::process::Command::new("kill")
        .args(["-KILL", &first[0].to_string()])
        .status()
        .expect("kill");
    let deadline = Instant::now() + WAIT;
    let second = loop {
        let now = pids(&netns);
        if now.len() == 1 && now[0] != first[0] {
            break now[0];
        }
        assert!(
            Instant::now() < deadline,
            "Envoy was not started again: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    until_ready(&agent, "the new Envoy ready").await;
    println!("Envoy {second} started again and ready");

    // SIGTERM: drain, stop Envoy, exit 0.
    let terminated = Instant::now();
    agent.terminate();
    let took = terminated.elapsed();
    println!("SIGTERM to exit: {} ms (drain 1 s)", took.as_millis());
    assert!(
        took >= Duration::from_secs(1),
        "drained for --drain-duration: {took:?}"
    );
    assert!(
        took < Duration::from_secs(8),
        "stopped promptly after draining: {took:?}"
    );
    assert!(pids(&netns).is_empty(), "no Envoy left: {:?}", pids(&netns));
    store.stop().await;
}
