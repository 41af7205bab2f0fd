//! The validating admission webhook: Kubernetes sends an `AdmissionReview` (v1 or v1beta1) to
//! `POST /validate` over HTTPS for each CREATE or UPDATE of a `networking.istio.io` resource, and
//! PCP answers as istiod would: allowed, or denied with every error by field path; warnings
//! either way. It has no side effects (`sideEffects: None`): what the API server then stores
//! reaches the store through the Kubernetes syncer, not through the webhook, so an object
//! another webhook or the API server refuses after this one allowed it is never written.

pub mod inject;
pub mod review;
pub mod tls;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use kube::core::GroupVersionKind;
use kube::core::admission::{AdmissionResponse, Operation};
use pasa_proto::Kind;
use serde_json::Value;

use crate::metrics::{Answer, InjectionLabels, Metrics, Origin, WebhookLabels};
use crate::write::WriteService;
use inject::Injector;
use review::AdmissionRequest;

/// Largest review accepted: an object and its old version, each up to the 1.5 MiB Kubernetes
/// stores of one object, and the review around them.
pub const MAX_BODY: usize = 8 << 20;

/// How long the injecting webhook waits for the store's answer on security policies.
const POLICY_LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

/// How long open connections get after a shutdown signal.
const DRAIN: Duration = Duration::from_secs(10);

/// What the webhook needs to answer reviews.
pub struct Webhook {
    service: WriteService,
    metrics: Arc<Metrics>,
    injector: Injector,
}

impl Webhook {
    pub fn new(service: WriteService, metrics: Arc<Metrics>, injector: Injector) -> Self {
        Webhook {
            service,
            metrics,
            injector,
        }
    }

    /// Why a pod the injector would move must stay with istiod (`Err`): policies, patches or
    /// extensions apply to it that PASA's agent does not apply yet (see
    /// [`inject::unenforced_policies`]), or the store cannot say whether any do; else the
    /// warnings moving it gets (see [`inject::move_warnings`]) and the proxy settings the store
    /// holds for it.
    async fn keeps_with_istiod(&self, req: &AdmissionRequest) -> Result<Looked, StaysWithIstiod> {
        let Some(object) = req.object.as_ref() else {
            return Ok(Looked::default());
        };
        let pod = &review::object_json(object).map_err(StaysWithIstiod::Unreadable)?;
        let namespace = req.namespace.as_deref().unwrap_or_default();
        let root = self.injector.root_namespace();
        let request = pasa_proto::store::v1::ListRequest {
            selector: Some(pasa_proto::store::v1::Subscription {
                rules: vec![pasa_proto::store::v1::Rule {
                    // And ProxyConfig, for the pod's proxy settings.
                    kinds: inject::UNENFORCED_KINDS
                        .iter()
                        .chain([&Kind::ProxyConfig])
                        .map(|k| k.as_str().to_string())
                        .collect(),
                    namespaces: vec![namespace.to_string(), root.to_string()],
                    ..Default::default()
                }],
            }),
            revision: 0,
        };
        let listed = tokio::time::timeout(
            POLICY_LOOKUP_TIMEOUT,
            self.service
                .upstream()
                .call(&request, |mut store, request| async move {
                    store.list(request).await
                }),
        )
        .await;
        let policies = match listed {
            Ok(Ok(list)) => list.into_inner().resources,
            Ok(Err(status)) => {
                return Err(StaysWithIstiod::Store {
                    message: status.message().to_string(),
                });
            }
            Err(_) => return Err(StaysWithIstiod::StoreTimeout),
        };
        let applying = inject::unenforced_policies(pod, namespace, root, &policies);
        if applying.is_empty() {
            return Ok(Looked {
                warnings: inject::move_warnings(pod, root, &policies),
                settings: inject::StoredSettings::from_resources(&policies, root),
            });
        }
        Err(StaysWithIstiod::Unenforced { applying })
    }

    /// Decides one admission request.
    pub async fn review(&self, req: &AdmissionRequest) -> AdmissionResponse {
        let allowed = AdmissionResponse::from(req);
        let kind = handled_kind(&req.kind);
        match req.operation {
            Operation::Create | Operation::Update => {}
            Operation::Delete | Operation::Connect => return allowed,
        }
        if let Err(why) = kind {
            return review::deny(allowed, why);
        }
        let Some(object) = &req.object else {
            return review::deny(
                allowed,
                format!(
                    "request.object: required for {}",
                    review::operation_name(&req.operation)
                ),
            );
        };
        let object = review::object_json(object).map_err(|e| format!("request.object: {e}"));
        let namespace = req.namespace.as_deref().unwrap_or_default();
        let checked = self
            .service
            .admit(vec![object], namespace, Origin::Webhook)
            .await;
        review::verdict(req, &checked)
    }
}

/// Why a pod the injector would move stays with istiod.
#[derive(Debug, thiserror::Error)]
enum StaysWithIstiod {
    #[error("the pod cannot be read as JSON ({0})")]
    Unreadable(#[source] serde_json::Error),
    #[error("the store cannot say which security policies apply to it ({message})")]
    Store { message: String },
    #[error("the store did not say in time which security policies apply to it")]
    StoreTimeout,
    #[error(
        "{} applies to it, which PASA's agent cannot apply yet (WasmPlugin and \
         TrafficExtension whose module the pod's proxy would not get; Telemetry with \
         metrics for upstream Envoy, or a Lightstep tracer; EnvoyFilter patching the bootstrap; \
         RequestAuthentication whose keys are not in the store yet; CUSTOM \
         AuthorizationPolicy whose provider the stored mesh config does not define)",
        .applying.join(", ")
    )]
    Unenforced { applying: Vec<String> },
}

/// A kind the webhook does not review: the configuration sending it is wrong.
#[derive(Debug, thiserror::Error)]
#[error(
    "unrecognized type {group}/{version}, Kind={kind}: this webhook validates {}; check the rules \
     of the ValidatingWebhookConfiguration",
    reviewed_kinds().map(|k| format!("{}.{}", k.as_str(), k.group())).collect::<Vec<_>>().join(", ")
)]
struct UnhandledKind {
    group: String,
    version: String,
    kind: String,
}

/// The kinds the webhook reviews: the Istio kinds the store keeps (not the store's own kind,
/// which is no Kubernetes resource).
fn reviewed_kinds() -> impl Iterator<Item = Kind> {
    Kind::ALL
        .into_iter()
        .filter(|k| *k != Kind::ServiceEndpoints)
}

/// What the store says of a pod the injector moves: the warnings moving it gets, and the proxy
/// settings it will run with.
#[derive(Default)]
struct Looked {
    warnings: Vec<String>,
    settings: inject::StoredSettings,
}

/// The PASA kind a reviewed group/version/kind is, or why the webhook refuses it.
fn handled_kind(gvk: &GroupVersionKind) -> Result<Kind, UnhandledKind> {
    reviewed_kinds()
        .find(|k| k.group() == gvk.group && k.as_str() == gvk.kind)
        .ok_or_else(|| UnhandledKind {
            group: gvk.group.clone(),
            version: gvk.version.clone(),
            kind: gvk.kind.clone(),
        })
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

/// The API version and uid to answer an unreadable review with, as far as they can be read.
fn reply_identity(body: &[u8]) -> (String, String) {
    let doc: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let version = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .filter(|v| review::API_VERSIONS.contains(v))
        .unwrap_or(review::API_VERSIONS[0])
        .to_string();
    let uid = doc
        .pointer("/request/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    (version, uid)
}

/// Why a review was not read.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Review(review::Unreadable),
    #[error("the AdmissionReview could not be read: {0}")]
    Pool(#[source] tokio::task::JoinError),
}

/// The body of a review, or the answer to a body that could not be read whole: one over
/// [`MAX_BODY`] is refused with `413 Payload Too Large`, saying so, before any of it is parsed.
type Body = Result<Bytes, axum::extract::rejection::BytesRejection>;

async fn validate(State(hook): State<Arc<Webhook>>, headers: HeaderMap, body: Body) -> Response {
    answer(&hook, &headers, body, async |request| {
        hook.review(request).await
    })
    .await
}

async fn inject(State(hook): State<Arc<Webhook>>, headers: HeaderMap, body: Body) -> Response {
    inject_with(&hook, &headers, body, inject::PathSettings::default()).await
}

/// Istio's injection path with settings (`/inject/cluster/<id>/net/<network>`), as a remote
/// cluster's webhook configuration calls it.
async fn inject_at(
    State(hook): State<Arc<Webhook>>,
    Path(rest): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    inject_with(&hook, &headers, body, inject::PathSettings::parse(&rest)).await
}

async fn inject_with(
    hook: &Webhook,
    headers: &HeaderMap,
    body: Body,
    path: inject::PathSettings,
) -> Response {
    answer(hook, headers, body, async |request| {
        let mut answer =
            hook.injector
                .review_at(request, &inject::StoredSettings::default(), &path);
        if answer.verdict.patch.is_some() {
            match hook.keeps_with_istiod(request).await {
                Ok(looked) => {
                    // Again, with the proxy settings the store holds.
                    answer = hook.injector.review_at(request, &looked.settings, &path);
                    answer.verdict = review::warn(answer.verdict, looked.warnings);
                }
                Err(why) => {
                    answer = inject::Answer {
                        verdict: review::warn(
                            AdmissionResponse::from(request),
                            [format!("not moved to PASA (it stays with istiod): {why}")],
                        ),
                        result: "unenforced_policy",
                    };
                }
            }
        }
        hook.metrics
            .injections
            .get_or_create(&InjectionLabels {
                result: answer.result,
            })
            .inc();
        answer.verdict
    })
    .await
}

/// Reads an AdmissionReview, has `decide` judge its request, and answers in the review's API
/// version; HTTP-level problems (content type, empty body) are answered before any review.
async fn answer(
    hook: &Webhook,
    headers: &HeaderMap,
    body: Body,
    decide: impl AsyncFnOnce(&AdmissionRequest) -> AdmissionResponse,
) -> Response {
    let started = Instant::now();
    let count = |answer: Answer| {
        hook.metrics
            .webhook_requests
            .get_or_create(&WebhookLabels { answer })
            .inc();
    };
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            count(Answer::BadRequest);
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the AdmissionReview is larger than {} MiB ({MAX_BODY} bytes), the most this \
                     webhook reads: an object may be at most 1.5 MiB, as Kubernetes stores it\n",
                    MAX_BODY >> 20
                ),
            )
                .into_response();
        }
        Err(rejection) => {
            count(Answer::BadRequest);
            return (
                rejection.status(),
                format!(
                    "cannot read the AdmissionReview: {}\n",
                    rejection.body_text()
                ),
            )
                .into_response();
        }
    };
    if !is_json(headers) {
        count(Answer::BadRequest);
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json (an AdmissionReview)\n",
        )
            .into_response();
    }
    if body.is_empty() {
        count(Answer::BadRequest);
        return (
            StatusCode::BAD_REQUEST,
            "empty body: expected an AdmissionReview\n",
        )
            .into_response();
    }
    // Reading a review of megabytes is work on user input: on the pool, off the async workers.
    // An unreadable one is answered in its own API version and uid, as far as they can be read.
    let parsed = {
        let body = body.clone();
        hook.service
            .pool()
            .run(move || {
                review::parse(&body).map_err(|why| (ReadError::Review(why), reply_identity(&body)))
            })
            .await
            .unwrap_or_else(|e| {
                let identity = (review::API_VERSIONS[0].to_string(), String::new());
                Err((ReadError::Pool(e), identity))
            })
    };
    let verdict = match parsed {
        Ok(request) => decide(&request).await,
        Err((why, (version, uid))) => review::unreadable(&version, &uid, why),
    };
    count(if verdict.allowed {
        Answer::Allowed
    } else {
        Answer::Denied
    });
    hook.metrics
        .webhook_duration
        .observe(started.elapsed().as_secs_f64());
    (
        [(header::CONTENT_TYPE, "application/json")],
        review::to_json(&verdict.into_review()).to_string(),
    )
        .into_response()
}

/// The webhook's routes.
pub fn router(hook: Arc<Webhook>) -> Router {
    Router::new()
        .route("/validate", post(validate))
        .route("/inject", post(inject))
        .route("/inject/{*settings}", post(inject_at))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(hook)
}

/// How often the certificate files are checked for rotation (cert-manager, a mounted Secret).
const RELOAD_CHECK: Duration = Duration::from_secs(30);

/// Serves a rotated certificate from the next connection on; a broken pair is logged and the
/// current one kept.
fn reload_when_rotated(
    files: (std::path::PathBuf, std::path::PathBuf),
    config: axum_server::tls_rustls::RustlsConfig,
    every: Duration,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    // The files as they are now, when the served certificate was read from them.
    let mut last = tls::modified(&files);
    async move {
        loop {
            tokio::time::sleep(every).await;
            let now = tls::modified(&files);
            if now.is_none() || now == last {
                continue;
            }
            match tls::load(&files.0, &files.1) {
                Ok(cert) => {
                    config.reload_from_config(cert.config);
                    last = now;
                    tracing::info!(cert = %files.0.display(), "webhook certificate reloaded");
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "rotated webhook certificate not usable; keeping the current one"
                ),
            }
        }
    }
}

/// Serves the webhook over HTTPS on a bound listener until `shutdown` resolves.
pub async fn serve(
    listener: std::net::TcpListener,
    cert: &tls::ServingCert,
    hook: Arc<Webhook>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let config = axum_server::tls_rustls::RustlsConfig::from_config(cert.config.clone());
    if let Some(files) = cert.files.clone() {
        tokio::spawn(reload_when_rotated(files, config.clone(), RELOAD_CHECK));
    }
    let handle = axum_server::Handle::new();
    let stopper = handle.clone();
    tokio::spawn(async move {
        shutdown.await;
        stopper.graceful_shutdown(Some(DRAIN));
    });
    axum_server::tls_rustls::from_tcp_rustls(listener, config)?
        .handle(handle)
        .serve(router(hook).into_make_service())
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_rotated_certificate_is_served() {
        let dir = tempfile::tempdir().unwrap();
        let addr = "127.0.0.1:0".parse().unwrap();
        tls::generate(dir.path(), addr).unwrap();
        let files = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let first = tls::load(&files.0, &files.1).unwrap();
        let config = axum_server::tls_rustls::RustlsConfig::from_config(first.config.clone());
        tokio::spawn(reload_when_rotated(
            files,
            config.clone(),
            Duration::from_millis(10),
        ));
        // Rotation: a new serving certificate from the same CA, written over the files.
        tls::generate(dir.path(), addr).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::ptr_eq(&config.get_inner(), &first.config) {
            assert!(
                Instant::now() < deadline,
                "the rotated certificate was not loaded"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
