//! Whether a regular expression is one istiod accepts. istiod compiles it with Go's `regexp`
//! (RE2 syntax, as Envoy uses); PCP compiles it with Rust's `regex`, whose syntax is close to RE2.
//! Where the two differ on what is *valid*, this module follows Go:
//!
//! - `\Q…\E` quoting is RE2 (Go accepts it, `regex` does not): the quoted text is escaped first.
//! - Counted repetitions above 1000 (`a{1001}`) are refused by Go, accepted by `regex`.
//! - `\u…`/`\U…` escapes and the `x`/`R` flags exist only in `regex`: refused here.
//!
//! Remaining differences are in corners no route should need: very large programs hit different
//! size limits, nested counted repetitions whose product passes 1000 (`(a{2}){501}`) are refused by
//! Go only, and character-class set operations such as `[a--b]` parse differently.

use super::super::common::Check;

/// Longest expression istiod accepts (Envoy's program-size limit, approximated by length).
const MAX_REGEX_LENGTH: usize = 1024;

/// Deepest nesting of groups and repetitions Go's parser allows.
const MAX_NESTING: u32 = 1000;

/// Bytes `regex` may spend compiling an expression while checking it (see [`refusal`]).
const COMPILE_BUDGET: usize = 64 << 10;

/// Largest count RE2 allows in `{n}`, `{n,}` and `{n,m}`.
const MAX_REPEAT: u32 = 1000;

const RE2_SYNTAX: &str =
    "Istio uses RE2 style regex-based match (https://github.com/google/re2/wiki/Syntax)";

/// Checks an RE2 regular expression as istiod does.
pub(crate) fn validate(re: &str) -> Check {
    if re.len() > MAX_REGEX_LENGTH {
        return Err(format!(
            "regex is too large, max length allowed is {MAX_REGEX_LENGTH}"
        ));
    }
    match refusal(re) {
        None => Ok(()),
        Some(Refusal::Re2(e)) => Err(format!("{e}; {RE2_SYNTAX}")),
        Some(Refusal::Regex(e)) => Err(format!("invalid regex {re:?}: {e}; {RE2_SYNTAX}")),
    }
}

/// Why Go's `regexp` would refuse to compile `re`, if it would (no length limit applied).
pub(crate) fn syntax_error(re: &str) -> Option<String> {
    refusal(re).map(|r| match r {
        Refusal::Re2(e) | Refusal::Regex(e) => e,
    })
}

/// Why an expression is refused: by the RE2 rules checked here, or by `regex` itself.
enum Refusal {
    Re2(String),
    Regex(String),
}

fn refusal(re: &str) -> Option<Refusal> {
    let translated = match translate(re) {
        Ok(t) => t,
        Err(e) => return Some(Refusal::Re2(e)),
    };
    // Go's parser allows nesting 1000 deep; `regex` stops at 250 unless told. Only the syntax
    // matters here, and every syntax error comes before compiling: a small compile budget keeps a
    // large repetition (`(a{1000}){1000}`) from costing time, and is no refusal.
    match regex::RegexBuilder::new(&translated)
        .nest_limit(MAX_NESTING)
        .size_limit(COMPILE_BUDGET)
        .build()
    {
        Ok(_) | Err(regex::Error::CompiledTooBig(_)) => None,
        Err(e) => Some(Refusal::Regex(first_line(&e.to_string()).to_string())),
    }
}

fn first_line(message: &str) -> &str {
    message
        .lines()
        .rev()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| message.lines().next().unwrap_or_default())
}

/// Rewrites RE2-only syntax into `regex` syntax, and refuses what RE2 refuses but `regex` would
/// accept.
fn translate(re: &str) -> Result<String, String> {
    let chars: Vec<char> = re.chars().collect();
    let mut out = String::with_capacity(re.len());
    let mut in_class = false;
    // Whether the last thing read was a repetition (RE2 refuses `a**`, `a{2}+` and the like),
    // and where that repetition started.
    let mut after_repeat = false;
    let mut repeat_start = 0;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\\' {
            after_repeat = false;
            match next {
                // A trailing backslash: `regex` reports it.
                None => out.push(c),
                Some('Q') if !in_class => {
                    let rest: String = chars[i + 2..].iter().collect();
                    let (quoted, closed) = match rest.find("\\E") {
                        Some(end) => (&rest[..end], true),
                        None => (rest.as_str(), false),
                    };
                    out.push_str(&regex::escape(quoted));
                    i += 2 + quoted.chars().count() + if closed { 2 } else { 0 };
                    continue;
                }
                Some(u @ ('u' | 'U')) => {
                    return Err(format!("invalid escape sequence: \\{u}"));
                }
                // `\p{Greek}`, `\x{263a}`: copied with their braces.
                Some('p' | 'P' | 'x') if chars.get(i + 2) == Some(&'{') => {
                    let len = chars[i..]
                        .iter()
                        .position(|&c| c == '}')
                        .map_or(chars.len() - i, |p| p + 1);
                    out.extend(&chars[i..i + len]);
                    i += len;
                    continue;
                }
                Some(n) => {
                    out.push(c);
                    out.push(n);
                }
            }
            i += 2;
            continue;
        }
        if in_class {
            match c {
                // `[:alpha:]`; any other `[` is a plain member in RE2.
                '[' => match posix_class_len(&chars[i..]) {
                    Some(len) => {
                        out.extend(&chars[i..i + len]);
                        i += len;
                        continue;
                    }
                    None => out.push_str("\\["),
                },
                ']' => {
                    in_class = false;
                    out.push(c);
                }
                // Set operators in `regex`, plain members in RE2.
                '&' | '~' if next == Some(c) => {
                    out.push('\\');
                    out.push(c);
                }
                _ => out.push(c),
            }
            i += 1;
            continue;
        }
        let repeat_len = match c {
            '*' | '+' | '?' => Some(1),
            '{' => repeat_len(&chars[i + 1..])?.map(|len| len + 1),
            _ => None,
        };
        if let Some(len) = repeat_len {
            if after_repeat {
                // Go quotes both operators, the second with its `?` if lazy: `++`, `*??`.
                let lazy = usize::from(chars.get(i + len) == Some(&'?'));
                let ops: String = chars[repeat_start..i + len + lazy].iter().collect();
                return Err(format!("invalid nested repetition operator: `{ops}`"));
            }
            repeat_start = i;
            out.extend(&chars[i..i + len]);
            i += len;
            // A lazy repetition (`*?`) is still one operator.
            if chars.get(i) == Some(&'?') {
                out.push('?');
                i += 1;
            }
            after_repeat = true;
            continue;
        }
        after_repeat = false;
        match c {
            '[' => {
                in_class = true;
                out.push(c);
                i += 1;
                // A `]` (after an optional `^`) right at the start is a plain member.
                if chars.get(i) == Some(&'^') {
                    out.push('^');
                    i += 1;
                }
                if chars.get(i) == Some(&']') {
                    out.push_str("\\]");
                    i += 1;
                }
                continue;
            }
            '(' if next == Some('?') => {
                check_flags(&chars[i + 2..])?;
                out.push_str("(?");
                i += 2;
                continue;
            }
            // Braces that do not make a repetition are plain characters in RE2.
            '{' => out.push_str("\\{"),
            '}' => out.push_str("\\}"),
            _ => out.push(c),
        }
        i += 1;
    }
    Ok(out)
}

/// Length of a `[:name:]` class at the start of `chars`, if it is one.
fn posix_class_len(chars: &[char]) -> Option<usize> {
    if chars.get(1) != Some(&':') {
        return None;
    }
    let end = chars.iter().skip(2).position(|&c| c == ':')? + 2;
    (chars.get(end + 1) == Some(&']')).then_some(end + 2)
}

/// The flags of a `(?flags)` or `(?flags:…)` group: RE2 knows `i`, `m`, `s` and `U` only.
fn check_flags(after: &[char]) -> Check {
    // Named groups: `(?P<name>…)` and `(?<name>…)`.
    if matches!(after.first(), Some('P' | '<')) {
        return Ok(());
    }
    for &c in after {
        match c {
            ')' | ':' => return Ok(()),
            'i' | 'm' | 's' | 'U' | '-' => {}
            other => {
                return Err(format!(
                    "invalid or unsupported Perl syntax: flag {other:?} (RE2 knows i, m, s and U)"
                ));
            }
        }
    }
    Ok(())
}

/// A counted repetition `{n}`, `{n,}` or `{n,m}` starting after `{`: its length up to and
/// including `}`, or `None` when the brace does not start one. Counts above 1000 are refused.
fn repeat_len(after: &[char]) -> Result<Option<usize>, String> {
    let Some(end) = after.iter().position(|&c| c == '}') else {
        return Ok(None);
    };
    let body: String = after[..end].iter().collect();
    let (min, max) = match body.split_once(',') {
        Some((a, b)) => (a, b),
        None => (body.as_str(), ""),
    };
    let is_count = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !is_count(min) || !(max.is_empty() || is_count(max)) {
        return Ok(None);
    }
    let too_big = |s: &str| s.parse::<u32>().map_or(true, |n| n > MAX_REPEAT);
    if too_big(min) || (!max.is_empty() && too_big(max)) {
        return Err(format!(
            "invalid repeat count: {{{body}}} (at most {MAX_REPEAT})"
        ));
    }
    Ok(Some(end + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_what_re2_accepts() {
        for ok in [
            "^/service/([^/]+)(/.*)$",
            "/foo.*",
            "(?i)abc",
            "(?i:a)b",
            "(?P<name>x)",
            "\\Qa.b*c\\E+",
            "\\Qunterminated(",
            "[]a]",
            "[^]a]",
            "[[:alpha:]]+",
            "[a&&b]",
            "[a~~b]",
            "[[]",
            "a{2,1000}",
            "a{,5}",
            "x{y}",
            "a}",
            "{",
            "\\pL\\p{Greek}",
            "\\x{263a}[\\p{Lu}]",
            "a*?b+?c??d{2}?",
        ] {
            assert_eq!(validate(ok), Ok(()), "{ok:?}");
        }
    }

    #[test]
    fn refuses_what_re2_refuses() {
        for bad in [
            "[",
            "(",
            "a)",
            "(?x)a",
            "(?R)a",
            "\\u0041",
            "a{1001}",
            "a{1,1001}",
            "*",
            "a**",
            "a*??",
            "a{2}*",
            "a+{2}",
            "(?=a)",
            "\\1",
        ] {
            assert!(validate(bad).is_err(), "{bad:?}");
        }
        assert!(validate(&"a".repeat(1025)).is_err());
    }

    #[test]
    fn nested_repetitions_are_quoted_as_go_quotes_them() {
        assert_eq!(
            syntax_error("%#@~++==`24c234`").as_deref(),
            Some("invalid nested repetition operator: `++`")
        );
        assert_eq!(
            syntax_error("a*??").as_deref(),
            Some("invalid nested repetition operator: `*??`")
        );
        assert_eq!(
            syntax_error("a{2}*").as_deref(),
            Some("invalid nested repetition operator: `{2}*`")
        );
        assert_eq!(syntax_error(&"a".repeat(2000)), None);
    }
}
