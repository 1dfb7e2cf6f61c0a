//! Pacing a destination's requests to a rate and its bytes to a bandwidth: a token bucket
//! per limit, shared by the destination's workers, holding at most one second's worth (and
//! at least one request), so
//! after a quiet spell a device sends one second's worth at once and then an even pace, not
//! the whole backlog in a burst. A metered uplink after a reconnect is the case it is for.
//!
//! Each request reserves its cost before it is sent and waits until its reservation is
//! covered. A request costing more than a second's worth (one large batch) is allowed: the
//! bucket goes into debt and the following requests wait it off, so the average holds.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One token bucket: `rate` tokens per second, at most one second's worth of them, and never
/// less than one token: below one request a second, a bucket of one second's worth could
/// never hold a whole request, and the lane, which claims only what the bucket lets out
/// within its pace window, would never claim again.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    capacity: f64,
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    fn new(rate: f64, now: Instant) -> Bucket {
        let capacity = rate.max(1.0);
        Bucket {
            rate,
            capacity,
            tokens: capacity,
            refilled: now,
        }
    }

    /// Takes `cost` tokens (going into debt if need be) and says how long until they are
    /// covered.
    fn reserve(&mut self, cost: f64, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
        self.refilled = now;
        self.tokens -= cost;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }

    /// What the bucket lets out from `now` to `now + within`, given what is already
    /// reserved (a debt counts against it): may be negative.
    fn allows_within(&self, within: Duration, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        let tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
        tokens + within.as_secs_f64() * self.rate
    }
}

/// What a pacer lets out within some time, beyond the requests already reserved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Allowance {
    /// Requests, if the rate is limited.
    pub requests: Option<f64>,
    /// Body bytes, if the bandwidth is limited.
    pub bytes: Option<f64>,
}

/// A destination's request rate and bandwidth limits.
#[derive(Debug)]
pub(crate) struct Pacer {
    requests: Option<Mutex<Bucket>>,
    bytes: Option<Mutex<Bucket>>,
}

impl Pacer {
    /// A pacer for `requests_per_second` and `bytes_per_second`, or `None` without limits.
    pub fn new(requests_per_second: Option<f64>, bytes_per_second: Option<u64>) -> Option<Pacer> {
        if requests_per_second.is_none() && bytes_per_second.is_none() {
            return None;
        }
        let now = Instant::now();
        Some(Pacer {
            requests: requests_per_second.map(|r| Mutex::new(Bucket::new(r, now))),
            bytes: bytes_per_second.map(|b| Mutex::new(Bucket::new(b as f64, now))),
        })
    }

    /// The request rate, or unlimited.
    pub fn requests_per_second(&self) -> f64 {
        self.requests.as_ref().map_or(f64::INFINITY, |b| {
            b.lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .rate
        })
    }

    /// The bandwidth, or unlimited.
    pub fn bytes_per_second(&self) -> f64 {
        self.bytes.as_ref().map_or(f64::INFINITY, |b| {
            b.lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .rate
        })
    }

    /// Whether the byte size of requests matters (so the caller computes it).
    pub fn counts_bytes(&self) -> bool {
        self.bytes.is_some()
    }

    /// What the limits let out within `within` from now, beyond what workers have already
    /// reserved. The lane claims no more than this, so no claimed event waits its turn for
    /// longer than its lease allows.
    pub fn allowance(&self, within: Duration) -> Allowance {
        let now = Instant::now();
        let allows = |bucket: &Option<Mutex<Bucket>>| {
            bucket.as_ref().map(|b| {
                b.lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .allows_within(within, now)
            })
        };
        Allowance {
            requests: allows(&self.requests),
            bytes: allows(&self.bytes),
        }
    }

    /// Reserves one request of `body_bytes` and returns how long to wait before sending it.
    pub fn reserve(&self, body_bytes: usize) -> Duration {
        let now = Instant::now();
        let take = |bucket: &Option<Mutex<Bucket>>, cost: f64| {
            bucket.as_ref().map_or(Duration::ZERO, |b| {
                b.lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .reserve(cost, now)
            })
        };
        take(&self.requests, 1.0).max(take(&self.bytes, body_bytes as f64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bucket_lets_one_seconds_worth_through_then_paces() {
        let t0 = Instant::now();
        let mut bucket = Bucket::new(10.0, t0);
        for _ in 0..10 {
            assert_eq!(bucket.reserve(1.0, t0), Duration::ZERO);
        }
        // The eleventh waits a tenth of a second, the twelfth two tenths.
        assert_eq!(bucket.reserve(1.0, t0), Duration::from_millis(100));
        assert_eq!(bucket.reserve(1.0, t0), Duration::from_millis(200));
        // A long quiet spell refills one second's worth, no more.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..10 {
            assert_eq!(bucket.reserve(1.0, later), Duration::ZERO);
        }
        assert!(bucket.reserve(1.0, later) > Duration::ZERO);
    }

    #[test]
    fn the_allowance_counts_what_is_reserved_against_what_the_window_refills() {
        let t0 = Instant::now();
        let mut bucket = Bucket::new(10.0, t0);
        // A full bucket and five seconds: one second's worth now and fifty more.
        assert_eq!(bucket.allows_within(Duration::from_secs(5), t0), 60.0);
        // Thirty reserved (twenty in debt): thirty left in the same window.
        for _ in 0..30 {
            bucket.reserve(1.0, t0);
        }
        assert_eq!(bucket.allows_within(Duration::from_secs(5), t0), 30.0);
        // A debt larger than the window: nothing more within it.
        for _ in 0..40 {
            bucket.reserve(1.0, t0);
        }
        assert!(bucket.allows_within(Duration::from_secs(5), t0) < 0.0);
    }

    #[test]
    fn a_request_larger_than_a_second_goes_and_the_debt_is_waited_off() {
        let t0 = Instant::now();
        let mut bucket = Bucket::new(1000.0, t0);
        assert_eq!(bucket.reserve(3000.0, t0), Duration::from_secs(2));
        assert_eq!(bucket.reserve(500.0, t0), Duration::from_millis(2500));
    }
}
