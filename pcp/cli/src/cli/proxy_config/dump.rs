//! The agent's `/config_dump`, read back: for one generator, every resource it serves, as the
//! protobuf `Any` it was sent in and decoded to its Envoy type.
//!
//! The document is `{"revision", "generators": {"<generator>": {"CDS"|"EDS"|"LDS"|"RDS"|"ECDS"|"VHDS":
//! [{"name", "version", "type_url", "resource": base64 of the protobuf encoding}]}}}`.

use base64::Engine as _;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use serde_json::Value;

/// A `/config_dump` that cannot be read; the message names the field at fault.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error("the agent's /config_dump is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("the agent's /config_dump has no field generators; is the agent up to date?")]
    NoGenerators,
    #[error(
        "the agent has generated nothing for {generator} clients yet (it has: {available}); try --generator"
    )]
    NoSuchGenerator {
        generator: String,
        available: String,
    },
    #[error("the agent's /config_dump field {field}: {problem}")]
    Field { field: String, problem: String },
}

/// One served resource: its name, as sent, and decoded.
#[derive(Debug, Clone)]
pub struct Served<T> {
    pub name: String,
    pub any: Any,
    pub message: T,
}

/// What the agent serves to one generator's clients.
#[derive(Debug, Clone, Default)]
pub struct Resources {
    pub clusters: Vec<Served<Cluster>>,
    pub endpoints: Vec<Served<ClusterLoadAssignment>>,
    pub listeners: Vec<Served<Listener>>,
    pub routes: Vec<Served<RouteConfiguration>>,
    /// ECDS: the filters listeners name by `config_discovery` (an agent older than ECDS lists
    /// none).
    pub extension_configs: Vec<Served<TypedExtensionConfig>>,
    /// SDS: the workload certificate, the root and a gateway's credentials, private keys
    /// redacted by whoever dumped them.
    pub secrets: Vec<Served<Secret>>,
}

impl Resources {
    /// Reads the resources of `generator` from the text of a `/config_dump`.
    pub fn from_dump(text: &[u8], generator: &str) -> Result<Resources, DumpError> {
        let doc: Value = serde_json::from_slice(text).map_err(DumpError::NotJson)?;
        let generators = doc
            .get("generators")
            .and_then(Value::as_object)
            .ok_or(DumpError::NoGenerators)?;
        let Some(types) = generators.get(generator) else {
            let available: Vec<&str> = generators.keys().map(String::as_str).collect();
            return Err(DumpError::NoSuchGenerator {
                generator: generator.to_string(),
                available: if available.is_empty() {
                    "nothing".into()
                } else {
                    available.join(", ")
                },
            });
        };
        let field = |kind: &str| format!("generators.{generator}.{kind}");
        let mut routes = read(types, "RDS", &field("RDS"))?;
        let virtual_hosts: Vec<Served<VirtualHost>> = read(types, "VHDS", &field("VHDS"))?;
        with_virtual_hosts(&mut routes, virtual_hosts);
        Ok(Resources {
            clusters: read(types, "CDS", &field("CDS"))?,
            endpoints: read(types, "EDS", &field("EDS"))?,
            listeners: read(types, "LDS", &field("LDS"))?,
            routes,
            extension_configs: read(types, "ECDS", &field("ECDS"))?,
            secrets: read(types, "SDS", &field("SDS"))?,
        })
    }
}

/// The route configurations of an on-demand proxy hold no virtual host: each is a VHDS
/// resource of its own, `<route config>/<virtual host>`, served as the proxy asks for it (what
/// it has learned). They are put back in their route configurations, as Envoy merges them,
/// but for the catch-all (it answers unknown hosts one by one) and the agent's marker.
fn with_virtual_hosts(
    routes: &mut [Served<RouteConfiguration>],
    virtual_hosts: Vec<Served<VirtualHost>>,
) {
    for vh in virtual_hosts {
        let Some((config, _)) = vh.name.split_once('/') else {
            continue;
        };
        if vh.message.domains.iter().any(|d| d == "*")
            || vh.message.domains.iter().any(|d| d.ends_with(".invalid"))
        {
            continue;
        }
        if let Some(route) = routes.iter_mut().find(|r| r.name == config) {
            route.message.virtual_hosts.push(vh.message);
            route.any.value = route.message.encode_to_vec();
        }
    }
}

impl Resources {
    /// Reads what an Envoy holds from the text of its own admin `/config_dump` (with
    /// `?include_eds` for the endpoints): the static and the active dynamic resources of each
    /// type (listeners still warming are left out, as Envoy does not serve them yet).
    pub fn from_envoy_dump(text: &[u8]) -> Result<Resources, DumpError> {
        let doc: Value = serde_json::from_slice(text).map_err(DumpError::NotJson)?;
        let configs = doc
            .get("configs")
            .and_then(Value::as_array)
            .ok_or_else(|| DumpError::Field {
                field: "configs".into(),
                problem: "missing: is this Envoy's admin /config_dump?".into(),
            })?;
        let mut out = Resources::default();
        for (i, config) in configs.iter().enumerate() {
            let kind = config
                .get("@type")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let at = |list: &str| format!("configs[{i}].{list}");
            let entries = |list: &str, path: &[&str]| -> Vec<(String, Value)> {
                config
                    .get(list)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                    .filter_map(|(j, e)| {
                        let resource = path.iter().try_fold(e, |v, key| v.get(*key))?;
                        Some((format!("{}[{j}]", at(list)), resource.clone()))
                    })
                    .collect()
            };
            if kind.ends_with("ClustersConfigDump") {
                for (field, r) in entries("static_clusters", &["cluster"])
                    .into_iter()
                    .chain(entries("dynamic_active_clusters", &["cluster"]))
                {
                    out.clusters.push(served(&field, &r)?);
                }
            } else if kind.ends_with("ListenersConfigDump") {
                for (field, r) in entries("static_listeners", &["listener"])
                    .into_iter()
                    .chain(entries("dynamic_listeners", &["active_state", "listener"]))
                {
                    out.listeners.push(served(&field, &r)?);
                }
            } else if kind.ends_with("RoutesConfigDump") {
                for (field, r) in entries("static_route_configs", &["route_config"])
                    .into_iter()
                    .chain(entries("dynamic_route_configs", &["route_config"]))
                {
                    out.routes.push(served(&field, &r)?);
                }
            } else if kind.ends_with("EcdsConfigDump") {
                for (field, r) in entries("ecds_filters", &["ecds_filter"]) {
                    out.extension_configs.push(served(&field, &r)?);
                }
            } else if kind.ends_with("SecretsConfigDump") {
                for (field, r) in entries("static_secrets", &["secret"])
                    .into_iter()
                    .chain(entries("dynamic_active_secrets", &["secret"]))
                {
                    out.secrets.push(served(&field, &r)?);
                }
            } else if kind.ends_with("EndpointsConfigDump") {
                for (field, r) in entries("static_endpoint_configs", &["endpoint_config"])
                    .into_iter()
                    .chain(entries("dynamic_endpoint_configs", &["endpoint_config"]))
                {
                    out.endpoints.push(served(&field, &r)?);
                }
            }
        }
        Ok(out)
    }
}

/// One resource of Envoy's dump, read through pasactl's Envoy descriptors.
fn served<T: Message + Default + NamedResource>(
    field: &str,
    resource: &Value,
) -> Result<Served<T>, DumpError> {
    let problem = |problem: String| DumpError::Field {
        field: field.to_string(),
        problem,
    };
    let any = crate::envoy_json::from_json(field, resource).map_err(|e| problem(e.to_string()))?;
    let message = T::decode(any.value.as_slice()).map_err(|e| problem(e.to_string()))?;
    Ok(Served {
        name: message.resource_name(),
        any,
        message,
    })
}

/// The name a resource is served under.
trait NamedResource {
    fn resource_name(&self) -> String;
}

impl NamedResource for Cluster {
    fn resource_name(&self) -> String {
        self.name.clone()
    }
}

impl NamedResource for Listener {
    fn resource_name(&self) -> String {
        self.name.clone()
    }
}

impl NamedResource for TypedExtensionConfig {
    fn resource_name(&self) -> String {
        self.name.clone()
    }
}

impl NamedResource for RouteConfiguration {
    fn resource_name(&self) -> String {
        self.name.clone()
    }
}

impl NamedResource for Secret {
    fn resource_name(&self) -> String {
        self.name.clone()
    }
}

impl NamedResource for ClusterLoadAssignment {
    fn resource_name(&self) -> String {
        self.cluster_name.clone()
    }
}

fn read<T: Message + Default>(
    types: &Value,
    kind: &str,
    field: &str,
) -> Result<Vec<Served<T>>, DumpError> {
    let Some(list) = types.get(kind) else {
        return Ok(Vec::new());
    };
    let list = list.as_array().ok_or_else(|| DumpError::Field {
        field: field.to_string(),
        problem: "not a list".into(),
    })?;
    let base64 = base64::engine::general_purpose::STANDARD;
    let mut out = Vec::with_capacity(list.len());
    for (i, entry) in list.iter().enumerate() {
        let text = |name: &str| -> Result<&str, DumpError> {
            entry
                .get(name)
                .and_then(Value::as_str)
                .ok_or_else(|| DumpError::Field {
                    field: format!("{field}[{i}].{name}"),
                    problem: "missing or not a string".into(),
                })
        };
        let name = text("name")?.to_string();
        let type_url = text("type_url")?.to_string();
        let value = base64
            .decode(text("resource")?)
            .map_err(|e| DumpError::Field {
                field: format!("{field}[{i}].resource"),
                problem: format!("not base64: {e}"),
            })?;
        let message = T::decode(value.as_slice()).map_err(|e| DumpError::Field {
            field: format!("{field}[{i}].resource"),
            problem: format!("not a {type_url}: {e}"),
        })?;
        out.push(Served {
            name,
            any: Any { type_url, value },
            message,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::util::pack_any;
    use serde_json::json;

    fn entry(cluster: Cluster) -> Value {
        let any = pack_any(cluster.clone());
        json!({
            "name": cluster.name,
            "version": "1",
            "type_url": any.type_url,
            "resource": base64::engine::general_purpose::STANDARD.encode(&any.value),
        })
    }

    fn packed<M: Message + prost::Name + Clone>(name: &str, message: &M) -> Value {
        let any = pack_any(message.clone());
        json!({
            "name": name,
            "version": "1",
            "type_url": any.type_url,
            "resource": base64::engine::general_purpose::STANDARD.encode(&any.value),
        })
    }

    /// An on-demand proxy's virtual hosts (VHDS) are shown in their route configurations, but
    /// for the catch-all and the agent's marker.
    #[test]
    fn virtual_hosts_served_on_demand_are_shown_in_their_route_configurations() {
        let config = RouteConfiguration {
            name: "9080".into(),
            ..Default::default()
        };
        let vh = |name: &str, domain: &str| VirtualHost {
            name: name.into(),
            domains: vec![domain.into()],
            ..Default::default()
        };
        let hosts = [
            vh("9080/reviews.default.svc.cluster.local:9080", "reviews"),
            vh("9080/allow_any", "*"),
            vh("9080/pasa-on-demand", "pasa-on-demand.invalid"),
        ];
        let doc = json!({"generators": {"envoy": {
            "RDS": [packed("9080", &config)],
            "VHDS": hosts.iter().map(|h| packed(&h.name, h)).collect::<Vec<_>>(),
        }}});
        let resources = Resources::from_dump(doc.to_string().as_bytes(), "envoy").unwrap();
        let route = &resources.routes[0];
        let names: Vec<&str> = route
            .message
            .virtual_hosts
            .iter()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(names, ["9080/reviews.default.svc.cluster.local:9080"]);
        assert_eq!(
            RouteConfiguration::decode(route.any.value.as_slice()).unwrap(),
            route.message
        );
    }

    #[test]
    fn resources_of_the_generator_asked_for() {
        let cluster = Cluster {
            name: "outbound|9080||reviews.default.svc.cluster.local".into(),
            ..Default::default()
        };
        let doc =
            json!({"revision": 3, "generators": {"envoy": {"CDS": [entry(cluster)], "EDS": []}}});
        let text = doc.to_string();
        let resources = Resources::from_dump(text.as_bytes(), "envoy").unwrap();
        assert_eq!(resources.clusters.len(), 1);
        assert_eq!(
            resources.clusters[0].message.name,
            "outbound|9080||reviews.default.svc.cluster.local"
        );
        assert!(resources.listeners.is_empty());
        assert!(
            resources.extension_configs.is_empty(),
            "an agent without ECDS"
        );

        let e = Resources::from_dump(text.as_bytes(), "grpc").unwrap_err();
        assert!(
            e.to_string()
                .contains("nothing for grpc clients yet (it has: envoy)"),
            "{e}"
        );
    }

    #[test]
    fn a_damaged_dump_names_the_field() {
        let doc = json!({"generators": {"envoy": {"CDS": [{"name": "a", "type_url": "t", "resource": "%%"}]}}});
        let e = Resources::from_dump(doc.to_string().as_bytes(), "envoy").unwrap_err();
        assert!(
            e.to_string()
                .contains("generators.envoy.CDS[0].resource: not base64"),
            "{e}"
        );
        let e = Resources::from_dump(b"{}", "envoy").unwrap_err();
        assert!(matches!(e, DumpError::NoGenerators));
    }

    #[test]
    fn envoys_own_dump_is_read_static_and_active_only() {
        // As Envoy writes /config_dump?include_eds: proto field names, each resource with
        // its @type; a listener still warming has no active_state.
        let dump = json!({"configs": [
            {"@type": "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
             "static_clusters": [{"cluster": {
                 "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                 "name": "xds-grpc", "type": "STATIC", "connect_timeout": "1s"}}],
             "dynamic_active_clusters": [{"version_info": "v1", "cluster": {
                 "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                 "name": "outbound|80||web.shop.svc.cluster.local", "type": "EDS",
                 "eds_cluster_config": {"eds_config": {"ads": {}, "resource_api_version": "V3"},
                                        "service_name": "outbound|80||web.shop.svc.cluster.local"},
                 "transport_socket_matches": [{"name": "tlsMode-disabled", "match": {},
                     "transport_socket": {"name": "envoy.transport_sockets.raw_buffer",
                         "typed_config": {"@type": "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"}}}]}}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
             "dynamic_listeners": [
                 {"name": "0.0.0.0_80", "active_state": {"version_info": "v1", "listener": {
                     "@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
                     "name": "0.0.0.0_80",
                     "address": {"socket_address": {"address": "0.0.0.0", "port_value": 80}}}}},
                 {"name": "0.0.0.0_81", "warming_state": {"listener": {
                     "@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
                     "name": "0.0.0.0_81"}}}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.RoutesConfigDump",
             "dynamic_route_configs": [{"route_config": {
                 "@type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
                 "name": "80", "virtual_hosts": [{"name": "web.shop.svc.cluster.local:80",
                                                   "domains": ["web"]}]}}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump",
             "dynamic_endpoint_configs": [{"endpoint_config": {
                 "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
                 "cluster_name": "outbound|80||web.shop.svc.cluster.local",
                 "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address":
                     {"address": "10.0.0.1", "port_value": 8080}}}}]}]}}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.EcdsConfigDump",
             "ecds_filters": [{"version_info": "v1", "ecds_filter": {
                 "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
                 "name": "extensions.istio.io/trafficextension/shop.lua",
                 "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                                  "default_source_code": {"inline_string": "-- x"}}}}]},
            {"@type": "type.googleapis.com/envoy.admin.v3.BootstrapConfigDump",
             "bootstrap": {"node": {"id": "x"}}}
        ]});
        let r = Resources::from_envoy_dump(dump.to_string().as_bytes()).unwrap();
        let names = |v: Vec<&str>| v.into_iter().map(String::from).collect::<Vec<_>>();
        assert_eq!(
            r.clusters
                .iter()
                .map(|c| c.name.clone())
                .collect::<Vec<_>>(),
            names(vec!["xds-grpc", "outbound|80||web.shop.svc.cluster.local"])
        );
        assert_eq!(r.clusters[1].message.transport_socket_matches.len(), 1);
        assert_eq!(r.listeners.len(), 1, "the warming listener is left out");
        assert_eq!(
            r.extension_configs[0].name,
            "extensions.istio.io/trafficextension/shop.lua"
        );
        assert_eq!(r.routes[0].message.virtual_hosts[0].domains, ["web"]);
        assert_eq!(
            r.endpoints[0].name,
            "outbound|80||web.shop.svc.cluster.local"
        );
        let e = Resources::from_envoy_dump(br#"{"generators": {}}"#).unwrap_err();
        assert!(e.to_string().contains("Envoy's admin /config_dump"), "{e}");
    }
}
