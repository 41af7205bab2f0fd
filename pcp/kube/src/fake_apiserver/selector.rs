//! The fake API server's label and field selectors (`?labelSelector=`, `?fieldSelector=`), read
//! as the real one reads them: equality (`k=v`, `k==v`), inequality (`k!=v`) and existence (`k`,
//! `!k`) for labels, set terms (`k in (a,b)`, `k notin (a)`) too; fields by equality and
//! inequality on `metadata.name`, `metadata.namespace` and, for Secrets, `type`. Anything else
//! is refused with 400, as the real server refuses it.

use serde_json::Value;

/// One term of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Term {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

impl Term {
    fn matches(&self, get: &impl Fn(&str) -> Option<String>) -> bool {
        match self {
            Term::Equals(k, v) => get(k).as_deref() == Some(v.as_str()),
            Term::NotEquals(k, v) => get(k).as_deref() != Some(v.as_str()),
            Term::Exists(k) => get(k).is_some(),
            Term::NotExists(k) => get(k).is_none(),
            Term::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
            Term::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(&x)),
        }
    }
}

/// The objects a request selects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Selector {
    labels: Vec<Term>,
    fields: Vec<Term>,
}

impl Selector {
    /// Reads a request's selectors for the collection `plural`; the message of a 400 if they
    /// do not read.
    pub(super) fn parse(
        labels: Option<&String>,
        fields: Option<&String>,
        plural: &str,
    ) -> Result<Selector, String> {
        let mut selector = Selector::default();
        if let Some(text) = labels.filter(|t| !t.trim().is_empty()) {
            selector.labels =
                terms(text).map_err(|e| format!("unable to parse requirement: {e}"))?;
        }
        if let Some(text) = fields.filter(|t| !t.trim().is_empty()) {
            for term in terms(text).map_err(|e| format!("invalid field selector: {e}"))? {
                let field = match &term {
                    Term::Equals(k, _) | Term::NotEquals(k, _) => k.as_str(),
                    _ => {
                        return Err(format!(
                            "invalid selector: {text:?}: field selectors take = or !="
                        ));
                    }
                };
                let known = matches!(field, "metadata.name" | "metadata.namespace")
                    || (plural == "secrets" && field == "type");
                if !known {
                    return Err(format!("field label not supported: {field}"));
                }
                selector.fields.push(term);
            }
        }
        Ok(selector)
    }

    /// Whether `object` is selected.
    pub(super) fn matches(&self, object: &Value) -> bool {
        let label = |k: &str| object["metadata"]["labels"][k].as_str().map(str::to_string);
        let field = |k: &str| {
            let value = match k {
                "metadata.name" => &object["metadata"]["name"],
                "metadata.namespace" => &object["metadata"]["namespace"],
                _ => &object[k],
            };
            Some(value.as_str().unwrap_or_default().to_string())
        };
        self.labels.iter().all(|t| t.matches(&label))
            && self.fields.iter().all(|t| t.matches(&field))
    }
}

/// The comma-separated terms of a selector (commas inside `( )` belong to a set).
fn terms(text: &str) -> Result<Vec<Term>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("unbalanced ) in {text:?}"))?
            }
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts.into_iter().map(|p| term(p.trim())).collect()
}

fn term(text: &str) -> Result<Term, String> {
    let key = |k: &str| -> Result<String, String> {
        let k = k.trim();
        let ok = !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
        if ok {
            Ok(k.to_string())
        } else {
            Err(format!("invalid key {k:?}"))
        }
    };
    if let Some((k, v)) = text.split_once("!=") {
        return Ok(Term::NotEquals(key(k)?, v.trim().to_string()));
    }
    if let Some((k, v)) = text.split_once("==").or_else(|| text.split_once('=')) {
        return Ok(Term::Equals(key(k)?, v.trim().to_string()));
    }
    for (word, set) in [(" notin ", false), (" in ", true)] {
        if let Some((k, values)) = text.split_once(word) {
            let values = values.trim();
            let inner = values
                .strip_prefix('(')
                .and_then(|v| v.strip_suffix(')'))
                .ok_or_else(|| format!("{text:?}: a set is written (a,b)"))?;
            let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
            return Ok(if set {
                Term::In(key(k)?, values)
            } else {
                Term::NotIn(key(k)?, values)
            });
        }
    }
    match text.strip_prefix('!') {
        Some(k) => Ok(Term::NotExists(key(k)?)),
        None => Ok(Term::Exists(key(text)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_read_and_select_as_the_api_servers_do() {
        let secret = json!({"metadata": {"name": "east", "namespace": "pasa-system",
            "labels": {"istio/multiCluster": "true", "tier": "a"}}, "type": "Opaque"});
        let select = |labels: &str, fields: &str| {
            let (l, f) = (labels.to_string(), fields.to_string());
            Selector::parse(Some(&l), Some(&f), "secrets").map(|s| s.matches(&secret))
        };
        assert_eq!(select("istio/multiCluster=true", ""), Ok(true));
        assert_eq!(select("istio/multiCluster==false", ""), Ok(false));
        assert_eq!(select("tier in (a,b),!missing", ""), Ok(true));
        assert_eq!(select("tier notin (a)", ""), Ok(false));
        assert_eq!(
            select("", "type!=kubernetes.io/service-account-token"),
            Ok(true)
        );
        assert_eq!(select("", "metadata.name=west"), Ok(false));
        assert!(select("a b=c", "").is_err());
        assert!(select("", "spec.nodeName=x").is_err());
    }
}
