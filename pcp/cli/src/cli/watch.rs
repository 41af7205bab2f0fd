//! `pasactl watch`: one JSON object per line for every event, `SYNCED` and `PROGRESS` marker.

use std::io::Write;

use pasa_proto::Kind;
use pasa_proto::store::v1::{CancelReason, Resource, Rule, SubscriberIdentity, Subscription};
use pasa_proto::watch::{Action, Watch, WatchError, WatchEvent, WatchStart};
use serde_json::json;

use super::{CmdResult, Reported, connect, status_error};

#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    /// Only these kinds (repeatable; short names accepted).
    #[arg(long = "kind")]
    pub kinds: Vec<String>,
    /// Only these namespaces (repeatable).
    #[arg(long = "namespace")]
    pub namespaces: Vec<String>,
    /// Only objects for these hosts, as FQDNs; wildcards match as in Istio (repeatable).
    #[arg(long = "host")]
    pub hosts: Vec<String>,
    /// Only objects bound to these gateways (`namespace/name` or `mesh`; repeatable).
    #[arg(long = "gateway")]
    pub gateways: Vec<String>,
    /// Replay every change from this revision instead of starting with a snapshot.
    #[arg(long, default_value_t = 0)]
    pub from_revision: u64,
}

pub async fn run(server: &crate::cli::Server, args: WatchArgs) -> CmdResult {
    let kinds = args
        .kinds
        .iter()
        .map(|k| k.parse::<Kind>().map(|k| k.as_str().to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    for h in &args.hosts {
        if !h.contains('.') && h != "*" {
            eprintln!(
                "warning: --host {h:?} is not a fully qualified name; the store matches hosts as FQDNs (e.g. {h}.default.svc.cluster.local)"
            );
        }
    }
    let rule = Rule {
        kinds,
        namespaces: args.namespaces,
        hosts: args.hosts,
        gateways: args.gateways,
    };
    let start = WatchStart {
        subscription: Subscription { rules: vec![rule] },
        from_revision: args.from_revision,
        identity: Some(SubscriberIdentity {
            node_id: String::new(),
            metadata: [("client".to_string(), "pasactl".to_string())].into(),
        }),
    };
    let mut client = connect(server).await?;
    let mut stream = match Watch::open(&mut client, start).await {
        Ok(stream) => stream,
        Err(WatchError::Refused(status)) => return Err(status_error(status)),
        Err(e) => return Err(e.into()),
    };
    let mut stdout = std::io::stdout().lock();
    let ended = loop {
        let lines = match stream.next().await {
            Err(ended) => break ended,
            Ok(WatchEvent::Init) => vec![],
            Ok(WatchEvent::InitApply { revision, objects }) => objects
                .iter()
                .map(|r| object_line(Action::Added, revision, r))
                .collect(),
            Ok(WatchEvent::Changes(changes)) => changes
                .iter()
                .map(|c| object_line(c.action, c.revision, &c.resource))
                .collect(),
            Ok(WatchEvent::InitDone { revision, .. } | WatchEvent::Synced { revision, .. }) => {
                vec![json!({"type": "SYNCED", "revision": revision})]
            }
            Ok(WatchEvent::Progress { revision }) => {
                vec![json!({"type": "PROGRESS", "revision": revision})]
            }
        };
        for line in lines {
            writeln!(stdout, "{line}")?;
        }
        stdout.flush()?;
    };
    match &ended {
        WatchError::CutOff {
            reason,
            resume_revision,
            ..
        } => cancelled_line(&mut stdout, *reason, *resume_revision, 0)?,
        WatchError::Compacted {
            compact_revision, ..
        } => cancelled_line(&mut stdout, CancelReason::Compacted, 0, *compact_revision)?,
        _ => {}
    }
    match ended {
        WatchError::Failed(status) | WatchError::Refused(status) => Err(status_error(status)),
        ended => {
            eprintln!("error: {ended}");
            Err(Reported.into())
        }
    }
}

fn object_line(action: Action, revision: u64, r: &Resource) -> serde_json::Value {
    json!({"type": action.as_str(), "revision": revision,
           "kind": r.kind, "namespace": r.namespace, "name": r.name})
}

/// The line saying the store ended the watch, and where to resume.
fn cancelled_line(
    out: &mut impl Write,
    reason: CancelReason,
    resume_revision: u64,
    compact_revision: u64,
) -> std::io::Result<()> {
    let reason = reason.as_str_name().trim_start_matches("CANCEL_REASON_");
    writeln!(
        out,
        "{}",
        json!({"type": "CANCELLED", "reason": reason,
               "resume_revision": resume_revision,
               "compact_revision": compact_revision})
    )?;
    out.flush()
}
