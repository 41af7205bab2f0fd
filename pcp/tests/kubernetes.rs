//! `pasa-pcp --kubeconfig` against a **fake** Kubernetes API server (pasa-kube's, run in this
//! process), end to end: the real binary leads its Lease, syncs Services,
//! EndpointSlices, pods and Istio config into its embedded store through its validating write
//! path (an object istiod would refuse is refused and counted), restarts without writing
//! anything, and deletes what was deleted while it was down.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Pcp;
use pasa_kube::fake_apiserver::FakeApiServer;
use serde_json::{Value, json};

/// A kubeconfig whose current context is the fake.
fn kubeconfig(dir: &Path, fake: &FakeApiServer) -> String {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\n\
         clusters: [{{name: fake, cluster: {{server: 'http://{}'}}}}]\n\
         users: [{{name: fake, user: {{}}}}]\n\
         contexts: [{{name: fake, context: {{cluster: fake, user: fake, namespace: default}}}}]\n\
         current-context: fake\n",
        fake.addr
    );
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// A metric's value in the exposition text (0 when absent).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Polls PCP's metrics (each poll bounded, 20 s in all) until the first sync is done.
fn until_synced(pcp: &Pcp) -> String {
    let start = Instant::now();
    loop {
        let text = pcp.metrics();
        if metric(&text, "pasa_kube_synced") == 1.0 {
            return text;
        }
        assert!(
            start.elapsed() < common::WAIT,
            "pasa-pcp did not sync within {:?}:\n{text}",
            common::WAIT
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn get_json(pcp: &Pcp, kind: &str, name: &str) -> Option<Value> {
    let out = pcp.ctl(&["get", kind, name, "-n", "bookinfo", "-o", "json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).expect("JSON"))
}

fn cluster(fake: &FakeApiServer) {
    fake.put_namespace("bookinfo", &[]);
    fake.put(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "reviews-v1-x", "namespace": "bookinfo",
                     "labels": {"app": "reviews", "version": "v1"}},
        "spec": {"serviceAccountName": "bookinfo-reviews", "containers": []}}));
    for (name, ip) in [("reviews", "10.96.0.12"), ("ratings", "10.96.0.13")] {
        fake.put(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "bookinfo"},
            "spec": {"clusterIP": ip, "ports": [{"name": "http", "port": 9080}]}}));
    }
    fake.put(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "reviews-abc", "namespace": "bookinfo",
                     "labels": {"kubernetes.io/service-name": "reviews"}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 9080}],
        "endpoints": [{"addresses": ["10.42.0.7"],
                       "targetRef": {"kind": "Pod", "name": "reviews-v1-x", "namespace": "bookinfo"}}]}));
    fake.put(
        json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
        "metadata": {"name": "reviews", "namespace": "bookinfo"},
        "spec": {"host": "reviews", "subsets": [{"name": "v1", "labels": {"version": "v1"}}]}}),
    );
    // Stored by an API server whose webhook was away; istiod refuses it (a subset needs a name).
    fake.put(
        json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
        "metadata": {"name": "broken", "namespace": "bookinfo"},
        "spec": {"host": "ratings", "subsets": [{"labels": {"version": "v2"}}]}}),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pcp_syncs_a_cluster_through_its_validating_write_path() {
    let fake = FakeApiServer::start().await;
    cluster(&fake);
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path(), &fake);
    let data = dir.path().join("data");
    let args = [
        "--kubeconfig",
        config.as_str(),
        "--identity",
        "pcp-0",
        "--lease-namespace",
        "pasa-system",
    ];
    let (pcp, metrics) = tokio::task::block_in_place(|| {
        let pcp = Pcp::start_with(&data, &args);
        let metrics = until_synced(&pcp);
        (pcp, metrics)
    });
    assert!(
        pcp.ready_lines
            .iter()
            .any(|l| l.starts_with("pasa-pcp syncing Kubernetes cluster Kubernetes")),
        "{:?}",
        pcp.ready_lines
    );
    assert_eq!(metric(&metrics, "pasa_kube_leader"), 1.0);
    // Two services, one slice's part, one DestinationRule; the broken VirtualService refused.
    assert_eq!(
        metric(&metrics, "pasa_kube_sync_writes_total{result=\"applied\"}"),
        4.0,
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "pasa_kube_sync_writes_total{result=\"refused\"}"),
        1.0
    );
    assert_eq!(
        metric(
            &metrics,
            "pasa_pcp_documents_total{origin=\"Kubernetes\",verdict=\"Rejected\"}"
        ),
        1.0
    );
    let lease = fake
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            "pasa-system",
            "pasa-pcp-syncer",
        )
        .expect("the lease");
    assert_eq!(lease["spec"]["holderIdentity"], "pcp-0");

    let (part, dr, broken) = tokio::task::block_in_place(|| {
        (
            get_json(&pcp, "sep", "reviews-abc.endpointslice"),
            get_json(&pcp, "dr", "reviews"),
            get_json(&pcp, "dr", "broken"),
        )
    });
    let part = part.expect("the slice's part is stored");
    assert_eq!(
        part["spec"]["endpoints"],
        json!([{"address": "10.42.0.7", "labels": {"app": "reviews", "version": "v1",
                    "service.istio.io/workload-name": "reviews-v1-x"},
                "serviceAccount": "bookinfo-reviews"}])
    );
    assert_eq!(part["metadata"]["labels"]["pasa.io/cluster"], "Kubernetes");
    assert_eq!(dr.expect("the DestinationRule")["spec"]["host"], "reviews");
    assert!(broken.is_none(), "istiod's validation refuses it");

    // Down, the cluster changes; then a restart that finds nothing else to write.
    tokio::task::block_in_place(|| pcp.terminate());
    let released = fake
        .get(
            "coordination.k8s.io/v1",
            "Lease",
            "pasa-system",
            "pasa-pcp-syncer",
        )
        .unwrap();
    assert!(
        released["spec"]["holderIdentity"].is_null(),
        "the lease was given up on shutdown: {released}"
    );
    fake.delete("v1", "Service", "bookinfo", "ratings");
    let (pcp, metrics) = tokio::task::block_in_place(|| {
        let pcp = Pcp::start_with(&data, &args);
        let metrics = until_synced(&pcp);
        (pcp, metrics)
    });
    assert_eq!(
        metric(&metrics, "pasa_kube_sync_writes_total{result=\"deleted\"}"),
        1.0
    );
    assert_eq!(
        metric(&metrics, "pasa_kube_sync_writes_total{result=\"applied\"}"),
        0.0,
        "nothing else changed: nothing written"
    );
    let ratings = tokio::task::block_in_place(|| get_json(&pcp, "sep", "ratings"));
    assert!(ratings.is_none(), "deleted while PCP was down");
    tokio::task::block_in_place(|| pcp.terminate());
}
