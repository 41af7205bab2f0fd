//! The store's Prometheus metrics.

use std::fmt::Write as _;

use pasa_proto::Kind;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A resource kind as a label value.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct KindValue(pub Kind);

impl EncodeLabelValue for KindValue {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.0.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: KindValue,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum CutOffReason {
    SlowConsumer,
    Compacted,
    Shutdown,
    /// The store rebuilt its in-memory state: after a panic held it, or (a replica on a shared
    /// backend) after it fell behind the change log's compaction.
    Reset,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: CutOffReason,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum WriteOp {
    Apply,
    Delete,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: WriteOp,
}

/// How a proxy stands, as `pasa_store_proxies` counts it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ProxyState {
    /// Every type SYNCED or NOT SENT.
    Synced,
    /// Some type STALE (not ACKed yet, or NACKed).
    Stale,
    /// The agent serves its cache without the store.
    Degraded,
    /// The report stream ended or heartbeats stopped.
    Disconnected,
}

impl EncodeLabelValue for ProxyState {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            ProxyState::Synced => "synced",
            ProxyState::Stale => "stale",
            ProxyState::Degraded => "degraded",
            ProxyState::Disconnected => "disconnected",
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyStateLabels {
    pub state: ProxyState,
}

/// Every metric the store exports; cheap to clone (handles share their values).
#[derive(Clone)]
pub struct Metrics {
    pub revision: Gauge,
    pub compact_revision: Gauge,
    pub objects: Family<KindLabels, Gauge>,
    pub subscriptions: Gauge,
    pub watch_streams: Gauge,
    pub events_sent: Counter,
    pub watchers_cut_off: Family<ReasonLabels, Counter>,
    pub write_duration: Family<OpLabels, Histogram>,
    pub match_duration: Histogram,
    pub written_resources: Counter,
    pub write_conflicts: Counter,
    pub proxies: Family<ProxyStateLabels, Gauge>,
    pub proxy_reports: Counter,
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            revision: Gauge::default(),
            compact_revision: Gauge::default(),
            objects: Family::default(),
            subscriptions: Gauge::default(),
            watch_streams: Gauge::default(),
            events_sent: Counter::default(),
            watchers_cut_off: Family::default(),
            write_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0001, 2.0, 16))
            }),
            match_duration: Histogram::new(exponential_buckets(0.000_001, 2.0, 18)),
            written_resources: Counter::default(),
            write_conflicts: Counter::default(),
            proxies: Family::default(),
            proxy_reports: Counter::default(),
        }
    }

    /// Registers every metric under the `pasa_store` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("pasa_store");
        r.register("revision", "Current store revision", self.revision.clone());
        r.register(
            "compact_revision",
            "Change-log entries at or below this revision are compacted",
            self.compact_revision.clone(),
        );
        r.register("objects", "Stored objects per kind", self.objects.clone());
        r.register(
            "subscriptions",
            "Open watch subscriptions",
            self.subscriptions.clone(),
        );
        r.register(
            "watch_streams",
            "Watch streams being served, including cut-off ones until their task has ended",
            self.watch_streams.clone(),
        );
        r.register(
            "watch_events_sent",
            "Events sent to watchers",
            self.events_sent.clone(),
        );
        r.register(
            "watchers_cut_off",
            "Watch streams the store ended, by reason",
            self.watchers_cut_off.clone(),
        );
        r.register(
            "write_duration_seconds",
            "Time from a write request reaching the writer to its durable commit",
            self.write_duration.clone(),
        );
        r.register(
            "match_duration_seconds",
            "Time to find the subscriptions one changed object matches",
            self.match_duration.clone(),
        );
        r.register(
            "written_resources",
            "Resources created, changed or deleted",
            self.written_resources.clone(),
        );
        r.register(
            "write_conflicts",
            "Writes planned again because another store replica wrote first (shared backends only)",
            self.write_conflicts.clone(),
        );
        r.register(
            "proxies",
            "Proxies whose agents report to this server, by state",
            self.proxies.clone(),
        );
        r.register(
            "proxy_reports",
            "Status reports received from agents",
            self.proxy_reports.clone(),
        );
    }

    pub fn cut_off(&self, reason: CutOffReason) {
        self.watchers_cut_off
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
