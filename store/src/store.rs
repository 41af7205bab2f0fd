//! The store: opens a backend, mirrors it in the [`Hub`], and serialises every write through one
//! writer thread that commits resource, index keys, change-log entry and revision atomically,
//! flushes durably, and only then publishes to watchers and answers the caller.

mod writer;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use pasa_proto::Kind;
use pasa_proto::object::{FieldError, Object, identity_of};
use pasa_proto::store::v1::{
    ApplyDocument, ApplyResponse, DeleteRequest, DeleteResponse, DocumentError, ErrorCode,
    ObjectRef, Resource,
};
use tokio::sync::{mpsc, oneshot};

use crate::backend::{Backend, BackendError};
use crate::hub::Hub;
use crate::index::extract::index_keys;
use crate::metrics::CutOffReason;
use crate::metrics::Metrics;
use crate::record::{
    self, CorruptRecord, LOG_END, LogRecord, META_COMPACT, META_REVISION, OBJECT_END,
    OBJECT_PREFIX, ObjectKey,
};
use crate::selector::Selector;
use crate::status::ProxyTable;
use writer::{Command, Outlet, Writer};

/// Change-log records read per step of a historical list.
const LIST_PAGE: u64 = 1024;

/// Tunables of a store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Cluster domain for short-name resolution.
    pub domain_suffix: String,
    /// Change-log entries kept behind the current revision.
    pub log_retention: u64,
    /// Messages a watcher may have queued before it is cut off.
    pub watch_queue: usize,
    /// How often idle watchers get a progress revision.
    pub progress_interval: Duration,
    /// Largest number of documents in one apply or delete.
    pub max_batch: usize,
    /// How long a proxy whose agent stopped reporting stays listed (see [`crate::status`]).
    pub proxy_status_expiry: Duration,
    /// How long the notice to a watcher that was cut off may wait for it to read, before its
    /// stream ends without it.
    pub watch_notice_wait: Duration,
    /// On a shared backend, how often the revision counter is read for other replicas' writes.
    pub tail_interval: Duration,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            domain_suffix: pasa_istio::host::DEFAULT_DOMAIN_SUFFIX.to_string(),
            log_retention: 100_000,
            watch_queue: 1024,
            progress_interval: Duration::from_secs(10),
            max_batch: 10_000,
            proxy_status_expiry: Duration::from_secs(300),
            watch_notice_wait: Duration::from_secs(10),
            tail_interval: Duration::from_millis(20),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Corrupt(#[from] CorruptRecord),
    #[error(
        "revision {requested} is compacted (the change log starts after {compact_revision}): list again and watch from the list's revision + 1"
    )]
    Compacted {
        requested: u64,
        compact_revision: u64,
    },
    #[error("revision {requested} is in the future: the store is at {current}")]
    FutureRevision { requested: u64, current: u64 },
    #[error("batch of {size} documents is larger than the limit of {limit}: split it")]
    BatchTooLarge { size: usize, limit: usize },
    #[error(
        "other store replicas kept writing first ({attempts} attempts, last on key {key}): nothing was written; retry"
    )]
    Contended { attempts: u32, key: String },
    #[error("the store is shutting down")]
    ShuttingDown,
    #[error(
        "the store could not flush to disk, so whether this write persisted is unknown; it accepts no more writes: restart it to recover from its durable state, then read before retrying"
    )]
    Failed,
}

struct Inner {
    backend: Arc<dyn Backend>,
    /// Shared with the writer thread, which holds no handle on the store itself, so dropping the
    /// last `Store` stops the writer.
    hub: Arc<SharedHub>,
    config: StoreConfig,
    metrics: Metrics,
    writer: Mutex<Option<mpsc::Sender<Command>>>,
    writer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// What agents report of their proxies; in memory only.
    proxies: ProxyTable,
    /// Where other replicas of a shared backend reach this one (see [`crate::peers`]).
    advertised: Mutex<Option<String>>,
}

/// A handle on an open store; clones share it.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// What `status` reports.
#[derive(Debug, Clone)]
pub struct StoreStatus {
    pub revision: u64,
    pub compact_revision: u64,
    pub objects: Vec<(Kind, u64)>,
    pub watchers: usize,
    pub backend: &'static str,
}

/// A document checked for structure, with index keys, ready for the writer.
pub(crate) struct Prepared {
    pub index: u32,
    pub key: ObjectKey,
    pub resource: Resource,
    pub expected_mod_revision: Option<u64>,
}

pub(crate) fn doc_error(
    index: u32,
    reference: ObjectRef,
    code: ErrorCode,
    field: &str,
    message: impl Into<String>,
) -> DocumentError {
    DocumentError {
        index,
        r#ref: Some(reference),
        field: field.to_string(),
        message: message.into(),
        code: code as i32,
        duplicate_of: None,
    }
}

impl Store {
    /// Opens the store on `backend`: loads every object into memory and starts the writer.
    pub fn open(
        backend: Arc<dyn Backend>,
        config: StoreConfig,
        metrics: Metrics,
    ) -> Result<Store, StoreError> {
        let hub = load_hub(backend.as_ref(), metrics.clone())?;
        let (revision, compact_revision) = (hub.revision(), hub.compact_revision());
        tracing::info!(
            backend = backend.name(),
            revision,
            compact_revision,
            objects = hub.object_count(),
            "store opened"
        );
        let (tx, rx) = mpsc::channel(1024);
        let proxies = ProxyTable::new(config.proxy_status_expiry, metrics.clone());
        let inner = Arc::new(Inner {
            proxies,
            backend: Arc::clone(&backend),
            hub: Arc::new(SharedHub {
                hub: Mutex::new(hub),
                backend,
                metrics: metrics.clone(),
            }),
            config,
            metrics,
            writer: Mutex::new(Some(tx)),
            writer_thread: Mutex::new(None),
            advertised: Mutex::new(None),
        });
        let writer = Writer::new(
            Arc::clone(&inner.backend),
            revision,
            compact_revision,
            inner.config.log_retention,
            inner.metrics.clone(),
        );
        let shared = inner.backend.shared();
        let store = Store { inner };
        let hub = Arc::clone(&store.inner.hub);
        let handle = std::thread::Builder::new()
            .name("pasa-store-writer".into())
            .spawn(move || writer.run(rx, hub.as_ref()))
            .map_err(|e| BackendError::Engine {
                engine: "store",
                action: "start its writer thread",
                source: Box::new(e),
            })?;
        *lock(&store.inner.writer_thread) = Some(handle);
        if shared {
            store.start_tailer()?;
        }
        Ok(store)
    }

    /// On a shared backend, watches the revision counter for other replicas' writes and has
    /// the writer catch up when it moves. One point read per [`StoreConfig::tail_interval`]
    /// (TiKV has no change feed that tikv-client exposes); the thread ends with the store.
    fn start_tailer(&self) -> Result<(), StoreError> {
        let weak = Arc::downgrade(&self.inner);
        let interval = self.inner.config.tail_interval;
        std::thread::Builder::new()
            .name("pasa-store-tailer".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(interval);
                    let Some(inner) = weak.upgrade() else { return };
                    let Some(tx) = lock(&inner.writer).clone() else {
                        return;
                    };
                    let seen = inner.hub.lock().revision();
                    let head = match stored_u64(inner.backend.as_ref(), META_REVISION) {
                        Ok(head) => head,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot read the store's revision");
                            continue;
                        }
                    };
                    // A full queue means the writer is busy and will catch up anyway.
                    if head > seen {
                        let _ = tx.try_send(Command::CatchUp);
                    }
                }
            })
            .map_err(|e| BackendError::Engine {
                engine: "store",
                action: "start its tailer thread",
                source: Box::new(e),
            })?;
        Ok(())
    }

    pub(crate) fn hub(&self) -> MutexGuard<'_, Hub> {
        self.inner.hub.lock()
    }

    /// Runs `f` on the hub (the watchers and their rule index), holding it meanwhile: for
    /// benchmarks and diagnostics that compare the index with brute force on live watchers.
    pub fn with_hub<R>(&self, f: impl FnOnce(&Hub) -> R) -> R {
        f(&self.hub())
    }

    pub fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    pub fn revision(&self) -> u64 {
        self.hub().revision()
    }

    /// The proxies whose agents report to this server.
    pub fn proxies(&self) -> &ProxyTable {
        &self.inner.proxies
    }

    /// Whether other store replicas share this store's backend.
    pub fn shared(&self) -> bool {
        self.inner.backend.shared()
    }

    /// On a shared backend, the address other replicas reach this one's API on; announced by
    /// [`Store::spawn_background`] (see [`crate::peers`]).
    pub fn advertise(&self, address: String) {
        *lock(&self.inner.advertised) = Some(address);
    }

    /// The address set by [`Store::advertise`].
    pub fn advertised(&self) -> Option<String> {
        lock(&self.inner.advertised).clone()
    }

    /// This replica's advertised address and the other live replicas' (shared backends only).
    pub async fn peers(&self) -> (Option<String>, Vec<String>) {
        let me = lock(&self.inner.advertised).clone();
        if !self.shared() {
            return (me, Vec::new());
        }
        let backend = Arc::clone(&self.inner.backend);
        let mine = me.clone().unwrap_or_default();
        let others =
            tokio::task::spawn_blocking(move || crate::peers::others(backend.as_ref(), &mine))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()));
        match others {
            Ok(others) => (me, others),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the other store replicas");
                (me, Vec::new())
            }
        }
    }

    /// Starts the periodic progress markers and the expiry of vanished proxies; needs a Tokio
    /// runtime.
    pub fn spawn_background(&self) -> tokio::task::JoinHandle<()> {
        let store = self.clone();
        let period = self.inner.config.progress_interval;
        let sweep_period = (self.inner.config.proxy_status_expiry / 4)
            .clamp(Duration::from_millis(100), Duration::from_secs(5));
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(period);
            let mut sweeper = tokio::time::interval(sweep_period);
            let mut announcer = tokio::time::interval(crate::peers::HEARTBEAT);
            ticker.tick().await;
            sweeper.tick().await;
            loop {
                tokio::select! {
                    _ = ticker.tick() => store.hub().progress(),
                    _ = sweeper.tick() => store.proxies().sweep(),
                    _ = announcer.tick() => store.announce().await,
                }
            }
        })
    }

    /// Renews this replica's announcement on a shared backend.
    async fn announce(&self) {
        let Some(me) = lock(&self.inner.advertised).clone() else {
            return;
        };
        if !self.shared() {
            return;
        }
        let backend = Arc::clone(&self.inner.backend);
        let announced =
            tokio::task::spawn_blocking(move || crate::peers::announce(backend.as_ref(), &me))
                .await;
        if let Ok(Err(e)) = announced {
            tracing::warn!(error = %e, "cannot announce this store replica");
        }
    }

    async fn submit<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Command,
    ) -> Result<T, StoreError> {
        let tx = lock(&self.inner.writer)
            .clone()
            .ok_or(StoreError::ShuttingDown)?;
        let (reply, answer) = oneshot::channel();
        tx.send(make(reply))
            .await
            .map_err(|_| StoreError::ShuttingDown)?;
        answer.await.map_err(|_| StoreError::ShuttingDown)?
    }

    /// Applies a batch atomically. Documents without a namespace go to `default`. A batch with
    /// any bad document writes nothing and reports every bad document.
    pub async fn apply(
        &self,
        documents: Vec<ApplyDocument>,
        dry_run: bool,
    ) -> Result<ApplyResponse, StoreError> {
        self.check_batch(documents.len())?;
        let domain = self.inner.config.domain_suffix.clone();
        let (prepared, errors) = prepare(documents, &domain);
        if !errors.is_empty() {
            return Ok(ApplyResponse {
                errors,
                revision: self.revision(),
                ..Default::default()
            });
        }
        self.submit(|reply| Command::Apply {
            docs: prepared,
            dry_run,
            reply,
        })
        .await
    }

    /// Deletes objects atomically.
    pub async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse, StoreError> {
        self.check_batch(req.refs.len())?;
        let mut keys = Vec::new();
        let mut errors = Vec::new();
        for (i, r) in req.refs.iter().enumerate() {
            match ObjectKey::from_ref(r) {
                Ok(key) => keys.push(key),
                Err(e) => errors.push(doc_error(
                    i as u32,
                    r.clone(),
                    ErrorCode::Invalid,
                    "kind",
                    e.to_string(),
                )),
            }
        }
        if req.expected_mod_revision.is_some() && req.refs.len() != 1 {
            errors.push(doc_error(
                0,
                ObjectRef::default(),
                ErrorCode::Invalid,
                "expected_mod_revision",
                "only a single-object delete can carry an expected revision",
            ));
        }
        if !errors.is_empty() {
            return Ok(DeleteResponse {
                errors,
                revision: self.revision(),
                ..Default::default()
            });
        }
        self.submit(|reply| Command::Delete {
            keys,
            expected_mod_revision: req.expected_mod_revision,
            ignore_not_found: req.ignore_not_found,
            reply,
        })
        .await
    }

    fn check_batch(&self, size: usize) -> Result<(), StoreError> {
        let limit = self.inner.config.max_batch;
        if size > limit {
            return Err(StoreError::BatchTooLarge { size, limit });
        }
        Ok(())
    }

    /// The object, and the revision the answer is current at.
    pub fn get(&self, key: &ObjectKey) -> (Option<Arc<Resource>>, u64) {
        let hub = self.hub();
        (hub.get(key), hub.revision())
    }

    /// Objects matching the selector at `revision` (0: now), and the revision of the answer.
    pub async fn list(
        &self,
        selector: &Selector,
        revision: u64,
    ) -> Result<(Vec<Arc<Resource>>, u64), StoreError> {
        let (current, head, compact) = {
            let hub = self.hub();
            (hub.select(selector), hub.revision(), hub.compact_revision())
        };
        if revision == 0 || revision == head {
            return Ok((current, head));
        }
        if revision > head {
            return Err(StoreError::FutureRevision {
                requested: revision,
                current: head,
            });
        }
        if revision < compact {
            return Err(StoreError::Compacted {
                requested: revision,
                compact_revision: compact,
            });
        }
        // Undo what happened after `revision`: the state of each touched object at `revision`
        // is the state before the first change after it. The log is read a page at a time and
        // only the first record of each object is kept.
        let mut objects: std::collections::HashMap<ObjectKey, Arc<Resource>> = current
            .into_iter()
            .filter_map(|r| ObjectKey::of(&r).map(|k| (k, r)))
            .collect();
        let mut seen = std::collections::HashSet::new();
        let mut next = revision + 1;
        while next <= head {
            let to = head.min(next + LIST_PAGE - 1);
            for rec in self.read_log(next, to).await? {
                let Some(resource) = rec.resource.as_ref() else {
                    continue;
                };
                let Some(key) = ObjectKey::of(resource) else {
                    continue;
                };
                if !seen.insert(key.clone()) {
                    continue;
                }
                match rec.before().cloned().filter(|r| {
                    crate::index::ObjectKeys::of(r).is_some_and(|k| selector.matches(&k))
                }) {
                    Some(r) => objects.insert(key, Arc::new(r)),
                    None => objects.remove(&key),
                };
            }
            next = to + 1;
        }
        let mut out: Vec<Arc<Resource>> = objects.into_values().collect();
        crate::hub::sort_resources(&mut out);
        Ok((out, revision))
    }

    /// Change-log records `from..=to`, all of them or a `Compacted` error.
    pub(crate) async fn read_log(&self, from: u64, to: u64) -> Result<Vec<LogRecord>, StoreError> {
        let backend = Arc::clone(&self.inner.backend);
        tokio::task::spawn_blocking(move || read_log_blocking(backend.as_ref(), from, to))
            .await
            .map_err(|_| StoreError::ShuttingDown)?
    }

    pub fn status(&self) -> StoreStatus {
        let hub = self.hub();
        StoreStatus {
            revision: hub.revision(),
            compact_revision: hub.compact_revision(),
            objects: hub.counts(),
            watchers: hub.watcher_count(),
            backend: self.inner.backend.name(),
        }
    }

    /// Stops the writer after the writes already queued, flushes, and ends every watch.
    pub fn shutdown(&self) {
        self.inner.proxies.close();
        if self.shared()
            && let Some(me) = lock(&self.inner.advertised).take()
            && let Err(e) = crate::peers::withdraw(self.inner.backend.as_ref(), &me)
        {
            tracing::warn!(error = %e, "cannot withdraw this store replica's announcement");
        }
        lock(&self.inner.writer).take();
        if let Some(handle) = lock(&self.inner.writer_thread).take()
            && handle.join().is_err()
        {
            tracing::error!("the writer thread panicked");
        }
        if let Err(e) = self.inner.backend.sync() {
            tracing::error!(error = %e, "final flush failed");
        }
        self.hub().shutdown();
    }
}

pub(crate) fn read_log_blocking(
    backend: &dyn Backend,
    from: u64,
    to: u64,
) -> Result<Vec<LogRecord>, StoreError> {
    let mut out = Vec::new();
    if from > to {
        return Ok(out);
    }
    let compacted = |backend: &dyn Backend| -> Result<StoreError, StoreError> {
        Ok(StoreError::Compacted {
            requested: from,
            compact_revision: stored_u64(backend, META_COMPACT)?,
        })
    };
    let mut next = from;
    while next <= to {
        let end = if to == u64::MAX {
            LOG_END.to_vec()
        } else {
            record::log_key(to + 1)
        };
        let page = backend.scan(&record::log_key(next), &end, 1024)?;
        if page.is_empty() {
            return Err(compacted(backend)?);
        }
        for (k, v) in page {
            if record::log_revision(&k)? != next {
                return Err(compacted(backend)?);
            }
            out.push(record::decode_log(&k, &v)?);
            next += 1;
        }
    }
    Ok(out)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A counter the store keeps under `key` (the revision, the compact revision); 0 before the first.
pub(crate) fn stored_u64(backend: &dyn Backend, key: &[u8]) -> Result<u64, StoreError> {
    Ok(match backend.get(key)? {
        Some(v) => record::decode_u64(key, &v)?,
        None => 0,
    })
}

/// Every object of the backend in a new hub, at the backend's revisions.
fn load_hub(backend: &dyn Backend, metrics: Metrics) -> Result<Hub, StoreError> {
    let mut hub = Hub::new(metrics);
    let revision = stored_u64(backend, META_REVISION)?;
    let compact_revision = stored_u64(backend, META_COMPACT)?;
    let mut start = OBJECT_PREFIX.to_vec();
    loop {
        let page = backend.scan(&start, OBJECT_END, 10_000)?;
        let Some((last, _)) = page.last() else { break };
        start = last.clone();
        start.push(0);
        for (k, v) in page {
            hub.load(record::decode_resource(&k, &v)?);
        }
    }
    hub.set_revisions(revision, compact_revision);
    Ok(hub)
}

/// The hub behind its lock, with what rebuilding it takes.
struct SharedHub {
    hub: Mutex<Hub>,
    backend: Arc<dyn Backend>,
    metrics: Metrics,
}

impl Outlet for SharedHub {
    fn publish(&self, records: Vec<LogRecord>) {
        if !records.is_empty() {
            self.on_writer(|hub| hub.commit(records));
        }
    }

    fn compacted(&self, compact_revision: u64) {
        self.on_writer(|hub| hub.set_compact_revision(compact_revision));
    }

    fn reload(&self) -> Result<(u64, u64), StoreError> {
        let fresh = load_hub(self.backend.as_ref(), self.metrics.clone())?;
        let revisions = (fresh.revision(), fresh.compact_revision());
        let mut hub = self.lock();
        hub.reset(CutOffReason::Reset);
        *hub = fresh;
        Ok(revisions)
    }
}

impl SharedHub {
    /// Runs `f` on the hub for the writer thread, which must outlive a panic in it: the commit
    /// is durable by then, so the hub is rebuilt from the backend at once (see [`Self::lock`])
    /// and holds it.
    fn on_writer(&self, f: impl FnOnce(&mut Hub)) {
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut self.lock())));
        if done.is_err() {
            drop(self.lock());
        }
    }

    /// The hub, locked. A panic while the lock was held may have left the hub's indexes half
    /// updated (an object indexed but not fanned out, a watcher's rules half removed): the hub
    /// is then not trusted but rebuilt from the backend, the durable truth, and every watch on
    /// the old one is cut off with a notice to resume, so its client watches again on the
    /// rebuilt state and loses nothing. Logged and counted
    /// (`pasa_store_watchers_cut_off_total{reason="Reset"}`). If the backend cannot be read,
    /// the hub stops taking watches until the store restarts.
    fn lock(&self) -> MutexGuard<'_, Hub> {
        let poisoned = match self.hub.lock() {
            Ok(hub) => return hub,
            Err(poisoned) => poisoned,
        };
        let mut hub = poisoned.into_inner();
        self.hub.clear_poison();
        let watchers = hub.watcher_count();
        hub.reset(CutOffReason::Reset);
        match load_hub(self.backend.as_ref(), self.metrics.clone()) {
            Ok(fresh) => {
                tracing::error!(
                    watchers,
                    revision = fresh.revision(),
                    objects = fresh.object_count(),
                    "a panic held the store's in-memory state: rebuilt it from the backend; \
                     every watch was cut off and resumes on the rebuilt state"
                );
                *hub = fresh;
            }
            Err(e) => {
                tracing::error!(watchers, error = %e,
                    "a panic held the store's in-memory state and the backend cannot be read to \
                     rebuild it: the store takes no more watches; restart it");
                hub.shutdown();
            }
        }
        hub
    }
}

/// Parses and checks every document, outside the writer.
fn prepare(documents: Vec<ApplyDocument>, domain: &str) -> (Vec<Prepared>, Vec<DocumentError>) {
    let mut prepared = Vec::new();
    let mut errors = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for (i, doc) in documents.into_iter().enumerate() {
        let index = i as u32;
        let value: serde_json::Value = match serde_json::from_str(&doc.json) {
            Ok(v) => v,
            Err(e) => {
                errors.push(doc_error(
                    index,
                    ObjectRef::default(),
                    ErrorCode::Invalid,
                    "",
                    format!("not a JSON document: {e}"),
                ));
                continue;
            }
        };
        let id = identity_of(&value, "default");
        let reference = ObjectRef {
            kind: id.kind,
            namespace: id.namespace,
            name: id.name,
        };
        let field_errors = |errs: Vec<FieldError>, errors: &mut Vec<DocumentError>| {
            for e in errs {
                errors.push(doc_error(
                    index,
                    reference.clone(),
                    ErrorCode::Invalid,
                    &e.field,
                    e.message,
                ));
            }
        };
        let obj = match Object::from_json(
            &value,
            "default",
            pasa_istio::generated::is_generated_object,
        ) {
            Ok(obj) => obj,
            Err(errs) => {
                field_errors(errs, &mut errors);
                continue;
            }
        };
        let keys = match index_keys(&obj, domain) {
            Ok(keys) => keys,
            Err(errs) => {
                field_errors(errs, &mut errors);
                continue;
            }
        };
        let key = ObjectKey {
            kind: obj.kind,
            namespace: obj.namespace.clone(),
            name: obj.name.clone(),
        };
        if let Some(first) = seen.insert(key.clone(), index) {
            let mut err = doc_error(
                index,
                reference,
                ErrorCode::Duplicate,
                "",
                format!(
                    "{key} appears more than once in this batch, which is applied atomically: keep one of them or apply them separately"
                ),
            );
            err.duplicate_of = Some(first);
            errors.push(err);
            continue;
        }
        let mut resource = obj.to_resource();
        resource.index = Some(keys);
        prepared.push(Prepared {
            index,
            key,
            resource,
            expected_mod_revision: doc.expected_mod_revision,
        });
    }
    (prepared, errors)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pasa_proto::store::v1::ApplyDocument;

    use super::*;
    use crate::backend::memory::FakeMemoryBackend;
    use crate::selector::Selector;

    fn vs(name: &str) -> ApplyDocument {
        ApplyDocument {
            json: serde_json::json!({
                "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                "metadata": {"name": name, "namespace": "app"},
                "spec": {"hosts": [format!("{name}.example.com")]}
            })
            .to_string(),
            expected_mod_revision: None,
        }
    }

    #[tokio::test]
    async fn a_panic_under_the_hub_lock_rebuilds_the_hub_and_cuts_every_watch_off() {
        let metrics = Metrics::new();
        let store = Store::open(
            Arc::new(FakeMemoryBackend::default()),
            StoreConfig::default(),
            metrics.clone(),
        )
        .unwrap();
        store.apply(vec![vs("a"), vs("b")], false).await.unwrap();
        let before = store.hub().register(Selector::everything(), 16);
        assert_eq!(store.hub().watcher_count(), 1);

        // A panic while the lock is held, as a bug in an index update would.
        let shared = Arc::clone(&store.inner.hub);
        let panicked = std::thread::spawn(move || {
            let _held = shared.hub.lock();
            panic!("a bug under the hub lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(store.inner.hub.hub.is_poisoned());

        // The next lock rebuilds: the watch is told to resume, the state is the backend's.
        let revision = {
            let hub = store.hub();
            assert!(!store.inner.hub.hub.is_poisoned());
            assert_eq!(before.state.cut_reason(), Some(CutOffReason::Reset));
            assert_eq!(hub.watcher_count(), 0);
            assert_eq!(hub.object_count(), 2);
            hub.revision()
        };
        assert_eq!(
            metrics
                .watchers_cut_off
                .get_or_create(&crate::metrics::ReasonLabels {
                    reason: CutOffReason::Reset
                })
                .get(),
            1
        );

        // And the store goes on: writes reach the rebuilt hub and new watches see everything.
        store.apply(vec![vs("c")], false).await.unwrap();
        {
            let hub = store.hub();
            assert_eq!(hub.object_count(), 3);
            assert_eq!(hub.revision(), revision + 1);
            assert_eq!(hub.select(&Selector::everything()).len(), 3);
        }

        // A panic in what the writer runs on the hub: caught, the hub rebuilt at once, and the
        // writer goes on.
        let watching = store.hub().register(Selector::everything(), 16);
        store.inner.hub.on_writer(|_| panic!("a bug in a commit"));
        assert!(!store.inner.hub.hub.is_poisoned());
        assert_eq!(watching.state.cut_reason(), Some(CutOffReason::Reset));
        store.apply(vec![vs("d")], false).await.unwrap();
        assert_eq!(store.hub().object_count(), 4);
    }

    /// A stream that fell behind sends what queued up for it in one message, not one per commit,
    /// in revision order.
    #[tokio::test]
    async fn a_stream_that_fell_behind_catches_up_in_one_message() {
        use pasa_proto::store::v1::{Rule, Subscription, WatchCreate, watch_response};
        let store = Store::open(
            Arc::new(FakeMemoryBackend::default()),
            StoreConfig::default(),
            Metrics::new(),
        )
        .unwrap();
        let (out_tx, mut out) = tokio::sync::mpsc::channel(1);
        let (_requests_tx, requests) = tokio::sync::mpsc::channel(1);
        let create = WatchCreate {
            subscription: Some(Subscription {
                rules: vec![Rule::default()],
            }),
            ..Default::default()
        };
        let serving = store.clone();
        tokio::spawn(async move {
            let requests = tokio_stream::wrappers::ReceiverStream::new(requests);
            serving
                .serve_watch(
                    create,
                    requests,
                    out_tx,
                    crate::access::Access::plaintext(),
                    crate::access::Caller::Unverified,
                )
                .await
        });
        let synced = out.recv().await.unwrap().unwrap();
        assert!(matches!(
            synced.response,
            Some(watch_response::Response::Synced(_))
        ));
        // Five commits while this (single-threaded) runtime is blocked, so the stream task
        // cannot take them one by one.
        let writing = store.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            for name in ["a", "b", "c", "d", "e"] {
                rt.block_on(writing.apply(vec![vs(name)], false)).unwrap();
            }
        })
        .join()
        .unwrap();
        let Some(watch_response::Response::Events(batch)) =
            out.recv().await.unwrap().unwrap().response
        else {
            panic!("expected events");
        };
        let revisions: Vec<u64> = batch.events.iter().map(|e| e.revision).collect();
        assert_eq!(revisions, [1, 2, 3, 4, 5]);
    }
}
