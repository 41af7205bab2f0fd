//! Small measurement helpers shared by the modes: percentiles and the process's peak RSS.

/// The `p`-th percentile (0–100) of `samples` by nearest rank; 0 for no samples.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The distribution of `samples` as its 101 percentiles (p0 to p100, nearest rank), rounded:
/// what the reports draw; empty for no samples.
pub fn cdf(samples: &[f64]) -> Vec<f64> {
    if samples.is_empty() {
        return Vec::new();
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    (0..=100)
        .map(|p| {
            let rank = ((f64::from(p) / 100.0) * sorted.len() as f64).ceil() as usize;
            round2(sorted[rank.clamp(1, sorted.len()) - 1])
        })
        .collect()
}

/// The p50, p99, max and mean of `samples`, as the reports give sizes.
pub fn sizes(samples: &[f64]) -> serde_json::Value {
    serde_json::json!({"p50": percentile(samples, 50.0), "p99": percentile(samples, 99.0),
                       "max": percentile(samples, 100.0), "mean": round2(mean(samples))})
}

/// Rounds to two decimals, for reporting.
pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Peak resident set size of this process in MiB (`VmHWM` of `/proc/self/status`), if the
/// platform reports it.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_hwm(&status)
}

/// Starts the peak resident set size over from the current one (Linux: `clear_refs` 5), so
/// that a later phase's peak can be read on its own; `false` when the platform cannot.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Resident set size of this process now, in MiB (`VmRSS`), if the platform reports it.
pub fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_kib(&status, "VmRSS:")
}

fn parse_vm_hwm(status: &str) -> Option<f64> {
    parse_kib(status, "VmHWM:")
}

/// Resident set size of process `pid` now, in MiB (`VmRSS`).
pub fn rss_mib_of(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_kib(&status, "VmRSS:")
}

/// A field of `/proc/meminfo` (`MemTotal:`, `MemAvailable:`), in MiB.
pub fn meminfo_mib(field: &str) -> Option<f64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_kib(&meminfo, field)
}

/// The mean of `samples`; 0 for none.
pub fn mean(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        0.0
    } else {
        samples.iter().sum::<f64>() / samples.len() as f64
    }
}

/// A `/proc` field counted in kB (`VmRSS:   1234 kB`), in MiB.
pub(crate) fn parse_kib(status: &str, field: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: f64 = line
        .trim_start_matches(field)
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(round2(kib / 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 50.0), 50.0);
        assert_eq!(percentile(&xs, 99.0), 99.0);
        assert_eq!(percentile(&xs, 100.0), 100.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn reads_vm_hwm() {
        let status = "Name:\tx\nVmPeak:\t  9000 kB\nVmHWM:\t    2048 kB\nVmRSS:\t 1024 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(2.0));
        assert_eq!(parse_vm_hwm("Name:\tx\n"), None);
    }
}
