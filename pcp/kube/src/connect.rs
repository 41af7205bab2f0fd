//! Reaching a cluster: with a kubeconfig file (its current context), or from inside a pod with
//! its service account (the token and CA Kubernetes mounts, and the API server's address from
//! the environment Kubernetes sets).

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config};

use pasa_runtime::error::causes as chain;

/// A client of a cluster, and the API server's address (for messages).
#[derive(Clone)]
pub struct Cluster {
    pub client: Client,
    /// The API server's URL (`https://10.0.0.1:6443`).
    pub server: String,
}

/// A client of the cluster `path`'s current context names.
pub async fn with_kubeconfig(path: &Path) -> anyhow::Result<Cluster> {
    let shown = path.display();
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| match e {
        // kube's own wording quotes the path twice over; the OS error is what tells.
        KubeconfigError::ReadConfig(io, _) => {
            anyhow::anyhow!("--kubeconfig {shown}: cannot read it: {io}")
        }
        other => anyhow::anyhow!("--kubeconfig {shown}: {}", chain(&other)),
    })?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| anyhow::anyhow!("--kubeconfig {shown}: {}", chain(&e)))?;
    let server = config.cluster_url.to_string();
    let client = Client::try_from(config)
        .map_err(|e| anyhow::anyhow!("--kubeconfig {shown}: {}", chain(&e)))?;
    Ok(Cluster { client, server })
}

/// A client with the pod's own service account.
pub fn in_cluster() -> anyhow::Result<Cluster> {
    let config = Config::incluster().map_err(|e| {
        anyhow::anyhow!(
            "--in-cluster: not in a Kubernetes pod, or its service account is not mounted: {}",
            chain(&e)
        )
    })?;
    let server = config.cluster_url.to_string();
    let client =
        Client::try_from(config).map_err(|e| anyhow::anyhow!("--in-cluster: {}", chain(&e)))?;
    Ok(Cluster { client, server })
}
