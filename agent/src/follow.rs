//! Following the store: one watch stream for the agent's subscription, feeding the [`Cache`] and
//! publishing it after every change. The stream resumes from the last revision after a cut-off or
//! a lost connection, relists when the store has compacted that revision away, and saves the cache
//! to the cache dir each time it is complete (SYNCED), so a restarted agent can serve while the
//! store is away.
//!
//! **Changing the subscription.** The subscription comes from a watch channel. When it changes
//! while a stream is open, a `WatchUpdate` goes out on that stream; the store answers with ADDED
//! for objects that now match and DELETED for those that no longer do, which the cache applies as
//! any other event, then SYNCED. A stream always starts with the subscription current at that
//! moment. Each SYNCED (the snapshot's, then one per update, in order) marks the cache as holding
//! the whole answer to that subscription ([`Cache::answered`]), which is how the agent knows a
//! widened scope has arrived before it serves config that needs it. A resumed watch replays only
//! changes (not objects that match only under a new subscription), so a watch whose subscription
//! changed without its answer being complete starts over with a snapshot instead of resuming.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pasa_proto::client::Backoff;

use crate::metrics::{Metrics, ReasonLabels};
use pasa_proto::store::v1::{
    CancelReason, SubscriberIdentity, Subscription, WatchCreate, WatchRequest, WatchUpdate,
    watch_request, watch_response,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

use crate::cache::Cache;
use crate::worker::{self, Asks};

/// What to follow, and where.
#[derive(Debug, Clone)]
pub struct FollowConfig {
    /// The store (or PCP) address, `host:port` or a URL.
    pub server: String,
    /// The subscription; a new value is applied to the open stream (see the module doc).
    pub subscription: watch::Receiver<Subscription>,
    pub identity: SubscriberIdentity,
    /// Where the last complete cache is saved; `None` keeps nothing on disk.
    pub cache_dir: Option<PathBuf>,
    /// Where the reconnects are counted, if anywhere.
    pub metrics: Option<Arc<Metrics>>,
    /// Told the revision of each cache written to `cache_dir` (saves run on a thread of their
    /// own), if anyone listens.
    pub saved: Option<watch::Sender<u64>>,
}

impl FollowConfig {
    fn reconnects(&self, reason: Disconnect) {
        if let Some(metrics) = &self.metrics {
            metrics
                .store_reconnects
                .get_or_create(&ReasonLabels {
                    reason: reason.name(),
                })
                .inc();
        }
    }
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

/// The store watch's waits after a failure: 100 ms doubling to 5 s, jittered; a complete answer
/// (`SYNCED`) starts over.
pub(crate) fn store_backoff() -> Backoff {
    Backoff::new(
        Duration::from_millis(100),
        Duration::from_secs(5),
        Duration::from_secs(10),
    )
}

/// The subscription the cache's contents answer to.
#[derive(Default)]
struct InForce {
    /// The subscription of the last stream (with its updates); `None` before the first.
    subscription: Option<Subscription>,
    /// An update was sent on the last stream and its SYNCED has not come, so the cache may hold
    /// only part of its answer.
    updated: bool,
}

impl InForce {
    /// Whether a watch with `next` may resume from the cache's revision (rather than relist).
    fn resumable_with(&self, next: &Subscription) -> bool {
        !self.updated && self.subscription.as_ref().is_none_or(|s| s == next)
    }
}

/// Why one watch stream ended.
enum Ended {
    /// Watch again from the cache's revision (slow consumer, store shutdown, lost connection),
    /// with the reason for status pages.
    Resume(Disconnect, String),
    /// The revision is gone from the change log: watch again with a snapshot.
    Relist,
}

/// Why the store watch ended (`pasa_agent_store_reconnects_total{reason}`).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Disconnect {
    /// The store could not be reached (or `--server` is not an address).
    Unreachable,
    /// The store refused the watch.
    Refused,
    /// The stream closed, or a request on it could not be sent.
    Closed,
    /// The stream failed with an error.
    Failed,
    /// The store cut the watch off: the agent fell behind, or the store is shutting down.
    CutOff,
    /// The agent's revision was compacted away: it lists everything again.
    Compacted,
}

impl Disconnect {
    /// The metric label.
    pub fn name(self) -> &'static str {
        match self {
            Disconnect::Unreachable => "unreachable",
            Disconnect::Refused => "refused",
            Disconnect::Closed => "closed",
            Disconnect::Failed => "failed",
            Disconnect::CutOff => "cut_off",
            Disconnect::Compacted => "compacted",
        }
    }
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
    let mut backoff = store_backoff();
    let mut relist = cache.revision() == 0;
    let mut in_force = InForce::default();
    let mut subscription = config.subscription.clone();
    // Outlives each watch stream, so what a stream left unsaved is saved when it ends.
    let mut saver = Saver::new(config.cache_dir.clone(), config.saved.clone());
    // Each watch stream runs in a span of its own (`store_watch`, with its attempt number).
    let mut attempt: u64 = 0;
    loop {
        if *stop.borrow() {
            break;
        }
        let current = subscription.borrow_and_update().clone();
        if !in_force.resumable_with(&current) {
            tracing::info!("the subscription changed since the cache was complete; relisting");
            relist = true;
        }
        let stream = Stream {
            config: &config,
            subscription: &mut subscription,
            in_force: &mut in_force,
            saver: &mut saver,
        };
        attempt += 1;
        let span = tracing::info_span!("store_watch", server = %config.server, attempt,
            from = cache.revision(), relist);
        let watching = stream
            .watch(current, &mut cache, relist, &published, &link, &mut backoff)
            .instrument(span);
        let ended = tokio::select! {
            _ = stop.wait_for(|s| *s) => None,
            ended = watching => Some(ended),
        };
        // Live changes not yet on disk are saved now (the agent may be about to stop or restart
        // while the store is away).
        saver.flush(&cache);
        let Some(ended) = ended else { break };
        match ended {
            Ended::Relist => {
                config.reconnects(Disconnect::Compacted);
                relist = true;
            }
            Ended::Resume(reason, why) => {
                config.reconnects(reason);
                relist = cache.revision() == 0 || cache.snapshot_pending();
                tracing::warn!(reason = %why, revision = cache.revision(), "store watch ended; resuming");
                link.send_replace(Link::Degraded(why));
                let wait = backoff.failed();
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
    saver.finish().await;
}

/// One watch stream.
struct Stream<'a> {
    config: &'a FollowConfig,
    subscription: &'a mut watch::Receiver<Subscription>,
    in_force: &'a mut InForce,
    saver: &'a mut Saver,
}

impl Stream<'_> {
    async fn watch(
        self,
        current: Subscription,
        cache: &mut Cache,
        relist: bool,
        published: &watch::Sender<Arc<Cache>>,
        link: &watch::Sender<Link>,
        backoff: &mut Backoff,
    ) -> Ended {
        let Stream {
            config,
            subscription,
            in_force,
            saver,
        } = self;
        let endpoint = match pasa_proto::client::endpoint(&config.server) {
            Ok(e) => e,
            Err(e) => return Ended::Resume(Disconnect::Unreachable, format!("--server {e}")),
        };
        let channel = match endpoint.connect().await {
            Ok(c) => c,
            Err(e) => {
                return Ended::Resume(
                    Disconnect::Unreachable,
                    format!("cannot reach the store at {}: {e}", config.server),
                );
            }
        };
        let mut client = pasa_proto::client::store_client(channel);
        let from_revision = if relist { 0 } else { cache.revision() + 1 };
        let (tx, rx) = mpsc::channel(1);
        let create = WatchRequest {
            request: Some(watch_request::Request::Create(WatchCreate {
                subscription: Some(current.clone()),
                from_revision,
                identity: Some(config.identity.clone()),
            })),
        };
        if tx.send(create).await.is_err() {
            return Ended::Resume(
                Disconnect::Closed,
                "the watch request could not be sent".into(),
            );
        }
        let mut stream = match client.watch(ReceiverStream::new(rx)).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                return Ended::Resume(
                    Disconnect::Refused,
                    format!("watch refused: {}", status.message()),
                );
            }
        };
        *in_force = InForce {
            subscription: Some(current),
            updated: false,
        };
        if relist {
            cache.begin_snapshot();
        }
        // The subscriptions sent whose SYNCED has not come yet, oldest first.
        let mut awaiting = std::collections::VecDeque::from([in_force.subscription.clone()]);
        let mut updates_open = true;
        // An update waiting for room on the request channel (the store reads updates only once
        // its snapshot is out, so sending must never block reading).
        let mut pending: Option<Subscription> = None;
        loop {
            let message = tokio::select! {
                message = stream.message() => message,
                changed = subscription.changed(), if updates_open => {
                    if changed.is_err() {
                        // Nobody changes the subscription any more; keep the current one.
                        updates_open = false;
                        continue;
                    }
                    let next = subscription.borrow_and_update().clone();
                    let latest = pending.as_ref().or(in_force.subscription.as_ref());
                    if latest != Some(&next) {
                        pending = Some(next);
                    }
                    continue;
                }
                () = saver.due(), if saver.dirty => {
                    saver.save(cache);
                    continue;
                }
                permit = tx.reserve(), if pending.is_some() => {
                    let (Ok(permit), Some(next)) = (permit, pending.take()) else {
                        return Ended::Resume(
                            Disconnect::Closed,
                            "the subscription update could not be sent".into(),
                        );
                    };
                    tracing::info!(rules = next.rules.len(), "updating the watch's subscription");
                    permit.send(WatchRequest {
                        request: Some(watch_request::Request::Update(WatchUpdate {
                            subscription: Some(next.clone()),
                        })),
                    });
                    in_force.subscription = Some(next.clone());
                    in_force.updated = true;
                    awaiting.push_back(Some(next));
                    continue;
                }
            };
            let message = match message {
                Ok(Some(m)) => m,
                Ok(None) => {
                    return Ended::Resume(Disconnect::Closed, "the store closed the watch".into());
                }
                Err(status) => {
                    return Ended::Resume(
                        Disconnect::Failed,
                        format!("watch failed: {}", status.message()),
                    );
                }
            };
            match message.response {
                Some(watch_response::Response::Events(batch)) => {
                    for event in &batch.events {
                        if let Err(e) = cache.apply(event) {
                            tracing::warn!(error = %e, "store event skipped");
                        }
                    }
                    published.send_replace(Arc::new(cache.clone()));
                    if !cache.snapshot_pending() {
                        saver.changed();
                    }
                }
                Some(watch_response::Response::Synced(s)) => {
                    cache.synced(s.revision);
                    if let Some(Some(answered)) = awaiting.pop_front() {
                        cache.set_answered(answered);
                    }
                    if awaiting.is_empty() {
                        in_force.updated = false;
                    }
                    // Saved before anyone hears it is complete.
                    saver.save(cache);
                    published.send_replace(Arc::new(cache.clone()));
                    link.send_replace(Link::Synced);
                    backoff.reset();
                }
                Some(watch_response::Response::Progress(p)) => cache.progress(p.revision),
                Some(watch_response::Response::Cancelled(c)) => {
                    return match CancelReason::try_from(c.reason) {
                        Ok(CancelReason::Compacted) => Ended::Relist,
                        _ => Ended::Resume(
                            Disconnect::CutOff,
                            format!("the store ended the watch: {}", c.message),
                        ),
                    };
                }
                None => {}
            }
        }
    }
}

/// How long a live change may wait before the cache is saved again.
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// Saves the cache to the cache dir: the complete cache at every SYNCED, live changes at most
/// [`SAVE_EVERY`] after they arrive and whenever a watch stream ends, so a restart while the
/// store is away serves what was last seen, not what the last snapshot held.
struct Saver {
    dirty: bool,
    last: tokio::time::Instant,
    /// The newest cache to save, and the thread saving it; none without a directory.
    writer: Option<(Asks<Cache>, tokio::task::JoinHandle<()>)>,
}

impl Saver {
    /// Saves go to a thread of their own (a save writes and fsyncs the whole cache, which must
    /// not hold a runtime thread); saves asked for while one runs coalesce to the newest, and
    /// they are written in order.
    fn new(dir: Option<PathBuf>, saved: Option<watch::Sender<u64>>) -> Saver {
        let writer = dir.map(|dir| {
            worker::spawn(move |cache: Cache| match cache.save(&dir) {
                Ok(()) => {
                    if let Some(saved) = &saved {
                        saved.send_replace(cache.revision());
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cache not saved"),
            })
        });
        Saver {
            dirty: false,
            last: tokio::time::Instant::now(),
            writer,
        }
    }

    /// Waits for the saves asked for to be written.
    async fn finish(self) {
        if let Some((asks, task)) = self.writer {
            drop(asks);
            if let Err(e) = task.await {
                tracing::warn!(error = %e, "the cache saver failed");
            }
        }
    }

    /// A live change arrived: save it when the next save is due.
    fn changed(&mut self) {
        self.dirty = self.writer.is_some();
    }

    /// Resolves when a pending change may be saved.
    async fn due(&self) {
        tokio::time::sleep_until(self.last + SAVE_EVERY).await;
    }

    /// Saves a pending change now.
    fn flush(&mut self, cache: &Cache) {
        if self.dirty {
            self.save(cache);
        }
    }

    fn save(&mut self, cache: &Cache) {
        self.dirty = false;
        self.last = tokio::time::Instant::now();
        if let Some((asks, _)) = &self.writer {
            // O(1): the cache's maps are persistent.
            asks.ask(cache.clone());
        }
    }
}
