//! `exportTo`: which namespaces see a service, VirtualService or DestinationRule, as Istio
//! decides it. The agent's scope and pcp's analysis both ask.

/// Whether a resource of `resource_ns` exported with `export_to` is visible in `viewer_ns`.
/// Empty is the mesh default, everywhere; `*` is everywhere, `.` the resource's own namespace,
/// `~` nowhere, anything else that namespace.
pub fn exported_to(export_to: &[String], resource_ns: &str, viewer_ns: &str) -> bool {
    if export_to.is_empty() {
        return true;
    }
    export_to.iter().any(|e| match e.as_str() {
        "*" => true,
        "." => resource_ns == viewer_ns,
        "~" => false,
        ns => ns == viewer_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::exported_to;

    #[test]
    fn export_to_reads_as_istio_reads_it() {
        let to = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(exported_to(&[], "a", "b"));
        assert!(exported_to(&to(&["*"]), "a", "b"));
        assert!(exported_to(&to(&["."]), "a", "a"));
        assert!(!exported_to(&to(&["."]), "a", "b"));
        assert!(!exported_to(&to(&["~"]), "a", "a"));
        assert!(exported_to(&to(&["c", "b"]), "a", "b"));
        assert!(!exported_to(&to(&["c"]), "a", "b"));
    }
}
