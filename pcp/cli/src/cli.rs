//! `pasactl`: the command line of PASA, with kubectl's habits.

mod agent;
mod apply;
mod delete;
mod get;
mod proxy_config;
pub mod proxy_status;
mod status;
mod table;
mod validate;
mod watch;
mod x;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pasa_proto::client::ClientTls;
use pasa_proto::store::v1::store_client::StoreClient;
use tonic::transport::Channel;

/// Talk to a PASA store.
#[derive(Parser, Debug)]
#[command(name = "pasactl", version)]
pub struct Cli {
    /// Address of the PASA store API (host:port or http://host:port).
    #[arg(
        long,
        global = true,
        env = "PASA_SERVER",
        default_value = "127.0.0.1:7400"
    )]
    pub server: String,
    /// CA certificate (PEM) the server's certificate must chain to; with --cert and --key,
    /// pasactl speaks mutual TLS (to a server started with --grpc-tls-cert).
    #[arg(long, global = true, env = "PASA_CA", requires_all = ["cert", "key"])]
    pub ca: Option<std::path::PathBuf>,
    /// pasactl's client certificate (PEM chain). Its URI SAN is who the server thinks you are:
    /// writing needs one of the server's --grpc-operator identities.
    #[arg(long, global = true, env = "PASA_CERT", requires = "ca")]
    pub cert: Option<std::path::PathBuf>,
    /// The private key of --cert.
    #[arg(long, global = true, env = "PASA_KEY", requires = "ca")]
    pub key: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// The store API pasactl talks to: its address and, for mutual TLS, pasactl's certificate.
#[derive(Debug, Clone)]
pub struct Server {
    pub address: String,
    pub tls: Option<ClientTls>,
}

impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.address)
    }
}

impl Cli {
    /// The server as the flags describe it; unreadable files are a usage error naming them.
    fn target(&self) -> anyhow::Result<Server> {
        let tls = match (&self.ca, &self.cert, &self.key) {
            (Some(ca), Some(cert), Some(key)) => Some(
                ClientTls::from_files(ca, cert, key)
                    .map_err(|e| UsageError(format!("--ca/--cert/--key: {e}")))?,
            ),
            _ => None,
        };
        Ok(Server {
            address: self.server.clone(),
            tls,
        })
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create or update resources from files, folders or standard input.
    Apply(apply::ApplyArgs),
    /// List resources of a kind, or show one.
    Get(get::GetArgs),
    /// Delete a resource by name, or every resource in files.
    Delete(delete::DeleteArgs),
    /// Follow changes, one JSON object per line.
    Watch(watch::WatchArgs),
    /// Show the store's revision and object counts.
    Status,
    /// Show what a pasa-agent serves its proxy (clusters, listeners, routes, endpoints), as
    /// istioctl proxy-config does; read from the agent's admin endpoint.
    #[command(subcommand, visible_alias = "pc")]
    ProxyConfig(proxy_config::ProxyConfigCommand),
    /// List every proxy's xDS sync state as its agent reports it, or one proxy in detail.
    ProxyStatus(proxy_status::ProxyStatusArgs),
    /// Check files as the write path would, without a server; exit code 1 on errors.
    Validate(validate::ValidateArgs),
    /// Experimental commands; their flags and output may change.
    #[command(subcommand)]
    X(x::XCommand),
}

/// `-f` options shared by apply and delete.
#[derive(clap::Args, Debug, Clone)]
pub struct FileArgs {
    /// File, folder or - for standard input; repeatable.
    #[arg(short = 'f', long = "filename")]
    pub files: Vec<PathBuf>,
    /// Also read subfolders of folders given with -f.
    #[arg(short = 'R', long)]
    pub recursive: bool,
}

/// An error that has already been explained to the user.
#[derive(Debug)]
pub struct Reported;

/// A usage error found after the command line was parsed (exit code 2, as clap's own).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

pub type CmdResult = Result<(), anyhow::Error>;

/// Entry point of the `pasactl` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    pasa_runtime::logs::init_cli();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Reported>() => ExitCode::FAILURE,
        Err(e) if e.is::<UsageError>() => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
        // The reader went away (`pasactl get vs -A | head`): stop quietly, as kubectl does.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reported")
    }
}

impl std::error::Error for Reported {}

async fn run(cli: Cli) -> CmdResult {
    // Read only by the commands that talk to a server.
    let server = cli.target();
    match cli.command {
        Command::Apply(args) => apply::run(&server?, args).await,
        Command::Get(args) => get::run(&server?, args).await,
        Command::Delete(args) => delete::run(&server?, args).await,
        Command::Watch(args) => watch::run(&server?, args).await,
        Command::Status => status::run(&server?).await,
        Command::ProxyConfig(command) => proxy_config::run(&server?, command).await,
        Command::ProxyStatus(args) => proxy_status::run(&server?, args).await,
        Command::Validate(args) => validate::run(args),
        Command::X(command) => x::run(command).await,
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Writes command output to stdout; a closed pipe comes back as an error, not a panic.
pub fn out(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()
}

/// Connects to the store, with a message that says what to check when it is not there.
pub async fn connect(server: &Server) -> anyhow::Result<StoreClient<Channel>> {
    pasa_proto::client::connect_with(&server.address, server.tls.as_ref())
        .await
        .map_err(|e| match e {
            pasa_proto::client::ConnectError::Address(e) => anyhow::anyhow!("--server {e}"),
            e => anyhow::anyhow!("{e} (is pasa-pcp running? set --server or PASA_SERVER)"),
        })
}

/// A gRPC error as a user reads it.
pub fn status_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{} ({:?})", status.message(), status.code())
}

/// One problem of a batch as pasactl prints it: where (file, document, object), which field, what.
pub fn problem_line(
    sources: &[pasa_validation::manifest::Source],
    index: u32,
    reference: Option<&pasa_proto::store::v1::ObjectRef>,
    field: &str,
    message: &str,
) -> String {
    let source = sources
        .get(index as usize)
        .map(ToString::to_string)
        .unwrap_or_else(|| format!("document {index}"));
    let what = reference
        .filter(|r| !r.name.is_empty())
        .map(|r| format!(" ({})", object_name(&r.kind, &r.namespace, &r.name)))
        .unwrap_or_default();
    format!(
        "{source}{what}: {}",
        pasa_validation::admission::problem_text(field, message)
    )
}

/// `kind/namespace/name`, as pasactl prints objects.
pub fn object_name(kind: &str, namespace: &str, name: &str) -> String {
    format!("{}/{}/{}", kind.to_ascii_lowercase(), namespace, name)
}
