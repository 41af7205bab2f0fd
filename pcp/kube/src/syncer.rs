//! The Kubernetes syncer: follows a cluster's Istio config (every kind the store keeps),
//! Services, EndpointSlices, Pods, Nodes, Namespaces, Ingresses and IngressClasses with kube's
//! watchers (each into a reflector), and keeps the store's copy equal to what they say, through
//! a [`Target`] (PCP's validating write path).
//!
//! - Istio kinds are read at the newest version the cluster serves of those the store accepts
//!   (`v1`, else `v1beta1`, else `v1alpha3`: the API server converts between served versions,
//!   so every object is seen whichever version it was written at). A kind whose CRD is not
//!   installed is not followed (until PCP restarts).
//! - Work follows what changed: a Service rewrites its `ServiceEndpoints` object, an
//!   EndpointSlice its part, a pod or node the parts of the slices that point at it (an index
//!   kept from the slices), a namespace whose discovery selection flips everything in it. What it
//!   would write is compared with what it wrote (or found stored) first: unchanged objects are
//!   not written, so a restart with nothing changed in the cluster writes nothing.
//! - At start, and after any watcher listed again (a watch from a compacted version, 410 Gone),
//!   everything is compared: objects the syncer owns (labelled `pasa.io/cluster: <ID>`) that the
//!   cluster no longer has, deleted while PCP was down or while a watch was away, are deleted.
//! - Ingresses are not stored as such: those Istio serves become the Gateways and
//!   VirtualServices istiod generates for them (`pasa_proto::ingress`), worked out again over
//!   every Ingress when one of them, an IngressClass or a Service changes, and written like any
//!   other object the syncer owns (the store compares them, so an unchanged one is not written).
//! - A write the store refuses (an object Kubernetes accepted but istiod would not) is logged
//!   and counted, and what was stored before stays; a store that cannot be reached is retried
//!   with backoff.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use pasa_proto::Kind;
use serde_json::Value;
use tokio::sync::watch;

use crate::convert::{self, Pod, SliceReferences, StoreKey, Workloads};
use crate::metrics::SyncMetrics;
use crate::selectors::DiscoverySelectors;
use pasa_runtime::backoff::Backoff;

/// Why a write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The store (or validation before it) refused the object: writing it again will not help
    /// until it changes.
    #[error("{0}")]
    Refused(String),
    /// The store could not be reached or failed: worth retrying.
    #[error("{0}")]
    Unavailable(String),
}

/// Where the syncer writes: the store, behind PCP's validating write path.
pub trait Target: Send + Sync + 'static {
    /// Every stored object labelled `pasa.io/cluster: <cluster>` (what this cluster's syncer
    /// wrote before), as documents.
    fn owned(&self, cluster: &str) -> impl Future<Output = Result<Vec<Value>, WriteError>> + Send;
    /// Creates or replaces the object `doc` (apiVersion, kind, metadata, spec).
    fn apply(&self, doc: Value) -> impl Future<Output = Result<(), WriteError>> + Send;
    /// Deletes an object; one already gone is not an error.
    fn delete(&self, key: &StoreKey) -> impl Future<Output = Result<(), WriteError>> + Send;
}

/// What a syncer reads of its cluster.
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// The cluster's ID (istiod's `CLUSTER_ID`, `Kubernetes` by default): the value of the
    /// `pasa.io/cluster` label on what the syncer writes. A second cluster is a second syncer
    /// with an ID of its own.
    pub cluster_id: String,
    /// The mesh's `discoverySelectors`.
    pub discovery: DiscoverySelectors,
    /// How Ingresses are served (the mesh config's ingress fields, the domain suffix, where
    /// generated Gateways go).
    pub ingress: pasa_proto::ingress::Settings,
}

/// What a syncer has done, for readiness and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncStatus {
    /// The first complete comparison of cluster and store is done.
    pub synced: bool,
    /// Objects written (created or changed).
    pub applied: u64,
    /// Objects deleted.
    pub deleted: u64,
    /// Writes the store refused.
    pub refused: u64,
    /// Complete comparisons (at start, and after a watcher listed again).
    pub full_passes: u64,
    /// Watch events handled.
    pub events: u64,
}

/// A running syncer; stops when dropped.
pub struct Syncer {
    status: watch::Receiver<SyncStatus>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Syncer {
    /// Starts following the cluster `client` reaches.
    pub fn start<T: Target>(
        client: Client,
        config: SyncConfig,
        target: T,
        metrics: Arc<SyncMetrics>,
    ) -> Syncer {
        let (status_tx, status) = watch::channel(SyncStatus::default());
        let task = tokio::spawn(run(client, config, target, metrics, status_tx));
        Syncer { status, task }
    }

    /// Follows the syncer's progress.
    pub fn status(&self) -> watch::Receiver<SyncStatus> {
        self.status.clone()
    }
}

/// One watch event, of any followed resource (boxed: the objects differ much in size).
enum Change {
    Config(Kind, Box<watcher::Event<DynamicObject>>),
    Service(Box<watcher::Event<Service>>),
    Slice(Box<watcher::Event<EndpointSlice>>),
    Pod(Box<watcher::Event<Pod>>),
    Node(Box<watcher::Event<Node>>),
    Namespace(Box<watcher::Event<Namespace>>),
    Ingress(Box<watcher::Event<Ingress>>),
    IngressClass(Box<watcher::Event<IngressClass>>),
}

/// The followed Kubernetes resources (besides Istio's kinds), for readiness.
const RESOURCES: [&str; 7] = [
    "services",
    "endpointslices",
    "pods",
    "nodes",
    "namespaces",
    "ingresses",
    "ingressclasses",
];

/// A watcher of `K` into a reflector: events come out after the store has them. Objects are
/// trimmed by `trim` first (a pod's containers and status are not read, and at 100,000 pods
/// they would be most of the memory).
fn follow<K>(
    api: Api<K>,
    trim: fn(&mut K),
    resource: &'static str,
    metrics: Arc<SyncMetrics>,
) -> (
    Store<K>,
    impl Stream<Item = watcher::Event<K>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    (store, follow_into(api, writer, trim, resource, metrics))
}

/// [`follow`] into a given reflector (of a kind known at run time).
fn follow_into<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    trim: fn(&mut K),
    resource: &'static str,
    metrics: Arc<SyncMetrics>,
) -> impl Stream<Item = watcher::Event<K>> + Send + 'static
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
{
    watcher(api, watcher::Config::default())
        .modify(move |k: &mut K| {
            k.meta_mut().managed_fields = None;
            trim(k);
        })
        .default_backoff()
        .reflect(writer)
        .filter_map(move |event| {
            let metrics = metrics.clone();
            async move {
                match event {
                    Ok(e) => {
                        if matches!(e, watcher::Event::Init) {
                            metrics.listed(resource);
                        }
                        Some(e)
                    }
                    // The watcher retries with backoff; a refused watch is worth hearing of.
                    Err(e) => {
                        metrics.watch_failed(resource);
                        tracing::warn!(resource, error = %e, "watching the cluster");
                        None
                    }
                }
            }
        })
}

/// Config objects lose what the store does not keep: their status, and the copy of the whole
/// object `kubectl apply` leaves in an annotation.
fn trim_config(obj: &mut DynamicObject) {
    if let Some(a) = &mut obj.metadata.annotations {
        a.remove(LAST_APPLIED);
    }
    if let Some(data) = obj.data.as_object_mut() {
        data.retain(|k, _| k == "spec");
    }
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The version of `kind` to read: the newest of those the store accepts that the cluster
/// serves; `None` when it serves none (the CRD is not installed).
async fn served_version(client: &Client, kind: Kind) -> Option<ApiResource> {
    for version in kind.versions() {
        let gvk = GroupVersionKind::gvk(kind.group(), version, kind.as_str());
        let resource = ApiResource::from_gvk_with_plural(&gvk, kind.plural());
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        match api.list_metadata(&ListParams::default().limit(1)).await {
            Ok(_) => return Some(resource),
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            // Not known yet (the API server is away, or RBAC refuses): the watcher retries.
            Err(e) => {
                tracing::warn!(kind = kind.as_str(), error = %e,
                    "cannot tell which version the cluster serves");
                return Some(resource);
            }
        }
    }
    tracing::info!(
        kind = kind.as_str(),
        "not served by this cluster (no CRD): not followed"
    );
    None
}

fn trim_pod(pod: &mut Pod) {
    pod.metadata.annotations = None;
    pod.metadata.owner_references = None;
}

fn trim_node(node: &mut Node) {
    node.metadata.annotations = None;
    node.spec = None;
    node.status = None;
}

fn trim_nothing<K>(_: &mut K) {}

/// The reflectors' stores, read by the conversion.
struct Stores {
    /// Istio's kinds the cluster serves, with the version read.
    configs: BTreeMap<Kind, (ApiResource, Store<DynamicObject>)>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    pods: Store<Pod>,
    nodes: Store<Node>,
    namespaces: Store<Namespace>,
    ingresses: Store<Ingress>,
    ingress_classes: Store<IngressClass>,
}

impl Workloads for Stores {
    fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get(&ObjectRef::new(name).within(namespace))
    }

    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }
}

/// A namespaced object: (namespace, name).
type Id = (String, String);

/// Which slices point at each pod and node: what a pod's or node's change rewrites.
#[derive(Default)]
struct References {
    /// A slice's pods and nodes, by the slice.
    of_slice: HashMap<Id, SliceReferences>,
    by_pod: HashMap<Id, BTreeSet<Id>>,
    by_node: HashMap<String, BTreeSet<Id>>,
}

impl References {
    fn set(&mut self, slice: Id, refs: SliceReferences) {
        self.remove(&slice);
        for pod in &refs.pods {
            self.by_pod
                .entry(pod.clone())
                .or_default()
                .insert(slice.clone());
        }
        for node in &refs.nodes {
            self.by_node
                .entry(node.clone())
                .or_default()
                .insert(slice.clone());
        }
        self.of_slice.insert(slice, refs);
    }

    fn remove(&mut self, slice: &Id) {
        let Some(SliceReferences { pods, nodes }) = self.of_slice.remove(slice) else {
            return;
        };
        for pod in pods {
            if let Some(set) = self.by_pod.get_mut(&pod) {
                set.remove(slice);
                if set.is_empty() {
                    self.by_pod.remove(&pod);
                }
            }
        }
        for node in nodes {
            if let Some(set) = self.by_node.get_mut(&node) {
                set.remove(slice);
                if set.is_empty() {
                    self.by_node.remove(&node);
                }
            }
        }
    }
}

fn slice_id(eps: &EndpointSlice) -> Id {
    (eps.namespace().unwrap_or_default(), eps.name_any())
}

/// The syncer's state between events.
struct Syncing<T> {
    config: SyncConfig,
    target: T,
    stores: Stores,
    refs: References,
    /// What the store holds of what this syncer owns, as compared ([`convert::comparable`]).
    written: BTreeMap<StoreKey, Value>,
    /// Keys to compare again.
    dirty: BTreeSet<StoreKey>,
    /// Compare everything at the next pass.
    full: bool,
    /// What the Ingresses became, by key (with their documents), as last worked out.
    derived: BTreeMap<StoreKey, Value>,
    /// Work out what the Ingresses become again at the next pass.
    ingresses_changed: bool,
    /// Whether each namespace is read (discovery selectors), as last decided.
    selected: HashMap<String, bool>,
    /// Keys whose write failed for want of a store, retried after `backoff`.
    retry: BTreeSet<StoreKey>,
    backoff: Backoff,
    status: watch::Sender<SyncStatus>,
    metrics: Arc<SyncMetrics>,
}

const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(30);

async fn run<T: Target>(
    client: Client,
    config: SyncConfig,
    target: T,
    metrics: Arc<SyncMetrics>,
    status: watch::Sender<SyncStatus>,
) {
    // What this cluster's syncer owns in the store, from before: the start of the comparison.
    let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX, Duration::ZERO);
    let owned = loop {
        match target.owned(&config.cluster_id).await {
            Ok(docs) => break docs,
            Err(e) => {
                let wait = backoff.failed();
                tracing::warn!(error = %e, retry_in = ?wait, "cannot read what the syncer wrote before");
                tokio::time::sleep(wait).await;
            }
        }
    };
    // The same backoff then spaces retries of writes the store could not take.
    backoff.reset();
    let written: BTreeMap<StoreKey, Value> = owned
        .iter()
        .filter_map(|doc| Some((key_of(doc)?, convert::comparable(doc))))
        .collect();
    tracing::info!(cluster = %config.cluster_id, owned = written.len(), "Kubernetes syncer starting");

    let (services, service_events) = follow(
        Api::<Service>::all(client.clone()),
        trim_nothing,
        "services",
        metrics.clone(),
    );
    let (slices, slice_events) = follow(
        Api::<EndpointSlice>::all(client.clone()),
        trim_nothing,
        "endpointslices",
        metrics.clone(),
    );
    let (pods, pod_events) = follow(
        Api::<Pod>::all(client.clone()),
        trim_pod,
        "pods",
        metrics.clone(),
    );
    let (nodes, node_events) = follow(
        Api::<Node>::all(client.clone()),
        trim_node,
        "nodes",
        metrics.clone(),
    );
    let (namespaces, namespace_events) = follow(
        Api::<Namespace>::all(client.clone()),
        trim_nothing,
        "namespaces",
        metrics.clone(),
    );
    let (ingresses, ingress_events) = follow(
        Api::<Ingress>::all(client.clone()),
        trim_nothing,
        "ingresses",
        metrics.clone(),
    );
    let (ingress_classes, ingress_class_events) = follow(
        Api::<IngressClass>::all(client.clone()),
        trim_nothing,
        "ingressclasses",
        metrics.clone(),
    );
    let mut configs = BTreeMap::new();
    let mut config_events = Vec::new();
    for kind in Kind::ALL {
        if kind == Kind::ServiceEndpoints {
            continue;
        }
        let Some(resource) = served_version(&client, kind).await else {
            continue;
        };
        let writer = reflector::store::Writer::new(resource.clone());
        configs.insert(kind, (resource.clone(), writer.as_reader()));
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let events = follow_into(api, writer, trim_config, kind.plural(), metrics.clone());
        config_events.push(
            events
                .map(move |e| Change::Config(kind, Box::new(e)))
                .boxed(),
        );
    }
    let resources = RESOURCES.len() + configs.len();
    let events = futures::stream::select_all(
        config_events.into_iter().chain([
            service_events.map(|e| Change::Service(Box::new(e))).boxed(),
            slice_events.map(|e| Change::Slice(Box::new(e))).boxed(),
            pod_events.map(|e| Change::Pod(Box::new(e))).boxed(),
            node_events.map(|e| Change::Node(Box::new(e))).boxed(),
            namespace_events
                .map(|e| Change::Namespace(Box::new(e)))
                .boxed(),
            ingress_events.map(|e| Change::Ingress(Box::new(e))).boxed(),
            ingress_class_events
                .map(|e| Change::IngressClass(Box::new(e)))
                .boxed(),
        ]),
    );
    let mut sync = Syncing {
        config,
        target,
        stores: Stores {
            configs,
            services,
            slices,
            pods,
            nodes,
            namespaces,
            ingresses,
            ingress_classes,
        },
        refs: References::default(),
        written,
        dirty: BTreeSet::new(),
        full: true,
        derived: BTreeMap::new(),
        ingresses_changed: true,
        selected: HashMap::new(),
        retry: BTreeSet::new(),
        backoff,
        status,
        metrics,
    };
    let mut listed: BTreeSet<&'static str> = BTreeSet::new();
    let mut batches = std::pin::pin!(events.ready_chunks(1024));
    let mut retry_at: Option<tokio::time::Instant> = None;
    loop {
        let retry_due = async move {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            batch = batches.next() => {
                let Some(batch) = batch else { return };
                let handled = batch.len() as u64;
                for change in batch {
                    if let Some(done) = sync.handle(change) {
                        listed.insert(done);
                    }
                }
                sync.status.send_modify(|s| s.events += handled);
            }
            () = retry_due => {
                retry_at = None;
                let retry = std::mem::take(&mut sync.retry);
                sync.dirty.extend(retry);
            }
        }
        // Nothing is compared until every resource has been listed once: a pass before the
        // pods are in would write endpoints without their labels.
        if listed.len() < resources {
            continue;
        }
        sync.pass().await;
        if sync.retry.is_empty() {
            sync.backoff.reset();
        } else if retry_at.is_none() {
            retry_at = Some(tokio::time::Instant::now() + sync.backoff.failed());
        }
    }
}

/// The store key of a document the store holds.
fn key_of(doc: &Value) -> Option<StoreKey> {
    let kind = pasa_proto::Kind::from_kind_field(doc["kind"].as_str()?)?;
    Some(StoreKey {
        kind,
        namespace: doc["metadata"]["namespace"].as_str()?.to_string(),
        name: doc["metadata"]["name"].as_str()?.to_string(),
    })
}

impl<T: Target> Syncing<T> {
    /// Notes what an event makes dirty; returns the resource a list of which completed.
    fn handle(&mut self, change: Change) -> Option<&'static str> {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        // A list replaced what the watch said: deletions in between were not seen as events,
        // so everything is compared (`listed`).
        match change {
            Change::Config(kind, e) => match *e {
                Apply(obj) | Delete(obj) => {
                    self.dirty.insert(StoreKey {
                        kind,
                        namespace: obj.namespace().unwrap_or_default(),
                        name: obj.name_any(),
                    });
                }
                InitDone => return self.listed(kind.plural()),
                Init | InitApply(_) => {}
            },
            Change::Service(e) => match *e {
                Apply(svc) | Delete(svc) => {
                    let ns = svc.namespace().unwrap_or_default();
                    self.dirty.insert(StoreKey::service(&ns, &svc.name_any()));
                    // An Ingress may name its port.
                    self.ingresses_changed = true;
                }
                InitDone => return self.listed("services"),
                Init | InitApply(_) => {}
            },
            Change::Slice(e) => match *e {
                Apply(eps) | InitApply(eps) => {
                    let id = slice_id(&eps);
                    self.refs.set(id.clone(), convert::slice_references(&eps));
                    self.dirty.insert(StoreKey::slice(&id.0, &id.1));
                }
                Delete(eps) => {
                    let id = slice_id(&eps);
                    self.refs.remove(&id);
                    self.dirty.insert(StoreKey::slice(&id.0, &id.1));
                }
                Init => self.refs = References::default(),
                InitDone => return self.listed("endpointslices"),
            },
            Change::Pod(e) => match *e {
                Apply(pod) | Delete(pod) => {
                    let id = (pod.namespace().unwrap_or_default(), pod.name_any());
                    let slices = self.refs.by_pod.get(&id).into_iter().flatten();
                    self.dirty
                        .extend(slices.map(|(ns, slice)| StoreKey::slice(ns, slice)));
                }
                InitDone => return self.listed("pods"),
                Init | InitApply(_) => {}
            },
            Change::Node(e) => match *e {
                Apply(node) | Delete(node) => {
                    let name = node.name_any();
                    let slices = self.refs.by_node.get(&name).into_iter().flatten();
                    self.dirty
                        .extend(slices.map(|(ns, slice)| StoreKey::slice(ns, slice)));
                }
                InitDone => return self.listed("nodes"),
                Init | InitApply(_) => {}
            },
            Change::Namespace(e) => match *e {
                Apply(ns) | Delete(ns) => {
                    let name = ns.name_any();
                    let now = self.selects(&name);
                    if self.selected.insert(name.clone(), now) != Some(now) {
                        self.dirty_namespace(&name);
                        // Its Ingresses come or go with it.
                        self.ingresses_changed = true;
                    }
                }
                InitDone => {
                    self.selected.clear();
                    return self.listed("namespaces");
                }
                Init | InitApply(_) => {}
            },
            Change::Ingress(e) => match *e {
                Apply(_) | Delete(_) => self.ingresses_changed = true,
                InitDone => return self.listed("ingresses"),
                Init | InitApply(_) => {}
            },
            Change::IngressClass(e) => match *e {
                Apply(_) | Delete(_) => self.ingresses_changed = true,
                InitDone => return self.listed("ingressclasses"),
                Init | InitApply(_) => {}
            },
        }
        None
    }

    /// Works out again what the served Ingresses of selected namespaces become, and marks the
    /// keys of what they became before and now to be compared.
    fn derive_from_ingresses(&mut self) {
        use pasa_proto::ingress::{self, Ingress as Read};
        let settings = &self.config.ingress;
        let controller_of = |class: &str| {
            let c = self.stores.ingress_classes.get(&ObjectRef::new(class))?;
            c.spec
                .as_ref()
                .map(|s| s.controller.clone().unwrap_or_default())
        };
        let mut served: Vec<Read> = Vec::new();
        for i in self.stores.ingresses.state() {
            let namespace = i.namespace().unwrap_or_default();
            if !self.selects(&namespace) {
                continue;
            }
            match serde_json::to_value(i.as_ref()).and_then(serde_json::from_value::<Read>) {
                Ok(read) if ingress::served(settings, &read, controller_of) => served.push(read),
                Ok(_) => {}
                Err(e) => tracing::warn!(ingress = %format!("{namespace}/{}", i.name_any()),
                    error = %e, "cannot read an Ingress; left out"),
            }
        }
        let named_port = |namespace: &str, service: &str, port: &str| {
            let svc = self
                .stores
                .services
                .get(&ObjectRef::new(service).within(namespace))?;
            let ports = svc.spec.as_ref()?.ports.as_ref()?;
            let p = ports.iter().find(|p| p.name.as_deref() == Some(port))?;
            u32::try_from(p.port).ok()
        };
        let cluster = &self.config.cluster_id;
        let derived: BTreeMap<StoreKey, Value> = ingress::convert(settings, &served, named_port)
            .into_iter()
            .map(|mut o| {
                o.labels
                    .insert(convert::CLUSTER_LABEL.to_string(), cluster.clone());
                let key = StoreKey {
                    kind: o.kind,
                    namespace: o.namespace.clone(),
                    name: o.name.clone(),
                };
                (key, o.to_document())
            })
            .collect();
        self.dirty.extend(self.derived.keys().cloned());
        self.dirty.extend(derived.keys().cloned());
        self.derived = derived;
    }

    fn listed(&mut self, resource: &'static str) -> Option<&'static str> {
        self.full = true;
        Some(resource)
    }

    /// Whether the namespace `name` is read, by the discovery selectors.
    fn selects(&self, name: &str) -> bool {
        let ns = self.stores.namespaces.get(&ObjectRef::new(name));
        match ns {
            Some(ns) => self
                .config
                .discovery
                .selects(ns.metadata.labels.as_ref().unwrap_or(&BTreeMap::new())),
            None => false,
        }
    }

    fn dirty_namespace(&mut self, namespace: &str) {
        let in_ns = |ns: Option<&String>| ns.map(String::as_str) == Some(namespace);
        for svc in self.stores.services.state() {
            if in_ns(svc.metadata.namespace.as_ref()) {
                self.dirty
                    .insert(StoreKey::service(namespace, &svc.name_any()));
            }
        }
        for eps in self.stores.slices.state() {
            if in_ns(eps.metadata.namespace.as_ref()) {
                self.dirty
                    .insert(StoreKey::slice(namespace, &eps.name_any()));
            }
        }
        let written = self.written.keys().filter(|k| k.namespace == namespace);
        self.dirty.extend(written.cloned());
    }

    /// What the store should hold under `key`: `None` for nothing.
    fn desired(&self, key: &StoreKey) -> Option<Value> {
        // Generated from Ingresses of selected namespaces (a cluster's own object of the same
        // name comes first).
        if let Some(doc) = self.derived.get(key)
            && !self
                .stores
                .configs
                .get(&key.kind)
                .is_some_and(|(resource, store)| {
                    store
                        .get(
                            &ObjectRef::new_with(&key.name, resource.clone())
                                .within(&key.namespace),
                        )
                        .is_some()
                })
        {
            return Some(doc.clone());
        }
        let selected = self
            .selected
            .get(&key.namespace)
            .copied()
            .unwrap_or_else(|| self.selects(&key.namespace));
        if !selected {
            return None;
        }
        let cluster = &self.config.cluster_id;
        if key.kind != Kind::ServiceEndpoints {
            let (resource, store) = self.stores.configs.get(&key.kind)?;
            let at = ObjectRef::new_with(&key.name, resource.clone()).within(&key.namespace);
            let obj = store.get(&at)?;
            return Some(convert::config(key, &resource.api_version, &obj, cluster));
        }
        match key.slice_name() {
            Some(slice) => {
                let eps = self
                    .stores
                    .slices
                    .get(&ObjectRef::new(slice).within(&key.namespace))?;
                convert::slice(&eps, cluster, &self.stores).map(|(_, doc)| doc)
            }
            None => {
                let svc = self
                    .stores
                    .services
                    .get(&ObjectRef::new(&key.name).within(&key.namespace))?;
                convert::service(&svc, cluster).map(|(_, doc)| doc)
            }
        }
    }

    /// Compares the dirty keys (every key, after a list) and writes the differences.
    async fn pass(&mut self) {
        if self.dirty.is_empty() && !self.full && !self.ingresses_changed {
            return;
        }
        let full = std::mem::take(&mut self.full);
        if std::mem::take(&mut self.ingresses_changed) || full {
            self.derive_from_ingresses();
        }
        let mut keys = std::mem::take(&mut self.dirty);
        if full {
            let ns = |o: &Option<String>| o.clone().unwrap_or_default();
            keys.extend(
                self.stores
                    .services
                    .state()
                    .iter()
                    .map(|s| StoreKey::service(&ns(&s.metadata.namespace), &s.name_any())),
            );
            keys.extend(
                self.stores
                    .slices
                    .state()
                    .iter()
                    .map(|s| StoreKey::slice(&ns(&s.metadata.namespace), &s.name_any())),
            );
            for (kind, (_, store)) in &self.stores.configs {
                keys.extend(store.state().iter().map(|o| StoreKey {
                    kind: *kind,
                    namespace: o.namespace().unwrap_or_default(),
                    name: o.name_any(),
                }));
            }
            keys.extend(self.written.keys().cloned());
        }
        let (mut applied, mut deleted, mut refused) = (0, 0, 0);
        for key in keys {
            let desired = self.desired(&key);
            let compared = desired.as_ref().map(convert::comparable);
            if compared.as_ref() == self.written.get(&key) {
                continue;
            }
            let outcome = match desired {
                Some(doc) => self.target.apply(doc).await.map(|()| true),
                None => self.target.delete(&key).await.map(|()| false),
            };
            match outcome {
                Ok(true) => {
                    applied += 1;
                    self.metrics.wrote("applied");
                    self.written.insert(key, compared.unwrap_or_default());
                }
                Ok(false) => {
                    deleted += 1;
                    self.metrics.wrote("deleted");
                    self.written.remove(&key);
                }
                Err(WriteError::Refused(message)) => {
                    refused += 1;
                    self.metrics.wrote("refused");
                    tracing::warn!(object = %key, error = %message,
                        "the store refused what the cluster holds; what was stored before stays");
                }
                Err(WriteError::Unavailable(message)) => {
                    self.metrics.wrote("failed");
                    tracing::warn!(object = %key, error = %message, "cannot write; retrying");
                    self.retry.insert(key);
                }
            }
        }
        if full {
            self.metrics.synced.set(1);
        }
        self.status.send_modify(|s| {
            s.applied += applied;
            s.deleted += deleted;
            s.refused += refused;
            if full {
                s.full_passes += 1;
                s.synced = true;
            }
        });
    }
}
