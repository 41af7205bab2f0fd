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
//! - over xDS on PCP's gRPC port, the form `istioctl proxy-status` asks for
//!   (`istioctl proxy-status --xds-address <pcp>:7400 --plaintext`): a `DiscoveryRequest` of
//!   type `istio.io/debug/syncz` is answered with one `envoy.service.status.v3.ClientConfig` per
//!   proxy — node ID `pod.namespace`, node metadata `CLUSTER_ID`, `NAMESPACE`, `ISTIO_VERSION`,
//!   and per xDS type the proxy asked for its `config_status` (SYNCED or STALE) — and the
//!   response's control
//!   plane identifier names this PCP, as istiod names itself. Other debug types (the per-proxy
//!   `istio.io/debug/config_dump` of istioctl's diff mode) are refused with a message saying
//!   where PASA shows the same (`pasactl proxy-config`).
//!
//! - `GET /debug/clusterz`: the clusters PCP syncs, in istiod's format (what
//!   `istioctl remote-clusters` reads): one entry per cluster, `id`, `secretName` (the Secret,
//!   `namespace/name`, or the kubeconfig file that registers a remote cluster; empty for PCP's
//!   own), `syncStatus` (`synced`, `syncing`, `timeout`, `failed`; `standby` on a replica that
//!   does not lead, which syncs nothing), and PASA's `detail`: what a cluster not synced waits
//!   for, or why it failed. Over xDS (`pasactl remote-clusters`), as istiod's debug
//!   generator: a `DiscoveryRequest` of type `istio.io/debug` naming the resource `clusterz` is
//!   answered with that JSON in one resource of the same type.
//!
//! Like PCP's store API, these answer whoever reaches the port: PASA does not yet authenticate
//! its API's callers.

use std::collections::BTreeMap;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use pasa_proto::store::v1::{ListProxyStatusRequest, ProxyStatusEntry, ProxyType, TypeSyncStatus};
use serde::Serialize;

use std::pin::Pin;

use envoy_types::pb::envoy::config::core::v3::{ControlPlane, Node};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use envoy_types::pb::envoy::service::status::v3::{ClientConfig, ConfigStatus};
use envoy_types::pb::google::protobuf::{Any, Struct, Value as PbValue, value::Kind as PbKind};
use pasa_proto::store::v1::SyncState;
use prost::Message;
use tokio_stream::Stream;

use crate::kubernetes::ClustersView;
use crate::write::Upstream;
use tokio::sync::watch;

/// The debug type `istioctl proxy-status` asks for.
pub const SYNCZ_TYPE: &str = "istio.io/debug/syncz";
const CLIENT_CONFIG_TYPE: &str = "type.googleapis.com/envoy.service.status.v3.ClientConfig";
/// The xDS types PASA's agents report, in the order istioctl shows them.
const XDS_TYPES: [&str; 5] = [
    "type.googleapis.com/envoy.config.cluster.v3.Cluster",
    "type.googleapis.com/envoy.config.listener.v3.Listener",
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
    "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
    "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
];

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
    #[serde(
        rename = "extensionconfig_sent",
        skip_serializing_if = "String::is_empty"
    )]
    pub extension_config_sent: String,
    #[serde(
        rename = "extensionconfig_acked",
        skip_serializing_if = "String::is_empty"
    )]
    pub extension_config_acked: String,
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
    let (extension_config_sent, extension_config_acked) = pair(&xds.ecds);
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
        extension_config_sent,
        extension_config_acked,
    })
}

#[derive(Clone)]
struct Debug {
    upstream: Upstream,
    cluster_id: String,
    clusters: watch::Receiver<ClustersView>,
}

/// The debug routes, reading proxy status through `upstream` and the clusters' states from
/// `clusters`.
pub fn routes(
    upstream: Upstream,
    cluster_id: &str,
    clusters: watch::Receiver<ClustersView>,
) -> Router {
    Router::new()
        .route("/debug/syncz", get(syncz))
        .route("/debug/clusterz", get(clusterz_page))
        .with_state(Debug {
            upstream,
            cluster_id: cluster_id.to_string(),
            clusters,
        })
}

/// The type of istiod's debug endpoints over xDS (the resource names the endpoint).
pub const DEBUG_TYPE: &str = "istio.io/debug";

/// One cluster in istiod's `/debug/clusterz` format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterEntry {
    pub id: String,
    pub secret_name: String,
    pub sync_status: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// The clusters, PCP's own first, then the remote ones by ID.
pub fn clusterz(view: &ClustersView) -> Vec<ClusterEntry> {
    if view.own.is_empty() {
        return Vec::new();
    }
    let own_status = match (view.leading, view.own_synced) {
        (false, _) => "standby",
        (true, true) => "synced",
        (true, false) => "syncing",
    };
    let own_detail = if view.own_synced {
        String::new()
    } else {
        view.own_detail.clone()
    };
    let mut out = vec![ClusterEntry {
        id: view.own.clone(),
        secret_name: String::new(),
        sync_status: own_status.to_string(),
        detail: own_detail,
    }];
    for c in view.remote.clusters.values() {
        let mut detail = c.detail.clone();
        if !c.replacing.is_empty() {
            detail = [detail, c.replacing.clone()]
                .into_iter()
                .filter(|d| !d.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
        }
        out.push(ClusterEntry {
            id: c.id.clone(),
            secret_name: c.source.clone(),
            sync_status: c.state.as_str().to_string(),
            detail,
        });
    }
    out
}

async fn clusterz_page(State(debug): State<Debug>) -> Response {
    let entries = clusterz(&debug.clusters.borrow());
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        serde_json::to_string_pretty(&entries).unwrap_or_else(|_| "[]".into()),
    )
        .into_response()
}

async fn syncz(
    State(debug): State<Debug>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let namespace = query.get("namespace").cloned().unwrap_or_default();
    let entries = match proxy_statuses(&debug.upstream, &namespace).await {
        Ok(entries) => entries,
        Err(status) => {
            let message = format!("the store does not answer: {}\n", status.message());
            return (StatusCode::SERVICE_UNAVAILABLE, message).into_response();
        }
    };
    let mut out: Vec<SyncStatus> = entries
        .iter()
        .filter_map(|e| sync_status(e, &debug.cluster_id))
        .collect();
    out.sort_by(|a, b| a.proxy_id.cmp(&b.proxy_id));
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        serde_json::to_string_pretty(&out).unwrap_or_else(|_| "[]".into()),
    )
        .into_response()
}

/// Every proxy's status, page by page from the store, filtered by namespace when given.
async fn proxy_statuses(
    upstream: &Upstream,
    namespace: &str,
) -> Result<Vec<ProxyStatusEntry>, tonic::Status> {
    let request = ListProxyStatusRequest {
        name: String::new(),
        namespace: namespace.to_string(),
        local_only: false,
    };
    let mut pages = upstream
        .call(&request, |mut store, request| async move {
            store.list_proxy_status(request).await
        })
        .await?
        .into_inner();
    let mut entries = Vec::new();
    while let Some(page) = pages.message().await? {
        entries.extend(page.proxies);
    }
    Ok(entries)
}

/// A proxy as `istioctl proxy-status` reads one: an Envoy `ClientConfig`.
pub fn client_config(entry: &ProxyStatusEntry, cluster_id: &str) -> Option<ClientConfig> {
    let status = entry.status.as_ref()?;
    let text = |s: &str| PbValue {
        kind: Some(PbKind::StringValue(s.to_string())),
    };
    let metadata = Struct {
        fields: [
            ("CLUSTER_ID".to_string(), text(cluster_id)),
            ("NAMESPACE".to_string(), text(&status.namespace)),
            ("ISTIO_VERSION".to_string(), text(&status.agent_version)),
        ]
        .into_iter()
        .collect(),
    };
    let xds = status.xds.clone().unwrap_or_default();
    let generic_xds_configs = XDS_TYPES
        .iter()
        .zip([&xds.cds, &xds.lds, &xds.eds, &xds.rds, &xds.ecds])
        .filter_map(|(type_url, t)| {
            let t = t.as_ref()?;
            // A type the proxy never asked for is left out, as istiod lists only the types a
            // proxy watches (istioctl shows it as IGNORED, not subscribed).
            let config_status = match t.state() {
                SyncState::Synced => ConfigStatus::Synced,
                SyncState::Stale => ConfigStatus::Stale,
                SyncState::NotSent | SyncState::Unspecified => return None,
            };
            Some(GenericXdsConfig {
                type_url: type_url.to_string(),
                version_info: t.version_sent.clone(),
                config_status: config_status as i32,
                ..Default::default()
            })
        })
        .collect();
    Some(ClientConfig {
        node: Some(Node {
            id: format!("{}.{}", status.pod_name, status.namespace),
            metadata: Some(metadata),
            ..Default::default()
        }),
        generic_xds_configs,
        ..Default::default()
    })
}

/// istiod's debug types over ADS, answered by PCP.
#[derive(Clone)]
pub struct DebugXds {
    upstream: Upstream,
    cluster_id: String,
    /// This PCP's name in the answers' control plane identifier.
    id: String,
    /// Who may ask (under mutual TLS: operators and the root namespace's workloads).
    access: pasa_store::access::Access,
    /// The clusters PCP syncs (`clusterz`).
    clusters: watch::Receiver<ClustersView>,
}

impl DebugXds {
    pub fn new(upstream: Upstream, cluster_id: &str, id: &str) -> Self {
        DebugXds {
            upstream,
            cluster_id: cluster_id.to_string(),
            id: id.to_string(),
            access: pasa_store::access::Access::plaintext(),
            clusters: watch::channel(ClustersView::default()).1,
        }
    }

    /// Answers `clusterz` from `clusters`.
    pub fn with_clusters(mut self, clusters: watch::Receiver<ClustersView>) -> Self {
        self.clusters = clusters;
        self
    }

    /// Decides who may ask by `access`.
    pub fn with_access(mut self, access: pasa_store::access::Access) -> Self {
        self.access = access;
        self
    }

    /// As a gRPC service beside the store API.
    pub fn into_server(self) -> AggregatedDiscoveryServiceServer<DebugXds> {
        AggregatedDiscoveryServiceServer::new(self)
    }

    /// The answer to one request.
    pub async fn answer(
        &self,
        request: &DiscoveryRequest,
        nonce: u64,
    ) -> Result<DiscoveryResponse, tonic::Status> {
        let identifier = serde_json::json!({
            "Component": "pasa-pcp",
            "ID": self.id,
            "Info": {"version": env!("CARGO_PKG_VERSION")},
        });
        if request.type_url == DEBUG_TYPE {
            if request.resource_names != ["clusterz"] {
                return Err(tonic::Status::unimplemented(format!(
                    "{DEBUG_TYPE} {:?}: PCP answers only the resource clusterz of istiod's debug \
                     endpoints over xDS",
                    request.resource_names
                )));
            }
            let entries = clusterz(&self.clusters.borrow());
            let json =
                serde_json::to_vec(&entries).map_err(|e| tonic::Status::internal(e.to_string()))?;
            return Ok(DiscoveryResponse {
                type_url: DEBUG_TYPE.to_string(),
                nonce: nonce.to_string(),
                resources: vec![Any {
                    type_url: DEBUG_TYPE.to_string(),
                    value: json,
                }],
                control_plane: Some(ControlPlane {
                    identifier: identifier.to_string(),
                }),
                ..Default::default()
            });
        }
        if request.type_url != SYNCZ_TYPE {
            return Err(tonic::Status::unimplemented(format!(
                "{}: PCP answers only {SYNCZ_TYPE} and {DEBUG_TYPE} clusterz over xDS; a proxy's \
                 configuration is at its Envoy's admin (istioctl proxy-config) and its agent's \
                 (pasactl proxy-config)",
                request.type_url
            )));
        }
        let entries = proxy_statuses(&self.upstream, "").await?;
        let mut configs: Vec<ClientConfig> = entries
            .iter()
            .filter_map(|e| client_config(e, &self.cluster_id))
            .collect();
        configs.sort_by(|a, b| {
            let id = |c: &ClientConfig| c.node.as_ref().map(|n| n.id.clone()).unwrap_or_default();
            id(a).cmp(&id(b))
        });
        Ok(DiscoveryResponse {
            type_url: SYNCZ_TYPE.to_string(),
            nonce: nonce.to_string(),
            resources: configs
                .iter()
                .map(|c| Any {
                    type_url: CLIENT_CONFIG_TYPE.to_string(),
                    value: c.encode_to_vec(),
                })
                .collect(),
            control_plane: Some(ControlPlane {
                identifier: identifier.to_string(),
            }),
            ..Default::default()
        })
    }
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for DebugXds {
    type StreamAggregatedResourcesStream = ResponseStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = ResponseStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::StreamAggregatedResourcesStream>, tonic::Status> {
        let caller = self.access.caller("DebugXds", &request)?;
        self.access.debug(&caller)?;
        let mut requests = request.into_inner();
        let this = self.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let mut nonce = 0u64;
            loop {
                let request = match requests.message().await {
                    Ok(Some(r)) => r,
                    Ok(None) => return,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                };
                // The ACK of an answer (by a client that acknowledges debug types) asks for
                // nothing new. istioctl's client acknowledges none, and puts a nonce of its own
                // on every request it sends: a request is an ACK only when it names ours.
                if nonce > 0 && request.response_nonce == nonce.to_string() {
                    continue;
                }
                nonce += 1;
                let answer = this.answer(&request, nonce).await;
                let failed = answer.is_err();
                if tx.send(answer).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::DeltaAggregatedResourcesStream>, tonic::Status> {
        Err(tonic::Status::unimplemented(format!(
            "PCP answers istiod's debug types ({SYNCZ_TYPE}) over state-of-the-world ADS only"
        )))
    }
}
