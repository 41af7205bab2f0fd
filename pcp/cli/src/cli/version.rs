//! `pasactl version`: this client's version, the server's, and the agents' that report to it,
//! as `istioctl version` shows client, control plane and data plane versions.

use std::collections::BTreeMap;

use serde_json::json;

use super::{CmdResult, out, proxy_status, status, structured};

#[derive(clap::Args, Debug)]
pub struct VersionArgs {
    /// Only this client's version (no server needed).
    #[arg(long)]
    pub client: bool,
    /// Output format; lines by default.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Output>,
}

pub use super::Structured as Output;

pub async fn run(server: anyhow::Result<super::Server>, args: VersionArgs) -> CmdResult {
    let client = env!("CARGO_PKG_VERSION");
    if args.client {
        return match args.output {
            None => out(&format!("client version: {client}\n")).map_err(Into::into),
            Some(o) => out(&structured(
                o == Output::Yaml,
                &json!({ "client": client }),
            )?)
            .map_err(Into::into),
        };
    }
    // The client's version first, as kubectl: it is known even when the server is not reached.
    if args.output.is_none() {
        out(&format!("client version: {client}\n"))?;
    }
    let server = server?;
    let status = status::fetch(&server, "`version`").await?;
    let proxies = proxy_status::list(&server, "", "").await?;
    // Agents per version, as istioctl counts the data plane's.
    let mut agents: BTreeMap<String, usize> = BTreeMap::new();
    for entry in &proxies.proxies {
        if let Some(s) = &entry.status {
            *agents.entry(s.agent_version.clone()).or_default() += 1;
        }
    }
    match args.output {
        Some(o) => {
            let value = json!({
                "client": client,
                "controlPlane": { "server": server.address, "version": status.version },
                "dataPlane": agents.iter().map(|(v, n)| json!({ "version": v, "agents": n })).collect::<Vec<_>>(),
            });
            out(&structured(o == Output::Yaml, &value)?)?;
        }
        None => {
            let data_plane = if agents.is_empty() {
                "none (no agent reports to this server)".to_string()
            } else {
                agents
                    .iter()
                    .map(|(v, n)| format!("{v} ({n} agent{})", if *n == 1 { "" } else { "s" }))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            out(&format!(
                "control plane version: {} ({})\ndata plane version: {data_plane}\n",
                status.version, server.address
            ))?;
        }
    }
    Ok(())
}
