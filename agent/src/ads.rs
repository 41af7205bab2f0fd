//! ADS: serves the agent's xDS resources to Envoy or a proxyless gRPC client over a Unix socket.
//!
//! The rest of the agent publishes a [`Snapshot`] (per xDS type: name → version and body) per
//! [`Generator`](crate::model::proxy::Generator) through a [`SnapshotPublisher`]. A connection learns its client's generator from
//! the node of its first request (`GENERATOR: grpc` in the node metadata gets the proxyless gRPC
//! resources, anything else Envoy's), waits until a snapshot of that generator has been published,
//! then watches the newest one and pushes only what changed for the types and names its client
//! subscribed, over both protocols of
//! `envoy.service.discovery.v3.AggregatedDiscoveryService`:
//! `StreamAggregatedResources` (state of the world, [`sotw`]) and `DeltaAggregatedResources`
//! (incremental, [`delta`]).
//!
//! **Ordering.** On a snapshot change additions and changes go out as SDS → CDS → EDS → LDS → RDS,
//! so a reference never points at something the client has not received (clusters and listeners
//! name their TLS secrets). Removals of referenced types (RDS, CDS, EDS, SDS) go out after that, in
//! the order RDS → CDS → EDS → SDS, so nothing is removed while a listener, route or cluster sent
//! earlier still names it. In SotW the first response of a type then still carries the resources
//! about to be removed, and a second response drops them.
//!
//! **Secrets.** SDS secrets (the TLS credentials gateways and `DestinationRule`s name as
//! `kubernetes://<credentialName>`) come from [`crate::credentials`], not from translation; the
//! [`SnapshotPublisher`] adds them to every generator's snapshot. A client asking for a secret the
//! agent does not have gets a response without it (as istiod answers with what it has), never an
//! error: Envoy waits for it until its initial fetch timeout and keeps the stream.
//!
//! **Unknown types.** A request for any type URL other than SDS, CDS, EDS, LDS or RDS is refused:
//! the stream ends with `InvalidArgument` and a message naming the type URL. It is never ACKed
//! silently.
//!
//! **Status.** Per connection and type, the [`StatusRegistry`] holds the version and nonce sent,
//! the version ACKed and the last NACK with its error, and reports SYNCED / STALE / NOT SENT as
//! `istioctl proxy-status` does. A NACKed version is not pushed again unless the client asks.

mod authority;
mod delta;
mod server;
mod snapshot;
mod sotw;
mod status;
mod stream;
mod vhds;
mod wire;

/// The server side of Envoy's ADS and SDS services, generated (`build.rs`) with the agent's own
/// responses ([`wire`]).
mod service {
    pub mod discovery {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("envoy.service.discovery.v3");
    }
    pub mod secret {
        #![allow(clippy::all, missing_docs)]
        tonic::include_proto!("envoy.service.secret.v3");
    }
}

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::resource::{ResourceMap, TYPE_COUNT, TypeKind};
use crate::resource::{digest, digest_resources};
pub use authority::{Fronted, front, pump as front_pump};
pub use server::{
    AdsService, BoundSocket, FileSecrets, OnDemandLink, ServeError, SocketFile, bind_unix,
    serve_listener, serve_tcp, serve_unix,
};
pub use snapshot::{Origin, Snapshot, SnapshotError, SnapshotPublisher, Snapshots};
pub use status::{ConnectionStatus, Nack, Protocol, StatusRegistry, SyncState, TypeStatus};

/// Responses queued per connection before the connection task waits for the client to read.
/// A response shares the snapshot's resources ([`wire`]), but each one encoded is a copy of what
/// it carries (up to [`PART_BYTES`] of EDS, the whole CDS), so few are queued ahead: a push in
/// parts is encoded a part or two at a time, not all at once (the seed's widest agent peaked at
/// 35.3 MiB with 2, 36.3 with 16, when responses still copied their resources).
const RESPONSE_BUFFER: usize = 2;

/// The most resource bytes one response carries when its resources may be sent in parts: a
/// response of the whole EDS of an endpoint-heavy scope is megabytes, and the connection's
/// encode buffer keeps the capacity of the largest response for as long as the client stays
/// connected (in every pod). A resource larger than this goes alone in its part.
pub const PART_BYTES: usize = 256 * 1024;

/// `items` in order, in consecutive parts of at most `limit` bytes by `size` (a larger item alone
/// in its part); at least one part, empty when there is nothing.
fn parts<T>(
    items: impl IntoIterator<Item = T>,
    size: impl Fn(&T) -> usize,
    limit: usize,
) -> Vec<Vec<T>> {
    let mut parts = Vec::new();
    let mut part = Vec::new();
    let mut filled = 0;
    for item in items {
        let bytes = size(&item);
        if !part.is_empty() && filled + bytes > limit {
            parts.push(std::mem::take(&mut part));
            filled = 0;
        }
        filled += bytes;
        part.push(item);
    }
    parts.push(part);
    parts
}

/// How long a connection waits for a client that does not read before cutting it off. The client
/// reconnects and, declaring what it holds, gets only what it lacks.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// The type of a request, or the `InvalidArgument` status that ends the stream.
fn request_type(type_url: &str) -> Result<TypeKind, tonic::Status> {
    TypeKind::from_type_url(type_url).ok_or_else(|| {
        tonic::Status::invalid_argument(format!(
            "unsupported type URL {type_url:?}: this server serves only CDS, EDS, LDS, RDS and SDS \
             ({}, {}, {}, {}, {})",
            TypeKind::Cluster.type_url(),
            TypeKind::Endpoint.type_url(),
            TypeKind::Listener.type_url(),
            TypeKind::Route.type_url(),
            TypeKind::Secret.type_url()
        ))
    })
}

/// What a client subscribed to for one type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Subscription {
    wildcard: bool,
    names: BTreeSet<String>,
}

impl Subscription {
    /// The snapshot's resources this subscription selects: with the wildcard, all but those
    /// served only by name, and those it names. Some names only the client knows are
    /// made as they are asked for: proxyless gRPC clients name a server's listener by the
    /// address it listens on and may name a service of their namespace by a short name (of
    /// the proxy's DNS domain; see [`crate::translate::grpc_listener`]); Envoy names the files
    /// of the pod whose certificates it wants (see [`stream::FileSecrets`]).
    fn select(
        &self,
        snapshot: &Snapshot,
        kind: TypeKind,
        conn: &stream::Connection,
    ) -> ResourceMap {
        let all = snapshot.resources(kind);
        let only_by_name = snapshot.by_name_only(kind);
        let mut selected = if !self.wildcard {
            ResourceMap::new()
        } else if only_by_name.is_empty() {
            all.clone()
        } else {
            all.iter()
                .filter(|(name, _)| !only_by_name.contains(*name))
                .map(|(name, r)| (name.clone(), Arc::clone(r)))
                .collect()
        };
        let named = self.names.iter().filter_map(|name| {
            let found = all.get(name).map(Arc::clone).or_else(|| match kind {
                TypeKind::Listener => crate::translate::grpc_listener(name, all, &conn.dns_domain),
                TypeKind::Secret => conn.file_secrets.as_ref().and_then(|f| f.get(name)),
                _ => None,
            });
            found.map(|r| (name.clone(), r))
        });
        selected.extend(named);
        selected
    }
}

/// FNV-1a 64, incrementally.
/// Queues one response; `false` when the stream must end (client gone, or too slow to read).
async fn deliver<T>(out: &mpsc::Sender<Result<T, tonic::Status>>, response: T) -> bool {
    match tokio::time::timeout(SEND_TIMEOUT, out.send(Ok(response))).await {
        Ok(Ok(())) => true,
        Ok(Err(_)) => false,
        Err(_) => {
            tracing::warn!(
                timeout_s = SEND_TIMEOUT.as_secs(),
                "client does not read its responses; closing the stream"
            );
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_hold_at_most_the_limit_and_keep_the_order() {
        let split = |sizes: &[usize]| parts(sizes.iter().copied(), |s| *s, 10);
        assert_eq!(split(&[]), vec![Vec::<usize>::new()]);
        assert_eq!(
            split(&[4, 4, 4, 15, 1, 9, 1]),
            vec![vec![4, 4], vec![4], vec![15], vec![1, 9], vec![1]]
        );
        assert_eq!(split(&[10, 10]), vec![vec![10], vec![10]]);
    }

    #[test]
    fn type_urls_round_trip_and_unknown_is_refused() {
        for kind in TypeKind::PUSH_ORDER {
            assert_eq!(TypeKind::from_type_url(kind.type_url()), Some(kind));
        }
        assert_eq!(
            request_type("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret")
                .unwrap(),
            TypeKind::Secret
        );
        let err = request_type("type.googleapis.com/envoy.service.runtime.v3.Runtime").unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("envoy.service.runtime.v3.Runtime"));
    }

    #[test]
    fn digest_depends_on_names_and_versions() {
        let a = digest([("a", "1"), ("b", "1")]);
        assert_eq!(a, digest([("a", "1"), ("b", "1")]));
        assert_ne!(a, digest([("a", "1"), ("b", "2")]));
        assert_ne!(a, digest([("a", "1b"), ("", "1")]));
    }
}
