//! `pasactl x`: experimental commands, whose flags and output may still change.

mod simulate;

use clap::Subcommand;

use super::CmdResult;

#[derive(Subcommand, Debug)]
pub enum XCommand {
    /// Ask a running pasa-agent where a request would go through the configuration it serves:
    /// listener, filter chain, route configuration, virtual host, route and cluster. Exit code 1
    /// when the request would not get through.
    Simulate(simulate::SimulateArgs),
}

pub async fn run(command: XCommand) -> CmdResult {
    match command {
        XCommand::Simulate(args) => simulate::run(args).await,
    }
}
