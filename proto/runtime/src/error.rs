//! Errors as a user reads them: one line with the error and every cause beneath it, each said
//! once (libraries often print their source in their own text and also return it, so a plain
//! walk of the chain says things twice).

/// Texts joined by `: `, leaving out an empty one and one the line already holds.
pub fn once_each(texts: impl IntoIterator<Item = String>) -> String {
    let mut line = String::new();
    for text in texts {
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// An error and the causes beneath it as one line, `outer: inner: innermost`, each said once.
pub fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    once_each(std::iter::successors(Some(error), |e| e.source()).map(ToString::to_string))
}

/// Ends a process that failed: `Error: ` and the error with its causes on one line on stderr
/// (not a debug layout, nor a backtrace), and exit status 1.
pub fn exit(error: &(dyn std::error::Error + 'static)) -> std::process::ExitCode {
    eprintln!("Error: {}", causes(error));
    std::process::ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    /// An error that prints its source and also returns it, as some libraries' do.
    #[derive(Debug, thiserror::Error)]
    #[error("tcp connect error: {0}")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn causes_are_said_once_each() {
        let io = || std::io::Error::from_raw_os_error(111);
        let text = causes(&Outer(Middle(io())));
        assert_eq!(text, format!("outer: tcp connect error: {}", io()));
        assert_eq!(
            once_each(["a".to_string(), String::new(), "b".into(), "a".into()]),
            "a: b"
        );
    }
}
