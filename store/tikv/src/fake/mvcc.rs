//! The fake's storage: Percolator-style multi-version keys in memory, as TiKV's transactional
//! API exposes them to a client. Each key has at most one lock (a transaction's prewrite) and a
//! history of write records keyed by commit timestamp. It is a model of the protocol, good
//! enough to drive tikv-client's real code paths — conflicts, locks left by a dead writer, lock
//! resolution — and nothing more: one region, no replication, nothing on disk.

// Errors here are TiKV's protocol messages, handed to the client as they are.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::ops::Bound;

use super::proto::kvrpcpb::{self, KeyError, LockInfo, Op, WriteConflict};

/// Timestamps are PD's: physical milliseconds shifted left by this many bits, plus a counter.
pub const LOGICAL_BITS: u32 = 18;

pub fn physical_ms(ts: u64) -> u64 {
    ts >> LOGICAL_BITS
}

#[derive(Debug, Clone)]
struct Lock {
    primary: Vec<u8>,
    start_ts: u64,
    ttl_ms: u64,
    op: Op,
    value: Vec<u8>,
    min_commit_ts: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum WriteKind {
    Put(Vec<u8>),
    Delete,
    /// A `Lock` mutation committed: no data change.
    Lock,
    /// A transaction rolled back at this start timestamp; blocks a late prewrite of it.
    Rollback,
}

#[derive(Debug, Clone)]
struct Write {
    start_ts: u64,
    kind: WriteKind,
}

#[derive(Debug, Default)]
struct Versions {
    lock: Option<Lock>,
    /// Commit timestamp → record. Rollbacks are keyed by their start timestamp.
    writes: BTreeMap<u64, Write>,
}

/// A key of a scan, with its value or the lock that hides it.
pub type ScanItem = (Vec<u8>, Result<Vec<u8>, KeyError>);

/// What checking a transaction's primary lock found.
pub struct TxnStatus {
    pub lock_ttl: u64,
    pub commit_version: u64,
    pub action: kvrpcpb::Action,
    pub lock_info: Option<LockInfo>,
}

#[derive(Debug, Default)]
pub struct Mvcc {
    keys: BTreeMap<Vec<u8>, Versions>,
}

fn locked(key: &[u8], lock: &Lock) -> KeyError {
    KeyError {
        locked: Some(lock_info(key, lock)),
        ..Default::default()
    }
}

fn lock_info(key: &[u8], lock: &Lock) -> LockInfo {
    LockInfo {
        primary_lock: lock.primary.clone(),
        lock_version: lock.start_ts,
        key: key.to_vec(),
        lock_ttl: lock.ttl_ms,
        lock_type: lock.op as i32,
        min_commit_ts: lock.min_commit_ts,
        ..Default::default()
    }
}

/// Transaction `start_ts` finds `key` written by another, committed at `commit_ts`.
fn conflict(
    start_ts: u64,
    (write, commit_ts): (&Write, u64),
    key: &[u8],
    primary: &[u8],
    reason: kvrpcpb::write_conflict::Reason,
) -> KeyError {
    KeyError {
        conflict: Some(WriteConflict {
            start_ts,
            conflict_ts: write.start_ts,
            conflict_commit_ts: commit_ts,
            key: key.to_vec(),
            primary: primary.to_vec(),
            reason: reason as i32,
        }),
        ..Default::default()
    }
}

fn abort(message: impl Into<String>) -> KeyError {
    KeyError {
        abort: message.into(),
        ..Default::default()
    }
}

fn txn_not_found(start_ts: u64, key: &[u8]) -> KeyError {
    KeyError {
        txn_not_found: Some(kvrpcpb::TxnNotFound {
            start_ts,
            primary_key: key.to_vec(),
        }),
        ..Default::default()
    }
}

impl Versions {
    /// The value visible at `ts`, or the lock that hides it.
    fn read(&self, key: &[u8], ts: u64) -> Result<Option<Vec<u8>>, KeyError> {
        if let Some(lock) = &self.lock
            && lock.start_ts <= ts
            && !matches!(lock.op, Op::Lock | Op::PessimisticLock)
        {
            return Err(locked(key, lock));
        }
        for (_, write) in self.writes.range(..=ts).rev() {
            match &write.kind {
                WriteKind::Put(v) => return Ok(Some(v.clone())),
                WriteKind::Delete => return Ok(None),
                WriteKind::Lock | WriteKind::Rollback => continue,
            }
        }
        Ok(None)
    }

    /// The commit record of the transaction that started at `start_ts`, if any.
    fn committed(&self, start_ts: u64) -> Option<(u64, &Write)> {
        self.writes
            .iter()
            .find(|(_, w)| w.start_ts == start_ts)
            .map(|(commit, w)| (*commit, w))
    }

    fn commit_lock(&mut self, commit_ts: u64) {
        if let Some(lock) = self.lock.take() {
            let kind = match lock.op {
                Op::Put | Op::Insert => WriteKind::Put(lock.value),
                Op::Del => WriteKind::Delete,
                _ => WriteKind::Lock,
            };
            self.writes.insert(
                commit_ts,
                Write {
                    start_ts: lock.start_ts,
                    kind,
                },
            );
        }
    }

    fn rollback(&mut self, start_ts: u64) {
        if self.lock.as_ref().is_some_and(|l| l.start_ts == start_ts) {
            self.lock = None;
        }
        self.writes.entry(start_ts).or_insert(Write {
            start_ts,
            kind: WriteKind::Rollback,
        });
    }
}

impl Mvcc {
    pub fn get(&self, key: &[u8], ts: u64) -> Result<Option<Vec<u8>>, KeyError> {
        match self.keys.get(key) {
            Some(v) => v.read(key, ts),
            None => Ok(None),
        }
    }

    /// Pairs with `start <= key < end` (an empty `end` is unbounded) visible at `ts`, up to
    /// `limit`; a locked key is returned with its error, as TiKV does.
    pub fn scan(&self, start: &[u8], end: &[u8], limit: usize, ts: u64) -> Vec<ScanItem> {
        let upper = if end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(end.to_vec())
        };
        let mut out = Vec::new();
        for (key, versions) in self
            .keys
            .range::<Vec<u8>, _>((Bound::Included(start.to_vec()), upper))
        {
            if out.len() >= limit {
                break;
            }
            match versions.read(key, ts) {
                Ok(Some(v)) => out.push((key.clone(), Ok(v))),
                Ok(None) => {}
                Err(e) => out.push((key.clone(), Err(e))),
            }
        }
        out
    }

    /// First phase: locks every key, or (on any error) none. In a pessimistic transaction a
    /// key it locked earlier is taken over as is; its other keys are checked for writes after
    /// its `for_update_ts`.
    pub fn prewrite(&mut self, req: &kvrpcpb::PrewriteRequest) -> Vec<KeyError> {
        let start_ts = req.start_version;
        let since = if req.for_update_ts > 0 {
            req.for_update_ts
        } else {
            start_ts
        };
        let mut errors = Vec::new();
        for (i, m) in req.mutations.iter().enumerate() {
            let Some(versions) = self.keys.get(&m.key) else {
                continue;
            };
            let pessimistic = req.pessimistic_actions.get(i).copied()
                == Some(kvrpcpb::prewrite_request::PessimisticAction::DoPessimisticCheck as i32);
            if pessimistic {
                match &versions.lock {
                    Some(lock) if lock.start_ts == start_ts => continue,
                    _ => {
                        errors.push(abort(format!(
                            "transaction {start_ts} lost its pessimistic lock on a key"
                        )));
                        continue;
                    }
                }
            }
            if let Some(lock) = &versions.lock
                && lock.start_ts != start_ts
            {
                errors.push(locked(&m.key, lock));
                continue;
            }
            if let Some((&commit_ts, write)) = versions.writes.iter().next_back()
                && commit_ts >= since
            {
                if write.start_ts == start_ts && write.kind == WriteKind::Rollback {
                    errors.push(abort(format!(
                        "transaction {start_ts} was rolled back before its prewrite arrived"
                    )));
                } else if write.start_ts != start_ts {
                    errors.push(conflict(
                        start_ts,
                        (write, commit_ts),
                        &m.key,
                        &req.primary_lock,
                        kvrpcpb::write_conflict::Reason::Optimistic,
                    ));
                }
                continue;
            }
            let exists = matches!(versions.read(&m.key, start_ts), Ok(Some(_)));
            if exists && matches!(Op::try_from(m.op), Ok(Op::Insert | Op::CheckNotExists)) {
                errors.push(KeyError {
                    already_exist: Some(kvrpcpb::AlreadyExist { key: m.key.clone() }),
                    ..Default::default()
                });
            }
        }
        if !errors.is_empty() {
            return errors;
        }
        for m in &req.mutations {
            let op = Op::try_from(m.op).unwrap_or(Op::Lock);
            if op == Op::CheckNotExists {
                continue;
            }
            self.keys.entry(m.key.clone()).or_default().lock = Some(Lock {
                primary: req.primary_lock.clone(),
                start_ts,
                ttl_ms: req.lock_ttl,
                op,
                value: m.value.clone(),
                min_commit_ts: req.min_commit_ts.max(start_ts + 1),
            });
        }
        Vec::new()
    }

    /// A pessimistic transaction's lock, taken before it knows what it will write: refused if
    /// another transaction holds the key, or committed to it after `for_update_ts`. Returns the
    /// newest committed value of each key.
    pub fn pessimistic_lock(
        &mut self,
        req: &kvrpcpb::PessimisticLockRequest,
    ) -> Result<Vec<Option<Vec<u8>>>, KeyError> {
        let start_ts = req.start_version;
        for m in &req.mutations {
            let Some(versions) = self.keys.get(&m.key) else {
                continue;
            };
            if let Some(lock) = &versions.lock
                && lock.start_ts != start_ts
            {
                return Err(locked(&m.key, lock));
            }
            if let Some((&commit_ts, write)) = versions.writes.iter().next_back()
                && commit_ts > req.for_update_ts
                && write.start_ts != start_ts
            {
                return Err(conflict(
                    start_ts,
                    (write, commit_ts),
                    &m.key,
                    &req.primary_lock,
                    kvrpcpb::write_conflict::Reason::PessimisticRetry,
                ));
            }
        }
        let mut values = Vec::new();
        for m in &req.mutations {
            let versions = self.keys.entry(m.key.clone()).or_default();
            values.push(versions.read(&m.key, u64::MAX).unwrap_or(None));
            if versions.lock.is_none() {
                versions.lock = Some(Lock {
                    primary: req.primary_lock.clone(),
                    start_ts,
                    ttl_ms: req.lock_ttl,
                    op: Op::PessimisticLock,
                    value: Vec::new(),
                    min_commit_ts: req.min_commit_ts.max(start_ts + 1),
                });
            }
        }
        Ok(values)
    }

    /// Releases pessimistic locks that never got to prewrite.
    pub fn pessimistic_rollback(&mut self, start_ts: u64, keys: &[Vec<u8>]) {
        for key in keys {
            if let Some(versions) = self.keys.get_mut(key)
                && versions
                    .lock
                    .as_ref()
                    .is_some_and(|l| l.start_ts == start_ts && l.op == Op::PessimisticLock)
            {
                versions.lock = None;
            }
        }
    }

    /// Second phase, for each key: the lock becomes a write record at `commit_ts`.
    pub fn commit(&mut self, start_ts: u64, commit_ts: u64, keys: &[Vec<u8>]) -> Option<KeyError> {
        for key in keys {
            let versions = self.keys.entry(key.clone()).or_default();
            match &versions.lock {
                Some(lock) if lock.start_ts == start_ts => {
                    if commit_ts < lock.min_commit_ts {
                        return Some(KeyError {
                            commit_ts_expired: Some(kvrpcpb::CommitTsExpired {
                                start_ts,
                                attempted_commit_ts: commit_ts,
                                key: key.clone(),
                                min_commit_ts: lock.min_commit_ts,
                            }),
                            ..Default::default()
                        });
                    }
                    versions.commit_lock(commit_ts);
                }
                _ => match versions.committed(start_ts) {
                    Some((_, w)) if w.kind != WriteKind::Rollback => {}
                    Some(_) => {
                        return Some(abort(format!(
                            "transaction {start_ts} was rolled back; it cannot commit"
                        )));
                    }
                    None => return Some(txn_not_found(start_ts, key)),
                },
            }
        }
        None
    }

    pub fn rollback(&mut self, start_ts: u64, keys: &[Vec<u8>]) -> Option<KeyError> {
        for key in keys {
            let versions = self.keys.entry(key.clone()).or_default();
            if let Some((commit_ts, w)) = versions.committed(start_ts)
                && w.kind != WriteKind::Rollback
            {
                return Some(abort(format!(
                    "transaction {start_ts} already committed at {commit_ts}"
                )));
            }
            versions.rollback(start_ts);
        }
        None
    }

    /// The status of the transaction whose primary key is `primary`; rolls it back if its lock
    /// outlived its TTL by `current_ts`.
    pub fn check_txn_status(
        &mut self,
        primary: &[u8],
        lock_ts: u64,
        current_ts: u64,
        rollback_if_not_exist: bool,
    ) -> Result<TxnStatus, KeyError> {
        let versions = self.keys.entry(primary.to_vec()).or_default();
        if let Some(lock) = &versions.lock
            && lock.start_ts == lock_ts
        {
            if physical_ms(current_ts) >= physical_ms(lock.start_ts) + lock.ttl_ms {
                versions.rollback(lock_ts);
                return Ok(TxnStatus {
                    lock_ttl: 0,
                    commit_version: 0,
                    action: kvrpcpb::Action::TtlExpireRollback,
                    lock_info: None,
                });
            }
            return Ok(TxnStatus {
                lock_ttl: lock.ttl_ms,
                commit_version: 0,
                action: kvrpcpb::Action::NoAction,
                lock_info: Some(lock_info(primary, lock)),
            });
        }
        match versions.committed(lock_ts) {
            Some((commit_ts, w)) => Ok(TxnStatus {
                lock_ttl: 0,
                commit_version: if w.kind == WriteKind::Rollback {
                    0
                } else {
                    commit_ts
                },
                action: kvrpcpb::Action::NoAction,
                lock_info: None,
            }),
            None if rollback_if_not_exist => {
                versions.rollback(lock_ts);
                Ok(TxnStatus {
                    lock_ttl: 0,
                    commit_version: 0,
                    action: kvrpcpb::Action::LockNotExistRollback,
                    lock_info: None,
                })
            }
            None => Err(txn_not_found(lock_ts, primary)),
        }
    }

    /// Commits (`commit_ts > 0`) or rolls back every lock of the transaction that started at
    /// `start_ts`: on `keys`, or anywhere when `keys` is empty.
    pub fn resolve(&mut self, start_ts: u64, commit_ts: u64, keys: &[Vec<u8>]) {
        let targets: Vec<Vec<u8>> = if keys.is_empty() {
            self.keys
                .iter()
                .filter(|(_, v)| v.lock.as_ref().is_some_and(|l| l.start_ts == start_ts))
                .map(|(k, _)| k.clone())
                .collect()
        } else {
            keys.to_vec()
        };
        for key in targets {
            let versions = self.keys.entry(key).or_default();
            if versions
                .lock
                .as_ref()
                .is_none_or(|l| l.start_ts != start_ts)
            {
                continue;
            }
            if commit_ts > 0 {
                versions.commit_lock(commit_ts);
            } else {
                versions.rollback(start_ts);
            }
        }
    }

    /// Extends the primary lock's TTL.
    pub fn heart_beat(&mut self, primary: &[u8], start_ts: u64, ttl: u64) -> Result<u64, KeyError> {
        match self
            .keys
            .get_mut(primary)
            .and_then(|v| v.lock.as_mut())
            .filter(|l| l.start_ts == start_ts)
        {
            Some(lock) => {
                lock.ttl_ms = lock.ttl_ms.max(ttl);
                Ok(lock.ttl_ms)
            }
            None => Err(txn_not_found(start_ts, primary)),
        }
    }

    /// Locks left behind, for tests: how many keys are locked now.
    pub fn lock_count(&self) -> usize {
        self.keys.values().filter(|v| v.lock.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str) -> kvrpcpb::Mutation {
        kvrpcpb::Mutation {
            op: Op::Put as i32,
            key: key.into(),
            value: value.into(),
            ..Default::default()
        }
    }

    fn prewrite(m: &mut Mvcc, start: u64, muts: Vec<kvrpcpb::Mutation>) -> Vec<KeyError> {
        let primary = muts[0].key.clone();
        m.prewrite(&kvrpcpb::PrewriteRequest {
            mutations: muts,
            primary_lock: primary,
            start_version: start,
            lock_ttl: 3000,
            ..Default::default()
        })
    }

    #[test]
    fn a_committed_write_is_seen_from_its_commit_timestamp_on() {
        let mut m = Mvcc::default();
        assert!(prewrite(&mut m, 10, vec![put("a", "1")]).is_empty());
        assert!(m.get(b"a", 11).unwrap_err().locked.is_some());
        assert_eq!(
            m.get(b"a", 9).unwrap(),
            None,
            "a lock after the read is invisible"
        );
        assert!(m.commit(10, 20, &[b"a".to_vec()]).is_none());
        assert_eq!(m.get(b"a", 19).unwrap(), None);
        assert_eq!(m.get(b"a", 20).unwrap(), Some(b"1".to_vec()));
    }

    #[test]
    fn a_write_committed_after_a_transaction_started_conflicts_with_it() {
        let mut m = Mvcc::default();
        assert!(prewrite(&mut m, 10, vec![put("a", "1")]).is_empty());
        assert!(m.commit(10, 20, &[b"a".to_vec()]).is_none());
        let errors = prewrite(&mut m, 15, vec![put("a", "2")]);
        let conflict = errors[0].conflict.as_ref().expect("a write conflict");
        assert_eq!(
            (conflict.conflict_ts, conflict.conflict_commit_ts),
            (10, 20)
        );
        assert_eq!(
            m.lock_count(),
            0,
            "nothing is locked after a refused prewrite"
        );
    }

    #[test]
    fn an_expired_lock_is_rolled_back_and_a_committed_one_resolved() {
        let mut m = Mvcc::default();
        let start = 1000 << LOGICAL_BITS;
        assert!(prewrite(&mut m, start, vec![put("p", "1"), put("s", "1")]).is_empty());
        let alive = m
            .check_txn_status(b"p", start, start + (10 << LOGICAL_BITS), false)
            .unwrap();
        assert_eq!(alive.lock_ttl, 3000);
        let dead = m
            .check_txn_status(b"p", start, start + (5000 << LOGICAL_BITS), false)
            .unwrap();
        assert_eq!(dead.action, kvrpcpb::Action::TtlExpireRollback);
        m.resolve(start, 0, &[]);
        assert_eq!(m.lock_count(), 0);
        assert!(m.commit(start, start + 5, &[b"p".to_vec()]).is_some());

        let start = 2000 << LOGICAL_BITS;
        assert!(prewrite(&mut m, start, vec![put("p", "2"), put("s", "2")]).is_empty());
        assert!(m.commit(start, start + 1, &[b"p".to_vec()]).is_none());
        let status = m.check_txn_status(b"p", start, start + 2, false).unwrap();
        assert_eq!(status.commit_version, start + 1);
        m.resolve(start, status.commit_version, &[b"s".to_vec()]);
        assert_eq!(m.get(b"s", start + 2).unwrap(), Some(b"2".to_vec()));
    }
}
