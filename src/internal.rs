//! The relay's claim and ack, exposed for the benches only (not a stable API).

use rusqlite::{Connection, TransactionBehavior};

use crate::error::Result;
use crate::outbound::OutboundEvent;
use crate::relay::config::RelayConfig;
use crate::store::queue::{self, ClaimRequest, WriteBack};

/// Claims up to `limit` due events of `destination` as the relay does: in one write
/// transaction.
pub fn claim(
    conn: &Connection,
    destination: &str,
    owner: &str,
    now: i64,
    limit: i64,
) -> Result<Vec<OutboundEvent>> {
    let tx = rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate)?;
    let claimed = queue::claim(
        &tx,
        &ClaimRequest {
            destination,
            default_source: "/bench",
            owner,
            spare_leases: "",
            now,
            clock_step_ms: 0,
            lease_ms: 60_000,
            max_bytes: i64::MAX,
            numbering_bound: None,
            min_priority: 0,
            limit,
        },
    )?;
    tx.commit()?;
    Ok(claimed.events)
}

/// Acks `events` (of one claim) in one transaction, as the relay does: fenced by their
/// lease, unparking each key's next event.
pub fn ack_delivered(conn: &mut Connection, events: &[OutboundEvent], now: i64) -> Result<usize> {
    if events.is_empty() {
        return Ok(0);
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // The relay's own write-back, pending totals and all.
    let outcomes: Vec<(&OutboundEvent, &WriteBack)> =
        events.iter().map(|e| (e, &WriteBack::Delivered)).collect();
    let acked = queue::record(&tx, &outcomes, now)?
        .into_iter()
        .filter(|acked| *acked)
        .count();
    tx.commit()?;
    Ok(acked)
}

/// Turns stream numbers off (`false`) or back on for every outbox of the process, so a
/// bench can show what numbering costs in the same run. Never for real use: rows claimed
/// meanwhile go out without their numbers, and the fleet cannot account for them.
pub fn set_stream_numbers(on: bool) {
    crate::store::queue::numbering::set_on(on);
}

/// The most rows one transaction of this process numbered so far (stream numbers are written
/// in bounded steps: see `store::queue::numbering`), for the tests and the bench.
pub fn largest_numbering_step() -> usize {
    crate::store::queue::numbering::largest_step()
}

/// `config` with the durability barrier off, so a bench can show what the barrier costs in
/// the same run. Never for real use: an event could then be sent before its commit is on
/// disk, and a power loss would leave the receiver with an event the device lost.
pub fn without_durability_barrier(mut config: RelayConfig) -> RelayConfig {
    config.durability_barrier = false;
    config
}

/// An outbound event like those the benches enqueue, to build bare request bodies from.
pub fn sample_event(data: &serde_json::Value) -> OutboundEvent {
    let mut event = OutboundEvent::new("order.created", data);
    event.created_at = 1_700_000_000_000;
    event.lease_owner = "bench".into();
    event.lease_expires_at = 0;
    event
}
