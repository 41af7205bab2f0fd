//! Gateways: each listener of a Gateway Istio handles becomes one Istio Gateway with one server,
//! and a parent routes can bind to.

use std::collections::BTreeMap;

use base64::Engine;
use serde_json::{Value, json};

use super::types::{Gateway, Listener, ListenerSet, LocalRef, Meta};
use super::{
    ConfigError, EAST_WEST_CONTROLLER, GATEWAY_CONTROLLER, GROUP, Input, REMOTE_CONTROLLER,
    Settings, WAYPOINT_CONTROLLER, generated, group_kind, prune,
};
use pasa_istio::generated::{
    GATEWAY_SECRET_PREFIX, GATEWAY_SEMANTICS, GATEWAY_SEMANTICS_ANNOTATION,
    GATEWAY_SERVICE_ANNOTATION, GENERATED, PARENT_NAMESPACE_ANNOTATION, PARENTS_ANNOTATION,
    SERVICE_ACCOUNT_ANNOTATION,
};
use pasa_proto::Kind;
use pasa_proto::Object;

/// The option that picks the TLS mode of a terminating listener.
const TERMINATE_MODE_OPTION: &str = "gateway.istio.io/tls-terminate-mode";
/// The option that lists a listener's cipher suites.
const CIPHER_SUITES_OPTION: &str = "gateway.istio.io/tls-cipher-suites";
/// The option that marks a passthrough listener as auto-passthrough.
const LISTENER_PROTOCOL_OPTION: &str = "gateway.istio.io/listener-protocol";

/// A listener turned into an Istio Gateway, and what routes binding to it need to know.
#[derive(Debug, Clone)]
pub(super) struct Generated {
    pub object: Object,
    /// Whether the listener is programmed (only programmed ones are written).
    pub valid: bool,
    /// The Gateway or ListenerSet it came from: (kind, namespace, name).
    pub owner: (&'static str, String, String),
    pub parent: ParentInfo,
}

/// Where a listener is written: a Gateway, or a ListenerSet of one (`gateway`).
#[derive(Clone, Copy)]
struct Owner<'a> {
    kind: &'static str,
    meta: &'a Meta,
    gateway: &'a Gateway,
}

/// A parent a route may bind to.
#[derive(Debug, Clone, Default)]
pub(super) struct ParentInfo {
    /// `namespace/name` of the Istio Gateway, or `mesh`.
    pub internal_name: String,
    /// The (group, kind)s of routes it admits.
    pub allowed_kinds: Vec<(String, String)>,
    /// The server's hosts, `namespace/hostname`.
    pub hostnames: Vec<String>,
    /// The listener's hostname as written (empty when none).
    pub original_hostname: String,
    pub section_name: String,
    pub port: u32,
    pub protocol: String,
}

/// The controller of a Gateway's class, when it is one of Istio's.
pub(super) fn controller(settings: &Settings, input: &Input, class: &str) -> Option<String> {
    let known = |c: &str| settings.classes.values().any(|k| k == c);
    input
        .classes
        .iter()
        .find(|c| c.metadata.name == class && known(&c.spec.controller_name))
        .map(|c| c.spec.controller_name.clone())
        .or_else(|| settings.classes.get(class).cloned())
}

/// Every Gateway's listeners, in input order.
pub(super) fn convert(settings: &Settings, input: &Input) -> Vec<Generated> {
    let mut out = Vec::new();
    for gw in &input.gateways {
        let Some(controller) = controller(settings, input, &gw.spec.gateway_class_name) else {
            continue;
        };
        if controller == REMOTE_CONTROLLER {
            continue;
        }
        let (services, error) = gateway_services(settings, gw, &controller);
        if services.is_empty() && error.is_some() {
            continue;
        }
        let service_account = if managed(gw) {
            gw.metadata
                .annotations
                .get("gateway.istio.io/service-account")
                .cloned()
                .unwrap_or_else(|| default_name(gw, &controller))
        } else {
            String::new()
        };
        // ListenerSets, and conflicts, are for the classes that take ListenerSets.
        let (sets, conflicted) = if controller == GATEWAY_CONTROLLER {
            let sets = listener_sets(input, gw);
            let conflicted = conflicts(gw, &sets);
            (sets, conflicted)
        } else {
            (Vec::new(), Vec::new())
        };
        let common = Common {
            controller: &controller,
            services: services.join(","),
            service_account,
        };
        let owner = Owner {
            kind: "Gateway",
            meta: &gw.metadata,
            gateway: gw,
        };
        for (index, l) in gw.spec.listeners.iter().enumerate() {
            if conflicted.contains(&(0, index)) {
                continue;
            }
            let (server, valid) = server(input, owner, l, &controller);
            if let Some(g) = listener(owner, l, server, valid, &common) {
                out.push(g);
            }
        }
        for (set_index, set) in sets.iter().enumerate() {
            let owner = Owner {
                kind: "ListenerSet",
                meta: &set.metadata,
                gateway: gw,
            };
            for (index, entry) in set.spec.listeners.iter().enumerate() {
                if conflicted.contains(&(set_index + 1, index)) {
                    continue;
                }
                let (l, port_ok) = with_default_port(entry);
                let (server, valid) = server(input, owner, &l, &controller);
                // A ListenerSet's listener that is not programmed binds no route.
                if !(valid && port_ok) {
                    continue;
                }
                if let Some(g) = listener(owner, &l, server, true, &common) {
                    out.push(g);
                }
            }
        }
    }
    out
}

/// What every listener of a Gateway (and of its ListenerSets) shares.
struct Common<'a> {
    controller: &'a str,
    /// The Services the Gateway binds to, comma-separated.
    services: String,
    service_account: String,
}

/// The Istio Gateway of one listener, and the parent it is for routes.
fn listener(
    owner: Owner<'_>,
    l: &Listener,
    server: Option<Value>,
    valid: bool,
    common: &Common<'_>,
) -> Option<Generated> {
    let server = server?;
    if common.controller == WAYPOINT_CONTROLLER
        || (common.controller == EAST_WEST_CONTROLLER && l.port == 15008)
    {
        return None;
    }
    let (namespace, name) = (&owner.meta.namespace, &owner.meta.name);
    let mut annotations: BTreeMap<String, String> = [
        (
            PARENTS_ANNOTATION,
            format!("{}/{name}/{}.{namespace}", owner.kind, l.name),
        ),
        (GATEWAY_SEMANTICS_ANNOTATION, GATEWAY_SEMANTICS.to_string()),
        (GATEWAY_SERVICE_ANNOTATION, common.services.clone()),
        (SERVICE_ACCOUNT_ANNOTATION, common.service_account.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if owner.kind == "ListenerSet" {
        annotations.insert(
            PARENT_NAMESPACE_ANNOTATION.to_string(),
            owner.gateway.metadata.namespace.clone(),
        );
    }
    let object_name = internal_gateway_name(name, &l.name);
    let hostnames = server["hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    Some(Generated {
        parent: ParentInfo {
            internal_name: format!("{namespace}/{object_name}"),
            allowed_kinds: supported_kinds(l),
            hostnames,
            original_hostname: l.hostname.clone().unwrap_or_default(),
            section_name: l.name.clone(),
            port: l.port,
            protocol: l.protocol.clone(),
        },
        object: generated(
            Kind::Gateway,
            namespace,
            object_name,
            annotations,
            json!({"servers": [server]}),
        ),
        valid,
        owner: (owner.kind, namespace.clone(), name.clone()),
    })
}

/// The ListenerSets attached to a Gateway that its `allowedListeners` admit, oldest first (then
/// by namespace and name).
fn listener_sets<'a>(input: &'a Input, gw: &Gateway) -> Vec<&'a ListenerSet> {
    let mut out: Vec<&ListenerSet> = input
        .listener_sets
        .iter()
        .filter(|set| {
            let p = &set.spec.parent_ref;
            let kind = group_kind(p.group.as_deref(), p.kind.as_deref(), (GROUP, "Gateway"));
            let namespace = p.namespace.as_deref().unwrap_or(&set.metadata.namespace);
            kind == (GROUP, "Gateway")
                && p.name == gw.metadata.name
                && namespace == gw.metadata.namespace
                && admits_listeners_of(input, gw, &set.metadata.namespace)
        })
        .collect();
    out.sort_by(|a, b| {
        let key = |s: &ListenerSet| {
            (
                s.metadata.creation_timestamp.clone(),
                s.metadata.namespace.clone(),
                s.metadata.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    out
}

/// Whether a Gateway's `allowedListeners` admits ListenerSets of `namespace` (none by default).
fn admits_listeners_of(input: &Input, gw: &Gateway, namespace: &str) -> bool {
    let Some(n) = gw
        .spec
        .allowed_listeners
        .as_ref()
        .and_then(|a| a.namespaces.as_ref())
    else {
        return false;
    };
    match n.from.as_deref() {
        Some("All") => true,
        Some("Same") => namespace == gw.metadata.namespace,
        None | Some("Selector") => {
            let (Some(selector), Some(labels)) = (&n.selector, input.namespaces.get(namespace))
            else {
                return false;
            };
            namespace_selected(selector, namespace, labels)
        }
        Some(_) => false,
    }
}

/// Whether a selector selects a namespace: its labels, and the `kubernetes.io/metadata.name`
/// label Kubernetes gives every namespace (istiod assumes it where it is missing).
fn namespace_selected(
    selector: &pasa_istio::label_selector::LabelSelector,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    const NAME_LABEL: &str = "kubernetes.io/metadata.name";
    if labels.get(NAME_LABEL).map(String::as_str) == Some(name) {
        return selector.matches(labels);
    }
    let mut labels = labels.clone();
    labels.insert(NAME_LABEL.into(), name.to_string());
    selector.matches(&labels)
}

/// A ListenerSet's listener with its port defaulted by protocol (80 for HTTP, 443 for HTTPS),
/// and whether it has one.
fn with_default_port(l: &Listener) -> (Listener, bool) {
    let mut l = l.clone();
    if l.port == 0 {
        match l.protocol.as_str() {
            "HTTP" => l.port = 80,
            "HTTPS" => l.port = 443,
            _ => return (l, false),
        }
    }
    (l, true)
}

/// istiod's name for the Istio Gateway of a listener.
pub fn internal_gateway_name(gateway: &str, listener: &str) -> String {
    format!("{gateway}~{GENERATED}~{listener}")
}

/// Whether Istio deploys the Gateway itself: no address, or one IP address.
fn managed(gw: &Gateway) -> bool {
    match gw.spec.addresses.as_slice() {
        [] => true,
        [one] => one.kind.as_deref().is_none_or(|k| k == "IPAddress"),
        _ => false,
    }
}

/// The name of the Deployment and Service Istio makes for a managed Gateway.
fn default_name(gw: &Gateway, controller: &str) -> String {
    if controller == WAYPOINT_CONTROLLER || controller == EAST_WEST_CONTROLLER {
        gw.metadata.name.clone()
    } else {
        format!("{}-{}", gw.metadata.name, gw.spec.gateway_class_name)
    }
}

/// The hosts of the Services that run a Gateway, and a soft error for addresses it ignores.
fn gateway_services(
    settings: &Settings,
    gw: &Gateway,
    controller: &str,
) -> (Vec<String>, Option<ConfigError>) {
    let namespace = &gw.metadata.namespace;
    let suffix = &settings.domain_suffix;
    if managed(gw) {
        let name = gw
            .metadata
            .annotations
            .get("gateway.istio.io/name-override")
            .cloned()
            .unwrap_or_else(|| default_name(gw, controller));
        return (
            vec![pasa_istio::host::service_fqdn(&name, namespace, suffix)],
            None,
        );
    }
    let mut services = Vec::new();
    let mut skipped = Vec::new();
    for address in &gw.spec.addresses {
        if address.kind.as_deref().is_some_and(|k| k != "Hostname") {
            skipped.push(address.value.clone());
            continue;
        }
        if address.value.contains('.') {
            services.push(address.value.clone());
        } else {
            services.push(pasa_istio::host::service_fqdn(
                &address.value,
                namespace,
                suffix,
            ));
        }
    }
    let error = (!skipped.is_empty()).then(|| ConfigError {
        reason: "UnsupportedAddress",
        message: format!("only Hostname is supported, ignoring {skipped:?}"),
    });
    (services, error)
}

/// The listeners that conflict with an earlier one on the same port (istiod reports them and
/// generates nothing for them), as (owner, listener) positions: owner 0 is the Gateway, `n` its
/// `n`th ListenerSet. Listeners conflict on a port when of different protocol families, or when
/// two HTTP-like ones have one hostname.
fn conflicts(gw: &Gateway, sets: &[&ListenerSet]) -> Vec<(usize, usize)> {
    let tcp_like = |p: &str| p == "TCP" || p == "UDP";
    let http_like = |p: &str| matches!(p, "HTTP" | "HTTPS" | "TLS");
    let hostname = |l: &Listener| {
        l.hostname
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "*".into())
    };
    let distinct = |a: &Listener, b: &Listener| {
        if a.port != b.port {
            return true;
        }
        let (pa, pb) = (a.protocol.as_str(), b.protocol.as_str());
        if (tcp_like(pa) && http_like(pb)) || (http_like(pa) && tcp_like(pb)) {
            return false;
        }
        if tcp_like(pa) && tcp_like(pb) {
            return false;
        }
        if http_like(pa) && http_like(pb) {
            return hostname(a) != hostname(b);
        }
        pa != pb
    };
    let merged = gw
        .spec
        .listeners
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, l)| ((0, i), l))
        .chain(sets.iter().enumerate().flat_map(|(s, set)| {
            set.spec
                .listeners
                .iter()
                .enumerate()
                .map(move |(i, l)| ((s + 1, i), with_default_port(l).0))
        }));
    let mut accepted: Vec<Listener> = Vec::new();
    let mut out = Vec::new();
    for (at, l) in merged {
        if accepted.iter().any(|prior| !distinct(&l, prior)) {
            out.push(at);
        } else {
            accepted.push(l);
        }
    }
    out
}

/// The route kinds a listener admits: those its protocol supports, narrowed by `allowedRoutes`.
fn supported_kinds(l: &Listener) -> Vec<(String, String)> {
    // Only a mode written as Terminate admits TCPRoutes (as istiod reads it).
    let terminate = l
        .tls
        .as_ref()
        .is_some_and(|t| t.mode.as_deref() == Some("Terminate"));
    let supported: &[&str] = match l.protocol.as_str() {
        "HTTP" | "HTTPS" => &["HTTPRoute", "GRPCRoute"],
        "TCP" => &["TCPRoute"],
        "TLS" if terminate => &["TLSRoute", "TCPRoute"],
        "TLS" => &["TLSRoute"],
        _ => &[],
    };
    let allowed = l.allowed_routes.as_ref().map(|a| &a.kinds);
    supported
        .iter()
        .filter(|kind| {
            allowed.is_none_or(|kinds| {
                kinds.is_empty()
                    || kinds
                        .iter()
                        .any(|k| k.kind == **kind && k.group.as_deref().unwrap_or(GROUP) == GROUP)
            })
        })
        .map(|kind| (GROUP.to_string(), kind.to_string()))
        .collect()
}

/// The server of a listener (none for a TLS listener without TLS settings), and whether the
/// listener is programmed.
fn server(
    input: &Input,
    owner: Owner<'_>,
    l: &Listener,
    controller: &str,
) -> (Option<Value>, bool) {
    let mut ok = true;
    let (tls, error) = tls(input, owner, l);
    if error.is_some() {
        ok = false;
    }
    let protocol = match l.protocol.as_str() {
        "HTTP" | "HTTPS" | "TLS" | "TCP" => Some(l.protocol.as_str()),
        "HBONE" if controller == WAYPOINT_CONTROLLER || controller == EAST_WEST_CONTROLLER => {
            Some("HBONE")
        }
        _ => None,
    };
    if protocol.is_none() {
        ok = false;
    }
    if tls.is_none() && matches!(l.protocol.as_str(), "HTTPS" | "TLS") {
        // A ListenerSet's listener must carry its TLS; a Gateway's is a placeholder.
        return (None, ok && owner.kind == "Gateway");
    }
    let server = prune(json!({
        "port": {"name": "default", "number": l.port, "protocol": protocol},
        "hosts": hosts(input, owner.meta, l),
        "tls": tls,
    }));
    (Some(server), ok)
}

/// `namespace/hostname` for every namespace whose routes the listener admits.
fn hosts(input: &Input, owner: &Meta, l: &Listener) -> Vec<String> {
    let hostname = l.hostname.as_deref().unwrap_or("*");
    let namespaces = l
        .allowed_routes
        .as_ref()
        .and_then(|a| a.namespaces.as_ref());
    let names: Vec<String> = match namespaces.and_then(|n| n.from.as_deref()) {
        None | Some("Same") => vec![owner.namespace.clone()],
        Some("All") => vec!["*".into()],
        Some(_) => match namespaces.and_then(|n| n.selector.as_ref()) {
            None => vec!["*".into()],
            Some(selector) => input
                .namespaces
                .iter()
                .filter(|(name, labels)| namespace_selected(selector, name, labels))
                .map(|(name, _)| name.clone())
                .collect(),
        },
    };
    let out: Vec<String> = names
        .iter()
        .filter(|n| !n.is_empty())
        .map(|n| format!("{n}/{hostname}"))
        .collect();
    if out.is_empty() {
        vec![format!("~/{hostname}")]
    } else {
        out
    }
}

/// A listener's TLS settings, and what is wrong with them.
fn tls(input: &Input, owner: Owner<'_>, l: &Listener) -> (Option<Value>, Option<ConfigError>) {
    let Some(tls) = &l.tls else {
        return (None, None);
    };
    let namespace = &owner.meta.namespace;
    let gw = owner.gateway;
    let option = |k: &str| tls.options.get(k).map(String::as_str);
    let cipher_suites = || -> Option<Vec<String>> {
        let listed = option(CIPHER_SUITES_OPTION).filter(|o| !o.is_empty())?;
        let mut out: Vec<String> = Vec::new();
        for s in listed.split(',').map(str::trim) {
            if pasa_istio::gateway::is_valid_cipher_suite(s) && !out.iter().any(|o| o == s) {
                out.push(s.to_string());
            }
        }
        (!out.is_empty()).then_some(out)
    };
    let mut out = serde_json::Map::new();
    fn set(out: &mut serde_json::Map<String, Value>, k: &str, v: Value) {
        out.insert(k.to_string(), v);
    }
    match tls.mode.as_deref().unwrap_or("Terminate") {
        "Terminate" => {
            set(&mut out, "mode", "SIMPLE".into());
            match option(TERMINATE_MODE_OPTION) {
                Some("MUTUAL") => set(&mut out, "mode", "MUTUAL".into()),
                Some("OPTIONAL_MUTUAL") => set(&mut out, "mode", "OPTIONAL_MUTUAL".into()),
                Some("ISTIO_SIMPLE") => {
                    set(&mut out, "credentialName", "builtin://".into());
                    return (Some(Value::Object(out)), None);
                }
                Some("ISTIO_MUTUAL") => {
                    set(&mut out, "mode", "ISTIO_MUTUAL".into());
                    return (Some(Value::Object(out)), None);
                }
                _ => {}
            }
            if tls.certificate_refs.len() > 2 {
                return (
                    Some(Value::Object(out)),
                    Some(ConfigError {
                        reason: "InvalidCertificateRef",
                        message: "TLS mode can only support up to 2 server certificates".into(),
                    }),
                );
            }
            let mut names = vec![String::new(); tls.certificate_refs.len()];
            let mut error = None;
            for (i, r) in tls.certificate_refs.iter().enumerate() {
                let ns = r.namespace.clone().unwrap_or_else(|| namespace.clone());
                if ns != *namespace
                    && !input.granted(owner.kind, namespace, ("", "Secret"), &ns, &r.name)
                {
                    error = Some(ConfigError {
                        reason: "RefNotPermitted",
                        message: format!(
                            "certificateRef {}/{ns} not accessible to a Gateway in namespace \
                             {namespace:?} (missing a ReferenceGrant?)",
                            r.name
                        ),
                    });
                    continue;
                }
                let kind = group_kind(r.group.as_deref(), r.kind.as_deref(), ("", "Secret"));
                if kind != ("", "Secret") {
                    error = Some(ConfigError {
                        reason: "InvalidCertificateRef",
                        message: "invalid certificate reference, only secret is allowed".into(),
                    });
                    continue;
                }
                match server_certificate(input, &ns, &r.name) {
                    Ok(()) => names[i] = format!("{GATEWAY_SECRET_PREFIX}{ns}/{}", r.name),
                    Err(message) => {
                        error = Some(ConfigError {
                            reason: "InvalidCertificateRef",
                            message,
                        })
                    }
                }
            }
            let valid = names.iter().filter(|n| !n.is_empty()).count();
            if valid == 0 {
                return (Some(Value::Object(out)), error);
            }
            if valid == 1 {
                set(&mut out, "credentialName", names[0].clone().into());
            } else {
                set(&mut out, "credentialNames", names.into());
            }
            let frontend = gw.spec.tls.as_ref().and_then(|t| t.frontend.as_ref());
            let validation = frontend.and_then(|f| {
                f.per_port
                    .iter()
                    .find(|p| p.port == l.port)
                    .map_or(&f.default, |p| &p.tls)
                    .validation
                    .as_ref()
            });
            if let Some(v) = validation.filter(|v| !v.ca_certificate_refs.is_empty()) {
                if v.ca_certificate_refs.len() > 1 {
                    return (
                        Some(Value::Object(out)),
                        Some(ConfigError {
                            reason: "InvalidCACertificateRef",
                            message: "only one caCertificateRef is supported".into(),
                        }),
                    );
                }
                match ca_certificate(input, owner, &v.ca_certificate_refs[0]) {
                    Ok(name) => {
                        let insecure = v.mode == "AllowInsecureFallback";
                        set(
                            &mut out,
                            "mode",
                            if insecure {
                                "OPTIONAL_MUTUAL"
                            } else {
                                "MUTUAL"
                            }
                            .into(),
                        );
                        set(&mut out, "insecureSkipVerify", insecure.into());
                        set(&mut out, "caCertCredentialName", name.into());
                        if let Some(mode @ ("MUTUAL" | "OPTIONAL_MUTUAL")) =
                            option(TERMINATE_MODE_OPTION)
                        {
                            set(&mut out, "mode", mode.into());
                            set(&mut out, "insecureSkipVerify", false.into());
                        }
                    }
                    Err(e) => return (Some(Value::Object(out)), Some(e)),
                }
            }
            if let Some(suites) = cipher_suites() {
                set(&mut out, "cipherSuites", suites.into());
            }
            // With one certificate usable, the others' errors are not reported (as istiod).
            (Some(Value::Object(out)), None)
        }
        _ => {
            let auto = option(LISTENER_PROTOCOL_OPTION) == Some("auto-passthrough") || {
                let labels = &owner.meta.labels;
                labels.contains_key("topology.istio.io/network")
                    && labels
                        .get("networking.istio.io/gatewayPort")
                        .map_or("15443", String::as_str)
                        == l.port.to_string()
            };
            // PASSTHROUGH is the mode's zero value, which protobuf JSON leaves out.
            if auto {
                set(&mut out, "mode", "AUTO_PASSTHROUGH".into());
            }
            if let Some(suites) = cipher_suites() {
                set(&mut out, "cipherSuites", suites.into());
            }
            (Some(Value::Object(out)), None)
        }
    }
}

/// Whether a Secret holds a server certificate and key in PEM (`cert`/`key` or
/// `tls.crt`/`tls.key`); the error says what is wrong.
fn server_certificate(input: &Input, namespace: &str, name: &str) -> Result<(), String> {
    let data = input
        .secrets
        .get(&(namespace.to_string(), name.to_string()))
        .ok_or_else(|| format!("secret {namespace}/{name} not found"))?;
    let decoded = |k: &str| {
        data.get(k)
            .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
            .filter(|v| !v.is_empty())
    };
    let (cert, key) = match (decoded("cert"), decoded("key")) {
        (Some(c), Some(k)) => (c, k),
        _ => match (decoded("tls.crt"), decoded("tls.key")) {
            (Some(c), Some(k)) => (c, k),
            _ => {
                return Err(format!(
                    "secret {namespace}/{name} has no (cert and key) or (tls.crt and tls.key)"
                ));
            }
        },
    };
    if !pem_has(&cert, "CERTIFICATE") || !pem_has(&key, "PRIVATE KEY") {
        return Err("the certificate is malformed: no PEM data".into());
    }
    Ok(())
}

/// The SDS name of a Gateway's client CA (a ConfigMap's or Secret's `ca.crt` or `cacert`).
fn ca_certificate(input: &Input, owner: Owner<'_>, r: &LocalRef) -> Result<String, ConfigError> {
    let namespace = &owner.meta.namespace;
    let ns = r.namespace.clone().unwrap_or_else(|| namespace.clone());
    let (kind, prefix) = match (r.group.as_str(), r.kind.as_str()) {
        ("", "ConfigMap") => ("ConfigMap", "configmap://"),
        ("", "Secret") => ("Secret", GATEWAY_SECRET_PREFIX),
        _ => {
            return Err(ConfigError {
                reason: "InvalidCACertificateKind",
                message: "invalid CA certificate reference, only secret and configmap are allowed"
                    .into(),
            });
        }
    };
    let resource = format!("{prefix}{ns}/{}-cacert", r.name);
    if ns != *namespace && !input.granted(owner.kind, namespace, ("", kind), &ns, &r.name) {
        return Err(ConfigError {
            reason: "RefNotPermitted",
            message: format!(
                "caCertificateRef {ns}/{} not accessible to a Gateway in namespace {namespace:?} \
                 (missing a ReferenceGrant?)",
                r.name
            ),
        });
    }
    let key = (ns.clone(), r.name.clone());
    let bundle = if kind == "ConfigMap" {
        input
            .config_maps
            .get(&key)
            .map(|d| ["cacert", "ca.crt"].map(|k| d.get(k).map(|v| v.as_bytes().to_vec())))
    } else {
        input.secrets.get(&key).map(|d| {
            ["cacert", "ca.crt"].map(|k| {
                d.get(k)
                    .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
            })
        })
    };
    let not_found = || ConfigError {
        reason: "InvalidCACertificateRef",
        message: format!(
            "invalid CA certificate reference, {kind} {ns}/{} not found",
            r.name
        ),
    };
    let [first, second] = bundle.ok_or_else(not_found)?;
    let cert = first
        .filter(|c| !c.is_empty())
        .or(second.filter(|c| !c.is_empty()))
        .ok_or_else(|| ConfigError {
            reason: "InvalidCACertificateRef",
            message: "invalid CA certificate reference, no cacert or ca.crt".into(),
        })?;
    if !pem_has(&cert, "CERTIFICATE") {
        return Err(ConfigError {
            reason: "InvalidCACertificateRef",
            message: "invalid CA certificate reference, the bundle is malformed".into(),
        });
    }
    Ok(resource)
}

/// Whether bytes hold a PEM block whose label ends with `label`, with a base64 body.
pub fn pem_has(bytes: &[u8], label: &str) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let after = &rest[start + 11..];
        let Some(end_label) = after.find("-----") else {
            return false;
        };
        let found = &after[..end_label];
        let body_start = &after[end_label + 5..];
        let footer = format!("-----END {found}-----");
        let Some(body_end) = body_start.find(&footer) else {
            return false;
        };
        let body: String = body_start[..body_end]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if found.ends_with(label)
            && !body.is_empty()
            && base64::engine::general_purpose::STANDARD
                .decode(&body)
                .is_ok()
        {
            return true;
        }
        rest = &body_start[body_end + footer.len()..];
    }
    false
}
