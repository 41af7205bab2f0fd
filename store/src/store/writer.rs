//! The single writer: plans each command against the stored state, commits it as one atomic
//! batch with the revision counter, flushes a group of commands with one sync, then publishes.
//!
//! On a shared backend (TiKV with several store replicas) other replicas write too. Every batch
//! expects the revision counter this writer last saw, so a write in between makes the commit a
//! conflict; the writer then catches up — reads the other writes from the change log and
//! publishes them first, in revision order — and plans the command again, with a jittered,
//! bounded backoff. Catching up is also how an idle replica hears of other replicas' writes
//! ([`Command::CatchUp`], sent by the store's tailer).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pasa_runtime::backoff::Backoff;

use pasa_proto::store::v1::{
    ApplyOutcome, ApplyResponse, ApplyResult, DeleteResponse, DocumentError, ErrorCode, EventType,
    Resource,
};
use prost::Message;
use tokio::sync::{mpsc, oneshot};

use super::{Prepared, StoreError, doc_error, read_log_blocking, stored_u64};
use crate::backend::{Backend, BackendError, Locked, WriteBatch};
use crate::metrics::{Metrics, OpLabels, WriteOp};
use crate::record::{self, LogRecord, META_COMPACT, META_REVISION, ObjectKey};

/// Commands taken per group commit.
const GROUP: usize = 64;
/// Log entries removed per compaction batch.
const COMPACT_CHUNK: u64 = 4096;
/// How many times a command is planned again after other replicas' writes got in first.
/// Waits stay short: the other writer is usually done within one TiKV round trip, and a long
/// sleep only lets a busy competitor win again.
pub(crate) const CONFLICT_ATTEMPTS: u32 = 16;
const CONFLICT_FIRST_WAIT: Duration = Duration::from_millis(1);
const CONFLICT_MAX_WAIT: Duration = Duration::from_millis(50);

/// Where the writer's results go: the in-memory state that watchers are served from.
pub(crate) trait Outlet {
    /// Records that are durable, in revision order.
    fn publish(&self, records: Vec<LogRecord>);
    /// The change log now starts after `compact_revision`.
    fn compacted(&self, compact_revision: u64);
    /// The change log no longer holds what this replica missed: rebuild the in-memory state
    /// from the backend (cutting every watch off) and return its revision and compact revision.
    fn reload(&self) -> Result<(u64, u64), StoreError>;
}

pub(crate) enum Command {
    Apply {
        docs: Vec<Prepared>,
        dry_run: bool,
        reply: oneshot::Sender<Result<ApplyResponse, StoreError>>,
    },
    Delete {
        keys: Vec<ObjectKey>,
        expected_mod_revision: Option<u64>,
        ignore_not_found: bool,
        reply: oneshot::Sender<Result<DeleteResponse, StoreError>>,
    },
    /// Another replica may have written: read the change log up to the backend's revision.
    CatchUp,
}

/// A command's answer, held until the group is durable.
enum Done {
    Apply(
        oneshot::Sender<Result<ApplyResponse, StoreError>>,
        Result<ApplyResponse, StoreError>,
    ),
    Delete(
        oneshot::Sender<Result<DeleteResponse, StoreError>>,
        Result<DeleteResponse, StoreError>,
    ),
}

impl Done {
    fn fail(self) {
        match self {
            Done::Apply(reply, _) => {
                let _ = reply.send(Err(StoreError::Failed));
            }
            Done::Delete(reply, _) => {
                let _ = reply.send(Err(StoreError::Failed));
            }
        }
    }

    fn send(self) {
        // A caller that went away does not need its answer.
        match self {
            Done::Apply(reply, result) => {
                let _ = reply.send(result);
            }
            Done::Delete(reply, result) => {
                let _ = reply.send(result);
            }
        }
    }
}

pub(crate) struct Writer {
    backend: Arc<dyn Backend>,
    revision: u64,
    compact_revision: u64,
    retention: u64,
    metrics: Metrics,
    failed: bool,
    shared: bool,
    /// The revision counter's lock on a shared backend, held while a command is planned.
    locked: Option<Box<dyn Locked>>,
}

impl Writer {
    pub fn new(
        backend: Arc<dyn Backend>,
        revision: u64,
        compact_revision: u64,
        retention: u64,
        metrics: Metrics,
    ) -> Writer {
        Writer {
            revision,
            compact_revision,
            retention: retention.max(1),
            metrics,
            failed: false,
            shared: backend.shared(),
            locked: None,
            backend,
        }
    }

    /// Runs until every sender is gone, handing each durable group's records, and each new
    /// compact revision, to `outlet`.
    pub fn run(mut self, mut rx: mpsc::Receiver<Command>, outlet: &dyn Outlet) {
        while let Some(first) = rx.blocking_recv() {
            let mut group = vec![first];
            while group.len() < GROUP {
                match rx.try_recv() {
                    Ok(cmd) => group.push(cmd),
                    Err(_) => break,
                }
            }
            let started = Instant::now();
            let mut done = Vec::with_capacity(group.len());
            let mut records = Vec::new();
            let mut ops = Vec::new();
            let compact_before = self.compact_revision;
            for cmd in group {
                match cmd {
                    Command::Apply {
                        docs,
                        dry_run,
                        reply,
                    } => {
                        let result = self.retrying(outlet, &mut records, |w, records| {
                            w.apply(&docs, dry_run, records)
                        });
                        ops.push(WriteOp::Apply);
                        done.push(Done::Apply(reply, result));
                    }
                    Command::Delete {
                        keys,
                        expected_mod_revision,
                        ignore_not_found,
                        reply,
                    } => {
                        let result = self.retrying(outlet, &mut records, |w, records| {
                            w.delete(&keys, expected_mod_revision, ignore_not_found, records)
                        });
                        ops.push(WriteOp::Delete);
                        done.push(Done::Delete(reply, result));
                    }
                    Command::CatchUp => {
                        if let Err(e) = self.catch_up(outlet, &mut records) {
                            tracing::warn!(error = %e, "could not read other replicas' writes; will retry");
                        }
                    }
                }
            }
            if !records.is_empty() {
                if let Err(e) = self.backend.sync() {
                    tracing::error!(error = %e, "flush failed; refusing further writes");
                    self.failed = true;
                    done.into_iter().for_each(Done::fail);
                    continue;
                }
                self.metrics.written_resources.inc_by(records.len() as u64);
                outlet.publish(records);
            }
            if self.compact_revision != compact_before {
                outlet.compacted(self.compact_revision);
            }
            let elapsed = started.elapsed().as_secs_f64();
            for op in ops {
                self.metrics
                    .write_duration
                    .get_or_create(&OpLabels { op })
                    .observe(elapsed);
            }
            done.into_iter().for_each(Done::send);
            if !self.failed && self.compact() {
                outlet.compacted(self.compact_revision);
            }
        }
        if let Err(e) = self.backend.sync() {
            tracing::error!(error = %e, "final flush failed");
        }
    }

    /// Runs `plan` (which plans and commits one command); when the commit conflicts with
    /// another replica's write, catches up and plans it again, up to [`CONFLICT_ATTEMPTS`].
    fn retrying<T>(
        &mut self,
        outlet: &dyn Outlet,
        records: &mut Vec<LogRecord>,
        mut plan: impl FnMut(&mut Self, &mut Vec<LogRecord>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut backoff = Backoff::new(CONFLICT_FIRST_WAIT, CONFLICT_MAX_WAIT, Duration::ZERO);
        let mut attempt = 1;
        loop {
            let planned = self
                .lock_revision(outlet, records)
                .and_then(|()| plan(self, records));
            // Released (written nothing) unless the plan committed through it.
            self.locked = None;
            match planned {
                Err(StoreError::Backend(BackendError::Conflict { key })) if self.shared => {
                    self.metrics.write_conflicts.inc();
                    if attempt >= CONFLICT_ATTEMPTS {
                        return Err(StoreError::Contended {
                            attempts: attempt,
                            key,
                        });
                    }
                    self.catch_up(outlet, records)?;
                    std::thread::sleep(backoff.failed());
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// On a shared backend, locks the revision counter (other replicas' writers wait) and
    /// catches up with what they committed before it.
    fn lock_revision(
        &mut self,
        outlet: &dyn Outlet,
        records: &mut Vec<LogRecord>,
    ) -> Result<(), StoreError> {
        if !self.shared {
            return Ok(());
        }
        let Some(locked) = self.backend.lock(META_REVISION)? else {
            return Ok(());
        };
        let head = match locked.value() {
            Some(v) => record::decode_u64(META_REVISION, v)?,
            None => 0,
        };
        if head != self.revision {
            self.catch_up_to(head, outlet, records)?;
        }
        self.locked = Some(locked);
        Ok(())
    }

    /// Reads what other replicas committed since this writer's revision into `records`, in
    /// revision order, and follows their compaction.
    fn catch_up(
        &mut self,
        outlet: &dyn Outlet,
        records: &mut Vec<LogRecord>,
    ) -> Result<(), StoreError> {
        let head = stored_u64(self.backend.as_ref(), META_REVISION)?;
        self.catch_up_to(head, outlet, records)
    }

    /// [`Writer::catch_up`] to `head`, the backend's revision as already read (the lock's).
    fn catch_up_to(
        &mut self,
        head: u64,
        outlet: &dyn Outlet,
        records: &mut Vec<LogRecord>,
    ) -> Result<(), StoreError> {
        let compact = stored_u64(self.backend.as_ref(), META_COMPACT)?;
        if compact > self.compact_revision {
            self.compact_revision = compact;
        }
        if head <= self.revision {
            return Ok(());
        }
        match read_log_blocking(self.backend.as_ref(), self.revision + 1, head) {
            Ok(missed) => {
                tracing::debug!(
                    from = self.revision + 1,
                    to = head,
                    "caught up with other replicas' writes"
                );
                records.extend(missed);
                self.revision = head;
                Ok(())
            }
            Err(StoreError::Compacted { .. }) => {
                // Publish what is already read first, so the rebuilt state is not overwritten.
                outlet.publish(std::mem::take(records));
                let (revision, compact_revision) = outlet.reload()?;
                tracing::error!(
                    missed_from = self.revision + 1,
                    revision,
                    "this replica fell behind the change log's compaction: rebuilt its state \
                     from the backend; every watch was cut off and resumes on the rebuilt state"
                );
                self.revision = revision;
                self.compact_revision = compact_revision;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn current(&self, key: &ObjectKey) -> Result<Option<Resource>, StoreError> {
        let storage_key = key.storage_key();
        match self.backend.get(&storage_key)? {
            Some(raw) => Ok(Some(record::decode_resource(&storage_key, &raw)?)),
            None => Ok(None),
        }
    }

    /// Starts a batch that only commits if nobody else moved the revision. Every write moves
    /// it, so this one expectation covers every object this writer read for the batch.
    fn batch(&self) -> WriteBatch {
        let mut batch = WriteBatch::default();
        let expected = (self.revision > 0).then(|| record::encode_u64(self.revision));
        batch.expect(META_REVISION, expected);
        batch
    }

    fn commit(
        &mut self,
        mut batch: WriteBatch,
        revision: u64,
        new_records: Vec<LogRecord>,
        records: &mut Vec<LogRecord>,
    ) -> Result<(), StoreError> {
        batch.put(META_REVISION, record::encode_u64(revision));
        match self.locked.take() {
            Some(locked) => locked.write(batch)?,
            None => self.backend.write(batch)?,
        }
        self.revision = revision;
        records.extend(new_records);
        Ok(())
    }

    fn apply(
        &mut self,
        docs: &[Prepared],
        dry_run: bool,
        records: &mut Vec<LogRecord>,
    ) -> Result<ApplyResponse, StoreError> {
        if self.failed {
            return Err(StoreError::Failed);
        }
        let mut batch = self.batch();
        let mut revision = self.revision;
        let committed = record::now_unix_nanos();
        let mut results = Vec::new();
        let mut errors = Vec::new();
        let mut new_records = Vec::new();
        for doc in docs {
            let current = self.current(&doc.key)?;
            if let Some(err) = check_expected(
                doc.index,
                &doc.key,
                doc.expected_mod_revision,
                current.as_ref(),
            ) {
                errors.push(err);
                continue;
            }
            let mut resource = doc.resource.clone();
            let (outcome, prev) = match current {
                None => {
                    revision += 1;
                    resource.create_revision = revision;
                    resource.version = 1;
                    (ApplyOutcome::Created, None)
                }
                Some(cur) if same_content(&cur, &resource) => {
                    results.push(ApplyResult {
                        r#ref: Some(doc.key.to_ref()),
                        outcome: ApplyOutcome::Unchanged as i32,
                        revision: cur.mod_revision,
                    });
                    continue;
                }
                Some(cur) => {
                    revision += 1;
                    resource.create_revision = cur.create_revision;
                    resource.version = cur.version + 1;
                    (ApplyOutcome::Configured, Some(cur))
                }
            };
            resource.mod_revision = revision;
            batch.put(doc.key.storage_key(), resource.encode_to_vec());
            let event = if prev.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            };
            let rec = LogRecord {
                r#type: event as i32,
                revision,
                resource: Some(resource),
                prev,
                commit_time_unix_nanos: committed,
            };
            batch.put(record::log_key(revision), rec.encode_to_vec());
            new_records.push(rec);
            results.push(ApplyResult {
                r#ref: Some(doc.key.to_ref()),
                outcome: outcome as i32,
                revision,
            });
        }
        if !errors.is_empty() {
            return Ok(ApplyResponse {
                errors,
                revision: self.revision,
                ..Default::default()
            });
        }
        if !dry_run && revision != self.revision {
            self.commit(batch, revision, new_records, records)?;
        }
        Ok(ApplyResponse {
            results,
            errors,
            revision: if dry_run { self.revision } else { revision },
            warnings: Vec::new(),
        })
    }

    fn delete(
        &mut self,
        keys: &[ObjectKey],
        expected_mod_revision: Option<u64>,
        ignore_not_found: bool,
        records: &mut Vec<LogRecord>,
    ) -> Result<DeleteResponse, StoreError> {
        if self.failed {
            return Err(StoreError::Failed);
        }
        let mut batch = self.batch();
        let mut revision = self.revision;
        let committed = record::now_unix_nanos();
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        let mut new_records = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, key) in keys.iter().enumerate() {
            if !seen.insert(key.clone()) {
                continue;
            }
            let current = self.current(key)?;
            if let Some(err) =
                check_expected(i as u32, key, expected_mod_revision, current.as_ref())
            {
                errors.push(err);
                continue;
            }
            let Some(resource) = current else {
                if !ignore_not_found {
                    errors.push(doc_error(
                        i as u32,
                        key.to_ref(),
                        ErrorCode::NotFound,
                        "",
                        format!("{key} not found"),
                    ));
                }
                continue;
            };
            revision += 1;
            batch.delete(key.storage_key());
            let rec = LogRecord {
                r#type: EventType::Deleted as i32,
                revision,
                resource: Some(resource),
                prev: None,
                commit_time_unix_nanos: committed,
            };
            batch.put(record::log_key(revision), rec.encode_to_vec());
            new_records.push(rec);
            deleted.push(ApplyResult {
                r#ref: Some(key.to_ref()),
                outcome: ApplyOutcome::Unspecified as i32,
                revision,
            });
        }
        if !errors.is_empty() {
            return Ok(DeleteResponse {
                errors,
                revision: self.revision,
                ..Default::default()
            });
        }
        if revision != self.revision {
            self.commit(batch, revision, new_records, records)?;
        }
        Ok(DeleteResponse {
            deleted,
            errors,
            revision,
        })
    }

    /// Drops change-log entries older than the retention, a chunk at a time. Returns whether
    /// anything was dropped.
    fn compact(&mut self) -> bool {
        let target = self.revision.saturating_sub(self.retention);
        if target < self.compact_revision + COMPACT_CHUNK.min(self.retention) {
            return false;
        }
        let before = self.compact_revision;
        while self.compact_revision < target {
            let upto = (self.compact_revision + COMPACT_CHUNK).min(target);
            let mut batch = WriteBatch::default();
            // Replicas compact the same log: the one that finds the counter moved stands back.
            batch.expect(
                META_COMPACT,
                (self.compact_revision > 0).then(|| record::encode_u64(self.compact_revision)),
            );
            for rev in self.compact_revision + 1..=upto {
                batch.delete(record::log_key(rev));
            }
            batch.put(META_COMPACT, record::encode_u64(upto));
            match self.backend.write(batch) {
                Ok(()) => {}
                Err(BackendError::Conflict { .. }) => {
                    // Another replica compacted; follow its counter.
                    if let Ok(compact) = stored_u64(self.backend.as_ref(), META_COMPACT) {
                        self.compact_revision = self.compact_revision.max(compact);
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "change-log compaction failed; will retry");
                    break;
                }
            }
            self.compact_revision = upto;
        }
        tracing::debug!(
            compact_revision = self.compact_revision,
            "change log compacted"
        );
        self.compact_revision > before
    }
}

/// Content the user controls; revisions and derived index keys aside.
fn same_content(a: &Resource, b: &Resource) -> bool {
    a.api_version == b.api_version
        && a.labels == b.labels
        && a.annotations == b.annotations
        && a.spec_json == b.spec_json
        && a.index == b.index
}

fn check_expected(
    index: u32,
    key: &ObjectKey,
    expected: Option<u64>,
    current: Option<&Resource>,
) -> Option<DocumentError> {
    let expected = expected?;
    let found = current.map_or(0, |r| r.mod_revision);
    (found != expected).then(|| {
        let found_text = match current {
            Some(r) => format!("it is at {}", r.mod_revision),
            None => "it does not exist".to_string(),
        };
        let want = if expected == 0 {
            "to not exist yet".to_string()
        } else {
            format!("at revision {expected}")
        };
        doc_error(
            index,
            key.to_ref(),
            ErrorCode::Conflict,
            "metadata.resourceVersion",
            format!("{key} was expected {want}, but {found_text}: read it again and retry"),
        )
    })
}
