//! `pasactl x wait KIND NAME`: waits until the proxies have the object's current revision, as
//! `istioctl x wait` waits for a resource's distribution.
//!
//! A proxy has it when its agent reports (to the server asked) a configuration translated at
//! that revision or later, a proxy connected to it has acknowledged what it was sent, and no
//! type waits for an acknowledgement (STALE). An agent with no proxy connected does not count as
//! having it: its pod's proxy has nothing yet. An
//! agent hears of every revision, in its scope or not, through the store's progress events, so
//! a proxy the object does not concern counts too, within the store's progress interval.

use std::time::{Duration, Instant};

use pasa_proto::Kind;
use pasa_proto::store::v1::{ProxyStatusEntry, SyncState};

use crate::cli::delete::named;
use crate::cli::get::get_one;
use crate::cli::proxy_status::{self, name};
use crate::cli::{CmdResult, Reported, Server, UsageError, out};

/// How often the store is asked again while waiting.
const POLL: Duration = Duration::from_millis(250);

#[derive(clap::Args, Debug)]
pub struct WaitArgs {
    /// Kind (vs, dr, se, gw, ...), or KIND/NAME.
    pub kind: String,
    /// Name of the object (with KIND).
    pub name: Option<String>,
    /// Namespace of the object.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// What to wait for: the object's revision on the proxies.
    #[arg(long = "for", value_enum, default_value = "distribution")]
    pub condition: Condition,
    /// Wait for this store revision instead of the object's current one.
    #[arg(long)]
    pub revision: Option<u64>,
    /// The share of proxies that must have it (0 to 1).
    #[arg(long, default_value_t = 1.0, value_parser = share)]
    pub threshold: f64,
    /// How long to wait (`30s`, `2m`) before giving up with exit code 1.
    #[arg(long, default_value = "30s", value_parser = pasa_proto::duration::parse)]
    pub timeout: Duration,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Every proxy (or --threshold of them) serves the object's revision.
    Distribution,
}

fn share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "{text:?}: give a share between 0 and 1 (0.5: half)"
        )),
    }
}

/// Why one proxy does not have `revision` yet, or `None` when it has.
pub fn lacking(entry: &ProxyStatusEntry, revision: u64) -> Option<String> {
    let Some(status) = &entry.status else {
        return Some("no report".into());
    };
    if !entry.connected {
        return Some(proxy_status::degraded(entry));
    }
    if status.applied_revision < revision {
        return Some(format!("at revision {}", status.applied_revision));
    }
    if status.connections.is_empty() {
        return Some("no proxy connected to its agent".into());
    }
    let types = proxy_status::types(status.xds.as_ref());
    let in_state = |state: SyncState| -> Vec<&str> {
        types
            .iter()
            .filter(|(_, t)| t.is_some_and(|t| t.state == state as i32))
            .map(|(type_name, _)| *type_name)
            .collect()
    };
    let stale = in_state(SyncState::Stale);
    if !stale.is_empty() {
        return Some(format!("{} not acknowledged", stale.join(", ")));
    }
    in_state(SyncState::Synced)
        .is_empty()
        .then(|| "nothing sent to its proxy yet".into())
}

pub async fn run(server: anyhow::Result<Server>, args: WaitArgs) -> CmdResult {
    let server = server?;
    let refs = named(&args.kind, args.name.as_slice(), &args.namespace)?;
    let [object] = refs.as_slice() else {
        return Err(UsageError("x wait takes one object: KIND NAME or KIND/NAME".into()).into());
    };
    let kind: Kind = object.kind.parse()?;
    let label = format!(
        "{}/{}/{}",
        kind.as_str().to_lowercase(),
        object.namespace,
        object.name
    );
    let revision = match args.revision {
        Some(revision) => revision,
        None => {
            get_one(&server, kind, &object.name, &object.namespace)
                .await?
                .mod_revision
        }
    };
    let deadline = Instant::now() + args.timeout;
    loop {
        let answer = proxy_status::list(&server, "", "").await?;
        let proxies: Vec<&ProxyStatusEntry> = answer
            .proxies
            .iter()
            .filter(|e| e.status.is_some())
            .collect();
        let behind: Vec<(String, String)> = proxies
            .iter()
            .filter_map(|e| Some((e.status.as_ref().map(name)?, lacking(e, revision)?)))
            .collect();
        let have = proxies.len() - behind.len();
        if proxies.is_empty() {
            eprintln!(
                "warning: no agent reports to the server at {server}, so no proxy waits for {label} (each store server knows only the agents reporting to it)"
            );
            return Ok(());
        }
        // At least `threshold` of the proxies (all of them at 1).
        if have as f64 >= args.threshold * proxies.len() as f64 {
            out(&format!(
                "{label} (revision {revision}) distributed to {have} of {} proxies\n",
                proxies.len()
            ))?;
            return Ok(());
        }
        if Instant::now() + POLL > deadline {
            let mut text = format!(
                "error: {label} (revision {revision}) reached {have} of {} proxies within {}; not yet:",
                proxies.len(),
                crate::cli::seconds(args.timeout)
            );
            for (proxy, why) in behind.iter().take(10) {
                text.push_str(&format!("\n  {proxy}: {why}"));
            }
            if behind.len() > 10 {
                text.push_str(&format!("\n  and {} more", behind.len() - 10));
            }
            eprintln!("{text}");
            return Err(Reported.into());
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pasa_proto::store::v1::{ProxyConnection, ProxyStatus, TypeSyncStatus, XdsSyncStatus};

    fn entry(applied: u64, rds: SyncState, connected: bool) -> ProxyStatusEntry {
        ProxyStatusEntry {
            status: Some(ProxyStatus {
                applied_revision: applied,
                connections: vec![ProxyConnection::default()],
                xds: Some(XdsSyncStatus {
                    rds: Some(TypeSyncStatus {
                        state: rds as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            connected,
            ..Default::default()
        }
    }

    #[test]
    fn a_proxy_has_a_revision_once_translated_and_acknowledged() {
        assert_eq!(lacking(&entry(12, SyncState::Synced, true), 12), None);
        assert_eq!(lacking(&entry(13, SyncState::Synced, true), 12), None);
        assert_eq!(
            lacking(&entry(11, SyncState::Synced, true), 12).as_deref(),
            Some("at revision 11")
        );
        assert_eq!(
            lacking(&entry(12, SyncState::Stale, true), 12).as_deref(),
            Some("RDS not acknowledged")
        );
        assert_eq!(
            lacking(&entry(12, SyncState::Synced, false), 12).as_deref(),
            Some("lost contact 0s ago")
        );
        assert_eq!(
            lacking(&entry(12, SyncState::NotSent, true), 12).as_deref(),
            Some("nothing sent to its proxy yet")
        );
        let mut alone = entry(12, SyncState::Synced, true);
        alone.status.as_mut().unwrap().connections.clear();
        assert_eq!(
            lacking(&alone, 12).as_deref(),
            Some("no proxy connected to its agent")
        );
    }

    #[test]
    fn a_threshold_is_a_share() {
        assert_eq!(share("0.5"), Ok(0.5));
        assert!(share("2").unwrap_err().contains("between 0 and 1"));
    }
}
