//! What the store persists, and under which keys.
//!
//! | key | value |
//! |---|---|
//! | `o/<Kind>/<namespace>/<name>` | the resource (`Resource` message, index keys included) |
//! | `l/<revision: u64 big-endian>` | the change-log entry of that revision ([`LogRecord`]) |
//! | `m/revision` | the store revision (u64 big-endian) |
//! | `m/compact` | the compact revision: log entries at or below it are gone |
//! | `r/<host:port>` | on a shared backend, a replica's announcement (see [`crate::peers`]) |
//!
//! On TiKV every key is under the store's `--key-prefix` (default `pasa/`), so one cluster can
//! hold several stores (and other users' data).
//!
//! The resource, its index keys, its log entry and the revision counter of one write are always
//! written in one atomic batch (on TiKV, one transaction), so they never disagree.

use pasa_proto::Kind;
use pasa_proto::store::v1::{EventType, ObjectRef, Resource};
use prost::Message;

pub const OBJECT_PREFIX: &[u8] = b"o/";
pub const OBJECT_END: &[u8] = b"o0";
pub const LOG_PREFIX: &[u8] = b"l/";
pub const LOG_END: &[u8] = b"l0";
pub const META_REVISION: &[u8] = b"m/revision";
pub const META_COMPACT: &[u8] = b"m/compact";

/// Identity of a stored object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn of(resource: &Resource) -> Option<ObjectKey> {
        Some(ObjectKey {
            kind: Kind::from_kind_field(&resource.kind)?,
            namespace: resource.namespace.clone(),
            name: resource.name.clone(),
        })
    }

    /// The key a reference names; an empty namespace means `default`, as in kubectl.
    pub fn from_ref(r: &ObjectRef) -> Result<ObjectKey, pasa_proto::kind::UnknownKind> {
        Ok(ObjectKey {
            kind: r.kind.parse()?,
            namespace: if r.namespace.is_empty() {
                "default".to_string()
            } else {
                r.namespace.clone()
            },
            name: r.name.clone(),
        })
    }

    pub fn storage_key(&self) -> Vec<u8> {
        format!("o/{}/{}/{}", self.kind, self.namespace, self.name).into_bytes()
    }

    pub fn to_ref(&self) -> ObjectRef {
        ObjectRef {
            kind: self.kind.as_str().to_string(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.kind.as_str().to_ascii_lowercase(),
            self.namespace,
            self.name
        )
    }
}

/// One change-log entry.
#[derive(Clone, PartialEq, Message)]
pub struct LogRecord {
    #[prost(enumeration = "EventType", tag = "1")]
    pub r#type: i32,
    #[prost(uint64, tag = "2")]
    pub revision: u64,
    /// After the change; for a delete, the last state.
    #[prost(message, optional, tag = "3")]
    pub resource: Option<Resource>,
    /// Before the change, for a modification (its index keys are the old keys).
    #[prost(message, optional, tag = "4")]
    pub prev: Option<Resource>,
    /// When the write was committed, nanoseconds since the Unix epoch (0 in records written
    /// before the field existed).
    #[prost(int64, tag = "5")]
    pub commit_time_unix_nanos: i64,
}

impl LogRecord {
    pub fn is_delete(&self) -> bool {
        self.r#type == EventType::Deleted as i32
    }

    /// The object after the change; `None` for a delete.
    pub fn after(&self) -> Option<&Resource> {
        if self.is_delete() {
            None
        } else {
            self.resource.as_ref()
        }
    }

    /// The object before the change; `None` for a creation.
    pub fn before(&self) -> Option<&Resource> {
        if self.is_delete() {
            self.resource.as_ref()
        } else {
            self.prev.as_ref()
        }
    }
}

/// The event a subscriber sees for a change, from whether its subscription matches the object
/// after and before it: into the selection is ADDED, out of it DELETED, within it MODIFIED.
pub fn transition(matches_after: bool, matches_before: bool) -> Option<EventType> {
    match (matches_after, matches_before) {
        (true, true) => Some(EventType::Modified),
        (true, false) => Some(EventType::Added),
        (false, true) => Some(EventType::Deleted),
        (false, false) => None,
    }
}

/// Now, in nanoseconds since the Unix epoch: the commit time of a write.
pub fn now_unix_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

pub fn log_key(revision: u64) -> Vec<u8> {
    let mut key = LOG_PREFIX.to_vec();
    key.extend_from_slice(&revision.to_be_bytes());
    key
}

pub fn encode_u64(n: u64) -> Vec<u8> {
    n.to_be_bytes().to_vec()
}

#[derive(Debug, thiserror::Error)]
#[error("stored record under {key} is corrupt: {reason}")]
pub struct CorruptRecord {
    pub key: String,
    pub reason: String,
}

fn corrupt(key: &[u8], reason: impl ToString) -> CorruptRecord {
    CorruptRecord {
        key: String::from_utf8_lossy(key).into_owned(),
        reason: reason.to_string(),
    }
}

pub fn decode_u64(key: &[u8], value: &[u8]) -> Result<u64, CorruptRecord> {
    let bytes: [u8; 8] = value
        .try_into()
        .map_err(|_| corrupt(key, "expected 8 bytes"))?;
    Ok(u64::from_be_bytes(bytes))
}

pub fn decode_resource(key: &[u8], value: &[u8]) -> Result<Resource, CorruptRecord> {
    Resource::decode(value).map_err(|e| corrupt(key, e))
}

pub fn decode_log(key: &[u8], value: &[u8]) -> Result<LogRecord, CorruptRecord> {
    LogRecord::decode(value).map_err(|e| corrupt(key, e))
}

/// The revision a log key stands for.
pub fn log_revision(key: &[u8]) -> Result<u64, CorruptRecord> {
    key.strip_prefix(LOG_PREFIX)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| corrupt(key, "not a log key"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keys_sort_by_revision() {
        let mut keys: Vec<_> = [300u64, 2, 1 << 40, 255, 256].map(log_key).to_vec();
        keys.sort();
        let revs: Vec<u64> = keys.iter().map(|k| log_revision(k).unwrap()).collect();
        assert_eq!(revs, [2, 255, 256, 300, 1 << 40]);
        assert!(keys.iter().all(|k| k.as_slice() < LOG_END));
    }
}
