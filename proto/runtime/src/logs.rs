//! Logs: `tracing` to stderr, filtered by `RUST_LOG`; coloured only for a person reading a
//! terminal.

use std::ffi::OsString;
use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// Sets up `tracing` for a server process (once, at start): `info` unless `RUST_LOG` says
/// otherwise, as text or JSON lines. tikv-client tells of every connection it opens at `info`:
/// only its warnings are kept by default.
pub fn init(json: bool) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(SERVER_DEFAULT))
        .with_ansi(colour())
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
        .with_ansi(colour())
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .init();
}

/// A server's default filter. tikv-client tells of every connection it opens at `info`: only
/// its warnings are kept. kube's client logs each failed request as an error with its first
/// cause only ("client error (Connect)"), every retry: PCP tells of the same failures itself,
/// with the API server's address, every cause and what to do, once while they last.
const SERVER_DEFAULT: &str = "info,tikv_client=warn,kube_client::client::builder=off";

fn filter(default: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
}

/// Whether logs on stderr are coloured here: only on a terminal, and never with `NO_COLOR` set.
fn colour() -> bool {
    wants_colour(
        std::env::var_os("NO_COLOR"),
        std::io::stderr().is_terminal(),
    )
}

/// Colour codes are for a terminal; a file, a pipe or a log collector gets plain text. A
/// non-empty `NO_COLOR` turns colour off everywhere (the no-color.org convention).
fn wants_colour(no_color: Option<OsString>, terminal: bool) -> bool {
    let refused = no_color.is_some_and(|v| !v.is_empty());
    terminal && !refused
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_and_never_with_no_color() {
        assert!(wants_colour(None, true));
        assert!(!wants_colour(None, false), "a pipe or file gets no codes");
        assert!(!wants_colour(Some("1".into()), true));
        assert!(!wants_colour(Some("1".into()), false));
        assert!(
            wants_colour(Some("".into()), true),
            "an empty NO_COLOR is unset"
        );
    }
}
