//! The kinds of resource the store keeps, with their API versions and kubectl-style names.

use std::fmt;
use std::str::FromStr;

/// Group of the Istio networking kinds.
pub const ISTIO_NETWORKING_GROUP: &str = "networking.istio.io";
/// Group of the Istio security kinds.
pub const ISTIO_SECURITY_GROUP: &str = "security.istio.io";
/// Group of the Istio telemetry kinds.
pub const ISTIO_TELEMETRY_GROUP: &str = "telemetry.istio.io";
/// Group of the Istio extension kinds.
pub const ISTIO_EXTENSIONS_GROUP: &str = "extensions.istio.io";
/// Group of PASA's own kinds.
pub const PASA_GROUP: &str = "pasa.io";

const ISTIO_VERSIONS: &[&str] = &["v1", "v1beta1", "v1alpha3"];
const ISTIO_SECURITY_VERSIONS: &[&str] = &["v1", "v1beta1"];
const PASA_VERSIONS: &[&str] = &["v1alpha1"];
const ENVOY_FILTER_VERSIONS: &[&str] = &["v1alpha3"];
const PROXY_CONFIG_VERSIONS: &[&str] = &["v1beta1"];
const TELEMETRY_VERSIONS: &[&str] = &["v1", "v1alpha1"];
const EXTENSIONS_VERSIONS: &[&str] = &["v1alpha1"];

/// A kind of resource the store keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    VirtualService,
    DestinationRule,
    ServiceEntry,
    Gateway,
    Sidecar,
    WorkloadEntry,
    /// A Kubernetes Service with its endpoints (from EndpointSlices or WorkloadEntries).
    ServiceEndpoints,
    /// `security.istio.io`: the mutual TLS a workload's inbound side accepts.
    PeerAuthentication,
    /// `security.istio.io`: who may do what to a workload.
    AuthorizationPolicy,
    /// `security.istio.io`: the JWTs a workload accepts.
    RequestAuthentication,
    /// `networking.istio.io`: patches to the Envoy config of the workloads it selects.
    EnvoyFilter,
    /// `networking.istio.io`: the template of the WorkloadEntries of auto-registered VMs.
    WorkloadGroup,
    /// `networking.istio.io`: proxy settings (concurrency, image) of the workloads it selects.
    ProxyConfig,
    /// `telemetry.istio.io`: access logs, tracing and metrics of the workloads it selects.
    Telemetry,
    /// `extensions.istio.io`: a Wasm plugin for the workloads it selects.
    WasmPlugin,
    /// `extensions.istio.io`: a Wasm or Lua extension for the workloads it selects.
    TrafficExtension,
    /// PASA's own: Istio's MeshConfig (the `mesh` key of the `istio` ConfigMap), kept in the
    /// root namespace as `mesh`.
    MeshConfig,
    /// PASA's own: the keys of a JWT issuer, fetched once for the mesh by PCP, kept in the root
    /// namespace (see `pasa_istio::request_authentication::KeySetSource`).
    JsonWebKeySet,
    /// PASA's own: the registry credentials of a pull Secret a WasmPlugin or TrafficExtension
    /// names (see `pasa_istio::extensions::ImagePullSecret`), kept under the Secret's namespace
    /// and name.
    ImagePullSecret,
}

impl Kind {
    pub const ALL: [Kind; 19] = [
        Kind::VirtualService,
        Kind::DestinationRule,
        Kind::ServiceEntry,
        Kind::Gateway,
        Kind::Sidecar,
        Kind::WorkloadEntry,
        Kind::ServiceEndpoints,
        Kind::PeerAuthentication,
        Kind::AuthorizationPolicy,
        Kind::RequestAuthentication,
        Kind::EnvoyFilter,
        Kind::WorkloadGroup,
        Kind::ProxyConfig,
        Kind::Telemetry,
        Kind::WasmPlugin,
        Kind::TrafficExtension,
        Kind::MeshConfig,
        Kind::JsonWebKeySet,
        Kind::ImagePullSecret,
    ];

    /// Kinds that concern only the workloads of their own namespace (those of the mesh's root
    /// namespace: every workload): a proxy reads them of its own namespace and the root
    /// namespace, and a store under mutual TLS lets a workload read no others. PeerAuthentication
    /// is not one: a client's auto-mTLS follows the mode of the namespace it calls, as istiod
    /// infers it.
    pub const NAMESPACE_SCOPED: [Kind; 9] = [
        Kind::Sidecar,
        Kind::AuthorizationPolicy,
        Kind::RequestAuthentication,
        Kind::EnvoyFilter,
        Kind::ProxyConfig,
        Kind::Telemetry,
        Kind::WasmPlugin,
        Kind::TrafficExtension,
        Kind::ImagePullSecret,
    ];

    /// Whether a Kubernetes cluster may hold this kind (as a CRD): PASA's own kinds live in the
    /// store only (PCP and the syncer write them), so no cluster is asked for them.
    pub fn in_kubernetes(self) -> bool {
        self.group() != PASA_GROUP
    }

    /// Whether proxies read this kind at all (WorkloadGroups are the control plane's: templates
    /// of auto-registered WorkloadEntries).
    pub fn configures_proxies(self) -> bool {
        self != Kind::WorkloadGroup
    }

    /// The kinds proxies read that are shared across namespaces: every kind but the
    /// [`Kind::NAMESPACE_SCOPED`] ones and those proxies do not read.
    pub fn shared() -> impl Iterator<Item = Kind> {
        Kind::ALL
            .into_iter()
            .filter(|k| k.configures_proxies() && !Kind::NAMESPACE_SCOPED.contains(k))
    }

    /// The `kind` field as written in a manifest.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::VirtualService => "VirtualService",
            Kind::DestinationRule => "DestinationRule",
            Kind::ServiceEntry => "ServiceEntry",
            Kind::Gateway => "Gateway",
            Kind::Sidecar => "Sidecar",
            Kind::WorkloadEntry => "WorkloadEntry",
            Kind::ServiceEndpoints => "ServiceEndpoints",
            Kind::PeerAuthentication => "PeerAuthentication",
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
            Kind::RequestAuthentication => "RequestAuthentication",
            Kind::EnvoyFilter => "EnvoyFilter",
            Kind::WorkloadGroup => "WorkloadGroup",
            Kind::ProxyConfig => "ProxyConfig",
            Kind::Telemetry => "Telemetry",
            Kind::WasmPlugin => "WasmPlugin",
            Kind::TrafficExtension => "TrafficExtension",
            Kind::MeshConfig => "MeshConfig",
            Kind::JsonWebKeySet => "JsonWebKeySet",
            Kind::ImagePullSecret => "ImagePullSecret",
        }
    }

    pub fn group(self) -> &'static str {
        match self {
            Kind::ServiceEndpoints
            | Kind::MeshConfig
            | Kind::JsonWebKeySet
            | Kind::ImagePullSecret => PASA_GROUP,
            Kind::PeerAuthentication | Kind::AuthorizationPolicy | Kind::RequestAuthentication => {
                ISTIO_SECURITY_GROUP
            }
            Kind::Telemetry => ISTIO_TELEMETRY_GROUP,
            Kind::WasmPlugin | Kind::TrafficExtension => ISTIO_EXTENSIONS_GROUP,
            _ => ISTIO_NETWORKING_GROUP,
        }
    }

    /// Versions of the kind's group that the store accepts, newest first.
    pub fn versions(self) -> &'static [&'static str] {
        match self {
            Kind::ServiceEndpoints
            | Kind::MeshConfig
            | Kind::JsonWebKeySet
            | Kind::ImagePullSecret => PASA_VERSIONS,
            Kind::PeerAuthentication | Kind::AuthorizationPolicy | Kind::RequestAuthentication => {
                ISTIO_SECURITY_VERSIONS
            }
            Kind::EnvoyFilter => ENVOY_FILTER_VERSIONS,
            Kind::ProxyConfig => PROXY_CONFIG_VERSIONS,
            Kind::Telemetry => TELEMETRY_VERSIONS,
            Kind::WasmPlugin | Kind::TrafficExtension => EXTENSIONS_VERSIONS,
            _ => ISTIO_VERSIONS,
        }
    }

    /// Lower-case plural, as in `kubectl get virtualservices`.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::VirtualService => "virtualservices",
            Kind::DestinationRule => "destinationrules",
            Kind::ServiceEntry => "serviceentries",
            Kind::Gateway => "gateways",
            Kind::Sidecar => "sidecars",
            Kind::WorkloadEntry => "workloadentries",
            Kind::ServiceEndpoints => "serviceendpoints",
            Kind::PeerAuthentication => "peerauthentications",
            Kind::AuthorizationPolicy => "authorizationpolicies",
            Kind::RequestAuthentication => "requestauthentications",
            Kind::EnvoyFilter => "envoyfilters",
            Kind::WorkloadGroup => "workloadgroups",
            Kind::ProxyConfig => "proxyconfigs",
            Kind::Telemetry => "telemetries",
            Kind::WasmPlugin => "wasmplugins",
            Kind::TrafficExtension => "trafficextensions",
            Kind::MeshConfig => "meshconfigs",
            Kind::JsonWebKeySet => "jsonwebkeysets",
            Kind::ImagePullSecret => "imagepullsecrets",
        }
    }

    /// Short names, as istioctl and kubectl know them.
    pub fn short_names(self) -> &'static [&'static str] {
        match self {
            Kind::VirtualService => &["vs"],
            Kind::DestinationRule => &["dr"],
            Kind::ServiceEntry => &["se"],
            Kind::Gateway => &["gw"],
            Kind::Sidecar => &[],
            Kind::WorkloadEntry => &["we"],
            Kind::ServiceEndpoints => &["sep"],
            Kind::PeerAuthentication => &["pa"],
            Kind::AuthorizationPolicy => &["ap"],
            Kind::RequestAuthentication => &["ra"],
            Kind::EnvoyFilter => &[],
            Kind::WorkloadGroup => &["wg"],
            Kind::ProxyConfig => &[],
            Kind::Telemetry => &[],
            Kind::WasmPlugin => &[],
            Kind::TrafficExtension => &[],
            Kind::MeshConfig => &["mesh"],
            Kind::JsonWebKeySet => &["jwks"],
            Kind::ImagePullSecret => &[],
        }
    }

    /// Whether `api_version` (`group/version`) is one the store accepts for this kind.
    pub fn accepts_api_version(self, api_version: &str) -> bool {
        match api_version.split_once('/') {
            Some((group, version)) => group == self.group() && self.versions().contains(&version),
            None => false,
        }
    }

    /// The API versions accepted for this kind, for error messages.
    pub fn api_versions(self) -> Vec<String> {
        self.versions()
            .iter()
            .map(|v| format!("{}/{}", self.group(), v))
            .collect()
    }

    /// Exact `kind` field match (`VirtualService`).
    pub fn from_kind_field(kind: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == kind)
    }

    /// Every name a user may type for the kind, for help texts.
    pub fn all_names() -> String {
        Kind::ALL
            .iter()
            .map(|k| {
                let mut names = vec![k.as_str().to_ascii_lowercase()];
                names.extend(k.short_names().iter().map(|s| s.to_string()));
                names.join("|")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A kind name that is none of the store's kinds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown kind {0:?}: expected one of {names}", names = Kind::all_names())]
pub struct UnknownKind(pub String);

impl FromStr for Kind {
    type Err = UnknownKind;

    /// Parses what a user types: the kind (any case), its singular or plural lower-case name, a
    /// short name, or `plural.group` (`virtualservices.networking.istio.io`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        let (name, group) = match lower.split_once('.') {
            Some((name, group)) => (name, Some(group)),
            None => (lower.as_str(), None),
        };
        Kind::ALL
            .into_iter()
            .find(|k| {
                group.is_none_or(|g| g == k.group())
                    && (name == k.as_str().to_ascii_lowercase()
                        || name == k.plural()
                        || k.short_names().contains(&name))
            })
            .ok_or_else(|| UnknownKind(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubectl_names() {
        for (input, kind) in [
            ("vs", Kind::VirtualService),
            ("VirtualService", Kind::VirtualService),
            ("virtualservices", Kind::VirtualService),
            ("virtualservices.networking.istio.io", Kind::VirtualService),
            ("dr", Kind::DestinationRule),
            ("se", Kind::ServiceEntry),
            ("serviceentries", Kind::ServiceEntry),
            ("gw", Kind::Gateway),
            ("sidecar", Kind::Sidecar),
            ("we", Kind::WorkloadEntry),
            ("sep", Kind::ServiceEndpoints),
            ("pa", Kind::PeerAuthentication),
            ("ap", Kind::AuthorizationPolicy),
            ("ra", Kind::RequestAuthentication),
            (
                "authorizationpolicies.security.istio.io",
                Kind::AuthorizationPolicy,
            ),
            (
                "peerauthentications.security.istio.io",
                Kind::PeerAuthentication,
            ),
        ] {
            assert_eq!(input.parse::<Kind>(), Ok(kind), "{input}");
        }
        let err = "virtualservices.example.com".parse::<Kind>().unwrap_err();
        assert!(err.to_string().contains("virtualservice|vs"), "{err}");
        assert!("pods".parse::<Kind>().is_err());
    }

    #[test]
    fn api_versions_per_kind() {
        assert!(Kind::VirtualService.accepts_api_version("networking.istio.io/v1alpha3"));
        assert!(Kind::Sidecar.accepts_api_version("networking.istio.io/v1"));
        assert!(!Kind::Sidecar.accepts_api_version("networking.istio.io/v2"));
        assert!(!Kind::Gateway.accepts_api_version("gateway.networking.k8s.io/v1"));
        assert!(Kind::ServiceEndpoints.accepts_api_version("pasa.io/v1alpha1"));
        assert!(!Kind::ServiceEndpoints.accepts_api_version("networking.istio.io/v1"));
        assert!(Kind::PeerAuthentication.accepts_api_version("security.istio.io/v1beta1"));
        assert!(!Kind::PeerAuthentication.accepts_api_version("networking.istio.io/v1"));
    }
}
