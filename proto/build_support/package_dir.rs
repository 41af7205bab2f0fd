//! For build scripts (included with `#[path]`, as build scripts cannot share a library without a
//! crate of their own): the source folder of a package the build resolved, such as a crate
//! that ships `.proto` files.
//!
//! It asks `cargo metadata` (offline, for the target platform only, so that crates for other
//! platforms need not be downloaded; bounded by a deadline so a held lock never hangs the
//! build), and should that fail, looks for the version in the workspace's `Cargo.lock` under
//! Cargo's registry sources. An environment variable may name the folder outright.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long `cargo metadata` may take before the fallback is used.
const METADATA_DEADLINE: Duration = Duration::from_secs(60);

/// The folder of `package` in which `is_wanted` holds (given the package's own folder); the
/// folder `override_var` names, when set. Errors say what was tried and name `override_var`.
pub fn package_dir(
    package: &str,
    override_var: &str,
    wanted: impl Fn(&Path) -> Option<PathBuf>,
) -> Result<PathBuf, String> {
    println!("cargo:rerun-if-env-changed={override_var}");
    if let Ok(dir) = std::env::var(override_var) {
        return Ok(PathBuf::from(dir));
    }
    let from_metadata = match from_cargo_metadata(package) {
        Ok(dir) => match wanted(&dir) {
            Some(found) => return Ok(found),
            None => format!("{} is not what was expected", dir.display()),
        },
        Err(e) => e,
    };
    let from_registry = match from_registry(package) {
        Ok(dirs) => match dirs.iter().find_map(|d| wanted(d)) {
            Some(found) => return Ok(found),
            None => format!("none of {dirs:?} is what was expected"),
        },
        Err(e) => e,
    };
    Err(format!(
        "cannot find the sources of {package}: cargo metadata: {from_metadata}; registry: \
         {from_registry}; set {override_var} to the folder"
    ))
}

fn from_cargo_metadata(package: &str) -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = std::env::var("TARGET").map_err(|e| e.to_string())?;
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?;
    let mut child = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &target])
        .current_dir(&manifest_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    // Read the pipes on threads so a large answer cannot fill them while we wait.
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let mut stderr = child.stderr.take().ok_or("no stderr")?;
    let out = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut bytes).map(|_| bytes)
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut text).map(|_| text)
    });
    let deadline = Instant::now() + METADATA_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("no answer within {METADATA_DEADLINE:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let bytes = out
        .join()
        .map_err(|_| "reader thread failed")?
        .map_err(|e| e.to_string())?;
    if !status.success() {
        let said = err.join().ok().and_then(Result::ok).unwrap_or_default();
        return Err(format!("exited with {status}: {}", said.trim()));
    }
    let metadata: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    let manifest = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == package)
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or_else(|| format!("{package} is not in the dependency graph"))?;
    Path::new(manifest)
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| "a manifest without a folder".to_string())
}

/// `$CARGO_HOME/registry/src/*/<package>-<version from Cargo.lock>`, every index's.
fn from_registry(package: &str) -> Result<Vec<PathBuf>, String> {
    let manifest_dir =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let lock = manifest_dir
        .ancestors()
        .map(|d| d.join("Cargo.lock"))
        .find(|l| l.exists())
        .ok_or("no Cargo.lock above the package")?;
    let lock = std::fs::read_to_string(lock).map_err(|e| e.to_string())?;
    let versions: Vec<String> = lock
        .split("[[package]]")
        .filter(|p| p.contains(&format!("name = \"{package}\"\n")))
        .filter_map(|p| {
            p.lines()
                .find_map(|l| l.trim().strip_prefix("version = \""))
                .map(|v| v.trim_end_matches('"').to_string())
        })
        .collect();
    if versions.is_empty() {
        return Err(format!("{package} is not in Cargo.lock"));
    }
    let home = match std::env::var("CARGO_HOME") {
        Ok(home) => PathBuf::from(home),
        Err(_) => PathBuf::from(std::env::var("HOME").map_err(|e| e.to_string())?).join(".cargo"),
    };
    let sources = home.join("registry/src");
    let mut found = Vec::new();
    for index in std::fs::read_dir(&sources).map_err(|e| format!("{}: {e}", sources.display()))? {
        let index = index.map_err(|e| e.to_string())?.path();
        for version in &versions {
            let dir = index.join(format!("{package}-{version}"));
            if dir.is_dir() {
                found.push(dir);
            }
        }
    }
    if found.is_empty() {
        return Err(format!(
            "no {package}-{versions:?} under {}",
            sources.display()
        ));
    }
    Ok(found)
}
