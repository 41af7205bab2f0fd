//! Istio's names for the gateways a VirtualService binds to.

/// The reserved gateway name meaning "all sidecars of the mesh".
pub const MESH: &str = "mesh";

/// Resolves a gateway reference written in a VirtualService of `namespace` to `namespace/name`,
/// as istiod does: `name` → `<vs-ns>/name`, `./name` → `<vs-ns>/name`, `ns/name` kept, the legacy
/// FQDN form `name.ns.svc.cluster.local` → `ns/name`, and `mesh` kept.
pub fn resolve_gateway_name(gateway: &str, namespace: &str) -> String {
    if gateway == MESH {
        return MESH.to_string();
    }
    if let Some((ns, name)) = gateway.split_once('/') {
        return if ns == "." {
            format!("{namespace}/{name}")
        } else {
            gateway.to_string()
        };
    }
    match gateway.split_once('.') {
        None => format!("{namespace}/{gateway}"),
        Some((name, rest)) => {
            let ns = rest.split('.').next().unwrap_or(rest);
            format!("{ns}/{name}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_istiod() {
        let cases = [
            ("mesh", "default", "mesh"),
            ("bookinfo-gateway", "default", "default/bookinfo-gateway"),
            ("./bookinfo-gateway", "default", "default/bookinfo-gateway"),
            ("istio-system/ingress", "default", "istio-system/ingress"),
            (
                "ingress.istio-system.svc.cluster.local",
                "default",
                "istio-system/ingress",
            ),
            ("ingress.istio-system", "default", "istio-system/ingress"),
        ];
        for (gw, ns, want) in cases {
            assert_eq!(resolve_gateway_name(gw, ns), want, "{gw} in {ns}");
        }
    }
}
