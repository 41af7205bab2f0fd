//! One watch stream: validate and authorise, register with the hub, send the snapshot (or replay
//! the change log from the requested revision), `SYNCED`, then live events, progress markers and
//! subscription changes until the client leaves or the hub cuts the stream off.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use pasa_proto::store::v1::{
    CancelReason, Cancelled, Event, EventBatch, EventType, Progress, Resource, Synced, WatchCreate,
    WatchRequest, WatchResponse, watch_request, watch_response,
};
use prost::Message;
use tokio::sync::futures::Notified;
use tokio::sync::mpsc;
use tonic::Status;
use tracing::Instrument;

use crate::access::{Access, Caller};
use crate::hub::{HubEvent, HubMsg, WatcherHandle, WatcherState};
use crate::index::ObjectKeys;
use crate::metrics::CutOffReason;
use crate::record::{LogRecord, transition};
use crate::selector::Selector;
use crate::store::{Store, StoreError};

/// A stored object with its encoded size, as the hub keeps it.
type SizedResource = (Arc<Resource>, usize);

/// How a registered watch begins: what it selects, its initial state (a snapshot, or the change
/// log from `from`), the compaction point it was registered at, and who is watching.
struct WatchStart {
    /// For a replay of the change log (a watch resuming from a revision): what it selects. A
    /// watch that starts with a snapshot keeps no copy (the hub has its own).
    replay: Option<Selector>,
    snapshot: Option<Vec<SizedResource>>,
    from: u64,
    compact: u64,
    identity: Option<pasa_proto::store::v1::SubscriberIdentity>,
    /// Who watches, and the rules subscription updates are checked against.
    access: Access,
    caller: Caller,
}

/// Events per watch response sent to a subscriber, and a soft byte budget per response (gRPC's
/// default limit is 4 MiB; an object larger than the budget goes alone). A client's decode buffer
/// keeps the capacity of the largest message it was sent, for as long as its watch lives, and
/// every agent has one: at 1 MiB that was about 2 MiB of each agent's memory. These bound the
/// wire, not the hub's queue (see [`crate::hub::MAX_EVENTS_PER_QUEUED_MESSAGE`]): a stream that
/// fell behind merges queued messages up to this many events, and splits what exceeds a limit.
const MAX_EVENTS_PER_RESPONSE: usize = 500;
const MAX_BYTES_PER_RESPONSE: usize = 256 << 10;
/// Change-log records read per step of a replay.
const REPLAY_PAGE: u64 = 1024;

type Out = mpsc::Sender<Result<WatchResponse, Status>>;

/// The event a subscriber of `selector` sees for a log record, if any: a change into the
/// selection is ADDED, out of it DELETED.
pub(crate) fn event_for(selector: &Selector, rec: &LogRecord) -> Option<EventType> {
    let matches = |r: &Resource| ObjectKeys::of(r).is_some_and(|k| selector.matches(&k));
    transition(
        rec.after().is_some_and(matches),
        rec.before().is_some_and(matches),
    )
}

fn selector_of(sub: Option<&pasa_proto::store::v1::Subscription>) -> Result<Selector, Status> {
    let sub = sub.ok_or_else(|| Status::invalid_argument("subscription: required"))?;
    Selector::from_pb(sub).map_err(|e| Status::invalid_argument(format!("subscription.{e}")))
}

fn cancelled(reason: CancelReason, message: String, resume: u64, compact: u64) -> WatchResponse {
    WatchResponse {
        response: Some(watch_response::Response::Cancelled(Cancelled {
            reason: reason as i32,
            message,
            resume_revision: resume,
            compact_revision: compact,
        })),
    }
}

/// Counts a watch stream while its task lives (however it ends).
struct StreamCount(prometheus_client::metrics::gauge::Gauge);

impl StreamCount {
    fn new(gauge: &prometheus_client::metrics::gauge::Gauge) -> StreamCount {
        gauge.inc();
        StreamCount(gauge.clone())
    }
}

impl Drop for StreamCount {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// How a send ended.
#[derive(Debug, PartialEq, Eq)]
enum Sent {
    Ok,
    /// The client is gone.
    Gone,
    /// The hub cut the watcher off while the send waited for a client that does not read: the
    /// message is abandoned (the resume revision covers it).
    CutOff,
}

/// The hub's cut-off signal as a live stream waits on it: one registration with the watcher's
/// `Notify` for the stream's life, renewed only when it fires. (A fresh `notified()` for every
/// message costs two locks of the `Notify` per message, and messages are what the store sends
/// most of.)
struct CutSignal<'a> {
    state: &'a WatcherState,
    notified: Pin<Box<Notified<'a>>>,
}

impl<'a> CutSignal<'a> {
    fn new(state: &'a WatcherState) -> CutSignal<'a> {
        CutSignal {
            state,
            notified: Box::pin(state.notify.notified()),
        }
    }

    /// Resolves once the hub has cut the watcher off. Cancel-safe: dropping the future keeps
    /// the registration.
    async fn cut_off(&mut self) {
        loop {
            self.notified.as_mut().await;
            self.notified.set(self.state.notify.notified());
            if self.state.cut_reason().is_some() {
                return;
            }
        }
    }
}

/// Sends `msg`. On the live stream (`cut` given) it gives way when the hub cuts the watcher off:
/// a client that stopped reading must not park the stream's task (and what it holds) until it
/// disconnects. The initial snapshot or replay waits on the client.
async fn send(out: &Out, msg: WatchResponse, cut: Option<&mut CutSignal<'_>>) -> Sent {
    let outcome = |sent: Result<(), _>| if sent.is_ok() { Sent::Ok } else { Sent::Gone };
    let Some(cut) = cut else {
        return outcome(out.send(Ok(msg)).await);
    };
    // Most messages find room at once.
    let msg = match out.try_send(Ok(msg)) {
        Ok(()) => return Sent::Ok,
        Err(mpsc::error::TrySendError::Closed(_)) => return Sent::Gone,
        Err(mpsc::error::TrySendError::Full(msg)) => msg,
    };
    tokio::select! {
        sent = out.send(msg) => outcome(sent),
        _ = cut.cut_off() => Sent::CutOff,
    }
}

/// Sends events (in revision order) in messages of bounded size (see [`send`] for `cut`); each
/// event comes with the encoded size of its resource. Returns how it went and the highest
/// revision whose events were all sent (0 if none was), which is where a watch cut off midway
/// resumes after.
async fn send_events(
    out: &Out,
    events: impl IntoIterator<Item = (Event, usize)>,
    store: &Store,
    mut cut: Option<&mut CutSignal<'_>>,
) -> (Sent, u64) {
    let mut events = events.into_iter().peekable();
    let (mut batch, mut bytes, mut through) = (Vec::new(), 0, 0);
    while let Some((ev, size)) = events.next() {
        let revision = ev.revision;
        bytes += size;
        batch.push(ev);
        let next = events.peek().map(|(next, _)| next.revision);
        if next.is_some() && batch.len() < MAX_EVENTS_PER_RESPONSE && bytes < MAX_BYTES_PER_RESPONSE
        {
            continue;
        }
        let sent = flush(out, std::mem::take(&mut batch), store, cut.as_deref_mut()).await;
        if sent != Sent::Ok {
            return (sent, through);
        }
        // One revision's events may straddle two messages.
        let complete = if next == Some(revision) {
            revision.saturating_sub(1)
        } else {
            revision
        };
        through = through.max(complete);
        bytes = 0;
    }
    (Sent::Ok, through)
}

/// Sends one message of the watcher's queue. Returns how it went and the revision the stream
/// has sent everything up to (see [`send_events`]), 0 when that did not move.
async fn send_queued(
    out: &Out,
    msg: HubMsg,
    store: &Store,
    cut: &mut CutSignal<'_>,
) -> (Sent, u64) {
    let (response, revision) = match msg {
        HubMsg::Events(events) => {
            let events = events.into_iter().map(to_event);
            return send_events(out, events, store, Some(cut)).await;
        }
        HubMsg::Progress(revision) => (
            watch_response::Response::Progress(Progress { revision }),
            revision,
        ),
        HubMsg::Synced(revision) => (
            watch_response::Response::Synced(Synced { revision }),
            revision,
        ),
    };
    let msg = WatchResponse {
        response: Some(response),
    };
    match send(out, msg, Some(cut)).await {
        Sent::Ok => (Sent::Ok, revision),
        other => (other, 0),
    }
}

async fn flush(
    out: &Out,
    events: Vec<Event>,
    store: &Store,
    cut: Option<&mut CutSignal<'_>>,
) -> Sent {
    let n = events.len() as u64;
    let msg = WatchResponse {
        response: Some(watch_response::Response::Events(EventBatch { events })),
    };
    let sent = send(out, msg, cut).await;
    if sent == Sent::Ok {
        store.metrics().events_sent.inc_by(n);
    }
    sent
}

/// An event as sent. The resource is shared (with the hub, and with every other watcher a
/// change concerns), not copied.
fn event(r#type: EventType, revision: u64, resource: Arc<Resource>, committed: i64) -> Event {
    Event {
        r#type: r#type as i32,
        revision,
        resource: Some(resource),
        commit_time_unix_nanos: committed,
    }
}

/// A queued event as sent, with its resource's encoded size.
fn to_event(e: HubEvent) -> (Event, usize) {
    (event(e.r#type, e.revision, e.resource, e.committed), e.size)
}

impl Store {
    /// Ends a watch that asked for a revision the change log no longer has.
    async fn send_compacted(&self, out: Out, from: u64, compact_revision: u64) {
        self.metrics().cut_off(CutOffReason::Compacted);
        let err = StoreError::Compacted {
            requested: from,
            compact_revision,
        };
        let notice = cancelled(
            CancelReason::Compacted,
            err.to_string(),
            0,
            compact_revision,
        );
        let _ = out.send(Ok(notice)).await;
    }

    /// Ends a watch the hub cut off: frees what is still queued (the resume revision covers it)
    /// and tells the client where to resume, waiting a bounded time for a client that does not
    /// read.
    async fn end_cut_off(&self, handle: &mut WatcherHandle, out: &Out, sent_through: u64) {
        let Some(reason) = handle.state.cut_reason() else {
            return;
        };
        let (reason, text) = match reason {
            CutOffReason::SlowConsumer => (
                CancelReason::SlowConsumer,
                format!(
                    "the watcher fell more than {} messages behind; resume from revision {}",
                    self.config().watch_queue,
                    sent_through + 1
                ),
            ),
            CutOffReason::Shutdown => (
                CancelReason::Shutdown,
                "the store is shutting down".to_string(),
            ),
            CutOffReason::Compacted => (CancelReason::Compacted, String::new()),
            // To the client, as a restart of the store: resume, on the rebuilt state.
            CutOffReason::Reset => (
                CancelReason::Shutdown,
                format!(
                    "the store rebuilt its watch state after an internal error; resume from \
                     revision {}",
                    sent_through + 1
                ),
            ),
        };
        tracing::info!(watcher = handle.key.id, ?reason, "watch cut off");
        drop(std::mem::replace(&mut handle.rx, mpsc::channel(1).1));
        let notice = cancelled(reason, text, sent_through + 1, 0);
        let _ = tokio::time::timeout(self.config().watch_notice_wait, out.send(Ok(notice))).await;
    }

    /// Serves one watch stream: `create` is its first request, `requests` the rest.
    pub async fn serve_watch(
        &self,
        create: WatchCreate,
        requests: impl Stream<Item = Result<WatchRequest, Status>> + Unpin,
        out: Out,
        access: Access,
        caller: Caller,
    ) {
        let WatchCreate {
            subscription,
            from_revision: from,
            identity,
        } = create;
        // Only the selector is kept: the subscription as sent is dropped now, not when the
        // stream ends (100k streams each holding theirs add up).
        let selector = match selector_of(subscription.as_ref()).and_then(|sel| {
            access.watch(&caller, identity.as_ref(), &sel)?;
            Ok(sel)
        }) {
            Ok(sel) => sel,
            Err(status) => {
                let _ = out.send(Err(status)).await;
                return;
            }
        };
        drop(subscription);
        let node = identity
            .as_ref()
            .map(|i| i.node_id.clone())
            .unwrap_or_default();
        let span = tracing::info_span!("watch", node = %node, from = from);
        enum Start {
            Future(u64),
            Compacted(u64),
            Ready(
                WatcherHandle,
                (Option<Vec<SizedResource>>, Option<Selector>),
                u64,
            ),
        }
        let start = {
            let mut hub = self.hub();
            let (head, compact) = (hub.revision(), hub.compact_revision());
            if from > head + 1 {
                Start::Future(head)
            } else if from != 0 && from <= compact {
                Start::Compacted(compact)
            } else {
                let snapshot = (from == 0).then(|| hub.select_sized(&selector));
                let replay = snapshot.is_none().then(|| selector.clone());
                let handle = hub.register(selector, self.config().watch_queue);
                Start::Ready(handle, (snapshot, replay), compact)
            }
        };
        let (handle, (snapshot, replay), compact) = match start {
            Start::Ready(handle, initial, compact) => (handle, initial, compact),
            Start::Future(current) => {
                let err = StoreError::FutureRevision {
                    requested: from,
                    current,
                };
                let _ = out.send(Err(Status::out_of_range(err.to_string()))).await;
                return;
            }
            Start::Compacted(compact_revision) => {
                self.send_compacted(out.clone(), from, compact_revision)
                    .await;
                return;
            }
        };
        let key = handle.key;
        tracing::debug!(
            watcher = key.id,
            revision = handle.revision,
            "watch registered"
        );
        let _counted = StreamCount::new(&self.metrics().watch_streams);
        let start = WatchStart {
            replay,
            snapshot,
            from,
            compact,
            identity,
            access,
            caller,
        };
        self.run_watch(handle, start, requests, &out)
            .instrument(span)
            .await;
        self.hub().end(key, None);
    }

    async fn run_watch(
        &self,
        mut handle: WatcherHandle,
        start: WatchStart,
        mut requests: impl Stream<Item = Result<WatchRequest, Status>> + Unpin,
        out: &Out,
    ) {
        let WatchStart {
            replay,
            snapshot,
            from,
            compact,
            identity,
            access,
            caller,
        } = start;
        let head = handle.revision;
        // Initial state: a snapshot at `head`, or the log from `from` to `head`.
        match (snapshot, replay) {
            (Some(objects), _) => {
                let events = objects
                    .into_iter()
                    .map(|(r, size)| (event(EventType::Added, head, r, 0), size));
                if send_events(out, events, self, None).await.0 != Sent::Ok {
                    return;
                }
            }
            // The change log from `from` to `head`, a page at a time so memory stays bounded.
            (None, Some(selector)) => {
                let mut next = from;
                while next <= head {
                    let to = head.min(next + REPLAY_PAGE - 1);
                    let records = match self.read_log(next, to).await {
                        Ok(records) => records,
                        Err(StoreError::Compacted {
                            compact_revision, ..
                        }) => {
                            let compact_revision = compact_revision.max(compact);
                            self.send_compacted(out.clone(), from, compact_revision)
                                .await;
                            return;
                        }
                        Err(e) => {
                            let _ = out.send(Err(Status::internal(e.to_string()))).await;
                            return;
                        }
                    };
                    let events = records.into_iter().filter_map(|rec| {
                        let t = event_for(&selector, &rec)?;
                        let resource = rec.resource?;
                        let size = resource.encoded_len();
                        let event = event(
                            t,
                            rec.revision,
                            Arc::new(resource),
                            rec.commit_time_unix_nanos,
                        );
                        Some((event, size))
                    });
                    if send_events(out, events, self, None).await.0 != Sent::Ok {
                        return;
                    }
                    next = to + 1;
                }
            }
            // A watch from revision 0 always has its snapshot.
            (None, None) => {}
        }
        let synced = WatchResponse {
            response: Some(watch_response::Response::Synced(Synced { revision: head })),
        };
        if out.send(Ok(synced)).await.is_err() {
            return;
        }
        let mut sent_through = head;
        let mut requests_open = true;
        let state = Arc::clone(&handle.state);
        let mut cut = CutSignal::new(&state);
        let closed = out.closed();
        tokio::pin!(closed);
        loop {
            tokio::select! {
                biased;
                _ = cut.cut_off() => {
                    // Between messages: everything taken from the queue was sent, so if the
                    // queue was empty when the hub cut, everything up to its revision was.
                    let through = sent_through.max(handle.state.caught_up());
                    self.end_cut_off(&mut handle, out, through).await;
                    return;
                }
                msg = handle.rx.recv() => {
                    let Some(mut msg) = msg else {
                        // The hub dropped the queue: the cut-off notice is pending, if there is one.
                        if handle.state.cut_reason().is_some() {
                            continue;
                        }
                        return;
                    };
                    loop {
                        // What is queued behind these events goes out with them: the hub
                        // queues a message per commit, and a stream that fell behind catches
                        // up in fewer, fuller messages.
                        let mut held = None;
                        if let HubMsg::Events(events) = &mut msg {
                            while events.len() < MAX_EVENTS_PER_RESPONSE {
                                match handle.rx.try_recv() {
                                    Ok(HubMsg::Events(more)) => events.extend(more),
                                    Ok(other) => {
                                        held = Some(other);
                                        break;
                                    }
                                    Err(_) => break,
                                }
                            }
                        }
                        let (sent, through) = send_queued(out, msg, self, &mut cut).await;
                        sent_through = sent_through.max(through);
                        match sent {
                            Sent::Ok => {}
                            Sent::Gone => return,
                            Sent::CutOff => {
                                self.end_cut_off(&mut handle, out, sent_through).await;
                                return;
                            }
                        }
                        match held {
                            Some(next) => msg = next,
                            None => break,
                        }
                    }
                }
                _ = &mut closed => return,
                req = requests.next(), if requests_open => match req {
                    Some(Ok(WatchRequest { request: Some(watch_request::Request::Update(update)) })) => {
                        let checked = selector_of(update.subscription.as_ref()).and_then(|sel| {
                            access.watch(&caller, identity.as_ref(), &sel)?;
                            Ok(sel)
                        });
                        match checked {
                            Ok(sel) => {
                                if !self.hub().update_subscription(handle.key, sel) {
                                    // Cut off meanwhile; the notice is pending.
                                    continue;
                                }
                            }
                            Err(status) => {
                                let _ = out.send(Err(status)).await;
                                return;
                            }
                        }
                    }
                    Some(Ok(_)) => {
                        let _ = out
                            .send(Err(Status::invalid_argument(
                                "request: a watch stream takes one create, then only updates",
                            )))
                            .await;
                        return;
                    }
                    Some(Err(_)) => return,
                    // The client sends no more updates; the watch goes on.
                    None => requests_open = false,
                },
            }
        }
    }
}
