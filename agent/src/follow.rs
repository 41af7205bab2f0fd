//! Following the store: one watch stream for the agent's subscription, feeding the [`Cache`] and
//! publishing it after every change. The stream resumes from the last revision after a cut-off or
//! a lost connection, relists when the store has compacted that revision away, and saves the cache
//! to the cache dir each time it is complete (SYNCED), so a restarted agent can serve while the
//! store is away.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pasa_proto::store::v1::{
    CancelReason, SubscriberIdentity, Subscription, WatchCreate, WatchRequest, watch_request,
    watch_response,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::cache::Cache;

/// What to follow, and where.
#[derive(Debug, Clone)]
pub struct FollowConfig {
    /// The store (or PCP) address, `host:port` or a URL.
    pub server: String,
    pub subscription: Subscription,
    pub identity: SubscriberIdentity,
    /// Where the last complete cache is saved; `None` keeps nothing on disk.
    pub cache_dir: Option<PathBuf>,
}

/// How the agent stands with the store.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Link {
    /// Not yet connected.
    #[default]
    Connecting,
    /// Connected and complete up to the cache's revision.
    Synced,
    /// The store is unreachable or the stream broke; serving the cache as it is. The reason is
    /// for status pages.
    Degraded(String),
}

/// Waits after a failure, doubling up to a ceiling.
struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    fn next(&mut self) -> Duration {
        let wait = self.0;
        self.0 = (self.0 * 2).min(Self::MAX);
        wait
    }

    fn reset(&mut self) {
        self.0 = Self::FIRST;
    }
}

/// Why one watch stream ended.
enum Ended {
    /// Watch again from the cache's revision (slow consumer, store shutdown, lost connection).
    Resume(String),
    /// The revision is gone from the change log: watch again with a snapshot.
    Relist,
}

/// Follows the store until `stop` turns true. `cache` starts as loaded from disk (or empty);
/// every change is published on `published`, the link state on `link`.
pub async fn follow(
    config: FollowConfig,
    mut cache: Cache,
    published: watch::Sender<Arc<Cache>>,
    link: watch::Sender<Link>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Backoff(Backoff::FIRST);
    let mut relist = cache.revision() == 0;
    loop {
        if *stop.borrow() {
            return;
        }
        let ended = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            ended = watch_once(&config, &mut cache, relist, &published, &link, &mut backoff) => ended,
        };
        match ended {
            Ended::Relist => relist = true,
            Ended::Resume(why) => {
                relist = cache.revision() == 0 || cache.snapshot_pending();
                tracing::warn!(reason = %why, revision = cache.revision(), "store watch ended; resuming");
                link.send_replace(Link::Degraded(why));
                let wait = backoff.next();
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

async fn watch_once(
    config: &FollowConfig,
    cache: &mut Cache,
    relist: bool,
    published: &watch::Sender<Arc<Cache>>,
    link: &watch::Sender<Link>,
    backoff: &mut Backoff,
) -> Ended {
    let endpoint = match pasa_proto::client::endpoint(&config.server) {
        Ok(e) => e,
        Err(e) => return Ended::Resume(format!("--server {e}")),
    };
    let channel = match endpoint.connect().await {
        Ok(c) => c,
        Err(e) => {
            return Ended::Resume(format!("cannot reach the store at {}: {e}", config.server));
        }
    };
    let mut client = pasa_proto::client::store_client(channel);
    let from_revision = if relist { 0 } else { cache.revision() + 1 };
    let (tx, rx) = mpsc::channel(1);
    let create = WatchRequest {
        request: Some(watch_request::Request::Create(WatchCreate {
            subscription: Some(config.subscription.clone()),
            from_revision,
            identity: Some(config.identity.clone()),
        })),
    };
    if tx.send(create).await.is_err() {
        return Ended::Resume("the watch request could not be sent".into());
    }
    let mut stream = match client.watch(ReceiverStream::new(rx)).await {
        Ok(response) => response.into_inner(),
        Err(status) => return Ended::Resume(format!("watch refused: {}", status.message())),
    };
    if relist {
        cache.begin_snapshot();
    }
    loop {
        let message = match stream.message().await {
            Ok(Some(m)) => m,
            Ok(None) => return Ended::Resume("the store closed the watch".into()),
            Err(status) => return Ended::Resume(format!("watch failed: {}", status.message())),
        };
        match message.response {
            Some(watch_response::Response::Events(batch)) => {
                for event in &batch.events {
                    if let Err(e) = cache.apply(event) {
                        tracing::warn!(error = %e, "store event skipped");
                    }
                }
                published.send_replace(Arc::new(cache.clone()));
            }
            Some(watch_response::Response::Synced(s)) => {
                cache.synced(s.revision);
                // Saved before anyone hears it is complete.
                if let Some(dir) = &config.cache_dir
                    && let Err(e) = cache.save(dir)
                {
                    tracing::warn!(error = %e, "cache not saved");
                }
                published.send_replace(Arc::new(cache.clone()));
                link.send_replace(Link::Synced);
                backoff.reset();
            }
            Some(watch_response::Response::Progress(p)) => cache.progress(p.revision),
            Some(watch_response::Response::Cancelled(c)) => {
                return match CancelReason::try_from(c.reason) {
                    Ok(CancelReason::Compacted) => Ended::Relist,
                    _ => Ended::Resume(format!("the store ended the watch: {}", c.message)),
                };
            }
            None => {}
        }
    }
}
