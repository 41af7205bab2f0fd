//! A cluster's upstream TLS: Istio's auto mTLS (transport socket matches by the endpoint's
//! `tlsMode`) and the ISTIO_MUTUAL contexts, encoded once per service and set of pinned SANs.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::TransportSocketMatch;
use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket::ConfigType};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, TlsParameters, UpstreamTlsContext,
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    tls_parameters::TlsProtocol,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::util::pack_any;

use crate::model::proxy::ProxyBuild;
use crate::model::secrets;

use super::super::builders::{field_len, length_delimited, string_field};
use super::super::metadata;
use super::super::sds;

/// `Cluster.transport_socket` and `Cluster.transport_socket_matches`, for clusters assembled from
/// encoded pieces.
pub(super) const TRANSPORT_SOCKET: u32 = 24;
const TRANSPORT_SOCKET_MATCHES: u32 = 43;
/// `TransportSocketMatch.transport_socket`.
const MATCH_SOCKET: u32 = 3;

pub(super) const TLS_SOCKET: &str = "envoy.transport_sockets.tls";

/// Istio's auto mTLS for a cluster without TLS settings: endpoints whose workload has a sidecar
/// (`tlsMode: istio` endpoint metadata) are reached over ISTIO_MUTUAL (`socket`, encoded), the
/// others in plaintext. Appends the cluster's `transport_socket_matches`.
pub(super) fn auto_mtls(socket: &[u8], out: &mut Vec<u8>) {
    let head = &*TLS_ISTIO_HEAD;
    length_delimited(
        TRANSPORT_SOCKET_MATCHES,
        head.len() + field_len(MATCH_SOCKET, socket.len()),
        out,
    );
    out.extend_from_slice(head);
    length_delimited(MATCH_SOCKET, socket.len(), out);
    out.extend_from_slice(socket);
    out.extend_from_slice(&TLS_DISABLED);
}

/// The length of what [`auto_mtls`] appends for a socket of `socket` bytes.
pub(super) fn auto_mtls_len(socket: usize) -> usize {
    field_len(
        TRANSPORT_SOCKET_MATCHES,
        TLS_ISTIO_HEAD.len() + field_len(MATCH_SOCKET, socket),
    ) + TLS_DISABLED.len()
}

/// The `tlsMode-istio` match without its transport socket, encoded.
static TLS_ISTIO_HEAD: std::sync::LazyLock<Vec<u8>> =
    std::sync::LazyLock::new(|| prost::Message::encode_to_vec(&tls_istio(None)));

/// The `tlsMode-disabled` match, encoded as a field of a cluster.
static TLS_DISABLED: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    prost::Message::encode_to_vec(&Cluster {
        transport_socket_matches: vec![tls_disabled()],
        ..Default::default()
    })
});

/// Auto mTLS's match for endpoints of workloads with a sidecar.
fn tls_istio(socket: Option<TransportSocket>) -> TransportSocketMatch {
    TransportSocketMatch {
        name: "tlsMode-istio".into(),
        r#match: Some(metadata::single("tlsMode", "istio")),
        transport_socket: socket,
    }
}

/// Auto mTLS's match for the other endpoints: plaintext.
fn tls_disabled() -> TransportSocketMatch {
    use envoy_types::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
    TransportSocketMatch {
        name: "tlsMode-disabled".into(),
        r#match: Some(Default::default()),
        transport_socket: Some(TransportSocket {
            name: "envoy.transport_sockets.raw_buffer".into(),
            config_type: Some(ConfigType::TypedConfig(pack_any(RawBuffer::default()))),
        }),
    }
}

/// ISTIO_MUTUAL upstream TLS contexts of one service's clusters, encoded once per set of
/// pinned SANs: the clusters differ only in SNI, so each transport socket is the encoded
/// common context followed by its SNI (the bytes encoding the whole message gives).
pub(super) struct MutualContexts {
    build: ProxyBuild,
    encoded: Vec<MutualContext>,
}

/// One ISTIO_MUTUAL context: its pinned SANs, whether it offers HTTP/2, and the encoded
/// `UpstreamTlsContext` holding only the common context.
struct MutualContext {
    sans: Vec<String>,
    h2: bool,
    encoded: Vec<u8>,
}

impl MutualContexts {
    pub(super) fn new(build: ProxyBuild) -> MutualContexts {
        MutualContexts {
            build,
            encoded: Vec::new(),
        }
    }

    /// The ISTIO_MUTUAL transport socket pinned to `sans`, with `sni`, offering HTTP/2 when
    /// `h2`: an encoded `TransportSocket` (name, then an `Any` of the `UpstreamTlsContext`).
    pub(super) fn socket(&mut self, sans: &[String], sni: &str, h2: bool) -> Vec<u8> {
        let at = match self
            .encoded
            .iter()
            .position(|c| c.sans == sans && c.h2 == h2)
        {
            Some(at) => at,
            None => {
                let context = UpstreamTlsContext {
                    common_tls_context: Some(istio_mutual_common(sans, self.build, h2)),
                    ..Default::default()
                };
                self.encoded.push(MutualContext {
                    sans: sans.to_vec(),
                    h2,
                    encoded: prost::Message::encode_to_vec(&context),
                });
                self.encoded.len() - 1
            }
        };
        let context = &self.encoded[at].encoded;
        let (name, type_url) = &*SOCKET_HEAD;
        // Any.value: the context, then `sni` (UpstreamTlsContext field 2, after the common
        // context, field 1).
        let sni_len = if sni.is_empty() {
            0
        } else {
            field_len(2, sni.len())
        };
        let value = context.len() + sni_len;
        let any = type_url.len() + field_len(2, value);
        let mut out = Vec::with_capacity(name.len() + field_len(3, any));
        out.extend_from_slice(name);
        // TransportSocket.typed_config (3), an Any: type_url (1), value (2).
        length_delimited(3, any, &mut out);
        out.extend_from_slice(type_url);
        length_delimited(2, value, &mut out);
        out.extend_from_slice(context);
        string_field(2, sni, &mut out);
        out
    }
}

/// The encoded name field of a TLS transport socket, and the encoded type URL field of an `Any`
/// holding an `UpstreamTlsContext`.
static SOCKET_HEAD: std::sync::LazyLock<(Vec<u8>, Vec<u8>)> = std::sync::LazyLock::new(|| {
    use envoy_types::pb::google::protobuf::Any;
    let name = TransportSocket {
        name: TLS_SOCKET.into(),
        config_type: None,
    };
    let type_url = Any {
        type_url: <UpstreamTlsContext as prost::Name>::type_url(),
        value: Vec::new(),
    };
    (
        prost::Message::encode_to_vec(&name),
        prost::Message::encode_to_vec(&type_url),
    )
});

/// Matchers of a peer's SANs, each matched exactly (istiod's `match_subject_alt_names`).
pub(in crate::translate) fn exact_sans(sans: &[String]) -> Vec<StringMatcher> {
    sans.iter()
        .map(|san| StringMatcher {
            match_pattern: Some(string_matcher::MatchPattern::Exact(san.clone())),
            ..Default::default()
        })
        .collect()
}

/// The common TLS context of ISTIO_MUTUAL: the workload certificate, and the mesh root with the
/// peer pinned to `sans`. Istio's proxy (`build`) also offers ALPN `istio-peer-exchange`, paired
/// with its clusters' metadata exchange filter; upstream Envoy does not (as istiod with the
/// exchange disabled): a server negotiating it writes its metadata in band first, which upstream
/// Envoy would pass to the application. An HTTP/2 cluster's also offers `h2`, as istiod's.
fn istio_mutual_common(sans: &[String], build: ProxyBuild, h2: bool) -> CommonTlsContext {
    #[allow(deprecated)] // istiod's field: any SAN type, matched exactly
    let pinned = CertificateValidationContext {
        match_subject_alt_names: exact_sans(sans),
        ..Default::default()
    };
    CommonTlsContext {
        tls_certificate_sds_secret_configs: vec![sds::from_istio_agent(
            secrets::WORKLOAD_CERTIFICATE,
        )],
        validation_context_type: Some(ValidationContextType::CombinedValidationContext(
            CombinedCertificateValidationContext {
                default_validation_context: Some(pinned),
                validation_context_sds_secret_config: Some(sds::from_istio_agent(secrets::ROOT_CA)),
                ..Default::default()
            },
        )),
        alpn_protocols: (build == ProxyBuild::Istio)
            .then_some("istio-peer-exchange")
            .into_iter()
            .chain(["istio"])
            .chain(h2.then_some("h2"))
            .map(String::from)
            .collect(),
        // TLS 1.3 where the server speaks it (Envoy's client default stops at 1.2), as istiod.
        tls_params: Some(TlsParameters {
            tls_minimum_protocol_version: TlsProtocol::TlSv12 as i32,
            tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) fn file(path: &str) -> envoy_types::pb::envoy::config::core::v3::DataSource {
    use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
    envoy_types::pb::envoy::config::core::v3::DataSource {
        specifier: Some(Specifier::Filename(path.to_string())),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ISTIO_MUTUAL transport socket as a message, built whole.
    fn whole_socket(sans: &[String], sni: &str) -> TransportSocket {
        TransportSocket {
            name: TLS_SOCKET.into(),
            config_type: Some(ConfigType::TypedConfig(pack_any(UpstreamTlsContext {
                common_tls_context: Some(istio_mutual_common(sans, ProxyBuild::Envoy, false)),
                sni: sni.into(),
                ..Default::default()
            }))),
        }
    }

    #[test]
    fn an_istio_mutual_socket_is_the_encoding_of_the_whole_socket() {
        let sans = vec!["spiffe://cluster.local/ns/a/sa/b".to_string()];
        let mut contexts = MutualContexts::new(ProxyBuild::Envoy);
        for sni in [
            "outbound_.80_.v1_.a.svc.cluster.local",
            "outbound_.81_._.a",
            "",
        ] {
            let socket = contexts.socket(&sans, sni, false);
            assert_eq!(
                socket,
                prost::Message::encode_to_vec(&whole_socket(&sans, sni))
            );
        }
        // The context is encoded once for all.
        assert_eq!(contexts.encoded.len(), 1);
        // An HTTP/2 cluster's offers `h2` too: another context.
        contexts.socket(&sans, "", true);
        assert_eq!(contexts.encoded.len(), 2);
    }

    #[test]
    fn assembled_auto_mtls_matches_are_the_bytes_of_the_messages() {
        let sans = vec!["spiffe://cluster.local/ns/a/sa/b".to_string()];
        let sni = "outbound_.80_.v1_.a.svc.cluster.local";
        let socket = MutualContexts::new(ProxyBuild::Envoy).socket(&sans, sni, false);
        let mut assembled = Vec::new();
        auto_mtls(&socket, &mut assembled);
        let whole = Cluster {
            transport_socket_matches: vec![
                tls_istio(Some(whole_socket(&sans, sni))),
                tls_disabled(),
            ],
            ..Default::default()
        };
        assert_eq!(assembled, prost::Message::encode_to_vec(&whole));
        // And as a cluster's transport socket.
        let mut field = Vec::new();
        length_delimited(TRANSPORT_SOCKET, socket.len(), &mut field);
        field.extend_from_slice(&socket);
        let whole = Cluster {
            transport_socket: Some(whole_socket(&sans, sni)),
            ..Default::default()
        };
        assert_eq!(field, prost::Message::encode_to_vec(&whole));
    }
}
