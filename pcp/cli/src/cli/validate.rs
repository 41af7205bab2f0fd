//! `pasactl validate -f FILE|DIR|-`: the same checks as the write path, offline (no server).

use super::{CmdResult, FileArgs, Reported, fill_namespaces, problem_line, totals};
use pasa_validation::admission;
use pasa_validation::manifest::{self, Source};

#[derive(clap::Args, Debug)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub files: FileArgs,
    /// Namespace for documents that name none [default: default]; documents that name another
    /// are refused, as by apply.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Kubernetes cluster domain, for resolving short host names.
    #[arg(long, default_value = pasa_istio::host::DEFAULT_DOMAIN_SUFFIX)]
    pub domain_suffix: String,
}

pub fn run(args: ValidateArgs) -> CmdResult {
    if args.files.files.is_empty() {
        anyhow::bail!("validate needs -f FILE, -f DIR or -f -");
    }
    let mut docs = manifest::load(&args.files.files, args.files.recursive)?;
    if docs.is_empty() {
        anyhow::bail!("no objects passed to validate");
    }
    fill_namespaces(&mut docs, args.namespace.as_deref())?;
    let namespace = args.namespace.as_deref().unwrap_or("default");
    let (sources, values): (Vec<Source>, Vec<_>) =
        docs.into_iter().map(|(s, v)| (s, Ok(v))).unzip();
    let mut checked = admission::check_documents(&values, namespace);
    // Offline, the only other resources are the ones given together.
    admission::analyze(&mut checked, &[], &args.domain_suffix);
    for e in &checked.errors {
        eprintln!(
            "error: {}",
            problem_line(&sources, e.index, e.r#ref.as_ref(), &e.field, &e.message)
        );
    }
    for w in &checked.warnings {
        eprintln!(
            "Warning: {}",
            problem_line(&sources, w.index, w.r#ref.as_ref(), &w.field, &w.message)
        );
    }
    let documents = values.len();
    if !checked.errors.is_empty() {
        eprintln!(
            "error: {}",
            totals(checked.errors.len(), checked.warnings.len(), documents)
        );
        return Err(Reported.into());
    }
    super::out(&format!(
        "{documents} document(s) valid, {} warning(s)\n",
        checked.warnings.len()
    ))?;
    Ok(())
}
