//! Persistent sessions (see [`PersistentSession`]) as istiod serves them when its
//! `PILOT_ENABLE_PERSISTENT_SESSION_FILTER` is on (the agent's `--persistent-session-filter`):
//! outbound and gateway connection managers carry Envoy's stateful session filter, empty, just
//! before the router, and the virtual hosts of services with sessions (and the routes to them)
//! configure it, so that a client that got a cookie (or header) naming an endpoint keeps going
//! to it, even once it is draining. The clusters' part (draining endpoints kept) is
//! `cluster::keep_draining`, and does not depend on the filter.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::extensions::filters::http::stateful_session::v3::{
    StatefulSession, StatefulSessionPerRoute, stateful_session_per_route::Override,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_types::pb::envoy::extensions::http::stateful_session::cookie::v3::CookieBasedSessionState;
use envoy_types::pb::envoy::extensions::http::stateful_session::header::v3::HeaderBasedSessionState;
use envoy_types::pb::envoy::r#type::http::v3::Cookie;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;

use crate::model::registry::PersistentSession;

/// The filter's name, under which virtual hosts and routes configure it.
pub(super) const FILTER: &str = "envoy.filters.http.stateful_session";

/// The filter with `config`.
fn filter(config: StatefulSession) -> HttpFilter {
    HttpFilter {
        name: FILTER.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(config))),
        ..Default::default()
    }
}

/// The filter configured for `session` itself (gRPC clients take it so: their listener is
/// the service's own).
pub(super) fn filter_for(session: &PersistentSession) -> HttpFilter {
    filter(state(session))
}

/// Puts the connection managers' filter, with no session of its own (each virtual host or
/// route says), just before the router (the last filter).
pub(super) fn insert(filters: &mut Vec<HttpFilter>) {
    let router = filters.len().saturating_sub(1);
    filters.insert(router, filter(StatefulSession::default()));
}

/// Where filters that go last but for the router go: before the session filter, if there is
/// one, as istiod orders them (the session filter follows every other but the router).
pub(super) fn before_router(filters: &[HttpFilter]) -> usize {
    filters
        .iter()
        .position(|f| f.name == FILTER)
        .unwrap_or(filters.len().saturating_sub(1))
}

/// The filter's configuration for a virtual host or route to a service with `session`: a
/// session cookie (no expiry: the browser drops it with the tab; the application's cookie
/// decides how long a session lasts) or a header.
fn per_route(session: &PersistentSession) -> Any {
    pack_any(StatefulSessionPerRoute {
        r#override: Some(Override::StatefulSession(state(session))),
    })
}

/// The filter's configuration for `session`.
fn state(session: &PersistentSession) -> StatefulSession {
    let (name, state) = match session {
        PersistentSession::Cookie { name, path } => (
            "envoy.http.stateful_session.cookie",
            pack_any(CookieBasedSessionState {
                cookie: Some(Cookie {
                    name: name.clone(),
                    path: path.clone(),
                    ..Default::default()
                }),
            }),
        ),
        PersistentSession::Header { name } => (
            "envoy.http.stateful_session.header",
            pack_any(HeaderBasedSessionState { name: name.clone() }),
        ),
    };
    StatefulSession {
        session_state: Some(TypedExtensionConfig {
            name: name.into(),
            typed_config: Some(state),
        }),
        ..Default::default()
    }
}

/// Configures the filter in `per_filter` (a virtual host's or route's `typed_per_filter_config`)
/// for `session`.
pub(super) fn configure(per_filter: &mut HashMap<String, Any>, session: &PersistentSession) {
    per_filter.insert(FILTER.into(), per_route(session));
}
