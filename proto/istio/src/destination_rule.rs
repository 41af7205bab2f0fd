//! The `DestinationRule` model (`networking.istio.io`): policies applied to traffic for a service
//! after routing (load balancing, connection pools, outlier detection, client TLS), per subset and
//! per port.

mod connection_pool;
mod load_balancer;

pub use connection_pool::*;
pub use load_balancer::*;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::{Duration, PortSelector};
use crate::proto_enum;

/// Policies for the traffic to one service (`host`), with named subsets of its endpoints.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DestinationRule {
    /// The service: a registry name (short names are resolved in the rule's namespace), possibly
    /// with a leading wildcard.
    #[serde(default)]
    pub host: String,
    /// Policies for every port and subset unless overridden.
    #[serde(default)]
    pub traffic_policy: Option<TrafficPolicy>,
    /// Named groups of endpoints (by label), each with optional policy overrides.
    #[serde(default)]
    pub subsets: Vec<Subset>,
    /// Namespaces the rule is visible to (`.` own, `*` all); empty means the mesh default.
    #[serde(default)]
    pub export_to: Vec<String>,
    /// Only the workloads selected here apply the rule (as clients).
    #[serde(default)]
    pub workload_selector: Option<WorkloadSelector>,
}

/// The workloads a policy applies to, by their labels (`istio.type.v1beta1.WorkloadSelector`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkloadSelector {
    /// Labels a workload must all carry; empty selects every workload of the namespace.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

/// Traffic policies of a destination, a subset or (in part) a port.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TrafficPolicy {
    #[serde(default)]
    pub load_balancer: Option<LoadBalancerSettings>,
    #[serde(default)]
    pub connection_pool: Option<ConnectionPoolSettings>,
    #[serde(default)]
    pub outlier_detection: Option<OutlierDetection>,
    /// TLS towards the upstream.
    #[serde(default)]
    pub tls: Option<ClientTlsSettings>,
    /// Overrides for single ports; they replace, not merge with, the settings above.
    #[serde(default)]
    pub port_level_settings: Vec<PortTrafficPolicy>,
    /// Tunnel the connection through a proxy (HTTP CONNECT or POST).
    #[serde(default)]
    pub tunnel: Option<TunnelSettings>,
    /// Send a PROXY protocol header to the upstream.
    #[serde(default)]
    pub proxy_protocol: Option<ProxyProtocol>,
    /// Limits retries to a share of the active requests.
    #[serde(default)]
    pub retry_budget: Option<RetryBudget>,
}

/// Traffic policies of one port of the destination.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PortTrafficPolicy {
    /// The port these settings apply to (required).
    #[serde(default)]
    pub port: Option<PortSelector>,
    #[serde(default)]
    pub load_balancer: Option<LoadBalancerSettings>,
    #[serde(default)]
    pub connection_pool: Option<ConnectionPoolSettings>,
    #[serde(default)]
    pub outlier_detection: Option<OutlierDetection>,
    #[serde(default)]
    pub tls: Option<ClientTlsSettings>,
}

/// A tunnel through an HTTP proxy to `target_host:target_port`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TunnelSettings {
    /// `CONNECT` (the default when empty) or `POST`.
    #[serde(default)]
    pub protocol: String,
    /// The host (FQDN or IP) the proxy connects to.
    #[serde(default)]
    pub target_host: String,
    #[serde(default)]
    pub target_port: u32,
}

proto_enum! {
    /// PROXY protocol version.
    pub enum ProxyProtocolVersion {
        /// The human-readable header.
        V1 = 0 => "V1",
        /// The binary header.
        V2 = 1 => "V2",
    }
}

/// The PROXY protocol header sent to the upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyProtocol {
    #[serde(default)]
    pub version: ProxyProtocolVersion,
}

/// Caps concurrent retries at a share of active requests (Envoy's retry budget).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RetryBudget {
    /// Share of active requests that may be retries, in percent (0..100).
    #[serde(default)]
    pub percent: Option<f64>,
    /// Retries always allowed, whatever the share.
    #[serde(default)]
    pub min_retry_concurrency: u32,
    /// Window over which active requests are counted.
    #[serde(default)]
    pub budget_interval: Option<Duration>,
}

/// A named group of a service's endpoints, selected by labels.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Subset {
    /// The name routes refer to (a DNS label).
    #[serde(default)]
    pub name: String,
    /// Endpoint labels that make up the subset.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Overrides the rule-level policy for this subset.
    #[serde(default)]
    pub traffic_policy: Option<TrafficPolicy>,
}

/// Ejection of endpoints that keep failing (Envoy's outlier detection).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OutlierDetection {
    /// Deprecated: use `consecutive_gateway_errors` or `consecutive_5xx_errors`.
    #[serde(default)]
    pub consecutive_errors: i32,
    /// Count local-origin failures (timeouts, resets) apart from upstream errors.
    #[serde(default)]
    pub split_external_local_origin_errors: bool,
    /// Local-origin failures before ejection (needs `split_external_local_origin_errors`).
    #[serde(default)]
    pub consecutive_local_origin_failures: Option<u32>,
    /// 502/503/504 answers (and connect failures) before ejection; 0 disables.
    #[serde(default)]
    pub consecutive_gateway_errors: Option<u32>,
    /// 5xx answers (and connect failures) before ejection; 0 disables.
    #[serde(default)]
    pub consecutive_5xx_errors: Option<u32>,
    /// Time between ejection sweeps.
    #[serde(default)]
    pub interval: Option<Duration>,
    /// Shortest ejection; it grows with each ejection of the same host.
    #[serde(default)]
    pub base_ejection_time: Option<Duration>,
    /// Largest share of hosts that may be ejected, in percent.
    #[serde(default)]
    pub max_ejection_percent: i32,
    /// Outlier detection stays on while at least this share of hosts is healthy, in percent.
    #[serde(default)]
    pub min_health_percent: i32,
    /// HTTP status codes (100..599) counted as errors.
    #[serde(default)]
    pub outlier_detection_http_error_codes: Vec<u32>,
}

proto_enum! {
    /// How the connection to the upstream is secured.
    pub enum ClientTlsMode {
        /// Plain text.
        Disable = 0 => "DISABLE",
        /// TLS, verifying the server.
        Simple = 1 => "SIMPLE",
        /// Mutual TLS with the given client certificate.
        Mutual = 2 => "MUTUAL",
        /// Mutual TLS with Istio's workload certificates.
        IstioMutual = 3 => "ISTIO_MUTUAL",
    }
}

/// TLS towards the upstream (`ClientTLSSettings`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientTlsSettings {
    #[serde(default)]
    pub mode: ClientTlsMode,
    /// Client certificate file (MUTUAL).
    #[serde(default)]
    pub client_certificate: String,
    /// Client key file (MUTUAL).
    #[serde(default)]
    pub private_key: String,
    /// CA bundle file for verifying the server.
    #[serde(default)]
    pub ca_certificates: String,
    /// A secret (or `configmap://ns/name`) holding the certificates, instead of files.
    #[serde(default)]
    pub credential_name: String,
    /// Names the server certificate must carry.
    #[serde(default)]
    pub subject_alt_names: Vec<String>,
    /// SNI sent in the handshake.
    #[serde(default)]
    pub sni: String,
    /// Skip verifying the server certificate (absent: verify).
    #[serde(default)]
    pub insecure_skip_verify: Option<bool>,
    /// Certificate revocation list file.
    #[serde(default)]
    pub ca_crl: String,
}
