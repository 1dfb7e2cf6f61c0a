//! A destination's gate: whether it may be sent to now. It closes for the offline backoff of
//! a destination that cannot be reached or whose receiver's backend is down, for a
//! receiver's 429 pause or `Retry-After`, and while the destination is disabled.
//!
//! A receiver whose own backend is down (its database restarting, a load balancer with no
//! healthy upstream) answers 502, 503 or 504 to everything. Three such answers in a row for
//! three different events judge the destination down: from then on it is treated as
//! unreachable (a destination-wide backoff, single probes, no attempt spent) until the first
//! answer that is not sick. One event answered so while others succeed (a poison event)
//! never makes three in a row, and spends its attempts.
//!
//! Written by the delivery workers the moment an attempt's decision is known (so queued
//! requests are not sent into a closed gate) and read by the writer before it claims. The
//! backoff and the pause are kept in memory only: a device that restarts after a week
//! offline simply probes once. (Disabling is persisted by the writer; the gate mirrors it.)
//!
//! Both run on `Instant`, not on the wall clock: a clock that jumps (set by NTP after a boot
//! without a real-time clock, or by hand) neither stretches a 30 s backoff into a day nor
//! cuts a pause short.

use portable_atomic::AtomicI64;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::relay::backoff::Backoff;
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
    /// Set when the relay stops: a worker waiting on its pace stops waiting (and hands its
    /// events back) instead of sending once its turn comes, after the writer stopped
    /// listening.
    stopping: AtomicBool,
    /// Set while the destination is judged down by its sick answers.
    down: AtomicBool,
    /// The events (row ids) of the sick answers in a row so far, while it is not judged down.
    sick_rows: Mutex<Vec<i64>>,
    /// Set while `sick_rows` holds any or `down` is set, so that a good answer (the hot
    /// path) takes no lock.
    sick_seen: AtomicBool,
}

/// Sick answers in a row, for this many different events, that judge a destination down.
pub(crate) const SICK_ANSWERS_TO_JUDGE_DOWN: usize = 3;

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
            stopping: AtomicBool::new(false),
            down: AtomicBool::new(false),
            sick_rows: Mutex::new(Vec::new()),
            sick_seen: AtomicBool::new(false),
        }
    }

    /// Counts a sick answer for the event of row `row` and says whether the destination was
    /// judged down before it (so the answer spends no attempt). The third different event
    /// in a row judges it down, and starts the destination-wide backoff. One lock, so of
    /// the requests in flight at that moment only those that made the judgement spent one.
    pub fn sick_answer(&self, row: i64) -> bool {
        self.sick_answer_at(row, self.now())
    }

    fn sick_answer_at(&self, row: i64, now: i64) -> bool {
        let mut rows = self
            .sick_rows
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if self.down.load(Ordering::Acquire) {
            return true;
        }
        self.sick_seen.store(true, Ordering::Release);
        if !rows.contains(&row) {
            rows.push(row);
        }
        if rows.len() >= SICK_ANSWERS_TO_JUDGE_DOWN {
            rows.clear();
            self.down.store(true, Ordering::Release);
            self.offline_until.store(0, Ordering::Release);
            self.mark_unreachable(now);
        }
        false
    }

    /// Whether the destination is judged down by its receiver's sick answers.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
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
            // Counted by `sick_answer` already; reachable, so no offline window unless that
            // judged it down.
            GateChange::Sick { retry_after } => {
                if self.is_down() {
                    self.pause_for(*retry_after, now);
                } else {
                    self.failures.store(0, Ordering::Release);
                    self.offline_until.store(0, Ordering::Release);
                }
            }
            GateChange::Down { retry_after } => {
                self.mark_unreachable(now);
                self.pause_for(*retry_after, now);
            }
        }
    }

    /// Sends the destination nothing for `retry_after` (a receiver's `Retry-After`).
    fn pause_for(&self, retry_after: Option<Duration>, now: i64) {
        if let Some(pause) = retry_after {
            let until = now.saturating_add(millis(pause));
            self.paused_until.fetch_max(until, Ordering::AcqRel);
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
        if self.sick_seen.load(Ordering::Acquire) {
            let mut rows = self
                .sick_rows
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            rows.clear();
            self.down.store(false, Ordering::Release);
            self.sick_seen.store(false, Ordering::Release);
        }
    }

    /// Marks the destination disabled or enabled.
    pub fn set_disabled(&self, disabled: bool) {
        self.disabled.store(disabled, Ordering::Release);
    }

    /// Tells the workers the relay is stopping.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// Whether the relay is stopping.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
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

    /// How long until an offline window or a receiver's pause ends, while one holds the
    /// gate closed; `None` when open, or closed only by a disabling (which a write to the
    /// database ends, and the writer notices that).
    pub fn reopens_in(&self) -> Option<Duration> {
        let until = self
            .offline_until
            .load(Ordering::Acquire)
            .max(self.paused_until.load(Ordering::Acquire));
        let left = until.saturating_sub(self.now());
        (left > 0 && !self.disabled.load(Ordering::Acquire))
            .then(|| Duration::from_millis(left as u64))
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
    fn three_sick_answers_for_different_events_judge_the_destination_down() {
        let g = gate();
        assert!(!g.sick_answer_at(1, 0));
        assert!(!g.sick_answer_at(2, 0));
        assert!(!g.is_down() && !g.is_closed_at(0));
        // The third one made the judgement: it spent its attempt, but the destination is
        // down now, backed off and probed.
        assert!(!g.sick_answer_at(3, 0));
        assert!(g.is_down() && g.is_suspect() && g.is_closed_at(0));
        // A request that was in flight meanwhile spends nothing.
        assert!(g.sick_answer_at(4, 1));
        // The first good answer: full speed.
        g.apply_at(&GateChange::Answered, 2_000);
        assert!(!g.is_down() && !g.is_suspect() && !g.is_closed_at(2_000));
    }

    #[test]
    fn one_event_answered_sick_again_and_again_judges_nothing() {
        let g = gate();
        for _ in 0..10 {
            assert!(!g.sick_answer_at(7, 0));
        }
        assert!(!g.is_down());
        // Nor do sick answers broken up by good ones (a poison event among others).
        let g = gate();
        for row in 0..10 {
            assert!(!g.sick_answer_at(row, 0));
            assert!(!g.sick_answer_at(100 + row, 0));
            g.apply_at(&GateChange::Answered, 0);
        }
        assert!(!g.is_down());
    }

    #[test]
    fn a_retry_after_of_a_sick_answer_closes_the_destination_for_as_long() {
        let g = gate();
        g.apply_at(
            &GateChange::Down {
                retry_after: Some(Duration::from_secs(30)),
            },
            0,
        );
        assert!(g.is_closed_at(29_999) && !g.is_closed_at(30_000));
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
