//! A route's extras besides its action: header edits, fault injection, CORS and persistent
//! sessions.

use envoy_types::pb::envoy::config::core::v3::{
    HeaderValue, HeaderValueOption, RuntimeFractionalPercent,
    header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::config::route::v3::Route;
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::extensions::filters::common::fault::v3::{
    FaultDelay, fault_delay::FaultDelaySecifier,
};
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{
    FaultAbort, HttpFault, fault_abort::ErrorType,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent::DenominatorType};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;
use pasa_istio::virtual_service::Percent;
use pasa_istio::virtual_service::{AbortErrorType, DelayType, HeaderOperations, HttpRoute};

use super::super::builders::duration;
use super::action::single_destination;
use super::{CORS_FILTER, Destinations, FAULT_FILTER, string_matcher};

/// Route-level extras: header edits, fault injection, CORS, and the persistent sessions of the
/// first destination's service that has them (istiod's choice when several have).
pub(super) fn decorate(
    route: &mut Route,
    rule: &HttpRoute,
    namespace: &str,
    _port: u32,
    destinations: &impl Destinations,
) {
    let session = rule
        .route
        .iter()
        .filter_map(|r| r.destination.as_ref())
        .find_map(|d| destinations.persistent_session(d, namespace));
    if let Some(session) = session {
        super::super::session::configure(&mut route.typed_per_filter_config, session);
    }
    // The route's own edits, then those of its single destination (several destinations
    // carry theirs on their weighted clusters).
    let single = matches!(route.action, Some(Action::Route(_)))
        .then(|| single_destination(rule).and_then(|d| d.headers.as_ref()))
        .flatten();
    for h in rule.headers.iter().chain(single) {
        let edits = HeaderEdits::of(h);
        route.request_headers_to_add.extend(edits.request_add);
        route.request_headers_to_remove.extend(edits.request_remove);
        route.response_headers_to_add.extend(edits.response_add);
        route
            .response_headers_to_remove
            .extend(edits.response_remove);
    }
    if let Some(fault) = &rule.fault {
        let mut f = HttpFault::default();
        if let Some(delay) = &fault.delay
            && let Some(DelayType::FixedDelay(d)) = &delay.delay_type
        {
            f.delay = Some(FaultDelay {
                fault_delay_secifier: Some(FaultDelaySecifier::FixedDelay(duration(d))),
                percentage: Some(percentage(delay.percentage, delay.percent)),
            });
        }
        if let Some(abort) = &fault.abort {
            let error_type = match &abort.error_type {
                Some(AbortErrorType::HttpStatus(s)) => Some(ErrorType::HttpStatus(*s as u32)),
                Some(AbortErrorType::GrpcStatus(name)) => {
                    pasa_istio::common::grpc_status_code(name).map(ErrorType::GrpcStatus)
                }
                _ => None,
            };
            if error_type.is_some() {
                f.abort = Some(FaultAbort {
                    error_type,
                    percentage: Some(percentage(abort.percentage, 0)),
                    ..Default::default()
                });
            }
        }
        route
            .typed_per_filter_config
            .insert(FAULT_FILTER.into(), pack_any(f));
    }
    if let Some(cors) = &rule.cors_policy {
        route
            .typed_per_filter_config
            .insert(CORS_FILTER.into(), cors_policy(cors));
    }
}

fn cors_policy(cors: &pasa_istio::virtual_service::CorsPolicy) -> Any {
    use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;
    let mut origins: Vec<StringMatcher> = cors
        .allow_origins
        .iter()
        .filter_map(string_matcher)
        .collect();
    origins.extend(cors.allow_origin.iter().map(|o| StringMatcher {
        match_pattern: Some(MatchPattern::Exact(o.clone())),
        ..Default::default()
    }));
    pack_any(CorsPolicy {
        allow_origin_string_match: origins,
        allow_methods: cors.allow_methods.join(","),
        allow_headers: cors.allow_headers.join(","),
        expose_headers: cors.expose_headers.join(","),
        max_age: cors
            .max_age
            .as_ref()
            .map(|d| d.seconds.to_string())
            .unwrap_or_default(),
        allow_credentials: cors
            .allow_credentials
            .map(|value| envoy_types::pb::google::protobuf::BoolValue { value }),
        // On for every request, and preflights no origin matches go on to the app (unless the
        // policy says to ignore them), as istiod sets them.
        filter_enabled: Some(RuntimeFractionalPercent {
            default_value: Some(FractionalPercent {
                numerator: 100,
                denominator: DenominatorType::Hundred as i32,
            }),
            ..Default::default()
        }),
        forward_not_matching_preflights: Some(envoy_types::pb::google::protobuf::BoolValue {
            value: cors.unmatched_preflights
                != pasa_istio::virtual_service::UnmatchedPreflights::Ignore,
        }),
        ..Default::default()
    })
}

/// A fault percentage: `percentage` when set, else the deprecated whole `percent`, else all.
pub(super) fn percentage(p: Option<Percent>, whole: i32) -> FractionalPercent {
    match p {
        Some(p) => fraction(p.value),
        None if whole > 0 => fraction(f64::from(whole)),
        None => fraction(100.0),
    }
}

pub(super) fn fraction(percent: f64) -> FractionalPercent {
    FractionalPercent {
        numerator: (percent * 10_000.0).round().clamp(0.0, 1_000_000.0) as u32,
        denominator: DenominatorType::Million as i32,
    }
}

/// Istio's header operations as Envoy's: `set` overwrites, `add` appends (sorted by name, `set`
/// first); the pseudo-headers and `host`, which Envoy refuses to edit, are left out, and a `host`
/// or `:authority` a request sets (`set` over `add`) becomes the authority rewrite.
#[derive(Default)]
pub(super) struct HeaderEdits {
    pub(super) request_add: Vec<HeaderValueOption>,
    pub(super) request_remove: Vec<String>,
    pub(super) response_add: Vec<HeaderValueOption>,
    pub(super) response_remove: Vec<String>,
    pub(super) authority: Option<String>,
}

impl HeaderEdits {
    pub(super) fn of(headers: &pasa_istio::virtual_service::Headers) -> HeaderEdits {
        let mut edits = HeaderEdits::default();
        if let Some(req) = &headers.request {
            edits.request_add = header_options(req);
            edits.request_remove = removable(&req.remove);
            let authority = |m: &std::collections::BTreeMap<String, String>| {
                m.iter()
                    .filter(|(k, _)| is_authority(k))
                    .map(|(_, v)| v.clone())
                    .next_back()
            };
            edits.authority = authority(&req.set).or_else(|| authority(&req.add));
        }
        if let Some(resp) = &headers.response {
            edits.response_add = header_options(resp);
            edits.response_remove = removable(&resp.remove);
        }
        edits
    }
}

/// `host` and the pseudo-headers: Envoy's own, never edited as ordinary headers.
fn is_internal_header(name: &str) -> bool {
    name.starts_with(':') || name.eq_ignore_ascii_case("host")
}

fn is_authority(name: &str) -> bool {
    name.eq_ignore_ascii_case("host") || name.eq_ignore_ascii_case(":authority")
}

fn removable(names: &[String]) -> Vec<String> {
    names
        .iter()
        .filter(|n| !is_internal_header(n))
        .cloned()
        .collect()
}

fn header_options(ops: &HeaderOperations) -> Vec<HeaderValueOption> {
    let option = |(key, value): (&String, &String), action: HeaderAppendAction| HeaderValueOption {
        header: Some(HeaderValue {
            key: key.clone(),
            value: value.clone(),
            ..Default::default()
        }),
        append_action: action as i32,
        ..Default::default()
    };
    let external = |(key, _): &(&String, &String)| !is_internal_header(key);
    ops.set
        .iter()
        .filter(external)
        .map(|kv| option(kv, HeaderAppendAction::OverwriteIfExistsOrAdd))
        .chain(
            ops.add
                .iter()
                .filter(external)
                .map(|kv| option(kv, HeaderAppendAction::AppendIfExistsOrAdd)),
        )
        .collect()
}
