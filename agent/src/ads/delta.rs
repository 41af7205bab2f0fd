//! `DeltaAggregatedResources`: incremental. Responses carry only changed resources and the names of
//! removed ones; the server tracks which version of each resource the client holds. A larger push
//! than [`PART_BYTES`](super::PART_BYTES) goes in parts, each a delta of its own (the removals in
//! the last); the last part's ACK times the push.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::snapshot::{Origin, Resource, Snapshot};
use super::status::Nack;
use super::stream::{Closed, Connection, StreamHandler, drive};
use super::wire::DeltaDiscoveryResponse;
use super::{PART_BYTES, Subscription, TYPE_COUNT, TypeKind, deliver, digest, parts};

type Out = mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>;

#[derive(Default)]
struct TypeState {
    /// `None` until the client's first request of this type.
    subscription: Option<Subscription>,
    /// Name → version the client holds (sent to it, or declared in `initial_resource_versions`).
    known: BTreeMap<String, String>,
    /// Responses not yet ACKed or NACKed: nonce → system version, and for a push of a new
    /// snapshot when its configuration reached the agent.
    pending: BTreeMap<String, (String, Option<Origin>)>,
    /// VHDS: each alias the client asked for → what it was answered with (see
    /// [`super::vhds::answer`]).
    answered: BTreeMap<String, String>,
}

/// What one type needs sent.
#[derive(Default)]
struct Diff {
    updated: BTreeMap<String, Arc<Resource>>,
    removed: Vec<String>,
    /// VHDS: the aliases each updated resource answers.
    aliases: BTreeMap<String, Vec<String>>,
}

impl Diff {
    fn is_empty(&self) -> bool {
        self.updated.is_empty() && self.removed.is_empty()
    }
}

struct Stream {
    conn: Connection,
    out: Out,
    types: [TypeState; TYPE_COUNT],
    next_nonce: u64,
    /// New clusters whose load assignments must reach the client before the virtual hosts
    /// routing to them (see [`Stream::release_virtual_hosts`]); empty when none are awaited.
    warming: BTreeSet<String>,
}

/// Responses a client may leave unanswered per type before the oldest are forgotten.
const MAX_PENDING: usize = 64;

pub(super) async fn run(conn: Connection, requests: Streaming<DeltaDiscoveryRequest>, out: Out) {
    let stream = Stream {
        conn,
        out,
        types: Default::default(),
        next_nonce: 0,
        warming: BTreeSet::new(),
    };
    drive(stream, requests).await;
}

impl StreamHandler for Stream {
    type Request = DeltaDiscoveryRequest;
    const NAME: &'static str = "Delta";

    fn node(request: &DeltaDiscoveryRequest) -> Option<&Node> {
        request.node.as_ref()
    }

    fn connection(&mut self) -> &mut Connection {
        &mut self.conn
    }

    async fn on_request(
        &mut self,
        request: DeltaDiscoveryRequest,
        snapshot: &Snapshot,
    ) -> Result<(), Closed> {
        let kind = self.conn.admit(&self.out, &request.type_url).await?;
        let state = &mut self.types[kind.index()];

        if !request.response_nonce.is_empty() {
            match state.pending.remove(&request.response_nonce) {
                None => {
                    tracing::debug!(%kind, nonce = %request.response_nonce, "unknown nonce ignored");
                }
                Some((version, origin)) => {
                    let nonce = request.response_nonce.clone();
                    if let Some(error) = &request.error_detail {
                        tracing::warn!(%kind, %version, error = %error.message, "NACK");
                        self.conn.metrics.nacked(kind);
                        let nack = Nack {
                            version,
                            nonce,
                            error: error.message.clone(),
                            at: std::time::SystemTime::now(),
                        };
                        self.conn.status.update(kind, |s| s.nacked(nack));
                        if kind == TypeKind::Cluster {
                            // Its load assignments may never be asked for.
                            self.warming.clear();
                        }
                    } else {
                        tracing::debug!(%kind, %version, "ACK");
                        if let Some(origin) = origin {
                            self.conn
                                .metrics
                                .acked(kind, origin.received, origin.committed);
                        }
                        self.conn.status.update(kind, |s| s.acked(&version, &nonce));
                    }
                }
            }
        }

        let first = state.subscription.is_none();
        let mut subscription = state.subscription.take().unwrap_or_else(|| Subscription {
            wildcard: kind.legacy_wildcard() && request.resource_names_subscribe.is_empty(),
            names: Default::default(),
        });
        if first {
            state.known = request.initial_resource_versions.into_iter().collect();
        }
        let before = subscription.clone();
        if let Some(link) = &self.conn.on_demand {
            let asked: Vec<String> = request
                .resource_names_subscribe
                .iter()
                .filter_map(|name| super::vhds::learns_from(kind, name))
                .collect();
            if !asked.is_empty() {
                // The learner outlives the streams; when it is gone, the agent is stopping.
                let _ = link.asks.send(asked);
            }
        }
        for name in request.resource_names_subscribe {
            if name == "*" {
                subscription.wildcard = true;
            } else {
                subscription.names.insert(name);
            }
        }
        for name in &request.resource_names_unsubscribe {
            if name == "*" {
                subscription.wildcard = false;
            } else {
                subscription.names.remove(name);
            }
        }
        let changed = subscription != before;
        // The client drops what it unsubscribed from without being told.
        for name in &request.resource_names_unsubscribe {
            if !subscription.wildcard {
                state.known.remove(name);
            }
        }
        state.subscription = Some(subscription);
        if !first && !changed {
            return Ok(());
        }
        // Virtual hosts wait for the clusters they route to (sent once those are warm, below).
        let held = kind == TypeKind::VirtualHost && !first && !self.warming.is_empty();
        if !held {
            // A reconnecting client's first VHDS request declares virtual hosts answering
            // names the agent may not have settled again yet: they are not removed before it
            // has.
            let diff = self.diff(kind, snapshot, !(first && kind == TypeKind::VirtualHost));
            if first || !diff.is_empty() {
                self.send(kind, diff, None).await?;
            }
        }
        self.release_virtual_hosts(snapshot).await
    }

    /// Pushes what changed: updates first (SDS → CDS → EDS → LDS → RDS; listener removals with
    /// them), then removals of referenced types (RDS → CDS → EDS → SDS).
    async fn on_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), Closed> {
        let mut rebuilt = BTreeSet::new();
        for kind in TypeKind::PUSH_ORDER {
            if kind == TypeKind::VirtualHost && !self.warming.is_empty() {
                continue;
            }
            let mut diff = self.diff(kind, snapshot, !kind.defers_removal());
            match kind {
                TypeKind::Cluster => {
                    rebuilt = self.changed_known(kind, &diff);
                    self.warming
                        .extend(self.new_with_endpoints(snapshot, &diff));
                }
                TypeKind::Endpoint => self.resend_rebuilt(snapshot, &rebuilt, &mut diff),
                _ => {}
            }
            if !diff.is_empty() {
                self.send(kind, diff, snapshot.origin()).await?;
            }
        }
        for kind in TypeKind::REMOVAL_ORDER {
            let mut diff = self.diff(kind, snapshot, true);
            diff.updated.clear();
            if !diff.is_empty() {
                self.send(kind, diff, snapshot.origin()).await?;
            }
        }
        self.release_virtual_hosts(snapshot).await
    }
}

impl Stream {
    /// The clusters of `diff` new to the client that take their endpoints by EDS (the snapshot
    /// has a load assignment of their name), for a client that asks for virtual hosts.
    fn new_with_endpoints(&self, snapshot: &Snapshot, diff: &Diff) -> Vec<String> {
        if self.types[TypeKind::VirtualHost.index()]
            .subscription
            .is_none()
        {
            return Vec::new();
        }
        let known = &self.types[TypeKind::Cluster.index()].known;
        let endpoints = snapshot.resources(TypeKind::Endpoint);
        diff.updated
            .keys()
            .filter(|name| !known.contains_key(*name) && endpoints.contains_key(*name))
            .cloned()
            .collect()
    }

    /// Sends the virtual hosts held back once the load assignments of the new clusters they
    /// route to have been sent. A virtual host that arrives first sends its request to a
    /// cluster still warming: the on-demand filter then asks for the cluster by name, and Envoy
    /// never asks for a name it subscribed to again, even once the cluster is gone (its host
    /// forgotten), so a later request would wait for it in vain.
    async fn release_virtual_hosts(&mut self, snapshot: &Snapshot) -> Result<(), Closed> {
        if self.warming.is_empty() {
            return Ok(());
        }
        let sent = &self.types[TypeKind::Endpoint.index()].known;
        let clusters = &self.types[TypeKind::Cluster.index()].known;
        // A cluster the client no longer holds is not waited for.
        self.warming
            .retain(|name| clusters.contains_key(name) && !sent.contains_key(name));
        if !self.warming.is_empty() {
            return Ok(());
        }
        let diff = self.diff(TypeKind::VirtualHost, snapshot, true);
        if diff.is_empty() {
            return Ok(());
        }
        self.send(TypeKind::VirtualHost, diff, snapshot.origin())
            .await
    }

    /// The resources of `diff` the client already held in another version.
    fn changed_known(&self, kind: TypeKind, diff: &Diff) -> BTreeSet<String> {
        let known = &self.types[kind.index()].known;
        diff.updated
            .keys()
            .filter(|name| known.contains_key(*name))
            .cloned()
            .collect()
    }

    /// A changed cluster is rebuilt by Envoy and warms until its load assignment arrives again,
    /// even an unchanged one: resend those (a cluster's EDS resource is named as the cluster).
    fn resend_rebuilt(&self, snapshot: &Snapshot, rebuilt: &BTreeSet<String>, diff: &mut Diff) {
        let state = &self.types[TypeKind::Endpoint.index()];
        let Some(subscription) = &state.subscription else {
            return;
        };
        let all = snapshot.resources(TypeKind::Endpoint);
        for name in rebuilt {
            if (subscription.wildcard || subscription.names.contains(name))
                && let Some(resource) = all.get(name)
            {
                diff.updated
                    .entry(name.clone())
                    .or_insert_with(|| Arc::clone(resource));
            }
        }
    }

    /// What the client lacks for `kind`, and (if `with_removals`) what it holds that is gone.
    fn diff(&self, kind: TypeKind, snapshot: &Snapshot, with_removals: bool) -> Diff {
        let state = &self.types[kind.index()];
        if kind == TypeKind::VirtualHost {
            return self.vhds_diff(snapshot, with_removals);
        }
        let Some(subscription) = &state.subscription else {
            return Diff::default();
        };
        let wanted = subscription.select(snapshot, kind, &self.conn);
        let removed = if with_removals {
            state
                .known
                .keys()
                .filter(|name| !wanted.contains_key(*name))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        let updated = wanted
            .into_iter()
            .filter(|(name, r)| state.known.get(name) != Some(&r.version))
            .collect();
        Diff {
            updated,
            removed,
            aliases: BTreeMap::new(),
        }
    }

    /// [`Stream::diff`] for VHDS (see [`super::vhds`]): the virtual hosts the client lacks, or
    /// holds but has not yet been told answer a name it asked for; the names nothing matches,
    /// answered without a body once; and (if `with_removals`) the virtual hosts it holds that
    /// are gone.
    fn vhds_diff(&self, snapshot: &Snapshot, with_removals: bool) -> Diff {
        let state = &self.types[TypeKind::VirtualHost.index()];
        let Some(subscription) = &state.subscription else {
            return Diff::default();
        };
        // A name being learned is not answered yet: Envoy holds its request meanwhile.
        let settled = |name: &str| {
            self.conn
                .on_demand
                .as_ref()
                .is_none_or(|link| link.is_settled(name))
        };
        let selected = super::vhds::select(
            subscription.wildcard,
            &subscription.names,
            snapshot,
            settled,
        );
        let mut diff = Diff::default();
        for (name, (resource, aliases)) in &selected.found {
            let answer = super::vhds::answer(name, resource);
            let fresh = aliases
                .iter()
                .any(|a| state.answered.get(a) != Some(&answer));
            if fresh || state.known.get(name) != Some(&resource.version) {
                diff.updated.insert(name.clone(), Arc::clone(resource));
                diff.aliases
                    .insert(name.clone(), aliases.iter().cloned().collect());
            }
        }
        for name in &selected.missing {
            if state.answered.get(name).is_none_or(|a| !a.is_empty()) {
                diff.updated
                    .insert(name.clone(), Arc::new(Resource::default()));
                diff.aliases.insert(name.clone(), vec![name.clone()]);
            }
        }
        if with_removals {
            // A virtual host answering a name not settled (being learned again, or forgotten
            // for want of use) stays: Envoy does not ask again for a name whose answer it was
            // told is gone. Its clusters go; the first request through it asks for them
            // (on-demand CDS), and that request brings the host back.
            let unsettled: BTreeSet<&str> = subscription
                .names
                .iter()
                .filter(|name| !settled(name))
                .filter_map(|name| state.answered.get(name)?.rsplit_once('@'))
                .map(|(resource, _)| resource)
                .collect();
            diff.removed = state
                .known
                .keys()
                .filter(|name| {
                    !selected.found.contains_key(*name) && !unsettled.contains(name.as_str())
                })
                .cloned()
                .collect();
        }
        diff
    }

    async fn send(
        &mut self,
        kind: TypeKind,
        diff: Diff,
        origin: Option<Origin>,
    ) -> Result<(), Closed> {
        let parts = parts(diff.updated, |(_, r)| r.body.value.len(), PART_BYTES);
        let count = parts.len();
        let mut removed = diff.removed;
        for (at, part) in parts.into_iter().enumerate() {
            let last = at + 1 == count;
            let removed = if last {
                std::mem::take(&mut removed)
            } else {
                Vec::new()
            };
            let aliases = part
                .iter()
                .filter_map(|(name, _)| Some((name.clone(), diff.aliases.get(name)?.clone())))
                .collect();
            self.send_part(kind, part, removed, aliases, origin.filter(|_| last))
                .await?;
        }
        Ok(())
    }

    /// One response: `updated` and `removed`, the client's holdings updated with them.
    async fn send_part(
        &mut self,
        kind: TypeKind,
        updated: Vec<(String, Arc<Resource>)>,
        removed: Vec<String>,
        aliases: BTreeMap<String, Vec<String>>,
        origin: Option<Origin>,
    ) -> Result<(), Closed> {
        self.next_nonce += 1;
        let nonce = format!("{:016x}", self.next_nonce);
        let state = &mut self.types[kind.index()];
        for (name, resource) in &updated {
            let bodiless = resource.body.type_url.is_empty();
            if !bodiless {
                state.known.insert(name.clone(), resource.version.clone());
            }
            for alias in aliases.get(name).into_iter().flatten() {
                state
                    .answered
                    .insert(alias.clone(), super::vhds::answer(name, resource));
            }
        }
        for name in &removed {
            state.known.remove(name);
        }
        let version = digest(state.known.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        if state.pending.len() >= MAX_PENDING {
            state.pending.pop_first();
        }
        state
            .pending
            .insert(nonce.clone(), (version.clone(), origin));
        let response = DeltaDiscoveryResponse {
            system_version_info: version.clone(),
            resources: updated,
            type_url: kind.type_url().to_owned(),
            removed_resources: removed,
            nonce: nonce.clone(),
            aliases,
        };
        tracing::debug!(
            %kind, %version, %nonce,
            updated = response.resources.len(),
            removed = response.removed_resources.len(),
            "push"
        );
        if !deliver(&self.out, response).await {
            return Err(Closed);
        }
        self.conn.status.update(kind, |s| s.sent(&version, &nonce));
        Ok(())
    }
}
