//! Pieces of protobuf JSON every model uses: durations and open enums.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A `google.protobuf.Duration` as protobuf JSON writes it: `"5s"`, `"0.001s"`, `"-1s"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration {
    /// Whole seconds; negative for negative durations.
    pub seconds: i64,
    /// Fraction in nanoseconds, with the sign of `seconds` (protobuf's convention).
    pub nanos: i32,
}

/// The largest magnitude protobuf allows for a duration (10,000 years).
const MAX_DURATION_SECONDS: i64 = 315_576_000_000;

impl Duration {
    pub fn from_millis(millis: i64) -> Self {
        Duration {
            seconds: millis / 1000,
            nanos: ((millis % 1000) * 1_000_000) as i32,
        }
    }

    /// The whole duration in nanoseconds.
    pub fn as_nanos(&self) -> i128 {
        i128::from(self.seconds) * 1_000_000_000 + i128::from(self.nanos)
    }

    pub fn is_negative(&self) -> bool {
        self.as_nanos() < 0
    }

    /// The duration as a std one; `None` when negative.
    pub fn to_std(&self) -> Option<std::time::Duration> {
        (!self.is_negative()).then(|| {
            std::time::Duration::new(self.seconds.unsigned_abs(), self.nanos.unsigned_abs())
        })
    }

    /// Parses protobuf JSON's form: optional `-`, seconds, optional fraction of up to 9 digits, `s`.
    pub fn parse(text: &str) -> Result<Duration, String> {
        let bad = || {
            format!(
                "invalid duration {text:?}: expected seconds with an \"s\" suffix, as in \"5s\" or \"0.25s\""
            )
        };
        // Kubernetes' CRD schema lets Go's units through (`300ms`, `1m`), but istiod reads the
        // field as protobuf JSON and refuses them: say what to write instead.
        if let Some(go) = pasa_proto::duration::parse(text)
            .ok()
            .filter(|_| !text.ends_with('s') || text.ends_with("ms"))
        {
            let suggestion = Duration {
                seconds: i64::try_from(go.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(go.subsec_nanos()).unwrap_or(0),
            };
            return Err(format!(
                "invalid duration {text:?}: istiod reads durations as protobuf JSON, seconds \
                 with an \"s\" suffix; write \"{suggestion}\""
            ));
        }
        let body = text.strip_suffix('s').ok_or_else(bad)?;
        let (negative, body) = match body.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, body),
        };
        let (whole, fraction) = match body.split_once('.') {
            Some((w, f)) => (w, Some(f)),
            None => (body, None),
        };
        if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let seconds: i64 = whole.parse().map_err(|_| bad())?;
        let mut nanos: i32 = 0;
        if let Some(f) = fraction {
            if f.is_empty() || f.len() > 9 || !f.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            nanos = format!("{f:0<9}").parse().map_err(|_| bad())?;
        }
        if seconds > MAX_DURATION_SECONDS {
            return Err(format!(
                "duration {text:?} is out of range (at most 10000 years)"
            ));
        }
        Ok(if negative {
            Duration {
                seconds: -seconds,
                nanos: -nanos,
            }
        } else {
            Duration { seconds, nanos }
        })
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.is_negative() { "-" } else { "" };
        let (s, n) = (self.seconds.unsigned_abs(), self.nanos.unsigned_abs());
        if n == 0 {
            write!(f, "{sign}{s}s")
        } else if n % 1_000_000 == 0 {
            write!(f, "{sign}{s}.{:03}s", n / 1_000_000)
        } else if n % 1_000 == 0 {
            write!(f, "{sign}{s}.{:06}s", n / 1_000)
        } else {
            write!(f, "{sign}{s}.{n:09}s")
        }
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DurationVisitor;
        impl Visitor<'_> for DurationVisitor {
            type Value = Duration;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration string such as \"5s\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
                Duration::parse(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(DurationVisitor)
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// A `uint64` field: protobuf JSON writes it as a string but accepts a number too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct U64(pub u64);

impl<'de> Deserialize<'de> for U64 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct U64Visitor;
        impl Visitor<'_> for U64Visitor {
            type Value = U64;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an unsigned 64-bit integer (number or decimal string)")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<U64, E> {
                Ok(U64(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<U64, E> {
                u64::try_from(v).map(U64).map_err(|_| {
                    E::custom(format!("{v} is negative: expected an unsigned integer"))
                })
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<U64, E> {
                v.parse()
                    .map(U64)
                    .map_err(|_| E::custom(format!("{v:?} is not an unsigned integer")))
            }
        }
        deserializer.deserialize_any(U64Visitor)
    }
}

impl Serialize for U64 {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

/// Visitor body shared by every [`proto_enum!`] type: a value name, or a number (protobuf enums are
/// open, so a number without a name is kept).
#[doc(hidden)]
pub fn visit_enum_number<E: de::Error>(v: i64, type_name: &str) -> Result<i32, E> {
    i32::try_from(v).map_err(|_| E::custom(format!("{v} is out of range for enum {type_name}")))
}

/// Declares a protobuf enum read from its value name or number. Numbers without a name are kept
/// as `Unknown(n)` (protobuf enums are open); validation decides whether they are allowed.
///
/// ```ignore
/// proto_enum! {
///     /// Doc.
///     pub enum Resolution { None = 0 => "NONE", Static = 1 => "STATIC", Dns = 2 => "DNS" }
/// }
/// ```
#[macro_export]
macro_rules! proto_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident {
        $($(#[$vmeta:meta])* $variant:ident = $num:literal => $text:literal),+ $(,)?
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $($(#[$vmeta])* $variant,)+
            /// A number the schema does not name.
            Unknown(i32),
        }

        impl $name {
            /// Every named value, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            /// The value's name as the API writes it (`None` for an unnamed number).
            pub fn name(&self) -> Option<&'static str> {
                match self {
                    $($name::$variant => Some($text),)+
                    $name::Unknown(_) => None,
                }
            }

            pub fn number(&self) -> i32 {
                match self {
                    $($name::$variant => $num,)+
                    $name::Unknown(n) => *n,
                }
            }

            pub fn from_name(name: &str) -> Option<Self> {
                match name {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }

            pub fn from_number(n: i32) -> Self {
                match n {
                    $($num => $name::$variant,)+
                    other => $name::Unknown(other),
                }
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name::from_number(0)
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(n),
                    None => write!(f, "{}", self.number()),
                }
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct EnumVisitor;
                impl ::serde::de::Visitor<'_> for EnumVisitor {
                    type Value = $name;
                    fn expecting(&self, f: &mut ::std::fmt::Formatter) -> ::std::fmt::Result {
                        write!(f, "one of {}", $name::NAMES.join(", "))
                    }
                    fn visit_str<E: ::serde::de::Error>(self, v: &str) -> Result<$name, E> {
                        $name::from_name(v).ok_or_else(|| {
                            E::custom(format!(
                                "unknown value {v:?}: expected one of {}",
                                $name::NAMES.join(", ")
                            ))
                        })
                    }
                    fn visit_i64<E: ::serde::de::Error>(self, v: i64) -> Result<$name, E> {
                        $crate::common::visit_enum_number(v, stringify!($name))
                            .map($name::from_number)
                    }
                    fn visit_u64<E: ::serde::de::Error>(self, v: u64) -> Result<$name, E> {
                        self.visit_i64(i64::try_from(v).unwrap_or(i64::MAX))
                    }
                }
                d.deserialize_any(EnumVisitor)
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                match self.name() {
                    Some(n) => s.serialize_str(n),
                    None => s.serialize_i32(self.number()),
                }
            }
        }
    };
}

/// Refuses a `oneof` given more than one member, as protobuf JSON does. `members` names every
/// member of the oneof with whether it is set.
pub(crate) fn check_oneof(oneof: &str, members: &[(&str, bool)]) -> Result<(), String> {
    let set: Vec<&str> = members
        .iter()
        .filter_map(|(name, present)| present.then_some(*name))
        .collect();
    if set.len() <= 1 {
        return Ok(());
    }
    let all: Vec<&str> = members.iter().map(|(name, _)| *name).collect();
    Err(format!(
        "only one of {} may be set in {oneof}, found {}",
        all.join(", "),
        set.join(" and ")
    ))
}

/// gRPC status names as Istio's API spells them (`grpcStatus` of a fault abort); a name's
/// position is its status code.
pub const GRPC_STATUS_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The status code of a gRPC status name.
pub fn grpc_status_code(name: &str) -> Option<u32> {
    GRPC_STATUS_NAMES
        .iter()
        .position(|c| *c == name)
        .map(|i| i as u32)
}

/// `PortSelector`: a port of the destination service, by number.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PortSelector {
    #[serde(default)]
    pub number: u32,
}

/// A port as Gateway servers (`Port`), ServiceEntries (`ServicePort`) and Sidecar listeners
/// (`SidecarPort`) declare it: the same four fields in all three APIs.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Port {
    #[serde(default)]
    pub number: u32,
    /// `HTTP`, `HTTPS`, `GRPC`, `GRPC-WEB`, `HTTP2`, `MONGO`, `TCP`, `TLS`, ... (any case); empty
    /// means detect.
    #[serde(default)]
    pub protocol: String,
    /// The port's name (a DNS label).
    #[serde(default)]
    pub name: String,
    /// Where the workload receives, when different from `number` (0: the same). Ignored by
    /// gateways and sidecars.
    #[serde(default)]
    pub target_port: u32,
}

/// The application protocols Istio knows by port name or `protocol` field (matched without case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Grpc,
    GrpcWeb,
    Http,
    HttpProxy,
    Http2,
    Https,
    Tls,
    Mongo,
    Redis,
    MySql,
}

impl Protocol {
    /// The protocol a name means, as istiod reads it; `None` for a name it does not support.
    pub fn parse(name: &str) -> Option<Protocol> {
        Some(match name.to_ascii_lowercase().as_str() {
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            "grpc" => Protocol::Grpc,
            "grpc-web" => Protocol::GrpcWeb,
            "http" => Protocol::Http,
            "http_proxy" => Protocol::HttpProxy,
            "http2" => Protocol::Http2,
            "https" => Protocol::Https,
            "tls" => Protocol::Tls,
            "mongo" => Protocol::Mongo,
            "redis" => Protocol::Redis,
            "mysql" => Protocol::MySql,
            _ => return None,
        })
    }

    /// HTTP of any version (gRPC included): routed by HTTP routes.
    pub fn is_http(self) -> bool {
        matches!(
            self,
            Protocol::Http
                | Protocol::Http2
                | Protocol::Grpc
                | Protocol::GrpcWeb
                | Protocol::HttpProxy
        )
    }

    /// gRPC (and gRPC-Web).
    pub fn is_grpc(self) -> bool {
        matches!(self, Protocol::Grpc | Protocol::GrpcWeb)
    }

    /// Carried over TLS from the client's point of view (routed by SNI, not by HTTP).
    pub fn is_tls(self) -> bool {
        matches!(self, Protocol::Https | Protocol::Tls)
    }

    /// Raw TCP-level protocols.
    pub fn is_tcp(self) -> bool {
        matches!(
            self,
            Protocol::Tcp
                | Protocol::Https
                | Protocol::Tls
                | Protocol::Mongo
                | Protocol::Redis
                | Protocol::MySql
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proto_enum! {
        /// Test enum.
        pub enum Mode { Off = 0 => "OFF", On = 1 => "ON" }
    }

    #[test]
    fn durations_parse_like_protobuf_json() {
        assert_eq!(
            Duration::parse("5s"),
            Ok(Duration {
                seconds: 5,
                nanos: 0
            })
        );
        assert_eq!(
            Duration::parse("0.001s"),
            Ok(Duration {
                seconds: 0,
                nanos: 1_000_000
            })
        );
        assert_eq!(
            Duration::parse("-1.5s"),
            Ok(Duration {
                seconds: -1,
                nanos: -500_000_000
            })
        );
        assert!(Duration::parse("-0.5s").unwrap().is_negative());
        // Go's units pass the CRD schema but not istiod: the error says what to write.
        let e = Duration::parse("300ms").unwrap_err();
        assert!(e.contains("write \"0.300s\""), "{e}");
        assert!(
            Duration::parse("2m")
                .unwrap_err()
                .contains("write \"120s\"")
        );
        for bad in [
            "5",
            "5ms",
            "s",
            ".5s",
            "1.s",
            "1.0000000001s",
            "+1s",
            "1e3s",
            "",
        ] {
            assert!(Duration::parse(bad).is_err(), "{bad:?} must be rejected");
        }
        assert_eq!(Duration::parse("1.250s").unwrap().to_string(), "1.250s");
        assert_eq!(Duration::from_millis(1500).to_string(), "1.500s");
    }

    #[test]
    fn enums_read_names_and_numbers() {
        let m: Mode = serde_json::from_str("\"ON\"").unwrap();
        assert_eq!(m, Mode::On);
        let m: Mode = serde_json::from_str("0").unwrap();
        assert_eq!(m, Mode::Off);
        let m: Mode = serde_json::from_str("7").unwrap();
        assert_eq!(m, Mode::Unknown(7));
        assert_eq!(m.to_string(), "7");
        let e = serde_json::from_str::<Mode>("\"MAYBE\"").unwrap_err();
        assert!(e.to_string().contains("expected one of OFF, ON"), "{e}");
        assert_eq!(Mode::default(), Mode::Off);
    }

    #[test]
    fn u64_reads_numbers_and_strings() {
        assert_eq!(serde_json::from_str::<U64>("\"42\"").unwrap(), U64(42));
        assert_eq!(serde_json::from_str::<U64>("42").unwrap(), U64(42));
        assert!(serde_json::from_str::<U64>("-1").is_err());
    }
}
