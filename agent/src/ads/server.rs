//! The gRPC service and serving it on a Unix socket.

use std::future::Future;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use super::snapshot::{Snapshot, SnapshotPublisher};
use super::status::{Protocol, StatusGuard, StatusRegistry};
use super::{RESPONSE_BUFFER, TypeKind, authority, delta, request_type, sotw};

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

/// One stream's loop: answer requests, push new snapshots, stop on shutdown or when the client
/// goes. When the publisher is gone, the last snapshot keeps being served.
pub(super) async fn drive<H: StreamHandler>(
    mut handler: H,
    mut closing: watch::Receiver<bool>,
    mut snapshots: watch::Receiver<Arc<Snapshot>>,
    mut requests: Streaming<H::Request>,
) {
    let mut snapshot = Arc::clone(&snapshots.borrow_and_update());
    let mut watching = true;
    tracing::debug!(protocol = H::NAME, "stream opened");
    loop {
        tokio::select! {
            () = Connection::closed(&mut closing) => break,
            request = requests.message() => match request {
                Ok(Some(request)) => {
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
                snapshot = Arc::clone(&snapshots.borrow_and_update());
                if handler.on_snapshot(&snapshot).await.is_err() {
                    break;
                }
            }
        }
    }
    tracing::debug!(protocol = H::NAME, "stream closed");
}

/// What each connection task needs.
pub(super) struct Connection {
    pub(super) snapshots: watch::Receiver<Arc<Snapshot>>,
    pub(super) status: StatusGuard,
    pub(super) closing: watch::Receiver<bool>,
    /// Whether a request has named the node yet (clients send it on the first request only).
    node_seen: bool,
}

impl Connection {
    /// The first steps of answering any request, SotW or Delta: the type must be one this server
    /// serves (otherwise the stream ends with the reason), and the first node named identifies the
    /// connection.
    pub(super) async fn admit<T>(
        &mut self,
        out: &mpsc::Sender<Result<T, Status>>,
        type_url: &str,
        node: Option<&envoy_types::pb::envoy::config::core::v3::Node>,
    ) -> Result<TypeKind, Closed> {
        let kind = match request_type(type_url) {
            Ok(kind) => kind,
            Err(status) => {
                tracing::warn!(%type_url, "refusing an unsupported type");
                let _ = out.send(Err(status)).await;
                return Err(Closed);
            }
        };
        if !self.node_seen
            && let Some(node) = node
        {
            self.node_seen = true;
            self.status.set_node(&node.id);
            tracing::info!(node = %node.id, "client connected");
        }
        Ok(kind)
    }

    /// Resolves when the server is shutting down.
    pub(super) async fn closed(closing: &mut watch::Receiver<bool>) {
        // A dropped sender also means the server is gone.
        let _ = closing.wait_for(|closing| *closing).await;
    }
}

/// `envoy.service.discovery.v3.AggregatedDiscoveryService`, both SotW and Delta.
#[derive(Clone, Debug)]
pub struct AdsService {
    snapshots: watch::Receiver<Arc<Snapshot>>,
    status: StatusRegistry,
    closing: Arc<watch::Sender<bool>>,
    next_id: Arc<AtomicU64>,
}

impl AdsService {
    /// Serves `publisher`'s snapshots and reports each connection in `status`.
    pub fn new(publisher: &SnapshotPublisher, status: StatusRegistry) -> Self {
        Self {
            snapshots: publisher.subscribe(),
            status,
            closing: Arc::new(watch::Sender::new(false)),
            next_id: Arc::new(AtomicU64::new(1)),
        }
    }

    /// Ends every open stream (clients see the stream end and reconnect elsewhere or later).
    pub fn close_streams(&self) {
        self.closing.send_replace(true);
    }

    fn connection(&self, protocol: Protocol) -> (u64, Connection) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Connection {
            snapshots: self.snapshots.clone(),
            status: self.status.register(id, protocol),
            closing: self.closing.subscribe(),
            node_seen: false,
        };
        (id, conn)
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
        let (tx, rx) = mpsc::channel(RESPONSE_BUFFER);
        let (id, conn) = self.connection(Protocol::Sotw);
        let span = tracing::info_span!("ads", conn = id, protocol = "sotw");
        tokio::spawn(sotw::run(conn, request.into_inner(), tx).instrument(span));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let (tx, rx) = mpsc::channel(RESPONSE_BUFFER);
        let (id, conn) = self.connection(Protocol::Delta);
        let span = tracing::info_span!("ads", conn = id, protocol = "delta");
        tokio::spawn(delta::run(conn, request.into_inner(), tx).instrument(span));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

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
    let signal = async move {
        shutdown.await;
        tracing::info!("ADS shutting down: closing streams");
        closing.send_replace(true);
    };
    let result = tonic::transport::Server::builder()
        .add_service(AggregatedDiscoveryServiceServer::new(service))
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(listener).map(|conn| conn.map(authority::front)),
            signal,
        )
        .await;
    if let Err(err) = std::fs::remove_file(path) {
        tracing::debug!(path = %path.display(), error = %err, "socket file not removed");
    }
    result.map_err(ServeError::from)
}
