//! Reaching a cluster: with a kubeconfig file (its current context), or from inside a pod with
//! its service account (the token and CA Kubernetes mounts, and the API server's address from
//! the environment Kubernetes sets).

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// A client of the cluster `path`'s current context names.
pub async fn with_kubeconfig(path: &Path) -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::read_from(path)
        .map_err(|e| anyhow::anyhow!("--kubeconfig {}: {e}", path.display()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| anyhow::anyhow!("--kubeconfig {}: {e}", path.display()))?;
    Client::try_from(config).map_err(|e| anyhow::anyhow!("--kubeconfig {}: {e}", path.display()))
}

/// A client with the pod's own service account.
pub fn in_cluster() -> anyhow::Result<Client> {
    let config = Config::incluster().map_err(|e| {
        anyhow::anyhow!(
            "--in-cluster: not in a Kubernetes pod, or its service account is not mounted: {e}"
        )
    })?;
    Client::try_from(config).map_err(|e| anyhow::anyhow!("--in-cluster: {e}"))
}
