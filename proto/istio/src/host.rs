//! Istio host semantics: short-name resolution and wildcard matching.
//!
//! Behaviour follows istiod: a name without a dot is resolved in the namespace of the resource that
//! names it (`reviews` in `default` → `reviews.default.svc.cluster.local`); anything with a dot, the
//! wildcard `*` and IP addresses are kept as written. Wildcards are suffix matches on either side:
//! `*.foo.com` covers `a.foo.com` and `a.b.foo.com` but not `foo.com`; `*` covers everything.

use std::net::IpAddr;

/// The default Kubernetes cluster domain.
pub const DEFAULT_DOMAIN_SUFFIX: &str = "cluster.local";

/// Whether the host is a wildcard pattern (`*` or `*.suffix`).
pub fn is_wildcard(host: &str) -> bool {
    host.starts_with('*')
}

/// Resolves a host as written in a resource of `namespace` to the name istiod uses.
pub fn resolve_short_name(host: &str, namespace: &str, domain_suffix: &str) -> String {
    if host == "*" || host.contains('.') || host.parse::<IpAddr>().is_ok() {
        return host.to_string();
    }
    let mut out = host.to_string();
    if !namespace.is_empty() {
        out.push('.');
        out.push_str(namespace);
    }
    if !domain_suffix.is_empty() {
        out.push_str(".svc.");
        out.push_str(domain_suffix);
    }
    out
}

/// The FQDN of a Kubernetes service.
pub fn service_fqdn(name: &str, namespace: &str, domain_suffix: &str) -> String {
    format!("{name}.{namespace}.svc.{domain_suffix}")
}

/// Whether two hosts overlap: equal, or one wildcard covers the other (either side).
pub fn matches(a: &str, b: &str) -> bool {
    match (a.strip_prefix('*'), b.strip_prefix('*')) {
        (Some(sa), Some(sb)) => sa.ends_with(sb) || sb.ends_with(sa),
        (Some(sa), None) => b.ends_with(sa),
        (None, Some(sb)) => a.ends_with(sb),
        (None, None) => a == b,
    }
}

/// Whether every host `a` names is one `b` names (one-way, unlike [`matches`]): equal, or within
/// `b`'s wildcard (a wildcard only within a wildcard at least as wide).
pub fn subset_of(a: &str, b: &str) -> bool {
    match (a.strip_prefix('*'), b.strip_prefix('*')) {
        (Some(sa), Some(sb)) => sa.ends_with(sb),
        (Some(_), None) => false,
        (None, Some(sb)) => a.ends_with(sb),
        (None, None) => a == b,
    }
}

/// Why a host pattern cannot be indexed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("host must not be empty")]
    Empty,
    #[error(
        "host {0:?}: a wildcard must be \"*\" or a leading \"*.\" label, as in \"*.example.com\""
    )]
    BadWildcard(String),
    #[error("host {0:?} must not contain whitespace, '/' or ':'")]
    BadCharacter(String),
    #[error("host of {0} bytes is longer than the 253 a DNS name may have")]
    TooLong(usize),
    #[error("host {0:?} has a label longer than 63 bytes")]
    LabelTooLong(String),
}

/// Checks that a host is a form the store can index: a name, `*`, or `*.` followed by a name.
/// Full DNS validation is Istio validation's job; this only rules out patterns whose matching
/// would be ambiguous.
pub fn check_pattern(host: &str) -> Result<(), HostError> {
    if host.is_empty() {
        return Err(HostError::Empty);
    }
    if host.len() > 253 {
        return Err(HostError::TooLong(host.len()));
    }
    if host.split('.').any(|label| label.len() > 63) {
        return Err(HostError::LabelTooLong(host.to_string()));
    }
    if host
        .chars()
        .any(|c| c.is_whitespace() || c == '/' || c == ':')
        && host.parse::<IpAddr>().is_err()
    {
        return Err(HostError::BadCharacter(host.to_string()));
    }
    let rest = match host.strip_prefix('*') {
        Some("") => return Ok(()),
        Some(rest) if rest.starts_with('.') && rest.len() > 1 => rest,
        Some(_) => return Err(HostError::BadWildcard(host.to_string())),
        None => host,
    };
    if rest.contains('*') {
        return Err(HostError::BadWildcard(host.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_resolve_like_istiod() {
        let cases = [
            // (as written, namespace, resolved)
            ("reviews", "default", "reviews.default.svc.cluster.local"),
            ("reviews", "bookinfo", "reviews.bookinfo.svc.cluster.local"),
            // A dot means "already qualified" to istiod, even when it is not a full FQDN.
            ("reviews.default", "bookinfo", "reviews.default"),
            (
                "reviews.default.svc.cluster.local",
                "x",
                "reviews.default.svc.cluster.local",
            ),
            ("*.example.com", "default", "*.example.com"),
            ("*", "default", "*"),
            ("10.1.2.3", "default", "10.1.2.3"),
            ("::1", "default", "::1"),
            ("2001:db8::1", "default", "2001:db8::1"),
        ];
        for (host, ns, want) in cases {
            assert_eq!(
                resolve_short_name(host, ns, DEFAULT_DOMAIN_SUFFIX),
                want,
                "{host} in {ns}"
            );
        }
        assert_eq!(
            resolve_short_name("a", "ns", "corp.example"),
            "a.ns.svc.corp.example"
        );
    }

    #[test]
    fn wildcard_matching_like_istio() {
        let cases = [
            ("foo.com", "foo.com", true),
            ("foo.com", "bar.com", false),
            ("*.com", "foo.com", true),
            ("bar.com", "*.com", true),
            ("*.foo.com", "foo.com", false),
            ("*", "foo.com", true),
            ("*", "*.com", true),
            ("*", "*", true),
            ("*.foo.com", "a.b.foo.com", true),
            ("*.foo.com", "*.bar.foo.com", true),
            ("*.bar.foo.com", "*.foo.com", true),
            ("*.bar.com", "*.foo.com", false),
            ("*.wikipedia.org", "en.wikipedia.org", true),
            ("en.wikipedia.org", "*.wikipedia.org", true),
            ("*.wikipedia.org", "wikipedia.org", false),
            ("afoo.com", "*.foo.com", false),
            (
                "reviews.default.svc.cluster.local",
                "*.svc.cluster.local",
                true,
            ),
            (
                "reviews.default.svc.cluster.local",
                "*.default.svc.cluster.local",
                true,
            ),
            (
                "reviews.default.svc.cluster.local",
                "*.other.svc.cluster.local",
                false,
            ),
        ];
        for (a, b, want) in cases {
            assert_eq!(matches(a, b), want, "{a} vs {b}");
            assert_eq!(matches(b, a), want, "{b} vs {a} (symmetry)");
        }
    }

    #[test]
    fn host_patterns() {
        for ok in ["*", "*.a.com", "a.com", "a", "10.0.0.1", "::1"] {
            assert_eq!(check_pattern(ok), Ok(()), "{ok}");
        }
        for bad in [
            "", "*a.com", "a.*.com", "*.", "**", "a b", "ns/a.com", "*.a*",
        ] {
            assert!(check_pattern(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn subset_is_one_way() {
        assert!(subset_of("a.example.com", "*.example.com"));
        assert!(!subset_of("*.example.com", "a.example.com"));
        assert!(subset_of("*.a.example.com", "*.example.com"));
        assert!(!subset_of("*.com", "*.example.com"));
        assert!(subset_of("anything", "*"));
    }
}
