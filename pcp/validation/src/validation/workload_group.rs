//! Validation of `WorkloadGroup`, following istiod's webhook and the CRD schema: a template is
//! required (its address and the like are filled in at registration, so the template is held to
//! the CRD's limits only), the group's labels must be labels, and the readiness probe must name
//! one well-formed method.

use pasa_istio::workload_group::{ReadinessProbe, WorkloadGroup};
use pasa_proto::Object;

use super::common::{validate_labels, validate_port};
use super::workload_entry::validate_entry_limits;
use super::{Path, Report, parse};

/// Checks one WorkloadGroup.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(group) = parse::<WorkloadGroup>(obj, report) else {
        return;
    };
    let spec = Path::spec();
    match &group.template {
        None => report.error(&spec.field("template"), "template is required"),
        Some(template) => validate_entry_limits(&spec.field("template"), template, report),
    }
    if let Some(metadata) = &group.metadata {
        validate_labels(
            &spec.field("metadata").field("labels"),
            &metadata.labels,
            report,
        );
    }
    if let Some(probe) = &group.probe {
        validate_probe(&spec.field("probe"), probe, report);
    }
}

/// A readiness probe: timings not negative, and exactly the method it names checked.
fn validate_probe(at: &Path, probe: &ReadinessProbe, report: &mut Report) {
    for (field, value) in [
        ("periodSeconds", probe.period_seconds),
        ("initialDelaySeconds", probe.initial_delay_seconds),
        ("timeoutSeconds", probe.timeout_seconds),
        ("successThreshold", probe.success_threshold),
        ("failureThreshold", probe.failure_threshold),
    ] {
        if value < 0 {
            report.error(&at.field(field), format!("{field} must be non-negative"));
        }
    }
    let methods = usize::from(probe.http_get.is_some())
        + usize::from(probe.tcp_socket.is_some())
        + usize::from(probe.exec.is_some())
        + usize::from(probe.grpc.is_some());
    if methods > 1 {
        report.error(
            at,
            "only one of httpGet, tcpSocket, exec and grpc may be set",
        );
    }
    if let Some(http) = &probe.http_get {
        let at = at.field("httpGet");
        report.check(&at.field("port"), validate_port(i64::from(http.port)));
        if !http.scheme.is_empty() && http.scheme != "HTTPS" && http.scheme != "HTTP" {
            report.error(
                &at.field("scheme"),
                r#"httpGet.scheme must be one of "HTTPS", "HTTP""#,
            );
        }
        for (i, header) in http.http_headers.iter().enumerate() {
            let here = at.field("httpHeaders").index(i);
            match header {
                None => report.error(&here, "invalid nil header"),
                Some(header) => report.check(&here.field("name"), probe_header_name(&header.name)),
            }
        }
    } else if let Some(tcp) = &probe.tcp_socket {
        report.check(
            &at.field("tcpSocket").field("port"),
            validate_port(i64::from(tcp.port)),
        );
    } else if let Some(exec) = &probe.exec {
        if exec.command.is_empty() {
            report.error(
                &at.field("exec").field("command"),
                "exec.command is required",
            );
        }
    } else if probe.grpc.is_some() {
        // The CRD has it; istiod's webhook knows no such method and refuses it.
        report.error(&at.field("grpc"), "unknown health check method grpc");
    } else {
        report.error(
            at,
            "a health check method is required: httpGet, tcpSocket or exec",
        );
    }
}

/// A header name of an HTTP probe: letters, digits and dashes.
fn probe_header_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("header name cannot be empty".into());
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(format!("header name {name} is not a valid header name"));
    }
    Ok(())
}
