//! The API PCP serves: the store API, with every write admitted first (structure, Istio
//! validation, cross-resource warnings). The store behind it is embedded (sled, in-process) or
//! remote (`--store ADDR[,ADDR…]`); reads and watches pass through unchanged.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use pasa_proto::Object;
use pasa_proto::store::v1::store_client::StoreClient;
use pasa_proto::store::v1::store_server::{Store as StoreApi, StoreServer};
use pasa_proto::store::v1::{
    ApplyRequest, ApplyResponse, DeleteRequest, DeleteResponse, GetRequest, GetResponse,
    ListRequest, ListResponse, StatusRequest, StatusResponse, WatchRequest, WatchResponse,
};
use pasa_store::service::StoreService;
use serde_json::Value;
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use crate::admission::{self, Checked};
use crate::analysis;
use crate::metrics::{Metrics, Origin};

/// Where writes go once admitted.
#[derive(Clone)]
pub enum Upstream {
    /// The store in this process.
    Embedded(StoreService),
    /// A store server (or several, balanced) reached over gRPC.
    Remote(StoreClient<Channel>),
}

impl Upstream {
    /// Connects lazily to store servers; requests are balanced over the addresses.
    pub fn remote(addresses: &[String]) -> anyhow::Result<Upstream> {
        let mut endpoints = Vec::new();
        for addr in addresses {
            let url = if addr.contains("://") {
                addr.clone()
            } else {
                format!("http://{addr}")
            };
            let endpoint = Channel::from_shared(url)
                .map_err(|e| anyhow::anyhow!("--store {addr:?} is not a valid address: {e}"))?
                .connect_timeout(std::time::Duration::from_secs(5));
            endpoints.push(endpoint);
        }
        if endpoints.is_empty() {
            anyhow::bail!("--store needs at least one address");
        }
        let channel = Channel::balance_list(endpoints.into_iter());
        Ok(Upstream::Remote(
            StoreClient::new(channel)
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20),
        ))
    }

    pub async fn apply(&self, req: ApplyRequest) -> Result<ApplyResponse, Status> {
        match self {
            Upstream::Embedded(s) => s.apply(Request::new(req)).await,
            Upstream::Remote(c) => c.clone().apply(req).await,
        }
        .map(Response::into_inner)
    }

    pub async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse, Status> {
        match self {
            Upstream::Embedded(s) => s.delete(Request::new(req)).await,
            Upstream::Remote(c) => c.clone().delete(req).await,
        }
        .map(Response::into_inner)
    }

    pub async fn list(&self, req: ListRequest) -> Result<ListResponse, Status> {
        match self {
            Upstream::Embedded(s) => s.list(Request::new(req)).await,
            Upstream::Remote(c) => c.clone().list(req).await,
        }
        .map(Response::into_inner)
    }
}

/// The PCP gRPC service.
#[derive(Clone)]
pub struct WriteService {
    upstream: Upstream,
    metrics: Arc<Metrics>,
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send + 'static>>;

impl WriteService {
    pub fn new(upstream: Upstream, metrics: Arc<Metrics>) -> Self {
        WriteService { upstream, metrics }
    }

    pub fn into_server(self) -> StoreServer<WriteService> {
        StoreServer::new(self)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20)
    }

    /// Where admitted writes go.
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// Checks documents (each already read as JSON, or why not): structure and Istio validation,
    /// then, when all are valid, the cross-resource warnings against what is stored.
    pub async fn admit(
        &self,
        docs: &[Result<Value, String>],
        default_namespace: &str,
        origin: Origin,
    ) -> Checked {
        let mut checked = admission::check_documents(docs, default_namespace);
        self.metrics.count_admission(origin, &checked);
        if checked.is_admitted() {
            let existing = self.related_objects(&checked).await;
            admission::analyze(&mut checked, &existing);
        }
        checked
    }

    /// Admits a batch and, when every document is valid, writes it as one atomic store batch.
    /// Warnings come back either way.
    pub async fn admit_and_apply(&self, req: ApplyRequest) -> Result<ApplyResponse, Status> {
        let docs: Vec<Result<Value, String>> = req
            .documents
            .iter()
            .map(|d| {
                serde_json::from_str::<Value>(&d.json).map_err(|e| format!("not valid JSON: {e}"))
            })
            .collect();
        let checked = self.admit(&docs, "default", Origin::Grpc).await;
        if !checked.is_admitted() {
            return Ok(ApplyResponse {
                errors: checked.errors,
                warnings: checked.warnings,
                ..Default::default()
            });
        }
        let mut response = self.upstream.apply(req).await?;
        response.warnings.extend(checked.warnings);
        Ok(response)
    }

    /// The stored objects the batch's references may point to. Analysis only adds warnings, so
    /// a store that cannot answer costs the warnings, not the write.
    async fn related_objects(&self, checked: &Checked) -> Vec<Object> {
        let batch: Vec<&Object> = checked.objects.iter().flatten().collect();
        let Some(selector) = analysis::lookups(&batch) else {
            return Vec::new();
        };
        let list = self
            .upstream
            .list(ListRequest {
                selector: Some(selector),
                revision: 0,
            })
            .await;
        match list {
            Ok(list) => list
                .resources
                .iter()
                .filter_map(|r| {
                    let doc = pasa_proto::object::manifest(r);
                    Object::from_json(&doc, &r.namespace).ok()
                })
                .collect(),
            Err(status) => {
                tracing::warn!(error = %status.message(), "cannot read related objects for analysis");
                Vec::new()
            }
        }
    }
}

#[tonic::async_trait]
impl StoreApi for WriteService {
    async fn apply(
        &self,
        request: Request<ApplyRequest>,
    ) -> Result<Response<ApplyResponse>, Status> {
        self.admit_and_apply(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteResponse>, Status> {
        self.upstream
            .delete(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        match &self.upstream {
            Upstream::Embedded(s) => s.get(request).await,
            Upstream::Remote(c) => c.clone().get(request.into_inner()).await,
        }
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListResponse>, Status> {
        self.upstream
            .list(request.into_inner())
            .await
            .map(Response::new)
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        match &self.upstream {
            Upstream::Embedded(s) => {
                let response = s.watch(request).await?;
                Ok(Response::new(response.into_inner()))
            }
            Upstream::Remote(c) => {
                // The client's requests flow to the store until the client stops or errs.
                let requests = request.into_inner().map_while(Result::ok);
                let response = c.clone().watch(requests).await?;
                let stream: WatchStream = Box::pin(response.into_inner());
                Ok(Response::new(stream))
            }
        }
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        match &self.upstream {
            Upstream::Embedded(s) => s.status(request).await,
            Upstream::Remote(c) => c.clone().status(request.into_inner()).await,
        }
    }
}
