//! The agent's modules depend on each other one way: each top-level module names (`crate::…`)
//! only modules of earlier layers below (see `docs/architecture.md`). A new dependency that
//! points up, or a new module not placed in a layer, fails here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Layers, lowest first; a module may use modules of its own layer only when listed before it
/// in the same layer (so for the layers of `translate` and `ads` below).
const LAYERS: &[&[&str]] = &[
    &[
        "resource",
        "mesh",
        "identity",
        "cache",
        "worker",
        "probes",
        "supervisor",
        "on_demand",
    ],
    &["model"],
    &["subscription", "translate", "simulate", "wasm"],
    &["metrics"],
    &["ads", "follow", "bootstrap"],
    &["credentials", "report", "envoy"],
    &["admin"],
    &["run"],
];

/// The same inside `translate`: its builders, lowest first (the parent module, the translator,
/// stands on all of them and they read its `View`). The view and the fingerprints of the
/// generators' inputs are the translator's own parts, in files of their own: they stand on the
/// builders, and the builders reach the view only through the parent (`super::View`).
const TRANSLATE_LAYERS: &[&[&str]] = &[
    // The services the mesh config's providers name.
    &["providers"],
    &[
        "session", "authz", "builders", "metadata", "names", "hcm", "sds",
    ],
    &["endpoint", "route"],
    &["filters", "hash"],
    &["grpc"],
    &["cluster"],
    &["hash"],
    &["sidecar", "gateway"],
    // Change what all the others built: extensions, then telemetry (access logs, tracing,
    // metrics), then EnvoyFilter patches.
    &["patched"],
    &["telemetry", "extensions", "envoy_filter"],
    // Reshapes what is built for the on-demand scope (VHDS), last.
    &["lazy"],
    // The translator's own parts: what a proxy sees, then what each output was built from.
    &["view", "inputs"],
];

/// The same inside `ads`.
const ADS_LAYERS: &[&[&str]] = &[
    &["status", "snapshot", "wire"],
    &["stream", "vhds"],
    &["sotw", "delta", "authority"],
    &["server"],
];

/// Modules that only tests use.
const TEST_ONLY: &[&str] = &["testing"];

/// The top-level modules `code` names (`crate::x`).
fn crate_uses(code: &str) -> Vec<String> {
    code.match_indices("crate::")
        .map(|(at, _)| ident(&code[at + "crate::".len()..]))
        .collect()
}

/// The modules `code` names relative to its parent (`super::x`, `super::{x, y}`), and, from a
/// module's own submodules, relative to the grandparent (`super::super::x`).
fn sibling_uses(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("super::") {
        let mut rest = &code[at + "super::".len()..];
        while let Some(r) = rest.strip_prefix("super::") {
            rest = r;
        }
        if let Some(list) = rest.strip_prefix('{') {
            let list = &list[..list.find('}').unwrap_or(list.len())];
            out.extend(list.split(',').map(|item| ident(item.trim())));
        } else {
            out.push(ident(rest));
        }
    }
    out
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

#[test]
fn the_agents_modules_depend_on_each_other_one_way() {
    check(Area {
        name: "the agent",
        dir: "",
        layers: LAYERS,
        uses: crate_uses,
        strict: true,
    });
}

#[test]
fn translations_builders_depend_on_each_other_one_way() {
    check(Area {
        name: "translate",
        dir: "translate",
        layers: TRANSLATE_LAYERS,
        uses: sibling_uses,
        strict: false,
    });
}

#[test]
fn the_ads_servers_parts_depend_on_each_other_one_way() {
    check(Area {
        name: "ads",
        dir: "ads",
        layers: ADS_LAYERS,
        uses: sibling_uses,
        strict: false,
    });
}

/// A part of the source whose modules are layered.
struct Area {
    name: &'static str,
    /// Below `src`.
    dir: &'static str,
    layers: &'static [&'static [&'static str]],
    /// The modules a file's code names.
    uses: fn(&str) -> Vec<String>,
    /// Whether a named module in no layer is an error (else it is something other than a
    /// sibling module: an item of the parent, a submodule of the file's own).
    strict: bool,
}

/// Fails unless every module of `area` names only modules below it.
fn check(area: Area) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(area.dir);
    let mut order = BTreeMap::new();
    for (layer, modules) in area.layers.iter().enumerate() {
        for (at, m) in modules.iter().enumerate() {
            order.insert(m.to_string(), (layer, at));
        }
    }
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let mut violations = Vec::new();
    let mut edges = 0;
    for file in &files {
        let Some(module) = module_of(&dir, file) else {
            continue;
        };
        let shown = file.strip_prefix(&dir).unwrap_or(file).display();
        let test_only = TEST_ONLY.contains(&module.as_str())
            || file.ends_with("tests.rs")
            || module.ends_with("_tests")
            || module == "envoy_rules";
        if test_only {
            continue;
        }
        let Some(&mine) = order.get(&module) else {
            violations.push(format!("{shown}: module {module} is in no layer"));
            continue;
        };
        let code = library_code(&std::fs::read_to_string(file).expect("source file"));
        for used in (area.uses)(&code) {
            if used == module || used.is_empty() || TEST_ONLY.contains(&used.as_str()) {
                continue;
            }
            let Some(&theirs) = order.get(&used) else {
                if area.strict {
                    violations.push(format!("{shown}: uses {used}, in no layer"));
                }
                continue;
            };
            edges += 1;
            if theirs >= mine {
                violations.push(format!(
                    "{shown}: {module} uses {used}, which is not below it"
                ));
            }
        }
    }
    violations.sort();
    violations.dedup();
    println!(
        "{}: {} source files, {edges} uses of other modules, {} against the layers",
        area.name,
        files.len(),
        violations.len()
    );
    assert!(
        edges >= 2 * area.layers.len(),
        "{}: the scan found almost no dependencies: is it reading the sources?",
        area.name
    );
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a source file belongs to, below `dir` (`translate/route.rs` → `translate`).
fn module_of(dir: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(dir).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main").then(|| name.to_string())
}

/// The source without its test modules and comments: what the library itself depends on. (The
/// house style puts a file's test module last, so everything from the first `#[cfg(test)]` on
/// is left out.)
fn library_code(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}
