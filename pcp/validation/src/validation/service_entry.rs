//! Validation of `ServiceEntry`, following istiod's webhook and the CRD schema (limits and CEL
//! rules the API server would enforce first).

use std::collections::BTreeSet;

use pasa_istio::common::Protocol;
use pasa_istio::service_entry::{
    Location, Resolution, ServiceEntry, ServicePort, WorkloadSelector,
};
use pasa_proto::Object;

use super::common::{
    ExportToRules, validate_export_to, validate_fqdn, validate_ip_address, validate_ip_subnet,
    validate_labels, validate_partial_wildcard, validate_port, validate_port_name,
    validate_protocol, validate_selector_label_limits, validate_selector_labels,
    validate_wildcard_domain,
};
use super::workload_entry::{
    EndpointContext, validate_endpoint_ports, validate_entry_limits, validate_workload_entry,
};
use super::{Path, Report, parse};

/// The CRD's caps on list sizes and string lengths.
const MAX_HOSTS: usize = 256;
const MAX_ADDRESSES: usize = 256;
const MAX_ADDRESS_LENGTH: usize = 64;
const MAX_PORTS: usize = 256;
const MAX_PORT_FIELD_LENGTH: usize = 256;
const MAX_ENDPOINTS: usize = 4096;
const MAX_SELECTOR_LABELS: usize = 256;

/// The label by which a ServiceEntry opts out of automatic VIP allocation (value `false`).
const AUTOALLOCATE_LABEL: &str = "networking.istio.io/enable-autoallocate-ip";
/// The label that binds a resource to a waypoint proxy (`none` opts out).
const USE_WAYPOINT_LABEL: &str = "istio.io/use-waypoint";

/// Checks one ServiceEntry.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(se) = parse::<ServiceEntry>(obj, report) else {
        return;
    };
    let spec = Path::spec();

    // A broken selector stops the review there, as in istiod.
    if let Some(selector) = &se.workload_selector
        && !validate_workload_selector(&spec.field("workloadSelector"), selector, report)
    {
        return;
    }
    if se.workload_selector.is_some() && !se.endpoints.is_empty() {
        report.error(
            &spec,
            "only one of workloadSelector or endpoints can be set in a service entry",
        );
    }

    if se.endpoints.len() > MAX_ENDPOINTS {
        report.error(
            &spec.field("endpoints"),
            format!("at most {MAX_ENDPOINTS} endpoints are allowed"),
        );
    }
    validate_hosts(&spec, &se, report);
    validate_addresses(&spec, &se, report);
    let service_ports = validate_ports(&spec, obj, &se, report);

    match se.resolution {
        Resolution::None => {
            if !se.endpoints.is_empty() {
                report.error(
                    &spec.field("endpoints"),
                    "NONE mode cannot set endpoints: no endpoints should be provided for resolution type NONE",
                );
            }
            if se.workload_selector.is_some() {
                report.warn(
                    &spec.field("workloadSelector"),
                    "workloadSelector should not be set when resolution mode is NONE",
                );
            }
        }
        Resolution::Static => {
            let context = EndpointContext::StaticServiceEntry {
                service_ports: &service_ports,
            };
            for (i, endpoint) in se.endpoints.iter().enumerate() {
                let at = spec.field("endpoints").index(i);
                validate_workload_entry(&at, endpoint, context, report);
            }
        }
        Resolution::Dns | Resolution::DnsRoundRobin => {
            validate_dns(&spec, &se, &service_ports, report);
        }
        Resolution::DynamicDns => validate_dynamic_dns(&spec, obj, &se, report),
        Resolution::Unknown(n) => report.error(
            &spec.field("resolution"),
            format!(
                "unsupported resolution type {n}: expected one of {}",
                Resolution::NAMES.join(", ")
            ),
        ),
    }
    if location_is_unknown(se.location) {
        report.error(
            &spec.field("location"),
            format!(
                "unknown location {}: expected one of {}",
                se.location,
                Location::NAMES.join(", ")
            ),
        );
    }

    // Plain TCP cannot tell hosts apart (HTTP has the authority, TLS the SNI); only NONE, which
    // ignores the hosts, may mix them.
    if se.resolution != Resolution::None && se.hosts.len() > 1 {
        let opaque = se
            .ports
            .iter()
            .position(|p| !Protocol::parse(&p.protocol).is_some_and(|p| p.is_http() || p.is_tls()));
        if let Some(i) = opaque {
            report.error(
                &spec.field("ports").index(i),
                "multiple hosts provided with non-HTTP, non-TLS ports",
            );
        }
    }

    validate_export_to(
        &spec.field("exportTo"),
        &obj.namespace,
        &se.export_to,
        ExportToRules {
            is_service_entry: true,
            ..Default::default()
        },
        report,
    );
}

fn location_is_unknown(location: Location) -> bool {
    matches!(location, Location::Unknown(_))
}

/// The selector's labels; `false` when they are broken (the caller stops there).
fn validate_workload_selector(at: &Path, selector: &WorkloadSelector, report: &mut Report) -> bool {
    let at = at.field("labels");
    let mut own = Report::default();
    validate_selector_labels(&at, &selector.labels, &mut own);
    validate_selector_label_limits(&at, &selector.labels, MAX_SELECTOR_LABELS, &mut own);
    let ok = own.errors.is_empty();
    if ok {
        report.warnings.append(&mut own.warnings);
    } else {
        report.errors.append(&mut own.errors);
    }
    ok
}

fn validate_hosts(spec: &Path, se: &ServiceEntry, report: &mut Report) {
    let at = spec.field("hosts");
    if se.hosts.is_empty() {
        report.error(&at, "service entry must have at least one host");
    }
    if se.hosts.len() > MAX_HOSTS {
        report.error(&at, format!("at most {MAX_HOSTS} hosts are allowed"));
    }
    for (i, host) in se.hosts.iter().enumerate() {
        let here = at.index(i);
        if host == "*" {
            report.error(
                &here,
                "invalid host *: hostname cannot be wildcard (a service entry needs a domain)",
            );
            continue;
        }
        report.check(&here, validate_wildcard_domain(host));
        // Only DYNAMIC_DNS can serve `*foo.com`-style hosts; elsewhere they are accepted but odd.
        if se.resolution != Resolution::DynamicDns
            && let Err(e) = validate_partial_wildcard(host)
        {
            report.warn(&here, e);
        }
    }
}

fn validate_addresses(spec: &Path, se: &ServiceEntry, report: &mut Report) {
    let at = spec.field("addresses");
    if se.addresses.len() > MAX_ADDRESSES {
        report.error(
            &at,
            format!("at most {MAX_ADDRESSES} addresses are allowed"),
        );
    }
    for (i, address) in se.addresses.iter().enumerate() {
        let here = at.index(i);
        report.check(&here, validate_ip_subnet(address));
        if address.len() > MAX_ADDRESS_LENGTH {
            report.error(
                &here,
                format!("address may be at most {MAX_ADDRESS_LENGTH} characters long"),
            );
        }
    }
    let has_cidr = se.addresses.iter().any(|a| a.contains('/'));
    if has_cidr && !matches!(se.resolution, Resolution::None | Resolution::Static) {
        report.error(
            &at,
            format!(
                "CIDR addresses are allowed only for NONE/STATIC resolution types, not {}",
                se.resolution
            ),
        );
    }
}

/// Whether istiod will give the service a virtual IP itself (so TCP ports need no `addresses`).
fn auto_allocates_address(obj: &Object, se: &ServiceEntry) -> bool {
    se.resolution != Resolution::None
        && !obj
            .labels
            .get(AUTOALLOCATE_LABEL)
            .is_some_and(|v| v.eq_ignore_ascii_case("false"))
        && se.addresses.is_empty()
}

/// The ports; returns their names, which endpoints refer to.
fn validate_ports<'a>(
    spec: &Path,
    obj: &Object,
    se: &'a ServiceEntry,
    report: &mut Report,
) -> BTreeSet<&'a str> {
    let at = spec.field("ports");
    if se.ports.len() > MAX_PORTS {
        report.error(&at, format!("at most {MAX_PORTS} ports are allowed"));
    }
    let auto_allocation = auto_allocates_address(obj, se);
    let mut names = BTreeSet::new();
    let mut numbers = BTreeSet::new();
    for (i, port) in se.ports.iter().enumerate() {
        let here = at.index(i);
        if !names.insert(port.name.as_str()) {
            report.error(
                &here.field("name"),
                format!(
                    "duplicate port name {:?}: already defined by another port",
                    port.name
                ),
            );
        }
        if !numbers.insert(port.number) {
            report.error(
                &here.field("number"),
                format!(
                    "port number cannot be duplicated: port {} is already defined",
                    port.number
                ),
            );
        }
        if port.target_port != 0 {
            report.check(
                &here.field("targetPort"),
                validate_port(i64::from(port.target_port)),
            );
        }
        if se.addresses.is_empty()
            && !auto_allocation
            && (port.protocol.is_empty() || port.protocol == "TCP")
        {
            report.warn(
                &here,
                "addresses are required for ports serving TCP (or unset) protocol when IP \
                 autoallocation is not enabled",
            );
        }
        validate_port_fields(&here, port, report);
    }
    names
}

fn validate_port_fields(at: &Path, port: &ServicePort, report: &mut Report) {
    report.check(&at.field("name"), validate_port_name(&port.name));
    report.check(&at.field("protocol"), validate_protocol(&port.protocol));
    report.check(&at.field("number"), validate_port(i64::from(port.number)));
    for (field, value) in [("name", &port.name), ("protocol", &port.protocol)] {
        if value.len() > MAX_PORT_FIELD_LENGTH {
            report.error(
                &at.field(field),
                format!("{field} may be at most {MAX_PORT_FIELD_LENGTH} characters long"),
            );
        }
    }
}

/// DNS and DNS_ROUND_ROBIN: resolvable hosts or endpoints.
fn validate_dns(
    spec: &Path,
    se: &ServiceEntry,
    service_ports: &BTreeSet<&str>,
    report: &mut Report,
) {
    if se.endpoints.is_empty() {
        // Without endpoints the hosts themselves are resolved: they must be names, not wildcards.
        if let Some((i, e)) = se
            .hosts
            .iter()
            .enumerate()
            .find_map(|(i, h)| validate_fqdn(h).err().map(|e| (i, e)))
        {
            report.error(
                &spec.field("hosts").index(i),
                format!(
                    "hosts must be FQDN or contain only prefix wildcards if no endpoints are \
                     provided for resolution mode {}: {e}",
                    se.resolution
                ),
            );
        }
    }
    if se.resolution == Resolution::DnsRoundRobin && se.endpoints.len() > 1 {
        report.error(
            &spec.field("endpoints"),
            "DNS_ROUND_ROBIN mode cannot have multiple endpoints: there must only be 0 or 1 \
             endpoint for resolution mode DNS_ROUND_ROBIN",
        );
    }
    for (i, endpoint) in se.endpoints.iter().enumerate() {
        let at = spec.field("endpoints").index(i);
        let address = endpoint.address.as_str();
        if validate_ip_address(address).is_err() && validate_fqdn(address).is_err() {
            report.error(
                &at.field("address"),
                format!("endpoint address {address:?} is not a valid FQDN or an IP address"),
            );
        }
        validate_entry_limits(&at, endpoint, report);
        validate_labels(&at.field("labels"), &endpoint.labels, report);
        validate_endpoint_ports(&at, endpoint, Some(service_ports), report);
    }
    if !se.addresses.is_empty()
        && se.hosts.len() > 1
        && se
            .ports
            .iter()
            .any(|p| Protocol::parse(&p.protocol).is_some_and(Protocol::is_tcp))
    {
        report.warn(
            &spec.field("hosts"),
            "service entry can not have more than one host specified simultaneously with address \
             and tcp port",
        );
    }
}

/// DYNAMIC_DNS: wildcard hosts resolved per request; no addresses or endpoints.
fn validate_dynamic_dns(spec: &Path, obj: &Object, se: &ServiceEntry, report: &mut Report) {
    let mode = se.resolution;
    if se.hosts.is_empty() {
        report.error(
            &spec.field("hosts"),
            format!("at least one wildcard host must be provided for resolution type {mode}"),
        );
    }
    for (i, host) in se.hosts.iter().enumerate() {
        if !host.starts_with('*') {
            report.error(
                &spec.field("hosts").index(i),
                format!("host must be wildcarded for resolution mode {mode}"),
            );
        }
    }
    if !se.addresses.is_empty() {
        report.error(
            &spec.field("addresses"),
            format!(
                "addresses cannot be set for resolution type {mode}: HTTP route domains are only \
                 generated from the hosts"
            ),
        );
    }
    if !se.endpoints.is_empty() {
        report.error(
            &spec.field("endpoints"),
            format!(
                "endpoints cannot be set for resolution type {mode}: the destination address is \
                 resolved from the host of each request"
            ),
        );
    }
    for (i, port) in se.ports.iter().enumerate() {
        let supported = matches!(
            Protocol::parse(&port.protocol),
            Some(Protocol::Http | Protocol::Tls | Protocol::Grpc | Protocol::Http2)
        );
        if !supported {
            report.error(
                &spec.field("ports").index(i).field("protocol"),
                format!("only HTTP, TLS, GRPC, and HTTP2 protocols are supported for resolution type {mode}"),
            );
        }
    }
    if se.location == Location::MeshInternal && uses_waypoint(obj) {
        report.error(
            &spec.field("location"),
            format!(
                "location MESH_INTERNAL with resolution type {mode} is not supported when using waypoints"
            ),
        );
    }
}

/// Whether the resource is bound to a waypoint by its `istio.io/use-waypoint` label.
fn uses_waypoint(obj: &Object) -> bool {
    obj.labels
        .get(USE_WAYPOINT_LABEL)
        .is_some_and(|v| !v.is_empty() && !v.eq_ignore_ascii_case("none"))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn check_with_labels(spec: Value, labels: Value) -> Report {
        let doc = json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "ServiceEntry",
            "metadata": {"name": "se", "namespace": "ns", "labels": labels},
            "spec": spec,
        });
        let obj = Object::from_json(&doc, "default", pasa_istio::generated::is_generated_object)
            .expect("a well-formed object");
        let mut report = Report::default();
        validate(&obj, &mut report);
        report
    }

    fn check(spec: Value) -> Report {
        check_with_labels(spec, json!({}))
    }

    fn fields(problems: &[super::super::Problem]) -> Vec<&str> {
        problems.iter().map(|p| p.field.as_str()).collect()
    }

    #[test]
    fn a_broken_selector_ends_the_review() {
        let r = check(json!({"hosts": ["*"], "workloadSelector": {"labels": {"app": "*"}}}));
        assert_eq!(fields(&r.errors), ["spec.workloadSelector.labels[app]"]);
        assert!(r.warnings.is_empty());
    }

    #[test]
    fn dns_without_endpoints_resolves_the_hosts() {
        let r = check(json!({"hosts": ["*.example.com"], "resolution": "DNS",
                             "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}]}));
        assert_eq!(fields(&r.errors), ["spec.hosts[0]"]);
        let r = check(json!({"hosts": ["*.example.com"], "resolution": "DNS",
                             "endpoints": [{"address": "api.example.com", "ports": {"http": 8080}}],
                             "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}]}));
        assert!(r.is_valid(), "{:?}", r.errors);
    }

    #[test]
    fn several_hosts_need_http_or_tls_ports() {
        let spec = json!({"hosts": ["a.example.com", "b.example.com"], "resolution": "DNS",
                          "ports": [{"number": 80, "name": "http", "protocol": "HTTP"},
                                    {"number": 5432, "name": "db", "protocol": "TCP"}]});
        let r = check(spec);
        assert_eq!(fields(&r.errors), ["spec.ports[1]"]);
    }

    #[test]
    fn tcp_ports_without_addresses_warn_unless_allocated() {
        let spec = json!({"hosts": ["db.example.com"], "resolution": "DNS",
                          "ports": [{"number": 5432, "name": "db", "protocol": "TCP"}]});
        assert!(check(spec.clone()).warnings.is_empty());
        let opted_out = check_with_labels(
            spec,
            json!({"networking.istio.io/enable-autoallocate-ip": "False"}),
        );
        assert_eq!(fields(&opted_out.warnings), ["spec.ports[0]"]);
    }

    #[test]
    fn dynamic_dns_and_waypoints() {
        let spec = json!({"hosts": ["*.example.com"], "resolution": "DYNAMIC_DNS",
                          "location": "MESH_INTERNAL",
                          "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}]});
        assert!(check(spec.clone()).is_valid());
        let r = check_with_labels(spec, json!({"istio.io/use-waypoint": "wp"}));
        assert_eq!(fields(&r.errors), ["spec.location"]);
    }
}
