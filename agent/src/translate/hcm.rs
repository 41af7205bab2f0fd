//! What istiod sets on a proxy's HTTP connection managers beyond their routes and filters, per
//! listener class:
//!
//! - always: WebSocket upgrades, no stream idle timeout (long-lived streams stay up), 100-continue
//!   proxied, and the mesh config's `pathNormalization` (by default paths are normalized before
//!   routing and authorization, escaped slashes kept as they are);
//! - the headers the proxy writes of its own, from its settings' `proxyHeaders` (the Server
//!   header: `istio-envoy` on the inbound side and on routers, Envoy's own outbound; request IDs;
//!   `x-envoy-attempt-count`; X-Forwarded-Client-Cert and the certificate details it carries;
//!   Envoy's debug headers; X-Forwarded-Port and -Host);
//! - on a router, `gatewayTopology`: the trusted X-Forwarded-For hops, X-Forwarded-Client-Cert
//!   (SANITIZE_SET unless it says otherwise), and a PROXY protocol header to strip.
//!
//! The settings are the proxy's own (`PROXY_CONFIG`), else the mesh config's `defaultConfig`
//! (see [`crate::model::proxy::Proxy::settings`]).

use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::ForwardClientCertDetails,
    http_connection_manager::PathWithEscapedSlashesAction,
    http_connection_manager::ServerHeaderTransformation,
    http_connection_manager::SetCurrentClientCertDetails, http_connection_manager::UpgradeConfig,
    http_filter,
};
use envoy_types::pb::google::protobuf::{BoolValue, Duration};
use envoy_types::util::pack_any;
use pasa_istio::mesh_config::MeshConfig;
use pasa_istio::proxy_config::MeshProxyConfig;
use prost::Name;
use serde_json::Value;

use super::names;

/// Istio's listener classes: what a connection manager is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Class {
    SidecarInbound,
    SidecarOutbound,
    Gateway,
}

impl Class {
    /// The class of the listener `name` of a router (`router`) or a sidecar.
    pub(crate) fn of_listener(router: bool, name: &str) -> Class {
        if router {
            Class::Gateway
        } else if name == names::VIRTUAL_INBOUND {
            Class::SidecarInbound
        } else {
            Class::SidecarOutbound
        }
    }
}

/// The Server header istiod's inbound and router connection managers write.
const SERVER_NAME: &str = "istio-envoy";

/// The mesh config's `pathNormalization.normalization`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Normalization {
    None,
    Base,
    MergeSlashes,
    DecodeAndMergeSlashes,
}

/// Which certificate details X-Forwarded-Client-Cert carries: subject, URI, DNS, cert, chain.
type CertDetails = [bool; 5];

/// A connection manager's settings for one listener class.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Options {
    class: Class,
    /// The Server header written; empty for Envoy's own.
    server_name: String,
    /// The Server header is left as the upstream sent it.
    pass_through_server: bool,
    /// `Some(false)`: no request IDs generated.
    request_id: Option<bool>,
    /// X-Forwarded-Client-Cert handling; `None` keeps Envoy's (SANITIZE).
    forward_client_cert: Option<ForwardClientCertDetails>,
    set_current: Option<CertDetails>,
    /// `x-envoy-attempt-count` on requests upstream (set on virtual hosts).
    pub(crate) attempt_count: bool,
    suppress_debug_headers: bool,
    x_forwarded_port: bool,
    /// X-Forwarded-Host on routes that rewrite the authority and on the catch-all.
    pub(crate) x_forwarded_host: bool,
    trusted_hops: u32,
    /// A PROXY protocol header precedes the router's connections.
    pub(crate) proxy_protocol: bool,
    normalization: Normalization,
    /// HTTP/1 header names keep their case (`proxyHeaders.preserveHttp1HeaderCase`).
    pub(crate) preserve_case: bool,
    /// The stateful session filter, for the persistent sessions of the services routed to
    /// (see [`super::session`]): never on the inbound side.
    pub(crate) sessions: bool,
}

impl Options {
    /// The settings of `class` for a proxy with `settings` in a mesh with `mesh`'s config.
    pub(crate) fn of(
        class: Class,
        settings: &MeshProxyConfig,
        mesh: Option<&MeshConfig>,
    ) -> Options {
        let headers = settings.as_map().get("proxyHeaders");
        let disabled =
            |name: &str| bool_value(field(field(headers, name), "disabled")) == Some(true);
        let enabled = |name: &str| bool_value(field(field(headers, name), "enabled")) == Some(true);
        let server = field(headers, "server");
        let (server_name, pass_through_server) = if disabled("server") {
            (String::new(), true)
        } else {
            match field(server, "value").and_then(Value::as_str) {
                Some(value) if !value.is_empty() => (value.to_string(), false),
                _ if class == Class::SidecarOutbound => (String::new(), false),
                _ => (SERVER_NAME.to_string(), false),
            }
        };
        let (forward_client_cert, set_current, trusted_hops) = match class {
            Class::SidecarInbound => {
                let details = field(headers, "setCurrentClientCertDetails");
                let detail =
                    |name: &str, default: bool| bool_value(field(details, name)).unwrap_or(default);
                (
                    Some(
                        forward_client_cert(field(headers, "forwardedClientCert"))
                            .unwrap_or(ForwardClientCertDetails::AppendForward),
                    ),
                    Some([
                        detail("subject", true),
                        detail("uri", true),
                        detail("dns", true),
                        detail("cert", false),
                        detail("chain", false),
                    ]),
                    0,
                )
            }
            Class::SidecarOutbound => (None, None, 0),
            Class::Gateway => {
                let topology = settings.as_map().get("gatewayTopology");
                let forward = forward_client_cert(field(topology, "forwardClientCertDetails"))
                    .unwrap_or(ForwardClientCertDetails::SanitizeSet);
                let sets = matches!(
                    forward,
                    ForwardClientCertDetails::AppendForward | ForwardClientCertDetails::SanitizeSet
                );
                let hops = field(topology, "numTrustedProxies")
                    .and_then(Value::as_u64)
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(0);
                (
                    Some(forward),
                    sets.then_some([true, true, true, true, false]),
                    hops,
                )
            }
        };
        let topology = settings.as_map().get("gatewayTopology");
        let normalization = match mesh
            .and_then(|m| m.other.get("pathNormalization"))
            .and_then(|p| p.get("normalization"))
            .and_then(Value::as_str)
        {
            Some("NONE") => Normalization::None,
            Some("MERGE_SLASHES") => Normalization::MergeSlashes,
            Some("DECODE_AND_MERGE_SLASHES") => Normalization::DecodeAndMergeSlashes,
            _ => Normalization::Base,
        };
        Options {
            class,
            server_name,
            pass_through_server,
            request_id: disabled("requestId").then_some(false),
            forward_client_cert,
            set_current,
            // istiod's inbound virtual hosts leave it out.
            attempt_count: class != Class::SidecarInbound && !disabled("attemptCount"),
            suppress_debug_headers: disabled("envoyDebugHeaders"),
            x_forwarded_port: enabled("xForwardedPort"),
            x_forwarded_host: enabled("xForwardedHost"),
            trusted_hops,
            proxy_protocol: class == Class::Gateway
                && field(topology, "proxyProtocol").is_some_and(|p| !p.is_null()),
            normalization,
            preserve_case: bool_value(field(headers, "preserveHttp1HeaderCase")) == Some(true),
            sessions: false,
        }
    }

    /// The same, with the stateful session filter when `on` (and not inbound).
    pub(crate) fn with_sessions(self, on: bool) -> Options {
        Options {
            sessions: on && self.class != Class::SidecarInbound,
            ..self
        }
    }

    /// Sets up `hcm` (built with its routes and filters) as istiod sets up one of this class.
    pub(crate) fn apply(&self, hcm: &mut HttpConnectionManager) {
        if !hcm.stat_prefix.ends_with(';') {
            hcm.stat_prefix = names::delimited_stats(&hcm.stat_prefix);
        }
        hcm.server_name = self.server_name.clone();
        hcm.server_header_transformation = if self.pass_through_server {
            ServerHeaderTransformation::PassThrough
        } else {
            ServerHeaderTransformation::Overwrite
        } as i32;
        hcm.generate_request_id = self.request_id.map(|value| BoolValue { value });
        if let Some(forward) = self.forward_client_cert {
            hcm.forward_client_cert_details = forward as i32;
        }
        hcm.set_current_client_cert_details = self.set_current.map(
            |[subject, uri, dns, cert, chain]| SetCurrentClientCertDetails {
                subject: Some(BoolValue { value: subject }),
                uri,
                dns,
                cert,
                chain,
                ..Default::default()
            },
        );
        hcm.append_x_forwarded_port = self.x_forwarded_port;
        hcm.xff_num_trusted_hops = self.trusted_hops;
        hcm.use_remote_address = Some(BoolValue {
            value: self.class == Class::Gateway,
        });
        if self.class == Class::Gateway {
            // istiod's gateways set HTTP/1 options (empty unless HTTP/1.0 is accepted).
            hcm.http_protocol_options = Some(Default::default());
        }
        if self.preserve_case {
            hcm.http_protocol_options
                .get_or_insert_default()
                .header_key_format = super::builders::http1_options(true).header_key_format;
        }
        hcm.upgrade_configs = vec![UpgradeConfig {
            upgrade_type: "websocket".into(),
            ..Default::default()
        }];
        hcm.stream_idle_timeout = Some(Duration::default());
        hcm.proxy_100_continue = true;
        hcm.path_with_escaped_slashes_action = PathWithEscapedSlashesAction::KeepUnchanged as i32;
        hcm.normalize_path = Some(BoolValue {
            value: self.normalization != Normalization::None,
        });
        if matches!(
            self.normalization,
            Normalization::MergeSlashes | Normalization::DecodeAndMergeSlashes
        ) {
            hcm.merge_slashes = true;
        }
        if self.normalization == Normalization::DecodeAndMergeSlashes {
            hcm.path_with_escaped_slashes_action =
                PathWithEscapedSlashesAction::UnescapeAndForward as i32;
        }
        if self.sessions {
            super::session::insert(&mut hcm.http_filters);
        }
        if self.suppress_debug_headers {
            let router_type = Router::type_url();
            for filter in &mut hcm.http_filters {
                if let Some(http_filter::ConfigType::TypedConfig(any)) = &mut filter.config_type
                    && any.type_url == router_type
                {
                    *any = pack_any(Router {
                        suppress_envoy_headers: true,
                        ..Default::default()
                    });
                }
            }
        }
    }
}

/// `name` of a settings object, under its JSON name or its proto name (`xForwardedHost`,
/// `x_forwarded_host`), as Istio's decoder reads either.
fn field<'a>(object: Option<&'a Value>, name: &str) -> Option<&'a Value> {
    let object = object?.as_object()?;
    object.get(name).or_else(|| object.get(&snake_case(name)))
}

fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// A `google.protobuf.BoolValue` as JSON writes it: `true`, or `{"value": true}`.
fn bool_value(value: Option<&Value>) -> Option<bool> {
    match value? {
        Value::Bool(b) => Some(*b),
        Value::Object(o) => o.get("value").and_then(Value::as_bool),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// A ForwardClientCertDetails of the mesh config (a name or its number), in Envoy's terms;
/// `None` when undefined.
fn forward_client_cert(value: Option<&Value>) -> Option<ForwardClientCertDetails> {
    let number = match value? {
        Value::String(s) => match s.as_str() {
            "SANITIZE" => 1,
            "FORWARD_ONLY" => 2,
            "APPEND_FORWARD" => 3,
            "SANITIZE_SET" => 4,
            "ALWAYS_FORWARD_ONLY" => 5,
            _ => 0,
        },
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    };
    Some(match number {
        1 => ForwardClientCertDetails::Sanitize,
        2 => ForwardClientCertDetails::ForwardOnly,
        3 => ForwardClientCertDetails::AppendForward,
        4 => ForwardClientCertDetails::SanitizeSet,
        5 => ForwardClientCertDetails::AlwaysForwardOnly,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::filters::{self, Routes};

    /// istiod's connection managers (their routes, filters, logs, tracing, stat prefix and
    /// protocol options left out), recorded by running its ConfigGen by hand on a sidecar and a
    /// router: inbound, outbound, gateway; the Router filter's `suppress_envoy_headers`.
    const ISTIOD_DEFAULT: [&str; 3] = [
        r#"{"forwardClientCertDetails":"APPEND_FORWARD","normalizePath":true,"pathWithEscapedSlashesAction":"KEEP_UNCHANGED","proxy100Continue":true,"serverName":"istio-envoy","setCurrentClientCertDetails":{"dns":true,"subject":true,"uri":true},"streamIdleTimeout":"0s","upgradeConfigs":[{"upgradeType":"websocket"}],"useRemoteAddress":false}"#,
        r#"{"normalizePath":true,"pathWithEscapedSlashesAction":"KEEP_UNCHANGED","proxy100Continue":true,"streamIdleTimeout":"0s","upgradeConfigs":[{"upgradeType":"websocket"}],"useRemoteAddress":false}"#,
        r#"{"forwardClientCertDetails":"SANITIZE_SET","normalizePath":true,"pathWithEscapedSlashesAction":"KEEP_UNCHANGED","proxy100Continue":true,"serverName":"istio-envoy","setCurrentClientCertDetails":{"cert":true,"dns":true,"subject":true,"uri":true},"streamIdleTimeout":"0s","upgradeConfigs":[{"upgradeType":"websocket"}],"useRemoteAddress":true}"#,
    ];

    /// The same with [`CUSTOM_MESH`].
    const ISTIOD_CUSTOM: [&str; 3] = [
        r#"{"appendXForwardedPort":true,"generateRequestId":false,"mergeSlashes":true,"normalizePath":true,"pathWithEscapedSlashesAction":"KEEP_UNCHANGED","proxy100Continue":true,"serverName":"edge","setCurrentClientCertDetails":{"cert":true,"dns":true,"subject":false,"uri":true},"streamIdleTimeout":"0s","upgradeConfigs":[{"upgradeType":"websocket"}],"useRemoteAddress":false}"#,
        r#"{"appendXForwardedPort":true,"generateRequestId":false,"mergeSlashes":true,"normalizePath":true,"pathWithEscapedSlashesAction":"KEEP_UNCHANGED","proxy100Continue":true,"serverName":"edge","streamIdleTimeout":"0s","upgradeConfigs":[{"upgradeType":"websocket"}],"useRemoteAddress":false}"#,
        r#"{"appendXForwardedPort":true,"forwardClientCertDetails":"APPEND_FORWARD","generateRequestId":false,"mergeSlashes":true,"normalizePath":true,"pathWithEscapedSlashesAction":"KEEP_UNCHANGED","proxy100Continue":true,"serverName":"edge","setCurrentClientCertDetails":{"cert":true,"dns":true,"subject":true,"uri":true},"streamIdleTimeout":"0s","upgradeConfigs":[{"upgradeType":"websocket"}],"useRemoteAddress":true,"xffNumTrustedHops":2}"#,
    ];

    const CUSTOM_MESH: &str = r#"{
        "pathNormalization": {"normalization": "MERGE_SLASHES"},
        "defaultConfig": {
            "proxyHeaders": {
                "server": {"value": "edge"},
                "requestId": {"disabled": true},
                "attemptCount": {"disabled": true},
                "envoyDebugHeaders": {"disabled": true},
                "xForwardedPort": {"enabled": true},
                "xForwardedHost": {"enabled": true},
                "forwardedClientCert": "SANITIZE",
                "setCurrentClientCertDetails": {"cert": true, "subject": false}
            },
            "gatewayTopology": {
                "numTrustedProxies": 2,
                "forwardClientCertDetails": "APPEND_FORWARD",
                "proxyProtocol": {}
            }
        }}"#;

    const CLASSES: [Class; 3] = [
        Class::SidecarInbound,
        Class::SidecarOutbound,
        Class::Gateway,
    ];

    /// `options` on a bare connection manager, as protobuf JSON without what istiod's recording
    /// left out; and whether its Router suppresses Envoy's headers.
    fn applied(options: &Options) -> (Value, bool) {
        let mut hcm = filters::http_connection_manager("x", Routes::Rds("x".into()));
        options.apply(&mut hcm);
        let suppress = hcm.http_filters.iter().any(|f| {
            matches!(&f.config_type, Some(http_filter::ConfigType::TypedConfig(a))
                if prost::Message::decode(a.value.as_slice())
                    .is_ok_and(|r: Router| r.suppress_envoy_headers))
        });
        hcm.http_filters.clear();
        hcm.route_specifier = None;
        hcm.stat_prefix.clear();
        // Compared with istiod's too, except the gateway's empty HTTP/1 options, which the
        // recording leaves out.
        hcm.http_protocol_options = None;
        assert!(hcm.http2_protocol_options.is_none());
        let mut json = pasa_envoy_json::to_json("connection manager", &pack_any(hcm)).unwrap();
        json.as_object_mut().unwrap().remove("@type");
        (json, suppress)
    }

    #[test]
    fn connection_managers_are_istiods() {
        let custom: MeshConfig = serde_json::from_str(CUSTOM_MESH).unwrap();
        for (mesh, expected, suppress) in [
            (None, ISTIOD_DEFAULT, false),
            (Some(&custom), ISTIOD_CUSTOM, true),
        ] {
            let settings = mesh.map_or_else(MeshProxyConfig::defaults, MeshConfig::default_config);
            for (class, want) in CLASSES.into_iter().zip(expected) {
                let options = Options::of(class, &settings, mesh);
                let want: Value = serde_json::from_str(want).unwrap();
                assert_eq!(applied(&options), (want, suppress), "{class:?}, {mesh:?}");
            }
        }
        // What goes on virtual hosts, routes and listeners.
        let settings = custom.default_config();
        let of = |class| Options::of(class, &settings, Some(&custom));
        assert!(!of(Class::SidecarOutbound).attempt_count);
        assert!(of(Class::SidecarOutbound).x_forwarded_host);
        assert!(of(Class::Gateway).proxy_protocol);
        assert!(!of(Class::SidecarOutbound).proxy_protocol);
        let defaults = MeshProxyConfig::defaults();
        let of = |class| Options::of(class, &defaults, None);
        assert!(of(Class::SidecarOutbound).attempt_count && of(Class::Gateway).attempt_count);
        // istiod's inbound virtual hosts leave the attempt count out.
        assert!(!of(Class::SidecarInbound).attempt_count);
        assert!(!of(Class::SidecarOutbound).x_forwarded_host);
        assert!(!of(Class::Gateway).proxy_protocol);
    }

    #[test]
    fn settings_read_as_istio_reads_them() {
        // Proto field names, a disabled Server header, no normalization, numbers for enums.
        let settings = MeshProxyConfig::parse(
            r#"{"proxy_headers": {"server": {"disabled": true, "value": "x"},
                "forwarded_client_cert": 2},
                "gatewayTopology": {"forwardClientCertDetails": "FORWARD_ONLY"}}"#,
        )
        .unwrap();
        let mesh: MeshConfig =
            serde_json::from_str(r#"{"pathNormalization": {"normalization": "NONE"}}"#).unwrap();
        let inbound = Options::of(Class::SidecarInbound, &settings, Some(&mesh));
        let (json, _) = applied(&inbound);
        assert_eq!(json["serverHeaderTransformation"], "PASS_THROUGH");
        assert!(json.get("serverName").is_none(), "{json}");
        assert_eq!(json["forwardClientCertDetails"], "FORWARD_ONLY");
        assert_eq!(json["normalizePath"], false);
        // A gateway forwarding the certificate as it came sets no details of its own.
        let (json, _) = applied(&Options::of(Class::Gateway, &settings, Some(&mesh)));
        assert_eq!(json["forwardClientCertDetails"], "FORWARD_ONLY");
        assert!(json.get("setCurrentClientCertDetails").is_none(), "{json}");
        let decode: MeshConfig = serde_json::from_str(
            r#"{"pathNormalization": {"normalization": "DECODE_AND_MERGE_SLASHES"}}"#,
        )
        .unwrap();
        let (json, _) = applied(&Options::of(
            Class::SidecarOutbound,
            &MeshProxyConfig::defaults(),
            Some(&decode),
        ));
        assert_eq!(json["pathWithEscapedSlashesAction"], "UNESCAPE_AND_FORWARD");
        assert_eq!(json["mergeSlashes"], true);
    }
}
