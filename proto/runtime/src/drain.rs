//! Stopping a process's parts: one stop signal they all watch, and a deadline for them to
//! finish once it is given.

use std::time::Duration;

use tokio::sync::watch;

/// How long a process's parts get to finish (streams to close, requests to end, files to be
/// written) after it was told to stop.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(10);

/// Resolves once `stop` turns true (or its sender is gone): the shared stop signal of a
/// process's parts.
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Waits for `parts` to finish, at most [`DRAIN_DEADLINE`]; `None` (logged) when they did not,
/// and the process goes on stopping without them.
pub async fn within_deadline<T>(what: &str, parts: impl Future<Output = T>) -> Option<T> {
    match tokio::time::timeout(DRAIN_DEADLINE, parts).await {
        Ok(done) => Some(done),
        Err(_) => {
            tracing::warn!(
                deadline = ?DRAIN_DEADLINE,
                "{what} still running after the drain deadline; stopping without them"
            );
            None
        }
    }
}
