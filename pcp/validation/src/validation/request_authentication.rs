//! Validation of `RequestAuthentication` (`security.istio.io`), following istiod's webhook: what
//! a policy attaches to (as for AuthorizationPolicy), and each JWT rule — an issuer or a key URI,
//! the URI's scheme and port, the inline key set, where tokens are read from, the claims copied
//! to headers, the fetch timeout — with a warning for private key material in an inline set.

use pasa_istio::request_authentication::{JwtRule, RequestAuthentication};
use pasa_proto::Object;
use serde_json::Value;

use super::common::attachment;
use super::common::validate_duration;
use super::{Path, Report, parse};

/// Checks one RequestAuthentication.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(policy) = parse::<RequestAuthentication>(obj, report) else {
        return;
    };
    let spec = Path::spec();
    attachment(
        policy.selector.as_ref(),
        policy.target_ref.as_ref(),
        &policy.target_refs,
        &spec,
        report,
    );
    for (i, rule) in policy.jwt_rules.iter().enumerate() {
        if let Some(rule) = rule {
            jwt_rule(rule, &spec.field("jwtRules").index(i), report);
        }
    }
}

fn jwt_rule(rule: &JwtRule, at: &Path, report: &mut Report) {
    for (i, audience) in rule.audiences.iter().enumerate() {
        if audience.is_empty() {
            report.error(
                &at.field("audiences").index(i),
                "audience must be non-empty string",
            );
        }
    }
    if rule.issuer.is_empty() && rule.jwks_uri.is_empty() {
        report.error(at, "issuer or jwksUri must be non-empty string");
    }
    if !rule.jwks_uri.is_empty() {
        report.check(&at.field("jwksUri"), jwks_uri(&rule.jwks_uri));
    }
    if !rule.jwks.is_empty() {
        match key_set(&rule.jwks) {
            Err(e) => report.error(&at.field("jwks"), format!("jwks parse error: {e}")),
            Ok(keys) => {
                for (i, key) in keys.iter().enumerate() {
                    if private(key) {
                        report.warn(
                            &at.field("jwks"),
                            format!(
                                "jwks key at index {i} contains private key material; only \
                                 public keys are used for verification"
                            ),
                        );
                    }
                }
            }
        }
    }
    for (i, header) in rule.from_headers.iter().enumerate() {
        let here = at.field("fromHeaders").index(i);
        match header {
            None => report.error(&here, "location header name must be non-null"),
            Some(h) if h.name.is_empty() => report.error(
                &here.field("name"),
                "location header name must be non-empty string",
            ),
            Some(_) => {}
        }
    }
    for (i, param) in rule.from_params.iter().enumerate() {
        if param.is_empty() {
            report.error(
                &at.field("fromParams").index(i),
                "location query must be non-empty string",
            );
        }
    }
    for (i, cookie) in rule.from_cookies.iter().enumerate() {
        if cookie.is_empty() {
            report.error(
                &at.field("fromCookies").index(i),
                "cookie name must be non-empty string",
            );
        }
    }
    for (i, output) in rule.output_claim_to_headers.iter().enumerate() {
        let here = at.field("outputClaimToHeaders").index(i);
        let Some(output) = output else {
            report.error(&here, "outputClaimToHeaders must not be null");
            continue;
        };
        if output.claim.is_empty() || output.header.is_empty() {
            report.error(
                &here,
                "outputClaimToHeaders header and claim value must be non-empty string",
            );
            continue;
        }
        if !output
            .header
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            report.error(
                &here.field("header"),
                format!("header name {} is not a valid header name", output.header),
            );
        }
    }
    if let Some(timeout) = &rule.timeout {
        report.check(&at.field("timeout"), validate_duration(timeout));
    }
}

/// A key URI as istiod reads one: `http` or `https`, a numeric port if any.
fn jwks_uri(uri: &str) -> Result<(), String> {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return Err(format!("URI scheme \"\" is not supported: {uri}"));
    };
    if scheme != "http" && scheme != "https" {
        return Err(format!("URI scheme {scheme:?} is not supported"));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let port = if let Some(rest) = host_port.strip_prefix('[') {
        // [v6]:port
        match rest.split_once(']') {
            Some((_, after)) => after.strip_prefix(':'),
            None => return Err(format!("missing ']' in host: {uri}")),
        }
    } else {
        host_port.rsplit_once(':').map(|(_, p)| p)
    };
    if let Some(port) = port
        && !port.is_empty()
        && (!port.bytes().all(|b| b.is_ascii_digit()) || port.parse::<u64>().is_err())
    {
        return Err(format!("invalid port \":{port}\" after host"));
    }
    Ok(())
}

/// The keys of a JSON Web Key Set (or of a single key), each an object with a `kty`.
fn key_set(text: &str) -> Result<Vec<serde_json::Map<String, Value>>, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let keys = match &value {
        Value::Object(set) if set.contains_key("keys") => match &set["keys"] {
            Value::Array(keys) => keys.clone(),
            _ => return Err("`keys` must be an array".into()),
        },
        Value::Object(_) => vec![value.clone()],
        _ => return Err("a JWK set must be a JSON object".into()),
    };
    keys.into_iter()
        .enumerate()
        .map(|(i, key)| match key {
            Value::Object(key) => match key.get("kty").and_then(Value::as_str) {
                Some("RSA" | "EC" | "OKP" | "oct") => Ok(key),
                Some(other) => Err(format!("key {i}: unsupported kty {other:?}")),
                None => Err(format!("key {i}: `kty` is required")),
            },
            _ => Err(format!("key {i} is not a JSON object")),
        })
        .collect()
}

/// Whether a key carries private (or symmetric) material.
fn private(key: &serde_json::Map<String, Value>) -> bool {
    key.get("kty").and_then(Value::as_str) == Some("oct") || key.contains_key("d")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_uris_need_a_web_scheme_and_a_numeric_port() {
        assert!(jwks_uri("https://example.com/keys").is_ok());
        assert!(jwks_uri("http://example.com:8080/keys").is_ok());
        assert!(jwks_uri("https://[::1]:8443/keys").is_ok());
        assert!(jwks_uri("example.com").is_err());
        assert!(jwks_uri("ftp://example.com").is_err());
        assert!(jwks_uri("https://example.com:web").is_err());
    }

    #[test]
    fn key_sets_and_private_keys() {
        assert!(key_set("foo").is_err());
        assert!(key_set(r#"{"keys": [{"kty": "RSA", "n": "x", "e": "AQAB"}]}"#).is_ok());
        assert!(key_set(r#"{"keys": [{"n": "x"}]}"#).is_err());
        let keys = key_set(r#"{"keys": [{"kty": "EC", "d": "secret"}, {"kty": "oct", "k": "k"}]}"#)
            .unwrap();
        assert!(keys.iter().all(private));
    }
}
