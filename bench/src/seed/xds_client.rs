//! An ADS client that asks as Envoy asks, for the seed's real agents: a state-of-the-world
//! stream on the agent's Unix socket, CDS and LDS by wildcard, then EDS for the EDS clusters
//! and RDS for the route configurations the listeners name; every response ACKed. It watches
//! one route: the weight of one subset in the routes of one host, and says when it first holds
//! a given weight.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";

/// The route a client watches: in the virtual host of `host`, the weight of the weighted
/// cluster whose name has `|subset|` in it.
#[derive(Debug, Clone)]
pub struct Watched {
    pub host: String,
    pub subset: String,
}

/// What a client has seen of its watched route, shared with whoever waits on it.
#[derive(Debug, Default)]
pub struct RouteState {
    /// The weight the client holds now, if its route is there.
    pub weight: Option<u32>,
    /// When it first held each weight.
    pub since: Vec<(u32, Instant)>,
    /// Responses of each type received.
    pub responses: [u32; 4],
    /// Why the stream ended, if it did.
    pub ended: Option<String>,
}

impl RouteState {
    /// When the client first held `weight`.
    pub fn held_since(&self, weight: u32) -> Option<Instant> {
        self.since
            .iter()
            .find(|(w, _)| *w == weight)
            .map(|(_, at)| *at)
    }
}

fn request(
    type_url: &str,
    names: &[String],
    response: Option<&DiscoveryResponse>,
) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: type_url.to_owned(),
        resource_names: names.to_vec(),
        version_info: response.map(|r| r.version_info.clone()).unwrap_or_default(),
        response_nonce: response.map(|r| r.nonce.clone()).unwrap_or_default(),
        ..Default::default()
    }
}

/// Connects to the agent's socket, retrying until it is there (for at most `patience`).
async fn connect(
    uds: &Path,
    patience: Duration,
) -> anyhow::Result<AggregatedDiscoveryServiceClient<tonic::transport::Channel>> {
    let deadline = Instant::now() + patience;
    let uri = format!("unix://{}", uds.display());
    loop {
        match tonic::transport::Endpoint::from_shared(uri.clone())?
            .connect()
            .await
        {
            Ok(channel) => return Ok(AggregatedDiscoveryServiceClient::new(channel)),
            Err(e) if Instant::now() >= deadline => {
                anyhow::bail!("no ADS server on {} after {patience:?}: {e}", uds.display())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Runs the client until its stream ends; `state` says what it holds.
pub async fn run(
    uds: PathBuf,
    node: Node,
    watched: Watched,
    state: Arc<Mutex<RouteState>>,
    patience: Duration,
) {
    let ended = follow(&uds, node, &watched, &state, patience).await;
    if let Ok(mut s) = state.lock() {
        s.ended = Some(match ended {
            Ok(()) => "the agent closed the stream".into(),
            Err(e) => e.to_string(),
        });
    }
}

async fn follow(
    uds: &Path,
    node: Node,
    watched: &Watched,
    state: &Mutex<RouteState>,
    patience: Duration,
) -> anyhow::Result<()> {
    let mut client = connect(uds, patience).await?;
    let (tx, rx) = mpsc::channel(16);
    let mut first = request(CDS, &[], None);
    first.node = Some(node);
    tx.send(first).await?;
    tx.send(request(LDS, &[], None)).await?;
    let mut responses = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let (mut eds_names, mut rds_names) = (Vec::new(), Vec::new());
    let (mut last_eds, mut last_rds): (Option<DiscoveryResponse>, Option<DiscoveryResponse>) =
        (None, None);
    while let Some(response) = responses.message().await? {
        let index = [CDS, EDS, LDS, RDS]
            .iter()
            .position(|t| *t == response.type_url);
        if let (Some(i), Ok(mut s)) = (index, state.lock()) {
            s.responses[i] += 1;
        }
        match response.type_url.as_str() {
            CDS => {
                tx.send(request(CDS, &[], Some(&response))).await?;
                let names = eds_clusters(&response);
                if names != eds_names {
                    eds_names = names;
                    tx.send(request(EDS, &eds_names, last_eds.as_ref())).await?;
                }
            }
            LDS => {
                tx.send(request(LDS, &[], Some(&response))).await?;
                let names = route_names(&response);
                if names != rds_names {
                    rds_names = names;
                    tx.send(request(RDS, &rds_names, last_rds.as_ref())).await?;
                }
            }
            EDS => {
                tx.send(request(EDS, &eds_names, Some(&response))).await?;
                last_eds = Some(response);
            }
            RDS => {
                // A large RDS push comes in parts: one without the watched route leaves it.
                if let Some(w) = weight_of(&response, watched)
                    && let Ok(mut s) = state.lock()
                {
                    s.weight = Some(w);
                    if s.held_since(w).is_none() {
                        s.since.push((w, Instant::now()));
                    }
                }
                tx.send(request(RDS, &rds_names, Some(&response))).await?;
                last_rds = Some(response);
            }
            other => anyhow::bail!("a response of a type not asked for: {other}"),
        }
    }
    Ok(())
}

/// The EDS names of a CDS response's EDS clusters, sorted.
fn eds_clusters(response: &DiscoveryResponse) -> Vec<String> {
    let mut names = BTreeSet::new();
    for any in &response.resources {
        let Ok(cluster) = Cluster::decode(any.value.as_slice()) else {
            continue;
        };
        if cluster.cluster_discovery_type
            == Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32))
        {
            let service = cluster
                .eds_cluster_config
                .map(|c| c.service_name)
                .filter(|s| !s.is_empty());
            names.insert(service.unwrap_or(cluster.name));
        }
    }
    names.into_iter().collect()
}

/// The route configurations an LDS response's HTTP connection managers name, sorted.
fn route_names(response: &DiscoveryResponse) -> Vec<String> {
    let mut names = BTreeSet::new();
    for any in &response.resources {
        let Ok(listener) = Listener::decode(any.value.as_slice()) else {
            continue;
        };
        let chains = listener
            .filter_chains
            .iter()
            .chain(listener.default_filter_chain.as_ref());
        for chain in chains {
            for filter in &chain.filters {
                let Some(ConfigType::TypedConfig(config)) = &filter.config_type else {
                    continue;
                };
                if config.type_url != HCM {
                    continue;
                }
                if let Ok(hcm) = HttpConnectionManager::decode(config.value.as_slice())
                    && let Some(RouteSpecifier::Rds(rds)) = hcm.route_specifier
                {
                    names.insert(rds.route_config_name);
                }
            }
        }
    }
    names.into_iter().collect()
}

/// The watched subset's weight in an RDS response, if its route is there.
fn weight_of(response: &DiscoveryResponse, watched: &Watched) -> Option<u32> {
    let marker = format!("|{}|", watched.subset);
    for any in &response.resources {
        let Ok(config) = RouteConfiguration::decode(any.value.as_slice()) else {
            continue;
        };
        for host in &config.virtual_hosts {
            if !host.domains.iter().any(|d| d == &watched.host) {
                continue;
            }
            for route in &host.routes {
                let Some(Action::Route(action)) = &route.action else {
                    continue;
                };
                let Some(ClusterSpecifier::WeightedClusters(weighted)) = &action.cluster_specifier
                else {
                    continue;
                };
                if let Some(c) = weighted.clusters.iter().find(|c| c.name.contains(&marker)) {
                    return Some(c.weight.as_ref().map_or(0, |w| w.value));
                }
            }
        }
    }
    None
}
