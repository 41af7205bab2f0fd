//! Durations on command lines (`500ms`, `30s`, `5m`, `1h`, or bare seconds), for the flags of
//! every PASA binary; and Go's durations, as Istio's decoders read them.

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

/// A duration as Go's `time.ParseDuration` reads one (`300ms`, `-1.5h`, `2h45m`, `0`), in
/// nanoseconds: how Istio's decoders read a `google.protobuf.Duration` in JSON (EnvoyFilter patch
/// values, for instance). The error is Go's.
pub fn parse_go(text: &str) -> Result<f64, String> {
    let invalid = || format!("time: invalid duration {text:?}");
    let s = text.strip_prefix(['-', '+']).unwrap_or(text);
    if s == "0" {
        return Ok(0.0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    // Go's limit is 2^63 ns either way (less one when positive); a float cannot tell them apart.
    let limit = 2f64.powi(63);
    let mut total = 0.0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = |r: &str| r.bytes().take_while(u8::is_ascii_digit).count();
        let whole_len = digits(rest);
        let whole = &rest[..whole_len];
        rest = &rest[whole_len..];
        let mut fraction = "";
        if let Some(after) = rest.strip_prefix('.') {
            let n = digits(after);
            fraction = &after[..n];
            rest = &after[n..];
        }
        if whole.is_empty() && fraction.is_empty() {
            return Err(invalid());
        }
        let unit_len = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let nanos_per_unit: f64 = match unit {
            "" => return Err(format!("time: missing unit in duration {text:?}")),
            "ns" => 1.0,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            other => {
                return Err(format!("time: unknown unit {other:?} in duration {text:?}"));
            }
        };
        let number: f64 = format!(
            "{}.{}",
            if whole.is_empty() { "0" } else { whole },
            fraction
        )
        .trim_end_matches('.')
        .parse()
        .map_err(|_| invalid())?;
        total += number * nanos_per_unit;
        if total > limit || (total == limit && !text.starts_with('-')) {
            return Err(invalid());
        }
    }
    Ok(if text.starts_with('-') { -total } else { total })
}

/// A duration in nanoseconds as protobuf JSON writes it (Go's `protojson`): whole seconds, or
/// 3, 6 or 9 decimals (`1s`, `0.001s`, `1.500s`).
pub fn protobuf_json(nanos: f64) -> String {
    let sign = if nanos < 0.0 { "-" } else { "" };
    let nanos = nanos.abs().round() as u128;
    let (whole, fraction) = (nanos / 1_000_000_000, nanos % 1_000_000_000);
    if fraction == 0 {
        format!("{sign}{whole}s")
    } else if fraction % 1_000_000 == 0 {
        format!("{sign}{whole}.{:03}s", fraction / 1_000_000)
    } else if fraction % 1_000 == 0 {
        format!("{sign}{whole}.{:06}s", fraction / 1_000)
    } else {
        format!("{sign}{whole}.{fraction:09}s")
    }
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

    #[test]
    fn go_durations_read_as_go_reads_them() {
        assert_eq!(parse_go("500ms"), Ok(5e8));
        assert_eq!(parse_go("1h2m3.5s"), Ok(3_723.5e9));
        assert_eq!(parse_go("-1.5us"), Ok(-1500.0));
        assert_eq!(parse_go("0"), Ok(0.0));
        assert!(parse_go("5").unwrap_err().contains("missing unit"));
        assert!(parse_go("3d").unwrap_err().contains("unknown unit"));
    }

    #[test]
    fn protobuf_json_writes_3_6_or_9_decimals() {
        assert_eq!(protobuf_json(1e6), "0.001s");
        assert_eq!(protobuf_json(1.5e9), "1.500s");
        assert_eq!(protobuf_json(-2e9), "-2s");
        assert_eq!(protobuf_json(1_000.0), "0.000001s");
        assert_eq!(protobuf_json(1.0), "0.000000001s");
    }
}
