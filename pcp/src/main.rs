//! `pasa-pcp`: the PASA control plane. With no store address given it runs the store embedded
//! on sled in `./pasa-data` and serves the store API on `127.0.0.1:7400`.

use clap::Parser;
use pasa_store::server::ServerArgs;

/// The PASA control plane, with the store embedded.
#[derive(Parser, Debug)]
#[command(name = "pasa-pcp", version)]
struct Args {
    #[command(flatten)]
    server: ServerArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Args::parse().server.run("pasa-pcp").await
}
