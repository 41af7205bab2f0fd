//! `pasa-pcp`: the PASA control plane. With no `--store` given it runs the store embedded on sled
//! in `./pasa-data` and serves the API on `127.0.0.1:7400`; `--webhook-listen` adds the admission
//! webhook.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use clap::Parser;
use pasa_pcp::server::PcpArgs;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    PcpArgs::parse().run().await
}
