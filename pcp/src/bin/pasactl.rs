//! `pasactl`: apply, get, delete and watch PASA resources.

fn main() -> std::process::ExitCode {
    pasa_pcp::cli::main()
}
