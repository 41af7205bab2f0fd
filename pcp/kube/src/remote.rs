//! Remote clusters: the clusters besides PCP's own (the config cluster) whose service registries
//! PCP syncs into the store, registered as istiod registers them ([`source`]: Secrets labelled
//! `istio/multiCluster=true` in PCP's namespace, or a directory of kubeconfig files).
//!
//! - Each remote cluster has a syncer of its own ([`crate::syncer`], reading
//!   [`Reads::Registry`]: Namespaces, Services, EndpointSlices, Pods and Nodes, never Istio
//!   config, which comes from the config cluster alone), whose objects carry the cluster's ID
//!   and names of their own: one cluster's syncer can neither overwrite nor delete another's.
//! - A cluster ID equal to PCP's own, or one another Secret (or file) registered first, is
//!   refused with a warning naming both; the first registration stays.
//! - A changed kubeconfig starts a second syncer held back ([`Syncer::start_held`]); once it
//!   has listed the cluster, the old one stops and the new one writes (it compares everything
//!   with what the store holds, so nothing the old one wrote outlives a change it missed). A
//!   kubeconfig that never works leaves the old one syncing.
//! - A Secret (or key, or file) removed stops its cluster's syncer and deletes what it wrote.
//!   At start, once every source has been read, what the store holds of remote clusters no
//!   source registers any more (removed while PCP was away) is deleted too.
//! - A cluster that cannot be reached never holds the others up. Readiness waits for each
//!   cluster's first sync for at most the timeout (istiod's `PILOT_REMOTE_CLUSTER_TIMEOUT`),
//!   then goes on without it, saying which cluster is missing and what it waits for; it is
//!   synced whenever it comes.
//!
//! Leader election: PCP's replicas elect the one that syncs by a Lease in the config cluster
//! ([`crate::lease`]), and that replica syncs the remote clusters too: the store has one
//! writer per cluster. istiod's `topology.istio.io/controlPlaneClusters` annotation on a
//! remote's system namespace chooses which control planes join leader elections *in that
//! remote* for the controllers that write to it (its namespaces' CA ConfigMaps, its injection
//! webhook's certificate, ServiceExports). PCP writes nothing to a remote cluster, only reads
//! it, so it holds no lease there and the annotation has nothing to choose.

pub mod namespaces;
pub mod source;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::Value;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

use crate::convert::{ClusterNames, StoreKey};
use crate::metrics::SyncMetrics;
use crate::syncer::{Reads, SyncConfig, SyncStatus, Syncer, Target};
use pasa_runtime::backoff::Backoff;
use source::{Origin, SourceEvent, Update};

/// A remote cluster's sync state, as istiod names it (`istioctl remote-clusters`' STATUS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncState {
    /// Its first sync is done.
    Synced,
    /// Its first sync is under way, within the timeout.
    Syncing,
    /// Its first sync did not finish within the timeout: PCP is ready without it.
    Timeout,
    /// Its kubeconfig gives no client (what `detail` says).
    Failed,
}

impl SyncState {
    pub const ALL: [SyncState; 4] = [
        SyncState::Synced,
        SyncState::Syncing,
        SyncState::Timeout,
        SyncState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SyncState::Synced => "synced",
            SyncState::Syncing => "syncing",
            SyncState::Timeout => "timeout",
            SyncState::Failed => "failed",
        }
    }
}

/// One remote cluster, as PCP's status shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    pub id: String,
    /// Where it is registered: the Secret (`namespace/name`) or the file.
    pub source: String,
    pub state: SyncState,
    /// What its first sync waits for, or why it failed; empty once synced.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// A new kubeconfig is being tried (the one before syncs until it works), and how it fares.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub replacing: String,
}

/// What the remote clusters' controller knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteStatus {
    /// Every source has been read once: the registered clusters are known.
    pub sources_synced: bool,
    /// Why a source cannot be read now (retried).
    pub source_problem: Option<String>,
    /// The registered clusters, by ID.
    pub clusters: BTreeMap<String, ClusterStatus>,
}

impl RemoteStatus {
    /// Whether PCP may be ready as far as remote clusters go: the sources are read, and each
    /// cluster is synced, timed out or failed.
    pub fn ready(&self) -> bool {
        self.sources_synced
            && self
                .clusters
                .values()
                .all(|c| c.state != SyncState::Syncing)
    }

    /// One line: each cluster's state, and what a missing one waits for.
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        if !self.sources_synced {
            parts.push("reading the remote cluster registrations".into());
        }
        if let Some(problem) = &self.source_problem {
            parts.push(problem.clone());
        }
        for c in self.clusters.values() {
            let mut part = format!("{} ({}) {}", c.id, c.source, c.state.as_str());
            if !c.detail.is_empty() {
                part.push_str(&format!(": {}", c.detail));
            }
            parts.push(part);
        }
        if parts.is_empty() {
            return "no remote clusters registered".into();
        }
        parts.join("; ")
    }
}

/// How remote clusters are synced.
#[derive(Debug, Clone)]
pub struct RemoteSettings {
    /// The syncer settings every remote cluster's syncer starts from (its ID, reading, names
    /// and API server are set per cluster); `cluster_id` is PCP's own cluster's.
    pub sync: SyncConfig,
    /// How long readiness waits for a cluster's first sync (zero: for ever, as istiod's
    /// `PILOT_REMOTE_CLUSTER_TIMEOUT=0`).
    pub timeout: Duration,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub cluster: String,
    pub cluster_type: &'static str,
    pub status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabels {
    pub cluster_type: &'static str,
}

/// The remote clusters' metrics, named as istiod's.
#[derive(Default)]
pub struct RemoteMetrics {
    pub sync_status: Family<StateLabels, Gauge>,
    pub timeouts: Family<ClusterLabels, Counter>,
    pub managed: Family<TypeLabels, Gauge>,
}

impl RemoteMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "istiod_remote_cluster_sync_status",
            "Current synchronization state of remote clusters: one sample per cluster and state \
             (synced, syncing, timeout, failed); 1 for the state it is in",
            self.sync_status.clone(),
        );
        registry.register(
            "remote_cluster_sync_timeouts",
            "Number of times a remote cluster took longer than the timeout to sync, so that \
             PCP became ready without it, by cluster",
            self.timeouts.clone(),
        );
        registry.register(
            "istiod_managed_clusters",
            "Number of clusters PCP syncs, by type (local, remote)",
            self.managed.clone(),
        );
    }

    fn show(&self, status: &RemoteStatus) {
        self.sync_status.clear();
        for c in status.clusters.values() {
            for state in SyncState::ALL {
                let labels = StateLabels {
                    cluster: c.id.clone(),
                    cluster_type: "remote",
                    status: state.as_str(),
                };
                self.sync_status
                    .get_or_create(&labels)
                    .set(i64::from(c.state == state));
            }
        }
        let remote = i64::try_from(status.clusters.len()).unwrap_or(i64::MAX);
        self.managed
            .get_or_create(&TypeLabels {
                cluster_type: "remote",
            })
            .set(remote);
        self.managed
            .get_or_create(&TypeLabels {
                cluster_type: "local",
            })
            .set(1);
    }
}

/// Where remote clusters are registered.
#[derive(Clone)]
pub enum Sources {
    /// Secrets labelled `istio/multiCluster=true` in this namespace of the config cluster.
    Secrets {
        client: kube::Client,
        namespace: String,
    },
    /// Kubeconfig files under this directory (istiod's `PILOT_MULTICLUSTER_KUBECONFIG_PATH`).
    Directory(std::path::PathBuf),
}

impl Sources {
    /// Starts reading the registrations, each told to `events`.
    fn follow(self, events: mpsc::Sender<SourceEvent>) -> source::Follow {
        match self {
            Sources::Secrets { client, namespace } => source::secrets(client, &namespace, events),
            Sources::Directory(root) => source::directory(root, events),
        }
    }
}

/// The running controller of remote clusters; stops them all when dropped (what they wrote
/// stays: a replica that stops leading leaves it to the next).
pub struct RemoteClusters {
    status: watch::Receiver<RemoteStatus>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RemoteClusters {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RemoteClusters {
    /// Starts reading `sources` and syncing the clusters they register into `target`.
    pub fn start<T: Target + Clone>(
        sources: Sources,
        settings: RemoteSettings,
        target: T,
        metrics: Arc<RemoteMetrics>,
    ) -> RemoteClusters {
        let (status_tx, status) = watch::channel(RemoteStatus::default());
        let (events_tx, events) = mpsc::channel(64);
        let follow = sources.follow(events_tx);
        let controller = Controller {
            settings,
            target,
            metrics,
            status: status_tx,
            clusters: BTreeMap::new(),
            origins: BTreeMap::new(),
            changed: Arc::new(Notify::new()),
            sources_synced: false,
            source_problem: None,
        };
        let task = tokio::spawn(controller.run(follow, events));
        RemoteClusters { status, task }
    }

    /// Follows the remote clusters' states.
    pub fn status(&self) -> watch::Receiver<RemoteStatus> {
        self.status.clone()
    }
}

/// A syncer of a cluster, and a task that tells the controller when its status changes.
struct Running {
    syncer: Syncer,
    status: watch::Receiver<SyncStatus>,
    tell: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.tell.abort();
    }
}

impl Running {
    fn new(syncer: Syncer, changed: Arc<Notify>) -> Running {
        let status = syncer.status();
        let mut watched = syncer.status();
        let tell = tokio::spawn(async move {
            while watched.changed().await.is_ok() {
                changed.notify_one();
            }
        });
        Running {
            syncer,
            status,
            tell,
        }
    }
}

/// One registered remote cluster.
struct Remote {
    origin: Origin,
    kubeconfig: String,
    /// When its syncer started: the timeout counts from then.
    started: Instant,
    /// Its syncer, or why its kubeconfig gives none.
    current: Result<Running, String>,
    /// A new kubeconfig being tried, held until it has listed the cluster.
    pending: Option<(String, Result<Running, String>)>,
    timed_out: bool,
}

struct Controller<T> {
    settings: RemoteSettings,
    target: T,
    metrics: Arc<RemoteMetrics>,
    status: watch::Sender<RemoteStatus>,
    clusters: BTreeMap<String, Remote>,
    /// The clusters each origin registered (and PCP accepted).
    origins: BTreeMap<Origin, BTreeSet<String>>,
    /// Woken when any syncer's status changes.
    changed: Arc<Notify>,
    sources_synced: bool,
    source_problem: Option<String>,
}

impl<T: Target + Clone> Controller<T> {
    async fn run(mut self, _follow: source::Follow, mut events: mpsc::Receiver<SourceEvent>) {
        let own = self.settings.sync.cluster_id.clone();
        tracing::info!(cluster = %own, "reading remote cluster registrations");
        loop {
            let deadline = self.next_deadline();
            let timeout = async move {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let changed = self.changed.clone();
            tokio::select! {
                event = events.recv() => match event {
                    None => return,
                    Some(SourceEvent::Update(update)) => self.update(update).await,
                    Some(SourceEvent::Synced) => {
                        self.sources_synced = true;
                        self.delete_unregistered().await;
                    }
                    Some(SourceEvent::Recovered) => {
                        tracing::info!("the remote cluster registrations are read again");
                        self.source_problem = None;
                    }
                    Some(SourceEvent::Failed(problem)) => {
                        if self.source_problem.as_ref() != Some(&problem) {
                            tracing::warn!("{problem}");
                        }
                        self.source_problem = Some(problem);
                    }
                },
                () = changed.notified() => self.swap_synced(),
                () = timeout => self.time_out(),
            }
            self.publish();
        }
    }

    /// The earliest moment a syncing cluster times out.
    fn next_deadline(&self) -> Option<Instant> {
        if self.settings.timeout.is_zero() {
            return None;
        }
        self.clusters
            .values()
            .filter(|r| !r.timed_out)
            .filter(|r| matches!(&r.current, Ok(run) if !run.status.borrow().synced))
            .map(|r| r.started + self.settings.timeout)
            .min()
    }

    /// Marks the clusters whose first sync outlasted the timeout, once each.
    fn time_out(&mut self) {
        let now = Instant::now();
        for (id, remote) in &mut self.clusters {
            let Ok(run) = &remote.current else { continue };
            let status = run.status.borrow();
            if remote.timed_out || status.synced || now < remote.started + self.settings.timeout {
                continue;
            }
            remote.timed_out = true;
            self.metrics
                .timeouts
                .get_or_create(&ClusterLabels {
                    cluster: id.clone(),
                })
                .inc();
            tracing::error!(cluster = %id, source = %remote.origin, waiting = %status.waiting_for(),
                "remote cluster {id} did not sync within {:?}: PCP is ready without it, and \
                 syncs it when it can", self.settings.timeout);
        }
    }

    /// What an origin registers now.
    async fn update(&mut self, update: Update) {
        let Update { origin, clusters } = update;
        let before = self.origins.remove(&origin).unwrap_or_default();
        let now = clusters.unwrap_or_default();
        for id in before.iter().filter(|id| !now.contains_key(*id)) {
            self.remove(id).await;
        }
        let own = self.settings.sync.cluster_id.clone();
        let mut accepted = BTreeSet::new();
        for (id, kubeconfig) in now {
            if id == own {
                tracing::warn!(cluster = %id, source = %origin,
                    "{origin} registers cluster {id}, which is PCP's own cluster (--cluster-id): \
                     refused");
                continue;
            }
            if let Some(other) = self.clusters.get(&id).filter(|r| r.origin != origin) {
                tracing::warn!(cluster = %id, source = %origin, registered_by = %other.origin,
                    "{origin} registers cluster {id}, which {} registered first: refused (the \
                     first registration stays)", other.origin);
                continue;
            }
            accepted.insert(id.clone());
            self.register(&id, &origin, kubeconfig).await;
        }
        if !accepted.is_empty() {
            self.origins.insert(origin, accepted);
        }
    }

    /// Starts syncing cluster `id` with `kubeconfig`, or moves it to a changed one.
    async fn register(&mut self, id: &str, origin: &Origin, kubeconfig: String) {
        let changed = self.changed.clone();
        match self.clusters.get_mut(id) {
            Some(remote) if remote.kubeconfig == kubeconfig => {
                // Unchanged (a pending one with it is dropped: the current one stays).
                remote.pending = None;
            }
            Some(remote)
                if remote
                    .pending
                    .as_ref()
                    .is_some_and(|(k, _)| *k == kubeconfig) => {}
            Some(remote) if matches!(&remote.current, Ok(run) if run.status.borrow().synced) => {
                tracing::info!(cluster = %id, source = %origin,
                    "the kubeconfig of cluster {id} changed: syncing with the new one, which \
                     replaces the old once it has listed the cluster");
                let started = start(id, &kubeconfig, &self.settings, &self.target, true).await;
                let running = started.map(|syncer| Running::new(syncer, changed));
                if let Err(e) = &running {
                    tracing::warn!(cluster = %id, source = %origin, error = %e,
                        "the new kubeconfig of cluster {id} gives no client; the old one stays");
                }
                remote.pending = Some((kubeconfig, running));
            }
            before => {
                // New, or never synced with what it had: nothing worth keeping. A cluster that
                // already timed out stays timed out (readiness does not wait for it again).
                let (started_at, timed_out) =
                    before.map_or((Instant::now(), false), |r| (r.started, r.timed_out));
                let started = start(id, &kubeconfig, &self.settings, &self.target, false).await;
                let current = started.map(|syncer| Running::new(syncer, changed));
                match &current {
                    Ok(_) => tracing::info!(cluster = %id, source = %origin,
                        "remote cluster {id} registered: syncing it"),
                    Err(e) => tracing::error!(cluster = %id, source = %origin, error = %e,
                        "remote cluster {id}: its kubeconfig gives no client"),
                }
                self.clusters.insert(
                    id.to_string(),
                    Remote {
                        origin: origin.clone(),
                        kubeconfig,
                        started: started_at,
                        current,
                        pending: None,
                        timed_out,
                    },
                );
            }
        }
    }

    /// Swaps in each new kubeconfig's syncer that has listed its cluster.
    fn swap_synced(&mut self) {
        for (id, remote) in &mut self.clusters {
            let listed =
                matches!(&remote.pending, Some((_, Ok(run))) if run.status.borrow().listed);
            if !listed {
                continue;
            }
            let Some((kubeconfig, Ok(next))) = remote.pending.take() else {
                continue;
            };
            // The old one stops before the new one writes: one writer per cluster.
            remote.current = Ok(next);
            remote.kubeconfig = kubeconfig;
            if let Ok(run) = &remote.current {
                run.syncer.release();
            }
            tracing::info!(cluster = %id, source = %remote.origin,
                "cluster {id} now syncs with its new kubeconfig");
        }
    }

    /// Stops syncing cluster `id` and deletes what it wrote.
    async fn remove(&mut self, id: &str) {
        let Some(remote) = self.clusters.remove(id) else {
            return;
        };
        drop(remote.current);
        drop(remote.pending);
        tracing::info!(cluster = %id, source = %remote.origin,
            "remote cluster {id} is no longer registered: deleting what PCP wrote of it");
        self.delete_written(id, false).await;
    }

    /// Deletes what the store holds of cluster `id` (retried while the store cannot be
    /// reached). `remote_named_only`: only objects with the names a remote cluster's syncer
    /// gives (what is deleted of clusters no source registers, which may be another PCP's own).
    async fn delete_written(&self, id: &str, remote_named_only: bool) {
        let names = ClusterNames::remote(id);
        let mut backoff = Backoff::new(
            Duration::from_millis(200),
            Duration::from_secs(30),
            Duration::ZERO,
        );
        loop {
            let mut failed = None;
            match self.target.owned(id).await {
                Ok(docs) => {
                    for doc in docs {
                        let Some(key) = store_key(&doc) else { continue };
                        if remote_named_only && names.source(&key).is_none() {
                            continue;
                        }
                        if let Err(e) = self.target.delete(&key).await {
                            failed = Some(e.to_string());
                        }
                    }
                }
                Err(e) => failed = Some(e.to_string()),
            }
            let Some(error) = failed else { return };
            let wait = backoff.failed();
            tracing::warn!(cluster = %id, error = %error, retry_in = ?wait,
                "cannot delete what PCP wrote of a remote cluster no longer registered");
            tokio::time::sleep(wait).await;
        }
    }

    /// Once every source has been read: deletes what the store holds of remote clusters no
    /// source registers (their Secret was removed while PCP was away).
    async fn delete_unregistered(&mut self) {
        let own = &self.settings.sync.cluster_id;
        let stored = match self.target.clusters().await {
            Ok(stored) => stored,
            Err(e) => {
                tracing::warn!(error = %e,
                    "cannot list the clusters the store holds objects of: what remote clusters \
                     removed while PCP was away wrote stays until PCP starts again");
                return;
            }
        };
        for id in stored {
            if id == *own || self.clusters.contains_key(&id) {
                continue;
            }
            tracing::info!(cluster = %id,
                "no Secret or file registers cluster {id} any more: deleting what PCP wrote of it");
            self.delete_written(&id, true).await;
        }
    }

    fn publish(&mut self) {
        let mut status = RemoteStatus {
            sources_synced: self.sources_synced,
            source_problem: self.source_problem.clone(),
            clusters: BTreeMap::new(),
        };
        for (id, remote) in &self.clusters {
            let (state, detail) = match &remote.current {
                Err(e) => (SyncState::Failed, e.clone()),
                Ok(run) => {
                    let s = run.status.borrow();
                    let waiting = s.waiting_for();
                    let detail = if waiting.is_empty() {
                        "comparing the cluster with the store".to_string()
                    } else {
                        format!("waiting for {waiting}")
                    };
                    match (s.synced, remote.timed_out) {
                        (true, _) => (SyncState::Synced, String::new()),
                        (false, true) => (
                            SyncState::Timeout,
                            format!("not synced within {:?}; {detail}", self.settings.timeout),
                        ),
                        (false, false) => (SyncState::Syncing, detail),
                    }
                }
            };
            let replacing = match &remote.pending {
                None => String::new(),
                Some((_, Err(e))) => format!("a new kubeconfig gives no client: {e}"),
                Some((_, Ok(run))) => {
                    let waiting = run.status.borrow().waiting_for();
                    format!("a new kubeconfig is listing the cluster: waiting for {waiting}")
                }
            };
            status.clusters.insert(
                id.clone(),
                ClusterStatus {
                    id: id.clone(),
                    source: remote.origin.to_string(),
                    state,
                    detail,
                    replacing,
                },
            );
        }
        self.metrics.show(&status);
        self.status.send_if_modified(|s| {
            let changed = *s != status;
            *s = status;
            changed
        });
    }
}

/// A syncer of remote cluster `id` by `kubeconfig`, held when it replaces another.
async fn start<T: Target + Clone>(
    id: &str,
    kubeconfig: &str,
    settings: &RemoteSettings,
    target: &T,
    held: bool,
) -> Result<Syncer, String> {
    if let Some(problem) = label_value_problem(id) {
        return Err(format!(
            "the cluster ID {id:?} cannot label what PCP writes of it ({problem}): register it \
             under another ID"
        ));
    }
    let cluster = crate::connect::with_remote_kubeconfig(kubeconfig)
        .await
        .map_err(|e| e.to_string())?;
    let mut config = settings.sync.clone();
    config.cluster_id = id.to_string();
    config.reads = Reads::Registry;
    config.remote = true;
    config.api_server = cluster.server;
    // Each remote cluster's syncer has metrics of its own (their write counts are not
    // registered: the per-cluster state is in the remote clusters' metrics).
    let metrics = Arc::new(SyncMetrics::default());
    Ok(if held {
        Syncer::start_held(cluster.client, config, target.clone(), metrics)
    } else {
        Syncer::start(cluster.client, config, target.clone(), metrics)
    })
}

/// Why `id` is not a Kubernetes label value (what the `pasa.io/cluster` label takes), if it is
/// not: at most 63 characters, letters, digits, `-`, `_` and `.`, beginning and ending with a
/// letter or digit. A cluster named by a kubeconfig file (an EKS cluster's ARN) may well not be.
fn label_value_problem(id: &str) -> Option<&'static str> {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if id.len() > 63 {
        Some("a label value has at most 63 characters")
    } else if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        Some("a label value has only letters, digits, '-', '_' and '.'")
    } else if !edge(id.chars().next()) || !edge(id.chars().last()) {
        Some("a label value begins and ends with a letter or digit")
    } else {
        None
    }
}

/// The store key of a stored document.
fn store_key(doc: &Value) -> Option<StoreKey> {
    let kind = pasa_proto::Kind::from_kind_field(doc["kind"].as_str()?)?;
    Some(StoreKey {
        kind,
        namespace: doc["metadata"]["namespace"].as_str()?.to_string(),
        name: doc["metadata"]["name"].as_str()?.to_string(),
    })
}
