//! Per-connection, per-type sync state, shared with the admin endpoint.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;

use super::TypeKind;
use crate::model::proxy::Generator;

/// Whether a client holds what was sent to it, as `istioctl proxy-status` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncState {
    /// The client ACKed the last response of this type.
    Synced,
    /// A response was sent and not ACKed yet, or it was NACKed.
    Stale,
    /// Nothing of this type was sent (the client did not ask for it).
    NotSent,
}

impl fmt::Display for SyncState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SyncState::Synced => "SYNCED",
            SyncState::Stale => "STALE",
            SyncState::NotSent => "NOT SENT",
        })
    }
}

/// Which ADS protocol a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `StreamAggregatedResources`, state of the world.
    Sotw,
    /// `DeltaAggregatedResources`, incremental.
    Delta,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Sotw => "SotW",
            Protocol::Delta => "Delta",
        })
    }
}

/// A response the client rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nack {
    /// The version that was rejected.
    pub version: String,
    /// The nonce of the rejected response.
    pub nonce: String,
    /// The client's `error_detail` message.
    pub error: String,
    /// When the NACK arrived.
    pub at: SystemTime,
}

/// What one connection was sent and ACKed for one type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TypeStatus {
    /// The version of the last response (or the version a reconnecting client already held).
    pub sent_version: Option<String>,
    /// The nonce of the last response.
    pub sent_nonce: Option<String>,
    /// The last version the client ACKed.
    pub acked_version: Option<String>,
    /// The last NACK, kept until a later response is ACKed.
    pub last_nack: Option<Nack>,
    /// Whether the last response was ACKed.
    pub acked_latest: bool,
}

impl TypeStatus {
    /// SYNCED, STALE or NOT SENT.
    pub fn state(&self) -> SyncState {
        match (&self.sent_version, self.acked_latest) {
            (None, _) => SyncState::NotSent,
            (Some(_), true) => SyncState::Synced,
            (Some(_), false) => SyncState::Stale,
        }
    }

    pub(super) fn sent(&mut self, version: &str, nonce: &str) {
        self.sent_version = Some(version.to_owned());
        self.sent_nonce = Some(nonce.to_owned());
        self.acked_latest = false;
    }

    pub(super) fn acked(&mut self, version: &str, nonce: &str) {
        self.acked_version = Some(version.to_owned());
        if self.sent_nonce.as_deref() == Some(nonce) {
            self.acked_latest = true;
            self.last_nack = None;
        }
    }

    pub(super) fn nacked(&mut self, nack: Nack) {
        if self.sent_nonce.as_deref() == Some(nack.nonce.as_str()) {
            self.acked_latest = false;
        }
        self.last_nack = Some(nack);
    }

    /// A reconnecting client already holds `version`: nothing needs sending.
    pub(super) fn already_held(&mut self, version: &str) {
        self.sent_version = Some(version.to_owned());
        self.sent_nonce = None;
        self.acked_version = Some(version.to_owned());
        self.acked_latest = true;
    }
}

/// One client connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionStatus {
    /// Unique within this agent process.
    pub id: u64,
    /// The node ID from the first request (empty until a request carried one).
    pub node_id: String,
    pub protocol: Protocol,
    /// The generator chosen from the node of the first request (`None` before it).
    pub generator: Option<Generator>,
    /// Types the client asked for or was sent; a type missing here is NOT SENT.
    pub types: BTreeMap<TypeKind, TypeStatus>,
}

impl ConnectionStatus {
    /// The state of one type.
    pub fn state(&self, kind: TypeKind) -> SyncState {
        self.types
            .get(&kind)
            .map_or(SyncState::NotSent, TypeStatus::state)
    }
}

/// Every live connection's status. Cheap to clone; readers never block the connections for long.
#[derive(Clone, Debug)]
pub struct StatusRegistry {
    tx: Arc<watch::Sender<BTreeMap<u64, ConnectionStatus>>>,
}

impl Default for StatusRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl StatusRegistry {
    pub fn new() -> Self {
        Self {
            tx: Arc::new(watch::Sender::new(BTreeMap::new())),
        }
    }

    /// The live connections, by ID.
    pub fn connections(&self) -> Vec<ConnectionStatus> {
        self.tx.borrow().values().cloned().collect()
    }

    /// A receiver that sees every change of the connections (sent, ACK, NACK, connect, end).
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<u64, ConnectionStatus>> {
        self.tx.subscribe()
    }

    /// Waits until `done` holds for the live connections, and returns them.
    pub async fn wait_for(
        &self,
        mut done: impl FnMut(&[ConnectionStatus]) -> bool,
    ) -> Vec<ConnectionStatus> {
        let mut rx = self.tx.subscribe();
        loop {
            let now: Vec<ConnectionStatus> = rx.borrow_and_update().values().cloned().collect();
            if done(&now) {
                return now;
            }
            // The sender lives as long as `self`, so this cannot fail while we wait.
            if rx.changed().await.is_err() {
                return now;
            }
        }
    }

    pub(super) fn register(&self, id: u64, protocol: Protocol) -> StatusGuard {
        self.tx.send_modify(|all| {
            all.insert(
                id,
                ConnectionStatus {
                    id,
                    node_id: String::new(),
                    protocol,
                    generator: None,
                    types: BTreeMap::new(),
                },
            );
        });
        StatusGuard {
            registry: self.clone(),
            id,
        }
    }
}

/// A connection's handle on its own entry; removes the entry when the connection ends.
#[derive(Debug)]
pub(super) struct StatusGuard {
    registry: StatusRegistry,
    id: u64,
}

impl StatusGuard {
    pub(super) fn identify(&self, node_id: &str, generator: Generator) {
        self.registry.tx.send_modify(|all| {
            if let Some(conn) = all.get_mut(&self.id) {
                conn.node_id = node_id.to_owned();
                conn.generator = Some(generator);
            }
        });
    }

    pub(super) fn update(&self, kind: TypeKind, f: impl FnOnce(&mut TypeStatus)) {
        self.registry.tx.send_modify(|all| {
            if let Some(conn) = all.get_mut(&self.id) {
                f(conn.types.entry(kind).or_default());
            }
        });
    }
}

impl Drop for StatusGuard {
    fn drop(&mut self) {
        self.registry.tx.send_modify(|all| {
            all.remove(&self.id);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_follow_sent_ack_and_nack() {
        let mut status = TypeStatus::default();
        assert_eq!(status.state(), SyncState::NotSent);
        status.sent("v1", "1");
        assert_eq!(status.state(), SyncState::Stale);
        status.acked("v1", "1");
        assert_eq!(status.state(), SyncState::Synced);
        status.sent("v2", "2");
        status.nacked(Nack {
            version: "v2".into(),
            nonce: "2".into(),
            error: "bad".into(),
            at: SystemTime::now(),
        });
        assert_eq!(status.state(), SyncState::Stale);
        assert_eq!(status.acked_version.as_deref(), Some("v1"));
        status.sent("v3", "3");
        status.acked("v3", "3");
        assert_eq!(status.state(), SyncState::Synced);
        assert_eq!(status.last_nack, None);
    }
}
