//! Following the store: one watch stream for the agent's subscription, feeding the [`Cache`] and
//! publishing it after every change. The stream resumes from the last revision after a cut-off or
//! a lost connection, relists when the store has compacted that revision away, and saves the cache
//! to the cache dir each time it is complete (SYNCED), so a restarted agent can serve while the
//! store is away. The wire protocol is `pasa_proto::watch`'s; this module decides what to do
//! with what it says.
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
//!
//! **Liveness.** The store sends a progress marker on every watch every few seconds (10 s by
//! default), so a stream that brings nothing at all for [`FollowConfig::liveness`] (a few of
//! those intervals) is taken as lost, as is a connection or stream that does not open within
//! it: a hung store (a stopped process, a half-dead connection) leaves the agent degraded and
//! reconnecting with its backoff, never waiting on it forever.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pasa_runtime::backoff::Backoff;

use crate::metrics::{Metrics, ReasonLabels};
use pasa_proto::client::{ConnectError, Servers};
use pasa_proto::store::v1::{SubscriberIdentity, Subscription};
use pasa_proto::watch::{Watch, WatchError, WatchEvent, WatchStart};
use tokio::sync::watch;
use tracing::Instrument;

use crate::cache::Cache;
use crate::worker::{self, Asks};

/// What to follow, and where.
#[derive(Debug, Clone)]
pub struct FollowConfig {
    /// The store replicas (or PCPs) to follow, one at a time (see [`Servers`]).
    pub servers: Servers,
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
    /// How long a watch may bring nothing (no change, no progress marker), or take to open,
    /// before it is taken as lost (see the module doc); [`DEFAULT_LIVENESS`] unless a test
    /// wants it shorter.
    pub liveness: Duration,
}

/// [`FollowConfig::liveness`] by default: three of the store's default progress intervals.
pub const DEFAULT_LIVENESS: Duration = Duration::from_secs(30);

impl FollowConfig {
    fn reconnects(&self, reason: &Ended) {
        if let Some(metrics) = &self.metrics {
            metrics
                .store_reconnects
                .get_or_create(&ReasonLabels {
                    reason: reason.label(),
                })
                .inc();
        }
    }
}

/// How one watch stream ended.
#[derive(Debug)]
enum Ended {
    /// As the watch protocol says.
    Watch(WatchError),
    /// Nothing came from `server` for `after`: it, or the way to it, is hung.
    Silent { server: String, after: Duration },
}

impl Ended {
    fn label(&self) -> &'static str {
        match self {
            Ended::Watch(e) => e.label(),
            Ended::Silent { .. } => "silent",
        }
    }
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Watch(WatchError::Unreachable(e)) => f.write_str(&server_problem(e)),
            Ended::Watch(e) => std::fmt::Display::fmt(e, f),
            Ended::Silent { server, after } => write!(
                f,
                "the store at {server} sent nothing for {after:?} (not even a progress \
                 marker): taking the watch as lost and reconnecting"
            ),
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

/// Why the store at `--server` cannot be reached, for status pages and logs.
pub(crate) fn server_problem(e: &ConnectError) -> String {
    match e {
        ConnectError::Address(e) => format!("--server {e}"),
        e => e.to_string(),
    }
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
    /// The subscription of the last stream (with its updates); before the first, the one a
    /// loaded cache was saved with (`None`: unknown, so the first watch relists).
    subscription: Option<Subscription>,
    /// An update was asked for on the last stream (sent or still queued) and its SYNCED has not
    /// come, so the cache may hold only part of its answer.
    updated: bool,
}

impl InForce {
    /// Whether a watch with `next` may resume from the cache's revision (rather than relist):
    /// only when the cache answers exactly `next` in full.
    fn resumable_with(&self, next: &Subscription) -> bool {
        !self.updated && self.subscription.as_ref().is_some_and(|s| s == next)
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
    // A cache loaded from disk answers the subscription saved with it, if any.
    let mut in_force = InForce {
        subscription: cache.answered().cloned(),
        updated: false,
    };
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
            tracing::info!("the cache does not answer the current subscription in full; relisting");
            relist = true;
        }
        let stream = Stream {
            config: &config,
            subscription: &mut subscription,
            in_force: &mut in_force,
            saver: &mut saver,
        };
        attempt += 1;
        let span = tracing::info_span!("store_watch", server = %config.servers.current(), attempt,
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
        config.reconnects(&ended);
        if let Ended::Watch(WatchError::Compacted { .. }) = ended {
            relist = true;
            continue;
        }
        relist = cache.revision() == 0 || cache.snapshot_pending();
        // An unreachable or silent replica: the next attempt goes to the next one, and resumes
        // there from the cache's revision (replicas share one revision sequence).
        let failed = match &ended {
            Ended::Watch(WatchError::Unreachable(ConnectError::Unreachable {
                address, ..
            })) => Some(address.as_str()),
            Ended::Silent { server, .. } => Some(server.as_str()),
            Ended::Watch(_) => None,
        };
        if let Some(address) = failed
            && config.servers.failed(address)
        {
            tracing::info!(unreachable = %address, next = %config.servers.current(), "moving to the next store server");
        }
        let why = ended.to_string();
        tracing::warn!(reason = %why, revision = cache.revision(), "store watch ended; resuming");
        link.send_replace(Link::Degraded(why));
        let wait = backoff.failed();
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            () = tokio::time::sleep(wait) => {}
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
    /// Watches until the stream ends, and says how it did.
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
        let start = WatchStart {
            subscription: current,
            from_revision: if relist { 0 } else { cache.revision() + 1 },
            identity: Some(config.identity.clone()),
        };
        let server = config.servers.current().to_string();
        let silent = || Ended::Silent {
            server: server.clone(),
            after: config.liveness,
        };
        // A hung store may take the connection (its kernel does) and never answer.
        let opening = async {
            let mut client = config
                .servers
                .connect(&server)
                .await
                .map_err(WatchError::Unreachable)?;
            let stream = Watch::open(&mut client, start).await?;
            Ok::<_, WatchError>((client, stream))
        };
        let (_client, mut stream) = match tokio::time::timeout(config.liveness, opening).await {
            Ok(Ok(opened)) => opened,
            Ok(Err(e)) => return Ended::Watch(e),
            Err(_) => return silent(),
        };
        let mut updates_open = true;
        let mut heard = tokio::time::Instant::now();
        let ended = loop {
            let event = tokio::select! {
                event = stream.next() => event,
                () = tokio::time::sleep_until(heard + config.liveness) => break silent(),
                changed = subscription.changed(), if updates_open => {
                    if changed.is_err() {
                        // Nobody changes the subscription any more; keep the current one.
                        updates_open = false;
                        continue;
                    }
                    let next = subscription.borrow_and_update().clone();
                    let rules = next.rules.len();
                    if stream.update(next) {
                        tracing::info!(rules, "updating the watch's subscription");
                    }
                    continue;
                }
                () = saver.due(), if saver.dirty => {
                    saver.save(cache);
                    continue;
                }
            };
            let event = match event {
                Ok(event) => event,
                Err(ended) => break Ended::Watch(ended),
            };
            heard = tokio::time::Instant::now();
            match event {
                WatchEvent::Init => cache.begin_snapshot(),
                WatchEvent::InitApply { revision, objects } => {
                    cache.listed(objects, revision);
                    published.send_replace(Arc::new(cache.clone()));
                }
                WatchEvent::Changes(changes) => {
                    for change in changes {
                        cache.apply(change);
                    }
                    published.send_replace(Arc::new(cache.clone()));
                    if !cache.snapshot_pending() {
                        saver.changed();
                    }
                }
                WatchEvent::InitDone {
                    revision,
                    subscription,
                }
                | WatchEvent::Synced {
                    revision,
                    subscription,
                } => {
                    cache.synced(revision);
                    cache.set_answered(subscription);
                    // Saved before anyone hears it is complete.
                    saver.save(cache);
                    published.send_replace(Arc::new(cache.clone()));
                    link.send_replace(Link::Synced);
                    backoff.reset();
                }
                WatchEvent::Progress { revision } => cache.progress(revision),
            }
        };
        *in_force = InForce {
            subscription: Some(stream.subscription().clone()),
            updated: stream.updating(),
        };
        ended
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
