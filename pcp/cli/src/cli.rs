//! `pasactl`: the command line of PASA, with kubectl's habits.

mod agent;
mod apply;
mod delete;
mod get;
mod habits;
mod interrupt;
mod proxy_config;
pub mod proxy_status;
mod remote_clusters;
mod selector;
mod status;
mod table;
mod validate;
mod version;
mod watch;
pub mod x;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

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
    /// How long one request to the server may take before pasactl gives up (`30s`, `2m`; 0 for
    /// no limit). By default 30s, and 2m for each batch of `apply` and `delete`. `watch` runs
    /// on; see its --liveness-timeout.
    #[arg(long, global = true, value_parser = pasa_proto::duration::parse)]
    pub request_timeout: Option<Duration>,
    #[command(subcommand)]
    pub command: Command,
}

/// The store API pasactl talks to: its address and, for mutual TLS, pasactl's certificate.
#[derive(Debug, Clone)]
pub struct Server {
    pub address: String,
    pub tls: Option<ClientTls>,
    /// `--request-timeout`: `None` for each command's own default, zero for no limit.
    pub request_timeout: Option<Duration>,
}

/// How long a request may take unless `--request-timeout` says otherwise.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one batch of `apply -f` or `delete -f` may take (the store checks and writes up to
/// 5,000 objects in one).
pub const BATCH_TIMEOUT: Duration = Duration::from_secs(120);

impl Server {
    /// The deadline of one request whose default is `default`; `None` for no limit.
    pub fn deadline(&self, default: Duration) -> Option<Duration> {
        match self.request_timeout {
            Some(limit) if limit.is_zero() => None,
            Some(limit) => Some(limit),
            None => Some(default),
        }
    }

    /// Runs `work` (connecting and asking the server) within the deadline of `what`; a server
    /// that does not answer in time is named, with what to do.
    pub async fn within<T>(
        &self,
        what: &str,
        default: Duration,
        work: impl Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<T> {
        let Some(limit) = self.deadline(default) else {
            return work.await;
        };
        match tokio::time::timeout(limit, work).await {
            Ok(answer) => answer,
            Err(_) => Err(anyhow::anyhow!(
                "the server at {self} did not answer {what} within {}: it may be stopped, hung or overloaded (check that pasa-pcp is running and healthy; --request-timeout sets the limit, 0 for none)",
                seconds(limit)
            )),
        }
    }
}

/// `30s`, `2m`, `1500ms`, as a person reads a limit.
pub fn seconds(d: Duration) -> String {
    match d.as_millis() {
        ms if ms % 60_000 == 0 && ms >= 60_000 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
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
            request_timeout: self.request_timeout,
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
    Status(status::StatusArgs),
    /// Show what a pasa-agent serves its proxy (clusters, listeners, routes, endpoints), as
    /// istioctl proxy-config does; read from the agent's admin endpoint.
    #[command(subcommand, visible_alias = "pc")]
    ProxyConfig(proxy_config::ProxyConfigCommand),
    /// List every proxy's xDS sync state as its agent reports it, or one proxy in detail.
    ProxyStatus(proxy_status::ProxyStatusArgs),
    /// List the clusters PCP syncs (its own and the remote ones) and their sync state, as
    /// istioctl remote-clusters does.
    RemoteClusters(remote_clusters::RemoteClustersArgs),
    /// Check files as the write path would, without a server; exit code 1 on errors.
    Validate(validate::ValidateArgs),
    /// Experimental commands; their flags and output may change.
    #[command(subcommand)]
    X(x::XCommand),
    /// This client's version, the server's and its agents' (as istioctl version).
    Version(version::VersionArgs),
    /// kubectl's and istioctl's verbs pasactl does not have: each answered with what does it.
    #[command(external_subcommand)]
    Other(Vec<String>),
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

/// The user stopped pasactl with Ctrl-C, and was told what was done (exit code 130, as a shell
/// reports a process ended by SIGINT).
#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
pub struct Interrupted;

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
        Err(e) if e.is::<Interrupted>() => ExitCode::from(130),
        Err(e) if e.is::<UsageError>() => {
            eprintln!("error: {}", error_text(&e));
            ExitCode::from(2)
        }
        // The reader went away (`pasactl get vs -A | head`): stop quietly, as kubectl does.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_text(&e));
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
        Command::Status(args) => status::run(&server?, args).await,
        Command::ProxyConfig(command) => proxy_config::run(&server?, command).await,
        Command::ProxyStatus(args) => proxy_status::run(&server?, args).await,
        Command::RemoteClusters(args) => remote_clusters::run(&server?, args).await,
        Command::Validate(args) => validate::run(args),
        Command::X(command) => x::run(server, command).await,
        Command::Version(args) => version::run(server, args).await,
        Command::Other(words) => {
            let (verb, args) = words
                .split_first()
                .map_or(("", &[][..]), |(v, a)| (v.as_str(), a));
            Err(habits::refuse(verb, args).into())
        }
    }
}

/// An error and its causes on one line, each said once: a cause whose text is already in the
/// line (an error that prints its own source) is not repeated.
pub fn error_text(e: &anyhow::Error) -> String {
    pasa_runtime::error::once_each(e.chain().map(ToString::to_string))
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

/// A gRPC error from the server at `server` as a user reads it, with the causes beneath it
/// (a broken connection says why). An answer that is not gRPC at all (an HTTP server, PCP's own
/// admin endpoint) says so and where the API is.
pub fn status_error(server: &Server, status: tonic::Status) -> anyhow::Error {
    // Each cause once: tonic's message often repeats the text of the error beneath it.
    let first = std::error::Error::source(&status);
    let transport = first.is_some();
    let causes = std::iter::successors(first, |c| c.source()).map(ToString::to_string);
    let detail =
        pasa_runtime::error::once_each(std::iter::once(status.message().to_string()).chain(causes));
    if not_grpc(&detail) {
        return anyhow::anyhow!(
            "the server at {server} answered, but not with the PASA API ({detail}): this is likely PCP's admin endpoint (/metrics, /healthz) or another HTTP server; the API is on PCP's gRPC port (--listen, 7400 by default): point --server or PASA_SERVER at it"
        );
    }
    if transport {
        // The connection failed, not the request.
        return anyhow::anyhow!(
            "the connection to the server at {server} failed: {detail} (is pasa-pcp running and healthy?)"
        );
    }
    anyhow::anyhow!("{detail} ({:?})", status.code())
}

/// Whether an error's text says the peer is no gRPC server: an HTTP answer without gRPC's
/// status or of another content type, or an HTTP/1-only peer that cannot read HTTP/2 (its
/// HTTP/1 answer read as an HTTP/2 frame is one of an impossible size).
fn not_grpc(detail: &str) -> bool {
    detail.contains("grpc-status header missing")
        || detail.contains("invalid content-type")
        || detail.contains("frame with invalid size")
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
        .unwrap_or_else(|| format!("document {}", u64::from(index) + 1));
    let what = reference
        .filter(|r| !r.name.is_empty())
        .map(|r| format!(" ({})", object_name(&r.kind, &r.namespace, &r.name)))
        .unwrap_or_default();
    format!(
        "{source}{what}: {}",
        pasa_validation::admission::problem_text(field, message)
    )
}

/// `-o json|yaml` of the commands that print one structured answer (`status`, `version`,
/// `remote-clusters`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Structured {
    Json,
    Yaml,
}

/// A value as `-o json` (indented) or `-o yaml` prints it.
pub fn structured(yaml: bool, value: &serde_json::Value) -> anyhow::Result<String> {
    if yaml {
        Ok(serde_saphyr::to_string(value)?)
    } else {
        Ok(serde_json::to_string_pretty(value)? + "\n")
    }
}

/// `E error(s), W warning(s) in N document(s)`: the totals `validate` and `apply` both print.
pub fn totals(errors: usize, warnings: usize, documents: usize) -> String {
    format!("{errors} error(s), {warnings} warning(s) in {documents} document(s)")
}

/// Gives documents that name no namespace the one of `-n` (`default` without it). With `-n`
/// given, a document that names another namespace is refused: writing
/// it where the document says would surprise whoever typed `-n`.
pub fn fill_namespaces(
    docs: &mut [(pasa_validation::manifest::Source, serde_json::Value)],
    flag: Option<&str>,
) -> Result<(), UsageError> {
    let mut mismatches = Vec::new();
    for (source, doc) in docs.iter_mut() {
        let Some(meta) = doc.get_mut("metadata").and_then(|m| m.as_object_mut()) else {
            continue;
        };
        match meta.get("namespace").and_then(|ns| ns.as_str()) {
            Some(named) if !named.is_empty() => {
                if let Some(flag) = flag
                    && flag != named
                {
                    mismatches.push(format!(
                        "{}: metadata.namespace is {named:?}, but -n is {flag:?}",
                        source
                    ));
                }
            }
            _ => {
                meta.insert("namespace".into(), flag.unwrap_or("default").into());
            }
        }
    }
    if mismatches.is_empty() {
        return Ok(());
    }
    Err(UsageError(format!(
        "{}\nthe namespace of {} document(s) does not match -n: drop -n to use the namespaces the documents name, or change their metadata.namespace (nothing was done)",
        mismatches.join("\n"),
        mismatches.len()
    )))
}

/// `kind/namespace/name`, as pasactl prints objects.
pub fn object_name(kind: &str, namespace: &str, name: &str) -> String {
    format!("{}/{}/{}", kind.to_ascii_lowercase(), namespace, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> Server {
        Server {
            address: "127.0.0.1:7401".into(),
            tls: None,
            request_timeout: None,
        }
    }

    #[test]
    fn an_answer_that_is_not_grpc_says_where_the_api_is() {
        let admin = tonic::Status::unimplemented(
            "grpc-status header missing, mapped from HTTP status code 404",
        );
        let text = status_error(&server(), admin).to_string();
        assert!(
            text.starts_with("the server at 127.0.0.1:7401 answered, but not with the PASA API")
                && text.contains("admin endpoint")
                && text.contains("7400"),
            "{text}"
        );
        let refused = tonic::Status::invalid_argument("batch too large");
        assert_eq!(
            status_error(&server(), refused).to_string(),
            "batch too large (InvalidArgument)"
        );
    }

    #[test]
    fn each_cause_is_printed_once() {
        let io = std::io::Error::from_raw_os_error(2);
        let e = anyhow::Error::new(io).context(format!(
            "cannot read x.yaml: {}",
            std::io::Error::from_raw_os_error(2)
        ));
        let text = error_text(&e.context("applying"));
        assert_eq!(text.matches("(os error 2)").count(), 1, "{text}");
        assert!(text.starts_with("applying: cannot read x.yaml: "), "{text}");
    }

    #[test]
    fn request_timeouts_default_per_command_and_zero_is_none() {
        let mut s = server();
        assert_eq!(s.deadline(BATCH_TIMEOUT), Some(BATCH_TIMEOUT));
        s.request_timeout = Some(Duration::from_secs(2));
        assert_eq!(s.deadline(BATCH_TIMEOUT), Some(Duration::from_secs(2)));
        s.request_timeout = Some(Duration::ZERO);
        assert_eq!(s.deadline(REQUEST_TIMEOUT), None);
        assert_eq!(seconds(Duration::from_secs(120)), "2m");
        assert_eq!(seconds(Duration::from_millis(1500)), "1500ms");
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("pasactl").chain(args.iter().copied()))
    }

    #[test]
    fn common_spellings_of_the_verbs_parse() {
        let Command::Watch(w) = parse(&["watch", "-n", "shop", "--kind", "vs,dr"])
            .unwrap()
            .command
        else {
            panic!("watch")
        };
        assert_eq!(
            (w.namespaces, w.kinds),
            (vec!["shop".to_string()], vec!["vs".into(), "dr".into()])
        );
        assert!(parse(&["watch", "-A", "-o", "json"]).is_ok());
        assert!(parse(&["watch", "-o", "yaml"]).is_err());
        assert!(parse(&["watch", "-A", "-n", "shop"]).is_err());
        for args in [
            &["status", "-o", "json"][..],
            &["status", "-o", "yaml"],
            &["proxy-config", "cluster", "-o", "yaml"],
            &["proxy-status", "-o", "yaml"],
            &["get", "vs,dr", "-o", "name"],
        ] {
            assert!(parse(args).is_ok(), "{args:?}");
        }
        let dry = |args: &[&str]| match parse(args).unwrap().command {
            Command::Apply(a) => a.dry_run,
            _ => panic!("apply"),
        };
        assert_eq!(dry(&["apply", "-f", "x.yaml", "--dry-run"]), Some(true));
        assert_eq!(
            dry(&["apply", "-f", "x.yaml", "--dry-run=server"]),
            Some(true)
        );
        assert_eq!(
            dry(&["apply", "-f", "x.yaml", "--dry-run=client"]),
            Some(true)
        );
        assert_eq!(
            dry(&["apply", "-f", "x.yaml", "--dry-run=none"]),
            Some(false)
        );
        assert_eq!(dry(&["apply", "-f", "x.yaml"]), None);
        let wrong = parse(&["apply", "-f", "x.yaml", "--dry-run=yes"])
            .unwrap_err()
            .to_string();
        assert!(wrong.contains("--dry-run=none"), "{wrong}");
    }

    #[test]
    fn documents_count_from_one_and_a_namespace_that_differs_from_n_is_refused() {
        use pasa_validation::manifest::Source;
        let source = |document| Source {
            file: "x.yaml".into(),
            document,
        };
        assert_eq!(source(0).to_string(), "x.yaml document 1");
        let docs = || {
            vec![
                (
                    source(0),
                    serde_json::json!({"metadata": {"name": "a", "namespace": "shop"}}),
                ),
                (source(1), serde_json::json!({"metadata": {"name": "b"}})),
            ]
        };
        let mut unnamed = docs();
        fill_namespaces(&mut unnamed, None).unwrap();
        assert_eq!(unnamed[0].1["metadata"]["namespace"], "shop");
        assert_eq!(unnamed[1].1["metadata"]["namespace"], "default");
        let mut same = docs();
        fill_namespaces(&mut same, Some("shop")).unwrap();
        assert_eq!(same[1].1["metadata"]["namespace"], "shop");
        let refused = fill_namespaces(&mut docs(), Some("other"))
            .unwrap_err()
            .to_string();
        assert!(
            refused.starts_with(
                "x.yaml document 1: metadata.namespace is \"shop\", but -n is \"other\"\n"
            ) && refused.contains("drop -n"),
            "{refused}"
        );
    }
}
