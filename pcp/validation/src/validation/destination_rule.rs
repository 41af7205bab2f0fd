//! Validation of `DestinationRule`, following istiod's webhook and the CRD schema (limits and CEL
//! rules the API server would enforce first).

mod load_balancer;
mod tls;

use std::collections::HashSet;
use std::fmt::Display;

use pasa_istio::common::Duration;
use pasa_istio::destination_rule::{
    ClientTlsSettings, ConnectionPoolSettings, DestinationRule, H2UpgradePolicy, HttpSettings,
    LoadBalancerSettings, OutlierDetection, PortTrafficPolicy, ProxyProtocol, RetryBudget, Subset,
    TcpSettings, TrafficPolicy, TunnelSettings,
};
use pasa_proto::Object;

use super::common::{
    ExportToRules, is_dns1123_label, validate_duration, validate_export_to, validate_fqdn,
    validate_ip_address, validate_labels, validate_policy_selector, validate_port,
    validate_wildcard_domain,
};
use super::{Path, Report, parse};

/// The CRD's cap on `portLevelSettings` entries.
const MAX_PORT_LEVEL_SETTINGS: usize = 4096;

/// Checks one DestinationRule.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(rule) = parse::<DestinationRule>(obj, report) else {
        return;
    };
    let spec = Path::spec();
    let ns = obj.namespace.as_str();

    report.check(&spec.field("host"), validate_wildcard_domain(&rule.host));
    if let Some(policy) = &rule.traffic_policy {
        validate_traffic_policy(&spec.field("trafficPolicy"), ns, policy, report);
    }

    let mut names = HashSet::new();
    for (i, subset) in rule.subsets.iter().enumerate() {
        let at = spec.field("subsets").index(i);
        if !names.insert(subset.name.as_str()) {
            report.error(
                &at.field("name"),
                format!("duplicate subset names: {}", subset.name),
            );
        }
        validate_subset(&at, ns, subset, report);
    }

    validate_export_to(
        &spec.field("exportTo"),
        ns,
        &rule.export_to,
        ExportToRules {
            is_destination_rule_with_selector: rule.workload_selector.is_some(),
            ..Default::default()
        },
        report,
    );
    if let Some(selector) = &rule.workload_selector {
        validate_policy_selector(&spec.field("workloadSelector"), selector, report);
    }
}

fn validate_subset(at: &Path, ns: &str, subset: &Subset, report: &mut Report) {
    let name = &subset.name;
    if name.is_empty() {
        report.error(&at.field("name"), "subset name cannot be empty");
    } else if !is_dns1123_label(name) {
        report.error(
            &at.field("name"),
            format!("subset name is invalid: {name} (must be a DNS label)"),
        );
    }
    validate_labels(&at.field("labels"), &subset.labels, report);
    if let Some(policy) = &subset.traffic_policy {
        validate_traffic_policy(&at.field("trafficPolicy"), ns, policy, report);
    }
}

/// A traffic policy of the rule or of a subset; `ns` is the rule's namespace.
fn validate_traffic_policy(at: &Path, ns: &str, policy: &TrafficPolicy, report: &mut Report) {
    if policy.load_balancer.is_none()
        && policy.connection_pool.is_none()
        && policy.outlier_detection.is_none()
        && policy.tls.is_none()
        && policy.port_level_settings.is_empty()
        && policy.tunnel.is_none()
        && policy.proxy_protocol.is_none()
        && policy.retry_budget.is_none()
    {
        report.error(at, "traffic policy must have at least one field");
        return;
    }
    if policy.tunnel.is_some() && policy.proxy_protocol.is_some() {
        report.error(at, "tunnel and proxyProtocol must not be set together");
        return;
    }
    validate_policy_parts(
        at,
        ns,
        Parts {
            load_balancer: policy.load_balancer.as_ref(),
            connection_pool: policy.connection_pool.as_ref(),
            outlier_detection: policy.outlier_detection.as_ref(),
            tls: policy.tls.as_ref(),
        },
        report,
    );
    if policy.port_level_settings.len() > MAX_PORT_LEVEL_SETTINGS {
        report.error(
            &at.field("portLevelSettings"),
            format!("at most {MAX_PORT_LEVEL_SETTINGS} port level settings are allowed"),
        );
    }
    for (i, port_policy) in policy.port_level_settings.iter().enumerate() {
        validate_port_policy(
            &at.field("portLevelSettings").index(i),
            ns,
            port_policy,
            report,
        );
    }
    if let Some(tunnel) = &policy.tunnel {
        validate_tunnel(&at.field("tunnel"), tunnel, report);
    }
    if let Some(pp) = &policy.proxy_protocol {
        validate_proxy_protocol(&at.field("proxyProtocol"), pp, report);
    }
    if let Some(budget) = &policy.retry_budget {
        validate_retry_budget(&at.field("retryBudget"), budget, report);
    }
}

/// The settings a traffic policy and a port policy share.
struct Parts<'a> {
    load_balancer: Option<&'a LoadBalancerSettings>,
    connection_pool: Option<&'a ConnectionPoolSettings>,
    outlier_detection: Option<&'a OutlierDetection>,
    tls: Option<&'a ClientTlsSettings>,
}

fn validate_policy_parts(at: &Path, ns: &str, parts: Parts<'_>, report: &mut Report) {
    if let Some(outlier) = parts.outlier_detection {
        validate_outlier_detection(&at.field("outlierDetection"), outlier, report);
    }
    if let Some(cp) = parts.connection_pool {
        validate_connection_pool(&at.field("connectionPool"), cp, report);
    }
    if let Some(lb) = parts.load_balancer {
        load_balancer::validate_load_balancer(
            &at.field("loadBalancer"),
            lb,
            parts.outlier_detection,
            report,
        );
    }
    if let Some(tls) = parts.tls {
        tls::validate_client_tls(&at.field("tls"), ns, tls, report);
    }
}

fn validate_port_policy(at: &Path, ns: &str, policy: &PortTrafficPolicy, report: &mut Report) {
    if policy.port.is_none() {
        report.error(&at.field("port"), "portTrafficPolicy must have valid port");
    }
    if policy.load_balancer.is_none()
        && policy.connection_pool.is_none()
        && policy.outlier_detection.is_none()
        && policy.tls.is_none()
    {
        report.error(at, "port traffic policy must have at least one field");
        return;
    }
    validate_policy_parts(
        at,
        ns,
        Parts {
            load_balancer: policy.load_balancer.as_ref(),
            connection_pool: policy.connection_pool.as_ref(),
            outlier_detection: policy.outlier_detection.as_ref(),
            tls: policy.tls.as_ref(),
        },
        report,
    );
}

fn validate_tunnel(at: &Path, tunnel: &TunnelSettings, report: &mut Report) {
    if !matches!(tunnel.protocol.as_str(), "" | "CONNECT" | "POST") {
        report.error(
            &at.field("protocol"),
            format!(
                "tunnel protocol must be \"CONNECT\" or \"POST\", got {:?}",
                tunnel.protocol
            ),
        );
    }
    if let (Err(fqdn), Err(ip)) = (
        validate_fqdn(&tunnel.target_host),
        validate_ip_address(&tunnel.target_host),
    ) {
        report.error(
            &at.field("targetHost"),
            format!("tunnel target host must be valid FQDN or IP address: {fqdn}; {ip}"),
        );
    }
    if let Err(e) = validate_port(i64::from(tunnel.target_port)) {
        report.error(
            &at.field("targetPort"),
            format!("tunnel target port is invalid: {e}"),
        );
    }
}

fn validate_proxy_protocol(at: &Path, pp: &ProxyProtocol, report: &mut Report) {
    if pp.version.name().is_none() {
        report.error(
            &at.field("version"),
            format!(
                "proxy protocol version is invalid: {} (expected V1 or V2)",
                pp.version.number()
            ),
        );
    }
}

/// Only the CRD constrains the retry budget: a percentage.
fn validate_retry_budget(at: &Path, budget: &RetryBudget, report: &mut Report) {
    if let Some(p) = budget.percent
        && !(0.0..=100.0).contains(&p)
    {
        report.error(
            &at.field("percent"),
            format!("retry budget percent {p} is not in range 0..100"),
        );
    }
}

fn validate_outlier_detection(at: &Path, outlier: &OutlierDetection, report: &mut Report) {
    check_duration(
        &at.field("baseEjectionTime"),
        outlier.base_ejection_time.as_ref(),
        report,
    );
    if outlier.consecutive_errors != 0 {
        report.warn(
            &at.field("consecutiveErrors"),
            "outlier detection consecutiveErrors is deprecated, use consecutiveGatewayErrors or \
             consecutive5xxErrors instead",
        );
    }
    if !outlier.split_external_local_origin_errors
        && outlier.consecutive_local_origin_failures.unwrap_or(0) > 0
    {
        report.error(
            &at.field("consecutiveLocalOriginFailures"),
            "outlier detection consecutive local origin failures is specified, but split external \
             local origin errors is set to false",
        );
    }
    check_duration(&at.field("interval"), outlier.interval.as_ref(), report);
    for (field, value) in [
        ("maxEjectionPercent", outlier.max_ejection_percent),
        ("minHealthPercent", outlier.min_health_percent),
    ] {
        if !(0..=100).contains(&value) {
            report.error(
                &at.field(field),
                format!("percentage {value} is not in range 0..100"),
            );
        }
    }
    for (i, code) in outlier
        .outlier_detection_http_error_codes
        .iter()
        .enumerate()
    {
        if !(100..=599).contains(code) {
            report.error(
                &at.field("outlierDetectionHttpErrorCodes").index(i),
                format!("HTTP status code {code} is not in range 100..599"),
            );
        }
    }
}

/// Records a duration rule break (at least 1ms, whole milliseconds) for an optional duration.
fn check_duration(at: &Path, d: Option<&Duration>, report: &mut Report) {
    if let Some(d) = d {
        report.check(at, validate_duration(d));
    }
}

/// The CRD's rule for durations istiod does not check itself: at least 1ms.
fn check_at_least_1ms(at: &Path, d: &Duration, report: &mut Report) {
    if d.as_nanos() < 1_000_000 {
        report.error(at, format!("duration {d} must be at least 1ms"));
    }
}

/// An enum field must hold a named value (the CRD lists the names; a bare number is refused).
fn check_named(
    at: &Path,
    name: Option<&str>,
    value: impl Display,
    names: &[&str],
    report: &mut Report,
) {
    if name.is_none() {
        report.error(
            at,
            format!(
                "unknown value {value}: expected one of {}",
                names.join(", ")
            ),
        );
    }
}

/// A connection pool (DestinationRule traffic policies, Sidecar inbound and ingress pools): at least
/// one of `tcp`/`http`, no negative limits, valid durations.
pub fn validate_connection_pool(at: &Path, cp: &ConnectionPoolSettings, report: &mut Report) {
    if cp.tcp.is_none() && cp.http.is_none() {
        report.error(
            at,
            "connection pool must have at least one field (tcp or http)",
        );
        return;
    }
    if let Some(http) = &cp.http {
        validate_http_pool(&at.field("http"), http, report);
    }
    if let Some(tcp) = &cp.tcp {
        validate_tcp_pool(&at.field("tcp"), tcp, report);
    }
}

fn validate_http_pool(at: &Path, http: &HttpSettings, report: &mut Report) {
    for (field, value, what) in [
        (
            "http1MaxPendingRequests",
            http.http1_max_pending_requests,
            "http1 max pending requests",
        ),
        (
            "http2MaxRequests",
            http.http2_max_requests,
            "http2 max requests",
        ),
        (
            "maxRequestsPerConnection",
            http.max_requests_per_connection,
            "max requests per connection",
        ),
        ("maxRetries", http.max_retries, "max retries"),
        (
            "maxConcurrentStreams",
            http.max_concurrent_streams,
            "max concurrent streams",
        ),
    ] {
        if value < 0 {
            report.error(
                &at.field(field),
                format!("{what} must be non-negative, got {value}"),
            );
        }
    }
    check_duration(&at.field("idleTimeout"), http.idle_timeout.as_ref(), report);
    check_named(
        &at.field("h2UpgradePolicy"),
        http.h2_upgrade_policy.name(),
        http.h2_upgrade_policy,
        H2UpgradePolicy::NAMES,
        report,
    );
    if http.h2_upgrade_policy == H2UpgradePolicy::Upgrade && http.use_client_protocol {
        report.error(
            &at.field("useClientProtocol"),
            "use client protocol must not be true when h2UpgradePolicy is UPGRADE",
        );
    }
    if let Some(keepalive) = &http.http2_keep_alive {
        let at = at.field("http2KeepAlive");
        for (field, value) in [
            ("interval", keepalive.interval.as_ref()),
            ("timeout", keepalive.timeout.as_ref()),
        ] {
            match value {
                None => report.error(
                    &at.field(field),
                    format!("http2 keepalive {field} is required"),
                ),
                Some(d) => report.check(&at.field(field), validate_duration(d)),
            }
        }
    }
}

fn validate_tcp_pool(at: &Path, tcp: &TcpSettings, report: &mut Report) {
    if tcp.max_connections < 0 {
        report.error(
            &at.field("maxConnections"),
            format!(
                "max connections must be non-negative, got {}",
                tcp.max_connections
            ),
        );
    }
    check_duration(
        &at.field("connectTimeout"),
        tcp.connect_timeout.as_ref(),
        report,
    );
    check_duration(
        &at.field("maxConnectionDuration"),
        tcp.max_connection_duration.as_ref(),
        report,
    );
    // Under a millisecond (`0s`) turns the idle timeout off; anything longer must be valid.
    if let Some(idle) = &tcp.idle_timeout
        && idle.as_nanos().abs() >= 1_000_000
    {
        report.check(&at.field("idleTimeout"), validate_duration(idle));
    }
    if let Some(ka) = &tcp.tcp_keepalive {
        let at = at.field("tcpKeepalive");
        check_duration(&at.field("time"), ka.time.as_ref(), report);
        check_duration(&at.field("interval"), ka.interval.as_ref(), report);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn check(spec: Value) -> Report {
        let doc = json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": "r", "namespace": "ns"},
            "spec": spec,
        });
        let obj = Object::from_json(&doc, "default", pasa_istio::generated::is_generated_object)
            .expect("a well-formed object");
        let mut report = Report::default();
        validate(&obj, &mut report);
        report
    }

    fn fields(problems: &[super::super::Problem]) -> Vec<&str> {
        problems.iter().map(|p| p.field.as_str()).collect()
    }

    #[test]
    fn connection_pool_rules() {
        let r = check(json!({"host": "r", "trafficPolicy": {"connectionPool": {
            "tcp": {"idleTimeout": "0s", "maxConnections": -1},
            "http": {"http2KeepAlive": {"interval": "1s"}, "h2UpgradePolicy": "UPGRADE", "useClientProtocol": true}
        }}}));
        assert_eq!(
            fields(&r.errors),
            [
                "spec.trafficPolicy.connectionPool.http.useClientProtocol",
                "spec.trafficPolicy.connectionPool.http.http2KeepAlive.timeout",
                "spec.trafficPolicy.connectionPool.tcp.maxConnections",
            ]
        );
        // `0s` turns the TCP idle timeout off; a sub-millisecond HTTP one is an error.
        let r = check(json!({"host": "r", "trafficPolicy": {"connectionPool": {
            "tcp": {"idleTimeout": "0s"}, "http": {"idleTimeout": "0.0005s"}
        }}}));
        assert_eq!(
            fields(&r.errors),
            ["spec.trafficPolicy.connectionPool.http.idleTimeout"]
        );
        let r = check(json!({"host": "r", "trafficPolicy": {"connectionPool": {}}}));
        assert!(r.errors[0].message.contains("at least one field"));
    }

    #[test]
    fn traffic_policy_shape() {
        let r = check(json!({"host": "r", "trafficPolicy": {}}));
        assert_eq!(fields(&r.errors), ["spec.trafficPolicy"]);
        let r = check(json!({"host": "r", "trafficPolicy": {
            "tunnel": {"targetHost": "proxy.example.com", "targetPort": 3128},
            "proxyProtocol": {"version": "V2"}
        }}));
        assert!(r.errors[0].message.contains("tunnel and proxyProtocol"));
        let r = check(json!({"host": "r", "trafficPolicy": {
            "tunnel": {"protocol": "GET", "targetHost": "not a host", "targetPort": 0}
        }}));
        assert_eq!(
            fields(&r.errors),
            [
                "spec.trafficPolicy.tunnel.protocol",
                "spec.trafficPolicy.tunnel.targetHost",
                "spec.trafficPolicy.tunnel.targetPort",
            ]
        );
        let r = check(json!({"host": "r", "trafficPolicy": {"portLevelSettings": [{}]}}));
        assert_eq!(
            fields(&r.errors),
            [
                "spec.trafficPolicy.portLevelSettings[0].port",
                "spec.trafficPolicy.portLevelSettings[0]",
            ]
        );
    }

    #[test]
    fn outlier_detection_and_failover() {
        let r = check(json!({"host": "r", "trafficPolicy": {
            "outlierDetection": {"consecutiveErrors": 5, "consecutiveLocalOriginFailures": 2,
                                 "outlierDetectionHttpErrorCodes": [503, 600]},
        }}));
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        assert_eq!(
            fields(&r.errors),
            [
                "spec.trafficPolicy.outlierDetection.consecutiveLocalOriginFailures",
                "spec.trafficPolicy.outlierDetection.outlierDetectionHttpErrorCodes[1]",
            ]
        );
        // Failover without outlier detection is allowed, with a warning.
        let r = check(json!({"host": "r", "trafficPolicy": {"loadBalancer": {
            "localityLbSetting": {"failover": [{"from": "us-east", "to": "us-west"}]}
        }}}));
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(r.warnings.len(), 1);
        let r = check(json!({"host": "r", "trafficPolicy": {"loadBalancer": {
            "localityLbSetting": {"distribute": [{"from": "a/*", "to": {"b/*": 60, "c/*": 30}}]}
        }}}));
        assert!(r.errors[0].message.contains("total locality weight 90"));
    }

    #[test]
    fn subsets_and_selector() {
        let r = check(json!({"host": "r", "subsets": [
            {"name": "v1"}, {"name": "v1"}, {"name": "V_2", "labels": {"-bad": "x"}}
        ]}));
        assert_eq!(
            fields(&r.errors),
            [
                "spec.subsets[1].name",
                "spec.subsets[2].name",
                "spec.subsets[2].labels[-bad]",
            ]
        );
        let r = check(
            json!({"host": "r", "workloadSelector": {"matchLabels": {"app": "a"}},
                             "exportTo": ["*"]}),
        );
        assert!(
            r.errors[0]
                .message
                .contains("cannot have exportTo beyond current namespace")
        );
    }
}
