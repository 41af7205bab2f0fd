//! The Kubernetes-style envelope of every resource (apiVersion, kind, metadata, spec): parsing
//! with field-path errors, and conversion to and from the store's `Resource` message.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

use crate::kind::Kind;
use crate::store::v1::Resource;

/// A structurally valid object, as the user wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    pub api_version: String,
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The spec exactly as written (key order preserved).
    pub spec: Value,
}

/// One structural problem, with the path of the field at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

/// Whether an object of these annotations and this name is one a controller generated under a
/// name of its own, outside DNS-1123 rules (istiod's for the Gateway API:
/// `pasa_istio::generated::is_generated_object`). The envelope takes the rule from its caller:
/// it is Istio's, and the wire does not know Istio's semantics.
pub type GeneratedName = fn(&BTreeMap<String, String>, &str) -> bool;

/// What a document claims to be, read as far as it can be, for error reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

/// Reads kind, namespace and name from a document without checking it.
pub fn identity_of(doc: &Value, default_namespace: &str) -> Identity {
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_string();
    let meta = doc.get("metadata");
    let namespace = text(meta.and_then(|m| m.get("namespace")));
    Identity {
        kind: text(doc.get("kind")),
        namespace: if namespace.is_empty() {
            default_namespace.to_string()
        } else {
            namespace
        },
        name: text(meta.and_then(|m| m.get("name"))),
    }
}

const TOP_LEVEL_FIELDS: &[&str] = &["apiVersion", "kind", "metadata", "spec", "status"];

impl Object {
    /// Parses a document. Objects without `metadata.namespace` land in `default_namespace`.
    /// A name must be a DNS-1123 subdomain unless `generated` says the object is one a controller
    /// generated under a name of its own (`pasa_istio::generated::is_generated_object`).
    /// Every structural problem is reported, each with its field path.
    pub fn from_json(
        doc: &Value,
        default_namespace: &str,
        generated: GeneratedName,
    ) -> Result<Object, Vec<FieldError>> {
        let mut errors = Vec::new();
        let Some(top) = doc.as_object() else {
            return Err(vec![FieldError::new(
                "",
                format!("a document must be a mapping, found {}", type_name(doc)),
            )]);
        };
        for key in top.keys() {
            if !TOP_LEVEL_FIELDS.contains(&key.as_str()) {
                errors.push(FieldError::new(
                    key.as_str(),
                    "unknown field: expected apiVersion, kind, metadata and spec",
                ));
            }
        }
        let api_version = required_string(top, "apiVersion", "apiVersion", &mut errors);
        let kind_field = required_string(top, "kind", "kind", &mut errors);
        let kind = kind_field.as_deref().and_then(|k| {
            let kind = Kind::from_kind_field(k);
            if kind.is_none() {
                errors.push(FieldError::new(
                    "kind",
                    format!(
                        "unknown kind {k:?}: the store keeps {}",
                        Kind::ALL.map(Kind::as_str).join(", ")
                    ),
                ));
            }
            kind
        });
        if let (Some(kind), Some(api_version)) = (kind, api_version.as_deref())
            && !kind.accepts_api_version(api_version)
        {
            errors.push(FieldError::new(
                "apiVersion",
                format!(
                    "{api_version:?} is not an API version of {kind}: expected one of {}",
                    kind.api_versions().join(", ")
                ),
            ));
        }

        let (mut namespace, mut name) = (String::new(), String::new());
        let (mut labels, mut annotations) = (BTreeMap::new(), BTreeMap::new());
        match top.get("metadata") {
            None => errors.push(FieldError::new("metadata", "required")),
            Some(Value::Object(meta)) => {
                annotations = string_map(meta, "annotations", &mut errors);
                if let Some(n) = required_string(meta, "name", "metadata.name", &mut errors) {
                    // istiod names what it generates from the Gateway API with `~`, which no
                    // Kubernetes name holds; the store keeps those names as istiod shows them.
                    if !generated(&annotations, &n)
                        && let Err(msg) = check_dns1123_subdomain(&n)
                    {
                        errors.push(FieldError::new("metadata.name", msg));
                    }
                    name = n;
                }
                namespace = match meta.get("namespace") {
                    None | Some(Value::Null) => default_namespace.to_string(),
                    Some(Value::String(ns)) if ns.is_empty() => default_namespace.to_string(),
                    Some(Value::String(ns)) => ns.clone(),
                    Some(other) => {
                        errors.push(FieldError::new(
                            "metadata.namespace",
                            format!("must be a string, found {}", type_name(other)),
                        ));
                        String::new()
                    }
                };
                if !namespace.is_empty()
                    && let Err(msg) = check_dns1123_label(&namespace)
                {
                    errors.push(FieldError::new("metadata.namespace", msg));
                }
                labels = string_map(meta, "labels", &mut errors);
            }
            Some(other) => errors.push(FieldError::new(
                "metadata",
                format!("must be a mapping, found {}", type_name(other)),
            )),
        }

        let spec = match top.get("spec") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(spec @ Value::Object(_)) => spec.clone(),
            Some(other) => {
                errors.push(FieldError::new(
                    "spec",
                    format!("must be a mapping, found {}", type_name(other)),
                ));
                Value::Null
            }
        };

        match (errors.is_empty(), kind, api_version) {
            (true, Some(kind), Some(api_version)) => Ok(Object {
                api_version,
                kind,
                namespace,
                name,
                labels,
                annotations,
                spec,
            }),
            _ => Err(errors),
        }
    }

    /// The object as a Kubernetes-style document (`apiVersion`, `kind`, `metadata` with its
    /// name, namespace and any labels and annotations, `spec`), as `apply` takes it.
    pub fn to_document(&self) -> Value {
        let mut metadata = Map::new();
        metadata.insert("name".into(), self.name.clone().into());
        metadata.insert("namespace".into(), self.namespace.clone().into());
        for (key, map) in [("labels", &self.labels), ("annotations", &self.annotations)] {
            if !map.is_empty() {
                let entries = map
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())));
                metadata.insert(key.into(), Value::Object(entries.collect()));
            }
        }
        let mut out = Map::new();
        out.insert("apiVersion".into(), self.api_version.clone().into());
        out.insert("kind".into(), self.kind.as_str().into());
        out.insert("metadata".into(), Value::Object(metadata));
        out.insert("spec".into(), self.spec.clone());
        Value::Object(out)
    }

    /// The store message for this object; the store fills revisions and index keys.
    pub fn to_resource(&self) -> Resource {
        Resource {
            api_version: self.api_version.clone(),
            kind: self.kind.as_str().to_string(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            labels: self.labels.clone().into_iter().collect(),
            annotations: self.annotations.clone().into_iter().collect(),
            spec_json: self.spec.to_string(),
            ..Default::default()
        }
    }
}

/// The manifest of a stored resource, as `pasactl get -o yaml` prints it. `metadata.resourceVersion`
/// is the resource's mod_revision and `metadata.generation` its version, as in Kubernetes.
pub fn manifest(resource: &Resource) -> Value {
    let mut meta = Map::new();
    meta.insert("name".into(), resource.name.clone().into());
    meta.insert("namespace".into(), resource.namespace.clone().into());
    let sorted = |m: &std::collections::HashMap<String, String>| {
        let sorted: BTreeMap<_, _> = m.iter().collect();
        Value::Object(
            sorted
                .into_iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect(),
        )
    };
    if !resource.labels.is_empty() {
        meta.insert("labels".into(), sorted(&resource.labels));
    }
    if !resource.annotations.is_empty() {
        meta.insert("annotations".into(), sorted(&resource.annotations));
    }
    meta.insert(
        "resourceVersion".into(),
        resource.mod_revision.to_string().into(),
    );
    meta.insert("generation".into(), resource.version.into());
    let spec = serde_json::from_str(&resource.spec_json).unwrap_or(Value::Null);
    let mut out = Map::new();
    out.insert("apiVersion".into(), resource.api_version.clone().into());
    out.insert("kind".into(), resource.kind.clone().into());
    out.insert("metadata".into(), Value::Object(meta));
    out.insert("spec".into(), spec);
    Value::Object(out)
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

fn required_string(
    map: &Map<String, Value>,
    key: &str,
    path: &str,
    errors: &mut Vec<FieldError>,
) -> Option<String> {
    match map.get(key) {
        None | Some(Value::Null) => {
            errors.push(FieldError::new(path, "required"));
            None
        }
        Some(Value::String(s)) if s.is_empty() => {
            errors.push(FieldError::new(path, "required"));
            None
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            errors.push(FieldError::new(
                path,
                format!("must be a string, found {}", type_name(other)),
            ));
            None
        }
    }
}

fn string_map(
    meta: &Map<String, Value>,
    key: &str,
    errors: &mut Vec<FieldError>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    match meta.get(key) {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (k, v) in map {
                match v {
                    Value::String(s) => {
                        out.insert(k.clone(), s.clone());
                    }
                    other => errors.push(FieldError::new(
                        format!("metadata.{key}.{k}"),
                        format!(
                            "must be a string, found {} (quote it in YAML)",
                            type_name(other)
                        ),
                    )),
                }
            }
        }
        Some(other) => errors.push(FieldError::new(
            format!("metadata.{key}"),
            format!("must be a mapping, found {}", type_name(other)),
        )),
    }
    out
}

/// Checks a Kubernetes namespace-style name (RFC 1123 label).
pub fn check_dns1123_label(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err(format!("{s:?} is longer than 63 characters"));
    }
    let bytes = s.as_bytes();
    let ok_inner = bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    let alnum = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !ok_inner || !alnum(bytes.first()) || !alnum(bytes.last()) {
        return Err(format!(
            "{s:?} must be a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// Checks a name a user may give an object: a DNS-1123 subdomain, as Kubernetes requires.
pub fn check_name(name: &str) -> Result<(), String> {
    check_dns1123_subdomain(name)
}

fn check_dns1123_subdomain(s: &str) -> Result<(), String> {
    if s.len() > 253 {
        return Err(format!("{s:?} is longer than 253 characters"));
    }
    if s.split('.').all(|label| check_dns1123_label(label).is_ok()) {
        Ok(())
    } else {
        Err(format!(
            "{s:?} must be a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', each part starting and ending with a letter or digit"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// No names beyond DNS rules.
    fn none(_: &BTreeMap<String, String>, _: &str) -> bool {
        false
    }

    #[test]
    fn parses_a_virtual_service() {
        let doc = json!({
            "apiVersion": "networking.istio.io/v1beta1",
            "kind": "VirtualService",
            "metadata": {"name": "reviews", "labels": {"app": "reviews"}},
            "spec": {"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}}]}]}
        });
        let obj = Object::from_json(&doc, "default", none).unwrap();
        assert_eq!(obj.kind, Kind::VirtualService);
        assert_eq!(obj.namespace, "default");
        assert_eq!(obj.labels.get("app").map(String::as_str), Some("reviews"));
        let res = obj.to_resource();
        assert_eq!(
            res.spec_json,
            r#"{"hosts":["reviews"],"http":[{"route":[{"destination":{"host":"reviews"}}]}]}"#
        );
        let back = manifest(&res);
        assert_eq!(back["spec"], doc["spec"]);
        assert_eq!(back["metadata"]["namespace"], "default");
    }

    #[test]
    fn reports_every_problem_with_its_field() {
        let doc = json!({
            "apiVersion": "networking.istio.io/v2",
            "kind": "VirtualService",
            "metadata": {"name": "Bad_Name", "namespace": 3, "labels": {"a": 1}},
            "spec": [],
            "extra": true
        });
        let errors = Object::from_json(&doc, "default", none).unwrap_err();
        let fields: Vec<_> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "extra",
                "apiVersion",
                "metadata.name",
                "metadata.namespace",
                "metadata.labels.a",
                "spec"
            ],
            "{errors:?}"
        );
        let missing = Object::from_json(&json!({"kind": "Pod"}), "default", none).unwrap_err();
        let text: Vec<_> = missing.iter().map(ToString::to_string).collect();
        assert!(
            text.contains(&"apiVersion: required".to_string()),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|t| t.starts_with("kind: unknown kind \"Pod\"")),
            "{text:?}"
        );
        assert!(text.contains(&"metadata: required".to_string()), "{text:?}");
        assert!(Object::from_json(&json!("text"), "default", none).is_err());
    }

    #[test]
    fn missing_spec_is_empty() {
        let doc = json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
            "metadata": {"name": "default", "namespace": "istio-system"}});
        let obj = Object::from_json(&doc, "default", none).unwrap();
        assert_eq!(obj.spec, json!({}));
        assert_eq!(obj.namespace, "istio-system");
    }

    #[test]
    fn a_name_outside_dns_rules_is_kept_only_where_the_caller_says_it_is_generated() {
        let doc = json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
            "metadata": {"name": "edge~gen~http", "annotations": {"a": "b"}}});
        assert!(Object::from_json(&doc, "default", none).is_err());
        let generated: GeneratedName =
            |annotations, name| annotations.contains_key("a") && name.contains('~');
        assert_eq!(
            Object::from_json(&doc, "default", generated).unwrap().name,
            "edge~gen~http"
        );
    }
}
