//! Whether a destination may be sent to now: the offline backoff of a whole destination, a
//! 429 pause, and a disabled flag.
//!
//! The backoff and the pause are kept in memory only: a device that restarts after a week
//! offline simply probes once. (Disabling is persisted by the writer; this is its mirror.)

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};

use std::time::Duration;

use crate::backoff::Backoff;
use crate::transport::Attempt;

/// How a destination's gate reacts to answers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GatePolicy {
    /// Backoff of an unreachable destination.
    pub offline: Backoff,
    /// Longest 429 pause honoured.
    pub retry_after_cap: Duration,
    /// Pause after a 429 without `Retry-After`.
    pub default_pause: Duration,
}

/// The reachability of one destination, written by the relay's writer thread and read by its
/// delivery workers (which skip events while the destination is known to be offline).
#[derive(Debug, Default)]
pub(crate) struct Reachability {
    /// Clock time (unix ms) before which nobody should try the destination.
    offline_until: AtomicI64,
    /// Consecutive bursts of unreachable attempts; zero once the receiver answers.
    failures: AtomicU32,
    /// Clock time before which the receiver asked (429) not to be sent to.
    paused_until: AtomicI64,
    /// Set while the destination is disabled (410, or an operator).
    disabled: AtomicBool,
}

impl Reachability {
    /// Records an attempt that got no answer. Failures inside the current offline window come
    /// from requests that were already in flight and do not deepen the backoff.
    pub fn mark_unreachable(&self, now: i64, backoff: &Backoff) {
        if now < self.offline_until.load(Ordering::Acquire) {
            return;
        }
        let failures = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        let wait = backoff.equal_jitter(failures).as_millis() as i64;
        self.offline_until.store(now + wait, Ordering::Release);
    }

    /// Records an answer (any status): the destination is reachable again.
    pub fn mark_answered(&self) {
        self.failures.store(0, Ordering::Release);
        self.offline_until.store(0, Ordering::Release);
    }

    /// Updates the gate from one attempt's outcome, as soon as it is known.
    pub fn observe(&self, attempt: &Attempt, now: i64, policy: &GatePolicy) {
        match attempt {
            Attempt::Answered {
                status,
                retry_after,
                ..
            } => {
                self.mark_answered();
                match status {
                    // Throttled: this destination waits; the others go on.
                    429 => {
                        let wait = retry_after
                            .map_or(policy.default_pause, |d| d.min(policy.retry_after_cap));
                        self.pause_until(now.saturating_add(wait.as_millis() as i64));
                    }
                    410 => self.set_disabled(true),
                    _ => {}
                }
            }
            Attempt::Unreachable { .. } => self.mark_unreachable(now, &policy.offline),
            Attempt::Unsendable { .. } => {}
        }
    }

    /// Pauses the destination until `until` (clock time), unless it already waits longer.
    pub fn pause_until(&self, until: i64) {
        self.paused_until.fetch_max(until, Ordering::AcqRel);
    }

    /// Marks the destination disabled or enabled.
    pub fn set_disabled(&self, disabled: bool) {
        self.disabled.store(disabled, Ordering::Release);
    }

    /// Whether nothing should be sent at `now`: offline, paused or disabled. Workers check
    /// this before each request, so events already queued are handed back, not sent.
    pub fn is_closed(&self, now: i64) -> bool {
        self.is_offline(now)
            || now < self.paused_until.load(Ordering::Acquire)
            || self.disabled.load(Ordering::Acquire)
    }

    /// Whether the destination is inside its offline window at `now`.
    pub fn is_offline(&self, now: i64) -> bool {
        now < self.offline_until.load(Ordering::Acquire)
    }

    /// When the offline window ends (0 if there is none).
    #[cfg(test)]
    pub fn offline_until(&self) -> i64 {
        self.offline_until.load(Ordering::Acquire)
    }

    /// Whether the last attempts went unanswered, so the next claim should be a single probe.
    pub fn is_suspect(&self) -> bool {
        self.failures.load(Ordering::Acquire) > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OFFLINE: Backoff = Backoff {
        base: Duration::from_millis(100),
        cap: Duration::from_millis(1_000),
    };

    #[test]
    fn unreachable_opens_a_window_and_an_answer_closes_it() {
        let r = Reachability::default();
        r.mark_unreachable(1_000, &OFFLINE);
        assert!(r.is_offline(1_000));
        assert!(r.is_suspect());
        assert!(!r.is_offline(1_100));
        r.mark_answered();
        assert!(!r.is_offline(1_000) && !r.is_suspect());
    }

    #[test]
    fn answers_close_the_gate_at_once() {
        let policy = GatePolicy {
            offline: OFFLINE,
            retry_after_cap: Duration::from_secs(10),
            default_pause: Duration::from_secs(1),
        };
        let answer = |status, retry_after| Attempt::Answered {
            status,
            retry_after,
            detail: String::new(),
        };
        let r = Reachability::default();
        r.observe(&answer(429, Some(Duration::from_secs(3600))), 0, &policy);
        assert!(r.is_closed(9_999) && !r.is_closed(10_000), "capped pause");
        r.observe(&answer(410, None), 0, &policy);
        assert!(r.is_closed(1_000_000));
        let r = Reachability::default();
        let refused = Attempt::Unreachable {
            reason: "refused".into(),
        };
        r.observe(&refused, 0, &policy);
        assert!(r.is_offline(0) && r.is_suspect());
        r.observe(&answer(500, None), 10, &policy);
        assert!(!r.is_closed(10));
    }

    #[test]
    fn pause_and_disable_close_the_gate() {
        let r = Reachability::default();
        assert!(!r.is_closed(0));
        r.pause_until(500);
        r.pause_until(100); // a shorter pause does not cut a longer one
        assert!(r.is_closed(499) && !r.is_closed(500));
        r.set_disabled(true);
        assert!(r.is_closed(10_000));
        r.set_disabled(false);
        assert!(!r.is_closed(10_000));
    }

    #[test]
    fn failures_inside_the_window_do_not_deepen_it() {
        let r = Reachability::default();
        r.mark_unreachable(0, &OFFLINE);
        let until = r.offline_until();
        r.mark_unreachable(1, &OFFLINE);
        assert_eq!(r.offline_until(), until);
        assert_eq!(r.failures.load(Ordering::Relaxed), 1);
    }
}
