//! `StreamAggregatedResources`: state of the world. Every response of LDS and CDS carries the whole
//! set the client subscribed to; a resource missing from it is removed on the client. A push of
//! the other types (EDS, RDS, SDS) carries the whole set too, in parts of at most
//! [`PART_BYTES`](super::PART_BYTES) when it is larger: each part is a response of its own,
//! whose resources the client takes without dropping the others. Only the last part carries the
//! push's version (a client cut off midway declares an earlier part's version, and is sent the
//! whole set again), and the last part's ACK or NACK answers the push (a NACK of an earlier part
//! is kept until then).

use std::collections::BTreeSet;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::snapshot::{Origin, ResourceMap, Snapshot};
use super::status::Nack;
use super::stream::{Closed, Connection, StreamHandler, drive};
use super::wire::DiscoveryResponse;
use super::{PART_BYTES, Subscription, TYPE_COUNT, TypeKind, deliver, digest_resources, parts};

type Out = mpsc::Sender<Result<DiscoveryResponse, Status>>;

/// What one type's last response carried.
struct Sent {
    version: String,
    /// The last part's. Empty when the client already held `version` on reconnect.
    nonce: String,
    /// The earlier parts' nonces, when the push went in parts.
    earlier_parts: Vec<String>,
    /// The error of an earlier part's NACK, until the last part is answered.
    part_rejected: Option<String>,
    resources: ResourceMap,
    /// For a push of a new snapshot: when its configuration reached the agent, until the ACK
    /// is timed.
    origin: Option<Origin>,
}

#[derive(Default)]
struct TypeState {
    /// `None` until the client's first request of this type.
    subscription: Option<Subscription>,
    sent: Option<Sent>,
    /// A version the client NACKed; not pushed again unless the client asks.
    rejected: Option<String>,
}

struct Stream {
    conn: Connection,
    out: Out,
    types: [TypeState; TYPE_COUNT],
    next_nonce: u64,
}

pub(super) async fn run(conn: Connection, requests: Streaming<DiscoveryRequest>, out: Out) {
    let stream = Stream {
        conn,
        out,
        types: Default::default(),
        next_nonce: 0,
    };
    drive(stream, requests).await;
}

impl StreamHandler for Stream {
    type Request = DiscoveryRequest;
    const NAME: &'static str = "SotW";

    fn node(request: &DiscoveryRequest) -> Option<&Node> {
        request.node.as_ref()
    }

    fn connection(&mut self) -> &mut Connection {
        &mut self.conn
    }

    async fn on_request(
        &mut self,
        request: DiscoveryRequest,
        snapshot: &Snapshot,
    ) -> Result<(), Closed> {
        let kind = self.conn.admit(&self.out, &request.type_url).await?;
        if kind == TypeKind::VirtualHost {
            tracing::warn!("refusing VHDS on a state-of-the-world stream");
            let _ = self
                .out
                .send(Err(tonic::Status::invalid_argument(
                    "VHDS (on-demand virtual hosts) is served over delta ADS only, as Envoy \
                     requires: bootstrap the proxy with DELTA_GRPC",
                )))
                .await;
            return Err(Closed);
        }
        let state = &mut self.types[kind.index()];

        // A stale nonce answers a response the client has since been sent a newer one of: its
        // ACK or NACK means nothing, but a change of names it carries still counts (Envoy
        // unsubscribes from the endpoints of removed clusters on whatever nonce it last saw).
        let answered = match state.sent.as_mut() {
            _ if request.response_nonce.is_empty() => None,
            Some(sent) if sent.nonce == request.response_nonce => Some(sent),
            Some(sent) if sent.earlier_parts.contains(&request.response_nonce) => {
                if let Some(error) = &request.error_detail {
                    tracing::warn!(%kind, version = %sent.version, nonce = %request.response_nonce, error = %error.message, "NACK of a part");
                    sent.part_rejected
                        .get_or_insert_with(|| error.message.clone());
                }
                None
            }
            _ => {
                tracing::debug!(%kind, nonce = %request.response_nonce, "stale nonce: only a change of names is taken");
                None
            }
        };
        if let Some(sent) = answered {
            let error = request
                .error_detail
                .as_ref()
                .map(|e| e.message.clone())
                .or_else(|| sent.part_rejected.take());
            if let Some(error) = error {
                tracing::warn!(%kind, version = %sent.version, error = %error, "NACK");
                state.rejected = Some(sent.version.clone());
                sent.origin = None;
                self.conn.metrics.nacked(kind);
                let nack = Nack {
                    version: sent.version.clone(),
                    nonce: sent.nonce.clone(),
                    error,
                    at: std::time::SystemTime::now(),
                };
                self.conn.status.update(kind, |s| s.nacked(nack));
            } else {
                tracing::debug!(%kind, version = %sent.version, "ACK");
                state.rejected = None;
                if let Some(origin) = sent.origin.take() {
                    self.conn
                        .metrics
                        .acked(kind, origin.received, origin.committed);
                }
                let (version, nonce) = (sent.version.clone(), sent.nonce.clone());
                self.conn.status.update(kind, |s| s.acked(&version, &nonce));
            }
        }

        let first = state.subscription.is_none();
        let subscription = requested(kind, &request.resource_names, state.subscription.as_ref());
        if !first && state.subscription.as_ref() == Some(&subscription) {
            return Ok(());
        }
        let resources = subscription.select(snapshot, kind, &self.conn);
        let nothing_watched = !subscription.wildcard && subscription.names.is_empty();
        state.subscription = Some(subscription);
        if nothing_watched && !first {
            // Unsubscribed from every name: no response (Envoy would take it silently, never
            // ACK it); the client holds nothing of this type, which is in sync.
            self.held(kind, resources);
            return Ok(());
        }
        if first
            && !request.version_info.is_empty()
            && digest_resources(&resources) == request.version_info
        {
            tracing::debug!(%kind, version = %request.version_info, "client already holds this version");
            self.held(kind, resources);
            return Ok(());
        }
        self.send(kind, resources, None).await
    }

    /// Pushes what changed: additions and changes first (SDS → CDS → EDS → LDS → RDS, still
    /// carrying resources about to be removed), then the removals (RDS → CDS → EDS → SDS).
    async fn on_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), Closed> {
        // Clusters the client holds in another version: Envoy rebuilds each and it warms until
        // its load assignment arrives again, even an unchanged one (a cluster's EDS resource is
        // named as the cluster), so EDS is sent again when it covers one of them. CDS goes out
        // before EDS, so they are known by then.
        let mut rebuilt = BTreeSet::new();
        for kind in TypeKind::PUSH_ORDER {
            let state = &self.types[kind.index()];
            let Some(subscription) = &state.subscription else {
                continue;
            };
            let mut resources = subscription.select(snapshot, kind, &self.conn);
            if kind.defers_removal()
                && let Some(sent) = &state.sent
            {
                for (name, resource) in &sent.resources {
                    resources
                        .entry(name.clone())
                        .or_insert_with(|| Arc::clone(resource));
                }
            }
            if kind == TypeKind::Cluster
                && let Some(sent) = &state.sent
            {
                rebuilt = resources
                    .iter()
                    .filter(|(name, r)| {
                        sent.resources
                            .get(*name)
                            .is_some_and(|old| old.version != r.version)
                    })
                    .map(|(name, _)| name.clone())
                    .collect();
            }
            let warming =
                kind == TypeKind::Endpoint && resources.keys().any(|name| rebuilt.contains(name));
            if warming || self.worth_sending(kind, &resources) {
                self.send(kind, resources, snapshot.origin()).await?;
            }
        }
        for kind in TypeKind::REMOVAL_ORDER {
            let Some(subscription) = &self.types[kind.index()].subscription else {
                continue;
            };
            let resources = subscription.select(snapshot, kind, &self.conn);
            if self.worth_sending(kind, &resources) {
                self.send(kind, resources, snapshot.origin()).await?;
            }
        }
        Ok(())
    }
}

impl Stream {
    /// Records that the client holds `resources` of `kind` without a response being sent.
    fn held(&mut self, kind: TypeKind, resources: ResourceMap) {
        let version = digest_resources(&resources);
        self.conn.status.update(kind, |s| s.already_held(&version));
        self.types[kind.index()].sent = Some(Sent {
            version,
            nonce: String::new(),
            earlier_parts: Vec::new(),
            part_rejected: None,
            resources,
            origin: None,
        });
    }

    /// Whether `resources` differ from what was sent and from what the client rejected.
    fn worth_sending(&self, kind: TypeKind, resources: &ResourceMap) -> bool {
        let state = &self.types[kind.index()];
        let version = digest_resources(resources);
        let unchanged = state.sent.as_ref().is_some_and(|s| s.version == version);
        let rejected = state.rejected.as_deref() == Some(version.as_str());
        !unchanged && !rejected
    }

    async fn send(
        &mut self,
        kind: TypeKind,
        resources: ResourceMap,
        origin: Option<Origin>,
    ) -> Result<(), Closed> {
        let version = digest_resources(&resources);
        let parts = if kind.sotw_in_parts() {
            parts(resources.values(), |r| r.body.value.len(), PART_BYTES)
        } else {
            vec![resources.values().collect()]
        };
        let count = parts.len();
        let mut nonces = Vec::with_capacity(count);
        for (at, part) in parts.into_iter().enumerate() {
            self.next_nonce += 1;
            let nonce = format!("{:016x}", self.next_nonce);
            let part_version = if at + 1 == count {
                version.clone()
            } else {
                format!("{version}/part-{}-of-{count}", at + 1)
            };
            let response = DiscoveryResponse {
                version_info: part_version,
                resources: part.into_iter().map(Arc::clone).collect(),
                type_url: kind.type_url().to_owned(),
                nonce: nonce.clone(),
            };
            tracing::debug!(%kind, %version, %nonce, count = response.resources.len(), part = at + 1, of = count, "push");
            if !deliver(&self.out, response).await {
                return Err(Closed);
            }
            nonces.push(nonce);
        }
        let nonce = nonces.pop().unwrap_or_default();
        self.conn.status.update(kind, |s| s.sent(&version, &nonce));
        // A push not ACKed yet is superseded: this one's ACK times both.
        let unacked = self.types[kind.index()]
            .sent
            .as_ref()
            .and_then(|sent| sent.origin);
        let origin = match origin {
            Some(origin) => Some(origin.merge(unacked)),
            None => unacked,
        };
        self.types[kind.index()].sent = Some(Sent {
            version,
            nonce,
            earlier_parts: nonces,
            part_rejected: None,
            resources,
            origin,
        });
        Ok(())
    }
}

/// The subscription a request asks for. `*` means everything; an empty list means everything for
/// CDS and LDS when the stream started that way (legacy wildcard), and nothing otherwise.
fn requested(kind: TypeKind, names: &[String], previous: Option<&Subscription>) -> Subscription {
    let legacy = names.is_empty()
        && kind.legacy_wildcard()
        && previous.is_none_or(|p| p.wildcard && p.names.is_empty());
    let mut subscription = Subscription {
        wildcard: legacy,
        names: Default::default(),
    };
    for name in names {
        if name == "*" {
            subscription.wildcard = true;
        } else {
            subscription.names.insert(name.clone());
        }
    }
    subscription
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_wildcard_only_for_cds_and_lds_at_the_start() {
        assert!(requested(TypeKind::Cluster, &[], None).wildcard);
        assert!(!requested(TypeKind::Route, &[], None).wildcard);
        let named = requested(TypeKind::Cluster, &["a".into()], None);
        assert!(!named.wildcard);
        assert!(!requested(TypeKind::Cluster, &[], Some(&named)).wildcard);
        assert!(requested(TypeKind::Route, &["*".into()], None).wildcard);
    }
}
