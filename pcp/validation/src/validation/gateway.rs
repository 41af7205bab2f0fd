//! Validation of `Gateway`, following istiod: servers (hosts, port, bind, TLS), unique port names,
//! and the CRD schema's limits on TLS settings.
//!
//! The TLS rules ([`validate_server_tls`]) serve Sidecar ingress listeners too.

use std::collections::{BTreeSet, HashSet};

use pasa_istio::common::Protocol;
use pasa_istio::gateway::{
    Gateway, Port, Server, ServerTlsSettings, TlsMode, TlsProtocol, is_valid_cipher_suite,
};
use pasa_istio::workload_entry::UNIX_ADDRESS_PREFIX;
use pasa_proto::Object;

use super::common::{
    is_dns1123_label, validate_ip_address, validate_namespace_slash_wildcard_hostname,
    validate_port,
};
use super::workload_entry::validate_unix_address;
use super::{Path, Report, parse};

/// The CRD's limit on `credentialNames` and `tlsCertificates`.
const MAX_CERTIFICATE_SOURCES: usize = 2;

/// Checks one Gateway.
pub fn validate(obj: &Object, report: &mut Report) {
    // The name becomes part of generated resource names, which may not contain dots.
    if !is_dns1123_label(&obj.name) {
        report.error(
            &Path::root("metadata").field("name"),
            format!(
                "invalid gateway name {:?}: must be a DNS label (lowercase letters, digits and '-', no dots)",
                obj.name
            ),
        );
    }
    let Some(gateway) = parse::<Gateway>(obj, report) else {
        return;
    };
    let servers = Path::spec().field("servers");
    if gateway.servers.is_empty() {
        report.error(&servers, "gateway must have at least one server");
    }
    let mut port_names = HashSet::new();
    for (i, server) in gateway.servers.iter().enumerate() {
        let at = servers.index(i);
        validate_server(&at, server, report);
        let Some(port) = &server.port else {
            continue;
        };
        if !port_names.insert(port.name.as_str()) {
            report.error(
                &at.field("port").field("name"),
                format!(
                    "port names in servers must be unique: duplicate name {:?}",
                    port.name
                ),
            );
        }
        let is_http = Protocol::parse(&port.protocol).is_some_and(Protocol::is_http);
        if !is_http && server.tls.as_ref().is_some_and(|tls| tls.https_redirect) {
            report.warn(
                &at.field("tls").field("httpsRedirect"),
                format!(
                    "tls.httpsRedirect should only be used with http servers; port {:?} has protocol {:?}",
                    port.name, port.protocol
                ),
            );
        }
    }
}

/// One server: its hosts, port, bind address and TLS, and whether TLS fits the protocol.
fn validate_server(at: &Path, server: &Server, report: &mut Report) {
    let hosts = at.field("hosts");
    if server.hosts.is_empty() {
        report.error(&hosts, "server config must contain at least one host");
    }
    for (i, host) in server.hosts.iter().enumerate() {
        for message in validate_namespace_slash_wildcard_hostname(host, true) {
            report.error(&hosts.index(i), message);
        }
    }

    let port_at = at.field("port");
    let port_ok = match &server.port {
        None => {
            report.error(&port_at, "port is required");
            false
        }
        Some(port) => validate_server_port(&port_at, port, &server.bind, report),
    };
    validate_server_bind(at, server.port.as_ref(), &server.bind, report);
    if let Some(tls) = &server.tls {
        validate_server_tls(&at.field("tls"), tls, report);
    }

    // Only a port that is itself valid is checked against the TLS settings.
    let Some(port) = server.port.as_ref().filter(|_| port_ok) else {
        return;
    };
    let Some(protocol) = Protocol::parse(&port.protocol) else {
        return;
    };
    match &server.tls {
        None if protocol.is_tls() => report.error(
            &at.field("tls"),
            format!(
                "server must have TLS settings for HTTPS/TLS protocols (port {:?} is {})",
                port.name, port.protocol
            ),
        ),
        Some(tls) if !protocol.is_tls() => {
            // A plain HTTP server may only carry the redirect to HTTPS.
            let redirect_only = tls.mode.is_passthrough()
                && tls.ca_certificates.is_empty()
                && tls.private_key.is_empty()
                && tls.server_certificate.is_empty();
            if !protocol.is_http() {
                report.error(
                    &at.field("tls"),
                    format!(
                        "server cannot have TLS settings for non HTTPS/TLS ports (port {:?} is {})",
                        port.name, port.protocol
                    ),
                );
            } else if !redirect_only {
                report.error(
                    &at.field("tls"),
                    format!(
                        "server cannot have TLS settings for plain text HTTP ports (port {:?} is {}); only httpsRedirect is allowed",
                        port.name, port.protocol
                    ),
                );
            }
        }
        _ => {}
    }
}

/// A server port: a known protocol, a number in range (0 only with a Unix socket bind), a name.
/// Returns whether the port is valid.
fn validate_server_port(at: &Path, port: &Port, bind: &str, report: &mut Report) -> bool {
    let before = report.errors.len();
    if Protocol::parse(&port.protocol).is_none() {
        report.error(
            &at.field("protocol"),
            format!(
                "invalid protocol {:?}, supported protocols are HTTP, HTTP2, GRPC, GRPC-WEB, MONGO, REDIS, MYSQL, TCP, HTTPS, TLS",
                port.protocol
            ),
        );
    }
    if port.number > 0 || !bind.starts_with(UNIX_ADDRESS_PREFIX) {
        report.check(&at.field("number"), validate_port(i64::from(port.number)));
    }
    if port.target_port > 0 {
        report.error(
            &at.field("targetPort"),
            "targetPort has no impact on Gateways",
        );
    }
    if port.name.is_empty() {
        report.error(&at.field("name"), "port name must be set");
    }
    report.errors.len() == before
}

/// A bind address: an IP, or `unix://` and an absolute socket path with port number 0.
fn validate_server_bind(at: &Path, port: Option<&Port>, bind: &str, report: &mut Report) {
    if let Some(socket) = bind.strip_prefix(UNIX_ADDRESS_PREFIX) {
        report.check(&at.field("bind"), validate_unix_address(socket));
        if let Some(port) = port.filter(|p| p.number != 0) {
            report.error(
                &at.field("port").field("number"),
                format!(
                    "port number must be 0 for unix domain socket: port {:?} has number {}",
                    port.name, port.number
                ),
            );
        }
    } else if !bind.is_empty() {
        report.check(&at.field("bind"), validate_ip_address(bind));
    }
}

/// A server's TLS settings (Gateway servers and Sidecar ingress listeners): certificates that fit
/// the mode, one certificate source, known ciphers, and the CRD schema's limits.
pub(crate) fn validate_server_tls(at: &Path, tls: &ServerTlsSettings, report: &mut Report) {
    validate_tls_schema(at, tls, report);

    if matches!(
        tls.min_protocol_version,
        TlsProtocol::V1_0 | TlsProtocol::V1_1
    ) && tls.cipher_suites.is_empty()
    {
        report.warn(
            &at.field("minProtocolVersion"),
            format!(
                "TLS version below TLSV1_2 require setting compatible ciphers as by default they no longer include compatible ciphers (minProtocolVersion is {})",
                tls.min_protocol_version
            ),
        );
    }
    validate_cipher_suites(&at.field("cipherSuites"), &tls.cipher_suites, report);

    if tls.mode == TlsMode::IstioMutual {
        // The proxy's own workload certificate is used: no other source may be given.
        for (field, set, what) in [
            (
                "serverCertificate",
                !tls.server_certificate.is_empty(),
                "server certificate",
            ),
            ("privateKey", !tls.private_key.is_empty(), "private key"),
            (
                "caCertificates",
                !tls.ca_certificates.is_empty(),
                "CA bundle",
            ),
            (
                "tlsCertificates",
                !tls.tls_certificates.is_empty(),
                "tlsCertificates",
            ),
            (
                "credentialName",
                !tls.credential_name.is_empty(),
                "credentialName",
            ),
            (
                "credentialNames",
                !tls.credential_names.is_empty(),
                "credentialNames",
            ),
        ] {
            if set {
                report.error(
                    &at.field(field),
                    format!("ISTIO_MUTUAL TLS cannot have associated {what}"),
                );
            }
        }
        return;
    }

    if tls.mode.is_passthrough()
        && (!tls.ca_crl.is_empty()
            || !tls.server_certificate.is_empty()
            || !tls.private_key.is_empty()
            || !tls.ca_certificates.is_empty()
            || !tls.tls_certificates.is_empty()
            || !tls.credential_name.is_empty()
            || !tls.credential_names.is_empty())
    {
        report.warn(
            &at.field("mode"),
            format!(
                "{} mode does not use certificates, they will be ignored",
                tls.mode
            ),
        );
    }

    let sources = [
        !tls.server_certificate.is_empty() && !tls.private_key.is_empty(),
        !tls.credential_name.is_empty(),
        !tls.credential_names.is_empty(),
        !tls.tls_certificates.is_empty(),
    ];
    if sources.iter().filter(|&&set| set).count() > 1 {
        report.error(
            at,
            "only one of credential_name, credential_names, server_certificate/private_key, tls_certificates should be specified",
        );
    }

    let terminates = matches!(
        tls.mode,
        TlsMode::Simple | TlsMode::Mutual | TlsMode::OptionalMutual
    );
    if terminates && (!tls.credential_name.is_empty() || !tls.credential_names.is_empty()) {
        // The secret holds everything: no files are needed, and a CRL comes with the secret.
        return;
    }
    if terminates {
        let mode = if tls.mode.is_mutual() {
            "MUTUAL TLS"
        } else {
            "SIMPLE TLS"
        };
        if tls.mode.is_mutual() && tls.ca_certificates.is_empty() {
            report.error(
                &at.field("caCertificates"),
                format!("{mode} requires a client CA bundle (caCertificates)"),
            );
        }
        if tls.tls_certificates.len() > MAX_CERTIFICATE_SOURCES {
            report.warn(
                &at.field("tlsCertificates"),
                format!("{mode} can support up to 2 server certificates"),
            );
        }
        if tls.tls_certificates.is_empty() {
            check_certificate_pair(at, &tls.server_certificate, &tls.private_key, mode, report);
        } else {
            for (i, cert) in tls.tls_certificates.iter().enumerate() {
                let at = at.field("tlsCertificates").index(i);
                check_certificate_pair(
                    &at,
                    &cert.server_certificate,
                    &cert.private_key,
                    mode,
                    report,
                );
            }
        }
    }
    if !tls.ca_crl.is_empty() {
        if !tls.credential_name.is_empty() {
            report.error(
                &at.field("caCrl"),
                "CRL is not supported with credentialName. CRL has to be specified in the credential",
            );
        }
        if tls.mode == TlsMode::Simple {
            report.error(&at.field("caCrl"), "CRL is not supported with SIMPLE TLS");
        }
    }
}

fn check_certificate_pair(
    at: &Path,
    server_certificate: &str,
    private_key: &str,
    mode: &str,
    report: &mut Report,
) {
    if server_certificate.is_empty() {
        report.error(
            &at.field("serverCertificate"),
            format!("{mode} requires a server certificate"),
        );
    }
    if private_key.is_empty() {
        report.error(
            &at.field("privateKey"),
            format!("{mode} requires a private key"),
        );
    }
}

/// Unknown and repeated cipher suites are ignored by istiod, with a warning.
fn validate_cipher_suites(at: &Path, suites: &[String], report: &mut Report) {
    let mut valid = HashSet::new();
    let mut invalid = BTreeSet::new();
    let mut duplicate = BTreeSet::new();
    for suite in suites {
        if !is_valid_cipher_suite(suite) {
            invalid.insert(suite.as_str());
        } else if !valid.insert(suite.as_str()) {
            duplicate.insert(suite.as_str());
        }
    }
    let list = |set: &BTreeSet<&str>| set.iter().copied().collect::<Vec<_>>().join(", ");
    if !invalid.is_empty() {
        report.warn(
            at,
            format!("ignoring invalid cipher suites: [{}]", list(&invalid)),
        );
    }
    if !duplicate.is_empty() {
        report.warn(
            at,
            format!("ignoring duplicate cipher suites: [{}]", list(&duplicate)),
        );
    }
}

/// What the CRD schema adds: named enum values and at most two certificate sources of a kind.
fn validate_tls_schema(at: &Path, tls: &ServerTlsSettings, report: &mut Report) {
    if let TlsMode::Unknown(n) = tls.mode {
        report.error(
            &at.field("mode"),
            format!(
                "unknown TLS mode {n}: expected one of {}",
                TlsMode::NAMES.join(", ")
            ),
        );
    }
    for (field, version) in [
        ("minProtocolVersion", tls.min_protocol_version),
        ("maxProtocolVersion", tls.max_protocol_version),
    ] {
        if let TlsProtocol::Unknown(n) = version {
            report.error(
                &at.field(field),
                format!(
                    "unknown TLS protocol version {n}: expected one of {}",
                    TlsProtocol::NAMES.join(", ")
                ),
            );
        }
    }
    for (field, len) in [
        ("credentialNames", tls.credential_names.len()),
        ("tlsCertificates", tls.tls_certificates.len()),
    ] {
        if len > MAX_CERTIFICATE_SOURCES {
            report.error(
                &at.field(field),
                format!("{field} may have at most {MAX_CERTIFICATE_SOURCES} items, found {len}"),
            );
        }
    }
    // The schema's rules that credentialName, credentialNames and tlsCertificates exclude each
    // other are covered by the single-certificate-source rule of `validate_server_tls`.
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tls_report(tls: serde_json::Value) -> Report {
        let tls: ServerTlsSettings = serde_json::from_value(tls).unwrap();
        let mut report = Report::default();
        validate_server_tls(&Path::spec().field("tls"), &tls, &mut report);
        report
    }

    #[test]
    fn credential_secret_skips_file_and_crl_checks() {
        let r = tls_report(json!({"mode": "SIMPLE", "credentialName": "c", "caCrl": "crl"}));
        assert!(r.is_valid(), "{r:?}");
        let r = tls_report(json!({"mode": "SIMPLE", "caCrl": "crl"}));
        let messages: Vec<_> = r.errors.iter().map(|e| e.message.as_str()).collect();
        assert!(messages.contains(&"CRL is not supported with SIMPLE TLS"));
        assert!(messages.contains(&"SIMPLE TLS requires a server certificate"));
    }

    #[test]
    fn each_tls_certificate_is_checked_at_its_path() {
        let r = tls_report(json!({
            "mode": "MUTUAL", "caCertificates": "ca",
            "tlsCertificates": [{"privateKey": "k"}, {"serverCertificate": "c", "privateKey": "k"}]
        }));
        assert_eq!(r.errors.len(), 1, "{r:?}");
        assert_eq!(
            r.errors[0].field,
            "spec.tls.tlsCertificates[0].serverCertificate"
        );
        assert_eq!(
            r.errors[0].message,
            "MUTUAL TLS requires a server certificate"
        );
    }

    #[test]
    fn passthrough_with_certificates_warns() {
        let r = tls_report(json!({"mode": "AUTO_PASSTHROUGH", "credentialName": "c"}));
        assert!(r.is_valid());
        assert_eq!(
            r.warnings[0].message,
            "AUTO_PASSTHROUGH mode does not use certificates, they will be ignored"
        );
    }

    #[test]
    fn ciphers_and_old_versions_warn() {
        let r = tls_report(json!({"minProtocolVersion": "TLSV1_1"}));
        assert_eq!(r.warnings.len(), 1);
        let r = tls_report(json!({"cipherSuites": ["b-bad", "AES128-SHA", "a-bad", "AES128-SHA"]}));
        let messages: Vec<_> = r.warnings.iter().map(|w| w.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "ignoring invalid cipher suites: [a-bad, b-bad]",
                "ignoring duplicate cipher suites: [AES128-SHA]"
            ]
        );
    }

    #[test]
    fn schema_limits() {
        let r = tls_report(json!({"mode": "SIMPLE", "credentialNames": ["a", "b", "c"]}));
        assert!(!r.is_valid());
        let r = tls_report(json!({"mode": 9}));
        assert_eq!(r.errors[0].field, "spec.tls.mode");
    }
}
