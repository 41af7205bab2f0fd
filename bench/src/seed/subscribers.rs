//! The seed's subscribers: in-process watch streams, each following the store as an agent
//! does (a snapshot, then live changes; across a store restart, a resume from the revision it
//! was told), and what each of them received.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use pasa_proto::store::v1::{
    SubscriberIdentity, Subscription, WatchCreate, WatchRequest, WatchResponse, watch_response,
};
use pasa_store::Store;
use tokio::sync::{Semaphore, mpsc, watch};

use super::{STREAM_BUFFER, object_id};

/// What one subscriber saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Objects of its initial snapshot.
    pub snapshot: usize,
    /// The size of their specs (JSON), in bytes: most of what the snapshot carries.
    pub snapshot_bytes: usize,
    /// When its snapshot was complete.
    pub synced: Option<Instant>,
    /// Events after the snapshot.
    pub events: Vec<Delivered>,
}

/// One event a subscriber received after its snapshot.
#[derive(Debug)]
pub struct Delivered {
    pub revision: u64,
    /// The object's hashed identity (see `object_id`).
    pub id: u64,
    pub r#type: i32,
    /// When the subscriber read it.
    pub at: Instant,
    /// From the store's commit (the time the event carries) to then, in ms; `None` when the
    /// event carried no commit time.
    pub lag_ms: Option<f32>,
}

/// One subscriber: its subscription, and the reader of its stream.
pub struct Subscriber {
    pub subscription: Arc<Subscription>,
    pub reader: tokio::task::JoinHandle<Seen>,
}

/// What the readers count together, for the scenarios to wait on.
#[derive(Default)]
pub struct Progress {
    /// Subscribers whose snapshot is complete.
    pub synced: AtomicUsize,
    /// Objects received after the snapshots.
    pub events: AtomicUsize,
    /// Readers whose stream ended before they were stopped (other than by a store restart).
    pub broken: AtomicUsize,
    /// Watches ended by a store shutdown, their stream task done.
    pub cut: AtomicUsize,
    /// Watches resumed on the next store, synced.
    pub resumed: AtomicUsize,
}

/// How a subscriber ended one watch stream.
enum Ended {
    /// Told to stop.
    Stopped,
    /// The store shut down: watch the next one from this revision.
    Resume(u64),
    /// Anything else: the subscriber is lost.
    Broken,
}

/// One subscriber, as an agent follows the store: a watch of `subscription` for `node` from
/// revision 0 (its snapshot holding a `connecting` permit until it is complete), then events
/// until `stop`; when the store shuts down, it waits for the next store in `stores` and resumes
/// from the revision it was told (holding a permit again until that watch is synced).
pub fn subscribe(
    mut stores: watch::Receiver<Option<Store>>,
    node: String,
    subscription: Arc<Subscription>,
    (connecting, progress): (Arc<Semaphore>, Arc<Progress>),
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Seen> {
    tokio::spawn(async move {
        let mut seen = Seen::default();
        let mut from = 0;
        loop {
            let store = tokio::select! {
                s = stores.wait_for(Option::is_some) => match s {
                    Ok(s) => s.clone(),
                    Err(_) => break,
                },
                _ = stop.wait_for(|s| *s) => break,
            };
            let Some(store) = store else { break };
            let ended = watch_once(
                store,
                (&node, &subscription, from),
                (&connecting, &progress),
                &mut stop,
                &mut seen,
            )
            .await;
            match ended {
                Ended::Stopped => break,
                Ended::Resume(revision) => {
                    from = revision;
                    progress.cut.fetch_add(1, Ordering::Relaxed);
                    // The next store, not this one again.
                    let _ = stores.wait_for(Option::is_none).await;
                }
                Ended::Broken => {
                    progress.broken.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
        seen
    })
}

/// One watch stream of a subscriber (see [`subscribe`]), until it ends.
async fn watch_once(
    store: Store,
    (node, subscription, from): (&str, &Subscription, u64),
    (connecting, progress): (&Semaphore, &Progress),
    stop: &mut watch::Receiver<bool>,
    seen: &mut Seen,
) -> Ended {
    let Ok(permit) = connecting.acquire().await else {
        return Ended::Broken;
    };
    let (out_tx, mut out) = mpsc::channel(STREAM_BUFFER);
    // Held until the stream ends: the watch ends when its request stream does.
    let (requests_tx, requests) = mpsc::channel::<Result<WatchRequest, tonic::Status>>(1);
    let create = WatchCreate {
        subscription: Some(subscription.clone()),
        from_revision: from,
        identity: Some(SubscriberIdentity {
            node_id: node.to_string(),
            ..Default::default()
        }),
    };
    let serving = tokio::spawn(async move {
        store
            .serve_watch(
                create,
                tokio_stream::wrappers::ReceiverStream::new(requests),
                out_tx,
                pasa_store::access::Access::plaintext(),
                pasa_store::access::Caller::Unverified,
            )
            .await
    });
    let mut permit = Some(permit);
    // One registration with the stop signal for the whole stream, not one per message: all the
    // subscribers share it, and the harness must not cost the store's delivery its cores.
    let stopped = stop.wait_for(|s| *s);
    tokio::pin!(stopped);
    let ended = loop {
        let message = tokio::select! {
            m = out.recv() => m,
            _ = &mut stopped => break Ended::Stopped,
        };
        let Some(Ok(WatchResponse {
            response: Some(response),
        })) = message
        else {
            break Ended::Broken;
        };
        match response {
            watch_response::Response::Events(batch) => {
                let at = Instant::now();
                let now = pasa_store::record::now_unix_nanos();
                let live = seen.events.len();
                for e in batch.events {
                    let Some(r) = e.resource else { continue };
                    if seen.synced.is_none() {
                        seen.snapshot += 1;
                        seen.snapshot_bytes += r.spec_json.len();
                    } else {
                        let lag_ms = (e.commit_time_unix_nanos > 0)
                            .then(|| (now - e.commit_time_unix_nanos).max(0) as f32 / 1e6);
                        seen.events.push(Delivered {
                            revision: e.revision,
                            id: object_id(&r),
                            r#type: e.r#type,
                            at,
                            lag_ms,
                        });
                    }
                }
                // Counted once a message: 100k readers adding one by one to the same counter
                // contend for it, and the store's delivery pays.
                let received = seen.events.len() - live;
                if received > 0 {
                    progress.events.fetch_add(received, Ordering::Relaxed);
                }
            }
            watch_response::Response::Synced(_) if permit.is_some() => {
                permit.take();
                if seen.synced.is_none() {
                    seen.synced = Some(Instant::now());
                    progress.synced.fetch_add(1, Ordering::Relaxed);
                } else {
                    progress.resumed.fetch_add(1, Ordering::Relaxed);
                }
            }
            watch_response::Response::Cancelled(c)
                if c.reason == pasa_proto::store::v1::CancelReason::Shutdown as i32 =>
            {
                break Ended::Resume(c.resume_revision);
            }
            // Any other end (a cut-off): this subscriber is lost.
            watch_response::Response::Cancelled(_) => break Ended::Broken,
            _ => {}
        }
    };
    drop(permit);
    drop(requests_tx);
    drop(out);
    let _ = serving.await;
    ended
}
