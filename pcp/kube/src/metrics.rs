//! The syncer's Prometheus metrics: store writes by result, lists (a watcher that lists again
//! after its start was cut off or compacted away), watch failures, and whether the syncer holds
//! the lease and has compared the whole cluster once.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `applied`, `deleted`, `refused` (by validation or the store) or `failed` (retried).
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: &'static str,
}

#[derive(Default)]
pub struct SyncMetrics {
    pub writes: Family<ResultLabels, Counter>,
    pub lists: Family<ResourceLabels, Counter>,
    pub watch_failures: Family<ResourceLabels, Counter>,
    pub leader: Gauge,
    pub synced: Gauge,
}

impl SyncMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "pasa_kube_sync_writes",
            "Store writes made by the Kubernetes syncer, by result",
            self.writes.clone(),
        );
        registry.register(
            "pasa_kube_lists",
            "Complete lists of a Kubernetes resource (at start, and after a watch was cut off \
             beyond resuming), by resource",
            self.lists.clone(),
        );
        registry.register(
            "pasa_kube_watch_failures",
            "Failed Kubernetes list or watch requests (retried with backoff), by resource",
            self.watch_failures.clone(),
        );
        registry.register(
            "pasa_kube_leader",
            "1 while this replica holds the syncer's lease and syncs, else 0",
            self.leader.clone(),
        );
        registry.register(
            "pasa_kube_synced",
            "1 once the syncer has compared the whole cluster with the store (after it starts \
             leading), else 0",
            self.synced.clone(),
        );
    }

    pub(crate) fn wrote(&self, result: &'static str) {
        self.writes.get_or_create(&ResultLabels { result }).inc();
    }

    pub(crate) fn listed(&self, resource: &'static str) {
        self.lists.get_or_create(&ResourceLabels { resource }).inc();
    }

    pub(crate) fn watch_failed(&self, resource: &'static str) {
        self.watch_failures
            .get_or_create(&ResourceLabels { resource })
            .inc();
    }
}
