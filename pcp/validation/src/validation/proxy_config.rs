//! Validation of `ProxyConfig`, following istiod's webhook: its workload selector, and a
//! concurrency that is not negative.

use pasa_istio::proxy_config::ProxyConfig;
use pasa_proto::Object;

use super::common::validate_policy_selector;
use super::{Path, Report, parse};

/// Checks one ProxyConfig.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(config) = parse::<ProxyConfig>(obj, report) else {
        return;
    };
    let spec = Path::spec();
    if let Some(selector) = &config.selector {
        validate_policy_selector(&spec.field("selector"), selector, report);
    }
    if config.concurrency.is_some_and(|c| c < 0) {
        report.error(
            &spec.field("concurrency"),
            "concurrency must be greater than or equal to 0",
        );
    }
}
