//! Who may do what through the store API: the single place where a caller's identity is turned
//! into a decision. PCP's API, which fronts a store, asks the same questions through the same
//! [`Access`].
//!
//! **Who the caller is.** Over mutual TLS (`--grpc-tls-cert`, `--grpc-tls-key`,
//! `--grpc-client-ca`) the caller is the URI SAN of its verified client certificate:
//! - an identity listed with `--grpc-operator` (PCP, people running pasactl, and the server's
//!   own identity, which the store's replicas use with each other) is an **operator**: it may
//!   write and read everything;
//! - any other workload SPIFFE ID `spiffe://<td>/ns/<ns>/sa/<sa>` is a **workload**, an agent;
//! - anything else is refused.
//!
//! A proxy's node ID and metadata are claims: what a workload may read is decided by the
//! namespace of its verified identity, never by them, as istiod decides it. A workload may
//! - watch, list and get, as a proxy of its own namespace only: the node ID it watches as must
//!   name that namespace (and the `CONFIG_NAMESPACE` and `SERVICE_ACCOUNT` it claims, when it
//!   claims them, must be its own), and the policy kinds that select workloads of one namespace
//!   ([`Kind::NAMESPACE_SCOPED`]: Sidecar, AuthorizationPolicy, RequestAuthentication, ...)
//!   only of its own namespace and the mesh's root namespace. Services, routes and the rest are
//!   visible across namespaces, as istiod's default `exportTo` makes them; `exportTo` narrowing
//!   is applied by the agent, as in istiod it narrows what config applies rather than guarding
//!   secrets. The store holds no TLS keys (they stay in the pods that mount them); the only
//!   credentials it holds are the registry logins of the pull secrets Wasm extensions name
//!   (`ImagePullSecret`, namespace-scoped: readable by the workloads of the Secret's namespace,
//!   and, for the root namespace's, by every workload, as istiod hands them to the proxies the
//!   root namespace's extensions apply to);
//! - report the status of proxies of its own namespace;
//! - not write, and not list every proxy's status.
//!
//! A refusal is `PERMISSION_DENIED` naming the field and the identity, and is counted
//! (`pasa_store_api_denied_total{method,reason}`).
//!
//! **On behalf of.** PCP relays the agents' watches and reports to the store under its own
//! (operator) certificate, so it says whom it relays for in the `x-pasa-caller` request header
//! (`workload <SPIFFE ID>` or `operator <ID>`). The store believes that header from an operator
//! only, or where no identity is verified at all (plaintext, or PCP's in-process store), since
//! there it can only narrow what the caller may do.
//!
//! **Plaintext** (no `--grpc-tls-cert`) verifies nobody and allows everything: the embedded
//! single-machine default. Servers say so loudly in their log at start.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use pasa_istio::node::NodeId;
use pasa_istio::spiffe::SpiffeId;
use pasa_proto::Kind;
use pasa_proto::store::v1::{ProxyStatus, SubscriberIdentity};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tonic::{Request, Status};

pub use crate::tls::ServerTls;

use crate::record::ObjectKey;
use crate::selector::Selector;

/// The request header through which a front (PCP) says whom it relays a call for.
pub const CALLER_HEADER: &str = "x-pasa-caller";

/// Who is calling, as far as the server could verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Nobody was verified (plaintext): everything is allowed.
    Unverified,
    /// May write and read everything.
    Operator(String),
    /// An agent, limited to its namespace.
    Workload(SpiffeId),
}

impl Caller {
    /// The value of [`CALLER_HEADER`] that relays this caller, if it is anyone.
    pub fn header(&self) -> Option<String> {
        match self {
            Caller::Unverified => None,
            Caller::Operator(id) => Some(format!("operator {id}")),
            Caller::Workload(id) => Some(format!("workload {id}")),
        }
    }

    fn from_header(value: &str) -> Result<Caller, CallerHeaderError> {
        match value.split_once(' ') {
            Some(("operator", id)) if !id.is_empty() => Ok(Caller::Operator(id.to_string())),
            Some(("workload", id)) => Ok(Caller::Workload(SpiffeId::parse(id)?)),
            _ => Err(CallerHeaderError::Form {
                value: value.to_string(),
            }),
        }
    }
}

/// Why the caller a front relays (the [`CALLER_HEADER`]) cannot be read.
#[derive(Debug, thiserror::Error)]
enum CallerHeaderError {
    #[error("not text")]
    NotText,
    #[error(transparent)]
    Workload(#[from] pasa_istio::spiffe::SpiffeIdError),
    #[error("{value:?} is not `workload <SPIFFE ID>` or `operator <ID>`")]
    Form { value: String },
}

/// Why no identity was read from a certificate.
#[derive(Debug, thiserror::Error)]
pub enum CertIdentityError {
    #[error("not a PEM certificate: {0}")]
    Pem(#[source] x509_parser::nom::Err<x509_parser::error::PEMError>),
    #[error("not a certificate: {0}")]
    Der(#[source] x509_parser::nom::Err<x509_parser::error::X509Error>),
    #[error("its subjectAltName cannot be read: {0}")]
    SubjectAltName(#[source] x509_parser::error::X509Error),
    #[error("the connection presented no client certificate")]
    NoCertificate,
    #[error("the client certificate has no URI SAN")]
    NoUriSan,
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Caller::Unverified => f.write_str("an unverified caller"),
            Caller::Operator(id) => write!(f, "operator {id}"),
            Caller::Workload(id) => write!(f, "{id}"),
        }
    }
}

/// Command-line options of an API server's mutual TLS.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// PEM certificate chain the gRPC API serves; with --grpc-tls-key and --grpc-client-ca it
    /// serves mutual TLS only, and decides access by the client certificate's identity.
    #[arg(long, env = "PASA_GRPC_TLS_CERT", requires_all = ["grpc_tls_key", "grpc_client_ca"])]
    pub grpc_tls_cert: Option<PathBuf>,
    /// PEM private key of --grpc-tls-cert.
    #[arg(long, env = "PASA_GRPC_TLS_KEY", requires = "grpc_tls_cert")]
    pub grpc_tls_key: Option<PathBuf>,
    /// PEM CA certificates client certificates must be signed by (the mesh's root).
    #[arg(long, env = "PASA_GRPC_CLIENT_CA", requires = "grpc_tls_cert")]
    pub grpc_client_ca: Option<PathBuf>,
    /// An identity (the URI SAN of a client certificate) allowed to write and to read
    /// everything: PCP, people running pasactl. Repeat, or separate with commas. The server's
    /// own identity is one.
    #[arg(long, env = "PASA_GRPC_OPERATOR", value_delimiter = ',')]
    pub grpc_operator: Vec<String>,
}

impl TlsArgs {
    /// The access rules in a mesh whose root namespace is `root_namespace`, and the TLS files
    /// they were set up with (none in plaintext). Errors name the flag and the file.
    pub fn load(&self, root_namespace: &str) -> anyhow::Result<(Access, Option<ServerTls>)> {
        let (Some(cert), Some(key), Some(ca)) = (
            &self.grpc_tls_cert,
            &self.grpc_tls_key,
            &self.grpc_client_ca,
        ) else {
            if !self.grpc_operator.is_empty() {
                anyhow::bail!(
                    "--grpc-operator needs --grpc-tls-cert: without TLS nobody is verified"
                );
            }
            return Ok((
                Access::new(false, BTreeSet::new(), root_namespace.into()),
                None,
            ));
        };
        let tls = ServerTls::read(cert, key, ca)?;
        let own = uri_san_of_pem(&tls.cert)
            .with_context(|| format!("--grpc-tls-cert {}", cert.display()))?;
        let mut operators: BTreeSet<String> = self.grpc_operator.iter().cloned().collect();
        operators.extend(own);
        Ok((
            Access::mutual_tls(operators, root_namespace.to_string()),
            Some(tls),
        ))
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeniedLabels {
    method: &'static str,
    reason: &'static str,
}

/// The access rules of one API server; cheap to clone.
#[derive(Clone)]
pub struct Access {
    inner: Arc<Inner>,
}

#[derive(Clone)]
struct Inner {
    /// Callers are verified by their client certificates.
    verified: bool,
    operators: BTreeSet<String>,
    root_namespace: String,
    /// The mesh's trust domain and its aliases (`trustDomainAliases`): workload identities of
    /// another are nobody here (None: any).
    trust_domains: Option<BTreeSet<String>>,
    denied: Family<DeniedLabels, Counter>,
}

/// A refusal: its message for the caller and its reason label.
struct Denied {
    reason: &'static str,
    message: String,
}

impl Access {
    /// Nobody verified, everything allowed.
    pub fn plaintext() -> Access {
        Access::new(false, BTreeSet::new(), "istio-system".into())
    }

    /// Callers verified by their client certificates; `operators` may write.
    pub fn mutual_tls(operators: BTreeSet<String>, root_namespace: String) -> Access {
        Access::new(true, operators, root_namespace)
    }

    /// The rules of a store served in-process behind this front (PCP's embedded store): it
    /// verifies nobody itself, believes whom the front relays, and counts its refusals in this
    /// front's metric.
    pub fn behind(&self) -> Access {
        Access {
            inner: Arc::new(Inner {
                verified: false,
                operators: BTreeSet::new(),
                ..(*self.inner).clone()
            }),
        }
    }

    fn new(verified: bool, operators: BTreeSet<String>, root_namespace: String) -> Access {
        Access {
            inner: Arc::new(Inner {
                verified,
                operators,
                root_namespace,
                trust_domains: None,
                denied: Family::default(),
            }),
        }
    }

    /// Takes workload identities of `trust_domain` and of its `aliases` only (those of another
    /// trust domain are refused as unknown identities), as istiod takes identities of the
    /// mesh's `trustDomainAliases` as its own; set up before serving.
    pub fn with_trust_domain(self, trust_domain: &str, aliases: &[String]) -> Access {
        let domains = std::iter::once(trust_domain.to_string())
            .chain(aliases.iter().cloned())
            .collect();
        Access {
            inner: Arc::new(Inner {
                trust_domains: Some(domains),
                ..(*self.inner).clone()
            }),
        }
    }

    /// Whether callers are verified (mutual TLS).
    pub fn verified(&self) -> bool {
        self.inner.verified
    }

    /// Registers `pasa_store_api_denied` (calls refused, by method and reason).
    pub fn register(&self, registry: &mut Registry) {
        registry.sub_registry_with_prefix("pasa_store").register(
            "api_denied",
            "Store API calls refused because the caller's identity does not allow them, by method and reason",
            self.inner.denied.clone(),
        );
    }

    fn refuse(&self, method: &'static str, denied: Denied) -> Status {
        self.inner
            .denied
            .get_or_create(&DeniedLabels {
                method,
                reason: denied.reason,
            })
            .inc();
        tracing::warn!(method, reason = denied.reason, message = %denied.message, "store API call refused");
        Status::permission_denied(denied.message)
    }

    /// Who is calling with `request` (see the module doc).
    pub fn caller<T>(&self, method: &'static str, request: &Request<T>) -> Result<Caller, Status> {
        let relayed = request
            .metadata()
            .get(CALLER_HEADER)
            .map(|v| {
                v.to_str()
                    .map_err(|_| CallerHeaderError::NotText)
                    .and_then(Caller::from_header)
            })
            .transpose()
            .map_err(|e| {
                self.refuse(
                    method,
                    Denied {
                        reason: "bad_caller_header",
                        message: format!("{CALLER_HEADER}: {e}"),
                    },
                )
            })?;
        if !self.inner.verified {
            return Ok(relayed.unwrap_or(Caller::Unverified));
        }
        let verified = request
            .peer_certs()
            .and_then(|certs| certs.first().map(|c| uri_san_of_der(c.as_ref())))
            .unwrap_or(Err(CertIdentityError::NoCertificate))
            .and_then(|id| id.ok_or(CertIdentityError::NoUriSan))
            .map_err(|e| {
                self.refuse(
                    method,
                    Denied {
                        reason: "no_identity",
                        message: format!("the caller's identity cannot be read: {e}"),
                    },
                )
            })?;
        if self.inner.operators.contains(&verified) {
            return Ok(relayed.unwrap_or(Caller::Operator(verified)));
        }
        match SpiffeId::parse(&verified) {
            Ok(id) if !self.trust_domain_ok(&id) => Err(self.refuse(
                method,
                Denied {
                    reason: "unknown_identity",
                    message: format!(
                        "{id} is not of this mesh's trust domain or its aliases ({})",
                        self.inner
                            .trust_domains
                            .iter()
                            .flatten()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                },
            )),
            Ok(id) => Ok(Caller::Workload(id)),
            Err(e) => Err(self.refuse(
                method,
                Denied {
                    reason: "unknown_identity",
                    message: format!("{e}; and it is not an operator (--grpc-operator)"),
                },
            )),
        }
    }

    /// Whether `id` is of the mesh's trust domain or an alias of it (any, when none is set).
    fn trust_domain_ok(&self, id: &SpiffeId) -> bool {
        self.inner
            .trust_domains
            .as_ref()
            .is_none_or(|tds| tds.contains(&id.trust_domain))
    }

    /// May `caller` write (apply, delete)?
    pub fn write(&self, method: &'static str, caller: &Caller) -> Result<(), Status> {
        match caller {
            Caller::Unverified | Caller::Operator(_) => Ok(()),
            Caller::Workload(_) => Err(self.refuse(
                method,
                Denied {
                    reason: "write",
                    message: format!(
                        "{caller} may not write: only operators may (--grpc-operator)"
                    ),
                },
            )),
        }
    }

    /// May `caller` ask istiod's debug types (`istio.io/debug/*` over xDS)? As istiod answers
    /// them: operators, and workloads of the root (istiod's system) namespace.
    pub fn debug(&self, caller: &Caller) -> Result<(), Status> {
        match caller {
            Caller::Workload(id) if id.namespace != self.inner.root_namespace => Err(self.refuse(
                "DebugXds",
                Denied {
                    reason: "debug",
                    message: format!(
                        "the debug info is not available for {caller}: only operators and \
                         workloads of {} may ask",
                        self.inner.root_namespace
                    ),
                },
            )),
            _ => Ok(()),
        }
    }

    /// May `caller` list every proxy's status?
    pub fn list_proxies(&self, caller: &Caller) -> Result<(), Status> {
        match caller {
            Caller::Unverified | Caller::Operator(_) => Ok(()),
            Caller::Workload(_) => Err(self.refuse(
                "ListProxyStatus",
                Denied {
                    reason: "proxy_status",
                    message: format!(
                        "{caller} may not list proxy status: only operators may (--grpc-operator)"
                    ),
                },
            )),
        }
    }

    /// May `caller` read what `selector` selects?
    pub fn read(
        &self,
        method: &'static str,
        caller: &Caller,
        selector: &Selector,
        field: &str,
    ) -> Result<(), Status> {
        let Caller::Workload(id) = caller else {
            return Ok(());
        };
        for (i, rule) in selector.rules.iter().enumerate() {
            let private = rule.kinds.is_empty()
                || rule
                    .kinds
                    .iter()
                    .any(|k| Kind::NAMESPACE_SCOPED.contains(k));
            let own = |ns: &String| *ns == id.namespace || *ns == self.inner.root_namespace;
            if private && (rule.namespaces.is_empty() || !rule.namespaces.iter().all(own)) {
                return Err(self.refuse(
                    method,
                    Denied {
                        reason: "namespace",
                        message: format!(
                            "{field}rules[{i}].namespaces: {id} may read {} of namespaces {} and \
                             {} only",
                            kind_list(),
                            id.namespace,
                            self.inner.root_namespace
                        ),
                    },
                ));
            }
        }
        Ok(())
    }

    /// May `caller` read the object `key`?
    pub fn get(&self, caller: &Caller, key: &ObjectKey) -> Result<(), Status> {
        let Caller::Workload(id) = caller else {
            return Ok(());
        };
        if Kind::NAMESPACE_SCOPED.contains(&key.kind)
            && key.namespace != id.namespace
            && key.namespace != self.inner.root_namespace
        {
            return Err(self.refuse(
                "Get",
                Denied {
                    reason: "namespace",
                    message: format!(
                        "ref.namespace: {id} may read {} of namespaces {} and {} only",
                        kind_list(),
                        id.namespace,
                        self.inner.root_namespace
                    ),
                },
            ));
        }
        Ok(())
    }

    /// May `caller` watch what `selector` selects as the proxy `identity` claims to be?
    pub fn watch(
        &self,
        caller: &Caller,
        identity: Option<&SubscriberIdentity>,
        selector: &Selector,
    ) -> Result<(), Status> {
        let node = match identity.filter(|i| !i.node_id.is_empty()) {
            Some(identity) => Some(
                NodeId::parse(&identity.node_id)
                    .map_err(|e| Status::invalid_argument(format!("identity.node_id: {e}")))?,
            ),
            None => None,
        };
        if let Caller::Workload(id) = caller {
            let claims = identity.map(|i| &i.metadata);
            let claim = |key: &str| claims.and_then(|m| m.get(key)).filter(|v| !v.is_empty());
            let mismatch = match &node {
                None => Some("identity.node_id: required of a workload".to_string()),
                Some(node) if node.namespace() != Some(id.namespace.as_str()) => Some(format!(
                    "identity.node_id: names namespace {:?}, not the caller's",
                    node.namespace().unwrap_or_default()
                )),
                Some(_) => match (claim("CONFIG_NAMESPACE"), claim("SERVICE_ACCOUNT")) {
                    (Some(ns), _) if *ns != id.namespace => Some(format!(
                        "identity.metadata.CONFIG_NAMESPACE: {ns:?} is not the caller's namespace"
                    )),
                    (_, Some(sa)) if *sa != id.service_account => Some(format!(
                        "identity.metadata.SERVICE_ACCOUNT: {sa:?} is not the caller's service account"
                    )),
                    _ => None,
                },
            };
            if let Some(mismatch) = mismatch {
                return Err(self.refuse(
                    "Watch",
                    Denied {
                        reason: "identity",
                        message: format!("{mismatch} ({id})"),
                    },
                ));
            }
        }
        self.read("Watch", caller, selector, "subscription.")
    }

    /// May `caller` report `status` (of a proxy of its own namespace only)?
    pub fn report(&self, caller: &Caller, status: &ProxyStatus) -> Result<(), Status> {
        let Caller::Workload(id) = caller else {
            return Ok(());
        };
        let node_namespace = NodeId::parse(&status.node_id)
            .ok()
            .and_then(|n| n.namespace().map(str::to_string));
        let mismatch = if node_namespace.as_deref() != Some(id.namespace.as_str()) {
            Some(format!(
                "status.node_id: {:?} is not a proxy of the caller's namespace",
                status.node_id
            ))
        } else if !status.namespace.is_empty() && status.namespace != id.namespace {
            Some(format!(
                "status.namespace: {:?} is not the caller's namespace",
                status.namespace
            ))
        } else {
            None
        };
        match mismatch {
            Some(message) => Err(self.refuse(
                "ReportStatus",
                Denied {
                    reason: "identity",
                    message: format!("{message} ({id})"),
                },
            )),
            None => Ok(()),
        }
    }
}

fn kind_list() -> String {
    let names: Vec<&str> = Kind::NAMESPACE_SCOPED.iter().map(|k| k.as_str()).collect();
    names.join(", ")
}

/// `request` relayed for `caller` (see the module doc).
pub fn on_behalf<T>(caller: &Caller, message: T) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(value) = caller.header()
        && let Ok(value) = value.parse()
    {
        request.metadata_mut().insert(CALLER_HEADER, value);
    }
    request
}

/// The first URI SAN of a DER certificate, if it has one.
fn uri_san_of_der(der: &[u8]) -> Result<Option<String>, CertIdentityError> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).map_err(CertIdentityError::Der)?;
    let san = cert
        .subject_alternative_name()
        .map_err(CertIdentityError::SubjectAltName)?;
    Ok(san.and_then(|san| {
        san.value.general_names.iter().find_map(|n| match n {
            GeneralName::URI(uri) => Some(uri.to_string()),
            _ => None,
        })
    }))
}

/// The first URI SAN of the first certificate of a PEM chain.
fn uri_san_of_pem(pem: &[u8]) -> Result<Option<String>, CertIdentityError> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).map_err(CertIdentityError::Pem)?;
    uri_san_of_der(&block.contents)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::Rule;

    fn workload(ns: &str) -> Caller {
        Caller::Workload(
            SpiffeId::parse(&format!("spiffe://cluster.local/ns/{ns}/sa/web")).unwrap(),
        )
    }

    fn access() -> Access {
        Access::mutual_tls(BTreeSet::new(), "istio-system".into())
    }

    fn rule(kinds: &[Kind], namespaces: &[&str]) -> Rule {
        Rule {
            kinds: kinds.to_vec(),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn identity(node: &str) -> SubscriberIdentity {
        SubscriberIdentity {
            node_id: node.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_workload_watches_as_a_proxy_of_its_own_namespace_only() {
        let access = access();
        let sel = Selector {
            rules: vec![rule(&[Kind::Sidecar], &["shop", "istio-system"])],
        };
        let own = identity("sidecar~10.0.0.1~web-1.shop~shop.svc.cluster.local");
        access.watch(&workload("shop"), Some(&own), &sel).unwrap();
        let err = access
            .watch(&workload("bank"), Some(&own), &sel)
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert!(
            err.message()
                .starts_with("identity.node_id: names namespace \"shop\""),
            "{}",
            err.message()
        );
        assert!(access.watch(&workload("shop"), None, &sel).is_err());
        let mut claims = own.clone();
        claims
            .metadata
            .insert("SERVICE_ACCOUNT".into(), "admin".into());
        let err = access
            .watch(&workload("shop"), Some(&claims), &sel)
            .unwrap_err();
        assert!(
            err.message().contains("SERVICE_ACCOUNT"),
            "{}",
            err.message()
        );
        // Operators and unverified callers may watch as anyone, and anything.
        let everything = Selector::everything();
        access
            .watch(&Caller::Operator("pcp".into()), Some(&own), &everything)
            .unwrap();
        Access::plaintext()
            .watch(&Caller::Unverified, None, &everything)
            .unwrap();
        // Node IDs are still checked for form.
        let err = access
            .watch(
                &Caller::Unverified,
                Some(&identity("nonsense")),
                &everything,
            )
            .unwrap_err();
        assert!(err.message().starts_with("identity.node_id: node ID"));
    }

    #[test]
    fn policies_of_other_namespaces_are_out_of_a_workloads_reach() {
        let access = access();
        let shop = workload("shop");
        let ok = Selector {
            rules: vec![
                rule(
                    &[Kind::AuthorizationPolicy, Kind::Sidecar],
                    &["shop", "istio-system"],
                ),
                // Services and routes of every namespace are visible.
                rule(&[Kind::ServiceEndpoints, Kind::VirtualService], &[]),
                rule(
                    &[Kind::DestinationRule, Kind::PeerAuthentication],
                    &["bank"],
                ),
            ],
        };
        access.read("List", &shop, &ok, "selector.").unwrap();
        for (bad, field) in [
            (rule(&[Kind::AuthorizationPolicy], &["bank"]), "rules[1]"),
            (rule(&[Kind::RequestAuthentication], &[]), "rules[1]"),
            // Another namespace's registry credentials.
            (rule(&[Kind::ImagePullSecret], &["bank"]), "rules[1]"),
            (rule(&[], &["bank"]), "rules[1]"),
        ] {
            let sel = Selector {
                rules: vec![rule(&[Kind::Gateway], &[]), bad],
            };
            let err = access.read("List", &shop, &sel, "selector.").unwrap_err();
            assert!(
                err.message().starts_with(&format!("selector.{field}.namespaces: spiffe://cluster.local/ns/shop/sa/web may read Sidecar")),
                "{}",
                err.message()
            );
        }
        let key = |kind, ns: &str| ObjectKey {
            kind,
            namespace: ns.into(),
            name: "x".into(),
        };
        access
            .get(&shop, &key(Kind::Sidecar, "istio-system"))
            .unwrap();
        access.get(&shop, &key(Kind::ServiceEntry, "bank")).unwrap();
        assert!(access.get(&shop, &key(Kind::Sidecar, "bank")).is_err());
        access
            .get(&shop, &key(Kind::ImagePullSecret, "shop"))
            .unwrap();
        assert!(
            access
                .get(&shop, &key(Kind::ImagePullSecret, "bank"))
                .is_err()
        );
    }

    #[test]
    fn workloads_neither_write_nor_see_every_proxy_and_report_for_their_own() {
        let access = access();
        let shop = workload("shop");
        assert!(access.write("Apply", &shop).is_err());
        access
            .write("Apply", &Caller::Operator("pcp".into()))
            .unwrap();
        assert!(access.list_proxies(&shop).is_err());
        assert!(access.debug(&shop).is_err());
        access.debug(&workload("istio-system")).unwrap();
        access.debug(&Caller::Operator("pcp".into())).unwrap();
        let status = |node: &str, ns: &str| ProxyStatus {
            node_id: node.into(),
            namespace: ns.into(),
            ..Default::default()
        };
        let own = "sidecar~10.0.0.1~web-1.shop~shop.svc.cluster.local";
        access.report(&shop, &status(own, "shop")).unwrap();
        access.report(&shop, &status(own, "")).unwrap();
        assert!(access.report(&shop, &status(own, "bank")).is_err());
        let other = "sidecar~10.0.0.1~web-1.bank~bank.svc.cluster.local";
        assert!(access.report(&shop, &status(other, "bank")).is_err());
        let mut registry = Registry::default();
        access.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("pasa_store_api_denied_total{method=\"Apply\",reason=\"write\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn workloads_of_another_trust_domain_are_nobody() {
        let access = access().with_trust_domain("example.org", &["old.example.org".to_string()]);
        let id = SpiffeId::parse("spiffe://cluster.local/ns/shop/sa/web").unwrap();
        assert!(!access.trust_domain_ok(&id));
        let ours = SpiffeId::parse("spiffe://example.org/ns/shop/sa/web").unwrap();
        assert!(access.trust_domain_ok(&ours));
        let aliased = SpiffeId::parse("spiffe://old.example.org/ns/shop/sa/web").unwrap();
        assert!(
            access.trust_domain_ok(&aliased),
            "an alias is the mesh's own"
        );
    }

    #[test]
    fn relayed_callers_are_believed_only_where_they_cannot_gain() {
        let relayed = on_behalf(&workload("shop"), ());
        // Without verification, a relayed identity narrows what the call may do.
        assert_eq!(
            Access::plaintext().caller("Watch", &relayed).unwrap(),
            workload("shop")
        );
        assert_eq!(
            Access::plaintext()
                .caller("Watch", &Request::new(()))
                .unwrap(),
            Caller::Unverified
        );
        // Under mutual TLS, a connection without a client certificate is nobody.
        let err = access().caller("Watch", &relayed).unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        let mut bad = Request::new(());
        bad.metadata_mut()
            .insert(CALLER_HEADER, "root please".parse().unwrap());
        let err = Access::plaintext().caller("Watch", &bad).unwrap_err();
        assert!(
            err.message().starts_with("x-pasa-caller: "),
            "{}",
            err.message()
        );
    }
}
