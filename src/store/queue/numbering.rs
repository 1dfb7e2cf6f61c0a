//! Stream numbers: the gapless sequence per destination and source that every event takes
//! when its transaction commits (`outbox_streams`, schema version 15).
//!
//! SQLite has one writer at a time, so the counter row is read and raised inside the
//! writer's own transaction: a rolled-back transaction takes its numbers back with it, and
//! two transactions never take the same number. `Outbox::enqueue` and `enqueue_many` number
//! their rows here, in commit order; any other writer leaves `stream_seq` NULL and the
//! schema's trigger numbers the row the same way.

#[allow(unused_imports)]
use super::*;

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the bench only (`internal::set_stream_numbers`), to measure what numbering costs
/// in the same run: rows then take numbers from 0 and no counter is touched.
static OFF_FOR_BENCH: AtomicBool = AtomicBool::new(false);

/// Turns numbering off (`false`) or on for every outbox of the process: benches only.
pub(crate) fn set_on(on: bool) {
    OFF_FOR_BENCH.store(!on, Ordering::Relaxed);
}

/// Whether the bench turned numbering off.
pub(crate) fn is_off() -> bool {
    OFF_FOR_BENCH.load(Ordering::Relaxed)
}

/// Takes the next `count` numbers of the stream (`destination`, `source`); returns the first.
pub(crate) fn take(tx: &Connection, destination: &str, source: &str, count: i64) -> Result<i64> {
    if is_off() {
        return Ok(0);
    }
    let last: i64 = tx
        .prepare_cached(
            "INSERT INTO outbox_streams (destination, source, high_water) VALUES (?1, ?2, ?3)
             ON CONFLICT (destination, source) DO UPDATE SET high_water = high_water + ?3
             RETURNING high_water",
        )?
        .query_row(params![destination, source, count], |r| r.get(0))?;
    Ok(last - count + 1)
}

/// Gives back the last number taken from the stream, when the row it was for was not
/// written (its idempotency key was taken): the sequence stays gapless.
pub(crate) fn give_back(tx: &Connection, destination: &str, source: &str) -> Result<()> {
    if is_off() {
        return Ok(());
    }
    tx.prepare_cached(
        "UPDATE outbox_streams SET high_water = high_water - 1
          WHERE destination = ?1 AND source = ?2",
    )?
    .execute(params![destination, source])?;
    Ok(())
}

/// Records that the numbered rows `gone` (`(destination, source, stream_seq)`) left the file
/// undelivered as `fate` (`coalesced` or `dropped`: the deletes of this crate that take
/// pending rows, which the schema's trigger does not see as finished).
pub(crate) fn record_fates(
    tx: &Connection,
    fate: &str,
    gone: &[(String, Option<String>, Option<i64>)],
) -> Result<()> {
    let mut insert = tx.prepare_cached(
        "INSERT OR REPLACE INTO outbox_fates (destination, source, stream_seq, fate)
         VALUES (?1, COALESCE(?2, (SELECT value FROM outbox_settings WHERE key = 'default_source'),
                              '/sqlite-outbox'), ?3, ?4)",
    )?;
    for (destination, source, seq) in gone {
        if let Some(seq) = seq {
            insert.execute(params![destination, source, seq, fate])?;
        }
    }
    Ok(())
}
