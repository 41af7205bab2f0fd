//! Durations on command lines (`500ms`, `30s`, `5m`, `1h`, or bare seconds), for the flags of
//! every PASA binary.

use std::time::Duration;

/// Reads `500ms`, `30s`, `5m`, `1h` or a bare number of seconds; the error says what is wrong.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number.parse().map_err(|_| {
        format!("{text:?} is not a duration: give a whole number with ms, s, m or h (e.g. 30s)")
    })?;
    let per_unit = match unit {
        "ms" => Duration::from_millis(1),
        "" | "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use ms, s, m or h)"
            ));
        }
    };
    per_unit
        .checked_mul(u32::try_from(value).map_err(|_| format!("{text:?} is too long"))?)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_errors() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse("5 minutes").unwrap_err().contains("unknown unit"));
        assert!(parse("s").unwrap_err().contains("not a duration"));
        assert!(parse("-1s").unwrap_err().contains("not a duration"));
    }
}
