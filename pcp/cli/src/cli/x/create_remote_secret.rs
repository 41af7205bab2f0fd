//! `pasactl x create-remote-secret`: the Secret that lets a PCP read another (remote) cluster,
//! as `istioctl create-remote-secret` writes it, on stdout for `kubectl apply -f -` into the
//! cluster of that PCP:
//!
//! - named `istio-remote-secret-<cluster>`, in the control plane's namespace (`-n`), labelled
//!   `istio/multiCluster: "true"` (what PCP and istiod look for) and annotated
//!   `networking.istio.io/cluster: <cluster>`;
//! - holding, under the key `<cluster>`, a kubeconfig that reaches the remote cluster's API
//!   server (the `--kubeconfig`/`--context` cluster's server, or `--server`) as its reader
//!   ServiceAccount (`--service-account`): that account's long-lived token and the cluster's CA,
//!   read from the account's token Secret (type `kubernetes.io/service-account-token`).
//!
//! The token Secret is the one `--secret-name` names, else the first one of the account in the
//! namespace. When there is none, the reader's objects of `deploy/remote` (the ServiceAccount,
//! its read-only ClusterRole and binding, the token Secret) are created, unless
//! `--create-service-account=false`, and pasactl waits briefly for Kubernetes to fill the token
//! in. Without `--name` the cluster is named by the UID of its `kube-system` namespace, as
//! istioctl names it.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config};
use pasa_kube::problem::Problem;
use pasa_runtime::error::causes;
use serde_json::{Value, json};

use crate::cli::{CmdResult, UsageError, out};

mod reader;

/// The reader ServiceAccount istioctl takes by default, and `deploy/remote` creates.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "istio-reader-service-account";
/// The label PCP (and istiod) find remote secrets by.
pub const MULTICLUSTER_LABEL: &str = "istio/multiCluster";
/// The annotation naming the cluster a remote secret reaches.
pub const CLUSTER_ANNOTATION: &str = "networking.istio.io/cluster";
/// What a remote secret's name starts with; the cluster's name follows.
pub const SECRET_PREFIX: &str = "istio-remote-secret-";
const TOKEN_TYPE: &str = "kubernetes.io/service-account-token";
const ACCOUNT_ANNOTATION: &str = "kubernetes.io/service-account.name";
/// How often, and how long apart, a new token Secret is read again until Kubernetes' token
/// controller has filled it in.
const TOKEN_POLLS: u32 = 5;
const TOKEN_POLL_EVERY: Duration = Duration::from_secs(1);
/// How long one request to the API server may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(clap::Args, Debug)]
pub struct CreateRemoteSecretArgs {
    /// The remote cluster's name (a DNS-1123 label): the cluster ID PCP gives what it reads
    /// there, and part of the Secret's name. Default: the UID of the cluster's `kube-system`
    /// namespace, as istioctl names it.
    #[arg(long)]
    pub name: Option<String>,
    /// The namespace of the reader ServiceAccount in the remote cluster, and of the Secret
    /// written (the control plane's namespace).
    #[arg(short = 'n', long, default_value = "istio-system")]
    pub namespace: String,
    /// The remote cluster's ServiceAccount whose token the kubeconfig carries.
    #[arg(long, default_value = DEFAULT_SERVICE_ACCOUNT)]
    pub service_account: String,
    /// Create the reader ServiceAccount, its read-only RBAC and its token Secret (those of
    /// deploy/remote) when the account has no token Secret yet; `=false` fails instead.
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub create_service_account: bool,
    /// The token Secret to use, when the account has several.
    #[arg(long)]
    pub secret_name: Option<String>,
    /// The kubeconfig of the remote cluster [default: $KUBECONFIG, else ~/.kube/config].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig's context to use [default: its current context].
    #[arg(long)]
    pub context: Option<String>,
    /// The remote API server's address as the PCP reading it reaches it (`https://host:port`)
    /// [default: the server of the kubeconfig's context].
    #[arg(long)]
    pub server: Option<String>,
    /// The name the remote API server's certificate is checked against, when --server is a
    /// proxy or an address its certificate does not name.
    #[arg(long)]
    pub tls_server_name: Option<String>,
}

/// [`CreateRemoteSecretArgs`] as the command line gave them. Its `--server` shares its name
/// with pasactl's global `--server` (the store's), whose value clap hands down to every
/// subcommand, default and `PASA_SERVER` included: only a `--server` typed on the command line
/// names the remote API server.
#[derive(Debug)]
pub struct CreateRemoteSecretCommand(pub CreateRemoteSecretArgs);

impl clap::FromArgMatches for CreateRemoteSecretCommand {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut args = CreateRemoteSecretArgs::from_arg_matches(matches)?;
        typed_server_only(&mut args, matches);
        Ok(CreateRemoteSecretCommand(args))
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)?;
        typed_server_only(&mut self.0, matches);
        Ok(())
    }
}

impl clap::Args for CreateRemoteSecretCommand {
    fn augment_args(command: clap::Command) -> clap::Command {
        CreateRemoteSecretArgs::augment_args(command)
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        CreateRemoteSecretArgs::augment_args_for_update(command)
    }
}

/// Forgets a `--server` that did not come from the command line (the store's default or
/// `PASA_SERVER`).
fn typed_server_only(args: &mut CreateRemoteSecretArgs, matches: &clap::ArgMatches) {
    if matches.value_source("server") != Some(clap::parser::ValueSource::CommandLine) {
        args.server = None;
    }
}

/// Why no remote secret was written; each says which flag or object is at fault.
#[derive(Debug, thiserror::Error)]
pub enum RemoteSecretError {
    #[error("{flag}: {message}")]
    Kubeconfig { flag: String, message: String },
    #[error(
        "--name not given, and the remote cluster's kube-system namespace could not be read to \
         name the cluster by its UID: {0} (pass --name)"
    )]
    ClusterUid(Problem),
    #[error("Secret {namespace}/{name} (--secret-name): {problem}")]
    NamedSecret {
        namespace: String,
        name: String,
        problem: Problem,
    },
    #[error(
        "Secret {namespace}/{name} (--secret-name) is no token of ServiceAccount {account}: it \
         must be of type {TOKEN_TYPE} and annotated {ACCOUNT_ANNOTATION}: {account}"
    )]
    NotATokenOfTheAccount {
        namespace: String,
        name: String,
        account: String,
    },
    #[error(
        "cannot list the Secrets of namespace {namespace} to find the token of ServiceAccount \
         {account} (--service-account): {problem}"
    )]
    ListSecrets {
        namespace: String,
        account: String,
        problem: Problem,
    },
    #[error(
        "ServiceAccount {namespace}/{account} (--service-account) has no token Secret (type \
         {TOKEN_TYPE}) and --create-service-account=false: apply deploy/remote to the remote \
         cluster (kubectl apply -k deploy/remote), or leave pasactl to create them"
    )]
    NoToken { namespace: String, account: String },
    #[error("cannot create {object} in the remote cluster (--create-service-account): {problem}")]
    Create { object: String, problem: Problem },
    #[error(
        "Secret {namespace}/{name} has no {key:?} after {waited:?}: Kubernetes' token \
         controller fills it in only for an existing ServiceAccount {account}; check that it \
         exists, or name another token Secret with --secret-name"
    )]
    TokenMissing {
        namespace: String,
        name: String,
        account: String,
        key: &'static str,
        waited: Duration,
    },
    #[error("reading Secret {namespace}/{name} while waiting for its token: {problem}")]
    TokenRead {
        namespace: String,
        name: String,
        problem: Problem,
    },
    #[error("the remote secret cannot be written as YAML: {0}")]
    Yaml(#[source] serde_saphyr::ser::Error),
}

/// Writes the remote secret on stdout; a loopback API server address gets a warning on stderr.
pub async fn run(CreateRemoteSecretCommand(args): CreateRemoteSecretCommand) -> CmdResult {
    if let Some(name) = &args.name
        && !is_dns_label(name)
    {
        return Err(UsageError(format!(
            "--name {name:?}: not a DNS-1123 label (at most 63 lower-case letters, digits and \
             '-', starting and ending with a letter or digit); it names the Secret"
        ))
        .into());
    }
    let (client, kubeconfig_server) = connect(&args).await?;
    let server = args.server.clone().unwrap_or(kubeconfig_server);
    let name = match &args.name {
        Some(name) => name.clone(),
        None => cluster_uid(&client).await?,
    };
    let token_secret = token_secret(&client, &args).await?;
    let (ca, token) = wait_for_token(&client, &args, token_secret).await?;
    let kubeconfig = kubeconfig(&Reach {
        cluster: &name,
        server: &server,
        tls_server_name: args.tls_server_name.as_deref(),
        ca: &ca,
        token: &token,
    });
    let kubeconfig = serde_saphyr::to_string(&kubeconfig).map_err(RemoteSecretError::Yaml)?;
    let secret = remote_secret(&name, &args.namespace, &kubeconfig);
    out(&render(&secret)?)?;
    if args.server.is_none() && is_loopback(&server) {
        eprintln!(
            "warning: the kubeconfig's server is {server}, which a PCP in another cluster \
             cannot reach: pass --server with an address it can"
        );
    }
    Ok(())
}

/// A client of the remote cluster, and its API server's address, from the kubeconfig.
async fn connect(args: &CreateRemoteSecretArgs) -> Result<(Client, String), RemoteSecretError> {
    let flag = match &args.kubeconfig {
        Some(path) => format!("--kubeconfig {}", path.display()),
        None => "--kubeconfig ($KUBECONFIG, else ~/.kube/config)".to_string(),
    };
    let failed = |flag: &str, message: String| RemoteSecretError::Kubeconfig {
        flag: flag.to_string(),
        message,
    };
    let file = match &args.kubeconfig {
        Some(path) => Kubeconfig::read_from(path),
        None => Kubeconfig::read(),
    }
    .map_err(|e| match e {
        // kube's own wording quotes the path twice over; the OS error is what tells.
        KubeconfigError::ReadConfig(io, _) => failed(&flag, format!("cannot read it: {io}")),
        other => failed(&flag, causes(&other)),
    })?;
    let context = args
        .context
        .clone()
        .or_else(|| file.current_context.clone());
    if let Some(context) = &args.context
        && !file.contexts.iter().any(|c| c.name == *context)
    {
        let known: Vec<&str> = file.contexts.iter().map(|c| c.name.as_str()).collect();
        return Err(RemoteSecretError::Kubeconfig {
            flag: format!("--context {context}"),
            message: format!("no such context in the kubeconfig (it has {known:?})"),
        });
    }
    let options = KubeConfigOptions {
        context,
        ..Default::default()
    };
    let mut config = Config::from_custom_kubeconfig(file, &options)
        .await
        .map_err(|e| failed(&flag, causes(&e)))?;
    config.connect_timeout = Some(REQUEST_TIMEOUT);
    config.read_timeout = Some(REQUEST_TIMEOUT);
    let server = server_address(&config.cluster_url);
    let client = Client::try_from(config).map_err(|e| failed(&flag, causes(&e)))?;
    Ok((client, server))
}

/// The API server's URL as a kubeconfig writes it: without the `/` an empty path reads as.
fn server_address(url: &http::Uri) -> String {
    let text = url.to_string();
    match text.strip_suffix('/') {
        Some(bare) if url.path() == "/" => bare.to_string(),
        _ => text,
    }
}

/// Whether a server address is one only the machine itself reaches.
fn is_loopback(server: &str) -> bool {
    server.contains("127.0.0.1") || server.contains("localhost") || server.contains("[::1]")
}

/// The name istioctl gives a cluster not named: its kube-system namespace's UID.
async fn cluster_uid(client: &Client) -> Result<String, RemoteSecretError> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let kube_system = namespaces
        .get("kube-system")
        .await
        .map_err(|e| RemoteSecretError::ClusterUid(Problem::of(&e)))?;
    kube_system.metadata.uid.ok_or_else(|| {
        RemoteSecretError::ClusterUid(Problem {
            reason: pasa_kube::problem::Reason::Error,
            message: "the namespace has no metadata.uid".into(),
        })
    })
}

/// Whether `secret` is a token of the ServiceAccount `account`.
fn is_token_of(secret: &Secret, account: &str) -> bool {
    secret.type_.as_deref() == Some(TOKEN_TYPE)
        && secret
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ACCOUNT_ANNOTATION))
            .is_some_and(|a| a == account)
}

/// The account's token Secret: `--secret-name`'s, else the first of the namespace's, else one
/// created with the rest of the reader's objects.
async fn token_secret(
    client: &Client,
    args: &CreateRemoteSecretArgs,
) -> Result<Secret, RemoteSecretError> {
    let namespace = &args.namespace;
    let account = &args.service_account;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    if let Some(name) = &args.secret_name {
        let secret = secrets
            .get(name)
            .await
            .map_err(|e| RemoteSecretError::NamedSecret {
                namespace: namespace.clone(),
                name: name.clone(),
                problem: Problem::of(&e),
            })?;
        if !is_token_of(&secret, account) {
            return Err(RemoteSecretError::NotATokenOfTheAccount {
                namespace: namespace.clone(),
                name: name.clone(),
                account: account.clone(),
            });
        }
        return Ok(secret);
    }
    let listed =
        secrets
            .list(&ListParams::default())
            .await
            .map_err(|e| RemoteSecretError::ListSecrets {
                namespace: namespace.clone(),
                account: account.clone(),
                problem: Problem::of(&e),
            })?;
    if let Some(found) = listed.items.into_iter().find(|s| is_token_of(s, account)) {
        return Ok(found);
    }
    if !args.create_service_account {
        return Err(RemoteSecretError::NoToken {
            namespace: namespace.clone(),
            account: account.clone(),
        });
    }
    reader::create_reader(client, namespace, account).await
}

/// The CA and the token of `secret`, read again (every [`TOKEN_POLL_EVERY`], [`TOKEN_POLLS`]
/// times) until Kubernetes' token controller has filled them in.
async fn wait_for_token(
    client: &Client,
    args: &CreateRemoteSecretArgs,
    mut secret: Secret,
) -> Result<(Vec<u8>, Vec<u8>), RemoteSecretError> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &args.namespace);
    let mut polls = 0;
    loop {
        let data = secret.data.unwrap_or_default();
        let value = |key: &str| data.get(key).map(|v| v.0.clone()).filter(|v| !v.is_empty());
        let missing = match (value("ca.crt"), value("token")) {
            (Some(ca), Some(token)) => return Ok((ca, token)),
            (None, _) => "ca.crt",
            (_, None) => "token",
        };
        if polls == TOKEN_POLLS {
            return Err(RemoteSecretError::TokenMissing {
                namespace: args.namespace.clone(),
                name,
                account: args.service_account.clone(),
                key: missing,
                waited: TOKEN_POLL_EVERY * TOKEN_POLLS,
            });
        }
        polls += 1;
        tokio::time::sleep(TOKEN_POLL_EVERY).await;
        secret = secrets
            .get(&name)
            .await
            .map_err(|e| RemoteSecretError::TokenRead {
                namespace: args.namespace.clone(),
                name: name.clone(),
                problem: Problem::of(&e),
            })?;
    }
}

/// What the kubeconfig of a remote secret says.
pub struct Reach<'a> {
    /// The cluster's name: of the kubeconfig's only cluster, user and context.
    pub cluster: &'a str,
    pub server: &'a str,
    pub tls_server_name: Option<&'a str>,
    /// The cluster's CA certificates (PEM).
    pub ca: &'a [u8],
    pub token: &'a [u8],
}

/// A kubeconfig that reaches the cluster with the token, its cluster, user and context all
/// named after the cluster.
pub fn kubeconfig(reach: &Reach<'_>) -> Value {
    let name = reach.cluster;
    let mut cluster = json!({
        "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(reach.ca),
        "server": reach.server,
    });
    if let Some(tls_server_name) = reach.tls_server_name {
        cluster["tls-server-name"] = json!(tls_server_name);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
        "preferences": {},
        "users": [{"name": name, "user": {"token": String::from_utf8_lossy(reach.token)}}],
    })
}

/// The remote secret of cluster `name`, in `namespace`, holding `kubeconfig` (as text, which
/// the API server stores as data).
pub fn remote_secret(name: &str, namespace: &str, kubeconfig: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": format!("{SECRET_PREFIX}{name}"),
            "namespace": namespace,
            "labels": {MULTICLUSTER_LABEL: "true"},
            "annotations": {CLUSTER_ANNOTATION: name},
        },
        "stringData": {name: kubeconfig},
    })
}

/// The secret as written on stdout: one YAML document, said to be generated.
pub fn render(secret: &Value) -> Result<String, RemoteSecretError> {
    let yaml = serde_saphyr::to_string(secret).map_err(RemoteSecretError::Yaml)?;
    Ok(format!(
        "# Written by pasactl x create-remote-secret: it grants reading the cluster it names. \
         Apply it where PCP runs.\n{yaml}---\n"
    ))
}

/// A DNS-1123 label: what a cluster's name must be to name a Secret and a kubeconfig entry.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

#[cfg(test)]
mod tests {
    use super::*;

    /// istioctl's flags parse; `--server` here is the remote API server's, not the store's.
    #[test]
    fn the_flags_parse_as_istioctls() {
        use clap::Parser;
        let parse = |args: &[&str]| {
            let words = ["pasactl", "x", "create-remote-secret"].iter().chain(args);
            match crate::cli::Cli::try_parse_from(words).map(|cli| cli.command) {
                Ok(crate::cli::Command::X(crate::cli::x::XCommand::CreateRemoteSecret(c))) => c.0,
                other => panic!("{args:?}: {other:?}"),
            }
        };
        let defaults = parse(&[]);
        assert_eq!(
            (
                defaults.namespace.as_str(),
                defaults.service_account.as_str()
            ),
            ("istio-system", "istio-reader-service-account")
        );
        assert!(defaults.create_service_account && defaults.server.is_none());
        let given = parse(&[
            "--server",
            "https://east.example:6443",
            "--create-service-account=false",
            "-n",
            "mesh",
            "--name",
            "east",
        ]);
        assert_eq!(given.server.as_deref(), Some("https://east.example:6443"));
        assert!(!given.create_service_account);
        assert_eq!(
            (given.namespace.as_str(), given.name.as_deref()),
            ("mesh", Some("east"))
        );
        assert!(parse(&["--create-service-account"]).create_service_account);
        // The store's address is not taken for the API server's.
        let store = crate::cli::Cli::try_parse_from([
            "pasactl",
            "--server",
            "127.0.0.1:7401",
            "x",
            "create-remote-secret",
        ]);
        assert!(matches!(store.map(|c| c.server), Ok(s) if s == "127.0.0.1:7401"));
    }

    #[test]
    fn cluster_names_are_dns_labels() {
        for good in ["east", "c0", "a-b", "0"] {
            assert!(is_dns_label(good), "{good}");
        }
        for bad in ["", "East", "-a", "a-", "a.b", "a_b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
    }

    #[test]
    fn the_secret_holds_a_kubeconfig_named_after_the_cluster() {
        let config = kubeconfig(&Reach {
            cluster: "east",
            server: "https://east.example:6443",
            tls_server_name: Some("kubernetes.default"),
            ca: b"PEM",
            token: b"t0ken",
        });
        assert_eq!(
            config["clusters"][0],
            json!({"name": "east", "cluster": {"certificate-authority-data": "UEVN",
                "server": "https://east.example:6443", "tls-server-name": "kubernetes.default"}})
        );
        assert_eq!(config["users"][0]["user"]["token"], "t0ken");
        assert_eq!(config["current-context"], "east");
        assert_eq!(
            config["contexts"][0]["context"],
            json!({"cluster": "east", "user": "east"})
        );
        let text = render(&remote_secret("east", "istio-system", "kind: Config\n")).unwrap();
        assert!(
            text.starts_with("# ") && text.ends_with("\n---\n"),
            "{text}"
        );
        // A document, then the separator: the output of several runs is a valid stream.
        let docs: Vec<Value> = serde_saphyr::from_str_multiple(&text).unwrap();
        assert_eq!(docs.len(), 1, "{text}");
        let read = &docs[0];
        assert_eq!(read["metadata"]["name"], "istio-remote-secret-east");
        assert_eq!(read["metadata"]["labels"]["istio/multiCluster"], "true");
        assert_eq!(
            read["metadata"]["annotations"]["networking.istio.io/cluster"],
            "east"
        );
        assert_eq!(read["stringData"]["east"], "kind: Config\n");
    }

    #[test]
    fn server_addresses_are_written_as_a_kubeconfig_has_them() {
        let uri = |s: &str| s.parse::<http::Uri>().unwrap();
        assert_eq!(
            server_address(&uri("https://10.0.0.1:6443")),
            "https://10.0.0.1:6443"
        );
        assert_eq!(
            server_address(&uri("https://h.example/k8s/clusters/c-1")),
            "https://h.example/k8s/clusters/c-1"
        );
        assert!(is_loopback("https://127.0.0.1:6443") && !is_loopback("https://10.0.0.1"));
    }
}
