//! Logs: `tracing` to stderr, filtered by `RUST_LOG`.

use tracing_subscriber::EnvFilter;

/// Sets up `tracing` for a server process (once, at start): `info` unless `RUST_LOG` says
/// otherwise, as text or JSON lines. tikv-client tells of every connection it opens at `info`:
/// only its warnings are kept by default.
pub fn init(json: bool) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter("info,tikv_client=warn"))
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Sets up `tracing` for a command-line tool: only warnings and errors unless `RUST_LOG` says
/// otherwise, without timestamps or module names (what a library skips, the user still hears).
pub fn init_cli() {
    tracing_subscriber::fmt()
        .with_env_filter(filter("warn"))
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .init();
}

fn filter(default: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
}
