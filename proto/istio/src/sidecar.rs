//! The `Sidecar` model (`networking.istio.io`): how the proxy next to a workload listens (inbound
//! listeners, connection pools) and which services it can reach (egress hosts, outbound policy).

use serde::{Deserialize, Serialize};

use super::destination_rule::ConnectionPoolSettings;
use super::gateway::ServerTlsSettings;
use super::service_entry::WorkloadSelector;
use super::virtual_service::Destination;
use crate::proto_enum;

/// A Sidecar's spec. At least one of `ingress`, `egress`, `outboundTrafficPolicy` and
/// `inboundConnectionPool` must be set.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Sidecar {
    /// The workloads of the namespace this Sidecar applies to; absent means every workload
    /// without a more specific Sidecar.
    #[serde(default)]
    pub workload_selector: Option<WorkloadSelector>,
    /// Listeners for traffic coming into the workload.
    #[serde(default)]
    pub ingress: Vec<IstioIngressListener>,
    /// Listeners for traffic leaving the workload, and the hosts each may reach.
    #[serde(default)]
    pub egress: Vec<IstioEgressListener>,
    /// Connection pool for every inbound port, unless the port's listener sets its own.
    #[serde(default)]
    pub inbound_connection_pool: Option<ConnectionPoolSettings>,
    /// What to do with traffic to destinations the registry does not know.
    #[serde(default)]
    pub outbound_traffic_policy: Option<OutboundTrafficPolicy>,
}

/// An inbound listener: a port of the workload, how traffic reaches it, and where it goes.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IstioIngressListener {
    /// The port the proxy accepts traffic on (required).
    #[serde(default)]
    pub port: Option<SidecarPort>,
    /// The IP to bind to; empty means the workload's addresses.
    #[serde(default)]
    pub bind: String,
    /// How traffic is captured for this listener.
    #[serde(default)]
    pub capture_mode: CaptureMode,
    /// Where the workload listens: `127.0.0.1:port`, `0.0.0.0:port`, `[::1]:port`, `[::]:port`
    /// or `unix://path`; empty means the inbound address as is.
    #[serde(default)]
    pub default_endpoint: String,
    /// TLS terminated by the proxy for this port (not for mesh mTLS, which is automatic).
    #[serde(default)]
    pub tls: Option<ServerTlsSettings>,
    /// Connection pool for this port, overriding the Sidecar's `inboundConnectionPool`.
    #[serde(default)]
    pub connection_pool: Option<ConnectionPoolSettings>,
}

/// An outbound listener: optionally a port (or a Unix socket), and the hosts reachable through it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IstioEgressListener {
    /// The port to listen on; absent makes this the catch-all listener (only the last one may).
    #[serde(default)]
    pub port: Option<SidecarPort>,
    /// The IP to bind to, or `unix://path` (then the port number is 0).
    #[serde(default)]
    pub bind: String,
    /// How traffic is captured for this listener.
    #[serde(default)]
    pub capture_mode: CaptureMode,
    /// Reachable services as `namespace/dnsName`: `*/` any namespace, `./` the Sidecar's own,
    /// `~/` none; the name part may be `*` or `*.suffix`. At least one is required.
    #[serde(default)]
    pub hosts: Vec<String>,
}

/// A listener port of a Sidecar (the API's `SidecarPort`; number 0 only for an egress listener
/// bound to a Unix socket).
pub type SidecarPort = super::common::Port;

proto_enum! {
    /// How traffic reaches a listener.
    pub enum CaptureMode {
        /// The environment's default (iptables redirection, unless configured otherwise).
        Default = 0 => "DEFAULT",
        /// Traffic is redirected by iptables.
        Iptables = 1 => "IPTABLES",
        /// No capture: the application connects to the listener's address itself.
        None = 2 => "NONE",
    }
}

/// The handling of traffic to destinations outside the service registry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OutboundTrafficPolicy {
    #[serde(default)]
    pub mode: OutboundTrafficPolicyMode,
    /// Where to send traffic to unknown destinations instead of passing it through (only with
    /// `ALLOW_ANY`).
    #[serde(default)]
    pub egress_proxy: Option<Destination>,
}

proto_enum! {
    /// Whether the proxy lets traffic to unknown destinations through (`OutboundTrafficPolicy.Mode`).
    pub enum OutboundTrafficPolicyMode {
        /// Only registry services (and ServiceEntries) are reachable.
        RegistryOnly = 0 => "REGISTRY_ONLY",
        /// Unknown destinations are passed through (or to the egress proxy).
        AllowAny = 1 => "ALLOW_ANY",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_spec;
    use serde_json::json;

    #[test]
    fn reads_a_sidecar() {
        let sc: Sidecar = parse_spec(&json!({
            "workloadSelector": {"labels": {"app": "a"}},
            "ingress": [{
                "port": {"number": 9080, "protocol": "HTTP", "name": "http"},
                "defaultEndpoint": "127.0.0.1:8080",
                "captureMode": "NONE",
                "connectionPool": {"tcp": {"maxConnections": 10}}
            }],
            "egress": [{"bind": "unix:///var/run/s.sock", "port": {"protocol": "HTTP"}, "hosts": ["./*"]}],
            "outboundTrafficPolicy": {"mode": "ALLOW_ANY", "egressProxy": {"host": "egress.example.com", "port": {"number": 443}}}
        }))
        .unwrap();
        assert_eq!(sc.ingress[0].capture_mode, CaptureMode::None);
        assert_eq!(sc.egress[0].capture_mode, CaptureMode::Default);
        assert_eq!(sc.egress[0].port.as_ref().unwrap().number, 0);
        let policy = sc.outbound_traffic_policy.unwrap();
        assert_eq!(policy.mode, OutboundTrafficPolicyMode::AllowAny);
        assert_eq!(policy.egress_proxy.unwrap().host, "egress.example.com");
    }

    #[test]
    fn removed_fields_are_unknown() {
        let e = parse_spec::<Sidecar>(&json!({"localhost": {}})).unwrap_err();
        assert_eq!(e.field, "spec.localhost");
        let e =
            parse_spec::<Sidecar>(&json!({"outboundTrafficPolicy": {"mode": "NOPE"}})).unwrap_err();
        assert_eq!(e.field, "spec.outboundTrafficPolicy.mode");
    }
}
