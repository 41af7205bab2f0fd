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

/// Why a remote cluster's kubeconfig (from a Secret or a file of the multicluster directory)
/// gives no client.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigRefused {
    #[error("not a kubeconfig: {0}")]
    Unreadable(String),
    /// It asks for what a kubeconfig that anyone able to write a Secret in PCP's namespace
    /// could give must not: to run a command, or to read PCP's own files.
    #[error(
        "it uses {0}, which PCP does not accept from a remote cluster's kubeconfig (as istiod \
         refuses it by default): give a token or certificate inline \
         (istioctl create-remote-secret writes such kubeconfigs)"
    )]
    Untrusted(&'static str),
    #[error("{0}")]
    Client(String),
}

/// A client of the cluster a remote cluster's kubeconfig (text) reaches by its current
/// context. As istiod's untrusted kubeconfigs, it may not run a command (`exec`), use an
/// auth provider, or name files on PCP's machine (token, certificate, key or CA files).
pub async fn with_remote_kubeconfig(text: &str) -> Result<Cluster, KubeconfigRefused> {
    let kubeconfig =
        Kubeconfig::from_yaml(text).map_err(|e| KubeconfigRefused::Unreadable(chain(&e)))?;
    for user in kubeconfig
        .auth_infos
        .iter()
        .filter_map(|a| a.auth_info.as_ref())
    {
        let refused = [
            (user.exec.is_some(), "exec (a command to run)"),
            (user.auth_provider.is_some(), "an auth-provider"),
            (user.token_file.is_some(), "tokenFile (a file)"),
            (
                user.client_certificate.is_some(),
                "client-certificate (a file)",
            ),
            (user.client_key.is_some(), "client-key (a file)"),
        ];
        if let Some((_, what)) = refused.into_iter().find(|(used, _)| *used) {
            return Err(KubeconfigRefused::Untrusted(what));
        }
    }
    for cluster in kubeconfig
        .clusters
        .iter()
        .filter_map(|c| c.cluster.as_ref())
    {
        if cluster.certificate_authority.is_some() {
            return Err(KubeconfigRefused::Untrusted(
                "certificate-authority (a file)",
            ));
        }
    }
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| KubeconfigRefused::Client(chain(&e)))?;
    let server = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|e| KubeconfigRefused::Client(chain(&e)))?;
    Ok(Cluster { client, server })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(user: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{{name: c, cluster: {{server: 'https://10.0.0.1:6443'}}}}]\n\
             contexts: [{{name: c, context: {{cluster: c, user: u}}}}]\n\
             users: [{{name: u, user: {user}}}]\n"
        )
    }

    /// What anyone able to write a Secret in PCP's namespace could make PCP do is refused:
    /// running a command, reading PCP's own files.
    #[tokio::test]
    async fn a_remote_kubeconfig_may_not_run_commands_or_read_files() {
        let token = with_remote_kubeconfig(&kubeconfig("{token: abc}")).await;
        assert_eq!(token.unwrap().server, "https://10.0.0.1:6443/");
        for (user, what) in [
            (
                "{exec: {apiVersion: client.authentication.k8s.io/v1, command: sh}}",
                "exec",
            ),
            ("{tokenFile: token}", "tokenFile"),
            ("{client-key: key.pem}", "client-key"),
        ] {
            let refused = with_remote_kubeconfig(&kubeconfig(user)).await;
            match refused {
                Err(KubeconfigRefused::Untrusted(said)) => assert!(said.contains(what), "{said}"),
                Err(other) => panic!("{user}: {other}"),
                Ok(_) => panic!("{user}: accepted"),
            }
        }
        assert!(matches!(
            with_remote_kubeconfig("clusters: 7").await,
            Err(KubeconfigRefused::Unreadable(_))
        ));
    }
}
