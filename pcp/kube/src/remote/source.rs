//! Where remote clusters are registered, as istiod registers them:
//!
//! - Secrets labelled `istio/multiCluster=true` in PCP's namespace of the config cluster
//!   ([`secrets`]): each data key is a cluster ID and its value a kubeconfig (a Secret may hold
//!   several), as `istioctl create-remote-secret` writes them.
//! - A directory of kubeconfig files ([`directory`], istiod's
//!   `PILOT_MULTICLUSTER_KUBECONFIG_PATH`): every regular file under it (subdirectories too)
//!   named `*.yaml` or `*.yml` is a kubeconfig, whose cluster ID is the cluster its current
//!   context names (else that of the first context, by name, that names one; else the first
//!   cluster by name). Empty files are skipped (one being written); when any file cannot be
//!   read or parsed, the directory's previous reading stays, as istiod keeps it. Read again
//!   every [`DIRECTORY_POLL`].
//!
//! Each source tells what each of its origins (a Secret, a file) registers, whole, on every
//! change ([`Update`]); the controller ([`super`]) works out what changed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::config::Kubeconfig;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::mpsc;

/// The label of Secrets that register remote clusters (istiod's).
pub const MULTICLUSTER_SECRET_LABEL: &str = "istio/multiCluster";

/// How often the kubeconfig directory is read again.
pub const DIRECTORY_POLL: Duration = Duration::from_secs(1);

/// Where a remote cluster's kubeconfig comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Origin {
    /// A Secret of the config cluster.
    Secret { namespace: String, name: String },
    /// A kubeconfig file.
    File(PathBuf),
}

impl std::fmt::Display for Origin {
    /// `namespace/name` for a Secret (as istiod names its source), the path for a file.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Secret { namespace, name } => write!(f, "{namespace}/{name}"),
            Origin::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// What an origin registers now: kubeconfigs (as text) by cluster ID; `None` when the origin
/// is gone (the Secret or file deleted, or the Secret no longer labelled).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub origin: Origin,
    pub clusters: Option<BTreeMap<String, String>>,
}

/// What a source says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceEvent {
    /// An origin's registrations.
    Update(Update),
    /// Every origin that existed when the source started has been told (the first list of
    /// Secrets, the first reading of the directory): what is registered is known.
    Synced,
    /// The source cannot be read now (retried); why.
    Failed(String),
    /// The source is read again after it failed.
    Recovered,
}

/// Follows the Secrets labelled `istio/multiCluster=true` in `namespace` of the config cluster.
/// A Secret's keys whose values are not UTF-8 are told as empty kubeconfigs (refused when
/// read). A list after a watch was cut short tells each Secret gone meanwhile.
pub fn secrets(client: Client, namespace: &str, events: mpsc::Sender<SourceEvent>) -> Follow {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let config = watcher::Config::default().labels(&format!("{MULTICLUSTER_SECRET_LABEL}=true"));
    let namespace = namespace.to_string();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher(api, config).default_backoff());
        // The Secrets told, and those listed so far by a list under way.
        let mut known: BTreeSet<String> = BTreeSet::new();
        let mut listing: BTreeSet<String> = BTreeSet::new();
        let mut synced = false;
        let mut failing = false;
        let origin = |name: &str| Origin::Secret {
            namespace: namespace.clone(),
            name: name.to_string(),
        };
        while let Some(event) = stream.next().await {
            if event.is_ok()
                && std::mem::take(&mut failing)
                && events.send(SourceEvent::Recovered).await.is_err()
            {
                return;
            }
            let sent = match event {
                Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => {
                    let name = s.name_any();
                    listing.insert(name.clone());
                    known.insert(name.clone());
                    events
                        .send(SourceEvent::Update(Update {
                            origin: origin(&name),
                            clusters: Some(kubeconfigs(&s)),
                        }))
                        .await
                }
                Ok(watcher::Event::Delete(s)) => {
                    let name = s.name_any();
                    known.remove(&name);
                    events
                        .send(SourceEvent::Update(Update {
                            origin: origin(&name),
                            clusters: None,
                        }))
                        .await
                }
                Ok(watcher::Event::Init) => {
                    listing.clear();
                    Ok(())
                }
                Ok(watcher::Event::InitDone) => {
                    let gone: Vec<String> = known.difference(&listing).cloned().collect();
                    let mut sent = Ok(());
                    for name in gone {
                        known.remove(&name);
                        let update = Update {
                            origin: origin(&name),
                            clusters: None,
                        };
                        sent = sent.and(events.send(SourceEvent::Update(update)).await);
                    }
                    if !synced {
                        synced = true;
                        sent = sent.and(events.send(SourceEvent::Synced).await);
                    }
                    sent
                }
                Err(e) => {
                    failing = true;
                    let problem = crate::problem::Problem::of_watch(&e);
                    events
                        .send(SourceEvent::Failed(format!(
                            "cannot read the Secrets labelled {MULTICLUSTER_SECRET_LABEL}=true: {problem}"
                        )))
                        .await
                }
            };
            if sent.is_err() {
                return;
            }
        }
    });
    Follow { task }
}

/// A Secret's data as kubeconfigs by cluster ID.
fn kubeconfigs(secret: &Secret) -> BTreeMap<String, String> {
    secret
        .data
        .iter()
        .flatten()
        .map(|(id, value)| {
            let text = String::from_utf8(value.0.clone()).unwrap_or_default();
            (id.clone(), text)
        })
        .collect()
}

/// Reads the kubeconfig files under `root` now and every [`DIRECTORY_POLL`]: each file an
/// origin registering one cluster (see the module's documentation).
pub fn directory(root: PathBuf, events: mpsc::Sender<SourceEvent>) -> Follow {
    let task = tokio::spawn(async move {
        let mut told: BTreeMap<PathBuf, (String, String)> = BTreeMap::new();
        let mut synced = false;
        let mut failing: Option<String> = None;
        loop {
            let at = root.clone();
            let read = tokio::task::spawn_blocking(move || read_directory(&at)).await;
            let read = read.unwrap_or_else(|e| Err(format!("reading stopped: {e}")));
            match read {
                Ok(now) => {
                    if failing.take().is_some()
                        && events.send(SourceEvent::Recovered).await.is_err()
                    {
                        return;
                    }
                    let mut updates = Vec::new();
                    for path in told.keys() {
                        if !now.contains_key(path) {
                            updates.push(Update {
                                origin: Origin::File(path.clone()),
                                clusters: None,
                            });
                        }
                    }
                    for (path, entry) in &now {
                        if told.get(path) != Some(entry) {
                            let (id, text) = entry.clone();
                            updates.push(Update {
                                origin: Origin::File(path.clone()),
                                clusters: Some([(id, text)].into()),
                            });
                        }
                    }
                    told = now;
                    for update in updates {
                        if events.send(SourceEvent::Update(update)).await.is_err() {
                            return;
                        }
                    }
                    if !synced {
                        synced = true;
                        if events.send(SourceEvent::Synced).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) if failing.as_ref() != Some(&e) => {
                    failing = Some(e.clone());
                    let message = format!(
                        "cannot read the kubeconfig directory {}: {e}; what was read before stays",
                        root.display()
                    );
                    if events.send(SourceEvent::Failed(message)).await.is_err() {
                        return;
                    }
                }
                Err(_) => {}
            }
            tokio::time::sleep(DIRECTORY_POLL).await;
        }
    });
    Follow { task }
}

/// Every kubeconfig under `root`: (cluster ID, text) by path; an error when any cannot be read.
fn read_directory(root: &Path) -> Result<BTreeMap<PathBuf, (String, String)>, String> {
    let mut out = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
            let path = entry.path();
            // Not followed through symbolic links, as istiod walks the directory.
            let kind = entry
                .file_type()
                .map_err(|e| format!("{}: {e}", path.display()))?;
            if kind.is_dir() {
                pending.push(path);
                continue;
            }
            let yaml = matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            );
            if !kind.is_file() || !yaml {
                continue;
            }
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            if text.is_empty() {
                continue;
            }
            let id = cluster_id_of(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            out.insert(path, (id, text));
        }
    }
    Ok(out)
}

/// The cluster ID a kubeconfig file registers: the cluster its current context names, else
/// that of the first context (by name) that names one, else the first cluster by name.
pub fn cluster_id_of(text: &str) -> Result<String, String> {
    let config = Kubeconfig::from_yaml(text).map_err(|e| format!("not a kubeconfig: {e}"))?;
    let cluster_of = |name: &str| {
        config
            .contexts
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.context.as_ref())
            .map(|c| c.cluster.clone())
            .filter(|c| !c.is_empty())
    };
    if let Some(id) = config.current_context.as_deref().and_then(cluster_of) {
        return Ok(id);
    }
    let mut contexts: Vec<&str> = config.contexts.iter().map(|c| c.name.as_str()).collect();
    contexts.sort_unstable();
    if let Some(id) = contexts.into_iter().find_map(cluster_of) {
        return Ok(id);
    }
    let mut clusters: Vec<&str> = config
        .clusters
        .iter()
        .map(|c| c.name.as_str())
        .filter(|n| !n.is_empty())
        .collect();
    clusters.sort_unstable();
    clusters
        .first()
        .map(|c| c.to_string())
        .ok_or_else(|| "it names no cluster, so no cluster ID".to_string())
}

/// A running source; stops when dropped.
pub struct Follow {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Follow {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(current: &str, contexts: &[(&str, &str)], clusters: &[&str]) -> String {
        let contexts: Vec<serde_json::Value> = contexts
            .iter()
            .map(|(name, cluster)| {
                serde_json::json!({"name": name, "context": {"cluster": cluster, "user": "u"}})
            })
            .collect();
        let clusters: Vec<serde_json::Value> = clusters
            .iter()
            .map(|c| serde_json::json!({"name": c, "cluster": {"server": "https://10.0.0.1"}}))
            .collect();
        serde_json::json!({"apiVersion": "v1", "kind": "Config", "current-context": current,
            "contexts": contexts, "clusters": clusters, "users": [{"name": "u", "user": {}}]})
        .to_string()
    }

    #[test]
    fn a_kubeconfig_files_cluster_id_is_its_current_contexts_cluster() {
        let current = kubeconfig("b", &[("a", "east"), ("b", "west")], &["east", "west"]);
        assert_eq!(cluster_id_of(&current).unwrap(), "west");
        // No current context: the first context by name that names a cluster.
        let first = kubeconfig("", &[("z", "south"), ("m", "north")], &["north", "south"]);
        assert_eq!(cluster_id_of(&first).unwrap(), "north");
        // No context: the first cluster by name.
        let clusters = kubeconfig("", &[], &["zulu", "alpha"]);
        assert_eq!(cluster_id_of(&clusters).unwrap(), "alpha");
        assert!(cluster_id_of(&kubeconfig("", &[], &[])).is_err());
        assert!(cluster_id_of("clusters: 7").is_err());
    }

    #[test]
    fn a_directory_is_read_as_istiod_reads_it() {
        let dir = std::env::temp_dir().join(format!("pasa-kubeconfigs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("nested")).unwrap();
        let east = kubeconfig("e", &[("e", "east")], &["east"]);
        std::fs::write(dir.join("east.yaml"), &east).unwrap();
        std::fs::write(
            dir.join("nested/west.yml"),
            kubeconfig("w", &[("w", "west")], &["west"]),
        )
        .unwrap();
        // Not YAML by name, and empty: skipped.
        std::fs::write(dir.join("notes.txt"), "not read").unwrap();
        std::fs::write(dir.join("being-written.yaml"), "").unwrap();
        let read = read_directory(&dir).unwrap();
        let ids: Vec<&str> = read.values().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["east", "west"]);
        assert_eq!(read[&dir.join("east.yaml")].1, east);
        // One bad file: the whole reading fails, naming it.
        std::fs::write(dir.join("bad.yaml"), "clusters: 7").unwrap();
        let error = read_directory(&dir).unwrap_err();
        assert!(error.contains("bad.yaml"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
