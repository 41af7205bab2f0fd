//! `pasa-pcp --kubeconfig` against a **fake** Kubernetes API server (pasa-kube's, run in this
//! process), end to end: the real binary leads its Lease, syncs Services,
//! EndpointSlices, pods and Istio config into its embedded store through its validating write
//! path (an object istiod would refuse is refused and counted), restarts without writing
//! anything, and deletes what was deleted while it was down; with remote clusters registered by
//! Secrets (more fakes), it is ready once they are synced or timed out, and says which.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Pcp;
use pasa_kube::fake_apiserver::{FakeApiServer, grant_reading, shipped_rbac_without};
use serde_json::{Value, json};

/// A kubeconfig whose current context is the fake.
fn kubeconfig(dir: &Path, fake: &FakeApiServer) -> String {
    kubeconfig_with(dir, fake, "{}")
}

/// A kubeconfig whose current context is the fake, with the user `user` (YAML flow mapping).
fn kubeconfig_with(dir: &Path, fake: &FakeApiServer, user: &str) -> String {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\n\
         clusters: [{{name: fake, cluster: {{server: 'http://{}'}}}}]\n\
         users: [{{name: fake, user: {user}}}]\n\
         contexts: [{{name: fake, context: {{cluster: fake, user: fake, namespace: default}}}}]\n\
         current-context: fake\n",
        fake.addr
    );
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// Polls PCP's `/readyz` (each poll bounded, 20 s in all) until its answer contains `want`.
fn until_readyz(pcp: &Pcp, want: &str) -> String {
    let start = Instant::now();
    loop {
        let text = pcp.admin_get("/readyz");
        if text.contains(want) {
            return text;
        }
        assert!(
            start.elapsed() < common::WAIT,
            "/readyz never said {want:?}; last:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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
    fake.put_namespace("pasa-system", &[]);
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

/// `/readyz` says what is true for each role, and why not ready: a Lease namespace that does
/// not exist (and what to do), a leader whose first sync waits for a resource RBAC refuses
/// (named, with the metric), then ready once granted; a standby is ready and says who leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_says_what_the_syncer_waits_for() {
    let fake = FakeApiServer::start().await;
    cluster(&fake);
    fake.enforce_rbac(&shipped_rbac_without("virtualservices"));
    let dir = tempfile::tempdir().unwrap();
    let token = FakeApiServer::token_for("pasa-system", "pasa-pcp");
    let config = kubeconfig_with(dir.path(), &fake, &format!("{{token: {token}}}"));
    let args = |identity: &'static str| {
        vec![
            "--kubeconfig".to_string(),
            config.clone(),
            "--identity".into(),
            identity.into(),
            "--lease-namespace".into(),
            "pasa-system".into(),
        ]
    };
    let leader_args = args("pcp-0");
    let leader_args: Vec<&str> = leader_args.iter().map(String::as_str).collect();
    let pcp =
        tokio::task::block_in_place(|| Pcp::start_with(&dir.path().join("data-0"), &leader_args));
    let missing = tokio::task::block_in_place(|| until_readyz(&pcp, "does not exist"));
    assert!(missing.starts_with("HTTP/1.1 503"), "{missing}");
    assert!(
        missing.contains(
            "syncer: cannot take part in the election on Lease pasa-system/pasa-pcp-syncer"
        ) && missing.contains("--lease-namespace"),
        "{missing}"
    );

    fake.put_namespace("pasa-system", &[]);
    let waiting = tokio::task::block_in_place(|| {
        until_readyz(&pcp, "first sync not done: waiting for virtualservices")
    });
    assert!(waiting.starts_with("HTTP/1.1 503"), "{waiting}");
    assert!(
        waiting.contains("virtualservices.networking.istio.io (forbidden: virtualservices.networking.istio.io is forbidden: User \"system:serviceaccount:pasa-system:pasa-pcp\" cannot list"),
        "{waiting}"
    );
    let metrics = tokio::task::block_in_place(|| pcp.metrics());
    assert_eq!(
        metric(
            &metrics,
            "pasa_kube_waiting{resource=\"virtualservices.networking.istio.io\",reason=\"forbidden\"}"
        ),
        1.0,
        "{metrics}"
    );
    assert_eq!(metric(&metrics, "pasa_kube_synced"), 0.0);

    fake.enforce_rbac(&grant_reading(
        "pasa-system",
        "pasa-pcp",
        "networking.istio.io",
        "virtualservices",
    ));
    let ready = tokio::task::block_in_place(|| until_readyz(&pcp, "HTTP/1.1 200"));
    assert!(
        ready.contains("syncer: leading (Lease pasa-system/pasa-pcp-syncer); synced"),
        "{ready}"
    );

    // A second replica stands by, ready, and says who leads.
    let standby_args = args("pcp-1");
    let standby_args: Vec<&str> = standby_args.iter().map(String::as_str).collect();
    let standby =
        tokio::task::block_in_place(|| Pcp::start_with(&dir.path().join("data-1"), &standby_args));
    let standing = tokio::task::block_in_place(|| until_readyz(&standby, "standing by"));
    assert!(standing.starts_with("HTTP/1.1 200"), "{standing}");
    assert!(
        standing
            .contains("syncer: standing by: Lease pasa-system/pasa-pcp-syncer is held by pcp-0"),
        "{standing}"
    );
    tokio::task::block_in_place(|| {
        standby.terminate();
        pcp.terminate();
    });
}

/// A Secret of the config cluster registering remote clusters: (cluster ID, kubeconfig).
fn remote_secret(name: &str, clusters: &[(&str, String)]) -> Value {
    use base64::Engine;
    let data: serde_json::Map<String, Value> = clusters
        .iter()
        .map(|(id, config)| {
            let encoded = base64::engine::general_purpose::STANDARD.encode(config);
            (id.to_string(), json!(encoded))
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Secret",
           "metadata": {"name": name, "namespace": "pasa-system",
                        "labels": {"istio/multiCluster": "true"}},
           "data": data})
}

/// Polls `pasactl remote-clusters` (each run bounded, 20 s in all) until its table has the
/// row `want` (its cells).
fn until_remote_clusters(pcp: &Pcp, want: &[&str]) -> String {
    let start = Instant::now();
    loop {
        let table = pcp.ok(&["remote-clusters"]);
        if table
            .lines()
            .any(|l| l.split_whitespace().eq(want.iter().copied()))
        {
            return table;
        }
        assert!(
            start.elapsed() < common::WAIT,
            "pasactl remote-clusters never showed {want:?}; last:\n{table}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_clusters_are_synced_and_a_missing_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = FakeApiServer::start().await;
    config.put_namespace("pasa-system", &[]);
    let east = FakeApiServer::start().await;
    cluster(&east);
    let reserved = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let west_addr = reserved.local_addr().unwrap();
    drop(reserved);
    config.put(remote_secret(
        "istio-remote-secret",
        &[
            (
                "east",
                pasa_kube::fake_apiserver::kubeconfig(east.addr, "east"),
            ),
            (
                "west",
                pasa_kube::fake_apiserver::kubeconfig(west_addr, "west"),
            ),
        ],
    ));
    let path = kubeconfig(dir.path(), &config);
    let args = [
        "--kubeconfig",
        path.as_str(),
        "--lease-namespace",
        "pasa-system",
        "--identity",
        "pcp-0",
        "--remote-cluster-timeout",
        "1s",
    ];
    let pcp = tokio::task::block_in_place(|| Pcp::start_with(&dir.path().join("data"), &args));
    // Ready without west, naming it and what it waits for.
    let ready = tokio::task::block_in_place(|| until_readyz(&pcp, "HTTP/1.1 200"));
    assert!(
        ready.contains("remote-clusters: east (pasa-system/istio-remote-secret) synced")
            && ready.contains(
                "west (pasa-system/istio-remote-secret) timeout: not synced within 1s; waiting for"
            ),
        "{ready}"
    );
    let metrics = tokio::task::block_in_place(|| pcp.metrics());
    for (sample, value) in [
        (
            "istiod_remote_cluster_sync_status{cluster=\"west\",cluster_type=\"remote\",status=\"timeout\"}",
            1.0,
        ),
        (
            "istiod_remote_cluster_sync_status{cluster=\"east\",cluster_type=\"remote\",status=\"synced\"}",
            1.0,
        ),
        ("remote_cluster_sync_timeouts_total{cluster=\"west\"}", 1.0),
        ("istiod_managed_clusters{cluster_type=\"remote\"}", 2.0),
    ] {
        assert_eq!(metric(&metrics, sample), value, "{sample}\n{metrics}");
    }
    // east's Service, named for its cluster, beside the config cluster's (none here).
    let reviews =
        tokio::task::block_in_place(|| get_json(&pcp, "serviceendpoints", "reviews.east.cluster"))
            .expect("east's reviews");
    assert_eq!(reviews["spec"]["service"], "reviews");
    assert_eq!(reviews["spec"]["cluster"], "east");
    // istiod's /debug/clusterz, and pasactl's table of it.
    let clusterz = tokio::task::block_in_place(|| pcp.admin_get("/debug/clusterz"));
    let body = clusterz.split("\r\n\r\n").nth(1).unwrap_or_default();
    let entries: Value = serde_json::from_str(body).expect("clusterz JSON");
    assert_eq!(
        entries
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (
                e["id"].as_str().unwrap(),
                e["secretName"].as_str().unwrap(),
                e["syncStatus"].as_str().unwrap()
            ))
            .collect::<Vec<_>>(),
        [
            ("Kubernetes", "", "synced"),
            ("east", "pasa-system/istio-remote-secret", "synced"),
            ("west", "pasa-system/istio-remote-secret", "timeout"),
        ]
    );
    let table = tokio::task::block_in_place(|| pcp.ok(&["remote-clusters"]));
    let rows: Vec<Vec<&str>> = table
        .lines()
        .take(4)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec!["NAME", "SECRET", "STATUS", "PCP"],
            vec!["Kubernetes", "synced", "pcp-0"],
            vec!["east", "pasa-system/istio-remote-secret", "synced", "pcp-0"],
            vec![
                "west",
                "pasa-system/istio-remote-secret",
                "timeout",
                "pcp-0"
            ],
        ],
        "{table}"
    );
    assert!(
        table.contains("west timeout: not synced within 1s"),
        "{table}"
    );

    // west comes up: it is synced, and its objects come.
    let west = FakeApiServer::start_at(west_addr).await;
    cluster(&west);
    tokio::task::block_in_place(|| {
        until_remote_clusters(
            &pcp,
            &["west", "pasa-system/istio-remote-secret", "synced", "pcp-0"],
        )
    });
    let ratings =
        tokio::task::block_in_place(|| get_json(&pcp, "serviceendpoints", "ratings.west.cluster"));
    assert!(ratings.is_some());

    // A cluster registered once PCP is ready does not make it unready while it syncs; its
    // state is shown.
    let reserved = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let north_addr = reserved.local_addr().unwrap();
    drop(reserved);
    config.put(remote_secret(
        "istio-remote-secret-north",
        &[(
            "north",
            pasa_kube::fake_apiserver::kubeconfig(north_addr, "north"),
        )],
    ));
    let syncing = tokio::task::block_in_place(|| {
        until_readyz(
            &pcp,
            "north (pasa-system/istio-remote-secret-north) syncing",
        )
    });
    assert!(syncing.starts_with("HTTP/1.1 200"), "{syncing}");
    tokio::task::block_in_place(|| pcp.terminate());
}

/// A remote cluster's pods are injected on Istio's remote path as that cluster's: the
/// `pasa.io/injection` label of *its* namespace decides (PCP follows every registered
/// cluster's namespaces for this), and the agents get its cluster ID and network. A cluster no
/// Secret registers is answered with why its namespaces are not known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_clusters_pods_are_injected_by_its_own_namespace_labels() {
    use common::webhook_client::{Client, ca_of, env_values, patch_of};
    let dir = tempfile::tempdir().unwrap();
    let config = FakeApiServer::start().await;
    config.put_namespace("pasa-system", &[]);
    config.put_namespace("shop", &[]);
    let east = FakeApiServer::start().await;
    cluster(&east);
    east.put_namespace("shop", &[("pasa.io/injection", "enabled")]);
    config.put(remote_secret(
        "istio-remote-secret",
        &[(
            "east",
            pasa_kube::fake_apiserver::kubeconfig(east.addr, "east"),
        )],
    ));
    let path = kubeconfig(dir.path(), &config);
    let data = dir.path().join("data");
    let args = [
        "--kubeconfig",
        path.as_str(),
        "--lease-namespace",
        "pasa-system",
        "--identity",
        "pcp-0",
        "--webhook-listen",
        "127.0.0.1:0",
    ];
    let pcp = tokio::task::block_in_place(|| Pcp::start_with(&data, &args));
    let client = Client::new(pcp.webhook.expect("webhook"), &ca_of(&data));
    let review = serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "pod-1", "operation": "CREATE", "namespace": "shop",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "web-"},
                "spec": {"containers": [{"name": "web", "image": "web"}]}}},
    }))
    .unwrap();
    // PCP's own shop is not labelled: not moved.
    let own = client.review_at("/inject", review.clone()).await;
    assert!(own["response"].get("patch").is_none(), "{own}");
    // east's is: moved, as east's, once PCP has seen east's namespaces.
    let deadline = Instant::now() + Duration::from_secs(20);
    let remote = loop {
        let r = client
            .review_at("/inject/cluster/east/net/n-east", review.clone())
            .await;
        if r["response"].get("patch").is_some() || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(remote["response"].get("patch").is_some(), "{remote}");
    let patch = patch_of(&remote);
    assert_eq!(env_values(&patch, "ISTIO_META_CLUSTER_ID"), ["east"]);
    assert_eq!(env_values(&patch, "ISTIO_META_NETWORK"), ["n-east"]);
    // A cluster nobody registered: not moved, and told why.
    let nowhere = client
        .review_at("/inject/cluster/nowhere", review.clone())
        .await;
    assert!(nowhere["response"].get("patch").is_none(), "{nowhere}");
    assert!(
        nowhere["response"]["warnings"]
            .to_string()
            .contains("cluster nowhere is not registered with PCP"),
        "{nowhere}"
    );
    tokio::task::block_in_place(|| pcp.terminate());
}
