//! A typed client for the store's `Watch` stream, in the spirit of kube-runtime's watcher: the
//! wire messages (event batches, SYNCED, PROGRESS, CANCELLED) become [`WatchEvent`]s that say
//! what they mean to a local copy, and the ways a stream ends become one [`WatchError`].
//!
//! A watch from revision 0 starts with a snapshot: [`WatchEvent::Init`], the matching objects in
//! [`WatchEvent::InitApply`] batches, then [`WatchEvent::InitDone`]; a local copy replaces what it
//! held with what the snapshot listed. A resumed watch (from a revision N > 0) starts with the
//! changes since N, then [`WatchEvent::Synced`]. Live changes arrive as [`WatchEvent::Changes`].
//!
//! **Changing the subscription** on an open stream: [`Watch::update`] queues the new one (a newer
//! one queued before it went out replaces it) and [`Watch::next`] sends it as soon as the request
//! stream has room, never blocking reading — the store reads updates only once its snapshot is
//! out. The store answers with changes (ADDED for what now matches, DELETED for what no longer
//! does), then SYNCED; the client pairs each SYNCED with the subscription it answers, so
//! [`WatchEvent::Synced::subscription`] says whose whole answer the local copy now holds.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::transport::Channel;

use crate::store::v1::store_client::StoreClient;
use crate::store::v1::{
    CancelReason, EventType, Resource, SubscriberIdentity, Subscription, WatchCreate, WatchRequest,
    WatchResponse, WatchUpdate, watch_request, watch_response,
};

/// Where a watch starts.
#[derive(Debug, Clone, Default)]
pub struct WatchStart {
    pub subscription: Subscription,
    /// 0: a snapshot, then live changes; N > 0: every change from revision N on (the last
    /// revision seen + 1, with the subscription in force when it was seen).
    pub from_revision: u64,
    /// Who is watching (for `proxy-status` and the store's access rules).
    pub identity: Option<SubscriberIdentity>,
}

/// What a watch stream says, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    /// A snapshot begins (watches from revision 0 only, before anything else): what it does not
    /// list before [`WatchEvent::InitDone`] is gone.
    Init,
    /// Objects of the snapshot, at the revision it is taken at.
    InitApply {
        revision: u64,
        objects: Vec<Resource>,
    },
    /// The snapshot is complete: everything `subscription` selects up to `revision` was listed.
    InitDone {
        revision: u64,
        subscription: Arc<Subscription>,
    },
    /// Changes in revision order: live ones, those replayed after a resume, and the answer to a
    /// subscription update.
    Changes(Vec<Change>),
    /// Everything `subscription` selects up to `revision` has been sent: the replay of a resumed
    /// watch, or the answer to [`Watch::update`], is complete.
    Synced {
        revision: u64,
        subscription: Arc<Subscription>,
    },
    /// Nothing selected changed up to `revision` that has not been sent.
    Progress { revision: u64 },
}

/// One change to one object.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub action: Action,
    /// The revision of the change (for an update's answer, the revision the stream was at).
    pub revision: u64,
    /// The object after the change; for [`Action::Deleted`], its last state.
    pub resource: Resource,
    /// When the store committed the change, by the store's clock; `None` for the answer to a
    /// subscription update (no commit) and from a store that does not say.
    pub committed: Option<SystemTime>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Added,
    Modified,
    Deleted,
}

impl Action {
    /// The name `kubectl get --watch --output-watch-events` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Added => "ADDED",
            Action::Modified => "MODIFIED",
            Action::Deleted => "DELETED",
        }
    }
}

/// The commit time an event carries (nanoseconds since the Unix epoch; 0 when none).
fn commit_time(unix_nanos: i64) -> Option<SystemTime> {
    let nanos = u64::try_from(unix_nanos).ok().filter(|&n| n > 0)?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_nanos(nanos))
}

/// How a watch stream ended (it always ends with one).
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The address is not one, or nothing answered there.
    #[error(transparent)]
    Unreachable(#[from] crate::client::ConnectError),
    /// The store refused the watch before answering anything: a bad subscription, or one the
    /// caller may not make.
    #[error("watch refused: {}", .0.message())]
    Refused(Status),
    /// The store closed the stream, or a request on it could not be sent.
    #[error("the store closed the watch")]
    Closed,
    /// The stream failed after it had started.
    #[error("watch failed: {}", .0.message())]
    Failed(Status),
    /// The store ended the watch: the watcher fell behind (`SLOW_CONSUMER`), the store is
    /// shutting down, or its indexes were rebuilt. Watching again from `resume_revision` loses
    /// nothing.
    #[error("the store ended the watch: {message}")]
    CutOff {
        reason: CancelReason,
        message: String,
        resume_revision: u64,
    },
    /// The revision asked for is no longer in the change log (the oldest kept is
    /// `compact_revision + 1`): watch again from revision 0, with a snapshot.
    #[error("the store no longer has the changes asked for: {message}")]
    Compacted {
        message: String,
        compact_revision: u64,
    },
}

impl WatchError {
    /// A short name for metric labels (`reason="cut_off"`).
    pub fn label(&self) -> &'static str {
        match self {
            WatchError::Unreachable(_) => "unreachable",
            WatchError::Refused(_) => "refused",
            WatchError::Closed => "closed",
            WatchError::Failed(_) => "failed",
            WatchError::CutOff { .. } => "cut_off",
            WatchError::Compacted { .. } => "compacted",
        }
    }
}

/// An open watch stream.
pub struct Watch {
    requests: mpsc::Sender<WatchRequest>,
    responses: tonic::Streaming<WatchResponse>,
    /// The subscriptions sent whose SYNCED has not come yet, oldest first (the one the stream
    /// was opened with, until its SYNCED, then updates).
    awaiting: VecDeque<Arc<Subscription>>,
    /// The first SYNCED (answering the subscription the stream was opened with) has come.
    opened: bool,
    /// The store has answered something: an error before that is a refusal.
    answered: bool,
    /// `latest` is an update not sent yet.
    queued: bool,
    /// The newest subscription, sent or queued.
    latest: Arc<Subscription>,
    snapshot: Snapshot,
}

/// Where a watch from revision 0 is in its snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Snapshot {
    /// [`WatchEvent::Init`] is still to be said.
    Announce,
    /// Objects arriving are the snapshot's.
    Listing,
    /// A resumed watch, or the snapshot is complete.
    None,
}

impl Watch {
    /// Connects to the store at `address` (`host:port` or a URL) and opens a watch.
    pub async fn connect(address: &str, start: WatchStart) -> Result<Watch, WatchError> {
        let mut client = crate::client::connect(address).await?;
        Watch::open(&mut client, start).await
    }

    /// Opens a watch with `client`.
    pub async fn open(
        client: &mut StoreClient<Channel>,
        start: WatchStart,
    ) -> Result<Watch, WatchError> {
        let WatchStart {
            subscription,
            from_revision,
            identity,
        } = start;
        // Room for the create and one update: `next` sends updates only when there is room.
        let (requests, rx) = mpsc::channel(2);
        let create = WatchRequest {
            request: Some(watch_request::Request::Create(WatchCreate {
                subscription: Some(subscription.clone()),
                from_revision,
                identity,
            })),
        };
        requests.try_send(create).map_err(|_| WatchError::Closed)?;
        // The request stream stays open as long as the `Watch`: closing it is how a client
        // says it is gone.
        let responses = client
            .watch(ReceiverStream::new(rx))
            .await
            .map_err(WatchError::Refused)?
            .into_inner();
        let subscription = Arc::new(subscription);
        Ok(Watch {
            requests,
            responses,
            awaiting: VecDeque::from([subscription.clone()]),
            opened: false,
            answered: false,
            queued: false,
            latest: subscription,
            snapshot: if from_revision == 0 {
                Snapshot::Announce
            } else {
                Snapshot::None
            },
        })
    }

    /// Asks for `subscription` from now on (see the module doc); nothing happens, and `false`
    /// says so, if it is the newest already.
    pub fn update(&mut self, subscription: Subscription) -> bool {
        if *self.latest == subscription {
            return false;
        }
        self.latest = Arc::new(subscription);
        self.queued = true;
        true
    }

    /// The newest subscription asked for (sent or not).
    pub fn subscription(&self) -> &Subscription {
        &self.latest
    }

    /// Whether an update is queued or its answer incomplete: what a local copy holds may then
    /// be only part of the answer to [`Watch::subscription`], and a watch that breaks now must
    /// start over with a snapshot rather than resume.
    pub fn updating(&self) -> bool {
        let unanswered_updates = self
            .awaiting
            .len()
            .saturating_sub(usize::from(!self.opened));
        self.queued || unanswered_updates > 0
    }

    /// The next event; an error ends the stream. Cancel-safe: a `next` dropped in a `select!`
    /// loses nothing.
    pub async fn next(&mut self) -> Result<WatchEvent, WatchError> {
        if self.snapshot == Snapshot::Announce {
            self.snapshot = Snapshot::Listing;
            return Ok(WatchEvent::Init);
        }
        loop {
            let message = tokio::select! {
                message = self.responses.message() => message,
                permit = self.requests.reserve(), if self.queued => {
                    let Ok(permit) = permit else {
                        return Err(WatchError::Closed);
                    };
                    self.queued = false;
                    permit.send(WatchRequest {
                        request: Some(watch_request::Request::Update(WatchUpdate {
                            subscription: Some((*self.latest).clone()),
                        })),
                    });
                    self.awaiting.push_back(Arc::clone(&self.latest));
                    continue;
                }
            };
            let response = match message {
                Ok(Some(m)) => m.response,
                Ok(None) => return Err(WatchError::Closed),
                // The store checks the subscription once the call is open, so its refusal
                // comes as the stream's first answer.
                Err(status) if !self.answered => return Err(WatchError::Refused(status)),
                Err(status) => return Err(WatchError::Failed(status)),
            };
            self.answered = true;
            if let Some(event) = self.read(response)? {
                return Ok(event);
            }
        }
    }

    /// What one wire message means; `None` for one that says nothing.
    fn read(
        &mut self,
        response: Option<watch_response::Response>,
    ) -> Result<Option<WatchEvent>, WatchError> {
        Ok(Some(match response {
            Some(watch_response::Response::Events(batch)) if self.snapshot == Snapshot::Listing => {
                let revision = batch.events.iter().map(|e| e.revision).max().unwrap_or(0);
                let objects: Vec<Resource> = batch
                    .events
                    .into_iter()
                    .filter_map(|e| e.resource.map(Arc::unwrap_or_clone))
                    .collect();
                if objects.is_empty() {
                    return Ok(None);
                }
                WatchEvent::InitApply { revision, objects }
            }
            Some(watch_response::Response::Events(batch)) => {
                let changes: Vec<Change> = batch
                    .events
                    .into_iter()
                    .filter_map(|e| {
                        let action = match EventType::try_from(e.r#type) {
                            Ok(EventType::Added) => Action::Added,
                            Ok(EventType::Modified) => Action::Modified,
                            Ok(EventType::Deleted) => Action::Deleted,
                            _ => {
                                tracing::warn!(
                                    r#type = e.r#type,
                                    "store event of an unknown type skipped: the store is newer than this client"
                                );
                                return None;
                            }
                        };
                        Some(Change {
                            action,
                            revision: e.revision,
                            committed: commit_time(e.commit_time_unix_nanos),
                            resource: Arc::unwrap_or_clone(e.resource?),
                        })
                    })
                    .collect();
                if changes.is_empty() {
                    return Ok(None);
                }
                WatchEvent::Changes(changes)
            }
            Some(watch_response::Response::Synced(s)) => {
                // More SYNCEDs than subscriptions sent: the store answers each once, so this is
                // the newest's.
                let subscription = self
                    .awaiting
                    .pop_front()
                    .unwrap_or_else(|| self.latest.clone());
                self.opened = true;
                if self.snapshot == Snapshot::Listing {
                    self.snapshot = Snapshot::None;
                    WatchEvent::InitDone {
                        revision: s.revision,
                        subscription,
                    }
                } else {
                    WatchEvent::Synced {
                        revision: s.revision,
                        subscription,
                    }
                }
            }
            Some(watch_response::Response::Progress(p)) => WatchEvent::Progress {
                revision: p.revision,
            },
            Some(watch_response::Response::Cancelled(c)) => {
                let reason = CancelReason::try_from(c.reason).unwrap_or_default();
                return Err(if reason == CancelReason::Compacted {
                    WatchError::Compacted {
                        message: c.message,
                        compact_revision: c.compact_revision,
                    }
                } else {
                    WatchError::CutOff {
                        reason,
                        message: c.message,
                        resume_revision: c.resume_revision,
                    }
                });
            }
            None => return Ok(None),
        }))
    }
}
