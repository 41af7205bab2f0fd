//! Kubernetes `AdmissionReview` (admission.k8s.io v1 and v1beta1) as JSON: reading a request,
//! writing the response in the same API version.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use pasa_validation::admission::{Checked, problem_text};

/// The group, version and kind of the object under review.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

/// The part of an admission request PCP reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    #[serde(default)]
    pub kind: GroupVersionKind,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    /// CREATE, UPDATE, DELETE or CONNECT.
    #[serde(default)]
    pub operation: String,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub old_object: Option<Value>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// The envelope around a request.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    pub request: Option<AdmissionRequest>,
}

/// The API versions of AdmissionReview PCP answers.
pub const API_VERSIONS: [&str; 2] = ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

/// Reads an AdmissionReview request; the error says what is wrong with it.
pub fn parse(body: &[u8]) -> Result<(String, AdmissionRequest), String> {
    let review: AdmissionReview = serde_json::from_slice(body)
        .map_err(|e| format!("the body is not an AdmissionReview: {e}"))?;
    if review.kind != "AdmissionReview" {
        return Err(format!("kind {:?}: expected AdmissionReview", review.kind));
    }
    if !API_VERSIONS.contains(&review.api_version.as_str()) {
        return Err(format!(
            "apiVersion {:?}: expected one of {}",
            review.api_version,
            API_VERSIONS.join(", ")
        ));
    }
    let request = review
        .request
        .ok_or_else(|| "request: required in an AdmissionReview".to_string())?;
    if request.uid.is_empty() {
        return Err("request.uid: required".to_string());
    }
    Ok((review.api_version, request))
}

/// The answer to one review.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// Why it was denied (shown by kubectl after "denied the request: ").
    pub message: String,
    pub warnings: Vec<String>,
    /// A JSON Patch (RFC 6902) to apply to the object: the mutating webhook's change.
    pub patch: Option<Value>,
}

/// The verdict on an object admission checked: denied with every error, warnings either way.
pub fn verdict(checked: &Checked) -> Verdict {
    let warnings = checked
        .warnings
        .iter()
        .map(|w| problem_text(&w.field, &w.message))
        .collect();
    if checked.is_admitted() {
        return Verdict {
            allowed: true,
            message: String::new(),
            warnings,
            patch: None,
        };
    }
    let errors: Vec<String> = checked
        .errors
        .iter()
        .map(|e| problem_text(&e.field, &e.message))
        .collect();
    Verdict {
        allowed: false,
        message: format!("configuration is invalid: {}", errors.join("; ")),
        warnings,
        patch: None,
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Status<'a> {
    status: &'static str,
    message: &'a str,
    reason: &'static str,
    code: u16,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseBody<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<Status<'a>>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    /// The JSON Patch, base64 of its JSON text.
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseReview<'a> {
    api_version: &'a str,
    kind: &'static str,
    response: ResponseBody<'a>,
}

/// The AdmissionReview response JSON for `uid`, in `api_version`.
pub fn response(api_version: &str, uid: &str, verdict: &Verdict) -> Value {
    let status = (!verdict.allowed).then(|| Status {
        status: "Failure",
        message: &verdict.message,
        reason: "Invalid",
        code: 400,
    });
    let review = ResponseReview {
        api_version,
        kind: "AdmissionReview",
        response: ResponseBody {
            uid,
            allowed: verdict.allowed,
            status,
            warnings: &verdict.warnings,
            patch_type: verdict.patch.as_ref().map(|_| "JSONPatch"),
            patch: verdict.patch.as_ref().map(|p| {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD.encode(p.to_string())
            }),
        },
    };
    serde_json::to_value(review).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_v1_and_v1beta1() {
        for version in API_VERSIONS {
            let body = json!({
                "apiVersion": version, "kind": "AdmissionReview",
                "request": {"uid": "u-1", "operation": "CREATE", "namespace": "ns",
                            "kind": {"group": "networking.istio.io", "version": "v1", "kind": "Gateway"},
                            "object": {"kind": "Gateway"}}
            });
            let (v, req) = parse(body.to_string().as_bytes()).unwrap();
            assert_eq!(v, version);
            assert_eq!(req.uid, "u-1");
            assert_eq!(req.kind.kind, "Gateway");
        }
    }

    #[test]
    fn explains_what_is_wrong() {
        assert!(parse(b"{").unwrap_err().contains("not an AdmissionReview"));
        let wrong = json!({"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview", "request": {"uid": "x"}});
        assert!(
            parse(wrong.to_string().as_bytes())
                .unwrap_err()
                .contains("apiVersion")
        );
        let no_request = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
        assert!(
            parse(no_request.to_string().as_bytes())
                .unwrap_err()
                .contains("request")
        );
    }

    #[test]
    fn response_carries_uid_status_and_warnings() {
        let denied = Verdict {
            allowed: false,
            message: "bad".into(),
            warnings: vec!["careful".into()],
            patch: None,
        };
        let r = response("admission.k8s.io/v1beta1", "u", &denied);
        assert_eq!(r["apiVersion"], "admission.k8s.io/v1beta1");
        assert_eq!(r["response"]["uid"], "u");
        assert_eq!(r["response"]["allowed"], false);
        assert_eq!(r["response"]["status"]["message"], "bad");
        assert_eq!(r["response"]["warnings"][0], "careful");
        let ok = response(
            "admission.k8s.io/v1",
            "u",
            &Verdict {
                allowed: true,
                ..Default::default()
            },
        );
        assert!(ok["response"].get("status").is_none());
        assert!(ok["response"].get("warnings").is_none());
    }
}
