//! TLS credentials served over SDS, read from Kubernetes Secrets mounted as volumes.
//!
//! Gateways (`Gateway` servers with `credentialName`) and `DestinationRule`s name their TLS
//! credentials `kubernetes://<credentialName>`, and for mutual TLS the CA
//! `kubernetes://<credentialName>-cacert`, with ADS as config source. istiod reads those from
//! Kubernetes Secrets; the agent has no access to Secrets (and the store holds no private keys),
//! so the pod mounts the Secrets it serves under one directory (`--credential-dir`), one
//! subdirectory per Secret, laid out as Kubernetes lays out a Secret volume:
//!
//! - `tls.crt` + `tls.key` (a `kubernetes.io/tls` Secret), or Istio's generic keys `cert` + `key`
//!   (preferred when both are there);
//! - optionally `ca.crt`, or Istio's generic `cacert` (preferred).
//!
//! **Names, as istiod serves them.** `DIR/<name>/` with a key pair is served as
//! `kubernetes://<name>`: a `tls_certificate` with the chain and the key inline. With a CA it is
//! also served as `kubernetes://<name>-cacert`: a `validation_context` with the CA inline. A
//! separate `DIR/<name>-cacert/` Secret holding a CA takes precedence for that name (istiod looks
//! for the `-cacert` Secret first, then falls back to the main one). A name ending in `-cacert`
//! is only ever a CA.
//!
//! **Reload.** The directory is read afresh every `--credential-poll` (Kubernetes updates a
//! mounted Secret by swapping the `..data` symlink, so reading the files again sees the new
//! content); a new version of a secret is published only when its content changed. So are the
//! pod's files that DestinationRules name (`file-cert:`, `file-root:`, see [`file_secret`]),
//! once Envoy has asked for them.
//!
//! **Bad input.** A credential that cannot be read or is incomplete is reported with its path and
//! not served; the others keep being served. When the directory itself cannot be read, the
//! secrets last read keep being served.
//!
//! **The workload's own certificate**, `default` and `ROOTCA`, served beside the credentials:
//! from mounted files (`--cert-dir`, [`workload`]), read and re-read the same way, or by CSR to
//! Istio's CA (`--ca-address`, [`ca`]), renewed before it expires.

pub mod ca;
pub mod workload;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source::Specifier};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, Secret, TlsCertificate, secret,
};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use tokio::sync::watch;

use crate::ads::SnapshotPublisher;
use crate::model::secrets::{CA_SUFFIX, KUBERNETES_PREFIX};
use crate::resource::TypeKind;

/// What stands in for a private key in anything shown to a person.
pub const REDACTED: &str = "[redacted]";

/// `--credential-dir` and `--credential-poll`.
#[derive(clap::Args, Debug, Clone)]
pub struct CredentialArgs {
    /// A directory of mounted Kubernetes Secrets, one subdirectory per Secret (`tls.crt`,
    /// `tls.key`, optional `ca.crt`; or `cert`, `key`, `cacert`), served over SDS as
    /// `kubernetes://<subdirectory>` (and `kubernetes://<subdirectory>-cacert` for the CA). No
    /// credentials are served when not set.
    #[arg(long, env = "PASA_CREDENTIAL_DIR")]
    pub credential_dir: Option<PathBuf>,
    /// The workload certificate's directory, with Istio's file names (`cert-chain.pem`,
    /// `key.pem`, `root-cert.pem`, as istio-csr or SPIRE mount them): served over SDS as
    /// `default` and `ROOTCA`, on the agent's socket (point Envoy's `sds-grpc` at it), re-read
    /// on rotation. Without it they are left to the istio-agent's SDS.
    #[arg(long, env = "PASA_CERT_DIR")]
    pub cert_dir: Option<PathBuf>,
    /// How often the credential and certificate directories are read again for changes.
    #[arg(long, env = "PASA_CREDENTIAL_POLL", default_value = "5s", value_parser = pasa_proto::duration::parse)]
    pub credential_poll: Duration,
    #[command(flatten)]
    pub ca: ca::CaArgs,
    /// CA certificate (PEM) the store's (or PCP's) certificate must chain to: the agent then
    /// reaches --server over mutual TLS, presenting its workload certificate (--cert-dir, or
    /// the one Istio's CA issued), whose identity decides what the store lets it read.
    #[arg(long, env = "PASA_STORE_CA")]
    pub store_ca: Option<PathBuf>,
}

impl CredentialArgs {
    /// The TLS towards the store when --store-ca is given: the workload certificate of
    /// --cert-dir (read at each connection, so a rotated one is used), or else the latest one
    /// `issued` by Istio's CA. Without a workload certificate, --store-ca is an error.
    pub fn store_tls(
        &self,
        issued: Option<tokio::sync::watch::Receiver<BTreeMap<String, Secret>>>,
    ) -> anyhow::Result<Option<pasa_proto::client::ClientTls>> {
        let Some(store_ca) = &self.store_ca else {
            return Ok(None);
        };
        if let Some(dir) = &self.cert_dir {
            return pasa_proto::client::ClientTls::from_files(
                store_ca,
                &dir.join(workload::CERT_CHAIN),
                &dir.join(workload::KEY),
            )
            .map(Some)
            .map_err(|e| anyhow::anyhow!("--store-ca with --cert-dir: {e}"));
        }
        let Some(issued) = issued else {
            anyhow::bail!(
                "--store-ca needs the workload certificate to present: give --cert-dir or \
                 --ca-address"
            );
        };
        let ca = pasa_proto::client::read_pem(store_ca)
            .map_err(|e| anyhow::anyhow!("--store-ca: {e}"))?;
        Ok(Some(pasa_proto::client::ClientTls::new(
            ca,
            Arc::new(move || {
                let secrets = issued.borrow();
                let tls = secrets
                    .get(crate::model::secrets::WORKLOAD_CERTIFICATE)
                    .and_then(|secret| match &secret.r#type {
                        Some(secret::Type::TlsCertificate(tls)) => Some(tls),
                        _ => None,
                    })
                    .ok_or("no workload certificate from Istio's CA yet")?;
                let bytes = |source: &Option<DataSource>| match source
                    .as_ref()
                    .and_then(|s| s.specifier.as_ref())
                {
                    Some(Specifier::InlineBytes(bytes)) => Some(bytes.clone()),
                    _ => None,
                };
                bytes(&tls.certificate_chain)
                    .zip(bytes(&tls.private_key))
                    .ok_or_else(|| "the workload certificate is not inline".to_string())
            }),
        )))
    }

    /// Whether the agent serves the workload certificate itself (from files or from the CA), so
    /// that Envoy's `sds-grpc` points at the agent's socket.
    pub fn serves_workload_certificate(&self) -> bool {
        self.cert_dir.is_some() || self.ca.ca_address.is_some()
    }
}

/// Why a credential (or the whole directory) is not served.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error(
        "cannot read the credential directory {path}: {source} (is --credential-dir where the Secrets are mounted?)"
    )]
    ReadDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read {path}: {source}; credential {name:?} is not served")]
    Read {
        name: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is empty; credential {name:?} is not served")]
    EmptyFile { name: String, path: PathBuf },
    #[error(
        "{path} is missing (the Secret has {present} but not {missing}); credential {name:?} is not served"
    )]
    Incomplete {
        name: String,
        path: PathBuf,
        present: &'static str,
        missing: &'static str,
    },
    #[error(
        "{path} holds none of tls.crt + tls.key, cert + key, ca.crt or cacert; credential {name:?} is not served"
    )]
    Nothing { name: String, path: PathBuf },
    #[error("no system root certificates on this host; secret {name:?} is not served")]
    NoSystemRoots { name: String },
}

/// What one read of the credential directory found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// SDS resource name → secret.
    pub secrets: BTreeMap<String, Secret>,
    /// The credentials not served, and why.
    pub problems: Vec<CredentialError>,
}

/// One mounted Secret's contents.
#[derive(Debug, Default, PartialEq)]
struct Credential {
    /// Certificate chain and private key.
    key_pair: Option<(Vec<u8>, Vec<u8>)>,
    ca: Option<Vec<u8>>,
}

/// The key pairs a Secret may hold, in the order they are looked for.
const KEY_PAIRS: [(&str, &str); 2] = [("cert", "key"), ("tls.crt", "tls.key")];

/// The CA keys a Secret may hold, in the order they are looked for.
const CA_KEYS: [&str; 2] = ["cacert", "ca.crt"];

/// Reads every credential under `dir`.
pub fn load(dir: &Path) -> Result<Loaded, CredentialError> {
    let read_dir = |source| CredentialError::ReadDir {
        path: dir.to_owned(),
        source,
    };
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(dir).map_err(read_dir)? {
        let entry = entry.map_err(read_dir)?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        // `..data` and friends when the directory is itself a mount; anything hidden.
        if name.starts_with('.') {
            continue;
        }
        // Follows symlinks, as a projected volume's entries are.
        if std::fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
            names.insert(name);
        }
    }

    let mut loaded = Loaded::default();
    let mut own_ca = BTreeMap::new();
    let mut fallback_ca = BTreeMap::new();
    for name in names {
        let credential = match read_credential(&name, &dir.join(&name)) {
            Ok(credential) => credential,
            Err(problem) => {
                loaded.problems.push(problem);
                continue;
            }
        };
        let is_ca_only = name.ends_with(CA_SUFFIX);
        if let Some((chain, key)) = credential.key_pair
            && !is_ca_only
        {
            let resource = format!("{KUBERNETES_PREFIX}{name}");
            loaded
                .secrets
                .insert(resource.clone(), tls_secret(resource, chain, key));
        }
        if let Some(ca) = credential.ca {
            if is_ca_only {
                own_ca.insert(format!("{KUBERNETES_PREFIX}{name}"), ca.clone());
            }
            fallback_ca.insert(format!("{KUBERNETES_PREFIX}{name}{CA_SUFFIX}"), ca);
        }
    }
    // A `<name>-cacert` Secret wins over the CA inside `<name>`.
    fallback_ca.extend(own_ca);
    for (resource, ca) in fallback_ca {
        loaded
            .secrets
            .insert(resource.clone(), ca_secret(resource, ca));
    }
    Ok(loaded)
}

/// `dir/file` of credential `name`: `None` when absent; an empty or unreadable file is an error.
fn read_file(name: &str, dir: &Path, file: &str) -> Result<Option<Vec<u8>>, CredentialError> {
    let path = dir.join(file);
    match std::fs::read(&path) {
        Ok(bytes) if bytes.is_empty() => Err(CredentialError::EmptyFile {
            name: name.to_owned(),
            path,
        }),
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CredentialError::Read {
            name: name.to_owned(),
            path,
            source,
        }),
    }
}

fn read_credential(name: &str, dir: &Path) -> Result<Credential, CredentialError> {
    let read = |file: &str| read_file(name, dir, file);
    let mut credential = Credential::default();
    for (cert_file, key_file) in KEY_PAIRS {
        match (read(cert_file)?, read(key_file)?) {
            (Some(chain), Some(key)) => {
                credential.key_pair = Some((chain, key));
                break;
            }
            (None, None) => {}
            (Some(_), None) => {
                return Err(CredentialError::Incomplete {
                    name: name.to_owned(),
                    path: dir.join(key_file),
                    present: cert_file,
                    missing: key_file,
                });
            }
            (None, Some(_)) => {
                return Err(CredentialError::Incomplete {
                    name: name.to_owned(),
                    path: dir.join(cert_file),
                    present: key_file,
                    missing: cert_file,
                });
            }
        }
    }
    for ca_file in CA_KEYS {
        if let Some(ca) = read(ca_file)? {
            credential.ca = Some(ca);
            break;
        }
    }
    if credential == Credential::default() {
        return Err(CredentialError::Nothing {
            name: name.to_owned(),
            path: dir.to_owned(),
        });
    }
    Ok(credential)
}

fn inline(bytes: Vec<u8>) -> Option<DataSource> {
    Some(DataSource {
        specifier: Some(Specifier::InlineBytes(bytes)),
        ..Default::default()
    })
}

fn tls_secret(name: String, chain: Vec<u8>, key: Vec<u8>) -> Secret {
    Secret {
        name,
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: inline(chain),
            private_key: inline(key),
            ..Default::default()
        })),
    }
}

fn ca_secret(name: String, ca: Vec<u8>) -> Secret {
    Secret {
        name,
        r#type: Some(secret::Type::ValidationContext(
            CertificateValidationContext {
                trusted_ca: inline(ca),
                ..Default::default()
            },
        )),
    }
}

/// Where the system's root certificates are, by distribution (pilot-agent's list): `file-root:
/// system` serves the first that exists.
const SYSTEM_ROOT_BUNDLES: [&str; 6] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The names of the secrets of the pod's files that Envoy asked for (see [`file_secret`]): the
/// watch reads them again with the directories, so that a renewed file reaches Envoy.
pub type FileNames = Arc<std::sync::Mutex<BTreeSet<String>>>;

/// The SDS secret of certificates mounted in the pod, as istio-agent serves them to Envoy:
/// `file-cert:<certificate>~<key>` and `file-root:<ca>` (`file-root:system`: the system's
/// roots). `Ok(None)` when `name` is not such a name; an error when a file cannot be read (Envoy
/// then waits for the secret, as a TLS context without its certificates cannot work). Asked
/// for by name, it is read at once; then the [`CredentialWatch`] reads it again every poll and
/// publishes it as it changes.
pub fn file_secret(name: &str) -> Result<Option<Secret>, CredentialError> {
    use crate::model::secrets::{FILE_CERT_PREFIX, FILE_ROOT_PREFIX, SYSTEM_ROOTS};
    let read = |path: &str| {
        std::fs::read(path).map_err(|source| CredentialError::Read {
            name: name.to_string(),
            path: path.into(),
            source,
        })
    };
    if let Some(ca) = name.strip_prefix(FILE_ROOT_PREFIX) {
        let path = if ca == SYSTEM_ROOTS {
            let found = SYSTEM_ROOT_BUNDLES.iter().find(|p| Path::new(p).is_file());
            *found.ok_or_else(|| CredentialError::NoSystemRoots {
                name: name.to_string(),
            })?
        } else {
            ca
        };
        return Ok(Some(ca_secret(name.to_string(), read(path)?)));
    }
    let Some((certificate, key)) = name
        .strip_prefix(FILE_CERT_PREFIX)
        .and_then(|rest| rest.split_once('~'))
    else {
        return Ok(None);
    };
    Ok(Some(tls_secret(
        name.to_string(),
        read(certificate)?,
        read(key)?,
    )))
}

/// A packed SDS secret fit to show: its private key replaced by [`REDACTED`] (as Envoy's own
/// config dump does). A body that does not decode as a secret shows nothing of itself.
pub fn redacted(body: &Any) -> Any {
    let value = match Secret::decode(body.value.as_slice()) {
        Ok(mut secret) => {
            if let Some(secret::Type::TlsCertificate(tls)) = &mut secret.r#type {
                if tls.private_key.is_some() {
                    tls.private_key = Some(DataSource {
                        specifier: Some(Specifier::InlineString(REDACTED.into())),
                        ..Default::default()
                    });
                }
                tls.password = None;
            }
            secret.encode_to_vec()
        }
        Err(_) => Vec::new(),
    };
    Any {
        type_url: TypeKind::Secret.type_url().to_owned(),
        value,
    }
}

/// The directories secrets are read from.
#[derive(Debug, Clone)]
struct Dirs {
    credentials: Option<PathBuf>,
    workload: Option<PathBuf>,
    /// The pod's namespace: its Secrets are also served under the names Gateway API listeners
    /// give them.
    namespace: String,
    /// The secrets of the pod's files asked for.
    files: FileNames,
}

/// Each `kubernetes://<name>` secret (and its CA) also as `kubernetes-gateway://<ns>/<name>`:
/// a pod mounts Secrets of its own namespace only.
fn gateway_api_names(secrets: &mut BTreeMap<String, Secret>, namespace: &str) {
    let aliases: Vec<(String, Secret)> = secrets
        .iter()
        .filter_map(|(resource, secret)| {
            let name = resource.strip_prefix(KUBERNETES_PREFIX)?;
            let alias = format!(
                "{}{namespace}/{name}",
                pasa_istio::generated::GATEWAY_SECRET_PREFIX
            );
            let mut secret = secret.clone();
            secret.name = alias.clone();
            Some((alias, secret))
        })
        .collect();
    secrets.extend(aliases);
}

impl Dirs {
    /// Both directories' secrets, with the problems of each. An unreadable credential
    /// directory fails the whole read (the secrets last read keep being served); a workload
    /// certificate that cannot be read is a problem and is left out.
    fn load(&self) -> Result<Loaded, CredentialError> {
        let mut loaded = match &self.credentials {
            Some(dir) => load(dir)?,
            None => Loaded::default(),
        };
        gateway_api_names(&mut loaded.secrets, &self.namespace);
        if let Some(dir) = &self.workload {
            match workload::load(dir) {
                Ok(secrets) => loaded.secrets.extend(secrets),
                Err(problem) => loaded.problems.push(problem),
            }
        }
        let names: Vec<String> = match self.files.lock() {
            Ok(names) => names.iter().cloned().collect(),
            Err(_) => Vec::new(),
        };
        for name in names {
            match file_secret(&name) {
                Ok(Some(secret)) => {
                    loaded.secrets.insert(name, secret);
                }
                Ok(None) => {}
                Err(problem) => loaded.problems.push(problem),
            }
        }
        Ok(loaded)
    }
}

/// Keeps the published secrets in step with the credential and certificate directories, and
/// with the certificates the CA issued.
pub struct CredentialWatch {
    dirs: Dirs,
    /// The workload certificate from the CA ([`ca::renew`]), when it is the source.
    issued: Option<watch::Receiver<BTreeMap<String, Secret>>>,
    poll: Duration,
    publisher: Arc<SnapshotPublisher>,
    /// The problems already logged, so each is logged once while it lasts.
    reported: BTreeSet<String>,
}

impl CredentialWatch {
    /// Watches `args.credential_dir` and `args.cert_dir`, if set, the CA's certificates
    /// (`issued`), and the pod's files whose secrets Envoy asked for (`files`), publishing to
    /// `publisher`.
    pub fn new(
        args: &CredentialArgs,
        namespace: &str,
        issued: Option<watch::Receiver<BTreeMap<String, Secret>>>,
        files: FileNames,
        publisher: Arc<SnapshotPublisher>,
    ) -> Option<Self> {
        let dirs = Dirs {
            credentials: args.credential_dir.clone(),
            workload: args.cert_dir.clone(),
            namespace: namespace.to_string(),
            files,
        };
        if dirs.credentials.is_none() && dirs.workload.is_none() && issued.is_none() {
            return None;
        }
        Some(CredentialWatch {
            dirs,
            issued,
            poll: args.credential_poll.max(Duration::from_millis(10)),
            publisher,
            reported: BTreeSet::new(),
        })
    }

    /// Reads the directory now and publishes what it holds (at start, before any client is
    /// served, so the first snapshots carry the secrets).
    pub fn refresh(&mut self) {
        let loaded = self.dirs.load();
        self.apply(loaded);
    }

    /// Reads the directory every poll interval, and publishes each certificate the CA issues,
    /// until `stop` turns true (the first read is [`CredentialWatch::refresh`]'s, at start).
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut ticks =
            tokio::time::interval_at(tokio::time::Instant::now() + self.poll, self.poll);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut issued = self.issued.clone();
        loop {
            let new_certificate = async {
                match &mut issued {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                _ = ticks.tick() => {}
                open = new_certificate => {
                    if !open {
                        // The CA client stopped: the certificate in hand stays served.
                        issued = None;
                    }
                }
            }
            let dirs = self.dirs.clone();
            match tokio::task::spawn_blocking(move || dirs.load()).await {
                Ok(loaded) => self.apply(loaded),
                Err(e) => tracing::warn!(error = %e, "reading the credential directory failed"),
            }
        }
    }

    fn apply(&mut self, loaded: Result<Loaded, CredentialError>) {
        let (loaded, problems) = match loaded {
            Ok(mut loaded) => {
                let problems = std::mem::take(&mut loaded.problems);
                (Some(loaded), problems)
            }
            Err(problem) => (None, vec![problem]),
        };
        let messages: BTreeSet<String> = problems.iter().map(ToString::to_string).collect();
        for message in messages.difference(&self.reported) {
            tracing::warn!(error = %message, "credential not served");
        }
        self.reported = messages;
        if let Some(mut loaded) = loaded {
            if let Some(issued) = &self.issued {
                loaded
                    .secrets
                    .extend(issued.borrow().iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            tracing::debug!(secrets = loaded.secrets.len(), "credentials read");
            self.publisher.publish_secrets(&loaded.secrets);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, files: &[(&str, &str)]) {
        let path = dir.join(name);
        std::fs::create_dir_all(&path).unwrap();
        for (file, content) in files {
            std::fs::write(path.join(file), content).unwrap();
        }
    }

    fn inline_bytes(source: &Option<DataSource>) -> &[u8] {
        match source.as_ref().and_then(|s| s.specifier.as_ref()) {
            Some(Specifier::InlineBytes(bytes)) => bytes,
            other => panic!("not inline bytes: {other:?}"),
        }
    }

    fn tls(secret: &Secret) -> &TlsCertificate {
        match &secret.r#type {
            Some(secret::Type::TlsCertificate(tls)) => tls,
            other => panic!("not a TLS certificate: {other:?}"),
        }
    }

    fn trusted_ca(secret: &Secret) -> &[u8] {
        match &secret.r#type {
            Some(secret::Type::ValidationContext(v)) => inline_bytes(&v.trusted_ca),
            other => panic!("not a validation context: {other:?}"),
        }
    }

    #[test]
    fn a_tls_secret_serves_its_pair_and_its_ca_as_istiod_names_them() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "web-cert",
            &[("tls.crt", "CHAIN"), ("tls.key", "KEY"), ("ca.crt", "CA")],
        );
        // Istio's generic keys win over the kubernetes.io/tls ones.
        write(
            dir.path(),
            "generic",
            &[
                ("cert", "G-CHAIN"),
                ("key", "G-KEY"),
                ("tls.crt", "T"),
                ("tls.key", "T"),
            ],
        );
        let loaded = load(dir.path()).unwrap();
        assert!(loaded.problems.is_empty(), "{:?}", loaded.problems);
        let names: Vec<&str> = loaded.secrets.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "kubernetes://generic",
                "kubernetes://web-cert",
                "kubernetes://web-cert-cacert"
            ]
        );
        let web = &loaded.secrets["kubernetes://web-cert"];
        assert_eq!(web.name, "kubernetes://web-cert");
        assert_eq!(inline_bytes(&tls(web).certificate_chain), b"CHAIN");
        assert_eq!(inline_bytes(&tls(web).private_key), b"KEY");
        assert_eq!(
            trusted_ca(&loaded.secrets["kubernetes://web-cert-cacert"]),
            b"CA"
        );
        let generic = tls(&loaded.secrets["kubernetes://generic"]);
        assert_eq!(inline_bytes(&generic.certificate_chain), b"G-CHAIN");
    }

    #[test]
    fn gateway_api_listeners_name_the_pods_secrets_with_their_namespace() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "shop-cert",
            &[("tls.crt", "CHAIN"), ("tls.key", "KEY"), ("ca.crt", "CA")],
        );
        let dirs = Dirs {
            credentials: Some(dir.path().to_owned()),
            workload: None,
            namespace: "shop".into(),
            files: FileNames::default(),
        };
        let loaded = dirs.load().unwrap();
        let alias = &loaded.secrets["kubernetes-gateway://shop/shop-cert"];
        assert_eq!(alias.name, "kubernetes-gateway://shop/shop-cert");
        assert_eq!(inline_bytes(&tls(alias).certificate_chain), b"CHAIN");
        assert_eq!(
            trusted_ca(&loaded.secrets["kubernetes-gateway://shop/shop-cert-cacert"]),
            b"CA"
        );
        assert!(loaded.secrets.contains_key("kubernetes://shop-cert"));
    }

    #[test]
    fn a_separate_cacert_secret_wins_and_is_only_a_ca() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "api",
            &[("tls.crt", "C"), ("tls.key", "K"), ("ca.crt", "INNER")],
        );
        write(
            dir.path(),
            "api-cacert",
            &[("cacert", "OWN"), ("tls.crt", "C"), ("tls.key", "K")],
        );
        let loaded = load(dir.path()).unwrap();
        assert_eq!(
            trusted_ca(&loaded.secrets["kubernetes://api-cacert"]),
            b"OWN"
        );
        assert!(matches!(
            loaded.secrets["kubernetes://api-cacert"].r#type,
            Some(secret::Type::ValidationContext(_))
        ));
    }

    #[test]
    fn a_bad_credential_is_reported_by_path_and_the_rest_are_served() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "good", &[("tls.crt", "C"), ("tls.key", "K")]);
        write(dir.path(), "no-key", &[("tls.crt", "C")]);
        write(
            dir.path(),
            "empty-key",
            &[("tls.crt", "C"), ("tls.key", "")],
        );
        write(dir.path(), "nothing", &[("README", "x")]);
        write(dir.path(), "..data", &[("tls.crt", "C"), ("tls.key", "K")]);
        std::fs::write(dir.path().join("stray-file"), "x").unwrap();
        let loaded = load(dir.path()).unwrap();
        let names: Vec<&str> = loaded.secrets.keys().map(String::as_str).collect();
        assert_eq!(names, ["kubernetes://good"]);
        let problems: Vec<String> = loaded.problems.iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 3, "{problems:?}");
        let no_key = dir.path().join("no-key").join("tls.key");
        assert!(
            problems
                .iter()
                .any(|p| p.contains(&no_key.display().to_string())),
            "{problems:?}"
        );
        let empty = dir.path().join("empty-key").join("tls.key");
        assert!(
            problems
                .iter()
                .any(|p| p.contains(&empty.display().to_string()) && p.contains("empty")),
            "{problems:?}"
        );
        let err = load(&dir.path().join("absent")).unwrap_err();
        assert!(err.to_string().contains("absent"), "{err}");
    }

    #[test]
    fn files_of_the_pod_are_served_as_istio_agent_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, body: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, body).unwrap();
            path.display().to_string()
        };
        let (cert, key, ca) = (
            file("c.pem", "CHAIN"),
            file("k.pem", "KEY"),
            file("ca.pem", "CA"),
        );
        let pair_name = format!("file-cert:{cert}~{key}");
        let pair = file_secret(&pair_name).unwrap().expect("a pair");
        assert_eq!(pair.name, pair_name);
        assert_eq!(inline_bytes(&tls(&pair).certificate_chain), b"CHAIN");
        assert_eq!(inline_bytes(&tls(&pair).private_key), b"KEY");
        let root = file_secret(&format!("file-root:{ca}"))
            .unwrap()
            .expect("a CA");
        assert_eq!(trusted_ca(&root), b"CA");
        // Not such a name, a file missing (named in the error), a pair without its key.
        assert!(file_secret("kubernetes://shop-cert").unwrap().is_none());
        let missing = format!("file-root:{ca}.missing");
        let e = file_secret(&missing).unwrap_err().to_string();
        assert!(e.contains("ca.pem.missing"), "{e}");
        assert!(file_secret(&format!("file-cert:{cert}")).unwrap().is_none());
        // The system's roots, where this host has them.
        if SYSTEM_ROOT_BUNDLES.iter().any(|p| Path::new(p).is_file()) {
            let system = file_secret("file-root:system").unwrap().unwrap();
            assert!(!trusted_ca(&system).is_empty());
        }
        // Once asked for, the files are read with the directories: a renewed file is served,
        // a missing one is a problem.
        let files = FileNames::default();
        files.lock().unwrap().extend([pair_name.clone(), missing]);
        let dirs = Dirs {
            credentials: None,
            workload: None,
            namespace: "shop".into(),
            files,
        };
        file("c.pem", "RENEWED");
        let loaded = dirs.load().unwrap();
        let pair = &loaded.secrets[&pair_name];
        assert_eq!(inline_bytes(&tls(pair).certificate_chain), b"RENEWED");
        assert_eq!(loaded.problems.len(), 1, "{:?}", loaded.problems);
    }

    #[test]
    fn redaction_keeps_the_chain_and_hides_the_key() {
        let secret = tls_secret(
            "kubernetes://w".into(),
            b"CHAIN".to_vec(),
            b"SECRET-KEY".to_vec(),
        );
        let body = Any {
            type_url: TypeKind::Secret.type_url().into(),
            value: secret.encode_to_vec(),
        };
        let shown = Secret::decode(redacted(&body).value.as_slice()).unwrap();
        assert_eq!(shown.name, "kubernetes://w");
        assert_eq!(inline_bytes(&tls(&shown).certificate_chain), b"CHAIN");
        assert_eq!(
            tls(&shown).private_key.as_ref().unwrap().specifier,
            Some(Specifier::InlineString(REDACTED.into()))
        );
        assert!(!format!("{shown:?}").contains("SECRET-KEY"));
        let ca = ca_secret("kubernetes://w-cacert".into(), b"CA".to_vec());
        let body = Any {
            type_url: TypeKind::Secret.type_url().into(),
            value: ca.encode_to_vec(),
        };
        assert_eq!(
            Secret::decode(redacted(&body).value.as_slice()).unwrap(),
            ca
        );
    }
}
