//! Regular expressions as Istio writes them for Envoy (RE2 syntax).

/// Escapes the metacharacters of `text`, as Go's `regexp.QuoteMeta` does.
pub fn quote_meta(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if r"\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
