//! The reader of a remote cluster, as `deploy/remote` ships it: the ServiceAccount, its
//! read-only ClusterRole and binding, and its token Secret. `--create-service-account` creates
//! them (for another account or namespace, renamed) when the account has no token Secret.

use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Client;
use kube::api::{Api, PostParams};
use pasa_kube::problem::Problem;
use serde_json::{Value, json};

use super::{ACCOUNT_ANNOTATION, RemoteSecretError};

/// `deploy/remote`'s objects (file, text): what `--create-service-account` creates, for the
/// default account in `istio-system`, and renamed for another.
const READER_MANIFESTS: [(&str, &str); 4] = [
    (
        "serviceaccount.yaml",
        include_str!("../../../../../../deploy/remote/serviceaccount.yaml"),
    ),
    (
        "clusterrole.yaml",
        include_str!("../../../../../../deploy/remote/clusterrole.yaml"),
    ),
    (
        "clusterrolebinding.yaml",
        include_str!("../../../../../../deploy/remote/clusterrolebinding.yaml"),
    ),
    (
        "token-secret.yaml",
        include_str!("../../../../../../deploy/remote/token-secret.yaml"),
    ),
];

/// Creates the reader's objects (`deploy/remote`'s, for `account` in `namespace`) and the
/// namespace if it is missing; one that exists already is kept as it is. Returns the token
/// Secret.
pub(super) async fn create_reader(
    client: &Client,
    namespace: &str,
    account: &str,
) -> Result<Secret, RemoteSecretError> {
    let create = PostParams::default();
    let failed = |object: String| {
        move |e: kube::Error| RemoteSecretError::Create {
            object,
            problem: Problem::of(&e),
        }
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let missing = match namespaces.get_opt(namespace).await {
        Ok(found) => found.is_none(),
        Err(e) => return Err(failed(format!("Namespace {namespace}"))(e)),
    };
    if missing {
        let object = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(namespace.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        kept_if_exists(namespaces.create(&create, &object).await)
            .map_err(failed(format!("Namespace {namespace}")))?;
    }
    let mut token = None;
    for manifest in reader_manifests(namespace, account) {
        let name = manifest["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let kind = manifest["kind"].as_str().unwrap_or_default().to_string();
        let object = match kind.as_str() {
            "ClusterRole" | "ClusterRoleBinding" => format!("{kind} {name}"),
            _ => format!("{kind} {namespace}/{name}"),
        };
        let made = match kind.as_str() {
            "ServiceAccount" => {
                let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
                created(&api, &create, manifest).await
            }
            "ClusterRole" => {
                let api: Api<ClusterRole> = Api::all(client.clone());
                created(&api, &create, manifest).await
            }
            "ClusterRoleBinding" => {
                let api: Api<ClusterRoleBinding> = Api::all(client.clone());
                created(&api, &create, manifest).await
            }
            _ => {
                let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
                let made = match from_json(manifest) {
                    Ok(secret) => api.create(&create, &secret).await,
                    Err(e) => Err(e),
                };
                match made {
                    Ok(created) => {
                        token = Some(created);
                        Ok(())
                    }
                    // There after all (another run at the same time): read it.
                    Err(e) if is_conflict(&e) => api.get(&name).await.map(|s| {
                        token = Some(s);
                    }),
                    Err(e) => Err(e),
                }
            }
        };
        made.map_err(failed(object))?;
    }
    token.ok_or_else(|| RemoteSecretError::Create {
        object: "the token Secret".into(),
        problem: Problem {
            reason: pasa_kube::problem::Reason::Error,
            message: "deploy/remote has none".into(),
        },
    })
}

/// Creates `manifest` with `api`; one that exists already is kept as it is.
async fn created<T>(api: &Api<T>, create: &PostParams, manifest: Value) -> Result<(), kube::Error>
where
    T: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let object: T = from_json(manifest)?;
    kept_if_exists(api.create(create, &object).await).map(|_| ())
}

/// A creation answered "already exists" is as good as done: what is there is kept.
fn kept_if_exists<T>(created: Result<T, kube::Error>) -> Result<Option<T>, kube::Error> {
    match created {
        Ok(object) => Ok(Some(object)),
        Err(e) if is_conflict(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 409)
}

/// A typed object from JSON (deploy/remote's manifests).
fn from_json<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, kube::Error> {
    serde_json::from_value(value).map_err(kube::Error::SerdeError)
}

/// `deploy/remote`'s objects for the ServiceAccount `account` in `namespace`: the account, its
/// token Secret and the binding renamed; the ClusterRole is the same for every reader.
fn reader_manifests(namespace: &str, account: &str) -> Vec<Value> {
    let shipped = READER_MANIFESTS
        .iter()
        .filter_map(|(_, text)| serde_saphyr::from_str::<Value>(text).ok());
    shipped
        .map(|mut object| {
            let kind = object["kind"].as_str().unwrap_or_default().to_string();
            let metadata = &mut object["metadata"];
            match kind.as_str() {
                "ServiceAccount" => {
                    metadata["name"] = json!(account);
                    metadata["namespace"] = json!(namespace);
                }
                "Secret" => {
                    metadata["name"] = json!(format!("{account}-istio-remote-secret-token"));
                    metadata["namespace"] = json!(namespace);
                    metadata["annotations"][ACCOUNT_ANNOTATION] = json!(account);
                }
                "ClusterRoleBinding" => {
                    let shipped = &object["subjects"][0];
                    if shipped["name"] != account || shipped["namespace"] != namespace {
                        let name = object["metadata"]["name"].as_str().unwrap_or_default();
                        object["metadata"]["name"] = json!(format!("{name}-{namespace}-{account}"));
                    }
                    object["subjects"] = json!([{"kind": "ServiceAccount", "name": account,
                                                 "namespace": namespace}]);
                }
                _ => {}
            }
            object
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::{DEFAULT_SERVICE_ACCOUNT, is_token_of};
    use super::*;

    /// The shipped reader is created as it is; another account gets its own binding and token.
    #[test]
    fn the_reader_objects_follow_the_account() {
        let shipped = reader_manifests("istio-system", DEFAULT_SERVICE_ACCOUNT);
        assert_eq!(shipped.len(), READER_MANIFESTS.len(), "every file reads");
        let kinds: Vec<&str> = shipped.iter().filter_map(|m| m["kind"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Secret"
            ]
        );
        assert_eq!(shipped[2]["metadata"]["name"], "pasa-remote-reader");
        let other = reader_manifests("mesh", "reader");
        let mut account = shipped[0]["metadata"].clone();
        account["name"] = json!("reader");
        account["namespace"] = json!("mesh");
        assert_eq!(other[0]["metadata"], account);
        assert_eq!(other[1], shipped[1], "one ClusterRole for every reader");
        assert_eq!(
            other[2]["metadata"]["name"],
            "pasa-remote-reader-mesh-reader"
        );
        assert_eq!(
            other[2]["subjects"],
            json!([{"kind": "ServiceAccount", "name": "reader", "namespace": "mesh"}])
        );
        assert_eq!(
            other[3]["metadata"]["name"],
            "reader-istio-remote-secret-token"
        );
        assert_eq!(
            other[3]["metadata"]["annotations"][ACCOUNT_ANNOTATION],
            "reader"
        );
        let token: Secret = from_json(other[3].clone()).unwrap();
        assert!(is_token_of(&token, "reader") && !is_token_of(&token, "someone-else"));
    }
}
