//! `pasactl status`.

use pasa_proto::store::v1::{StatusRequest, StatusResponse};

use std::fmt::Write as _;

use super::{CmdResult, REQUEST_TIMEOUT, connect, out, status_error, structured};

/// `pasactl status` options.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Output format; a summary by default.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Output>,
}

pub use super::Structured as Output;

/// The server's status, within the request deadline of `what` (the command asking).
pub async fn fetch(server: &crate::cli::Server, what: &str) -> anyhow::Result<StatusResponse> {
    let ask = async {
        let mut client = connect(server).await?;
        let status = client
            .status(StatusRequest {})
            .await
            .map_err(|status| status_error(server, status))?;
        anyhow::Ok(status.into_inner())
    };
    server.within(what, REQUEST_TIMEOUT, ask).await
}

pub async fn run(server: &crate::cli::Server, args: StatusArgs) -> CmdResult {
    let s = fetch(server, "`status`").await?;
    if let Some(output) = args.output {
        let objects: serde_json::Map<String, serde_json::Value> = s
            .objects
            .iter()
            .map(|k| (k.kind.clone(), k.count.into()))
            .collect();
        let value = serde_json::json!({
            "server": server.address,
            "backend": s.backend,
            "version": s.version,
            "revision": s.revision,
            "compactRevision": s.compact_revision,
            "watchers": s.watchers,
            "objects": objects,
            "total": s.objects.iter().map(|k| k.count).sum::<u64>(),
        });
        out(&structured(output == Output::Yaml, &value)?)?;
        return Ok(());
    }
    let mut text = String::new();
    writeln!(text, "SERVER     {server}")?;
    writeln!(text, "BACKEND    {}", s.backend)?;
    writeln!(text, "VERSION    {}", s.version)?;
    writeln!(text, "REVISION   {}", s.revision)?;
    writeln!(text, "COMPACTED  {}", s.compact_revision)?;
    writeln!(text, "WATCHERS   {}", s.watchers)?;
    writeln!(text)?;
    let width = s
        .objects
        .iter()
        .map(|k| k.kind.len())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(text, "{:width$}  OBJECTS", "KIND")?;
    for k in &s.objects {
        writeln!(text, "{:width$}  {}", k.kind, k.count)?;
    }
    let total: u64 = s.objects.iter().map(|k| k.count).sum();
    writeln!(text, "{:width$}  {total}", "TOTAL")?;
    out(&text)?;
    Ok(())
}
