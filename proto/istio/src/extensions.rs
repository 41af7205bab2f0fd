//! `extensions.istio.io` v1alpha1: `WasmPlugin` (a Wasm module in the HTTP or network filter
//! chain of the workloads it selects) and `TrafficExtension` (the same for a Wasm module or an
//! inline Lua script).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::authorization_policy::PolicyTargetReference;
use super::common::PortSelector;
use super::destination_rule::WorkloadSelector;

/// The `spec` of a WasmPlugin.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WasmPlugin {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub target_ref: Option<PolicyTargetReference>,
    #[serde(default)]
    pub target_refs: Vec<PolicyTargetReference>,
    /// Where the module is: `oci://`, `https://`, `http://`, `file://`, or an image reference.
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub sha256: String,
    /// `UNSPECIFIED_POLICY`, `IfNotPresent`, `Always`.
    #[serde(default)]
    pub image_pull_policy: Option<String>,
    #[serde(default)]
    pub image_pull_secret: String,
    #[serde(default)]
    pub verification_key: String,
    /// The plugin's configuration, passed to it as JSON.
    #[serde(default)]
    pub plugin_config: Option<Value>,
    #[serde(default)]
    pub plugin_name: String,
    /// `UNSPECIFIED_PHASE`, `AUTHN`, `AUTHZ`, `STATS`.
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub priority: Option<i32>,
    /// `FAIL_CLOSE`, `FAIL_OPEN`, `FAIL_RELOAD`.
    #[serde(default)]
    pub fail_strategy: Option<String>,
    #[serde(default)]
    pub vm_config: Option<VmConfig>,
    #[serde(default, rename = "match")]
    pub match_: Vec<Option<TrafficSelector>>,
    /// `UNSPECIFIED_PLUGIN_TYPE`, `HTTP`, `NETWORK`.
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
}

/// The spec of a TrafficExtension: exactly one of `wasm` and `lua`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TrafficExtension {
    #[serde(default)]
    pub selector: Option<WorkloadSelector>,
    #[serde(default)]
    pub target_refs: Vec<PolicyTargetReference>,
    /// `UNSPECIFIED`, `AUTHN`, `AUTHZ`, `STATS`.
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub priority: Option<i32>,
    #[serde(default, rename = "match")]
    pub match_: Vec<Option<TrafficSelector>>,
    #[serde(default)]
    pub wasm: Option<WasmConfig>,
    #[serde(default)]
    pub lua: Option<LuaConfig>,
}

/// A TrafficExtension's Wasm module: WasmPlugin's module fields.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WasmConfig {
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub sha256: String,
    #[serde(default)]
    pub image_pull_policy: Option<String>,
    #[serde(default)]
    pub image_pull_secret: String,
    #[serde(default)]
    pub verification_key: String,
    #[serde(default)]
    pub plugin_config: Option<Value>,
    #[serde(default)]
    pub plugin_name: String,
    #[serde(default)]
    pub fail_strategy: Option<String>,
    #[serde(default)]
    pub vm_config: Option<VmConfig>,
    #[serde(default, rename = "type")]
    pub type_: Option<String>,
}

/// An inline Lua script.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LuaConfig {
    #[serde(default)]
    pub inline_code: String,
}

/// The Wasm VM's environment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// A null entry is kept so that validation can name it.
    #[serde(default)]
    pub env: Vec<Option<EnvVar>>,
}

/// One environment variable: a value inline, or the host's variable of that name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EnvVar {
    #[serde(default)]
    pub name: String,
    /// `INLINE` (default) or `HOST`.
    #[serde(default)]
    pub value_from: Option<String>,
    #[serde(default)]
    pub value: String,
}

/// Which traffic an extension runs on: the side (`mode`) and the ports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficSelector {
    /// `UNDEFINED`, `CLIENT`, `SERVER`, `CLIENT_AND_SERVER`.
    #[serde(default)]
    pub mode: Option<String>,
    /// A null entry is kept so that validation can name it.
    #[serde(default)]
    pub ports: Vec<Option<PortSelector>>,
}

/// What istiod appends to a WasmPlugin's name when it reads it as a TrafficExtension (`~` is no
/// Kubernetes name character, so no real TrafficExtension collides).
pub const WASM_PLUGIN_MARKER: &str = "~istio-translated-wasmplugin";

impl WasmPlugin {
    /// The TrafficExtension istiod reads this WasmPlugin as (named with
    /// [`WASM_PLUGIN_MARKER`]): the deprecated `targetRef` folded into `targetRefs`, the module
    /// fields under `wasm`.
    pub fn to_traffic_extension(&self) -> TrafficExtension {
        let mut target_refs = self.target_refs.clone();
        if target_refs.is_empty() {
            target_refs.extend(self.target_ref.clone());
        }
        TrafficExtension {
            selector: self.selector.clone(),
            target_refs,
            // The two enums share their numbers; only the unset name differs.
            phase: self.phase.clone().filter(|p| p != "UNSPECIFIED_PHASE"),
            priority: self.priority,
            match_: self.match_.clone(),
            wasm: Some(WasmConfig {
                url: self.url.clone(),
                sha256: self.sha256.clone(),
                image_pull_policy: self.image_pull_policy.clone(),
                image_pull_secret: self.image_pull_secret.clone(),
                verification_key: self.verification_key.clone(),
                plugin_config: self.plugin_config.clone(),
                plugin_name: self.plugin_name.clone(),
                fail_strategy: self.fail_strategy.clone(),
                vm_config: self.vm_config.clone(),
                type_: self.type_.clone(),
            }),
            lua: None,
        }
    }
}

/// The `spec` of an `ImagePullSecret` object (PASA's own): the registry credentials of the
/// `kubernetes.io/dockerconfigjson` Secret a WasmPlugin or TrafficExtension names in
/// `imagePullSecret`, carried by the Kubernetes syncer under the Secret's namespace and name,
/// for the agents the extension applies to (as istiod hands it to their proxies).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ImagePullSecret {
    /// The Secret's `.dockerconfigjson`: `{"auths": {"<registry>": {...}}}`.
    #[serde(default)]
    pub docker_config_json: String,
}

/// How to sign in to one registry, from a Docker config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryLogin {
    /// A user name and password (`username` + `password`, or `auth`: base64 of `user:password`).
    Basic { username: String, password: String },
    /// A bearer token handed out ahead (`registrytoken`).
    Token(String),
}

impl ImagePullSecret {
    /// The logins of its Docker config, by registry host (`host[:port]`, as a key names it
    /// with or without scheme and path). An entry without a usable login is an error naming it.
    pub fn logins(&self) -> Result<Vec<(String, RegistryLogin)>, String> {
        use base64::Engine;
        let config: Value = serde_json::from_str(&self.docker_config_json)
            .map_err(|e| format!("dockerConfigJson: not JSON: {e}"))?;
        let auths = config["auths"]
            .as_object()
            .ok_or("dockerConfigJson: not a Docker config: no `auths` object")?;
        let mut out = Vec::with_capacity(auths.len());
        for (key, entry) in auths {
            let at = format!("dockerConfigJson.auths[{key:?}]");
            let text = |field: &str| entry[field].as_str().filter(|s| !s.is_empty());
            let login = if let Some(token) = text("registrytoken") {
                RegistryLogin::Token(token.to_string())
            } else if let (Some(username), Some(password)) = (text("username"), text("password")) {
                RegistryLogin::Basic {
                    username: username.into(),
                    password: password.into(),
                }
            } else if let Some(auth) = text("auth") {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(auth.trim())
                    .ok()
                    .and_then(|d| String::from_utf8(d).ok())
                    .ok_or(format!("{at}.auth: not base64 of `user:password`"))?;
                let (username, password) = decoded
                    .split_once(':')
                    .ok_or(format!("{at}.auth: not base64 of `user:password`"))?;
                RegistryLogin::Basic {
                    username: username.into(),
                    password: password.into(),
                }
            } else if text("identitytoken").is_some() {
                return Err(format!(
                    "{at}: identity tokens are not supported; give username and password"
                ));
            } else {
                return Err(format!(
                    "{at}: no login (username and password, auth or registrytoken)"
                ));
            };
            out.push((registry_host(key), login));
        }
        Ok(out)
    }

    /// The login for the registry at `host` (`registry-1.docker.io` for Docker Hub).
    pub fn login_for(&self, host: &str) -> Result<Option<RegistryLogin>, String> {
        let wanted = docker_hub_alias(host);
        Ok(self
            .logins()?
            .into_iter()
            .find(|(h, _)| docker_hub_alias(h) == wanted)
            .map(|(_, login)| login))
    }
}

/// A Docker config key's registry host: without scheme and path.
fn registry_host(key: &str) -> String {
    let key = key.split_once("://").map_or(key, |(_, rest)| rest);
    key.split('/')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// Docker Hub's names as one.
fn docker_hub_alias(host: &str) -> &str {
    match host {
        "docker.io" | "index.docker.io" | "registry-1.docker.io" => "docker.io",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_logins_come_from_a_docker_config_as_docker_reads_it() {
        let secret = ImagePullSecret {
            docker_config_json: serde_json::json!({"auths": {
                "https://index.docker.io/v1/": {"auth": "dXNlcjpwYTpzcw=="},
                "Registry.Example.com:5000": {"username": "u", "password": "p"},
                "ghcr.io": {"registrytoken": "t"},
            }})
            .to_string(),
        };
        assert_eq!(
            secret.login_for("registry-1.docker.io").unwrap(),
            Some(RegistryLogin::Basic {
                username: "user".into(),
                password: "pa:ss".into()
            })
        );
        assert_eq!(
            secret.login_for("registry.example.com:5000").unwrap(),
            Some(RegistryLogin::Basic {
                username: "u".into(),
                password: "p".into()
            })
        );
        assert_eq!(
            secret.login_for("ghcr.io").unwrap(),
            Some(RegistryLogin::Token("t".into()))
        );
        assert_eq!(secret.login_for("quay.io").unwrap(), None);
        for (config, error) in [
            ("{", "dockerConfigJson: not JSON"),
            ("{}", "no `auths` object"),
            (
                r#"{"auths": {"r.io": {"auth": "!"}}}"#,
                "auths[\"r.io\"].auth",
            ),
            (r#"{"auths": {"r.io": {}}}"#, "auths[\"r.io\"]: no login"),
            (
                r#"{"auths": {"r.io": {"identitytoken": "x"}}}"#,
                "identity tokens",
            ),
        ] {
            let secret = ImagePullSecret {
                docker_config_json: config.into(),
            };
            let e = secret.logins().unwrap_err();
            assert!(e.contains(error), "{config}: {e}");
        }
    }
}
