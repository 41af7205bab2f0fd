//! `pasa-agent`: the per-pod agent. Follows the proxy's slice of the store, translates it to xDS
//! and serves it over ADS on a Unix socket; see `pasa-agent --help`.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    pasa_agent::run::main().await
}
