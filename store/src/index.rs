//! Inverted indexes over four dimensions (kind, namespace, host, gateway), as roaring bitmaps of
//! dense ids: [`ObjectIndex`] answers "which objects does this selector match" (List, snapshots,
//! subscription changes); [`RuleIndex`] answers "which subscription rules does this object match"
//! (event fan-out). Both must agree with [`crate::selector::Rule::matches`] on every input.

pub mod extract;
mod host;
mod objects;
mod rules;
mod value;

use pasa_proto::Kind;
use pasa_proto::store::v1::Resource;

pub use host::HostIndex;
pub use objects::ObjectIndex;
pub use rules::RuleIndex;
pub use value::ValueIndex;

/// The indexed values of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectKeys {
    pub kind: Kind,
    pub namespace: String,
    pub hosts: Vec<String>,
    pub gateways: Vec<String>,
}

impl ObjectKeys {
    /// The keys recorded on a stored resource; `None` if its kind is unknown.
    pub fn of(resource: &Resource) -> Option<ObjectKeys> {
        let index = resource.index.clone().unwrap_or_default();
        Some(ObjectKeys {
            kind: Kind::from_kind_field(&resource.kind)?,
            namespace: resource.namespace.clone(),
            hosts: index.hosts,
            gateways: index.gateways,
        })
    }
}
