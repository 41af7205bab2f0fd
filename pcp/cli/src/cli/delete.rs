//! `pasactl delete KIND NAME -n NS` and `pasactl delete -f FILE`.

use pasa_proto::Kind;
use pasa_proto::object::identity_of;
use pasa_proto::store::v1::{DeleteRequest, ObjectRef};

use super::interrupt::Interrupt;
use super::{
    BATCH_TIMEOUT, CmdResult, FileArgs, Interrupted, REQUEST_TIMEOUT, Reported, connect,
    error_text, object_name, out, status_error,
};
use pasa_validation::manifest;

#[derive(clap::Args, Debug)]
pub struct DeleteArgs {
    /// Kind (vs, dr, se, gw, sidecar, we, sep or the full name).
    pub kind: Option<String>,
    /// Names of the objects to delete.
    pub names: Vec<String>,
    #[command(flatten)]
    pub files: FileArgs,
    /// Namespace of the objects (or of documents that name none).
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Treat missing objects as deleted.
    #[arg(long)]
    pub ignore_not_found: bool,
}

pub async fn run(server: &crate::cli::Server, args: DeleteArgs) -> CmdResult {
    let refs: Vec<ObjectRef> = if !args.files.files.is_empty() {
        if args.kind.is_some() {
            anyhow::bail!("give either KIND NAME or -f FILE, not both");
        }
        manifest::load(&args.files.files, args.files.recursive)?
            .into_iter()
            .map(|(_, doc)| {
                let id = identity_of(&doc, &args.namespace);
                ObjectRef {
                    kind: id.kind,
                    namespace: id.namespace,
                    name: id.name,
                }
            })
            .collect()
    } else {
        let kind: Kind = args
            .kind
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("delete needs KIND NAME or -f FILE"))?
            .parse()?;
        if args.names.is_empty() {
            anyhow::bail!("delete needs the name of the {kind} to delete");
        }
        args.names
            .iter()
            .map(|name| ObjectRef {
                kind: kind.as_str().to_string(),
                namespace: args.namespace.clone(),
                name: name.clone(),
            })
            .collect()
    };
    let client = server
        .within("a connection", REQUEST_TIMEOUT, connect(server))
        .await?;
    // As apply: at most 5,000 objects a request, below the store's limit of 10,000 a batch.
    let batches = super::apply::batches(refs.len(), |i| {
        refs[i].kind.len() + refs[i].namespace.len() + refs[i].name.len()
    });
    let interrupt = Interrupt::listen();
    let mut deleted = 0;
    for range in &batches {
        if interrupt.requested() {
            eprintln!(
                "interrupted: {deleted} of {} objects were deleted{}; the rest were not sent. {FINISH}",
                refs.len(),
                last_deleted(&refs[..deleted]),
            );
            return Err(Interrupted.into());
        }
        let mut client = client.clone();
        let request = DeleteRequest {
            refs: refs[range.clone()].to_vec(),
            expected_mod_revision: None,
            ignore_not_found: args.ignore_not_found,
        };
        let call = async move {
            client
                .delete(request)
                .await
                .map_err(|status| status_error(server, status))
                .map(tonic::Response::into_inner)
        };
        let request = server.within("the delete", BATCH_TIMEOUT, call);
        let Some(response) = interrupt.finish(request).await else {
            eprintln!(
                "interrupted: {deleted} of {} objects were deleted{}; the batch in flight may or may not have been deleted. {FINISH}",
                refs.len(),
                last_deleted(&refs[..deleted]),
            );
            return Err(Interrupted.into());
        };
        let response = match response {
            Ok(response) => response,
            Err(e) if deleted > 0 => {
                eprintln!("error: {}", error_text(&e));
                eprintln!(
                    "The {deleted} object(s) before {} were deleted. {FINISH}",
                    name_of(&refs[range.start]),
                );
                return Err(Reported.into());
            }
            Err(e) => return Err(e),
        };
        if !response.errors.is_empty() {
            for e in &response.errors {
                eprintln!("error: {}", e.message);
            }
            if deleted == 0 {
                eprintln!("error: nothing was deleted");
            } else {
                eprintln!(
                    "error: the {deleted} object(s) before {} were deleted; nothing after",
                    name_of(&refs[range.start])
                );
            }
            return Err(Reported.into());
        }
        // Each batch's results as it commits.
        let text: String = response
            .deleted
            .iter()
            .filter_map(|d| d.r#ref.as_ref())
            .map(|r| format!("{} deleted\n", name_of(r)))
            .collect();
        out(&text)?;
        deleted = range.end;
    }
    Ok(())
}

/// How to finish a delete that stopped early.
const FINISH: &str = "Run the same delete again with --ignore-not-found to delete the rest";

fn name_of(r: &ObjectRef) -> String {
    object_name(&r.kind, &r.namespace, &r.name)
}

/// `, the last kind/ns/name` of what was deleted; empty when nothing was.
fn last_deleted(deleted: &[ObjectRef]) -> String {
    deleted
        .last()
        .map(|r| format!(", the last {}", name_of(r)))
        .unwrap_or_default()
}
