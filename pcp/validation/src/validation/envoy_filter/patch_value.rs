//! A patch's `value` read as the Envoy message its `applyTo` names, the way istiod reads it:
//! protobuf JSON as the legacy Go decoder (`jsonpb`) understands it — proto or JSON field names,
//! Go durations (`500ms`), integers as numbers or quoted, enum names or numbers, an `Any` with
//! its `@type` resolved — first ignoring unknown fields (a failure rejects the patch), then
//! strictly (unknown fields are warnings), and warning about filters configured by name without
//! a `typed_config`.
//!
//! PCP has no Envoy descriptors at hand here, so the reading is as deep as PCP knows the
//! messages: the fields of the patched message and of a few messages nested in it
//! ([`envoy_schema`]). Below those, a message must be a JSON object, and an `Any` whose `@type`
//! is in Envoy's removed v2 API is refused (istiod can no longer resolve those types); other
//! `@type`s are trusted.

use pasa_istio::envoy_filter::ApplyTo;
use serde_json::{Map, Value};

use super::envoy_schema::{self, EnumType, Shape, Type};
use crate::validation::{Path, Report};

/// How istiod words an `Any` whose type it cannot find.
const UNRESOLVED: &str = "could not resolve Any message type";

/// The Envoy message a patch of `apply_to` holds.
fn message_of(apply_to: ApplyTo) -> Option<&'static str> {
    Some(match apply_to {
        ApplyTo::Cluster => envoy_schema::CLUSTER,
        ApplyTo::Listener => envoy_schema::LISTENER,
        ApplyTo::RouteConfiguration => envoy_schema::ROUTE_CONFIGURATION,
        ApplyTo::FilterChain => envoy_schema::FILTER_CHAIN,
        ApplyTo::HttpFilter => envoy_schema::HTTP_FILTER,
        ApplyTo::NetworkFilter => envoy_schema::NETWORK_FILTER,
        ApplyTo::VirtualHost => envoy_schema::VIRTUAL_HOST,
        ApplyTo::HttpRoute => envoy_schema::HTTP_ROUTE,
        ApplyTo::ExtensionConfig => envoy_schema::EXTENSION_CONFIG,
        ApplyTo::Bootstrap => envoy_schema::BOOTSTRAP,
        ApplyTo::ListenerFilter => envoy_schema::LISTENER_FILTER,
        ApplyTo::Invalid | ApplyTo::Unknown(_) => return None,
    })
}

/// Checks `value`, the value of a patch of `apply_to`, found at `at`.
pub(super) fn validate(
    apply_to: ApplyTo,
    value: &Map<String, Value>,
    at: &Path,
    report: &mut Report,
) {
    let Some(message) = message_of(apply_to) else {
        report.error(
            at,
            format!("Envoy filter: unknown object type for applyTo {apply_to}"),
        );
        return;
    };
    let mut reading = Reading::default();
    reading.fields(message, value, at, true);
    if !reading.errors.is_empty() {
        for (here, e) in reading.errors {
            let e = format!("Envoy filter: {e}");
            let e = if !e.contains(UNRESOLVED) {
                e
            } else if e.contains(".v2.") {
                format!("referenced type unknown (hint: try using the v3 XDS API): {e}")
            } else {
                format!("referenced type unknown: {e}")
            };
            report.error(&here, e);
        }
        return;
    }
    for (here, e) in reading.unknown {
        report.warn(&here, format!("Envoy filter: {e}"));
    }
    if !reading.untyped.is_empty() {
        report.warn(
            at,
            format!(
                "using deprecated types by name without typed_config; {}",
                reading.untyped.join(", ")
            ),
        );
    }
}

/// What reading a value found.
#[derive(Default)]
struct Reading {
    /// What the lenient reading refuses.
    errors: Vec<(Path, String)>,
    /// Fields the message does not have (refused by the strict reading only).
    unknown: Vec<(Path, String)>,
    /// Names of filters (and other extensions) that have a `typed_config` field but neither it
    /// nor a `config_discovery`, found through singular fields from the top.
    untyped: Vec<String>,
}

impl Reading {
    fn error(&mut self, at: &Path, message: impl Into<String>) {
        self.errors.push((at.clone(), message.into()));
    }

    /// `value` read as the message `name`; `singular` when it is reached from the top through
    /// singular fields only.
    fn message(&mut self, name: &str, value: &Value, at: &Path, singular: bool) {
        match value {
            Value::Null => {}
            Value::Object(map) => self.fields(name, map, at, singular),
            other => self.error(at, type_error(other, GO_OBJECT)),
        }
    }

    fn fields(&mut self, name: &str, map: &Map<String, Value>, at: &Path, singular: bool) {
        let Some(fields) = envoy_schema::fields(name) else {
            for (key, v) in map {
                self.scan(v, &at.field(key));
            }
            return;
        };
        let mut known: Vec<String> = Vec::with_capacity(fields.len() * 2);
        let mut has_typed_config = false;
        let mut wants_typed_config = false;
        let mut own_name = String::new();
        for field in fields {
            let json_name = pasa_istio::json_name(field.name);
            // Both names are accepted; the JSON name wins when both are given.
            let given = [json_name.as_str(), field.name]
                .into_iter()
                .find_map(|key| map.get(key).map(|v| (key, v)));
            known.push(field.name.to_string());
            known.push(json_name.clone());
            let present = given.is_some_and(|(_, v)| !v.is_null());
            match field.name {
                "typed_config" => {
                    wants_typed_config = true;
                    has_typed_config |= present;
                }
                "config_discovery" => has_typed_config |= present,
                "name" => {
                    if let Some((_, Value::String(s))) = given {
                        own_name.clone_from(s);
                    }
                }
                _ => {}
            }
            let Some((key, v)) = given.filter(|_| present) else {
                continue;
            };
            let here = at.field(key);
            match field.shape {
                Shape::One(ty) => self.value(ty, v, &here, singular),
                Shape::List(ty) => match v {
                    Value::Array(items) => {
                        for (i, item) in items.iter().enumerate() {
                            self.value(ty, item, &here.index(i), false);
                        }
                    }
                    other => self.error(&here, type_error(other, GO_LIST)),
                },
                Shape::Map(ty) => match v {
                    Value::Object(entries) => {
                        for (k, item) in entries {
                            self.value(ty, item, &here.key(k), false);
                        }
                    }
                    other => self.error(&here, type_error(other, GO_OBJECT)),
                },
            }
        }
        for key in map.keys() {
            if !known.iter().any(|k| k == key) {
                self.unknown
                    .push((at.field(key), format!("unknown field {key:?} in {name}")));
            }
        }
        if singular && wants_typed_config && !has_typed_config {
            self.untyped.push(own_name);
        }
    }

    /// One value of a field of type `ty` (a null one is left unset).
    fn value(&mut self, ty: Type, v: &Value, at: &Path, singular: bool) {
        if v.is_null() {
            return;
        }
        let checked = match ty {
            Type::Message(name) => return self.message(name, v, at, singular),
            Type::Any => return self.any(v, at, true),
            Type::Bool => expect(v.is_boolean(), v, "bool"),
            Type::String => expect(v.is_string(), v, "string"),
            Type::Bytes => match v {
                Value::String(s) => base64(s),
                other => Err(type_error(other, "[]uint8")),
            },
            Type::Int32 => integer(v, "int32", i32::MIN.into(), i32::MAX.into()),
            Type::Int64 => integer(v, "int64", i64::MIN.into(), i64::MAX.into()),
            Type::Uint32 => integer(v, "uint32", 0, u32::MAX.into()),
            Type::Uint64 => integer(v, "uint64", 0, u64::MAX.into()),
            Type::Float => float(v, "float32"),
            Type::Double => float(v, "float64"),
            Type::Enum(e) => enumeration(v, e),
            Type::Duration => match v {
                Value::String(s) => go_duration(s).map_err(|e| format!("bad Duration: {e}")),
                other => Err(type_error(other, "string")),
            },
            Type::Timestamp => match v {
                Value::String(s) => timestamp(s),
                other => Err(type_error(other, "string")),
            },
            Type::Struct => {
                expect(v.is_object(), v, GO_OBJECT).map_err(|e| format!("bad StructValue: {e}"))
            }
            Type::Value => Ok(()),
            Type::ListValue => {
                expect(v.is_array(), v, GO_LIST).map_err(|e| format!("bad ListValue: {e}"))
            }
        };
        if let Err(e) = checked {
            self.error(at, e);
        }
    }

    /// An `Any`: its `@type` and the message it names. `known` when the field is an `Any` for
    /// sure; otherwise `v` is an object of a message PCP does not know, read as an `Any` only if
    /// it names a type, and only the type is checked.
    fn any(&mut self, v: &Value, at: &Path, known: bool) {
        let map = match v {
            Value::Null => return,
            Value::Object(map) => map,
            other => return self.error(at, type_error(other, GO_OBJECT)),
        };
        let type_url = match map.get("@type") {
            Some(Value::String(url)) => url,
            Some(other) if known => {
                return self.error(at, format!("can't unmarshal Any's '@type': {other}"));
            }
            None if known => return self.error(at, "Any JSON doesn't have '@type'"),
            _ => {
                for (key, v) in map {
                    self.scan(v, &at.field(key));
                }
                return;
            }
        };
        let type_name = type_url.rsplit('/').next().unwrap_or_default();
        if !resolvable(type_name) {
            return self.error(at, format!("{UNRESOLVED}: {type_url}"));
        }
        // What the named message holds, read on its own and reported as inside this `Any`.
        let mut inner = Reading::default();
        if let Some(wrapped) = type_name
            .strip_prefix("google.protobuf.")
            .and_then(well_known)
        {
            if known {
                match map.get("value") {
                    None => return self.error(at, "Any JSON doesn't have 'value'"),
                    Some(v) => inner.value(wrapped, v, &at.field("value"), false),
                }
            }
        } else if envoy_schema::fields(type_name).is_some() && known {
            let mut payload = map.clone();
            payload.remove("@type");
            inner.fields(type_name, &payload, at, false);
        } else {
            for (key, v) in map.iter().filter(|(k, _)| *k != "@type") {
                inner.scan(v, &at.field(key));
            }
        }
        let nested = |(here, e): (Path, String)| {
            (
                here,
                format!("can't unmarshal Any nested proto {type_url}: {e}"),
            )
        };
        self.errors.extend(inner.errors.into_iter().map(nested));
        self.unknown.extend(inner.unknown.into_iter().map(nested));
    }

    /// A value inside a message PCP does not know: each object naming a `@type` is an `Any`.
    fn scan(&mut self, v: &Value, at: &Path) {
        match v {
            Value::Object(map) => {
                if map.contains_key("@type") {
                    self.any(v, at, false);
                } else {
                    for (key, v) in map {
                        self.scan(v, &at.field(key));
                    }
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.scan(item, &at.index(i));
                }
            }
            _ => {}
        }
    }
}

/// The Go types istiod's decoder reads a JSON object and a JSON list into.
const GO_OBJECT: &str = "map[string]json.RawMessage";
const GO_LIST: &str = "[]json.RawMessage";

/// Go's wording for a JSON value that does not fit the Go type it is read into.
fn type_error(v: &Value, go_type: &str) -> String {
    let kind = match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    format!("json: cannot unmarshal {kind} into Go value of type {go_type}")
}

fn expect(ok: bool, v: &Value, go_type: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(type_error(v, go_type))
    }
}

/// The message a well-known type's `Any` holds under `value`, for the types the decoder handles
/// that way.
fn well_known(name: &str) -> Option<Type> {
    Some(match name {
        "Any" => Type::Any,
        "Duration" => Type::Duration,
        "Timestamp" => Type::Timestamp,
        "Struct" => Type::Struct,
        "Value" => Type::Value,
        "ListValue" => Type::ListValue,
        "BoolValue" => Type::Bool,
        "StringValue" => Type::String,
        "BytesValue" => Type::Bytes,
        "Int32Value" => Type::Int32,
        "Int64Value" => Type::Int64,
        "UInt32Value" => Type::Uint32,
        "UInt64Value" => Type::Uint64,
        "FloatValue" => Type::Float,
        "DoubleValue" => Type::Double,
        "Empty" => Type::Message("google.protobuf.Empty"),
        _ => return None,
    })
}

/// Whether a message type name can be one istiod knows. A name that is not a dotted identifier
/// is not; nor is a type of Envoy's v2 API (`envoy.api.v2`, `envoy.config.filter.*.v2`,
/// `*.v2alpha`), which Envoy removed and istiod no longer links. Other names are trusted.
fn resolvable(name: &str) -> bool {
    let segments = || name.split('.');
    let dotted = segments()
        .all(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    let removed =
        name.starts_with("envoy.") && segments().any(|s| s == "v2" || s.starts_with("v2alpha"));
    dotted && !removed
}

/// An integer field: a JSON number or a quoted one, whole and in range. Every number istiod
/// decodes went through a `google.protobuf.Struct`, so it is a float64 first.
fn integer(v: &Value, go_type: &str, min: i128, max: i128) -> Result<(), String> {
    let out_of_type = |text: &str| {
        format!("json: cannot unmarshal number {text} into Go value of type {go_type}")
    };
    match v {
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.fract() == 0.0 && f >= min as f64 && f <= max as f64 {
                Ok(())
            } else {
                Err(out_of_type(&format_float(f)))
            }
        }
        Value::String(s) => {
            let text = s.trim();
            if let Ok(n) = text.parse::<i128>()
                && !text.starts_with('+')
            {
                return if (min..=max).contains(&n) {
                    Ok(())
                } else {
                    Err(out_of_type(text))
                };
            }
            match serde_json::from_str::<Value>(text) {
                Ok(Value::Number(_)) => Err(out_of_type(text)),
                Ok(other) => Err(type_error(&other, go_type)),
                Err(_) => Err(syntax_error(text)),
            }
        }
        other => Err(type_error(other, go_type)),
    }
}

/// A float field: a JSON number, a quoted one, or `"NaN"`, `"Infinity"`, `"-Infinity"`.
fn float(v: &Value, go_type: &str) -> Result<(), String> {
    match v {
        Value::Number(_) => Ok(()),
        Value::String(s) if matches!(s.as_str(), "NaN" | "Infinity" | "-Infinity") => Ok(()),
        Value::String(s) => match serde_json::from_str::<Value>(s.trim()) {
            Ok(Value::Number(_)) => Ok(()),
            Ok(other) => Err(type_error(&other, go_type)),
            Err(_) => Err(syntax_error(s.trim())),
        },
        other => Err(type_error(other, go_type)),
    }
}

/// Go's JSON parser on text that is not JSON.
fn syntax_error(text: &str) -> String {
    match text.chars().next() {
        None => "unexpected end of JSON input".to_string(),
        Some(c) => format!("invalid character {c:?} looking for beginning of value"),
    }
}

/// A float as Go's JSON encoder writes one.
fn format_float(f: f64) -> String {
    if f.is_finite() && (f == 0.0 || (1e-6..1e21).contains(&f.abs())) {
        format!("{f}")
    } else {
        format!("{f:e}")
    }
}

/// An enum field: one of its value names, or a number.
fn enumeration(v: &Value, e: &EnumType) -> Result<(), String> {
    const GO_ENUM: &str = "protoreflect.EnumNumber";
    match v {
        Value::String(s) if e.values.contains(&s.as_str()) => Ok(()),
        Value::String(s) => Err(format!(
            "unknown value {:?} for enum {}",
            format!("\"{s}\""),
            e.name
        )),
        Value::Number(_) => integer(v, GO_ENUM, i32::MIN.into(), i32::MAX.into()),
        other => Err(type_error(other, GO_ENUM)),
    }
}

/// Standard base64 with padding, as Go decodes `bytes` (line breaks are skipped).
fn base64(s: &str) -> Result<(), String> {
    let bytes: Vec<u8> = s.bytes().filter(|b| *b != b'\r' && *b != b'\n').collect();
    let is_symbol = |b: u8| b.is_ascii_alphanumeric() || b == b'+' || b == b'/';
    let padding = bytes.iter().rev().take_while(|b| **b == b'=').count();
    let body = bytes.len() - padding;
    let bad = |i: usize| Err(format!("illegal base64 data at input byte {i}"));
    if let Some(i) = bytes[..body].iter().position(|b| !is_symbol(*b)) {
        return bad(i);
    }
    if padding > 2 {
        return bad(body + 2);
    }
    if !bytes.len().is_multiple_of(4) {
        return bad(bytes.len() - bytes.len() % 4);
    }
    Ok(())
}

/// A duration as Go's `time.ParseDuration` reads one (see [`pasa_proto::duration::parse_go`]).
fn go_duration(text: &str) -> Result<(), String> {
    pasa_proto::duration::parse_go(text).map(|_| ())
}

/// An RFC 3339 date and time, as Go's decoder reads a `google.protobuf.Timestamp`.
fn timestamp(s: &str) -> Result<(), String> {
    let bad = || {
        Err(format!(
            "bad Timestamp: parsing time {s:?}: expected an RFC 3339 date and time such as \
             \"2006-01-02T15:04:05Z\""
        ))
    };
    let b = s.as_bytes();
    let number = |range: std::ops::Range<usize>, max: u32| {
        b.get(range.clone())
            .filter(|d| d.iter().all(u8::is_ascii_digit))
            .and_then(|_| s[range].parse::<u32>().ok())
            .is_some_and(|n| n <= max)
    };
    let shape = b.len() >= 20
        && number(0..4, 9999)
        && b[4] == b'-'
        && number(5..7, 12)
        && b[7] == b'-'
        && number(8..10, 31)
        && b[10] == b'T'
        && number(11..13, 23)
        && b[13] == b':'
        && number(14..16, 59)
        && b[16] == b':'
        && number(17..19, 59);
    if !shape {
        return bad();
    }
    let mut rest = &s[19..];
    if let Some(after) = rest.strip_prefix('.') {
        let n = after.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return bad();
        }
        rest = &after[n..];
    }
    let zone_ok = rest == "Z"
        || (rest.len() == 6
            && matches!(rest.as_bytes()[0], b'+' | b'-')
            && rest.as_bytes()[3] == b':'
            && rest[1..3].parse::<u32>().is_ok_and(|h| h < 24)
            && rest[4..6].parse::<u32>().is_ok_and(|m| m < 60));
    if zone_ok { Ok(()) } else { bad() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        for ok in [
            "0", "500ms", "1.5h", "2h45m", "-1s", "+3us", "1µs", ".5s", "1.s",
        ] {
            assert_eq!(go_duration(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("", "invalid duration"),
            ("1", "missing unit"),
            ("5 minutes", "unknown unit \" minutes\""),
            ("1d", "unknown unit \"d\""),
            ("s", "invalid duration"),
            (".s", "invalid duration"),
            ("3000000h", "invalid duration"),
        ] {
            let e = go_duration(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn integers_as_istiod_reads_them() {
        let int32 = |v: Value| integer(&v, "int32", i32::MIN.into(), i32::MAX.into());
        assert_eq!(int32(serde_json::json!(5)), Ok(()));
        assert_eq!(int32(serde_json::json!(5.0)), Ok(()));
        assert_eq!(int32(serde_json::json!("-7")), Ok(()));
        assert_eq!(
            int32(serde_json::json!(1.5)).unwrap_err(),
            "json: cannot unmarshal number 1.5 into Go value of type int32"
        );
        assert_eq!(
            int32(serde_json::json!(4294967295u32)).unwrap_err(),
            "json: cannot unmarshal number 4294967295 into Go value of type int32"
        );
        assert_eq!(
            int32(serde_json::json!(true)).unwrap_err(),
            "json: cannot unmarshal bool into Go value of type int32"
        );
        assert!(
            int32(serde_json::json!("abc"))
                .unwrap_err()
                .contains("invalid character 'a'")
        );
    }

    #[test]
    fn base64_and_timestamps() {
        assert_eq!(base64("aGVsbG8="), Ok(()));
        assert_eq!(base64(""), Ok(()));
        assert!(base64("aGVsbG8").is_err());
        assert!(base64("a*==").is_err());
        assert_eq!(timestamp("2024-01-02T03:04:05Z"), Ok(()));
        assert_eq!(timestamp("2024-01-02T03:04:05.123+02:00"), Ok(()));
        assert!(timestamp("2024-01-02 03:04:05Z").is_err());
        assert!(timestamp("yesterday").is_err());
    }

    #[test]
    fn removed_v2_types_do_not_resolve() {
        assert!(resolvable(
            "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz"
        ));
        assert!(resolvable("udpa.type.v1.TypedStruct"));
        assert!(resolvable("istio.stats.v1.PluginConfig"));
        assert!(!resolvable(
            "envoy.config.filter.network.ext_authz.v2.ExtAuthz"
        ));
        assert!(!resolvable("envoy.api.v2.Cluster"));
        assert!(!resolvable(
            "envoy.config.filter.thrift.router.v2alpha1.Router"
        ));
        assert!(!resolvable(""));
        assert!(!resolvable("not a type"));
    }

    #[test]
    fn json_names_are_lower_camel_case() {
        assert_eq!(pasa_istio::json_name("lb_policy"), "lbPolicy");
        assert_eq!(
            pasa_istio::json_name("http2_protocol_options"),
            "http2ProtocolOptions"
        );
        assert_eq!(pasa_istio::json_name("name"), "name");
    }
}
