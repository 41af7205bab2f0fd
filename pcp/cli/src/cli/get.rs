//! `pasactl get KIND [NAME] [-n NS | -A] [-o yaml|json|wide]`.

use pasa_proto::Kind;
use pasa_proto::object::manifest;
use pasa_proto::store::v1::{GetRequest, ListRequest, ObjectRef, Resource, Rule, Subscription};
use serde_json::{Value, json};

use super::{CmdResult, REQUEST_TIMEOUT, connect, out, status_error, table};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Yaml,
    Json,
    Wide,
}

#[derive(clap::Args, Debug)]
pub struct GetArgs {
    /// Kind (vs, dr, se, gw, sidecar, we, sep or the full name).
    pub kind: String,
    /// Name of one object.
    pub name: Option<String>,
    /// Namespace.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Output format; a table by default.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Output>,
}

pub async fn run(server: &crate::cli::Server, args: GetArgs) -> CmdResult {
    let kind: Kind = args.kind.parse()?;
    let resources = server
        .within("`get`", REQUEST_TIMEOUT, fetch(server, kind, &args))
        .await?;
    let single = args.name.is_some();
    match args.output {
        Some(Output::Yaml) => out(&serde_saphyr::to_string(&document(&resources, single))?)?,
        Some(Output::Json) => out(&format!(
            "{}\n",
            serde_json::to_string_pretty(&document(&resources, single))?
        ))?,
        table => {
            if resources.is_empty() {
                if args.all_namespaces {
                    eprintln!("No resources found");
                } else {
                    eprintln!("No resources found in {} namespace.", args.namespace);
                }
                return Ok(());
            }
            out(&render_table(
                &resources,
                args.all_namespaces,
                table == Some(Output::Wide),
            ))?;
        }
    }
    Ok(())
}

/// The object named, or the objects of the kind in the namespace(s) asked.
async fn fetch(
    server: &crate::cli::Server,
    kind: Kind,
    args: &GetArgs,
) -> anyhow::Result<Vec<Resource>> {
    let mut client = connect(server).await?;
    let resources = match &args.name {
        Some(name) => {
            let reference = ObjectRef {
                kind: kind.as_str().to_string(),
                namespace: args.namespace.clone(),
                name: name.clone(),
            };
            match client
                .get(GetRequest {
                    r#ref: Some(reference),
                })
                .await
            {
                Ok(r) => r.into_inner().resource.into_iter().collect(),
                Err(s) if s.code() == tonic::Code::NotFound => {
                    anyhow::bail!(
                        "{}.{} \"{name}\" not found in namespace {}",
                        kind.plural(),
                        kind.group(),
                        args.namespace
                    )
                }
                Err(s) => return Err(status_error(server, s)),
            }
        }
        None => {
            let rule = Rule {
                kinds: vec![kind.as_str().to_string()],
                namespaces: if args.all_namespaces {
                    vec![]
                } else {
                    vec![args.namespace.clone()]
                },
                ..Default::default()
            };
            client
                .list(ListRequest {
                    selector: Some(Subscription { rules: vec![rule] }),
                    revision: 0,
                })
                .await
                .map_err(|status| status_error(server, status))?
                .into_inner()
                .resources
        }
    };
    Ok(resources)
}

/// One manifest, or a kubectl-style `List` of them.
fn document(resources: &[Resource], single: bool) -> Value {
    let items: Vec<Value> = resources.iter().map(manifest).collect();
    match (single, items.len()) {
        (true, 1) => items.into_iter().next().unwrap_or(Value::Null),
        _ => json!({"apiVersion": "v1", "kind": "List", "items": items}),
    }
}

fn render_table(resources: &[Resource], with_namespace: bool, wide: bool) -> String {
    let mut header = vec![];
    if with_namespace {
        header.push("NAMESPACE");
    }
    header.extend(["NAME", "HOSTS", "REVISION"]);
    if wide {
        header.extend(["GATEWAYS", "VERSION", "CREATED"]);
    }
    let mut rows: Vec<Vec<String>> = Vec::with_capacity(resources.len());
    for r in resources {
        let index = r.index.clone().unwrap_or_default();
        let list = |v: &[String]| {
            if v.is_empty() {
                "<none>".to_string()
            } else {
                v.join(",")
            }
        };
        let mut row = vec![];
        if with_namespace {
            row.push(r.namespace.clone());
        }
        row.extend([
            r.name.clone(),
            list(&index.hosts),
            r.mod_revision.to_string(),
        ]);
        if wide {
            row.extend([
                list(&index.gateways),
                r.version.to_string(),
                r.create_revision.to_string(),
            ]);
        }
        rows.push(row);
    }
    table::render(&header, &rows, table::KUBECTL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pasa_proto::store::v1::IndexKeys;

    #[test]
    fn tables_align_columns() {
        let r = Resource {
            kind: "VirtualService".into(),
            namespace: "default".into(),
            name: "reviews".into(),
            mod_revision: 7,
            version: 2,
            create_revision: 3,
            index: Some(IndexKeys {
                hosts: vec!["reviews.default.svc.cluster.local".into()],
                gateways: vec!["mesh".into()],
            }),
            ..Default::default()
        };
        let table = render_table(&[r], true, true);
        assert_eq!(
            table,
            "NAMESPACE   NAME      HOSTS                               REVISION   GATEWAYS   VERSION   CREATED\n\
             default     reviews   reviews.default.svc.cluster.local   7          mesh       2         3\n"
        );
    }
}
