//! The agent's `/config_dump`, read back: for one generator, every resource it serves, as the
//! protobuf `Any` it was sent in and decoded to its Envoy type.
//!
//! The document is `{"revision", "generators": {"<generator>": {"CDS"|"EDS"|"LDS"|"RDS":
//! [{"name", "version", "type_url", "resource": base64 of the protobuf encoding}]}}}`.

use base64::Engine as _;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use serde_json::Value;

/// A `/config_dump` that cannot be read; the message names the field at fault.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("the agent's /config_dump is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("the agent's /config_dump has no field generators; is the agent up to date?")]
    NoGenerators,
    #[error(
        "the agent has generated nothing for {generator} clients yet (it has: {available}); try --generator"
    )]
    NoSuchGenerator {
        generator: String,
        available: String,
    },
    #[error("the agent's /config_dump field {field}: {problem}")]
    Field { field: String, problem: String },
}

/// One served resource: its name, as sent, and decoded.
#[derive(Debug, Clone)]
pub struct Served<T> {
    pub name: String,
    pub any: Any,
    pub message: T,
}

/// What the agent serves to one generator's clients.
#[derive(Debug, Clone, Default)]
pub struct Resources {
    pub clusters: Vec<Served<Cluster>>,
    pub endpoints: Vec<Served<ClusterLoadAssignment>>,
    pub listeners: Vec<Served<Listener>>,
    pub routes: Vec<Served<RouteConfiguration>>,
}

impl Resources {
    /// Reads the resources of `generator` from the text of a `/config_dump`.
    pub fn from_dump(text: &[u8], generator: &str) -> Result<Resources, DumpError> {
        let doc: Value = serde_json::from_slice(text).map_err(DumpError::NotJson)?;
        let generators = doc
            .get("generators")
            .and_then(Value::as_object)
            .ok_or(DumpError::NoGenerators)?;
        let Some(types) = generators.get(generator) else {
            let available: Vec<&str> = generators.keys().map(String::as_str).collect();
            return Err(DumpError::NoSuchGenerator {
                generator: generator.to_string(),
                available: if available.is_empty() {
                    "nothing".into()
                } else {
                    available.join(", ")
                },
            });
        };
        let field = |kind: &str| format!("generators.{generator}.{kind}");
        Ok(Resources {
            clusters: read(types, "CDS", &field("CDS"))?,
            endpoints: read(types, "EDS", &field("EDS"))?,
            listeners: read(types, "LDS", &field("LDS"))?,
            routes: read(types, "RDS", &field("RDS"))?,
        })
    }
}

fn read<T: Message + Default>(
    types: &Value,
    kind: &str,
    field: &str,
) -> Result<Vec<Served<T>>, DumpError> {
    let Some(list) = types.get(kind) else {
        return Ok(Vec::new());
    };
    let list = list.as_array().ok_or_else(|| DumpError::Field {
        field: field.to_string(),
        problem: "not a list".into(),
    })?;
    let base64 = base64::engine::general_purpose::STANDARD;
    let mut out = Vec::with_capacity(list.len());
    for (i, entry) in list.iter().enumerate() {
        let text = |name: &str| -> Result<&str, DumpError> {
            entry
                .get(name)
                .and_then(Value::as_str)
                .ok_or_else(|| DumpError::Field {
                    field: format!("{field}[{i}].{name}"),
                    problem: "missing or not a string".into(),
                })
        };
        let name = text("name")?.to_string();
        let type_url = text("type_url")?.to_string();
        let value = base64
            .decode(text("resource")?)
            .map_err(|e| DumpError::Field {
                field: format!("{field}[{i}].resource"),
                problem: format!("not base64: {e}"),
            })?;
        let message = T::decode(value.as_slice()).map_err(|e| DumpError::Field {
            field: format!("{field}[{i}].resource"),
            problem: format!("not a {type_url}: {e}"),
        })?;
        out.push(Served {
            name,
            any: Any { type_url, value },
            message,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::util::pack_any;
    use serde_json::json;

    fn entry(cluster: Cluster) -> Value {
        let any = pack_any(cluster.clone());
        json!({
            "name": cluster.name,
            "version": "1",
            "type_url": any.type_url,
            "resource": base64::engine::general_purpose::STANDARD.encode(&any.value),
        })
    }

    #[test]
    fn resources_of_the_generator_asked_for() {
        let cluster = Cluster {
            name: "outbound|9080||reviews.default.svc.cluster.local".into(),
            ..Default::default()
        };
        let doc =
            json!({"revision": 3, "generators": {"envoy": {"CDS": [entry(cluster)], "EDS": []}}});
        let text = doc.to_string();
        let resources = Resources::from_dump(text.as_bytes(), "envoy").unwrap();
        assert_eq!(resources.clusters.len(), 1);
        assert_eq!(
            resources.clusters[0].message.name,
            "outbound|9080||reviews.default.svc.cluster.local"
        );
        assert!(resources.listeners.is_empty());

        let e = Resources::from_dump(text.as_bytes(), "grpc").unwrap_err();
        assert!(
            e.to_string()
                .contains("nothing for grpc clients yet (it has: envoy)"),
            "{e}"
        );
    }

    #[test]
    fn a_damaged_dump_names_the_field() {
        let doc = json!({"generators": {"envoy": {"CDS": [{"name": "a", "type_url": "t", "resource": "%%"}]}}});
        let e = Resources::from_dump(doc.to_string().as_bytes(), "envoy").unwrap_err();
        assert!(
            e.to_string()
                .contains("generators.envoy.CDS[0].resource: not base64"),
            "{e}"
        );
        let e = Resources::from_dump(b"{}", "envoy").unwrap_err();
        assert!(matches!(e, DumpError::NoGenerators));
    }
}
