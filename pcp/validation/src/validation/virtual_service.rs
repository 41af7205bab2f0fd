//! Validation of `VirtualService`, following istiod: hosts and gateways, every HTTP, TLS and TCP
//! rule, `exportTo`, and the warnings about rules and matches that can never be reached.
//!
//! istiod's `gatewaySemantics` (relaxed rules for resources it converts from the Gateway API) is
//! never on here: PCP only sees resources users write.

mod headers;
mod hosts;
mod http;
pub(super) mod re2;
mod unreachable;

use std::collections::BTreeMap;

use pasa_istio::virtual_service::{
    Destination, L4MatchAttributes, RouteDestination, TcpRoute, TlsMatchAttributes, TlsRoute,
    VirtualService,
};
use pasa_proto::Object;

use super::common::{
    self, Check, ExportToRules, is_dns1123_label, validate_fqdn, validate_ip_address,
    validate_ip_subnet, validate_labels, validate_port, validate_wildcard_domain,
};
use super::{Path, Report, parse};

/// The gateway name that stands for every sidecar of the mesh.
pub(crate) const MESH_GATEWAY: &str = "mesh";

/// Prefix of the SNI names istiod generates for `AUTO_PASSTHROUGH` gateways.
const AUTO_SNI_PREFIX: &str = "outbound_";

/// Checks one VirtualService.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(vs) = parse::<VirtualService>(obj, report) else {
        return;
    };
    validate_spec(&vs, &obj.namespace, report);
}

/// Checks a parsed VirtualService of `namespace`.
pub fn validate_spec(vs: &VirtualService, namespace: &str, report: &mut Report) {
    let spec = Path::spec();
    let is_delegate = vs.hosts.is_empty();
    if is_delegate {
        // A VirtualService without hosts is a delegate: only HTTP rules, reached through a root.
        if !vs.gateways.is_empty() {
            report.error(
                &spec.field("gateways"),
                "a delegate virtual service (one without hosts) must not name gateways",
            );
        }
        if !vs.tls.is_empty() {
            report.error(
                &spec.field("tls"),
                "a delegate virtual service (one without hosts) must have no tls route: only http routes can be delegated",
            );
        }
        if !vs.tcp.is_empty() {
            report.error(
                &spec.field("tcp"),
                "a delegate virtual service (one without hosts) must have no tcp route: only http routes can be delegated",
            );
        }
    }

    let bound_to_gateway = !vs.gateways.is_empty() && is_gateway_bound(vs);
    let applies_to_mesh = !bound_to_gateway;
    if !vs.gateways.is_empty() {
        validate_gateway_names(&spec.field("gateways"), &vs.gateways, report);
    }

    if !bound_to_gateway {
        for (i, route) in vs.http.iter().enumerate() {
            for (j, m) in route.matches.iter().enumerate() {
                let at = spec.field("http").index(i).field("match").index(j);
                for (field, map) in [
                    ("headers", &m.headers),
                    ("withoutHeaders", &m.without_headers),
                ] {
                    for key in map.keys().filter(|k| headers::is_jwt_claim(k)) {
                        report.error(
                            &at.field(field).key(key),
                            format!(
                                "JWT claim based routing (key: {key}) is only supported for gateways, and this virtual service applies to the mesh (gateways: [{}])",
                                vs.gateways.join(", ")
                            ),
                        );
                    }
                }
            }
        }
    }

    let mut all_hosts_valid = true;
    let uses_sni = vs
        .tls
        .iter()
        .flat_map(|t| &t.matches)
        .any(|m| !m.sni_hosts.is_empty());
    for (i, host) in vs.hosts.iter().enumerate() {
        let at = spec.field("hosts").index(i);
        let check = if bound_to_gateway {
            validate_gateway_bound_domain(uses_sni, host)
        } else {
            validate_wildcard_domain(host)
        };
        match check {
            Err(e) if validate_ip_address(host).is_err() => {
                report.error(&at, e);
                all_hosts_valid = false;
            }
            Err(_) => {}
            Ok(()) if applies_to_mesh && host == "*" => {
                report.error(
                    &at,
                    "wildcard host * is not allowed for virtual services bound to the mesh gateway",
                );
                all_hosts_valid = false;
            }
            Ok(()) => {}
        }
    }
    if all_hosts_valid {
        let (pairs, more) = hosts::overlapping_pairs(&vs.hosts, hosts::MAX_REPORTED_PAIRS);
        for (i, j) in pairs {
            report.error(
                &spec.field("hosts").index(j),
                format!(
                    "duplicate hosts in virtual service: {} & {}",
                    vs.hosts[i], vs.hosts[j]
                ),
            );
        }
        if more {
            report.error(
                &spec.field("hosts"),
                format!(
                    "more duplicate hosts in virtual service than the first {} listed: give each host once",
                    hosts::MAX_REPORTED_PAIRS
                ),
            );
        }
    }

    if vs.http.is_empty() && vs.tcp.is_empty() && vs.tls.is_empty() {
        report.error(
            &spec,
            "http, tcp or tls must be provided in virtual service",
        );
    }
    for (i, route) in vs.http.iter().enumerate() {
        http::validate_http_route(&spec.field("http").index(i), route, is_delegate, report);
    }
    let within = hosts::Within::new(&vs.hosts);
    for (i, route) in vs.tls.iter().enumerate() {
        validate_tls_route(&spec.field("tls").index(i), route, vs, &within, report);
    }
    for (i, route) in vs.tcp.iter().enumerate() {
        validate_tcp_route(&spec.field("tcp").index(i), route, report);
    }

    common::validate_export_to(
        &spec.field("exportTo"),
        namespace,
        &vs.export_to,
        ExportToRules::default(),
        report,
    );

    unreachable::analyze(vs, report);
}

/// Whether the VirtualService applies to gateways only: it names gateways and `mesh` is not among
/// them.
fn is_gateway_bound(vs: &VirtualService) -> bool {
    !vs.gateways.iter().any(|g| g == MESH_GATEWAY)
}

/// A host or SNI name of a VirtualService bound to gateways. With SNI routing, the names istiod
/// generates for `AUTO_PASSTHROUGH` (`outbound_.<port>_._.<host>`) are allowed as well.
fn validate_gateway_bound_domain(sni: bool, domain: &str) -> Check {
    if sni && domain.starts_with(AUTO_SNI_PREFIX) {
        if domain.len() > 255 {
            return Err(format!("domain name {domain:?} too long (max 255)"));
        }
        let format = "outbound_.<PORT>_._.<HOSTNAME>";
        let parts: Vec<&str> = domain.split('_').collect();
        if parts.len() < 4 {
            return Err(format!(
                "domain name {domain} invalid, should follow '{format}' format"
            ));
        }
        let port = parts[1].trim_matches('.');
        let hostname = parts[3].trim_matches('.');
        if !port.bytes().any(|b| b.is_ascii_digit()) {
            return Err(format!(
                "domain name {domain:?} invalid (label {port:?} invalid). should follow {format} format"
            ));
        }
        if !hostname.bytes().any(|b| b.is_ascii_alphabetic()) {
            return Err(format!(
                "domain name {domain:?} invalid (label {hostname:?} invalid). should follow {format} format"
            ));
        }
        return Ok(());
    }
    validate_wildcard_domain(domain)
}

/// Whether host `a` lies within host `b`: equal, or covered by `b`'s wildcard (a wildcard is
/// within another only if it is at least as narrow). The definition [`hosts::Within`] indexes.
#[cfg(test)]
pub(crate) fn host_subset_of(a: &str, b: &str) -> bool {
    match (a.strip_prefix('*'), b.strip_prefix('*')) {
        (Some(sa), Some(sb)) => a.len() >= b.len() && sa.ends_with(sb),
        (Some(_), None) => false,
        (None, Some(sb)) => a.ends_with(sb),
        (None, None) => a == b,
    }
}

/// Gateway references: `namespace/name`, or (older form) a bare name or `name.namespace` FQDN.
///
/// As istiod does, checking stops at the first reference without a `/`.
pub(crate) fn validate_gateway_names(at: &Path, names: &[String], report: &mut Report) {
    for (i, name) in names.iter().enumerate() {
        let here = at.index(i);
        let Some((ns, gw)) = name.split_once('/') else {
            if name.contains('.') {
                let mut parts = name.split('.');
                let first = parts.next().unwrap_or_default();
                let second = parts.next().unwrap_or_default();
                report.warn(
                    &here,
                    format!(
                        "using legacy gatewayName format {name:?}; prefer the <namespace>/<name> format: \"{second}/{first}\""
                    ),
                );
            }
            report.check(&here, validate_fqdn(name));
            return;
        };
        if ns.is_empty() || gw.is_empty() {
            report.error(&here, "config namespace and gateway name cannot be empty");
        }
        if !is_dns1123_label(ns) {
            report.error(&here, format!("invalid value for namespace: {ns:?}"));
        }
        if !is_dns1123_label(gw) {
            report.error(&here, format!("invalid value for gateway name: {gw:?}"));
        }
    }
}

/// A destination: a service host (never `*`), a subset name, a port number.
pub(crate) fn validate_destination(at: &Path, destination: &Destination, report: &mut Report) {
    if destination.host == "*" {
        report.error(
            &at.field("host"),
            "invalid destination host *: a destination must name one service",
        );
    } else {
        report.check(
            &at.field("host"),
            validate_wildcard_domain(&destination.host),
        );
    }
    if !destination.subset.is_empty() && !is_dns1123_label(&destination.subset) {
        report.error(
            &at.field("subset"),
            format!("subset name is invalid: {}", destination.subset),
        );
    }
    if let Some(port) = &destination.port {
        report.check(
            &at.field("port").field("number"),
            validate_port(i64::from(port.number)),
        );
    }
}

/// A destination's weight may not be negative.
pub(crate) fn validate_weight(at: &Path, weight: i32, report: &mut Report) {
    if weight < 0 {
        report.error(&at.field("weight"), format!("weight {weight} < 0"));
    }
}

/// Several destinations need a positive total weight. (istiod sums in 32 bits, wrapping.)
pub(crate) fn validate_total_weight(
    at: &Path,
    weights: impl ExactSizeIterator<Item = i32>,
    report: &mut Report,
) {
    let count = weights.len();
    let total = weights.fold(0i32, i32::wrapping_add);
    if count > 1 && total == 0 {
        report.error(
            at,
            "total destination weight = 0: give at least one destination a positive weight",
        );
    }
}

fn validate_route_destinations(at: &Path, route: &[RouteDestination], report: &mut Report) {
    for (i, rd) in route.iter().enumerate() {
        let here = at.index(i);
        match &rd.destination {
            Some(d) => validate_destination(&here.field("destination"), d, report),
            None => report.error(&here.field("destination"), "destination is required"),
        }
        validate_weight(&here, rd.weight, report);
    }
    validate_total_weight(at, route.iter().map(|rd| rd.weight), report);
}

/// Most hosts a message lists; a longer list ends with how many there are.
const MAX_LISTED_HOSTS: usize = 10;

/// `hosts` joined with commas, the first [`MAX_LISTED_HOSTS`] of them when there are more.
fn listed(hosts: &[String]) -> String {
    if hosts.len() <= MAX_LISTED_HOSTS {
        return hosts.join(", ");
    }
    format!(
        "{}, … ({} hosts)",
        hosts[..MAX_LISTED_HOSTS].join(", "),
        hosts.len()
    )
}

fn validate_tls_route(
    at: &Path,
    route: &TlsRoute,
    vs: &VirtualService,
    within: &hosts::Within<'_>,
    report: &mut Report,
) {
    if route.matches.is_empty() {
        report.error(
            &at.field("match"),
            "TLS route must have at least one match condition",
        );
    }
    for (i, m) in route.matches.iter().enumerate() {
        validate_tls_match(&at.field("match").index(i), m, vs, within, report);
    }
    if route.route.is_empty() {
        report.error(&at.field("route"), "TLS route is required");
    }
    validate_route_destinations(&at.field("route"), &route.route, report);
}

fn validate_tls_match(
    at: &Path,
    m: &TlsMatchAttributes,
    vs: &VirtualService,
    within: &hosts::Within<'_>,
    report: &mut Report,
) {
    if m.sni_hosts.is_empty() {
        report.error(
            &at.field("sniHosts"),
            "TLS match must have at least one SNI host",
        );
    }
    for (i, sni) in m.sni_hosts.iter().enumerate() {
        validate_sni_host(&at.field("sniHosts").index(i), sni, vs, within, report);
    }
    validate_connection_match(at, &m.destination_subnets, m.port, &m.source_labels, report);
    validate_gateway_names(&at.field("gateways"), &m.gateways, report);
}

fn validate_sni_host(
    at: &Path,
    sni: &str,
    vs: &VirtualService,
    within: &hosts::Within<'_>,
    report: &mut Report,
) {
    let check = if is_gateway_bound(vs) {
        validate_gateway_bound_domain(true, sni)
    } else {
        validate_wildcard_domain(sni)
    };
    if let Err(e) = check {
        if validate_ip_address(sni).is_ok() {
            report.warn(
                at,
                format!(
                    "using an IP address ({sni:?}) goes against SNI spec and most clients do not support this"
                ),
            );
        } else {
            report.error(at, e);
        }
        return;
    }
    if !within.contains(sni) {
        report.error(
            at,
            format!(
                "SNI host {sni:?} is not a compatible subset of any of the virtual service hosts: [{}]",
                listed(&vs.hosts)
            ),
        );
    }
}

fn validate_tcp_route(at: &Path, route: &TcpRoute, report: &mut Report) {
    for (i, m) in route.matches.iter().enumerate() {
        validate_l4_match(&at.field("match").index(i), m, report);
    }
    if route.route.is_empty() {
        report.error(&at.field("route"), "TCP route is required");
    }
    validate_route_destinations(&at.field("route"), &route.route, report);
}

/// What TLS and TCP matches share: destination subnets, port, source labels.
fn validate_connection_match(
    at: &Path,
    destination_subnets: &[String],
    port: u32,
    source_labels: &BTreeMap<String, String>,
    report: &mut Report,
) {
    for (i, subnet) in destination_subnets.iter().enumerate() {
        report.check(
            &at.field("destinationSubnets").index(i),
            validate_ip_subnet(subnet),
        );
    }
    if port != 0 {
        report.check(&at.field("port"), validate_port(i64::from(port)));
    }
    validate_labels(&at.field("sourceLabels"), source_labels, report);
}

fn validate_l4_match(at: &Path, m: &L4MatchAttributes, report: &mut Report) {
    validate_connection_match(at, &m.destination_subnets, m.port, &m.source_labels, report);
    // istiod reports only the errors of a TCP match's gateway names, not the warnings.
    validate_gateway_names_errors_only(&at.field("gateways"), &m.gateways, report);
}

/// [`validate_gateway_names`] keeping only the errors: istiod drops these warnings inside HTTP and
/// TCP matches.
pub(crate) fn validate_gateway_names_errors_only(at: &Path, names: &[String], report: &mut Report) {
    let mut scratch = Report::default();
    validate_gateway_names(at, names, &mut scratch);
    report.errors.extend(scratch.errors);
}

#[cfg(test)]
mod tests;
