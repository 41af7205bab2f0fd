//! An encoded xDS resource, what translation produces and ADS serves, and the versions that
//! name it: a leaf both stand on.

use std::sync::Arc;

use envoy_types::pb::google::protobuf::Any;
use prost::Message;

/// One xDS resource: its version (any string that changes when the body changes) and its body.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    /// Changes whenever `body` changes; connections compare versions, never bodies.
    pub version: String,
    /// The resource, packed with its type URL (see `envoy_types::util::pack_any`).
    pub body: Any,
}

impl Resource {
    /// `message` packed with its type URL; its version is a digest of the encoding, so an
    /// unchanged resource keeps its version across translations and restarts.
    pub fn pack<M: Message + prost::Name>(message: &M) -> Arc<Resource> {
        Resource::encoded(M::type_url(), message.encode_to_vec())
    }

    /// A resource of type `M` from its encoding (built from pieces encoded earlier).
    pub fn from_encoded<M: prost::Name>(value: Vec<u8>) -> Arc<Resource> {
        Resource::encoded(M::type_url(), value)
    }

    /// A resource from its type URL and encoding; its version is a digest of the encoding.
    pub fn encoded(type_url: String, value: Vec<u8>) -> Arc<Resource> {
        Arc::new(Resource {
            version: body_version(&value),
            body: Any { type_url, value },
        })
    }
}

/// Resources of one type by name. Persistent: a clone shares every node with the original and
/// costs O(1), so a snapshot of what the translator keeps is free to take, and two generations
/// that share most of their resources compare in time proportional to what differs.
pub type ResourceMap = imbl::OrdMap<String, Arc<Resource>>;

struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn feed(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

/// A stable version string for a set of (name, resource version) pairs: FNV-1a 64 in hex. Stable
/// across processes, so a reconnecting client's `version_info` can be compared.
pub(crate) fn digest<'a>(items: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut hash = Fnv::new();
    for (name, version) in items {
        hash.feed(name.as_bytes());
        hash.feed(&[0]);
        hash.feed(version.as_bytes());
        hash.feed(&[0xff]);
    }
    hash.hex()
}

/// A stable version string for one encoded resource body, in hex: a 64-bit digest taking the
/// body eight bytes at a time (route configurations run to megabytes, and this runs on every
/// one built), each word multiplied in and folded down so that every input bit reaches the low
/// bits, with a final avalanche. Stable across processes and releases of the agent, like
/// [`digest`].
fn body_version(bytes: &[u8]) -> String {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let fold = |h: u64, word: u64| {
        let h = (h ^ word).wrapping_mul(K);
        h ^ (h >> 29)
    };
    let mut h = 0xcbf2_9ce4_8422_2325 ^ bytes.len() as u64;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        h = fold(h, u64::from_le_bytes(w));
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    h = fold(h, u64::from_le_bytes(tail));
    // Final avalanche (the finaliser of SplitMix64).
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    format!("{:016x}", h ^ (h >> 31))
}

pub(crate) fn digest_resources(resources: &ResourceMap) -> String {
    digest(
        resources
            .iter()
            .map(|(name, r)| (name.as_str(), r.version.as_str())),
    )
}
