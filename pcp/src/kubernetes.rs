//! PCP in a Kubernetes cluster: the syncer (`pasa-kube`) writing what the API server stored
//! into the store through PCP's own validating write path, run by the one replica that holds
//! the syncer's Lease (the others stand by and take over). That replica also syncs the remote
//! clusters registered by Secrets in PCP's namespace, or by the files of
//! `--multicluster-kubeconfig-dir` (`pasa_kube::remote`); readiness waits for each at most
//! `--remote-cluster-timeout`, and every replica shows their state (`/debug/clusterz`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pasa_kube::connect::Cluster;
use pasa_kube::convert::{CLUSTER_LABEL, StoreKey};
use pasa_kube::lease::{Elector, LeaseState, LeaseTiming};
use pasa_kube::metrics::SyncMetrics;
use pasa_kube::remote::{RemoteClusters, RemoteMetrics, RemoteSettings, RemoteStatus, Sources};
use pasa_kube::selectors::DiscoverySelectors;
use pasa_kube::syncer::{Reads, SyncConfig, SyncStatus, Syncer, Target, WriteError};
use pasa_proto::store::v1::{ApplyDocument, ApplyRequest, ListRequest, Rule, Subscription};
use pasa_runtime::admin::Readiness;
use serde_json::Value;
use tokio::sync::watch;

use crate::metrics::Origin;
use crate::write::WriteService;

/// How PCP reaches a Kubernetes cluster to sync it. Without `--kubeconfig` or `--in-cluster`
/// nothing is synced.
#[derive(clap::Args, Debug, Clone)]
pub struct KubeArgs {
    /// Sync the cluster of this kubeconfig file's current context (Istio config, Services,
    /// EndpointSlices, Pods, Nodes, Namespaces) into the store.
    #[arg(long, env = "PASA_KUBECONFIG", conflicts_with = "in_cluster")]
    pub kubeconfig: Option<PathBuf>,
    /// Sync the cluster PCP runs in, with its pod's service account.
    #[arg(long)]
    pub in_cluster: bool,
    /// The cluster's ID (istiod's CLUSTER_ID): the `pasa.io/cluster` label on what the syncer
    /// writes, which is how it knows what it owns. A remote cluster registered under this ID is
    /// refused (it would be this one).
    #[arg(long, env = "PASA_CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,
    /// Istio's mesh config (YAML, the `mesh` key of the `istio` ConfigMap): published into the
    /// store for the agents (as `MeshConfig` `mesh` of the root namespace, again when the file
    /// changes); its `discoverySelectors` limit the namespaces synced, as istiod's do.
    #[arg(long, env = "PASA_MESH_CONFIG")]
    pub mesh_config: Option<PathBuf>,
    /// Where the Gateways generated from Kubernetes Ingresses go: the namespace of the ingress
    /// gateway they select (istiod's `K8S_INGRESS_NS`).
    #[arg(long, env = "K8S_INGRESS_NS", default_value = "istio-system")]
    pub ingress_namespace: String,
    /// Also read the Gateway API's experimental kinds (XBackend, XBackendTrafficPolicy), as
    /// istiod does with `PILOT_ENABLE_ALPHA_GATEWAY_API`.
    #[arg(long, env = "PILOT_ENABLE_ALPHA_GATEWAY_API")]
    pub gateway_api_alpha: bool,
    /// Route to InferencePools (the Gateway API inference extension), as istiod does with
    /// `ENABLE_GATEWAY_API_INFERENCE_EXTENSION`: to the Service istiod makes for each pool.
    #[arg(long, env = "ENABLE_GATEWAY_API_INFERENCE_EXTENSION")]
    pub gateway_api_inference: bool,
    /// Write endpoints that are not ready (and not terminating), which proxies get as
    /// UNHEALTHY: they take no traffic but are counted, as istiod sends them by default
    /// (`PILOT_AUTO_SEND_UNHEALTHY_ENDPOINTS`). `false` leaves them out; agents older than
    /// the `ready` field of endpoints need that (see docs/kubernetes.md).
    #[arg(
        long,
        env = "PILOT_AUTO_SEND_UNHEALTHY_ENDPOINTS",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub send_unhealthy_endpoints: bool,
    /// Namespace of the Lease the PCP replicas elect the syncing one by.
    #[arg(long, env = "POD_NAMESPACE", default_value = "pasa-system")]
    pub lease_namespace: String,
    /// Name of that Lease.
    #[arg(long, default_value = "pasa-pcp-syncer")]
    pub lease_name: String,
    /// This replica's name in the Lease (default: the host name and process ID).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Read remote clusters' kubeconfigs from the files of this directory (`*.yaml`, `*.yml`,
    /// subdirectories too; each file's cluster ID is its current context's cluster), instead
    /// of from the Secrets labelled `istio/multiCluster=true` in PCP's namespace
    /// (--lease-namespace), as istiod with `PILOT_MULTICLUSTER_KUBECONFIG_PATH`.
    #[arg(long, env = "PILOT_MULTICLUSTER_KUBECONFIG_PATH")]
    pub multicluster_kubeconfig_dir: Option<PathBuf>,
    /// How long readiness waits for a remote cluster's first sync before PCP is ready without
    /// it (istiod's `PILOT_REMOTE_CLUSTER_TIMEOUT`); `0s` waits for ever.
    #[arg(long, env = "PILOT_REMOTE_CLUSTER_TIMEOUT", default_value = "30s",
          value_parser = pasa_proto::duration::parse)]
    pub remote_cluster_timeout: Duration,
}

/// The clusters PCP syncs, as its status shows them (`/debug/clusterz`): its own, and the
/// remote ones while this replica leads (a standby knows only that it stands by).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClustersView {
    /// PCP's own cluster's ID; empty without a cluster.
    pub own: String,
    /// Its state: `synced`, or `syncing`, with what it waits for.
    pub own_synced: bool,
    pub own_detail: String,
    /// Whether this replica leads (syncs); a standby shows no remote cluster.
    pub leading: bool,
    pub remote: RemoteStatus,
}

/// What the syncer is started with, besides its flags.
pub struct SyncerParts<'a> {
    /// The cluster, and how it was reached (for the ready line).
    pub cluster: Cluster,
    pub source: String,
    /// PCP's validating write path, where the syncer writes.
    pub service: WriteService,
    pub metrics: Arc<SyncMetrics>,
    /// PCP's readiness, whose part `syncer` this reports.
    pub readiness: Readiness,
    /// `--mesh-config`, as read at start.
    pub mesh: Option<&'a Value>,
    pub domain_suffix: &'a str,
    /// The mesh's root (system) namespace: its `topology.istio.io/network` label in each
    /// cluster is that cluster's network.
    pub system_namespace: &'a str,
    /// The remote clusters' metrics.
    pub remote_metrics: Arc<RemoteMetrics>,
    /// Where the clusters' states are shown.
    pub clusters: watch::Sender<ClustersView>,
}

impl KubeArgs {
    pub fn enabled(&self) -> bool {
        self.kubeconfig.is_some() || self.in_cluster
    }

    /// A client of the cluster, and how it was reached (for the ready line).
    pub async fn client(&self) -> anyhow::Result<(Cluster, String)> {
        Ok(match &self.kubeconfig {
            Some(path) => (
                pasa_kube::connect::with_kubeconfig(path).await?,
                format!("kubeconfig {}", path.display()),
            ),
            None => (pasa_kube::connect::in_cluster()?, "in-cluster".to_string()),
        })
    }

    /// Starts competing for the Lease; the replica holding it syncs the cluster until `stop`
    /// turns true (then it stops syncing and gives the Lease up). Reports the part `syncer` of
    /// the readiness: the leader is ready once its first complete sync is done, a standby once it
    /// knows who leads.
    /// Where remote clusters are registered: `--multicluster-kubeconfig-dir`, else the Secrets
    /// labelled `istio/multiCluster=true` in PCP's namespace of its own cluster.
    pub fn remote_sources(&self, client: &pasa_kube::Client) -> Sources {
        match &self.multicluster_kubeconfig_dir {
            Some(dir) => Sources::Directory(dir.clone()),
            None => Sources::Secrets {
                client: client.clone(),
                namespace: self.lease_namespace.clone(),
            },
        }
    }

    pub fn start(
        &self,
        with: SyncerParts<'_>,
        stop: watch::Receiver<bool>,
    ) -> anyhow::Result<tokio::task::JoinHandle<()>> {
        let SyncerParts {
            cluster:
                Cluster {
                    client,
                    server: api_server,
                },
            source,
            service,
            metrics,
            readiness,
            mesh,
            domain_suffix,
            system_namespace,
            remote_metrics,
            clusters,
        } = with;
        let discovery = match (&self.mesh_config, mesh) {
            (Some(path), Some(mesh)) => DiscoverySelectors::from_mesh_config(mesh)
                .map_err(|e| anyhow::anyhow!("--mesh-config {}: {e}", path.display()))?,
            _ => DiscoverySelectors::all(),
        };
        let mut ingress = pasa_kube::ingress::Settings::from_mesh(
            mesh.and_then(Value::as_object)
                .unwrap_or(&serde_json::Map::new()),
            &self.ingress_namespace,
        );
        ingress.domain_suffix = domain_suffix.to_string();
        let identity = self.identity.clone().unwrap_or_else(default_identity);
        let gateway_api = pasa_kube::gateway_api::Settings {
            domain_suffix: domain_suffix.to_string(),
            alpha: self.gateway_api_alpha,
            inference: self.gateway_api_inference,
            ..Default::default()
        };
        let mesh_networks = match (&self.mesh_config, mesh.and_then(|m| m.get("meshNetworks"))) {
            (Some(path), Some(networks)) => {
                Some(serde_json::from_value(networks.clone()).map_err(|e| {
                    anyhow::anyhow!("--mesh-config {}: meshNetworks: {e}", path.display())
                })?)
            }
            _ => None,
        };
        let config = SyncConfig {
            cluster_id: self.cluster_id.clone(),
            discovery,
            ingress,
            gateway_api,
            send_unhealthy_endpoints: self.send_unhealthy_endpoints,
            api_server: api_server.clone(),
            reads: Reads::Everything,
            remote: false,
            system_namespace: system_namespace.to_string(),
            mesh_networks,
        };
        let remote_settings = RemoteSettings {
            sync: config.clone(),
            timeout: self.remote_cluster_timeout,
        };
        let sources = self.remote_sources(&client);
        clusters.send_modify(|v| v.own = config.cluster_id.clone());
        let lease = format!("{}/{}", self.lease_namespace, self.lease_name);
        let candidate = Elector::new(
            client.clone(),
            &self.lease_namespace,
            &self.lease_name,
            &identity,
            LeaseTiming::default(),
        )
        .with_server(&api_server)
        .start();
        println!(
            "pasa-pcp syncing Kubernetes cluster {} ({source}) when holding lease {}/{} as {identity}",
            self.cluster_id, self.lease_namespace, self.lease_name
        );
        readiness.report(
            "syncer",
            false,
            format!("joining the election on Lease {lease}"),
        );
        readiness.report(
            "remote-clusters",
            false,
            "synced by the replica that leads, once known",
        );
        Ok(tokio::spawn(async move {
            let mut lease_state = candidate.state();
            let mut stopping = std::pin::pin!(pasa_runtime::drain::stopped(stop));
            let mut syncer: Option<(Syncer, watch::Receiver<SyncStatus>)> = None;
            let mut remotes: Option<(RemoteClusters, watch::Receiver<RemoteStatus>)> = None;
            let mut told_remotes = RemoteStatus::default();
            // Once ready in a term of leadership, remote clusters registered later do not make
            // PCP unready while they sync (their state is still shown), as istiod's readiness
            // waits for remote clusters once, at start.
            let mut remotes_were_ready = false;
            loop {
                let sync_changed = async {
                    match syncer.as_mut() {
                        Some((_, status)) => status.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                };
                let remotes_changed = async {
                    match remotes.as_mut() {
                        Some((_, status)) => status.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = &mut stopping => break,
                    changed = lease_state.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let lead = lease_state.borrow_and_update().leading;
                        metrics.leader.set(i64::from(lead));
                        syncer = match (lead, syncer.take()) {
                            (true, None) => {
                                tracing::info!(cluster = %config.cluster_id, "leading: syncing the cluster");
                                let s = Syncer::start(client.clone(), config.clone(), service.clone(), metrics.clone());
                                let status = s.status();
                                Some((s, status))
                            }
                            (false, Some(_)) => {
                                metrics.synced.set(0);
                                metrics.waiting.clear();
                                tracing::info!(cluster = %config.cluster_id, "no longer leading: sync stopped");
                                None
                            }
                            (_, running) => running,
                        };
                        remotes = match (lead, remotes.take()) {
                            (true, None) => {
                                remotes_were_ready = false;
                                let r = RemoteClusters::start(sources.clone(), remote_settings.clone(), service.clone(), remote_metrics.clone());
                                let status = r.status();
                                Some((r, status))
                            }
                            (false, Some(_)) => {
                                remote_metrics.sync_status.clear();
                                None
                            }
                            (_, running) => running,
                        };
                    }
                    alive = sync_changed => {
                        if !alive {
                            syncer = None;
                        }
                    }
                    alive = remotes_changed => {
                        if !alive {
                            remotes = None;
                        }
                    }
                }
                let sync = syncer.as_ref().map(|(_, status)| status.borrow().clone());
                let leading = lease_state.borrow().leading;
                let (ready, detail) =
                    syncer_readiness(&lease_state.borrow(), sync.as_ref(), &lease, &api_server);
                clusters.send_modify(|v| {
                    v.leading = leading;
                    v.own_synced = sync.as_ref().is_some_and(|s| s.synced);
                    v.own_detail = detail.clone();
                });
                readiness.report("syncer", ready, detail);
                let remote = remotes.as_ref().map(|(_, status)| status.borrow().clone());
                let (ready, detail) = remote_readiness(leading, remote.as_ref());
                remotes_were_ready |= ready && remote.is_some();
                let ready = ready || remotes_were_ready;
                if let Some(now) = &remote {
                    tell_remote_changes(&told_remotes, now);
                    told_remotes = now.clone();
                }
                clusters.send_modify(|v| v.remote = remote.unwrap_or_default());
                readiness.report("remote-clusters", ready, detail);
            }
            drop(syncer);
            drop(remotes);
            clusters.send_modify(|v| {
                v.leading = false;
                v.remote = RemoteStatus::default();
            });
            metrics.leader.set(0);
            metrics.synced.set(0);
            readiness.report("syncer", false, "stopped");
            // Give the Lease up, so that a standby takes over at once; bounded, as shutdown is.
            let _ = tokio::time::timeout(Duration::from_secs(5), candidate.resign()).await;
        }))
    }
}

/// What the syncer part of readiness says, for a replica in `lease` state (and, leading, its
/// syncer's status): the leader is ready once its first complete sync is done; a standby is
/// ready once it reads the Lease and knows who leads; one that cannot take part in the
/// election is not ready, and says why.
fn syncer_readiness(
    lease: &LeaseState,
    sync: Option<&SyncStatus>,
    name: &str,
    api_server: &str,
) -> (bool, String) {
    match (lease.leading, sync, &lease.problem) {
        (true, Some(s), _) if s.synced => (
            true,
            format!("leading (Lease {name}); synced with the API server at {api_server}"),
        ),
        (true, Some(s), _) => {
            let waiting = s.waiting_for();
            let detail = if waiting.is_empty() {
                "comparing the cluster with the store".to_string()
            } else {
                format!("waiting for {waiting}")
            };
            (
                false,
                format!("leading (Lease {name}); first sync not done: {detail}"),
            )
        }
        (true, None, _) => (false, format!("leading (Lease {name}); starting to sync")),
        (false, _, Some(problem)) => (false, problem.clone()),
        (false, _, None) => match &lease.holder {
            Some(holder) => (
                true,
                format!("standing by: Lease {name} is held by {holder}"),
            ),
            None if lease.tried => (false, format!("taking Lease {name}, which nobody holds")),
            None => (false, format!("joining the election on Lease {name}")),
        },
    }
}

/// What the remote clusters' part of readiness says: a standby is ready (the leader syncs
/// them); the leader once every source is read and every cluster is synced, timed out (named,
/// with what it waits for) or failed.
fn remote_readiness(leading: bool, remote: Option<&RemoteStatus>) -> (bool, String) {
    match (leading, remote) {
        (false, _) => (
            true,
            "standing by: the replica that leads syncs them".into(),
        ),
        (true, None) => (false, "starting".into()),
        (true, Some(status)) => (status.ready(), status.summary()),
    }
}

/// Logs each remote cluster whose state changed (a line per change, naming what a cluster not
/// synced waits for).
fn tell_remote_changes(before: &RemoteStatus, now: &RemoteStatus) {
    for (id, cluster) in &now.clusters {
        let old = before.clusters.get(id).map(|c| c.state);
        if old == Some(cluster.state) {
            continue;
        }
        tracing::info!(cluster = %id, source = %cluster.source, state = cluster.state.as_str(),
            detail = %cluster.detail, "remote cluster {id} is {}", cluster.state.as_str());
    }
    for id in before
        .clusters
        .keys()
        .filter(|id| !now.clusters.contains_key(*id))
    {
        tracing::info!(cluster = %id, "remote cluster {id} is no longer synced");
    }
}

/// This replica's name: the host name and process ID.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "pasa-pcp".to_string());
    format!("{host}_{}", std::process::id())
}

/// Everything the store holds (what each cluster's syncer owns is found by its label).
async fn everything(
    service: &WriteService,
) -> Result<Vec<pasa_proto::store::v1::Resource>, WriteError> {
    let request = ListRequest {
        selector: Some(Subscription {
            rules: vec![Rule::default()],
        }),
        revision: 0,
    };
    let list = service
        .upstream()
        .call(&request, |mut store, request| async move {
            store.list(request).await
        })
        .await
        .map_err(|s| WriteError::Unavailable(s.message().to_string()))?
        .into_inner();
    Ok(list.resources)
}

/// The syncer writes through the same admission as every other write (counted with origin
/// `Kubernetes`): an object the API server stored but istiod's validation refuses is not
/// written, and what was stored before stays.
impl Target for WriteService {
    async fn owned(&self, cluster: &str) -> Result<Vec<Value>, WriteError> {
        Ok(everything(self)
            .await?
            .iter()
            .filter(|r| r.labels.get(CLUSTER_LABEL).map(String::as_str) == Some(cluster))
            .map(pasa_proto::object::manifest)
            .collect())
    }

    async fn apply(
        &self,
        doc: Value,
        generated: bool,
        create_only: bool,
    ) -> Result<(), WriteError> {
        let origin = if generated {
            Origin::Generated
        } else {
            Origin::Kubernetes
        };
        let request = ApplyRequest {
            documents: vec![ApplyDocument {
                json: doc.to_string(),
                // 0: the store must hold no object of its name.
                expected_mod_revision: create_only.then_some(0),
            }],
            dry_run: false,
        };
        match self.admit_and_apply(request, origin).await {
            Ok(response) if response.errors.is_empty() => Ok(()),
            Ok(response) => {
                let errors: Vec<String> = response
                    .errors
                    .iter()
                    .map(|e| format!("{}: {}", e.field, e.message))
                    .collect();
                Err(WriteError::Refused(errors.join("; ")))
            }
            Err(status) => Err(refused_or_unavailable(&status)),
        }
    }

    async fn clusters(&self) -> Result<std::collections::BTreeSet<String>, WriteError> {
        Ok(everything(self)
            .await?
            .iter()
            .filter_map(|r| r.labels.get(CLUSTER_LABEL).cloned())
            .collect())
    }

    async fn delete(&self, key: &StoreKey) -> Result<(), WriteError> {
        let request = key.delete_request();
        let response = self
            .upstream()
            .call(&request, |mut store, request| async move {
                store.delete(request).await
            })
            .await
            .map_err(|s| refused_or_unavailable(&s))?
            .into_inner();
        match response.errors.first() {
            None => Ok(()),
            Some(e) => Err(WriteError::Refused(format!("{}: {}", e.field, e.message))),
        }
    }
}

fn refused_or_unavailable(status: &tonic::Status) -> WriteError {
    use tonic::Code;
    match status.code() {
        Code::InvalidArgument | Code::FailedPrecondition | Code::PermissionDenied => {
            WriteError::Refused(status.message().to_string())
        }
        _ => WriteError::Unavailable(status.message().to_string()),
    }
}
