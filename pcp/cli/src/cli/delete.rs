//! `pasactl delete KIND NAME -n NS` and `pasactl delete -f FILE`.

use pasa_proto::Kind;
use pasa_proto::object::identity_of;
use pasa_proto::store::v1::{DeleteRequest, ObjectRef};

use super::{CmdResult, FileArgs, Reported, connect, object_name, out, status_error};
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
    let mut client = connect(server).await?;
    let response = client
        .delete(DeleteRequest {
            refs,
            expected_mod_revision: None,
            ignore_not_found: args.ignore_not_found,
        })
        .await
        .map_err(status_error)?
        .into_inner();
    if !response.errors.is_empty() {
        for e in &response.errors {
            eprintln!("error: {}", e.message);
        }
        eprintln!("error: nothing was deleted");
        return Err(Reported.into());
    }
    let text: String = response
        .deleted
        .iter()
        .filter_map(|d| d.r#ref.as_ref())
        .map(|r| format!("{} deleted\n", object_name(&r.kind, &r.namespace, &r.name)))
        .collect();
    out(&text)?;
    Ok(())
}
