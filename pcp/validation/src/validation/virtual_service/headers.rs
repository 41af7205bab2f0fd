//! Header rules of HTTP routes: names in matches and CORS policies, the headers a route may set,
//! add or remove, and values in Envoy's `%VARIABLE%` syntax.

use pasa_istio::virtual_service::Headers;

use super::super::common::Check;
use super::super::{Path, Report};

/// The prefix of header-match keys that match a JWT claim instead of a header.
const JWT_CLAIM_PREFIX: &str = "@request.auth.claims";

/// HTTP/2 pseudo-headers a match may name.
const PSEUDO_HEADERS: &[&str] = &[":method", ":scheme", ":authority", ":path", ":status"];

/// Whether a header-match key names a JWT claim: `@request.auth.claims.<name>[.<name>…]` or
/// `@request.auth.claims[<name>][<name>…]` (the prefix in any case).
pub(crate) fn is_jwt_claim(key: &str) -> bool {
    let Some(prefix) = key.get(..JWT_CLAIM_PREFIX.len()) else {
        return false;
    };
    if !prefix.eq_ignore_ascii_case(JWT_CLAIM_PREFIX) {
        return false;
    }
    let rest = &key[JWT_CLAIM_PREFIX.len()..];
    (rest.starts_with('.') && rest.len() > 1)
        || (rest.starts_with('[') && rest.ends_with(']') && rest.len() > 2)
}

/// An RFC 7230 token character. (istiod's character class also admits `,`.)
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+,-.^_`|~".contains(&b)
}

fn is_token(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(is_token_byte)
}

/// A header name in a match: a token, a pseudo-header, or a JWT claim key.
pub(crate) fn validate_match_header_name(name: &str) -> Check {
    if name.is_empty() {
        return Err("header name cannot be empty".to_string());
    }
    if is_jwt_claim(name) || PSEUDO_HEADERS.contains(&name) || is_token(name) {
        return Ok(());
    }
    Err(format!("header name {name} is not a valid header name"))
}

/// A header name in a CORS policy: a token, or `*`.
pub(crate) fn validate_cors_header_name(name: &str) -> Check {
    if name.is_empty() {
        return Err("header name cannot be empty".to_string());
    }
    if name == "*" || is_token(name) {
        return Ok(());
    }
    Err(format!("header name {name} is not a valid header name"))
}

/// Headers Envoy manages itself: pseudo-headers and `Host`.
fn is_internal_header(name: &str) -> bool {
    name.starts_with(':') || name.eq_ignore_ascii_case("host")
}

/// `:authority` or `Host`, the two spellings of the request's authority.
pub(crate) fn is_authority_header(name: &str) -> bool {
    name.eq_ignore_ascii_case(":authority") || name.eq_ignore_ascii_case("host")
}

/// A request header to set or add: not a pseudo-header, except the authority (checked for
/// conflicts with `rewrite.authority` separately).
fn validate_request_set_name(name: &str) -> Check {
    if name.is_empty() {
        return Err("header name cannot be empty".to_string());
    }
    if is_internal_header(name) && !is_authority_header(name) {
        return Err(format!(
            "invalid header {name:?}: header cannot have \":\" prefix"
        ));
    }
    Ok(())
}

/// A request header to remove, or a response header to change: neither `Host` nor a pseudo-header.
fn validate_operation_name(name: &str) -> Check {
    if name.is_empty() {
        return Err("header name cannot be empty".to_string());
    }
    if name.eq_ignore_ascii_case("host") {
        return Err(format!("invalid header {name:?}: cannot set Host header"));
    }
    if is_internal_header(name) {
        return Err(format!(
            "invalid header {name:?}: header cannot have \":\" prefix"
        ));
    }
    Ok(())
}

/// Every header a route or destination sets, adds or removes, with its value.
pub(crate) fn validate_header_operations(at: &Path, headers: &Headers, report: &mut Report) {
    if let Some(request) = &headers.request {
        let at = at.field("request");
        for (op, map) in [("set", &request.set), ("add", &request.add)] {
            for (name, value) in map {
                let here = at.field(op).key(name);
                report.check(&here, validate_request_set_name(name));
                report.check(&here, validate_header_value(value));
            }
        }
        for (i, name) in request.remove.iter().enumerate() {
            report.check(&at.field("remove").index(i), validate_operation_name(name));
        }
    }
    if let Some(response) = &headers.response {
        let at = at.field("response");
        for (op, map) in [("set", &response.set), ("add", &response.add)] {
            for (name, value) in map {
                let here = at.field(op).key(name);
                report.check(&here, validate_operation_name(name));
                report.check(&here, validate_header_value(value));
            }
        }
        for (i, name) in response.remove.iter().enumerate() {
            report.check(&at.field("remove").index(i), validate_operation_name(name));
        }
    }
}

/// A header value Envoy accepts: no control characters but tab, and `%` only as `%%` or around a
/// `%VARIABLE%` / `%VARIABLE(args)%` expression.
pub(crate) fn validate_header_value(value: &str) -> Check {
    if value
        .chars()
        .any(|c| matches!(c, '\u{0}'..='\u{8}' | '\u{a}'..='\u{1f}' | '\u{7f}'))
    {
        return Err(format!(
            "header value configuration {value} is invalid: control characters are not allowed"
        ));
    }
    check_variables(value).map_err(|e| format!("header value configuration: {e}"))
}

/// Where the scan of a header value is, in Envoy's grammar of `%VARIABLE(["arg", …])%`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// Plain text.
    Literal,
    /// Inside `%NAME`.
    Name,
    /// After `%NAME(`: expecting `[` or a bare argument.
    ArgsStart,
    /// Inside `[`: expecting a quoted string.
    StringStart,
    /// Inside a string argument.
    InString,
    /// After a string in `[…]`: expecting `,` or `]`.
    AfterString,
    /// After `]`: expecting `)`.
    ArgsEnd,
    /// After `)`: expecting the closing `%`.
    VariableEnd,
}

fn check_variables(value: &str) -> Check {
    let bytes = value.as_bytes();
    let mut state = Scan::Literal;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let has_next = i + 1 < bytes.len();
        match state {
            Scan::Literal => {
                if c == b'%' {
                    if !has_next {
                        return Err(
                            "invalid header configuration. Un-escaped % (write %% for a literal %)"
                                .to_string(),
                        );
                    }
                    if bytes[i + 1] == b'%' {
                        i += 1;
                    } else {
                        state = Scan::Name;
                    }
                }
            }
            Scan::Name => {
                if c == b'%' {
                    state = Scan::Literal;
                } else if c == b'(' {
                    state = Scan::ArgsStart;
                }
            }
            Scan::ArgsStart => {
                if c == b'[' {
                    state = Scan::StringStart;
                } else if c != b' ' {
                    state = Scan::InString;
                }
            }
            Scan::AfterString => {
                if c == b',' {
                    state = Scan::StringStart;
                } else if c == b']' {
                    state = Scan::ArgsEnd;
                } else if c != b' ' {
                    return Err(
                        "invalid header configuration. Expecting ',', ']', or whitespace"
                            .to_string(),
                    );
                }
            }
            Scan::StringStart => {
                if c == b'"' {
                    state = Scan::InString;
                } else if c != b' ' {
                    return Err("invalid header configuration. Expecting '\"'".to_string());
                }
            }
            Scan::InString => {
                if c == b'\\' {
                    if !has_next {
                        return Err(
                            "invalid header configuration. Un-terminated backslash in JSON string"
                                .to_string(),
                        );
                    }
                    i += 1;
                } else if c == b')' {
                    state = Scan::VariableEnd;
                } else if c == b'"' {
                    state = Scan::AfterString;
                }
            }
            Scan::ArgsEnd => {
                if c == b')' {
                    state = Scan::VariableEnd;
                } else if c != b' ' {
                    return Err(
                        "invalid header configuration. Expecting ')' or whitespace after ']'"
                            .to_string(),
                    );
                }
            }
            Scan::VariableEnd => {
                if c == b'%' {
                    state = Scan::Literal;
                } else if c != b' ' {
                    return Err(
                        "invalid header configuration. Expecting '%' or whitespace after ')'"
                            .to_string(),
                    );
                }
            }
        }
        i += 1;
    }
    if state != Scan::Literal {
        return Err(format!(
            "invalid header configuration. Un-terminated variable expression '{value}'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_follow_envoys_variable_grammar() {
        for ok in [
            "",
            "foo",
            "%HOSTNAME%",
            "100%%",
            "prefix %HOSTNAME% suffix",
            "%DOWNSTREAM_PEER_CERT_V_END(%b %d %H:%M:%S %Y %Z)%",
            "%DYNAMIC_METADATA(com.test.my_filter)%",
            "%REQ([\"x\", \"y\"])%",
            "tab\there",
        ] {
            assert_eq!(validate_header_value(ok), Ok(()), "{ok:?}");
        }
        for bad in [
            "%START_TIME%%",
            "abc%123",
            "100%",
            "%REQ([x])%",
            "%REQ([\"x\"] x)%",
            "%REQ(x) x%",
            "line\nbreak",
            "del\u{7f}",
        ] {
            assert!(validate_header_value(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn header_names() {
        assert!(validate_match_header_name("X-Requested-With").is_ok());
        assert!(validate_match_header_name("funky!$#_").is_ok());
        assert!(validate_match_header_name(":authority").is_ok());
        assert!(validate_match_header_name("@request.auth.claims.sub").is_ok());
        assert!(validate_match_header_name("@Request.Auth.Claims[a][b]").is_ok());
        assert!(validate_match_header_name("::").is_err());
        assert!(validate_match_header_name("illegal\"char").is_err());
        assert!(validate_match_header_name("").is_err());
        assert!(!is_jwt_claim("@request.auth.claims"));
        assert!(!is_jwt_claim("@request.auth.claims."));
        assert!(!is_jwt_claim("@request.auth.claims[]"));
        assert!(validate_cors_header_name("*").is_ok());
        assert!(validate_cors_header_name("a b").is_err());
        assert!(validate_request_set_name(":authority").is_ok());
        assert!(validate_request_set_name("Host").is_ok());
        assert!(validate_request_set_name(":path").is_err());
        assert!(validate_operation_name("host").is_err());
        assert!(validate_operation_name(":status").is_err());
    }
}
