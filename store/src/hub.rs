//! The store's in-memory state, kept in step with the backend: every object with its index keys,
//! the object index, the registered watchers with their rule index, and the event fan-out.
//!
//! The hub is changed under one short lock, by the writer after each durable commit and by
//! watchers registering or changing their subscription. Events reach each watcher's bounded
//! queue in revision order under that lock, so a subscription change is diffed against exactly
//! the state the watcher has been told about. A watcher whose queue is full is cut off, never
//! buffered without bound. A panic under the lock leaves the hub untrusted: the store rebuilds
//! it from the backend and cuts every watch off with a notice to resume (see `store.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use pasa_proto::Kind;
use pasa_proto::store::v1::{EventType, Resource};
use pasa_runtime::interned::Interned;
use roaring::RoaringBitmap;
use rustc_hash::FxHashMap;
use tokio::sync::{Notify, mpsc};

use crate::index::{ObjectIndex, ObjectKeys, RuleIndex};
use crate::metrics::{CutOffReason, KindLabels, KindValue, Metrics};
use crate::record::{LogRecord, ObjectKey, transition};
use crate::selector::Selector;

/// Events per message of a commit in a watcher's queue, so that a queue of bounded capacity
/// holds at most its capacity times this many events. This bounds the store's memory per
/// watcher; what goes on the wire is bounded separately, by the watch stream's limits per
/// response (`watch.rs`), which merges and splits queued messages to fit them.
pub const MAX_EVENTS_PER_QUEUED_MESSAGE: usize = 256;

/// The order of every list the store returns: kind, namespace, name.
pub fn sort_resources(resources: &mut [Arc<Resource>]) {
    resources.sort_by(|a, b| list_order(a).cmp(&list_order(b)));
}

fn list_order(r: &Resource) -> (&str, &str, &str) {
    (&r.kind, &r.namespace, &r.name)
}

/// One event as queued for a watcher; the resource is shared by every watcher that gets it.
#[derive(Debug, Clone)]
pub struct HubEvent {
    pub r#type: EventType,
    pub revision: u64,
    pub resource: Arc<Resource>,
    /// The resource's encoded size, worked out once for every watcher.
    pub size: usize,
    /// The commit time of the change (nanoseconds since the Unix epoch); 0 in the answer to a
    /// subscription change.
    pub committed: i64,
}

/// What a watcher's queue carries.
#[derive(Debug)]
pub enum HubMsg {
    /// Events of one commit, or the diff of a subscription change.
    Events(Vec<HubEvent>),
    /// Nothing matching happened up to this revision that was not already queued.
    Progress(u64),
    /// The answer to a subscription change is complete: everything matching the new
    /// subscription up to this revision has been queued.
    Synced(u64),
}

/// Shared between the hub and a watcher's stream task: why the hub ended the watch, if it did.
#[derive(Default, Debug)]
pub struct WatcherState {
    cut: Mutex<Option<CutOffReason>>,
    /// When the hub shut the watch down with nothing left in its queue: the hub's revision
    /// then (0 otherwise). A stream that had sent everything it took from the queue has sent
    /// everything matching up to here, so a client resumes after it rather than after its last
    /// event or progress marker (a store restart would otherwise replay up to a progress
    /// interval of the log, or more, to every quiet watcher).
    caught_up: std::sync::atomic::AtomicU64,
    pub notify: Notify,
}

impl WatcherState {
    pub fn cut_reason(&self) -> Option<CutOffReason> {
        *self.cut.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The revision the hub had when it ended this watch with an empty queue; 0 when the queue
    /// still held messages (or the watch was not ended).
    pub fn caught_up(&self) -> u64 {
        self.caught_up.load(std::sync::atomic::Ordering::Acquire)
    }

    fn cut(&self, reason: CutOffReason) {
        *self.cut.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason);
        self.notify.notify_one();
    }
}

/// Names one registration. Slots are reused, so the generation tells a live watcher from an
/// earlier one that had the same slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatcherKey {
    pub id: u32,
    generation: u64,
}

/// What a registered watcher holds.
pub struct WatcherHandle {
    pub key: WatcherKey,
    pub rx: mpsc::Receiver<HubMsg>,
    pub state: Arc<WatcherState>,
    /// The revision the registration happened at: queued events are all above it.
    pub revision: u64,
}

struct Entry {
    resource: Arc<Resource>,
    /// Its encoded size, worked out once as it is stored (every event of it carries it).
    size: usize,
    keys: ObjectKeys,
}

struct Watcher {
    generation: u64,
    /// Shared with every watcher of the same subscription (see [`Hub::intern`]).
    selector: Arc<Selector>,
    rule_ids: Vec<u32>,
    tx: mpsc::Sender<HubMsg>,
    state: Arc<WatcherState>,
}

const NO_OWNER: u32 = u32::MAX;

pub struct Hub {
    revision: u64,
    compact_revision: u64,
    objects: Vec<Option<Entry>>,
    free_objects: Vec<u32>,
    by_key: HashMap<ObjectKey, u32>,
    object_index: ObjectIndex,
    rules: RuleIndex,
    rule_owner: Vec<u32>,
    free_rules: Vec<u32>,
    watchers: Vec<Option<Watcher>>,
    free_watchers: Vec<u32>,
    watcher_count: usize,
    next_generation: u64,
    /// Set by shutdown: later registrations are ended at once.
    closed: bool,
    /// Objects per kind, in `Kind::ALL` order.
    kind_counts: [u64; Kind::ALL.len()],
    /// Every watcher's selector, once per distinct one: the pods of one workload subscribe
    /// alike, and at 100k watchers a copy each is most of the hub's memory.
    selectors: Interned<Selector>,
    metrics: Metrics,
}

fn kind_slot(kind: Kind) -> usize {
    Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0)
}

impl Hub {
    pub fn new(metrics: Metrics) -> Hub {
        Hub {
            revision: 0,
            compact_revision: 0,
            objects: Vec::new(),
            free_objects: Vec::new(),
            by_key: HashMap::new(),
            object_index: ObjectIndex::default(),
            rules: RuleIndex::default(),
            rule_owner: Vec::new(),
            free_rules: Vec::new(),
            watchers: Vec::new(),
            free_watchers: Vec::new(),
            watcher_count: 0,
            next_generation: 0,
            closed: false,
            kind_counts: [0; Kind::ALL.len()],
            selectors: Interned::default(),
            metrics,
        }
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn compact_revision(&self) -> u64 {
        self.compact_revision
    }

    /// Sets the revisions after start-up loading, and publishes the loaded state's gauges.
    pub fn set_revisions(&mut self, revision: u64, compact_revision: u64) {
        self.publish_counts();
        self.revision = revision;
        self.compact_revision = compact_revision;
        self.metrics.revision.set(revision as i64);
        self.metrics.compact_revision.set(compact_revision as i64);
    }

    pub fn set_compact_revision(&mut self, compact_revision: u64) {
        self.compact_revision = compact_revision;
        self.metrics.compact_revision.set(compact_revision as i64);
    }

    pub fn watcher_count(&self) -> usize {
        self.watcher_count
    }

    pub fn object_count(&self) -> u64 {
        self.object_index.len()
    }

    /// Objects per kind.
    pub fn counts(&self) -> Vec<(Kind, u64)> {
        Kind::ALL.into_iter().zip(self.kind_counts).collect()
    }

    /// Brings the per-kind object gauges up to date.
    fn publish_counts(&self) {
        for (kind, count) in self.counts() {
            self.metrics
                .objects
                .get_or_create(&KindLabels {
                    kind: KindValue(kind),
                })
                .set(count as i64);
        }
    }

    pub fn get(&self, key: &ObjectKey) -> Option<Arc<Resource>> {
        let id = self.by_key.get(key)?;
        self.entry(*id).map(|e| Arc::clone(&e.resource))
    }

    fn entry(&self, id: u32) -> Option<&Entry> {
        self.objects.get(id as usize).and_then(Option::as_ref)
    }

    /// Objects the selector matches, ordered by kind, namespace and name.
    pub fn select(&self, selector: &Selector) -> Vec<Arc<Resource>> {
        let ids = self.object_index.select(selector);
        let entries = self.entries(&ids);
        entries.map(|e| Arc::clone(&e.resource)).collect()
    }

    /// [`Hub::select`], each object with its encoded size.
    pub fn select_sized(&self, selector: &Selector) -> Vec<(Arc<Resource>, usize)> {
        let ids = self.object_index.select(selector);
        let entries = self.entries(&ids);
        entries.map(|e| (Arc::clone(&e.resource), e.size)).collect()
    }

    /// The entries of `ids`, ordered by kind, namespace and name.
    fn entries(&self, ids: &RoaringBitmap) -> impl Iterator<Item = &Entry> {
        let mut out: Vec<&Entry> = ids.iter().filter_map(|id| self.entry(id)).collect();
        out.sort_by(|a, b| list_order(&a.resource).cmp(&list_order(&b.resource)));
        out.into_iter()
    }

    /// Adds or replaces an object without telling anyone (start-up load and commits).
    fn put_object(&mut self, resource: Arc<Resource>, size: usize, keys: ObjectKeys) {
        let Some(key) = ObjectKey::of(&resource) else {
            tracing::warn!(kind = %resource.kind, "ignoring a stored object of unknown kind");
            return;
        };
        self.remove_object(&key);
        let id = match self.free_objects.pop() {
            Some(id) => id,
            None => {
                self.objects.push(None);
                (self.objects.len() - 1) as u32
            }
        };
        self.object_index.insert(id, &keys);
        self.kind_counts[kind_slot(keys.kind)] += 1;
        self.objects[id as usize] = Some(Entry {
            resource,
            size,
            keys,
        });
        self.by_key.insert(key, id);
    }

    fn remove_object(&mut self, key: &ObjectKey) {
        let Some(id) = self.by_key.remove(key) else {
            return;
        };
        if let Some(entry) = self.objects[id as usize].take() {
            self.object_index.remove(id, &entry.keys);
            self.kind_counts[kind_slot(entry.keys.kind)] -= 1;
            self.free_objects.push(id);
        }
    }

    /// Loads a stored object at start-up.
    pub fn load(&mut self, resource: Resource) {
        match ObjectKeys::of(&resource) {
            Some(keys) => {
                let size = prost::Message::encoded_len(&resource);
                self.put_object(Arc::new(resource), size, keys)
            }
            None => {
                tracing::warn!(kind = %resource.kind, "ignoring a stored object of unknown kind")
            }
        }
    }

    /// Applies committed log records (in revision order) and queues their events for every
    /// watcher they concern.
    pub fn commit(&mut self, records: Vec<LogRecord>) {
        // Per watcher, its events of this commit (one lookup per event delivered).
        let mut outbox: FxHashMap<u32, Vec<HubEvent>> = FxHashMap::default();
        for record in records {
            let revision = record.revision;
            let committed = record.commit_time_unix_nanos;
            let new_keys = record.after().and_then(ObjectKeys::of);
            let old_keys = record.before().and_then(ObjectKeys::of);
            let Some(resource) = record.resource.map(Arc::new) else {
                continue;
            };
            let size = prost::Message::encoded_len(resource.as_ref());
            let started = Instant::now();
            let now = new_keys
                .as_ref()
                .map(|k| self.subscribers_of(k))
                .unwrap_or_default();
            // Most changes keep their keys (an endpoint moves, a rule's policy changes): then
            // the same watchers had it before, and it is matched once.
            let unmoved = old_keys.is_some() && old_keys == new_keys;
            let before = match &old_keys {
                Some(k) if !unmoved => self.subscribers_of(k),
                _ => RoaringBitmap::new(),
            };
            self.metrics
                .match_duration
                .observe(started.elapsed().as_secs_f64());
            let mut queue = |w: u32, r#type: EventType| {
                outbox.entry(w).or_default().push(HubEvent {
                    r#type,
                    revision,
                    resource: Arc::clone(&resource),
                    size,
                    committed,
                });
            };
            if unmoved {
                now.iter().for_each(|w| queue(w, EventType::Modified));
            } else {
                for w in &now | &before {
                    if let Some(r#type) = transition(now.contains(w), before.contains(w)) {
                        queue(w, r#type);
                    }
                }
            }
            match new_keys {
                Some(keys) => self.put_object(resource, size, keys),
                None => {
                    if let Some(key) = ObjectKey::of(&resource) {
                        self.remove_object(&key);
                    }
                }
            }
            self.revision = self.revision.max(revision);
        }
        self.metrics.revision.set(self.revision as i64);
        self.publish_counts();
        for (w, mut events) in outbox {
            // Bounded messages make the queue bound a bound on events. Commit events have
            // distinct, rising revisions, so a cut-off between two messages resumes exactly.
            while !events.is_empty() {
                let rest = events.split_off(events.len().min(MAX_EVENTS_PER_QUEUED_MESSAGE));
                self.deliver(w, HubMsg::Events(events));
                events = rest;
            }
        }
    }

    /// Watchers whose subscription matches an object with these keys, by the rule index.
    pub fn subscribers_of(&self, keys: &ObjectKeys) -> RoaringBitmap {
        let mut owners: Vec<u32> = self
            .rules
            .matching(keys)
            .iter()
            .filter_map(|rule| self.rule_owner.get(rule as usize).copied())
            .filter(|&owner| owner != NO_OWNER)
            .collect();
        owners.sort_unstable();
        owners.dedup();
        RoaringBitmap::from_sorted_iter(owners).unwrap_or_default()
    }

    /// The same answer as [`Hub::subscribers_of`], by evaluating every subscription.
    pub fn subscribers_of_brute_force(&self, keys: &ObjectKeys) -> RoaringBitmap {
        self.watchers
            .iter()
            .enumerate()
            .filter_map(|(id, w)| {
                w.as_ref()
                    .filter(|w| w.selector.matches(keys))
                    .map(|_| id as u32)
            })
            .collect()
    }

    /// Ids of objects the selector matches, by evaluating every object.
    pub fn select_brute_force(&self, selector: &Selector) -> RoaringBitmap {
        self.objects
            .iter()
            .enumerate()
            .filter_map(|(id, e)| {
                e.as_ref()
                    .filter(|e| selector.matches(&e.keys))
                    .map(|_| id as u32)
            })
            .collect()
    }

    /// Ids of objects the selector matches, by the object index.
    pub fn select_ids(&self, selector: &Selector) -> RoaringBitmap {
        self.object_index.select(selector)
    }

    /// Queues a message for a watcher, cutting it off if its queue is full. Does nothing for a
    /// watcher that is gone.
    fn deliver(&mut self, watcher: u32, msg: HubMsg) {
        let Some(w) = self.watchers.get(watcher as usize).and_then(Option::as_ref) else {
            return;
        };
        match w.tx.try_send(msg) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.metrics.cut_off(CutOffReason::SlowConsumer);
                self.end_slot(watcher, Some(CutOffReason::SlowConsumer));
            }
            Err(mpsc::error::TrySendError::Closed(_)) => self.end_slot(watcher, None),
        }
    }

    fn add_rules(&mut self, watcher: u32, selector: &Selector) -> Vec<u32> {
        let mut ids = Vec::with_capacity(selector.rules.len());
        for rule in &selector.rules {
            let id = match self.free_rules.pop() {
                Some(id) => id,
                None => {
                    self.rule_owner.push(NO_OWNER);
                    (self.rule_owner.len() - 1) as u32
                }
            };
            self.rules.insert(id, rule);
            self.rule_owner[id as usize] = watcher;
            ids.push(id);
        }
        ids
    }

    fn remove_rules(&mut self, selector: &Selector, ids: &[u32]) {
        for (rule, &id) in selector.rules.iter().zip(ids) {
            self.rules.remove(id, rule);
            self.rule_owner[id as usize] = NO_OWNER;
            self.free_rules.push(id);
        }
    }

    /// Registers a watcher with a queue of `capacity` messages. Everything committed after the
    /// returned revision will be queued for it. After shutdown the watcher is ended at once.
    pub fn register(&mut self, selector: Selector, capacity: usize) -> WatcherHandle {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let state = Arc::new(WatcherState::default());
        self.next_generation += 1;
        let generation = self.next_generation;
        let id = match self.free_watchers.pop() {
            Some(id) => id,
            None => {
                self.watchers.push(None);
                (self.watchers.len() - 1) as u32
            }
        };
        let rule_ids = self.add_rules(id, &selector);
        let selector = self.intern(selector);
        self.watchers[id as usize] = Some(Watcher {
            generation,
            selector,
            rule_ids,
            tx,
            state: Arc::clone(&state),
        });
        self.watcher_count += 1;
        self.metrics.subscriptions.set(self.watcher_count as i64);
        if self.closed {
            self.end_slot(id, Some(CutOffReason::Shutdown));
        }
        WatcherHandle {
            key: WatcherKey { id, generation },
            rx,
            state,
            revision: self.revision,
        }
    }

    fn take_watcher(&mut self, key: WatcherKey) -> Option<Watcher> {
        let slot = self.watchers.get_mut(key.id as usize)?;
        if slot.as_ref()?.generation != key.generation {
            return None;
        }
        slot.take()
    }

    /// Changes a watcher's subscription: queues ADDED for objects that now match and DELETED
    /// for objects that no longer do, at the current revision, then a SYNCED marker so the
    /// subscriber knows the answer is complete. Returns false if the watcher is gone (cut off or
    /// unregistered).
    pub fn update_subscription(&mut self, key: WatcherKey, selector: Selector) -> bool {
        let Some(mut w) = self.take_watcher(key) else {
            return false;
        };
        let before = self.object_index.select(&w.selector);
        let now = self.object_index.select(&selector);
        let mut events = Vec::new();
        for (ids, r#type) in [
            (&now - &before, EventType::Added),
            (&before - &now, EventType::Deleted),
        ] {
            for entry in self.entries(&ids) {
                events.push(HubEvent {
                    r#type,
                    revision: self.revision,
                    resource: Arc::clone(&entry.resource),
                    size: entry.size,
                    committed: 0,
                });
            }
        }
        self.remove_rules(&w.selector, &w.rule_ids);
        let rule_ids = self.add_rules(key.id, &selector);
        let selector = self.intern(selector);
        let old = std::mem::replace(&mut w.selector, selector);
        self.forget(old);
        self.watchers[key.id as usize] = Some(Watcher { rule_ids, ..w });
        if !events.is_empty() {
            self.deliver(key.id, HubMsg::Events(events));
        }
        self.deliver(key.id, HubMsg::Synced(self.revision));
        true
    }

    /// Removes a watcher if it is still registered; with a reason, its stream is told why.
    pub fn end(&mut self, key: WatcherKey, reason: Option<CutOffReason>) {
        if let Some(w) = self.take_watcher(key) {
            self.release(key.id, w, reason);
        }
    }

    fn end_slot(&mut self, id: u32, reason: Option<CutOffReason>) {
        if let Some(w) = self.watchers.get_mut(id as usize).and_then(Option::take) {
            self.release(id, w, reason);
        }
    }

    fn release(&mut self, id: u32, w: Watcher, reason: Option<CutOffReason>) {
        self.remove_rules(&w.selector, &w.rule_ids);
        self.free_watchers.push(id);
        self.watcher_count -= 1;
        self.metrics.subscriptions.set(self.watcher_count as i64);
        if let Some(reason) = reason {
            // Only at shutdown, when no commit is half done: a reset follows a commit that
            // failed midway, whose revision is counted but whose events were never queued.
            if reason == CutOffReason::Shutdown && w.tx.capacity() == w.tx.max_capacity() {
                w.state
                    .caught_up
                    .store(self.revision, std::sync::atomic::Ordering::Release);
            }
            w.state.cut(reason);
        }
        self.forget(w.selector);
    }

    /// The shared copy of `selector`: the one another watcher already has, or a new one.
    fn intern(&mut self, selector: Selector) -> Arc<Selector> {
        self.selectors.intern(selector)
    }

    /// A watcher lets go of its selector: the hub's copy goes with the last watcher holding it.
    fn forget(&mut self, selector: Arc<Selector>) {
        self.selectors.release(selector);
    }

    /// Queues a progress marker for every watcher with room for it.
    pub fn progress(&mut self) {
        let revision = self.revision;
        for w in self.watchers.iter().flatten() {
            // A full queue already carries newer news; the marker is not worth a cut-off.
            let _ = w.tx.try_send(HubMsg::Progress(revision));
        }
    }

    /// Ends every watch, telling each stream the store is shutting down; watches registered
    /// later end at once.
    pub fn shutdown(&mut self) {
        self.closed = true;
        self.reset(CutOffReason::Shutdown);
    }

    /// Ends every watch with `reason`, telling each stream.
    pub fn reset(&mut self, reason: CutOffReason) {
        for id in 0..self.watchers.len() as u32 {
            if self.watchers[id as usize].is_some() {
                self.metrics.cut_off(reason);
                self.end_slot(id, Some(reason));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchers_of_one_subscription_share_its_selector_until_the_last_leaves() {
        let mut hub = Hub::new(Metrics::new());
        let a = hub.register(Selector::everything(), 4);
        let b = hub.register(Selector::everything(), 4);
        let c = hub.register(Selector::default(), 4);
        assert_eq!(hub.selectors.len(), 2);
        let shared = |hub: &Hub, k: WatcherKey| {
            Arc::as_ptr(&hub.watchers[k.id as usize].as_ref().unwrap().selector)
        };
        assert_eq!(shared(&hub, a.key), shared(&hub, b.key));
        // Moving to another subscription lets go of the old one only when nobody holds it.
        assert!(hub.update_subscription(c.key, Selector::everything()));
        assert_eq!(hub.selectors.len(), 1);
        hub.end(a.key, None);
        assert_eq!(hub.selectors.len(), 1);
        hub.end(b.key, None);
        hub.end(c.key, None);
        assert!(hub.selectors.is_empty());
        assert_eq!(hub.watcher_count(), 0);
    }

    #[test]
    fn a_subscription_change_is_answered_then_marked_synced() {
        let mut hub = Hub::new(Metrics::new());
        let mut w = hub.register(Selector::default(), 16);
        // Nothing changed in what it selects: the answer is only the marker.
        assert!(hub.update_subscription(w.key, Selector::everything()));
        assert!(matches!(w.rx.try_recv(), Ok(HubMsg::Synced(r)) if r == hub.revision));
        assert!(w.rx.try_recv().is_err(), "one marker per update");
        hub.end(w.key, None);
    }

    #[test]
    fn a_stale_key_cannot_touch_the_next_watcher_of_its_slot() {
        let mut hub = Hub::new(Metrics::new());
        let a = hub.register(Selector::everything(), 1);
        // The hub ends A itself (as on a cut-off); B gets A's slot.
        hub.end_slot(a.key.id, Some(CutOffReason::SlowConsumer));
        let b = hub.register(Selector::everything(), 1);
        assert_eq!(a.key.id, b.key.id);
        assert!(!hub.update_subscription(a.key, Selector::default()));
        hub.end(a.key, None);
        assert_eq!(hub.watcher_count(), 1, "B is still registered");
        assert_eq!(b.state.cut_reason(), None);
        hub.end(b.key, None);
        assert_eq!(hub.watcher_count(), 0);
    }

    /// The log record of Sidecar `ns/s<rev>` created at revision `rev`.
    fn sidecar_added(rev: u64) -> LogRecord {
        LogRecord {
            r#type: EventType::Added as i32,
            revision: rev,
            resource: Some(Resource {
                api_version: "networking.istio.io/v1".into(),
                kind: "Sidecar".into(),
                namespace: "ns".into(),
                name: format!("s{rev}"),
                ..Default::default()
            }),
            prev: None,
            commit_time_unix_nanos: 0,
        }
    }

    #[test]
    fn a_shutdown_says_how_far_a_watcher_with_an_empty_queue_is_caught_up() {
        let mut hub = Hub::new(Metrics::new());
        let busy = hub.register(Selector::everything(), 4);
        let quiet = hub.register(Selector::default(), 4);
        hub.commit(vec![sidecar_added(1), sidecar_added(2)]);
        hub.shutdown();
        assert_eq!(
            busy.state.caught_up(),
            0,
            "its queue still holds revision 1 and 2"
        );
        assert_eq!(quiet.state.caught_up(), 2);
        // A reset follows a failed commit: nobody is taken as caught up.
        let mut hub = Hub::new(Metrics::new());
        let quiet = hub.register(Selector::default(), 4);
        hub.commit(vec![sidecar_added(1)]);
        hub.reset(CutOffReason::Reset);
        assert_eq!(quiet.state.caught_up(), 0);
    }

    #[test]
    fn a_big_commit_is_queued_in_bounded_messages_and_cuts_off_a_small_queue() {
        let mut hub = Hub::new(Metrics::new());
        let mut small = hub.register(Selector::everything(), 2);
        let mut roomy = hub.register(Selector::everything(), 16);
        let records: Vec<LogRecord> = (1..=1000u64).map(sidecar_added).collect();
        hub.commit(records);
        let drain = |h: &mut WatcherHandle| {
            let mut revisions = Vec::new();
            while let Ok(HubMsg::Events(events)) = h.rx.try_recv() {
                assert!(events.len() <= MAX_EVENTS_PER_QUEUED_MESSAGE);
                revisions.extend(events.iter().map(|e| e.revision));
            }
            revisions
        };
        assert_eq!(drain(&mut roomy), (1..=1000).collect::<Vec<_>>());
        assert_eq!(roomy.state.cut_reason(), None);
        // Two messages fit; the rest is left to a resume from revision 513.
        assert_eq!(drain(&mut small), (1..=512).collect::<Vec<_>>());
        assert_eq!(small.state.cut_reason(), Some(CutOffReason::SlowConsumer));
        assert_eq!(hub.watcher_count(), 1);
    }

    #[test]
    fn watchers_registered_after_shutdown_end_at_once() {
        let mut hub = Hub::new(Metrics::new());
        let before = hub.register(Selector::everything(), 1);
        hub.shutdown();
        assert_eq!(before.state.cut_reason(), Some(CutOffReason::Shutdown));
        let after = hub.register(Selector::everything(), 1);
        assert_eq!(after.state.cut_reason(), Some(CutOffReason::Shutdown));
        assert_eq!(hub.watcher_count(), 0);
    }
}
