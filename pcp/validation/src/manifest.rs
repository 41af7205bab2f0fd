//! Reading manifests the way kubectl does: `-f FILE`, `-f DIR` (its .yaml, .yml and .json files,
//! in name order; `-R` for subfolders) or `-f -` (standard input); several YAML documents per
//! file; `kind: List` expanded into its items.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Where a document came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub file: String,
    /// Index of the document in its file, from 0.
    pub document: usize,
}

/// Where a document is, counted from 1 as people count: `shop.yaml document 1`.
impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} document {}", self.file, self.document + 1)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid YAML or JSON: {message}")]
    Parse { path: String, message: String },
    #[error("{0}: no manifests found (.yaml, .yml or .json)")]
    Empty(String),
}

/// Reads every document named by `paths`.
pub fn load(paths: &[PathBuf], recursive: bool) -> Result<Vec<(Source, Value)>, ManifestError> {
    let mut out = Vec::new();
    for path in paths {
        if path.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|source| ManifestError::Read {
                    path: "-".into(),
                    source,
                })?;
            parse_into("<stdin>", &text, &mut out)?;
            continue;
        }
        let files = if path.is_dir() {
            let mut files = Vec::new();
            collect_dir(path, recursive, &mut files)?;
            if files.is_empty() {
                return Err(ManifestError::Empty(path.display().to_string()));
            }
            files
        } else {
            vec![path.clone()]
        };
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|source| ManifestError::Read {
                path: file.display().to_string(),
                source,
            })?;
            parse_into(&file.display().to_string(), &text, &mut out)?;
        }
    }
    Ok(out)
}

fn collect_dir(dir: &Path, recursive: bool, out: &mut Vec<PathBuf>) -> Result<(), ManifestError> {
    let read_err = |source| ManifestError::Read {
        path: dir.display().to_string(),
        source,
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(read_err)?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            if recursive {
                collect_dir(&path, recursive, out)?;
            }
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            out.push(path);
        }
    }
    Ok(())
}

/// The parser's limits for `text`: its defaults (which stop at 1,024 documents and 250,000
/// nodes) raised in proportion to the input, so a mesh export of thousands of objects parses,
/// while the limits on aliases and anchors (the expansion attacks) stay as they are.
fn parse_options(text: &str) -> serde_saphyr::Options {
    let defaults = serde_saphyr::Budget::default();
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            // A document separator takes at least 4 bytes; a node and an event at least 1.
            max_documents: defaults.max_documents.max(text.len() / 4 + 1),
            max_nodes: defaults.max_nodes.max(text.len()),
            max_events: defaults.max_events.max(text.len().saturating_mul(4)),
        },
    }
}

/// Parses a multi-document YAML (or JSON) text, skipping empty documents and expanding lists.
pub fn parse_into(
    name: &str,
    text: &str,
    out: &mut Vec<(Source, Value)>,
) -> Result<(), ManifestError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple_with_options(text, parse_options(text))
        .map_err(|e| ManifestError::Parse {
            path: name.to_string(),
            message: e.to_string(),
        })?;
    for (i, doc) in docs.into_iter().enumerate() {
        let source = Source {
            file: name.to_string(),
            document: i,
        };
        match doc {
            Value::Null => {}
            Value::Object(ref map)
                if map.get("kind").and_then(Value::as_str) == Some("List")
                    && map.get("items").is_some_and(Value::is_array) =>
            {
                if let Some(Value::Array(items)) = map.get("items") {
                    out.extend(items.iter().cloned().map(|item| (source.clone(), item)));
                }
            }
            doc => out.push((source, doc)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mesh_export_of_thousands_of_documents_parses() {
        let mut text = String::new();
        for i in 0..5000 {
            text.push_str(&format!(
                "---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: r{i}, namespace: default}}\nspec:\n  host: s{i}\n  subsets:\n  - {{name: v1, labels: {{version: v1}}}}\n  - {{name: v2, labels: {{version: v2}}}}\n"
            ));
        }
        let mut out = Vec::new();
        parse_into("export.yaml", &text, &mut out).unwrap();
        assert_eq!(out.len(), 5000);
        assert_eq!(out[4999].0.document, 4999);
    }

    #[test]
    fn multi_document_yaml_with_lists_and_empty_documents() {
        let text = "# comment only\n---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata:\n  name: a\n---\n---\nkind: List\nitems:\n- kind: Sidecar\n  metadata: {name: b}\n- kind: Sidecar\n  metadata: {name: c}\n";
        let mut out = Vec::new();
        parse_into("x.yaml", text, &mut out).unwrap();
        let kinds: Vec<_> = out
            .iter()
            .map(|(_, v)| v["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["Gateway", "Sidecar", "Sidecar"]);
        assert_eq!(out[1].0.file, "x.yaml");
    }

    #[test]
    fn bad_yaml_names_the_file() {
        let mut out = Vec::new();
        let err = parse_into("bad.yaml", "a: [1, 2\n", &mut out).unwrap_err();
        assert!(
            err.to_string().starts_with("bad.yaml: not valid YAML"),
            "{err}"
        );
    }

    #[test]
    fn json_documents() {
        let mut out = Vec::new();
        parse_into(
            "x.json",
            r#"{"kind": "Gateway", "spec": {"a": 1}}"#,
            &mut out,
        )
        .unwrap();
        assert_eq!(out[0].1["spec"]["a"], 1);
    }
}
