//! `pasactl x`: experimental commands, whose flags and output may still change.

pub mod create_remote_secret;
mod simulate;
pub mod wait;

use clap::Subcommand;

use super::{CmdResult, Server};

#[derive(Subcommand, Debug)]
pub enum XCommand {
    /// Ask a running pasa-agent where a request would go through the configuration it serves:
    /// listener, filter chain, route configuration, virtual host, route and cluster. Exit code 1
    /// when the request would not get through.
    Simulate(simulate::SimulateArgs),
    /// Wait until the proxies serve an object's current revision (`istioctl x wait`): every
    /// proxy whose agent reports to the server has translated that revision or a later one and
    /// its proxy acknowledged it. Exit code 1 at --timeout, naming the proxies not there yet.
    Wait(wait::WaitArgs),
    /// Write the Secret that lets PCP read a remote cluster (`istioctl create-remote-secret`):
    /// a kubeconfig with the token of the remote cluster's reader ServiceAccount, labelled
    /// `istio/multiCluster`, as YAML for `kubectl apply -f -` in PCP's cluster. Creates the
    /// reader's objects (deploy/remote) in the remote cluster when its token is missing.
    CreateRemoteSecret(create_remote_secret::CreateRemoteSecretCommand),
}

/// `server` is where an agent named by its proxy is looked up.
pub async fn run(server: anyhow::Result<Server>, command: XCommand) -> CmdResult {
    match command {
        XCommand::Simulate(args) => simulate::run(server, args).await,
        XCommand::Wait(args) => wait::run(server, args).await,
        // The store is not asked: the remote cluster's API server is.
        XCommand::CreateRemoteSecret(args) => create_remote_secret::run(args).await,
    }
}
