//! Client TLS settings (`ClientTLSSettings`) of a traffic policy.

use pasa_istio::destination_rule::{ClientTlsMode, ClientTlsSettings};

use super::check_named;
use crate::validation::{Path, Report};

/// The credential-name scheme for CA bundles kept in a ConfigMap: `configmap://namespace/name`.
const CONFIGMAP_PREFIX: &str = "configmap://";

/// TLS towards the upstream; `namespace` is the rule's own (a `configmap://` credential must be in
/// it).
pub(super) fn validate_client_tls(
    at: &Path,
    namespace: &str,
    tls: &ClientTlsSettings,
    report: &mut Report,
) {
    check_named(
        &at.field("mode"),
        tls.mode.name(),
        tls.mode,
        ClientTlsMode::NAMES,
        report,
    );
    if let Some(reference) = tls.credential_name.strip_prefix(CONFIGMAP_PREFIX) {
        report.check(
            &at.field("credentialName"),
            check_configmap_credential(reference, namespace),
        );
    }

    let simple = tls.mode == ClientTlsMode::Simple;
    let mutual = tls.mode == ClientTlsMode::Mutual;
    let has_sans = !tls.subject_alt_names.is_empty();
    if tls.insecure_skip_verify == Some(true) {
        if simple
            && (!tls.ca_certificates.is_empty() || !tls.credential_name.is_empty() || has_sans)
        {
            report.error(
                &at.field("insecureSkipVerify"),
                "cannot specify caCertificates or credentialName or subjectAltNames when \
                 insecureSkipVerify is set true",
            );
        }
        // With MUTUAL the credential also holds the client certificate, so it stays allowed.
        if mutual && (!tls.ca_certificates.is_empty() || has_sans) {
            report.error(
                &at.field("insecureSkipVerify"),
                "cannot specify caCertificates or subjectAltNames when insecureSkipVerify is set true",
            );
        }
    }

    if (simple || mutual) && !tls.credential_name.is_empty() {
        let files = [
            ("clientCertificate", &tls.client_certificate),
            ("caCertificates", &tls.ca_certificates),
            ("privateKey", &tls.private_key),
            ("caCrl", &tls.ca_crl),
        ];
        if let Some((field, _)) = files.iter().find(|(_, v)| !v.is_empty()) {
            report.error(
                &at.field(field),
                "cannot specify client certificates or CA certificate or CA CRL if credentialName is set",
            );
        }
        // The certificates come from the credential: no file is required.
        return;
    }

    if mutual {
        if tls.client_certificate.is_empty() {
            report.error(
                &at.field("clientCertificate"),
                "client certificate required for mutual tls",
            );
        }
        if tls.private_key.is_empty() {
            report.error(
                &at.field("privateKey"),
                "private key required for mutual tls",
            );
        }
    }
}

/// `namespace/name` after `configmap://`: both present, and the namespace is the rule's own.
fn check_configmap_credential(reference: &str, namespace: &str) -> Result<(), String> {
    let mut parts = reference.split('/');
    let (ns, name) = match (parts.next(), parts.next()) {
        (Some(ns), Some(name)) => (ns, name),
        _ => {
            return Err(format!(
                "invalid configmap:// credentialName {CONFIGMAP_PREFIX}{reference:?}: expected namespace and name"
            ));
        }
    };
    if ns.is_empty() {
        return Err(
            "invalid configmap:// credentialName: the namespace is missing (configmap://namespace/name)"
                .to_string(),
        );
    }
    if name.is_empty() {
        return Err(
            "invalid configmap:// credentialName: the name is missing (configmap://namespace/name)"
                .to_string(),
        );
    }
    if namespace.is_empty() || ns != namespace {
        return Err(format!(
            "invalid configmap:// credentialName: namespace must match the configuration namespace {namespace:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(tls: &ClientTlsSettings) -> Vec<String> {
        let mut r = Report::default();
        validate_client_tls(&Path::spec().field("tls"), "ns", tls, &mut r);
        r.errors.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn configmap_credentials_stay_in_the_namespace() {
        let mut tls = ClientTlsSettings {
            mode: ClientTlsMode::Simple,
            credential_name: "configmap://ns/ca".into(),
            ..Default::default()
        };
        assert!(errors(&tls).is_empty());
        for bad in [
            "configmap://other/ca",
            "configmap://ca",
            "configmap:///ca",
            "configmap://ns/",
        ] {
            tls.credential_name = bad.into();
            assert_eq!(errors(&tls).len(), 1, "{bad}");
        }
    }

    #[test]
    fn mutual_needs_files_or_a_credential() {
        let mut tls = ClientTlsSettings {
            mode: ClientTlsMode::Mutual,
            ..Default::default()
        };
        assert_eq!(errors(&tls).len(), 2);
        tls.credential_name = "secret".into();
        assert!(errors(&tls).is_empty());
        tls.private_key = "/key.pem".into();
        assert_eq!(errors(&tls).len(), 1);
    }
}
