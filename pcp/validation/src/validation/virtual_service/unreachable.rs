//! Warnings about rules that can never be reached and matches that never take effect, as istiod
//! gives them: a rule after a catch-all rule, a match repeated from an earlier rule, and (HTTP)
//! a URI-prefix match covered by an earlier, shorter prefix with the same other conditions.

use std::collections::BTreeMap;

use pasa_istio::virtual_service::{HttpMatchRequest, HttpRoute, StringMatch, VirtualService};

use super::super::{Path, Report};

/// Analyzes the HTTP, TCP and TLS rules of a VirtualService.
pub(super) fn analyze(vs: &VirtualService, report: &mut Report) {
    let spec = Path::spec();
    analyze_http(&spec.field("http"), &vs.http, report);
    analyze_rules(
        &spec.field("tcp"),
        vs.tcp.iter().map(|r| r.matches.as_slice()),
        report,
    );
    analyze_rules(
        &spec.field("tls"),
        vs.tls.iter().map(|r| r.matches.as_slice()),
        report,
    );
}

fn warn_unused(report: &mut Report, at: &Path, rule: &str, reason: &str) {
    report.warn(
        at,
        format!("virtualService rule {rule} not used ({reason})"),
    );
}

fn warn_ineffective(report: &mut Report, at: &Path, rule: &str, matchn: &str, earlier: &str) {
    report.warn(
        at,
        format!(
            "virtualService rule {rule} match {matchn} is not used (duplicate/overlapping match in rule {earlier})"
        ),
    );
}

/// How warnings name a rule: its name in quotes, or `#index`.
fn rule_name(name: &str, index: usize) -> String {
    if name.is_empty() {
        format!("#{index}")
    } else {
        format!("{name:?}")
    }
}

/// TCP and TLS rules, given as each rule's matches: unreachable rules and repeated matches.
fn analyze_rules<'a, M: serde::Serialize + 'a>(
    at: &Path,
    rules: impl Iterator<Item = &'a [M]>,
    report: &mut Report,
) {
    // Matches keyed by their JSON, so thousands of rules are checked in linear time.
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut catch_all = false;
    for (rulen, matches) in rules.enumerate() {
        let here = at.index(rulen);
        let rule = rule_name("", rulen);
        if matches.is_empty() {
            if catch_all {
                warn_unused(
                    report,
                    &here,
                    &rule,
                    "only the last rule can have no matches",
                );
            }
            catch_all = true;
            continue;
        }
        let mut duplicates = 0;
        for (matchn, m) in matches.iter().enumerate() {
            if catch_all {
                warn_unused(report, &here, &rule, "route without matches defined before");
                continue;
            }
            let key = serde_json::to_string(m).unwrap_or_default();
            if let Some(&earlier) = seen.get(&key) {
                warn_ineffective(
                    report,
                    &here.field("match").index(matchn),
                    &rule,
                    &format!("#{matchn}"),
                    &rule_name("", earlier),
                );
                duplicates += 1;
            } else {
                seen.insert(key, rulen);
            }
        }
        if duplicates == matches.len() {
            warn_unused(report, &here, &rule, "all matches used by prior rules");
        }
    }
}

/// An HTTP match led by a non-empty URI prefix, reduced to what the overlap check compares:
/// each other condition as `exact:value`, `prefix:value` or empty (regexes are not compared).
struct PrefixMatch {
    rule: String,
    matchn: String,
    at: Path,
    prefix: String,
    port: u32,
    method: String,
    authority: String,
    headers: BTreeMap<String, String>,
    query_params: BTreeMap<String, String>,
    without_headers: BTreeMap<String, String>,
}

fn exact_or_prefix(m: Option<&StringMatch>) -> String {
    match m {
        Some(m) => match (m.as_exact(), m.as_prefix()) {
            (Some(e), _) if !e.is_empty() => format!("exact:{e}"),
            (_, Some(p)) if !p.is_empty() => format!("prefix:{p}"),
            _ => String::new(),
        },
        None => String::new(),
    }
}

fn reduce_map(map: &BTreeMap<String, StringMatch>) -> BTreeMap<String, String> {
    map.iter()
        .map(|(k, v)| (k.clone(), exact_or_prefix(Some(v))))
        .collect()
}

impl PrefixMatch {
    fn new(rule: String, matchn: String, at: Path, m: &HttpMatchRequest) -> Option<Self> {
        let prefix = m.uri.as_ref()?.as_prefix().filter(|p| !p.is_empty())?;
        let mut method = exact_or_prefix(m.method.as_ref());
        if method.is_empty() {
            // Without a method condition the comparison assumes GET.
            method = "exact:GET".to_string();
        }
        Some(PrefixMatch {
            rule,
            matchn,
            at,
            prefix: prefix.to_string(),
            port: m.port,
            method,
            authority: exact_or_prefix(m.authority.as_ref()),
            headers: reduce_map(&m.headers),
            query_params: reduce_map(&m.query_params),
            without_headers: reduce_map(&m.without_headers),
        })
    }

    /// Whether this (earlier) match takes every request `later` would: its prefix is a prefix of
    /// the later one, and each other condition is equal or (as istiod compares them) starts with
    /// the later one's.
    fn covers(&self, later: &PrefixMatch) -> bool {
        let value_covers = |a: &str, b: &str| a == b || a.starts_with(b);
        let map_covers = |a: &BTreeMap<String, String>, b: &BTreeMap<String, String>| {
            a.len() == b.len()
                && a.iter()
                    .all(|(k, va)| b.get(k).is_some_and(|vb| value_covers(va, vb)))
        };
        later.prefix.starts_with(&self.prefix)
            && self.port == later.port
            && value_covers(&self.method, &later.method)
            && value_covers(&self.authority, &later.authority)
            && map_covers(&self.headers, &later.headers)
            && map_covers(&self.query_params, &later.query_params)
            && map_covers(&self.without_headers, &later.without_headers)
    }
}

fn analyze_http(at: &Path, routes: &[HttpRoute], report: &mut Report) {
    // A match's name is not a condition: compare matches without it. Keyed by their JSON, so a
    // VirtualService with thousands of matches is checked in linear time.
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut catch_all = false;
    let mut prefix_matches: Vec<PrefixMatch> = Vec::new();
    for (rulen, route) in routes.iter().enumerate() {
        let here = at.index(rulen);
        let rule = rule_name(&route.name, rulen);
        if route.matches.is_empty() {
            if catch_all {
                warn_unused(
                    report,
                    &here,
                    &rule,
                    "only the last rule can have no matches",
                );
            }
            catch_all = true;
            continue;
        }
        let mut duplicates = 0;
        for (matchn, m) in route.matches.iter().enumerate() {
            if catch_all {
                warn_unused(report, &here, &rule, "route without matches defined before");
                continue;
            }
            let match_at = here.field("match").index(matchn);
            let match_name = rule_name(&m.name, matchn);
            let unnamed = HttpMatchRequest {
                name: String::new(),
                ..m.clone()
            };
            let key = serde_json::to_string(&unnamed).unwrap_or_default();
            if let Some(&earlier) = seen.get(&key) {
                let earlier = rule_name(&routes[earlier].name, earlier);
                warn_ineffective(report, &match_at, &rule, &match_name, &earlier);
                duplicates += 1;
                continue;
            }
            seen.insert(key, rulen);
            prefix_matches.extend(PrefixMatch::new(rule.clone(), match_name, match_at, m));
        }
        if duplicates == route.matches.len() {
            warn_unused(report, &here, &rule, "all matches used by prior rules");
        }
    }

    warn_covered_prefixes(at, &prefix_matches, report);
}

/// Most comparisons of URI-prefix matches one VirtualService gets: past it, the overlap warnings
/// stop (with a warning that says so), so that no document costs more than its size allows.
const MAX_PREFIX_COMPARISONS: usize = 200_000;

/// Warns of each URI-prefix match covered by an earlier one with a shorter prefix. Only the
/// matches whose prefix is a proper prefix of a later one's are compared, found by a hash of each
/// prefix of the later prefix (computed in one pass over it); the warnings come in the order a
/// pairwise comparison gives them (by earlier match, then later).
fn warn_covered_prefixes(at: &Path, prefix_matches: &[PrefixMatch], report: &mut Report) {
    let step = |hash: u64, byte: u8| hash.wrapping_mul(1_000_003).wrapping_add(u64::from(byte));
    // Earlier matches by (hash, length) of their prefix. A hash collision costs a comparison,
    // never a wrong warning: `covers` compares the prefixes themselves.
    let mut by_prefix: std::collections::HashMap<(u64, usize), Vec<usize>> =
        std::collections::HashMap::new();
    let mut covered: Vec<(usize, usize)> = Vec::new();
    let mut budget = MAX_PREFIX_COMPARISONS;
    'later: for (j, later) in prefix_matches.iter().enumerate() {
        let bytes = later.prefix.as_bytes();
        let mut hash = 0u64;
        for (n, &byte) in bytes.iter().enumerate() {
            hash = step(hash, byte);
            // Shorter prefixes only: equal ones are duplicates, reported already when the rest
            // is equal too.
            if n + 1 == bytes.len() {
                break;
            }
            let Some(earlier) = by_prefix.get(&(hash, n + 1)) else {
                continue;
            };
            for &i in earlier {
                if budget == 0 {
                    report.warn(
                        at,
                        format!(
                            "overlapping URI prefix matches not checked past {MAX_PREFIX_COMPARISONS} comparisons: this virtual service has too many rules sharing prefixes to check them all"
                        ),
                    );
                    break 'later;
                }
                budget -= 1;
                if prefix_matches[i].covers(later) {
                    covered.push((i, j));
                }
            }
        }
        let full = bytes.iter().fold(0u64, |h, &b| step(h, b));
        by_prefix.entry((full, bytes.len())).or_default().push(j);
    }
    covered.sort_unstable();
    for (i, j) in covered {
        let (earlier, later) = (&prefix_matches[i], &prefix_matches[j]);
        warn_ineffective(
            report,
            &later.at,
            &later.rule,
            &format!("{} of prefix {}", later.matchn, later.prefix),
            &format!(
                "{} of prefix {} on {}",
                earlier.matchn, earlier.prefix, earlier.rule
            ),
        );
    }
}
