//! Istio's standard metrics (`istio_requests_total`, `istio_tcp_sent_bytes_total`, ...) and the
//! metadata exchange that labels them with the peer's workload, as istiod configures them.
//!
//! **Only for Istio's proxy.** `istio.stats` (the metrics), `istio.metadata_exchange` (the peer's
//! metadata: HTTP headers, or in-band over mutual TLS with ALPN `istio-peer-exchange`) and
//! `istio.alpn` (the ALPN that tells the peer the protocol) are filters of Istio's own Envoy
//! build. An upstream Envoy does not have them and would refuse every listener naming them, so
//! they are emitted only when the agent serves Istio's proxy ([`ProxyBuild::Istio`]: next to
//! Istio's `istio-proxy`). gRPC statistics (`envoy.filters.http.grpc_stats`, whose filter state
//! `istio.stats` counts gRPC messages from) are upstream Envoy's, and every connection manager
//! gets them, as from istiod.
//!
//! **Which metrics.** The `metrics` entries of the Telemetries that apply (see [`super`]) are
//! merged as istiod merges them: the providers of the last entry naming any are the ones in use
//! (the mesh config's `defaultProviders.metrics` before any); an entry without providers is for
//! the ones before it. Overrides apply per provider and mode (CLIENT, SERVER or both), later ones
//! over earlier ones: `disabled` drops a metric, `tagOverrides` adds, changes (`UPSERT`) or
//! removes (`REMOVE`) its tags; disabling all metrics of a mode drops the filter there, until a
//! later override for that mode brings it back. `reportingInterval` is the TCP reporting period.
//! Without any entry, the default providers are used as they are. Of the providers, those of
//! the Prometheus kind get an `istio.stats` filter (Istio's built-in `prometheus` is one unless
//! the mesh config defines a provider of that name); istiod builds nothing for the others.
//!
//! **Where.** Sidecar inbound is SERVER, its outbound and a router's listeners CLIENT. Every
//! HTTP connection manager gets the peer metadata filter first and `istio.stats` just before the
//! router (inbound and routers without the Host header fallback); outbound ones and routers get
//! `istio.alpn` before the fault filter. Every TCP proxy gets `istio.stats` just before it. Every
//! chain of `virtualInbound` (and of a router's `ISTIO_MUTUAL` TCP servers) starts with the TCP
//! metadata exchange; outbound clusters, `PassthroughCluster` and the dynamic DNS cluster end
//! with its upstream side ([`exchange_upstream`], as they are built). Outbound and inbound
//! clusters name the services they are for in their `istio` metadata (see
//! `metadata::cluster_field`), which the stats label requests with.

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, Filter as ClusterFilter};
use envoy_types::pb::envoy::config::listener::v3::{Filter, filter};
use envoy_types::pb::envoy::extensions::filters::http::grpc_stats::v3::{
    FilterConfig as GrpcStatsConfig, filter_config::PerMethodStatSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_types::pb::google::protobuf::{Any, BoolValue};
use envoy_types::util::pack_any;
use pasa_istio::mesh_config::MeshConfig;
use pasa_istio::proxy_config::MeshProxyConfig;
use pasa_istio::telemetry::{MetricSelector, Metrics};
use pasa_proto::istio_proxy::alpn::{FilterConfig as AlpnConfig, filter_config::AlpnOverride};
use pasa_proto::istio_proxy::stats::{MetricConfig, PluginConfig};
use prost::Message;
use serde_json::json;

use super::super::filters::{self, MX_FILTER};
use super::super::{builders, names};
use super::Side;
use crate::model::proxy::ProxyBuild;

/// The name of Istio's stats filter (HTTP and network).
const STATS_FILTER: &str = "istio.stats";
const ALPN_FILTER: &str = "istio.alpn";
const GRPC_STATS_FILTER: &str = "envoy.filters.http.grpc_stats";
const STATS_TYPE: &str = "type.googleapis.com/stats.PluginConfig";
const ALPN_TYPE: &str =
    "type.googleapis.com/istio.envoy.config.filter.http.alpn.v2alpha1.FilterConfig";
const PEER_METADATA_TYPE: &str = "type.googleapis.com/io.istio.http.peer_metadata.Config";

/// Istio's standard metrics (the `IstioMetric` enum but `ALL_METRICS`), by name, with the name
/// `istio.stats` gives them (after its `istio_` prefix).
const STANDARD_METRICS: [(&str, &str); 10] = [
    ("GRPC_REQUEST_MESSAGES", "request_messages_total"),
    ("GRPC_RESPONSE_MESSAGES", "response_messages_total"),
    ("REQUEST_COUNT", "requests_total"),
    ("REQUEST_DURATION", "request_duration_milliseconds"),
    ("REQUEST_SIZE", "request_bytes"),
    ("RESPONSE_SIZE", "response_bytes"),
    ("TCP_CLOSED_CONNECTIONS", "tcp_connections_closed_total"),
    ("TCP_OPENED_CONNECTIONS", "tcp_connections_opened_total"),
    ("TCP_RECEIVED_BYTES", "tcp_received_bytes_total"),
    ("TCP_SENT_BYTES", "tcp_sent_bytes_total"),
];

pub(super) use super::super::hcm::Class;

impl Class {
    /// The side (Telemetry's workload mode) its metrics are for.
    pub(super) fn side(self) -> Side {
        match self {
            Class::SidecarInbound => Side::Server,
            Class::SidecarOutbound | Class::Gateway => Side::Client,
        }
    }
}

/// One metric's changes for a provider and side.
#[derive(Debug, Clone, Default, PartialEq)]
struct MetricChange {
    disabled: Option<bool>,
    /// Tag → its new value, or `None` to remove it.
    tags: BTreeMap<String, Option<String>>,
}

/// What the metrics of one provider are, per mode.
#[derive(Debug, Clone, Default, PartialEq)]
struct ProviderMetrics {
    /// Modes whose metrics are all disabled (no filter there).
    disabled: BTreeSet<Side>,
    /// Mode → metric → change.
    changes: BTreeMap<Side, BTreeMap<String, MetricChange>>,
    reporting_interval: Option<prost_types::Duration>,
}

/// The `metrics` entries of the Telemetries that apply, merged as istiod merges them: provider
/// (as named) → its metrics.
fn merge(entries: &[&Metrics], defaults: &[String]) -> BTreeMap<String, ProviderMetrics> {
    let mut out: BTreeMap<String, ProviderMetrics> = BTreeMap::new();
    if entries.is_empty() {
        for p in defaults {
            out.entry(p.clone()).or_default();
        }
        return out;
    }
    let names = |m: &Metrics| -> Vec<String> {
        m.providers
            .iter()
            .flatten()
            .map(|p| p.name.clone())
            .collect()
    };
    // The providers in use: those of the last entry naming any.
    let in_scope: BTreeSet<String> = entries
        .iter()
        .map(|m| names(m))
        .rfind(|n| !n.is_empty())
        .unwrap_or_else(|| defaults.to_vec())
        .into_iter()
        .collect();
    let mut parent = defaults.to_vec();
    for m in entries {
        let mut providers = names(m);
        if providers.is_empty() {
            providers = parent.clone();
        }
        parent = providers.clone();
        for provider in providers.iter().filter(|p| in_scope.contains(*p)) {
            let pm = out.entry(provider.clone()).or_default();
            if let Some(d) = &m.reporting_interval {
                pm.reporting_interval = Some(prost_types::Duration {
                    seconds: d.seconds,
                    nanos: d.nanos,
                });
            }
            for side in [Side::Client, Side::Server] {
                pm.changes.entry(side).or_default();
            }
            for o in m.overrides.iter().flatten() {
                let selector = o.match_.as_ref();
                let mode = selector.and_then(|s| s.mode.as_deref());
                let sides: Vec<Side> = [Side::Client, Side::Server]
                    .into_iter()
                    .filter(|s| s.matches(mode))
                    .collect();
                if o.disabled == Some(true) && all_metrics(selector) {
                    pm.disabled.extend(sides);
                    continue;
                }
                for side in sides {
                    // A later override for the side brings back what an earlier one disabled.
                    pm.disabled.remove(&side);
                    let changes = pm.changes.entry(side).or_default();
                    for metric in selected(selector) {
                        let change = changes.entry(metric).or_default();
                        if o.disabled.is_some() {
                            change.disabled = o.disabled;
                        }
                        for (tag, t) in &o.tag_overrides {
                            let remove = t
                                .as_ref()
                                .is_some_and(|t| t.operation.as_deref() == Some("REMOVE"));
                            let value = (!remove)
                                .then(|| t.as_ref().map(|t| t.value.clone()).unwrap_or_default());
                            change.tags.insert(tag.clone(), value);
                        }
                    }
                }
            }
        }
    }
    out
}

/// Whether a selector is for all metrics (no metric named, or `ALL_METRICS`).
fn all_metrics(selector: Option<&MetricSelector>) -> bool {
    match selector {
        Some(s) if s.custom_metric.is_some() => false,
        Some(MetricSelector {
            metric: Some(m), ..
        }) => m == "ALL_METRICS",
        _ => true,
    }
}

/// The metrics a selector names: a custom one, one of Istio's, or all of Istio's.
fn selected(selector: Option<&MetricSelector>) -> Vec<String> {
    match selector {
        Some(MetricSelector {
            custom_metric: Some(c),
            ..
        }) => vec![c.clone()],
        Some(MetricSelector {
            metric: Some(m), ..
        }) if m != "ALL_METRICS" => vec![m.clone()],
        _ => STANDARD_METRICS
            .iter()
            .map(|(name, _)| name.to_string())
            .collect(),
    }
}

/// The HTTP peer metadata filter: an inbound one learns the downstream peer from Istio's headers
/// (or the workload's address) and sends its own back; an outbound one or a router's learns the
/// upstream peer and sends its own with the request (not to clusters outside the mesh when
/// `skip_external`: the proxy config's `metadataExchangeHeaders.mode: IN_MESH`).
fn peer_metadata(class: Class, skip_external: bool) -> HttpFilter {
    let (discovery, propagation) = if class == Class::SidecarInbound {
        ("downstream_discovery", "downstream_propagation")
    } else {
        ("upstream_discovery", "upstream_propagation")
    };
    let headers = if skip_external && class != Class::SidecarInbound {
        json!({"skip_external_clusters": true})
    } else {
        json!({})
    };
    let fields = json!({
        discovery: [{"istio_headers": {}}, {"workload_discovery": {}}],
        propagation: [{"istio_headers": headers}],
    });
    http(
        MX_FILTER,
        builders::typed_struct(PEER_METADATA_TYPE, &fields),
    )
}

/// Adds the upstream TCP metadata exchange to the encoded cluster `name` where istiod adds it
/// (for Istio's proxy, `build`): the outbound clusters of services (and subsets, and
/// SNI-DNAT's), `PassthroughCluster` and the dynamic DNS cluster. The filter is appended as
/// encoded bytes (a cluster holding only it), after the filters the cluster has: nothing is
/// decoded. Whether it was added.
pub(in crate::translate) fn exchange_upstream(
    build: ProxyBuild,
    name: &str,
    encoded: &mut Vec<u8>,
) -> bool {
    static FILTER: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let exchanges = name.starts_with("outbound|")
        || name.starts_with("outbound_.")
        || name == names::PASSTHROUGH_CLUSTER
        || name == names::ALLOW_ANY_DYNAMIC_DNS_CLUSTER;
    if build != ProxyBuild::Istio || !exchanges {
        return false;
    }
    let filter = FILTER.get_or_init(|| {
        Cluster {
            filters: vec![ClusterFilter {
                name: MX_FILTER.into(),
                typed_config: Some(filters::tcp_metadata_exchange()),
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec()
    });
    // Exactly: the encoding is kept as long as the cluster is served.
    encoded.reserve_exact(filter.len());
    encoded.extend_from_slice(filter);
    true
}

fn http(name: &str, config: Any) -> HttpFilter {
    HttpFilter {
        name: name.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(config)),
        ..Default::default()
    }
}

/// `envoy.filters.http.grpc_stats` as istiod configures it: filter state for `istio.stats`, no
/// per-method statistics.
pub(super) fn grpc_stats() -> HttpFilter {
    http(
        GRPC_STATS_FILTER,
        pack_any(GrpcStatsConfig {
            emit_filter_state: true,
            per_method_stat_specifier: Some(PerMethodStatSpecifier::StatsForAllMethods(
                BoolValue { value: false },
            )),
            ..Default::default()
        }),
    )
}

/// `istio.alpn`: the ALPN an in-mesh upstream is asked for, by the protocol spoken to it.
fn alpn() -> HttpFilter {
    let over = |protocol: i32, alpn: [&str; 3]| AlpnOverride {
        upstream_protocol: protocol,
        alpn_override: alpn.map(String::from).to_vec(),
    };
    let config = AlpnConfig {
        alpn_override: vec![
            over(0, ["istio-http/1.0", "istio", "http/1.0"]),
            over(1, ["istio-http/1.1", "istio", "http/1.1"]),
            over(2, ["istio-h2", "istio", "h2"]),
        ],
    };
    http(
        ALPN_FILTER,
        Any {
            type_url: ALPN_TYPE.into(),
            value: config.encode_to_vec(),
        },
    )
}

/// What Istio's proxy gets for metrics and metadata exchange, per class; nothing for upstream
/// Envoy.
#[derive(Debug, Default, PartialEq)]
pub(super) struct IstioFilters {
    /// `istio.stats` configurations by class (inbound, outbound, gateway), one per Prometheus
    /// provider in use, in the providers' name order.
    stats: [Vec<Any>; 3],
    /// The outbound peer metadata filter does not send Istio's headers outside the mesh.
    skip_external: bool,
}

impl IstioFilters {
    /// The filters for Istio's proxy (`build`) with `settings`: the metrics `entries` (of the
    /// Telemetries that apply, in order) configure with the mesh config's providers. `None` for
    /// upstream Envoy.
    pub(super) fn new(
        build: ProxyBuild,
        settings: &MeshProxyConfig,
        mesh: Option<&MeshConfig>,
        entries: &[&Metrics],
    ) -> Option<IstioFilters> {
        if build != ProxyBuild::Istio {
            return None;
        }
        let defaults = mesh
            .map(MeshConfig::default_metrics_providers)
            .unwrap_or_default();
        let merged = merge(entries, &defaults);
        let mut stats: [Vec<Any>; 3] = Default::default();
        for (provider, metrics) in &merged {
            if !pasa_istio::mesh_config::is_prometheus(mesh, provider) {
                continue;
            }
            for (i, class) in [
                Class::SidecarInbound,
                Class::SidecarOutbound,
                Class::Gateway,
            ]
            .into_iter()
            .enumerate()
            {
                stats[i].extend(stats_config(class, metrics));
            }
        }
        Some(IstioFilters {
            stats,
            skip_external: settings.metadata_exchange_in_mesh_only(),
        })
    }

    fn stats(&self, class: Class) -> &[Any] {
        let i = match class {
            Class::SidecarInbound => 0,
            Class::SidecarOutbound => 1,
            Class::Gateway => 2,
        };
        &self.stats[i]
    }

    /// A digest of what the filters are, for the memo of changed resources.
    pub(super) fn fingerprint(&self, h: &mut impl std::hash::Hasher) {
        use std::hash::Hash;
        for s in self.stats.iter().flatten() {
            s.value.hash(h);
        }
        self.stats.iter().map(Vec::len).for_each(|n| n.hash(h));
        self.skip_external.hash(h);
    }

    /// The HTTP filters of a connection manager of `class`: the peer metadata filter first,
    /// `istio.alpn` before the fault filter (not inbound), `istio.stats` before the router.
    pub(super) fn put_http(&self, class: Class, filters: &mut Vec<HttpFilter>) {
        let at = |filters: &[HttpFilter], name: &str| filters.iter().position(|f| f.name == name);
        let router = super::super::session::before_router(filters);
        filters.splice(
            router..router,
            self.stats(class)
                .iter()
                .map(|c| http(STATS_FILTER, c.clone())),
        );
        if class != Class::SidecarInbound {
            let fault = at(filters, super::super::route::FAULT_FILTER).unwrap_or(router);
            filters.insert(fault, alpn());
        }
        filters.insert(0, peer_metadata(class, self.skip_external));
    }

    /// The network filters of a chain of `class` ending with a TCP proxy: `istio.stats` just
    /// before it.
    pub(super) fn put_tcp(&self, class: Class, filters: &mut Vec<Filter>) {
        let proxy = filters.len().saturating_sub(1);
        filters.splice(
            proxy..proxy,
            self.stats(class).iter().map(|c| Filter {
                name: STATS_FILTER.into(),
                config_type: Some(filter::ConfigType::TypedConfig(c.clone())),
            }),
        );
    }
}

/// The `istio.stats` configuration of a provider's `metrics` for listeners of `class`; `None`
/// when the mode's metrics are all disabled.
fn stats_config(class: Class, metrics: &ProviderMetrics) -> Option<Any> {
    let side = class.side();
    if metrics.disabled.contains(&side) {
        return None;
    }
    let changes = metrics.changes.get(&side);
    let config = PluginConfig {
        disable_host_header_fallback: class != Class::SidecarOutbound,
        tcp_reporting_duration: metrics.reporting_interval,
        metrics: changes
            .into_iter()
            .flatten()
            .map(|(metric, change)| {
                let name = STANDARD_METRICS
                    .iter()
                    .find(|(m, _)| m == metric)
                    .map_or(metric.as_str(), |(_, prometheus)| prometheus);
                MetricConfig {
                    dimensions: change
                        .tags
                        .iter()
                        .filter_map(|(t, v)| Some((t.clone(), v.clone()?)))
                        .collect(),
                    name: name.to_string(),
                    tags_to_remove: change
                        .tags
                        .iter()
                        .filter(|(_, v)| v.is_none())
                        .map(|(t, _)| t.clone())
                        .collect(),
                    drop: change.disabled == Some(true),
                    ..Default::default()
                }
            })
            .collect(),
        ..Default::default()
    };
    Some(Any {
        type_url: STATS_TYPE.into(),
        value: config.encode_to_vec(),
    })
}

#[cfg(test)]
mod tests;
