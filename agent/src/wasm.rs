//! Where the Wasm modules of WasmPlugins and TrafficExtensions come from when they are not files
//! in the pod (`--wasm-fetcher`).
//!
//! Next to Istio's proxy (`pilot-agent`), the proxy's own pilot-agent fetches them, as it does
//! for istiod: the agent sends the module's URL as istiod does ([`PilotAgent`]). Without
//! pilot-agent, the agent fetches them itself ([`Fetcher`]), as pilot-agent would:
//!
//! - over HTTP or HTTPS: at most 256 MiB, a POSIX tar's first file or a gzip'd one unpacked,
//!   its SHA-256 checked against the extension's `sha256` when it gives one;
//! - from an OCI registry (`oci://`, or a reference without scheme): the image's manifest
//!   (anonymous bearer tokens as registries hand them out; HTTPS, then plain HTTP when the
//!   registry speaks no TLS), its digest checked against `sha256`, the module from Istio's
//!   image formats: a Docker or OCI image whose last layer (a gzip'd tar) holds `plugin.wasm`,
//!   or an OCI artifact with a Wasm layer. An extension's `imagePullSecret` signs in: the
//!   login its Docker config gives the registry's host (a user and password, sent as Basic
//!   credentials or to the registry's token service; or a registry token), as pilot-agent
//!   signs in with the secret istiod sends it. A pull secret the store does not hold fails the
//!   fetch, as pilot-agent's does.
//!
//! Modules are kept in `<cache dir>/wasm` named by their checksum (the module's, or the image's
//! digest), so that a module whose checksum is known is not fetched again (a restarted agent
//! serves it while its source is away). While a module is fetched its ECDS resource waits; a
//! fetch that fails makes the filter fail open or closed (as pilot-agent's does) and is tried
//! again after 30 seconds.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pasa_istio::digest::sha256_hex;
use pasa_runtime::fetch::FetchError;
use tokio::sync::watch;

use pasa_istio::extensions::{ImagePullSecret, RegistryLogin};

use crate::translate::extensions::{ModuleCode, ModuleSource, PullSecret};

/// The largest module fetched (pilot-agent's default).
const MAX_BYTES: usize = 256 << 20;
/// How long a fetch may take (istiod's timeout for a module).
const TIMEOUT: Duration = Duration::from_secs(30);
/// How long a failed fetch stands before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// Why a Wasm module was not fetched; each names the URL or the image.
#[derive(Debug, thiserror::Error)]
pub enum WasmError {
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error("{url}: {source}")]
    Unpack {
        url: String,
        #[source]
        source: UnpackError,
    },
    #[error("{url}: its SHA-256 is {digest}, the extension expects {expected}")]
    Checksum {
        url: String,
        digest: String,
        expected: String,
    },
    #[error("the module was not saved: {0}")]
    SaveTask(#[source] tokio::task::JoinError),
    #[error("{}: {source}", .path.display())]
    Save {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{image:?}: no repository")]
    NoRepository { image: String },
    /// The pull secret's Docker config does not say how to sign in (as the secret says).
    #[error("{image:?}: the pull secret's {problem}")]
    PullSecret { image: String, problem: String },
    #[error("{image}: the manifest's digest is sha256:{digest}")]
    ManifestDigest { image: String, digest: String },
    #[error("{image}: the manifest is not JSON: {source}")]
    ManifestJson {
        image: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{image}: its last layer: {source}")]
    Layer {
        image: String,
        #[source]
        source: UnpackError,
    },
    #[error("{image}: no plugin.wasm in its last layer")]
    NoPluginWasm { image: String },
    #[error("{image}: neither a Docker or OCI image with plugin.wasm nor a Wasm artifact")]
    NotWasmImage { image: String },
    #[error("{image}: blob {digest} does not match its digest")]
    BlobDigest { image: String, digest: String },
    #[error("GET {url}: {status} without a location")]
    NoLocation { url: String, status: u16 },
    #[error("GET {url}: 401 without a challenge")]
    NoChallenge { url: String },
    #[error("GET {url}: {status}: the registry refused the pull secret's login")]
    LoginRefused {
        url: String,
        status: axum::http::StatusCode,
    },
    #[error("GET {url}: {status}")]
    Status {
        url: String,
        status: axum::http::StatusCode,
    },
    #[error("GET {url}: too many redirects")]
    TooManyRedirects { url: String },
    #[error("{image}: the registry asks for a login and no pull secret gives one")]
    LoginNeeded { image: String },
    #[error("{image}: unsupported challenge {challenge:?}")]
    Challenge { image: String, challenge: String },
    #[error("{image}: a challenge without realm")]
    NoRealm { image: String },
    #[error("GET {url}{}: {status}", if *.login {
        " with the pull secret's login"
    } else {
        " (anonymously: a private image needs the extension's imagePullSecret)"
    })]
    TokenRefused {
        url: String,
        login: bool,
        status: axum::http::StatusCode,
    },
    #[error("{url}: not JSON: {source}")]
    TokenJson {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{url}: no token")]
    NoToken { url: String },
}

/// Why a fetched body or an image's layer holds no module.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("not a gzip stream: {0}")]
    Gzip(#[source] std::io::Error),
    #[error("tar entry {name:?}: no size")]
    TarSize { name: String },
    #[error("tar entry {name:?}: shorter than its size")]
    TarShort { name: String },
    #[error("an empty tar")]
    EmptyTar,
}

/// Modules fetched by pilot-agent: the agent sends their URLs.
#[derive(Debug, Default)]
pub struct PilotAgent;

impl ModuleSource for PilotAgent {
    fn module(&self, _url: &str, _sha256: &str, _secret: PullSecret<'_>) -> ModuleCode {
        ModuleCode::Remote
    }
}

/// Modules fetched by the agent.
#[derive(Debug)]
pub struct Fetcher {
    dir: PathBuf,
    client: pasa_runtime::fetch::Client,
    runtime: tokio::runtime::Handle,
    state: Mutex<HashMap<Wanted, State>>,
    /// Counts the fetches that ended: translation asks again when it moves.
    done: watch::Sender<u64>,
}

/// A module as asked for: its URL, its SHA-256 (lower case, or empty), and the Docker config
/// it is pulled with (empty for none): new credentials try a failed pull again.
type Wanted = (String, String, String);

#[derive(Debug, Clone)]
enum State {
    Fetching,
    Ready(String),
    Failed(String, Instant),
}

impl Fetcher {
    /// A fetcher keeping modules in `dir`, fetching on `runtime`.
    pub fn new(dir: PathBuf, runtime: tokio::runtime::Handle) -> Arc<Fetcher> {
        Arc::new(Fetcher {
            dir,
            client: pasa_runtime::fetch::client(),
            runtime,
            state: Mutex::default(),
            done: watch::channel(0).0,
        })
    }

    /// Moves whenever a fetch ends.
    pub fn done(&self) -> watch::Receiver<u64> {
        self.done.subscribe()
    }

    fn start(self: &Arc<Self>, wanted: Wanted) {
        let this = Arc::clone(self);
        self.runtime.spawn(async move {
            let (url, sha256, login) = &wanted;
            let secret = (!login.is_empty()).then(|| ImagePullSecret {
                docker_config_json: login.clone(),
            });
            let result = this.fetch(url, sha256, secret.as_ref()).await;
            let state = match result {
                Ok(path) => {
                    tracing::info!(%url, path, "Wasm module fetched");
                    State::Ready(path)
                }
                Err(e) => {
                    tracing::warn!(%url, "Wasm module not fetched: {e}");
                    State::Failed(e.to_string(), Instant::now())
                }
            };
            if let Ok(mut states) = this.state.lock() {
                states.insert(wanted, state);
            }
            this.done.send_modify(|n| *n += 1);
        });
    }

    async fn fetch(
        &self,
        url: &str,
        sha256: &str,
        secret: Option<&ImagePullSecret>,
    ) -> Result<String, WasmError> {
        let (module, digest) = if url.starts_with("http://") || url.starts_with("https://") {
            let body = pasa_runtime::fetch::get(&self.client, url, TIMEOUT, MAX_BYTES).await?;
            let module = unboxed(body).map_err(|source| WasmError::Unpack {
                url: url.to_string(),
                source,
            })?;
            let digest = sha256_hex(&module);
            (module, digest)
        } else {
            let reference = url.strip_prefix("oci://").unwrap_or(url);
            Registry::new(&self.client, reference, secret)?
                .pull()
                .await?
        };
        if !sha256.is_empty() && !digest.eq_ignore_ascii_case(sha256) {
            return Err(WasmError::Checksum {
                url: url.to_string(),
                digest,
                expected: sha256.to_string(),
            });
        }
        let path = self.dir.join(format!("{digest}.wasm"));
        let (dir, file) = (self.dir.clone(), path.clone());
        tokio::task::spawn_blocking(move || save(&dir, &file, &module))
            .await
            .map_err(WasmError::SaveTask)?
            .map_err(|source| WasmError::Save {
                path: path.clone(),
                source,
            })?;
        Ok(path.display().to_string())
    }
}

impl ModuleSource for Arc<Fetcher> {
    fn module(&self, url: &str, sha256: &str, secret: PullSecret<'_>) -> ModuleCode {
        if let Some(e) = secret.missing() {
            return ModuleCode::Failed(format!("{url}: {e}"));
        }
        let login = match secret {
            PullSecret::Found(s) => s.docker_config_json.clone(),
            _ => String::new(),
        };
        let key = (url.to_string(), sha256.to_lowercase(), login);
        let Ok(mut states) = self.state.lock() else {
            return ModuleCode::Failed("the module table is poisoned".into());
        };
        match states.get(&key) {
            Some(State::Ready(path)) => return ModuleCode::Local(path.clone()),
            Some(State::Fetching) => return ModuleCode::Pending,
            Some(State::Failed(e, at)) if at.elapsed() < RETRY_AFTER => {
                return ModuleCode::Failed(e.clone());
            }
            _ => {}
        }
        // A module whose checksum is known may already be kept.
        if !key.1.is_empty() {
            let kept = self.dir.join(format!("{}.wasm", key.1));
            if kept.is_file() {
                let path = kept.display().to_string();
                states.insert(key, State::Ready(path.clone()));
                return ModuleCode::Local(path);
            }
        }
        let retried = match states.insert(key.clone(), State::Fetching) {
            Some(State::Failed(e, _)) => Some(e),
            _ => None,
        };
        drop(states);
        self.start(key);
        match retried {
            // Tried again in the background: the failure stands meanwhile.
            Some(e) => ModuleCode::Failed(e),
            None => ModuleCode::Pending,
        }
    }
}

/// The module in `body`: as fetched, a gzip'd body unpacked, a POSIX tar's first file.
fn unboxed(body: Vec<u8>) -> Result<Vec<u8>, UnpackError> {
    let body = if body.starts_with(&[0x1f, 0x8b]) {
        gunzip(&body)?
    } else {
        body
    };
    if body.len() > 262 && &body[257..262] == b"ustar" {
        return tar_entries(&body)?
            .into_iter()
            .next()
            .map(|(_, data)| data.to_vec())
            .ok_or(UnpackError::EmptyTar);
    }
    Ok(body)
}

/// The entries of a POSIX tar: (name, contents).
fn tar_entries(mut tar: &[u8]) -> Result<Vec<(String, &[u8])>, UnpackError> {
    let mut out = Vec::new();
    while tar.len() >= 512 && tar[..512].iter().any(|b| *b != 0) {
        let field = |range: std::ops::Range<usize>| {
            String::from_utf8_lossy(&tar[range])
                .trim_matches(|c: char| c == '\0' || c == ' ')
                .to_string()
        };
        let name = field(0..100);
        let Ok(size) = usize::from_str_radix(&field(124..136), 8) else {
            return Err(UnpackError::TarSize { name });
        };
        let Some(data) = tar.get(512..512 + size) else {
            return Err(UnpackError::TarShort { name });
        };
        out.push((name, data));
        tar = tar
            .get(512 + size.div_ceil(512) * 512..)
            .unwrap_or_default();
    }
    Ok(out)
}

fn gunzip(body: &[u8]) -> Result<Vec<u8>, UnpackError> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(MAX_BYTES as u64)
        .read_to_end(&mut out)
        .map_err(UnpackError::Gzip)?;
    Ok(out)
}

const MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const WASM_LAYER: &str = "application/vnd.module.wasm.content.layer.v1+wasm";

/// One image of an OCI registry, and how to speak to it.
struct Registry<'a> {
    client: &'a pasa_runtime::fetch::Client,
    host: String,
    repository: String,
    /// A tag or a digest.
    reference: String,
    /// `https`, or `http` once the registry answered plain HTTP.
    scheme: &'static str,
    /// The pull secret's login for this registry.
    login: Option<RegistryLogin>,
    /// The `authorization` header the registry takes (a bearer token, or Basic credentials).
    authorization: Option<String>,
}

impl<'a> Registry<'a> {
    /// `host[:port]/repository[:tag|@digest]`; Docker Hub's short names as Docker reads them.
    fn new(
        client: &'a pasa_runtime::fetch::Client,
        image: &str,
        secret: Option<&ImagePullSecret>,
    ) -> Result<Self, WasmError> {
        let (name, reference) = match image.split_once('@') {
            Some((name, digest)) => (name, digest.to_string()),
            None => match image.rsplit_once(':') {
                Some((name, tag)) if !tag.contains('/') => (name, tag.to_string()),
                _ => (image, "latest".to_string()),
            },
        };
        let (host, repository) = match name.split_once('/') {
            Some((host, rest))
                if host.contains('.') || host.contains(':') || host == "localhost" =>
            {
                (host.to_string(), rest.to_string())
            }
            Some(_) => ("registry-1.docker.io".to_string(), name.to_string()),
            None => (
                "registry-1.docker.io".to_string(),
                format!("library/{name}"),
            ),
        };
        if repository.is_empty() {
            return Err(WasmError::NoRepository {
                image: image.to_string(),
            });
        }
        let host = if host == "docker.io" {
            "registry-1.docker.io".to_string()
        } else {
            host
        };
        let login = match secret {
            Some(s) => s
                .login_for(&host)
                .map_err(|problem| WasmError::PullSecret {
                    image: image.to_string(),
                    problem,
                })?,
            None => None,
        };
        // A registry token is sent from the start.
        let authorization = match &login {
            Some(RegistryLogin::Token(token)) => Some(format!("Bearer {token}")),
            _ => None,
        };
        Ok(Registry {
            client,
            host,
            repository,
            reference,
            scheme: "https",
            login,
            authorization,
        })
    }

    fn image(&self) -> String {
        format!("{}/{}:{}", self.host, self.repository, self.reference)
    }

    /// The module and the image's digest.
    async fn pull(mut self) -> Result<(Vec<u8>, String), WasmError> {
        let path = format!("/v2/{}/manifests/{}", self.repository, self.reference);
        let manifest = self.get(&path, Some(MANIFEST_TYPES)).await?;
        let digest = sha256_hex(&manifest);
        if let Some(pinned) = self.reference.strip_prefix("sha256:")
            && pinned != digest
        {
            return Err(WasmError::ManifestDigest {
                image: self.image(),
                digest,
            });
        }
        let manifest: serde_json::Value =
            serde_json::from_slice(&manifest).map_err(|source| WasmError::ManifestJson {
                image: self.image(),
                source,
            })?;
        let layers: Vec<(String, String)> = manifest["layers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| {
                (
                    l["mediaType"].as_str().unwrap_or_default().to_string(),
                    l["digest"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        let media_type = manifest["mediaType"].as_str().unwrap_or_default();
        let module = match layers.last() {
            // Istio's compat formats: the last layer a gzip'd tar holding plugin.wasm.
            Some((kind, layer))
                if (media_type == DOCKER_MANIFEST && kind == DOCKER_LAYER)
                    || (media_type != DOCKER_MANIFEST && kind == OCI_LAYER) =>
            {
                let blob = self.blob(layer).await?;
                let layer_error = |source| WasmError::Layer {
                    image: self.image(),
                    source,
                };
                let tar = gunzip(&blob).map_err(layer_error)?;
                tar_entries(&tar)
                    .map_err(layer_error)?
                    .into_iter()
                    .find(|(name, _)| name.rsplit('/').next() == Some("plugin.wasm"))
                    .map(|(_, data)| data.to_vec())
                    .ok_or_else(|| WasmError::NoPluginWasm {
                        image: self.image(),
                    })?
            }
            _ => {
                // An OCI artifact: a Wasm layer beside its config.
                let wasm = layers
                    .iter()
                    .find(|(kind, _)| kind == WASM_LAYER)
                    .filter(|_| layers.len() == 2)
                    .ok_or_else(|| WasmError::NotWasmImage {
                        image: self.image(),
                    })?;
                self.blob(&wasm.1).await?
            }
        };
        Ok((module, digest))
    }

    /// A blob, checked against its digest.
    async fn blob(&mut self, digest: &str) -> Result<Vec<u8>, WasmError> {
        let path = format!("/v2/{}/blobs/{digest}", self.repository);
        let blob = self.get(&path, None).await?;
        if digest.strip_prefix("sha256:") != Some(sha256_hex(&blob).as_str()) {
            return Err(WasmError::BlobDigest {
                image: self.image(),
                digest: digest.to_string(),
            });
        }
        Ok(blob)
    }

    /// GETs `path` of the registry: over plain HTTP when it speaks no TLS, with a bearer token
    /// when it asks for one, following redirects (blobs are often elsewhere).
    async fn get(&mut self, path: &str, accept: Option<&str>) -> Result<Vec<u8>, WasmError> {
        let mut url = format!("{}://{}{path}", self.scheme, self.host);
        for _ in 0..5 {
            let mut headers = Vec::new();
            if let Some(accept) = accept {
                headers.push(("accept", accept.to_string()));
            }
            // The credentials are the registry's: not sent where it redirects.
            if let Some(authorization) = &self.authorization
                && url.starts_with(&format!("{}://{}/", self.scheme, self.host))
            {
                headers.push(("authorization", authorization.clone()));
            }
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let answer =
                match pasa_runtime::fetch::request(self.client, &url, &headers, TIMEOUT, MAX_BYTES)
                    .await
                {
                    Ok(answer) => answer,
                    // A registry without TLS (one on the node, say), as pilot-agent falls back.
                    Err(_) if self.scheme == "https" && url.starts_with("https://") => {
                        self.scheme = "http";
                        url = format!("http://{}{path}", self.host);
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                };
            let status = answer.status.as_u16();
            let header = |name: &str| {
                answer
                    .headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            match status {
                200..=299 => return Ok(answer.body),
                301 | 302 | 303 | 307 | 308 => {
                    let location = header("location").ok_or_else(|| WasmError::NoLocation {
                        url: url.clone(),
                        status,
                    })?;
                    url = if location.starts_with('/') {
                        format!("{}://{}{location}", self.scheme, self.host)
                    } else {
                        location
                    };
                }
                401 if self.authorization.is_none() => {
                    let challenge = header("www-authenticate")
                        .ok_or_else(|| WasmError::NoChallenge { url: url.clone() })?;
                    self.authorization = Some(self.sign_in(&challenge).await?);
                }
                401 | 403 if self.login.is_some() => {
                    return Err(WasmError::LoginRefused {
                        url,
                        status: answer.status,
                    });
                }
                _ => {
                    return Err(WasmError::Status {
                        url,
                        status: answer.status,
                    });
                }
            }
        }
        Err(WasmError::TooManyRedirects { url })
    }

    /// The `authorization` header answering `challenge`: Basic credentials where the registry
    /// asks for them, or a token from the bearer challenge's realm (with the login, if any).
    async fn sign_in(&self, challenge: &str) -> Result<String, WasmError> {
        use base64::Engine;
        let basic = match &self.login {
            Some(RegistryLogin::Basic { username, password }) => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
            )),
            _ => None,
        };
        if challenge.starts_with("Basic ") {
            return basic.ok_or_else(|| WasmError::LoginNeeded {
                image: self.image(),
            });
        }
        let params = challenge
            .strip_prefix("Bearer ")
            .ok_or_else(|| WasmError::Challenge {
                image: self.image(),
                challenge: challenge.to_string(),
            })?;
        let mut realm = None;
        let mut query = Vec::new();
        for part in params.split(',') {
            let Some((key, value)) = part.trim().split_once('=') else {
                continue;
            };
            let value = value.trim_matches('"');
            match key {
                "realm" => realm = Some(value.to_string()),
                "service" | "scope" => query.push(format!("{key}={value}")),
                _ => {}
            }
        }
        let realm = realm.ok_or_else(|| WasmError::NoRealm {
            image: self.image(),
        })?;
        let url = if query.is_empty() {
            realm
        } else {
            format!("{realm}?{}", query.join("&"))
        };
        let headers: Vec<(&str, &str)> = basic
            .as_deref()
            .map(|b| ("authorization", b))
            .into_iter()
            .collect();
        let answer =
            pasa_runtime::fetch::request(self.client, &url, &headers, TIMEOUT, 1 << 20).await?;
        if !answer.status.is_success() {
            return Err(WasmError::TokenRefused {
                url,
                login: basic.is_some(),
                status: answer.status,
            });
        }
        let answer: serde_json::Value = match serde_json::from_slice(&answer.body) {
            Ok(answer) => answer,
            Err(source) => return Err(WasmError::TokenJson { url, source }),
        };
        answer["token"]
            .as_str()
            .or_else(|| answer["access_token"].as_str())
            .map(|t| format!("Bearer {t}"))
            .ok_or(WasmError::NoToken { url })
    }
}

/// Writes `module` to `file` (through a temporary file in `dir`, so a reader never sees half).
fn save(dir: &Path, file: &Path, module: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let temporary = file.with_extension("partial");
    std::fs::write(&temporary, module)?;
    std::fs::rename(&temporary, file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_come_as_fetched_gzipped_or_as_a_tars_first_file() {
        let module = b"\0asm\x01\0\0\0".to_vec();
        assert_eq!(unboxed(module.clone()).unwrap(), module);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, &module).unwrap();
        assert_eq!(unboxed(gz.finish().unwrap()).unwrap(), module);
        // A one-file tar: header (name, size in octal, "ustar"), data, padding.
        let mut tar = vec![0u8; 512];
        tar[..11].copy_from_slice(b"plugin.wasm");
        tar[124..135].copy_from_slice(format!("{:011o}", module.len()).as_bytes());
        tar[257..262].copy_from_slice(b"ustar");
        tar.extend(&module);
        tar.resize(2048, 0);
        assert_eq!(unboxed(tar).unwrap(), module);
    }
}
