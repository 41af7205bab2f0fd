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
