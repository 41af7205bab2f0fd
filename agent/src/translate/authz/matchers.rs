//! The pieces RBAC policies are made of: a rule's values parsed (service accounts, request
//! principals, CIDRs, ports), and Envoy's string, header and JWT-claim matchers and the
//! combinators of permissions and principals.

use envoy_types::pb::envoy::config::core::v3::CidrRange;
use envoy_types::pb::envoy::config::rbac::v3::{Permission, Principal, permission, principal};
use envoy_types::pb::envoy::config::route::v3::HeaderMatcher;
use envoy_types::pb::envoy::config::route::v3::header_matcher::HeaderMatchSpecifier;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    ListMatcher, MetadataMatcher, OrMatcher, RegexMatcher, StringMatcher, ValueMatcher,
    list_matcher, metadata_matcher, string_matcher, value_matcher,
};
use envoy_types::pb::google::protobuf::UInt32Value;

use super::model::Unusable;
use super::{JWT_FILTER, JWT_PAYLOAD};

pub(super) fn service_account_regex(default_namespace: &str, value: &str) -> String {
    let (ns, sa) = value.split_once('/').unwrap_or((default_namespace, value));
    format!(
        "spiffe://.+/ns/{}/(.+/|)sa/{}(/.+)?",
        pasa_istio::regex::quote_meta(ns),
        pasa_istio::regex::quote_meta(sa)
    )
}

/// (issuer, subject) matchers of a request principal `iss/sub` with at most one `*`.
pub(super) fn request_principal(value: &str) -> (StringMatcher, StringMatcher) {
    let any = || regex(".+");
    let split = value.rfind('/');
    let (iss, sub) = match split {
        Some(i) => (&value[..i], &value[i + 1..]),
        None => (value, ""),
    };
    if value == "*" {
        (any(), any())
    } else if let Some(rest) = value.strip_prefix('*') {
        match split {
            Some(_) if iss == "*" => (any(), exact(sub)),
            Some(_) => (suffix(iss.trim_start_matches('*')), exact(sub)),
            None => (any(), suffix(rest)),
        }
    } else if let Some(rest) = value.strip_suffix('*') {
        match split {
            Some(_) if sub == "*" => (exact(iss), any()),
            Some(_) => (exact(iss), prefix(sub.trim_end_matches('*'), false)),
            None => (prefix(rest, false), any()),
        }
    } else {
        (exact(iss), exact(sub))
    }
}

/// `[a][b]` → `a`, `b`; a key that is not of that form is one name in brackets.
pub(super) fn nested_names(s: &str) -> Result<Vec<String>, Unusable> {
    let mut names = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let Some(inner) = rest.strip_prefix('[') else {
            return single_name(s);
        };
        let Some(end) = inner.find(']') else {
            return single_name(s);
        };
        if inner[..end].contains('[') {
            return single_name(s);
        }
        names.push(inner[..end].to_string());
        rest = &inner[end + 1..];
    }
    Ok(names)
}

fn single_name(s: &str) -> Result<Vec<String>, Unusable> {
    s.strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .map(|n| vec![n.to_string()])
        .ok_or(Unusable)
}

pub(super) fn cidr(value: &str) -> Result<CidrRange, Unusable> {
    let (addr, bits) = match value.split_once('/') {
        Some((a, b)) => (a, Some(b)),
        None => (value, None),
    };
    let ip: std::net::IpAddr = addr.parse().map_err(|_| Unusable)?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let bits = match bits {
        Some(b) => b
            .parse::<u32>()
            .ok()
            .filter(|b| *b <= max)
            .ok_or(Unusable)?,
        None => max,
    };
    Ok(CidrRange {
        address_prefix: ip.to_string(),
        prefix_len: Some(UInt32Value { value: bits }),
    })
}

pub(super) fn port(value: &str) -> Result<u32, Unusable> {
    value
        .parse::<u32>()
        .ok()
        .filter(|p| *p <= 65535 && value.bytes().all(|b| b.is_ascii_digit()))
        .ok_or(Unusable)
}

pub(super) fn matcher(pattern: string_matcher::MatchPattern, ignore_case: bool) -> StringMatcher {
    StringMatcher {
        ignore_case,
        match_pattern: Some(pattern),
    }
}

fn exact(v: &str) -> StringMatcher {
    matcher(string_matcher::MatchPattern::Exact(v.to_string()), false)
}

pub(super) fn prefix(v: &str, ignore_case: bool) -> StringMatcher {
    matcher(
        string_matcher::MatchPattern::Prefix(v.to_string()),
        ignore_case,
    )
}

pub(super) fn suffix(v: &str) -> StringMatcher {
    matcher(string_matcher::MatchPattern::Suffix(v.to_string()), false)
}

pub(super) fn regex(r: &str) -> StringMatcher {
    matcher(
        string_matcher::MatchPattern::SafeRegex(RegexMatcher {
            regex: r.to_string(),
            ..Default::default()
        }),
        false,
    )
}

/// A value with at most one `*` at the start or the end; `*` alone is "present".
pub(super) fn string(v: &str) -> StringMatcher {
    string_with_prefix(v, "")
}

pub(super) fn string_with_prefix(v: &str, before: &str) -> StringMatcher {
    if v == "*" {
        regex(".+")
    } else if let Some(rest) = v.strip_prefix('*') {
        if before.is_empty() {
            suffix(rest)
        } else {
            regex(&format!(
                "{before}.*{}",
                pasa_istio::regex::quote_meta(rest)
            ))
        }
    } else if let Some(rest) = v.strip_suffix('*') {
        prefix(&format!("{before}{rest}"), false)
    } else {
        exact(&format!("{before}{v}"))
    }
}

pub(super) fn string_value(m: StringMatcher) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::StringMatch(m)),
    }
}

pub(super) fn or_values(mut matchers: Vec<ValueMatcher>) -> ValueMatcher {
    if matchers.len() == 1 {
        return matchers.remove(0);
    }
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
            value_matchers: matchers,
        })),
    }
}

pub(super) fn string_or(values: &[String]) -> ValueMatcher {
    or_values(values.iter().map(|v| string_value(string(v))).collect())
}

fn header_with(name: &str, value: &str, ignore_case: bool) -> HeaderMatcher {
    let specifier = if value == "*" {
        HeaderMatchSpecifier::PresentMatch(true)
    } else if let Some(rest) = value.strip_prefix('*') {
        HeaderMatchSpecifier::StringMatch(matcher(
            string_matcher::MatchPattern::Suffix(rest.to_string()),
            ignore_case,
        ))
    } else if let Some(rest) = value.strip_suffix('*') {
        HeaderMatchSpecifier::StringMatch(prefix(rest, ignore_case))
    } else {
        HeaderMatchSpecifier::StringMatch(matcher(
            string_matcher::MatchPattern::Exact(value.to_string()),
            ignore_case,
        ))
    };
    HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(specifier),
        ..Default::default()
    }
}

pub(super) fn header(name: &str, value: &str) -> HeaderMatcher {
    header_with(name, value, false)
}

/// Hosts compare without case.
pub(super) fn host_header(name: &str, value: &str) -> HeaderMatcher {
    header_with(name, value, true)
}

pub(super) fn path_key(key: &str) -> metadata_matcher::PathSegment {
    metadata_matcher::PathSegment {
        segment: Some(metadata_matcher::path_segment::Segment::Key(
            key.to_string(),
        )),
    }
}

/// The JWT filter's payload claim `claim` matched by `m`.
pub(super) fn jwt_claim(claim: &str, m: StringMatcher) -> MetadataMatcher {
    MetadataMatcher {
        filter: JWT_FILTER.to_string(),
        path: vec![path_key(JWT_PAYLOAD), path_key(claim)],
        value: Some(string_value(m)),
        ..Default::default()
    }
}

/// Nested claims, matched as one value or as a list holding one.
pub(super) fn jwt_claims(claims: &[&str], value: ValueMatcher) -> MetadataMatcher {
    let mut path = vec![path_key(JWT_PAYLOAD)];
    path.extend(claims.iter().map(|c| path_key(c)));
    let list = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
            ListMatcher {
                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(value.clone()))),
            },
        ))),
    };
    MetadataMatcher {
        filter: JWT_FILTER.to_string(),
        path,
        value: Some(ValueMatcher {
            match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
                value_matchers: vec![list, value],
            })),
        }),
        ..Default::default()
    }
}

pub(super) fn authenticated(m: StringMatcher) -> principal::Identifier {
    principal::Identifier::Authenticated(principal::Authenticated {
        principal_name: Some(m),
    })
}

pub(super) fn any_permission() -> Permission {
    Permission {
        rule: Some(permission::Rule::Any(true)),
    }
}

pub(super) fn and_permission(rules: Vec<Permission>) -> Permission {
    Permission {
        rule: Some(permission::Rule::AndRules(permission::Set { rules })),
    }
}

pub(super) fn or_permission(rules: Vec<Permission>) -> Permission {
    Permission {
        rule: Some(permission::Rule::OrRules(permission::Set { rules })),
    }
}

pub(super) fn not_permission(p: Permission) -> Permission {
    Permission {
        rule: Some(permission::Rule::NotRule(Box::new(p))),
    }
}

pub(super) fn any_principal() -> Principal {
    Principal {
        identifier: Some(principal::Identifier::Any(true)),
    }
}

pub(super) fn and_principal(ids: Vec<Principal>) -> Principal {
    Principal {
        identifier: Some(principal::Identifier::AndIds(principal::Set { ids })),
    }
}

pub(super) fn or_principal(ids: Vec<Principal>) -> Principal {
    Principal {
        identifier: Some(principal::Identifier::OrIds(principal::Set { ids })),
    }
}

pub(super) fn not_principal(p: Principal) -> Principal {
    Principal {
        identifier: Some(principal::Identifier::NotId(Box::new(p))),
    }
}
