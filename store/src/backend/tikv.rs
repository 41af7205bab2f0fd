//! The distributed engine: TiKV, through [`pasa_tikv`]'s transactional client. One store write
//! is one TiKV transaction, so resource keys, the change-log entry and the revision counter
//! commit together even with several store replicas writing; a precondition that no longer
//! holds, or another replica's commit in between, is a [`BackendError::Conflict`]. Durable when
//! the transaction commits (TiKV replicates it before answering), so [`Backend::sync`] has
//! nothing to do.

use std::sync::Arc;
use std::time::Duration;

use pasa_tikv::{Mutation, Tikv, TikvError};

use super::{Backend, BackendError, KeyValue, Locked, Op, WriteBatch};

const ENGINE: &str = "tikv";

/// Where a store's keys live in a TiKV cluster shared with others, unless told otherwise.
pub const DEFAULT_KEY_PREFIX: &str = "pasa/";

pub struct TikvBackend {
    kv: Arc<Tikv>,
}

struct TikvLocked {
    kv: Arc<Tikv>,
    locked: pasa_tikv::Locked,
}

fn mutations(ops: Vec<Op>) -> Vec<Mutation> {
    ops.into_iter()
        .map(|op| match op {
            Op::Put(k, v) => Mutation::Put(k, v),
            Op::Delete(k) => Mutation::Delete(k),
        })
        .collect()
}

impl Locked for TikvLocked {
    fn value(&self) -> Option<&[u8]> {
        self.locked.value()
    }

    fn write(self: Box<Self>, batch: WriteBatch) -> Result<(), BackendError> {
        for (key, want) in &batch.expect {
            let key_text = String::from_utf8_lossy(key).into_owned();
            if key.as_slice() != self.locked.key() {
                return Err(BackendError::Engine {
                    engine: ENGINE,
                    action: "write a batch",
                    source: format!(
                        "a locked write cannot expect {key_text}, which it did not lock"
                    )
                    .into(),
                });
            }
            if want.as_deref() != self.locked.value() {
                return Err(BackendError::Conflict { key: key_text });
            }
        }
        self.kv
            .commit_locked(self.locked, mutations(batch.ops))
            .map_err(engine_error("write a batch"))
    }
}

fn engine_error(action: &'static str) -> impl FnOnce(TikvError) -> BackendError {
    move |e| match e {
        TikvError::Conflict { key } => BackendError::Conflict { key },
        other => BackendError::Engine {
            engine: ENGINE,
            action,
            source: Box::new(other),
        },
    }
}

impl TikvBackend {
    /// Connects through PD (`host:port` each); every key is stored under `prefix`.
    pub fn connect(pd: &[String], prefix: &str, timeout: Duration) -> Result<Self, BackendError> {
        let kv = Tikv::connect(pd, prefix.as_bytes(), timeout).map_err(engine_error("connect"))?;
        Ok(TikvBackend { kv: Arc::new(kv) })
    }
}

impl Backend for TikvBackend {
    fn name(&self) -> &'static str {
        ENGINE
    }

    fn shared(&self) -> bool {
        true
    }

    fn lock(&self, key: &[u8]) -> Result<Option<Box<dyn Locked>>, BackendError> {
        let locked = self.kv.lock(key).map_err(engine_error("lock a key"))?;
        Ok(Some(Box::new(TikvLocked {
            kv: Arc::clone(&self.kv),
            locked,
        })))
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        self.kv.get(key).map_err(engine_error("read"))
    }

    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KeyValue>, BackendError> {
        self.kv
            .scan(start, end, limit)
            .map_err(engine_error("scan"))
    }

    fn write(&self, batch: WriteBatch) -> Result<(), BackendError> {
        self.kv
            .write(batch.expect, mutations(batch.ops))
            .map_err(engine_error("write a batch"))
    }

    fn sync(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use pasa_tikv::fake::FakeTikv;

    use super::*;
    use crate::backend::conformance;

    #[test]
    fn tikv_through_the_fake_pd_and_tikv_passes_the_backend_conformance_suite() {
        let fake = FakeTikv::start((Ipv4Addr::LOCALHOST, 0).into()).unwrap();
        let pd = vec![fake.pd_address()];
        conformance::run(|| {
            TikvBackend::connect(&pd, "conformance/", Duration::from_secs(5)).unwrap()
        });
        assert_eq!(fake.locked_keys(), 0, "a transaction was left unfinished");
    }
}
