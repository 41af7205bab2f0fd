//! The Kubernetes Gateway API objects (`gateway.networking.k8s.io`), as far as the conversion
//! reads them. Every field is optional on the wire; absent ones read as empty.

use std::collections::BTreeMap;

use serde::Deserialize;

pub use pasa_istio::label_selector::LabelSelector;

/// The metadata the conversion reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Meta {
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// RFC 3339, so text order is time order; empty counts as oldest.
    pub creation_timestamp: String,
    pub uid: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewayClass {
    pub metadata: Meta,
    pub spec: GatewayClassSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewayClassSpec {
    pub controller_name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Gateway {
    pub metadata: Meta,
    pub spec: GatewaySpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewaySpec {
    pub gateway_class_name: String,
    pub listeners: Vec<Listener>,
    pub addresses: Vec<Address>,
    pub infrastructure: Option<Infrastructure>,
    pub tls: Option<GatewayTls>,
    pub allowed_listeners: Option<AllowedListeners>,
}

/// Which namespaces' ListenerSets a Gateway admits.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AllowedListeners {
    pub namespaces: Option<RouteNamespaces>,
}

/// Listeners of a Gateway written apart from it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ListenerSet {
    pub metadata: Meta,
    pub spec: ListenerSetSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ListenerSetSpec {
    pub parent_ref: ParentRef,
    pub listeners: Vec<Listener>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Address {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub value: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Infrastructure {
    pub parameters_ref: Option<LocalRef>,
}

/// A reference by group, kind and name (`parametersRef`, `caCertificateRefs`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LocalRef {
    pub group: String,
    pub kind: String,
    pub name: String,
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewayTls {
    pub frontend: Option<FrontendTls>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct FrontendTls {
    pub default: FrontendTlsConfig,
    pub per_port: Vec<FrontendPerPort>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct FrontendPerPort {
    pub port: u32,
    pub tls: FrontendTlsConfig,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct FrontendTlsConfig {
    pub validation: Option<FrontendValidation>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct FrontendValidation {
    pub ca_certificate_refs: Vec<LocalRef>,
    pub mode: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Listener {
    pub name: String,
    pub hostname: Option<String>,
    pub port: u32,
    pub protocol: String,
    pub tls: Option<ListenerTls>,
    pub allowed_routes: Option<AllowedRoutes>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ListenerTls {
    pub mode: Option<String>,
    pub certificate_refs: Vec<ObjectRef>,
    pub options: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AllowedRoutes {
    pub namespaces: Option<RouteNamespaces>,
    pub kinds: Vec<GroupKind>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RouteNamespaces {
    pub from: Option<String>,
    pub selector: Option<LabelSelector>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct GroupKind {
    pub group: Option<String>,
    pub kind: String,
}

/// A reference to an object (a certificate, a backend, a mirror target).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ObjectRef {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub name: String,
    pub namespace: Option<String>,
    pub port: Option<u32>,
}

/// A route of any kind: its parents, hostnames and rules.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Route<R> {
    pub metadata: Meta,
    pub spec: RouteSpec<R>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RouteSpec<R> {
    pub parent_refs: Vec<ParentRef>,
    pub hostnames: Vec<String>,
    pub rules: Vec<R>,
}

impl<R> Default for RouteSpec<R> {
    fn default() -> Self {
        RouteSpec {
            parent_refs: Vec::new(),
            hostnames: Vec::new(),
            rules: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ParentRef {
    pub group: Option<String>,
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub name: String,
    pub section_name: Option<String>,
    pub port: Option<u32>,
}

/// A rule of an HTTPRoute.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRule {
    pub name: Option<String>,
    pub matches: Vec<HttpMatch>,
    pub filters: Vec<Filter>,
    pub backend_refs: Vec<BackendRef>,
    pub timeouts: Option<Timeouts>,
    pub retry: Option<Retry>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpMatch {
    pub path: Option<PathMatch>,
    pub headers: Vec<ValueMatch>,
    pub query_params: Vec<ValueMatch>,
    pub method: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PathMatch {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub value: Option<String>,
}

/// A header or query parameter match.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ValueMatch {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Timeouts {
    pub request: Option<String>,
    pub backend_request: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Retry {
    pub codes: Vec<u32>,
    pub attempts: Option<i64>,
    pub backoff: Option<String>,
}

/// A filter of an HTTPRoute or GRPCRoute rule, or of one of its backends.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Filter {
    #[serde(rename = "type")]
    pub kind: String,
    pub request_header_modifier: Option<HeaderFilter>,
    pub response_header_modifier: Option<HeaderFilter>,
    pub request_redirect: Option<Redirect>,
    pub request_mirror: Option<Mirror>,
    #[serde(rename = "urlRewrite")]
    pub url_rewrite: Option<Rewrite>,
    pub cors: Option<Cors>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HeaderFilter {
    pub set: Vec<Header>,
    pub add: Vec<Header>,
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Header {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Redirect {
    pub scheme: Option<String>,
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
    pub port: Option<u32>,
    pub status_code: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PathModifier {
    #[serde(rename = "type")]
    pub kind: String,
    pub replace_full_path: Option<String>,
    pub replace_prefix_match: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Mirror {
    pub backend_ref: ObjectRef,
    pub percent: Option<i64>,
    pub fraction: Option<Fraction>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Fraction {
    pub numerator: i64,
    pub denominator: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Rewrite {
    pub hostname: Option<String>,
    pub path: Option<PathModifier>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Cors {
    pub allow_origins: Vec<String>,
    pub allow_credentials: Option<bool>,
    pub allow_methods: Vec<String>,
    pub allow_headers: Vec<String>,
    pub expose_headers: Vec<String>,
    pub max_age: i64,
}

/// A backend of a rule: the object, its port and weight, and (HTTP, gRPC) its filters.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct BackendRef {
    #[serde(flatten)]
    pub object: ObjectRef,
    pub weight: Option<i64>,
    pub filters: Vec<Filter>,
}

/// A rule of a GRPCRoute.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GrpcRule {
    pub name: Option<String>,
    pub matches: Vec<GrpcMatch>,
    pub filters: Vec<Filter>,
    pub backend_refs: Vec<BackendRef>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GrpcMatch {
    pub method: Option<GrpcMethod>,
    pub headers: Vec<ValueMatch>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GrpcMethod {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub service: Option<String>,
    pub method: Option<String>,
}

/// A rule of a TCPRoute or TLSRoute.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StreamRule {
    pub backend_refs: Vec<BackendRef>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ReferenceGrant {
    pub metadata: Meta,
    pub spec: ReferenceGrantSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ReferenceGrantSpec {
    pub from: Vec<GrantFrom>,
    pub to: Vec<GrantTo>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GrantFrom {
    pub group: String,
    pub kind: String,
    pub namespace: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GrantTo {
    pub group: String,
    pub kind: String,
    pub name: Option<String>,
}
