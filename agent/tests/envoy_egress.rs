//! Egress through a real egress gateway, the way Istio's egress task routes it: a sidecar (with
//! Istio's capture rules) sends a plain request for an external host; a VirtualService bound to
//! the mesh sends it to `istio-egressgateway`; a Gateway and a VirtualService bound to it send
//! it on to the external service (a `MESH_EXTERNAL` ServiceEntry). Two pods (network namespaces
//! joined by a veth pair), two agents, two Envoys; the "external" app runs in the gateway's
//! namespace. Over SotW and then Delta:
//!
//! - the request reaches the external app, through the sidecar's cluster of the egress gateway
//!   and the gateway's cluster of the external host (both Envoys count it);
//! - removing the mesh VirtualService sends the sidecar straight to the external host (the
//!   ServiceEntry's own cluster), bypassing the gateway.
//!
//! Needs what `envoy_sidecar.rs` needs; says loudly when it skipped.

mod common;

use std::collections::BTreeMap;

use common::envoy::{Envoy, Netns, WAIT, agent_bootstrap};
use common::sidecar;
use common::store::StoreServer;
use common::traffic::{Backend, until};
use serde_json::{Value, json};

const CLIENT_NODE: &str = "sidecar~10.10.0.1~client-1.shop~shop.svc.cluster.local";
const EGRESS_NODE: &str =
    "router~10.10.0.2~istio-egressgateway-1.istio-system~istio-system.svc.cluster.local";
const EGRESS_LABELS: &str = "istio=egressgateway,app=istio-egressgateway";
const EXTERNAL: &str = "api.external.example";
const EGRESS_CLUSTER: &str = "outbound|8080||istio-egressgateway.istio-system.svc.cluster.local";
const EXTERNAL_CLUSTER: &str = "outbound|80||api.external.example";

fn mesh() -> Vec<Value> {
    vec![
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
               "metadata": {"name": "istio-egressgateway", "namespace": "istio-system"},
               "spec": {"addresses": ["10.96.9.9"],
                        "ports": [{"name": "http", "port": 8080}],
                        "endpoints": [{"address": "10.10.0.2",
                                       "labels": {"istio": "egressgateway"}}]}}),
        // The external service, reached at 10.10.0.2:80 (its app runs in the gateway's pod).
        json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
               "metadata": {"name": "external-api", "namespace": "shop"},
               "spec": {"hosts": [EXTERNAL], "location": "MESH_EXTERNAL",
                        "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                        "resolution": "STATIC",
                        "endpoints": [{"address": "10.10.0.2"}]}}),
        json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
               "metadata": {"name": "egress", "namespace": "istio-system"},
               "spec": {"selector": {"istio": "egressgateway"},
                        "servers": [{"port": {"number": 8080, "name": "http", "protocol": "HTTP"},
                                     "hosts": [EXTERNAL]}]}}),
        json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
               "metadata": {"name": "external-api-from-gateway", "namespace": "istio-system"},
               "spec": {"hosts": [EXTERNAL], "gateways": ["istio-system/egress"],
                        "http": [{"route": [{"destination": {"host": EXTERNAL,
                                                             "port": {"number": 80}}}]}]}}),
        mesh_route(),
    ]
}

/// The mesh's route of the external host to the egress gateway.
fn mesh_route() -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
           "metadata": {"name": "external-api-via-egress", "namespace": "shop"},
           "spec": {"hosts": [EXTERNAL], "gateways": ["mesh"],
                    "http": [{"route": [{"destination": {
                        "host": "istio-egressgateway.istio-system.svc.cluster.local",
                        "port": {"number": 8080}}}]}]}})
}

fn requests_to(stats: &BTreeMap<String, u64>, cluster: &str) -> u64 {
    stats
        .get(&format!("cluster.{cluster};.upstream_rq_total"))
        .copied()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_reaches_an_external_service_through_the_egress_gateway() {
    if sidecar::skip_without_capture(
        "a_sidecar_reaches_an_external_service_through_the_egress_gateway",
    ) {
        return;
    }
    let data = tempfile::tempdir().expect("temporary directory");
    let store = StoreServer::start(&data.path().join("db"), 0).await;
    store.apply(&mesh()).await;
    let ca = sidecar::ca();
    let (client_dir, egress_dir) = (data.path().join("client"), data.path().join("egress"));
    // Both proxies hold workload certificates (auto mTLS clusters warm on them).
    let client_agent = sidecar::agent_with_certificate(
        &store,
        &client_dir,
        CLIENT_NODE,
        "app=client",
        &ca,
        "client",
    );
    let egress_agent = sidecar::agent_with_certificate(
        &store,
        &egress_dir,
        EGRESS_NODE,
        EGRESS_LABELS,
        &ca,
        "istio-egressgateway",
    );

    for delta in [false, true] {
        let protocol = if delta { "Delta" } else { "SotW" };
        let (client_ns, egress_ns): (Netns, Netns) = sidecar::joined("10.10.0.1", "10.10.0.2");
        sidecar::capture(&client_ns);
        let _external = Backend::start(&egress_ns, "external-app", "10.10.0.2:80", None);
        let egress = Envoy::start_in(
            egress_ns,
            agent_bootstrap(&egress_agent, EGRESS_NODE, EGRESS_LABELS, delta),
            None,
        )
        .await;
        let client = Envoy::start_in(
            client_ns,
            agent_bootstrap(&client_agent, CLIENT_NODE, "app=client", delta),
            Some(sidecar::PROXY_GID),
        )
        .await;

        // Any address: the capture hands the connection to the sidecar, which routes by host.
        let url = "http://10.96.50.1/v1/things";
        let host = ["--host", EXTERNAL];
        let a = until(&client.netns, url, &host, "the external app", |a| {
            a.status == 200
        });
        assert_eq!(
            a.backend.as_deref(),
            Some("external-app"),
            "{protocol}: {a:?}"
        );
        let (client_stats, egress_stats) = (client.stats().await, egress.stats().await);
        assert!(
            requests_to(&client_stats, EGRESS_CLUSTER) >= 1,
            "{protocol}: the sidecar sent it to the egress gateway"
        );
        assert_eq!(
            requests_to(&client_stats, EXTERNAL_CLUSTER),
            0,
            "{protocol}: the sidecar did not go to the external host itself"
        );
        assert!(
            requests_to(&egress_stats, EXTERNAL_CLUSTER) >= 1,
            "{protocol}: the gateway sent it on to the external host"
        );
        println!("{protocol}: sidecar → egress gateway → external service");

        // Without the mesh route, the sidecar goes straight to the ServiceEntry's cluster.
        store
            .delete("VirtualService", "shop", "external-api-via-egress")
            .await;
        let before = requests_to(&egress.stats().await, EXTERNAL_CLUSTER);
        until(&client.netns, url, &host, "the direct route", |a| {
            a.status == 200 && a.backend.as_deref() == Some("external-app")
        });
        let deadline = std::time::Instant::now() + WAIT;
        while requests_to(&client.stats().await, EXTERNAL_CLUSTER) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{protocol}: the sidecar never went straight to the external host"
            );
            until(&client.netns, url, &host, "the direct route", |a| {
                a.status == 200
            });
        }
        assert_eq!(
            requests_to(&egress.stats().await, EXTERNAL_CLUSTER),
            before,
            "{protocol}: the gateway is bypassed"
        );
        println!("{protocol}: without the mesh route the sidecar goes direct");

        for (who, envoy) in [("sidecar", &client), ("egress gateway", &egress)] {
            let rejected = envoy.rejected().await;
            assert!(
                rejected.is_empty(),
                "{protocol}: the {who} rejected updates: {rejected:?}"
            );
        }
        store.apply(&[mesh_route()]).await;
    }
    drop(client_agent);
    drop(egress_agent);
    store.stop().await;
}
