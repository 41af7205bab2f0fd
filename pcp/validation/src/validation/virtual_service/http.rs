//! Checks of one HTTP route: what it may combine, its match conditions, and each thing it can do
//! to a request.

use pasa_istio::virtual_service::{
    Abort, AbortErrorType, CorsPolicy, Delay, DelayType, HttpDirectResponse, HttpFaultInjection,
    HttpMatchRequest, HttpMirrorPolicy, HttpRedirect, HttpRetry, HttpRewrite, HttpRoute, MatchType,
    Percent, RedirectPort, RedirectPortSelection, StringMatch, UnmatchedPreflights,
};

use super::super::common::{
    Check, is_dns1123_label, validate_duration, validate_labels, validate_port,
};
use super::super::{Path, Report};
use super::headers::{
    is_authority_header, validate_cors_header_name, validate_header_operations,
    validate_match_header_name,
};
use super::{
    re2, validate_destination, validate_gateway_names_errors_only, validate_total_weight,
    validate_weight,
};

/// Direct responses above this size are refused.
const DIRECT_RESPONSE_MAX_BYTES: usize = 1024 * 1024;
/// Direct responses above this size draw a warning.
const DIRECT_RESPONSE_WARN_BYTES: usize = 100 * 1024;

/// Methods a CORS policy may allow.
const CORS_METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE", "*",
];

/// Retry conditions Envoy knows (`x-envoy-retry-on` and `x-envoy-retry-grpc-on`).
const RETRY_ON_POLICIES: &[&str] = &[
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "retriable-headers",
    "envoy-ratelimited",
    "http3-post-connect-failure",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];

/// Whether `code` is a registered HTTP status code (the ones a `retryOn` list may name).
fn is_known_http_status(code: i64) -> bool {
    matches!(
        code,
        100..=103
            | 200..=208
            | 226
            | 300..=305
            | 307
            | 308
            | 400..=418
            | 421..=426
            | 428
            | 429
            | 431
            | 451
            | 500..=508
            | 510
            | 511
    )
}

/// How a route relates to delegation: a root hands matching requests to a delegate VirtualService,
/// a delegate's routes are reached only through a root.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RouteType {
    Independent,
    Root,
    Delegate,
}

/// Checks one HTTP route; `in_delegate` when the VirtualService is a delegate (has no hosts).
pub(super) fn validate_http_route(
    at: &Path,
    http: &HttpRoute,
    in_delegate: bool,
    report: &mut Report,
) {
    let route_type = if in_delegate {
        RouteType::Delegate
    } else if http.delegate.is_some() {
        RouteType::Root
    } else {
        RouteType::Independent
    };
    validate_conflicts(at, http, route_type, report);

    for (i, m) in http.matches.iter().enumerate() {
        validate_match(&at.field("match").index(i), m, report);
    }
    if let Some(headers) = &http.headers {
        validate_header_operations(&at.field("headers"), headers, report);
    }
    if let Some(cors) = &http.cors_policy {
        validate_cors_policy(&at.field("corsPolicy"), cors, report);
    }
    if let Some(fault) = &http.fault {
        validate_fault(&at.field("fault"), fault, report);
    }

    if let Some(percent) = http.mirror_percent {
        if percent > 100 {
            report.error(
                &at.field("mirrorPercent"),
                format!("mirror_percent must have a max value of 100 (it has {percent})"),
            );
        }
        report.warn(
            &at.field("mirrorPercent"),
            "using deprecated setting \"mirrorPercent\", use \"mirrorPercentage\" instead",
        );
    }
    if let Some(Percent { value }) = http.mirror_percentage {
        let here = at.field("mirrorPercentage").field("value");
        if value > 100.0 {
            report.error(
                &here,
                format!("mirror_percentage must have a max value of 100 (it has {value})"),
            );
        }
        if value < 0.0 {
            report.error(
                &here,
                format!("mirror_percentage must have a min value of 0 (it has {value})"),
            );
        }
    }
    if let Some(mirror) = &http.mirror {
        validate_destination(&at.field("mirror"), mirror, report);
    }
    for (i, mirror) in http.mirrors.iter().enumerate() {
        validate_mirror(&at.field("mirrors").index(i), mirror, report);
    }
    if let Some(redirect) = &http.redirect {
        report.check(
            &at.field("redirect"),
            validate_redirect(redirect, &http.matches),
        );
        if let Some(RedirectPort::DerivePort(RedirectPortSelection::Unknown(n))) =
            redirect.redirect_port
        {
            report.error(
                &at.field("redirect").field("derivePort"),
                unnamed_enum_value(n, RedirectPortSelection::NAMES),
            );
        }
    }
    if let Some(direct) = &http.direct_response {
        validate_direct_response(&at.field("directResponse"), direct, report);
    }
    if let Some(retries) = &http.retries {
        validate_retries(&at.field("retries"), retries, report);
    }
    if let Some(rewrite) = &http.rewrite {
        report.check(&at.field("rewrite"), validate_rewrite(rewrite));
    }
    report.check(&at.field("headers"), validate_single_authority(http));

    let route = at.field("route");
    for (i, rd) in http.route.iter().enumerate() {
        let here = route.index(i);
        match &rd.destination {
            Some(d) => validate_destination(&here.field("destination"), d, report),
            None => report.error(&here.field("destination"), "destination is required"),
        }
        if let Some(headers) = &rd.headers {
            validate_header_operations(&here.field("headers"), headers, report);
        }
        validate_weight(&here, rd.weight, report);
    }
    validate_total_weight(&route, http.route.iter().map(|rd| rd.weight), report);

    if let Some(timeout) = &http.timeout {
        report.check(&at.field("timeout"), validate_duration(timeout));
    }
}

/// What a route may combine: one of route, redirect and direct response; no fault or rewrite
/// beside a redirect or direct response; `mirror` or `mirrors`; delegation rules.
fn validate_conflicts(at: &Path, http: &HttpRoute, route_type: RouteType, report: &mut Report) {
    if route_type == RouteType::Root {
        if http.redirect.is_some() {
            report.error(
                &at.field("redirect"),
                format!(
                    "root HTTP route {} must not specify redirect: it delegates",
                    http.name
                ),
            );
        }
        if !http.route.is_empty() {
            report.error(
                &at.field("route"),
                format!(
                    "root HTTP route {} must not specify route: it delegates",
                    http.name
                ),
            );
        }
        return;
    }
    if route_type == RouteType::Delegate && http.delegate.is_some() {
        report.error(
            &at.field("delegate"),
            "delegate HTTP route cannot contain delegate: delegation is one level deep",
        );
    }

    if http.redirect.is_some() {
        if !http.route.is_empty() {
            report.error(at, "HTTP route cannot contain both route and redirect");
        }
        if http.fault.is_some() {
            report.error(at, "HTTP route cannot contain both fault and redirect");
        }
        if http.rewrite.is_some() {
            report.error(
                at,
                "HTTP route rule cannot contain both rewrite and redirect",
            );
        }
        if http.direct_response.is_some() {
            report.error(
                at,
                "HTTP route rule cannot contain both direct_response and redirect",
            );
        }
    } else if http.direct_response.is_some() {
        if !http.route.is_empty() {
            report.error(
                at,
                "HTTP route cannot contain both route and direct_response",
            );
        }
        if http.fault.is_some() {
            report.error(
                at,
                "HTTP route cannot contain both fault and direct_response",
            );
        }
        if http.rewrite.is_some() {
            report.error(
                at,
                "HTTP route rule cannot contain both rewrite and direct_response",
            );
        }
    } else if http.route.is_empty() {
        report.error(at, "HTTP route, redirect or direct_response is required");
    }

    if http.mirror.is_some() && !http.mirrors.is_empty() {
        report.error(at, "HTTP route cannot contain both mirror and mirrors");
    }
}

/// A string match: a prefix may not be empty, a regex must compile.
fn validate_string_match(at: &Path, m: &StringMatch, report: &mut Report) {
    match &m.match_type {
        Some(MatchType::Prefix(p)) if p.is_empty() => {
            report.error(at, "prefix string match should not be empty");
        }
        Some(MatchType::Regex(re)) => report.check(at, validate_match_regex(re)),
        _ => {}
    }
}

/// A regex string match: not empty, and valid RE2.
fn validate_match_regex(re: &str) -> Check {
    if re.is_empty() {
        return Err("regex string match should not be empty".to_string());
    }
    re2::validate(re)
}

fn validate_match(at: &Path, m: &HttpMatchRequest, report: &mut Report) {
    for (name, value) in &m.headers {
        let here = at.field("headers").key(name);
        report.check(&here, validate_match_header_name(name));
        validate_string_match(&here, value, report);
    }
    for (name, value) in &m.without_headers {
        let here = at.field("withoutHeaders").key(name);
        report.check(&here, validate_match_header_name(name));
        // A regex of `*` means "header present", not a regular expression.
        if value.as_regex() != Some("*") {
            validate_string_match(&here, value, report);
        }
    }
    // An empty URI prefix is allowed (it matches every path).
    if let Some(uri) = &m.uri
        && let Some(re) = uri.as_regex()
    {
        report.check(&at.field("uri"), validate_match_regex(re));
    }
    for (field, value) in [
        ("scheme", &m.scheme),
        ("method", &m.method),
        ("authority", &m.authority),
    ] {
        if let Some(value) = value {
            validate_string_match(&at.field(field), value, report);
        }
    }
    for (name, value) in &m.query_params {
        validate_string_match(&at.field("queryParams").key(name), value, report);
    }
    if m.port != 0 {
        report.check(&at.field("port"), validate_port(i64::from(m.port)));
    }
    validate_labels(&at.field("sourceLabels"), &m.source_labels, report);
    validate_gateway_names_errors_only(&at.field("gateways"), &m.gateways, report);
    if !m.source_namespace.is_empty() && !is_dns1123_label(&m.source_namespace) {
        report.error(
            &at.field("sourceNamespace"),
            format!(
                "sourceNamespace match {} is invalid: expected a namespace name",
                m.source_namespace
            ),
        );
    }
}

/// An enum value given as a number the API does not name: the CRD schema (enforced by the
/// Kubernetes API server before istiod sees the object) lists the names allowed.
fn unnamed_enum_value(n: i32, names: &[&str]) -> String {
    format!(
        "{n} is not a valid value: expected one of {}",
        names.join(", ")
    )
}

fn validate_cors_policy(at: &Path, cors: &CorsPolicy, report: &mut Report) {
    if let UnmatchedPreflights::Unknown(n) = cors.unmatched_preflights {
        report.error(
            &at.field("unmatchedPreflights"),
            unnamed_enum_value(n, UnmatchedPreflights::NAMES),
        );
    }
    for (i, origin) in cors.allow_origins.iter().enumerate() {
        let here = at.field("allowOrigins").index(i);
        let value = match &origin.match_type {
            Some(MatchType::Exact(s) | MatchType::Prefix(s) | MatchType::Regex(s)) => s.as_str(),
            None => "",
        };
        if value.is_empty() {
            report.error(
                &here,
                "'' is not a valid match type for CORS allow origins: give exact, prefix or regex a value",
            );
        } else if let Some(re) = origin.as_regex() {
            report.check(&here, re2::validate(re));
        }
    }
    for (i, method) in cors.allow_methods.iter().enumerate() {
        if !CORS_METHODS.contains(&method.as_str()) {
            report.error(
                &at.field("allowMethods").index(i),
                format!("{method:?} is not a supported HTTP method"),
            );
        }
    }
    for (field, names) in [
        ("allowHeaders", &cors.allow_headers),
        ("exposeHeaders", &cors.expose_headers),
    ] {
        for (i, name) in names.iter().enumerate() {
            report.check(&at.field(field).index(i), validate_cors_header_name(name));
        }
    }
    if let Some(max_age) = &cors.max_age {
        let here = at.field("maxAge");
        report.check(&here, validate_duration(max_age));
        if max_age.nanos > 0 {
            report.error(
                &here,
                "max_age duration is accurate only to seconds precision",
            );
        }
    }
}

fn validate_fault(at: &Path, fault: &HttpFaultInjection, report: &mut Report) {
    if fault.abort.is_none() && fault.delay.is_none() {
        report.error(at, "HTTP fault injection must have an abort and/or a delay");
    }
    if let Some(abort) = &fault.abort {
        validate_abort(&at.field("abort"), abort, report);
    }
    if let Some(delay) = &fault.delay {
        validate_delay(&at.field("delay"), delay, report);
    }
}

/// A fault's share of requests: 0, or between 0.0001 and 100.
fn validate_fault_percentage(at: &Path, percentage: Option<Percent>, report: &mut Report) {
    if let Some(Percent { value }) = percentage
        && (!(0.0..=100.0).contains(&value) || (value > 0.0 && value < 0.0001))
    {
        report.error(
            &at.field("percentage").field("value"),
            format!("percentage {value} is neither 0.0, nor in range [0.0001, 100.0]"),
        );
    }
}

/// An HTTP status a route may answer with.
fn validate_http_status(status: i64) -> Check {
    // istiod's bound: 600 passes.
    if !(200..=600).contains(&status) {
        return Err(format!("HTTP status {status} is not in range 200-599"));
    }
    Ok(())
}

fn validate_abort(at: &Path, abort: &Abort, report: &mut Report) {
    validate_fault_percentage(at, abort.percentage, report);
    match &abort.error_type {
        Some(AbortErrorType::GrpcStatus(status))
            if !pasa_istio::common::GRPC_STATUS_NAMES.contains(&status.as_str()) =>
        {
            report.error(
                &at.field("grpcStatus"),
                format!(
                    "gRPC status {status:?} is not supported. See https://github.com/grpc/grpc/blob/master/doc/statuscodes.md for a list of supported codes, for example 'NOT_FOUND'"
                ),
            );
        }
        Some(AbortErrorType::Http2Error(_)) => report.error(
            &at.field("http2Error"),
            "HTTP/2 abort fault injection not supported yet",
        ),
        Some(AbortErrorType::HttpStatus(status)) => report.check(
            &at.field("httpStatus"),
            validate_http_status(i64::from(*status)),
        ),
        // A known gRPC status. Without an error type istiod notes "abort configured, but error
        // type not set" but drops that warning on the way up, so the webhook never shows it.
        Some(AbortErrorType::GrpcStatus(_)) | None => {}
    }
}

fn validate_delay(at: &Path, delay: &Delay, report: &mut Report) {
    validate_fault_percentage(at, delay.percentage, report);
    match &delay.delay_type {
        Some(DelayType::FixedDelay(d)) => {
            report.check(&at.field("fixedDelay"), validate_duration(d));
        }
        Some(DelayType::ExponentialDelay(d)) => {
            let here = at.field("exponentialDelay");
            report.check(&here, validate_duration(d));
            report.error(&here, "exponentialDelay not supported yet");
        }
        None => {}
    }
}

fn validate_mirror(at: &Path, mirror: &HttpMirrorPolicy, report: &mut Report) {
    let Some(destination) = &mirror.destination else {
        report.error(
            &at.field("destination"),
            "destination is required for mirrors",
        );
        return;
    };
    validate_destination(&at.field("destination"), destination, report);
    if let Some(Percent { value }) = mirror.percentage {
        let here = at.field("percentage").field("value");
        if value > 100.0 {
            report.error(
                &here,
                format!("mirror percentage must have a max value of 100 (it has {value})"),
            );
        }
        if value < 0.0 {
            report.error(
                &here,
                format!("mirror percentage must have a min value of 0 (it has {value})"),
            );
        }
    }
}

/// A redirect: something to redirect to, a 3xx code, an http(s) scheme. Like istiod, only the
/// first problem is reported.
fn validate_redirect(redirect: &HttpRedirect, matches: &[HttpMatchRequest]) -> Check {
    if !redirect.uri.is_empty() && !redirect.prefix_rewrite.is_empty() {
        return Err("redirect may only specify one of uri or prefix_rewrite".to_string());
    }
    if !redirect.prefix_rewrite.is_empty()
        && matches
            .iter()
            .any(|m| m.uri.as_ref().is_some_and(|u| u.as_prefix().is_none()))
    {
        return Err(
            "redirect prefix_rewrite requires all URI matches to use prefix match type".to_string(),
        );
    }
    if redirect.uri.is_empty()
        && redirect.prefix_rewrite.is_empty()
        && redirect.authority.is_empty()
        && redirect.redirect_port.is_none()
        && redirect.scheme.is_empty()
    {
        return Err("redirect must specify URI, authority, scheme, or port".to_string());
    }
    if redirect.redirect_code != 0 && !(300..=399).contains(&redirect.redirect_code) {
        return Err(format!(
            "{} is not a valid redirect code, must be 3xx",
            redirect.redirect_code
        ));
    }
    if !redirect.scheme.is_empty() && redirect.scheme != "http" && redirect.scheme != "https" {
        return Err("invalid redirect scheme, must be \"http\" or \"https\"".to_string());
    }
    if let Some(RedirectPort::Port(port)) = redirect.redirect_port
        && port > 0
    {
        validate_port(i64::from(port))?;
    }
    Ok(())
}

fn validate_direct_response(at: &Path, direct: &HttpDirectResponse, report: &mut Report) {
    if let Some(body) = &direct.body {
        let size = body.len();
        if size > DIRECT_RESPONSE_MAX_BYTES {
            report.error(
                &at.field("body"),
                "large direct_responses may impact control plane performance, must be less than 1MB",
            );
        } else if size > DIRECT_RESPONSE_WARN_BYTES {
            report.warn(
                &at.field("body"),
                "large direct_responses may impact control plane performance",
            );
        }
    }
    // istiod reads the status as a signed 32-bit number.
    report.check(
        &at.field("status"),
        validate_http_status(i64::from(direct.status as i32)),
    );
}

fn validate_retries(at: &Path, retries: &HttpRetry, report: &mut Report) {
    if retries.attempts < 0 {
        report.error(&at.field("attempts"), "attempts cannot be negative");
    }
    if retries.attempts == 0
        && (retries.per_try_timeout.is_some()
            || !retries.retry_on.is_empty()
            || retries.retry_remote_localities.is_some())
    {
        report.error(
            at,
            "http retry policy configured when attempts are set to 0 (disabled)",
        );
    }
    if let Some(timeout) = &retries.per_try_timeout {
        report.check(&at.field("perTryTimeout"), validate_duration(timeout));
    }
    if !retries.retry_on.is_empty() {
        for policy in retries.retry_on.split(',') {
            let status = policy.parse::<i64>().unwrap_or(0);
            if !is_known_http_status(status) && !RETRY_ON_POLICIES.contains(&policy) {
                report.error(
                    &at.field("retryOn"),
                    format!("{policy:?} is not a valid retryOn policy"),
                );
            }
        }
    }
    if let Some(backoff) = &retries.backoff {
        report.check(&at.field("backoff"), validate_duration(backoff));
    }
}

/// A rewrite: something to rewrite, and not both `uri` and `uriRegexRewrite`.
fn validate_rewrite(rewrite: &HttpRewrite) -> Check {
    if !rewrite.uri.is_empty() && rewrite.uri_regex_rewrite.is_some() {
        return Err("rewrite may only contain one of URI or UriRegexRewrite".to_string());
    }
    if rewrite.uri.is_empty() && rewrite.uri_regex_rewrite.is_none() && rewrite.authority.is_empty()
    {
        return Err("rewrite must specify at least one of URI, UriRegexRewrite, or authority. Only one of URI or UriRegexRewrite may be specified".to_string());
    }
    if let Some(regex) = &rewrite.uri_regex_rewrite {
        if regex.pattern.is_empty() || regex.rewrite.is_empty() {
            return Err(
                "UriRegexRewrite has errors: UriRegexRewrite requires both Rewrite and Match fields to be specified"
                    .to_string(),
            );
        }
        re2::validate(&regex.pattern).map_err(|e| format!("UriRegexRewrite has errors: {e}"))?;
    }
    Ok(())
}

/// The authority may be rewritten in one place only: `rewrite.authority`, or one `:authority` /
/// `Host` entry of the request headers to set or add.
fn validate_single_authority(http: &HttpRoute) -> Check {
    let mut current = http
        .rewrite
        .as_ref()
        .map(|r| r.authority.as_str())
        .unwrap_or_default();
    let Some(request) = http.headers.as_ref().and_then(|h| h.request.as_ref()) else {
        return Ok(());
    };
    for (name, value) in request.set.iter().chain(&request.add) {
        if !is_authority_header(name) {
            continue;
        }
        if !current.is_empty() {
            return Err(format!(
                "authority header cannot be set multiple times: have {current:?}, attempting to set {value:?}"
            ));
        }
        current = value;
    }
    Ok(())
}
