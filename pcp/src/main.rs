//! `pasa-pcp`: the PASA control plane. With no `--store` given it runs the store embedded on sled
//! in `./pasa-data` and serves the API on `127.0.0.1:7400`; `--webhook-listen` adds the admission
//! webhook.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use clap::Parser;
use pasa_pcp::server::PcpArgs;

fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => return pasa_runtime::error::exit(&e),
    };
    let served = runtime.block_on(PcpArgs::parse().run());
    // A batch still being checked on a blocking thread does not hold the exit: the servers have
    // stopped, and that batch is written nowhere.
    runtime.shutdown_timeout(pasa_runtime::drain::DRAIN_DEADLINE);
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => pasa_runtime::error::exit(e.as_ref()),
    }
}
