//! The embedded engine: sled, one database directory per store.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Backend, BackendError, KeyValue, Op, WriteBatch};

const ENGINE: &str = "sled";

/// How long opening waits for the database's file lock. sled's background threads hold the lock
/// for a moment after the last handle in this process is dropped (and a store that is restarting
/// may still be exiting), so a lock held briefly is waited for; one held longer is another
/// process's, and opening fails naming the lock.
const LOCK_WAIT: Duration = Duration::from_secs(5);
const LOCK_RETRY: Duration = Duration::from_millis(20);

pub struct SledBackend {
    db: sled::Db,
    /// Serialises conditional writes so an expectation checked is still true when applied.
    write_lock: Mutex<()>,
}

fn engine_error(action: &'static str) -> impl FnOnce(sled::Error) -> BackendError {
    move |e| BackendError::Engine {
        engine: ENGINE,
        action,
        source: Box::new(e),
    }
}

impl SledBackend {
    /// Opens (or creates) the database in `dir`.
    pub fn open(dir: &Path) -> Result<Self, BackendError> {
        let config = sled::Config::new()
            .path(dir)
            .mode(sled::Mode::HighThroughput);
        let deadline = Instant::now() + LOCK_WAIT;
        let db = loop {
            match config.open() {
                Err(e) if lock_held(&e) && Instant::now() < deadline => {
                    std::thread::sleep(LOCK_RETRY)
                }
                Err(e) if lock_held(&e) => {
                    return Err(BackendError::Locked {
                        dir: dir.to_path_buf(),
                        holder: holder(&dir.join("db"))
                            .map(|h| format!(", held by {h}"))
                            .unwrap_or_default(),
                    });
                }
                other => break other.map_err(engine_error("open its database"))?,
            }
        };
        Ok(SledBackend {
            db,
            write_lock: Mutex::new(()),
        })
    }
}

/// Whether opening failed because another handle holds the database's file lock (sled reports it
/// as an I/O error of kind `Other` whose text says so).
fn lock_held(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.kind() == std::io::ErrorKind::Other
        && io.to_string().contains("could not acquire lock"))
}

/// Who holds the lock on `file`, as `NAME (pid N)`: the kernel's table of file locks lists the
/// holder's pid beside the file's inode (Linux only; `None` elsewhere or when not found).
fn holder(file: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    let inode = std::fs::metadata(file).ok()?.ino().to_string();
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    // `1: FLOCK  ADVISORY  WRITE 4242 08:01:1311 0 EOF`: the pid, then `major:minor:inode`
    // (a `->` line is a process waiting for the lock, not holding it).
    let pid = locks
        .lines()
        .filter(|l| !l.contains("->"))
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let at = fields.iter().position(|f| f.matches(':').count() == 2)?;
            if fields[at].rsplit(':').next()? != inode {
                return None;
            }
            fields.get(at.checked_sub(1)?).copied()
        })?;
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok();
    Some(match name {
        Some(name) => format!("{} (pid {pid})", name.trim()),
        None => format!("pid {pid}"),
    })
}

impl Backend for SledBackend {
    fn name(&self) -> &'static str {
        ENGINE
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        Ok(self
            .db
            .get(key)
            .map_err(engine_error("read"))?
            .map(|v| v.to_vec()))
    }

    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<KeyValue>, BackendError> {
        if start >= end {
            return Ok(Vec::new());
        }
        self.db
            .range(start..end)
            .take(limit)
            .map(|kv| {
                kv.map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .map_err(engine_error("scan"))
            })
            .collect()
    }

    fn write(&self, batch: WriteBatch) -> Result<(), BackendError> {
        let _guard = self
            .write_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for (key, want) in &batch.expect {
            let have = self.db.get(key).map_err(engine_error("read"))?;
            if have.as_deref() != want.as_deref() {
                return Err(BackendError::Conflict {
                    key: String::from_utf8_lossy(key).into_owned(),
                });
            }
        }
        let mut sled_batch = sled::Batch::default();
        for op in batch.ops {
            match op {
                Op::Put(k, v) => sled_batch.insert(k, v),
                Op::Delete(k) => sled_batch.remove(k),
            }
        }
        self.db
            .apply_batch(sled_batch)
            .map_err(engine_error("write a batch"))
    }

    fn sync(&self) -> Result<(), BackendError> {
        self.db.flush().map_err(engine_error("flush to disk"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::conformance;

    #[test]
    fn sled_passes_the_backend_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        conformance::run(|| SledBackend::open(&path).unwrap());
    }

    #[test]
    fn a_database_held_open_elsewhere_is_refused_naming_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let _held = SledBackend::open(&path).unwrap();
        let started = Instant::now();
        let err = match SledBackend::open(&path) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("a second open of a held database succeeded"),
        };
        assert!(started.elapsed() >= LOCK_WAIT, "gave up before waiting");
        // What the user can act on, not the engine's `Os { code: 11, kind: WouldBlock … }`.
        assert_eq!(
            err,
            format!(
                "another process holds {} (its lock, held by {} (pid {})); stop it or use another --data-dir",
                path.display(),
                std::fs::read_to_string("/proc/self/comm").unwrap().trim(),
                std::process::id()
            )
        );
    }
}
