//! `pasactl status`.

use pasa_proto::store::v1::StatusRequest;

use std::fmt::Write as _;

use super::{CmdResult, connect, out, status_error};

pub async fn run(server: &crate::cli::Server) -> CmdResult {
    let mut client = connect(server).await?;
    let s = client
        .status(StatusRequest {})
        .await
        .map_err(status_error)?
        .into_inner();
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
