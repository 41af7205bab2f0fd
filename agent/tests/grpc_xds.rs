//! End to end with a real xDS client: gRPC's proxyless xDS support in the official Python
//! package (`grpcio`, gRPC C-core), talking ADS to the real `pasa-agent` over its Unix socket.
//!
//! A store on loopback holds a service with two local gRPC backends (subsets v1 and v2) and a
//! VirtualService splitting 80/20; the agent follows the store; the Python client calls
//! `xds:///hello.default.svc.cluster.local:7070`. Checked: every call succeeds and the split is
//! 80/20 within a few percent; a VirtualService change applied with `pasactl` reaches the running
//! client within a second; the client NACKs nothing (its own CSDS view); and after the store
//! stops and the agent restarts, the client is served from the agent's saved cache.
//!
//! A second test runs a proxyless gRPC xDS *server* (`grpc.server(xds=True)`) behind its own
//! agent: its listener, mutual TLS (from PeerAuthentication and the pod's `tlsMode` label) and
//! RBAC (from AuthorizationPolicy) come from the agent, and clients with certificates of their
//! own, from a fake mesh CA, see each policy change take effect. Those clients name the service
//! by its short name (`xds:///greeter:7070`), as istiod lets clients of its namespace do.
//!
//! Needs `python3` with `agent/tests/e2e/requirements.txt` installed (CI's `.ci/run` installs
//! it). Without it the test says loudly that it skipped, unless `PASA_E2E_REQUIRED` is set, in
//! which case it fails.

mod common;

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use common::agent::{Agent, WAIT, line_channel};
use common::store::StoreServer;
use serde_json::{Value, json};

const NODE_ID: &str = "sidecar~127.0.0.1~client-7d9f.default~default.svc.cluster.local";
const TARGET: &str = "xds:///hello.default.svc.cluster.local:7070";

fn e2e_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e")
}

/// Whether the Python client can run here; panics when it must.
fn python_ready() -> bool {
    let probe = Command::new("python3")
        .args([
            "-c",
            "import grpc; from envoy.service.status.v3 import csds_pb2",
        ])
        .output();
    let ok = probe.as_ref().is_ok_and(|o| o.status.success());
    if !ok {
        let why = match probe {
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => format!("python3: {e}"),
        };
        let fix = "pip install -r agent/tests/e2e/requirements.txt";
        if std::env::var_os("PASA_E2E_REQUIRED").is_some() {
            panic!("the gRPC xDS client is not installed ({why}); run `{fix}`");
        }
        eprintln!("SKIPPED: the gRPC xDS end-to-end test needs Python grpcio ({why}); run `{fix}`");
    }
    ok
}

/// `pasactl` (built beside the agent by `cargo test --workspace`).
fn pasactl() -> PathBuf {
    pasa_testing::workspace_binary("pasactl", "pasactl")
}

fn apply(server: std::net::SocketAddr, dir: &Path, name: &str, yaml: &str) {
    let file = dir.join(name);
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(pasactl())
        .args(["apply", "-f"])
        .arg(&file)
        .args(["--server", &server.to_string()])
        .output()
        .expect("pasactl runs");
    assert!(
        out.status.success(),
        "pasactl apply failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A Python process of the test, killed when dropped.
struct Py {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Py {
    fn start(script: &str, args: &[&str], env: &[(&str, &Path)]) -> Py {
        let mut cmd = Command::new("python3");
        cmd.arg(e2e_dir().join(script))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .env("GRPC_VERBOSITY", "ERROR");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start python3");
        let stdin = child.stdin.take();
        let lines = line_channel(BufReader::new(child.stdout.take().unwrap()));
        Py {
            child,
            stdin,
            lines,
        }
    }

    fn line(&self) -> String {
        self.lines
            .recv_timeout(WAIT * 3)
            .expect("the Python process answers")
    }

    /// Sends a command to the client and reads its JSON answer.
    fn ask(&mut self, command: &str) -> Value {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{command}").unwrap();
        stdin.flush().unwrap();
        let line = self.line();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{command}: {e}: {line}"))
    }
}

impl Drop for Py {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A backend answering with its name; returns it and its port.
fn backend(name: &str) -> (Py, u16) {
    let py = Py::start("grpc_backend.py", &[name], &[]);
    let line = py.line();
    let port = line
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("backend said {line:?}"));
    (py, port)
}

fn service(v1: u16, v2: u16) -> String {
    format!(
        "apiVersion: pasa.io/v1alpha1
kind: ServiceEndpoints
metadata: {{name: hello, namespace: default}}
spec:
  addresses: [10.96.0.70]
  ports:
  - {{name: grpc, port: 7070, targetPort: grpc}}
  endpoints:
  - {{address: 127.0.0.1, ports: {{grpc: {v1}}}, labels: {{app: hello, version: v1}}}}
  - {{address: 127.0.0.1, ports: {{grpc: {v2}}}, labels: {{app: hello, version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: hello, namespace: default}}
spec:
  host: hello
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
"
    )
}

fn split(v1: u32, v2: u32) -> String {
    format!(
        "apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: hello, namespace: default}}
spec:
  hosts: [hello]
  http:
  - route:
    - {{destination: {{host: hello, subset: v1}}, weight: {v1}}}
    - {{destination: {{host: hello, subset: v2}}, weight: {v2}}}
"
    )
}

/// Istio's gRPC bootstrap for a proxyless pod of `node` served by `agent`: ADS over the agent's
/// socket, the listener names of xDS servers, and, given a directory of Istio's certificate
/// files, the `default` certificate provider mutual TLS takes its certificates from.
fn write_bootstrap(path: &Path, agent: &Agent, node: &str, certs: Option<&Path>) {
    let mut boot = json!({
        "xds_servers": [{
            "server_uri": format!("unix://{}", agent.uds.display()),
            "channel_creds": [{"type": "insecure"}],
            "server_features": ["xds_v3"]
        }],
        "node": {"id": node, "metadata": {"GENERATOR": "grpc"}},
        "server_listener_resource_name_template": "xds.istio.io/grpc/lds/inbound/%s"
    });
    if let Some(dir) = certs {
        let file = |name: &str| dir.join(name).display().to_string();
        boot["certificate_providers"] = json!({"default": {
            "plugin_name": "file_watcher",
            "config": {
                "certificate_file": file("cert-chain.pem"),
                "private_key_file": file("key.pem"),
                "ca_certificate_file": file("root-cert.pem"),
                "refresh_interval": "900s"
            }
        }});
    }
    std::fs::write(path, boot.to_string()).unwrap();
}

fn sync_status(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Whether the agent reports a gRPC connection with every type ACKed.
fn grpc_client_synced(body: &str) -> bool {
    let status = sync_status(body);
    status["connections"].as_array().is_some_and(|conns| {
        conns.iter().any(|c| {
            c["generator"] == "grpc"
                && ["LDS", "RDS", "CDS", "EDS"]
                    .iter()
                    .all(|t| c["types"][t]["state"] == "SYNCED")
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_client_follows_the_agent_and_survives_the_store_going_away() {
    if !python_ready() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();

    let (_v1, v1_port) = backend("v1");
    let (_v2, v2_port) = backend("v2");
    let store = StoreServer::start(data.path(), 0).await;
    let port = store.addr.port();
    apply(
        store.addr,
        files.path(),
        "service.yaml",
        &service(v1_port, v2_port),
    );
    apply(store.addr, files.path(), "split.yaml", &split(80, 20));

    let agent = Agent::start_as(NODE_ID, store.addr, run.path(), cache.path());
    let bootstrap = files.path().join("bootstrap.json");
    write_bootstrap(&bootstrap, &agent, NODE_ID, None);
    let mut client = Py::start(
        "grpc_client.py",
        &[TARGET],
        &[("GRPC_XDS_BOOTSTRAP", bootstrap.as_path())],
    );
    assert!(client.line().contains("started"));

    // 80/20 between the two subsets, every call answered.
    let answer = client.ask("calls 1000");
    assert_eq!(answer["error_count"], 0, "{answer}");
    let v1 = answer["counts"]["v1"].as_f64().unwrap_or(0.0);
    let v2 = answer["counts"]["v2"].as_f64().unwrap_or(0.0);
    let share = v1 / (v1 + v2);
    println!("split: v1 {v1}, v2 {v2} ({:.1}% v1)", share * 100.0);
    assert!((0.75..=0.85).contains(&share), "{answer}");
    agent
        .until("/sync_status", "the gRPC client synced", |_, b| {
            grpc_client_synced(b)
        })
        .await;

    // A change applied with pasactl reaches the running client within a second.
    apply(store.addr, files.path(), "all-v2.yaml", &split(0, 100));
    let applied = Instant::now();
    let answer = client.ask("until v2 10");
    let followed = applied.elapsed();
    println!(
        "VirtualService change followed by the client in {} ms ({} calls)",
        followed.as_millis(),
        answer["calls"]
    );
    assert_eq!(answer["ok"], true, "{answer}");
    assert!(followed.as_secs_f64() < 1.0, "took {followed:?}");

    // Nothing NACKed, every resource ACKed, by the client's own account.
    let csds = client.ask("csds");
    assert_eq!(csds["nacked"], json!([]), "{csds}");
    let types: Vec<&str> = csds["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["status"], "ACKED", "{r}");
            r["type"].as_str().unwrap()
        })
        .collect();
    for t in [
        "Listener",
        "RouteConfiguration",
        "Cluster",
        "ClusterLoadAssignment",
    ] {
        assert!(types.contains(&t), "{t} missing from {csds}");
    }

    // Degraded: the store stops, the agent restarts on its saved cache, and the client
    // reconnects to it and keeps being served.
    store.stop().await;
    agent.terminate();
    let agent = Agent::start_as(
        NODE_ID,
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        run.path(),
        cache.path(),
    );
    let body = agent
        .until(
            "/sync_status",
            "the client back on the restarted agent",
            |_, b| grpc_client_synced(b),
        )
        .await;
    assert_eq!(sync_status(&body)["store"]["state"], "Degraded", "{body}");
    let answer = client.ask("calls 100");
    assert_eq!(answer["error_count"], 0, "{answer}");
    assert_eq!(answer["counts"]["v2"], 100, "{answer}");
    assert_eq!(client.ask("csds")["nacked"], json!([]));
}

const SERVER_NODE: &str = "sidecar~127.0.0.1~greeter-5c7d.default~default.svc.cluster.local";
const CLIENT_NODE: &str = "sidecar~127.0.0.2~frontend-6b8f.default~default.svc.cluster.local";
/// By its short name, as a client of its namespace may name it.
const GREETER: &str = "xds:///greeter:7070";
const SPIFFE_DEFAULT: &str = "spiffe://cluster.local/ns/default/sa/";

/// The greeter service on `port` of 127.0.0.1 (service account `greeter`); its clients use
/// Istio mutual TLS.
fn greeter(port: u16) -> String {
    format!(
        "apiVersion: pasa.io/v1alpha1
kind: ServiceEndpoints
metadata: {{name: greeter, namespace: default}}
spec:
  addresses: [10.96.0.80]
  ports:
  - {{name: grpc, port: 7070, targetPort: grpc}}
  endpoints:
  - {{address: 127.0.0.1, ports: {{grpc: {port}}}, labels: {{app: greeter}}, serviceAccount: greeter}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: greeter, namespace: default}}
spec:
  host: greeter
  trafficPolicy: {{tls: {{mode: ISTIO_MUTUAL}}}}
"
    )
}

fn peer_authentication(mode: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: greeter, namespace: default}}
spec:
  selector: {{matchLabels: {{app: greeter}}}}
  mtls: {{mode: {mode}}}
"
    )
}

fn authorization_policy(name: &str, action: &str, service_account: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: {name}, namespace: default}}
spec:
  selector: {{matchLabels: {{app: greeter}}}}
  action: {action}
  rules:
  - from:
    - source: {{principals: [cluster.local/ns/default/sa/{service_account}]}}
"
    )
}

/// A client calling the greeter until 20 calls in a row answer `answer` (see `grpc_client.py`).
fn until(client: &mut Py, answer: &str) {
    let got = client.ask(&format!("until {} 15", answer.replace(' ', "+")));
    assert_eq!(got["ok"], true, "waiting for {answer:?}: {got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_server_takes_mutual_tls_and_rbac_from_the_agent() {
    if !python_ready() {
        return;
    }
    let dirs = tempfile::tempdir().unwrap();
    let dir = |name: &str| dirs.path().join(name);
    let ca = common::sidecar::ca();
    for (who, sa) in [
        ("server", "greeter"),
        ("frontend", "frontend"),
        ("intruder", "intruder"),
    ] {
        common::sidecar::workload_certificate_for(
            &dir(&format!("certs-{who}")),
            &ca,
            &format!("{SPIFFE_DEFAULT}{sa}"),
        );
    }
    std::fs::create_dir_all(dir("files")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let store = StoreServer::start(&dir("data"), 0).await;
    let apply = |name: &str, yaml: &str| apply(store.addr, &dir("files"), name, yaml);
    apply("greeter.yaml", &greeter(port));

    // The server's agent knows its pod's labels; Istio's injector labels proxyless pods with
    // `security.istio.io/tlsMode: istio`, so PERMISSIVE (the default) is mutual TLS for them.
    let server_agent = Agent::start_in(
        SERVER_NODE,
        store.addr,
        &dir("server-agent"),
        &["--labels", "app=greeter,security.istio.io/tlsMode=istio"],
    );
    let client_agent = Agent::start_in(CLIENT_NODE, store.addr, &dir("client-agent"), &[]);
    // Every pod's bootstrap names its certificates (a client without them refuses clusters
    // that need them).
    let boot = |who: &str, certs: &str, agent: &Agent, node: &str| {
        let path = dir(&format!("{who}.json"));
        write_bootstrap(&path, agent, node, Some(&dir(&format!("certs-{certs}"))));
        path
    };
    let server_boot = boot("server", "server", &server_agent, SERVER_NODE);
    let port_arg = port.to_string();
    let server = Py::start(
        "grpc_xds_server.py",
        &["greeter", &port_arg],
        &[("GRPC_XDS_BOOTSTRAP", server_boot.as_path())],
    );
    assert_eq!(server.line(), "started");
    let start_client = |who: &str, certs: &str, xds_credentials: bool| {
        let bootstrap = boot(who, certs, &client_agent, CLIENT_NODE);
        let mut args = vec![GREETER];
        if xds_credentials {
            args.push("--xds-credentials");
        }
        let client = Py::start(
            "grpc_client.py",
            &args,
            &[("GRPC_XDS_BOOTSTRAP", bootstrap.as_path())],
        );
        assert!(client.line().contains("started"));
        client
    };
    let mut frontend = start_client("frontend", "frontend", true);
    let mut intruder = start_client("intruder", "intruder", true);
    // Plaintext whatever its clusters say: its channel does not take security from xDS.
    let mut plaintext = start_client("plaintext", "frontend", false);
    plaintext.ask("fail-fast");

    // Mutual TLS: the server sees the caller's identity; a plaintext client is refused.
    let frontend_answer = format!("greeter {SPIFFE_DEFAULT}frontend");
    until(&mut frontend, &frontend_answer);
    until(&mut plaintext, "UNAVAILABLE");
    // The server ACKed its listener (the agent's view of the connection).
    server_agent
        .until("/sync_status", "the server's listener ACKed", |_, b| {
            sync_status(b)["connections"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["types"]["LDS"]["state"] == "SYNCED"))
        })
        .await;

    // PeerAuthentication DISABLE: plaintext; then STRICT again.
    apply("pa.yaml", &peer_authentication("DISABLE"));
    until(&mut plaintext, "greeter plaintext");
    apply("pa.yaml", &peer_authentication("STRICT"));
    until(&mut frontend, &frontend_answer);
    until(&mut plaintext, "UNAVAILABLE");

    // ALLOW only the frontend: the intruder is denied, the frontend still answered.
    until(&mut intruder, &format!("greeter {SPIFFE_DEFAULT}intruder"));
    apply(
        "allow.yaml",
        &authorization_policy("allow-frontend", "ALLOW", "frontend"),
    );
    until(&mut intruder, "PERMISSION_DENIED");
    let answer = frontend.ask("calls 20");
    assert_eq!(answer["counts"][&frontend_answer], 20, "{answer}");

    // DENY the frontend too: DENY wins over ALLOW.
    apply(
        "deny.yaml",
        &authorization_policy("deny-frontend", "DENY", "frontend"),
    );
    until(&mut frontend, "PERMISSION_DENIED");

    // No client or server NACKed anything.
    for client in [&mut frontend, &mut intruder] {
        assert_eq!(client.ask("csds")["nacked"], json!([]));
    }
    drop(server);
}
