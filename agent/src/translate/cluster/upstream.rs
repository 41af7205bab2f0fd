//! The HTTP a cluster speaks upstream ([`Upstream`]), decided as istiod decides it, and the
//! `HttpProtocolOptions` that say it.

use envoy_types::pb::envoy::config::core::v3::{HttpProtocolOptions, UpstreamHttpProtocolOptions};
use envoy_types::pb::google::protobuf::UInt32Value;
use pasa_istio::common::Protocol;
use pasa_istio::destination_rule::{ClientTlsSettings, ConnectionPoolSettings};
use pasa_istio::destination_rule::{H2UpgradePolicy, HttpSettings};

use super::super::builders::{duration, http1_options};

/// The key of a cluster's upstream HTTP options.
pub(super) const HTTP_PROTOCOL_OPTIONS: &str =
    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// The HTTP a cluster speaks upstream, worked out in istiod's order: from its port's protocol
/// (and whether HTTP/1 keeps header names' case); then, toward a service, the upgrade to
/// HTTP/2 (see [`upgrades`]), which only takes where nothing was said yet; then the rule's
/// `useClientProtocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Upstream {
    /// Nothing said: HTTP/1.1 (explicitly so where other options are set).
    Unsaid,
    /// HTTP/1.1 keeping header names' case.
    Http1PreservingCase,
    /// HTTP/2, gRPC, gRPC-Web, or upgraded.
    Http2,
    /// What the client spoke (HTTP/1 keeping header names' case when `true`): a port whose
    /// protocol a sidecar detects, or a rule's `useClientProtocol`.
    Downstream(bool),
}

impl Upstream {
    /// For a port of `protocol` (`detects`: on a sidecar, which detects protocols; a router
    /// speaks HTTP/1 where it is not said), with the rule's HTTP settings `http`; toward a
    /// service, `mesh_upgrade` is the mesh config's upgrade (None for the local workload).
    pub(super) fn of(
        protocol: Option<Protocol>,
        detects: bool,
        preserve_case: bool,
        mesh_upgrade: Option<bool>,
        http: Option<&HttpSettings>,
    ) -> Upstream {
        let mut chosen = match protocol {
            Some(Protocol::Http2 | Protocol::Grpc | Protocol::GrpcWeb) => Upstream::Http2,
            Some(p) if p.is_http() && preserve_case => Upstream::Http1PreservingCase,
            None if preserve_case => Upstream::Http1PreservingCase,
            _ => Upstream::Unsaid,
        };
        if protocol.is_none() && detects {
            chosen = Upstream::Downstream(preserve_case);
        }
        if chosen == Upstream::Unsaid
            && mesh_upgrade.is_some_and(|mesh| upgrades(protocol, mesh, http))
        {
            chosen = Upstream::Http2;
        }
        if http.is_some_and(|h| h.use_client_protocol) {
            chosen = Upstream::Downstream(chosen == Upstream::Http1PreservingCase);
        }
        chosen
    }
}

/// Whether HTTP/1.1 toward a service is upgraded to HTTP/2, as istiod decides it: never under
/// `useClientProtocol`; as the rule's `h2UpgradePolicy` says when it says (`UPGRADE` upgrades
/// any port); otherwise an HTTP port when the mesh config upgrades.
fn upgrades(protocol: Option<Protocol>, mesh: bool, http: Option<&HttpSettings>) -> bool {
    if let Some(http) = http {
        if http.use_client_protocol {
            return false;
        }
        match http.h2_upgrade_policy {
            H2UpgradePolicy::Upgrade => return true,
            H2UpgradePolicy::DoNotUpgrade => return false,
            H2UpgradePolicy::Default | H2UpgradePolicy::Unknown(_) => {}
        }
    }
    mesh && protocol.is_some_and(|p| p.is_http())
}

/// The HTTP settings of a connection pool.
pub(super) fn http_settings(cp: Option<&ConnectionPoolSettings>) -> Option<&HttpSettings> {
    cp.and_then(|cp| cp.http.as_ref())
}

/// What Envoy works out per request for TLS it originates without an `sni`, as istiod has it:
/// the request's host as SNI, and the server's certificate verified for that host unless the
/// rule pins names or skips verification.
pub(super) fn auto_tls(
    originated: Option<&ClientTlsSettings>,
) -> Option<UpstreamHttpProtocolOptions> {
    let tls = originated.filter(|t| t.sni.is_empty())?;
    Some(UpstreamHttpProtocolOptions {
        auto_sni: true,
        auto_san_validation: tls.subject_alt_names.is_empty()
            && tls.insecure_skip_verify != Some(true),
        ..Default::default()
    })
}

/// A cluster's upstream HTTP options, when it has any: connection-pool settings (`common`), the
/// protocol (Envoy requires one where options are set: HTTP/1.1 where nothing was said, as
/// istiod's), for HTTP/2 the rule's stream limit and PING keepalive (`http`), and what Envoy
/// works out per request for originated TLS (`auto`).
pub(super) fn upstream_http_options(
    common: Option<HttpProtocolOptions>,
    upstream: Upstream,
    http: Option<&HttpSettings>,
    auto: Option<UpstreamHttpProtocolOptions>,
) -> Option<envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions> {
    use envoy_types::pb::envoy::config::core::v3::{Http2ProtocolOptions, KeepaliveSettings};
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
        ExplicitHttpConfig, UpstreamProtocolOptions, UseDownstreamHttpConfig,
        explicit_http_config::ProtocolConfig,
    };
    let explicit = |config| {
        UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
            protocol_config: Some(config),
        })
    };
    let protocol = match upstream {
        Upstream::Http2 => {
            let streams = http.map_or(0, |h| h.max_concurrent_streams);
            explicit(ProtocolConfig::Http2ProtocolOptions(Http2ProtocolOptions {
                max_concurrent_streams: (streams > 0).then_some(UInt32Value {
                    value: streams as u32,
                }),
                connection_keepalive: http.and_then(|h| h.http2_keep_alive.as_ref()).map(|k| {
                    KeepaliveSettings {
                        interval: k.interval.as_ref().map(duration),
                        timeout: k.timeout.as_ref().map(duration),
                        ..Default::default()
                    }
                }),
                ..Default::default()
            }))
        }
        Upstream::Downstream(preserve_case) => {
            UpstreamProtocolOptions::UseDownstreamProtocolConfig(UseDownstreamHttpConfig {
                http_protocol_options: Some(http1_options(preserve_case)),
                http2_protocol_options: Some(Default::default()),
                ..Default::default()
            })
        }
        Upstream::Http1PreservingCase => {
            explicit(ProtocolConfig::HttpProtocolOptions(http1_options(true)))
        }
        Upstream::Unsaid if common.is_some() || auto.is_some() => {
            explicit(ProtocolConfig::HttpProtocolOptions(http1_options(false)))
        }
        Upstream::Unsaid => return None,
    };
    Some(
        envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions {
            common_http_protocol_options: common,
            upstream_http_protocol_options: auto,
            upstream_protocol_options: Some(protocol),
            ..Default::default()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_protocol_is_decided_in_istiods_order() {
        let http = |policy: H2UpgradePolicy, client: bool| HttpSettings {
            h2_upgrade_policy: policy,
            use_client_protocol: client,
            ..Default::default()
        };
        let upgrade = http(H2UpgradePolicy::Upgrade, false);
        let keep = http(H2UpgradePolicy::DoNotUpgrade, false);
        let client = http(H2UpgradePolicy::Default, true);
        let (h, t) = (Some(Protocol::Http), Some(Protocol::Tcp));
        use Upstream::*;
        for (protocol, detects, preserve, mesh, rule, want) in [
            // The mesh config upgrades HTTP ports only; a rule says for its own.
            (h, true, false, Some(true), None, Http2),
            (t, true, false, Some(true), None, Unsaid),
            (h, true, false, Some(true), Some(&keep), Unsaid),
            (t, true, false, Some(false), Some(&upgrade), Http2),
            // Not toward the workload itself.
            (h, true, false, None, Some(&upgrade), Unsaid),
            // Where the protocol was decided already, the upgrade does not take.
            (
                None,
                true,
                false,
                Some(false),
                Some(&upgrade),
                Downstream(false),
            ),
            (None, false, false, Some(false), Some(&upgrade), Http2),
            (
                h,
                true,
                true,
                Some(true),
                Some(&upgrade),
                Http1PreservingCase,
            ),
            // The client's protocol, keeping HTTP/1's header case where it was kept.
            (h, true, true, Some(true), Some(&client), Downstream(true)),
            (
                Some(Protocol::Grpc),
                true,
                true,
                Some(true),
                Some(&client),
                Downstream(false),
            ),
        ] {
            assert_eq!(
                Upstream::of(protocol, detects, preserve, mesh, rule),
                want,
                "{protocol:?} detects {detects} preserve {preserve} mesh {mesh:?} {rule:?}"
            );
        }
    }
}
