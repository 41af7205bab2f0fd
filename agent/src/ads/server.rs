//! The gRPC service and serving it on a Unix socket.

use std::collections::BTreeSet;
use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use super::service::discovery::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use super::service::secret::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use super::snapshot::{SnapshotPublisher, Snapshots};
use super::status::{Protocol, StatusRegistry};
use super::stream::Connection;
use super::wire::{DeltaDiscoveryResponse, DiscoveryResponse};
use super::{RESPONSE_BUFFER, authority, delta, sotw};
use crate::metrics::Metrics;
use crate::model::proxy::{Generator, ProxyBuild};

/// Why serving stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "{path} exists and is not a socket; refusing to replace it (choose another socket path)"
    )]
    NotASocket { path: PathBuf },
    #[error(
        "{path} is in use: another agent serves it (a connection to it was answered); stop \
         that agent, or give this one another socket path (--uds)"
    )]
    InUse { path: PathBuf },
    #[error(
        "cannot tell whether another process serves the socket {path}: {source} (remove the \
         file if no agent runs, or choose another socket path)"
    )]
    Probe {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
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

/// `envoy.service.discovery.v3.AggregatedDiscoveryService`, both SotW and Delta.
#[derive(Clone, Debug)]
pub struct AdsService {
    snapshots: watch::Receiver<Arc<Snapshots>>,
    wanted: Arc<watch::Sender<BTreeSet<Generator>>>,
    status: StatusRegistry,
    metrics: Arc<Metrics>,
    closing: Arc<watch::Sender<bool>>,
    next_id: Arc<AtomicU64>,
    build: ProxyBuild,
    dns_domain: Arc<str>,
    file_secrets: Option<FileSecrets>,
    on_demand: Option<OnDemandLink>,
}

pub use super::stream::{FileSecrets, OnDemandLink};

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
            build: ProxyBuild::Envoy,
            dns_domain: Arc::from(""),
            file_secrets: None,
            on_demand: None,
        }
    }

    /// Serves an on-demand proxy: VHDS requests go to `link` to be learned, and clients that
    /// cannot take the on-demand scope are refused, saying why.
    pub fn with_on_demand(mut self, link: OnDemandLink) -> Self {
        self.on_demand = Some(link);
        self
    }

    /// Serves secrets of files of the pod with `secrets`, where the agent is Envoy's SDS server.
    pub fn with_file_secrets(mut self, secrets: FileSecrets) -> Self {
        self.file_secrets = Some(secrets);
        self
    }

    /// The proxy's DNS domain (`<namespace>.svc.cluster.local`): a proxyless gRPC client may
    /// name a service of its namespace by a short name, as with istiod.
    pub fn with_dns_domain(mut self, dns_domain: &str) -> Self {
        self.dns_domain = Arc::from(dns_domain);
        self
    }

    /// The Envoy build translated for: a client of another is logged as it connects.
    pub fn with_build(mut self, build: ProxyBuild) -> Self {
        self.build = build;
        self
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
            build: self.build,
            dns_domain: Arc::clone(&self.dns_domain),
            file_secrets: self.file_secrets.clone(),
            protocol,
            generator: None,
            on_demand: self.on_demand.clone(),
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

/// How long the probe of an existing socket file waits for a connection to be taken: a listener
/// that takes none within it (its backlog full, or its process stopped) still belongs to
/// someone.
const PROBE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(1);

/// A Unix socket this process bound: the listener, and the socket file it made.
#[derive(Debug)]
pub struct BoundSocket {
    pub listener: UnixListener,
    pub file: SocketFile,
}

/// The socket file a [`BoundSocket`] made, removed when dropped, unless the path holds another
/// file by then (another process's socket is never removed).
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    /// The device and inode of the file this process made.
    made: (u64, u64),
}

impl SocketFile {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(meta) if (meta.dev(), meta.ino()) == self.made => {
                if let Err(err) = std::fs::remove_file(&self.path) {
                    tracing::warn!(path = %self.path.display(), error = %err, "socket file not removed");
                }
            }
            Ok(_) => tracing::info!(
                path = %self.path.display(),
                "the socket path holds another process's file now; left in place"
            ),
            Err(err) => {
                tracing::debug!(path = %self.path.display(), error = %err, "socket file already gone");
            }
        }
    }
}

/// Binds `path`. A socket file already there is probed first: when something answers a
/// connection to it, another process serves it and the bind is refused
/// ([`ServeError::InUse`]); when nothing does, it is stale (left by a run that ended without
/// removing it) and replaced. Any other kind of file there is an error. Probing blocks for at
/// most [`PROBE_DEADLINE`]: call it off the async runtime's workers. The returned listener is
/// ready: clients may connect as soon as this returns; its file goes when the [`SocketFile`] is
/// dropped.
pub fn bind_unix(path: &Path) -> Result<BoundSocket, ServeError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            let answered = answers(path).map_err(|source| ServeError::Probe {
                path: path.to_owned(),
                source,
            })?;
            if answered {
                return Err(ServeError::InUse {
                    path: path.to_owned(),
                });
            }
            tracing::info!(path = %path.display(), "replacing a stale socket file (nothing answers on it)");
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
    let listener = UnixListener::bind(path).map_err(|source| ServeError::Bind {
        path: path.to_owned(),
        source,
    })?;
    let meta = std::fs::symlink_metadata(path).map_err(|source| ServeError::Bind {
        path: path.to_owned(),
        source,
    })?;
    Ok(BoundSocket {
        listener,
        file: SocketFile {
            path: path.to_owned(),
            made: (meta.dev(), meta.ino()),
        },
    })
}

/// Whether a process takes connections on the socket file `path`: `false` when the connection
/// is refused (nobody listens: the file is stale) or the file went meanwhile.
fn answers(path: &Path) -> io::Result<bool> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let target = path.to_owned();
    // A connection to a listener whose backlog is full waits for it: on a thread of its own,
    // which ends when the connection is taken or refused.
    std::thread::Builder::new()
        .name("socket-probe".into())
        .spawn(move || {
            let _ = tx.send(std::os::unix::net::UnixStream::connect(&target).map(drop));
        })?;
    match rx.recv_timeout(PROBE_DEADLINE) {
        Ok(Ok(())) => Ok(true),
        Ok(Err(err))
            if matches!(
                err.kind(),
                io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
            ) =>
        {
            Ok(false)
        }
        Ok(Err(err)) => Err(err),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(true),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Err(io::Error::other("the probe ended without an answer"))
        }
    }
}

/// Serves `service` on a loopback TCP listener (plaintext gRPC) until `shutdown` resolves: for
/// a pilot-agent that forwards its Envoy's xDS here (`discoveryAddress`), as the sidecar
/// injected next to Istio's does. Go's gRPC sends a host name as `:authority`, so no front is
/// needed.
pub async fn serve_tcp(
    listener: tokio::net::TcpListener,
    service: AdsService,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    serve_incoming(incoming, service, shutdown)
        .await
        .map_err(ServeError::from)
}

/// Serves `service` on the connections of `incoming` until `shutdown` resolves; then ends every
/// open stream and waits (at most [`CLOSE_GRACE`]) for the connections to finish.
async fn serve_incoming<IO>(
    incoming: impl tokio_stream::Stream<Item = io::Result<IO>>,
    service: AdsService,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    IO: tonic::transport::server::Connected
        + tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + Send
        + Unpin
        + 'static,
{
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
        .serve_with_incoming_shutdown(incoming, signal);
    tokio::pin!(serve);
    // Envoy keeps its connection open after its streams end (it would reconnect to a new
    // server on it); graceful shutdown would wait for it until the drain deadline.
    tokio::select! {
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
    }
}

/// Serves `service` on `socket` (see [`bind_unix`]) until `shutdown` resolves; then ends every
/// open stream, waits for the connections to finish and removes the socket file (when it is
/// still the one `socket` made).
pub async fn serve_unix(
    socket: BoundSocket,
    service: AdsService,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let BoundSocket { listener, file } = socket;
    let result = serve_listener(listener, service, shutdown).await;
    drop(file);
    result
}

/// Serves `service` on `listener` until `shutdown` resolves, leaving its socket file to whoever
/// holds its [`SocketFile`].
pub async fn serve_listener(
    listener: UnixListener,
    service: AdsService,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let incoming = UnixListenerStream::new(listener).map(|conn| conn.map(authority::front));
    serve_incoming(incoming, service, shutdown)
        .await
        .map_err(ServeError::from)
}
