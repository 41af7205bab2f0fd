//! Reporting the proxy's sync state to the store, for `pasactl proxy-status`: per xDS type
//! SYNCED / STALE / NOT SENT (worst over the connections), versions, the last NACK, the applied
//! revision and whether the agent is degraded.
//!
//! **Cheap at scale.** A proxy ACKs every push, so a report per ACK would cost the store a message
//! per push per proxy. Instead the reporter watches the connections' status, the store link and
//! the applied revision, and sends a report only when what it would say changed, at most once
//! per `--status-interval` (default 1 s), plus a heartbeat every `--status-heartbeat` (default
//! 30 s) so the store can tell a silent agent from a healthy idle one.
//!
//! **Never in the way.** Reporting runs in its own task on its own store connection. When the
//! store is away it reconnects with backoff; ADS serving never waits for it.
//!
//! **Goodbye.** An agent that stops cleanly (SIGTERM) ends with a last report marked `stopping`,
//! and the store forgets its proxy at once; one that is killed says nothing and shows as lost
//! contact until the store's expiry.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pasa_istio::node::ProxyType as NodeProxyType;
use pasa_proto::store::v1::{
    NackInfo, ProxyConnection, ProxyStatus, ProxyType, ReportStatusRequest, SyncState,
    TypeSyncStatus, XdsSyncStatus,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

use crate::ads::{self, ConnectionStatus, TypeStatus};
use crate::follow::{Link, store_backoff};
use crate::identity::Identity;
use crate::resource::TypeKind;
use pasa_runtime::backoff::Backoff;

/// The command-line options of status reporting.
#[derive(clap::Args, Debug, Clone)]
pub struct ReportArgs {
    /// Least time between two status reports to the store: changes within it are sent together
    /// (`500ms`, `1s`, ...).
    #[arg(long, env = "PASA_STATUS_INTERVAL", default_value = "1s", value_parser = pasa_proto::duration::parse)]
    pub status_interval: Duration,
    /// How often a status report is sent when nothing changes; the store counts contact as lost
    /// after three missed heartbeats.
    #[arg(long, env = "PASA_STATUS_HEARTBEAT", default_value = "30s", value_parser = pasa_proto::duration::parse)]
    pub status_heartbeat: Duration,
}

/// Who the reports are about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reporter {
    pub node_id: String,
    pub pod_name: String,
    pub namespace: String,
    pub proxy_type: ProxyType,
    /// Where the agent's admin endpoint answers.
    pub admin_address: String,
    pub heartbeat: Duration,
}

impl Reporter {
    /// The reporter for `identity`, with the admin endpoint bound at `admin`. An admin endpoint
    /// on every address is reported at the proxy's IP.
    pub fn new(identity: &Identity, admin: SocketAddr, heartbeat: Duration) -> Reporter {
        let admin_address = if admin.ip().is_unspecified() {
            SocketAddr::new(identity.node.ip, admin.port())
        } else {
            admin
        };
        Reporter {
            node_id: identity.node.to_string(),
            pod_name: identity.pod_name.clone(),
            namespace: identity.namespace.clone(),
            proxy_type: match identity.node.proxy_type {
                NodeProxyType::Sidecar => ProxyType::Sidecar,
                NodeProxyType::Router => ProxyType::Router,
            },
            admin_address: admin_address.to_string(),
            heartbeat,
        }
    }

    /// The report for the current state.
    pub fn status(
        &self,
        connections: &BTreeMap<u64, ConnectionStatus>,
        link: &Link,
        applied_revision: u64,
        degraded_since: Option<SystemTime>,
    ) -> ProxyStatus {
        let mut generators: Vec<String> = connections
            .values()
            .filter_map(|c| c.generator.map(|g| g.name().to_owned()))
            .collect();
        generators.sort();
        generators.dedup();
        let (degraded, degraded_reason) = match link {
            Link::Degraded(reason) => (true, reason.clone()),
            Link::Connecting | Link::Synced => (false, String::new()),
        };
        let per_type = |kind: TypeKind| {
            worst(
                connections
                    .values()
                    .map(|c| type_status(c.types.get(&kind))),
            )
        };
        ProxyStatus {
            node_id: self.node_id.clone(),
            pod_name: self.pod_name.clone(),
            namespace: self.namespace.clone(),
            proxy_type: self.proxy_type as i32,
            generators,
            admin_address: self.admin_address.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            applied_revision,
            degraded,
            degraded_reason,
            degraded_since_unix_ms: degraded_since.filter(|_| degraded).map_or(0, unix_ms),
            xds: Some(xds(per_type)),
            connections: connections
                .values()
                .map(|c| ProxyConnection {
                    id: c.id,
                    node_id: c.node_id.clone(),
                    protocol: c.protocol.to_string(),
                    generator: c.generator.map(|g| g.name().to_owned()).unwrap_or_default(),
                    xds: Some(xds(|kind| type_status(c.types.get(&kind)))),
                })
                .collect(),
            heartbeat_interval_ms: u32::try_from(self.heartbeat.as_millis()).unwrap_or(u32::MAX),
            stopping: false,
            // Set by the caller, which knows what the proxy learned (see `Sources::status`).
            scope: String::new(),
            learned_hosts: 0,
        }
    }
}

fn xds(mut of: impl FnMut(TypeKind) -> TypeSyncStatus) -> XdsSyncStatus {
    XdsSyncStatus {
        cds: Some(of(TypeKind::Cluster)),
        lds: Some(of(TypeKind::Listener)),
        eds: Some(of(TypeKind::Endpoint)),
        rds: Some(of(TypeKind::Route)),
        ecds: Some(of(TypeKind::ExtensionConfig)),
    }
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn type_status(status: Option<&TypeStatus>) -> TypeSyncStatus {
    let Some(t) = status else {
        return TypeSyncStatus {
            state: SyncState::NotSent as i32,
            ..Default::default()
        };
    };
    TypeSyncStatus {
        state: match t.state() {
            ads::SyncState::Synced => SyncState::Synced,
            ads::SyncState::Stale => SyncState::Stale,
            ads::SyncState::NotSent => SyncState::NotSent,
        } as i32,
        version_sent: t.sent_version.clone().unwrap_or_default(),
        version_acked: t.acked_version.clone().unwrap_or_default(),
        last_nack: t.last_nack.as_ref().map(|n| NackInfo {
            error: n.error.clone(),
            version: n.version.clone(),
            time_unix_ms: unix_ms(n.at),
        }),
    }
}

/// One type over several connections: the worst state wins (STALE, then SYNCED, then NOT SENT)
/// with its versions; the latest NACK of any connection.
fn worst(all: impl Iterator<Item = TypeSyncStatus>) -> TypeSyncStatus {
    let mut out: Option<TypeSyncStatus> = None;
    let mut latest_nack: Option<NackInfo> = None;
    for t in all {
        if let Some(n) = &t.last_nack
            && latest_nack
                .as_ref()
                .is_none_or(|l| l.time_unix_ms < n.time_unix_ms)
        {
            latest_nack = Some(n.clone());
        }
        let severity = |state| SyncState::from_wire(state).severity();
        if out
            .as_ref()
            .is_none_or(|o| severity(t.state) > severity(o.state))
        {
            out = Some(t);
        }
    }
    let mut out = out.unwrap_or(TypeSyncStatus {
        state: SyncState::NotSent as i32,
        ..Default::default()
    });
    out.last_nack = latest_nack;
    out
}

/// When to send: a changed status at most once per interval, an unchanged one every heartbeat.
#[derive(Debug)]
struct Coalescer {
    interval: Duration,
    heartbeat: Duration,
    last: Option<(Instant, ProxyStatus)>,
}

impl Coalescer {
    fn new(interval: Duration, heartbeat: Duration) -> Coalescer {
        Coalescer {
            interval,
            heartbeat: heartbeat.max(interval),
            last: None,
        }
    }

    /// A changed status may go out now.
    fn may_send(&self, now: Instant) -> bool {
        self.last
            .as_ref()
            .is_none_or(|(at, _)| now >= *at + self.interval)
    }

    fn heartbeat_due(&self, now: Instant) -> bool {
        self.last
            .as_ref()
            .is_some_and(|(at, _)| now >= *at + self.heartbeat)
    }

    /// Whether `current` goes out at `now` (the caller has checked [`Coalescer::may_send`] or
    /// [`Coalescer::heartbeat_due`]).
    fn worth_sending(&self, current: &ProxyStatus, now: Instant) -> bool {
        match &self.last {
            None => true,
            Some((_, last)) => last != current || self.heartbeat_due(now),
        }
    }

    fn sent(&mut self, status: ProxyStatus, now: Instant) {
        self.last = Some((now, status));
    }

    /// The status could not go out now: send whatever is current after the interval.
    fn deferred(&mut self, now: Instant) {
        // No real status equals the empty one, so the next look sends.
        self.last = Some((now, ProxyStatus::default()));
    }

    /// When to look again: when a change may go out (`dirty`), or when the heartbeat is due.
    fn wake(&self, dirty: bool, now: Instant) -> Instant {
        match &self.last {
            None => now,
            Some((at, _)) if dirty => *at + self.interval,
            Some((at, _)) => *at + self.heartbeat,
        }
    }

    /// A new stream: the next status goes out at once.
    fn reset(&mut self) {
        self.last = None;
    }
}

/// What the reports are made of.
pub struct Sources {
    pub connections: watch::Receiver<BTreeMap<u64, ConnectionStatus>>,
    pub link: watch::Receiver<Link>,
    /// The revision of the configuration the agent serves.
    pub applied: watch::Receiver<u64>,
    /// Turns true when the agent stops cleanly (before the stop signal): reporting then ends
    /// with a goodbye.
    pub leaving: watch::Receiver<bool>,
    /// What an on-demand proxy has learned (`None` for the eager scope).
    pub learned: Option<watch::Receiver<crate::on_demand::Generation>>,
}

impl Sources {
    /// The report for the current state (see [`Reporter::status`]), with the proxy's scope.
    fn status(&self, reporter: &Reporter, degraded_since: Option<SystemTime>) -> ProxyStatus {
        let mut status = reporter.status(
            &self.connections.borrow(),
            &self.link.borrow(),
            *self.applied.borrow(),
            degraded_since,
        );
        match &self.learned {
            Some(learned) => {
                status.scope = "on-demand".into();
                status.learned_hosts =
                    u32::try_from(learned.borrow().hosts.len()).unwrap_or(u32::MAX);
            }
            None => status.scope = "eager".into(),
        }
        status
    }
}

/// How long the goodbye may take to reach the store when the agent stops.
const GOODBYE_DEADLINE: Duration = Duration::from_secs(2);

/// How a report stream ended.
enum Ended {
    /// The agent stops.
    Stopped,
    /// The stream broke (why); reporting resumes on a new one.
    Lost(String),
}

/// Reports to the store servers (one at a time) until `stop` turns true.
pub async fn report(
    servers: pasa_proto::client::Servers,
    reporter: Reporter,
    args: ReportArgs,
    mut sources: Sources,
    mut stop: watch::Receiver<bool>,
) {
    let mut coalescer = Coalescer::new(args.status_interval, args.status_heartbeat);
    let mut backoff = store_backoff();
    let mut degraded_since = degraded_now(&sources.link.borrow(), None);
    // Each report stream runs in a span of its own (`status_report`, with its attempt number).
    let mut attempt: u64 = 0;
    loop {
        attempt += 1;
        let span = tracing::info_span!("status_report", server = %servers.current(), attempt);
        let reporting = stream(
            &servers,
            &reporter,
            &mut coalescer,
            &mut sources,
            &mut degraded_since,
            &mut backoff,
            &mut stop,
        )
        .instrument(span);
        let ended = match reporting.await {
            Ended::Stopped => return,
            Ended::Lost(why) => why,
        };
        tracing::debug!(reason = %ended, "status reports to the store ended; reconnecting");
        coalescer.reset();
        let wait = backoff.failed();
        let sleep = tokio::time::sleep(wait);
        tokio::pin!(sleep);
        // Keep track of when the agent became degraded while waiting.
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = &mut sleep => break,
                changed = sources.link.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    degraded_since = degraded_now(&sources.link.borrow_and_update(), degraded_since);
                }
            }
        }
    }
}

/// When the agent became degraded, given the link now and what was known before.
fn degraded_now(link: &Link, before: Option<SystemTime>) -> Option<SystemTime> {
    match link {
        Link::Degraded(_) => Some(before.unwrap_or_else(SystemTime::now)),
        Link::Connecting | Link::Synced => None,
    }
}

/// One report stream, until it breaks or `stop` turns true (then with a goodbye when the agent
/// is leaving); says how it ended.
async fn stream(
    servers: &pasa_proto::client::Servers,
    reporter: &Reporter,
    coalescer: &mut Coalescer,
    sources: &mut Sources,
    degraded_since: &mut Option<SystemTime>,
    backoff: &mut Backoff,
    stop: &mut watch::Receiver<bool>,
) -> Ended {
    let server = servers.current().to_string();
    let connected = tokio::select! {
        _ = stop.wait_for(|s| *s) => return Ended::Stopped,
        connected = servers.connect(&server) => connected,
    };
    let mut client = match connected {
        Ok(client) => client,
        Err(e) => {
            servers.failed(&server);
            return Ended::Lost(crate::follow::server_problem(&e));
        }
    };
    // Recovered only once the stream has lasted: a store that accepts and then fails is not
    // retried every 100 ms.
    backoff.up();
    let (tx, rx) = mpsc::channel(1);
    let call = client.report_status(ReceiverStream::new(rx));
    tokio::pin!(call);
    let mut dirty = true;
    loop {
        let now = Instant::now();
        if (dirty && coalescer.may_send(now)) || coalescer.heartbeat_due(now) {
            sources.connections.borrow_and_update();
            sources.link.borrow_and_update();
            sources.applied.borrow_and_update();
            let current = sources.status(reporter, *degraded_since);
            dirty = false;
            if coalescer.worth_sending(&current, now) {
                let request = ReportStatusRequest {
                    status: Some(current.clone()),
                };
                match tx.try_send(request) {
                    Ok(()) => coalescer.sent(current, now),
                    // The last report is still on its way: try again after the interval.
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        dirty = true;
                        coalescer.deferred(now);
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        return Ended::Lost("the report stream closed".into());
                    }
                }
            }
            continue;
        }
        let wake = coalescer.wake(dirty, now);
        tokio::select! {
            // Leaving is told before the agent takes its parts down (translation, ADS, the
            // store watch), which would otherwise end the stream first as lost.
            biased;
            left = async { sources.leaving.wait_for(|l| *l).await.is_ok() } => {
                if left {
                    let last = last_report(reporter, sources, *degraded_since);
                    goodbye(tx, call, last).await;
                }
                return Ended::Stopped;
            }
            // (The guard `wait_for` gives is let go at once: the goodbye below awaits.)
            () = async { drop(stop.wait_for(|s| *s).await) } => {
                if *sources.leaving.borrow() {
                    let last = last_report(reporter, sources, *degraded_since);
                    goodbye(tx, call, last).await;
                }
                return Ended::Stopped;
            }
            answer = &mut call => {
                return Ended::Lost(match answer {
                    Ok(_) => "the store ended the report stream".into(),
                    Err(status) => format!("reporting failed: {}", status.message()),
                });
            }
            () = tokio::time::sleep_until(wake) => {}
            changed = sources.connections.changed() => {
                if changed.is_err() {
                    return Ended::Lost("the ADS server stopped".into());
                }
                dirty = true;
            }
            changed = sources.link.changed() => {
                if changed.is_err() {
                    return Ended::Lost("the store watch stopped".into());
                }
                *degraded_since = degraded_now(&sources.link.borrow(), *degraded_since);
                dirty = true;
            }
            changed = sources.applied.changed() => {
                if changed.is_err() {
                    return Ended::Lost("translation stopped".into());
                }
                dirty = true;
            }
            () = crate::on_demand::changed(&mut sources.learned) => dirty = true,
        }
    }
}

/// The agent's last report, marked `stopping`.
fn last_report(
    reporter: &Reporter,
    sources: &Sources,
    degraded_since: Option<SystemTime>,
) -> ProxyStatus {
    let mut last = sources.status(reporter, degraded_since);
    last.stopping = true;
    last
}

/// Sends `last` (marked `stopping`) on the stream, closes it and waits for the store's answer,
/// which comes once it has read the goodbye; within [`GOODBYE_DEADLINE`], after which the
/// proxy is left to show as lost contact.
async fn goodbye<F, T>(
    tx: mpsc::Sender<ReportStatusRequest>,
    call: std::pin::Pin<&mut F>,
    last: ProxyStatus,
) where
    F: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let said = tokio::time::timeout(GOODBYE_DEADLINE, async move {
        // The last report may still be on its way: the goodbye waits for room behind it.
        tx.send(ReportStatusRequest { status: Some(last) })
            .await
            .map_err(|_| "the report stream closed".to_string())?;
        drop(tx);
        call.await
            .map(drop)
            .map_err(|status| format!("the store answered: {}", status.message()))
    })
    .await;
    match said {
        Ok(Ok(())) => tracing::info!("told the store this proxy is stopping"),
        Ok(Err(why)) => {
            tracing::info!(reason = %why, "the store did not take the goodbye; the proxy shows as lost contact until it expires")
        }
        Err(_) => {
            tracing::info!(deadline = ?GOODBYE_DEADLINE, "the goodbye did not reach the store in time; the proxy shows as lost contact until it expires")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ads::{Nack, Protocol};
    use crate::model::proxy::Generator;

    fn reporter() -> Reporter {
        let identity = crate::identity::IdentityArgs {
            node_id: "sidecar~10.0.0.7~web-1.shop~shop.svc.cluster.local".into(),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        Reporter::new(
            &identity,
            "0.0.0.0:15000".parse().unwrap(),
            Duration::from_secs(30),
        )
    }

    fn conn(id: u64, types: &[(TypeKind, TypeStatus)]) -> ConnectionStatus {
        ConnectionStatus {
            id,
            node_id: "n".into(),
            protocol: Protocol::Sotw,
            generator: Some(Generator::Envoy),
            types: types.iter().cloned().collect(),
        }
    }

    fn synced(version: &str) -> TypeStatus {
        TypeStatus {
            sent_version: Some(version.into()),
            sent_nonce: Some("1".into()),
            acked_version: Some(version.into()),
            last_nack: None,
            acked_latest: true,
        }
    }

    #[test]
    fn types_aggregate_worst_first_with_the_latest_nack() {
        let nacked = TypeStatus {
            acked_latest: false,
            sent_version: Some("2".into()),
            last_nack: Some(Nack {
                version: "2".into(),
                nonce: "2".into(),
                error: "bad listener".into(),
                at: UNIX_EPOCH + Duration::from_secs(5),
            }),
            ..synced("1")
        };
        let connections: BTreeMap<u64, ConnectionStatus> = [
            conn(
                1,
                &[
                    (TypeKind::Cluster, synced("c1")),
                    (TypeKind::Listener, synced("l1")),
                ],
            ),
            conn(
                2,
                &[
                    (TypeKind::Cluster, synced("c1")),
                    (TypeKind::Listener, nacked),
                ],
            ),
        ]
        .into_iter()
        .map(|c| (c.id, c))
        .collect();
        let status = reporter().status(&connections, &Link::Synced, 7, None);
        assert_eq!(status.pod_name, "web-1");
        assert_eq!(status.namespace, "shop");
        assert_eq!(status.admin_address, "10.0.0.7:15000");
        assert_eq!(status.generators, ["envoy"]);
        assert_eq!(status.applied_revision, 7);
        let xds = status.xds.unwrap();
        assert_eq!(xds.cds.unwrap().state, SyncState::Synced as i32);
        assert_eq!(xds.eds.unwrap().state, SyncState::NotSent as i32);
        let lds = xds.lds.unwrap();
        assert_eq!(lds.state, SyncState::Stale as i32);
        assert_eq!(lds.version_sent, "2");
        assert_eq!(lds.version_acked, "1");
        let nack = lds.last_nack.unwrap();
        assert_eq!(nack.error, "bad listener");
        assert_eq!(nack.time_unix_ms, 5000);
        assert_eq!(status.connections.len(), 2);
    }

    #[test]
    fn degraded_carries_its_reason_and_since() {
        let since = UNIX_EPOCH + Duration::from_secs(100);
        let link = Link::Degraded("cannot reach the store".into());
        let status = reporter().status(&BTreeMap::new(), &link, 3, Some(since));
        assert!(status.degraded);
        assert_eq!(status.degraded_reason, "cannot reach the store");
        assert_eq!(status.degraded_since_unix_ms, 100_000);
        let xds = status.xds.unwrap();
        assert_eq!(xds.cds.unwrap().state, SyncState::NotSent as i32);
        assert_eq!(degraded_now(&link, Some(since)), Some(since));
        assert_eq!(degraded_now(&Link::Synced, Some(since)), None);
    }

    fn with_revision(revision: u64) -> ProxyStatus {
        ProxyStatus {
            applied_revision: revision,
            ..Default::default()
        }
    }

    #[test]
    fn changes_are_coalesced_to_one_report_per_interval_plus_heartbeats() {
        let interval = Duration::from_secs(1);
        let mut c = Coalescer::new(interval, Duration::from_secs(30));
        let t0 = Instant::now();
        // The first status goes out at once.
        assert!(c.may_send(t0));
        assert!(c.worth_sending(&with_revision(1), t0));
        c.sent(with_revision(1), t0);
        // Changes within the interval wait for it.
        let t1 = t0 + Duration::from_millis(300);
        assert!(!c.may_send(t1));
        assert_eq!(c.wake(true, t1), t0 + interval);
        // At the interval, only the latest of them goes out, once.
        let t2 = t0 + interval;
        assert!(c.may_send(t2));
        assert!(c.worth_sending(&with_revision(3), t2));
        c.sent(with_revision(3), t2);
        // A change that came back to what was sent is not sent again.
        let t3 = t2 + interval;
        assert!(!c.worth_sending(&with_revision(3), t3));
        // Nothing changes: the next wake is the heartbeat, which sends the same status again.
        assert_eq!(c.wake(false, t3), t2 + Duration::from_secs(30));
        let t4 = t2 + Duration::from_secs(30);
        assert!(c.heartbeat_due(t4));
        assert!(c.worth_sending(&with_revision(3), t4));
        // A new stream sends at once.
        c.reset();
        assert!(c.may_send(t4));
        assert_eq!(c.wake(false, t4), t4);
    }
}
