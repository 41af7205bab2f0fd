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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitingLabels {
    /// As kubectl names it: `pods`, `virtualservices.networking.istio.io`.
    pub resource: String,
    /// `listing`, or why its last request failed: `forbidden`, `not_found`, `unreachable`,
    /// `error`.
    pub reason: &'static str,
}

#[derive(Default)]
pub struct SyncMetrics {
    pub waiting: Family<WaitingLabels, Gauge>,
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
            "pasa_kube_waiting",
            "1 for each resource the syncer's first complete comparison waits for, with why \
             (listing, or the reason its last request failed: forbidden, not_found, \
             unreachable, error)",
            self.waiting.clone(),
        );
        registry.register(
            "pasa_kube_synced",
            "1 once the syncer has compared the whole cluster with the store (after it starts \
             leading), else 0",
            self.synced.clone(),
        );
    }

    /// Shows what `status` says the first sync waits for.
    pub(crate) fn set_waiting(&self, status: &crate::syncer::SyncStatus) {
        self.waiting.clear();
        for resource in &status.waiting {
            let reason = status
                .problems
                .get(resource)
                .map_or("listing", |p| p.reason.as_str());
            self.waiting
                .get_or_create(&WaitingLabels {
                    resource: resource.clone(),
                    reason,
                })
                .set(1);
        }
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
