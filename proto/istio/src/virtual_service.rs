//! The `VirtualService` model (`networking.istio.io`): how requests to a set of hosts are matched
//! and routed, for HTTP ([`HttpRoute`]), TLS by SNI ([`TlsRoute`]) and plain TCP ([`TcpRoute`]).
//!
//! Each protobuf `oneof` is an `Option` of an enum in its message (as [`StringMatch::match_type`]),
//! read from the flattened JSON keys; setting two members of one is a parse error. A message that
//! is present but empty (`uri: {}`) is kept apart from an absent one, because istiod treats them
//! differently.

mod http;

pub use http::*;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::{PortSelector, check_oneof};

/// Whether a field holds its protobuf default, so that serializing leaves it out.
pub(crate) fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// Routing rules for traffic addressed to `hosts`, applied by the sidecars (the `mesh` gateway)
/// and/or the named gateways.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct VirtualService {
    /// Destination hosts the rules apply to: DNS names, optionally with a leading wildcard, or
    /// IPs. Empty for a delegate VirtualService (one that a root's `delegate` refers to).
    #[serde(skip_serializing_if = "is_default")]
    pub hosts: Vec<String>,
    /// Gateways (`namespace/name`, or the reserved `mesh` for every sidecar) applying the rules;
    /// empty means `mesh`.
    #[serde(skip_serializing_if = "is_default")]
    pub gateways: Vec<String>,
    /// HTTP rules, first match wins.
    #[serde(skip_serializing_if = "is_default")]
    pub http: Vec<HttpRoute>,
    /// Rules for unterminated TLS (and HTTPS) traffic, by SNI.
    #[serde(skip_serializing_if = "is_default")]
    pub tls: Vec<TlsRoute>,
    /// Rules for opaque TCP traffic.
    #[serde(skip_serializing_if = "is_default")]
    pub tcp: Vec<TcpRoute>,
    /// Namespaces that see this VirtualService (`.` own namespace, `*` all); empty means all.
    #[serde(skip_serializing_if = "is_default")]
    pub export_to: Vec<String>,
}

/// A service (and optionally a subset and port of it) that traffic goes to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Destination {
    /// The service's name in the registry; a short name resolves in the VirtualService's namespace.
    #[serde(skip_serializing_if = "is_default")]
    pub host: String,
    /// A subset defined by a DestinationRule for the host.
    #[serde(skip_serializing_if = "is_default")]
    pub subset: String,
    /// The port, needed when the service has more than one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
}

/// A weighted destination of a TLS or TCP route.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct RouteDestination {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination: Option<Destination>,
    /// Relative share of the traffic; a lone destination takes all of it.
    #[serde(skip_serializing_if = "is_default")]
    pub weight: i32,
}

/// A rule for TLS traffic passed through unterminated, matched on SNI.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsRoute {
    /// Conditions, any of which selects the rule (`match` in the API).
    #[serde(rename = "match", skip_serializing_if = "is_default")]
    pub matches: Vec<TlsMatchAttributes>,
    #[serde(skip_serializing_if = "is_default")]
    pub route: Vec<RouteDestination>,
}

/// A rule for opaque TCP traffic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct TcpRoute {
    /// Conditions, any of which selects the rule (`match` in the API); none matches everything.
    #[serde(rename = "match", skip_serializing_if = "is_default")]
    pub matches: Vec<L4MatchAttributes>,
    #[serde(skip_serializing_if = "is_default")]
    pub route: Vec<RouteDestination>,
}

/// Connection attributes a TCP rule matches on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct L4MatchAttributes {
    /// Destination addresses or CIDR blocks.
    #[serde(skip_serializing_if = "is_default")]
    pub destination_subnets: Vec<String>,
    /// Destination port; 0 means any.
    #[serde(skip_serializing_if = "is_default")]
    pub port: u32,
    #[serde(skip_serializing_if = "is_default")]
    pub source_subnet: String,
    /// Labels the client workload must carry.
    #[serde(skip_serializing_if = "is_default")]
    pub source_labels: BTreeMap<String, String>,
    /// Gateways the condition is limited to (overrides the VirtualService's).
    #[serde(skip_serializing_if = "is_default")]
    pub gateways: Vec<String>,
    #[serde(skip_serializing_if = "is_default")]
    pub source_namespace: String,
}

/// Connection attributes a TLS rule matches on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsMatchAttributes {
    /// SNI values to match; each must fall within the VirtualService's hosts.
    #[serde(skip_serializing_if = "is_default")]
    pub sni_hosts: Vec<String>,
    #[serde(skip_serializing_if = "is_default")]
    pub destination_subnets: Vec<String>,
    #[serde(skip_serializing_if = "is_default")]
    pub port: u32,
    #[serde(skip_serializing_if = "is_default")]
    pub source_labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "is_default")]
    pub gateways: Vec<String>,
    #[serde(skip_serializing_if = "is_default")]
    pub source_namespace: String,
}

/// A percentage as a double (`{value: 0.5}` is half a percent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Percent {
    #[serde(skip_serializing_if = "is_default")]
    pub value: f64,
}

/// How a string is matched. `match_type` is `None` for a match written as `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(try_from = "StringMatchJson", into = "StringMatchJson")]
pub struct StringMatch {
    pub match_type: Option<MatchType>,
}

/// The `match_type` oneof of [`StringMatch`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MatchType {
    Exact(String),
    Prefix(String),
    /// An RE2 regular expression matched against the whole string.
    Regex(String),
}

impl VirtualService {
    /// The hosts it sends traffic to, as written (short names unresolved): HTTP route
    /// destinations and mirrors, then TCP and TLS route destinations.
    pub fn destination_hosts(&self) -> impl Iterator<Item = &str> {
        let http = self.http.iter().flat_map(|rule| {
            rule.route
                .iter()
                .filter_map(|r| r.destination.as_ref())
                .chain(rule.mirror.as_ref())
                .chain(rule.mirrors.iter().filter_map(|m| m.destination.as_ref()))
        });
        let l4 = self
            .tcp
            .iter()
            .flat_map(|r| &r.route)
            .chain(self.tls.iter().flat_map(|r| &r.route))
            .filter_map(|r| r.destination.as_ref());
        http.chain(l4).map(|d| d.host.as_str())
    }
}

impl StringMatch {
    pub fn exact(value: impl Into<String>) -> Self {
        StringMatch {
            match_type: Some(MatchType::Exact(value.into())),
        }
    }

    pub fn prefix(value: impl Into<String>) -> Self {
        StringMatch {
            match_type: Some(MatchType::Prefix(value.into())),
        }
    }

    pub fn regex(value: impl Into<String>) -> Self {
        StringMatch {
            match_type: Some(MatchType::Regex(value.into())),
        }
    }

    /// The exact value, when this is an exact match.
    pub fn as_exact(&self) -> Option<&str> {
        match &self.match_type {
            Some(MatchType::Exact(s)) => Some(s),
            _ => None,
        }
    }

    /// The prefix, when this is a prefix match.
    pub fn as_prefix(&self) -> Option<&str> {
        match &self.match_type {
            Some(MatchType::Prefix(s)) => Some(s),
            _ => None,
        }
    }

    /// The expression, when this is a regex match.
    pub fn as_regex(&self) -> Option<&str> {
        match &self.match_type {
            Some(MatchType::Regex(s)) => Some(s),
            _ => None,
        }
    }
}

/// [`StringMatch`] as JSON writes it: the oneof's members side by side.
#[derive(Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
struct StringMatchJson {
    #[serde(skip_serializing_if = "Option::is_none")]
    exact: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    regex: Option<String>,
}

impl TryFrom<StringMatchJson> for StringMatch {
    type Error = String;

    fn try_from(json: StringMatchJson) -> Result<Self, String> {
        check_oneof(
            "a string match",
            &[
                ("exact", json.exact.is_some()),
                ("prefix", json.prefix.is_some()),
                ("regex", json.regex.is_some()),
            ],
        )?;
        let match_type = json
            .exact
            .map(MatchType::Exact)
            .or(json.prefix.map(MatchType::Prefix))
            .or(json.regex.map(MatchType::Regex));
        Ok(StringMatch { match_type })
    }
}

impl From<StringMatch> for StringMatchJson {
    fn from(m: StringMatch) -> Self {
        let mut json = StringMatchJson::default();
        match m.match_type {
            None => {}
            Some(MatchType::Exact(s)) => json.exact = Some(s),
            Some(MatchType::Prefix(s)) => json.prefix = Some(s),
            Some(MatchType::Regex(s)) => json.regex = Some(s),
        }
        json
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::parse_spec;

    #[test]
    fn string_matches_keep_empty_apart_from_absent() {
        let m: HttpMatchRequest =
            serde_json::from_value(json!({"uri": {}, "method": {"exact": ""}})).unwrap();
        assert_eq!(m.uri, Some(StringMatch::default()));
        assert_eq!(m.method, Some(StringMatch::exact("")));
        assert_eq!(m.scheme, None);
        let err = parse_spec::<VirtualService>(&json!({
            "http": [{"match": [{"uri": {"exact": "/a", "prefix": "/b"}}]}]
        }))
        .unwrap_err();
        assert_eq!(err.field, "spec.http[0].match[0].uri");
        assert!(
            err.message.contains("only one of exact, prefix, regex"),
            "{}",
            err.message
        );
    }

    #[test]
    fn unknown_fields_and_wrong_types_name_the_field() {
        let err = parse_spec::<VirtualService>(&json!({"hosts": ["a"], "htp": []})).unwrap_err();
        assert_eq!(err.field, "spec.htp");
        let err = parse_spec::<VirtualService>(&json!({
            "tcp": [{"route": [{"destination": {"host": "a"}, "weight": "x"}]}]
        }))
        .unwrap_err();
        assert_eq!(err.field, "spec.tcp[0].route[0].weight");
    }

    #[test]
    fn a_full_virtual_service_round_trips() {
        let spec = json!({
            "hosts": ["reviews.prod.svc.cluster.local"],
            "gateways": ["istio-system/public", "mesh"],
            "http": [{
                "name": "v2",
                "match": [{
                    "name": "jason",
                    "uri": {"prefix": "/api"},
                    "headers": {"end-user": {"exact": "jason"}},
                    "queryParams": {"debug": {"regex": "t.*"}},
                    "withoutHeaders": {"x-skip": {}},
                    "port": 8080,
                    "sourceLabels": {"app": "web"},
                    "ignoreUriCase": true
                }],
                "route": [{
                    "destination": {"host": "reviews", "subset": "v2", "port": {"number": 9080}},
                    "weight": 90,
                    "headers": {"request": {"set": {"x-a": "1"}, "remove": ["x-b"]}}
                }],
                "rewrite": {"uriRegexRewrite": {"match": "^/api(/.*)$", "rewrite": "\\1"}},
                "timeout": "10s",
                "retries": {"attempts": 3, "perTryTimeout": "2s", "retryRemoteLocalities": false},
                "fault": {
                    "delay": {"fixedDelay": "5s", "percentage": {"value": 0.1}},
                    "abort": {"httpStatus": 503}
                },
                "mirrors": [{"destination": {"host": "shadow"}, "percentage": {"value": 5.0}}],
                "mirror_percent": 5,
                "corsPolicy": {
                    "allowOrigins": [{"exact": "https://a.example"}],
                    "maxAge": "24s",
                    "allowCredentials": true,
                    "unmatchedPreflights": "IGNORE"
                }
            }, {
                "redirect": {"uri": "/v1", "derivePort": "FROM_REQUEST_PORT", "redirectCode": 308}
            }, {
                "directResponse": {"status": 503, "body": {"bytes": "aGVsbG8="}}
            }, {
                "delegate": {"name": "child", "namespace": "team"}
            }],
            "tls": [{"match": [{"sniHosts": ["a.example"], "port": 443}], "route": [{"destination": {"host": "a"}}]}],
            "tcp": [{"match": [{"destinationSubnets": ["10.0.0.0/8"]}], "route": [{"destination": {"host": "db"}}]}],
            "exportTo": ["."]
        });
        let vs: VirtualService = parse_spec(&spec).unwrap();
        let http = &vs.http[0];
        assert_eq!(http.mirror_percent, Some(5));
        assert_eq!(
            http.retries.as_ref().unwrap().retry_remote_localities,
            Some(false)
        );
        assert_eq!(
            http.fault
                .as_ref()
                .unwrap()
                .abort
                .as_ref()
                .unwrap()
                .error_type,
            Some(AbortErrorType::HttpStatus(503))
        );
        assert_eq!(
            vs.http[1].redirect.as_ref().unwrap().redirect_port,
            Some(RedirectPort::DerivePort(
                RedirectPortSelection::FromRequestPort
            ))
        );
        assert_eq!(
            vs.http[2].direct_response.as_ref().unwrap().body,
            Some(HttpBody {
                specifier: Some(BodySpecifier::Bytes(b"hello".to_vec()))
            })
        );
        let again: VirtualService = parse_spec(&serde_json::to_value(&vs).unwrap()).unwrap();
        assert_eq!(again, vs);
    }
}
