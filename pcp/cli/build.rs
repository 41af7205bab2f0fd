//! Compiles the Envoy API's descriptors for `pasactl proxy-config -o json`.
//!
//! The `.proto` files ship inside the envoy-types crate. A build script cannot name another
//! crate's source directory directly, so it asks `cargo metadata` (offline, host platform only,
//! bounded by a deadline so a held lock can never hang the build) and, should that fail, looks
//! for the version in `Cargo.lock` under Cargo's registry sources. `PASA_ENVOY_PROTO_DIR` names
//! the directory outright (for vendored or unusual layouts). The descriptor set, without source
//! info, is written to `OUT_DIR/envoy_descriptors.bin` and included into pasactl.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The Envoy messages pasactl prints, and the extensions the agent packs into an `Any`. Not the
/// dynamic forward proxy cluster (`ALLOW_ANY_DYNAMIC_DNS` only): its file does not compile on its
/// own (a relative type name in it resolves to another package), so a dump holding that cluster
/// cannot be printed as JSON and pasactl says so.
const FILES: &[&str] = &[
    "envoy/config/listener/v3/listener.proto",
    "envoy/config/cluster/v3/cluster.proto",
    "envoy/config/endpoint/v3/endpoint.proto",
    "envoy/config/route/v3/route.proto",
    "envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto",
    "envoy/extensions/filters/network/tcp_proxy/v3/tcp_proxy.proto",
    "envoy/extensions/filters/http/router/v3/router.proto",
    "envoy/extensions/filters/http/rbac/v3/rbac.proto",
    "envoy/extensions/filters/network/rbac/v3/rbac.proto",
    "envoy/extensions/path/match/uri_template/v3/uri_template_match.proto",
    "envoy/extensions/filters/http/fault/v3/fault.proto",
    "envoy/extensions/filters/http/cors/v3/cors.proto",
    "envoy/extensions/filters/listener/tls_inspector/v3/tls_inspector.proto",
    "envoy/extensions/filters/listener/http_inspector/v3/http_inspector.proto",
    "envoy/extensions/filters/listener/original_dst/v3/original_dst.proto",
    "envoy/extensions/transport_sockets/tls/v3/tls.proto",
    "envoy/extensions/transport_sockets/raw_buffer/v3/raw_buffer.proto",
    "envoy/extensions/upstreams/http/v3/http_protocol_options.proto",
];

/// The include roots inside envoy-types' `proto` directory.
const INCLUDES: &[&str] = &[
    "data-plane-api",
    "xds",
    "googleapis",
    "protoc-gen-validate",
    "cel-spec",
    "opentelemetry-proto",
    "client_model",
];

/// How long `cargo metadata` may take before the fallback is used.
const METADATA_DEADLINE: Duration = Duration::from_secs(60);

type BoxError = Box<dyn std::error::Error>;

fn main() -> Result<(), BoxError> {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../../Cargo.lock");
    println!("cargo:rerun-if-env-changed=PASA_ENVOY_PROTO_DIR");
    let root = envoy_proto_dir()?;
    let includes: Vec<PathBuf> = INCLUDES.iter().map(|d| root.join(d)).collect();
    let mut compiler = protox::Compiler::new(&includes)?;
    compiler.include_source_info(false).include_imports(true);
    compiler.open_files(FILES).map_err(|e| {
        format!(
            "compiling the Envoy protos under {}: {e} (set PASA_ENVOY_PROTO_DIR to envoy-types' proto directory)",
            root.display()
        )
    })?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("envoy_descriptors.bin");
    std::fs::write(&out, compiler.encode_file_descriptor_set())?;
    Ok(())
}

/// envoy-types' `proto` directory.
fn envoy_proto_dir() -> Result<PathBuf, BoxError> {
    if let Ok(dir) = std::env::var("PASA_ENVOY_PROTO_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let from_metadata = match from_cargo_metadata() {
        Ok(dir) => return Ok(dir),
        Err(e) => e,
    };
    from_registry().map_err(|e| {
        format!(
            "cannot find envoy-types' .proto files: cargo metadata: {from_metadata}; registry: {e}; \
             set PASA_ENVOY_PROTO_DIR to envoy-types' proto directory"
        )
        .into()
    })
}

fn from_cargo_metadata() -> Result<PathBuf, BoxError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = std::env::var("TARGET")?;
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR")?;
    let mut child = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &target])
        .current_dir(&manifest_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Read stdout on a thread so a large answer cannot fill the pipe while we wait.
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut bytes).map(|_| bytes)
    });
    let deadline = Instant::now() + METADATA_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("no answer within {METADATA_DEADLINE:?}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let bytes = reader.join().map_err(|_| "reader thread failed")??;
    if !status.success() {
        return Err(format!("exited with {status}").into());
    }
    let metadata: serde_json::Value = serde_json::from_slice(&bytes)?;
    let manifest = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "envoy-types")
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("envoy-types is not in the dependency graph")?;
    proto_dir_of(
        Path::new(manifest)
            .parent()
            .ok_or("manifest without a parent")?,
    )
}

/// `$CARGO_HOME/registry/src/*/envoy-types-<version from Cargo.lock>/proto`.
fn from_registry() -> Result<PathBuf, BoxError> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let lock = std::fs::read_to_string(manifest_dir.join("../../Cargo.lock"))?;
    let version = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"envoy-types\""))
        .and_then(|p| {
            p.lines()
                .find_map(|l| l.trim().strip_prefix("version = \""))
                .map(|v| v.trim_end_matches('"').to_string())
        })
        .ok_or("envoy-types is not in Cargo.lock")?;
    let home = match std::env::var("CARGO_HOME") {
        Ok(home) => PathBuf::from(home),
        Err(_) => PathBuf::from(std::env::var("HOME")?).join(".cargo"),
    };
    let sources = home.join("registry/src");
    for index in std::fs::read_dir(&sources)? {
        let candidate = index?.path().join(format!("envoy-types-{version}"));
        if let Ok(dir) = proto_dir_of(&candidate) {
            return Ok(dir);
        }
    }
    Err(format!("no envoy-types-{version} under {}", sources.display()).into())
}

fn proto_dir_of(crate_dir: &Path) -> Result<PathBuf, BoxError> {
    let dir = crate_dir.join("proto");
    if dir.join("data-plane-api").is_dir() {
        Ok(dir)
    } else {
        Err(format!("{} holds no data-plane-api", dir.display()).into())
    }
}
