//! The agent's Prometheus metrics (served on the admin endpoint's `/metrics`).

use std::fmt::Write as _;
use std::time::{Instant, SystemTime};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::model::proxy::Generator;
use crate::resource::TypeKind;

impl EncodeLabelValue for TypeKind {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.short_name())
    }
}

impl EncodeLabelValue for Generator {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.name())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabels {
    pub r#type: TypeKind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub r#type: TypeKind,
    pub generator: Generator,
}

/// Why something ended, by the name of its reason (the store watch's `WatchError::label`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// Every metric the agent exports; share it behind an `Arc`.
#[derive(Debug)]
pub struct Metrics {
    pub push_to_ack: Family<TypeLabels, Histogram>,
    pub propagation: Family<TypeLabels, Histogram>,
    pub translation: Histogram,
    pub translations_over_budget: Counter,
    pub resources: Family<ResourceLabels, Gauge>,
    pub nacks: Family<TypeLabels, Counter>,
    pub connections: Gauge,
    pub store_revision: Gauge,
    pub degraded: Gauge,
    pub ca_requests: Counter,
    pub ca_request_failures: Counter,
    pub workload_cert_expiry: Gauge,
    pub store_reconnects: Family<ReasonLabels, Counter>,
    /// On-demand scope: from a name Envoy asked VHDS for to its answer being served.
    pub on_demand_resolution: Histogram,
    pub on_demand_hosts: Gauge,
    pub on_demand_learned: Counter,
    pub on_demand_forgotten: Counter,
    pub on_demand_unanswered: Counter,
    pub subscription_rules: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            push_to_ack: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 16))
            }),
            propagation: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            }),
            translation: Histogram::new(exponential_buckets(0.000_05, 2.0, 18)),
            translations_over_budget: Counter::default(),
            resources: Family::default(),
            nacks: Family::default(),
            connections: Gauge::default(),
            store_revision: Gauge::default(),
            degraded: Gauge::default(),
            ca_requests: Counter::default(),
            ca_request_failures: Counter::default(),
            workload_cert_expiry: Gauge::default(),
            store_reconnects: Family::default(),
            on_demand_resolution: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            on_demand_hosts: Gauge::default(),
            on_demand_learned: Counter::default(),
            on_demand_forgotten: Counter::default(),
            on_demand_unanswered: Counter::default(),
            subscription_rules: Gauge::default(),
        }
    }
}

impl Metrics {
    /// Registers every metric under the `pasa_agent` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("pasa_agent");
        r.register(
            "xds_push_to_ack_seconds",
            "From a store change reaching the agent to the client's ACK of the resources \
             generated from it, per xDS type",
            self.push_to_ack.clone(),
        );
        r.register(
            "propagation_seconds",
            "From the store's commit of a change to the client's ACK of the push it caused, per \
             xDS type (the store's clock against the agent's: keep them synchronised)",
            self.propagation.clone(),
        );
        r.register(
            "subscription_rules",
            "Rules of the store subscription the proxy's scope needs (hosts, namespaces, \
             gateways it follows)",
            self.subscription_rules.clone(),
        );
        r.register(
            "on_demand_resolution_seconds",
            "On-demand scope: from a host Envoy asks the agent for (VHDS) to its answer being \
             served, the store's answer and the translation included",
            self.on_demand_resolution.clone(),
        );
        r.register(
            "on_demand_hosts",
            "On-demand scope: hosts learned from the proxy's requests, which its store \
             subscription follows",
            self.on_demand_hosts.clone(),
        );
        r.register(
            "on_demand_hosts_learned",
            "On-demand scope: hosts learned (each with the spellings of it a resolver tries)",
            self.on_demand_learned.clone(),
        );
        r.register(
            "on_demand_hosts_forgotten",
            "On-demand scope: hosts forgotten after --on-demand-idle without use (Envoy is told \
             they are gone; asked again, they are learned again)",
            self.on_demand_forgotten.clone(),
        );
        r.register(
            "on_demand_unanswered",
            "On-demand scope: names Envoy asked for that the store could not answer in time \
             (answered as unknown; the answer is pushed when it comes)",
            self.on_demand_unanswered.clone(),
        );
        r.register(
            "translation_seconds",
            "Time to translate the cache into the resources of one generator",
            self.translation.clone(),
        );
        r.register(
            "translations_over_budget",
            "Translations that took longer than --translation-budget (clients kept the previous \
             config meanwhile)",
            self.translations_over_budget.clone(),
        );
        r.register(
            "resources",
            "Resources served, per xDS type and generator",
            self.resources.clone(),
        );
        r.register(
            "xds_nacks",
            "Responses clients rejected, per xDS type",
            self.nacks.clone(),
        );
        r.register(
            "xds_connections",
            "Open ADS streams",
            self.connections.clone(),
        );
        r.register(
            "store_revision",
            "The store revision the served configuration was translated from",
            self.store_revision.clone(),
        );
        r.register(
            "degraded",
            "1 while serving without a synced store watch (the store is away, or the saved cache \
             is served until the store is synced), else 0",
            self.degraded.clone(),
        );
        r.register(
            "store_reconnects",
            "Store watches that ended and were opened again, by why they ended",
            self.store_reconnects.clone(),
        );
        r.register(
            "ca_requests",
            "Certificate signing requests sent to Istio's CA (--ca-address)",
            self.ca_requests.clone(),
        );
        r.register(
            "ca_request_failures",
            "Certificate signing requests to Istio's CA that got no certificate",
            self.ca_request_failures.clone(),
        );
        r.register(
            "workload_cert_expiry_timestamp_seconds",
            "When the workload certificate issued by Istio's CA expires (Unix time; 0 before the \
             first one)",
            self.workload_cert_expiry.clone(),
        );
    }

    /// A client ACKed a push of `kind` generated from configuration that reached the agent at
    /// `received`, from store changes the earliest of which was committed at `committed`.
    pub fn acked(&self, kind: TypeKind, received: Instant, committed: Option<SystemTime>) {
        let labels = TypeLabels { r#type: kind };
        self.push_to_ack
            .get_or_create(&labels)
            .observe(received.elapsed().as_secs_f64());
        if let Some(committed) = committed {
            // A store clock ahead of the agent's counts as no delay rather than a negative one.
            let since = SystemTime::now()
                .duration_since(committed)
                .unwrap_or_default();
            self.propagation
                .get_or_create(&labels)
                .observe(since.as_secs_f64());
        }
    }

    /// A client NACKed a response of `kind`.
    pub fn nacked(&self, kind: TypeKind) {
        self.nacks.get_or_create(&TypeLabels { r#type: kind }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_as_documented() {
        let metrics = Metrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let committed = SystemTime::now() - std::time::Duration::from_millis(20);
        metrics.acked(TypeKind::Cluster, Instant::now(), Some(committed));
        metrics.acked(TypeKind::Listener, Instant::now(), None);
        metrics.nacked(TypeKind::Route);
        metrics
            .resources
            .get_or_create(&ResourceLabels {
                r#type: TypeKind::Listener,
                generator: Generator::Grpc,
            })
            .set(3);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for needle in [
            "pasa_agent_xds_push_to_ack_seconds_count{type=\"CDS\"} 1",
            "pasa_agent_xds_push_to_ack_seconds_count{type=\"LDS\"} 1",
            "pasa_agent_propagation_seconds_count{type=\"CDS\"} 1",
            "pasa_agent_xds_nacks_total{type=\"RDS\"} 1",
            "pasa_agent_resources{type=\"LDS\",generator=\"grpc\"} 3",
            "pasa_agent_translation_seconds",
            "pasa_agent_xds_connections 0",
            "pasa_agent_store_revision 0",
            "pasa_agent_degraded 0",
        ] {
            assert!(text.contains(needle), "{needle} missing in\n{text}");
        }
        // Timed from the commit, not from the ACK's own origin; nothing without a commit.
        assert!(
            text.contains("pasa_agent_propagation_seconds_bucket{le=\"0.016\",type=\"CDS\"} 0"),
            "{text}"
        );
        assert!(
            !text.contains("propagation_seconds_count{type=\"LDS\"}"),
            "{text}"
        );
    }
}
