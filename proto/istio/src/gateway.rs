//! The `Gateway` model (`networking.istio.io`): the listeners of a proxy at the edge of the mesh
//! (ports, protocols, hosts, TLS), selected by workload labels. Routing lives in the
//! VirtualServices bound to it.
//!
//! [`ServerTlsSettings`] is shared: a Sidecar's ingress listeners terminate TLS with the same
//! settings.
//!
//! A VirtualService names the gateways it binds to as istiod reads them: [`MESH`] for the mesh's
//! sidecars, else [`resolve_gateway_name`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::proto_enum;

/// A Gateway's spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Gateway {
    /// The listeners the gateway exposes.
    #[serde(default)]
    pub servers: Vec<Server>,
    /// Labels of the gateway workloads (pods, VMs) this configuration applies to; matched in every
    /// namespace unless istiod is told otherwise.
    #[serde(default)]
    pub selector: BTreeMap<String, String>,
}

/// One listener: a port, the hosts served on it and, optionally, how TLS is handled.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Server {
    /// Where the proxy listens and which protocol it expects (required).
    #[serde(default)]
    pub port: Option<Port>,
    /// The address to bind to: an IP, or `unix://path` for a Unix domain socket (then the port
    /// number is 0). Empty means every address.
    #[serde(default)]
    pub bind: String,
    /// The hosts served, each `[namespace/]dnsName`: the namespace part limits which
    /// VirtualServices may bind (`*` any, `.` the gateway's own). At least one is required.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// TLS termination, passthrough or an HTTP-to-HTTPS redirect.
    #[serde(default)]
    pub tls: Option<ServerTlsSettings>,
    /// Where to send traffic that matches no route: `127.0.0.1:port` or `unix://path`.
    #[serde(default)]
    pub default_endpoint: String,
    /// An optional name for the server; it shows up in the generated listener and route names.
    #[serde(default)]
    pub name: String,
}

/// A gateway server's port (the API's `Port`; the same shape serves ServiceEntry and Sidecar).
pub use super::common::Port;

proto_enum! {
    /// How a server handles TLS (`ServerTLSSettings.TLSmode`).
    pub enum TlsMode {
        /// Forward the connection as is, routed by SNI.
        Passthrough = 0 => "PASSTHROUGH",
        /// Terminate TLS with the server's certificate.
        Simple = 1 => "SIMPLE",
        /// Terminate TLS and require a client certificate signed by the given CA.
        Mutual = 2 => "MUTUAL",
        /// Forward as is, routed by SNI to the cluster encoded in it (east-west gateways).
        AutoPassthrough = 3 => "AUTO_PASSTHROUGH",
        /// Terminate mesh mTLS with the proxy's own workload certificate.
        IstioMutual = 4 => "ISTIO_MUTUAL",
        /// Like `MUTUAL`, but a client without a certificate is let through too.
        OptionalMutual = 5 => "OPTIONAL_MUTUAL",
    }
}

impl TlsMode {
    /// The connection is not terminated: no certificates are used.
    pub fn is_passthrough(self) -> bool {
        matches!(self, TlsMode::Passthrough | TlsMode::AutoPassthrough)
    }

    /// Client certificates are requested (`MUTUAL`, `OPTIONAL_MUTUAL`).
    pub fn is_mutual(self) -> bool {
        matches!(self, TlsMode::Mutual | TlsMode::OptionalMutual)
    }
}

proto_enum! {
    /// A TLS protocol version bound (`ServerTLSSettings.TLSProtocol`).
    pub enum TlsProtocol {
        /// Let Envoy choose (TLS 1.2 minimum, 1.3 maximum on servers).
        Auto = 0 => "TLS_AUTO",
        V1_0 = 1 => "TLSV1_0",
        V1_1 = 2 => "TLSV1_1",
        V1_2 = 3 => "TLSV1_2",
        V1_3 = 4 => "TLSV1_3",
    }
}

/// TLS on a server (`ServerTLSSettings`): the mode and where the certificates come from.
///
/// Certificates come from exactly one source: files (`serverCertificate` + `privateKey`), a secret
/// (`credentialName`), up to two secrets (`credentialNames`), or up to two file pairs
/// (`tlsCertificates`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServerTlsSettings {
    /// Answer plain HTTP with a 301 redirect to HTTPS.
    #[serde(default)]
    pub https_redirect: bool,
    #[serde(default)]
    pub mode: TlsMode,
    /// Path of the server certificate file (PEM).
    #[serde(default)]
    pub server_certificate: String,
    /// Path of the server's private key file (PEM).
    #[serde(default)]
    pub private_key: String,
    /// Path of the CA bundle that client certificates are verified against.
    #[serde(default)]
    pub ca_certificates: String,
    /// Path of the certificate revocation list used to check client certificates.
    #[serde(default)]
    pub ca_crl: String,
    /// Name of the secret holding the key, certificate and optionally the CA.
    #[serde(default)]
    pub credential_name: String,
    /// Up to two secrets (for example one RSA and one ECDSA certificate).
    #[serde(default)]
    pub credential_names: Vec<String>,
    /// Name of the secret or config map holding only the CA certificates.
    #[serde(default)]
    pub ca_cert_credential_name: String,
    /// Up to two certificate file sets (for example one RSA and one ECDSA certificate).
    #[serde(default)]
    pub tls_certificates: Vec<TlsCertificate>,
    /// Accepted identities in client certificates.
    #[serde(default)]
    pub subject_alt_names: Vec<String>,
    /// Base64 SHA-256 hashes of the SPKI of accepted client certificates.
    #[serde(default)]
    pub verify_certificate_spki: Vec<String>,
    /// Hex SHA-256 hashes of accepted client certificates.
    #[serde(default)]
    pub verify_certificate_hash: Vec<String>,
    #[serde(default)]
    pub min_protocol_version: TlsProtocol,
    #[serde(default)]
    pub max_protocol_version: TlsProtocol,
    /// OpenSSL/BoringSSL cipher names; empty means Envoy's defaults.
    #[serde(default)]
    pub cipher_suites: Vec<String>,
    /// Accept client certificates that fail verification (the connection still asks for one).
    #[serde(default)]
    pub insecure_skip_verify: Option<bool>,
}

/// One server certificate given as files (`ServerTLSSettings.TLSCertificate`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsCertificate {
    #[serde(default)]
    pub server_certificate: String,
    #[serde(default)]
    pub private_key: String,
    #[serde(default)]
    pub ca_certificates: String,
}

/// The cipher suites a server may name (BoringSSL's names, without PSK suites).
pub const CIPHER_SUITES: &[&str] = &[
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-RSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA",
    "ECDHE-RSA-AES256-SHA",
    "AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-SHA",
    "AES256-SHA",
    "DES-CBC3-SHA",
];

/// Whether Envoy accepts `name` in a cipher list: a known suite, `ALL`, empty, or an expression
/// led by an operator (`-AES128-SHA`, `+...`, `!...`), which is passed through unchecked.
pub fn is_valid_cipher_suite(name: &str) -> bool {
    match name.chars().next() {
        None => true,
        Some(first) if !first.is_alphanumeric() => true,
        Some(_) => name == "ALL" || CIPHER_SUITES.contains(&name),
    }
}

/// The reserved gateway name meaning "all sidecars of the mesh".
pub const MESH: &str = "mesh";

/// Resolves a gateway reference written in a VirtualService of `namespace` to `namespace/name`,
/// as istiod does: `name` → `<vs-ns>/name`, `./name` → `<vs-ns>/name`, `ns/name` kept, the legacy
/// FQDN form `name.ns.svc.cluster.local` → `ns/name`, and `mesh` kept.
pub fn resolve_gateway_name(gateway: &str, namespace: &str) -> String {
    if gateway == MESH {
        return MESH.to_string();
    }
    if let Some((ns, name)) = gateway.split_once('/') {
        return if ns == "." {
            format!("{namespace}/{name}")
        } else {
            gateway.to_string()
        };
    }
    match gateway.split_once('.') {
        None => format!("{namespace}/{gateway}"),
        Some((name, rest)) => {
            let ns = rest.split('.').next().unwrap_or(rest);
            format!("{ns}/{name}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_spec;
    use serde_json::json;

    #[test]
    fn reads_a_gateway() {
        let gw: Gateway = parse_spec(&json!({
            "selector": {"istio": "ingressgateway"},
            "servers": [{
                "port": {"number": 443, "name": "https", "protocol": "HTTPS"},
                "hosts": ["ns/foo.example.com"],
                "tls": {"mode": "MUTUAL", "credentialName": "cert", "insecureSkipVerify": false,
                        "minProtocolVersion": "TLSV1_2", "tlsCertificates": [{"privateKey": "k"}]}
            }]
        }))
        .unwrap();
        let server = &gw.servers[0];
        assert_eq!(server.port.as_ref().unwrap().number, 443);
        let tls = server.tls.as_ref().unwrap();
        assert_eq!(tls.mode, TlsMode::Mutual);
        assert!(tls.mode.is_mutual());
        assert_eq!(tls.min_protocol_version, TlsProtocol::V1_2);
        assert_eq!(tls.max_protocol_version, TlsProtocol::Auto);
        assert_eq!(tls.insecure_skip_verify, Some(false));
        assert_eq!(tls.tls_certificates[0].private_key, "k");
    }

    #[test]
    fn unknown_fields_name_their_path() {
        let e = parse_spec::<Gateway>(&json!({"servers": [{"port": {"nmber": 1}}]})).unwrap_err();
        assert_eq!(e.field, "spec.servers[0].port.nmber");
    }

    #[test]
    fn cipher_suites() {
        assert!(is_valid_cipher_suite("ECDHE-ECDSA-AES128-SHA"));
        assert!(is_valid_cipher_suite("-ECDHE-ECDSA-AES128-SHA"));
        assert!(is_valid_cipher_suite("ALL"));
        assert!(!is_valid_cipher_suite("not-a-cipher-suite"));
    }

    #[test]
    fn resolves_like_istiod() {
        let cases = [
            ("mesh", "default", "mesh"),
            ("bookinfo-gateway", "default", "default/bookinfo-gateway"),
            ("./bookinfo-gateway", "default", "default/bookinfo-gateway"),
            ("istio-system/ingress", "default", "istio-system/ingress"),
            (
                "ingress.istio-system.svc.cluster.local",
                "default",
                "istio-system/ingress",
            ),
            ("ingress.istio-system", "default", "istio-system/ingress"),
        ];
        for (gw, ns, want) in cases {
            assert_eq!(resolve_gateway_name(gw, ns), want, "{gw} in {ns}");
        }
    }
}
