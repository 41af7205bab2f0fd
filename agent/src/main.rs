//! `pasa-agent`: the per-pod agent. Follows the proxy's slice of the store, translates it to xDS
//! and serves it over ADS on a Unix socket; see `pasa-agent --help`.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

#[tokio::main]
async fn main() -> std::process::ExitCode {
    pasa_agent::run::main().await
}
