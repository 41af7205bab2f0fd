//! Validation of `Sidecar`, following istiod: the workload selector, inbound listeners (port, bind,
//! default endpoint, TLS, connection pool), outbound listeners (port or Unix socket, capture mode,
//! `namespace/host` imports) and the outbound traffic policy, plus the CRD schema's limits.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use pasa_istio::common::Protocol;
use pasa_istio::gateway::TlsMode;
use pasa_istio::service_entry::WorkloadSelector;
use pasa_istio::sidecar::{
    CaptureMode, IstioEgressListener, IstioIngressListener, OutboundTrafficPolicy,
    OutboundTrafficPolicyMode, Sidecar, SidecarPort,
};
use pasa_istio::workload_entry::UNIX_ADDRESS_PREFIX;
use pasa_proto::Object;

use super::common::{
    validate_fqdn, validate_ip_address, validate_namespace_slash_wildcard_hostname, validate_port,
    validate_port_name, validate_protocol, validate_selector_label_limits,
    validate_selector_labels,
};
use super::destination_rule::validate_connection_pool;
use super::gateway::validate_server_tls;
use super::virtual_service::validate_destination;
use super::workload_entry::validate_unix_address;
use super::{Path, Report, parse};

/// The CRD's limits on a workload selector.
const MAX_SELECTOR_LABELS: usize = 256;

/// `ALLOW_ANY_DYNAMIC_DNS`: a mesh-wide outbound mode with no name in the Sidecar API.
const ALLOW_ANY_DYNAMIC_DNS: i32 = 3;

/// The hosts a default endpoint may name (with a port), besides `unix://` paths.
const DEFAULT_ENDPOINT_HOSTS: [&str; 4] = ["127.0.0.1", "0.0.0.0", "::1", "::"];

/// Checks one Sidecar.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(sidecar) = parse::<Sidecar>(obj, report) else {
        return;
    };
    let spec = Path::spec();
    if let Some(selector) = &sidecar.workload_selector {
        validate_sidecar_selector(&spec.field("workloadSelector"), selector, report);
    }
    if sidecar.ingress.is_empty()
        && sidecar.egress.is_empty()
        && sidecar.outbound_traffic_policy.is_none()
        && sidecar.inbound_connection_pool.is_none()
    {
        report.error(
            &spec,
            "sidecar: empty configuration provided: set at least one of ingress, egress, outboundTrafficPolicy, inboundConnectionPool",
        );
        return;
    }

    let ingress = spec.field("ingress");
    let mut ports = HashSet::new();
    for (i, listener) in sidecar.ingress.iter().enumerate() {
        validate_ingress(&ingress.index(i), listener, &mut ports, report);
    }
    if let Some(pool) = &sidecar.inbound_connection_pool {
        validate_connection_pool(&spec.field("inboundConnectionPool"), pool, report);
    }

    let egress = spec.field("egress");
    let mut ports = HashSet::new();
    let mut sockets = HashSet::new();
    for (i, listener) in sidecar.egress.iter().enumerate() {
        let at = egress.index(i);
        let is_last = i + 1 == sidecar.egress.len();
        validate_egress(&at, listener, is_last, (&mut ports, &mut sockets), report);
        validate_egress_hosts(&at.field("hosts"), &listener.hosts, &obj.namespace, report);
    }

    if let Some(policy) = &sidecar.outbound_traffic_policy {
        validate_outbound_traffic_policy(&spec.field("outboundTrafficPolicy"), policy, report);
    }
}

/// A selector without labels applies the Sidecar to every workload of the namespace: allowed, with
/// a warning.
fn validate_sidecar_selector(at: &Path, selector: &WorkloadSelector, report: &mut Report) {
    let labels = at.field("labels");
    let mut found = Report::default();
    validate_selector_labels(&labels, &selector.labels, &mut found);
    validate_selector_label_limits(&labels, &selector.labels, MAX_SELECTOR_LABELS, &mut found);
    report.errors.extend(found.errors);
    if !found.warnings.is_empty() {
        report.warn(
            at,
            "sidecar: workload selector specified without labels, will be applied to all services in namespace",
        );
    }
}

/// A listener on an IP (not a Unix socket): a real port, an IP `bind`, and a port no other
/// `direction` (ingress or egress) listener of the Sidecar uses.
fn check_ip_bound_port(
    at: &Path,
    port: &SidecarPort,
    bind: &str,
    ports: &mut HashSet<u32>,
    direction: &str,
    report: &mut Report,
) {
    let number_at = at.field("port").field("number");
    report.check(&number_at, validate_port(i64::from(port.number)));
    if !bind.is_empty() {
        report.check(&at.field("bind"), validate_ip_address(bind));
    }
    if !ports.insert(port.number) {
        report.error(
            &number_at,
            format!(
                "sidecar: ports on IP bound listeners must be unique: port {} is used by another {direction} listener",
                port.number
            ),
        );
    }
}

fn check_capture_mode(at: &Path, mode: CaptureMode, report: &mut Report) {
    if let CaptureMode::Unknown(n) = mode {
        report.error(
            at,
            format!(
                "unknown capture mode {n}: expected one of {}",
                CaptureMode::NAMES.join(", ")
            ),
        );
    }
}

/// The checks every Sidecar port gets: an optional DNS-label name, a known protocol (or none), no
/// `targetPort`.
fn validate_port_fields(at: &Path, port: &SidecarPort, report: &mut Report) {
    if !port.name.is_empty() {
        report.check(&at.field("name"), validate_port_name(&port.name));
    }
    report.check(&at.field("protocol"), validate_protocol(&port.protocol));
    if port.target_port > 0 {
        report.error(
            &at.field("targetPort"),
            "targetPort has no impact on Sidecars",
        );
    }
}

/// One inbound listener. `ports` collects the port numbers seen so far (they must be unique).
fn validate_ingress(
    at: &Path,
    listener: &IstioIngressListener,
    ports: &mut HashSet<u32>,
    report: &mut Report,
) {
    check_capture_mode(&at.field("captureMode"), listener.capture_mode, report);
    let Some(port) = &listener.port else {
        report.error(
            &at.field("port"),
            "sidecar: port is required for ingress listeners",
        );
        return;
    };
    let port_at = at.field("port");
    validate_port_fields(&port_at, port, report);
    check_ip_bound_port(at, port, &listener.bind, ports, "ingress", report);
    if !listener.default_endpoint.is_empty() {
        validate_default_endpoint(
            &at.field("defaultEndpoint"),
            &listener.default_endpoint,
            report,
        );
    }
    let protocol = Protocol::parse(&port.protocol);
    if let Some(tls) = &listener.tls {
        let tls_at = at.field("tls");
        for (field, set, message) in [
            (
                "subjectAltNames",
                !tls.subject_alt_names.is_empty(),
                "sidecar: subjectAltNames is not supported in ingress tls",
            ),
            (
                "httpsRedirect",
                tls.https_redirect,
                "sidecar: httpsRedirect is not supported",
            ),
            (
                "credentialName",
                !tls.credential_name.is_empty(),
                "sidecar: credentialName is not currently supported",
            ),
            (
                "credentialNames",
                !tls.credential_names.is_empty(),
                "sidecar: credentialNames is not currently supported",
            ),
            (
                "tlsCertificates",
                !tls.tls_certificates.is_empty(),
                "sidecar: tls_certificates is not currently supported",
            ),
        ] {
            if set {
                report.error(&tls_at.field(field), message);
            }
        }
        if matches!(tls.mode, TlsMode::IstioMutual | TlsMode::AutoPassthrough) {
            report.error(
                &tls_at.field("mode"),
                format!(
                    "configuration is invalid: cannot set mode to {} in sidecar ingress tls",
                    tls.mode
                ),
            );
        }
        if !protocol.is_some_and(Protocol::is_tls) {
            report.error(
                &tls_at,
                format!(
                    "server cannot have TLS settings for non HTTPS/TLS ports (port {} has protocol {:?})",
                    port.number, port.protocol
                ),
            );
        }
        validate_server_tls(&tls_at, tls, report);
    }
    if let Some(pool) = &listener.connection_pool {
        let pool_at = at.field("connectionPool");
        validate_connection_pool(&pool_at, pool, report);
        if pool.http.is_some() && !protocol.is_some_and(Protocol::is_http) {
            report.warn(
                &pool_at.field("http"),
                format!(
                    "sidecar: HTTP connection pool settings are configured for port {} ({:?}) but its protocol is not HTTP ({:?}); only TCP settings will apply",
                    port.number, port.name, port.protocol
                ),
            );
        }
    }
}

/// Where inbound traffic is forwarded: `unix://path`, or a loopback/any address with a port.
fn validate_default_endpoint(at: &Path, endpoint: &str, report: &mut Report) {
    if let Some(socket) = endpoint.strip_prefix(UNIX_ADDRESS_PREFIX) {
        report.check(at, validate_unix_address(socket));
        return;
    }
    let (host, port) = match split_host_port(endpoint) {
        Ok(parts) => parts,
        Err(e) => {
            report.error(
                at,
                format!("sidecar: defaultEndpoint {endpoint:?} is not host:port: {e}"),
            );
            return;
        }
    };
    if !host.is_empty() && !DEFAULT_ENDPOINT_HOSTS.contains(&host) {
        report.error(
            at,
            "sidecar: defaultEndpoint must be of form 127.0.0.1:<port>, 0.0.0.0:<port>, [::1]:<port>, [::]:<port>, unix://filepath or unset",
        );
    }
    match port.parse::<i64>() {
        Ok(number) => report.check(at, validate_port(number)),
        Err(_) => report.error(
            at,
            format!("sidecar: defaultEndpoint port ({port}) is not a number"),
        ),
    }
}

/// Splits `host:port`, `[v6]:port` or `:port` as Go's `net.SplitHostPort` does (the host may be
/// empty; an IPv6 host must be bracketed).
fn split_host_port(hostport: &str) -> Result<(&str, &str), &'static str> {
    let colon = hostport.rfind(':').ok_or("missing port in address")?;
    // `open` and `close`: where the searches for stray brackets start.
    let (host, open, close) = if let Some(rest) = hostport.strip_prefix('[') {
        let end = rest.find(']').ok_or("missing ']' in address")? + 1;
        match hostport.as_bytes().get(end + 1) {
            None => return Err("missing port in address"),
            Some(_) if end + 1 == colon => {}
            Some(b':') => return Err("too many colons in address"),
            Some(_) => return Err("missing port in address"),
        }
        (&hostport[1..end], 1, end + 1)
    } else {
        let host = &hostport[..colon];
        if host.contains(':') {
            return Err("too many colons in address");
        }
        (host, 0, 0)
    };
    if hostport[open..].contains('[') {
        return Err("unexpected '[' in address");
    }
    if hostport[close..].contains(']') {
        return Err("unexpected ']' in address");
    }
    Ok((host, &hostport[colon + 1..]))
}

/// One outbound listener's port, bind and capture mode, and its place in the list: only the last
/// listener may omit the port; ports and Unix sockets are unique.
fn validate_egress(
    at: &Path,
    listener: &IstioEgressListener,
    is_last: bool,
    (ports, sockets): (&mut HashSet<u32>, &mut HashSet<String>),
    report: &mut Report,
) {
    let capture_at = at.field("captureMode");
    check_capture_mode(&capture_at, listener.capture_mode, report);
    let Some(port) = &listener.port else {
        if !is_last {
            report.error(
                &at.field("port"),
                "sidecar: the egress listener with empty port should be the last listener in the list (only one listener may omit the port)",
            );
        }
        return;
    };
    let port_at = at.field("port");
    validate_port_fields(&port_at, port, report);
    if port.number == 0 {
        // Port 0: the listener is a Unix domain socket.
        match listener.bind.strip_prefix(UNIX_ADDRESS_PREFIX) {
            None => report.error(
                &at.field("bind"),
                "sidecar: ports with 0 value must have a unix domain socket bind address (unix://...)",
            ),
            Some(socket) => report.check(&at.field("bind"), validate_unix_address(socket)),
        }
        if !matches!(
            listener.capture_mode,
            CaptureMode::Default | CaptureMode::None
        ) {
            report.error(
                &capture_at,
                format!(
                    "sidecar: captureMode must be DEFAULT/NONE for unix domain socket listeners, not {}",
                    listener.capture_mode
                ),
            );
        }
        if !sockets.insert(listener.bind.clone()) {
            report.error(
                &at.field("bind"),
                format!(
                    "sidecar: unix domain socket values for listeners must be unique: {} is bound by another egress listener",
                    listener.bind
                ),
            );
        }
    } else {
        check_ip_bound_port(at, port, &listener.bind, ports, "egress", report);
    }
}

/// An egress listener's `namespace/host` imports. Imports that repeat or are covered by another
/// (`ns/*` then `ns/a.com`, or `*/*` with anything else) are warnings.
fn validate_egress_hosts(at: &Path, hosts: &[String], namespace: &str, report: &mut Report) {
    if hosts.is_empty() {
        report.error(
            at,
            "sidecar: egress listener must contain at least one host",
        );
        return;
    }
    let mut imported: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (i, host) in hosts.iter().enumerate() {
        let here = at.index(i);
        if let Some((ns, name)) = host.split_once('/')
            && !ns.starts_with('~')
        {
            let ns = if ns == "." { namespace } else { ns };
            let names = imported.entry(ns).or_default();
            let covered = if name == "*" {
                !names.is_empty()
            } else {
                names.contains(name) || names.contains("*")
            };
            if covered {
                report.warn(&here, format!("duplicated egress host: {host}"));
            }
            names.insert(name);
        }
        for message in validate_namespace_slash_wildcard_hostname(host, false) {
            report.error(&here, message);
        }
    }
    if imported.get("*").is_some_and(|names| names.contains("*")) && imported.len() != 1 {
        report.warn(
            at,
            "`*/*` host select all resources, no other hosts can be added",
        );
    }
}

/// The outbound policy: a mode the Sidecar API names, and an egress proxy only with `ALLOW_ANY`.
fn validate_outbound_traffic_policy(
    at: &Path,
    policy: &OutboundTrafficPolicy,
    report: &mut Report,
) {
    let mode_at = at.field("mode");
    match policy.mode {
        OutboundTrafficPolicyMode::Unknown(ALLOW_ANY_DYNAMIC_DNS) => {
            report.error(
                &mode_at,
                "sidecar: ALLOW_ANY_DYNAMIC_DNS mode is only supported in MeshConfig, not in Sidecar resource",
            );
            return;
        }
        OutboundTrafficPolicyMode::Unknown(n) => {
            report.error(
                &mode_at,
                format!(
                    "unknown outbound traffic policy mode {n}: expected one of {}",
                    OutboundTrafficPolicyMode::NAMES.join(", ")
                ),
            );
            return;
        }
        _ => {}
    }
    let Some(proxy) = &policy.egress_proxy else {
        return;
    };
    let proxy_at = at.field("egressProxy");
    if policy.mode != OutboundTrafficPolicyMode::AllowAny {
        report.error(
            &proxy_at,
            format!(
                "sidecar: egress_proxy must be set only with ALLOW_ANY outbound_traffic_policy mode (mode is {})",
                policy.mode
            ),
        );
        return;
    }
    let host_at = proxy_at.field("host");
    let fqdn = validate_fqdn(&proxy.host);
    let fqdn_ok = fqdn.is_ok();
    report.check(&host_at, fqdn);
    if proxy.port.is_none() {
        report.error(
            &proxy_at.field("port"),
            "sidecar: egress_proxy port must be non-nil",
        );
        return;
    }
    // The destination rules check the host as a domain again: report the host once.
    let mut found = Report::default();
    validate_destination(&proxy_at, proxy, &mut found);
    report.errors.extend(
        found
            .errors
            .into_iter()
            .filter(|e| fqdn_ok || e.field != host_at.as_str()),
    );
    report.warnings.extend(found.warnings);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_splits_like_go() {
        assert_eq!(split_host_port("127.0.0.1:80"), Ok(("127.0.0.1", "80")));
        assert_eq!(split_host_port("[::1]:80"), Ok(("::1", "80")));
        assert_eq!(split_host_port(":80"), Ok(("", "80")));
        assert_eq!(split_host_port("[::1]:hi"), Ok(("::1", "hi")));
        assert_eq!(split_host_port("127.0.0.1:"), Ok(("127.0.0.1", "")));
        assert!(split_host_port("127.0.0.1").is_err());
        assert!(split_host_port("::1:80").is_err());
        assert!(split_host_port("[::1]").is_err());
        assert!(split_host_port("[::1]x:80").is_err());
        assert!(split_host_port("[::1:80").is_err());
        assert!(split_host_port("a]:80").is_err());
        assert!(split_host_port("[a]]:80").is_err());
    }

    #[test]
    fn default_endpoints() {
        let errors = |endpoint: &str| {
            let mut r = Report::default();
            validate_default_endpoint(&Path::spec(), endpoint, &mut r);
            r.errors.len()
        };
        assert_eq!(errors("127.0.0.1:9999"), 0);
        assert_eq!(errors("[::]:9999"), 0);
        assert_eq!(errors("unix:///var/run/app.sock"), 0);
        assert_eq!(errors("unix://@app"), 0);
        assert_eq!(errors("unix:///"), 1);
        assert_eq!(errors("1.1.1.1:90"), 1);
        assert_eq!(errors("127.0.0.1:hi"), 1);
        assert_eq!(errors("127.0.0.1:0"), 1);
    }

    #[test]
    fn covered_egress_hosts_warn() {
        let warnings = |hosts: &[&str]| {
            let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
            let mut r = Report::default();
            validate_egress_hosts(&Path::spec(), &hosts, "bar", &mut r);
            assert!(r.is_valid(), "{r:?}");
            r.warnings.len()
        };
        assert_eq!(warnings(&["*/b.com", "test/a.com"]), 0);
        assert_eq!(warnings(&["*/*", "~ns1/*"]), 0);
        assert_eq!(warnings(&["test/*", "test/a.com"]), 1);
        assert_eq!(warnings(&["test/a.com", "test/*"]), 1);
        assert_eq!(warnings(&["./*", "bar/a.com"]), 1);
        assert_eq!(warnings(&["*/*", "test/a.com"]), 1);
    }
}
