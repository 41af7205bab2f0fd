//! Test fakes: an in-process ADS client (`FakeSotwClient`, `FakeDeltaClient`) talking to the real
//! server over a real Unix socket in a temporary directory; and the traffic-simulation corpus
//! reader ([`corpus`]).

#![allow(dead_code)]

pub mod agent;
pub mod ca;
pub mod corpus;
pub mod envoy;
pub mod registry;
pub mod samples;
pub mod sidecar;
pub mod store;
pub mod traffic;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use envoy_types::util::pack_any;
use pasa_agent::ads::{
    AdsService, ServeError, Snapshot, SnapshotPublisher, StatusRegistry, bind_unix, serve_unix,
};
use pasa_agent::metrics::Metrics;
use pasa_agent::model::proxy::Generator;
use pasa_agent::resource::TypeKind;
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

/// Failure guard only: every wait below normally ends on a message, never on this.
pub const GUARD: Duration = Duration::from_secs(10);

pub const CDS: TypeKind = TypeKind::Cluster;
pub const EDS: TypeKind = TypeKind::Endpoint;
pub const LDS: TypeKind = TypeKind::Listener;
pub const RDS: TypeKind = TypeKind::Route;
pub const SDS: TypeKind = TypeKind::Secret;

/// The real server on a socket in a temporary directory.
pub struct Harness {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
    pub publisher: SnapshotPublisher,
    pub status: StatusRegistry,
    pub metrics: Arc<Metrics>,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<Result<(), ServeError>>>,
}

impl Harness {
    pub fn start(initial: Snapshot) -> Self {
        Harness::start_with(initial, None)
    }

    /// [`Harness::start`] for an on-demand proxy, learning through `link`.
    pub fn start_on_demand(initial: Snapshot, link: pasa_agent::ads::OnDemandLink) -> Self {
        Harness::start_with(initial, Some(link))
    }

    fn start_with(initial: Snapshot, on_demand: Option<pasa_agent::ads::OnDemandLink>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("xds.sock");
        let publisher = SnapshotPublisher::new();
        publisher.publish(Generator::Envoy, initial);
        let status = StatusRegistry::new();
        let metrics = Arc::new(Metrics::default());
        let mut service = AdsService::new(&publisher, status.clone()).with_metrics(metrics.clone());
        if let Some(link) = on_demand {
            service = service.with_on_demand(link);
        }
        // Bound before the server task starts: clients can connect as soon as this returns.
        let socket = bind_unix(&path).unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            serve_unix(socket, service, async {
                let _ = rx.await;
            })
            .await
        });
        Self {
            _dir: dir,
            path,
            publisher,
            status,
            metrics,
            shutdown: Some(tx),
            server: Some(server),
        }
    }

    /// Publishes the snapshot Envoy clients are served.
    pub fn publish(&self, snapshot: Snapshot) {
        self.publisher.publish(Generator::Envoy, snapshot);
    }

    pub async fn sotw(&self) -> FakeSotwClient {
        self.sotw_as(node()).await
    }

    /// A SotW client that names `node` on its first request.
    pub async fn sotw_as(&self, node: Node) -> FakeSotwClient {
        FakeSotwClient::connect(&self.path, node).await
    }

    pub async fn delta(&self) -> FakeDeltaClient {
        FakeDeltaClient::connect(&self.path, node()).await
    }

    /// Signals shutdown and waits (guarded) for the server to finish.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            tokio::time::timeout(GUARD, server)
                .await
                .expect("server did not shut down")
                .unwrap()
                .unwrap();
        }
    }
}

async fn channel(path: &Path) -> Channel {
    let uri = format!("unix://{}", path.display());
    tonic::transport::Endpoint::from_shared(uri)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// The node of a fake Envoy sidecar.
pub fn node() -> Node {
    Node {
        id: "sidecar~10.0.0.1~fake.default~default.svc.cluster.local".into(),
        ..Default::default()
    }
}

/// The node of a fake proxyless gRPC client: `GENERATOR: grpc` in its metadata.
pub fn grpc_node() -> Node {
    use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
    let generator = Value {
        kind: Some(Kind::StringValue("grpc".into())),
    };
    Node {
        id: "sidecar~10.0.0.2~fake-grpc.default~default.svc.cluster.local".into(),
        metadata: Some(Struct {
            fields: [("GENERATOR".to_string(), generator)].into_iter().collect(),
        }),
        ..Default::default()
    }
}

/// A fake state-of-the-world ADS client (stands in for Envoy / proxyless gRPC in tests).
pub struct FakeSotwClient {
    tx: mpsc::Sender<DiscoveryRequest>,
    responses: Streaming<DiscoveryResponse>,
    /// Sent on the first request, as real clients do.
    node: Option<Node>,
}

impl FakeSotwClient {
    /// Connects to the ADS server on the socket `path`; `node` goes with the first request.
    pub async fn connect(path: &Path, node: Node) -> FakeSotwClient {
        let mut client = AggregatedDiscoveryServiceClient::new(channel(path).await);
        let (tx, rx) = mpsc::channel(16);
        let responses = client
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        FakeSotwClient {
            tx,
            responses,
            node: Some(node),
        }
    }

    pub async fn send(&mut self, mut request: DiscoveryRequest) {
        if let Some(node) = self.node.take() {
            request.node = Some(node);
        }
        self.tx.send(request).await.unwrap();
    }

    /// A request for `names` of `kind` (first request, or a names change with `nonce`).
    pub async fn request(&mut self, kind: TypeKind, names: &[&str], version: &str, nonce: &str) {
        self.send(DiscoveryRequest {
            version_info: version.into(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            type_url: kind.type_url().into(),
            response_nonce: nonce.into(),
            ..Default::default()
        })
        .await;
    }

    pub async fn request_url(&mut self, type_url: &str) {
        self.send(DiscoveryRequest {
            type_url: type_url.into(),
            ..Default::default()
        })
        .await;
    }

    /// ACK as real clients do: the accepted version, its nonce, the full list of names again.
    pub async fn ack(&mut self, response: &DiscoveryResponse, names: &[&str]) {
        let kind = TypeKind::from_type_url(&response.type_url).unwrap();
        let (version, nonce) = (response.version_info.clone(), response.nonce.clone());
        self.request(kind, names, &version, &nonce).await;
    }

    /// NACK as real clients do: the last accepted version, the rejected nonce, an error.
    pub async fn nack(&mut self, response: &DiscoveryResponse, last_good: &str, names: &[&str]) {
        self.send(DiscoveryRequest {
            version_info: last_good.into(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            error_detail: Some(RpcStatus {
                code: 3,
                message: "fake client rejects this".into(),
                details: Vec::new(),
            }),
            ..Default::default()
        })
        .await;
    }

    pub async fn recv(&mut self) -> DiscoveryResponse {
        tokio::time::timeout(GUARD, self.responses.message())
            .await
            .expect("no response in time")
            .expect("stream failed")
            .expect("stream ended")
    }

    /// The next response, waiting as long as it takes; `None` when the stream ends or fails.
    pub async fn next(&mut self) -> Option<DiscoveryResponse> {
        self.responses.message().await.ok().flatten()
    }

    /// The status the stream ends with.
    pub async fn recv_error(&mut self) -> tonic::Status {
        tokio::time::timeout(GUARD, self.responses.message())
            .await
            .expect("no response in time")
            .expect_err("expected the stream to fail")
    }

    /// Waits for the end of the stream (`None`) or an error.
    pub async fn closed(&mut self) -> Result<Option<DiscoveryResponse>, tonic::Status> {
        tokio::time::timeout(GUARD, self.responses.message())
            .await
            .expect("stream did not end in time")
    }
}

/// A fake incremental ADS client.
pub struct FakeDeltaClient {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    responses: Streaming<DeltaDiscoveryResponse>,
    /// Sent with the first request only, as Envoy does.
    node: Option<Node>,
}

impl FakeDeltaClient {
    /// Opens a Delta stream on the socket at `path`; the first request carries `node`.
    pub async fn connect(path: &Path, node: Node) -> FakeDeltaClient {
        FakeDeltaClient::connect_on(channel(path).await, node).await
    }

    /// Opens a Delta stream over TCP to `addr`, as Istio's pilot-agent does (plaintext when its
    /// `controlPlaneAuthPolicy` is NONE).
    pub async fn connect_tcp(addr: std::net::SocketAddr, node: Node) -> FakeDeltaClient {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        FakeDeltaClient::connect_on(channel, node).await
    }

    async fn connect_on(channel: Channel, node: Node) -> FakeDeltaClient {
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        let (tx, rx) = mpsc::channel(16);
        let responses = client
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        FakeDeltaClient {
            tx,
            responses,
            node: Some(node),
        }
    }

    pub async fn send(&mut self, mut request: DeltaDiscoveryRequest) {
        if let Some(node) = self.node.take() {
            request.node = Some(node);
        }
        self.tx.send(request).await.unwrap();
    }

    pub async fn subscribe(&mut self, kind: TypeKind, subscribe: &[&str], unsubscribe: &[&str]) {
        self.send(DeltaDiscoveryRequest {
            type_url: kind.type_url().into(),
            resource_names_subscribe: subscribe.iter().map(|n| n.to_string()).collect(),
            resource_names_unsubscribe: unsubscribe.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        })
        .await;
    }

    pub async fn ack(&mut self, response: &DeltaDiscoveryResponse) {
        self.send(DeltaDiscoveryRequest {
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        })
        .await;
    }

    pub async fn recv(&mut self) -> DeltaDiscoveryResponse {
        tokio::time::timeout(GUARD, self.responses.message())
            .await
            .expect("no response in time")
            .expect("stream failed")
            .expect("stream ended")
    }

    pub async fn recv_error(&mut self) -> tonic::Status {
        tokio::time::timeout(GUARD, self.responses.message())
            .await
            .expect("no response in time")
            .expect_err("expected the stream to fail")
    }
}

// Resources. The `version` of each is passed explicitly; a body carries a marker so bodies differ.

pub fn cluster(name: &str) -> Any {
    pack_any(Cluster {
        name: name.into(),
        ..Default::default()
    })
}

pub fn endpoints(name: &str) -> Any {
    pack_any(ClusterLoadAssignment {
        cluster_name: name.into(),
        ..Default::default()
    })
}

pub fn listener(name: &str) -> Any {
    pack_any(Listener {
        name: name.into(),
        ..Default::default()
    })
}

pub fn route(name: &str) -> Any {
    pack_any(RouteConfiguration {
        name: name.into(),
        ..Default::default()
    })
}

pub fn secret(name: &str) -> Any {
    pack_any(Secret {
        name: name.into(),
        ..Default::default()
    })
}

pub fn body(kind: TypeKind, name: &str) -> Any {
    match kind {
        TypeKind::Cluster => cluster(name),
        TypeKind::Endpoint => endpoints(name),
        TypeKind::Listener => listener(name),
        TypeKind::Route => route(name),
        TypeKind::Secret => secret(name),
        TypeKind::ExtensionConfig => pack_any(
            envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig {
                name: name.into(),
                ..Default::default()
            },
        ),
        TypeKind::VirtualHost => pack_any(envoy_types::pb::envoy::config::route::v3::VirtualHost {
            name: name.into(),
            ..Default::default()
        }),
    }
}

/// Builds a snapshot from (kind, name, version) triples.
pub fn snapshot(items: &[(TypeKind, &str, &str)]) -> Snapshot {
    let mut s = Snapshot::new();
    for (kind, name, version) in items {
        s.insert(*kind, *name, *version, body(*kind, name)).unwrap();
    }
    s
}

/// The resource names inside a body, whatever its type.
pub fn name_of(any: &Any) -> String {
    let bytes = any.value.as_slice();
    match TypeKind::from_type_url(&any.type_url).unwrap() {
        TypeKind::Cluster => Cluster::decode(bytes).unwrap().name,
        TypeKind::Endpoint => ClusterLoadAssignment::decode(bytes).unwrap().cluster_name,
        TypeKind::Listener => Listener::decode(bytes).unwrap().name,
        TypeKind::Route => RouteConfiguration::decode(bytes).unwrap().name,
        TypeKind::Secret => Secret::decode(bytes).unwrap().name,
        TypeKind::ExtensionConfig => {
            envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig::decode(bytes)
                .unwrap()
                .name
        }
        TypeKind::VirtualHost => {
            envoy_types::pb::envoy::config::route::v3::VirtualHost::decode(bytes)
                .unwrap()
                .name
        }
    }
}

pub fn kind_of(type_url: &str) -> TypeKind {
    TypeKind::from_type_url(type_url).unwrap()
}

/// Sorted names in a SotW response.
pub fn names(response: &DiscoveryResponse) -> Vec<String> {
    let mut names: Vec<String> = response.resources.iter().map(name_of).collect();
    names.sort();
    names
}

/// Sorted (name, version) pairs in a Delta response.
pub fn delta_names(response: &DeltaDiscoveryResponse) -> Vec<(String, String)> {
    let mut names: Vec<(String, String)> = response
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect();
    names.sort();
    names
}
