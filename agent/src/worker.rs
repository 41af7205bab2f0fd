//! A worker on a thread of its own for work that must not hold an async runtime thread
//! (translating a large scope, writing and fsyncing the cache): asks coalesce to the newest,
//! one runs at a time, in the order asked.

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Where work is asked of a [`spawn`]ed worker.
pub(crate) struct Asks<T> {
    tx: watch::Sender<Option<T>>,
}

impl<T> Asks<T> {
    /// Asks for `work`; it replaces what was asked and not started yet.
    pub(crate) fn ask(&self, work: T) {
        self.tx.send_replace(Some(work));
    }
}

/// Runs `work` on each ask, on a blocking thread of the current runtime, until the [`Asks`]
/// are dropped; the handle resolves once the last ask has run.
pub(crate) fn spawn<T: Clone + Send + Sync + 'static>(
    mut work: impl FnMut(T) + Send + 'static,
) -> (Asks<T>, JoinHandle<()>) {
    let (tx, mut rx) = watch::channel(None::<T>);
    let runtime = tokio::runtime::Handle::current();
    let task = tokio::task::spawn_blocking(move || {
        // An ask not yet seen is taken even once the sender is gone.
        while runtime.block_on(rx.changed()).is_ok() {
            if let Some(asked) = rx.borrow_and_update().clone() {
                work(asked);
            }
        }
    });
    (Asks { tx }, task)
}
