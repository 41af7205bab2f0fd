//! The Kubernetes Gateway API in a cluster: which of its kinds the syncer follows (with
//! ListenerSet and BackendTLSPolicy, and the experimental XBackend and XBackendTrafficPolicy
//! when asked), what it keeps
//! of the Secrets and ConfigMaps listeners name, and what the objects of selected namespaces
//! become ([`crate::gateway_api`]: the Gateways and VirtualServices istiod generates).
//!
//! The kinds are followed at the newest version the cluster serves (`v1` first); one whose CRD
//! is not installed is not followed. Secrets and ConfigMaps are followed only when the cluster
//! serves Gateways, and only the keys a listener's certificate or CA is read from are kept:
//! the conversion checks that a listener's certificate is there and is PEM, as istiod does.

use std::collections::{BTreeMap, BTreeSet};

use crate::gateway_api::{self, ALPHA_GROUP, INFERENCE_GROUP, Input, Settings};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::Store;
use serde_json::{Value, json};

use crate::convert::{self, StoreKey};

/// A followed Gateway API kind: its name, plural, the resource's full name (as metrics and
/// logs name it: Istio has `gateways` too) and the versions read, newest first.
pub struct GatewayApiKind {
    pub group: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub resource: &'static str,
    pub versions: &'static [&'static str],
}

/// The kinds the conversion reads; those of [`ALPHA_GROUP`] only with `alpha` on, InferencePools
/// only with `inference` on.
pub const KINDS: [GatewayApiKind; 12] = [
    GatewayApiKind {
        group: gateway_api::GROUP,
        kind: "GatewayClass",
        plural: "gatewayclasses",
        resource: "gatewayclasses.gateway.networking.k8s.io",
        versions: &["v1", "v1beta1"],
    },
    GatewayApiKind {
        group: gateway_api::GROUP,
        kind: "Gateway",
        plural: "gateways",
        resource: "gateways.gateway.networking.k8s.io",
        versions: &["v1", "v1beta1"],
    },
    GatewayApiKind {
        group: gateway_api::GROUP,
        kind: "HTTPRoute",
        plural: "httproutes",
        resource: "httproutes.gateway.networking.k8s.io",
        versions: &["v1", "v1beta1"],
    },
    GatewayApiKind {
        group: gateway_api::GROUP,
        kind: "GRPCRoute",
        plural: "grpcroutes",
        resource: "grpcroutes.gateway.networking.k8s.io",
        versions: &["v1", "v1alpha2"],
    },
    GatewayApiKind {
        group: gateway_api::GROUP,
        kind: "TCPRoute",
        plural: "tcproutes",
        resource: "tcproutes.gateway.networking.k8s.io",
        versions: &["v1", "v1alpha2"],
    },
    GatewayApiKind {
        group: gateway_api::GROUP,
        kind: "TLSRoute",
        plural: "tlsroutes",
        resource: "tlsroutes.gateway.networking.k8s.io",
        versions: &["v1", "v1alpha3", "v1alpha2"],
    },
    GatewayApiKind {
        group: gateway_api::GROUP,
        kind: "ReferenceGrant",
        plural: "referencegrants",
        resource: "referencegrants.gateway.networking.k8s.io",
        versions: &["v1", "v1beta1"],
    },
    GatewayApiKind {
        group: gateway_api::GROUP,
        kind: "ListenerSet",
        plural: "listenersets",
        resource: "listenersets.gateway.networking.k8s.io",
        versions: &["v1"],
    },
    GatewayApiKind {
        group: gateway_api::GROUP,
        kind: "BackendTLSPolicy",
        plural: "backendtlspolicies",
        resource: "backendtlspolicies.gateway.networking.k8s.io",
        versions: &["v1", "v1alpha3"],
    },
    GatewayApiKind {
        group: ALPHA_GROUP,
        kind: "XBackendTrafficPolicy",
        plural: "xbackendtrafficpolicies",
        resource: "xbackendtrafficpolicies.gateway.networking.x-k8s.io",
        versions: &["v1alpha1"],
    },
    GatewayApiKind {
        group: INFERENCE_GROUP,
        kind: "InferencePool",
        plural: "inferencepools",
        resource: "inferencepools.inference.networking.k8s.io",
        versions: &["v1"],
    },
    GatewayApiKind {
        group: ALPHA_GROUP,
        kind: "XBackend",
        plural: "xbackends",
        resource: "xbackends.gateway.networking.x-k8s.io",
        versions: &["v1alpha1"],
    },
];

/// The keys of a Secret or ConfigMap a listener's certificate or CA is read from.
const CERTIFICATE_KEYS: [&str; 6] = ["cert", "key", "cacert", "tls.crt", "tls.key", "ca.crt"];

/// The Secrets followed: not Helm's releases nor service account tokens, the large kinds no
/// listener names (istiod leaves them out the same way).
pub const SECRETS_FIELD_SELECTOR: &str =
    "type!=helm.sh/release.v1,type!=kubernetes.io/service-account-token";

/// Stands for a private key in PEM: the syncer keeps no private key, only whether there was one.
const PRIVATE_KEY_MARK: &[u8] = b"-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n";

/// A Secret loses all but the keys certificates are read from (most Secrets keep nothing) and
/// the Docker config of a pull secret ([`crate::pull_secrets`]), and its private keys: a key in
/// PEM becomes a mark, anything else goes.
pub fn trim_secret(secret: &mut Secret) {
    use crate::pull_secrets::{DOCKER_CONFIG_KEY, DOCKER_CONFIG_TYPE};
    secret.metadata.annotations = None;
    secret.metadata.managed_fields = None;
    secret.string_data = None;
    let docker = secret.type_.as_deref() == Some(DOCKER_CONFIG_TYPE);
    if let Some(data) = &mut secret.data {
        data.retain(|k, _| {
            CERTIFICATE_KEYS.contains(&k.as_str()) || (docker && k == DOCKER_CONFIG_KEY)
        });
        for key in ["key", "tls.key"] {
            let Some(value) = data.get_mut(key) else {
                continue;
            };
            if gateway_api::is_pem(&value.0, "PRIVATE KEY") {
                value.0 = PRIVATE_KEY_MARK.to_vec();
            } else {
                data.remove(key);
            }
        }
    }
}

/// A ConfigMap loses all but the keys CA bundles are read from.
pub fn trim_config_map(config_map: &mut ConfigMap) {
    config_map.metadata.annotations = None;
    config_map.binary_data = None;
    if let Some(data) = &mut config_map.data {
        data.retain(|k, _| CERTIFICATE_KEYS.contains(&k.as_str()));
    }
}

/// What the conversion reads of the cluster, from the syncer's reflectors.
pub struct Sources<'a> {
    /// The Gateway API kinds followed, by kind.
    pub objects: &'a BTreeMap<&'static str, (ApiResource, Store<DynamicObject>)>,
    pub services: &'a Store<k8s_openapi::api::core::v1::Service>,
    pub namespaces: &'a Store<k8s_openapi::api::core::v1::Namespace>,
    pub secrets: &'a Store<Secret>,
    pub config_maps: &'a Store<ConfigMap>,
    /// The cluster's ServiceEntries, when the kind is followed.
    pub service_entries: Option<&'a (ApiResource, Store<DynamicObject>)>,
    /// What network gateways' DNS names resolve to.
    pub gateway_names: &'a crate::gateway_names::GatewayNames,
}

/// The names (and hosts) the Gateway API objects mention anywhere: a Service, Secret or
/// ConfigMap whose name is not among them cannot change what they become, so its changes need
/// no conversion and the conversion need not read it. The set is generous (any `name`,
/// `hostname` or address `value`, each also cut at its first dot, and the Services managed
/// Gateways get), never short of one the conversion reads.
#[derive(Debug, Default, Clone)]
pub struct Mentioned(BTreeSet<String>);

impl Mentioned {
    /// What the followed objects mention.
    pub fn of(objects: &BTreeMap<&'static str, (ApiResource, Store<DynamicObject>)>) -> Mentioned {
        let mut names = BTreeSet::new();
        for (kind, (_, store)) in objects {
            for o in store.state() {
                collect(&o.data, &mut names);
                if *kind == "Gateway" {
                    let class = o.data["spec"]["gatewayClassName"]
                        .as_str()
                        .unwrap_or_default();
                    let name = o.name_any();
                    names.insert(format!("{name}-{class}"));
                    if let Some(name) = o.annotations().get("gateway.istio.io/name-override") {
                        names.insert(name.clone());
                    }
                    names.insert(name);
                }
            }
        }
        Mentioned(names)
    }

    /// Whether an object of this name (a Service's, a Secret's, a ConfigMap's) may matter.
    pub fn covers(&self, name: &str) -> bool {
        self.0.contains(name)
    }
}

fn collect(value: &Value, names: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if let (Some(text), true) = (
                    v.as_str(),
                    matches!(k.as_str(), "name" | "hostname" | "value"),
                ) {
                    names.insert(text.to_string());
                    if let Some((first, _)) = text.split_once('.') {
                        names.insert(first.to_string());
                    }
                }
                collect(v, names);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect(v, names)),
        _ => {}
    }
}

/// What the Gateway API objects became: the generated objects, labelled as this cluster's, by
/// key; and why objects that could not be read were left out.
#[derive(Debug, Default)]
pub struct Derived {
    pub objects: BTreeMap<StoreKey, Value>,
    pub unreadable: BTreeSet<String>,
}

/// What the Gateway API objects of selected namespaces become. Only the Services, Secrets and
/// ConfigMaps `mentioned` are read.
pub fn derive(
    sources: &Sources<'_>,
    settings: &Settings,
    cluster: &str,
    mentioned: &Mentioned,
    selects: impl Fn(&str) -> bool,
) -> Derived {
    // Without Gateways, routes or policies there is nothing to convert (and the cluster's
    // Services are not read for nothing on each of their changes): classes (istiod makes its
    // own) and grants alone generate nothing.
    let generating = sources
        .objects
        .iter()
        .filter(|(kind, _)| !matches!(**kind, "GatewayClass" | "ReferenceGrant"))
        .any(|(_, (_, store))| !store.is_empty());
    if !generating {
        return Derived::default();
    }
    let mut input = Input::default();
    let suffix = &settings.domain_suffix;
    let mut unreadable = BTreeSet::new();
    let mut add = |doc: Value| {
        if let Err(e) = input.add(&doc, suffix) {
            unreadable.insert(e);
        }
    };
    let dynamic = |resource: &ApiResource, kind: &str, o: &DynamicObject| {
        let mut doc = o.data.clone();
        if !doc.is_object() {
            doc = json!({});
        }
        doc["apiVersion"] = json!(resource.api_version);
        doc["kind"] = json!(kind);
        doc["metadata"] = serde_json::to_value(&o.metadata).unwrap_or_default();
        doc
    };
    let in_selected = |ns: Option<String>| ns.is_none_or(|ns| selects(&ns));
    // Every namespace: listeners select route namespaces by label, whether or not the mesh
    // reads them (istiod's informer is not filtered either).
    for ns in sources.namespaces.state() {
        add(serde_json::to_value(ns.as_ref()).unwrap_or_default());
    }
    for svc in sources.services.state() {
        if in_selected(svc.namespace()) && mentioned.covers(&svc.name_any()) {
            add(serde_json::to_value(svc.as_ref()).unwrap_or_default());
        }
    }
    for s in sources.secrets.state() {
        let certificate = s.data.as_ref().is_some_and(|d| !d.is_empty());
        if in_selected(s.namespace()) && certificate && mentioned.covers(&s.name_any()) {
            add(serde_json::to_value(s.as_ref()).unwrap_or_default());
        }
    }
    for c in sources.config_maps.state() {
        let bundle = c.data.as_ref().is_some_and(|d| !d.is_empty());
        if in_selected(c.namespace()) && bundle && mentioned.covers(&c.name_any()) {
            add(serde_json::to_value(c.as_ref()).unwrap_or_default());
        }
    }
    if let Some((resource, store)) = sources.service_entries {
        for o in store.state() {
            if in_selected(o.namespace()) {
                add(dynamic(resource, "ServiceEntry", &o));
            }
        }
    }
    // Gateways labelled with a network are network gateways (whatever namespace they are in:
    // they are how other networks are reached).
    let mut network_gateways = Vec::new();
    for (kind, (resource, store)) in sources.objects {
        for o in store.state() {
            let doc = dynamic(resource, kind, &o);
            if *kind == "Gateway"
                && let Some(gateways) =
                    gateway_api::network::network_gateways(&doc, cluster, |name| {
                        sources.gateway_names.addresses(name)
                    })
            {
                network_gateways.push(gateways);
            }
            if in_selected(o.namespace()) {
                add(doc);
            }
        }
    }
    let mut objects = convert::generated(gateway_api::convert(settings, &input), cluster);
    for doc in network_gateways {
        let generated = pasa_proto::Object::from_json(
            &doc,
            "default",
            pasa_istio::generated::is_generated_object,
        );
        match generated {
            Ok(object) => objects.extend(convert::generated(vec![object], cluster)),
            Err(e) => {
                unreadable.insert(format!("{}: {e:?}", doc["metadata"]["name"]));
            }
        }
    }
    Derived {
        objects,
        unreadable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_mentioned_anywhere_are_covered_with_their_first_label() {
        let route = json!({"spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "checkout"}],
            "rules": [{"backendRefs": [
                {"name": "cart", "port": 80},
                {"group": "networking.istio.io", "kind": "Hostname",
                 "name": "payments.billing.svc.cluster.local", "port": 443}]}]}});
        let gateway = json!({"spec": {"addresses": [{"type": "Hostname", "value": "edge-gw"}],
            "listeners": [{"tls": {"certificateRefs": [{"name": "shop-cert"}]}}]}});
        let mut names = BTreeSet::new();
        collect(&route, &mut names);
        collect(&gateway, &mut names);
        let m = Mentioned(names);
        for name in ["checkout", "cart", "payments", "edge-gw", "shop-cert"] {
            assert!(m.covers(name), "{name}");
        }
        assert!(!m.covers("unrelated"));
    }
}
