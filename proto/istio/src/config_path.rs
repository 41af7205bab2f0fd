//! Which Istio config an Envoy resource came from, as istiod records it: the `istio` filter
//! metadata of a cluster (its DestinationRule) or a route (its VirtualService) holds a `config`
//! path `/apis/networking.istio.io/<version>/namespaces/<namespace>/<kind-in-kebab-case>/<name>`,
//! the version being the one istiod reads the kind at (`v1`; `v1alpha3` for EnvoyFilter).
//! The agent writes it; `pasactl proxy-config` reads it back as `name.namespace`, as istioctl
//! does.

use pasa_proto::kind::{ISTIO_NETWORKING_GROUP, Kind};

/// The filter metadata key istiod's own metadata lives under.
pub const FILTER_METADATA_KEY: &str = "istio";
/// The field of that metadata holding the config path.
pub const CONFIG_FIELD: &str = "config";

/// The config path of a resource of `kind`, with the version istiod reads the kind at (its
/// newest), whichever version the resource was written in.
pub fn config_path(kind: Kind, namespace: &str, name: &str) -> String {
    let version = kind.versions().first().copied().unwrap_or("v1");
    format!(
        "/apis/{}/{version}/namespaces/{namespace}/{}/{name}",
        kind.group(),
        kebab_case(kind.as_str())
    )
}

/// A config path as istioctl shows it: `name.namespace` for an Istio networking resource,
/// `<unknown>` for any other path, empty for a malformed one.
pub fn describe(path: &str) -> String {
    let Some(rest) = path.strip_prefix(&format!("/apis/{ISTIO_NETWORKING_GROUP}/")) else {
        return "<unknown>".into();
    };
    // `<version>/namespaces/<namespace>/<kind>/<name>`
    let pieces: Vec<&str> = rest.split('/').collect();
    match pieces.as_slice() {
        [_, "namespaces", namespace, _, name] => format!("{name}.{namespace}"),
        _ => String::new(),
    }
}

fn kebab_case(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 4);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('-');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_istiods() {
        assert_eq!(
            config_path(Kind::DestinationRule, "default", "reviews"),
            "/apis/networking.istio.io/v1/namespaces/default/destination-rule/reviews"
        );
        assert_eq!(
            config_path(Kind::VirtualService, "shop", "cart"),
            "/apis/networking.istio.io/v1/namespaces/shop/virtual-service/cart"
        );
        assert_eq!(
            config_path(Kind::EnvoyFilter, "shop", "lua"),
            "/apis/networking.istio.io/v1alpha3/namespaces/shop/envoy-filter/lua"
        );
    }

    #[test]
    fn described_as_name_dot_namespace() {
        let path = config_path(Kind::VirtualService, "shop", "cart");
        assert_eq!(describe(&path), "cart.shop");
        assert_eq!(describe("/apis/other.io/v1/namespaces/a/b/c"), "<unknown>");
        assert_eq!(describe("/apis/networking.istio.io/v1alpha3/x"), "");
    }
}
