//! A fake engine that keeps everything in memory, for tests of code above the backend. It is
//! "durable" only for as long as the value lives.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::{Backend, BackendError, KeyValue, Op, WriteBatch};

/// In-memory fake backend; clones share the same data, so a "reopen" is a clone.
#[derive(Clone, Default)]
pub struct FakeMemoryBackend {
    data: Arc<Mutex<BTreeMap<Vec<u8>, Vec<u8>>>>,
}

impl FakeMemoryBackend {
    fn data(&self) -> std::sync::MutexGuard<'_, BTreeMap<Vec<u8>, Vec<u8>>> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Backend for FakeMemoryBackend {
    fn name(&self) -> &'static str {
        "fake-memory"
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self.data().get(key).cloned())
    }

    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KeyValue>, BackendError> {
        if start >= end {
            return Ok(Vec::new());
        }
        Ok(self
            .data()
            .range(start.to_vec()..end.to_vec())
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn write(&self, batch: WriteBatch) -> Result<(), BackendError> {
        let mut data = self.data();
        for (key, want) in &batch.expect {
            if data.get(key) != want.as_ref() {
                return Err(BackendError::Conflict {
                    key: String::from_utf8_lossy(key).into_owned(),
                });
            }
        }
        for op in batch.ops {
            match op {
                Op::Put(k, v) => {
                    data.insert(k, v);
                }
                Op::Delete(k) => {
                    data.remove(&k);
                }
            }
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::conformance;

    #[test]
    fn fake_memory_backend_passes_the_conformance_suite() {
        let backend = FakeMemoryBackend::default();
        conformance::run(|| backend.clone());
    }
}
