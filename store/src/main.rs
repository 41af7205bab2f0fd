//! `pasa-store`: the standalone store server. It admits what PCP admits: every batch written to
//! it directly is checked with PCP's Istio validation first (batches PCP relays were checked by
//! PCP already).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::sync::Arc;

use clap::Parser;
use pasa_proto::store::v1::{ApplyDocument, DocumentError};
use pasa_store::server::ServerArgs;
use pasa_store::service::{Admission, BatchRefused};
use pasa_validation::admission;
use pasa_validation::validation::Author;

/// The PASA store (UCS): on embedded sled by default, or on TiKV, where several replicas share
/// one cluster.
#[derive(Parser, Debug)]
#[command(name = "pasa-store", version)]
struct Args {
    #[command(flatten)]
    server: ServerArgs,
}

/// Istio validation, as PCP's API applies it to what users write.
struct IstioValidation;

impl Admission for IstioValidation {
    fn check(&self, documents: &[ApplyDocument]) -> Result<Vec<DocumentError>, BatchRefused> {
        admission::check_batch_size(documents.iter().map(|d| d.json.len()))
            .map_err(|e| BatchRefused(Box::new(e)))?;
        Ok(admission::check_batch(documents, "default", Author::User).errors)
    }
}

fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => return pasa_runtime::error::exit(&e),
    };
    let served = runtime.block_on(
        Args::parse()
            .server
            .run_admitting("pasa-store", Some(Arc::new(IstioValidation))),
    );
    // A check still running on a blocking thread does not hold the exit: the server has
    // stopped, and the batch it was checking is written nowhere.
    runtime.shutdown_timeout(pasa_runtime::drain::DRAIN_DEADLINE);
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => pasa_runtime::error::exit(e.as_ref()),
    }
}
