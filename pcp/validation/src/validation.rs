//! Istio-parity validation of networking and security resources: what istiod's webhook rejects, PCP rejects,
//! with the field path and the rule; what it warns about, PCP warns about.
//!
//! [`validate`] checks one object on its own (the webhook's and `pasactl validate`'s job). Checks
//! that need other resources (a subset no DestinationRule defines) are warnings from
//! `crate::analysis`.

pub mod authorization_policy;
pub mod common;
pub mod destination_rule;
pub mod envoy_filter;
pub mod gateway;
pub mod json_web_key_set;
pub mod mesh_config;
pub mod peer_authentication;
pub mod proxy_config;
pub mod request_authentication;
pub mod service_endpoints;
pub mod service_entry;
pub mod sidecar;
pub mod telemetry;
pub mod traffic_extension;
pub mod virtual_service;
pub mod wasm_plugin;
pub mod workload_entry;
pub mod workload_group;

use std::fmt;

use pasa_proto::object::FieldError;
use pasa_proto::{Kind, Object};
use serde::de::DeserializeOwned;

/// Where in a document a problem is: `spec.http[0].route[1].weight`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path(String);

impl Path {
    /// The root of a resource's spec.
    pub fn spec() -> Path {
        Path("spec".to_string())
    }

    pub fn root(name: &str) -> Path {
        Path(name.to_string())
    }

    /// A field of this one: `spec` → `spec.hosts`.
    pub fn field(&self, name: &str) -> Path {
        if self.0.is_empty() {
            Path(name.to_string())
        } else {
            Path(format!("{}.{name}", self.0))
        }
    }

    /// An element of this list: `spec.hosts` → `spec.hosts[2]`.
    pub fn index(&self, i: usize) -> Path {
        Path(format!("{}[{i}]", self.0))
    }

    /// An entry of this map: `metadata.labels` → `metadata.labels[app]`.
    pub fn key(&self, key: &str) -> Path {
        Path(format!("{}[{key}]", self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One problem: the field at fault and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub field: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::admission::problem_text(&self.field, &self.message))
    }
}

impl From<FieldError> for Problem {
    fn from(e: FieldError) -> Self {
        Problem {
            field: e.field,
            message: e.message,
        }
    }
}

/// Everything validation found in one object. Errors reject it; warnings are reported only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub errors: Vec<Problem>,
    pub warnings: Vec<Problem>,
}

impl Report {
    pub fn error(&mut self, at: &Path, message: impl fmt::Display) {
        self.errors.push(Problem {
            field: at.to_string(),
            message: message.to_string(),
        });
    }

    pub fn warn(&mut self, at: &Path, message: impl fmt::Display) {
        self.warnings.push(Problem {
            field: at.to_string(),
            message: message.to_string(),
        });
    }

    /// Records `result`'s error, if any, at `at`.
    pub fn check(&mut self, at: &Path, result: Result<(), String>) {
        if let Err(message) = result {
            self.error(at, message);
        }
    }

    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Who wrote an object: users (and the cluster's objects the syncer mirrors) go through istiod's
/// webhook checks; what PCP's syncer generates from the Gateway API is checked as istiod checks
/// what it generates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Author {
    User,
    /// PCP's syncer, writing what it generated: names with `~`, istiod's `internal.istio.io`
    /// annotations, and only a structural check of the spec.
    Generator,
}

/// Validates a structurally sound object (see [`Object::from_json`]) as istiod's webhook would.
pub fn validate(obj: &Object) -> Report {
    validate_by(obj, Author::User)
}

/// [`validate`], for an object of `author`.
pub fn validate_by(obj: &Object, author: Author) -> Report {
    let mut report = Report::default();
    let generated =
        author == Author::Generator && pasa_istio::generated::is_generated(&obj.annotations);
    common::validate_metadata(obj, generated, &mut report);
    // The store keeps istiod's generated names (`~`); users may not write one.
    if !generated && let Err(message) = pasa_proto::object::check_name(&obj.name) {
        report.error(&Path::root("metadata").field("name"), message);
    }
    if generated {
        // istiod does not validate what it generates (a backend it cannot resolve becomes an
        // empty destination, a listener admitting no namespace the host `~/...`); the spec must
        // still read as its kind, for the agents.
        use pasa_istio::{destination_rule, gateway, virtual_service};
        match obj.kind {
            Kind::VirtualService => {
                parse::<virtual_service::VirtualService>(obj, &mut report);
            }
            Kind::Gateway => {
                parse::<gateway::Gateway>(obj, &mut report);
            }
            Kind::DestinationRule => {
                parse::<destination_rule::DestinationRule>(obj, &mut report);
            }
            _ => report.error(
                &Path::root("kind"),
                "PCP generates only Gateways, VirtualServices and DestinationRules",
            ),
        }
        return report;
    }
    match obj.kind {
        Kind::VirtualService => virtual_service::validate(obj, &mut report),
        Kind::DestinationRule => destination_rule::validate(obj, &mut report),
        Kind::ServiceEntry => service_entry::validate(obj, &mut report),
        Kind::Gateway => gateway::validate(obj, &mut report),
        Kind::Sidecar => sidecar::validate(obj, &mut report),
        Kind::WorkloadEntry => workload_entry::validate(obj, &mut report),
        Kind::PeerAuthentication => peer_authentication::validate(obj, &mut report),
        Kind::AuthorizationPolicy => authorization_policy::validate(obj, &mut report),
        Kind::RequestAuthentication => request_authentication::validate(obj, &mut report),
        Kind::ServiceEndpoints => service_endpoints::validate(obj, &mut report),
        Kind::EnvoyFilter => envoy_filter::validate(obj, &mut report),
        Kind::WorkloadGroup => workload_group::validate(obj, &mut report),
        Kind::ProxyConfig => proxy_config::validate(obj, &mut report),
        Kind::Telemetry => telemetry::validate(obj, &mut report),
        Kind::WasmPlugin => wasm_plugin::validate(obj, &mut report),
        Kind::TrafficExtension => traffic_extension::validate(obj, &mut report),
        Kind::MeshConfig => mesh_config::validate(obj, &mut report),
        Kind::JsonWebKeySet => json_web_key_set::validate(obj, &mut report),
        Kind::ImagePullSecret => wasm_plugin::validate_image_pull_secret(obj, &mut report),
    }
    report
}

/// Parses the spec into its model; a parse error is recorded and ends validation of the object.
pub fn parse<T: DeserializeOwned>(obj: &Object, report: &mut Report) -> Option<T> {
    match pasa_istio::parse_spec(&obj.spec) {
        Ok(spec) => Some(spec),
        Err(e) => {
            report.errors.push(e.into());
            None
        }
    }
}

/// Validates a `security.istio.io/v1` object of `kind` with `spec`, named `bar/p`: for the
/// security kinds' unit tests.
#[cfg(test)]
pub(crate) fn check_security(kind: &str, spec: serde_json::Value) -> Report {
    let obj = Object::from_json(
        &serde_json::json!({
        "apiVersion": "security.istio.io/v1", "kind": kind,
        "metadata": {"name": "p", "namespace": "bar"}, "spec": spec}),
        "default",
        pasa_istio::generated::is_generated_object,
    )
    .expect("a sound object");
    validate(&obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_read_like_kubectl_explain() {
        let p = Path::spec().field("http").index(0).field("route").index(1);
        assert_eq!(p.field("weight").as_str(), "spec.http[0].route[1].weight");
        assert_eq!(
            Path::root("metadata").field("labels").key("app").as_str(),
            "metadata.labels[app]"
        );
    }
}
