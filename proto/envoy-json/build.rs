//! The Envoy API's descriptors, for printing Envoy resources as protobuf JSON and reading
//! EnvoyFilter patch values back into them.
//!
//! envoy-types generated its Rust types from a descriptor set it ships (`src/generated/types.bin`):
//! using that same set keeps the descriptors and the types in step, covers every Envoy extension
//! (an EnvoyFilter may name any of them in a `typed_config`), and needs no compiler here. It is
//! found as `proto/build_support/package_dir.rs` finds a package's sources
//! (`PASA_ENVOY_TYPES_DIR` names envoy-types' folder outright), stripped of its source info (only
//! names and types are needed) and written to `OUT_DIR/envoy_descriptors.bin`.

#[path = "../build_support/package_dir.rs"]
mod package_dir;

use std::path::PathBuf;

use prost::Message;
use prost_types::FileDescriptorSet;

/// Where envoy-types keeps its descriptor set, inside its folder.
const DESCRIPTOR_SET: &str = "src/generated/types.bin";

type BoxError = Box<dyn std::error::Error>;

fn main() -> Result<(), BoxError> {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../../Cargo.lock");
    let file = package_dir::package_dir("envoy-types", "PASA_ENVOY_TYPES_DIR", |dir| {
        Some(dir.join(DESCRIPTOR_SET)).filter(|f| f.is_file())
    })?;
    let bytes = std::fs::read(&file).map_err(|e| format!("reading {}: {e}", file.display()))?;
    let mut set = FileDescriptorSet::decode(bytes.as_slice())
        .map_err(|e| format!("decoding {}: {e}", file.display()))?;
    for f in &mut set.file {
        f.source_code_info = None;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("envoy_descriptors.bin");
    std::fs::write(&out, set.encode_to_vec())?;
    Ok(())
}
