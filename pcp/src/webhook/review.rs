//! Kubernetes `AdmissionReview` (admission.k8s.io v1 and v1beta1) as JSON, in kube's admission
//! types: reading a request, and writing the response in the same API version.
//!
//! kube reads the whole request and keeps the review's `apiVersion` on it, so a response built
//! from the request ([`AdmissionResponse::from`]) is answered in the version asked. Its own
//! serialization of a response is not what PASA sends, so [`to_json`] writes the response:
//! kube writes the patch as an array of byte values and an empty `status` on an allowed
//! answer, where Kubernetes documents base64 text and PASA has always sent it without a status.

use std::fmt::Display;

use kube::core::DynamicObject;
use kube::core::admission::{self, AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::StatusSummary;
use serde::Serialize;
use serde_json::{Map, Value};

use pasa_validation::admission::{Checked, problem_text};

/// An admission request as PCP reads it: the reviewed object as kube's dynamic object.
pub type AdmissionRequest = admission::AdmissionRequest<DynamicObject>;

/// The API versions of AdmissionReview PCP answers.
pub const API_VERSIONS: [&str; 2] = ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

/// Why a body is no AdmissionReview PCP can answer.
#[derive(Debug, thiserror::Error)]
pub enum Unreadable {
    #[error("the body is not an AdmissionReview: {0}")]
    NotAReview(#[source] serde_json::Error),
    #[error("kind {0:?}: expected AdmissionReview")]
    Kind(String),
    #[error("apiVersion {0:?}: expected one of {versions}", versions = API_VERSIONS.join(", "))]
    ApiVersion(String),
    #[error("request: required in an AdmissionReview")]
    NoRequest,
    #[error("request.uid: required")]
    NoUid,
}

/// Reads an AdmissionReview request; the error says what is wrong with it.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest, Unreadable> {
    let mut doc: Value = serde_json::from_slice(body).map_err(Unreadable::NotAReview)?;
    // The envelope first: a review of another kind or version is named as such.
    let envelope = |key: &str| doc.get(key).and_then(Value::as_str).unwrap_or_default();
    if envelope("kind") != admission::META_KIND {
        return Err(Unreadable::Kind(envelope("kind").to_string()));
    }
    if !API_VERSIONS.contains(&envelope("apiVersion")) {
        return Err(Unreadable::ApiVersion(envelope("apiVersion").to_string()));
    }
    tolerate_missing(&mut doc);
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_value(doc).map_err(Unreadable::NotAReview)?;
    let request: AdmissionRequest = review.try_into().map_err(|_| Unreadable::NoRequest)?;
    if request.uid.is_empty() {
        return Err(Unreadable::NoUid);
    }
    Ok(request)
}

/// kube requires the request's `resource` and `userInfo`, which PCP does not read, and a review
/// without them was always answered: they are taken as empty when missing.
fn tolerate_missing(doc: &mut Value) {
    if let Some(request) = doc.get_mut("request").and_then(Value::as_object_mut) {
        request.entry("resource").or_insert_with(|| {
            let empty = |k: &str| (k.to_string(), Value::String(String::new()));
            Value::Object(Map::from_iter(["group", "version", "resource"].map(empty)))
        });
        request
            .entry("userInfo")
            .or_insert_with(|| Value::Object(Map::new()));
    }
}

/// The operation as Kubernetes spells it.
pub fn operation_name(operation: &Operation) -> &'static str {
    match operation {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// The reviewed object as JSON, as validation and injection read it.
pub fn object_json(object: &DynamicObject) -> Result<Value, serde_json::Error> {
    serde_json::to_value(object)
}

/// `response` denied: `message` is shown by kubectl after "denied the request: ".
pub fn deny(response: AdmissionResponse, message: impl Display) -> AdmissionResponse {
    let mut denied = response.deny(message);
    denied.result.status = Some(StatusSummary::Failure);
    denied.result.reason = "Invalid".to_string();
    denied.result.code = 400;
    denied
}

/// `response` with `warnings` added, which the API server passes on to its client.
pub fn warn(
    mut response: AdmissionResponse,
    warnings: impl IntoIterator<Item = String>,
) -> AdmissionResponse {
    let mut warnings = warnings.into_iter().peekable();
    if warnings.peek().is_some() {
        response.warnings.get_or_insert_default().extend(warnings);
    }
    response
}

/// The answer to a review that could not be read, in `api_version` for `uid` as far as they
/// could be read from it.
pub fn unreadable(api_version: &str, uid: &str, why: impl Display) -> AdmissionResponse {
    let mut response = AdmissionResponse::invalid(&why);
    response.types.api_version = api_version.to_string();
    response.uid = uid.to_string();
    deny(response, why)
}

/// The answer to `req` on an object admission checked: denied with every error, warnings either
/// way.
pub fn verdict(req: &AdmissionRequest, checked: &Checked) -> AdmissionResponse {
    let warnings = checked
        .warnings
        .iter()
        .map(|w| problem_text(&w.field, &w.message));
    let response = warn(AdmissionResponse::from(req), warnings);
    if checked.is_admitted() {
        return response;
    }
    let errors: Vec<String> = checked
        .errors
        .iter()
        .map(|e| problem_text(&e.field, &e.message))
        .collect();
    deny(
        response,
        format!("configuration is invalid: {}", errors.join("; ")),
    )
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireStatus<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<StatusSummary>,
    message: &'a str,
    reason: &'a str,
    code: u16,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireResponse<'a> {
    uid: &'a str,
    allowed: bool,
    /// Only on a denial: Kubernetes reads it only then.
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<WireStatus<'a>>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    /// The JSON Patch, base64 of its JSON text (Kubernetes' encoding of bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireReview<'a> {
    api_version: &'a str,
    kind: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    response: Option<WireResponse<'a>>,
}

impl<'a> From<&'a AdmissionResponse> for WireResponse<'a> {
    fn from(response: &'a AdmissionResponse) -> Self {
        let result = &response.result;
        WireResponse {
            uid: &response.uid,
            allowed: response.allowed,
            status: (!response.allowed).then_some(WireStatus {
                status: result.status,
                message: &result.message,
                reason: &result.reason,
                code: result.code,
            }),
            warnings: response.warnings.as_deref().unwrap_or_default(),
            // kube keeps the type private; its patch is only ever set with it (`with_patch`).
            patch_type: response.patch.as_ref().map(|_| "JSONPatch"),
            patch: response.patch.as_ref().map(|p| {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD.encode(p)
            }),
        }
    }
}

/// The AdmissionReview response JSON of `review`, in the API version it carries.
pub fn to_json(review: &AdmissionReview<DynamicObject>) -> Value {
    let wire = WireReview {
        api_version: &review.types.api_version,
        kind: &review.types.kind,
        response: review.response.as_ref().map(WireResponse::from),
    };
    serde_json::to_value(wire).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(version: &str) -> AdmissionRequest {
        let body = json!({
            "apiVersion": version, "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": "CREATE", "namespace": "ns",
                        "kind": {"group": "networking.istio.io", "version": "v1", "kind": "Gateway"},
                        "object": {"kind": "Gateway"}}
        });
        parse(body.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn reads_v1_and_v1beta1() {
        for version in API_VERSIONS {
            let req = request(version);
            assert_eq!(req.types.api_version, version);
            assert_eq!(req.uid, "u-1");
            assert_eq!(req.kind.kind, "Gateway");
            assert_eq!(req.operation, Operation::Create);
            assert_eq!(req.namespace.as_deref(), Some("ns"));
        }
    }

    #[test]
    fn explains_what_is_wrong() {
        let message = |body: Value| parse(body.to_string().as_bytes()).unwrap_err().to_string();
        assert!(
            parse(b"{")
                .unwrap_err()
                .to_string()
                .contains("not an AdmissionReview")
        );
        let wrong = json!({"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview", "request": {"uid": "x"}});
        assert!(message(wrong).contains("apiVersion"));
        let no_kind = json!({"apiVersion": "admission.k8s.io/v1"});
        assert!(message(no_kind).contains("expected AdmissionReview"));
        let no_request = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
        assert!(message(no_request).contains("request"));
    }

    #[test]
    fn response_carries_uid_status_and_warnings_in_the_version_asked() {
        let req = request("admission.k8s.io/v1beta1");
        let denied = deny(
            warn(AdmissionResponse::from(&req), ["careful".to_string()]),
            "bad",
        );
        let r = to_json(&denied.into_review());
        assert_eq!(
            r.to_string(),
            r#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","response":{"uid":"u-1","allowed":false,"status":{"status":"Failure","message":"bad","reason":"Invalid","code":400},"warnings":["careful"]}}"#
        );
        let ok = to_json(&AdmissionResponse::from(&request(API_VERSIONS[0])).into_review());
        assert_eq!(
            ok.to_string(),
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"u-1","allowed":true}}"#
        );
    }

    #[test]
    fn a_patch_is_base64_of_its_json_text() {
        let ops = json!([{"op": "add", "path": "/metadata/labels/a~1b", "value": "c"}]);
        let patch: json_patch::Patch = serde_json::from_value(ops.clone()).unwrap();
        let patched = AdmissionResponse::from(&request(API_VERSIONS[0]))
            .with_patch(patch)
            .unwrap();
        let r = to_json(&patched.into_review());
        assert_eq!(r["response"]["patchType"], "JSONPatch");
        use base64::Engine;
        let text = base64::engine::general_purpose::STANDARD
            .decode(r["response"]["patch"].as_str().unwrap())
            .unwrap();
        assert_eq!(text, ops.to_string().into_bytes());
    }

    #[test]
    fn an_unreadable_review_is_denied_in_the_version_read() {
        let r = to_json(&unreadable("admission.k8s.io/v1beta1", "u", "why").into_review());
        assert_eq!(
            r.to_string(),
            r#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","response":{"uid":"u","allowed":false,"status":{"status":"Failure","message":"why","reason":"Invalid","code":400}}}"#
        );
    }
}
