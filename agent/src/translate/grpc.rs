//! What istiod's gRPC generator sends a proxyless gRPC client: per service port an API listener
//! named `<host>:<port>` whose connection manager takes its routes over RDS from the route
//! configuration `outbound|<port>||<host>`; that route configuration holds one virtual host for
//! the service with its VirtualService's routes (or the default route). Clusters and endpoints
//! are the outbound ones every generator shares.

use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::util::pack_any;

use super::filters::{self, Routes};
use super::route;
use super::{Built, View, names};

pub(super) fn listeners_and_routes(view: &View<'_>, out: &mut Built) {
    for service in view.services.values() {
        for port in &service.ports {
            let listener_name = names::host_port(&service.hostname, port.number);
            let route_name = names::outbound_cluster(port.number, "", &service.hostname);
            let hcm =
                filters::http_connection_manager(&listener_name, Routes::Rds(route_name.clone()));
            out.listeners.insert(
                listener_name.clone(),
                Listener {
                    name: listener_name.clone(),
                    api_listener: Some(ApiListener {
                        api_listener: Some(pack_any(hcm)),
                    }),
                    ..Default::default()
                },
            );
            let routes = match view.virtual_service_for(&service.hostname) {
                Some(vs) => {
                    route::virtual_service_routes(vs, port.number, pasa_proto::gateway::MESH, view)
                }
                None => Vec::new(),
            };
            let routes = if routes.is_empty() {
                vec![view.default_route(service, port.number)]
            } else {
                routes
            };
            out.routes.insert(
                route_name.clone(),
                RouteConfiguration {
                    name: route_name,
                    virtual_hosts: vec![route::virtual_host(
                        listener_name,
                        route::domains(
                            &service.hostname,
                            Some(service),
                            port.number,
                            &view.proxy.dns_domain,
                        ),
                        routes,
                    )],
                    ..Default::default()
                },
            );
        }
    }
}
