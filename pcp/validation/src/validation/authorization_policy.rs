//! Validation of `AuthorizationPolicy` (`security.istio.io`), following istiod's webhook: what a
//! policy attaches to, the CUSTOM and DENY actions' requirements, each rule's sources, operations
//! and conditions, and the warning for a DENY rule of HTTP attributes only (which denies all TCP
//! traffic in its scope).

use pasa_istio::authorization_policy::{Action, AuthorizationPolicy, Operation, Rule, Source};
use pasa_proto::Object;

use super::common::attachment;
use super::{Path, Report, parse};

use pasa_istio::authorization_policy::{DRY_RUN_ANNOTATION as DRY_RUN, go_bool};

/// Checks one AuthorizationPolicy.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(policy) = parse::<AuthorizationPolicy>(obj, report) else {
        return;
    };
    let spec = Path::spec();
    dry_run(obj, policy.action, report);
    attachment(
        policy.selector.as_ref(),
        policy.target_ref.as_ref(),
        &policy.target_refs,
        &spec,
        report,
    );
    let action = action_name(policy.action);
    if policy.action == Action::Custom {
        custom(&policy, &spec, report);
    } else if policy.provider.is_some() {
        report.error(
            &spec.field("provider"),
            format!("`provider` must not be with non CUSTOM action, found {action}"),
        );
    }
    if policy.action == Action::Deny && policy.rules.is_none() {
        report.error(
            &spec.field("rules"),
            "DENY action without `rules` is meaningless as it will never be triggered, add an \
             empty rule `{}` if you want it be triggered for every request",
        );
    }
    for (i, rule) in policy.rules.iter().flatten().enumerate() {
        let at = spec.field("rules").index(i);
        match rule {
            None => report.error(&at, format!("`rule` must not be nil, found at rule {i}")),
            Some(rule) => validate_rule(rule, i, &at, policy.action, report),
        }
    }
}

fn action_name(action: Action) -> &'static str {
    match action {
        Action::Allow => "ALLOW",
        Action::Deny => "DENY",
        Action::Audit => "AUDIT",
        Action::Custom => "CUSTOM",
    }
}

/// `istio.io/dry-run`: only for ALLOW and DENY, and a boolean as Go reads one.
fn dry_run(obj: &Object, action: Action, report: &mut Report) {
    let Some(value) = obj.annotations.get(DRY_RUN) else {
        return;
    };
    let at = Path::root("metadata").field("annotations").key(DRY_RUN);
    match action {
        Action::Allow | Action::Deny => {
            if go_bool(value).is_none() {
                report.error(
                    &at,
                    format!(
                        "{}/{} has annotation {DRY_RUN} with invalid value ({value}): not a boolean",
                        obj.namespace, obj.name
                    ),
                );
            }
        }
        Action::Audit | Action::Custom => report.error(
            &at,
            format!(
                "the annotation {DRY_RUN} currently only supports action ALLOW/DENY, found action \
                 {} in {}/{}",
                action_name(action),
                obj.namespace,
                obj.name
            ),
        ),
    }
}

/// A CUSTOM policy delegates to an extension provider, and matches only on what the provider
/// can be told.
fn custom(policy: &AuthorizationPolicy, spec: &Path, report: &mut Report) {
    let Some(rules) = &policy.rules else {
        report.error(
            &spec.field("rules"),
            "CUSTOM action without `rules` is meaningless as it will never be triggered, add an \
             empty rule `{}` if you want it be triggered for every request",
        );
        return;
    };
    if policy.provider.as_ref().is_none_or(|p| p.name.is_empty()) {
        report.error(
            &spec.field("provider").field("name"),
            "`provider.name` must not be empty",
        );
    }
    const NOT_WITH_CUSTOM: [&str; 10] = [
        "namespaces",
        "notNamespaces",
        "serviceAccounts",
        "notServiceAccounts",
        "trustDomains",
        "notTrustDomains",
        "principals",
        "notPrincipals",
        "requestPrincipals",
        "notRequestPrincipals",
    ];
    for (i, rule) in rules.iter().enumerate() {
        let Some(rule) = rule else { continue };
        let at = spec.field("rules").index(i);
        for (j, from) in rule.from.iter().flatten().enumerate() {
            let Some(source) = from.as_ref().and_then(|f| f.source.as_ref()) else {
                continue;
            };
            let src = at.field("from").index(j).field("source");
            for (name, list) in source.lists() {
                if NOT_WITH_CUSTOM.contains(&name) && list.is_some_and(|l| !l.is_empty()) {
                    report.error(
                        &src.field(name),
                        format!(
                            "From.{} is currently not supported with CUSTOM action",
                            title(name)
                        ),
                    );
                }
            }
        }
        for (j, when) in rule.when.iter().flatten().enumerate() {
            let here = at.field("when").index(j);
            let Some(when) = when else {
                report.error(&here, "when field cannot be nil");
                continue;
            };
            let key = when.key.as_str();
            if matches!(
                key,
                "source.namespace"
                    | "source.serviceAccount"
                    | "source.trustDomain"
                    | "source.principal"
            ) || key.starts_with("request.auth.")
            {
                report.error(
                    &here.field("key"),
                    format!("{key} is currently not supported with CUSTOM action"),
                );
            }
        }
    }
}

/// `notPrincipals` → `NotPrincipals`, as istiod names the fields in its messages.
fn title(name: &str) -> String {
    let mut chars = name.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

fn validate_rule(rule: &Rule, i: usize, at: &Path, action: Action, report: &mut Report) {
    let mut from_exists = false;
    let mut tcp_in_from = false;
    if rule.from.as_ref().is_some_and(Vec::is_empty) {
        report.error(
            &at.field("from"),
            format!("`from` must not be empty, found at rule {i}"),
        );
    }
    for (j, from) in rule.from.iter().flatten().enumerate() {
        let here = at.field("from").index(j);
        let Some(from) = from else {
            report.error(&here, format!("`from` must not be nil, found at rule {i}"));
            continue;
        };
        let Some(source) = &from.source else {
            report.error(
                &here.field("source"),
                format!("`from.source` must not be nil, found at rule {i}"),
            );
            continue;
        };
        from_exists = true;
        tcp_in_from |= validate_source(source, i, &here.field("source"), report);
    }

    let mut to_exists = false;
    let mut tcp_in_to = false;
    if rule.to.as_ref().is_some_and(Vec::is_empty) {
        report.error(
            &at.field("to"),
            format!("`to` must not be empty, found at rule {i}"),
        );
    }
    for (j, to) in rule.to.iter().flatten().enumerate() {
        let here = at.field("to").index(j);
        let Some(to) = to else {
            report.error(&here, format!("`to` must not be nil, found at rule {i}"));
            continue;
        };
        let Some(operation) = &to.operation else {
            report.error(
                &here.field("operation"),
                format!("`to.operation` must not be nil, found at rule {i}"),
            );
            continue;
        };
        to_exists = true;
        tcp_in_to |= validate_operation(operation, i, &here.field("operation"), report);
    }

    for (j, condition) in rule.when.iter().flatten().enumerate() {
        let here = at.field("when").index(j);
        let (key, values, not_values) = match condition {
            Some(c) => (c.key.as_str(), c.values.as_deref(), c.not_values.as_deref()),
            None => ("", None, None),
        };
        if key.is_empty() {
            report.error(&here.field("key"), "`key` must not be empty");
            continue;
        }
        let values = values.unwrap_or_default();
        let not_values = not_values.unwrap_or_default();
        if values.is_empty() && not_values.is_empty() {
            report.error(
                &here,
                format!("at least one of `values` or `notValues` must be set for key {key}"),
            );
            continue;
        }
        if let Err(e) = validate_attribute(key, values) {
            report.error(
                &here.field("values"),
                format!("invalid `value` for `key` {key}: {e}"),
            );
        }
        if let Err(e) = validate_attribute(key, not_values) {
            report.error(
                &here.field("notValues"),
                format!("invalid `notValue` for `key` {key}: {e}"),
            );
        }
    }

    if action == Action::Deny
        && ((from_exists && !to_exists && !tcp_in_from) || (to_exists && !tcp_in_to))
    {
        report.warn(
            at,
            "configured AuthorizationPolicy will deny all traffic to TCP ports under its scope \
             due to the use of only HTTP attributes in a DENY rule; it is recommended to \
             explicitly specify the port",
        );
    }
}

/// Checks a source; returns whether it names anything a TCP connection carries (so a DENY
/// rule with it does not deny all TCP traffic).
fn validate_source(source: &Source, i: usize, at: &Path, report: &mut Report) -> bool {
    let len = |l: &Option<Vec<String>>| l.as_ref().map_or(0, Vec::len);
    let identities = len(&source.principals)
        + len(&source.not_principals)
        + len(&source.namespaces)
        + len(&source.not_namespaces);
    let accounts = len(&source.service_accounts) + len(&source.not_service_accounts);
    if identities > 0 && accounts > 0 {
        report.error(
            at,
            format!("cannot set serviceAccounts with namespaces or principals, found at rule {i}"),
        );
    }
    if source
        .lists()
        .iter()
        .all(|(_, l)| l.is_none_or(Vec::is_empty))
    {
        report.error(
            at,
            format!("`from.source` must not be empty, found at rule {i}"),
        );
    }
    for (name, list) in source.lists() {
        let Some(list) = list else { continue };
        let here = at.field(name);
        let checked = match name {
            "ipBlocks" | "notIpBlocks" | "remoteIpBlocks" | "notRemoteIpBlocks" => {
                validate_ips(list).and_then(|()| no_empty_values(name, list))
            }
            "serviceAccounts" | "notServiceAccounts" => service_accounts(name, list),
            "trustDomains" | "notTrustDomains" => trust_domains(name, list),
            _ => no_empty_values(name, list),
        };
        report.check(&here, checked);
    }
    [
        &source.principals,
        &source.not_principals,
        &source.ip_blocks,
        &source.not_ip_blocks,
        &source.namespaces,
        &source.not_namespaces,
        &source.remote_ip_blocks,
        &source.not_remote_ip_blocks,
        &source.service_accounts,
        &source.not_service_accounts,
    ]
    .iter()
    .any(|l| l.is_some())
}

/// Checks an operation; returns whether it names ports (which a TCP connection carries).
fn validate_operation(operation: &Operation, i: usize, at: &Path, report: &mut Report) -> bool {
    if operation
        .lists()
        .iter()
        .all(|(_, l)| l.is_none_or(Vec::is_empty))
    {
        report.error(
            at,
            format!("`to.operation` must not be empty, found at rule {i}"),
        );
    }
    for (name, list) in operation.lists() {
        let Some(list) = list else { continue };
        let checked = match name {
            "ports" | "notPorts" => validate_ports(list).and_then(|()| no_empty_values(name, list)),
            "paths" | "notPaths" => {
                no_empty_values(name, list).and_then(|()| path_templates(name, list))
            }
            _ => no_empty_values(name, list),
        };
        report.check(&at.field(name), checked);
    }
    operation.ports.is_some() || operation.not_ports.is_some()
}

fn no_empty_values(name: &str, values: &[String]) -> Result<(), String> {
    if values.iter().any(String::is_empty) {
        return Err(format!("empty value not allowed, found in {}", title(name)));
    }
    Ok(())
}

/// Values that may hold one `*`, at the start or the end only (or be just `*`).
fn wildcard_values(name: &str, values: &[String]) -> Result<(), String> {
    no_empty_values(name, values)?;
    for value in values {
        let stars = value.matches('*').count();
        if stars > 1 {
            return Err(format!(
                "at most one wildcard is allowed, found in {name}: {value:?}"
            ));
        }
        if stars == 1 && value != "*" && !value.starts_with('*') && !value.ends_with('*') {
            return Err(format!(
                "wildcard is only allowed at the start or end, found in {name}: {value:?}"
            ));
        }
    }
    Ok(())
}

fn trust_domains(name: &str, values: &[String]) -> Result<(), String> {
    wildcard_values(name, values)?;
    if let Some(value) = values.iter().find(|v| v.contains('/')) {
        return Err(format!(
            "trust domain must not contain '/', found in {name}: {value:?}"
        ));
    }
    Ok(())
}

/// `serviceAccount` or `namespace/serviceAccount`, at most 16 of them, no wildcard.
fn service_accounts(name: &str, values: &[String]) -> Result<(), String> {
    const FORMAT: &str = "expected format 'serviceAccount' or 'namespace/serviceAccount'";
    if values.len() > 16 {
        return Err("may not have more than 16 values".into());
    }
    for value in values {
        if value.is_empty() {
            return Err(format!("empty value not allowed, found in {name}"));
        }
        if value.contains('*') {
            return Err(format!("wildcard not allowed, found in {name}"));
        }
        if value.matches('/').count() > 1 {
            return Err(format!("{FORMAT}, found {value:?} in {name}"));
        }
        if value.len() > 320 {
            return Err(format!(
                "value cannot exceed 320 characters, found {value:?} in {name}"
            ));
        }
        if let Some((ns, sa)) = value.split_once('/') {
            if ns.is_empty() {
                return Err(format!(
                    "{FORMAT}, found empty namespace {value:?} in {name}"
                ));
            }
            if sa.is_empty() {
                return Err(format!(
                    "{FORMAT}, found empty serviceAccount {value:?} in {name}"
                ));
            }
        }
    }
    Ok(())
}

/// IP addresses and CIDR ranges, as Go's `netip` reads them.
fn validate_ips(values: &[String]) -> Result<(), String> {
    let mut bad = Vec::new();
    for value in values {
        match value.split_once('/') {
            Some((addr, bits)) => {
                let max = match addr.parse::<std::net::IpAddr>() {
                    Ok(std::net::IpAddr::V4(_)) => Some(32),
                    Ok(std::net::IpAddr::V6(_)) => Some(128),
                    Err(_) => None,
                };
                let bits_ok = !bits.is_empty()
                    && bits.bytes().all(|b| b.is_ascii_digit())
                    && (bits == "0" || !bits.starts_with('0'))
                    && bits
                        .parse::<u32>()
                        .is_ok_and(|b| max.is_some_and(|m| b <= m));
                if max.is_none() || !bits_ok {
                    bad.push(format!("bad CIDR range ({value})"));
                }
            }
            None => {
                if value.parse::<std::net::IpAddr>().is_err() {
                    bad.push(format!("bad IP address ({value})"));
                }
            }
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join("; "))
    }
}

/// Port numbers in 0..=65535, written in decimal digits.
fn validate_ports(values: &[String]) -> Result<(), String> {
    let bad: Vec<String> = values
        .iter()
        .filter(|p| {
            p.is_empty()
                || !p.bytes().all(|b| b.is_ascii_digit())
                || p.parse::<u64>().map_or(true, |n| n > 65535)
        })
        .map(|p| format!("bad port ({p})"))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join("; "))
    }
}

/// Paths with Envoy's URI templates: `{*}` is one segment, `{**}` any number and only last;
/// with a template, every other segment must be a plain literal.
fn path_templates(name: &str, paths: &[String]) -> Result<(), String> {
    const ONE: &str = "{*}";
    const ANY: &str = "{**}";
    let literal = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~%!$&'()+,;:@=".contains(&b))
    };
    for path in paths {
        let templated = path.contains(ONE) || path.contains(ANY);
        let trimmed = path.trim_matches('/');
        let mut seen_any = false;
        for glob in trimmed.split('/') {
            if (glob == ONE || glob == ANY) && !seen_any {
                seen_any = glob == ANY;
                continue;
            }
            if glob == ONE || glob == ANY {
                return Err(format!(
                    "invalid or unsupported path {trimmed}, found in {name}. {{**}} is not the last operator"
                ));
            }
            if glob.contains(['{', '}']) {
                return Err(format!(
                    "invalid or unsupported path {trimmed}, found in {name}. Contains '{{' or '}}' beyond a supported path template"
                ));
            }
            if templated && !literal(glob) {
                return Err(format!(
                    "invalid or unsupported path {trimmed}, found in {name}. Contains segment {glob} with invalid string literal"
                ));
            }
        }
    }
    Ok(())
}

/// A condition's key, and its values where the key says what they must be.
fn validate_attribute(key: &str, values: &[String]) -> Result<(), String> {
    if values.iter().any(String::is_empty) {
        return Err(format!("empty value not allowed, found in {key}"));
    }
    let map_key = |key: &str| -> Result<(), String> {
        match key.find('[') {
            Some(open) if key.ends_with(']') && open > 0 && open < key.len() - 2 => Ok(()),
            _ => Err(format!("bad key ({key}): should have format a[b]")),
        }
    };
    match key {
        _ if key.starts_with("request.headers") => map_key(key),
        "source.ip" | "remote.ip" | "destination.ip" => validate_ips(values),
        "source.namespace"
        | "source.principal"
        | "request.auth.principal"
        | "request.auth.audiences"
        | "request.auth.presenter"
        | "connection.sni" => Ok(()),
        "source.serviceAccount" => service_accounts(key, values),
        "source.trustDomain" => wildcard_values(key, values),
        _ if key.starts_with("request.auth.claims") => map_key(key),
        "destination.port" => validate_ports(values),
        _ if key.starts_with("experimental.envoy.filters.") => map_key(key),
        "destination.namespace" => Err(format!(
            "attribute {key} is replaced by the metadata.namespace"
        )),
        _ if key.starts_with("destination.labels") => Err(format!(
            "attribute {key} is replaced by the workload selector"
        )),
        "destination.name" | "destination.user" => Err(format!(
            "deprecated attribute {key}: only supported in v1alpha1"
        )),
        _ => Err(format!("unknown attribute: {key}")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    fn check(spec: serde_json::Value) -> crate::validation::Report {
        crate::validation::check_security("AuthorizationPolicy", spec)
    }

    #[test]
    fn errors_name_the_field() {
        let r = check(json!({"rules": [{"from": [{"source": {"ipBlocks": ["1.2.3.4/40"]}}]}]}));
        assert_eq!(
            r.errors[0].field, "spec.rules[0].from[0].source.ipBlocks",
            "{r:?}"
        );
        assert!(r.errors[0].message.contains("bad CIDR range"));
        let r = check(json!({"rules": [{"to": [{"operation": {"ports": ["http"]}}]}]}));
        assert_eq!(r.errors[0].field, "spec.rules[0].to[0].operation.ports");
        let r = check(json!({"rules": [{"when": [{"key": "source.nope", "values": ["x"]}]}]}));
        assert_eq!(r.errors[0].field, "spec.rules[0].when[0].values");
        assert!(r.errors[0].message.contains("unknown attribute"));
        let r = check(json!({"action": "CUSTOM", "rules": [{}]}));
        assert_eq!(r.errors[0].field, "spec.provider.name");
    }

    #[test]
    fn path_templates_follow_envoys_rules() {
        for (path, ok) in [
            ("/foo/{*}/bar", true),
            ("/foo/{**}", true),
            ("/foo/{**}/{*}", false),
            ("/foo/{*}/b*r", false),
            ("/foo/b{a}r", false),
            ("/foo/*", true),
        ] {
            let r = check(json!({"rules": [{"to": [{"operation": {"paths": [path]}}]}]}));
            assert_eq!(r.is_valid(), ok, "{path}: {r:?}");
        }
    }
}
