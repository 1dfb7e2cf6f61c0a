//! Retry timing: exponential backoff with full jitter.

use std::time::Duration;

/// An exponential backoff policy: `base · 2^(n-1)`, capped at `cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay before the first retry, before jitter.
    pub base: Duration,
    /// The longest delay, before jitter.
    pub cap: Duration,
}

impl Backoff {
    /// The un-jittered delay after the `n`th consecutive failure (`n` ≥ 1).
    pub fn ceiling(&self, n: u32) -> Duration {
        let exp = n.saturating_sub(1).min(30);
        self.base.saturating_mul(1u32 << exp).min(self.cap)
    }

    /// A delay drawn uniformly from `[0, ceiling(n)]` ("full jitter"), so that many events that
    /// failed together do not come back together.
    pub fn full_jitter(&self, n: u32) -> Duration {
        let ceiling = self.ceiling(n).as_millis() as u64;
        Duration::from_millis(fastrand::u64(0..=ceiling))
    }

    /// A delay drawn from `[ceiling(n)/2, ceiling(n)]`: jittered, but never near zero. Used to
    /// back off a whole destination, where waking at once would only fail again.
    pub fn equal_jitter(&self, n: u32) -> Duration {
        let ceiling = self.ceiling(n).as_millis() as u64;
        let half = ceiling / 2;
        Duration::from_millis(half + fastrand::u64(0..=ceiling - half))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Backoff = Backoff {
        base: Duration::from_millis(100),
        cap: Duration::from_secs(10),
    };

    #[test]
    fn ceiling_doubles_then_caps() {
        assert_eq!(POLICY.ceiling(1), Duration::from_millis(100));
        assert_eq!(POLICY.ceiling(2), Duration::from_millis(200));
        assert_eq!(POLICY.ceiling(5), Duration::from_millis(1600));
        assert_eq!(POLICY.ceiling(8), Duration::from_secs(10));
        assert_eq!(POLICY.ceiling(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn jitter_stays_within_its_range() {
        for n in 1..20 {
            let full = POLICY.full_jitter(n);
            assert!(full <= POLICY.ceiling(n));
            let equal = POLICY.equal_jitter(n);
            assert!(equal >= POLICY.ceiling(n) / 2 && equal <= POLICY.ceiling(n));
        }
    }
}
