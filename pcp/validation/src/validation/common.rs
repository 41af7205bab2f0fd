//! Rules several kinds share: DNS names and wildcards, ports, protocols, durations, addresses,
//! labels, `exportTo`, workload selectors and the metadata istiod checks on every object.
//!
//! Each check returns `Err(message)` with the rule in words; the caller attaches the field path.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use pasa_istio::authorization_policy::{DRY_RUN_ANNOTATION, PolicyTargetReference};
use pasa_istio::common::{Duration, Protocol};
use pasa_istio::destination_rule::WorkloadSelector;
use pasa_proto::Object;

use super::{Path, Report};

pub type Check = Result<(), String>;

const MAX_DOMAIN_LENGTH: usize = 255;
const MAX_LABEL_LENGTH: usize = 63;

fn is_alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

/// A DNS label as Istio reads it (RFC 1123, either case): letters, digits and `-`, starting and
/// ending with a letter or digit, at most 63 characters.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL_LENGTH
        && is_alnum(b[0])
        && is_alnum(b[b.len() - 1])
        && b.iter().all(|&c| is_alnum(c) || c == b'-')
}

/// A first label that may be a wildcard: `*`, or a DNS label led by `*` or `*-` (`*foo`, `*-foo`).
pub fn is_wildcard_dns1123_label(s: &str) -> bool {
    if s.len() > MAX_LABEL_LENGTH {
        return false;
    }
    if s == "*" {
        return true;
    }
    let rest = s
        .strip_prefix("*-")
        .or_else(|| s.strip_prefix('*'))
        .unwrap_or(s);
    is_dns1123_label(rest)
}

fn check_domain_preconditions(name: &str) -> Check {
    if name.len() > MAX_DOMAIN_LENGTH {
        return Err(format!(
            "domain name {name:?} too long (max {MAX_DOMAIN_LENGTH})"
        ));
    }
    if name.is_empty() {
        return Err("empty domain name not allowed".to_string());
    }
    Ok(())
}

/// Every label of a domain is a DNS label; the top-level one is not all digits; a trailing dot
/// (`istio.io.`) is allowed.
pub fn validate_dns1123_labels(domain: &str) -> Check {
    let parts: Vec<&str> = domain.split('.').collect();
    let top = parts[parts.len() - 1];
    if !top.is_empty() && top.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "domain name {domain:?} invalid (top level domain {top:?} cannot be all-numeric)"
        ));
    }
    for (i, label) in parts.iter().enumerate() {
        if i == parts.len() - 1 && label.is_empty() {
            return Ok(());
        }
        if !is_dns1123_label(label) {
            return Err(format!(
                "domain name {domain:?} invalid (label {label:?} invalid)"
            ));
        }
    }
    Ok(())
}

/// A fully qualified domain name (no wildcard).
pub fn validate_fqdn(fqdn: &str) -> Check {
    check_domain_preconditions(fqdn)?;
    validate_dns1123_labels(fqdn)
}

/// A domain name whose first label may be a wildcard (`*`, `*.example.com`, `*-foo.example.com`).
pub fn validate_wildcard_domain(domain: &str) -> Check {
    check_domain_preconditions(domain)?;
    let (first, rest) = match domain.split_once('.') {
        Some((first, rest)) => (first, Some(rest)),
        None => (domain, None),
    };
    if !is_wildcard_dns1123_label(first) {
        return Err(format!(
            "domain name {domain:?} invalid (label {first:?} invalid)"
        ));
    }
    match rest {
        Some(rest) => validate_dns1123_labels(rest),
        None => Ok(()),
    }
}

/// A `*` anywhere but as the whole host or a leading `*.` label is a partial wildcard.
pub fn validate_partial_wildcard(host: &str) -> Check {
    if host.contains('*') && host.len() != 1 && !host.starts_with("*.") {
        return Err(format!("partial wildcard {host:?} not allowed"));
    }
    Ok(())
}

fn validate_hostname_part(hostname: &str, is_gateway: bool, errors: &mut Vec<String>) {
    if hostname != "*" && !hostname.contains('.') {
        errors.push("short names (non FQDN) are not allowed".to_string());
    }
    if let Err(e) = validate_wildcard_domain(hostname) {
        // A gateway may name an IP address instead of a host.
        if !is_gateway || validate_ip_address(hostname).is_err() {
            errors.push(e);
        }
    }
    if let Err(e) = validate_partial_wildcard(hostname) {
        errors.push(e);
    }
}

/// A `namespace/dnsName` host of a Sidecar egress listener (`is_gateway` false) or a Gateway
/// server (`is_gateway` true; there the `namespace/` part is optional and an IP is allowed).
/// Returns every rule broken.
pub fn validate_namespace_slash_wildcard_hostname(hostname: &str, is_gateway: bool) -> Vec<String> {
    let mut errors = Vec::new();
    let Some((ns, host)) = hostname.split_once('/') else {
        if is_gateway {
            validate_hostname_part(hostname, true, &mut errors);
        } else {
            errors.push("host must be of form namespace/dnsName".to_string());
        }
        return errors;
    };
    if ns.is_empty() || host.is_empty() {
        errors.push("config namespace and dnsName in host entry cannot be empty".to_string());
    }
    if !is_gateway {
        let bare = ns.strip_prefix('~').unwrap_or(ns);
        if !bare.is_empty() && bare != "*" && bare != "." && !is_dns1123_label(bare) {
            errors.push(format!("invalid namespace value {ns:?} in sidecar"));
        }
    } else if ns != "*" && ns != "." && !is_dns1123_label(ns) {
        errors.push(format!("invalid namespace value {ns:?} in gateway"));
    }
    validate_hostname_part(host, is_gateway, &mut errors);
    errors
}

/// A port number in 1..65535.
pub fn validate_port(port: i64) -> Check {
    if (1..=65535).contains(&port) {
        Ok(())
    } else {
        Err(format!("port number {port} must be in the range 1..65535"))
    }
}

/// A port name is a DNS label.
pub fn validate_port_name(name: &str) -> Check {
    if is_dns1123_label(name) {
        Ok(())
    } else {
        Err(format!("invalid port name: {name}"))
    }
}

/// A protocol istiod knows; empty means "detect".
pub fn validate_protocol(protocol: &str) -> Check {
    if !protocol.is_empty() && Protocol::parse(protocol).is_none() {
        return Err(format!("unsupported protocol: {protocol}"));
    }
    Ok(())
}

/// At least 1ms, in whole milliseconds (Envoy's precision), and within the ~292 years a Go
/// duration holds (istiod saturates longer ones, which then fail the precision rule).
pub fn validate_duration(d: &Duration) -> Check {
    let nanos = d.as_nanos();
    if nanos > i128::from(i64::MAX) {
        return Err("duration is too long: at most 292 years".to_string());
    }
    if nanos < 1_000_000 {
        return Err("duration must be greater than 1ms".to_string());
    }
    if nanos % 1_000_000 != 0 {
        return Err("only durations to ms precision are supported".to_string());
    }
    Ok(())
}

/// Within `[min, max]`, both given in milliseconds.
pub fn validate_duration_range(d: &Duration, min_ms: i64, max_ms: i64) -> Check {
    let nanos = d.as_nanos();
    let (min, max) = (
        i128::from(min_ms) * 1_000_000,
        i128::from(max_ms) * 1_000_000,
    );
    if nanos < min || nanos > max {
        return Err(format!(
            "time {d} must be >{} and <{}",
            Duration::from_millis(min_ms),
            Duration::from_millis(max_ms)
        ));
    }
    Ok(())
}

/// An IPv4 or IPv6 address; an IPv6 address may carry a zone (`fe80::1%eth0`), as Go allows.
pub fn validate_ip_address(addr: &str) -> Check {
    let bad = || format!("{addr} is not a valid IP");
    match addr.split_once('%') {
        Some((ip, zone)) if !zone.is_empty() => ip
            .parse::<std::net::Ipv6Addr>()
            .map(|_| ())
            .map_err(|_| bad()),
        Some(_) => Err(bad()),
        None => addr.parse::<IpAddr>().map(|_| ()).map_err(|_| bad()),
    }
}

/// An address or a CIDR block (`10.0.0.0/8`, `2001:db8::/32`).
pub fn validate_ip_subnet(subnet: &str) -> Check {
    if subnet.matches('/').count() == 1 {
        let (addr, bits) = subnet.split_once('/').unwrap_or_default();
        let max = match addr.parse::<IpAddr>() {
            Ok(IpAddr::V4(_)) => 32,
            Ok(IpAddr::V6(_)) => 128,
            Err(_) => return Err(format!("{subnet} is not a valid CIDR block")),
        };
        // No leading zeros (`/08`), as Go's prefix parser requires.
        let ok = !bits.is_empty()
            && bits.bytes().all(|b| b.is_ascii_digit())
            && (bits == "0" || !bits.starts_with('0'))
            && bits.len() <= 3
            && bits.parse::<u32>().is_ok_and(|b| b <= max);
        return if ok {
            Ok(())
        } else {
            Err(format!("{subnet} is not a valid CIDR block"))
        };
    }
    validate_ip_address(subnet)
}

/// A Kubernetes label key: optional DNS prefix and `/`, then a name of letters, digits, `-`, `_`
/// and `.`, starting and ending alphanumeric, at most 63 characters.
pub fn validate_label_key(key: &str) -> Check {
    let bad = || format!("invalid tag key: {key:?}");
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() || !prefix.split('.').all(is_dns1123_label) {
            return Err(bad());
        }
        if prefix.len() > 253 {
            return Err(format!("invalid tag key: {key:?} (DNS prefix is too long)"));
        }
    }
    if !is_qualified_name(name) {
        return Err(bad());
    }
    if name.len() > MAX_LABEL_LENGTH {
        return Err(format!("invalid tag key: {key:?} (name is too long)"));
    }
    Ok(())
}

fn is_qualified_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_alnum(b[0])
        && is_alnum(b[b.len() - 1])
        && b.iter()
            .all(|&c| is_alnum(c) || c == b'-' || c == b'_' || c == b'.')
}

/// A label value: empty, or a qualified name.
pub fn validate_label_value(value: &str) -> Check {
    if value.is_empty() || is_qualified_name(value) {
        Ok(())
    } else {
        Err(format!("invalid tag value: {value:?}"))
    }
}

/// Every key and value of a label map, each reported at its own path.
pub fn validate_labels(at: &Path, labels: &BTreeMap<String, String>, report: &mut Report) {
    for (k, v) in labels {
        let here = at.key(k);
        report.check(&here, validate_label_key(k));
        report.check(&here, validate_label_value(v));
    }
}

/// A workload selector's labels: no empty key, no `*`; an empty selector is a warning (it selects
/// every workload of the namespace).
pub fn validate_selector_labels(at: &Path, labels: &BTreeMap<String, String>, report: &mut Report) {
    for (k, v) in labels {
        if k.is_empty() {
            report.error(
                &at.key(k),
                format!("empty key is not supported in selector: \"{k}={v}\""),
            );
        }
        if k.contains('*') || v.contains('*') {
            report.error(
                &at.key(k),
                format!("wildcard is not supported in selector: \"{k}={v}\""),
            );
        }
    }
    if labels.is_empty() {
        report.warn(at, "workload selector specified without labels");
    }
}

/// A policy's workload selector (`istio.type.v1beta1.WorkloadSelector`: DestinationRule and the
/// security kinds): `matchLabels` by the shared selector rules, with the CRD's limits.
pub fn validate_policy_selector(at: &Path, selector: &WorkloadSelector, report: &mut Report) {
    /// The CRD's cap on the selector's labels.
    const MAX_LABELS: usize = 4096;
    let at = at.field("matchLabels");
    validate_selector_labels(&at, &selector.match_labels, report);
    validate_selector_label_limits(&at, &selector.match_labels, MAX_LABELS, report);
}

/// The CRD's limits on a workload selector: at most `max_labels` labels (256 for Sidecar and
/// ServiceEntry, 4096 for DestinationRule), values of at most 63 characters.
pub fn validate_selector_label_limits(
    at: &Path,
    labels: &BTreeMap<String, String>,
    max_labels: usize,
    report: &mut Report,
) {
    const MAX_VALUE_LENGTH: usize = 63;
    if labels.len() > max_labels {
        report.error(
            at,
            format!(
                "a workload selector may have at most {max_labels} labels, found {}",
                labels.len()
            ),
        );
    }
    for (key, value) in labels {
        if value.len() > MAX_VALUE_LENGTH {
            report.error(
                &at.key(key),
                format!(
                    "selector label value may be at most {MAX_VALUE_LENGTH} characters long, found {}",
                    value.len()
                ),
            );
        }
    }
}

/// How `exportTo` is checked for one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExportToRules {
    /// ServiceEntries may be exported to no one (`~`).
    pub is_service_entry: bool,
    /// DestinationRules with a workload selector may only be exported to their own namespace.
    pub is_destination_rule_with_selector: bool,
}

/// `exportTo`: `.`, `*`, `~` (ServiceEntry only) or namespace names, without duplicates or
/// contradictions.
pub fn validate_export_to(
    at: &Path,
    namespace: &str,
    export_to: &[String],
    rules: ExportToRules,
    report: &mut Report,
) {
    if export_to.is_empty() {
        return;
    }
    let mut seen: HashSet<&str> = HashSet::new();
    for (i, entry) in export_to.iter().enumerate() {
        let here = at.index(i);
        let key = if entry == "." {
            namespace
        } else {
            entry.as_str()
        };
        if seen.contains(key) {
            if key != entry {
                report.error(
                    &here,
                    format!("duplicate entries in exportTo: . and current namespace {namespace}"),
                );
            } else {
                report.error(
                    &here,
                    format!("duplicate entries in exportTo for entry {entry}"),
                );
            }
            continue;
        }
        if rules.is_service_entry && entry == "~" {
            seen.insert(key);
            continue;
        }
        let check = match key {
            "*" => Ok(()),
            "~" => Err("exportTo ~ (none) is not allowed for Istio configuration objects"),
            k if k == namespace || is_dns1123_label(k) => Ok(()),
            _ => Err("only .,*, or a valid DNS 1123 label is allowed as exportTo entry"),
        };
        match check {
            Ok(()) => {
                seen.insert(key);
            }
            Err(e) => report.error(&here, e),
        }
    }
    if rules.is_destination_rule_with_selector && !seen.is_empty() {
        if seen.contains(namespace) {
            if seen.len() > 1 {
                report.error(
                    at,
                    "destination rule with workload selector cannot have multiple entries in exportTo",
                );
            }
        } else {
            report.error(
                at,
                "destination rule with workload selector cannot have exportTo beyond current namespace",
            );
        }
    }
    if seen.contains("*") && export_to.len() > 1 {
        report.error(
            at,
            "cannot have both public (*) and non-public exportTo values for a resource",
        );
    }
    if seen.contains("~") && export_to.len() > 1 {
        report.error(at, "cannot export service entry to no one (~) and someone");
    }
}

/// Annotations istiod refuses on networking objects (`istio.io/dry-run` is AuthorizationPolicy's
/// alone, checked with it).
/// The annotations istiod refuses on what users write; `generated` objects (istiod's own, made
/// from the Gateway API) carry `internal.istio.io/parents` and `parent-namespace` by design.
pub fn validate_metadata(obj: &Object, generated: bool, report: &mut Report) {
    let at = Path::root("metadata").field("annotations");
    if obj.kind != pasa_proto::Kind::AuthorizationPolicy
        && obj.annotations.contains_key(DRY_RUN_ANNOTATION)
    {
        report.error(
            &at.key(DRY_RUN_ANNOTATION),
            format!(
                "{}/{} has unsupported annotation {DRY_RUN_ANNOTATION}, please remove the annotation",
                obj.namespace, obj.name
            ),
        );
    }
    for (annotation, why) in [
        (
            "internal.istio.io/webhook-always-reject",
            "found, rejecting",
        ),
        (
            "internal.istio.io/parent-namespace",
            "found, this may not be set by users",
        ),
        (
            "internal.istio.io/parents",
            "found, this may not be set by users",
        ),
    ] {
        let istiods_own = generated && annotation != "internal.istio.io/webhook-always-reject";
        if obj.annotations.contains_key(annotation) && !istiods_own {
            report.error(
                &at.key(annotation),
                format!("{annotation:?} annotation {why}"),
            );
        }
    }
}

/// One of `selector`, `targetRef`, `targetRefs`, each well-formed: how a policy
/// (AuthorizationPolicy, RequestAuthentication, Telemetry, WasmPlugin, TrafficExtension) picks
/// what it applies to.
pub fn attachment(
    selector: Option<&WorkloadSelector>,
    target: Option<&PolicyTargetReference>,
    targets: &[PolicyTargetReference],
    spec: &Path,
    report: &mut Report,
) {
    let set = usize::from(selector.is_some())
        + usize::from(target.is_some())
        + usize::from(!targets.is_empty());
    if set > 1 {
        report.error(
            spec,
            "only one of targetRefs or workloadSelector can be set",
        );
    }
    if let Some(selector) = selector {
        validate_policy_selector(&spec.field("selector"), selector, report);
    }
    if let Some(target) = target {
        target_ref(target, &spec.field("targetRef"), report);
    }
    /// The CRDs' cap on `targetRefs`.
    const MAX_TARGET_REFS: usize = 16;
    if targets.len() > MAX_TARGET_REFS {
        report.error(
            &spec.field("targetRefs"),
            format!("at most {MAX_TARGET_REFS} targetRefs may be set"),
        );
    }
    for (i, target) in targets.iter().enumerate() {
        target_ref(target, &spec.field("targetRefs").index(i), report);
    }
}

/// What a policy may attach to: (group, version, kind), the core group written `core` or empty.
/// The version is not compared; messages name it as istiod does.
const TARGET_KINDS: [(&str, &str, &str); 4] = [
    ("core", "v1", "Service"),
    ("networking.istio.io", "v1", "ServiceEntry"),
    ("gateway.networking.k8s.io", "v1", "Gateway"),
    ("gateway.networking.k8s.io", "v1", "GatewayClass"),
];

/// A `targetRef`: named, in the policy's own namespace, of a kind a policy attaches to.
fn target_ref(target: &PolicyTargetReference, at: &Path, report: &mut Report) {
    // The CRDs' caps.
    for (field, value, max) in [
        ("group", &target.group, 253),
        ("kind", &target.kind, 63),
        ("name", &target.name, 253),
    ] {
        if value.len() > max {
            report.error(&at.field(field), format!("at most {max} characters"));
        }
    }
    if target.name.is_empty() {
        report.error(&at.field("name"), "targetRef name must be set");
    }
    if !target.namespace.is_empty() {
        report.error(
            &at.field("namespace"),
            "targetRef namespace must not be set; cross namespace referencing is not supported",
        );
    }
    let group = if target.group.is_empty() {
        "core"
    } else {
        target.group.as_str()
    };
    if !TARGET_KINDS
        .iter()
        .any(|(g, _, k)| (*g, *k) == (group, target.kind.as_str()))
    {
        let allowed: Vec<String> = TARGET_KINDS
            .iter()
            .map(|(g, v, k)| format!("{g}/{v}/{k}"))
            .collect();
        report.error(
            &at.field("kind"),
            format!(
                "targetRef must be to one of [{}] but was {}/{}",
                allowed.join(" "),
                target.group,
                target.kind
            ),
        );
    }
}

/// A string enum field the CRD limits to `allowed` (absent is fine).
pub fn validate_enum(at: &Path, value: Option<&str>, allowed: &[&str], report: &mut Report) {
    if let Some(value) = value
        && !allowed.contains(&value)
    {
        report.error(
            at,
            format!("{value:?} is not one of {}", allowed.join(", ")),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_domains() {
        for ok in [
            "*",
            "*.example.com",
            "*-foo.example.com",
            "*foo.bar",
            "foo.bar",
            "istio.io.",
        ] {
            assert_eq!(validate_wildcard_domain(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "foo.*.com",
            "**.com",
            "foo..com",
            "a.123",
            "-a.com",
            "a_b.com",
        ] {
            assert!(validate_wildcard_domain(bad).is_err(), "{bad}");
        }
        assert!(validate_fqdn("*.example.com").is_err());
        assert!(validate_fqdn(&"a".repeat(256)).is_err());
    }

    #[test]
    fn namespace_slash_hosts() {
        assert!(validate_namespace_slash_wildcard_hostname("*/*", false).is_empty());
        assert!(validate_namespace_slash_wildcard_hostname("./foo.com", false).is_empty());
        assert!(validate_namespace_slash_wildcard_hostname("~ns/foo.com", false).is_empty());
        assert!(!validate_namespace_slash_wildcard_hostname("foo.com", false).is_empty());
        assert!(!validate_namespace_slash_wildcard_hostname("ns/foo", false).is_empty());
        assert!(validate_namespace_slash_wildcard_hostname("foo.com", true).is_empty());
        assert!(validate_namespace_slash_wildcard_hostname("10.0.0.1", true).is_empty());
        assert!(!validate_namespace_slash_wildcard_hostname("ns/*.foo*.com", true).is_empty());
    }

    #[test]
    fn durations_and_subnets() {
        assert!(validate_duration(&Duration::parse("0.001s").unwrap()).is_ok());
        assert!(validate_duration(&Duration::parse("0.0001s").unwrap()).is_err());
        assert!(validate_duration(&Duration::parse("1.0005s").unwrap()).is_err());
        assert!(validate_duration(&Duration::parse("-1s").unwrap()).is_err());
        assert!(validate_ip_subnet("10.0.0.0/8").is_ok());
        assert!(validate_ip_subnet("2001:db8::/32").is_ok());
        assert!(validate_ip_subnet("10.0.0.0/33").is_err());
        assert!(validate_ip_subnet("10.0.0.0/08").is_err());
        assert!(validate_ip_subnet("0.0.0.0/0").is_ok());
        assert!(validate_ip_address("fe80::1%eth0").is_ok());
        assert!(validate_ip_address("10.0.0.1%eth0").is_err());
        assert!(validate_duration(&Duration::parse("10000000000s").unwrap()).is_err());
        assert!(validate_ip_subnet("10.0.0.0/").is_err());
        assert!(validate_ip_subnet("foo").is_err());
    }

    #[test]
    fn export_to() {
        let run = |list: &[&str], rules| {
            let mut r = Report::default();
            let list: Vec<String> = list.iter().map(|s| s.to_string()).collect();
            validate_export_to(&Path::spec().field("exportTo"), "ns", &list, rules, &mut r);
            r.errors
        };
        let plain = ExportToRules::default();
        let se = ExportToRules {
            is_service_entry: true,
            ..Default::default()
        };
        assert!(run(&[".", "other"], plain).is_empty());
        assert!(!run(&[".", "ns"], plain).is_empty());
        assert!(!run(&["*", "other"], plain).is_empty());
        assert!(!run(&["~"], plain).is_empty());
        assert!(run(&["~"], se).is_empty());
        assert!(!run(&["~", "a"], se).is_empty());
        assert_eq!(run(&["Bad_Name"], plain)[0].field, "spec.exportTo[0]");
    }

    #[test]
    fn label_keys() {
        assert!(validate_label_key("app").is_ok());
        assert!(validate_label_key("example.com/app").is_ok());
        assert!(validate_label_key("-app").is_err());
        assert!(validate_label_key("/app").is_err());
        assert!(validate_label_value("").is_ok());
        assert!(validate_label_value("v1.2_3").is_ok());
        assert!(validate_label_value("v1 ").is_err());
    }
}
