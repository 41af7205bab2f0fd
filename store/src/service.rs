//! The `pasa.store.v1.Store` gRPC service over a [`Store`].

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use pasa_proto::store::v1::store_server::{Store as StoreApi, StoreServer};
use pasa_proto::store::v1::{
    ApplyDocument, ApplyRequest, ApplyResponse, DeleteRequest, DeleteResponse, DocumentError,
    GetRequest, GetResponse, KindCount, ListProxyStatusRequest, ListProxyStatusResponse,
    ListRequest, ListResponse, ReportStatusRequest, ReportStatusResponse, StatusRequest,
    StatusResponse, WatchRequest, WatchResponse, watch_request,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::access::{Access, Caller};
use crate::record::ObjectKey;

/// How long a replica waits for another's proxy status.
const PEER_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
use crate::selector::Selector;
use crate::status::StatusError;
use crate::store::{Store, StoreError};

/// What a store server checks in a batch before writing it: the standalone `pasa-store` refuses
/// what PCP would refuse (Istio validation), without this library depending on the validation.
pub trait Admission: Send + Sync + 'static {
    /// The problems of the batch's documents, each with its document's index (none admits the
    /// batch), or why the batch is refused whole (too large to check: the error says what to
    /// do). Called on a blocking thread (see [`StoreService::with_admission`]), so it may take
    /// time in proportion to the batch.
    fn check(&self, documents: &[ApplyDocument]) -> Result<Vec<DocumentError>, BatchRefused>;
}

/// Why an [`Admission`] refuses a whole batch; the message tells the caller what to do.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct BatchRefused(pub Box<dyn std::error::Error + Send + Sync>);

/// The request header by which PCP says it has admitted the batch it relays (its own
/// validation, and its own relaxations for what it generates): the store then does not check it
/// again. Believed from an operator, or where nobody is verified (plaintext, where any caller may
/// write anything anyway); ignored from workloads, which may not write.
pub const ADMITTED_HEADER: &str = "x-pasa-admitted";

/// `request`, marked as admitted by PCP (see [`ADMITTED_HEADER`]).
pub fn admitted<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        ADMITTED_HEADER,
        tonic::metadata::MetadataValue::from_static("pcp"),
    );
    request
}

/// The gRPC face of a store.
#[derive(Clone)]
pub struct StoreService {
    store: Store,
    access: Access,
    /// How this server reaches the other replicas (over mutual TLS when it serves it).
    peer_tls: Option<pasa_proto::client::ClientTls>,
    /// What batches are checked by before they are written, and the pool that runs the checks.
    admission: Option<(Arc<dyn Admission>, pasa_runtime::blocking::Pool)>,
}

impl StoreService {
    /// The service in plaintext: callers are not verified (see [`Access`]).
    pub fn new(store: Store) -> Self {
        StoreService {
            store,
            access: Access::plaintext(),
            peer_tls: None,
            admission: None,
        }
    }

    /// Checks every batch with `admission` before writing it (unless PCP admitted it, see
    /// [`ADMITTED_HEADER`]), on a blocking pool of one job per core: a large batch holds
    /// neither the async workers nor shutdown.
    pub fn with_admission(mut self, admission: Arc<dyn Admission>) -> Self {
        self.admission = Some((admission, pasa_runtime::blocking::Pool::per_core()));
        self
    }

    /// Whether `request` must be checked: an admission is set, and PCP did not admit it already.
    fn must_check<T>(&self, caller: &Caller, request: &Request<T>) -> bool {
        let relayed_admitted = request.metadata().get(ADMITTED_HEADER).is_some()
            && matches!(caller, Caller::Unverified | Caller::Operator(_));
        self.admission.is_some() && !relayed_admitted
    }

    /// Checks a batch with the admission, if any: its errors, and (when there are some) the
    /// store's own errors of the other documents, so that one answer names every bad document.
    /// The batch comes back to be written.
    async fn admit(&self, req: ApplyRequest) -> Result<(ApplyRequest, Vec<DocumentError>), Status> {
        let Some((admission, pool)) = &self.admission else {
            return Ok((req, Vec::new()));
        };
        let admission = admission.clone();
        let (req, checked) = pool
            .run(move || {
                let checked = admission.check(&req.documents);
                (req, checked)
            })
            .await
            .map_err(|e| Status::internal(format!("checking the batch failed: {e}")))?;
        let mut errors = checked.map_err(|e| Status::invalid_argument(e.to_string()))?;
        if errors.is_empty() {
            return Ok((req, errors));
        }
        if let Ok(dry) = self.store.apply(req.documents.clone(), true).await {
            let named: std::collections::HashSet<u32> = errors.iter().map(|e| e.index).collect();
            errors.extend(dry.errors.into_iter().filter(|e| !named.contains(&e.index)));
            errors.sort_by_key(|e| e.index);
        }
        Ok((req, errors))
    }

    /// The service deciding by `access`; `peer_tls` is how it reaches other replicas.
    pub fn with_access(
        mut self,
        access: Access,
        peer_tls: Option<pasa_proto::client::ClientTls>,
    ) -> Self {
        self.access = access;
        self.peer_tls = peer_tls;
        self
    }

    /// What the other replicas of a shared store know of their agents' proxies, asked of all of
    /// them at once; a replica that does not answer within [`PEER_WAIT`] is left out.
    async fn peers_proxies(
        &self,
        request: &ListProxyStatusRequest,
    ) -> Vec<pasa_proto::store::v1::ProxyStatusEntry> {
        let (_, peers) = self.store.peers().await;
        let asks = peers.into_iter().map(|peer| {
            let tls = self.peer_tls.clone();
            let request = ListProxyStatusRequest {
                local_only: true,
                ..request.clone()
            };
            async move {
                let asked = tokio::time::timeout(PEER_WAIT, async {
                    let mut client = pasa_proto::client::connect_with(&peer, tls.as_ref())
                        .await
                        .map_err(|e| e.to_string())?;
                    pasa_proto::client::list_proxy_status(&mut client, request)
                        .await
                        .map_err(|s| s.message().to_string())
                })
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {PEER_WAIT:?}")));
                match asked {
                    Ok(answer) => answer.proxies,
                    Err(e) => {
                        tracing::warn!(replica = %peer, error = %e, "a store replica did not say which proxies report to it");
                        Vec::new()
                    }
                }
            }
        });
        futures::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// The tonic server for this service, with generous message limits for big batches.
    pub fn into_server(self) -> StoreServer<StoreService> {
        StoreServer::new(self)
            .max_decoding_message_size(pasa_proto::client::MAX_MESSAGE_SIZE)
            .max_encoding_message_size(pasa_proto::client::MAX_MESSAGE_SIZE)
    }
}

impl From<StoreError> for Status {
    fn from(e: StoreError) -> Self {
        let msg = e.to_string();
        match e {
            StoreError::Compacted { .. } => Status::out_of_range(msg),
            StoreError::FutureRevision { .. } => Status::out_of_range(msg),
            StoreError::BatchTooLarge { .. } => Status::invalid_argument(msg),
            StoreError::ShuttingDown => Status::unavailable(msg),
            StoreError::Contended { .. } => Status::aborted(msg),
            StoreError::Backend(crate::backend::BackendError::Conflict { .. }) => {
                Status::aborted(msg)
            }
            StoreError::Backend(_) | StoreError::Corrupt(_) | StoreError::Failed => {
                Status::internal(msg)
            }
        }
    }
}

impl From<StatusError> for Status {
    fn from(e: StatusError) -> Self {
        let msg = e.to_string();
        match e {
            StatusError::ShuttingDown => Status::unavailable(msg),
            StatusError::MissingStatus
            | StatusError::MissingNodeId
            | StatusError::NodeChanged { .. } => Status::invalid_argument(msg),
        }
    }
}

fn object_key(r: Option<&pasa_proto::store::v1::ObjectRef>) -> Result<ObjectKey, Status> {
    let r = r.ok_or_else(|| Status::invalid_argument("ref: required"))?;
    if r.name.is_empty() {
        return Err(Status::invalid_argument("ref.name: required"));
    }
    ObjectKey::from_ref(r).map_err(|e| Status::invalid_argument(format!("ref.kind: {e}")))
}

/// The response stream of a watch, as every store-API service returns it.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send + 'static>>;

/// The pages of a `ListProxyStatus` answer.
pub type ProxyStatusStream =
    Pin<Box<dyn Stream<Item = Result<ListProxyStatusResponse, Status>> + Send + 'static>>;

/// Most proxies in one `ListProxyStatus` page (a page stays far below the message limit even
/// with every NACK text at its longest).
pub const PROXY_STATUS_PAGE: usize = 500;

#[tonic::async_trait]
impl StoreApi for StoreService {
    async fn apply(
        &self,
        request: Request<ApplyRequest>,
    ) -> Result<Response<ApplyResponse>, Status> {
        let caller = self.access.caller("Apply", &request)?;
        self.access.write("Apply", &caller)?;
        let check = self.must_check(&caller, &request);
        let mut req = request.into_inner();
        if check {
            let errors;
            (req, errors) = self.admit(req).await?;
            if !errors.is_empty() {
                return Ok(Response::new(ApplyResponse {
                    errors,
                    ..Default::default()
                }));
            }
        }
        Ok(Response::new(
            self.store.apply(req.documents, req.dry_run).await?,
        ))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        let caller = self.access.caller("Delete", &request)?;
        self.access.write("Delete", &caller)?;
        Ok(Response::new(
            self.store.delete(request.into_inner()).await?,
        ))
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        let caller = self.access.caller("Get", &request)?;
        let key = object_key(request.get_ref().r#ref.as_ref())?;
        self.access.get(&caller, &key)?;
        match self.store.get(&key) {
            (Some(resource), revision) => Ok(Response::new(GetResponse {
                resource: Some((*resource).clone()),
                revision,
            })),
            (None, _) => Err(Status::not_found(format!("{key} not found"))),
        }
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        let caller = self.access.caller("List", &request)?;
        let req = request.into_inner();
        let selector = match &req.selector {
            Some(sub) => Selector::from_pb(sub)
                .map_err(|e| Status::invalid_argument(format!("selector.{e}")))?,
            None => Selector::everything(),
        };
        self.access.read("List", &caller, &selector, "selector.")?;
        let (resources, revision) = self.store.list(&selector, req.revision).await?;
        Ok(Response::new(ListResponse {
            resources: resources
                .into_iter()
                .map(std::sync::Arc::unwrap_or_clone)
                .collect(),
            revision,
        }))
    }

    type WatchStream = WatchStream;
    type ListProxyStatusStream = ProxyStatusStream;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let caller = self.access.caller("Watch", &request)?;
        let mut requests = request.into_inner();
        let create = match requests.next().await {
            Some(Ok(WatchRequest {
                request: Some(watch_request::Request::Create(create)),
            })) => create,
            Some(Ok(_)) => {
                return Err(Status::invalid_argument(
                    "request: the first request of a watch must be create",
                ));
            }
            Some(Err(status)) => return Err(status),
            None => {
                return Err(Status::cancelled(
                    "the client closed the watch before create",
                ));
            }
        };
        let (tx, rx) = mpsc::channel(8);
        let store = self.store.clone();
        let access = self.access.clone();
        tokio::spawn(async move {
            store
                .serve_watch(create, requests, tx, access, caller)
                .await
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        // Anyone verified may ask; an unknown identity is refused here too.
        self.access.caller("Status", &request)?;
        let s = self.store.status();
        Ok(Response::new(StatusResponse {
            revision: s.revision,
            compact_revision: s.compact_revision,
            objects: s
                .objects
                .into_iter()
                .map(|(kind, count)| KindCount {
                    kind: kind.as_str().to_string(),
                    count,
                })
                .collect(),
            watchers: s.watchers as u64,
            backend: s.backend.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }))
    }

    async fn report_status(
        &self,
        request: Request<Streaming<ReportStatusRequest>>,
    ) -> Result<Response<ReportStatusResponse>, Status> {
        let caller = self.access.caller("ReportStatus", &request)?;
        let mut reports = request.into_inner();
        let proxies = self.store.proxies();
        // Dropped when this call ends, however it ends: the proxy then shows as lost contact.
        let mut stream = proxies.open_stream();
        loop {
            let report = tokio::select! {
                () = proxies.closing() => break,
                report = reports.message() => report,
            };
            match report {
                Ok(Some(report)) => {
                    if let Some(status) = &report.status {
                        self.access.report(&caller, status)?;
                    }
                    stream.report(report.status)?
                }
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(error = %status, "a status report stream failed");
                    break;
                }
            }
        }
        Ok(Response::new(ReportStatusResponse {}))
    }

    async fn list_proxy_status(
        &self,
        request: Request<ListProxyStatusRequest>,
    ) -> Result<Response<ProxyStatusStream>, Status> {
        let caller = self.access.caller("ListProxyStatus", &request)?;
        self.access.list_proxies(&caller)?;
        let table = self.store.proxies();
        let revision = self.store.revision();
        let expiry_ms = u64::try_from(table.expiry().as_millis()).unwrap_or(u64::MAX);
        let request = request.into_inner();
        let mut proxies = table.list(&request);
        if !request.local_only && self.store.shared() {
            proxies = crate::peers::merge(proxies, self.peers_proxies(&request).await);
        }
        let mut proxies = proxies.into_iter().peekable();
        let mut pages = Vec::new();
        // At least one page, so an empty answer still says the revision and expiry.
        while pages.is_empty() || proxies.peek().is_some() {
            pages.push(Ok(ListProxyStatusResponse {
                proxies: proxies.by_ref().take(PROXY_STATUS_PAGE).collect(),
                revision,
                expiry_ms,
            }));
        }
        Ok(Response::new(Box::pin(futures::stream::iter(pages))))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::StreamExt;
    use pasa_proto::store::v1::ProxyStatus;

    use super::*;
    use crate::backend::memory::FakeMemoryBackend;
    use crate::metrics::Metrics;
    use crate::store::StoreConfig;

    #[tokio::test]
    async fn proxy_status_comes_in_pages_that_add_up_to_every_proxy() {
        let store = Store::open(
            Arc::new(FakeMemoryBackend::default()),
            StoreConfig::default(),
            Metrics::new(),
        )
        .unwrap();
        let service = StoreService::new(store.clone());
        let list = |service: &StoreService| {
            let service = service.clone();
            async move {
                let pages = service
                    .list_proxy_status(Request::new(ListProxyStatusRequest::default()))
                    .await
                    .unwrap()
                    .into_inner();
                pages.map(Result::unwrap).collect::<Vec<_>>().await
            }
        };
        // Nobody reports yet: one empty page, which still says the revision and the expiry.
        let pages = list(&service).await;
        assert_eq!(pages.len(), 1);
        assert!(pages[0].proxies.is_empty() && pages[0].expiry_ms > 0);

        let n = 2 * PROXY_STATUS_PAGE + 1;
        let mut streams = Vec::new();
        for i in 0..n {
            let mut stream = store.proxies().open_stream();
            stream
                .report(Some(ProxyStatus {
                    node_id: format!("sidecar~10.0.0.1~p{i:04}.ns~ns.svc.cluster.local"),
                    pod_name: format!("p{i:04}"),
                    namespace: "ns".into(),
                    ..Default::default()
                }))
                .unwrap();
            streams.push(stream);
        }
        let pages = list(&service).await;
        let sizes: Vec<usize> = pages.iter().map(|p| p.proxies.len()).collect();
        assert_eq!(sizes, [PROXY_STATUS_PAGE, PROXY_STATUS_PAGE, 1]);
        let names: Vec<String> = pages
            .iter()
            .flat_map(|p| &p.proxies)
            .filter_map(|e| e.status.as_ref().map(|s| s.pod_name.clone()))
            .collect();
        let expected: Vec<String> = (0..n).map(|i| format!("p{i:04}")).collect();
        assert_eq!(names, expected, "every proxy once, in order");
    }
}
