//! The `WorkloadEntry` model (`networking.istio.io`): a workload outside Kubernetes (a VM, a
//! bare-metal host) described like a pod, so that services can select it. ServiceEntry endpoints
//! use the same message.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One workload: where it is reached and what it is (labels, network, locality, identity).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkloadEntry {
    /// An IP address, a DNS name (DNS-resolved ServiceEntries only) or a Unix socket
    /// (`unix:///path` or `unix://@abstract`). May be empty when `network` is set (the workload is
    /// reached through that network's gateway).
    #[serde(default)]
    pub address: String,
    /// Port numbers by service port name, when the workload listens elsewhere than the service
    /// port.
    #[serde(default)]
    pub ports: BTreeMap<String, u32>,
    /// Labels, as a pod's, for selection by services and policies.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The network the address belongs to; endpoints on other networks are reached through
    /// gateways.
    #[serde(default)]
    pub network: String,
    /// `region/zone/subzone`, for locality-aware load balancing.
    #[serde(default)]
    pub locality: String,
    /// Relative load-balancing weight (0: the default weight).
    #[serde(default)]
    pub weight: u32,
    /// The service account the workload runs as (its mTLS identity), in the entry's namespace.
    #[serde(default)]
    pub service_account: String,
}

impl WorkloadEntry {
    /// The socket path (or `@abstract` name) when the address is a Unix socket.
    pub fn unix_socket(&self) -> Option<&str> {
        self.address.strip_prefix(UNIX_ADDRESS_PREFIX)
    }
}

/// How an address names a Unix domain socket.
pub const UNIX_ADDRESS_PREFIX: &str = "unix://";

/// The annotation that has a WorkloadEntry's health checked: its workload's proxy agent probes
/// it (the readiness probe of its WorkloadGroup) and istiod records the result as the entry's
/// `Healthy` condition.
pub const HEALTH_CHECKS_ANNOTATION: &str = "proxy.istio.io/health-checks-enabled";

/// Where the store keeps a health-checked entry's `Healthy` condition (`"true"` or `"false"`),
/// since it keeps no status: the Kubernetes syncer copies it from the entry's status.
pub const HEALTHY_ANNOTATION: &str = "pasa.io/healthy";

/// Whether an entry with `annotations` has its health checked (the annotation read as Go reads
/// a boolean, as istiod does; anything else is no).
pub fn health_checked(annotations: &BTreeMap<String, String>) -> bool {
    annotations
        .get(HEALTH_CHECKS_ANNOTATION)
        .is_some_and(|v| matches!(v.as_str(), "1" | "t" | "T" | "true" | "TRUE" | "True"))
}

/// Whether proxies are sent the entry with `annotations`, as istiod decides with its default
/// `PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS`: one whose health is checked only once it is
/// known healthy (an entry just made counts as unhealthy until its first probe passes).
pub fn served(annotations: &BTreeMap<String, String>) -> bool {
    !health_checked(annotations)
        || annotations.get(HEALTHY_ANNOTATION).map(String::as_str) == Some("true")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_health_checked_entry_is_served_only_once_known_healthy() {
        assert!(served(&annotations(&[])));
        assert!(served(&annotations(&[(HEALTHY_ANNOTATION, "false")])));
        for on in ["true", "1", "T", "True"] {
            let checked = |healthy: Option<&str>| {
                let mut a = annotations(&[(HEALTH_CHECKS_ANNOTATION, on)]);
                if let Some(h) = healthy {
                    a.insert(HEALTHY_ANNOTATION.into(), h.into());
                }
                served(&a)
            };
            assert!(!checked(None), "{on}: unknown health is unhealthy");
            assert!(!checked(Some("false")), "{on}");
            assert!(checked(Some("true")), "{on}");
        }
        for off in ["false", "0", "yes", ""] {
            assert!(
                served(&annotations(&[(HEALTH_CHECKS_ANNOTATION, off)])),
                "{off}"
            );
        }
    }
}
