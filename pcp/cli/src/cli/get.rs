//! `pasactl get KIND[,KIND...] [NAME] [-n NS | -A] [-o yaml|json|wide|name]`.
//!
//! A list is read as the store sends a watch's snapshot, page by page, and each object is
//! written out as it comes: a mesh of any size is listed in bounded memory (a table keeps only
//! its rows, to align their columns).

use std::collections::BTreeMap;
use std::io::Write;

use pasa_istio::label_selector::LabelSelector;
use pasa_proto::Kind;
use pasa_proto::object::manifest;
use pasa_proto::store::v1::{
    GetRequest, ObjectRef, Resource, Rule, SubscriberIdentity, Subscription,
};
use pasa_proto::watch::{Watch, WatchError, WatchEvent, WatchStart};

use super::{CmdResult, REQUEST_TIMEOUT, UsageError, connect, out, selector, status_error, table};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Yaml,
    Json,
    Wide,
    /// `kind.group/name`, one a line.
    Name,
}

/// `-o`: the formats get prints, and kubectl's templates refused with what does the same.
fn output(value: &str) -> Result<Output, UsageError> {
    use clap::ValueEnum;
    if let Ok(output) = Output::from_str(value, true) {
        return Ok(output);
    }
    let kind = value.split_once('=').map_or(value, |(k, _)| k);
    Err(UsageError(match kind {
        "jsonpath" | "jsonpath-as-json" | "custom-columns" | "go-template" | "template" => format!(
            "-o {kind}: pasactl has no templates; pick fields from -o json, e.g. `pasactl get vs -o json | jq -r '.items[].metadata.name'`"
        ),
        _ => format!("-o {value:?}: give yaml, json, wide or name"),
    }))
}

#[derive(clap::Args, Debug)]
pub struct GetArgs {
    /// Kinds, comma-separated (vs, dr, se, gw, sidecar, we, sep or the full names: `vs,dr`),
    /// or `KIND/NAME` for one object.
    pub kind: String,
    /// Name of one object.
    pub name: Option<String>,
    /// Namespace.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Output format (yaml, json, wide, name); a table by default.
    #[arg(short = 'o', long, value_parser = output)]
    pub output: Option<Output>,
    /// Tables without their header line.
    #[arg(long)]
    pub no_headers: bool,
    /// Only objects whose labels the selector selects (`app=web`, `env in (a,b)`, `!legacy`;
    /// as kubectl). The store does not index labels: the kinds asked are listed and filtered.
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,
    /// A LABELS column in tables.
    #[arg(long)]
    pub show_labels: bool,
    /// Not supported: `pasactl watch` follows changes (see the message).
    #[arg(short = 'w', long)]
    pub watch: bool,
}

/// What `get` was asked for: kinds, and a name for one object or a label selector.
#[derive(Debug)]
struct Asked {
    kinds: Vec<Kind>,
    name: Option<String>,
    selector: Option<LabelSelector>,
}

impl GetArgs {
    /// The kinds and name of the command line; flags `get` cannot serve are refused with what
    /// to use instead.
    fn asked(&self) -> anyhow::Result<Asked> {
        let (kinds, name) = match self.kind.split_once('/') {
            Some((kind, name)) if self.name.is_none() => (kind, Some(name.to_string())),
            Some(_) => {
                return Err(UsageError(format!(
                    "give the object as {} or as KIND NAME, not both",
                    self.kind
                ))
                .into());
            }
            None => (self.kind.as_str(), self.name.clone()),
        };
        let mut parsed: Vec<Kind> = Vec::new();
        for kind in kinds.split(',').filter(|k| !k.is_empty()) {
            let kind: Kind = kind.parse()?;
            if !parsed.contains(&kind) {
                parsed.push(kind);
            }
        }
        if parsed.is_empty() {
            return Err(UsageError("get needs a kind, e.g. `get vs` or `get vs,dr`".into()).into());
        }
        if name.is_some() && parsed.len() > 1 {
            return Err(UsageError(format!(
                "a NAME needs one kind, not {kinds}: run get once for each kind"
            ))
            .into());
        }
        let names = || {
            parsed
                .iter()
                .map(|k| k.short_names().first().copied().unwrap_or(k.plural()))
                .collect::<Vec<_>>()
                .join(",")
        };
        let scope = if self.all_namespaces {
            String::new()
        } else {
            format!(" -n {}", self.namespace)
        };
        let selector = self.selector.as_deref().map(selector::parse).transpose()?;
        if selector.is_some() && name.is_some() {
            return Err(UsageError(
                "a NAME and -l cannot go together (kubectl refuses them too): give one".into(),
            )
            .into());
        }
        if self.watch {
            return Err(UsageError(format!(
                "get -w: follow changes with `pasactl watch --kind {}{scope}` (one JSON line per change, after a snapshot)",
                names()
            ))
            .into());
        }
        Ok(Asked {
            kinds: parsed,
            name,
            selector,
        })
    }
}

pub async fn run(server: &crate::cli::Server, args: GetArgs) -> CmdResult {
    let asked = args.asked()?;
    if let (Some(name), [kind]) = (&asked.name, asked.kinds.as_slice()) {
        let resource = server
            .within(
                "`get`",
                REQUEST_TIMEOUT,
                get_one(server, *kind, name, &args.namespace),
            )
            .await?;
        let text = match args.output {
            Some(Output::Yaml) => serde_saphyr::to_string(&manifest(&resource))?,
            Some(Output::Json) => {
                format!("{}\n", serde_json::to_string_pretty(&manifest(&resource))?)
            }
            Some(Output::Name) => format!("{}\n", name_of(&resource)),
            table => render_table(
                &[resource],
                Columns {
                    with_namespace: args.all_namespaces,
                    wide: table == Some(Output::Wide),
                    with_kind: false,
                    labels: args.show_labels,
                    no_headers: args.no_headers,
                },
            ),
        };
        out(&text)?;
        return Ok(());
    }
    let mut sink = Sink::new(
        args.output,
        Columns {
            with_namespace: args.all_namespaces,
            wide: args.output == Some(Output::Wide),
            with_kind: asked.kinds.len() > 1,
            labels: args.show_labels,
            no_headers: args.no_headers,
        },
    );
    let namespace = (!args.all_namespaces).then_some(args.namespace.as_str());
    each_listed(server, &asked.kinds, namespace, |r| {
        if selects(asked.selector.as_ref(), r) {
            sink.write(r)?;
        }
        Ok(())
    })
    .await?;
    if sink.finish()? == 0 && matches!(args.output, None | Some(Output::Wide)) {
        if args.all_namespaces {
            eprintln!("No resources found");
        } else {
            eprintln!("No resources found in {} namespace.", args.namespace);
        }
    }
    Ok(())
}

/// The object named; an error saying how to list them when it is not there.
pub async fn get_one(
    server: &crate::cli::Server,
    kind: Kind,
    name: &str,
    namespace: &str,
) -> anyhow::Result<Resource> {
    let mut client = connect(server).await?;
    let reference = ObjectRef {
        kind: kind.as_str().to_string(),
        namespace: namespace.to_string(),
        name: name.to_string(),
    };
    match client
        .get(GetRequest {
            r#ref: Some(reference),
        })
        .await
    {
        Ok(r) => r
            .into_inner()
            .resource
            .ok_or_else(|| not_found(kind, name, namespace)),
        Err(s) if s.code() == tonic::Code::NotFound => Err(not_found(kind, name, namespace)),
        Err(s) => Err(status_error(server, s)),
    }
}

fn not_found(kind: Kind, name: &str, namespace: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{}.{} \"{name}\" not found in namespace {namespace} (list them with `pasactl get {} -n {namespace}`)",
        kind.plural(),
        kind.group(),
        kind.plural(),
    )
}

/// Whether `selector` (none: everything) selects `r` by its labels.
pub fn selects(selector: Option<&LabelSelector>, r: &Resource) -> bool {
    selector.is_none_or(|s| {
        let labels: BTreeMap<String, String> = r
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        s.matches(&labels)
    })
}

/// Gives `each` the objects of `kinds` in `namespace` (every namespace with none), page by page
/// as the store sends its snapshot; each page must come within the request deadline.
pub async fn each_listed(
    server: &crate::cli::Server,
    kinds: &[Kind],
    namespace: Option<&str>,
    mut each: impl FnMut(&Resource) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let rule = Rule {
        kinds: kinds.iter().map(|k| k.as_str().to_string()).collect(),
        namespaces: namespace.map(str::to_string).into_iter().collect(),
        ..Default::default()
    };
    let start = WatchStart {
        subscription: Subscription { rules: vec![rule] },
        from_revision: 0,
        identity: Some(SubscriberIdentity {
            node_id: String::new(),
            metadata: [("client".to_string(), "pasactl get".to_string())].into(),
        }),
    };
    let open = async {
        let mut client = connect(server).await?;
        Watch::open(&mut client, start).await.map_err(|e| match e {
            WatchError::Refused(status) | WatchError::Failed(status) => {
                status_error(server, status)
            }
            e => e.into(),
        })
    };
    let mut stream = server.within("`get`", REQUEST_TIMEOUT, open).await?;
    loop {
        let page = async {
            stream.next().await.map_err(|e| match e {
                WatchError::Refused(status) | WatchError::Failed(status) => {
                    status_error(server, status)
                }
                e => anyhow::anyhow!("the list ended early: {e} (run get again)"),
            })
        };
        match server.within("`get`", REQUEST_TIMEOUT, page).await? {
            WatchEvent::InitApply { objects, .. } => {
                for r in &objects {
                    each(r)?;
                }
            }
            WatchEvent::InitDone { .. } => return Ok(()),
            _ => {}
        }
    }
}

/// Where listed objects go as they are read: straight to stdout (YAML, JSON, names), or rows
/// kept for a table.
enum Sink {
    Yaml(Items),
    Json(Items),
    Name(Items),
    /// Rows by kind, namespace and name, to be sorted and aligned at the end.
    Table {
        rows: Vec<((String, String, String), Vec<String>)>,
        columns: Columns,
    },
}

/// Standard output and how many objects went to it.
struct Items {
    stdout: std::io::BufWriter<std::io::Stdout>,
    count: usize,
}

impl Sink {
    fn new(output: Option<Output>, columns: Columns) -> Sink {
        let items = || Items {
            stdout: std::io::BufWriter::new(std::io::stdout()),
            count: 0,
        };
        match output {
            Some(Output::Yaml) => Sink::Yaml(items()),
            Some(Output::Json) => Sink::Json(items()),
            Some(Output::Name) => Sink::Name(items()),
            _ => Sink::Table {
                rows: Vec::new(),
                columns,
            },
        }
    }

    fn write(&mut self, r: &Resource) -> anyhow::Result<()> {
        match self {
            Sink::Yaml(items) => {
                if items.count == 0 {
                    items
                        .stdout
                        .write_all(b"apiVersion: v1\nkind: List\nitems:\n")?;
                }
                let text = serde_saphyr::to_string(&manifest(r))?;
                let text = text.strip_prefix("---\n").unwrap_or(&text);
                for (i, line) in text.lines().enumerate() {
                    let indent = if i == 0 {
                        "- "
                    } else if line.is_empty() {
                        ""
                    } else {
                        "  "
                    };
                    writeln!(items.stdout, "{indent}{line}")?;
                }
                items.count += 1;
            }
            Sink::Json(items) => {
                let lead: &[u8] = if items.count == 0 {
                    b"{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"List\",\n  \"items\": [\n"
                } else {
                    b",\n"
                };
                items.stdout.write_all(lead)?;
                let text = serde_json::to_string_pretty(&manifest(r))?;
                for (i, line) in text.lines().enumerate() {
                    let sep = if i == 0 { "" } else { "\n" };
                    write!(items.stdout, "{sep}    {line}")?;
                }
                items.count += 1;
            }
            Sink::Name(items) => {
                writeln!(items.stdout, "{}", name_of(r))?;
                items.count += 1;
            }
            Sink::Table { rows, columns } => rows.push((
                (r.kind.clone(), r.namespace.clone(), r.name.clone()),
                columns.row(r),
            )),
        }
        Ok(())
    }

    /// Ends the output; how many objects it had.
    fn finish(self) -> anyhow::Result<usize> {
        match self {
            Sink::Yaml(mut items) => {
                if items.count == 0 {
                    items
                        .stdout
                        .write_all(b"apiVersion: v1\nkind: List\nitems: []\n")?;
                }
                items.stdout.flush()?;
                Ok(items.count)
            }
            Sink::Json(mut items) => {
                if items.count == 0 {
                    items.stdout.write_all(
                        b"{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"List\",\n  \"items\": []\n}\n",
                    )?;
                } else {
                    items.stdout.write_all(b"\n  ]\n}\n")?;
                }
                items.stdout.flush()?;
                Ok(items.count)
            }
            Sink::Name(mut items) => {
                items.stdout.flush()?;
                Ok(items.count)
            }
            Sink::Table { mut rows, columns } => {
                let count = rows.len();
                rows.sort_by(|(a, _), (b, _)| a.cmp(b));
                // One table a kind, each row moved into it.
                let mut text = String::new();
                let mut cells: Vec<Vec<String>> = Vec::new();
                let mut kind: Option<String> = None;
                let flush = |cells: &mut Vec<Vec<String>>, text: &mut String| {
                    if cells.is_empty() {
                        return;
                    }
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&columns.render(cells));
                    cells.clear();
                };
                for ((k, ..), row) in rows {
                    if kind.as_ref().is_some_and(|seen| *seen != k) {
                        flush(&mut cells, &mut text);
                    }
                    kind = Some(k);
                    cells.push(row);
                }
                flush(&mut cells, &mut text);
                out(&text)?;
                Ok(count)
            }
        }
    }
}

/// `kind.group/name`, as `-o name` prints an object.
fn name_of(r: &Resource) -> String {
    kind_group_name(&r.kind, &r.name)
}

/// `kind.group/name`, as kubectl's `-o name` names an object of `kind`.
pub fn kind_group_name(kind: &str, name: &str) -> String {
    match kind.parse::<Kind>() {
        Ok(kind) => format!(
            "{}.{}/{name}",
            kind.as_str().to_ascii_lowercase(),
            kind.group(),
        ),
        Err(_) => format!("{}/{name}", kind.to_ascii_lowercase()),
    }
}

/// The columns of a table; with `with_kind`, names are `kind/name` (several kinds listed).
#[derive(Clone, Copy)]
struct Columns {
    with_namespace: bool,
    wide: bool,
    with_kind: bool,
    /// `--show-labels`.
    labels: bool,
    /// `--no-headers`.
    no_headers: bool,
}

impl Columns {
    /// `rows` under the header (unless `--no-headers`), aligned as kubectl aligns them.
    fn render(self, rows: &[Vec<String>]) -> String {
        let text = table::render(&self.header(), rows, table::KUBECTL);
        if self.no_headers {
            text.split_once('\n')
                .map_or(String::new(), |(_, rows)| rows.to_string())
        } else {
            text
        }
    }

    fn header(self) -> Vec<&'static str> {
        let mut header = vec![];
        if self.with_namespace {
            header.push("NAMESPACE");
        }
        header.extend(["NAME", "HOSTS", "REVISION"]);
        if self.wide {
            header.extend(["GATEWAYS", "VERSION", "CREATED"]);
        }
        if self.labels {
            header.push("LABELS");
        }
        header
    }

    /// The row of `r`: only its text is kept, not the object.
    fn row(self, r: &Resource) -> Vec<String> {
        let list = |v: Option<&Vec<String>>| match v {
            Some(v) if !v.is_empty() => v.join(","),
            _ => "<none>".to_string(),
        };
        let index = r.index.as_ref();
        let mut row = vec![];
        if self.with_namespace {
            row.push(r.namespace.clone());
        }
        let name = if self.with_kind {
            format!("{}/{}", r.kind.to_ascii_lowercase(), r.name)
        } else {
            r.name.clone()
        };
        row.extend([
            name,
            list(index.map(|i| &i.hosts)),
            r.mod_revision.to_string(),
        ]);
        if self.wide {
            row.extend([
                list(index.map(|i| &i.gateways)),
                r.version.to_string(),
                r.create_revision.to_string(),
            ]);
        }
        if self.labels {
            // As kubectl: `key=value` pairs in key order, `<none>` without any.
            let mut pairs: Vec<String> = r.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            pairs.sort();
            row.push(if pairs.is_empty() {
                "<none>".into()
            } else {
                pairs.join(",")
            });
        }
        row
    }
}

/// A table of `resources`.
fn render_table(resources: &[Resource], columns: Columns) -> String {
    let rows: Vec<Vec<String>> = resources.iter().map(|r| columns.row(r)).collect();
    columns.render(&rows)
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
        let columns = Columns {
            with_namespace: true,
            wide: true,
            with_kind: false,
            labels: false,
            no_headers: false,
        };
        let table = render_table(std::slice::from_ref(&r), columns);
        assert_eq!(
            table,
            "NAMESPACE   NAME      HOSTS                               REVISION   GATEWAYS   VERSION   CREATED\n\
             default     reviews   reviews.default.svc.cluster.local   7          mesh       2         3\n"
        );
        let mut labelled = r;
        labelled.labels = [
            ("version".into(), "v1".into()),
            ("app".into(), "reviews".into()),
        ]
        .into();
        let columns = Columns {
            labels: true,
            wide: false,
            ..columns
        };
        assert!(
            render_table(&[labelled], columns).ends_with("7          app=reviews,version=v1\n"),
            "{}",
            render_table(&[], columns)
        );
    }

    fn asked(args: &[&str]) -> anyhow::Result<Asked> {
        use clap::Parser;
        #[derive(Parser)]
        struct Test {
            #[command(flatten)]
            get: GetArgs,
        }
        let test = Test::try_parse_from(std::iter::once("get").chain(args.iter().copied()))?;
        test.get.asked()
    }

    #[test]
    fn several_kinds_one_object_and_refusals_that_name_the_alternative() {
        let both = asked(&["vs,dr,virtualservices"]).unwrap();
        assert_eq!(both.kinds, [Kind::VirtualService, Kind::DestinationRule]);
        let one = asked(&["vs/cart"]).unwrap();
        assert_eq!((one.kinds.len(), one.name.as_deref()), (1, Some("cart")));
        let two_named = asked(&["vs,dr", "cart"]).unwrap_err().to_string();
        assert!(two_named.contains("one kind"), "{two_named}");
        let labels = asked(&["vs", "-n", "shop", "-l", "app=cart"]).unwrap();
        assert!(labels.selector.is_some());
        let both = asked(&["vs", "cart", "-l", "app=cart"])
            .unwrap_err()
            .to_string();
        assert!(both.contains("NAME and -l"), "{both}");
        let watch = asked(&["vs,dr", "-w", "-A"]).unwrap_err().to_string();
        assert!(watch.contains("pasactl watch --kind vs,dr"), "{watch}");
    }

    #[test]
    fn several_kinds_show_the_kind_in_the_name() {
        let r = Resource {
            kind: "DestinationRule".into(),
            namespace: "shop".into(),
            name: "cart".into(),
            ..Default::default()
        };
        assert!(
            render_table(
                std::slice::from_ref(&r),
                Columns {
                    with_namespace: false,
                    wide: false,
                    with_kind: true,
                    labels: false,
                    no_headers: false,
                }
            )
            .contains("destinationrule/cart")
        );
        assert_eq!(name_of(&r), "destinationrule.networking.istio.io/cart");
    }
}
