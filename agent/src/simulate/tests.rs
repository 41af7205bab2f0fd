//! The whole walk on hand-built resources shaped like istiod's sidecar output: one case per step
//! and per error.

use envoy_types::pb::envoy::config::core::v3::{
    Address, SocketAddress, TransportSocket, address, socket_address,
};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChainMatch, ListenerFilter, listener_filter,
};
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier as RouteCluster;
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, Route, RouteAction, RouteMatch, VirtualHost, route,
};
use envoy_types::pb::envoy::extensions::filters::listener::http_inspector::v3::HttpInspector;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::Rds;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, SdsSecretConfig,
};
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};
use envoy_types::util::pack_any;

use super::*;

fn bound(address: &str, port: u32) -> Option<Address> {
    Some(Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: address.into(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    })
}

fn tcp_proxy(cluster: &str) -> Filter {
    Filter {
        name: "envoy.filters.network.tcp_proxy".into(),
        config_type: Some(filter::ConfigType::TypedConfig(pack_any(TcpProxy {
            stat_prefix: cluster.into(),
            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.into())),
            ..Default::default()
        }))),
    }
}

fn hcm(route: RouteSpecifier) -> Filter {
    Filter {
        name: "envoy.filters.network.http_connection_manager".into(),
        config_type: Some(filter::ConfigType::TypedConfig(pack_any(
            HttpConnectionManager {
                route_specifier: Some(route),
                ..Default::default()
            },
        ))),
    }
}

fn rds(name: &str) -> Filter {
    hcm(RouteSpecifier::Rds(Rds {
        route_config_name: name.into(),
        ..Default::default()
    }))
}

fn inspectors() -> Vec<ListenerFilter> {
    vec![
        ListenerFilter {
            name: "envoy.filters.listener.tls_inspector".into(),
            config_type: Some(listener_filter::ConfigType::TypedConfig(pack_any(
                TlsInspector::default(),
            ))),
            ..Default::default()
        },
        ListenerFilter {
            name: "envoy.filters.listener.http_inspector".into(),
            config_type: Some(listener_filter::ConfigType::TypedConfig(pack_any(
                HttpInspector::default(),
            ))),
            ..Default::default()
        },
    ]
}

fn tls_socket(secret: &str, require_client: bool) -> Option<TransportSocket> {
    let context = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_sds_secret_configs: vec![SdsSecretConfig {
                name: secret.into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        require_client_certificate: Some(BoolValue {
            value: require_client,
        }),
        ..Default::default()
    };
    Some(TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(context))),
    })
}

fn to(name: &str, prefix: &str, cluster: &str) -> Route {
    Route {
        name: name.into(),
        r#match: Some(RouteMatch {
            path_specifier: Some(PathSpecifier::Prefix(prefix.into())),
            ..Default::default()
        }),
        action: Some(route::Action::Route(RouteAction {
            cluster_specifier: Some(RouteCluster::Cluster(cluster.into())),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// A sidecar with an HTTP service on port 80, a TCP service at 10.0.0.9:9090, an inbound listener
/// for port 8080 (mTLS or plaintext) and 8443 (the app's own TLS), and the outbound catch-all.
fn sidecar() -> Resources {
    let mut r = Resources::default();
    let listener = |name: &str, address, chains, default| Listener {
        name: String::from(name),
        address,
        filter_chains: chains,
        default_filter_chain: default,
        listener_filters: inspectors(),
        ..Default::default()
    };
    let http_chain = FilterChain {
        name: "http".into(),
        filter_chain_match: Some(FilterChainMatch {
            application_protocols: vec!["http/1.1".into(), "h2c".into()],
            ..Default::default()
        }),
        filters: vec![rds("80")],
        ..Default::default()
    };
    let passthrough = FilterChain {
        name: "PassthroughFilterChain".into(),
        filters: vec![tcp_proxy("PassthroughCluster")],
        ..Default::default()
    };
    r.listeners.insert(
        "0.0.0.0_80".into(),
        listener(
            "0.0.0.0_80",
            bound("0.0.0.0", 80),
            vec![http_chain],
            Some(passthrough.clone()),
        ),
    );
    let tcp_chain = FilterChain {
        filters: vec![tcp_proxy("outbound|9090||db.default.svc.cluster.local")],
        ..Default::default()
    };
    r.listeners.insert(
        "10.0.0.9_9090".into(),
        listener(
            "10.0.0.9_9090",
            bound("10.0.0.9", 9090),
            vec![tcp_chain],
            None,
        ),
    );
    r.listeners.insert(
        VIRTUAL_OUTBOUND.into(),
        listener(
            VIRTUAL_OUTBOUND,
            bound("0.0.0.0", 15001),
            vec![],
            Some(passthrough),
        ),
    );
    let inbound =
        |name: &str, port: u32, transport: &str, alpn: &[&str], socket, filter| FilterChain {
            name: name.into(),
            filter_chain_match: Some(FilterChainMatch {
                destination_port: Some(UInt32Value { value: port }),
                transport_protocol: transport.into(),
                application_protocols: alpn.iter().map(|a| a.to_string()).collect(),
                ..Default::default()
            }),
            transport_socket: socket,
            filters: vec![filter],
            ..Default::default()
        };
    let inbound_routes = RouteSpecifier::RouteConfig(RouteConfiguration {
        name: "inbound|8080||".into(),
        virtual_hosts: vec![VirtualHost {
            name: "inbound|http|8080".into(),
            domains: vec!["*".into()],
            routes: vec![to("default", "/", "inbound|8080||")],
            ..Default::default()
        }],
        ..Default::default()
    });
    r.listeners.insert(
        VIRTUAL_INBOUND.into(),
        listener(
            VIRTUAL_INBOUND,
            bound("0.0.0.0", 15006),
            vec![
                inbound(
                    "mtls",
                    8080,
                    "tls",
                    &["istio-http/1.1", "istio-h2"],
                    tls_socket("default", true),
                    hcm(inbound_routes.clone()),
                ),
                inbound("plain", 8080, "raw_buffer", &[], None, hcm(inbound_routes)),
                inbound(
                    "app-tls",
                    8443,
                    "tls",
                    &[],
                    tls_socket("file-cert:app.pem~app-key.pem", false),
                    tcp_proxy("inbound|8443||"),
                ),
            ],
            None,
        ),
    );
    r.routes.insert(
        "80".into(),
        RouteConfiguration {
            name: "80".into(),
            virtual_hosts: vec![
                VirtualHost {
                    name: "reviews.default.svc.cluster.local:80".into(),
                    domains: vec!["reviews".into(), "reviews.default.svc.cluster.local".into()],
                    routes: vec![
                        to(
                            "v2",
                            "/v2",
                            "outbound|80|v2|reviews.default.svc.cluster.local",
                        ),
                        to(
                            "default",
                            "/",
                            "outbound|80||reviews.default.svc.cluster.local",
                        ),
                    ],
                    ..Default::default()
                },
                VirtualHost {
                    name: "secure:80".into(),
                    domains: vec!["secure".into()],
                    require_tls: TlsRequirementType::All as i32,
                    routes: vec![to("default", "/", "outbound|80||secure")],
                    ..Default::default()
                },
                VirtualHost {
                    name: "narrow:80".into(),
                    domains: vec!["narrow".into()],
                    routes: vec![to("only-api", "/api", "outbound|80||narrow")],
                    ..Default::default()
                },
                VirtualHost {
                    name: "block_all".into(),
                    domains: vec!["*".into()],
                    routes: vec![Route {
                        name: "block_all".into(),
                        r#match: Some(RouteMatch {
                            path_specifier: Some(PathSpecifier::Prefix("/".into())),
                            ..Default::default()
                        }),
                        action: Some(route::Action::DirectResponse(DirectResponseAction {
                            status: 502,
                            ..Default::default()
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
            ..Default::default()
        },
    );
    r
}

fn call(port: u16) -> Call {
    Call {
        port,
        protocol: Some(Protocol::Http),
        ..Default::default()
    }
}

fn run(r: &Resources, c: Call) -> Outcome {
    simulate(r, &c).unwrap()
}

#[test]
fn outbound_http_through_rds_to_a_route_and_cluster() {
    let out = run(
        &sidecar(),
        Call {
            host: "reviews".into(),
            path: "/v2/x".into(),
            ..call(80)
        },
    );
    assert_eq!(
        out,
        Outcome {
            listener: "0.0.0.0_80".into(),
            filter_chain: "http".into(),
            route_config: "80".into(),
            virtual_host: "reviews.default.svc.cluster.local:80".into(),
            route: "v2".into(),
            cluster: "outbound|80|v2|reviews.default.svc.cluster.local".into(),
            ..Default::default()
        }
    );
}

#[test]
fn tcp_to_the_http_port_takes_the_default_chain_and_unknown_ports_the_catch_all() {
    let r = sidecar();
    let tcp = Call {
        protocol: Some(Protocol::Tcp),
        ..call(80)
    };
    let out = run(&r, tcp.clone());
    assert_eq!(out.filter_chain, "PassthroughFilterChain");
    assert_eq!(out.cluster, "PassthroughCluster");
    let out = run(&r, Call { port: 12345, ..tcp });
    assert_eq!(out.listener, VIRTUAL_OUTBOUND);
    assert_eq!(out.cluster, "PassthroughCluster");
    assert_eq!(out.error, None);
}

#[test]
fn a_listener_bound_to_the_address_wins_and_without_catch_all_there_is_none() {
    let mut r = sidecar();
    let db = Call {
        address: "10.0.0.9".into(),
        protocol: Some(Protocol::Tcp),
        ..call(9090)
    };
    let out = run(&r, db.clone());
    assert_eq!(out.listener, "10.0.0.9_9090");
    assert_eq!(out.cluster, "outbound|9090||db.default.svc.cluster.local");
    r.listeners.remove(VIRTUAL_OUTBOUND);
    let out = run(
        &r,
        Call {
            address: "10.0.0.10".into(),
            ..db
        },
    );
    assert_eq!(out.error, Some(TrafficError::NoListener));
    assert_eq!(out.listener, "");
}

#[test]
fn http_errors_no_virtual_host_tls_redirect_no_route() {
    let mut r = sidecar();
    let out = run(
        &r,
        Call {
            host: "secure".into(),
            ..call(80)
        },
    );
    assert_eq!(out.error, Some(TrafficError::TlsRedirect));
    assert_eq!(out.virtual_host, "secure:80");
    let out = run(
        &r,
        Call {
            host: "narrow".into(),
            ..call(80)
        },
    );
    assert_eq!(out.error, Some(TrafficError::NoRoute));
    let out = run(
        &r,
        Call {
            host: "unknown".into(),
            ..call(80)
        },
    );
    assert_eq!(out.virtual_host, "block_all");
    assert_eq!(out.route, "block_all");
    assert_eq!(out.cluster, "", "a direct response has no cluster");
    r.routes.remove("80");
    let out = run(&r, call(80));
    assert_eq!(out.error, Some(TrafficError::NoVirtualHost));
    assert_eq!(out.route_config, "80");
}

#[test]
fn inbound_mtls_plaintext_and_their_errors() {
    let r = sidecar();
    let inbound = |tls, protocol| Call {
        tls,
        protocol: Some(protocol),
        mode: Some(CallMode::Inbound),
        ..call(8080)
    };
    let out = run(&r, inbound(TlsMode::Mtls, Protocol::Http));
    assert_eq!(out.error, None);
    assert_eq!(out.listener, VIRTUAL_INBOUND);
    assert_eq!(out.filter_chain, "mtls");
    assert_eq!(out.virtual_host, "inbound|http|8080");
    assert_eq!(out.route_config, "", "inline route configuration");
    assert_eq!(out.cluster, "inbound|8080||");
    assert_eq!(
        out.filter_chain_tls,
        Some(ChainTls {
            certificate_sds_secret: "default".into(),
            require_client_certificate: true,
        })
    );
    let out = run(&r, inbound(TlsMode::Plaintext, Protocol::Http2));
    assert_eq!((out.filter_chain.as_str(), out.error), ("plain", None));
    // App TLS with an HTTP ALPN matches no chain of port 8080.
    let out = run(&r, inbound(TlsMode::Tls, Protocol::Http));
    assert_eq!(out.error, Some(TrafficError::NoFilterChain));
    // Raw TCP lands on the plaintext chain, whose HTTP connection manager cannot read it.
    let out = run(&r, inbound(TlsMode::Plaintext, Protocol::Tcp));
    assert_eq!(out.error, Some(TrafficError::ProtocolError));
    // mTLS TCP: the ALPN `istio` matches no chain.
    let out = run(&r, inbound(TlsMode::Mtls, Protocol::Tcp));
    assert_eq!(out.error, Some(TrafficError::NoFilterChain));
}

#[test]
fn tls_terminating_chains_check_plaintext_and_mutual_tls() {
    let r = sidecar();
    let app = |tls| Call {
        tls,
        protocol: Some(Protocol::Tcp),
        mode: Some(CallMode::Inbound),
        ..call(8443)
    };
    let out = run(&r, app(TlsMode::Tls));
    assert_eq!((out.cluster.as_str(), out.error), ("inbound|8443||", None));
    assert_eq!(
        out.filter_chain_tls.map(|t| t.certificate_sds_secret),
        Some("file-cert:app.pem~app-key.pem".into())
    );
    assert_eq!(
        run(&r, app(TlsMode::Mtls)).error,
        Some(TrafficError::MtlsError)
    );
    // Without a TLS inspector the plaintext call reaches the chain, which demands TLS.
    let mut blind = r.clone();
    if let Some(l) = blind.listeners.get_mut(VIRTUAL_INBOUND) {
        l.listener_filters.clear();
        for fc in &mut l.filter_chains {
            if let Some(m) = &mut fc.filter_chain_match {
                m.transport_protocol.clear();
                m.application_protocols.clear();
            }
        }
    }
    assert_eq!(
        run(&blind, app(TlsMode::Plaintext)).error,
        Some(TrafficError::TlsError)
    );
    // The certificate that counts as Istio's is the call's to choose.
    let custom = Call {
        mtls_secret_config_name: "file-cert:app.pem~app-key.pem".into(),
        ..app(TlsMode::Tls)
    };
    assert_eq!(
        run(&r, custom).error,
        None,
        "no client certificate required"
    );
}

#[test]
fn tls_to_an_http_manager_that_does_not_terminate_it_is_a_protocol_error() {
    let mut r = sidecar();
    if let Some(l) = r.listeners.get_mut("0.0.0.0_80") {
        l.default_filter_chain = None;
        l.filter_chains[0].filter_chain_match = None;
    }
    let out = run(
        &r,
        Call {
            tls: TlsMode::Tls,
            host: "reviews".into(),
            ..call(80)
        },
    );
    assert_eq!(out.error, Some(TrafficError::ProtocolError));
    assert_eq!(out.filter_chain, "http");
}

#[test]
fn overlapping_chains_are_a_multiple_filter_chain_error() {
    let mut r = sidecar();
    if let Some(l) = r.listeners.get_mut("0.0.0.0_80") {
        let again = l.filter_chains[0].clone();
        l.filter_chains.push(again);
    }
    assert_eq!(
        run(&r, call(80)).error,
        Some(TrafficError::MultipleFilterChain)
    );
}

#[test]
fn defaults_and_invalid_calls() {
    let c = Call {
        tls: TlsMode::Tls,
        host: "a.example.com".into(),
        protocol: Some(Protocol::Http2),
        ..Default::default()
    }
    .with_defaults();
    assert_eq!(c.address, DEFAULT_ADDRESS);
    assert_eq!(c.path, "/");
    assert_eq!(c.sni, "a.example.com");
    assert_eq!(c.alpn, "h2");
    assert_eq!(c.mtls_secret_config_name, WORKLOAD_CERTIFICATE);
    let m = Call {
        tls: TlsMode::Mtls,
        ..Default::default()
    }
    .with_defaults();
    assert_eq!((m.alpn.as_str(), m.sni.as_str()), ("istio", ""));

    let r = sidecar();
    let e = simulate(
        &r,
        &Call {
            alpn: "h2".into(),
            ..call(80)
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("set tls to tls or mtls"), "{e}");
    let e = simulate(
        &r,
        &Call {
            address: "not-an-ip".into(),
            ..call(80)
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("\"not-an-ip\""), "{e}");
}

#[test]
fn the_host_header_may_come_from_headers() {
    let out = run(
        &sidecar(),
        Call {
            headers: [("Host".to_string(), vec!["reviews".to_string()])].into(),
            ..call(80)
        },
    );
    assert_eq!(out.virtual_host, "reviews.default.svc.cluster.local:80");
}

#[test]
fn damaged_typed_configs_are_reported_with_their_place() {
    let mut r = sidecar();
    if let Some(l) = r.listeners.get_mut("0.0.0.0_80") {
        l.filter_chains[0].filters = vec![Filter {
            name: "hcm".into(),
            config_type: Some(filter::ConfigType::TypedConfig(Any {
                type_url: HttpConnectionManager::type_url(),
                value: vec![0xff, 0xff],
            })),
        }];
    }
    let e = simulate(&r, &call(80)).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("listener \"0.0.0.0_80\", filter chain \"http\", filter 0"),
        "{text}"
    );
}

#[test]
fn calls_read_and_outcomes_write_the_corpus_vocabulary() {
    let c: Call = serde_json::from_str(
        r#"{"port": 80, "protocol": "http2", "tls": "mtls", "mode": "inbound", "headers": {"x": ["1"]}}"#,
    )
    .unwrap();
    assert_eq!(c.protocol, Some(Protocol::Http2));
    assert_eq!(c.mode, Some(CallMode::Inbound));
    assert!(serde_json::from_str::<Call>(r#"{"prot": "http"}"#).is_err());
    let out = Outcome {
        error: Some(TrafficError::TlsRedirect),
        listener: "l".into(),
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_string(&out).unwrap(),
        r#"{"error":"TLSRedirect","listener":"l"}"#
    );
    let e: TrafficError = serde_json::from_str(r#""MTLSError""#).unwrap();
    assert_eq!(e, TrafficError::MtlsError);
}
