//! Whole proxies against istiod: for each case in `tests/istiod/` (see its README), what the
//! agent generates for Istio's proxy, a sidecar and a gateway, or for a proxyless gRPC pod, must
//! equal what istiod generated from the same config, resource by resource and field by field
//! (protobuf JSON; numbers compared by value). A difference is printed with its path.

mod common;

use std::path::Path;

use common::corpus::{self, Case};
use pasa_agent::cache::Cache;
use pasa_agent::model::proxy::{Generator, ProxyBuild};
use pasa_agent::translate::Translator;
use serde_json::{Map, Value, json};

fn dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/istiod"))
}

/// The proxies of the recordings.
fn proxy(kind: &str) -> Value {
    match kind {
        "router" => json!({"type": "router", "namespace": "istio-system",
            "config_namespace": "istio-system", "ip": "10.0.0.50",
            "labels": {"istio": "ingressgateway"}, "dns_domain": "istio-system.svc.cluster.local"}),
        "grpc" => json!({"type": "sidecar", "namespace": "default", "config_namespace": "default",
            "ip": "10.0.0.2", "labels": {"app": "reviews", "security.istio.io/tlsMode": "istio"},
            "dns_domain": "default.svc.cluster.local"}),
        _ => json!({"type": "sidecar", "namespace": "default", "config_namespace": "default",
            "ip": "10.0.0.2", "labels": {"app": "reviews"},
            "dns_domain": "default.svc.cluster.local"}),
    }
}

/// The listeners the gRPC pod's recording asked istiod for as an xDS server (the last port is
/// one no service targets: no listener).
const GRPC_SERVER_LISTENERS: [&str; 3] = [
    "xds.istio.io/grpc/lds/inbound/0.0.0.0:9080",
    "xds.istio.io/grpc/lds/inbound/[::]:19090",
    "xds.istio.io/grpc/lds/inbound/10.0.0.2:5555",
];

/// What the agent generates for `kind` from `config`, keyed as the recordings are.
fn generated(config: &str, kind: &str) -> Map<String, Value> {
    let case: Case = serde_json::from_value(json!({"name": kind, "proxy": proxy(kind),
        "config": config, "source": {"test": "istiod_parity", "line": 1}}))
    .expect("case");
    let resources = corpus::resources(&case, "cluster.local").expect("resources");
    let mut p = corpus::proxy(&case).expect("proxy");
    let generator = if kind == "grpc" {
        Generator::Grpc
    } else {
        p.build = ProxyBuild::Istio;
        Generator::Envoy
    };
    let revision = resources.iter().map(|r| r.mod_revision).max().unwrap_or(0);
    let cache = Cache::from_resources(resources, revision);
    let out = Translator::new(p)
        .update(&cache, generator)
        .expect("translates");
    let mut all = Map::new();
    let mut put = |key: String, any| {
        let mut v = pasa_envoy_json::to_json(&key, &any).expect("protobuf JSON");
        v.as_object_mut().expect("an object").remove("@type");
        all.insert(key, v);
    };
    for (n, c) in &out.clusters {
        put(format!("C {n}"), envoy_types::util::pack_any(c.clone()));
    }
    if generator == Generator::Grpc {
        // A gRPC server's listener is made as the server asks for it, by the address it
        // listens on; the one kept per port is not handed out under its own name.
        let kept: pasa_agent::resource::ResourceMap = out
            .listeners
            .iter()
            .map(|(n, l)| (n.clone(), pasa_agent::resource::Resource::pack(l)))
            .collect();
        for (n, l) in &out.listeners {
            if !n.starts_with(pasa_agent::translate::SERVER_LISTENER_PREFIX) {
                put(format!("L {n}"), envoy_types::util::pack_any(l.clone()));
            }
        }
        for name in GRPC_SERVER_LISTENERS {
            if let Some(l) =
                pasa_agent::translate::grpc_listener(name, &kept, "default.svc.cluster.local")
            {
                put(format!("L {name}"), l.body.clone());
            }
        }
    } else {
        for (n, l) in &out.listeners {
            put(format!("L {n}"), envoy_types::util::pack_any(l.clone()));
        }
    }
    for (n, r) in &out.routes {
        put(format!("R {n}"), envoy_types::util::pack_any(r.clone()));
    }
    for (n, e) in &out.endpoints {
        put(format!("E {n}"), envoy_types::util::pack_any(e.clone()));
    }
    all
}

/// Numbers by value: `100` and `100.0` are the same.
fn normalized(v: &Value) -> Value {
    match v {
        Value::Number(n) => n
            .as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 1e15)
            .map_or_else(|| v.clone(), |f| json!(f as i64)),
        Value::Array(a) => Value::Array(a.iter().map(normalized).collect()),
        Value::Object(o) => {
            Value::Object(o.iter().map(|(k, v)| (k.clone(), normalized(v))).collect())
        }
        _ => v.clone(),
    }
}

/// Whether a difference at a path is a known one.
type At = fn(&str) -> bool;

/// Differences the agent keeps knowingly, by where they are, with why.
/// None at present: every recorded resource equals istiod's.
const KNOWN: &[(At, &str)] = &[];

/// The paths where `a` and `b` differ.
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (l, r) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                differences(l, r, &format!("{path}.{k}"), out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (l, r)) in x.iter().zip(y).enumerate() {
                differences(l, r, &format!("{path}[{i}]"), out);
            }
        }
        _ if a != b => {
            let short = |v: &Value| v.to_string().chars().take(300).collect::<String>();
            out.push(format!(
                "{path}\n  istiod: {}\n  PASA:   {}",
                short(a),
                short(b)
            ));
        }
        _ => {}
    }
}

#[test]
fn the_agent_generates_what_istiod_generates() {
    let mut cases = 0;
    for entry in std::fs::read_dir(dir()).expect("tests/istiod") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let case = path.file_stem().unwrap().to_string_lossy().into_owned();
        let config = std::fs::read_to_string(&path).expect("config");
        for kind in ["sidecar", "router", "grpc"] {
            let recorded = dir().join(format!("{case}-{kind}.json"));
            if !recorded.exists() {
                continue;
            }
            let istiod: Value = serde_json::from_str(
                &std::fs::read_to_string(&recorded).expect("a recording per proxy"),
            )
            .expect("JSON");
            let mut pasa = generated(&config, kind);
            // Load assignments sent over EDS, where the recording has them.
            let eds = istiod
                .as_object()
                .is_some_and(|o| o.keys().any(|k| k.starts_with("E ")));
            if !eds {
                pasa.retain(|k, _| !k.starts_with("E "));
            }
            let pasa = Value::Object(pasa);
            let mut found = Vec::new();
            differences(&normalized(&istiod), &normalized(&pasa), "", &mut found);
            let known = found
                .iter()
                .filter(|d| {
                    let path = d.lines().next().unwrap_or_default();
                    KNOWN.iter().any(|(at, _)| at(path))
                })
                .count();
            if known > 0 {
                println!("{case} {kind}: {known} known differences skipped:");
                for (_, why) in KNOWN {
                    println!("  {why}");
                }
            }
            found.retain(|d| {
                let path = d.lines().next().unwrap_or_default();
                !KNOWN.iter().any(|(at, _)| at(path))
            });
            println!(
                "{case} {kind}: {} resources, {} differences from istiod",
                istiod.as_object().map_or(0, Map::len),
                found.len()
            );
            assert!(
                found.is_empty(),
                "{case} {kind}: the agent's resources differ from istiod's:\n{}",
                found.join("\n")
            );
            cases += 1;
        }
    }
    assert!(cases >= 5, "the recordings are there");
}
