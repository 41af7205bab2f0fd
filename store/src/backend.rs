//! The storage engine boundary: an ordered key-value store with atomic, conditional multi-key
//! writes. Everything the store persists goes through this trait, so a distributed engine (TiKV)
//! can replace the embedded one (sled) without touching revision, log or index code.

use std::fmt;

#[cfg(any(test, feature = "testing"))]
pub mod conformance;
#[cfg(any(test, feature = "testing"))]
pub mod memory;
pub mod sled;
pub mod tikv;

/// A key and its value.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// One mutation of a write batch.
#[derive(Clone, PartialEq, Eq)]
pub enum Op {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Put(k, v) => write!(f, "Put({}, {} bytes)", String::from_utf8_lossy(k), v.len()),
            Op::Delete(k) => write!(f, "Delete({})", String::from_utf8_lossy(k)),
        }
    }
}

/// An atomic write: every `expect` must hold (key has that value, or is absent for `None`), then
/// every op is applied; or nothing is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    pub expect: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    pub ops: Vec<Op>,
}

impl WriteBatch {
    pub fn put(&mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.ops.push(Op::Put(key.into(), value.into()));
    }

    pub fn delete(&mut self, key: impl Into<Vec<u8>>) {
        self.ops.push(Op::Delete(key.into()));
    }

    pub fn expect(&mut self, key: impl Into<Vec<u8>>, value: Option<Vec<u8>>) {
        self.expect.push((key.into(), value));
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A precondition of a write did not hold; nothing was written.
    #[error("write conflict on key {key}: another writer changed it")]
    Conflict { key: String },
    #[error("storage engine {engine} failed to {action}")]
    Engine {
        engine: &'static str,
        action: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Another process has the embedded database open (its file lock is held).
    #[error("another process holds {} (its lock{holder}); stop it or use another --data-dir", dir.display())]
    Locked {
        dir: std::path::PathBuf,
        /// `, held by NAME (pid N)` when the holder could be found, else empty.
        holder: String,
    },
}

/// A lock on one key of a shared backend, taken by [`Backend::lock`].
pub trait Locked: Send {
    /// The key's newest committed value when the lock was taken.
    fn value(&self) -> Option<&[u8]>;

    /// Applies the batch atomically and releases the lock. Its expectations may name only the
    /// locked key, and are checked against [`Locked::value`]. Dropping the lock instead writes
    /// nothing and releases it.
    fn write(self: Box<Self>, batch: WriteBatch) -> Result<(), BackendError>;
}

/// An ordered key-value engine.
pub trait Backend: Send + Sync + 'static {
    /// Short engine name, for status and metrics.
    fn name(&self) -> &'static str;

    /// Whether other processes (store replicas) may write to the same data, so the store must
    /// follow the change log for writes it did not make.
    fn shared(&self) -> bool {
        false
    }

    /// On a shared backend, locks `key` until the returned lock writes or is dropped: other
    /// writers that lock it wait, so a writer can read and plan without another committing in
    /// between. `None` where the engine has a single writer anyway.
    fn lock(&self, _key: &[u8]) -> Result<Option<Box<dyn Locked>>, BackendError> {
        Ok(None)
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError>;

    /// Up to `limit` pairs with `start <= key < end`, in ascending key order.
    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KeyValue>, BackendError>;

    /// Applies the batch atomically if all its expectations hold. Visible to readers on return;
    /// durable after the next [`Backend::sync`].
    fn write(&self, batch: WriteBatch) -> Result<(), BackendError>;

    /// Makes every write that has returned durable.
    fn sync(&self) -> Result<(), BackendError>;
}
