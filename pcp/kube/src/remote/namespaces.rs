//! The namespaces of the remote clusters, for the injecting webhook. A remote cluster's pods are
//! injected by PCP on Istio's path `/inject/cluster/<id>/…`, and the `pasa.io/injection` label
//! of their namespace decides there as it does in PCP's own cluster. Every PCP replica serves
//! the webhook, while only the Lease holder syncs the remotes, so each replica follows the
//! registrations itself (the same Secrets or directory) and, for each registered cluster, its
//! namespaces alone, as the reader its kubeconfig names (which may list namespaces).
//!
//! A key equal to PCP's own cluster ID is not followed, and an ID two origins register is
//! followed by the first one's kubeconfig, as the remote-cluster controller keeps the first.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::Sources;
use super::source::{Origin, SourceEvent};
use crate::namespaces::Namespaces;

/// Why a remote namespace's labels are not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unknown {
    #[error("cluster {0} is not registered with PCP (no remote Secret names it)")]
    Cluster(String),
    #[error("cluster {cluster} cannot be read: {why}")]
    Unreadable { cluster: String, why: String },
    #[error("namespace {namespace} is not (yet) seen in cluster {cluster}")]
    Namespace { cluster: String, namespace: String },
}

/// Each registered remote cluster's namespaces, followed until dropped.
pub struct RemoteNamespaces {
    clusters: Arc<Mutex<BTreeMap<String, Followed>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RemoteNamespaces {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One cluster's namespaces, as its kubeconfig reads them (or why it cannot).
struct Followed {
    kubeconfig: String,
    namespaces: Result<Namespaces, String>,
}

impl RemoteNamespaces {
    /// Follows the clusters `sources` register, but `own` (PCP's own cluster ID).
    pub fn follow(sources: Sources, own: &str) -> RemoteNamespaces {
        let clusters: Arc<Mutex<BTreeMap<String, Followed>>> = Arc::default();
        let (events_tx, mut events) = mpsc::channel(64);
        let follow = sources.follow(events_tx);
        let (held, own) = (clusters.clone(), own.to_string());
        let task = tokio::spawn(async move {
            let _follow = follow;
            let mut origins: BTreeMap<Origin, BTreeMap<String, String>> = BTreeMap::new();
            while let Some(event) = events.recv().await {
                let SourceEvent::Update(update) = event else {
                    continue;
                };
                match update.clusters {
                    Some(clusters) => origins.insert(update.origin, clusters),
                    None => origins.remove(&update.origin),
                };
                follow_registered(&origins, &own, &held).await;
            }
        });
        RemoteNamespaces { clusters, task }
    }

    /// The labels of namespace `namespace` of remote cluster `cluster`, or why they are not
    /// known.
    pub fn labels(
        &self,
        cluster: &str,
        namespace: &str,
    ) -> Result<BTreeMap<String, String>, Unknown> {
        let clusters = self.clusters.lock().unwrap_or_else(|e| e.into_inner());
        let followed = clusters
            .get(cluster)
            .ok_or_else(|| Unknown::Cluster(cluster.to_string()))?;
        let namespaces = followed
            .namespaces
            .as_ref()
            .map_err(|why| Unknown::Unreadable {
                cluster: cluster.to_string(),
                why: why.clone(),
            })?;
        namespaces
            .labels(namespace)
            .ok_or_else(|| Unknown::Namespace {
                cluster: cluster.to_string(),
                namespace: namespace.to_string(),
            })
    }
}

/// Follows the namespaces of every cluster `origins` register now (the first origin's
/// kubeconfig for an ID several register), and stops following the others.
async fn follow_registered(
    origins: &BTreeMap<Origin, BTreeMap<String, String>>,
    own: &str,
    held: &Mutex<BTreeMap<String, Followed>>,
) {
    let mut wanted: BTreeMap<&str, &str> = BTreeMap::new();
    for clusters in origins.values() {
        for (id, kubeconfig) in clusters {
            if id != own {
                wanted.entry(id).or_insert(kubeconfig);
            }
        }
    }
    let current: BTreeMap<String, String> = {
        let mut clusters = held.lock().unwrap_or_else(|e| e.into_inner());
        clusters.retain(|id, _| wanted.contains_key(id.as_str()));
        clusters
            .iter()
            .map(|(id, f)| (id.clone(), f.kubeconfig.clone()))
            .collect()
    };
    for (id, kubeconfig) in wanted {
        if current.get(id).map(String::as_str) == Some(kubeconfig) {
            continue;
        }
        let namespaces = match crate::connect::with_remote_kubeconfig(kubeconfig).await {
            Ok(cluster) => Ok(Namespaces::follow(cluster.client)),
            Err(e) => {
                tracing::warn!(cluster = %id, error = %e,
                    "cannot follow the remote cluster's namespaces for injection");
                Err(e.to_string())
            }
        };
        held.lock().unwrap_or_else(|e| e.into_inner()).insert(
            id.to_string(),
            Followed {
                kubeconfig: kubeconfig.to_string(),
                namespaces,
            },
        );
    }
}
