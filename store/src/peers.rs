//! Replicas of one store on a shared backend (TiKV) find each other through it, so that each
//! can answer for all: proxy status lives in each replica's memory (see [`crate::status`]), and
//! `ListProxyStatus` asked of one replica gathers the others' answers.
//!
//! Each replica announces the address its API is reached on (`--advertise`) under `r/ADDRESS`,
//! with the time, every [`HEARTBEAT`], and withdraws it when it stops. An announcement older
//! than [`FRESH`] belongs to a replica that died: it is skipped (and removed by the next replica
//! that lists). These keys are not resources: no revision, no change log.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::collections::HashMap;

use pasa_proto::store::v1::ProxyStatusEntry;

use crate::backend::{Backend, BackendError, WriteBatch};

pub const PEER_PREFIX: &[u8] = b"r/";
pub const PEER_END: &[u8] = b"r0";

/// How often a replica renews its announcement.
pub const HEARTBEAT: Duration = Duration::from_secs(5);

/// How long an announcement counts.
pub const FRESH: Duration = Duration::from_secs(15);

/// Most replicas listed.
const MAX_PEERS: usize = 256;

fn key(address: &str) -> Vec<u8> {
    [PEER_PREFIX, address.as_bytes()].concat()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Announces (or renews) `address` as a replica's.
pub fn announce(backend: &dyn Backend, address: &str) -> Result<(), BackendError> {
    let mut batch = WriteBatch::default();
    batch.put(key(address), now_ms().to_be_bytes().to_vec());
    backend.write(batch)
}

/// Withdraws `address`.
pub fn withdraw(backend: &dyn Backend, address: &str) -> Result<(), BackendError> {
    let mut batch = WriteBatch::default();
    batch.delete(key(address));
    backend.write(batch)
}

/// The other replicas' addresses, announced within [`FRESH`]; stale announcements are removed.
pub fn others(backend: &dyn Backend, me: &str) -> Result<Vec<String>, BackendError> {
    let now = now_ms();
    let fresh = FRESH.as_millis() as u64;
    let mut live = Vec::new();
    let mut stale = WriteBatch::default();
    for (k, v) in backend.scan(PEER_PREFIX, PEER_END, MAX_PEERS)? {
        let at = <[u8; 8]>::try_from(v.as_slice()).map_or(0, u64::from_be_bytes);
        let address = String::from_utf8_lossy(&k[PEER_PREFIX.len()..]).into_owned();
        if now.saturating_sub(at) > fresh {
            stale.delete(k);
        } else if address != me {
            live.push(address);
        }
    }
    if !stale.ops.is_empty()
        && let Err(e) = backend.write(stale)
    {
        tracing::debug!(error = %e, "could not remove stale replica announcements");
    }
    Ok(live)
}

/// One list from this replica's entries and the others': a proxy known to several (an agent
/// that moved between replicas) is shown as the one with the newest contact, a connected one
/// first. Sorted as listings are ([`crate::status::sort`]).
pub fn merge(mine: Vec<ProxyStatusEntry>, theirs: Vec<ProxyStatusEntry>) -> Vec<ProxyStatusEntry> {
    let node = |e: &ProxyStatusEntry| {
        e.status
            .as_ref()
            .map(|s| s.node_id.clone())
            .unwrap_or_default()
    };
    let mut by_node: HashMap<String, ProxyStatusEntry> = HashMap::new();
    for entry in mine.into_iter().chain(theirs) {
        let id = node(&entry);
        match by_node.get(&id) {
            Some(kept)
                if (kept.connected, std::cmp::Reverse(kept.last_contact_ms_ago))
                    >= (
                        entry.connected,
                        std::cmp::Reverse(entry.last_contact_ms_ago),
                    ) => {}
            _ => {
                by_node.insert(id, entry);
            }
        }
    }
    let mut merged: Vec<ProxyStatusEntry> = by_node.into_values().collect();
    crate::status::sort(&mut merged);
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::FakeMemoryBackend;

    #[test]
    fn replicas_see_each_other_but_not_themselves_nor_the_dead() {
        let backend = FakeMemoryBackend::default();
        announce(&backend, "10.0.0.1:7400").unwrap();
        announce(&backend, "10.0.0.2:7400").unwrap();
        let mut dead = WriteBatch::default();
        dead.put(key("10.0.0.3:7400"), 1u64.to_be_bytes().to_vec());
        backend.write(dead).unwrap();
        assert_eq!(
            others(&backend, "10.0.0.1:7400").unwrap(),
            ["10.0.0.2:7400"]
        );
        assert_eq!(
            backend.get(&key("10.0.0.3:7400")).unwrap(),
            None,
            "a stale announcement is removed"
        );
        withdraw(&backend, "10.0.0.2:7400").unwrap();
        assert!(others(&backend, "10.0.0.1:7400").unwrap().is_empty());
    }
}
