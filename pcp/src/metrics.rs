//! PCP's Prometheus metrics: admission outcomes by origin (gRPC, webhook, Kubernetes syncer),
//! webhook requests and latency. The syncer's own are `pasa_kube`'s.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use pasa_validation::admission::Checked;

/// Where a document came in.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Origin {
    Grpc,
    Webhook,
    /// The Kubernetes syncer, mirroring the cluster's objects.
    Kubernetes,
    /// The Kubernetes syncer, writing what it generates from Ingresses and the Gateway API.
    Generated,
    /// The mesh config file (`--mesh-config`).
    MeshConfig,
    /// JWT issuers' keys PCP fetched.
    JwtKeys,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Verdict {
    Admitted,
    Rejected,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    pub origin: Origin,
    pub verdict: Verdict,
}

/// The webhook's answer to one AdmissionReview.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Answer {
    Allowed,
    Denied,
    /// 4xx before any review: wrong content type, empty body.
    BadRequest,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    pub answer: Answer,
}

/// What the injecting webhook did with a pod: `injected_next_to_istio`, `injected_standalone`,
/// or why it left the pod as it was (`not_selected`, `opted_out`, `already_injected`,
/// `host_network`, `system_namespace`, `bad_annotation`, `cannot_inject`,
/// `not_a_pod_creation`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InjectionLabels {
    pub result: &'static str,
}

pub struct Metrics {
    pub documents: Family<AdmissionLabels, Counter>,
    pub webhook_requests: Family<WebhookLabels, Counter>,
    pub webhook_duration: Histogram,
    pub injections: Family<InjectionLabels, Counter>,
    pub jwks_fetch_failures: prometheus_client::metrics::counter::Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            documents: Family::default(),
            webhook_requests: Family::default(),
            webhook_duration: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            injections: Family::default(),
            jwks_fetch_failures: Default::default(),
        }
    }
}

impl Metrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "pasa_pcp_documents",
            "Documents checked by admission, by origin and verdict",
            self.documents.clone(),
        );
        registry.register(
            "pasa_pcp_webhook_requests",
            "AdmissionReview requests answered, by answer",
            self.webhook_requests.clone(),
        );
        registry.register(
            "pasa_pcp_webhook_duration_seconds",
            "Time to answer an AdmissionReview",
            self.webhook_duration.clone(),
        );
        registry.register(
            "pasa_pcp_injections",
            "Pods the injecting webhook reviewed, by what it did",
            self.injections.clone(),
        );
        registry.register(
            "pasa_pcp_jwks_fetch_failures",
            "JWT issuers' key sets that could not be fetched (tried again every 10 s)",
            self.jwks_fetch_failures.clone(),
        );
    }

    /// Counts each document of a checked batch as admitted or rejected.
    pub fn count_admission(&self, origin: Origin, checked: &Checked) {
        let rejected: std::collections::HashSet<u32> =
            checked.errors.iter().map(|e| e.index).collect();
        let total = checked.objects.len();
        let bad = rejected.len().min(total);
        for (verdict, n) in [(Verdict::Rejected, bad), (Verdict::Admitted, total - bad)] {
            if n > 0 {
                self.documents
                    .get_or_create(&AdmissionLabels { origin, verdict })
                    .inc_by(n as u64);
            }
        }
    }
}
