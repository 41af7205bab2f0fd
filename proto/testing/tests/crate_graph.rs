//! The workspace's crates depend on each other one way, test code included, in layers: the wire
//! (`pasa-proto`) stands on nothing of the workspace but `pasa-runtime`, Istio's model
//! (`pasa-istio`) on the wire alone, and the rest on those. The two that run beside every proxy
//! or on every laptop link no storage engine: the agent (in every pod) and `pasactl`, nor what
//! they stand on; nor do they link the Kubernetes client, which the syncer's conversions bring
//! (the agent's tests may run those). Read from `cargo metadata`, so a new dependency that breaks
//! a rule fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// Workspace package → (dependency, kind) for its workspace dependencies and storage engines.
fn graph() -> BTreeMap<String, Vec<(String, String)>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let names: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    packages
        .iter()
        .map(|p| {
            let name = p["name"].as_str().unwrap_or_default().to_string();
            let deps = p["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|d| {
                    let dep = d["name"].as_str()?;
                    let kind = d["kind"].as_str().unwrap_or("normal");
                    (names.contains(dep) || ENGINES.contains(&dep))
                        .then(|| (dep.to_string(), kind.to_string()))
                })
                .collect();
            (name, deps)
        })
        .collect()
}

const ENGINES: &[&str] = &["sled", "tikv-client"];

/// What `package` links through normal dependencies (its own crates and engines).
fn linked(graph: &BTreeMap<String, Vec<(String, String)>>, package: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![package.to_string()];
    while let Some(p) = todo.pop() {
        for (dep, kind) in graph.get(&p).into_iter().flatten() {
            if kind == "normal" && seen.insert(dep.clone()) {
                todo.push(dep.clone());
            }
        }
    }
    seen
}

#[test]
fn the_agent_and_pasactl_link_no_storage_engine() {
    let graph = graph();
    for package in [
        "pasa-agent",
        "pasactl",
        "pasa-validation",
        "pasa-istio",
        "pasa-proto",
        "pasa-runtime",
    ] {
        assert!(
            graph.contains_key(package),
            "{package} is a workspace crate"
        );
        let linked = linked(&graph, package);
        for banned in ["pasa-store", "sled", "tikv-client"] {
            assert!(
                !linked.contains(banned),
                "{package} links {banned} (it links {linked:?})"
            );
        }
        println!("{package} links {linked:?}");
    }
}

#[test]
fn only_pasa_tikv_depends_on_tikv_client() {
    // tikv-client brings an older gRPC stack: one crate holds it, behind a byte-string API.
    let graph = graph();
    for (package, deps) in &graph {
        if package != "pasa-tikv" {
            assert!(
                !deps.iter().any(|(dep, _)| dep == "tikv-client"),
                "{package} depends on tikv-client directly; go through pasa-tikv"
            );
        }
    }
    assert!(
        graph.contains_key("pasa-tikv"),
        "pasa-tikv is a workspace crate"
    );
}

/// The agent (in every pod), the store and the libraries below them never talk to Kubernetes.
/// PCP does, and so does pasactl for the commands that read a cluster as istioctl does
/// (`x create-remote-secret` reads a remote cluster's API server), through pasa-kube.
#[test]
fn only_pcp_and_pasactl_link_the_kubernetes_client() {
    let graph = graph();
    for package in [
        "pasa-agent",
        "pasa-store",
        "pasa-validation",
        "pasa-istio",
        "pasa-proto",
    ] {
        let linked = linked(&graph, package);
        for banned in ["kube", "k8s-openapi", "pasa-kube"] {
            assert!(
                !linked.contains(banned),
                "{package} links {banned}: the Kubernetes client belongs to pasa-kube, which only \
                 PCP and pasactl link (tests may run its conversions as a dev-dependency)"
            );
        }
    }
}

#[test]
fn the_wire_stands_on_runtime_alone_and_istios_model_on_the_wire() {
    // Every kind of dependency counts: the wire knows nothing of Istio's semantics, and Istio's
    // model nothing of the store, PCP or the agent.
    let graph = graph();
    let layers: [(&str, &[&str]); 2] = [
        ("pasa-proto", &["pasa-runtime"]),
        ("pasa-istio", &["pasa-proto", "pasa-runtime"]),
    ];
    for (package, allowed) in layers {
        let deps = graph
            .get(package)
            .unwrap_or_else(|| panic!("{package} is a workspace crate"));
        for (dep, kind) in deps {
            assert!(
                dep == package || allowed.contains(&dep.as_str()),
                "{package} depends on {dep} ({kind}); it may depend only on {allowed:?}"
            );
        }
    }
}

#[test]
fn crates_depend_on_each_other_one_way_test_code_included() {
    let graph = graph();
    // Every kind of dependency counts (normal, dev, build); a crate's dev-dependency on itself
    // (to turn on its own test features) is not a cycle.
    let edges: BTreeMap<&str, BTreeSet<&str>> = graph
        .iter()
        .map(|(p, deps)| {
            let to = deps
                .iter()
                .map(|(d, _)| d.as_str())
                .filter(|d| d != p && graph.contains_key(*d))
                .collect();
            (p.as_str(), to)
        })
        .collect();
    // Depth-first search for a back edge, reporting the cycle it closes.
    fn visit<'a>(
        node: &'a str,
        edges: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if done.contains(node) {
            return;
        }
        if let Some(at) = path.iter().position(|p| *p == node) {
            panic!("dependency cycle: {} → {node}", path[at..].join(" → "));
        }
        path.push(node);
        for next in edges.get(node).into_iter().flatten() {
            visit(next, edges, path, done);
        }
        path.pop();
        done.insert(node);
    }
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        visit(node, &edges, &mut Vec::new(), &mut done);
    }
    println!("{} workspace crates, no cycle: {edges:?}", edges.len());
}
