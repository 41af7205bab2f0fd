//! `-l`/`--selector`: a label selector written as kubectl takes it (`app=web`, `tier!=db`,
//! `env in (prod,staging)`, `track notin (canary)`, `release`, `!legacy`, comma-separated, all
//! of them required), read into Kubernetes' own selector form. The store does not index labels:
//! `get` and `delete` list what the other arguments ask for and keep what the selector selects.

use pasa_istio::label_selector::{LabelRequirement, LabelSelector};

use super::UsageError;

/// Reads `text` as kubectl reads `-l`; an error names the part it cannot read.
pub fn parse(text: &str) -> Result<LabelSelector, UsageError> {
    let mut selector = LabelSelector::default();
    for part in requirements(text) {
        let part = part.trim();
        let bad = |why: &str| UsageError(format!("-l {text:?}: {part:?} {why}"));
        if part.is_empty() {
            return Err(bad(
                "is empty: write requirements as key=value, separated by commas",
            ));
        }
        let requirement = |key: &str, operator: &str, values: Vec<String>| {
            let key = key.trim();
            if !valid_key(key) {
                return Err(bad("has no valid label key"));
            }
            Ok(LabelRequirement {
                key: key.to_string(),
                operator: operator.to_string(),
                values,
            })
        };
        let set = |key: &str, operator: &str, rest: &str| {
            let values = rest
                .trim()
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| bad("needs its values in parentheses: key in (a,b)"))?;
            let values: Vec<String> = values
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect();
            if values.is_empty() {
                return Err(bad("lists no value"));
            }
            requirement(key, operator, values)
        };
        let expression = if let Some(key) = part.strip_prefix('!') {
            requirement(key, "DoesNotExist", vec![])?
        } else if let Some((key, value)) = part.split_once("!=") {
            requirement(key, "NotIn", vec![value.trim().to_string()])?
        } else if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
            let key = key.trim();
            if !valid_key(key) {
                return Err(bad("has no valid label key"));
            }
            selector
                .match_labels
                .insert(key.to_string(), value.trim().to_string());
            continue;
        } else if let Some((key, rest)) = part.split_once(" notin ") {
            set(key, "NotIn", rest)?
        } else if let Some((key, rest)) = part.split_once(" in ") {
            set(key, "In", rest)?
        } else {
            requirement(part, "Exists", vec![])?
        };
        selector.match_expressions.push(expression);
    }
    Ok(selector)
}

/// The comma-separated requirements of `text`; commas inside parentheses belong to a set.
fn requirements(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

/// A label key as Kubernetes has them: an optional DNS prefix and `/`, then a name of letters,
/// digits, `-`, `_` and `.`.
fn valid_key(key: &str) -> bool {
    let name = key.rsplit_once('/').map_or(key, |(_, name)| name);
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn kubectl_selectors_select_as_kubectl_does() {
        let web = labels(&[("app", "web"), ("env", "prod")]);
        let db = labels(&[("app", "db"), ("legacy", "yes")]);
        for (text, on_web, on_db) in [
            ("app=web", true, false),
            ("app==web", true, false),
            ("app!=web", false, true),
            ("env!=prod", false, true),
            ("env in (prod, staging)", true, false),
            ("app notin (db)", true, false),
            ("legacy", false, true),
            ("!legacy", true, false),
            ("app=web,env in (prod,staging),!legacy", true, false),
            ("example.com/team", false, false),
        ] {
            let selector = parse(text).unwrap();
            assert_eq!(selector.matches(&web), on_web, "{text} on web");
            assert_eq!(selector.matches(&db), on_db, "{text} on db");
        }
    }

    #[test]
    fn an_unreadable_selector_names_its_part() {
        for (text, said) in [
            ("app=web,", "\"\" is empty"),
            (
                "env in prod",
                "\"env in prod\" needs its values in parentheses",
            ),
            ("env in ()", "lists no value"),
            ("=web", "has no valid label key"),
            ("a b", "has no valid label key"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(said), "{text}: {e}");
        }
    }
}
