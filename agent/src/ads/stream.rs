//! One ADS stream, SotW or Delta: the loop both run ([`drive`]) over what they do differently
//! ([`StreamHandler`]), and what each connection holds ([`Connection`]).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Node;
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};

use super::snapshot::{Snapshot, Snapshots};
use super::status::{Protocol, StatusGuard};
use super::{TypeKind, request_type};
use crate::metrics::Metrics;
use crate::model::proxy::{Generator, ProxyBuild};

/// The client went away (or the stream must end); stop the connection.
pub(super) struct Closed;

/// What SotW and Delta do differently; [`drive`] is the loop they share.
pub(super) trait StreamHandler: Send {
    type Request: prost::Message + Default + Send + 'static;
    /// For logs: `SotW` or `Delta`.
    const NAME: &'static str;
    /// The node a request names (clients send it on the first request only).
    fn node(request: &Self::Request) -> Option<&Node>;
    /// The connection this handler serves.
    fn connection(&mut self) -> &mut Connection;
    /// Answers one request of the client.
    fn on_request(
        &mut self,
        request: Self::Request,
        snapshot: &Snapshot,
    ) -> impl Future<Output = Result<(), Closed>> + Send;
    /// Pushes what a new snapshot changed.
    fn on_snapshot(
        &mut self,
        snapshot: &Snapshot,
    ) -> impl Future<Output = Result<(), Closed>> + Send;
}

/// One stream's loop: learn the client's generator from its first request, wait for that
/// generator's snapshot, then answer requests and push new snapshots, until shutdown or until the
/// client goes. When the publisher is gone, the last snapshot keeps being served.
pub(super) async fn drive<H: StreamHandler>(mut handler: H, mut requests: Streaming<H::Request>) {
    let mut closing = handler.connection().closing.clone();
    let mut snapshots = handler.connection().snapshots.clone();
    // Set by the first request.
    let mut serving: Option<(Generator, Arc<Snapshot>)> = None;
    let mut watching = true;
    let mut on_demand = handler
        .connection()
        .on_demand
        .as_ref()
        .map(|link| link.settled.clone());
    tracing::debug!(protocol = H::NAME, "stream opened");
    loop {
        tokio::select! {
            () = Connection::closed(&mut closing) => break,
            request = requests.message() => match request {
                Ok(Some(request)) => {
                    let snapshot = match &serving {
                        Some((_, snapshot)) => Arc::clone(snapshot),
                        None => {
                            let generator = handler.connection().identify(H::node(&request));
                            let Some(snapshot) =
                                first_snapshot(&mut snapshots, generator, &mut closing).await
                            else {
                                break;
                            };
                            serving = Some((generator, Arc::clone(&snapshot)));
                            snapshot
                        }
                    };
                    if handler.on_request(request, &snapshot).await.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(protocol = H::NAME, %status, "stream failed");
                    break;
                }
            },
            changed = snapshots.changed(), if watching => {
                if changed.is_err() {
                    watching = false;
                    continue;
                }
                if push_newest(&mut handler, &mut snapshots, &mut serving, false).await.is_err() {
                    break;
                }
            }
            () = crate::on_demand::changed(&mut on_demand) => {
                // A name learned: answered from the newest snapshot (published before it was
                // settled), even when this stream has not seen that snapshot yet.
                if push_newest(&mut handler, &mut snapshots, &mut serving, true).await.is_err() {
                    break;
                }
            }
        }
    }
    tracing::debug!(protocol = H::NAME, "stream closed");
}

/// Pushes what the newest snapshot changed for the client (with `always`, even when it is the
/// one the stream serves).
async fn push_newest<H: StreamHandler>(
    handler: &mut H,
    snapshots: &mut watch::Receiver<Arc<Snapshots>>,
    serving: &mut Option<(Generator, Arc<Snapshot>)>,
    always: bool,
) -> Result<(), Closed> {
    let published = Arc::clone(&snapshots.borrow_and_update());
    let Some((generator, current)) = serving else {
        return Ok(());
    };
    let Some(next) = published.get(*generator) else {
        return Ok(());
    };
    if Arc::ptr_eq(next, current) && !always {
        return Ok(());
    }
    *current = Arc::clone(next);
    handler.on_snapshot(next).await
}

/// Waits until a snapshot for `generator` is published; `None` when the server shuts down (or
/// the publisher is gone) first.
async fn first_snapshot(
    snapshots: &mut watch::Receiver<Arc<Snapshots>>,
    generator: Generator,
    closing: &mut watch::Receiver<bool>,
) -> Option<Arc<Snapshot>> {
    if let Some(snapshot) = snapshots.borrow_and_update().get(generator) {
        return Some(Arc::clone(snapshot));
    }
    tracing::debug!(
        generator = generator.name(),
        "waiting for the first snapshot"
    );
    tokio::select! {
        () = Connection::closed(closing) => None,
        ready = snapshots.wait_for(|s| s.get(generator).is_some()) => {
            ready.ok().and_then(|s| s.get(generator).cloned())
        }
    }
}

/// What each connection task needs.
pub(super) struct Connection {
    pub(super) snapshots: watch::Receiver<Arc<Snapshots>>,
    pub(super) status: StatusGuard,
    pub(super) closing: watch::Receiver<bool>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) wanted: Arc<watch::Sender<BTreeSet<Generator>>>,
    /// A stream of `SecretDiscoveryService` serves secrets only.
    pub(super) secrets_only: bool,
    /// The Envoy build the agent translates for (checked against the client's own).
    pub(super) build: ProxyBuild,
    /// The proxy's DNS domain (see [`super::Subscription::select`]).
    pub(super) dns_domain: Arc<str>,
    /// Secrets of files of the pod.
    pub(super) file_secrets: Option<FileSecrets>,
    /// The protocol of the stream.
    pub(super) protocol: Protocol,
    /// The generator the client asked for (known from its first request).
    pub(super) generator: Option<Generator>,
    /// Where an on-demand proxy's VHDS requests go to be learned (see [`OnDemandLink`]).
    pub(super) on_demand: Option<OnDemandLink>,
}

/// An on-demand agent's ADS streams and what learns the proxy's scope (see
/// [`crate::on_demand`]): the names Envoy asks VHDS for go to `asks`; a name nothing matches is
/// answered ("no such host") only once it is in `settled`, when learning it has come to an end
/// (the store answered, or the wait for it ran out). Until then Envoy holds the request.
#[derive(Clone, Debug)]
pub struct OnDemandLink {
    pub asks: mpsc::UnboundedSender<Vec<String>>,
    pub settled: watch::Receiver<Arc<BTreeSet<String>>>,
}

impl OnDemandLink {
    /// Whether the name `alias` asked for may be answered as it stands.
    pub(super) fn is_settled(&self, alias: &str) -> bool {
        self.settled.borrow().contains(alias)
    }
}

/// Serves the SDS secrets of files a client names (`file-cert:…`, `file-root:…`) that the
/// snapshot does not hold yet, as they are asked for.
/// How one secret is made from its name.
type MakeSecret = dyn Fn(&str) -> Option<Arc<crate::resource::Resource>> + Send + Sync;

#[derive(Clone)]
pub struct FileSecrets(pub Arc<MakeSecret>);

impl FileSecrets {
    /// The secret `name`, if it names files of the pod that can be read.
    pub fn get(&self, name: &str) -> Option<Arc<crate::resource::Resource>> {
        (self.0)(name)
    }
}

impl std::fmt::Debug for FileSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FileSecrets")
    }
}

/// Whether a node's Envoy has Istio's own filters, as it lists its extensions (`istio.stats`
/// among them); `None` when it lists none.
pub(super) fn has_istio_filters(node: &Node) -> Option<bool> {
    (!node.extensions.is_empty()).then(|| node.extensions.iter().any(|e| e.name == "istio.stats"))
}

impl Connection {
    /// The first request names the node: it identifies the connection and chooses its
    /// generator (Envoy's when no node is named). The generator becomes wanted, so the agent
    /// starts translating for it.
    fn identify(&mut self, node: Option<&Node>) -> Generator {
        let generator = node.map_or(Generator::Envoy, Generator::of_node);
        self.generator = Some(generator);
        let node_id = node.map(|n| n.id.as_str()).unwrap_or_default();
        self.status.identify(node_id, generator);
        self.wanted
            .send_if_modified(|wanted| wanted.insert(generator));
        tracing::info!(node = %node_id, generator = generator.name(), "client connected");
        if generator == Generator::Envoy {
            match (self.build, node.and_then(has_istio_filters)) {
                (ProxyBuild::Istio, Some(false)) => tracing::error!(
                    node = %node_id,
                    "the client's Envoy does not have Istio's filters (istio.stats, \
                     istio.metadata_exchange): it will refuse every listener the agent sends for \
                     Istio's proxy; run the agent with --proxy-build envoy"
                ),
                (ProxyBuild::Envoy, Some(true)) => tracing::info!(
                    node = %node_id,
                    "the client is Istio's proxy: with --proxy-build istio it would get Istio's \
                     standard metrics and metadata exchange, as from istiod"
                ),
                _ => {}
            }
        }
        generator
    }

    /// The first step of answering any request, SotW or Delta: the type must be one this server
    /// serves; otherwise the stream ends with the reason.
    pub(super) async fn admit<T>(
        &mut self,
        out: &mpsc::Sender<Result<T, Status>>,
        type_url: &str,
    ) -> Result<TypeKind, Closed> {
        match request_type(type_url) {
            Ok(kind) if let Some(refusal) = self.on_demand_refusal(kind) => {
                tracing::warn!(
                    reason = refusal.message(),
                    "refusing a client of the on-demand scope"
                );
                let _ = out.send(Err(refusal)).await;
                Err(Closed)
            }
            Ok(kind) if self.secrets_only && kind != TypeKind::Secret => {
                tracing::warn!(%type_url, "refusing a non-secret type on an SDS stream");
                let _ = out
                    .send(Err(Status::invalid_argument(format!(
                        "this is the SecretDiscoveryService: it serves {} only, not {type_url} \
                         (ask the AggregatedDiscoveryService on the same socket)",
                        TypeKind::Secret.type_url()
                    ))))
                    .await;
                Err(Closed)
            }
            Ok(kind) => Ok(kind),
            Err(status) => {
                tracing::warn!(%type_url, "refusing an unsupported type");
                let _ = out.send(Err(status)).await;
                Err(Closed)
            }
        }
    }

    /// Why this client cannot be served by an on-demand agent, if it cannot: only Envoy over
    /// Delta takes route configurations served by VHDS (Envoy 1.40 refuses them over SotW, or
    /// panics), and a proxyless gRPC client knows nothing of them. Secrets are served to all.
    fn on_demand_refusal(&self, kind: TypeKind) -> Option<Status> {
        if self.on_demand.is_none() || kind == TypeKind::Secret {
            return None;
        }
        let why = if self.generator == Some(Generator::Grpc) {
            "a proxyless gRPC client cannot take it"
        } else if self.protocol == Protocol::Sotw {
            "Envoy takes it over the incremental (Delta) protocol only, and this client asked \
             over state of the world"
        } else {
            return None;
        };
        Some(Status::failed_precondition(format!(
            "this agent serves the on-demand scope (--scope on-demand): {why}; give the client \
             a bootstrap with DELTA_GRPC (the agent's own does under --scope on-demand), or run \
             the agent with --scope eager"
        )))
    }

    /// Resolves when the server is shutting down.
    pub(super) async fn closed(closing: &mut watch::Receiver<bool>) {
        // A dropped sender also means the server is gone.
        let _ = closing.wait_for(|closing| *closing).await;
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.metrics.connections.dec();
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::Extension;

    use super::*;

    #[test]
    fn istios_proxy_is_told_by_the_extensions_its_node_lists() {
        let node = |names: &[&str]| Node {
            extensions: names
                .iter()
                .map(|n| Extension {
                    name: n.to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        // Upstream Envoy lists its own (hundreds); Istio's proxy also lists Istio's filters.
        assert_eq!(
            has_istio_filters(&node(&["envoy.filters.http.router"])),
            Some(false)
        );
        assert_eq!(
            has_istio_filters(&node(&["envoy.filters.http.router", "istio.stats"])),
            Some(true)
        );
        // A client that lists nothing (a proxyless one, a test) is not judged.
        assert_eq!(has_istio_filters(&node(&[])), None);
    }
}
