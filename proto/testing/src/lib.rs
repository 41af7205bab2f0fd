//! Test support the project's crates share (dev-dependency only; nothing here runs in
//! production): finding another package's binary in the workspace's target directory, the
//! processes a test starts ([`Process`]) and the lines they print, and the conformance corpus
//! beside the project (its folders and YAML files), and a fake CA ([`pki`]).
//!
//! It depends on no project crate, so every crate's tests may use it without a cycle.

pub mod pki;

use std::io::BufRead;
use std::path::PathBuf;
use std::sync::mpsc;

/// The binary `name` of workspace package `package`, beside the running test's own target
/// directory (`cargo build --workspace` puts every binary there; `cargo test --workspace`
/// those of every package with integration tests — each package with a binary has some).
/// Panics with what to run when it is not built: a test cannot build it itself, as the running
/// `cargo test` holds the build directory.
pub fn workspace_binary(name: &str, package: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("the test's own path: {e}"));
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap_or_else(|| panic!("{} is not in a target directory", exe.display()));
    let path = profile.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is not built: run `cargo build -p {package} --bin {name}` (or `cargo test --workspace`, which builds every binary)",
        path.display()
    );
    path
}

/// The lines of `reader`, as they come, on a channel (read on a thread of their own, so a test
/// can wait for one with `recv_timeout`).
pub fn line_channel(reader: impl BufRead + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The conformance corpus (Istio's own test data, kept beside the project): `PASA_CONFORMANCE_DIR`,
/// else `../shared/conformance` beside the workspace, when it holds `folder`. Otherwise says
/// loudly that the caller's cases are skipped and returns `None` — or, with
/// `PASA_CONFORMANCE_REQUIRED` set (CI sets it), fails the test.
pub fn conformance_dir(folder: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("PASA_CONFORMANCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("../shared/conformance"));
    if dir.join(folder).is_dir() {
        return Some(dir);
    }
    let missing = format!(
        "the conformance corpus has no {folder}/ at {} (set PASA_CONFORMANCE_DIR)",
        dir.display()
    );
    assert!(
        std::env::var_os("PASA_CONFORMANCE_REQUIRED").is_none(),
        "{missing}, and PASA_CONFORMANCE_REQUIRED is set"
    );
    eprintln!("\n*** SKIPPED: {missing}; no case of it ran ***\n");
    None
}

/// The workspace's root folder (this crate sits two levels below it).
pub fn workspace_root() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every document of a YAML file (empty ones left out); panics naming the file when it is not
/// YAML.
pub fn yaml_docs(path: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// A Kubernetes object's key in a golden file: (kind, namespace, name).
pub type ObjectKey = (String, String, String);

/// Documents by kind, namespace and name, as a translation golden file is compared (objects
/// matched by key, each compared as data). `metadata.creationTimestamp` is left out: generated
/// objects carry none of their own.
pub fn keyed_documents(
    docs: impl IntoIterator<Item = serde_json::Value>,
) -> std::collections::BTreeMap<ObjectKey, serde_json::Value> {
    docs.into_iter()
        .map(|mut d| {
            let text = |v: &serde_json::Value, what: &str| {
                v.as_str()
                    .unwrap_or_else(|| panic!("a document without {what}: {d}"))
                    .to_string()
            };
            let key = (
                text(&d["kind"], "kind"),
                text(&d["metadata"]["namespace"], "metadata.namespace"),
                text(&d["metadata"]["name"], "metadata.name"),
            );
            if let Some(m) = d["metadata"].as_object_mut() {
                m.remove("creationTimestamp");
            }
            (key, d)
        })
        .collect()
}

/// Checks a golden file's object counts per kind against its case's `golden_objects`, and
/// compares what was generated with it: whether they are equal, each difference printed.
pub fn matches_golden(
    case: &serde_json::Value,
    want: &std::collections::BTreeMap<ObjectKey, serde_json::Value>,
    got: &std::collections::BTreeMap<ObjectKey, serde_json::Value>,
) -> bool {
    let name = case["name"].as_str().unwrap_or_default();
    let counts = case["golden_objects"].as_object().expect("golden_objects");
    for (kind, n) in counts {
        let have = want.keys().filter(|k| &k.0 == kind).count();
        assert_eq!(
            Some(have as u64),
            n.as_u64(),
            "{name}: the golden's {kind}s"
        );
    }
    if got == want {
        return true;
    }
    let keys: std::collections::BTreeSet<_> = want.keys().chain(got.keys()).collect();
    for key in keys {
        if want.get(key) != got.get(key) {
            println!(
                "  FAIL {name} {key:?}:\n    want {}\n    got  {}",
                want.get(key).map_or("nothing".into(), ToString::to_string),
                got.get(key).map_or("nothing".into(), ToString::to_string)
            );
        }
    }
    false
}

/// The `.yaml` files of one folder, in name order (a corpus test walks its folders at run time).
pub fn yaml_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// A process a test started: killed (and reaped) when dropped, so a failing test leaves
/// nothing running; [`Process::terminate`] stops it as its supervisor would and checks it
/// exited cleanly.
pub struct Process {
    child: std::process::Child,
    name: String,
}

impl Process {
    pub fn new(name: &str, child: std::process::Child) -> Process {
        Process {
            child,
            name: name.to_string(),
        }
    }

    /// The process's exit status once it has exited by itself, waiting at most `deadline`;
    /// `None` if it is still running then (it is killed when dropped).
    pub fn exited_within(
        &mut self,
        deadline: std::time::Duration,
    ) -> Option<std::process::ExitStatus> {
        let until = std::time::Instant::now() + deadline;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if std::time::Instant::now() < until => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Ok(None) => return None,
                Err(e) => panic!("waiting for {}: {e}", self.name),
            }
        }
    }

    /// The process's id, to signal it (`kill -STOP`).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then the exit status must be a success.
    pub fn terminate(mut self) {
        let pid = self.child.id().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap_or_else(|e| panic!("kill -TERM {pid}: {e}"));
        assert!(sent.success(), "kill -TERM {pid} failed");
        let exit = self
            .child
            .wait()
            .unwrap_or_else(|e| panic!("waiting for {}: {e}", self.name));
        assert!(
            exit.success(),
            "{} exits cleanly on SIGTERM: {exit:?}",
            self.name
        );
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
