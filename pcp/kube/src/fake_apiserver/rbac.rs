//! The **fake** API server's authorisation, as Kubernetes' RBAC decides it: once roles are
//! loaded ([`super::FakeApiServer::enforce_rbac`]), a request is allowed only when a Role or
//! ClusterRole bound to its service account has a rule for its verb, API group, resource (and
//! name, when the rule names some); anything else gets 403 Forbidden with the API server's own
//! wording. A request without a token is anonymous and refused, as a cluster that does not
//! allow anonymous access refuses it.

use serde_json::Value;

/// What a request asks to do.
#[derive(Debug)]
pub(super) struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

/// A rule of a role.
#[derive(Debug, Clone)]
struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    names: Vec<String>,
}

impl Rule {
    fn allows(&self, a: &Attributes) -> bool {
        let has = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
        has(&self.groups, a.group)
            && has(&self.resources, a.resource)
            && has(&self.verbs, a.verb)
            && (self.names.is_empty() || a.name.is_some_and(|n| self.names.iter().any(|x| x == n)))
    }
}

/// A binding of a role to service accounts, cluster-wide or in one namespace.
#[derive(Debug, Clone)]
struct Binding {
    /// `None`: a ClusterRoleBinding.
    namespace: Option<String>,
    /// ("Role" | "ClusterRole", name).
    role: (String, String),
    /// Service accounts, as (namespace, name).
    subjects: Vec<(String, String)>,
}

/// Roles and bindings, as loaded from manifests.
#[derive(Debug, Default, Clone)]
pub(super) struct Rbac {
    /// (namespace or "" for a ClusterRole, kind, name) → rules.
    roles: Vec<((String, String, String), Vec<Rule>)>,
    bindings: Vec<Binding>,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

impl Rbac {
    /// Takes the Roles, ClusterRoles, RoleBindings and ClusterRoleBindings among `manifests`
    /// (other kinds are ignored).
    pub(super) fn load(&mut self, manifests: &[Value]) {
        for m in manifests {
            let kind = m["kind"].as_str().unwrap_or_default();
            let name = m["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let namespace = m["metadata"]["namespace"].as_str().map(str::to_string);
            match kind {
                "Role" | "ClusterRole" => {
                    let rules = m["rules"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|r| Rule {
                            groups: strings(&r["apiGroups"]),
                            resources: strings(&r["resources"]),
                            verbs: strings(&r["verbs"]),
                            names: strings(&r["resourceNames"]),
                        })
                        .collect();
                    let ns = if kind == "Role" {
                        namespace.unwrap_or_else(|| "default".into())
                    } else {
                        String::new()
                    };
                    self.roles.push(((ns, kind.to_string(), name), rules));
                }
                "RoleBinding" | "ClusterRoleBinding" => {
                    let subjects = m["subjects"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|s| s["kind"] == "ServiceAccount")
                        .map(|s| {
                            (
                                s["namespace"].as_str().unwrap_or_default().to_string(),
                                s["name"].as_str().unwrap_or_default().to_string(),
                            )
                        })
                        .collect();
                    let role = (
                        m["roleRef"]["kind"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        m["roleRef"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    );
                    let namespace = if kind == "RoleBinding" {
                        Some(namespace.unwrap_or_else(|| "default".into()))
                    } else {
                        None
                    };
                    self.bindings.push(Binding {
                        namespace,
                        role,
                        subjects,
                    });
                }
                _ => {}
            }
        }
    }

    fn rules_of(&self, binding: &Binding) -> impl Iterator<Item = &Rule> {
        let (kind, name) = &binding.role;
        let ns = match kind.as_str() {
            "Role" => binding.namespace.clone().unwrap_or_default(),
            _ => String::new(),
        };
        self.roles
            .iter()
            .filter(move |((n, k, r), _)| *n == ns && k == kind && r == name)
            .flat_map(|(_, rules)| rules)
    }

    /// Whether the service account `subject` (namespace, name) may do `a`.
    pub(super) fn allows(&self, subject: Option<&(String, String)>, a: &Attributes) -> bool {
        let Some(subject) = subject else {
            return false;
        };
        self.bindings
            .iter()
            .filter(|b| b.subjects.contains(subject))
            .filter(|b| match &b.namespace {
                None => true,
                Some(ns) => a.namespace == Some(ns.as_str()),
            })
            .any(|b| self.rules_of(b).any(|r| r.allows(a)))
    }
}

/// The API server's message for a refused request.
pub(super) fn forbidden_message(subject: Option<&(String, String)>, a: &Attributes) -> String {
    let user = match subject {
        Some((ns, name)) => format!("system:serviceaccount:{ns}:{name}"),
        None => "system:anonymous".to_string(),
    };
    let qualified = if a.group.is_empty() {
        a.resource.to_string()
    } else {
        format!("{}.{}", a.resource, a.group)
    };
    let object = match a.name {
        Some(name) => format!("{qualified} \"{name}\""),
        None => qualified,
    };
    let scope = match a.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    format!(
        "{object} is forbidden: User \"{user}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
        a.verb, a.resource, a.group
    )
}

/// The token a fake client of service account `namespace/name` presents.
pub(super) fn token_of(namespace: &str, name: &str) -> String {
    format!("fake-serviceaccount.{namespace}.{name}")
}

/// The service account a bearer token stands for.
pub(super) fn subject_of(authorization: Option<&str>) -> Option<(String, String)> {
    let token = authorization?.strip_prefix("Bearer ")?;
    let rest = token.strip_prefix("fake-serviceaccount.")?;
    let (ns, name) = rest.split_once('.')?;
    Some((ns.to_string(), name.to_string()))
}
