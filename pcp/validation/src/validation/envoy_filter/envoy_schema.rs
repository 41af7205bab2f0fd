//! The fields of the Envoy messages a patch value is read as, one level deep: each field's proto
//! name and its type, as protobuf's JSON mapping reads it. A message field names its type; the
//! fields of only the messages listed here are known (see [`fields`]), so a value is checked
//! down through these messages and no further.
//!
//! The tables were extracted from the Envoy API's `.proto` files as shipped in envoy-types 0.7.7
//! (the version PASA's agent builds Envoy config with), by compiling them and listing each
//! message's fields. The JSON name of every field is the lowerCamelCase of its proto name.

/// A field's type, as protobuf JSON reads it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Type {
    Bool,
    Int32,
    Int64,
    Uint32,
    Uint64,
    Float,
    Double,
    String,
    Bytes,
    Enum(&'static EnumType),
    /// A message, by its full name.
    Message(&'static str),
    Duration,
    Timestamp,
    Any,
    Struct,
    Value,
    ListValue,
}

/// A singular field, a repeated one, or a map with string keys.
#[derive(Debug, Clone, Copy)]
pub(super) enum Shape {
    One(Type),
    List(Type),
    Map(Type),
}

#[derive(Debug)]
pub(super) struct Field {
    /// The proto name (`lb_policy`); JSON also accepts its lowerCamelCase (`lbPolicy`).
    pub name: &'static str,
    pub shape: Shape,
}

/// An enum: its full name and its value names.
#[derive(Debug)]
pub(super) struct EnumType {
    pub name: &'static str,
    pub values: &'static [&'static str],
}

const fn f(name: &'static str, shape: Shape) -> Field {
    Field { name, shape }
}

use Shape::{List, Map, One};
use Type::{Any, Bool, Duration, Enum, Message, String, Uint32, Uint64};

/// The fields of the message `name`, when it is one of those known here.
pub(super) fn fields(name: &str) -> Option<&'static [Field]> {
    Some(match name {
        CLUSTER => CLUSTER_FIELDS,
        LISTENER => LISTENER_FIELDS,
        ROUTE_CONFIGURATION => ROUTE_CONFIGURATION_FIELDS,
        FILTER_CHAIN => FILTER_CHAIN_FIELDS,
        HTTP_FILTER => HTTP_FILTER_FIELDS,
        NETWORK_FILTER => NETWORK_FILTER_FIELDS,
        VIRTUAL_HOST => VIRTUAL_HOST_FIELDS,
        HTTP_ROUTE => HTTP_ROUTE_FIELDS,
        EXTENSION_CONFIG => EXTENSION_CONFIG_FIELDS,
        BOOTSTRAP => BOOTSTRAP_FIELDS,
        LISTENER_FILTER => LISTENER_FILTER_FIELDS,
        TRANSPORT_SOCKET => TRANSPORT_SOCKET_FIELDS,
        CUSTOM_CLUSTER_TYPE => CUSTOM_CLUSTER_TYPE_FIELDS,
        _ => return None,
    })
}

pub(super) const CLUSTER: &str = "envoy.config.cluster.v3.Cluster";
pub(super) const LISTENER: &str = "envoy.config.listener.v3.Listener";
pub(super) const ROUTE_CONFIGURATION: &str = "envoy.config.route.v3.RouteConfiguration";
pub(super) const FILTER_CHAIN: &str = "envoy.config.listener.v3.FilterChain";
pub(super) const HTTP_FILTER: &str =
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter";
pub(super) const NETWORK_FILTER: &str = "envoy.config.listener.v3.Filter";
pub(super) const VIRTUAL_HOST: &str = "envoy.config.route.v3.VirtualHost";
pub(super) const HTTP_ROUTE: &str = "envoy.config.route.v3.Route";
pub(super) const EXTENSION_CONFIG: &str = "envoy.config.core.v3.TypedExtensionConfig";
pub(super) const BOOTSTRAP: &str = "envoy.config.bootstrap.v3.Bootstrap";
pub(super) const LISTENER_FILTER: &str = "envoy.config.listener.v3.ListenerFilter";
const TRANSPORT_SOCKET: &str = "envoy.config.core.v3.TransportSocket";
const CUSTOM_CLUSTER_TYPE: &str = "envoy.config.cluster.v3.Cluster.CustomClusterType";

/// `envoy.config.cluster.v3.Cluster`.
const CLUSTER_FIELDS: &[Field] = &[
    f("name", One(String)),
    f(
        "type",
        One(Enum(&ENVOY_CONFIG_CLUSTER_V3_CLUSTER_DISCOVERYTYPE)),
    ),
    f(
        "eds_cluster_config",
        One(Message("envoy.config.cluster.v3.Cluster.EdsClusterConfig")),
    ),
    f("connect_timeout", One(Duration)),
    f("per_connection_buffer_limit_bytes", One(Uint32)),
    f(
        "lb_policy",
        One(Enum(&ENVOY_CONFIG_CLUSTER_V3_CLUSTER_LBPOLICY)),
    ),
    f(
        "health_checks",
        List(Message("envoy.config.core.v3.HealthCheck")),
    ),
    f("max_requests_per_connection", One(Uint32)),
    f(
        "circuit_breakers",
        One(Message("envoy.config.cluster.v3.CircuitBreakers")),
    ),
    f(
        "http_protocol_options",
        One(Message("envoy.config.core.v3.Http1ProtocolOptions")),
    ),
    f(
        "http2_protocol_options",
        One(Message("envoy.config.core.v3.Http2ProtocolOptions")),
    ),
    f("dns_refresh_rate", One(Duration)),
    f(
        "dns_lookup_family",
        One(Enum(&ENVOY_CONFIG_CLUSTER_V3_CLUSTER_DNSLOOKUPFAMILY)),
    ),
    f(
        "dns_resolvers",
        List(Message("envoy.config.core.v3.Address")),
    ),
    f(
        "outlier_detection",
        One(Message("envoy.config.cluster.v3.OutlierDetection")),
    ),
    f("cleanup_interval", One(Duration)),
    f(
        "upstream_bind_config",
        One(Message("envoy.config.core.v3.BindConfig")),
    ),
    f(
        "lb_subset_config",
        One(Message("envoy.config.cluster.v3.Cluster.LbSubsetConfig")),
    ),
    f(
        "ring_hash_lb_config",
        One(Message("envoy.config.cluster.v3.Cluster.RingHashLbConfig")),
    ),
    f(
        "transport_socket",
        One(Message("envoy.config.core.v3.TransportSocket")),
    ),
    f("metadata", One(Message("envoy.config.core.v3.Metadata"))),
    f(
        "protocol_selection",
        One(Enum(
            &ENVOY_CONFIG_CLUSTER_V3_CLUSTER_CLUSTERPROTOCOLSELECTION,
        )),
    ),
    f(
        "common_lb_config",
        One(Message("envoy.config.cluster.v3.Cluster.CommonLbConfig")),
    ),
    f("alt_stat_name", One(String)),
    f(
        "common_http_protocol_options",
        One(Message("envoy.config.core.v3.HttpProtocolOptions")),
    ),
    f(
        "upstream_connection_options",
        One(Message("envoy.config.cluster.v3.UpstreamConnectionOptions")),
    ),
    f("close_connections_on_host_health_failure", One(Bool)),
    f("ignore_health_on_host_removal", One(Bool)),
    f(
        "load_assignment",
        One(Message("envoy.config.endpoint.v3.ClusterLoadAssignment")),
    ),
    f(
        "original_dst_lb_config",
        One(Message(
            "envoy.config.cluster.v3.Cluster.OriginalDstLbConfig",
        )),
    ),
    f("typed_extension_protocol_options", Map(Any)),
    f(
        "least_request_lb_config",
        One(Message(
            "envoy.config.cluster.v3.Cluster.LeastRequestLbConfig",
        )),
    ),
    f(
        "cluster_type",
        One(Message("envoy.config.cluster.v3.Cluster.CustomClusterType")),
    ),
    f("respect_dns_ttl", One(Bool)),
    f("filters", List(Message("envoy.config.cluster.v3.Filter"))),
    f(
        "load_balancing_policy",
        One(Message("envoy.config.cluster.v3.LoadBalancingPolicy")),
    ),
    f(
        "lrs_server",
        One(Message("envoy.config.core.v3.ConfigSource")),
    ),
    f(
        "transport_socket_matches",
        List(Message(
            "envoy.config.cluster.v3.Cluster.TransportSocketMatch",
        )),
    ),
    f(
        "dns_failure_refresh_rate",
        One(Message("envoy.config.cluster.v3.Cluster.RefreshRate")),
    ),
    f("use_tcp_for_dns_lookups", One(Bool)),
    f(
        "upstream_http_protocol_options",
        One(Message("envoy.config.core.v3.UpstreamHttpProtocolOptions")),
    ),
    f("track_timeout_budgets", One(Bool)),
    f(
        "upstream_config",
        One(Message("envoy.config.core.v3.TypedExtensionConfig")),
    ),
    f(
        "track_cluster_stats",
        One(Message("envoy.config.cluster.v3.TrackClusterStats")),
    ),
    f(
        "preconnect_policy",
        One(Message("envoy.config.cluster.v3.Cluster.PreconnectPolicy")),
    ),
    f("connection_pool_per_downstream_connection", One(Bool)),
    f(
        "maglev_lb_config",
        One(Message("envoy.config.cluster.v3.Cluster.MaglevLbConfig")),
    ),
    f(
        "dns_resolution_config",
        One(Message("envoy.config.core.v3.DnsResolutionConfig")),
    ),
    f("wait_for_warm_on_init", One(Bool)),
    f(
        "typed_dns_resolver_config",
        One(Message("envoy.config.core.v3.TypedExtensionConfig")),
    ),
    f(
        "round_robin_lb_config",
        One(Message(
            "envoy.config.cluster.v3.Cluster.RoundRobinLbConfig",
        )),
    ),
    f("lrs_report_endpoint_metrics", List(String)),
    f("dns_jitter", One(Duration)),
    f(
        "transport_socket_matcher",
        One(Message("xds.type.matcher.v3.Matcher")),
    ),
    f(
        "per_connection_buffer_high_watermark_timeout",
        One(Duration),
    ),
    f(
        "stats_matcher",
        One(Message("envoy.config.metrics.v3.StatsMatcher")),
    ),
    f(
        "queuing_policies",
        One(Message("envoy.config.cluster.v3.Cluster.QueuingPolicies")),
    ),
];

/// `envoy.config.listener.v3.Listener`.
const LISTENER_FIELDS: &[Field] = &[
    f("name", One(String)),
    f("address", One(Message("envoy.config.core.v3.Address"))),
    f(
        "filter_chains",
        List(Message("envoy.config.listener.v3.FilterChain")),
    ),
    f("use_original_dst", One(Bool)),
    f("per_connection_buffer_limit_bytes", One(Uint32)),
    f("metadata", One(Message("envoy.config.core.v3.Metadata"))),
    f(
        "deprecated_v1",
        One(Message("envoy.config.listener.v3.Listener.DeprecatedV1")),
    ),
    f(
        "drain_type",
        One(Enum(&ENVOY_CONFIG_LISTENER_V3_LISTENER_DRAINTYPE)),
    ),
    f(
        "listener_filters",
        List(Message("envoy.config.listener.v3.ListenerFilter")),
    ),
    f("transparent", One(Bool)),
    f("freebind", One(Bool)),
    f("tcp_fast_open_queue_length", One(Uint32)),
    f(
        "socket_options",
        List(Message("envoy.config.core.v3.SocketOption")),
    ),
    f("listener_filters_timeout", One(Duration)),
    f(
        "traffic_direction",
        One(Enum(&ENVOY_CONFIG_CORE_V3_TRAFFICDIRECTION)),
    ),
    f("continue_on_listener_filters_timeout", One(Bool)),
    f(
        "udp_listener_config",
        One(Message("envoy.config.listener.v3.UdpListenerConfig")),
    ),
    f(
        "api_listener",
        One(Message("envoy.config.listener.v3.ApiListener")),
    ),
    f(
        "connection_balance_config",
        One(Message(
            "envoy.config.listener.v3.Listener.ConnectionBalanceConfig",
        )),
    ),
    f("reuse_port", One(Bool)),
    f(
        "access_log",
        List(Message("envoy.config.accesslog.v3.AccessLog")),
    ),
    f("tcp_backlog_size", One(Uint32)),
    f(
        "default_filter_chain",
        One(Message("envoy.config.listener.v3.FilterChain")),
    ),
    f("bind_to_port", One(Bool)),
    f(
        "internal_listener",
        One(Message(
            "envoy.config.listener.v3.Listener.InternalListenerConfig",
        )),
    ),
    f("stat_prefix", One(String)),
    f("enable_reuse_port", One(Bool)),
    f("enable_mptcp", One(Bool)),
    f("ignore_global_conn_limit", One(Bool)),
    f(
        "filter_chain_matcher",
        One(Message("xds.type.matcher.v3.Matcher")),
    ),
    f(
        "additional_addresses",
        List(Message("envoy.config.listener.v3.AdditionalAddress")),
    ),
    f("max_connections_to_accept_per_socket_event", One(Uint32)),
    f("bypass_overload_manager", One(Bool)),
    f(
        "fcds_config",
        One(Message("envoy.config.listener.v3.Listener.FcdsConfig")),
    ),
    f(
        "tcp_keepalive",
        One(Message("envoy.config.core.v3.TcpKeepalive")),
    ),
    f(
        "per_connection_buffer_high_watermark_timeout",
        One(Duration),
    ),
    f(
        "stats_matcher",
        One(Message("envoy.config.metrics.v3.StatsMatcher")),
    ),
];

/// `envoy.config.route.v3.RouteConfiguration`.
const ROUTE_CONFIGURATION_FIELDS: &[Field] = &[
    f("name", One(String)),
    f(
        "virtual_hosts",
        List(Message("envoy.config.route.v3.VirtualHost")),
    ),
    f("internal_only_headers", List(String)),
    f(
        "response_headers_to_add",
        List(Message("envoy.config.core.v3.HeaderValueOption")),
    ),
    f("response_headers_to_remove", List(String)),
    f(
        "request_headers_to_add",
        List(Message("envoy.config.core.v3.HeaderValueOption")),
    ),
    f("validate_clusters", One(Bool)),
    f("request_headers_to_remove", List(String)),
    f("vhds", One(Message("envoy.config.route.v3.Vhds"))),
    f("most_specific_header_mutations_wins", One(Bool)),
    f("max_direct_response_body_size_bytes", One(Uint32)),
    f(
        "cluster_specifier_plugins",
        List(Message("envoy.config.route.v3.ClusterSpecifierPlugin")),
    ),
    f(
        "request_mirror_policies",
        List(Message(
            "envoy.config.route.v3.RouteAction.RequestMirrorPolicy",
        )),
    ),
    f("ignore_port_in_host_matching", One(Bool)),
    f("ignore_path_parameters_in_path_matching", One(Bool)),
    f("typed_per_filter_config", Map(Any)),
    f("metadata", One(Message("envoy.config.core.v3.Metadata"))),
    f("vhost_header", One(String)),
    f(
        "route_specifiers",
        List(Message("envoy.config.core.v3.TypedExtensionConfig")),
    ),
];

/// `envoy.config.listener.v3.FilterChain`.
const FILTER_CHAIN_FIELDS: &[Field] = &[
    f(
        "filter_chain_match",
        One(Message("envoy.config.listener.v3.FilterChainMatch")),
    ),
    f("filters", List(Message("envoy.config.listener.v3.Filter"))),
    f("use_proxy_proto", One(Bool)),
    f("metadata", One(Message("envoy.config.core.v3.Metadata"))),
    f(
        "transport_socket",
        One(Message("envoy.config.core.v3.TransportSocket")),
    ),
    f("name", One(String)),
    f("transport_socket_connect_timeout", One(Duration)),
];

/// `envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter`.
const HTTP_FILTER_FIELDS: &[Field] = &[
    f("name", One(String)),
    f("typed_config", One(Any)),
    f(
        "config_discovery",
        One(Message("envoy.config.core.v3.ExtensionConfigSource")),
    ),
    f("is_optional", One(Bool)),
    f("disabled", One(Bool)),
];

/// `envoy.config.listener.v3.Filter`.
const NETWORK_FILTER_FIELDS: &[Field] = &[
    f("name", One(String)),
    f("typed_config", One(Any)),
    f(
        "config_discovery",
        One(Message("envoy.config.core.v3.ExtensionConfigSource")),
    ),
];

/// `envoy.config.route.v3.VirtualHost`.
const VIRTUAL_HOST_FIELDS: &[Field] = &[
    f("name", One(String)),
    f("domains", List(String)),
    f("routes", List(Message("envoy.config.route.v3.Route"))),
    f(
        "require_tls",
        One(Enum(&ENVOY_CONFIG_ROUTE_V3_VIRTUALHOST_TLSREQUIREMENTTYPE)),
    ),
    f(
        "virtual_clusters",
        List(Message("envoy.config.route.v3.VirtualCluster")),
    ),
    f(
        "rate_limits",
        List(Message("envoy.config.route.v3.RateLimit")),
    ),
    f(
        "request_headers_to_add",
        List(Message("envoy.config.core.v3.HeaderValueOption")),
    ),
    f("cors", One(Message("envoy.config.route.v3.CorsPolicy"))),
    f(
        "response_headers_to_add",
        List(Message("envoy.config.core.v3.HeaderValueOption")),
    ),
    f("response_headers_to_remove", List(String)),
    f("request_headers_to_remove", List(String)),
    f("include_request_attempt_count", One(Bool)),
    f("typed_per_filter_config", Map(Any)),
    f(
        "retry_policy",
        One(Message("envoy.config.route.v3.RetryPolicy")),
    ),
    f(
        "hedge_policy",
        One(Message("envoy.config.route.v3.HedgePolicy")),
    ),
    f("per_request_buffer_limit_bytes", One(Uint32)),
    f("include_attempt_count_in_response", One(Bool)),
    f("retry_policy_typed_config", One(Any)),
    f("matcher", One(Message("xds.type.matcher.v3.Matcher"))),
    f(
        "request_mirror_policies",
        List(Message(
            "envoy.config.route.v3.RouteAction.RequestMirrorPolicy",
        )),
    ),
    f("include_is_timeout_retry_header", One(Bool)),
    f("metadata", One(Message("envoy.config.core.v3.Metadata"))),
    f("request_body_buffer_limit", One(Uint64)),
    f(
        "route_specifiers",
        List(Message("envoy.config.core.v3.TypedExtensionConfig")),
    ),
];

/// `envoy.config.route.v3.Route`.
const HTTP_ROUTE_FIELDS: &[Field] = &[
    f("match", One(Message("envoy.config.route.v3.RouteMatch"))),
    f("route", One(Message("envoy.config.route.v3.RouteAction"))),
    f(
        "redirect",
        One(Message("envoy.config.route.v3.RedirectAction")),
    ),
    f("metadata", One(Message("envoy.config.core.v3.Metadata"))),
    f("decorator", One(Message("envoy.config.route.v3.Decorator"))),
    f(
        "direct_response",
        One(Message("envoy.config.route.v3.DirectResponseAction")),
    ),
    f(
        "request_headers_to_add",
        List(Message("envoy.config.core.v3.HeaderValueOption")),
    ),
    f(
        "response_headers_to_add",
        List(Message("envoy.config.core.v3.HeaderValueOption")),
    ),
    f("response_headers_to_remove", List(String)),
    f("request_headers_to_remove", List(String)),
    f("typed_per_filter_config", Map(Any)),
    f("name", One(String)),
    f("tracing", One(Message("envoy.config.route.v3.Tracing"))),
    f("per_request_buffer_limit_bytes", One(Uint32)),
    f(
        "filter_action",
        One(Message("envoy.config.route.v3.FilterAction")),
    ),
    f(
        "non_forwarding_action",
        One(Message("envoy.config.route.v3.NonForwardingAction")),
    ),
    f("stat_prefix", One(String)),
    f("request_body_buffer_limit", One(Uint64)),
    f(
        "route_specifiers",
        List(Message("envoy.config.core.v3.TypedExtensionConfig")),
    ),
];

/// `envoy.config.core.v3.TypedExtensionConfig`.
const EXTENSION_CONFIG_FIELDS: &[Field] = &[f("name", One(String)), f("typed_config", One(Any))];

/// `envoy.config.bootstrap.v3.Bootstrap`.
const BOOTSTRAP_FIELDS: &[Field] = &[
    f("node", One(Message("envoy.config.core.v3.Node"))),
    f(
        "static_resources",
        One(Message(
            "envoy.config.bootstrap.v3.Bootstrap.StaticResources",
        )),
    ),
    f(
        "dynamic_resources",
        One(Message(
            "envoy.config.bootstrap.v3.Bootstrap.DynamicResources",
        )),
    ),
    f(
        "cluster_manager",
        One(Message("envoy.config.bootstrap.v3.ClusterManager")),
    ),
    f("flags_path", One(String)),
    f(
        "stats_sinks",
        List(Message("envoy.config.metrics.v3.StatsSink")),
    ),
    f("stats_flush_interval", One(Duration)),
    f(
        "watchdog",
        One(Message("envoy.config.bootstrap.v3.Watchdog")),
    ),
    f("tracing", One(Message("envoy.config.trace.v3.Tracing"))),
    f("admin", One(Message("envoy.config.bootstrap.v3.Admin"))),
    f(
        "stats_config",
        One(Message("envoy.config.metrics.v3.StatsConfig")),
    ),
    f(
        "hds_config",
        One(Message("envoy.config.core.v3.ApiConfigSource")),
    ),
    f(
        "overload_manager",
        One(Message("envoy.config.overload.v3.OverloadManager")),
    ),
    f("enable_dispatcher_stats", One(Bool)),
    f(
        "layered_runtime",
        One(Message("envoy.config.bootstrap.v3.LayeredRuntime")),
    ),
    f("header_prefix", One(String)),
    f("stats_server_version_override", One(Uint64)),
    f("use_tcp_for_dns_lookups", One(Bool)),
    f(
        "bootstrap_extensions",
        List(Message("envoy.config.core.v3.TypedExtensionConfig")),
    ),
    f(
        "config_sources",
        List(Message("envoy.config.core.v3.ConfigSource")),
    ),
    f(
        "default_config_source",
        One(Message("envoy.config.core.v3.ConfigSource")),
    ),
    f("default_socket_interface", One(String)),
    f(
        "certificate_provider_instances",
        Map(Message("envoy.config.core.v3.TypedExtensionConfig")),
    ),
    f("node_context_params", List(String)),
    f(
        "watchdogs",
        One(Message("envoy.config.bootstrap.v3.Watchdogs")),
    ),
    f(
        "fatal_actions",
        List(Message("envoy.config.bootstrap.v3.FatalAction")),
    ),
    f("stats_flush_on_admin", One(Bool)),
    f(
        "dns_resolution_config",
        One(Message("envoy.config.core.v3.DnsResolutionConfig")),
    ),
    f(
        "typed_dns_resolver_config",
        One(Message("envoy.config.core.v3.TypedExtensionConfig")),
    ),
    f(
        "inline_headers",
        List(Message("envoy.config.bootstrap.v3.CustomInlineHeader")),
    ),
    f("perf_tracing_file_path", One(String)),
    f(
        "default_regex_engine",
        One(Message("envoy.config.core.v3.TypedExtensionConfig")),
    ),
    f(
        "xds_delegate_extension",
        One(Message("envoy.config.core.v3.TypedExtensionConfig")),
    ),
    f(
        "xds_config_tracker_extension",
        One(Message("envoy.config.core.v3.TypedExtensionConfig")),
    ),
    f(
        "listener_manager",
        One(Message("envoy.config.core.v3.TypedExtensionConfig")),
    ),
    f(
        "application_log_config",
        One(Message(
            "envoy.config.bootstrap.v3.Bootstrap.ApplicationLogConfig",
        )),
    ),
    f(
        "deferred_stat_options",
        One(Message(
            "envoy.config.bootstrap.v3.Bootstrap.DeferredStatOptions",
        )),
    ),
    f(
        "grpc_async_client_manager_config",
        One(Message(
            "envoy.config.bootstrap.v3.Bootstrap.GrpcAsyncClientManagerConfig",
        )),
    ),
    f(
        "memory_allocator_manager",
        One(Message("envoy.config.bootstrap.v3.MemoryAllocatorManager")),
    ),
    f("stats_eviction_interval", One(Duration)),
    f("enable_worker_cpu_affinity", One(Bool)),
];

/// `envoy.config.listener.v3.ListenerFilter`.
const LISTENER_FILTER_FIELDS: &[Field] = &[
    f("name", One(String)),
    f("typed_config", One(Any)),
    f(
        "filter_disabled",
        One(Message(
            "envoy.config.listener.v3.ListenerFilterChainMatchPredicate",
        )),
    ),
    f(
        "config_discovery",
        One(Message("envoy.config.core.v3.ExtensionConfigSource")),
    ),
];

/// `envoy.config.core.v3.TransportSocket`.
const TRANSPORT_SOCKET_FIELDS: &[Field] = &[f("name", One(String)), f("typed_config", One(Any))];

/// `envoy.config.cluster.v3.Cluster.CustomClusterType`.
const CUSTOM_CLUSTER_TYPE_FIELDS: &[Field] = &[f("name", One(String)), f("typed_config", One(Any))];

const ENVOY_CONFIG_CLUSTER_V3_CLUSTER_DISCOVERYTYPE: EnumType = EnumType {
    name: "envoy.config.cluster.v3.Cluster.DiscoveryType",
    values: &["STATIC", "STRICT_DNS", "LOGICAL_DNS", "EDS", "ORIGINAL_DST"],
};

const ENVOY_CONFIG_CLUSTER_V3_CLUSTER_LBPOLICY: EnumType = EnumType {
    name: "envoy.config.cluster.v3.Cluster.LbPolicy",
    values: &[
        "ROUND_ROBIN",
        "LEAST_REQUEST",
        "RING_HASH",
        "RANDOM",
        "MAGLEV",
        "CLUSTER_PROVIDED",
        "LOAD_BALANCING_POLICY_CONFIG",
    ],
};

const ENVOY_CONFIG_CLUSTER_V3_CLUSTER_DNSLOOKUPFAMILY: EnumType = EnumType {
    name: "envoy.config.cluster.v3.Cluster.DnsLookupFamily",
    values: &["AUTO", "V4_ONLY", "V6_ONLY", "V4_PREFERRED", "ALL"],
};

const ENVOY_CONFIG_CLUSTER_V3_CLUSTER_CLUSTERPROTOCOLSELECTION: EnumType = EnumType {
    name: "envoy.config.cluster.v3.Cluster.ClusterProtocolSelection",
    values: &["USE_CONFIGURED_PROTOCOL", "USE_DOWNSTREAM_PROTOCOL"],
};

const ENVOY_CONFIG_LISTENER_V3_LISTENER_DRAINTYPE: EnumType = EnumType {
    name: "envoy.config.listener.v3.Listener.DrainType",
    values: &["DEFAULT", "MODIFY_ONLY"],
};

const ENVOY_CONFIG_CORE_V3_TRAFFICDIRECTION: EnumType = EnumType {
    name: "envoy.config.core.v3.TrafficDirection",
    values: &["UNSPECIFIED", "INBOUND", "OUTBOUND"],
};

const ENVOY_CONFIG_ROUTE_V3_VIRTUALHOST_TLSREQUIREMENTTYPE: EnumType = EnumType {
    name: "envoy.config.route.v3.VirtualHost.TlsRequirementType",
    values: &["NONE", "EXTERNAL_ONLY", "ALL"],
};
