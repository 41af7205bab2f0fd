//! The services the mesh config's extension providers (external authorizers, tracers) name,
//! looked up as istiod looks them up: `<host>`, or `<namespace>/<host>` when the host is in more
//! than one namespace; the provider's cluster is the service's outbound cluster on its port.

use std::collections::BTreeSet;

use envoy_types::pb::envoy::config::core::v3::{GrpcService, grpc_service};

use crate::model::registry::Registry;
use crate::resource::ResourceMap;

/// A service the proxy knows, for resolving providers: its namespace and host name.
#[derive(Debug, Clone, Copy)]
pub struct KnownService<'a> {
    pub namespace: &'a str,
    pub hostname: &'a str,
}

/// The services of `registry`.
pub fn known_services(registry: &Registry) -> Vec<KnownService<'_>> {
    registry
        .services()
        .values()
        .flatten()
        .map(|s| KnownService {
            namespace: &s.namespace,
            hostname: &s.hostname,
        })
        .collect()
}

/// Why a provider's service is not one the proxy can send to (istiod's words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderServiceError {
    #[error("service must not be empty")]
    Empty,
    #[error(
        "found {service} in multiple namespaces {namespaces:?}, specify the namespace \
         explicitly in the format of <Namespace>/<Hostname>"
    )]
    Ambiguous {
        service: String,
        namespaces: BTreeSet<String>,
    },
    #[error("could not find service {service} in Istio service registry")]
    NotFound { service: String },
    #[error("the proxy has no cluster {cluster} (its Sidecar does not import {hostname})")]
    NoCluster { cluster: String, hostname: String },
}

/// The service a provider names (`<host>`, or `<namespace>/<host>`), among `services`.
pub fn lookup(
    service: &str,
    services: &[KnownService<'_>],
) -> Result<String, ProviderServiceError> {
    if service.is_empty() {
        return Err(ProviderServiceError::Empty);
    }
    let found: Vec<&KnownService<'_>> = match service.split_once('/') {
        Some((namespace, host)) => services
            .iter()
            .filter(|s| s.namespace == namespace && s.hostname == host)
            .collect(),
        None => services.iter().filter(|s| s.hostname == service).collect(),
    };
    let namespaces: BTreeSet<&str> = found.iter().map(|s| s.namespace).collect();
    match (found.first(), namespaces.len()) {
        (Some(s), 1) => Ok(s.hostname.to_string()),
        (Some(_), _) => Err(ProviderServiceError::Ambiguous {
            service: service.to_string(),
            namespaces: namespaces.into_iter().map(str::to_string).collect(),
        }),
        (None, _) => Err(ProviderServiceError::NotFound {
            service: service.to_string(),
        }),
    }
}

/// The host name and outbound cluster of the provider's `service` on `port`.
pub fn cluster(
    service: &str,
    port: u32,
    services: &[KnownService<'_>],
) -> Result<(String, String), ProviderServiceError> {
    let hostname = lookup(service, services)?;
    let cluster = format!("outbound|{port}||{hostname}");
    Ok((hostname, cluster))
}

/// Where a proxy can send what it reports (spans, access logs): the services it knows and the
/// clusters it has. A collector must be both: istiod names a collector's cluster whether the
/// proxy has it or not, and Envoy then refuses the whole listener.
/// The services are listed once, when a provider is first looked up: most generations look up
/// none.
pub struct Collectors<'a> {
    registry: &'a Registry,
    services: std::cell::OnceCell<Vec<KnownService<'a>>>,
    clusters: &'a ResourceMap,
}

impl<'a> Collectors<'a> {
    pub fn new(registry: &'a Registry, clusters: &'a ResourceMap) -> Collectors<'a> {
        Collectors {
            registry,
            services: std::cell::OnceCell::new(),
            clusters,
        }
    }

    /// The host name and cluster of the collector `service` on `port`.
    pub fn find(&self, service: &str, port: u32) -> Result<(String, String), ProviderServiceError> {
        let services = self.services.get_or_init(|| known_services(self.registry));
        let (hostname, cluster) = self::cluster(service, port, services)?;
        if !self.clusters.contains_key(&cluster) {
            return Err(ProviderServiceError::NoCluster { cluster, hostname });
        }
        Ok((hostname, cluster))
    }
}

/// Envoy's own gRPC client to `cluster`, with `authority`.
pub fn envoy_grpc(cluster: String, authority: String) -> GrpcService {
    GrpcService {
        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
            grpc_service::EnvoyGrpc {
                cluster_name: cluster,
                authority,
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}
