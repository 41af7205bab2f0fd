//! Gateway API Gateways that are network gateways, as istiod discovers them
//! (`PILOT_MULTI_NETWORK_DISCOVER_GATEWAY_API`, on by default): a Gateway labelled
//! `topology.istio.io/network` is a gateway into that network at each of its `spec.addresses`
//! (of type `IPAddress` or `Hostname`), on the port of each listener that passes Istio mutual
//! TLS through (`AUTO_PASSTHROUGH`: the `gateway.istio.io/listener-protocol: auto-passthrough`
//! TLS option, or a TLS listener on the network gateway port — its
//! `networking.istio.io/gatewayPort` label, else 15443), and for HBONE on each `HBONE`
//! listener. Gateways of the `istio-remote` class (gateways of a network this control plane
//! cannot reach) count too: they exist for this.
//!
//! Each such Gateway becomes a `ServiceEndpoints` holding only its network gateways (no ports,
//! no endpoints: no service), under a generated name, in the Gateway's namespace. An address
//! that is a DNS name stands for the addresses it resolves to, as istiod resolves it
//! (`RESOLVE_HOSTNAME_GATEWAYS`; see [`crate::gateway_names`]): agents resolve nothing.

use std::net::IpAddr;

use pasa_istio::generated::{GENERATED, PARENTS_ANNOTATION};
use pasa_istio::service_endpoints::{DEFAULT_GATEWAY_PORT, GATEWAY_PORT_LABEL, NETWORK_LABEL};
use serde_json::{Value, json};

/// The TLS option naming a listener's protocol.
const LISTENER_PROTOCOL_OPTION: &str = "gateway.istio.io/listener-protocol";

/// The store name of the network gateways of Gateway `name`.
pub fn object_name(name: &str) -> String {
    format!("{name}~{GENERATED}~network")
}

/// The `ServiceEndpoints` object of the network gateways a Gateway document is, if it is any,
/// for `cluster` (the cluster it was read in). `resolved` tells what a DNS name resolves to (as
/// last resolved; none yet: no gateway at that name yet).
pub fn network_gateways(
    gateway: &Value,
    cluster: &str,
    resolved: impl Fn(&str) -> Option<Vec<IpAddr>>,
) -> Option<Value> {
    let labels = gateway.pointer("/metadata/labels");
    let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
    let network = label(NETWORK_LABEL).filter(|n| !n.is_empty())?;
    let gateway_port = label(GATEWAY_PORT_LABEL)
        .map(str::to_string)
        .unwrap_or_else(|| DEFAULT_GATEWAY_PORT.to_string());
    let listeners = gateway
        .pointer("/spec/listeners")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let port_of = |l: &Value| l.get("port").and_then(Value::as_u64).unwrap_or(0);
    let auto_passthrough = |l: &Value| {
        let Some(tls) = l.get("tls") else {
            return false;
        };
        let option = tls
            .pointer("/options")
            .and_then(|o| o.get(LISTENER_PROTOCOL_OPTION))
            .and_then(Value::as_str);
        option == Some("auto-passthrough") || port_of(l).to_string() == gateway_port
    };
    let mut gateways = Vec::new();
    for address in gateway
        .pointer("/spec/addresses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let kind = address.get("type").and_then(Value::as_str);
        if !matches!(kind, Some("IPAddress" | "Hostname")) {
            continue;
        }
        let Some(value) = address.get("value").and_then(Value::as_str) else {
            continue;
        };
        let ips = match value.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => resolved(value).unwrap_or_default(),
        };
        for ip in ips {
            for l in listeners.iter().filter(|l| auto_passthrough(l)) {
                gateways.push(json!({"network": network, "address": ip.to_string(),
                                     "port": port_of(l)}));
            }
            for l in listeners
                .iter()
                .filter(|l| l.get("protocol") == Some(&json!("HBONE")))
            {
                gateways.push(json!({"network": network, "address": ip.to_string(),
                                     "port": port_of(l), "hbonePort": port_of(l)}));
            }
        }
    }
    if gateways.is_empty() {
        return None;
    }
    let name = gateway.pointer("/metadata/name").and_then(Value::as_str)?;
    let namespace = gateway
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    Some(json!({
        "apiVersion": "pasa.io/v1alpha1", "kind": "ServiceEndpoints",
        "metadata": {"name": object_name(name), "namespace": namespace,
                     "annotations": {PARENTS_ANNOTATION: format!("Gateway/{name}.{namespace}")}},
        "spec": {"cluster": cluster, "networkGateways": gateways},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A resolver that knows one name, with two addresses.
    fn resolved(name: &str) -> Option<Vec<IpAddr>> {
        (name == "gw.example.com").then(|| vec![[35, 9, 9, 9].into(), [35, 9, 9, 10].into()])
    }

    #[test]
    fn labelled_gateways_are_network_gateways_at_their_addresses() {
        let gateway = json!({
            "metadata": {"name": "eastwest", "namespace": "istio-system",
                         "labels": {"topology.istio.io/network": "n2"}},
            "spec": {"gatewayClassName": "istio-remote",
                "addresses": [{"type": "IPAddress", "value": "35.1.2.3"},
                              {"type": "Hostname", "value": "gw.example.com"},
                              {"type": "Hostname", "value": "not-yet.example.com"},
                              {"type": "example.com/other", "value": "x"}],
                "listeners": [
                    {"name": "mtls", "port": 15443, "protocol": "TLS", "tls": {"mode": "Passthrough"}},
                    {"name": "opt", "port": 15444, "protocol": "TLS",
                     "tls": {"mode": "Passthrough",
                             "options": {"gateway.istio.io/listener-protocol": "auto-passthrough"}}},
                    {"name": "hbone", "port": 15008, "protocol": "HBONE"},
                    {"name": "web", "port": 80, "protocol": "HTTP"}]}});
        let object = network_gateways(&gateway, "c2", resolved).expect("a network gateway");
        assert_eq!(
            object["metadata"]["name"],
            "eastwest~istio-autogenerated-k8s-gateway~network"
        );
        assert_eq!(object["spec"]["cluster"], "c2");
        let gateways = object["spec"]["networkGateways"].as_array().unwrap();
        let seen: Vec<(String, u64, u64)> = gateways
            .iter()
            .map(|g| {
                (
                    g["address"].as_str().unwrap().to_string(),
                    g["port"].as_u64().unwrap(),
                    g["hbonePort"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("35.1.2.3".into(), 15443, 0),
                ("35.1.2.3".into(), 15444, 0),
                ("35.1.2.3".into(), 15008, 15008),
                // The name, at each of its addresses; a name not resolved is no gateway yet.
                ("35.9.9.9".into(), 15443, 0),
                ("35.9.9.9".into(), 15444, 0),
                ("35.9.9.9".into(), 15008, 15008),
                ("35.9.9.10".into(), 15443, 0),
                ("35.9.9.10".into(), 15444, 0),
                ("35.9.9.10".into(), 15008, 15008),
            ]
        );
        // The object passes the store's envelope (a generated name) and its validation.
        let obj = pasa_proto::Object::from_json(
            &json!({"apiVersion": object["apiVersion"], "kind": object["kind"],
                    "metadata": object["metadata"], "spec": object["spec"]}),
            "default",
            pasa_istio::generated::is_generated_object,
        );
        assert!(obj.is_ok(), "{obj:?}");
        // Not labelled with a network, or without an address: none.
        let mut plain = gateway.clone();
        plain["metadata"]["labels"] = json!({});
        assert!(network_gateways(&plain, "c2", resolved).is_none());
        let mut nowhere = gateway.clone();
        nowhere["spec"]["addresses"] = json!([]);
        assert!(network_gateways(&nowhere, "c2", resolved).is_none());
        let mut unresolved = gateway;
        unresolved["spec"]["addresses"] =
            json!([{"type": "Hostname", "value": "not-yet.example.com"}]);
        assert!(network_gateways(&unresolved, "c2", resolved).is_none());
    }
}
