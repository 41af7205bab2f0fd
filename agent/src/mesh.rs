//! The mesh-wide settings translation depends on (a subset of Istio's MeshConfig), with Istio's
//! defaults.

/// What a sidecar does with outbound traffic to a destination it does not know
/// (`outboundTrafficPolicy.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutboundPolicy {
    /// Forward it to where it was going (`PassthroughCluster`).
    #[default]
    AllowAny,
    /// Drop it (`BlackHoleCluster`; HTTP gets 502 from the `block_all` virtual host).
    RegistryOnly,
    /// Like `AllowAny`, except plaintext HTTP, which goes to the host its Host header names,
    /// resolved per request (`AllowAnyDynamicDNSCluster`, a dynamic forward proxy).
    AllowAnyDynamicDns,
}

/// What a sidecar does with inbound traffic to a port no service declares
/// (`inboundTrafficPolicy.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InboundPolicy {
    /// Forward it to the original destination (`InboundPassthroughCluster`).
    #[default]
    Passthrough,
    /// Forward it to localhost.
    Localhost,
}

impl OutboundPolicy {
    /// Whether unknown destinations are reachable at all.
    pub fn allows_any(self) -> bool {
        !matches!(self, OutboundPolicy::RegistryOnly)
    }
}

/// Mesh settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshSettings {
    /// Where mesh-wide Sidecars, DestinationRules and ... live (`rootNamespace`).
    pub root_namespace: String,
    /// The cluster's DNS suffix (`cluster.local`): Kubernetes services are
    /// `<name>.<namespace>.svc.<suffix>`.
    pub domain_suffix: String,
    /// The suffix short host names in Istio resources resolve with (`reviews` in `default` →
    /// `reviews.default.svc.<suffix>`). istiod keeps it separate from the registry's; it is the
    /// same unless a config source was set up without one (then `reviews.default`).
    pub config_domain_suffix: String,
    pub outbound_policy: OutboundPolicy,
    pub inbound_policy: InboundPolicy,
}

impl Default for MeshSettings {
    fn default() -> Self {
        Self {
            root_namespace: "istio-system".into(),
            domain_suffix: "cluster.local".into(),
            config_domain_suffix: "cluster.local".into(),
            outbound_policy: OutboundPolicy::AllowAny,
            inbound_policy: InboundPolicy::Passthrough,
        }
    }
}
