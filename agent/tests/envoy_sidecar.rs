//! A real sidecar: Envoy 1.40 bootstrapped by `pasa-agent bootstrap`, fed by the real
//! `pasa-agent` (workload certificate from `--cert-dir`), capturing its pod's traffic with
//! iptables rules like Istio's `istio-iptables` (outbound to 15001, inbound to 15006, the
//! proxy's own user 1337 let through). The pod is a network namespace the test makes; the rest
//! of the cluster (the backends) is a second one, joined by a veth pair. Over SotW and then
//! Delta:
//!
//! - a plain request to a service's virtual IP is routed by its VirtualService, subsets chosen
//!   by labels;
//! - a pod that is not ready is held UNHEALTHY and takes no traffic, and is left out where a
//!   DestinationRule's `minHealthPercent` would let panic mode pick it;
//! - a service labelled for persistent sessions (the agent runs with
//!   `--persistent-session-filter`) keeps a client with its cookie on one pod, even once that
//!   pod is draining, while new clients go to the others;
//! - a destination the mesh does not know goes through `PassthroughCluster`, and to
//!   `BlackHoleCluster` once a Sidecar sets `REGISTRY_ONLY`;
//! - a request to the pod's own port from outside is captured inbound and reaches the app.
//!
//! Needs `envoy`, `python3`, `iptables`, `setpriv` and root; without them the test says loudly
//! that it skipped (or fails, with `PASA_E2E_REQUIRED`).

mod common;

use common::agent::Agent;
use common::envoy::{Envoy, Netns, agent_bootstrap};
use common::sidecar;
use common::store::StoreServer;
use common::traffic::{Backend, client, request, until};
use serde_json::{Value, json};

const POD_IP: &str = "10.10.0.1";
const NODE: &str = "sidecar~10.10.0.1~client-1.shop~shop.svc.cluster.local";
const LABELS: &str = "app=client";
const WEB_VIP: &str = "10.96.7.1";
const CART_VIP: &str = "10.96.7.3";

fn mesh() -> Vec<Value> {
    vec![
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
               "metadata": {"name": "web", "namespace": "shop"},
               "spec": {"addresses": [WEB_VIP],
                        "ports": [{"name": "http", "port": 80, "targetPort": 9001}],
                        "endpoints": [
                            {"address": "10.10.1.11", "labels": {"app": "web", "version": "v1"}},
                            {"address": "10.10.1.12", "labels": {"app": "web", "version": "v2"}},
                            {"address": "10.10.1.14", "labels": {"app": "web", "version": "v1"},
                             "ready": false}]}}),
        // The pod's own service: its port 8000 gets an inbound listener.
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
               "metadata": {"name": "client", "namespace": "shop"},
               "spec": {"addresses": ["10.96.7.2"],
                        "ports": [{"name": "http", "port": 8000}],
                        "endpoints": [{"address": POD_IP, "labels": {"app": "client"}}]}}),
        destination_rule(None),
        cart(None),
        json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
               "metadata": {"name": "web", "namespace": "shop"},
               "spec": {"hosts": ["web"], "http": [
                   {"match": [{"headers": {"x-version": {"exact": "v2"}}}],
                    "route": [{"destination": {"host": "web", "subset": "v2"}}]},
                   {"route": [{"destination": {"host": "web", "subset": "v1"}}]}]}}),
    ]
}

/// `cart`, whose sessions stay on one pod by the cookie `cart-session`; the pod at `draining`
/// shutting down.
fn cart(draining: Option<&str>) -> Value {
    let endpoints: Vec<Value> = ["10.10.1.15", "10.10.1.16"]
        .into_iter()
        .map(|address| {
            if Some(address) == draining {
                json!({"address": address, "labels": {"app": "cart"}, "ready": false,
                       "draining": true})
            } else {
                json!({"address": address, "labels": {"app": "cart"}})
            }
        })
        .collect();
    json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
           "metadata": {"name": "cart", "namespace": "shop",
                        "labels": {"istio.io/persistent-session": "cart-session"}},
           "spec": {"addresses": [CART_VIP],
                    "ports": [{"name": "http", "port": 80, "targetPort": 9001}],
                    "endpoints": endpoints}})
}

/// The subsets of `web`, with `traffic_policy` for all of them.
fn destination_rule(traffic_policy: Option<Value>) -> Value {
    let mut rule = json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
           "metadata": {"name": "web", "namespace": "shop"},
           "spec": {"host": "web", "subsets": [
               {"name": "v1", "labels": {"version": "v1"}},
               {"name": "v2", "labels": {"version": "v2"}}]}});
    if let Some(policy) = traffic_policy {
        rule["spec"]["trafficPolicy"] = policy;
    }
    rule
}

fn outbound_policy(mode: &str) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
           "metadata": {"name": "default", "namespace": "shop"},
           "spec": {"outboundTrafficPolicy": {"mode": mode}}})
}

/// The pod (`pod`, where Envoy runs) and the rest of the cluster (`cluster`): a veth pair,
/// the pod at 10.10.0.1, the backends' addresses behind the other end, the services' virtual
/// IPs routed out of the pod (and captured before they leave it).
fn network() -> (Netns, Netns) {
    let (pod, cluster) = sidecar::joined("10.10.0.1", "10.10.0.2");
    pod.run(&["ip", "route", "add", "10.10.1.0/24", "via", "10.10.0.2"]);
    for backend in [
        "10.10.1.11/32",
        "10.10.1.12/32",
        "10.10.1.13/32",
        "10.10.1.14/32",
        "10.10.1.15/32",
        "10.10.1.16/32",
    ] {
        cluster.run(&["ip", "addr", "add", backend, "dev", "lo"]);
    }
    sidecar::capture(&pod);
    (pod, cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_traffic_with_capture() {
    if sidecar::skip_without_capture("sidecar_traffic_with_capture") {
        return;
    }
    let data = tempfile::tempdir().expect("temporary directory");
    let store = StoreServer::start(&data.path().join("db"), 0).await;
    store.apply(&mesh()).await;
    let certs = data.path().join("certs");
    sidecar::workload_certificate(&certs, &sidecar::ca(), "client");
    let agent = Agent::start_in(
        NODE,
        store.addr,
        &data.path().join("agent"),
        &[
            "--labels",
            LABELS,
            "--cert-dir",
            certs.to_str().expect("UTF-8"),
            "--persistent-session-filter",
        ],
    );
    for delta in [false, true] {
        let protocol = if delta { "Delta" } else { "SotW" };
        let (pod, cluster) = network();
        let _web = [
            Backend::start(&cluster, "web-v1", "10.10.1.11:9001", None),
            Backend::start(&cluster, "web-v2", "10.10.1.12:9001", None),
            Backend::start(&cluster, "outside", "10.10.1.13:9001", None),
            Backend::start(&cluster, "web-v1-unready", "10.10.1.14:9001", None),
            Backend::start(&cluster, "10.10.1.15", "10.10.1.15:9001", None),
            Backend::start(&cluster, "10.10.1.16", "10.10.1.16:9001", None),
        ];
        let _app = Backend::start(&pod, "client-app", "0.0.0.0:8000", None);
        let envoy = Envoy::start_in(
            pod,
            agent_bootstrap(&agent, NODE, LABELS, delta),
            Some(sidecar::PROXY_GID),
        )
        .await;
        let pod = &envoy.netns;

        // Outbound, routed by the VirtualService; subsets by labels.
        let web = format!("http://{WEB_VIP}:80/hello");
        let host = ["--host", "web.shop.svc.cluster.local"];
        let a = until(pod, &web, &host, "the sidecar's outbound routes", |a| {
            a.status == 200
        });
        assert_eq!(a.backend.as_deref(), Some("web-v1"), "{protocol}: {a:?}");
        let a = request(
            pod,
            &web,
            &[
                "--host",
                "web.shop.svc.cluster.local",
                "--header",
                "x-version:v2",
            ],
        );
        assert_eq!(a.backend.as_deref(), Some("web-v2"), "{protocol}: {a:?}");
        println!("{protocol}: captured request to {WEB_VIP} routed by the VirtualService");

        // The pod that is not ready: held UNHEALTHY (as istiod sends it), so it takes nothing.
        let v1 = "outbound|80|v1|web.shop.svc.cluster.local";
        let hosts = envoy.hosts().await.remove(v1).unwrap_or_default();
        assert_eq!(
            hosts.get("10.10.1.14:9001").map(String::as_str),
            Some("/failed_eds_health"),
            "{protocol}: {v1} holds {hosts:?}"
        );
        assert_eq!(
            hosts.get("10.10.1.11:9001").map(String::as_str),
            Some("healthy"),
            "{protocol}: {v1} holds {hosts:?}"
        );
        let answers = client(pod, &[&web, "12", "--timeout", "3", host[0], host[1]]);
        let reached: Vec<_> = answers.iter().map(|a| a.backend.as_deref()).collect();
        assert!(
            reached.iter().all(|b| *b == Some("web-v1")),
            "{protocol}: the ready pod alone answers: {reached:?}"
        );
        // A minHealthPercent above 0 would let panic mode pick it: then it is left out.
        let panic_threshold = json!({"outlierDetection": {"minHealthPercent": 80}});
        store
            .apply(&[destination_rule(Some(panic_threshold))])
            .await;
        envoy
            .until_hosts(v1, "the unready pod left out", |h| {
                !h.contains_key("10.10.1.14:9001") && h.contains_key("10.10.1.11:9001")
            })
            .await;
        let answers = client(pod, &[&web, "12", "--timeout", "3", host[0], host[1]]);
        let reached: Vec<_> = answers.iter().map(|a| a.backend.as_deref()).collect();
        assert!(
            reached.iter().all(|b| *b == Some("web-v1")),
            "{protocol}: with a panic threshold: {reached:?}"
        );
        store.apply(&[destination_rule(None)]).await;
        println!("{protocol}: the pod that is not ready takes no traffic");

        persistent_sessions(&envoy, &store, protocol).await;

        // A destination the mesh does not know: passed through (ALLOW_ANY).
        let outside = "http://10.10.1.13:9001/out";
        let a = request(pod, outside, &[]);
        assert_eq!(
            a.backend.as_deref(),
            Some("outside"),
            "{protocol}: passthrough: {a:?}"
        );
        let stats = envoy.stats().await;
        assert!(
            stats
                .get("cluster.PassthroughCluster;.upstream_cx_total")
                .copied()
                .unwrap_or(0)
                >= 1,
            "{protocol}: through PassthroughCluster"
        );

        // Inbound from the rest of the cluster: captured to 15006, to the app.
        let a = until(
            &cluster,
            &format!("http://{POD_IP}:8000/in"),
            &[],
            "the inbound listener",
            |a| a.status == 200,
        );
        assert_eq!(
            a.backend.as_deref(),
            Some("client-app"),
            "{protocol}: {a:?}"
        );
        let stats = envoy.stats().await;
        assert!(
            stats
                .get("cluster.inbound|8000||;.upstream_rq_total")
                .copied()
                .unwrap_or(0)
                >= 1,
            "{protocol}: through inbound|8000||: {:?}",
            stats
                .iter()
                .filter(|(k, _)| k.contains("inbound"))
                .collect::<Vec<_>>()
        );
        // Prometheus sees the cluster as a tag, as for istiod's proxies.
        let (_, prometheus) = envoy.get("/stats/prometheus").await;
        assert!(
            prometheus.lines().any(|l| l
                .starts_with(r#"envoy_cluster_upstream_rq_total{cluster_name="inbound|8000||"}"#)),
            "{protocol}: the cluster_name tag: {:?}",
            prometheus
                .lines()
                .filter(|l| l.contains("upstream_rq_total"))
                .collect::<Vec<_>>()
        );
        println!("{protocol}: passthrough and inbound capture work");

        // REGISTRY_ONLY: the unknown destination goes to the black hole; the mesh still works.
        store.apply(&[outbound_policy("REGISTRY_ONLY")]).await;
        until(pod, outside, &[], "REGISTRY_ONLY", |a| a.backend.is_none());
        let stats = envoy.stats().await;
        assert!(
            stats
                .get("cluster.BlackHoleCluster;.upstream_cx_none_healthy")
                .copied()
                .unwrap_or(0)
                + stats
                    .get("cluster.BlackHoleCluster;.upstream_rq_total")
                    .copied()
                    .unwrap_or(0)
                >= 1,
            "{protocol}: through BlackHoleCluster: {:?}",
            stats
                .iter()
                .filter(|(k, _)| k.contains("BlackHole"))
                .collect::<Vec<_>>()
        );
        let a = request(pod, &web, &host);
        assert_eq!(a.backend.as_deref(), Some("web-v1"), "{protocol}: {a:?}");
        println!("{protocol}: REGISTRY_ONLY sends unknown destinations to BlackHoleCluster");

        let rejected = envoy.rejected().await;
        assert!(
            rejected.is_empty(),
            "{protocol}: Envoy rejected updates: {rejected:?}\n{}",
            envoy.rejection_log().join("\n")
        );
        drop(envoy);
        drop(cluster);
        // Back to ALLOW_ANY for the next protocol.
        store.apply(&[outbound_policy("ALLOW_ANY")]).await;
    }
    agent.terminate();
    store.stop().await;
}

/// `pasactl proxy-status`'s page of `node`, once it contains `expected` (bounded by `WAIT`).
async fn proxy_status_page(store: std::net::SocketAddr, node: &str, expected: &str) -> String {
    let deadline = tokio::time::Instant::now() + common::agent::WAIT;
    let mut client = pasa_proto::client::store_client(
        pasa_proto::client::endpoint(&store.to_string())
            .expect("an endpoint")
            .connect()
            .await
            .expect("the store answers"),
    );
    loop {
        let answer = pasa_proto::client::list_proxy_status(&mut client, Default::default())
            .await
            .expect("proxy status");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let page = answer
            .proxies
            .iter()
            .find(|e| e.status.as_ref().is_some_and(|s| s.node_id == node))
            .map(|entry| pasactl::cli::proxy_status::detail(entry, &answer, now))
            .unwrap_or_default();
        if page.contains(expected) {
            return page;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "proxy-status never showed {expected:?}: {page}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A client of `cart` that got a session cookie stays on its pod, also once that pod drains;
/// clients without one go to the other pod.
async fn persistent_sessions(envoy: &Envoy, store: &StoreServer, protocol: &str) {
    let pod = &envoy.netns;
    let url = format!("http://{CART_VIP}:80/basket");
    let host = ["--host", "cart.shop.svc.cluster.local"];
    let first = until(pod, &url, &host, "the cart service", |a| {
        a.status == 200 && a.headers.contains_key("set-cookie")
    });
    // `cart-session="<the pod's address, encoded>"; Path=/; HttpOnly`
    let set_cookie = &first.headers["set-cookie"];
    let cookie = set_cookie.split(';').next().unwrap_or_default();
    assert!(
        cookie.starts_with("cart-session="),
        "{protocol}: {set_cookie}"
    );
    let pinned = first.backend.clone().expect("a backend answered");
    let other = if pinned == "10.10.1.15" {
        "10.10.1.16"
    } else {
        "10.10.1.15"
    };
    let with_cookie = |count: &str| {
        let header = format!("Cookie:{cookie}");
        let args = [
            &url,
            count,
            "--timeout",
            "3",
            host[0],
            host[1],
            "--header",
            &header,
        ];
        client(pod, &args)
            .into_iter()
            .map(|a| a.backend)
            .collect::<Vec<_>>()
    };
    let reached = with_cookie("10");
    assert!(
        reached
            .iter()
            .all(|b| b.as_deref() == Some(pinned.as_str())),
        "{protocol}: the session stays on {pinned}: {reached:?}"
    );
    // The pinned pod shuts down: sent DRAINING, kept for the session, given no new client.
    store.apply(&[cart(Some(&pinned))]).await;
    let cluster = "outbound|80||cart.shop.svc.cluster.local";
    let pinned_host = format!("{pinned}:9001");
    envoy
        .until_hosts(cluster, "the pinned pod draining", |h| {
            h.get(&pinned_host).is_some_and(|flags| flags != "healthy")
        })
        .await;
    let reached = with_cookie("10");
    assert!(
        reached
            .iter()
            .all(|b| b.as_deref() == Some(pinned.as_str())),
        "{protocol}: the session stays on draining {pinned}: {reached:?}"
    );
    let fresh = client(pod, &[&url, "10", "--timeout", "3", host[0], host[1]]);
    let reached: Vec<_> = fresh.iter().map(|a| a.backend.as_deref()).collect();
    assert!(
        reached.iter().all(|b| *b == Some(other)),
        "{protocol}: new clients go to {other}: {reached:?}"
    );
    store.apply(&[cart(None)]).await;
    envoy
        .until_hosts(cluster, "the pinned pod back", |h| {
            h.get(&pinned_host).is_some_and(|flags| flags == "healthy")
        })
        .await;
    println!("{protocol}: a persistent session stays on its pod, draining or not");
}

/// The on-demand scope (`--scope on-demand`, docs/on-demand.md), with real Envoy over Delta and
/// iptables capture, and no Sidecar resource. Envoy starts holding none of the mesh's
/// services; each first request to a service it never saw is answered on its first try, routed
/// by the service's VirtualService (the agent learns the host from Envoy's VHDS request, widens
/// its store subscription, and answers once the store has). A destination the mesh does not
/// know passes through as under the eager scope, and a host the proxy may not see (exportTo)
/// is not routed; a service called by its virtual IP alone is found by its address; a host
/// created after its first miss is served once it exists; the learned hosts survive the
/// agent's restart. Envoy rejects nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_on_demand_with_capture() {
    if sidecar::skip_without_capture("sidecar_on_demand_with_capture") {
        return;
    }
    let data = tempfile::tempdir().expect("temporary directory");
    let store = StoreServer::start(&data.path().join("db"), 0).await;
    let mut mesh = mesh();
    // A service only its own namespace may see.
    mesh.push(
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
        "metadata": {"name": "vault", "namespace": "secrets",
                     "annotations": {"networking.istio.io/exportTo": "."}},
        "spec": {"addresses": ["10.96.7.8"],
                 "ports": [{"name": "http", "port": 9001}],
                 "endpoints": [{"address": "10.10.1.12", "labels": {"app": "vault"}}]}}),
    );
    // A service its client calls by address alone.
    mesh.push(
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
        "metadata": {"name": "pay", "namespace": "shop"},
        "spec": {"addresses": ["10.96.7.10"],
                 "ports": [{"name": "http", "port": 80, "targetPort": 9001}],
                 "endpoints": [{"address": "10.10.1.16"}]}}),
    );
    store.apply(&mesh).await;
    let certs = data.path().join("certs");
    sidecar::workload_certificate(&certs, &sidecar::ca(), "client");
    let agent_dir = data.path().join("agent");
    let start_agent = |extra: &[&str]| {
        let mut args = vec![
            "--labels",
            LABELS,
            "--cert-dir",
            certs.to_str().expect("UTF-8"),
            "--scope",
            "on-demand",
        ];
        args.extend_from_slice(extra);
        Agent::start_in(NODE, store.addr, &agent_dir, &args)
    };
    let agent = start_agent(&[]);
    let (pod, cluster) = network();
    let _backends = [
        Backend::start(&cluster, "web-v1", "10.10.1.11:9001", None),
        Backend::start(&cluster, "web-v2", "10.10.1.12:9001", None),
        Backend::start(&cluster, "outside", "10.10.1.13:9001", None),
        Backend::start(&cluster, "shipping", "10.10.1.14:9001", None),
        Backend::start(&cluster, "10.10.1.15", "10.10.1.15:9001", None),
        Backend::start(&cluster, "10.10.1.16", "10.10.1.16:9001", None),
    ];
    let _app = Backend::start(&pod, "client-app", "0.0.0.0:8000", None);
    let envoy = Envoy::start_in(
        pod,
        agent_bootstrap(&agent, NODE, LABELS, true),
        Some(sidecar::PROXY_GID),
    )
    .await;
    let pod = &envoy.netns;
    // Ready once its inbound side is served (the only service it starts with).
    until(
        &cluster,
        &format!("http://{POD_IP}:8000/in"),
        &[],
        "the inbound listener",
        |a| a.status == 200,
    );
    let held: Vec<String> = envoy.hosts().await.into_keys().collect();
    assert!(
        !held
            .iter()
            .any(|c| c.contains("web.shop") || c.contains("cart.shop")),
        "the proxy starts without the mesh's services: {held:?}"
    );

    // The first request to a service never seen: routed by its VirtualService, first try.
    let web = format!("http://{WEB_VIP}:80/hello");
    let started = std::time::Instant::now();
    let a = request(pod, &web, &["--host", "web.shop.svc.cluster.local"]);
    let first = started.elapsed();
    assert_eq!(
        a.backend.as_deref(),
        Some("web-v1"),
        "first request: {a:?}\n{}",
        envoy.log()
    );
    let a = request(pod, &web, &["--host", "web", "--header", "x-version:v2"]);
    assert_eq!(a.backend.as_deref(), Some("web-v2"), "header match: {a:?}");
    println!("on-demand: the first request to a service never seen answered in {first:?}");
    // Another, by its short name.
    let cart = format!("http://{CART_VIP}:80/basket");
    let a = request(pod, &cart, &["--host", "cart"]);
    assert_eq!(a.status, 200, "{a:?}");
    assert!(
        matches!(a.backend.as_deref(), Some("10.10.1.15" | "10.10.1.16")),
        "{a:?}"
    );
    // Another by its virtual IP alone (the `Host` is the address): the store finds the
    // service by its address, and the request is routed to its endpoint, not passed through.
    let a = request(pod, "http://10.96.7.10:80/pay", &[]);
    assert_eq!(
        a.backend.as_deref(),
        Some("10.10.1.16"),
        "by address: {a:?}"
    );

    // What the mesh does not know passes through, as under the eager scope (ALLOW_ANY); a
    // service the proxy may not see is one of them.
    let outside = "http://10.10.1.13:9001/out";
    let a = request(pod, outside, &[]);
    assert_eq!(a.backend.as_deref(), Some("outside"), "passthrough: {a:?}");
    let a = request(pod, outside, &["--host", "vault.secrets.svc.cluster.local"]);
    assert_eq!(a.backend.as_deref(), Some("outside"), "exportTo: {a:?}");

    // A host asked for before it exists: passed through, then served once it exists.
    let shipping = ["--host", "shipping.shop.svc.cluster.local:9001"];
    let a = request(pod, outside, &shipping);
    assert_eq!(a.backend.as_deref(), Some("outside"), "before: {a:?}");
    store
        .apply(&[
            json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
            "metadata": {"name": "shipping", "namespace": "shop"},
            "spec": {"addresses": ["10.96.7.9"],
                     "ports": [{"name": "http", "port": 9001}],
                     "endpoints": [{"address": "10.10.1.14"}]}}),
        ])
        .await;
    until(pod, outside, &shipping, "the host created later", |a| {
        a.backend.as_deref() == Some("shipping")
    });
    println!("on-demand: passthrough, exportTo and a host created after its first miss");

    // REGISTRY_ONLY: what the mesh does not know is refused, as the eager scope refuses it
    // (block_all's 502), also a host passed through before; the mesh still works.
    store.apply(&[outbound_policy("REGISTRY_ONLY")]).await;
    until(pod, outside, &[], "REGISTRY_ONLY", |a| a.status == 502);
    let a = request(pod, outside, &["--host", "elsewhere.example.com"]);
    assert_eq!(a.status, 502, "a host never seen: {a:?}");
    let a = request(pod, &web, &["--host", "web"]);
    assert_eq!(a.backend.as_deref(), Some("web-v1"), "{a:?}");
    store.apply(&[outbound_policy("ALLOW_ANY")]).await;
    println!("on-demand: REGISTRY_ONLY refuses what the mesh does not know");

    // Learned hosts, and the resolution time, as metrics; no catch-all in any route
    // configuration Envoy holds.
    let (_, metrics) = agent.get("/metrics").await;
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    assert!(value("pasa_agent_on_demand_hosts ") >= 3.0, "{metrics}");
    let resolved = value("pasa_agent_on_demand_resolution_seconds_count ");
    assert!(resolved >= 3.0, "{metrics}");
    println!(
        "on-demand: {resolved} names resolved by the agent in {:.1} ms on average (the store's \
         answer and the translation included)",
        1000.0 * value("pasa_agent_on_demand_resolution_seconds_sum ") / resolved
    );
    let dump = envoy.config_dump().await;
    let domains: Vec<String> = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| {
            c["dynamic_route_configs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|rc| {
            rc["route_config"]["virtual_hosts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|vh| vh["domains"].as_array().cloned().unwrap_or_default())
        .filter_map(|d| d.as_str().map(String::from))
        .collect();
    assert!(
        domains.iter().any(|d| d == "web") && !domains.iter().any(|d| d == "*"),
        "{domains:?}"
    );

    // A restarted agent starts with what it learned.
    agent.terminate();
    let agent = start_agent(&[]);
    let (_, metrics) = agent.get("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("pasa_agent_on_demand_hosts ") && !l.ends_with(" 0")),
        "{metrics}"
    );
    let a = until(
        pod,
        &web,
        &["--host", "web.shop"],
        "the restarted agent",
        |a| a.status == 200,
    );
    assert_eq!(a.backend.as_deref(), Some("web-v1"), "{a:?}");
    // `pasactl proxy-status <pod>` shows the scope.
    let page = proxy_status_page(store.addr, NODE, "SCOPE       on-demand").await;
    assert!(!page.contains("SCOPE       on-demand, 0 hosts"), "{page}");
    println!("on-demand: the learned hosts survive a restart; proxy-status shows them");

    // Hosts unused for --on-demand-idle are forgotten: Envoy is told their routes and clusters
    // are gone. Asked for again, one is learned again, and its first request is served.
    agent.terminate();
    let envoy_admin = format!("unix:{}", envoy.admin.display());
    let agent = start_agent(&["--on-demand-idle", "2s", "--envoy-admin", &envoy_admin]);
    let deadline = tokio::time::Instant::now() + common::agent::WAIT;
    loop {
        let held: Vec<String> = envoy.hosts().await.into_keys().collect();
        if !held.iter().any(|c| c.contains("web.shop")) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "web was never forgotten: {held:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (_, metrics) = agent.get("/metrics").await;
    assert!(
        metrics.lines().any(
            |l| l.starts_with("pasa_agent_on_demand_hosts_forgotten_total ") && !l.ends_with(" 0")
        ),
        "{metrics}"
    );
    let a = request(pod, &web, &["--host", "web.shop.svc.cluster.local"]);
    assert_eq!(
        a.backend.as_deref(),
        Some("web-v1"),
        "asked again: {a:?}\n{}",
        envoy.log()
    );
    println!("on-demand: an idle host is forgotten, and learned again when asked for");

    let rejected = envoy.rejected().await;
    assert!(
        rejected.is_empty(),
        "Envoy rejected updates: {rejected:?}\n{}",
        envoy.rejection_log().join("\n")
    );
    drop(envoy);
    drop(cluster);
    agent.terminate();
    store.stop().await;
}
