//! `pasactl watch`: one JSON object per line for every event, `SYNCED` and `PROGRESS` marker.

use std::io::Write;

use futures::StreamExt;
use pasa_proto::Kind;
use pasa_proto::store::v1::{
    CancelReason, EventType, Rule, SubscriberIdentity, Subscription, WatchCreate, WatchRequest,
    watch_request, watch_response,
};
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

fn event_type(t: i32) -> &'static str {
    match EventType::try_from(t) {
        Ok(EventType::Added) => "ADDED",
        Ok(EventType::Modified) => "MODIFIED",
        Ok(EventType::Deleted) => "DELETED",
        _ => "UNKNOWN",
    }
}

pub async fn run(server: &str, args: WatchArgs) -> CmdResult {
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
    let create = WatchCreate {
        subscription: Some(Subscription { rules: vec![rule] }),
        from_revision: args.from_revision,
        identity: Some(SubscriberIdentity {
            node_id: String::new(),
            metadata: [("client".to_string(), "pasactl".to_string())].into(),
        }),
    };
    let mut client = connect(server).await?;
    // Keep the request stream open: closing it is how a client says it is gone.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(WatchRequest {
        request: Some(watch_request::Request::Create(create)),
    })
    .await
    .map_err(|_| anyhow::anyhow!("watch request could not be queued"))?;
    let mut stream = client
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(status_error)?
        .into_inner();
    let mut stdout = std::io::stdout().lock();
    while let Some(msg) = stream.next().await {
        let msg = msg.map_err(status_error)?;
        let lines = match msg.response {
            Some(watch_response::Response::Events(batch)) => batch
                .events
                .iter()
                .map(|e| {
                    let r = e.resource.clone().unwrap_or_default();
                    json!({"type": event_type(e.r#type), "revision": e.revision,
                           "kind": r.kind, "namespace": r.namespace, "name": r.name})
                })
                .collect(),
            Some(watch_response::Response::Synced(s)) => {
                vec![json!({"type": "SYNCED", "revision": s.revision})]
            }
            Some(watch_response::Response::Progress(p)) => {
                vec![json!({"type": "PROGRESS", "revision": p.revision})]
            }
            Some(watch_response::Response::Cancelled(c)) => {
                let reason = CancelReason::try_from(c.reason)
                    .map(|r| {
                        r.as_str_name()
                            .trim_start_matches("CANCEL_REASON_")
                            .to_string()
                    })
                    .unwrap_or_else(|_| "UNKNOWN".into());
                writeln!(
                    stdout,
                    "{}",
                    json!({"type": "CANCELLED", "reason": reason,
                           "resume_revision": c.resume_revision,
                           "compact_revision": c.compact_revision})
                )?;
                stdout.flush()?;
                eprintln!("error: watch ended by the store: {}", c.message);
                return Err(Reported.into());
            }
            None => vec![],
        };
        for line in lines {
            writeln!(stdout, "{line}")?;
        }
        stdout.flush()?;
    }
    drop(tx);
    eprintln!("error: the store closed the watch");
    Err(Reported.into())
}
