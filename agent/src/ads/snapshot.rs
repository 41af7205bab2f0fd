//! The resources the agent serves, one [`Snapshot`] per [`Generator`], and the channel that
//! publishes them to every connection. Translation fills CDS, EDS, LDS and RDS per generator; the
//! SDS secrets are the same for every generator and published on their own
//! ([`SnapshotPublisher::publish_secrets`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use tokio::sync::watch;

use super::{TYPE_COUNT, TypeKind};
use crate::model::proxy::Generator;
use crate::resource::{Generated, Resources};
pub use crate::resource::{Resource, ResourceMap};

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
    #[error(
        "{kind} resource {name:?} does not decode as {expected}: {source}; the snapshot was not built from typed resources"
    )]
    Decode {
        kind: TypeKind,
        name: String,
        expected: &'static str,
        #[source]
        source: prost::DecodeError,
    },
}

/// Where the configuration behind a snapshot came from: its pushes are timed from here to the
/// client's ACK (`pasa_agent_xds_push_to_ack_seconds` from `received`,
/// `pasa_agent_propagation_seconds` from `committed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    /// When the change reached the agent.
    pub received: Instant,
    /// When the store committed the earliest change the snapshot is the first to serve (the
    /// store's clock); `None` when no store commit is behind it (a snapshot after a relist, new
    /// secrets).
    pub committed: Option<SystemTime>,
}

impl Origin {
    /// A change that reached the agent just now and was committed at `committed`.
    pub fn now(committed: Option<SystemTime>) -> Origin {
        Origin {
            received: Instant::now(),
            committed,
        }
    }

    /// The origin of a push that also carries what `earlier` (not yet ACKed) carried: the
    /// earlier of each time, so a change superseded before its ACK is timed to the ACK of the
    /// push that replaced it.
    pub fn merge(self, earlier: Option<Origin>) -> Origin {
        let Some(earlier) = earlier else {
            return self;
        };
        Origin {
            received: self.received.min(earlier.received),
            committed: match (self.committed, earlier.committed) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

/// Everything the agent serves to the clients of one generator at one moment: per type, resource
/// name → resource.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    types: [ResourceMap; TYPE_COUNT],
    /// Resources served only to a client that names them, never to a wildcard subscription:
    /// an on-demand proxy's clusters (on-demand CDS; see `docs/on-demand.md`).
    by_name_only: [BTreeSet<String>; TYPE_COUNT],
    /// Where the configuration this snapshot was generated from came from. Not part of
    /// equality.
    origin: Option<Origin>,
}

impl PartialEq for Snapshot {
    fn eq(&self, other: &Self) -> bool {
        self.types == other.types && self.by_name_only == other.by_name_only
    }
}

impl Snapshot {
    /// An empty snapshot.
    pub fn new() -> Self {
        Self::default()
    }

    /// The snapshot serving `resources` (see [`Resource::pack`] for the versions).
    pub fn from_resources(resources: &Resources) -> Self {
        Snapshot::from_generated(&Generated::from_resources(resources))
    }

    /// The snapshot serving what the translator generated; the resources are shared with it.
    pub fn from_generated(generated: &Generated) -> Self {
        let mut snapshot = Snapshot::new();
        let [
            clusters,
            endpoints,
            listeners,
            routes,
            _secrets,
            extension_configs,
            virtual_hosts,
        ] = &mut snapshot.types;
        clusters.clone_from(&generated.clusters);
        endpoints.clone_from(&generated.endpoints);
        listeners.clone_from(&generated.listeners);
        routes.clone_from(&generated.routes);
        extension_configs.clone_from(&generated.extension_configs);
        virtual_hosts.clone_from(&generated.virtual_hosts);
        snapshot
    }

    /// The typed resources back from their packed bodies: the inverse of
    /// [`Snapshot::from_resources`], for tools that read what is served (the simulator). Secrets
    /// are not translated resources and are left out.
    pub fn to_resources(&self) -> Result<Resources, SnapshotError> {
        Ok(Resources {
            clusters: self.unpack_all(TypeKind::Cluster)?,
            endpoints: self.unpack_all(TypeKind::Endpoint)?,
            listeners: self.unpack_all(TypeKind::Listener)?,
            routes: self.unpack_all(TypeKind::Route)?,
            extension_configs: self.unpack_all(TypeKind::ExtensionConfig)?,
        })
    }

    fn unpack_all<M: Message + Default>(
        &self,
        kind: TypeKind,
    ) -> Result<BTreeMap<String, M>, SnapshotError> {
        self.types[kind.index()]
            .iter()
            .map(|(name, resource)| {
                M::decode(resource.body.value.as_slice())
                    .map(|message| (name.clone(), message))
                    .map_err(|source| SnapshotError::Decode {
                        kind,
                        name: name.clone(),
                        expected: kind.type_url(),
                        source,
                    })
            })
            .collect()
    }

    /// Marks where the configuration behind this snapshot came from (see [`Origin`]).
    pub fn with_origin(mut self, origin: Origin) -> Self {
        self.origin = Some(origin);
        self
    }

    /// Where the configuration behind this snapshot came from, if known.
    pub fn origin(&self) -> Option<Origin> {
        self.origin
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

    /// The version of `kind` a client holding all of this snapshot's resources of that type
    /// was sent: SotW's `version_info` for a wildcard subscription, and Delta's system version.
    pub fn type_version(&self, kind: TypeKind) -> String {
        super::digest_resources(&self.types[kind.index()])
    }

    /// The resources of one type, by name.
    pub fn resources(&self, kind: TypeKind) -> &ResourceMap {
        &self.types[kind.index()]
    }

    /// Serves resource `name` of `kind` only to a client that names it (see
    /// [`Snapshot::by_name_only`]).
    pub fn only_by_name(&mut self, kind: TypeKind, name: impl Into<String>) {
        self.by_name_only[kind.index()].insert(name.into());
    }

    /// The resources of `kind` served only to a client that names them.
    pub fn by_name_only(&self, kind: TypeKind) -> &BTreeSet<String> {
        &self.by_name_only[kind.index()]
    }
}

impl Generator {
    /// The generator's name in status pages and metric labels: `envoy` or `grpc` (as istiod
    /// names them in node metadata).
    pub fn name(self) -> &'static str {
        match self {
            Generator::Envoy => "envoy",
            Generator::Grpc => "grpc",
        }
    }
}

/// The snapshots being served: one per generator that has been published. A generator without
/// one is not ready yet; its clients wait rather than be told that nothing exists.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshots {
    by_generator: BTreeMap<Generator, Arc<Snapshot>>,
    /// The SDS secrets, in every generator's snapshot.
    secrets: Arc<ResourceMap>,
}

impl Snapshots {
    /// The snapshot for `generator`, once published.
    pub fn get(&self, generator: Generator) -> Option<&Arc<Snapshot>> {
        self.by_generator.get(&generator)
    }

    /// Every published snapshot, by generator.
    pub fn iter(&self) -> impl Iterator<Item = (Generator, &Arc<Snapshot>)> {
        self.by_generator.iter().map(|(g, s)| (*g, s))
    }
}

/// Publishes snapshots; every connection sees the newest one of its generator (intermediate ones
/// may be skipped). It also tells which generators the connected clients want.
#[derive(Debug)]
pub struct SnapshotPublisher {
    tx: watch::Sender<Arc<Snapshots>>,
    wanted: Arc<watch::Sender<BTreeSet<Generator>>>,
}

impl Default for SnapshotPublisher {
    fn default() -> Self {
        Self::new()
    }
}

impl SnapshotPublisher {
    /// A publisher with no snapshot yet: clients wait for the first one of their generator.
    /// Envoy's generator is wanted from the start; others once a client asks for them.
    pub fn new() -> Self {
        Self {
            tx: watch::Sender::new(Arc::new(Snapshots::default())),
            wanted: Arc::new(watch::Sender::new(BTreeSet::from([Generator::Envoy]))),
        }
    }

    /// Makes `snapshot` the one every client of `generator` is served, with the secrets last
    /// published (any secrets in `snapshot` are replaced by them). Publishing a snapshot equal to
    /// the current one is a no-op.
    pub fn publish(&self, generator: Generator, mut snapshot: Snapshot) {
        self.tx.send_if_modified(|current| {
            snapshot.types[TypeKind::Secret.index()] = (*current.secrets).clone();
            if current.get(generator).is_some_and(|s| **s == snapshot) {
                return false;
            }
            let mut next = (**current).clone();
            next.by_generator.insert(generator, Arc::new(snapshot));
            *current = Arc::new(next);
            true
        });
    }

    /// Makes `secrets` (resource name → secret) the SDS secrets of every generator's snapshot,
    /// now and in every snapshot published later. Each secret's version is a digest of its
    /// encoding; publishing the same secrets again is a no-op, so clients see a new version only
    /// when a secret's content changed. Secrets alone do not make a generator ready: its clients
    /// still wait for its first translation.
    pub fn publish_secrets(&self, secrets: &BTreeMap<String, Secret>) {
        let encoded: ResourceMap = secrets
            .iter()
            .map(|(name, secret)| {
                let resource = Resource::encoded(
                    TypeKind::Secret.type_url().to_owned(),
                    secret.encode_to_vec(),
                );
                (name.clone(), resource)
            })
            .collect();
        let now = Origin::now(None);
        self.tx.send_if_modified(|current| {
            if *current.secrets == encoded {
                return false;
            }
            let mut next = (**current).clone();
            for snapshot in next.by_generator.values_mut() {
                let mut updated = (**snapshot).clone();
                updated.types[TypeKind::Secret.index()] = encoded.clone();
                updated.origin = Some(now);
                *snapshot = Arc::new(updated);
            }
            next.secrets = Arc::new(encoded);
            *current = Arc::new(next);
            true
        });
    }

    /// The snapshot being served to the clients of `generator`, once published.
    pub fn current(&self, generator: Generator) -> Option<Arc<Snapshot>> {
        self.tx.borrow().get(generator).cloned()
    }

    /// Every snapshot being served.
    pub fn snapshots(&self) -> Arc<Snapshots> {
        Arc::clone(&self.tx.borrow())
    }

    /// The generators clients have asked for since the start (Envoy's always): translate for
    /// these and publish their snapshots. Changes when a client of a new generator connects.
    pub fn wanted(&self) -> watch::Receiver<BTreeSet<Generator>> {
        self.wanted.subscribe()
    }

    /// Every change of what is served (the memory trim waits for a quiet moment on it).
    pub(crate) fn subscribe(&self) -> watch::Receiver<Arc<Snapshots>> {
        self.tx.subscribe()
    }

    pub(super) fn wanted_sender(&self) -> Arc<watch::Sender<BTreeSet<Generator>>> {
        Arc::clone(&self.wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;

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

    #[test]
    fn resources_become_a_snapshot_with_stable_versions() {
        use envoy_types::pb::envoy::config::cluster::v3::Cluster;
        use envoy_types::pb::envoy::config::listener::v3::Listener;
        let mut resources = Resources::default();
        for name in ["a", "b"] {
            let cluster = Cluster {
                name: name.into(),
                ..Default::default()
            };
            resources.clusters.insert(name.into(), cluster);
        }
        let listener = Listener {
            name: "0.0.0.0_80".into(),
            ..Default::default()
        };
        resources.listeners.insert("0.0.0.0_80".into(), listener);
        let one = Snapshot::from_resources(&resources);
        let two = Snapshot::from_resources(&resources);
        assert_eq!(one, two);
        let clusters = one.resources(TypeKind::Cluster);
        assert_eq!(clusters.len(), 2);
        assert_eq!(clusters["a"].body.type_url, TypeKind::Cluster.type_url());
        assert_ne!(clusters["a"].version, clusters["b"].version);
        assert_eq!(
            clusters["a"].version,
            two.resources(TypeKind::Cluster)["a"].version
        );
        assert_eq!(
            one.resources(TypeKind::Listener)["0.0.0.0_80"]
                .body
                .type_url,
            TypeKind::Listener.type_url()
        );
        assert!(one.resources(TypeKind::Route).is_empty());
        assert_eq!(one.to_resources().unwrap(), resources);
    }

    #[test]
    fn each_generator_has_its_own_snapshot() {
        let publisher = SnapshotPublisher::new();
        assert!(publisher.current(Generator::Envoy).is_none(), "not ready");
        let mut grpc = Snapshot::new();
        grpc.insert(
            TypeKind::Listener,
            "h:80",
            "1",
            Any {
                type_url: TypeKind::Listener.type_url().into(),
                value: Vec::new(),
            },
        )
        .unwrap();
        publisher.publish(Generator::Envoy, Snapshot::new());
        publisher.publish(Generator::Grpc, grpc.clone());
        assert_eq!(*publisher.current(Generator::Grpc).unwrap(), grpc);
        assert_eq!(
            *publisher.current(Generator::Envoy).unwrap(),
            Snapshot::new()
        );
        assert_eq!(
            *publisher.wanted().borrow(),
            BTreeSet::from([Generator::Envoy])
        );
    }

    #[test]
    fn secrets_join_every_snapshot_and_change_only_with_their_content() {
        let publisher = SnapshotPublisher::new();
        let secret = |pem: &str| {
            use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
                CertificateValidationContext, secret,
            };
            let ca = envoy_types::pb::envoy::config::core::v3::DataSource {
                specifier: Some(
                    envoy_types::pb::envoy::config::core::v3::data_source::Specifier::InlineBytes(
                        pem.as_bytes().to_vec(),
                    ),
                ),
                ..Default::default()
            };
            Secret {
                name: "kubernetes://web-cacert".into(),
                r#type: Some(secret::Type::ValidationContext(
                    CertificateValidationContext {
                        trusted_ca: Some(ca),
                        ..Default::default()
                    },
                )),
            }
        };
        let one = BTreeMap::from([("kubernetes://web-cacert".to_owned(), secret("one"))]);
        // Published before any translation: kept for the first snapshot.
        publisher.publish_secrets(&one);
        assert!(publisher.current(Generator::Envoy).is_none(), "not ready");
        publisher.publish(Generator::Envoy, Snapshot::new());
        let served = publisher.current(Generator::Envoy).unwrap();
        let first = &served.resources(TypeKind::Secret)["kubernetes://web-cacert"];
        assert_eq!(first.body.type_url, TypeKind::Secret.type_url());

        let mut watch = publisher.subscribe();
        watch.borrow_and_update();
        publisher.publish_secrets(&one);
        assert!(!watch.has_changed().unwrap(), "same content: nothing new");
        // A new translation keeps the secrets.
        let mut translated = Snapshot::new();
        translated
            .insert(
                TypeKind::Listener,
                "l",
                "1",
                Any {
                    type_url: TypeKind::Listener.type_url().into(),
                    value: Vec::new(),
                },
            )
            .unwrap();
        publisher.publish(Generator::Envoy, translated);
        let served = publisher.current(Generator::Envoy).unwrap();
        assert_eq!(served.resources(TypeKind::Secret).len(), 1);
        assert_eq!(served.resources(TypeKind::Listener).len(), 1);

        publisher.publish_secrets(&BTreeMap::from([(
            "kubernetes://web-cacert".to_owned(),
            secret("two"),
        )]));
        let served = publisher.current(Generator::Envoy).unwrap();
        let second = &served.resources(TypeKind::Secret)["kubernetes://web-cacert"];
        assert_ne!(first.version, second.version, "new content, new version");
        assert_eq!(served.resources(TypeKind::Listener).len(), 1);
        publisher.publish_secrets(&BTreeMap::new());
        let served = publisher.current(Generator::Envoy).unwrap();
        assert!(served.resources(TypeKind::Secret).is_empty());
    }

    #[test]
    fn a_snapshot_shares_what_was_generated_and_equal_content_keeps_its_version() {
        use crate::resource::Generated;
        let a = Cluster {
            name: "a".into(),
            ..Default::default()
        };
        let mut generated = Generated::default();
        generated.clusters.insert("a".into(), Resource::pack(&a));
        let first = Snapshot::from_generated(&generated);
        assert!(Arc::ptr_eq(
            &first.resources(TypeKind::Cluster)["a"],
            &generated.clusters["a"]
        ));
        assert_eq!(Resource::pack(&a).version, generated.clusters["a"].version);
        assert_eq!(
            first,
            Snapshot::from_resources(&generated.to_resources().unwrap())
        );
    }
}
