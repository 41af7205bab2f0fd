//! The store as the modes run it: the real [`Store`] on sled, opened in this process.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use pasa_store::backend::sled::SledBackend;
use pasa_store::metrics::Metrics;
use pasa_store::{Store, StoreConfig};

/// An opened store and where its database is.
pub struct Embedded {
    pub store: Store,
    pub dir: PathBuf,
    max_batch: usize,
    /// The temporary directory the database is in, when none was given: removed when dropped.
    _temp: Option<tempfile::TempDir>,
}

/// Opens a store in `data_dir` (created if missing), or in a fresh temporary directory named
/// after `prefix`; batches of up to `max_batch` documents are accepted.
pub fn open(data_dir: Option<&Path>, prefix: &str, max_batch: usize) -> anyhow::Result<Embedded> {
    let (dir, temp) = match data_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            (dir.to_path_buf(), None)
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix(prefix)
                .tempdir()
                .context("cannot create a temporary directory")?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    Ok(Embedded {
        store: open_at(&dir, max_batch)?,
        dir,
        max_batch,
        _temp: temp,
    })
}

fn open_at(dir: &Path, max_batch: usize) -> anyhow::Result<Store> {
    let backend = SledBackend::open(dir)
        .with_context(|| format!("cannot open a sled database in {}", dir.display()))?;
    let config = StoreConfig {
        max_batch: StoreConfig::default().max_batch.max(max_batch),
        ..StoreConfig::default()
    };
    Store::open(Arc::new(backend), config, Metrics::new()).context("cannot open the store")
}

impl Embedded {
    /// Opens the store again on the same database, as a restarted store process does (it
    /// rebuilds its indexes from the backend). The store must be shut down and every other
    /// holder of it gone: the database has one opener at a time.
    pub fn reopen(self) -> anyhow::Result<Embedded> {
        let Embedded {
            store,
            dir,
            max_batch,
            _temp,
        } = self;
        drop(store);
        Ok(Embedded {
            store: open_at(&dir, max_batch)?,
            dir,
            max_batch,
            _temp,
        })
    }
}
