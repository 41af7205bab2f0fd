//! `pasa-bench fake-tikv`: the in-process fake of PD and TiKV (see `pasa_tikv::fake`) on its own,
//! so store replicas can be tried by hand where no TiKV can run:
//!
//! ```text
//! pasa-bench fake-tikv --listen 127.0.0.1:2379
//! pasa-store --backend tikv --pd 127.0.0.1:2379 --listen 127.0.0.1:7400 --admin 127.0.0.1:7401
//! pasa-store --backend tikv --pd 127.0.0.1:2379 --listen 127.0.0.1:7410 --admin 127.0.0.1:7411
//! ```
//!
//! It is a fake: data in memory, one region, no Raft. Not a benchmark either; it lives here
//! because pasa-bench is the project's tool for running scenarios by hand.

use std::net::SocketAddr;

use serde_json::{Value, json};

use pasa_tikv::fake::FakeTikv;

#[derive(clap::Args, Debug)]
pub struct FakeTikvArgs {
    /// Address the fake PD (and TiKV) listens on; port 0 picks one.
    #[arg(long, default_value = "127.0.0.1:2379")]
    listen: SocketAddr,
}

pub fn run(args: &FakeTikvArgs) -> anyhow::Result<Value> {
    let fake = FakeTikv::start(args.listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {} (--listen): {e}", args.listen))?;
    println!(
        "fake PD and TiKV (in memory, for trying store replicas; not TiKV) serving PD at {}",
        fake.pd_address()
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async { pasa_runtime::signal::shutdown().await });
    let locked = fake.locked_keys();
    drop(fake);
    Ok(json!({"fake_tikv": {"stopped": true, "locked_keys_left": locked}}))
}
