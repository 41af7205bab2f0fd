//! The Kubernetes syncer: follows a cluster's Istio config (every kind the store keeps),
//! Services, EndpointSlices, Pods, Nodes, Namespaces, Ingresses and IngressClasses, and the
//! Gateway API's kinds with kube's watchers (each into a reflector), and keeps the store's copy equal to what they say, through
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
//!   VirtualServices istiod generates for them ([`crate::ingress`]), worked out again over
//!   every Ingress when one of them, an IngressClass or a Service changes, and written like any
//!   other object the syncer owns (the store compares them, so an unchanged one is not written).
//! - Gateway API objects (Gateways, HTTP, gRPC, TCP and TLS routes, ReferenceGrants, with the
//!   GatewayClasses and the certificate keys of Secrets and ConfigMaps) are not stored as such
//!   either: they become the Gateways and VirtualServices istiod generates
//!   ([`crate::gateway_api`]), worked out again when one of them, a Service, a ServiceEntry,
//!   a namespace, or a certificate changes ([`crate::gateway_api::cluster`]).
//! - What is read depends on the cluster ([`Reads`]): PCP's own cluster (the config cluster)
//!   is read whole; a remote cluster only for its service registry (Namespaces, Services,
//!   EndpointSlices, Pods, Nodes), as istiod reads remote clusters: Istio config comes from the
//!   config cluster alone. A remote cluster's objects have names of their own
//!   ([`convert::ClusterNames`]).
//! - A syncer may be started held ([`Syncer::start_held`]): it lists and follows its cluster but
//!   writes nothing until released, so that a cluster's new credentials replace the old only
//!   once they have been shown to work (the old syncer writes until then).
//! - A write the store refuses (an object Kubernetes accepted but istiod would not) is logged
//!   and counted, and what was stored before stays; a store that cannot be reached is retried
//!   with backoff.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use pasa_proto::Kind;
use serde_json::Value;
use tokio::sync::watch;

use crate::convert::{
    self, ClusterNames, EndpointSettings, NETWORK_LABEL, Pod, SliceReferences, Source, StoreKey,
    Workloads,
};
use crate::follow::{
    Followed, Served, follow, follow_into, follow_selected, served_version, trim_config, trim_node,
    trim_nothing, trim_pod,
};
use crate::metrics::SyncMetrics;
use crate::problem::{Problem, Reason};
use crate::selectors::DiscoverySelectors;
use crate::{gateway_api, ingress, pull_secrets};
use pasa_runtime::backoff::Backoff;

mod change;
mod discover;
mod references;
mod run;

use change::{Change, changes, gateway_api_resource, shown};
use discover::{discover, tell};
use references::{Id, References, slice_id};
use run::run;

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
    /// Creates or replaces the object `doc` (apiVersion, kind, metadata, spec): one the cluster
    /// holds, or one the syncer `generated` (from Ingresses or the Gateway API), which is checked
    /// as istiod checks what it generates. `create_only`: written only if the store holds no
    /// object of its name (refused otherwise), so that a syncer never replaces what it did not
    /// write.
    fn apply(
        &self,
        doc: Value,
        generated: bool,
        create_only: bool,
    ) -> impl Future<Output = Result<(), WriteError>> + Send;
    /// Deletes an object; one already gone is not an error.
    fn delete(&self, key: &StoreKey) -> impl Future<Output = Result<(), WriteError>> + Send;
    /// The clusters whose syncers wrote what the store holds (the values of the
    /// `pasa.io/cluster` label): what a remote cluster no longer registered left behind.
    fn clusters(&self) -> impl Future<Output = Result<BTreeSet<String>, WriteError>> + Send;
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
    pub ingress: ingress::Settings,
    /// How Gateway API objects are converted (the domain suffix, the built-in classes).
    pub gateway_api: gateway_api::Settings,
    /// Endpoints that are not ready are written (`ready: false`, which proxies get as
    /// UNHEALTHY), as istiod sends them with `PILOT_AUTO_SEND_UNHEALTHY_ENDPOINTS` (its
    /// default); without, they are left out.
    pub send_unhealthy_endpoints: bool,
    /// The API server's address, for messages.
    pub api_server: String,
    /// What is read of the cluster.
    pub reads: Reads,
    /// A remote cluster: its objects have names of their own ([`ClusterNames::remote`]).
    pub remote: bool,
    /// The cluster's system namespace (istiod's, `istio-system`): its
    /// `topology.istio.io/network` label is the network of endpoints whose pods name none.
    pub system_namespace: String,
    /// The mesh config's `meshNetworks`, as read at start (as the discovery selectors are):
    /// the gateways it gives by DNS name are resolved here (see [`convert::network`]).
    pub mesh_networks: Option<pasa_istio::mesh_networks::MeshNetworks>,
}

/// What a syncer reads of its cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    /// Everything PCP follows: Istio config, Ingresses, the Gateway API, and the service
    /// registry (PCP's own cluster, the config cluster).
    Everything,
    /// The service registry alone: Namespaces, Services, EndpointSlices, Pods and Nodes (a
    /// remote cluster, as istiod reads one).
    Registry,
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
    /// Resources not listed yet (as kubectl names them: `pods`,
    /// `virtualservices.networking.istio.io`): the first complete comparison waits for them.
    pub waiting: BTreeSet<String>,
    /// Resources whose last list or watch failed, and why (retried with backoff).
    pub problems: BTreeMap<String, Problem>,
    /// Every resource has been listed once: the syncer can compare (a held syncer then waits
    /// to be released).
    pub listed: bool,
}

impl SyncStatus {
    /// What the first sync waits for, in words: each resource not listed yet, with why its
    /// last request failed.
    pub fn waiting_for(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        for (resource, problem) in &self.problems {
            if self.waiting.contains(resource) {
                parts.push(format!("{resource} ({}: {problem})", problem.reason));
            }
        }
        let listing: Vec<&str> = self
            .waiting
            .iter()
            .filter(|r| !self.problems.contains_key(*r))
            .map(String::as_str)
            .collect();
        match listing.len() {
            0 => {}
            n if n <= 4 => parts.push(format!("{} (listing)", listing.join(", "))),
            n => parts.push(format!("{n} resources being listed")),
        }
        parts.join("; ")
    }
}

/// A running syncer; stops when dropped.
pub struct Syncer {
    status: watch::Receiver<SyncStatus>,
    /// True while held: the syncer follows its cluster but writes nothing.
    hold: watch::Sender<bool>,
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
        Syncer::start_with(client, config, target, metrics, false)
    }

    /// Starts following the cluster `client` reaches, writing nothing until
    /// [`Syncer::release`]d: its status says `listed` once it could.
    pub fn start_held<T: Target>(
        client: Client,
        config: SyncConfig,
        target: T,
        metrics: Arc<SyncMetrics>,
    ) -> Syncer {
        Syncer::start_with(client, config, target, metrics, true)
    }

    fn start_with<T: Target>(
        client: Client,
        config: SyncConfig,
        target: T,
        metrics: Arc<SyncMetrics>,
        held: bool,
    ) -> Syncer {
        let (status_tx, status) = watch::channel(SyncStatus::default());
        let (hold, held) = watch::channel(held);
        let task = tokio::spawn(run(client, config, target, metrics, status_tx, held));
        Syncer { status, hold, task }
    }

    /// Lets a held syncer write: it reads what the store holds of its cluster then, and
    /// compares everything.
    pub fn release(&self) {
        self.hold.send_replace(false);
    }

    /// Follows the syncer's progress.
    pub fn status(&self) -> watch::Receiver<SyncStatus> {
        self.status.clone()
    }
}

/// The resources of a cluster's service registry, followed in every cluster.
const REGISTRY_RESOURCES: [&str; 5] = ["services", "endpointslices", "pods", "nodes", "namespaces"];

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
    /// The Gateway API kinds the cluster serves, with the version read.
    gateway_api: BTreeMap<&'static str, (ApiResource, Store<DynamicObject>)>,
    /// Secrets (their certificate keys and Docker configs), when the cluster serves Gateways or
    /// Wasm extensions, and ConfigMaps (their certificate keys), when it serves Gateways.
    secrets: Store<Secret>,
    config_maps: Store<ConfigMap>,
    /// Network gateways' DNS names and their addresses.
    gateway_names: crate::gateway_names::GatewayNames,
    /// The Services `meshNetworks` names as gateways, as (namespace, name).
    registry_gateways: BTreeSet<(String, String)>,
}

impl Workloads for Stores {
    fn gateway_addresses(&self, name: &str) -> Option<Vec<std::net::IpAddr>> {
        self.gateway_names.addresses(name)
    }

    fn registry_gateway(&self, namespace: &str, name: &str) -> bool {
        self.registry_gateways
            .contains(&(namespace.to_string(), name.to_string()))
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get(&ObjectRef::new(name).within(namespace))
    }

    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    fn service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        self.services.get(&ObjectRef::new(name).within(namespace))
    }

    fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.state()
    }
}

/// The syncer's state between events.
struct Syncing<T> {
    config: SyncConfig,
    /// The names of this cluster's objects.
    names: ClusterNames,
    /// The network of the cluster's endpoints whose pods name none (its system namespace's
    /// label), as last read.
    network: String,
    /// `NodePort` gateway Services, whose addresses change with the nodes.
    node_port_gateways: BTreeSet<Id>,
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
    /// What the Gateway API objects became, by key, as last worked out.
    derived_gateway_api: BTreeMap<StoreKey, Value>,
    /// The network gateways `meshNetworks` gives by DNS name, as last resolved (PCP's own
    /// cluster only).
    derived_mesh_networks: BTreeMap<StoreKey, Value>,
    /// Resolve them again at the next pass.
    gateway_names_changed: bool,
    /// Work out what the Gateway API objects become again at the next pass.
    gateway_api_changed: bool,
    /// The names the Gateway API objects mention, as of the last conversion: only changes of
    /// Services, Secrets and ConfigMaps of those names convert again.
    mentioned: gateway_api::cluster::Mentioned,
    /// The Gateway API objects the last conversion could not read (each logged once).
    unreadable: BTreeSet<String>,
    /// The registry credentials of the pull secrets Wasm extensions name, by key.
    derived_pull_secrets: BTreeMap<StoreKey, Value>,
    /// The pull secrets named, as of the last derivation: only their changes derive again.
    pull_secrets_named: BTreeSet<(String, String)>,
    /// Work out the pull secrets again at the next pass.
    pull_secrets_changed: bool,
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

/// Replaces what a conversion generated, marking what it generated before and now to be
/// compared (what is gone is deleted, what changed written).
fn replace_derived(
    dirty: &mut BTreeSet<StoreKey>,
    derived: &mut BTreeMap<StoreKey, Value>,
    now: BTreeMap<StoreKey, Value>,
) {
    dirty.extend(derived.keys().cloned());
    dirty.extend(now.keys().cloned());
    *derived = now;
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
    /// Reads what the store holds of this cluster (again, with backoff, until the store
    /// answers): what the first comparison starts from. Objects deleted in the cluster while
    /// PCP was away are among them, and are deleted by it.
    async fn read_owned(&mut self) {
        let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX, Duration::ZERO);
        let owned = loop {
            match self.target.owned(&self.config.cluster_id).await {
                Ok(docs) => break docs,
                Err(e) => {
                    let wait = backoff.failed();
                    tracing::warn!(cluster = %self.config.cluster_id, error = %e, retry_in = ?wait,
                        "cannot read what the syncer wrote before");
                    tokio::time::sleep(wait).await;
                }
            }
        };
        self.written = owned
            .iter()
            .filter_map(|doc| Some((key_of(doc)?, convert::comparable(doc))))
            .collect();
        tracing::info!(cluster = %self.config.cluster_id, owned = self.written.len(),
            "comparing the cluster with what the store holds of it");
    }

    /// Keeps the status's problems: a failure is told (once while it lasts) and recorded; any
    /// event of the resource clears it.
    fn note_health(&mut self, change: &Change) {
        if let Change::Failed(resource, problem) = change {
            let name = shown(resource);
            if self.status.borrow().problems.get(&name) != Some(problem) {
                tell(&name, problem, &self.config.api_server);
                self.status.send_modify(|s| {
                    s.problems.insert(name, problem.clone());
                });
            }
        } else if !self.status.borrow().problems.is_empty() {
            let name = shown(change.resource());
            if self.status.borrow().problems.contains_key(&name) {
                self.status.send_modify(|s| {
                    s.problems.remove(&name);
                });
            }
        }
    }

    /// Notes what an event makes dirty; returns the resource a list of which completed.
    fn handle(&mut self, change: Change) -> Option<&'static str> {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        // A list replaced what the watch said: deletions in between were not seen as events,
        // so everything is compared (`listed`).
        match change {
            Change::Config(kind, e) => match *e {
                Apply(obj) | Delete(obj) => {
                    // A route may have a ServiceEntry as its parent or backend.
                    self.gateway_api_changed |= kind == Kind::ServiceEntry;
                    // An extension may name a pull secret.
                    self.pull_secrets_changed |=
                        matches!(kind, Kind::WasmPlugin | Kind::TrafficExtension);
                    self.dirty.insert(StoreKey {
                        kind,
                        namespace: obj.namespace().unwrap_or_default(),
                        name: obj.name_any(),
                    });
                }
                InitDone => return self.listed(kind.plural()),
                Init | InitApply(_) => {}
            },
            // The network gateways known by DNS name are written again with what the names
            // resolve to now: Services labelled with a network or named by `meshNetworks`,
            // the Gateway API's, and those `meshNetworks` gives by name.
            Change::GatewayNames => {
                self.gateway_api_changed = true;
                self.gateway_names_changed = true;
                let gateways: Vec<StoreKey> = self
                    .stores
                    .services
                    .state()
                    .iter()
                    .filter(|s| {
                        let labelled = s
                            .metadata
                            .labels
                            .as_ref()
                            .is_some_and(|l| l.contains_key(convert::NETWORK_LABEL));
                        labelled
                            || self.stores.registry_gateway(
                                s.metadata.namespace.as_deref().unwrap_or_default(),
                                &s.name_any(),
                            )
                    })
                    .map(|s| {
                        self.names
                            .service_key(&s.namespace().unwrap_or_default(), &s.name_any())
                    })
                    .collect();
                self.dirty.extend(gateways);
            }
            Change::Service(e) => match *e {
                Apply(svc) | Delete(svc) => {
                    let id = (svc.namespace().unwrap_or_default(), svc.name_any());
                    self.dirty.insert(self.names.service_key(&id.0, &id.1));
                    // A NodePort gateway's addresses follow the nodes.
                    if self
                        .stores
                        .services
                        .get(&ObjectRef::new(&id.1).within(&id.0))
                        .is_some_and(|s| convert::network::is_node_port_gateway(&s))
                    {
                        self.node_port_gateways.insert(id.clone());
                    } else {
                        self.node_port_gateways.remove(&id);
                    }
                    // Its labels may ask for persistent sessions, which keep draining endpoints.
                    let slices = self.refs.by_service.get(&id).into_iter().flatten();
                    let names = &self.names;
                    self.dirty
                        .extend(slices.map(|(ns, slice)| names.slice_key(ns, slice)));
                    // An Ingress may name its port; a route may have it as a parent or backend.
                    self.ingresses_changed = true;
                    self.gateway_api_changed |= self.mentioned.covers(&id.1);
                }
                InitDone => {
                    self.node_port_gateways = self
                        .stores
                        .services
                        .state()
                        .iter()
                        .filter(|s| convert::network::is_node_port_gateway(s))
                        .map(|s| (s.namespace().unwrap_or_default(), s.name_any()))
                        .collect();
                    return self.listed("services");
                }
                Init | InitApply(_) => {}
            },
            Change::Slice(e) => match *e {
                Apply(eps) | InitApply(eps) => {
                    let id = slice_id(&eps);
                    self.refs.set(id.clone(), convert::slice_references(&eps));
                    self.dirty.insert(self.names.slice_key(&id.0, &id.1));
                }
                Delete(eps) => {
                    let id = slice_id(&eps);
                    self.refs.remove(&id);
                    self.dirty.insert(self.names.slice_key(&id.0, &id.1));
                }
                Init => self.refs = References::default(),
                InitDone => return self.listed("endpointslices"),
            },
            Change::Pod(e) => match *e {
                Apply(pod) | Delete(pod) => {
                    let id = (pod.namespace().unwrap_or_default(), pod.name_any());
                    let slices = self.refs.by_pod.get(&id).into_iter().flatten();
                    let names = &self.names;
                    self.dirty
                        .extend(slices.map(|(ns, slice)| names.slice_key(ns, slice)));
                }
                InitDone => return self.listed("pods"),
                Init | InitApply(_) => {}
            },
            Change::Node(e) => match *e {
                Apply(node) | Delete(node) => {
                    let name = node.name_any();
                    let slices = self.refs.by_node.get(&name).into_iter().flatten();
                    let names = &self.names;
                    self.dirty
                        .extend(slices.map(|(ns, slice)| names.slice_key(ns, slice)));
                    let gateways = self.node_port_gateways.iter();
                    self.dirty
                        .extend(gateways.map(|(ns, svc)| names.service_key(ns, svc)));
                }
                InitDone => return self.listed("nodes"),
                Init | InitApply(_) => {}
            },
            Change::Namespace(e) => match *e {
                Apply(ns) | Delete(ns) => {
                    // Listeners select route namespaces by label.
                    self.gateway_api_changed = true;
                    let name = ns.name_any();
                    if name == self.config.system_namespace {
                        self.network_changed();
                    }
                    let now = self.selects(&name);
                    if self.selected.insert(name.clone(), now) != Some(now) {
                        self.dirty_namespace(&name);
                        // Its Ingresses and extensions come or go with it.
                        self.ingresses_changed = true;
                        self.pull_secrets_changed = true;
                    }
                }
                InitDone => {
                    self.selected.clear();
                    self.network_changed();
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
            Change::GatewayApi(kind, e) => match *e {
                Apply(_) | Delete(_) => self.gateway_api_changed = true,
                InitDone => return self.listed(gateway_api_resource(kind)),
                Init | InitApply(_) => {}
            },
            Change::Secret(e) => match *e {
                // A certificate a listener names, or a pull secret an extension names, may
                // have come, changed or gone.
                Apply(s) | Delete(s) => {
                    self.gateway_api_changed |= self.mentioned.covers(&s.name_any());
                    let id = (s.namespace().unwrap_or_default(), s.name_any());
                    self.pull_secrets_changed |= self.pull_secrets_named.contains(&id);
                }
                InitDone => return self.listed("secrets"),
                Init | InitApply(_) => {}
            },
            Change::ConfigMap(e) => match *e {
                Apply(c) | Delete(c) => {
                    self.gateway_api_changed |= self.mentioned.covers(&c.name_any());
                }
                InitDone => return self.listed("configmaps"),
                Init | InitApply(_) => {}
            },
            Change::Failed(..) => {}
        }
        None
    }

    /// Works out again what the served Ingresses of selected namespaces become, and marks the
    /// keys of what they became before and now to be compared.
    fn derive_from_ingresses(&mut self) {
        let derived = ingress::cluster::derive(
            &self.stores.ingresses,
            &self.stores.ingress_classes,
            &self.stores.services,
            &self.config.ingress,
            &self.config.cluster_id,
            |ns| self.selects(ns),
        );
        replace_derived(&mut self.dirty, &mut self.derived, derived);
    }

    /// Works out again what the Gateway API objects of selected namespaces become, and marks
    /// the keys of what they became before and now to be compared.
    fn derive_from_gateway_api(&mut self) {
        let sources = gateway_api::cluster::Sources {
            objects: &self.stores.gateway_api,
            services: &self.stores.services,
            namespaces: &self.stores.namespaces,
            secrets: &self.stores.secrets,
            config_maps: &self.stores.config_maps,
            service_entries: self.stores.configs.get(&Kind::ServiceEntry),
            gateway_names: &self.stores.gateway_names,
        };
        self.mentioned = gateway_api::cluster::Mentioned::of(&self.stores.gateway_api);
        let derived = gateway_api::cluster::derive(
            &sources,
            &self.config.gateway_api,
            &self.config.cluster_id,
            &self.mentioned,
            |ns| self.selects(ns),
        );
        // Each unreadable object is told once, while it stays so.
        for e in derived.unreadable.difference(&self.unreadable) {
            tracing::warn!(error = %e, "cannot read a Gateway API object; left out");
        }
        self.unreadable = derived.unreadable;
        replace_derived(
            &mut self.dirty,
            &mut self.derived_gateway_api,
            derived.objects,
        );
    }

    /// Works out again the network gateways `meshNetworks` gives by DNS name (PCP's own cluster
    /// writes them, once for the mesh), and marks the keys of before and now to be compared.
    fn derive_mesh_network_gateways(&mut self) {
        let now = match (&self.config.mesh_networks, self.config.remote) {
            (Some(mesh), false) => convert::network::mesh_network_gateways(
                mesh,
                &self.config.system_namespace,
                |name| self.stores.gateway_names.addresses(name),
            ),
            _ => None,
        };
        let objects = now
            .into_iter()
            .filter_map(|doc| {
                pasa_proto::Object::from_json(
                    &doc,
                    "default",
                    pasa_istio::generated::is_generated_object,
                )
                .inspect_err(|e| tracing::warn!(error = ?e, "cannot write meshNetworks' gateways"))
                .ok()
            })
            .collect();
        let derived = convert::generated(objects, &self.config.cluster_id);
        replace_derived(&mut self.dirty, &mut self.derived_mesh_networks, derived);
    }

    /// Works out again which pull secrets the extensions of selected namespaces name and what
    /// the store holds of them, and marks the keys of before and now to be compared.
    fn derive_pull_secrets(&mut self) {
        self.pull_secrets_named = pull_secrets::named(&self.stores.configs, |ns| self.selects(ns));
        let derived = pull_secrets::derive(
            &self.pull_secrets_named,
            &self.stores.secrets,
            &self.config.cluster_id,
        );
        replace_derived(&mut self.dirty, &mut self.derived_pull_secrets, derived);
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

    /// Reads the cluster's network from its system namespace again; when it changed, every
    /// part is compared again (their endpoints' network may be it).
    fn network_changed(&mut self) {
        let system = ObjectRef::new(&self.config.system_namespace);
        let network = self
            .stores
            .namespaces
            .get(&system)
            .and_then(|ns| ns.metadata.labels.as_ref()?.get(NETWORK_LABEL).cloned())
            .unwrap_or_default();
        if network == self.network {
            return;
        }
        tracing::info!(cluster = %self.config.cluster_id, network = %network,
            "the cluster's network (its system namespace's label) changed");
        self.network = network;
        let names = &self.names;
        self.dirty.extend(
            self.stores
                .slices
                .state()
                .iter()
                .map(|eps| names.slice_key(&eps.namespace().unwrap_or_default(), &eps.name_any())),
        );
    }

    fn dirty_namespace(&mut self, namespace: &str) {
        let in_ns = |ns: Option<&String>| ns.map(String::as_str) == Some(namespace);
        for svc in self.stores.services.state() {
            if in_ns(svc.metadata.namespace.as_ref()) {
                self.dirty
                    .insert(self.names.service_key(namespace, &svc.name_any()));
            }
        }
        for eps in self.stores.slices.state() {
            if in_ns(eps.metadata.namespace.as_ref()) {
                self.dirty
                    .insert(self.names.slice_key(namespace, &eps.name_any()));
            }
        }
        // Its Istio config, which the store may never have had (a namespace selected now).
        for (kind, (_, store)) in &self.stores.configs {
            for obj in store.state() {
                if in_ns(obj.metadata.namespace.as_ref()) {
                    self.dirty.insert(StoreKey {
                        kind: *kind,
                        namespace: namespace.to_string(),
                        name: obj.name_any(),
                    });
                }
            }
        }
        let written = self.written.keys().filter(|k| k.namespace == namespace);
        self.dirty.extend(written.cloned());
    }

    /// What the store should hold under `key` (`None` for nothing), and whether the syncer
    /// generated it.
    fn desired(&self, key: &StoreKey) -> Option<(Value, bool)> {
        // Generated from Ingresses or Gateway API objects of selected namespaces (a cluster's
        // own object of the same name comes first).
        let derived = self
            .derived
            .get(key)
            .or_else(|| self.derived_gateway_api.get(key))
            .or_else(|| self.derived_mesh_networks.get(key));
        if let Some(doc) = derived
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
            return Some((doc.clone(), true));
        }
        if key.kind == Kind::ImagePullSecret {
            return self
                .derived_pull_secrets
                .get(key)
                .map(|doc| (doc.clone(), false));
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
            return Some((
                convert::config(key, &resource.api_version, &obj, cluster),
                false,
            ));
        }
        match self.names.source(key)? {
            Source::Slice(slice) => {
                let eps = self
                    .stores
                    .slices
                    .get(&ObjectRef::new(slice).within(&key.namespace))?;
                let settings = EndpointSettings {
                    unready: self.config.send_unhealthy_endpoints,
                    network: &self.network,
                };
                convert::slice(&eps, &self.names, &self.stores, &settings)
                    .map(|(_, doc)| (doc, false))
            }
            Source::Service(name) => {
                let svc = self
                    .stores
                    .services
                    .get(&ObjectRef::new(name).within(&key.namespace))?;
                convert::service(&svc, &self.names, &self.stores).map(|(_, doc)| (doc, false))
            }
        }
    }

    /// Compares the dirty keys (every key, after a list) and writes the differences.
    async fn pass(&mut self) {
        if self.dirty.is_empty()
            && !self.full
            && !self.ingresses_changed
            && !self.gateway_api_changed
            && !self.pull_secrets_changed
            && !self.gateway_names_changed
        {
            return;
        }
        let full = std::mem::take(&mut self.full);
        if std::mem::take(&mut self.ingresses_changed) || full {
            self.derive_from_ingresses();
        }
        if std::mem::take(&mut self.gateway_api_changed) || full {
            self.derive_from_gateway_api();
        }
        if std::mem::take(&mut self.pull_secrets_changed) || full {
            self.derive_pull_secrets();
        }
        if std::mem::take(&mut self.gateway_names_changed) || full {
            self.derive_mesh_network_gateways();
        }
        let mut keys = std::mem::take(&mut self.dirty);
        if full {
            let ns = |o: &Option<String>| o.clone().unwrap_or_default();
            let names = &self.names;
            keys.extend(
                self.stores
                    .services
                    .state()
                    .iter()
                    .map(|s| names.service_key(&ns(&s.metadata.namespace), &s.name_any())),
            );
            keys.extend(
                self.stores
                    .slices
                    .state()
                    .iter()
                    .map(|s| names.slice_key(&ns(&s.metadata.namespace), &s.name_any())),
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
            let compared = desired.as_ref().map(|(doc, _)| convert::comparable(doc));
            if compared.as_ref() == self.written.get(&key) {
                continue;
            }
            // A remote cluster's syncer creates only what no one holds: an object of the name
            // it would write that it did not write (another cluster's) is not replaced. PCP's
            // own cluster's syncer takes over objects of its names, as it always has (written
            // by hand, or under an earlier --cluster-id).
            let create_only = self.config.remote && !self.written.contains_key(&key);
            let outcome = match desired {
                Some((doc, generated)) => self
                    .target
                    .apply(doc, generated, create_only)
                    .await
                    .map(|()| true),
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
                Err(WriteError::Refused(message)) if create_only => {
                    refused += 1;
                    self.metrics.wrote("refused");
                    tracing::warn!(object = %key, cluster = %self.config.cluster_id, error = %message,
                        "the store holds an object of this name that this cluster's syncer did not \
                         write (another cluster's): not replaced");
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
