//! `pasactl apply -f FILE|DIR|-`.

use pasa_proto::store::v1::{ApplyDocument, ApplyOutcome, ApplyRequest, ApplyResponse};

use super::{CmdResult, FileArgs, Reported, connect, object_name, out, problem_line, status_error};
use pasa_validation::manifest::{self, Source};

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

pub async fn run(server: &crate::cli::Server, args: ApplyArgs) -> CmdResult {
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
    let client = connect(server).await?;
    let batches = batches(&documents);
    let send = |range: std::ops::Range<usize>, dry_run: bool| {
        let mut client = client.clone();
        let documents = documents[range].to_vec();
        async move {
            client
                .apply(ApplyRequest { documents, dry_run })
                .await
                .map_err(status_error)
                .map(tonic::Response::into_inner)
        }
    };
    // Several batches are not one transaction: every batch is checked first, so that a bad
    // document anywhere still writes nothing.
    if batches.len() > 1 && !args.dry_run {
        let mut problems = 0;
        for range in &batches {
            let response = send(range.clone(), true).await?;
            problems += report_errors(&sources[range.clone()], &response);
        }
        if problems > 0 {
            eprintln!("error: {problems} problem(s) found; nothing was written");
            return Err(Reported.into());
        }
    }
    let progress = Progress::new(documents.len(), batches.len());
    let mut results = Vec::new();
    for range in &batches {
        let response = send(range.clone(), args.dry_run).await?;
        let here = &sources[range.clone()];
        for w in &response.warnings {
            eprintln!(
                "Warning: {}",
                problem_line(here, w.index, w.r#ref.as_ref(), &w.field, &w.message)
            );
        }
        let problems = report_errors(here, &response);
        if problems > 0 {
            let written = if range.start == 0 || args.dry_run {
                "nothing was written".to_string()
            } else {
                format!(
                    "the {} object(s) before {} were written",
                    range.start, here[0]
                )
            };
            eprintln!("error: {problems} problem(s) found; {written}");
            return Err(Reported.into());
        }
        results.extend(response.results);
        progress.done(range.end);
    }
    let suffix = if args.dry_run { " (dry run)" } else { "" };
    let mut text = String::new();
    for r in &results {
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

/// Documents per request: half the store's default batch limit (10,000), and at most half its
/// 64 MiB message limit, so big applies go in several requests.
const BATCH_DOCUMENTS: usize = 5_000;
const BATCH_BYTES: usize = 32 << 20;

/// Consecutive ranges of `documents`, each within both limits.
fn batches(documents: &[ApplyDocument]) -> Vec<std::ops::Range<usize>> {
    let mut ranges = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, d) in documents.iter().enumerate() {
        let size = d.json.len();
        if i > start && (i - start >= BATCH_DOCUMENTS || bytes + size > BATCH_BYTES) {
            ranges.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < documents.len() {
        ranges.push(start..documents.len());
    }
    ranges
}

/// Prints the errors of one answer (indices relative to `sources`); how many there were.
fn report_errors(sources: &[Source], response: &ApplyResponse) -> usize {
    for e in &response.errors {
        let first = e
            .duplicate_of
            .and_then(|i| sources.get(i as usize))
            .map(|s| format!(" (first in {s})"))
            .unwrap_or_default();
        eprintln!(
            "error: {}{first}",
            problem_line(sources, e.index, e.r#ref.as_ref(), &e.field, &e.message)
        );
    }
    response.errors.len()
}

/// `applied N/M objects` on a terminal's stderr while several batches go.
struct Progress {
    total: usize,
    shown: bool,
}

impl Progress {
    fn new(total: usize, batches: usize) -> Progress {
        use std::io::IsTerminal as _;
        Progress {
            total,
            shown: batches > 1 && std::io::stderr().is_terminal(),
        }
    }

    fn done(&self, applied: usize) {
        if self.shown {
            let end = if applied == self.total { "\n" } else { "" };
            eprint!("\rapplied {applied}/{} objects{end}", self.total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_keep_within_both_limits() {
        let doc = |len: usize| ApplyDocument {
            json: "x".repeat(len),
            expected_mod_revision: None,
        };
        let many: Vec<_> = (0..12_001).map(|_| doc(10)).collect();
        assert_eq!(batches(&many), [0..5_000, 5_000..10_000, 10_000..12_001]);
        let big = vec![doc(20 << 20), doc(20 << 20), doc(1)];
        assert_eq!(batches(&big), [0..1, 1..3]);
        assert_eq!(batches(&[doc(1)]).len(), 1);
        assert!(batches(&[]).is_empty());
    }
}
