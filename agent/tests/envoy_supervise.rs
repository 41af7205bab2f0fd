//! `pasa-agent --envoy`: the agent runs Envoy as its child, as pilot-agent does. With the real
//! binary and real Envoy (in a network namespace of its own: `--envoy` is given a one-line
//! wrapper that enters it, and Envoy's admin is a Unix socket the agent reaches):
//!
//! - `/healthz/ready` turns 200 once Envoy says it is ready and holds the agent's configuration;
//! - a rotated workload certificate (`--cert-dir` rewritten) reaches Envoy over SDS;
//! - SIGTERM drains Envoy's listeners for `--drain-duration`, stops Envoy, and the agent exits
//!   with Envoy's status (0), leaving no Envoy behind;
//! - an Envoy that dies ends the agent at once, non-zero (as pilot-agent: the pod's restart
//!   policy starts both again), and so does an `--envoy` that cannot start or exits at once
//!   (these two need neither Envoy nor root);
//! - with its certificate from Istio's CA (`--ca-address`, a fake CA), the sidecar becomes
//!   ready and each renewal reaches Envoy.
//!
//! Needs `envoy` and root; says loudly when it skipped.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::ca::FakeCa;
use common::envoy::{self, Netns, WAIT};
use common::sidecar;
use common::store::StoreServer;
use serde_json::json;

const NODE: &str = "sidecar~10.10.0.1~web-1.shop~shop.svc.cluster.local";

/// A store holding the `web` service whose pod the tests' sidecar is.
async fn web_store(dir: &std::path::Path) -> StoreServer {
    let store = StoreServer::start(&dir.join("db"), 0).await;
    store
        .apply(&[json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
                        "metadata": {"name": "web", "namespace": "shop"},
                        "spec": {"addresses": ["10.96.7.1"],
                                 "ports": [{"name": "http", "port": 80}],
                                 "endpoints": [{"address": "10.10.0.1", "labels": {"app": "web"}}]}})])
        .await;
    store
}

async fn until_ready(agent: &Agent, what: &str) {
    agent
        .until("/healthz/ready", what, |code, _| code == 200)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_runs_envoy_drains_it_and_stops_when_it_dies() {
    if envoy::skip_without_envoy("the_agent_runs_envoy_drains_it_and_stops_when_it_dies") {
        return;
    }
    let data = tempfile::tempdir().expect("temporary directory");
    let store = web_store(data.path()).await;
    let certs = data.path().join("certs");
    sidecar::workload_certificate(&certs, &sidecar::ca(), "web");

    let netns = Netns::create();
    let wrapper = netns.envoy_wrapper(data.path());
    let admin = format!("unix:{}", data.path().join("envoy-admin.sock").display());
    // The web pod's agent, running Envoy in the namespace.
    let web = [
        "--labels",
        "app=web",
        "--cert-dir",
        certs.to_str().expect("UTF-8"),
        "--envoy",
        wrapper.to_str().expect("UTF-8"),
        "--envoy-admin",
        &admin,
    ];
    let mut args = web.to_vec();
    args.extend([
        // The pod's proxy settings, as the injection gives them (`PROXY_CONFIG`).
        "--proxy-config",
        r#"{"concurrency": 3, "terminationDrainDuration": "1s",
            "proxyStatsMatcher": {"inclusionPrefixes": ["sds."]}}"#,
        "--credential-poll",
        "100ms",
    ]);
    let agent = Agent::start_in(NODE, store.addr, &data.path().join("agent"), &args);
    until_ready(&agent, "Envoy ready with the agent's configuration").await;

    // Envoy runs with the settings' worker threads, and its node carries them, as
    // pilot-agent's.
    let admin_socket = data.path().join("envoy-admin.sock");
    let stream = tokio::net::UnixStream::connect(&admin_socket)
        .await
        .expect("Envoy's admin socket");
    let (_, info) = envoy::http_exchange(stream, "GET", "/server_info")
        .await
        .expect("Envoy's server info");
    let info: serde_json::Value = serde_json::from_str(&info).expect("server info is JSON");
    assert_eq!(
        info["command_line_options"]["concurrency"], 3,
        "the settings' concurrency: {info}"
    );
    assert_eq!(
        info["node"]["metadata"]["PROXY_CONFIG"]["concurrency"], 3,
        "the node's PROXY_CONFIG: {}",
        info["node"]
    );

    // The workload certificate rotates (istio-csr or SPIRE rewrite the files): Envoy gets it.
    let sds_updates = || envoy::workload_certificate_updates(&admin_socket);
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

    // What Envoy holds, through the agent (`pasactl proxy-config --source envoy POD` reads
    // this): Envoy's own dump, with the agent's clusters active in it.
    let (code, dump) = agent.get("/config_dump?source=envoy").await;
    assert_eq!(code, 200, "{dump}");
    let dump: serde_json::Value = serde_json::from_str(&dump).expect("Envoy's dump is JSON");
    let active: Vec<&str> = dump["configs"]
        .as_array()
        .expect("configs")
        .iter()
        .flat_map(|c| {
            c["dynamic_active_clusters"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .filter_map(|c| c["cluster"]["name"].as_str())
        .collect();
    assert!(
        active.contains(&"inbound|80||"),
        "Envoy holds the agent's inbound cluster: {active:?}"
    );

    let first = netns.pids();
    assert_eq!(first.len(), 1, "one Envoy in its namespace: {first:?}");
    println!("Envoy {} ready", first[0]);

    // SIGTERM: drain, stop Envoy, exit 0.
    let terminated = Instant::now();
    agent.terminate();
    let took = terminated.elapsed();
    println!("SIGTERM to exit: {} ms (drain 1 s)", took.as_millis());
    assert!(
        took >= Duration::from_secs(1),
        "drained for the settings' terminationDrainDuration: {took:?}"
    );
    assert!(
        took < Duration::from_secs(8),
        "stopped promptly after draining: {took:?}"
    );
    assert!(netns.pids().is_empty(), "no Envoy left: {:?}", netns.pids());

    // Envoy dies: the agent stops with it, non-zero, as pilot-agent does.
    let mut agent = Agent::start_in(NODE, store.addr, &data.path().join("agent-again"), &web);
    until_ready(&agent, "Envoy ready again").await;
    let envoy = netns.pids();
    assert_eq!(envoy.len(), 1, "one Envoy in its namespace: {envoy:?}");
    std::process::Command::new("kill")
        .args(["-KILL", &envoy[0].to_string()])
        .status()
        .expect("kill");
    let exit = agent
        .exited_within(WAIT)
        .expect("the agent stops when its Envoy dies");
    assert!(!exit.success(), "non-zero: {exit:?}");
    assert!(netns.pids().is_empty(), "no Envoy left: {:?}", netns.pids());
    store.stop().await;
}

/// An `--envoy` that cannot start, and one that exits at once, end the agent at once, non-zero
/// (with Envoy's own status when it has one), saying which binary and why: a pod whose proxy
/// never ran must not look healthy.
#[test]
fn an_envoy_that_cannot_start_or_exits_ends_the_agent() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let uds = dir.path().join("xds.sock");
    let cache = dir.path().join("cache");
    let run = |envoy: &std::path::Path| {
        common::agent::run_to_exit(&[
            "--node-id",
            NODE,
            "--server",
            "127.0.0.1:1",
            "--uds",
            uds.to_str().expect("UTF-8"),
            "--cache-dir",
            cache.to_str().expect("UTF-8"),
            "--admin",
            "127.0.0.1:0",
            "--envoy",
            envoy.to_str().expect("UTF-8"),
        ])
    };

    let missing = dir.path().join("no-such-envoy");
    let (status, stderr) = run(&missing);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot start Envoy {}", missing.display()))
            && stderr.contains("No such file or directory"),
        "{stderr}"
    );
    assert!(!uds.exists(), "no socket left behind");

    let quitter = dir.path().join("quitting-envoy");
    std::fs::write(&quitter, "#!/bin/sh\nexit 3\n").expect("write the script");
    std::fs::set_permissions(&quitter, std::fs::Permissions::from_mode(0o755))
        .expect("make it executable");
    let (status, stderr) = run(&quitter);
    assert_eq!(status.code(), Some(3), "Envoy's own status: {stderr}");
    assert!(
        stderr.contains(&format!(
            "Envoy {} exited with exit status: 3",
            quitter.display()
        )),
        "{stderr}"
    );
    assert!(!uds.exists(), "no socket left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_with_its_certificate_from_istios_ca_becomes_ready_and_takes_renewals() {
    if envoy::skip_without_envoy(
        "a_sidecar_with_its_certificate_from_istios_ca_becomes_ready_and_takes_renewals",
    ) {
        return;
    }
    let data = tempfile::tempdir().expect("temporary directory");
    let store = web_store(data.path()).await;
    let ca = FakeCa::start(&[("token-web", "spiffe://cluster.local/ns/shop/sa/web")]).await;
    let netns = Netns::create();
    let wrapper = netns.envoy_wrapper(data.path());
    let admin_socket = data.path().join("envoy-admin.sock");
    let admin = format!("unix:{}", admin_socket.display());
    let mut args = ca.agent_args(&data.path().join("ca"), "token-web");
    args.extend(
        [
            "--labels",
            "app=web",
            "--service-account",
            "web",
            "--secret-ttl",
            "4s",
            "--envoy",
            wrapper.to_str().expect("UTF-8"),
            "--envoy-admin",
            &admin,
            "--drain-duration",
            "0s",
            "--proxy-config",
            r#"{"proxyStatsMatcher": {"inclusionPrefixes": ["sds."]}}"#,
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = Agent::start_in(NODE, store.addr, &data.path().join("agent"), &args);
    until_ready(&agent, "Envoy ready on the CA's certificate").await;
    let first = envoy::workload_certificate_updates(&admin_socket).await;
    assert!(first >= 1, "Envoy got the certificate over SDS");
    println!(
        "Envoy ready on a certificate from the CA ({} CSR)",
        ca.seen().len()
    );

    // Renewal at half of the 4 s life: Envoy takes the new certificate.
    let deadline = Instant::now() + WAIT;
    while envoy::workload_certificate_updates(&admin_socket).await <= first {
        assert!(
            Instant::now() < deadline,
            "the renewed certificate never reached Envoy"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = ca.seen();
    assert!(seen.len() >= 2, "renewed by a second CSR: {seen:?}");
    assert!(
        seen.iter().all(|s| s.signed_for.is_some()),
        "every request signed: {seen:?}"
    );
    println!("a renewed certificate reached Envoy ({} CSRs)", seen.len());
    agent.terminate();
    assert!(netns.pids().is_empty(), "no Envoy left");
    store.stop().await;
}
