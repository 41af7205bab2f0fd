//! The agent's long-running parts as named tasks. Each part runs until the agent stops; one that
//! ends before (an error, a panic, or returning at all) ends the agent with the part's name and
//! what it said, non-zero, so that the pod's restart policy starts it again: an agent that has
//! lost its ADS server or its store watch must not stay up answering `/healthz`.
//!
//! Envoy, when the agent runs it (`--envoy`), is supervised on its own (`crate::envoy`): it is
//! stopped first, while it is still served, and its end is the agent's exit status.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;

use tokio::task::{Id, JoinSet};

/// A part of the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Part {
    /// The ADS server: the Unix socket (and `--xds-listen`).
    Ads,
    /// The admin endpoint (`--admin`).
    Admin,
    /// The store watch feeding the cache.
    StoreWatch,
    /// Translation, on its own thread.
    Translator,
    /// The status reports to the store.
    Report,
    /// The mounted credentials, read again when they rotate.
    Credentials,
    /// The workload certificate's renewal from Istio's CA.
    CertificateRenewal,
    /// The application's probes (`--status-listen`).
    AppProbes,
    /// Learning an on-demand proxy's scope from its requests (`--scope on-demand`).
    Learning,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Part::Ads => "the ADS server",
            Part::Admin => "the admin endpoint",
            Part::StoreWatch => "the store watch",
            Part::Translator => "translation",
            Part::Report => "the status reports",
            Part::Credentials => "the credential watch",
            Part::CertificateRenewal => "the certificate renewal",
            Part::AppProbes => "the application's probes",
            Part::Learning => "the on-demand learner",
        })
    }
}

/// The running parts.
#[derive(Default)]
pub struct Supervisor {
    tasks: JoinSet<anyhow::Result<()>>,
    parts: HashMap<Id, Part>,
}

impl Supervisor {
    /// Runs `work` as `part`.
    pub fn spawn<E>(
        &mut self,
        part: Part,
        work: impl Future<Output = Result<(), E>> + Send + 'static,
    ) where
        E: Into<anyhow::Error>,
    {
        let handle = self
            .tasks
            .spawn(async move { work.await.map_err(Into::into) });
        self.parts.insert(handle.id(), part);
    }

    /// Runs `work`, which cannot fail, as `part`.
    pub fn spawn_infallible(
        &mut self,
        part: Part,
        work: impl Future<Output = ()> + Send + 'static,
    ) {
        self.spawn(part, async move {
            work.await;
            Ok::<(), anyhow::Error>(())
        });
    }

    /// The first part to end, and why, told as the agent's error; never resolves while every
    /// part runs (nor when there are none).
    pub async fn ended(&mut self) -> anyhow::Error {
        match self.tasks.join_next_with_id().await {
            None => std::future::pending().await,
            Some(Ok((id, result))) => {
                let part = self.part(id);
                match result {
                    Ok(()) => anyhow::anyhow!("{part} ended while the agent was running"),
                    Err(e) => e.context(format!("{part} failed")),
                }
            }
            Some(Err(e)) => {
                let part = self.part(e.id());
                anyhow::anyhow!("{part} failed: {e}")
            }
        }
    }

    /// Waits for every part to end (after the stop signal); the first that failed, by name.
    pub async fn join_all(mut self) -> anyhow::Result<()> {
        let mut first: Option<anyhow::Error> = None;
        while let Some(done) = self.tasks.join_next_with_id().await {
            let failed = match done {
                Ok((_, Ok(()))) => None,
                Ok((id, Err(e))) => Some(e.context(format!("{} failed", self.part(id)))),
                Err(e) => Some(anyhow::anyhow!("{} failed: {e}", self.part(e.id()))),
            };
            if let Some(e) = failed {
                tracing::warn!(error = %format!("{e:#}"), "a part of the agent failed while stopping");
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn part(&self, id: Id) -> Part {
        // Every task is spawned with its part.
        self.parts.get(&id).copied().unwrap_or(Part::Translator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_part_that_ends_early_is_named() {
        let mut parts = Supervisor::default();
        parts.spawn_infallible(Part::Admin, std::future::pending());
        parts.spawn(Part::StoreWatch, async {
            Err::<(), _>(std::io::Error::other("the socket is gone"))
        });
        let e = parts.ended().await;
        assert_eq!(
            format!("{e:#}"),
            "the store watch failed: the socket is gone"
        );
        parts.spawn_infallible(Part::Translator, async { panic!("a bug") });
        let e = parts.ended().await.to_string();
        assert!(e.starts_with("translation failed: task"), "{e}");
        assert!(e.contains("panicked"), "{e}");
        parts.spawn_infallible(Part::Report, async {});
        assert_eq!(
            parts.ended().await.to_string(),
            "the status reports ended while the agent was running"
        );
    }

    #[tokio::test]
    async fn stopping_waits_for_every_part_and_names_a_failure() {
        let mut parts = Supervisor::default();
        parts.spawn_infallible(Part::Admin, async {});
        parts.spawn(Part::Ads, async {
            Err::<(), _>(anyhow::anyhow!("accept failed"))
        });
        let e = parts.join_all().await.unwrap_err();
        assert_eq!(format!("{e:#}"), "the ADS server failed: accept failed");
        assert!(Supervisor::default().join_all().await.is_ok());
    }
}
