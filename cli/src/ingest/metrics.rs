//! The ingest's own counters, and `GET /metrics` in the Prometheus text format (served on
//! `--metrics-listen`, apart from the events path, so it is not exposed with it).
//!
//! Everything here is an atomic or a short lock: the counters are bumped on every request.

use portable_atomic::AtomicU64;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use super::lock;
use std::time::Duration;

/// Upper bounds of the request latency histogram, in seconds.
const LATENCY_BUCKETS: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

/// Counters of one ingest server.
#[derive(Default)]
pub(crate) struct Metrics {
    by_status: Mutex<BTreeMap<u16, u64>>,
    refusals: Mutex<BTreeMap<&'static str, u64>>,
    events_stored: AtomicU64,
    latency_buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    latency_count: AtomicU64,
    latency_micros: AtomicU64,
    key_reload_failures: AtomicU64,
    /// Unix seconds of the last reload of the keys file or table that took (0: none yet).
    key_reload_last_success: AtomicU64,
}

impl Metrics {
    /// One answered request on the events path.
    pub fn request(&self, status: u16, took: Duration) {
        *lock(&self.by_status).entry(status).or_default() += 1;
        let seconds = took.as_secs_f64();
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.latency_buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    /// One request refused for `reason` (a stable snake-case name).
    pub fn refusal(&self, reason: &'static str) {
        *lock(&self.refusals).entry(reason).or_default() += 1;
    }

    /// How many refusals for `reason` so far.
    pub fn refusals(&self, reason: &str) -> u64 {
        lock(&self.refusals).get(reason).copied().unwrap_or(0)
    }

    /// A reload of the keys file or table that failed (the keys stay as they were).
    pub fn key_reload_failed(&self) {
        self.key_reload_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A reload of the keys file or table that took.
    pub fn key_reload_succeeded(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.key_reload_last_success.store(now, Ordering::Relaxed);
    }

    /// Events newly stored.
    pub fn stored(&self, events: u64) {
        self.events_stored.fetch_add(events, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of every counter, with the two gauges given.
    pub fn render(&self, bytes_in_flight: usize, queue_depth: usize) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP outbox_ingest_requests_total Requests on the events path, by answer status.\n\
             # TYPE outbox_ingest_requests_total counter"
        );
        for (status, n) in lock(&self.by_status).iter() {
            let _ = writeln!(
                out,
                "outbox_ingest_requests_total{{status=\"{status}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP outbox_ingest_refusals_total Requests refused, by reason.\n\
             # TYPE outbox_ingest_refusals_total counter"
        );
        for (reason, n) in lock(&self.refusals).iter() {
            let _ = writeln!(
                out,
                "outbox_ingest_refusals_total{{reason=\"{reason}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP outbox_ingest_events_stored_total Events stored for the first time.\n\
             # TYPE outbox_ingest_events_stored_total counter\n\
             outbox_ingest_events_stored_total {}",
            self.events_stored.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP outbox_ingest_request_duration_seconds Time from a request's head to its answer.\n\
             # TYPE outbox_ingest_request_duration_seconds histogram"
        );
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.latency_buckets) {
            let _ = writeln!(
                out,
                "outbox_ingest_request_duration_seconds_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.latency_count.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "outbox_ingest_request_duration_seconds_bucket{{le=\"+Inf\"}} {count}\n\
             outbox_ingest_request_duration_seconds_sum {}\n\
             outbox_ingest_request_duration_seconds_count {count}",
            self.latency_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(
            out,
            "# HELP outbox_ingest_bytes_in_flight Request body bytes being read or held.\n\
             # TYPE outbox_ingest_bytes_in_flight gauge\n\
             outbox_ingest_bytes_in_flight {bytes_in_flight}\n\
             # HELP outbox_ingest_database_queue_depth Jobs waiting for a database thread.\n\
             # TYPE outbox_ingest_database_queue_depth gauge\n\
             outbox_ingest_database_queue_depth {queue_depth}\n\
             # HELP outbox_ingest_key_reload_failures_total Reloads of the keys file (SIGHUP) or \
             table that failed; the keys stayed as they were.\n\
             # TYPE outbox_ingest_key_reload_failures_total counter\n\
             outbox_ingest_key_reload_failures_total {}\n\
             # HELP outbox_ingest_key_reload_last_success_timestamp_seconds When the keys file \
             or table was last read in full (0: never).\n\
             # TYPE outbox_ingest_key_reload_last_success_timestamp_seconds gauge\n\
             outbox_ingest_key_reload_last_success_timestamp_seconds {}",
            self.key_reload_failures.load(Ordering::Relaxed),
            self.key_reload_last_success.load(Ordering::Relaxed)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_every_family_with_its_values() {
        let metrics = Metrics::default();
        metrics.request(204, Duration::from_millis(3));
        metrics.request(401, Duration::from_micros(200));
        metrics.refusal("unknown_source");
        metrics.stored(5);
        let text = metrics.render(1024, 2);
        for line in [
            "outbox_ingest_requests_total{status=\"204\"} 1",
            "outbox_ingest_requests_total{status=\"401\"} 1",
            "outbox_ingest_refusals_total{reason=\"unknown_source\"} 1",
            "outbox_ingest_events_stored_total 5",
            "outbox_ingest_request_duration_seconds_bucket{le=\"0.001\"} 1",
            "outbox_ingest_request_duration_seconds_bucket{le=\"0.005\"} 2",
            "outbox_ingest_request_duration_seconds_count 2",
            "outbox_ingest_bytes_in_flight 1024",
            "outbox_ingest_database_queue_depth 2",
            "outbox_ingest_key_reload_failures_total 0",
            "outbox_ingest_key_reload_last_success_timestamp_seconds 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
    }
}
