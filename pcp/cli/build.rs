//! Compiles the Envoy API's descriptors for `pasactl proxy-config -o json`.
//!
//! The `.proto` files ship inside the envoy-types crate, found as
//! `proto/build_support/package_dir.rs` finds a package's sources; `PASA_ENVOY_PROTO_DIR` names
//! the directory outright (for vendored or unusual layouts). The descriptor set, without source
//! info, is written to `OUT_DIR/envoy_descriptors.bin` and included into pasactl.

#[path = "../../proto/build_support/package_dir.rs"]
mod package_dir;

use std::path::PathBuf;

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
    "envoy/extensions/filters/http/ext_authz/v3/ext_authz.proto",
    "envoy/extensions/filters/network/ext_authz/v3/ext_authz.proto",
    "envoy/extensions/filters/http/jwt_authn/v3/config.proto",
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

type BoxError = Box<dyn std::error::Error>;

fn main() -> Result<(), BoxError> {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../../Cargo.lock");
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
    Ok(package_dir::package_dir(
        "envoy-types",
        "PASA_ENVOY_PROTO_DIR",
        |dir| Some(dir.join("proto")).filter(|p| p.join("data-plane-api").is_dir()),
    )?)
}
