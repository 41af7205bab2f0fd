//! The HTTP side of a VirtualService: routes, their match conditions and everything a route can
//! do to a request (rewrite, redirect, direct response, retries, faults, mirroring, CORS, headers).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Destination, Percent, StringMatch, is_default};
use crate::common::Duration;
use crate::common::check_oneof;
use crate::proto_enum;

/// One HTTP rule: conditions, and what to do with a request that meets any of them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRoute {
    /// Names the rule in access logs and in warnings.
    #[serde(skip_serializing_if = "is_default")]
    pub name: String,
    /// Conditions, any of which selects the rule (`match` in the API); none matches every request.
    #[serde(rename = "match", skip_serializing_if = "is_default")]
    pub matches: Vec<HttpMatchRequest>,
    /// Where to forward, with weights.
    #[serde(skip_serializing_if = "is_default")]
    pub route: Vec<HttpRouteDestination>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redirect: Option<HttpRedirect>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_response: Option<HttpDirectResponse>,
    /// Hands the rest of the routing to another VirtualService (root VirtualServices only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delegate: Option<Delegate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<HttpRewrite>,
    /// Overall request timeout; unset means none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retries: Option<HttpRetry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<HttpFaultInjection>,
    /// A single mirror destination (see `mirrors` for several).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirror: Option<Destination>,
    #[serde(skip_serializing_if = "is_default")]
    pub mirrors: Vec<HttpMirrorPolicy>,
    /// Deprecated whole-number share of traffic mirrored; the CRD also accepts `mirror_percent`.
    #[serde(alias = "mirror_percent", skip_serializing_if = "Option::is_none")]
    pub mirror_percent: Option<u32>,
    /// Share of traffic sent to `mirror`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mirror_percentage: Option<Percent>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cors_policy: Option<CorsPolicy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
}

/// The VirtualService a root rule delegates to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Delegate {
    #[serde(skip_serializing_if = "is_default")]
    pub name: String,
    /// Defaults to the root VirtualService's namespace.
    #[serde(skip_serializing_if = "is_default")]
    pub namespace: String,
}

/// Header changes on the request (before forwarding) and on the response.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Headers {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<HeaderOperations>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response: Option<HeaderOperations>,
}

/// Headers to overwrite, append and remove.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HeaderOperations {
    #[serde(skip_serializing_if = "is_default")]
    pub set: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "is_default")]
    pub add: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "is_default")]
    pub remove: Vec<String>,
}

/// Conditions on a request; every field set must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpMatchRequest {
    /// Names the condition in logs and warnings; not part of the condition.
    #[serde(skip_serializing_if = "is_default")]
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri: Option<StringMatch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheme: Option<StringMatch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<StringMatch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authority: Option<StringMatch>,
    /// Request headers (lower-case names); `@request.auth.claims.*` keys match JWT claims.
    #[serde(skip_serializing_if = "is_default")]
    pub headers: BTreeMap<String, StringMatch>,
    /// Port the request arrived on; 0 means any.
    #[serde(skip_serializing_if = "is_default")]
    pub port: u32,
    #[serde(skip_serializing_if = "is_default")]
    pub source_labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "is_default")]
    pub gateways: Vec<String>,
    #[serde(skip_serializing_if = "is_default")]
    pub query_params: BTreeMap<String, StringMatch>,
    /// Match `uri` without regard to case.
    #[serde(skip_serializing_if = "is_default")]
    pub ignore_uri_case: bool,
    /// Headers that must not match (or, with `{}`, must be absent).
    #[serde(skip_serializing_if = "is_default")]
    pub without_headers: BTreeMap<String, StringMatch>,
    #[serde(skip_serializing_if = "is_default")]
    pub source_namespace: String,
    /// Prefix of the route's statistics in Envoy.
    #[serde(skip_serializing_if = "is_default")]
    pub stat_prefix: String,
}

/// A weighted destination of an HTTP route, with its own header changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRouteDestination {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination: Option<Destination>,
    #[serde(skip_serializing_if = "is_default")]
    pub weight: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
}

proto_enum! {
    /// The port a redirect points to when no explicit port is given.
    pub enum RedirectPortSelection {
        /// 80 for http, 443 for https.
        FromProtocolDefault = 0 => "FROM_PROTOCOL_DEFAULT",
        /// The port the request came in on.
        FromRequestPort = 1 => "FROM_REQUEST_PORT",
    }
}

/// The `redirect_port` oneof of [`HttpRedirect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedirectPort {
    Port(u32),
    DerivePort(RedirectPortSelection),
}

/// Answers with a 3xx redirect instead of forwarding.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "HttpRedirectJson", into = "HttpRedirectJson")]
pub struct HttpRedirect {
    /// Replaces the whole path.
    pub uri: String,
    /// Replaces the authority (host).
    pub authority: String,
    pub redirect_port: Option<RedirectPort>,
    /// `http` or `https`.
    pub scheme: String,
    /// 301 when 0.
    pub redirect_code: u32,
    /// Replaces the matched prefix of the path.
    pub prefix_rewrite: String,
}

#[derive(Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct HttpRedirectJson {
    #[serde(skip_serializing_if = "is_default")]
    uri: String,
    #[serde(skip_serializing_if = "is_default")]
    authority: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    port: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    derive_port: Option<RedirectPortSelection>,
    #[serde(skip_serializing_if = "is_default")]
    scheme: String,
    #[serde(skip_serializing_if = "is_default")]
    redirect_code: u32,
    #[serde(skip_serializing_if = "is_default")]
    prefix_rewrite: String,
}

impl TryFrom<HttpRedirectJson> for HttpRedirect {
    type Error = String;

    fn try_from(json: HttpRedirectJson) -> Result<Self, String> {
        check_oneof(
            "a redirect",
            &[
                ("port", json.port.is_some()),
                ("derivePort", json.derive_port.is_some()),
            ],
        )?;
        let redirect_port = json
            .port
            .map(RedirectPort::Port)
            .or(json.derive_port.map(RedirectPort::DerivePort));
        Ok(HttpRedirect {
            uri: json.uri,
            authority: json.authority,
            redirect_port,
            scheme: json.scheme,
            redirect_code: json.redirect_code,
            prefix_rewrite: json.prefix_rewrite,
        })
    }
}

impl From<HttpRedirect> for HttpRedirectJson {
    fn from(r: HttpRedirect) -> Self {
        let (port, derive_port) = match r.redirect_port {
            Some(RedirectPort::Port(p)) => (Some(p), None),
            Some(RedirectPort::DerivePort(d)) => (None, Some(d)),
            None => (None, None),
        };
        HttpRedirectJson {
            uri: r.uri,
            authority: r.authority,
            port,
            derive_port,
            scheme: r.scheme,
            redirect_code: r.redirect_code,
            prefix_rewrite: r.prefix_rewrite,
        }
    }
}

/// Answers with a fixed response instead of forwarding.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpDirectResponse {
    #[serde(skip_serializing_if = "is_default")]
    pub status: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<HttpBody>,
}

/// A response body; `specifier` is `None` for a body written as `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "HttpBodyJson", into = "HttpBodyJson")]
pub struct HttpBody {
    pub specifier: Option<BodySpecifier>,
}

/// The `specifier` oneof of [`HttpBody`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodySpecifier {
    String(String),
    /// Decoded from base64, as protobuf JSON writes bytes.
    Bytes(Vec<u8>),
}

impl HttpBody {
    /// The body's length in bytes.
    pub fn len(&self) -> usize {
        match &self.specifier {
            Some(BodySpecifier::String(s)) => s.len(),
            Some(BodySpecifier::Bytes(b)) => b.len(),
            None => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
struct HttpBodyJson {
    #[serde(skip_serializing_if = "Option::is_none")]
    string: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<String>,
}

impl TryFrom<HttpBodyJson> for HttpBody {
    type Error = String;

    fn try_from(json: HttpBodyJson) -> Result<Self, String> {
        check_oneof(
            "a body",
            &[
                ("string", json.string.is_some()),
                ("bytes", json.bytes.is_some()),
            ],
        )?;
        let specifier = match (json.string, json.bytes) {
            (Some(s), _) => Some(BodySpecifier::String(s)),
            (None, Some(b)) => Some(BodySpecifier::Bytes(base64_decode(&b).ok_or_else(
                || "bytes must be base64 encoded (standard or URL-safe alphabet)".to_string(),
            )?)),
            (None, None) => None,
        };
        Ok(HttpBody { specifier })
    }
}

impl From<HttpBody> for HttpBodyJson {
    fn from(body: HttpBody) -> Self {
        match body.specifier {
            Some(BodySpecifier::String(s)) => HttpBodyJson {
                string: Some(s),
                bytes: None,
            },
            Some(BodySpecifier::Bytes(b)) => HttpBodyJson {
                string: None,
                bytes: Some(base64_encode(&b)),
            },
            None => HttpBodyJson::default(),
        }
    }
}

/// Changes the request before it is forwarded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRewrite {
    /// Replaces the matched part of the path (the prefix, for a prefix match).
    #[serde(skip_serializing_if = "is_default")]
    pub uri: String,
    /// Replaces the authority (host) header.
    #[serde(skip_serializing_if = "is_default")]
    pub authority: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri_regex_rewrite: Option<RegexRewrite>,
}

/// Rewrites the path by a regular expression and its substitution.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RegexRewrite {
    /// The RE2 expression (`match` in the API).
    #[serde(rename = "match", skip_serializing_if = "is_default")]
    pub pattern: String,
    /// The substitution; `\1` and so on refer to capture groups.
    #[serde(skip_serializing_if = "is_default")]
    pub rewrite: String,
}

/// Retry policy of a route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRetry {
    /// Retries allowed; 0 disables retries.
    #[serde(skip_serializing_if = "is_default")]
    pub attempts: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_try_timeout: Option<Duration>,
    /// Comma-separated Envoy retry conditions and HTTP status codes.
    #[serde(skip_serializing_if = "is_default")]
    pub retry_on: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_remote_localities: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_ignore_previous_hosts: Option<bool>,
    /// Base interval between retries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Duration>,
}

proto_enum! {
    /// What to do with a CORS preflight request whose origin no policy allows.
    pub enum UnmatchedPreflights {
        /// Envoy's default (forward).
        Unspecified = 0 => "UNSPECIFIED",
        Forward = 1 => "FORWARD",
        Ignore = 2 => "IGNORE",
    }
}

/// Cross-origin resource sharing policy of a route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct CorsPolicy {
    /// Deprecated exact origins; superseded by `allow_origins`.
    #[serde(skip_serializing_if = "is_default")]
    pub allow_origin: Vec<String>,
    #[serde(skip_serializing_if = "is_default")]
    pub allow_origins: Vec<StringMatch>,
    #[serde(skip_serializing_if = "is_default")]
    pub allow_methods: Vec<String>,
    #[serde(skip_serializing_if = "is_default")]
    pub allow_headers: Vec<String>,
    #[serde(skip_serializing_if = "is_default")]
    pub expose_headers: Vec<String>,
    /// How long a preflight answer may be cached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_age: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_credentials: Option<bool>,
    #[serde(skip_serializing_if = "is_default")]
    pub unmatched_preflights: UnmatchedPreflights,
}

/// Faults injected into matching requests.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpFaultInjection {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<Delay>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub abort: Option<Abort>,
}

/// The `http_delay_type` oneof of [`Delay`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayType {
    FixedDelay(Duration),
    /// Not supported by istiod.
    ExponentialDelay(Duration),
}

/// Delays requests before forwarding them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(try_from = "DelayJson", into = "DelayJson")]
pub struct Delay {
    /// Deprecated whole-number percentage; superseded by `percentage`.
    pub percent: i32,
    pub delay_type: Option<DelayType>,
    /// Share of requests delayed; all when unset.
    pub percentage: Option<Percent>,
}

#[derive(Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct DelayJson {
    #[serde(skip_serializing_if = "is_default")]
    percent: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    fixed_delay: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exponential_delay: Option<Duration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    percentage: Option<Percent>,
}

impl TryFrom<DelayJson> for Delay {
    type Error = String;

    fn try_from(json: DelayJson) -> Result<Self, String> {
        check_oneof(
            "a delay",
            &[
                ("fixedDelay", json.fixed_delay.is_some()),
                ("exponentialDelay", json.exponential_delay.is_some()),
            ],
        )?;
        let delay_type = json
            .fixed_delay
            .map(DelayType::FixedDelay)
            .or(json.exponential_delay.map(DelayType::ExponentialDelay));
        Ok(Delay {
            percent: json.percent,
            delay_type,
            percentage: json.percentage,
        })
    }
}

impl From<Delay> for DelayJson {
    fn from(d: Delay) -> Self {
        let (fixed_delay, exponential_delay) = match d.delay_type {
            Some(DelayType::FixedDelay(x)) => (Some(x), None),
            Some(DelayType::ExponentialDelay(x)) => (None, Some(x)),
            None => (None, None),
        };
        DelayJson {
            percent: d.percent,
            fixed_delay,
            exponential_delay,
            percentage: d.percentage,
        }
    }
}

/// The `error_type` oneof of [`Abort`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AbortErrorType {
    HttpStatus(i32),
    /// A gRPC status name such as `UNAVAILABLE`.
    GrpcStatus(String),
    /// Not supported by istiod.
    Http2Error(String),
}

/// Ends requests early with an error.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(try_from = "AbortJson", into = "AbortJson")]
pub struct Abort {
    pub error_type: Option<AbortErrorType>,
    /// Share of requests aborted; all when unset.
    pub percentage: Option<Percent>,
}

#[derive(Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct AbortJson {
    #[serde(skip_serializing_if = "Option::is_none")]
    http_status: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    grpc_status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    http2_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    percentage: Option<Percent>,
}

impl TryFrom<AbortJson> for Abort {
    type Error = String;

    fn try_from(json: AbortJson) -> Result<Self, String> {
        check_oneof(
            "an abort",
            &[
                ("httpStatus", json.http_status.is_some()),
                ("grpcStatus", json.grpc_status.is_some()),
                ("http2Error", json.http2_error.is_some()),
            ],
        )?;
        let error_type = json
            .http_status
            .map(AbortErrorType::HttpStatus)
            .or(json.grpc_status.map(AbortErrorType::GrpcStatus))
            .or(json.http2_error.map(AbortErrorType::Http2Error));
        Ok(Abort {
            error_type,
            percentage: json.percentage,
        })
    }
}

impl From<Abort> for AbortJson {
    fn from(a: Abort) -> Self {
        let mut json = AbortJson {
            percentage: a.percentage,
            ..Default::default()
        };
        match a.error_type {
            Some(AbortErrorType::HttpStatus(s)) => json.http_status = Some(s),
            Some(AbortErrorType::GrpcStatus(s)) => json.grpc_status = Some(s),
            Some(AbortErrorType::Http2Error(s)) => json.http2_error = Some(s),
            None => {}
        }
        json
    }
}

/// A destination that receives a copy of the traffic; its answers are dropped.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpMirrorPolicy {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination: Option<Destination>,
    /// Share of traffic mirrored; all when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
}

/// Decodes protobuf JSON `bytes`: standard or URL-safe alphabet, padding optional, line breaks
/// ignored. `None` when the text is not base64.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::alphabet;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let digits: String = text.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
    let config =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let alphabet = if digits.contains(['-', '_']) {
        &alphabet::URL_SAFE
    } else {
        &alphabet::STANDARD
    };
    base64::Engine::decode(&GeneralPurpose::new(alphabet, config), digits).ok()
}

/// Encodes bytes as protobuf JSON writes them: standard alphabet, padded.
fn base64_encode(bytes: &[u8]) -> String {
    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, bytes)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn base64_reads_both_alphabets_with_or_without_padding() {
        assert_eq!(base64_decode("aGVsbG8="), Some(b"hello".to_vec()));
        assert_eq!(base64_decode("aGVsbG8"), Some(b"hello".to_vec()));
        assert_eq!(base64_decode("-_8="), Some(vec![0xfb, 0xff]));
        assert_eq!(base64_decode("+/8="), Some(vec![0xfb, 0xff]));
        assert_eq!(base64_decode(""), Some(vec![]));
        assert_eq!(base64_decode("a"), None);
        assert_eq!(base64_decode("aGV*"), None);
        assert_eq!(base64_decode("aG==="), None);
        for data in [&b""[..], b"a", b"ab", b"abc", b"abcd", &[0xfb, 0xff, 0x00]] {
            assert_eq!(base64_decode(&base64_encode(data)).as_deref(), Some(data));
        }
        assert_eq!(base64_encode(b"hello"), "aGVsbG8=");
    }

    #[test]
    fn oneofs_refuse_two_members() {
        for (bad, what) in [
            (
                json!({"port": 1, "derivePort": "FROM_REQUEST_PORT"}),
                "port, derivePort",
            ),
            (json!({"uri": "/", "port": 1}), ""),
        ] {
            let r = serde_json::from_value::<HttpRedirect>(bad);
            assert_eq!(r.is_err(), !what.is_empty(), "{r:?}");
        }
        assert!(
            serde_json::from_value::<Abort>(json!({"httpStatus": 500, "grpcStatus": "OK"}))
                .unwrap_err()
                .to_string()
                .contains("httpStatus and grpcStatus")
        );
        assert!(
            serde_json::from_value::<Delay>(json!({"fixedDelay": "1s", "exponentialDelay": "1s"}))
                .is_err()
        );
        assert!(
            serde_json::from_value::<HttpBody>(json!({"string": "a", "bytes": "YQ=="})).is_err()
        );
        assert!(serde_json::from_value::<HttpBody>(json!({"bytes": "not base64!"})).is_err());
        assert!(serde_json::from_value::<Delay>(json!({"fixedDelay": "1s", "bogus": 1})).is_err());
    }
}
