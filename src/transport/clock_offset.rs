//! How far this machine's clock is from a receiver's, estimated from the `Date` header of
//! its answers, so that signatures carry a timestamp the receiver accepts.
//!
//! Standard Webhooks receivers refuse a `webhook-timestamp` more than 5 minutes from their
//! own clock. A device without a real-time clock, before NTP, can be hours or years off, and
//! every request it signs would be refused. The estimator:
//!
//! - each answer with a `Date` header gives one sample: the receiver's time (the header has
//!   whole seconds, so its middle, +500 ms) minus this machine's time when the answer came;
//! - the estimate is the median of the last [`SAMPLES`] samples, so one odd header (a proxy's,
//!   a cached answer's) does not move it;
//! - the correction is applied only once the estimate is at least [`THRESHOLD`] (30 s): well
//!   above the header's resolution and a slow answer's latency, well below the 5 minute
//!   tolerance. It is logged once when it starts and once if it stops.

use portable_atomic::AtomicI64;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Samples the median is taken over.
pub(crate) const SAMPLES: usize = 5;
/// The least offset that is corrected.
pub(crate) const THRESHOLD: Duration = Duration::from_secs(30);

/// The offset estimate of one destination, shared by its delivery threads.
#[derive(Debug, Default)]
pub(crate) struct ClockOffset {
    samples: Mutex<VecDeque<i64>>,
    /// The median of the samples (receiver minus local, ms); meaningful once `known`.
    estimate_ms: AtomicI64,
    known: AtomicBool,
    correcting: AtomicBool,
}

impl ClockOffset {
    /// Records the `Date` of an answer received at `local` time.
    pub fn observe(&self, date: SystemTime, local: SystemTime, receiver: &str) {
        let sample = unix_ms(date) + 500 - unix_ms(local);
        let estimate = {
            let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
            if samples.len() == SAMPLES {
                samples.pop_front();
            }
            samples.push_back(sample);
            // On the stack: this runs once per answer, under the destination's lock.
            let mut sorted = [0i64; SAMPLES];
            let kept = samples.len().min(SAMPLES);
            for (slot, value) in sorted.iter_mut().zip(samples.iter()) {
                *slot = *value;
            }
            sorted[..kept].sort_unstable();
            sorted[kept / 2]
        };
        self.estimate_ms.store(estimate, Ordering::Release);
        self.known.store(true, Ordering::Release);
        let correct = estimate.unsigned_abs() >= THRESHOLD.as_millis() as u64;
        if correct != self.correcting.swap(correct, Ordering::AcqRel) {
            if correct {
                log::warn!(
                    "this clock is {} s {} {receiver}'s (from its Date header): signing with \
                     corrected time",
                    estimate.unsigned_abs() / 1000,
                    if estimate > 0 { "behind" } else { "ahead of" }
                );
            } else {
                log::info!("this clock agrees with {receiver}'s again: no more correction");
            }
        }
    }

    /// The estimate (receiver minus local, ms), once any answer carried a `Date`.
    pub fn estimate_ms(&self) -> Option<i64> {
        self.known
            .load(Ordering::Acquire)
            .then(|| self.estimate_ms.load(Ordering::Acquire))
    }

    /// The unix time (seconds) to sign with at `local`: corrected once the estimate passes
    /// the threshold.
    pub fn signing_time(&self, local: SystemTime) -> i64 {
        let correction = if self.correcting.load(Ordering::Acquire) {
            self.estimate_ms.load(Ordering::Acquire)
        } else {
            0
        };
        (unix_ms(local) + correction).div_euclid(1000)
    }

    /// The receiver's time at `local`, by the estimate (unchanged while none is known).
    pub fn receiver_time(&self, local: SystemTime) -> SystemTime {
        match self.estimate_ms() {
            Some(ms) if ms >= 0 => local + Duration::from_millis(ms.unsigned_abs()),
            Some(ms) => local
                .checked_sub(Duration::from_millis(ms.unsigned_abs()))
                .unwrap_or(local),
            None => local,
        }
    }
}

/// Unix milliseconds; a time before 1970 (a broken clock) is negative.
pub(crate) fn unix_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    }

    #[test]
    fn a_clock_ten_minutes_behind_is_corrected_after_one_answer() {
        let offset = ClockOffset::default();
        assert_eq!(offset.estimate_ms(), None);
        assert_eq!(offset.signing_time(at(1_000_000)), 1_000_000);
        offset.observe(at(1_000_600), at(1_000_000), "r");
        assert_eq!(offset.estimate_ms(), Some(600_500));
        assert_eq!(offset.signing_time(at(1_000_010)), 1_000_610);
    }

    #[test]
    fn small_offsets_are_left_alone_and_one_odd_date_does_not_move_the_median() {
        let offset = ClockOffset::default();
        for _ in 0..3 {
            offset.observe(at(1_000_002), at(1_000_000), "r");
        }
        assert_eq!(
            offset.signing_time(at(1_000_000)),
            1_000_000,
            "2 s is not corrected"
        );
        offset.observe(at(2_000_000), at(1_000_000), "r");
        assert_eq!(offset.estimate_ms(), Some(2_500));
        assert_eq!(offset.signing_time(at(1_000_000)), 1_000_000);
    }
}
