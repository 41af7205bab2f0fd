//! The cluster's namespaces and their labels, followed with kube's watcher into a reflector: the
//! injecting webhook reads a namespace's `pasa.io/injection` label here (an admission request
//! does not carry it). A watch cut short resumes from its resource version; one the API server
//! has compacted away (410 Gone) is listed again, by kube's watcher.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;

/// The namespaces of one cluster, kept up to date until dropped.
pub struct Namespaces {
    store: Store<Namespace>,
    applied: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Namespaces {
    /// Starts following the namespaces `client` can list.
    pub fn follow(client: Client) -> Namespaces {
        let api: Api<Namespace> = Api::all(client);
        let (store, writer) = reflector::store();
        let (applied_tx, applied) = watch::channel(0u64);
        let events = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff();
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(_) => {
                        applied_tx.send_modify(|n| *n += 1);
                    }
                    // The watcher retries with backoff; a refused list is worth hearing of.
                    Err(e) => {
                        let problem = crate::problem::Problem::of_watch(&e);
                        tracing::warn!(error = %problem, "watching namespaces");
                    }
                }
            }
        });
        Namespaces {
            store,
            applied,
            task,
        }
    }

    /// Resolves once the first complete list is in.
    pub async fn ready(&self) -> anyhow::Result<()> {
        self.store
            .wait_until_ready()
            .await
            .map_err(|_| anyhow::anyhow!("the namespace watcher stopped before its first list"))
    }

    /// The labels of `name`; `None` for a namespace not (or no longer) in the cluster.
    pub fn labels(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.store
            .get(&ObjectRef::new(name))
            .map(|ns| ns.metadata.labels.clone().unwrap_or_default())
    }

    /// The namespaces' names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .store
            .state()
            .iter()
            .filter_map(|ns| ns.metadata.name.clone())
            .collect();
        names.sort();
        names
    }

    /// Counts the watch events applied; changes with each one (for readiness, not timing).
    pub fn applied(&self) -> watch::Receiver<u64> {
        self.applied.clone()
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        self.task.abort();
    }
}
