//! Following a resource of the cluster: a watcher into a reflector (the store of what the
//! cluster holds, read by the conversion), with objects trimmed to what is read, and the version
//! of a kind the cluster serves. A failed list or watch comes out of the stream as a
//! [`Problem`] (the watcher retries with backoff), so that the syncer can say what it waits for.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};

use crate::convert::Pod;
use crate::metrics::SyncMetrics;
use crate::problem::{Problem, Reason};

/// What a followed resource's stream yields: an event, or why the last list or watch failed.
pub type Followed<K> = Result<watcher::Event<K>, Problem>;

/// A watcher of `K` into a reflector: events come out after the store has them. Objects are
/// trimmed by `trim` first (a pod's containers and status are not read, and at 100,000 pods
/// they would be most of the memory).
pub fn follow<K>(
    api: Api<K>,
    trim: fn(&mut K),
    resource: &'static str,
    metrics: Arc<SyncMetrics>,
) -> (Store<K>, impl Stream<Item = Followed<K>> + Send + 'static)
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    follow_selected(api, watcher::Config::default(), trim, resource, metrics)
}

/// [`follow`] of the objects `config` selects (by field or label).
pub fn follow_selected<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    resource: &'static str,
    metrics: Arc<SyncMetrics>,
) -> (Store<K>, impl Stream<Item = Followed<K>> + Send + 'static)
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
    (
        store,
        watch_into(api, config, writer, trim, resource, metrics),
    )
}

/// [`follow`] into a given reflector (of a kind known at run time).
pub fn follow_into<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    trim: fn(&mut K),
    resource: &'static str,
    metrics: Arc<SyncMetrics>,
) -> impl Stream<Item = Followed<K>> + Send + 'static
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
{
    watch_into(
        api,
        watcher::Config::default(),
        writer,
        trim,
        resource,
        metrics,
    )
}

fn watch_into<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    trim: fn(&mut K),
    resource: &'static str,
    metrics: Arc<SyncMetrics>,
) -> impl Stream<Item = Followed<K>> + Send + 'static
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Send + Sync,
{
    watcher(api, config)
        .modify(move |k: &mut K| {
            k.meta_mut().managed_fields = None;
            trim(k);
        })
        .default_backoff()
        .reflect(writer)
        .map(move |event| match event {
            Ok(e) => {
                if matches!(e, watcher::Event::Init) {
                    metrics.listed(resource);
                }
                Ok(e)
            }
            // The watcher retries with backoff; the syncer tells of the failure.
            Err(e) => {
                metrics.watch_failed(resource);
                Err(Problem::of_watch(&e))
            }
        })
}

/// Config objects lose what the store does not keep: their status (but for a `Healthy`
/// condition, a WorkloadEntry's health, which the store keeps as an annotation), and the copy of
/// the whole object `kubectl apply` leaves in an annotation.
pub fn trim_config(obj: &mut DynamicObject) {
    if let Some(a) = &mut obj.metadata.annotations {
        a.remove(LAST_APPLIED);
    }
    let healthy = crate::convert::healthy_condition(&obj.data).cloned();
    if let Some(data) = obj.data.as_object_mut() {
        data.retain(|k, _| k == "spec");
        if let Some(condition) = healthy {
            data.insert(
                "status".into(),
                serde_json::json!({"conditions": [condition]}),
            );
        }
    }
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Which version of a kind the cluster serves.
#[derive(Debug, Clone)]
pub enum Served {
    /// The newest of the versions asked for that the cluster serves.
    At(ApiResource),
    /// None of them: the CRD is not installed.
    No,
}

/// The version of a kind to read: the newest of `versions` the cluster serves, asked by
/// listing one object of each. A refusal (RBAC's 403) or an API server that cannot be reached
/// is an error: the kind may well be served, and taking it for absent would delete what the
/// store holds of it.
pub async fn served_version(
    client: &Client,
    group: &str,
    kind: &str,
    plural: &str,
    versions: &[&str],
) -> Result<Served, Problem> {
    for version in versions {
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        match api.list_metadata(&ListParams::default().limit(1)).await {
            Ok(_) => return Ok(Served::At(resource)),
            Err(e) => {
                let problem = Problem::of(&e);
                if problem.reason != Reason::NotFound {
                    return Err(problem);
                }
            }
        }
    }
    Ok(Served::No)
}

/// A pod as the syncer keeps it: without annotations, and of its owners only its controller's
/// kind and name (what names its workload, see [`crate::convert::workload_name`]).
pub fn trim_pod(pod: &mut Pod) {
    pod.metadata.annotations = None;
    pod.metadata.managed_fields = None;
    pod.metadata.owner_references = pod
        .metadata
        .owner_references
        .take()
        .and_then(|refs| refs.into_iter().find(|r| r.controller == Some(true)))
        .map(|r| {
            vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    kind: r.kind,
                    name: r.name,
                    controller: Some(true),
                    ..Default::default()
                },
            ]
        });
}

/// A node as the syncer keeps it: its labels (locality) and its `ExternalIP` addresses (where a
/// `NodePort` network gateway is reached), nothing else.
pub fn trim_node(node: &mut Node) {
    node.metadata.annotations = None;
    node.spec = None;
    let external: Vec<_> = node
        .status
        .take()
        .and_then(|s| s.addresses)
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "ExternalIP")
        .collect();
    if !external.is_empty() {
        node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            addresses: Some(external),
            ..Default::default()
        });
    }
}

pub fn trim_nothing<K>(_: &mut K) {}
