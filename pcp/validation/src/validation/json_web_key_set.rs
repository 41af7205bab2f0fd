//! Validation of a `JsonWebKeySet` object (a JWT issuer's keys, fetched by PCP for the agents):
//! it names its source (a `jwksUri`, or an issuer), is named after it (agents find it by that
//! name), and holds a JSON Web Key Set.

use pasa_istio::request_authentication::JsonWebKeySet;
use pasa_proto::Object;

use super::{Path, Report, parse};

/// Checks one JsonWebKeySet.
pub fn validate(obj: &Object, report: &mut Report) {
    let Some(set) = parse::<JsonWebKeySet>(obj, report) else {
        return;
    };
    let spec = Path::spec();
    if set.jwks_uri.is_empty() == set.issuer.is_empty() {
        report.error(&spec, "exactly one of jwksUri and issuer must be set");
        return;
    }
    let expected = set.source().object_name();
    if obj.name != expected {
        report.error(
            &Path::root("metadata").field("name"),
            format!("a key set of this source is named {expected}"),
        );
    }
    match serde_json::from_str::<serde_json::Value>(&set.jwks) {
        Ok(keys) if keys["keys"].is_array() => {}
        Ok(_) => report.error(
            &spec.field("jwks"),
            "not a JSON Web Key Set: no `keys` list",
        ),
        Err(e) => report.error(&spec.field("jwks"), format!("not JSON: {e}")),
    }
}
