//! Admission of documents: structure, Istio validation and cross-resource analysis, in one place
//! for every way config comes in (the gRPC write path, the admission webhook, `pasactl validate`).

use pasa_proto::Object;
use pasa_proto::object::identity_of;
use pasa_proto::store::v1::{DocumentError, DocumentWarning, ErrorCode, ObjectRef};
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
        match Object::from_json(doc, default_namespace) {
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
}
