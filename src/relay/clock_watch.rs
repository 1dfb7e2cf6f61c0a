//! Noticing steps of the wall clock: NTP correcting a clock that was wrong, a user setting
//! it. At each look the writer reads the wall clock beside a clock that counts only time
//! passing ([`Clock::elapsed_ms`](crate::clock::Clock::elapsed_ms): the time since boot,
//! sleep included); when the wall clock moved more than [`CLOCK_JUMP`] further than that
//! one, the difference is a step, owed to the queue (deadlines and due times written on
//! the clock of before move with it) until the writer says it is followed.
//!
//! Where the system has no such clock, `Instant` stands in, which stops while the device
//! sleeps: a step forward then cannot be told from a suspend whose hours really passed, so
//! only steps back are owed (a forward difference re-anchors due times, moving nothing).

use std::time::{Duration, Instant};

/// How far the wall clock may drift from the clock of time passing between two looks
/// before it counts as a step.
pub(crate) const CLOCK_JUMP: Duration = Duration::from_secs(2);

/// A step of the wall clock to follow: by how much (negative: back), and the highest row id
/// before it (the rows whose times the old clock wrote).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClockJump {
    pub by_ms: i64,
    pub top_id: i64,
}

/// The two clocks read together at the last look, and the highest row id then.
#[derive(Debug, Clone, Copy)]
struct Anchor {
    at: Instant,
    elapsed_ms: Option<i64>,
    clock_ms: i64,
    top_id: i64,
}

/// The watch: the last look, and the step not yet followed.
#[derive(Debug)]
pub(crate) struct ClockWatch {
    anchor: Anchor,
    owed: Option<ClockJump>,
}

impl ClockWatch {
    /// A watch whose first look is now, owing a re-anchoring of the rows up to `top_id`
    /// (rows may carry due times from a boot whose clock was ahead).
    pub fn new(clock_ms: i64, elapsed_ms: Option<i64>, top_id: i64) -> Self {
        ClockWatch {
            anchor: Anchor {
                at: Instant::now(),
                elapsed_ms,
                clock_ms,
                top_id,
            },
            owed: Some(ClockJump { by_ms: 0, top_id }),
        }
    }

    /// A look at the clocks; `top_id` the highest row id now (`None`: unknown, the last
    /// one kept). Returns the step noticed in this look, if any (for the log); the sum of
    /// the steps not yet followed is [`owed`](Self::owed).
    pub fn look(
        &mut self,
        clock_ms: i64,
        elapsed_ms: Option<i64>,
        top_id: Option<i64>,
    ) -> Option<i64> {
        let passed = match (self.anchor.elapsed_ms, elapsed_ms) {
            (Some(before), Some(now)) => now - before,
            _ => i64::try_from(self.anchor.at.elapsed().as_millis()).unwrap_or(i64::MAX),
        };
        let counts_sleep = self.anchor.elapsed_ms.is_some() && elapsed_ms.is_some();
        let jump = clock_ms
            .saturating_sub(self.anchor.clock_ms)
            .saturating_sub(passed);
        let noticed = jump.unsigned_abs() > CLOCK_JUMP.as_millis() as u64;
        if noticed {
            let owed = self.owed.get_or_insert(ClockJump {
                by_ms: 0,
                top_id: self.anchor.top_id,
            });
            // Forward only on a clock that counts sleep: without it, a suspend.
            if jump < 0 || counts_sleep {
                owed.by_ms = owed.by_ms.saturating_add(jump);
            }
        }
        self.anchor = Anchor {
            at: Instant::now(),
            elapsed_ms,
            clock_ms,
            top_id: top_id.unwrap_or(self.anchor.top_id),
        };
        noticed.then_some(jump)
    }

    /// The steps noticed and not yet followed, summed.
    pub fn owed(&self) -> Option<ClockJump> {
        self.owed
    }

    /// What [`owed`](Self::owed) returned is written.
    pub fn followed(&mut self) {
        self.owed = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEEK: i64 = 7 * 86_400_000;

    fn following(watch: &mut ClockWatch) {
        assert_eq!(
            watch.owed().map(|j| j.by_ms),
            Some(0),
            "the start's re-anchoring"
        );
        watch.followed();
    }

    #[test]
    fn a_step_forward_is_owed_and_a_suspend_is_not() {
        let mut watch = ClockWatch::new(1_000_000, Some(50), 10);
        following(&mut watch);
        // Eight hours asleep: both clocks moved alike.
        assert_eq!(
            watch.look(
                1_000_000 + 8 * 3_600_000,
                Some(50 + 8 * 3_600_000),
                Some(12)
            ),
            None
        );
        assert_eq!(watch.owed(), None);
        // NTP steps a week forward while a second passes.
        let before = 1_000_000 + 8 * 3_600_000;
        let noticed = watch.look(
            before + WEEK + 1_000,
            Some(50 + 8 * 3_600_000 + 1_000),
            Some(15),
        );
        assert_eq!(noticed, Some(WEEK));
        assert_eq!(
            watch.owed(),
            Some(ClockJump {
                by_ms: WEEK,
                top_id: 12
            })
        );
    }

    #[test]
    fn steps_add_up_until_followed_and_the_rows_are_those_before_the_first() {
        let mut watch = ClockWatch::new(10 * WEEK, Some(0), 3);
        following(&mut watch);
        let _ = watch.look(9 * WEEK, Some(0), Some(7));
        let _ = watch.look(9 * WEEK - 60_000, Some(0), Some(9));
        assert_eq!(
            watch.owed(),
            Some(ClockJump {
                by_ms: -WEEK - 60_000,
                top_id: 3
            })
        );
        watch.followed();
        assert_eq!(
            watch.look(9 * WEEK - 60_000, Some(500), Some(9)),
            None,
            "drift under 2 s"
        );
        assert_eq!(watch.owed(), None);
    }

    #[test]
    fn without_a_clock_that_counts_sleep_only_steps_back_move_anything() {
        let mut watch = ClockWatch::new(10 * WEEK, None, 3);
        following(&mut watch);
        assert_eq!(
            watch.look(11 * WEEK, None, Some(4)).map(|j| j > 0),
            Some(true)
        );
        assert_eq!(
            watch.owed(),
            Some(ClockJump {
                by_ms: 0,
                top_id: 3
            }),
            "re-anchor only"
        );
        watch.followed();
        let _ = watch.look(10 * WEEK, None, Some(4));
        assert_eq!(watch.owed().map(|j| j.by_ms < -WEEK + 10_000), Some(true));
    }
}
