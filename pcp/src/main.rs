//! `pasa-pcp`: the PASA control plane. With no store address given it runs the store embedded
//! on sled in `./pasa-data` and serves the store API on `127.0.0.1:7400`.

use std::net::SocketAddr;

use clap::Parser;
use pasa_store::metrics::Metrics;
use pasa_store::server::{self, StoreArgs};

/// The PASA control plane.
#[derive(Parser, Debug)]
#[command(name = "pasa-pcp", version)]
struct Args {
    /// gRPC address of the store API (and, later, the write API).
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
        "pasa-pcp",
        store,
        args.listen,
        args.admin,
        server::shutdown_signal(),
    )
    .await
}
