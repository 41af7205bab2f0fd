//! Proxy status: what each agent last reported of its proxy's sync state, for
//! `pasactl proxy-status`.
//!
//! **In memory, not in the log.** Status is a live view, not configuration: a report costs a map
//! update under a short lock, never a durable write or a revision. Agents keep it cheap from their
//! side too: they report only when their status changes, at most once per interval, plus a
//! heartbeat (see the agent's `report` module).
//!
//! **Contact.** An entry is refreshed by each report on its agent's report stream. When the stream
//! ends, or no report arrives for three heartbeat intervals (a silent network partition leaves
//! the stream open), the entry shows as lost contact, and after the expiry
//! (`--proxy-status-expiry`) it is removed: agents that vanish expire. An agent that stops cleanly
//! says so in its last report (`stopping`), and its entry goes at once.
//!
//! **Bounded.** Each entry keeps at most [`MAX_CONNECTIONS`] connections and generators, and
//! texts (NACK errors, reasons, names) are cut at [`MAX_TEXT`] bytes.
//!
//! **Replicas.** Each store server knows only the agents reporting to it. On a shared backend
//! the replicas find each other through it ([`crate::peers`]), and a listing asked of one
//! gathers the others' (`local_only` asks for one server's own).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pasa_proto::store::v1::{
    ListProxyStatusRequest, NackInfo, ProxyStatus, ProxyStatusEntry, SyncState, TypeSyncStatus,
    XdsSyncStatus,
};
use tokio::sync::watch;

use crate::metrics::{Metrics, ProxyState, ProxyStateLabels};

/// Longest text kept from a report (NACK error, degraded reason, names); longer ones are cut.
pub const MAX_TEXT: usize = 4096;

/// Most connections (and generators) kept per proxy.
pub const MAX_CONNECTIONS: usize = 32;

/// The heartbeat assumed when a report does not say.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(30);

/// Missed heartbeats after which contact counts as lost while the stream still looks open.
const MISSED_HEARTBEATS: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("status: required in every report")]
    MissingStatus,
    #[error("status.node_id: required (the proxy's node ID `type~ip~id~domain`)")]
    MissingNodeId,
    #[error(
        "status.node_id: this report stream already reports {reported:?}; open one stream per proxy"
    )]
    NodeChanged { reported: String },
    #[error("the store is shutting down")]
    ShuttingDown,
}

struct Entry {
    status: ProxyStatus,
    /// The open report stream feeding this entry.
    stream: Option<u64>,
    last_report: Instant,
    /// When the report stream ended.
    closed_at: Option<Instant>,
    /// The class the metrics count this entry in.
    counted: ProxyState,
}

impl Entry {
    fn heartbeat(&self) -> Duration {
        match self.status.heartbeat_interval_ms {
            0 => DEFAULT_HEARTBEAT,
            ms => Duration::from_millis(u64::from(ms)),
        }
    }

    /// When contact was lost, if it was: the stream ended, or heartbeats stopped arriving.
    fn lost_at(&self, now: Instant) -> Option<Instant> {
        if self.stream.is_none() {
            return Some(self.closed_at.unwrap_or(self.last_report));
        }
        let silent_until = self.last_report + self.heartbeat() * MISSED_HEARTBEATS;
        (now >= silent_until).then_some(silent_until)
    }

    fn class(&self, now: Instant) -> ProxyState {
        if self.lost_at(now).is_some() {
            ProxyState::Disconnected
        } else if self.status.degraded {
            ProxyState::Degraded
        } else if worst(self.status.xds.as_ref()) == SyncState::Stale {
            ProxyState::Stale
        } else {
            ProxyState::Synced
        }
    }
}

/// The worst state over the types of `xds`.
fn worst(xds: Option<&XdsSyncStatus>) -> SyncState {
    let Some(xds) = xds else {
        return SyncState::NotSent;
    };
    SyncState::worst(
        [&xds.cds, &xds.lds, &xds.eds, &xds.rds, &xds.ecds].map(|t| {
            t.as_ref()
                .map_or(SyncState::NotSent, |t| SyncState::from_wire(t.state))
        }),
    )
}

#[derive(Default)]
struct Table {
    entries: HashMap<String, Entry>,
    next_stream: u64,
}

struct Shared {
    table: Mutex<Table>,
    expiry: Duration,
    metrics: Metrics,
    closing: watch::Sender<bool>,
}

/// The proxies reporting to this server. Cheap to clone (clones share the table).
#[derive(Clone)]
pub struct ProxyTable {
    shared: Arc<Shared>,
}

impl ProxyTable {
    /// A table removing proxies `expiry` after contact with them was lost.
    pub fn new(expiry: Duration, metrics: Metrics) -> ProxyTable {
        ProxyTable {
            shared: Arc::new(Shared {
                table: Mutex::new(Table::default()),
                expiry,
                metrics,
                closing: watch::Sender::new(false),
            }),
        }
    }

    pub fn expiry(&self) -> Duration {
        self.shared.expiry
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.shared
            .table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A new report stream. Its entry shows as lost contact once the returned handle is dropped.
    pub fn open_stream(&self) -> ReportStream {
        let mut table = self.table();
        table.next_stream += 1;
        ReportStream {
            table: self.clone(),
            id: table.next_stream,
            node_id: None,
        }
    }

    /// Resolves when the server is shutting down: report streams end then.
    pub async fn closing(&self) {
        let mut rx = self.shared.closing.subscribe();
        let _ = rx.wait_for(|closing| *closing).await;
    }

    /// Ends every report stream (the server is shutting down).
    pub fn close(&self) {
        self.shared.closing.send_replace(true);
    }

    fn recount(&self, entry: &mut Entry, now: Instant) {
        let class = entry.class(now);
        if class != entry.counted {
            self.shift(entry.counted, -1);
            self.shift(class, 1);
            entry.counted = class;
        }
    }

    fn shift(&self, state: ProxyState, by: i64) {
        self.shared
            .metrics
            .proxies
            .get_or_create(&ProxyStateLabels { state })
            .inc_by(by);
    }

    fn report_at(&self, stream: u64, status: ProxyStatus, now: Instant) {
        let status = bounded(status);
        let mut table = self.table();
        let key = status.node_id.clone();
        match table.entries.get_mut(&key) {
            Some(entry) => {
                entry.status = status;
                entry.stream = Some(stream);
                entry.last_report = now;
                entry.closed_at = None;
                self.recount(entry, now);
            }
            None => {
                let mut entry = Entry {
                    status,
                    stream: Some(stream),
                    last_report: now,
                    closed_at: None,
                    counted: ProxyState::Synced,
                };
                entry.counted = entry.class(now);
                self.shift(entry.counted, 1);
                table.entries.insert(key, entry);
            }
        }
        self.shared.metrics.proxy_reports.inc();
    }

    /// The agent reporting on `stream` stopped cleanly: its entry goes, unless another stream
    /// (a new agent for the same node) feeds it now.
    fn forget(&self, stream: u64, node_id: &str) {
        let mut table = self.table();
        if let Some(entry) = table.entries.get(node_id)
            && entry.stream.is_none_or(|s| s == stream)
        {
            self.shift(entry.counted, -1);
            table.entries.remove(node_id);
        }
    }

    fn closed_at(&self, stream: u64, node_id: &str, now: Instant) {
        let mut table = self.table();
        if let Some(entry) = table.entries.get_mut(node_id)
            && entry.stream == Some(stream)
        {
            entry.stream = None;
            entry.closed_at = Some(now);
            self.recount(entry, now);
        }
    }

    /// Removes the proxies lost for longer than the expiry, and brings the metrics up to date.
    pub fn sweep(&self) {
        self.sweep_at(Instant::now());
    }

    fn sweep_at(&self, now: Instant) {
        let expiry = self.shared.expiry;
        let mut table = self.table();
        table.entries.retain(|_, entry| {
            let expired = entry
                .lost_at(now)
                .is_some_and(|lost| now.saturating_duration_since(lost) >= expiry);
            if expired {
                self.shift(entry.counted, -1);
            } else {
                self.recount(entry, now);
            }
            !expired
        });
    }

    /// The proxies matching `filter`, by namespace, pod name and node ID.
    pub fn list(&self, filter: &ListProxyStatusRequest) -> Vec<ProxyStatusEntry> {
        self.list_at(filter, Instant::now())
    }

    fn list_at(&self, filter: &ListProxyStatusRequest, now: Instant) -> Vec<ProxyStatusEntry> {
        self.sweep_at(now);
        let table = self.table();
        let mut proxies: Vec<ProxyStatusEntry> = table
            .entries
            .values()
            .filter(|e| filter.namespace.is_empty() || e.status.namespace == filter.namespace)
            .filter(|e| filter.name.is_empty() || names(&e.status, &filter.name))
            .map(|e| {
                let lost = e.lost_at(now);
                let contact = e.closed_at.map_or(e.last_report, |c| c.max(e.last_report));
                ProxyStatusEntry {
                    status: Some(e.status.clone()),
                    connected: lost.is_none(),
                    last_contact_ms_ago: millis(now.saturating_duration_since(contact)),
                    lost_contact_ms_ago: lost
                        .map_or(0, |lost| millis(now.saturating_duration_since(lost))),
                }
            })
            .collect();
        drop(table);
        sort(&mut proxies);
        proxies
    }

    /// How many proxies are known.
    pub fn len(&self) -> usize {
        self.table().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Orders entries by namespace, then pod name, then node ID, as listings show them.
pub fn sort(entries: &mut [ProxyStatusEntry]) {
    entries.sort_by(|a, b| {
        let key = |e: &ProxyStatusEntry| {
            e.status
                .as_ref()
                .map(|s| (s.namespace.clone(), s.pod_name.clone(), s.node_id.clone()))
        };
        key(a).cmp(&key(b))
    });
}

/// Whether `name` names the proxy: its node ID, its pod name, or `pod.namespace`.
fn names(status: &ProxyStatus, name: &str) -> bool {
    status.node_id == name
        || status.pod_name == name
        || name
            .strip_prefix(status.pod_name.as_str())
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|ns| ns == status.namespace)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One agent's report stream. Dropping it marks its proxy as lost contact.
pub struct ReportStream {
    table: ProxyTable,
    id: u64,
    node_id: Option<String>,
}

impl ReportStream {
    /// Records one report.
    pub fn report(&mut self, status: Option<ProxyStatus>) -> Result<(), StatusError> {
        let status = status.ok_or(StatusError::MissingStatus)?;
        if status.node_id.is_empty() {
            return Err(StatusError::MissingNodeId);
        }
        match &self.node_id {
            Some(reported) if *reported != status.node_id => {
                return Err(StatusError::NodeChanged {
                    reported: reported.clone(),
                });
            }
            Some(_) => {}
            None => self.node_id = Some(status.node_id.clone()),
        }
        if status.stopping {
            self.table.forget(self.id, &status.node_id);
            return Ok(());
        }
        if *self.table.shared.closing.borrow() {
            return Err(StatusError::ShuttingDown);
        }
        self.table.report_at(self.id, status, Instant::now());
        Ok(())
    }
}

impl Drop for ReportStream {
    fn drop(&mut self) {
        if let Some(node_id) = &self.node_id {
            self.table.closed_at(self.id, node_id, Instant::now());
        }
    }
}

/// Cuts `text` to [`MAX_TEXT`] bytes on a character boundary, saying so.
fn cut(text: &mut String) {
    if text.len() <= MAX_TEXT {
        return;
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str("… (truncated)");
}

fn bound_type(t: &mut Option<TypeSyncStatus>) {
    if let Some(t) = t {
        cut(&mut t.version_sent);
        cut(&mut t.version_acked);
        if let Some(NackInfo { error, version, .. }) = &mut t.last_nack {
            cut(error);
            cut(version);
        }
    }
}

fn bound_xds(xds: &mut Option<XdsSyncStatus>) {
    if let Some(x) = xds {
        for t in [&mut x.cds, &mut x.lds, &mut x.eds, &mut x.rds, &mut x.ecds] {
            bound_type(t);
        }
    }
}

/// The report with every text and list cut to its bound.
fn bounded(mut status: ProxyStatus) -> ProxyStatus {
    for text in [
        &mut status.node_id,
        &mut status.pod_name,
        &mut status.namespace,
        &mut status.admin_address,
        &mut status.agent_version,
        &mut status.degraded_reason,
    ] {
        cut(text);
    }
    status.generators.truncate(MAX_CONNECTIONS);
    status.generators.iter_mut().for_each(cut);
    bound_xds(&mut status.xds);
    status.connections.truncate(MAX_CONNECTIONS);
    for conn in &mut status.connections {
        cut(&mut conn.node_id);
        cut(&mut conn.protocol);
        cut(&mut conn.generator);
        bound_xds(&mut conn.xds);
    }
    status
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;

    use super::*;

    fn status(node: &str, pod: &str, ns: &str) -> ProxyStatus {
        ProxyStatus {
            node_id: node.into(),
            pod_name: pod.into(),
            namespace: ns.into(),
            heartbeat_interval_ms: 1000,
            ..Default::default()
        }
    }

    fn synced() -> TypeSyncStatus {
        TypeSyncStatus {
            state: SyncState::Synced as i32,
            version_sent: "1".into(),
            version_acked: "1".into(),
            last_nack: None,
        }
    }

    fn metrics_text(metrics: &Metrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        text
    }

    fn all() -> ListProxyStatusRequest {
        ListProxyStatusRequest::default()
    }

    #[test]
    fn reports_are_listed_by_namespace_then_name_and_filtered() {
        let table = ProxyTable::new(Duration::from_secs(60), Metrics::new());
        let now = Instant::now();
        for (i, (pod, ns)) in [("web", "shop"), ("cart", "shop"), ("zeta", "auth")]
            .into_iter()
            .enumerate()
        {
            let node = format!("sidecar~10.0.0.{i}~{pod}.{ns}~{ns}.svc.cluster.local");
            table.report_at(i as u64, status(&node, pod, ns), now);
        }
        let listed: Vec<String> = table
            .list_at(&all(), now)
            .iter()
            .map(|e| e.status.as_ref().unwrap().pod_name.clone())
            .collect();
        assert_eq!(listed, ["zeta", "cart", "web"]);
        let by_ns = ListProxyStatusRequest {
            namespace: "shop".into(),
            ..all()
        };
        assert_eq!(table.list_at(&by_ns, now).len(), 2);
        for name in [
            "cart.shop",
            "cart",
            "sidecar~10.0.0.1~cart.shop~shop.svc.cluster.local",
        ] {
            let one = ListProxyStatusRequest {
                name: name.into(),
                ..all()
            };
            let found = table.list_at(&one, now);
            assert_eq!(found.len(), 1, "{name}");
            assert!(found[0].connected);
        }
        let none = ListProxyStatusRequest {
            name: "cart.auth".into(),
            ..all()
        };
        assert!(table.list_at(&none, now).is_empty());
    }

    #[test]
    fn a_closed_stream_is_lost_contact_then_expires() {
        let metrics = Metrics::new();
        let table = ProxyTable::new(Duration::from_secs(60), metrics.clone());
        let mut stream = table.open_stream();
        stream
            .report(Some(status("router~1~gw.ns~ns", "gw", "ns")))
            .unwrap();
        assert!(metrics_text(&metrics).contains("pasa_store_proxies{state=\"synced\"} 1"));
        drop(stream);
        let now = Instant::now();
        let listed = table.list_at(&all(), now);
        assert!(!listed[0].connected);
        assert!(metrics_text(&metrics).contains("pasa_store_proxies{state=\"disconnected\"} 1"));
        assert!(metrics_text(&metrics).contains("pasa_store_proxies{state=\"synced\"} 0"));
        assert_eq!(
            table.list_at(&all(), now + Duration::from_secs(59)).len(),
            1
        );
        assert!(
            table
                .list_at(&all(), now + Duration::from_secs(61))
                .is_empty()
        );
        assert!(metrics_text(&metrics).contains("pasa_store_proxies{state=\"disconnected\"} 0"));
    }

    #[test]
    fn silence_past_three_heartbeats_is_lost_contact_though_the_stream_is_open() {
        let table = ProxyTable::new(Duration::from_secs(60), Metrics::new());
        let now = Instant::now();
        table.report_at(1, status("n", "p", "ns"), now);
        assert!(table.list_at(&all(), now + Duration::from_millis(2900))[0].connected);
        let late = table.list_at(&all(), now + Duration::from_secs(5));
        assert!(!late[0].connected);
        assert_eq!(late[0].lost_contact_ms_ago, 2000);
        // A new report restores contact.
        table.report_at(1, status("n", "p", "ns"), now + Duration::from_secs(6));
        assert!(table.list_at(&all(), now + Duration::from_secs(6))[0].connected);
    }

    #[test]
    fn a_reconnected_agent_is_not_lost_when_its_old_stream_ends_late() {
        let table = ProxyTable::new(Duration::from_secs(60), Metrics::new());
        let mut old = table.open_stream();
        old.report(Some(status("n", "p", "ns"))).unwrap();
        let mut new = table.open_stream();
        new.report(Some(status("n", "p", "ns"))).unwrap();
        drop(old);
        assert!(table.list(&all())[0].connected);
        drop(new);
        assert!(!table.list(&all())[0].connected);
    }

    #[test]
    fn a_stopping_agent_is_forgotten_at_once_and_a_killed_one_is_not() {
        let metrics = Metrics::new();
        let table = ProxyTable::new(Duration::from_secs(300), metrics.clone());
        let mut leaving = table.open_stream();
        leaving.report(Some(status("a", "a", "ns"))).unwrap();
        let mut killed = table.open_stream();
        killed.report(Some(status("b", "b", "ns"))).unwrap();
        let goodbye = ProxyStatus {
            stopping: true,
            ..status("a", "a", "ns")
        };
        leaving.report(Some(goodbye)).unwrap();
        drop(leaving);
        drop(killed);
        let listed = table.list(&all());
        assert_eq!(listed.len(), 1, "only the killed agent is left");
        assert_eq!(listed[0].status.as_ref().unwrap().node_id, "b");
        assert!(!listed[0].connected);
        let text = metrics_text(&metrics);
        assert!(
            text.contains("pasa_store_proxies{state=\"synced\"} 0")
                && text.contains("pasa_store_proxies{state=\"disconnected\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn a_goodbye_on_an_old_stream_leaves_the_new_agents_entry() {
        let table = ProxyTable::new(Duration::from_secs(300), Metrics::new());
        let mut old = table.open_stream();
        old.report(Some(status("n", "p", "ns"))).unwrap();
        let mut new = table.open_stream();
        new.report(Some(status("n", "p", "ns"))).unwrap();
        old.report(Some(ProxyStatus {
            stopping: true,
            ..status("n", "p", "ns")
        }))
        .unwrap();
        let listed = table.list(&all());
        assert_eq!(listed.len(), 1);
        assert!(listed[0].connected);
    }

    #[test]
    fn classes_follow_degraded_and_stale() {
        let metrics = Metrics::new();
        let table = ProxyTable::new(Duration::from_secs(60), metrics.clone());
        let now = Instant::now();
        let mut stale = status("a", "a", "ns");
        stale.xds = Some(XdsSyncStatus {
            cds: Some(synced()),
            lds: Some(TypeSyncStatus {
                state: SyncState::Stale as i32,
                ..synced()
            }),
            ..Default::default()
        });
        table.report_at(1, stale, now);
        let mut degraded = status("b", "b", "ns");
        degraded.degraded = true;
        table.report_at(2, degraded, now);
        let text = metrics_text(&metrics);
        assert!(
            text.contains("pasa_store_proxies{state=\"stale\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("pasa_store_proxies{state=\"degraded\"} 1"),
            "{text}"
        );
        assert!(text.contains("pasa_store_proxy_reports_total 2"), "{text}");
    }

    #[test]
    fn long_texts_and_many_connections_are_bounded() {
        let table = ProxyTable::new(Duration::from_secs(60), Metrics::new());
        let mut s = status("n", "p", "ns");
        let mut lds = synced();
        lds.last_nack = Some(NackInfo {
            error: "é".repeat(10 * MAX_TEXT),
            version: "2".into(),
            time_unix_ms: 1,
        });
        s.xds = Some(XdsSyncStatus {
            lds: Some(lds),
            ..Default::default()
        });
        s.connections = vec![Default::default(); 10 * MAX_CONNECTIONS];
        table.report_at(1, s, Instant::now());
        let listed = table.list(&all());
        let kept = listed[0].status.as_ref().unwrap();
        let error = &kept.xds.as_ref().unwrap().lds.as_ref().unwrap();
        let error = &error.last_nack.as_ref().unwrap().error;
        assert!(error.len() <= MAX_TEXT + 20);
        assert!(error.ends_with("(truncated)"));
        assert_eq!(kept.connections.len(), MAX_CONNECTIONS);
    }

    #[test]
    fn reports_are_refused_without_a_node_or_with_another_node() {
        let table = ProxyTable::new(Duration::from_secs(60), Metrics::new());
        let mut stream = table.open_stream();
        assert!(matches!(
            stream.report(None),
            Err(StatusError::MissingStatus)
        ));
        assert!(matches!(
            stream.report(Some(status("", "p", "ns"))),
            Err(StatusError::MissingNodeId)
        ));
        stream.report(Some(status("a", "p", "ns"))).unwrap();
        let err = stream.report(Some(status("b", "p", "ns"))).unwrap_err();
        assert!(err.to_string().contains("status.node_id"));
        table.close();
        assert!(matches!(
            stream.report(Some(status("a", "p", "ns"))),
            Err(StatusError::ShuttingDown)
        ));
    }
}
