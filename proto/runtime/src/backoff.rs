//! Waiting before trying again.

use std::time::{Duration, Instant};

/// How long to wait before trying again after a failure: doubling from `first` to `max`, each
/// wait spread by ±25 % so that a fleet that lost its server at one moment does not come back
/// in step (100k agents after a store restart). Success counts only once it lasted: after
/// [`Backoff::up`], the next failure starts from `first` again only if the connection stayed up
/// for `stable`; [`Backoff::reset`] starts over at once (for a success that proves itself, such
/// as a complete answer).
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    stable: Duration,
    next: Duration,
    up_since: Option<Instant>,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration, stable: Duration) -> Backoff {
        Backoff {
            first,
            max: max.max(first),
            stable,
            next: first,
            up_since: None,
        }
    }

    /// The wait after a failure.
    pub fn failed(&mut self) -> Duration {
        if self
            .up_since
            .take()
            .is_some_and(|since| since.elapsed() >= self.stable)
        {
            self.next = self.first;
        }
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        base.mul_f64(spread())
    }

    /// The connection is up (it counts as recovered once it has been up for `stable`).
    pub fn up(&mut self) {
        self.up_since.get_or_insert_with(Instant::now);
    }

    /// Starts over from `first`.
    pub fn reset(&mut self) {
        self.next = self.first;
        self.up_since = None;
    }
}

/// A factor in 0.75..=1.25.
fn spread() -> f64 {
    0.75 + random_fraction() / 2.0
}

/// A number in 0..=1, drawn from the thread's random generator (seeded from the operating
/// system): enough to spread a fleet's retries and renewals, not for anything secret.
pub fn random_fraction() -> f64 {
    rand::random_range(0.0..=1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within(wait: Duration, base_ms: u64) -> bool {
        let ms = wait.as_secs_f64() * 1e3;
        ms >= base_ms as f64 * 0.75 - 0.001 && ms <= base_ms as f64 * 1.25 + 0.001
    }

    #[test]
    fn doubles_to_the_ceiling_with_jitter_and_resets_only_after_a_stable_period() {
        let mut b = Backoff::new(
            Duration::from_millis(100),
            Duration::from_millis(400),
            Duration::from_secs(3600),
        );
        for base in [100, 200, 400, 400] {
            let wait = b.failed();
            assert!(within(wait, base), "{wait:?} around {base} ms");
        }
        // Up, but not for long: the next failure keeps backing off.
        b.up();
        assert!(within(b.failed(), 400));
        b.reset();
        assert!(within(b.failed(), 100));
        let mut quick = Backoff::new(
            Duration::from_millis(100),
            Duration::from_secs(1),
            Duration::ZERO,
        );
        quick.failed();
        quick.failed();
        quick.up();
        assert!(within(quick.failed(), 100), "stable at once: starts over");
        let spreads: std::collections::BTreeSet<u64> =
            (0..20).map(|_| (spread() * 1e6) as u64).collect();
        assert!(spreads.len() > 1, "the jitter varies");
    }

    #[test]
    fn successive_waits_differ_and_stay_within_the_spread() {
        // At the ceiling from the start, so every wait has the same base.
        let mut b = Backoff::new(
            Duration::from_millis(1000),
            Duration::from_millis(1000),
            Duration::from_secs(3600),
        );
        let waits: Vec<Duration> = (0..50).map(|_| b.failed()).collect();
        for wait in &waits {
            assert!(within(*wait, 1000), "{wait:?} around 1000 ms");
        }
        // Waits are spread over half a second in nanoseconds: two equal ones in a row would
        // mean the jitter is not drawn afresh.
        for pair in waits.windows(2) {
            assert_ne!(pair[0], pair[1], "successive waits differ");
        }
    }

    #[test]
    fn random_fractions_stay_in_zero_to_one_and_vary() {
        let fractions: Vec<f64> = (0..1000).map(|_| random_fraction()).collect();
        assert!(fractions.iter().all(|f| (0.0..=1.0).contains(f)));
        assert!(fractions.iter().any(|&f| f < 0.25));
        assert!(fractions.iter().any(|&f| f > 0.75));
    }
}
