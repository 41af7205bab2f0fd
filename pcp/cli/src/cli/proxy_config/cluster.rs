//! `proxy-config cluster`: SERVICE FQDN, PORT, SUBSET, DIRECTION, TYPE, DESTINATION RULE, as
//! istioctl shows them. The first four come from Istio's cluster name
//! (`direction|port|subset|fqdn`), TYPE is the discovery type, DESTINATION RULE the `istio`
//! filter metadata's config path as `name.namespace`.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::google::protobuf::value::Kind;
use pasa_istio::config_path::{CONFIG_FIELD, FILTER_METADATA_KEY, describe};

use crate::cli::table;

pub const HEADER: [&str; 6] = [
    "SERVICE FQDN",
    "PORT",
    "SUBSET",
    "DIRECTION",
    "TYPE",
    "DESTINATION RULE",
];

/// istioctl's cluster filters: each given one must hold.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ClusterFilter {
    /// Only clusters whose name contains this FQDN.
    #[arg(long)]
    pub fqdn: Option<String>,
    /// Only clusters of this port.
    #[arg(long)]
    pub port: Option<u32>,
    /// Only clusters whose name contains this subset.
    #[arg(long)]
    pub subset: Option<String>,
    /// Only clusters whose name contains this direction (inbound or outbound).
    #[arg(long)]
    pub direction: Option<String>,
}

impl ClusterFilter {
    /// Whether `cluster` passes, judged on its name as istioctl does.
    pub fn keeps(&self, cluster: &Cluster) -> bool {
        let name = &cluster.name;
        let contains = |part: &Option<String>| part.as_ref().is_none_or(|p| name.contains(p));
        contains(&self.fqdn)
            && contains(&self.subset)
            && contains(&self.direction)
            && self
                .port
                .is_none_or(|port| name.contains(&format!("|{port}|")))
    }
}

/// An Istio cluster name in its parts; names of other shapes are the FQDN alone.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key<'a> {
    fqdn: &'a str,
    subset: &'a str,
    port: Option<u32>,
    direction: &'a str,
}

fn key(name: &str) -> Key<'_> {
    let parts: Vec<&str> = name.split('|').collect();
    if let [direction, port, subset, fqdn, ..] = parts.as_slice() {
        Key {
            fqdn,
            subset,
            port: port.parse().ok(),
            direction,
        }
    } else {
        Key {
            fqdn: name,
            subset: "",
            port: None,
            direction: "",
        }
    }
}

/// The discovery type's name; a custom cluster type shows as STATIC (the field's default), as in
/// istioctl.
fn discovery_type(cluster: &Cluster) -> &'static str {
    match cluster.cluster_discovery_type {
        Some(ClusterDiscoveryType::Type(t)) => DiscoveryType::try_from(t)
            .map(|t| t.as_str_name())
            .unwrap_or("UNKNOWN"),
        _ => DiscoveryType::Static.as_str_name(),
    }
}

/// The Istio config named by a resource's `istio` filter metadata, as `name.namespace`.
pub fn managed_by(metadata: Option<&Metadata>) -> String {
    metadata
        .and_then(|m| m.filter_metadata.get(FILTER_METADATA_KEY))
        .and_then(|s| s.fields.get(CONFIG_FIELD))
        .map(|v| match &v.kind {
            Some(Kind::StringValue(path)) => describe(path),
            _ => describe(""),
        })
        .unwrap_or_default()
}

/// One row per cluster kept, in istioctl's order (FQDN, subset, port, direction).
pub fn rows<'a>(clusters: impl IntoIterator<Item = &'a Cluster>) -> Vec<Vec<String>> {
    let mut clusters: Vec<&Cluster> = clusters.into_iter().collect();
    clusters.sort_by(|a, b| key(&a.name).cmp(&key(&b.name)));
    clusters
        .into_iter()
        .map(|c| {
            let k = key(&c.name);
            let (fqdn, port, subset, direction) = if c.name.split('|').count() > 3 {
                (
                    k.fqdn.to_string(),
                    k.port.map_or_else(|| "0".into(), |p| p.to_string()),
                    if k.subset.is_empty() { "-" } else { k.subset }.to_string(),
                    k.direction.to_string(),
                )
            } else {
                (c.name.clone(), "-".into(), "-".into(), "-".into())
            };
            vec![
                fqdn,
                port,
                subset,
                direction,
                discovery_type(c).to_string(),
                managed_by(c.metadata.as_ref()),
            ]
        })
        .collect()
}

/// The table of `clusters`.
pub fn render<'a>(clusters: impl IntoIterator<Item = &'a Cluster>) -> String {
    table::render(&HEADER, &rows(clusters), table::WIDE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::{Struct, Value};

    fn cluster(name: &str, kind: DiscoveryType, dr: Option<&str>) -> Cluster {
        let metadata = dr.map(|path| Metadata {
            filter_metadata: [(
                "istio".to_string(),
                Struct {
                    fields: [(
                        "config".to_string(),
                        Value {
                            kind: Some(Kind::StringValue(path.into())),
                        },
                    )]
                    .into_iter()
                    .collect(),
                },
            )]
            .into_iter()
            .collect(),
            ..Default::default()
        });
        Cluster {
            name: name.into(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(kind as i32)),
            metadata,
            ..Default::default()
        }
    }

    #[test]
    fn rows_split_istio_names_and_name_the_destination_rule() {
        let dr = "/apis/networking.istio.io/v1alpha3/namespaces/default/destination-rule/reviews";
        let clusters = [
            cluster(
                "outbound|9080|v2|reviews.default.svc.cluster.local",
                DiscoveryType::Eds,
                Some(dr),
            ),
            cluster("BlackHoleCluster", DiscoveryType::Static, None),
            cluster(
                "outbound|9080||reviews.default.svc.cluster.local",
                DiscoveryType::Eds,
                Some(dr),
            ),
            cluster("inbound|9080||", DiscoveryType::OriginalDst, None),
        ];
        let rows = rows(&clusters);
        let row = |cells: &[&str]| cells.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        assert_eq!(
            rows,
            vec![
                row(&["", "9080", "-", "inbound", "ORIGINAL_DST", ""]),
                row(&["BlackHoleCluster", "-", "-", "-", "STATIC", ""]),
                row(&[
                    "reviews.default.svc.cluster.local",
                    "9080",
                    "-",
                    "outbound",
                    "EDS",
                    "reviews.default"
                ]),
                row(&[
                    "reviews.default.svc.cluster.local",
                    "9080",
                    "v2",
                    "outbound",
                    "EDS",
                    "reviews.default"
                ]),
            ]
        );
    }

    #[test]
    fn filters_work_on_the_name() {
        let c = cluster(
            "outbound|9080|v1|reviews.default.svc.cluster.local",
            DiscoveryType::Eds,
            None,
        );
        let keeps = |f: ClusterFilter| f.keeps(&c);
        assert!(keeps(ClusterFilter::default()));
        assert!(keeps(ClusterFilter {
            fqdn: Some("reviews.default".into()),
            port: Some(9080),
            subset: Some("v1".into()),
            direction: Some("outbound".into()),
        }));
        assert!(!keeps(ClusterFilter {
            port: Some(908),
            ..Default::default()
        }));
        assert!(!keeps(ClusterFilter {
            direction: Some("inbound".into()),
            ..Default::default()
        }));
    }
}
