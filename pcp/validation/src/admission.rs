//! Admission of documents: structure, Istio validation and cross-resource analysis, in one place
//! for every way config comes in (the gRPC write path, the admission webhook, `pasactl validate`).

use pasa_proto::Object;
use pasa_proto::object::identity_of;
use pasa_proto::store::v1::{ApplyDocument, DocumentError, DocumentWarning, ErrorCode, ObjectRef};
use serde_json::Value;

use crate::analysis;
use crate::validation::{self, Problem};

/// What admission found in a batch. A batch with any error must be written nowhere.
#[derive(Debug, Default)]
pub struct Checked {
    /// One entry per document: the object, when it is structurally sound.
    pub objects: Vec<Option<Object>>,
    pub errors: Vec<DocumentError>,
    pub warnings: Vec<DocumentWarning>,
}

impl Checked {
    pub fn is_admitted(&self) -> bool {
        self.errors.is_empty()
    }
}

/// A problem as one line: `field: message`, or the message alone for the whole document.
pub fn problem_text(field: &str, message: &str) -> String {
    if field.is_empty() {
        message.to_string()
    } else {
        format!("{field}: {message}")
    }
}

fn reference_of(doc: &Value, default_namespace: &str) -> ObjectRef {
    let id = identity_of(doc, default_namespace);
    ObjectRef {
        kind: id.kind,
        namespace: id.namespace,
        name: id.name,
    }
}

fn object_ref(obj: &Object) -> ObjectRef {
    ObjectRef {
        kind: obj.kind.as_str().to_string(),
        namespace: obj.namespace.clone(),
        name: obj.name.clone(),
    }
}

fn error(index: usize, reference: ObjectRef, problem: Problem) -> DocumentError {
    DocumentError {
        index: index as u32,
        r#ref: Some(reference),
        field: problem.field,
        message: problem.message,
        code: ErrorCode::Invalid as i32,
        duplicate_of: None,
    }
}

fn warning(index: usize, reference: ObjectRef, problem: Problem) -> DocumentWarning {
    DocumentWarning {
        index: index as u32,
        r#ref: Some(reference),
        field: problem.field,
        message: problem.message,
    }
}

/// Largest document admitted, as JSON: 1.5 MiB, the most Kubernetes stores of one object (its
/// API server refuses a larger one). Documents PCP generates are not held to it.
pub const MAX_DOCUMENT_BYTES: usize = 3 << 19;

/// Largest batch (one apply) admitted, as the JSON of its documents: far below the gRPC message
/// limit, so that a batch too large is refused with this advice rather than by the transport.
pub const MAX_BATCH_BYTES: usize = 16 << 20;

/// A batch over [`MAX_BATCH_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchTooLarge {
    #[error(
        "the apply carries {} of JSON ({bytes} bytes in {documents} documents); one apply may \
         carry at most {} ({MAX_BATCH_BYTES} bytes): split it into several applies, for example \
         one per file",
        mebibytes(*bytes),
        mebibytes(MAX_BATCH_BYTES)
    )]
    Documents { bytes: usize, documents: usize },
    #[error(
        "the document is {} of JSON ({bytes} bytes); Kubernetes stores at most {} \
         ({MAX_DOCUMENT_BYTES} bytes) per object: split it into several smaller objects",
        mebibytes(*bytes),
        mebibytes(MAX_DOCUMENT_BYTES)
    )]
    Document { bytes: usize },
}

/// Refuses a batch whose documents' JSON texts are `sizes` bytes long, together, when it is over
/// [`MAX_BATCH_BYTES`].
pub fn check_batch_size(sizes: impl Iterator<Item = usize>) -> Result<(), BatchTooLarge> {
    let (bytes, documents) = sizes.fold((0usize, 0usize), |(b, n), size| {
        (b.saturating_add(size), n + 1)
    });
    match documents {
        _ if bytes <= MAX_BATCH_BYTES => Ok(()),
        1 => Err(BatchTooLarge::Document { bytes }),
        _ => Err(BatchTooLarge::Documents { bytes, documents }),
    }
}

fn mebibytes(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

/// The length of `doc` written as compact JSON, counted without writing it anywhere.
fn json_len(doc: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` to a writer that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, doc);
    count.0
}

/// The problem of a document over [`MAX_DOCUMENT_BYTES`], naming it.
fn too_large(reference: &ObjectRef, bytes: usize) -> Problem {
    let what = match (reference.kind.as_str(), reference.name.as_str()) {
        ("", _) | (_, "") => "the document".to_string(),
        (kind, name) if reference.namespace.is_empty() => format!("{kind} {name}"),
        (kind, name) => format!("{kind} {}/{name}", reference.namespace),
    };
    Problem {
        field: String::new(),
        message: format!(
            "{what} is {} of JSON ({bytes} bytes); Kubernetes stores at most {} \
             ({MAX_DOCUMENT_BYTES} bytes) per object: split it into several smaller objects",
            mebibytes(bytes),
            mebibytes(MAX_DOCUMENT_BYTES)
        ),
    }
}

/// Reads the JSON documents of a store API batch and checks each on its own (see
/// [`check_documents_by`]): how PCP and the standalone store admit a batch, after
/// [`check_batch_size`].
pub fn check_batch(
    documents: &[ApplyDocument],
    default_namespace: &str,
    author: validation::Author,
) -> Checked {
    let docs: Vec<Result<Value, String>> = documents
        .iter()
        .map(|d| serde_json::from_str(&d.json).map_err(|e| format!("not valid JSON: {e}")))
        .collect();
    check_documents_by(&docs, default_namespace, author)
}

/// Checks each document on its own: structure, then Istio validation. A document that could not
/// even be read comes as `Err(why)`. Objects without a namespace land in `default_namespace`.
pub fn check_documents(docs: &[Result<Value, String>], default_namespace: &str) -> Checked {
    check_documents_by(docs, default_namespace, validation::Author::User)
}

/// [`check_documents`], for documents of `author`.
pub fn check_documents_by(
    docs: &[Result<Value, String>],
    default_namespace: &str,
    author: validation::Author,
) -> Checked {
    let mut checked = Checked::default();
    for (i, doc) in docs.iter().enumerate() {
        let doc = match doc {
            Ok(doc) => doc,
            Err(why) => {
                let problem = Problem {
                    field: String::new(),
                    message: why.clone(),
                };
                checked.errors.push(error(i, ObjectRef::default(), problem));
                checked.objects.push(None);
                continue;
            }
        };
        if author == validation::Author::User {
            let bytes = json_len(doc);
            if bytes > MAX_DOCUMENT_BYTES {
                let reference = reference_of(doc, default_namespace);
                let problem = too_large(&reference, bytes);
                checked.errors.push(error(i, reference, problem));
                checked.objects.push(None);
                continue;
            }
        }
        match Object::from_json(
            doc,
            default_namespace,
            pasa_istio::generated::is_generated_object,
        ) {
            Err(problems) => {
                let reference = reference_of(doc, default_namespace);
                checked.errors.extend(
                    problems
                        .into_iter()
                        .map(|p| error(i, reference.clone(), p.into())),
                );
                checked.objects.push(None);
            }
            Ok(obj) => {
                let report = validation::validate_by(&obj, author);
                let reference = object_ref(&obj);
                checked.errors.extend(
                    report
                        .errors
                        .into_iter()
                        .map(|p| error(i, reference.clone(), p)),
                );
                checked.warnings.extend(
                    report
                        .warnings
                        .into_iter()
                        .map(|p| warning(i, reference.clone(), p)),
                );
                checked.objects.push(Some(obj));
            }
        }
    }
    checked
}

/// Adds the cross-resource warnings for the batch's valid objects, against `existing` objects
/// (the store's, or nothing offline). Batch objects replace stored ones of the same identity.
/// Short host names resolve in `domain_suffix`.
pub fn analyze(checked: &mut Checked, existing: &[Object], domain_suffix: &str) {
    let batch: Vec<(usize, &Object)> = checked
        .objects
        .iter()
        .enumerate()
        .filter_map(|(i, o)| o.as_ref().map(|o| (i, o)))
        .collect();
    for (i, problem) in analysis::analyze(&batch, existing, domain_suffix) {
        let Some(Some(obj)) = checked.objects.get(i) else {
            continue;
        };
        checked.warnings.push(warning(i, object_ref(obj), problem));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_document_is_reported_with_its_index_and_identity() {
        let docs = vec![
            Ok(
                json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                   "metadata": {"name": "ok"}, "spec": {"hosts": ["a"], "http": [{"route": [{"destination": {"host": "a"}}]}]}}),
            ),
            Ok(
                json!({"apiVersion": "networking.istio.io/v1", "kind": "Nope",
                   "metadata": {"name": "bad"}}),
            ),
            Err("not valid JSON".to_string()),
        ];
        let checked = check_documents(&docs, "default");
        assert!(checked.objects[0].is_some());
        assert!(checked.objects[1].is_none());
        assert!(!checked.is_admitted());
        let e = &checked.errors[0];
        assert_eq!(e.index, 1);
        assert_eq!(e.field, "kind");
        assert_eq!(e.r#ref.as_ref().unwrap().name, "bad");
        assert_eq!(checked.errors.last().unwrap().index, 2);
    }

    #[test]
    fn only_the_generator_writes_istiods_generated_names_and_annotations() {
        // What the syncer generates from an HTTPRoute: istiod's name, parents, semantics, and
        // an empty destination for a backend that does not resolve.
        let generated = json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "shop~edge~istio-autogenerated-k8s-gateway~http~a.example.com",
                         "namespace": "shop",
                         "annotations": {"internal.istio.io/parents": "HTTPRoute/web.shop",
                                         "internal.istio.io/route-semantics": "gateway"}},
            "spec": {"hosts": ["a.example.com"],
                     "gateways": ["shop/edge~istio-autogenerated-k8s-gateway~http"],
                     "http": [{"route": [{"destination": {}}]}]}});
        let docs = vec![Ok(generated)];
        assert!(check_documents_by(&docs, "default", validation::Author::Generator).is_admitted());
        // The same from a user (or mirrored from the cluster): the annotations do not make it
        // generated.
        let user = check_documents(&docs, "default");
        let fields: Vec<&str> = user.errors.iter().map(|e| e.field.as_str()).collect();
        assert!(fields.contains(&"metadata.name"), "{fields:?}");
        assert!(
            fields.contains(&"metadata.annotations[internal.istio.io/parents]"),
            "{fields:?}"
        );
    }

    #[test]
    fn a_document_over_the_object_limit_is_refused_naming_it_and_the_limit() {
        let hosts: Vec<String> = (0..80_000).map(|i| format!("h{i}.example.com")).collect();
        let big = json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "big", "namespace": "shop"},
            "spec": {"hosts": hosts, "http": [{"route": [{"destination": {"host": "a"}}]}]}});
        assert!(json_len(&big) > MAX_DOCUMENT_BYTES);
        let checked = check_documents(&[Ok(big.clone())], "default");
        assert_eq!(checked.errors.len(), 1, "{:?}", checked.errors);
        let e = &checked.errors[0];
        assert_eq!(e.r#ref.as_ref().unwrap().name, "big");
        assert!(
            e.message.starts_with("VirtualService shop/big is 1.")
                && e.message
                    .contains("at most 1.5 MiB (1572864 bytes) per object")
                && e.message.contains("split it"),
            "{}",
            e.message
        );
        // What PCP generates is not held to it.
        let generated = check_documents_by(&[Ok(big)], "default", validation::Author::Generator);
        assert!(
            generated
                .errors
                .iter()
                .all(|e| !e.message.contains("per object"))
        );
    }

    #[test]
    fn a_batch_over_the_limit_is_refused_with_advice_to_split_it() {
        let fits = [MAX_BATCH_BYTES / 2, MAX_BATCH_BYTES / 2];
        assert!(check_batch_size(fits.into_iter()).is_ok());
        let e = check_batch_size([MAX_BATCH_BYTES, 1, 1].into_iter()).unwrap_err();
        let message = e.to_string();
        assert!(
            message.contains("in 3 documents")
                && message.contains("at most 16.0 MiB")
                && message.contains("split it into several applies"),
            "{message}"
        );
        // One document that large is one object too large.
        let e = check_batch_size([MAX_BATCH_BYTES + 1].into_iter()).unwrap_err();
        assert!(
            e.to_string()
                .contains("Kubernetes stores at most 1.5 MiB (1572864 bytes) per object"),
            "{e}"
        );
    }

    fn document(kind: &str, name: &str, spec: Value) -> Value {
        json!({"apiVersion": "networking.istio.io/v1", "kind": kind,
               "metadata": {"name": name, "namespace": "shop"}, "spec": spec})
    }

    fn vs_with_hosts(n: usize) -> Vec<Value> {
        let hosts: Vec<String> = (0..n).map(|i| format!("h{i}.example.com")).collect();
        vec![document(
            "VirtualService",
            "hosts",
            json!({"hosts": hosts, "http": [{"route": [{"destination": {"host": "a"}}]}]}),
        )]
    }

    fn vs_with_routes(n: usize) -> Vec<Value> {
        let routes: Vec<Value> = (0..n)
            .map(|i| {
                json!({"name": format!("r{i}"),
                       "match": [{"uri": {"prefix": format!("/api/v1/items/{i}")}},
                                 {"uri": {"regex": "(a{1000}){5}x"}, "headers": {"x-user": {"exact": format!("u{i}")}}},
                                 {"uri": {"prefix": format!("/api/v2/items/{i}")}, "method": {"exact": "POST"}}],
                       "route": [{"destination": {"host": "cart", "subset": format!("v{i}")}}]})
            })
            .collect();
        let subsets: Vec<Value> = (0..n)
            .map(|i| json!({"name": format!("v{i}"), "labels": {"version": format!("v{i}")}}))
            .collect();
        vec![
            document(
                "VirtualService",
                "routes",
                json!({"hosts": ["cart"], "http": routes}),
            ),
            document(
                "DestinationRule",
                "cart",
                json!({"host": "cart", "subsets": subsets}),
            ),
        ]
    }

    fn vs_with_sni(n: usize) -> Vec<Value> {
        let hosts: Vec<String> = (0..n).map(|i| format!("h{i}.example.com")).collect();
        let tls: Vec<Value> = (0..n)
            .map(|i| {
                json!({"match": [{"sniHosts": [format!("h{i}.example.com")], "port": 443}],
                       "route": [{"destination": {"host": format!("h{i}.example.com")}}]})
            })
            .collect();
        vec![document(
            "VirtualService",
            "sni",
            json!({"hosts": hosts, "tls": tls}),
        )]
    }

    fn dr_with_subsets(n: usize) -> Vec<Value> {
        let subsets: Vec<Value> = (0..n)
            .map(|i| {
                json!({"name": format!("v{i}"), "labels": {"version": format!("v{i}")},
                            "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}}})
            })
            .collect();
        vec![document(
            "DestinationRule",
            "subsets",
            json!({"host": "cart", "subsets": subsets}),
        )]
    }

    fn gateway_with_servers(n: usize) -> Vec<Value> {
        let servers: Vec<Value> = (0..n)
            .map(|i| json!({"port": {"number": 8000 + i % 1000, "name": format!("http-{i}"), "protocol": "HTTP"},
                            "hosts": [format!("ns/h{i}.example.com"), "*/shared.example.com"]}))
            .collect();
        vec![document("Gateway", "servers", json!({"servers": servers}))]
    }

    /// Writes the documents of one shape, of size `n`.
    type Generator = fn(usize) -> Vec<Value>;

    /// The least time, in seconds per kilobyte of JSON, that admitting `docs` took in `runs`
    /// runs: structure, Istio validation, and the analysis of the batch on its own.
    fn seconds_per_kilobyte(docs: &[Value], runs: usize) -> f64 {
        let docs: Vec<Result<Value, String>> = docs.iter().cloned().map(Ok).collect();
        let kilobytes = docs.iter().flatten().map(json_len).sum::<usize>() as f64 / 1024.0;
        (0..runs)
            .map(|_| {
                let started = std::time::Instant::now();
                let mut checked = check_documents(&docs, "default");
                analyze(&mut checked, &[], pasa_istio::host::DEFAULT_DOMAIN_SUFFIX);
                std::hint::black_box(&checked);
                started.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
            / kilobytes
    }

    #[test]
    fn validation_time_per_kilobyte_stays_flat_on_adversarial_documents() {
        // Each shape at a tenth of its size and at its full size: a check that compares every
        // pair of hosts, routes or subsets costs ten times more per kilobyte at the full size;
        // a linear one the same (the bound leaves room for a slow, busy machine).
        let shapes: [(&str, Generator, usize); 5] = [
            ("a VirtualService with n hosts", vs_with_hosts, 40_000),
            (
                "a VirtualService with n routes with matches, to n subsets of a DestinationRule",
                vs_with_routes,
                10_000,
            ),
            (
                "a VirtualService with n hosts and n TLS routes",
                vs_with_sni,
                10_000,
            ),
            ("a DestinationRule with n subsets", dr_with_subsets, 10_000),
            ("a Gateway with n servers", gateway_with_servers, 10_000),
        ];
        for (shape, generate, n) in shapes {
            let small = seconds_per_kilobyte(&generate(n / 10), 3);
            let large = seconds_per_kilobyte(&generate(n), 2);
            assert!(
                large < 4.0 * small,
                "{shape}: {:.1} µs/KB at n = {n}, {:.1} µs/KB at n = {}: validation is not linear in the document",
                large * 1e6,
                small * 1e6,
                n / 10
            );
        }
    }
}
