//! A **fake** of PD and TiKV: one loopback gRPC server answering the calls tikv-client makes for
//! transactions — PD's members, timestamps (TSO), region and store lookup; TiKV's get, scan,
//! batch get, pessimistic lock and its rollback, prewrite, commit, rollback, transaction status,
//! lock resolution and heartbeat.
//! Data lives in memory ([`mvcc`]), in one region on one store.
//!
//! It exists to exercise the real client path (tikv-client's region cache, TSO stream,
//! two-phase commit, conflict and lock handling) where no TiKV can run. It is not TiKV: no Raft,
//! no persistence, no region splits, no guarantees beyond what a single mutex gives.

mod mvcc;
pub mod proto;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use mvcc::{LOGICAL_BITS, Mvcc};
use proto::kvrpcpb;
use proto::metapb;
use proto::pdpb;
use proto::tikvpb;

const CLUSTER_ID: u64 = 0x7061_7361; // "pasa"
const STORE_ID: u64 = 1;
const REGION_ID: u64 = 2;
const PEER_ID: u64 = 3;
const MEMBER_ID: u64 = 4;

struct State {
    mvcc: Mutex<Mvcc>,
    /// Longest lock TTL granted, in milliseconds (see [`FakeTikv::cap_lock_ttl`]).
    max_lock_ttl_ms: std::sync::atomic::AtomicU64,
    /// Last timestamp handed out.
    tso: Mutex<u64>,
    address: String,
}

impl State {
    fn lock_ttl(&self, asked: u64) -> u64 {
        asked.min(
            self.max_lock_ttl_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    fn mvcc(&self) -> MutexGuard<'_, Mvcc> {
        self.mvcc.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `count` timestamps, strictly above every earlier one; returns the last.
    fn timestamps(&self, count: u32) -> u64 {
        let mut last = self.tso.lock().unwrap_or_else(|p| p.into_inner());
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let floor = now_ms << LOGICAL_BITS;
        *last = (*last + u64::from(count)).max(floor + u64::from(count));
        *last
    }
}

/// A running fake; dropping it stops the server.
pub struct FakeTikv {
    address: SocketAddr,
    state: Arc<State>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeTikv {
    /// Binds `listen` (port 0 picks one) and serves from a thread of its own, so it can be used
    /// from synchronous and asynchronous code alike. Returns once the socket is bound.
    pub fn start(listen: SocketAddr) -> std::io::Result<FakeTikv> {
        let listener = std::net::TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let state = Arc::new(State {
            mvcc: Mutex::new(Mvcc::default()),
            max_lock_ttl_ms: std::sync::atomic::AtomicU64::new(u64::MAX),
            tso: Mutex::new(0),
            address: address.to_string(),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let served = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("fake-tikv".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!(error = %e, "fake PD/TiKV could not listen");
                            return;
                        }
                    };
                    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                    let result = tonic::transport::Server::builder()
                        .add_service(pdpb::pd_server::PdServer::new(Pd(Arc::clone(&served))))
                        .add_service(tikvpb::tikv_server::TikvServer::new(Tikv(served)))
                        .serve_with_incoming_shutdown(incoming, async {
                            let _ = stopped.await;
                        })
                        .await;
                    if let Err(e) = result {
                        tracing::error!(error = %e, "fake PD/TiKV stopped");
                    }
                });
            })?;
        Ok(FakeTikv {
            address,
            state,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address PD (and TiKV) answer on, as `host:port`.
    pub fn pd_address(&self) -> String {
        self.address.to_string()
    }

    /// Grants locks at most `ttl`, whatever the client asks (tikv-client asks 20 s for a
    /// pessimistic lock): so a test can see the locks of a writer that died expire and be
    /// resolved without waiting that long.
    pub fn cap_lock_ttl(&self, ttl: std::time::Duration) {
        self.state.max_lock_ttl_ms.store(
            u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Keys locked by transactions that have not finished (or whose writer died).
    pub fn locked_keys(&self) -> usize {
        self.state.mvcc().lock_count()
    }
}

impl Drop for FakeTikv {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn pd_header() -> Option<pdpb::ResponseHeader> {
    Some(pdpb::ResponseHeader {
        cluster_id: CLUSTER_ID,
        error: None,
    })
}

struct Pd(Arc<State>);

impl Pd {
    fn member(&self) -> pdpb::Member {
        pdpb::Member {
            name: "fake-pd".into(),
            member_id: MEMBER_ID,
            client_urls: vec![format!("http://{}", self.0.address)],
            peer_urls: vec![format!("http://{}", self.0.address)],
            ..Default::default()
        }
    }

    fn store(&self) -> metapb::Store {
        metapb::Store {
            id: STORE_ID,
            address: self.0.address.clone(),
            state: metapb::StoreState::Up as i32,
            version: "fake".into(),
            ..Default::default()
        }
    }

    fn region(&self) -> pdpb::GetRegionResponse {
        let peer = metapb::Peer {
            id: PEER_ID,
            store_id: STORE_ID,
            ..Default::default()
        };
        pdpb::GetRegionResponse {
            header: pd_header(),
            region: Some(metapb::Region {
                id: REGION_ID,
                start_key: Vec::new(),
                end_key: Vec::new(),
                region_epoch: Some(metapb::RegionEpoch {
                    conf_ver: 1,
                    version: 1,
                }),
                peers: vec![peer],
                ..Default::default()
            }),
            leader: Some(peer),
            ..Default::default()
        }
    }
}

type TsoStream = Pin<Box<dyn Stream<Item = Result<pdpb::TsoResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pdpb::pd_server::Pd for Pd {
    async fn get_members(
        &self,
        _: Request<pdpb::GetMembersRequest>,
    ) -> Result<Response<pdpb::GetMembersResponse>, Status> {
        let member = self.member();
        Ok(Response::new(pdpb::GetMembersResponse {
            header: pd_header(),
            members: vec![member.clone()],
            leader: Some(member.clone()),
            etcd_leader: Some(member),
            ..Default::default()
        }))
    }

    async fn get_cluster_info(
        &self,
        _: Request<pdpb::GetClusterInfoRequest>,
    ) -> Result<Response<pdpb::GetClusterInfoResponse>, Status> {
        Ok(Response::new(pdpb::GetClusterInfoResponse {
            header: pd_header(),
            ..Default::default()
        }))
    }

    async fn tso(
        &self,
        request: Request<tonic::Streaming<pdpb::TsoRequest>>,
    ) -> Result<Response<TsoStream>, Status> {
        let state = Arc::clone(&self.0);
        let responses = request.into_inner().map(move |req| {
            let req = req?;
            let last = state.timestamps(req.count);
            Ok(pdpb::TsoResponse {
                header: pd_header(),
                count: req.count,
                timestamp: Some(pdpb::Timestamp {
                    physical: (last >> LOGICAL_BITS) as i64,
                    logical: (last & ((1 << LOGICAL_BITS) - 1)) as i64,
                    suffix_bits: 0,
                }),
            })
        });
        Ok(Response::new(Box::pin(responses)))
    }

    async fn get_region(
        &self,
        _: Request<pdpb::GetRegionRequest>,
    ) -> Result<Response<pdpb::GetRegionResponse>, Status> {
        Ok(Response::new(self.region()))
    }

    async fn get_region_by_id(
        &self,
        request: Request<pdpb::GetRegionByIdRequest>,
    ) -> Result<Response<pdpb::GetRegionResponse>, Status> {
        if request.get_ref().region_id != REGION_ID {
            return Ok(Response::new(pdpb::GetRegionResponse {
                header: pd_header(),
                ..Default::default()
            }));
        }
        Ok(Response::new(self.region()))
    }

    async fn get_store(
        &self,
        _: Request<pdpb::GetStoreRequest>,
    ) -> Result<Response<pdpb::GetStoreResponse>, Status> {
        Ok(Response::new(pdpb::GetStoreResponse {
            header: pd_header(),
            store: Some(self.store()),
            stats: None,
        }))
    }

    async fn get_all_stores(
        &self,
        _: Request<pdpb::GetAllStoresRequest>,
    ) -> Result<Response<pdpb::GetAllStoresResponse>, Status> {
        Ok(Response::new(pdpb::GetAllStoresResponse {
            header: pd_header(),
            stores: vec![self.store()],
        }))
    }
}

struct Tikv(Arc<State>);

fn key_error(e: kvrpcpb::KeyError) -> Option<kvrpcpb::KeyError> {
    Some(e)
}

#[tonic::async_trait]
impl tikvpb::tikv_server::Tikv for Tikv {
    async fn kv_get(
        &self,
        request: Request<kvrpcpb::GetRequest>,
    ) -> Result<Response<kvrpcpb::GetResponse>, Status> {
        let req = request.into_inner();
        let mut resp = kvrpcpb::GetResponse::default();
        match self.0.mvcc().get(&req.key, req.version) {
            Ok(Some(value)) => resp.value = value,
            Ok(None) => resp.not_found = true,
            Err(e) => resp.error = key_error(e),
        }
        Ok(Response::new(resp))
    }

    async fn kv_batch_get(
        &self,
        request: Request<kvrpcpb::BatchGetRequest>,
    ) -> Result<Response<kvrpcpb::BatchGetResponse>, Status> {
        let req = request.into_inner();
        let mvcc = self.0.mvcc();
        let mut pairs = Vec::new();
        for key in req.keys {
            match mvcc.get(&key, req.version) {
                Ok(Some(value)) => pairs.push(kvrpcpb::KvPair {
                    key,
                    value,
                    error: None,
                }),
                Ok(None) => {}
                Err(e) => pairs.push(kvrpcpb::KvPair {
                    key,
                    value: Vec::new(),
                    error: key_error(e),
                }),
            }
        }
        Ok(Response::new(kvrpcpb::BatchGetResponse {
            pairs,
            ..Default::default()
        }))
    }

    async fn kv_scan(
        &self,
        request: Request<kvrpcpb::ScanRequest>,
    ) -> Result<Response<kvrpcpb::ScanResponse>, Status> {
        let req = request.into_inner();
        if req.reverse {
            return Err(Status::unimplemented(
                "the fake TiKV does not scan in reverse",
            ));
        }
        let pairs = self
            .0
            .mvcc()
            .scan(
                &req.start_key,
                &req.end_key,
                req.limit as usize,
                req.version,
            )
            .into_iter()
            .map(|(key, value)| match value {
                Ok(value) => kvrpcpb::KvPair {
                    key,
                    value: if req.key_only { Vec::new() } else { value },
                    error: None,
                },
                Err(e) => kvrpcpb::KvPair {
                    key,
                    value: Vec::new(),
                    error: key_error(e),
                },
            })
            .collect();
        Ok(Response::new(kvrpcpb::ScanResponse {
            pairs,
            ..Default::default()
        }))
    }

    async fn kv_prewrite(
        &self,
        request: Request<kvrpcpb::PrewriteRequest>,
    ) -> Result<Response<kvrpcpb::PrewriteResponse>, Status> {
        let mut req = request.into_inner();
        req.lock_ttl = self.0.lock_ttl(req.lock_ttl);
        if req.try_one_pc || req.use_async_commit {
            return Err(Status::unimplemented(
                "the fake TiKV does only two-phase commit",
            ));
        }
        let errors = self.0.mvcc().prewrite(&req);
        Ok(Response::new(kvrpcpb::PrewriteResponse {
            errors,
            ..Default::default()
        }))
    }

    async fn kv_pessimistic_lock(
        &self,
        request: Request<kvrpcpb::PessimisticLockRequest>,
    ) -> Result<Response<kvrpcpb::PessimisticLockResponse>, Status> {
        let mut req = request.into_inner();
        req.lock_ttl = self.0.lock_ttl(req.lock_ttl);
        let mut resp = kvrpcpb::PessimisticLockResponse::default();
        match self.0.mvcc().pessimistic_lock(&req) {
            Ok(values) => {
                if req.return_values {
                    resp.not_founds = values.iter().map(Option::is_none).collect();
                    resp.values = values.into_iter().map(Option::unwrap_or_default).collect();
                }
            }
            Err(e) => resp.errors = vec![e],
        }
        Ok(Response::new(resp))
    }

    async fn kv_pessimistic_rollback(
        &self,
        request: Request<kvrpcpb::PessimisticRollbackRequest>,
    ) -> Result<Response<kvrpcpb::PessimisticRollbackResponse>, Status> {
        let req = request.into_inner();
        self.0
            .mvcc()
            .pessimistic_rollback(req.start_version, &req.keys);
        Ok(Response::new(
            kvrpcpb::PessimisticRollbackResponse::default(),
        ))
    }

    async fn kv_commit(
        &self,
        request: Request<kvrpcpb::CommitRequest>,
    ) -> Result<Response<kvrpcpb::CommitResponse>, Status> {
        let req = request.into_inner();
        let error = self
            .0
            .mvcc()
            .commit(req.start_version, req.commit_version, &req.keys);
        Ok(Response::new(kvrpcpb::CommitResponse {
            error,
            commit_version: req.commit_version,
            ..Default::default()
        }))
    }

    async fn kv_batch_rollback(
        &self,
        request: Request<kvrpcpb::BatchRollbackRequest>,
    ) -> Result<Response<kvrpcpb::BatchRollbackResponse>, Status> {
        let req = request.into_inner();
        let error = self.0.mvcc().rollback(req.start_version, &req.keys);
        Ok(Response::new(kvrpcpb::BatchRollbackResponse {
            error,
            ..Default::default()
        }))
    }

    async fn kv_cleanup(
        &self,
        request: Request<kvrpcpb::CleanupRequest>,
    ) -> Result<Response<kvrpcpb::CleanupResponse>, Status> {
        let req = request.into_inner();
        let mut resp = kvrpcpb::CleanupResponse::default();
        match self
            .0
            .mvcc()
            .check_txn_status(&req.key, req.start_version, req.current_ts, true)
        {
            Ok(status) if status.lock_ttl > 0 => {
                resp.error = Some(kvrpcpb::KeyError {
                    locked: status.lock_info,
                    ..Default::default()
                })
            }
            Ok(status) => resp.commit_version = status.commit_version,
            Err(e) => resp.error = key_error(e),
        }
        Ok(Response::new(resp))
    }

    async fn kv_check_txn_status(
        &self,
        request: Request<kvrpcpb::CheckTxnStatusRequest>,
    ) -> Result<Response<kvrpcpb::CheckTxnStatusResponse>, Status> {
        let req = request.into_inner();
        let mut resp = kvrpcpb::CheckTxnStatusResponse::default();
        match self.0.mvcc().check_txn_status(
            &req.primary_key,
            req.lock_ts,
            req.current_ts,
            req.rollback_if_not_exist,
        ) {
            Ok(status) => {
                resp.lock_ttl = status.lock_ttl;
                resp.commit_version = status.commit_version;
                resp.action = status.action as i32;
                resp.lock_info = status.lock_info;
            }
            Err(e) => resp.error = key_error(e),
        }
        Ok(Response::new(resp))
    }

    async fn kv_resolve_lock(
        &self,
        request: Request<kvrpcpb::ResolveLockRequest>,
    ) -> Result<Response<kvrpcpb::ResolveLockResponse>, Status> {
        let req = request.into_inner();
        let mut mvcc = self.0.mvcc();
        if req.txn_infos.is_empty() {
            mvcc.resolve(req.start_version, req.commit_version, &req.keys);
        } else {
            for txn in &req.txn_infos {
                mvcc.resolve(txn.txn, txn.status, &[]);
            }
        }
        Ok(Response::new(kvrpcpb::ResolveLockResponse::default()))
    }

    async fn kv_txn_heart_beat(
        &self,
        request: Request<kvrpcpb::TxnHeartBeatRequest>,
    ) -> Result<Response<kvrpcpb::TxnHeartBeatResponse>, Status> {
        let req = request.into_inner();
        let mut resp = kvrpcpb::TxnHeartBeatResponse::default();
        match self.0.mvcc().heart_beat(
            &req.primary_lock,
            req.start_version,
            self.0.lock_ttl(req.advise_lock_ttl),
        ) {
            Ok(ttl) => resp.lock_ttl = ttl,
            Err(e) => resp.error = key_error(e),
        }
        Ok(Response::new(resp))
    }
}
