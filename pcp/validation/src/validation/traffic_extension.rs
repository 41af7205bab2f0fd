//! Validation of `TrafficExtension`, following istiod's webhook and the CRD schema: exactly one
//! of a Wasm module (checked as WasmPlugin's) and an inline Lua script, what it attaches to
//! (`selector` or `targetRefs`), and the ports it matches.

use pasa_istio::extensions::TrafficExtension;
use pasa_proto::Object;

use super::common::{attachment, validate_enum};
use super::wasm_plugin::{Module, validate_match, validate_module};
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
        validate_module(
            &spec.field("wasm"),
            &Module {
                url: &wasm.url,
                sha256: &wasm.sha256,
                image_pull_secret: &wasm.image_pull_secret,
                plugin_name: &wasm.plugin_name,
                plugin_name_limit: "256",
                vm_config: wasm.vm_config.as_ref(),
                image_pull_policy: wasm.image_pull_policy.as_deref(),
                fail_strategy: wasm.fail_strategy.as_deref(),
                plugin_type: wasm.type_.as_deref(),
            },
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
