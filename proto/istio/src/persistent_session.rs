//! Persistent sessions, as Istio asks for them with labels on a Service (or a ServiceEntry):
//! `istio.io/persistent-session: <cookie>[:<path>]` keeps a client's requests on one endpoint by
//! a cookie, `istio.io/persistent-session-header: <header>` by a header. Either also keeps the
//! service's endpoints that are shutting down but still serving (DRAINING), so that the
//! sessions on them can finish there; new requests never go to them. An endpoint labelled
//! `istio.io/draining` is draining too.

use std::collections::BTreeMap;

/// The label asking for sessions kept by a cookie.
pub const COOKIE_LABEL: &str = "istio.io/persistent-session";
/// The label asking for sessions kept by a header.
pub const HEADER_LABEL: &str = "istio.io/persistent-session-header";
/// The label of an endpoint (a pod's, a WorkloadEntry's) that makes it draining.
pub const DRAINING_LABEL: &str = "istio.io/draining";

/// How a service keeps a client on one endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PersistentSession {
    /// By a session cookie (no expiry) of this name, for this path (`/` unless the label says).
    Cookie { name: String, path: String },
    /// By a header of this name.
    Header { name: String },
}

impl PersistentSession {
    /// The sessions the labels of a service ask for (the cookie's when both are set, as istiod).
    pub fn of<K: AsRef<str> + Ord, V: AsRef<str>>(labels: &BTreeMap<K, V>) -> Option<Self> {
        let get = |key: &str| {
            labels
                .iter()
                .find(|(k, _)| k.as_ref() == key)
                .map(|(_, v)| v.as_ref())
                .filter(|v| !v.is_empty())
        };
        if let Some(cookie) = get(COOKIE_LABEL) {
            let (name, path) = cookie.split_once(':').unwrap_or((cookie, "/"));
            return Some(PersistentSession::Cookie {
                name: name.to_string(),
                path: path.to_string(),
            });
        }
        get(HEADER_LABEL).map(|name| PersistentSession::Header {
            name: name.to_string(),
        })
    }

    /// Whether proxies are sent the service's draining endpoints. istiod sends them only to
    /// services with cookie sessions (a header session's service keeps its clusters ready for
    /// them, but its endpoints leave them out).
    pub fn sends_draining(&self) -> bool {
        matches!(self, PersistentSession::Cookie { .. })
    }
}

/// Whether an endpoint with `labels` is draining by its label.
pub fn labelled_draining<K: AsRef<str> + Ord, V: AsRef<str>>(labels: &BTreeMap<K, V>) -> bool {
    labels
        .iter()
        .any(|(k, v)| k.as_ref() == DRAINING_LABEL && !v.as_ref().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn sessions_are_read_from_the_services_labels() {
        assert_eq!(PersistentSession::of(&labels(&[("app", "x")])), None);
        assert_eq!(PersistentSession::of(&labels(&[(COOKIE_LABEL, "")])), None);
        let cookie = |name: &str, path: &str| PersistentSession::Cookie {
            name: name.into(),
            path: path.into(),
        };
        assert_eq!(
            PersistentSession::of(&labels(&[(COOKIE_LABEL, "session")])),
            Some(cookie("session", "/"))
        );
        assert_eq!(
            PersistentSession::of(&labels(&[(COOKIE_LABEL, "session:/cart")])),
            Some(cookie("session", "/cart"))
        );
        let header = PersistentSession::of(&labels(&[(HEADER_LABEL, "x-session")])).unwrap();
        assert_eq!(
            header,
            PersistentSession::Header {
                name: "x-session".into()
            }
        );
        assert!(!header.sends_draining());
        let both = labels(&[(COOKIE_LABEL, "c"), (HEADER_LABEL, "h")]);
        assert_eq!(PersistentSession::of(&both), Some(cookie("c", "/")));
        assert!(PersistentSession::of(&both).unwrap().sends_draining());
        assert!(labelled_draining(&labels(&[(DRAINING_LABEL, "true")])));
        assert!(!labelled_draining(&labels(&[(DRAINING_LABEL, "")])));
    }
}
