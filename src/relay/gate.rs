//! A destination's gate: whether it may be sent to now. It closes for the offline backoff of
//! a destination that cannot be reached, for a receiver's 429 pause, and while the
//! destination is disabled.
//!
//! Written by the delivery workers the moment an attempt's decision is known (so queued
//! requests are not sent into a closed gate) and read by the writer before it claims. The
//! backoff and the pause are kept in memory only: a device that restarts after a week
//! offline simply probes once. (Disabling is persisted by the writer; the gate mirrors it.)
//!
//! Both run on `Instant`, not on the wall clock: a clock that jumps (set by NTP after a boot
//! without a real-time clock, or by hand) neither stretches a 30 s backoff into a day nor
//! cuts a pause short.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::relay::decide::GateChange;

/// The gate of one destination, shared by its lane and its workers.
#[derive(Debug)]
pub(crate) struct Gate {
    /// Backoff of the whole destination while it cannot be reached.
    offline: Backoff,
    /// The instant the times below count from, in milliseconds.
    epoch: Instant,
    /// Milliseconds after `epoch` before which nobody should try the destination.
    offline_until: AtomicI64,
    /// Consecutive bursts of unreachable attempts; zero once the receiver answers.
    failures: AtomicU32,
    /// Milliseconds after `epoch` before which the receiver asked (429) not to be sent to.
    paused_until: AtomicI64,
    /// Set while the destination is disabled (410, or an operator).
    disabled: AtomicBool,
}

impl Gate {
    /// An open gate that backs off by `offline` while the destination is unreachable.
    pub fn new(offline: Backoff) -> Gate {
        Gate {
            offline,
            epoch: Instant::now(),
            offline_until: AtomicI64::new(0),
            failures: AtomicU32::new(0),
            paused_until: AtomicI64::new(0),
            disabled: AtomicBool::new(false),
        }
    }

    /// Milliseconds since the gate's epoch.
    fn now(&self) -> i64 {
        i64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// Applies a decision's change now.
    pub fn apply(&self, change: &GateChange) {
        self.apply_at(change, self.now());
    }

    fn apply_at(&self, change: &GateChange, now: i64) {
        match change {
            GateChange::Unchanged => {}
            GateChange::Answered => self.mark_answered(),
            GateChange::Unreachable => self.mark_unreachable(now),
            GateChange::Pause { pause } => {
                self.mark_answered();
                let until = now.saturating_add(millis(*pause));
                self.paused_until.fetch_max(until, Ordering::AcqRel);
            }
            GateChange::Disable { .. } => {
                self.mark_answered();
                self.set_disabled(true);
            }
        }
    }

    /// Records an attempt that got no answer. Failures inside the current offline window come
    /// from requests that were already in flight and do not deepen the backoff.
    fn mark_unreachable(&self, now: i64) {
        if now < self.offline_until.load(Ordering::Acquire) {
            return;
        }
        let failures = self
            .failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        let wait = self.offline.equal_jitter(failures).as_millis() as i64;
        self.offline_until.store(now + wait, Ordering::Release);
    }

    /// Records an answer (any status): the destination is reachable again.
    fn mark_answered(&self) {
        self.failures.store(0, Ordering::Release);
        self.offline_until.store(0, Ordering::Release);
    }

    /// Marks the destination disabled or enabled.
    pub fn set_disabled(&self, disabled: bool) {
        self.disabled.store(disabled, Ordering::Release);
    }

    /// Whether nothing should be sent now: offline, paused or disabled. Workers check this
    /// before each request, so events already queued are handed back, not sent.
    pub fn is_closed(&self) -> bool {
        self.is_closed_at(self.now())
    }

    fn is_closed_at(&self, now: i64) -> bool {
        now < self.offline_until.load(Ordering::Acquire)
            || now < self.paused_until.load(Ordering::Acquire)
            || self.disabled.load(Ordering::Acquire)
    }

    /// Whether the last attempts went unanswered, so the next claim should be a single probe.
    pub fn is_suspect(&self) -> bool {
        self.failures.load(Ordering::Acquire) > 0
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate() -> Gate {
        Gate::new(Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_millis(1_000),
        })
    }

    #[test]
    fn unreachable_opens_a_window_and_an_answer_closes_it() {
        let g = gate();
        g.apply_at(&GateChange::Unreachable, 1_000);
        assert!(g.is_closed_at(1_000) && g.is_suspect());
        assert!(
            !g.is_closed_at(1_100),
            "the first window is at most the base"
        );
        g.apply_at(&GateChange::Unreachable, 1_100);
        g.apply_at(&GateChange::Answered, 1_101);
        assert!(!g.is_closed_at(1_101) && !g.is_suspect());
    }

    #[test]
    fn failures_inside_the_window_do_not_deepen_it() {
        let g = gate();
        g.apply_at(&GateChange::Unreachable, 0);
        let until = g.offline_until.load(Ordering::Relaxed);
        g.apply_at(&GateChange::Unreachable, 1);
        assert_eq!(g.offline_until.load(Ordering::Relaxed), until);
        assert_eq!(g.failures.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_pause_closes_until_its_end_and_a_shorter_one_does_not_cut_it() {
        let g = gate();
        g.apply_at(
            &GateChange::Pause {
                pause: Duration::from_millis(500),
            },
            0,
        );
        g.apply_at(
            &GateChange::Pause {
                pause: Duration::from_millis(100),
            },
            0,
        );
        assert!(g.is_closed_at(499) && !g.is_closed_at(500));
    }

    #[test]
    fn disable_closes_until_enabled() {
        let g = gate();
        g.apply_at(
            &GateChange::Disable {
                reason: "HTTP 410".into(),
            },
            0,
        );
        assert!(g.is_closed_at(10_000));
        g.set_disabled(false);
        assert!(!g.is_closed_at(10_000));
    }
}
