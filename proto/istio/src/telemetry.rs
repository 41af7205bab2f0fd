//! `Telemetry` (`telemetry.istio.io` v1, v1alpha1): the access logs, traces and metrics of the
//! workloads it selects, by the mesh's providers (`extensionProviders` of MeshConfig).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::authorization_policy::PolicyTargetReference;
use super::common::Duration;
use super::destination_rule::WorkloadSelector;

/// The `spec` of a Telemetry. A null entry of a list is kept so that validation can name it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Telemetry {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub target_ref: Option<PolicyTargetReference>,
    #[serde(default)]
    pub target_refs: Vec<PolicyTargetReference>,
    #[serde(default)]
    pub tracing: Vec<Option<Tracing>>,
    #[serde(default)]
    pub metrics: Vec<Option<Metrics>>,
    #[serde(default)]
    pub access_logging: Vec<Option<AccessLogging>>,
}

/// A provider of the mesh, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderRef {
    #[serde(default)]
    pub name: String,
}

/// Which side of the traffic a setting is for: `CLIENT_AND_SERVER` (default), `CLIENT`,
/// `SERVER`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModeSelector {
    #[serde(default)]
    pub mode: Option<String>,
}

/// Tracing settings.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Tracing {
    #[serde(default, rename = "match")]
    pub match_: Option<ModeSelector>,
    #[serde(default)]
    pub providers: Vec<Option<ProviderRef>>,
    /// Percent of requests traced, 0.0 to 100.0.
    #[serde(default)]
    pub random_sampling_percentage: Option<f64>,
    #[serde(default)]
    pub disable_span_reporting: Option<bool>,
    #[serde(default)]
    pub custom_tags: BTreeMap<String, Option<CustomTag>>,
    #[serde(default)]
    pub use_request_id_for_trace_sampling: Option<bool>,
    #[serde(default)]
    pub enable_istio_tags: Option<bool>,
    #[serde(default)]
    pub disable_context_propagation: Option<bool>,
}

/// Where a custom span tag's value comes from: one of these.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CustomTag {
    #[serde(default)]
    pub literal: Option<LiteralTag>,
    #[serde(default)]
    pub environment: Option<NamedTag>,
    #[serde(default)]
    pub header: Option<NamedTag>,
    #[serde(default)]
    pub formatter: Option<LiteralTag>,
}

/// A fixed tag value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LiteralTag {
    #[serde(default)]
    pub value: String,
}

/// A tag value read from an environment variable or a request header.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NamedTag {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub default_value: String,
}

/// Metrics settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Metrics {
    #[serde(default)]
    pub providers: Vec<Option<ProviderRef>>,
    #[serde(default)]
    pub overrides: Vec<Option<MetricsOverrides>>,
    #[serde(default)]
    pub reporting_interval: Option<Duration>,
}

/// Changes to some metrics: disabled, or tags added, changed or removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MetricsOverrides {
    #[serde(default, rename = "match")]
    pub match_: Option<MetricSelector>,
    #[serde(default)]
    pub disabled: Option<bool>,
    #[serde(default)]
    pub tag_overrides: BTreeMap<String, Option<TagOverride>>,
}

/// Which metrics an override is for: one of Istio's standard metrics, or a custom one by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MetricSelector {
    #[serde(default)]
    pub metric: Option<String>,
    #[serde(default)]
    pub custom_metric: Option<String>,
    #[serde(default)]
    pub mode: Option<String>,
}

/// One tag's change: `UPSERT` (default) with a value, or `REMOVE`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TagOverride {
    #[serde(default)]
    pub operation: Option<String>,
    #[serde(default)]
    pub value: String,
}

/// Access log settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AccessLogging {
    #[serde(default, rename = "match")]
    pub match_: Option<ModeSelector>,
    #[serde(default)]
    pub providers: Vec<Option<ProviderRef>>,
    #[serde(default)]
    pub disabled: Option<bool>,
    /// Which requests are logged: a CEL expression.
    #[serde(default)]
    pub filter: Option<LogFilter>,
}

/// A CEL expression over the request's attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LogFilter {
    #[serde(default)]
    pub expression: String,
}
