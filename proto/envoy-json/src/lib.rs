//! Envoy resources as protobuf JSON, as istioctl prints them (camelCase fields, defaults left
//! out, nested `Any` with their `@type`), and back: `pasactl proxy-config -o json` and the
//! agent's snapshot tests print with it; the agent reads EnvoyFilter patch values with it
//! ([`encode`]) and merges them as istiod does ([`merge`]). The descriptors are envoy-types' own
//! (see `build.rs`). The whole API ([`pool`], decoded once, on first use) costs about 17 MiB of
//! memory; a process that needs only some messages (the agent, for the patches that apply to
//! its proxy) builds a pool of just those and what they import ([`pool_for`]) and drops it when
//! done.

pub mod merge;

use std::sync::{Arc, OnceLock};

use envoy_types::pb::google::protobuf::Any;
use prost_reflect::{DescriptorPool, DynamicMessage};
use serde_json::Value;

/// The encoded `FileDescriptorSet` written by `build.rs`.
const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy_descriptors.bin"));

#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    #[error("the Envoy API's descriptors do not load: {0}")]
    Descriptors(#[source] Arc<DescriptorsError>),
    #[error("a {patch} cannot be merged into a {target}: the types differ")]
    TypesDiffer { target: String, patch: String },
    #[error("{name}: no Envoy descriptor for {type_url}")]
    UnknownType { name: String, type_url: String },
    #[error("{name}: cannot decode it as {type_url}: {source}")]
    Decode {
        name: String,
        type_url: String,
        #[source]
        source: prost::DecodeError,
    },
    #[error(
        "{name}: cannot read it as {type_url} ({source}); it may hold a type Envoy's API does not define"
    )]
    Read {
        name: String,
        type_url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{name}: cannot print it as JSON ({source}); it may hold a type Envoy's API does not define"
    )]
    Print {
        name: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Why the descriptors built into PASA do not load: a defect of the build (rebuild PASA; report
/// it if it persists).
#[derive(Debug, thiserror::Error)]
pub enum DescriptorsError {
    #[error("{0}")]
    Decode(#[source] prost::DecodeError),
    #[error("{0}")]
    Pool(#[source] prost_reflect::DescriptorError),
}

impl From<DescriptorsError> for JsonError {
    fn from(e: DescriptorsError) -> Self {
        JsonError::Descriptors(Arc::new(e))
    }
}

/// A pool of the messages `type_names` name (full names, such as
/// `envoy.config.cluster.v3.Cluster`) and of everything their files import; names the API does
/// not define are left out (looking them up in the pool then fails, naming them).
pub fn pool_for<'a>(
    type_names: impl IntoIterator<Item = &'a str>,
) -> Result<DescriptorPool, JsonError> {
    use std::collections::{BTreeMap, BTreeSet};
    let set = descriptor_set()?;
    let by_name: BTreeMap<&str, usize> = set
        .file
        .iter()
        .enumerate()
        .map(|(i, f)| (f.name(), i))
        .collect();
    // The file defining each top-level message and enum, by full name.
    let mut defined: BTreeMap<String, usize> = BTreeMap::new();
    for (i, f) in set.file.iter().enumerate() {
        let names = f.message_type.iter().map(|m| m.name());
        for n in names.chain(f.enum_type.iter().map(|e| e.name())) {
            defined.insert(format!("{}.{n}", f.package()), i);
        }
    }
    // A nested type is defined in its outermost message's file.
    let file_of = |name: &str| {
        let mut at = name;
        loop {
            if let Some(&i) = defined.get(at) {
                return Some(i);
            }
            at = &at[..at.rfind('.')?];
        }
    };
    // The files wanted, dependencies first.
    fn visit(
        i: usize,
        set: &prost_types::FileDescriptorSet,
        by_name: &BTreeMap<&str, usize>,
        seen: &mut BTreeSet<usize>,
        order: &mut Vec<usize>,
    ) {
        if !seen.insert(i) {
            return;
        }
        for dep in &set.file[i].dependency {
            if let Some(&d) = by_name.get(dep.as_str()) {
                visit(d, set, by_name, seen, order);
            }
        }
        order.push(i);
    }
    let (mut seen, mut order) = (BTreeSet::new(), Vec::new());
    for name in type_names {
        if let Some(i) = file_of(name) {
            visit(i, &set, &by_name, &mut seen, &mut order);
        }
    }
    let mut files: Vec<Option<prost_types::FileDescriptorProto>> =
        set.file.into_iter().map(Some).collect();
    let wanted = prost_types::FileDescriptorSet {
        file: order.into_iter().filter_map(|i| files[i].take()).collect(),
    };
    DescriptorPool::from_file_descriptor_set(wanted).map_err(|e| DescriptorsError::Pool(e).into())
}

/// The Envoy API's files, and those of Istio's proxy's own filters (see
/// [`pasa_proto::istio_proxy`]) but for the ones the Envoy API already has.
fn descriptor_set() -> Result<prost_types::FileDescriptorSet, DescriptorsError> {
    use prost::Message as _;
    let decode = |bytes: &[u8]| {
        prost_types::FileDescriptorSet::decode(bytes).map_err(DescriptorsError::Decode)
    };
    let mut set = decode(DESCRIPTORS)?;
    let known: std::collections::BTreeSet<String> =
        set.file.iter().map(|f| f.name().to_string()).collect();
    let istio = decode(pasa_proto::istio_proxy::DESCRIPTORS)?;
    set.file
        .extend(istio.file.into_iter().filter(|f| !known.contains(f.name())));
    Ok(set)
}

/// The whole Envoy API's descriptors, with those of Istio's proxy's own filters.
pub fn pool() -> Result<&'static DescriptorPool, JsonError> {
    static POOL: OnceLock<Result<DescriptorPool, Arc<DescriptorsError>>> = OnceLock::new();
    POOL.get_or_init(|| {
        descriptor_set()
            .and_then(|set| {
                DescriptorPool::from_file_descriptor_set(set).map_err(DescriptorsError::Pool)
            })
            .map_err(Arc::new)
    })
    .as_ref()
    .map_err(|e| JsonError::Descriptors(Arc::clone(e)))
}

/// The resource `name`, sent as `any`, as protobuf JSON.
pub fn to_json(name: &str, any: &Any) -> Result<Value, JsonError> {
    let type_name = any.type_url.rsplit('/').next().unwrap_or_default();
    let descriptor =
        pool()?
            .get_message_by_name(type_name)
            .ok_or_else(|| JsonError::UnknownType {
                name: name.to_string(),
                type_url: any.type_url.clone(),
            })?;
    let message = DynamicMessage::decode(descriptor, any.value.as_slice()).map_err(|source| {
        JsonError::Decode {
            name: name.to_string(),
            type_url: any.type_url.clone(),
            source,
        }
    })?;
    serde_json::to_value(&message).map_err(|source| JsonError::Print {
        name: name.to_string(),
        source,
    })
}

/// `value`, protobuf JSON of the message `type_name` (such as `envoy.config.cluster.v3.Cluster`),
/// encoded with the descriptors of `pool`; fields the message does not have are ignored, as
/// istiod ignores them in an EnvoyFilter's patch values. `name` says what is read, for errors.
pub fn encode(
    pool: &DescriptorPool,
    name: &str,
    type_name: &str,
    value: &Value,
) -> Result<Vec<u8>, JsonError> {
    let descriptor = pool
        .get_message_by_name(type_name)
        .ok_or_else(|| JsonError::UnknownType {
            name: name.to_string(),
            type_url: type_name.to_string(),
        })?;
    let mut value = value.clone();
    go_durations(pool, &descriptor, &mut value);
    read(name, type_name, descriptor, value)
}

/// `value` read as protobuf JSON of `descriptor`'s message (fields it does not have ignored),
/// encoded; `name` and `type_url` say what is read, for errors.
fn read(
    name: &str,
    type_url: &str,
    descriptor: prost_reflect::MessageDescriptor,
    value: Value,
) -> Result<Vec<u8>, JsonError> {
    let options = prost_reflect::DeserializeOptions::new().deny_unknown_fields(false);
    let message = DynamicMessage::deserialize_with_options(descriptor, value, &options).map_err(
        |source| JsonError::Read {
            name: name.to_string(),
            type_url: type_url.to_string(),
            source,
        },
    )?;
    Ok(prost::Message::encode_to_vec(&message))
}

/// Calls `f` with every object in `value` (itself included), outer ones first.
fn each_object<'a>(value: &'a Value, f: &mut impl FnMut(&'a serde_json::Map<String, Value>)) {
    match value {
        Value::Object(m) => {
            f(m);
            m.values().for_each(|v| each_object(v, f));
        }
        Value::Array(a) => a.iter().for_each(|v| each_object(v, f)),
        _ => {}
    }
}

/// The message types the `@type`s in `value` (an `Any` anywhere in it) name, without their
/// `type.googleapis.com/` prefix.
pub fn type_names(value: &Value) -> Vec<&str> {
    let mut out = Vec::new();
    each_object(value, &mut |m| {
        if let Some(t) = m.get("@type").and_then(Value::as_str) {
            out.push(t.rsplit('/').next().unwrap_or_default());
        }
    });
    out
}

/// The types the `TypedStruct`s in `value` (protobuf JSON) configure, by full name: their
/// `type_url`s. (A TypedStruct carries JSON for a type the reader needs no descriptor of.)
pub fn typed_struct_type_names(value: &Value) -> Vec<&str> {
    let mut out = Vec::new();
    each_object(value, &mut |m| {
        let wrapper = m.get("@type").and_then(Value::as_str).is_some_and(|t| {
            t.ends_with("/udpa.type.v1.TypedStruct") || t.ends_with("/xds.type.v3.TypedStruct")
        });
        if let Some(t) = m
            .get("type_url")
            .or(m.get("typeUrl"))
            .and_then(Value::as_str)
            .filter(|_| wrapper)
        {
            out.push(t.rsplit('/').next().unwrap_or_default());
        }
    });
    out
}

/// Rewrites the durations of `value` (protobuf JSON of `message`) that are written as Go writes
/// them (`500ms`, `1m30s`), as istiod's decoder accepts them, into protobuf JSON's (`0.5s`,
/// `90s`); the rest is left as it is (what does not read fails later, named).
fn go_durations(
    pool: &DescriptorPool,
    message: &prost_reflect::MessageDescriptor,
    value: &mut Value,
) {
    use prost_reflect::Kind;
    let Value::Object(fields) = value else { return };
    let message = match fields.get("@type").and_then(Value::as_str) {
        Some(url) if message.full_name() == "google.protobuf.Any" => {
            match pool.get_message_by_name(url.rsplit('/').next().unwrap_or_default()) {
                Some(m) => m,
                None => return,
            }
        }
        _ => message.clone(),
    };
    for (key, v) in fields.iter_mut() {
        let Some(field) = message
            .get_field_by_json_name(key)
            .or_else(|| message.get_field_by_name(key))
        else {
            continue;
        };
        let Kind::Message(inner) = field.kind() else {
            continue;
        };
        let each: Vec<&mut Value> = match v {
            Value::Array(items) if field.is_list() => items.iter_mut().collect(),
            Value::Object(entries) if field.is_map() => entries.values_mut().collect(),
            other => vec![other],
        };
        let inner = if field.is_map() {
            match inner.map_entry_value_field().kind() {
                Kind::Message(m) => m,
                _ => continue,
            }
        } else {
            inner
        };
        for item in each {
            if inner.full_name() == "google.protobuf.Duration" {
                if let Value::String(text) = item
                    && !is_protobuf_duration(text)
                    && let Ok(nanos) = pasa_proto::duration::parse_go(text)
                {
                    *text = pasa_proto::duration::protobuf_json(nanos);
                }
            } else {
                go_durations(pool, &inner, item);
            }
        }
    }
}

/// Whether `text` is written as protobuf JSON writes a duration: `-?<seconds>[.<fraction>]s`.
fn is_protobuf_duration(text: &str) -> bool {
    let Some(number) = text.strip_suffix('s') else {
        return false;
    };
    let number = number.strip_prefix('-').unwrap_or(number);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, "0"));
    !whole.is_empty()
        && !fraction.is_empty()
        && whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
}

/// A resource in protobuf JSON naming its type (`@type`, as Envoy's `/config_dump` writes each
/// resource), encoded back as the `Any` it was sent as.
pub fn from_json(name: &str, value: &Value) -> Result<Any, JsonError> {
    let type_url = value
        .get("@type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let type_name = type_url.rsplit('/').next().unwrap_or_default();
    let descriptor =
        pool()?
            .get_message_by_name(type_name)
            .ok_or_else(|| JsonError::UnknownType {
                name: name.to_string(),
                type_url: type_url.clone(),
            })?;
    let mut fields = value.clone();
    if let Some(object) = fields.as_object_mut() {
        object.remove("@type");
    }
    let value = read(name, &type_url, descriptor, fields)?;
    Ok(Any { type_url, value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::core::v3::TransportSocket;
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    use envoy_types::util::pack_any;

    #[test]
    fn resources_print_with_nested_types() {
        let cluster = Cluster {
            name: "outbound|9080||reviews.default.svc.cluster.local".into(),
            transport_socket: Some(TransportSocket {
                name: "envoy.transport_sockets.tls".into(),
                config_type: Some(ConfigType::TypedConfig(pack_any(UpstreamTlsContext {
                    sni: "reviews".into(),
                    ..Default::default()
                }))),
            }),
            ..Default::default()
        };
        let any = pack_any(cluster);
        let json = to_json("c", &any).unwrap();
        // And back, as read from Envoy's own /config_dump (which names each resource's type).
        let mut named = json.clone();
        named["@type"] = Value::String(any.type_url.clone());
        assert_eq!(from_json("c", &named).unwrap(), any);
        assert_eq!(
            json["name"],
            "outbound|9080||reviews.default.svc.cluster.local"
        );
        assert_eq!(
            json["transportSocket"]["typedConfig"]["@type"],
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
        );
        assert_eq!(json["transportSocket"]["typedConfig"]["sni"], "reviews");
    }

    #[test]
    fn go_durations_in_patch_values_read_as_istiod_reads_them() {
        use envoy_types::pb::envoy::config::cluster::v3::Cluster;
        use prost::Message as _;
        let pool = pool_for(["envoy.config.cluster.v3.Cluster"]).unwrap();
        let value = serde_json::json!({"connect_timeout": "1m30.5s",
            "outlierDetection": {"interval": "2s", "base_ejection_time": "500ms"}});
        let bytes = encode(&pool, "v", "envoy.config.cluster.v3.Cluster", &value).unwrap();
        let c = Cluster::decode(bytes.as_slice()).unwrap();
        let timeout = c.connect_timeout.unwrap();
        assert_eq!((timeout.seconds, timeout.nanos), (90, 500_000_000));
        let od = c.outlier_detection.unwrap();
        assert_eq!(od.interval.unwrap().seconds, 2);
        let ejection = od.base_ejection_time.unwrap();
        assert_eq!((ejection.seconds, ejection.nanos), (0, 500_000_000));
        assert_eq!(pasa_proto::duration::protobuf_json(-1.5e9), "-1.500s");
        assert!(is_protobuf_duration("0.25s") && !is_protobuf_duration("250ms"));
    }

    #[test]
    fn a_pool_for_some_messages_holds_them_and_what_they_import_only() {
        let pool = pool_for([
            "envoy.config.cluster.v3.Cluster.CommonLbConfig",
            "example.Unknown",
        ])
        .unwrap();
        assert!(
            pool.get_message_by_name("envoy.config.cluster.v3.Cluster")
                .is_some()
        );
        assert!(
            pool.get_message_by_name("envoy.config.core.v3.Address")
                .is_some(),
            "imported"
        );
        assert!(
            pool.get_message_by_name("envoy.extensions.filters.http.lua.v3.Lua")
                .is_none(),
            "not asked for"
        );
        assert!(pool.files().count() < super::pool().unwrap().files().count() / 3);
    }

    #[test]
    fn an_unknown_type_is_named() {
        let any = Any {
            type_url: "type.googleapis.com/example.Unknown".into(),
            value: vec![],
        };
        let e = to_json("x", &any).unwrap_err();
        assert!(
            e.to_string()
                .contains("no Envoy descriptor for type.googleapis.com/example.Unknown"),
            "{e}"
        );
    }
}
