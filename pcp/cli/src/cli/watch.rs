//! `pasactl watch`: one JSON object per line for every event, `SYNCED` and `PROGRESS` marker.

use std::io::Write;
use std::time::Duration;

use pasa_proto::Kind;
use pasa_proto::store::v1::{CancelReason, Resource, Rule, SubscriberIdentity, Subscription};
use pasa_proto::watch::{Action, Watch, WatchError, WatchEvent, WatchStart};
use serde_json::json;

use super::{CmdResult, REQUEST_TIMEOUT, Reported, connect, seconds, status_error};

#[derive(clap::Args, Debug)]
pub struct WatchArgs {
    /// Only these kinds (repeatable or comma-separated; short names accepted: vs,dr).
    #[arg(long = "kind", value_delimiter = ',')]
    pub kinds: Vec<String>,
    /// Only these namespaces (repeatable or comma-separated); every namespace without it.
    #[arg(short = 'n', long = "namespace", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Every namespace (also the default without -n).
    #[arg(short = 'A', long, conflicts_with = "namespaces")]
    pub all_namespaces: bool,
    /// Output format: JSON lines, the only one (a stream of events has no table or YAML).
    #[arg(short = 'o', long, value_enum, default_value = "json")]
    pub output: Output,
    /// Only objects for these hosts, as FQDNs; wildcards match as in Istio (repeatable).
    #[arg(long = "host")]
    pub hosts: Vec<String>,
    /// Only objects bound to these gateways (`namespace/name` or `mesh`; repeatable).
    #[arg(long = "gateway")]
    pub gateways: Vec<String>,
    /// Replay every change from this revision instead of starting with a snapshot.
    #[arg(long, default_value_t = 0)]
    pub from_revision: u64,
    /// Give the watch up as lost when the server sends nothing for this long (`30s`, `2m`; 0
    /// waits forever). The store sends a progress marker every --progress-interval-secs (10 by
    /// default) even when nothing changes, so silence means it stopped or the network broke.
    #[arg(long, default_value = "30s", value_parser = pasa_proto::duration::parse)]
    pub liveness_timeout: Duration,
}

/// `watch -o`: one JSON object per line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Json,
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
    let resume = Resume::new(server, &args);
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
    let open = async {
        let mut client = connect(server).await?;
        match Watch::open(&mut client, start).await {
            Ok(stream) => Ok(stream),
            Err(WatchError::Refused(status)) => Err(status_error(server, status)),
            Err(e) => Err(e.into()),
        }
    };
    let mut stream = server
        .within("the watch request", REQUEST_TIMEOUT, open)
        .await?;
    let liveness = (!args.liveness_timeout.is_zero()).then_some(args.liveness_timeout);
    let mut seen = Seen::new(args.from_revision);
    let mut stdout = std::io::stdout().lock();
    let ended = loop {
        let next = match liveness {
            Some(limit) => match tokio::time::timeout(limit, stream.next()).await {
                Ok(next) => next,
                Err(_) => break Ended::Silent(limit),
            },
            None => stream.next().await,
        };
        let event = match next {
            Ok(event) => event,
            Err(ended) => break Ended::Stream(ended),
        };
        seen.saw(&event);
        let lines = match event {
            WatchEvent::Init => vec![],
            WatchEvent::InitApply { revision, objects } => objects
                .iter()
                .map(|r| object_line(Action::Added, revision, r))
                .collect(),
            WatchEvent::Changes(changes) => changes
                .iter()
                .map(|c| object_line(c.action, c.revision, &c.resource))
                .collect(),
            WatchEvent::InitDone { revision, .. } | WatchEvent::Synced { revision, .. } => {
                vec![json!({"type": "SYNCED", "revision": revision})]
            }
            WatchEvent::Progress { revision } => {
                vec![json!({"type": "PROGRESS", "revision": revision})]
            }
        };
        for line in lines {
            writeln!(stdout, "{line}")?;
        }
        stdout.flush()?;
    };
    let why = match ended {
        Ended::Silent(limit) => format!(
            "the server at {server} sent nothing for {} (not even a progress marker): the watch is lost (the server is stopped or hung, or the network broke)",
            seconds(limit)
        ),
        Ended::Stream(ended) => {
            match &ended {
                WatchError::CutOff {
                    reason,
                    resume_revision,
                    ..
                } => {
                    cancelled_line(&mut stdout, *reason, *resume_revision, 0)?;
                    seen.resume_at(*resume_revision);
                }
                WatchError::Compacted {
                    compact_revision, ..
                } => {
                    cancelled_line(&mut stdout, CancelReason::Compacted, 0, *compact_revision)?;
                    seen.compacted();
                }
                _ => {}
            }
            match ended {
                WatchError::Failed(status) | WatchError::Refused(status) => {
                    format!("{:#}", status_error(server, status))
                }
                WatchError::Closed => format!("the server at {server} closed the watch"),
                ended => ended.to_string(),
            }
        }
    };
    eprintln!("error: {why}");
    eprintln!("{}", resume.hint(&seen));
    Err(Reported.into())
}

/// How the watch loop ended.
enum Ended {
    /// The server sent nothing for this long.
    Silent(Duration),
    /// The stream ended.
    Stream(WatchError),
}

/// What the stream has said, for where to resume it.
struct Seen {
    /// The revision from which a new watch loses nothing; `None` while a snapshot is incomplete
    /// (or the revision is compacted), when only a new snapshot will do.
    resume_from: Option<u64>,
    /// The newest revision seen (a change, SYNCED or PROGRESS).
    last: Option<u64>,
}

impl Seen {
    fn new(from_revision: u64) -> Seen {
        Seen {
            resume_from: (from_revision > 0).then_some(from_revision),
            last: None,
        }
    }

    /// Each change has a revision of its own, and markers say everything up to theirs was sent:
    /// after either, nothing before the next revision is missing. Snapshot objects say
    /// nothing until the snapshot is complete.
    fn saw(&mut self, event: &WatchEvent) {
        let revision = match event {
            WatchEvent::Init | WatchEvent::InitApply { .. } => return,
            WatchEvent::Changes(changes) => changes.iter().map(|c| c.revision).max(),
            WatchEvent::InitDone { revision, .. }
            | WatchEvent::Synced { revision, .. }
            | WatchEvent::Progress { revision } => Some(*revision),
        };
        if let Some(revision) = revision {
            self.last = Some(self.last.unwrap_or(0).max(revision));
            self.resume_from = Some(self.resume_from.unwrap_or(0).max(revision + 1));
        }
    }

    /// The store said where to resume.
    fn resume_at(&mut self, revision: u64) {
        if revision > 0 {
            self.resume_from = Some(revision);
        }
    }

    /// The store no longer has the changes asked for.
    fn compacted(&mut self) {
        self.resume_from = None;
    }
}

/// The command that resumes this watch.
struct Resume {
    command: String,
}

impl Resume {
    fn new(server: &crate::cli::Server, args: &WatchArgs) -> Resume {
        let mut command = format!("pasactl --server {} watch", quoted(&server.address));
        let flags = [
            ("--kind", &args.kinds),
            ("--namespace", &args.namespaces),
            ("--host", &args.hosts),
            ("--gateway", &args.gateways),
        ];
        for (flag, values) in flags {
            for v in values {
                command.push_str(&format!(" {flag} {}", quoted(v)));
            }
        }
        Resume { command }
    }

    /// Where the watch got to and how to go on from there.
    fn hint(&self, seen: &Seen) -> String {
        let last = match seen.last {
            Some(revision) => format!("the last revision seen was {revision}"),
            None => "no revision was seen".to_string(),
        };
        match seen.resume_from {
            Some(from) => format!(
                "{last}; to resume without losing a change, run: {} --from-revision {from}",
                self.command
            ),
            None => format!(
                "{last}, and the snapshot was not complete; to start over with a new one, run: {}",
                self.command
            ),
        }
    }
}

/// `value`, in single quotes when a shell would split or expand it.
fn quoted(value: &str) -> String {
    let plain = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./:,@=".contains(c));
    if plain && !value.is_empty() {
        value.to_string()
    } else {
        format!("'{}'", value.replace('\'', "'\\''"))
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

#[cfg(test)]
mod tests {
    use super::*;
    use pasa_proto::watch::Change;

    fn change(revision: u64) -> Change {
        Change {
            action: Action::Modified,
            revision,
            resource: Resource::default(),
            committed: None,
        }
    }

    fn args(from_revision: u64) -> WatchArgs {
        WatchArgs {
            kinds: vec!["vs".into()],
            namespaces: vec![],
            all_namespaces: false,
            output: Output::Json,
            hosts: vec!["*.shop.svc.cluster.local".into()],
            gateways: vec![],
            from_revision,
            liveness_timeout: Duration::from_secs(30),
        }
    }

    fn hint(from_revision: u64, events: &[WatchEvent]) -> String {
        let server = crate::cli::Server {
            address: "127.0.0.1:7400".into(),
            tls: None,
            request_timeout: None,
        };
        let mut seen = Seen::new(from_revision);
        for e in events {
            seen.saw(e);
        }
        Resume::new(&server, &args(from_revision)).hint(&seen)
    }

    #[test]
    fn a_broken_watch_says_where_to_resume() {
        let subscription = std::sync::Arc::new(Subscription::default());
        let events = [
            WatchEvent::Init,
            WatchEvent::InitDone {
                revision: 7,
                subscription,
            },
            WatchEvent::Changes(vec![change(8), change(9)]),
        ];
        assert_eq!(
            hint(0, &events),
            "the last revision seen was 9; to resume without losing a change, run: pasactl --server 127.0.0.1:7400 watch --kind vs --host '*.shop.svc.cluster.local' --from-revision 10"
        );
        // Progress says nothing selected changed up to its revision.
        let quiet = [WatchEvent::Progress { revision: 20 }];
        assert!(hint(5, &quiet).ends_with(" --from-revision 21"));
        // A resumed watch that heard nothing resumes where it started.
        assert!(hint(5, &[]).ends_with(" --from-revision 5"));
        // A snapshot cut short is not a place to resume from.
        let partial = [
            WatchEvent::Init,
            WatchEvent::InitApply {
                revision: 7,
                objects: vec![Resource::default()],
            },
        ];
        let text = hint(0, &partial);
        assert!(
            text.contains("snapshot was not complete") && !text.contains("--from-revision"),
            "{text}"
        );
    }
}
