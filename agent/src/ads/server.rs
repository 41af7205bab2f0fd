//! The gRPC service and serving it on a Unix socket.

use std::collections::BTreeSet;
use std::future::Future;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use super::snapshot::{Snapshot, SnapshotPublisher, Snapshots};
use super::status::{Protocol, StatusGuard, StatusRegistry};
use super::{RESPONSE_BUFFER, TypeKind, authority, delta, request_type, sotw};
use crate::metrics::Metrics;
use crate::model::proxy::Generator;

/// Why serving stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "{path} exists and is not a socket; refusing to replace it (choose another socket path)"
    )]
    NotASocket { path: PathBuf },
    #[error("cannot remove the stale socket {path}: {source}")]
    RemoveStale {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot listen on {path}: {source} (does the directory exist and is it writable?)")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the ADS server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The client went away (or the stream must end); stop the connection.
pub(super) struct Closed;

/// What SotW and Delta do differently; [`drive`] is the loop they share.
pub(super) trait StreamHandler: Send {
    type Request: prost::Message + Default + Send + 'static;
    /// For logs: `SotW` or `Delta`.
    const NAME: &'static str;
    /// The node a request names (clients send it on the first request only).
    fn node(request: &Self::Request) -> Option<&Node>;
    /// The connection this handler serves.
    fn connection(&mut self) -> &mut Connection;
    /// Answers one request of the client.
    fn on_request(
        &mut self,
        request: Self::Request,
        snapshot: &Snapshot,
    ) -> impl Future<Output = Result<(), Closed>> + Send;
    /// Pushes what a new snapshot changed.
    fn on_snapshot(
        &mut self,
        snapshot: &Snapshot,
    ) -> impl Future<Output = Result<(), Closed>> + Send;
}

/// One stream's loop: learn the client's generator from its first request, wait for that
/// generator's snapshot, then answer requests and push new snapshots, until shutdown or until the
/// client goes. When the publisher is gone, the last snapshot keeps being served.
pub(super) async fn drive<H: StreamHandler>(mut handler: H, mut requests: Streaming<H::Request>) {
    let mut closing = handler.connection().closing.clone();
    let mut snapshots = handler.connection().snapshots.clone();
    // Set by the first request.
    let mut serving: Option<(Generator, Arc<Snapshot>)> = None;
    let mut watching = true;
    tracing::debug!(protocol = H::NAME, "stream opened");
    loop {
        tokio::select! {
            () = Connection::closed(&mut closing) => break,
            request = requests.message() => match request {
                Ok(Some(request)) => {
                    let snapshot = match &serving {
                        Some((_, snapshot)) => Arc::clone(snapshot),
                        None => {
                            let generator = handler.connection().identify(H::node(&request));
                            let Some(snapshot) =
                                first_snapshot(&mut snapshots, generator, &mut closing).await
                            else {
                                break;
                            };
                            serving = Some((generator, Arc::clone(&snapshot)));
                            snapshot
                        }
                    };
                    if handler.on_request(request, &snapshot).await.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(protocol = H::NAME, %status, "stream failed");
                    break;
                }
            },
            changed = snapshots.changed(), if watching => {
                if changed.is_err() {
                    watching = false;
                    continue;
                }
                let published = Arc::clone(&snapshots.borrow_and_update());
                let Some((generator, current)) = &mut serving else {
                    continue;
                };
                let Some(next) = published.get(*generator) else {
                    continue;
                };
                if Arc::ptr_eq(next, current) {
                    continue;
                }
                *current = Arc::clone(next);
                if handler.on_snapshot(next).await.is_err() {
                    break;
                }
            }
        }
    }
    tracing::debug!(protocol = H::NAME, "stream closed");
}

/// Waits until a snapshot for `generator` is published; `None` when the server shuts down (or
/// the publisher is gone) first.
async fn first_snapshot(
    snapshots: &mut watch::Receiver<Arc<Snapshots>>,
    generator: Generator,
    closing: &mut watch::Receiver<bool>,
) -> Option<Arc<Snapshot>> {
    if let Some(snapshot) = snapshots.borrow_and_update().get(generator) {
        return Some(Arc::clone(snapshot));
    }
    tracing::debug!(
        generator = generator.name(),
        "waiting for the first snapshot"
    );
    tokio::select! {
        () = Connection::closed(closing) => None,
        ready = snapshots.wait_for(|s| s.get(generator).is_some()) => {
            ready.ok().and_then(|s| s.get(generator).cloned())
        }
    }
}

/// What each connection task needs.
pub(super) struct Connection {
    pub(super) snapshots: watch::Receiver<Arc<Snapshots>>,
    pub(super) status: StatusGuard,
    pub(super) closing: watch::Receiver<bool>,
    pub(super) metrics: Arc<Metrics>,
    wanted: Arc<watch::Sender<BTreeSet<Generator>>>,
    /// A stream of `SecretDiscoveryService` serves secrets only.
    secrets_only: bool,
}

impl Connection {
    /// The first request names the node: it identifies the connection and chooses its
    /// generator (Envoy's when no node is named). The generator becomes wanted, so the agent
    /// starts translating for it.
    fn identify(&mut self, node: Option<&Node>) -> Generator {
        let generator = node.map_or(Generator::Envoy, Generator::of_node);
        let node_id = node.map(|n| n.id.as_str()).unwrap_or_default();
        self.status.identify(node_id, generator);
        self.wanted
            .send_if_modified(|wanted| wanted.insert(generator));
        tracing::info!(node = %node_id, generator = generator.name(), "client connected");
        generator
    }

    /// The first step of answering any request, SotW or Delta: the type must be one this server
    /// serves; otherwise the stream ends with the reason.
    pub(super) async fn admit<T>(
        &mut self,
        out: &mpsc::Sender<Result<T, Status>>,
        type_url: &str,
    ) -> Result<TypeKind, Closed> {
        match request_type(type_url) {
            Ok(kind) if self.secrets_only && kind != TypeKind::Secret => {
                tracing::warn!(%type_url, "refusing a non-secret type on an SDS stream");
                let _ = out
                    .send(Err(Status::invalid_argument(format!(
                        "this is the SecretDiscoveryService: it serves {} only, not {type_url} \
                         (ask the AggregatedDiscoveryService on the same socket)",
                        TypeKind::Secret.type_url()
                    ))))
                    .await;
                Err(Closed)
            }
            Ok(kind) => Ok(kind),
            Err(status) => {
                tracing::warn!(%type_url, "refusing an unsupported type");
                let _ = out.send(Err(status)).await;
                Err(Closed)
            }
        }
    }

    /// Resolves when the server is shutting down.
    pub(super) async fn closed(closing: &mut watch::Receiver<bool>) {
        // A dropped sender also means the server is gone.
        let _ = closing.wait_for(|closing| *closing).await;
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.metrics.connections.dec();
    }
}

/// `envoy.service.discovery.v3.AggregatedDiscoveryService`, both SotW and Delta.
#[derive(Clone, Debug)]
pub struct AdsService {
    snapshots: watch::Receiver<Arc<Snapshots>>,
    wanted: Arc<watch::Sender<BTreeSet<Generator>>>,
    status: StatusRegistry,
    metrics: Arc<Metrics>,
    closing: Arc<watch::Sender<bool>>,
    next_id: Arc<AtomicU64>,
}

impl AdsService {
    /// Serves `publisher`'s snapshots and reports each connection in `status`.
    pub fn new(publisher: &SnapshotPublisher, status: StatusRegistry) -> Self {
        Self {
            snapshots: publisher.subscribe(),
            wanted: publisher.wanted_sender(),
            status,
            metrics: Arc::new(Metrics::default()),
            closing: Arc::new(watch::Sender::new(false)),
            next_id: Arc::new(AtomicU64::new(1)),
        }
    }

    /// Records connections, NACKs and push-to-ACK times in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Ends every open stream (clients see the stream end and reconnect elsewhere or later).
    pub fn close_streams(&self) {
        self.closing.send_replace(true);
    }

    fn connection(&self, protocol: Protocol, secrets_only: bool) -> (u64, Connection) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.metrics.connections.inc();
        let conn = Connection {
            snapshots: self.snapshots.clone(),
            status: self.status.register(id, protocol),
            closing: self.closing.subscribe(),
            metrics: Arc::clone(&self.metrics),
            wanted: Arc::clone(&self.wanted),
            secrets_only,
        };
        (id, conn)
    }
}

impl AdsService {
    /// Serves one SotW stream (`secrets_only` for SecretDiscoveryService's).
    fn sotw_stream(
        &self,
        requests: Streaming<DiscoveryRequest>,
        secrets_only: bool,
    ) -> Response<ReceiverStream<Result<DiscoveryResponse, Status>>> {
        let (tx, rx) = mpsc::channel(RESPONSE_BUFFER);
        let (id, conn) = self.connection(Protocol::Sotw, secrets_only);
        let span = if secrets_only {
            tracing::info_span!("sds", conn = id, protocol = "sotw")
        } else {
            tracing::info_span!("ads", conn = id, protocol = "sotw")
        };
        tokio::spawn(sotw::run(conn, requests, tx).instrument(span));
        Response::new(ReceiverStream::new(rx))
    }

    /// Serves one Delta stream (`secrets_only` for SecretDiscoveryService's).
    fn delta_stream(
        &self,
        requests: Streaming<DeltaDiscoveryRequest>,
        secrets_only: bool,
    ) -> Response<ReceiverStream<Result<DeltaDiscoveryResponse, Status>>> {
        let (tx, rx) = mpsc::channel(RESPONSE_BUFFER);
        let (id, conn) = self.connection(Protocol::Delta, secrets_only);
        let span = if secrets_only {
            tracing::info_span!("sds", conn = id, protocol = "delta")
        } else {
            tracing::info_span!("ads", conn = id, protocol = "delta")
        };
        tokio::spawn(delta::run(conn, requests, tx).instrument(span));
        Response::new(ReceiverStream::new(rx))
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsService {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Ok(self.sotw_stream(request.into_inner(), false))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Ok(self.delta_stream(request.into_inner(), false))
    }
}

/// `envoy.service.secret.v3.SecretDiscoveryService` on the same socket: what Envoy's `sds-grpc`
/// cluster asks for the workload certificate (`default`) and root (`ROOTCA`) when the agent
/// serves them, over the same SotW and Delta streams as ADS, restricted to secrets.
#[tonic::async_trait]
impl SecretDiscoveryService for AdsService {
    type StreamSecretsStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaSecretsStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_secrets(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamSecretsStream>, Status> {
        Ok(self.sotw_stream(request.into_inner(), true))
    }

    async fn delta_secrets(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        Ok(self.delta_stream(request.into_inner(), true))
    }

    async fn fetch_secrets(
        &self,
        _request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        Err(Status::unimplemented(
            "FetchSecrets (REST-style polling) is not served; use StreamSecrets or DeltaSecrets",
        ))
    }
}

/// How long connections may stay open after their streams were ended at shutdown.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Binds `path` (removing a stale socket left by an earlier run; any other kind of file there is an
/// error). The returned listener is ready: clients may connect as soon as this returns.
pub fn bind_unix(path: &Path) -> Result<UnixListener, ServeError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|source| ServeError::RemoveStale {
                path: path.to_owned(),
                source,
            })?;
        }
        Ok(_) => {
            return Err(ServeError::NotASocket {
                path: path.to_owned(),
            });
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(ServeError::RemoveStale {
                path: path.to_owned(),
                source,
            });
        }
    }
    UnixListener::bind(path).map_err(|source| ServeError::Bind {
        path: path.to_owned(),
        source,
    })
}

/// Serves `service` on `listener` (see [`bind_unix`]) until `shutdown` resolves; then ends every
/// open stream, waits for the connections to finish and removes the socket file `path`.
pub async fn serve_unix(
    listener: UnixListener,
    path: &Path,
    service: AdsService,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let closing = Arc::clone(&service.closing);
    let (signalled_tx, signalled) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        tracing::info!("ADS shutting down: closing streams");
        closing.send_replace(true);
        let _ = signalled_tx.send(());
    };
    let serve = tonic::transport::Server::builder()
        .add_service(AggregatedDiscoveryServiceServer::new(service.clone()))
        .add_service(SecretDiscoveryServiceServer::new(service))
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(listener).map(|conn| conn.map(authority::front)),
            signal,
        );
    tokio::pin!(serve);
    // Envoy keeps its connection open after its streams end (it would reconnect to a new
    // server on it); graceful shutdown would wait for it until the drain deadline.
    let result = tokio::select! {
        result = &mut serve => result,
        () = async {
            if signalled.await.is_ok() {
                tokio::time::sleep(CLOSE_GRACE).await;
            } else {
                std::future::pending::<()>().await;
            }
        } => {
            tracing::debug!("clients kept their connections open after their streams ended; closing them");
            Ok(())
        }
    };
    if let Err(err) = std::fs::remove_file(path) {
        tracing::debug!(path = %path.display(), error = %err, "socket file not removed");
    }
    result.map_err(ServeError::from)
}
