//! Validation of `DestinationRule`, following istiod.

use pasa_proto::Object;
use pasa_proto::istio::common::Duration;
use pasa_proto::istio::destination_rule::{
    ConnectionPoolSettings, H2UpgradePolicy, HttpSettings, TcpSettings,
};

use super::common::validate_duration;
use super::{Path, Report};

/// Checks one DestinationRule.
pub fn validate(_obj: &Object, _report: &mut Report) {}

/// Records a duration rule break (at least 1ms, whole milliseconds) for an optional duration.
fn check_duration(at: &Path, d: Option<&Duration>, report: &mut Report) {
    if let Some(d) = d {
        report.check(at, validate_duration(d));
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
