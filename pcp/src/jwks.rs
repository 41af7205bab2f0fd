//! JWT issuers' keys, fetched once for the mesh: for every RequestAuthentication rule whose keys
//! are not inline, PCP fetches its `jwksUri` (or, without one, the `jwks_uri` its issuer's
//! OpenID discovery document names) and keeps the key set in the store as the `JsonWebKeySet`
//! named after the source, in the mesh's root namespace, where the agents read it. Agents never
//! fetch keys: 100k of them would all fetch the same URIs, and need egress to them.
//!
//! Key sets are fetched again every `--jwks-refresh` (20 minutes by default, as istiod), and at
//! once for a source that appears. A fetch that fails is logged and counted, and tried again
//! at the next pass (every 10 s) until it succeeds; a key set fetched before stays meanwhile.
//! Key sets no rule needs any more are deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use pasa_istio::request_authentication::{JsonWebKeySet, KeySetSource, RequestAuthentication};
use pasa_proto::Kind;
use pasa_proto::store::v1::{
    ApplyDocument, ApplyRequest, DeleteRequest, ListRequest, ObjectRef, Rule, Subscription,
};
use serde_json::json;
use tokio::sync::watch;

use crate::metrics::Origin;
use crate::write::WriteService;

/// How often the store is read for the sources rules need.
const PASS: Duration = Duration::from_secs(10);
/// The largest key set read.
const MAX_BYTES: usize = 1 << 20;

use pasa_runtime::fetch::{Client, FetchError};

/// Why a key set was not fetched, or the store not kept in step.
#[derive(Debug, thiserror::Error)]
enum JwksError {
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error("GET {url}: not UTF-8")]
    NotUtf8 { url: String },
    #[error("{url}: not JSON: {source}")]
    DiscoveryNotJson {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{url} names no jwks_uri")]
    NoJwksUri { url: String },
    #[error("{url}: not a JSON Web Key Set")]
    NotKeySet { url: String },
    #[error("{}", .0.message())]
    Store(#[source] Box<tonic::Status>),
}

impl From<tonic::Status> for JwksError {
    fn from(status: tonic::Status) -> Self {
        JwksError::Store(Box::new(status))
    }
}

/// The text at `url`.
async fn get(client: &Client, url: &str, timeout: Duration) -> Result<String, JwksError> {
    let body = pasa_runtime::fetch::get(client, url, timeout, MAX_BYTES).await?;
    String::from_utf8(body).map_err(|_| JwksError::NotUtf8 {
        url: url.to_string(),
    })
}

/// The keys of `source`: fetched from its URI, or from the URI its issuer's discovery document
/// names. The key set must be JSON with a `keys` list.
async fn fetch(
    client: &Client,
    source: &KeySetSource,
    timeout: Duration,
) -> Result<String, JwksError> {
    let uri = match source {
        KeySetSource::Uri(uri) => uri.clone(),
        KeySetSource::Issuer(issuer) => {
            let discovery = format!(
                "{}/.well-known/openid-configuration",
                issuer.trim_end_matches('/')
            );
            let document: serde_json::Value = serde_json::from_str(
                &get(client, &discovery, timeout).await?,
            )
            .map_err(|source| JwksError::DiscoveryNotJson {
                url: discovery.clone(),
                source,
            })?;
            document["jwks_uri"]
                .as_str()
                .ok_or_else(|| JwksError::NoJwksUri {
                    url: discovery.clone(),
                })?
                .to_string()
        }
    };
    let keys = get(client, &uri, timeout).await?;
    match serde_json::from_str::<serde_json::Value>(&keys) {
        Ok(v) if v["keys"].is_array() => Ok(keys),
        _ => Err(JwksError::NotKeySet { url: uri }),
    }
}

/// Keeps the key sets the stored RequestAuthentications need in `root_namespace`, until `stop`.
pub async fn keep(
    service: WriteService,
    root_namespace: String,
    refresh: Duration,
    mut stop: watch::Receiver<bool>,
) {
    // When each source was last fetched.
    let mut fetched: BTreeMap<KeySetSource, Instant> = BTreeMap::new();
    let client = pasa_runtime::fetch::client();
    loop {
        if let Err(e) = pass(&client, &service, &root_namespace, refresh, &mut fetched).await {
            tracing::warn!(error = %e, "JWT key sets: the store could not be read; trying again");
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(PASS) => {}
        }
    }
}

async fn list(
    service: &WriteService,
    kind: Kind,
    namespace: Option<&str>,
) -> Result<Vec<pasa_proto::store::v1::Resource>, JwksError> {
    let request = ListRequest {
        selector: Some(Subscription {
            rules: vec![Rule {
                kinds: vec![kind.as_str().to_string()],
                namespaces: namespace.map(|n| vec![n.to_string()]).unwrap_or_default(),
                ..Default::default()
            }],
        }),
        revision: 0,
    };
    service
        .upstream()
        .call(&request, |mut store, request| async move {
            store.list(request).await
        })
        .await
        .map(|r| r.into_inner().resources)
        .map_err(JwksError::from)
}

async fn pass(
    client: &Client,
    service: &WriteService,
    root_namespace: &str,
    refresh: Duration,
    fetched: &mut BTreeMap<KeySetSource, Instant>,
) -> Result<(), JwksError> {
    // The sources the rules need, each with the longest timeout a rule asks for.
    let mut needed: BTreeMap<KeySetSource, Duration> = BTreeMap::new();
    for ra in list(service, Kind::RequestAuthentication, None).await? {
        let Ok(spec) = pasa_istio::parse_spec_json::<RequestAuthentication>(&ra.spec_json) else {
            continue;
        };
        for rule in spec.jwt_rules.iter().flatten() {
            if let Some(source) = KeySetSource::of(rule) {
                let timeout = rule
                    .timeout
                    .and_then(|t| t.to_std())
                    .unwrap_or(Duration::from_secs(5));
                let entry = needed.entry(source).or_insert(timeout);
                *entry = (*entry).max(timeout);
            }
        }
    }
    let stored: BTreeSet<String> = list(service, Kind::JsonWebKeySet, Some(root_namespace))
        .await?
        .into_iter()
        .map(|r| r.name)
        .collect();
    for (source, timeout) in &needed {
        let name = source.object_name();
        let fresh =
            fetched.get(source).is_some_and(|at| at.elapsed() < refresh) && stored.contains(&name);
        if fresh {
            continue;
        }
        match fetch(client, source, *timeout).await {
            Ok(jwks) => {
                let (jwks_uri, issuer) = match source {
                    KeySetSource::Uri(uri) => (uri.clone(), String::new()),
                    KeySetSource::Issuer(issuer) => (String::new(), issuer.clone()),
                };
                let spec = JsonWebKeySet {
                    jwks_uri,
                    issuer,
                    jwks,
                };
                let object = json!({
                    "apiVersion": "pasa.io/v1alpha1",
                    "kind": Kind::JsonWebKeySet.as_str(),
                    "metadata": {"name": name, "namespace": root_namespace},
                    "spec": spec,
                });
                let request = ApplyRequest {
                    documents: vec![ApplyDocument {
                        json: object.to_string(),
                        expected_mod_revision: None,
                    }],
                    dry_run: false,
                };
                match service.admit_and_apply(request, Origin::JwtKeys).await {
                    Ok(answer) if answer.errors.is_empty() => {
                        tracing::info!(source = ?source, object = %name, "JWT key set fetched and stored");
                        fetched.insert(source.clone(), Instant::now());
                    }
                    Ok(answer) => {
                        tracing::error!(source = ?source, errors = ?answer.errors, "a fetched JWT key set was refused")
                    }
                    Err(status) => return Err(status.into()),
                }
            }
            Err(e) => {
                service.metrics().jwks_fetch_failures.inc();
                tracing::warn!(source = ?source, error = %e, "a JWT key set could not be fetched; trying again");
            }
        }
    }
    // Key sets no rule needs any more.
    let wanted: BTreeSet<String> = needed.keys().map(KeySetSource::object_name).collect();
    let unneeded: Vec<ObjectRef> = stored
        .difference(&wanted)
        .map(|name| ObjectRef {
            kind: Kind::JsonWebKeySet.as_str().to_string(),
            namespace: root_namespace.to_string(),
            name: name.clone(),
        })
        .collect();
    if !unneeded.is_empty() {
        let request = DeleteRequest {
            refs: unneeded,
            expected_mod_revision: None,
            ignore_not_found: true,
        };
        service
            .upstream()
            .call(&request, |mut store, request| async move {
                store.delete(request).await
            })
            .await?;
    }
    fetched.retain(|source, _| needed.contains_key(source));
    Ok(())
}
