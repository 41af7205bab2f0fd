//! `pasactl`: apply, get, delete and watch PASA resources; `x simulate` asks an agent.

fn main() -> std::process::ExitCode {
    pasa_pcp::cli::main()
}
