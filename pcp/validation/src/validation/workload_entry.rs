//! Validation of `WorkloadEntry`, following istiod's webhook and the CRD schema. The same rules
//! check the endpoints of a STATIC ServiceEntry (see [`validate_workload_entry`]).

use std::collections::BTreeSet;

use pasa_istio::workload_entry::{UNIX_ADDRESS_PREFIX, WorkloadEntry};
use pasa_proto::Object;

use super::common::{
    Check, validate_fqdn, validate_ip_address, validate_labels, validate_port, validate_port_name,
};
use super::{Path, Report, parse};

/// The CRD's caps on string fields and maps.
const MAX_ADDRESS_LENGTH: usize = 256;
const MAX_NETWORK_LENGTH: usize = 2048;
const MAX_LOCALITY_LENGTH: usize = 2048;
const MAX_SERVICE_ACCOUNT_LENGTH: usize = 253;
const MAX_PORTS: usize = 128;
const MAX_LABELS: usize = 256;
/// The CRD wants port names strictly shorter than a DNS label's 63 characters.
const MAX_PORT_NAME_LENGTH: usize = 62;

/// Checks one WorkloadEntry.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(entry) = parse::<WorkloadEntry>(obj, report) else {
        return;
    };
    validate_workload_entry(&Path::spec(), &entry, EndpointContext::Standalone, report);
}

/// Where a WorkloadEntry message is checked.
#[derive(Debug, Clone, Copy)]
pub(crate) enum EndpointContext<'a> {
    /// A WorkloadEntry resource: the address may be an IP, a DNS name or a Unix socket; port
    /// names are not checked against any service.
    Standalone,
    /// An endpoint of a STATIC ServiceEntry with these port names: the address must be an IP or a
    /// Unix socket, and port names must be the service's.
    StaticServiceEntry {
        service_ports: &'a BTreeSet<&'a str>,
    },
}

/// A workload entry (a resource's spec, or a ServiceEntry endpoint at `at`). Shared with
/// ServiceEntry.
pub(crate) fn validate_workload_entry(
    at: &Path,
    entry: &WorkloadEntry,
    context: EndpointContext<'_>,
    report: &mut Report,
) {
    let service_ports = match context {
        EndpointContext::Standalone => None,
        EndpointContext::StaticServiceEntry { service_ports } => Some(service_ports),
    };
    validate_entry_limits(at, entry, report);

    let address = entry.address.as_str();
    if address.is_empty() {
        if entry.network.is_empty() {
            report.error(
                &at.field("address"),
                "address is required (or a network, for a workload behind a network gateway)",
            );
            return;
        }
        report.warn(
            &at.field("address"),
            format!(
                "address is unset with network {:?}: the workload is reached through the network's gateway",
                entry.network
            ),
        );
    }

    let unix_socket = entry.unix_socket();
    if let Some(socket) = unix_socket {
        report.check(&at.field("address"), validate_unix_address(socket));
        if !entry.ports.is_empty() {
            report.error(
                &at.field("ports"),
                format!("unix endpoint {address} must not include ports"),
            );
        }
    } else if !address.is_empty() && validate_ip_address(address).is_err() {
        if service_ports.is_some() {
            report.error(
                &at.field("address"),
                format!("endpoint address {address:?} is not a valid IP address"),
            );
        } else if validate_fqdn(address).is_err() {
            report.error(
                &at.field("address"),
                format!("endpoint address {address:?} is not a valid FQDN or an IP address"),
            );
        }
    }

    validate_endpoint_ports(at, entry, service_ports, report);
    validate_labels(&at.field("labels"), &entry.labels, report);
    if unix_socket.is_some()
        && let Some(ports) = service_ports
        && ports.len() != 1
    {
        report.error(
            &at.field("address"),
            format!(
                "exactly 1 service port required for unix endpoints, the service entry has {}",
                ports.len()
            ),
        );
    }
}

/// The port map of an endpoint: names the service defines (when known), valid names and numbers.
pub(crate) fn validate_endpoint_ports(
    at: &Path,
    entry: &WorkloadEntry,
    service_ports: Option<&BTreeSet<&str>>,
    report: &mut Report,
) {
    for (name, &port) in &entry.ports {
        let here = at.field("ports").key(name);
        if let Some(defined) = service_ports
            && !defined.contains(name.as_str())
        {
            report.error(
                &here,
                format!("endpoint port {port} is not defined by the service entry (no port named {name:?})"),
            );
        }
        report.check(&here, validate_port_name(name));
        if name.len() > MAX_PORT_NAME_LENGTH {
            report.error(
                &here,
                format!("port name must be valid: at most {MAX_PORT_NAME_LENGTH} characters"),
            );
        }
        report.check(&here, validate_port(i64::from(port)));
    }
}

/// The CRD's caps on sizes. Shared with ServiceEntry (its endpoints).
pub(crate) fn validate_entry_limits(at: &Path, entry: &WorkloadEntry, report: &mut Report) {
    for (field, value, max) in [
        ("address", &entry.address, MAX_ADDRESS_LENGTH),
        ("network", &entry.network, MAX_NETWORK_LENGTH),
        ("locality", &entry.locality, MAX_LOCALITY_LENGTH),
        (
            "serviceAccount",
            &entry.service_account,
            MAX_SERVICE_ACCOUNT_LENGTH,
        ),
    ] {
        if value.len() > max {
            report.error(
                &at.field(field),
                format!("{field} may be at most {max} characters long"),
            );
        }
    }
    if entry.ports.len() > MAX_PORTS {
        report.error(
            &at.field("ports"),
            format!("at most {MAX_PORTS} ports are allowed"),
        );
    }
    if entry.labels.len() > MAX_LABELS {
        report.error(
            &at.field("labels"),
            format!("at most {MAX_LABELS} labels are allowed"),
        );
    }
}

/// The part after `unix://`: an absolute file path (not a directory) or an `@abstract` socket.
pub(crate) fn validate_unix_address(socket: &str) -> Check {
    if socket.is_empty() {
        return Err(format!(
            "unix address must not be empty ({UNIX_ADDRESS_PREFIX}/path or {UNIX_ADDRESS_PREFIX}@name)"
        ));
    }
    if socket.starts_with('@') {
        return Ok(());
    }
    if !socket.starts_with('/') {
        return Err(format!(
            "UDS must be an absolute path or abstract socket: {socket} is not an absolute path to a file"
        ));
    }
    if socket.ends_with('/') {
        return Err(format!(
            "UDS may not be a dir: {socket} is not an absolute path to a file"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(entry: &WorkloadEntry, context: EndpointContext<'_>) -> Report {
        let mut r = Report::default();
        validate_workload_entry(&Path::spec(), entry, context, &mut r);
        r
    }

    #[test]
    fn unix_addresses() {
        assert!(validate_unix_address("/var/run/app.sock").is_ok());
        assert!(validate_unix_address("@abstract").is_ok());
        assert!(validate_unix_address("").is_err());
        assert!(validate_unix_address("relative").is_err());
        assert!(validate_unix_address("/dir/").is_err());
    }

    #[test]
    fn network_without_address_is_a_warning() {
        let entry = WorkloadEntry {
            network: "remote".into(),
            ..Default::default()
        };
        let r = run(&entry, EndpointContext::Standalone);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(r.warnings.len(), 1);
        let r = run(&WorkloadEntry::default(), EndpointContext::Standalone);
        assert_eq!(r.errors[0].field, "spec.address");
    }

    #[test]
    fn static_endpoints_need_ips_and_known_ports() {
        let ports = BTreeSet::from(["http"]);
        let context = EndpointContext::StaticServiceEntry {
            service_ports: &ports,
        };
        let mut entry = WorkloadEntry {
            address: "example.com".into(),
            ..Default::default()
        };
        assert!(run(&entry, EndpointContext::Standalone).is_valid());
        assert!(!run(&entry, context).is_valid());
        entry.address = "10.0.0.1".into();
        entry.ports.insert("grpc".into(), 8080);
        let r = run(&entry, context);
        assert_eq!(r.errors.len(), 1);
        assert_eq!(r.errors[0].field, "spec.ports[grpc]");
    }
}
