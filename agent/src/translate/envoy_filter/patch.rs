//! One patch of an EnvoyFilter, read once per revision ([`Patch`]): its `value` as the Envoy
//! message its `applyTo` names, and the descriptors that reading needs.

use std::collections::BTreeSet;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, ListenerFilter};
use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use pasa_envoy_json::merge::{self, Lists};
use pasa_istio::envoy_filter::{
    ApplyTo, EnvoyConfigObjectMatch, EnvoyFilter, Operation, PatchContext,
};
use prost::{Message, Name};
use prost_reflect::DescriptorPool;

use crate::model::proxy::ProxyBuild;
use crate::model::registry::Config;

/// One patch, read.
#[derive(Debug)]
pub(super) struct Patch {
    /// `namespace/name` of its EnvoyFilter.
    key: String,
    pub(super) apply_to: ApplyTo,
    pub(super) operation: Operation,
    pub(super) matching: EnvoyConfigObjectMatch,
    /// The value, encoded as the message `apply_to` names.
    value: Vec<u8>,
}

impl Patch {
    pub(super) fn in_context(&self, context: PatchContext) -> bool {
        self.matching.context == context || self.matching.context == PatchContext::Any
    }

    pub(super) fn merges(&self) -> bool {
        matches!(
            self.operation,
            Operation::Merge | Operation::MergeAndReplaceList
        )
    }

    fn lists(&self) -> Lists {
        if self.operation == Operation::MergeAndReplaceList {
            Lists::Replace
        } else {
            Lists::Append
        }
    }

    pub(super) fn value<M: Message + Default>(&self) -> M {
        M::decode(self.value.as_slice()).unwrap_or_default()
    }

    /// The value merged into `target` (left as it is when the merge fails).
    pub(super) fn merge_into<M: Message + Name + Default>(
        &self,
        pool: &DescriptorPool,
        target: &mut M,
    ) {
        match merge::merge(
            pool,
            &M::full_name(),
            &target.encode_to_vec(),
            &self.value,
            self.lists(),
        ) {
            Ok(bytes) => match M::decode(bytes.as_slice()) {
                Ok(merged) => *target = merged,
                Err(e) => {
                    tracing::warn!(envoy_filter = %self.key, "merged value does not decode: {e}")
                }
            },
            Err(e) => tracing::warn!(envoy_filter = %self.key, "merge failed: {e}"),
        }
    }

    /// Whether this `ADD` patch adds a listener or cluster in `context`: one without a context
    /// adds only outbound and on gateways.
    pub(super) fn adds_in(&self, context: PatchContext) -> bool {
        self.operation == Operation::Add
            && self.in_context(context)
            && !(self.matching.context == PatchContext::Any
                && context == PatchContext::SidecarInbound)
    }
}

/// The Envoy message a patch of `apply_to` holds.
fn message_of(apply_to: ApplyTo) -> Option<String> {
    Some(match apply_to {
        ApplyTo::Listener => Listener::full_name(),
        ApplyTo::ListenerFilter => ListenerFilter::full_name(),
        ApplyTo::FilterChain => FilterChain::full_name(),
        ApplyTo::NetworkFilter => Filter::full_name(),
        ApplyTo::HttpFilter => HttpFilter::full_name(),
        ApplyTo::RouteConfiguration => RouteConfiguration::full_name(),
        ApplyTo::VirtualHost => VirtualHost::full_name(),
        ApplyTo::HttpRoute => Route::full_name(),
        ApplyTo::Cluster => Cluster::full_name(),
        ApplyTo::ExtensionConfig => {
            envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig::full_name()
        }
        // Not applied by the agent (see the module's notes).
        ApplyTo::Bootstrap | ApplyTo::Invalid | ApplyTo::Unknown(_) => {
            return None;
        }
    })
}

/// The patches of one EnvoyFilter revision, read (those whose value did not read are left out).
#[derive(Debug)]
pub(super) struct Read {
    pub(super) revision: u64,
    pub(super) patches: Vec<Arc<Patch>>,
}

/// The Envoy messages reading `filter` needs: those its patches' `applyTo` name, and the
/// `@type`s in their values.
pub(super) fn types_of(filter: &Config<EnvoyFilter>, out: &mut BTreeSet<String>) {
    for cp in filter.spec.config_patches.iter().flatten() {
        if let Some(message) = message_of(cp.apply_to) {
            out.insert(message);
        }
        if let Some(value) = cp.patch.as_ref().and_then(|p| p.value.as_ref()) {
            for v in value.values() {
                out.extend(
                    pasa_envoy_json::type_names(v)
                        .into_iter()
                        .map(str::to_string),
                );
            }
        }
    }
}

/// The patches of `filter` (whose `namespace/name` is `key`), read with `pool`; for upstream
/// Envoy (`build`), without those naming Istio's proxy's own types (Envoy would refuse them).
pub(super) fn read(
    key: &str,
    filter: &Config<EnvoyFilter>,
    pool: &DescriptorPool,
    build: ProxyBuild,
) -> Read {
    let mut patches = Vec::new();
    for (i, cp) in filter.spec.config_patches.iter().enumerate() {
        let Some(cp) = cp else { continue };
        let Some(patch) = &cp.patch else { continue };
        let Some(message) = message_of(cp.apply_to) else {
            continue;
        };
        let value = match &patch.value {
            Some(v) => {
                let what = format!("EnvoyFilter {key} configPatches[{i}].patch.value");
                let istio_only = v
                    .values()
                    .flat_map(|v| {
                        let mut names = pasa_envoy_json::type_names(v);
                        names.extend(pasa_envoy_json::typed_struct_type_names(v));
                        names
                    })
                    .find(|t| pasa_proto::istio_proxy::defines(t));
                if let (Some(t), ProxyBuild::Envoy) = (istio_only, build) {
                    tracing::warn!(
                        envoy_filter = %key,
                        "patch skipped: {what} names {t}, a type of Istio's proxy, which upstream \
                         Envoy does not have"
                    );
                    continue;
                }
                match pasa_envoy_json::encode(
                    pool,
                    &what,
                    &message,
                    &serde_json::Value::Object(v.clone()),
                ) {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        tracing::warn!(envoy_filter = %key, "patch skipped: {e}");
                        continue;
                    }
                }
            }
            None => Vec::new(),
        };
        let mut operation = patch.operation;
        let positional = matches!(
            cp.apply_to,
            ApplyTo::HttpFilter
                | ApplyTo::NetworkFilter
                | ApplyTo::HttpRoute
                | ApplyTo::ListenerFilter
        );
        if !positional
            && matches!(
                operation,
                Operation::InsertAfter | Operation::InsertBefore | Operation::InsertFirst
            )
        {
            operation = Operation::Add;
        }
        patches.push(Arc::new(Patch {
            key: key.to_string(),
            apply_to: cp.apply_to,
            operation,
            matching: cp.match_.clone().unwrap_or_default(),
            value,
        }));
    }
    Read {
        revision: filter.meta.revision,
        patches,
    }
}
