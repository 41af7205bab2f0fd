//! The API PCP serves: the store API, with every write admitted first (structure, Istio
//! validation, cross-resource warnings). The store behind it is embedded (sled, in-process) or
//! remote (`--store ADDR[,ADDR…]`), behind one client either way ([`Upstream`]); reads and
//! watches pass through unchanged.

use std::sync::Arc;
use std::time::Duration;

use pasa_proto::Object;
use pasa_proto::store::v1::store_client::StoreClient;
use pasa_proto::store::v1::store_server::{Store as StoreApi, StoreServer};
use pasa_proto::store::v1::{
    ApplyRequest, ApplyResponse, CancelReason, Cancelled, DeleteRequest, DeleteResponse,
    DocumentError, ErrorCode, GetRequest, GetResponse, ListProxyStatusRequest, ListRequest,
    ListResponse, ReportStatusRequest, ReportStatusResponse, StatusRequest, StatusResponse,
    Subscription, WatchRequest, WatchResponse, watch_request, watch_response,
};
use pasa_runtime::blocking::Pool;
use pasa_store::access::{Access, on_behalf};
use pasa_store::service::{ProxyStatusStream, StoreService, WatchStream, admitted};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tower::ServiceExt;
use tower::util::BoxCloneSyncService;

use crate::metrics::{Metrics, Origin};
use pasa_validation::admission::{self, Checked};
use pasa_validation::analysis;
use pasa_validation::validation::Author;

/// The gRPC transport to the store: the network (`Channel`) for a remote store, or the embedded
/// store's own server called in-process. Either way one client type speaks to it, so the API
/// PCP serves is written once (each RPC forwards through [`Upstream::client`]); the in-process
/// path costs an encode and decode per message, nothing else.
pub type Transport = BoxCloneSyncService<
    http::Request<tonic::body::Body>,
    http::Response<tonic::body::Body>,
    TransportError,
>;

/// A failure of the network transport (the in-process one cannot fail). A type of its own, not
/// a boxed error: futures holding a `Box<dyn Error>` error type trip the compiler's `Send`
/// inference in tonic's generated code.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct TransportError(#[from] tonic::transport::Error);

/// Where writes go once admitted: the store in this process, or store servers reached over
/// gRPC (one, or replicas sharing one backend). With several replicas, every call goes to one of
/// them, in the order given, and moves to the next when it cannot be reached: one replica does
/// the writing at a time, so replicas do not contend for the store's revision.
#[derive(Clone)]
pub struct Upstream {
    replicas: Arc<Replicas>,
}

struct Replicas {
    clients: Vec<StoreClient<Transport>>,
    addresses: Vec<String>,
    /// Index of the replica in use.
    current: std::sync::atomic::AtomicUsize,
}

/// How long analysis may wait for the store: it only adds warnings, and the webhook must answer
/// well within the API server's timeout.
const ANALYSIS_TIMEOUT: Duration = Duration::from_secs(3);

impl Upstream {
    /// The store in this process.
    pub fn embedded(service: StoreService) -> Upstream {
        let server = ServiceExt::<http::Request<tonic::body::Body>>::map_err(
            service.into_server(),
            |never: std::convert::Infallible| -> TransportError { match never {} },
        );
        Upstream::over(
            vec![BoxCloneSyncService::new(server)],
            vec!["embedded".into()],
        )
    }

    /// Connects to the store servers at `addresses` and checks they can serve together: several
    /// addresses must be replicas of one shared backend, since servers with their own embedded
    /// (sled) database hold different data. Each must answer at start.
    /// With `tls`, over mutual TLS.
    pub async fn remote(
        addresses: &[String],
        tls: Option<&pasa_proto::client::ClientTls>,
    ) -> anyhow::Result<Upstream> {
        if addresses.is_empty() {
            anyhow::bail!("--store needs at least one address");
        }
        let mut transports = Vec::new();
        for addr in addresses {
            let channel = pasa_proto::client::channel(addr, tls)
                .await
                .map_err(|e| match e {
                    pasa_proto::client::ConnectError::Address(e) => anyhow::anyhow!("--store {e}"),
                    e => anyhow::anyhow!("{e} (--store)"),
                })?;
            let status = pasa_proto::client::store_client(channel.clone())
                .status(StatusRequest {})
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "the store at {addr} (--store) does not answer: {}",
                        e.message()
                    )
                })?
                .into_inner();
            if addresses.len() > 1 && status.backend == "sled" {
                anyhow::bail!(
                    "--store {addr} keeps its own embedded (sled) database, so several --store \
                     addresses would each hold different data; give one address, or store \
                     replicas that share one backend"
                );
            }
            let channel = tower::ServiceExt::map_err(channel, TransportError);
            transports.push(BoxCloneSyncService::new(channel));
        }
        Ok(Upstream::over(transports, addresses.to_vec()))
    }

    fn over(transports: Vec<Transport>, addresses: Vec<String>) -> Upstream {
        Upstream {
            replicas: Arc::new(Replicas {
                clients: transports
                    .into_iter()
                    .map(pasa_proto::client::store_client)
                    .collect(),
                addresses,
                current: std::sync::atomic::AtomicUsize::new(0),
            }),
        }
    }

    fn current(&self) -> usize {
        self.replicas
            .current
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A client of the store replica in use (cheap: clones share the transport). For a call
    /// that can be repeated, prefer [`Upstream::call`], which moves to another replica.
    pub fn client(&self) -> StoreClient<Transport> {
        self.replicas.clients[self.current()].clone()
    }

    /// Runs `rpc` with (a copy of) `request` on the replica in use; when that replica cannot be reached (`Unavailable`),
    /// moves to the next one and runs it there, once per replica. A call whose answer was lost
    /// with its connection may so run twice: store writes set content, so the second finds it
    /// unchanged.
    pub async fn call<R: Clone, T, Fut>(
        &self,
        request: &R,
        rpc: impl Fn(StoreClient<Transport>, R) -> Fut,
    ) -> Result<T, Status>
    where
        Fut: Future<Output = Result<T, Status>>,
    {
        let replicas = self.replicas.clients.len();
        let mut attempt = 1;
        loop {
            let index = self.current();
            match rpc(self.replicas.clients[index].clone(), request.clone()).await {
                Err(status) if status.code() == tonic::Code::Unavailable && attempt < replicas => {
                    self.failed(index, &status);
                    attempt += 1;
                }
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    self.failed(index, &status);
                    return Err(status);
                }
                other => return other,
            }
        }
    }

    /// The replica at `index` could not be reached: the next one takes over (unless another
    /// call already moved on).
    pub fn failed(&self, index: usize, status: &Status) {
        let replicas = &self.replicas;
        let next = (index + 1) % replicas.clients.len();
        if next != index
            && replicas
                .current
                .compare_exchange(
                    index,
                    next,
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                )
                .is_ok()
        {
            tracing::warn!(
                unreachable = %replicas.addresses[index],
                now = %replicas.addresses[next],
                error = %status.message(),
                "store replica unreachable; moving to the next (--store)"
            );
        }
    }
}

/// The PCP gRPC service.
#[derive(Clone)]
pub struct WriteService {
    upstream: Upstream,
    metrics: Arc<Metrics>,
    /// The cluster domain short host names resolve in (`--domain-suffix`).
    domain_suffix: Arc<str>,
    /// Turns true when the API stops (after the webhook drained): forwarded watches and status
    /// reports end then.
    stop: watch::Receiver<bool>,
    /// Who may do what through this API; the store hears whom PCP relays each call for.
    access: Access,
    /// Where documents are read, validated and analyzed: off the async workers, a bounded
    /// number of batches at a time.
    pool: Pool,
}

impl WriteService {
    pub fn new(
        upstream: Upstream,
        metrics: Arc<Metrics>,
        domain_suffix: &str,
        stop: watch::Receiver<bool>,
    ) -> Self {
        WriteService {
            upstream,
            metrics,
            domain_suffix: domain_suffix.into(),
            stop,
            access: Access::plaintext(),
            pool: Pool::per_core(),
        }
    }

    /// Decides access by `access` (mutual TLS) instead of allowing every caller.
    pub fn with_access(mut self, access: Access) -> Self {
        self.access = access;
        self
    }

    pub fn into_server(self) -> StoreServer<WriteService> {
        StoreServer::new(self)
            .max_decoding_message_size(pasa_proto::client::MAX_MESSAGE_SIZE)
            .max_encoding_message_size(pasa_proto::client::MAX_MESSAGE_SIZE)
    }

    /// PCP's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Where admitted writes go.
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// The pool that runs the work on user input (reading, validation, analysis).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Checks documents (each already read as JSON, or why not): structure and Istio validation,
    /// then, when all are valid, the cross-resource warnings against what is stored.
    pub async fn admit(
        &self,
        docs: Vec<Result<Value, String>>,
        default_namespace: &str,
        origin: Origin,
    ) -> Checked {
        let author = author_of(origin);
        let namespace = default_namespace.to_string();
        self.admit_with(origin, move || {
            admission::check_documents_by(&docs, &namespace, author)
        })
        .await
    }

    /// Runs `check` (the documents' own checks) and, when it admits them, the analysis, both on
    /// the pool; the store is read in between for what the batch refers to.
    async fn admit_with(
        &self,
        origin: Origin,
        check: impl FnOnce() -> Checked + Send + 'static,
    ) -> Checked {
        let suffix = self.domain_suffix.clone();
        let checked = self
            .pool
            .run(move || {
                let checked = check();
                let lookups = if checked.is_admitted() {
                    let batch: Vec<&Object> = checked.objects.iter().flatten().collect();
                    analysis::lookups(&batch, &suffix)
                } else {
                    None
                };
                (checked, lookups)
            })
            .await;
        let (checked, lookups) = match checked {
            Ok(done) => done,
            Err(e) => return unchecked(&e),
        };
        self.metrics.count_admission(origin, &checked);
        if !checked.is_admitted() {
            return checked;
        }
        let existing = self.related_objects(lookups).await;
        let suffix = self.domain_suffix.clone();
        self.pool
            .run(move || {
                let mut checked = checked;
                admission::analyze(&mut checked, &existing, &suffix);
                checked
            })
            .await
            .unwrap_or_else(|e| unchecked(&e))
    }

    /// Admits a batch and, when every document is valid, writes it as one atomic store batch.
    /// Warnings come back either way. A batch over [`admission::MAX_BATCH_BYTES`] is refused
    /// whole, unread.
    pub async fn admit_and_apply(
        &self,
        req: ApplyRequest,
        origin: Origin,
    ) -> Result<ApplyResponse, Status> {
        admission::check_batch_size(req.documents.iter().map(|d| d.json.len()))
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let author = author_of(origin);
        let req = Arc::new(req);
        let batch = req.clone();
        let checked = self
            .admit_with(origin, move || {
                admission::check_batch(&batch.documents, "default", author)
            })
            .await;
        // The pool is done with its copy.
        let req = Arc::try_unwrap(req).unwrap_or_else(|shared| (*shared).clone());
        if !checked.is_admitted() {
            // What the store itself would refuse in the other documents (the same object twice in
            // the batch), so that one answer names every bad document.
            let mut errors = checked.errors;
            let dry_run = ApplyRequest {
                documents: req.documents,
                dry_run: true,
            };
            let answer = self
                .upstream
                .call(&dry_run, |mut store, dry_run| async move {
                    store.apply(admitted(dry_run)).await
                });
            if let Ok(Ok(store)) = tokio::time::timeout(ANALYSIS_TIMEOUT, answer).await {
                let store = store.into_inner();
                let named: std::collections::HashSet<u32> =
                    errors.iter().map(|e| e.index).collect();
                errors.extend(
                    store
                        .errors
                        .into_iter()
                        .filter(|e| !named.contains(&e.index)),
                );
                errors.sort_by_key(|e| e.index);
            }
            return Ok(ApplyResponse {
                errors,
                warnings: checked.warnings,
                ..Default::default()
            });
        }
        // Admitted here: a store that checks what it is given (`pasa-store`) need not again.
        let mut response = self
            .upstream
            .call(&req, |mut store, req| async move {
                store.apply(admitted(req)).await
            })
            .await?
            .into_inner();
        response.warnings.extend(checked.warnings);
        Ok(response)
    }

    /// The stored objects the batch's references may point to. Analysis only adds warnings, so
    /// a store that cannot answer costs the warnings, not the write.
    async fn related_objects(&self, lookups: Option<Subscription>) -> Vec<Object> {
        let Some(selector) = lookups else {
            return Vec::new();
        };
        let request = ListRequest {
            selector: Some(selector),
            revision: 0,
        };
        let answer = self
            .upstream
            .call(&request, |mut store, request| async move {
                store.list(request).await
            });
        let list = tokio::time::timeout(ANALYSIS_TIMEOUT, answer).await;
        match list {
            Ok(Ok(list)) => list
                .into_inner()
                .resources
                .iter()
                .filter_map(|r| {
                    let doc = pasa_proto::object::manifest(r);
                    Object::from_json(
                        &doc,
                        &r.namespace,
                        pasa_istio::generated::is_generated_object,
                    )
                    .ok()
                })
                .collect(),
            Ok(Err(status)) => {
                tracing::warn!(error = %status.message(), "cannot read related objects for analysis");
                Vec::new()
            }
            Err(_) => {
                tracing::warn!(
                    timeout = ?ANALYSIS_TIMEOUT,
                    "the store did not answer in time; analysis skipped"
                );
                Vec::new()
            }
        }
    }

    /// Forwards the store's watch stream until it ends, its client goes, or the API stops; then
    /// the client hears `CANCELLED{SHUTDOWN}` with the revision to resume from, as from a store:
    /// 0 (list again) while a snapshot is still arriving, else the revision after the last one
    /// forwarded (or the one the watch asked for, when nothing was).
    fn forward_watch(
        &self,
        from_revision: u64,
        mut upstream: Streaming<WatchResponse>,
    ) -> WatchStream {
        let (tx, rx) = mpsc::channel(8);
        let stopping = pasa_runtime::drain::stopped(self.stop.clone());
        tokio::spawn(async move {
            tokio::pin!(stopping);
            let mut through = 0u64;
            let mut synced = false;
            loop {
                tokio::select! {
                    _ = &mut stopping => {
                        let resume_revision = match (from_revision, synced, through) {
                            // A snapshot not yet complete: only a new one loses nothing.
                            (0, false, _) => 0,
                            (from, _, 0) => from,
                            (_, _, through) => through + 1,
                        };
                        let notice = WatchResponse {
                            response: Some(watch_response::Response::Cancelled(Cancelled {
                                reason: CancelReason::Shutdown as i32,
                                message: "pasa-pcp is shutting down; watch again from resume_revision".into(),
                                resume_revision,
                                compact_revision: 0,
                            })),
                        };
                        let _ = tx.send(Ok(notice)).await;
                        break;
                    }
                    // The client is gone: so is the store's watch, once `upstream` drops.
                    () = tx.closed() => break,
                    message = upstream.message() => match message {
                        Ok(Some(m)) => {
                            through = through.max(revision_of(&m));
                            synced |= matches!(m.response, Some(watch_response::Response::Synced(_)));
                            if tx.send(Ok(m)).await.is_err() {
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(status) => {
                            let _ = tx.send(Err(status)).await;
                            break;
                        }
                    },
                }
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }
}

/// Who wrote what comes in from `origin`, for validation.
fn author_of(origin: Origin) -> Author {
    match origin {
        Origin::Generated => Author::Generator,
        _ => Author::User,
    }
}

/// The verdict on a batch whose checks did not finish (a bug): refused, saying so.
fn unchecked(e: &tokio::task::JoinError) -> Checked {
    tracing::error!(error = %e, "checking a batch failed");
    Checked {
        errors: vec![DocumentError {
            message: format!(
                "PCP could not finish checking this batch ({e}); nothing was written: please \
                 report it, with the batch"
            ),
            code: ErrorCode::Invalid as i32,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The revision a watch message brings the watcher up to (0 for none).
fn revision_of(m: &WatchResponse) -> u64 {
    match &m.response {
        Some(watch_response::Response::Events(batch)) => {
            batch.events.iter().map(|e| e.revision).max().unwrap_or(0)
        }
        Some(watch_response::Response::Synced(s)) => s.revision,
        Some(watch_response::Response::Progress(p)) => p.revision,
        _ => 0,
    }
}

/// Every RPC but `Apply` passes through to the store; watches and status reports end when PCP
/// shuts down.
#[tonic::async_trait]
impl StoreApi for WriteService {
    async fn apply(
        &self,
        request: Request<ApplyRequest>,
    ) -> Result<Response<ApplyResponse>, Status> {
        let caller = self.access.caller("Apply", &request)?;
        self.access.write("Apply", &caller)?;
        self.admit_and_apply(request.into_inner(), Origin::Grpc)
            .await
            .map(Response::new)
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let caller = self.access.caller("Delete", &request)?;
        let request = request.into_inner();
        self.upstream
            .call(&request, |mut store, request| {
                let request = on_behalf(&caller, request);
                async move { store.delete(request).await }
            })
            .await
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let caller = self.access.caller("Get", &request)?;
        let request = request.into_inner();
        self.upstream
            .call(&request, |mut store, request| {
                let request = on_behalf(&caller, request);
                async move { store.get(request).await }
            })
            .await
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let caller = self.access.caller("List", &request)?;
        let request = request.into_inner();
        self.upstream
            .call(&request, |mut store, request| {
                let request = on_behalf(&caller, request);
                async move { store.list(request).await }
            })
            .await
    }

    type WatchStream = WatchStream;
    type ListProxyStatusStream = ProxyStatusStream;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        // The first request (the create; the store checks that it is) says where the watch
        // starts, for the shutdown notice; it and the rest flow to the store until the client
        // stops or errs.
        let caller = self.access.caller("Watch", &request)?;
        let mut incoming = request.into_inner();
        let first = incoming.message().await?;
        let from_revision = match first.as_ref().and_then(|r| r.request.as_ref()) {
            Some(watch_request::Request::Create(create)) => create.from_revision,
            _ => 0,
        };
        let requests = tokio_stream::iter(first).chain(incoming.map_while(Result::ok));
        // A stream cannot be sent twice: an unreachable replica fails this watch (the agent
        // resumes), and the next one goes to another replica.
        let index = self.upstream.current();
        let response = self
            .upstream
            .client()
            .watch(on_behalf(&caller, requests))
            .await
            .inspect_err(|s| {
                if s.code() == tonic::Code::Unavailable {
                    self.upstream.failed(index, s);
                }
            })?;
        Ok(Response::new(
            self.forward_watch(from_revision, response.into_inner()),
        ))
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        self.access.caller("Status", &request)?;
        self.upstream
            .call(&StatusRequest {}, |mut store, request| async move {
                store.status(request).await
            })
            .await
    }

    async fn report_status(
        &self,
        request: Request<Streaming<ReportStatusRequest>>,
    ) -> Result<Response<ReportStatusResponse>, Status> {
        // The agent's reports flow to the store until the agent stops or PCP does; the store
        // then sees the stream end and shows the proxy as lost contact.
        let caller = self.access.caller("ReportStatus", &request)?;
        let reports = request.into_inner().map_while(Result::ok);
        let index = self.upstream.current();
        let mut client = self.upstream.client();
        tokio::select! {
            () = pasa_runtime::drain::stopped(self.stop.clone()) => {
                Ok(Response::new(ReportStatusResponse {}))
            }
            answer = client.report_status(on_behalf(&caller, reports)) => answer.inspect_err(|s| {
                if s.code() == tonic::Code::Unavailable {
                    self.upstream.failed(index, s);
                }
            }),
        }
    }

    async fn list_proxy_status(
        &self,
        request: Request<ListProxyStatusRequest>,
    ) -> Result<Response<ProxyStatusStream>, Status> {
        let caller = self.access.caller("ListProxyStatus", &request)?;
        self.access.list_proxies(&caller)?;
        let request = request.into_inner();
        let pages = self
            .upstream
            .call(&request, |mut store, request| {
                let request = on_behalf(&caller, request);
                async move { store.list_proxy_status(request).await }
            })
            .await?
            .into_inner();
        Ok(Response::new(Box::pin(pages) as ProxyStatusStream))
    }
}
