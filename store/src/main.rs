//! `pasa-store`: the standalone store server.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use clap::Parser;
use pasa_store::server::ServerArgs;

/// The PASA store (UCS): on embedded sled by default, or on TiKV, where several replicas share
/// one cluster.
#[derive(Parser, Debug)]
#[command(name = "pasa-store", version)]
struct Args {
    #[command(flatten)]
    server: ServerArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Args::parse().server.run("pasa-store").await
}
