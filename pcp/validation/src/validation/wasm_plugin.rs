//! Validation of `WasmPlugin`, following istiod's webhook and the CRD schema: what it attaches
//! to, where the module is (URL scheme, SHA-256), its pull secret and name, the VM's environment,
//! and the ports it matches. The module's checks are shared with TrafficExtension's `wasm`.
//! Also the registry credentials of a pull secret ([`validate_image_pull_secret`]).

use std::collections::HashSet;

use pasa_istio::extensions::{ImagePullSecret, TrafficSelector, VmConfig, WasmPlugin};
use pasa_proto::Object;

use super::common::{attachment, validate_enum};
use super::{Path, Report, parse};

/// URL schemes a module may be fetched with (empty: a local path).
const SCHEMES: [&str; 5] = ["", "file", "http", "https", "oci"];
const PULL_POLICIES: [&str; 3] = ["UNSPECIFIED_POLICY", "IfNotPresent", "Always"];
const FAIL_STRATEGIES: [&str; 3] = ["FAIL_CLOSE", "FAIL_OPEN", "FAIL_RELOAD"];
const PLUGIN_TYPES: [&str; 3] = ["UNSPECIFIED_PLUGIN_TYPE", "HTTP", "NETWORK"];
const TRAFFIC_MODES: [&str; 4] = ["UNDEFINED", "CLIENT", "SERVER", "CLIENT_AND_SERVER"];
/// The CRD's caps.
const MAX_ENV: usize = 256;
const MAX_ENV_VALUE_LENGTH: usize = 2048;
const MAX_PULL_SECRET_LENGTH: usize = 253;
const MAX_PLUGIN_NAME_LENGTH: usize = 256;

/// Checks one WasmPlugin.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(plugin) = parse::<WasmPlugin>(obj, report) else {
        return;
    };
    let spec = Path::spec();
    attachment(
        plugin.selector.as_ref(),
        plugin.target_ref.as_ref(),
        &plugin.target_refs,
        &spec,
        report,
    );
    validate_module(
        &spec,
        &Module {
            url: &plugin.url,
            sha256: &plugin.sha256,
            image_pull_secret: &plugin.image_pull_secret,
            plugin_name: &plugin.plugin_name,
            // istiod's message for WasmPlugin says 255, for TrafficExtension 256.
            plugin_name_limit: "255",
            vm_config: plugin.vm_config.as_ref(),
            image_pull_policy: plugin.image_pull_policy.as_deref(),
            fail_strategy: plugin.fail_strategy.as_deref(),
            plugin_type: plugin.type_.as_deref(),
        },
        report,
    );
    validate_match(&spec, &plugin.match_, report);
    validate_enum(
        &spec.field("phase"),
        plugin.phase.as_deref(),
        &["UNSPECIFIED_PHASE", "AUTHN", "AUTHZ", "STATS"],
        report,
    );
}

/// The module's location: set, parseable, and by a scheme istiod fetches.
/// Checks one `ImagePullSecret` (PASA's own: the registry credentials the syncer carries for a
/// module's `imagePullSecret`): a Docker config whose every registry has a login the agent can
/// use.
pub fn validate_image_pull_secret(obj: &Object, report: &mut Report) {
    let Some(secret) = parse::<ImagePullSecret>(obj, report) else {
        return;
    };
    if let Err(e) = secret.logins() {
        // The message names the place within the Docker config.
        let within = e.strip_prefix("dockerConfigJson").unwrap_or(&e);
        let within = within
            .strip_prefix(": ")
            .or_else(|| within.strip_prefix('.'))
            .unwrap_or(within);
        report.error(&Path::spec().field("dockerConfigJson"), within);
    }
}

fn validate_url(url: &str) -> Result<(), String> {
    if url.is_empty() {
        return Err("url field needs to be set".into());
    }
    if url.chars().any(|c| c.is_control() || c == ' ') {
        return Err(format!("failed to parse url: invalid character in {url:?}"));
    }
    // A reference without a scheme (`registry/plugin:tag`) is read as `http://` + it, as
    // istiod reads it.
    let scheme = match url.split_once(':') {
        Some((scheme, rest)) if is_scheme(scheme) && rest.starts_with('/') => {
            scheme.to_ascii_lowercase()
        }
        _ => String::new(),
    };
    if !SCHEMES.contains(&scheme.as_str()) {
        return Err(format!("url contains unsupported scheme: {scheme}"));
    }
    Ok(())
}

fn is_scheme(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// A module's SHA-256, when given: 64 lower-case hex digits.
fn validate_sha256(sha: &str) -> Result<(), String> {
    if sha.is_empty() {
        return Ok(());
    }
    if sha.len() != 64 {
        return Err("sha256 field must be 64 characters long".into());
    }
    if !sha.bytes().all(|b| matches!(b, b'a'..=b'f' | b'0'..=b'9')) {
        return Err("sha256 field must match [a-f0-9]{64} pattern".into());
    }
    Ok(())
}

/// The VM's environment: named, once each, a value only when inline.
fn validate_vm_config(at: &Path, vm: &VmConfig, report: &mut Report) {
    let at = at.field("env");
    if vm.env.len() > MAX_ENV {
        report.error(&at, format!("at most {MAX_ENV} variables"));
    }
    let mut names = HashSet::new();
    for (i, env) in vm.env.iter().enumerate() {
        let Some(env) = env else { continue };
        let here = at.index(i);
        if env.name.is_empty() {
            report.error(&here.field("name"), "spec.vmConfig.env invalid");
            continue;
        }
        if env.name.len() > MAX_PLUGIN_NAME_LENGTH {
            report.error(
                &here.field("name"),
                "env.name field must be less than 255 characters long",
            );
        }
        if !names.insert(env.name.as_str()) {
            report.error(&here.field("name"), "duplicate env");
        }
        validate_enum(
            &here.field("valueFrom"),
            env.value_from.as_deref(),
            &["INLINE", "HOST"],
            report,
        );
        if env.value_from.as_deref().is_some_and(|v| v != "INLINE") && !env.value.is_empty() {
            report.error(
                &here.field("value"),
                "value may only be set when valueFrom is INLINE",
            );
        }
        if env.value.len() > MAX_ENV_VALUE_LENGTH {
            report.error(
                &here.field("value"),
                format!("at most {MAX_ENV_VALUE_LENGTH} characters"),
            );
        }
    }
}

/// The traffic an extension runs on: each selector and port given, ports in range.
pub(crate) fn validate_match(
    spec: &Path,
    selectors: &[Option<TrafficSelector>],
    report: &mut Report,
) {
    for (i, selector) in selectors.iter().enumerate() {
        let here = spec.field("match").index(i);
        let Some(selector) = selector else {
            report.error(&here, format!("spec.Match[{i}] is nil"));
            continue;
        };
        validate_enum(
            &here.field("mode"),
            selector.mode.as_deref(),
            &TRAFFIC_MODES,
            report,
        );
        for (j, port) in selector.ports.iter().enumerate() {
            let there = here.field("ports").index(j);
            match port {
                None => report.error(&there, format!("spec.Match[{i}].Ports[{j}] is nil")),
                Some(port) if port.number == 0 || port.number > 65535 => report.error(
                    &there.field("number"),
                    format!(
                        "spec.Match[{i}].Ports[{j}] is out of range: {}",
                        port.number
                    ),
                ),
                Some(_) => {}
            }
        }
    }
}

/// A Wasm module's fields, as WasmPlugin and TrafficExtension's `wasm` both have them.
pub(crate) struct Module<'a> {
    pub url: &'a str,
    pub sha256: &'a str,
    pub image_pull_secret: &'a str,
    pub plugin_name: &'a str,
    /// The limit istiod's message names for `pluginName`.
    pub plugin_name_limit: &'a str,
    pub vm_config: Option<&'a VmConfig>,
    pub image_pull_policy: Option<&'a str>,
    pub fail_strategy: Option<&'a str>,
    pub plugin_type: Option<&'a str>,
}

/// A Wasm module at `at`: where it is, its digest, pull secret, name, VM and the CRD's enums.
pub(crate) fn validate_module(at: &Path, module: &Module<'_>, report: &mut Report) {
    report.check(&at.field("url"), validate_url(module.url));
    report.check(&at.field("sha256"), validate_sha256(module.sha256));
    if module.image_pull_secret.len() > MAX_PULL_SECRET_LENGTH {
        report.error(
            &at.field("imagePullSecret"),
            "imagePullSecret field must be less than 253 characters long",
        );
    }
    if module.plugin_name.len() > MAX_PLUGIN_NAME_LENGTH {
        report.error(
            &at.field("pluginName"),
            format!(
                "pluginName field must be less than {} characters long",
                module.plugin_name_limit
            ),
        );
    }
    if let Some(vm) = module.vm_config {
        validate_vm_config(&at.field("vmConfig"), vm, report);
    }
    validate_enum(
        &at.field("imagePullPolicy"),
        module.image_pull_policy,
        &PULL_POLICIES,
        report,
    );
    validate_enum(
        &at.field("failStrategy"),
        module.fail_strategy,
        &FAIL_STRATEGIES,
        report,
    );
    validate_enum(&at.field("type"), module.plugin_type, &PLUGIN_TYPES, report);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_pull_secret_holds_a_docker_config_with_logins() {
        let check = |config: &str| {
            let doc = serde_json::json!({
                "apiVersion": "pasa.io/v1alpha1", "kind": "ImagePullSecret",
                "metadata": {"name": "creds", "namespace": "shop"},
                "spec": {"dockerConfigJson": config},
            });
            let obj =
                Object::from_json(&doc, "default", pasa_istio::generated::is_generated_object)
                    .expect("a well-formed object");
            let mut report = Report::default();
            validate_image_pull_secret(&obj, &mut report);
            report
                .errors
                .iter()
                .map(|p| format!("{}: {}", p.field, p.message))
                .collect::<Vec<_>>()
        };
        assert!(check(r#"{"auths": {"r.io": {"auth": "dTpw"}}}"#).is_empty());
        assert_eq!(
            check(r#"{"auths": {"r.io": {}}}"#),
            [
                "spec.dockerConfigJson: auths[\"r.io\"]: no login (username and password, auth or \
                 registrytoken)"
            ]
        );
        assert_eq!(
            check("[]"),
            ["spec.dockerConfigJson: not a Docker config: no `auths` object"]
        );
    }

    #[test]
    fn urls_by_scheme() {
        for ok in [
            "oci://registry:5000/plugin:latest",
            "https://example.com/p.wasm",
            "file:///opt/p.wasm",
            "registry.example.com/plugin:1.0",
            "/opt/p.wasm",
        ] {
            assert_eq!(validate_url(ok), Ok(()), "{ok}");
        }
        assert!(
            validate_url("ftp://example.com/p")
                .unwrap_err()
                .contains("unsupported scheme: ftp")
        );
        assert!(validate_url("http://exa mple.com").is_err());
        assert!(validate_url("").unwrap_err().contains("needs to be set"));
    }
}
