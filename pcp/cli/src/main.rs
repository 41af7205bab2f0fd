//! `pasactl`: apply, get, delete and watch PASA resources; `x simulate` asks an agent.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

fn main() -> std::process::ExitCode {
    pasactl::cli::main()
}
