//! Where the Wasm modules of WasmPlugins and TrafficExtensions come from when they are not files
//! in the pod (`--wasm-fetcher`).
//!
//! Next to Istio's proxy (`pilot-agent`), the proxy's own pilot-agent fetches them, as it does
//! for istiod: the agent sends the module's URL as istiod does ([`PilotAgent`]). Without
//! pilot-agent, the agent fetches them itself ([`Fetcher`]), as pilot-agent would: over HTTP or
//! HTTPS, at most 256 MiB, a POSIX tar's first file or a gzip'd one unpacked, checked against
//! the extension's `sha256` when it gives one, and kept in `<cache dir>/wasm` named by their
//! SHA-256, so that a module whose checksum is known is not fetched again (a restarted agent
//! serves it while its source is away). While a module is fetched its ECDS resource waits; a
//! fetch that fails makes the filter fail open or closed (as pilot-agent's does) and is tried
//! again after 30 seconds. OCI images (`oci://`, or a URL without scheme) are not fetched by
//! the agent yet: they fail the same way.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::translate::extensions::{ModuleCode, ModuleSource};

/// The largest module fetched (pilot-agent's default).
const MAX_BYTES: usize = 256 << 20;
/// How long a fetch may take (istiod's timeout for a module).
const TIMEOUT: Duration = Duration::from_secs(30);
/// How long a failed fetch stands before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// Modules fetched by pilot-agent: the agent sends their URLs.
#[derive(Debug, Default)]
pub struct PilotAgent;

impl ModuleSource for PilotAgent {
    fn module(&self, _url: &str, _sha256: &str) -> ModuleCode {
        ModuleCode::Remote
    }
}

/// Modules fetched by the agent.
#[derive(Debug)]
pub struct Fetcher {
    dir: PathBuf,
    client: pasa_runtime::fetch::Client,
    runtime: tokio::runtime::Handle,
    state: Mutex<HashMap<(String, String), State>>,
    /// Counts the fetches that ended: translation asks again when it moves.
    done: watch::Sender<u64>,
}

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

    fn start(self: &Arc<Self>, url: String, sha256: String) {
        let this = Arc::clone(self);
        self.runtime.spawn(async move {
            let result = this.fetch(&url, &sha256).await;
            let state = match result {
                Ok(path) => {
                    tracing::info!(%url, path, "Wasm module fetched");
                    State::Ready(path)
                }
                Err(e) => {
                    tracing::warn!(%url, "Wasm module not fetched: {e}");
                    State::Failed(e, Instant::now())
                }
            };
            if let Ok(mut states) = this.state.lock() {
                states.insert((url, sha256), state);
            }
            this.done.send_modify(|n| *n += 1);
        });
    }

    async fn fetch(&self, url: &str, sha256: &str) -> Result<String, String> {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "{url}: only HTTP(S) modules are fetched by the agent (OCI images are not yet)"
            ));
        }
        let body = pasa_runtime::fetch::get(&self.client, url, TIMEOUT, MAX_BYTES).await?;
        let module = unboxed(body).map_err(|e| format!("{url}: {e}"))?;
        let digest = hex(ring::digest::digest(&ring::digest::SHA256, &module).as_ref());
        if !sha256.is_empty() && !digest.eq_ignore_ascii_case(sha256) {
            return Err(format!(
                "{url}: the module's SHA-256 is {digest}, the extension expects {sha256}"
            ));
        }
        let path = self.dir.join(format!("{digest}.wasm"));
        let (dir, file) = (self.dir.clone(), path.clone());
        tokio::task::spawn_blocking(move || save(&dir, &file, &module))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path.display().to_string())
    }
}

impl ModuleSource for Arc<Fetcher> {
    fn module(&self, url: &str, sha256: &str) -> ModuleCode {
        let key = (url.to_string(), sha256.to_lowercase());
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
        self.start(key.0, key.1);
        match retried {
            // Tried again in the background: the failure stands meanwhile.
            Some(e) => ModuleCode::Failed(e),
            None => ModuleCode::Pending,
        }
    }
}

/// The module in `body`: as fetched, a gzip'd body unpacked, a POSIX tar's first file.
fn unboxed(body: Vec<u8>) -> Result<Vec<u8>, String> {
    let body = if body.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(body.as_slice())
            .take(MAX_BYTES as u64)
            .read_to_end(&mut out)
            .map_err(|e| format!("not a gzip stream: {e}"))?;
        out
    } else {
        body
    };
    // A POSIX tar: "ustar" at 257; the first entry's size (octal) at 124, its data after the
    // 512-byte header.
    if body.len() > 262 && &body[257..262] == b"ustar" {
        let size = std::str::from_utf8(&body[124..136])
            .ok()
            .map(|s| s.trim_matches(|c: char| c == '\0' || c == ' '))
            .and_then(|s| usize::from_str_radix(s, 8).ok())
            .ok_or("a tar entry without a size")?;
        return body
            .get(512..512 + size)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| "a tar entry shorter than its size".to_string());
    }
    Ok(body)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
