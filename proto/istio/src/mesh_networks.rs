//! Istio's `MeshNetworks` (the `meshNetworks` key of the `istio` ConfigMap, which PASA keeps in
//! the mesh config as `meshNetworks`): for each network, which endpoints are on it (those of a
//! cluster's registry, or of an address range) and the gateways into it (by address, or by a
//! Service whose load balancer addresses they are).
//!
//! ```yaml
//! meshNetworks:
//!   networks:
//!     network1:
//!       endpoints: [{fromRegistry: cluster1}, {fromCidr: 10.10.0.0/16}]
//!       gateways:
//!       - {registryServiceName: istio-eastwestgateway.istio-system.svc.cluster.local, port: 15443}
//!       - {address: 35.1.2.3, port: 15443}
//! ```

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The networks of the mesh, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MeshNetworks {
    #[serde(default)]
    pub networks: BTreeMap<String, Network>,
}

/// One network: what is on it and its gateways.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Network {
    #[serde(default)]
    pub endpoints: Vec<NetworkEndpoints>,
    #[serde(default)]
    pub gateways: Vec<IstioNetworkGateway>,
}

/// Endpoints on a network: all of a cluster's registry, or those in an address range.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NetworkEndpoints {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub from_registry: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub from_cidr: String,
}

/// A gateway into a network: an address, or the Service whose load balancer addresses the
/// gateways are (in the registries the network's endpoints come from).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IstioNetworkGateway {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub registry_service_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
    pub port: u32,
    /// Kept for compatibility, unused (as in Istio).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub locality: String,
}

impl MeshNetworks {
    /// The network an endpoint without one of its own is on: the first network whose address
    /// ranges hold `address`, else the first whose registry is `cluster` (istiod's order:
    /// the pod's label, then the registry, then the ranges — but a pod label is already on
    /// the endpoint).
    pub fn network_of(&self, address: &str, cluster: &str) -> Option<&str> {
        let ip = address.parse::<IpAddr>().ok();
        let by_range = ip.and_then(|ip| {
            self.networks.iter().find_map(|(name, n)| {
                n.endpoints
                    .iter()
                    .any(|e| !e.from_cidr.is_empty() && in_range(ip, &e.from_cidr))
                    .then_some(name.as_str())
            })
        });
        let by_registry = || {
            self.networks.iter().find_map(|(name, n)| {
                n.endpoints
                    .iter()
                    .any(|e| !cluster.is_empty() && e.from_registry == cluster)
                    .then_some(name.as_str())
            })
        };
        by_range.or_else(by_registry)
    }

    /// The clusters whose registries a network's endpoints come from.
    pub fn registries<'a>(&'a self, network: &'a Network) -> impl Iterator<Item = &'a str> {
        network
            .endpoints
            .iter()
            .filter(|e| !e.from_registry.is_empty())
            .map(|e| e.from_registry.as_str())
    }
}

/// Whether `ip` is in `cidr` (`address/prefix`; an address alone is itself).
fn in_range(ip: IpAddr, cidr: &str) -> bool {
    let (base, bits) = match cidr.split_once('/') {
        Some((base, bits)) => (base, bits.parse::<u32>().ok()),
        None => (cidr, None),
    };
    let Ok(base) = base.parse::<IpAddr>() else {
        return false;
    };
    match (ip.to_canonical(), base.to_canonical()) {
        (IpAddr::V4(ip), IpAddr::V4(base)) => {
            let bits = bits.unwrap_or(32).min(32);
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            u32::from(ip) & mask == u32::from(base) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(base)) => {
            let bits = bits.unwrap_or(128).min(128);
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            u128::from(ip) & mask == u128::from(base) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_placed_by_range_then_registry() {
        let networks: MeshNetworks = serde_json::from_value(serde_json::json!({"networks": {
            "n1": {"endpoints": [{"fromRegistry": "c1"}]},
            "n2": {"endpoints": [{"fromCidr": "10.20.0.0/16"}, {"fromCidr": "fd00::/8"}],
                   "gateways": [{"address": "35.1.2.3", "port": 15443}]},
        }}))
        .unwrap();
        assert_eq!(networks.network_of("10.20.3.4", "c1"), Some("n2"));
        assert_eq!(networks.network_of("10.30.3.4", "c1"), Some("n1"));
        assert_eq!(networks.network_of("fd00::7", ""), Some("n2"));
        assert_eq!(networks.network_of("10.30.3.4", "c9"), None);
        assert!(
            serde_json::from_value::<MeshNetworks>(serde_json::json!({"networks": {
                "n1": {"gateways": [{"adress": "1.2.3.4", "port": 1}]}}}))
            .is_err()
        );
    }
}
