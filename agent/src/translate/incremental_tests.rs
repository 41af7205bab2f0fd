//! Incremental translation against translation from scratch: after every change of a random
//! sequence (services, endpoints whole and in parts, DestinationRules, VirtualServices, Sidecars,
//! PeerAuthentications, EnvoyFilters, Telemetries, the mesh config, deletions), what a
//! long-lived translator serves equals what a new translator builds from the same cache, for a
//! sidecar (Envoy and gRPC generators) and a router. The fingerprints that decide what is reused
//! are conservative guesses at what each output reads; this is what checks them.

use std::collections::BTreeMap;

use pasa_proto::store::v1::Resource;
use pasa_proto::watch::{Action, Change};
use serde_json::{Value, json};

use super::*;
use crate::testing::{resource, router, sidecar};

/// A small deterministic generator (xorshift64*), so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const SERVICES: usize = 6;
const PROXY_IP: &str = "10.0.0.9";

fn host(i: usize) -> String {
    format!("svc-{i}.default.svc.cluster.local")
}

/// One variant of each object slot; `None` deletes it.
fn variant(slot: &str, i: usize, rng: &mut Rng) -> Option<(String, String, Value)> {
    let ns = "default".to_string();
    let name = format!("svc-{i}");
    match slot {
        "ServiceEndpoints" => {
            let ports = match rng.below(3) {
                0 => json!([{"name": "http", "port": 80}]),
                1 => json!([{"name": "http", "port": 80}, {"name": "http-alt", "port": 8080}]),
                _ => json!([{"name": "tcp", "port": 9000}, {"name": "http", "port": 80}]),
            };
            let mut endpoints = vec![
                json!({"address": format!("10.1.{i}.1"), "labels": {"version": "v1"},
                       "serviceAccount": "a"}),
            ];
            if rng.below(2) == 0 {
                endpoints.push(json!({"address": format!("10.1.{i}.2"),
                    "labels": {"version": "v2"}, "serviceAccount": *rng.pick(&["a", "b"])}));
            }
            if i == 0 && rng.below(3) == 0 {
                endpoints.push(json!({"address": PROXY_IP, "labels": {"version": "v1"}}));
            }
            let addresses = if i == SERVICES - 1 && rng.below(2) == 0 {
                json!([])
            } else {
                json!([format!("10.96.0.{}", 10 + i)])
            };
            Some((
                ns,
                name,
                json!({"addresses": addresses, "ports": ports, "endpoints": endpoints}),
            ))
        }
        // A part of the service's endpoints (an EndpointSlice), on the port it lists.
        "ServiceEndpointsPart" => {
            if rng.below(4) == 0 {
                return None;
            }
            let mut endpoints = vec![json!({"address": format!("10.2.{i}.1"),
                "labels": {"version": *rng.pick(&["v1", "v2"])}, "serviceAccount": "a"})];
            if rng.below(2) == 0 {
                endpoints.push(json!({"address": format!("10.2.{i}.2"), "locality": "r/z2"}));
            }
            Some((
                ns,
                format!("{name}-a.endpointslice"),
                json!({"service": name, "endpointPorts": {"http": *rng.pick(&[80, 8080])},
                       "endpoints": endpoints}),
            ))
        }
        // The same service in another cluster, on another network: some endpoints with a
        // sidecar, some without.
        "ServiceEndpointsRemote" => {
            if rng.below(4) == 0 {
                return None;
            }
            let mut endpoints = vec![json!({"address": format!("10.3.{i}.1"), "network": "n2",
                "labels": {"version": "v1", "security.istio.io/tlsMode": "istio"},
                "serviceAccount": "a"})];
            if rng.below(2) == 0 {
                endpoints.push(json!({"address": format!("10.3.{i}.2"), "network": "n2",
                    "labels": {"version": *rng.pick(&["v1", "v2"])}}));
            }
            Some((
                ns,
                format!("{name}.c2.cluster"),
                json!({"service": name, "cluster": "c2",
                       "addresses": [format!("10.97.0.{}", 10 + i)],
                       "ports": [{"name": "http", "port": 80}], "endpoints": endpoints}),
            ))
        }
        // The gateways into the other network: one or two, or none.
        "NetworkGateway" => {
            let gateways = match rng.below(3) {
                0 => return None,
                1 => json!([{"network": "n2", "address": "35.0.0.1", "port": 15443}]),
                _ => json!([{"network": "n2", "address": "35.0.0.1", "port": 15443},
                            {"network": "n2", "address": "35.0.0.2", "port": 15443}]),
            };
            Some((
                "istio-system".into(),
                "eastwest.c2.cluster".into(),
                json!({"service": "eastwest", "cluster": "c2",
                       "ports": [{"name": "tls", "port": 15443}], "networkGateways": gateways}),
            ))
        }
        "DestinationRule" => {
            let lb = match rng.below(5) {
                0 => return None,
                1 => json!({"simple": "ROUND_ROBIN"}),
                2 => json!({"simple": "LEAST_REQUEST"}),
                3 => json!({"consistentHash": {"httpHeaderName": "x-user"}}),
                _ => json!({"consistentHash": {"httpCookie": {"name": "c", "ttl": "10s"}}}),
            };
            let subsets = match rng.below(3) {
                0 => json!([]),
                1 => json!([{"name": "v1", "labels": {"version": "v1"}}]),
                _ => json!([{"name": "v1", "labels": {"version": "v1"}},
                            {"name": "v2", "labels": {"version": "v2"},
                             "trafficPolicy": {"loadBalancer":
                                {"consistentHash": {"useSourceIp": true}}}}]),
            };
            Some((
                ns,
                name,
                json!({"host": host(i), "trafficPolicy": {"loadBalancer": lb}, "subsets": subsets}),
            ))
        }
        "VirtualService" => {
            let to = host(rng.below(SERVICES));
            let other = host(rng.below(SERVICES));
            let spec = match rng.below(6) {
                0 => return None,
                1 => json!({"hosts": [host(i)], "http": [{"route": [
                    {"destination": {"host": to, "subset": "v1"}, "weight": 70},
                    {"destination": {"host": other}, "weight": 30}]}]}),
                2 => json!({"hosts": [host(i)], "http": [{
                    "match": [{"uri": {"prefix": "/a"}}],
                    "rewrite": {"uri": "/b"},
                    "route": [{"destination": {"host": to, "port": {"number": 80}}}]},
                    {"route": [{"destination": {"host": host(i)}}],
                     "mirror": {"host": other}}]}),
                3 => json!({"hosts": [host(i)], "tcp": [{"route": [
                    {"destination": {"host": to, "port": {"number": 9000}}}]}]}),
                4 => json!({"hosts": [format!("svc-{i}"), "*.example.com"], "http": [{"route": [
                    {"destination": {"host": to}}]}]}),
                _ => json!({"hosts": [host(i)], "gateways": ["istio-system/ingress", "mesh"],
                    "http": [{"route": [{"destination": {"host": to}}]}]}),
            };
            Some((ns, name, spec))
        }
        "Sidecar" => match rng.below(3) {
            0 => None,
            1 => Some((
                ns,
                "default".into(),
                json!({"egress": [{"hosts": ["./*", "istio-system/*"]}]}),
            )),
            _ => Some((
                ns,
                "default".into(),
                json!({"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}}),
            )),
        },
        "Gateway" => Some((
            "istio-system".into(),
            "ingress".into(),
            json!({"selector": {"istio": "ingressgateway"}, "servers": [
                {"port": {"number": 80, "name": "http", "protocol": "HTTP"},
                 "hosts": [*rng.pick(&["*/*", "default/svc-1.default.svc.cluster.local"])]}]}),
        )),
        "ServiceEntry" => Some((
            ns,
            "external".into(),
            json!({"hosts": [*rng.pick(&["api.example.com", "db.example.com"])],
                   "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
                   "resolution": *rng.pick(&["DNS", "NONE"]), "location": "MESH_EXTERNAL"}),
        )),
        "PeerAuthentication" => {
            let mode = *rng.pick(&["STRICT", "PERMISSIVE", "DISABLE", "UNSET"]);
            match rng.below(4) {
                0 => None,
                // The namespace's policy.
                1 => Some((ns, "default".into(), json!({"mtls": {"mode": mode}}))),
                // The mesh's.
                2 => Some((
                    "istio-system".into(),
                    "default".into(),
                    json!({"mtls": {"mode": mode}}),
                )),
                // A workload policy with a port of its own.
                _ => Some((
                    ns,
                    "workload".into(),
                    json!({"selector": {"matchLabels": {"app": "proxy"}},
                           "mtls": {"mode": mode},
                           "portLevelMtls": {"80": {"mode": *rng.pick(&["STRICT", "DISABLE"])}}}),
                )),
            }
        }
        "Telemetry" => match rng.below(4) {
            0 => None,
            // The mesh's: every sidecar and router logs.
            1 => Some((
                "istio-system".into(),
                "mesh-default".into(),
                json!({"accessLogging": [{"providers": [{"name": "envoy"}],
                    "filter": {"expression": *rng.pick(&["response.code >= 400", "true"])}}]}),
            )),
            // The namespace's: the server side off.
            2 => Some((
                ns,
                "default".into(),
                json!({"accessLogging": [{"match": {"mode": "SERVER"}, "disabled": true}]}),
            )),
            // The labelled workload's: the client side only.
            _ => Some((
                ns,
                "workload".into(),
                json!({"selector": {"matchLabels": {"app": "proxy"}},
                       "accessLogging": [{"match": {"mode": "CLIENT"}, "providers": [{"name": "envoy"}]}]}),
            )),
        },
        "EnvoyFilter" => {
            let value = format!("v{}", rng.below(3));
            match rng.below(5) {
                0 => None,
                // The mesh's: a header on every outbound and gateway virtual host.
                1 => Some((
                    "istio-system".into(),
                    "headers".into(),
                    json!({"configPatches": [{"applyTo": "VIRTUAL_HOST",
                        "patch": {"operation": "MERGE", "value": {"response_headers_to_add": [
                            {"header": {"key": "x-mesh", "value": value}}]}}}]}),
                )),
                // The namespace's: one service's clusters.
                2 => Some((
                    ns,
                    "clusters".into(),
                    json!({"configPatches": [{"applyTo": "CLUSTER",
                        "match": {"cluster": {"service": host(i), "portNumber": 80}},
                        "patch": {"operation": "MERGE", "value": {"alt_stat_name": value}}}]}),
                )),
                // The labelled workload's inbound HTTP filters, and a listener removed.
                3 => Some((
                    ns,
                    "workload".into(),
                    json!({"workloadSelector": {"labels": {"app": "proxy"}},
                        "configPatches": [
                        {"applyTo": "HTTP_FILTER",
                         "match": {"context": "SIDECAR_INBOUND", "listener": {"filterChain": {
                             "filter": {"name": "envoy.filters.network.http_connection_manager"}}}},
                         "patch": {"operation": "INSERT_FIRST", "value": {"name": value,
                             "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}}},
                        {"applyTo": "LISTENER",
                         "match": {"context": "SIDECAR_OUTBOUND", "listener": {"portNumber": 80}},
                         "patch": {"operation": "REMOVE"}}]}),
                )),
                // The gateway's route configurations.
                _ => Some((
                    "istio-system".into(),
                    "gateway".into(),
                    json!({"configPatches": [{"applyTo": "ROUTE_CONFIGURATION",
                        "match": {"context": "GATEWAY"},
                        "patch": {"operation": "MERGE", "value": {"max_direct_response_body_size_bytes": 1024}}}]}),
                )),
            }
        }
        // Proxies' default settings and path normalization.
        "MeshConfig" => {
            let spec = match rng.below(4) {
                0 => return None,
                1 => json!({"pathNormalization": {"normalization": "MERGE_SLASHES"}}),
                2 => json!({"defaultConfig": {"proxyHeaders": {"server": {"value": "edge"},
                    "attemptCount": {"disabled": true}, "xForwardedHost": {"enabled": true}}}}),
                _ => json!({"defaultConfig": {"proxyHeaders": {"requestId": {"disabled": true}},
                    "gatewayTopology": {"numTrustedProxies": 2}}}),
            };
            Some(("istio-system".into(), "mesh".into(), spec))
        }
        _ => None,
    }
}

const SLOTS: &[&str] = &[
    "ServiceEndpoints",
    "ServiceEndpoints",
    "ServiceEndpointsPart",
    "ServiceEndpointsRemote",
    "NetworkGateway",
    "DestinationRule",
    "DestinationRule",
    "VirtualService",
    "VirtualService",
    "Sidecar",
    "Gateway",
    "ServiceEntry",
    "PeerAuthentication",
    "EnvoyFilter",
    "Telemetry",
    "MeshConfig",
];

/// Writes one object into the cache as the store's watch would deliver it (a modification keeps
/// its creation revision).
fn put(
    cache: &mut Cache,
    kind: &str,
    (ns, name, spec): (String, String, Value),
    created: &mut BTreeMap<(String, String, String), u64>,
    revision: u64,
) {
    let id = (kind.to_string(), ns.clone(), name.clone());
    let first = *created.entry(id).or_insert(revision);
    let mut r = resource(kind, &ns, &name, spec, revision);
    r.create_revision = first;
    let action = if first == revision {
        Action::Added
    } else {
        Action::Modified
    };
    event(cache, action, r, revision);
}

fn event(cache: &mut Cache, action: Action, resource: Resource, revision: u64) {
    cache.apply(Change {
        action,
        resource,
        revision,
        committed: None,
    });
}

/// The names whose resources differ between two maps.
fn differing<M: PartialEq>(a: &BTreeMap<String, M>, b: &BTreeMap<String, M>) -> Vec<String> {
    let mut names: Vec<String> = a
        .iter()
        .filter(|(name, m)| b.get(*name) != Some(*m))
        .map(|(name, _)| name.clone())
        .collect();
    names.extend(b.keys().filter(|name| !a.contains_key(*name)).cloned());
    names
}

#[test]
fn incremental_translation_equals_translation_from_scratch() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut cache = Cache::default();
    let mut created: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    let mut revision = 0;
    for i in 0..SERVICES {
        for kind in ["ServiceEndpoints", "DestinationRule", "VirtualService"] {
            revision += 1;
            let v = variant(kind, i, &mut rng);
            if let Some(v) = v {
                put(&mut cache, kind, v, &mut created, revision);
            }
        }
    }
    // Labelled, so that a workload PeerAuthentication selects it; in a cluster and network of
    // its own, so that other clusters' endpoints go through gateways.
    let mut labelled = sidecar(PROXY_IP);
    labelled.labels = [("app".to_string(), "proxy".to_string())].into();
    labelled.cluster_id = "c1".into();
    labelled.network = "n1".into();
    let proxies = [
        ("sidecar", labelled.clone(), Generator::Envoy),
        ("grpc", labelled, Generator::Grpc),
        ("router", router("10.0.0.50"), Generator::Envoy),
    ];
    let mut translators: Vec<Translator> = proxies
        .iter()
        .map(|(_, p, _)| Translator::new(p.clone()))
        .collect();
    let mut reused = 0;
    for step in 0..300 {
        let slot = *rng.pick(SLOTS);
        let kind = match slot {
            "ServiceEndpointsPart" | "ServiceEndpointsRemote" | "NetworkGateway" => {
                "ServiceEndpoints"
            }
            other => other,
        };
        let i = rng.below(SERVICES);
        let name_of_slot = match slot {
            "ServiceEndpointsPart" => format!("svc-{i}-a.endpointslice"),
            "ServiceEndpointsRemote" => format!("svc-{i}.c2.cluster"),
            "NetworkGateway" => "eastwest.c2.cluster".to_string(),
            _ => format!("svc-{i}"),
        };
        revision += 1;
        match variant(slot, i, &mut rng) {
            Some(change) => put(&mut cache, kind, change, &mut created, revision),
            None => {
                // Delete whatever this slot holds.
                let key = created
                    .keys()
                    .find(|(k, _, n)| {
                        k == kind
                            && (*n == name_of_slot
                                || kind == "Sidecar"
                                || kind == "PeerAuthentication"
                                || kind == "EnvoyFilter"
                                || kind == "Telemetry"
                                || kind == "MeshConfig")
                    })
                    .cloned();
                if let Some(id) = key {
                    created.remove(&id);
                    let r = resource(&id.0, &id.1, &id.2, json!({}), revision);
                    event(&mut cache, Action::Deleted, r, revision);
                }
            }
        }
        for ((name, proxy, generator), t) in proxies.iter().zip(&mut translators) {
            let incremental = t
                .update(&cache, *generator)
                .expect("decodes what it encoded");
            let rebuilt = t.rebuilt();
            if !rebuilt.listeners {
                reused += 1;
            }
            let scratch = Translator::new(proxy.clone())
                .update(&cache, *generator)
                .expect("decodes what it encoded");
            let differences = [
                (
                    "clusters",
                    differing(&incremental.clusters, &scratch.clusters),
                ),
                (
                    "endpoints",
                    differing(&incremental.endpoints, &scratch.endpoints),
                ),
                (
                    "listeners",
                    differing(&incremental.listeners, &scratch.listeners),
                ),
                ("routes", differing(&incremental.routes, &scratch.routes)),
            ];
            for (what, names) in differences {
                assert!(
                    names.is_empty(),
                    "step {step} ({slot} svc-{i}), {name}: the incremental {what} {names:?} differ \
                     from a translation from scratch (rebuilt: {rebuilt:?})"
                );
            }
        }
    }
    // The test is only worth something if reuse happened.
    assert!(
        reused > 100,
        "outputs were reused in {reused} of 900 updates"
    );
}
