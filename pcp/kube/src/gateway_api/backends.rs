//! Backends: where a route's `backendRefs` (and mirrors) send, as VirtualService destinations:
//! Services (and ServiceImports, as Services), ServiceEntry hosts (`Hostname`), XBackends and
//! InferencePools, with the ReferenceGrants a backend in another namespace needs.

use serde_json::{Value, json};

use super::rules::{hard, header_filter};
use super::types::{BackendRef, Meta, ObjectRef};
use super::{ConfigError, Input, Settings, group_kind};

/// The destinations of a rule's backends with a weight; one alone carries no weight.
pub(super) fn destinations(
    settings: &Settings,
    input: &Input,
    backends: &[BackendRef],
    meta: &Meta,
    enforce_grants: bool,
    kind: &str,
) -> Result<(Option<Value>, Option<ConfigError>), ConfigError> {
    if backends.is_empty() {
        return Ok((None, None));
    }
    let weighted: Vec<&BackendRef> = backends
        .iter()
        .filter(|b| b.weight.unwrap_or(1) != 0)
        .collect();
    let single = weighted.len() == 1;
    let mut error = None;
    let mut out = Vec::new();
    for b in weighted {
        let (destination, e) = destination(settings, input, &b.object, meta, enforce_grants, kind)?;
        if e.is_some() {
            error = e;
        }
        let mut d = serde_json::Map::new();
        d.insert("destination".into(), destination);
        if !single {
            d.insert("weight".into(), b.weight.unwrap_or(1).into());
        }
        for f in &b.filters {
            match f.kind.as_str() {
                "RequestHeaderModifier" | "ResponseHeaderModifier" => header_filter(&mut d, f)?,
                other => {
                    return Err(hard(
                        "InvalidFilter",
                        format!("unsupported filter type {other:?}"),
                    ));
                }
            }
        }
        out.push(Value::Object(d));
    }
    // Protobuf JSON leaves an empty list out.
    Ok(((!out.is_empty()).then(|| out.into()), error))
}

/// A backend's destination, and the error that leaves it unusable (a missing, ungranted or
/// unsupported backend: an empty destination, or the named one when only its Service is
/// missing). A malformed reference is a hard error.
pub(super) fn destination(
    settings: &Settings,
    input: &Input,
    to: &ObjectRef,
    meta: &Meta,
    enforce_grants: bool,
    kind: &str,
) -> Result<(Value, Option<ConfigError>), ConfigError> {
    let (group, backend_kind) =
        group_kind(to.group.as_deref(), to.kind.as_deref(), ("", "Service"));
    let namespace = to.namespace.as_deref().unwrap_or(&meta.namespace);
    if enforce_grants
        && namespace != meta.namespace
        && !input.granted(
            kind,
            &meta.namespace,
            (group, backend_kind),
            namespace,
            &to.name,
        )
    {
        return Ok((
            json!({}),
            Some(hard(
                "RefNotPermitted",
                format!(
                    "backendRef {}/{namespace} not accessible to a {kind} in namespace {:?} \
                     (missing a ReferenceGrant?)",
                    to.name, meta.namespace
                ),
            )),
        ));
    }
    let suffix = &settings.domain_suffix;
    let not_found = |host: &str| {
        Some(hard(
            "BackendNotFound",
            format!("backend({host}) not found"),
        ))
    };
    let (host, error) = match (group, backend_kind) {
        ("", "Service") | ("multicluster.x-k8s.io", "ServiceImport") => {
            if to.name.contains('.') {
                return Err(hard(
                    "InvalidDestination",
                    "service name invalid; the name of the Service must be used, not the hostname.",
                ));
            }
            let host = pasa_istio::host::service_fqdn(&to.name, namespace, suffix);
            let exists = input
                .services
                .contains_key(&(namespace.to_string(), to.name.clone()));
            let error = if exists { None } else { not_found(&host) };
            (host, error)
        }
        ("networking.istio.io", "Hostname") => {
            if to.namespace.is_some() {
                return Err(hard(
                    "InvalidDestination",
                    "namespace may not be set with Hostname type",
                ));
            }
            let error = if input.registry.contains_key(&to.name) {
                None
            } else {
                not_found(&to.name)
            };
            (to.name.clone(), error)
        }
        (super::INFERENCE_GROUP, "InferencePool") => {
            return inference_pool(settings, input, to, namespace);
        }
        (super::ALPHA_GROUP, "XBackend") => return x_backend(settings, input, to, namespace),
        _ => {
            return Ok((
                json!({}),
                Some(hard(
                    "InvalidKind",
                    format!(
                        "referencing unsupported backendRef: group {group:?} kind {backend_kind:?}"
                    ),
                )),
            ));
        }
    };
    let Some(port) = to.port else {
        return Err(hard("InvalidDestination", "port is required in backendRef"));
    };
    Ok((json!({"host": host, "port": {"number": port}}), error))
}

/// An XBackend: its external host, on its port (a port the reference names must be it).
fn x_backend(
    settings: &Settings,
    input: &Input,
    to: &ObjectRef,
    namespace: &str,
) -> Result<(Value, Option<ConfigError>), ConfigError> {
    let invalid = |reason, message: String| Ok((json!({}), Some(hard(reason, message))));
    if !settings.alpha {
        return invalid(
            "InvalidKind",
            "The Alpha Gateway API is not enabled, XBackend is invalid. To enable, set \
             PILOT_ENABLE_ALPHA_GATEWAY_API to true in istiod."
                .into(),
        );
    }
    let Some(backend) = input
        .backends
        .iter()
        .find(|b| b.metadata.namespace == namespace && b.metadata.name == to.name)
    else {
        return invalid("BackendNotFound", format!("backend({}) not found", to.name));
    };
    let Some(host) = backend.hostname() else {
        return invalid(
            "InvalidKind",
            format!(
                "backend({}) type: expected ExternalHostname, got {}",
                to.name, backend.spec.kind
            ),
        );
    };
    let port = backend.spec.port.port;
    if let Some(p) = to.port.filter(|p| *p != port) {
        return invalid(
            "BackendNotFound",
            format!(
                "backend({}) does not expose port {p}, expected {port}",
                to.name
            ),
        );
    }
    let error = (!input.registry.contains_key(host))
        .then(|| hard("BackendNotFound", format!("backend({host}) not found")));
    Ok((json!({"host": host, "port": {"number": port}}), error))
}

/// An InferencePool backend: the pool's shadow Service, on its first port.
fn inference_pool(
    settings: &Settings,
    input: &Input,
    to: &ObjectRef,
    namespace: &str,
) -> Result<(Value, Option<ConfigError>), ConfigError> {
    if !settings.inference {
        return Ok((
            json!({}),
            Some(hard(
                "InvalidKind",
                "InferencePool is not enabled. To enable, set \
                 ENABLE_GATEWAY_API_INFERENCE_EXTENSION to true in istiod",
            )),
        ));
    }
    if to.name.contains('.') {
        return Err(hard(
            "InvalidDestination",
            "InferencePool.Name invalid; the name of the InferencePool must be used, not the hostname.",
        ));
    }
    if !input
        .inference_pools
        .contains(&(namespace.to_string(), to.name.clone()))
    {
        return Ok((
            json!({}),
            Some(hard(
                "BackendNotFound",
                format!("backend({}) not found", to.name),
            )),
        ));
    }
    let host = pasa_istio::host::service_fqdn(
        &super::inference_pool_service(&to.name),
        namespace,
        &settings.domain_suffix,
    );
    let Some(service) = input.registry.get(&host) else {
        return Ok((
            json!({}),
            Some(hard(
                "BackendNotFound",
                format!("backend({host}) not found"),
            )),
        ));
    };
    let port = service.ports.first().copied().unwrap_or(0);
    Ok((json!({"host": host, "port": {"number": port}}), None))
}
