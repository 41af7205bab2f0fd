//! What went wrong talking to a Kubernetes API server, in words a user can act on: the API
//! server's own message for a refusal (not the client's debug dump), every cause of a failed
//! connection (not just "client error (Connect)"), and what to do about it.

use std::fmt;

use kube::runtime::watcher;
use pasa_runtime::error::causes as chain;

/// Why a request to the API server failed (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// RBAC refused it (403).
    Forbidden,
    /// The resource or object does not exist (404): a CRD not installed, a missing namespace.
    NotFound,
    /// The API server could not be reached, or its certificate was not trusted.
    Unreachable,
    /// Anything else the API server answered.
    Error,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Forbidden => "forbidden",
            Reason::NotFound => "not_found",
            Reason::Unreachable => "unreachable",
            Reason::Error => "error",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed request, told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub reason: Reason,
    /// The API server's message, or the chain of causes of a failed connection.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Problem {
    /// What a client error says.
    pub fn of(e: &kube::Error) -> Problem {
        match e {
            kube::Error::Api(status) => Problem::of_status(status),
            // The client's own variant names ("ServiceError: …") tell a user nothing.
            kube::Error::Service(e) => Problem {
                reason: Reason::Unreachable,
                message: chain(e.as_ref()),
            },
            kube::Error::HyperError(e) => Problem {
                reason: Reason::Unreachable,
                message: chain(e),
            },
            other => Problem {
                reason: if is_connection(other) {
                    Reason::Unreachable
                } else {
                    Reason::Error
                },
                message: chain(other),
            },
        }
    }

    /// What a watcher's error says.
    pub fn of_watch(e: &watcher::Error) -> Problem {
        match e {
            watcher::Error::InitialListFailed(e)
            | watcher::Error::WatchStartFailed(e)
            | watcher::Error::WatchFailed(e) => Problem::of(e),
            watcher::Error::WatchError(status) => Problem::of_status(status),
            other => Problem {
                reason: Reason::Error,
                message: chain(other),
            },
        }
    }

    fn of_status(status: &kube::core::Status) -> Problem {
        let reason = match status.code {
            403 => Reason::Forbidden,
            404 => Reason::NotFound,
            _ => Reason::Error,
        };
        let message = if status.message.is_empty() {
            format!("{} ({})", status.reason, status.code)
        } else {
            status.message.clone()
        };
        Problem { reason, message }
    }

    /// What the user can do, when there is something to say: `server` is the API server's
    /// address.
    pub fn hint(&self, server: &str) -> Option<String> {
        match self.reason {
            Reason::Unreachable if self.message.contains("certificate") => Some(format!(
                "the API server at {server} presented a certificate PCP does not trust: check the \
                 kubeconfig's certificate-authority(-data), or the service account's ca.crt"
            )),
            Reason::Unreachable => Some(format!(
                "check that the API server at {server} is up and reachable from PCP (the \
                 kubeconfig's server, or KUBERNETES_SERVICE_HOST in a pod)"
            )),
            _ => None,
        }
    }
}

/// Whether a client error is a failure to reach the server (not an answer from it).
fn is_connection(e: &kube::Error) -> bool {
    matches!(
        e,
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("client error (Connect)")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("tcp connect error")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn a_connection_failure_says_every_cause() {
        let e = kube::Error::Service(Box::new(Outer(Middle(std::io::Error::other("refused")))));
        let p = Problem::of(&e);
        assert_eq!(p.reason, Reason::Unreachable);
        assert_eq!(
            p.message,
            "client error (Connect): tcp connect error: refused"
        );
        assert!(
            p.hint("https://10.0.0.1:6443")
                .unwrap()
                .contains("https://10.0.0.1:6443")
        );
    }

    #[test]
    fn a_refusal_is_the_api_servers_message() {
        let status = kube::core::Status {
            code: 403,
            message: "pods is forbidden: User \"x\" cannot list resource \"pods\"".into(),
            reason: "Forbidden".into(),
            ..Default::default()
        };
        let p = Problem::of(&kube::Error::Api(Box::new(status)));
        assert_eq!(p.reason, Reason::Forbidden);
        assert_eq!(
            p.message,
            "pods is forbidden: User \"x\" cannot list resource \"pods\""
        );
        assert!(!p.to_string().contains("Status {"), "no debug dump");
    }
}
