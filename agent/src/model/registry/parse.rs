//! A cache resource parsed into its typed model ([`Parsed`]), once per change; one that does not
//! parse is left out and logged with the field at fault.

use std::sync::Arc;

use pasa_istio::authorization_policy::AuthorizationPolicy;
use pasa_istio::destination_rule::DestinationRule;
use pasa_istio::gateway::Gateway;
use pasa_istio::peer_authentication::PeerAuthentication;
use pasa_istio::service_endpoints::{EndpointView, ServiceEndpoints};
use pasa_istio::service_entry::ServiceEntry;
use pasa_istio::sidecar::Sidecar;
use pasa_istio::virtual_service::VirtualService;
use pasa_istio::workload_entry::WorkloadEntry;
use pasa_proto::Kind;
use pasa_proto::store::v1::Resource;
use serde::de::DeserializeOwned;

use super::kubernetes::{ClusterService, Part, from_kubernetes, part_from_kubernetes};
use super::{Config, Meta};

#[derive(Debug, Clone)]
pub(super) enum Parsed {
    VirtualService(Arc<Config<VirtualService>>),
    DestinationRule(Arc<Config<DestinationRule>>),
    ServiceEntry(Arc<Config<ServiceEntry>>),
    /// Built into its service as it is parsed: the parsed spec is not kept (a large service's
    /// endpoints would be held twice), only its ports as written, which resolve the ports of
    /// the endpoints its parts hold.
    ServiceEndpoints(Arc<ClusterService>),
    /// A part of a Kubernetes Service's endpoints (`spec.service` set): merged into the service.
    EndpointsPart(Arc<Part>),
    Sidecar(Arc<Config<Sidecar>>),
    Gateway(Arc<Config<Gateway>>),
    WorkloadEntry(Arc<Config<WorkloadEntry>>),
    PeerAuthentication(Arc<Config<PeerAuthentication>>),
    AuthorizationPolicy(Arc<Config<AuthorizationPolicy>>),
    MeshConfig(Arc<Config<pasa_istio::mesh_config::MeshConfig>>),
    RequestAuthentication(Arc<Config<pasa_istio::request_authentication::RequestAuthentication>>),
    JsonWebKeySet(Arc<Config<pasa_istio::request_authentication::JsonWebKeySet>>),
    EnvoyFilter(Arc<Config<pasa_istio::envoy_filter::EnvoyFilter>>),
    Telemetry(Arc<Config<pasa_istio::telemetry::Telemetry>>),
    /// A TrafficExtension, or a WasmPlugin read as one (as istiod reads it: its name marked
    /// with [`pasa_istio::extensions::WASM_PLUGIN_MARKER`]).
    TrafficExtension(Arc<Config<pasa_istio::extensions::TrafficExtension>>),
    /// The registry credentials an extension's `imagePullSecret` names.
    ImagePullSecret(Arc<Config<pasa_istio::extensions::ImagePullSecret>>),
    /// A kind translation does not read, or a spec that did not parse.
    Ignored,
}

fn meta_of(resource: &Resource) -> Meta {
    Meta {
        namespace: resource.namespace.clone(),
        name: resource.name.clone(),
        labels: resource.labels.clone().into_iter().collect(),
        annotations: resource.annotations.clone().into_iter().collect(),
        created: resource.create_revision,
        revision: resource.mod_revision,
    }
}

/// Why a stored resource is ignored: the field this agent could not read, and what it found.
pub(super) fn unreadable(e: &pasa_proto::object::FieldError) -> String {
    format!(
        "resource ignored: this agent cannot read {}: {} (is the agent older than the config, or \
         was the config written past validation?)",
        e.field, e.message
    )
}

pub(super) fn parse(resource: &Resource, domain_suffix: &str) -> Parsed {
    fn typed<T: DeserializeOwned>(resource: &Resource) -> Option<Config<T>> {
        match pasa_istio::parse_spec_json::<T>(&resource.spec_json) {
            Ok(spec) => Some(Config {
                meta: meta_of(resource),
                spec,
            }),
            Err(e) => {
                tracing::warn!(kind = %resource.kind, namespace = %resource.namespace,
                    name = %resource.name, field = %e.field, error = %e.message,
                    "{}", unreadable(&e));
                None
            }
        }
    }
    let parsed = match Kind::from_kind_field(&resource.kind) {
        Some(Kind::VirtualService) => typed(resource).map(|c| Parsed::VirtualService(Arc::new(c))),
        Some(Kind::DestinationRule) => {
            typed(resource).map(|c| Parsed::DestinationRule(Arc::new(c)))
        }
        Some(Kind::ServiceEntry) => typed(resource).map(|c| Parsed::ServiceEntry(Arc::new(c))),
        Some(Kind::ServiceEndpoints) => {
            // Read in place (its endpoints' strings borrowed from the JSON); a spec that does
            // not read so is read again as owned, which names the field at fault.
            let read = |meta: Meta, spec: ServiceEndpoints<EndpointView<'_>>| {
                if spec.is_part(&meta.name) {
                    Parsed::EndpointsPart(Arc::new(part_from_kubernetes(&meta, spec)))
                } else {
                    Parsed::ServiceEndpoints(Arc::new(from_kubernetes(meta, spec, domain_suffix)))
                }
            };
            match serde_json::from_str(&resource.spec_json) {
                Ok(spec) => Some(read(meta_of(resource), spec)),
                Err(_) => typed::<ServiceEndpoints>(resource)
                    .map(|c| read(c.meta, c.spec.map_endpoints(EndpointView::from))),
            }
        }
        Some(Kind::Sidecar) => typed(resource).map(|c| Parsed::Sidecar(Arc::new(c))),
        Some(Kind::Gateway) => typed(resource).map(|c| Parsed::Gateway(Arc::new(c))),
        Some(Kind::WorkloadEntry) => typed(resource).map(|c| Parsed::WorkloadEntry(Arc::new(c))),
        Some(Kind::PeerAuthentication) => {
            typed(resource).map(|c| Parsed::PeerAuthentication(Arc::new(c)))
        }
        Some(Kind::AuthorizationPolicy) => {
            typed(resource).map(|c| Parsed::AuthorizationPolicy(Arc::new(c)))
        }
        Some(Kind::RequestAuthentication) => {
            typed(resource).map(|c| Parsed::RequestAuthentication(Arc::new(c)))
        }
        Some(Kind::EnvoyFilter) => typed(resource).map(|c| Parsed::EnvoyFilter(Arc::new(c))),
        Some(Kind::Telemetry) => typed(resource).map(|c| Parsed::Telemetry(Arc::new(c))),
        Some(Kind::TrafficExtension) => {
            typed(resource).map(|c| Parsed::TrafficExtension(Arc::new(c)))
        }
        Some(Kind::WasmPlugin) => typed::<pasa_istio::extensions::WasmPlugin>(resource).map(|c| {
            let mut meta = c.meta;
            meta.name
                .push_str(pasa_istio::extensions::WASM_PLUGIN_MARKER);
            Parsed::TrafficExtension(Arc::new(Config {
                meta,
                spec: c.spec.to_traffic_extension(),
            }))
        }),
        // Not translated yet: the injector keeps pods they apply to with istiod.
        Some(Kind::ProxyConfig) => None,
        Some(Kind::MeshConfig) => typed(resource).map(|c| Parsed::MeshConfig(Arc::new(c))),
        Some(Kind::JsonWebKeySet) => typed(resource).map(|c| Parsed::JsonWebKeySet(Arc::new(c))),
        Some(Kind::ImagePullSecret) => {
            typed(resource).map(|c| Parsed::ImagePullSecret(Arc::new(c)))
        }
        // The control plane's (auto-registration), not a proxy's.
        Some(Kind::WorkloadGroup) | None => None,
    };
    parsed.unwrap_or(Parsed::Ignored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreadable_resource_is_ignored_naming_the_field() {
        let spec = serde_json::json!({"host": "cart", "trafficPolicy":
            {"loadBalancer": {"simple": "FASTEST"}}});
        let e = pasa_istio::parse_spec_json::<pasa_istio::destination_rule::DestinationRule>(
            &spec.to_string(),
        )
        .unwrap_err();
        let message = unreadable(&e);
        assert!(
            message.starts_with(
                "resource ignored: this agent cannot read spec.trafficPolicy.loadBalancer.simple: "
            ) && message.contains("FASTEST"),
            "{message}"
        );
    }
}
