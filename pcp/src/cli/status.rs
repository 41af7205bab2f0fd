//! `pasactl status`.

use pasa_proto::store::v1::StatusRequest;

use super::{CmdResult, connect, status_error};

pub async fn run(server: &str) -> CmdResult {
    let mut client = connect(server).await?;
    let s = client
        .status(StatusRequest {})
        .await
        .map_err(status_error)?
        .into_inner();
    println!("SERVER     {server}");
    println!("BACKEND    {}", s.backend);
    println!("VERSION    {}", s.version);
    println!("REVISION   {}", s.revision);
    println!("COMPACTED  {}", s.compact_revision);
    println!("WATCHERS   {}", s.watchers);
    println!();
    let width = s
        .objects
        .iter()
        .map(|k| k.kind.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!("{:width$}  OBJECTS", "KIND");
    for k in &s.objects {
        println!("{:width$}  {}", k.kind, k.count);
    }
    let total: u64 = s.objects.iter().map(|k| k.count).sum();
    println!("{:width$}  {total}", "TOTAL");
    Ok(())
}
