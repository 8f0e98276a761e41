//! The one retry backoff every role uses: exponential from an initial
//! delay, doubling to a cap, each delay jittered into its upper half
//! (`[d/2, d]`) so that many clients retrying the same failure spread out
//! instead of arriving together. Runtime-agnostic: it hands out delays,
//! the caller sleeps (`tokio::time::sleep(backoff.next_delay())`).

use std::time::Duration;

/// A retry schedule (see the module doc).
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// Delays start around `initial` and double up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        let initial = initial.min(max);
        Backoff {
            initial,
            max,
            current: initial,
        }
    }

    /// The delay before the next attempt; the one after is twice as long
    /// (up to the cap).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.current;
        self.current = (self.current * 2).min(self.max);
        let half = d / 2;
        let spread = u64::try_from((d - half).as_nanos()).unwrap_or(u64::MAX);
        if spread == 0 {
            return d;
        }
        half + Duration::from_nanos(random() % (spread + 1))
    }

    /// Starts over from the initial delay (after a success).
    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

/// 64 random bits (the ULID generator's randomness: no extra dependency).
fn random() -> u64 {
    ulid::Ulid::generate().random() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_to_the_cap_within_their_upper_half() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let mut ceiling = Duration::from_millis(100);
        for _ in 0..10 {
            let d = b.next_delay();
            assert!(
                d >= ceiling / 2 && d <= ceiling,
                "{d:?} outside [{:?}, {ceiling:?}]",
                ceiling / 2
            );
            ceiling = (ceiling * 2).min(Duration::from_secs(1));
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn jitter_spreads_clients_out() {
        let delays: std::collections::HashSet<Duration> = (0..20)
            .map(|_| Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).next_delay())
            .collect();
        assert!(delays.len() > 1, "twenty clients got the same delay");
    }
}
