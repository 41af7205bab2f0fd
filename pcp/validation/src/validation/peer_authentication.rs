//! Validation of `PeerAuthentication` (`security.istio.io`), following istiod's webhook and the
//! CRD schema.

use pasa_istio::peer_authentication::PeerAuthentication;
use pasa_proto::Object;

use super::common::validate_policy_selector;
use super::{Path, Report, parse};

/// Checks one PeerAuthentication.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(policy) = parse::<PeerAuthentication>(obj, report) else {
        return;
    };
    let spec = Path::spec();
    let ports = spec.field("portLevelMtls");
    if let Some(levels) = &policy.port_level_mtls {
        if levels.is_empty() {
            report.error(
                &ports,
                "port level mTLS, if defined, must have at least one element",
            );
        } else if !policy.selects_workloads() {
            report.error(
                &ports,
                "mesh/namespace peer authentication cannot have port level mTLS: \
                 set a selector with labels, or move the ports to a workload policy",
            );
        }
        for port in levels.keys() {
            if !(1..=65535).contains(port) {
                report.error(
                    &ports.key(&port.to_string()),
                    format!("port must be in range 1..65535, found {port}"),
                );
            }
        }
    }
    if let Some(selector) = &policy.selector {
        validate_policy_selector(&spec.field("selector"), selector, report);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    fn check(spec: serde_json::Value) -> crate::validation::Report {
        crate::validation::check_security("PeerAuthentication", spec)
    }

    #[test]
    fn errors_name_the_field() {
        let r = check(json!({"portLevelMtls": {"8080": {"mode": "STRICT"}}}));
        assert_eq!(r.errors[0].field, "spec.portLevelMtls");
        assert!(r.errors[0].message.contains("cannot have port level mTLS"));
        let r = check(json!({"selector": {"matchLabels": {"app": "a"}},
                             "portLevelMtls": {"70000": {"mode": "STRICT"}}}));
        assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
        assert!(
            r.errors[0].field.starts_with("spec.portLevelMtls"),
            "{:?}",
            r.errors
        );
        assert!(r.errors[0].message.contains("1..65535"));
        let r = check(json!({"selector": {"matchLabels": {"app": "*"}}}));
        assert!(
            r.errors[0].field.starts_with("spec.selector.matchLabels"),
            "{:?}",
            r.errors
        );
        let r = check(json!({"mtls": {"mode": "ON"}}));
        assert_eq!(r.errors[0].field, "spec.mtls.mode");
        assert!(check(json!({"mtls": {"mode": "STRICT"}})).is_valid());
    }
}
