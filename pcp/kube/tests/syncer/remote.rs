//! Remote clusters against **fake** API servers: one for the config cluster (its Secrets
//! register the others) and one or two for remote clusters, each a `FakeApiServer` reached by
//! the kubeconfig a Secret holds, all syncing into one **fake** store.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use pasa_kube::fake_apiserver::{FakeApiServer, kubeconfig, kubeconfig_of, shipped_remote_rbac};
use pasa_kube::remote::{
    RemoteClusters, RemoteMetrics, RemoteSettings, RemoteStatus, Sources, SyncState,
};
use pasa_kube::selectors::DiscoverySelectors;
use pasa_kube::syncer::{Reads, SyncConfig};
use serde_json::{Value, json};

use super::{FakeStore, Target, bookinfo, service};

/// PCP's namespace in the config cluster, where the Secrets are.
const PCP_NAMESPACE: &str = "pasa-system";

fn settings(timeout: Duration) -> RemoteSettings {
    RemoteSettings {
        sync: SyncConfig {
            cluster_id: "Kubernetes".into(),
            discovery: DiscoverySelectors::all(),
            ingress: pasa_kube::ingress::Settings::default(),
            gateway_api: pasa_kube::gateway_api::Settings::default(),
            send_unhealthy_endpoints: true,
            api_server: String::new(),
            reads: Reads::Everything,
            remote: false,
            system_namespace: "istio-system".into(),
            mesh_networks: None,
        },
        timeout,
    }
}

fn start(config: &FakeApiServer, store: &FakeStore, timeout: Duration) -> RemoteClusters {
    let sources = Sources::Secrets {
        client: config.client(),
        namespace: PCP_NAMESPACE.into(),
    };
    RemoteClusters::start(
        sources,
        settings(timeout),
        store.clone(),
        Arc::new(RemoteMetrics::default()),
    )
}

/// A Secret registering clusters: each (cluster ID, kubeconfig).
fn secret(name: &str, clusters: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> = clusters
        .iter()
        .map(|(id, config)| {
            let encoded = base64::engine::general_purpose::STANDARD.encode(config);
            (id.to_string(), json!(encoded))
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": PCP_NAMESPACE,
                     "labels": {"istio/multiCluster": "true"}},
        "data": data,
    })
}

/// Waits (at most 20 s, woken by each change) until the remote clusters' status satisfies
/// `done`.
async fn until(remotes: &RemoteClusters, what: &str, done: impl Fn(&RemoteStatus) -> bool) {
    let mut status = remotes.status();
    let waited = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if done(&status.borrow_and_update()) {
                return;
            }
            status.changed().await.expect("the controller stopped");
        }
    })
    .await;
    if waited.is_err() {
        panic!(
            "timed out waiting until {what}; status {:?}",
            remotes.status().borrow()
        );
    }
}

fn state(status: &RemoteStatus, id: &str) -> Option<SyncState> {
    status.clusters.get(id).map(|c| c.state)
}

fn config_cluster(fake: &FakeApiServer) {
    fake.put_namespace(PCP_NAMESPACE, &[]);
}

/// Two remote clusters with the same Service write two objects, each named for its cluster;
/// a Secret registering PCP's own cluster, or one another Secret registered first, is refused.
#[tokio::test]
async fn remote_clusters_registered_by_secrets_are_synced_under_their_own_names() {
    let config = FakeApiServer::start().await;
    config_cluster(&config);
    let (east, west) = (FakeApiServer::start().await, FakeApiServer::start().await);
    bookinfo(&east);
    bookinfo(&west);
    let east_config = kubeconfig(east.addr, "east");
    let west_config = kubeconfig(west.addr, "west");
    config.put(secret("remote-east", &[("east", &east_config)]));
    config.put(secret(
        "remote-more",
        &[
            ("west", &west_config),
            ("Kubernetes", &east_config),
            ("east", &west_config),
        ],
    ));
    // Not labelled: not a registration.
    let mut unlabelled = secret("unlabelled", &[("north", &west_config)]);
    unlabelled["metadata"]["labels"] = json!({});
    config.put(unlabelled);
    let store = FakeStore::default();
    let remotes = start(&config, &store, Duration::from_secs(30));
    until(&remotes, "east and west synced", |s| {
        s.ready()
            && state(s, "east") == Some(SyncState::Synced)
            && state(s, "west") == Some(SyncState::Synced)
    })
    .await;
    let status = remotes.status().borrow().clone();
    assert_eq!(
        status.clusters.keys().collect::<Vec<_>>(),
        ["east", "west"],
        "PCP's own ID and a second registration of east are refused; north is not labelled"
    );
    assert_eq!(status.clusters["east"].source, "pasa-system/remote-east");
    assert_eq!(status.clusters["west"].source, "pasa-system/remote-more");
    assert_eq!(
        store.names(),
        [
            "bookinfo/ratings.east.cluster",
            "bookinfo/ratings.west.cluster",
            "bookinfo/reviews-a.east.endpointslice",
            "bookinfo/reviews-a.west.endpointslice",
            "bookinfo/reviews.east.cluster",
            "bookinfo/reviews.west.cluster",
        ]
    );
    let reviews = store.spec("bookinfo", "reviews.west.cluster").unwrap();
    assert_eq!(reviews["service"], "reviews");
    assert_eq!(reviews["cluster"], "west");
    let part = store
        .spec("bookinfo", "reviews-a.east.endpointslice")
        .unwrap();
    assert_eq!(
        (&part["service"], &part["cluster"]),
        (&json!("reviews"), &json!("east"))
    );
    // Only the registry is read from a remote cluster: an Istio config object there is not.
    east.put(
        json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "reviews", "namespace": "bookinfo"},
        "spec": {"hosts": ["reviews"]}}),
    );
    east.put(service("bookinfo", "details", 9082));
    store
        .until("details of east", |s| {
            s.spec("bookinfo", "details.east.cluster").is_some()
        })
        .await;
    assert!(store.names().iter().all(|n| !n.ends_with("/reviews")));
    assert_eq!(east.lists_of("virtualservices"), 0);

    // A key leaves its Secret: its cluster's objects go, the others' stay.
    config.put(secret("remote-more", &[("Kubernetes", &east_config)]));
    store
        .until("nothing of west", |s| {
            s.names().iter().all(|n| !n.contains(".west."))
        })
        .await;
    until(&remotes, "west gone", |s| !s.clusters.contains_key("west")).await;
    assert!(
        store
            .names()
            .contains(&"bookinfo/reviews.east.cluster".to_string())
    );
}

/// A changed kubeconfig is used once it has listed its cluster: one that cannot reach it
/// leaves the old syncing; a removed Secret deletes what its clusters wrote.
#[tokio::test]
async fn a_changed_kubeconfig_replaces_the_old_once_synced_and_a_removed_secret_deletes_all() {
    let config = FakeApiServer::start().await;
    config_cluster(&config);
    let east = FakeApiServer::start().await;
    bookinfo(&east);
    config.put(secret(
        "remote-east",
        &[("east", &kubeconfig(east.addr, "east"))],
    ));
    let store = FakeStore::default();
    let remotes = start(&config, &store, Duration::from_secs(30));
    until(&remotes, "east synced", |s| {
        state(s, "east") == Some(SyncState::Synced)
    })
    .await;
    let before = store.names();

    // A kubeconfig that reaches nothing: the old one stays, the status says so.
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere_addr = nowhere.local_addr().unwrap();
    drop(nowhere);
    config.put(secret(
        "remote-east",
        &[("east", &kubeconfig(nowhere_addr, "east"))],
    ));
    until(&remotes, "the new kubeconfig tried", |s| {
        s.clusters
            .get("east")
            .is_some_and(|c| !c.replacing.is_empty() && c.state == SyncState::Synced)
    })
    .await;
    east.put(service("bookinfo", "details", 9082));
    store
        .until("details, written by the old kubeconfig's syncer", |s| {
            s.spec("bookinfo", "details.east.cluster").is_some()
        })
        .await;

    // The same cluster, reached by a new API server (rotated credentials, a moved address):
    // it replaces the old once listed, and compares everything.
    let moved = FakeApiServer::start().await;
    moved.put_namespace("bookinfo", &[]);
    moved.put(service("bookinfo", "ratings", 9081));
    config.put(secret(
        "remote-east",
        &[("east", &kubeconfig(moved.addr, "east"))],
    ));
    store
        .until("what the moved API server holds", |s| {
            s.names() == ["bookinfo/ratings.east.cluster"]
        })
        .await;
    until(&remotes, "the new kubeconfig in use", |s| {
        s.clusters
            .get("east")
            .is_some_and(|c| c.replacing.is_empty() && c.state == SyncState::Synced)
    })
    .await;
    assert_ne!(before, store.names());

    // The Secret goes: so does what its cluster wrote.
    config.delete("v1", "Secret", PCP_NAMESPACE, "remote-east");
    store
        .until("nothing of east", |s| s.names().is_empty())
        .await;
    until(&remotes, "east gone", |s| s.clusters.is_empty()).await;
}

/// A remote cluster that is down at start: PCP is ready after the timeout, naming it; its
/// objects come once it is up.
#[tokio::test]
async fn a_remote_down_at_start_times_out_then_syncs_when_up() {
    let config = FakeApiServer::start().await;
    config_cluster(&config);
    let east = FakeApiServer::start().await;
    bookinfo(&east);
    let reserved = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let later = reserved.local_addr().unwrap();
    drop(reserved);
    config.put(secret(
        "remotes",
        &[
            ("east", &kubeconfig(east.addr, "east")),
            ("west", &kubeconfig(later, "west")),
        ],
    ));
    let store = FakeStore::default();
    let remotes = start(&config, &store, Duration::from_millis(500));
    until(&remotes, "ready without west", |s| {
        s.ready() && state(s, "west") == Some(SyncState::Timeout)
    })
    .await;
    let status = remotes.status().borrow().clone();
    assert_eq!(state(&status, "east"), Some(SyncState::Synced));
    let summary = status.summary();
    assert!(
        summary.contains("west (pasa-system/remotes) timeout") && summary.contains("waiting for"),
        "{summary}"
    );
    assert!(store.names().iter().all(|n| !n.contains(".west.")));

    let west = FakeApiServer::start_at(later).await;
    west.put_namespace("shop", &[]);
    west.put(service("shop", "cart", 8080));
    until(&remotes, "west synced", |s| {
        state(s, "west") == Some(SyncState::Synced)
    })
    .await;
    assert!(
        store
            .names()
            .contains(&"shop/cart.west.cluster".to_string())
    );
}

/// What a remote cluster wrote and lost while PCP was away is deleted when its syncer
/// compares; what a cluster no Secret registers any more wrote is deleted once the Secrets
/// are read; PCP's own cluster's objects are not touched.
#[tokio::test]
async fn deletions_while_pcp_was_away_are_reconciled_per_cluster() {
    let config = FakeApiServer::start().await;
    config_cluster(&config);
    let east = FakeApiServer::start().await;
    bookinfo(&east);
    config.put(secret(
        "remote-east",
        &[("east", &kubeconfig(east.addr, "east"))],
    ));
    let store = FakeStore::default();
    let stored = |name: &str, cluster: &str| {
        json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
               "metadata": {"name": name, "namespace": "bookinfo",
                            "labels": {"pasa.io/cluster": cluster}},
               "spec": {"service": name.split('.').next().unwrap(), "cluster": cluster,
                        "ports": [{"name": "http", "port": 80}]}})
    };
    for (name, cluster) in [
        ("gone.east.cluster", "east"),
        ("cart.old.cluster", "old"),
        ("reviews", "Kubernetes"),
        // Another PCP's own cluster's object, under its own name: not a remote's, kept.
        ("billing", "old"),
    ] {
        store
            .apply(stored(name, cluster), false, false)
            .await
            .unwrap();
    }
    let remotes = start(&config, &store, Duration::from_secs(30));
    until(&remotes, "east synced", |s| {
        state(s, "east") == Some(SyncState::Synced)
    })
    .await;
    store
        .until("the stale objects deleted", |s| {
            let names: BTreeSet<String> = s.names().into_iter().collect();
            !names.contains("bookinfo/gone.east.cluster")
                && !names.contains("bookinfo/cart.old.cluster")
        })
        .await;
    let names = store.names();
    assert!(names.contains(&"bookinfo/reviews".to_string()), "{names:?}");
    assert!(names.contains(&"bookinfo/billing".to_string()), "{names:?}");
    assert!(
        names.contains(&"bookinfo/reviews.east.cluster".to_string()),
        "{names:?}"
    );
}

/// Every cluster's endpoints are of the network their pod names, else of their cluster's
/// system namespace's; a network gateway Service says where it is reached, and follows its
/// nodes. The remote is read as `deploy/remote`'s reader, under the RBAC it ships.
#[tokio::test]
async fn networks_come_from_pods_and_the_system_namespace_and_gateways_from_services() {
    let config = FakeApiServer::start().await;
    config_cluster(&config);
    let east = FakeApiServer::start().await;
    // The remote's API server grants PCP's reader only what deploy/remote ships.
    east.enforce_rbac(&shipped_remote_rbac());
    east.put_namespace("istio-system", &[("topology.istio.io/network", "n-east")]);
    east.put_namespace("bookinfo", &[]);
    let pod = |name: &str, labels: Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "bookinfo", "labels": labels},
               "spec": {"nodeName": "edge-1"}})
    };
    east.put(pod("reviews-1", json!({"app": "reviews"})));
    east.put(pod(
        "reviews-2",
        json!({"app": "reviews", "topology.istio.io/network": "n-pod"}),
    ));
    east.put(service("bookinfo", "reviews", 9080));
    east.put(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "reviews-a", "namespace": "bookinfo",
                     "labels": {"kubernetes.io/service-name": "reviews"}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.1.0.1"], "targetRef": {"kind": "Pod", "name": "reviews-1"}},
            {"addresses": ["10.1.0.2"], "targetRef": {"kind": "Pod", "name": "reviews-2"}},
        ],
    }));
    let gateway = |name: &str, spec: Value, status: Value, annotations: Value| {
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": "istio-system",
                            "labels": {"topology.istio.io/network": "n-east"},
                            "annotations": annotations},
               "spec": spec, "status": status})
    };
    east.put(gateway(
        "eastwest",
        json!({"type": "LoadBalancer", "ports": [{"name": "tls", "port": 15443}]}),
        json!({"loadBalancer": {"ingress": [{"ip": "35.1.2.3"}]}}),
        json!({}),
    ));
    east.put(gateway(
        "eastwest-np",
        json!({"type": "NodePort", "ports": [{"name": "tls", "port": 15443, "nodePort": 31443}]}),
        json!({}),
        json!({"traffic.istio.io/nodeSelector": "{\"pool\": \"edge\"}"}),
    ));
    let node = |ip: &str| {
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "edge-1", "labels": {"pool": "edge"}},
               "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                                        {"type": "ExternalIP", "address": ip}]}})
    };
    east.put(node("198.51.100.1"));
    config.put(secret(
        "remote-east",
        &[(
            "east",
            &kubeconfig_of(
                east.addr,
                "east",
                ("istio-system", "istio-reader-service-account"),
            ),
        )],
    ));
    let store = FakeStore::default();
    let remotes = start(&config, &store, Duration::from_secs(30));
    until(&remotes, "east synced", |s| {
        state(s, "east") == Some(SyncState::Synced)
    })
    .await;
    let part = store
        .spec("bookinfo", "reviews-a.east.endpointslice")
        .unwrap();
    let networks: Vec<&Value> = part["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["network"])
        .collect();
    assert_eq!(networks, [&json!("n-east"), &json!("n-pod")]);
    let lb = store.spec("istio-system", "eastwest.east.cluster").unwrap();
    assert_eq!(lb["externalAddresses"], json!(["35.1.2.3"]));
    assert_eq!(
        lb["networkGateways"],
        json!([{"network": "n-east", "address": "35.1.2.3", "port": 15443}])
    );
    let np = store
        .spec("istio-system", "eastwest-np.east.cluster")
        .unwrap();
    assert_eq!(
        np["networkGateways"],
        json!([{"network": "n-east", "address": "198.51.100.1", "port": 31443}])
    );

    // The node's address changes: the NodePort gateway follows. The system namespace's
    // network changes: the endpoints without a network of their own follow.
    east.put(node("198.51.100.9"));
    store
        .until("the gateway at the node's new address", |s| {
            s.spec("istio-system", "eastwest-np.east.cluster").unwrap()["networkGateways"][0]
                ["address"]
                == "198.51.100.9"
        })
        .await;
    east.put_namespace("istio-system", &[("topology.istio.io/network", "n-east-2")]);
    store
        .until("the cluster's new network", |s| {
            s.spec("bookinfo", "reviews-a.east.endpointslice").unwrap()["endpoints"][0]["network"]
                == "n-east-2"
        })
        .await;

    // A load balancer known by name (as AWS gives them): the gateways are at the addresses the
    // name resolves to, as istiod resolves it; the name stays among the external addresses.
    east.put(gateway(
        "eastwest",
        json!({"type": "LoadBalancer", "ports": [{"name": "tls", "port": 15443}]}),
        json!({"loadBalancer": {"ingress": [{"hostname": "localhost"}]}}),
        json!({}),
    ));
    store
        .until("the gateway at the name's addresses", |s| {
            let lb = s.spec("istio-system", "eastwest.east.cluster").unwrap();
            let gateways = lb["networkGateways"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            lb["externalAddresses"] == json!(["localhost"])
                && !gateways.is_empty()
                && gateways.iter().all(|g| {
                    g["address"]
                        .as_str()
                        .and_then(|a| a.parse::<std::net::IpAddr>().ok())
                        .is_some_and(|ip| ip.is_loopback())
                })
        })
        .await;
}

/// Kubeconfig files in a directory register clusters as Secrets do; a file removed removes its
/// cluster's objects.
#[tokio::test]
async fn a_kubeconfig_directory_registers_remote_clusters() {
    let east = FakeApiServer::start().await;
    bookinfo(&east);
    let dir = std::env::temp_dir().join(format!("pasa-remote-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("east.yaml");
    std::fs::write(&file, kubeconfig(east.addr, "east")).unwrap();
    let store = FakeStore::default();
    let remotes = RemoteClusters::start(
        Sources::Directory(dir.clone()),
        settings(Duration::from_secs(30)),
        store.clone(),
        Arc::new(RemoteMetrics::default()),
    );
    until(&remotes, "east synced", |s| {
        state(s, "east") == Some(SyncState::Synced)
    })
    .await;
    assert_eq!(
        remotes.status().borrow().clusters["east"].source,
        file.display().to_string()
    );
    assert!(
        store
            .names()
            .contains(&"bookinfo/reviews.east.cluster".to_string())
    );
    // A cluster whose name cannot label what PCP writes (an EKS cluster's ARN) fails, saying so.
    let arn = "arn:aws:eks:us-west-2:1:cluster/shop";
    std::fs::write(dir.join("eks.yaml"), kubeconfig(east.addr, arn)).unwrap();
    until(&remotes, "the ARN refused", |s| {
        s.clusters.get(arn).is_some_and(|c| {
            c.state == SyncState::Failed && c.detail.contains("cannot label what PCP writes")
        })
    })
    .await;
    std::fs::remove_file(dir.join("eks.yaml")).unwrap();
    // A file that does not read: the directory's previous reading stays, and the status says
    // why; mended, the problem is gone.
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "clusters: 7").unwrap();
    until(&remotes, "the bad file named", |s| {
        s.source_problem
            .as_deref()
            .is_some_and(|p| p.contains("bad.yaml"))
    })
    .await;
    assert_eq!(
        state(&remotes.status().borrow(), "east"),
        Some(SyncState::Synced)
    );
    std::fs::remove_file(&bad).unwrap();
    until(&remotes, "the directory read again", |s| {
        s.source_problem.is_none()
    })
    .await;
    std::fs::remove_file(&file).unwrap();
    store
        .until("nothing of east", |s| s.names().is_empty())
        .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A remote cluster's syncer never replaces an object of the name it would write that it did
/// not write: here PCP's own cluster's part of an EndpointSlice whose name has a dot.
#[tokio::test]
async fn a_remote_cluster_never_replaces_another_clusters_object() {
    let config = FakeApiServer::start().await;
    config_cluster(&config);
    let east = FakeApiServer::start().await;
    bookinfo(&east);
    config.put(secret(
        "remote-east",
        &[("east", &kubeconfig(east.addr, "east"))],
    ));
    let store = FakeStore::default();
    let own = json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
        "metadata": {"name": "reviews-a.east.endpointslice", "namespace": "bookinfo",
                     "labels": {"pasa.io/cluster": "Kubernetes"}},
        "spec": {"service": "reviews", "cluster": "Kubernetes",
                 "endpoints": [{"address": "10.9.0.1"}]}});
    store.apply(own.clone(), false, false).await.unwrap();
    let remotes = start(&config, &store, Duration::from_secs(30));
    until(&remotes, "east synced", |s| {
        state(s, "east") == Some(SyncState::Synced)
    })
    .await;
    assert!(store.spec("bookinfo", "reviews.east.cluster").is_some());
    assert_eq!(
        store.spec("bookinfo", "reviews-a.east.endpointslice"),
        Some(own["spec"].clone()),
        "the own cluster's object stays"
    );
}

/// The injecting webhook's view of remote namespaces: each registered cluster's namespaces
/// (not PCP's own ID's, whatever a Secret says), gone with the Secret that registered it.
#[tokio::test]
async fn remote_namespaces_follow_the_registered_clusters() {
    use pasa_kube::remote::namespaces::{RemoteNamespaces, Unknown};
    let config = FakeApiServer::start().await;
    let east = FakeApiServer::start().await;
    east.put_namespace("shop", &[("pasa.io/injection", "enabled")]);
    config.put(secret(
        "istio-remote-secret-east",
        &[
            ("east", &kubeconfig(east.addr, "east")),
            ("Kubernetes", &kubeconfig(east.addr, "own")),
        ],
    ));
    let namespaces = RemoteNamespaces::follow(
        Sources::Secrets {
            client: config.client(),
            namespace: PCP_NAMESPACE.into(),
        },
        "Kubernetes",
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while namespaces.labels("east", "shop").is_err() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        namespaces
            .labels("east", "shop")
            .unwrap()
            .get("pasa.io/injection"),
        Some(&"enabled".to_string())
    );
    assert_eq!(
        namespaces.labels("east", "cart"),
        Err(Unknown::Namespace {
            cluster: "east".into(),
            namespace: "cart".into()
        })
    );
    assert_eq!(
        namespaces.labels("Kubernetes", "shop"),
        Err(Unknown::Cluster("Kubernetes".into()))
    );
    config.delete("v1", "Secret", PCP_NAMESPACE, "istio-remote-secret-east");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while namespaces.labels("east", "shop").is_ok() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        namespaces.labels("east", "shop"),
        Err(Unknown::Cluster("east".into()))
    );
}
