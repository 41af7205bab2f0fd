//! `proxy-config endpoint`: ENDPOINT, STATUS, OUTLIER CHECK, CLUSTER — one row per endpoint the
//! agent assigns to a cluster (EDS, and the endpoints DNS clusters carry), sorted by address,
//! port and cluster as istioctl sorts them. STATUS is the health status the agent sends.
//! istioctl reads the last two columns from Envoy's live state; the agent knows no outlier
//! ejection, so OUTLIER CHECK is always `-`.

use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, LbEndpoint, lb_endpoint,
};

use crate::cli::table;

pub const HEADER: [&str; 4] = ["ENDPOINT", "STATUS", "OUTLIER CHECK", "CLUSTER"];

/// istioctl's endpoint filters: each given one must hold.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EndpointFilter {
    /// Only endpoints of this cluster (its full name, e.g. outbound|9080||reviews.default.svc.cluster.local).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Only endpoints of this address.
    #[arg(long)]
    pub address: Option<String>,
    /// Only endpoints of this port.
    #[arg(long)]
    pub port: Option<u32>,
    /// Only endpoints of this health status (e.g. HEALTHY, UNKNOWN).
    #[arg(long)]
    pub status: Option<String>,
}

/// One endpoint of one cluster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Row {
    address: String,
    port: u32,
    cluster: String,
    status: String,
}

fn endpoint_address(ep: &LbEndpoint) -> (String, u32) {
    let address = match &ep.host_identifier {
        Some(lb_endpoint::HostIdentifier::Endpoint(e)) => {
            e.address.as_ref().and_then(|a| a.address.as_ref())
        }
        _ => None,
    };
    match address {
        Some(AddressKind::SocketAddress(s)) => {
            let port = match s.port_specifier {
                Some(PortSpecifier::PortValue(p)) => p,
                _ => 0,
            };
            (s.address.clone(), port)
        }
        Some(AddressKind::Pipe(p)) => (format!("unix://{}", p.path), 0),
        _ => ("unknown".into(), 0),
    }
}

impl EndpointFilter {
    fn keeps(&self, row: &Row) -> bool {
        self.cluster
            .as_ref()
            .is_none_or(|c| c.eq_ignore_ascii_case(&row.cluster))
            && self
                .address
                .as_ref()
                .is_none_or(|a| a.eq_ignore_ascii_case(&row.address))
            && self.port.is_none_or(|p| p == row.port)
            && self
                .status
                .as_ref()
                .is_none_or(|s| s.eq_ignore_ascii_case(&row.status))
    }
}

/// One row per endpoint of `assignments` that `filter` keeps.
pub fn rows<'a>(
    assignments: impl IntoIterator<Item = &'a ClusterLoadAssignment>,
    filter: &EndpointFilter,
) -> Vec<Vec<String>> {
    let mut rows: Vec<Row> = Vec::new();
    for cla in assignments {
        for locality in &cla.endpoints {
            for ep in &locality.lb_endpoints {
                let (address, port) = endpoint_address(ep);
                let status = HealthStatus::try_from(ep.health_status)
                    .map(|s| s.as_str_name())
                    .unwrap_or("UNKNOWN");
                let row = Row {
                    address,
                    port,
                    cluster: cla.cluster_name.clone(),
                    status: status.to_string(),
                };
                if filter.keeps(&row) {
                    rows.push(row);
                }
            }
        }
    }
    rows.sort();
    rows.into_iter()
        .map(|r| {
            let endpoint = if r.port != 0 {
                format!("{}:{}", r.address, r.port)
            } else {
                r.address
            };
            vec![endpoint, r.status, "-".into(), r.cluster]
        })
        .collect()
}

/// The table of the endpoints of `assignments` that `filter` keeps.
pub fn render<'a>(
    assignments: impl IntoIterator<Item = &'a ClusterLoadAssignment>,
    filter: &EndpointFilter,
) -> String {
    table::render(&HEADER, &rows(assignments, filter), table::WIDE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::{Address, SocketAddress};
    use envoy_types::pb::envoy::config::endpoint::v3::{Endpoint, LocalityLbEndpoints};

    fn cla(cluster: &str, addresses: &[(&str, u32)]) -> ClusterLoadAssignment {
        let lb_endpoints = addresses
            .iter()
            .map(|(a, p)| LbEndpoint {
                host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                    address: Some(Address {
                        address: Some(AddressKind::SocketAddress(SocketAddress {
                            address: a.to_string(),
                            port_specifier: Some(PortSpecifier::PortValue(*p)),
                            ..Default::default()
                        })),
                    }),
                    ..Default::default()
                })),
                health_status: HealthStatus::Healthy as i32,
                ..Default::default()
            })
            .collect();
        ClusterLoadAssignment {
            cluster_name: cluster.into(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn rows_by_address_with_their_cluster_and_filters() {
        let assignments = [
            cla("outbound|9080|v2|reviews", &[("10.0.0.2", 9080)]),
            cla(
                "outbound|9080||reviews",
                &[("10.0.0.2", 9080), ("10.0.0.1", 9080)],
            ),
        ];
        let all = rows(&assignments, &EndpointFilter::default());
        let row = |cells: &[&str]| cells.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        assert_eq!(
            all,
            vec![
                row(&["10.0.0.1:9080", "HEALTHY", "-", "outbound|9080||reviews"]),
                // Clusters in byte order, as istioctl sorts them ('v' before '|').
                row(&["10.0.0.2:9080", "HEALTHY", "-", "outbound|9080|v2|reviews"]),
                row(&["10.0.0.2:9080", "HEALTHY", "-", "outbound|9080||reviews"]),
            ]
        );
        let v2 = EndpointFilter {
            cluster: Some("outbound|9080|v2|reviews".into()),
            ..Default::default()
        };
        assert_eq!(rows(&assignments, &v2).len(), 1);
        let by_address = EndpointFilter {
            address: Some("10.0.0.1".into()),
            status: Some("healthy".into()),
            ..Default::default()
        };
        assert_eq!(rows(&assignments, &by_address).len(), 1);
    }
}
