//! Load balancer rules: consistent hashing, locality and zone-aware settings, slow start.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use pasa_istio::destination_rule::{
    ConsistentHashLb, Failover, HashAlgorithm, LoadBalancerSettings, LocalityLoadBalancerSetting,
    OutlierDetection, SimpleLb, WarmupConfiguration, ZoneAwareLoadBalancerSetting,
};

use super::{check_at_least_1ms, check_named, validate_duration};
use crate::validation::{Path, Report};

/// Maglev tables must be smaller than this (Envoy's limit).
const MAGLEV_TABLE_LIMIT: u64 = 5_000_011;

/// Node labels that carry the locality; failover priorities must not repeat them where the
/// locality order is already implied.
const TOPOLOGY_LABELS: &[&str] = &[
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.istio.io/subzone",
];

/// A load balancer; `outlier` is the outlier detection of the same policy (failover needs it).
pub(super) fn validate_load_balancer(
    at: &Path,
    lb: &LoadBalancerSettings,
    outlier: Option<&OutlierDetection>,
    report: &mut Report,
) {
    if let Some(simple) = lb.simple() {
        check_named(
            &at.field("simple"),
            simple.name(),
            simple,
            SimpleLb::NAMES,
            report,
        );
    }
    if let Some(ch) = lb.consistent_hash() {
        validate_consistent_hash(&at.field("consistentHash"), ch, report);
    }
    if lb.locality_lb_setting.is_some() && lb.zone_aware_lb_setting.is_some() {
        report.error(
            at,
            "only one of localityLbSetting and zoneAwareLbSetting can be set",
        );
    }
    if let Some(locality) = &lb.locality_lb_setting {
        validate_locality_lb(&at.field("localityLbSetting"), locality, outlier, report);
    }
    if let Some(zone_aware) = &lb.zone_aware_lb_setting {
        validate_zone_aware_lb(&at.field("zoneAwareLbSetting"), zone_aware, outlier, report);
    }
    if let Some(d) = &lb.warmup_duration_secs {
        check_at_least_1ms(&at.field("warmupDurationSecs"), d, report);
    }
    if let Some(warmup) = &lb.warmup {
        validate_warmup(&at.field("warmup"), warmup, report);
    }
}

fn validate_consistent_hash(at: &Path, ch: &ConsistentHashLb, report: &mut Report) {
    if let Some(cookie) = ch.http_cookie() {
        let at = at.field("httpCookie");
        if cookie.name.is_empty() {
            report.error(&at.field("name"), "name required for HttpCookie");
        }
        let mut seen = HashSet::new();
        for (i, attr) in cookie.attributes.iter().enumerate() {
            let here = at.field("attributes").index(i).field("name");
            if attr.name.is_empty() {
                report.error(&here, "cookie attribute name cannot be empty");
            } else if !seen.insert(attr.name.as_str()) {
                report.error(
                    &here,
                    format!("duplicate cookie attribute name: {}", attr.name),
                );
            }
        }
    }
    if ch.minimum_ring_size.0 != 0 {
        report.warn(
            &at.field("minimumRingSize"),
            "consistent hash minimumRingSize is deprecated, use ringHash.minimumRingSize instead",
        );
        if ch.hash_algorithm.is_some() {
            report.error(
                &at.field("minimumRingSize"),
                "only one of minimumRingSize or maglev/ringHash can be specified",
            );
        }
    }
    if let Some(HashAlgorithm::Maglev(maglev)) = &ch.hash_algorithm {
        let at = at.field("maglev").field("tableSize");
        let size = maglev.table_size.0;
        if size == 0 {
            report.error(&at, "tableSize must be set for maglev");
        }
        // An oversized table is refused without a primality test (trial division would be slow).
        if size >= MAGLEV_TABLE_LIMIT {
            report.error(
                &at,
                format!("tableSize must be less than {MAGLEV_TABLE_LIMIT} for maglev, got {size}"),
            );
        } else if !is_prime(size) {
            report.error(
                &at,
                format!("tableSize must be a prime number for maglev, got {size}"),
            );
        }
    }
}

/// Primality as Envoy tests it for Maglev table sizes (0 is not prime; 1, 2 and 3 are taken as prime).
fn is_prime(x: u64) -> bool {
    if x != 0 && x < 4 {
        return true;
    }
    if x.is_multiple_of(2) {
        return false;
    }
    let mut factor = 3u64;
    while factor.saturating_mul(factor) <= x {
        if x.is_multiple_of(factor) {
            return false;
        }
        factor += 2;
    }
    true
}

fn validate_locality_lb(
    at: &Path,
    lb: &LocalityLoadBalancerSetting,
    outlier: Option<&OutlierDetection>,
    report: &mut Report,
) {
    if !lb.distribute.is_empty() && !lb.failover.is_empty() {
        report.error(
            at,
            "can not simultaneously specify 'distribute' and 'failover'",
        );
        return;
    }
    if !lb.failover.is_empty()
        && let Some((i, label)) = lb
            .failover_priority
            .iter()
            .enumerate()
            .find(|(_, l)| TOPOLOGY_LABELS.contains(&l.as_str()))
    {
        report.error(
            &at.field("failoverPriority").index(i),
            format!(
                "can not simultaneously set 'failover' and topology label '{label}' in 'failoverPriority'"
            ),
        );
        return;
    }

    for (i, dist) in lb.distribute.iter().enumerate() {
        let here = at.field("distribute").index(i);
        if let Some((loc, weight)) = dist.to.iter().find(|(_, w)| !(1..=100).contains(*w)) {
            report.error(
                &here.field("to").key(loc),
                format!("locality weight must be in range [1, 100], got {weight}"),
            );
            return;
        }
        let total: u32 = dist.to.values().sum();
        if total != 100 {
            report.error(
                &here.field("to"),
                format!("total locality weight {total} != 100"),
            );
            return;
        }
        let destinations: Vec<&str> = dist.to.keys().map(String::as_str).collect();
        report.check(&here.field("to"), validate_localities(&destinations));
    }
    let sources: Vec<&str> = lb.distribute.iter().map(|d| d.from.as_str()).collect();
    report.check(&at.field("distribute"), validate_localities(&sources));

    warn_failover_without_outlier(at, &lb.failover, &lb.failover_priority, outlier, report);
    check_failover_regions(at, &lb.failover, "locality lb failover", report);
}

fn validate_zone_aware_lb(
    at: &Path,
    lb: &ZoneAwareLoadBalancerSetting,
    outlier: Option<&OutlierDetection>,
    report: &mut Report,
) {
    for (i, label) in lb.failover_priority.iter().enumerate() {
        if TOPOLOGY_LABELS.contains(&label.as_str()) {
            report.error(
                &at.field("failoverPriority").index(i),
                format!(
                    "'failoverPriority' for zone aware lb must not use topology label '{label}'; \
                     region- and zone-level routing are handled automatically"
                ),
            );
        }
    }
    warn_failover_without_outlier(at, &lb.failover, &lb.failover_priority, outlier, report);
    check_failover_regions(at, &lb.failover, "zone aware lb failover", report);
    if let Some(size) = lb.min_cluster_size
        && size.0 < 1
    {
        report.error(
            &at.field("minClusterSize"),
            "minClusterSize must be at least 1",
        );
    }
}

fn warn_failover_without_outlier(
    at: &Path,
    failover: &[Failover],
    priority: &[String],
    outlier: Option<&OutlierDetection>,
    report: &mut Report,
) {
    if (!failover.is_empty() || !priority.is_empty()) && outlier.is_none() {
        report.warn(
            at,
            "outlier detection policy must be provided for failover (without it, unhealthy \
             endpoints are not detected)",
        );
    }
}

/// Failover names whole regions: different ones, without `/` or `*`.
fn check_failover_regions(at: &Path, failover: &[Failover], what: &str, report: &mut Report) {
    for (i, f) in failover.iter().enumerate() {
        let here = at.field("failover").index(i);
        if f.from == f.to {
            report.error(
                &here,
                format!("{what} settings must specify different regions"),
            );
        }
        if f.from.contains('/') || f.to.contains('/') {
            report.error(
                &here,
                format!("{what} only specifies a region (no zone or subzone)"),
            );
        }
        if f.from.contains('*') || f.to.contains('*') {
            report.error(
                &here,
                format!("{what} region should not contain '*' wildcard"),
            );
        }
    }
}

/// Localities (`region[/zone[/subzone]]`, `*` only as the last character) that do not overlap:
/// none repeats or contains another. Reports the first problem, in list order.
fn validate_localities(localities: &[&str]) -> Result<(), String> {
    // region -> zone -> subzones; "*" stands for "all of them".
    let mut seen: BTreeMap<&str, BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
    for &locality in localities {
        let overlap = || format!("locality {locality} overlaps with a previous one");
        let stars = locality.matches('*').count();
        if stars > 1 || (stars == 1 && !locality.ends_with('*')) {
            return Err(format!(
                "locality {locality}: at most one wildcard '*', and only at the end"
            ));
        }
        if seen.contains_key("*") {
            return Err(overlap());
        }
        let parts: Vec<&str> = locality.splitn(3, '/').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(format!(
                "locality {locality} must not contain empty region/zone/subzone info"
            ));
        }
        let region = parts[0];
        match parts.len() {
            1 => {
                if seen.contains_key(region) {
                    return Err(overlap());
                }
                seen.insert(region, BTreeMap::from([("*", BTreeSet::from(["*"]))]));
            }
            2 => {
                let zone = parts[1];
                let zones = seen.entry(region).or_default();
                if zones.contains_key("*") || zones.contains_key(zone) {
                    return Err(overlap());
                }
                zones.insert(zone, BTreeSet::from(["*"]));
            }
            _ => {
                let (zone, subzone) = (parts[1], parts[2]);
                let zones = seen.entry(region).or_default();
                if zones.contains_key("*") {
                    return Err(overlap());
                }
                let subzones = zones.entry(zone).or_default();
                if subzones.contains("*") || !subzones.insert(subzone) {
                    return Err(overlap());
                }
            }
        }
    }
    Ok(())
}

fn validate_warmup(at: &Path, warmup: &WarmupConfiguration, report: &mut Report) {
    match &warmup.duration {
        None => report.error(&at.field("duration"), "warmup duration is required"),
        Some(d) => report.check(&at.field("duration"), validate_duration(d)),
    }
    if let Some(p) = warmup.minimum_percent
        && !(0.0..=100.0).contains(&p)
    {
        report.error(
            &at.field("minimumPercent"),
            format!("minimumPercent value should be between 0 and 100, got {p}"),
        );
    }
    if let Some(a) = warmup.aggression
        && a <= 0.0
    {
        report.error(
            &at.field("aggression"),
            format!("aggression should be greater than 0, got {a}"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primes_as_envoy_counts_them() {
        for p in [1, 2, 3, 5, 7, 65537, 5_000_011] {
            assert!(is_prime(p), "{p}");
        }
        for n in [0, 4, 9, 65535, 5_000_010] {
            assert!(!is_prime(n), "{n}");
        }
    }

    #[test]
    fn localities_must_not_overlap() {
        assert!(validate_localities(&["a", "b/c", "b/d/e", "b/d/f"]).is_ok());
        assert!(validate_localities(&["a", "a/b"]).is_err());
        assert!(validate_localities(&["a/b", "a"]).is_err());
        assert!(validate_localities(&["a/b/*", "a/b/c"]).is_err());
        assert!(validate_localities(&["a/b/c", "a/b/c"]).is_err());
        assert!(validate_localities(&["*", "a"]).is_err());
        assert!(validate_localities(&["a/*/c"]).is_err());
        assert!(validate_localities(&["a//c"]).is_err());
        assert!(validate_localities(&["a/b/c/d"]).is_ok());
    }
}
