//! `WorkloadGroup` (`networking.istio.io` v1, v1beta1, v1alpha3): the template from which istiod
//! makes a WorkloadEntry for each VM that registers itself, and how its health is probed. The
//! control plane's (auto-registration); proxies do not read it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::workload_entry::WorkloadEntry;

/// The `spec` of a WorkloadGroup.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkloadGroup {
    /// Labels and annotations of the WorkloadEntries made from it.
    #[serde(default)]
    pub metadata: Option<GroupMetadata>,
    /// The WorkloadEntry each registering workload starts from (address and the like are filled
    /// in at registration, so none is required here).
    #[serde(default)]
    pub template: Option<WorkloadEntry>,
    #[serde(default)]
    pub probe: Option<ReadinessProbe>,
}

/// Metadata given to the WorkloadEntries of a group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GroupMetadata {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// How the agent on the VM checks that the workload is ready: one of `httpGet`, `tcpSocket`,
/// `exec` or `grpc`, with Kubernetes' timing fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReadinessProbe {
    #[serde(default)]
    pub initial_delay_seconds: i32,
    #[serde(default)]
    pub timeout_seconds: i32,
    #[serde(default)]
    pub period_seconds: i32,
    #[serde(default)]
    pub success_threshold: i32,
    #[serde(default)]
    pub failure_threshold: i32,
    #[serde(default)]
    pub http_get: Option<HttpProbe>,
    #[serde(default)]
    pub tcp_socket: Option<TcpProbe>,
    #[serde(default)]
    pub exec: Option<ExecProbe>,
    #[serde(default)]
    pub grpc: Option<GrpcProbe>,
}

/// An HTTP GET to the workload.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpProbe {
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub port: u32,
    #[serde(default)]
    pub host: String,
    /// `HTTP` or `HTTPS`; empty means HTTP.
    #[serde(default)]
    pub scheme: String,
    /// A null entry is kept so that validation can name it.
    #[serde(default)]
    pub http_headers: Vec<Option<ProbeHeader>>,
}

/// A header sent with an HTTP probe.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeHeader {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub value: String,
}

/// A TCP connection to the workload.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TcpProbe {
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub port: u32,
}

/// A command run on the VM.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExecProbe {
    #[serde(default)]
    pub command: Vec<String>,
}

/// A gRPC health check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcProbe {
    #[serde(default)]
    pub port: u32,
    #[serde(default)]
    pub service: String,
}
