//! The resources the agent serves, and the channel that publishes them to every connection.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::google::protobuf::Any;
use tokio::sync::watch;

use super::TypeKind;

/// One xDS resource: its version (any string that changes when the body changes) and its body.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    /// Changes whenever `body` changes; connections compare versions, never bodies.
    pub version: String,
    /// The resource, packed with its type URL (see `envoy_types::util::pack_any`).
    pub body: Any,
}

/// A resource whose body does not match the type it was added as.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(
        "resource {name:?} was added as {kind} but its body is {actual:?}; pack a {expected} message"
    )]
    WrongType {
        kind: TypeKind,
        name: String,
        expected: &'static str,
        actual: String,
    },
}

/// Everything the agent serves at one moment: per type, resource name → resource.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    types: [BTreeMap<String, Arc<Resource>>; 4],
}

impl Snapshot {
    /// An empty snapshot.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a resource. Its body's type URL must be `kind`'s.
    pub fn insert(
        &mut self,
        kind: TypeKind,
        name: impl Into<String>,
        version: impl Into<String>,
        body: Any,
    ) -> Result<(), SnapshotError> {
        let name = name.into();
        if body.type_url != kind.type_url() {
            return Err(SnapshotError::WrongType {
                kind,
                name,
                expected: kind.type_url(),
                actual: body.type_url,
            });
        }
        let version = version.into();
        self.types[kind.index()].insert(name, Arc::new(Resource { version, body }));
        Ok(())
    }

    /// Removes a resource; returns whether it was there.
    pub fn remove(&mut self, kind: TypeKind, name: &str) -> bool {
        self.types[kind.index()].remove(name).is_some()
    }

    /// The resources of one type, by name.
    pub fn resources(&self, kind: TypeKind) -> &BTreeMap<String, Arc<Resource>> {
        &self.types[kind.index()]
    }
}

/// Publishes snapshots; every connection sees the newest one (intermediate ones may be skipped).
#[derive(Debug)]
pub struct SnapshotPublisher {
    tx: watch::Sender<Arc<Snapshot>>,
}

impl Default for SnapshotPublisher {
    fn default() -> Self {
        Self::new()
    }
}

impl SnapshotPublisher {
    /// A publisher whose first snapshot is empty.
    pub fn new() -> Self {
        Self {
            tx: watch::Sender::new(Arc::new(Snapshot::new())),
        }
    }

    /// Makes `snapshot` the one every connection serves. Publishing an equal snapshot is a no-op.
    pub fn publish(&self, snapshot: Snapshot) {
        self.tx.send_if_modified(|current| {
            if **current == snapshot {
                return false;
            }
            *current = Arc::new(snapshot);
            true
        });
    }

    /// The snapshot being served.
    pub fn current(&self) -> Arc<Snapshot> {
        Arc::clone(&self.tx.borrow())
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_checks_the_type_url() {
        let mut snapshot = Snapshot::new();
        let body = Any {
            type_url: TypeKind::Listener.type_url().to_owned(),
            value: Vec::new(),
        };
        let err = snapshot
            .insert(TypeKind::Cluster, "c", "1", body.clone())
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("envoy.config.listener.v3.Listener")
        );
        snapshot.insert(TypeKind::Listener, "l", "1", body).unwrap();
        assert_eq!(snapshot.resources(TypeKind::Listener).len(), 1);
        assert!(snapshot.remove(TypeKind::Listener, "l"));
    }
}
