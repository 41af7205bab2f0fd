//! Comparing what the simulator and the translator produced with a case's expectations. Each
//! check returns the differences, one short phrase each; none means the check passed.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::address;
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use envoy_types::pb::google::protobuf::value::Kind;
use pasa_agent::resource::Resources;
use pasa_agent::simulate::{Outcome, route_table};

use super::{ClusterCheck, Expect};

/// A call's outcome against its expectation: the error always; each name when the expectation
/// gives it, or every name (absent = empty) when it is strict; the filter chain's TLS when given.
pub fn call(expect: &Expect, got: &Outcome) -> Vec<String> {
    let mut diffs = Vec::new();
    if expect.error != got.error {
        diffs.push(format!(
            "error: want {}, got {}",
            describe_error(expect.error),
            describe_error(got.error)
        ));
    }
    let fields = [
        ("listener", &expect.listener, &got.listener),
        ("filter_chain", &expect.filter_chain, &got.filter_chain),
        ("route_config", &expect.route_config, &got.route_config),
        ("virtual_host", &expect.virtual_host, &got.virtual_host),
        ("route", &expect.route, &got.route),
        ("cluster", &expect.cluster, &got.cluster),
    ];
    for (name, want, got) in fields {
        let want = match want {
            Some(w) => w.as_str(),
            None if expect.strict => "",
            None => continue,
        };
        if want != got.as_str() {
            diffs.push(format!("{name}: want {want:?}, got {got:?}"));
        }
    }
    if let Some(want) = &expect.filter_chain_tls
        && got.filter_chain_tls.as_ref() != Some(want)
    {
        diffs.push(format!(
            "filter_chain_tls: want {want:?}, got {:?}",
            got.filter_chain_tls
        ));
    }
    diffs
}

fn describe_error(e: Option<pasa_agent::simulate::TrafficError>) -> String {
    match e {
        None => "no error".into(),
        Some(e) => format!("{e:?}"),
    }
}

/// The generated clusters named `inbound…` against `want`: the same names, each with the
/// expected endpoint addresses and `istio` metadata services.
pub fn inbound_clusters(want: &BTreeMap<String, ClusterCheck>, got: &Resources) -> Vec<String> {
    let mut diffs = Vec::new();
    let names: Vec<&String> = got
        .clusters
        .keys()
        .filter(|n| n.starts_with("inbound"))
        .collect();
    let wanted: Vec<&String> = want.keys().collect();
    if names != wanted {
        diffs.push(format!("inbound clusters: want {wanted:?}, got {names:?}"));
    }
    for (name, check) in want {
        let Some(cluster) = got.clusters.get(name) else {
            continue;
        };
        let assignment = cluster
            .load_assignment
            .as_ref()
            .or_else(|| got.endpoints.get(name));
        let endpoints = assignment.map(endpoint_addresses).unwrap_or_default();
        if endpoints != check.endpoints {
            diffs.push(format!(
                "{name} endpoints: want {:?}, got {endpoints:?}",
                check.endpoints
            ));
        }
        let services = istio_services(cluster);
        if services != check.services {
            diffs.push(format!(
                "{name} istio metadata services: want {:?}, got {services:?}",
                check.services
            ));
        }
    }
    diffs
}

/// `ip:port` (IPv6 in brackets) or the socket path of every endpoint, in order.
fn endpoint_addresses(cla: &ClusterLoadAssignment) -> Vec<String> {
    let mut out = Vec::new();
    for locality in &cla.endpoints {
        for lb in &locality.lb_endpoints {
            let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &lb.host_identifier else {
                continue;
            };
            match ep.address.as_ref().and_then(|a| a.address.as_ref()) {
                Some(address::Address::SocketAddress(sa)) => {
                    let port = match sa.port_specifier {
                        Some(
                            envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p),
                        ) => p,
                        _ => 0,
                    };
                    if sa.address.contains(':') {
                        out.push(format!("[{}]:{port}", sa.address));
                    } else {
                        out.push(format!("{}:{port}", sa.address));
                    }
                }
                Some(address::Address::Pipe(pipe)) => out.push(pipe.path.clone()),
                _ => out.push(String::new()),
            }
        }
    }
    out
}

/// The hosts of the services in the cluster's `istio` filter metadata, in order.
fn istio_services(cluster: &envoy_types::pb::envoy::config::cluster::v3::Cluster) -> Vec<String> {
    let Some(istio) = cluster
        .metadata
        .as_ref()
        .and_then(|m| m.filter_metadata.get("istio"))
    else {
        return Vec::new();
    };
    let Some(Kind::ListValue(list)) = istio.fields.get("services").and_then(|v| v.kind.as_ref())
    else {
        // An entry without services is not what the corpus calls "no metadata".
        return vec!["<istio metadata without a services list>".into()];
    };
    list.values
        .iter()
        .map(|v| match &v.kind {
            Some(Kind::StructValue(s)) => {
                match s.fields.get("host").and_then(|h| h.kind.as_ref()) {
                    Some(Kind::StringValue(h)) => h.clone(),
                    _ => String::new(),
                }
            }
            _ => String::new(),
        })
        .collect()
}

/// A route-table case: the clusters the named route configuration sends each listed domain to.
pub fn route_tables(
    route_config: &str,
    want: &BTreeMap<String, Vec<String>>,
    got: &Resources,
) -> Vec<String> {
    if want.is_empty() {
        return Vec::new();
    }
    let Some(rc) = got.routes.get(route_config) else {
        return vec![format!("no route configuration {route_config:?}")];
    };
    let table = route_table(rc);
    want.iter()
        .filter_map(|(domain, clusters)| {
            let got = table.get(domain).cloned().unwrap_or_default();
            (&got != clusters).then(|| format!("{domain}: want {clusters:?}, got {got:?}"))
        })
        .collect()
}
