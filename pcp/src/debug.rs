//! istiod's debug pages, answered by PCP from the proxy status agents report, so that the tools
//! platform teams already point at istiod see the pods PASA serves. Served on PCP's admin
//! endpoint (istiod serves them on its monitoring port, 15014):
//!
//! - `GET /debug/syncz[?namespace=NS]`: one entry per proxy, in istiod's format: `cluster_id`,
//!   `proxy` (`pod.namespace`), `proxy_type`, `proxy_version`, `istio_version`, and for CDS, LDS,
//!   RDS and EDS what was last sent and last acknowledged (`cluster_sent`/`cluster_acked`,
//!   `listener_…`, `route_…`, `endpoint_…`). Kiali reads these pairs as istiod's: equal means
//!   synced, no acknowledgement stale, nothing sent not sent. istiod puts response nonces there,
//!   PASA's agents the response versions; both change with every push and match once it is
//!   acknowledged, which is all a reader compares. Empty fields are left out, as istiod does.

use std::collections::BTreeMap;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use pasa_proto::store::v1::{ListProxyStatusRequest, ProxyStatusEntry, ProxyType, TypeSyncStatus};
use serde::Serialize;

use crate::write::Upstream;

/// One proxy in istiod's `/debug/syncz` format.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SyncStatus {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cluster_id: String,
    #[serde(rename = "proxy", skip_serializing_if = "String::is_empty")]
    pub proxy_id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub proxy_type: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub proxy_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub istio_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cluster_sent: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cluster_acked: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub listener_sent: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub listener_acked: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub route_sent: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub route_acked: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub endpoint_sent: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub endpoint_acked: String,
}

/// A proxy's entry, as istiod writes it.
pub fn sync_status(entry: &ProxyStatusEntry, cluster_id: &str) -> Option<SyncStatus> {
    let status = entry.status.as_ref()?;
    let pair = |t: &Option<TypeSyncStatus>| {
        t.as_ref()
            .map(|t| (t.version_sent.clone(), t.version_acked.clone()))
            .unwrap_or_default()
    };
    let xds = status.xds.clone().unwrap_or_default();
    let (cluster_sent, cluster_acked) = pair(&xds.cds);
    let (listener_sent, listener_acked) = pair(&xds.lds);
    let (route_sent, route_acked) = pair(&xds.rds);
    let (endpoint_sent, endpoint_acked) = pair(&xds.eds);
    let proxy_type = match status.proxy_type() {
        ProxyType::Router => "router",
        ProxyType::Sidecar | ProxyType::Unspecified => "sidecar",
    };
    Some(SyncStatus {
        cluster_id: cluster_id.to_string(),
        proxy_id: format!("{}.{}", status.pod_name, status.namespace),
        proxy_type: proxy_type.to_string(),
        proxy_version: status.agent_version.clone(),
        istio_version: status.agent_version.clone(),
        cluster_sent,
        cluster_acked,
        listener_sent,
        listener_acked,
        route_sent,
        route_acked,
        endpoint_sent,
        endpoint_acked,
    })
}

#[derive(Clone)]
struct Debug {
    upstream: Upstream,
    cluster_id: String,
}

/// The debug routes, reading proxy status through `upstream`.
pub fn routes(upstream: Upstream, cluster_id: &str) -> Router {
    Router::new()
        .route("/debug/syncz", get(syncz))
        .with_state(Debug {
            upstream,
            cluster_id: cluster_id.to_string(),
        })
}

async fn syncz(
    State(debug): State<Debug>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let request = ListProxyStatusRequest {
        name: String::new(),
        namespace: query.get("namespace").cloned().unwrap_or_default(),
    };
    let mut pages = match debug.upstream.client().list_proxy_status(request).await {
        Ok(pages) => pages.into_inner(),
        Err(status) => {
            let message = format!("the store does not answer: {}\n", status.message());
            return (StatusCode::SERVICE_UNAVAILABLE, message).into_response();
        }
    };
    let mut out = Vec::new();
    loop {
        match pages.message().await {
            Ok(Some(page)) => out.extend(
                page.proxies
                    .iter()
                    .filter_map(|e| sync_status(e, &debug.cluster_id)),
            ),
            Ok(None) => break,
            Err(status) => {
                let message = format!("the store does not answer: {}\n", status.message());
                return (StatusCode::SERVICE_UNAVAILABLE, message).into_response();
            }
        }
    }
    out.sort_by(|a, b| a.proxy_id.cmp(&b.proxy_id));
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        serde_json::to_string_pretty(&out).unwrap_or_else(|_| "[]".into()),
    )
        .into_response()
}
