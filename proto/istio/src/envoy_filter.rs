//! `EnvoyFilter` (`networking.istio.io` v1alpha3): patches applied to the Envoy configuration
//! istiod generates — which workloads they apply to, which generated object each patch selects
//! (a listener, filter chain, filter, route configuration, virtual host, route, cluster, ...) and
//! what is done to it (merged, added, removed, inserted, replaced) with what Envoy config.
//!
//! A patch's `value` is a `google.protobuf.Struct` holding Envoy API JSON; it is kept as JSON
//! here, and validation reads it as the Envoy type the patch's `applyTo` names.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::authorization_policy::PolicyTargetReference;
use super::common::check_oneof;
use super::service_entry::WorkloadSelector;
use crate::proto_enum;

/// The `spec` of an EnvoyFilter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EnvoyFilter {
    /// The workloads the patches apply to; absent, every workload of the namespace (of the mesh
    /// for the config root namespace).
    #[serde(default)]
    pub workload_selector: Option<WorkloadSelector>,
    /// The gateways (or gateway classes) the patches apply to, instead of a selector.
    #[serde(default)]
    pub target_refs: Vec<PolicyTargetReference>,
    /// A null entry is kept so that validation can name it.
    #[serde(default)]
    pub config_patches: Vec<Option<EnvoyConfigObjectPatch>>,
    /// Order among the EnvoyFilters of one context (lower first).
    #[serde(default)]
    pub priority: i32,
}

proto_enum! {
    /// The kind of Envoy object a patch applies to (`EnvoyFilter.ApplyTo`).
    pub enum ApplyTo {
        Invalid = 0 => "INVALID",
        Listener = 1 => "LISTENER",
        FilterChain = 2 => "FILTER_CHAIN",
        NetworkFilter = 3 => "NETWORK_FILTER",
        HttpFilter = 4 => "HTTP_FILTER",
        RouteConfiguration = 5 => "ROUTE_CONFIGURATION",
        VirtualHost = 6 => "VIRTUAL_HOST",
        HttpRoute = 7 => "HTTP_ROUTE",
        Cluster = 8 => "CLUSTER",
        ExtensionConfig = 9 => "EXTENSION_CONFIG",
        Bootstrap = 10 => "BOOTSTRAP",
        ListenerFilter = 11 => "LISTENER_FILTER",
    }
}

proto_enum! {
    /// Which of istiod's generation contexts a patch applies in (`EnvoyFilter.PatchContext`).
    pub enum PatchContext {
        Any = 0 => "ANY",
        SidecarInbound = 1 => "SIDECAR_INBOUND",
        SidecarOutbound = 2 => "SIDECAR_OUTBOUND",
        Gateway = 3 => "GATEWAY",
        Waypoint = 4 => "WAYPOINT",
    }
}

proto_enum! {
    /// How a patch changes the object it selects (`EnvoyFilter.Patch.Operation`).
    pub enum Operation {
        Invalid = 0 => "INVALID",
        Merge = 1 => "MERGE",
        Add = 2 => "ADD",
        Remove = 3 => "REMOVE",
        InsertBefore = 4 => "INSERT_BEFORE",
        InsertAfter = 5 => "INSERT_AFTER",
        InsertFirst = 6 => "INSERT_FIRST",
        Replace = 7 => "REPLACE",
        MergeAndReplaceList = 8 => "MERGE_AND_REPLACE_LIST",
    }
}

proto_enum! {
    /// Where an added filter goes relative to Istio's own filters (`EnvoyFilter.Patch.FilterClass`).
    pub enum FilterClass {
        Unspecified = 0 => "UNSPECIFIED",
        Authn = 1 => "AUTHN",
        Authz = 2 => "AUTHZ",
        Stats = 3 => "STATS",
    }
}

proto_enum! {
    /// The action of the routes a route match selects
    /// (`EnvoyFilter.RouteConfigurationMatch.RouteMatch.Action`).
    pub enum RouteAction {
        Any = 0 => "ANY",
        Route = 1 => "ROUTE",
        Redirect = 2 => "REDIRECT",
        DirectResponse = 3 => "DIRECT_RESPONSE",
    }
}

/// One patch: what it applies to, which objects it selects, and the change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EnvoyConfigObjectPatch {
    #[serde(default)]
    pub apply_to: ApplyTo,
    #[serde(default, rename = "match")]
    pub match_: Option<EnvoyConfigObjectMatch>,
    #[serde(default)]
    pub patch: Option<Patch>,
}

/// The change a patch makes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Patch {
    #[serde(default)]
    pub operation: Operation,
    /// The Envoy config (a `google.protobuf.Struct`), as JSON.
    #[serde(default)]
    pub value: Option<Map<String, Value>>,
    #[serde(default)]
    pub filter_class: FilterClass,
}

/// Which generated objects a patch selects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(
    try_from = "EnvoyConfigObjectMatchJson",
    into = "EnvoyConfigObjectMatchJson"
)]
pub struct EnvoyConfigObjectMatch {
    pub context: PatchContext,
    pub proxy: Option<ProxyMatch>,
    /// The `object_types` oneof: `None` selects by context and proxy only.
    pub object: Option<ObjectMatch>,
}

/// The `object_types` oneof of [`EnvoyConfigObjectMatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectMatch {
    Listener(ListenerMatch),
    RouteConfiguration(RouteConfigurationMatch),
    Cluster(ClusterMatch),
    Waypoint(WaypointMatch),
}

impl EnvoyConfigObjectMatch {
    pub fn listener(&self) -> Option<&ListenerMatch> {
        match &self.object {
            Some(ObjectMatch::Listener(l)) => Some(l),
            _ => None,
        }
    }

    pub fn route_configuration(&self) -> Option<&RouteConfigurationMatch> {
        match &self.object {
            Some(ObjectMatch::RouteConfiguration(r)) => Some(r),
            _ => None,
        }
    }

    pub fn cluster(&self) -> Option<&ClusterMatch> {
        match &self.object {
            Some(ObjectMatch::Cluster(c)) => Some(c),
            _ => None,
        }
    }

    pub fn waypoint(&self) -> Option<&WaypointMatch> {
        match &self.object {
            Some(ObjectMatch::Waypoint(w)) => Some(w),
            _ => None,
        }
    }
}

/// [`EnvoyConfigObjectMatch`] as JSON writes it: the oneof's members side by side.
#[derive(Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
struct EnvoyConfigObjectMatchJson {
    #[serde(skip_serializing_if = "is_default_context")]
    context: PatchContext,
    #[serde(skip_serializing_if = "Option::is_none")]
    proxy: Option<ProxyMatch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    listener: Option<ListenerMatch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    route_configuration: Option<RouteConfigurationMatch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<ClusterMatch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    waypoint: Option<WaypointMatch>,
}

fn is_default_context(context: &PatchContext) -> bool {
    *context == PatchContext::Any
}

impl TryFrom<EnvoyConfigObjectMatchJson> for EnvoyConfigObjectMatch {
    type Error = String;

    fn try_from(json: EnvoyConfigObjectMatchJson) -> Result<Self, String> {
        check_oneof(
            "a patch match",
            &[
                ("listener", json.listener.is_some()),
                ("routeConfiguration", json.route_configuration.is_some()),
                ("cluster", json.cluster.is_some()),
                ("waypoint", json.waypoint.is_some()),
            ],
        )?;
        let object = json
            .listener
            .map(ObjectMatch::Listener)
            .or(json
                .route_configuration
                .map(ObjectMatch::RouteConfiguration))
            .or(json.cluster.map(ObjectMatch::Cluster))
            .or(json.waypoint.map(ObjectMatch::Waypoint));
        Ok(EnvoyConfigObjectMatch {
            context: json.context,
            proxy: json.proxy,
            object,
        })
    }
}

impl From<EnvoyConfigObjectMatch> for EnvoyConfigObjectMatchJson {
    fn from(m: EnvoyConfigObjectMatch) -> Self {
        let mut json = EnvoyConfigObjectMatchJson {
            context: m.context,
            proxy: m.proxy,
            ..Default::default()
        };
        match m.object {
            None => {}
            Some(ObjectMatch::Listener(l)) => json.listener = Some(l),
            Some(ObjectMatch::RouteConfiguration(r)) => json.route_configuration = Some(r),
            Some(ObjectMatch::Cluster(c)) => json.cluster = Some(c),
            Some(ObjectMatch::Waypoint(w)) => json.waypoint = Some(w),
        }
        json
    }
}

/// The node metadata PASA's agent knows of its proxy, by key: a patch whose `match.proxy`
/// names another key cannot be matched by the agent as istiod matches it.
pub const AGENT_KNOWN_METADATA: [&str; 6] = [
    "ISTIO_VERSION",
    "NAMESPACE",
    "CLUSTER_ID",
    "NETWORK",
    "INTERCEPTION_MODE",
    "INSTANCE_IPS",
];

/// Properties of the proxy a patch applies to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyMatch {
    /// An RE2 expression the proxy's Istio version must match.
    #[serde(default)]
    pub proxy_version: String,
    /// Node metadata the proxy must carry, each key with exactly this value.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// A listener, or a filter chain or filter inside one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListenerMatch {
    #[serde(default)]
    pub port_number: u32,
    /// Not implemented by istiod.
    #[serde(default)]
    pub port_name: String,
    #[serde(default)]
    pub filter_chain: Option<FilterChainMatch>,
    /// The name of a listener filter (for `LISTENER_FILTER` patches).
    #[serde(default)]
    pub listener_filter: String,
    #[serde(default)]
    pub name: String,
}

/// A filter chain of a listener, and optionally a filter in it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FilterChainMatch {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub sni: String,
    #[serde(default)]
    pub transport_protocol: String,
    /// Comma-separated application protocols (`h2,http/1.1`).
    #[serde(default)]
    pub application_protocols: String,
    #[serde(default)]
    pub filter: Option<FilterMatch>,
    #[serde(default)]
    pub destination_port: u32,
    /// The transport socket's name (`envoy.transport_sockets.tls`).
    #[serde(default)]
    pub transport_socket: String,
}

/// A network filter, and optionally a filter inside it (an HTTP filter of the connection
/// manager).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FilterMatch {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub sub_filter: Option<SubFilterMatch>,
}

/// A filter inside another filter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SubFilterMatch {
    #[serde(default)]
    pub name: String,
}

/// A route configuration, or a virtual host or route inside one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RouteConfigurationMatch {
    #[serde(default)]
    pub port_number: u32,
    /// Gateways only: the server port's name.
    #[serde(default)]
    pub port_name: String,
    /// Gateways only: the Gateway (`namespace/name`) the routes were generated for.
    #[serde(default)]
    pub gateway: String,
    #[serde(default)]
    pub vhost: Option<VirtualHostMatch>,
    #[serde(default)]
    pub name: String,
}

/// A virtual host of a route configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VirtualHostMatch {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub route: Option<RouteMatch>,
    #[serde(default)]
    pub domain_name: String,
}

/// A route of a virtual host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteMatch {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub action: RouteAction,
}

/// A cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterMatch {
    #[serde(default)]
    pub port_number: u32,
    #[serde(default)]
    pub service: String,
    #[serde(default)]
    pub subset: String,
    #[serde(default)]
    pub name: String,
}

/// Objects of a waypoint proxy (context `WAYPOINT` only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WaypointMatch {
    #[serde(default)]
    pub filter: Option<FilterMatch>,
    #[serde(default)]
    pub route: Option<WaypointRouteMatch>,
    /// Kept as given: the CRD refuses a port number that is present but 0.
    #[serde(default)]
    pub port_number: Option<u32>,
}

/// A route of a waypoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WaypointRouteMatch {
    #[serde(default)]
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_spec;
    use serde_json::json;

    #[test]
    fn reads_an_envoy_filter() {
        let ef: EnvoyFilter = parse_spec(&json!({
            "workloadSelector": {"labels": {"app": "a"}},
            "priority": -1,
            "configPatches": [{
                "applyTo": "HTTP_FILTER",
                "match": {
                    "context": "SIDECAR_INBOUND",
                    "proxy": {"proxyVersion": "^1\\.2.*"},
                    "listener": {"portNumber": 8080, "filterChain": {"filter": {
                        "name": "envoy.filters.network.http_connection_manager",
                        "subFilter": {"name": "envoy.filters.http.router"}}}}
                },
                "patch": {"operation": "INSERT_BEFORE", "filterClass": "AUTHZ",
                          "value": {"name": "x", "typed_config": {"@type": "t"}}}
            }, null]
        }))
        .unwrap();
        assert_eq!(ef.priority, -1);
        assert_eq!(ef.config_patches.len(), 2);
        assert!(ef.config_patches[1].is_none());
        let patch = ef.config_patches[0].as_ref().unwrap();
        assert_eq!(patch.apply_to, ApplyTo::HttpFilter);
        let m = patch.match_.as_ref().unwrap();
        assert_eq!(m.context, PatchContext::SidecarInbound);
        let filter = m
            .listener()
            .and_then(|l| l.filter_chain.as_ref())
            .and_then(|fc| fc.filter.as_ref())
            .unwrap();
        assert_eq!(
            filter.sub_filter.as_ref().map(|s| s.name.as_str()),
            Some("envoy.filters.http.router")
        );
        let p = patch.patch.as_ref().unwrap();
        assert_eq!(p.operation, Operation::InsertBefore);
        assert_eq!(p.filter_class, FilterClass::Authz);
        assert_eq!(p.value.as_ref().unwrap()["name"], "x");
    }

    #[test]
    fn an_empty_match_object_is_kept() {
        let ef: EnvoyFilter = parse_spec(&json!({
            "configPatches": [{"applyTo": "CLUSTER", "match": {"cluster": {}}}]
        }))
        .unwrap();
        let m = ef.config_patches[0]
            .as_ref()
            .and_then(|p| p.match_.as_ref())
            .unwrap();
        assert_eq!(m.cluster(), Some(&ClusterMatch::default()));
    }

    #[test]
    fn two_object_matches_are_refused() {
        let err = parse_spec::<EnvoyFilter>(&json!({
            "configPatches": [{"match": {"cluster": {}, "listener": {}}}]
        }))
        .unwrap_err();
        assert_eq!(err.field, "spec.configPatches[0].match");
        assert!(
            err.message.contains("found listener and cluster"),
            "{err:?}"
        );
    }

    #[test]
    fn a_value_must_be_an_object() {
        let err = parse_spec::<EnvoyFilter>(&json!({
            "configPatches": [{"patch": {"operation": "ADD", "value": "x"}}]
        }))
        .unwrap_err();
        assert_eq!(err.field, "spec.configPatches[0].patch.value");
    }
}
