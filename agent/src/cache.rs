//! The agent's local copy of the raw resources in its scope, kept current from the store's watch
//! events, and its last good state on disk, so that an agent started while the store is away can
//! serve what it served before.
//!
//! A watch starts with a snapshot (ADDED events, then SYNCED) or, when resuming, with the changes
//! since a revision. After a relist the snapshot replaces the cache: whatever it did not repeat is
//! gone, and reported as removed so translation can drop it.

use std::io::Write;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use imbl::{OrdMap, OrdSet};
use pasa_proto::Kind;
use pasa_proto::store::v1::{ListResponse, Resource, Subscription};
use pasa_proto::watch::{Action, Change as StoreChange};
use prost::Message;

/// Kind, namespace and name of a cached resource.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl Key {
    /// The key of `r`; `None` for a kind this agent does not know (a store newer than the
    /// agent), which the cache then does not keep.
    pub fn of(r: &Resource) -> Option<Key> {
        let Some(kind) = Kind::from_kind_field(&r.kind) else {
            warn_unknown_kind(r);
            return None;
        };
        Some(Key {
            kind,
            namespace: r.namespace.clone(),
            name: r.name.clone(),
        })
    }

    /// `r` with its key, if its kind is known.
    fn keyed(r: Resource) -> Option<(Key, Arc<Resource>)> {
        Some((Key::of(&r)?, Arc::new(r)))
    }
}

/// Says once per kind that resources of a kind this agent does not know are ignored.
fn warn_unknown_kind(r: &Resource) {
    static WARNED: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let first = WARNED
        .lock()
        .map(|mut warned| warned.insert(r.kind.clone()))
        .unwrap_or(false);
    if first {
        tracing::warn!(kind = %r.kind, namespace = %r.namespace, name = %r.name,
            "resources of this kind are ignored: it is unknown to this agent (is the store newer?)");
    }
}

/// What one event did to the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Upserted(Key),
    Removed(Key),
}

impl Change {
    pub fn into_key(self) -> Key {
        match self {
            Change::Upserted(key) | Change::Removed(key) => key,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cannot write the cache file {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the cache file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the cache file {path} is damaged ({source}); delete it to start from the store")]
    Decode {
        path: PathBuf,
        #[source]
        source: prost::DecodeError,
    },
    #[error(
        "the learned hosts file {path} is damaged ({source}); delete it to learn them again \
         from the proxy's requests"
    )]
    Learned {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The file in `--cache-dir` holding the last good snapshot.
pub const CACHE_FILE: &str = "snapshot.pb";
/// Beside it, the subscription the snapshot answers in full: a watch resumes from the saved
/// revision only when it asks for the same (else the store would replay changes, but never send
/// objects that were there before and only now match). Without it the agent relists.
pub const SUBSCRIPTION_FILE: &str = "subscription.pb";

/// Raw resources by key, and the store revision they are current at.
///
/// The map is persistent: a clone (what the follower publishes after every batch, what the
/// translator keeps of the cache it last read) shares every node with the original and costs
/// O(1); [`Cache::changes_since`] walks only the nodes two clones do not share.
#[derive(Debug, Default, Clone)]
pub struct Cache {
    objects: OrdMap<Key, Arc<Resource>>,
    revision: u64,
    /// While a snapshot is arriving: the keys it has repeated so far (persistent too: the
    /// cache is published while a snapshot arrives).
    relisting: Option<OrdSet<Key>>,
    /// The subscription whose whole answer the cache holds (the store said SYNCED for it);
    /// `None` for a cache loaded from disk or built directly.
    answered: Option<Arc<Subscription>>,
    /// Commit times of the latest live changes, by revision (at most [`COMMITS_KEPT`]): what
    /// pushes are timed from (`pasa_agent_propagation_seconds`). Not saved.
    commits: OrdMap<u64, SystemTime>,
}

/// How many changes' commit times the cache keeps: more changes than this folded into one
/// translation time it from the oldest kept.
const COMMITS_KEPT: usize = 256;

impl Cache {
    /// The store revision everything in the cache is current at.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    pub fn get(&self, key: &Key) -> Option<&Arc<Resource>> {
        self.objects.get(key)
    }

    /// A cache holding `resources` at `revision` (for tools and tests that build one directly).
    pub fn from_resources(resources: impl IntoIterator<Item = Resource>, revision: u64) -> Cache {
        Cache {
            objects: resources.into_iter().filter_map(Key::keyed).collect(),
            revision,
            relisting: None,
            answered: None,
            commits: OrdMap::new(),
        }
    }

    /// Every cached resource, in kind, namespace and name order.
    pub fn iter(&self) -> impl Iterator<Item = (&Key, &Arc<Resource>)> {
        self.objects.iter()
    }

    /// What changed from `earlier` (an older clone of this cache) to this one, in key order:
    /// O(changes × log n), not O(n), when the two share most of their map.
    pub fn changes_since<'a>(&'a self, earlier: &'a Cache) -> impl Iterator<Item = Change> + 'a {
        earlier.objects.diff(&self.objects).map(|item| match item {
            imbl::ordmap::DiffItem::Add(key, _) => Change::Upserted(key.clone()),
            imbl::ordmap::DiffItem::Update { new: (key, _), .. } => Change::Upserted(key.clone()),
            imbl::ordmap::DiffItem::Remove(key, _) => Change::Removed(key.clone()),
        })
    }

    /// Every cached resource of a kind, in namespace and name order.
    pub fn of_kind(&self, kind: Kind) -> impl Iterator<Item = &Arc<Resource>> + '_ {
        self.objects
            .iter()
            .filter(move |(k, _)| k.kind == kind)
            .map(|(_, r)| r)
    }

    /// A full snapshot is about to arrive (a fresh watch or a relist after compaction): what it
    /// does not repeat before [`Cache::synced`] is removed then.
    pub fn begin_snapshot(&mut self) {
        self.relisting = Some(OrdSet::new());
    }

    /// Whether a snapshot began and has not been completed by [`Cache::synced`]: a watch that
    /// broke then must start over with a snapshot, not resume.
    pub fn snapshot_pending(&self) -> bool {
        self.relisting.is_some()
    }

    /// The subscription whose whole answer the cache holds, if known.
    pub fn answered(&self) -> Option<&Subscription> {
        self.answered.as_deref()
    }

    /// Whether everything `wanted` selects is in the cache: each of its rules is a rule of the
    /// subscription answered last. (Narrower is fine: what no longer matches is dropped soon.)
    pub fn answers(&self, wanted: &Subscription) -> bool {
        self.answered()
            .is_some_and(|answered| wanted.rules.iter().all(|r| answered.rules.contains(r)))
    }

    /// The store said SYNCED for `subscription`: its whole answer is in the cache.
    pub fn set_answered(&mut self, subscription: Arc<Subscription>) {
        self.answered = Some(subscription);
    }

    /// Objects a snapshot listed at `revision`.
    pub fn listed(&mut self, objects: impl IntoIterator<Item = Resource>, revision: u64) {
        for resource in objects {
            if let Some(key) = Key::of(&resource) {
                self.upsert(key, resource);
            }
        }
        self.revision = self.revision.max(revision);
    }

    /// Stores `resource` (noting it as repeated while a snapshot arrives).
    fn upsert(&mut self, key: Key, resource: Resource) {
        if let Some(seen) = &mut self.relisting {
            seen.insert(key.clone());
        }
        self.objects.insert(key, Arc::new(resource));
    }

    /// Applies one change from the store (`None`: of a kind this agent does not know).
    pub fn apply(&mut self, change: StoreChange) -> Option<Change> {
        self.revision = self.revision.max(change.revision);
        let key = Key::of(&change.resource)?;
        if let Some(committed) = change.committed {
            self.commits.insert(change.revision, committed);
            if self.commits.len() > COMMITS_KEPT
                && let Some(&(oldest, _)) = self.commits.get_min()
            {
                self.commits.remove(&oldest);
            }
        }
        Some(match change.action {
            Action::Added | Action::Modified => {
                self.upsert(key.clone(), change.resource);
                Change::Upserted(key)
            }
            Action::Deleted => {
                self.objects.remove(&key);
                Change::Removed(key)
            }
        })
    }

    /// When the store committed the first change after `revision` that the cache holds (see
    /// [`Change::committed`](StoreChange::committed)); `None` when none carried a commit time.
    pub fn first_commit_after(&self, revision: u64) -> Option<SystemTime> {
        self.commits
            .range((Bound::Excluded(revision), Bound::Unbounded))
            .next()
            .map(|(_, &committed)| committed)
    }

    /// The stream is complete up to `revision`. Ends a snapshot: what it did not repeat is
    /// removed and returned.
    pub fn synced(&mut self, revision: u64) -> Vec<Change> {
        self.revision = self.revision.max(revision);
        let Some(seen) = self.relisting.take() else {
            return Vec::new();
        };
        let gone: Vec<Key> = self
            .objects
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in &gone {
            self.objects.remove(key);
        }
        gone.into_iter().map(Change::Removed).collect()
    }

    /// Nothing matching changed up to `revision`.
    pub fn progress(&mut self, revision: u64) {
        self.revision = self.revision.max(revision);
    }

    /// Writes the cache to `dir` atomically (a crash leaves the previous file or the new one).
    pub fn save(&self, dir: &Path) -> Result<(), CacheError> {
        let path = dir.join(CACHE_FILE);
        let tmp = dir.join(format!("{CACHE_FILE}.tmp"));
        let write_err = |source| CacheError::Write {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(write_err)?;
        // The subscription goes first and comes back last: a snapshot never sits beside a
        // subscription it does not answer, even if the agent stops half-way.
        let subscription = dir.join(SUBSCRIPTION_FILE);
        match std::fs::remove_file(&subscription) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(CacheError::Write {
                    path: subscription,
                    source: e,
                });
            }
            _ => {}
        }
        write_atomically(&path, &tmp, |file| self.encode_snapshot(file))?;
        if let Some(answered) = &self.answered {
            let tmp = dir.join(format!("{SUBSCRIPTION_FILE}.tmp"));
            write_atomically(&subscription, &tmp, |file| {
                file.write_all(&answered.encode_to_vec())
            })?;
        }
        Ok(())
    }

    /// Writes the cache as a `ListResponse` one resource at a time, so a save never holds a
    /// second copy of the whole cache (the scope's endpoints are most of it): the resources'
    /// field (1) once per resource, then the revision (2), as prost would encode the message.
    fn encode_snapshot(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut buf = Vec::new();
        for resource in self.objects.values() {
            buf.clear();
            prost::encoding::message::encode(1, &**resource, &mut buf);
            out.write_all(&buf)?;
        }
        buf.clear();
        if self.revision != 0 {
            prost::encoding::uint64::encode(2, &self.revision, &mut buf);
        }
        out.write_all(&buf)
    }

    /// Reads the cache saved in `dir`; `None` when there is none.
    pub fn load(dir: &Path) -> Result<Option<Cache>, CacheError> {
        let path = dir.join(CACHE_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(CacheError::Read { path, source }),
        };
        let snapshot = ListResponse::decode(bytes.as_slice())
            .map_err(|source| CacheError::Decode { path, source })?;
        // A missing or unreadable subscription only costs a relist.
        let answered = std::fs::read(dir.join(SUBSCRIPTION_FILE))
            .ok()
            .and_then(|bytes| Subscription::decode(bytes.as_slice()).ok())
            .map(Arc::new);
        Ok(Some(Cache {
            objects: snapshot
                .resources
                .into_iter()
                .filter_map(Key::keyed)
                .collect(),
            revision: snapshot.revision,
            relisting: None,
            answered,
            commits: OrdMap::new(),
        }))
    }
}

/// Writes `bytes` to `path` through `tmp`, synced, so a reader finds the old file or the new.
pub(crate) fn write_atomically(
    path: &Path,
    tmp: &Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> Result<(), CacheError> {
    let write_err = |source| CacheError::Write {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::create(tmp).map_err(write_err)?;
    let mut out = std::io::BufWriter::new(file);
    write(&mut out)
        .and_then(|()| out.into_inner().map_err(|e| e.into_error()))
        .and_then(|file| file.sync_all())
        .map_err(write_err)?;
    std::fs::rename(tmp, path).map_err(write_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(kind: &str, name: &str, spec: &str) -> Resource {
        Resource {
            kind: kind.into(),
            namespace: "default".into(),
            name: name.into(),
            spec_json: spec.into(),
            ..Default::default()
        }
    }

    fn change(action: Action, revision: u64, resource: Resource) -> StoreChange {
        StoreChange {
            action,
            revision,
            resource,
            committed: None,
        }
    }

    #[test]
    fn the_first_commit_after_a_revision_is_kept_for_the_latest_changes() {
        let mut c = Cache::default();
        let at = |s: u64| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(s);
        for rev in 1..=(COMMITS_KEPT as u64 + 10) {
            c.apply(StoreChange {
                committed: Some(at(1000 + rev)),
                ..change(Action::Added, rev, resource("Sidecar", "s", "{}"))
            });
        }
        // An answer to a subscription change carries no commit time.
        c.apply(change(Action::Added, 300, resource("Sidecar", "t", "{}")));
        assert_eq!(c.first_commit_after(250), Some(at(1251)));
        assert_eq!(
            c.first_commit_after(266),
            None,
            "nothing committed after it"
        );
        // The oldest beyond the bound are dropped: the oldest kept stands in for them.
        assert_eq!(c.first_commit_after(0), Some(at(1011)));
    }

    #[test]
    fn events_add_change_and_remove() {
        let mut c = Cache::default();
        let vs = resource("VirtualService", "a", "{}");
        let key = Key::of(&vs).unwrap();
        assert_eq!(
            c.apply(change(Action::Added, 3, vs.clone())),
            Some(Change::Upserted(key.clone()))
        );
        c.apply(change(
            Action::Modified,
            5,
            resource("VirtualService", "a", "{\"x\":1}"),
        ));
        assert_eq!(c.get(&key).unwrap().spec_json, "{\"x\":1}");
        assert_eq!(c.revision(), 5);
        assert_eq!(
            c.apply(change(Action::Deleted, 6, vs.clone())),
            Some(Change::Removed(key))
        );
        assert!(c.is_empty());
        // A kind this agent does not know is not kept; its revision still counts.
        assert_eq!(
            c.apply(change(Action::Added, 7, resource("HTTPRoute", "a", "{}"))),
            None
        );
        assert!(c.is_empty());
        assert_eq!(c.revision(), 7);
    }

    #[test]
    fn a_relist_drops_what_it_does_not_repeat() {
        let mut c = Cache::default();
        for name in ["a", "b"] {
            c.apply(change(
                Action::Added,
                1,
                resource("DestinationRule", name, "{}"),
            ));
        }
        c.synced(2);
        c.begin_snapshot();
        c.listed([resource("DestinationRule", "b", "{}")], 9);
        let removed = c.synced(9);
        assert_eq!(
            removed,
            [Change::Removed(
                Key::of(&resource("DestinationRule", "a", "")).unwrap()
            )]
        );
        assert_eq!(c.of_kind(Kind::DestinationRule).count(), 1);
        assert!(c.synced(10).is_empty(), "only a snapshot removes");
    }

    #[test]
    fn saved_and_loaded_back() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Cache::load(dir.path()).unwrap().is_none());
        let mut c = Cache::default();
        c.apply(change(
            Action::Added,
            4,
            resource("Gateway", "gw", "{\"servers\":[]}"),
        ));
        c.progress(8);
        c.save(dir.path()).unwrap();
        assert!(!dir.path().join("snapshot.pb.tmp").exists());
        let back = Cache::load(dir.path()).unwrap().unwrap();
        assert_eq!(back.revision(), 8);
        assert_eq!(back.len(), 1);
        assert_eq!(
            back.get(&Key::of(&resource("Gateway", "gw", "")).unwrap())
                .unwrap()
                .spec_json,
            "{\"servers\":[]}"
        );

        // Saved with the subscription it answers, which comes back with it; a save without
        // one leaves none behind.
        assert!(back.answered().is_none());
        let subscription = Subscription {
            rules: vec![pasa_proto::store::v1::Rule {
                kinds: vec!["Gateway".into()],
                ..Default::default()
            }],
        };
        c.set_answered(Arc::new(subscription.clone()));
        c.save(dir.path()).unwrap();
        let back = Cache::load(dir.path()).unwrap().unwrap();
        assert_eq!(back.answered(), Some(&subscription));
        Cache::default().save(dir.path()).unwrap();
        assert!(!dir.path().join(SUBSCRIPTION_FILE).exists());
        assert!(
            Cache::load(dir.path())
                .unwrap()
                .unwrap()
                .answered()
                .is_none()
        );

        std::fs::write(dir.path().join(CACHE_FILE), b"\xff\xff\xff").unwrap();
        let e = Cache::load(dir.path()).unwrap_err();
        assert!(e.to_string().contains("delete it"), "{e}");
    }

    #[test]
    fn a_save_is_the_list_response_prost_would_encode() {
        let mut c = Cache::default();
        for (revision, name) in [(3, "b"), (5, "a")] {
            c.apply(change(
                Action::Added,
                revision,
                resource("Gateway", name, "{\"servers\":[]}"),
            ));
        }
        c.progress(9);
        let mut streamed = Vec::new();
        c.encode_snapshot(&mut streamed).unwrap();
        let whole = ListResponse {
            resources: c.objects.values().map(|r| (**r).clone()).collect(),
            revision: 9,
        };
        assert_eq!(streamed, whole.encode_to_vec());
        let mut empty = Vec::new();
        Cache::default().encode_snapshot(&mut empty).unwrap();
        assert_eq!(empty, ListResponse::default().encode_to_vec());
    }
}
