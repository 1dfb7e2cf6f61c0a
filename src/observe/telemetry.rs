//! Metrics through the `metrics` facade (feature `metrics`); without the feature every call
//! here compiles to nothing.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `outbox_enqueued_total` | counter | `type`, `destination` |
//! | `outbox_delivered_total` | counter | `type`, `destination` |
//! | `outbox_retried_total` | counter | `type`, `destination` |
//! | `outbox_dead_total` | counter | `type`, `destination` |
//! | `outbox_dropped_total` | counter | (none) |
//! | `outbox_coalesced_total` | counter | `type` |
//! | `outbox_pruned_for_room_total` | counter | (none) |
//! | `outbox_disk_full` | gauge (1 or 0) | (none) |
//! | `outbox_disk_reserve_bytes` | gauge | (none) |
//! | `outbox_pending` | gauge | (none) |
//! | `outbox_oldest_pending_age_seconds` | gauge | (none) |
//! | `outbox_database_bytes` | gauge | (none) |
//! | `outbox_delivery_latency_seconds` | histogram | `type`, `destination` |
//!
//! Labels are bounded: event types and destination names, never event ids. Enqueues are
//! counted when `enqueue` returns, so a transaction rolled back afterwards still counts.

#[cfg(feature = "metrics")]
mod imp {
    use metrics::{counter, gauge, histogram};

    pub fn enqueued(event_type: &str, destination: &str) {
        counter!("outbox_enqueued_total", "type" => event_type.to_owned(), "destination" => destination.to_owned()).increment(1);
    }

    pub fn delivered(event_type: &str, destination: &str, latency_ms: i64) {
        counter!("outbox_delivered_total", "type" => event_type.to_owned(), "destination" => destination.to_owned()).increment(1);
        histogram!("outbox_delivery_latency_seconds", "type" => event_type.to_owned(), "destination" => destination.to_owned())
            .record(latency_ms.max(0) as f64 / 1000.0);
    }

    pub fn retried(event_type: &str, destination: &str) {
        counter!("outbox_retried_total", "type" => event_type.to_owned(), "destination" => destination.to_owned()).increment(1);
    }

    pub fn dead(event_type: &str, destination: &str) {
        counter!("outbox_dead_total", "type" => event_type.to_owned(), "destination" => destination.to_owned()).increment(1);
    }

    pub fn budget(destination: &str, used: u64, limit: u64) {
        gauge!("outbox_budget_used_bytes", "destination" => destination.to_owned())
            .set(used as f64);
        gauge!("outbox_budget_limit_bytes", "destination" => destination.to_owned())
            .set(limit as f64);
    }

    pub fn dropped(n: usize) {
        counter!("outbox_dropped_total").increment(n as u64);
    }

    pub fn expired(event_type: &str, destination: &str) {
        counter!("outbox_expired_total", "type" => event_type.to_owned(), "destination" => destination.to_owned()).increment(1);
    }

    pub fn coalesced(event_type: &str, n: usize) {
        counter!("outbox_coalesced_total", "type" => event_type.to_owned()).increment(n as u64);
    }

    pub fn pruned_for_room(n: usize) {
        counter!("outbox_pruned_for_room_total").increment(n as u64);
    }

    pub fn disk_room(full: bool, reserve_bytes: u64) {
        gauge!("outbox_disk_full").set(if full { 1.0 } else { 0.0 });
        gauge!("outbox_disk_reserve_bytes").set(reserve_bytes as f64);
    }

    pub fn gauges(pending: i64, oldest_pending_age_ms: Option<i64>, database_bytes: i64) {
        gauge!("outbox_pending").set(pending as f64);
        gauge!("outbox_oldest_pending_age_seconds")
            .set(oldest_pending_age_ms.unwrap_or(0) as f64 / 1000.0);
        gauge!("outbox_database_bytes").set(database_bytes as f64);
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    pub fn enqueued(_: &str, _: &str) {}
    pub fn delivered(_: &str, _: &str, _: i64) {}
    pub fn retried(_: &str, _: &str) {}
    pub fn dead(_: &str, _: &str) {}
    pub fn budget(_: &str, _: u64, _: u64) {}
    pub fn dropped(_: usize) {}
    pub fn expired(_: &str, _: &str) {}
    pub fn coalesced(_: &str, _: usize) {}
    pub fn pruned_for_room(_: usize) {}
    pub fn disk_room(_: bool, _: u64) {}
    pub fn gauges(_: i64, _: Option<i64>, _: i64) {}
}

pub(crate) use imp::*;

/// Whether the gauges are worth computing (they cost a query).
pub(crate) const GAUGES_ENABLED: bool = cfg!(feature = "metrics");
