//! The local trust domain and its aliases ([`TrustDomains`]): principals of one of them are
//! matched in all of them.

use super::DEFAULT_TRUST_DOMAIN;

/// The local trust domain and its aliases: principals of one of them (or of `cluster.local`)
/// are matched in all of them. Empty: principals are taken as written.
#[derive(Debug, Clone, Default)]
pub struct TrustDomains(pub Vec<String>);

impl TrustDomains {
    /// The mesh config's trust domain and its aliases; as written when it names none.
    pub fn of(mesh: &pasa_istio::mesh_config::MeshConfig) -> TrustDomains {
        match &mesh.trust_domain {
            Some(domain) if !domain.is_empty() => TrustDomains(
                std::iter::once(domain.clone())
                    .chain(mesh.trust_domain_aliases.iter().cloned())
                    .collect(),
            ),
            _ => TrustDomains::default(),
        }
    }
}

/// Principals of the local trust domain (or an alias, or `cluster.local`) in all of them.
pub(super) fn replace_aliases(principals: &[String], domains: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for p in principals {
        let parts: Vec<&str> = p.split('/').collect();
        if parts.len() != 5 || parts[0] == "*" {
            out.push(p.clone());
            continue;
        }
        let td = parts[0];
        if domains.iter().any(|d| wildcard_match(td, d)) || td == DEFAULT_TRUST_DOMAIN {
            let mut these: Vec<String> = Vec::new();
            for d in domains {
                // A principal whose trust domain is a `*suffix` pattern the domain fits stays
                // as written.
                let replaced = if td
                    .strip_prefix('*')
                    .is_some_and(|suffix| d.ends_with(suffix))
                {
                    p.clone()
                } else {
                    format!("{d}/{}", parts[1..].join("/"))
                };
                if !these.contains(&replaced) {
                    these.push(replaced);
                }
            }
            out.extend(these);
        } else {
            out.push(p.clone());
        }
    }
    out
}

/// Either side may hold one `*` at the start or the end.
fn wildcard_match(a: &str, b: &str) -> bool {
    let prefix_match =
        |x: &str, pattern: &str| pattern.strip_suffix('*').is_some_and(|p| x.starts_with(p));
    let suffix_match =
        |x: &str, pattern: &str| pattern.strip_prefix('*').is_some_and(|p| x.ends_with(p));
    a == b
        || b == "*"
        || prefix_match(a, b)
        || prefix_match(b, a)
        || suffix_match(a, b)
        || suffix_match(b, a)
}

pub(super) fn expand_aliases(values: &[String], domains: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for v in values {
        let expanded: Vec<String> = if domains.contains(v) {
            domains.to_vec()
        } else {
            vec![v.clone()]
        };
        for e in expanded {
            if !out.contains(&e) {
                out.push(e);
            }
        }
    }
    out
}
