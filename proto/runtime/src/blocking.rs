//! Work on user input (parsing, validation, analysis) kept off the async runtime's workers: it
//! runs on the runtime's blocking threads, a bounded number of jobs at a time, so a large
//! document never stalls health checks, other requests or the stop signal.

use std::sync::Arc;

use tokio::sync::Semaphore;

/// A bound on the blocking work running at once. Clones share the bound.
#[derive(Clone, Debug)]
pub struct Pool {
    permits: Arc<Semaphore>,
}

impl Pool {
    /// At most `size` jobs at once (at least one).
    pub fn new(size: usize) -> Pool {
        Pool {
            permits: Arc::new(Semaphore::new(size.max(1))),
        }
    }

    /// As many jobs at once as the machine has cores.
    pub fn per_core() -> Pool {
        Pool::new(std::thread::available_parallelism().map_or(1, usize::from))
    }

    /// Runs `job` on a blocking thread once a place is free, and returns what it returns. A job
    /// that panicked answers `Err`. Dropping the future before the job starts gives its place
    /// up; a job that started runs to its end.
    pub async fn run<T, F>(&self, job: F) -> Result<T, tokio::task::JoinError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        // The semaphore is never closed, so acquiring only waits.
        let permit = self.permits.clone().acquire_owned().await.ok();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            job()
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_jobs_run_at_once_than_the_pool_allows() {
        let pool = Pool::new(2);
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let jobs = (0..8).map(|_| {
            let (pool, running, most) = (pool.clone(), running.clone(), most.clone());
            tokio::spawn(async move {
                pool.run(move || {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                    running.fetch_sub(1, Ordering::SeqCst);
                })
                .await
            })
        });
        for job in jobs.collect::<Vec<_>>() {
            job.await.unwrap().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_job_that_panics_is_an_error() {
        assert!(Pool::new(1).run(|| panic!("bad input")).await.is_err());
        assert_eq!(Pool::new(1).run(|| 7).await.unwrap(), 7);
    }
}
