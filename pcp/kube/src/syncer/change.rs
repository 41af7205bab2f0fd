//! One watch event of any followed resource, and the names resources are shown by.

use super::*;

/// One watch event, of any followed resource (boxed: the objects differ much in size).
pub(super) enum Change {
    Config(Kind, Box<watcher::Event<DynamicObject>>),
    Service(Box<watcher::Event<Service>>),
    Slice(Box<watcher::Event<EndpointSlice>>),
    Pod(Box<watcher::Event<Pod>>),
    Node(Box<watcher::Event<Node>>),
    Namespace(Box<watcher::Event<Namespace>>),
    Ingress(Box<watcher::Event<Ingress>>),
    IngressClass(Box<watcher::Event<IngressClass>>),
    GatewayApi(&'static str, Box<watcher::Event<DynamicObject>>),
    Secret(Box<watcher::Event<Secret>>),
    ConfigMap(Box<watcher::Event<ConfigMap>>),
    /// A list or watch of a resource (its name in `listed`) failed; the watcher retries.
    Failed(&'static str, Problem),
    /// The addresses of some network gateway's DNS name changed (see
    /// [`crate::gateway_names`]).
    GatewayNames,
}

impl Change {
    /// The resource it is of, by the name [`Syncing::listed`] takes.
    pub(super) fn resource(&self) -> &'static str {
        match self {
            Change::Config(kind, _) => kind.plural(),
            Change::Service(_) => "services",
            Change::Slice(_) => "endpointslices",
            Change::Pod(_) => "pods",
            Change::Node(_) => "nodes",
            Change::Namespace(_) => "namespaces",
            Change::Ingress(_) => "ingresses",
            Change::IngressClass(_) => "ingressclasses",
            Change::GatewayApi(kind, _) => gateway_api_resource(kind),
            Change::Secret(_) => "secrets",
            Change::ConfigMap(_) => "configmaps",
            Change::Failed(resource, _) => resource,
            Change::GatewayNames => "gateway-names",
        }
    }
}

/// The resource name of a Gateway API kind (`httproutes.gateway.networking.k8s.io`).
pub(super) fn gateway_api_resource(kind: &'static str) -> &'static str {
    let known = gateway_api::cluster::KINDS.iter().find(|k| k.kind == kind);
    known.map_or(kind, |k| k.resource)
}

/// A resource's name as kubectl shows it, group included (`pods`,
/// `endpointslices.discovery.k8s.io`, `virtualservices.networking.istio.io`).
pub(super) fn shown(resource: &str) -> String {
    if resource.contains('.') {
        return resource.to_string();
    }
    let group = match resource {
        "endpointslices" => "discovery.k8s.io",
        "ingresses" | "ingressclasses" => "networking.k8s.io",
        other => Kind::ALL
            .into_iter()
            .find(|k| k.plural() == other && k.in_kubernetes())
            .map_or("", Kind::group),
    };
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// Maps a followed resource's stream into changes.
pub(super) fn changes<K: Send + 'static>(
    stream: impl futures::Stream<Item = Followed<K>> + Send + 'static,
    resource: &'static str,
    wrap: impl Fn(Box<watcher::Event<K>>) -> Change + Send + 'static,
) -> futures::stream::BoxStream<'static, Change> {
    stream
        .map(move |followed| match followed {
            Ok(event) => wrap(Box::new(event)),
            Err(problem) => Change::Failed(resource, problem),
        })
        .boxed()
}
