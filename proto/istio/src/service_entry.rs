//! The `ServiceEntry` model (`networking.istio.io`): a service added to Istio's registry by hand,
//! typically an external API or a set of VMs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::workload_entry::WorkloadEntry;
use crate::proto_enum;

proto_enum! {
    /// Whether the service is part of the mesh (mTLS, Istio's telemetry) or outside it.
    pub enum Location {
        MeshExternal = 0 => "MESH_EXTERNAL",
        MeshInternal = 1 => "MESH_INTERNAL",
    }
}

proto_enum! {
    /// How the proxy finds the endpoints of the service.
    pub enum Resolution {
        /// No resolution: connections go to the address the caller used.
        None = 0 => "NONE",
        /// The endpoints' IP addresses (or Unix sockets) as listed.
        Static = 1 => "STATIC",
        /// Resolve endpoint addresses (or the hosts) by DNS, using every address returned.
        Dns = 2 => "DNS",
        /// Resolve by DNS and use the first address only, for new connections.
        DnsRoundRobin = 3 => "DNS_ROUND_ROBIN",
        /// Resolve the host each request names (wildcard hosts), with Envoy's dynamic forward proxy.
        DynamicDns = 4 => "DYNAMIC_DNS",
    }
}

/// A service added to the mesh's registry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceEntry {
    /// Host names of the service (DNS names, a leading wildcard allowed).
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Virtual IPs or CIDR blocks of the service.
    #[serde(default)]
    pub addresses: Vec<String>,
    #[serde(default)]
    pub ports: Vec<ServicePort>,
    #[serde(default)]
    pub location: Location,
    #[serde(default)]
    pub resolution: Resolution,
    /// The endpoints, listed inline (exclusive with `workload_selector`).
    #[serde(default)]
    pub endpoints: Vec<WorkloadEntry>,
    /// The endpoints, as the pods and WorkloadEntries of the namespace with these labels.
    #[serde(default)]
    pub workload_selector: Option<WorkloadSelector>,
    /// Namespaces the service is visible to (`.` own, `*` all, `~` none).
    #[serde(default)]
    pub export_to: Vec<String>,
    /// Identities the endpoints' certificates must carry.
    #[serde(default)]
    pub subject_alt_names: Vec<String>,
}

/// A port of a ServiceEntry (the API's `ServicePort`): `targetPort` is where endpoints receive,
/// when it differs from `number`.
pub type ServicePort = super::common::Port;

/// The workloads a ServiceEntry (or Sidecar) applies to, by labels
/// (`networking.v1alpha3.WorkloadSelector`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkloadSelector {
    /// Labels a workload must all carry; empty selects every workload of the namespace.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}
