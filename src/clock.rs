//! Time as the outbox sees it, so backoff and lease expiry can be tested without sleeping.

use portable_atomic::AtomicI64;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in unix milliseconds.
///
/// Every timestamp the outbox stores (`created_at`, `available_at`, lease expiry) comes from
/// here. The relay still waits in real time between polls; only its decisions use the clock.
pub trait Clock: Send + Sync + 'static {
    /// Returns the current time in milliseconds since the unix epoch.
    fn now_ms(&self) -> i64;

    /// Milliseconds on a clock that counts only time passing, the device's sleep included,
    /// and no step of `now_ms` (from any origin; only differences are used), or `None`
    /// where there is none. Against it the relay tells a step of the wall clock (NTP
    /// correcting it, a user setting it) from time that passed, and moves deadlines with a
    /// step forward as with a step back. The default reads the system's time since boot
    /// (see the guide's relay chapter for which clock on which system); a clock that
    /// simulates time passing in tests, as [`ManualClock`] does, gives its own.
    fn elapsed_ms(&self) -> Option<i64> {
        crate::boot_time::since_boot().map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            // A clock set before 1970 is a broken device; treat it as the epoch.
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to: for tests of backoff, `Retry-After` and leases.
///
/// [`advance_ms`](Self::advance_ms) is time passing; [`set_ms`](Self::set_ms) is the clock
/// being set (a step, as NTP or a user makes), which a running relay follows. Clones share
/// the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<AtomicI64>,
    /// The time that passed (what `advance_ms` added), as [`Clock::elapsed_ms`] reads it.
    passed: Arc<AtomicI64>,
}

impl ManualClock {
    /// Creates a clock that reads `start_ms`.
    pub fn new(start_ms: i64) -> Self {
        ManualClock {
            now: Arc::new(AtomicI64::new(start_ms)),
            passed: Arc::new(AtomicI64::new(0)),
        }
    }

    /// Lets `ms` milliseconds pass: the clock moves forward by as much.
    pub fn advance_ms(&self, ms: i64) {
        self.passed.fetch_add(ms, Ordering::SeqCst);
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `ms` without time passing: a step of the clock.
    pub fn set_ms(&self, ms: i64) {
        self.now.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }

    fn elapsed_ms(&self) -> Option<i64> {
        Some(self.passed.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(1_000);
        let shared = clock.clone();
        assert_eq!(clock.now_ms(), 1_000);
        shared.advance_ms(500);
        assert_eq!(clock.now_ms(), 1_500);
    }

    #[test]
    fn a_manual_clock_set_is_a_step_and_advanced_is_time_passing() {
        let clock = ManualClock::new(1_000);
        clock.advance_ms(500);
        clock.set_ms(100_000);
        assert_eq!(clock.now_ms(), 100_000);
        assert_eq!(clock.elapsed_ms(), Some(500), "a step is no time passing");
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }
}
