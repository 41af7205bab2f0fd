//! Validation of `TrafficExtension`, following istiod's webhook and the CRD schema: exactly one
//! of a Wasm module (checked as WasmPlugin's) and an inline Lua script, what it attaches to
//! (`selector` or `targetRefs`), and the ports it matches.

use pasa_proto::Object;
use pasa_proto::istio::extensions::TrafficExtension;

use super::common::{attachment, validate_enum};
use super::wasm_plugin::{
    MAX_PLUGIN_NAME_LENGTH, MAX_PULL_SECRET_LENGTH, validate_match, validate_module_enums,
    validate_sha256, validate_url, validate_vm_config,
};
use super::{Path, Report, parse};

/// The CRD's cap on a Lua script.
const MAX_LUA_LENGTH: usize = 65536;

/// Checks one TrafficExtension.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(extension) = parse::<TrafficExtension>(obj, report) else {
        return;
    };
    let spec = Path::spec();
    if extension.wasm.is_some() == extension.lua.is_some() {
        report.error(&spec, "exactly one of wasm or lua must be set");
    }
    attachment(
        extension.selector.as_ref(),
        None,
        &extension.target_refs,
        &spec,
        report,
    );
    if let Some(lua) = &extension.lua {
        let at = spec.field("lua").field("inlineCode");
        if lua.inline_code.is_empty() {
            report.error(&at, "lua.inlineCode cannot be empty");
        } else if lua.inline_code.len() > MAX_LUA_LENGTH {
            report.error(&at, "lua.inlineCode exceeds maximum size of 64KB");
        }
    }
    if let Some(wasm) = &extension.wasm {
        let at = spec.field("wasm");
        report.check(&at.field("url"), validate_url(&wasm.url));
        report.check(&at.field("sha256"), validate_sha256(&wasm.sha256));
        if wasm.image_pull_secret.len() > MAX_PULL_SECRET_LENGTH {
            report.error(
                &at.field("imagePullSecret"),
                "imagePullSecret field must be less than 253 characters long",
            );
        }
        if wasm.plugin_name.len() > MAX_PLUGIN_NAME_LENGTH {
            report.error(
                &at.field("pluginName"),
                "pluginName field must be less than 256 characters long",
            );
        }
        if let Some(vm) = &wasm.vm_config {
            validate_vm_config(&at.field("vmConfig"), vm, report);
        }
        validate_module_enums(
            &at,
            wasm.image_pull_policy.as_deref(),
            wasm.fail_strategy.as_deref(),
            wasm.type_.as_deref(),
            report,
        );
    }
    validate_match(&spec, &extension.match_, report);
    validate_enum(
        &spec.field("phase"),
        extension.phase.as_deref(),
        &["UNSPECIFIED", "AUTHN", "AUTHZ", "STATS"],
        report,
    );
}
