//! `pasactl x simulate`: against a fake agent admin endpoint (output formats, exit codes, an
//! unreachable agent), then against a real `pasa-agent` following a real `pasa-pcp` when the
//! agent binary has been built next to pasactl.

use std::io::BufReader;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::fake_agent::FakeAgentAdmin;
use common::{Pcp, WAIT, line_channel};
use serde_json::json;

async fn pasactl(args: &[&str]) -> Output {
    tokio::process::Command::new(common::pasactl())
        .args(["x", "simulate"])
        .args(args)
        .env_remove("PASA_AGENT_ADMIN")
        .output()
        .await
        .expect("run pasactl")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_against_a_fake_agent() {
    let fake = FakeAgentAdmin::start().await;
    let agent = fake.addr.to_string();

    // Routed: one line per step, exit 0; the call sent holds what was given.
    let out = pasactl(&[
        "--agent",
        &agent,
        "--port",
        "9080",
        "--host",
        "reviews",
        "--header",
        "x-user=jason",
    ])
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "listener 0.0.0.0_9080\n\
         route config 9080\n\
         virtual host reviews.default.svc.cluster.local:9080\n\
         route default\n\
         cluster outbound|9080||reviews.default.svc.cluster.local\n"
    );
    let (query, call) = fake.received.lock().unwrap()[0].clone();
    assert_eq!(query, "generator=envoy");
    assert_eq!(
        call,
        json!({"port": 9080, "protocol": "http", "tls": "plaintext", "host": "reviews",
               "headers": {"x-user": ["jason"]}})
    );

    // -o json: the outcome as the agent gave it; the agent also comes from the environment.
    let out = tokio::process::Command::new(common::pasactl())
        .args(["x", "simulate", "--port", "9080", "-o", "json"])
        .args(["--generator", "grpc"])
        .env("PASA_AGENT_ADMIN", format!("http://{agent}"))
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert_eq!(
        doc["cluster"],
        "outbound|9080||reviews.default.svc.cluster.local"
    );
    assert_eq!(fake.received.lock().unwrap()[1].0, "generator=grpc");

    // A call that does not get through: the steps reached, the error, exit code 1.
    let out = pasactl(&["--agent", &agent, "--port", "9081"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let short = text(&out.stdout);
    assert!(short.starts_with("listener 0.0.0.0_9081\n"), "{short}");
    assert!(short.ends_with("error: NoRoute\n"), "{short}");
    let out = pasactl(&["--agent", &agent, "--port", "9081", "-o", "json"]).await;
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["error"], "NoRoute");

    // A call the agent rejects is a usage error (2), with the agent's reason.
    let out = pasactl(&["--agent", &agent, "--port", "9080", "--alpn", "h2"]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("the agent rejected the call") && err.contains("set tls to tls or mtls"),
        "{err}"
    );
    // So are bad flags, before anything is sent.
    for bad in [
        &["--agent", &agent][..],
        &["--agent", &agent, "--port", "9080", "--protocol", "udp"],
        &["--agent", &agent, "--port", "9080", "--address", "reviews"],
        &["--agent", &agent, "--port", "9080", "--header", "x-user"],
    ] {
        let out = pasactl(bad).await;
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out.stderr));
    }
    assert_eq!(fake.received.lock().unwrap().len(), 5);

    // Nothing generated yet: the agent's reason, exit 1.
    let out = pasactl(&["--agent", &agent, "--port", "1"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("nothing has been generated"),
        "{}",
        text(&out.stderr)
    );

    // No agent there.
    let out = pasactl(&["--agent", "127.0.0.1:1", "--port", "9080"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot reach the agent's admin endpoint at 127.0.0.1:1")
            && err.contains("is pasa-agent running?")
            && err.contains("PASA_AGENT_ADMIN"),
        "{err}"
    );
}

/// A `pasa-agent` started from the target directory, killed when dropped.
struct RealAgent {
    _process: pasa_testing::Process,
    admin: String,
}

impl RealAgent {
    fn start(binary: &Path, server: &str, dir: &Path) -> RealAgent {
        let mut child = Command::new(binary)
            .args(["--server", server, "--admin", "127.0.0.1:0"])
            .args([
                "--node-id",
                "sidecar~10.0.0.1~ratings-1.default~default.svc.cluster.local",
            ])
            .arg("--uds")
            .arg(dir.join("xds.sock"))
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start pasa-agent");
        let lines = line_channel(BufReader::new(child.stdout.take().expect("stdout")));
        loop {
            let Ok(line) = lines.recv_timeout(WAIT) else {
                let _ = child.kill();
                let _ = child.wait();
                panic!("pasa-agent printed no ready line within {WAIT:?}");
            };
            if let Some((_, admin)) = line.rsplit_once(", admin on http://") {
                return RealAgent {
                    _process: pasa_testing::Process::new("pasa-agent", child),
                    admin: admin.trim().to_string(),
                };
            }
        }
    }
}

#[test]
fn simulate_against_a_real_agent() {
    let agent_binary = pasa_testing::workspace_binary("pasa-agent", "pasa-agent");
    let data = tempfile::tempdir().unwrap();
    let pcp = Pcp::start(data.path());
    let dir = tempfile::tempdir().unwrap();
    let reviews = dir.path().join("reviews.yaml");
    std::fs::write(
        &reviews,
        "apiVersion: pasa.io/v1alpha1\nkind: ServiceEndpoints\n\
         metadata: {name: reviews, namespace: default}\n\
         spec:\n  addresses: [10.96.0.20]\n  ports: [{name: http, port: 9080}]\n\
         \x20 endpoints: [{address: 10.0.0.1, labels: {version: v1}}]\n",
    )
    .unwrap();
    pcp.ok(&["apply", "-f", reviews.to_str().unwrap()]);
    let agent = RealAgent::start(&agent_binary, &pcp.addr, dir.path());

    let simulate = |extra: &[&str]| {
        Command::new(common::pasactl())
            .args(["x", "simulate", "--agent", &agent.admin])
            .args(extra)
            .output()
            .expect("run pasactl")
    };
    let routed = [
        "--address",
        "10.96.0.20",
        "--port",
        "9080",
        "--host",
        "reviews.default.svc.cluster.local",
    ];
    let deadline = Instant::now() + WAIT;
    let out = loop {
        let out = simulate(&routed);
        let stderr = text(&out.stderr);
        if stderr.contains("has no /simulate endpoint") {
            eprintln!(
                "skipped: the pasa-agent binary at {} predates /simulate (cargo build -p pasa-agent)",
                agent_binary.display()
            );
            return;
        }
        // Until the agent has translated the service, the call goes elsewhere or nowhere.
        if text(&out.stdout).contains("cluster outbound|9080||") || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "listener 0.0.0.0_9080\n\
         route config 9080\n\
         virtual host reviews.default.svc.cluster.local:9080\n\
         route default\n\
         cluster outbound|9080||reviews.default.svc.cluster.local\n"
    );

    let out = simulate(&["--port", "9999", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["listener"], "virtualOutbound");
    assert_eq!(doc["cluster"], "PassthroughCluster");

    let out = simulate(&["--port", "9080", "--alpn", "h2"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}
