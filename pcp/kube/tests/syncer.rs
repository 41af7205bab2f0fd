//! The Kubernetes syncer against a **fake** Kubernetes API server (`pasa_kube::fake_apiserver`), driven by the
//! real `kube` client, writing into a **fake** store (an in-memory map standing for PCP's
//! write path, which pcp's own tests put behind it): Services, EndpointSlices, pods and nodes
//! reach the store and follow changes; a restart with nothing changed writes nothing; what was
//! deleted while the syncer was away is deleted; a compacted watch lists again and sees
//! deletions; discovery selectors limit the namespaces read; a refused write keeps what was
//! stored. Remote clusters ([`remote`]) run their fakes beside the config cluster's.

#[path = "syncer/remote.rs"]
mod remote;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pasa_kube::convert::StoreKey;
use pasa_kube::fake_apiserver::{FakeApiServer, grant_reading, shipped_rbac, shipped_rbac_without};
use pasa_kube::metrics::SyncMetrics;
use pasa_kube::selectors::DiscoverySelectors;
use pasa_kube::syncer::{Reads, SyncConfig, SyncStatus, Syncer, Target, WriteError};
use serde_json::{Value, json};

/// A **fake** store: documents by key, with the writes counted.
#[derive(Clone, Default)]
struct FakeStore {
    inner: Arc<Mutex<Stored>>,
    /// Counts the writes: what a test waits on for the store to change.
    written: Arc<tokio::sync::watch::Sender<u64>>,
}

#[derive(Default)]
struct Stored {
    docs: BTreeMap<StoreKey, Value>,
    applies: usize,
    deletes: usize,
    /// Names whose writes are refused, as validation would.
    refuse: BTreeSet<String>,
}

fn key(doc: &Value) -> StoreKey {
    StoreKey {
        kind: pasa_proto::Kind::from_kind_field(doc["kind"].as_str().unwrap()).unwrap(),
        namespace: doc["metadata"]["namespace"].as_str().unwrap().into(),
        name: doc["metadata"]["name"].as_str().unwrap().into(),
    }
}

impl Target for FakeStore {
    async fn owned(&self, cluster: &str) -> Result<Vec<Value>, WriteError> {
        let s = self.inner.lock().unwrap();
        let label = |d: &Value| d["metadata"]["labels"]["pasa.io/cluster"] == json!(cluster);
        Ok(s.docs.values().filter(|d| label(d)).cloned().collect())
    }

    async fn apply(
        &self,
        doc: Value,
        _generated: bool,
        create_only: bool,
    ) -> Result<(), WriteError> {
        let mut s = self.inner.lock().unwrap();
        let k = key(&doc);
        if create_only && s.docs.contains_key(&k) {
            return Err(WriteError::Refused(format!(
                "{k} was expected to not exist yet"
            )));
        }
        if s.refuse.contains(&k.name) {
            return Err(WriteError::Refused(format!(
                "{k}: spec.ports[0].port: refused"
            )));
        }
        s.applies += 1;
        s.docs.insert(k, doc);
        self.written.send_modify(|n| *n += 1);
        Ok(())
    }

    async fn delete(&self, key: &StoreKey) -> Result<(), WriteError> {
        let mut s = self.inner.lock().unwrap();
        s.deletes += 1;
        s.docs.remove(key);
        self.written.send_modify(|n| *n += 1);
        Ok(())
    }

    async fn clusters(&self) -> Result<BTreeSet<String>, WriteError> {
        let s = self.inner.lock().unwrap();
        let label = |d: &Value| {
            d["metadata"]["labels"]["pasa.io/cluster"]
                .as_str()
                .map(String::from)
        };
        Ok(s.docs.values().filter_map(label).collect())
    }
}

impl FakeStore {
    fn spec(&self, namespace: &str, name: &str) -> Option<Value> {
        let s = self.inner.lock().unwrap();
        s.docs
            .get(&StoreKey::service_endpoints(namespace, name))
            .map(|d| d["spec"].clone())
    }

    fn names(&self) -> Vec<String> {
        let s = self.inner.lock().unwrap();
        s.docs
            .keys()
            .map(|k| format!("{}/{}", k.namespace, k.name))
            .collect()
    }

    /// Waits (at most 20 s, woken by each write) until `done` holds of the store.
    async fn until(&self, what: &str, done: impl Fn(&FakeStore) -> bool) {
        let mut written = self.written.subscribe();
        let waited = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                written.borrow_and_update();
                if done(self) {
                    return;
                }
                written.changed().await.expect("the store stays");
            }
        })
        .await;
        if waited.is_err() {
            panic!(
                "timed out waiting until {what}; the store holds {:?}",
                self.names()
            );
        }
    }

    fn writes(&self) -> (usize, usize) {
        let s = self.inner.lock().unwrap();
        (s.applies, s.deletes)
    }
}

fn start(fake: &FakeApiServer, store: &FakeStore, discovery: DiscoverySelectors) -> Syncer {
    start_as(fake.client(), fake, store, discovery)
}

/// The syncer with a client of its own (a service account's).
fn start_as(
    client: pasa_kube::Client,
    fake: &FakeApiServer,
    store: &FakeStore,
    discovery: DiscoverySelectors,
) -> Syncer {
    let mut config = config(fake);
    config.discovery = discovery;
    Syncer::start(
        client,
        config,
        store.clone(),
        Arc::new(SyncMetrics::default()),
    )
}

/// PCP's own cluster's syncer as PCP sets it up by default.
fn config(fake: &FakeApiServer) -> SyncConfig {
    SyncConfig {
        cluster_id: "Kubernetes".into(),
        discovery: DiscoverySelectors::all(),
        ingress: pasa_kube::ingress::Settings::default(),
        gateway_api: pasa_kube::gateway_api::Settings::default(),
        send_unhealthy_endpoints: true,
        api_server: format!("http://{}", fake.addr),
        reads: Reads::Everything,
        remote: false,
        system_namespace: "istio-system".into(),
        mesh_networks: None,
    }
}

/// Waits (at most 10 s, woken by each step of the syncer) until `done` holds.
async fn until(syncer: &Syncer, what: &str, done: impl Fn(&SyncStatus) -> bool) -> SyncStatus {
    let mut status = syncer.status();
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let now = status.borrow_and_update().clone();
            if done(&now) {
                return now;
            }
            status.changed().await.expect("the syncer stopped");
        }
    })
    .await;
    match waited {
        Ok(s) => s,
        Err(_) => panic!(
            "timed out waiting until {what}; status {:?}",
            syncer.status().borrow()
        ),
    }
}

fn service(ns: &str, name: &str, port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterIP": format!("10.96.0.{port}"), "selector": {"app": name},
                 "ports": [{"name": "http", "port": port, "targetPort": 9080, "protocol": "TCP"}]},
    })
}

fn slice(ns: &str, name: &str, service: &str, pods: &[(&str, &str)]) -> Value {
    let endpoints: Vec<Value> = pods
        .iter()
        .map(|(pod, ip)| {
            json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": "node-1",
                   "targetRef": {"kind": "Pod", "name": pod, "namespace": ns}})
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 9080, "protocol": "TCP"}],
        "endpoints": endpoints,
    })
}

fn pod(ns: &str, name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels,
                     "annotations": {"kubectl.kubernetes.io/restartedAt": "now"}},
        "spec": {"serviceAccountName": "bookinfo-reviews", "nodeName": "node-1",
                 "containers": [{"name": "reviews", "image": "reviews:1"}]},
        "status": {"podIP": "10.42.0.7", "phase": "Running"},
    })
}

fn node(zone: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-1", "labels": {"topology.kubernetes.io/region": "us-east1",
                                                   "topology.kubernetes.io/zone": zone}},
    })
}

/// A small cluster: namespace bookinfo with reviews (one slice, one pod) and ratings.
fn bookinfo(fake: &FakeApiServer) {
    fake.put_namespace("bookinfo", &[]);
    fake.put(node("us-east1-b"));
    fake.put(pod(
        "bookinfo",
        "reviews-v1",
        json!({"app": "reviews", "version": "v1"}),
    ));
    fake.put(service("bookinfo", "reviews", 9080));
    fake.put(slice(
        "bookinfo",
        "reviews-a",
        "reviews",
        &[("reviews-v1", "10.42.0.7")],
    ));
    fake.put(service("bookinfo", "ratings", 9081));
}

#[tokio::test]
async fn services_endpoints_pods_and_nodes_reach_the_store_and_follow_changes() {
    let fake = FakeApiServer::start().await;
    bookinfo(&fake);
    let store = FakeStore::default();
    let syncer = start(&fake, &store, DiscoverySelectors::all());
    until(&syncer, "the first pass", |s| s.synced).await;
    assert_eq!(
        store.names(),
        [
            "bookinfo/ratings",
            "bookinfo/reviews",
            "bookinfo/reviews-a.endpointslice"
        ]
    );
    assert_eq!(
        store.spec("bookinfo", "reviews-a.endpointslice").unwrap(),
        json!({
            "service": "reviews",
            "endpointPorts": {"http": 9080},
            "endpoints": [{"address": "10.42.0.7", "labels": {"app": "reviews", "version": "v1",
                "service.istio.io/workload-name": "reviews-v1"},
                           "locality": "us-east1/us-east1-b", "serviceAccount": "bookinfo-reviews"}],
            "cluster": "Kubernetes",
        })
    );
    assert_eq!(
        store.spec("bookinfo", "reviews").unwrap()["ports"],
        json!([{"name": "http", "port": 9080}])
    );

    // A pod's labels change: its slice's part is written again.
    fake.put(pod(
        "bookinfo",
        "reviews-v1",
        json!({"app": "reviews", "version": "v2"}),
    ));
    until(&syncer, "the pod's new labels", |_| {
        store.spec("bookinfo", "reviews-a.endpointslice").unwrap()["endpoints"][0]["labels"]["version"]
            == "v2"
    })
    .await;
    // Its node moves zone: the locality follows.
    fake.put(node("us-east1-c"));
    until(&syncer, "the node's new zone", |_| {
        store.spec("bookinfo", "reviews-a.endpointslice").unwrap()["endpoints"][0]["locality"]
            == "us-east1/us-east1-c"
    })
    .await;
    // A pod change that the store does not keep (its status) writes nothing.
    let writes = store.writes();
    let mut restarted = pod(
        "bookinfo",
        "reviews-v1",
        json!({"app": "reviews", "version": "v2"}),
    );
    restarted["status"]["phase"] = json!("Succeeded");
    fake.put(restarted);
    fake.put(service("bookinfo", "details", 9082));
    until(&syncer, "details", |_| {
        store.spec("bookinfo", "details").is_some()
    })
    .await;
    assert_eq!(
        store.writes(),
        (writes.0 + 1, writes.1),
        "only details was written"
    );

    // A second slice, then the first goes; then a service goes.
    fake.put(slice(
        "bookinfo",
        "reviews-b",
        "reviews",
        &[("reviews-v3", "10.42.0.9")],
    ));
    fake.delete(
        "discovery.k8s.io/v1",
        "EndpointSlice",
        "bookinfo",
        "reviews-a",
    );
    fake.delete("v1", "Service", "bookinfo", "ratings");
    until(&syncer, "the slice and service deletions", |_| {
        store.names()
            == [
                "bookinfo/details",
                "bookinfo/reviews",
                "bookinfo/reviews-b.endpointslice",
            ]
    })
    .await;
    // A pod the slice names but the cluster does not have: the endpoint without its labels.
    assert_eq!(
        store.spec("bookinfo", "reviews-b.endpointslice").unwrap()["endpoints"],
        json!([{"address": "10.42.0.9", "locality": "us-east1/us-east1-c"}])
    );
    fake.put(pod(
        "bookinfo",
        "reviews-v3",
        json!({"app": "reviews", "version": "v3"}),
    ));
    until(&syncer, "the late pod's labels", |_| {
        store.spec("bookinfo", "reviews-b.endpointslice").unwrap()["endpoints"][0]["labels"]["version"]
            == "v3"
    })
    .await;
}

#[tokio::test]
async fn a_restart_writes_nothing_and_deletions_while_away_are_reconciled() {
    let fake = FakeApiServer::start().await;
    bookinfo(&fake);
    let store = FakeStore::default();
    let syncer = start(&fake, &store, DiscoverySelectors::all());
    until(&syncer, "the first pass", |s| s.synced).await;
    assert_eq!(store.writes(), (3, 0));
    drop(syncer);

    // Nothing changed: the second syncer compares and writes nothing.
    let syncer = start(&fake, &store, DiscoverySelectors::all());
    let status = until(&syncer, "the first pass after a restart", |s| s.synced).await;
    assert_eq!((status.applied, status.deleted), (0, 0));
    assert_eq!(store.writes(), (3, 0));
    drop(syncer);

    // While away: a service and a slice are deleted, another service changes. An object of
    // another cluster's syncer is not touched.
    fake.delete("v1", "Service", "bookinfo", "ratings");
    fake.delete(
        "discovery.k8s.io/v1",
        "EndpointSlice",
        "bookinfo",
        "reviews-a",
    );
    fake.put(service("bookinfo", "reviews", 9090));
    let other = json!({"apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
        "metadata": {"name": "remote", "namespace": "bookinfo",
                     "labels": {"pasa.io/cluster": "west"}}, "spec": {}});
    store.apply(other, false, false).await.unwrap();
    let syncer = start(&fake, &store, DiscoverySelectors::all());
    let status = until(&syncer, "the first pass after changes", |s| s.synced).await;
    assert_eq!((status.applied, status.deleted), (1, 2));
    assert_eq!(store.names(), ["bookinfo/remote", "bookinfo/reviews"]);
    assert_eq!(
        store.spec("bookinfo", "reviews").unwrap()["ports"][0]["port"],
        9090
    );
}

#[tokio::test]
async fn a_watch_from_a_compacted_version_lists_again_and_sees_deletions() {
    let fake = FakeApiServer::start().await;
    bookinfo(&fake);
    let store = FakeStore::default();
    let syncer = start(&fake, &store, DiscoverySelectors::all());
    until(&syncer, "the first pass", |s| s.synced).await;
    let lists = fake.lists_of("services");

    // A cut watch resumes: no list, and the change comes through.
    fake.cut_watches();
    fake.put(service("bookinfo", "details", 9082));
    until(&syncer, "details", |_| {
        store.spec("bookinfo", "details").is_some()
    })
    .await;
    assert_eq!(fake.lists_of("services"), lists, "resumed without a list");

    // Compacted away: 410 Gone, a list, and the deletion made meanwhile is found by comparing.
    fake.delete("v1", "Service", "bookinfo", "ratings");
    fake.compact();
    fake.cut_watches();
    until(&syncer, "the deletion seen through a list", |_| {
        store.spec("bookinfo", "ratings").is_none()
    })
    .await;
    assert!(fake.lists_of("services") > lists, "listed again");
    assert!(syncer.status().borrow().full_passes >= 2);
}

/// Discovery selectors that read the namespaces labelled `istio-discovery: enabled`.
fn istio_discovery_enabled() -> DiscoverySelectors {
    DiscoverySelectors::new(vec![
        serde_json::from_value(json!({"matchLabels": {"istio-discovery": "enabled"}})).unwrap(),
    ])
    .unwrap()
}

#[tokio::test]
async fn discovery_selectors_limit_the_namespaces_read() {
    let fake = FakeApiServer::start().await;
    fake.put_namespace("shop", &[("istio-discovery", "enabled")]);
    fake.put_namespace("legacy", &[]);
    fake.put(service("shop", "cart", 8080));
    fake.put(service("legacy", "billing", 8081));
    // An Ingress of legacy: what it becomes comes with its namespace.
    fake.put(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "billing", "namespace": "legacy",
                     "annotations": {"kubernetes.io/ingress.class": "istio"}},
        "spec": {"rules": [{"host": "billing.example.com", "http": {"paths": [
            {"path": "/", "pathType": "Prefix",
             "backend": {"service": {"name": "billing", "port": {"number": 8081}}}}]}}]}}),
    );
    let selectors = istio_discovery_enabled();
    let store = FakeStore::default();
    let syncer = start(&fake, &store, selectors);
    until(&syncer, "the first pass", |s| s.synced).await;
    assert_eq!(store.names(), ["shop/cart"]);

    // legacy is selected, shop is not any more.
    fake.put_namespace("legacy", &[("istio-discovery", "enabled")]);
    fake.put_namespace("shop", &[]);
    until(&syncer, "legacy in, shop out", |_| {
        let mut names = store.names();
        names.sort();
        names
            == [
                "istio-system/billing-istio-autogenerated-k8s-ingress-legacy",
                "legacy/billing",
                "legacy/billing-example-com-billing-istio-autogenerated-k8s-ingress",
            ]
    })
    .await;
}

#[tokio::test]
async fn a_refused_write_keeps_what_was_stored() {
    let fake = FakeApiServer::start().await;
    bookinfo(&fake);
    let store = FakeStore::default();
    let syncer = start(&fake, &store, DiscoverySelectors::all());
    until(&syncer, "the first pass", |s| s.synced).await;
    store.inner.lock().unwrap().refuse.insert("ratings".into());
    fake.put(service("bookinfo", "ratings", 9999));
    fake.put(service("bookinfo", "details", 9082));
    let status = until(&syncer, "the refusal", |s| s.refused == 1).await;
    assert_eq!(status.refused, 1);
    until(&syncer, "details", |_| {
        store.spec("bookinfo", "details").is_some()
    })
    .await;
    assert_eq!(
        store.spec("bookinfo", "ratings").unwrap()["ports"][0]["port"],
        9081,
        "the stored object stays"
    );
}

#[tokio::test]
async fn istio_config_is_read_at_the_newest_served_version() {
    let fake = FakeApiServer::start().await;
    fake.put_namespace("bookinfo", &[]);
    // Sidecars only at v1beta1; no PeerAuthentication CRD at all.
    fake.unserve("networking.istio.io/v1", "Sidecar");
    for version in ["v1", "v1beta1"] {
        fake.unserve(
            &format!("security.istio.io/{version}"),
            "PeerAuthentication",
        );
    }
    let vs = |weight: u32| {
        json!({
            "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "reviews", "namespace": "bookinfo", "labels": {"team": "a"},
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{…}",
                                         "owner": "team-a"}},
            "spec": {"hosts": ["reviews"], "http": [{"route": [
                {"destination": {"host": "reviews", "subset": "v1"}, "weight": weight},
                {"destination": {"host": "reviews", "subset": "v2"}, "weight": 100 - weight}]}]},
            "status": {"validationMessages": []},
        })
    };
    fake.put(vs(90));
    fake.put(json!({
        "apiVersion": "networking.istio.io/v1beta1", "kind": "Sidecar",
        "metadata": {"name": "default", "namespace": "bookinfo"},
        "spec": {"egress": [{"hosts": ["./*"]}]},
    }));
    let store = FakeStore::default();
    let syncer = start(&fake, &store, DiscoverySelectors::all());
    until(&syncer, "the first pass", |s| s.synced).await;
    let doc = |kind: pasa_proto::Kind, name: &str| {
        let key = StoreKey {
            kind,
            namespace: "bookinfo".into(),
            name: name.into(),
        };
        store.inner.lock().unwrap().docs.get(&key).cloned()
    };
    assert_eq!(
        doc(pasa_proto::Kind::VirtualService, "reviews").unwrap(),
        json!({
            "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "reviews", "namespace": "bookinfo",
                         "labels": {"team": "a", "pasa.io/cluster": "Kubernetes"},
                         "annotations": {"owner": "team-a"}},
            "spec": vs(90)["spec"],
        })
    );
    assert_eq!(
        doc(pasa_proto::Kind::Sidecar, "default").unwrap()["apiVersion"],
        "networking.istio.io/v1beta1"
    );

    fake.put(vs(50));
    until(&syncer, "the new weights", |_| {
        doc(pasa_proto::Kind::VirtualService, "reviews")
            .is_some_and(|d| d["spec"]["http"][0]["route"][0]["weight"] == 50)
    })
    .await;
    fake.delete(
        "networking.istio.io/v1",
        "VirtualService",
        "bookinfo",
        "reviews",
    );
    until(&syncer, "the deletion", |_| {
        doc(pasa_proto::Kind::VirtualService, "reviews").is_none()
    })
    .await;
}

/// A spec of every Istio kind the store keeps, each different in each `generation`.
fn every_kind(generation: u32) -> Vec<(pasa_proto::Kind, Value)> {
    use pasa_proto::Kind;
    vec![
        (
            Kind::VirtualService,
            json!({"hosts": ["reviews"], "http": [{"timeout": format!("{generation}s"), "route": [{"destination": {"host": "reviews"}}]}]}),
        ),
        (
            Kind::DestinationRule,
            json!({"host": "reviews", "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": generation}}}}),
        ),
        (
            Kind::ServiceEntry,
            json!({"hosts": ["api.example.com"], "ports": [{"number": 443 + generation, "name": "tls", "protocol": "TLS"}], "resolution": "DNS"}),
        ),
        (
            Kind::Gateway,
            json!({"selector": {"istio": "ingressgateway"}, "servers": [{"port": {"number": 80 + generation, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]}),
        ),
        (
            Kind::Sidecar,
            json!({"egress": [{"hosts": [format!("./svc-{generation}")]}]}),
        ),
        (
            Kind::WorkloadEntry,
            json!({"address": format!("10.0.0.{generation}")}),
        ),
        (
            Kind::PeerAuthentication,
            json!({"mtls": {"mode": if generation == 1 { "STRICT" } else { "PERMISSIVE" }}}),
        ),
        (
            Kind::RequestAuthentication,
            json!({"jwtRules": [{"issuer": format!("issuer-{generation}.example.com")}]}),
        ),
        (
            Kind::AuthorizationPolicy,
            json!({"action": "DENY", "rules": [{"to": [{"operation": {"ports": [(8000 + generation).to_string()]}}]}]}),
        ),
        (
            Kind::EnvoyFilter,
            json!({"configPatches": [{"applyTo": "HTTP_FILTER", "match": {"context": "SIDECAR_INBOUND"},
                   "patch": {"operation": "INSERT_BEFORE", "value": {"name": format!("filter-{generation}")}}}]}),
        ),
        (
            Kind::WorkloadGroup,
            json!({"template": {"serviceAccount": format!("sa-{generation}")}}),
        ),
        (Kind::ProxyConfig, json!({"concurrency": generation})),
        (
            Kind::Telemetry,
            json!({"tracing": [{"randomSamplingPercentage": f64::from(generation)}]}),
        ),
        (
            Kind::WasmPlugin,
            json!({"url": format!("oci://registry.example.com/plugin:{generation}")}),
        ),
        (
            Kind::TrafficExtension,
            json!({"lua": {"inlineCode": format!("-- {generation}")}}),
        ),
    ]
}

/// Creates or changes an object `one` of every Istio kind in `namespace`.
fn put_every_kind(fake: &FakeApiServer, namespace: &str, generation: u32) {
    for (kind, spec) in every_kind(generation) {
        fake.put(json!({
            "apiVersion": format!("{}/{}", kind.group(), kind.versions()[0]),
            "kind": kind.as_str(),
            "metadata": {"name": "one", "namespace": namespace},
            "spec": spec,
        }));
    }
}

/// Every Istio kind the store keeps goes the whole way: added, changed, deleted.
#[tokio::test]
async fn every_istio_kind_is_added_changed_and_deleted() {
    use pasa_proto::Kind;
    let fake = FakeApiServer::start().await;
    fake.put_namespace("bookinfo", &[]);
    let objects = every_kind;
    let put = |generation: u32| put_every_kind(&fake, "bookinfo", generation);
    put(1);
    let store = FakeStore::default();
    let syncer = start(&fake, &store, DiscoverySelectors::all());
    until(&syncer, "the first pass", |s| s.synced).await;
    let spec = |kind: Kind| {
        let key = StoreKey {
            kind,
            namespace: "bookinfo".into(),
            name: "one".into(),
        };
        store
            .inner
            .lock()
            .unwrap()
            .docs
            .get(&key)
            .map(|d| d["spec"].clone())
    };
    for (kind, want) in objects(1) {
        assert_eq!(spec(kind), Some(want), "{kind:?} added");
    }
    put(2);
    until(&syncer, "every kind changed", |_| {
        objects(2)
            .into_iter()
            .all(|(kind, want)| spec(kind) == Some(want))
    })
    .await;
    for (kind, _) in objects(2) {
        let api_version = format!("{}/{}", kind.group(), kind.versions()[0]);
        fake.delete(&api_version, kind.as_str(), "bookinfo", "one");
    }
    until(&syncer, "every kind deleted", |_| {
        objects(2).into_iter().all(|(kind, _)| spec(kind).is_none())
    })
    .await;
}

/// A health-checked WorkloadEntry's `Healthy` condition reaches the store as its
/// `pasa.io/healthy` annotation, and follows a change of its status alone (as istiod records
/// its VM's probes).
#[tokio::test]
async fn a_workload_entrys_health_follows_its_status() {
    let fake = FakeApiServer::start().await;
    fake.put_namespace("vms", &[]);
    let entry = |healthy: &str| {
        json!({
            "apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
            "metadata": {"name": "vm-1", "namespace": "vms",
                         "annotations": {"proxy.istio.io/health-checks-enabled": "true"}},
            "spec": {"address": "10.1.0.5", "labels": {"app": "vm"}},
            "status": {"conditions": [{"type": "Healthy", "status": healthy}]},
        })
    };
    fake.put(entry("False"));
    let store = FakeStore::default();
    let syncer = start(&fake, &store, DiscoverySelectors::all());
    until(&syncer, "the first pass", |s| s.synced).await;
    let key = StoreKey {
        kind: pasa_proto::Kind::WorkloadEntry,
        namespace: "vms".into(),
        name: "vm-1".into(),
    };
    let healthy = || {
        store.inner.lock().unwrap().docs.get(&key).map(|d| {
            d["metadata"]["annotations"]["pasa.io/healthy"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
    };
    assert_eq!(healthy().as_deref(), Some("false"));
    fake.put(entry("True"));
    until(&syncer, "the entry healthy", |_| {
        healthy().as_deref() == Some("true")
    })
    .await;
}

/// A Service labelled for persistent sessions keeps its terminating, still serving endpoints
/// (draining, for the sessions on them); labelling it afterwards rewrites its slices.
#[tokio::test]
async fn a_services_persistent_sessions_keep_its_draining_endpoints() {
    let fake = FakeApiServer::start().await;
    bookinfo(&fake);
    let mut terminating = slice(
        "bookinfo",
        "reviews-a",
        "reviews",
        &[("reviews-v1", "10.42.0.7")],
    );
    terminating["endpoints"][0]["conditions"] =
        json!({"ready": false, "serving": true, "terminating": true});
    fake.put(terminating);
    let store = FakeStore::default();
    let syncer = start(&fake, &store, DiscoverySelectors::all());
    until(&syncer, "the first pass", |s| s.synced).await;
    let key = StoreKey {
        kind: pasa_proto::Kind::ServiceEndpoints,
        namespace: "bookinfo".into(),
        name: "reviews-a.endpointslice".into(),
    };
    let endpoints = || {
        store
            .inner
            .lock()
            .unwrap()
            .docs
            .get(&key)
            .map(|d| d["spec"]["endpoints"].clone())
    };
    // Not labelled: a terminating endpoint is left out.
    assert_eq!(endpoints(), Some(Value::Null));
    let mut labelled = service("bookinfo", "reviews", 9080);
    labelled["metadata"]["labels"] = json!({"istio.io/persistent-session": "session"});
    fake.put(labelled);
    until(&syncer, "the draining endpoint kept", |_| {
        endpoints()
            == Some(
                json!([{"address": "10.42.0.7", "ready": false, "draining": true,
            "labels": {"app": "reviews", "version": "v1",
                       "service.istio.io/workload-name": "reviews-v1"},
            "locality": "us-east1/us-east1-b", "serviceAccount": "bookinfo-reviews"}]),
            )
    })
    .await;
    fake.put(service("bookinfo", "reviews", 9080));
    until(&syncer, "the draining endpoint left out again", |_| {
        endpoints() == Some(Value::Null)
    })
    .await;
}

/// An Ingress Istio serves (its class annotation, or an IngressClass of Istio's controller)
/// becomes the Gateway and VirtualService istiod generates, its backend's named port resolved
/// through the Service; one of another class does not; the Service's port renamed and the
/// Ingress deleted change and remove what it became.
#[tokio::test]
async fn ingresses_become_gateways_and_virtual_services() {
    use pasa_proto::Kind;
    let fake = FakeApiServer::start().await;
    fake.put_namespace("shop", &[]);
    fake.put_namespace("istio-system", &[]);
    fake.put(service("shop", "web", 8080));
    let ingress = |name: &str, class: Value, port: Value| {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
               "metadata": {"name": name, "namespace": "shop",
                            "annotations": class},
               "spec": {"rules": [{"host": format!("{name}.example.com"), "http": {"paths": [
                   {"path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": "web", "port": port}}}]}}]}})
    };
    fake.put(ingress(
        "web",
        json!({"kubernetes.io/ingress.class": "istio"}),
        json!({"name": "http"}),
    ));
    fake.put(ingress(
        "other",
        json!({"kubernetes.io/ingress.class": "nginx"}),
        json!({"number": 80}),
    ));
    fake.put(
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
                    "metadata": {"name": "istio-class"},
                    "spec": {"controller": "istio.io/ingress-controller"}}),
    );
    let mut by_class = ingress("classed", json!({}), json!({"number": 81}));
    by_class["spec"]["ingressClassName"] = json!("istio-class");
    fake.put(by_class);
    let store = FakeStore::default();
    let syncer = start(&fake, &store, DiscoverySelectors::all());
    until(&syncer, "the first pass", |s| s.synced).await;
    let doc = |kind: Kind, namespace: &str, name: &str| {
        let key = StoreKey {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        };
        store.inner.lock().unwrap().docs.get(&key).cloned()
    };
    let gateway = doc(
        Kind::Gateway,
        "istio-system",
        "web-istio-autogenerated-k8s-ingress-shop",
    )
    .expect("the Ingress's Gateway");
    assert_eq!(gateway["spec"]["selector"]["istio"], "ingressgateway");
    assert_eq!(
        gateway["metadata"]["labels"]["pasa.io/cluster"],
        "Kubernetes"
    );
    let vs = |name: &str| {
        doc(
            Kind::VirtualService,
            "shop",
            &format!("{name}-example-com-{name}-istio-autogenerated-k8s-ingress"),
        )
    };
    let web = vs("web").expect("the host's VirtualService");
    assert_eq!(
        web["metadata"]["annotations"]["internal.istio.io/route-semantics"],
        "ingress"
    );
    assert_eq!(
        web["spec"]["http"][0]["route"][0]["destination"],
        json!({"host": "web.shop.svc.cluster.local", "port": {"number": 8080}})
    );
    assert!(vs("classed").is_some(), "served by its IngressClass");
    assert!(vs("other").is_none(), "another class is not Istio's");

    // The Service's port renamed: the named port no longer resolves, so the path goes (and
    // with it the host's VirtualService, left without routes).
    let mut renamed = service("shop", "web", 8080);
    renamed["spec"]["ports"][0]["name"] = json!("web");
    fake.put(renamed);
    until(&syncer, "the path without a port left out", |_| {
        vs("web").is_none()
    })
    .await;
    assert!(
        doc(
            Kind::Gateway,
            "istio-system",
            "web-istio-autogenerated-k8s-ingress-shop"
        )
        .is_some()
    );
    fake.delete("networking.k8s.io/v1", "Ingress", "shop", "web");
    until(&syncer, "what the Ingress became deleted", |_| {
        doc(
            Kind::Gateway,
            "istio-system",
            "web-istio-autogenerated-k8s-ingress-shop",
        )
        .is_none()
    })
    .await;
}

/// Gateway API objects reach the store as the Gateways and VirtualServices istiod generates:
/// a listener per Gateway, a VirtualService per (listener, host) and one per mesh route, a
/// DestinationRule per BackendTLSPolicy target, and
/// they follow route changes, a certificate going away, and deletions.
#[tokio::test]
async fn gateway_api_objects_become_gateways_and_virtual_services() {
    use pasa_kube::gateway_api::GROUP;
    use pasa_proto::Kind;
    let fake = FakeApiServer::start().await;
    fake.put_namespace("shop", &[]);
    fake.put(service("shop", "web", 8080));
    // Structurally PEM (the syncer checks the form, as istiod does before it serves it).
    let pem = |label: &str| format!("-----BEGIN {label}-----\nAAAA\n-----END {label}-----\n");
    let b64 = |s: String| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    fake.put(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "shop-cert", "namespace": "shop"},
        "data": {"tls.crt": b64(pem("CERTIFICATE")), "tls.key": b64(pem("PRIVATE KEY")),
                 "unrelated": b64("x".into())}}));
    let v1 = format!("{GROUP}/v1");
    fake.put(json!({"apiVersion": v1, "kind": "Gateway",
        "metadata": {"name": "edge", "namespace": "shop"},
        "spec": {"gatewayClassName": "istio", "listeners": [
            {"name": "http", "port": 80, "protocol": "HTTP"},
            {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "shop.example.com",
             "tls": {"certificateRefs": [{"name": "shop-cert"}]}}]}}));
    let route = |path: &str| {
        json!({"apiVersion": v1, "kind": "HTTPRoute",
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"parentRefs": [{"name": "edge"}], "hostnames": ["shop.example.com"],
                "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": path}}],
                           "backendRefs": [{"name": "web", "port": 8080}]}]}})
    };
    fake.put(route("/shop"));
    fake.put(json!({"apiVersion": v1, "kind": "HTTPRoute",
        "metadata": {"name": "canary", "namespace": "shop"},
        "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "web"}],
            "rules": [{"backendRefs": [{"name": "web", "port": 8080}]}]}}));
    fake.put(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "web-ca", "namespace": "shop"},
        "data": {"ca.crt": pem("CERTIFICATE")}}));
    fake.put(json!({"apiVersion": v1, "kind": "BackendTLSPolicy",
        "metadata": {"name": "web-tls", "namespace": "shop"},
        "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "web"}],
                 "validation": {"hostname": "web.internal",
                                "caCertificateRefs": [{"group": "", "kind": "ConfigMap",
                                                       "name": "web-ca"}]}}}));
    let store = FakeStore::default();
    let syncer = start(&fake, &store, DiscoverySelectors::all());
    until(&syncer, "the first pass", |s| s.synced).await;
    let doc = |kind: Kind, name: &str| {
        let key = StoreKey {
            kind,
            namespace: "shop".into(),
            name: name.into(),
        };
        store.inner.lock().unwrap().docs.get(&key).cloned()
    };
    let http = doc(Kind::Gateway, "edge~istio-autogenerated-k8s-gateway~http")
        .expect("the HTTP listener's Gateway");
    assert_eq!(
        http["metadata"]["annotations"]["internal.istio.io/gateway-service"],
        "edge-istio.shop.svc.cluster.local"
    );
    assert_eq!(http["metadata"]["labels"]["pasa.io/cluster"], "Kubernetes");
    let https = doc(Kind::Gateway, "edge~istio-autogenerated-k8s-gateway~https")
        .expect("the HTTPS listener's Gateway");
    assert_eq!(
        https["spec"]["servers"][0]["tls"]["credentialName"],
        "kubernetes-gateway://shop/shop-cert"
    );
    let on_https = "shop~edge~istio-autogenerated-k8s-gateway~https~shop.example.com";
    let vs = doc(Kind::VirtualService, on_https).expect("the route on the HTTPS listener");
    assert_eq!(vs["spec"]["http"][0]["match"][0]["uri"]["prefix"], "/shop");
    assert!(
        doc(
            Kind::VirtualService,
            "shop~edge~istio-autogenerated-k8s-gateway~http~shop.example.com"
        )
        .is_some(),
        "and on the HTTP listener"
    );
    let mesh = doc(Kind::VirtualService, "shop~web.shop.svc.cluster.local")
        .expect("the mesh route's VirtualService");
    assert_eq!(mesh["spec"]["gateways"], json!(["mesh"]));
    let dr = doc(Kind::DestinationRule, "web~istio-autogenerated-k8s-gateway")
        .expect("the BackendTLSPolicy's DestinationRule");
    assert_eq!(
        dr["spec"]["trafficPolicy"]["tls"],
        json!({"mode": "SIMPLE", "sni": "web.internal", "credentialName": "configmap://shop/web-ca"})
    );

    // The route changes, and its VirtualServices with it.
    fake.put(route("/store"));
    until(&syncer, "the changed route", |_| {
        doc(Kind::VirtualService, on_https)
            .is_some_and(|vs| vs["spec"]["http"][0]["match"][0]["uri"]["prefix"] == "/store")
    })
    .await;
    // Without its certificate, the HTTPS listener is not programmed: its Gateway goes.
    fake.delete("v1", "Secret", "shop", "shop-cert");
    until(
        &syncer,
        "the HTTPS listener without its certificate",
        |_| doc(Kind::Gateway, "edge~istio-autogenerated-k8s-gateway~https").is_none(),
    )
    .await;
    fake.delete(&v1, "HTTPRoute", "shop", "canary");
    until(&syncer, "the mesh route deleted", |_| {
        doc(Kind::VirtualService, "shop~web.shop.svc.cluster.local").is_none()
    })
    .await;
    fake.delete(&v1, "Gateway", "shop", "edge");
    until(&syncer, "what the Gateway became deleted", |_| {
        doc(Kind::Gateway, "edge~istio-autogenerated-k8s-gateway~http").is_none()
            && doc(Kind::VirtualService, on_https).is_none()
    })
    .await;
}

/// The Docker config of a pull Secret a WasmPlugin or TrafficExtension names reaches the store
/// as an `ImagePullSecret` of the Secret's namespace and name, and follows the Secret; a Secret
/// of another type, one no extension names, and one an extension no longer names are not
/// carried; nothing else of a Secret is.
#[tokio::test]
async fn pull_secrets_wasm_extensions_name_reach_the_store() {
    use pasa_proto::Kind;
    let b64 = |s: &str| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    let docker_config = |password: &str| {
        json!({"auths": {"registry.example.com": {"username": "u", "password": password}}})
            .to_string()
    };
    let fake = FakeApiServer::start().await;
    fake.put_namespace("shop", &[]);
    let secret = |name: &str, type_: &str, password: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "type": type_,
            "metadata": {"name": name, "namespace": "shop"},
            "data": {".dockerconfigjson": b64(&docker_config(password)), "other": b64("x")}})
    };
    fake.put(secret("creds", "kubernetes.io/dockerconfigjson", "one"));
    fake.put(secret("unnamed", "kubernetes.io/dockerconfigjson", "one"));
    fake.put(secret("opaque", "Opaque", "one"));
    fake.put(secret("ext-creds", "kubernetes.io/dockerconfigjson", "one"));
    let plugin = |pull_secret: &str| {
        json!({"apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin",
            "metadata": {"name": "auth", "namespace": "shop"},
            "spec": {"url": "oci://registry.example.com/auth:1", "imagePullSecret": pull_secret}})
    };
    fake.put(plugin("creds"));
    fake.put(
        json!({"apiVersion": "extensions.istio.io/v1alpha1", "kind": "TrafficExtension",
        "metadata": {"name": "ext", "namespace": "shop"},
        "spec": {"wasm": {"url": "oci://registry.example.com/ext:1",
                          "imagePullSecret": "ext-creds"}}}),
    );
    fake.put(
        json!({"apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin",
        "metadata": {"name": "opaque", "namespace": "shop"},
        "spec": {"url": "oci://registry.example.com/o:1", "imagePullSecret": "opaque"}}),
    );
    let store = FakeStore::default();
    let syncer = start(&fake, &store, DiscoverySelectors::all());
    until(&syncer, "the first pass", |s| s.synced).await;
    let carried = || -> BTreeMap<String, Value> {
        let s = store.inner.lock().unwrap();
        s.docs
            .iter()
            .filter(|(k, _)| k.kind == Kind::ImagePullSecret)
            .map(|(k, d)| (format!("{}/{}", k.namespace, k.name), d["spec"].clone()))
            .collect()
    };
    let want = |pairs: &[(&str, &str)]| -> BTreeMap<String, Value> {
        pairs
            .iter()
            .map(|(name, password)| {
                (
                    format!("shop/{name}"),
                    json!({"dockerConfigJson": docker_config(password)}),
                )
            })
            .collect()
    };
    assert_eq!(carried(), want(&[("creds", "one"), ("ext-creds", "one")]));
    // The Secret changes: so does what the store holds.
    fake.put(secret("creds", "kubernetes.io/dockerconfigjson", "two"));
    until(&syncer, "the new password", |_| {
        carried() == want(&[("creds", "two"), ("ext-creds", "one")])
    })
    .await;
    // The plugin names another Secret: the first is no longer carried.
    fake.put(plugin("unnamed"));
    until(&syncer, "the secret the plugin names now", |_| {
        carried() == want(&[("unnamed", "one"), ("ext-creds", "one")])
    })
    .await;
    // The extension goes: so does its secret; the Secret goes: so does what was carried.
    fake.delete(
        "extensions.istio.io/v1alpha1",
        "TrafficExtension",
        "shop",
        "ext",
    );
    fake.delete("v1", "Secret", "shop", "unnamed");
    until(&syncer, "nothing carried", |_| carried().is_empty()).await;
}

/// With exactly the roles deploy/ ships (and nothing more), PCP's service account syncs the
/// whole cluster: it never asks for what its roles do not grant (PASA's store-only kinds are
/// not asked of the cluster at all).
#[tokio::test]
async fn the_shipped_rbac_is_enough_to_sync() {
    let fake = FakeApiServer::start().await;
    bookinfo(&fake);
    put_every_kind(&fake, "bookinfo", 1);
    fake.enforce_rbac(&shipped_rbac());
    let store = FakeStore::default();
    let client = fake.client_as("pasa-system", "pasa-pcp");
    let syncer = start_as(client, &fake, &store, DiscoverySelectors::all());
    let status = until(&syncer, "the first pass", |s| s.synced).await;
    assert!(status.waiting.is_empty(), "{status:?}");
    let names = store.names();
    assert!(names.contains(&"bookinfo/reviews".to_string()), "{names:?}");
    assert_eq!(
        names.iter().filter(|n| *n == "bookinfo/one").count(),
        every_kind(1).len(),
        "every Istio kind synced: {names:?}"
    );
    // The fake refuses what the roles lack, as the real API server does.
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(fake.client_as("pasa-system", "pasa-pcp"), "bookinfo");
    let pp = kube::api::PostParams::default();
    let refused = secrets.create(&pp, &Default::default()).await.unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 403),
        "{refused:?}"
    );
}

/// A kind the syncer needs but may not read: the first sync waits for it (taking it for absent
/// would delete what the store holds of it), the status says which resource and why, and the
/// sync completes once the permission is granted.
#[tokio::test]
async fn a_kind_the_syncer_may_not_read_is_waited_for_and_named() {
    let fake = FakeApiServer::start().await;
    bookinfo(&fake);
    put_every_kind(&fake, "bookinfo", 1);
    fake.enforce_rbac(&shipped_rbac_without("virtualservices"));
    let store = FakeStore::default();
    let client = fake.client_as("pasa-system", "pasa-pcp");
    let syncer = start_as(client, &fake, &store, DiscoverySelectors::all());
    let vs = "virtualservices.networking.istio.io";
    let status = until(&syncer, "the refusal to be told", |s| {
        s.problems.contains_key(vs)
    })
    .await;
    assert!(!status.synced);
    assert!(status.waiting.contains(vs), "{status:?}");
    let problem = &status.problems[vs];
    assert_eq!(problem.reason, pasa_kube::problem::Reason::Forbidden);
    assert!(
        problem
            .message
            .contains("cannot list resource \"virtualservices\""),
        "{problem}"
    );
    let said = status.waiting_for();
    assert!(said.contains(vs) && said.contains("forbidden"), "{said}");
    assert!(store.names().is_empty(), "nothing compared while waiting");

    // Granted: the sync completes, with the VirtualService.
    fake.enforce_rbac(&grant_reading(
        "pasa-system",
        "pasa-pcp",
        "networking.istio.io",
        "virtualservices",
    ));
    let status = until(&syncer, "the first pass", |s| s.synced).await;
    assert!(status.problems.is_empty(), "{status:?}");
    let key = StoreKey {
        kind: pasa_proto::Kind::VirtualService,
        namespace: "bookinfo".into(),
        name: "one".into(),
    };
    assert!(store.inner.lock().unwrap().docs.contains_key(&key));
}

/// A namespace selected while the syncer runs brings its Istio config of every kind (not only
/// its Services), and one no longer selected takes it away.
#[tokio::test]
async fn a_namespace_selected_later_brings_its_istio_config_of_every_kind() {
    let fake = FakeApiServer::start().await;
    fake.put_namespace("legacy", &[]);
    fake.put(service("legacy", "billing", 8081));
    put_every_kind(&fake, "legacy", 1);
    let selectors = istio_discovery_enabled();
    let store = FakeStore::default();
    let syncer = start(&fake, &store, selectors);
    until(&syncer, "the first pass", |s| s.synced).await;
    assert!(store.names().is_empty(), "{:?}", store.names());

    let kinds_in = |store: &FakeStore| -> BTreeSet<pasa_proto::Kind> {
        let s = store.inner.lock().unwrap();
        s.docs
            .keys()
            .filter(|k| k.namespace == "legacy" && k.name == "one")
            .map(|k| k.kind)
            .collect()
    };
    let every: BTreeSet<pasa_proto::Kind> = every_kind(1).into_iter().map(|(k, _)| k).collect();
    fake.put_namespace("legacy", &[("istio-discovery", "enabled")]);
    until(&syncer, "every kind of legacy", |_| {
        kinds_in(&store) == every
    })
    .await;
    assert!(store.spec("legacy", "billing").is_some(), "and its Service");

    fake.put_namespace("legacy", &[]);
    until(&syncer, "legacy gone", |_| store.names().is_empty()).await;
}

/// The API server answers lists in pages (kube's watcher asks for 500 at a time): a cluster
/// larger than a page is synced whole.
#[tokio::test]
async fn a_cluster_listed_in_pages_is_synced_whole() {
    let fake = FakeApiServer::start().await;
    fake.put_namespace("big", &[]);
    for n in 0..1_100u16 {
        fake.put(service("big", &format!("svc-{n}"), 8000 + n % 100));
    }
    let store = FakeStore::default();
    let syncer = start(&fake, &store, DiscoverySelectors::all());
    until(&syncer, "the first pass", |s| s.synced).await;
    assert_eq!(store.names().len(), 1_100);
    assert_eq!(fake.lists_of("services"), 1, "one list, in three pages");
    let services: kube::Api<k8s_openapi::api::core::v1::Service> = kube::Api::all(fake.client());
    let page = services
        .list(&kube::api::ListParams::default().limit(500))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 500);
    assert!(
        page.metadata.continue_.is_some(),
        "a page, with more to come"
    );
}

/// Network gateways known by DNS name are at the addresses the name resolves to, as istiod
/// resolves them (a load balancer named `localhost` stands for a cloud's): those the mesh
/// config's `meshNetworks` gives by address (written as a generated object of gateways), the
/// load balancer of a Service it names by `registryServiceName` (its external addresses, which
/// agents read), and a Gateway API network gateway's `Hostname` address.
#[tokio::test]
async fn network_gateways_known_by_name_are_resolved() {
    let fake = FakeApiServer::start().await;
    fake.put_namespace("istio-system", &[]);
    fake.put(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "eastwest", "namespace": "istio-system"},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.9.1",
                 "ports": [{"name": "tls", "port": 15443}]},
        "status": {"loadBalancer": {"ingress": [{"hostname": "localhost"}]}}}));
    fake.put(
        json!({"apiVersion": format!("{}/v1", pasa_kube::gateway_api::GROUP),
        "kind": "Gateway",
        "metadata": {"name": "remote-gw", "namespace": "istio-system",
                     "labels": {"topology.istio.io/network": "n3"}},
        "spec": {"gatewayClassName": "istio-remote",
                 "addresses": [{"type": "Hostname", "value": "localhost"}],
                 "listeners": [{"name": "mtls", "port": 15443, "protocol": "TLS",
                                "tls": {"mode": "Passthrough"}}]}}),
    );
    let mut config = config(&fake);
    config.mesh_networks = Some(
        serde_json::from_value(json!({"networks": {"n2": {
            "endpoints": [{"fromRegistry": "Kubernetes"}],
            "gateways": [{"address": "localhost", "port": 15443},
                         {"address": "192.0.2.7", "port": 15443},
                         {"registryServiceName": "eastwest.istio-system.svc.cluster.local",
                          "port": 15443}]}}}))
        .unwrap(),
    );
    let store = FakeStore::default();
    let syncer = Syncer::start(
        fake.client(),
        config,
        store.clone(),
        Arc::new(SyncMetrics::default()),
    );
    until(&syncer, "the first pass", |s| s.synced).await;
    let loopback = |addresses: &Value| {
        addresses.as_array().is_some_and(|a| {
            !a.is_empty()
                && a.iter().all(|g| {
                    g.as_str()
                        .or(g["address"].as_str())
                        .and_then(|a| a.parse::<std::net::IpAddr>().ok())
                        .is_some_and(|ip| ip.is_loopback())
                })
        })
    };
    let mesh = "mesh~istio-autogenerated-k8s-gateway~network";
    let gateway_api = "remote-gw~istio-autogenerated-k8s-gateway~network";
    store
        .until("every name resolved", |s| {
            let resolved = |name: &str, field: &str| {
                s.spec("istio-system", name)
                    .is_some_and(|spec| loopback(&spec[field]))
            };
            resolved(mesh, "networkGateways")
                && resolved("eastwest", "externalAddresses")
                && resolved(gateway_api, "networkGateways")
        })
        .await;
    // The gateway given by IP address is the agents' to read from the mesh config; the
    // generated object holds those given by name, on their network and port.
    let generated = store.spec("istio-system", mesh).unwrap();
    for g in generated["networkGateways"].as_array().unwrap() {
        assert_eq!((&g["network"], &g["port"]), (&json!("n2"), &json!(15443)));
    }
    let remote = store.spec("istio-system", gateway_api).unwrap();
    assert_eq!(remote["networkGateways"][0]["network"], "n3");
    // Without meshNetworks naming it, a load balancer's name is written as it is.
    let plain = FakeApiServer::start().await;
    plain.put_namespace("istio-system", &[]);
    plain.put(
        fake.get("v1", "Service", "istio-system", "eastwest")
            .unwrap(),
    );
    let store = FakeStore::default();
    let syncer = start(&plain, &store, DiscoverySelectors::all());
    until(&syncer, "the first pass", |s| s.synced).await;
    assert_eq!(
        store.spec("istio-system", "eastwest").unwrap()["externalAddresses"],
        json!(["localhost"])
    );
    assert!(store.spec("istio-system", mesh).is_none());
}
