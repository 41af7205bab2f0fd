//! Kubernetes Ingresses in a cluster: those Istio serves (by class, as the mesh config says)
//! become the Gateways and VirtualServices istiod generates for them ([`crate::ingress`]).

use std::collections::BTreeMap;

use crate::ingress::{self, Ingress as Read, Settings};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::Value;

use crate::convert::{self, StoreKey};

/// What the served Ingresses of selected namespaces become, labelled as this cluster's, by key.
pub fn derive(
    ingresses: &Store<Ingress>,
    classes: &Store<IngressClass>,
    services: &Store<Service>,
    settings: &Settings,
    cluster: &str,
    selects: impl Fn(&str) -> bool,
) -> BTreeMap<StoreKey, Value> {
    let controller_of = |class: &str| {
        let c = classes.get(&ObjectRef::new(class))?;
        c.spec
            .as_ref()
            .map(|s| s.controller.clone().unwrap_or_default())
    };
    let mut served: Vec<Read> = Vec::new();
    for i in ingresses.state() {
        let namespace = i.namespace().unwrap_or_default();
        if !selects(&namespace) {
            continue;
        }
        match serde_json::to_value(i.as_ref()).and_then(serde_json::from_value::<Read>) {
            Ok(read) if ingress::served(settings, &read, controller_of) => served.push(read),
            Ok(_) => {}
            Err(e) => tracing::warn!(ingress = %format!("{namespace}/{}", i.name_any()),
                error = %e, "cannot read an Ingress; left out"),
        }
    }
    let named_port = |namespace: &str, service: &str, port: &str| {
        let svc = services.get(&ObjectRef::new(service).within(namespace))?;
        let ports = svc.spec.as_ref()?.ports.as_ref()?;
        let p = ports.iter().find(|p| p.name.as_deref() == Some(port))?;
        u32::try_from(p.port).ok()
    };
    convert::generated(ingress::convert(settings, &served, named_port), cluster)
}
