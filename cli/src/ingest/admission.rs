//! What the ingest decides before a body is read: whether the bytes it would take fit the
//! budget shared by all connections, whether its source has sent too much lately, and how
//! often a refusal is logged.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::lock;
use std::time::{Duration, Instant};

/// Sources tracked at most by the rate limiter and the refusal log: past it the ones not
/// seen for a while are forgotten, so a client inventing sources cannot grow them.
const MAX_TRACKED_SOURCES: usize = 100_000;

/// Body bytes being read or held, across every connection, and the most there may be.
pub(crate) struct InflightBudget {
    used: Arc<AtomicUsize>,
    limit: usize,
}

/// A reservation of the budget, given back when dropped.
pub(crate) struct Reservation {
    used: Arc<AtomicUsize>,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl InflightBudget {
    pub fn new(limit: usize) -> InflightBudget {
        InflightBudget {
            used: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// Reserves `bytes`, or `None` if they do not fit beside what is in flight.
    pub fn reserve(&self, bytes: usize) -> Option<Reservation> {
        let mut used = self.used.load(Ordering::Acquire);
        loop {
            let after = used
                .checked_add(bytes)
                .filter(|after| *after <= self.limit)?;
            match self
                .used
                .compare_exchange_weak(used, after, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Some(Reservation {
                        used: Arc::clone(&self.used),
                        bytes,
                    })
                }
                Err(now) => used = now,
            }
        }
    }

    /// Bytes reserved now.
    pub fn in_flight(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// Requests a second per source, as a token bucket of one second's worth.
pub(crate) struct SourceRate {
    per_second: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl SourceRate {
    pub fn new(per_second: f64) -> SourceRate {
        SourceRate {
            per_second,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `source` has a request left now; if not, how long until it has one. Nothing
    /// is taken: [`take`](Self::take) takes it once the request is verified, so requests
    /// forged in a device's name do not spend its rate.
    pub fn check(&self, source: &str, now: Instant) -> Result<(), Duration> {
        let buckets = lock(&self.buckets);
        let tokens = match buckets.get(source) {
            Some(&(tokens, at)) => self.refill(tokens, at, now),
            None => self.per_second,
        };
        if tokens >= 1.0 {
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - tokens) / self.per_second))
        }
    }

    /// Takes one request of `source`'s rate.
    pub fn take(&self, source: &str, now: Instant) {
        let mut buckets = lock(&self.buckets);
        if buckets.len() >= MAX_TRACKED_SOURCES && !buckets.contains_key(source) {
            // A full bucket again after a second: forgetting those loses nothing.
            buckets.retain(|_, (_, at)| now.duration_since(*at) < Duration::from_secs(1));
        }
        let (tokens, at) = buckets
            .entry(source.to_string())
            .or_insert((self.per_second, now));
        *tokens = self.refill(*tokens, *at, now) - 1.0;
        *at = now;
    }

    fn refill(&self, tokens: f64, at: Instant, now: Instant) -> f64 {
        (tokens + now.duration_since(at).as_secs_f64() * self.per_second).min(self.per_second)
    }
}

/// Logs a refusal at most once a minute per source (and reason), so a device in a loop or a
/// hostile client cannot fill the log.
#[derive(Default)]
pub(crate) struct RefusalLog {
    last: Mutex<HashMap<(String, &'static str), Instant>>,
}

impl RefusalLog {
    pub const EVERY: Duration = Duration::from_secs(60);

    /// Whether a refusal of `source` for `reason` at `now` should be logged.
    pub fn should_log(&self, source: &str, reason: &'static str, now: Instant) -> bool {
        let mut last = lock(&self.last);
        if last.len() >= MAX_TRACKED_SOURCES {
            last.retain(|_, at| now.duration_since(*at) < Self::EVERY);
        }
        match last.get_mut(&(source.to_string(), reason)) {
            Some(at) if now.duration_since(*at) < Self::EVERY => false,
            Some(at) => {
                *at = now;
                true
            }
            None => {
                if last.len() < MAX_TRACKED_SOURCES {
                    last.insert((source.to_string(), reason), now);
                }
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refuses_what_does_not_fit_and_takes_back_what_is_dropped() {
        let budget = InflightBudget::new(100);
        let a = budget.reserve(60).unwrap();
        assert!(budget.reserve(41).is_none());
        let b = budget.reserve(40).unwrap();
        assert_eq!(budget.in_flight(), 100);
        drop(a);
        assert_eq!(budget.in_flight(), 40);
        assert!(budget.reserve(usize::MAX).is_none());
        drop(b);
        assert_eq!(budget.in_flight(), 0);
    }

    #[test]
    fn a_source_gets_its_rate_and_others_are_untouched() {
        let rate = SourceRate::new(2.0);
        let start = Instant::now();
        for _ in 0..2 {
            assert!(rate.check("/a", start).is_ok());
            rate.take("/a", start);
        }
        let wait = rate.check("/a", start).unwrap_err();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(500),
            "{wait:?}"
        );
        assert!(rate.check("/b", start).is_ok());
        assert!(rate.check("/a", start + Duration::from_millis(500)).is_ok());
    }

    #[test]
    fn a_refusal_is_logged_once_a_minute_per_source() {
        let log = RefusalLog::default();
        let start = Instant::now();
        assert!(log.should_log("/a", "forged_source", start));
        assert!(!log.should_log("/a", "forged_source", start + Duration::from_secs(30)));
        assert!(log.should_log("/b", "forged_source", start));
        assert!(log.should_log("/a", "forged_source", start + Duration::from_secs(61)));
    }
}
