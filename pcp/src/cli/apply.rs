//! `pasactl apply -f FILE|DIR|-`.

use pasa_proto::store::v1::{ApplyDocument, ApplyOutcome, ApplyRequest};

use super::{CmdResult, FileArgs, Reported, connect, object_name, out, problem_line, status_error};
use crate::manifest::{self, Source};

#[derive(clap::Args, Debug)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub files: FileArgs,
    /// Namespace for documents that name none.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Check everything, write nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub async fn run(server: &str, args: ApplyArgs) -> CmdResult {
    if args.files.files.is_empty() {
        anyhow::bail!("apply needs -f FILE, -f DIR or -f -");
    }
    let docs = manifest::load(&args.files.files, args.files.recursive)?;
    if docs.is_empty() {
        anyhow::bail!("no objects passed to apply");
    }
    let (sources, documents): (Vec<Source>, Vec<ApplyDocument>) = docs
        .into_iter()
        .map(|(source, mut doc)| {
            if let Some(meta) = doc.get_mut("metadata").and_then(|m| m.as_object_mut())
                && meta
                    .get("namespace")
                    .is_none_or(|ns| ns.is_null() || ns.as_str() == Some(""))
            {
                meta.insert("namespace".into(), args.namespace.clone().into());
            }
            let document = ApplyDocument {
                json: doc.to_string(),
                expected_mod_revision: None,
            };
            (source, document)
        })
        .unzip();
    let mut client = connect(server).await?;
    let response = client
        .apply(ApplyRequest {
            documents,
            dry_run: args.dry_run,
        })
        .await
        .map_err(status_error)?
        .into_inner();
    for w in &response.warnings {
        eprintln!(
            "Warning: {}",
            problem_line(&sources, w.index, w.r#ref.as_ref(), &w.field, &w.message)
        );
    }
    if !response.errors.is_empty() {
        for e in &response.errors {
            let first = e
                .duplicate_of
                .and_then(|i| sources.get(i as usize))
                .map(|s| format!(" (first in {s})"))
                .unwrap_or_default();
            eprintln!(
                "error: {}{first}",
                problem_line(&sources, e.index, e.r#ref.as_ref(), &e.field, &e.message)
            );
        }
        eprintln!(
            "error: {} problem(s) found; nothing was written",
            response.errors.len()
        );
        return Err(Reported.into());
    }
    let suffix = if args.dry_run { " (dry run)" } else { "" };
    let mut text = String::new();
    for r in &response.results {
        let Some(reference) = &r.r#ref else { continue };
        let outcome = match ApplyOutcome::try_from(r.outcome) {
            Ok(ApplyOutcome::Created) => "created",
            Ok(ApplyOutcome::Configured) => "configured",
            _ => "unchanged",
        };
        text.push_str(&format!(
            "{} {outcome}{suffix}\n",
            object_name(&reference.kind, &reference.namespace, &reference.name)
        ));
    }
    out(&text)?;
    Ok(())
}
