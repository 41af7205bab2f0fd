//! `pasa-store`: the standalone store server.

use std::net::SocketAddr;

use clap::Parser;
use pasa_store::metrics::Metrics;
use pasa_store::server::{self, StoreArgs};

/// The PASA store (UCS) on its embedded sled backend.
#[derive(Parser, Debug)]
#[command(name = "pasa-store", version)]
struct Args {
    /// gRPC address of the store API.
    #[arg(long, env = "PASA_LISTEN", default_value = "127.0.0.1:7400")]
    listen: SocketAddr,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "PASA_ADMIN", default_value = "127.0.0.1:7401")]
    admin: SocketAddr,
    #[command(flatten)]
    store: StoreArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    server::init_tracing(args.store.log_json);
    let store = args.store.open(Metrics::new())?;
    server::serve(
        "pasa-store",
        store,
        args.listen,
        args.admin,
        server::shutdown_signal(),
    )
    .await
}
