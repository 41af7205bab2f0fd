//! An encoded xDS resource, what translation produces and ADS serves, the versions that name
//! it, and a generation of them ([`Generated`]): a leaf both stand on.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::google::protobuf::Any;
use prost::Message;

/// One xDS resource: its version (any string that changes when the body changes) and its body.
#[derive(Clone, Debug, Default, PartialEq)]
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

/// Generated resources of one proxy, by type and name (an owned copy, for tools and tests).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resources {
    pub clusters: BTreeMap<String, Cluster>,
    pub endpoints: BTreeMap<String, ClusterLoadAssignment>,
    pub listeners: BTreeMap<String, Listener>,
    pub routes: BTreeMap<String, RouteConfiguration>,
    /// ECDS: the HTTP and network filters listeners name by `config_discovery`.
    pub extension_configs: BTreeMap<String, TypedExtensionConfig>,
}

/// One generation of a proxy's resources as the translator keeps them: encoded as served
/// (packed body and version), and shared, so that a resource it did not rebuild is the same
/// allocation as in the previous generation. Only what was rebuilt is encoded again, and the
/// typed messages live only while they are built: in a pod, the encoded form is a fraction of
/// the typed one (prost messages hold every optional field inline).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Generated {
    pub clusters: ResourceMap,
    pub endpoints: ResourceMap,
    pub listeners: ResourceMap,
    pub routes: ResourceMap,
    pub extension_configs: ResourceMap,
    /// VHDS: the virtual hosts of route configurations served on demand, named
    /// `<route config>/<virtual host>` (an on-demand sidecar's; see `translate::lazy`).
    pub virtual_hosts: ResourceMap,
}

impl Generated {
    /// The typed resources, decoded (for tools and tests).
    pub fn to_resources(&self) -> Result<Resources, prost::DecodeError> {
        fn typed<M: prost::Message + Default>(
            map: &ResourceMap,
        ) -> Result<BTreeMap<String, M>, prost::DecodeError> {
            map.iter()
                .map(|(name, r)| Ok((name.clone(), M::decode(r.body.value.as_slice())?)))
                .collect()
        }
        Ok(Resources {
            clusters: typed(&self.clusters)?,
            endpoints: typed(&self.endpoints)?,
            listeners: typed(&self.listeners)?,
            routes: typed(&self.routes)?,
            extension_configs: typed(&self.extension_configs)?,
        })
    }

    /// Packs typed resources.
    pub fn from_resources(resources: &Resources) -> Generated {
        Generated {
            clusters: packed(resources.clusters.iter()),
            endpoints: packed(resources.endpoints.iter()),
            listeners: packed(resources.listeners.iter()),
            routes: packed(resources.routes.iter()),
            extension_configs: packed(resources.extension_configs.iter()),
            virtual_hosts: ResourceMap::new(),
        }
    }
}

/// Each message of a map, packed.
pub(crate) fn packed<'a, M: prost::Message + prost::Name + 'a>(
    messages: impl Iterator<Item = (&'a String, &'a M)>,
) -> ResourceMap {
    messages
        .map(|(name, message)| (name.clone(), Resource::pack(message)))
        .collect()
}

/// The xDS resource types the agent serves, and the order ADS pushes them in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TypeKind {
    /// CDS: `envoy.config.cluster.v3.Cluster`.
    Cluster,
    /// EDS: `envoy.config.endpoint.v3.ClusterLoadAssignment`.
    Endpoint,
    /// LDS: `envoy.config.listener.v3.Listener`.
    Listener,
    /// RDS: `envoy.config.route.v3.RouteConfiguration`.
    Route,
    /// SDS: `envoy.extensions.transport_sockets.tls.v3.Secret`.
    Secret,
    /// ECDS: `envoy.config.core.v3.TypedExtensionConfig`.
    ExtensionConfig,
    /// VHDS: `envoy.config.route.v3.VirtualHost`, over delta ADS only, for on-demand route
    /// configurations (see [`crate::ads::vhds`]).
    VirtualHost,
}

/// How many types this server serves.
pub(crate) const TYPE_COUNT: usize = 7;

impl TypeKind {
    /// Every type, in the order additions and changes are pushed.
    pub const PUSH_ORDER: [TypeKind; TYPE_COUNT] = [
        TypeKind::Secret,
        TypeKind::Cluster,
        TypeKind::Endpoint,
        TypeKind::ExtensionConfig,
        TypeKind::Listener,
        TypeKind::Route,
        TypeKind::VirtualHost,
    ];

    /// The types whose removals wait for what references them, in the order removals are pushed.
    pub const REMOVAL_ORDER: [TypeKind; 5] = [
        TypeKind::Route,
        TypeKind::ExtensionConfig,
        TypeKind::Cluster,
        TypeKind::Endpoint,
        TypeKind::Secret,
    ];

    /// The type URL on the wire.
    pub fn type_url(self) -> &'static str {
        match self {
            TypeKind::Cluster => "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            TypeKind::Endpoint => {
                "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
            }
            TypeKind::Listener => "type.googleapis.com/envoy.config.listener.v3.Listener",
            TypeKind::Route => "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
            TypeKind::Secret => {
                "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
            }
            TypeKind::ExtensionConfig => {
                "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
            }
            TypeKind::VirtualHost => "type.googleapis.com/envoy.config.route.v3.VirtualHost",
        }
    }

    /// The type for a type URL, or `None` when this server does not serve it.
    pub fn from_type_url(url: &str) -> Option<TypeKind> {
        TypeKind::PUSH_ORDER
            .into_iter()
            .find(|kind| kind.type_url() == url)
    }

    /// The short name used in logs and status (`CDS`, `EDS`, `LDS`, `RDS`, `SDS`, `ECDS`,
    /// `VHDS`).
    pub fn short_name(self) -> &'static str {
        match self {
            TypeKind::Cluster => "CDS",
            TypeKind::Endpoint => "EDS",
            TypeKind::Listener => "LDS",
            TypeKind::Route => "RDS",
            TypeKind::Secret => "SDS",
            TypeKind::ExtensionConfig => "ECDS",
            TypeKind::VirtualHost => "VHDS",
        }
    }

    /// Whether something else references this type, so its removals wait (see the `ads` module
    /// doc). Nothing references a virtual host: its removals go with its updates, in one
    /// response (Envoy applies a VHDS response's removals first, so a virtual host may take a
    /// domain over from one removed with it).
    pub(crate) fn defers_removal(self) -> bool {
        !matches!(self, TypeKind::Listener | TypeKind::VirtualHost)
    }

    /// Whether a state-of-the-world response of this type may carry only some of the resources
    /// subscribed to, the others kept as the client holds them: every type but LDS and CDS,
    /// whose every response is the whole set (xDS protocol, "Grouping resources into
    /// responses"). So a large one can be sent in parts.
    pub(crate) fn sotw_in_parts(self) -> bool {
        !matches!(self, TypeKind::Cluster | TypeKind::Listener)
    }

    /// Whether an empty first request means "everything" (legacy wildcard): CDS and LDS, and
    /// VHDS, whose first request (Envoy's, with namespace matching) names nothing.
    pub(crate) fn legacy_wildcard(self) -> bool {
        matches!(
            self,
            TypeKind::Cluster | TypeKind::Listener | TypeKind::VirtualHost
        )
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for TypeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.short_name())
    }
}

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
