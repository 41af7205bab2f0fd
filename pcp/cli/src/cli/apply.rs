//! `pasactl apply -f FILE|DIR|-`.

use pasa_proto::store::v1::{ApplyDocument, ApplyOutcome, ApplyRequest, ApplyResponse, ObjectRef};

use super::get::kind_group_name;
use super::interrupt::Interrupt;
use super::{
    BATCH_TIMEOUT, CmdResult, FileArgs, Interrupted, REQUEST_TIMEOUT, Reported, UsageError,
    connect, error_text, fill_namespaces, object_name, out, problem_line, status_error, totals,
};
use pasa_validation::manifest::{self, Source};

#[derive(clap::Args, Debug)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub files: FileArgs,
    /// Namespace for documents that name none [default: default]; documents that name another
    /// are refused.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Check everything, write nothing. `--dry-run`, `--dry-run=server` and
    /// `--dry-run=client` all have the server check without writing; `--dry-run=none` writes.
    #[arg(long, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "server", value_parser = dry_run)]
    pub dry_run: Option<bool>,
    /// `name`: print each object as `kind.group/name` (kubectl's `-o name`), for scripts.
    #[arg(short = 'o', long, value_parser = names_only)]
    pub output: Option<Named>,
    /// Not supported: pasactl does not build kustomizations (the message says what to run).
    #[arg(short = 'k', long, value_name = "DIR")]
    pub kustomize: Option<String>,
}

/// `-o name`, the one output `apply` has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Named;

fn names_only(value: &str) -> Result<Named, UsageError> {
    match value {
        "name" => Ok(Named),
        "yaml" | "json" => Err(UsageError(format!(
            "apply -o {value}: apply prints what it did; `pasactl get KIND NAME -o {value}` shows the stored object"
        ))),
        other => Err(UsageError(format!(
            "apply -o {other:?}: apply prints `-o name` or its default lines"
        ))),
    }
}

/// `--dry-run[=server|client|none]`: every spelling of a dry run that users type.
fn dry_run(value: &str) -> Result<bool, UsageError> {
    match value {
        "server" | "client" | "true" => Ok(true),
        "none" | "false" => Ok(false),
        other => Err(UsageError(format!(
            "{other:?} is not a dry-run strategy: use --dry-run (or =server, =client) to check without writing, --dry-run=none to write"
        ))),
    }
}

pub async fn run(server: &crate::cli::Server, args: ApplyArgs) -> CmdResult {
    if let Some(dir) = &args.kustomize {
        return Err(UsageError(format!(
            "-k {dir}: pasactl does not build kustomizations; build it and apply the result: `kubectl kustomize {dir} | pasactl apply -f -`"
        ))
        .into());
    }
    if args.files.files.is_empty() {
        anyhow::bail!("apply needs -f FILE, -f DIR or -f -");
    }
    let dry_run = args.dry_run.unwrap_or(false);
    let mut docs = manifest::load(&args.files.files, args.files.recursive)?;
    if docs.is_empty() {
        anyhow::bail!("no objects passed to apply");
    }
    fill_namespaces(&mut docs, args.namespace.as_deref())?;
    let (sources, documents): (Vec<Source>, Vec<ApplyDocument>) = docs
        .into_iter()
        .map(|(source, doc)| {
            let document = ApplyDocument {
                json: doc.to_string(),
                expected_mod_revision: None,
            };
            (source, document)
        })
        .unzip();
    let client = server
        .within("a connection", REQUEST_TIMEOUT, connect(server))
        .await?;
    let batches = batches(documents.len(), |i| documents[i].json.len());
    let send = |range: std::ops::Range<usize>, dry_run: bool| {
        let mut client = client.clone();
        let documents = documents[range].to_vec();
        let request = async move {
            client
                .apply(ApplyRequest { documents, dry_run })
                .await
                .map_err(|status| status_error(server, status))
                .map(tonic::Response::into_inner)
        };
        server.within("the apply", BATCH_TIMEOUT, request)
    };
    let interrupt = Interrupt::listen();
    // Several batches are not one transaction: every batch is checked first, so that a bad
    // document anywhere still writes nothing.
    if batches.len() > 1 && !dry_run {
        let (mut problems, mut warnings) = (0, 0);
        for range in &batches {
            let response = tokio::select! {
                response = send(range.clone(), true) => response?,
                () = interrupt.pressed(1) => {
                    eprintln!("interrupted while checking the documents: nothing was written");
                    return Err(Interrupted.into());
                }
            };
            problems += report_errors(&sources[range.clone()], &response);
            warnings += response.warnings.len();
        }
        if problems > 0 {
            eprintln!(
                "error: {}; nothing was written",
                totals(problems, warnings, documents.len())
            );
            return Err(Reported.into());
        }
    }
    let suffix = if dry_run { " (dry run)" } else { "" };
    let mut written = Written::new(documents.len(), dry_run);
    for range in &batches {
        if interrupt.requested() {
            written.interrupted(&sources);
            return Err(Interrupted.into());
        }
        let Some(response) = interrupt.finish(send(range.clone(), dry_run)).await else {
            written.abandoned(&sources, &sources[range.clone()]);
            return Err(Interrupted.into());
        };
        let response = match response {
            Ok(response) => response,
            Err(e) if written.count > 0 => {
                // What was written before stays written: say so, and how to finish.
                eprintln!("error: {}", error_text(&e));
                eprintln!("{}", written.before(&sources[range.start]));
                return Err(Reported.into());
            }
            Err(e) => return Err(e),
        };
        let here = &sources[range.clone()];
        for w in &response.warnings {
            eprintln!(
                "Warning: {}",
                problem_line(here, w.index, w.r#ref.as_ref(), &w.field, &w.message)
            );
        }
        let problems = report_errors(here, &response);
        if problems > 0 {
            let written = if range.start == 0 || dry_run {
                "nothing was written".to_string()
            } else {
                format!(
                    "the {} object(s) before {} were written",
                    range.start, here[0]
                )
            };
            eprintln!(
                "error: {}; {written}",
                totals(problems, response.warnings.len(), range.len())
            );
            return Err(Reported.into());
        }
        // Each batch's results as it commits, so an interrupted or failed apply has shown what
        // it wrote.
        let mut text = String::new();
        // One result a document, in the documents' order.
        for (i, r) in response.results.iter().enumerate() {
            let Some(reference) = &r.r#ref else { continue };
            let outcome = match ApplyOutcome::try_from(r.outcome) {
                Ok(ApplyOutcome::Created) => "created",
                Ok(ApplyOutcome::Configured) => "configured",
                _ => "unchanged",
            };
            if args.output.is_some() {
                text.push_str(&kind_group_name(&reference.kind, &reference.name));
                text.push('\n');
            } else {
                text.push_str(&format!(
                    "{} {outcome}{suffix}\n",
                    object_name(&reference.kind, &reference.namespace, &reference.name)
                ));
            }
            written.last = Some((range.start + i, reference.clone()));
        }
        out(&text)?;
        written.count = range.end;
    }
    Ok(())
}

/// What an apply has written so far, to tell the user when it stops early.
struct Written {
    /// Documents written (the batches committed cover `0..count`).
    count: usize,
    total: usize,
    dry_run: bool,
    /// The last document written: its index and object.
    last: Option<(usize, ObjectRef)>,
}

impl Written {
    fn new(total: usize, dry_run: bool) -> Written {
        Written {
            count: 0,
            total,
            dry_run,
            last: None,
        }
    }

    /// `N of M objects were written, the last kind/ns/name (file document K)`.
    fn so_far(&self, sources: &[Source]) -> String {
        let verb = if self.dry_run {
            "were checked (dry run)"
        } else {
            "were written"
        };
        let last = match &self.last {
            Some((index, r)) => {
                let at = sources
                    .get(*index)
                    .map(|s| format!(" ({})", s))
                    .unwrap_or_default();
                format!(
                    ", the last {}{at}",
                    object_name(&r.kind, &r.namespace, &r.name)
                )
            }
            None => String::new(),
        };
        format!("{} of {} objects {verb}{last}", self.count, self.total)
    }

    /// Ctrl-C between batches: what was written, and how to finish.
    fn interrupted(&self, sources: &[Source]) {
        eprintln!(
            "interrupted: {}; the rest were not sent. {FINISH}",
            self.so_far(sources)
        );
    }

    /// A second Ctrl-C during the batch `in_flight`: it may or may not have been written.
    fn abandoned(&self, sources: &[Source], in_flight: &[Source]) {
        let (first, last) = match (in_flight.first(), in_flight.last()) {
            (Some(first), Some(last)) => (first.to_string(), last.to_string()),
            _ => return self.interrupted(sources),
        };
        eprintln!(
            "interrupted: {}; the batch in flight ({first} to {last}) may or may not have been written. {FINISH}",
            self.so_far(sources)
        );
    }

    /// After an error that ended the apply at the batch starting at `next`.
    fn before(&self, next: &Source) -> String {
        format!(
            "The {} object(s) before {} were written. {FINISH}",
            self.count, next,
        )
    }
}

/// How to finish an apply that stopped early.
const FINISH: &str = "Run the same apply again to write the rest: applying is idempotent (what is already written is reported unchanged)";

/// Documents per request: half the store's default batch limit (10,000), and at most half its
/// 64 MiB message limit, so big applies go in several requests.
const BATCH_DOCUMENTS: usize = 5_000;
const BATCH_BYTES: usize = 32 << 20;

/// Consecutive ranges of `count` items (item `i` is `size(i)` bytes), each within both limits.
pub fn batches(count: usize, size: impl Fn(usize) -> usize) -> Vec<std::ops::Range<usize>> {
    let mut ranges = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for i in 0..count {
        let size = size(i);
        if i > start && (i - start >= BATCH_DOCUMENTS || bytes + size > BATCH_BYTES) {
            ranges.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < count {
        ranges.push(start..count);
    }
    ranges
}

/// Prints the errors of one answer (indices relative to `sources`); how many there were.
fn report_errors(sources: &[Source], response: &ApplyResponse) -> usize {
    for e in &response.errors {
        let first = e
            .duplicate_of
            .and_then(|i| sources.get(i as usize))
            .map(|s| format!(" (first in {})", s))
            .unwrap_or_default();
        eprintln!(
            "error: {}{first}",
            problem_line(sources, e.index, e.r#ref.as_ref(), &e.field, &e.message)
        );
    }
    response.errors.len()
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
        let of = |docs: &[ApplyDocument]| batches(docs.len(), |i| docs[i].json.len());
        let many: Vec<_> = (0..12_001).map(|_| doc(10)).collect();
        assert_eq!(of(&many), [0..5_000, 5_000..10_000, 10_000..12_001]);
        let big = vec![doc(20 << 20), doc(20 << 20), doc(1)];
        assert_eq!(of(&big), [0..1, 1..3]);
        assert_eq!(of(&[doc(1)]).len(), 1);
        assert!(of(&[]).is_empty());
    }
}
