//! `pasactl delete KIND NAME -n NS` and `pasactl delete -f FILE`.

use pasa_proto::Kind;
use pasa_proto::object::identity_of;
use pasa_proto::store::v1::{DeleteRequest, ObjectRef};

use super::get::{each_listed, selects};
use super::interrupt::Interrupt;
use super::selector;
use super::{
    BATCH_TIMEOUT, CmdResult, FileArgs, Interrupted, REQUEST_TIMEOUT, Reported, UsageError,
    connect, error_text, fill_namespaces, object_name, out, status_error,
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
    /// Namespace of the objects, or of documents that name none [default: default]; documents
    /// that name another are refused.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Treat missing objects as deleted.
    #[arg(long)]
    pub ignore_not_found: bool,
    /// Every object of the kinds whose labels the selector selects (`app=web`; as kubectl).
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,
    /// Every object of the kinds, in the namespace (or every namespace with -A).
    #[arg(long)]
    pub all: bool,
    /// With --all or -l: in every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Not supported: deleting has no dry run (see the message for what to do).
    #[arg(long, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "server")]
    pub dry_run: Option<String>,
}

/// The objects of `KIND NAME...` or `KIND/NAME...` in `namespace` (`delete`, `x wait`).
pub fn named(first: &str, rest: &[String], namespace: &str) -> anyhow::Result<Vec<ObjectRef>> {
    let object = |kind: &str, name: &str| -> anyhow::Result<ObjectRef> {
        let kind: Kind = kind.parse()?;
        Ok(ObjectRef {
            kind: kind.as_str().to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    };
    if first.contains('/') {
        return std::iter::once(first)
            .chain(rest.iter().map(String::as_str))
            .map(|arg| match arg.split_once('/') {
                Some((kind, name)) if !kind.is_empty() && !name.is_empty() => object(kind, name),
                _ => Err(UsageError(format!(
                    "{arg:?}: after KIND/NAME, give every object as KIND/NAME (e.g. vs/cart)"
                ))
                .into()),
            })
            .collect();
    }
    if rest.is_empty() {
        let kind: Kind = first.parse()?;
        anyhow::bail!("delete needs the name of the {kind} to delete (KIND NAME or KIND/NAME)");
    }
    rest.iter().map(|name| object(first, name)).collect()
}

/// The objects `--all` or `-l` name: listed, and kept when the selector selects them.
async fn listed(server: &crate::cli::Server, args: &DeleteArgs) -> anyhow::Result<Vec<ObjectRef>> {
    let what = if args.all { "--all" } else { "-l" };
    let Some(kinds) = args.kind.as_deref() else {
        return Err(UsageError(format!(
            "{what} needs the kinds to delete: `delete vs {what} -n NS`"
        ))
        .into());
    };
    if !args.names.is_empty() || !args.files.files.is_empty() || kinds.contains('/') {
        return Err(UsageError(format!(
            "{what} deletes every object of the kinds it selects: give no names and no -f"
        ))
        .into());
    }
    let kinds = kinds
        .split(',')
        .filter(|k| !k.is_empty())
        .map(str::parse)
        .collect::<Result<Vec<Kind>, _>>()?;
    let selector = args.selector.as_deref().map(selector::parse).transpose()?;
    let namespace = args.namespace.as_deref().unwrap_or("default");
    let namespace = (!args.all_namespaces).then_some(namespace);
    let mut refs = Vec::new();
    each_listed(server, &kinds, namespace, |r| {
        if selects(selector.as_ref(), r) {
            refs.push(ObjectRef {
                kind: r.kind.clone(),
                namespace: r.namespace.clone(),
                name: r.name.clone(),
            });
        }
        Ok(())
    })
    .await?;
    Ok(refs)
}

pub async fn run(server: &crate::cli::Server, args: DeleteArgs) -> CmdResult {
    let namespace = args.namespace.as_deref().unwrap_or("default");
    let scope = format!(" -n {namespace}");
    if args.dry_run.as_deref().is_some_and(|d| d != "none") {
        return Err(UsageError(
            format!("deleting has no dry run: `pasactl get KIND NAME{scope}` shows what is there; drop --dry-run to delete"),
        )
        .into());
    }
    if args.all_namespaces && !args.all && args.selector.is_none() {
        return Err(UsageError(
            "-A goes with --all or -l: a name names an object of one namespace (-n)".into(),
        )
        .into());
    }
    let refs: Vec<ObjectRef> = if args.all || args.selector.is_some() {
        let refs = listed(server, &args).await?;
        if refs.is_empty() {
            eprintln!("No resources found");
            return Ok(());
        }
        refs
    } else if !args.files.files.is_empty() {
        if args.kind.is_some() {
            anyhow::bail!("give either KIND NAME or -f FILE, not both");
        }
        let mut docs = manifest::load(&args.files.files, args.files.recursive)?;
        fill_namespaces(&mut docs, args.namespace.as_deref())?;
        docs.into_iter()
            .map(|(_, doc)| {
                let id = identity_of(&doc, namespace);
                ObjectRef {
                    kind: id.kind,
                    namespace: id.namespace,
                    name: id.name,
                }
            })
            .collect()
    } else {
        let first = args
            .kind
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("delete needs KIND NAME, KIND/NAME or -f FILE"))?;
        named(first, &args.names, namespace)?
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_kind_name_or_kind_slash_name() {
        let refs = named("vs/cart", &["dr/cart".into()], "shop").unwrap();
        let got: Vec<_> = refs
            .iter()
            .map(|r| object_name(&r.kind, &r.namespace, &r.name))
            .collect();
        assert_eq!(
            got,
            ["virtualservice/shop/cart", "destinationrule/shop/cart"]
        );
        let refs = named("vs", &["a".into(), "b".into()], "default").unwrap();
        assert_eq!(refs.len(), 2);
        let mixed = named("vs/cart", &["storefront".into()], "shop")
            .unwrap_err()
            .to_string();
        assert!(mixed.contains("give every object as KIND/NAME"), "{mixed}");
        let bare = named("vs", &[], "shop").unwrap_err().to_string();
        assert!(bare.contains("KIND/NAME"), "{bare}");
    }
}
