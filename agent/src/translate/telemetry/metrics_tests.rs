//! Istio's metrics and metadata exchange on Istio's proxy, through the translator.

use envoy_types::pb::envoy::config::listener::v3::Listener;
use prost::Message;
use serde_json::json;

use crate::testing::resource;
use crate::translate::tests::{
    hcm_in, reviews_service, reviews_workload as workload, translate_for as translate,
};

use super::tests::mesh;

/// The names of the network filters of `l`'s chain `chain`, and of its connection manager's
/// HTTP filters (empty without one).
fn chain_filters(l: &Listener, chain: &str) -> (Vec<String>, Vec<String>) {
    let c = l
        .filter_chains
        .iter()
        .chain(l.default_filter_chain.as_ref())
        .find(|c| c.name == chain)
        .unwrap_or_else(|| panic!("no chain {chain} in {}", l.name));
    let network = c.filters.iter().map(|f| f.name.clone()).collect();
    let http = if c
        .filters
        .iter()
        .any(|f| f.name.ends_with("http_connection_manager"))
    {
        hcm_in(l, chain)
            .http_filters
            .iter()
            .map(|f| f.name.clone())
            .collect()
    } else {
        Vec::new()
    };
    (network, http)
}

#[test]
fn istios_proxy_gets_istios_metrics_and_metadata_exchange_where_istiod_puts_them() {
    let db = resource(
        "ServiceEndpoints",
        "default",
        "db",
        json!({"addresses": ["10.96.0.30"], "ports": [{"name": "tcp", "port": 3306}],
               "endpoints": [{"address": "10.0.0.9", "labels": {"app": "db"}}]}),
        1,
    );
    let deny = resource(
        "AuthorizationPolicy",
        "default",
        "deny-admin",
        json!({"selector": {"matchLabels": {"app": "reviews"}}, "action": "DENY",
               "rules": [{"to": [{"operation": {"paths": ["/admin"]}}]}]}),
        2,
    );
    let resources = vec![
        reviews_service(),
        db,
        deny,
        mesh(json!({"defaultProviders": {"metrics": ["prometheus"]}})),
    ];
    let mut proxy = workload();
    proxy.build = crate::model::proxy::ProxyBuild::Istio;
    let out = translate(proxy, resources.clone());
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    // Inbound HTTP: the exchange first, on the connection and in it; the stats before the
    // router, after istiod's fixed filters.
    let inbound = &out.listeners["virtualInbound"];
    let (network, http) = chain_filters(inbound, "0.0.0.0_9080");
    assert_eq!(
        network,
        strings(&[
            "istio.metadata_exchange",
            "envoy.filters.network.http_connection_manager"
        ])
    );
    assert_eq!(
        http,
        strings(&[
            "istio.metadata_exchange",
            "envoy.filters.http.rbac",
            "envoy.filters.http.grpc_stats",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "istio.stats",
            "envoy.filters.http.router"
        ])
    );
    // Every inbound chain starts with the exchange; those proxying TCP count it.
    for chain in inbound.filter_chains.iter() {
        assert_eq!(
            chain.filters[0].name, "istio.metadata_exchange",
            "{}",
            chain.name
        );
        let names: Vec<&str> = chain.filters.iter().map(|f| f.name.as_str()).collect();
        if names.last() == Some(&"envoy.filters.network.tcp_proxy") {
            assert_eq!(names[names.len() - 2], "istio.stats", "{}", chain.name);
        }
    }

    // Outbound HTTP: the exchange sends the proxy's metadata; ALPN tells the protocol.
    let (_, http) = chain_filters(&out.listeners["0.0.0.0_9080"], "");
    assert_eq!(
        http,
        strings(&[
            "istio.metadata_exchange",
            "envoy.filters.http.grpc_stats",
            "istio.alpn",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "istio.stats",
            "envoy.filters.http.router"
        ])
    );
    // Outbound TCP and the passthrough: stats before the proxy, no exchange on the listener.
    let (network, _) = chain_filters(&out.listeners["10.96.0.30_3306"], "");
    assert_eq!(
        network,
        strings(&["istio.stats", "envoy.filters.network.tcp_proxy"])
    );
    for chain in ["virtualOutbound-catchall-tcp", "virtualOutbound-blackhole"] {
        let (network, _) = chain_filters(&out.listeners["virtualOutbound"], chain);
        assert_eq!(
            network,
            strings(&["istio.stats", "envoy.filters.network.tcp_proxy"]),
            "{chain}"
        );
    }

    // Upstream, the exchange ends the outbound clusters and the passthrough.
    let last_filter = |name: &str| out.clusters[name].filters.last().map(|f| f.name.clone());
    for name in [
        "outbound|9080||reviews.default.svc.cluster.local",
        "outbound|3306||db.default.svc.cluster.local",
        "PassthroughCluster",
    ] {
        assert_eq!(
            last_filter(name).as_deref(),
            Some("istio.metadata_exchange"),
            "{name}"
        );
    }
    for name in [
        "inbound|9080||",
        "BlackHoleCluster",
        "InboundPassthroughCluster",
    ] {
        assert_eq!(last_filter(name), None, "{name}");
    }

    // The services clusters are for, which Istio's stats label requests with.
    let services = |name: &str| -> Vec<(String, String, String)> {
        let istio = &out.clusters[name]
            .metadata
            .as_ref()
            .expect("metadata")
            .filter_metadata["istio"];
        use envoy_types::pb::google::protobuf::value::Kind;
        let Some(Kind::ListValue(list)) = &istio.fields["services"].kind else {
            panic!("a list")
        };
        list.values
            .iter()
            .map(|v| {
                let Some(Kind::StructValue(s)) = &v.kind else {
                    panic!("a struct")
                };
                let field = |f: &str| match &s.fields[f].kind {
                    Some(Kind::StringValue(v)) => v.clone(),
                    other => panic!("{other:?}"),
                };
                (field("host"), field("name"), field("namespace"))
            })
            .collect()
    };
    let reviews = vec![(
        "reviews.default.svc.cluster.local".to_string(),
        "reviews".to_string(),
        "default".to_string(),
    )];
    assert_eq!(
        services("outbound|9080||reviews.default.svc.cluster.local"),
        reviews
    );
    assert_eq!(services("inbound|9080||"), reviews);
    // Encoded alike each time (a resource's version is a digest of its encoding).
    let mut again = workload();
    again.build = crate::model::proxy::ProxyBuild::Istio;
    let twice = |p: crate::model::proxy::Proxy| {
        crate::translate::Translator::new(p).generate(
            &crate::translate::tests::cache(resources.clone()),
            crate::model::proxy::Generator::Envoy,
        )
    };
    let (a, b) = (twice(again.clone()), twice(again));
    for name in [
        "outbound|9080||reviews.default.svc.cluster.local",
        "inbound|9080||",
    ] {
        assert_eq!(a.clusters[name].version, b.clusters[name].version, "{name}");
    }

    // Istio's proxy offers the in-band exchange's ALPN, paired with its filter.
    assert_eq!(
        mutual_alpn(&out.clusters["outbound|3306||db.default.svc.cluster.local"]),
        ["istio-peer-exchange", "istio"]
    );

    // Upstream Envoy gets gRPC statistics and none of Istio's filters; it neither offers the
    // exchange's ALPN nor accepts it (a peer negotiating it would write its metadata in band).
    let out = translate(workload(), resources);
    assert_eq!(
        mutual_alpn(&out.clusters["outbound|3306||db.default.svc.cluster.local"]),
        ["istio"]
    );
    let mut mutual = 0;
    for chain in &out.listeners["virtualInbound"].filter_chains {
        if let Some(socket) = &chain.transport_socket {
            mutual += 1;
            use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
            use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
            let Some(ConfigType::TypedConfig(any)) = &socket.config_type else {
                panic!("typed")
            };
            let tls = DownstreamTlsContext::decode(any.value.as_slice()).unwrap();
            let alpn = tls.common_tls_context.unwrap().alpn_protocols;
            assert!(
                !alpn.contains(&"istio-peer-exchange".to_string()),
                "{}: {alpn:?}",
                chain.name
            );
        }
    }
    assert!(mutual > 0, "permissive inbound has mutual TLS chains");
    let (_, http) = chain_filters(&out.listeners["0.0.0.0_9080"], "");
    assert_eq!(
        http,
        strings(&[
            "envoy.filters.http.grpc_stats",
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "envoy.filters.http.router"
        ])
    );
    let dump = format!("{:?}", (&out.listeners, &out.clusters));
    assert!(!dump.contains("istio.stats") && !dump.contains("istio.metadata_exchange"));
}

/// The ALPN an ISTIO_MUTUAL cluster offers (its `tlsMode-istio` transport socket's).
fn mutual_alpn(c: &envoy_types::pb::envoy::config::cluster::v3::Cluster) -> Vec<String> {
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    let socket = c
        .transport_socket_matches
        .iter()
        .find(|m| m.name == "tlsMode-istio")
        .and_then(|m| m.transport_socket.as_ref())
        .expect("an Istio mutual TLS socket");
    let Some(ConfigType::TypedConfig(any)) = &socket.config_type else {
        panic!("typed")
    };
    UpstreamTlsContext::decode(any.value.as_slice())
        .unwrap()
        .common_tls_context
        .unwrap()
        .alpn_protocols
}

#[test]
fn a_routers_istio_mutual_tcp_server_exchanges_metadata_on_istios_proxy_only() {
    let gateway = resource(
        "Gateway",
        "istio-system",
        "gw",
        json!({"selector": {"istio": "ingressgateway"}, "servers": [
            {"port": {"number": 8443, "name": "tls", "protocol": "TLS"}, "hosts": ["*"],
             "tls": {"mode": "ISTIO_MUTUAL"}}]}),
        1,
    );
    let route = resource(
        "VirtualService",
        "istio-system",
        "db",
        json!({"hosts": ["*"], "gateways": ["gw"],
               "tcp": [{"route": [{"destination": {"host": "reviews.default.svc.cluster.local",
                                                   "port": {"number": 9080}}}]}]}),
        2,
    );
    let resources = vec![
        reviews_service(),
        gateway,
        route,
        mesh(json!({"defaultProviders": {"metrics": ["prometheus"]}})),
    ];
    // As istiod: the exchange first and the stats before the proxy; ALPN offers the exchange
    // before HTTP's.
    let chain = |build| {
        let mut router = crate::testing::router("10.0.0.50");
        router.build = build;
        let out = translate(router, resources.clone());
        let l = &out.listeners["0.0.0.0_8443"];
        let c = &l.filter_chains[0];
        let names: Vec<String> = c.filters.iter().map(|f| f.name.clone()).collect();
        use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
        use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
        let Some(ConfigType::TypedConfig(any)) =
            &c.transport_socket.as_ref().expect("TLS").config_type
        else {
            panic!("typed")
        };
        let alpn = DownstreamTlsContext::decode(any.value.as_slice())
            .unwrap()
            .common_tls_context
            .unwrap()
            .alpn_protocols;
        (names, alpn)
    };
    let (names, alpn) = chain(crate::model::proxy::ProxyBuild::Istio);
    assert_eq!(
        names,
        [
            "istio.metadata_exchange",
            "istio.stats",
            "envoy.filters.network.tcp_proxy"
        ]
    );
    assert_eq!(alpn, ["istio-peer-exchange", "h2", "http/1.1"]);
    let (names, alpn) = chain(crate::model::proxy::ProxyBuild::Envoy);
    assert_eq!(names, ["envoy.filters.network.tcp_proxy"]);
    assert_eq!(alpn, ["h2", "http/1.1"]);
}

#[test]
fn a_sidecar_ingress_clusters_service_labels_are_of_the_service_its_port_serves() {
    let sidecar = resource(
        "Sidecar",
        "default",
        "reviews",
        json!({"workloadSelector": {"labels": {"app": "reviews"}}, "ingress": [
            {"port": {"number": 9080, "protocol": "HTTP", "name": "http"},
             "defaultEndpoint": "127.0.0.1:8080"},
            {"port": {"number": 7070, "protocol": "TCP", "name": "tcp"},
             "defaultEndpoint": "127.0.0.1:7070"}]}),
        2,
    );
    let mut proxy = workload();
    proxy.build = crate::model::proxy::ProxyBuild::Istio;
    let out = translate(proxy, vec![reviews_service(), sidecar]);
    let services = |name: &str| {
        out.clusters[name]
            .metadata
            .as_ref()
            .and_then(|m| m.filter_metadata.get("istio"))
            .map(|s| format!("{:?}", s.fields.get("services")))
    };
    // 9080 is reviews's port; nothing serves 7070 (istiod's stand-in service is labelled
    // nowhere).
    assert!(
        services("inbound|9080||").is_some_and(|s| s.contains("reviews.default.svc.cluster.local")),
        "{:?}",
        services("inbound|9080||")
    );
    assert_eq!(services("inbound|7070||"), None);
}
