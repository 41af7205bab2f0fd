//! `pasactl proxy-config`: a real store (`pasa-pcp`) holding Bookinfo-like config, a real agent
//! (the pasa-agent library, run in this process) following it, and the real `pasactl` reading
//! what the agent serves from its admin endpoint.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;

use common::{Pcp, WAIT};

const CONFIG: &str = "\
apiVersion: pasa.io/v1alpha1
kind: ServiceEndpoints
metadata: {name: reviews, namespace: default}
spec:
  addresses: [10.96.0.20]
  ports: [{name: http, port: 9080}]
  endpoints:
  - {address: 10.0.0.1, labels: {version: v1}}
  - {address: 10.0.0.2, labels: {version: v2}}
---
apiVersion: pasa.io/v1alpha1
kind: ServiceEndpoints
metadata: {name: ratings, namespace: default}
spec:
  addresses: [10.96.0.30]
  ports: [{name: http, port: 9080}]
  endpoints: [{address: 10.0.0.3, labels: {version: v1}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews]
  http:
  - route:
    - destination: {host: reviews, subset: v1}
---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: shared-lua, namespace: default}
spec:
  configPatches:
  - applyTo: EXTENSION_CONFIG
    patch:
      operation: ADD
      value:
        name: shared-lua
        typed_config:
          '@type': type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          default_source_code: {inline_string: 'function envoy_on_response(h) end'}
";

/// The pasa-agent library running in a thread of its own, stopped when dropped.
struct InProcessAgent {
    admin: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InProcessAgent {
    fn start(server: &str, dir: &Path) -> InProcessAgent {
        // A free port for the admin endpoint (the agent binds it again at once).
        let admin = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let uds = dir.join("xds.sock");
        let args = <pasa_agent::run::AgentArgs as clap::Parser>::try_parse_from([
            "pasa-agent",
            "--server",
            server,
            "--node-id",
            "sidecar~10.0.0.9~productpage-1.default~default.svc.cluster.local",
            "--uds",
            uds.to_str().expect("UTF-8 path"),
            "--admin",
            &admin.to_string(),
        ])
        .expect("agent arguments");
        let identity = args.identity.resolve().expect("identity");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            runtime
                .block_on(pasa_agent::run::run(args, identity, async {
                    let _ = stopped.await;
                }))
                .expect("the agent runs");
        });
        InProcessAgent {
            admin,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for InProcessAgent {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn pasactl(args: &[&str]) -> Output {
    Command::new(common::pasactl())
        .args(args)
        .env_remove("PASA_AGENT_ADMIN")
        .output()
        .expect("run pasactl")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `pasactl proxy-config <args>`, which must succeed; its output.
fn proxy_config(args: &[&str]) -> String {
    let out = pasactl(&[&["proxy-config"], args].concat());
    assert!(
        out.status.success(),
        "pasactl proxy-config {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The rows of a table as their whitespace-separated cells (the header included).
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

fn has_row(table: &str, cells: &[&str]) -> bool {
    rows(table).iter().any(|r| r == cells)
}

#[test]
fn proxy_config_shows_what_the_agent_serves() {
    let data = tempfile::tempdir().unwrap();
    let pcp = Pcp::start(data.path());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bookinfo.yaml");
    std::fs::write(&config, CONFIG).unwrap();
    pcp.ok(&["apply", "-f", config.to_str().unwrap()]);
    let agent = InProcessAgent::start(&pcp.addr, dir.path());
    let addr = agent.admin.to_string();

    // Until the agent is up and has translated the config, the rows are not there yet.
    let v1 = [
        "reviews.default.svc.cluster.local",
        "9080",
        "v1",
        "outbound",
        "EDS",
        "reviews.default",
    ];
    let deadline = Instant::now() + WAIT;
    let clusters = loop {
        let out = pasactl(&["proxy-config", "cluster", &addr]);
        let table = text(&out.stdout);
        if has_row(&table, &v1) {
            break table;
        }
        assert!(
            Instant::now() < deadline,
            "no reviews v1 cluster within {WAIT:?}: {table}{}",
            text(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    };

    // Named by its proxy, as proxy-status lists it: the address comes from the agent's report
    // to the store (once it has reported).
    let deadline = Instant::now() + WAIT;
    loop {
        let out = pcp.ctl(&["proxy-config", "cluster", "productpage-1.default"]);
        if out.status.success() {
            assert_eq!(text(&out.stdout), clusters, "the same agent, by name");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent is not found by name within {WAIT:?}: {}",
            text(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // What Envoy holds, by name: read through the agent, which runs no Envoy here and says so.
    let out = pcp.ctl(&[
        "proxy-config",
        "cluster",
        "productpage-1.default",
        "--source",
        "envoy",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("the agent at {addr} answered 404"))
            && err.contains("this agent runs no Envoy (--envoy)"),
        "{err}"
    );

    // Clusters: istioctl's columns, the DestinationRule named where one applies.
    assert!(clusters.starts_with("SERVICE FQDN"), "{clusters}");
    for header in ["PORT", "SUBSET", "DIRECTION", "TYPE", "DESTINATION RULE"] {
        assert!(
            clusters.lines().next().unwrap().contains(header),
            "{clusters}"
        );
    }
    for row in [
        &[
            "reviews.default.svc.cluster.local",
            "9080",
            "-",
            "outbound",
            "EDS",
            "reviews.default",
        ][..],
        &[
            "reviews.default.svc.cluster.local",
            "9080",
            "v2",
            "outbound",
            "EDS",
            "reviews.default",
        ],
        // No DestinationRule for ratings: the last column is empty.
        &[
            "ratings.default.svc.cluster.local",
            "9080",
            "-",
            "outbound",
            "EDS",
        ],
        &["BlackHoleCluster", "-", "-", "-", "STATIC"],
        &["PassthroughCluster", "-", "-", "-", "ORIGINAL_DST"],
    ] {
        assert!(has_row(&clusters, row), "{row:?} in\n{clusters}");
    }

    // The cluster filters.
    let v2 = proxy_config(&["cluster", &addr, "--subset", "v2"]);
    assert_eq!(rows(&v2).len(), 2, "{v2}");
    assert!(has_row(
        &v2,
        &[
            "reviews.default.svc.cluster.local",
            "9080",
            "v2",
            "outbound",
            "EDS",
            "reviews.default"
        ]
    ));
    let ratings = proxy_config(&[
        "clusters",
        "--agent",
        &addr,
        "--fqdn",
        "ratings",
        "--port",
        "9080",
        "--direction",
        "outbound",
    ]);
    assert_eq!(rows(&ratings).len(), 2, "{ratings}");
    assert!(
        ratings.contains("ratings.default.svc.cluster.local"),
        "{ratings}"
    );

    // Listeners: one row per filter chain, with istioctl's destinations.
    let listeners = proxy_config(&["listener", &addr]);
    assert!(
        has_row(&listeners, &["ADDRESSES", "PORT", "MATCH", "DESTINATION"]),
        "{listeners}"
    );
    assert!(
        rows(&listeners).iter().any(|r| r[0] == "0.0.0.0"
            && r[1] == "9080"
            && r.ends_with(&["Route:".into(), "9080".into()])),
        "{listeners}"
    );
    assert!(
        rows(&listeners)
            .iter()
            .any(|r| r[1] == "15001" && r.last().map(String::as_str) == Some("PassthroughCluster")),
        "{listeners}"
    );
    let outbound = proxy_config(&["listeners", &addr, "--port", "15001"]);
    assert!(
        rows(&outbound).iter().skip(1).all(|r| r[1] == "15001"),
        "{outbound}"
    );
    assert!(rows(&outbound).len() > 1, "{outbound}");
    // The service port has HTTP chains and a TCP fall-through; virtualOutbound only TCP.
    let mixed = proxy_config(&[
        "listener",
        &addr,
        "--type",
        "http+tcp",
        "--address",
        "0.0.0.0",
    ]);
    assert!(mixed.contains("Route: 9080"), "{mixed}");
    assert!(!mixed.contains("15001"), "{mixed}");
    let tcp = proxy_config(&["listener", &addr, "--type", "TCP"]);
    assert!(rows(&tcp).len() > 1, "{tcp}");
    assert!(rows(&tcp).iter().skip(1).all(|r| r[1] == "15001"), "{tcp}");

    // Routes: the VirtualService named on its routes.
    let routes = proxy_config(&["route", &addr]);
    assert!(routes.starts_with("NAME"), "{routes}");
    assert!(
        rows(&routes)
            .iter()
            .any(|r| r.first().map(String::as_str) == Some("9080")
                && r[1] == "reviews.default.svc.cluster.local:9080"
                && r.ends_with(&["/*".into(), "reviews.default".into()])),
        "{routes}"
    );
    let named = proxy_config(&["routes", &addr, "--name", "9080"]);
    assert!(
        rows(&named).iter().skip(1).all(|r| r[0] == "9080"),
        "{named}"
    );
    let none = proxy_config(&["route", &addr, "--name", "no-such-route"]);
    assert_eq!(rows(&none).len(), 1, "{none}");

    // Endpoints: per cluster, subsets holding their own.
    let endpoints = proxy_config(&["endpoint", &addr]);
    assert!(
        has_row(
            &endpoints,
            &["ENDPOINT", "STATUS", "OUTLIER", "CHECK", "CLUSTER"]
        ),
        "{endpoints}"
    );
    let status = rows(&endpoints)
        .iter()
        .find(|r| r[0] == "10.0.0.1:9080")
        .map(|r| r[1].clone())
        .unwrap_or_else(|| panic!("10.0.0.1:9080 in {endpoints}"));
    assert!(
        has_row(
            &endpoints,
            &[
                "10.0.0.1:9080",
                &status,
                "-",
                "outbound|9080|v1|reviews.default.svc.cluster.local"
            ]
        ),
        "{endpoints}"
    );
    let v2 = proxy_config(&[
        "endpoints",
        &addr,
        "--cluster",
        "outbound|9080|v2|reviews.default.svc.cluster.local",
    ]);
    assert_eq!(rows(&v2).len(), 2, "{v2}");
    assert!(v2.contains("10.0.0.2:9080"), "{v2}");

    // all: the four tables, a blank line between them.
    let all = proxy_config(&["all", &addr]);
    let tables: Vec<&str> = all.split("\n\n").collect();
    assert_eq!(tables.len(), 4, "{all}");
    assert!(tables[0].starts_with("SERVICE FQDN"), "{all}");
    assert!(tables[1].starts_with("ADDRESSES"), "{all}");
    assert!(tables[2].starts_with("NAME"), "{all}");
    assert!(tables[3].starts_with("ENDPOINT"), "{all}");

    // -o json: Envoy's protobuf JSON, nested Any with their @type.
    let json: serde_json::Value = serde_json::from_str(&proxy_config(&[
        "cluster", &addr, "-o", "json", "--subset", "v1",
    ]))
    .expect("JSON");
    let names: Vec<&str> = json
        .as_array()
        .expect("an array of clusters")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["outbound|9080|v1|reviews.default.svc.cluster.local"]
    );
    assert_eq!(
        json[0]["metadata"]["filterMetadata"]["istio"]["config"],
        "/apis/networking.istio.io/v1/namespaces/default/destination-rule/reviews"
    );
    // ECDS: istioctl's table, and the filter as JSON.
    let ecds = proxy_config(&["ecds", &addr]);
    assert!(ecds.starts_with("ECDS NAME"), "{ecds}");
    assert!(
        has_row(
            &ecds,
            &["shared-lua", "envoy.extensions.filters.http.lua.v3.Lua"]
        ),
        "{ecds}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&proxy_config(&["ecds", &addr, "-o", "json"])).expect("JSON");
    assert_eq!(json[0]["name"], "shared-lua");
    assert_eq!(
        json[0]["typedConfig"]["defaultSourceCode"]["inlineString"],
        "function envoy_on_response(h) end"
    );
    let all: serde_json::Value =
        serde_json::from_str(&proxy_config(&["all", &addr, "-o", "json"])).expect("JSON");
    let text_all = all.to_string();
    assert!(text_all.contains("\"@type\":\"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager\""), "{text_all}");
    for name in [
        "outbound|9080||reviews.default.svc.cluster.local",
        "outbound|9080||ratings.default.svc.cluster.local",
        "BlackHoleCluster",
    ] {
        assert!(
            all["clusters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["name"] == name),
            "{name} in {text_all}"
        );
    }
    assert!(
        all["routes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "9080")
    );
    assert!(
        all["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["clusterName"] == "outbound|9080|v1|reviews.default.svc.cluster.local")
    );
}

#[test]
fn an_agent_that_cannot_be_reached_or_named() {
    // Nothing listens there: a clear error, exit 1.
    let out = pasactl(&["proxy-config", "cluster", "127.0.0.1:1"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot reach the agent's admin endpoint at 127.0.0.1:1")
            && err.contains("is pasa-agent running?"),
        "{err}"
    );
    // A name no agent reports under: the store says so, exit 1.
    let data = tempfile::tempdir().unwrap();
    let pcp = Pcp::start(data.path());
    let out = pcp.ctl(&["pc", "all", "productpage-1.default"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("no proxy \"productpage-1.default\" reports to the store"),
        "{err}"
    );
}
