//! Rules: the rules of HTTPRoutes, GRPCRoutes, TCPRoutes and TLSRoutes as VirtualService routes
//! (matches, filters, retries, timeouts; backends in [`super::backends`]), in the Gateway API's
//! order.

use serde_json::{Value, json};

use super::backends::{destination, destinations};
use super::types::{
    BackendRef, Cors, Filter, GrpcMatch, GrpcRule, HeaderFilter, HttpMatch, HttpRule, Mirror,
    Redirect, Rewrite, Route, StreamRule,
};
use super::{ConfigError, Input, Settings, prune};

/// The routes a route's rules become, and the error to report; after a hard error there are
/// none.
#[derive(Debug, Default)]
pub(super) struct Converted {
    pub routes: Vec<Value>,
    pub error: Option<ConfigError>,
}

impl Converted {
    fn push(&mut self, result: Result<(Value, Option<ConfigError>), ConfigError>) -> bool {
        match result {
            Ok((route, error)) => {
                self.routes.push(route);
                if error.is_some() {
                    self.error = error;
                }
                true
            }
            Err(e) => {
                *self = Converted {
                    routes: Vec::new(),
                    error: Some(e),
                };
                false
            }
        }
    }
}

pub(super) fn hard(reason: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        reason,
        message: message.into(),
    }
}

/// Rules split so that each has at most one match (in order; a rule without matches once),
/// each converted by `convert` with the rule's position; a hard error ends it with no routes.
fn split<R, M>(
    rules: &[R],
    matches: impl Fn(&R) -> &[M],
    mut convert: impl FnMut(&R, Option<&M>, usize) -> Result<(Value, Option<ConfigError>), ConfigError>,
) -> Converted {
    let mut out = Converted::default();
    for (n, rule) in rules.iter().enumerate() {
        let all = matches(rule);
        let each: Vec<Option<&M>> = if all.is_empty() {
            vec![None]
        } else {
            all.iter().map(Some).collect()
        };
        for m in each {
            if !out.push(convert(rule, m, n)) {
                return out;
            }
        }
    }
    out
}

/// An HTTPRoute's rules, each split so that it has at most one match.
pub(super) fn http(
    settings: &Settings,
    input: &Input,
    route: &Route<HttpRule>,
    enforce_grants: bool,
) -> Converted {
    split(
        &route.spec.rules,
        |r| &r.matches,
        |rule, m, n| http_rule(settings, input, route, rule, m, n, enforce_grants),
    )
}

fn route_name(rule_name: &Option<String>, route: &super::types::Meta, n: usize) -> String {
    rule_name
        .clone()
        .unwrap_or_else(|| format!("{}.{}.{n}", route.namespace, route.name))
}

fn http_rule(
    settings: &Settings,
    input: &Input,
    route: &Route<HttpRule>,
    rule: &HttpRule,
    m: Option<&HttpMatch>,
    n: usize,
    enforce_grants: bool,
) -> Result<(Value, Option<ConfigError>), ConfigError> {
    let meta = &route.metadata;
    let mut out = serde_json::Map::new();
    out.insert("name".into(), route_name(&rule.name, meta, n).into());
    if let Some(m) = m {
        let kind = m
            .path
            .as_ref()
            .and_then(|p| p.kind.clone())
            .unwrap_or_else(|| "PathPrefix".into());
        let mut value = m
            .path
            .as_ref()
            .and_then(|p| p.value.clone())
            .unwrap_or_else(|| "/".into());
        let uri = match kind.as_str() {
            "PathPrefix" => {
                if value != "/" {
                    value = value.strip_suffix('/').unwrap_or(&value).to_string();
                }
                json!({"prefix": value})
            }
            "Exact" => json!({"exact": value}),
            "RegularExpression" => json!({"regex": value}),
            other => {
                return Err(hard(
                    "InvalidConfiguration",
                    format!("unknown type: {other:?} is not supported Path match type"),
                ));
            }
        };
        out.insert(
            "match".into(),
            prune(json!([{
                "uri": uri,
                "headers": value_matches(&m.headers, "HeaderMatch")?,
                "queryParams": value_matches(&m.query_params, "QueryParams")?,
                "method": m.method.as_ref().map(|x| json!({"exact": x})),
            }])),
        );
    }
    let mut mirror_error = None;
    for f in &rule.filters {
        match f.kind.as_str() {
            "RequestHeaderModifier" | "ResponseHeaderModifier" => {
                header_filter(&mut out, f)?;
            }
            "RequestRedirect" => {
                if let Some(r) = &f.request_redirect {
                    out.insert("redirect".into(), redirect(r));
                }
            }
            "RequestMirror" => {
                match mirror(settings, input, f, meta, enforce_grants, "HTTPRoute") {
                    Ok(Some(m)) => push(&mut out, "mirrors", m),
                    Ok(None) => {}
                    Err(e) => mirror_error = Some(e),
                }
            }
            "URLRewrite" => {
                if let Some(r) = f.url_rewrite.as_ref().and_then(rewrite) {
                    out.insert("rewrite".into(), r);
                }
            }
            "CORS" => {
                if let Some(c) = &f.cors {
                    out.insert("corsPolicy".into(), cors(c));
                }
            }
            other => {
                return Err(hard(
                    "InvalidFilter",
                    format!("unsupported filter type {other:?}"),
                ));
            }
        }
    }
    if let Some(retry) = &rule.retry {
        let mut retry_on = [
            "connect-failure",
            "refused-stream",
            "unavailable",
            "cancelled",
        ]
        .map(String::from)
        .to_vec();
        retry_on.extend(retry.codes.iter().map(u32::to_string));
        let attempts = retry.attempts.unwrap_or(2);
        let mut r = json!({"attempts": attempts, "retryOn": retry_on.join(",")});
        if attempts == 0 {
            r = json!({});
        }
        if let Some(backoff) = &retry.backoff {
            r["backoff"] = duration(backoff).into();
        }
        out.insert("retries".into(), r);
    }
    if let Some(t) = &rule.timeouts {
        if let Some(d) = t.request.as_deref().map(duration).filter(|d| d != "0s") {
            out.insert("timeout".into(), d.into());
        }
        if let Some(d) = t
            .backend_request
            .as_deref()
            .map(duration)
            .filter(|d| d != "0s")
        {
            match out.get_mut("retries") {
                Some(r) => r["perTryTimeout"] = d.into(),
                None => {
                    out.insert("timeout".into(), d.into());
                }
            }
        }
    }
    let error = route_to(
        &mut out,
        settings,
        input,
        &rule.backend_refs,
        meta,
        enforce_grants,
        "HTTPRoute",
    )?;
    Ok((Value::Object(out), join(error, mirror_error)))
}

/// A route's backends into `out`: its destinations, or (without a redirect) a 500 when no
/// backend has a weight, as the Gateway API requires. The error of a backend left unusable.
fn route_to(
    out: &mut serde_json::Map<String, Value>,
    settings: &Settings,
    input: &Input,
    backends: &[BackendRef],
    meta: &super::types::Meta,
    enforce_grants: bool,
    kind: &str,
) -> Result<Option<ConfigError>, ConfigError> {
    if weight_sum(backends) == 0 && !out.contains_key("redirect") {
        out.insert("directResponse".into(), json!({"status": 500}));
        return Ok(None);
    }
    let (destinations, error) =
        destinations(settings, input, backends, meta, enforce_grants, kind)?;
    if let Some(d) = destinations {
        out.insert("route".into(), d);
    }
    Ok(error)
}

fn join(a: Option<ConfigError>, b: Option<ConfigError>) -> Option<ConfigError> {
    match (a, b) {
        (Some(mut a), Some(b)) => {
            a.message = format!("{}; {}", a.message, b.message);
            Some(a)
        }
        (a, b) => a.or(b),
    }
}

fn push(out: &mut serde_json::Map<String, Value>, key: &str, v: Value) {
    match out.get_mut(key).and_then(Value::as_array_mut) {
        Some(list) => list.push(v),
        None => {
            out.insert(key.into(), json!([v]));
        }
    }
}

/// A Go duration (`1ms`) in protobuf JSON (`0.001s`); unreadable ones read as zero, as istiod
/// reads them.
fn duration(text: &str) -> String {
    pasa_proto::duration::protobuf_json(pasa_proto::duration::parse_go(text).unwrap_or(0.0))
}

/// Header or query-parameter matches, by name.
fn value_matches(
    list: &[super::types::ValueMatch],
    what: &str,
) -> Result<Option<Value>, ConfigError> {
    let mut out = serde_json::Map::new();
    for h in list {
        let m = match h.kind.as_deref().unwrap_or("Exact") {
            "Exact" => json!({"exact": h.value}),
            "RegularExpression" => json!({"regex": h.value}),
            other => {
                return Err(hard(
                    "InvalidConfiguration",
                    format!("unknown type: {other:?} is not supported {what} type"),
                ));
            }
        };
        out.insert(h.name.clone(), m);
    }
    Ok((!out.is_empty()).then_some(Value::Object(out)))
}

/// A request or response header modifier into `headers`.
pub(super) fn header_filter(
    out: &mut serde_json::Map<String, Value>,
    f: &Filter,
) -> Result<(), ConfigError> {
    let (side, filter) = if f.kind == "RequestHeaderModifier" {
        ("request", &f.request_header_modifier)
    } else {
        ("response", &f.response_header_modifier)
    };
    let Some(ops) = header_operations(filter.as_ref())? else {
        return Ok(());
    };
    let headers = out.entry("headers").or_insert_with(|| json!({}));
    headers[side] = ops;
    Ok(())
}

fn header_operations(filter: Option<&HeaderFilter>) -> Result<Option<Value>, ConfigError> {
    let Some(f) = filter else { return Ok(None) };
    for h in f.set.iter().chain(&f.add) {
        if h.value
            .bytes()
            .any(|c| (c < 0x20 && c != 0x09) || c == 0x7f)
        {
            return Err(hard(
                "InvalidFilter",
                format!("header {:?} value contains invalid characters", h.name),
            ));
        }
    }
    let to_map = |list: &[super::types::Header]| -> Option<Value> {
        let mut m = serde_json::Map::new();
        for h in list {
            m.entry(h.name.to_lowercase())
                .or_insert_with(|| h.value.clone().into());
        }
        (!m.is_empty()).then_some(Value::Object(m))
    };
    Ok(Some(prune(json!({
        "add": to_map(&f.add),
        "set": to_map(&f.set),
        "remove": (!f.remove.is_empty()).then(|| f.remove.clone()),
    }))))
}

fn redirect(r: &Redirect) -> Value {
    let mut out = json!({
        "redirectCode": r.status_code,
        "authority": r.hostname,
        "scheme": r.scheme,
    });
    match r.port {
        Some(p) => out["port"] = p.into(),
        None if r.scheme.is_some() => out["derivePort"] = "FROM_PROTOCOL_DEFAULT".into(),
        None => out["derivePort"] = "FROM_REQUEST_PORT".into(),
    }
    if let Some(p) = &r.path {
        match p.kind.as_str() {
            "ReplaceFullPath" => out["uri"] = p.replace_full_path.clone().into(),
            "ReplacePrefixMatch" => out["prefixRewrite"] = p.replace_prefix_match.clone().into(),
            _ => {}
        }
    }
    prune(out)
}

fn rewrite(r: &Rewrite) -> Option<Value> {
    let mut out = json!({"authority": r.hostname});
    if let Some(p) = &r.path {
        match p.kind.as_str() {
            "ReplacePrefixMatch" => {
                let prefix = p.replace_prefix_match.clone().unwrap_or_default();
                let uri = prefix.strip_suffix('/').unwrap_or(&prefix);
                out["uri"] = if uri.is_empty() { "/" } else { uri }.into();
            }
            "ReplaceFullPath" => {
                out["uriRegexRewrite"] = json!({"match": "/.*", "rewrite": p.replace_full_path.clone().unwrap_or_default()});
            }
            _ => {}
        }
    }
    let out = prune(out);
    (out.as_object().is_some_and(|o| !o.is_empty())).then_some(out)
}

fn cors(c: &Cors) -> Value {
    let mut origins = Vec::new();
    for o in c.allow_origins.iter().filter(|o| !o.is_empty()) {
        let stars = o.matches('*').count();
        origins.push(if o == "*" {
            json!({"regex": r"^[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s?#]+$"})
        } else if stars == 0 {
            json!({"exact": o})
        } else if stars == 1 && o.ends_with('*') {
            json!({"prefix": o.trim_end_matches('*')})
        } else {
            json!({"regex": format!("^{}$", pasa_istio::regex::quote_meta(o).replace(r"\*", ".*"))})
        });
    }
    let non_empty = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
    prune(json!({
        "allowOrigins": (!origins.is_empty()).then_some(origins),
        "allowCredentials": c.allow_credentials.filter(|a| *a),
        "allowMethods": non_empty(&c.allow_methods),
        "allowHeaders": non_empty(&c.allow_headers),
        "exposeHeaders": non_empty(&c.expose_headers),
        "maxAge": (c.max_age > 0).then(|| format!("{}s", c.max_age)),
        "unmatchedPreflights": "IGNORE",
    }))
}

fn mirror(
    settings: &Settings,
    input: &Input,
    f: &Filter,
    meta: &super::types::Meta,
    enforce_grants: bool,
    kind: &str,
) -> Result<Option<Value>, ConfigError> {
    let Some(Mirror {
        backend_ref,
        percent,
        fraction,
    }) = &f.request_mirror
    else {
        return Ok(None);
    };
    let (destination, error) =
        destination(settings, input, backend_ref, meta, enforce_grants, kind)?;
    if let Some(e) = error {
        return Err(e);
    }
    let percentage = match (fraction, percent) {
        (Some(f), _) => Some(100.0 * f.numerator as f64 / f.denominator.unwrap_or(100) as f64),
        (None, Some(p)) => Some(*p as f64),
        _ => None,
    };
    Ok(Some(prune(json!({
        "destination": destination,
        "percentage": percentage.map(|v| json!({"value": number(v)})),
    }))))
}

/// A float as JSON, whole numbers as integers (as YAML writes them).
fn number(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        (v as i64).into()
    } else {
        v.into()
    }
}

fn weight_sum(backends: &[BackendRef]) -> i64 {
    backends.iter().map(|b| b.weight.unwrap_or(1)).sum()
}

/// A GRPCRoute's rules, each split so that it has at most one match.
pub(super) fn grpc(
    settings: &Settings,
    input: &Input,
    route: &Route<GrpcRule>,
    enforce_grants: bool,
) -> Converted {
    split(
        &route.spec.rules,
        |r| &r.matches,
        |rule, m, n| grpc_rule(settings, input, route, rule, m, n, enforce_grants),
    )
}

fn grpc_rule(
    settings: &Settings,
    input: &Input,
    route: &Route<GrpcRule>,
    rule: &GrpcRule,
    m: Option<&GrpcMatch>,
    n: usize,
    enforce_grants: bool,
) -> Result<(Value, Option<ConfigError>), ConfigError> {
    let meta = &route.metadata;
    let mut out = serde_json::Map::new();
    out.insert("name".into(), route_name(&rule.name, meta, n).into());
    if let Some(m) = m {
        out.insert(
            "match".into(),
            prune(json!([{
                "uri": grpc_uri(m)?,
                "headers": value_matches(&m.headers, "HeaderMatch")?,
            }])),
        );
    }
    for f in &rule.filters {
        match f.kind.as_str() {
            "RequestHeaderModifier" | "ResponseHeaderModifier" => header_filter(&mut out, f)?,
            "RequestMirror" => {
                if let Some(m) = mirror(settings, input, f, meta, enforce_grants, "GRPCRoute")? {
                    push(&mut out, "mirrors", m);
                }
            }
            other => {
                return Err(hard(
                    "InvalidFilter",
                    format!("unsupported filter type {other:?}"),
                ));
            }
        }
    }
    let error = route_to(
        &mut out,
        settings,
        input,
        &rule.backend_refs,
        meta,
        enforce_grants,
        "GRPCRoute",
    )?;
    Ok((Value::Object(out), error))
}

/// A gRPC method match as a URI match on `/<service>/<method>`.
fn grpc_uri(m: &GrpcMatch) -> Result<Option<Value>, ConfigError> {
    let Some(method) = &m.method else {
        return Ok(None);
    };
    let (service, name) = (method.service.as_deref(), method.method.as_deref());
    let uri = match (method.kind.as_deref().unwrap_or("Exact"), service, name) {
        (_, None, None) => {
            return Err(hard(
                "InvalidConfiguration",
                "gRPC match must have method or service defined",
            ));
        }
        ("Exact", Some(s), None) => json!({"prefix": format!("/{s}/")}),
        ("Exact", None, Some(n)) | ("RegularExpression", None, Some(n)) => {
            json!({"regex": format!("/[^/]+/{n}")})
        }
        ("Exact", Some(s), Some(n)) => json!({"exact": format!("/{s}/{n}")}),
        ("RegularExpression", Some(s), None) => json!({"regex": format!("/{s}/.+")}),
        ("RegularExpression", Some(s), Some(n)) => json!({"regex": format!("/{s}/{n}")}),
        (other, _, _) => {
            return Err(hard(
                "InvalidConfiguration",
                format!("unknown type: {other:?} is not supported Path match type"),
            ));
        }
    };
    Ok(Some(uri))
}

/// A TCPRoute's or TLSRoute's rules.
pub(super) fn stream(
    settings: &Settings,
    input: &Input,
    route: &Route<StreamRule>,
    kind: &str,
    enforce_grants: bool,
) -> Converted {
    let mut out = Converted::default();
    for rule in &route.spec.rules {
        let result = if weight_sum(&rule.backend_refs) == 0 {
            // Connections must be refused; a route to nowhere does it.
            Ok((
                json!({"route": [{"destination": {"host": "internal.cluster.local",
                    "subset": "zero-weight", "port": {"number": 65535}}}]}),
                None,
            ))
        } else {
            destinations(
                settings,
                input,
                &rule.backend_refs,
                &route.metadata,
                enforce_grants,
                kind,
            )
            .map(|(d, e)| {
                let mut r = json!({"route": d});
                if kind == "TLSRoute" {
                    let sni = if route.spec.hostnames.is_empty() {
                        vec!["*".to_string()]
                    } else {
                        route.spec.hostnames.clone()
                    };
                    r["match"] = json!([{"sniHosts": sni}]);
                }
                (prune(r), e)
            })
        };
        if !out.push(result) {
            return out;
        }
    }
    out
}

/// Orders routes as the Gateway API requires (each has at most one match; stable otherwise):
/// exact over prefix over regex paths, longer paths first, then a method, more headers, more
/// query parameters; routes without a match last.
pub(super) fn sort_http(routes: &mut [Value]) {
    fn key(r: &Value) -> Option<(i32, usize, bool, usize, usize)> {
        let m = r["match"].get(0)?;
        let (rank, len) = match m["uri"].as_object().and_then(|u| u.iter().next()) {
            Some((k, v)) => {
                let len = v.as_str().map_or(0, str::len);
                match k.as_str() {
                    "exact" => (3, len),
                    "prefix" => (2, len),
                    "regex" => (1, len),
                    _ => (-1, 0),
                }
            }
            None => (-1, 0),
        };
        let count = |f: &str| m[f].as_object().map_or(0, serde_json::Map::len);
        Some((
            rank,
            len,
            m.get("method").is_some(),
            count("headers"),
            count("queryParams"),
        ))
    }
    routes.sort_by(|a, b| match (key(a), key(b)) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (Some(_), None) => std::cmp::Ordering::Less,
        (Some(ka), Some(kb)) => kb.cmp(&ka),
    });
}
